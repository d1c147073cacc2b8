/* Kernel calls as values: names, argument checks, operand lists and FLOP counts of every op. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "device/lowp.h"
#include "device/op.h"
#include "mgt/rng.h"

/* ---- output sizes ---- */

/* Computed in 64 bits so that absurd paddings cannot overflow an int; a window that does not
   fit even once gives 0, which mgt_op_check then rejects. */
static int out_size_mode(int in, int window, int stride, int pad, bool ceil_mode)
{
    if (stride < 1 || window < 1)
        return 0;
    long long span = (long long)in + 2LL * pad - window;
    if (span < 0)
        return 0;
    long long out = (ceil_mode ? (span + stride - 1) / stride : span / stride) + 1;
    /* torch: the last window must start inside the input or its left padding */
    if (ceil_mode && (out - 1) * stride >= (long long)in + pad)
        out--;
    return out > INT32_MAX ? INT32_MAX : (int)out;
}

static int out_size(int in, int window, int stride, int pad)
{
    return out_size_mode(in, window, stride, pad, false);
}

int mgt_conv2d_out_h(const mgt_conv2d_shape *sh)
{
    return out_size(sh->h, sh->r, sh->stride_h, sh->pad_h);
}

int mgt_conv2d_out_w(const mgt_conv2d_shape *sh)
{
    return out_size(sh->w, sh->s, sh->stride_w, sh->pad_w);
}

int mgt_pool2d_out_h(const mgt_pool2d_shape *sh)
{
    return out_size_mode(sh->h, sh->kh, sh->stride_h, sh->pad_h, sh->ceil_mode);
}

int mgt_pool2d_out_w(const mgt_pool2d_shape *sh)
{
    return out_size_mode(sh->w, sh->kw, sh->stride_w, sh->pad_w, sh->ceil_mode);
}

/* ---- checks and operands, per argument struct ----
   check_<args> checks sizes and parameters (never pointers: mgt_op_check derives those from
   the operand list); operands_<args> lists the pointers with their element counts, and is only
   trusted on an op whose sizes passed the check. */

/* Every refusal goes through INVALID so that the text always starts with the op's name, which
   is all a caller several layers up has to say which call was wrong. */
#define INVALID(op, fmt, ...) \
    mgt_error_set(MGT_ERR_INVALID, "%s: " fmt, mgt_op_name((op)->kind), __VA_ARGS__)

#define NEED_POS(op, v, what)                                                     \
    do {                                                                          \
        if ((v) <= 0)                                                             \
            return INVALID(op, "%s %lld must be positive", what, (long long)(v)); \
    } while (0)

typedef struct operand_list {
    mgt_operand *out;
    int n;
} operand_list;

/* Takes the address of the op's own pointer field, whatever its constness, so a harness can
   swap in a guarded copy of the argument and run the op unchanged. Every listed operand is
   required (mgt_op_check refuses it NULL); a pointer the op may go without is listed only
   where the op touches it, as sgd's momentum_buf with momentum. */
#define ADD(list, field, name_, count_, dtype_, role_) \
    add_operand(list, name_, (void **)&(field), count_, dtype_, role_)

static void add_operand(operand_list *l, const char *name, void **ptr, size_t count,
                        mgt_dtype dtype, mgt_operand_role role)
{
    MGT_ASSERT(l->n < MGT_OP_MAX_OPERANDS);
    l->out[l->n++] = (mgt_operand){name, ptr, count, dtype, role};
}

static const mgt_operand_role IN = MGT_OPERAND_IN, OUT = MGT_OPERAND_OUT, INOUT = MGT_OPERAND_INOUT;

/* Element counts are products of ints; an element count that overflows size_t (or a byte
   count that does) would make every pointer computation below it wrong. */
static bool count_fits(size_t *acc, long long factor)
{
    if (factor < 0)
        return false;
    size_t r;
    if (__builtin_mul_overflow(*acc, (size_t)factor, &r) || r > SIZE_MAX / sizeof(float))
        return false;
    *acc = r;
    return true;
}

static bool product_fits(long long a, long long b, long long c, long long d)
{
    size_t n = 1;
    return count_fits(&n, a) && count_fits(&n, b) && count_fits(&n, c) && count_fits(&n, d);
}

static size_t zmul(size_t a, size_t b, size_t c, size_t d) { return a * b * c * d; }

/* A stored matrix of `rows` rows, `ld` apart, each `row` long: the last row ends early. */
static size_t strided(int rows, int ld, int row)
{
    return (size_t)(rows - 1) * (size_t)ld + (size_t)row;
}

static mgt_operand_role beta_role(float beta)
{
    return beta != 0.0f ? MGT_OPERAND_INOUT : MGT_OPERAND_OUT;
}

/* The element type of the op's input and output activations (mgt_op.store_in, store_out). */
static mgt_dtype act_in(const mgt_op *op)
{
    return op->store_in != MGT_PREC_F32 ? MGT_U16 : MGT_F32;
}

static mgt_dtype act_out(const mgt_op *op)
{
    return op->store_out != MGT_PREC_F32 ? MGT_U16 : MGT_F32;
}

static mgt_status check_n(const mgt_op *op, size_t n)
{
    if (n == 0)
        return INVALID(op, "element count %zu must be positive", n);
    if (n > SIZE_MAX / sizeof(float))
        return INVALID(op, "element count %zu is too large", n);
    return MGT_OK;
}

/* ---- element-wise and reductions ---- */

static mgt_status check_fill(const mgt_op *op) { return check_n(op, op->u.fill.n); }

static void operands_fill(mgt_op *op, operand_list *l)
{
    ADD(l, op->u.fill.x, "x", op->u.fill.n, MGT_F32, OUT);
}

static mgt_status check_scale(const mgt_op *op) { return check_n(op, op->u.scale.n); }

static void operands_scale(mgt_op *op, operand_list *l)
{
    ADD(l, op->u.scale.x, "x", op->u.scale.n, MGT_F32, INOUT);
}

static mgt_status check_axpy(const mgt_op *op) { return check_n(op, op->u.axpy.n); }

static void operands_axpy(mgt_op *op, operand_list *l)
{
    ADD(l, op->u.axpy.y, "y", op->u.axpy.n, MGT_F32, INOUT);
    ADD(l, op->u.axpy.x, "x", op->u.axpy.n, MGT_F32, IN);
}

static mgt_status check_sum(const mgt_op *op) { return check_n(op, op->u.sum.n); }

static void operands_sum(mgt_op *op, operand_list *l)
{
    ADD(l, op->u.sum.out, "out", 1, MGT_F32, OUT);
    ADD(l, op->u.sum.x, "x", op->u.sum.n, MGT_F32, IN);
}

static mgt_status check_add(const mgt_op *op) { return check_n(op, op->u.add.n); }

static void operands_add(mgt_op *op, operand_list *l)
{
    ADD(l, op->u.add.y, "y", op->u.add.n, act_out(op), OUT);
    ADD(l, op->u.add.a, "a", op->u.add.n, act_in(op), IN);
    ADD(l, op->u.add.b, "b", op->u.add.n, act_in(op), IN);
}

static mgt_status check_relu_fwd(const mgt_op *op) { return check_n(op, op->u.relu_fwd.n); }

static void operands_relu_fwd(mgt_op *op, operand_list *l)
{
    ADD(l, op->u.relu_fwd.y, "y", op->u.relu_fwd.n, act_out(op), OUT);
    ADD(l, op->u.relu_fwd.x, "x", op->u.relu_fwd.n, act_in(op), IN);
}

static mgt_status check_relu_bwd(const mgt_op *op) { return check_n(op, op->u.relu_bwd.n); }

static void operands_relu_bwd(mgt_op *op, operand_list *l)
{
    ADD(l, op->u.relu_bwd.dx, "dx", op->u.relu_bwd.n, act_in(op), OUT);
    ADD(l, op->u.relu_bwd.dy, "dy", op->u.relu_bwd.n, act_out(op), IN);
    ADD(l, op->u.relu_bwd.y, "y", op->u.relu_bwd.n, act_out(op), IN);
}

/* ---- gemm ---- */

/* A gemm or convolution in F32 (what a zeroed op holds), or on inputs rounded to BF16 or FP16. */
static mgt_status check_prec(const mgt_op *op, mgt_precision p)
{
    if (p != MGT_PREC_F32 && p != MGT_PREC_BF16 && p != MGT_PREC_FP16)
        return INVALID(op, "precision %d is not f32, bf16 or fp16", (int)p);
    return MGT_OK;
}

static mgt_status check_gemm(const mgt_op *op)
{
    const mgt_gemm_args *g = &op->u.gemm;
    mgt_status st = check_prec(op, op->prec);
    if (st != MGT_OK)
        return st;
    NEED_POS(op, g->m, "m");
    NEED_POS(op, g->n, "n");
    NEED_POS(op, g->k, "k");
    /* The stored matrices: A is [m,k] or, transposed, [k,m]; B is [k,n] or [n,k]. */
    int a_row = g->trans_a ? g->m : g->k, a_rows = g->trans_a ? g->k : g->m;
    int b_row = g->trans_b ? g->k : g->n, b_rows = g->trans_b ? g->n : g->k;
    if (g->lda < a_row)
        return INVALID(op, "lda %d < row length %d of A%s", g->lda, a_row,
                       g->trans_a ? " (transposed)" : "");
    if (g->ldb < b_row)
        return INVALID(op, "ldb %d < row length %d of B%s", g->ldb, b_row,
                       g->trans_b ? " (transposed)" : "");
    if (g->ldc < g->n)
        return INVALID(op, "ldc %d < row length %d of C", g->ldc, g->n);
    if (!product_fits(a_rows, g->lda, 1, 1) || !product_fits(b_rows, g->ldb, 1, 1) ||
        !product_fits(g->m, g->ldc, 1, 1))
        return INVALID(op, "matrix sizes overflow (m %d, n %d, k %d)", g->m, g->n, g->k);
    return MGT_OK;
}

