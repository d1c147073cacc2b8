/* The device interface: devices, streams, events, memory, copies and the kernels a ResNet needs.
 *
 * The same calls run on CPU mock devices and on CUDA. Work is enqueued on a stream and runs
 * later, in order; the host waits only through the *_synchronize calls, each of which can be
 * left by raising an abort flag. Pointers handed to the kernel and copy calls are device
 * pointers (mgt_buffer_ptr plus an offset) unless named host_*. All tensors are fp32, NCHW,
 * row-major, densely packed. Parameter-gradient outputs accumulate (+=), as PyTorch's do;
 * other outputs are overwritten unless a `beta` says otherwise.
 *
 * Errors: a call that is refused at once returns its status with the reason in
 * mgt_error_last(). A failure while the work runs (a kernel, an injected fault) is sticky on
 * that device, as CUDA's are: later calls and waits on the device return MGT_ERR_DEVICE with
 * text naming the device and the op.
 */
#ifndef MGT_DEVICE_H
#define MGT_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mgt/status.h"

#define MGT_MAX_DEVICES 64

typedef struct mgt_devset mgt_devset; /* the devices of one run, opened together */
typedef struct mgt_device mgt_device; /* borrowed from its devset */
typedef struct mgt_stream mgt_stream; /* an in-order queue of work on one device */
typedef struct mgt_event mgt_event;   /* a marker in a stream that others can wait for */
typedef struct mgt_buffer mgt_buffer; /* one allocation of device memory */
/* The abort flag of the waits below (mgt/thread.h). Only declared here, so that this header
   pulls in neither pthread nor stdatomic and compiles as C++ for the CUDA backend. */
typedef struct mgt_abort mgt_abort;

typedef enum mgt_device_kind {
    MGT_DEVICE_AUTO, /* CUDA where a GPU is usable, mock devices otherwise */
    MGT_DEVICE_MOCK,
    MGT_DEVICE_CUDA,
} mgt_device_kind;

typedef enum mgt_peer_mode {
    MGT_PEER_ALL,  /* every pair has direct access (the default) */
    MGT_PEER_NONE, /* every peer copy is staged through pinned host memory */
    MGT_PEER_LIST, /* only the pairs set in `peer` (both directions of each listed pair) */
} mgt_peer_mode;

typedef enum mgt_fault_kind {
    MGT_FAULT_NONE,
    MGT_FAULT_ALLOC,  /* the Nth buffer allocation on the device fails with MGT_ERR_OOM */
    MGT_FAULT_KERNEL, /* the Nth kernel run on the device fails, sticky, MGT_ERR_DEVICE */
    MGT_FAULT_HANG,   /* the Nth kernel never finishes (until its stream is freed): a hung GPU */
    MGT_FAULT_LOWP,   /* the Nth, N+1th, ... 16-bit convolution attempts are refused */
    MGT_FAULT_PEER,   /* the Nth peer copy into the device fails, sticky, MGT_ERR_DEVICE */
    MGT_FAULT_GONE,   /* at the Nth kernel the device disappears: every later call fails */
    MGT_FAULT_STUCK,  /* the host call launching the Nth kernel does not return while its set
                         is open (a thread stuck in the driver, past any abort flag or wait
                         limit); it comes back, failing, once the set has been freed */
} mgt_fault_kind;

#define MGT_MOCK_MAX_REFUSALS 8
#define MGT_MOCK_MAX_FAULTS 4 /* fault= items of one spec, each on its own device */

/* One injected fault (fault=KIND@D:N[:...]). */
typedef struct mgt_mock_fault {
    mgt_fault_kind kind;
    int device;
    long nth;
    char op[32];                         /* "" or the op name the kernel or hang fault counts */
    int refusals[MGT_MOCK_MAX_REFUSALS]; /* fault=lowp's reasons, in order */
    int nrefusals;
} mgt_mock_fault;

/* How mock devices behave. Spelled as a string in the MGT_MOCK environment variable and in
   the --mock flag, items separated by ';' (see mgt_mock_options_parse):
     threads=N           compute threads per device (default: cores / devices, at least 1)
     mem=SIZE            memory per device, e.g. 512M, 8G (default: the machine's memory)
     peers=all|none|0-1,2-3   which pairs reach each other directly (ids of opened devices)
     fault=alloc@D:N     the Nth allocation on device D, of its memory or of pinned host
                         memory, fails (N counts from 1, from when the set is open; D opened)
     fault=kernel@D:N    the Nth kernel on device D fails
     fault=kernel@D:N:OP the Nth OP kernel (an op name, e.g. axpy, sgd_update) on D fails
     fault=hang@D:N[:OP] the Nth kernel (of OP) on D never finishes: waits on it run into
                         their abort flag or the set's wait limit; freeing its stream ends it
                         (the device is then failed, as a GPU reset would leave it)
     fault=peer@D:N      the Nth direct peer copy into device D (run on D's stream) fails
                         when it runs; the failure is sticky for D, as a kernel fault's
     fault=gone@D:N      device D disappears at its Nth kernel, as a GPU that fell off the
                         bus: that kernel and every later call on D (allocations, streams,
                         events, copies, waits) fail, and a peer copy out of D's memory by
                         another device reads all-one bytes, as a PCIe read of a missing
                         device does (NaN floats), without failing the reader
     (up to 4 fault= items, each on its own device)
     fault=lowp@D:N:R1,R2,...  the Nth 16-bit convolution that D's native 16-bit kernel is
                         asked to run is refused for reason R1, the next for R2, ...: one of
                         no_kernel, bad_param, no_memory, broken, fault (what cuDNN's statuses
                         come to on CUDA); a shape refused for good is not asked again
     delay=USEC          a random delay of 0..USEC microseconds before every queued op
     seed=N              seed of the delays
     link=BW,LAT         direct peer copies take LAT + bytes/BW, e.g. link=25GB/s,10us
                         (BW in B, KB, MB or GB per second; LAT in us or ms)
     xlink=BW,LAT        the link between nodes of a multi-node run, one per device
                         (mgt/world.h): a collective bringing a node b bytes takes
                         (nodes - 1) x LAT + b / BW once the link is free
     conv=onednn|im2col  convolutions on oneDNN's direct kernels (default) or on the
                         im2col + gemm path
     layout=blocked|nchw activations kept in oneDNN's nChw16c between ops where a model can
                         (default with conv=onednn) or NCHW throughout; mgtrain's commands pick
                         NCHW where the spec names no layout and the CPU lacks AVX-512F
                         (mgt_mock_options_pick_layout) */
typedef struct mgt_mock_options {
    int threads_per_device;
    size_t mem_limit;
    mgt_peer_mode peer_mode;
    unsigned char peer[MGT_MAX_DEVICES][MGT_MAX_DEVICES];
    mgt_mock_fault fault[MGT_MOCK_MAX_FAULTS];
    int nfaults;
    unsigned delay_us;
    uint64_t seed;
    double link_bytes_per_s; /* 0: peer copies at memcpy speed */
    double link_latency_s;
    bool conv_im2col;         /* conv=im2col: convolutions on im2col + gemm instead of oneDNN */
    bool layout_nchw;         /* layout=nchw: activations kept NCHW between ops (conv=im2col too) */
    bool layout_blocked;      /* layout=blocked: named, so mgt_mock_options_pick_layout keeps it */
    double xlink_bytes_per_s; /* xlink=: 0, no inter-node link model */
    double xlink_latency_s;
} mgt_mock_options;

/* Zeroes *o (all defaults) and then applies `spec` (NULL or "" leave the defaults). A bad
   item is MGT_ERR_INVALID with text that quotes it and says why ("'mem=abc': expected a size
   such as 512M or 8G"); the caller puts where the spec came from in front (mgt_error_wrap
   with "--mock" or "MGT_MOCK"). An op name in fault=kernel@D:N:OP must be one of the op list. */
