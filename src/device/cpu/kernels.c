/* The CPU fast path of the mock devices: every op of op.h on the device's thread pool. */

/* gemm goes through oneDNN's sgemm and convolutions through oneDNN's direct kernels
   (onednn.c), single-threaded per call: the pool splits the work. Results match mgt_ref_run to
   float rounding and are bit-identical from run to run for a given thread count: every split
   is a function of the shape and the thread count, never of timing. Across thread counts the
   last bits may differ: the splits change the shapes handed to oneDNN (whose summation order
   depends on them) and the filter gradient's partial sums. oneDNN picks its kernels per
   instruction set (AVX2, AVX-512), so bits differ across machines too. */
#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/cpu/kernels.h"
#include "device/cpu/onednn.h"
#include "device/lowp.h"

/* Elements per item of the elementwise loops (64 KB of floats): one claim (a CAS) per item
   is lost in the work, and a busy machine still gets enough items to balance. */
#define CHUNK 16384
/* Below this many multiply-adds a gemm runs as one call: splitting costs more than it saves. */
#define GEMM_SPLIT_MACS (1 << 20)
/* Bytes of one thread's im2col tile. Larger tiles give the gemm wider panels; smaller ones
   keep scratch (threads x tile) modest for the 224x224 layers. */
#define COL_TILE_BYTES (2u << 20)
/* Narrowest im2col tile, in output pixels: narrower panels waste the gemm micro-kernel. */
#define COL_TILE_MIN 32
/* Per-thread scratch regions start on a cache line so that threads never share one. */
#define ALIGN_FLOATS 16

static size_t min_z(size_t a, size_t b) { return a < b ? a : b; }
static size_t max_z(size_t a, size_t b) { return a > b ? a : b; }
static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }
static size_t align_up(size_t n) { return (n + ALIGN_FLOATS - 1) / ALIGN_FLOATS * ALIGN_FLOATS; }

/* Items of `per` elements over n elements; the last may be short. */
static int items_of(size_t n, size_t per) { return (int)ceil_div(n, per); }

static void item_range(size_t n, size_t per, int i, size_t *lo, size_t *hi)
{
    *lo = (size_t)i * per;
    *hi = min_z(n, *lo + per);
}

/* Whole units (planes, rows) per item such that an item holds about CHUNK elements. */
static size_t units_per_item(size_t unit_elems) { return max_z(1, CHUNK / max_z(1, unit_elems)); }

