/* The world on Open MPI (or any MPI-3 library): MPI_THREAD_MULTIPLE, the world communicator
   for the main thread's collectives, one duplicate per local device for the gradient shards,
   one for control messages (a failure's line, a stop's step). Every wait is a non-blocking
   request polled with MPI_Test between short sleeps (longer as the wait grows, so eight ranks
   polling on two cores leave them to the copies), and the abort flag, a failure message from
   another rank and the timeout all end it; nothing here blocks inside MPI. */
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

#include "world/world_impl.h"

#define FAIL_TEXT 768
enum { TAG_FAIL = 1, TAG_STOP = 2 };

/* The bytes of the main thread's collectives. A wait can give up on its request (the abort
   flag, another node's failure, the timeout) and MPI cannot cancel a collective: it may still
   read the send half and write the receive half until the process ends (MPI_Abort). So none of
   the main thread's collectives runs in its caller's buffers, which the failure's cleanup
   frees: it runs here, and a stage whose request was left pending is handed to MPI for good
   (never freed or reused; the process aborts soon after). The channels' collectives run in
   their callers' buffers under the same rule, stated in mgt/world.h. */
typedef struct mpi_stage {
    unsigned char *p;
    size_t cap;
} mpi_stage;

struct mgt_world {
    bool mpi; /* MPI was initialised (launched with more than one rank) */
    int rank, size;
    char host[MPI_MAX_PROCESSOR_NAME + 1];
    double timeout_s;
    double link_bw, link_lat; /* the mock inter-node link model (0: none) */
    MPI_Comm comm, ctrl;
    struct world_chan **chan; /* [nchan]: each device thread's communicator and link */
    int nchan;
    mpi_stage main_stage; /* the main thread's collectives on comm */
    /* control: one receive of a failure line from anyone, one of a stop step from anyone */
    MPI_Request fail_req, stop_req;
    char fail_in[FAIL_TEXT];
    long stop_in;
    atomic_int remote_failed; /* set by the main thread's poll, read by device threads */
    char fail_text[FAIL_TEXT];
    char fail_out[FAIL_TEXT]; /* this node's failure line, being sent */
    bool stop_requested, stop_proposed, notified;
    int stop_count;
    long stop_max;
    long stop_out; /* the proposal being sent (alive until the world closes) */
};

/* One operation in flight on a channel: its request, the end of its time on the modelled link,
   and the int count and offset arrays MPI reads until it completes. */
struct chan_op {
    MPI_Request req;
    double link_end;
    bool busy;
    int *counts, *displs, *rcounts, *rdispls; /* [size] each */
};

/* A device thread's communicator, its link model's clock (when the link is next free) and its
   operations. Used by that thread alone once made. */
struct world_chan {
    MPI_Comm comm;
    double link_free;
    _Atomic uint64_t bytes_in; /* received from the other ranks by its collectives */
    struct chan_op ops[MGT_WORLD_CHAN_OPS];
};

/* NULL is a no-op; the communicator is freed by the caller (with MPI still running). */
static void chan_free(struct world_chan *ch)
{
    for (int k = 0; ch && k < MGT_WORLD_CHAN_OPS; k++) {
        free(ch->ops[k].counts);
        free(ch->ops[k].displs);
        free(ch->ops[k].rcounts);
        free(ch->ops[k].rdispls);
    }
    free(ch);
}

bool mgt_world_have_mpi(void) { return true; }

static mgt_status mpi_error(int rc, const char *what)
{
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, s, &len);
    return mgt_error_set(MGT_ERR_DEVICE, "MPI: %s: %.*s", what, len, s);
}