mgt_status mgt_mock_options_parse(mgt_mock_options *o, const char *spec);
/* Where the spec named no layout (and no conv=im2col): NCHW on a CPU without AVX-512F, whose
   nChw16c kernels (batch norm and its fused ReLU and add) would take the baseline's tiles, as
   slow as the convolutions' own reorders there save. True where it chose NCHW so. */
bool mgt_mock_options_pick_layout(mgt_mock_options *o);
/* Checks a parsed spec against the ids of the devices being opened: a fault or a peer pair
   naming a device that is not among them is MGT_ERR_INVALID naming the item and the device.
   mgt_devset_open runs it; a caller that wants the error labelled by its source runs it first. */
mgt_status mgt_mock_options_check(const mgt_mock_options *o, const int *ids, int n);

/* ---- devices ---- */

/* Switches of a device set that hold for every backend (the command-line flags of the same
   names); a zeroed struct is the default. */
typedef struct mgt_devset_options {
    const mgt_mock_options *mock; /* mock devices: NULL for the defaults (or MGT_MOCK) */
    bool no_p2p;                  /* every peer copy staged through pinned host memory */
    bool tf32;          /* CUDA: cuBLAS and cuDNN may use TF32 (mock devices: no effect) */
    bool deterministic; /* CUDA: only deterministic cuDNN algorithms (mock devices always are) */
    /* --on-device-failure continue: a device may be given up mid-step (mgt_device_abandon)
       while the others go on, so no stream of another device may be left waiting on it or
       reading its memory. CUDA then orders streams across devices through marks in host
       memory that giving a device up lets pass, and copies between devices by a kernel that
       skips a given-up device's memory (a copy kernel in place of the copy engines); mock
       devices always can. */
    bool recoverable;
} mgt_devset_options;

/* Opens n devices of a kind, the one way to open devices. ids name physical devices and may
   repeat for CUDA (several replicas on one GPU); mock ids run from 0 to MGT_MAX_DEVICES - 1 in
   any order. opts may be NULL (every switch off); opts->mock NULL means the defaults,
   overridden by the MGT_MOCK environment variable when set (its errors then start
   "MGT_MOCK: "). Mock options that name a device not among ids are refused
   (mgt_mock_options_check). MGT_DEVICE_AUTO opens CUDA devices when the build has CUDA and
   a GPU answers, mock devices otherwise. */
mgt_status mgt_devset_open(mgt_device_kind kind, const int *ids, int n,
                           const mgt_devset_options *opts, mgt_devset **out);
/* Waits for all work (each wait bounded by the set's wait limit), then frees every device,
   stream, event and buffer of the set. NULL is a no-op. */
void mgt_devset_free(mgt_devset *set);
/* The default of mgt_devset_set_waits' limit: no single wait in a step takes minutes. */
#define MGT_DEVICE_WAIT_LIMIT_S 600.0
/* Bounds every wait on the set's devices: a synchronize, with an abort flag or with NULL,
   and the waits inside frees, teardown and a backend's own calls, ends with MGT_ERR_TIMEOUT
   naming the device once it has waited limit_s seconds (0: MGT_DEVICE_WAIT_LIMIT_S).
   `abort` (borrowed until the next call; NULL: none) is the flag of the waits a backend makes
   inside a call, which take none of their own (a cuDNN search's start, MGT_CUDA_SYNC).
   `source` names what set the limit in the messages of the waits that run out ("--timeout";
   NULL or limit_s 0: the default). The trainer passes its run's flag and --device-timeout
   or --timeout, and NULL, 0 at its end. Call it while no other thread uses the set. */
void mgt_devset_set_waits(mgt_devset *set, const mgt_abort *abort, double limit_s,
                          const char *source);
int mgt_devset_count(const mgt_devset *set);
mgt_device *mgt_devset_device(const mgt_devset *set, int i);
mgt_device_kind mgt_devset_kind(const mgt_devset *set);
/* Whether the set's device memory is host memory that host threads may read and write once
   events order them (mock devices): a collective across processes can then run in it, without
   copies through pinned memory. */
bool mgt_devset_host_memory(const mgt_devset *set);
/* From now on, buffers freed on d are not given back to the system: their memory was lent to a
   transfer that cannot be cancelled (an MPI collective a failed exchange left in flight, which
   may still read or write it until the process ends in MPI_Abort). */
void mgt_device_keep_memory(mgt_device *d);
/* Whether a copy from device i to device j goes directly (else through pinned host memory). */
bool mgt_devset_can_access_peer(const mgt_devset *set, int i, int j);
/* Measures the rate of mgt_copy_peer from device i to device j (i != j), direct or staged as
   the pair goes: the best of `reps` timed copies of `bytes` after one untimed, in bytes per
   second of device time. Allocates two buffers and two streams for the measurement. */
mgt_status mgt_devset_copy_rate(mgt_devset *set, int i, int j, size_t bytes, int reps,
                                double *bytes_per_s);

/* How many devices of this kind the machine has (0 when the build or driver has none). */
int mgt_device_kind_count(mgt_device_kind kind);
/* The same, or why there are none: MGT_OK with *count >= 1, or a status whose text says why
   (CUDA: the runtime's own error text, the driver's and the runtime's versions and the GPUs'
   compute modes; in a build without the backend, that the build has none). What a caller
   that was asked for CUDA reports instead of falling back. */
mgt_status mgt_device_kind_probe(mgt_device_kind kind, int *count);
/* The libraries behind a kind as this process loads them (CUDA: runtime, driver, cuDNN,
   cuBLAS, and NCCL's version or "not built"); "" for the mock devices. */
void mgt_device_kind_versions(mgt_device_kind kind, char *text, size_t cap);
const char *mgt_device_kind_name(mgt_device_kind kind);

int mgt_device_index(const mgt_device *d); /* position in its devset */
int mgt_device_id(const mgt_device *d);    /* the id it was opened with */
const char *mgt_device_name(const mgt_device *d);
mgt_device_kind mgt_device_get_kind(const mgt_device *d);
/* Bytes allocated now (freed buffers count until queued work has passed their free) and the
   most this device may hold. */
void mgt_device_memory(const mgt_device *d, size_t *used, size_t *total);
/* Waits for every stream of the device. */
mgt_status mgt_device_synchronize(mgt_device *d, const mgt_abort *abort);
/* What mock devices count for their injected faults: the allocations asked of the device so
   far (device and pinned memory, what fault=alloc@D:N numbers) and the kernels run (what
   fault=kernel@D:N numbers). False, and zeros, on backends that keep no counts (CUDA). A test
   that sweeps N knows from them when it has passed the last allocation of a run. */
bool mgt_device_counts(const mgt_device *d, long *allocs, long *kernels);
/* Gives the device up, without waiting on it; never blocks. Mock devices: its queued work is
   dropped, a kernel that never returns is left behind, it counts as failed (its first
   failure's text kept, else `why`), the streams of other devices and host threads waiting on
   its events go on, and peer copies out of it read none of its memory. CUDA: nothing can stop
   a running kernel, and any call that synchronizes with a broken context may block, so the
   device is not touched again: every later call on it (and a peer copy out of it, a stream's
   wait on its events) fails at once naming `why`, its frees and destroys are skipped (its
   memory stays allocated until the process ends), the set's close leaves it alone; no
   cudaDeviceReset, which would pull the context from under the process's other threads. Work
   of other devices already queued behind its events stays blocked on CUDA (a queued
   cudaStreamWaitEvent cannot be cancelled, and the peer copy queued behind it would read the
   lost GPU): the trainer's wait for the survivors' streams then runs out and the run ends
   (docs/failures.md says why and what would lift it). */
void mgt_device_abandon(mgt_device *d, const char *why);
/* A host thread is stuck inside a call on d (detached, never joined) and may come back at any
   time, the device set freed by then: d is abandoned (`why`), and what that call or the
   thread's next ones can reach is kept for the process's life: d's streams, events and buffers
   (handles and memory), the set itself with its device array and staging, and the backend's
   own state for d (CUDA: its replica's allocator and handles). mgt_devset_free frees the rest. */
