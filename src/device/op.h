/* Kernel calls as values: what the dispatch layer hands a backend, what a mock stream queues,
   and what the conformance suite runs on every backend and on the reference.

   Adding an op: one row in MGT_OP_LIST below; its argument struct mgt_<args>_args and its
   member of mgt_op's union (or an existing one it shares); in op.c its check_<args> (sizes and parameters only) and
   operands_<args> (every pointer with its element count, type and role; the NULL checks and
   the mock's pointer checks come from these); its implementation in every backend under the
   row's stem: ref_<stem> in cpu/ref.c (plain loops, the truth), cpu_<stem> in the cpu/ file
   of its family (the mock devices' fast path), cuda_<stem> in the cuda/ .cu file of its family;
   its case generator gen_<stem> in tests/test_conformance.c; a public wrapper in mgt/device.h
   and device.c where layers call it. The backends' tables, the CUDA prototypes and the
   conformance suite's table are expansions of the list, so a row whose stem lacks any of these
   does not build; CTest picks up conformance.<name> from the list by itself. */
#ifndef MGT_DEVICE_OP_H
#define MGT_DEVICE_OP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mgt/device.h"

/* The op list, one row per op: X(KIND, name, args, stem). KIND makes the enumerator
   MGT_OP_<KIND>; name is what the op is called everywhere (error texts, the mock's
   fault=kernel@D:N:name, `test_conformance --list` and so the CTest case conformance.<name>);
   args is the member of mgt_op's union that holds its arguments; stem names its
   implementation in every backend and its conformance cases (see above). Rows may share args
   (the three convolution passes share check_conv and operands_conv, which look at the kind)
   and a stem (one function serves the three passes, or sum and sum_squares). A variant of an
   op (a precision, mixed labels) is a parameter of it, not a row. Order is free: nothing
   stores kinds as numbers. */