static void sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda,
                  const float *b, int ldb, float beta, float *c, int ldc)
{
    mgt_onednn_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* ---- vector loops ----
   GCC at -O2 (the default RelWithDebInfo build) vectorises only loops whose trip count is a
   known multiple of the vector width, which leaves every kernel loop here scalar; so the hot
   loops use GCC's vector extensions: 16 bytes, the x86-64 baseline (SSE2), which also keeps
   vector values out of the AVX calling-convention question. Each element goes through the same
   IEEE operations as in the scalar tail (no contraction under -std=c11), so these loops give
   the same bits as plain scalar code. */
#define VW 4
typedef float vf __attribute__((vector_size(VW * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(VW * sizeof(int32_t))));
typedef float vf2 __attribute__((vector_size(2 * sizeof(float))));
typedef double vd2 __attribute__((vector_size(2 * sizeof(double))));

static inline vf vld(const float *p)
{
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void vst(float *p, vf v) { memcpy(p, &v, sizeof v); }

static inline vf vdup(float a) { return (vf){a, a, a, a}; }

/* two floats widened to doubles */
static inline vd2 vld_d2(const float *p)
{
    vf2 v;
    memcpy(&v, p, sizeof v);
    return __builtin_convertvector(v, vd2);
}

static inline vd2 vdup_d2(double a) { return (vd2){a, a}; }

/* Eight double lanes (four vectors of two) summed in a fixed order. */
static inline double hsum_d2x4(vd2 a0, vd2 a1, vd2 a2, vd2 a3)
{
    vd2 a = (a0 + a1) + (a2 + a3);
    return a[0] + a[1];
}

/* d[i] = a */
static void v_fill(float *d, float a, size_t n)
{
    vf va = vdup(a);
    size_t j = 0;
    for (; j + VW <= n; j += VW)
        vst(d + j, va);
    for (; j < n; j++)
        d[j] = a;
}

/* d[i] *= a */
static void v_scale(float *d, float a, size_t n)
{
    size_t j = 0;
    for (; j + VW <= n; j += VW)
        vst(d + j, vld(d + j) * a);
    for (; j < n; j++)
        d[j] *= a;
}

/* d[i] += a * s[i] */
static void v_axpy(float *d, float a, const float *src, size_t n)
{
    size_t j = 0;
    for (; j + VW <= n; j += VW)
        vst(d + j, vld(d + j) + a * vld(src + j));
    for (; j < n; j++)
        d[j] += a * src[j];
}

/* d[i] += s[i] */
static void v_add_to(float *d, const float *src, size_t n)
{
    size_t j = 0;
    for (; j + VW <= n; j += VW)
        vst(d + j, vld(d + j) + vld(src + j));
    for (; j < n; j++)
        d[j] += src[j];
}

/* d[i] = (src[i] - sub) * mul + add: batch norm's normalisation; with relu, then
   relu_fwd_item's max(., 0) (NaN passes, +0.0) */
static void v_affine(float *d, const float *src, size_t n, float sub, float mul, float add,
                     bool relu)
{
    size_t j = 0;
    for (; j + VW <= n; j += VW) {
        vf v = (vld(src + j) - sub) * mul + add;
        vst(d + j, relu ? (vf)((vi)v & ~(v <= 0.0f)) : v);
    }
    for (; j < n; j++) {
        float v = (src[j] - sub) * mul + add;
        d[j] = relu && v <= 0.0f ? 0.0f : v;
    }
}

/* The gradient a BN with a folded ReLU sees: relu_bwd_item's y > 0 ? dy : 0 (y NULL: dy). */
static inline vf v_relu_dy(const float *dy, const float *y, size_t j)
{
    return y ? (vf)((vi)vld(dy + j) & (vld(y + j) > 0.0f)) : vld(dy + j);
}

static inline float relu_dy(const float *dy, const float *y, size_t j)
{
    return y && !(y[j] > 0.0f) ? 0.0f : dy[j];
}

/* sum of a[i] * b[i] in float, eight lanes then the tail */
static float v_dot(const float *a, const float *b, size_t n)
{
    vf acc = vdup(0.0f);
    size_t j = 0;
    for (; j + VW <= n; j += VW)
        acc += vld(a + j) * vld(b + j);
    float s = 0.0f;
    for (; j < n; j++)
        s += a[j] * b[j];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + s;
}

/* ---- context and scratch ---- */

mgt_status mgt_cpu_ctx_init(mgt_cpu_ctx *ctx, int threads)
{
    memset(ctx, 0, sizeof *ctx);
    mgt_status st = mgt_cpu_pool_create(threads, &ctx->pool);
    if (st == MGT_OK)
        st = mgt_onednn_create(threads, &ctx->onednn);
    if (st != MGT_OK) {
        mgt_cpu_pool_free(ctx->pool);
        ctx->pool = NULL;
        return st;
    }
    pthread_mutex_init(&ctx->lock, NULL);
    return MGT_OK;
}

void mgt_cpu_ctx_destroy(mgt_cpu_ctx *ctx)
{
    if (ctx == NULL)
        return;
    mgt_cpu_pool_free(ctx->pool);
    ctx->pool = NULL;
    mgt_onednn_free(ctx->onednn);
    ctx->onednn = NULL;
    free(ctx->scratch);
    if (ctx->unreserve != NULL && ctx->scratch_bytes > 0)
        ctx->unreserve(ctx->owner, ctx->scratch_bytes);
    ctx->scratch = NULL;
    ctx->scratch_bytes = 0;
    free(ctx->lowp);
    if (ctx->unreserve != NULL && ctx->lowp_bytes > 0)
        ctx->unreserve(ctx->owner, ctx->lowp_bytes);
    ctx->lowp = NULL;
    ctx->lowp_bytes = 0;
    free(ctx->lp_refused);
    ctx->lp_refused = NULL;
    ctx->n_lp_refused = ctx->cap_lp_refused = 0;
    pthread_mutex_destroy(&ctx->lock);
}

/* Makes ctx->scratch hold at least `floats` floats. It only grows (rounded up to 64 KB so that
   a warm-up of slowly growing layers does not reallocate each time) and is kept, so a steady
   step loop never allocates. The growth is counted against the device first. */
static mgt_status buf_ensure(mgt_cpu_ctx *ctx, const mgt_op *op, float **buf, size_t *have,
                             size_t floats)
{
    size_t bytes = floats * sizeof(float);
    if (bytes <= *have)
        return MGT_OK;
    size_t want = (bytes + 65535) / 65536 * 65536;
    size_t grow = want - *have;
    if (ctx->reserve != NULL) {
        mgt_status st = ctx->reserve(ctx->owner, grow);
        if (st != MGT_OK) {
            char why[256];
            snprintf(why, sizeof why, "%s", mgt_error_last());
            return mgt_error_set(MGT_ERR_OOM, "%s: cannot grow kernel scratch to %zu bytes: %s",
                                 mgt_op_name(op->kind), want, why);
        }
    }
    float *p = aligned_alloc(64, want);
    if (p == NULL) {
        if (ctx->unreserve != NULL)
            ctx->unreserve(ctx->owner, grow);
        return mgt_error_set(MGT_ERR_OOM, "%s: cannot allocate %zu bytes of kernel scratch",
                             mgt_op_name(op->kind), want);
    }
    free(*buf);
    *buf = p;
    *have = want;
    return MGT_OK;
}

static mgt_status scratch_ensure(mgt_cpu_ctx *ctx, const mgt_op *op, size_t floats)
{
    return buf_ensure(ctx, op, &ctx->scratch, &ctx->scratch_bytes, floats);
}

static int pool_threads(const mgt_cpu_ctx *ctx) { return mgt_cpu_pool_threads(ctx->pool); }

#define POOL_FOR(ctx, items, fn, op) mgt_cpu_pool_for((ctx)->pool, (items), (fn), (void *)(op))

/* Whether the loops compiled twice (blocked batch-norm sums, activations) take their AVX-512F
   build: the CPU has it and the tests do not ask for the baseline. */
static bool vec_avx512(const mgt_cpu_ctx *ctx)
{
    return !ctx->vec_baseline && __builtin_cpu_supports("avx512f");
}

/* ---- elementwise ---- */

static void fill_item(void *c, int i, int t)
{
    (void)t;
    const mgt_op *op = c;
    size_t lo, hi;
    item_range(op->u.fill.n, CHUNK, i, &lo, &hi);
    v_fill(op->u.fill.x + lo, op->u.fill.value, hi - lo);
}

static void scale_item(void *c, int i, int t)
{
    (void)t;
    const mgt_op *op = c;
    size_t lo, hi;
    item_range(op->u.scale.n, CHUNK, i, &lo, &hi);
    v_scale(op->u.scale.x + lo, op->u.scale.alpha, hi - lo);
}

static void axpy_item(void *c, int i, int t)
{
    (void)t;
    const mgt_op *op = c;
    size_t lo, hi;
    item_range(op->u.axpy.n, CHUNK, i, &lo, &hi);
    v_axpy(op->u.axpy.y + lo, op->u.axpy.alpha, op->u.axpy.x + lo, hi - lo);
}

static void add_item(void *c, int i, int t)
{
    (void)t;
    const mgt_op *op = c;
    size_t lo, hi;
    item_range(op->u.add.n, CHUNK, i, &lo, &hi);
    float *y = op->u.add.y;
    const float *a = op->u.add.a, *b = op->u.add.b;
    size_t j = lo;
    /* y may be a or b: each block is loaded before it is stored */
    for (; j + VW <= hi; j += VW)
        vst(y + j, vld(a + j) + vld(b + j));
    for (; j < hi; j++)
        y[j] = a[j] + b[j];
}

static void relu_fwd_item(void *c, int i, int t)
{
    (void)t;
    const mgt_op *op = c;
    size_t lo, hi;
    item_range(op->u.relu_fwd.n, CHUNK, i, &lo, &hi);
    float *y = op->u.relu_fwd.y;
    const float *x = op->u.relu_fwd.x;
    /* written so that NaN passes through, as in torch.relu and the reference; the mask
       clears to +0.0, as the reference's literal */
    size_t j = lo;
    for (; j + VW <= hi; j += VW) {
        vf v = vld(x + j);
        vi keep = ~(v <= 0.0f);
        vst(y + j, (vf)((vi)v & keep));
    }
    for (; j < hi; j++)
        y[j] = x[j] <= 0.0f ? 0.0f : x[j];
}

static void relu_bwd_item(void *c, int i, int t)
{
    (void)t;
    const mgt_op *op = c;
    size_t lo, hi;
    item_range(op->u.relu_bwd.n, CHUNK, i, &lo, &hi);
    float *dx = op->u.relu_bwd.dx;
    const float *dy = op->u.relu_bwd.dy, *y = op->u.relu_bwd.y;
    size_t j = lo;
    for (; j + VW <= hi; j += VW) {
        vi pass = vld(y + j) > 0.0f;
        vst(dx + j, (vf)((vi)vld(dy + j) & pass));
    }
    for (; j < hi; j++)
        dx[j] = y[j] > 0.0f ? dy[j] : 0.0f;
}

/* Sum in double over eight lanes and the tail: a single accumulator serialises on the add
   latency, about 8x slower. The lane assignment is fixed, so the result does not depend on
   threads. */
static double sum_f(const float *x, size_t n)
{
    vd2 a0 = vdup_d2(0.0), a1 = a0, a2 = a0, a3 = a0;
    size_t j = 0;
    for (; j + 8 <= n; j += 8) {
        a0 += vld_d2(x + j);
        a1 += vld_d2(x + j + 2);
        a2 += vld_d2(x + j + 4);
        a3 += vld_d2(x + j + 6);
    }
    double s = 0;
    for (; j < n; j++)
        s += x[j];
    return hsum_d2x4(a0, a1, a2, a3) + s;
}

/* The same for x[i]^2, each square taken in double. */
static double sum_sq_f(const float *x, size_t n)
{
    vd2 a0 = vdup_d2(0.0), a1 = a0, a2 = a0, a3 = a0;
    size_t j = 0;
    for (; j + 8 <= n; j += 8) {
        vd2 b0 = vld_d2(x + j), b1 = vld_d2(x + j + 2), b2 = vld_d2(x + j + 4),
            b3 = vld_d2(x + j + 6);
        a0 += b0 * b0;
        a1 += b1 * b1;
        a2 += b2 * b2;
        a3 += b3 * b3;
    }
    double s = 0;
    for (; j < n; j++)
        s += (double)x[j] * x[j];
    return hsum_d2x4(a0, a1, a2, a3) + s;
}

typedef struct sum_job {
    const mgt_op *op;
    double *part;
} sum_job;

static void sum_item(void *c, int i, int t)
{
    (void)t;
    sum_job *j = c;
    size_t lo, hi;
    item_range(j->op->u.sum.n, CHUNK, i, &lo, &hi);
    const float *x = j->op->u.sum.x + lo;
    j->part[i] = j->op->kind == MGT_OP_SUMSQ ? sum_sq_f(x, hi - lo) : sum_f(x, hi - lo);
}

/* Partial sums per fixed chunk, added in chunk order: the same bits for any thread count. */
mgt_status cpu_sum(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    int items = items_of(op->u.sum.n, CHUNK);
    mgt_status st = scratch_ensure(ctx, op, (size_t)items * 2);
    if (st != MGT_OK)
        return st;
    sum_job j = {op, (double *)(void *)ctx->scratch};
    mgt_cpu_pool_for(ctx->pool, items, sum_item, &j);
    double s = 0;
    for (int i = 0; i < items; i++)
        s += j.part[i];
    op->u.sum.out[0] = (float)s;
    return MGT_OK;
}

static void sgd_item(void *c, int i, int t)
{
    (void)t;
    const mgt_op *op = c;
    const mgt_sgd_params *p = &op->u.sgd.p;
    size_t lo, hi;
    item_range(op->u.sgd.n, CHUNK, i, &lo, &hi);
    float *param = op->u.sgd.param, *buf = op->u.sgd.momentum_buf;
    const float *g = op->u.sgd.grad;
    const float s = p->grad_scale, wd = p->weight_decay, m = p->momentum, lr = p->lr;
    const float keep = 1.0f - p->dampening;
    size_t e = lo;
    /* the same operations as the scalar loop below, VW elements at a time */
    for (; e + VW <= hi; e += VW) {
        vf d = s * vld(g + e) + wd * vld(param + e);
        if (m != 0.0f) {
            vf b = p->first_step ? d : m * vld(buf + e) + keep * d;
            vst(buf + e, b);
            d = p->nesterov ? d + m * b : b;
        }
        vst(param + e, vld(param + e) - lr * d);
    }
    for (; e < hi; e++) {
        float d = s * g[e] + wd * param[e];
        if (m != 0.0f) {
            float b = p->first_step ? d : m * buf[e] + keep * d;
            buf[e] = b;
            d = p->nesterov ? d + m * b : b;
        }
        param[e] -= lr * d;
    }
}

/* AdamW and RMSprop: scalar loops over each chunk (sqrt has no vector-extension form), the
   reference's operations in its order, so the bits match it. */
static void adamw_item(void *c, int i, int t)
{
    (void)t;
    const mgt_op *op = c;
    const __typeof__(op->u.adamw) *a = &op->u.adamw;
    const mgt_adamw_params *p = &a->p;
    size_t lo, hi;
    item_range(a->n, CHUNK, i, &lo, &hi);
    const float b1 = p->beta1, b2 = p->beta2, k1 = 1.0f - b1, k2 = 1.0f - b2;
    for (size_t e = lo; e < hi; e++) {
        float g = p->grad_scale * a->grad[e];
        float w = a->param[e] * p->decay;
        float m = a->exp_avg[e] * b1 + k1 * g;
        float v = a->exp_avg_sq[e] * b2 + k2 * (g * g);
        a->exp_avg[e] = m;
        a->exp_avg_sq[e] = v;
        float denom = sqrtf(v) / p->bc2_sqrt + p->eps;
        a->param[e] = w + -p->step_size * (m / denom);
    }
}

static void rmsprop_item(void *c, int i, int t)
{
    (void)t;
    const mgt_op *op = c;
    const __typeof__(op->u.rmsprop) *a = &op->u.rmsprop;
    const mgt_rmsprop_params *p = &a->p;
    size_t lo, hi;
    item_range(a->n, CHUNK, i, &lo, &hi);
    const float keep = 1.0f - p->alpha;
    for (size_t e = lo; e < hi; e++) {
        float g = p->grad_scale * a->grad[e] + p->weight_decay * a->param[e];
        float sq = a->square_avg[e] * p->alpha + keep * (g * g);
        a->square_avg[e] = sq;
        float avg = sqrtf(sq) + p->eps;
        if (p->momentum > 0.0f) {
            float b = a->momentum_buf[e] * p->momentum + g / avg;
            a->momentum_buf[e] = b;
            a->param[e] += -p->lr * b;
        } else {
            a->param[e] += -p->lr * (g / avg);
        }
    }
}

/* ---- gemm ---- */

typedef struct gemm_job {
    const mgt_op *op;
    bool by_rows; /* split the rows of C (else its columns) */
    int per;      /* rows or columns per block */
} gemm_job;

static void gemm_item(void *c, int i, int t)
{
    (void)t;
    const gemm_job *j = c;
    const __typeof__(j->op->u.gemm) *g = &j->op->u.gemm;
    size_t lo, hi;
    if (j->by_rows) {
        item_range((size_t)g->m, (size_t)j->per, i, &lo, &hi);
        /* rows of op(A) are rows of A, or columns of A when it is stored transposed */
        const float *a = g->a + (g->trans_a ? lo : lo * (size_t)g->lda);
        sgemm(g->trans_a, g->trans_b, (int)(hi - lo), g->n, g->k, g->alpha, a, g->lda, g->b, g->ldb,
              g->beta, g->c + lo * (size_t)g->ldc, g->ldc);
    } else {
        item_range((size_t)g->n, (size_t)j->per, i, &lo, &hi);
        const float *b = g->b + (g->trans_b ? lo * (size_t)g->ldb : lo);
        sgemm(g->trans_a, g->trans_b, g->m, (int)(hi - lo), g->k, g->alpha, g->a, g->lda, b, g->ldb,
              g->beta, g->c + lo, g->ldc);
    }
}

/* Blocks of C's rows (or columns, when C is wide and short), each one sgemm call. Each block
   repacks the shared operand, which costs O(k*n) against O(m*n*k/blocks) of work. Two blocks
   per thread where the matrix allows, so a thread the OS delays does not hold up the rest. */
static mgt_status run_lowp(mgt_cpu_ctx *ctx, const mgt_op *op, cpu_op_fn fp32);

mgt_status cpu_gemm(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    if (op->prec != MGT_PREC_F32)
        return run_lowp(ctx, op, cpu_gemm);
    const __typeof__(op->u.gemm) *g = &op->u.gemm;
    int threads = pool_threads(ctx);
    double macs = (double)g->m * g->n * g->k;
    if (threads == 1 || macs < GEMM_SPLIT_MACS || (g->m < 16 && g->n < 16)) {
        sgemm(g->trans_a, g->trans_b, g->m, g->n, g->k, g->alpha, g->a, g->lda, g->b, g->ldb,
              g->beta, g->c, g->ldc);
        return MGT_OK;
    }
    gemm_job j = {op, g->m >= g->n, 0};
    size_t dim = (size_t)(j.by_rows ? g->m : g->n);
    size_t blocks = (size_t)threads * (dim >= (size_t)threads * 256 ? 2 : 1);
    size_t per = ceil_div(dim, blocks);
    per = (per + 7) / 8 * 8; /* whole micro-kernel panels */
    j.per = (int)per;
    mgt_cpu_pool_for(ctx->pool, items_of(dim, per), gemm_item, &j);
    return MGT_OK;
}

/* ---- convolution ---- */

typedef struct conv_geom {
    int n, c, h, w, k, r, s, sh, sw, ph, pw, groups;
    int p, q;
    int cg, kg;     /* channels and filters per group */
    size_t hw, pq;  /* input and output plane sizes */
    size_t rs, crs; /* filter taps per channel, and per filter (one group's channels) */
    bool direct;    /* 1x1, stride 1, no padding: x itself is the im2col matrix */
    bool depthwise; /* one channel per group and one filter per group: direct loops */
} conv_geom;

static conv_geom conv_geom_of(const mgt_conv2d_shape *sh)
{
    conv_geom g = {
        .n = sh->n,
        .c = sh->c,
        .h = sh->h,
        .w = sh->w,
        .k = sh->k,
        .r = sh->r,
        .s = sh->s,
        .sh = sh->stride_h,
        .sw = sh->stride_w,
        .ph = sh->pad_h,
        .pw = sh->pad_w,
        .groups = sh->groups,
    };
    g.p = mgt_conv2d_out_h(sh);
    g.q = mgt_conv2d_out_w(sh);
    g.cg = g.c / g.groups;
    g.kg = g.k / g.groups;
    g.hw = (size_t)g.h * g.w;
    g.pq = (size_t)g.p * g.q;
    g.rs = (size_t)g.r * g.s;
    g.crs = (size_t)g.cg * g.rs;
    g.direct = g.r == 1 && g.s == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0;
    g.depthwise = g.cg == 1 && g.kg == 1;
    return g;
}

/* The output columns ox in [*lo, *hi) whose input column ox*sw - pw + ks lies inside [0, w). */
static void valid_cols(const conv_geom *g, int ks, int ox0, int ox1, int *lo, int *hi)
{
    int a = g->pw - ks > 0 ? (g->pw - ks + g->sw - 1) / g->sw : 0;
    int b = g->w - 1 + g->pw - ks >= 0 ? (g->w - 1 + g->pw - ks) / g->sw + 1 : 0;
    *lo = a > ox0 ? a : ox0;
    *hi = b < ox1 ? b : ox1;
    if (*lo > ox1)
        *lo = ox1;
    if (*hi < *lo)
        *hi = *lo;
}

/* The output rows a pixel range [o0, o1) touches: first row from column *oxa, last row
   (*oyb) up to column *oxb (exclusive). */
static void pixel_rows(const conv_geom *g, size_t o0, size_t o1, int *oya, int *oxa, int *oyb,
                       int *oxb)
{
    *oya = (int)(o0 / (size_t)g->q);
    *oxa = (int)(o0 % (size_t)g->q);
    *oyb = (int)((o1 - 1) / (size_t)g->q);
    *oxb = (int)((o1 - 1) % (size_t)g->q) + 1;
}

/* col[(ci*r + kr)*s + ks][o - o0] = x[ci][oy*sh - ph + kr][ox*sw - pw + ks] (0 outside) for
   output pixels o = oy*q + ox in [o0, o1), channels ci < nch of x (one image's planes).
   The divisions stay out of the per-row loop: on a 28x28 layer with 16 channels the
   division-bound first version spent as long here as in the gemm. */
static void im2col(float *col, size_t ld, const float *x, int nch, const conv_geom *g, size_t o0,
                   size_t o1)
{
    int oya, oxa, oyb, oxb;
    pixel_rows(g, o0, o1, &oya, &oxa, &oyb, &oxb);
    for (int ci = 0; ci < nch; ci++) {
        const float *xp = x + (size_t)ci * g->hw;
        for (int kr = 0; kr < g->r; kr++) {
            for (int ks = 0; ks < g->s; ks++) {
                float *dst = col + (((size_t)ci * g->r + kr) * g->s + ks) * ld;
                int lof, hif;
                valid_cols(g, ks, 0, g->q, &lof, &hif);
                for (int oy = oya; oy <= oyb; oy++) {
                    int ox0 = oy == oya ? oxa : 0, ox1 = oy == oyb ? oxb : g->q;
                    /* dst index of column ox of this row is off + ox */
                    ptrdiff_t off = (ptrdiff_t)oy * g->q - (ptrdiff_t)o0;
                    int iy = oy * g->sh - g->ph + kr;
                    if (iy < 0 || iy >= g->h) {
                        for (int ox = ox0; ox < ox1; ox++)
                            dst[off + ox] = 0.0f;
                        continue;
                    }
                    int lo = lof < ox0 ? ox0 : lof > ox1 ? ox1 : lof;
                    int hi = hif < lo ? lo : hif > ox1 ? ox1 : hif;
                    ptrdiff_t base = (ptrdiff_t)iy * g->w + ks - g->pw;
                    for (int ox = ox0; ox < lo; ox++)
                        dst[off + ox] = 0.0f;
                    /* hi > lo first: with no valid column, xp + base + lo may lie outside x */
                    if (g->sw == 1 && hi > lo) {
                        memcpy(dst + off + lo, xp + base + lo, sizeof(float) * (size_t)(hi - lo));
                    } else {
                        for (int ox = lo; ox < hi; ox++)
                            dst[off + ox] = xp[base + (ptrdiff_t)ox * g->sw];
                    }
                    for (int ox = hi; ox < ox1; ox++)
                        dst[off + ox] = 0.0f;
                }
            }
        }
    }
}

/* The adjoint of im2col: dx[ci][iy][ix] += col[...][o - o0], for the same index map. */
static void col2im_add(float *dx, const float *col, size_t ld, int nch, const conv_geom *g,
                       size_t o0, size_t o1)
{
    int oya, oxa, oyb, oxb;
    pixel_rows(g, o0, o1, &oya, &oxa, &oyb, &oxb);
    for (int ci = 0; ci < nch; ci++) {
        float *xp = dx + (size_t)ci * g->hw;
        for (int kr = 0; kr < g->r; kr++) {
            for (int ks = 0; ks < g->s; ks++) {
                const float *src = col + (((size_t)ci * g->r + kr) * g->s + ks) * ld;
                int lof, hif;
                valid_cols(g, ks, 0, g->q, &lof, &hif);
                for (int oy = oya; oy <= oyb; oy++) {
                    int iy = oy * g->sh - g->ph + kr;
                    if (iy < 0 || iy >= g->h)
                        continue;
                    int ox0 = oy == oya ? oxa : 0, ox1 = oy == oyb ? oxb : g->q;
                    int lo = lof < ox0 ? ox0 : lof > ox1 ? ox1 : lof;
                    int hi = hif < lo ? lo : hif > ox1 ? ox1 : hif;
                    ptrdiff_t off = (ptrdiff_t)oy * g->q - (ptrdiff_t)o0;
                    ptrdiff_t base = (ptrdiff_t)iy * g->w + ks - g->pw;
                    if (g->sw == 1 && hi > lo) {
                        v_add_to(xp + base + lo, src + off + lo, (size_t)(hi - lo));
                    } else {
                        for (int ox = lo; ox < hi; ox++)
                            xp[base + (ptrdiff_t)ox * g->sw] += src[off + ox];
                    }
                }
            }
        }
    }
}

/* Output pixels per im2col tile for a column matrix of `rows` rows. */
static size_t col_tile(const conv_geom *g, size_t rows)
{
    size_t tw = COL_TILE_BYTES / sizeof(float) / max_z(1, rows);
    tw = max_z(tw, COL_TILE_MIN);
    return min_z(tw, g->pq);
}

/* y = beta * y, with beta 0 overwriting (so NaN in uninitialised memory does not survive). */
static void scale_out(float *y, size_t n, float beta)
{
    if (beta == 0.0f)
        memset(y, 0, n * sizeof(float));
    else if (beta != 1.0f)
        v_scale(y, beta, n);
}

typedef struct conv_job {
    const mgt_op *op;
    conv_geom g;
    float *scratch;
    size_t per_thread; /* floats of scratch per thread */
    int tiles;         /* forward: pixel tiles per (image, group); backward data: channel chunks */
    size_t tw;         /* pixels per tile */
    int parts;         /* backward filter: partitions of the (image, pixel) range */
    float *partial;    /* backward filter: parts accumulators of k*crs floats, aligned */
    size_t part_stride;
    size_t units; /* planes / channels per item for the direct loops */
} conv_job;

/* Item (image, group, pixel tile): y tile = W_g x col(tile) + beta * y tile. */
static void conv_fwd_item(void *c, int i, int t)
{
    const conv_job *j = c;
    const conv_geom *g = &j->g;
    int tile = i % j->tiles, ng = i / j->tiles;
    int gi = ng % g->groups, ni = ng / g->groups;
    size_t o0 = (size_t)tile * j->tw, o1 = min_z(g->pq, o0 + j->tw);
    const float *x = j->op->u.conv.in1 + ((size_t)ni * g->c + (size_t)gi * g->cg) * g->hw;
    const float *w = j->op->u.conv.in2 + (size_t)gi * g->kg * g->crs;
    float *y = j->op->u.conv.out + ((size_t)ni * g->k + (size_t)gi * g->kg) * g->pq + o0;
    int tw = (int)(o1 - o0);
    if (g->direct) {
        sgemm(false, false, g->kg, tw, g->cg, 1.0f, w, (int)g->crs, x + o0, (int)g->hw,
              j->op->u.conv.beta, y, (int)g->pq);
        return;
    }
    float *col = j->scratch + (size_t)t * j->per_thread;
    im2col(col, (size_t)tw, x, g->cg, g, o0, o1);
    sgemm(false, false, g->kg, tw, (int)g->crs, 1.0f, w, (int)g->crs, col, tw, j->op->u.conv.beta,
          y, (int)g->pq);
}

/* Depthwise forward over whole planes; the accumulator plane in scratch lets the innermost
   loop run along output rows (vectorised) instead of over the taps. */
static void dw_fwd_item(void *c, int i, int t)
{
    const conv_job *j = c;
    const conv_geom *g = &j->g;
    float *acc = j->scratch + (size_t)t * j->per_thread;
    size_t planes = (size_t)g->n * g->c, lo, hi;
    item_range(planes, j->units, i, &lo, &hi);
    for (size_t pl = lo; pl < hi; pl++) {
        int ch = (int)(pl % (size_t)g->c);
        const float *x = j->op->u.conv.in1 + pl * g->hw;
        const float *w = j->op->u.conv.in2 + (size_t)ch * g->rs;
        float *y = j->op->u.conv.out + pl * g->pq;
        memset(acc, 0, g->pq * sizeof(float));
        for (int kr = 0; kr < g->r; kr++) {
            for (int ks = 0; ks < g->s; ks++) {
                float wv = w[kr * g->s + ks];
                int lo_x, hi_x;
                valid_cols(g, ks, 0, g->q, &lo_x, &hi_x);
                for (int oy = 0; oy < g->p; oy++) {
                    int iy = oy * g->sh - g->ph + kr;
                    if (iy < 0 || iy >= g->h)
                        continue;
                    ptrdiff_t base = (ptrdiff_t)iy * g->w + ks - g->pw;
                    float *ar = acc + (size_t)oy * g->q;
                    if (g->sw == 1 && hi_x > lo_x)
                        v_axpy(ar + lo_x, wv, x + base + lo_x, (size_t)(hi_x - lo_x));
                    else
                        for (int ox = lo_x; ox < hi_x; ox++)
                            ar[ox] += wv * x[base + (ptrdiff_t)ox * g->sw];
                }
            }
        }
        float beta = j->op->u.conv.beta;
        if (beta == 0.0f) {
            memcpy(y, acc, g->pq * sizeof(float));
        } else {
            v_scale(y, beta, g->pq);
            v_add_to(y, acc, g->pq);
        }
    }
}

static mgt_status run_conv_fwd(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    int threads = pool_threads(ctx);
    conv_job j = {.op = op, .g = conv_geom_of(&op->u.conv.sh)};
    const conv_geom *g = &j.g;
    mgt_status st;
    if (g->depthwise) {
        j.units = units_per_item(g->pq * g->rs);
        j.per_thread = align_up(g->pq);
        if ((st = scratch_ensure(ctx, op, j.per_thread * (size_t)threads)) != MGT_OK)
            return st;
        j.scratch = ctx->scratch;
        mgt_cpu_pool_for(ctx->pool, items_of((size_t)g->n * g->c, j.units), dw_fwd_item, &j);
        return MGT_OK;
    }
    size_t outer = (size_t)g->n * g->groups;
    j.tw = g->direct ? g->pq : col_tile(g, g->crs);
    /* Few images (batch 1 on several threads): narrower tiles so every thread has one. */
    if (outer * ceil_div(g->pq, j.tw) < (size_t)threads) {
        size_t want = ceil_div((size_t)threads, outer);
        j.tw = min_z(j.tw, max_z(ceil_div(g->pq, want), COL_TILE_MIN));
    }
    j.tiles = (int)ceil_div(g->pq, j.tw);
    if (!g->direct) {
        j.per_thread = align_up(g->crs * j.tw);
        if ((st = scratch_ensure(ctx, op, j.per_thread * (size_t)threads)) != MGT_OK)
            return st;
        j.scratch = ctx->scratch;
    }
    mgt_cpu_pool_for(ctx->pool, (int)(outer * (size_t)j.tiles), conv_fwd_item, &j);
    return MGT_OK;
}

/* Item (image, group, chunk of the group's input channels): col = W_g[:, chunk]^T x dy_g,
   then col2im into those channels only, so no two items touch the same dx. */
static void conv_bwd_data_item(void *c, int i, int t)
{
    const conv_job *j = c;
    const conv_geom *g = &j->g;
    int chunk = i % j->tiles, ng = i / j->tiles;
    int gi = ng % g->groups, ni = ng / g->groups;
    int per = (int)ceil_div((size_t)g->cg, (size_t)j->tiles);
    int c0 = chunk * per, c1 = c0 + per < g->cg ? c0 + per : g->cg;
    if (c0 >= c1)
        return;
    int nch = c1 - c0;
    float beta = j->op->u.conv.beta;
    const float *dy = j->op->u.conv.in1 + ((size_t)ni * g->k + (size_t)gi * g->kg) * g->pq;
    const float *w = j->op->u.conv.in2 + (size_t)gi * g->kg * g->crs + (size_t)c0 * g->rs;
    float *dx = j->op->u.conv.out + ((size_t)ni * g->c + (size_t)gi * g->cg + c0) * g->hw;
    if (g->direct) {
        sgemm(true, false, nch, (int)g->pq, g->kg, 1.0f, w, (int)g->crs, dy, (int)g->pq, beta, dx,
              (int)g->hw);
        return;
    }
    scale_out(dx, (size_t)nch * g->hw, beta);
    float *col = j->scratch + (size_t)t * j->per_thread;
    int rows = (int)((size_t)nch * g->rs);
    for (size_t o0 = 0; o0 < g->pq; o0 += j->tw) {
        size_t o1 = min_z(g->pq, o0 + j->tw);
        int tw = (int)(o1 - o0);
        sgemm(true, false, rows, tw, g->kg, 1.0f, w, (int)g->crs, dy + o0, (int)g->pq, 0.0f, col,
              tw);
        col2im_add(dx, col, (size_t)tw, nch, g, o0, o1);
    }
}

static void dw_bwd_data_item(void *c, int i, int t)
{
    (void)t;
    const conv_job *j = c;
    const conv_geom *g = &j->g;
    size_t planes = (size_t)g->n * g->c, lo, hi;
    item_range(planes, j->units, i, &lo, &hi);
    for (size_t pl = lo; pl < hi; pl++) {
        int ch = (int)(pl % (size_t)g->c);
        const float *dy = j->op->u.conv.in1 + pl * g->pq;
        const float *w = j->op->u.conv.in2 + (size_t)ch * g->rs;
        float *dx = j->op->u.conv.out + pl * g->hw;
        scale_out(dx, g->hw, j->op->u.conv.beta);
        for (int kr = 0; kr < g->r; kr++) {
            for (int ks = 0; ks < g->s; ks++) {
                float wv = w[kr * g->s + ks];
                int lo_x, hi_x;
                valid_cols(g, ks, 0, g->q, &lo_x, &hi_x);
                for (int oy = 0; oy < g->p; oy++) {
                    int iy = oy * g->sh - g->ph + kr;
                    if (iy < 0 || iy >= g->h)
                        continue;
                    ptrdiff_t base = (ptrdiff_t)iy * g->w + ks - g->pw;
                    const float *dr = dy + (size_t)oy * g->q;
                    if (g->sw == 1 && hi_x > lo_x)
                        v_axpy(dx + base + lo_x, wv, dr + lo_x, (size_t)(hi_x - lo_x));
                    else
                        for (int ox = lo_x; ox < hi_x; ox++)
                            dx[base + (ptrdiff_t)ox * g->sw] += wv * dr[ox];
                }
            }
        }
    }
}

static mgt_status run_conv_bwd_data(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    int threads = pool_threads(ctx);
    conv_job j = {.op = op, .g = conv_geom_of(&op->u.conv.sh)};
    const conv_geom *g = &j.g;
    if (g->depthwise) {
        j.units = units_per_item(g->pq * g->rs);
        mgt_cpu_pool_for(ctx->pool, items_of((size_t)g->n * g->c, j.units), dw_bwd_data_item, &j);
        return MGT_OK;
    }
    size_t outer = (size_t)g->n * g->groups;
    /* Few images: split each group's channels so that every thread has work. */
    j.tiles = outer >= (size_t)threads ? 1 : (int)min_z((size_t)g->cg, ceil_div(threads, outer));
    size_t per = ceil_div((size_t)g->cg, (size_t)j.tiles);
    j.tiles = (int)ceil_div((size_t)g->cg, per);
    if (!g->direct) {
        j.tw = col_tile(g, per * g->rs);
        j.per_thread = align_up(per * g->rs * j.tw);
        mgt_status st = scratch_ensure(ctx, op, j.per_thread * (size_t)threads);
        if (st != MGT_OK)
            return st;
        j.scratch = ctx->scratch;
    }
    mgt_cpu_pool_for(ctx->pool, (int)(outer * (size_t)j.tiles), conv_bwd_data_item, &j);
    return MGT_OK;
}

/* Partition i of the flattened (image, output pixel) range: its dW share is a sum of gemms
   dy_g[:, tile] x col(tile)^T over its tiles. Partitions, not threads, own the accumulators,
   so whichever thread runs a partition the sums (and their order) are the same. */
static void conv_bwd_filter_item(void *c, int i, int t)
{
    const conv_job *j = c;
    const conv_geom *g = &j->g;
    size_t total = (size_t)g->n * g->pq;
    size_t e0 = total * (size_t)i / (size_t)j->parts;
    size_t e1 = total * (size_t)(i + 1) / (size_t)j->parts;
    float *dst = j->parts == 1 ? j->op->u.conv.out : j->partial + (size_t)i * j->part_stride;
    float beta = j->parts == 1 ? j->op->u.conv.beta : 0.0f;
    float *col = g->direct ? NULL : j->scratch + (size_t)t * j->per_thread;
    for (size_t e = e0; e < e1;) {
        size_t ni = e / g->pq, o0 = e % g->pq;
        size_t o1 = min_z(min_z(g->pq, o0 + (e1 - e)), o0 + j->tw);
        int tw = (int)(o1 - o0);
        for (int gi = 0; gi < g->groups; gi++) {
            const float *x = j->op->u.conv.in2 + (ni * g->c + (size_t)gi * g->cg) * g->hw;
            const float *dy = j->op->u.conv.in1 + (ni * g->k + (size_t)gi * g->kg) * g->pq + o0;
            const float *b;
            int ldb;
            if (g->direct) {
                b = x + o0;
                ldb = (int)g->hw;
            } else {
                im2col(col, (size_t)tw, x, g->cg, g, o0, o1);
                b = col;
                ldb = tw;
            }
            sgemm(false, true, g->kg, (int)g->crs, tw, 1.0f, dy, (int)g->pq, b, ldb, beta,
                  dst + (size_t)gi * g->kg * g->crs, (int)g->crs);
        }
        beta = 1.0f;
        e += (size_t)tw;
    }
}

/* dW = beta * dW + (part 0 + part 1 + ...), always in partition order. */
static void conv_reduce_item(void *c, int i, int t)
{
    (void)t;
    const conv_job *j = c;
    size_t n = (size_t)j->g.k * j->g.crs, lo, hi;
    item_range(n, CHUNK, i, &lo, &hi);
    float *dw = j->op->u.conv.out, beta = j->op->u.conv.beta;
    size_t e = lo;
    for (; e + VW <= hi; e += VW) {
        vf s = vld(j->partial + e);
        for (int p = 1; p < j->parts; p++)
            s += vld(j->partial + (size_t)p * j->part_stride + e);
        vst(dw + e, beta == 0.0f ? s : beta * vld(dw + e) + s);
    }
    for (; e < hi; e++) {
        float s = j->partial[e];
        for (int p = 1; p < j->parts; p++)
            s += j->partial[(size_t)p * j->part_stride + e];
        dw[e] = beta == 0.0f ? s : beta * dw[e] + s;
    }
}

/* Depthwise filter gradient per channel over all images, rows summed in float (vectorised)
   and the rows added in double: no partials, and no dependence on the thread count. */
static void dw_bwd_filter_item(void *c, int i, int t)
{
    (void)t;
    const conv_job *j = c;
    const conv_geom *g = &j->g;
    size_t lo, hi;
    item_range((size_t)g->c, j->units, i, &lo, &hi);
    float beta = j->op->u.conv.beta;
    for (size_t ch = lo; ch < hi; ch++) {
        float *dw = j->op->u.conv.out + ch * g->rs;
        for (int kr = 0; kr < g->r; kr++) {
            for (int ks = 0; ks < g->s; ks++) {
                int lo_x, hi_x;
                valid_cols(g, ks, 0, g->q, &lo_x, &hi_x);
                double acc = 0;
                for (int ni = 0; ni < g->n; ni++) {
                    const float *x = j->op->u.conv.in2 + ((size_t)ni * g->c + ch) * g->hw;
                    const float *dy = j->op->u.conv.in1 + ((size_t)ni * g->k + ch) * g->pq;
                    for (int oy = 0; oy < g->p; oy++) {
                        int iy = oy * g->sh - g->ph + kr;
                        if (iy < 0 || iy >= g->h)
                            continue;
                        ptrdiff_t base = (ptrdiff_t)iy * g->w + ks - g->pw;
                        const float *dr = dy + (size_t)oy * g->q;
                        float row = 0.0f;
                        if (g->sw == 1 && hi_x > lo_x)
                            row = v_dot(dr + lo_x, x + base + lo_x, (size_t)(hi_x - lo_x));
                        else
                            for (int ox = lo_x; ox < hi_x; ox++)
                                row += dr[ox] * x[base + (ptrdiff_t)ox * g->sw];
                        acc += row;
                    }
                }
                float *o = dw + kr * g->s + ks;
                *o = beta == 0.0f ? (float)acc : beta * *o + (float)acc;
            }
        }
    }
}

static mgt_status run_conv_bwd_filter(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    int threads = pool_threads(ctx);
    conv_job j = {.op = op, .g = conv_geom_of(&op->u.conv.sh)};
    const conv_geom *g = &j.g;
    if (g->depthwise) {
        j.units = units_per_item((size_t)g->n * g->pq * g->rs);
        mgt_cpu_pool_for(ctx->pool, items_of((size_t)g->c, j.units), dw_bwd_filter_item, &j);
        return MGT_OK;
    }
    size_t total = (size_t)g->n * g->pq;
    double macs = (double)total * g->k * g->crs;
    j.parts = threads == 1 || macs < GEMM_SPLIT_MACS ? 1 : (int)min_z((size_t)threads, total);
    j.tw = g->direct ? g->pq : col_tile(g, g->crs);
    size_t dw_n = (size_t)g->k * g->crs;
    j.part_stride = j.parts > 1 ? align_up(dw_n) : 0;
    j.per_thread = g->direct ? 0 : align_up(g->crs * j.tw);
    size_t part_floats = (size_t)j.parts * j.part_stride;
    mgt_status st = scratch_ensure(ctx, op, part_floats + j.per_thread * (size_t)threads);
    if (st != MGT_OK)
        return st;
    j.partial = ctx->scratch;
    j.scratch = ctx->scratch != NULL ? ctx->scratch + part_floats : NULL;
    mgt_cpu_pool_for(ctx->pool, j.parts, conv_bwd_filter_item, &j);
    if (j.parts > 1)
        mgt_cpu_pool_for(ctx->pool, items_of(dw_n, CHUNK), conv_reduce_item, &j);
    return MGT_OK;
}

/* oneDNN where it has a kernel for the shape; MGT_ERR_UNSUPPORTED (nothing run) otherwise. */
static mgt_status run_conv_onednn(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    mgt_onednn_plan *plan;
    size_t floats;
    mgt_status st = mgt_onednn_conv_plan(ctx->onednn, op, &plan, &floats);
    if (st == MGT_OK)
        st = scratch_ensure(ctx, op, floats);
    if (st == MGT_OK)
        st = mgt_onednn_conv_run(ctx->onednn, plan, ctx->pool, op, ctx->scratch);
    return st;
}

/* ---- batch norm ---- */

/* The op and how many whole units (planes, rows, columns) one item covers. */
typedef struct plane_job {
    const mgt_op *op;
    size_t units; /* planes (or rows, or columns) per item */
} plane_job;

/* The batch-norm sums run in float over sixteen lanes, in blocks of BN_BLOCK elements (64 adds
   per lane at most, so rounding stays near 1e-6 relative), and each block's lanes are added
   into double in a fixed order: no float-to-double conversion in the inner loop, which made
   the all-double version compute-bound at a third of this speed. */
#define BN_BLOCK 1024

static inline double hsum_f4x4(vf a0, vf a1, vf a2, vf a3)
{
    vf a = (a0 + a1) + (a2 + a3);
    return ((double)a[0] + (double)a[1]) + ((double)a[2] + (double)a[3]);
}

/* Sums of d = x - shift and of d^2 over x[0..n), in one pass. */
static void sum_shifted(const float *x, size_t n, float shift, double *s1, double *s2)
{
    vf k = vdup(shift);
    double t1 = 0, t2 = 0;
    size_t j = 0;
    while (j + 16 <= n) {
        size_t end = j + min_z(BN_BLOCK, (n - j) / 16 * 16);
        vf z = vdup(0.0f), a0 = z, a1 = z, a2 = z, a3 = z, q0 = z, q1 = z, q2 = z, q3 = z;
        for (; j < end; j += 16) {
            vf d0 = vld(x + j) - k, d1 = vld(x + j + 4) - k;
            vf d2 = vld(x + j + 8) - k, d3 = vld(x + j + 12) - k;
            a0 += d0;
            a1 += d1;
            a2 += d2;
            a3 += d3;
            q0 += d0 * d0;
            q1 += d1 * d1;
            q2 += d2 * d2;
            q3 += d3 * d3;
        }
        t1 += hsum_f4x4(a0, a1, a2, a3);
        t2 += hsum_f4x4(q0, q1, q2, q3);
    }
    for (; j < n; j++) {
        double d = (double)x[j] - shift;
        t1 += d;
        t2 += d * d;
    }
    *s1 += t1;
    *s2 += t2;
}

/* Sums of dy and of dy * (x - mean) over [0..n), in one pass; dy masked by y > 0 where y is
   not NULL (a folded ReLU). */
static void sum_dy_prod(const float *dy, const float *y, const float *x, size_t n, float mean,
                        double *sdy, double *sdyx)
{
    vf m = vdup(mean);
    double t1 = 0, t2 = 0;
    size_t j = 0;
    while (j + 16 <= n) {
        size_t end = j + min_z(BN_BLOCK, (n - j) / 16 * 16);
        vf z = vdup(0.0f), a0 = z, a1 = z, a2 = z, a3 = z, p0 = z, p1 = z, p2 = z, p3 = z;
        for (; j < end; j += 16) {
            vf g0 = v_relu_dy(dy, y, j), g1 = v_relu_dy(dy, y, j + 4);
            vf g2 = v_relu_dy(dy, y, j + 8), g3 = v_relu_dy(dy, y, j + 12);
            a0 += g0;
            a1 += g1;
            a2 += g2;
            a3 += g3;
            p0 += g0 * (vld(x + j) - m);
            p1 += g1 * (vld(x + j + 4) - m);
            p2 += g2 * (vld(x + j + 8) - m);
            p3 += g3 * (vld(x + j + 12) - m);
        }
        t1 += hsum_f4x4(a0, a1, a2, a3);
        t2 += hsum_f4x4(p0, p1, p2, p3);
    }
    for (; j < n; j++) {
        float g = relu_dy(dy, y, j);
        t1 += g;
        t2 += (double)g * ((double)x[j] - mean);
    }
    *sdy += t1;
    *sdyx += t2;
}

static void bn_train_item(void *c, int ch, int t)
{
    (void)t;
    const mgt_op *op = c;
    const __typeof__(op->u.bn_train) *b = &op->u.bn_train;
    size_t hw = (size_t)b->sh.hw, stride = (size_t)b->sh.c * hw;
    const float *x = b->x + (size_t)ch * hw;
    float *y = b->y + (size_t)ch * hw;
    size_t count = (size_t)b->sh.n * hw;
    /* One pass over shifted data: with the channel's first value as the shift, s1 and s2 stay
       of the order of the spread, not of the mean, so s2 - s1^2/count loses little to
       cancellation even where the mean is many spreads from zero. */
    float first = x[0];
    double s1 = 0, s2 = 0;
    for (int ni = 0; ni < b->sh.n; ni++)
        sum_shifted(x + ni * stride, hw, first, &s1, &s2);
    double mean = first + s1 / (double)count;
    double ss = s2 - s1 * s1 / (double)count;
    if (ss < 0)
        ss = 0;
    double var = ss / (double)count;
    double invstd = 1.0 / sqrt(var + (double)b->sh.eps);
    b->save_mean[ch] = (float)mean;
    b->save_invstd[ch] = (float)invstd;
    double m = b->sh.momentum;
    double unbiased = ss / (double)(count - 1); /* mgt_op_check ensures count > 1 */
    b->running_mean[ch] = (float)((1.0 - m) * b->running_mean[ch] + m * mean);
    b->running_var[ch] = (float)((1.0 - m) * b->running_var[ch] + m * unbiased);
    float fm = (float)mean, scale = b->gamma[ch] * (float)invstd, shift = b->beta[ch];
    for (int ni = 0; ni < b->sh.n; ni++)
        v_affine(y + ni * stride, x + ni * stride, hw, fm, scale, shift, b->sh.relu);
}

static void bn_eval_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *j = c;
    const __typeof__(j->op->u.bn_eval) *b = &j->op->u.bn_eval;
    size_t hw = (size_t)b->sh.hw, lo, hi;
    item_range((size_t)b->sh.n * b->sh.c, j->units, i, &lo, &hi);
    for (size_t pl = lo; pl < hi; pl++) {
        int ch = (int)(pl % (size_t)b->sh.c);
        float mean = b->running_mean[ch];
        float scale = b->gamma[ch] / sqrtf(b->running_var[ch] + b->sh.eps);
        float shift = b->beta[ch];
        v_affine(b->y + pl * hw, b->x + pl * hw, hw, mean, scale, shift, b->sh.relu);
    }
}

static void bn_bwd_item(void *c, int ch, int t)
{
    (void)t;
    const mgt_op *op = c;
    const __typeof__(op->u.bn_bwd) *b = &op->u.bn_bwd;
    size_t hw = (size_t)b->sh.hw, stride = (size_t)b->sh.c * hw;
    size_t off = (size_t)ch * hw;
    double count = (double)b->sh.n * (double)hw;
    double mean = b->save_mean[ch], invstd = b->save_invstd[ch];
    double sdy = 0, sdyx = 0;
    const float *ys = b->sh.relu ? b->y + off : NULL; /* the folded ReLU's mask */
    for (int ni = 0; ni < b->sh.n; ni++)
        sum_dy_prod(b->dy + off + ni * stride, ys ? ys + ni * stride : NULL,
                    b->x + off + ni * stride, hw, (float)mean, &sdy, &sdyx);
    double sdyxhat = sdyx * invstd;
    b->dgamma[ch] += (float)sdyxhat;
    b->dbeta[ch] += (float)sdy;
    /* dx = gamma*invstd * (dy - mean(dy) - xhat * mean(dy*xhat)) */
    float k = b->gamma[ch] * (float)invstd;
    float mdy = (float)(sdy / count);
    float kx = (float)(sdyxhat / count * invstd); /* applied to (x - mean) */
    float fm = (float)mean;
    for (int ni = 0; ni < b->sh.n; ni++) {
        const float *dy = b->dy + off + ni * stride, *x = b->x + off + ni * stride;
        const float *y = ys ? ys + ni * stride : NULL;
        float *dx = b->dx + off + ni * stride;
        size_t e = 0;
        for (; e + VW <= hw; e += VW)
            vst(dx + e, k * (v_relu_dy(dy, y, e) - mdy - (vld(x + e) - fm) * kx));
        for (; e < hw; e++)
            dx[e] = k * (relu_dy(dy, y, e) - mdy - (x[e] - fm) * kx);
    }
}

/* bn_train's statistics alone: one pass over shifted data, the same sums. */
static void bn_stats_item(void *c, int ch, int t)
{
    (void)t;
    const mgt_op *op = c;
    const __typeof__(op->u.bn_stats) *b = &op->u.bn_stats;
    size_t hw = (size_t)b->sh.hw, stride = (size_t)b->sh.c * hw;
    const float *x = b->x + (size_t)ch * hw;
    size_t count = (size_t)b->sh.n * hw;
    float first = x[0];
    double s1 = 0, s2 = 0;
    for (int ni = 0; ni < b->sh.n; ni++)
        sum_shifted(x + ni * stride, hw, first, &s1, &s2);
    double ss = s2 - s1 * s1 / (double)count;
    if (ss < 0)
        ss = 0;
    b->mean[ch] = (float)(first + s1 / (double)count);
    b->var[ch] = (float)(ss / (double)count);
}

/* bn_bwd's dx with the sums and count given. */
static void bn_bwd_elemt_item(void *c, int ch, int t)
{
    (void)t;
    const mgt_op *op = c;
    const __typeof__(op->u.bn_bwd_elemt) *b = &op->u.bn_bwd_elemt;
    size_t hw = (size_t)b->sh.hw, stride = (size_t)b->sh.c * hw;
    size_t off = (size_t)ch * hw;
    double invstd = b->invstd[ch];
    float k = b->gamma[ch] * (float)invstd;
    float mdy = (float)(b->sum_dy[ch] / b->count);
    float kx = (float)(b->sum_dy_xhat[ch] / b->count * invstd);
    float fm = b->mean[ch];
    for (int ni = 0; ni < b->sh.n; ni++) {
        const float *dy = b->dy + off + ni * stride, *x = b->x + off + ni * stride;
        float *dx = b->dx + off + ni * stride;
        size_t e = 0;
        for (; e + VW <= hw; e += VW)
            vst(dx + e, k * (vld(dy + e) - mdy - (vld(x + e) - fm) * kx));
        for (; e < hw; e++)
            dx[e] = k * (dy[e] - mdy - (x[e] - fm) * kx);
    }
}

/* ---- batch norm and the global average pool on nChw16c ----
   A 16-float row of a blocked tensor is one pixel of 16 channels, so one vector carries a whole
   channel block. The sums are the NCHW kernels' own, term for term: sum_shifted's and
   sum_dy_prod's four-lane float accumulators become sixteen per-pixel-offset accumulators of 16
   channels, folded and widened to double in hsum_f4x4's order, the tail and the images added in
   double as there; sum_f's eight double lanes likewise. So a model gives the same bits in either
   layout (test_train checks a whole run). The images are split into BNB_PARTS parts (one item
   each, so a 16-channel layer keeps every thread busy); each image's sums land in scratch and are
   added in image order. */
#define BNB_PARTS 8

/* Sixteen lanes, read and written where a row lies (4-byte aligned: test cases may place a
   tensor anywhere); without AVX-512 in the build GCC splits them into four SSE operations. */
typedef float vf16 __attribute__((vector_size(16 * sizeof(float)), aligned(4)));
typedef int32_t vi16 __attribute__((vector_size(16 * sizeof(int32_t)), aligned(4)));
#define V16_LD(p) (*(const vf16 *)(const void *)(p))
#define V16_ST(p, v) (*(vf16 *)(void *)(p) = (v))

static int bnb_parts(int n) { return n < BNB_PARTS ? n : BNB_PARTS; }

/* What a blocked batch-norm op's items share: the op's arrays seen as [n, c/16, hw, 16], each
   image's two sums per channel, and the per-channel coefficients of the elementwise pass. */
typedef struct bnb_job {
    int n, cb, parts;
    size_t hw;
    const float *x, *dy; /* dy: backward only */
    const float *ymask;  /* backward with a folded ReLU: the forward's output, else NULL */
    float *y;            /* y, or dx */
    bool relu;           /* forward with a folded ReLU */
    double *sums;        /* [n][2][c]: per image, the first sum of every channel, then the second */
    const float *shift;  /* [c]: the value each channel's sums are shifted by */
    float *k0, *k1, *k2; /* [c]: the elementwise pass's coefficients */
    size_t units;        /* planes per item of the elementwise pass */
    bool avx512;         /* the sums on the AVX-512F build of their loop */
} bnb_job;

/* dy where the folded ReLU's output y (NULL: none) is positive, as relu_bwd_item masks it (a
   macro: a function returning 16 lanes would change its ABI between the two builds) */
#define V16_RELU_DY(dy, y, at) \
    ((y) ? (vf16)((vi16)V16_LD((dy) + (at)) & (V16_LD((y) + (at)) > 0.0f)) : V16_LD((dy) + (at)))

/* One image plane of one block: per channel, t1 = sum of a and t2 = sum of b, where backward
   (dy != NULL) has a = dy, b = dy * (x - shift) and forward a = x - shift, b = a^2; added as
   sum_shifted and sum_dy_prod add them for one NCHW plane. y masks dy as there. */
__attribute__((always_inline)) static inline void bnb_plane_sums_span(const float *x,
                                                                      const float *dy,
                                                                      const float *y, size_t hw,
                                                                      const float *shift,
                                                                      double *t1, double *t2)
{
    vf16 k = V16_LD(shift);
    for (int l = 0; l < 16; l++)
        t1[l] = t2[l] = 0;
    size_t j = 0;
    while (j + 16 <= hw) {
        size_t end = j + min_z(BN_BLOCK, (hw - j) / 16 * 16);
        vf16 a[16], q[16]; /* by pixel offset within a group of 16, as the four 4-lane vectors */
        memset(a, 0, sizeof a);
        memset(q, 0, sizeof q);
        for (; j < end; j += 16)
            for (int g = 0; g < 16; g++) {
                vf16 v = V16_LD(x + (j + (size_t)g) * 16) - k;
                if (dy) {
                    vf16 d = V16_RELU_DY(dy, y, (j + (size_t)g) * 16);
                    a[g] += d;
                    q[g] += d * v;
                } else {
                    a[g] += v;
                    q[g] += v * v;
                }
            }
        /* hsum_f4x4: lane l of (a0 + a1) + (a2 + a3), then the four lanes in double */
        vf16 fa[4], fq[4];
        for (int l = 0; l < 4; l++) {
            fa[l] = (a[l] + a[4 + l]) + (a[8 + l] + a[12 + l]);
            fq[l] = (q[l] + q[4 + l]) + (q[8 + l] + q[12 + l]);
        }
        for (int c = 0; c < 16; c++) {
            t1[c] += ((double)fa[0][c] + (double)fa[1][c]) + ((double)fa[2][c] + (double)fa[3][c]);
            t2[c] += ((double)fq[0][c] + (double)fq[1][c]) + ((double)fq[2][c] + (double)fq[3][c]);
        }
    }
    for (; j < hw; j++)
        for (int c = 0; c < 16; c++) {
            if (dy) {
                float g = relu_dy(dy, y, j * 16 + (size_t)c);
                t1[c] += g;
                t2[c] += (double)g * ((double)x[j * 16 + (size_t)c] - shift[c]);
            } else {
                double d = (double)x[j * 16 + (size_t)c] - shift[c];
                t1[c] += d;
                t2[c] += d * d;
            }
        }
}

/* The loop above twice, as the activations have it: its 32 accumulators of 16 lanes fit AVX-512's
   registers, and the same per-lane IEEE operations give the same bits in both builds. */
static void bnb_plane_sums_base(const float *x, const float *dy, const float *y, size_t hw,
                                const float *shift, double *t1, double *t2)
{
    bnb_plane_sums_span(x, dy, y, hw, shift, t1, t2);
}

__attribute__((target("avx512f"))) static void bnb_plane_sums_avx512(const float *x,
                                                                     const float *dy,
                                                                     const float *y, size_t hw,
                                                                     const float *shift, double *t1,
                                                                     double *t2)
{
    bnb_plane_sums_span(x, dy, y, hw, shift, t1, t2);
}

/* The sums of this item's images of one block, each image's into its own place. */
static void bnb_sums_item(void *c, int i, int t)
{
    (void)t;
    const bnb_job *j = c;
    int b = i / j->parts, p = i % j->parts;
    int n0 = (int)((long long)j->n * p / j->parts),
        n1 = (int)((long long)j->n * (p + 1) / j->parts);
    size_t ch = (size_t)j->cb * 16;
    for (int ni = n0; ni < n1; ni++) {
        size_t base = ((size_t)ni * j->cb + b) * j->hw * 16;
        double *out = j->sums + (size_t)ni * 2 * ch + (size_t)b * 16;
        (j->avx512 ? bnb_plane_sums_avx512 : bnb_plane_sums_base)(
            j->x + base, j->dy ? j->dy + base : NULL, j->ymask ? j->ymask + base : NULL, j->hw,
            j->shift + (size_t)b * 16, out, out + ch);
    }
}

/* Channel ch's two sums over every image, added in image order as the NCHW kernels add them. */
static void bnb_total(const bnb_job *j, int ch, double *s1, double *s2)
{
    size_t c = (size_t)j->cb * 16;
    double a = 0, q = 0;
    for (int ni = 0; ni < j->n; ni++) {
        a += j->sums[(size_t)ni * 2 * c + (size_t)ch];
        q += j->sums[(size_t)ni * 2 * c + c + (size_t)ch];
    }
    *s1 = a;
    *s2 = q;
}

/* A block's 16 per-channel coefficients as four SSE vectors: the elementwise passes below run
   on the baseline build, where GCC lowers 16-lane comparisons (the ReLU masks) to scalar code. */
static void v_ld4(vf v[4], const float *p)
{
    for (int q = 0; q < 4; q++)
        v[q] = vld(p + 4 * q);
}

/* The elementwise pass of the forward (train and eval): y = (x - k0) * k1 + k2 per channel,
   then with a folded ReLU relu_fwd_item's max(., 0). */
static void bnb_affine_item(void *c, int i, int t)
{
    (void)t;
    const bnb_job *j = c;
    bool relu = j->relu;
    size_t lo, hi;
    item_range((size_t)j->n * j->cb, j->units, i, &lo, &hi);
    for (size_t pl = lo; pl < hi; pl++) {
        size_t b = pl % (size_t)j->cb;
        vf sub[4], mul[4], add[4];
        v_ld4(sub, j->k0 + b * 16);
        v_ld4(mul, j->k1 + b * 16);
        v_ld4(add, j->k2 + b * 16);
        const float *x = j->x + pl * j->hw * 16;
        float *y = j->y + pl * j->hw * 16;
        for (size_t e = 0; e < j->hw * 16; e += 16)
            for (int q = 0; q < 4; q++) {
                vf v = (vld(x + e + 4 * q) - sub[q]) * mul[q] + add[q];
                vst(y + e + 4 * q, relu ? (vf)((vi)v & ~(v <= 0.0f)) : v);
            }
    }
}

/* The elementwise pass of the backward: dx = k1 * (dy - k2 - (x - k0) * kx), kx in shift, dy
   masked by a folded ReLU's output. */
static void bnb_dx_item(void *c, int i, int t)
{
    (void)t;
    const bnb_job *j = c;
    size_t lo, hi;
    item_range((size_t)j->n * j->cb, j->units, i, &lo, &hi);
    for (size_t pl = lo; pl < hi; pl++) {
        size_t b = pl % (size_t)j->cb;
        vf fm[4], k[4], mdy[4], kx[4];
        v_ld4(fm, j->k0 + b * 16);
        v_ld4(k, j->k1 + b * 16);
        v_ld4(mdy, j->k2 + b * 16);
        v_ld4(kx, j->shift + b * 16);
        size_t off = pl * j->hw * 16;
        const float *x = j->x + off, *dy = j->dy + off, *ym = j->ymask ? j->ymask + off : NULL;
        float *dx = j->y + off;
        for (size_t e = 0; e < j->hw * 16; e += 16)
            for (int q = 0; q < 4; q++) {
                size_t at = e + 4 * (size_t)q;
                vst(dx + at,
                    k[q] * (v_relu_dy(dy, ym, at) - mdy[q] - (vld(x + at) - fm[q]) * kx[q]));
            }
    }
}

/* A blocked batch-norm op's job over x, dy (backward; else NULL) and y (or dx), with its scratch:
   the images' sums, then four [c] float arrays. */
static mgt_status bnb_setup(mgt_cpu_ctx *ctx, const mgt_op *op, const mgt_bn_shape *sh,
                            const float *x, const float *dy, float *y, bnb_job *j)
{
    int parts = bnb_parts(sh->n), cb = sh->c / 16;
    size_t c = (size_t)sh->c, sum_floats = (size_t)sh->n * 2 * c * 2; /* doubles */
    mgt_status st = scratch_ensure(ctx, op, sum_floats + 4 * c);
    if (st != MGT_OK)
        return st;
    float *f = ctx->scratch + sum_floats;
    *j = (bnb_job){.n = sh->n,
                   .cb = cb,
                   .parts = parts,
                   .hw = (size_t)sh->hw,
                   .x = x,
                   .dy = dy,
                   .ymask = dy && sh->relu ? op->u.bn_bwd.y : NULL, /* dy: op is bn_bwd */
                   .y = y,
                   .relu = !dy && sh->relu,
                   .sums = (double *)ctx->scratch,
                   .shift = f,
                   .k0 = f + c,
                   .k1 = f + 2 * c,
                   .k2 = f + 3 * c,
                   .units = units_per_item((size_t)sh->hw * 16),
                   .avx512 = vec_avx512(ctx)};
    return MGT_OK;
}

/* bn_train's statistics and update as bn_train_item has them, per channel, from the sums. */
static mgt_status run_bn_train_blocked(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    const __typeof__(op->u.bn_train) *b = &op->u.bn_train;
    bnb_job j;
    mgt_status st = bnb_setup(ctx, op, &b->sh, b->x, NULL, b->y, &j);
    if (st != MGT_OK)
        return st;
    float *shift = (float *)j.shift;
    for (int ch = 0; ch < b->sh.c; ch++) /* each channel's first value, as bn_train_item */
        shift[ch] = b->x[mgt_layout_at(MGT_LAYOUT_NCHW16C, b->sh.c, b->sh.hw, 0, ch, 0)];
    POOL_FOR(ctx, j.cb * j.parts, bnb_sums_item, &j);
    size_t count = (size_t)b->sh.n * (size_t)b->sh.hw;
    for (int ch = 0; ch < b->sh.c; ch++) {
        double s1, s2;
        bnb_total(&j, ch, &s1, &s2);
        double mean = shift[ch] + s1 / (double)count;
        double ss = s2 - s1 * s1 / (double)count;
        if (ss < 0)
            ss = 0;
        double invstd = 1.0 / sqrt(ss / (double)count + (double)b->sh.eps);
        b->save_mean[ch] = (float)mean;
        b->save_invstd[ch] = (float)invstd;
        double m = b->sh.momentum, unbiased = ss / (double)(count - 1);
        b->running_mean[ch] = (float)((1.0 - m) * b->running_mean[ch] + m * mean);
        b->running_var[ch] = (float)((1.0 - m) * b->running_var[ch] + m * unbiased);
        j.k0[ch] = (float)mean;
        j.k1[ch] = b->gamma[ch] * (float)invstd;
        j.k2[ch] = b->beta[ch];
    }
    POOL_FOR(ctx, items_of((size_t)j.n * j.cb, j.units), bnb_affine_item, &j);
    return MGT_OK;
}

static mgt_status run_bn_eval_blocked(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    const __typeof__(op->u.bn_eval) *b = &op->u.bn_eval;
    bnb_job j;
    mgt_status st = bnb_setup(ctx, op, &b->sh, b->x, NULL, b->y, &j);
    if (st != MGT_OK)
        return st;
    for (int ch = 0; ch < b->sh.c; ch++) { /* as bn_eval_item */
        j.k0[ch] = b->running_mean[ch];
        j.k1[ch] = b->gamma[ch] / sqrtf(b->running_var[ch] + b->sh.eps);
        j.k2[ch] = b->beta[ch];
    }
    POOL_FOR(ctx, items_of((size_t)j.n * j.cb, j.units), bnb_affine_item, &j);
    return MGT_OK;
}

static mgt_status run_bn_bwd_blocked(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    const __typeof__(op->u.bn_bwd) *b = &op->u.bn_bwd;
    bnb_job j;
    mgt_status st = bnb_setup(ctx, op, &b->sh, b->x, b->dy, b->dx, &j);
    if (st != MGT_OK)
        return st;
    /* the sums' shift is the mean; once they are taken, the same array holds dx's kx */
    float *kx = (float *)j.shift;
    memcpy(kx, b->save_mean, (size_t)b->sh.c * sizeof(float));
    POOL_FOR(ctx, j.cb * j.parts, bnb_sums_item, &j);
    double count = (double)b->sh.n * (double)b->sh.hw;
    for (int ch = 0; ch < b->sh.c; ch++) { /* as bn_bwd_item */
        double sdy, sdyx, invstd = b->save_invstd[ch];
        bnb_total(&j, ch, &sdy, &sdyx);
        double sdyxhat = sdyx * invstd;
        b->dgamma[ch] += (float)sdyxhat;
        b->dbeta[ch] += (float)sdy;
        j.k0[ch] = b->save_mean[ch];
        j.k1[ch] = b->gamma[ch] * (float)invstd;
        j.k2[ch] = (float)(sdy / count);
        kx[ch] = (float)(sdyxhat / count * invstd);
    }
    POOL_FOR(ctx, items_of((size_t)j.n * j.cb, j.units), bnb_dx_item, &j);
    return MGT_OK;
}

/* Global average pool of a blocked x: one plane of 16 channels per unit, each channel summed
   as sum_f sums an NCHW plane (eight double lanes by pixel offset, folded in hsum_d2x4's order,
   then the tail). */
static void avgpool_fwd_blocked_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *j = c;
    const __typeof__(j->op->u.avgpool_fwd) *a = &j->op->u.avgpool_fwd;
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
    const __typeof__(j->op->u.avgpool_bwd) *a = &j->op->u.avgpool_bwd;
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

/* ---- pooling, bias ---- */

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

static void avgpool_fwd_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *j = c;
    const __typeof__(j->op->u.avgpool_fwd) *a = &j->op->u.avgpool_fwd;
    size_t hw = (size_t)a->hw, lo, hi;
    item_range((size_t)a->n * a->c, j->units, i, &lo, &hi);
    for (size_t pl = lo; pl < hi; pl++)
        a->y[pl] = (float)(sum_f(a->x + pl * hw, hw) / (double)hw);
}

static void avgpool_bwd_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *j = c;
    const __typeof__(j->op->u.avgpool_bwd) *a = &j->op->u.avgpool_bwd;
    size_t hw = (size_t)a->hw, lo, hi;
    item_range((size_t)a->n * a->c, j->units, i, &lo, &hi);
    for (size_t pl = lo; pl < hi; pl++) {
        v_fill(a->dx + pl * hw, a->dy[pl] / (float)a->hw, hw);
    }
}

