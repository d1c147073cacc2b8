/* The byte-model backend: devices that run nothing and count, for every op, copy and memset
   enqueued on them, the bytes the CUDA backend's kernels would move (device/bytes.h). A model
   built on one is planned as a CUDA model is (channels last, the storage `act` under --amp),
   so one training step on it is the op trace of that step on a GPU, without a GPU. Memory is
   address space only (allocations hand out distinct addresses that nothing ever touches),
   unless the set runs its ops: then memory is host memory and every op runs on the reference
   (mgt_ref_run) as it is enqueued, which computes the CUDA plan's numbers on a CPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/backend.h"
#include "device/bytes.h"

enum { ROW_COPY = MGT_OP_COUNT, ROW_MEMSET, N_ROWS };

typedef struct trace_dev {
    pthread_mutex_t lock;
    uintptr_t next; /* the next address handed out */
    mgt_bytes_row rows[N_ROWS];
} trace_dev;

typedef struct trace_set {
    mgt_precision act; /* how activations are stored under --amp: F32 is CUDA's NCHW path */
    bool run;          /* host memory, every op run on the reference */
    mgt_layout layout; /* NHWC as CUDA; NCHW for the same storage in NCHW */
    trace_dev *devs;
} trace_set;

static bool runs(const mgt_device *d) { return ((const trace_set *)d->set->impl)->run; }

static int trace_count(void) { return 1; }

static mgt_status trace_devset_open(mgt_devset *set, const int *ids, const mgt_devset_options *o)
{
    (void)ids;
    (void)o;
    trace_set *ts = calloc(1, sizeof *ts);
    trace_dev *td = calloc((size_t)set->n, sizeof *td);
    if (!ts || !td) {
        free(ts);
        free(td);
        return mgt_error_set(MGT_ERR_OOM, "byte model: host memory exhausted");
    }
    ts->devs = td;
    for (int i = 0; i < set->n; i++) {
        pthread_mutex_init(&td[i].lock, NULL);
        td[i].next = (uintptr_t)1 << 40; /* far from any host pointer, never dereferenced */
        for (int r = 0; r < N_ROWS; r++)
            td[i].rows[r].name = r < MGT_OP_COUNT ? mgt_op_name((mgt_op_kind)r)
                                 : r == ROW_COPY  ? "copy"
                                                  : "memset";
        mgt_device *d = &set->devs[i];
        snprintf(d->name, sizeof d->name, "byte model %d (CUDA's kernels, counted)", i);
        d->total_mem = (size_t)1 << 50;
        d->impl = &td[i];
    }
    set->impl = ts;
    return MGT_OK;
}

static void trace_devset_close(mgt_devset *set)
{
    trace_set *ts = set->impl;
    if (!ts)
        return;
    for (int i = 0; i < set->n; i++)
        pthread_mutex_destroy(&ts->devs[i].lock);
    free(ts->devs);
    free(ts);
}

static bool trace_peer(const mgt_devset *set, int i, int j)
{
    (void)set;
    (void)i;
    (void)j;
    return true;
}

static mgt_status trace_alloc(mgt_device *d, size_t bytes, void **ptr)
{
    if (runs(d)) {
        *ptr = calloc(1, bytes ? bytes : 1);
        return *ptr ? MGT_OK : mgt_error_set(MGT_ERR_OOM, "%s: host memory exhausted", d->name);
    }
    trace_dev *td = d->impl;
    pthread_mutex_lock(&td->lock);
    *ptr = (void *)td->next;
    td->next += (bytes + 255) / 256 * 256 + 256;
    pthread_mutex_unlock(&td->lock);
    return MGT_OK;
}

static void trace_free(mgt_device *d, void *ptr)
{
    if (runs(d))
        free(ptr);
}

static mgt_status trace_host_alloc(mgt_device *d, size_t bytes, void **ptr)
{
    (void)d;
    *ptr = calloc(1, bytes ? bytes : 1);
    return *ptr ? MGT_OK : mgt_error_set(MGT_ERR_OOM, "byte model: host memory exhausted");
}

static void trace_host_free(mgt_device *d, void *ptr)
{
    (void)d;
    free(ptr);
}

static mgt_status trace_stream_create(mgt_stream *s)
{
    s->impl = s->dev->impl;
    return MGT_OK;
}

static void trace_stream_destroy(mgt_stream *s) { (void)s; }

static mgt_status trace_stream_sync(mgt_stream *s, const mgt_abort *abort)
{
    (void)s;
    (void)abort;
    return MGT_OK;
}

static mgt_status trace_dev_sync(mgt_device *d, const mgt_abort *abort)
{
    (void)d;
    (void)abort;
    return MGT_OK;
}

static mgt_status trace_event_create(mgt_event *e)
{
    e->impl = e->dev->impl;
    return MGT_OK;
}

static void trace_event_destroy(mgt_event *e) { (void)e; }

static mgt_status trace_event_record(mgt_event *e, mgt_stream *s)
{
    (void)e;
    (void)s;
    return MGT_OK;
}

static mgt_status trace_wait_event(mgt_stream *s, mgt_event *e)
{
    (void)s;
    (void)e;
    return MGT_OK;
}

static mgt_status trace_event_sync(mgt_event *e, const mgt_abort *abort)
{
    (void)e;
    (void)abort;
    return MGT_OK;
}