static void operands_gemm(mgt_op *op, operand_list *l)
{
    mgt_gemm_args *g = &op->u.gemm;
    size_t a = g->trans_a ? strided(g->k, g->lda, g->m) : strided(g->m, g->lda, g->k);
    size_t b = g->trans_b ? strided(g->n, g->ldb, g->k) : strided(g->k, g->ldb, g->n);
    mgt_dtype h = mgt_op_store16(op) != MGT_PREC_F32 ? MGT_U16 : MGT_F32;
    /* 16-bit c with rows apart (ldc > n): INOUT, so that the codes between the rows are kept
       through the widened copy (mgt_op_run_widened) */
    mgt_operand_role cr = g->c16 && g->ldc > g->n && h == MGT_U16 ? INOUT : beta_role(g->beta);
    ADD(l, g->c, "c", strided(g->m, g->ldc, g->n), g->c16 ? h : MGT_F32, cr);
    ADD(l, g->a, "a", a, g->a16 ? h : MGT_F32, IN);
    ADD(l, g->b, "b", b, g->b16 ? h : MGT_F32, IN);
}

/* ---- layouts ---- */

/* An activation of c channels in layout l (what for the message): a known layout, and a
   blocked one only where c fills whole blocks. */
static mgt_status check_layout(const mgt_op *op, mgt_layout l, int c, const char *what)
{
    if (l != MGT_LAYOUT_NCHW && l != MGT_LAYOUT_NCHW16C && l != MGT_LAYOUT_NHWC)
        return INVALID(op, "%s layout %d is none of mgt_layout's", what, (int)l);
    if (l == MGT_LAYOUT_NCHW16C && c % 16 != 0)
        return INVALID(op, "%s in nChw16c needs channels in multiples of 16, not %d", what, c);
    return MGT_OK;
}

bool mgt_op_blocked(const mgt_op *op)
{
    switch (op->kind) {
    case MGT_OP_CONV2D_FWD:
    case MGT_OP_CONV2D_BWD_DATA:
    case MGT_OP_CONV2D_BWD_FILTER:
        return op->u.conv.sh.x_layout != MGT_LAYOUT_NCHW ||
               op->u.conv.sh.y_layout != MGT_LAYOUT_NCHW;
    case MGT_OP_BN_FWD_TRAIN: return op->u.bn_train.sh.layout != MGT_LAYOUT_NCHW;
    case MGT_OP_BN_FWD_EVAL: return op->u.bn_eval.sh.layout != MGT_LAYOUT_NCHW;
    case MGT_OP_BN_BWD: return op->u.bn_bwd.sh.layout != MGT_LAYOUT_NCHW;
    case MGT_OP_MAXPOOL_FWD: return op->u.maxpool_fwd.sh.layout != MGT_LAYOUT_NCHW;
    case MGT_OP_MAXPOOL_BWD: return op->u.maxpool_bwd.sh.layout != MGT_LAYOUT_NCHW;
    case MGT_OP_AVGPOOL_FWD: return op->u.avgpool_fwd.layout != MGT_LAYOUT_NCHW;
    case MGT_OP_AVGPOOL_BWD: return op->u.avgpool_bwd.layout != MGT_LAYOUT_NCHW;
    case MGT_OP_APOOL_FWD: return op->u.apool_fwd.layout != MGT_LAYOUT_NCHW;
    case MGT_OP_APOOL_BWD: return op->u.apool_bwd.layout != MGT_LAYOUT_NCHW;
    case MGT_OP_CHBIAS_FWD: return op->u.chbias_fwd.layout != MGT_LAYOUT_NCHW;
    case MGT_OP_CHBIAS_BWD: return op->u.chbias_bwd.layout != MGT_LAYOUT_NCHW;
    case MGT_OP_CHSCALE_FWD: return op->u.chscale_fwd.layout != MGT_LAYOUT_NCHW;
    case MGT_OP_CHSCALE_BWD: return op->u.chscale_bwd.layout != MGT_LAYOUT_NCHW;
    case MGT_OP_LNC_FWD: return op->u.lnc_fwd.layout != MGT_LAYOUT_NCHW;
    case MGT_OP_LNC_BWD: return op->u.lnc_bwd.layout != MGT_LAYOUT_NCHW;
    case MGT_OP_DROPOUT: return op->u.dropout.layout != MGT_LAYOUT_NCHW;
    default: return false;
    }
}

/* ---- convolution (forward, backward data, backward filter) ---- */

static mgt_status check_conv(const mgt_op *op)
{
    const mgt_conv2d_shape *sh = &op->u.conv.sh;
    mgt_status st = check_prec(op, op->prec);
    if (st != MGT_OK)
        return st;
    NEED_POS(op, sh->n, "batch n");
    NEED_POS(op, sh->c, "channels c");
    NEED_POS(op, sh->h, "height h");
    NEED_POS(op, sh->w, "width w");
    NEED_POS(op, sh->k, "filters k");
    NEED_POS(op, sh->r, "filter height r");
    NEED_POS(op, sh->s, "filter width s");
    if (sh->stride_h < 1 || sh->stride_w < 1)
        return INVALID(op, "stride %dx%d must be at least 1", sh->stride_h, sh->stride_w);
    if (sh->pad_h < 0 || sh->pad_w < 0)
        return INVALID(op, "padding %dx%d must not be negative", sh->pad_h, sh->pad_w);
    /* The header asks for padding smaller than the window: a wider pad only adds outputs that
       see nothing but zeros, and some backends refuse it. */
    if (sh->pad_h >= sh->r)
        return INVALID(op, "padding %d >= filter height %d", sh->pad_h, sh->r);
    if (sh->pad_w >= sh->s)
        return INVALID(op, "padding %d >= filter width %d", sh->pad_w, sh->s);
    if (sh->groups < 1)
        return INVALID(op, "groups %d must be at least 1", sh->groups);
    if (sh->c % sh->groups != 0 || sh->k % sh->groups != 0)
        return INVALID(op, "groups %d must divide channels %d and filters %d", sh->groups, sh->c,
                       sh->k);
    int p = mgt_conv2d_out_h(sh), q = mgt_conv2d_out_w(sh);
    if (p < 1 || q < 1)
        return INVALID(op, "output %dx%d is empty (input %dx%d, filter %dx%d, padding %dx%d)", p, q,
                       sh->h, sh->w, sh->r, sh->s, sh->pad_h, sh->pad_w);
    if (!product_fits(sh->n, sh->c, sh->h, sh->w) || !product_fits(sh->n, sh->k, p, q) ||
        !product_fits(sh->k, sh->c / sh->groups, sh->r, sh->s))
        return INVALID(op, "tensor sizes overflow (n %d, c %d, h %d, w %d, k %d)", sh->n, sh->c,
                       sh->h, sh->w, sh->k);
    st = check_layout(op, sh->x_layout, sh->c, "x");
    if (st == MGT_OK)
        st = check_layout(op, sh->y_layout, sh->k, "y");
    /* depthwise ones take it: oneDNN has a direct kernel for them in nChw16c */
    bool depthwise = sh->groups == sh->c && sh->groups == sh->k;
    if (st == MGT_OK && sh->groups != 1 && !depthwise &&
        (sh->x_layout == MGT_LAYOUT_NCHW16C || sh->y_layout == MGT_LAYOUT_NCHW16C))
        return INVALID(op,
                       "a grouped convolution (groups %d of %d channels) takes NCHW or NHWC, "
                       "not nChw16c, unless depthwise",
                       sh->groups, sh->c);
    return st;
}

/* forward: out = y, in1 = x, in2 = w; backward data: out = dx, in1 = dy, in2 = w; backward
   filter: out = dw, in1 = dy, in2 = x */
static void operands_conv(mgt_op *op, operand_list *l)
{
    const mgt_conv2d_shape *sh = &op->u.conv.sh;
    int groups = sh->groups > 0 ? sh->groups : 1;
    size_t x = zmul(sh->n, sh->c, sh->h, sh->w);
    size_t y = zmul(sh->n, sh->k, mgt_conv2d_out_h(sh), mgt_conv2d_out_w(sh));
    size_t w = zmul(sh->k, sh->c / groups, sh->r, sh->s);
    mgt_operand_role role = beta_role(op->u.conv.beta);
    if (op->kind == MGT_OP_CONV2D_FWD) {
        ADD(l, op->u.conv.out, "y", y, act_out(op), role);
        ADD(l, op->u.conv.in1, "x", x, act_in(op), IN);
        ADD(l, op->u.conv.in2, "w", w, MGT_F32, IN);
    } else if (op->kind == MGT_OP_CONV2D_BWD_DATA) {
        ADD(l, op->u.conv.out, "dx", x, act_in(op), role);
        ADD(l, op->u.conv.in1, "dy", y, act_out(op), IN);
        ADD(l, op->u.conv.in2, "w", w, MGT_F32, IN);
    } else {
        ADD(l, op->u.conv.out, "dw", w, MGT_F32, role);
        ADD(l, op->u.conv.in1, "dy", y, act_out(op), IN);
        ADD(l, op->u.conv.in2, "x", x, act_in(op), IN);
    }
}

/* ---- batch norm ---- */

static mgt_status check_bn_shape(const mgt_op *op, const mgt_bn_shape *sh)
{
    NEED_POS(op, sh->n, "batch n");
    NEED_POS(op, sh->c, "channels c");
    NEED_POS(op, sh->hw, "spatial size hw");
    if (!product_fits(sh->n, sh->c, sh->hw, 1))
        return INVALID(op, "tensor size overflows (n %d, c %d, hw %d)", sh->n, sh->c, sh->hw);
    /* Written as !(x > 0) so that NaN is refused too. */
    if (!(sh->eps > 0.0f))
        return INVALID(op, "eps %g must be positive", (double)sh->eps);
    if (!(sh->momentum >= 0.0f && sh->momentum <= 1.0f))
        return INVALID(op, "momentum %g must be in [0, 1]", (double)sh->momentum);
    return check_layout(op, sh->layout, sh->c, "x");
}

/* The synchronised batch norm's halves take NCHW only and no folded ReLU (a model that syncs
   keeps both apart). */
static mgt_status check_bn_shape_nchw(const mgt_op *op, const mgt_bn_shape *sh)
{
    if (sh->layout != MGT_LAYOUT_NCHW)
        return INVALID(op, "takes NCHW only, not layout %d", (int)sh->layout);
    if (sh->relu)
        return INVALID(op, "takes no folded ReLU (relu %d)", (int)sh->relu);
    return check_bn_shape(op, sh);
}

/* A fused residual add (z, dz) comes with the ReLU after it. */
static mgt_status check_bn_residual(const mgt_op *op, const mgt_bn_shape *sh, bool residual)
{
    mgt_status st = check_bn_shape(op, sh);
    if (st == MGT_OK && residual && !sh->relu)
        return INVALID(op, "a fused residual add needs the ReLU after it (relu %d)", (int)sh->relu);
    return st;
}

