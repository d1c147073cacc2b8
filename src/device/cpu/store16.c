/* The 16-bit activation codes on the CPU: widening bf16/fp16 codes to fp32 and rounding fp32 to
   them, bit-exact with device/lowp.h (torch's casts), with AVX-512 forms picked at run time. */
#include "device/lowp.h"
#include "device/cpu/lane16.h"

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

LANE16 static void widen_avx512(mgt_precision p, const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, lane16_widen(p, _mm256_loadu_si256((const __m256i *)(src + i))));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(dst + i, m, lane16_widen(p, _mm256_maskz_loadu_epi16(m, src + i)));
    }
}

LANE16 static void round_avx512(mgt_precision p, const float *src, float beta, uint16_t *dst,
                                size_t n)
{
    __m512 b = _mm512_set1_ps(beta);
    size_t i = 0;
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(m, src + i);
        if (beta != 0.0f) /* src + beta * old, as round_scalar: no contraction */
            v = _mm512_add_ps(
                v, _mm512_mul_ps(b, lane16_widen(p, _mm256_maskz_loadu_epi16(m, dst + i))));
        _mm256_mask_storeu_epi16(dst + i, m, lane16_round(p, v));
    }
}

void cpu16_widen(mgt_precision p, const uint16_t *src, float *dst, size_t n)
{
    (lane16_cpu() ? widen_avx512 : widen_scalar)(p, src, dst, n);
}

void cpu16_round(mgt_precision p, const float *src, uint16_t *dst, size_t n)
{
    (lane16_cpu() ? round_avx512 : round_scalar)(p, src, 0.0f, dst, n);
}

void cpu16_round_acc(mgt_precision p, const float *src, float beta, uint16_t *dst, size_t n)
{
    (lane16_cpu() ? round_avx512 : round_scalar)(p, src, beta, dst, n);
}
