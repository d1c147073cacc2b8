/* The trainer's threads: one worker per device running the phases the main thread starts
   (an epoch's training steps, a validation pass), the step itself in stages, the main
   thread's watch over a phase (stop, time limit, step timeout), and failure, which raises the
   abort flag so that every wait ends. See train_impl.h for the protocol. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/train_impl.h"

/* ---- failure ---- */

/* The steps of this phase the furthest worker has begun (first_step where none has). r->lock
   held. */
static long most_started(const run *r)
{
    long most = r->first_step;
    for (int i = 0; i < r->n; i++)
        if (r->w[i].started > most)
            most = r->w[i].started;
    return most;
}

/* The abort flag was raised without a failure on record: the data loaders raise it
   themselves on a fatal data error, and the comm threads on a failed exchange with the other
   nodes, so the cause is theirs (the workers may not have reported it yet). */
static void blame_abort(run *r)
{
    mgt_status cst = r->comm ? mgt_comm_error(r->comm) : MGT_OK;
    if (cst != MGT_OK) {
        pthread_mutex_lock(&r->lock);
        long most = most_started(r);
        pthread_mutex_unlock(&r->lock);
        train_fail(r, mgt_error_wrap(cst, "epoch %d step %ld (the all-reduce)", r->epoch,
                                     most > r->first_step ? most - 1 : most));
        return;
    }
    mgt_loader *lds[2] = {r->data.train_ld, r->data.val_ld};
    for (int i = 0; i < 2; i++) {
        mgt_status st = lds[i] ? mgt_loader_error(lds[i]) : MGT_OK;
        if (st != MGT_OK) { /* a bad image is a cause; a failed copy may be a device's */
            mgt_error_wrap(st, "epoch %d: data", r->epoch);
            if (st == MGT_ERR_DEVICE)
                train_fail(r, st);
            else
                train_fail_root(r, st);
            return;
        }
    }
    train_fail(r, mgt_error_set(MGT_ERR_ABORTED, "epoch %d: the run was aborted", r->epoch));
}

/* ---- the training step ---- */

/* Reads step k's slot (waiting for it) and reports it; a NaN loss fails the run. */
static mgt_status meter_step(worker *w, long k)
{
    run *r = w->r;
    int slot = (int)(k % SLOTS);
    mgt_status st = mgt_event_synchronize(w->slot_ev[slot], &r->abort);
    if (st != MGT_OK)
        return st;
    float loss = w->host_loss[slot];
    /* the step's time is the device's, from the previous step's end to this one's: it covers
       a wait for the host (data, enqueueing) as the host's clock would, without the host's
       lag; the host meters LAG steps behind, and at an epoch's end meters the last ones in a
       burst, whose gaps on its clock (0.000 s) were not the steps' */
    w->slot_step_s[slot] = 0;
    if (k > r->first_step) {
        float ms;
        st = mgt_event_elapsed_ms(w->slot_ev[(k - 1) % SLOTS], w->slot_ev[slot], &ms);
        if (st != MGT_OK)
            return st;
        w->slot_step_s[slot] = 1e-3 * ms;
    }
    /* the per-op profile counts from the end of the warm-up (the kernels of the next step
       that already ran are the few it misses) */
    if (r->ctl.op_profile && k - r->first_step == r->ctl.warmup_steps - 1) {
        st = mgt_device_op_profile(w->d, true);
        if (st != MGT_OK)
            return st;
    }
    if (r->ctl.profile && k - r->first_step >= r->ctl.warmup_steps) {
        float ms[PROF_MARKS - 1];
        for (int p = 0; p < PROF_MARKS - 1 && st == MGT_OK; p++)
            st = mgt_event_elapsed_ms(w->prof_ev[slot][p], w->prof_ev[slot][p + 1], &ms[p]);
        if (st != MGT_OK)
            return st;
        w->prof.data_s += w->slot_wait[slot];
        w->prof.forward_s += 1e-3 * ms[0];
        w->prof.backward_s += 1e-3 * ms[1];
        w->prof.reduce_exposed_s += 1e-3 * ms[2];
        w->prof.optimizer_s += 1e-3 * ms[3];
        w->prof.steps++;
    }
    if (!isfinite(loss)) { /* the step whose loss it is, not the one the host is at */
        st = mgt_error_set(MGT_ERR_DEVICE, "the loss is %s", isnan(loss) ? "NaN" : "infinite");
        train_fail_worker(w, st, k, false, "loss", true);
        return st;
    }
    pthread_mutex_lock(&r->lock);
    train_metrics_add(r, w, k, slot, loss);
    pthread_mutex_unlock(&r->lock);
    train_reports_flush(&r->reports);
    return MGT_OK;
}