mgt_status mgt_world_open(mgt_world **out)
{
    *out = NULL;
    mgt_world *w = calloc(1, sizeof *w);
    if (!w)
        return mgt_error_set(MGT_ERR_OOM, "world: host memory exhausted");
    w->size = 1;
    atomic_init(&w->remote_failed, 0);
    const char *var;
    if (world_env_size(&var) <= 1) {
        /* a single process: exactly as without MPI, no MPI_Init at all */
        if (gethostname(w->host, sizeof w->host - 1) != 0)
            strcpy(w->host, "localhost");
        *out = w;
        return MGT_OK;
    }
    int provided = 0;
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) {
        free(w);
        return mpi_error(rc, "MPI_Init_thread");
    }
    w->mpi = true;
    if (provided < MPI_THREAD_MULTIPLE) {
        mgt_world_close(w, false);
        return mgt_error_set(MGT_ERR_INVALID,
                             "MPI: the library offers thread level %d, not MPI_THREAD_MULTIPLE "
                             "(each device thread exchanges its shard itself): use an MPI built "
                             "with thread support (Debian's Open MPI is)",
                             provided);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &w->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &w->size);
    int len = 0;
    MPI_Get_processor_name(w->host, &len);
    MPI_Comm_dup(MPI_COMM_WORLD, &w->comm);
    MPI_Comm_dup(MPI_COMM_WORLD, &w->ctrl);
    MPI_Comm_set_errhandler(w->comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(w->ctrl, MPI_ERRORS_RETURN);
    MPI_Irecv(w->fail_in, FAIL_TEXT, MPI_CHAR, MPI_ANY_SOURCE, TAG_FAIL, w->ctrl, &w->fail_req);
    MPI_Irecv(&w->stop_in, 1, MPI_LONG, MPI_ANY_SOURCE, TAG_STOP, w->ctrl, &w->stop_req);
    *out = w;
    return MGT_OK;
}