static void bias_fwd_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *j = c;
    const __typeof__(j->op->u.bias_fwd) *b = &j->op->u.bias_fwd;
    size_t cols = (size_t)b->cols, lo, hi;
    item_range((size_t)b->rows, j->units, i, &lo, &hi);
    for (size_t r = lo; r < hi; r++)
        v_add_to(b->y + r * cols, b->bias, cols);
}

#define BIAS_COLS 256

/* Columns in blocks, rows in order: the sum of each column does not depend on threads. */
static void bias_bwd_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *j = c;
    const __typeof__(j->op->u.bias_bwd) *b = &j->op->u.bias_bwd;
    size_t cols = (size_t)b->cols, lo, hi;
    item_range(cols, BIAS_COLS, i, &lo, &hi);
    double acc[BIAS_COLS] = {0};
    for (int r = 0; r < b->rows; r++) {
        const float *dy = b->dy + (size_t)r * cols;
        for (size_t e = lo; e < hi; e++)
            acc[e - lo] += dy[e];
    }
    for (size_t e = lo; e < hi; e++)
        b->dbias[e] += (float)acc[e - lo];
}

/* ---- channel bias, dropout ---- */

static void chbias_fwd_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *j = c;
    const __typeof__(j->op->u.chbias_fwd) *b = &j->op->u.chbias_fwd;
    size_t hw = (size_t)b->hw, lo, hi;
    item_range((size_t)b->n * b->c, j->units, i, &lo, &hi);
    for (size_t pl = lo; pl < hi; pl++) {
        float *y = b->y + pl * hw, v = b->bias[pl % (size_t)b->c];
        for (size_t e = 0; e < hw; e++)
            y[e] += v;
    }
}

