/* The CPU kernels of gemm and the three convolution passes: oneDNN's sgemm and direct
   convolutions where it has them, im2col + gemm and direct depthwise loops elsewhere. */
#include "device/cpu/lane16.h"
#include "device/cpu/onednn.h"

/* Below this many multiply-adds a gemm runs as one call: splitting costs more than it saves. */
#define GEMM_SPLIT_MACS (1 << 20)
/* Bytes of one thread's im2col tile. Larger tiles give the gemm wider panels; smaller ones
   keep scratch (threads x tile) modest for the 224x224 layers. */
#define COL_TILE_BYTES (2u << 20)
/* Narrowest im2col tile, in output pixels: narrower panels waste the gemm micro-kernel. */
#define COL_TILE_MIN 32

static void sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda,
                  const float *b, int ldb, float beta, float *c, int ldc)
{
    onednn_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
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
    const mgt_gemm_args *g = &j->op->u.gemm;
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

/* Blocks of C's rows (or columns, when C is wide and short), each one sgemm call: one block per
   thread. Each block repacks the shared operand, O(k*n) of memory traffic against
   O(m*n*k/blocks) of work; two blocks per thread (so that a thread the OS delays would hold up
   less) measured 4 to 7% slower over the linear layers of swin_t and vit_b_16 (b8 224,
   2 threads, AMD EPYC Zen 3, 5 alternating runs, 2026-12-07), even on that busy machine. */
mgt_status cpu_gemm(cpu_ctx *ctx, const mgt_op *op)
{
    if (op->prec != MGT_PREC_F32)
        return cpu_lowp(ctx, op, cpu_gemm);
    const mgt_gemm_args *g = &op->u.gemm;
    int threads = pool_threads(ctx);
    double macs = (double)g->m * g->n * g->k;
    if (threads == 1 || macs < GEMM_SPLIT_MACS || (g->m < 16 && g->n < 16)) {
        sgemm(g->trans_a, g->trans_b, g->m, g->n, g->k, g->alpha, g->a, g->lda, g->b, g->ldb,
              g->beta, g->c, g->ldc);
        return MGT_OK;
    }
    gemm_job j = {op, g->m >= g->n, 0};
    size_t dim = (size_t)(j.by_rows ? g->m : g->n);
    size_t per = ceil_div(dim, (size_t)threads);
    per = (per + 7) / 8 * 8; /* whole micro-kernel panels */
    j.per = (int)per;
    cpu_pool_for(ctx->pool, items_of(dim, per), gemm_item, &j);
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

static mgt_status run_conv_fwd(cpu_ctx *ctx, const mgt_op *op)
{
    int threads = pool_threads(ctx);
    conv_job j = {.op = op, .g = conv_geom_of(&op->u.conv.sh)};
    const conv_geom *g = &j.g;
    mgt_status st;
    if (g->depthwise) {
        j.units = units_per_item(g->pq * g->rs);
        j.per_thread = align_up(g->pq);
        if ((st = cpu_scratch_ensure(ctx, op, j.per_thread * (size_t)threads)) != MGT_OK)
            return st;
        j.scratch = ctx->scratch;
        cpu_pool_for(ctx->pool, items_of((size_t)g->n * g->c, j.units), dw_fwd_item, &j);
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
        if ((st = cpu_scratch_ensure(ctx, op, j.per_thread * (size_t)threads)) != MGT_OK)
            return st;
        j.scratch = ctx->scratch;
    }
    cpu_pool_for(ctx->pool, (int)(outer * (size_t)j.tiles), conv_fwd_item, &j);
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

static mgt_status run_conv_bwd_data(cpu_ctx *ctx, const mgt_op *op)
{
    int threads = pool_threads(ctx);
    conv_job j = {.op = op, .g = conv_geom_of(&op->u.conv.sh)};
    const conv_geom *g = &j.g;
    if (g->depthwise) {
        j.units = units_per_item(g->pq * g->rs);
        cpu_pool_for(ctx->pool, items_of((size_t)g->n * g->c, j.units), dw_bwd_data_item, &j);
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
        mgt_status st = cpu_scratch_ensure(ctx, op, j.per_thread * (size_t)threads);
        if (st != MGT_OK)
            return st;
        j.scratch = ctx->scratch;
    }
    cpu_pool_for(ctx->pool, (int)(outer * (size_t)j.tiles), conv_bwd_data_item, &j);
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

static mgt_status run_conv_bwd_filter(cpu_ctx *ctx, const mgt_op *op)
{
    int threads = pool_threads(ctx);
    conv_job j = {.op = op, .g = conv_geom_of(&op->u.conv.sh)};
    const conv_geom *g = &j.g;
    if (g->depthwise) {
        j.units = units_per_item((size_t)g->n * g->pq * g->rs);
        cpu_pool_for(ctx->pool, items_of((size_t)g->c, j.units), dw_bwd_filter_item, &j);
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
    mgt_status st = cpu_scratch_ensure(ctx, op, part_floats + j.per_thread * (size_t)threads);
    if (st != MGT_OK)
        return st;
    j.partial = ctx->scratch;
    j.scratch = ctx->scratch != NULL ? ctx->scratch + part_floats : NULL;
    cpu_pool_for(ctx->pool, j.parts, conv_bwd_filter_item, &j);
    if (j.parts > 1)
        cpu_pool_for(ctx->pool, items_of(dw_n, CHUNK), conv_reduce_item, &j);
    return MGT_OK;
}

/* ---- the depthwise filter gradient in nChw16c ----
   oneDNN 2.6 has a direct kernel for it only at 3x3: the 5x5 ones of EfficientNet and MNASNet
   went to its gemm-based loops, image by image, at a few GFLOP/s (two thirds of an
   efficientnet_b0 --amp bf16 step). Here one item owns a block of 16 channels over every image:
   per tap, each output row's products are summed in fp32 over the 16 channels' lanes, and the
   rows are added in double, as dw_bwd_filter_item adds them in NCHW (no partials: the same bits
   for any thread count). The stored activations are read where they lie: fp32, or 16-bit codes
   widened in registers (their products are exact in fp32, as oneDNN's 16-bit kernels have
   them). */
LANE16 static void dwb_bwd_filter_block(const mgt_op *op, const conv_geom *g, size_t b)
{
    mgt_precision p = mgt_op_store16(op);
    size_t cb = (size_t)g->c / 16;
    float beta = op->u.conv.beta;
    for (int kr = 0; kr < g->r; kr++)
        for (int ks = 0; ks < g->s; ks++) {
            int lo_x, hi_x;
            valid_cols(g, ks, 0, g->q, &lo_x, &hi_x);
            double acc[16] = {0};
            for (int ni = 0; ni < g->n; ni++) {
                size_t xb = ((size_t)ni * cb + b) * g->hw * 16,
                       yb = ((size_t)ni * cb + b) * g->pq * 16;
                for (int oy = 0; oy < g->p; oy++) {
                    int iy = oy * g->sh - g->ph + kr;
                    if (iy < 0 || iy >= g->h)
                        continue;
                    vf16 row = {0};
                    for (int ox = lo_x; ox < hi_x; ox++) {
                        size_t xi =
                            xb + ((size_t)iy * g->w + (size_t)(ox * g->sw + ks - g->pw)) * 16;
                        size_t yi = yb + ((size_t)oy * g->q + (size_t)ox) * 16;
                        row += lane16_ld(p, op->u.conv.in1, yi, 0xffff) *
                               lane16_ld(p, op->u.conv.in2, xi, 0xffff);
                    }
                    for (int l = 0; l < 16; l++)
                        acc[l] += row[l];
                }
            }
            for (int l = 0; l < 16; l++) {
                float *o = op->u.conv.out + (b * 16 + (size_t)l) * g->rs + (size_t)(kr * g->s + ks);
                *o = beta == 0.0f ? (float)acc[l] : beta * *o + (float)acc[l];
            }
        }
}

static void dwb_bwd_filter_item(void *c, int i, int t)
{
    (void)t;
    const conv_job *j = c;
    dwb_bwd_filter_block(j->op, &j->g, (size_t)i);
}

/* Whether the op is a depthwise filter gradient this file computes in nChw16c: both sides
   blocked, a filter other than 3x3 (oneDNN's direct kernel takes those), the lanes on, and
   products exact in fp32 (fp32, or the storage's own 16-bit format). */
static bool dwb_takes(const cpu_ctx *ctx, const mgt_op *op)
{
    const mgt_conv2d_shape *sh = &op->u.conv.sh;
    return op->kind == MGT_OP_CONV2D_BWD_FILTER && sh->groups == sh->c && sh->groups == sh->k &&
           sh->x_layout == MGT_LAYOUT_NCHW16C && sh->y_layout == MGT_LAYOUT_NCHW16C &&
           (sh->r != 3 || sh->s != 3) && lane16_on(ctx) &&
           (op->prec == MGT_PREC_F32 || op->prec == mgt_op_store16(op));
}

static mgt_status run_dwb_bwd_filter(cpu_ctx *ctx, const mgt_op *op)
{
    conv_job j = {.op = op, .g = conv_geom_of(&op->u.conv.sh)};
    cpu_pool_for(ctx->pool, j.g.c / 16, dwb_bwd_filter_item, &j);
    return MGT_OK;
}

/* oneDNN where it has a kernel for the shape; MGT_ERR_UNSUPPORTED (nothing run) otherwise. */
static mgt_status run_conv_onednn(cpu_ctx *ctx, const mgt_op *op)
{
    onednn_plan *plan;
    size_t floats;
    mgt_status st = onednn_conv_plan(ctx->onednn, op, &plan, &floats);
    if (st == MGT_OK)
        st = cpu_scratch_ensure(ctx, op, floats);
    if (st == MGT_OK)
        st = onednn_conv_run(ctx->onednn, plan, ctx->pool, op, ctx->scratch);
    return st;
}

/* Whether a convolution reads or writes a blocked activation: only oneDNN's kernels do. */
static bool conv_blocked(const mgt_op *op)
{
    return op->u.conv.sh.x_layout != MGT_LAYOUT_NCHW || op->u.conv.sh.y_layout != MGT_LAYOUT_NCHW;
}

static cpu_lp_key lp_key(const mgt_op *op)
{
    cpu_lp_key k;
    memset(&k, 0, sizeof k); /* compared with memcmp: no stray padding bytes */
    k.kind = op->kind;
    k.prec = op->prec;
    k.store_in = op->store_in;
    k.store_out = op->store_out;
    k.sh = op->u.conv.sh;
    k.sh.n = 0;
    return k;
}

static bool lp_remembered(const cpu_ctx *ctx, const cpu_lp_key *k)
{
    for (int i = 0; i < ctx->n_lp_refused; i++)
        if (memcmp(&ctx->lp_refused[i], k, sizeof *k) == 0)
            return true;
    return false;
}

/* A shape the native 16-bit path refused for good; without room to remember it, the next
   call merely asks again. */
static void lp_remember(cpu_ctx *ctx, const cpu_lp_key *k)
{
    if (ctx->n_lp_refused == ctx->cap_lp_refused) {
        int cap = ctx->cap_lp_refused ? 2 * ctx->cap_lp_refused : 16;
        cpu_lp_key *a = realloc(ctx->lp_refused, (size_t)cap * sizeof *a);
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
   emulation (cpu_lowp), or the failure. */
static mgt_status lp_native(cpu_ctx *ctx, const mgt_op *op, bool *ran)
{
    *ran = false;
    cpu_lp_key key = lp_key(op);
    if (lp_remembered(ctx, &key))
        return MGT_OK;
    mgt_lp_refusal why = ctx->lp_refusal ? ctx->lp_refusal(ctx->owner) : MGT_LP_REFUSAL_NONE;
    if (why == MGT_LP_REFUSAL_NONE) {
        /* grouped ones too where the activations are stored in bf16: oneDNN's bf16 kernels
           take them as they are, where the direct loops would need them widened */
        if (op->prec == MGT_PREC_BF16 && (!ctx->conv_im2col || conv_blocked(op)) &&
            (op->u.conv.sh.groups == 1 || mgt_op_store16(op) == MGT_PREC_BF16)) {
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

/* A convolution whose activations are stored in 16 bits: bf16 storage with bf16 arithmetic
   on oneDNN's bf16 kernels, which read and write the stored bf16 as it is (lp_native); every
   other case (fp16, a CPU or shape without a bf16 kernel, a refusal) widened around the
   fp32-stored op, which then goes to the emulation without asking the refusal hook again. */
static mgt_status conv2d_store16(cpu_ctx *ctx, const mgt_op *op)
{
    if (op->prec == MGT_PREC_BF16 && mgt_op_store16(op) == MGT_PREC_BF16) {
        bool ran;
        mgt_status st = lp_native(ctx, op, &ran);
        if (ran || st != MGT_OK)
            return st;
    }
    bool decided = ctx->lp_decided;
    ctx->lp_decided = op->prec != MGT_PREC_F32;
    mgt_status st = cpu_run_widened(ctx, op);
    ctx->lp_decided = decided;
    return st;
}

/* oneDNN where it has a kernel for the shape (and conv=im2col does not ask otherwise, which a
   blocked activation overrules), the im2col path for the rest. */
mgt_status cpu_conv2d(cpu_ctx *ctx, const mgt_op *op)
{
    mgt_status st;
    if (dwb_takes(ctx, op))
        return run_dwb_bwd_filter(ctx, op);
    if (mgt_op_store16(op) != MGT_PREC_F32)
        return conv2d_store16(ctx, op);
    if (op->prec != MGT_PREC_F32) {
        bool ran = false;
        st = ctx->lp_decided ? MGT_OK : lp_native(ctx, op, &ran);
        if (ran || st != MGT_OK)
            return st;
        return cpu_lowp(ctx, op, cpu_conv2d);
    }
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