#define MGT_OP_LIST(X)                                               \
    X(FILL, fill, fill, fill)                                        \
    X(SCALE, scale, scale, scale)                                    \
    X(AXPY, axpy, axpy, axpy)                                        \
    X(SUM, sum, sum, sum)                                            \
    X(ADD, add, add, add)                                            \
    X(GEMM, gemm, gemm, gemm)                                        \
    X(CONV2D_FWD, conv2d_forward, conv, conv2d)                      \
    X(CONV2D_BWD_DATA, conv2d_backward_data, conv, conv2d)           \
    X(CONV2D_BWD_FILTER, conv2d_backward_filter, conv, conv2d)       \
    X(BN_FWD_TRAIN, batchnorm_forward_train, bn_train, bn_train)     \
    X(BN_FWD_EVAL, batchnorm_forward_eval, bn_eval, bn_eval)         \
    X(BN_BWD, batchnorm_backward, bn_bwd, bn_bwd)                    \
    X(RELU_FWD, relu_forward, relu_fwd, relu_fwd)                    \
    X(RELU_BWD, relu_backward, relu_bwd, relu_bwd)                   \
    X(MAXPOOL_FWD, maxpool2d_forward, maxpool_fwd, maxpool_fwd)      \
    X(MAXPOOL_BWD, maxpool2d_backward, maxpool_bwd, maxpool_bwd)     \
    X(AVGPOOL_FWD, avgpool_forward, avgpool_fwd, avgpool_fwd)        \
    X(AVGPOOL_BWD, avgpool_backward, avgpool_bwd, avgpool_bwd)       \
    X(BIAS_FWD, bias_forward, bias_fwd, bias_fwd)                    \
    X(BIAS_BWD, bias_backward, bias_bwd, bias_bwd)                   \
    X(XENT_FWD, softmax_xent_forward, xent_fwd, xent_fwd)            \
    X(XENT_BWD, softmax_xent_backward, xent_bwd, xent_bwd)           \
    X(TOPK, topk_correct, topk, topk)                                \
    X(SGD, sgd_update, sgd, sgd)                                     \
    X(CAST_TO_16, cast_to_16, cast, cast)                            \
    X(CAST_FROM_16, cast_from_16, cast, cast)                        \
    X(NONFINITE, nonfinite_count, nonfinite, nonfinite)              \
    X(ADAMW, adamw_update, adamw, adamw)                             \
    X(RMSPROP, rmsprop_update, rmsprop, rmsprop)                     \
    X(SUMSQ, sum_squares, sum, sum)                                  \
    X(CHBIAS_FWD, channel_bias_forward, chbias_fwd, chbias_fwd)      \
    X(CHBIAS_BWD, channel_bias_backward, chbias_bwd, chbias_bwd)     \
    X(DROPOUT, dropout, dropout, dropout)                            \
    X(APOOL_FWD, adaptive_avgpool_forward, apool_fwd, apool_fwd)     \
    X(APOOL_BWD, adaptive_avgpool_backward, apool_bwd, apool_bwd)    \
    X(STRIDED_COPY, strided_copy, scopy, scopy)                      \
    X(ACT_FWD, activation_forward, act_fwd, act_fwd)                 \
    X(ACT_BWD, activation_backward, act_bwd, act_bwd)                \
    X(CHSCALE_FWD, channel_scale_forward, chscale_fwd, chscale_fwd)  \
    X(CHSCALE_BWD, channel_scale_backward, chscale_bwd, chscale_bwd) \
    X(BN_STATS, bn_stats, bn_stats, bn_stats)                        \
    X(BN_BWD_ELEMT, bn_backward_elemt, bn_bwd_elemt, bn_bwd_elemt)   \
    X(LNC_FWD, layernorm_channels_forward, lnc_fwd, lnc_fwd)         \
    X(LNC_BWD, layernorm_channels_backward, lnc_bwd, lnc_bwd)        \
    X(PERMUTE, permute, permute, permute)                            \
    X(ATTN_FWD, attention_forward, attn_fwd, attn_fwd)               \
    X(ATTN_BWD, attention_backward, attn_bwd, attn_bwd)              \
    X(RPB_FWD, relpos_bias_forward, rpb_fwd, rpb_fwd)                \
    X(RPB_BWD, relpos_bias_backward, rpb_bwd, rpb_bwd)

#define MGT_OP_ENUM_(KIND, name, args, stem) MGT_OP_##KIND,
typedef enum mgt_op_kind { MGT_OP_LIST(MGT_OP_ENUM_) MGT_OP_COUNT } mgt_op_kind;
#undef MGT_OP_ENUM_

/* The argument structs of the ops, mgt_<args>_args for the args column of the op list; names
   and meanings as in the mgt_* wrappers of mgt/device.h. */

typedef struct mgt_fill_args {
    float *x;
    float value;
    size_t n;
} mgt_fill_args;

typedef struct mgt_scale_args {
    float *x;
    float alpha;
    size_t n;
} mgt_scale_args;

typedef struct mgt_axpy_args {
    float *y;
    float alpha;
    const float *x;
    size_t n;
} mgt_axpy_args;

typedef struct mgt_sum_args {
    float *out;
    const float *x;
    size_t n;
} mgt_sum_args;

typedef struct mgt_add_args {
    float *y;
    const float *a, *b;
    size_t n;
} mgt_add_args;

typedef struct mgt_gemm_args {
    bool trans_a, trans_b;
    int m, n, k;
    float alpha;
    const float *a;
    int lda;
    const float *b;
    int ldb;
    float beta;
    float *c;
    int ldc;
    /* which of a, b and c are activations stored in the op's 16-bit format (mgt_op_store16;
       a linear layer's x, y, dy and dx): none unless the op's storage is 16-bit */
    bool a16, b16, c16;
} mgt_gemm_args;

/* forward: out = y, in1 = x, in2 = w; backward data: out = dx, in1 = dy, in2 = w;
   backward filter: out = dw, in1 = dy, in2 = x */