void mgt_world_close(mgt_world *w, bool failed)
{
    if (!w)
        return;
    if (w->mpi && failed && w->size > 1) {
        fflush(stdout);
        fflush(stderr);
        /* mpirun drops what a rank wrote but had not yet forwarded when an abort kills it: the
           failing rank's one line could be lost when another rank aborts first (seen under the
           address sanitizer). Half a second lets the forwarding drain; a rank that only heard
           of another's failure waits longer (5 s), so that the failing rank, which may still be
           tidying up before it prints, is the one whose abort ends the run (seen with three
           ranks timing out on a fourth: the quiet ones' aborts came first, and no line was
           left). Both well inside the 10 s every rank has to end in. */
        bool quiet = atomic_load(&w->remote_failed) && !w->notified;
        nanosleep(&(struct timespec){.tv_sec = quiet ? 5 : 0, .tv_nsec = quiet ? 0 : 500000000L},
                  NULL);
        /* requests of the failed step may never complete: MPI_Finalize would wait on them */
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (w->mpi) {
        MPI_Request reqs[2] = {w->fail_req, w->stop_req};
        for (int i = 0; i < 2; i++)
            if (reqs[i] != MPI_REQUEST_NULL) {
                MPI_Cancel(&reqs[i]);
                MPI_Wait(&reqs[i], MPI_STATUS_IGNORE);
            }
        for (int i = 0; i < w->nchan; i++)
            MPI_Comm_free(&w->chan[i]->comm);
        MPI_Comm_free(&w->comm);
        MPI_Comm_free(&w->ctrl);
        MPI_Finalize();
    }
    for (int i = 0; i < w->nchan; i++)
        chan_free(w->chan[i]);
    free(w->main_stage.p);
    free(w->chan);
    free(w);
}

/* At least bytes of st; NULL when host memory is exhausted. */
static unsigned char *stage_get(mpi_stage *st, size_t bytes)
{
    if (bytes > st->cap) {
        unsigned char *p = realloc(st->p, bytes);
        if (!p)
            return NULL;
        st->p = p;
        st->cap = bytes;
    }
    return st->p;
}

/* The request on st's bytes was left pending: they are MPI's now. */
static void stage_abandon(mpi_stage *st)
{
    st->p = NULL;
    st->cap = 0;
}

int mgt_world_rank(const mgt_world *w) { return w ? w->rank : 0; }
int mgt_world_size(const mgt_world *w) { return w ? w->size : 1; }
const char *mgt_world_host(const mgt_world *w) { return w ? w->host : "localhost"; }
void mgt_world_set_timeout(mgt_world *w, double seconds) { w->timeout_s = seconds; }
void mgt_world_set_link(mgt_world *w, double bytes_per_s, double latency_s)
{
    w->link_bw = bytes_per_s;
    w->link_lat = latency_s;
}

bool mgt_world_link(const mgt_world *w, double *bytes_per_s, double *latency_s)
{
    bool on = w && w->link_bw > 0;
    *bytes_per_s = on ? w->link_bw : 0;
    *latency_s = on ? w->link_lat : 0;
    return on;
}

/* The main thread's look at the failure line: sets remote_failed for every thread. */
static bool poll_fail(mgt_world *w)
{
    if (atomic_load(&w->remote_failed))
        return true;
    if (!w->mpi || w->fail_req == MPI_REQUEST_NULL)
        return false;
    int done = 0;
    MPI_Test(&w->fail_req, &done, MPI_STATUS_IGNORE);
    if (!done)
        return false;
    w->fail_in[FAIL_TEXT - 1] = 0;
    snprintf(w->fail_text, sizeof w->fail_text, "%s", w->fail_in);
    atomic_store(&w->remote_failed, 1);
    return true;
}

/* Polls one request to completion; main: the caller is the main thread (which may test the
   control requests). */
static mgt_status wait_req(mgt_world *w, MPI_Request *req, const mgt_abort *abort, bool main,
                           const char *what)
{
    double start = mgt_time_now();
    for (;;) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return mpi_error(rc, what);
        if (done)
            return MGT_OK;
        if (mgt_abort_is_raised(abort))
            return mgt_error_set(MGT_ERR_ABORTED, "MPI: %s aborted", what);
        if (main ? poll_fail(w) : atomic_load(&w->remote_failed) != 0)
            return mgt_error_set(MGT_ERR_ABORTED, "MPI: %s: another node failed", what);
        if (w->timeout_s > 0 && mgt_time_now() - start > w->timeout_s)
            return mgt_error_set(MGT_ERR_TIMEOUT,
                                 "MPI: %s: no answer from the other nodes within --timeout %g s "
                                 "(a node died or stalled)",
                                 what, w->timeout_s);
        /* 20 us at first, then an eighth of the time waited so far, at most 1 ms: a long
           wait's polls cost little CPU, and the progress it delays is a small part of it */
        double nap = (mgt_time_now() - start) / 8;
        nap = nap < 20e-6 ? 20e-6 : nap > 1e-3 ? 1e-3 : nap;
        nanosleep(&(struct timespec){0, (long)(nap * 1e9)}, NULL);
    }
}

static mgt_status check_count(size_t bytes, const char *what)
{
    if (bytes > (size_t)INT_MAX)
        return mgt_error_set(MGT_ERR_INVALID,
                             "MPI: %s of %zu bytes is over the 2 GiB a message "
                             "may carry here",
                             what, bytes);
    return MGT_OK;
}

mgt_status mgt_world_check_devices(mgt_world *w, int local_devices)
{
    if (w->size == 1)
        return MGT_OK;
    int *all = calloc((size_t)w->size, sizeof *all);
    if (!all)
        return mgt_error_set(MGT_ERR_OOM, "world: host memory exhausted");
    mgt_status st = mgt_world_allgather(w, &local_devices, sizeof local_devices, all, NULL);
    for (int r = 1; r < w->size && st == MGT_OK; r++)
        if (all[r] != all[0])
            st = mgt_error_set(MGT_ERR_INVALID,
                               "node %d has %d devices but node 0 has %d: every node must use "
                               "the same local device count (--gpus)",
                               r, all[r], all[0]);
    free(all);
    return st;
}

