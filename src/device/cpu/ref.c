/* The reference every backend is held to: each op as plain single-threaded loops on host memory. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "device/lowp.h"
#include "device/op.h"

/* Loops favour being read against the header over speed: one output element at a time, sums
   in double, every index spelled out. A backend that disagrees with this file is wrong. */

/* beta == 0 means "overwrite": the old value is not read, so garbage or NaN there is harmless,
   as with BLAS and cuDNN. */
static float with_beta(double v, float beta, float old)
{
    return beta == 0.0f ? (float)v : (float)(v + (double)beta * old);
}

/* A gemm or convolution in a 16-bit precision is the fp32 op on inputs rounded to the 16-bit
   format: the product of two bf16 or two fp16 values is exact in fp32, so rounding the inputs
   and multiplying in (here: double) precision is the whole of the arithmetic difference. */
static mgt_status ref_lowp(const mgt_op *op, mgt_status (*fp32)(const mgt_op *op))
{
    mgt_op f = *op;
    f.prec = MGT_PREC_F32;
    mgt_precision prec = op->prec;
    mgt_operand ops[MGT_OP_MAX_OPERANDS];
    float *copies[MGT_OP_MAX_OPERANDS] = {0};
    int n = mgt_op_operands(&f, ops);
    mgt_status st = MGT_OK;
    for (int i = 0; i < n && st == MGT_OK; i++) {
        if (ops[i].role != MGT_OPERAND_IN)
            continue;
        const float *src = *ops[i].ptr;
        copies[i] = malloc(ops[i].count * sizeof(float));
        if (!copies[i]) {
            st = mgt_error_set(MGT_ERR_OOM, "reference: %s: no memory for a rounded copy of %s",
                               mgt_op_name(op->kind), ops[i].name);
            break;
        }
        for (size_t k = 0; k < ops[i].count; k++)
            copies[i][k] = mgt_lowp_round(prec, src[k]);
        *ops[i].ptr = copies[i];
    }
    if (st == MGT_OK)
        st = fp32(&f);
    for (int i = 0; i < n; i++)
        free(copies[i]);
    return st;
}

static mgt_status ref_gemm(const mgt_op *op)
{
    if (op->prec != MGT_PREC_F32)
        return ref_lowp(op, ref_gemm);
    const mgt_gemm_args *g = &op->u.gemm;
    for (int i = 0; i < g->m; i++) {
        for (int j = 0; j < g->n; j++) {
            double acc = 0.0;
            for (int p = 0; p < g->k; p++) {
                float a = g->trans_a ? g->a[(size_t)p * g->lda + i] : g->a[(size_t)i * g->lda + p];
                float b = g->trans_b ? g->b[(size_t)j * g->ldb + p] : g->b[(size_t)p * g->ldb + j];
                acc += (double)a * b;
            }
            float *c = &g->c[(size_t)i * g->ldc + j];
            *c = with_beta((double)g->alpha * acc, g->beta, *c);
        }
    }
    return MGT_OK;
}

/* Index helpers for NCHW tensors and KCRS filters. */
static size_t at4(int d1, int d2, int d3, int i0, int i1, int i2, int i3)
{
    return (((size_t)i0 * d1 + i1) * d2 + i2) * d3 + i3;
}

/* The outputs o in [0, O) whose tap t (stride st, padding pad) reads an input index inside
   [0, I): [*o0, *o1), empty where none does. */
static void conv_tap_range(int O, int I, int st, int pad, int t, int *o0, int *o1)
{
    int lo = pad - t, hi = I - 1 + pad - t; /* o * st must lie in [lo, hi] */
    int a = lo > 0 ? (lo + st - 1) / st : 0, b = hi < 0 ? 0 : hi / st + 1;
    *o0 = a;
    *o1 = b < O ? (b > a ? b : a) : (O > a ? O : a);
}

/* The taps t in [0, T) that output o reads inside [0, I): [*t0, *t1). */
static void conv_out_taps(int T, int I, int st, int pad, int o, int *t0, int *t1)
{
    int i0 = o * st - pad;
    *t0 = i0 < 0 ? -i0 : 0;
    *t1 = I - i0 < T ? I - i0 : T;
    if (*t1 < *t0)
        *t1 = *t0;
}

/* For each input index i in [0, I) and tap t in [0, T): the output index o with
   o * st - pad + t == i inside [0, O), else -1, at tab[i * T + t]. */
static void conv_input_taps(int I, int T, int st, int pad, int O, int *tab)
{
    for (int i = 0; i < I; i++)
        for (int t = 0; t < T; t++) {
            int d = i + pad - t;
            tab[i * T + t] = d < 0 || d % st || d / st >= O ? -1 : d / st;
        }
}

/* Each sum runs over the same terms in the same order as the plain loops with a bounds test
   per term would (so the same bits): the valid taps and outputs are found once per row, and
   an activation's element is its (n, c) base plus the pixel's offset times the layout's pixel
   step. */
static mgt_status ref_conv_fwd(const mgt_op *op)
{
    const mgt_conv2d_shape *sh = &op->u.conv.sh;
    const float *x = op->u.conv.in1, *w = op->u.conv.in2;
    float *y = op->u.conv.out;
    int P = mgt_conv2d_out_h(sh), Q = mgt_conv2d_out_w(sh);
    int cpg = sh->c / sh->groups, kpg = sh->k / sh->groups;
    size_t xs = mgt_layout_pixel_step(sh->x_layout, sh->c);
    size_t ys = mgt_layout_pixel_step(sh->y_layout, sh->k);
    for (int n = 0; n < sh->n; n++)
        for (int k = 0; k < sh->k; k++) {
            int g = k / kpg;
            size_t yb = mgt_layout_at(sh->y_layout, sh->k, P * Q, n, k, 0);
            for (int p = 0; p < P; p++) {
                int r0, r1, ih0 = p * sh->stride_h - sh->pad_h;
                conv_out_taps(sh->r, sh->h, sh->stride_h, sh->pad_h, p, &r0, &r1);
                for (int q = 0; q < Q; q++) {
                    int s0, s1, iw0 = q * sh->stride_w - sh->pad_w;
                    conv_out_taps(sh->s, sh->w, sh->stride_w, sh->pad_w, q, &s0, &s1);
                    double acc = 0.0;
                    for (int cg = 0; cg < cpg; cg++) {
                        size_t xb =
                            mgt_layout_at(sh->x_layout, sh->c, sh->h * sh->w, n, g * cpg + cg, 0);
                        const float *wk = w + at4(cpg, sh->r, sh->s, k, cg, 0, 0);
                        for (int r = r0; r < r1; r++) {
                            size_t row = (size_t)(ih0 + r) * (size_t)sh->w;
                            for (int s = s0; s < s1; s++)
                                acc += (double)x[xb + (row + (size_t)(iw0 + s)) * xs] *
                                       wk[r * sh->s + s];
                        }
                    }
                    float *o = &y[yb + ((size_t)p * (size_t)Q + (size_t)q) * ys];
                    *o = with_beta(acc, op->u.conv.beta, *o);
                }
            }
        }
    return MGT_OK;
}

/* The transpose of the forward, written as a gather: each input pixel sums the outputs whose
   window covered it (tap r of output p reads row p * stride - pad + r). */
