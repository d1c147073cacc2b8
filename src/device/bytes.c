/* The global-memory bytes of the CUDA backend's kernels, op by op (device/bytes.h): the
   operands each pass reads and writes, from mgt_op_operands' counts and element sizes, with
   the passes of the ops that make more than one (convolutions, batch norm, a 16-bit gemm)
   spelled out as dnn.cu and store16.cu run them. Plain C, built everywhere: the model of a
   GPU step needs no GPU. */
#include "device/bytes.h"

/* one pass that reads r and writes w bytes, conv of them conversions */
static void pass(mgt_op_bytes *b, double r, double w, bool conv)
{
    b->read += r;
    b->written += w;
    if (conv)
        b->convert += r + w;
    b->passes++;
}

/* Every operand once by its role: the one-pass kernels. */
static void operands_once(const mgt_op *op, mgt_op_bytes *b)
{
    mgt_op copy = *op;
    mgt_operand ops[MGT_OP_MAX_OPERANDS];
    int n = mgt_op_operands(&copy, ops);
    double r = 0, w = 0;
    for (int i = 0; i < n; i++) {
        double bytes = (double)ops[i].count * (double)mgt_dtype_size(ops[i].dtype);
        if (ops[i].role != MGT_OPERAND_OUT)
            r += bytes;
        if (ops[i].role != MGT_OPERAND_IN)
            w += bytes;
    }
    pass(b, r, w, false);
}

static double esize(mgt_precision store) { return store == MGT_PREC_F32 ? 4.0 : 2.0; }

/* dnn.cu's three passes: conv2d_f32, conv2d_tensor_cores (prec 16, fp32 storage),
   conv16_channels_last (16-bit storage). */
static void conv_bytes(const mgt_op *op, mgt_op_bytes *b)
{
    const mgt_conv2d_shape *sh = &op->u.conv.sh;
    const double p = mgt_conv2d_out_h(sh), q = mgt_conv2d_out_w(sh);
    const double nx = (double)sh->n * sh->c * sh->h * sh->w, ny = (double)sh->n * sh->k * p * q,
                 nw = (double)sh->k * (sh->c / sh->groups) * sh->r * sh->s;
    const bool beta = op->u.conv.beta != 0.0f;
    const mgt_op_kind dir = op->kind;
    /* sizes of the pass's output and its two inputs, in elements */
    const double nout = dir == MGT_OP_CONV2D_FWD ? ny : dir == MGT_OP_CONV2D_BWD_DATA ? nx : nw;
    const double nin1 = dir == MGT_OP_CONV2D_FWD ? nx : ny;
    const double nin2 = dir == MGT_OP_CONV2D_BWD_FILTER ? nx : nw;
    if (mgt_op_store16(op) == MGT_PREC_F32 && op->prec == MGT_PREC_F32) {
        pass(b, 4 * (nin1 + nin2 + (beta ? nout : 0)), 4 * nout, false);
        return;
    }
    if (mgt_op_store16(op) == MGT_PREC_F32) { /* both inputs to NHWC 16-bit, the result back */
        pass(b, 4 * nin1, 2 * nin1, true);
        pass(b, 4 * nin2, 2 * nin2, true);
        pass(b, 2 * (nin1 + nin2), 2 * nout, false);
        pass(b, 2 * nout + (beta ? 4 * nout : 0), 4 * nout, true);
        return;
    }
    /* channels last: an activation that is not NHWC 16-bit goes through a relayout each way */
    const bool xd = sh->x_layout == MGT_LAYOUT_NHWC && op->store_in != MGT_PREC_F32;
    const bool yd = sh->y_layout == MGT_LAYOUT_NHWC && op->store_out != MGT_PREC_F32;
    const double ex = esize(op->store_in), ey = esize(op->store_out);
    switch (dir) {
    case MGT_OP_CONV2D_FWD:
        if (!xd)
            pass(b, ex * nx, 2 * nx, true);
        if (!yd && beta)
            pass(b, ey * ny, 2 * ny, true);
        pass(b, 4 * nw, 2 * nw, true); /* the filter's 16-bit copy, once per step */
        pass(b, 2 * (nx + nw + (beta ? ny : 0)), 2 * ny, false);
        if (!yd)
            pass(b, 2 * ny, ey * ny, true);
        break;
    case MGT_OP_CONV2D_BWD_DATA:
        if (!yd)
            pass(b, ey * ny, 2 * ny, true);
        if (!xd && beta)
            pass(b, ex * nx, 2 * nx, true);
        pass(b, 2 * (ny + nw + (beta ? nx : 0)), 2 * nx, false); /* the cached filter copy */
        if (!xd)
            pass(b, 2 * nx, ex * nx, true);
        break;
    default:
        if (!yd)
            pass(b, ey * ny, 2 * ny, true);
        if (!xd)
            pass(b, ex * nx, 2 * nx, true);
        pass(b, 2 * (ny + nx), 2 * nw, false);
        pass(b, 2 * nw + (beta ? 4 * nw : 0), 4 * nw, true); /* into the fp32 KCRS gradient */
        break;
    }
}

