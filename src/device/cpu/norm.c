/* The CPU kernels of batch norm (NCHW and nChw16c, the training forward with its statistics,
   eval, backward, the split statistics of SyncBN) and of the layer norm over channels. */
#include "device/lowp.h"
#include "device/cpu/lane16.h"

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

/* An NCHW batch-norm op's items: the op, planes per item (eval), and with activations stored in
   16 bits (p16), four tiles of one plane per thread: each image plane an item reads is widened
   into its thread's tile, the fp32 loops run on the tiles, and an output plane is rounded once
   from its tile (one pass over memory, the widened route's bits). */
typedef struct bnp_job {
    const mgt_op *op;
    size_t units;
    mgt_precision p16;
    float *tiles;
    size_t tile; /* floats per tile */
} bnp_job;

/* Elements [off, off + n) of operand a as fp32 (tile k of thread t where it is 16-bit). */
static const float *bnp_in(const bnp_job *j, const float *a, size_t off, int t, int k, size_t n)
{
    if (!a || j->p16 == MGT_PREC_F32)
        return a ? a + off : NULL;
    float *tile = j->tiles + ((size_t)t * 4 + (size_t)k) * j->tile;
    cpu16_widen(j->p16, (const uint16_t *)(const void *)a + off, tile, n);
    return tile;
}

/* Where an output plane at a + off is computed: in place, or in tile 3 of thread t. */
static float *bnp_out(const bnp_job *j, float *a, size_t off, int t)
{
    return j->p16 == MGT_PREC_F32 ? a + off : j->tiles + ((size_t)t * 4 + 3) * j->tile;
}

/* The plane computed at res stored at a + off (rounded once where 16-bit). */
static void bnp_done(const bnp_job *j, float *a, size_t off, const float *res, size_t n)
{
    if (j->p16 != MGT_PREC_F32)
        cpu16_round(j->p16, res, (uint16_t *)(void *)a + off, n);
}

static mgt_status bnp_setup(cpu_ctx *ctx, const mgt_op *op, int hw, bnp_job *j)
{
    *j = (bnp_job){.op = op, .units = units_per_item((size_t)hw), .p16 = mgt_op_store16(op)};
    if (j->p16 == MGT_PREC_F32)
        return MGT_OK;
    j->tile = align_up((size_t)hw);
    mgt_status st = cpu_scratch_ensure(ctx, op, (size_t)pool_threads(ctx) * 4 * j->tile);
    j->tiles = ctx->scratch;
    return st;
}

static void bn_train_item(void *c, int ch, int t)
{
    const bnp_job *j = c;
    const mgt_bn_train_args *b = &j->op->u.bn_train;
    size_t hw = (size_t)b->sh.hw, stride = (size_t)b->sh.c * hw, base = (size_t)ch * hw;
    size_t count = (size_t)b->sh.n * hw;
    /* One pass over shifted data: with the channel's first value as the shift, s1 and s2 stay
       of the order of the spread, not of the mean, so s2 - s1^2/count loses little to
       cancellation even where the mean is many spreads from zero. */
    float first = *bnp_in(j, b->x, base, t, 0, 1);
    double s1 = 0, s2 = 0;
    for (int ni = 0; ni < b->sh.n; ni++)
        sum_shifted(bnp_in(j, b->x, base + ni * stride, t, 0, hw), hw, first, &s1, &s2);
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
    for (int ni = 0; ni < b->sh.n; ni++) {
        size_t off = base + ni * stride;
        float *y = bnp_out(j, b->y, off, t);
        v_affine(y, bnp_in(j, b->x, off, t, 0, hw), hw, fm, scale, shift, b->sh.relu);
        bnp_done(j, b->y, off, y, hw);
    }
}

static void bn_eval_item(void *c, int i, int t)
{
    const bnp_job *j = c;
    const mgt_bn_eval_args *b = &j->op->u.bn_eval;
    size_t hw = (size_t)b->sh.hw, lo, hi;
    item_range((size_t)b->sh.n * b->sh.c, j->units, i, &lo, &hi);
    for (size_t pl = lo; pl < hi; pl++) {
        int ch = (int)(pl % (size_t)b->sh.c);
        float mean = b->running_mean[ch];
        float scale = b->gamma[ch] / sqrtf(b->running_var[ch] + b->sh.eps);
        float shift = b->beta[ch];
        float *y = bnp_out(j, b->y, pl * hw, t);
        v_affine(y, bnp_in(j, b->x, pl * hw, t, 0, hw), hw, mean, scale, shift, b->sh.relu);
        bnp_done(j, b->y, pl * hw, y, hw);
    }
}