static mgt_status ref_conv_bwd_data(const mgt_op *op)
{
    const mgt_conv2d_shape *sh = &op->u.conv.sh;
    const float *dy = op->u.conv.in1, *w = op->u.conv.in2;
    float *dx = op->u.conv.out;
    int P = mgt_conv2d_out_h(sh), Q = mgt_conv2d_out_w(sh);
    int cpg = sh->c / sh->groups, kpg = sh->k / sh->groups;
    size_t xs = mgt_layout_pixel_step(sh->x_layout, sh->c);
    size_t ys = mgt_layout_pixel_step(sh->y_layout, sh->k);
    /* per input row (column) and tap: the output row (column) it reads, -1 where none */
    int *rows =
        malloc(((size_t)sh->h * (size_t)sh->r + (size_t)sh->w * (size_t)sh->s) * sizeof *rows);
    if (!rows)
        return mgt_error_set(MGT_ERR_OOM, "reference conv2d: out of host memory");
    int *cols = rows + (size_t)sh->h * (size_t)sh->r;
    conv_input_taps(sh->h, sh->r, sh->stride_h, sh->pad_h, P, rows);
    conv_input_taps(sh->w, sh->s, sh->stride_w, sh->pad_w, Q, cols);
    for (int n = 0; n < sh->n; n++)
        for (int c = 0; c < sh->c; c++) {
            int g = c / cpg, cg = c % cpg;
            size_t xb = mgt_layout_at(sh->x_layout, sh->c, sh->h * sh->w, n, c, 0);
            for (int ih = 0; ih < sh->h; ih++) {
                const int *pr = rows + (size_t)ih * (size_t)sh->r;
                for (int iw = 0; iw < sh->w; iw++) {
                    const int *qs = cols + (size_t)iw * (size_t)sh->s;
                    double acc = 0.0;
                    for (int k = g * kpg; k < (g + 1) * kpg; k++) {
                        size_t yb = mgt_layout_at(sh->y_layout, sh->k, P * Q, n, k, 0);
                        const float *wk = w + at4(cpg, sh->r, sh->s, k, cg, 0, 0);
                        for (int r = 0; r < sh->r; r++) {
                            if (pr[r] < 0)
                                continue;
                            size_t row = (size_t)pr[r] * (size_t)Q;
                            for (int s = 0; s < sh->s; s++)
                                if (qs[s] >= 0)
                                    acc += (double)dy[yb + (row + (size_t)qs[s]) * ys] *
                                           wk[r * sh->s + s];
                        }
                    }
                    float *o = &dx[xb + ((size_t)ih * (size_t)sh->w + (size_t)iw) * xs];
                    *o = with_beta(acc, op->u.conv.beta, *o);
                }
            }
        }
    free(rows);
    return MGT_OK;
}

static mgt_status ref_conv_bwd_filter(const mgt_op *op)
{
    const mgt_conv2d_shape *sh = &op->u.conv.sh;
    const float *dy = op->u.conv.in1, *x = op->u.conv.in2;
    float *dw = op->u.conv.out;
    int P = mgt_conv2d_out_h(sh), Q = mgt_conv2d_out_w(sh);
    int cpg = sh->c / sh->groups, kpg = sh->k / sh->groups;
    size_t xs = mgt_layout_pixel_step(sh->x_layout, sh->c);
    size_t ys = mgt_layout_pixel_step(sh->y_layout, sh->k);
    for (int k = 0; k < sh->k; k++) {
        int g = k / kpg;
        for (int cg = 0; cg < cpg; cg++)
            for (int r = 0; r < sh->r; r++) {
                int p0, p1;
                conv_tap_range(P, sh->h, sh->stride_h, sh->pad_h, r, &p0, &p1);
                for (int s = 0; s < sh->s; s++) {
                    int q0, q1;
                    conv_tap_range(Q, sh->w, sh->stride_w, sh->pad_w, s, &q0, &q1);
                    double acc = 0.0;
                    for (int n = 0; n < sh->n; n++) {
                        size_t yb = mgt_layout_at(sh->y_layout, sh->k, P * Q, n, k, 0);
                        size_t xb =
                            mgt_layout_at(sh->x_layout, sh->c, sh->h * sh->w, n, g * cpg + cg, 0);
                        for (int p = p0; p < p1; p++) {
                            size_t yrow = (size_t)p * (size_t)Q;
                            size_t xrow =
                                (size_t)(p * sh->stride_h - sh->pad_h + r) * (size_t)sh->w;
                            for (int q = q0; q < q1; q++)
                                acc += (double)dy[yb + (yrow + (size_t)q) * ys] *
                                       x[xb +
                                         (xrow + (size_t)(q * sh->stride_w - sh->pad_w + s)) * xs];
                        }
                    }
                    float *o = &dw[at4(cpg, sh->r, sh->s, k, cg, r, s)];
                    *o = with_beta(acc, op->u.conv.beta, *o);
                }
            }
    }
    return MGT_OK;
}

/* The pass the kind says, in the op's precision. */
static mgt_status ref_conv2d(const mgt_op *op)
{
    if (op->prec != MGT_PREC_F32)
        return ref_lowp(op, ref_conv2d);
    return op->kind == MGT_OP_CONV2D_FWD        ? ref_conv_fwd(op)
           : op->kind == MGT_OP_CONV2D_BWD_DATA ? ref_conv_bwd_data(op)
                                                : ref_conv_bwd_filter(op);
}

/* Element i of channel c in an [n, c, hw] tensor. */
static size_t bn_at(const mgt_bn_shape *sh, int n, int c, int i)
{
    return mgt_layout_at(sh->layout, sh->c, sh->hw, n, c, i);
}

/* A folded ReLU (sh.relu): relu's forward over bn's output (plus a fused residual z[j],
   added after bn's output is rounded as its storage would round it), and the gradient bn
   sees. */
static float bn_out(const mgt_bn_shape *sh, double v, const float *z, mgt_precision zr, size_t j)
{
    float f = (float)v;
    if (z)
        f = mgt_lowp_round(zr, f) + z[j];
    return sh->relu && !(f > 0.0f || isnan(f)) ? 0.0f : f;
}

static double bn_dy(const mgt_op *op, size_t j)
{
    const mgt_bn_bwd_args *b = &op->u.bn_bwd;
    return b->sh.relu && !(b->y[j] > 0.0f) ? 0.0 : b->dy[j];
}

static mgt_status ref_bn_train(const mgt_op *op)
{
    const mgt_bn_train_args *b = &op->u.bn_train;
    const mgt_bn_shape *sh = &b->sh;
    double m = (double)sh->n * sh->hw;
    for (int c = 0; c < sh->c; c++) {
        /* Two passes: the mean first, then squared deviations, so a large mean costs no
           precision. */
        double sum = 0.0;
        for (int n = 0; n < sh->n; n++)
            for (int i = 0; i < sh->hw; i++)
                sum += b->x[bn_at(sh, n, c, i)];
        double mean = sum / m;
        double ss = 0.0;
        for (int n = 0; n < sh->n; n++)
            for (int i = 0; i < sh->hw; i++) {
                double d = b->x[bn_at(sh, n, c, i)] - mean;
                ss += d * d;
            }
        double var = ss / m; /* biased: what normalises */
        double invstd = 1.0 / sqrt(var + sh->eps);
        for (int n = 0; n < sh->n; n++)
            for (int i = 0; i < sh->hw; i++) {
                size_t j = bn_at(sh, n, c, i);
                b->y[j] = bn_out(sh, b->gamma[c] * (b->x[j] - mean) * invstd + b->beta[c], b->z,
                                 b->z_round, j);
            }
        b->save_mean[c] = (float)mean;
        b->save_invstd[c] = (float)invstd;
        double mom = sh->momentum;
        b->running_mean[c] = (float)((1.0 - mom) * b->running_mean[c] + mom * mean);
        b->running_var[c] = (float)((1.0 - mom) * b->running_var[c] + mom * ss / (m - 1.0));
    }
    return MGT_OK;
}

static mgt_status ref_bn_eval(const mgt_op *op)
{
    const mgt_bn_eval_args *b = &op->u.bn_eval;
    const mgt_bn_shape *sh = &b->sh;
    for (int c = 0; c < sh->c; c++) {
        double invstd = 1.0 / sqrt((double)b->running_var[c] + sh->eps);
        for (int n = 0; n < sh->n; n++)
            for (int i = 0; i < sh->hw; i++) {
                size_t j = bn_at(sh, n, c, i);
                b->y[j] = bn_out(
                    sh, b->gamma[c] * ((double)b->x[j] - b->running_mean[c]) * invstd + b->beta[c],
                    b->z, b->z_round, j);
            }
    }
    return MGT_OK;
}