void mgt_device_strand(mgt_device *d, const char *why);
/* Lets waits on d run again after one ran out: for a device whose work only waited on
   another that has since been abandoned (its waits now complete). */
void mgt_device_unstall(mgt_device *d);
/* How long the kernel or copy that has run longest on the device, and still runs, has run
   (seconds; 0: none runs). A stream waiting for another device's event is not busy, so after
   a stall the device whose own work hangs is the one busy for long. -1 where the backend
   cannot tell (CUDA). */
double mgt_device_busy_s(const mgt_device *d);

/* The per-op profile: with on, every kernel the device runs from now is timed and counted by
   its op (mock devices: its wall time on the device's threads; CUDA does not measure it:
   MGT_ERR_UNSUPPORTED), from zero; off stops counting. */
mgt_status mgt_device_op_profile(mgt_device *d, bool on);
typedef struct mgt_op_time {
    const char *name; /* the op's name, as the op list has it (static) */
    double seconds, flops;
    long calls;
} mgt_op_time;
/* The ops that ran while counting, by decreasing time: the first cap into out; returns how
   many ops have any (0 where the backend does not measure). */
int mgt_device_op_times(const mgt_device *d, mgt_op_time *out, int cap);

/* ---- memory ---- */

mgt_status mgt_buffer_alloc(mgt_device *d, size_t bytes, mgt_buffer **out);
/* Returns at once: the memory goes back to the device (and leaves mgt_device_memory's `used`)
   once the work enqueued before the free, on every stream of the set, has run. A device whose
   queued work cannot be ordered any more (failed) has its block freed after a bounded wait,
   or kept if that wait runs out. NULL is a no-op. */
void mgt_buffer_free(mgt_buffer *b);
void *mgt_buffer_ptr(const mgt_buffer *b);
size_t mgt_buffer_size(const mgt_buffer *b);
mgt_device *mgt_buffer_device(const mgt_buffer *b);

/* Pinned (page-locked) host memory that copies to and from `d` can use asynchronously. */
mgt_status mgt_host_alloc(mgt_device *d, size_t bytes, void **out);
/* Returns at once, as mgt_buffer_free: the memory goes once every stream of the set has passed
   the free. NULL is a no-op. */
void mgt_host_free(mgt_device *d, void *p);

/* ---- streams and events ---- */

mgt_status mgt_stream_create(mgt_device *d, mgt_stream **out);
/* Waits for the stream's work (bounded by the wait limit; on a stalled device, not at all),
   then frees it. Work still queued then is given up on mock devices; on CUDA it runs on (or
   never, behind a hung kernel), and the frees deferred behind it wait for it. NULL is a
   no-op. */
void mgt_stream_free(mgt_stream *s);
mgt_device *mgt_stream_device(const mgt_stream *s);
/* Blocks until everything enqueued so far has run. */
mgt_status mgt_stream_synchronize(mgt_stream *s, const mgt_abort *abort);

mgt_status mgt_event_create(mgt_device *d, mgt_event **out);
/* An event for ordering streams only: records and waits as any event, but
   mgt_event_elapsed_ms refuses it. Cheaper where recording takes a timestamp (CUDA creates it
   with cudaEventDisableTiming); what the dispatch layer's peer-copy ordering uses. */
mgt_status mgt_event_create_ordering(mgt_device *d, mgt_event **out);
void mgt_event_free(mgt_event *e);
/* Marks the current end of stream `s` (which must be on the event's device). */
mgt_status mgt_event_record(mgt_event *e, mgt_stream *s);
/* Work enqueued on `s` after this call runs only after the event's latest record (as of
   this call) has run; `s` may be on another device. A never-recorded event is complete. */
mgt_status mgt_stream_wait_event(mgt_stream *s, mgt_event *e);
mgt_status mgt_event_synchronize(mgt_event *e, const mgt_abort *abort);
/* *done = whether the latest record has run; never blocks. */
mgt_status mgt_event_query(mgt_event *e, bool *done);
/* After a device failure, which work ran: *clean says whether the event's latest record ran
   while its device was still sound (the work enqueued before it ran), or only completed so
   that nothing waits on a failed device (the work before it may have been skipped). Returns
   false where that is not known: no record has run yet, or the backend cannot tell (CUDA,
   whose sticky errors hide every event's state). Sets no error text. */
bool mgt_event_outcome(mgt_event *e, bool *clean);
/* Milliseconds between two completed records of events made by mgt_event_create. */
mgt_status mgt_event_elapsed_ms(mgt_event *start, mgt_event *end, float *ms);

/* ---- copies (all enqueued) ---- */

mgt_status mgt_memset(mgt_stream *s, void *dst, int value, size_t bytes);
mgt_status mgt_copy_h2d(mgt_stream *s, void *dst, const void *host_src, size_t bytes);
mgt_status mgt_copy_d2h(mgt_stream *s, void *host_dst, const void *src, size_t bytes);
mgt_status mgt_copy_d2d(mgt_stream *s, void *dst, const void *src, size_t bytes);
/* Copies from memory of src_stream's device to memory of dst_stream's device. It runs after
   the work enqueued so far on both streams, and work enqueued later on either stream runs
   after it. Direct where the pair has peer access; otherwise staged through pinned host
   memory in chunks, ordered by events. */
mgt_status mgt_copy_peer(mgt_stream *dst_stream, void *dst, mgt_stream *src_stream, const void *src,
                         size_t bytes);

/* ---- across processes ---- */

/* A collective between devices of different processes that the backend does itself (NCCL on
   CUDA), one communicator per device; where the backend has none (mock devices, CUDA
   without NCCL) callers stage through host memory and MPI (mgt/world.h). */
typedef struct mgt_xcomm mgt_xcomm;
#define MGT_XCOMM_ID_MAX 256
bool mgt_xcomm_available(const mgt_devset *set);
/* A new id (at most MGT_XCOMM_ID_MAX bytes) that every rank passes to mgt_xcomm_create. */
mgt_status mgt_xcomm_id(mgt_devset *set, void *id, size_t *len);
/* Joins communicator `id` as `rank` of `nranks` on device d; blocks until all have joined. */
mgt_status mgt_xcomm_create(mgt_device *d, const void *id, size_t len, int nranks, int rank,
                            mgt_xcomm **out);
/* Enqueued on s (a stream of the communicator's device): recv gets rank r's n floats at
   r * n. */
mgt_status mgt_xcomm_allgather(mgt_xcomm *x, mgt_stream *s, const float *send, float *recv,
                               size_t n);
/* Whether the backend's collective has an all-to-all (NCCL's grouped sends and receives). */
bool mgt_xcomm_can_alltoall(const mgt_devset *set);
/* Enqueued on s: rank p gets counts[p] floats at send + displs[p]; recv + r * stride gets rank
   r's `each` floats for this rank (each == counts[this rank] on every rank; counts and displs
   have one entry per rank). */
mgt_status mgt_xcomm_alltoall(mgt_xcomm *x, mgt_stream *s, const float *send, const size_t *counts,
                              const size_t *displs, float *recv, size_t each, size_t stride);
void mgt_xcomm_free(mgt_xcomm *x); /* NULL is a no-op */

/* ---- kernels ---- */

/* How an activation [n, c, h, w] lies in device memory. Shapes and indices are NCHW in every
   API; a backend may keep activations in a layout of its own between its ops (the blocked
   layout of oneDNN's direct convolutions on the CPU), which saves reordering at every op's
   edges. The ops that take a layout (convolutions, batch norm, max pooling, the global
   average pool) read and write it; elementwise ops do not care. Zero is NCHW, so a zeroed shape is plain. */
