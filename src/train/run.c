/* The trainer's driver: checks the configuration, builds the run's parts in order, trains
   epoch by epoch (or validates once), and frees everything on one cleanup path whatever
   happened. Each epoch: the training phase, the replica check, validation, the epoch's
   records, the checkpoint. Between phases, replica 0's state goes to every device (and node),
   and the replicas are checked to agree bit for bit. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "train/train_impl.h"

void mgt_train_config_defaults(mgt_train_config *c)
{
    memset(c, 0, sizeof *c);
    c->workers = -1;
    c->epochs = 90;
    c->start_epoch = -1;
    c->batch_size = 256;
    c->lr = (mgt_lr_config){
        .lr = 0.1f, .kind = MGT_LR_STEP, .step_epochs = 30, .gamma = 0.1f, .warmup_decay = 0.01f};
    c->momentum = 0.9f;
    c->weight_decay = 1e-4f;
    c->opt = MGT_OPT_SGD;
    c->norm_weight_decay = -1;
    c->bias_weight_decay = -1;
    c->transformer_embedding_decay = -1;
    c->ra_magnitude = 9;
    c->ra_reps = 3;
    c->accum_steps = 1;
    c->model_ema_decay = 0.99998f;
    c->model_ema_steps = 32;
    c->print_freq = 10;
    c->bucket_bytes = 25u << 20;
    c->max_bad_frac = 0.01;
    c->dummy_steps = 100;
    c->aux_logits = -1;
    c->aux_weight = -1;
    c->transform_input = -1;
    c->augmix_severity = 3;
}

/* ---- between phases: the replicas made identical again, and checked ---- */

/* n floats of replica 0 from node 0's to every node's, through host memory (between
   phases: the staging is allocated here). */
static mgt_status world_bcast_dev(run *r, float *dev, size_t floats)
{
    size_t bytes = floats * sizeof(float);
    char *h = malloc(bytes ? bytes : 1);
    mgt_status st = h ? MGT_OK : mgt_error_set(MGT_ERR_OOM, "host memory exhausted");
    if (st == MGT_OK && r->primary)
        st = mgt_copy_d2h(r->w[0].s, h, dev, bytes);
    if (st == MGT_OK)
        st = mgt_stream_synchronize(r->w[0].s, &r->abort);
    if (st == MGT_OK)
        st = mgt_world_bcast(r->world, h, bytes, 0, &r->abort);
    if (st == MGT_OK && !r->primary)
        st = mgt_copy_h2d(r->w[0].s, dev, h, bytes);
    if (st == MGT_OK)
        st = mgt_stream_synchronize(r->w[0].s, &r->abort);
    free(h);
    return st;
}

/* Node 0's replica 0 to replica 0 of every node: what the broadcast inside the node then
   hands on. */
static mgt_status world_broadcast(run *r, unsigned what)
{
    bool params = what & TRAIN_SYNC_PARAMS, optimizer = what & TRAIN_SYNC_OPTIMIZER;
    size_t pb, bb;
    float *p0 = mgt_model_params(r->w[0].model, &pb);
    float *b0 = mgt_model_buffers(r->w[0].model, &bb);
    mgt_status st = MGT_OK;
    if (params)
        st = world_bcast_dev(r, p0, pb / sizeof(float));
    if (st == MGT_OK)
        st = world_bcast_dev(r, b0, bb / sizeof(float));
    /* the step count (AdamW's bias correction) and so whether the state is live */
    int64_t steps = optimizer ? train_optim_steps(&r->w[0].opt) : 0;
    if (st == MGT_OK && optimizer)
        st = mgt_world_bcast(r->world, &steps, sizeof steps, 0, &r->abort);
    if (st == MGT_OK && optimizer)
        train_optim_set_steps(&r->w[0].opt, (long)steps);
    bool live = steps > 0;
    train_opt_tensor t[TRAIN_MAX_OPT_TENSORS];
    int nt = live ? train_optim_state(&r->w[0].opt, t) : 0;
    for (int k = 0; k < nt && st == MGT_OK; k++)
        st = world_bcast_dev(r, t[k].dev, t[k].floats);
    int nbn;
    int64_t *counts0 = mgt_model_bn_counts(r->w[0].model, &nbn);
    if (st == MGT_OK && nbn > 0)
        st = mgt_world_bcast(r->world, counts0, (size_t)nbn * sizeof *counts0, 0, &r->abort);
    return st;
}

mgt_status train_world_position(run *r, int *epoch, long *step)
{
    int64_t v[3] = {*epoch, *step, 0};
    double best = r->best_acc1;
    mgt_status st = mgt_world_bcast(r->world, v, sizeof v, 0, &r->abort);
    if (st == MGT_OK)
        st = mgt_world_bcast(r->world, &best, sizeof best, 0, &r->abort);
    *epoch = (int)v[0];
    *step = (long)v[1];
    r->best_acc1 = best;
    return st;
}

mgt_status train_broadcast(run *r, unsigned what)
{
    bool params = what & TRAIN_SYNC_PARAMS, optimizer = what & TRAIN_SYNC_OPTIMIZER;
    if (r->nodes > 1) {
        mgt_status st = world_broadcast(r, what);
        if (st != MGT_OK)
            return st;
    }
    if (r->n == 1)
        return MGT_OK;
    mgt_stream *streams[MGT_MAX_DEVICES];
    for (int i = 0; i < r->n; i++)
        streams[i] = r->w[i].s;
    size_t pb, bb;
    mgt_model_params(r->w[0].model, &pb);
    mgt_model_buffers(r->w[0].model, &bb);
    mgt_status st = MGT_OK;
    if (params)
        st = mgt_comm_broadcast(r->comm, streams, r->params, pb, 0);
    if (st == MGT_OK)
        st = mgt_comm_broadcast(r->comm, streams, r->buffers, bb, 0);
    bool live = optimizer && train_optim_live(&r->w[0].opt);
    train_opt_tensor t[MGT_MAX_DEVICES][TRAIN_MAX_OPT_TENSORS];
    int nt = 0;
    for (int i = 0; i < r->n && live; i++)
        nt = train_optim_state(&r->w[i].opt, t[i]);
    for (int k = 0; k < nt && st == MGT_OK; k++) {
        float *bufs[MGT_MAX_DEVICES];
        for (int i = 0; i < r->n; i++)
            bufs[i] = t[i][k].dev;
        st = mgt_comm_broadcast(r->comm, streams, bufs, t[0][k].floats * sizeof(float), 0);
    }
    int nbn;
    int64_t *counts0 = mgt_model_bn_counts(r->w[0].model, &nbn);
    for (int i = 1; i < r->n; i++) {
        int m;
        memcpy(mgt_model_bn_counts(r->w[i].model, &m), counts0, (size_t)nbn * sizeof *counts0);
        if (optimizer)
            train_optim_set_steps(&r->w[i].opt, train_optim_steps(&r->w[0].opt));
    }
    for (int i = 0; i < r->n && st == MGT_OK; i++)
        st = mgt_stream_synchronize(streams[i], &r->abort);
    return st;
}

/* --sync-bn: every local replica merged the same gathered statistics in the same order, so
   the running statistics (the buffers) must be replica 0's to the bit as well. */
static mgt_status check_local_buffers(run *r)
{
    size_t bytes = 0;
    float *q0 = mgt_model_buffers(r->w[0].model, &bytes);
    if (bytes == 0)
        return MGT_OK;
    char *a = malloc(bytes), *b = malloc(bytes);
    mgt_status st = a && b ? MGT_OK : mgt_error_set(MGT_ERR_OOM, "host memory exhausted");
    if (st == MGT_OK)
        st = mgt_copy_d2h(r->w[0].s, a, q0, bytes);
    if (st == MGT_OK)
        st = mgt_stream_synchronize(r->w[0].s, &r->abort);
    for (int i = 1; i < r->n && st == MGT_OK; i++) {
        st = mgt_copy_d2h(r->w[i].s, b, mgt_model_buffers(r->w[i].model, NULL), bytes);
        if (st == MGT_OK)
            st = mgt_stream_synchronize(r->w[i].s, &r->abort);
        if (st == MGT_OK && memcmp(a, b, bytes) != 0)
            st = mgt_error_set(MGT_ERR_DEVICE,
                               "--sync-bn: the running statistics of %s differ from those of %s "
                               "after the epoch: the replicas have diverged",
                               mgt_device_name(r->w[i].d), mgt_device_name(r->w[0].d));
    }
    free(a);
    free(b);
    return st;
}

/* Where the first non-finite value of an arena lies: the table's name of the tensor that
   holds it (role PARAM or BUFFER). */
static const char *first_nonfinite(const mgt_model *m, mgt_model_role role, const float *host,
                                   size_t floats)
{
    int n;
    const mgt_model_entry *t = mgt_model_table(m, &n);
    size_t at = floats;
    for (size_t k = 0; k < floats && at == floats; k++)
        if (!isfinite(host[k]))
            at = k;
    for (int i = 0; i < n; i++)
        if (t[i].role == role && at >= t[i].offset / sizeof(float) &&
            at < t[i].offset / sizeof(float) + t[i].numel)
            return t[i].name;
    return "?";
}

