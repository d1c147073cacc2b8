/* What a run is made of before its first step: the data (transforms from the architecture's
   policy, loaders, or synthetic batches), one replica per device with its optimizer and
   metric slots, the gradient all-reduce over the model's layer ends. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mgt/rng.h"
#include "train/train_impl.h"

/* ---- data ---- */

static void open_synthetic(run *r)
{
    const mgt_train_config *c = r->c;
    train_data *d = &r->data;
    d->classes = c->dummy_classes > 0 ? c->dummy_classes : r->arch->synthetic_classes;
    d->channels = c->dummy_channels > 0 ? c->dummy_channels : 3;
    d->size = c->image_size > 0 ? c->image_size : r->arch->synthetic_size;
    d->train_samples = (size_t)c->dummy_steps * (size_t)d->per_dev_batch * (size_t)r->wn;
    d->val_samples = 0;
    d->steps_per_epoch = c->dummy_steps;
    if (r->ctl.max_steps > 0 && r->ctl.max_steps < d->steps_per_epoch)
        d->steps_per_epoch = r->ctl.max_steps;
}

/* The training and validation transforms: the architecture's policy unless the user chose,
   normalised by the given, computed or ImageNet's mean and std. */
static mgt_status make_transforms(run *r, int w, int h, mgt_transform *tt, mgt_transform *vt)
{
    const mgt_train_config *c = r->c;
    train_data *d = &r->data;
    mgt_augment aug = c->augment;
    if (aug == MGT_AUGMENT_DEFAULT)
        aug = r->arch->augment == MGT_ARCH_AUGMENT_RRC ? MGT_AUGMENT_RRC : MGT_AUGMENT_PAD_CROP;
    /* FixRes: validation may crop at another size than training (each replica then has a
       validation twin planned for it) */
    int vsize = c->val_crop_size > 0 ? c->val_crop_size : d->size;
    mgt_status st = mgt_transform_init(vt, MGT_TRANSFORM_RESIZE_CROP, vsize, d->channels);
    if (st == MGT_OK && r->arch->eval == MGT_ARCH_EVAL_RESIZE_CROP)
        vt->resize = mgt_arch_resize_size(r->arch, vsize);
    if (st == MGT_OK && r->arch->eval == MGT_ARCH_EVAL_NATIVE)
        vt->resize = (w == vsize && h == vsize) ? 0 : vsize;
    if (st == MGT_OK && c->val_resize_size > 0)
        vt->resize = c->val_resize_size;
    vt->interp = c->interpolation;
    vt->exact_decode = c->exact_decode;
    if (st == MGT_OK && aug == MGT_AUGMENT_NONE)
        *tt = *vt;
    else if (st == MGT_OK)
        st = mgt_transform_init(tt,
                                aug == MGT_AUGMENT_RRC ? MGT_TRANSFORM_RRC : MGT_TRANSFORM_PAD_CROP,
                                d->size, d->channels);
    if (st != MGT_OK)
        return st;
    /* the recipe's additions act on the training transform */
    if (c->auto_augment != MGT_AUTO_AUGMENT_NONE && aug == MGT_AUGMENT_NONE)
        return mgt_error_set(MGT_ERR_USAGE,
                             "--auto-augment %s works after a random crop: not "
                             "with --augment none",
                             mgt_auto_augment_name(c->auto_augment));
    tt->interp = c->interpolation;
    tt->exact_decode = c->exact_decode;
    tt->auto_augment = c->auto_augment;
    tt->augmix_severity = c->augmix_severity;
    tt->ra_magnitude = c->ra_magnitude;
    tt->random_erase = c->random_erase;
    if ((st = mgt_transform_check(tt)) != MGT_OK)
        return st;
    float mean[3], stdv[3];
    if (c->mean_std_set) {
        memcpy(mean, c->mean, sizeof mean);
        memcpy(stdv, c->std, sizeof stdv);
    } else if (c->normalize_auto) {
        fprintf(r->out, "=> computing mean/std over the training images\n");
        st = mgt_data_stats(d->train_ds, d->channels, 0, c->workers, &r->abort, mean, stdv);
        if (st != MGT_OK)
            return st;
        if (d->channels == 1)
            fprintf(r->out, "=> mean %.4f std %.4f\n", mean[0], stdv[0]);
        else
            fprintf(r->out, "=> mean %.4f %.4f %.4f std %.4f %.4f %.4f\n", mean[0], mean[1],
                    mean[2], stdv[0], stdv[1], stdv[2]);
    } else {
        return MGT_OK; /* mgt_transform_init's ImageNet mean and std */
    }
    memcpy(tt->mean, mean, sizeof mean);
    memcpy(tt->std, stdv, sizeof stdv);
    memcpy(vt->mean, mean, sizeof mean);
    memcpy(vt->std, stdv, sizeof stdv);
    return MGT_OK;
}

