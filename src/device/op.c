/* Kernel calls as values: names, argument checks, operand lists and FLOP counts of every op. */
#include <stdint.h>
#include <string.h>

#include "device/op.h"

/* In enum order; CTest names the conformance cases after these, so they never change. */
static const char *const op_names[MGT_OP_COUNT] = {
    [MGT_OP_FILL] = "fill",
    [MGT_OP_SCALE] = "scale",
    [MGT_OP_AXPY] = "axpy",
    [MGT_OP_SUM] = "sum",
    [MGT_OP_ADD] = "add",
    [MGT_OP_GEMM] = "gemm",
    [MGT_OP_CONV2D_FWD] = "conv2d_forward",
    [MGT_OP_CONV2D_BWD_DATA] = "conv2d_backward_data",
    [MGT_OP_CONV2D_BWD_FILTER] = "conv2d_backward_filter",
    [MGT_OP_BN_FWD_TRAIN] = "batchnorm_forward_train",
    [MGT_OP_BN_FWD_EVAL] = "batchnorm_forward_eval",
    [MGT_OP_BN_BWD] = "batchnorm_backward",
    [MGT_OP_RELU_FWD] = "relu_forward",
    [MGT_OP_RELU_BWD] = "relu_backward",
    [MGT_OP_MAXPOOL_FWD] = "maxpool2d_forward",
    [MGT_OP_MAXPOOL_BWD] = "maxpool2d_backward",
    [MGT_OP_AVGPOOL_FWD] = "avgpool_forward",
    [MGT_OP_AVGPOOL_BWD] = "avgpool_backward",
    [MGT_OP_BIAS_FWD] = "bias_forward",
    [MGT_OP_BIAS_BWD] = "bias_backward",
    [MGT_OP_XENT_FWD] = "softmax_xent_forward",
    [MGT_OP_XENT_BWD] = "softmax_xent_backward",
    [MGT_OP_TOPK] = "topk_correct",
    [MGT_OP_SGD] = "sgd_update",
};

const char *mgt_op_name(mgt_op_kind kind)
{
    if ((unsigned)kind >= MGT_OP_COUNT)
        return "unknown_op";
    return op_names[kind];
}

mgt_op_kind mgt_op_kind_from_name(const char *name)
{
    if (!name)
        return MGT_OP_COUNT;
    for (int i = 0; i < MGT_OP_COUNT; i++)
        if (strcmp(op_names[i], name) == 0)
            return (mgt_op_kind)i;
    return MGT_OP_COUNT;
}

/* ---- output sizes ---- */

/* Computed in 64 bits so that absurd paddings cannot overflow an int; a window that does not
   fit even once gives 0, which mgt_op_check then rejects. */
static int out_size(int in, int window, int stride, int pad)
{
    if (stride < 1 || window < 1)
        return 0;
    long long span = (long long)in + 2LL * pad - window;
    if (span < 0)
        return 0;
    long long out = span / stride + 1;
    return out > INT32_MAX ? INT32_MAX : (int)out;
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
    return out_size(sh->h, sh->kh, sh->stride_h, sh->pad_h);
}

int mgt_pool2d_out_w(const mgt_pool2d_shape *sh)
{
    return out_size(sh->w, sh->kw, sh->stride_w, sh->pad_w);
}

/* ---- checks ---- */

/* Every refusal goes through INVALID so that the text always starts with the op's name, which
   is all a caller several layers up has to say which call was wrong. */
#define INVALID(op, fmt, ...) \
    mgt_error_set(MGT_ERR_INVALID, "%s: " fmt, mgt_op_name((op)->kind), __VA_ARGS__)

#define NEED_PTR(op, p, what)                       \
    do {                                            \
        if (!(p))                                   \
            return INVALID(op, "%s is NULL", what); \
    } while (0)

#define NEED_POS(op, v, what)                                                     \
    do {                                                                          \
        if ((v) <= 0)                                                             \
            return INVALID(op, "%s %lld must be positive", what, (long long)(v)); \
    } while (0)

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