mgt_status train_check_finite(run *r)
{
    worker *w = &r->w[0];
    size_t pb, bb;
    const float *p = mgt_model_params(w->model, &pb);
    const float *b = mgt_model_buffers(w->model, &bb);
    int32_t *dev = mgt_buffer_ptr(w->dev_correct); /* slot 0's pair: free between phases */
    mgt_status st = mgt_nonfinite_count(w->s, dev, p, pb / sizeof(float));
    if (st == MGT_OK && bb)
        st = mgt_nonfinite_count(w->s, dev + 1, b, bb / sizeof(float));
    else if (st == MGT_OK)
        st = mgt_memset(w->s, dev + 1, 0, sizeof(int32_t));
    if (st == MGT_OK)
        st = mgt_copy_d2h(w->s, w->host_correct, dev, 2 * sizeof(int32_t));
    if (st == MGT_OK)
        st = mgt_stream_synchronize(w->s, &r->abort);
    if (st != MGT_OK || (w->host_correct[0] == 0 && w->host_correct[1] == 0))
        return st;
    /* diverged: name the first tensor of each arena that holds a NaN or an infinity */
    long np = w->host_correct[0], nb = w->host_correct[1];
    float *hp = malloc(pb ? pb : 1), *hb = malloc(bb ? bb : 1);
    st = hp && hb ? MGT_OK : mgt_error_set(MGT_ERR_OOM, "host memory exhausted");
    if (st == MGT_OK)
        st = mgt_copy_d2h(w->s, hp, p, pb);
    if (st == MGT_OK && bb)
        st = mgt_copy_d2h(w->s, hb, b, bb);
    if (st == MGT_OK)
        st = mgt_stream_synchronize(w->s, &r->abort);
    if (st == MGT_OK) {
        char what[2][160] = {"", ""};
        if (np)
            snprintf(what[0], sizeof what[0], "%ld of %zu parameters (the first in %s)", np,
                     pb / sizeof(float),
                     first_nonfinite(w->model, MGT_MODEL_PARAM, hp, pb / sizeof(float)));
        if (nb)
            snprintf(what[1], sizeof what[1], "%ld of %zu batch-norm statistics (the first in %s)",
                     nb, bb / sizeof(float),
                     first_nonfinite(w->model, MGT_MODEL_BUFFER, hb, bb / sizeof(float)));
        st = mgt_error_set(MGT_ERR_DEVICE,
                           "the model has diverged (a lower --lr?): %s%s%s are NaN or infinite; "
                           "no checkpoint is written from it",
                           what[0], np && nb ? " and " : "", what[1]);
    }
    free(hp);
    free(hb);
    return st;
}

/* Every replica's parameters must equal replica 0's, to the bit: each applies the same update
   to the same weights from the same summed gradients. A difference means a reduction or
   broadcast went wrong, and training on would silently average different models. */
mgt_status train_check_replicas(run *r)
{
    if (r->n == 1 && r->nodes == 1)
        return MGT_OK;
    size_t bytes;
    float *p0 = mgt_model_params(r->w[0].model, &bytes);
    char *a = malloc(bytes), *b = malloc(bytes);
    mgt_status st = a && b ? MGT_OK : mgt_error_set(MGT_ERR_OOM, "host memory exhausted");
    if (st == MGT_OK)
        st = mgt_copy_d2h(r->w[0].s, a, p0, bytes);
    if (st == MGT_OK)
        st = mgt_stream_synchronize(r->w[0].s, &r->abort);
    if (st == MGT_OK && r->nodes > 1) { /* the check spans the nodes: node 0's bytes to all */
        if (r->primary)
            memcpy(b, a, bytes);
        st = mgt_world_bcast(r->world, b, bytes, 0, &r->abort);
        if (st == MGT_OK && memcmp(a, b, bytes) != 0)
            st = mgt_error_set(MGT_ERR_DEVICE,
                               "node %d: the parameters of %s differ from those of node 0's "
                               "first device after the epoch: the replicas have diverged",
                               r->node, mgt_device_name(r->w[0].d));
    }
    for (int i = 1; i < r->n && st == MGT_OK; i++) {
        st = mgt_copy_d2h(r->w[i].s, b, mgt_model_params(r->w[i].model, NULL), bytes);
        if (st == MGT_OK)
            st = mgt_stream_synchronize(r->w[i].s, &r->abort);
        if (st == MGT_OK && memcmp(a, b, bytes) != 0)
            st = mgt_error_set(MGT_ERR_DEVICE,
                               "the parameters of %s differ from those of %s after the epoch: "
                               "the replicas have diverged",
                               mgt_device_name(r->w[i].d), mgt_device_name(r->w[0].d));
    }
    free(a);
    free(b);
    if (st == MGT_OK && r->c->sync_bn)
        st = check_local_buffers(r);
    return st;
}

/* ---- the run ---- */

/* What the run cannot start with, each named by its flag (MGT_ERR_USAGE: a command line
   that cannot work). */
static mgt_status check_config(run *r)
{
    const mgt_train_config *c = r->c;
    if (!c->arch)
        return mgt_error_set(MGT_ERR_USAGE, "--arch is missing");
    r->arch = mgt_arch_find(c->arch);
    if (!r->arch)
        return mgt_error_set(MGT_ERR_USAGE,
                             "--arch '%s': unknown architecture (mgtrain model "
                             "--help lists them)",
                             c->arch);
    if (!c->dummy && !c->data_dir)
        return mgt_error_set(MGT_ERR_USAGE, "--data DIR is missing (or use --dummy)");
    if (c->amp != MGT_PREC_F32 && c->amp != MGT_PREC_BF16 && c->amp != MGT_PREC_FP16)
        return mgt_error_set(MGT_ERR_USAGE, "--amp: unknown precision %d", (int)c->amp);
    if (!(c->loss_scale_init >= 0 && c->loss_scale_init < 1e38f))
        return mgt_error_set(MGT_ERR_USAGE, "loss_scale_init %g is not a positive number",
                             (double)c->loss_scale_init);
    if (c->evaluate && c->dummy)
        return mgt_error_set(MGT_ERR_USAGE,
                             "--evaluate needs --data: dummy data has no validation split");
    if (c->resume && strcmp(c->resume, "auto") == 0 && !c->checkpoint_dir)
        return mgt_error_set(MGT_ERR_USAGE,
                             "--resume auto: there is nothing to resume from without "
                             "--checkpoint-dir");
    if (c->batch_size < r->wn)
        return mgt_error_set(MGT_ERR_USAGE,
                             "-b %d is smaller than the device count %d: -b is the total batch "
                             "over all devices%s",
                             c->batch_size, r->wn, r->nodes > 1 ? " of all nodes" : "");
    if (c->start_epoch >= c->epochs && !c->evaluate)
        return mgt_error_set(MGT_ERR_USAGE,
                             "--start-epoch %d is not below --epochs %d: nothing would be trained "
                             "(epochs are numbered from 0)",
                             c->start_epoch, c->epochs);
    if (c->epochs < 1 || c->print_freq < 1 || c->bucket_bytes == 0)
        return mgt_error_set(MGT_ERR_USAGE, "--epochs, --print-freq and --bucket-mb must be "
                                            "positive");
    if (c->dummy && c->dummy_steps < 1)
        return mgt_error_set(MGT_ERR_USAGE, "--dummy-steps must be positive");
    if (!(c->random_erase >= 0 && c->random_erase <= 1))
        return mgt_error_set(MGT_ERR_USAGE, "--random-erase %g is not a probability",
                             (double)c->random_erase);
    if (mgt_lr_per_epoch(c->lr.kind) && c->lr.warmup_epochs != (float)(int)c->lr.warmup_epochs)
        return mgt_error_set(MGT_ERR_USAGE,
                             "--lr-warmup-epochs %g: the references' warm-up is whole epochs",
                             (double)c->lr.warmup_epochs);
    if (c->accum_steps < 1 || c->model_ema_steps < 1 || !(c->clip_grad_norm >= 0) ||
        !(c->model_ema_decay >= 0 && c->model_ema_decay <= 1))
        return mgt_error_set(MGT_ERR_USAGE,
                             "--accum-steps %d and --model-ema-steps %d must be positive, "
                             "--clip-grad-norm %g not negative, --model-ema-decay %g in [0, 1]",
                             c->accum_steps, c->model_ema_steps, (double)c->clip_grad_norm,
                             (double)c->model_ema_decay);
    if (c->min_devices > r->n)
        return mgt_error_set(MGT_ERR_USAGE,
                             "--min-devices %d is above the %d devices of this run%s",
                             c->min_devices, r->n, r->nodes > 1 ? " on each node" : "");
    if (!(c->device_timeout_s >= 0))
        return mgt_error_set(MGT_ERR_USAGE, "--device-timeout must not be negative");
    if (!(c->mixup_alpha >= 0 && c->cutmix_alpha >= 0))
        return mgt_error_set(MGT_ERR_USAGE, "--mixup-alpha and --cutmix-alpha must not be "
                                            "negative");
    if ((c->aux_logits >= 0 || c->aux_weight >= 0) && r->arch->aux_weight == 0)
        return mgt_error_set(MGT_ERR_USAGE,
                             "--aux-logits, --aux-weight: %s has no auxiliary classifiers "
                             "(inception_v3 and googlenet have)",
                             c->arch);
    if (c->transform_input > 0 && !r->arch->transform_input)
        return mgt_error_set(MGT_ERR_USAGE,
                             "--transform-input: %s has none (inception_v3 and googlenet have)",
                             c->arch);
    return MGT_OK;
}

/* The shortest text of x that reads back as x: "0.2", not "0.200000003". */
static const char *float_text(char *buf, size_t cap, double x)
{
    for (int digits = 6; digits < 17; digits++) {
        snprintf(buf, cap, "%.*g", digits, x);
        if ((float)strtod(buf, NULL) == (float)x)
            break;
    }
    return buf;
}

/* The settings every node must share, as "NAME\tVALUE\n" lines; lost: an allocation failed
   (a partial text would compare wrong). */
typedef struct settings_text {
    mgt_text t;
    bool lost;
} settings_text;

