/* The multi-device trainer: worker threads, the step, metrics, validation, checkpoints,
 * resume, and aborting every thread when one fails.
 *
 * Threads. The main thread prepares data, replicas and communication, then drives phases
 * (an epoch's training, a validation) by bumping a phase counter that the workers wait on;
 * while a phase runs it only watches: the stop request, the time limit, the step timeout.
 * Worker i owns replica i, its streams and its optimizer state, and runs every step of the
 * phase. Any failure goes through run_fail(): the first one's text is kept, the abort flag
 * is raised, and every wait (loader, all-reduce, device, phase) leaves soon after.
 *
 * Metrics without stalls. A step's loss and top-1/top-5 counts are copied to pinned host
 * slots on the device's stream; the worker reads step k's slot at the start of step k+2,
 * after waiting for its event, so the device keeps two steps queued while the host still
 * learns every loss (and stops on a NaN within two steps). Each worker adds the step's
 * numbers to a shared per-step accumulator; the worker that completes a step (the last
 * device to report it) folds it into the epoch's totals, in step order, and prints the
 * progress line when the step is a multiple of --print-freq.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "mgt/comm.h"
#include "mgt/data.h"
#include "mgt/nn.h"
#include "mgt/rng.h"
#include "mgt/safetensors.h"
#include "mgt/train.h"

#define LAG 2        /* steps a worker's host runs ahead of reading their metrics */
#define SLOTS 4      /* metric slots per worker (> LAG) */
#define STEP_RING 16 /* per-step accumulators shared by the workers */

typedef struct step_acc {
    double loss_sum; /* sum over devices of loss * n */
    long n, c1, c5;
    double data_s; /* the slowest device's wait for this step's batch */
    int reported;  /* devices that added to it */
} step_acc;

typedef struct run run;

typedef struct worker {
    run *r;
    int dev;
    pthread_t thread;
    mgt_device *d;
    mgt_stream *s;
    mgt_model *model;
    mgt_sgd *sgd;
    /* metrics */
    float *host_loss;        /* pinned [SLOTS] */
    int32_t *host_correct;   /* pinned [SLOTS][2] */
    mgt_buffer *dev_correct; /* [SLOTS][2] counters on the device, and [2] for validation */
    mgt_buffer *dev_val;     /* [1] float: validation loss sum */
    mgt_event *slot_ev[SLOTS];
    mgt_event *prof_ev[SLOTS][5]; /* with profile: step start, forward, backward, reduce, opt */
    mgt_step_profile prof;
    int slot_n[SLOTS];
    double slot_wait[SLOTS];
    /* dummy data */
    mgt_buffer *dummy_x, *dummy_y;
    long started; /* steps begun in this phase, under r->lock */
    long metered; /* steps whose metrics this worker has read, under r->lock */
} worker;

struct run {
    const mgt_train_config *c;
    mgt_devset *set;
    int n;
    FILE *out;
    FILE *log;
    worker *w;
    mgt_comm *comm;
    float **params, **buffers, **momenta; /* per device, for broadcasts */
    /* data */
    mgt_dataset *train_ds, *val_ds;
    mgt_loader *train_ld, *val_ld;
    int classes, channels, size;
    int per_dev_batch;
    size_t train_samples, val_samples;
    long steps_per_epoch; /* training batches per device this run takes per epoch */
    /* the phase protocol */
    pthread_mutex_t lock;
    pthread_cond_t cv;
    enum { PHASE_TRAIN, PHASE_VAL, PHASE_EXIT } phase_kind;
    long phase;        /* bumped by main to start a phase */
    int done_in_phase; /* workers finished with the current phase */
    int epoch;
    long first_step; /* the epoch's first step (resume mid-epoch) */
    long stop_at;    /* steps of the epoch to run (lowered by a stop) */
    /* failure */
    mgt_abort abort;
    bool failed;
    mgt_status fail_status;
    char fail_text[768];
    /* metrics of the current epoch (under lock) */
    step_acc ring[STEP_RING];
    long next_complete; /* the next step to complete */
    double ep_loss_sum;
    long ep_n, ep_c1, ep_c5;
    double ep_data_s;
    double ep_start, last_progress, last_complete;
    double timed_start;
    long timed_n, timed_steps;
    /* validation totals */
    double val_loss_sum;
    long val_n, val_c1, val_c5;
    /* results */
    double best_acc1;
    mgt_train_result *res;
};

/* ---- failure ---- */

static void run_fail(run *r, mgt_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void run_fail(run *r, mgt_status st, const char *fmt, ...)
{
    pthread_mutex_lock(&r->lock);
    if (!r->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->fail_text, sizeof r->fail_text, fmt, ap);
        va_end(ap);
        r->failed = true;
        r->fail_status = st;
    }
    pthread_mutex_unlock(&r->lock);
    mgt_abort_raise(&r->abort);
    pthread_mutex_lock(&r->lock);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->lock);
}

/* A worker's failure: the device, where it was, and the cause. An abort caused by another
   thread's failure is not a cause of its own. */
static void worker_fail(worker *w, mgt_status st, const char *where)
{
    if (st == MGT_ERR_ABORTED && mgt_abort_is_raised(&w->r->abort))
        return;
    run_fail(w->r, st, "%s: %s: %s", mgt_device_name(w->d), where, mgt_error_last());
}

/* The abort flag was raised without a failure on record: the data loaders raise it
   themselves on a fatal data error, so the cause is theirs. */
static void blame_abort(run *r)
{
    mgt_loader *lds[2] = {r->train_ld, r->val_ld};
    for (int i = 0; i < 2; i++) {
        mgt_status st = lds[i] ? mgt_loader_error(lds[i]) : MGT_OK;
        if (st != MGT_OK) {
            run_fail(r, st, "epoch %d: data: %s", r->epoch, mgt_error_last());
            return;
        }
    }
    run_fail(r, MGT_ERR_ABORTED, "epoch %d: the run was aborted", r->epoch);
}

/* ---- output ---- */

static void log_json(run *r, cJSON *obj)
{
    if (r->log) {
        char *s = cJSON_PrintUnformatted(obj);
        if (s) {
            fprintf(r->log, "%s\n", s);
            fflush(r->log);
            free(s);
        }
    }
    cJSON_Delete(obj);
}

static void format_eta(double s, char *buf, size_t cap)
{
    long t = (long)(s + 0.5);
    snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
}

