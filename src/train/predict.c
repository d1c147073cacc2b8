/* `mgtrain predict`: a trained model's top-k classes, with names and probabilities, for image
   files and folders. The checkpoint says the model and how it was validated (architecture,
   classes and their names, input size and channels, normalisation, resize, crop and
   interpolation: mgt_ckpt_info), so each image goes through the validation transform the
   model was measured with. Images are decoded by the loader's threads and batched over the
   devices: one host thread enqueues every device's batch on its own stream, then reads the
   logits back. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "train/train_impl.h"

void mgt_predict_config_defaults(mgt_predict_config *c)
{
    memset(c, 0, sizeof *c);
    c->top_k = 5;
    c->batch_size = 32;
    c->workers = -1;
}

typedef struct pred {
    bool done;
    int k;
    int cls[MGT_PREDICT_MAX_K];
    float prob[MGT_PREDICT_MAX_K];
} pred;

/* The file's model: the checkpoint's description, or (torchvision weights, which have none)
   -a, the class count of the file's head, the architecture's size and 3 channels. */
static mgt_status describe(const mgt_predict_config *c, const mgt_st_file *f, mgt_ckpt_info *in)
{
    mgt_status st = mgt_ckpt_info_read(f, c->weights, in);
    if (st != MGT_OK)
        return st;
    if (c->arch && in->arch[0] && strcmp(c->arch, in->arch) != 0)
        return mgt_error_set(MGT_ERR_USAGE,
                             "%s: a checkpoint of %s; -a %s asks for another architecture (leave "
                             "-a out to take the checkpoint's)",
                             c->weights, in->arch, c->arch);
    if (!in->arch[0] && !c->arch)
        return mgt_error_set(MGT_ERR_USAGE,
                             "%s: its metadata names no architecture (torchvision weights): "
                             "give it with -a",
                             c->weights);
    if (!in->arch[0])
        snprintf(in->arch, sizeof in->arch, "%s", c->arch);
    const mgt_arch_info *a = mgt_arch_find(in->arch);
    if (!a)
        return mgt_error_set(MGT_ERR_USAGE,
                             "unknown architecture '%s' (`mgtrain model` lists them)", in->arch);
    if (c->image_size > 0)
        in->image_size = c->image_size;
    if (in->image_size < 1)
        in->image_size = a->image_size > 0 ? a->image_size : a->synthetic_size;
    if (c->in_channels > 0)
        in->in_channels = c->in_channels;
    if (in->in_channels < 1)
        in->in_channels = 3;
    if (in->classes < 1) { /* the head's output count in the file */
        mgt_model_config mc = {.arch = in->arch,
                               .classes = 1,
                               .in_channels = in->in_channels,
                               .image_size = in->image_size,
                               .batch = 1};
        mgt_model *m;
        if ((st = mgt_model_create(&mc, NULL, &m)) != MGT_OK)
            return st;
        int n;
        const mgt_model_entry *t = mgt_model_table(m, &n);
        for (int e = 0; e < n && in->classes < 1; e++) {
            int i =
                t[e].classifier && t[e].what != MGT_TENSOR_BIAS ? mgt_st_find(f, t[e].name) : -1;
            if (i >= 0 && mgt_st_tensor_ndim(f, i) >= 1)
                in->classes = (int)mgt_st_tensor_shape(f, i)[0];
        }
        mgt_model_free(m);
        if (in->classes < 1)
            return mgt_error_set(MGT_ERR_INVALID, "%s: no %s head in the file", c->weights,
                                 in->arch);
    }
    return MGT_OK;
}

/* --class-names FILE: one name a line, as many as the model has classes. */
static mgt_status read_names(const char *path, mgt_ckpt_info *in)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return mgt_error_set(MGT_ERR_IO, "--class-names %s: %s", path, strerror(errno));
    char **names = calloc((size_t)in->classes, sizeof *names);
    char line[1024];
    int n = 0;
    mgt_status st = names ? MGT_OK : mgt_error_set(MGT_ERR_OOM, "host memory exhausted");
    while (st == MGT_OK && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (n < in->classes && !(names[n] = strdup(line)))
            st = mgt_error_set(MGT_ERR_OOM, "host memory exhausted");
        n++;
    }
    fclose(f);
    if (st == MGT_OK && n != in->classes)
        st = mgt_error_set(MGT_ERR_INVALID, "--class-names %s: %d names, the model has %d classes",
                           path, n, in->classes);
    if (st != MGT_OK) {
        for (int i = 0; names && i < in->classes; i++)
            free(names[i]);
        free(names);
        return st;
    }
    mgt_ckpt_info_free(in);
    in->class_names = names;
    return MGT_OK;
}

