/* Where a run's model comes from: the --resume and --pretrained files, opened before anything
   is built (a PyTorch file, a wrong architecture or class count is said before a device
   allocates a byte); what a checkpoint says of its model (mgt_ckpt_info: architecture, class
   names, input size and channels, normalisation, validation transform), which every
   checkpoint holds; and the defaults that gives -e and --resume, each flag that overrides one
   said in a line. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "train/train_impl.h"

/* ---- what a checkpoint says ---- */

/* A whole number of the metadata in [lo, hi]; -1 when absent. */
static mgt_status meta_int(const mgt_st_file *f, const char *path, const char *key, long lo,
                           long hi, int *out)
{
    const char *v = mgt_st_metadata_get(f, key);
    *out = -1;
    if (!v)
        return MGT_OK;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return mgt_error_set(MGT_ERR_INVALID,
                             "%s: metadata \"%s\" is '%.40s': expected a whole number from %ld "
                             "to %ld",
                             path, key, v, lo, hi);
    *out = (int)x;
    return MGT_OK;
}

/* A JSON list of `n` numbers ("[0.485, 0.456, 0.406]") into v; false when absent. */
static mgt_status meta_floats(const mgt_st_file *f, const char *path, const char *key, int n,
                              bool positive, float *v, bool *found)
{
    const char *s = mgt_st_metadata_get(f, key);
    *found = false;
    if (!s)
        return MGT_OK;
    cJSON *a = cJSON_Parse(s);
    bool ok = cJSON_IsArray(a) && cJSON_GetArraySize(a) == n;
    for (int i = 0; ok && i < n; i++) {
        cJSON *x = cJSON_GetArrayItem(a, i);
        ok = cJSON_IsNumber(x) && (!positive || x->valuedouble > 0);
        if (ok)
            v[i] = (float)x->valuedouble;
    }
    cJSON_Delete(a);
    if (!ok)
        return mgt_error_set(MGT_ERR_INVALID,
                             "%s: metadata \"%s\" is '%.60s': expected a list of %d number%s%s",
                             path, key, s, n, n == 1 ? "" : "s", positive ? " above 0" : "");
    *found = true;
    return MGT_OK;
}

mgt_status mgt_ckpt_info_read(const mgt_st_file *f, const char *path, mgt_ckpt_info *out)
{
    memset(out, 0, sizeof *out);
    out->classes = out->in_channels = out->image_size = -1;
    out->val_resize_size = out->val_crop_size = -1;
    out->epoch = -1;
    const char *arch = mgt_st_metadata_get(f, "arch");
    if (arch)
        snprintf(out->arch, sizeof out->arch, "%s", arch);
    mgt_status st = meta_int(f, path, "classes", 1, 1 << 24, &out->classes);
    if (st == MGT_OK)
        st = meta_int(f, path, "in_channels", 1, 4, &out->in_channels);
    if (st == MGT_OK)
        st = meta_int(f, path, "image_size", 1, 8192, &out->image_size);
    if (st == MGT_OK)
        st = meta_int(f, path, "val_resize_size", 1, 65536, &out->val_resize_size);
    if (st == MGT_OK)
        st = meta_int(f, path, "val_crop_size", 1, 8192, &out->val_crop_size);
    int ch = out->in_channels > 0 && out->in_channels <= 3 ? out->in_channels : 3;
    bool m_found = false, s_found = false;
    if (st == MGT_OK)
        st = meta_floats(f, path, "mean", ch, false, out->mean, &m_found);
    if (st == MGT_OK)
        st = meta_floats(f, path, "std", ch, true, out->std, &s_found);
    out->has_norm = m_found && s_found;
    if (out->has_norm && ch == 1)
        for (int c = 1; c < 3; c++) {
            out->mean[c] = out->mean[0];
            out->std[c] = out->std[0];
        }
    const char *interp = mgt_st_metadata_get(f, "interpolation");
    if (st == MGT_OK && interp) {
        st = mgt_interp_parse(interp, &out->interpolation);
        if (st != MGT_OK)
            st = mgt_error_set(MGT_ERR_INVALID,
                               "%s: metadata \"interpolation\" is '%.40s': expected bilinear, "
                               "bicubic or nearest",
                               path, interp);
        out->has_interp = st == MGT_OK;
    }
    const char *names = mgt_st_metadata_get(f, "class_names");
    if (st == MGT_OK && names && out->classes > 0) {
        cJSON *a = cJSON_Parse(names);
        bool ok = cJSON_IsArray(a) && cJSON_GetArraySize(a) == out->classes;
        out->class_names = ok ? calloc((size_t)out->classes, sizeof *out->class_names) : NULL;
        for (int i = 0; ok && i < out->classes; i++) {
            const char *n = cJSON_GetStringValue(cJSON_GetArrayItem(a, i));
            ok = n && (out->class_names[i] = strdup(n)) != NULL;
        }
        cJSON_Delete(a);
        if (!ok) {
            mgt_ckpt_info_free(out);
            return mgt_error_set(MGT_ERR_INVALID,
                                 "%s: metadata \"class_names\" is not a list of its %d classes' "
                                 "names",
                                 path, out->classes);
        }
    }
    if (st == MGT_OK) {
        train_state s;
        st = train_state_read(f, path, &s);
        out->is_checkpoint = st == MGT_OK && s.format > 0;
        out->epoch = out->is_checkpoint ? s.epoch : -1;
        out->best_acc1 = out->is_checkpoint ? s.best_acc1 : 0;
    }
    if (st != MGT_OK)
        mgt_ckpt_info_free(out);
    return st;
}

