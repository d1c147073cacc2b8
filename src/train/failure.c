/* The run's first failure: recorded once, by whichever thread noticed it, never replaced by
   what its consequences or the cleanup report; placed on the device and step where it
   happened; and formatted as the run's one line.

   A device fault runs ahead of the host: a kernel fails while its worker enqueues a later
   step, and another thread (a peer's all-reduce, the loader copying to that device, a wait)
   may notice first. So each worker records a mark (an event with its epoch, step and stage)
   after every stage of its work; once the threads have stopped, the first of the faulty
   device's marks that completed only after the device had failed tells the stage whose work
   held the fault. Where the backend cannot tell (CUDA), the faulty device's worker's own
   position when it noticed stands in. */
#include <string.h>

#include "train/train_impl.h"

/* Records f as the run's failure unless one is recorded already, then raises the abort flag
   and wakes every wait of the run. */
static void record(run *r, const train_failure *f)
{
    pthread_mutex_lock(&r->lock);
    if (!r->fail.set) {
        r->fail = *f;
        r->fail.set = true;
        r->fail_at = mgt_time_now();
        if (r->fail.status == MGT_OK)
            r->fail.status = MGT_ERR_DEVICE;
    }
    pthread_mutex_unlock(&r->lock);
    mgt_abort_raise(&r->abort);
    pthread_mutex_lock(&r->lock);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->lock);
}

static void set_cause(train_failure *f, const char *text)
{
    snprintf(f->cause, sizeof f->cause, "%s", text);
}

void train_fail(run *r, mgt_status st)
{
    train_failure f = {.status = st, .device = -1, .epoch = -1, .step = -1};
    set_cause(&f, mgt_error_last());
    record(r, &f);
}

void train_fail_root(run *r, mgt_status st)
{
    train_failure f = {.status = st, .device = -1, .epoch = -1, .step = -1, .root = true};
    set_cause(&f, mgt_error_last());
    record(r, &f);
}

void train_fail_remote(run *r, const char *text)
{
    train_failure f = {
        .status = MGT_ERR_ABORTED, .device = -1, .epoch = -1, .step = -1, .remote = true};
    snprintf(f.cause, sizeof f.cause, "another node failed: %s", text);
    record(r, &f);
}

void train_fail_worker(worker *w, mgt_status st, long step, bool validation, const char *phase,
                       bool root)
{
    run *r = w->r;
    train_failure f = {.set = true,
                       .status = st,
                       .device = w->dev,
                       .epoch = r->epoch,
                       .step = step,
                       .validation = validation,
                       .root = root};
    snprintf(f.phase, sizeof f.phase, "%s", phase);
    set_cause(&f, mgt_error_last());
    /* where this worker stood when it left its phase, whatever made it leave: a fault of its
       device that no mark ran after (its worker's record of the stage's mark failed at once,
       the fault already known, or the worker left at the abort flag before recording it) is
       in the work of this stage. It is kept even where this worker's exit is another's abort:
       the fault that a peer noticed first may be this device's own. */
    w->noticed = f;
    /* an abort caused by another thread's failure is not a cause of its own */
    if (st == MGT_ERR_ABORTED && mgt_abort_is_raised(&r->abort))
        return;
    record(r, &f);
}

mgt_status train_marks_create(worker *w)
{
    mgt_status st = MGT_OK;
    for (int i = 0; i < TRAIN_MARKS && st == MGT_OK; i++)
        st = mgt_event_create_ordering(w->d, &w->marks[i].ev);
    return st;
}

void train_marks_free(worker *w)
{
    for (int i = 0; i < TRAIN_MARKS; i++)
        mgt_event_free(w->marks[i].ev);
}

mgt_status train_mark(worker *w, long step, bool validation, const char *phase)
{
    train_marker *m = &w->marks[(w->mark_seq + 1) % TRAIN_MARKS];
    mgt_status st = mgt_event_record(m->ev, w->s);
    if (st != MGT_OK) {
        /* the event may have been taken for a record that never ran on a sound device (mock
           devices complete it at once as unclean): it no longer says how the older mark it
           held ended */
        m->seq = 0;
        return st;
    }
    w->mark_seq++;
    *m = (train_marker){.ev = m->ev,
                        .epoch = w->r->epoch,
                        .step = step,
                        .validation = validation,
                        .phase = phase,
                        .seq = w->mark_seq};
    return MGT_OK;
}