/* Folds completed step k into the epoch totals and prints its line when due. r->lock held. */
static void complete_step(run *r, long k, const step_acc *a)
{
    const mgt_train_config *c = r->c;
    double now = mgt_time_now();
    r->ep_loss_sum += a->loss_sum;
    r->ep_n += a->n;
    r->ep_c1 += a->c1;
    r->ep_c5 += a->c5;
    r->ep_data_s += a->data_s;
    double step_now = now - r->last_complete;
    r->last_complete = now;
    r->last_progress = now;
    long done = k - r->first_step + 1;
    if (done == c->warmup_steps) {
        r->timed_start = now;
    } else if (done > c->warmup_steps) {
        r->timed_n += a->n;
        r->timed_steps++;
    }
    bool last = k + 1 == r->stop_at;
    if (k % c->print_freq != 0 && !last)
        return;
    double elapsed = now - r->ep_start;
    double step_s = elapsed / (double)done;
    double img_s = (double)r->ep_n / elapsed;
    double eta = step_s * (double)(r->stop_at - k - 1);
    char eta_s[32];
    format_eta(eta, eta_s, sizeof eta_s);
    float lr = mgt_lr_at(&c->lr, r->epoch, (int)k, (int)r->steps_per_epoch);
    double loss = a->loss_sum / (double)a->n, loss_avg = r->ep_loss_sum / (double)r->ep_n;
    double acc1 = 100.0 * (double)a->c1 / (double)a->n, acc5 = 100.0 * (double)a->c5 / (double)a->n;
    double acc1_avg = 100.0 * (double)r->ep_c1 / (double)r->ep_n;
    double acc5_avg = 100.0 * (double)r->ep_c5 / (double)r->ep_n;
    int width = snprintf(NULL, 0, "%ld", r->steps_per_epoch);
    fprintf(r->out,
            "Epoch: [%d][%*ld/%ld]  Time %6.3f (%6.3f)  Data %6.3f (%6.3f)  Loss %.4e (%.4e)  "
            "Acc@1 %6.2f (%6.2f)  Acc@5 %6.2f (%6.2f)  lr %.4g  %.1f img/s  ETA %s\n",
            r->epoch, width, k, r->steps_per_epoch, step_now, step_s, a->data_s,
            r->ep_data_s / (double)done, loss, loss_avg, acc1, acc1_avg, acc5, acc5_avg, lr, img_s,
            eta_s);
    fflush(r->out);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "train");
    cJSON_AddNumberToObject(o, "epoch", r->epoch);
    cJSON_AddNumberToObject(o, "step", (double)k);
    cJSON_AddNumberToObject(o, "steps", (double)r->steps_per_epoch);
    cJSON_AddNumberToObject(o, "loss", loss);
    cJSON_AddNumberToObject(o, "loss_avg", loss_avg);
    cJSON_AddNumberToObject(o, "acc1", acc1);
    cJSON_AddNumberToObject(o, "acc5", acc5);
    cJSON_AddNumberToObject(o, "acc1_avg", acc1_avg);
    cJSON_AddNumberToObject(o, "acc5_avg", acc5_avg);
    cJSON_AddNumberToObject(o, "lr", lr);
    cJSON_AddNumberToObject(o, "images_per_s", img_s);
    cJSON_AddNumberToObject(o, "step_s", step_s);
    cJSON_AddNumberToObject(o, "data_s", a->data_s);
    log_json(r, o);
}

/* Reads step k's slot (waiting for it) and reports it; NaN losses fail the run. */
static mgt_status meter_step(worker *w, long k)
{
    run *r = w->r;
    int slot = (int)(k % SLOTS);
    mgt_status st = mgt_event_synchronize(w->slot_ev[slot], &r->abort);
    if (st != MGT_OK)
        return st;
    float loss = w->host_loss[slot];
    int n = w->slot_n[slot];
    if (r->c->profile && k - r->first_step >= r->c->warmup_steps) {
        float ms[4];
        for (int p = 0; p < 4 && st == MGT_OK; p++)
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
    if (!isfinite(loss))
        return mgt_error_set(MGT_ERR_DEVICE, "the loss is %s at epoch %d step %ld",
                             isnan(loss) ? "NaN" : "infinite", r->epoch, k);
    pthread_mutex_lock(&r->lock);
    w->metered = k + 1;
    step_acc *a = &r->ring[k % STEP_RING];
    a->loss_sum += (double)loss * n;
    a->n += n;
    a->c1 += w->host_correct[2 * slot];
    a->c5 += w->host_correct[2 * slot + 1];
    if (w->slot_wait[slot] > a->data_s)
        a->data_s = w->slot_wait[slot];
    if (++a->reported == r->n) {
        /* steps complete in order: every device reports k before k+1 */
        step_acc done = *a;
        memset(a, 0, sizeof *a);
        r->next_complete = k + 1;
        complete_step(r, k, &done);
    }
    pthread_mutex_unlock(&r->lock);
    return MGT_OK;
}

/* ---- the step ---- */

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
    bool go = k < r->stop_at;
    if (go)
        w->started = k + 1;
    pthread_mutex_unlock(&r->lock);
    return go;
}

static mgt_status train_step(worker *w, long k, const char **where)
{
    run *r = w->r;
    const mgt_train_config *c = r->c;
    int slot = (int)(k % SLOTS);
    const float *x;
    const int32_t *y;
    int n;
    double wait = 0;
    mgt_status st;
    *where = "loading data";
    if (r->train_ld) {
        mgt_batch b;
        st = mgt_loader_next(r->train_ld, w->dev, w->s, &b);
        if (st != MGT_OK)
            return st;
        x = b.images;
        y = b.labels;
        n = b.n;
        wait = b.wait_s;
    } else {
        x = mgt_buffer_ptr(w->dummy_x);
        y = mgt_buffer_ptr(w->dummy_y);
        n = r->per_dev_batch;
    }
    int32_t *correct = (int32_t *)mgt_buffer_ptr(w->dev_correct) + 2 * slot;
    mgt_event **pe = w->prof_ev[slot];
    *where = "forward";
    st = c->profile ? mgt_event_record(pe[0], w->s) : MGT_OK;
    if (st == MGT_OK)
        st = mgt_memset(w->s, correct, 0, 2 * sizeof(int32_t));
    if (st == MGT_OK)
        st = mgt_model_zero_grad(w->model, w->s);
    if (st == MGT_OK)
        st = mgt_model_forward(w->model, w->s, x, n, true, NULL);
    if (st == MGT_OK)
        st = mgt_model_loss(w->model, w->s, y, c->label_smoothing, correct);
    if (st == MGT_OK && c->profile)
        st = mgt_event_record(pe[1], w->s);
    if (st != MGT_OK)
        return st;
    *where = "backward";
    st = mgt_comm_step_begin(r->comm, w->dev);
    if (st == MGT_OK)
        st = mgt_model_backward(w->model, w->s, grads_ready, w);
    if (st == MGT_OK && c->profile)
        st = mgt_event_record(pe[2], w->s);
    if (st != MGT_OK)
        return st;
    *where = "gradient all-reduce";
    st = mgt_comm_step_end(r->comm, w->dev, w->s, &r->abort);
    if (st == MGT_OK && c->profile)
        st = mgt_event_record(pe[3], w->s);
    if (st != MGT_OK)
        return st;
    *where = "optimizer";
    size_t pbytes;
    float *params = mgt_model_params(w->model, &pbytes);
    float lr = mgt_lr_at(&c->lr, r->epoch, (int)k, (int)r->steps_per_epoch);
    st =
        mgt_sgd_step(w->sgd, w->s, params, mgt_model_grads(w->model, NULL), lr, 1.0f / (float)r->n);
    if (st == MGT_OK && c->profile)
        st = mgt_event_record(pe[4], w->s);
    if (st != MGT_OK)
        return st;
    *where = "metrics";
    st = mgt_copy_d2h(w->s, &w->host_loss[slot], mgt_model_loss_ptr(w->model), sizeof(float));
    if (st == MGT_OK)
        st = mgt_copy_d2h(w->s, &w->host_correct[2 * slot], correct, 2 * sizeof(int32_t));
    if (st == MGT_OK)
        st = mgt_event_record(w->slot_ev[slot], w->s);
    w->slot_n[slot] = n;
    w->slot_wait[slot] = wait;
    return st;
}