void mgt_ckpt_info_free(mgt_ckpt_info *i)
{
    for (int k = 0; i->class_names && k < i->classes; k++)
        free(i->class_names[k]);
    free(i->class_names);
    i->class_names = NULL;
}

mgt_status mgt_ckpt_info_transform(const mgt_ckpt_info *i, mgt_transform *t)
{
    const mgt_arch_info *a = mgt_arch_find(i->arch);
    if (!a || i->in_channels < 1 || i->image_size < 1)
        return mgt_error_set(MGT_ERR_INVALID,
                             "no architecture, input channels or size in the file's metadata "
                             "(an mgtrain checkpoint holds them; torchvision weights need -a, "
                             "--image-size)");
    if (i->in_channels != 1 && i->in_channels != 3)
        return mgt_error_set(MGT_ERR_INVALID, "the model takes %d channels: images have 1 or 3",
                             i->in_channels);
    int size = i->val_crop_size > 0 ? i->val_crop_size : i->image_size;
    mgt_status st = mgt_transform_init(t, MGT_TRANSFORM_RESIZE_CROP, size, i->in_channels);
    if (st != MGT_OK)
        return st;
    /* the architecture's policy where the file does not say: its own images' side (resized
       only when they are not that size: the same as resizing to it) or 256/224 of the crop */
    t->resize = i->val_resize_size > 0            ? i->val_resize_size
                : a->eval == MGT_ARCH_EVAL_NATIVE ? size
                                                  : t->resize;
    if (i->has_interp)
        t->interp = i->interpolation;
    if (i->has_norm) {
        memcpy(t->mean, i->mean, sizeof t->mean);
        memcpy(t->std, i->std, sizeof t->std);
    }
    return MGT_OK;
}

/* ---- the run's sources ---- */

mgt_status train_open_sources(run *r)
{
    const mgt_train_config *c = r->c;
    bool auto_resume = c->resume && strcmp(c->resume, "auto") == 0;
    if (auto_resume && c->checkpoint_dir) {
        int len = snprintf(r->resume_path, sizeof r->resume_path, "%s/checkpoint.safetensors",
                           c->checkpoint_dir);
        if (len < 0 || (size_t)len >= sizeof r->resume_path)
            return mgt_error_set(MGT_ERR_INVALID, "--checkpoint-dir %s: the path is too long",
                                 c->checkpoint_dir);
        if (access(r->resume_path, F_OK) != 0)
            r->resume_path[0] = 0; /* nothing to resume: train_resume says so */
    } else if (c->resume && !auto_resume) {
        /* (auto without a --checkpoint-dir is check_config's refusal) */
        snprintf(r->resume_path, sizeof r->resume_path, "%s", c->resume);
    }
    mgt_status st = MGT_OK;
    if (r->resume_path[0] && (st = mgt_st_open(r->resume_path, &r->resume_f)) != MGT_OK)
        return train_flag_error(st, "--resume");
    if (c->pretrained && (st = mgt_st_open(c->pretrained, &r->pretrained_f)) != MGT_OK)
        return train_flag_error(st, "--pretrained");
    return MGT_OK;
}

void train_close_sources(run *r)
{
    mgt_st_close(r->resume_f);
    mgt_st_close(r->pretrained_f);
    r->resume_f = r->pretrained_f = NULL;
}