static mgt_status grads_ready(void *ctx, mgt_stream *s, size_t ready)
{
    worker *w = ctx;
    return mgt_comm_grads_ready(w->r->comm, w->dev, s, ready);
}

/* Whether step k may begin: false once a stop has been decided below it. */
static bool begin_step(worker *w, long k)
{
    run *r = w->r;
    pthread_mutex_lock(&r->lock);
    /* while the nodes agree on a stop, a step at or past this node's proposal waits: the
       agreed step may be later (another node's devices are further on) */
    while (r->stop_world && k >= r->stop_at && !mgt_abort_is_raised(&r->abort))
        mgt_cond_wait_slice(&r->cv, &r->lock);
    bool go = k < r->stop_at && !mgt_abort_is_raised(&r->abort);
    if (go)
        w->started = k + 1;
    pthread_mutex_unlock(&r->lock);
    return go;
}

/* One step's batch on the device. */
typedef struct step_batch {
    const float *x;
    const int32_t *y;
    int n;
    double wait_s;
    const int32_t *y_b; /* the partners' labels and the weights of y (the loader's: y and 1
                             without mixup or cutmix); NULL, NULL: one-hot y */
    const float *w;
    mgt_dropout_key drop; /* the step's and these samples' dropout key */
} step_batch;

/* The end of a stage of step k (0: the step's start): with profile, its timing event; and
   for stages 1..4, the mark that places a device fault (failure.c). */
static mgt_status mark(worker *w, long k, int slot, int stage)
{
    static const char *const stages[PROF_MARKS] = {NULL, "forward", "backward",
                                                   "gradient all-reduce", "optimizer"};
    mgt_status st = w->r->ctl.profile ? mgt_event_record(w->prof_ev[slot][stage], w->s) : MGT_OK;
    if (st == MGT_OK && stages[stage])
        st = train_mark(w, k, false, stages[stage]);
    return st;
}

static mgt_status next_batch(worker *w, step_batch *b)
{
    run *r = w->r;
    if (!r->data.train_ld) {
        *b = (step_batch){mgt_buffer_ptr(w->dummy_x),
                          mgt_buffer_ptr(w->dummy_y),
                          r->data.per_dev_batch,
                          0,
                          NULL,
                          NULL,
                          {0}};
        return MGT_OK;
    }
    mgt_batch lb;
    mgt_status st = mgt_loader_next(r->data.train_ld, w->dev, w->s, &lb);
    if (st == MGT_OK)
        *b = (step_batch){lb.images, lb.labels, lb.n, lb.wait_s, lb.labels_b, lb.weights, {0}};
    return st;
}

/* --accum-steps K: the steps of an epoch go in windows of K micro-batches from its start
   (a resumed epoch's first window starts where it resumes; the epoch's last may be short).
   Gradients accumulate over a window and are reduced and applied once, at its last step, as
   DDP's no_sync does; the update divides by the micro-batches it summed, so the step is that
   of the mean loss over the window's images. */
static long window_start(const run *r, long k)
{
    long s = k - k % r->c->accum_steps;
    return s > r->first_step ? s : r->first_step;
}

static bool window_last(const run *r, long k)
{
    return (k + 1) % r->c->accum_steps == 0 || k + 1 >= r->data.steps_per_epoch;
}

/* Forward, loss and backward of one batch; the gradients accumulate in the grad arena and,
   at the last micro-batch of a window, each layer's are handed to the all-reduce as backward
   completes them. */
static mgt_status forward_backward(worker *w, long k, const step_batch *b, int32_t *correct,
                                   int slot, bool reduce, const char **where)
{
    run *r = w->r;
    *where = "forward";
    mgt_model_set_dropout_key(w->model, &b->drop);
    mgt_status st = mgt_model_forward(w->model, w->s, b->x, b->n, true, NULL);
    if (st == MGT_OK)
        st = mgt_model_loss_mixed(w->model, w->s, b->y, b->y_b, b->w, r->c->label_smoothing,
                                  correct);
    if (st == MGT_OK)
        st = mark(w, k, slot, 1);
    if (st != MGT_OK)
        return st;
    *where = "backward";
    if (r->c->amp == MGT_PREC_FP16)
        mgt_model_set_loss_scale(w->model, w->scaler.scale);
    if (reduce)
        st = mgt_comm_step_begin(r->comm, w->dev);
    if (st == MGT_OK)
        st = mgt_model_backward(w->model, w->s, reduce ? grads_ready : NULL, w);
    if (st == MGT_OK)
        st = mark(w, k, slot, 2);
    return st;
}

/* The abort flag of a wait after the all-reduce: none with --on-device-failure continue, where
   a committed update is made on every survivor whatever failed meanwhile (the wait is on the
   device's own stream alone, which no peer holds up). */
static const mgt_abort *after_commit(const run *r)
{
    return r->c->continue_on_device_failure ? NULL : &r->abort;
}

