// The CUDA backend's private C++ state and error plumbing, shared by its .cu files only.
#ifndef MGT_DEVICE_CUDA_COMMON_CUH
#define MGT_DEVICE_CUDA_COMMON_CUH

#include <atomic>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "device/cuda/cuda_impl.h"

// Codes a kernel writes into its replica's error flag (see mgt_cuda_dev::flag).
enum mgt_cuda_flag_code {
    MGT_CUDA_FLAG_NONE = 0,
    MGT_CUDA_FLAG_XENT_FWD_LABEL = 1,
    MGT_CUDA_FLAG_XENT_BWD_LABEL = 2,
    MGT_CUDA_FLAG_TOPK_LABEL = 3,
    MGT_CUDA_FLAG_RPB_INDEX = 4, // relpos_bias_forward: an index past the table
};
// Slots of the flag array: the code is stored last so the host never sees it without the
// row and label beside it.
enum {
    MGT_CUDA_FLAG_CODE,
    MGT_CUDA_FLAG_ROW,
    MGT_CUDA_FLAG_LABEL,
    MGT_CUDA_FLAG_CLASSES,
    MGT_CUDA_FLAG_SLOTS = 8
};

// An injected fault (MGT_CUDA_FAULT, survive.cu): what happens at a replica's `at`-th kernel
// launch since the set opened.
enum mgt_cuda_fault_kind { MGT_CUDA_FAULT_HANG = 1, MGT_CUDA_FAULT_GONE = 2 };
struct mgt_cuda_fault {
    int kind;
    int replica;
    long at;
};
enum { MGT_CUDA_MAX_FAULTS = 4 };

struct mgt_cuda_options {
    bool no_p2p;        // MGT_NO_P2P=1: every peer copy is staged by the dispatch layer
    bool tf32;          // MGT_TF32=1: cuBLAS and cuDNN may use TF32 tensor cores
    bool deterministic; // MGT_DETERMINISTIC=1: only deterministic cuDNN algorithms
    bool sync;          // MGT_CUDA_SYNC=1: synchronise after every enqueued call
    size_t find_ws_cap; // most workspace a cuDNN algorithm search may try (bytes)
    // mgt_cuda_flags.recoverable: --on-device-failure continue (survive.cu)
    bool recoverable;
    mgt_cuda_fault faults[MGT_CUDA_MAX_FAULTS]; // MGT_CUDA_FAULT
    int nfaults;
};

// One candidate convolution algorithm of a shape (dnn.cu keeps them in its process-wide cache,
// in the order of preference: measured speed, or cuDNN's heuristic order).
struct mgt_cuda_algo {
    int algo;
    size_t memory;
    cudnnMathType_t math;
};

struct mgt_cuda_set {
    int n;
    mgt_cuda_dev **devs;
    mgt_cuda_options opt;
    std::vector<unsigned char> peer; // n*n, replica i -> j may copy directly
    std::vector<double> peer_gbps;   // n*n, measured at open where direct
    // recoverable sets: the driver's cuStreamWaitValue32, resolved at open (survive.cu)
    void *wait_value32;
};

struct mgt_cuda_dev {
    mgt_cuda_set *set;
    int index; // position in the set
    int gpu;   // CUDA device ordinal
    int replicas_on_gpu;
    char name[128];
    char model[96]; // "NVIDIA H200 sm_90": what --deterministic's algorithm cache is keyed by
    size_t total_mem;
    mgt_cuda_hooks hooks;
    void *owner;

    // The caching allocator: blocks freed by the program stay allocated and go back out
    // to the next request of a near size, so a steady step loop never calls cudaMalloc.
    std::mutex mem_lock;
    std::multimap<size_t, void *> free_blocks; // size -> block
    std::unordered_map<void *, size_t> live;   // block -> size, handed out now
    size_t cached_bytes;
    // Blocks the backend freed on a stream (a workspace or scratch that grew mid-step):
    // reusable once the event recorded after their last use has run; no wait at the free.
    struct pending_block {
        cudaEvent_t done;
        void *ptr;
        size_t size;
    };
    std::vector<pending_block> pending;

    std::mutex streams_lock;
    std::vector<mgt_cuda_stream *> streams;

    // Mapped pinned host ints that kernels set on bad input (a label out of range); the
    // host reads them without a copy after a wait. Slots as MGT_CUDA_FLAG_*.
    int *flag_host;
    int *flag_dev;
    // The one-writer claim for the flag, an int in device memory: atomics on mapped host
    // memory go over PCIe (system-scope atomics, which not every platform supports), while
    // a device-memory atomicCAS is an ordinary L2 operation.
    int *claim_dev;