typedef enum mgt_layout {
    MGT_LAYOUT_NCHW = 0,
    MGT_LAYOUT_NCHW16C, /* oneDNN's nChw16c: [n][c/16][h][w][16]; c a multiple of 16 */
    MGT_LAYOUT_NHWC,    /* channels last: [n][h][w][c], what cuDNN's tensor cores take */
} mgt_layout;

/* Where element i (of hw) of channel ch of image n lies in an [n, c, hw] activation. */
static inline size_t mgt_layout_at(mgt_layout l, int c, int hw, int n, int ch, int i)
{
    if (l == MGT_LAYOUT_NCHW16C)
        return (((size_t)n * (size_t)(c / 16) + (size_t)(ch / 16)) * (size_t)hw + (size_t)i) * 16 +
               (size_t)(ch % 16);
    if (l == MGT_LAYOUT_NHWC)
        return ((size_t)n * (size_t)hw + (size_t)i) * (size_t)c + (size_t)ch;
    return ((size_t)n * (size_t)c + (size_t)ch) * (size_t)hw + (size_t)i;
}

/* The step from one pixel of a channel to the next in an activation of c channels. */
static inline size_t mgt_layout_pixel_step(mgt_layout l, int c)
{
    return l == MGT_LAYOUT_NCHW16C ? 16 : l == MGT_LAYOUT_NHWC ? (size_t)c : 1;
}

/* The layout d's kernels want activations kept in between ops: MGT_LAYOUT_NCHW16C on mock
   devices whose convolutions run on oneDNN (unless --mock layout=nchw), MGT_LAYOUT_NHWC on
   CUDA under mixed precision (mgt_device_act_dtype 16-bit), NCHW elsewhere. A
   model built for d uses it where every op around a value can (mgt/nn.h). */
mgt_layout mgt_device_act_layout(const mgt_device *d);

/* Convolution of x [n,c,h,w] with w [k, c/groups, r, s] into y [n,k,p,q],
   p = (h + 2*pad_h - r) / stride_h + 1, likewise q. No dilation, no bias. */
typedef struct mgt_conv2d_shape {
    int n, c, h, w;
    int k, r, s;
    int stride_h, stride_w;
    int pad_h, pad_w;
    int groups; /* 1, or any divisor of both c and k (c == k == groups is depthwise) */
    /* x and dx, y and dy (the filter is KCRS always); blocked ones need groups 1 */
    mgt_layout x_layout, y_layout;
} mgt_conv2d_shape;

/* Max pooling of x [n,c,h,w] into y [n,c,p,q] with -inf padding, as torch's MaxPool2d. */
typedef struct mgt_pool2d_shape {
    int n, c, h, w;
    int kh, kw;
    int stride_h, stride_w;
    int pad_h, pad_w;
    /* torch's ceil_mode: the output side rounds up, keeping a last window that starts on
       the input (or the left padding) and runs past its end (clipped) */
    bool ceil_mode;
    mgt_layout layout; /* of x, y, dx and dy */
} mgt_pool2d_shape;

/* Batch norm over x [n,c,hw]: statistics per channel over n*hw values. */
typedef struct mgt_bn_shape {
    int n, c, hw;
    float eps;         /* 1e-5 in PyTorch */
    float momentum;    /* 0.1 in PyTorch: running = (1-m)*running + m*batch */
    mgt_layout layout; /* of x, y, dx and dy; the per-channel arrays are [c] always */
    /* A ReLU folded in (the forward and backward ops below; the synchronised halves refuse
       it): forward writes y = max(bn(x), 0) as relu_forward would over bn's output; backward
       takes dy as the gradient of that output and y as the output itself, and uses
       y > 0 ? dy : 0 (relu_backward's mask), so both give the unfused pair's bits. */
    bool relu;
} mgt_bn_shape;

/* PyTorch's SGD: d = s*g + wd*p; buf = m*buf + (1-dampening)*d (buf = d when first_step);
   d = nesterov ? d + m*buf : buf; p -= lr*d. s = grad_scale folds a division (for example by
   the device count) into the update. With momentum 0, buf is not touched (may be NULL). */
typedef struct mgt_sgd_params {
    float lr, momentum, dampening, weight_decay, grad_scale;
    bool nesterov;
    bool first_step;
} mgt_sgd_params;

/* PyTorch 1.13's AdamW (torch.optim.AdamW, amsgrad off), one step: g = s*grad;
   p *= decay; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g; p += -step_size * m / (sqrt(v) /
   bc2_sqrt + eps). The caller works out, in double from the step count t as torch does in
   Python: decay = 1 - lr*wd (decoupled), step_size = lr / (1 - b1^t), bc2_sqrt =
   sqrt(1 - b2^t). m and v start at zero. */
typedef struct mgt_adamw_params {
    float beta1, beta2, eps, grad_scale;
    float decay, step_size, bc2_sqrt;
} mgt_adamw_params;

/* PyTorch 1.13's RMSprop (centered off): g = s*grad + wd*p; sq = alpha*sq + (1-alpha)*g*g;
   avg = sqrt(sq) + eps; momentum > 0: buf = m*buf + g/avg, p -= lr*buf; else p -= lr*g/avg.
   sq and buf start at zero; with momentum 0, buf is not touched (may be NULL). */
typedef struct mgt_rmsprop_params {
    float lr, alpha, eps, weight_decay, momentum, grad_scale;
} mgt_rmsprop_params;

int mgt_conv2d_out_h(const mgt_conv2d_shape *sh);
int mgt_conv2d_out_w(const mgt_conv2d_shape *sh);
int mgt_pool2d_out_h(const mgt_pool2d_shape *sh);
int mgt_pool2d_out_w(const mgt_pool2d_shape *sh);

/* x[i] = value */
mgt_status mgt_fill(mgt_stream *s, float *x, float value, size_t n);
/* x[i] *= alpha */
mgt_status mgt_scale(mgt_stream *s, float *x, float alpha, size_t n);
/* y[i] += alpha * x[i] */
mgt_status mgt_axpy(mgt_stream *s, float *y, float alpha, const float *x, size_t n);
/* out[0] = sum of x (accumulated in double on the CPU) */
mgt_status mgt_sum(mgt_stream *s, float *out, const float *x, size_t n);
/* out[0] = sum of x[i]^2, accumulated in double as mgt_sum (gradient norms for clipping) */
mgt_status mgt_sum_squares(mgt_stream *s, float *out, const float *x, size_t n);
/* y[i] = a[i] + b[i]; y may alias a or b */
mgt_status mgt_add(mgt_stream *s, float *y, const float *a, const float *b, size_t n);

/* C[m,n] = alpha * op(A) op(B) + beta * C, row-major; op(A) is [m,k], op(B) is [k,n].
   lda, ldb, ldc are row strides of A, B, C as stored. */
mgt_status mgt_gemm(mgt_stream *s, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                    const float *a, int lda, const float *b, int ldb, float beta, float *c,
                    int ldc);

/* y = conv(x, w) + beta * y */
mgt_status mgt_conv2d_forward(mgt_stream *s, float *y, const float *x, const float *w,
                              const mgt_conv2d_shape *sh, float beta);
/* dx = conv_transpose(dy, w) + beta * dx */
mgt_status mgt_conv2d_backward_data(mgt_stream *s, float *dx, const float *dy, const float *w,
                                    const mgt_conv2d_shape *sh, float beta);
/* dw = correlate(x, dy) + beta * dw (beta 1 accumulates) */
mgt_status mgt_conv2d_backward_filter(mgt_stream *s, float *dw, const float *dy, const float *x,
                                      const mgt_conv2d_shape *sh, float beta);

/* The 16-bit formats of mixed precision. F32 is plain fp32 (what the ops above compute). */
typedef enum mgt_precision {
    MGT_PREC_F32,
    MGT_PREC_BF16, /* bfloat16: 8 exponent bits, 8 significant bits */
    MGT_PREC_FP16, /* IEEE half: 5 exponent bits, 11 significant bits */
} mgt_precision;