/* One channel per item, images in order: the sum does not depend on threads. */
static void chbias_bwd_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *j = c;
    const __typeof__(j->op->u.chbias_bwd) *b = &j->op->u.chbias_bwd;
    size_t hw = (size_t)b->hw;
    double acc = 0.0;
    for (int im = 0; im < b->n; im++)
        acc += sum_f(b->dy + ((size_t)im * b->c + (size_t)i) * hw, hw);
    b->dbias[i] += (float)acc;
}

static void dropout_item(void *c, int i, int t)
{
    (void)t;
    const mgt_op *op = c;
    const __typeof__(op->u.dropout) *d = &op->u.dropout;
    size_t lo, hi;
    item_range((size_t)d->n * d->per_image, CHUNK, i, &lo, &hi);
    uint32_t thr = mgt_dropout_threshold(d->p), w[4];
    float scale = 1.0f / (1.0f - d->p);
    int im = (int)(lo / d->per_image);
    size_t j = lo % d->per_image;
    mgt_dropout_block(op, im, (uint32_t)(j / 4), w);
    for (size_t e = lo; e < hi; e++) {
        d->y[e] = (w[j % 4] >> 8) >= thr ? d->x[e] * scale : 0.0f;
        if (++j == d->per_image) {
            j = 0;
            im++;
        }
        if (j % 4 == 0 && e + 1 < hi)
            mgt_dropout_block(op, im, (uint32_t)(j / 4), w);
    }
}