/* With xhat = (x - mean) * invstd and m values per channel:
   dbeta = sum dy, dgamma = sum dy*xhat,
   dx = gamma * invstd / m * (m*dy - dbeta - xhat*dgamma) (this batch's sums, not the
   accumulated outputs). */
static mgt_status ref_bn_bwd(const mgt_op *op)
{
    const mgt_bn_bwd_args *b = &op->u.bn_bwd;
    const mgt_bn_shape *sh = &b->sh;
    double m = (double)sh->n * sh->hw;
    for (int c = 0; c < sh->c; c++) {
        double mean = b->save_mean[c], invstd = b->save_invstd[c];
        double sdy = 0.0, sdyx = 0.0;
        for (int n = 0; n < sh->n; n++)
            for (int i = 0; i < sh->hw; i++) {
                size_t j = bn_at(sh, n, c, i);
                double g = bn_dy(op, j);
                sdy += g;
                sdyx += g * ((b->x[j] - mean) * invstd);
            }
        for (int n = 0; n < sh->n; n++)
            for (int i = 0; i < sh->hw; i++) {
                size_t j = bn_at(sh, n, c, i);
                double xhat = (b->x[j] - mean) * invstd;
                b->dx[j] =
                    (float)(b->gamma[c] * invstd / m * (m * bn_dy(op, j) - sdy - xhat * sdyx));
                if (b->dz) /* after every read of dy[j]: dz may be dy */
                    b->dz[j] = (float)bn_dy(op, j);
            }
        b->dgamma[c] = (float)(b->dgamma[c] + sdyx);
        b->dbeta[c] = (float)(b->dbeta[c] + sdy);
    }
    return MGT_OK;
}

/* One shard's per-channel mean and biased variance, two passes in double as bn_train. */
static mgt_status ref_bn_stats(const mgt_op *op)
{
    const mgt_bn_stats_args *b = &op->u.bn_stats;
    const mgt_bn_shape *sh = &b->sh;
    double m = (double)sh->n * sh->hw;
    for (int c = 0; c < sh->c; c++) {
        double sum = 0.0;
        for (int n = 0; n < sh->n; n++)
            for (int i = 0; i < sh->hw; i++)
                sum += b->x[bn_at(sh, n, c, i)];
        double mean = sum / m, ss = 0.0;
        for (int n = 0; n < sh->n; n++)
            for (int i = 0; i < sh->hw; i++) {
                double d = b->x[bn_at(sh, n, c, i)] - mean;
                ss += d * d;
            }
        b->mean[c] = (float)mean;
        b->var[c] = (float)(ss / m);
    }
    return MGT_OK;
}

/* bn_bwd's dx with sums and a count given (every shard's): with xhat = (x - mean) * invstd,
   dx = gamma * invstd / count * (count*dy - sum_dy - xhat*sum_dy_xhat). */
static mgt_status ref_bn_bwd_elemt(const mgt_op *op)
{
    const mgt_bn_bwd_elemt_args *b = &op->u.bn_bwd_elemt;
    const mgt_bn_shape *sh = &b->sh;
    double m = b->count;
    for (int c = 0; c < sh->c; c++) {
        double mean = b->mean[c], invstd = b->invstd[c];
        for (int n = 0; n < sh->n; n++)
            for (int i = 0; i < sh->hw; i++) {
                size_t j = bn_at(sh, n, c, i);
                double xhat = (b->x[j] - mean) * invstd;
                b->dx[j] = (float)(b->gamma[c] * invstd / m *
                                   (m * b->dy[j] - b->sum_dy[c] - xhat * b->sum_dy_xhat[c]));
            }
    }
    return MGT_OK;
}

/* The window of output (p, q) clipped to the input; -inf padding can never be a window's
   maximum (mgt_op_check keeps every window on real input), so clipping is the padding. The
   maximum is the first in raster order: a later value must be strictly larger to win. */
/* The plane of channel c of image n in a pooling tensor of `pixels` per plane: where its first
   element lies, and the step from one pixel to the next (mgt_layout_pixel_step). */
static size_t pool_plane(const mgt_pool2d_shape *sh, int n, int c, size_t pixels, size_t *step)
{
    *step = mgt_layout_pixel_step(sh->layout, sh->c);
    return mgt_layout_at(sh->layout, sh->c, (int)pixels, n, c, 0);
}

static size_t pool_argmax(const mgt_pool2d_shape *sh, const float *plane, size_t step, int p, int q)
{
    int h0 = p * sh->stride_h - sh->pad_h, w0 = q * sh->stride_w - sh->pad_w;
    size_t best = SIZE_MAX;
    for (int ih = h0; ih < h0 + sh->kh; ih++)
        for (int iw = w0; iw < w0 + sh->kw; iw++) {
            if (ih < 0 || ih >= sh->h || iw < 0 || iw >= sh->w)
                continue;
            size_t j = ((size_t)ih * sh->w + iw) * step;
            if (best == SIZE_MAX || plane[j] > plane[best])
                best = j;
        }
    return best;
}

static mgt_status ref_maxpool_fwd(const mgt_op *op)
{
    const mgt_pool2d_shape *sh = &op->u.maxpool_fwd.sh;
    int P = mgt_pool2d_out_h(sh), Q = mgt_pool2d_out_w(sh);
    size_t plane_in = (size_t)sh->h * sh->w, plane_out = (size_t)P * Q, step;
    for (int n = 0; n < sh->n; n++)
        for (int c = 0; c < sh->c; c++) {
            const float *x = op->u.maxpool_fwd.x + pool_plane(sh, n, c, plane_in, &step);
            float *y = op->u.maxpool_fwd.y + pool_plane(sh, n, c, plane_out, &step);
            for (int p = 0; p < P; p++)
                for (int q = 0; q < Q; q++)
                    y[((size_t)p * Q + q) * step] = x[pool_argmax(sh, x, step, p, q)];
        }
    return MGT_OK;
}

/* The window's winner is found again from x; y is not needed for that and is not read. */
static mgt_status ref_maxpool_bwd(const mgt_op *op)
{
    const mgt_pool2d_shape *sh = &op->u.maxpool_bwd.sh;
    int P = mgt_pool2d_out_h(sh), Q = mgt_pool2d_out_w(sh);
    size_t plane_in = (size_t)sh->h * sh->w, plane_out = (size_t)P * Q, step;
    for (int n = 0; n < sh->n; n++)
        for (int c = 0; c < sh->c; c++) {
            const float *x = op->u.maxpool_bwd.x + pool_plane(sh, n, c, plane_in, &step);
            const float *dy = op->u.maxpool_bwd.dy + pool_plane(sh, n, c, plane_out, &step);
            float *dx = op->u.maxpool_bwd.dx + pool_plane(sh, n, c, plane_in, &step);
            for (size_t j = 0; j < plane_in; j++)
                dx[j * step] = 0.0f;
            for (int p = 0; p < P; p++)
                for (int q = 0; q < Q; q++)
                    dx[pool_argmax(sh, x, step, p, q)] += dy[((size_t)p * Q + q) * step];
        }
    return MGT_OK;
}

/* log(sum exp z), shifted by the row's maximum so that large logits do not overflow exp. */
static double row_logsumexp(const float *z, int classes)
{
    double mx = z[0];
    for (int j = 1; j < classes; j++)
        if (z[j] > mx)
            mx = z[j];
    double s = 0.0;
    for (int j = 0; j < classes; j++)
        s += exp((double)z[j] - mx);
    return mx + log(s);
}

static mgt_status check_labels(mgt_op_kind kind, const int32_t *labels, int n, int classes)
{
    for (int i = 0; i < n; i++)
        if (labels[i] < 0 || labels[i] >= classes)
            return mgt_error_set(MGT_ERR_DEVICE, "%s: label %d out of range [0, %d) at row %d",
                                 mgt_op_name(kind), (int)labels[i], classes, i);
    return MGT_OK;
}

/* Row i's target labels (b_i = a_i, w_i = 1 without labels_b and weights). */
static mgt_status check_targets(mgt_op_kind kind, const int32_t *labels, const int32_t *labels_b,
                                int n, int classes)
{
    mgt_status st = check_labels(kind, labels, n, classes);
    return st == MGT_OK && labels_b ? check_labels(kind, labels_b, n, classes) : st;
}