static mgt_status check_bn_train(const mgt_op *op)
{
    const mgt_bn_shape *sh = &op->u.bn_train.sh;
    mgt_status st = check_bn_residual(op, sh, op->u.bn_train.z != NULL);
    if (st != MGT_OK)
        return st;
    /* The unbiased variance divides by n*hw - 1, as PyTorch refuses to. */
    if ((long long)sh->n * sh->hw < 2)
        return INVALID(op, "needs more than one value per channel (n %d, hw %d)", sh->n, sh->hw);
    return MGT_OK;
}

static void operands_bn_train(mgt_op *op, operand_list *l)
{
    mgt_bn_train_args *b = &op->u.bn_train;
    size_t x = zmul(b->sh.n, b->sh.c, b->sh.hw, 1), c = (size_t)b->sh.c;
    ADD(l, b->y, "y", x, act_out(op), OUT);
    ADD(l, b->save_mean, "save_mean", c, MGT_F32, OUT);
    ADD(l, b->save_invstd, "save_invstd", c, MGT_F32, OUT);
    ADD(l, b->running_mean, "running_mean", c, MGT_F32, INOUT);
    ADD(l, b->running_var, "running_var", c, MGT_F32, INOUT);
    ADD(l, b->x, "x", x, act_in(op), IN);
    ADD(l, b->gamma, "gamma", c, MGT_F32, IN);
    ADD(l, b->beta, "beta", c, MGT_F32, IN);
    if (b->z)
        ADD(l, b->z, "z", x, act_out(op), IN);
}

static mgt_status check_bn_eval(const mgt_op *op)
{
    return check_bn_residual(op, &op->u.bn_eval.sh, op->u.bn_eval.z != NULL);
}

static void operands_bn_eval(mgt_op *op, operand_list *l)
{
    mgt_bn_eval_args *b = &op->u.bn_eval;
    size_t x = zmul(b->sh.n, b->sh.c, b->sh.hw, 1), c = (size_t)b->sh.c;
    ADD(l, b->y, "y", x, act_out(op), OUT);
    ADD(l, b->x, "x", x, act_in(op), IN);
    ADD(l, b->gamma, "gamma", c, MGT_F32, IN);
    ADD(l, b->beta, "beta", c, MGT_F32, IN);
    ADD(l, b->running_mean, "running_mean", c, MGT_F32, IN);
    ADD(l, b->running_var, "running_var", c, MGT_F32, IN);
    if (b->z)
        ADD(l, b->z, "z", x, act_out(op), IN);
}

static mgt_status check_bn_bwd(const mgt_op *op)
{
    return check_bn_residual(op, &op->u.bn_bwd.sh, op->u.bn_bwd.dz != NULL);
}

static void operands_bn_bwd(mgt_op *op, operand_list *l)
{
    mgt_bn_bwd_args *b = &op->u.bn_bwd;
    size_t x = zmul(b->sh.n, b->sh.c, b->sh.hw, 1), c = (size_t)b->sh.c;
    ADD(l, b->dx, "dx", x, act_in(op), OUT);
    ADD(l, b->dgamma, "dgamma", c, MGT_F32, INOUT);
    ADD(l, b->dbeta, "dbeta", c, MGT_F32, INOUT);
    ADD(l, b->dy, "dy", x, act_out(op), IN);
    if (b->sh.relu)
        ADD(l, b->y, "y", x, act_out(op), IN);
    ADD(l, b->x, "x", x, act_in(op), IN);
    ADD(l, b->gamma, "gamma", c, MGT_F32, IN);
    ADD(l, b->save_mean, "save_mean", c, MGT_F32, IN);
    ADD(l, b->save_invstd, "save_invstd", c, MGT_F32, IN);
    if (b->dz)
        ADD(l, b->dz, "dz", x, act_out(op), OUT);
}

static mgt_status check_bn_stats(const mgt_op *op)
{
    return check_bn_shape_nchw(op, &op->u.bn_stats.sh);
}

static void operands_bn_stats(mgt_op *op, operand_list *l)
{
    mgt_bn_stats_args *b = &op->u.bn_stats;
    size_t x = zmul(b->sh.n, b->sh.c, b->sh.hw, 1), c = (size_t)b->sh.c;
    ADD(l, b->mean, "mean", c, MGT_F32, OUT);
    ADD(l, b->var, "var", c, MGT_F32, OUT);
    ADD(l, b->x, "x", x, MGT_F32, IN);
}

static mgt_status check_bn_bwd_elemt(const mgt_op *op)
{
    mgt_status st = check_bn_shape_nchw(op, &op->u.bn_bwd_elemt.sh);
    if (st != MGT_OK)
        return st;
    /* !(x >= ...) refuses NaN too; the shard's own values are part of the count */
    if (!(op->u.bn_bwd_elemt.count >= (double)op->u.bn_bwd_elemt.sh.n * op->u.bn_bwd_elemt.sh.hw))
        return INVALID(op, "count %g is less than this shard's %d x %d values",
                       op->u.bn_bwd_elemt.count, op->u.bn_bwd_elemt.sh.n, op->u.bn_bwd_elemt.sh.hw);
    return MGT_OK;
}

static void operands_bn_bwd_elemt(mgt_op *op, operand_list *l)
{
    mgt_bn_bwd_elemt_args *b = &op->u.bn_bwd_elemt;
    size_t x = zmul(b->sh.n, b->sh.c, b->sh.hw, 1), c = (size_t)b->sh.c;
    ADD(l, b->dx, "dx", x, MGT_F32, OUT);
    ADD(l, b->dy, "dy", x, MGT_F32, IN);
    ADD(l, b->x, "x", x, MGT_F32, IN);
    ADD(l, b->gamma, "gamma", c, MGT_F32, IN);
    ADD(l, b->mean, "mean", c, MGT_F32, IN);
    ADD(l, b->invstd, "invstd", c, MGT_F32, IN);
    ADD(l, b->sum_dy, "sum_dy", c, MGT_F32, IN);
    ADD(l, b->sum_dy_xhat, "sum_dy_xhat", c, MGT_F32, IN);
}

/* ---- pooling ---- */

static mgt_status check_pool(const mgt_op *op, const mgt_pool2d_shape *sh)
{
    NEED_POS(op, sh->n, "batch n");
    NEED_POS(op, sh->c, "channels c");
    NEED_POS(op, sh->h, "height h");
    NEED_POS(op, sh->w, "width w");
    NEED_POS(op, sh->kh, "window height");
    NEED_POS(op, sh->kw, "window width");
    if (sh->stride_h < 1 || sh->stride_w < 1)
        return INVALID(op, "stride %dx%d must be at least 1", sh->stride_h, sh->stride_w);
    if (sh->pad_h < 0 || sh->pad_w < 0)
        return INVALID(op, "padding %dx%d must not be negative", sh->pad_h, sh->pad_w);
    /* PyTorch's rule, stricter than pad < window: it keeps at least half of every window on
       real input, so no maximum is ever the -inf of the padding. */
    if (sh->pad_h > sh->kh / 2)
        return INVALID(op, "padding %d > half the window height %d", sh->pad_h, sh->kh);
    if (sh->pad_w > sh->kw / 2)
        return INVALID(op, "padding %d > half the window width %d", sh->pad_w, sh->kw);
    int p = mgt_pool2d_out_h(sh), q = mgt_pool2d_out_w(sh);
    if (p < 1 || q < 1)
        return INVALID(op, "output %dx%d is empty (input %dx%d, window %dx%d, padding %dx%d)", p, q,
                       sh->h, sh->w, sh->kh, sh->kw, sh->pad_h, sh->pad_w);
    if (!product_fits(sh->n, sh->c, sh->h, sh->w))
        return INVALID(op, "tensor size overflows (n %d, c %d, h %d, w %d)", sh->n, sh->c, sh->h,
                       sh->w);
    return check_layout(op, sh->layout, sh->c, "x");
}

static mgt_status check_maxpool_fwd(const mgt_op *op)
{
    return check_pool(op, &op->u.maxpool_fwd.sh);
}

static void operands_maxpool_fwd(mgt_op *op, operand_list *l)
{
    const mgt_pool2d_shape *sh = &op->u.maxpool_fwd.sh;
    ADD(l, op->u.maxpool_fwd.y, "y", zmul(sh->n, sh->c, mgt_pool2d_out_h(sh), mgt_pool2d_out_w(sh)),
        act_out(op), OUT);
    ADD(l, op->u.maxpool_fwd.x, "x", zmul(sh->n, sh->c, sh->h, sh->w), act_in(op), IN);
}

static mgt_status check_maxpool_bwd(const mgt_op *op)
{
    return check_pool(op, &op->u.maxpool_bwd.sh);
}

static void operands_maxpool_bwd(mgt_op *op, operand_list *l)
{
    const mgt_pool2d_shape *sh = &op->u.maxpool_bwd.sh;
    size_t x = zmul(sh->n, sh->c, sh->h, sh->w);
    size_t y = zmul(sh->n, sh->c, mgt_pool2d_out_h(sh), mgt_pool2d_out_w(sh));
    ADD(l, op->u.maxpool_bwd.dx, "dx", x, act_in(op), OUT);
    ADD(l, op->u.maxpool_bwd.dy, "dy", y, act_out(op), IN);
    ADD(l, op->u.maxpool_bwd.x, "x", x, act_in(op), IN);
    ADD(l, op->u.maxpool_bwd.y, "y", y, act_out(op), IN);
}

static mgt_status check_planes(const mgt_op *op, int n, int c, int hw)
{
    NEED_POS(op, n, "batch n");
    NEED_POS(op, c, "channels c");
    NEED_POS(op, hw, "spatial size hw");
    if (!product_fits(n, c, hw, 1))
        return INVALID(op, "tensor size overflows (n %d, c %d, hw %d)", n, c, hw);
    return MGT_OK;
}

static mgt_status check_avgpool_fwd(const mgt_op *op)
{
    const mgt_avgpool_fwd_args *a = &op->u.avgpool_fwd;
    mgt_status st = check_planes(op, a->n, a->c, a->hw);
    return st == MGT_OK ? check_layout(op, a->layout, a->c, "x") : st;
}