/* The first of w's marks that completed after its device had failed: where the fault was. */
static const train_marker *first_unclean_mark(const worker *w)
{
    long first = w->mark_seq - TRAIN_MARKS + 1;
    for (long seq = first > 1 ? first : 1; seq <= w->mark_seq; seq++) {
        const train_marker *m = &w->marks[seq % TRAIN_MARKS];
        bool clean;
        if (m->seq == seq && mgt_event_outcome(m->ev, &clean) && !clean)
            return m;
    }
    return NULL;
}

int train_device_failure(const run *r, int i, train_failure *f)
{
    mgt_device *d = r->devs[i];
    if (mgt_device_synchronize(d, NULL) != MGT_ERR_DEVICE)
        return 0;
    /* device i failed: its text is the cause, wherever the failure surfaced first */
    *f = (train_failure){.set = true,
                         .status = MGT_ERR_DEVICE,
                         .device = i,
                         .epoch = r->fail.set ? r->fail.epoch : -1,
                         .step = -1};
    const char *text = mgt_error_last();
    size_t nl = strlen(mgt_device_name(d));
    if (strncmp(text, mgt_device_name(d), nl) == 0 && strncmp(text + nl, ": ", 2) == 0)
        text += nl + 2;
    set_cause(f, text);
    const worker *w = r->w && r->w[i].thread_started ? &r->w[i] : NULL;
    const train_marker *m = w ? first_unclean_mark(w) : NULL;
    if (m) {
        f->epoch = m->epoch;
        f->step = m->step;
        f->validation = m->validation;
        snprintf(f->phase, sizeof f->phase, "%s", m->phase);
    } else if (w && w->noticed.set) {
        f->epoch = w->noticed.epoch;
        f->step = w->noticed.step;
        f->validation = w->noticed.validation;
        memcpy(f->phase, w->noticed.phase, sizeof f->phase);
    } else {
        return 1; /* no step of its worker's to name: the recorded text names the device */
    }
    return 2;
}

void train_failure_settle(run *r)
{
    /* a device that failed here is this node's own failure, even where another node's came
       in first (both failed: each says why) */
    if (!r->fail.set || r->fail.root)
        return;
    for (int i = 0; i < r->n; i++) {
        train_failure f;
        int found = train_device_failure(r, i, &f);
        if (!found)
            continue;
        if (found == 2) {
            pthread_mutex_lock(&r->lock);
            r->fail = f;
            pthread_mutex_unlock(&r->lock);
        }
        return;
    }
}

void train_failure_line(const run *r, char *out, size_t cap)
{
    train_failure_format(r, &r->fail, out, cap);
    size_t len = strlen(out);
    if (r->lost_across_nodes && r->fail.device >= 0 && len < cap)
        snprintf(out + len, cap - len,
                 "; --on-device-failure continue ends a multi-node run at a lost device (every "
                 "node must keep the same device count)");
}

void train_failure_format(const run *r, const train_failure *f, char *out, size_t cap)
{
    const char *name = f->device >= 0 ? mgt_device_name(r->devs[f->device]) : "";
    const char *cause = f->cause;
    size_t nl = strlen(name);
    if (nl && strncmp(cause, name, nl) == 0 && strncmp(cause + nl, ": ", 2) == 0)
        cause += nl + 2;
    if (f->device < 0)
        snprintf(out, cap, "%s", cause);
    else if (f->validation)
        snprintf(out, cap, "%s: validation of epoch %d, batch %ld: %s", name, f->epoch, f->step,
                 cause);
    else if (f->step >= 0)
        snprintf(out, cap, "%s: epoch %d step %ld (%s): %s", name, f->epoch, f->step, f->phase,
                 cause);
    else if (f->epoch >= 0)
        snprintf(out, cap, "%s: epoch %d: %s", name, f->epoch, cause);
    else
        snprintf(out, cap, "%s: %s", name, cause);
}
