/* The backend table behind mgt/device.h and the handle structs the dispatch layer shares
   with backends. Only src/device/ includes this. */
#ifndef MGT_DEVICE_BACKEND_H
#define MGT_DEVICE_BACKEND_H

#include <pthread.h>
#include <stdatomic.h>

#include "device/op.h"
#include "mgt/device.h"
#include "mgt/thread.h"

typedef enum mgt_copy_kind {
    MGT_COPY_H2D,
    MGT_COPY_D2H,
    MGT_COPY_D2D,
} mgt_copy_kind;

/* A backend fills one `static const` table. Entries marked (optional) may be NULL: the
   dispatch layer (device.c) then supplies the default named beside them. Every entry is
   called with arguments already checked (non-NULL handles, positive sizes, a stream and an
   event on the right devices). Enqueueing entries return at once. */
typedef struct mgt_backend_i {
    const char *name; /* "mock", "cuda" */
    bool host_memory; /* device memory is host memory, which host threads may use once events
                         order them (mgt_devset_host_memory) */
    /* how many devices of this kind the machine has; 0 when none can be used */
    int (*device_count)(void);
    /* (optional) the count, or a failure saying why none can be used; NULL: device_count */
    mgt_status (*probe)(int *count);
    /* (optional) the libraries this backend runs on, as loaded; NULL: "" */
    void (*versions)(char *text, size_t cap);
    /* opens set->n devices: fills each device's name, total_mem and impl, set->impl; opts->mock
       is never NULL (the dispatch layer resolves MGT_MOCK and the defaults) */
    mgt_status (*devset_open)(mgt_devset *set, const int *ids, const mgt_devset_options *opts);
    /* frees what devset_open made; streams and events are gone already. The device memory of
       a device marked keep_memory stays allocated (MPI may still use it) and reachable. */
    void (*devset_close)(mgt_devset *set);
    /* whether device i reaches device j directly (peer access verified where it matters) */
    bool (*can_access_peer)(const mgt_devset *set, int i, int j);

    /* device memory; accounting and the limit are the dispatch layer's */
    mgt_status (*alloc)(mgt_device *d, size_t bytes, void **ptr);
    /* called once no queued work can use the block (the dispatch layer defers frees until
       every stream of the set has passed them): frees at once, never waits */
    void (*free)(mgt_device *d, void *ptr);
    /* (optional) the program freed the block: ops enqueued from now on may not name it,
       though queued work still uses it until free is called */
    void (*retire)(mgt_device *d, void *ptr);
    mgt_status (*host_alloc)(mgt_device *d, size_t bytes, void **ptr); /* pinned */
    void (*host_free)(mgt_device *d, void *ptr);

    mgt_status (*stream_create)(mgt_stream *s); /* fills s->impl */
    /* after its work has run, or after a wait for it ran past the set's wait limit (a hung
       kernel): then it ends what it can and frees the stream without waiting again */
    void (*stream_destroy)(mgt_stream *s);
    /* Every wait leaves with MGT_ERR_ABORTED soon after `abort` (NULL: never) is raised, and
       with MGT_ERR_TIMEOUT once it has waited set->wait_limit_s. */
    mgt_status (*stream_synchronize)(mgt_stream *s, const mgt_abort *abort);
    mgt_status (*device_synchronize)(mgt_device *d, const mgt_abort *abort);

    mgt_status (*event_create)(mgt_event *e); /* fills e->impl; e->timing says if it keeps time */
    void (*event_destroy)(mgt_event *e);
    mgt_status (*event_record)(mgt_event *e, mgt_stream *s);
    mgt_status (*stream_wait_event)(mgt_stream *s, mgt_event *e);
    mgt_status (*event_synchronize)(mgt_event *e, const mgt_abort *abort);
    mgt_status (*event_query)(mgt_event *e, bool *done);
    mgt_status (*event_elapsed_ms)(mgt_event *start, mgt_event *end, float *ms);
    /* (optional) whether the latest record has run, and ran on a sound device (see
       mgt_event_outcome); NULL: never known */
    bool (*event_outcome)(mgt_event *e, bool *clean);

    mgt_status (*memset)(mgt_stream *s, void *dst, int value, size_t bytes);
    mgt_status (*copy)(mgt_stream *s, mgt_copy_kind kind, void *dst, const void *src, size_t bytes);
    /* a direct copy between devices that can_access_peer allows, enqueued on s (the
       destination's stream); ordering with the source stream is the dispatch layer's */
    mgt_status (*copy_peer)(mgt_stream *s, void *dst, mgt_device *src_dev, const void *src,
                            size_t bytes);

    /* (optional) the layout activations are best kept in between this device's ops (see
       mgt_device_act_layout); NULL: NCHW */
    mgt_layout (*act_layout)(const mgt_device *d);
    /* (optional) how activations are stored between this device's ops under mixed precision
       `amp` (see mgt_device_act_dtype); NULL: fp32 */
    mgt_precision (*act_dtype)(const mgt_device *d, mgt_precision amp);
    /* (optional) whether launch can run this op; NULL: every op */
    bool (*supports_op)(mgt_device *d, const mgt_op *op);
    /* enqueues one checked kernel */
    mgt_status (*launch)(mgt_stream *s, const mgt_op *op);
    /* (optional, both or none) the per-op profile (mgt_device_op_profile): start counting
       from zero or stop; each op kind's kernel seconds, calls and flops (mgt_op_flops) so far,
       arrays of MGT_OP_COUNT. NULL: the backend does not measure them. */
    void (*op_profile)(mgt_device *d, bool on);
    void (*op_times)(const mgt_device *d, double *seconds, long *calls, double *flops);

    /* (optional, all four or none) a collective across processes (NCCL on CUDA): one
       communicator per device, made from an id that one rank creates and every rank gets
       (through the world); NULL: none, callers stage through host memory */
    mgt_status (*xcomm_id)(void *id, size_t cap, size_t *len);
    mgt_status (*xcomm_create)(mgt_device *d, const void *id, size_t len, int nranks, int rank,
                               void **comm);
    /* enqueued on s: recv gets rank r's n floats at r * n */
    mgt_status (*xcomm_allgather)(void *comm, mgt_stream *s, const float *send, float *recv,
                                  size_t n);
    void (*xcomm_free)(void *comm);
    /* (optional, with the four above) enqueued on s: rank p gets counts[p] floats at send +
       displs[p]; recv + r * stride gets rank r's `each` floats for this rank (one entry per
       rank in counts and displs) */
    mgt_status (*xcomm_alltoall)(void *comm, mgt_stream *s, const float *send, const size_t *counts,
                                 const size_t *displs, float *recv, size_t each, size_t stride);

    /* (optional) the allocations and kernels counted for injected faults (see
       mgt_device_counts); NULL: none kept */
    void (*counts)(const mgt_device *d, long *allocs, long *kernels);
    /* (optional) the device is given up (mgt_device_abandon): its queued work is dropped and
       a kernel that never returns is left behind, so that no stream of another device and no
       host thread waits on it any more; never blocks. NULL: nothing can be done */
    void (*abandon)(mgt_device *d, const char *why);
    /* (optional) how long the kernel or copy that has run longest on one of the device's
       streams, still running, has run, in seconds; 0 when none runs (a stream waiting for
       another's event does not count: that stall is the other's). NULL: unknown */
    double (*busy_s)(const mgt_device *d);
} mgt_backend_i;