static mgt_status check_n(const mgt_op *op, size_t n)
{
    if (n == 0)
        return INVALID(op, "element count %zu must be positive", n);
    if (n > SIZE_MAX / sizeof(float))
        return INVALID(op, "element count %zu is too large", n);
    return MGT_OK;
}

static mgt_status check_conv(const mgt_op *op)
{
    const mgt_conv2d_shape *sh = &op->u.conv.sh;
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
    NEED_PTR(op, op->u.conv.out,
             op->kind == MGT_OP_CONV2D_FWD        ? "y"
             : op->kind == MGT_OP_CONV2D_BWD_DATA ? "dx"
                                                  : "dw");
    NEED_PTR(op, op->u.conv.in1, op->kind == MGT_OP_CONV2D_FWD ? "x" : "dy");
    NEED_PTR(op, op->u.conv.in2, op->kind == MGT_OP_CONV2D_BWD_FILTER ? "x" : "w");
    return MGT_OK;
}

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
    return MGT_OK;
}

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
    return MGT_OK;
}

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

static mgt_status check_gemm(const mgt_op *op)
{
    const __typeof__(op->u.gemm) *g = &op->u.gemm;
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
    NEED_PTR(op, g->a, "a");
    NEED_PTR(op, g->b, "b");
    NEED_PTR(op, g->c, "c");
    return MGT_OK;
}

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
    NEED_PTR(op, op->u.sgd.param, "param");
    NEED_PTR(op, op->u.sgd.grad, "grad");
    if (p->momentum != 0.0f && !op->u.sgd.momentum_buf)
        return INVALID(op, "momentum_buf is NULL with momentum %g", (double)p->momentum);
    return MGT_OK;
}