mgt_status mgt_world_check_same(mgt_world *w, const char *settings, const mgt_abort *abort,
                                bool *speaker)
{
    *speaker = false;
    if (w->size == 1)
        return MGT_OK;
    size_t len = strlen(settings);
    uint64_t mine[2] = {world_digest(settings, len), len}, *all = NULL;
    char *texts = NULL;
    all = calloc((size_t)w->size, sizeof mine);
    mgt_status st = all ? MGT_OK : mgt_error_set(MGT_ERR_OOM, "world: host memory exhausted");
    if (st == MGT_OK)
        st = mgt_world_allgather(w, mine, sizeof mine, all, abort);
    int differs = 0; /* the lowest node whose settings are not node 0's */
    for (int r = 1; r < w->size && st == MGT_OK && !differs; r++)
        if (all[2 * r] != all[0] || all[2 * r + 1] != all[1])
            differs = r;
    if (st != MGT_OK || !differs) {
        free(all);
        return st;
    }
    /* they differ: every node gets every node's text and finds the same first difference */
    size_t most = 0;
    for (int r = 0; r < w->size; r++)
        most = all[2 * r + 1] > most ? (size_t)all[2 * r + 1] : most;
    char *padded = calloc(1, most + 1);
    texts = calloc((size_t)w->size, most + 1);
    st = padded && texts ? MGT_OK : mgt_error_set(MGT_ERR_OOM, "world: host memory exhausted");
    if (st == MGT_OK) {
        memcpy(padded, settings, len);
        st = mgt_world_allgather(w, padded, most + 1, texts, abort);
    }
    if (st == MGT_OK) {
        st = world_settings_differ(texts + (size_t)differs * (most + 1), differs, texts);
        if (st == MGT_OK) /* digests differ only where the texts do: not reached */
            st = mgt_error_set(MGT_ERR_USAGE, "the nodes disagree on their settings");
        *speaker = w->rank == differs;
    }
    free(padded);
    free(texts);
    free(all);
    return st;
}

mgt_status mgt_world_bcast(mgt_world *w, void *buf, size_t bytes, int root, const mgt_abort *abort)
{
    if (w->size == 1 || bytes == 0)
        return MGT_OK;
    mgt_status st = check_count(bytes, "a broadcast");
    if (st != MGT_OK)
        return st;
    unsigned char *b = stage_get(&w->main_stage, bytes);
    if (!b)
        return mgt_error_set(MGT_ERR_OOM, "world: host memory exhausted");
    if (w->rank == root)
        memcpy(b, buf, bytes);
    MPI_Request req;
    MPI_Ibcast(b, (int)bytes, MPI_BYTE, root, w->comm, &req);
    st = wait_req(w, &req, abort, true, "broadcast");
    if (st == MGT_OK)
        memcpy(buf, b, bytes);
    else
        stage_abandon(&w->main_stage);
    return st;
}

mgt_status mgt_world_allgather(mgt_world *w, const void *mine, size_t bytes, void *all,
                               const mgt_abort *abort)
{
    if (w->size == 1) {
        memmove(all, mine, bytes);
        return MGT_OK;
    }
    /* all = every rank's bytes of mine, in rank order, through the stage (see mpi_stage) */
    mgt_status st = check_count(bytes, "an all-gather");
    if (st != MGT_OK)
        return st;
    size_t n = (size_t)w->size;
    unsigned char *b = stage_get(&w->main_stage, bytes * (n + 1));
    if (!b)
        return mgt_error_set(MGT_ERR_OOM, "world: host memory exhausted");
    memcpy(b, mine, bytes);
    MPI_Request req;
    MPI_Iallgather(b, (int)bytes, MPI_BYTE, b + bytes, (int)bytes, MPI_BYTE, w->comm, &req);
    st = wait_req(w, &req, abort, true, "all-gather");
    if (st == MGT_OK)
        memcpy(all, b + bytes, bytes * n);
    else
        stage_abandon(&w->main_stage);
    return st;
}