static void bn_bwd_item(void *c, int ch, int t)
{
    const bnp_job *j = c;
    const mgt_bn_bwd_args *b = &j->op->u.bn_bwd;
    size_t hw = (size_t)b->sh.hw, stride = (size_t)b->sh.c * hw;
    size_t off = (size_t)ch * hw;
    double count = (double)b->sh.n * (double)hw;
    double mean = b->save_mean[ch], invstd = b->save_invstd[ch];
    double sdy = 0, sdyx = 0;
    const float *ym = b->sh.relu ? b->y : NULL; /* the folded ReLU's mask */
    for (int ni = 0; ni < b->sh.n; ni++) {
        size_t at = off + ni * stride;
        sum_dy_prod(bnp_in(j, b->dy, at, t, 1, hw), bnp_in(j, ym, at, t, 2, hw),
                    bnp_in(j, b->x, at, t, 0, hw), hw, (float)mean, &sdy, &sdyx);
    }
    double sdyxhat = sdyx * invstd;
    b->dgamma[ch] += (float)sdyxhat;
    b->dbeta[ch] += (float)sdy;
    /* dx = gamma*invstd * (dy - mean(dy) - xhat * mean(dy*xhat)) */
    float k = b->gamma[ch] * (float)invstd;
    float mdy = (float)(sdy / count);
    float kx = (float)(sdyxhat / count * invstd); /* applied to (x - mean) */
    float fm = (float)mean;
    for (int ni = 0; ni < b->sh.n; ni++) {
        size_t at = off + ni * stride;
        const float *dy = bnp_in(j, b->dy, at, t, 1, hw), *x = bnp_in(j, b->x, at, t, 0, hw);
        const float *y = bnp_in(j, ym, at, t, 2, hw);
        float *dx = bnp_out(j, b->dx, at, t);
        size_t e = 0;
        for (; e + VW <= hw; e += VW)
            vst(dx + e, k * (v_relu_dy(dy, y, e) - mdy - (vld(x + e) - fm) * kx));
        for (; e < hw; e++)
            dx[e] = k * (relu_dy(dy, y, e) - mdy - (x[e] - fm) * kx);
        bnp_done(j, b->dx, at, dx, hw);
    }
}