static void operands_avgpool_fwd(mgt_op *op, operand_list *l)
{
    mgt_avgpool_fwd_args *a = &op->u.avgpool_fwd;
    ADD(l, a->y, "y", zmul(a->n, a->c, 1, 1), act_out(op), OUT);
    ADD(l, a->x, "x", zmul(a->n, a->c, a->hw, 1), act_in(op), IN);
}

static mgt_status check_avgpool_bwd(const mgt_op *op)
{
    const mgt_avgpool_bwd_args *a = &op->u.avgpool_bwd;
    mgt_status st = check_planes(op, a->n, a->c, a->hw);
    return st == MGT_OK ? check_layout(op, a->layout, a->c, "dx") : st;
}

static void operands_avgpool_bwd(mgt_op *op, operand_list *l)
{
    mgt_avgpool_bwd_args *a = &op->u.avgpool_bwd;
    ADD(l, a->dx, "dx", zmul(a->n, a->c, a->hw, 1), act_in(op), OUT);
    ADD(l, a->dy, "dy", zmul(a->n, a->c, 1, 1), act_out(op), IN);
}

/* ---- linear bias ---- */

static mgt_status check_matrix(const mgt_op *op, int rows, int cols)
{
    NEED_POS(op, rows, "rows");
    NEED_POS(op, cols, "cols");
    if (!product_fits(rows, cols, 1, 1))
        return INVALID(op, "size overflows (rows %d, cols %d)", rows, cols);
    return MGT_OK;
}

static mgt_status check_bias_fwd(const mgt_op *op)
{
    return check_matrix(op, op->u.bias_fwd.rows, op->u.bias_fwd.cols);
}

static void operands_bias_fwd(mgt_op *op, operand_list *l)
{
    ADD(l, op->u.bias_fwd.y, "y", zmul(op->u.bias_fwd.rows, op->u.bias_fwd.cols, 1, 1), act_out(op),
        INOUT);
    ADD(l, op->u.bias_fwd.bias, "bias", (size_t)op->u.bias_fwd.cols, MGT_F32, IN);
}

static mgt_status check_bias_bwd(const mgt_op *op)
{
    return check_matrix(op, op->u.bias_bwd.rows, op->u.bias_bwd.cols);
}

static void operands_bias_bwd(mgt_op *op, operand_list *l)
{
    ADD(l, op->u.bias_bwd.dbias, "dbias", (size_t)op->u.bias_bwd.cols, MGT_F32, INOUT);
    ADD(l, op->u.bias_bwd.dy, "dy", zmul(op->u.bias_bwd.rows, op->u.bias_bwd.cols, 1, 1),
        act_out(op), IN);
}

/* ---- softmax cross-entropy, top-k ---- */

static mgt_status check_rows(const mgt_op *op, int n, int classes)
{
    NEED_POS(op, n, "rows n");
    NEED_POS(op, classes, "classes");
    if (!product_fits(n, classes, 1, 1))
        return INVALID(op, "size overflows (n %d, classes %d)", n, classes);
    return MGT_OK;
}

static mgt_status check_smoothing(const mgt_op *op, float eps)
{
    if (!(eps >= 0.0f && eps < 1.0f))
        return INVALID(op, "label smoothing %g must be in [0, 1)", (double)eps);
    return MGT_OK;
}

/* labels_b and weights go together: both NULL is the one-hot target of labels */
static mgt_status check_targets(const mgt_op *op, int n, int classes, float eps,
                                const int32_t *labels_b, const float *weights)
{
    mgt_status st = check_rows(op, n, classes);
    if (st == MGT_OK)
        st = check_smoothing(op, eps);
    if (st == MGT_OK && (labels_b == NULL) != (weights == NULL))
        return INVALID(op, "%s without %s", labels_b ? "labels_b" : "weights",
                       labels_b ? "weights" : "labels_b");
    return st;
}

static void operands_targets(operand_list *l, const int32_t **labels, const int32_t **labels_b,
                             const float **weights, int n)
{
    ADD(l, *labels, "labels", (size_t)n, MGT_I32, IN);
    if (*labels_b) {
        ADD(l, *labels_b, "labels_b", (size_t)n, MGT_I32, IN);
        ADD(l, *weights, "weights", (size_t)n, MGT_F32, IN);
    }
}

static mgt_status check_xent_fwd(const mgt_op *op)
{
    const mgt_xent_fwd_args *x = &op->u.xent_fwd;
    return check_targets(op, x->n, x->classes, x->smoothing, x->labels_b, x->weights);
}

static void operands_xent_fwd(mgt_op *op, operand_list *l)
{
    mgt_xent_fwd_args *x = &op->u.xent_fwd;
    size_t nc = zmul(x->n, x->classes, 1, 1);
    ADD(l, x->loss, "loss", 1, MGT_F32, OUT);
    ADD(l, x->probs, "probs", nc, MGT_F32, OUT);
    ADD(l, x->logits, "logits", nc, MGT_F32, IN);
    operands_targets(l, &x->labels, &x->labels_b, &x->weights, x->n);
}

static mgt_status check_xent_bwd(const mgt_op *op)
{
    const mgt_xent_bwd_args *x = &op->u.xent_bwd;
    return check_targets(op, x->n, x->classes, x->smoothing, x->labels_b, x->weights);
}

static void operands_xent_bwd(mgt_op *op, operand_list *l)
{
    mgt_xent_bwd_args *x = &op->u.xent_bwd;
    size_t nc = zmul(x->n, x->classes, 1, 1);
    ADD(l, x->dlogits, "dlogits", nc, MGT_F32, OUT);
    ADD(l, x->probs, "probs", nc, MGT_F32, IN);
    operands_targets(l, &x->labels, &x->labels_b, &x->weights, x->n);
}

static mgt_status check_topk(const mgt_op *op)
{
    mgt_status st = check_rows(op, op->u.topk.n, op->u.topk.classes);
    if (st != MGT_OK)
        return st;
    if (op->u.topk.k < 1)
        return INVALID(op, "k %d must be at least 1", op->u.topk.k);
    return MGT_OK;
}

static void operands_topk(mgt_op *op, operand_list *l)
{
    mgt_topk_args *t = &op->u.topk;
    ADD(l, t->count, "count", 1, MGT_I32, INOUT);
    ADD(l, t->logits, "logits", zmul(t->n, t->classes, 1, 1), MGT_F32, IN);
    ADD(l, t->labels, "labels", (size_t)t->n, MGT_I32, IN);
}

/* ---- SGD ---- */

static mgt_status check_sgd(const mgt_op *op)
{
    const mgt_sgd_params *p = &op->u.sgd.p;
    mgt_status st = check_n(op, op->u.sgd.n);
    if (st != MGT_OK)
        return st;
    /* PyTorch's SGD refuses the same values. */
    if (!(p->lr >= 0.0f))
        return INVALID(op, "learning rate %g must not be negative", (double)p->lr);
    if (!(p->momentum >= 0.0f))
        return INVALID(op, "momentum %g must not be negative", (double)p->momentum);
    if (!(p->weight_decay >= 0.0f))
        return INVALID(op, "weight decay %g must not be negative", (double)p->weight_decay);
    if (p->nesterov && (p->momentum <= 0.0f || p->dampening != 0.0f))
        return INVALID(op, "nesterov needs momentum > 0 (got %g) and dampening 0 (got %g)",
                       (double)p->momentum, (double)p->dampening);
    /* The generic NULL check would say as much; this says why the buffer is needed. */
    if (p->momentum != 0.0f && !op->u.sgd.momentum_buf)
        return INVALID(op, "momentum_buf is NULL with momentum %g", (double)p->momentum);
    return MGT_OK;
}

static void operands_sgd(mgt_op *op, operand_list *l)
{
    mgt_sgd_args *s = &op->u.sgd;
    ADD(l, s->param, "param", s->n, MGT_F32, INOUT);
    /* With momentum 0 the buffer is never touched, so it is no operand even when given; on
       the first step it is written before it is read. */
    if (s->p.momentum != 0.0f)
        ADD(l, s->momentum_buf, "momentum_buf", s->n, MGT_F32, s->p.first_step ? OUT : INOUT);
    ADD(l, s->grad, "grad", s->n, MGT_F32, IN);
}

/* ---- AdamW and RMSprop ---- */

static mgt_status check_adamw(const mgt_op *op)
{
    const mgt_adamw_params *p = &op->u.adamw.p;
    mgt_status st = check_n(op, op->u.adamw.n);
    if (st != MGT_OK)
        return st;
    /* torch.optim.AdamW refuses the same betas and eps */
    if (!(p->beta1 >= 0.0f && p->beta1 < 1.0f && p->beta2 >= 0.0f && p->beta2 < 1.0f))
        return INVALID(op, "betas %g, %g must lie in [0, 1)", (double)p->beta1, (double)p->beta2);
    if (!(p->eps >= 0.0f) || !(p->step_size >= 0.0f) || !(p->bc2_sqrt > 0.0f))
        return INVALID(op,
                       "eps %g and step size %g must not be negative, the bias correction %g "
                       "must be positive",
                       (double)p->eps, (double)p->step_size, (double)p->bc2_sqrt);
    return MGT_OK;
}

static void operands_adamw(mgt_op *op, operand_list *l)
{
    mgt_adamw_args *a = &op->u.adamw;
    ADD(l, a->param, "param", a->n, MGT_F32, INOUT);
    ADD(l, a->exp_avg, "exp_avg", a->n, MGT_F32, INOUT);
    ADD(l, a->exp_avg_sq, "exp_avg_sq", a->n, MGT_F32, INOUT);
    ADD(l, a->grad, "grad", a->n, MGT_F32, IN);
}

static mgt_status check_rmsprop(const mgt_op *op)
{
    const mgt_rmsprop_params *p = &op->u.rmsprop.p;
    mgt_status st = check_n(op, op->u.rmsprop.n);
    if (st != MGT_OK)
        return st;
    if (!(p->lr >= 0.0f) || !(p->eps >= 0.0f) || !(p->alpha >= 0.0f) || !(p->momentum >= 0.0f) ||
        !(p->weight_decay >= 0.0f))
        return INVALID(op,
                       "lr %g, alpha %g, eps %g, momentum %g and weight decay %g must not be "
                       "negative",
                       (double)p->lr, (double)p->alpha, (double)p->eps, (double)p->momentum,
                       (double)p->weight_decay);
    if (p->momentum != 0.0f && !op->u.rmsprop.momentum_buf)
        return INVALID(op, "momentum_buf is NULL with momentum %g", (double)p->momentum);
    return MGT_OK;
}