mgt_status mgt_op_check(const mgt_op *op)
{
    if (!op)
        return mgt_error_set(MGT_ERR_INVALID, "op is NULL");
    mgt_status st = MGT_OK;
    switch (op->kind) {
    case MGT_OP_FILL: NEED_PTR(op, op->u.fill.x, "x"); return check_n(op, op->u.fill.n);
    case MGT_OP_SCALE: NEED_PTR(op, op->u.scale.x, "x"); return check_n(op, op->u.scale.n);
    case MGT_OP_AXPY:
        NEED_PTR(op, op->u.axpy.y, "y");
        NEED_PTR(op, op->u.axpy.x, "x");
        return check_n(op, op->u.axpy.n);
    case MGT_OP_SUM:
        NEED_PTR(op, op->u.sum.out, "out");
        NEED_PTR(op, op->u.sum.x, "x");
        return check_n(op, op->u.sum.n);
    case MGT_OP_ADD:
        NEED_PTR(op, op->u.add.y, "y");
        NEED_PTR(op, op->u.add.a, "a");
        NEED_PTR(op, op->u.add.b, "b");
        return check_n(op, op->u.add.n);
    case MGT_OP_GEMM: return check_gemm(op);
    case MGT_OP_CONV2D_FWD:
    case MGT_OP_CONV2D_BWD_DATA:
    case MGT_OP_CONV2D_BWD_FILTER: return check_conv(op);
    case MGT_OP_BN_FWD_TRAIN:
        if ((st = check_bn_shape(op, &op->u.bn_train.sh)) != MGT_OK)
            return st;
        /* The unbiased variance divides by n*hw - 1, as PyTorch refuses to. */
        if ((long long)op->u.bn_train.sh.n * op->u.bn_train.sh.hw < 2)
            return INVALID(op, "needs more than one value per channel (n %d, hw %d)",
                           op->u.bn_train.sh.n, op->u.bn_train.sh.hw);
        NEED_PTR(op, op->u.bn_train.y, "y");
        NEED_PTR(op, op->u.bn_train.save_mean, "save_mean");
        NEED_PTR(op, op->u.bn_train.save_invstd, "save_invstd");
        NEED_PTR(op, op->u.bn_train.running_mean, "running_mean");
        NEED_PTR(op, op->u.bn_train.running_var, "running_var");
        NEED_PTR(op, op->u.bn_train.x, "x");
        NEED_PTR(op, op->u.bn_train.gamma, "gamma");
        NEED_PTR(op, op->u.bn_train.beta, "beta");
        return MGT_OK;
    case MGT_OP_BN_FWD_EVAL:
        if ((st = check_bn_shape(op, &op->u.bn_eval.sh)) != MGT_OK)
            return st;
        NEED_PTR(op, op->u.bn_eval.y, "y");
        NEED_PTR(op, op->u.bn_eval.x, "x");
        NEED_PTR(op, op->u.bn_eval.gamma, "gamma");
        NEED_PTR(op, op->u.bn_eval.beta, "beta");
        NEED_PTR(op, op->u.bn_eval.running_mean, "running_mean");
        NEED_PTR(op, op->u.bn_eval.running_var, "running_var");
        return MGT_OK;
    case MGT_OP_BN_BWD:
        if ((st = check_bn_shape(op, &op->u.bn_bwd.sh)) != MGT_OK)
            return st;
        NEED_PTR(op, op->u.bn_bwd.dx, "dx");
        NEED_PTR(op, op->u.bn_bwd.dgamma, "dgamma");
        NEED_PTR(op, op->u.bn_bwd.dbeta, "dbeta");
        NEED_PTR(op, op->u.bn_bwd.dy, "dy");
        NEED_PTR(op, op->u.bn_bwd.x, "x");
        NEED_PTR(op, op->u.bn_bwd.gamma, "gamma");
        NEED_PTR(op, op->u.bn_bwd.save_mean, "save_mean");
        NEED_PTR(op, op->u.bn_bwd.save_invstd, "save_invstd");
        return MGT_OK;
    case MGT_OP_RELU_FWD:
        NEED_PTR(op, op->u.relu_fwd.y, "y");
        NEED_PTR(op, op->u.relu_fwd.x, "x");
        return check_n(op, op->u.relu_fwd.n);
    case MGT_OP_RELU_BWD:
        NEED_PTR(op, op->u.relu_bwd.dx, "dx");
        NEED_PTR(op, op->u.relu_bwd.dy, "dy");
        NEED_PTR(op, op->u.relu_bwd.y, "y");
        return check_n(op, op->u.relu_bwd.n);
    case MGT_OP_MAXPOOL_FWD:
        if ((st = check_pool(op, &op->u.maxpool_fwd.sh)) != MGT_OK)
            return st;
        NEED_PTR(op, op->u.maxpool_fwd.y, "y");
        NEED_PTR(op, op->u.maxpool_fwd.x, "x");
        return MGT_OK;
    case MGT_OP_MAXPOOL_BWD:
        if ((st = check_pool(op, &op->u.maxpool_bwd.sh)) != MGT_OK)
            return st;
        NEED_PTR(op, op->u.maxpool_bwd.dx, "dx");
        NEED_PTR(op, op->u.maxpool_bwd.dy, "dy");
        NEED_PTR(op, op->u.maxpool_bwd.x, "x");
        NEED_PTR(op, op->u.maxpool_bwd.y, "y");
        return MGT_OK;
    case MGT_OP_AVGPOOL_FWD:
    case MGT_OP_AVGPOOL_BWD: {
        int n = op->kind == MGT_OP_AVGPOOL_FWD ? op->u.avgpool_fwd.n : op->u.avgpool_bwd.n;
        int c = op->kind == MGT_OP_AVGPOOL_FWD ? op->u.avgpool_fwd.c : op->u.avgpool_bwd.c;
        int hw = op->kind == MGT_OP_AVGPOOL_FWD ? op->u.avgpool_fwd.hw : op->u.avgpool_bwd.hw;
        NEED_POS(op, n, "batch n");
        NEED_POS(op, c, "channels c");
        NEED_POS(op, hw, "spatial size hw");
        if (!product_fits(n, c, hw, 1))
            return INVALID(op, "tensor size overflows (n %d, c %d, hw %d)", n, c, hw);
        if (op->kind == MGT_OP_AVGPOOL_FWD) {
            NEED_PTR(op, op->u.avgpool_fwd.y, "y");
            NEED_PTR(op, op->u.avgpool_fwd.x, "x");
        } else {
            NEED_PTR(op, op->u.avgpool_bwd.dx, "dx");
            NEED_PTR(op, op->u.avgpool_bwd.dy, "dy");
        }
        return MGT_OK;
    }
    case MGT_OP_BIAS_FWD:
        NEED_POS(op, op->u.bias_fwd.rows, "rows");
        NEED_POS(op, op->u.bias_fwd.cols, "cols");
        if (!product_fits(op->u.bias_fwd.rows, op->u.bias_fwd.cols, 1, 1))
            return INVALID(op, "size overflows (rows %d, cols %d)", op->u.bias_fwd.rows,
                           op->u.bias_fwd.cols);
        NEED_PTR(op, op->u.bias_fwd.y, "y");
        NEED_PTR(op, op->u.bias_fwd.bias, "bias");
        return MGT_OK;
    case MGT_OP_BIAS_BWD:
        NEED_POS(op, op->u.bias_bwd.rows, "rows");
        NEED_POS(op, op->u.bias_bwd.cols, "cols");
        if (!product_fits(op->u.bias_bwd.rows, op->u.bias_bwd.cols, 1, 1))
            return INVALID(op, "size overflows (rows %d, cols %d)", op->u.bias_bwd.rows,
                           op->u.bias_bwd.cols);
        NEED_PTR(op, op->u.bias_bwd.dbias, "dbias");
        NEED_PTR(op, op->u.bias_bwd.dy, "dy");
        return MGT_OK;
    case MGT_OP_XENT_FWD:
        if ((st = check_rows(op, op->u.xent_fwd.n, op->u.xent_fwd.classes)) != MGT_OK ||
            (st = check_smoothing(op, op->u.xent_fwd.smoothing)) != MGT_OK)
            return st;
        NEED_PTR(op, op->u.xent_fwd.loss, "loss");
        NEED_PTR(op, op->u.xent_fwd.probs, "probs");
        NEED_PTR(op, op->u.xent_fwd.logits, "logits");
        NEED_PTR(op, op->u.xent_fwd.labels, "labels");
        return MGT_OK;
    case MGT_OP_XENT_BWD:
        if ((st = check_rows(op, op->u.xent_bwd.n, op->u.xent_bwd.classes)) != MGT_OK ||
            (st = check_smoothing(op, op->u.xent_bwd.smoothing)) != MGT_OK)
            return st;
        NEED_PTR(op, op->u.xent_bwd.dlogits, "dlogits");
        NEED_PTR(op, op->u.xent_bwd.probs, "probs");
        NEED_PTR(op, op->u.xent_bwd.labels, "labels");
        return MGT_OK;
    case MGT_OP_TOPK:
        if ((st = check_rows(op, op->u.topk.n, op->u.topk.classes)) != MGT_OK)
            return st;
        if (op->u.topk.k < 1)
            return INVALID(op, "k %d must be at least 1", op->u.topk.k);
        NEED_PTR(op, op->u.topk.count, "count");
        NEED_PTR(op, op->u.topk.logits, "logits");
        NEED_PTR(op, op->u.topk.labels, "labels");
        return MGT_OK;
    case MGT_OP_SGD: return check_sgd(op);
    case MGT_OP_COUNT: break;
    }
    return mgt_error_set(MGT_ERR_INVALID, "unknown op kind %d", (int)op->kind);
}

