/* The CPU kernels of the elementwise ops: fill, scale, axpy, add, relu, the sums, the
   optimizer updates, the biases, dropout, strided copies, channel scaling. */
#include "device/cpu/lane16.h"

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

/* 16-bit storage (the op's mgt_op_store16): on AVX-512 each lane is widened, computed and
   rounded in registers (elementwise_lanes); on the baseline an item widens TILE16 values of each
   input into tiles on its stack, runs the fp32 loop on them and rounds the output tile once.
   Both round once per output from the same fp32 operations, so they give the same bits, and
   memory sees each 16-bit array pass once. */
#define TILE16 1024

/* An elementwise op and whether its items take the AVX-512 lanes (lane16_on). */
typedef struct ew_job {
    const mgt_op *op;
    bool lanes;
} ew_job;

enum ew_kind { EW_ADD, EW_RELU_FWD, EW_RELU_BWD };

/* out = a + b, or relu(a), or a where b > 0 (relu's backward: a = dy, b = y), on [lo, hi) of
   arrays stored as p has them. NaN passes through relu as in torch.relu and the reference; the
   masks clear to +0.0, as the reference's literal. */
LANE16 static void elementwise_lanes(enum ew_kind k, mgt_precision p, void *out, const void *a,
                                     const void *b, size_t lo, size_t hi)
{
    for (size_t at = lo; at < hi; at += 16) {
        __mmask16 m = lane16_mask(hi, at);
        vf16 v = lane16_ld(p, a, at, m), r;
        if (k == EW_ADD)
            r = v + lane16_ld(p, b, at, m);
        else if (k == EW_RELU_FWD)
            r = (vf16)((vi16)v & ~(v <= 0.0f));
        else
            r = (vf16)((vi16)v & (lane16_ld(p, b, at, m) > 0.0f));
        lane16_st(p, out, at, r, m);
    }
}

static void add_span(float *y, const float *a, const float *b, size_t n)
{
    size_t j = 0;
    /* y may be a or b: each block is loaded before it is stored */
    for (; j + VW <= n; j += VW)
        vst(y + j, vld(a + j) + vld(b + j));
    for (; j < n; j++)
        y[j] = a[j] + b[j];
}

static void relu_fwd_span(float *y, const float *x, size_t n)
{
    size_t j = 0;
    for (; j + VW <= n; j += VW) {
        vf v = vld(x + j);
        vi keep = ~(v <= 0.0f);
        vst(y + j, (vf)((vi)v & keep));
    }
    for (; j < n; j++)
        y[j] = x[j] <= 0.0f ? 0.0f : x[j];
}

static void relu_bwd_span(float *dx, const float *dy, const float *y, size_t n)
{
    size_t j = 0;
    for (; j + VW <= n; j += VW) {
        vi pass = vld(y + j) > 0.0f;
        vst(dx + j, (vf)((vi)vld(dy + j) & pass));
    }
    for (; j < n; j++)
        dx[j] = y[j] > 0.0f ? dy[j] : 0.0f;
}

/* Item i of kind k over n elements: out from a (and b) on the lanes, or on the baseline's
   spans (through tiles where the arrays are 16-bit). */
static void elementwise_item(const ew_job *jb, enum ew_kind k, void *out, const void *a,
                             const void *b, size_t n, int i)
{
    size_t lo, hi;
    item_range(n, CHUNK, i, &lo, &hi);
    mgt_precision p = mgt_op_store16(jb->op);
    if (jb->lanes) {
        elementwise_lanes(k, p, out, a, b, lo, hi);
        return;
    }
    float ta[TILE16], tb[TILE16];
    size_t step = p == MGT_PREC_F32 ? hi - lo : TILE16;
    for (size_t s = lo; s < hi; s += step) {
        size_t m = min_z(step, hi - s);
        const float *fa = ta, *fb = b ? tb : NULL;
        float *fo = ta;
        if (p == MGT_PREC_F32) {
            fa = (const float *)a + s;
            fb = b ? (const float *)b + s : NULL;
            fo = (float *)out + s;
        } else {
            cpu16_widen(p, (const uint16_t *)a + s, ta, m);
            if (b)
                cpu16_widen(p, (const uint16_t *)b + s, tb, m);
        }
        if (k == EW_ADD)
            add_span(fo, fa, fb, m);
        else if (k == EW_RELU_FWD)
            relu_fwd_span(fo, fa, m);
        else
            relu_bwd_span(fo, fa, fb, m);
        if (p != MGT_PREC_F32)
            cpu16_round(p, ta, (uint16_t *)out + s, m);
    }
}

static void add_item(void *c, int i, int t)
{
    (void)t;
    const ew_job *jb = c;
    const mgt_add_args *g = &jb->op->u.add;
    elementwise_item(jb, EW_ADD, g->y, g->a, g->b, g->n, i);
}