static void operands_rmsprop(mgt_op *op, operand_list *l)
{
    mgt_rmsprop_args *a = &op->u.rmsprop;
    ADD(l, a->param, "param", a->n, MGT_F32, INOUT);
    ADD(l, a->square_avg, "square_avg", a->n, MGT_F32, INOUT);
    if (a->p.momentum != 0.0f)
        ADD(l, a->momentum_buf, "momentum_buf", a->n, MGT_F32, INOUT);
    ADD(l, a->grad, "grad", a->n, MGT_F32, IN);
}

/* ---- channel bias, dropout ---- */

/* [n, c, hw] activations in NCHW or NHWC (the channel ops' layouts: nChw16c is the mock
   devices' and their kernels for these take NCHW only). */
static mgt_status check_planes_in(const mgt_op *op, int n, int c, int hw, mgt_layout l)
{
    mgt_status st = check_planes(op, n, c, hw);
    if (st == MGT_OK && l != MGT_LAYOUT_NCHW && l != MGT_LAYOUT_NHWC)
        return INVALID(op, "layout %d is neither NCHW nor NHWC", (int)l);
    return st;
}

static mgt_status check_chbias_fwd(const mgt_op *op)
{
    const mgt_chbias_fwd_args *b = &op->u.chbias_fwd;
    return check_planes_in(op, b->n, b->c, b->hw, b->layout);
}

static void operands_chbias_fwd(mgt_op *op, operand_list *l)
{
    mgt_chbias_fwd_args *b = &op->u.chbias_fwd;
    ADD(l, b->y, "y", zmul(b->n, b->c, b->hw, 1), act_out(op), INOUT);
    ADD(l, b->bias, "bias", (size_t)b->c, MGT_F32, IN);
}

static mgt_status check_chbias_bwd(const mgt_op *op)
{
    const mgt_chbias_bwd_args *b = &op->u.chbias_bwd;
    return check_planes_in(op, b->n, b->c, b->hw, b->layout);
}

static void operands_chbias_bwd(mgt_op *op, operand_list *l)
{
    mgt_chbias_bwd_args *b = &op->u.chbias_bwd;
    ADD(l, b->dbias, "dbias", (size_t)b->c, MGT_F32, INOUT);
    ADD(l, b->dy, "dy", zmul(b->n, b->c, b->hw, 1), act_out(op), IN);
}

static mgt_status check_dropout(const mgt_op *op)
{
    const mgt_dropout_args *d = &op->u.dropout;
    NEED_POS(op, d->n, "batch n");
    NEED_POS(op, d->per_image, "per-image size");
    /* the mask's counter holds j / 4 in 32 bits */
    if (d->per_image > ((size_t)1 << 33) || !product_fits(d->n, (long long)d->per_image, 1, 1))
        return INVALID(op, "size overflows (n %d, per image %zu)", d->n, d->per_image);
    if (!(d->p >= 0.0f && d->p < 1.0f))
        return INVALID(op, "probability %g must be in [0, 1)", (double)d->p);
    if (d->layout == MGT_LAYOUT_NHWC && (d->c <= 0 || d->per_image % (size_t)d->c != 0))
        return INVALID(op, "NHWC needs channels c (%d) that divide the per-image size %zu", d->c,
                       d->per_image);
    if (d->layout != MGT_LAYOUT_NCHW && d->layout != MGT_LAYOUT_NHWC)
        return INVALID(op, "layout %d is neither NCHW nor NHWC", (int)d->layout);
    return MGT_OK;
}

static void operands_dropout(mgt_op *op, operand_list *l)
{
    mgt_dropout_args *d = &op->u.dropout;
    size_t n = (size_t)d->n * d->per_image;
    ADD(l, d->y, "y", n, act_out(op), OUT);
    ADD(l, d->x, "x", n, act_in(op), IN);
}

static mgt_status check_apool(const mgt_op *op, int n, int c, int h, int w, int oh, int ow)
{
    mgt_status st = check_planes(op, n, c, 1);
    if (st != MGT_OK)
        return st;
    NEED_POS(op, h, "height h");
    NEED_POS(op, w, "width w");
    NEED_POS(op, oh, "output height");
    NEED_POS(op, ow, "output width");
    if (!product_fits(n, c, h, w) || !product_fits(n, c, oh, ow))
        return INVALID(op, "tensor size overflows (n %d, c %d, %dx%d -> %dx%d)", n, c, h, w, oh,
                       ow);
    return MGT_OK;
}

static mgt_status check_apool_fwd(const mgt_op *op)
{
    const mgt_apool_fwd_args *a = &op->u.apool_fwd;
    mgt_status st = check_apool(op, a->n, a->c, a->h, a->w, a->oh, a->ow);
    return st == MGT_OK ? check_layout(op, a->layout, a->c, "x") : st;
}

static void operands_apool_fwd(mgt_op *op, operand_list *l)
{
    mgt_apool_fwd_args *a = &op->u.apool_fwd;
    ADD(l, a->y, "y", zmul(a->n, a->c, a->oh, a->ow), act_out(op), OUT);
    ADD(l, a->x, "x", zmul(a->n, a->c, a->h, a->w), act_in(op), IN);
}

static mgt_status check_apool_bwd(const mgt_op *op)
{
    const mgt_apool_bwd_args *a = &op->u.apool_bwd;
    mgt_status st = check_apool(op, a->n, a->c, a->h, a->w, a->oh, a->ow);
    return st == MGT_OK ? check_layout(op, a->layout, a->c, "dx") : st;
}

static void operands_apool_bwd(mgt_op *op, operand_list *l)
{
    mgt_apool_bwd_args *a = &op->u.apool_bwd;
    ADD(l, a->dx, "dx", zmul(a->n, a->c, a->h, a->w), act_in(op), OUT);
    ADD(l, a->dy, "dy", zmul(a->n, a->c, a->oh, a->ow), act_out(op), IN);
}

/* The floats a strided region spans: the last image's last row ends it. */
static size_t scopy_extent(int n, int rows, size_t count, size_t stride, size_t row)
{
    return (size_t)(n - 1) * stride + (size_t)(rows - 1) * row + count;
}

static bool scopy_fits(int n, int rows, size_t count, size_t stride, size_t row)
{
    size_t a, b, t;
    return !__builtin_mul_overflow((size_t)(n - 1), stride, &a) &&
           !__builtin_mul_overflow((size_t)(rows - 1), row, &b) &&
           !__builtin_add_overflow(a, b, &t) && !__builtin_add_overflow(t, count, &t) &&
           t <= SIZE_MAX / sizeof(float);
}

static mgt_status check_scopy(const mgt_op *op)
{
    const mgt_scopy_args *c = &op->u.scopy;
    NEED_POS(op, c->n, "batch n");
    NEED_POS(op, c->rows, "rows");
    NEED_POS(op, c->count, "count");
    if (!scopy_fits(c->n, c->rows, c->count, c->y_stride, c->y_row) ||
        !scopy_fits(c->n, c->rows, c->count, c->x_stride, c->x_row))
        return INVALID(op, "size overflows (n %d, rows %d, count %zu)", c->n, c->rows, c->count);
    /* rows of one image, and images, must not overlap in y (each element written once) */
    if ((c->rows > 1 && c->y_row < c->count) ||
        (c->n > 1 && c->y_stride < scopy_extent(1, c->rows, c->count, 0, c->y_row)))
        return INVALID(op, "destination rows overlap (count %zu, row %zu, stride %zu)", c->count,
                       c->y_row, c->y_stride);
    return MGT_OK;
}

static void operands_scopy(mgt_op *op, operand_list *l)
{
    mgt_scopy_args *c = &op->u.scopy;
    /* INOUT: the floats between the rows are in the extent and are left as they are */
    ADD(l, c->y, "y", scopy_extent(c->n, c->rows, c->count, c->y_stride, c->y_row), act_out(op),
        INOUT);
    ADD(l, c->x, "x", scopy_extent(c->n, c->rows, c->count, c->x_stride, c->x_row), act_in(op), IN);
}

uint32_t mgt_dropout_threshold(float p) { return (uint32_t)ceilf(p * 16777216.0f); }

void mgt_dropout_philox(const mgt_dropout_key *k, uint64_t g, uint32_t block, uint32_t out[4])
{
    uint32_t ctr[4] = {block, (uint32_t)k->step, (uint32_t)g,
                       ((uint32_t)(g >> 32) & 0x00FFFFFFu) | ((uint32_t)MGT_RNG_DROPOUT << 24)};
    uint32_t key[2] = {(uint32_t)k->seed, (uint32_t)(k->seed >> 32) ^ (k->stream * 0x9E3779B9u)};
    mgt_philox4x32_10(ctr, key, out);
}

bool mgt_attn_keep(const mgt_attn_shape *sh, int b, int h, int t, int u)
{
    int gps = sh->groups_per_sample;
    uint64_t image = (uint64_t)(b / gps);
    uint64_t j = (((uint64_t)(b % gps) * (uint64_t)sh->heads + (uint64_t)h) * (uint64_t)sh->tq +
                  (uint64_t)t) *
                     (uint64_t)sh->tk +
                 (uint64_t)u;
    uint32_t w[4];
    mgt_dropout_philox(&sh->key, sh->key.sample0 + image * sh->key.sample_stride, (uint32_t)(j / 4),
                       w);
    return (w[j % 4] >> 8) >= mgt_dropout_threshold(sh->p);
}

void mgt_dropout_block(const mgt_op *op, int image, uint32_t block, uint32_t out[4])
{
    const mgt_dropout_args *d = &op->u.dropout;
    mgt_dropout_key k = {d->seed, d->step, d->sample0, d->sample_stride, d->stream};
    mgt_dropout_philox(&k, d->sample0 + (uint64_t)image * d->sample_stride, block, out);
}

/* ---- activations, channel scaling ---- */

static mgt_status check_act(const mgt_op *op, size_t n, mgt_act act)
{
    if ((unsigned)act >= MGT_ACT_COUNT)
        return INVALID(op, "unknown activation %d", (int)act);
    return check_n(op, n);
}

static mgt_status check_act_fwd(const mgt_op *op)
{
    return check_act(op, op->u.act_fwd.n, op->u.act_fwd.act);
}