/* "=> ..." lines of what the checkpoint gave and what a flag overrode. */
static void say_int(run *r, const char *flag, int given, int saved, const char *what)
{
    if (given > 0 && saved > 0 && given != saved)
        fprintf(r->out, "=> %s %d overrides the checkpoint's %s %d\n", flag, given, what, saved);
}

mgt_status train_checkpoint_defaults(run *r, mgt_train_config *c)
{
    /* the model of -e and --resume is the checkpoint's; --pretrained names the architecture
       when it is an mgtrain checkpoint and -a is not given (fine-tuning keeps its own recipe) */
    bool own = r->resume_f != NULL;
    const char *path = r->resume_f ? r->resume_path : c->pretrained;
    const mgt_st_file *f = r->resume_f ? r->resume_f : r->pretrained_f;
    if (!own && f && c->evaluate)
        own = true; /* -e --pretrained FILE evaluates FILE's model */
    if (!f)
        return MGT_OK;
    const char *flag = r->resume_f ? "--resume" : "--pretrained";
    if (!own) { /* fine-tuning: the architecture only, when it says one and -a does not */
        const char *arch = mgt_st_metadata_get(f, "arch");
        if (!c->arch && arch && mgt_arch_find(arch)) {
            c->arch = mgt_arch_find(arch)->name;
            fprintf(r->out, "=> architecture %s, from %s\n", c->arch, path);
        }
        return MGT_OK;
    }
    mgt_ckpt_info in;
    mgt_status st = mgt_ckpt_info_read(f, path, &in);
    if (st != MGT_OK)
        return train_flag_error(st, flag);
    r->ckpt = in;
    r->have_ckpt = true;
    if (in.arch[0] && !mgt_arch_find(in.arch))
        return mgt_error_set(MGT_ERR_INVALID,
                             "%s %s: a checkpoint of '%s', an architecture this mgtrain does not "
                             "have (mgtrain model lists them)",
                             flag, path, in.arch);
    if (in.arch[0] && !c->arch) {
        c->arch = mgt_arch_find(in.arch)->name;
        fprintf(r->out, "=> architecture %s, from %s\n", c->arch, path);
    } else if (in.arch[0] && c->arch && strcmp(in.arch, c->arch) != 0) {
        return mgt_error_set(MGT_ERR_USAGE,
                             "%s %s: a checkpoint of %s; -a %s asks for another architecture "
                             "(leave -a out to take the checkpoint's)",
                             flag, path, in.arch, c->arch);
    }
    char said[512];
    size_t n = 0;
#define SAY(...)                                                           \
    do {                                                                   \
        if (n < sizeof said)                                               \
            n += (size_t)snprintf(said + n, sizeof said - n, __VA_ARGS__); \
    } while (0)
    if (in.image_size > 0 && c->image_size == 0) {
        c->image_size = in.image_size;
        SAY(", input %d px", in.image_size);
    }
    say_int(r, "--image-size", c->image_size, in.image_size, "input size");
    if (in.in_channels > 0 && c->image_channels == 0) {
        c->image_channels = in.in_channels;
        SAY(", %d channel%s", in.in_channels, in.in_channels == 1 ? "" : "s");
    }
    if (in.has_norm && !c->mean_std_set && !c->normalize_auto) {
        memcpy(c->mean, in.mean, sizeof c->mean);
        memcpy(c->std, in.std, sizeof c->std);
        c->mean_std_set = true;
        SAY(", its mean and std");
    } else if (in.has_norm && (memcmp(c->mean, in.mean, sizeof c->mean) != 0 ||
                               memcmp(c->std, in.std, sizeof c->std) != 0)) {
        fprintf(r->out, "=> %s overrides the checkpoint's normalisation (mean %.4g std %.4g)\n",
                c->normalize_auto ? "--normalize auto" : "--mean/--std", (double)in.mean[0],
                (double)in.std[0]);
    }
    if (in.val_resize_size > 0 && c->val_resize_size == 0) {
        c->val_resize_size = in.val_resize_size;
        SAY(", validation resize %d", in.val_resize_size);
    }
    say_int(r, "--val-resize-size", c->val_resize_size, in.val_resize_size, "validation resize");
    if (in.val_crop_size > 0 && c->val_crop_size == 0 && in.val_crop_size != c->image_size) {
        c->val_crop_size = in.val_crop_size;
        SAY(", validation crop %d", in.val_crop_size);
    }
    if (in.has_interp && !c->interpolation_set) {
        c->interpolation = in.interpolation;
        SAY(", %s", mgt_interp_name(in.interpolation));
    } else if (in.has_interp && c->interpolation != in.interpolation) {
        fprintf(r->out, "=> --interpolation %s overrides the checkpoint's %s\n",
                mgt_interp_name(c->interpolation), mgt_interp_name(in.interpolation));
    }
#undef SAY
    if (n)
        fprintf(r->out, "=> from %s:%s\n", path, said + 1);
    return MGT_OK;
}

