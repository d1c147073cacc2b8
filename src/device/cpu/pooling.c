/* The CPU kernels of pooling: max (NCHW and nChw16c), global average (both layouts),
   adaptive average. */
#include "device/cpu/vec.h"

/* The first maximum of window (oy, ox) in raster order, clipped to the plane (mgt_op_check
   keeps every window on real input, so clipping is the -inf padding). Starting from the
   first element rather than -inf makes a NaN there win, as in the reference. */
/* Window (oy, ox) clipped to the plane: rows [y0, y1), columns [x0, x1). */
static void pool_window(const mgt_pool2d_shape *sh, int oy, int ox, int *y0, int *y1, int *x0,
                        int *x1)
{
    *y0 = oy * sh->stride_h - sh->pad_h;
    *y1 = *y0 + sh->kh;
    *x0 = ox * sh->stride_w - sh->pad_w;
    *x1 = *x0 + sh->kw;
    *y0 = *y0 < 0 ? 0 : *y0;
    *y1 = *y1 > sh->h ? sh->h : *y1;
    *x0 = *x0 < 0 ? 0 : *x0;
    *x1 = *x1 > sh->w ? sh->w : *x1;
}

static size_t pool_argmax(const mgt_pool2d_shape *sh, const float *x, int oy, int ox)
{
    int y0, y1, x0, x1;
    pool_window(sh, oy, ox, &y0, &y1, &x0, &x1);
    size_t best = (size_t)y0 * sh->w + x0;
    for (int iy = y0; iy < y1; iy++)
        for (int ix = x0; ix < x1; ix++) {
            size_t e = (size_t)iy * sh->w + ix;
            if (x[e] > x[best])
                best = e;
        }
    return best;
}

static void maxpool_fwd_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *j = c;
    const mgt_pool2d_shape *sh = &j->op->u.maxpool_fwd.sh;
    int p = mgt_pool2d_out_h(sh), q = mgt_pool2d_out_w(sh);
    size_t hw = (size_t)sh->h * sh->w, pq = (size_t)p * q, lo, hi;
    item_range((size_t)sh->n * sh->c, j->units, i, &lo, &hi);
    for (size_t pl = lo; pl < hi; pl++) {
        const float *x = j->op->u.maxpool_fwd.x + pl * hw;
        float *y = j->op->u.maxpool_fwd.y + pl * pq;
        for (int oy = 0; oy < p; oy++)
            for (int ox = 0; ox < q; ox++)
                y[(size_t)oy * q + ox] = x[pool_argmax(sh, x, oy, ox)];
    }
}

/* The winner is found again from x (y is not read), so a y that differs in the last bit
   from x's maximum cannot lose a window's gradient. */
static void maxpool_bwd_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *j = c;
    const mgt_pool2d_shape *sh = &j->op->u.maxpool_bwd.sh;
    int p = mgt_pool2d_out_h(sh), q = mgt_pool2d_out_w(sh);
    size_t hw = (size_t)sh->h * sh->w, pq = (size_t)p * q, lo, hi;
    item_range((size_t)sh->n * sh->c, j->units, i, &lo, &hi);
    for (size_t pl = lo; pl < hi; pl++) {
        const float *x = j->op->u.maxpool_bwd.x + pl * hw;
        const float *dy = j->op->u.maxpool_bwd.dy + pl * pq;
        float *dx = j->op->u.maxpool_bwd.dx + pl * hw;
        memset(dx, 0, hw * sizeof(float));
        for (int oy = 0; oy < p; oy++)
            for (int ox = 0; ox < q; ox++)
                dx[pool_argmax(sh, x, oy, ox)] += dy[(size_t)oy * q + ox];
    }
}

/* Max pooling of nChw16c planes: a block's sixteen channels side by side, each lane's window
   winner found as pool_argmax finds it (the first maximum in raster order; x > best, so a NaN
   first in the window wins and a later one does not). */

typedef struct pool16_job {
    plane_job p;
    bool avx512; /* the AVX-512F build of the loops (vec_avx512) */
} pool16_job;