typedef struct mgt_conv_args {
    float *out;
    const float *in1, *in2;
    mgt_conv2d_shape sh;
    float beta;
} mgt_conv_args;

/* z (optional, with sh.relu only): the residual of a fused add, y = relu(round(bn(x)) + z),
   where round is to z_round (the storage the unfused batch norm's output would have had:
   the add's rounding points) and z is stored as y; z may be y itself. */
typedef struct mgt_bn_train_args {
    float *y, *save_mean, *save_invstd, *running_mean, *running_var;
    const float *x, *gamma, *beta;
    mgt_bn_shape sh;
    const float *z;
    mgt_precision z_round;
} mgt_bn_train_args;

typedef struct mgt_bn_eval_args {
    float *y;
    const float *x, *gamma, *beta, *running_mean, *running_var;
    mgt_bn_shape sh;
    const float *z;
    mgt_precision z_round;
} mgt_bn_eval_args;

/* dz (optional, with sh.relu only): the fused add's residual gradient, dy masked by the
   ReLU's output y (dz may be dy itself: each element is read before it is written). */
typedef struct mgt_bn_bwd_args {
    float *dx, *dgamma, *dbeta;
    const float *dy, *y, *x, *gamma, *save_mean, *save_invstd; /* y: sh.relu only */
    mgt_bn_shape sh;
    float *dz;
} mgt_bn_bwd_args;

typedef struct mgt_bn_stats_args {
    float *mean, *var; /* this shard's per-channel mean and biased variance */
    const float *x;
    mgt_bn_shape sh;
} mgt_bn_stats_args;

typedef struct mgt_bn_bwd_elemt_args {
    float *dx;
    const float *dy, *x, *gamma, *mean, *invstd, *sum_dy, *sum_dy_xhat;
    mgt_bn_shape sh;
    double count; /* values per channel the sums were taken over (every shard's) */
} mgt_bn_bwd_elemt_args;

typedef struct mgt_relu_fwd_args {
    float *y;
    const float *x;
    size_t n;
} mgt_relu_fwd_args;

typedef struct mgt_relu_bwd_args {
    float *dx;
    const float *dy, *y;
    size_t n;
} mgt_relu_bwd_args;

typedef struct mgt_maxpool_fwd_args {
    float *y;
    const float *x;
    mgt_pool2d_shape sh;
} mgt_maxpool_fwd_args;

typedef struct mgt_maxpool_bwd_args {
    float *dx;
    const float *dy, *x, *y;
    mgt_pool2d_shape sh;
} mgt_maxpool_bwd_args;

typedef struct mgt_avgpool_fwd_args {
    float *y;
    const float *x;
    int n, c, hw;
    mgt_layout layout; /* of x */
} mgt_avgpool_fwd_args;

typedef struct mgt_avgpool_bwd_args {
    float *dx;
    const float *dy;
    int n, c, hw;
    mgt_layout layout; /* of dx */
} mgt_avgpool_bwd_args;

typedef struct mgt_bias_fwd_args {
    float *y;
    const float *bias;
    int rows, cols;
} mgt_bias_fwd_args;

typedef struct mgt_bias_bwd_args {
    float *dbias;
    const float *dy;
    int rows, cols;
} mgt_bias_bwd_args;

/* target = w onehot(labels) + (1 - w) onehot(labels_b), then smoothing; labels_b and
   weights both NULL: w = 1 (the one-hot target of labels) */
typedef struct mgt_xent_fwd_args {
    float *loss, *probs;
    const float *logits;
    const int32_t *labels, *labels_b;
    const float *weights;
    int n, classes;
    float smoothing;
} mgt_xent_fwd_args;

typedef struct mgt_xent_bwd_args {
    float *dlogits;
    const float *probs;
    const int32_t *labels, *labels_b;
    const float *weights;
    int n, classes;
    float smoothing, scale;
} mgt_xent_bwd_args;

