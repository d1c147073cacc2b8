/* The CUDA backend's table: maps mgt_backend_i onto the CUDA C++ code behind cuda_impl.h. */
#include <sched.h>
#include <stdlib.h>
#include <time.h>

#include "device/backend.h"
#include "device/bytes.h"
#include "device/cuda/cuda_impl.h"

/* ---- waits ----
   A host wait polls (cudaStreamQuery / cudaEventQuery) instead of blocking in the driver,
   so that a raised abort flag is seen. It yields for the first polls (most GPU waits in a
   step are short and a sleep would add its own latency), then sleeps with a growing pause
   capped at half a millisecond, well inside MGT_WAIT_SLICE_MS. No wait outlasts the set's
   wait limit (mgt_devset_set_waits): a hung kernel ends in MGT_ERR_TIMEOUT, not a hang. */

typedef mgt_status (*poll_fn)(void *h, int *done);

static mgt_status poll_wait(poll_fn poll, void *h, const mgt_abort *abort, const mgt_device *d,
                            const char *what)
{
    long pause_ns = 2000;
    const double t0 = mgt_time_now(), limit = d->set->wait_limit_s;
    for (int polls = 0;; polls++) {
        int done = 0;
        mgt_status st = poll(h, &done);
        if (st != MGT_OK)
            return st;
        if (done)
            return MGT_OK;
        if (mgt_abort_is_raised(abort))
            return mgt_error_set(MGT_ERR_ABORTED, "%s: wait for %s left: abort raised", d->name,
                                 what);
        if (mgt_time_now() - t0 > limit)
            return mgt_error_set(MGT_ERR_TIMEOUT,
                                 "%s: a wait for %s ran past the wait limit of %g s (%s): "
                                 "its queued work has stopped making progress (a hung kernel?)",
                                 d->name, what, limit, d->set->wait_source);
        if (polls < 64) {
            sched_yield();
            continue;
        }
        struct timespec ts = {0, pause_ns};
        nanosleep(&ts, NULL);
        if (pause_ns < 500000)
            pause_ns *= 2;
    }
}

/* mgt_device_abandon on CUDA. A running kernel cannot be stopped, and a context with a sticky
   error or a hung kernel may block any call that synchronizes with it (cudaFree,
   cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize; cudaDeviceReset, which
   would also pull the context from under every other thread of the process, is never used).
   So a device given up is not touched again: every call on it fails at once with this text,
   its frees and destroys are skipped (its memory stays allocated until the process ends), and
   the set's close leaves it as it is. The other devices' contexts go on; in a set opened for
   --on-device-failure continue, every wait their streams have queued on its events passes and
   no copy reads its memory any more (mgt_cuda_dev_release, survive.cu). */
static mgt_status given_up(const mgt_device *d)
{
    return mgt_error_set(MGT_ERR_DEVICE, "%s: %s (given up: not touched again)", d->name,
                         d->abandon_why);
}

#define GIVEN_UP(d)                       \
    do {                                  \
        if (atomic_load(&(d)->abandoned)) \
            return given_up(d);           \
    } while (0)

static void cuda_abandon(mgt_device *d, const char *why)
{
    (void)why; /* mgt_device_abandon has set the flag every entry below checks */
    if (d->impl)
        mgt_cuda_dev_release(d->impl);
}

static mgt_status poll_stream(void *h, int *done) { return mgt_cuda_stream_query(h, done); }
static mgt_status poll_event(void *h, int *done) { return mgt_cuda_event_query(h, done); }
static mgt_status poll_device(void *h, int *done) { return mgt_cuda_dev_query(h, done); }

/* ---- devices ---- */

static mgt_status reserve_hook(void *owner, size_t bytes, const char *what)
{
    return mgt_device_reserve(owner, bytes, what);
}

static void unreserve_hook(void *owner, size_t bytes) { mgt_device_unreserve(owner, bytes); }