static void loader_common(run *r, mgt_loader_options *o, mgt_device **devs)
{
    o->devices = devs;
    if (r->c->workers >= 0)
        o->workers = r->c->workers;
    o->seed = r->c->seed;
    o->bad.strict = r->c->strict_data;
    o->bad.max_bad_frac = r->c->max_bad_frac;
    o->abort = &r->abort;
    o->world_replicas = r->wn;
    o->world_first = r->wfirst;
}

static mgt_status make_val_loader(run *r, const mgt_transform *vt, mgt_device **devs)
{
    train_data *d = &r->data;
    mgt_loader_options vo;
    mgt_loader_options_init(&vo, d->val_ds, vt, r->n, d->per_dev_batch);
    loader_common(r, &vo, devs);
    vo.split = MGT_SPLIT_EXACT;
    vo.shuffle = false;
    vo.continuous = false;
    mgt_status st = mgt_loader_create(&vo, &d->val_ld);
    return st == MGT_OK ? MGT_OK : mgt_error_wrap(st, "the validation data loader");
}

static mgt_status make_loaders(run *r, const mgt_transform *tt, const mgt_transform *vt)
{
    train_data *d = &r->data;
    mgt_device *devs[MGT_MAX_DEVICES];
    for (int i = 0; i < r->n; i++)
        devs[i] = r->devs[i];
    d->train_samples = mgt_dataset_size(d->train_ds);
    d->val_samples = mgt_dataset_size(d->val_ds);
    if (r->c->evaluate) /* -e: no training loader (its threads and batches) */
        return make_val_loader(r, vt, devs);
    mgt_loader_options lo;
    mgt_loader_options_init(&lo, d->train_ds, tt, r->n, d->per_dev_batch);
    loader_common(r, &lo, devs);
    lo.mix = (mgt_mix){.mixup_alpha = r->c->mixup_alpha, .cutmix_alpha = r->c->cutmix_alpha};
    if (r->c->ra_sampler) {
        lo.split = MGT_SPLIT_RA;
        lo.ra_reps = r->c->ra_reps;
    }
    /* A last batch of one image would give batch norm one value per channel, which it cannot
       train on (PyTorch refuses it too): drop that batch, keep every other short one. */
    mgt_sampler smp;
    mgt_status st = r->c->ra_sampler
                        ? mgt_sampler_init_ra(&smp, mgt_dataset_size(d->train_ds), r->wn,
                                              r->c->ra_reps, lo.shuffle, r->c->seed)
                        : mgt_sampler_init(&smp, mgt_dataset_size(d->train_ds), r->wn, lo.split,
                                           lo.shuffle, r->c->seed);
    if (st != MGT_OK)
        return mgt_error_wrap(st, "%s", mgt_dataset_dir(d->train_ds));
    lo.drop_last_batch = mgt_sampler_count(&smp, 0) % (size_t)d->per_dev_batch == 1;
    st = mgt_loader_create(&lo, &d->train_ld);
    if (st != MGT_OK)
        return mgt_error_wrap(st, "the training data loader");
    d->train_samples = mgt_dataset_size(d->train_ds);
    d->val_samples = mgt_dataset_size(d->val_ds);
    d->steps_per_epoch = (long)mgt_loader_batches(d->train_ld, 0);
    if (r->ctl.max_steps > 0 && r->ctl.max_steps < d->steps_per_epoch)
        d->steps_per_epoch = r->ctl.max_steps;
    if (r->ctl.no_validation)
        return MGT_OK;
    return make_val_loader(r, vt, devs);
}