/* ---- operands ---- */

typedef struct operand_list {
    mgt_operand *out;
    int n;
} operand_list;

/* Takes the address of the op's own pointer field, whatever its constness, so a harness can
   swap in a guarded copy of the argument and run the op unchanged. */
#define ADD(list, field, name_, count_, dtype_, role_) \
    add_operand(list, name_, (void **)&(field), count_, dtype_, role_)

static void add_operand(operand_list *l, const char *name, void **ptr, size_t count,
                        mgt_dtype dtype, mgt_operand_role role)
{
    if (!*ptr)
        return; /* optional and absent */
    l->out[l->n++] = (mgt_operand){name, ptr, count, dtype, role};
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

int mgt_op_operands(mgt_op *op, mgt_operand out[MGT_OP_MAX_OPERANDS])
{
    operand_list l = {out, 0};
    const mgt_operand_role IN = MGT_OPERAND_IN, OUT = MGT_OPERAND_OUT, INOUT = MGT_OPERAND_INOUT;
    switch (op->kind) {
    case MGT_OP_FILL: ADD(&l, op->u.fill.x, "x", op->u.fill.n, MGT_F32, OUT); break;
    case MGT_OP_SCALE: ADD(&l, op->u.scale.x, "x", op->u.scale.n, MGT_F32, INOUT); break;
    case MGT_OP_AXPY:
        ADD(&l, op->u.axpy.y, "y", op->u.axpy.n, MGT_F32, INOUT);
        ADD(&l, op->u.axpy.x, "x", op->u.axpy.n, MGT_F32, IN);
        break;
    case MGT_OP_SUM:
        ADD(&l, op->u.sum.out, "out", 1, MGT_F32, OUT);
        ADD(&l, op->u.sum.x, "x", op->u.sum.n, MGT_F32, IN);
        break;
    case MGT_OP_ADD:
        ADD(&l, op->u.add.y, "y", op->u.add.n, MGT_F32, OUT);
        ADD(&l, op->u.add.a, "a", op->u.add.n, MGT_F32, IN);
        ADD(&l, op->u.add.b, "b", op->u.add.n, MGT_F32, IN);
        break;
    case MGT_OP_GEMM: {
        __typeof__(op->u.gemm) *g = &op->u.gemm;
        size_t a = g->trans_a ? strided(g->k, g->lda, g->m) : strided(g->m, g->lda, g->k);
        size_t b = g->trans_b ? strided(g->n, g->ldb, g->k) : strided(g->k, g->ldb, g->n);
        ADD(&l, g->c, "c", strided(g->m, g->ldc, g->n), MGT_F32, beta_role(g->beta));
        ADD(&l, g->a, "a", a, MGT_F32, IN);
        ADD(&l, g->b, "b", b, MGT_F32, IN);
        break;
    }
    case MGT_OP_CONV2D_FWD:
    case MGT_OP_CONV2D_BWD_DATA:
    case MGT_OP_CONV2D_BWD_FILTER: {
        const mgt_conv2d_shape *sh = &op->u.conv.sh;
        int groups = sh->groups > 0 ? sh->groups : 1;
        size_t x = zmul(sh->n, sh->c, sh->h, sh->w);
        size_t y = zmul(sh->n, sh->k, mgt_conv2d_out_h(sh), mgt_conv2d_out_w(sh));
        size_t w = zmul(sh->k, sh->c / groups, sh->r, sh->s);
        mgt_operand_role role = beta_role(op->u.conv.beta);
        if (op->kind == MGT_OP_CONV2D_FWD) {
            ADD(&l, op->u.conv.out, "y", y, MGT_F32, role);
            ADD(&l, op->u.conv.in1, "x", x, MGT_F32, IN);
            ADD(&l, op->u.conv.in2, "w", w, MGT_F32, IN);
        } else if (op->kind == MGT_OP_CONV2D_BWD_DATA) {
            ADD(&l, op->u.conv.out, "dx", x, MGT_F32, role);
            ADD(&l, op->u.conv.in1, "dy", y, MGT_F32, IN);
            ADD(&l, op->u.conv.in2, "w", w, MGT_F32, IN);
        } else {
            ADD(&l, op->u.conv.out, "dw", w, MGT_F32, role);
            ADD(&l, op->u.conv.in1, "dy", y, MGT_F32, IN);
            ADD(&l, op->u.conv.in2, "x", x, MGT_F32, IN);
        }
        break;
    }
    case MGT_OP_BN_FWD_TRAIN: {
        __typeof__(op->u.bn_train) *b = &op->u.bn_train;
        size_t x = zmul(b->sh.n, b->sh.c, b->sh.hw, 1), c = (size_t)b->sh.c;
        ADD(&l, b->y, "y", x, MGT_F32, OUT);
        ADD(&l, b->save_mean, "save_mean", c, MGT_F32, OUT);
        ADD(&l, b->save_invstd, "save_invstd", c, MGT_F32, OUT);
        ADD(&l, b->running_mean, "running_mean", c, MGT_F32, INOUT);
        ADD(&l, b->running_var, "running_var", c, MGT_F32, INOUT);
        ADD(&l, b->x, "x", x, MGT_F32, IN);
        ADD(&l, b->gamma, "gamma", c, MGT_F32, IN);
        ADD(&l, b->beta, "beta", c, MGT_F32, IN);
        break;
    }
    case MGT_OP_BN_FWD_EVAL: {
        __typeof__(op->u.bn_eval) *b = &op->u.bn_eval;
        size_t x = zmul(b->sh.n, b->sh.c, b->sh.hw, 1), c = (size_t)b->sh.c;
        ADD(&l, b->y, "y", x, MGT_F32, OUT);
        ADD(&l, b->x, "x", x, MGT_F32, IN);
        ADD(&l, b->gamma, "gamma", c, MGT_F32, IN);
        ADD(&l, b->beta, "beta", c, MGT_F32, IN);
        ADD(&l, b->running_mean, "running_mean", c, MGT_F32, IN);
        ADD(&l, b->running_var, "running_var", c, MGT_F32, IN);
        break;
    }
    case MGT_OP_BN_BWD: {
        __typeof__(op->u.bn_bwd) *b = &op->u.bn_bwd;
        size_t x = zmul(b->sh.n, b->sh.c, b->sh.hw, 1), c = (size_t)b->sh.c;
        ADD(&l, b->dx, "dx", x, MGT_F32, OUT);
        ADD(&l, b->dgamma, "dgamma", c, MGT_F32, INOUT);
        ADD(&l, b->dbeta, "dbeta", c, MGT_F32, INOUT);
        ADD(&l, b->dy, "dy", x, MGT_F32, IN);
        ADD(&l, b->x, "x", x, MGT_F32, IN);
        ADD(&l, b->gamma, "gamma", c, MGT_F32, IN);
        ADD(&l, b->save_mean, "save_mean", c, MGT_F32, IN);
        ADD(&l, b->save_invstd, "save_invstd", c, MGT_F32, IN);
        break;
    }
    case MGT_OP_RELU_FWD:
        ADD(&l, op->u.relu_fwd.y, "y", op->u.relu_fwd.n, MGT_F32, OUT);
        ADD(&l, op->u.relu_fwd.x, "x", op->u.relu_fwd.n, MGT_F32, IN);
        break;
    case MGT_OP_RELU_BWD:
        ADD(&l, op->u.relu_bwd.dx, "dx", op->u.relu_bwd.n, MGT_F32, OUT);
        ADD(&l, op->u.relu_bwd.dy, "dy", op->u.relu_bwd.n, MGT_F32, IN);
        ADD(&l, op->u.relu_bwd.y, "y", op->u.relu_bwd.n, MGT_F32, IN);
        break;
    case MGT_OP_MAXPOOL_FWD: {
        const mgt_pool2d_shape *sh = &op->u.maxpool_fwd.sh;
        ADD(&l, op->u.maxpool_fwd.y, "y",
            zmul(sh->n, sh->c, mgt_pool2d_out_h(sh), mgt_pool2d_out_w(sh)), MGT_F32, OUT);
        ADD(&l, op->u.maxpool_fwd.x, "x", zmul(sh->n, sh->c, sh->h, sh->w), MGT_F32, IN);
        break;
    }
    case MGT_OP_MAXPOOL_BWD: {
        const mgt_pool2d_shape *sh = &op->u.maxpool_bwd.sh;
        size_t x = zmul(sh->n, sh->c, sh->h, sh->w);
        size_t y = zmul(sh->n, sh->c, mgt_pool2d_out_h(sh), mgt_pool2d_out_w(sh));
        ADD(&l, op->u.maxpool_bwd.dx, "dx", x, MGT_F32, OUT);
        ADD(&l, op->u.maxpool_bwd.dy, "dy", y, MGT_F32, IN);
        ADD(&l, op->u.maxpool_bwd.x, "x", x, MGT_F32, IN);
        ADD(&l, op->u.maxpool_bwd.y, "y", y, MGT_F32, IN);
        break;
    }
    case MGT_OP_AVGPOOL_FWD: {
        __typeof__(op->u.avgpool_fwd) *a = &op->u.avgpool_fwd;
        ADD(&l, a->y, "y", zmul(a->n, a->c, 1, 1), MGT_F32, OUT);
        ADD(&l, a->x, "x", zmul(a->n, a->c, a->hw, 1), MGT_F32, IN);
        break;
    }
    case MGT_OP_AVGPOOL_BWD: {
        __typeof__(op->u.avgpool_bwd) *a = &op->u.avgpool_bwd;
        ADD(&l, a->dx, "dx", zmul(a->n, a->c, a->hw, 1), MGT_F32, OUT);
        ADD(&l, a->dy, "dy", zmul(a->n, a->c, 1, 1), MGT_F32, IN);
        break;
    }
    case MGT_OP_BIAS_FWD:
        ADD(&l, op->u.bias_fwd.y, "y", zmul(op->u.bias_fwd.rows, op->u.bias_fwd.cols, 1, 1),
            MGT_F32, INOUT);
        ADD(&l, op->u.bias_fwd.bias, "bias", (size_t)op->u.bias_fwd.cols, MGT_F32, IN);
        break;
    case MGT_OP_BIAS_BWD:
        ADD(&l, op->u.bias_bwd.dbias, "dbias", (size_t)op->u.bias_bwd.cols, MGT_F32, INOUT);
        ADD(&l, op->u.bias_bwd.dy, "dy", zmul(op->u.bias_bwd.rows, op->u.bias_bwd.cols, 1, 1),
            MGT_F32, IN);
        break;
    case MGT_OP_XENT_FWD: {
        __typeof__(op->u.xent_fwd) *x = &op->u.xent_fwd;
        size_t nc = zmul(x->n, x->classes, 1, 1);
        ADD(&l, x->loss, "loss", 1, MGT_F32, OUT);
        ADD(&l, x->probs, "probs", nc, MGT_F32, OUT);
        ADD(&l, x->logits, "logits", nc, MGT_F32, IN);
        ADD(&l, x->labels, "labels", (size_t)x->n, MGT_I32, IN);
        break;
    }
    case MGT_OP_XENT_BWD: {
        __typeof__(op->u.xent_bwd) *x = &op->u.xent_bwd;
        size_t nc = zmul(x->n, x->classes, 1, 1);
        ADD(&l, x->dlogits, "dlogits", nc, MGT_F32, OUT);
        ADD(&l, x->probs, "probs", nc, MGT_F32, IN);
        ADD(&l, x->labels, "labels", (size_t)x->n, MGT_I32, IN);
        break;
    }
    case MGT_OP_TOPK: {
        __typeof__(op->u.topk) *t = &op->u.topk;
        ADD(&l, t->count, "count", 1, MGT_I32, INOUT);
        ADD(&l, t->logits, "logits", zmul(t->n, t->classes, 1, 1), MGT_F32, IN);
        ADD(&l, t->labels, "labels", (size_t)t->n, MGT_I32, IN);
        break;
    }
    case MGT_OP_SGD: {
        __typeof__(op->u.sgd) *s = &op->u.sgd;
        ADD(&l, s->param, "param", s->n, MGT_F32, INOUT);
        /* With momentum 0 the buffer is never touched, so it is no operand even when given;
           on the first step it is written before it is read. */
        if (s->p.momentum != 0.0f)
            ADD(&l, s->momentum_buf, "momentum_buf", s->n, MGT_F32, s->p.first_step ? OUT : INOUT);
        ADD(&l, s->grad, "grad", s->n, MGT_F32, IN);
        break;
    }
    case MGT_OP_COUNT: break;
    }
    return l.n;
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
    default: return 0.0;
    }
}