/* Adaptive average pooling: planes in parallel, each in the reference's order. */
static void apool_fwd_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *jb = c;
    const __typeof__(jb->op->u.apool_fwd) *a = &jb->op->u.apool_fwd;
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
    const __typeof__(jb->op->u.apool_bwd) *a = &jb->op->u.apool_bwd;
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

/* Rows (of all images) in parallel, a memcpy each. */
static void scopy_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *jb = c;
    const __typeof__(jb->op->u.scopy) *a = &jb->op->u.scopy;
    size_t lo, hi;
    item_range((size_t)a->n * a->rows, jb->units, i, &lo, &hi);
    for (size_t q = lo; q < hi; q++) {
        size_t im = q / (size_t)a->rows, r = q % (size_t)a->rows;
        memcpy(a->y + im * a->y_stride + r * a->y_row, a->x + im * a->x_stride + r * a->x_row,
               a->count * sizeof(float));
    }
}

/* ---- activations, channel scaling ----
   The activation loops are compute-bound (exp and a division per element), unlike the
   streaming loops above, so they run on vectors of AW = 16 lanes in functions compiled twice:
   for AVX-512F, one zmm register per vector, and for the x86-64 baseline, where GCC splits
   each vector into four SSE operations. Every operation is per lane and the same IEEE
   operation in both, so both give the same bits; ctx->vec_baseline runs the baseline on a CPU
   with AVX-512F, so the tests can compare the two. */
