/* The layer norm's row path (hw == 1: LayerNorm over the last dimension, ViT's and Swin's),
   which layernorm_channels_forward and _backward take: built twice, for AVX2 and the baseline.

   x [rows, c]: items of whole rows. A row's mean is summed in double; its deviations, their
   squares and everything elementwise are in float, the deviation taken from the mean's float
   rounding m0 and the remainder d0 = m - m0 in two steps ((x - m0) - d0), so a row whose mean is
   far larger than its spread keeps its precision. Backward's parameter sums gather in float over
   blocks of LN_BLOCK rows, then in double per item; items are added in item order afterwards.
   Items are a function of the shape alone, so no result depends on threads.

   The loops use eight float lanes (and four double ones) as GCC vector types: the x86-64
   baseline splits each in two SSE operations, the AVX2 build keeps them whole. Both do the same
   IEEE operations in the same order (no contraction under -std=c11), so they give the same bits
   (test_cpu_kernels compares them). */
#include "device/cpu/vec.h"

/* Rows whose parameter-gradient terms a float partial sum gathers before they go to double. */
#define LN_BLOCK 8

#define LN_INLINE __attribute__((always_inline)) static inline

typedef float vf8 __attribute__((vector_size(8 * sizeof(float))));
typedef double vd4 __attribute__((vector_size(4 * sizeof(double))));