    // The 16-bit KRSC copies of fp32 KCRS filters that the channels-last convolutions read
    // (dnn.cu), keyed by the filter's address: made by every forward pass (once per step),
    // reused by the backward passes until an op, copy or memset writes over the filter or
    // its block is freed (mgt_cuda_note_write). Blocks from the allocator, freed with it.
    struct wcopy {
        size_t bytes;     // of the fp32 filter
        void *w16;        // its KRSC 16-bit copy
        size_t cap;       // bytes of w16
        int prec, cg, rs; // the format; the shape it was laid out for
        bool valid;
    };
    std::mutex wcache_lock;
    std::map<uintptr_t, wcopy> wcache;
    // Recoverable sets (survive.cu): mapped pinned host words in chunks of MGT_CUDA_MARK_CHUNK.
    // Word 0 says the replica is given up (the host sets it; the guarded copies read it),
    // word 1 ends an injected hang; every other word is an event's mark, the count of its
    // records that have run, which other replicas' streams wait on (cuStreamWaitValue32) and
    // the host can release. mark_seq[w] is the count enqueued so far.
    std::mutex marks_lock;
    std::vector<uint32_t *> mark_host, mark_dev; // per chunk
    std::vector<uint32_t> mark_seq;              // per word
    std::vector<int> free_marks;
    bool released; // mgt_cuda_dev_release has run: no record or wait is enqueued any more
    bool hung;     // an injected hang was enqueued: word 1 ends it when the set closes
    std::atomic<long> launches; // kernels launched since the set opened (MGT_CUDA_FAULT)
    int sms;                    // multiprocessors: the guarded copy's grid

    // A failure while work ran is sticky, as CUDA's own faults are.
    std::atomic<int> sticky;
    std::mutex sticky_lock;
    char sticky_text[384];
};

struct mgt_cuda_stream {
    mgt_cuda_dev *dev;
    cudaStream_t stream;
    // Library handles are per stream (not per device) so that threads driving different
    // streams of one replica never share a handle; made on first use.
    cublasHandle_t blas;
    cudnnHandle_t dnn;
    cudnnTensorDescriptor_t xd, yd, bnd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    // cuDNN workspace and small kernel scratch, from the allocator; used in stream order.
    void *ws;
    size_t ws_bytes;
    void *scratch;
    size_t scratch_bytes;
    void *lowp; // the rounded inputs of a low-precision op (lowp.cu)
    size_t lowp_bytes;
};

struct mgt_cuda_event {
    mgt_cuda_dev *dev;
    cudaEvent_t event;
    int mark; // its word in dev's marks (recoverable sets), else -1
};

// Turns a failed call into MGT_ERR_DEVICE (MGT_ERR_OOM for allocation failures) with the
// call text, file, line and the replica; `waiting` marks results of a wait or query, which
// report faults of earlier work and so make the replica's error sticky.
mgt_status mgt_cuda_fail_rt(mgt_cuda_dev *d, cudaError_t e, const char *call, const char *file,
                            int line, bool waiting);
mgt_status mgt_cuda_fail_blas(mgt_cuda_dev *d, cublasStatus_t e, const char *call, const char *file,
                              int line);
mgt_status mgt_cuda_fail_dnn(mgt_cuda_dev *d, cudnnStatus_t e, const char *call, const char *file,
                             int line);