/* One setting (no tab or newline in the value). */
static void setting(settings_text *t, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void setting(settings_text *t, const char *name, const char *fmt, ...)
{
    char v[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v, sizeof v, fmt, ap);
    va_end(ap);
    for (char *p = v; *p; p++)
        if (*p == '\t' || *p == '\n')
            *p = ' ';
    if (!mgt_text_add(&t->t, "%s\t%s\n", name, v))
        t->lost = true;
}

/* Every node of a multi-node run must take the same steps: the same model, batch, steps,
   schedule, optimizer, precision, data (size and classes), seed and every flag that changes
   a step. Compared as a digest at start-up; a difference is the run's one line, naming the
   first setting that differs and both values (one node says it; the others say nothing).
   Before, only --gpus was compared: --max-steps 4 against 8 hung at the end of the shorter
   run, resnet20 against resnet32 died in MPI_ERR_TRUNCATE, -b 32 against 64 trained on. */
static mgt_status agree_with_nodes(run *r)
{
    if (r->nodes == 1)
        return MGT_OK;
    const mgt_train_config *c = r->c;
    const mgt_lr_config *lr = &c->lr;
    const train_data *d = &r->data;
    settings_text t = {0};
    char fb[32];
#define F(x) float_text(fb, sizeof fb, (double)(x))
    setting(&t, "--arch", "%s", c->arch);
    setting(&t, "-b", "%d", c->batch_size);
    setting(&t, "--epochs", "%d", c->epochs);
    setting(&t, "--start-epoch", "%d", c->start_epoch);
    setting(&t, "--max-steps", "%ld", r->ctl.max_steps);
    setting(&t, "--evaluate", "%s", c->evaluate ? "yes" : "no");
    setting(&t, "--lr", "%s", F(lr->lr));
    setting(&t, "the lr schedule", "%s", mgt_lr_kind_name(lr->kind));
    setting(&t, "--lr-step", "%d", lr->step_epochs);
    setting(&t, "--lr-gamma", "%s", F(lr->gamma));
    setting(&t, "--lr-min", "%s", F(lr->lr_min));
    setting(&t, "the warm-up epochs", "%s", F(lr->warmup_epochs));
    setting(&t, "--lr-warmup-method", "%d", (int)lr->warmup_method);
    setting(&t, "--lr-warmup-decay", "%s", F(lr->warmup_decay));
    setting(&t, "--opt", "%s%s", mgt_opt_kind_name(c->opt), c->nesterov ? " --nesterov" : "");
    setting(&t, "--momentum", "%s", F(c->momentum));
    setting(&t, "--weight-decay", "%s", F(c->weight_decay));
    setting(&t, "--norm-weight-decay", "%s", F(c->norm_weight_decay));
    setting(&t, "--bias-weight-decay", "%s", F(c->bias_weight_decay));
    setting(&t, "--clip-grad-norm", "%s", F(c->clip_grad_norm));
    setting(&t, "--accum-steps", "%d", c->accum_steps);
    setting(&t, "--model-ema", "%s", c->model_ema ? "yes" : "no");
    setting(&t, "--model-ema-decay", "%s", F(c->model_ema_decay));
    setting(&t, "--model-ema-steps", "%d", c->model_ema_steps);
    setting(&t, "--label-smoothing", "%s", F(c->label_smoothing));
    setting(&t, "--amp", "%s", mgt_precision_name(c->amp));
    setting(&t, "--grad-dtype", "%s", mgt_precision_name(c->grad_dtype));
    setting(&t, "the first loss scale", "%s", F(c->loss_scale_init)); /* fp16's, API only */
    setting(&t, "--bucket-mb", "%zu bytes", c->bucket_bytes);
    setting(&t, "--allreduce", "%d", (int)c->allreduce);
    setting(&t, "--seed", "%llu", (unsigned long long)c->seed);
    setting(&t, "--freeze-bn", "%s", c->freeze_bn ? "yes" : "no");
    setting(&t, "--sync-bn", "%s", c->sync_bn ? "yes" : "no");
    setting(&t, "--zero-init-residual", "%s", c->zero_init_residual ? "yes" : "no");
    setting(&t, "--aux-logits", "%d", c->aux_logits);
    setting(&t, "--aux-weight", "%s", F(c->aux_weight));
    setting(&t, "--transform-input", "%d", c->transform_input);
    setting(&t, "--augment", "%d", (int)c->augment);
    setting(&t, "--auto-augment", "%s", mgt_auto_augment_name(c->auto_augment));
    setting(&t, "--interpolation", "%s", mgt_interp_name(c->interpolation));
    setting(&t, "--random-erase", "%s", F(c->random_erase));
    setting(&t, "--mixup-alpha", "%s", F(c->mixup_alpha));
    setting(&t, "--cutmix-alpha", "%s", F(c->cutmix_alpha));
    setting(&t, "--exact-decode", "%s", c->exact_decode ? "yes" : "no");
    setting(&t, "--val-resize-size", "%d", c->val_resize_size);
    setting(&t, "--val-crop-size", "%d", c->val_crop_size);
    setting(&t, "--normalize", "%s", c->normalize_auto ? "auto" : "no");
    setting(&t, "--mean", "%s", c->mean_std_set ? "given" : "ImageNet's");
    for (int i = 0; c->mean_std_set && i < 3; i++) {
        setting(&t, "--mean", "%s", F(c->mean[i]));
        setting(&t, "--std", "%s", F(c->std[i]));
    }
    setting(&t, "--image-size", "%d", d->size);
    setting(&t, "the data", "%s", c->dummy ? "synthetic (--dummy)" : "a dataset");
    setting(&t, "the training images", "%zu", d->train_samples);
    setting(&t, "the validation images", "%zu", d->val_samples);
    setting(&t, "the image channels", "%d", d->channels);
    setting(&t, "the steps per epoch", "%ld", d->steps_per_epoch);
    setting(&t, "the classes", "%d", d->classes);
    for (int i = 0; d->train_ds && i < d->classes; i++) {
        char name[32];
        snprintf(name, sizeof name, "class %d", i);
        setting(&t, name, "%s", mgt_dataset_class_name(d->train_ds, i));
    }
#undef F
    if (t.lost || !t.t.s) {
        mgt_text_free(&t.t);
        return mgt_error_set(MGT_ERR_OOM, "host memory exhausted");
    }
    bool speaker;
    mgt_status st = mgt_world_check_same(r->world, t.t.s, &r->abort, &speaker);
    mgt_text_free(&t.t);
    if (st != MGT_OK && !speaker) /* the node that differs says it */
        train_fail_remote(r, mgt_error_last());
    return st;
}

/* path and every missing folder above it, as mkdir -p makes them; a part that exists and is
   not a folder, or that cannot be made, is named. */
static mgt_status make_folder(const char *flag, const char *path)
{
    char part[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof part)
        return mgt_error_set(MGT_ERR_USAGE, "%s '%s': not a usable folder name", flag, path);
    for (size_t i = 1; i <= n; i++) {
        if (path[i] != '/' && path[i] != '\0')
            continue;
        memcpy(part, path, i);
        part[i] = '\0';
        struct stat sb;
        if (stat(part, &sb) == 0) {
            if (!S_ISDIR(sb.st_mode))
                return i == n
                           ? mgt_error_set(MGT_ERR_IO, "%s %s: not a folder", flag, path)
                           : mgt_error_set(MGT_ERR_IO, "%s %s: %s: not a folder", flag, path, part);
        } else if (mkdir(part, 0777) != 0 && errno != EEXIST) {
            return mgt_error_set(MGT_ERR_IO, "%s %s: cannot make %s: %s", flag, path, part,
                                 strerror(errno));
        }
    }
    if (access(path, W_OK | X_OK) != 0)
        return mgt_error_set(MGT_ERR_IO, "%s %s: cannot write in it: %s", flag, path,
                             strerror(errno));
    return MGT_OK;
}

/* A checkpoint folder that cannot be written is found now, not after the first epoch. */
static mgt_status open_outputs(run *r)
{
    const mgt_train_config *c = r->c;
    if (!r->primary) { /* node 0 writes for the world */
        train_reports_init(&r->reports, r->out, NULL, NULL);
        return MGT_OK;
    }
    mgt_status st = c->checkpoint_dir ? make_folder("--checkpoint-dir", c->checkpoint_dir) : MGT_OK;
    if (st == MGT_OK)
        st = train_checkpoint_dir_check(r);
    if (st != MGT_OK)
        return st;
    if (c->log_path) {
        r->log = fopen(c->log_path, "a");
        if (!r->log)
            return mgt_error_set(MGT_ERR_IO, "--log %s: %s", c->log_path, strerror(errno));
    }
    char tb_path[4096];
    if (c->tensorboard_dir) {
        mgt_status st = train_tensorboard_open(c->tensorboard_dir, &r->tb, tb_path, sizeof tb_path);
        if (st != MGT_OK)
            return st;
    }
    train_reports_init(&r->reports, r->out, r->log, r->tb);
    if (c->checkpoint_dir && c->log_path) { /* the curves, drawn from the log each epoch */
        int len =
            snprintf(r->curves_path, sizeof r->curves_path, "%s/curves.svg", c->checkpoint_dir);
        if (len < 0 || (size_t)len >= sizeof r->curves_path)
            return mgt_error_set(MGT_ERR_INVALID, "--checkpoint-dir %s: the path is too long",
                                 c->checkpoint_dir);
        r->reports.curves_path = r->curves_path;
        r->reports.log_path = c->log_path;
    }
    return MGT_OK;
}

static void print_devices(run *r)
{
    FILE *o = r->out;
    fprintf(o, "=> devices (%d, %s):", r->n, mgt_device_kind_name(mgt_devset_kind(r->set)));
    for (int i = 0; i < r->n; i++)
        fprintf(o, " %s", mgt_device_name(r->devs[i]));
    if (r->nodes > 1)
        fprintf(o, "\n=> world: %d nodes x %d devices = %d replicas (this is node %d, %s)\n=> %s",
                r->nodes, r->n, r->wn, r->node, mgt_world_host(r->world),
                mgt_comm_exchange_line(r->comm));
    fprintf(o, "\n");
    /* Ctrl-C on mpirun reaches the ranks as SIGTERM with a SIGKILL soon after: a stop's save
       must fit between them (an unfinished one leaves the previous checkpoint) */
    double grace = mgt_world_kill_grace_s();
    if (r->nodes > 1 && r->c->checkpoint_dir && !r->c->evaluate && grace >= 0)
        fprintf(o,
                "=> Ctrl-C on mpirun: Open MPI sends every rank SIGTERM after %g s and SIGKILL "
                "%g s later (mpirun --mca odls_base_sigkill_timeout S sets both): the stop's "
                "checkpoint must be written in that time, or the previous one stays\n",
                grace, grace);
}

/* -e's start: what is evaluated, on what, how: nothing of training. */
static void print_eval_start(run *r)
{
    const mgt_train_config *c = r->c;
    const train_data *d = &r->data;
    const mgt_transform *vt = &d->val_t;
    FILE *o = r->out;
    print_devices(r);
    mgt_model_counts mc;
    mgt_model_get_counts(r->w[0].model, &mc);
    const char *src = r->resume_f ? r->resume_path : c->pretrained;
    fprintf(o, "=> evaluating %s: %s (%s), %zu parameters, %.3f GMACs per image", src ? src : "",
            c->arch, r->arch->family, mc.params, (double)mc.macs / 1e9);
    if (r->have_ckpt && r->ckpt.is_checkpoint)
        fprintf(o, ", trained %d epoch%s (best Acc@1 %.3f)", r->ckpt.epoch,
                r->ckpt.epoch == 1 ? "" : "s", r->ckpt.best_acc1);
    if (!src)
        fprintf(o, " (no --resume or --pretrained: its initial weights)");
    fprintf(o, "\n=> data: %s: %zu validation images, %d classes, %dx%dx%d", c->data_dir,
            d->val_samples, d->classes, d->channels, d->size, d->size);
    if (vt->resize > 0)
        fprintf(o, "; resize %d (%s), centre crop %d", vt->resize, mgt_interp_name(vt->interp),
                vt->size);
    else
        fprintf(o, "; centre crop %d", vt->size);
    fprintf(o, "; mean");
    for (int i = 0; i < d->channels && i < 3; i++)
        fprintf(o, " %.4g", (double)vt->mean[i]);
    fprintf(o, " std");
    for (int i = 0; i < d->channels && i < 3; i++)
        fprintf(o, " %.4g", (double)vt->std[i]);
    fprintf(o, "\n=> batches of %d images per device, %zu batches on the first device\n",
            d->per_dev_batch, mgt_loader_batches(d->val_ld, 0));
    if (c->amp != MGT_PREC_F32)
        fprintf(o, "=> mixed precision %s\n", mgt_precision_name(c->amp));
    fflush(o);
}

static void print_start(run *r, int start_epoch)
{
    const mgt_train_config *c = r->c;
    const train_data *d = &r->data;
    FILE *o = r->out;
    if (c->evaluate) {
        print_eval_start(r);
        return;
    }
    print_devices(r);
    fprintf(o, "=> batch: %d per device x %d devices = %d per step", d->per_dev_batch, r->wn,
            d->per_dev_batch * r->wn);
    if (d->per_dev_batch * r->wn != c->batch_size)
        fprintf(o, " (-b %d split as the example does: int(b / devices) each)", c->batch_size);
    fprintf(o, "\n=> lr %g, %s schedule", r->lr.lr, mgt_lr_kind_name(r->lr.kind));
    if (r->lr.kind == MGT_LR_STEP || r->lr.kind == MGT_LR_STEPLR)
        fprintf(o, " (x%g every %d epochs)", r->lr.gamma, r->lr.step_epochs);
    if (r->lr.kind == MGT_LR_EXPONENTIALLR)
        fprintf(o, " (x%g every epoch)", r->lr.gamma);
    if (r->lr.kind == MGT_LR_COSINEANNEALINGLR)
        fprintf(o, " (to %g)", r->lr.lr_min);
    if (r->lr.warmup_epochs > 0)
        fprintf(o, ", %g warm-up epochs%s", r->lr.warmup_epochs,
                r->lr.warmup_method == MGT_LR_WARMUP_PER_STEP ? " (linear per step)"
                : r->lr.warmup_method == MGT_LR_WARMUP_LINEAR ? " (linear per epoch)"
                                                              : " (constant)");
    fprintf(o, "\n=> optimizer %s", train_optim_kind(&r->w[0].opt));
    if (c->opt != MGT_OPT_ADAMW)
        fprintf(o, ", momentum %g", c->momentum);
    fprintf(o, ", weight decay %g", c->weight_decay);
    if (c->norm_weight_decay >= 0)
        fprintf(o, " (norms %g)", c->norm_weight_decay);
    if (c->bias_weight_decay >= 0)
        fprintf(o, " (biases %g)", c->bias_weight_decay);
    if (c->transformer_embedding_decay >= 0)
        fprintf(o, " (embeddings %g)", c->transformer_embedding_decay);
    fprintf(o, " over %d run%s of the arena, label smoothing %g\n", r->w[0].opt.groups,
            r->w[0].opt.groups == 1 ? "" : "s", c->label_smoothing);
    if (c->clip_grad_norm > 0 || c->accum_steps > 1 || c->model_ema) {
        fprintf(o, "=>");
        if (c->clip_grad_norm > 0)
            fprintf(o, " gradient norm clipped to %g;", c->clip_grad_norm);
        if (c->accum_steps > 1)
            fprintf(o, " %d micro-batches per update (%d images);", c->accum_steps,
                    d->per_dev_batch * r->n * c->accum_steps);
        if (c->model_ema)
            fprintf(o,
                    " EMA of the weights every %d updates, decay %.6g (--model-ema-decay %g "
                    "adjusted)",
                    c->model_ema_steps, r->ema_decay, c->model_ema_decay);
        fprintf(o, "\n");
    }
    if (c->dummy)
        fprintf(o, "=> data: synthetic (--dummy), %d classes, %dx%dx%d, %ld steps per epoch\n",
                d->classes, d->channels, d->size, d->size, d->steps_per_epoch);
    else
        fprintf(o,
                "=> data: %s: %zu training and %zu validation images, %d classes, "
                "%dx%dx%d, %ld steps per epoch\n",
                c->data_dir, d->train_samples, d->val_samples, d->classes, d->channels, d->size,
                d->size, d->steps_per_epoch);
    if (d->val_t.size > 0 && d->val_t.size != d->size)
        fprintf(o, "=> validation at %dx%d (FixRes: a twin of each replica planned for it)\n",
                d->val_t.size, d->val_t.size);
    if (c->ra_sampler && !c->dummy)
        fprintf(o,
                "=> sampler: RASampler, each image %d times on different devices; %zu samples "
                "per epoch (n // 256 * 256)\n",
                c->ra_reps, d->train_samples / 256 * 256);
    mgt_model_counts mc;
    mgt_model_get_counts(r->w[0].model, &mc);
    fprintf(o,
            "=> model: %s (%s), %zu parameters, %.3f GMACs per image, %.1f MiB activations per "
            "device (%.2f MiB per image)\n",
            c->arch, r->arch->family, mc.params, (double)mc.macs / 1e9,
            (double)mgt_model_activation_bytes(r->w[0].model) / (1024.0 * 1024.0),
            (double)mc.act_bytes_per_image / (1024.0 * 1024.0));
    const mgt_model *m0 = r->w[0].model;
    if (mgt_model_aux_count(m0))
        fprintf(o,
                "=> %d auxiliary classifier%s in training: loss = main + %g x each auxiliary "
                "loss (--aux-weight; Aux on the progress lines, unweighted); validation uses the "
                "main one\n",
                mgt_model_aux_count(m0), mgt_model_aux_count(m0) > 1 ? "s" : "",
                (double)mgt_model_aux_weight(m0));
    else if (r->arch->aux_weight > 0)
        fprintf(o, "=> built without its auxiliary classifiers (--aux-logits)\n");
    if (mgt_model_get_config(m0)->transform_input)
        fprintf(o, "=> transform_input: the ImageNet-normalised input mapped to (x - 0.5) / 0.5 "
                   "per channel, as torchvision does for its ported weights\n");
    if (c->amp != MGT_PREC_F32)
        fprintf(o,
                "=> mixed precision %s: convolutions and linear layers on %s-rounded inputs with "
                "fp32 sums; %d of %d activations and their gradients stored in %s between ops "
                "(%s); fp32 weights, their gradients, batch-norm statistics, loss and "
                "momentum%s\n",
                mgt_precision_name(c->amp), mgt_precision_name(c->amp), mc.values_16, mc.values,
                mgt_precision_name(c->amp),
                mc.values_16 ? "as autocast keeps them" : "this backend keeps fp32 activations",
                c->amp == MGT_PREC_FP16 ? "; dynamic loss scaling" : "");
    if (c->amp == MGT_PREC_BF16 && mgt_devset_kind(r->set) == MGT_DEVICE_MOCK)
        fprintf(o, "=> bf16 on mock devices: oneDNN's bf16 convolutions where the CPU has them "
                   "(AVX512-BF16, AMX); elsewhere, and for linear layers, emulated (inputs "
                   "rounded, then the fp32 kernels: the same numbers, not the speed)\n");
    if (c->amp == MGT_PREC_FP16 && mgt_devset_kind(r->set) == MGT_DEVICE_MOCK)
        fprintf(o, "=> fp16 on mock devices is emulated (inputs rounded, then the fp32 kernels: "
                   "the numbers of the real thing, not its speed)\n");
    if (c->amp == MGT_PREC_FP16)
        fprintf(o, "=> loss scale %g, %d clean steps towards the next growth\n",
                (double)r->scaler.scale, r->scaler.growth);
    fprintf(o, "=> epochs %d to %d\n", start_epoch, c->epochs - 1);
    fflush(o);
}

/* One validation pass over the replicas' current weights: loss, top-1, top-5. */
static bool val_pass(run *r, double *loss, double *acc1, double *acc5, long *images)
{
    train_metrics *m = &r->m;
    m->val_loss_sum = 0;
    m->val_n = m->val_c1 = m->val_c5 = 0;
    mgt_status st = train_broadcast(r, TRAIN_SYNC_BUFFERS);
    if (st == MGT_OK)
        st = mgt_loader_set_epoch(r->data.val_ld, 0, 0);
    if (st != MGT_OK) {
        train_fail(r, mgt_error_wrap(st, "validation of epoch %d", r->epoch));
        return false;
    }
    if (!train_run_phase(r, PHASE_VAL))
        return false;
    if (r->nodes > 1) { /* every image was counted once, on one node */
        double v[4] = {m->val_loss_sum, (double)m->val_n, (double)m->val_c1, (double)m->val_c5};
        st = mgt_world_sum(r->world, v, 4, &r->abort);
        if (st != MGT_OK) {
            train_fail(r,
                       mgt_error_wrap(st, "validation of epoch %d: the nodes' totals", r->epoch));
            return false;
        }
        m->val_loss_sum = v[0];
        m->val_n = (long)v[1];
        m->val_c1 = (long)v[2];
        m->val_c5 = (long)v[3];
    }
    double n = (double)(m->val_n ? m->val_n : 1);
    *loss = m->val_loss_sum / n;
    *acc1 = 100.0 * (double)m->val_c1 / n;
    *acc5 = 100.0 * (double)m->val_c5 / n;
    *images = m->val_n;
    return true;
}

/* The validation phase (and, with --model-ema after training, the EMA model's, as train.py
   evaluates model_ema beside the model); the numbers go to the result and to s. */
static bool validate(run *r, train_summary *s)
{
    mgt_train_result *res = r->res;
    if (!val_pass(r, &res->val_loss, &res->val_acc1, &res->val_acc5, &s->val_images))
        return false;
    s->validated = true;
    s->val_loss = res->val_loss;
    s->val_acc1 = res->val_acc1;
    s->val_acc5 = res->val_acc5;
    if (r->c->model_ema && s->trained) {
        mgt_status st = train_ema_swap_in(r);
        long images;
        bool ok = st == MGT_OK &&
                  val_pass(r, &res->ema_val_loss, &res->ema_val_acc1, &res->ema_val_acc5, &images);
        if (st == MGT_OK && !r->fail.set)
            st = train_ema_swap_out(r);
        if (st != MGT_OK) {
            train_fail(r, mgt_error_wrap(st, "EMA validation of epoch %d", r->epoch));
            return false;
        }
        if (!ok)
            return false;
        s->ema_validated = true;
        s->ema_val_loss = res->ema_val_loss;
        s->ema_val_acc1 = res->ema_val_acc1;
        s->ema_val_acc5 = res->ema_val_acc5;
    }
    return true;
}

/* The run's first record: its configuration, the command line, the version. */
static void report_start(run *r, int start_epoch, long start_step)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    const train_data *d = &r->data;
    train_start s = {.c = r->c,
                     .command_line = r->ctl.command_line,
                     .arch = r->arch ? r->arch->name : r->c->arch,
                     .family = r->arch ? r->arch->family : "",
                     .devices = r->wn,
                     .nodes = r->nodes,
                     .per_device_batch = d->per_dev_batch,
                     .classes = d->classes,
                     .channels = d->channels,
                     .image_size = d->size,
                     .steps_per_epoch = d->steps_per_epoch,
                     .train_images = d->train_samples,
                     .val_images = d->val_samples,
                     .start_epoch = start_epoch,
                     .start_step = start_step,
                     .wall_time = (double)now.tv_sec + 1e-9 * (double)now.tv_nsec};
    train_reports_start(&r->reports, &s);
    train_reports_flush(&r->reports);
}