static void operands_act_fwd(mgt_op *op, operand_list *l)
{
    ADD(l, op->u.act_fwd.y, "y", op->u.act_fwd.n, act_out(op), OUT);
    ADD(l, op->u.act_fwd.x, "x", op->u.act_fwd.n, act_in(op), IN);
}

static mgt_status check_act_bwd(const mgt_op *op)
{
    return check_act(op, op->u.act_bwd.n, op->u.act_bwd.act);
}

static void operands_act_bwd(mgt_op *op, operand_list *l)
{
    ADD(l, op->u.act_bwd.dx, "dx", op->u.act_bwd.n, act_in(op), OUT);
    ADD(l, op->u.act_bwd.dy, "dy", op->u.act_bwd.n, act_out(op), IN);
    ADD(l, op->u.act_bwd.x, "x", op->u.act_bwd.n, act_in(op), IN);
}

/* The channel scale also takes the mock devices' nChw16c (EfficientNet's squeeze-excite
   inside a blocked body). */
static mgt_status check_planes_any(const mgt_op *op, int n, int c, int hw, mgt_layout l)
{
    mgt_status st = check_planes(op, n, c, hw);
    return st == MGT_OK ? check_layout(op, l, c, "x") : st;
}

static mgt_status check_chscale_fwd(const mgt_op *op)
{
    const mgt_chscale_fwd_args *a = &op->u.chscale_fwd;
    return check_planes_any(op, a->n, a->c, a->hw, a->layout);
}

static void operands_chscale_fwd(mgt_op *op, operand_list *l)
{
    mgt_chscale_fwd_args *a = &op->u.chscale_fwd;
    ADD(l, a->y, "y", zmul(a->n, a->c, a->hw, 1), act_out(op), OUT);
    ADD(l, a->x, "x", zmul(a->n, a->c, a->hw, 1), act_in(op), IN);
    ADD(l, a->scale, "scale", zmul(a->shared ? 1 : a->n, a->c, 1, 1), MGT_F32, IN);
}

static mgt_status check_chscale_bwd(const mgt_op *op)
{
    const mgt_chscale_bwd_args *a = &op->u.chscale_bwd;
    return check_planes_any(op, a->n, a->c, a->hw, a->layout);
}

static void operands_chscale_bwd(mgt_op *op, operand_list *l)
{
    mgt_chscale_bwd_args *a = &op->u.chscale_bwd;
    size_t ns = zmul(a->shared ? 1 : a->n, a->c, 1, 1);
    ADD(l, a->dx, "dx", zmul(a->n, a->c, a->hw, 1), act_in(op), OUT);
    if (a->dscale)
        ADD(l, a->dscale, "dscale", ns, MGT_F32, a->shared ? INOUT : OUT);
    ADD(l, a->dy, "dy", zmul(a->n, a->c, a->hw, 1), act_out(op), IN);
    if (a->dscale)
        ADD(l, a->x, "x", zmul(a->n, a->c, a->hw, 1), act_in(op), IN);
    ADD(l, a->scale, "scale", ns, MGT_F32, IN);
}

static mgt_status check_lnc(const mgt_op *op, int n, int c, int hw, float eps, mgt_layout l)
{
    if (!(eps > 0.0f))
        return INVALID(op, "eps %g must be positive", (double)eps);
    return check_planes_in(op, n, c, hw, l);
}

static mgt_status check_lnc_fwd(const mgt_op *op)
{
    const mgt_lnc_fwd_args *a = &op->u.lnc_fwd;
    return check_lnc(op, a->n, a->c, a->hw, a->eps, a->layout);
}

static void operands_lnc_fwd(mgt_op *op, operand_list *l)
{
    mgt_lnc_fwd_args *a = &op->u.lnc_fwd;
    ADD(l, a->y, "y", zmul(a->n, a->c, a->hw, 1), act_out(op), OUT);
    ADD(l, a->x, "x", zmul(a->n, a->c, a->hw, 1), act_in(op), IN);
    ADD(l, a->weight, "weight", (size_t)a->c, MGT_F32, IN);
    ADD(l, a->bias, "bias", (size_t)a->c, MGT_F32, IN);
}

static mgt_status check_lnc_bwd(const mgt_op *op)
{
    const mgt_lnc_bwd_args *a = &op->u.lnc_bwd;
    return check_lnc(op, a->n, a->c, a->hw, a->eps, a->layout);
}

static void operands_lnc_bwd(mgt_op *op, operand_list *l)
{
    mgt_lnc_bwd_args *a = &op->u.lnc_bwd;
    ADD(l, a->dx, "dx", zmul(a->n, a->c, a->hw, 1), act_in(op), OUT);
    ADD(l, a->dweight, "dweight", (size_t)a->c, MGT_F32, INOUT);
    ADD(l, a->dbias, "dbias", (size_t)a->c, MGT_F32, INOUT);
    ADD(l, a->dy, "dy", zmul(a->n, a->c, a->hw, 1), act_out(op), IN);
    ADD(l, a->x, "x", zmul(a->n, a->c, a->hw, 1), act_in(op), IN);
    ADD(l, a->weight, "weight", (size_t)a->c, MGT_F32, IN);
}

/* ---- the transformer ops ---- */

/* The floats a walk of sizes and strides spans (its last element's offset plus one); false on
   overflow. */
static bool span_fits(int nd, const int *size, const size_t *stride, size_t *out)
{
    size_t t = 0, a;
    for (int d = 0; d < nd; d++)
        if (__builtin_mul_overflow((size_t)(size[d] - 1), stride[d], &a) ||
            __builtin_add_overflow(t, a, &t))
            return false;
    *out = t + 1;
    return *out <= SIZE_MAX / sizeof(float);
}

static size_t permute_walk_span(const mgt_permute_shape *sh)
{
    size_t n = 0;
    return span_fits(sh->ndim, sh->size, sh->walk_stride, &n) ? n : 0;
}

static size_t permute_grid_span(const mgt_permute_shape *sh)
{
    size_t n = 0;
    return span_fits(sh->naxes, sh->limit, sh->grid_stride, &n) ? n : 0;
}

static mgt_status check_permute(const mgt_op *op)
{
    const mgt_permute_shape *sh = &op->u.permute.sh;
    if (sh->ndim < 1 || sh->ndim > MGT_PERMUTE_DIMS || sh->naxes < 1 ||
        sh->naxes > MGT_PERMUTE_DIMS)
        return INVALID(op, "%d dims and %d axes: each must be 1 to %d", sh->ndim, sh->naxes,
                       MGT_PERMUTE_DIMS);
    long long reach[MGT_PERMUTE_DIMS] = {0}; /* the largest raw index of each axis */
    for (int d = 0; d < sh->ndim; d++) {
        NEED_POS(op, sh->size[d], "dim size");
        if (sh->axis[d] < 0 || sh->axis[d] >= sh->naxes)
            return INVALID(op, "dim %d moves along axis %d of %d", d, sh->axis[d], sh->naxes);
        if (sh->coef[d] < 0 || (sh->scatter && sh->coef[d] == 0))
            return INVALID(op, "dim %d's step %d must be %s", d, sh->coef[d],
                           sh->scatter ? "positive in a scatter" : "at least 0");
        reach[sh->axis[d]] += (long long)sh->coef[d] * (sh->size[d] - 1);
        if (reach[sh->axis[d]] > INT32_MAX)
            return INVALID(op, "axis %d's index overflows", sh->axis[d]);
    }
    for (int a = 0; a < sh->naxes; a++) {
        NEED_POS(op, sh->limit[a], "axis limit");
        if (sh->extent[a] < 0 || (sh->extent[a] > 0 && sh->limit[a] > sh->extent[a]))
            return INVALID(op, "axis %d: limit %d past its extent %d", a, sh->limit[a],
                           sh->extent[a]);
        if (sh->extent[a] == 0 && sh->shift[a] < 0)
            return INVALID(op, "axis %d: shift %d without an extent to wrap in", a, sh->shift[a]);
        if (reach[a] + sh->shift[a] > INT32_MAX)
            return INVALID(op, "axis %d's index overflows", a);
    }
    if (!permute_walk_span(sh) || !permute_grid_span(sh))
        return INVALID(op, "a tensor's size overflows (%d dims, %d axes)", sh->ndim, sh->naxes);
    return MGT_OK;
}

static void operands_permute(mgt_op *op, operand_list *l)
{
    mgt_permute_args *a = &op->u.permute;
    /* INOUT: the floats between strided rows (and the grid's unreached ones) keep their value */
    /* the side read is stored as store_in, the side written as store_out */
    mgt_dtype rd = act_in(op), wr = act_out(op);
    ADD(l, a->walk, "walk", permute_walk_span(&a->sh), a->sh.scatter ? rd : wr,
        a->sh.scatter ? IN : INOUT);
    ADD(l, a->grid, "grid", permute_grid_span(&a->sh), a->sh.scatter ? wr : rd,
        a->sh.scatter ? INOUT : IN);
}

/* The floats of a [groups, tokens, heads * dh] tensor with strides batch and row. */
static size_t attn_span(const mgt_attn_shape *sh, int tokens, size_t batch, size_t row)
{
    return (size_t)(sh->batch - 1) * batch + (size_t)(tokens - 1) * row +
           (size_t)sh->heads * (size_t)sh->dh;
}

static bool attn_layout_ok(const mgt_attn_shape *sh, int tokens, size_t batch, size_t row)
{
    size_t width = (size_t)sh->heads * (size_t)sh->dh;
    if (tokens > 1 && row < width)
        return false;
    if (sh->batch > 1 && batch < (size_t)(tokens - 1) * row + width)
        return false;
    size_t a, b, t;
    return !__builtin_mul_overflow((size_t)(sh->batch - 1), batch, &a) &&
           !__builtin_mul_overflow((size_t)(tokens - 1), row, &b) &&
           !__builtin_add_overflow(a, b, &t) && !__builtin_add_overflow(t, width, &t) &&
           t <= SIZE_MAX / sizeof(float);
}