mgt_status train_open_data(run *r)
{
    train_data *d = &r->data;
    if (r->c->dummy) {
        open_synthetic(r);
        return MGT_OK;
    }
    mgt_scan_options so = {.progress = isatty(fileno(stderr)) ? stderr : NULL, .abort = &r->abort};
    mgt_status st = mgt_data_open(r->c->data_dir, &so, &d->train_ds, &d->val_ds);
    if (st != MGT_OK)
        return st;
    d->classes = mgt_dataset_class_count(d->train_ds);
    int w, h;
    st = mgt_dataset_probe(d->train_ds, 64, &w, &h, &d->channels);
    if (st != MGT_OK)
        return st;
    if (r->c->image_channels > 0) /* the checkpoint's (or the caller's): images converted */
        d->channels = r->c->image_channels;
    d->size = r->c->image_size > 0 ? r->c->image_size : mgt_arch_image_size(r->arch, w, h);
    st = make_transforms(r, w, h, &d->tt, &d->vt);
    if (st != MGT_OK)
        return st;
    d->val_t = d->vt;   /* what checkpoints say the model is validated with */
    if (r->c->evaluate) /* -e: the model is planned at the validation crop */
        d->size = d->vt.size;
    return make_loaders(r, &d->tt, &d->vt);
}

/* ---- replicas ---- */

/* --on-device-failure continue: the event after a step's own work, and room for the
   batch-norm statistics at a step's start. */
static mgt_status make_keep(worker *w)
{
    w->keep_step = -1;
    mgt_status st = mgt_event_create(w->d, &w->own_ev);
    if (st == MGT_OK)
        st = mgt_event_create(w->d, &w->reduced_ev);
    size_t bytes;
    mgt_model_buffers(w->model, &bytes);
    int nc;
    mgt_model_bn_counts(w->model, &nc);
    if (st == MGT_OK && bytes)
        st = mgt_buffer_alloc(w->d, bytes, &w->bn_keep);
    if (st == MGT_OK && !(w->counts_keep = calloc((size_t)(nc > 0 ? nc : 1), sizeof(int64_t))))
        st = mgt_error_set(MGT_ERR_OOM, "host memory exhausted");
    return st;
}

static mgt_status make_dummy_batch(run *r, worker *w)
{
    const train_data *d = &r->data;
    size_t nx = (size_t)d->channels * (size_t)d->size * (size_t)d->size * (size_t)d->per_dev_batch;
    size_t ny = (size_t)d->per_dev_batch;
    float *x = malloc(nx * sizeof(float));
    int32_t *y = malloc(ny * sizeof(int32_t));
    mgt_status st = MGT_OK;
    if (!x || !y)
        st = mgt_error_set(MGT_ERR_OOM, "dummy data: host memory exhausted");
    if (st == MGT_OK) {
        mgt_rng g;
        mgt_rng_init(&g, r->c->seed, 0, (uint64_t)(r->wfirst + w->dev), MGT_RNG_OTHER);
        for (size_t i = 0; i < nx; i++)
            x[i] = 2.0f * mgt_rng_uniform(&g) - 1.0f;
        for (size_t i = 0; i < ny; i++)
            y[i] = (int32_t)mgt_rng_below(&g, (uint64_t)d->classes);
        st = mgt_buffer_alloc(w->d, nx * sizeof(float), &w->dummy_x);
    }
    if (st == MGT_OK)
        st = mgt_buffer_alloc(w->d, ny * sizeof(int32_t), &w->dummy_y);
    if (st == MGT_OK)
        st = mgt_copy_h2d(w->s, mgt_buffer_ptr(w->dummy_x), x, nx * sizeof(float));
    if (st == MGT_OK)
        st = mgt_copy_h2d(w->s, mgt_buffer_ptr(w->dummy_y), y, ny * sizeof(int32_t));
    if (st == MGT_OK)
        st = mgt_stream_synchronize(w->s, &r->abort);
    free(x);
    free(y);
    return st;
}