mgt_status mgt_world_sum(mgt_world *w, double *v, int n, const mgt_abort *abort)
{
    if (w->size == 1 || n == 0)
        return MGT_OK;
    double *all = malloc((size_t)w->size * (size_t)n * sizeof *all);
    if (!all)
        return mgt_error_set(MGT_ERR_OOM, "world: host memory exhausted");
    /* gathered and added in rank order, not MPI_SUM, whose order the library chooses */
    mgt_status st = mgt_world_allgather(w, v, (size_t)n * sizeof *v, all, abort);
    for (int i = 0; i < n && st == MGT_OK; i++) {
        double s = 0;
        for (int r = 0; r < w->size; r++)
            s += all[(size_t)r * (size_t)n + (size_t)i];
        v[i] = s;
    }
    free(all);
    return st;
}

mgt_status mgt_world_barrier(mgt_world *w, const mgt_abort *abort)
{
    if (w->size == 1)
        return MGT_OK;
    MPI_Request req;
    MPI_Ibarrier(w->comm, &req);
    return wait_req(w, &req, abort, true, "barrier");
}

mgt_status mgt_world_channels(mgt_world *w, int n)
{
    /* grows to n (bench runs rows of 1, 2, 4 ... devices in one world); every node makes the
       same calls, so the duplications stay collective */
    if (w->size == 1 || w->nchan >= n)
        return MGT_OK;
    struct world_chan **chan = realloc(w->chan, (size_t)n * sizeof *chan);
    if (!chan)
        return mgt_error_set(MGT_ERR_OOM, "world: host memory exhausted");
    w->chan = chan;
    size_t nr = (size_t)w->size;
    for (int i = w->nchan; i < n; i++) {
        struct world_chan *ch = calloc(1, sizeof *ch);
        bool ok = ch != NULL;
        for (int k = 0; ok && k < MGT_WORLD_CHAN_OPS; k++) {
            struct chan_op *o = &ch->ops[k];
            o->req = MPI_REQUEST_NULL;
            o->counts = calloc(nr, sizeof(int));
            o->displs = calloc(nr, sizeof(int));
            o->rcounts = calloc(nr, sizeof(int));
            o->rdispls = calloc(nr, sizeof(int));
            ok = o->counts && o->displs && o->rcounts && o->rdispls;
        }
        if (!ok) {
            chan_free(ch);
            return mgt_error_set(MGT_ERR_OOM, "world: host memory exhausted");
        }
        int rc = MPI_Comm_dup(w->comm, &ch->comm);
        if (rc != MPI_SUCCESS) {
            chan_free(ch);
            return mpi_error(rc, "MPI_Comm_dup of a device's communicator");
        }
        MPI_Comm_set_errhandler(ch->comm, MPI_ERRORS_RETURN);
        w->chan[i] = ch;
        w->nchan = i + 1;
    }
    return MGT_OK;
}

/* A free operation of channel chan with its arrays filled from counts and displs (bytes, which
   must fit an int); NULL with the error set. */
static struct chan_op *op_begin(mgt_world *w, int chan, const size_t *counts, const size_t *displs,
                                int *op, const char *what)
{
    if (chan < 0 || chan >= w->nchan) {
        mgt_error_set(MGT_ERR_INVALID, "world: no channel %d (of %d)", chan, w->nchan);
        return NULL;
    }
    struct world_chan *ch = w->chan[chan];
    int k = 0;
    while (k < MGT_WORLD_CHAN_OPS && ch->ops[k].busy)
        k++;
    if (k == MGT_WORLD_CHAN_OPS) {
        mgt_error_set(MGT_ERR_INVALID, "world: channel %d has %d operations in flight already",
                      chan, MGT_WORLD_CHAN_OPS);
        return NULL;
    }
    struct chan_op *o = &ch->ops[k];
    for (int r = 0; r < w->size; r++) {
        if (counts[r] > (size_t)INT_MAX || displs[r] > (size_t)INT_MAX) {
            mgt_error_set(MGT_ERR_INVALID,
                          "MPI: %s of %zu bytes at %zu is over the 2 GiB a message may "
                          "carry here",
                          what, counts[r], displs[r]);
            return NULL;
        }
        o->counts[r] = (int)counts[r];
        o->displs[r] = (int)displs[r];
    }
    *op = k;
    return o;
}