/* The window's winner per lane; the forward needs only its value (at NULL). */
__attribute__((always_inline)) static inline void pool_argmax16(const mgt_pool2d_shape *sh,
                                                                const float *x, int oy, int ox,
                                                                vf16 *best, vi16 *at)
{
    int y0, y1, x0, x1;
    pool_window(sh, oy, ox, &y0, &y1, &x0, &x1);
    int e0 = y0 * sh->w + x0;
    vf16 b = V16_LD(x + (size_t)e0 * 16);
    vi16 idx = (vi16){0} + e0;
    for (int iy = y0; iy < y1; iy++)
        for (int ix = x0; ix < x1; ix++) {
            int e = iy * sh->w + ix;
            vf16 v = V16_LD(x + (size_t)e * 16);
            vi16 m = (vi16)(v > b);
            b = (vf16)(((vi16)v & m) | ((vi16)b & ~m));
            if (at)
                idx = (((vi16){0} + e) & m) | (idx & ~m);
        }
    *best = b;
    if (at)
        *at = idx;
}

__attribute__((always_inline)) static inline void maxpool_fwd_planes(const plane_job *j, int i)
{
    const mgt_pool2d_shape *sh = &j->op->u.maxpool_fwd.sh;
    int p = mgt_pool2d_out_h(sh), q = mgt_pool2d_out_w(sh);
    size_t hw = (size_t)sh->h * sh->w, pq = (size_t)p * q, lo, hi;
    item_range((size_t)sh->n * (sh->c / 16), j->units, i, &lo, &hi);
    for (size_t pl = lo; pl < hi; pl++) {
        const float *x = j->op->u.maxpool_fwd.x + pl * hw * 16;
        float *y = j->op->u.maxpool_fwd.y + pl * pq * 16;
        for (int oy = 0; oy < p; oy++)
            for (int ox = 0; ox < q; ox++) {
                vf16 b;
                pool_argmax16(sh, x, oy, ox, &b, NULL);
                V16_ST(y + ((size_t)oy * q + ox) * 16, b);
            }
    }
}

/* Each window's gradient to its winner, windows in raster order per lane, as
   maxpool_bwd_item adds them. */
__attribute__((always_inline)) static inline void maxpool_bwd_planes(const plane_job *j, int i)
{
    const mgt_pool2d_shape *sh = &j->op->u.maxpool_bwd.sh;
    int p = mgt_pool2d_out_h(sh), q = mgt_pool2d_out_w(sh);
    size_t hw = (size_t)sh->h * sh->w, pq = (size_t)p * q, lo, hi;
    item_range((size_t)sh->n * (sh->c / 16), j->units, i, &lo, &hi);
    for (size_t pl = lo; pl < hi; pl++) {
        const float *x = j->op->u.maxpool_bwd.x + pl * hw * 16;
        const float *dy = j->op->u.maxpool_bwd.dy + pl * pq * 16;
        float *dx = j->op->u.maxpool_bwd.dx + pl * hw * 16;
        memset(dx, 0, hw * 16 * sizeof(float));
        for (int oy = 0; oy < p; oy++)
            for (int ox = 0; ox < q; ox++) {
                vf16 b;
                vi16 at;
                pool_argmax16(sh, x, oy, ox, &b, &at);
                const float *g = dy + ((size_t)oy * q + ox) * 16;
                for (int l = 0; l < 16; l++)
                    dx[(size_t)at[l] * 16 + (size_t)l] += g[l];
            }
    }
}

/* Both compiled twice, as the batch-norm sums: a compare and two selects per lane are one
   instruction each on AVX-512. */
static void maxpool_fwd_blocked_base(const plane_job *j, int i) { maxpool_fwd_planes(j, i); }

__attribute__((target("avx512f"))) static void maxpool_fwd_blocked_avx512(const plane_job *j, int i)
{
    maxpool_fwd_planes(j, i);
}

static void maxpool_bwd_blocked_base(const plane_job *j, int i) { maxpool_bwd_planes(j, i); }

__attribute__((target("avx512f"))) static void maxpool_bwd_blocked_avx512(const plane_job *j, int i)
{
    maxpool_bwd_planes(j, i);
}

static void maxpool_fwd_blocked_item(void *c, int i, int t)
{
    (void)t;
    const pool16_job *j = c;
    (j->avx512 ? maxpool_fwd_blocked_avx512 : maxpool_fwd_blocked_base)(&j->p, i);
}

static void maxpool_bwd_blocked_item(void *c, int i, int t)
{
    (void)t;
    const pool16_job *j = c;
    (j->avx512 ? maxpool_bwd_blocked_avx512 : maxpool_bwd_blocked_base)(&j->p, i);
}

/* Global average pool of a blocked x: one plane of 16 channels per unit, each channel summed
   as sum_f sums an NCHW plane (eight double lanes by pixel offset, folded in hsum_d2x4's order,
   then the tail). */