/* "f32", "bf16", "fp16"; mgt_precision_parse takes the same names (false: none of them). */
const char *mgt_precision_name(mgt_precision p);
bool mgt_precision_parse(const char *name, mgt_precision *out);

/* How d keeps activations between ops under mixed precision amp: amp itself on mock devices
   (16-bit activations, as autocast keeps them), MGT_PREC_F32 where the backend has no 16-bit
   kernels for the ops around them yet (CUDA) or amp is F32. A model built for d stores every
   activation whose producer and readers take it so (mgt/nn.h). */
mgt_precision mgt_device_act_dtype(const mgt_device *d, mgt_precision amp);

/* The byte model of the CUDA kernels (docs/mixed-precision.md): devices that run nothing and
   count, for every op, copy and memset enqueued on them, the bytes that the CUDA backend's
   kernels for it would read and write in global memory (src/device/bytes.c: each pass reads
   each tensor it needs once and writes each output once). A model built on one is planned as
   on CUDA: under --amp, act BF16 or FP16 stores activations NHWC in 16 bits (the
   channels-last path), act F32 keeps them NCHW fp32 with the 16-bit convolutions converting
   at their edges (the path before it). layout is MGT_LAYOUT_NHWC as on CUDA (NCHW: the same
   16-bit storage kept NCHW, which CUDA's kernels take too). One device; its memory is address
   space only (copies to the host give zeros), so a step of any batch size can be traced; with
   run, memory is host memory and every op runs on the reference as it is enqueued: the CUDA
   plan's numbers, computed slowly on a CPU (how tests check that plan without a GPU). */
mgt_status mgt_devset_open_bytes(mgt_layout layout, mgt_precision act, bool run, mgt_devset **out);

/* One row of a byte-model device's tally: an op's name, or "copy", "memset". */
typedef struct mgt_bytes_row {
    const char *name;
    long calls, passes;   /* ops, and the kernels they launch */
    double read, written; /* bytes */
    /* of read + written, the passes that only change layout or precision (transposes, the
       16-bit copies of a convolution's or gemm's inputs, results widened back) */
    double convert;
} mgt_bytes_row;

/* The rows with calls so far, in the op list's order then copy and memset; returns how many
   there are (rows gets the first cap). 0 for a device that is not a byte model's. */
int mgt_device_bytes_rows(const mgt_device *d, mgt_bytes_row *rows, int cap);
void mgt_device_bytes_reset(mgt_device *d);

/* How an op stores the activations it reads and writes and their gradients, as autocast keeps
   a tensor's gradient in the tensor's type: `in` for the forward's input activations (x; add's
   a and b) and their gradients (dx), `out` for its output (y) and its gradient (dy), in a
   forward op and its backward alike; F32 or a 16-bit format (both 16-bit ones the same).
   16-bit storage holds uint16_t codes where the API says float *; the kernels widen them to
   fp32, compute and accumulate in fp32 and round each 16-bit output once (nearest even; a
   gradient added onto, beta 1, is widened, summed in fp32 and rounded once). Parameters, their
   gradients and statistics are fp32 always. The _st forms of the wrappers below take it; the
   others store fp32. */
typedef struct mgt_store {
    mgt_precision in, out;
} mgt_store;

/* The low-precision forms of gemm and the three convolution passes, as autocast runs them:
   both inputs rounded to prec (round to nearest even; fp16 overflows to inf), products and
   sums in fp32, the result fp32 with alpha and beta applied in fp32. Arrays stay fp32 in
   memory; only the values that enter the multiply are 16-bit. prec is BF16 or FP16 (F32: the
   fp32 ops above). The op list has no kinds of their own for them: the precision is a
   parameter of the gemm and convolution ops (mgt_op.prec). */
mgt_status mgt_gemm_lp(mgt_stream *s, mgt_precision prec, bool trans_a, bool trans_b, int m, int n,
                       int k, float alpha, const float *a, int lda, const float *b, int ldb,
                       float beta, float *c, int ldc);
mgt_status mgt_conv2d_forward_lp(mgt_stream *s, mgt_precision prec, float *y, const float *x,
                                 const float *w, const mgt_conv2d_shape *sh, float beta);
mgt_status mgt_conv2d_backward_data_lp(mgt_stream *s, mgt_precision prec, float *dx,
                                       const float *dy, const float *w, const mgt_conv2d_shape *sh,
                                       float beta);
mgt_status mgt_conv2d_backward_filter_lp(mgt_stream *s, mgt_precision prec, float *dw,
                                         const float *dy, const float *x,
                                         const mgt_conv2d_shape *sh, float beta);

/* Casts between fp32 and 16-bit storage (n elements): to_16 writes h[i] = round(x[i]) (the
   bits of a bf16 or fp16 value), otherwise x[i] = h[i] exactly. */
mgt_status mgt_cast_to_16(mgt_stream *s, mgt_precision prec, uint16_t *h, const float *x, size_t n);
mgt_status mgt_cast_from_16(mgt_stream *s, mgt_precision prec, float *x, const uint16_t *h,
                            size_t n);

/* count[0] = how many of x[0..n) are inf or NaN (what fp16 loss scaling checks gradients
   with). */
mgt_status mgt_nonfinite_count(mgt_stream *s, int32_t *count, const float *x, size_t n);

/* Training forward: y = gamma * (x - mean) * invstd + beta with the batch's mean and biased
   variance; saves mean and invstd [c] for backward; running_mean/var [c] move by momentum
   towards the batch mean and the unbiased variance. */
mgt_status mgt_batchnorm_forward_train(mgt_stream *s, float *y, float *save_mean,
                                       float *save_invstd, float *running_mean, float *running_var,
                                       const float *x, const float *gamma, const float *beta,
                                       const mgt_bn_shape *sh);
/* Evaluation forward with the running statistics. */
mgt_status mgt_batchnorm_forward_eval(mgt_stream *s, float *y, const float *x, const float *gamma,
                                      const float *beta, const float *running_mean,
                                      const float *running_var, const mgt_bn_shape *sh);
/* dx overwritten; dgamma, dbeta accumulate. y, the forward's output, is read only under
   sh->relu (NULL otherwise). */
mgt_status mgt_batchnorm_backward(mgt_stream *s, float *dx, float *dgamma, float *dbeta,
                                  const float *dy, const float *y, const float *x,
                                  const float *gamma, const float *save_mean,
                                  const float *save_invstd, const mgt_bn_shape *sh);

/* Synchronised BN's pieces (PyTorch's batch_norm_stats and batch_norm_backward_elemt): one
   shard's per-channel mean and biased variance; and dx from the shard's dy and x given the
   merged mean, invstd, the summed sum(dy), sum(dy*xhat) and the count of every shard. */
mgt_status mgt_bn_stats(mgt_stream *s, float *mean, float *var, const float *x,
                        const mgt_bn_shape *sh);
mgt_status mgt_bn_backward_elemt(mgt_stream *s, float *dx, const float *dy, const float *x,
                                 const float *gamma, const float *mean, const float *invstd,
                                 const float *sum_dy, const float *sum_dy_xhat, double count,
                                 const mgt_bn_shape *sh);

/* y = max(x, 0); y may alias x */
mgt_status mgt_relu_forward(mgt_stream *s, float *y, const float *x, size_t n);
/* dx = y > 0 ? dy : 0, from the forward's output; dx may alias dy */
mgt_status mgt_relu_backward(mgt_stream *s, float *dx, const float *dy, const float *y, size_t n);

mgt_status mgt_maxpool2d_forward(mgt_stream *s, float *y, const float *x,
                                 const mgt_pool2d_shape *sh);
/* dx overwritten; each window's gradient goes to its first maximum in raster order. */
mgt_status mgt_maxpool2d_backward(mgt_stream *s, float *dx, const float *dy, const float *x,
                                  const float *y, const mgt_pool2d_shape *sh);