/* fp16 loss scaling, as GradScaler's step and update: an inf or NaN anywhere in the reduced
   (so on every replica the same) gradients skips the step and halves the scale; 2000 clean
   steps in a row double it. The count comes back to the host, which waits for the step's
   work here: the cost of deciding on the host (the device queue drains once per step).
   *skip says whether the update is to be left out. */
static mgt_status scaler_check(worker *w, bool *skip)
{
    run *r = w->r;
    size_t bytes;
    const float *grads = mgt_model_grads(w->model, &bytes);
    int32_t *count = mgt_buffer_ptr(w->dev_nonfinite);
    mgt_status st = mgt_nonfinite_count(w->s, count, grads, bytes / sizeof(float));
    if (st == MGT_OK)
        st = mgt_copy_d2h(w->s, w->host_nonfinite, count, sizeof(int32_t));
    if (st == MGT_OK)
        st = mgt_stream_synchronize(w->s, after_commit(r));
    if (st != MGT_OK)
        return st;
    train_scaler *sc = &w->scaler;
    *skip = *w->host_nonfinite != 0;
    if (*skip) {
        sc->scale *= MGT_SCALER_BACKOFF;
        sc->growth = 0;
        sc->skipped++;
    } else if (++sc->growth == MGT_SCALER_INTERVAL) {
        sc->scale *= MGT_SCALER_GROWTH;
        sc->growth = 0;
    }
    return MGT_OK;
}

/* --clip-grad-norm: torch.nn.utils.clip_grad_norm_ on the mean gradients. The sum over the
   replicas is the same bits on each, so every replica finds the same factor. The host reads
   the norm: one wait for the device per step, only with clipping on. */
static mgt_status clip_factor(worker *w, const float *grads, size_t floats, double mean_scale,
                              float *factor)
{
    run *r = w->r;
    float *dev = (float *)mgt_buffer_ptr(w->dev_val) + 1;
    float *host = &w->host_loss[SLOTS];
    mgt_status st = mgt_sum_squares(w->s, dev, grads, floats);
    if (st == MGT_OK)
        st = mgt_copy_d2h(w->s, host, dev, sizeof(float));
    if (st == MGT_OK)
        st = mgt_stream_synchronize(w->s, after_commit(r));
    if (st != MGT_OK)
        return st;
    *factor = mgt_clip_coef(*host, mean_scale, r->c->clip_grad_norm);
    return MGT_OK;
}

/* --on-device-failure continue: step k's update is made only once every device's all-reduce
   has completed on a sound device, so that the survivors of a failure either all make it or
   all leave it out. Each device waits first for its own work (forward and backward: a stall
   there is its own, and runs out the wait limit), then for the exchange, which waits on the
   peers: polled for twice the limit, so that a stalled peer's own wait runs out first and
   names it (a wait that runs out marks its device stalled for good), then for the others.
   Returns MGT_ERR_ABORTED when another device failed before every device got here. The host
   waits for the device once per step: the cost of knowing. */
double train_wait_limit(const mgt_train_config *c, const char **flag)
{
    if (flag)
        *flag = c->device_timeout_s > 0 ? "--device-timeout"
                : c->step_timeout_s > 0 ? "--timeout"
                                        : NULL;
    return c->device_timeout_s > 0 ? c->device_timeout_s
           : c->step_timeout_s > 0 ? c->step_timeout_s
                                   : MGT_DEVICE_WAIT_LIMIT_S;
}

static mgt_status commit_step(worker *w, long k)
{
    run *r = w->r;
    const char *flag;
    double limit = train_wait_limit(r->c, &flag);
    mgt_status st = mgt_event_synchronize(w->own_ev, &r->abort);
    if (st == MGT_OK)
        st = mgt_event_record(w->reduced_ev, w->s);
    for (double t0 = mgt_time_now(); st == MGT_OK;) {
        bool done;
        st = mgt_event_query(w->reduced_ev, &done);
        if (st != MGT_OK || done)
            break;
        if (mgt_abort_is_raised(&r->abort))
            return mgt_error_set(MGT_ERR_ABORTED, "%s: step %ld left out: another device failed",
                                 mgt_device_name(w->d), k);
        if (mgt_time_now() - t0 > 2 * limit)
            st = mgt_error_set(MGT_ERR_TIMEOUT,
                               "%s: step %ld's gradient all-reduce made no progress within %g s "
                               "(twice %s)",
                               mgt_device_name(w->d), k, 2 * limit,
                               flag ? flag : "the default wait limit");
        else
            usleep(100);
    }
    if (st != MGT_OK)
        return st;
    pthread_mutex_lock(&r->lock);
    if (++r->commit_arrived == r->n) {
        r->committed = k;
        r->commit_arrived = 0;
        pthread_cond_broadcast(&r->cv);
    }
    while (r->committed < k && !mgt_abort_is_raised(&r->abort))
        mgt_cond_wait_slice(&r->cv, &r->lock);
    bool done = r->committed >= k;
    pthread_mutex_unlock(&r->lock);
    return done ? MGT_OK
                : mgt_error_set(MGT_ERR_ABORTED, "%s: step %ld left out: another device failed",
                                mgt_device_name(w->d), k);
}