/* The metric slots and events of a worker, and the marks that place a device fault. */
static mgt_status make_slots(run *r, worker *w)
{
    /* one more float than the slots: the gradients' sum of squares for --clip-grad-norm */
    mgt_status st = mgt_host_alloc(w->d, (SLOTS + 1) * sizeof(float), (void **)&w->host_loss);
    if (st == MGT_OK)
        st = mgt_host_alloc(w->d, SLOTS * 2 * sizeof(int32_t), (void **)&w->host_correct);
    if (st == MGT_OK)
        st = mgt_host_alloc(w->d, SLOTS * MGT_MODEL_MAX_AUX * sizeof(float), (void **)&w->host_aux);
    if (st == MGT_OK)
        st = mgt_buffer_alloc(w->d, (SLOTS + 1) * 2 * sizeof(int32_t), &w->dev_correct);
    if (st == MGT_OK) /* [0]: validation's loss sum, [1]: clipping's sum of squares */
        st = mgt_buffer_alloc(w->d, 2 * sizeof(float), &w->dev_val);
    if (st == MGT_OK && r->c->amp == MGT_PREC_FP16)
        st = mgt_buffer_alloc(w->d, sizeof(int32_t), &w->dev_nonfinite);
    if (st == MGT_OK && r->c->amp == MGT_PREC_FP16)
        st = mgt_host_alloc(w->d, sizeof(int32_t), (void **)&w->host_nonfinite);
    size_t k = (size_t)r->data.classes;
    if (st == MGT_OK && r->c->evaluate) /* -e: each batch's logits, for the confusion counts */
        st = mgt_host_alloc(w->d, (size_t)r->data.per_dev_batch * k * sizeof(float),
                            (void **)&w->host_logits);
    if (st == MGT_OK && r->c->evaluate && k <= TRAIN_CONFUSION_MAX &&
        !(w->confusion = calloc(k * k, sizeof *w->confusion)))
        st = mgt_error_set(MGT_ERR_OOM, "the confusion matrix: host memory exhausted");
    for (int k = 0; k < SLOTS && st == MGT_OK; k++) {
        st = mgt_event_create(w->d, &w->slot_ev[k]);
        for (int p = 0; p < PROF_MARKS && st == MGT_OK && r->ctl.profile; p++)
            st = mgt_event_create(w->d, &w->prof_ev[k][p]);
    }
    if (st == MGT_OK)
        st = train_marks_create(w);
    return st;
}

/* FixRes (--val-crop-size other than the training size): a twin of the replica planned for
   the validation crop, without gradients, into which the replica's weights and statistics
   are copied before each validation. Refused where the parameters depend on the input size
   (they would not be the same tensors). */
static mgt_status make_val_twin(run *r, worker *w, const mgt_model_config *train_cfg)
{
    mgt_model_config vc = *train_cfg;
    vc.image_size = r->data.val_t.size;
    vc.inference = true;
    vc.sync_bn = false;
    vc.freeze_bn = false;
    mgt_status st = mgt_model_create(&vc, w->d, &w->val_model);
    if (st != MGT_OK)
        return mgt_error_wrap(st, "--val-crop-size %d", vc.image_size);
    size_t pa, pb, ba, bb;
    mgt_model_params(w->model, &pa);
    mgt_model_params(w->val_model, &pb);
    mgt_model_buffers(w->model, &ba);
    mgt_model_buffers(w->val_model, &bb);
    int na, nb;
    const mgt_model_entry *ta = mgt_model_table(w->model, &na);
    const mgt_model_entry *tb = mgt_model_table(w->val_model, &nb);
    bool same = pa == pb && ba == bb && na == nb;
    for (int e = 0; same && e < na; e++)
        same = ta[e].offset == tb[e].offset && ta[e].numel == tb[e].numel;
    if (!same)
        return mgt_error_set(MGT_ERR_USAGE,
                             "--val-crop-size %d: %s's parameters depend on its input size (%d "
                             "in training): it cannot validate at another",
                             vc.image_size, r->c->arch, train_cfg->image_size);
    return MGT_OK;
}