#define MGT_CUDA_TRY(d, call)                                                       \
    do {                                                                            \
        cudaError_t mgt_e_ = (call);                                                \
        if (mgt_e_ != cudaSuccess)                                                  \
            return mgt_cuda_fail_rt((d), mgt_e_, #call, __FILE__, __LINE__, false); \
    } while (0)
#define MGT_CUBLAS_TRY(d, call)                                                \
    do {                                                                       \
        cublasStatus_t mgt_e_ = (call);                                        \
        if (mgt_e_ != CUBLAS_STATUS_SUCCESS)                                   \
            return mgt_cuda_fail_blas((d), mgt_e_, #call, __FILE__, __LINE__); \
    } while (0)
#define MGT_CUDNN_TRY(d, call)                                                \
    do {                                                                      \
        cudnnStatus_t mgt_e_ = (call);                                        \
        if (mgt_e_ != CUDNN_STATUS_SUCCESS)                                   \
            return mgt_cuda_fail_dnn((d), mgt_e_, #call, __FILE__, __LINE__); \
    } while (0)

// Makes the replica's error sticky with this text (the first one wins).
void mgt_cuda_make_sticky(mgt_cuda_dev *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

// ---- recoverable sets (survive.cu): --on-device-failure continue ----
enum { MGT_CUDA_MARK_CHUNK = 1024, MGT_CUDA_MARK_LOST = 0, MGT_CUDA_MARK_UNHANG = 1 };
// Reads MGT_CUDA_FAULT into o; MGT_ERR_INVALID naming the variable when it is malformed or names
// a replica past n.
mgt_status mgt_cuda_faults_parse(mgt_cuda_options *o, int n);
// At open, once the replicas exist: resolves cuStreamWaitValue32 and gives each replica its
// first chunk of marks (a recoverable set; otherwise nothing).
mgt_status mgt_cuda_survive_open(mgt_cuda_set *set);
// Frees the replica's marks (only when drained: a queued wait may still read them).
void mgt_cuda_survive_free(mgt_cuda_dev *d, bool drained);
// Ends injected hangs (the set is closing: every wait on them is over).
void mgt_cuda_survive_unhang(mgt_cuda_set *set);
// An event's mark: taken at create, given back at destroy (a recoverable set; else -1).
mgt_status mgt_cuda_mark_take(mgt_cuda_event *e);
void mgt_cuda_mark_put(mgt_cuda_event *e);
// After cudaEventRecord(e, s): the record's mark, written when s reaches it.
mgt_status mgt_cuda_mark_record(mgt_cuda_event *e, mgt_cuda_stream *s);
// s waits for e's latest record through its mark (e on another replica).
mgt_status mgt_cuda_mark_wait(mgt_cuda_stream *s, mgt_cuda_event *e);
// A copy by a kernel on s's GPU that reads src (peer access, or the same GPU) unless either
// replica is given up by the time it starts.
mgt_status mgt_cuda_guarded_copy(mgt_cuda_stream *s, void *dst, mgt_cuda_dev *src_dev,
                                 const void *src, size_t bytes);

// Returns the replica's sticky error (or a raised kernel flag, made sticky) if any; every
// entry point starts with it, so that later calls on a failed replica fail too.
mgt_status mgt_cuda_dev_check(mgt_cuda_dev *d);
// Makes the current CUDA device s's GPU and checks stickiness.
mgt_status mgt_cuda_enter(mgt_cuda_stream *s);
// After enqueueing `what` on s: reports launch errors, and under MGT_CUDA_SYNC waits for
// the stream so that a fault is pinned to this call.
mgt_status mgt_cuda_after(mgt_cuda_stream *s, const char *what, const char *file, int line);
#define MGT_CUDA_AFTER(s, what) mgt_cuda_after((s), (what), __FILE__, __LINE__)

// Allocator paths for the backend's own buffers (workspace, scratch). A block used by one
// stream's work only is freed on that stream: reusable once the work queued so far has run.
void mgt_cuda_free_on_stream(mgt_cuda_stream *s, void *ptr);
// Replaces a stream's block (*buf, *have bytes; NULL, 0 for none) by a new one of `want` bytes,
// counted against the device's memory limit under `what`; the old block is freed on the stream
// (reusable once the work queued so far has run): no wait, also mid-step. On failure *buf
// stays as it was.
mgt_status mgt_cuda_replace_block(mgt_cuda_stream *s, void **buf, size_t *have, size_t want,
                                  const char *what);
// A scratch region's size rounded up to 256 bytes, so the next one starts aligned.
inline size_t mgt_cuda_align256(size_t bytes) { return (bytes + 255) / 256 * 256; }
// Makes s->scratch at least `bytes`; the old block is freed on the stream (no wait).
mgt_status mgt_cuda_scratch(mgt_cuda_stream *s, size_t bytes);
// The same for s->lowp.
mgt_status mgt_cuda_lowp_buffer(mgt_cuda_stream *s, size_t bytes);
// Writes the rounded (encode16 false: fp32 values) or 16-bit (true) copies of a low-precision
// op's inputs into s->lowp, and *f as the fp32 op that reads them (lowp.cu).
mgt_status mgt_cuda_lowp_inputs(mgt_cuda_stream *s, const mgt_op *op, bool encode16, mgt_op *f);
// NCHW fp32 [n, c, hw] to NHWC 16-bit codes [n, hw, c], rounded as the casts round (a filter
// KCRS to KRSC is the same with n = K, c = C/groups, hw = R*S) (lowp.cu).
mgt_status mgt_cuda_to_nhwc16(mgt_cuda_stream *s, uint16_t *dst, const float *src, int n, int c,
                              int hw, bool bf16);
// The way back: dst [n, c, hw] = decode(src [n, hw, c]) + beta * dst (dst not read where beta
// is 0).
mgt_status mgt_cuda_from_nhwc16(mgt_cuda_stream *s, float *dst, const uint16_t *src, int n, int c,
                                int hw, float beta, bool bf16);

// ---- activations stored in 16 bits (mgt_op.store_in, store_out) ----

// The rounding and encodings of src/device/lowp.h (round to nearest even, fp16 overflow to
// inf, NaN kept quiet), the reference's and the CPU kernels', compiled for the device.
#define MGT_LOWP_FN __host__ __device__ static inline
#include "device/lowp.h"

// How an operand is stored: 16-bit codes (h; bf16 or fp16) or fp32. Kernels widen on load,
// compute in fp32 and round once on store.
struct mgt_sto {
    bool h, bf16;
};
inline mgt_sto mgt_sto_of(mgt_precision p)
{
    return mgt_sto{p != MGT_PREC_F32, p == MGT_PREC_BF16};
}

__device__ inline float sto_ld(const void *p, size_t i, mgt_sto s)
{
    return s.h ? mgt_lowp_decode(s.bf16 ? MGT_PREC_BF16 : MGT_PREC_FP16, ((const uint16_t *)p)[i])
               : ((const float *)p)[i];
}

__device__ inline void sto_st(void *p, size_t i, float v, mgt_sto s)
{
    if (s.h)
        ((uint16_t *)p)[i] = mgt_lowp_encode(s.bf16 ? MGT_PREC_BF16 : MGT_PREC_FP16, v);
    else
        ((float *)p)[i] = v;
}

// Element i (of hw) of channel ch of image n in an [n, c, hw] activation: NCHW or NHWC (the
// layouts the CUDA kernels take; nChw16c is the mock devices').
__device__ inline size_t lay_at(bool nhwc, int c, int hw, int n, int ch, int i)
{
    return nhwc ? ((size_t)n * hw + i) * c + ch : ((size_t)n * c + ch) * hw + i;
}

// A copy of a [n, c, hw] activation between layouts and storages, coalesced on both sides
// (32x32 tiles through shared memory): dst = src + beta * dst (dst not read where beta is 0),
// rounded once where dst is 16-bit. A filter KCRS <-> KRSC is the same with n = K, c = C/g,
// hw = R*S (store16.cu).
mgt_status mgt_cuda_relayout(mgt_cuda_stream *s, void *dst, bool dst_nhwc, mgt_sto dst_sto,
                             const void *src, bool src_nhwc, mgt_sto src_sto, int n, int c, int hw,
                             float beta);

// The 16-bit storage forms behind mgt_cuda_store16 (cuda_impl.h).
mgt_status mgt_cuda_act16(mgt_cuda_stream *s, const mgt_op *op);
mgt_status mgt_cuda_conv16(mgt_cuda_stream *s, const mgt_op *op);

// The stream's cuBLAS handle, made on first use (dnn.cu).
mgt_status mgt_cuda_blas(mgt_cuda_stream *s);
// The layer norm's row path (hw == 1: LayerNorm over the last dimension), which
// layernorm_channels_forward and _backward take (transformer.cu).
mgt_status cuda_ln_rows_fwd(mgt_cuda_stream *s, const mgt_op *op);
mgt_status cuda_ln_rows_bwd(mgt_cuda_stream *s, const mgt_op *op);

// ---- what the kernel files share ----

// Every launcher opens with it: the replica's GPU current, its sticky error returned.
#define MGT_ENTER(s)                        \
    do {                                    \
        mgt_status st_ = mgt_cuda_enter(s); \
        if (st_ != MGT_OK)                  \
            return st_;                     \
    } while (0)

const int kThreads = 256; // threads per block of the 1-D kernels
const int kWarpsPerBlock = kThreads / 32;
const unsigned kFullMask = 0xffffffffu;

// Enough blocks to cover n with one element per thread, capped: the kernels loop
// (grid-stride), so the cap only bounds the launch, never the work.
inline unsigned blocks_for(size_t n)
{
    size_t b = (n + kThreads - 1) / kThreads;
    if (b < 1)
        b = 1;
    if (b > ((size_t)1 << 20))
        b = (size_t)1 << 20;
    return (unsigned)b;
}

// Blocks for kernels that give one warp to each of `rows` rows.
inline unsigned blocks_for_rows(long rows)
{
    long b = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
    if (b < 1)
        b = 1;
    if (b > 65535)
        b = 65535;
    return (unsigned)b;
}

// The first maximum in raster order of pooling window (oh, ow) over an h x w plane, as the
// reference picks it: the first in-bounds element starts the scan and only a strictly larger
// value replaces it, so ties keep the earliest and an all -inf window routes to its first
// in-bounds element. Its position ih*w + iw; -1 for a window on no input. at(i) loads plane
// position i; Dims has the window's h, w, kh, kw, sh, sw, ph, pw (both max-pool kernels').
template <class Dims, class Load>
__device__ inline int window_first_max(int oh, int ow, const Dims &d, Load at)
{
    const int h0 = oh * d.sh - d.ph, w0 = ow * d.sw - d.pw;
    int arg = -1;
    float best = 0.0f;
    for (int i = 0; i < d.kh; i++) {
        const int ih = h0 + i;
        if (ih < 0 || ih >= d.h)
            continue;
        for (int j = 0; j < d.kw; j++) {
            const int iw = w0 + j;
            if (iw < 0 || iw >= d.w)
                continue;
            const float v = at(ih * d.w + iw);
            if (arg < 0 || v > best) {
                best = v;
                arg = ih * d.w + iw;
            }
        }
    }
    return arg;
}

// The outputs of a pooling window (kernel k, stride st, padding pad, out outputs) whose window
// covers input i along one axis: lo..hi (empty when lo > hi). Both max-pool backward kernels.
__device__ inline void pool_outputs_over(int i, int k, int st, int pad, int out, int *lo, int *hi)
{
    const int first = i + pad - k + 1;
    *lo = first <= 0 ? 0 : (first + st - 1) / st;
    *hi = (i + pad) / st;
    if (*hi > out - 1)
        *hi = out - 1;
}

__device__ inline size_t thread_index() { return (size_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ inline size_t thread_stride() { return (size_t)gridDim.x * blockDim.x; }

// ---- per-channel sums over the rows of a channels-last activation ----
//
// An NHWC activation is [rows, c] with the channel fastest. Sums per channel (or per group of
// rows and channel) go in two launches: thread (group, chunk, channel) walks its chunk's rows,
// adding f(row, ch) (a double2; f may also write the element: the one pass over memory), so
// that neighbouring threads read neighbouring channels (coalesced); then one thread per
// (group, channel) adds the chunks in order and hands the sum to done(group, ch, sum). Every
// sum in an order fixed by the sizes alone; batch norm's statistics (store16.cu) are the same
// scheme written out.

// Row chunks per group: about 64K threads in all, and at least 32 rows a chunk, so that the
// partial sums (16 bytes a chunk and channel) stay small beside the data. device/bytes.c
// counts the same.
inline int mgt_cuda_row_chunks(size_t rows, size_t lanes)
{
    size_t k = ((size_t)1 << 16) / (lanes ? lanes : 1), most = (rows + 31) / 32;
    if (k > most)
        k = most;
    if (k < 1)
        k = 1;
    return (int)k;
}

struct row_sums {
    size_t rows; // per group; row r of group g is global row g * rows + r
    int c, groups, chunks;
};

template <class F> __global__ void k_row_partial(double2 *partial, row_sums d, F f)
{
    const size_t per = (d.rows + d.chunks - 1) / d.chunks;
    const size_t total = (size_t)d.groups * d.chunks * d.c;
    for (size_t t = thread_index(); t < total; t += thread_stride()) {
        const int ch = (int)(t % (size_t)d.c);
        const size_t k = (t / (size_t)d.c) % (size_t)d.chunks;
        const size_t g = t / ((size_t)d.c * d.chunks);
        const size_t r0 = k * per, r1 = r0 + per < d.rows ? r0 + per : d.rows;
        double2 acc = make_double2(0.0, 0.0);
        for (size_t r = r0; r < r1; r++) {
            const double2 v = f(g * d.rows + r, ch);
            acc.x += v.x;
            acc.y += v.y;
        }
        partial[t] = acc;
    }
}

template <class D> __global__ void k_row_finish(const double2 *partial, row_sums d, D done)
{
    const size_t total = (size_t)d.groups * d.c;
    for (size_t t = thread_index(); t < total; t += thread_stride()) {
        const int ch = (int)(t % (size_t)d.c);
        const size_t g = t / (size_t)d.c;
        double2 s = make_double2(0.0, 0.0);
        for (int k = 0; k < d.chunks; k++) {
            const double2 v = partial[(g * d.chunks + k) * d.c + ch];
            s.x += v.x;
            s.y += v.y;
        }
        done(g, ch, s);
    }
}

// The scratch bytes of the partial sums.
inline size_t mgt_cuda_row_sums_bytes(size_t rows, int c, int groups)
{
    return (size_t)groups * mgt_cuda_row_chunks(rows, (size_t)groups * c) * c * sizeof(double2);
}

// Both launches on s, the partial sums in s's scratch from byte `offset` (256-aligned). A
// caller that keeps data of its own below offset makes the scratch offset +
// mgt_cuda_row_sums_bytes first: a scratch that grows loses what it held.
template <class F, class D>
mgt_status mgt_cuda_row_sums_at(mgt_cuda_stream *s, size_t offset, size_t rows, int c, int groups,
                                F f, D done)
{
    row_sums d = {rows, c, groups, mgt_cuda_row_chunks(rows, (size_t)groups * c)};
    const size_t n = (size_t)groups * d.chunks * c;
    mgt_status st = mgt_cuda_scratch(s, offset + n * sizeof(double2));
    if (st != MGT_OK)
        return st;
    double2 *partial = (double2 *)((char *)s->scratch + offset);
    k_row_partial<<<blocks_for(n), kThreads, 0, s->stream>>>(partial, d, f);
    k_row_finish<<<blocks_for((size_t)groups * c), kThreads, 0, s->stream>>>(partial, d, done);
    return MGT_OK;
}

template <class F, class D>
mgt_status mgt_cuda_row_sums(mgt_cuda_stream *s, size_t rows, int c, int groups, F f, D done)
{
    return mgt_cuda_row_sums_at(s, 0, rows, c, groups, f, done);
}

// Butterfly reductions: every lane ends with the same value, combined in a fixed order.
__device__ inline float warp_sum(float v)
{
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(kFullMask, v, off);
    return v;
}

// The block's sum of every thread's acc, left in part[0] (part: kThreads shared doubles), in a
// fixed tree; every thread of the block calls it.
__device__ inline void block_sum(double *part, double acc)
{
    const int t = threadIdx.x;
    part[t] = acc;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w /= 2) {
        if (t < w)
            part[t] += part[t + w];
        __syncthreads();
    }
}

__device__ inline int warp_sum_int(int v)
{
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(kFullMask, v, off);
    return v;
}

__device__ inline float warp_max(float v)
{
    for (int off = 16; off > 0; off >>= 1)
        v = fmaxf(v, __shfl_xor_sync(kFullMask, v, off));
    return v;
}

// Philox4x32-10 on c with key (k0, k1), in place: Random123's rounds, as mgt_philox4x32_10.
__device__ inline void mgt_philox10(uint32_t c[4], uint32_t k0, uint32_t k1)
{
    for (int round = 0; round < 10; round++) {
        uint32_t lo0 = 0xD2511F53u * c[0], hi0 = __umulhi(0xD2511F53u, c[0]);
        uint32_t lo1 = 0xCD9E8D57u * c[2], hi1 = __umulhi(0xCD9E8D57u, c[2]);
        uint32_t n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0;
        c[1] = lo1;
        c[2] = n2;
        c[3] = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}

// Records the first bad label of the replica in its mapped flag; the host turns it into
// MGT_ERR_DEVICE at the next wait. The claim (in device memory) picks one writer; the code
// slot is written last, after a fence that makes row and label visible to the host first.
__device__ inline void raise_label_error(int *flag, int *claim, int code, int row, int label,
                                         int classes)
{
    if (atomicCAS(claim, 0, 1) != 0)
        return;
    flag[MGT_CUDA_FLAG_ROW] = row;
    flag[MGT_CUDA_FLAG_LABEL] = label;
    flag[MGT_CUDA_FLAG_CLASSES] = classes;
    __threadfence_system();
    *(volatile int *)&flag[MGT_CUDA_FLAG_CODE] = code;
}

#endif