mgt_status train_check_data_against(run *r)
{
    if (!r->have_ckpt || r->c->dummy || r->ckpt.classes < 1)
        return MGT_OK;
    bool own = r->resume_f != NULL || r->c->evaluate;
    const mgt_dataset *ds = r->data.val_ds ? r->data.val_ds : r->data.train_ds;
    const char *path = r->resume_f ? r->resume_path : r->c->pretrained;
    if (!own || !ds)
        return MGT_OK;
    if (r->data.classes != r->ckpt.classes)
        return mgt_error_set(MGT_ERR_INVALID,
                             "%s %s: its model has %d classes, %s has %d (fine-tuning to other "
                             "classes: --pretrained without -e)",
                             r->resume_f ? "--resume" : "--pretrained", path, r->ckpt.classes,
                             r->c->data_dir, r->data.classes);
    for (int i = 0; r->ckpt.class_names && i < r->data.classes; i++)
        if (strcmp(r->ckpt.class_names[i], mgt_dataset_class_name(ds, i)) != 0) {
            fprintf(r->out,
                    "=> warning: class %d is '%s' in %s and '%s' in %s: labels follow the data's "
                    "sorted folders\n",
                    i, r->ckpt.class_names[i], path, mgt_dataset_class_name(ds, i), r->c->data_dir);
            break;
        }
    return MGT_OK;
}

/* ---- what a checkpoint is told ---- */

/* n floats as a JSON list with the shortest digits that read back as them */
static char *float_list(const float *v, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) {
        char b[32];
        snprintf(b, sizeof b, "%.7g", (double)v[i]);
        cJSON_AddItemToArray(a, cJSON_CreateNumber(strtod(b, NULL)));
    }
    char *s = a ? cJSON_PrintUnformatted(a) : NULL;
    cJSON_Delete(a);
    return s;
}

mgt_status train_add_model_info(run *r, mgt_st_writer *w)
{
    const train_data *d = &r->data;
    const mgt_dataset *ds = d->train_ds ? d->train_ds : d->val_ds;
    mgt_status st = mgt_st_writer_set_metadata(w, "family", r->arch->family);
    if (st == MGT_OK && ds) {
        cJSON *a = cJSON_CreateArray();
        for (int i = 0; a && i < mgt_dataset_class_count(ds); i++)
            cJSON_AddItemToArray(a, cJSON_CreateString(mgt_dataset_class_name(ds, i)));
        char *names = a ? cJSON_PrintUnformatted(a) : NULL;
        cJSON_Delete(a);
        st = names ? mgt_st_writer_set_metadata(w, "class_names", names)
                   : mgt_error_set(MGT_ERR_OOM, "checkpoint: host memory exhausted");
        free(names);
    }
    const mgt_transform *vt = &d->val_t;
    if (st != MGT_OK || vt->size < 1) /* --dummy: no validation transform */
        return st;
    char *mean = float_list(vt->mean, vt->channels), *stdv = float_list(vt->std, vt->channels);
    char num[2][16];
    snprintf(num[0], sizeof num[0], "%d", vt->resize > 0 ? vt->resize : vt->size);
    snprintf(num[1], sizeof num[1], "%d", vt->size);
    if (!mean || !stdv)
        st = mgt_error_set(MGT_ERR_OOM, "checkpoint: host memory exhausted");
    if (st == MGT_OK)
        st = mgt_st_writer_set_metadata(w, "mean", mean);
    if (st == MGT_OK)
        st = mgt_st_writer_set_metadata(w, "std", stdv);
    if (st == MGT_OK)
        st = mgt_st_writer_set_metadata(w, "val_resize_size", num[0]);
    if (st == MGT_OK)
        st = mgt_st_writer_set_metadata(w, "val_crop_size", num[1]);
    if (st == MGT_OK)
        st = mgt_st_writer_set_metadata(w, "interpolation", mgt_interp_name(vt->interp));
    free(mean);
    free(stdv);
    return st;
}
