/* The pointwise activations' loops built for the x86-64 baseline (4 lanes, one SSE register); act.c dispatches. */
#define AW 4
#include "device/cpu/act_lanes.h"

void cpu_act_fwd_base(mgt_act act, float *y, const float *x, size_t n)
{
    act_fwd_span(act, y, x, n);
}

void cpu_act_bwd_base(mgt_act act, float *dx, const float *dy, const float *x, size_t n)
{
    act_bwd_span(act, dx, dy, x, n);
}

float cpu_exp_shift_base(float *y, const float *x, float shift, size_t n)
{
    return exp_shift_span(y, x, shift, n);
}

float cpu_max_above_base(const float *x, size_t n, float m) { return max_above_span(x, n, m); }