/* The target t = (1-eps)(w onehot(a) + (1-w) onehot(b)) + eps/C: a row's loss is
   -sum t_j log p_j = (1-eps)(w (lse - z_a) + (1-w)(lse - z_b)) + eps/C * sum_j (lse - z_j). */
static mgt_status ref_xent_fwd(const mgt_op *op)
{
    const mgt_xent_fwd_args *x = &op->u.xent_fwd;
    mgt_status st = check_targets(op->kind, x->labels, x->labels_b, x->n, x->classes);
    if (st != MGT_OK)
        return st;
    double eps = x->smoothing, total = 0.0;
    for (int i = 0; i < x->n; i++) {
        const float *z = x->logits + (size_t)i * x->classes;
        float *pr = x->probs + (size_t)i * x->classes;
        double lse = row_logsumexp(z, x->classes), w = x->weights ? x->weights[i] : 1.0;
        int a = x->labels[i], b = x->labels_b ? x->labels_b[i] : a;
        double smooth = 0.0;
        for (int j = 0; j < x->classes; j++) {
            pr[j] = (float)exp((double)z[j] - lse);
            smooth += lse - z[j];
        }
        total +=
            (1.0 - eps) * (w * (lse - z[a]) + (1.0 - w) * (lse - z[b])) + eps / x->classes * smooth;
    }
    x->loss[0] = (float)(total / x->n);
    return MGT_OK;
}

static mgt_status ref_xent_bwd(const mgt_op *op)
{
    const mgt_xent_bwd_args *x = &op->u.xent_bwd;
    mgt_status st = check_targets(op->kind, x->labels, x->labels_b, x->n, x->classes);
    if (st != MGT_OK)
        return st;
    double eps = x->smoothing;
    for (int i = 0; i < x->n; i++) {
        double w = x->weights ? x->weights[i] : 1.0;
        int a = x->labels[i], b = x->labels_b ? x->labels_b[i] : a;
        for (int j = 0; j < x->classes; j++) {
            size_t ij = (size_t)i * x->classes + j;
            double t =
                eps / x->classes + (1.0 - eps) * ((j == a ? w : 0.0) + (j == b ? 1.0 - w : 0.0));
            x->dlogits[ij] = (float)((double)x->scale * (x->probs[ij] - t));
        }
    }
    return MGT_OK;
}

static mgt_status ref_topk(const mgt_op *op)
{
    const mgt_topk_args *t = &op->u.topk;
    mgt_status st = check_labels(op->kind, t->labels, t->n, t->classes);
    if (st != MGT_OK)
        return st;
    int32_t correct = 0;
    for (int i = 0; i < t->n; i++) {
        const float *z = t->logits + (size_t)i * t->classes;
        int label = t->labels[i];
        /* a NaN or infinite label logit is never correct; a NaN elsewhere ranks above it, as
           torch.topk ranks NaN above every number */
        if (!isfinite(z[label]))
            continue;
        int rank = 0;
        for (int j = 0; j < t->classes; j++)
            if (isnan(z[j]) || z[j] > z[label] || (z[j] == z[label] && j < label))
                rank++;
        if (rank < t->k)
            correct++;
    }
    t->count[0] += correct;
    return MGT_OK;
}

/* In float and in torch.optim.SGD's order of operations, so that it tracks PyTorch step for
   step rather than drifting by a rounding a step. */
static mgt_status ref_sgd(const mgt_op *op)
{
    const mgt_sgd_args *s = &op->u.sgd;
    const mgt_sgd_params *p = &s->p;
    for (size_t i = 0; i < s->n; i++) {
        float d = p->grad_scale * s->grad[i] + p->weight_decay * s->param[i];
        if (p->momentum != 0.0f) {
            float buf;
            if (p->first_step)
                buf = d;
            else
                buf = p->momentum * s->momentum_buf[i] + (1.0f - p->dampening) * d;
            s->momentum_buf[i] = buf;
            d = p->nesterov ? d + p->momentum * buf : buf;
        }
        s->param[i] -= p->lr * d;
    }
    return MGT_OK;
}

/* AdamW and RMSprop in float, in torch's order of operations (see mgt/device.h). */
static mgt_status ref_adamw(const mgt_op *op)
{
    const mgt_adamw_args *a = &op->u.adamw;
    const mgt_adamw_params *p = &a->p;
    for (size_t i = 0; i < a->n; i++) {
        float g = p->grad_scale * a->grad[i];
        float w = a->param[i] * p->decay;
        float m = a->exp_avg[i] * p->beta1 + (1.0f - p->beta1) * g;
        float v = a->exp_avg_sq[i] * p->beta2 + (1.0f - p->beta2) * (g * g);
        a->exp_avg[i] = m;
        a->exp_avg_sq[i] = v;
        float denom = sqrtf(v) / p->bc2_sqrt + p->eps;
        a->param[i] = w + -p->step_size * (m / denom);
    }
    return MGT_OK;
}

static mgt_status ref_rmsprop(const mgt_op *op)
{
    const mgt_rmsprop_args *a = &op->u.rmsprop;
    const mgt_rmsprop_params *p = &a->p;
    for (size_t i = 0; i < a->n; i++) {
        float g = p->grad_scale * a->grad[i] + p->weight_decay * a->param[i];
        float sq = a->square_avg[i] * p->alpha + (1.0f - p->alpha) * (g * g);
        a->square_avg[i] = sq;
        float avg = sqrtf(sq) + p->eps;
        if (p->momentum > 0.0f) {
            float b = a->momentum_buf[i] * p->momentum + g / avg;
            a->momentum_buf[i] = b;
            a->param[i] += -p->lr * b;
        } else {
            a->param[i] += -p->lr * (g / avg);
        }
    }
    return MGT_OK;
}

static mgt_status ref_fill(const mgt_op *op)
{
    for (size_t i = 0; i < op->u.fill.n; i++)
        op->u.fill.x[i] = op->u.fill.value;
    return MGT_OK;
}

static mgt_status ref_scale(const mgt_op *op)
{
    for (size_t i = 0; i < op->u.scale.n; i++)
        op->u.scale.x[i] *= op->u.scale.alpha;
    return MGT_OK;
}

static mgt_status ref_axpy(const mgt_op *op)
{
    for (size_t i = 0; i < op->u.axpy.n; i++)
        op->u.axpy.y[i] += op->u.axpy.alpha * op->u.axpy.x[i];
    return MGT_OK;
}

/* sum, or sum_squares */
static mgt_status ref_sum(const mgt_op *op)
{
    bool squares = op->kind == MGT_OP_SUMSQ;
    double s = 0.0;
    for (size_t i = 0; i < op->u.sum.n; i++)
        s += squares ? (double)op->u.sum.x[i] * op->u.sum.x[i] : op->u.sum.x[i];
    op->u.sum.out[0] = (float)s;
    return MGT_OK;
}

static mgt_status ref_add(const mgt_op *op)
{
    for (size_t i = 0; i < op->u.add.n; i++)
        op->u.add.y[i] = op->u.add.a[i] + op->u.add.b[i];
    return MGT_OK;
}

/* NaN stays NaN, as in torch.relu, so a diverging run still shows in the loss. */
static mgt_status ref_relu_fwd(const mgt_op *op)
{
    for (size_t i = 0; i < op->u.relu_fwd.n; i++) {
        float v = op->u.relu_fwd.x[i];
        op->u.relu_fwd.y[i] = (v > 0.0f || isnan(v)) ? v : 0.0f;
    }
    return MGT_OK;
}

static mgt_status ref_relu_bwd(const mgt_op *op)
{
    for (size_t i = 0; i < op->u.relu_bwd.n; i++)
        op->u.relu_bwd.dx[i] = op->u.relu_bwd.y[i] > 0.0f ? op->u.relu_bwd.dy[i] : 0.0f;
    return MGT_OK;
}

