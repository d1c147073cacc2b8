/* The 16-bit activation codes on the CPU: widening bf16/fp16 codes to fp32 and rounding fp32 to
   them, bit-exact with device/lowp.h (torch's casts), with AVX-512 forms picked at run time. */
#include <immintrin.h>

#include "device/lowp.h"
#include "device/cpu/vec.h"

/* bf16 is rounded with integer operations (lowp.h's, sixteen lanes at a time), not with
   AVX512-BF16's vcvtneps2bf16: that instruction takes subnormal inputs as zero and flushes
   subnormal results, where torch's cast rounds them; four integer operations per sixteen
   values cost nothing beside the memory traffic of a pass. fp16 goes through F16C's
   conversions (round to nearest even, subnormals and overflow as IEEE has them), NaN made
   lowp.h's quiet NaN. */

static void widen_scalar(mgt_precision p, const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = mgt_lowp_decode(p, src[i]);
}

static void round_scalar(mgt_precision p, const float *src, float beta, uint16_t *dst, size_t n)
{
    if (beta == 0.0f)
        for (size_t i = 0; i < n; i++)
            dst[i] = mgt_lowp_encode(p, src[i]);
    else
        for (size_t i = 0; i < n; i++)
            dst[i] = mgt_lowp_encode(p, src[i] + beta * mgt_lowp_decode(p, dst[i]));
}

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,f16c")))

AVX512 static inline __m512 widen16(mgt_precision p, __m256i h)
{
    if (p == MGT_PREC_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

AVX512 static inline __m256i round16(mgt_precision p, __m512 v)
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

AVX512 static void widen_avx512(mgt_precision p, const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, widen16(p, _mm256_loadu_si256((const __m256i *)(src + i))));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(dst + i, m, widen16(p, _mm256_maskz_loadu_epi16(m, src + i)));
    }
}

AVX512 static void round_avx512(mgt_precision p, const float *src, float beta, uint16_t *dst,
                                size_t n)
{
    __m512 b = _mm512_set1_ps(beta);
    size_t i = 0;
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(m, src + i);
        if (beta != 0.0f) /* src + beta * old, as round_scalar: no contraction */
            v = _mm512_add_ps(v,
                              _mm512_mul_ps(b, widen16(p, _mm256_maskz_loadu_epi16(m, dst + i))));
        _mm256_mask_storeu_epi16(dst + i, m, round16(p, v));
    }
}

static bool have_avx512(void)
{
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
}

void cpu16_widen(mgt_precision p, const uint16_t *src, float *dst, size_t n)
{
    (have_avx512() ? widen_avx512 : widen_scalar)(p, src, dst, n);
}

void cpu16_round(mgt_precision p, const float *src, uint16_t *dst, size_t n)
{
    (have_avx512() ? round_avx512 : round_scalar)(p, src, 0.0f, dst, n);
}

void cpu16_round_acc(mgt_precision p, const float *src, float beta, uint16_t *dst, size_t n)
{
    (have_avx512() ? round_avx512 : round_scalar)(p, src, beta, dst, n);
}