#define AW 16
typedef float af __attribute__((vector_size(AW * sizeof(float))));
typedef int32_t ai __attribute__((vector_size(AW * sizeof(int32_t))));
typedef uint32_t au __attribute__((vector_size(AW * sizeof(uint32_t))));
#define ACT_INLINE __attribute__((always_inline)) static inline
/* GCC notes that a 64-byte vector passed without AVX-512 changes the ABI; these helpers are
   always inlined, so no such vector crosses a call. (Left off to the end of the file: GCC
   reports the note there, after the clones are made.) */
#pragma GCC diagnostic ignored "-Wpsabi"

ACT_INLINE af ald(const float *p)
{
    af v;
    memcpy(&v, p, sizeof v);
    return v;
}

ACT_INLINE void ast(float *p, af v) { memcpy(p, &v, sizeof v); }

ACT_INLINE af adup(float a)
{
    af v;
    for (int i = 0; i < AW; i++)
        v[i] = a;
    return v;
}

/* The first k < AW floats at p, zeros after them; and their store back. */
ACT_INLINE af ald_part(const float *p, size_t k)
{
    af v = adup(0.0f);
    memcpy(&v, p, k * sizeof(float));
    return v;
}

ACT_INLINE void ast_part(float *p, af v, size_t k) { memcpy(p, &v, k * sizeof(float)); }

/* a where m is set, b elsewhere (GCC's C has no ?: on vectors) */
ACT_INLINE af asel(ai m, af a, af b) { return (af)(((ai)a & m) | ((ai)b & ~m)); }

/* e^x per lane, in float: Cephes' expf (its range reduction by n = round(x log2 e) with ln 2
   split in two, and its degree-7 polynomial), within 2 ulp of libm's expf over the normal
   range. 2^n is applied as two exact powers of two, so results that overflow give +inf and
   the ones below FLT_MIN come out as denormals or 0, as expf's; x is clamped to [-104, 89]
   first, which changes no result (e^89 overflows, e^-104 rounds to 0), and a NaN stays NaN
   (both comparisons are false, and NaN times any power of two is NaN). The integer work is
   unsigned: a NaN lane's garbage exponent cannot overflow. */
ACT_INLINE af vexp(af x)
{
    x = asel(x > 89.0f, adup(89.0f), x);
    x = asel(x < -104.0f, adup(-104.0f), x);
    /* adding 1.5 * 2^23 rounds to an integer, which the low bits then hold */
    const float magic = 12582912.0f;
    af t = x * (float)M_LOG2E + magic;
    af n = t - magic;
    au ni = (au)t - (au)adup(magic);
    /* 0.693359375 has 9 significant bits, so n times it is exact */
    af r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    af p = adup(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    af e = (r * r) * p + r + 1.0f;
    au a = (au)((ai)ni >> 1), b = ni - a; /* n = a + b, each within a float's exponent */
    af sa = (af)((a + 127u) << 23), sb = (af)((b + 127u) << 23);
    return (e * sa) * sb;
}

/* Each activation AW lanes at a time, one pair per row of MGT_ACT_LIST: act_<name>(x) and
   act_<name>_bwd(dy, x) = dy * act'(x). Comparisons are selects, so a NaN passes through each
   as in the scalar form; GELU is libm's erff and expf per lane (as PyTorch's CPU kernels).
   Within a few ulp of the reference's double. */
ACT_INLINE af act_relu6(af x) { return asel(x < 0.0f, adup(0.0f), asel(x > 6.0f, adup(6.0f), x)); }

/* a select, not dy * 0|1 as the others: hardtanh_backward's arithmetic, and a denormal dy
   (common deep in backward) costs a microcode assist per multiply on x86 */
ACT_INLINE af act_relu6_bwd(af dy, af x) { return asel((x > 0.0f) & (x < 6.0f), dy, adup(0.0f)); }

ACT_INLINE af act_hardsigmoid(af x)
{
    return asel(x <= -3.0f, adup(0.0f), asel(x >= 3.0f, adup(1.0f), x / 6.0f + 0.5f));
}

ACT_INLINE af act_hardsigmoid_bwd(af dy, af x)
{
    return dy * asel((x > -3.0f) & (x < 3.0f), adup(1.0f / 6.0f), adup(0.0f));
}

ACT_INLINE af act_hardswish(af x)
{
    return asel(x <= -3.0f, adup(0.0f), asel(x >= 3.0f, x, x * (x + 3.0f) / 6.0f));
}

ACT_INLINE af act_hardswish_bwd(af dy, af x)
{
    return dy * asel(x < -3.0f, adup(0.0f), asel(x <= 3.0f, x / 3.0f + 0.5f, adup(1.0f)));
}

ACT_INLINE af act_silu(af x) { return x / (1.0f + vexp(-x)); }

ACT_INLINE af act_silu_bwd(af dy, af x)
{
    af sg = 1.0f / (1.0f + vexp(-x));
    return dy * (sg * (1.0f + x * (1.0f - sg)));
}

ACT_INLINE af act_sigmoid(af x) { return 1.0f / (1.0f + vexp(-x)); }

ACT_INLINE af act_sigmoid_bwd(af dy, af x)
{
    af sg = 1.0f / (1.0f + vexp(-x));
    return dy * (sg * (1.0f - sg));
}

ACT_INLINE af act_gelu(af x)
{
    af y;
    for (int i = 0; i < AW; i++)
        y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * (float)M_SQRT1_2));
    return y;
}

ACT_INLINE af act_gelu_bwd(af dy, af x)
{
    af g;
    for (int i = 0; i < AW; i++)
        g[i] = 0.5f * (1.0f + erff(x[i] * (float)M_SQRT1_2)) +
               x[i] * expf(-0.5f * x[i] * x[i]) * (float)(0.5 * M_2_SQRTPI * M_SQRT1_2);
    return dy * g;
}

/* y = f(x) and dx = f_bwd(dy, x) over [0, n), each case of the switches below its own
   inlined straight-line loop: the last partial vector goes through the same lanes, so every
   element's bits are the same function of its inputs wherever it sits. */
#define ACT_FWD_LOOP(f, y, x, n)                                       \
    do {                                                               \
        size_t j_ = 0;                                                 \
        for (; j_ + AW <= (n); j_ += AW)                               \
            ast((y) + j_, f(ald((x) + j_)));                           \
        if (j_ < (n))                                                  \
            ast_part((y) + j_, f(ald_part((x) + j_, (n)-j_)), (n)-j_); \
    } while (0)

#define ACT_BWD_LOOP(f, dx, dy, x, n)                                                       \
    do {                                                                                    \
        size_t j_ = 0;                                                                      \
        for (; j_ + AW <= (n); j_ += AW)                                                    \
            ast((dx) + j_, f(ald((dy) + j_), ald((x) + j_)));                               \
        if (j_ < (n))                                                                       \
            ast_part((dx) + j_, f(ald_part((dy) + j_, (n)-j_), ald_part((x) + j_, (n)-j_)), \
                     (n)-j_);                                                               \
    } while (0)

ACT_INLINE void act_fwd_span(mgt_act act, float *y, const float *x, size_t n)
{
    switch (act) {
#define ACT_FWD_CASE(KIND, name) \
    case MGT_ACT_##KIND: ACT_FWD_LOOP(act_##name, y, x, n); break;
        MGT_ACT_LIST(ACT_FWD_CASE)
#undef ACT_FWD_CASE
    case MGT_ACT_COUNT: break;
    }
}

ACT_INLINE void act_bwd_span(mgt_act act, float *dx, const float *dy, const float *x, size_t n)
{
    switch (act) {
#define ACT_BWD_CASE(KIND, name) \
    case MGT_ACT_##KIND: ACT_BWD_LOOP(act_##name##_bwd, dx, dy, x, n); break;
        MGT_ACT_LIST(ACT_BWD_CASE)
#undef ACT_BWD_CASE
    case MGT_ACT_COUNT: break;
    }
}

static void act_fwd_base(mgt_act act, float *y, const float *x, size_t n)
{
    act_fwd_span(act, y, x, n);
}

__attribute__((target("avx512f"))) static void act_fwd_avx512(mgt_act act, float *y, const float *x,
                                                              size_t n)
{
    act_fwd_span(act, y, x, n);
}

static void act_bwd_base(mgt_act act, float *dx, const float *dy, const float *x, size_t n)
{
    act_bwd_span(act, dx, dy, x, n);
}

__attribute__((target("avx512f"))) static void act_bwd_avx512(mgt_act act, float *dx,
                                                              const float *dy, const float *x,
                                                              size_t n)
{
    act_bwd_span(act, dx, dy, x, n);
}

/* An activation op and whether its items take the AVX-512F build of the loops. */
typedef struct act_job {
    const mgt_op *op;
    bool avx512;
} act_job;

static void act_fwd_item(void *c, int i, int t)
{
    (void)t;
    const act_job *jb = c;
    const __typeof__(jb->op->u.act_fwd) *a = &jb->op->u.act_fwd;
    size_t lo, hi;
    item_range(a->n, CHUNK, i, &lo, &hi);
    (jb->avx512 ? act_fwd_avx512 : act_fwd_base)(a->act, a->y + lo, a->x + lo, hi - lo);
}

static void act_bwd_item(void *c, int i, int t)
{
    (void)t;
    const act_job *jb = c;
    const __typeof__(jb->op->u.act_bwd) *a = &jb->op->u.act_bwd;
    size_t lo, hi;
    item_range(a->n, CHUNK, i, &lo, &hi);
    (jb->avx512 ? act_bwd_avx512 : act_bwd_base)(a->act, a->dx + lo, a->dy + lo, a->x + lo,
                                                 hi - lo);
}

/* One item per run of whole planes (image, channel). */
static void chscale_fwd_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *j = c;
    const __typeof__(j->op->u.chscale_fwd) *a = &j->op->u.chscale_fwd;
    size_t hw = (size_t)a->hw, lo, hi;
    item_range((size_t)a->n * a->c, j->units, i, &lo, &hi);
    for (size_t pl = lo; pl < hi; pl++) {
        float sc = a->scale[a->shared ? pl % (size_t)a->c : pl];
        const float *x = a->x + pl * hw;
        float *y = a->y + pl * hw;
        size_t e = 0;
        for (; e + VW <= hw; e += VW)
            vst(y + e, vld(x + e) * sc);
        for (; e < hw; e++)
            y[e] = x[e] * sc;
    }
}

/* Per plane: dx, and the plane's sum of dy * x in double (fixed order); with shared, the
   planes of one channel are summed over the images in order afterwards, so no result
   depends on threads. */
typedef struct chscale_job {
    const mgt_op *op;
    size_t units;
    double *sums; /* with shared: one sum per plane */
} chscale_job;

static void chscale_bwd_item(void *c, int i, int t)
{
    (void)t;
    const chscale_job *j = c;
    const __typeof__(j->op->u.chscale_bwd) *a = &j->op->u.chscale_bwd;
    size_t hw = (size_t)a->hw, lo, hi;
    item_range((size_t)a->n * a->c, j->units, i, &lo, &hi);
    double *sums = j->sums;
    for (size_t pl = lo; pl < hi; pl++) {
        float sc = a->scale[a->shared ? pl % (size_t)a->c : pl];
        const float *dy = a->dy + pl * hw, *x = a->x + pl * hw;
        float *dx = a->dx + pl * hw;
        if (a->dscale) {
            double s0 = 0.0, s1 = 0.0;
            size_t e = 0;
            for (; e + 2 <= hw; e += 2) {
                s0 += (double)dy[e] * x[e];
                s1 += (double)dy[e + 1] * x[e + 1];
            }
            for (; e < hw; e++)
                s0 += (double)dy[e] * x[e];
            if (a->shared)
                sums[pl] = s0 + s1;
            else
                a->dscale[pl] = (float)(s0 + s1);
        }
        size_t e = 0;
        for (; e + VW <= hw; e += VW)
            vst(dx + e, vld(dy + e) * sc);
        for (; e < hw; e++)
            dx[e] = dy[e] * sc;
    }
}