static void relu_fwd_item(void *c, int i, int t)
{
    (void)t;
    const ew_job *jb = c;
    const mgt_relu_fwd_args *g = &jb->op->u.relu_fwd;
    elementwise_item(jb, EW_RELU_FWD, g->y, g->x, NULL, g->n, i);
}

static void relu_bwd_item(void *c, int i, int t)
{
    (void)t;
    const ew_job *jb = c;
    const mgt_relu_bwd_args *g = &jb->op->u.relu_bwd;
    elementwise_item(jb, EW_RELU_BWD, g->dx, g->dy, g->y, g->n, i);
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
mgt_status cpu_sum(cpu_ctx *ctx, const mgt_op *op)
{
    int items = items_of(op->u.sum.n, CHUNK);
    mgt_status st = cpu_scratch_ensure(ctx, op, (size_t)items * 2);
    if (st != MGT_OK)
        return st;
    sum_job j = {op, (double *)(void *)ctx->scratch};
    cpu_pool_for(ctx->pool, items, sum_item, &j);
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
    const mgt_adamw_args *a = &op->u.adamw;
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
    const mgt_rmsprop_args *a = &op->u.rmsprop;
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

static void bias_fwd_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *j = c;
    const mgt_bias_fwd_args *b = &j->op->u.bias_fwd;
    size_t cols = (size_t)b->cols, lo, hi;
    item_range((size_t)b->rows, j->units, i, &lo, &hi);
    for (size_t r = lo; r < hi; r++)
        v_add_to(b->y + r * cols, b->bias, cols);
}

#define BIAS_COLS 256
#define BIAS_ROWS 512

/* The backward's items: blocks of BIAS_COLS columns times blocks of BIAS_ROWS rows, each
   block's column sums in double in scratch ([row block][cols]), added in row-block order
   afterwards. Items are a function of the shape alone, so the sums do not depend on threads;
   the row blocks let a layer with few columns (a transformer's 96) use every thread. */
typedef struct bias_bwd_job {
    const mgt_op *op;
    int col_blocks;
    double *partial;
} bias_bwd_job;

static void bias_bwd_item(void *c, int i, int t)
{
    (void)t;
    const bias_bwd_job *j = c;
    const mgt_bias_bwd_args *b = &j->op->u.bias_bwd;
    size_t cols = (size_t)b->cols, lo, hi, r0, r1;
    int cb = i % j->col_blocks, rb = i / j->col_blocks;
    item_range(cols, BIAS_COLS, cb, &lo, &hi);
    item_range((size_t)b->rows, BIAS_ROWS, rb, &r0, &r1);
    double acc[BIAS_COLS] = {0};
    for (size_t r = r0; r < r1; r++) {
        const float *dy = b->dy + r * cols;
        for (size_t e = lo; e < hi; e++)
            acc[e - lo] += dy[e];
    }
    memcpy(j->partial + (size_t)rb * cols + lo, acc, (hi - lo) * sizeof *acc);
}

static void chbias_fwd_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *j = c;
    const mgt_chbias_fwd_args *b = &j->op->u.chbias_fwd;
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
    const mgt_chbias_bwd_args *b = &j->op->u.chbias_bwd;
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
    const mgt_dropout_args *d = &op->u.dropout;
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

/* Rows (of all images) in parallel, a memcpy each. */
static void scopy_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *jb = c;
    const mgt_scopy_args *a = &jb->op->u.scopy;
    size_t lo, hi;
    item_range((size_t)a->n * a->rows, jb->units, i, &lo, &hi);
    /* 16-bit storage: the same copy of 2-byte codes (strides and counts are in elements) */
    size_t es = mgt_op_store16(jb->op) != MGT_PREC_F32 ? 2 : sizeof(float);
    for (size_t q = lo; q < hi; q++) {
        size_t im = q / (size_t)a->rows, r = q % (size_t)a->rows;
        memcpy((char *)a->y + (im * a->y_stride + r * a->y_row) * es,
               (const char *)a->x + (im * a->x_stride + r * a->x_row) * es, a->count * es);
    }
}

/* One item per run of whole planes (image, channel). */
static void chscale_fwd_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *j = c;
    const mgt_chscale_fwd_args *a = &j->op->u.chscale_fwd;
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

/* y = x scaled per channel over one 16-channel block of hw pixels (nChw16c): each pixel's 16
   channels by their 16 factors sc (the NCHW loop's product, element for element); y may be x. */
static void scale_block(float *y, const float *x, const float *sc, size_t hw)
{
    vf k[4];
    for (int q = 0; q < 4; q++)
        k[q] = vld(sc + 4 * (size_t)q);
    for (size_t e = 0; e < hw * 16; e += 16)
        for (int q = 0; q < 4; q++)
            vst(y + e + 4 * (size_t)q, vld(x + e + 4 * (size_t)q) * k[q]);
}

