// Mixed precision on the CUDA backend: the casts, the nonfinite count, and the low-precision
// gemm (cuBLAS on bf16/fp16 inputs with fp32 accumulation and an fp32 C, tensor cores where
// the GPU has them), and the NCHW <-> NHWC 16-bit conversions of the convolutions' tensor-core
// path (dnn.cu).
//
// The rounding is written out bit for bit as in src/device/lowp.h (round to nearest even,
// fp16 overflow to inf, NaN kept quiet with its sign) rather than through cuda_bf16.h's
// intrinsics, whose NaN encodings differ from the CPU's; the conformance suite holds the two
// to the same bits.
#include <cstdint>
#include <cstring>

#include "device/cuda/common.cuh"

namespace {

__device__ float round_bf16(float x)
{
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return __uint_as_float((u | 0x00400000u) & 0xffff0000u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return __uint_as_float(u & 0xffff0000u);
}

__device__ float round_fp16(float x)
{
    float a = fabsf(x);
    if (isnan(x))
        return x;
    if (a < 0x1p-14f)
        return copysignf(rintf(a * 0x1p24f) * 0x1p-24f, x);
    uint32_t u = __float_as_uint(a);
    u += 0xfffu + ((u >> 13) & 1u);
    float r = __uint_as_float(u & ~0x1fffu);
    return copysignf(r >= 65536.0f ? __int_as_float(0x7f800000) : r, x);
}

__device__ float round_to(bool bf16, float x) { return bf16 ? round_bf16(x) : round_fp16(x); }

__device__ uint16_t encode(bool bf16, float x)
{
    if (bf16)
        return (uint16_t)(__float_as_uint(round_bf16(x)) >> 16);
    float r = round_fp16(x);
    uint32_t u = __float_as_uint(r);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    float a = fabsf(r);
    if (isnan(r))
        return (uint16_t)(sign | 0x7e00u);
    if (isinf(r))
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x1p-14f)
        return (uint16_t)(sign | (uint16_t)(a * 0x1p24f));
    uint32_t e = ((u >> 23) & 0xffu) - 127u + 15u;
    return (uint16_t)(sign | (e << 10) | ((u >> 13) & 0x3ffu));
}

__device__ float decode(bool bf16, uint16_t h)
{
    if (bf16)
        return __uint_as_float((uint32_t)h << 16);
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0)
        return copysignf((float)m * 0x1p-24f, __uint_as_float(sign | 0x3f800000u));
    if (e == 31)
        return __uint_as_float(sign | 0x7f800000u | (m << 13) | (m ? 0x00400000u : 0u));
    return __uint_as_float(sign | ((e - 15u + 127u) << 23) | (m << 13));
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