/* The summed gradients, then every replica's identical update (and the EMA's). */
static mgt_status reduce_update(worker *w, long k, int slot, const char **where)
{
    run *r = w->r;
    *where = "gradient all-reduce";
    mgt_status st = r->c->continue_on_device_failure ? mgt_event_record(w->own_ev, w->s) : MGT_OK;
    if (st == MGT_OK)
        st = mgt_comm_step_end(r->comm, w->dev, w->s, &r->abort);
    if (st == MGT_OK)
        st = mark(w, k, slot, 3);
    if (st == MGT_OK && r->c->continue_on_device_failure)
        st = commit_step(w, k);
    if (st != MGT_OK)
        return st;
    *where = "optimizer";
    float lr = mgt_lr_at(&r->lr, r->epoch, (int)k, (int)r->data.steps_per_epoch);
    size_t bytes;
    float *grads = mgt_model_grads(w->model, &bytes);
    /* DDP's mean over the devices of the world, and the window's over its micro-batches; under
       fp16 the loss was multiplied by the scale too (a power of two: dividing is exact), and
       the clipping sees the unscaled gradients, as after GradScaler.unscale_ */
    double scale = 1.0 / ((double)r->wn * (double)(k - window_start(r, k) + 1));
    if (r->c->amp == MGT_PREC_FP16) {
        bool skip = false;
        scale /= (double)w->scaler.scale;
        st = scaler_check(w, &skip);
        if (st != MGT_OK || skip)
            return st != MGT_OK ? st : mark(w, k, slot, 4);
    }
    float clip = 1.0f;
    if (r->c->clip_grad_norm > 0)
        st = clip_factor(w, grads, bytes / sizeof(float), scale, &clip);
    if (st == MGT_OK)
        st = train_optim_step(&w->opt, w->s, mgt_model_params(w->model, NULL), grads, lr,
                              (float)(scale * clip));
    if (st == MGT_OK && r->c->model_ema) {
        long updates = k / r->c->accum_steps; /* train.py's i, counted in updates */
        if (updates % r->c->model_ema_steps == 0)
            st = train_ema_update(w);
    }
    if (st == MGT_OK)
        st = mark(w, k, slot, 4);
    return st;
}

static mgt_status train_step(worker *w, long k, const char **where)
{
    run *r = w->r;
    int slot = (int)(k % SLOTS);
    step_batch b;
    *where = "loading data";
    mgt_status st = next_batch(w, &b);
    if (st != MGT_OK)
        return st;
    /* image i of this replica (world rank wfirst + dev of wn) is the sample
       k*B + rank + i*wn of the epoch's order (the sampler's layout), so the masks are those of
       any other device or node count */
    uint64_t global_batch = (uint64_t)r->data.per_dev_batch * (uint64_t)r->wn;
    b.drop = (mgt_dropout_key){
        .seed = r->c->seed,
        .step = (uint64_t)r->epoch * (uint64_t)r->data.steps_per_epoch + (uint64_t)k,
        .sample0 = (uint64_t)k * global_batch + (uint64_t)(r->wfirst + w->dev),
        .sample_stride = (uint64_t)r->wn};
    int32_t *correct = (int32_t *)mgt_buffer_ptr(w->dev_correct) + 2 * slot;
    bool reduce = window_last(r, k);
    *where = "forward";
    st = mark(w, k, slot, 0);
    if (st == MGT_OK)
        st = mgt_memset(w->s, correct, 0, 2 * sizeof(int32_t));
    if (st == MGT_OK && k == window_start(r, k) && w->bn_keep) {
        size_t bytes;
        const float *bufs = mgt_model_buffers(w->model, &bytes);
        st = mgt_copy_d2d(w->s, mgt_buffer_ptr(w->bn_keep), bufs, bytes);
        int nc;
        const int64_t *counts = mgt_model_bn_counts(w->model, &nc);
        memcpy(w->counts_keep, counts, (size_t)nc * sizeof *counts);
        w->keep_step = k;
    }
    if (st == MGT_OK && k == window_start(r, k))
        st = mgt_model_zero_grad(w->model, w->s);
    if (st == MGT_OK)
        st = forward_backward(w, k, &b, correct, slot, reduce, where);
    if (st == MGT_OK && reduce)
        st = reduce_update(w, k, slot, where);
    else if (st == MGT_OK) { /* no reduction nor update in this step: their marks now */
        st = mark(w, k, slot, 3);
        if (st == MGT_OK)
            st = mark(w, k, slot, 4);
    }
    if (st != MGT_OK)
        return st;
    *where = "metrics";
    st = mgt_copy_d2h(w->s, &w->host_loss[slot], mgt_model_loss_ptr(w->model), sizeof(float));
    int n_aux = mgt_model_aux_count(w->model);
    if (st == MGT_OK && n_aux)
        st = mgt_copy_d2h(w->s, &w->host_aux[slot * MGT_MODEL_MAX_AUX],
                          mgt_model_aux_loss_ptr(w->model), (size_t)n_aux * sizeof(float));
    if (st == MGT_OK)
        st = mgt_copy_d2h(w->s, &w->host_correct[2 * slot], correct, 2 * sizeof(int32_t));
    if (st == MGT_OK)
        st = mgt_event_record(w->slot_ev[slot], w->s);
    w->slot_k[slot] = st == MGT_OK ? k : -1;
    if (st == MGT_OK)
        st = train_mark(w, k, false, "metrics");
    w->slot_n[slot] = b.n;
    w->slot_wait[slot] = b.wait_s;
    return st;
}