/* Where an epoch's record stands for the readers that need more than its numbers. */
static void summary_place(run *r, train_summary *s)
{
    long steps = r->data.steps_per_epoch;
    s->steps_per_epoch = steps;
    s->global_step = (long)(s->epoch + (s->trained ? 1 : 0)) * steps;
    s->lr = mgt_lr_at(&r->lr, s->epoch, (int)(steps > 0 ? steps - 1 : 0), (int)steps);
    s->devices = r->n;
    s->devices_lost = r->nlost;
    s->profile = r->ctl.profile ? r->res->profile : NULL;
}

/* A CSV field: quoted (with quotes doubled) where it holds a comma, quote or line break. */
static void csv_field(FILE *f, const char *s)
{
    if (!strpbrk(s, ",\"\r\n")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"')
            fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

/* --confusion FILE: the matrix with class names, rows the true classes, columns the predicted
   ones; written through a temporary file and a rename. */
static mgt_status write_confusion(run *r, const long *cm, int k)
{
    const char *path = r->c->confusion_path;
    const mgt_dataset *ds = r->data.val_ds;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return mgt_error_set(MGT_ERR_IO, "--confusion %s: %s", path, strerror(errno));
    fputs("true \\ predicted", f);
    for (int j = 0; j < k; j++) {
        fputc(',', f);
        csv_field(f, mgt_dataset_class_name(ds, j));
    }
    fputc('\n', f);
    for (int i = 0; i < k; i++) {
        csv_field(f, mgt_dataset_class_name(ds, i));
        for (int j = 0; j < k; j++)
            fprintf(f, ",%ld", cm[(size_t)i * k + j]);
        fputc('\n', f);
    }
    bool bad = ferror(f) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        mgt_status st = mgt_error_set(MGT_ERR_IO, "--confusion %s: %s", path, strerror(errno));
        remove(tmp);
        return st;
    }
    return MGT_OK;
}

typedef struct class_acc {
    int c;
    double acc;
    long n;
} class_acc;

static int by_acc(const void *a, const void *b)
{
    const class_acc *x = a, *y = b;
    return x->acc < y->acc ? -1 : x->acc > y->acc ? 1 : x->c - y->c;
}

/* -e's confusion counts: every replica's (and node's) summed into the result, per-class top-1
   said (the five lowest, or every class with --per-class), the CSV written. */
static mgt_status eval_classes(run *r)
{
    int k = r->data.classes;
    if (!r->w[0].confusion) {
        if (r->c->confusion_path)
            return mgt_error_set(MGT_ERR_INVALID,
                                 "--confusion: %d classes, more than the %d a matrix is kept for",
                                 k, TRAIN_CONFUSION_MAX);
        return MGT_OK;
    }
    size_t kk = (size_t)k * k;
    long *cm = calloc(kk, sizeof *cm);
    class_acc *acc = calloc((size_t)k, sizeof *acc);
    double *sum = r->nodes > 1 ? calloc(kk, sizeof *sum) : NULL;
    mgt_status st = cm && acc && (r->nodes == 1 || sum)
                        ? MGT_OK
                        : mgt_error_set(MGT_ERR_OOM, "the confusion matrix: host memory exhausted");
    for (int i = 0; i < r->n && st == MGT_OK; i++)
        for (size_t e = 0; e < kk; e++)
            cm[e] += r->w[i].confusion[e];
    if (st == MGT_OK && sum) {
        for (size_t e = 0; e < kk; e++)
            sum[e] = (double)cm[e];
        st = mgt_world_sum(r->world, sum, kk, &r->abort);
        for (size_t e = 0; st == MGT_OK && e < kk; e++)
            cm[e] = (long)sum[e];
    }
    free(sum);
    if (st != MGT_OK) {
        free(cm);
        free(acc);
        return st;
    }
    for (int i = 0; i < k; i++) {
        long n = 0;
        for (int j = 0; j < k; j++)
            n += cm[(size_t)i * k + j];
        acc[i] = (class_acc){i, n ? 100.0 * (double)cm[(size_t)i * k + i] / (double)n : 0, n};
    }
    const mgt_dataset *ds = r->data.val_ds;
    FILE *o = r->out;
    if (r->c->per_class) {
        fprintf(o, "=> top-1 per class:\n");
        for (int i = 0; i < k; i++)
            fprintf(o, "   %-24s %7.3f%%  (%ld images)\n", mgt_dataset_class_name(ds, i),
                    acc[i].acc, acc[i].n);
    } else if (k > 1) {
        qsort(acc, (size_t)k, sizeof *acc, by_acc);
        int show = k < 5 ? k : 5;
        fprintf(o, "=> top-1 per class, the %d lowest:", show);
        for (int i = 0; i < show; i++)
            fprintf(o, "%s %s %.2f%%", i ? "," : "", mgt_dataset_class_name(ds, acc[i].c),
                    acc[i].acc);
        fprintf(o, " (--per-class lists all %d)\n", k);
    }
    if (r->c->confusion_path && r->primary) {
        st = write_confusion(r, cm, k);
        if (st == MGT_OK)
            fprintf(o, "=> confusion matrix (rows true, columns predicted) in %s\n",
                    r->c->confusion_path);
    }
    free(acc);
    r->res->confusion = cm;
    r->res->confusion_classes = k;
    return st;
}

static bool evaluate(run *r, int epoch)
{
    r->epoch = epoch;
    train_summary s = {.epoch = epoch};
    summary_place(r, &s);
    r->m.val_run_loss = 0;
    r->m.val_run_n = r->m.val_run_c1 = r->m.val_run_c5 = r->m.val_batches_done = 0;
    r->m.val_start = mgt_time_now();
    if (!validate(r, &s))
        return false;
    train_reports_summary(&r->reports, &s);
    train_reports_flush(&r->reports);
    mgt_status st = eval_classes(r);
    if (st != MGT_OK) {
        train_fail(r, st);
        return false;
    }
    return true;
}

static bool begin_epoch(run *r, int ep, long first)
{
    bool carry = r->carry_metrics;
    r->carry_metrics = false;
    if (first > 0 && r->primary && !carry)
        fprintf(
            r->out,
            "=> epoch %d resumes at step %ld of %ld: its averages (in parentheses) and training "
            "loss cover steps %ld to %ld only\n",
            ep, first, r->data.steps_per_epoch, first, r->data.steps_per_epoch - 1);
    r->epoch = ep;
    r->first_step = first;
    r->stop_at = r->data.steps_per_epoch;
    r->committed = first - 1;
    r->commit_arrived = 0;
    train_metrics_epoch_begin(r, carry);
    for (int i = 0; i < r->n; i++) {
        memset(&r->w[i].prof, 0, sizeof r->w[i].prof);
        r->w[i].started = r->w[i].metered = first;
    }
    mgt_status st =
        r->data.train_ld ? mgt_loader_set_epoch(r->data.train_ld, ep, (size_t)first) : MGT_OK;
    if (st != MGT_OK)
        train_fail(r, mgt_error_wrap(st, "data for epoch %d", ep));
    return st == MGT_OK;
}

/* The training phase's figures into the result and s. */
static void epoch_results(run *r, double ep_s, train_summary *s)
{
    mgt_train_result *res = r->res;
    const train_metrics *m = &r->m;
    res->steps += r->stop_at - m->epoch_first;
    r->run_images += m->n;
    r->run_train_s += ep_s;
    res->train_loss = m->n ? m->loss_sum / (double)m->n : 0;
    res->train_acc1 = m->n ? 100.0 * (double)m->c1 / (double)m->n : 0;
    res->train_images = m->n;
    res->images_per_s = ep_s > 0 ? (double)m->n / ep_s : 0;
    double timed_s = m->last_complete - m->timed_start;
    res->timed_images_per_s = timed_s > 0 ? (double)m->timed_n / timed_s : 0;
    res->timed_step_s = m->timed_steps ? timed_s / (double)m->timed_steps : 0;
    for (int i = 0; i < r->n; i++) {
        mgt_step_profile p = r->w[i].prof;
        double k = p.steps ? (double)p.steps : 1;
        res->profile[i] =
            (mgt_step_profile){p.data_s / k,           p.forward_s / k,   p.backward_s / k,
                               p.reduce_exposed_s / k, p.optimizer_s / k, p.steps};
    }
    *s = (train_summary){.epoch = r->epoch,
                         .trained = true,
                         .train_loss = res->train_loss,
                         .train_acc1 = res->train_acc1,
                         .images_per_s = res->images_per_s,
                         .epoch_s = ep_s};
    summary_place(r, s);
}

/* A stop mid-epoch: the checkpoint says where, so that --resume goes on from there. */
static bool save_stopped(run *r)
{
    r->res->interrupted = true;
    mgt_status st = train_broadcast(r, TRAIN_SYNC_BUFFERS);
    if (st == MGT_OK)
        st = train_checkpoint_save(r, r->epoch, r->stop_at, false, -1);
    if (st != MGT_OK) {
        train_fail(r, mgt_error_wrap(st, "checkpoint at epoch %d step %ld", r->epoch, r->stop_at));
        return false;
    }
    fprintf(r->out, "=> stopped at epoch %d step %ld%s\n", r->epoch, r->stop_at,
            r->res->checkpoint[0] ? "" : "; no checkpoint (no --checkpoint-dir)");
    return true;
}

/* A validation loss that is not a number stops the run: the model has diverged (its weights
   may still be finite, its logits are not), and nothing is saved from it. */
static bool loss_diverged(run *r, const train_summary *s)
{
    bool ema = isfinite(s->val_loss);
    double loss = ema ? s->ema_val_loss : s->val_loss;
    if (isfinite(loss) || (ema && !s->ema_validated))
        return false;
    train_fail_root(r, mgt_error_set(MGT_ERR_DEVICE,
                                     "epoch %d: the %svalidation loss is %s: the model has "
                                     "diverged (a lower --lr?); no checkpoint is written from it",
                                     s->epoch, ema ? "EMA model's " : "",
                                     isnan(loss) ? "NaN" : "infinite"));
    return true;
}

typedef enum epoch_end { EPOCH_DONE, EPOCH_STOPPED, EPOCH_FAILED } epoch_end;

static epoch_end finish_epoch(run *r, int ep, train_summary s);

static epoch_end run_epoch(run *r, int ep, long first)
{
    if (r->revalidate) { /* a device was lost in this epoch's validation: it runs again */
        r->revalidate = r->carry_metrics = false;
        r->first_step = r->stop_at = r->data.steps_per_epoch;
        train_summary s = r->epoch_summary;
        summary_place(r, &s); /* the devices it runs on now */
        return finish_epoch(r, ep, s);
    }
    if (!begin_epoch(r, ep, first) || !train_run_phase(r, PHASE_TRAIN))
        return EPOCH_FAILED;
    double ep_s = mgt_time_now() - r->m.start;
    mgt_status st = train_check_replicas(r);
    if (st != MGT_OK) {
        train_fail(r, mgt_error_wrap(st, "epoch %d", ep));
        return EPOCH_FAILED;
    }
    if ((st = train_check_finite(r)) != MGT_OK) {
        train_fail_root(r, mgt_error_wrap(st, "epoch %d", ep));
        return EPOCH_FAILED;
    }
    train_summary s;
    epoch_results(r, ep_s, &s);
    if (r->stop_at < r->data.steps_per_epoch)
        return save_stopped(r) ? EPOCH_STOPPED : EPOCH_FAILED;
    r->epoch_summary = s;
    return finish_epoch(r, ep, s);
}

/* The epoch's end after its training: validation, the epoch line, the checkpoint, a stop. */
static epoch_end finish_epoch(run *r, int ep, train_summary s)
{
    mgt_status st;
    bool is_best = false;
    if (r->data.val_ld) {
        if (!validate(r, &s))
            return EPOCH_FAILED;
        if (loss_diverged(r, &s))
            return EPOCH_FAILED;
        is_best = s.val_acc1 > r->best_acc1;
        if (is_best) {
            r->best_acc1 = s.val_acc1;
            r->res->best_epoch = ep;
        }
    } else if ((st = train_broadcast(r, TRAIN_SYNC_BUFFERS)) != MGT_OK) {
        train_fail(r, mgt_error_wrap(st, "epoch %d", ep));
        return EPOCH_FAILED;
    }
    r->res->epochs_done++;
    train_reports_summary(&r->reports, &s);
    train_reports_flush(&r->reports);
    st = train_checkpoint_save(r, ep + 1, 0, is_best, s.validated ? s.val_acc1 : -1);
    if (st != MGT_OK) {
        train_fail(r, mgt_error_wrap(st, "checkpoint after epoch %d", ep));
        return EPOCH_FAILED;
    }
    double stop = r->ctl.stop && atomic_load(r->ctl.stop);
    if (r->nodes > 1) { /* a stop after the epoch is every node's or none's */
        bool requested;
        long agreed;
        mgt_world_stop_poll(r->world, &requested, &agreed);
        stop = stop || requested;
        if ((st = mgt_world_sum(r->world, &stop, 1, &r->abort)) != MGT_OK) {
            train_fail(r, mgt_error_wrap(st, "after epoch %d", ep));
            return EPOCH_FAILED;
        }
    }
    if (stop > 0) {
        r->res->interrupted = true;
        return EPOCH_STOPPED;
    }
    return EPOCH_DONE;
}

/* Each device's memory in use, kept at its most (no allocation happens in the step loop, so
   after set-up and each epoch it is seen). */
static void sample_memory(run *r)
{
    for (int i = 0; i < r->n; i++) {
        size_t used = 0, total = 0;
        mgt_device_memory(r->devs[i], &used, &total);
        if (used > r->res->peak_bytes[i])
            r->res->peak_bytes[i] = used;
    }
}

/* The run's last lines: how long, how fast, the best top-1 and its epoch, the memory. */
static void print_end(run *r, bool ok)
{
    mgt_train_result *res = r->res;
    FILE *o = r->out;
    long t = (long)(res->total_s + 0.5);
    fprintf(o, "=> %s: %d epoch%s in %ld:%02ld:%02ld (%ld steps, %.1f training images/s)",
            !ok                ? "failed"
            : res->interrupted ? "stopped"
                               : "done",
            res->epochs_done, res->epochs_done == 1 ? "" : "s", t / 3600, (t / 60) % 60, t % 60,
            res->steps, res->run_images_per_s);
    if (res->best_epoch >= 0)
        fprintf(o, "; best Acc@1 %.3f at epoch %d", r->best_acc1, res->best_epoch);
    else if (r->best_acc1 > 0)
        fprintf(o, "; best Acc@1 %.3f (before the resume)", r->best_acc1);
    if (res->best_epoch >= 0 && r->c->checkpoint_dir)
        fprintf(o, " (%s/model_best.safetensors)", r->c->checkpoint_dir);
    fprintf(o, "\n=> device memory at its peak:");
    for (int i = 0; i < r->n; i++)
        fprintf(o, "%s %s %.1f MiB", i ? "," : "", mgt_device_name(r->devs[i]),
                (double)res->peak_bytes[i] / (1024.0 * 1024.0));
    fprintf(o, "\n");
    fflush(o);
}

/* ---- --on-device-failure continue ---- */

/* Whether the run's failure is one device's in a training step or a validation (not with
   --model-ema, whose replicas may hold the EMA weights then), which continue drops: its
   error, an allocation it could not make, or its stall, on one node. */
static bool droppable(const run *r)
{
    const train_failure *f = &r->fail;
    return r->c->continue_on_device_failure && f->set && !f->root && !f->remote && f->device >= 0 &&
           f->device < r->n && (!f->validation || !r->c->model_ema) && r->nodes == 1 &&
           (f->status == MGT_ERR_DEVICE || f->status == MGT_ERR_OOM ||
            f->status == MGT_ERR_TIMEOUT);
}

/* Which device stalled, when a wait ran out. A peer's streams wait behind a stalled device, so
   any of their waits (a loader's, the all-reduce's) may run out first: the device is the one
   whose kernel or copy has run for over half the wait limit (a hang in the all-reduce too),
   where the backend tells (mock devices) and it is the only one; else the one whose own work
   of its current step (forward and backward, which wait on no peer) has not finished, where it
   is the only one; else -1 (the caller looks for a worker stuck in a call, then takes the
   device whose wait ran out). */
static int stalled_device(const run *r)
{
    int found = -1, count = 0;
    for (int i = 0; i < r->n; i++)
        if (mgt_device_busy_s(r->devs[i]) > 0.5 * train_wait_limit(r->c, NULL)) {
            found = i;
            count++;
        }
    if (count == 1)
        return found;
    found = -1;
    count = 0;
    for (int i = 0; i < r->n; i++) {
        bool done = true;
        if (r->w[i].own_ev && (mgt_event_query(r->w[i].own_ev, &done) != MGT_OK || !done)) {
            found = i;
            count++;
        }
    }
    return count == 1 ? found : -1;
}

/* The failure of a worker thread that did not come back from a call to its device within the
   wait limit (detached by train_workers_join): its device is given up. */
static void fail_stuck_worker(run *r, int i)
{
    train_failure f = {.set = true,
                       .status = MGT_ERR_TIMEOUT,
                       .device = i,
                       .epoch = r->epoch,
                       .step = r->w[i].started > 0 ? r->w[i].started - 1 : 0};
    snprintf(f.phase, sizeof f.phase, "stuck in a call");
    train_stuck_text(r, f.cause, sizeof f.cause);
    mgt_device_abandon(r->devs[i], f.cause); /* stranded already (train_workers_join) */
    pthread_mutex_lock(&r->lock);
    r->fail = f;
    pthread_mutex_unlock(&r->lock);
}

/* "mock:2 (epoch 0 step 5), mock:1 (...)": every device lost so far. */
static void lost_text(const run *r, char *out, size_t cap)
{
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; i < r->nlost && len < cap; i++)
        len += (size_t)snprintf(out + len, cap - len, "%s%s (epoch %d step %ld)", i ? ", " : "",
                                r->lost[i].name, r->lost[i].epoch, r->lost[i].step);
}