/* The operation's time on the channel's link: it starts when the link is free. */
static void op_link(mgt_world *w, int chan, struct chan_op *o, size_t bytes_in)
{
    struct world_chan *ch = w->chan[chan];
    double now = mgt_time_now();
    o->link_end = now;
    if (w->link_bw > 0) {
        double start = ch->link_free > now ? ch->link_free : now;
        o->link_end = start + (w->size - 1) * w->link_lat + (double)bytes_in / w->link_bw;
        ch->link_free = o->link_end;
    }
    o->busy = true;
    atomic_fetch_add(&ch->bytes_in, (uint64_t)bytes_in);
}

mgt_status mgt_world_chan_alltoall(mgt_world *w, int chan, const void *send, const size_t *counts,
                                   const size_t *displs, void *recv, size_t each, int *op)
{
    *op = 0;
    if (w->size == 1) {
        memmove(recv, (const char *)send + displs[0], each);
        return MGT_OK;
    }
    struct chan_op *o = op_begin(w, chan, counts, displs, op, "an all-to-all");
    if (!o)
        return MGT_ERR_INVALID;
    if (each > (size_t)INT_MAX / (size_t)w->size)
        return mgt_error_set(MGT_ERR_INVALID,
                             "MPI: an all-to-all of %zu bytes a rank is over "
                             "the 2 GiB a message may carry here",
                             each);
    for (int r = 0; r < w->size; r++) {
        o->rcounts[r] = (int)each;
        o->rdispls[r] = r * (int)each;
    }
    int rc = MPI_Ialltoallv(send, o->counts, o->displs, MPI_BYTE, recv, o->rcounts, o->rdispls,
                            MPI_BYTE, w->chan[chan]->comm, &o->req);
    if (rc != MPI_SUCCESS)
        return mpi_error(rc, "MPI_Ialltoallv");
    op_link(w, chan, o, each * (size_t)(w->size - 1));
    return MGT_OK;
}

mgt_status mgt_world_chan_allgather(mgt_world *w, int chan, const void *send, void *recv,
                                    const size_t *counts, const size_t *displs, int *op)
{
    *op = 0;
    if (w->size == 1) {
        if (send)
            memmove((char *)recv + displs[0], send, counts[0]);
        return MGT_OK;
    }
    struct chan_op *o = op_begin(w, chan, counts, displs, op, "an all-gather");
    if (!o)
        return MGT_ERR_INVALID;
    size_t in = 0;
    for (int r = 0; r < w->size; r++)
        in += r == w->rank ? 0 : counts[r];
    int rc = MPI_Iallgatherv(send ? send : MPI_IN_PLACE, o->counts[w->rank], MPI_BYTE, recv,
                             o->counts, o->displs, MPI_BYTE, w->chan[chan]->comm, &o->req);
    if (rc != MPI_SUCCESS)
        return mpi_error(rc, "MPI_Iallgatherv");
    op_link(w, chan, o, in);
    return MGT_OK;
}

uint64_t mgt_world_chan_bytes_in(const mgt_world *w)
{
    uint64_t sum = 0;
    for (int i = 0; w && i < w->nchan; i++)
        sum += atomic_load(&w->chan[i]->bytes_in);
    return sum;
}