static void avgpool_fwd_blocked_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *j = c;
    const mgt_avgpool_fwd_args *a = &j->op->u.avgpool_fwd;
    size_t hw = (size_t)a->hw, cb = (size_t)a->c / 16, lo, hi;
    item_range((size_t)a->n * cb, j->units, i, &lo, &hi);
    for (size_t pl = lo; pl < hi; pl++) {
        const float *x = a->x + pl * hw * 16;
        double acc[8][16] = {{0}}, tail[16] = {0};
        size_t e = 0;
        for (; e + 8 <= hw; e += 8)
            for (int g = 0; g < 8; g++)
                for (int l = 0; l < 16; l++)
                    acc[g][l] += x[(e + (size_t)g) * 16 + (size_t)l];
        for (; e < hw; e++)
            for (int l = 0; l < 16; l++)
                tail[l] += x[e * 16 + (size_t)l];
        for (int l = 0; l < 16; l++) { /* plane pl is image pl / cb, block pl % cb */
            double s0 = (acc[0][l] + acc[2][l]) + (acc[4][l] + acc[6][l]);
            double s1 = (acc[1][l] + acc[3][l]) + (acc[5][l] + acc[7][l]);
            a->y[pl * 16 + (size_t)l] = (float)(((s0 + s1) + tail[l]) / (double)hw);
        }
    }
}

static void avgpool_bwd_blocked_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *j = c;
    const mgt_avgpool_bwd_args *a = &j->op->u.avgpool_bwd;
    size_t hw = (size_t)a->hw, cb = (size_t)a->c / 16, lo, hi;
    item_range((size_t)a->n * cb, j->units, i, &lo, &hi);
    for (size_t pl = lo; pl < hi; pl++) {
        vf16 v;
        for (int l = 0; l < 16; l++)
            v[l] = a->dy[pl * 16 + (size_t)l] / (float)a->hw; /* as avgpool_bwd_item */
        float *dx = a->dx + pl * hw * 16;
        for (size_t e = 0; e < hw; e++)
            V16_ST(dx + e * 16, v);
    }
}

static void avgpool_fwd_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *j = c;
    const mgt_avgpool_fwd_args *a = &j->op->u.avgpool_fwd;
    size_t hw = (size_t)a->hw, lo, hi;
    item_range((size_t)a->n * a->c, j->units, i, &lo, &hi);
    for (size_t pl = lo; pl < hi; pl++)
        a->y[pl] = (float)(sum_f(a->x + pl * hw, hw) / (double)hw);
}

static void avgpool_bwd_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *j = c;
    const mgt_avgpool_bwd_args *a = &j->op->u.avgpool_bwd;
    size_t hw = (size_t)a->hw, lo, hi;
    item_range((size_t)a->n * a->c, j->units, i, &lo, &hi);
    for (size_t pl = lo; pl < hi; pl++) {
        v_fill(a->dx + pl * hw, a->dy[pl] / (float)a->hw, hw);
    }
}

/* Adaptive average pooling: planes in parallel, each in the reference's order. */
static void apool_fwd_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *jb = c;
    const mgt_apool_fwd_args *a = &jb->op->u.apool_fwd;
    size_t lo, hi, in = (size_t)a->h * a->w, out = (size_t)a->oh * a->ow;
    item_range((size_t)a->n * a->c, jb->units, i, &lo, &hi);
    for (size_t pl = lo; pl < hi; pl++) {
        const float *x = a->x + pl * in;
        for (int oy = 0; oy < a->oh; oy++)
            for (int ox = 0; ox < a->ow; ox++) {
                int y0, y1, x0, x1;
                mgt_apool_range(oy, a->h, a->oh, &y0, &y1);
                mgt_apool_range(ox, a->w, a->ow, &x0, &x1);
                double s = 0.0;
                for (int y = y0; y < y1; y++)
                    s += sum_f(x + (size_t)y * a->w + x0, (size_t)(x1 - x0));
                a->y[pl * out + (size_t)oy * a->ow + ox] = (float)(s / ((y1 - y0) * (x1 - x0)));
            }
    }
}

