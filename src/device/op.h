/* Kernel calls as values: what the dispatch layer hands a backend, what a mock stream queues,
   and what the conformance suite runs on every backend and on the reference. */
#ifndef MGT_DEVICE_OP_H
#define MGT_DEVICE_OP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mgt/device.h"

typedef enum mgt_op_kind {
    MGT_OP_FILL,
    MGT_OP_SCALE,
    MGT_OP_AXPY,
    MGT_OP_SUM,
    MGT_OP_ADD,
    MGT_OP_GEMM,
    MGT_OP_CONV2D_FWD,
    MGT_OP_CONV2D_BWD_DATA,
    MGT_OP_CONV2D_BWD_FILTER,
    MGT_OP_BN_FWD_TRAIN,
    MGT_OP_BN_FWD_EVAL,
    MGT_OP_BN_BWD,
    MGT_OP_RELU_FWD,
    MGT_OP_RELU_BWD,
    MGT_OP_MAXPOOL_FWD,
    MGT_OP_MAXPOOL_BWD,
    MGT_OP_AVGPOOL_FWD,
    MGT_OP_AVGPOOL_BWD,
    MGT_OP_BIAS_FWD,
    MGT_OP_BIAS_BWD,
    MGT_OP_XENT_FWD,
    MGT_OP_XENT_BWD,
    MGT_OP_TOPK,
    MGT_OP_SGD,
    MGT_OP_COUNT
} mgt_op_kind;

/* Arguments of each kind; names and meanings as in the mgt_* wrappers of mgt/device.h. */
typedef struct mgt_op {
    mgt_op_kind kind;
    union {
        struct {
            float *x;
            float value;
            size_t n;
        } fill;
        struct {
            float *x;
            float alpha;
            size_t n;
        } scale;
        struct {
            float *y;
            float alpha;
            const float *x;
            size_t n;
        } axpy;
        struct {
            float *out;
            const float *x;
            size_t n;
        } sum;
        struct {
            float *y;
            const float *a, *b;
            size_t n;
        } add;
        struct {
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
        } gemm;
        /* forward: out = y, in1 = x, in2 = w; backward data: out = dx, in1 = dy, in2 = w;
           backward filter: out = dw, in1 = dy, in2 = x */
        struct {
            float *out;
            const float *in1, *in2;
            mgt_conv2d_shape sh;
            float beta;
        } conv;
        struct {
            float *y, *save_mean, *save_invstd, *running_mean, *running_var;
            const float *x, *gamma, *beta;
            mgt_bn_shape sh;
        } bn_train;
        struct {
            float *y;
            const float *x, *gamma, *beta, *running_mean, *running_var;
            mgt_bn_shape sh;
        } bn_eval;
        struct {
            float *dx, *dgamma, *dbeta;
            const float *dy, *x, *gamma, *save_mean, *save_invstd;
            mgt_bn_shape sh;
        } bn_bwd;
        struct {
            float *y;
            const float *x;
            size_t n;
        } relu_fwd;
        struct {
            float *dx;
            const float *dy, *y;
            size_t n;
        } relu_bwd;
        struct {
            float *y;
            const float *x;
            mgt_pool2d_shape sh;
        } maxpool_fwd;
        struct {
            float *dx;
            const float *dy, *x, *y;
            mgt_pool2d_shape sh;
        } maxpool_bwd;
        struct {
            float *y;
            const float *x;
            int n, c, hw;
        } avgpool_fwd;
        struct {
            float *dx;
            const float *dy;
            int n, c, hw;
        } avgpool_bwd;
        struct {
            float *y;
            const float *bias;
            int rows, cols;
        } bias_fwd;
        struct {
            float *dbias;
            const float *dy;
            int rows, cols;
        } bias_bwd;
        struct {
            float *loss, *probs;
            const float *logits;
            const int32_t *labels;
            int n, classes;
            float smoothing;
        } xent_fwd;
        struct {
            float *dlogits;
            const float *probs;
            const int32_t *labels;
            int n, classes;
            float smoothing, scale;
        } xent_bwd;
        struct {
            int32_t *count;
            const float *logits;
            const int32_t *labels;
            int n, classes, k;
        } topk;
        struct {
            float *param, *momentum_buf;
            const float *grad;
            size_t n;
            mgt_sgd_params p;
        } sgd;
    } u;
} mgt_op;

typedef enum mgt_operand_role {
    MGT_OPERAND_IN,    /* read only */
    MGT_OPERAND_OUT,   /* written without being read */
    MGT_OPERAND_INOUT, /* read and written (accumulated, beta != 0, running statistics) */
} mgt_operand_role;

typedef enum mgt_dtype { MGT_F32, MGT_I32 } mgt_dtype;

/* One pointer argument of an op: where, how many elements, of what, read or written. */
typedef struct mgt_operand {
    const char *name;
    void **ptr; /* points into the op, so a harness can redirect the argument */
    size_t count;
    mgt_dtype dtype;
    mgt_operand_role role;
} mgt_operand;

#define MGT_OP_MAX_OPERANDS 10

/* "conv2d_forward", ...; the names CTest uses for the conformance cases. */
const char *mgt_op_name(mgt_op_kind kind);
/* The kind with that name, or MGT_OP_COUNT. */
mgt_op_kind mgt_op_kind_from_name(const char *name);

/* Checks sizes and parameters (positive dims, padding smaller than the window, ...) and
   that no required pointer is NULL; sets the error text and returns MGT_ERR_INVALID. */
mgt_status mgt_op_check(const mgt_op *op);

/* Lists the op's pointer operands (NULL optional ones left out); returns how many. */
int mgt_op_operands(mgt_op *op, mgt_operand out[MGT_OP_MAX_OPERANDS]);

/* Multiply-adds times two, for GFLOP/s figures; 0 for ops that are not compute-bound. */
double mgt_op_flops(const mgt_op *op);

/* Checks the op and enqueues it on s (the path every mgt_* kernel wrapper takes); what a
   generic harness calls. MGT_ERR_UNSUPPORTED where the backend cannot run it. */
mgt_status mgt_op_launch(mgt_stream *s, const mgt_op *op);

/* The plain reference: obviously correct loops, single-threaded, on host memory. It is what
   the conformance suite holds every backend to. Returns MGT_ERR_DEVICE for a bad label. */
mgt_status mgt_ref_run(const mgt_op *op);

#endif