/* nChw16c: one item per run of whole 16-channel blocks of an image. */
static void chscale_fwd_blocked_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *j = c;
    const mgt_chscale_fwd_args *a = &j->op->u.chscale_fwd;
    size_t hw = (size_t)a->hw, cb = (size_t)a->c / 16, lo, hi;
    item_range((size_t)a->n * cb, j->units, i, &lo, &hi);
    for (size_t bl = lo; bl < hi; bl++)
        scale_block(a->y + bl * hw * 16, a->x + bl * hw * 16,
                    a->scale + (a->shared ? 0 : bl / cb * (size_t)a->c) + bl % cb * 16, hw);
}

/* Per plane: dx, and the plane's sum of dy * x in double (fixed order: even pixels into one
   sum, odd ones into another, then the two); with shared, the planes of one channel are summed
   over the images in order afterwards, so no result depends on threads or the layout. */
typedef struct chscale_job {
    const mgt_op *op;
    size_t units;
    double *sums; /* with shared: one sum per plane */
} chscale_job;

static void chscale_bwd_item(void *c, int i, int t)
{
    (void)t;
    const chscale_job *j = c;
    const mgt_chscale_bwd_args *a = &j->op->u.chscale_bwd;
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

/* nChw16c: the 16 planes of a block at once, each channel's sums in the NCHW loop's order. */
static void chscale_bwd_blocked_item(void *c, int i, int t)
{
    (void)t;
    const chscale_job *j = c;
    const mgt_chscale_bwd_args *a = &j->op->u.chscale_bwd;
    size_t hw = (size_t)a->hw, cb = (size_t)a->c / 16, lo, hi;
    item_range((size_t)a->n * cb, j->units, i, &lo, &hi);
    for (size_t bl = lo; bl < hi; bl++) {
        size_t img = bl / cb, s0 = (a->shared ? 0 : img * (size_t)a->c) + bl % cb * 16;
        const float *dy = a->dy + bl * hw * 16, *x = a->x + bl * hw * 16;
        float *dx = a->dx + bl * hw * 16;
        if (a->dscale) {
            double sum[2][16] = {{0}};
            for (size_t e = 0; e < hw; e++)
                for (int l = 0; l < 16; l++)
                    sum[e & 1][l] += (double)dy[e * 16 + (size_t)l] * x[e * 16 + (size_t)l];
            for (int l = 0; l < 16; l++) {
                /* plane (img, channel bl % cb * 16 + l) */
                size_t pl = img * (size_t)a->c + bl % cb * 16 + (size_t)l;
                if (a->shared)
                    j->sums[pl] = sum[0][l] + sum[1][l];
                else
                    a->dscale[pl] = (float)(sum[0][l] + sum[1][l]);
            }
        }
        scale_block(dx, dy, a->scale + s0, hw); /* after the sums: dx may be dy */
    }
}

mgt_status cpu_fill(cpu_ctx *ctx, const mgt_op *op)
{
    POOL_FOR(ctx, items_of(op->u.fill.n, CHUNK), fill_item, op);
    return MGT_OK;
}

mgt_status cpu_scale(cpu_ctx *ctx, const mgt_op *op)
{
    POOL_FOR(ctx, items_of(op->u.scale.n, CHUNK), scale_item, op);
    return MGT_OK;
}

mgt_status cpu_axpy(cpu_ctx *ctx, const mgt_op *op)
{
    POOL_FOR(ctx, items_of(op->u.axpy.n, CHUNK), axpy_item, op);
    return MGT_OK;
}

mgt_status cpu_add(cpu_ctx *ctx, const mgt_op *op)
{
    ew_job jb = {op, lane16_on(ctx)};
    POOL_FOR(ctx, items_of(op->u.add.n, CHUNK), add_item, &jb);
    return MGT_OK;
}

mgt_status cpu_relu_fwd(cpu_ctx *ctx, const mgt_op *op)
{
    ew_job jb = {op, lane16_on(ctx)};
    POOL_FOR(ctx, items_of(op->u.relu_fwd.n, CHUNK), relu_fwd_item, &jb);
    return MGT_OK;
}

mgt_status cpu_relu_bwd(cpu_ctx *ctx, const mgt_op *op)
{
    ew_job jb = {op, lane16_on(ctx)};
    POOL_FOR(ctx, items_of(op->u.relu_bwd.n, CHUNK), relu_bwd_item, &jb);
    return MGT_OK;
}

mgt_status cpu_adamw(cpu_ctx *ctx, const mgt_op *op)
{
    POOL_FOR(ctx, items_of(op->u.adamw.n, CHUNK), adamw_item, op);
    return MGT_OK;
}

mgt_status cpu_rmsprop(cpu_ctx *ctx, const mgt_op *op)
{
    POOL_FOR(ctx, items_of(op->u.rmsprop.n, CHUNK), rmsprop_item, op);
    return MGT_OK;
}

mgt_status cpu_sgd(cpu_ctx *ctx, const mgt_op *op)
{
    POOL_FOR(ctx, items_of(op->u.sgd.n, CHUNK), sgd_item, op);
    return MGT_OK;
}

mgt_status cpu_bias_fwd(cpu_ctx *ctx, const mgt_op *op)
{
    plane_job j = {op, units_per_item((size_t)op->u.bias_fwd.cols)};
    POOL_FOR(ctx, items_of((size_t)op->u.bias_fwd.rows, j.units), bias_fwd_item, &j);
    return MGT_OK;
}

mgt_status cpu_bias_bwd(cpu_ctx *ctx, const mgt_op *op)
{
    const mgt_bias_bwd_args *b = &op->u.bias_bwd;
    size_t cols = (size_t)b->cols;
    int row_blocks = items_of((size_t)b->rows, BIAS_ROWS);
    bias_bwd_job j = {op, items_of(cols, BIAS_COLS), NULL};
    mgt_status st = cpu_scratch_ensure(ctx, op, (size_t)row_blocks * cols * 2);
    if (st != MGT_OK)
        return st;
    j.partial = (double *)(void *)ctx->scratch;
    POOL_FOR(ctx, j.col_blocks * row_blocks, bias_bwd_item, &j);
    for (size_t e = 0; e < cols; e++) {
        double sum = 0.0;
        for (int rb = 0; rb < row_blocks; rb++)
            sum += j.partial[(size_t)rb * cols + e];
        b->dbias[e] += (float)sum;
    }
    return MGT_OK;
}

mgt_status cpu_chbias_fwd(cpu_ctx *ctx, const mgt_op *op)
{
    plane_job j = {op, units_per_item((size_t)op->u.chbias_fwd.hw)};
    POOL_FOR(ctx, items_of((size_t)op->u.chbias_fwd.n * op->u.chbias_fwd.c, j.units),
             chbias_fwd_item, &j);
    return MGT_OK;
}

mgt_status cpu_chbias_bwd(cpu_ctx *ctx, const mgt_op *op)
{
    plane_job j = {op, 1};
    POOL_FOR(ctx, op->u.chbias_bwd.c, chbias_bwd_item, &j);
    return MGT_OK;
}

mgt_status cpu_dropout(cpu_ctx *ctx, const mgt_op *op)
{
    POOL_FOR(ctx, items_of((size_t)op->u.dropout.n * op->u.dropout.per_image, CHUNK), dropout_item,
             op);
    return MGT_OK;
}

mgt_status cpu_scopy(cpu_ctx *ctx, const mgt_op *op)
{
    const mgt_scopy_args *a = &op->u.scopy;
    plane_job j = {op, units_per_item(a->count)};
    POOL_FOR(ctx, items_of((size_t)a->n * a->rows, j.units), scopy_item, &j);
    return MGT_OK;
}

mgt_status cpu_chscale_fwd(cpu_ctx *ctx, const mgt_op *op)
{
    const mgt_chscale_fwd_args *a = &op->u.chscale_fwd;
    if (a->layout == MGT_LAYOUT_NCHW16C) {
        plane_job j = {op, units_per_item((size_t)a->hw * 16)};
        POOL_FOR(ctx, items_of((size_t)a->n * (size_t)(a->c / 16), j.units),
                 chscale_fwd_blocked_item, &j);
        return MGT_OK;
    }
    plane_job j = {op, units_per_item((size_t)a->hw)};
    POOL_FOR(ctx, items_of((size_t)a->n * a->c, j.units), chscale_fwd_item, &j);
    return MGT_OK;
}

/* The shared form's per-plane sums take n * c doubles of host memory per call: a parameter's
   layer scale has few channels and the call is not in a hot loop of its own. */
mgt_status cpu_chscale_bwd(cpu_ctx *ctx, const mgt_op *op)
{
    const mgt_chscale_bwd_args *a = &op->u.chscale_bwd;
    size_t planes = (size_t)a->n * a->c;
    chscale_job j = {op, units_per_item((size_t)a->hw), NULL};
    if (a->dscale && a->shared) {
        j.sums = malloc(planes * sizeof *j.sums);
        if (!j.sums)
            return mgt_error_set(MGT_ERR_OOM, "channel_scale_backward: out of host memory");
    }
    if (a->layout == MGT_LAYOUT_NCHW16C) {
        j.units = units_per_item((size_t)a->hw * 16);
        POOL_FOR(ctx, items_of((size_t)a->n * (size_t)(a->c / 16), j.units),
                 chscale_bwd_blocked_item, &j);
    } else {
        POOL_FOR(ctx, items_of(planes, j.units), chscale_bwd_item, &j);
    }
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