static mgt_status ref_avgpool_fwd(const mgt_op *op)
{
    const mgt_avgpool_fwd_args *a = &op->u.avgpool_fwd;
    for (int n = 0; n < a->n; n++)
        for (int c = 0; c < a->c; c++) {
            double s = 0.0;
            for (int i = 0; i < a->hw; i++)
                s += a->x[mgt_layout_at(a->layout, a->c, a->hw, n, c, i)];
            a->y[(size_t)n * a->c + c] = (float)(s / a->hw);
        }
    return MGT_OK;
}

static mgt_status ref_avgpool_bwd(const mgt_op *op)
{
    const mgt_avgpool_bwd_args *a = &op->u.avgpool_bwd;
    for (int n = 0; n < a->n; n++)
        for (int c = 0; c < a->c; c++)
            for (int i = 0; i < a->hw; i++)
                a->dx[mgt_layout_at(a->layout, a->c, a->hw, n, c, i)] =
                    (float)((double)a->dy[(size_t)n * a->c + c] / a->hw);
    return MGT_OK;
}

static mgt_status ref_bias_fwd(const mgt_op *op)
{
    const mgt_bias_fwd_args *b = &op->u.bias_fwd;
    for (int r = 0; r < b->rows; r++)
        for (int j = 0; j < b->cols; j++)
            b->y[(size_t)r * b->cols + j] += b->bias[j];
    return MGT_OK;
}

static mgt_status ref_bias_bwd(const mgt_op *op)
{
    const mgt_bias_bwd_args *b = &op->u.bias_bwd;
    for (int j = 0; j < b->cols; j++) {
        double s = 0.0;
        for (int r = 0; r < b->rows; r++)
            s += b->dy[(size_t)r * b->cols + j];
        b->dbias[j] = (float)(b->dbias[j] + s);
    }
    return MGT_OK;
}

/* The channel ops visit (image, channel, pixel) in one order whatever the layout (NCHW,
   NHWC: mgt_layout_at), so both layouts compute the same bits. */
static mgt_status ref_chbias_fwd(const mgt_op *op)
{
    const mgt_chbias_fwd_args *b = &op->u.chbias_fwd;
    for (int i = 0; i < b->n; i++)
        for (int ch = 0; ch < b->c; ch++)
            for (int j = 0; j < b->hw; j++)
                b->y[mgt_layout_at(b->layout, b->c, b->hw, i, ch, j)] += b->bias[ch];
    return MGT_OK;
}

static mgt_status ref_chbias_bwd(const mgt_op *op)
{
    const mgt_chbias_bwd_args *b = &op->u.chbias_bwd;
    for (int ch = 0; ch < b->c; ch++) {
        double s = 0.0;
        for (int i = 0; i < b->n; i++)
            for (int j = 0; j < b->hw; j++)
                s += b->dy[mgt_layout_at(b->layout, b->c, b->hw, i, ch, j)];
        b->dbias[ch] = (float)(b->dbias[ch] + s);
    }
    return MGT_OK;
}

static mgt_status ref_dropout(const mgt_op *op)
{
    const mgt_dropout_args *d = &op->u.dropout;
    uint32_t t = mgt_dropout_threshold(d->p);
    float scale = 1.0f / (1.0f - d->p);
    const bool nhwc = d->layout == MGT_LAYOUT_NHWC;
    const size_t hw = nhwc ? d->per_image / (size_t)d->c : 1;
    for (int i = 0; i < d->n; i++)
        for (size_t j = 0; j < d->per_image; j++) { /* j: the NCHW element, the mask's */
            uint32_t w[4];
            mgt_dropout_block(op, i, (uint32_t)(j / 4), w);
            size_t e = (size_t)i * d->per_image + (nhwc ? (j % hw) * (size_t)d->c + j / hw : j);
            d->y[e] = (w[j % 4] >> 8) >= t ? d->x[e] * scale : 0.0f;
        }
    return MGT_OK;
}

/* Element (n, ch, pixel i) of an adaptive pool's input or output: the sums visit the same
   elements in the same order in either layout (NCHW, NHWC), so both compute the same bits. */
static mgt_status ref_apool_fwd(const mgt_op *op)
{
    const mgt_apool_fwd_args *a = &op->u.apool_fwd;
    const int hw = a->h * a->w, ohw = a->oh * a->ow;
    for (int n = 0; n < a->n; n++)
        for (int ch = 0; ch < a->c; ch++)
            for (int i = 0; i < a->oh; i++)
                for (int j = 0; j < a->ow; j++) {
                    int y0, y1, x0, x1;
                    mgt_apool_range(i, a->h, a->oh, &y0, &y1);
                    mgt_apool_range(j, a->w, a->ow, &x0, &x1);
                    double s = 0.0;
                    for (int y = y0; y < y1; y++)
                        for (int xx = x0; xx < x1; xx++)
                            s += a->x[mgt_layout_at(a->layout, a->c, hw, n, ch, y * a->w + xx)];
                    a->y[mgt_layout_at(a->layout, a->c, ohw, n, ch, i * a->ow + j)] =
                        (float)(s / ((y1 - y0) * (x1 - x0)));
                }
    return MGT_OK;
}

static mgt_status ref_apool_bwd(const mgt_op *op)
{
    const mgt_apool_bwd_args *a = &op->u.apool_bwd;
    const int hw = a->h * a->w, ohw = a->oh * a->ow;
    for (int n = 0; n < a->n; n++)
        for (int ch = 0; ch < a->c; ch++) {
            for (int k = 0; k < hw; k++)
                a->dx[mgt_layout_at(a->layout, a->c, hw, n, ch, k)] = 0.0f;
            for (int i = 0; i < a->oh; i++)
                for (int j = 0; j < a->ow; j++) {
                    int y0, y1, x0, x1;
                    mgt_apool_range(i, a->h, a->oh, &y0, &y1);
                    mgt_apool_range(j, a->w, a->ow, &x0, &x1);
                    float g = a->dy[mgt_layout_at(a->layout, a->c, ohw, n, ch, i * a->ow + j)] /
                              (float)((y1 - y0) * (x1 - x0));
                    for (int y = y0; y < y1; y++)
                        for (int xx = x0; xx < x1; xx++)
                            a->dx[mgt_layout_at(a->layout, a->c, hw, n, ch, y * a->w + xx)] += g;
                }
        }
    return MGT_OK;
}

static mgt_status ref_scopy(const mgt_op *op)
{
    const mgt_scopy_args *c = &op->u.scopy;
    bool h = mgt_op_store16(op) != MGT_PREC_F32; /* 16-bit codes, copied as they are */
    for (int i = 0; i < c->n; i++)
        for (int r = 0; r < c->rows; r++)
            for (size_t k = 0; k < c->count; k++) {
                size_t yi = (size_t)i * c->y_stride + (size_t)r * c->y_row + k;
                size_t xi = (size_t)i * c->x_stride + (size_t)r * c->x_row + k;
                if (h)
                    ((uint16_t *)c->y)[yi] = ((const uint16_t *)c->x)[xi];
                else
                    c->y[yi] = c->x[xi];
            }
    return MGT_OK;
}

/* ---- activations: each one's value and derivative (the one torch's backward uses at the
   kinks) in double, straight from its definition, one pair per row of MGT_ACT_LIST; the float
   result is the double one rounded ---- */

static double act_relu6(double x) { return x < 0.0 ? 0.0 : x > 6.0 ? 6.0 : x; }
static double act_relu6_grad(double x) { return x > 0.0 && x < 6.0 ? 1.0 : 0.0; }

static double act_hardsigmoid(double x) { return x <= -3.0 ? 0.0 : x >= 3.0 ? 1.0 : x / 6.0 + 0.5; }
static double act_hardsigmoid_grad(double x) { return x > -3.0 && x < 3.0 ? 1.0 / 6.0 : 0.0; }

static double act_hardswish(double x)
{
    return x <= -3.0 ? 0.0 : x >= 3.0 ? x : x * (x + 3.0) / 6.0;
}
static double act_hardswish_grad(double x)
{
    return x < -3.0 ? 0.0 : x <= 3.0 ? x / 3.0 + 0.5 : 1.0;
}