LN_INLINE vf8 ld8(const float *p)
{
    vf8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

LN_INLINE void st8(float *p, vf8 v) { memcpy(p, &v, sizeof v); }

/* four floats widened to doubles */
LN_INLINE vd4 ld_d4(const float *p)
{
    vf v;
    memcpy(&v, p, sizeof v);
    return __builtin_convertvector(v, vd4);
}

LN_INLINE double hsum8(vf8 v)
{
    return (((double)v[0] + v[1]) + ((double)v[2] + v[3])) +
           (((double)v[4] + v[5]) + ((double)v[6] + v[7]));
}

/* A row's statistics: the mean as m0 + d0 (its float rounding and the remainder) and 1/std. */
typedef struct ln_stats {
    float m0, d0, rs;
} ln_stats;

LN_INLINE ln_stats ln_row_stats(const float *x, size_t c, float eps)
{
    vd4 a0 = {0}, a1 = a0, a2 = a0, a3 = a0;
    size_t k = 0;
    for (; k + 16 <= c; k += 16) {
        a0 += ld_d4(x + k);
        a1 += ld_d4(x + k + 4);
        a2 += ld_d4(x + k + 8);
        a3 += ld_d4(x + k + 12);
    }
    double s = 0.0;
    for (; k < c; k++)
        s += x[k];
    vd4 a = (a0 + a1) + (a2 + a3);
    double m = (((a[0] + a[1]) + (a[2] + a[3])) + s) / (double)c;
    ln_stats st = {(float)m, 0.0f, 0.0f};
    st.d0 = (float)(m - st.m0);
    vf8 v0 = {0}, v1 = v0;
    float vt = 0.0f;
    for (k = 0; k + 16 <= c; k += 16) {
        vf8 e0 = (ld8(x + k) - st.m0) - st.d0, e1 = (ld8(x + k + 8) - st.m0) - st.d0;
        v0 += e0 * e0;
        v1 += e1 * e1;
    }
    for (; k < c; k++) {
        float e = (x[k] - st.m0) - st.d0;
        vt += e * e;
    }
    double var = (hsum8(v0 + v1) + vt) / (double)c;
    st.rs = (float)(1.0 / sqrt(var + (double)eps));
    return st;
}

/* x normalised: ((x - m0) - d0) / std */
LN_INLINE vf8 ln_xh8(const float *x, ln_stats st) { return ((ld8(x) - st.m0) - st.d0) * st.rs; }

LN_INLINE float ln_xh(float x, ln_stats st) { return ((x - st.m0) - st.d0) * st.rs; }

LN_INLINE void ln_rows_fwd_span(const mgt_lnc_fwd_args *a, size_t lo, size_t hi)
{
    size_t c = (size_t)a->c;
    for (size_t r = lo; r < hi; r++) {
        const float *x = a->x + r * c;
        float *y = a->y + r * c;
        ln_stats st = ln_row_stats(x, c, a->eps);
        size_t k = 0;
        for (; k + 8 <= c; k += 8) {
            st8(y + k, ln_xh8(x + k, st) * ld8(a->weight + k) + ld8(a->bias + k));
        }
        for (; k < c; k++)
            y[k] = ln_xh(x[k], st) * a->weight[k] + a->bias[k];
    }
}

/* The rows [lo, hi): dx, and their dweight and dbias terms added to sw and sb (c doubles
   each), through fw and fb (c floats each, scratch). */
LN_INLINE void ln_rows_bwd_span(const mgt_lnc_bwd_args *a, size_t lo, size_t hi, double *sw,
                                double *sb, float *fw, float *fb)
{
    size_t c = (size_t)a->c;
    float inv_c = 1.0f / (float)c;
    for (size_t r0 = lo; r0 < hi; r0 += LN_BLOCK) {
        size_t r1 = min_z(hi, r0 + LN_BLOCK);
        memset(fw, 0, c * sizeof *fw);
        memset(fb, 0, c * sizeof *fb);
        for (size_t r = r0; r < r1; r++) {
            const float *x = a->x + r * c, *dy = a->dy + r * c;
            float *dx = a->dx + r * c;
            ln_stats st = ln_row_stats(x, c, a->eps);
            vf8 g0 = {0}, gx0 = g0;
            float gt = 0.0f, gxt = 0.0f;
            size_t k = 0;
            for (; k + 8 <= c; k += 8) {
                vf8 d = ld8(dy + k), xh = ln_xh8(x + k, st);
                vf8 g = d * ld8(a->weight + k);
                g0 += g;
                gx0 += g * xh;
                st8(fw + k, ld8(fw + k) + d * xh);
                st8(fb + k, ld8(fb + k) + d);
            }
            for (; k < c; k++) {
                float xh = ln_xh(x[k], st), g = dy[k] * a->weight[k];
                gt += g;
                gxt += g * xh;
                fw[k] += dy[k] * xh;
                fb[k] += dy[k];
            }
            float mg = (float)(hsum8(g0) + gt) * inv_c, mgx = (float)(hsum8(gx0) + gxt) * inv_c;
            for (k = 0; k + 8 <= c; k += 8) {
                vf8 g = ld8(dy + k) * ld8(a->weight + k);
                st8(dx + k, st.rs * ((g - mg) - ln_xh8(x + k, st) * mgx));
            }
            for (; k < c; k++) {
                float g = dy[k] * a->weight[k];
                dx[k] = st.rs * ((g - mg) - ln_xh(x[k], st) * mgx);
            }
        }
        size_t k = 0;
        for (; k + 4 <= c; k += 4) {
            vd4 w, b;
            memcpy(&w, sw + k, sizeof w);
            memcpy(&b, sb + k, sizeof b);
            w += ld_d4(fw + k);
            b += ld_d4(fb + k);
            memcpy(sw + k, &w, sizeof w);
            memcpy(sb + k, &b, sizeof b);
        }
        for (; k < c; k++) {
            sw[k] += fw[k];
            sb[k] += fb[k];
        }
    }
}

__attribute__((target("avx2"))) static void ln_rows_fwd_avx2(const mgt_lnc_fwd_args *a, size_t lo,
                                                             size_t hi)
{
    ln_rows_fwd_span(a, lo, hi);
}

static void ln_rows_fwd_base(const mgt_lnc_fwd_args *a, size_t lo, size_t hi)
{
    ln_rows_fwd_span(a, lo, hi);
}

__attribute__((target("avx2"))) static void ln_rows_bwd_avx2(const mgt_lnc_bwd_args *a, size_t lo,
                                                             size_t hi, double *sw, double *sb,
                                                             float *fw, float *fb)
{
    ln_rows_bwd_span(a, lo, hi, sw, sb, fw, fb);
}

static void ln_rows_bwd_base(const mgt_lnc_bwd_args *a, size_t lo, size_t hi, double *sw,
                             double *sb, float *fw, float *fb)
{
    ln_rows_bwd_span(a, lo, hi, sw, sb, fw, fb);
}

typedef struct ln_rows_job {
    const mgt_op *op;
    size_t units;    /* rows per item */
    bool avx2;       /* the AVX2 build of the loops */
    double *partial; /* backward: [items][2c] */
    float *fsum;     /* backward: [threads][2c], each thread's float block sums */
} ln_rows_job;

static void ln_rows_fwd_item(void *v, int item, int t)
{
    (void)t;
    const ln_rows_job *j = v;
    const mgt_lnc_fwd_args *a = &j->op->u.lnc_fwd;
    size_t lo, hi;
    item_range((size_t)a->n, j->units, item, &lo, &hi);
    (j->avx2 ? ln_rows_fwd_avx2 : ln_rows_fwd_base)(a, lo, hi);
}

static void ln_rows_bwd_item(void *v, int item, int t)
{
    const ln_rows_job *j = v;
    const mgt_lnc_bwd_args *a = &j->op->u.lnc_bwd;
    size_t lo, hi, c = (size_t)a->c;
    double *sw = j->partial + (size_t)item * 2 * c, *sb = sw + c;
    float *fw = j->fsum + (size_t)t * align_up(2 * c), *fb = fw + c;
    for (size_t k = 0; k < 2 * c; k++)
        sw[k] = 0.0;
    item_range((size_t)a->n, j->units, item, &lo, &hi);
    (j->avx2 ? ln_rows_bwd_avx2 : ln_rows_bwd_base)(a, lo, hi, sw, sb, fw, fb);
}

static bool ln_rows_avx2(const cpu_ctx *ctx)
{
    return !ctx->vec_baseline && __builtin_cpu_supports("avx2");
}

mgt_status cpu_ln_rows_fwd(cpu_ctx *ctx, const mgt_op *op)
{
    ln_rows_job j = {op, units_per_item((size_t)op->u.lnc_fwd.c), ln_rows_avx2(ctx), NULL, NULL};
    POOL_FOR(ctx, items_of((size_t)op->u.lnc_fwd.n, j.units), ln_rows_fwd_item, &j);
    return MGT_OK;
}

mgt_status cpu_ln_rows_bwd(cpu_ctx *ctx, const mgt_op *op)
{
    const mgt_lnc_bwd_args *a = &op->u.lnc_bwd;
    size_t c = (size_t)a->c;
    ln_rows_job j = {op, units_per_item(c), ln_rows_avx2(ctx), NULL, NULL};
    int items = items_of((size_t)a->n, j.units);
    size_t partial = align_up((size_t)items * 4 * c); /* floats of the doubles */
    mgt_status st =
        cpu_scratch_ensure(ctx, op, partial + (size_t)pool_threads(ctx) * align_up(2 * c));
    if (st != MGT_OK)
        return st;
    j.partial = (double *)(void *)ctx->scratch;
    j.fsum = ctx->scratch + partial;
    POOL_FOR(ctx, items, ln_rows_bwd_item, &j);
    for (size_t k = 0; k < c; k++) {
        double sw = 0.0, sb = 0.0;
        for (int i = 0; i < items; i++) {
            sw += j.partial[(size_t)i * 2 * c + k];
            sb += j.partial[(size_t)i * 2 * c + c + k];
        }
        a->dweight[k] += (float)sw;
        a->dbias[k] += (float)sb;
    }
    return MGT_OK;
}