/* The backend's own waits inside a call: the run's abort flag and the wait limit. */
static mgt_status wait_hook(void *owner, mgt_cuda_stream *s, const char *what)
{
    mgt_device *d = owner;
    if (atomic_load(&d->stalled))
        return mgt_error_set(MGT_ERR_TIMEOUT, "%s: stalled: an earlier wait ran out", d->name);
    mgt_status st = poll_wait(poll_stream, s, d->set->watch, d, what);
    if (st == MGT_ERR_TIMEOUT)
        atomic_store(&d->stalled, true);
    return st;
}

static int cuda_device_count(void) { return mgt_cuda_device_count(); }

static mgt_status cuda_devset_open(mgt_devset *set, const int *ids, const mgt_devset_options *opts)
{
    const mgt_cuda_flags flags = {opts->no_p2p, opts->tf32, opts->deterministic, opts->recoverable};
    static const mgt_cuda_hooks hooks = {reserve_hook, unreserve_hook, wait_hook};
    void **owners = malloc((size_t)set->n * sizeof *owners);
    if (owners == NULL)
        return mgt_error_set(MGT_ERR_OOM, "cuda: out of host memory opening %d device(s)", set->n);
    for (int i = 0; i < set->n; i++)
        owners[i] = &set->devs[i];
    mgt_cuda_set *impl = NULL;
    mgt_status st = mgt_cuda_set_open(ids, set->n, &flags, &hooks, owners, &impl);
    free(owners);
    if (st != MGT_OK)
        return st;
    for (int i = 0; i < set->n; i++) {
        mgt_device *d = &set->devs[i];
        d->impl = mgt_cuda_set_dev(impl, i);
        mgt_cuda_dev_describe(d->impl, d->name, sizeof d->name, &d->total_mem);
    }
    set->impl = impl;
    return MGT_OK;
}

static void cuda_devset_close(mgt_devset *set)
{
    /* bounded here, not in cudaDeviceSynchronize: a hung kernel leaves its memory unfreed
       (the process is ending or the GPU needs a reset) instead of hanging the close */
    bool drained = true, stranded = false;
    bool *keep = calloc((size_t)set->n, sizeof *keep);
    for (int i = 0; i < set->n; i++) {
        mgt_device *d = &set->devs[i];
        if (atomic_load(&d->stalled) || atomic_load(&d->abandoned) ||
            poll_wait(poll_device, d->impl, NULL, d, "the device's streams") == MGT_ERR_TIMEOUT)
            drained = false;
        /* a host thread stuck in a call on it may come back: its replica's state stays (with
           no room for the list, every replica's does) */
        bool k = atomic_load(&d->stranded);
        stranded = stranded || k;
        if (keep)
            keep[i] = k;
    }
    if (stranded && !keep) {
        set->impl = NULL; /* left allocated, unreachable: nothing is freed under the call */
        return;
    }
    mgt_cuda_set_close(set->impl, drained, keep);
    if (!stranded)
        set->impl = NULL; /* else kept with the set (mgt_devset_free) */
    for (int i = 0; i < set->n; i++)
        if (!keep || !keep[i])
            set->devs[i].impl = NULL;
    free(keep);
}

static bool cuda_can_access_peer(const mgt_devset *set, int i, int j)
{
    return mgt_cuda_set_peer(set->impl, i, j) != 0;
}

/* ---- memory ---- */

static mgt_status cuda_alloc(mgt_device *d, size_t bytes, void **ptr)
{
    GIVEN_UP(d);
    return mgt_cuda_alloc(d->impl, bytes, ptr);
}

static void cuda_free(mgt_device *d, void *ptr)
{
    if (!atomic_load(&d->abandoned))
        mgt_cuda_free(d->impl, ptr);
}

static mgt_status cuda_host_alloc(mgt_device *d, size_t bytes, void **ptr)
{
    GIVEN_UP(d);
    return mgt_cuda_host_alloc(d->impl, bytes, ptr);
}

static void cuda_host_free(mgt_device *d, void *ptr)
{
    if (!atomic_load(&d->abandoned))
        mgt_cuda_host_free(d->impl, ptr);
}

/* ---- streams and events ---- */