/* LayerNorm over channels: one item per image, channels outer and pixels inner so every pass
   streams the planes; per-pixel statistics and sums in double in scratch of the job; the
   parameter gradients' per-image partial sums are added in image order afterwards, so no
   result depends on threads. */
typedef struct lnc_job {
    const mgt_op *op;
    double *scratch; /* per image: 4 * hw pixel values, then 2 * c channel partial sums */
} lnc_job;

static size_t lnc_scratch_per_image(int c, int hw) { return 4 * (size_t)hw + 2 * (size_t)c; }

/* mean and rstd of each pixel of one image x [c, hw] */
static void lnc_stats(const float *x, int c, size_t hw, float eps, double *mean, double *rstd)
{
    for (size_t j = 0; j < hw; j++)
        mean[j] = rstd[j] = 0.0;
    for (int ch = 0; ch < c; ch++) {
        const float *xp = x + (size_t)ch * hw;
        for (size_t j = 0; j < hw; j++)
            mean[j] += xp[j];
    }
    for (size_t j = 0; j < hw; j++)
        mean[j] /= c;
    for (int ch = 0; ch < c; ch++) {
        const float *xp = x + (size_t)ch * hw;
        for (size_t j = 0; j < hw; j++) {
            double d = xp[j] - mean[j];
            rstd[j] += d * d;
        }
    }
    for (size_t j = 0; j < hw; j++)
        rstd[j] = 1.0 / sqrt(rstd[j] / c + (double)eps);
}

static void lnc_fwd_item(void *v, int i, int t)
{
    (void)t;
    const lnc_job *j = v;
    const __typeof__(j->op->u.lnc_fwd) *a = &j->op->u.lnc_fwd;
    size_t hw = (size_t)a->hw, off = (size_t)i * a->c * hw;
    double *mean = j->scratch + (size_t)i * lnc_scratch_per_image(a->c, a->hw), *rstd = mean + hw;
    lnc_stats(a->x + off, a->c, hw, a->eps, mean, rstd);
    for (int ch = 0; ch < a->c; ch++) {
        const float *xp = a->x + off + (size_t)ch * hw;
        float *yp = a->y + off + (size_t)ch * hw;
        double w = a->weight[ch], b = a->bias[ch];
        for (size_t e = 0; e < hw; e++)
            yp[e] = (float)((xp[e] - mean[e]) * rstd[e] * w + b);
    }
}

static void lnc_bwd_item(void *v, int i, int t)
{
    (void)t;
    const lnc_job *j = v;
    const __typeof__(j->op->u.lnc_bwd) *a = &j->op->u.lnc_bwd;
    size_t hw = (size_t)a->hw, off = (size_t)i * a->c * hw;
    double *mean = j->scratch + (size_t)i * lnc_scratch_per_image(a->c, a->hw), *rstd = mean + hw;
    double *mg = rstd + hw, *mgx = mg + hw, *sw = mgx + hw, *sb = sw + a->c;
    lnc_stats(a->x + off, a->c, hw, a->eps, mean, rstd);
    for (size_t e = 0; e < hw; e++)
        mg[e] = mgx[e] = 0.0;
    for (int ch = 0; ch < a->c; ch++) {
        const float *xp = a->x + off + (size_t)ch * hw, *dyp = a->dy + off + (size_t)ch * hw;
        double w = a->weight[ch], s0 = 0.0, s1 = 0.0;
        for (size_t e = 0; e < hw; e++) {
            double xh = (xp[e] - mean[e]) * rstd[e], g = (double)dyp[e] * w;
            mg[e] += g;
            mgx[e] += g * xh;
            s0 += (double)dyp[e] * xh;
            s1 += dyp[e];
        }
        sw[ch] = s0;
        sb[ch] = s1;
    }
    for (int ch = 0; ch < a->c; ch++) {
        const float *xp = a->x + off + (size_t)ch * hw, *dyp = a->dy + off + (size_t)ch * hw;
        float *dxp = a->dx + off + (size_t)ch * hw;
        double w = a->weight[ch];
        for (size_t e = 0; e < hw; e++) {
            double xh = (xp[e] - mean[e]) * rstd[e];
            dxp[e] = (float)(rstd[e] * ((double)dyp[e] * w - mg[e] / a->c - xh * mgx[e] / a->c));
        }
    }
}

/* ---- softmax cross-entropy, top-k ---- */

static mgt_status check_labels(const mgt_op *op, const int32_t *labels, int n, int classes)
{
    for (int r = 0; r < n; r++)
        if (labels[r] < 0 || labels[r] >= classes)
            return mgt_error_set(MGT_ERR_DEVICE, "%s: label %d out of range [0, %d) at row %d",
                                 mgt_op_name(op->kind), (int)labels[r], classes, r);
    return MGT_OK;
}

typedef struct xent_job {
    const mgt_op *op;
    size_t units;
    double *row_loss;
} xent_job;

/* Per row in double: loss = lse - sum_j target_j * logit_j, target = (1-eps) (w onehot(a) +
   (1-w) onehot(b)) + eps/classes, that is lse - (1-eps)(w z_a + (1-w) z_b) - eps/classes sum z
   (w = 1, b = a without weights: w z_a + 0 z_a is z_a exactly); probs = exp(logit - lse). */
static void xent_fwd_item(void *c, int i, int t)
{
    (void)t;
    const xent_job *j = c;
    const __typeof__(j->op->u.xent_fwd) *x = &j->op->u.xent_fwd;
    size_t classes = (size_t)x->classes, lo, hi;
    item_range((size_t)x->n, j->units, i, &lo, &hi);
    double eps = x->smoothing;
    for (size_t r = lo; r < hi; r++) {
        const float *l = x->logits + r * classes;
        float *pr = x->probs + r * classes;
        float mx = l[0];
        for (size_t e = 1; e < classes; e++)
            if (l[e] > mx)
                mx = l[e];
        double se = 0, sl = 0;
        for (size_t e = 0; e < classes; e++) {
            se += exp((double)l[e] - mx);
            sl += l[e];
        }
        double lse = mx + log(se), w = x->weights ? x->weights[r] : 1.0;
        for (size_t e = 0; e < classes; e++)
            pr[e] = (float)exp((double)l[e] - lse);
        int32_t a = x->labels[r], b = x->labels_b ? x->labels_b[r] : a;
        double mixed = w * l[a] + (1.0 - w) * l[b];
        j->row_loss[r] = lse - (1.0 - eps) * mixed - eps / (double)classes * sl;
    }
}

static mgt_status check_targets(const mgt_op *op, const int32_t *labels, const int32_t *labels_b,
                                int n, int classes)
{
    mgt_status st = check_labels(op, labels, n, classes);
    return st == MGT_OK && labels_b ? check_labels(op, labels_b, n, classes) : st;
}

mgt_status cpu_xent_fwd(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    const __typeof__(op->u.xent_fwd) *x = &op->u.xent_fwd;
    mgt_status st = check_targets(op, x->labels, x->labels_b, x->n, x->classes);
    if (st != MGT_OK)
        return st;
    if ((st = scratch_ensure(ctx, op, (size_t)x->n * 2)) != MGT_OK)
        return st;
    xent_job j = {op, units_per_item((size_t)x->classes * 4), (double *)(void *)ctx->scratch};
    mgt_cpu_pool_for(ctx->pool, items_of((size_t)x->n, j.units), xent_fwd_item, &j);
    double s = 0;
    for (int r = 0; r < x->n; r++)
        s += j.row_loss[r];
    x->loss[0] = (float)(s / x->n);
    return MGT_OK;
}

static void xent_bwd_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *j = c;
    const __typeof__(j->op->u.xent_bwd) *x = &j->op->u.xent_bwd;
    size_t classes = (size_t)x->classes, lo, hi;
    item_range((size_t)x->n, j->units, i, &lo, &hi);
    float off = x->smoothing / (float)x->classes, keep = 1.0f - x->smoothing;
    for (size_t r = lo; r < hi; r++) {
        const float *p = x->probs + r * classes;
        float *d = x->dlogits + r * classes;
        for (size_t e = 0; e < classes; e++)
            d[e] = x->scale * (p[e] - off);
        size_t a = (size_t)x->labels[r], b = x->labels_b ? (size_t)x->labels_b[r] : a;
        float w = x->weights ? x->weights[r] : 1.0f;
        /* a == b: the whole weight on one class */
        float ta = off + keep * (a == b ? 1.0f : w), tb = off + keep * (1.0f - w);
        d[a] = x->scale * (p[a] - ta);
        if (b != a)
            d[b] = x->scale * (p[b] - tb);
    }
}

mgt_status cpu_xent_bwd(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    const __typeof__(op->u.xent_bwd) *x = &op->u.xent_bwd;
    mgt_status st = check_targets(op, x->labels, x->labels_b, x->n, x->classes);
    if (st != MGT_OK)
        return st;
    plane_job j = {op, units_per_item((size_t)x->classes)};
    mgt_cpu_pool_for(ctx->pool, items_of((size_t)x->n, j.units), xent_bwd_item, &j);
    return MGT_OK;
}

typedef struct topk_job {
    const mgt_op *op;
    size_t units;
    atomic_int hits; /* an integer sum: the same whatever order threads add in */
} topk_job;

static void topk_item(void *c, int i, int t)
{
    (void)t;
    topk_job *j = c;
    const __typeof__(j->op->u.topk) *k = &j->op->u.topk;
    size_t classes = (size_t)k->classes, lo, hi;
    item_range((size_t)k->n, j->units, i, &lo, &hi);
    int hits = 0;
    for (size_t r = lo; r < hi; r++) {
        const float *l = k->logits + r * classes;
        size_t lab = (size_t)k->labels[r];
        float v = l[lab];
        int rank = 0;
        for (size_t e = 0; e < classes; e++)
            rank += l[e] > v || (l[e] == v && e < lab);
        hits += rank < k->k;
    }
    atomic_fetch_add(&j->hits, hits);
}

/* ---- dispatch ---- */

/* The items read the op only. */

mgt_status cpu_fill(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    POOL_FOR(ctx, items_of(op->u.fill.n, CHUNK), fill_item, op);
    return MGT_OK;
}

mgt_status cpu_scale(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    POOL_FOR(ctx, items_of(op->u.scale.n, CHUNK), scale_item, op);
    return MGT_OK;
}

mgt_status cpu_axpy(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    POOL_FOR(ctx, items_of(op->u.axpy.n, CHUNK), axpy_item, op);
    return MGT_OK;
}

mgt_status cpu_add(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    POOL_FOR(ctx, items_of(op->u.add.n, CHUNK), add_item, op);
    return MGT_OK;
}

mgt_status cpu_relu_fwd(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    POOL_FOR(ctx, items_of(op->u.relu_fwd.n, CHUNK), relu_fwd_item, op);
    return MGT_OK;
}

mgt_status cpu_relu_bwd(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    POOL_FOR(ctx, items_of(op->u.relu_bwd.n, CHUNK), relu_bwd_item, op);
    return MGT_OK;
}

mgt_status cpu_adamw(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    POOL_FOR(ctx, items_of(op->u.adamw.n, CHUNK), adamw_item, op);
    return MGT_OK;
}

mgt_status cpu_rmsprop(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    POOL_FOR(ctx, items_of(op->u.rmsprop.n, CHUNK), rmsprop_item, op);
    return MGT_OK;
}

mgt_status cpu_sgd(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    POOL_FOR(ctx, items_of(op->u.sgd.n, CHUNK), sgd_item, op);
    return MGT_OK;
}

/* Whether a convolution reads or writes a blocked activation: only oneDNN's kernels do. */
static bool conv_blocked(const mgt_op *op)
{
    return op->u.conv.sh.x_layout != MGT_LAYOUT_NCHW || op->u.conv.sh.y_layout != MGT_LAYOUT_NCHW;
}

/* oneDNN where it has a kernel for the shape (and conv=im2col does not ask otherwise, which a
   blocked activation overrules), the im2col path for the rest. */
mgt_status cpu_conv2d(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    mgt_status st;
    if (op->prec != MGT_PREC_F32)
        return run_lowp(ctx, op, cpu_conv2d);
    if ((!ctx->conv_im2col || conv_blocked(op)) &&
        (st = run_conv_onednn(ctx, op)) != MGT_ERR_UNSUPPORTED)
        return st;
    if (conv_blocked(op))
        return mgt_error_set(MGT_ERR_UNSUPPORTED,
                             "%s: oneDNN has no kernel for this shape, and only its kernels "
                             "take nChw16c activations",
                             mgt_op_name(op->kind));
    return op->kind == MGT_OP_CONV2D_FWD        ? run_conv_fwd(ctx, op)
           : op->kind == MGT_OP_CONV2D_BWD_DATA ? run_conv_bwd_data(ctx, op)
                                                : run_conv_bwd_filter(ctx, op);
}

mgt_status cpu_bn_train(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    if (op->u.bn_train.sh.layout == MGT_LAYOUT_NCHW16C)
        return run_bn_train_blocked(ctx, op);
    POOL_FOR(ctx, op->u.bn_train.sh.c, bn_train_item, op);
    return MGT_OK;
}

mgt_status cpu_bn_eval(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    if (op->u.bn_eval.sh.layout == MGT_LAYOUT_NCHW16C)
        return run_bn_eval_blocked(ctx, op);
    plane_job j = {op, units_per_item((size_t)op->u.bn_eval.sh.hw)};
    POOL_FOR(ctx, items_of((size_t)op->u.bn_eval.sh.n * op->u.bn_eval.sh.c, j.units), bn_eval_item,
             &j);
    return MGT_OK;
}

mgt_status cpu_bn_bwd(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    if (op->u.bn_bwd.sh.layout == MGT_LAYOUT_NCHW16C)
        return run_bn_bwd_blocked(ctx, op);
    POOL_FOR(ctx, op->u.bn_bwd.sh.c, bn_bwd_item, op);
    return MGT_OK;
}

mgt_status cpu_bn_stats(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    POOL_FOR(ctx, op->u.bn_stats.sh.c, bn_stats_item, op);
    return MGT_OK;
}

mgt_status cpu_bn_bwd_elemt(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    POOL_FOR(ctx, op->u.bn_bwd_elemt.sh.c, bn_bwd_elemt_item, op);
    return MGT_OK;
}