static mgt_status check_attn(const mgt_op *op, const mgt_attn_shape *sh, bool mask)
{
    NEED_POS(op, sh->batch, "batch");
    NEED_POS(op, sh->heads, "heads");
    NEED_POS(op, sh->tq, "queries tq");
    NEED_POS(op, sh->tk, "keys tk");
    NEED_POS(op, sh->dh, "head size dh");
    NEED_POS(op, sh->groups_per_sample, "groups per sample");
    if (!product_fits(sh->batch, sh->heads, sh->tq, sh->tk) ||
        !product_fits(sh->heads, sh->dh, 3, 1))
        return INVALID(op, "size overflows (batch %d, heads %d, tq %d, tk %d)", sh->batch,
                       sh->heads, sh->tq, sh->tk);
    if (!attn_layout_ok(sh, sh->tq, sh->q_batch, sh->q_row) ||
        !attn_layout_ok(sh, sh->tk, sh->kv_batch, sh->kv_row) ||
        !attn_layout_ok(sh, sh->tq, sh->y_batch, sh->y_row))
        return INVALID(op,
                       "rows or groups overlap or overflow (heads x dh %d, rows q %zu kv %zu y "
                       "%zu, groups q %zu kv %zu y %zu)",
                       sh->heads * sh->dh, sh->q_row, sh->kv_row, sh->y_row, sh->q_batch,
                       sh->kv_batch, sh->y_batch);
    if (sh->batch % sh->groups_per_sample != 0)
        return INVALID(op, "batch %d is not whole samples of %d groups", sh->batch,
                       sh->groups_per_sample);
    if (mask && (sh->masks < 1 || sh->batch % sh->masks != 0))
        return INVALID(op, "%d masks do not divide the batch %d", sh->masks, sh->batch);
    if (!(sh->p >= 0.0f && sh->p < 1.0f))
        return INVALID(op, "dropout p %g must be in [0, 1)", (double)sh->p);
    if (!isfinite(sh->scale))
        return INVALID(op, "scale %g must be finite", (double)sh->scale);
    return MGT_OK;
}

static mgt_status check_attn_fwd(const mgt_op *op)
{
    return check_attn(op, &op->u.attn_fwd.sh, op->u.attn_fwd.mask != NULL);
}

/* q, k and v are activations stored as store_in (the qkv linear's output: three operands that
   may interleave in one array), y and dy as store_out; the bias, mask, lse and logit scale
   stay fp32. */
static void operands_attn_inputs(const mgt_op *op, operand_list *l, const mgt_attn_shape *sh,
                                 const float **q, const float **k, const float **v,
                                 const float **bias, const float **mask, const float **logit_scale)
{
    mgt_dtype in = act_in(op);
    ADD(l, *q, "q", attn_span(sh, sh->tq, sh->q_batch, sh->q_row), in, IN);
    ADD(l, *k, "k", attn_span(sh, sh->tk, sh->kv_batch, sh->kv_row), in, IN);
    ADD(l, *v, "v", attn_span(sh, sh->tk, sh->kv_batch, sh->kv_row), in, IN);
    size_t tt = (size_t)sh->tq * (size_t)sh->tk;
    if (*bias)
        ADD(l, *bias, "bias", (size_t)sh->heads * tt, MGT_F32, IN);
    if (*mask)
        ADD(l, *mask, "mask", (size_t)sh->masks * tt, MGT_F32, IN);
    if (sh->cosine)
        ADD(l, *logit_scale, "logit_scale", (size_t)sh->heads, MGT_F32, IN);
}

static size_t attn_rows(const mgt_attn_shape *sh)
{
    return (size_t)sh->batch * (size_t)sh->heads * (size_t)sh->tq;
}

static void operands_attn_fwd(mgt_op *op, operand_list *l)
{
    mgt_attn_fwd_args *a = &op->u.attn_fwd;
    const mgt_attn_shape *sh = &a->sh;
    /* INOUT: the floats between strided rows are in the extent and are left as they are */
    ADD(l, a->y, "y", attn_span(sh, sh->tq, sh->y_batch, sh->y_row), act_out(op), INOUT);
    ADD(l, a->lse, "lse", attn_rows(sh), MGT_F32, OUT);
    operands_attn_inputs(op, l, sh, &a->q, &a->k, &a->v, &a->bias, &a->mask, &a->logit_scale);
}

static mgt_status check_attn_bwd(const mgt_op *op)
{
    return check_attn(op, &op->u.attn_bwd.sh, op->u.attn_bwd.mask != NULL);
}

static void operands_attn_bwd(mgt_op *op, operand_list *l)
{
    mgt_attn_bwd_args *a = &op->u.attn_bwd;
    const mgt_attn_shape *sh = &a->sh;
    size_t qn = attn_span(sh, sh->tq, sh->q_batch, sh->q_row);
    size_t kvn = attn_span(sh, sh->tk, sh->kv_batch, sh->kv_row);
    /* INOUT as y's: strided rows; and in one qkv array each leaves the others' columns */
    ADD(l, a->dq, "dq", qn, act_in(op), INOUT);
    ADD(l, a->dk, "dk", kvn, act_in(op), INOUT);
    ADD(l, a->dv, "dv", kvn, act_in(op), INOUT);
    if (a->dbias)
        ADD(l, a->dbias, "dbias", (size_t)sh->heads * sh->tq * sh->tk, MGT_F32, OUT);
    if (sh->cosine)
        ADD(l, a->dlogit_scale, "dlogit_scale", (size_t)sh->heads, MGT_F32, INOUT);
    ADD(l, a->dy, "dy", attn_span(sh, sh->tq, sh->y_batch, sh->y_row), act_out(op), IN);
    ADD(l, a->y, "y", attn_span(sh, sh->tq, sh->y_batch, sh->y_row), act_out(op), IN);
    ADD(l, a->lse, "lse", attn_rows(sh), MGT_F32, IN);
    operands_attn_inputs(op, l, sh, &a->q, &a->k, &a->v, &a->bias, &a->mask, &a->logit_scale);
}

static mgt_status check_rpb(const mgt_op *op, int rows, int heads, int n, float alpha)
{
    NEED_POS(op, rows, "table rows");
    NEED_POS(op, heads, "heads");
    NEED_POS(op, n, "positions n");
    if (!product_fits(rows, heads, 1, 1) || !product_fits(n, heads, 1, 1))
        return INVALID(op, "size overflows (rows %d, heads %d, n %d)", rows, heads, n);
    if (!isfinite(alpha))
        return INVALID(op, "alpha %g must be finite", (double)alpha);
    return MGT_OK;
}

static mgt_status check_rpb_fwd(const mgt_op *op)
{
    const mgt_rpb_fwd_args *a = &op->u.rpb_fwd;
    return check_rpb(op, a->rows, a->heads, a->n, a->alpha);
}

static void operands_rpb_fwd(mgt_op *op, operand_list *l)
{
    mgt_rpb_fwd_args *a = &op->u.rpb_fwd;
    ADD(l, a->bias, "bias", (size_t)a->heads * (size_t)a->n, MGT_F32, OUT);
    ADD(l, a->table, "table", (size_t)a->rows * (size_t)a->heads, MGT_F32, IN);
    ADD(l, a->index, "index", (size_t)a->n, MGT_I32, IN);
}

static mgt_status check_rpb_bwd(const mgt_op *op)
{
    const mgt_rpb_bwd_args *a = &op->u.rpb_bwd;
    return check_rpb(op, a->rows, a->heads, a->n, a->alpha);
}

static void operands_rpb_bwd(mgt_op *op, operand_list *l)
{
    mgt_rpb_bwd_args *a = &op->u.rpb_bwd;
    ADD(l, a->dtable, "dtable", (size_t)a->rows * (size_t)a->heads, MGT_F32, INOUT);
    ADD(l, a->dbias, "dbias", (size_t)a->heads * (size_t)a->n, MGT_F32, IN);
    ADD(l, a->offsets, "offsets", (size_t)a->rows + 1, MGT_I32, IN);
    ADD(l, a->order, "order", (size_t)a->n, MGT_I32, IN);
}

bool mgt_relpos_inverse(const int32_t *index, int n, int rows, int32_t *offsets, int32_t *order)
{
    for (int r = 0; r <= rows; r++)
        offsets[r] = 0;
    for (int i = 0; i < n; i++) {
        if (index[i] < 0 || index[i] >= rows)
            return false;
        offsets[index[i] + 1]++;
    }
    for (int r = 0; r < rows; r++)
        offsets[r + 1] += offsets[r];
    for (int i = 0; i < n; i++) /* increasing i within each row: the next free place */
        order[offsets[index[i]]++] = i;
    for (int r = rows; r > 0; r--) /* each offsets[r] now holds where row r ends: shift back */
        offsets[r] = offsets[r - 1];
    offsets[0] = 0;
    return true;
}

/* ---- casts and the nonfinite count ---- */

static mgt_status check_cast(const mgt_op *op)
{
    if (op->prec != MGT_PREC_BF16 && op->prec != MGT_PREC_FP16)
        return INVALID(op, "precision %d is not bf16 or fp16", (int)op->prec);
    return check_n(op, op->u.cast.n);
}

static void operands_cast(mgt_op *op, operand_list *l)
{
    bool to16 = op->kind == MGT_OP_CAST_TO_16;
    ADD(l, op->u.cast.dst, to16 ? "h" : "x", op->u.cast.n, to16 ? MGT_U16 : MGT_F32, OUT);
    ADD(l, op->u.cast.src, to16 ? "x" : "h", op->u.cast.n, to16 ? MGT_F32 : MGT_U16, IN);
}

static mgt_status check_nonfinite(const mgt_op *op) { return check_n(op, op->u.nonfinite.n); }

static void operands_nonfinite(mgt_op *op, operand_list *l)
{
    ADD(l, op->u.nonfinite.count, "count", 1, MGT_I32, OUT);
    ADD(l, op->u.nonfinite.x, "x", op->u.nonfinite.n, MGT_F32, IN);
}

/* ---- the table ---- */

typedef struct op_info {
    const char *name;
    mgt_status (*check)(const mgt_op *op);
    void (*operands)(mgt_op *op, operand_list *l);
} op_info;

/* A line of MGT_OP_LIST without its check_<args> or operands_<args> does not compile. */
#define OP_INFO(KIND, name, args, stem) [MGT_OP_##KIND] = {#name, check_##args, operands_##args},
static const op_info infos[MGT_OP_COUNT] = {MGT_OP_LIST(OP_INFO)};
#undef OP_INFO