/* bn_train's statistics alone: one pass over shifted data, the same sums. */
static void bn_stats_item(void *c, int ch, int t)
{
    (void)t;
    const mgt_op *op = c;
    const mgt_bn_stats_args *b = &op->u.bn_stats;
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
    const mgt_bn_bwd_elemt_args *b = &op->u.bn_bwd_elemt;
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

static int bnb_parts(int n) { return n < BNB_PARTS ? n : BNB_PARTS; }

/* What a blocked batch-norm op's items share: the op's arrays seen as [n, c/16, hw, 16], each
   image's two sums per channel, and the per-channel coefficients of the elementwise pass. */
typedef struct bnb_job {
    int n, cb, parts;
    size_t hw;
    const float *x, *dy;   /* dy: backward only */
    const float *ymask;    /* backward with a folded ReLU: the forward's output, else NULL */
    float *y;              /* y, or dx */
    bool relu;             /* forward with a folded ReLU */
    const float *z;        /* forward with a fused residual add: z (stored as y; may be y) */
    mgt_precision z_round; /* what the BN's result is rounded to before z is added */
    float *dz;             /* backward with a fused residual add: the masked dy (may be dy) */
    double *sums;        /* [n][2][c]: per image, the first sum of every channel, then the second */
    const float *shift;  /* [c]: the value each channel's sums are shifted by */
    float *k0, *k1, *k2; /* [c]: the elementwise pass's coefficients */
    size_t units;        /* planes per item of the elementwise pass */
    bool lanes;          /* the AVX-512 loops, on stored values (bnb_*_lanes), not the baseline's */
    /* activations stored in 16 bits (F32: none): x, dy, ymask and y then point at codes; the
       lanes widen and round them in registers; on the baseline each item widens BNB_TILE values
       of each into its thread's tiles, runs the fp32 loops on them and rounds its output tile
       once; both the same operations on the same values, so memory sees the 16-bit arrays pass
       once and both give the same bits */
    mgt_precision p16;
    float *tiles; /* [threads][3][BNB_TILE] */
} bnb_job;

/* Values per operand tile of a 16-bit item: one sums block (BN_BLOCK pixels of 16 channels);
   the elementwise passes take BNB_SPAN at a time, so that their tiles stay in L1. */
#define BNB_TILE ((size_t)BN_BLOCK * 16)
#define BNB_SPAN ((size_t)2048)

/* Elements [off, off + n) of operand a as fp32: the array itself, or its codes widened into
   tile. */
static const float *bnb_in(const bnb_job *j, const float *a, size_t off, float *tile, size_t n)
{
    if (!a || j->p16 == MGT_PREC_F32)
        return a ? a + off : NULL;
    cpu16_widen(j->p16, (const uint16_t *)(const void *)a + off, tile, n);
    return tile;
}

static float *bnb_tile(const bnb_job *j, int t, int k)
{
    return j->tiles + ((size_t)t * 3 + (size_t)k) * BNB_TILE;
}

/* Element off of a stored operand (NULL stays NULL), for the lanes. */
static const void *bnb_at(const bnb_job *j, const void *a, size_t off)
{
    if (!a)
        return NULL;
    return j->p16 == MGT_PREC_F32 ? (const void *)((const float *)a + off)
                                  : (const void *)((const uint16_t *)a + off);
}

/* One image plane of one block: per channel, t1 += sum of a and t2 += sum of b, where backward
   (dy != NULL) has a = dy, b = dy * (x - shift) and forward a = x - shift, b = a^2; added as
   sum_shifted and sum_dy_prod add them for one NCHW plane. y masks dy as there. LOAD(a, at) gives
   the 16 channels of a pixel as fp32 lanes; the loop is built twice (a macro, one body): on the
   baseline over fp32 arrays (16-bit ones widened into tiles first) and on the lanes over the
   stored arrays, with the same per-lane IEEE operations in the same order, so the same bits. Its
   32 accumulators of 16 lanes fit AVX-512's registers. */
#define BNB_PLANE_SUMS(NAME, ATTR, LOAD)                                                           \
    ATTR static void NAME(mgt_precision p, const void *x, const void *dy, const void *y,           \
                          size_t hw, const float *shift, double *t1, double *t2)                   \
    {                                                                                              \
        (void)p;                                                                                   \
        vf16 k = V16_LD(shift);                                                                    \
        size_t j = 0;                                                                              \
        while (j + 16 <= hw) {                                                                     \
            size_t end = j + min_z(BN_BLOCK, (hw - j) / 16 * 16);                                  \
            vf16 a[16], q[16]; /* by pixel offset within a group of 16 */                          \
            memset(a, 0, sizeof a);                                                                \
            memset(q, 0, sizeof q);                                                                \
            for (; j < end; j += 16)                                                               \
                for (int g = 0; g < 16; g++) {                                                     \
                    size_t at = (j + (size_t)g) * 16;                                              \
                    vf16 v = LOAD(x, at) - k;                                                      \
                    if (dy) {                                                                      \
                        vf16 d = LOAD(dy, at);                                                     \
                        if (y)                                                                     \
                            d = (vf16)((vi16)d & (LOAD(y, at) > 0.0f));                            \
                        a[g] += d;                                                                 \
                        q[g] += d * v;                                                             \
                    } else {                                                                       \
                        a[g] += v;                                                                 \
                        q[g] += v * v;                                                             \
                    }                                                                              \
                }                                                                                  \
            /* hsum_f4x4: lane l of (a0 + a1) + (a2 + a3), then the four lanes in double */        \
            vf16 fa[4], fq[4];                                                                     \
            for (int l = 0; l < 4; l++) {                                                          \
                fa[l] = (a[l] + a[4 + l]) + (a[8 + l] + a[12 + l]);                                \
                fq[l] = (q[l] + q[4 + l]) + (q[8 + l] + q[12 + l]);                                \
            }                                                                                      \
            for (int c = 0; c < 16; c++) {                                                         \
                t1[c] +=                                                                           \
                    ((double)fa[0][c] + (double)fa[1][c]) + ((double)fa[2][c] + (double)fa[3][c]); \
                t2[c] +=                                                                           \
                    ((double)fq[0][c] + (double)fq[1][c]) + ((double)fq[2][c] + (double)fq[3][c]); \
            }                                                                                      \
        }                                                                                          \
        for (; j < hw; j++) {                                                                      \
            vf16 xv = LOAD(x, j * 16), dv = {0}, yv = {0};                                         \
            if (dy)                                                                                \
                dv = LOAD(dy, j * 16);                                                             \
            if (dy && y)                                                                           \
                yv = LOAD(y, j * 16);                                                              \
            for (int c = 0; c < 16; c++) {                                                         \
                if (dy) {                                                                          \
                    float g = !y || yv[c] > 0.0f ? dv[c] : 0.0f;                                   \
                    t1[c] += g;                                                                    \
                    t2[c] += (double)g * ((double)xv[c] - shift[c]);                               \
                } else {                                                                           \
                    double d = (double)xv[c] - shift[c];                                           \
                    t1[c] += d;                                                                    \
                    t2[c] += d * d;                                                                \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

#define BNB_LOAD_F32(a, at) V16_LD((const float *)(a) + (at))
#define BNB_LOAD_LANES(a, at) lane16_ld(p, (a), (at), 0xffff)
BNB_PLANE_SUMS(bnb_plane_sums_base, , BNB_LOAD_F32)
BNB_PLANE_SUMS(bnb_plane_sums_lanes, LANE16, BNB_LOAD_LANES)

/* The sums of this item's images of one block, each image's into its own place. */
static void bnb_sums_item(void *c, int i, int t)
{
    const bnb_job *j = c;
    int b = i / j->parts, p = i % j->parts;
    int n0 = (int)((long long)j->n * p / j->parts),
        n1 = (int)((long long)j->n * (p + 1) / j->parts);
    size_t ch = (size_t)j->cb * 16;
    for (int ni = n0; ni < n1; ni++) {
        size_t base = ((size_t)ni * j->cb + b) * j->hw * 16;
        double *out = j->sums + (size_t)ni * 2 * ch + (size_t)b * 16;
        for (int l = 0; l < 16; l++)
            out[l] = out[ch + (size_t)l] = 0;
        if (j->lanes) {
            bnb_plane_sums_lanes(j->p16, bnb_at(j, j->x, base), bnb_at(j, j->dy, base),
                                 bnb_at(j, j->ymask, base), j->hw, j->shift + (size_t)b * 16, out,
                                 out + ch);
            continue;
        }
        /* 16-bit: block by block, which adds what one call over the plane adds, in its order */
        size_t span = j->p16 == MGT_PREC_F32 ? j->hw : BN_BLOCK;
        for (size_t p0 = 0; p0 < j->hw; p0 += span) {
            size_t np = min_z(span, j->hw - p0), off = base + p0 * 16;
            bnb_plane_sums_base(MGT_PREC_F32, bnb_in(j, j->x, off, bnb_tile(j, t, 0), np * 16),
                                bnb_in(j, j->dy, off, bnb_tile(j, t, 1), np * 16),
                                bnb_in(j, j->ymask, off, bnb_tile(j, t, 2), np * 16), np,
                                j->shift + (size_t)b * 16, out, out + ch);
        }
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
LANE16 static void bnb_affine_lanes(const bnb_job *j, size_t lo, size_t hi)
{
    mgt_precision p = j->p16;
    size_t plane = j->hw * 16;
    for (size_t pl = lo; pl < hi; pl++) {
        size_t b = pl % (size_t)j->cb * 16;
        vf16 sub = V16_LD(j->k0 + b), mul = V16_LD(j->k1 + b), add = V16_LD(j->k2 + b);
        for (size_t at = pl * plane; at < (pl + 1) * plane; at += 16) {
            vf16 v = (lane16_ld(p, j->x, at, 0xffff) - sub) * mul + add;
            if (j->z) { /* the add's rounding point, then the add */
                if (j->z_round != MGT_PREC_F32)
                    v = (vf16)lane16_widen(j->z_round, lane16_round(j->z_round, (__m512)v));
                v += lane16_ld(p, j->z, at, 0xffff);
            }
            lane16_st(p, j->y, at, j->relu ? (vf16)((vi16)v & ~(v <= 0.0f)) : v, 0xffff);
        }
    }
}

static void bnb_affine_item(void *c, int i, int t)
{
    const bnb_job *j = c;
    bool relu = j->relu;
    size_t lo, hi, plane = j->hw * 16;
    size_t span = j->p16 == MGT_PREC_F32 ? plane : BNB_SPAN;
    item_range((size_t)j->n * j->cb, j->units, i, &lo, &hi);
    if (j->lanes) {
        bnb_affine_lanes(j, lo, hi);
        return;
    }
    for (size_t pl = lo; pl < hi; pl++) {
        size_t b = pl % (size_t)j->cb;
        vf sub[4], mul[4], add[4];
        v_ld4(sub, j->k0 + b * 16);
        v_ld4(mul, j->k1 + b * 16);
        v_ld4(add, j->k2 + b * 16);
        for (size_t e0 = 0; e0 < plane; e0 += span) {
            size_t n = min_z(span, plane - e0), off = pl * plane + e0;
            const float *x = bnb_in(j, j->x, off, bnb_tile(j, t, 0), n);
            const float *z = j->z ? bnb_in(j, j->z, off, bnb_tile(j, t, 2), n) : NULL;
            float *y = j->p16 == MGT_PREC_F32 ? j->y + off : bnb_tile(j, t, 1);
            if (z) { /* a fused residual: the lanes' operations, one element at a time */
                for (size_t e = 0; e < n; e++) {
                    size_t ch = b * 16 + e % 16;
                    float f = (x[e] - j->k0[ch]) * j->k1[ch] + j->k2[ch];
                    f = mgt_lowp_round(j->z_round, f) + z[e];
                    y[e] = relu && f <= 0.0f ? 0.0f : f;
                }
            } else {
                for (size_t e = 0; e < n; e += 16)
                    for (int q = 0; q < 4; q++) {
                        vf v = (vld(x + e + 4 * q) - sub[q]) * mul[q] + add[q];
                        vst(y + e + 4 * q, relu ? (vf)((vi)v & ~(v <= 0.0f)) : v);
                    }
            }
            if (j->p16 != MGT_PREC_F32)
                cpu16_round(j->p16, y, (uint16_t *)(void *)j->y + off, n);
        }
    }
}

/* The elementwise pass of the backward: dx = k1 * (dy - k2 - (x - k0) * kx), kx in shift, dy
   masked by a folded ReLU's output. */
LANE16 static void bnb_dx_lanes(const bnb_job *j, size_t lo, size_t hi)
{
    mgt_precision p = j->p16;
    size_t plane = j->hw * 16;
    for (size_t pl = lo; pl < hi; pl++) {
        size_t b = pl % (size_t)j->cb * 16;
        vf16 fm = V16_LD(j->k0 + b), k = V16_LD(j->k1 + b), mdy = V16_LD(j->k2 + b),
             kx = V16_LD(j->shift + b);
        for (size_t at = pl * plane; at < (pl + 1) * plane; at += 16) {
            vf16 dy = lane16_ld(p, j->dy, at, 0xffff);
            if (j->ymask)
                dy = (vf16)((vi16)dy & (lane16_ld(p, j->ymask, at, 0xffff) > 0.0f));
            vf16 x = lane16_ld(p, j->x, at, 0xffff);
            if (j->dz) /* after every read of dy: dz may be dy */
                lane16_st(p, j->dz, at, dy, 0xffff);
            lane16_st(p, j->y, at, k * (dy - mdy - (x - fm) * kx), 0xffff);
        }
    }
}

static void bnb_dx_item(void *c, int i, int t)
{
    const bnb_job *j = c;
    size_t lo, hi, plane = j->hw * 16;
    size_t span = j->p16 == MGT_PREC_F32 ? plane : BNB_SPAN;
    item_range((size_t)j->n * j->cb, j->units, i, &lo, &hi);
    if (j->lanes) {
        bnb_dx_lanes(j, lo, hi);
        return;
    }
    for (size_t pl = lo; pl < hi; pl++) {
        size_t b = pl % (size_t)j->cb;
        vf fm[4], k[4], mdy[4], kx[4];
        v_ld4(fm, j->k0 + b * 16);
        v_ld4(k, j->k1 + b * 16);
        v_ld4(mdy, j->k2 + b * 16);
        v_ld4(kx, j->shift + b * 16);
        for (size_t e0 = 0; e0 < plane; e0 += span) {
            size_t n = min_z(span, plane - e0), off = pl * plane + e0;
            /* the output tile is x's once x is read (each element is read before written) */
            float *xt = bnb_tile(j, t, 0);
            const float *x = bnb_in(j, j->x, off, xt, n);
            const float *dy = bnb_in(j, j->dy, off, bnb_tile(j, t, 1), n);
            const float *ym = bnb_in(j, j->ymask, off, bnb_tile(j, t, 2), n);
            float *dx = j->p16 == MGT_PREC_F32 ? j->y + off : xt;
            for (size_t e = 0; e < n; e += 16)
                for (int q = 0; q < 4; q++) {
                    size_t at = e + 4 * (size_t)q;
                    vst(dx + at,
                        k[q] * (v_relu_dy(dy, ym, at) - mdy[q] - (vld(x + at) - fm[q]) * kx[q]));
                }
            if (j->p16 != MGT_PREC_F32)
                cpu16_round(j->p16, dx, (uint16_t *)(void *)j->y + off, n);
            if (j->dz) { /* the masked dy, after the span's every read of dy (dz may be dy) */
                float *mz = j->p16 == MGT_PREC_F32 ? j->dz + off : (float *)dy;
                for (size_t e = 0; e < n; e++)
                    mz[e] = relu_dy(dy, ym, e);
                if (j->p16 != MGT_PREC_F32)
                    cpu16_round(j->p16, mz, (uint16_t *)(void *)j->dz + off, n);
            }
        }
    }
}

/* A blocked batch-norm op's job over x, dy (backward; else NULL) and y (or dx), with its scratch:
   the images' sums, then four [c] float arrays. */
static mgt_status bnb_setup(cpu_ctx *ctx, const mgt_op *op, const mgt_bn_shape *sh, const float *x,
                            const float *dy, float *y, bnb_job *j)
{
    int parts = bnb_parts(sh->n), cb = sh->c / 16;
    size_t c = (size_t)sh->c, sum_floats = (size_t)sh->n * 2 * c * 2; /* doubles */
    mgt_precision p16 = mgt_op_store16(op);
    size_t tiles_at = align_up(sum_floats + 4 * c);
    size_t tiles = p16 == MGT_PREC_F32 ? 0 : (size_t)pool_threads(ctx) * 3 * BNB_TILE;
    mgt_status st = cpu_scratch_ensure(ctx, op, tiles_at + tiles);
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
                   .z = op->kind == MGT_OP_BN_FWD_TRAIN  ? op->u.bn_train.z
                        : op->kind == MGT_OP_BN_FWD_EVAL ? op->u.bn_eval.z
                                                         : NULL,
                   .z_round = op->kind == MGT_OP_BN_FWD_TRAIN  ? op->u.bn_train.z_round
                              : op->kind == MGT_OP_BN_FWD_EVAL ? op->u.bn_eval.z_round
                                                               : MGT_PREC_F32,
                   .dz = op->kind == MGT_OP_BN_BWD ? op->u.bn_bwd.dz : NULL,
                   .sums = (double *)ctx->scratch,
                   .shift = f,
                   .k0 = f + c,
                   .k1 = f + 2 * c,
                   .k2 = f + 3 * c,
                   .units = units_per_item((size_t)sh->hw * 16),
                   .lanes = lane16_on(ctx),
                   .p16 = p16,
                   .tiles = ctx->scratch + tiles_at};
    return MGT_OK;
}

/* bn_train's statistics and update as bn_train_item has them, per channel, from the sums. */
static mgt_status run_bn_train_blocked(cpu_ctx *ctx, const mgt_op *op)
{
    const mgt_bn_train_args *b = &op->u.bn_train;
    bnb_job j;
    mgt_status st = bnb_setup(ctx, op, &b->sh, b->x, NULL, b->y, &j);
    if (st != MGT_OK)
        return st;
    float *shift = (float *)j.shift;
    for (int ch = 0; ch < b->sh.c; ch++) /* each channel's first value, as bn_train_item */
        shift[ch] =
            *bnb_in(&j, b->x, mgt_layout_at(MGT_LAYOUT_NCHW16C, b->sh.c, b->sh.hw, 0, ch, 0),
                    shift + ch, 1);
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

static mgt_status run_bn_eval_blocked(cpu_ctx *ctx, const mgt_op *op)
{
    const mgt_bn_eval_args *b = &op->u.bn_eval;
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

static mgt_status run_bn_bwd_blocked(cpu_ctx *ctx, const mgt_op *op)
{
    const mgt_bn_bwd_args *b = &op->u.bn_bwd;
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
    const mgt_lnc_fwd_args *a = &j->op->u.lnc_fwd;
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
    const mgt_lnc_bwd_args *a = &j->op->u.lnc_bwd;
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

mgt_status cpu_bn_train(cpu_ctx *ctx, const mgt_op *op)
{
    if (op->u.bn_train.sh.layout == MGT_LAYOUT_NCHW16C)
        return run_bn_train_blocked(ctx, op);
    bnp_job j;
    mgt_status st = bnp_setup(ctx, op, op->u.bn_train.sh.hw, &j);
    if (st == MGT_OK)
        POOL_FOR(ctx, op->u.bn_train.sh.c, bn_train_item, &j);
    return st;
}

mgt_status cpu_bn_eval(cpu_ctx *ctx, const mgt_op *op)
{
    if (op->u.bn_eval.sh.layout == MGT_LAYOUT_NCHW16C)
        return run_bn_eval_blocked(ctx, op);
    bnp_job j;
    mgt_status st = bnp_setup(ctx, op, op->u.bn_eval.sh.hw, &j);
    if (st == MGT_OK)
        POOL_FOR(ctx, items_of((size_t)op->u.bn_eval.sh.n * op->u.bn_eval.sh.c, j.units),
                 bn_eval_item, &j);
    return st;
}

mgt_status cpu_bn_bwd(cpu_ctx *ctx, const mgt_op *op)
{
    if (op->u.bn_bwd.sh.layout == MGT_LAYOUT_NCHW16C)
        return run_bn_bwd_blocked(ctx, op);
    bnp_job j;
    mgt_status st = bnp_setup(ctx, op, op->u.bn_bwd.sh.hw, &j);
    if (st != MGT_OK)
        return st;
    POOL_FOR(ctx, op->u.bn_bwd.sh.c, bn_bwd_item, &j);
    return MGT_OK;
}

mgt_status cpu_bn_stats(cpu_ctx *ctx, const mgt_op *op)
{
    POOL_FOR(ctx, op->u.bn_stats.sh.c, bn_stats_item, op);
    return MGT_OK;
}

mgt_status cpu_bn_bwd_elemt(cpu_ctx *ctx, const mgt_op *op)
{
    POOL_FOR(ctx, op->u.bn_bwd_elemt.sh.c, bn_bwd_elemt_item, op);
    return MGT_OK;
}

static mgt_status run_lnc(cpu_ctx *ctx, const mgt_op *op, int n, int c, int hw)
{
    lnc_job j = {op, malloc((size_t)n * lnc_scratch_per_image(c, hw) * sizeof(double))};
    if (!j.scratch)
        return mgt_error_set(MGT_ERR_OOM, "%s: out of host memory", mgt_op_name(op->kind));
    POOL_FOR(ctx, n, op->kind == MGT_OP_LNC_FWD ? lnc_fwd_item : lnc_bwd_item, &j);
    if (op->kind == MGT_OP_LNC_BWD) {
        const mgt_lnc_bwd_args *a = &op->u.lnc_bwd;
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

mgt_status cpu_lnc_fwd(cpu_ctx *ctx, const mgt_op *op)
{
    if (op->u.lnc_fwd.hw == 1)
        return cpu_ln_rows_fwd(ctx, op);
    return run_lnc(ctx, op, op->u.lnc_fwd.n, op->u.lnc_fwd.c, op->u.lnc_fwd.hw);
}

mgt_status cpu_lnc_bwd(cpu_ctx *ctx, const mgt_op *op)
{
    if (op->u.lnc_bwd.hw == 1)
        return cpu_ln_rows_bwd(ctx, op);
    return run_lnc(ctx, op, op->u.lnc_bwd.n, op->u.lnc_bwd.c, op->u.lnc_bwd.hw);
}