/* The run's failure when continue cannot go on: why, every device lost, and what was saved. */
static void cannot_continue(run *r, const char *why, const char *saved)
{
    char lost[1024];
    lost_text(r, lost, sizeof lost);
    train_failure f = {
        .set = true, .status = MGT_ERR_DEVICE, .device = -1, .epoch = -1, .step = -1, .root = true};
    int len = snprintf(f.cause, sizeof f.cause,
                       "--on-device-failure continue: %s; devices lost: %s; %s", why, lost, saved);
    if (len >= (int)sizeof f.cause) /* a line that long says it was cut */
        memcpy(f.cause + sizeof f.cause - 4, "...", 4);
    pthread_mutex_lock(&r->lock);
    r->fail = f;
    pthread_mutex_unlock(&r->lock);
}

/* The state the survivors hold, after the last step every device committed: a worker that
   began the next (left out) step gets its batch-norm statistics back from the step's start. */
static mgt_status survivors_settle(run *r, const bool *lost)
{
    mgt_status st = MGT_OK;
    for (int i = 0; i < r->n && st == MGT_OK; i++) {
        worker *w = &r->w[i];
        if (lost[i])
            continue;
        st = mgt_device_synchronize(w->d, NULL);
        if (st == MGT_OK && w->bn_keep && w->keep_step > r->committed) {
            size_t bytes;
            float *bufs = mgt_model_buffers(w->model, &bytes);
            int nc;
            int64_t *counts = mgt_model_bn_counts(w->model, &nc);
            memcpy(counts, w->counts_keep, (size_t)nc * sizeof *counts);
            st = mgt_copy_d2d(w->s, bufs, mgt_buffer_ptr(w->bn_keep), bytes);
            if (st == MGT_OK)
                st = mgt_stream_synchronize(w->s, NULL);
        }
    }
    return st;
}