static double act_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double act_sigmoid_grad(double x)
{
    double sg = act_sigmoid(x);
    return sg * (1.0 - sg);
}

static double act_silu(double x) { return x / (1.0 + exp(-x)); }
static double act_silu_grad(double x)
{
    double sg = act_sigmoid(x);
    return sg * (1.0 + x * (1.0 - sg));
}

static double act_gelu(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }
static double act_gelu_grad(double x)
{
    return 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2.0 * M_PI);
}

static double act_tanh(double x) { return tanh(x); }
static double act_tanh_grad(double x)
{
    double t = tanh(x);
    return 1.0 - t * t;
}

static double ref_act(mgt_act act, double x)
{
    switch (act) {
#define REF_ACT(KIND, name) \
    case MGT_ACT_##KIND: return act_##name(x);
        MGT_ACT_LIST(REF_ACT)
#undef REF_ACT
    case MGT_ACT_COUNT: break;
    }
    return NAN;
}

static double ref_act_grad(mgt_act act, double x)
{
    switch (act) {
#define REF_ACT_GRAD(KIND, name) \
    case MGT_ACT_##KIND: return act_##name##_grad(x);
        MGT_ACT_LIST(REF_ACT_GRAD)
#undef REF_ACT_GRAD
    case MGT_ACT_COUNT: break;
    }
    return NAN;
}

static mgt_status ref_act_fwd(const mgt_op *op)
{
    const mgt_act_fwd_args *a = &op->u.act_fwd;
    for (size_t i = 0; i < a->n; i++)
        a->y[i] = (float)ref_act(a->act, a->x[i]);
    return MGT_OK;
}

static mgt_status ref_act_bwd(const mgt_op *op)
{
    const mgt_act_bwd_args *a = &op->u.act_bwd;
    for (size_t i = 0; i < a->n; i++)
        a->dx[i] = (float)((double)a->dy[i] * ref_act_grad(a->act, a->x[i]));
    return MGT_OK;
}

/* One pixel's mean and 1 / sqrt(var + eps) over its c values (stride hw), in double. */
static void ref_lnc_stats(const float *x, int c, size_t hw, float eps, double *mean, double *rstd)
{
    double m = 0.0, v = 0.0;
    for (int ch = 0; ch < c; ch++)
        m += x[(size_t)ch * hw];
    m /= c;
    for (int ch = 0; ch < c; ch++) {
        double d = x[(size_t)ch * hw] - m;
        v += d * d;
    }
    *mean = m;
    *rstd = 1.0 / sqrt(v / c + (double)eps);
}

/* Pixel j of image i: where its channel 0 lies and the step to the next channel (hw in NCHW,
   1 in NHWC). */
static size_t ref_lnc_pixel(mgt_layout l, int c, size_t hw, int i, size_t j, size_t *step)
{
    *step = l == MGT_LAYOUT_NHWC ? 1 : hw;
    return mgt_layout_at(l, c, (int)hw, i, 0, (int)j);
}

static mgt_status ref_lnc_fwd(const mgt_op *op)
{
    const mgt_lnc_fwd_args *a = &op->u.lnc_fwd;
    size_t hw = (size_t)a->hw;
    for (int i = 0; i < a->n; i++)
        for (size_t j = 0; j < hw; j++) {
            size_t step, base = ref_lnc_pixel(a->layout, a->c, hw, i, j, &step);
            double m, rs;
            ref_lnc_stats(a->x + base, a->c, step, a->eps, &m, &rs);
            for (int ch = 0; ch < a->c; ch++) {
                size_t e = base + (size_t)ch * step;
                a->y[e] = (float)((a->x[e] - m) * rs * a->weight[ch] + a->bias[ch]);
            }
        }
    return MGT_OK;
}

static mgt_status ref_lnc_bwd(const mgt_op *op)
{
    const mgt_lnc_bwd_args *a = &op->u.lnc_bwd;
    size_t hw = (size_t)a->hw;
    for (int ch = 0; ch < a->c; ch++) {
        double sw = 0.0, sb = 0.0;
        for (int i = 0; i < a->n; i++)
            for (size_t j = 0; j < hw; j++) {
                size_t step, base = ref_lnc_pixel(a->layout, a->c, hw, i, j, &step);
                size_t e = base + (size_t)ch * step;
                double m, rs;
                ref_lnc_stats(a->x + base, a->c, step, a->eps, &m, &rs);
                sw += (double)a->dy[e] * (a->x[e] - m) * rs;
                sb += a->dy[e];
            }
        a->dweight[ch] += (float)sw;
        a->dbias[ch] += (float)sb;
    }
    for (int i = 0; i < a->n; i++)
        for (size_t j = 0; j < hw; j++) {
            size_t step, base = ref_lnc_pixel(a->layout, a->c, hw, i, j, &step);
            double m, rs, mg = 0.0, mgx = 0.0;
            ref_lnc_stats(a->x + base, a->c, step, a->eps, &m, &rs);
            for (int ch = 0; ch < a->c; ch++) {
                size_t e = base + (size_t)ch * step;
                double g = (double)a->dy[e] * a->weight[ch];
                mg += g;
                mgx += g * (a->x[e] - m) * rs;
            }
            mg /= a->c;
            mgx /= a->c;
            for (int ch = 0; ch < a->c; ch++) {
                size_t e = base + (size_t)ch * step;
                double g = (double)a->dy[e] * a->weight[ch];
                a->dx[e] = (float)(rs * (g - mg - (a->x[e] - m) * rs * mgx));
            }
        }
    return MGT_OK;
}

static mgt_status ref_chscale_fwd(const mgt_op *op)
{
    const mgt_chscale_fwd_args *a = &op->u.chscale_fwd;
    for (int i = 0; i < a->n; i++)
        for (int ch = 0; ch < a->c; ch++) {
            float sc = a->scale[(a->shared ? 0 : (size_t)i * a->c) + ch];
            for (int j = 0; j < a->hw; j++) {
                size_t e = mgt_layout_at(a->layout, a->c, a->hw, i, ch, j);
                a->y[e] = a->x[e] * sc;
            }
        }
    return MGT_OK;
}

static mgt_status ref_chscale_bwd(const mgt_op *op)
{
    const mgt_chscale_bwd_args *a = &op->u.chscale_bwd;
    for (int ch = 0; ch < a->c; ch++) {
        double shared_sum = 0.0;
        for (int i = 0; i < a->n; i++) {
            size_t si = (a->shared ? 0 : (size_t)i * a->c) + ch;
            double sum = 0.0;
            float sc = a->scale[si];
            for (int j = 0; j < a->hw; j++) {
                size_t e = mgt_layout_at(a->layout, a->c, a->hw, i, ch, j);
                if (a->dscale)
                    sum += (double)a->dy[e] * a->x[e];
                a->dx[e] = a->dy[e] * sc;
            }
            if (a->dscale && !a->shared)
                a->dscale[si] = (float)sum;
            shared_sum += sum;
        }
        if (a->dscale && a->shared)
            a->dscale[ch] = (float)(a->dscale[ch] + shared_sum);
    }
    return MGT_OK;
}

/* ---- mixed precision ---- */

static mgt_status ref_cast(const mgt_op *op)
{
    const mgt_cast_args *c = &op->u.cast;
    if (op->kind == MGT_OP_CAST_TO_16) {
        const float *x = c->src;
        uint16_t *h = c->dst;
        for (size_t i = 0; i < c->n; i++)
            h[i] = mgt_lowp_encode(op->prec, x[i]);
    } else {
        const uint16_t *h = c->src;
        float *x = c->dst;
        for (size_t i = 0; i < c->n; i++)
            x[i] = mgt_lowp_decode(op->prec, h[i]);
    }
    return MGT_OK;
}

static mgt_status ref_nonfinite(const mgt_op *op)
{
    int32_t count = 0;
    for (size_t i = 0; i < op->u.nonfinite.n; i++)
        count += !isfinite(op->u.nonfinite.x[i]);
    *op->u.nonfinite.count = count;
    return MGT_OK;
}