static mgt_status cuda_stream_create(mgt_stream *s)
{
    GIVEN_UP(s->dev);
    mgt_cuda_stream *impl = NULL;
    mgt_status st = mgt_cuda_stream_create(s->dev->impl, &impl);
    if (st == MGT_OK)
        s->impl = impl;
    return st;
}

static void cuda_stream_destroy(mgt_stream *s)
{
    if (!atomic_load(&s->dev->abandoned))
        mgt_cuda_stream_destroy(s->impl);
    s->impl = NULL;
}

static mgt_status cuda_stream_synchronize(mgt_stream *s, const mgt_abort *abort)
{
    GIVEN_UP(s->dev);
    return poll_wait(poll_stream, s->impl, abort, s->dev, "a stream");
}

static mgt_status cuda_device_synchronize(mgt_device *d, const mgt_abort *abort)
{
    GIVEN_UP(d);
    return poll_wait(poll_device, d->impl, abort, d, "the device's streams");
}

static mgt_status cuda_event_create(mgt_event *e)
{
    GIVEN_UP(e->dev);
    mgt_cuda_event *impl = NULL;
    mgt_status st = mgt_cuda_event_create(e->dev->impl, e->timing, &impl);
    if (st == MGT_OK)
        e->impl = impl;
    return st;
}

static void cuda_event_destroy(mgt_event *e)
{
    if (!atomic_load(&e->dev->abandoned))
        mgt_cuda_event_destroy(e->impl);
    e->impl = NULL;
}

static mgt_status cuda_event_record(mgt_event *e, mgt_stream *s)
{
    GIVEN_UP(s->dev);
    return mgt_cuda_event_record(e->impl, s->impl);
}

static mgt_status cuda_stream_wait_event(mgt_stream *s, mgt_event *e)
{
    GIVEN_UP(s->dev);
    GIVEN_UP(e->dev); /* its records may never come: a wait on them would block s for good */
    return mgt_cuda_stream_wait_event(s->impl, e->impl);
}

static mgt_status cuda_event_synchronize(mgt_event *e, const mgt_abort *abort)
{
    GIVEN_UP(e->dev);
    return poll_wait(poll_event, e->impl, abort, e->dev, "an event");
}

static mgt_status cuda_event_query(mgt_event *e, bool *done)
{
    *done = false;
    GIVEN_UP(e->dev);
    int d = 0;
    mgt_status st = mgt_cuda_event_query(e->impl, &d);
    *done = d != 0;
    return st;
}

static mgt_status cuda_event_elapsed_ms(mgt_event *start, mgt_event *end, float *ms)
{
    GIVEN_UP(start->dev);
    return mgt_cuda_event_elapsed(start->impl, end->impl, ms);
}

/* ---- copies ---- */

static mgt_status cuda_memset(mgt_stream *s, void *dst, int value, size_t bytes)
{
    GIVEN_UP(s->dev);
    mgt_cuda_note_write(s->dev->impl, dst, bytes);
    return mgt_cuda_memset(s->impl, dst, value, bytes);
}

static mgt_status cuda_copy(mgt_stream *s, mgt_copy_kind kind, void *dst, const void *src,
                            size_t bytes)
{
    GIVEN_UP(s->dev);
    int k = kind == MGT_COPY_H2D   ? MGT_CUDA_COPY_H2D
            : kind == MGT_COPY_D2H ? MGT_CUDA_COPY_D2H
                                   : MGT_CUDA_COPY_D2D;
    if (kind != MGT_COPY_D2H)
        mgt_cuda_note_write(s->dev->impl, dst, bytes);
    return mgt_cuda_copy(s->impl, k, dst, src, bytes);
}

static mgt_status cuda_copy_peer(mgt_stream *s, void *dst, mgt_device *src_dev, const void *src,
                                 size_t bytes)
{
    GIVEN_UP(s->dev);
    GIVEN_UP(src_dev); /* its memory is not read once it is given up */
    mgt_cuda_note_write(s->dev->impl, dst, bytes);
    return mgt_cuda_copy_peer(s->impl, dst, src_dev->impl, src, bytes);
}

/* ---- kernels ---- */