/* Worker (and replica) i takes j's place and j takes i's. */
static void swap_workers(run *r, int i, int j)
{
    worker w = r->w[i];
    r->w[i] = r->w[j];
    r->w[j] = w;
    r->w[i].dev = i;
    r->w[j].dev = j;
    float *p = r->params[i], *b = r->buffers[i];
    r->params[i] = r->params[j];
    r->buffers[i] = r->buffers[j];
    r->params[j] = p;
    r->buffers[j] = b;
}

/* Every device that failed in the phase (the one the run's failure names, and any other that
   failed beside it: two in one step are dropped together), each given up and said in its
   line; *count gets how many. */
static void collect_lost(run *r, bool *lost, int *count, double t0)
{
    *count = 0;
    for (int k = -1; k < r->n; k++) { /* the run's failure first, then the others */
        int i = k < 0 ? r->fail.device : k;
        if (k == r->fail.device)
            continue;
        train_failure f = r->fail;
        lost[i] = k < 0 || train_device_failure(r, i, &f) > 0;
        if (!lost[i])
            continue;
        mgt_device_abandon(r->devs[i], "given up after its failure");
        char line[sizeof f.cause + 256];
        train_failure_format(r, &f, line, sizeof line);
        fprintf(r->out, "=> %s\n", line);
        const train_failure *g = &f;
        struct train_lost *l = &r->lost[r->nlost++];
        snprintf(l->name, sizeof l->name, "%s", mgt_device_name(r->devs[i]));
        l->epoch = g->epoch >= 0 ? g->epoch : r->epoch;
        l->step = g->validation ? r->data.steps_per_epoch : g->step;
        snprintf(l->phase, sizeof l->phase, "%.31s", g->validation ? "validation" : g->phase);
        l->at = t0 - r->start_s;
        ++*count;
    }
}