static void apool_bwd_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *jb = c;
    const mgt_apool_bwd_args *a = &jb->op->u.apool_bwd;
    size_t lo, hi, in = (size_t)a->h * a->w, out = (size_t)a->oh * a->ow;
    item_range((size_t)a->n * a->c, jb->units, i, &lo, &hi);
    for (size_t pl = lo; pl < hi; pl++) {
        float *dx = a->dx + pl * in;
        memset(dx, 0, in * sizeof(float));
        for (int oy = 0; oy < a->oh; oy++)
            for (int ox = 0; ox < a->ow; ox++) {
                int y0, y1, x0, x1;
                mgt_apool_range(oy, a->h, a->oh, &y0, &y1);
                mgt_apool_range(ox, a->w, a->ow, &x0, &x1);
                float g =
                    a->dy[pl * out + (size_t)oy * a->ow + ox] / (float)((y1 - y0) * (x1 - x0));
                for (int y = y0; y < y1; y++)
                    for (int xx = x0; xx < x1; xx++)
                        dx[(size_t)y * a->w + xx] += g;
            }
    }
}

static mgt_status run_maxpool(cpu_ctx *ctx, const mgt_op *op, const mgt_pool2d_shape *sh,
                              void (*item)(void *, int, int), void (*blocked)(void *, int, int))
{
    size_t work = (size_t)mgt_pool2d_out_h(sh) * mgt_pool2d_out_w(sh) * sh->kh * sh->kw;
    if (sh->layout == MGT_LAYOUT_NCHW16C) { /* a plane is a block of 16 channels */
        pool16_job j = {{op, units_per_item(work * 16)}, vec_avx512(ctx)};
        POOL_FOR(ctx, items_of((size_t)sh->n * (sh->c / 16), j.p.units), blocked, &j);
        return MGT_OK;
    }
    plane_job j = {op, units_per_item(work)};
    POOL_FOR(ctx, items_of((size_t)sh->n * sh->c, j.units), item, &j);
    return MGT_OK;
}

mgt_status cpu_maxpool_fwd(cpu_ctx *ctx, const mgt_op *op)
{
    return run_maxpool(ctx, op, &op->u.maxpool_fwd.sh, maxpool_fwd_item, maxpool_fwd_blocked_item);
}

mgt_status cpu_maxpool_bwd(cpu_ctx *ctx, const mgt_op *op)
{
    return run_maxpool(ctx, op, &op->u.maxpool_bwd.sh, maxpool_bwd_item, maxpool_bwd_blocked_item);
}

mgt_status cpu_avgpool_fwd(cpu_ctx *ctx, const mgt_op *op)
{
    if (op->u.avgpool_fwd.layout == MGT_LAYOUT_NCHW16C) {
        plane_job j = {op, units_per_item((size_t)op->u.avgpool_fwd.hw * 16)};
        POOL_FOR(ctx, items_of((size_t)op->u.avgpool_fwd.n * (op->u.avgpool_fwd.c / 16), j.units),
                 avgpool_fwd_blocked_item, &j);
        return MGT_OK;
    }
    plane_job j = {op, units_per_item((size_t)op->u.avgpool_fwd.hw)};
    POOL_FOR(ctx, items_of((size_t)op->u.avgpool_fwd.n * op->u.avgpool_fwd.c, j.units),
             avgpool_fwd_item, &j);
    return MGT_OK;
}

mgt_status cpu_avgpool_bwd(cpu_ctx *ctx, const mgt_op *op)
{
    if (op->u.avgpool_bwd.layout == MGT_LAYOUT_NCHW16C) {
        plane_job j = {op, units_per_item((size_t)op->u.avgpool_bwd.hw * 16)};
        POOL_FOR(ctx, items_of((size_t)op->u.avgpool_bwd.n * (op->u.avgpool_bwd.c / 16), j.units),
                 avgpool_bwd_blocked_item, &j);
        return MGT_OK;
    }
    plane_job j = {op, units_per_item((size_t)op->u.avgpool_bwd.hw)};
    POOL_FOR(ctx, items_of((size_t)op->u.avgpool_bwd.n * op->u.avgpool_bwd.c, j.units),
             avgpool_bwd_item, &j);
    return MGT_OK;
}

mgt_status cpu_apool_fwd(cpu_ctx *ctx, const mgt_op *op)
{
    const mgt_apool_fwd_args *a = &op->u.apool_fwd;
    plane_job j = {op, units_per_item((size_t)a->h * a->w)};
    POOL_FOR(ctx, items_of((size_t)a->n * a->c, j.units), apool_fwd_item, &j);
    return MGT_OK;
}

mgt_status cpu_apool_bwd(cpu_ctx *ctx, const mgt_op *op)
{
    const mgt_apool_bwd_args *a = &op->u.apool_bwd;
    plane_job j = {op, units_per_item((size_t)a->h * a->w)};
    POOL_FOR(ctx, items_of((size_t)a->n * a->c, j.units), apool_bwd_item, &j);
    return MGT_OK;
}
