/* The pointwise activations' loops built for AVX2 (8 lanes, one ymm register); act.c dispatches. */
#define AW 8
#include "device/cpu/act_lanes.h"

__attribute__((target("avx2"))) void cpu_act_fwd_avx2(mgt_act act, float *y, const float *x,
                                                      size_t n)
{
    act_fwd_span(act, y, x, n);
}

__attribute__((target("avx2"))) void cpu_act_bwd_avx2(mgt_act act, float *dx, const float *dy,
                                                      const float *x, size_t n)
{
    act_bwd_span(act, dx, dy, x, n);
}

__attribute__((target("avx2"))) float cpu_exp_shift_avx2(float *y, const float *x, float shift,
                                                         size_t n)
{
    return exp_shift_span(y, x, shift, n);
}

__attribute__((target("avx2"))) float cpu_max_above_avx2(const float *x, size_t n, float m)
{
    return max_above_span(x, n, m);
}
