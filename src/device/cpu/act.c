/* The CPU kernels of the pointwise activations of MGT_ACT_LIST. */

/* The activation loops are compute-bound (exp and a division per element), unlike the
   streaming loops of the other kernels, so they run on vectors in functions built three times
   from act_lanes.h: here for AVX-512F, 16 lanes (one zmm register); in act_avx2.c for AVX2, 8
   lanes (one ymm); in act_base.c for the x86-64 baseline, 4 lanes (one xmm). All give the same
   bits; ctx->vec_baseline runs the baseline on a CPU with AVX2 or AVX-512F, so the tests can
   compare them. */
#define AW 16
#include "device/cpu/act_lanes.h"

__attribute__((target("avx512f"))) static void act_fwd_avx512(mgt_act act, float *y, const float *x,
                                                              size_t n)
{
    act_fwd_span(act, y, x, n);
}

__attribute__((target("avx512f"))) static void act_bwd_avx512(mgt_act act, float *dx,
                                                              const float *dy, const float *x,
                                                              size_t n)
{
    act_bwd_span(act, dx, dy, x, n);
}

__attribute__((target("avx512f"))) static float exp_shift_avx512(float *y, const float *x,
                                                                 float shift, size_t n)
{
    return exp_shift_span(y, x, shift, n);
}

float cpu_exp_shift(float *y, const float *x, float shift, size_t n)
{
    if (__builtin_cpu_supports("avx512f"))
        return exp_shift_avx512(y, x, shift, n);
    if (__builtin_cpu_supports("avx2"))
        return cpu_exp_shift_avx2(y, x, shift, n);
    return cpu_exp_shift_base(y, x, shift, n);
}

__attribute__((target("avx512f"))) static float max_above_avx512(const float *x, size_t n, float m)
{
    return max_above_span(x, n, m);
}

float cpu_max_above(const float *x, size_t n, float m)
{
    if (__builtin_cpu_supports("avx512f"))
        return max_above_avx512(x, n, m);
    if (__builtin_cpu_supports("avx2"))
        return cpu_max_above_avx2(x, n, m);
    return cpu_max_above_base(x, n, m);
}

/* An activation op and which build of the loops its items take. */
typedef struct act_job {
    const mgt_op *op;
    void (*fwd)(mgt_act, float *, const float *, size_t);
    void (*bwd)(mgt_act, float *, const float *, const float *, size_t);
} act_job;

static act_job act_job_of(const cpu_ctx *ctx, const mgt_op *op)
{
    if (vec_avx512(ctx))
        return (act_job){op, act_fwd_avx512, act_bwd_avx512};
    if (vec_avx2(ctx))
        return (act_job){op, cpu_act_fwd_avx2, cpu_act_bwd_avx2};
    return (act_job){op, cpu_act_fwd_base, cpu_act_bwd_base};
}

/* 16-bit storage (mgt_op_store16): an item widens ACT_TILE16 values of each input into tiles on
   its stack, runs the fp32 loop on them and rounds the output tile once (one pass over memory;
   the same bits as the widened route, each element's arithmetic being its own). */
#define ACT_TILE16 1024

static void act_fwd_item(void *c, int i, int t)
{
    (void)t;
    const act_job *jb = c;
    const mgt_act_fwd_args *a = &jb->op->u.act_fwd;
    void (*fn)(mgt_act, float *, const float *, size_t) = jb->fwd;
    size_t lo, hi;
    item_range(a->n, CHUNK, i, &lo, &hi);
    mgt_precision p = mgt_op_store16(jb->op);
    if (p == MGT_PREC_F32) {
        fn(a->act, a->y + lo, a->x + lo, hi - lo);
        return;
    }
    float tx[ACT_TILE16];
    for (size_t s = lo; s < hi; s += ACT_TILE16) {
        size_t n = min_z(ACT_TILE16, hi - s);
        cpu16_widen(p, (const uint16_t *)(const void *)a->x + s, tx, n);
        fn(a->act, tx, tx, n);
        cpu16_round(p, tx, (uint16_t *)(void *)a->y + s, n);
    }
}

static void act_bwd_item(void *c, int i, int t)
{
    (void)t;
    const act_job *jb = c;
    const mgt_act_bwd_args *a = &jb->op->u.act_bwd;
    void (*fn)(mgt_act, float *, const float *, const float *, size_t) = jb->bwd;
    size_t lo, hi;
    item_range(a->n, CHUNK, i, &lo, &hi);
    mgt_precision p = mgt_op_store16(jb->op);
    if (p == MGT_PREC_F32) {
        fn(a->act, a->dx + lo, a->dy + lo, a->x + lo, hi - lo);
        return;
    }
    float tdy[ACT_TILE16], tx[ACT_TILE16];
    for (size_t s = lo; s < hi; s += ACT_TILE16) {
        size_t n = min_z(ACT_TILE16, hi - s);
        cpu16_widen(p, (const uint16_t *)(const void *)a->dy + s, tdy, n);
        cpu16_widen(p, (const uint16_t *)(const void *)a->x + s, tx, n);
        fn(a->act, tdy, tdy, tx, n);
        cpu16_round(p, tdy, (uint16_t *)(void *)a->dx + s, n);
    }
}

mgt_status cpu_act_fwd(cpu_ctx *ctx, const mgt_op *op)
{
    act_job jb = act_job_of(ctx, op);
    POOL_FOR(ctx, items_of(op->u.act_fwd.n, CHUNK), act_fwd_item, &jb);
    return MGT_OK;
}

mgt_status cpu_act_bwd(cpu_ctx *ctx, const mgt_op *op)
{
    act_job jb = act_job_of(ctx, op);
    POOL_FOR(ctx, items_of(op->u.act_bwd.n, CHUNK), act_bwd_item, &jb);
    return MGT_OK;
}
