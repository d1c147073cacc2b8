/* The trainer's driver: checks the configuration, builds the run's parts in order, trains
   epoch by epoch (or validates once), and frees everything on one cleanup path whatever
   happened. Each epoch: the training phase, the replica check, validation, the epoch's
   records, the checkpoint. Between phases, replica 0's state goes to every device (and node),
   and the replicas are checked to agree bit for bit. */
#include <errno.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/train_impl.h"

void mgt_train_config_defaults(mgt_train_config *c)
{
    memset(c, 0, sizeof *c);
    c->arch = "resnet18";
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

/* What the run cannot start with, each named by its flag. */
static mgt_status check_config(run *r)
{
    const mgt_train_config *c = r->c;
    if (!c->arch)
        return mgt_error_set(MGT_ERR_INVALID, "--arch is missing");
    r->arch = mgt_arch_find(c->arch);
    if (!r->arch)
        return mgt_error_set(MGT_ERR_INVALID,
                             "--arch '%s': unknown architecture (mgtrain model "
                             "--help lists them)",
                             c->arch);
    if (!c->dummy && !c->data_dir)
        return mgt_error_set(MGT_ERR_INVALID, "--data DIR is missing (or use --dummy)");
    if (c->amp != MGT_PREC_F32 && c->amp != MGT_PREC_BF16 && c->amp != MGT_PREC_FP16)
        return mgt_error_set(MGT_ERR_INVALID, "--amp: unknown precision %d", (int)c->amp);
    if (!(c->loss_scale_init >= 0 && c->loss_scale_init < 1e38f))
        return mgt_error_set(MGT_ERR_INVALID, "loss_scale_init %g is not a positive number",
                             (double)c->loss_scale_init);
    if (c->evaluate && c->dummy)
        return mgt_error_set(MGT_ERR_INVALID,
                             "--evaluate needs --data: dummy data has no validation split");
    if (c->resume && strcmp(c->resume, "auto") == 0 && !c->checkpoint_dir)
        return mgt_error_set(MGT_ERR_INVALID,
                             "--resume auto: there is nothing to resume from without "
                             "--checkpoint-dir");
    if (c->batch_size < r->wn)
        return mgt_error_set(MGT_ERR_INVALID,
                             "-b %d is smaller than the device count %d: -b is the total batch "
                             "over all devices%s",
                             c->batch_size, r->wn, r->nodes > 1 ? " of all nodes" : "");
    if (c->epochs < 1 || c->print_freq < 1 || c->bucket_bytes == 0)
        return mgt_error_set(MGT_ERR_INVALID, "--epochs, --print-freq and --bucket-mb must be "
                                              "positive");
    if (c->dummy && c->dummy_steps < 1)
        return mgt_error_set(MGT_ERR_INVALID, "--dummy-steps must be positive");
    if (!(c->random_erase >= 0 && c->random_erase <= 1))
        return mgt_error_set(MGT_ERR_INVALID, "--random-erase %g is not a probability",
                             (double)c->random_erase);
    if (mgt_lr_per_epoch(c->lr.kind) && c->lr.warmup_epochs != (float)(int)c->lr.warmup_epochs)
        return mgt_error_set(MGT_ERR_INVALID,
                             "--lr-warmup-epochs %g: the references' warm-up is whole epochs",
                             (double)c->lr.warmup_epochs);
    if (c->accum_steps < 1 || c->model_ema_steps < 1 || !(c->clip_grad_norm >= 0) ||
        !(c->model_ema_decay >= 0 && c->model_ema_decay <= 1))
        return mgt_error_set(MGT_ERR_INVALID,
                             "--accum-steps %d and --model-ema-steps %d must be positive, "
                             "--clip-grad-norm %g not negative, --model-ema-decay %g in [0, 1]",
                             c->accum_steps, c->model_ema_steps, (double)c->clip_grad_norm,
                             (double)c->model_ema_decay);
    if (!(c->mixup_alpha >= 0 && c->cutmix_alpha >= 0))
        return mgt_error_set(MGT_ERR_INVALID, "--mixup-alpha and --cutmix-alpha must not be "
                                              "negative");
    if ((c->aux_logits >= 0 || c->aux_weight >= 0) && r->arch->aux_weight == 0)
        return mgt_error_set(MGT_ERR_INVALID,
                             "--aux-logits, --aux-weight: %s has no auxiliary classifiers "
                             "(inception_v3 and googlenet have)",
                             c->arch);
    if (c->transform_input > 0 && !r->arch->transform_input)
        return mgt_error_set(MGT_ERR_INVALID,
                             "--transform-input: %s has none (inception_v3 and googlenet have)",
                             c->arch);
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
    if (c->checkpoint_dir && ((mkdir(c->checkpoint_dir, 0777) != 0 && errno != EEXIST) ||
                              access(c->checkpoint_dir, W_OK | X_OK) != 0))
        return mgt_error_set(MGT_ERR_IO, "--checkpoint-dir %s: %s", c->checkpoint_dir,
                             strerror(errno));
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

static void print_start(run *r, int start_epoch)
{
    const mgt_train_config *c = r->c;
    const train_data *d = &r->data;
    FILE *o = r->out;
    fprintf(o, "=> devices (%d, %s):", r->n, mgt_device_kind_name(mgt_devset_kind(r->set)));
    for (int i = 0; i < r->n; i++)
        fprintf(o, " %s", mgt_device_name(mgt_devset_device(r->set, i)));
    if (r->nodes > 1)
        fprintf(o, "\n=> world: %d nodes x %d devices = %d replicas (this is node %d, %s)",
                r->nodes, r->n, r->wn, r->node, mgt_world_host(r->world));
    fprintf(o, "\n=> batch: %d per device x %d devices = %d per step", d->per_dev_batch, r->wn,
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
    mgt_model_counts mc;
    mgt_model_get_counts(r->w[0].model, &mc);
    fprintf(o,
            "=> model: %s (%s), %zu parameters, %.3f GMACs per image, %.1f MiB activations per "
            "device\n",
            c->arch, r->arch->family, mc.params, (double)mc.macs / 1e9,
            (double)mgt_model_activation_bytes(r->w[0].model) / (1024.0 * 1024.0));
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
                "=> mixed precision %s: convolutions and linear layers on %s-rounded inputs, "
                "fp32 sums, results, batch norm, loss, weights and momentum%s\n",
                mgt_precision_name(c->amp), mgt_precision_name(c->amp),
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
        if (st == MGT_OK && !r->failed)
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
    s->profile = r->ctl.profile ? r->res->profile : NULL;
}

static bool evaluate(run *r, int epoch)
{
    r->epoch = epoch;
    train_summary s = {.epoch = epoch};
    summary_place(r, &s);
    if (!validate(r, &s))
        return false;
    train_reports_summary(&r->reports, &s);
    train_reports_flush(&r->reports);
    return true;
}

static bool begin_epoch(run *r, int ep, long first)
{
    r->epoch = ep;
    r->first_step = first;
    r->stop_at = r->data.steps_per_epoch;
    train_metrics_epoch_begin(r);
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
    res->steps += r->stop_at - r->first_step;
    res->train_loss = m->n ? m->loss_sum / (double)m->n : 0;
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
                         .train_acc1 = m->n ? 100.0 * (double)m->c1 / (double)m->n : 0,
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
        st = train_checkpoint_save(r, r->epoch, r->stop_at, false);
    if (st != MGT_OK) {
        train_fail(r, mgt_error_wrap(st, "checkpoint at epoch %d step %ld", r->epoch, r->stop_at));
        return false;
    }
    fprintf(r->out, "=> stopped at epoch %d step %ld; checkpoint %s\n", r->epoch, r->stop_at,
            r->res->checkpoint[0] ? r->res->checkpoint : "(none: no --checkpoint-dir)");
    return true;
}

typedef enum epoch_end { EPOCH_DONE, EPOCH_STOPPED, EPOCH_FAILED } epoch_end;

static epoch_end run_epoch(run *r, int ep, long first)
{
    if (!begin_epoch(r, ep, first) || !train_run_phase(r, PHASE_TRAIN))
        return EPOCH_FAILED;
    double ep_s = mgt_time_now() - r->m.start;
    mgt_status st = train_check_replicas(r);
    if (st != MGT_OK) {
        train_fail(r, mgt_error_wrap(st, "epoch %d", ep));
        return EPOCH_FAILED;
    }
    train_summary s;
    epoch_results(r, ep_s, &s);
    if (r->stop_at < r->data.steps_per_epoch)
        return save_stopped(r) ? EPOCH_STOPPED : EPOCH_FAILED;
    bool is_best = false;
    if (r->data.val_ld) {
        if (!validate(r, &s))
            return EPOCH_FAILED;
        is_best = s.val_acc1 > r->best_acc1;
        if (is_best)
            r->best_acc1 = s.val_acc1;
    } else if ((st = train_broadcast(r, TRAIN_SYNC_BUFFERS)) != MGT_OK) {
        train_fail(r, mgt_error_wrap(st, "epoch %d", ep));
        return EPOCH_FAILED;
    }
    r->res->epochs_done++;
    train_reports_summary(&r->reports, &s);
    train_reports_flush(&r->reports);
    st = train_checkpoint_save(r, ep + 1, 0, is_best);
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

static bool train_epochs(run *r, int start_epoch, long start_step)
{
    for (int ep = start_epoch; ep < r->c->epochs; ep++) {
        epoch_end e = run_epoch(r, ep, ep == start_epoch ? start_step : 0);
        if (e != EPOCH_DONE)
            return e == EPOCH_STOPPED;
    }
    return true;
}

/* The one cleanup path: stops the workers, frees every part, and leaves st's text (the
   run's first failure, or the set-up error) as this thread's error text. */
static mgt_status run_finish(run *r, mgt_status st)
{
    char text[sizeof r->fail_text];
    snprintf(text, sizeof text, "%s", r->failed ? r->fail_text : mgt_error_last());
    if (r->failed)
        st = r->fail_status != MGT_OK ? r->fail_status : MGT_ERR_DEVICE;
    if (st != MGT_OK)
        mgt_abort_raise(&r->abort);
    train_workers_stop(r);
    train_free_parts(r);
    mgt_devset_set_waits(r->set, NULL, 0); /* the flag is this run's, gone with it */
    if (r->reports.n)
        train_reports_free(&r->reports);
    if (r->log)
        fclose(r->log);
    if (r->tb && (ferror(r->tb) | fclose(r->tb)) != 0) /* the run's state is in the checkpoint */
        fprintf(r->out, "=> warning: --tensorboard %s: the event file is incomplete: %s\n",
                r->c->tensorboard_dir, strerror(errno));
    pthread_mutex_destroy(&r->lock);
    pthread_cond_destroy(&r->cv);
    return st == MGT_OK ? MGT_OK : mgt_error_set(st, "%s", text);
}

mgt_status mgt_train_run(const mgt_train_config *c, const mgt_train_controls *ctl, mgt_devset *set,
                         mgt_train_result *res)
{
    memset(res, 0, sizeof *res);
    run R = {.c = c, .set = set, .n = mgt_devset_count(set), .res = res};
    run *r = &R;
    if (ctl)
        r->ctl = *ctl;
    r->world = r->ctl.world;
    r->node = mgt_world_rank(r->world);
    r->nodes = mgt_world_size(r->world);
    r->wn = r->nodes * r->n;
    r->wfirst = r->node * r->n;
    r->primary = r->node == 0;
    if (r->world)
        mgt_world_set_timeout(r->world, c->step_timeout_s);
    /* no device wait outlasts --timeout (a hung kernel), and a backend's own waits inside a
       call leave when the run aborts */
    mgt_devset_set_waits(set, &r->abort, c->step_timeout_s);
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
        st = check_config(r);
    r->data.per_dev_batch = r->wn > 0 ? c->batch_size / r->wn : 0;
    if (st == MGT_OK)
        st = open_outputs(r);
    if (st == MGT_OK)
        st = train_open_data(r);
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
    if (st == MGT_OK)
        st = train_workers_start(r);
    if (st == MGT_OK) {
        if (r->primary)
            print_start(r, start_epoch);
        report_start(r, start_epoch, start_step);
        bool ok = c->evaluate ? evaluate(r, start_epoch) : train_epochs(r, start_epoch, start_step);
        if (!ok)
            st = MGT_ERR_DEVICE; /* run_finish takes the recorded failure's status */
    }
    res->best_acc1 = r->best_acc1;
    res->loss_scale = r->scaler.scale;
    res->skipped_steps = r->scaler.skipped;
    return run_finish(r, st);
}
