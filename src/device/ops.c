/* The public op wrappers of mgt/device.h: each builds its mgt_op from its arguments and hands it
   to mgt_op_launch (device.c), which checks it and passes it to the backend; also the names of
   the precisions and activations. */
#include <string.h>

#include "device/backend.h"

static mgt_status bad_arg(const char *call, const char *what)
{
    return mgt_error_set(MGT_ERR_INVALID, "%s: %s", call, what);
}

#define LAUNCH(KIND, FIELD, ...)                         \
    do {                                                 \
        mgt_op op_ = {.kind = KIND};                     \
        op_.u.FIELD = (mgt_##FIELD##_args){__VA_ARGS__}; \
        return mgt_op_launch(s, &op_);                   \
    } while (0)

/* The same with the activation storage of the _st forms (mgt_store). */
#define LAUNCH_ST(KIND, FIELD, ST, ...)                                          \
    do {                                                                         \
        mgt_op op_ = {.kind = KIND, .store_in = (ST).in, .store_out = (ST).out}; \
        op_.u.FIELD = (mgt_##FIELD##_args){__VA_ARGS__};                         \
        return mgt_op_launch(s, &op_);                                           \
    } while (0)

static const mgt_store f32_store = {MGT_PREC_F32, MGT_PREC_F32};

mgt_status mgt_fill(mgt_stream *s, float *x, float value, size_t n)
{
    LAUNCH(MGT_OP_FILL, fill, x, value, n);
}

mgt_status mgt_scale(mgt_stream *s, float *x, float alpha, size_t n)
{
    LAUNCH(MGT_OP_SCALE, scale, x, alpha, n);
}

mgt_status mgt_axpy(mgt_stream *s, float *y, float alpha, const float *x, size_t n)
{
    LAUNCH(MGT_OP_AXPY, axpy, y, alpha, x, n);
}

mgt_status mgt_sum(mgt_stream *s, float *out, const float *x, size_t n)
{
    LAUNCH(MGT_OP_SUM, sum, out, x, n);
}

mgt_status mgt_sum_squares(mgt_stream *s, float *out, const float *x, size_t n)
{
    LAUNCH(MGT_OP_SUMSQ, sum, out, x, n);
}

mgt_status mgt_add_st(mgt_stream *s, mgt_store st, float *y, const float *a, const float *b,
                      size_t n)
{
    LAUNCH_ST(MGT_OP_ADD, add, st, y, a, b, n);
}

mgt_status mgt_add(mgt_stream *s, float *y, const float *a, const float *b, size_t n)
{
    return mgt_add_st(s, f32_store, y, a, b, n);
}

mgt_status mgt_gemm(mgt_stream *s, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                    const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc)
{
    return mgt_gemm_lp(s, MGT_PREC_F32, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                       ldc);
}

static mgt_status conv_st(mgt_stream *s, mgt_op_kind kind, mgt_precision prec, mgt_store st,
                          float *out, const float *in1, const float *in2,
                          const mgt_conv2d_shape *sh, float beta)
{
    if (!sh)
        return bad_arg(mgt_op_name(kind), "no shape");
    mgt_op op = {.kind = kind, .store_in = st.in, .store_out = st.out};
    op.u.conv.out = out;
    op.u.conv.in1 = in1;
    op.u.conv.in2 = in2;
    op.u.conv.sh = *sh;
    op.u.conv.beta = beta;
    op.prec = prec;
    return mgt_op_launch(s, &op);
}

static mgt_status conv_prec(mgt_stream *s, mgt_op_kind kind, mgt_precision prec, float *out,
                            const float *in1, const float *in2, const mgt_conv2d_shape *sh,
                            float beta)
{
    return conv_st(s, kind, prec, f32_store, out, in1, in2, sh, beta);
}

static mgt_status conv(mgt_stream *s, mgt_op_kind kind, float *out, const float *in1,
                       const float *in2, const mgt_conv2d_shape *sh, float beta)
{
    return conv_prec(s, kind, MGT_PREC_F32, out, in1, in2, sh, beta);
}

mgt_status mgt_conv2d_forward(mgt_stream *s, float *y, const float *x, const float *w,
                              const mgt_conv2d_shape *sh, float beta)
{
    return conv(s, MGT_OP_CONV2D_FWD, y, x, w, sh, beta);
}

mgt_status mgt_conv2d_backward_data(mgt_stream *s, float *dx, const float *dy, const float *w,
                                    const mgt_conv2d_shape *sh, float beta)
{
    return conv(s, MGT_OP_CONV2D_BWD_DATA, dx, dy, w, sh, beta);
}

mgt_status mgt_conv2d_backward_filter(mgt_stream *s, float *dw, const float *dy, const float *x,
                                      const mgt_conv2d_shape *sh, float beta)
{
    return conv(s, MGT_OP_CONV2D_BWD_FILTER, dw, dy, x, sh, beta);
}

const char *mgt_precision_name(mgt_precision p)
{
    return p == MGT_PREC_BF16 ? "bf16" : p == MGT_PREC_FP16 ? "fp16" : "f32";
}

bool mgt_precision_parse(const char *name, mgt_precision *out)
{
    static const mgt_precision all[] = {MGT_PREC_F32, MGT_PREC_BF16, MGT_PREC_FP16};
    for (size_t i = 0; name && i < sizeof all / sizeof all[0]; i++)
        if (strcmp(name, mgt_precision_name(all[i])) == 0) {
            *out = all[i];
            return true;
        }
    return false;
}

mgt_status mgt_gemm_st(mgt_stream *s, mgt_precision prec, mgt_gemm_store st, bool trans_a,
                       bool trans_b, int m, int n, int k, float alpha, const float *a, int lda,
                       const float *b, int ldb, float beta, float *c, int ldc)
{
    bool any = st.fmt != MGT_PREC_F32 && (st.a || st.b || st.c);
    mgt_precision fmt = any ? st.fmt : MGT_PREC_F32;
    mgt_op op = {.kind = MGT_OP_GEMM, .prec = prec, .store_in = fmt, .store_out = fmt};
    op.u.gemm =
        (mgt_gemm_args){trans_a, trans_b, m,    n, k,   alpha,       a,           lda,
                        b,       ldb,     beta, c, ldc, any && st.a, any && st.b, any && st.c};
    return mgt_op_launch(s, &op);
}

mgt_status mgt_gemm_lp(mgt_stream *s, mgt_precision prec, bool trans_a, bool trans_b, int m, int n,
                       int k, float alpha, const float *a, int lda, const float *b, int ldb,
                       float beta, float *c, int ldc)
{
    return mgt_gemm_st(s, prec, (mgt_gemm_store){MGT_PREC_F32, false, false, false}, trans_a,
                       trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

mgt_status mgt_conv2d_forward_lp(mgt_stream *s, mgt_precision prec, float *y, const float *x,
                                 const float *w, const mgt_conv2d_shape *sh, float beta)
{
    return conv_prec(s, MGT_OP_CONV2D_FWD, prec, y, x, w, sh, beta);
}

mgt_status mgt_conv2d_forward_st(mgt_stream *s, mgt_precision prec, mgt_store st, float *y,
                                 const float *x, const float *w, const mgt_conv2d_shape *sh,
                                 float beta)
{
    return conv_st(s, MGT_OP_CONV2D_FWD, prec, st, y, x, w, sh, beta);
}

mgt_status mgt_conv2d_backward_data_st(mgt_stream *s, mgt_precision prec, mgt_store st, float *dx,
                                       const float *dy, const float *w, const mgt_conv2d_shape *sh,
                                       float beta)
{
    return conv_st(s, MGT_OP_CONV2D_BWD_DATA, prec, st, dx, dy, w, sh, beta);
}

mgt_status mgt_avgpool_backward_st(mgt_stream *s, mgt_store st, float *dx, const float *dy, int n,
                                   int c, int hw, mgt_layout l)
{
    LAUNCH_ST(MGT_OP_AVGPOOL_BWD, avgpool_bwd, st, dx, dy, n, c, hw, l);
}

mgt_status mgt_adaptive_avgpool_backward_st(mgt_stream *s, mgt_store st, float *dx, const float *dy,
                                            int n, int c, int h, int w, int oh, int ow,
                                            mgt_layout l)
{
    LAUNCH_ST(MGT_OP_APOOL_BWD, apool_bwd, st, dx, dy, n, c, h, w, oh, ow, l);
}

mgt_status mgt_conv2d_backward_filter_st(mgt_stream *s, mgt_precision prec, mgt_store st, float *dw,
                                         const float *dy, const float *x,
                                         const mgt_conv2d_shape *sh, float beta)
{
    return conv_st(s, MGT_OP_CONV2D_BWD_FILTER, prec, st, dw, dy, x, sh, beta);
}

mgt_status mgt_conv2d_backward_data_lp(mgt_stream *s, mgt_precision prec, float *dx,
                                       const float *dy, const float *w, const mgt_conv2d_shape *sh,
                                       float beta)
{
    return conv_prec(s, MGT_OP_CONV2D_BWD_DATA, prec, dx, dy, w, sh, beta);
}

mgt_status mgt_conv2d_backward_filter_lp(mgt_stream *s, mgt_precision prec, float *dw,
                                         const float *dy, const float *x,
                                         const mgt_conv2d_shape *sh, float beta)
{
    return conv_prec(s, MGT_OP_CONV2D_BWD_FILTER, prec, dw, dy, x, sh, beta);
}

mgt_status mgt_cast_to_16(mgt_stream *s, mgt_precision prec, uint16_t *h, const float *x, size_t n)
{
    mgt_op op = {.kind = MGT_OP_CAST_TO_16, .prec = prec};
    op.u.cast = (mgt_cast_args){h, x, n};
    return mgt_op_launch(s, &op);
}

mgt_status mgt_cast_from_16(mgt_stream *s, mgt_precision prec, float *x, const uint16_t *h,
                            size_t n)
{
    mgt_op op = {.kind = MGT_OP_CAST_FROM_16, .prec = prec};
    op.u.cast = (mgt_cast_args){x, h, n};
    return mgt_op_launch(s, &op);
}

mgt_status mgt_nonfinite_count(mgt_stream *s, int32_t *count, const float *x, size_t n)
{
    LAUNCH(MGT_OP_NONFINITE, nonfinite, count, x, n);
}

mgt_status mgt_batchnorm_forward_train_st(mgt_stream *s, mgt_store st, float *y, float *save_mean,
                                          float *save_invstd, float *running_mean,
                                          float *running_var, const float *x, const float *gamma,
                                          const float *beta, const mgt_bn_shape *sh, const float *z)
{
    if (!sh)
        return bad_arg("batchnorm_forward_train", "no shape");
    LAUNCH_ST(MGT_OP_BN_FWD_TRAIN, bn_train, st, y, save_mean, save_invstd, running_mean,
              running_var, x, gamma, beta, *sh, z, st.out);
}

mgt_status mgt_batchnorm_forward_train(mgt_stream *s, float *y, float *save_mean,
                                       float *save_invstd, float *running_mean, float *running_var,
                                       const float *x, const float *gamma, const float *beta,
                                       const mgt_bn_shape *sh)
{
    return mgt_batchnorm_forward_train_st(s, f32_store, y, save_mean, save_invstd, running_mean,
                                          running_var, x, gamma, beta, sh, NULL);
}

mgt_status mgt_batchnorm_forward_eval_st(mgt_stream *s, mgt_store st, float *y, const float *x,
                                         const float *gamma, const float *beta,
                                         const float *running_mean, const float *running_var,
                                         const mgt_bn_shape *sh, const float *z)
{
    if (!sh)
        return bad_arg("batchnorm_forward_eval", "no shape");
    LAUNCH_ST(MGT_OP_BN_FWD_EVAL, bn_eval, st, y, x, gamma, beta, running_mean, running_var, *sh, z,
              st.out);
}

mgt_status mgt_batchnorm_forward_eval(mgt_stream *s, float *y, const float *x, const float *gamma,
                                      const float *beta, const float *running_mean,
                                      const float *running_var, const mgt_bn_shape *sh)
{
    return mgt_batchnorm_forward_eval_st(s, f32_store, y, x, gamma, beta, running_mean, running_var,
                                         sh, NULL);
}

mgt_status mgt_batchnorm_backward_st(mgt_stream *s, mgt_store st, float *dx, float *dgamma,
                                     float *dbeta, const float *dy, const float *y, const float *x,
                                     const float *gamma, const float *save_mean,
                                     const float *save_invstd, const mgt_bn_shape *sh, float *dz)
{
    if (!sh)
        return bad_arg("batchnorm_backward", "no shape");
    LAUNCH_ST(MGT_OP_BN_BWD, bn_bwd, st, dx, dgamma, dbeta, dy, y, x, gamma, save_mean, save_invstd,
              *sh, dz);
}

mgt_status mgt_batchnorm_backward(mgt_stream *s, float *dx, float *dgamma, float *dbeta,
                                  const float *dy, const float *y, const float *x,
                                  const float *gamma, const float *save_mean,
                                  const float *save_invstd, const mgt_bn_shape *sh)
{
    return mgt_batchnorm_backward_st(s, f32_store, dx, dgamma, dbeta, dy, y, x, gamma, save_mean,
                                     save_invstd, sh, NULL);
}

mgt_status mgt_bn_stats(mgt_stream *s, float *mean, float *var, const float *x,
                        const mgt_bn_shape *sh)
{
    if (!sh)
        return bad_arg("bn_stats", "no shape");
    LAUNCH(MGT_OP_BN_STATS, bn_stats, mean, var, x, *sh);
}

mgt_status mgt_bn_backward_elemt(mgt_stream *s, float *dx, const float *dy, const float *x,
                                 const float *gamma, const float *mean, const float *invstd,
                                 const float *sum_dy, const float *sum_dy_xhat, double count,
                                 const mgt_bn_shape *sh)
{
    if (!sh)
        return bad_arg("bn_backward_elemt", "no shape");
    LAUNCH(MGT_OP_BN_BWD_ELEMT, bn_bwd_elemt, dx, dy, x, gamma, mean, invstd, sum_dy, sum_dy_xhat,
           *sh, count);
}

mgt_status mgt_relu_forward_st(mgt_stream *s, mgt_store st, float *y, const float *x, size_t n)
{
    LAUNCH_ST(MGT_OP_RELU_FWD, relu_fwd, st, y, x, n);
}

mgt_status mgt_relu_forward(mgt_stream *s, float *y, const float *x, size_t n)
{
    return mgt_relu_forward_st(s, f32_store, y, x, n);
}

mgt_status mgt_relu_backward_st(mgt_stream *s, mgt_store st, float *dx, const float *dy,
                                const float *y, size_t n)
{
    LAUNCH_ST(MGT_OP_RELU_BWD, relu_bwd, st, dx, dy, y, n);
}

mgt_status mgt_relu_backward(mgt_stream *s, float *dx, const float *dy, const float *y, size_t n)
{
    return mgt_relu_backward_st(s, f32_store, dx, dy, y, n);
}

mgt_status mgt_maxpool2d_forward_st(mgt_stream *s, mgt_store st, float *y, const float *x,
                                    const mgt_pool2d_shape *sh)
{
    if (!sh)
        return bad_arg("maxpool2d_forward", "no shape");
    LAUNCH_ST(MGT_OP_MAXPOOL_FWD, maxpool_fwd, st, y, x, *sh);
}

mgt_status mgt_maxpool2d_forward(mgt_stream *s, float *y, const float *x,
                                 const mgt_pool2d_shape *sh)
{
    return mgt_maxpool2d_forward_st(s, f32_store, y, x, sh);
}

mgt_status mgt_maxpool2d_backward_st(mgt_stream *s, mgt_store st, float *dx, const float *dy,
                                     const float *x, const float *y, const mgt_pool2d_shape *sh)
{
    if (!sh)
        return bad_arg("maxpool2d_backward", "no shape");
    LAUNCH_ST(MGT_OP_MAXPOOL_BWD, maxpool_bwd, st, dx, dy, x, y, *sh);
}

mgt_status mgt_maxpool2d_backward(mgt_stream *s, float *dx, const float *dy, const float *x,
                                  const float *y, const mgt_pool2d_shape *sh)
{
    return mgt_maxpool2d_backward_st(s, f32_store, dx, dy, x, y, sh);
}

mgt_status mgt_avgpool_forward_st(mgt_stream *s, mgt_store st, float *y, const float *x, int n,
                                  int c, int hw, mgt_layout l)
{
    LAUNCH_ST(MGT_OP_AVGPOOL_FWD, avgpool_fwd, st, y, x, n, c, hw, l);
}

mgt_status mgt_avgpool_forward(mgt_stream *s, float *y, const float *x, int n, int c, int hw,
                               mgt_layout l)
{
    return mgt_avgpool_forward_st(s, f32_store, y, x, n, c, hw, l);
}

mgt_status mgt_avgpool_backward(mgt_stream *s, float *dx, const float *dy, int n, int c, int hw,
                                mgt_layout l)
{
    LAUNCH(MGT_OP_AVGPOOL_BWD, avgpool_bwd, dx, dy, n, c, hw, l);
}

mgt_status mgt_bias_forward_st(mgt_stream *s, mgt_store st, float *y, const float *bias, int rows,
                               int cols)
{
    LAUNCH_ST(MGT_OP_BIAS_FWD, bias_fwd, st, y, bias, rows, cols);
}

mgt_status mgt_bias_forward(mgt_stream *s, float *y, const float *bias, int rows, int cols)
{
    return mgt_bias_forward_st(s, f32_store, y, bias, rows, cols);
}

mgt_status mgt_bias_backward_st(mgt_stream *s, mgt_store st, float *dbias, const float *dy,
                                int rows, int cols)
{
    LAUNCH_ST(MGT_OP_BIAS_BWD, bias_bwd, st, dbias, dy, rows, cols);
}

mgt_status mgt_bias_backward(mgt_stream *s, float *dbias, const float *dy, int rows, int cols)
{
    return mgt_bias_backward_st(s, f32_store, dbias, dy, rows, cols);
}

mgt_status mgt_channel_bias_forward_st(mgt_stream *s, mgt_store st, float *y, const float *bias,
                                       int n, int c, int hw, mgt_layout l)
{
    LAUNCH_ST(MGT_OP_CHBIAS_FWD, chbias_fwd, st, y, bias, n, c, hw, l);
}

mgt_status mgt_channel_bias_forward(mgt_stream *s, float *y, const float *bias, int n, int c,
                                    int hw)
{
    return mgt_channel_bias_forward_st(s, f32_store, y, bias, n, c, hw, MGT_LAYOUT_NCHW);
}

mgt_status mgt_channel_bias_backward_st(mgt_stream *s, mgt_store st, float *dbias, const float *dy,
                                        int n, int c, int hw, mgt_layout l)
{
    LAUNCH_ST(MGT_OP_CHBIAS_BWD, chbias_bwd, st, dbias, dy, n, c, hw, l);
}

mgt_status mgt_channel_bias_backward(mgt_stream *s, float *dbias, const float *dy, int n, int c,
                                     int hw)
{
    return mgt_channel_bias_backward_st(s, f32_store, dbias, dy, n, c, hw, MGT_LAYOUT_NCHW);
}

mgt_status mgt_adaptive_avgpool_forward_st(mgt_stream *s, mgt_store st, float *y, const float *x,
                                           int n, int c, int h, int w, int oh, int ow, mgt_layout l)
{
    LAUNCH_ST(MGT_OP_APOOL_FWD, apool_fwd, st, y, x, n, c, h, w, oh, ow, l);
}

mgt_status mgt_adaptive_avgpool_forward(mgt_stream *s, float *y, const float *x, int n, int c,
                                        int h, int w, int oh, int ow)
{
    return mgt_adaptive_avgpool_forward_st(s, f32_store, y, x, n, c, h, w, oh, ow, MGT_LAYOUT_NCHW);
}

mgt_status mgt_adaptive_avgpool_backward(mgt_stream *s, float *dx, const float *dy, int n, int c,
                                         int h, int w, int oh, int ow)
{
    LAUNCH(MGT_OP_APOOL_BWD, apool_bwd, dx, dy, n, c, h, w, oh, ow, MGT_LAYOUT_NCHW);
}

mgt_status mgt_strided_copy_st(mgt_stream *s, mgt_store st, float *y, const float *x,
                               const mgt_strided_copy_shape *sh)
{
    if (!sh)
        return bad_arg("strided_copy", "no shape");
    LAUNCH_ST(MGT_OP_STRIDED_COPY, scopy, st, y, x, sh->n, sh->rows, sh->count, sh->y_stride,
              sh->y_row, sh->x_stride, sh->x_row);
}

mgt_status mgt_strided_copy(mgt_stream *s, float *y, const float *x,
                            const mgt_strided_copy_shape *sh)
{
    return mgt_strided_copy_st(s, f32_store, y, x, sh);
}

mgt_status mgt_dropout_st(mgt_stream *s, mgt_store st, float *y, const float *x, int n,
                          size_t per_image, float p, const mgt_dropout_key *key, int c,
                          mgt_layout l)
{
    if (!key)
        return bad_arg("dropout", "no key");
    LAUNCH_ST(MGT_OP_DROPOUT, dropout, st, y, x, n, per_image, p, key->seed, key->step,
              key->sample0, key->sample_stride, key->stream, c, l);
}

mgt_status mgt_dropout(mgt_stream *s, float *y, const float *x, int n, size_t per_image, float p,
                       const mgt_dropout_key *key)
{
    return mgt_dropout_st(s, f32_store, y, x, n, per_image, p, key, 0, MGT_LAYOUT_NCHW);
}

const char *mgt_act_name(mgt_act act)
{
#define ACT_NAME(KIND, name) [MGT_ACT_##KIND] = #name,
    static const char *const names[MGT_ACT_COUNT] = {MGT_ACT_LIST(ACT_NAME)};
#undef ACT_NAME
    return (unsigned)act < MGT_ACT_COUNT ? names[act] : "unknown";
}

mgt_status mgt_activation_forward_st(mgt_stream *s, mgt_store st, float *y, const float *x,
                                     size_t n, mgt_act act)
{
    LAUNCH_ST(MGT_OP_ACT_FWD, act_fwd, st, y, x, n, act);
}

mgt_status mgt_activation_forward(mgt_stream *s, float *y, const float *x, size_t n, mgt_act act)
{
    return mgt_activation_forward_st(s, f32_store, y, x, n, act);
}

mgt_status mgt_activation_backward_st(mgt_stream *s, mgt_store st, float *dx, const float *dy,
                                      const float *x, size_t n, mgt_act act)
{
    LAUNCH_ST(MGT_OP_ACT_BWD, act_bwd, st, dx, dy, x, n, act);
}

mgt_status mgt_activation_backward(mgt_stream *s, float *dx, const float *dy, const float *x,
                                   size_t n, mgt_act act)
{
    return mgt_activation_backward_st(s, f32_store, dx, dy, x, n, act);
}

mgt_status mgt_channel_scale_forward_st(mgt_stream *s, mgt_store st, float *y, const float *x,
                                        const float *scale, int n, int c, int hw, bool shared,
                                        mgt_layout l)
{
    LAUNCH_ST(MGT_OP_CHSCALE_FWD, chscale_fwd, st, y, x, scale, n, c, hw, shared, l);
}

mgt_status mgt_channel_scale_forward(mgt_stream *s, float *y, const float *x, const float *scale,
                                     int n, int c, int hw, bool shared)
{
    return mgt_channel_scale_forward_st(s, f32_store, y, x, scale, n, c, hw, shared,
                                        MGT_LAYOUT_NCHW);
}

mgt_status mgt_channel_scale_backward_st(mgt_stream *s, mgt_store st, float *dx, float *dscale,
                                         const float *dy, const float *x, const float *scale, int n,
                                         int c, int hw, bool shared, mgt_layout l)
{
    LAUNCH_ST(MGT_OP_CHSCALE_BWD, chscale_bwd, st, dx, dscale, dy, x, scale, n, c, hw, shared, l);
}

mgt_status mgt_channel_scale_backward(mgt_stream *s, float *dx, float *dscale, const float *dy,
                                      const float *x, const float *scale, int n, int c, int hw,
                                      bool shared)
{
    return mgt_channel_scale_backward_st(s, f32_store, dx, dscale, dy, x, scale, n, c, hw, shared,
                                         MGT_LAYOUT_NCHW);
}

mgt_status mgt_layernorm_channels_forward_st(mgt_stream *s, mgt_store st, float *y, const float *x,
                                             const float *weight, const float *bias, int n, int c,
                                             int hw, float eps, mgt_layout l)
{
    LAUNCH_ST(MGT_OP_LNC_FWD, lnc_fwd, st, y, x, weight, bias, n, c, hw, eps, l);
}

mgt_status mgt_layernorm_channels_forward(mgt_stream *s, float *y, const float *x,
                                          const float *weight, const float *bias, int n, int c,
                                          int hw, float eps)
{
    return mgt_layernorm_channels_forward_st(s, f32_store, y, x, weight, bias, n, c, hw, eps,
                                             MGT_LAYOUT_NCHW);
}

mgt_status mgt_layernorm_channels_backward_st(mgt_stream *s, mgt_store st, float *dx,
                                              float *dweight, float *dbias, const float *dy,
                                              const float *x, const float *weight, int n, int c,
                                              int hw, float eps, mgt_layout l)
{
    LAUNCH_ST(MGT_OP_LNC_BWD, lnc_bwd, st, dx, dweight, dbias, dy, x, weight, n, c, hw, eps, l);
}

mgt_status mgt_layernorm_channels_backward(mgt_stream *s, float *dx, float *dweight, float *dbias,
                                           const float *dy, const float *x, const float *weight,
                                           int n, int c, int hw, float eps)
{
    return mgt_layernorm_channels_backward_st(s, f32_store, dx, dweight, dbias, dy, x, weight, n, c,
                                              hw, eps, MGT_LAYOUT_NCHW);
}

mgt_status mgt_permute_st(mgt_stream *s, mgt_store st, float *walk, float *grid,
                          const mgt_permute_shape *sh)
{
    if (!sh)
        return bad_arg("permute", "no shape");
    LAUNCH_ST(MGT_OP_PERMUTE, permute, st, walk, grid, *sh);
}

mgt_status mgt_permute(mgt_stream *s, float *walk, float *grid, const mgt_permute_shape *sh)
{
    return mgt_permute_st(s, f32_store, walk, grid, sh);
}

mgt_status mgt_attention_forward_st(mgt_stream *s, mgt_store st, float *y, float *lse,
                                    const float *q, const float *k, const float *v,
                                    const float *bias, const float *mask, const float *logit_scale,
                                    const mgt_attn_shape *sh)
{
    if (!sh)
        return bad_arg("attention_forward", "no shape");
    LAUNCH_ST(MGT_OP_ATTN_FWD, attn_fwd, st, y, lse, q, k, v, bias, mask, logit_scale, *sh);
}

mgt_status mgt_attention_forward(mgt_stream *s, float *y, float *lse, const float *q,
                                 const float *k, const float *v, const float *bias,
                                 const float *mask, const float *logit_scale,
                                 const mgt_attn_shape *sh)
{
    return mgt_attention_forward_st(s, f32_store, y, lse, q, k, v, bias, mask, logit_scale, sh);
}

mgt_status mgt_attention_backward_st(mgt_stream *s, mgt_store st, const mgt_attn_grads *g,
                                     const float *dy, const float *y, const float *lse,
                                     const float *q, const float *k, const float *v,
                                     const float *bias, const float *mask, const float *logit_scale,
                                     const mgt_attn_shape *sh)
{
    if (!sh || !g)
        return bad_arg("attention_backward", "no shape or gradients");
    LAUNCH_ST(MGT_OP_ATTN_BWD, attn_bwd, st, g->dq, g->dk, g->dv, g->dbias, g->dlogit_scale, dy, y,
              lse, q, k, v, bias, mask, logit_scale, *sh);
}

mgt_status mgt_attention_backward(mgt_stream *s, const mgt_attn_grads *g, const float *dy,
                                  const float *y, const float *lse, const float *q, const float *k,
                                  const float *v, const float *bias, const float *mask,
                                  const float *logit_scale, const mgt_attn_shape *sh)
{
    return mgt_attention_backward_st(s, f32_store, g, dy, y, lse, q, k, v, bias, mask, logit_scale,
                                     sh);
}

mgt_status mgt_relpos_bias_forward(mgt_stream *s, float *bias, const float *table,
                                   const int32_t *index, int rows, int heads, int n, float alpha)
{
    LAUNCH(MGT_OP_RPB_FWD, rpb_fwd, bias, table, index, rows, heads, n, alpha);
}

mgt_status mgt_relpos_bias_backward(mgt_stream *s, float *dtable, const float *dbias,
                                    const int32_t *offsets, const int32_t *order, int rows,
                                    int heads, int n, float alpha)
{
    LAUNCH(MGT_OP_RPB_BWD, rpb_bwd, dtable, dbias, offsets, order, rows, heads, n, alpha);
}

mgt_status mgt_softmax_xent_forward(mgt_stream *s, float *loss, float *probs, const float *logits,
                                    const int32_t *labels, const int32_t *labels_b,
                                    const float *weights, int n, int classes, float smoothing)
{
    LAUNCH(MGT_OP_XENT_FWD, xent_fwd, loss, probs, logits, labels, labels_b, weights, n, classes,
           smoothing);
}

mgt_status mgt_softmax_xent_backward(mgt_stream *s, float *dlogits, const float *probs,
                                     const int32_t *labels, const int32_t *labels_b,
                                     const float *weights, int n, int classes, float smoothing,
                                     float scale)
{
    LAUNCH(MGT_OP_XENT_BWD, xent_bwd, dlogits, probs, labels, labels_b, weights, n, classes,
           smoothing, scale);
}

mgt_status mgt_topk_correct(mgt_stream *s, int32_t *count, const float *logits,
                            const int32_t *labels, int n, int classes, int k)
{
    LAUNCH(MGT_OP_TOPK, topk, count, logits, labels, n, classes, k);
}

mgt_status mgt_sgd_update(mgt_stream *s, float *param, float *momentum_buf, const float *grad,
                          size_t n, const mgt_sgd_params *p)
{
    if (!p)
        return bad_arg("sgd_update", "no parameters");
    LAUNCH(MGT_OP_SGD, sgd, param, momentum_buf, grad, n, *p);
}

mgt_status mgt_adamw_update(mgt_stream *s, float *param, float *exp_avg, float *exp_avg_sq,
                            const float *grad, size_t n, const mgt_adamw_params *p)
{
    if (!p)
        return bad_arg("adamw_update", "no parameters");
    LAUNCH(MGT_OP_ADAMW, adamw, param, exp_avg, exp_avg_sq, grad, n, *p);
}

mgt_status mgt_rmsprop_update(mgt_stream *s, float *param, float *square_avg, float *momentum_buf,
                              const float *grad, size_t n, const mgt_rmsprop_params *p)
{
    if (!p)
        return bad_arg("rmsprop_update", "no parameters");
    LAUNCH(MGT_OP_RMSPROP, rmsprop, param, square_avg, momentum_buf, grad, n, *p);
}