struct mgt_device {
    mgt_devset *set;
    int index;               /* position in the set */
    int id;                  /* the id it was opened with */
    char name[128];          /* filled by the backend */
    size_t total_mem;        /* the limit; filled by the backend, lowered by a mock limit */
    atomic_size_t used;      /* bytes of live buffers and backend workspace */
    atomic_bool stalled;     /* a wait on it ran past the wait limit: later ones give up at once */
    atomic_bool keep_memory; /* mgt_device_keep_memory: buffers freed are not given back */
    /* mgt_device_abandon: given up for good (why: its text, written before the flag is set) */
    atomic_bool abandoned;
    char abandon_why[200];
    /* mgt_device_strand: a host thread may still be inside a call on it, so nothing that call
       can reach is freed (its handles, the set, the backend's state for it) */
    atomic_bool stranded;
    void *impl;
};

struct mgt_devset {
    const mgt_backend_i *iface;
    mgt_device_kind kind;
    int n;
    mgt_device *devs; /* n of them */
    bool no_p2p;      /* every pair staged, whatever the backend allows */
    void *impl;
    void *staging; /* the dispatch layer's pinned staging for peer-less pairs */
    /* set once mgt_devset_open has made everything the set itself holds (the staging): the
       allocations its users make from then on are the ones injected faults count */
    atomic_bool open;
    /* every live stream, event and buffer of the set, so that mgt_devset_free can free what
       its users left behind */
    pthread_mutex_t reg_lock;
    mgt_stream *streams;
    mgt_event *events;
    mgt_buffer *buffers;
    /* buffers freed while queued work may still use them (device.c), under defer_lock */
    pthread_mutex_t defer_lock;
    struct mgt_deferred_free *deferred;
    /* mgt_devset_set_waits: the longest any wait may take, what set it (the flag a message
       names), and the abort flag of the waits a backend makes inside a call (borrowed; NULL:
       none) */
    double wait_limit_s;
    char wait_source[40];
    const mgt_abort *watch;
};

struct mgt_stream {
    mgt_device *dev;
    void *impl;
    pthread_mutex_t aux_lock; /* guards aux, the dispatch layer's event for peer copies */
    mgt_event *aux;
    atomic_int pins; /* buffer frees recording on this stream now: its free waits them out */
    mgt_stream *reg_prev, *reg_next;
};

struct mgt_event {
    mgt_device *dev;
    void *impl;
    bool timing; /* false: ordering only (no timestamp; elapsed_ms refuses it) */
    mgt_event *reg_prev, *reg_next;
};

struct mgt_buffer {
    mgt_device *dev;
    void *ptr;
    size_t size;
    mgt_buffer *reg_prev, *reg_next;
};

/* Counts bytes against a device's limit; MGT_ERR_OOM (with text naming the device and the
   sizes) when they would pass it. Backends use it for workspace they keep. */
mgt_status mgt_device_reserve(mgt_device *d, size_t bytes, const char *what);
void mgt_device_unreserve(mgt_device *d, size_t bytes);

/* The backends this build has; mgt_backend_cuda() returns NULL in a build without CUDA. */
const mgt_backend_i *mgt_backend_mock(void);
const mgt_backend_i *mgt_backend_cuda(void);
/* The byte model's devices (trace.c), opened by mgt_devset_open_bytes only; layout, act and
   run as there. */
const mgt_backend_i *mgt_backend_trace(void);
void mgt_trace_set_mode(mgt_devset *set, mgt_layout layout, mgt_precision act, bool run);

#endif
