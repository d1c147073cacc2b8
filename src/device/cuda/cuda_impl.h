/* The C-compatible boundary between the CUDA backend's table (backend.c) and its CUDA C++ code. */
#ifndef MGT_DEVICE_CUDA_IMPL_H
#define MGT_DEVICE_CUDA_IMPL_H

/* Plain C only: op.h and mgt/device.h compile as C++ too (mgt/device.h only declares the abort
   flag, so no <stdatomic.h>), so kernels receive the op itself; handles travel as opaque
   pointers. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Inside the C linkage block: these headers have no guards of their own for C++. */
#include "device/op.h"
#include "mgt/status.h"

typedef struct mgt_cuda_set mgt_cuda_set;       /* one per devset: peers, algorithm cache */
typedef struct mgt_cuda_dev mgt_cuda_dev;       /* one per mgt_device (replica), not per GPU */
typedef struct mgt_cuda_stream mgt_cuda_stream; /* a cudaStream_t and its library handles */
typedef struct mgt_cuda_event mgt_cuda_event;

/* How the backend counts workspace it keeps against the device's limit (mgt_device_reserve
   behind it); owner is the mgt_device. */
typedef struct mgt_cuda_hooks {
    mgt_status (*reserve)(void *owner, size_t bytes, const char *what);
    void (*unreserve)(void *owner, size_t bytes);
    /* the backend's own wait for a stream inside a call (a cuDNN search's start,
       MGT_CUDA_SYNC): abortable by the run's flag and bounded by the set's wait limit */
    mgt_status (*wait)(void *owner, mgt_cuda_stream *s, const char *what);
} mgt_cuda_hooks;

enum { MGT_CUDA_COPY_H2D, MGT_CUDA_COPY_D2H, MGT_CUDA_COPY_D2D };

/* ---- devices (runtime.cu) ---- */

/* GPUs the runtime sees; 0 when there is no driver or no GPU (never fails). */
int mgt_cuda_device_count(void);
/* The runtime's answer in full: *count GPUs, or a failure whose text (the error set) carries
   cudaGetDeviceCount's own error text, the driver's and the runtime's versions and each GPU's
   compute mode: what a user needs to see where CUDA was asked for and cannot be opened. */
mgt_status mgt_cuda_probe(int *count);
/* "CUDA runtime 13.0, driver 13.0 (580.x), cuDNN 9.13.0, cuBLAS 13.1.0, NCCL 2.27.7" as this
   process loads them (NCCL: "not built"), for `mgtrain devices` and tools/gpu-check.sh. */
void mgt_cuda_versions(char *text, size_t cap);
/* The switches of mgt_devset_options that reach the CUDA backend (--no-p2p, --tf32,
   --deterministic); the environment variables MGT_NO_P2P, MGT_TF32 and MGT_DETERMINISTIC
   turn them on as well. */
typedef struct mgt_cuda_flags {
    bool no_p2p, tf32, deterministic;
    /* --on-device-failure continue: a replica may be given up mid-step while the others go
       on, so waits across replicas go through marks in mapped host memory that
       mgt_cuda_dev_release can let pass, and peer copies are kernels that skip a given-up
       replica's memory (survive.cu) */
    bool recoverable;
} mgt_cuda_flags;

/* Opens n replicas on the GPUs `ids` (repeats allowed); owners[i] is handed to the hooks for
   replica i. Reads MGT_NO_P2P, MGT_TF32, MGT_DETERMINISTIC, MGT_CUDA_SYNC,
   MGT_CUDNN_WORKSPACE_MB and MGT_CUDA_FAULT from the environment. Verifies peer access between
   distinct GPUs. */
mgt_status mgt_cuda_set_open(const int *ids, int n, const mgt_cuda_flags *flags,
                             const mgt_cuda_hooks *hooks, void *const *owners, mgt_cuda_set **out);
/* Frees everything the set made (streams and events must be gone; the caller has waited for
   the GPUs, bounded). drained false: some GPU's work never finished (a hung kernel), so its
   memory is left to the process's end instead of freed under running kernels. keep (NULL:
   none): the replicas a host thread may still be inside a call on (mgt_device_strand): their
   state, and the set's that their calls reach, stay allocated for the process's life (kept
   reachable), the others' are freed. NULL set is a no-op. */
void mgt_cuda_set_close(mgt_cuda_set *set, bool drained, const bool *keep);
mgt_cuda_dev *mgt_cuda_set_dev(mgt_cuda_set *set, int i);
/* 1 when a copy from replica i to replica j may go directly (verified at open). */
int mgt_cuda_set_peer(const mgt_cuda_set *set, int i, int j);
/* The measured direct copy rate from replica i's GPU to j's in GB/s; 0 where not measured
   (same GPU, no peer access). Not yet reachable through the backend table. */
double mgt_cuda_set_peer_gbps(const mgt_cuda_set *set, int i, int j);
/* "NVIDIA H200 (gpu 0, pci 0000:19:00.0, 139.8 GiB)" and the memory this replica may use. */
void mgt_cuda_dev_describe(const mgt_cuda_dev *d, char *name, size_t cap, size_t *total_mem);
/* Polls every stream of the replica: *done = 1 when all are idle. */
mgt_status mgt_cuda_dev_query(mgt_cuda_dev *d, int *done);
/* The replica is given up (mgt_device_abandon): in a recoverable set, every wait another
   replica's stream has queued on its events passes, and no guarded copy reads its memory any
   more; touches nothing of the replica's GPU, never blocks. Elsewhere a no-op. */