/* After a failed training or validation phase: drops the failed devices and makes the run
   again over the survivors, from the first step they have not all made (a validation again
   from its start); *ep and *first get where to go on. False when the failure is not a device's,
   or the survivors cannot go on (the run's failure then says why, and what was saved). */
static bool drop_failed_device(run *r, int *ep, long *first)
{
    double t0 = r->fail.set ? r->fail_at : mgt_time_now();
    /* a stalled device is given up before anything waits on it; the others' waits, which ran
       out behind it, may go on */
    bool stall = r->fail.set && r->fail.status == MGT_ERR_TIMEOUT && r->fail.device >= 0 &&
                 r->fail.device < r->n;
    int d = stall ? stalled_device(r) : -1;
    const char *flag;
    double limit = train_wait_limit(r->c, &flag);
    char why[128];
    snprintf(why, sizeof why, "its work made no progress within %s %g s: given up",
             flag ? flag : "the default wait limit of", limit);
    if (d >= 0)
        mgt_device_abandon(r->devs[d], why);
    /* every worker leaves at the abort flag, but one stuck in a call that does not return
       (its device shows no stalled work: the host never queued it), which is detached */
    int detached = train_workers_join(r);
    for (int i = 0; detached && i < r->n; i++)
        if (r->w[i].detached && !r->w[i].given_up) {
            fail_stuck_worker(r, i);
            r->w[i].given_up = true;
        }
    if (stall && d < 0 && !detached) /* no sign of where: the device whose wait ran out */
        mgt_device_abandon(r->devs[r->fail.device], why);
    /* every wait may go on, the abandoned device's too: its work is dropped, and its marks then
       say which stage of its step held the stall (train_failure_settle) */
    for (int i = 0; stall && i < r->n; i++)
        mgt_device_unstall(r->devs[i]);
    if (!detached)
        train_failure_settle(r);
    /* the failure noticed by one device's thread may be another's fault (a peer copy from it,
       the all-reduce's enqueue): the device that failed is the one to drop, and its line is its
       own (device, cause, step and stage together, never one device's name on another's text) */
    for (int i = 0; r->fail.device >= 0 && i < r->n; i++) {
        train_failure f;
        if (!train_device_failure(r, i, &f))
            continue;
        if (r->fail.device != i) {
            f.status = r->fail.status == MGT_OK ? MGT_ERR_DEVICE : r->fail.status;
            pthread_mutex_lock(&r->lock);
            r->fail = f;
            pthread_mutex_unlock(&r->lock);
        }
        break;
    }
    /* the run's one line (train_failure_line) says why a lost device is not dropped here */
    if (r->nodes > 1 && r->fail.device >= 0 && r->fail.device < r->n && !r->fail.remote)
        r->lost_across_nodes = true;
    if (!droppable(r))
        return false;
    bool validation = r->fail.validation;
    long resume = r->committed + 1 > r->first_step ? r->committed + 1 : r->first_step;
    if (validation)
        resume = r->data.steps_per_epoch;
    bool lost[MGT_MAX_DEVICES];
    int nlost = 0, first_lost = r->nlost;
    collect_lost(r, lost, &nlost, t0);
    int left = r->n - nlost, min = r->c->min_devices > 0 ? r->c->min_devices : 1;
    /* every thread that saw the flag has left (the loaders' go first, with their batches for
       the old shards) */
    mgt_loader_free(r->data.train_ld);
    mgt_loader_free(r->data.val_ld);
    r->data.train_ld = r->data.val_ld = NULL;
    atomic_store(&r->abort.raised, 0);
    mgt_status st = survivors_settle(r, lost);
    if (st == MGT_OK && !validation)
        train_meter_left(r, lost, resume);
    if (st != MGT_OK) {
        char why[512];
        snprintf(why, sizeof why, "a survivor failed too: %s", mgt_error_last());
        cannot_continue(r, why, "nothing saved since the last checkpoint");
        return false;
    }
    /* replica 0 is a survivor's: it is the one saved and broadcast. A worker whose thread is
       stuck in a call keeps its slot: the swap goes on a copy of the array, the old one kept
       for that thread */
    worker *moved = lost[0] && r->w[0].detached ? malloc((size_t)r->nw * sizeof *moved) : NULL;
    if (moved) {
        memcpy(moved, r->w, (size_t)r->nw * sizeof *moved);
        train_keep(r->w);
        r->w = moved;
    } else if (lost[0] && r->w[0].detached) {
        cannot_continue(r, "out of host memory", "nothing saved since the last checkpoint");
        return false;
    }
    for (int j = 1; lost[0] && j < r->n; j++)
        if (!lost[j]) {
            swap_workers(r, 0, j);
            lost[0] = false;
            lost[j] = true;
        }
    r->scaler = r->w[0].scaler;
    bool divides = r->c->batch_size % left == 0;
    if (left < min || !divides) {
        char why[256], saved[4400] = "no --checkpoint-dir: nothing saved since the start";
        if (left < min)
            snprintf(why, sizeof why, "%d device%s left, below --min-devices %d", left,
                     left == 1 ? "" : "s", min);
        else
            snprintf(why, sizeof why,
                     "-b %d does not divide over the %d devices left (the global batch stays)",
                     r->c->batch_size, left);
        if (r->c->checkpoint_dir) {
            st = train_checkpoint_save(r, r->epoch, resume, false, -1);
            if (st == MGT_OK)
                snprintf(saved, sizeof saved, "saved %s at epoch %d step %ld", r->res->checkpoint,
                         r->epoch, resume);
            else
                snprintf(saved, sizeof saved, "the checkpoint failed: %s", mgt_error_last());
        }
        cannot_continue(r, why, saved);
        return false;
    }
    /* the survivors' state through a checkpoint, as a resume on their count reads it: into
       --checkpoint-dir (a mid-epoch checkpoint, kept), else a temporary file */
    char path[4300];
    if (r->c->checkpoint_dir) {
        st = train_checkpoint_save(r, r->epoch, resume, false, -1);
        snprintf(path, sizeof path, "%s", r->res->checkpoint);
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(path, sizeof path, "%s/mgtrain-handover-%ld.safetensors",
                 tmp && *tmp ? tmp : "/tmp", (long)getpid());
        st = train_handover_save(r, path, r->epoch, resume);
    }
    if (st != MGT_OK) {
        char why[600];
        snprintf(why, sizeof why, "the survivors' state could not be handed over: %s",
                 mgt_error_last());
        cannot_continue(r, why, "nothing saved since the last checkpoint");
        return false;
    }
    /* the run again over the survivors */
    for (int i = 0, j = 0; i < r->n; i++)
        if (!lost[i])
            r->devs[j++] = r->w[i].d;
    r->n = left;
    r->wn = left;
    r->data.per_dev_batch = r->c->batch_size / left;
    r->fail = (train_failure){0};
    st = train_remake_parts(r);
    if (st == MGT_OK)
        st = train_handover_load(r, path);
    if (!r->c->checkpoint_dir)
        unlink(path);
    if (st == MGT_OK)
        st = train_broadcast(r, TRAIN_SYNC_PARAMS | TRAIN_SYNC_OPTIMIZER);
    if (st == MGT_OK)
        st = train_workers_start(r);
    if (st != MGT_OK) {
        char why[600];
        snprintf(why, sizeof why, "the survivors could not be set up at %d images per device: %s",
                 r->data.per_dev_batch, mgt_error_last());
        cannot_continue(r, why,
                        r->c->checkpoint_dir ? "the checkpoint before the re-formation is kept"
                                             : "nothing saved since the last checkpoint");
        return false;
    }
    double resume_s = mgt_time_now() - t0;
    char names[512] = "", gone[512] = "";
    size_t len = 0;
    for (int i = 0; i < r->n && len < sizeof names; i++)
        len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", i ? ", " : "",
                                mgt_device_name(r->devs[i]));
    len = 0;
    for (int i = first_lost; i < r->nlost && len < sizeof gone; i++) {
        r->lost[i].resume_s = resume_s;
        len += (size_t)snprintf(gone + len, sizeof gone - len, "%s%s", i > first_lost ? ", " : "",
                                r->lost[i].name);
    }
    if (validation)
        fprintf(r->out,
                "=> %s dropped: the validation of epoch %d runs again on %d device%s (%s), "
                "%d images per device in training (%.3f s from the failure's notice)\n",
                gone, r->epoch, r->n, r->n == 1 ? "" : "s", names, r->data.per_dev_batch, resume_s);
    else
        fprintf(r->out,
                "=> %s dropped: training goes on with %d device%s (%s) from epoch %d step %ld, "
                "%d images per device (%.3f s from the failure's notice)\n",
                gone, r->n, r->n == 1 ? "" : "s", names, r->epoch, resume, r->data.per_dev_batch,
                resume_s);
    *ep = r->epoch;
    *first = resume;
    r->carry_metrics = true;
    r->revalidate = validation;
    return true;
}