/* Global average pool: y[n,c] = mean of x[n,c,:] over hw values; x in layout l, y [n,c]. */
mgt_status mgt_avgpool_forward(mgt_stream *s, float *y, const float *x, int n, int c, int hw,
                               mgt_layout l);
/* dx[n,c,:] = dy[n,c] / hw, overwritten, dx in layout l */
mgt_status mgt_avgpool_backward(mgt_stream *s, float *dx, const float *dy, int n, int c, int hw,
                                mgt_layout l);

/* y[r, j] += bias[j] for r < rows, j < cols */
mgt_status mgt_bias_forward(mgt_stream *s, float *y, const float *bias, int rows, int cols);
/* dbias[j] += sum over r of dy[r, j] */
mgt_status mgt_bias_backward(mgt_stream *s, float *dbias, const float *dy, int rows, int cols);

/* y[i, ch, j] += bias[ch] over n images of c channels of hw (a convolution's bias) */
mgt_status mgt_channel_bias_forward(mgt_stream *s, float *y, const float *bias, int n, int c,
                                    int hw);
/* dbias[ch] += sum over i < n, j < hw of dy[i, ch, j] */
mgt_status mgt_channel_bias_backward(mgt_stream *s, float *dbias, const float *dy, int n, int c,
                                     int hw);

/* torch's AdaptiveAvgPool2d: y [n, c, oh, ow] from x [n, c, h, w], output (i, j) the mean of
   rows floor(i h / oh) .. ceil((i + 1) h / oh) - 1 and the columns likewise; the backward
   spreads each dy over its window (dx written, not accumulated). */
mgt_status mgt_adaptive_avgpool_forward(mgt_stream *s, float *y, const float *x, int n, int c,
                                        int h, int w, int oh, int ow);
mgt_status mgt_adaptive_avgpool_backward(mgt_stream *s, float *dx, const float *dy, int n, int c,
                                         int h, int w, int oh, int ow);

/* y[i * y_stride + r * y_row + k] = x[i * x_stride + r * x_row + k] for i < n, r < rows,
   k < count (floats): a channel slice of an NCHW tensor into another's, or a channel shuffle.
   Source and destination must not overlap. */
typedef struct mgt_strided_copy_shape {
    int n, rows;
    size_t count, y_stride, y_row, x_stride, x_row;
} mgt_strided_copy_shape;

mgt_status mgt_strided_copy(mgt_stream *s, float *y, const float *x,
                            const mgt_strided_copy_shape *sh);

/* What a dropout mask is a function of. Image i of a call is the sample at global index
   g = sample0 + i * sample_stride (its place in the epoch's order, so the mask does not depend
   on how a batch is split over devices); step counts the run's training steps; stream tells
   the dropout layers of one model apart. Element j of that image is kept iff
   (w >> 8) >= ceil(p * 2^24), w being word j % 4 of the Philox4x32-10 block with counter
   {j / 4, step, g & 0xffffffff, ((g >> 32) & 0xffffff) | MGT_RNG_DROPOUT << 24} and key
   {seed & 0xffffffff, (seed >> 32) ^ (stream * 0x9E3779B9)}. */
typedef struct mgt_dropout_key {
    uint64_t seed, step, sample0, sample_stride;
    uint32_t stream;
} mgt_dropout_key;

/* y = x * keep / (1 - p) (kept elements scaled by the float 1 / (1 - p), the others 0) over n
   images of per_image floats, p in [0, 1); y may be x. Run on dy with the same key it is the
   backward: dx = dy * keep / (1 - p). */
mgt_status mgt_dropout(mgt_stream *s, float *y, const float *x, int n, size_t per_image, float p,
                       const mgt_dropout_key *key);

/* The pointwise activations beside ReLU, with PyTorch's definitions, one row each:
   X(KIND, name) makes MGT_ACT_<KIND> and its name (mgt_act_name, the conformance cases), and
   every switch over activations is an expansion of the list. Adding one: its row, then its
   formula in each backend under its name: act_<name> and act_<name>_grad in
   src/device/cpu/ref.c, act_<name> and act_<name>_bwd in src/device/cpu/act.c, struct
   act_<name> in src/device/cuda/act.cu; a backend without it does not build. */
#define MGT_ACT_LIST(X)                                                                \
    X(RELU6, relu6)             /* clamp(x, 0, 6) */                                   \
    X(HARDSIGMOID, hardsigmoid) /* clamp(x / 6 + 1/2, 0, 1) */                         \
    X(HARDSWISH, hardswish)     /* x * hardsigmoid(x) */                               \
    X(SILU, silu)               /* x sigmoid(x) */                                     \
    X(SIGMOID, sigmoid)         /* 1 / (1 + exp(-x)) */                                \
    X(GELU, gelu)               /* x Phi(x): the exact erf form, approximate='none' */ \
    X(TANH, tanh)               /* tanh(x) (MaxViT's classifier) */

#define MGT_ACT_ENUM_(KIND, name) MGT_ACT_##KIND,
typedef enum mgt_act { MGT_ACT_LIST(MGT_ACT_ENUM_) MGT_ACT_COUNT } mgt_act;
#undef MGT_ACT_ENUM_

/* "relu6", "hardswish", ...; "unknown" past the list. */
const char *mgt_act_name(mgt_act act);

/* y = act(x) over n floats; y may alias x */
mgt_status mgt_activation_forward(mgt_stream *s, float *y, const float *x, size_t n, mgt_act act);
/* dx = dy * act'(x), from the forward's input (the derivatives torch's backward uses at the
   kinks: relu6 and hardsigmoid pass only strictly inside, hardswish's is x/3 + 1/2 on
   [-3, 3]); dx may alias dy */
mgt_status mgt_activation_backward(mgt_stream *s, float *dx, const float *dy, const float *x,
                                   size_t n, mgt_act act);

/* The wrappers that take a storage (the others are these with both F32). */
mgt_status mgt_add_st(mgt_stream *s, mgt_store st, float *y, const float *a, const float *b,
                      size_t n);
mgt_status mgt_conv2d_forward_st(mgt_stream *s, mgt_precision prec, mgt_store st, float *y,
                                 const float *x, const float *w, const mgt_conv2d_shape *sh,
                                 float beta);
mgt_status mgt_conv2d_backward_data_st(mgt_stream *s, mgt_precision prec, mgt_store st, float *dx,
                                       const float *dy, const float *w, const mgt_conv2d_shape *sh,
                                       float beta);
mgt_status mgt_avgpool_backward_st(mgt_stream *s, mgt_store st, float *dx, const float *dy, int n,
                                   int c, int hw, mgt_layout l);
mgt_status mgt_adaptive_avgpool_backward_st(mgt_stream *s, mgt_store st, float *dx, const float *dy,
                                            int n, int c, int h, int w, int oh, int ow,
                                            mgt_layout l);
mgt_status mgt_conv2d_backward_filter_st(mgt_stream *s, mgt_precision prec, mgt_store st, float *dw,
                                         const float *dy, const float *x,
                                         const mgt_conv2d_shape *sh, float beta);
/* The batch norms with a fused residual add (z, dz: NULL for none; sh->relu with them): the
   forward writes relu(bn(x) rounded to st.out, + z), z stored as y (z may be y); the backward
   also writes dy masked by the ReLU's output y into dz (the residual's gradient; dz may be
   dy). On CUDA with NHWC 16-bit activations: one pass each way (store16.cu). */
mgt_status mgt_batchnorm_forward_train_st(mgt_stream *s, mgt_store st, float *y, float *save_mean,
                                          float *save_invstd, float *running_mean,
                                          float *running_var, const float *x, const float *gamma,
                                          const float *beta, const mgt_bn_shape *sh,
                                          const float *z);
mgt_status mgt_batchnorm_forward_eval_st(mgt_stream *s, mgt_store st, float *y, const float *x,
                                         const float *gamma, const float *beta,
                                         const float *running_mean, const float *running_var,
                                         const mgt_bn_shape *sh, const float *z);
