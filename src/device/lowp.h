/* Rounding of fp32 values to bf16 and fp16 and the 16-bit encodings, bit-exact with PyTorch's
   casts (round to nearest even, fp16 overflow to inf, NaN kept quiet); shared by the reference,
   the CPU kernels and the CUDA kernels. Plain C that nvcc compiles as well, with no FP
   environment dependence beyond rintf's default rounding mode. */
#ifndef MGT_DEVICE_LOWP_H
#define MGT_DEVICE_LOWP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "mgt/device.h"

/* How the functions are declared: static inline for C; src/device/cuda/lowp.cu defines it as
   __host__ __device__ static inline before including this, so its kernels call them. */
#ifndef MGT_LOWP_FN
#define MGT_LOWP_FN static inline
#endif

MGT_LOWP_FN uint32_t mgt_lowp_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

MGT_LOWP_FN float mgt_lowp_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* bf16 keeps fp32's exponent: dropping the low 16 bits with round-to-nearest-even is the whole
   cast (values near FLT_MAX round up to inf, as in PyTorch). */
MGT_LOWP_FN float mgt_lowp_round_bf16(float x)
{
    uint32_t u = mgt_lowp_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return mgt_lowp_float((u | 0x00400000u) & 0xffff0000u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return mgt_lowp_float(u & 0xffff0000u);
}

/* fp16: 10 stored fraction bits above 2^-14, multiples of 2^-24 below (subnormals); from
   65520 up the value rounds to inf. */
MGT_LOWP_FN float mgt_lowp_round_fp16(float x)
{
    float a = fabsf(x);
    if (isnan(x))
        return x;
    if (a < 0x1p-14f)
        return copysignf(rintf(a * 0x1p24f) * 0x1p-24f, x);
    uint32_t u = mgt_lowp_bits(a);
    u += 0xfffu + ((u >> 13) & 1u);
    float r = mgt_lowp_float(u & ~0x1fffu);
    return copysignf(r >= 65536.0f ? mgt_lowp_float(0x7f800000u) : r, x);
}

MGT_LOWP_FN float mgt_lowp_round(mgt_precision p, float x)
{
    return p == MGT_PREC_BF16   ? mgt_lowp_round_bf16(x)
           : p == MGT_PREC_FP16 ? mgt_lowp_round_fp16(x)
                                : x;
}

/* The 16-bit encoding of x (rounded first). */
MGT_LOWP_FN uint16_t mgt_lowp_encode(mgt_precision p, float x)
{
    if (p == MGT_PREC_BF16)
        return (uint16_t)(mgt_lowp_bits(mgt_lowp_round_bf16(x)) >> 16);
    float r = mgt_lowp_round_fp16(x);
    uint32_t u = mgt_lowp_bits(r);
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

MGT_LOWP_FN float mgt_lowp_decode(mgt_precision p, uint16_t h)
{
    if (p == MGT_PREC_BF16)
        return mgt_lowp_float((uint32_t)h << 16);
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0)
        return copysignf((float)m * 0x1p-24f, mgt_lowp_float(sign | 0x3f800000u));
    if (e == 31)
        return mgt_lowp_float(sign | 0x7f800000u | (m << 13) | (m ? 0x00400000u : 0u));
    return mgt_lowp_float(sign | ((e - 15u + 127u) << 23) | (m << 13));
}

#endif