static mgt_status make_worker(run *r, int i)
{
    const mgt_train_config *c = r->c;
    worker *w = &r->w[i];
    w->r = r;
    w->dev = i;
    w->d = r->devs[i];
    mgt_status st = mgt_stream_create(w->d, &w->s);
    /* torchvision's defaults: the auxiliary classifiers built (but where its builder drops
       them from pretrained weights), transform_input set where weights are loaded */
    bool pre = c->pretrained != NULL;
    mgt_model_config mc = {
        .arch = c->arch,
        .classes = r->data.classes,
        .in_channels = r->data.channels,
        .image_size = r->data.size,
        .batch = r->data.per_dev_batch,
        .zero_init_residual = c->zero_init_residual,
        .freeze_bn = c->freeze_bn,
        .amp = c->amp,
        .sync_bn = c->sync_bn,
        .no_aux_logits =
            c->aux_logits >= 0 ? c->aux_logits == 0 : pre && r->arch->pretrained_drops_aux,
        .transform_input =
            c->transform_input >= 0 ? c->transform_input == 1 : pre && r->arch->transform_input};
    if (st == MGT_OK)
        st = mgt_model_create(&mc, w->d, &w->model);
    if (st == MGT_OK && c->aux_weight >= 0)
        mgt_model_set_aux_weight(w->model, c->aux_weight);
    size_t pbytes = 0;
    if (st == MGT_OK) {
        r->params[i] = mgt_model_params(w->model, &pbytes);
        r->buffers[i] = mgt_model_buffers(w->model, NULL);
        if ((st = train_optim_create(&w->opt, w->d, w->model, c)) != MGT_OK)
            mgt_error_wrap(st, "the optimizer's state");
    }
    if (st == MGT_OK && (st = train_ema_create(r, w)) != MGT_OK)
        mgt_error_wrap(st, "--model-ema's averages");
    if (st == MGT_OK && (st = make_slots(r, w)) != MGT_OK)
        mgt_error_wrap(st, "the metric slots");
    if (st == MGT_OK && c->dummy && (st = make_dummy_batch(r, w)) != MGT_OK)
        mgt_error_wrap(st, "the synthetic batch");
    if (st == MGT_OK && r->data.val_t.size > 0 && r->data.val_t.size != r->data.size &&
        (st = make_val_twin(r, w, &mc)) != MGT_OK)
        mgt_error_wrap(st, "the validation model (--val-crop-size)");
    if (st == MGT_OK && c->continue_on_device_failure && (st = make_keep(w)) != MGT_OK)
        mgt_error_wrap(st, "--on-device-failure continue's batch-norm copy");
    if (st == MGT_OK && i == 0)
        st = mgt_model_init(w->model, w->s, c->seed);
    return st;
}

static void free_worker(worker *w)
{
    if (w->s)
        mgt_stream_synchronize(w->s, NULL);
    mgt_event_free(w->own_ev);
    mgt_event_free(w->reduced_ev);
    mgt_buffer_free(w->bn_keep);
    free(w->counts_keep);
    for (int k = 0; k < SLOTS; k++) {
        mgt_event_free(w->slot_ev[k]);
        for (int p = 0; p < PROF_MARKS; p++)
            mgt_event_free(w->prof_ev[k][p]);
    }
    mgt_buffer_free(w->dummy_x);
    mgt_buffer_free(w->dummy_y);
    mgt_buffer_free(w->dev_correct);
    mgt_buffer_free(w->dev_val);
    mgt_buffer_free(w->dev_nonfinite);
    if (w->host_nonfinite)
        mgt_host_free(w->d, w->host_nonfinite);
    if (w->host_logits)
        mgt_host_free(w->d, w->host_logits);
    free(w->confusion);
    if (w->host_loss)
        mgt_host_free(w->d, w->host_loss);
    if (w->host_aux)
        mgt_host_free(w->d, w->host_aux);
    if (w->host_correct)
        mgt_host_free(w->d, w->host_correct);
    train_marks_free(w);
    train_optim_free(&w->opt);
    train_ema_free(w);
    mgt_model_free(w->val_model);
    mgt_model_free(w->model);
    mgt_stream_free(w->s);
}

mgt_status train_make_workers(run *r)
{
    r->w = calloc((size_t)r->n, sizeof *r->w);
    r->nw = r->w ? r->n : 0;
    r->params = calloc((size_t)r->n, sizeof *r->params);
    r->buffers = calloc((size_t)r->n, sizeof *r->buffers);
    if (!r->w || !r->params || !r->buffers)
        return mgt_error_set(MGT_ERR_OOM, "trainer: host memory exhausted");
    mgt_status st = MGT_OK;
    for (int i = 0; i < r->n && st == MGT_OK; i++)
        st = make_worker(r, i);
    return st;
}