static void train_phase(worker *w)
{
    run *r = w->r;
    long first = r->first_step;
    long k = first;
    const char *where = "starting";
    mgt_status st = MGT_OK;
    for (; begin_step(w, k); k++) {
        if (k - first >= LAG) {
            where = "reading metrics";
            st = meter_step(w, k - LAG);
            if (st != MGT_OK)
                break;
        }
        st = train_step(w, k, &where);
        if (st != MGT_OK)
            break;
    }
    if (st == MGT_OK) {
        where = "reading metrics";
        for (long j = k - LAG > first ? k - LAG : first; j < k && st == MGT_OK; j++)
            st = meter_step(w, j);
    }
    if (st != MGT_OK) {
        char at[96];
        snprintf(at, sizeof at, "epoch %d step %ld (%s)", r->epoch, k, where);
        worker_fail(w, st, at);
    }
}

static void val_phase(worker *w)
{
    run *r = w->r;
    int32_t *correct = (int32_t *)mgt_buffer_ptr(w->dev_correct) + 2 * SLOTS;
    float *loss_sum = mgt_buffer_ptr(w->dev_val);
    size_t batches = mgt_loader_batches(r->val_ld, w->dev);
    mgt_status st = mgt_memset(w->s, correct, 0, 2 * sizeof(int32_t));
    if (st == MGT_OK)
        st = mgt_fill(w->s, loss_sum, 0.0f, 1);
    long images = 0;
    size_t i = 0;
    for (; i < batches && st == MGT_OK; i++) {
        mgt_batch b;
        st = mgt_loader_next(r->val_ld, w->dev, w->s, &b);
        if (st == MGT_OK)
            st = mgt_model_forward(w->model, w->s, b.images, b.n, false, NULL);
        if (st == MGT_OK)
            st = mgt_model_loss(w->model, w->s, b.labels, 0.0f, correct);
        if (st == MGT_OK)
            st = mgt_axpy(w->s, loss_sum, (float)b.n, mgt_model_loss_ptr(w->model), 1);
        images += b.n;
    }
    float host_loss = 0;
    int32_t host_c[2] = {0, 0};
    if (st == MGT_OK)
        st = mgt_copy_d2h(w->s, &w->host_loss[0], loss_sum, sizeof(float));
    if (st == MGT_OK)
        st = mgt_copy_d2h(w->s, &w->host_correct[0], correct, 2 * sizeof(int32_t));
    if (st == MGT_OK)
        st = mgt_stream_synchronize(w->s, &r->abort);
    if (st != MGT_OK) {
        char at[96];
        snprintf(at, sizeof at, "validation of epoch %d, batch %zu", r->epoch, i);
        worker_fail(w, st, at);
        return;
    }
    host_loss = w->host_loss[0];
    host_c[0] = w->host_correct[0];
    host_c[1] = w->host_correct[1];
    pthread_mutex_lock(&r->lock);
    r->val_loss_sum += host_loss;
    r->val_n += images;
    r->val_c1 += host_c[0];
    r->val_c5 += host_c[1];
    pthread_mutex_unlock(&r->lock);
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    run *r = w->r;
    long seen = 0;
    for (;;) {
        pthread_mutex_lock(&r->lock);
        while (r->phase == seen && !mgt_abort_is_raised(&r->abort))
            mgt_cond_wait_slice(&r->cv, &r->lock);
        if (mgt_abort_is_raised(&r->abort) || r->phase_kind == PHASE_EXIT) {
            pthread_mutex_unlock(&r->lock);
            return NULL;
        }
        seen = r->phase;
        int kind = r->phase_kind;
        pthread_mutex_unlock(&r->lock);
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

/* ---- phases, driven by the main thread ---- */

/* Decides a stop: the steps every worker has begun will be finished, no more. */
static void request_stop(run *r)
{
    pthread_mutex_lock(&r->lock);
    long most = r->first_step;
    for (int i = 0; i < r->n; i++)
        if (r->w[i].started > most)
            most = r->w[i].started;
    if (most < r->stop_at)
        r->stop_at = most;
    pthread_mutex_unlock(&r->lock);
}

/* Starts a phase and watches it to its end: the stop request and time limit (training only),
   the step timeout. Returns false when the run failed. */
static bool run_phase(run *r, int kind, double run_start)
{
    const mgt_train_config *c = r->c;
    pthread_mutex_lock(&r->lock);
    r->phase_kind = kind;
    r->done_in_phase = 0;
    r->phase++;
    r->last_progress = mgt_time_now();
    pthread_cond_broadcast(&r->cv);
    bool stopping = false;
    /* a raised abort without a recorded failure (a loader's fatal error) also ends the phase:
       workers that see the flag before the phase starts never report to it */
    while (r->done_in_phase < r->n && !r->failed && !mgt_abort_is_raised(&r->abort)) {
        mgt_cond_wait_slice(&r->cv, &r->lock);
        double now = mgt_time_now();
        if (kind == PHASE_TRAIN && !stopping &&
            ((c->stop && atomic_load(c->stop)) ||
             (c->time_limit_s > 0 && now - run_start > c->time_limit_s))) {
            stopping = true;
            pthread_mutex_unlock(&r->lock);
            request_stop(r);
            pthread_mutex_lock(&r->lock);
        }
        if (c->step_timeout_s > 0 && kind == PHASE_TRAIN &&
            now - r->last_progress > c->step_timeout_s) {
            /* the stalled devices are those that have not reported the step being waited for */
            char who[256] = "";
            for (int i = 0; i < r->n; i++)
                if (r->w[i].metered <= r->next_complete && strlen(who) < sizeof who - 40)
                    snprintf(who + strlen(who), sizeof who - strlen(who), "%s%s",
                             who[0] ? ", " : "", mgt_device_name(r->w[i].d));
            long step = r->next_complete;
            pthread_mutex_unlock(&r->lock);
            run_fail(r, MGT_ERR_TIMEOUT,
                     "%s: no training step finished within --timeout %g s (epoch %d step %ld): "
                     "the device or its data loader stalled",
                     who[0] ? who : "all devices", c->step_timeout_s, r->epoch, step);
            pthread_mutex_lock(&r->lock);
        }
    }
    bool ok = !r->failed;
    pthread_mutex_unlock(&r->lock);
    if (ok && mgt_abort_is_raised(&r->abort)) {
        blame_abort(r);
        ok = false;
    }
    return ok;
}

/* Replica 0's parameters, BN statistics (and momentum) to every device. */
static mgt_status broadcast_state(run *r, bool params, bool momentum)
{
    if (r->n == 1)
        return MGT_OK;
    mgt_stream *streams[MGT_MAX_DEVICES];
    for (int i = 0; i < r->n; i++)
        streams[i] = r->w[i].s;
    size_t pb, bb, mb = 0;
    mgt_model_params(r->w[0].model, &pb);
    mgt_model_buffers(r->w[0].model, &bb);
    mgt_status st = MGT_OK;
    if (params)
        st = mgt_comm_broadcast(r->comm, streams, r->params, pb, 0);
    if (st == MGT_OK)
        st = mgt_comm_broadcast(r->comm, streams, r->buffers, bb, 0);
    if (st == MGT_OK && momentum && r->momenta[0]) {
        mgt_sgd_momentum(r->w[0].sgd, &mb);
        st = mgt_comm_broadcast(r->comm, streams, r->momenta, mb * sizeof(float), 0);
    }
    int nbn;
    int64_t *counts0 = mgt_model_bn_counts(r->w[0].model, &nbn);
    for (int i = 1; i < r->n; i++) {
        int m;
        memcpy(mgt_model_bn_counts(r->w[i].model, &m), counts0, (size_t)nbn * sizeof *counts0);
        if (momentum)
            mgt_sgd_set_started(r->w[i].sgd, mgt_sgd_started(r->w[0].sgd));
    }
    for (int i = 0; i < r->n && st == MGT_OK; i++)
        st = mgt_stream_synchronize(streams[i], &r->abort);
    return st;
}

/* Every replica's parameters must equal replica 0's, to the bit: each applies the same update
   to the same weights from the same summed gradients. A difference means a reduction or
   broadcast went wrong, and training on would silently average different models. */
static mgt_status check_replicas(run *r)
{
    if (r->n == 1)
        return MGT_OK;
    size_t bytes;
    float *p0 = mgt_model_params(r->w[0].model, &bytes);
    char *a = malloc(bytes), *b = malloc(bytes);
    mgt_status st = a && b ? MGT_OK : mgt_error_set(MGT_ERR_OOM, "host memory exhausted");
    if (st == MGT_OK)
        st = mgt_copy_d2h(r->w[0].s, a, p0, bytes);
    if (st == MGT_OK)
        st = mgt_stream_synchronize(r->w[0].s, &r->abort);
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
    return st;
}

/* ---- checkpoints ---- */

static mgt_status save_checkpoint(run *r, int next_epoch, long next_step, bool is_best)
{
    const mgt_train_config *c = r->c;
    if (!c->checkpoint_dir)
        return MGT_OK;
    if (mkdir(c->checkpoint_dir, 0777) != 0 && errno != EEXIST)
        return mgt_error_set(MGT_ERR_IO, "--checkpoint-dir %s: %s", c->checkpoint_dir,
                             strerror(errno));
    worker *w0 = &r->w[0];
    mgt_st_writer *wr = NULL;
    void *staging = NULL;
    float *mom_host = NULL;
    mgt_status st = mgt_st_writer_create(&wr);
    if (st == MGT_OK)
        st = mgt_model_add_to_writer(w0->model, w0->s, wr, &staging);
    size_t mfloats = 0;
    float *mom = w0->sgd ? mgt_sgd_momentum(w0->sgd, &mfloats) : NULL;
    if (st == MGT_OK && mom && mgt_sgd_started(w0->sgd)) {
        mom_host = malloc(mfloats * sizeof(float));
        if (!mom_host)
            st = mgt_error_set(MGT_ERR_OOM, "checkpoint: host memory exhausted");
        if (st == MGT_OK)
            st = mgt_copy_d2h(w0->s, mom_host, mom, mfloats * sizeof(float));
        if (st == MGT_OK)
            st = mgt_stream_synchronize(w0->s, &r->abort);
        int64_t shape[1] = {(int64_t)mfloats};
        if (st == MGT_OK)
            st = mgt_st_writer_add(wr, "optimizer.momentum_buffer", MGT_ST_F32, 1, shape, mom_host);
    }
    char buf[160];
    struct {
        const char *key;
        double v;
        const char *fmt;
    } meta[] = {
        {"epoch", next_epoch, "%.0f"},         {"step", (double)next_step, "%.0f"},
        {"best_acc1", r->best_acc1, "%.6f"},   {"seed", (double)c->seed, "%.0f"},
        {"batch_size", c->batch_size, "%.0f"}, {"devices", r->n, "%.0f"},
    };
    for (size_t i = 0; i < sizeof meta / sizeof *meta && st == MGT_OK; i++) {
        snprintf(buf, sizeof buf, meta[i].fmt, meta[i].v);
        st = mgt_st_writer_set_metadata(wr, meta[i].key, buf);
    }
    if (st == MGT_OK)
        st = mgt_st_writer_set_metadata(wr, "format", "mgtrain checkpoint 1");
    if (st == MGT_OK) {
        snprintf(buf, sizeof buf, "%s lr %g step %d gamma %g epochs %d warmup %g",
                 c->lr.kind == MGT_LR_STEP ? "step" : "cosine", c->lr.lr, c->lr.step_epochs,
                 c->lr.gamma, c->lr.epochs, c->lr.warmup_epochs);
        st = mgt_st_writer_set_metadata(wr, "lr_schedule", buf);
    }
    if (st == MGT_OK) {
        /* where the sampler stands: the epoch's shuffle is seed + epoch, and `step` batches of
           every shard are done */
        snprintf(buf, sizeof buf, "epoch %d batch %ld of %ld", next_epoch, next_step,
                 r->steps_per_epoch);
        st = mgt_st_writer_set_metadata(wr, "sampler", buf);
    }
    char path[512];
    snprintf(path, sizeof path, "%s/checkpoint.safetensors", c->checkpoint_dir);
    if (st == MGT_OK)
        st = mgt_st_writer_save(wr, path);
    if (st == MGT_OK && is_best) {
        char best[512];
        snprintf(best, sizeof best, "%s/model_best.safetensors", c->checkpoint_dir);
        st = mgt_st_writer_save(wr, best);
    }
    if (st == MGT_OK)
        snprintf(r->res->checkpoint, sizeof r->res->checkpoint, "%s", path);
    mgt_st_writer_free(wr);
    free(staging);
    free(mom_host);
    return st;
}

static long meta_long(const mgt_st_file *f, const char *key, long fallback)
{
    const char *v = mgt_st_metadata_get(f, key);
    if (!v)
        return fallback;
    char *end;
    long x = strtol(v, &end, 10);
    return *end ? fallback : x;
}

/* Loads a checkpoint into replica 0 (broadcast later): weights, momentum, where to go on. */
static mgt_status load_checkpoint(run *r, const char *path, int *epoch, long *step)
{
    mgt_st_file *f = NULL;
    mgt_status st = mgt_st_open(path, &f);
    if (st != MGT_OK)
        return st;
    worker *w0 = &r->w[0];
    mgt_model_load_options lo = {.allow_unexpected = true};
    st = mgt_model_load(w0->model, w0->s, f, &lo, NULL);
    if (st != MGT_OK) {
        mgt_st_close(f);
        return mgt_error_wrap(st, "--resume %s", path);
    }
    size_t mfloats = 0;
    float *mom = w0->sgd ? mgt_sgd_momentum(w0->sgd, &mfloats) : NULL;
    int mi = mgt_st_find(f, "optimizer.momentum_buffer");
    if (mom && mi >= 0) {
        if (mgt_st_tensor_dtype(f, mi) != MGT_ST_F32 ||
            mgt_st_tensor_bytes(f, mi) != mfloats * sizeof(float)) {
            mgt_st_close(f);
            return mgt_error_set(MGT_ERR_INVALID,
                                 "--resume %s: optimizer.momentum_buffer does not fit this model "
                                 "(%zu bytes, expected %zu F32)",
                                 path, mgt_st_tensor_bytes(f, mi), mfloats * sizeof(float));
        }
        st = mgt_copy_h2d(w0->s, mom, mgt_st_tensor_data(f, mi), mfloats * sizeof(float));
        if (st == MGT_OK)
            st = mgt_stream_synchronize(w0->s, &r->abort);
        if (st == MGT_OK)
            mgt_sgd_set_started(w0->sgd, true);
    }
    *epoch = (int)meta_long(f, "epoch", 0);
    *step = meta_long(f, "step", 0);
    long old_batch = meta_long(f, "batch_size", 0), old_devices = meta_long(f, "devices", 0);
    int batch = r->per_dev_batch * r->n;
    if (old_batch > 0 && old_batch != batch) {
        fprintf(r->out,
                "=> warning: the checkpoint was trained with a global batch of %ld "
                "(%ld devices), this run uses %d (%d devices)\n",
                old_batch, old_devices, batch, r->n);
        /* A global step takes the next `batch` images of the epoch's one permutation, whatever
           the device count, so the epoch goes on from the same image: the saved step's
           images, counted in this run's batches (an image of a cut batch is seen twice,
           none is skipped). */
        if (*step > 0) {
            long images = *step * old_batch, now = images / batch;
            fprintf(r->out,
                    "=> the epoch goes on from image %ld: step %ld of %d-image steps "
                    "(saved: step %ld of %ld)\n",
                    now * batch, now, batch, *step, old_batch);
            *step = now;
        }
    }
    const char *best = mgt_st_metadata_get(f, "best_acc1");
    if (best)
        r->best_acc1 = strtod(best, NULL);
    mgt_st_close(f);
    return st;
}

/* ---- set-up ---- */

static bool is_cifar_arch(const char *arch)
{
    static const char *const cifar[] = {"resnet20", "resnet32", "resnet44", "resnet56",
                                        "resnet110"};
    for (size_t i = 0; i < sizeof cifar / sizeof *cifar; i++)
        if (strcmp(arch, cifar[i]) == 0)
            return true;
    return false;
}

void mgt_train_config_defaults(mgt_train_config *c)
{
    memset(c, 0, sizeof *c);
    c->arch = "resnet18";
    c->workers = -1;
    c->epochs = 90;
    c->start_epoch = -1;
    c->batch_size = 256;
    c->lr = (mgt_lr_config){.lr = 0.1f, .kind = MGT_LR_STEP, .step_epochs = 30, .gamma = 0.1f};
    c->momentum = 0.9f;
    c->weight_decay = 1e-4f;
    c->print_freq = 10;
    c->bucket_bytes = 25u << 20;
    c->max_bad_frac = 0.01;
    c->dummy_steps = 100;
}

static mgt_status open_data(run *r)
{
    const mgt_train_config *c = r->c;
    bool cifar = is_cifar_arch(c->arch);
    if (c->dummy) {
        r->classes = c->dummy_classes > 0 ? c->dummy_classes : cifar ? 10 : 1000;
        r->channels = c->dummy_channels > 0 ? c->dummy_channels : 3;
        r->size = c->image_size > 0 ? c->image_size : cifar ? 32 : 224;
        r->train_samples = (size_t)c->dummy_steps * (size_t)r->per_dev_batch * (size_t)r->n;
        r->val_samples = 0;
        r->steps_per_epoch = c->dummy_steps;
        return MGT_OK;
    }
    mgt_scan_options so = {.progress = isatty(fileno(stderr)) ? stderr : NULL, .abort = &r->abort};
    mgt_status st = mgt_imagefolder_open(c->data_dir, &so, &r->train_ds, &r->val_ds);
    if (st != MGT_OK)
        return st;
    r->classes = mgt_dataset_class_count(r->train_ds);
    int w, h;
    st = mgt_dataset_probe(r->train_ds, 64, &w, &h, &r->channels);
    if (st != MGT_OK)
        return st;
    r->size = c->image_size > 0 ? c->image_size : cifar ? (w < h ? w : h) : 224;
    mgt_augment aug = c->augment;
    if (aug == MGT_AUGMENT_DEFAULT)
        aug = cifar ? MGT_AUGMENT_PAD_CROP : MGT_AUGMENT_RRC;
    mgt_transform tt, vt;
    st = mgt_transform_init(&vt, MGT_TRANSFORM_RESIZE_CROP, r->size, r->channels);
    if (st == MGT_OK && cifar)
        vt.resize = (w == r->size && h == r->size) ? 0 : r->size;
    if (st == MGT_OK) {
        if (aug == MGT_AUGMENT_NONE)
            tt = vt;
        else
            st = mgt_transform_init(
                &tt, aug == MGT_AUGMENT_RRC ? MGT_TRANSFORM_RRC : MGT_TRANSFORM_PAD_CROP, r->size,
                r->channels);
    }
    if (st != MGT_OK)
        return st;
    float mean[3], stdv[3];
    bool have = c->mean_std_set;
    if (have) {
        memcpy(mean, c->mean, sizeof mean);
        memcpy(stdv, c->std, sizeof stdv);
    } else if (c->normalize_auto) {
        fprintf(r->out, "=> computing mean/std over the training images\n");
        st = mgt_data_stats(r->train_ds, r->channels, 0, c->workers, &r->abort, mean, stdv);
        if (st != MGT_OK)
            return st;
        have = true;
        if (r->channels == 1)
            fprintf(r->out, "=> mean %.4f std %.4f\n", mean[0], stdv[0]);
        else
            fprintf(r->out, "=> mean %.4f %.4f %.4f std %.4f %.4f %.4f\n", mean[0], mean[1],
                    mean[2], stdv[0], stdv[1], stdv[2]);
    }
    if (have) {
        memcpy(tt.mean, mean, sizeof mean);
        memcpy(tt.std, stdv, sizeof stdv);
        memcpy(vt.mean, mean, sizeof mean);
        memcpy(vt.std, stdv, sizeof stdv);
    }
    mgt_device *devs[MGT_MAX_DEVICES];
    for (int i = 0; i < r->n; i++)
        devs[i] = mgt_devset_device(r->set, i);
    mgt_loader_options lo;
    mgt_loader_options_init(&lo, r->train_ds, &tt, r->n, r->per_dev_batch);
    lo.devices = devs;
    /* A last batch of one image would give batch norm one value per channel, which it cannot
       train on (PyTorch refuses it too): drop that batch, keep every other short one. */
    mgt_sampler smp;
    st = mgt_sampler_init(&smp, mgt_dataset_size(r->train_ds), r->n, lo.split, lo.shuffle, c->seed);
    if (st != MGT_OK)
        return mgt_error_wrap(st, "%s", mgt_dataset_dir(r->train_ds));
    lo.drop_last_batch = mgt_sampler_count(&smp, 0) % (size_t)r->per_dev_batch == 1;
    if (c->workers >= 0)
        lo.workers = c->workers;
    lo.seed = c->seed;
    lo.bad.strict = c->strict_data;
    lo.bad.max_bad_frac = c->max_bad_frac;
    lo.abort = &r->abort;
    st = mgt_loader_create(&lo, &r->train_ld);
    if (st != MGT_OK)
        return st;
    r->train_samples = mgt_dataset_size(r->train_ds);
    r->val_samples = mgt_dataset_size(r->val_ds);
    r->steps_per_epoch = (long)mgt_loader_batches(r->train_ld, 0);
    if (c->max_steps > 0 && c->max_steps < r->steps_per_epoch)
        r->steps_per_epoch = c->max_steps;
    if (c->no_validation)
        return MGT_OK;
    mgt_loader_options vo;
    mgt_loader_options_init(&vo, r->val_ds, &vt, r->n, r->per_dev_batch);
    vo.devices = devs;
    if (c->workers >= 0)
        vo.workers = c->workers;
    vo.split = MGT_SPLIT_EXACT;
    vo.shuffle = false;
    vo.continuous = false;
    vo.seed = c->seed;
    vo.bad.strict = c->strict_data;
    vo.bad.max_bad_frac = c->max_bad_frac;
    vo.abort = &r->abort;
    return mgt_loader_create(&vo, &r->val_ld);
}

static mgt_status make_dummy_batch(run *r, worker *w)
{
    size_t per = (size_t)r->channels * (size_t)r->size * (size_t)r->size;
    size_t nx = per * (size_t)r->per_dev_batch;
    float *x = malloc(nx * sizeof(float));
    int32_t *y = malloc((size_t)r->per_dev_batch * sizeof(int32_t));
    mgt_status st = MGT_OK;
    if (!x || !y)
        st = mgt_error_set(MGT_ERR_OOM, "dummy data: host memory exhausted");
    if (st == MGT_OK) {
        mgt_rng g;
        mgt_rng_init(&g, r->c->seed, 0, (uint64_t)w->dev, MGT_RNG_OTHER);
        for (size_t i = 0; i < nx; i++)
            x[i] = 2.0f * mgt_rng_uniform(&g) - 1.0f;
        for (int i = 0; i < r->per_dev_batch; i++)
            y[i] = (int32_t)mgt_rng_below(&g, (uint64_t)r->classes);
        st = mgt_buffer_alloc(w->d, nx * sizeof(float), &w->dummy_x);
    }
    if (st == MGT_OK)
        st = mgt_buffer_alloc(w->d, (size_t)r->per_dev_batch * sizeof(int32_t), &w->dummy_y);
    if (st == MGT_OK)
        st = mgt_copy_h2d(w->s, mgt_buffer_ptr(w->dummy_x), x, nx * sizeof(float));
    if (st == MGT_OK)
        st = mgt_copy_h2d(w->s, mgt_buffer_ptr(w->dummy_y), y,
                          (size_t)r->per_dev_batch * sizeof(int32_t));
    if (st == MGT_OK)
        st = mgt_stream_synchronize(w->s, &r->abort);
    free(x);
    free(y);
    return st;
}

static mgt_status make_worker(run *r, int i)
{
    const mgt_train_config *c = r->c;
    worker *w = &r->w[i];
    w->r = r;
    w->dev = i;
    w->d = mgt_devset_device(r->set, i);
    mgt_status st = mgt_stream_create(w->d, &w->s);
    mgt_model_config mc = {.arch = c->arch,
                           .classes = r->classes,
                           .in_channels = r->channels,
                           .image_size = r->size,
                           .batch = r->per_dev_batch,
                           .zero_init_residual = c->zero_init_residual,
                           .freeze_bn = c->freeze_bn};
    if (st == MGT_OK)
        st = mgt_model_create(&mc, w->d, &w->model);
    size_t pbytes = 0;
    if (st == MGT_OK) {
        r->params[i] = mgt_model_params(w->model, &pbytes);
        r->buffers[i] = mgt_model_buffers(w->model, NULL);
        st = mgt_sgd_create(w->d, pbytes / sizeof(float), c->momentum, c->weight_decay, c->nesterov,
                            &w->sgd);
    }
    if (st == MGT_OK)
        r->momenta[i] = mgt_sgd_momentum(w->sgd, NULL);
    if (st == MGT_OK)
        st = mgt_host_alloc(w->d, SLOTS * sizeof(float), (void **)&w->host_loss);
    if (st == MGT_OK)
        st = mgt_host_alloc(w->d, SLOTS * 2 * sizeof(int32_t), (void **)&w->host_correct);
    if (st == MGT_OK)
        st = mgt_buffer_alloc(w->d, (SLOTS + 1) * 2 * sizeof(int32_t), &w->dev_correct);
    if (st == MGT_OK)
        st = mgt_buffer_alloc(w->d, sizeof(float), &w->dev_val);
    for (int k = 0; k < SLOTS && st == MGT_OK; k++) {
        st = mgt_event_create(w->d, &w->slot_ev[k]);
        for (int p = 0; p < 5 && st == MGT_OK && c->profile; p++)
            st = mgt_event_create(w->d, &w->prof_ev[k][p]);
    }
    if (st == MGT_OK && c->dummy)
        st = make_dummy_batch(r, w);
    if (st == MGT_OK && i == 0)
        st = mgt_model_init(w->model, w->s, c->seed);
    return st;
}

static void free_worker(worker *w)
{
    if (w->s)
        mgt_stream_synchronize(w->s, NULL);
    for (int k = 0; k < SLOTS; k++) {
        mgt_event_free(w->slot_ev[k]);
        for (int p = 0; p < 5; p++)
            mgt_event_free(w->prof_ev[k][p]);
    }
    mgt_buffer_free(w->dummy_x);
    mgt_buffer_free(w->dummy_y);
    mgt_buffer_free(w->dev_correct);
    mgt_buffer_free(w->dev_val);
    if (w->host_loss)
        mgt_host_free(w->d, w->host_loss);
    if (w->host_correct)
        mgt_host_free(w->d, w->host_correct);
    mgt_sgd_free(w->sgd);
    mgt_model_free(w->model);
    mgt_stream_free(w->s);
}

static mgt_status make_comm(run *r)
{
    int nt;
    const mgt_model_entry *t = mgt_model_table(r->w[0].model, &nt);
    size_t bytes;
    mgt_model_grads(r->w[0].model, &bytes);
    size_t *ends = malloc(((size_t)nt + 1) * sizeof *ends);
    if (!ends)
        return mgt_error_set(MGT_ERR_OOM, "comm: host memory exhausted");
    int ne = 0;
    for (int i = 0; i < nt; i++)
        if (t[i].role == MGT_MODEL_PARAM)
            ends[ne++] = t[i].offset + t[i].numel * sizeof(float);
    /* table order is not arena order: sort the ends, then drop repeats */
    for (int i = 1; i < ne; i++)
        for (int j = i; j > 0 && ends[j - 1] > ends[j]; j--) {
            size_t tmp = ends[j];
            ends[j] = ends[j - 1];
            ends[j - 1] = tmp;
        }
    if (ne == 0 || ends[ne - 1] != bytes)
        ends[ne++] = bytes;
    float *grads[MGT_MAX_DEVICES];
    for (int i = 0; i < r->n; i++)
        grads[i] = mgt_model_grads(r->w[i].model, NULL);
    mgt_comm_config cc = {.grads = grads,
                          .bytes = bytes,
                          .layer_ends = ends,
                          .n_layer_ends = ne,
                          .bucket_bytes = r->c->bucket_bytes,
                          .first_bucket_bytes = 1u << 20,
                          .algo = r->c->allreduce};
    mgt_status st = mgt_comm_create(r->set, &cc, &r->comm);
    free(ends);
    return st;
}

static mgt_status check_config(const mgt_train_config *c, int n)
{
    if (!c->arch)
        return mgt_error_set(MGT_ERR_INVALID, "--arch is missing");
    if (!c->dummy && !c->data_dir)
        return mgt_error_set(MGT_ERR_INVALID, "--data DIR is missing (or use --dummy)");
    if (c->batch_size < n)
        return mgt_error_set(MGT_ERR_INVALID,
                             "-b %d is smaller than the device count %d: -b is the total batch "
                             "over all devices",
                             c->batch_size, n);
    if (c->epochs < 1 || c->print_freq < 1 || c->bucket_bytes == 0)
        return mgt_error_set(MGT_ERR_INVALID, "--epochs, --print-freq and --bucket-mb must be "
                                              "positive");
    return MGT_OK;
}

static void print_start(run *r, int start_epoch)
{
    const mgt_train_config *c = r->c;
    FILE *o = r->out;
    fprintf(o, "=> devices (%d, %s):", r->n, mgt_device_kind_name(mgt_devset_kind(r->set)));
    for (int i = 0; i < r->n; i++)
        fprintf(o, " %s", mgt_device_name(mgt_devset_device(r->set, i)));
    fprintf(o, "\n=> batch: %d per device x %d devices = %d per step", r->per_dev_batch, r->n,
            r->per_dev_batch * r->n);
    if (r->per_dev_batch * r->n != c->batch_size)
        fprintf(o, " (-b %d split as the example does: int(b / devices) each)", c->batch_size);
    fprintf(o, "\n=> lr %g, %s schedule", c->lr.lr, c->lr.kind == MGT_LR_STEP ? "step" : "cosine");
    if (c->lr.kind == MGT_LR_STEP)
        fprintf(o, " (x%g every %d epochs)", c->lr.gamma, c->lr.step_epochs);
    if (c->lr.warmup_epochs > 0)
        fprintf(o, ", %g warm-up epochs", c->lr.warmup_epochs);
    fprintf(o, ", momentum %g%s, weight decay %g, label smoothing %g\n", c->momentum,
            c->nesterov ? " (nesterov)" : "", c->weight_decay, c->label_smoothing);
    if (c->dummy)
        fprintf(o, "=> data: synthetic (--dummy), %d classes, %dx%dx%d, %ld steps per epoch\n",
                r->classes, r->channels, r->size, r->size, r->steps_per_epoch);
    else
        fprintf(o,
                "=> data: %s: %zu training and %zu validation images, %d classes, "
                "%dx%dx%d, %ld steps per epoch\n",
                c->data_dir, r->train_samples, r->val_samples, r->classes, r->channels, r->size,
                r->size, r->steps_per_epoch);
    mgt_model_counts mc;
    mgt_model_get_counts(r->w[0].model, &mc);
    fprintf(o,
            "=> model: %s, %zu parameters, %.3f GMACs per image, %.1f MiB activations per "
            "device\n",
            c->arch, mc.params, (double)mc.macs / 1e9,
            (double)mgt_model_activation_bytes(r->w[0].model) / (1024.0 * 1024.0));
    fprintf(o, "=> epochs %d to %d\n", start_epoch, c->epochs - 1);
    fflush(o);
}

static void run_free(run *r)
{
    if (r->w) {
        pthread_mutex_lock(&r->lock);
        r->phase_kind = PHASE_EXIT;
        r->phase++;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->lock);
        for (int i = 0; i < r->n; i++)
            if (r->w[i].thread)
                pthread_join(r->w[i].thread, NULL);
        /* after an abort the devices may still hold queued work that uses what is freed next */
        for (int i = 0; i < r->n; i++)
            mgt_device_synchronize(mgt_devset_device(r->set, i), NULL);
    }
    mgt_loader_free(r->train_ld);
    mgt_loader_free(r->val_ld);
    mgt_comm_free(r->comm);
    for (int i = 0; r->w && i < r->n; i++)
        free_worker(&r->w[i]);
    free(r->w);
    free(r->params);
    free(r->buffers);
    free(r->momenta);
    mgt_dataset_free(r->train_ds);
    mgt_dataset_free(r->val_ds);
    if (r->log)
        fclose(r->log);
    pthread_mutex_destroy(&r->lock);
    pthread_cond_destroy(&r->cv);
}

/* Runs the validation phase and prints its summary. */
static bool validate(run *r, double run_start)
{
    r->val_loss_sum = 0;
    r->val_n = r->val_c1 = r->val_c5 = 0;
    mgt_status st = broadcast_state(r, false, false);
    if (st == MGT_OK)
        st = mgt_loader_set_epoch(r->val_ld, 0, 0);
    if (st != MGT_OK) {
        run_fail(r, st, "validation of epoch %d: %s", r->epoch, mgt_error_last());
        return false;
    }
    if (!run_phase(r, PHASE_VAL, run_start))
        return false;
    double n = (double)(r->val_n ? r->val_n : 1);
    r->res->val_loss = r->val_loss_sum / n;
    r->res->val_acc1 = 100.0 * (double)r->val_c1 / n;
    r->res->val_acc5 = 100.0 * (double)r->val_c5 / n;
    fprintf(r->out, " * Acc@1 %.3f Acc@5 %.3f  Loss %.4f  (%ld validation images)\n",
            r->res->val_acc1, r->res->val_acc5, r->res->val_loss, r->val_n);
    fflush(r->out);
    return true;
}

mgt_status mgt_train_run(const mgt_train_config *c, mgt_devset *set, mgt_train_result *res)
{
    memset(res, 0, sizeof *res);
    run R = {0};
    run *r = &R;
    r->c = c;
    r->set = set;
    r->n = mgt_devset_count(set);
    r->out = c->out ? c->out : stdout;
    r->res = res;
    r->stop_at = 0;
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->cv, NULL);
    mgt_status st = check_config(c, r->n);
    if (st != MGT_OK) {
        run_free(r);
        return st;
    }
    r->per_dev_batch = c->batch_size / r->n;
    double run_start = mgt_time_now();
    /* a checkpoint folder that cannot be written is found now, not after the first epoch */
    if (c->checkpoint_dir && ((mkdir(c->checkpoint_dir, 0777) != 0 && errno != EEXIST) ||
                              access(c->checkpoint_dir, W_OK | X_OK) != 0)) {
        st = mgt_error_set(MGT_ERR_IO, "--checkpoint-dir %s: %s", c->checkpoint_dir,
                           strerror(errno));
        run_free(r);
        return st;
    }
    if (c->log_path) {
        r->log = fopen(c->log_path, "a");
        if (!r->log) {
            st = mgt_error_set(MGT_ERR_IO, "--log %s: %s", c->log_path, strerror(errno));
            run_free(r);
            return st;
        }
    }
    st = open_data(r);
    r->w = calloc((size_t)r->n, sizeof *r->w);
    r->params = calloc((size_t)r->n, sizeof *r->params);
    r->buffers = calloc((size_t)r->n, sizeof *r->buffers);
    r->momenta = calloc((size_t)r->n, sizeof *r->momenta);
    if (st == MGT_OK && (!r->w || !r->params || !r->buffers || !r->momenta))
        st = mgt_error_set(MGT_ERR_OOM, "trainer: host memory exhausted");
    for (int i = 0; i < r->n && st == MGT_OK; i++)
        st = make_worker(r, i);
    if (st == MGT_OK)
        st = make_comm(r);
    int start_epoch = c->start_epoch > 0 ? c->start_epoch : 0;
    long start_step = 0;
    if (st == MGT_OK && c->pretrained) {
        mgt_model_load_report rep = {0};
        mgt_model_load_options lo = {.skip_fc = true};
        st = mgt_model_load_safetensors(r->w[0].model, r->w[0].s, c->pretrained, &lo, &rep);
        if (st == MGT_OK) {
            fprintf(r->out, "=> loaded pretrained weights from %s (%d tensors)\n", c->pretrained,
                    rep.loaded);
            if (rep.text)
                fprintf(r->out, "%s\n", rep.text);
        }
        free(rep.text);
    }
    if (st == MGT_OK && c->resume) {
        char auto_path[512];
        const char *path = c->resume;
        if (strcmp(path, "auto") == 0) {
            snprintf(auto_path, sizeof auto_path, "%s/checkpoint.safetensors",
                     c->checkpoint_dir ? c->checkpoint_dir : ".");
            path = access(auto_path, F_OK) == 0 ? auto_path : NULL;
            if (!path)
                fprintf(r->out, "=> --resume auto: no checkpoint at %s, starting afresh\n",
                        auto_path);
        }
        if (path) {
            int ep = 0;
            st = load_checkpoint(r, path, &ep, &start_step);
            if (st == MGT_OK) {
                if (c->start_epoch < 0)
                    start_epoch = ep;
                else
                    start_step = 0;
                if (start_step >= r->steps_per_epoch) { /* the epoch's images are all seen */
                    start_epoch++;
                    start_step = 0;
                }
                fprintf(r->out, "=> resumed from %s at epoch %d step %ld (best Acc@1 %.3f)\n", path,
                        start_epoch, start_step, r->best_acc1);
            }
        }
    }
    if (st == MGT_OK)
        st = broadcast_state(r, true, true);
    for (int i = 0; i < r->n && st == MGT_OK; i++)
        if (pthread_create(&r->w[i].thread, NULL, worker_main, &r->w[i]) != 0)
            st = mgt_error_set(MGT_ERR_DEVICE, "cannot start the worker thread of device %d", i);
    if (st != MGT_OK) {
        mgt_abort_raise(&r->abort);
        run_free(r);
        return st;
    }
    print_start(r, start_epoch);

    bool ok = true;
    if (c->evaluate) {
        if (c->dummy) {
            run_fail(r, MGT_ERR_INVALID,
                     "--evaluate needs --data: dummy data has no "
                     "validation split");
            ok = false;
        } else {
            r->epoch = start_epoch;
            ok = validate(r, run_start);
        }
    }
    for (int ep = start_epoch; ok && !c->evaluate && ep < c->epochs; ep++) {
        r->epoch = ep;
        r->first_step = ep == start_epoch ? start_step : 0;
        r->stop_at = r->steps_per_epoch;
        r->next_complete = r->first_step;
        r->ep_loss_sum = r->ep_data_s = 0;
        r->ep_n = r->ep_c1 = r->ep_c5 = 0;
        r->ep_start = r->last_complete = r->timed_start = mgt_time_now();
        r->timed_n = r->timed_steps = 0;
        for (int i = 0; i < r->n; i++)
            memset(&r->w[i].prof, 0, sizeof r->w[i].prof);
        memset(r->ring, 0, sizeof r->ring);
        for (int i = 0; i < r->n; i++)
            r->w[i].started = r->w[i].metered = r->first_step;
        if (r->train_ld) {
            st = mgt_loader_set_epoch(r->train_ld, ep, (size_t)r->first_step);
            if (st != MGT_OK) {
                run_fail(r, st, "data for epoch %d: %s", ep, mgt_error_last());
                ok = false;
                break;
            }
        }
        ok = run_phase(r, PHASE_TRAIN, run_start);
        if (!ok)
            break;
        double ep_s = mgt_time_now() - r->ep_start;
        res->steps += r->stop_at - r->first_step;
        st = check_replicas(r);
        if (st != MGT_OK) {
            run_fail(r, st, "epoch %d: %s", ep, mgt_error_last());
            ok = false;
            break;
        }
        res->train_loss = r->ep_n ? r->ep_loss_sum / (double)r->ep_n : 0;
        res->images_per_s = ep_s > 0 ? (double)r->ep_n / ep_s : 0;
        double timed_s = r->last_complete - r->timed_start;
        res->timed_images_per_s = timed_s > 0 ? (double)r->timed_n / timed_s : 0;
        res->timed_step_s = r->timed_steps ? timed_s / (double)r->timed_steps : 0;
        for (int i = 0; i < r->n; i++) {
            mgt_step_profile p = r->w[i].prof;
            double k = p.steps ? (double)p.steps : 1;
            res->profile[i] =
                (mgt_step_profile){p.data_s / k,           p.forward_s / k,   p.backward_s / k,
                                   p.reduce_exposed_s / k, p.optimizer_s / k, p.steps};
        }
        if (r->stop_at < r->steps_per_epoch) {
            res->interrupted = true;
            st = broadcast_state(r, false, false);
            if (st == MGT_OK)
                st = save_checkpoint(r, ep, r->stop_at, false);
            if (st != MGT_OK) {
                run_fail(r, st, "checkpoint at epoch %d step %ld: %s", ep, r->stop_at,
                         mgt_error_last());
                ok = false;
            } else {
                fprintf(r->out, "=> stopped at epoch %d step %ld; checkpoint %s\n", ep, r->stop_at,
                        res->checkpoint[0] ? res->checkpoint
                                           : "(none: no "
                                             "--checkpoint-dir)");
            }
            break;
        }
        bool is_best = false;
        if (r->val_ld) {
            ok = validate(r, run_start);
            if (!ok)
                break;
            is_best = res->val_acc1 > r->best_acc1;
            if (is_best)
                r->best_acc1 = res->val_acc1;
        } else {
            st = broadcast_state(r, false, false);
            if (st != MGT_OK) {
                run_fail(r, st, "epoch %d: %s", ep, mgt_error_last());
                ok = false;
                break;
            }
        }
        res->epochs_done++;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "type", "epoch");
        cJSON_AddNumberToObject(o, "epoch", ep);
        cJSON_AddNumberToObject(o, "train_loss", res->train_loss);
        cJSON_AddNumberToObject(o, "train_acc1",
                                r->ep_n ? 100.0 * (double)r->ep_c1 / (double)r->ep_n : 0);
        cJSON_AddNumberToObject(o, "images_per_s", res->images_per_s);
        cJSON_AddNumberToObject(o, "epoch_s", ep_s);
        if (r->val_ld) {
            cJSON_AddNumberToObject(o, "val_loss", res->val_loss);
            cJSON_AddNumberToObject(o, "val_acc1", res->val_acc1);
            cJSON_AddNumberToObject(o, "val_acc5", res->val_acc5);
        }
        log_json(r, o);
        st = save_checkpoint(r, ep + 1, 0, is_best);
        if (st != MGT_OK) {
            run_fail(r, st, "checkpoint after epoch %d: %s", ep, mgt_error_last());
            ok = false;
        }
        if (c->stop && atomic_load(c->stop)) {
            res->interrupted = true;
            break;
        }
    }
    res->best_acc1 = r->best_acc1;
    if (!ok) {
        st = r->fail_status != MGT_OK ? r->fail_status : MGT_ERR_DEVICE;
        char text[sizeof r->fail_text];
        memcpy(text, r->fail_text, sizeof text);
        mgt_abort_raise(&r->abort);
        run_free(r);
        return mgt_error_set(st, "%s", text);
    }
    run_free(r);
    return MGT_OK;
}