static bool train_epochs(run *r, int start_epoch, long start_step)
{
    long first = start_step;
    for (int ep = start_epoch; ep < r->c->epochs;) {
        epoch_end e = run_epoch(r, ep, first);
        sample_memory(r);
        if (e == EPOCH_FAILED && r->c->continue_on_device_failure &&
            drop_failed_device(r, &ep, &first)) {
            if (r->ctl.stop && atomic_load(r->ctl.stop)) {
                /* Ctrl-C during the re-formation: the survivors' state it saved is the stop's
                   checkpoint; nothing more runs */
                r->res->interrupted = true;
                fprintf(r->out, "=> stopped at epoch %d step %ld, during the re-formation%s%s\n",
                        ep, first, r->c->checkpoint_dir ? "; checkpoint " : "",
                        r->c->checkpoint_dir ? r->res->checkpoint
                                             : "; no checkpoint (no --checkpoint-dir)");
                return true;
            }
            continue;
        }
        if (e != EPOCH_DONE)
            return e == EPOCH_STOPPED;
        ep++;
        first = 0;
    }
    return true;
}

/* The one cleanup path: stops the workers, places a device's fault, frees every part, and
   leaves the run's first failure (or the set-up error, st) as this thread's error text: what
   cleanup reports never replaces it. */
static mgt_status run_finish(run *r, mgt_status st)
{
    if (st != MGT_OK && !r->fail.set) /* a set-up error: its text is still this thread's */
        train_fail(r, st);
    train_workers_stop(r);
    char text[sizeof r->fail.cause + 256];
    char other[8];
    if (r->fail.set && !r->fail.remote && r->fail.status == MGT_ERR_ABORTED && r->nodes > 1 &&
        mgt_world_poll_failure(r->world, other, sizeof other))
        r->fail.remote = true; /* a wait left because another node failed: that node's line */
    if (r->fail.set) {
        train_failure_settle(r);
        train_failure_line(r, text, sizeof text);
        st = r->fail.status;
        r->res->remote_failure = r->fail.remote;
    }
    train_free_parts(r);
    train_close_sources(r);
    if (r->have_ckpt)
        mgt_ckpt_info_free(&r->ckpt);
    mgt_devset_set_waits(r->set, NULL, 0, NULL); /* the flag is this run's, gone with it */
    if (r->reports.n)
        train_reports_free(&r->reports);
    if (r->log)
        fclose(r->log);
    if (r->tb && (ferror(r->tb) | fclose(r->tb)) != 0) /* the run's state is in the checkpoint */
        fprintf(r->out, "=> warning: --tensorboard %s: the event file is incomplete: %s\n",
                r->c->tensorboard_dir, strerror(errno));
    if (!r->detached) {
        pthread_mutex_destroy(&r->lock);
        pthread_cond_destroy(&r->cv);
        free(r);
    } else { /* a worker's thread stuck in a call may still reach the run: it is kept */
        train_keep(r);
    }
    return st == MGT_OK ? MGT_OK : mgt_error_set(st, "%s", text);
}

void mgt_train_result_free(mgt_train_result *r)
{
    free(r->confusion);
    r->confusion = NULL;
    r->confusion_classes = 0;
}

mgt_status mgt_train_run(const mgt_train_config *c, const mgt_train_controls *ctl, mgt_devset *set,
                         mgt_train_result *res)
{
    memset(res, 0, sizeof *res);
    /* on the heap: a worker thread abandoned in a call that does not return keeps it */
    run *r = malloc(sizeof *r);
    if (!r)
        return mgt_error_set(MGT_ERR_OOM, "trainer: host memory exhausted");
    *r = (run){.cfg = *c, .set = set, .n = mgt_devset_count(set), .res = res};
    r->c = c = &r->cfg;
    for (int i = 0; i < r->n && i < MGT_MAX_DEVICES; i++)
        r->devs[i] = mgt_devset_device(set, i);
    if (ctl)
        r->ctl = *ctl;
    r->world = r->ctl.world;
    r->node = mgt_world_rank(r->world);
    r->nodes = mgt_world_size(r->world);
    r->wn = r->nodes * r->n;
    r->wfirst = r->node * r->n;
    r->primary = r->node == 0;
    /* start-up (scanning the data, building replicas, reading a checkpoint) may take one node
       much longer than another: until the first step its waits on the other nodes are bounded
       by --timeout or TRAIN_START_WAIT_S, whichever is longer; the steps' by --timeout */
    if (r->world)
        mgt_world_set_timeout(r->world,
                              c->step_timeout_s > 0 && c->step_timeout_s < TRAIN_START_WAIT_S
                                  ? TRAIN_START_WAIT_S
                                  : c->step_timeout_s);
    /* no device wait outlasts --timeout (a hung kernel), and a backend's own waits inside a
       call leave when the run aborts */
    const char *wait_flag;
    double wait_limit = train_wait_limit(c, &wait_flag);
    mgt_devset_set_waits(set, &r->abort, wait_flag ? wait_limit : 0, wait_flag);
    r->out = r->ctl.out ? r->ctl.out : stdout;
    r->lr = c->lr;
    r->lr.epochs = c->epochs; /* the schedule spans the run, as train.h promises */
    /* train.py's adjust: images per update for world_size * batch_size (with --accum-steps,
       every micro-batch's) */
    r->ema_decay = mgt_ema_decay(
        c->model_ema_decay, (long)(c->batch_size / (r->wn ? r->wn : 1)) * r->wn * c->accum_steps,
        c->model_ema_steps, c->epochs);
    r->start_s = mgt_time_now();
    r->scaler =
        (train_scaler){.scale = c->loss_scale_init > 0 ? c->loss_scale_init : MGT_SCALER_INIT};
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->cv, NULL);
    int start_epoch = c->start_epoch > 0 ? c->start_epoch : 0;
    long start_step = 0;
    mgt_status st = r->world ? mgt_world_check_devices(r->world, r->n) : MGT_OK;
    if (st == MGT_OK)
        st = train_open_sources(r);
    if (st == MGT_OK)
        st = train_checkpoint_defaults(r, &r->cfg);
    if (!r->cfg.arch)
        r->cfg.arch = "resnet18";
    if (st == MGT_OK)
        st = check_config(r);
    r->data.per_dev_batch = r->wn > 0 ? c->batch_size / r->wn : 0;
    if (st == MGT_OK)
        st = open_outputs(r);
    if (st == MGT_OK)
        st = train_open_data(r);
    if (st == MGT_OK)
        st = train_check_data_against(r);
    if (st == MGT_OK)
        st = agree_with_nodes(r);
    if (st == MGT_OK)
        st = train_make_workers(r);
    if (st == MGT_OK)
        st = train_make_comm(r);
    if (st == MGT_OK)
        st = train_load_pretrained(r);
    if (st == MGT_OK)
        st = train_resume(r, &start_epoch, &start_step);
    if (st == MGT_OK && r->nodes > 1) /* where node 0 goes on from */
        st = train_world_position(r, &start_epoch, &start_step);
    if (st == MGT_OK)
        st = train_broadcast(r, TRAIN_SYNC_PARAMS | TRAIN_SYNC_OPTIMIZER);
    if (r->world)
        mgt_world_set_timeout(r->world, c->step_timeout_s);
    if (st == MGT_OK)
        st = train_workers_start(r);
    res->best_epoch = -1;
    if (st == MGT_OK) {
        sample_memory(r);
        if (r->primary)
            print_start(r, start_epoch);
        report_start(r, start_epoch, start_step);
        bool ok = c->evaluate ? evaluate(r, start_epoch) : train_epochs(r, start_epoch, start_step);
        res->total_s = mgt_time_now() - r->start_s;
        res->run_images_per_s = r->run_train_s > 0 ? (double)r->run_images / r->run_train_s : 0;
        if (!c->evaluate && r->primary)
            print_end(r, ok);
        if (!ok)
            st = MGT_ERR_DEVICE; /* run_finish takes the recorded failure's status */
    }
    res->best_acc1 = r->best_acc1;
    res->loss_scale = r->scaler.scale;
    res->skipped_steps = r->scaler.skipped;
    return run_finish(r, st);
}