mgt_status mgt_batchnorm_backward_st(mgt_stream *s, mgt_store st, float *dx, float *dgamma,
                                     float *dbeta, const float *dy, const float *y, const float *x,
                                     const float *gamma, const float *save_mean,
                                     const float *save_invstd, const mgt_bn_shape *sh, float *dz);
mgt_status mgt_relu_forward_st(mgt_stream *s, mgt_store st, float *y, const float *x, size_t n);
mgt_status mgt_relu_backward_st(mgt_stream *s, mgt_store st, float *dx, const float *dy,
                                const float *y, size_t n);
mgt_status mgt_maxpool2d_forward_st(mgt_stream *s, mgt_store st, float *y, const float *x,
                                    const mgt_pool2d_shape *sh);
mgt_status mgt_maxpool2d_backward_st(mgt_stream *s, mgt_store st, float *dx, const float *dy,
                                     const float *x, const float *y, const mgt_pool2d_shape *sh);
mgt_status mgt_avgpool_forward_st(mgt_stream *s, mgt_store st, float *y, const float *x, int n,
                                  int c, int hw, mgt_layout l);
mgt_status mgt_activation_forward_st(mgt_stream *s, mgt_store st, float *y, const float *x,
                                     size_t n, mgt_act act);
mgt_status mgt_activation_backward_st(mgt_stream *s, mgt_store st, float *dx, const float *dy,
                                      const float *x, size_t n, mgt_act act);
mgt_status mgt_adaptive_avgpool_forward_st(mgt_stream *s, mgt_store st, float *y, const float *x,
                                           int n, int c, int h, int w, int oh, int ow,
                                           mgt_layout l);
mgt_status mgt_strided_copy_st(mgt_stream *s, mgt_store st, float *y, const float *x,
                               const mgt_strided_copy_shape *sh);
/* The channel ops' activations in layout l (NCHW, or NHWC: CUDA's 16-bit channels-last
   path); dropout's NHWC images have c channels and keep NCHW's mask element for element. */
mgt_status mgt_channel_bias_forward_st(mgt_stream *s, mgt_store st, float *y, const float *bias,
                                       int n, int c, int hw, mgt_layout l);
mgt_status mgt_channel_bias_backward_st(mgt_stream *s, mgt_store st, float *dbias, const float *dy,
                                        int n, int c, int hw, mgt_layout l);
mgt_status mgt_dropout_st(mgt_stream *s, mgt_store st, float *y, const float *x, int n,
                          size_t per_image, float p, const mgt_dropout_key *key, int c,
                          mgt_layout l);
mgt_status mgt_channel_scale_forward_st(mgt_stream *s, mgt_store st, float *y, const float *x,
                                        const float *scale, int n, int c, int hw, bool shared,
                                        mgt_layout l);
mgt_status mgt_channel_scale_backward_st(mgt_stream *s, mgt_store st, float *dx, float *dscale,
                                         const float *dy, const float *x, const float *scale, int n,
                                         int c, int hw, bool shared, mgt_layout l);
mgt_status mgt_layernorm_channels_forward_st(mgt_stream *s, mgt_store st, float *y, const float *x,
                                             const float *weight, const float *bias, int n, int c,
                                             int hw, float eps, mgt_layout l);
mgt_status mgt_layernorm_channels_backward_st(mgt_stream *s, mgt_store st, float *dx,
                                              float *dweight, float *dbias, const float *dy,
                                              const float *x, const float *weight, int n, int c,
                                              int hw, float eps, mgt_layout l);
/* The transformers' ops with 16-bit activations (a linear layer over tokens, the position
   embedding, the token copies, attention). The gemm's operands named in g (a, b, c) are
   activations stored in g.fmt; the others, and every parameter and gradient of one, fp32. A
   permute reads its source as st.in and writes its destination as st.out (the same format, or
   an fp32 source rounded: ViT's class token). Attention's q, k, v and their gradients are
   stored as st.in, y and dy as st.out; the bias, mask, lse and logit scale stay fp32. */
typedef struct mgt_gemm_store {
    mgt_precision fmt; /* F32: none is 16-bit */
    bool a, b, c;
} mgt_gemm_store;
mgt_status mgt_gemm_st(mgt_stream *s, mgt_precision prec, mgt_gemm_store st, bool trans_a,
                       bool trans_b, int m, int n, int k, float alpha, const float *a, int lda,
                       const float *b, int ldb, float beta, float *c, int ldc);
mgt_status mgt_bias_forward_st(mgt_stream *s, mgt_store st, float *y, const float *bias, int rows,
                               int cols);
mgt_status mgt_bias_backward_st(mgt_stream *s, mgt_store st, float *dbias, const float *dy,
                                int rows, int cols);

/* Per-channel scaling of x [n, c, hw]: y[i, ch, j] = x[i, ch, j] * scale[i * c + ch] (a
   squeeze-excite gate, one vector per image), or with shared, * scale[ch] (a parameter:
   ConvNeXt's layer scale). c = 1 with hw a whole image scales each image (stochastic depth). */
mgt_status mgt_channel_scale_forward(mgt_stream *s, float *y, const float *x, const float *scale,
                                     int n, int c, int hw, bool shared);
/* dx = dy * scale (overwritten; dx may alias dy); dscale (optional, NULL: not wanted) gets
   sum over j of dy * x per image and channel, overwritten, or with shared, that sum over the
   images too, added on (a parameter's gradient). */
mgt_status mgt_channel_scale_backward(mgt_stream *s, float *dx, float *dscale, const float *dy,
                                      const float *x, const float *scale, int n, int c, int hw,
                                      bool shared);

/* LayerNorm over channels (torchvision's LayerNorm2d): each pixel's c values of x [n, c, hw]
   are normalised by their mean and biased variance plus eps, then y = xhat * weight[ch] +
   bias[ch]. Backward recomputes the statistics from x; dx overwritten, dweight and dbias
   (sums over images and pixels of dy * xhat and dy) added on. */
mgt_status mgt_layernorm_channels_forward(mgt_stream *s, float *y, const float *x,
                                          const float *weight, const float *bias, int n, int c,
                                          int hw, float eps);
mgt_status mgt_layernorm_channels_backward(mgt_stream *s, float *dx, float *dweight, float *dbias,
                                           const float *dy, const float *x, const float *weight,
                                           int n, int c, int hw, float eps);
/* LayerNorm over the last dimension (torch's nn.LayerNorm(c) on [..., c]) is the same op with
   hw = 1 and n = the rows: x [rows, c], each row normalised by itself. Every backend has a
   row-major path for it (a row per thread or warp, contiguous reads). */

/* ---- the transformer ops ---- */

#define MGT_PERMUTE_DIMS 6

/* A strided copy with a general index description: torch's permute and slicing, the class
   token's concatenation, Swin's roll with padding and window partition (and its reverse),
   patch merging and MaxViT's block and grid partitions are each one of these.

   A walk over ndim nested dims (size[d], outermost first) visits positions i = (i_0, ...);
   position i is element sum_d i_d * walk_stride[d] of the walk tensor and, in the grid tensor,
   element sum_a index_a * grid_stride[a] over its naxes axes, where
       index_a = (shift[a] + sum over the dims d with axis[d] == a of i_d * coef[d]) mod extent[a]
   (no modulo where extent[a] is 0: then the sum must stay in [0, limit[a]) by itself), and the
   position exists iff index_a < limit[a] on every axis (the padding of a rolled, padded map).
   Gather (scatter false): walk = grid where the position exists, 0 elsewhere. Scatter:
   grid = walk where the position exists; grid elements no position reaches keep their value,
   and no two positions may reach the same element (a dim with coef 0 is refused). A gather
   with zero coefs broadcasts (the class token into every image). The two tensors must not
   overlap. */