typedef struct mgt_topk_args {
    int32_t *count;
    const float *logits;
    const int32_t *labels;
    int n, classes, k;
} mgt_topk_args;

/* cast_to_16: dst is uint16_t [n], src float [n]; cast_from_16 the other way */
typedef struct mgt_cast_args {
    void *dst;
    const void *src;
    size_t n;
} mgt_cast_args;

typedef struct mgt_nonfinite_args {
    int32_t *count;
    const float *x;
    size_t n;
} mgt_nonfinite_args;

typedef struct mgt_sgd_args {
    float *param, *momentum_buf;
    const float *grad;
    size_t n;
    mgt_sgd_params p;
} mgt_sgd_args;

typedef struct mgt_adamw_args {
    float *param, *exp_avg, *exp_avg_sq;
    const float *grad;
    size_t n;
    mgt_adamw_params p;
} mgt_adamw_args;

typedef struct mgt_rmsprop_args {
    float *param, *square_avg, *momentum_buf;
    const float *grad;
    size_t n;
    mgt_rmsprop_params p;
} mgt_rmsprop_args;

/* y [n, c, hw] += bias[c] (a convolution's bias); y NCHW or NHWC */
typedef struct mgt_chbias_fwd_args {
    float *y;
    const float *bias;
    int n, c, hw;
    mgt_layout layout;
} mgt_chbias_fwd_args;

/* dbias[c] += sum over n and hw of dy [n, c, hw] (NCHW or NHWC) */
typedef struct mgt_chbias_bwd_args {
    float *dbias;
    const float *dy;
    int n, c, hw;
    mgt_layout layout;
} mgt_chbias_bwd_args;

/* y = x * keep / (1 - p) over n images of per_image floats; the same op is its own
   backward (dx = dy * keep / (1 - p)), the mask being a function of the key alone:
   see mgt_dropout in mgt/device.h. In NHWC (per_image = c hw) element (ch, pixel) keeps
   the mask of NCHW's element ch hw + pixel: the same mask whatever the layout. */
typedef struct mgt_dropout_args {
    float *y;
    const float *x;
    int n;
    size_t per_image;
    float p;
    uint64_t seed, step, sample0, sample_stride;
    uint32_t stream;
    int c;             /* channels of an NHWC image (unused in NCHW) */
    mgt_layout layout; /* of x and y */
} mgt_dropout_args;

/* torch's AdaptiveAvgPool2d of x [n, c, h, w] to y [n, c, oh, ow]: output (i, j)
   averages rows floor(i h / oh) .. ceil((i + 1) h / oh) - 1, columns likewise; x and y in
   one layout (NCHW, or NHWC: CUDA's 16-bit channels-last path) */
typedef struct mgt_apool_fwd_args {
    float *y;
    const float *x;
    int n, c, h, w, oh, ow;
    mgt_layout layout; /* of x and y */
} mgt_apool_fwd_args;

typedef struct mgt_apool_bwd_args {
    float *dx;
    const float *dy;
    int n, c, h, w, oh, ow;
    mgt_layout layout; /* of dx and dy */
} mgt_apool_bwd_args;

/* y[i * y_stride + r * y_row + k] = x[i * x_stride + r * x_row + k] for i < n,
   r < rows, k < count: channel slices of NCHW (concatenation, split) and channel
   shuffles; the regions must not overlap */
typedef struct mgt_scopy_args {
    float *y;
    const float *x;
    int n, rows;
    size_t count, y_stride, y_row, x_stride, x_row;
} mgt_scopy_args;

typedef struct mgt_act_fwd_args {
    float *y;
    const float *x;
    size_t n;
    mgt_act act;
} mgt_act_fwd_args;

typedef struct mgt_act_bwd_args {
    float *dx;
    const float *dy, *x;
    size_t n;
    mgt_act act;
} mgt_act_bwd_args;