bool mgt_op_takes_store(mgt_op_kind kind)
{
    switch (kind) {
    case MGT_OP_CONV2D_FWD:
    case MGT_OP_CONV2D_BWD_DATA:
    case MGT_OP_CONV2D_BWD_FILTER:
    case MGT_OP_BN_FWD_TRAIN:
    case MGT_OP_BN_FWD_EVAL:
    case MGT_OP_BN_BWD:
    case MGT_OP_RELU_FWD:
    case MGT_OP_RELU_BWD:
    case MGT_OP_ADD:
    case MGT_OP_MAXPOOL_FWD:
    case MGT_OP_MAXPOOL_BWD:
    case MGT_OP_AVGPOOL_FWD:
    case MGT_OP_AVGPOOL_BWD:
    case MGT_OP_APOOL_FWD:
    case MGT_OP_APOOL_BWD:
    case MGT_OP_ACT_FWD:
    case MGT_OP_ACT_BWD:
    case MGT_OP_STRIDED_COPY:
    case MGT_OP_CHBIAS_FWD:
    case MGT_OP_CHBIAS_BWD:
    case MGT_OP_CHSCALE_FWD:
    case MGT_OP_CHSCALE_BWD:
    case MGT_OP_DROPOUT:
    case MGT_OP_LNC_FWD:
    case MGT_OP_LNC_BWD:
    case MGT_OP_GEMM:
    case MGT_OP_BIAS_FWD:
    case MGT_OP_BIAS_BWD:
    case MGT_OP_PERMUTE:
    case MGT_OP_ATTN_FWD:
    case MGT_OP_ATTN_BWD: return true;
    default: return false;
    }
}

mgt_precision mgt_op_store16(const mgt_op *op)
{
    return op->store_in != MGT_PREC_F32 ? op->store_in : op->store_out;
}

/* The activation storage: known formats, one 16-bit format per op, and only on the kinds that
   take it (a strided copy copies 16-bit codes as they are, so both sides agree). */
static mgt_status check_store(const mgt_op *op)
{
    const mgt_precision in = op->store_in, out = op->store_out;
    const mgt_gemm_args *g = &op->u.gemm;
    if (op->kind == MGT_OP_GEMM && (g->a16 || g->b16 || g->c16) && in == MGT_PREC_F32 &&
        out == MGT_PREC_F32)
        return INVALID(op, "names %s operands but stores its activations in fp32", "16-bit");
    if (in == MGT_PREC_F32 && out == MGT_PREC_F32)
        return MGT_OK;
    if (!mgt_op_takes_store(op->kind))
        return INVALID(op, "stores its operands in fp32 only, not %s",
                       mgt_precision_name(in != MGT_PREC_F32 ? in : out));
    mgt_status st = check_prec(op, in);
    if (st == MGT_OK)
        st = check_prec(op, out);
    if (st != MGT_OK)
        return st;
    if (in != MGT_PREC_F32 && out != MGT_PREC_F32 && in != out)
        return INVALID(op, "input activations in %s and output in %s: one 16-bit format per op",
                       mgt_precision_name(in), mgt_precision_name(out));
    if (op->kind == MGT_OP_STRIDED_COPY && in != out)
        return INVALID(op, "copies %s into %s: a copy keeps the storage", mgt_precision_name(in),
                       mgt_precision_name(out));
    return MGT_OK;
}

void mgt_store_copy(const mgt_store_job *job, size_t lo, size_t hi)
{
    if (job->to16)
        for (size_t k = lo; k < hi; k++)
            ((uint16_t *)job->dst)[k] = mgt_lowp_encode(job->prec, ((const float *)job->src)[k]);
    else
        for (size_t k = lo; k < hi; k++)
            ((float *)job->dst)[k] = mgt_lowp_decode(job->prec, ((const uint16_t *)job->src)[k]);
}

mgt_status mgt_op_run_widened(const mgt_op *op, void *ctx, float *(*widen)(void *ctx, size_t n),
                              void (*copy)(void *ctx, const mgt_store_job *job),
                              mgt_status (*fp32)(void *ctx, const mgt_op *op))
{
    const mgt_precision p = mgt_op_store16(op);
    mgt_op o = *op, f = *op;
    f.store_in = f.store_out = MGT_PREC_F32;
    mgt_operand o16[MGT_OP_MAX_OPERANDS], of[MGT_OP_MAX_OPERANDS];
    int n = mgt_op_operands(&o, o16), nf = mgt_op_operands(&f, of);
    MGT_ASSERT(n == nf);
    /* 16-bit operands whose spans overlap (attention's q, k and v in one qkv array, and their
       gradients) share one widened copy of their union: a group is widened once where any
       member is read or the members are several (each writes its part), rounded back once
       where any member is written */
    int group[MGT_OP_MAX_OPERANDS];
    const uint16_t *lo[MGT_OP_MAX_OPERANDS], *hi[MGT_OP_MAX_OPERANDS];
    for (int i = 0; i < n; i++) {
        group[i] = -1;
        if (o16[i].dtype != MGT_U16)
            continue;
        group[i] = i;
        lo[i] = *o16[i].ptr;
        hi[i] = lo[i] + o16[i].count;
    }
    for (bool merged = true; merged;) {
        merged = false;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < i; j++)
                if (group[i] == i && group[j] == j && lo[i] < hi[j] && lo[j] < hi[i]) {
                    lo[j] = lo[i] < lo[j] ? lo[i] : lo[j];
                    hi[j] = hi[i] > hi[j] ? hi[i] : hi[j];
                    for (int k = 0; k < n; k++)
                        if (group[k] == i)
                            group[k] = j;
                    merged = true;
                }
    }
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (group[i] == i)
            total += ((size_t)(hi[i] - lo[i]) + 15) / 16 * 16; /* 64-byte aligned copies */
    float *at = total ? widen(ctx, total) : NULL; /* none: a gemm naming no 16-bit operand */
    if (total && !at)
        return MGT_ERR_OOM;
    float *wide[MGT_OP_MAX_OPERANDS] = {0};
    bool read[MGT_OP_MAX_OPERANDS] = {0}, written[MGT_OP_MAX_OPERANDS] = {0};
    int members[MGT_OP_MAX_OPERANDS] = {0};
    for (int i = 0; i < n; i++)
        if (group[i] >= 0) {
            read[group[i]] |= o16[i].role != MGT_OPERAND_OUT;
            written[group[i]] |= o16[i].role != MGT_OPERAND_IN;
            members[group[i]]++;
        }
    for (int i = 0; i < n; i++) {
        if (group[i] != i)
            continue;
        wide[i] = at;
        at += ((size_t)(hi[i] - lo[i]) + 15) / 16 * 16;
        if (read[i] || members[i] > 1)
            copy(ctx, &(mgt_store_job){p, false, lo[i], wide[i], (size_t)(hi[i] - lo[i])});
    }
    for (int i = 0; i < n; i++)
        if (group[i] >= 0)
            *of[i].ptr = wide[group[i]] + ((const uint16_t *)*o16[i].ptr - lo[group[i]]);
    mgt_status st = fp32(ctx, &f);
    for (int i = 0; i < n && st == MGT_OK; i++)
        if (group[i] == i && written[i])
            copy(ctx, &(mgt_store_job){p, true, wide[i], (void *)(uintptr_t)lo[i],
                                       (size_t)(hi[i] - lo[i])});
    return st;
}

size_t mgt_dtype_size(mgt_dtype t) { return t == MGT_U16 ? sizeof(uint16_t) : sizeof(float); }

const char *mgt_op_name(mgt_op_kind kind)
{
    if ((unsigned)kind >= MGT_OP_COUNT)
        return "unknown_op";
    return infos[kind].name;
}

mgt_op_kind mgt_op_kind_from_name(const char *name)
{
    if (!name)
        return MGT_OP_COUNT;
    for (int i = 0; i < MGT_OP_COUNT; i++)
        if (strcmp(infos[i].name, name) == 0)
            return (mgt_op_kind)i;
    return MGT_OP_COUNT;
}

int mgt_op_operands(mgt_op *op, mgt_operand out[MGT_OP_MAX_OPERANDS])
{
    operand_list l = {out, 0};
    if ((unsigned)op->kind < MGT_OP_COUNT)
        infos[op->kind].operands(op, &l);
    return l.n;
}

mgt_status mgt_op_check(const mgt_op *op)
{
    if (!op)
        return mgt_error_set(MGT_ERR_INVALID, "op is NULL");
    if ((unsigned)op->kind >= MGT_OP_COUNT)
        return mgt_error_set(MGT_ERR_INVALID, "unknown op kind %d", (int)op->kind);
    mgt_status st = check_store(op);
    if (st == MGT_OK)
        st = infos[op->kind].check(op);
    if (st != MGT_OK)
        return st;
    /* The pointers, from the operand list: every listed operand is required. */
    mgt_op copy = *op;
    mgt_operand ops[MGT_OP_MAX_OPERANDS];
    int n = mgt_op_operands(&copy, ops);
    for (int i = 0; i < n; i++)
        if (!*ops[i].ptr)
            return INVALID(op, "%s is NULL", ops[i].name);
    return MGT_OK;
}

/* ---- cost ---- */

double mgt_op_flops(const mgt_op *op)
{
    switch (op->kind) {
    case MGT_OP_GEMM: return 2.0 * op->u.gemm.m * op->u.gemm.n * op->u.gemm.k;
    case MGT_OP_CONV2D_FWD:
    case MGT_OP_CONV2D_BWD_DATA:
    case MGT_OP_CONV2D_BWD_FILTER: {
        /* The three passes do the same multiply-adds in a different order. */
        const mgt_conv2d_shape *sh = &op->u.conv.sh;
        int groups = sh->groups > 0 ? sh->groups : 1;
        return 2.0 * sh->n * sh->k * mgt_conv2d_out_h(sh) * mgt_conv2d_out_w(sh) *
               (double)(sh->c / groups) * sh->r * sh->s;
    }
    /* the two products of the forward, the four of the backward (the recomputed logits of
       the backward are not counted: the figure is what any implementation must do) */
    case MGT_OP_ATTN_FWD:
    case MGT_OP_ATTN_BWD: {
        const mgt_attn_shape *sh =
            op->kind == MGT_OP_ATTN_FWD ? &op->u.attn_fwd.sh : &op->u.attn_bwd.sh;
        return (op->kind == MGT_OP_ATTN_FWD ? 4.0 : 8.0) * sh->batch * sh->heads * (double)sh->tq *
               sh->tk * sh->dh;
    }
    default: return 0.0;
    }
}