typedef struct mgt_permute_shape {
    int ndim, naxes;
    int size[MGT_PERMUTE_DIMS];
    size_t walk_stride[MGT_PERMUTE_DIMS];
    int axis[MGT_PERMUTE_DIMS]; /* the grid axis dim d moves along */
    int coef[MGT_PERMUTE_DIMS]; /* by how many of that axis's steps per step of d */
    int extent[MGT_PERMUTE_DIMS], shift[MGT_PERMUTE_DIMS], limit[MGT_PERMUTE_DIMS];
    size_t grid_stride[MGT_PERMUTE_DIMS];
    bool scatter;
} mgt_permute_shape;

mgt_status mgt_permute(mgt_stream *s, float *walk, float *grid, const mgt_permute_shape *sh);
mgt_status mgt_permute_st(mgt_stream *s, mgt_store st, float *walk, float *grid,
                          const mgt_permute_shape *sh);

/* Scaled dot-product attention over `batch` independent groups (images, or the windows of
   images) of `heads` heads, queries t < tq and keys u < tk (head size dh):
     logit(b,h,t,u) = scale * q(b,h,t) . k(b,h,u)  [+ bias[h, t, u]] [+ mask[b % masks, t, u]]
   or, with cosine (Swin V2), scale * exp(min(logit_scale[h], log 100)) times the dot product of
   q and k each divided by max(|.|, 1e-12), as F.normalize;
     p = softmax over u, then dropout with probability `p` (training; the mask below);
     y(b,h,t) = sum over u of p * v(b,h,u).
   Vectors lie at q(b,h,t)[d] = q[b * q_batch + t * q_row + h * dh + d], k and v alike with
   kv_batch and kv_row, y(b,h,t)[d] = y[b * y_batch + t * y_row + h * dh + d]: the qkv linear's
   output [tokens, 3 * heads * dh] gives q, k and v at column offsets 0, heads*dh, 2*heads*dh
   with a row of 3 * heads * dh, as torch's MultiheadAttention and torchvision's Swin and MaxViT
   split it. Element (b,h,t,u) of a group's probabilities is dropped as dropout's element
   j = ((b % groups_per_sample) * heads + h) * tq * tk + t * tk + u of image b / groups_per_sample
   (mgt_dropout_key: the same on any device count). */
typedef struct mgt_attn_shape {
    int batch, heads, tq, tk, dh;
    size_t q_batch, q_row, kv_batch, kv_row, y_batch, y_row;
    float scale;
    int masks; /* the masks' count (a divisor of batch) when a mask is given */
    bool cosine;
    float p;               /* attention dropout, in [0, 1) */
    int groups_per_sample; /* groups of one image (the dropout mask's image); >= 1 */
    mgt_dropout_key key;
} mgt_attn_shape;

/* y as above; lse [batch, heads, tq] gets each row's log-sum-exp of its logits, which is all
   backward keeps of the probabilities (it recomputes them). bias [heads, tq, tk], mask
   [masks, tq, tk] and logit_scale [heads] (cosine only) may be NULL where unused. */
mgt_status mgt_attention_forward(mgt_stream *s, float *y, float *lse, const float *q,
                                 const float *k, const float *v, const float *bias,
                                 const float *mask, const float *logit_scale,
                                 const mgt_attn_shape *sh);
/* From dy (y's layout) and the forward's y and lse: dq, dk, dv written in q's, k's and v's
   layouts (only the head columns: a qkv gradient buffer with the forward's strides is filled
   by the three); dbias (optional) [heads, tq, tk] written with the sum over the groups;
   dlogit_scale [heads] (cosine only) added on (a parameter's gradient; 0 where the clamp
   holds, as torch's clamp passes none above the bound). */
typedef struct mgt_attn_grads {
    float *dq, *dk, *dv, *dbias, *dlogit_scale;
} mgt_attn_grads;
mgt_status mgt_attention_backward(mgt_stream *s, const mgt_attn_grads *g, const float *dy,
                                  const float *y, const float *lse, const float *q, const float *k,
                                  const float *v, const float *bias, const float *mask,
                                  const float *logit_scale, const mgt_attn_shape *sh);
/* The same with 16-bit storage (st: q, k, v and their gradients as st.in, y and dy as st.out) */
mgt_status mgt_attention_forward_st(mgt_stream *s, mgt_store st, float *y, float *lse,
                                    const float *q, const float *k, const float *v,
                                    const float *bias, const float *mask, const float *logit_scale,
                                    const mgt_attn_shape *sh);
mgt_status mgt_attention_backward_st(mgt_stream *s, mgt_store st, const mgt_attn_grads *g,
                                     const float *dy, const float *y, const float *lse,
                                     const float *q, const float *k, const float *v,
                                     const float *bias, const float *mask, const float *logit_scale,
                                     const mgt_attn_shape *sh);

/* The relative position bias's gather: bias[h, i] = alpha * table[index[i] * heads + h] for
   i < n, h < heads (table [rows, heads] as torchvision's relative_position_bias_table; index
   [n] int32 in [0, rows), n = tq * tk of the attention it feeds). */
mgt_status mgt_relpos_bias_forward(mgt_stream *s, float *bias, const float *table,
                                   const int32_t *index, int rows, int heads, int n, float alpha);
/* Its backward, the scatter-add as a deterministic segment sum: dtable[r, h] += alpha * sum of
   dbias[h, i] over the i with index[i] == r, which order[offsets[r] .. offsets[r + 1]) lists
   in increasing order (mgt_relpos_inverse; offsets [rows + 1], order [n], int32). */
mgt_status mgt_relpos_bias_backward(mgt_stream *s, float *dtable, const float *dbias,
                                    const int32_t *offsets, const int32_t *order, int rows,
                                    int heads, int n, float alpha);
/* The inverse index of index [n] (values in [0, rows)) on the host: offsets [rows + 1] and order
   [n] as mgt_relpos_bias_backward takes them. false where a value is out of range. */
bool mgt_relpos_inverse(const int32_t *index, int n, int rows, int32_t *offsets, int32_t *order);

/* Softmax cross-entropy of logits [n, classes] against int32 labels, with label smoothing
   eps, as torch's CrossEntropyLoss(label_smoothing=eps): row i's target is
   (1-eps) onehot(labels_i) + eps/classes, or with the mixed labels of mixup and cutmix,
   (1-eps) (w_i onehot(labels_i) + (1 - w_i) onehot(labels_b_i)) + eps/classes, w = weights in
   [0, 1] (labels_b and weights both given, or both NULL). loss[0] = mean over the batch;
   probs [n, classes] = softmax, kept for backward. A label outside [0, classes) is a device
   error. */
mgt_status mgt_softmax_xent_forward(mgt_stream *s, float *loss, float *probs, const float *logits,
                                    const int32_t *labels, const int32_t *labels_b,
                                    const float *weights, int n, int classes, float smoothing);
/* dlogits = scale * (probs - target); scale is 1/n for the batch mean. */
mgt_status mgt_softmax_xent_backward(mgt_stream *s, float *dlogits, const float *probs,
                                     const int32_t *labels, const int32_t *labels_b,
                                     const float *weights, int n, int classes, float smoothing,
                                     float scale);

/* count[0] += number of rows whose label is among the k largest logits. Ties rank the
   lower class index first: the label's rank is the number of classes with a larger logit
   plus those with an equal logit and a smaller index. */
mgt_status mgt_topk_correct(mgt_stream *s, int32_t *count, const float *logits,
                            const int32_t *labels, int n, int classes, int k);

mgt_status mgt_sgd_update(mgt_stream *s, float *param, float *momentum_buf, const float *grad,
                          size_t n, const mgt_sgd_params *p);
mgt_status mgt_adamw_update(mgt_stream *s, float *param, float *exp_avg, float *exp_avg_sq,
                            const float *grad, size_t n, const mgt_adamw_params *p);
mgt_status mgt_rmsprop_update(mgt_stream *s, float *param, float *square_avg, float *momentum_buf,
                              const float *grad, size_t n, const mgt_rmsprop_params *p);

#endif