/* ---- the transformer ops ---- */

/* The grid offset of walk position pos, or false where the position does not exist. */
static bool ref_permute_at(const mgt_permute_shape *sh, const int *pos, size_t *walk, size_t *grid)
{
    long long idx[MGT_PERMUTE_DIMS];
    *walk = 0;
    for (int a = 0; a < sh->naxes; a++)
        idx[a] = sh->shift[a];
    for (int d = 0; d < sh->ndim; d++) {
        *walk += (size_t)pos[d] * sh->walk_stride[d];
        idx[sh->axis[d]] += (long long)pos[d] * sh->coef[d];
    }
    *grid = 0;
    for (int a = 0; a < sh->naxes; a++) {
        long long i = idx[a];
        if (sh->extent[a] > 0)
            i = ((i % sh->extent[a]) + sh->extent[a]) % sh->extent[a];
        if (i >= sh->limit[a])
            return false;
        *grid += (size_t)i * sh->grid_stride[a];
    }
    return true;
}

static mgt_status ref_permute(const mgt_op *op)
{
    const mgt_permute_args *a = &op->u.permute;
    const mgt_permute_shape *sh = &a->sh;
    int pos[MGT_PERMUTE_DIMS] = {0};
    for (;;) {
        size_t w, g;
        bool there = ref_permute_at(sh, pos, &w, &g);
        if (sh->scatter) {
            if (there)
                a->grid[g] = a->walk[w];
        } else {
            a->walk[w] = there ? a->grid[g] : 0.0f;
        }
        int d = sh->ndim - 1;
        while (d >= 0 && ++pos[d] == sh->size[d])
            pos[d--] = 0;
        if (d < 0)
            return MGT_OK;
    }
}

/* Attention, one row (group b, head h, query t) at a time, in double: the logits of every key
   into l[tk]; returns the query's norm factor (cosine) through *qn. */
static double ref_attn_norm(const float *x, int dh)
{
    double s = 0.0;
    for (int d = 0; d < dh; d++)
        s += (double)x[d] * x[d];
    return fmax(sqrt(s), 1e-12);
}

static double ref_attn_factor(const mgt_attn_shape *sh, const float *logit_scale, int h)
{
    if (!sh->cosine)
        return sh->scale;
    return sh->scale * exp(fmin((double)logit_scale[h], log(100.0)));
}

static const float *ref_q(const mgt_attn_shape *sh, const float *q, int b, int h, int t)
{
    return q + (size_t)b * sh->q_batch + (size_t)t * sh->q_row + (size_t)h * sh->dh;
}

static const float *ref_kv(const mgt_attn_shape *sh, const float *k, int b, int h, int u)
{
    return k + (size_t)b * sh->kv_batch + (size_t)u * sh->kv_row + (size_t)h * sh->dh;
}

static void ref_attn_logits(const mgt_attn_shape *sh, const float *q, const float *k,
                            const float *bias, const float *mask, const float *logit_scale, int b,
                            int h, int t, double *l)
{
    const float *qv = ref_q(sh, q, b, h, t);
    double f = ref_attn_factor(sh, logit_scale, h);
    double qn = sh->cosine ? ref_attn_norm(qv, sh->dh) : 1.0;
    size_t tt = (size_t)sh->tq * sh->tk;
    for (int u = 0; u < sh->tk; u++) {
        const float *kv = ref_kv(sh, k, b, h, u);
        double dot = 0.0;
        for (int d = 0; d < sh->dh; d++)
            dot += (double)qv[d] * kv[d];
        if (sh->cosine)
            dot /= qn * ref_attn_norm(kv, sh->dh);
        double v = f * dot;
        if (bias)
            v += bias[(size_t)h * tt + (size_t)t * sh->tk + u];
        if (mask)
            v += mask[(size_t)(b % sh->masks) * tt + (size_t)t * sh->tk + u];
        l[u] = v;
    }
}

/* The dropout factor of element (b, h, t, u): 0, or the float 1 / (1 - p) (1 without dropout). */
static double ref_attn_drop(const mgt_attn_shape *sh, int b, int h, int t, int u)
{
    if (sh->p == 0.0f)
        return 1.0;
    return mgt_attn_keep(sh, b, h, t, u) ? (double)(1.0f / (1.0f - sh->p)) : 0.0;
}

static mgt_status ref_attn_fwd(const mgt_op *op)
{
    const mgt_attn_fwd_args *a = &op->u.attn_fwd;
    const mgt_attn_shape *sh = &a->sh;
    double *l = malloc((size_t)sh->tk * sizeof *l), *acc = malloc((size_t)sh->dh * sizeof *acc);
    if (!l || !acc) {
        free(l);
        free(acc);
        return mgt_error_set(MGT_ERR_OOM, "reference: attention_forward: out of memory");
    }
    for (int b = 0; b < sh->batch; b++)
        for (int h = 0; h < sh->heads; h++)
            for (int t = 0; t < sh->tq; t++) {
                ref_attn_logits(sh, a->q, a->k, a->bias, a->mask, a->logit_scale, b, h, t, l);
                double mx = -INFINITY, sum = 0.0;
                for (int u = 0; u < sh->tk; u++)
                    mx = fmax(mx, l[u]);
                for (int u = 0; u < sh->tk; u++)
                    sum += exp(l[u] - mx);
                double lse = mx + log(sum);
                for (int d = 0; d < sh->dh; d++)
                    acc[d] = 0.0;
                for (int u = 0; u < sh->tk; u++) {
                    double p = exp(l[u] - lse) * ref_attn_drop(sh, b, h, t, u);
                    const float *vv = ref_kv(sh, a->v, b, h, u);
                    for (int d = 0; d < sh->dh; d++)
                        acc[d] += p * vv[d];
                }
                float *y =
                    a->y + (size_t)b * sh->y_batch + (size_t)t * sh->y_row + (size_t)h * sh->dh;
                for (int d = 0; d < sh->dh; d++)
                    y[d] = (float)acc[d];
                a->lse[((size_t)b * sh->heads + h) * sh->tq + t] = (float)lse;
            }
    free(l);
    free(acc);
    return MGT_OK;
}

/* Adds the gradient of x / max(|x|, eps) (dn, in double) to dx: (dn - xh (xh . dn)) / |x|, or
   dn / eps where the norm is clamped (F.normalize's backward). */
static void ref_unnormalize(const float *x, int dh, const double *dn, double *dx)
{
    double s = 0.0;
    for (int d = 0; d < dh; d++)
        s += (double)x[d] * x[d];
    double n = sqrt(s);
    if (n <= 1e-12) {
        for (int d = 0; d < dh; d++)
            dx[d] += dn[d] / 1e-12;
        return;
    }
    double xd = 0.0;
    for (int d = 0; d < dh; d++)
        xd += x[d] / n * dn[d];
    for (int d = 0; d < dh; d++)
        dx[d] += (dn[d] - x[d] / n * xd) / n;
}