/* scale [n, c] per image, or [c] with shared; the activations NCHW or NHWC */
typedef struct mgt_chscale_fwd_args {
    float *y;
    const float *x, *scale;
    int n, c, hw;
    bool shared;
    mgt_layout layout;
} mgt_chscale_fwd_args;

typedef struct mgt_chscale_bwd_args {
    float *dx, *dscale; /* dscale NULL: not computed */
    const float *dy, *x, *scale;
    int n, c, hw;
    bool shared;
    mgt_layout layout;
} mgt_chscale_bwd_args;

/* LayerNorm over the c values of each pixel of x [n, c, hw] (NCHW or NHWC); weight, bias [c] */
typedef struct mgt_lnc_fwd_args {
    float *y;
    const float *x, *weight, *bias;
    int n, c, hw;
    float eps;
    mgt_layout layout;
} mgt_lnc_fwd_args;

typedef struct mgt_lnc_bwd_args {
    float *dx, *dweight, *dbias; /* dweight, dbias added on */
    const float *dy, *x, *weight;
    int n, c, hw;
    float eps;
    mgt_layout layout;
} mgt_lnc_bwd_args;

/* mgt_permute: a gather writes walk from grid, a scatter grid from walk */
typedef struct mgt_permute_args {
    float *walk, *grid;
    mgt_permute_shape sh;
} mgt_permute_args;

/* attention (mgt_attention_forward); bias, mask, logit_scale optional */
typedef struct mgt_attn_fwd_args {
    float *y, *lse;
    const float *q, *k, *v, *bias, *mask, *logit_scale;
    mgt_attn_shape sh;
} mgt_attn_fwd_args;

/* dbias optional (written), dlogit_scale with cosine (added on) */
typedef struct mgt_attn_bwd_args {
    float *dq, *dk, *dv, *dbias, *dlogit_scale;
    const float *dy, *y, *lse, *q, *k, *v, *bias, *mask, *logit_scale;
    mgt_attn_shape sh;
} mgt_attn_bwd_args;

/* bias [heads, n] = alpha * table [rows, heads] gathered by index [n] */
typedef struct mgt_rpb_fwd_args {
    float *bias;
    const float *table;
    const int32_t *index;
    int rows, heads, n;
    float alpha;
} mgt_rpb_fwd_args;

/* dtable [rows, heads] += alpha * the segment sums of dbias [heads, n] */
typedef struct mgt_rpb_bwd_args {
    float *dtable;
    const float *dbias;
    const int32_t *offsets, *order;
    int rows, heads, n;
    float alpha;
} mgt_rpb_bwd_args;