void train_meter_left(run *r, const bool *lost, long upto)
{
    for (int i = 0; i < r->n; i++) {
        worker *w = &r->w[i];
        for (long k = w->metered; k < upto; k++) {
            int slot = (int)(k % SLOTS);
            if (w->slot_k[slot] != k)
                break;
            if (!lost[i]) {
                if (meter_step(w, k) != MGT_OK)
                    break;
                continue;
            }
            /* the lost device's step counts where its metrics reached the host before it
               failed (a record that ran while it was sound); no wait on it, no timing */
            bool clean = false;
            if (!mgt_event_outcome(w->slot_ev[slot], &clean) || !clean ||
                !isfinite(w->host_loss[slot]))
                break;
            w->slot_step_s[slot] = 0;
            pthread_mutex_lock(&r->lock);
            train_metrics_add(r, w, k, slot, w->host_loss[slot]);
            pthread_mutex_unlock(&r->lock);
        }
    }
}

static void train_phase(worker *w)
{
    run *r = w->r;
    long first = r->first_step;
    long k = first, at = first; /* at: the step the failing call was about */
    const char *where = "starting";
    mgt_status st = MGT_OK;
    w->scaler = r->scaler; /* set by the main thread before the phase began */
    for (int i = 0; i < SLOTS; i++)
        w->slot_k[i] = -1;
    for (; begin_step(w, k); k++) {
        if (k - first >= LAG) {
            where = "reading metrics";
            at = k - LAG;
            st = meter_step(w, at);
            if (st != MGT_OK)
                break;
        }
        at = k;
        st = train_step(w, k, &where);
        if (st != MGT_OK)
            break;
    }
    if (st == MGT_OK) {
        where = "reading metrics";
        for (at = k - LAG > first ? k - LAG : first; at < k && st == MGT_OK; at++)
            st = meter_step(w, at);
        at--;
    }
    if (st != MGT_OK) {
        train_fail_worker(w, st, at, false, where, false);
    } else if (w->dev == 0) {
        pthread_mutex_lock(&r->lock);
        r->scaler = w->scaler;
        pthread_mutex_unlock(&r->lock);
    }
}

/* ---- validation ---- */

/* -e's bookkeeping of one validation batch, after the device has finished it: the batch's
   logits (on the host) into this replica's confusion counts, its loss and hits into the run's
   totals so far, and from device 0 a progress line every --print-freq batches. */
static void val_account(worker *w, const mgt_batch *b, size_t i, size_t batches, float loss,
                        const int32_t *hits_before)
{
    run *r = w->r;
    int k = r->data.classes;
    for (int j = 0; w->confusion && j < b->n; j++) {
        const float *row = w->host_logits + (size_t)j * k;
        int best = 0;
        for (int c = 1; c < k; c++)
            if (row[c] > row[best])
                best = c;
        int y = b->labels_host[j];
        if (y >= 0 && y < k)
            w->confusion[(size_t)y * k + best]++;
    }
    pthread_mutex_lock(&r->lock);
    train_metrics *m = &r->m;
    m->val_run_loss += (double)loss * b->n;
    m->val_run_n += b->n;
    m->val_run_c1 += w->host_correct[0] - hits_before[0];
    m->val_run_c5 += w->host_correct[1] - hits_before[1];
    m->val_batches_done++;
    if (w->dev == 0 && ((long)i % r->c->print_freq == 0 || i + 1 == batches)) {
        double now = mgt_time_now(), el = now - m->val_start;
        double total = (double)batches * r->n, done = (double)m->val_batches_done;
        double n = (double)(m->val_run_n ? m->val_run_n : 1);
        char eta[32];
        long t = (long)(el / done * (total - done) + 0.5);
        snprintf(eta, sizeof eta, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60,
                 t % 60 > 0 ? t % 60 : 0);
        int width = snprintf(NULL, 0, "%zu", batches);
        fprintf(r->out,
                "Test: [%*zu/%zu]  Time %6.3f  Loss %.4e  Acc@1 %6.2f  Acc@5 %6.2f  %ld images  "
                "%.1f img/s  ETA %s\n",
                width, i, batches, el / (double)(i + 1), m->val_run_loss / n,
                100.0 * (double)m->val_run_c1 / n, 100.0 * (double)m->val_run_c5 / n, m->val_run_n,
                (double)m->val_run_n / (el > 0 ? el : 1), t < 0 ? "0:00:00" : eta);
        fflush(r->out);
    }
    pthread_mutex_unlock(&r->lock);
}