mgt_status mgt_world_chan_wait(mgt_world *w, int chan, int op, const mgt_abort *abort)
{
    if (w->size == 1)
        return MGT_OK;
    if (chan < 0 || chan >= w->nchan || op < 0 || op >= MGT_WORLD_CHAN_OPS ||
        !w->chan[chan]->ops[op].busy)
        return mgt_error_set(MGT_ERR_INVALID, "world: channel %d has no operation %d", chan, op);
    struct chan_op *o = &w->chan[chan]->ops[op];
    mgt_status st = wait_req(w, &o->req, abort, false, "exchange of a shard");
    /* the link model: what shared memory did faster is slept off, in slices that the abort
       flag and another node's failure end */
    while (st == MGT_OK) {
        double left = o->link_end - mgt_time_now();
        if (left <= 0)
            break;
        if (mgt_abort_is_raised(abort))
            st = mgt_error_set(MGT_ERR_ABORTED, "MPI: exchange of a shard aborted");
        else if (atomic_load(&w->remote_failed))
            st = mgt_error_set(MGT_ERR_ABORTED, "MPI: exchange of a shard: another node failed");
        left = left > 5e-3 ? 5e-3 : left;
        if (st == MGT_OK)
            nanosleep(&(struct timespec){0, (long)(left * 1e9)}, NULL);
    }
    if (st == MGT_OK)
        o->busy = false; /* a failed one stays busy: its arrays are MPI's */
    return st;
}

void mgt_world_notify_failure(mgt_world *w, const char *text)
{
    if (!w || !w->mpi || w->size == 1 || atomic_load(&w->remote_failed) || w->notified)
        return;
    w->notified = true;
    char *msg = w->fail_out; /* the world's: a send not done within the second goes on */
    snprintf(msg, FAIL_TEXT, "%s", text);
    MPI_Request *reqs = calloc((size_t)w->size, sizeof *reqs);
    if (!reqs)
        return;
    int n = 0;
    for (int r = 0; r < w->size; r++)
        if (r != w->rank)
            MPI_Isend(msg, FAIL_TEXT, MPI_CHAR, r, TAG_FAIL, w->ctrl, &reqs[n++]);
    double start = mgt_time_now();
    int done = 0;
    while (!done && mgt_time_now() - start < 1.0) {
        MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    for (int i = 0; i < n && !done; i++) /* left to complete on their own */
        if (reqs[i] != MPI_REQUEST_NULL)
            MPI_Request_free(&reqs[i]);
    free(reqs);
}

bool mgt_world_poll_failure(mgt_world *w, char *text, size_t cap)
{
    if (!w || !poll_fail(w))
        return false;
    snprintf(text, cap, "%s", w->fail_text);
    return true;
}

void mgt_world_stop_propose(mgt_world *w, long step)
{
    if (!w || !w->mpi || w->stop_proposed)
        return;
    w->stop_proposed = true;
    w->stop_requested = true;
    w->stop_count++;
    if (step > w->stop_max)
        w->stop_max = step;
    /* small eager messages: the sends complete at once, the buffer stays alive in w */
    w->stop_out = step;
    for (int r = 0; r < w->size; r++)
        if (r != w->rank) {
            MPI_Request req;
            MPI_Isend(&w->stop_out, 1, MPI_LONG, r, TAG_STOP, w->ctrl, &req);
            MPI_Request_free(&req);
        }
}

bool mgt_world_stop_poll(mgt_world *w, bool *requested, long *agreed)
{
    *requested = false;
    if (!w || !w->mpi)
        return false;
    for (;;) {
        int done = 0;
        if (w->stop_req == MPI_REQUEST_NULL)
            break;
        MPI_Test(&w->stop_req, &done, MPI_STATUS_IGNORE);
        if (!done)
            break;
        w->stop_requested = true;
        w->stop_count++;
        if (w->stop_in > w->stop_max)
            w->stop_max = w->stop_in;
        MPI_Irecv(&w->stop_in, 1, MPI_LONG, MPI_ANY_SOURCE, TAG_STOP, w->ctrl, &w->stop_req);
    }
    *requested = w->stop_requested;
    if (w->stop_proposed && w->stop_count >= w->size) {
        *agreed = w->stop_max;
        return true;
    }
    return false;
}