/* An op: its kind, its precision, its arguments (the member the op list's args names). */
typedef struct mgt_op {
    mgt_op_kind kind;
    /* the arithmetic of a gemm or a convolution: F32 (what a zeroed op holds), or BF16 or FP16
       for its inputs rounded to that format (autocast's; sums and the output stay fp32); the
       16-bit format of a cast; F32 for every other kind */
    mgt_precision prec;
    /* How the op stores activations and their gradients (mgt_store in mgt/device.h): store_in
       for the forward's input activations (x, add's a and b) and their gradients (dx), store_out
       for its output activation (y) and its gradient (dy), in the forward op and in its backward
       alike (relu_backward's y is store_out, activation_backward's x store_in); F32 or a 16-bit
       format. Parameters, their gradients and statistics are fp32. Only the kinds
       mgt_op_takes_store names accept anything but F32. */
    mgt_precision store_in, store_out;
    union {
        mgt_fill_args fill;
        mgt_scale_args scale;
        mgt_axpy_args axpy;
        mgt_sum_args sum;
        mgt_add_args add;
        mgt_gemm_args gemm;
        mgt_conv_args conv;
        mgt_bn_train_args bn_train;
        mgt_bn_eval_args bn_eval;
        mgt_bn_bwd_args bn_bwd;
        mgt_bn_stats_args bn_stats;
        mgt_bn_bwd_elemt_args bn_bwd_elemt;
        mgt_relu_fwd_args relu_fwd;
        mgt_relu_bwd_args relu_bwd;
        mgt_maxpool_fwd_args maxpool_fwd;
        mgt_maxpool_bwd_args maxpool_bwd;
        mgt_avgpool_fwd_args avgpool_fwd;
        mgt_avgpool_bwd_args avgpool_bwd;
        mgt_bias_fwd_args bias_fwd;
        mgt_bias_bwd_args bias_bwd;
        mgt_xent_fwd_args xent_fwd;
        mgt_xent_bwd_args xent_bwd;
        mgt_topk_args topk;
        mgt_cast_args cast;
        mgt_nonfinite_args nonfinite;
        mgt_sgd_args sgd;
        mgt_adamw_args adamw;
        mgt_rmsprop_args rmsprop;
        mgt_chbias_fwd_args chbias_fwd;
        mgt_chbias_bwd_args chbias_bwd;
        mgt_dropout_args dropout;
        mgt_apool_fwd_args apool_fwd;
        mgt_apool_bwd_args apool_bwd;
        mgt_scopy_args scopy;
        mgt_act_fwd_args act_fwd;
        mgt_act_bwd_args act_bwd;
        mgt_chscale_fwd_args chscale_fwd;
        mgt_chscale_bwd_args chscale_bwd;
        mgt_lnc_fwd_args lnc_fwd;
        mgt_lnc_bwd_args lnc_bwd;
        mgt_permute_args permute;
        mgt_attn_fwd_args attn_fwd;
        mgt_attn_bwd_args attn_bwd;
        mgt_rpb_fwd_args rpb_fwd;
        mgt_rpb_bwd_args rpb_bwd;
    } u;
} mgt_op;

typedef enum mgt_operand_role {
    MGT_OPERAND_IN,    /* read only */
    MGT_OPERAND_OUT,   /* written without being read */
    MGT_OPERAND_INOUT, /* read and written (accumulated, beta != 0, running statistics) */
} mgt_operand_role;

typedef enum mgt_dtype { MGT_F32, MGT_I32, MGT_U16 } mgt_dtype;

/* One pointer argument of an op: where, how many elements, of what, read or written. */
typedef struct mgt_operand {
    const char *name;
    void **ptr; /* points into the op, so a harness can redirect the argument */
    size_t count;
    mgt_dtype dtype;
    mgt_operand_role role;
} mgt_operand;

#define MGT_OP_MAX_OPERANDS 16

/* Bytes of one element: 4, or 2 for MGT_U16. */
size_t mgt_dtype_size(mgt_dtype t);

/* Whether the op reads or writes an activation in a layout other than NCHW (mgt_layout). */
bool mgt_op_blocked(const mgt_op *op);

/* Whether a batch norm has a fused residual add (z, dz): the CUDA backend's 16-bit kernels
   and the reference run it; the mock devices' kernels and cuDNN's fp32 path do not. */
static inline bool mgt_op_bn_residual(const mgt_op *op)
{
    return (op->kind == MGT_OP_BN_FWD_TRAIN && op->u.bn_train.z) ||
           (op->kind == MGT_OP_BN_FWD_EVAL && op->u.bn_eval.z) ||
           (op->kind == MGT_OP_BN_BWD && op->u.bn_bwd.dz);
}

/* Whether ops of this kind take 16-bit activation storage (store_in, store_out). */
bool mgt_op_takes_store(mgt_op_kind kind);
/* The op's 16-bit storage format (of store_in or store_out; where both are 16-bit they agree),
   or MGT_PREC_F32 when it stores every activation in fp32. */
mgt_precision mgt_op_store16(const mgt_op *op);