/* --sync-bn's exchange for worker w's model: every local device's numbers, in device order. */
static mgt_status worker_bn_gather(void *ctx, const double *mine, double *all, size_t n)
{
    worker *w = ctx;
    return mgt_comm_bn_gather(w->r->comm, w->dev, mine, all, n, &w->r->abort);
}

mgt_status train_make_comm(run *r)
{
    if (r->c->sync_bn && mgt_world_size(r->world) > 1)
        return mgt_error_set(MGT_ERR_UNSUPPORTED,
                             "--sync-bn: the batch-norm exchange spans one node's devices; "
                             "this run has %d nodes",
                             mgt_world_size(r->world));
    int ne = mgt_model_layer_ends(r->w[0].model, NULL, 0);
    size_t *ends = malloc((size_t)(ne > 0 ? ne : 1) * sizeof *ends);
    if (!ends)
        return mgt_error_set(MGT_ERR_OOM, "comm: host memory exhausted");
    mgt_model_layer_ends(r->w[0].model, ends, ne);
    float *grads[MGT_MAX_DEVICES];
    for (int i = 0; i < r->n; i++)
        grads[i] = mgt_model_grads(r->w[i].model, NULL);
    size_t bytes;
    mgt_model_grads(r->w[0].model, &bytes);
    mgt_comm_config cc = {.grads = grads,
                          .bytes = bytes,
                          .layer_ends = ends,
                          .n_layer_ends = ne,
                          .bucket_bytes = r->c->bucket_bytes,
                          .first_bucket_bytes = 1u << 20,
                          .algo = r->c->allreduce,
                          .world = r->world,
                          .abort = &r->abort,
                          .node_exchange = r->c->node_exchange,
                          .grad_dtype = r->c->grad_dtype,
                          .devices = r->devs,
                          .n_devices = r->n};
    mgt_status st = mgt_comm_create(r->set, &cc, &r->comm);
    if (st != MGT_OK)
        mgt_error_wrap(st, "the gradient all-reduce");
    free(ends);
    for (int i = 0; st == MGT_OK && r->c->sync_bn && i < r->n; i++) {
        mgt_bn_sync bs = {
            .gather = worker_bn_gather, .ctx = &r->w[i], .replicas = r->n, .abort = &r->abort};
        st = mgt_model_set_bn_sync(r->w[i].model, &bs);
    }
    return st;
}

/* What a worker thread stuck in a call may reach when it comes back (the run, a worker
   array): kept for the process's life, listed so that it stays reachable. */
typedef struct kept {
    void *p;
    struct kept *next;
} kept;
static kept *kept_list;
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;

void train_keep(void *p)
{
    kept *k = malloc(sizeof *k);
    if (!k)
        return; /* left unreachable, still allocated */
    pthread_mutex_lock(&kept_lock);
    *k = (kept){p, kept_list};
    kept_list = k;
    pthread_mutex_unlock(&kept_lock);
}

/* n: the workers made (the devices before one was lost) */
static void free_replicas(run *r)
{
    int n = r->nw;
    mgt_loader_free(r->data.train_ld);
    mgt_loader_free(r->data.val_ld);
    r->data.train_ld = r->data.val_ld = NULL;
    mgt_comm_free(r->comm);
    r->comm = NULL;
    bool keep = false; /* a detached worker's thread may still hold its worker and the array */
    for (int i = 0; r->w && i < n; i++) {
        if (r->w[i].detached)
            keep = true;
        else
            free_worker(&r->w[i]);
    }
    if (!keep)
        free(r->w);
    else if (r->w)
        train_keep(r->w);
    free(r->params);
    free(r->buffers);
    r->w = NULL;
    r->nw = 0;
    r->params = r->buffers = NULL;
}

void train_free_parts(run *r)
{
    free_replicas(r);
    mgt_dataset_free(r->data.train_ds);
    mgt_dataset_free(r->data.val_ds);
}

mgt_status train_remake_parts(run *r)
{
    free_replicas(r);
    mgt_status st = r->data.train_ds ? make_loaders(r, &r->data.tt, &r->data.vt) : MGT_OK;
    if (st == MGT_OK)
        st = train_make_workers(r);
    return st == MGT_OK ? train_make_comm(r) : st;
}