static mgt_status ref_attn_bwd(const mgt_op *op)
{
    const mgt_attn_bwd_args *a = &op->u.attn_bwd;
    const mgt_attn_shape *sh = &a->sh;
    int tk = sh->tk, dh = sh->dh;
    size_t tt = (size_t)sh->tq * tk;
    double *l = malloc((size_t)tk * sizeof *l), *ds = malloc((size_t)tk * sizeof *ds);
    double *dq = malloc((size_t)dh * sizeof *dq), *dqn = malloc((size_t)dh * sizeof *dqn);
    double *dk = calloc((size_t)tk * dh, sizeof *dk), *dv = calloc((size_t)tk * dh, sizeof *dv);
    double *dkn = calloc((size_t)tk * dh, sizeof *dkn);
    double *dbias = a->dbias ? calloc((size_t)sh->heads * tt, sizeof *dbias) : NULL;
    mgt_status st = MGT_OK;
    if (!l || !ds || !dq || !dqn || !dk || !dv || !dkn || (a->dbias && !dbias)) {
        st = mgt_error_set(MGT_ERR_OOM, "reference: attention_backward: out of memory");
        goto done;
    }
    for (int h = 0; h < sh->heads; h++) {
        double dls = 0.0, f = ref_attn_factor(sh, a->logit_scale, h);
        for (int b = 0; b < sh->batch; b++) {
            memset(dk, 0, (size_t)tk * dh * sizeof *dk);
            memset(dv, 0, (size_t)tk * dh * sizeof *dv);
            memset(dkn, 0, (size_t)tk * dh * sizeof *dkn);
            for (int t = 0; t < sh->tq; t++) {
                const float *qv = ref_q(sh, a->q, b, h, t);
                size_t yo = (size_t)b * sh->y_batch + (size_t)t * sh->y_row + (size_t)h * dh;
                const float *dy = a->dy + yo, *y = a->y + yo;
                double lse = a->lse[((size_t)b * sh->heads + h) * sh->tq + t], D = 0.0;
                ref_attn_logits(sh, a->q, a->k, a->bias, a->mask, a->logit_scale, b, h, t, l);
                for (int d = 0; d < dh; d++)
                    D += (double)dy[d] * y[d];
                double qn = sh->cosine ? ref_attn_norm(qv, dh) : 1.0;
                for (int d = 0; d < dh; d++)
                    dqn[d] = 0.0;
                for (int u = 0; u < tk; u++) {
                    const float *kv = ref_kv(sh, a->k, b, h, u), *vv = ref_kv(sh, a->v, b, h, u);
                    double p = exp(l[u] - lse), drop = ref_attn_drop(sh, b, h, t, u), dp = 0.0;
                    for (int d = 0; d < dh; d++) {
                        dp += (double)dy[d] * vv[d];
                        dv[(size_t)u * dh + d] += p * drop * dy[d];
                    }
                    ds[u] = p * (dp * drop - D);
                    if (dbias)
                        dbias[(size_t)h * tt + (size_t)t * tk + u] += ds[u];
                    double kn = sh->cosine ? ref_attn_norm(kv, dh) : 1.0;
                    if (sh->cosine) {
                        double dot = 0.0;
                        for (int d = 0; d < dh; d++)
                            dot += (double)qv[d] / qn * (kv[d] / kn);
                        if (a->logit_scale[h] <= log(100.0))
                            dls += ds[u] * f * dot;
                    }
                    /* the gradients of the (normalised) vectors */
                    for (int d = 0; d < dh; d++) {
                        dqn[d] += ds[u] * f * kv[d] / kn;
                        dkn[(size_t)u * dh + d] += ds[u] * f * qv[d] / qn;
                    }
                }
                for (int d = 0; d < dh; d++)
                    dq[d] = sh->cosine ? 0.0 : dqn[d];
                if (sh->cosine)
                    ref_unnormalize(qv, dh, dqn, dq);
                float *dqo =
                    a->dq + (size_t)b * sh->q_batch + (size_t)t * sh->q_row + (size_t)h * dh;
                for (int d = 0; d < dh; d++)
                    dqo[d] = (float)dq[d];
            }
            for (int u = 0; u < tk; u++) {
                size_t o = (size_t)b * sh->kv_batch + (size_t)u * sh->kv_row + (size_t)h * dh;
                double *dku = dk + (size_t)u * dh;
                if (sh->cosine)
                    ref_unnormalize(a->k + o, dh, dkn + (size_t)u * dh, dku);
                else
                    memcpy(dku, dkn + (size_t)u * dh, (size_t)dh * sizeof *dku);
                for (int d = 0; d < dh; d++) {
                    a->dk[o + d] = (float)dku[d];
                    a->dv[o + d] = (float)dv[(size_t)u * dh + d];
                }
            }
        }
        if (sh->cosine)
            a->dlogit_scale[h] = (float)(a->dlogit_scale[h] + dls);
    }
    if (dbias)
        for (size_t i = 0; i < (size_t)sh->heads * tt; i++)
            a->dbias[i] = (float)dbias[i];
done:
    free(l);
    free(ds);
    free(dq);
    free(dqn);
    free(dk);
    free(dv);
    free(dkn);
    free(dbias);
    return st;
}

static mgt_status ref_rpb_fwd(const mgt_op *op)
{
    const mgt_rpb_fwd_args *a = &op->u.rpb_fwd;
    for (int i = 0; i < a->n; i++)
        if (a->index[i] < 0 || a->index[i] >= a->rows)
            return mgt_error_set(MGT_ERR_DEVICE, "%s: index %d out of range [0, %d) at %d",
                                 mgt_op_name(op->kind), (int)a->index[i], a->rows, i);
    for (int h = 0; h < a->heads; h++)
        for (int i = 0; i < a->n; i++)
            a->bias[(size_t)h * a->n + i] = a->alpha * a->table[(size_t)a->index[i] * a->heads + h];
    return MGT_OK;
}

static mgt_status ref_rpb_bwd(const mgt_op *op)
{
    const mgt_rpb_bwd_args *a = &op->u.rpb_bwd;
    if (a->offsets[0] != 0 || a->offsets[a->rows] != a->n)
        return mgt_error_set(MGT_ERR_DEVICE, "%s: the inverse index does not cover %d positions",
                             mgt_op_name(op->kind), a->n);
    for (int r = 0; r < a->rows; r++) {
        if (a->offsets[r + 1] < a->offsets[r])
            return mgt_error_set(MGT_ERR_DEVICE, "%s: offsets decrease at row %d",
                                 mgt_op_name(op->kind), r);
        for (int j = a->offsets[r]; j < a->offsets[r + 1]; j++)
            if (a->order[j] < 0 || a->order[j] >= a->n)
                return mgt_error_set(MGT_ERR_DEVICE, "%s: position %d out of range [0, %d)",
                                     mgt_op_name(op->kind), (int)a->order[j], a->n);
    }
    for (int r = 0; r < a->rows; r++)
        for (int h = 0; h < a->heads; h++) {
            double s = 0.0;
            for (int j = a->offsets[r]; j < a->offsets[r + 1]; j++)
                s += a->dbias[(size_t)h * a->n + a->order[j]];
            float *d = &a->dtable[(size_t)r * a->heads + h];
            *d = (float)(*d + (double)a->alpha * s);
        }
    return MGT_OK;
}

/* One function per row of the op list, ref_<stem>. */
#define REF_OP(KIND, name, args, stem) [MGT_OP_##KIND] = ref_##stem,
static mgt_status (*const ref_ops[MGT_OP_COUNT])(const mgt_op *op) = {MGT_OP_LIST(REF_OP)};
#undef REF_OP

/* 16-bit activation storage: the op's fp32 loops on widened copies, each 16-bit output
   rounded once (mgt_op_run_widened); copies keep their codes (ref_scopy). */
typedef struct ref_wide {
    float *buf;
} ref_wide;

static float *ref_widen(void *ctx, size_t n)
{
    ref_wide *w = ctx;
    w->buf = malloc((n ? n : 1) * sizeof(float));
    if (!w->buf)
        mgt_error_set(MGT_ERR_OOM, "reference: no memory for %zu widened floats", n);
    return w->buf;
}

static void ref_store_copy(void *ctx, const mgt_store_job *job)
{
    (void)ctx;
    mgt_store_copy(job, 0, job->n);
}

static mgt_status ref_fp32(void *ctx, const mgt_op *op)
{
    (void)ctx;
    return ref_ops[op->kind](op);
}

mgt_status mgt_ref_run(const mgt_op *op)
{
    if ((unsigned)op->kind >= MGT_OP_COUNT)
        return mgt_error_set(MGT_ERR_INVALID, "reference: unknown op kind %d", (int)op->kind);
    if (mgt_op_store16(op) != MGT_PREC_F32 && op->kind != MGT_OP_STRIDED_COPY) {
        ref_wide w = {NULL};
        mgt_status st = mgt_op_run_widened(op, &w, ref_widen, ref_store_copy, ref_fp32);
        free(w.buf);
        return st;
    }
    return ref_ops[op->kind](op);
}