static void val_phase(worker *w)
{
    run *r = w->r;
    int32_t *correct = (int32_t *)mgt_buffer_ptr(w->dev_correct) + 2 * SLOTS;
    float *loss_sum = mgt_buffer_ptr(w->dev_val);
    size_t batches = mgt_loader_batches(r->data.val_ld, w->dev);
    /* -e waits for each batch: its logits and numbers are read as it goes */
    bool detail = r->c->evaluate;
    int k = r->data.classes;
    mgt_model *m = w->model;
    mgt_status st = MGT_OK;
    if (w->val_model) { /* FixRes: the weights and statistics into the twin at the val crop */
        size_t pb, bb;
        const float *p = mgt_model_params(w->model, &pb), *q = mgt_model_buffers(w->model, &bb);
        st = mgt_copy_d2d(w->s, mgt_model_params(w->val_model, NULL), p, pb);
        if (st == MGT_OK && bb)
            st = mgt_copy_d2d(w->s, mgt_model_buffers(w->val_model, NULL), q, bb);
        m = w->val_model;
    }
    if (st == MGT_OK)
        st = mgt_memset(w->s, correct, 0, 2 * sizeof(int32_t));
    if (st == MGT_OK)
        st = mgt_fill(w->s, loss_sum, 0.0f, 1);
    w->host_correct[0] = w->host_correct[1] = 0;
    long images = 0;
    size_t i = 0;
    for (; i < batches && st == MGT_OK; i += st == MGT_OK) {
        mgt_batch b;
        const float *logits = NULL;
        st = mgt_loader_next(r->data.val_ld, w->dev, w->s, &b);
        if (st == MGT_OK)
            st = mgt_model_forward(m, w->s, b.images, b.n, false, &logits);
        if (st == MGT_OK)
            st = mgt_model_loss(m, w->s, b.labels, 0.0f, correct);
        if (st == MGT_OK)
            st = mgt_axpy(w->s, loss_sum, (float)b.n, mgt_model_loss_ptr(m), 1);
        if (st == MGT_OK)
            st = train_mark(w, (long)i, true, "validation");
        if (st == MGT_OK)
            images += b.n;
        if (!detail || st != MGT_OK)
            continue;
        int32_t before[2] = {w->host_correct[0], w->host_correct[1]};
        float loss = 0;
        if (w->host_logits)
            st = mgt_copy_d2h(w->s, w->host_logits, logits, (size_t)b.n * k * sizeof(float));
        if (st == MGT_OK)
            st = mgt_copy_d2h(w->s, &loss, mgt_model_loss_ptr(m), sizeof loss);
        if (st == MGT_OK)
            st = mgt_copy_d2h(w->s, &w->host_correct[0], correct, 2 * sizeof(int32_t));
        if (st == MGT_OK)
            st = mgt_stream_synchronize(w->s, &r->abort);
        if (st == MGT_OK)
            val_account(w, &b, i, batches, loss, before);
    }
    if (st == MGT_OK)
        st = mgt_copy_d2h(w->s, &w->host_loss[0], loss_sum, sizeof(float));
    if (st == MGT_OK)
        st = mgt_copy_d2h(w->s, &w->host_correct[0], correct, 2 * sizeof(int32_t));
    if (st == MGT_OK)
        st = mgt_stream_synchronize(w->s, &r->abort);
    if (st != MGT_OK) {
        /* i: the batch whose call failed (batches: the totals' copy after the last) */
        train_fail_worker(w, st, (long)i, true, "validation", false);
        return;
    }
    pthread_mutex_lock(&r->lock);
    r->m.val_loss_sum += w->host_loss[0];
    r->m.val_n += images;
    r->m.val_c1 += w->host_correct[0];
    r->m.val_c5 += w->host_correct[1];
    pthread_mutex_unlock(&r->lock);
}

/* ---- the workers ---- */