/* The k most probable classes of one row of logits: softmax in double, ties to the lower
   index. */
static void top_k(const float *logits, int classes, int k, pred *p)
{
    double mx = logits[0], sum = 0;
    for (int c = 1; c < classes; c++)
        mx = fmax(mx, logits[c]);
    for (int c = 0; c < classes; c++)
        sum += exp((double)logits[c] - mx);
    p->k = k < classes ? k : classes;
    for (int j = 0; j < p->k; j++) {
        int best = -1;
        for (int c = 0; c < classes; c++) {
            bool taken = false;
            for (int q = 0; q < j && !taken; q++)
                taken = p->cls[q] == c;
            if (!taken && (best < 0 || logits[c] > logits[best]))
                best = c;
        }
        p->cls[j] = best;
        p->prob[j] = (float)(exp((double)logits[best] - mx) / sum);
    }
    p->done = true;
}

static const char *class_name(const mgt_ckpt_info *in, int c, char *buf, size_t cap)
{
    if (in->class_names)
        return in->class_names[c];
    snprintf(buf, cap, "class_%d", c);
    return buf;
}

static void print_one(const mgt_predict_config *c, const mgt_ckpt_info *in, const char *path,
                      const pred *p)
{
    char buf[32];
    if (c->json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "path", path);
        if (!p->done) {
            cJSON_AddStringToObject(o, "error", "unreadable or not an image (see the warning)");
        } else {
            cJSON *a = cJSON_AddArrayToObject(o, "top");
            for (int j = 0; j < p->k; j++) {
                cJSON *e = cJSON_CreateObject();
                cJSON_AddStringToObject(e, "class", class_name(in, p->cls[j], buf, sizeof buf));
                cJSON_AddNumberToObject(e, "index", p->cls[j]);
                char v[32];
                snprintf(v, sizeof v, "%.6g", (double)p->prob[j]);
                cJSON_AddNumberToObject(e, "probability", strtod(v, NULL));
                cJSON_AddItemToArray(a, e);
            }
        }
        char *s = cJSON_PrintUnformatted(o);
        if (s)
            fprintf(c->out, "%s\n", s);
        free(s);
        cJSON_Delete(o);
        return;
    }
    if (!p->done) {
        fprintf(c->out, "%s: unreadable or not an image (see the warning above)\n", path);
        return;
    }
    fprintf(c->out, "%s:", path);
    for (int j = 0; j < p->k; j++)
        fprintf(c->out, "%s %s %.2f%%", j ? "," : "", class_name(in, p->cls[j], buf, sizeof buf),
                100.0 * p->prob[j]);
    fprintf(c->out, "\n");
}

typedef struct dev_part {
    mgt_stream *s;
    mgt_model *m;
    float *host; /* pinned [batch][classes] */
} dev_part;