static mgt_status run_maxpool(mgt_cpu_ctx *ctx, const mgt_op *op, const mgt_pool2d_shape *sh,
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

mgt_status cpu_maxpool_fwd(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    return run_maxpool(ctx, op, &op->u.maxpool_fwd.sh, maxpool_fwd_item, maxpool_fwd_blocked_item);
}

mgt_status cpu_maxpool_bwd(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    return run_maxpool(ctx, op, &op->u.maxpool_bwd.sh, maxpool_bwd_item, maxpool_bwd_blocked_item);
}

mgt_status cpu_avgpool_fwd(mgt_cpu_ctx *ctx, const mgt_op *op)
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

mgt_status cpu_avgpool_bwd(mgt_cpu_ctx *ctx, const mgt_op *op)
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

mgt_status cpu_bias_fwd(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    plane_job j = {op, units_per_item((size_t)op->u.bias_fwd.cols)};
    POOL_FOR(ctx, items_of((size_t)op->u.bias_fwd.rows, j.units), bias_fwd_item, &j);
    return MGT_OK;
}

mgt_status cpu_bias_bwd(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    plane_job j = {op, BIAS_COLS};
    POOL_FOR(ctx, items_of((size_t)op->u.bias_bwd.cols, BIAS_COLS), bias_bwd_item, &j);
    return MGT_OK;
}

mgt_status cpu_chbias_fwd(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    plane_job j = {op, units_per_item((size_t)op->u.chbias_fwd.hw)};
    POOL_FOR(ctx, items_of((size_t)op->u.chbias_fwd.n * op->u.chbias_fwd.c, j.units),
             chbias_fwd_item, &j);
    return MGT_OK;
}

mgt_status cpu_chbias_bwd(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    plane_job j = {op, 1};
    POOL_FOR(ctx, op->u.chbias_bwd.c, chbias_bwd_item, &j);
    return MGT_OK;
}

mgt_status cpu_dropout(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    POOL_FOR(ctx, items_of((size_t)op->u.dropout.n * op->u.dropout.per_image, CHUNK), dropout_item,
             op);
    return MGT_OK;
}

mgt_status cpu_apool_fwd(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    const __typeof__(op->u.apool_fwd) *a = &op->u.apool_fwd;
    plane_job j = {op, units_per_item((size_t)a->h * a->w)};
    POOL_FOR(ctx, items_of((size_t)a->n * a->c, j.units), apool_fwd_item, &j);
    return MGT_OK;
}

mgt_status cpu_apool_bwd(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    const __typeof__(op->u.apool_bwd) *a = &op->u.apool_bwd;
    plane_job j = {op, units_per_item((size_t)a->h * a->w)};
    POOL_FOR(ctx, items_of((size_t)a->n * a->c, j.units), apool_bwd_item, &j);
    return MGT_OK;
}

mgt_status cpu_scopy(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    const __typeof__(op->u.scopy) *a = &op->u.scopy;
    plane_job j = {op, units_per_item(a->count)};
    POOL_FOR(ctx, items_of((size_t)a->n * a->rows, j.units), scopy_item, &j);
    return MGT_OK;
}

mgt_status cpu_topk(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    const __typeof__(op->u.topk) *k = &op->u.topk;
    mgt_status st = check_labels(op, k->labels, k->n, k->classes);
    if (st != MGT_OK)
        return st;
    topk_job j = {.op = op, .units = units_per_item((size_t)k->classes)};
    atomic_init(&j.hits, 0);
    POOL_FOR(ctx, items_of((size_t)k->n, j.units), topk_item, &j);
    k->count[0] += atomic_load(&j.hits);
    return MGT_OK;
}

/* ---- mixed precision ----
   A low-precision op rounds its inputs into ctx->lowp and runs its fp32 kind on the copies:
   the products of 16-bit values are exact in fp32, so this is the op's arithmetic exactly
   (the sums in fp32, as oneDNN's and cuDNN's 16-bit kernels keep them). It costs one pass
   over the inputs, a few percent of a convolution. */

typedef struct round_job {
    mgt_precision prec;
    const float *src;
    float *dst;
    size_t n;
} round_job;

static void round_item(void *c, int i, int t)
{
    (void)t;
    const round_job *j = c;
    size_t lo, hi;
    item_range(j->n, CHUNK, i, &lo, &hi);
    if (j->prec == MGT_PREC_BF16)
        for (size_t k = lo; k < hi; k++)
            j->dst[k] = mgt_lowp_round_bf16(j->src[k]);
    else
        for (size_t k = lo; k < hi; k++)
            j->dst[k] = mgt_lowp_round_fp16(j->src[k]);
}

static mgt_status run_conv_onednn(mgt_cpu_ctx *ctx, const mgt_op *op);

static mgt_cpu_lp_key lp_key(const mgt_op *op)
{
    mgt_cpu_lp_key k;
    memset(&k, 0, sizeof k); /* compared with memcmp: no stray padding bytes */
    k.kind = op->kind;
    k.prec = op->prec;
    k.sh = op->u.conv.sh;
    k.sh.n = 0;
    return k;
}

static bool lp_remembered(const mgt_cpu_ctx *ctx, const mgt_cpu_lp_key *k)
{
    for (int i = 0; i < ctx->n_lp_refused; i++)
        if (memcmp(&ctx->lp_refused[i], k, sizeof *k) == 0)
            return true;
    return false;
}

/* A shape the native 16-bit path refused for good; without room to remember it, the next
   call merely asks again. */
static void lp_remember(mgt_cpu_ctx *ctx, const mgt_cpu_lp_key *k)
{
    if (ctx->n_lp_refused == ctx->cap_lp_refused) {
        int cap = ctx->cap_lp_refused ? 2 * ctx->cap_lp_refused : 16;
        mgt_cpu_lp_key *a = realloc(ctx->lp_refused, (size_t)cap * sizeof *a);
        if (!a)
            return;
        ctx->lp_refused = a;
        ctx->cap_lp_refused = cap;
    }
    ctx->lp_refused[ctx->n_lp_refused++] = *k;
}

/* A 16-bit convolution's native attempt: bf16 on oneDNN where it has a bf16 kernel for the
   shape (AVX512-BF16 or AMX: its reorders round the inputs, its kernels sum in fp32), after
   the owner's fault hook. *ran says whether it ran (with st its result); otherwise the
   refusal has been decided as every backend decides it (refusal.h): MGT_OK for the
   emulation, or the failure. */
static mgt_status lp_native(mgt_cpu_ctx *ctx, const mgt_op *op, bool *ran)
{
    *ran = false;
    mgt_cpu_lp_key key = lp_key(op);
    if (lp_remembered(ctx, &key))
        return MGT_OK;
    mgt_lp_refusal why = ctx->lp_refusal ? ctx->lp_refusal(ctx->owner) : MGT_LP_REFUSAL_NONE;
    if (why == MGT_LP_REFUSAL_NONE) {
        if (op->prec == MGT_PREC_BF16 && (!ctx->conv_im2col || conv_blocked(op)) &&
            op->u.conv.sh.groups == 1) {
            mgt_status st = run_conv_onednn(ctx, op);
            if (st != MGT_ERR_UNSUPPORTED) {
                *ran = true;
                return st;
            }
        }
        why = MGT_LP_REFUSAL_NO_KERNEL;
    }
    switch (mgt_lp_refusal_action(why)) {
    case MGT_LP_FP32_REMEMBER: lp_remember(ctx, &key); return MGT_OK;
    case MGT_LP_FP32_ONCE: return MGT_OK;
    case MGT_LP_FAIL: break;
    }
    return mgt_error_set(MGT_ERR_DEVICE, "%s: the 16-bit kernel refused the op (%s)",
                         mgt_op_name(op->kind), mgt_lp_refusal_name(why));
}

/* A gemm or convolution in bf16 or fp16: a convolution's native attempt first, else the fp32
   kernel on inputs rounded to the format. */
static mgt_status run_lowp(mgt_cpu_ctx *ctx, const mgt_op *op, cpu_op_fn fp32)
{
    if (op->kind != MGT_OP_GEMM) {
        bool ran;
        mgt_status st = lp_native(ctx, op, &ran);
        if (ran || st != MGT_OK)
            return st;
    }
    mgt_op f = *op;
    f.prec = MGT_PREC_F32;
    mgt_precision prec = op->prec;
    mgt_operand ops[MGT_OP_MAX_OPERANDS];
    int n = mgt_op_operands(&f, ops);
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (ops[i].role == MGT_OPERAND_IN)
            total += align_up(ops[i].count);
    mgt_status st = buf_ensure(ctx, op, &ctx->lowp, &ctx->lowp_bytes, total);
    if (st != MGT_OK)
        return st;
    float *at = ctx->lowp;
    for (int i = 0; i < n; i++) {
        if (ops[i].role != MGT_OPERAND_IN)
            continue;
        round_job j = {prec, *ops[i].ptr, at, ops[i].count};
        POOL_FOR(ctx, items_of(j.n, CHUNK), round_item, &j);
        *ops[i].ptr = at;
        at += align_up(ops[i].count);
    }
    return fp32(ctx, &f);
}

static void cast_item(void *c, int i, int t)
{
    (void)t;
    const mgt_op *op = c;
    const __typeof__(op->u.cast) *k = &op->u.cast;
    size_t lo, hi;
    item_range(k->n, CHUNK, i, &lo, &hi);
    if (op->kind == MGT_OP_CAST_TO_16)
        for (size_t e = lo; e < hi; e++)
            ((uint16_t *)k->dst)[e] = mgt_lowp_encode(op->prec, ((const float *)k->src)[e]);
    else
        for (size_t e = lo; e < hi; e++)
            ((float *)k->dst)[e] = mgt_lowp_decode(op->prec, ((const uint16_t *)k->src)[e]);
}

mgt_status cpu_cast(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    POOL_FOR(ctx, items_of(op->u.cast.n, CHUNK), cast_item, op);
    return MGT_OK;
}

typedef struct nonfinite_job {
    const mgt_op *op;
    atomic_int count;
} nonfinite_job;

static void nonfinite_item(void *c, int i, int t)
{
    (void)t;
    nonfinite_job *j = c;
    const float *x = j->op->u.nonfinite.x;
    size_t lo, hi;
    item_range(j->op->u.nonfinite.n, CHUNK, i, &lo, &hi);
    int bad = 0;
    for (size_t k = lo; k < hi; k++) /* exponent all ones: inf or NaN */
        bad += (~mgt_lowp_bits(x[k]) & 0x7f800000u) == 0;
    if (bad)
        atomic_fetch_add(&j->count, bad);
}

mgt_status cpu_nonfinite(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    nonfinite_job j = {.op = op};
    atomic_init(&j.count, 0);
    POOL_FOR(ctx, items_of(op->u.nonfinite.n, CHUNK), nonfinite_item, &j);
    op->u.nonfinite.count[0] = atomic_load(&j.count);
    return MGT_OK;
}

mgt_status cpu_act_fwd(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    act_job jb = {op, vec_avx512(ctx)};
    POOL_FOR(ctx, items_of(op->u.act_fwd.n, CHUNK), act_fwd_item, &jb);
    return MGT_OK;
}

mgt_status cpu_act_bwd(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    act_job jb = {op, vec_avx512(ctx)};
    POOL_FOR(ctx, items_of(op->u.act_bwd.n, CHUNK), act_bwd_item, &jb);
    return MGT_OK;
}

static mgt_status run_lnc(mgt_cpu_ctx *ctx, const mgt_op *op, int n, int c, int hw)
{
    lnc_job j = {op, malloc((size_t)n * lnc_scratch_per_image(c, hw) * sizeof(double))};
    if (!j.scratch)
        return mgt_error_set(MGT_ERR_OOM, "%s: out of host memory", mgt_op_name(op->kind));
    POOL_FOR(ctx, n, op->kind == MGT_OP_LNC_FWD ? lnc_fwd_item : lnc_bwd_item, &j);
    if (op->kind == MGT_OP_LNC_BWD) {
        const __typeof__(op->u.lnc_bwd) *a = &op->u.lnc_bwd;
        for (int ch = 0; ch < c; ch++) {
            double sw = 0.0, sb = 0.0;
            for (int i = 0; i < n; i++) {
                const double *p =
                    j.scratch + (size_t)i * lnc_scratch_per_image(c, hw) + 4 * (size_t)hw;
                sw += p[ch];
                sb += p[c + ch];
            }
            a->dweight[ch] += (float)sw;
            a->dbias[ch] += (float)sb;
        }
    }
    free(j.scratch);
    return MGT_OK;
}

mgt_status cpu_lnc_fwd(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    return run_lnc(ctx, op, op->u.lnc_fwd.n, op->u.lnc_fwd.c, op->u.lnc_fwd.hw);
}

mgt_status cpu_lnc_bwd(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    return run_lnc(ctx, op, op->u.lnc_bwd.n, op->u.lnc_bwd.c, op->u.lnc_bwd.hw);
}

mgt_status cpu_chscale_fwd(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    const __typeof__(op->u.chscale_fwd) *a = &op->u.chscale_fwd;
    plane_job j = {op, units_per_item((size_t)a->hw)};
    POOL_FOR(ctx, items_of((size_t)a->n * a->c, j.units), chscale_fwd_item, &j);
    return MGT_OK;
}

/* The shared form's per-plane sums take n * c doubles of host memory per call: a parameter's
   layer scale has few channels and the call is not in a hot loop of its own. */
mgt_status cpu_chscale_bwd(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    const __typeof__(op->u.chscale_bwd) *a = &op->u.chscale_bwd;
    size_t planes = (size_t)a->n * a->c;
    chscale_job j = {op, units_per_item((size_t)a->hw), NULL};
    if (a->dscale && a->shared) {
        j.sums = malloc(planes * sizeof *j.sums);
        if (!j.sums)
            return mgt_error_set(MGT_ERR_OOM, "channel_scale_backward: out of host memory");
    }
    POOL_FOR(ctx, items_of(planes, j.units), chscale_bwd_item, &j);
    if (j.sums) {
        for (int ch = 0; ch < a->c; ch++) {
            double s = 0.0;
            for (int i = 0; i < a->n; i++)
                s += j.sums[(size_t)i * a->c + ch];
            a->dscale[ch] = (float)(a->dscale[ch] + s);
        }
        free(j.sums);
    }
    return MGT_OK;
}

/* One function per row of the op list, cpu_<stem>. */
#define CPU_OP(KIND, name, args, stem) [MGT_OP_##KIND] = cpu_##stem,
static const cpu_op_fn cpu_ops[MGT_OP_COUNT] = {MGT_OP_LIST(CPU_OP)};
#undef CPU_OP

bool mgt_cpu_supports(mgt_op_kind kind)
{
    return (unsigned)kind < MGT_OP_COUNT && cpu_ops[kind] != NULL;
}

mgt_status mgt_cpu_run(mgt_cpu_ctx *ctx, const mgt_op *op)
{
    if (!mgt_cpu_supports(op->kind))
        return mgt_error_set(MGT_ERR_UNSUPPORTED, "cpu kernels: %s is not supported",
                             mgt_op_name(op->kind));
    pthread_mutex_lock(&ctx->lock);
    mgt_status st = cpu_ops[op->kind](ctx, op);
    pthread_mutex_unlock(&ctx->lock);
    return st;
}
