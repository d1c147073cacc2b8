// Mixed precision on the CUDA backend: the casts, the nonfinite count, and the low-precision
// gemm (cuBLAS on bf16/fp16 inputs with fp32 accumulation and an fp32 C, tensor cores where
// the GPU has them), and the NCHW <-> NHWC 16-bit conversions of the convolutions' tensor-core
// path (dnn.cu).
//
// The rounding is src/device/lowp.h's (round to nearest even, fp16 overflow to inf, NaN kept
// quiet with its sign), compiled for the device, rather than cuda_bf16.h's intrinsics, whose
// NaN encodings differ from the CPU's; the conformance suite holds the two to the same bits.
#include <cstdint>
#include <cstring>

#include "device/cuda/common.cuh"

namespace {

// The rounding and encodings of src/device/lowp.h, the ones the reference and the CPU
// kernels use, compiled here for the device.
__device__ inline float round_to(bool bf16, float x)
{
    return bf16 ? mgt_lowp_round_bf16(x) : mgt_lowp_round_fp16(x);
}

__device__ inline uint16_t encode(bool bf16, float x)
{
    return mgt_lowp_encode(bf16 ? MGT_PREC_BF16 : MGT_PREC_FP16, x);
}

__device__ inline float decode(bool bf16, uint16_t h)
{
    return mgt_lowp_decode(bf16 ? MGT_PREC_BF16 : MGT_PREC_FP16, h);
}

__global__ void k_round(float *dst, const float *src, size_t n, bool bf16)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = round_to(bf16, src[i]);
}

__global__ void k_to16(uint16_t *dst, const float *src, size_t n, bool bf16)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = encode(bf16, src[i]);
}

__global__ void k_from16(float *dst, const uint16_t *src, size_t n, bool bf16)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = decode(bf16, src[i]);
}

// One thread per element, indexed by the NHWC side: the 16-bit writes (or reads) are the
// coalesced ones, the fp32 side strides by hw.
__global__ void k_to_nhwc16(uint16_t *dst, const float *src, int n, int c, int hw, bool bf16)
{
    size_t total = (size_t)n * c * hw;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t ch = i % (size_t)c, rest = i / (size_t)c, p = rest % (size_t)hw, img = rest / hw;
        dst[i] = encode(bf16, src[(img * c + ch) * hw + p]);
    }
}

__global__ void k_from_nhwc16(float *dst, const uint16_t *src, int n, int c, int hw, float beta,
                              bool bf16)
{
    size_t total = (size_t)n * c * hw;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t ch = i % (size_t)c, rest = i / (size_t)c, p = rest % (size_t)hw, img = rest / hw;
        size_t at = (img * c + ch) * hw + p;
        float v = decode(bf16, src[i]);
        dst[at] = beta == 0.0f ? v : __fadd_rn(v, __fmul_rn(beta, dst[at]));
    }
}

// Integer atomics only: the count is the same whatever the order.
__global__ void k_nonfinite(int32_t *count, const float *x, size_t n)
{
    int bad = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        bad += (~__float_as_uint(x[i]) & 0x7f800000u) == 0;
    if (bad)
        atomicAdd(count, bad);
}

} // namespace

mgt_status cuda_cast(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.cast;
    bool bf16 = op->prec == MGT_PREC_BF16;
    if (op->kind == MGT_OP_CAST_TO_16)
        k_to16<<<blocks_for(a.n), kThreads, 0, s->stream>>>((uint16_t *)a.dst, (const float *)a.src,
                                                            a.n, bf16);
    else
        k_from16<<<blocks_for(a.n), kThreads, 0, s->stream>>>((float *)a.dst,
                                                              (const uint16_t *)a.src, a.n, bf16);
    return MGT_CUDA_AFTER(s, mgt_op_name(op->kind));
}

mgt_status mgt_cuda_to_nhwc16(mgt_cuda_stream *s, uint16_t *dst, const float *src, int n, int c,
                              int hw, bool bf16)
{
    size_t total = (size_t)n * c * hw;
    k_to_nhwc16<<<blocks_for(total), kThreads, 0, s->stream>>>(dst, src, n, c, hw, bf16);
    return MGT_CUDA_AFTER(s, "to_nhwc16");
}

mgt_status mgt_cuda_from_nhwc16(mgt_cuda_stream *s, float *dst, const uint16_t *src, int n, int c,
                                int hw, float beta, bool bf16)
{
    size_t total = (size_t)n * c * hw;
    k_from_nhwc16<<<blocks_for(total), kThreads, 0, s->stream>>>(dst, src, n, c, hw, beta, bf16);
    return MGT_CUDA_AFTER(s, "from_nhwc16");
}

mgt_status cuda_nonfinite(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.nonfinite;
    MGT_CUDA_TRY(s->dev, cudaMemsetAsync(a.count, 0, sizeof(int32_t), s->stream));
    unsigned blocks = blocks_for(a.n);
    if (blocks > 1024)
        blocks = 1024;
    k_nonfinite<<<blocks, kThreads, 0, s->stream>>>(a.count, a.x, a.n);
    return MGT_CUDA_AFTER(s, "nonfinite_count");
}

// The rounded (conv: fp32) or encoded (gemm: 16-bit) copies of a low-precision op's inputs in
// s->lowp, and the op pointing at them.
mgt_status mgt_cuda_lowp_inputs(mgt_cuda_stream *s, const mgt_op *op, bool encode16, mgt_op *f)
{
    *f = *op;
    f->prec = MGT_PREC_F32;
    mgt_operand ops[MGT_OP_MAX_OPERANDS];
    int n = mgt_op_operands(f, ops);
    size_t esize = encode16 ? sizeof(uint16_t) : sizeof(float), total = 0;
    for (int i = 0; i < n; i++)
        if (ops[i].role == MGT_OPERAND_IN)
            total += mgt_cuda_align256(ops[i].count * esize);
    mgt_status st = mgt_cuda_lowp_buffer(s, total);
    if (st != MGT_OK)
        return st;
    bool bf16 = op->prec == MGT_PREC_BF16;
    char *at = (char *)s->lowp;
    for (int i = 0; i < n; i++) {
        if (ops[i].role != MGT_OPERAND_IN)
            continue;
        const float *src = (const float *)*ops[i].ptr;
        size_t cnt = ops[i].count;
        if (encode16)
            k_to16<<<blocks_for(cnt), kThreads, 0, s->stream>>>((uint16_t *)at, src, cnt, bf16);
        else
            k_round<<<blocks_for(cnt), kThreads, 0, s->stream>>>((float *)at, src, cnt, bf16);
        *ops[i].ptr = at;
        at += mgt_cuda_align256(cnt * esize);
    }
    return MGT_CUDA_AFTER(s, mgt_op_name(op->kind));
}
