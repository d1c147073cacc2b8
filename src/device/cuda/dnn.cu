// The CUDA backend's library kernels: gemm through cuBLAS, convolution and batch norm
// through cuDNN's legacy API, with algorithms chosen once per shape and cached.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "device/cuda/common.cuh"
#include "device/refusal.h"

// ---- handles, made on first use per stream ----

static mgt_status ensure_blas(mgt_cuda_stream *s)
{
    if (s->blas != NULL)
        return MGT_OK;
    mgt_cuda_dev *d = s->dev;
    cublasHandle_t h = NULL;
    MGT_CUBLAS_TRY(d, cublasCreate(&h));
    // Stream first: cublasSetStream resets any workspace set before it.
    cublasStatus_t e = cublasSetStream(h, s->stream);
    if (e == CUBLAS_STATUS_SUCCESS)
        // FP32 stays FP32 unless MGT_TF32=1: results must match the CPU reference.
        e = cublasSetMathMode(h,
                              d->set->opt.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
    if (e != CUBLAS_STATUS_SUCCESS) {
        cublasDestroy(h);
        return mgt_cuda_fail_blas(d, e, "cublasSetStream/cublasSetMathMode", __FILE__, __LINE__);
    }
    s->blas = h;
    return MGT_OK;
}

static mgt_status ensure_dnn(mgt_cuda_stream *s)
{
    if (s->dnn != NULL)
        return MGT_OK;
    mgt_cuda_dev *d = s->dev;
    // Descriptors first and kept per stream (set per call, never created in the step loop);
    // stream_destroy frees whatever of them exists.
    if (s->xd == NULL)
        MGT_CUDNN_TRY(d, cudnnCreateTensorDescriptor(&s->xd));
    if (s->yd == NULL)
        MGT_CUDNN_TRY(d, cudnnCreateTensorDescriptor(&s->yd));
    if (s->bnd == NULL)
        MGT_CUDNN_TRY(d, cudnnCreateTensorDescriptor(&s->bnd));
    if (s->wd == NULL)
        MGT_CUDNN_TRY(d, cudnnCreateFilterDescriptor(&s->wd));
    if (s->cd == NULL)
        MGT_CUDNN_TRY(d, cudnnCreateConvolutionDescriptor(&s->cd));
    cudnnHandle_t h = NULL;
    MGT_CUDNN_TRY(d, cudnnCreate(&h));
    cudnnStatus_t e = cudnnSetStream(h, s->stream);
    if (e != CUDNN_STATUS_SUCCESS) {
        cudnnDestroy(h);
        return mgt_cuda_fail_dnn(d, e, "cudnnSetStream", __FILE__, __LINE__);
    }
    s->dnn = h;
    return MGT_OK;
}

mgt_status mgt_cuda_blas(mgt_cuda_stream *s) { return ensure_blas(s); }

// ---- gemm ----

// Our matrices are row-major; cuBLAS reads column-major. A row-major X [r, c] with row
// stride ld is, read column-major with leading dimension ld, the matrix X^T. So
//   C = op(A) op(B)   (row-major, C [m, n])
// is computed as
//   C^T = op(B)^T op(A)^T   (column-major, C^T [n, m], ldc)
// i.e. cuBLAS's "A" is our B (ldb) with our trans_b, its "B" is our A (lda) with our
// trans_a, and its M, N, K are our n, m, k.
static mgt_status gemm_f32(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    mgt_status st = ensure_blas(s);
    if (st != MGT_OK)
        return st;
    const auto &g = op->u.gemm;
    MGT_CUBLAS_TRY(s->dev, cublasSgemm(s->blas, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                       g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.n, g.m, g.k,
                                       &g.alpha, g.b, g.ldb, g.a, g.lda, &g.beta, g.c, g.ldc));
    return MGT_CUDA_AFTER(s, "gemm (cublasSgemm)");
}

// ---- convolution ----

// ---- convolution algorithms ----
//
// Two ways to choose, cached per process (not per device set, so a later set, a resume or a
// validation pass in the same process runs the same kernels):
// - by default, cuDNN's timed search (cudnnFind*Ex) on the GPU, once per GPU and shape, the
//   candidates fastest first; the lock is the GPU's own, so GPUs search in parallel;
// - under --deterministic, a fixed rule: cuDNN's heuristic order (cudnnGet*Algorithm_v7)
//   filtered to deterministic algorithms within the workspace cap, once per GPU model and
//   shape. Two deterministic algorithms still differ in their bits, and timing would pick
//   either from run to run and GPU to GPU; the heuristics depend on the model and the shape
//   alone, so every replica and every run of the same model picks the same one.
// The key leaves the batch size out: the last, short batch of an epoch and validation reuse
// the choice; the workspace is asked of cuDNN for the actual shape on each call, and an
// algorithm cuDNN refuses for a batch size is remembered for it instead of tried again.

namespace {

struct conv_entry {
    std::vector<mgt_cuda_algo> cands;      // in the order of preference; fixed once made
    std::set<std::pair<int, int>> refused; // (batch, candidate) that cuDNN refused
};

struct algo_cache {
    std::mutex lock; // held through a timed search: replicas of one GPU search once
    std::map<std::vector<int>, conv_entry> entries;
    // 16-bit shapes (the entry's key and the batch) whose refusal is remembered
    // (mgt_lp_refusal_action): they take the rounded-fp32 path without asking cuDNN again.
    std::set<std::vector<int>> no16;
};

std::mutex g_caches_lock;
// "gpu N" for timed choices, "model NAME" for deterministic ones. std::map nodes never move
// and are never erased, so the pointers handed out stay valid for the process.
std::map<std::string, algo_cache> g_caches;

algo_cache *cache_for(const mgt_cuda_dev *d, bool by_model)
{
    char name[160];
    if (by_model)
        snprintf(name, sizeof name, "model %s", d->model);
    else
        snprintf(name, sizeof name, "gpu %d", d->gpu);
    std::lock_guard<std::mutex> g(g_caches_lock);
    return &g_caches[name];
}

} // namespace

// Whether a result's math is what was asked, and no less: fp32 data computes in FMA (a
// DEFAULT result is pinned to FMA) unless --tf32 also admits TF32 tensor cores (TENSOR_OP);
// 16-bit data may use the tensor cores. ALLOW_CONVERSION, which lets cuDNN round fp32 data
// to fp16 silently, and any math type newer than these are never taken.
static bool math_asked(cudnnMathType_t m, bool lowp, bool tf32)
{
    switch (m) {
    case CUDNN_DEFAULT_MATH:
    case CUDNN_FMA_MATH: return true;
    case CUDNN_TENSOR_OP_MATH: return lowp || tf32;
    default: return false;
    }
}

// Keeps the usable results of a cudnnFind*Ex or cudnnGet*_v7 call in the order cuDNN gave
// them: deterministic ones only under --deterministic, with the math asked for (math_asked),
// and (max_ws > 0) within that much workspace.
template <typename Perf>
static void keep_results(const Perf *perf, int got, const mgt_cuda_options &opt, bool lowp,
                         size_t max_ws, std::vector<mgt_cuda_algo> *out)
{
    for (int i = 0; i < got; i++) {
        const Perf &p = perf[i];
        if (p.status != CUDNN_STATUS_SUCCESS)
            continue;
        if (opt.deterministic && p.determinism != CUDNN_DETERMINISTIC)
            continue;
        if (!math_asked(p.mathType, lowp, opt.tf32))
            continue;
        if (max_ws > 0 && p.memory > max_ws)
            continue;
        mgt_cuda_algo a;
        a.algo = (int)p.algo;
        a.memory = p.memory;
        // Without TF32 every fp32 run is pinned to FMA math, whatever cuDNN reported.
        a.math = opt.tf32 || lowp ? p.mathType : CUDNN_FMA_MATH;
        out->push_back(a);
    }
}

// What a cuDNN status on the 16-bit path comes to (refusal.h decides what follows): every
// status of cuDNN 9 by name, the categories for any newer one.
static mgt_lp_refusal refusal_of(cudnnStatus_t e)
{
    switch (e) {
    case CUDNN_STATUS_SUCCESS: return MGT_LP_REFUSAL_NONE;
    // no 16-bit kernel for the shape, type, layout or GPU
    case CUDNN_STATUS_NOT_SUPPORTED:
    case CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN:
    case CUDNN_STATUS_NOT_SUPPORTED_SHAPE:
    case CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE:
    case CUDNN_STATUS_NOT_SUPPORTED_LAYOUT:
    case CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH:
    case CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT:
    case CUDNN_STATUS_NOT_SUPPORTED_PADDING:
    case CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM:
    case CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API:
    case CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE:
    case CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED: // no kernel could be built for it
    case CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM: return MGT_LP_REFUSAL_NO_KERNEL;
    // the 16-bit NHWC configuration's parameters (grouped, odd channel counts)
    case CUDNN_STATUS_BAD_PARAM:
    case CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED:
    case CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND:
    case CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT:
    case CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH:
    case CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES:
    case CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE:
    case CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE: return MGT_LP_REFUSAL_BAD_PARAM;
    // memory short now
    case CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED:
    case CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED:
    case CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED: return MGT_LP_REFUSAL_NO_MEMORY;
    // the installation
    case CUDNN_STATUS_NOT_INITIALIZED:
    case CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH:
    case CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH:
    case CUDNN_STATUS_DEPRECATED:
    case CUDNN_STATUS_LICENSE_ERROR:
    case CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED:
    case CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER:
    case CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART:
    case CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING:
    case CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE: return MGT_LP_REFUSAL_BROKEN;
    // the device, or our own call (the fp32 path would make the same one)
    case CUDNN_STATUS_RUNTIME_IN_PROGRESS:
    case CUDNN_STATUS_RUNTIME_FP_OVERFLOW:
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER:
    case CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER:
    case CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH:
    case CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH:
    case CUDNN_STATUS_INTERNAL_ERROR:
    case CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE:
    case CUDNN_STATUS_EXECUTION_FAILED:
    case CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER:
    case CUDNN_STATUS_EXECUTION_FAILED_CUBLAS:
    case CUDNN_STATUS_EXECUTION_FAILED_CUDART:
    case CUDNN_STATUS_EXECUTION_FAILED_CURAND: return MGT_LP_REFUSAL_FAULT;
    default: break;
    }
    switch (CUDNN_STATUS_CATEGORY(e)) {
    case 1000: return MGT_LP_REFUSAL_BROKEN; // the category of CUDNN_STATUS_NOT_INITIALIZED
    case CUDNN_STATUS_BAD_PARAM: return MGT_LP_REFUSAL_BAD_PARAM;
    case CUDNN_STATUS_NOT_SUPPORTED: return MGT_LP_REFUSAL_NO_KERNEL;
    default: return MGT_LP_REFUSAL_FAULT;
    }
}

// A failed cuDNN call of a convolution: the error, and on the 16-bit path (why non-NULL)
// what the status comes to.
static mgt_status conv_fail(mgt_cuda_dev *d, cudnnStatus_t e, const char *call, int line,
                            mgt_lp_refusal *why)
{
    if (why != NULL)
        *why = refusal_of(e);
    return mgt_cuda_fail_dnn(d, e, call, __FILE__, line);
}

#define MGT_CONV_TRY(d, why, call)                                 \
    do {                                                           \
        cudnnStatus_t mgt_e_ = (call);                             \
        if (mgt_e_ != CUDNN_STATUS_SUCCESS)                        \
            return conv_fail((d), mgt_e_, #call, __LINE__, (why)); \
    } while (0)

static mgt_status no_algorithm(mgt_cuda_dev *d, mgt_op_kind dir, bool lowp, size_t ws_bytes)
{
    const mgt_cuda_options &opt = d->set->opt;
    return mgt_error_set(opt.deterministic || lowp ? MGT_ERR_UNSUPPORTED : MGT_ERR_DEVICE,
                         "cuda device %d (gpu %d): %s: cuDNN has no %salgorithm for this shape "
                         "within %zu MiB of workspace",
                         d->index, d->gpu, mgt_op_name(dir),
                         opt.deterministic ? "deterministic (--deterministic) " : "",
                         ws_bytes >> 20);
}

// The fixed rule of --deterministic: cuDNN's heuristic order for the shape described by s's
// descriptors, deterministic algorithms within the workspace cap. Nothing runs on the GPU.
static mgt_status heuristic_algos(mgt_cuda_stream *s, mgt_op_kind dir, bool lowp,
                                  std::vector<mgt_cuda_algo> *out, mgt_lp_refusal *why)
{
    mgt_cuda_dev *d = s->dev;
    const mgt_cuda_options &opt = d->set->opt;
    int got = 0;
    cudnnStatus_t e;
    if (dir == MGT_OP_CONV2D_FWD) {
        cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        e = cudnnGetConvolutionForwardAlgorithm_v7(s->dnn, s->xd, s->wd, s->cd, s->yd,
                                                   CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, perf);
        if (e == CUDNN_STATUS_SUCCESS)
            keep_results(perf, got, opt, lowp, opt.find_ws_cap, out);
    } else if (dir == MGT_OP_CONV2D_BWD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        e = cudnnGetConvolutionBackwardDataAlgorithm_v7(
            s->dnn, s->wd, s->yd, s->cd, s->xd, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, perf);
        if (e == CUDNN_STATUS_SUCCESS)
            keep_results(perf, got, opt, lowp, opt.find_ws_cap, out);
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        e = cudnnGetConvolutionBackwardFilterAlgorithm_v7(s->dnn, s->xd, s->yd, s->cd, s->wd,
                                                          CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
                                                          &got, perf);
        if (e == CUDNN_STATUS_SUCCESS)
            keep_results(perf, got, opt, lowp, opt.find_ws_cap, out);
    }
    // On the 16-bit path, the caller decides by what the status comes to.
    if (e != CUDNN_STATUS_SUCCESS)
        return conv_fail(d, e, "cudnnGetConvolution*Algorithm_v7", __LINE__, lowp ? why : NULL);
    return out->empty() ? no_algorithm(d, dir, lowp, opt.find_ws_cap) : MGT_OK;
}

// Runs cuDNN's timed search for the shape described by s's descriptors. The output goes to
// a temporary buffer (the search overwrites it, and a beta != 0 output must survive); the
// inputs are the real ones, read only. Runs once per GPU and shape; its two buffers come from
// and go back to the stream-ordered pool (cudaMallocAsync, cudaFreeAsync), so that neither
// the search's end nor a later cudaFree waits on every stream of the GPU.
// *cut_ws: the workspace the search wanted could not be allocated whole (device memory was
// short at that moment), so an empty answer is not the shape's for good.
static mgt_status find_algos(mgt_cuda_stream *s, mgt_op_kind dir, bool lowp, size_t out_bytes,
                             const void *in1, const void *in2, std::vector<mgt_cuda_algo> *out,
                             bool *cut_ws, mgt_lp_refusal *why)
{
    mgt_cuda_dev *d = s->dev;
    const mgt_cuda_options &opt = d->set->opt;
    void *tmp = NULL, *ws = NULL;
    size_t ws_bytes = 0, free_b = 0, total_b = 0;
    int got = 0;
    cudnnStatus_t e = CUDNN_STATUS_SUCCESS;
    cudnnConvolutionFwdAlgoPerf_t fwd[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    cudnnConvolutionBwdDataAlgoPerf_t bwd_data[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    cudnnConvolutionBwdFilterAlgoPerf_t bwd_filter[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];

    // The inputs come from earlier work on this stream; the search times kernels, so let
    // that work finish first (abortable, bounded: the run's flag and wait limit).
    mgt_status st =
        d->hooks.wait != NULL ? d->hooks.wait(d->owner, s, "the work before cudnnFind") : MGT_OK;
    if (st != MGT_OK)
        return st;
    cudaError_t r = cudaMallocAsync(&tmp, out_bytes, s->stream);
    if (r != cudaSuccess)
        return mgt_cuda_fail_rt(d, r, "cudaMallocAsync (cudnnFind output)", __FILE__, __LINE__,
                                false);
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
        free_b = 0;
    ws_bytes = std::min(opt.find_ws_cap, free_b / 2);
    const size_t want_ws = ws_bytes;
    while (ws_bytes >= ((size_t)1 << 20) &&
           cudaMallocAsync(&ws, ws_bytes, s->stream) != cudaSuccess) {
        ws = NULL;
        ws_bytes /= 2;
    }
    (void)cudaGetLastError();
    if (ws == NULL)
        ws_bytes = 0;
    *cut_ws = ws_bytes < want_ws;

    if (dir == MGT_OP_CONV2D_FWD) {
        e = cudnnFindConvolutionForwardAlgorithmEx(s->dnn, s->xd, in1, s->wd, in2, s->cd, s->yd,
                                                   tmp, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, fwd,
                                                   ws, ws_bytes);
        if (e == CUDNN_STATUS_SUCCESS)
            keep_results(fwd, got, opt, lowp, 0, out);
    } else if (dir == MGT_OP_CONV2D_BWD_DATA) {
        e = cudnnFindConvolutionBackwardDataAlgorithmEx(
            s->dnn, s->wd, in2, s->yd, in1, s->cd, s->xd, tmp,
            CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, bwd_data, ws, ws_bytes);
        if (e == CUDNN_STATUS_SUCCESS)
            keep_results(bwd_data, got, opt, lowp, 0, out);
    } else {
        e = cudnnFindConvolutionBackwardFilterAlgorithmEx(
            s->dnn, s->xd, in2, s->yd, in1, s->cd, s->wd, tmp,
            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, bwd_filter, ws, ws_bytes);
        if (e == CUDNN_STATUS_SUCCESS)
            keep_results(bwd_filter, got, opt, lowp, 0, out);
    }
    // Released in stream order, after the search's kernels.
    cudaFreeAsync(tmp, s->stream);
    if (ws != NULL)
        cudaFreeAsync(ws, s->stream);
    (void)cudaGetLastError();
    // On the 16-bit path, the caller decides by what the status comes to.
    if (e != CUDNN_STATUS_SUCCESS)
        return conv_fail(d, e, "cudnnFindConvolution*AlgorithmEx", __LINE__, lowp ? why : NULL);
    return out->empty() ? no_algorithm(d, dir, lowp, ws_bytes) : MGT_OK;
}

// What one convolution call reads and writes: fp32 NCHW tensors (dt CUDNN_DATA_FLOAT), or the
// tensor-core path's 16-bit NHWC copies (lowp; dt CUDNN_DATA_BFLOAT16 or CUDNN_DATA_HALF,
// accumulated in fp32).
struct conv_io {
    void *out;
    const void *in1, *in2;
    float beta;
    cudnnDataType_t dt;
    bool lowp;
};

// The algorithm cache's key of a shape: not the batch (see above); tf32 and deterministic
// change the candidates.
static std::vector<int> conv_key(const mgt_cuda_options &opt, mgt_op_kind dir,
                                 const mgt_conv2d_shape *sh, cudnnDataType_t dt)
{
    return {(int)dir,      sh->c,
            sh->h,         sh->w,
            sh->k,         sh->r,
            sh->s,         sh->stride_h,
            sh->stride_w,  sh->pad_h,
            sh->pad_w,     sh->groups,
            (int)opt.tf32, (int)opt.deterministic,
            (int)dt};
}

// MGT_CUDNN_ALGO_LOG=FILE: one line per shape as its candidates are chosen (appended), so a
// failure or a slow shape on a GPU can be traced to the algorithm cuDNN ran.
static void log_entry(const mgt_cuda_dev *d, const std::vector<int> &key, const conv_entry &e,
                      mgt_status st)
{
    static std::mutex lock;
    const char *path = getenv("MGT_CUDNN_ALGO_LOG");
    if (path == NULL || path[0] == '\0')
        return;
    std::lock_guard<std::mutex> g(lock);
    FILE *f = fopen(path, "a");
    if (f == NULL)
        return;
    fprintf(f,
            "%s gpu %d %s c=%d h=%d w=%d k=%d r=%d s=%d stride=%d,%d pad=%d,%d groups=%d "
            "tf32=%d deterministic=%d dtype=%d:",
            d->model, d->gpu, mgt_op_name((mgt_op_kind)key[0]), key[1], key[2], key[3], key[4],
            key[5], key[6], key[7], key[8], key[9], key[10], key[11], key[12], key[13], key[14]);
    if (e.cands.empty())
        fprintf(f, " no candidate (%s)", st == MGT_OK ? "refused, remembered" : mgt_error_last());
    for (const mgt_cuda_algo &a : e.cands)
        fprintf(f, " algo %d math %d ws %zu;", a.algo, (int)a.math, a.memory);
    fputc('\n', f);
    fclose(f);
}

// The cache entry of this shape, made on first use by the rule the options ask for. For the
// 16-bit path an entry may have no candidates: cuDNN runs none for the shape, and the caller
// falls back at once instead of searching again. *why (16-bit path) says what a failure
// comes to.
static mgt_status conv_entry_for(mgt_cuda_stream *s, mgt_op_kind dir, const mgt_conv2d_shape *sh,
                                 const conv_io &io, size_t out_bytes, algo_cache **cache_out,
                                 conv_entry **out, mgt_lp_refusal *why)
{
    mgt_cuda_dev *d = s->dev;
    const mgt_cuda_options &opt = d->set->opt;
    algo_cache *cache = cache_for(d, opt.deterministic);
    std::vector<int> key = conv_key(opt, dir, sh, io.dt);
    std::lock_guard<std::mutex> g(cache->lock);
    *cache_out = cache;
    auto it = cache->entries.find(key);
    if (it != cache->entries.end()) {
        *out = &it->second;
        return MGT_OK;
    }
    conv_entry entry;
    bool cut_ws = false;
    mgt_lp_refusal found = MGT_LP_REFUSAL_NONE;
    mgt_status st = opt.deterministic ? heuristic_algos(s, dir, io.lowp, &entry.cands, &found)
                                      : find_algos(s, dir, io.lowp, out_bytes, io.in1, io.in2,
                                                   &entry.cands, &cut_ws, &found);
    if (st != MGT_OK && !io.lowp)
        return st;
    if (st != MGT_OK) {
        // an empty answer is no 16-bit kernel, unless the workspace was cut short
        if (found == MGT_LP_REFUSAL_NONE || (cut_ws && found == MGT_LP_REFUSAL_NO_KERNEL))
            found = cut_ws ? MGT_LP_REFUSAL_NO_MEMORY : MGT_LP_REFUSAL_NO_KERNEL;
        *why = found;
        if (mgt_lp_refusal_action(found) != MGT_LP_FP32_REMEMBER) // a later call asks again
            return st;
        entry.cands.clear(); // a 16-bit shape cuDNN refuses is remembered, empty
    }
    log_entry(d, key, entry, MGT_OK);
    *out = &cache->entries.emplace(key, std::move(entry)).first->second;
    return MGT_OK;
}

// The workspace candidate a needs for the shape of s's descriptors.
static cudnnStatus_t conv_ws_size(mgt_cuda_stream *s, mgt_op_kind dir, const mgt_cuda_algo &a,
                                  size_t *bytes)
{
    switch (dir) {
    case MGT_OP_CONV2D_FWD:
        return cudnnGetConvolutionForwardWorkspaceSize(s->dnn, s->xd, s->wd, s->cd, s->yd,
                                                       (cudnnConvolutionFwdAlgo_t)a.algo, bytes);
    case MGT_OP_CONV2D_BWD_DATA:
        return cudnnGetConvolutionBackwardDataWorkspaceSize(
            s->dnn, s->wd, s->yd, s->cd, s->xd, (cudnnConvolutionBwdDataAlgo_t)a.algo, bytes);
    default:
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(
            s->dnn, s->xd, s->yd, s->cd, s->wd, (cudnnConvolutionBwdFilterAlgo_t)a.algo, bytes);
    }
}

// Makes the stream's cuDNN workspace at least `bytes`. The old block is freed on the stream
// (reusable once the work queued so far has run): no wait, also mid-step.
static mgt_status ensure_ws(mgt_cuda_stream *s, size_t bytes)
{
    if (bytes <= s->ws_bytes)
        return MGT_OK;
    const size_t mib = (size_t)1 << 20;
    return mgt_cuda_replace_block(s, &s->ws, &s->ws_bytes, (bytes + mib - 1) / mib * mib,
                                  "cuDNN workspace");
}

static cudnnStatus_t conv_run(mgt_cuda_stream *s, mgt_op_kind dir, const mgt_cuda_algo &a,
                              const conv_io &io)
{
    void *out = io.out;
    const void *in1 = io.in1, *in2 = io.in2;
    const float beta = io.beta;
    const float one = 1.0f;
    switch (dir) {
    case MGT_OP_CONV2D_FWD: // y = conv(x = in1, w = in2) + beta*y
        return cudnnConvolutionForward(s->dnn, &one, s->xd, in1, s->wd, in2, s->cd,
                                       (cudnnConvolutionFwdAlgo_t)a.algo, s->ws, s->ws_bytes, &beta,
                                       s->yd, out);
    case MGT_OP_CONV2D_BWD_DATA: // dx = conv_transpose(dy = in1, w = in2) + beta*dx
        return cudnnConvolutionBackwardData(s->dnn, &one, s->wd, in2, s->yd, in1, s->cd,
                                            (cudnnConvolutionBwdDataAlgo_t)a.algo, s->ws,
                                            s->ws_bytes, &beta, s->xd, out);
    default: // dw = correlate(x = in2, dy = in1) + beta*dw
        return cudnnConvolutionBackwardFilter(s->dnn, &one, s->xd, in2, s->yd, in1, s->cd,
                                              (cudnnConvolutionBwdFilterAlgo_t)a.algo, s->ws,
                                              s->ws_bytes, &beta, s->wd, out);
    }
}

// *why (NULL on the fp32 path) gets what a failure of the 16-bit path comes to; it stays
// MGT_LP_REFUSAL_NONE for failures outside cuDNN's convolution (a handle, the casts).
static mgt_status conv2d(mgt_cuda_stream *s, mgt_op_kind dir, const conv_io &io,
                         const mgt_conv2d_shape *sh, mgt_lp_refusal *why)
{
    MGT_ENTER(s);
    mgt_status st = ensure_dnn(s);
    if (st != MGT_OK)
        return st;
    mgt_cuda_dev *d = s->dev;
    const int p = mgt_conv2d_out_h(sh), q = mgt_conv2d_out_w(sh);
    // x [n, c, h, w], y [n, k, p, q], w [k, c/groups, r, s], no dilation: NCHW fp32, or NHWC
    // (KRSC) 16-bit for the tensor-core path.
    const cudnnTensorFormat_t fmt = io.lowp ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    // On the 16-bit path every status decides by what it comes to (a grouped or odd-channel
    // NHWC descriptor may be refused as a bad parameter); on the fp32 path it is an error.
    mgt_lp_refusal *lp_why = io.lowp ? why : NULL;
    MGT_CONV_TRY(d, lp_why,
                 cudnnSetTensor4dDescriptor(s->xd, fmt, io.dt, sh->n, sh->c, sh->h, sh->w));
    MGT_CONV_TRY(d, lp_why, cudnnSetTensor4dDescriptor(s->yd, fmt, io.dt, sh->n, sh->k, p, q));
    MGT_CONV_TRY(
        d, lp_why,
        cudnnSetFilter4dDescriptor(s->wd, io.dt, fmt, sh->k, sh->c / sh->groups, sh->r, sh->s));
    // Our conv is torch's: cross-correlation (no kernel flip); fp32 accumulation always.
    MGT_CONV_TRY(d, lp_why,
                 cudnnSetConvolution2dDescriptor(s->cd, sh->pad_h, sh->pad_w, sh->stride_h,
                                                 sh->stride_w, 1, 1, CUDNN_CROSS_CORRELATION,
                                                 CUDNN_DATA_FLOAT));
    MGT_CONV_TRY(d, lp_why, cudnnSetConvolutionGroupCount(s->cd, sh->groups));
    // CUDNN_DEFAULT_MATH would let cuDNN use TF32 on Ampere and later; FMA math keeps FP32.
    // 16-bit data asks for the tensor cores.
    MGT_CONV_TRY(d, lp_why,
                 cudnnSetConvolutionMathType(s->cd, io.lowp            ? CUDNN_TENSOR_OP_MATH
                                                    : d->set->opt.tf32 ? CUDNN_DEFAULT_MATH
                                                                       : CUDNN_FMA_MATH));

    size_t out_elems = dir == MGT_OP_CONV2D_FWD ? (size_t)sh->n * sh->k * p * q
                       : dir == MGT_OP_CONV2D_BWD_DATA
                           ? (size_t)sh->n * sh->c * sh->h * sh->w
                           : (size_t)sh->k * (sh->c / sh->groups) * sh->r * sh->s;
    algo_cache *cache = NULL;
    conv_entry *entry = NULL;
    const size_t esize = io.lowp ? sizeof(uint16_t) : sizeof(float);
    st = conv_entry_for(s, dir, sh, io, out_elems * esize, &cache, &entry, lp_why);
    if (st != MGT_OK)
        return st;
    const std::vector<mgt_cuda_algo> &cands = entry->cands; // fixed once made: no lock
    if (cands.empty()) { // only for 16-bit data, where cuDNN runs nothing for the shape
        if (lp_why != NULL)
            *lp_why = MGT_LP_REFUSAL_NO_KERNEL;
        return no_algorithm(d, dir, io.lowp, 0);
    }
    std::vector<char> skip(cands.size(), 0);
    {
        std::lock_guard<std::mutex> g(cache->lock);
        for (size_t i = 0; i < cands.size(); i++)
            skip[i] = entry->refused.count(std::make_pair(sh->n, (int)i)) != 0;
    }
    auto refuse = [&](size_t i) {
        std::lock_guard<std::mutex> g(cache->lock);
        entry->refused.emplace(sh->n, (int)i);
    };

    // The first candidate cuDNN accepts for this shape and whose workspace we can have. A
    // refusal (not supported for this batch size with the math we pin) is remembered. Out of
    // memory for one workspace yields to a smaller one, except under --deterministic, where
    // running another algorithm than the rule's would change the bits silently.
    cudnnStatus_t e = CUDNN_STATUS_NOT_SUPPORTED;
    st = MGT_OK;
    for (size_t i = 0; i < cands.size(); i++) {
        if (skip[i])
            continue;
        const mgt_cuda_algo &a = cands[i];
        MGT_CONV_TRY(d, lp_why, cudnnSetConvolutionMathType(s->cd, a.math));
        size_t need = 0;
        e = conv_ws_size(s, dir, a, &need);
        if (CUDNN_STATUS_CATEGORY(e) == CUDNN_STATUS_NOT_SUPPORTED) {
            refuse(i);
            continue;
        }
        if (e != CUDNN_STATUS_SUCCESS)
            return conv_fail(d, e, "cudnnGetConvolution*WorkspaceSize", __LINE__, lp_why);
        st = ensure_ws(s, need);
        if (st != MGT_OK) {
            if (d->set->opt.deterministic)
                return st;
            e = CUDNN_STATUS_NOT_SUPPORTED;
            continue;
        }
        e = conv_run(s, dir, a, io);
        if (CUDNN_STATUS_CATEGORY(e) != CUDNN_STATUS_NOT_SUPPORTED)
            break;
        refuse(i);
    }
    if (st != MGT_OK && e != CUDNN_STATUS_SUCCESS) {
        if (lp_why != NULL) // no workspace now: memory short, not the shape
            *lp_why = MGT_LP_REFUSAL_NO_MEMORY;
        return st;
    }
    if (CUDNN_STATUS_CATEGORY(e) == CUDNN_STATUS_NOT_SUPPORTED) {
        if (lp_why != NULL)
            *lp_why = MGT_LP_REFUSAL_NO_KERNEL;
        return mgt_error_set(MGT_ERR_UNSUPPORTED,
                             "cuda device %d (gpu %d): %s: cuDNN refuses all %zu candidate "
                             "algorithms for batch %d of this shape",
                             d->index, d->gpu, mgt_op_name(dir), cands.size(), sh->n);
    }
    if (e != CUDNN_STATUS_SUCCESS)
        return conv_fail(d, e, mgt_op_name(dir), __LINE__, lp_why);
    return MGT_CUDA_AFTER(s, mgt_op_name(dir));
}

// The kind says which pass: forward out=y in1=x in2=w; backward data out=dx in1=dy in2=w;
// backward filter out=dw in1=dy in2=x. out = conv + beta * out.
static mgt_status conv2d_f32(mgt_cuda_stream *s, const mgt_op *op)
{
    const mgt_op_kind dir = op->kind;
    const auto &c = op->u.conv;
    try {
        conv_io io = {c.out, c.in1, c.in2, c.beta, CUDNN_DATA_FLOAT, false};
        return conv2d(s, dir, io, &c.sh, NULL);
    } catch (...) {
        return mgt_error_set(MGT_ERR_OOM, "cuda device %d: out of host memory in %s", s->dev->index,
                             mgt_op_name(dir));
    }
}

// ---- mixed precision ----

// cuBLAS on the 16-bit copies with an fp32 C and fp32 accumulation (CUBLAS_COMPUTE_32F):
// exactly a 16-bit gemm's arithmetic, on tensor cores where the GPU has them.
static mgt_status gemm_lp(mgt_cuda_stream *s, const mgt_op *op)
{
    mgt_status st = mgt_cuda_enter(s);
    if (st == MGT_OK)
        st = ensure_blas(s);
    mgt_op f;
    if (st == MGT_OK)
        st = mgt_cuda_lowp_inputs(s, op, true, &f);
    if (st != MGT_OK)
        return st;
    const auto &g = f.u.gemm;
    cudaDataType_t t = op->prec == MGT_PREC_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    MGT_CUBLAS_TRY(s->dev,
                   cublasGemmEx(s->blas, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.n, g.m, g.k, &g.alpha, g.b,
                                t, g.ldb, g.a, t, g.lda, &g.beta, g.c, CUDA_R_32F, g.ldc,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return MGT_CUDA_AFTER(s, "gemm (cublasGemmEx)");
}

mgt_status cuda_gemm(mgt_cuda_stream *s, const mgt_op *op)
{
    return op->prec == MGT_PREC_F32 ? gemm_f32(s, op) : gemm_lp(s, op);
}

// The tensor-core path: the two inputs as NHWC (filters KRSC) 16-bit copies in s->lowp, cuDNN's
// 16-bit convolution with fp32 accumulation into a 16-bit NHWC result there, and that result
// back to the op's fp32 NCHW output (+ beta * output). cuDNN's legacy API has no 16-bit-in,
// fp32-out configuration, so the output is rounded once to 16 bits, as autocast's convolutions
// return it; the conformance suite allows that one rounding on CUDA. The layout changes at
// each op's edges (the activations between ops stay NCHW fp32). A failure of cuDNN's part
// sets *why to what it comes to (refusal.h).
static mgt_status conv2d_tensor_cores(mgt_cuda_stream *s, const mgt_op *op, mgt_lp_refusal *why)
{
    const auto &c = op->u.conv;
    const mgt_conv2d_shape *sh = &c.sh;
    const mgt_op_kind dir = op->kind;
    const bool bf16 = op->prec == MGT_PREC_BF16;
    const int p = mgt_conv2d_out_h(sh), q = mgt_conv2d_out_w(sh), cg = sh->c / sh->groups;
    const size_t nx = (size_t)sh->n * sh->c * sh->h * sh->w, ny = (size_t)sh->n * sh->k * p * q,
                 nw = (size_t)sh->k * cg * sh->r * sh->s;
    const size_t bx = mgt_cuda_align256(nx * 2), by = mgt_cuda_align256(ny * 2),
                 bw = mgt_cuda_align256(nw * 2);
    mgt_status st = mgt_cuda_lowp_buffer(s, bx + by + bw);
    if (st != MGT_OK)
        return st;
    uint16_t *x16 = (uint16_t *)s->lowp, *y16 = (uint16_t *)((char *)s->lowp + bx),
             *w16 = (uint16_t *)((char *)s->lowp + bx + by);
    const float *in1 = (const float *)c.in1, *in2 = (const float *)c.in2;
    float *out = (float *)c.out;
    conv_io io = {NULL, NULL, NULL, 0.0f, bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF, true};
    switch (dir) {
    case MGT_OP_CONV2D_FWD: // y = conv(x, w)
        st = mgt_cuda_to_nhwc16(s, x16, in1, sh->n, sh->c, sh->h * sh->w, bf16);
        if (st == MGT_OK)
            st = mgt_cuda_to_nhwc16(s, w16, in2, sh->k, cg, sh->r * sh->s, bf16);
        io.out = y16, io.in1 = x16, io.in2 = w16;
        break;
    case MGT_OP_CONV2D_BWD_DATA: // dx = conv_transpose(dy, w)
        st = mgt_cuda_to_nhwc16(s, y16, in1, sh->n, sh->k, p * q, bf16);
        if (st == MGT_OK)
            st = mgt_cuda_to_nhwc16(s, w16, in2, sh->k, cg, sh->r * sh->s, bf16);
        io.out = x16, io.in1 = y16, io.in2 = w16;
        break;
    default: // dw = correlate(x, dy)
        st = mgt_cuda_to_nhwc16(s, y16, in1, sh->n, sh->k, p * q, bf16);
        if (st == MGT_OK)
            st = mgt_cuda_to_nhwc16(s, x16, in2, sh->n, sh->c, sh->h * sh->w, bf16);
        io.out = w16, io.in1 = y16, io.in2 = x16;
        break;
    }
    if (st == MGT_OK)
        st = conv2d(s, dir, io, sh, why);
    if (st != MGT_OK)
        return st;
    switch (dir) {
    case MGT_OP_CONV2D_FWD:
        return mgt_cuda_from_nhwc16(s, out, y16, sh->n, sh->k, p * q, c.beta, bf16);
    case MGT_OP_CONV2D_BWD_DATA:
        return mgt_cuda_from_nhwc16(s, out, x16, sh->n, sh->c, sh->h * sh->w, c.beta, bf16);
    default: return mgt_cuda_from_nhwc16(s, out, w16, sh->k, cg, sh->r * sh->s, c.beta, bf16);
    }
}

// The key under which a 16-bit shape's refusal is remembered: the algorithm cache's and the
// batch (a refusal of every candidate holds for one batch size).
static std::vector<int> no16_key(const mgt_cuda_dev *d, const mgt_op *op)
{
    const auto &c = op->u.conv;
    std::vector<int> key =
        conv_key(d->set->opt, op->kind, &c.sh,
                 op->prec == MGT_PREC_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF);
    key.push_back(c.sh.n);
    return key;
}

// Whether cuDNN refused this convolution's 16-bit form for good before (no16_refused).
static bool no16_known(algo_cache *cache, const std::vector<int> &key)
{
    std::lock_guard<std::mutex> g(cache->lock);
    return cache->no16.count(key) != 0;
}

// After cuDNN refused a 16-bit convolution (why, status st): MGT_OK to run the fallback, the
// shape remembered where refusal.h says it never runs in 16 bits; or the refusal as the error
// it is, naming the path ("16-bit", "16-bit channels-last").
static mgt_status no16_refused(algo_cache *cache, const std::vector<int> &key, mgt_status st,
                               mgt_lp_refusal why, const mgt_op *op, const char *path)
{
    switch (mgt_lp_refusal_action(why)) {
    case MGT_LP_FP32_REMEMBER: {
        std::lock_guard<std::mutex> g(cache->lock);
        cache->no16.insert(key);
        return MGT_OK;
    }
    case MGT_LP_FP32_ONCE: return MGT_OK;
    case MGT_LP_FAIL: break;
    }
    return mgt_error_wrap(st, "%s: cuDNN's %s convolution failed (%s)", mgt_op_name(op->kind), path,
                          mgt_lp_refusal_name(why));
}

// cuDNN's tensor cores on 16-bit NHWC copies where cuDNN has an algorithm for the shape;
// elsewhere the inputs rounded in fp32 and the fp32 convolution: autocast's input rounding with
// an fp32 result (the reference's arithmetic exactly). Which refusal sends a shape to the
// fp32 path, for this call or for good, and which one is an error, is refusal.h's decision.
static mgt_status conv2d_lp(mgt_cuda_stream *s, const mgt_op *op)
{
    mgt_status st = mgt_cuda_enter(s);
    if (st != MGT_OK)
        return st;
    mgt_cuda_dev *d = s->dev;
    mgt_lp_refusal why = MGT_LP_REFUSAL_NONE;
    try {
        algo_cache *cache = cache_for(d, d->set->opt.deterministic);
        std::vector<int> key = no16_key(d, op);
        if (!no16_known(cache, key)) {
            st = conv2d_tensor_cores(s, op, &why);
            if (st == MGT_OK || why == MGT_LP_REFUSAL_NONE)
                return st; // ran, or failed outside cuDNN's convolution (a cast, memory)
            if ((st = no16_refused(cache, key, st, why, op, "16-bit")) != MGT_OK)
                return st;
        }
    } catch (...) {
        return mgt_error_set(MGT_ERR_OOM, "cuda device %d: out of host memory in %s", d->index,
                             mgt_op_name(op->kind));
    }
    mgt_op f;
    st = mgt_cuda_lowp_inputs(s, op, false, &f);
    return st != MGT_OK ? st : conv2d_f32(s, &f);
}

// ---- activations stored in 16 bits (store_in, store_out): the channels-last path ----

// Whether an activation operand is what cuDNN's tensor cores read and write as it lies:
// NHWC 16-bit.
static bool nhwc16(mgt_layout l, mgt_precision st)
{
    return l == MGT_LAYOUT_NHWC && st != MGT_PREC_F32;
}

// The KRSC 16-bit copy of the fp32 KCRS filter w in the replica's cache: made anew where
// `fresh` (the forward pass: once per step), else reused while no write has touched w since
// (mgt_cuda_note_write).
static mgt_status filter16(mgt_cuda_stream *s, const float *w, const mgt_conv2d_shape *sh,
                           mgt_precision prec, bool fresh, const void **out)
{
    mgt_cuda_dev *d = s->dev;
    const int cg = sh->c / sh->groups, rs = sh->r * sh->s;
    const size_t nw = (size_t)sh->k * cg * rs;
    std::lock_guard<std::mutex> g(d->wcache_lock);
    auto it = d->wcache.find((uintptr_t)w);
    if (it != d->wcache.end() && !fresh && it->second.valid && it->second.prec == (int)prec &&
        it->second.cg == cg && it->second.rs == rs && it->second.bytes == nw * sizeof(float)) {
        *out = it->second.w16;
        return MGT_OK;
    }
    if (it == d->wcache.end())
        it = d->wcache.emplace((uintptr_t)w, mgt_cuda_dev::wcopy{0, NULL, 0, 0, 0, 0, false}).first;
    mgt_cuda_dev::wcopy &e = it->second;
    e.valid = false;
    if (e.cap < nw * sizeof(uint16_t)) {
        mgt_status st = mgt_cuda_replace_block(
            s, &e.w16, &e.cap, mgt_cuda_align256(nw * sizeof(uint16_t)), "16-bit filter copies");
        if (st != MGT_OK)
            return st;
    }
    mgt_status st = mgt_cuda_relayout(s, e.w16, true, mgt_sto_of(prec), w, false,
                                      mgt_sto_of(MGT_PREC_F32), sh->k, cg, rs, 0.0f);
    if (st != MGT_OK)
        return st;
    e.bytes = nw * sizeof(float);
    e.prec = (int)prec;
    e.cg = cg;
    e.rs = rs;
    e.valid = true;
    *out = e.w16;
    return MGT_OK;
}

// Every copy of a 16-bit filter that [ptr, ptr + bytes) overlaps is stale from now on.
void mgt_cuda_note_write(mgt_cuda_dev *d, const void *ptr, size_t bytes)
{
    if (bytes == 0)
        return;
    const uintptr_t lo = (uintptr_t)ptr, hi = lo + bytes;
    std::lock_guard<std::mutex> g(d->wcache_lock);
    // filters do not overlap: walk down from the last one starting below hi
    for (auto it = d->wcache.lower_bound(hi); it != d->wcache.begin();) {
        --it;
        if (it->first + it->second.bytes <= lo)
            break;
        it->second.valid = false;
    }
}

void mgt_cuda_note_op(mgt_cuda_dev *d, const mgt_op *op)
{
    {
        std::lock_guard<std::mutex> g(d->wcache_lock);
        if (d->wcache.empty())
            return;
    }
    mgt_op copy = *op;
    mgt_operand ops[MGT_OP_MAX_OPERANDS];
    int n = mgt_op_operands(&copy, ops);
    for (int i = 0; i < n; i++)
        if (ops[i].role != MGT_OPERAND_IN)
            mgt_cuda_note_write(d, *ops[i].ptr, ops[i].count * mgt_dtype_size(ops[i].dtype));
}

// The widened form, for what the channels-last path does not run (an fp32 arithmetic over
// 16-bit storage, a precision other than the storage's, a shape cuDNN refuses in 16 bits):
// the activations as NCHW fp32 copies in s->scratch (exact), the NCHW op on them, its
// activation output rounded once into the op's. The reference's arithmetic, not the speed.
static mgt_status conv16_widened(mgt_cuda_stream *s, const mgt_op *op)
{
    const auto &c = op->u.conv;
    const mgt_conv2d_shape *sh = &c.sh;
    const int p = mgt_conv2d_out_h(sh), q = mgt_conv2d_out_w(sh);
    const size_t nx = (size_t)sh->n * sh->c * sh->h * sh->w, ny = (size_t)sh->n * sh->k * p * q;
    const size_t bx = mgt_cuda_align256(nx * 4), by = mgt_cuda_align256(ny * 4);
    mgt_status st = mgt_cuda_scratch(s, bx + by);
    if (st != MGT_OK)
        return st;
    float *x32 = (float *)s->scratch, *y32 = (float *)((char *)s->scratch + bx);
    const mgt_sto f32 = mgt_sto_of(MGT_PREC_F32), si = mgt_sto_of(op->store_in),
                  so = mgt_sto_of(op->store_out);
    const bool xn = sh->x_layout == MGT_LAYOUT_NHWC, yn = sh->y_layout == MGT_LAYOUT_NHWC;
    mgt_op f = *op;
    f.store_in = f.store_out = MGT_PREC_F32;
    f.u.conv.sh.x_layout = f.u.conv.sh.y_layout = MGT_LAYOUT_NCHW;
    switch (op->kind) {
    case MGT_OP_CONV2D_FWD: // y = conv(x, w) + beta y
        st = mgt_cuda_relayout(s, x32, false, f32, c.in1, xn, si, sh->n, sh->c, sh->h * sh->w, 0);
        if (st == MGT_OK && c.beta != 0.0f)
            st = mgt_cuda_relayout(s, y32, false, f32, c.out, yn, so, sh->n, sh->k, p * q, 0);
        f.u.conv.in1 = x32, f.u.conv.out = y32;
        break;
    case MGT_OP_CONV2D_BWD_DATA: // dx = conv_transpose(dy, w) + beta dx
        st = mgt_cuda_relayout(s, y32, false, f32, c.in1, yn, so, sh->n, sh->k, p * q, 0);
        if (st == MGT_OK && c.beta != 0.0f)
            st = mgt_cuda_relayout(s, x32, false, f32, c.out, xn, si, sh->n, sh->c, sh->h * sh->w,
                                   0);
        f.u.conv.in1 = y32, f.u.conv.out = x32;
        break;
    default: // dw = correlate(x, dy) + beta dw: dw is fp32 KCRS already
        st = mgt_cuda_relayout(s, y32, false, f32, c.in1, yn, so, sh->n, sh->k, p * q, 0);
        if (st == MGT_OK)
            st = mgt_cuda_relayout(s, x32, false, f32, c.in2, xn, si, sh->n, sh->c, sh->h * sh->w,
                                   0);
        f.u.conv.in1 = y32, f.u.conv.in2 = x32;
        break;
    }
    if (st == MGT_OK)
        st = f.prec == MGT_PREC_F32 ? conv2d_f32(s, &f) : conv2d_lp(s, &f);
    if (st != MGT_OK)
        return st;
    switch (op->kind) {
    case MGT_OP_CONV2D_FWD:
        return mgt_cuda_relayout(s, c.out, yn, so, y32, false, f32, sh->n, sh->k, p * q, 0);
    case MGT_OP_CONV2D_BWD_DATA:
        return mgt_cuda_relayout(s, c.out, xn, si, x32, false, f32, sh->n, sh->c, sh->h * sh->w, 0);
    default: return MGT_OK;
    }
}

// The channels-last tensor-core path: x, y, dx, dy read and written where they lie when they
// are NHWC 16-bit (a model's body under --amp on CUDA), else through coalesced relayouts into
// s->lowp (the model's fp32 NCHW input); the filter's cached KRSC 16-bit copy; cuDNN's 16-bit
// algorithms with fp32 accumulation, beta blended in fp32 before the one rounding; the filter
// gradient comes out of cuDNN in 16 bits (its legacy API has no 16-bit-in, fp32-out
// configuration) and is added into the fp32 KCRS gradient with beta, as the NCHW path does.
static mgt_status conv16_channels_last(mgt_cuda_stream *s, const mgt_op *op, mgt_lp_refusal *why)
{
    const auto &c = op->u.conv;
    const mgt_conv2d_shape *sh = &c.sh;
    const mgt_op_kind dir = op->kind;
    const mgt_precision prec = op->prec;
    const int p = mgt_conv2d_out_h(sh), q = mgt_conv2d_out_w(sh), cg = sh->c / sh->groups;
    const size_t nx = (size_t)sh->n * sh->c * sh->h * sh->w, ny = (size_t)sh->n * sh->k * p * q,
                 nw = (size_t)sh->k * cg * sh->r * sh->s;
    const bool xd = nhwc16(sh->x_layout, op->store_in), yd = nhwc16(sh->y_layout, op->store_out);
    const bool xn = sh->x_layout == MGT_LAYOUT_NHWC, yn = sh->y_layout == MGT_LAYOUT_NHWC;
    const mgt_sto s16 = mgt_sto_of(prec), si = mgt_sto_of(op->store_in),
                  so = mgt_sto_of(op->store_out);
    const size_t bx = xd ? 0 : mgt_cuda_align256(nx * 2), by = yd ? 0 : mgt_cuda_align256(ny * 2),
                 bw = dir == MGT_OP_CONV2D_BWD_FILTER ? mgt_cuda_align256(nw * 2) : 0;
    mgt_status st = mgt_cuda_lowp_buffer(s, bx + by + bw);
    if (st != MGT_OK)
        return st;
    char *tmp = (char *)s->lowp;
    void *x16 = xd ? NULL : tmp, *y16 = yd ? NULL : tmp + bx, *dw16 = tmp + bx + by;
    const void *w16 = NULL;
    conv_io io = {
        NULL, NULL, NULL, 0.0f, prec == MGT_PREC_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF,
        true};
    switch (dir) {
    case MGT_OP_CONV2D_FWD: // y = conv(x, w) + beta y
        if (!xd)
            st =
                mgt_cuda_relayout(s, x16, true, s16, c.in1, xn, si, sh->n, sh->c, sh->h * sh->w, 0);
        if (st == MGT_OK && !yd && c.beta != 0.0f)
            st = mgt_cuda_relayout(s, y16, true, s16, c.out, yn, so, sh->n, sh->k, p * q, 0);
        if (st == MGT_OK)
            st = filter16(s, (const float *)c.in2, sh, prec, true, &w16);
        io.out = yd ? c.out : y16, io.in1 = xd ? c.in1 : x16, io.in2 = w16, io.beta = c.beta;
        break;
    case MGT_OP_CONV2D_BWD_DATA: // dx = conv_transpose(dy, w) + beta dx
        if (!yd)
            st = mgt_cuda_relayout(s, y16, true, s16, c.in1, yn, so, sh->n, sh->k, p * q, 0);
        if (st == MGT_OK && !xd && c.beta != 0.0f)
            st =
                mgt_cuda_relayout(s, x16, true, s16, c.out, xn, si, sh->n, sh->c, sh->h * sh->w, 0);
        if (st == MGT_OK)
            st = filter16(s, (const float *)c.in2, sh, prec, false, &w16);
        io.out = xd ? c.out : x16, io.in1 = yd ? c.in1 : y16, io.in2 = w16, io.beta = c.beta;
        break;
    default: // dw = correlate(x, dy) + beta dw
        if (!yd)
            st = mgt_cuda_relayout(s, y16, true, s16, c.in1, yn, so, sh->n, sh->k, p * q, 0);
        if (st == MGT_OK && !xd)
            st =
                mgt_cuda_relayout(s, x16, true, s16, c.in2, xn, si, sh->n, sh->c, sh->h * sh->w, 0);
        io.out = dw16, io.in1 = yd ? c.in1 : y16, io.in2 = xd ? c.in2 : x16, io.beta = 0.0f;
        break;
    }
    if (st == MGT_OK)
        st = conv2d(s, dir, io, sh, why);
    if (st != MGT_OK)
        return st;
    switch (dir) {
    case MGT_OP_CONV2D_FWD:
        return yd ? MGT_OK
                  : mgt_cuda_relayout(s, c.out, yn, so, y16, true, s16, sh->n, sh->k, p * q, 0);
    case MGT_OP_CONV2D_BWD_DATA:
        return xd ? MGT_OK
                  : mgt_cuda_relayout(s, c.out, xn, si, x16, true, s16, sh->n, sh->c, sh->h * sh->w,
                                      0);
    default:
        return mgt_cuda_relayout(s, c.out, false, mgt_sto_of(MGT_PREC_F32), dw16, true, s16, sh->k,
                                 cg, sh->r * sh->s, c.beta);
    }
}

// A convolution whose activations are stored in 16 bits: the channels-last tensor-core path
// where the arithmetic is the storage's format, the widened form elsewhere and for shapes
// cuDNN runs no 16-bit algorithm for (remembered as conv2d_lp remembers them; refusal.h
// decides which refusal is an error).
mgt_status mgt_cuda_conv16(mgt_cuda_stream *s, const mgt_op *op)
{
    mgt_cuda_dev *d = s->dev;
    if (op->prec != mgt_op_store16(op))
        return conv16_widened(s, op);
    mgt_lp_refusal why = MGT_LP_REFUSAL_NONE;
    mgt_status st;
    try {
        algo_cache *cache = cache_for(d, d->set->opt.deterministic);
        std::vector<int> key = no16_key(d, op);
        if (no16_known(cache, key))
            return conv16_widened(s, op);
        st = conv16_channels_last(s, op, &why);
        if (st == MGT_OK || why == MGT_LP_REFUSAL_NONE)
            return st;
        if ((st = no16_refused(cache, key, st, why, op, "16-bit channels-last")) != MGT_OK)
            return st;
    } catch (...) {
        return mgt_error_set(MGT_ERR_OOM, "cuda device %d: out of host memory in %s", d->index,
                             mgt_op_name(op->kind));
    }
    return conv16_widened(s, op);
}

// The pass the kind says, in the op's precision.
mgt_status cuda_conv2d(mgt_cuda_stream *s, const mgt_op *op)
{
    return op->prec == MGT_PREC_F32 ? conv2d_f32(s, op) : conv2d_lp(s, op);
}

// ---- batch norm: x, y, dx, dy [n, c, hw] as NCHW [n, c, hw, 1]; per-channel [1, c, 1, 1] ----
//
// cuDNN's SPATIAL mode matches ours: statistics per channel over n*hw values, the biased
// variance for normalising, the unbiased one for the running estimate, which moves as
// running = (1 - factor)*running + factor*batch with factor = momentum; the saved "inverse
// variance" is 1/sqrt(var + eps), our invstd.

// A folded ReLU (sh.relu): forward, relu_forward in place over cuDNN's output; backward,
// relu_backward's masked dy in s->scratch, which cuDNN's backward then reads. The same values
// as the unfolded pair, one launch more each way (cuDNN's own fused BN-activation modes want
// NHWC half tensors).
static size_t bn_count(const mgt_bn_shape *sh) { return (size_t)sh->n * sh->c * sh->hw; }

static mgt_status bn_relu_after(mgt_cuda_stream *s, float *y, const mgt_bn_shape *sh)
{
    if (!sh->relu)
        return MGT_OK;
    mgt_op r{};
    r.kind = MGT_OP_RELU_FWD;
    r.u.relu_fwd = {y, y, bn_count(sh)};
    return cuda_relu_fwd(s, &r);
}

static mgt_status bn_descs(mgt_cuda_stream *s, const mgt_bn_shape *sh)
{
    mgt_cuda_dev *d = s->dev;
    MGT_CUDNN_TRY(d, cudnnSetTensor4dDescriptor(s->xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, sh->n,
                                                sh->c, sh->hw, 1));
    MGT_CUDNN_TRY(
        d, cudnnSetTensor4dDescriptor(s->bnd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, sh->c, 1, 1));
    return MGT_OK;
}

mgt_status cuda_bn_train(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &b = op->u.bn_train;
    mgt_status st = ensure_dnn(s);
    if (st == MGT_OK)
        st = bn_descs(s, &b.sh);
    if (st != MGT_OK)
        return st;
    const float one = 1.0f, zero = 0.0f;
    MGT_CUDNN_TRY(s->dev, cudnnBatchNormalizationForwardTraining(
                              s->dnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, s->xd, b.x, s->xd, b.y,
                              s->bnd, b.gamma, b.beta, (double)b.sh.momentum, b.running_mean,
                              b.running_var, (double)b.sh.eps, b.save_mean, b.save_invstd));
    st = MGT_CUDA_AFTER(s, "batchnorm_forward_train");
    return st == MGT_OK ? bn_relu_after(s, b.y, &b.sh) : st;
}

mgt_status cuda_bn_eval(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &b = op->u.bn_eval;
    mgt_status st = ensure_dnn(s);
    if (st == MGT_OK)
        st = bn_descs(s, &b.sh);
    if (st != MGT_OK)
        return st;
    const float one = 1.0f, zero = 0.0f;
    MGT_CUDNN_TRY(s->dev,
                  cudnnBatchNormalizationForwardInference(
                      s->dnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, s->xd, b.x, s->xd, b.y, s->bnd,
                      b.gamma, b.beta, b.running_mean, b.running_var, (double)b.sh.eps));
    st = MGT_CUDA_AFTER(s, "batchnorm_forward_eval");
    return st == MGT_OK ? bn_relu_after(s, b.y, &b.sh) : st;
}

mgt_status cuda_bn_bwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &b = op->u.bn_bwd;
    mgt_status st = ensure_dnn(s);
    if (st == MGT_OK)
        st = bn_descs(s, &b.sh);
    const float *dy = b.dy;
    if (st == MGT_OK && b.sh.relu) {
        st = mgt_cuda_scratch(s, bn_count(&b.sh) * sizeof(float));
        mgt_op r{};
        r.kind = MGT_OP_RELU_BWD;
        r.u.relu_bwd = {(float *)s->scratch, b.dy, b.y, bn_count(&b.sh)};
        if (st == MGT_OK)
            st = cuda_relu_bwd(s, &r);
        dy = (const float *)s->scratch;
    }
    if (st != MGT_OK)
        return st;
    // dx is overwritten (data beta 0); dgamma and dbeta accumulate (parameter beta 1), as
    // parameter gradients do everywhere in mgtrain.
    const float one = 1.0f, zero = 0.0f;
    MGT_CUDNN_TRY(s->dev, cudnnBatchNormalizationBackward(
                              s->dnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &one, s->xd, b.x,
                              s->xd, dy, s->xd, b.dx, s->bnd, b.gamma, b.dgamma, b.dbeta,
                              (double)b.sh.eps, b.save_mean, b.save_invstd));
    return MGT_CUDA_AFTER(s, "batchnorm_backward");
}