static mgt_status trace_event_query(mgt_event *e, bool *done)
{
    (void)e;
    *done = true;
    return MGT_OK;
}

static mgt_status trace_elapsed(mgt_event *start, mgt_event *end, float *ms)
{
    (void)start;
    (void)end;
    *ms = 0.0f;
    return MGT_OK;
}

static void tally(mgt_stream *s, int row, const mgt_op_bytes *b)
{
    trace_dev *td = s->dev->impl;
    pthread_mutex_lock(&td->lock);
    mgt_bytes_row *r = &td->rows[row];
    r->calls++;
    r->passes += b->passes;
    r->read += b->read;
    r->written += b->written;
    r->convert += b->convert;
    pthread_mutex_unlock(&td->lock);
}

static mgt_status trace_memset(mgt_stream *s, void *dst, int value, size_t bytes)
{
    if (runs(s->dev))
        memset(dst, value, bytes);
    tally(s, ROW_MEMSET, &(mgt_op_bytes){.written = (double)bytes, .passes = 1});
    return MGT_OK;
}

/* Device memory is not there to read: what comes back to the host is zeros. */
static mgt_status trace_copy(mgt_stream *s, mgt_copy_kind kind, void *dst, const void *src,
                             size_t bytes)
{
    if (runs(s->dev))
        memmove(dst, src, bytes);
    else if (kind == MGT_COPY_D2H)
        memset(dst, 0, bytes);
    /* the device's side of it: a host buffer is not device memory */
    double r = kind == MGT_COPY_H2D ? 0.0 : (double)bytes;
    double w = kind == MGT_COPY_D2H ? 0.0 : (double)bytes;
    tally(s, ROW_COPY, &(mgt_op_bytes){.read = r, .written = w, .passes = 1});
    return MGT_OK;
}

static mgt_status trace_copy_peer(mgt_stream *s, void *dst, mgt_device *src_dev, const void *src,
                                  size_t bytes)
{
    (void)src_dev;
    if (runs(s->dev))
        memmove(dst, src, bytes);
    tally(s, ROW_COPY, &(mgt_op_bytes){.written = (double)bytes, .passes = 1});
    return MGT_OK;
}

static mgt_layout trace_act_layout(const mgt_device *d)
{
    return ((const trace_set *)d->set->impl)->layout;
}

static mgt_precision trace_act_dtype(const mgt_device *d, mgt_precision amp)
{
    const trace_set *ts = d->set->impl;
    return ts->act == MGT_PREC_F32 ? MGT_PREC_F32 : amp;
}

static bool trace_supports(mgt_device *d, const mgt_op *op)
{
    (void)d;
    return mgt_op_cuda_takes(op);
}

static mgt_status trace_launch(mgt_stream *s, const mgt_op *op)
{
    mgt_op_bytes b;
    mgt_op_bytes_cuda(op, &b);
    tally(s, (int)op->kind, &b);
    return runs(s->dev) ? mgt_ref_run(op) : MGT_OK;
}

static const mgt_backend_i trace_backend = {
    .name = "byte model",
    .host_memory = false,
    .device_count = trace_count,
    .devset_open = trace_devset_open,
    .devset_close = trace_devset_close,
    .can_access_peer = trace_peer,
    .alloc = trace_alloc,
    .free = trace_free,
    .host_alloc = trace_host_alloc,
    .host_free = trace_host_free,
    .stream_create = trace_stream_create,
    .stream_destroy = trace_stream_destroy,
    .stream_synchronize = trace_stream_sync,
    .device_synchronize = trace_dev_sync,
    .event_create = trace_event_create,
    .event_destroy = trace_event_destroy,
    .event_record = trace_event_record,
    .stream_wait_event = trace_wait_event,
    .event_synchronize = trace_event_sync,
    .event_query = trace_event_query,
    .event_elapsed_ms = trace_elapsed,
    .memset = trace_memset,
    .copy = trace_copy,
    .copy_peer = trace_copy_peer,
    .act_layout = trace_act_layout,
    .act_dtype = trace_act_dtype,
    .supports_op = trace_supports,
    .launch = trace_launch,
};

const mgt_backend_i *mgt_backend_trace(void) { return &trace_backend; }

void mgt_trace_set_mode(mgt_devset *set, mgt_layout layout, mgt_precision act, bool run)
{
    trace_set *ts = set->impl;
    ts->layout = layout;
    ts->act = act;
    ts->run = run;
}

int mgt_device_bytes_rows(const mgt_device *d, mgt_bytes_row *rows, int cap)
{
    if (d->set->iface != &trace_backend)
        return 0;
    trace_dev *td = d->impl;
    int n = 0;
    pthread_mutex_lock(&td->lock);
    for (int r = 0; r < N_ROWS; r++)
        if (td->rows[r].calls > 0) {
            if (n < cap)
                rows[n] = td->rows[r];
            n++;
        }
    pthread_mutex_unlock(&td->lock);
    return n;
}

void mgt_device_bytes_reset(mgt_device *d)
{
    if (d->set->iface != &trace_backend)
        return;
    trace_dev *td = d->impl;
    pthread_mutex_lock(&td->lock);
    for (int r = 0; r < N_ROWS; r++) {
        td->rows[r].calls = td->rows[r].passes = 0;
        td->rows[r].read = td->rows[r].written = td->rows[r].convert = 0.0;
    }
    pthread_mutex_unlock(&td->lock);
}