/* "conv2d_forward", ...; the names CTest uses for the conformance cases. */
const char *mgt_op_name(mgt_op_kind kind);
/* The kind with that name, or MGT_OP_COUNT. */
mgt_op_kind mgt_op_kind_from_name(const char *name);

/* Checks sizes and parameters (positive dims, padding smaller than the window, ...), then
   that no operand mgt_op_operands lists is NULL; sets the error text and returns
   MGT_ERR_INVALID. */
mgt_status mgt_op_check(const mgt_op *op);

/* Lists the op's pointer operands, every one the op reads or writes (an optional pointer only
   where the op uses it); returns how many. Counts are only meaningful for an op whose sizes
   pass mgt_op_check. */
int mgt_op_operands(mgt_op *op, mgt_operand out[MGT_OP_MAX_OPERANDS]);

/* Multiply-adds times two, for GFLOP/s figures; 0 for ops that are not compute-bound. */
double mgt_op_flops(const mgt_op *op);

/* Dropout's mask (mgt_dropout_key in mgt/device.h): the threshold ceil(p * 2^24) that the top
   24 bits of a word must reach for its element to be kept, and the Philox block `block` of
   image `image` of a dropout op (elements 4 * block .. 4 * block + 3). */
uint32_t mgt_dropout_threshold(float p);

/* Adaptive pooling's window along one side: [*lo, *hi) of `in` for output i of `out`. */
static inline void mgt_apool_range(int i, int in, int out, int *lo, int *hi)
{
    *lo = (int)((long long)i * in / out);
    *hi = (int)(((long long)(i + 1) * in + out - 1) / out);
}
void mgt_dropout_block(const mgt_op *op, int image, uint32_t block, uint32_t out[4]);
/* The Philox block `block` of the dropout stream of global sample g under key k (what
   mgt_dropout_block computes for a dropout op's image, and attention's dropout for its own). */
void mgt_dropout_philox(const mgt_dropout_key *k, uint64_t g, uint32_t block, uint32_t out[4]);
/* Whether attention's dropout keeps element (b, h, t, u) (mgt_attn_shape), by word j % 4 of
   block j / 4 of image b / groups_per_sample's stream. */
bool mgt_attn_keep(const mgt_attn_shape *sh, int b, int h, int t, int u);

/* Checks the op and enqueues it on s (the path every mgt_* kernel wrapper takes); what a
   generic harness calls. MGT_ERR_UNSUPPORTED where the backend cannot run it. */
mgt_status mgt_op_launch(mgt_stream *s, const mgt_op *op);

/* Runs an op that stores activations in 16 bits as its fp32 form: the 16-bit inputs widened
   into fp32 copies (exact), the op run by fp32() with store_in and store_out F32 and its 16-bit
   outputs redirected to fp32 copies, each then rounded once (nearest even, device/lowp.h) into
   the 16-bit output. This is where the reference and the mock devices round, the same points by
   construction. widen(ctx, n) returns room for n floats that lives until the next call (NULL:
   out of memory, its error set); the copies are made by copy(ctx, job) so that a backend may
   split them over its threads. */
typedef struct mgt_store_job {
    mgt_precision prec;
    bool to16; /* false: src uint16_t -> dst float; true: src float -> dst uint16_t */
    const void *src;
    void *dst;
    size_t n;
} mgt_store_job;
mgt_status mgt_op_run_widened(const mgt_op *op, void *ctx, float *(*widen)(void *ctx, size_t n),
                              void (*copy)(void *ctx, const mgt_store_job *job),
                              mgt_status (*fp32)(void *ctx, const mgt_op *op));
/* The copy of mgt_store_job on one thread. */
void mgt_store_copy(const mgt_store_job *job, size_t lo, size_t hi);

/* The plain reference: obviously correct loops, single-threaded, on host memory. It is what
   the conformance suite holds every backend to. Returns MGT_ERR_DEVICE for a bad label. */
mgt_status mgt_ref_run(const mgt_op *op);

#endif
