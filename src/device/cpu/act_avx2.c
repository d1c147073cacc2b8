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