/* Batch norm: the statistics pass, then the normalisation (cuDNN's spatial kernels on fp32,
   store16.cu's partial sums and apply on 16 bits). The fp32 path runs a folded ReLU as a pass
   of its own: relu_forward in place after the forward, relu_backward into scratch before the
   backward, which then reads the masked gradient. */
static void bn_bytes(const mgt_op *op, mgt_op_bytes *b)
{
    const bool lp = mgt_op_store16(op) != MGT_PREC_F32;
    const double ei = esize(op->store_in), eo = esize(op->store_out);
    const mgt_bn_shape *sh = op->kind == MGT_OP_BN_FWD_TRAIN  ? &op->u.bn_train.sh
                             : op->kind == MGT_OP_BN_FWD_EVAL ? &op->u.bn_eval.sh
                                                              : &op->u.bn_bwd.sh;
    const double n = (double)sh->n * sh->c * sh->hw, c = sh->c;
    /* store16.cu's partial sums: {sum, sum of squares} in double per row chunk and channel */
    const size_t rows = (size_t)sh->n * (size_t)sh->hw;
    size_t k = (size_t)65536 / (size_t)sh->c, most = (rows + 31) / 32;
    if (k > most)
        k = most;
    const double chunks = k < 1 ? 1.0 : (double)k; /* store16.cu's bn_chunks */
    const double partial = lp ? 16.0 * chunks * c : 0.0;
    /* a fused residual add: z read by the normalising pass, dz written by the backward's last */
    const double z = mgt_op_bn_residual(op) ? eo * n : 0.0;
    switch (op->kind) {
    case MGT_OP_BN_FWD_TRAIN:
        pass(b, ei * n, partial, false);                    /* statistics */
        pass(b, partial + 16 * c, 16 * c, false);           /* per channel */
        pass(b, ei * n + z + 8 * c + 8 * c, eo * n, false); /* normalise */
        if (sh->relu && !lp)
            pass(b, 4 * n, 4 * n, false);
        return;
    case MGT_OP_BN_FWD_EVAL:
        pass(b, ei * n + z + 16 * c, eo * n, false);
        if (sh->relu && !lp)
            pass(b, 4 * n, 4 * n, false);
        return;
    default: {
        double dy = eo * n, x = ei * n, y = sh->relu && lp ? eo * n : 0;
        if (sh->relu && !lp) { /* relu_backward into scratch: cuDNN reads that instead of dy */
            pass(b, 8 * n, 4 * n, false);
            y = 0;
        }
        pass(b, dy + y + x + 12 * c, partial, false);
        if (lp)
            pass(b, partial + 8 * c, 24 * c, false);
        pass(b, dy + y + x + 12 * c + (lp ? 16 * c : 0), ei * n + z + (lp ? 0 : 8 * c), false);
        return;
    }
    }
}

/* The partial sums of common.cuh's row sums (mgt_cuda_row_chunks): 16 bytes a chunk and
   channel of each group. */
static double row_partials(size_t rows, int c, int groups)
{
    size_t lanes = (size_t)groups * (size_t)c, k = (size_t)65536 / lanes, most = (rows + 31) / 32;
    if (k > most)
        k = most;
    return 16.0 * (double)(k < 1 ? 1 : k) * (double)lanes;
}

/* The channel ops' backward in NHWC: the row sums' two passes, the first one reading and
   writing what the one-pass NCHW kernel does (operands_once) and writing the partial sums,
   the second adding them into (added: read too) or writing the [groups, c] result. */