static void *worker_main(void *arg)
{
    worker *w = arg;
    run *r = w->r;
    long seen = w->phase_seen;
    for (;;) {
        pthread_mutex_lock(&r->lock);
        while (r->phase == seen && !mgt_abort_is_raised(&r->abort))
            mgt_cond_wait_slice(&r->cv, &r->lock);
        if (mgt_abort_is_raised(&r->abort) || r->phase_kind == PHASE_EXIT) {
            w->left = true;
            pthread_cond_broadcast(&r->cv);
            pthread_mutex_unlock(&r->lock);
            return NULL;
        }
        seen = r->phase;
        enum train_phase kind = r->phase_kind;
        pthread_mutex_unlock(&r->lock);
        w->noticed.set = false; /* where it stands is this phase's (failure.c) */
        if (kind == PHASE_TRAIN)
            train_phase(w);
        else
            val_phase(w);
        pthread_mutex_lock(&r->lock);
        r->done_in_phase++;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->lock);
    }
}

mgt_status train_workers_start(run *r)
{
    for (int i = 0; i < r->n; i++) {
        r->w[i].phase_seen = r->phase; /* before any thread of this set runs */
        if (pthread_create(&r->w[i].thread, NULL, worker_main, &r->w[i]) != 0)
            return mgt_error_set(MGT_ERR_DEVICE, "cannot start the worker thread of device %d", i);
        r->w[i].thread_started = true;
    }
    return MGT_OK;
}

int train_workers_join(run *r)
{
    if (!r->w)
        return 0;
    /* a worker leaves at its next wait once the phase is PHASE_EXIT or the run aborted; one
       that does not within the wait limit is inside a call that does not return (a thread
       stuck in the driver): it is detached, so that the run and the process's exit go on */
    double limit = train_wait_limit(r->c, NULL), t0 = mgt_time_now();
    pthread_mutex_lock(&r->lock);
    r->phase_kind = PHASE_EXIT;
    r->phase++;
    pthread_cond_broadcast(&r->cv);
    for (;;) {
        bool all = true;
        for (int i = 0; i < r->n; i++) {
            const worker *w = &r->w[i];
            all = all && (!w->thread_started || w->thread_joined || w->detached || w->left);
        }
        if (all || mgt_time_now() - t0 > limit)
            break;
        mgt_cond_wait_slice(&r->cv, &r->lock);
    }
    int detached = 0;
    for (int i = 0; i < r->n; i++) {
        worker *w = &r->w[i];
        if (w->thread_started && !w->thread_joined && !w->detached && !w->left) {
            pthread_detach(w->thread);
            w->detached = true;
            detached++;
            /* when its call comes back, the set may be gone: what it reaches is kept */
            char why[256];
            train_stuck_text(r, why, sizeof why);
            mgt_device_strand(w->d, why);
        }
    }
    r->detached += detached;
    pthread_mutex_unlock(&r->lock);
    for (int i = 0; i < r->n; i++)
        if (r->w[i].thread_started && !r->w[i].thread_joined && !r->w[i].detached) {
            pthread_join(r->w[i].thread, NULL);
            r->w[i].thread_joined = true;
        }
    return detached;
}

void train_stuck_text(const run *r, char *out, size_t cap)
{
    const char *flag;
    double limit = train_wait_limit(r->c, &flag);
    snprintf(out, cap,
             "its worker thread has not come back from a call to the device within %s %g s: "
             "the thread is abandoned (detached, its memory kept) and the device given up",
             flag ? flag : "the default wait limit of", limit);
}

void train_workers_stop(run *r)
{
    if (!r->w)
        return;
    train_workers_join(r);
    /* after an abort the devices may still hold queued work that uses what is freed next; a
       detached worker's device is not waited on (its thread may still be inside a call) */
    for (int i = 0; i < r->n; i++)
        if (!r->w[i].detached)
            mgt_device_synchronize(r->devs[i], NULL);
}

/* ---- phases, driven by the main thread ---- */

/* Decides a stop: the steps every worker has begun will be finished, no more. r->lock held. */
static void request_stop(run *r)
{
    long most = most_started(r);
    /* a window of --accum-steps is finished, so that no summed gradient is lost */
    long k = r->c->accum_steps;
    if (most % k)
        most += k - most % k;
    if (most < r->stop_at)
        r->stop_at = most;
}

/* The step timeout: the stalled devices are those that have not reported the step being
   waited for. r->lock held; released around the failure, which takes it. */