void mgt_cuda_dev_release(mgt_cuda_dev *d);
/* Before each kernel the backend launches on s: the faults MGT_CUDA_FAULT injects (survive.cu).
   hang: a kernel that spins until the set closes is enqueued first; gone: the replica's error
   becomes sticky and this and every later call on it fail. */
mgt_status mgt_cuda_inject(mgt_cuda_stream *s);

/* ---- memory ---- */

mgt_status mgt_cuda_alloc(mgt_cuda_dev *d, size_t bytes, void **out);
/* Keeps the block for reuse at once: the dispatch layer calls it only once no queued work
   can use the block. */
void mgt_cuda_free(mgt_cuda_dev *d, void *ptr);
mgt_status mgt_cuda_host_alloc(mgt_cuda_dev *d, size_t bytes, void **out);
void mgt_cuda_host_free(mgt_cuda_dev *d, void *ptr);

/* ---- streams, events, copies ---- */

mgt_status mgt_cuda_stream_create(mgt_cuda_dev *d, mgt_cuda_stream **out);
void mgt_cuda_stream_destroy(mgt_cuda_stream *s);
/* *done = 1 when everything enqueued so far has run; then also reports a device error flag. */
mgt_status mgt_cuda_stream_query(mgt_cuda_stream *s, int *done);

/* timing false: cudaEventDisableTiming (ordering only, cheaper to record and wait on) */
mgt_status mgt_cuda_event_create(mgt_cuda_dev *d, bool timing, mgt_cuda_event **out);
void mgt_cuda_event_destroy(mgt_cuda_event *e);
mgt_status mgt_cuda_event_record(mgt_cuda_event *e, mgt_cuda_stream *s);
mgt_status mgt_cuda_stream_wait_event(mgt_cuda_stream *s, mgt_cuda_event *e);
/* *done is set also when the answer is an error: 1 when the record has run or never will
   (a context the fault has ended). */
mgt_status mgt_cuda_event_query(mgt_cuda_event *e, int *done);
mgt_status mgt_cuda_event_elapsed(mgt_cuda_event *start, mgt_cuda_event *end, float *ms);

mgt_status mgt_cuda_memset(mgt_cuda_stream *s, void *dst, int value, size_t bytes);
mgt_status mgt_cuda_copy(mgt_cuda_stream *s, int kind, void *dst, const void *src, size_t bytes);
/* dst on s's replica, src on src_dev's replica; plain D2D when both sit on one GPU. */
mgt_status mgt_cuda_copy_peer(mgt_cuda_stream *s, void *dst, mgt_cuda_dev *src_dev, const void *src,
                              size_t bytes);

/* ---- across processes (nccl.cu): one NCCL communicator per replica, built with NCCL only
   (mgt_cuda_have_nccl; without it the backend table leaves these out) ---- */

typedef struct mgt_cuda_xcomm mgt_cuda_xcomm;
bool mgt_cuda_have_nccl(void);
/* "2.27.7", or "not built" */
void mgt_cuda_nccl_version(char *text, size_t cap);
/* ncclGetUniqueId into id (cap bytes), its length into *len */
mgt_status mgt_cuda_xcomm_id(void *id, size_t cap, size_t *len);
/* ncclCommInitRank on d's GPU: blocks until all nranks have joined */
mgt_status mgt_cuda_xcomm_create(mgt_cuda_dev *d, const void *id, size_t len, int nranks, int rank,
                                 mgt_cuda_xcomm **out);
/* ncclAllGather of n floats per rank on s: recv gets rank r's at r * n */
mgt_status mgt_cuda_xcomm_allgather(mgt_cuda_xcomm *x, mgt_cuda_stream *s, const float *send,
                                    float *recv, size_t n);
/* Grouped ncclSend/ncclRecv on s: rank p gets counts[p] floats at send + displs[p], recv +
   r * stride gets rank r's `each` (this rank's own piece by a device copy) */
mgt_status mgt_cuda_xcomm_alltoall(mgt_cuda_xcomm *x, mgt_cuda_stream *s, const float *send,
                                   const size_t *counts, const size_t *displs, float *recv,
                                   size_t each, size_t stride);
void mgt_cuda_xcomm_free(mgt_cuda_xcomm *x); /* NULL is a no-op */

/* ---- kernels: one per row of the op list, cuda_<stem>, each given a checked op on s's
   replica, with the semantics of mgt/device.h; defined in the .cu file of the op's family (own
   kernels) or in dnn.cu (gemm on cuBLAS; the convolutions and batch norm on cuDNN). backend.c's
   table is the same expansion of the list. ---- */

typedef mgt_status (*mgt_cuda_op_fn)(mgt_cuda_stream *s, const mgt_op *op);

/* An op that stores activations in 16 bits (mgt_op_store16 != F32), NHWC or NCHW: the kernels
   of store16.cu and act.cu, the channels-last convolutions of dnn.cu. */
mgt_status mgt_cuda_store16(mgt_cuda_stream *s, const mgt_op *op);
/* The replica's 16-bit filter copies (dnn.cu) that [ptr, ptr + bytes) overlaps are stale: every
   op's outputs, copy, memset and free pass through here before they are enqueued. */
void mgt_cuda_note_write(mgt_cuda_dev *d, const void *ptr, size_t bytes);
void mgt_cuda_note_op(mgt_cuda_dev *d, const mgt_op *op);
#define MGT_CUDA_OP_DECL_(KIND, name, args, stem) \
    mgt_status cuda_##stem(mgt_cuda_stream *s, const mgt_op *op);
MGT_OP_LIST(MGT_CUDA_OP_DECL_)
#undef MGT_CUDA_OP_DECL_

#ifdef __cplusplus
}
#endif

#endif