static void row_sums_bytes(const mgt_op *op, size_t rows, int c, int groups, double result,
                           bool added, mgt_op_bytes *b)
{
    operands_once(op, b);
    const double part = row_partials(rows, c, groups), rr = added ? result : 0.0;
    b->read -= rr; /* the result is the second pass's */
    b->written += part - result;
    pass(b, part + rr, result, false);
}

/* LayerNorm over channels, backward (norm.cu): each pixel's statistics (16 bytes) from x,
   the parameter gradients (NCHW: a block per channel; NHWC: the row sums), then dx; x and dy
   read by each of those passes. */
static void lnc_bwd_bytes(const mgt_op *op, mgt_op_bytes *b)
{
    const mgt_lnc_bwd_args *a = &op->u.lnc_bwd;
    const double px = (double)a->n * a->hw, n = px * a->c, c = a->c;
    const double ei = esize(op->store_in), eo = esize(op->store_out);
    if (a->hw == 1 && mgt_op_store16(op) == MGT_PREC_F32) { /* the rows kernel: one pass */
        operands_once(op, b);
        return;
    }
    pass(b, ei * n, 16 * px, false);
    if (a->layout == MGT_LAYOUT_NHWC) {
        const double part = row_partials((size_t)px, a->c, 1);
        pass(b, eo * n + ei * n + 16 * px, part, false);
        pass(b, part + 8 * c, 8 * c, false);
    } else {
        pass(b, eo * n + ei * n + 16 * px + 8 * c, 8 * c, false);
    }
    pass(b, eo * n + ei * n + 16 * px + 4 * c, ei * n, false);
}

void mgt_op_bytes_cuda(const mgt_op *op, mgt_op_bytes *out)
{
    *out = (mgt_op_bytes){0};
    switch (op->kind) {
    case MGT_OP_CONV2D_FWD:
    case MGT_OP_CONV2D_BWD_DATA:
    case MGT_OP_CONV2D_BWD_FILTER: conv_bytes(op, out); return;
    case MGT_OP_BN_FWD_TRAIN:
    case MGT_OP_BN_FWD_EVAL:
    case MGT_OP_BN_BWD: bn_bytes(op, out); return;
    case MGT_OP_MAXPOOL_BWD: { /* the gather kernel reads x and dy (not y), writes dx */
        const mgt_pool2d_shape *sh = &op->u.maxpool_bwd.sh;
        double x = (double)sh->n * sh->c * sh->h * sh->w,
               y = (double)sh->n * sh->c * mgt_pool2d_out_h(sh) * mgt_pool2d_out_w(sh);
        double ei = esize(op->store_in), eo = esize(op->store_out);
        pass(out, ei * x + eo * y, ei * x, false);
        return;
    }
    case MGT_OP_GEMM:
        if (op->prec != MGT_PREC_F32) { /* mgt_cuda_lowp_inputs: a and b cast to 16 bits */
            const mgt_gemm_args *g = &op->u.gemm;
            double a = (double)g->m * g->k, bb = (double)g->k * g->n, c = (double)g->m * g->n;
            pass(out, 4 * a, 2 * a, true);
            pass(out, 4 * bb, 2 * bb, true);
            pass(out, 2 * (a + bb) + (g->beta != 0.0f ? 4 * c : 0), 4 * c, false);
            return;
        }
        operands_once(op, out);
        return;
    case MGT_OP_CHBIAS_BWD: {
        const mgt_chbias_bwd_args *a = &op->u.chbias_bwd;
        if (a->layout == MGT_LAYOUT_NHWC) {
            row_sums_bytes(op, (size_t)a->n * a->hw, a->c, 1, 4.0 * a->c, true, out);
            return;
        }
        operands_once(op, out);
        return;
    }
    case MGT_OP_CHSCALE_BWD: {
        const mgt_chscale_bwd_args *a = &op->u.chscale_bwd;
        if (a->layout == MGT_LAYOUT_NHWC) {
            const int groups = a->shared ? 1 : a->n;
            const double result = a->dscale ? 4.0 * groups * a->c : 0.0;
            row_sums_bytes(op, (size_t)a->n * a->hw / (size_t)groups, a->c, groups, result,
                           a->shared, out);
            return;
        }
        operands_once(op, out);
        return;
    }
    case MGT_OP_LNC_BWD: lnc_bwd_bytes(op, out); return;
    default: operands_once(op, out); return;
    }
}