/* One function per row of the op list, cuda_<stem>. */
#define CUDA_OP(KIND, name, args, stem) [MGT_OP_##KIND] = cuda_##stem,
static const mgt_cuda_op_fn cuda_ops[MGT_OP_COUNT] = {MGT_OP_LIST(CUDA_OP)};
#undef CUDA_OP

/* What the kernels here take (device/bytes.h: the byte model refuses the same ops). */
static bool cuda_supports_op(mgt_device *d, const mgt_op *op)
{
    (void)d;
    return (unsigned)op->kind < MGT_OP_COUNT && cuda_ops[op->kind] != NULL && mgt_op_cuda_takes(op);
}

/* Called only for ops cuda_supports_op accepted. A filter copy an op writes over is stale
   (the optimizer's update, a load). */
static mgt_status cuda_launch(mgt_stream *s, const mgt_op *op)
{
    GIVEN_UP(s->dev);
    mgt_status st = mgt_cuda_inject(s->impl);
    if (st != MGT_OK)
        return st;
    mgt_cuda_note_op(s->dev->impl, op);
    if (mgt_op_store16(op) != MGT_PREC_F32)
        return mgt_cuda_store16(s->impl, op);
    return cuda_ops[op->kind](s->impl, op);
}

/* NHWC, for the 16-bit activations a model keeps under --amp (cuDNN's tensor cores take them
   without transposes); the model keeps fp32 ones NCHW (mgt/nn.h). */
static mgt_layout cuda_act_layout(const mgt_device *d)
{
    (void)d;
    return MGT_LAYOUT_NHWC;
}

static mgt_precision cuda_act_dtype(const mgt_device *d, mgt_precision amp)
{
    (void)d;
    return amp;
}

/* ---- across processes ---- */

static mgt_status cuda_xcomm_create(mgt_device *d, const void *id, size_t len, int nranks, int rank,
                                    void **comm)
{
    return mgt_cuda_xcomm_create(d->impl, id, len, nranks, rank, (mgt_cuda_xcomm **)comm);
}

static mgt_status cuda_xcomm_allgather(void *comm, mgt_stream *s, const float *send, float *recv,
                                       size_t n)
{
    return mgt_cuda_xcomm_allgather(comm, s->impl, send, recv, n);
}

static mgt_status cuda_xcomm_alltoall(void *comm, mgt_stream *s, const float *send,
                                      const size_t *counts, const size_t *displs, float *recv,
                                      size_t each, size_t stride)
{
    return mgt_cuda_xcomm_alltoall(comm, s->impl, send, counts, displs, recv, each, stride);
}

static void cuda_xcomm_free(void *comm) { mgt_cuda_xcomm_free(comm); }

static const mgt_backend_i cuda_backend = {
    .name = "cuda",
    .device_count = cuda_device_count,
    .probe = mgt_cuda_probe,
    .versions = mgt_cuda_versions,
    .devset_open = cuda_devset_open,
    .devset_close = cuda_devset_close,
    .can_access_peer = cuda_can_access_peer,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_synchronize = cuda_stream_synchronize,
    .device_synchronize = cuda_device_synchronize,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .stream_wait_event = cuda_stream_wait_event,
    .event_synchronize = cuda_event_synchronize,
    .event_query = cuda_event_query,
    .event_elapsed_ms = cuda_event_elapsed_ms,
    .memset = cuda_memset,
    .copy = cuda_copy,
    .copy_peer = cuda_copy_peer,
    .act_layout = cuda_act_layout,
    .act_dtype = cuda_act_dtype,
    .supports_op = cuda_supports_op,
    .launch = cuda_launch,
    .abandon = cuda_abandon,
#ifdef MGT_HAVE_NCCL
    .xcomm_id = mgt_cuda_xcomm_id,
    .xcomm_create = cuda_xcomm_create,
    .xcomm_allgather = cuda_xcomm_allgather,
    .xcomm_free = cuda_xcomm_free,
    .xcomm_alltoall = cuda_xcomm_alltoall,
#endif
};

const mgt_backend_i *mgt_backend_cuda(void) { return &cuda_backend; }
