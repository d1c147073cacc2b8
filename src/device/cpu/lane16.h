/* Sixteen lanes of stored activations as fp32 in registers: 16-bit codes widened and rounded
   bit-exact with device/lowp.h (torch's casts), for the AVX-512 builds of the one-pass loops and
   store16.c. Private to src/device/cpu/. */
#ifndef MGT_DEVICE_CPU_LANE16_H
#define MGT_DEVICE_CPU_LANE16_H

#include <immintrin.h>
#include <stdbool.h>

#include "device/cpu/vec.h"

/* What a function using these must be built for, and whether this CPU runs it. */
#define LANE16 __attribute__((target("avx512f,avx512bw,avx512vl,f16c")))

static inline bool lane16_cpu(void)
{
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
}

/* Whether ctx's one-pass 16-bit loops take these lanes (else they widen tiles: the baseline). */
static inline bool lane16_on(const cpu_ctx *ctx) { return !ctx->vec_baseline && lane16_cpu(); }

/* bf16 is rounded with integer operations, not AVX512-BF16's vcvtneps2bf16: that instruction
   takes subnormal inputs as zero and flushes subnormal results, where torch's cast rounds them;
   four integer operations per sixteen values cost nothing beside the memory traffic of a pass.
   fp16 goes through F16C's conversions (round to nearest even, subnormals and overflow as IEEE
   has them), NaN made lowp.h's quiet NaN. */
LANE16 static inline __m512 lane16_widen(mgt_precision p, __m256i h)
{
    if (p == MGT_PREC_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

LANE16 static inline __m256i lane16_round(mgt_precision p, __m512 v)
{
    __m512i u = _mm512_castps_si512(v);
    __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
    if (p == MGT_PREC_BF16) {
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
        __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
        r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x00400000)));
        return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
    }
    __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256i qnan = _mm256_or_si256(_mm256_and_si256(h, _mm256_set1_epi16((short)0x8000)),
                                   _mm256_set1_epi16(0x7e00));
    return _mm256_mask_mov_epi16(h, nan, qnan);
}

/* Element at..at+15 of a stored array (fp32, or 16-bit codes under p) as fp32 lanes; m masks
   the lanes read (the others are 0). */
LANE16 static inline vf16 lane16_ld(mgt_precision p, const void *a, size_t at, __mmask16 m)
{
    if (p == MGT_PREC_F32)
        return (vf16)_mm512_maskz_loadu_ps(m, (const float *)a + at);
    return (vf16)lane16_widen(p, _mm256_maskz_loadu_epi16(m, (const uint16_t *)a + at));
}

/* Stores lanes m of v at element at of a stored array, rounded to p's codes where 16-bit. */
LANE16 static inline void lane16_st(mgt_precision p, void *a, size_t at, vf16 v, __mmask16 m)
{
    if (p == MGT_PREC_F32)
        _mm512_mask_storeu_ps((float *)a + at, m, (__m512)v);
    else
        _mm256_mask_storeu_epi16((uint16_t *)a + at, m, lane16_round(p, (__m512)v));
}

/* The mask of the first min(n - at, 16) lanes. */
static inline __mmask16 lane16_mask(size_t n, size_t at)
{
    return n - at >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - at)) - 1);
}

#endif