static void time_out(run *r)
{
    char who[256] = "";
    for (int i = 0; i < r->n; i++)
        if (r->w[i].metered <= r->m.next_complete && strlen(who) < sizeof who - 40)
            snprintf(who + strlen(who), sizeof who - strlen(who), "%s%s", who[0] ? ", " : "",
                     mgt_device_name(r->w[i].d));
    long step = r->m.next_complete;
    pthread_mutex_unlock(&r->lock);
    train_fail_root(r,
                    mgt_error_set(MGT_ERR_TIMEOUT,
                                  "%s: no training step finished within --timeout %g s (epoch %d "
                                  "step %ld): the device or its data loader stalled%s",
                                  who[0] ? who : "all devices", r->c->step_timeout_s, r->epoch,
                                  step, r->nodes > 1 ? ", or another node stopped answering" : ""));
    pthread_mutex_lock(&r->lock);
}

/* --on-device-failure continue: no step finished for three times the wait limit, though no
   wait on a device ran out (each would within twice it): a worker's thread may be stuck in a
   call that does not return, which the drop finds by its not leaving (train_workers_join).
   r->lock held; released around the failure, which takes it. */
static void stuck_out(run *r)
{
    const char *flag;
    double limit = train_wait_limit(r->c, &flag);
    long step = r->m.next_complete;
    pthread_mutex_unlock(&r->lock);
    train_fail(r, mgt_error_set(MGT_ERR_TIMEOUT,
                                "no training step finished within three times %s %g s (epoch %d "
                                "step %ld), and no device's wait ran out",
                                flag ? flag : "the default wait limit of", limit, r->epoch, step));
    pthread_mutex_lock(&r->lock);
}

/* A multi-node run's watch, each slice of a phase: another node's failure ends this one
   (quietly: that node prints the line), and a stop anywhere is agreed on by all. r->lock
   held; released around a failure, which takes it. */
static void watch_world(run *r, enum train_phase kind, bool *stopping)
{
    char text[sizeof r->fail.cause];
    if (!r->fail.set && mgt_world_poll_failure(r->world, text, sizeof text)) {
        pthread_mutex_unlock(&r->lock);
        train_fail_remote(r, text);
        pthread_mutex_lock(&r->lock);
        return;
    }
    if (kind != PHASE_TRAIN)
        return;
    bool requested;
    long agreed = 0;
    bool done = mgt_world_stop_poll(r->world, &requested, &agreed);
    if (requested && !*stopping) {
        /* this node's proposal: the steps its devices have begun; they begin no more until
           the nodes agree */
        *stopping = true;
        r->stop_world = true;
        request_stop(r);
        mgt_world_stop_propose(r->world, r->stop_at);
        done = mgt_world_stop_poll(r->world, &requested, &agreed);
    }
    if (done && r->stop_world) {
        r->stop_world = false;
        r->stop_at = agreed < r->data.steps_per_epoch ? agreed : r->data.steps_per_epoch;
        pthread_cond_broadcast(&r->cv);
    }
}

bool train_run_phase(run *r, enum train_phase kind)
{
    const mgt_train_config *c = r->c;
    pthread_mutex_lock(&r->lock);
    r->phase_kind = kind;
    r->done_in_phase = 0;
    r->phase++;
    r->m.last_progress = mgt_time_now();
    pthread_cond_broadcast(&r->cv);
    bool stopping = false;
    /* a raised abort without a recorded failure (a loader's fatal error) also ends the phase:
       workers that see the flag before the phase starts never report to it */
    while (r->done_in_phase < r->n && !r->fail.set && !mgt_abort_is_raised(&r->abort)) {
        mgt_cond_wait_slice(&r->cv, &r->lock);
        double now = mgt_time_now();
        if (kind == PHASE_TRAIN && !stopping &&
            ((r->ctl.stop && atomic_load(r->ctl.stop)) ||
             (c->time_limit_s > 0 && now - r->start_s > c->time_limit_s))) {
            if (r->nodes > 1) {
                r->stop_world = true;
                request_stop(r);
                mgt_world_stop_propose(r->world, r->stop_at);
            } else {
                request_stop(r);
            }
            stopping = true;
        }
        if (r->nodes > 1)
            watch_world(r, kind, &stopping);
        if (c->step_timeout_s > 0 && kind == PHASE_TRAIN &&
            now - r->m.last_progress > c->step_timeout_s)
            time_out(r);
        else if (c->continue_on_device_failure && kind == PHASE_TRAIN && !r->fail.set &&
                 now - r->m.last_progress > 3 * train_wait_limit(c, NULL))
            stuck_out(r);
    }
    bool ok = !r->fail.set;
    bool tell = r->fail.set && !r->fail.remote && r->nodes > 1;
    char text[sizeof r->fail.cause];
    if (tell)
        train_failure_line(r, text, sizeof text);
    pthread_mutex_unlock(&r->lock);
    if (tell) /* the other nodes stop now, not at their next wait's timeout */
        mgt_world_notify_failure(r->world, text);
    if (ok && mgt_abort_is_raised(&r->abort)) {
        blame_abort(r);
        ok = false;
    }
    train_reports_flush(&r->reports);
    return ok;
}