mgt_status mgt_predict_run(const mgt_predict_config *c, mgt_devset *set, mgt_predict_result *res)
{
    memset(res, 0, sizeof *res);
    FILE *info = c->info ? c->info : stderr;
    if (c->top_k < 1 || c->top_k > MGT_PREDICT_MAX_K)
        return mgt_error_set(MGT_ERR_USAGE, "--top-k %d: expected 1 to %d", c->top_k,
                             MGT_PREDICT_MAX_K);
    mgt_st_file *f = NULL;
    mgt_ckpt_info in = {0};
    mgt_dataset *ds = NULL;
    mgt_loader *ld = NULL;
    pred *preds = NULL;
    dev_part parts[MGT_MAX_DEVICES] = {{0}};
    int nd = 0;
    mgt_status st = mgt_st_open(c->weights, &f);
    if (st == MGT_OK)
        st = describe(c, f, &in);
    if (st == MGT_OK && c->class_names)
        st = read_names(c->class_names, &in);
    mgt_transform t;
    if (st == MGT_OK)
        st = mgt_ckpt_info_transform(&in, &t);
    if (st == MGT_OK)
        st = mgt_dataset_from_paths(c->inputs, c->n_inputs, &ds);
    if (st != MGT_OK)
        goto out;
    size_t n = mgt_dataset_size(ds);
    nd = mgt_devset_count(set);
    if ((size_t)nd > n)
        nd = (int)n;
    int per = c->batch_size / nd > 0 ? c->batch_size / nd : 1;
    fprintf(info,
            "=> %s: %s, %d classes, %dx%dx%d; resize %d (%s), centre crop %d; %zu image%s on %d "
            "device%s, %d per batch each\n",
            c->weights, in.arch, in.classes, in.in_channels, t.size, t.size, t.resize,
            mgt_interp_name(t.interp), t.size, n, n == 1 ? "" : "s", nd, nd == 1 ? "" : "s", per);
    preds = calloc(n, sizeof *preds);
    if (!preds) {
        st = mgt_error_set(MGT_ERR_OOM, "predict: host memory exhausted");
        goto out;
    }
    mgt_device *devs[MGT_MAX_DEVICES];
    mgt_model_config mc = {.arch = in.arch,
                           .classes = in.classes,
                           .in_channels = in.in_channels,
                           .image_size = t.size,
                           .batch = per,
                           .amp = c->amp};
    for (int i = 0; i < nd && st == MGT_OK; i++) {
        devs[i] = mgt_devset_device(set, i);
        st = mgt_stream_create(devs[i], &parts[i].s);
        if (st == MGT_OK)
            st = mgt_model_create(&mc, devs[i], &parts[i].m);
        static const char *const ignore[] = {"optimizer.", "model_ema.", NULL};
        mgt_model_load_options lo = {.ignore_prefixes = ignore};
        if (st == MGT_OK && (st = mgt_model_load(parts[i].m, parts[i].s, f, &lo, NULL)) != MGT_OK)
            mgt_error_wrap(st, "%s", c->weights);
        if (st == MGT_OK)
            st = mgt_host_alloc(devs[i], (size_t)per * in.classes * sizeof(float),
                                (void **)&parts[i].host);
    }
    mgt_loader_options lo;
    if (st == MGT_OK) {
        mgt_loader_options_init(&lo, ds, &t, nd, per);
        lo.devices = devs;
        if (c->workers >= 0)
            lo.workers = c->workers;
        lo.split = MGT_SPLIT_EXACT;
        lo.shuffle = false;
        lo.continuous = false;
        lo.bad.max_bad_frac = 1; /* a bad image is said, and the others predicted */
        lo.bad.warn = info;
        st = mgt_loader_create(&lo, &ld);
    }
    if (st == MGT_OK)
        st = mgt_loader_set_epoch(ld, 0, 0);
    size_t batches = st == MGT_OK ? mgt_loader_batches(ld, 0) : 0;
    for (size_t b = 0; b < batches && st == MGT_OK; b++) {
        mgt_batch bt[MGT_MAX_DEVICES];
        int live = 0;
        for (int i = 0; i < nd && st == MGT_OK; i++) { /* every device's batch, enqueued */
            if (b >= mgt_loader_batches(ld, i))
                break;
            const float *logits;
            st = mgt_loader_next(ld, i, parts[i].s, &bt[i]);
            if (st == MGT_OK)
                st = mgt_model_forward(parts[i].m, parts[i].s, bt[i].images, bt[i].n, false,
                                       &logits);
            if (st == MGT_OK)
                st = mgt_copy_d2h(parts[i].s, parts[i].host, logits,
                                  (size_t)bt[i].n * in.classes * sizeof(float));
            live = i + 1;
        }
        for (int i = 0; i < live && st == MGT_OK; i++) {
            st = mgt_stream_synchronize(parts[i].s, NULL);
            for (int j = 0; st == MGT_OK && j < bt[i].n; j++) /* the file behind each slot */
                top_k(parts[i].host + (size_t)j * in.classes, in.classes, c->top_k,
                      &preds[bt[i].indices_host[j]]);
        }
    }
    for (size_t i = 0; st == MGT_OK && i < n; i++) {
        print_one(c, &in, mgt_dataset_relpath(ds, i), &preds[i]);
        res->images++;
        res->failed += !preds[i].done;
    }
out:
    mgt_loader_free(ld);
    for (int i = 0; i < MGT_MAX_DEVICES; i++) {
        if (parts[i].s)
            mgt_stream_synchronize(parts[i].s, NULL);
        if (parts[i].host)
            mgt_host_free(mgt_devset_device(set, i), parts[i].host);
        mgt_model_free(parts[i].m);
        mgt_stream_free(parts[i].s);
    }
    free(preds);
    mgt_dataset_free(ds);
    mgt_ckpt_info_free(&in);
    mgt_st_close(f);
    return st;
}
