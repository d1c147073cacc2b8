/* The C-compatible boundary between the CUDA backend's table (backend.c) and its CUDA C++ code. */
#ifndef MGT_DEVICE_CUDA_IMPL_H
#define MGT_DEVICE_CUDA_IMPL_H

/* Plain C types only: the .cu files cannot include backend.h, op.h or mgt/device.h (they pull
   in <stdatomic.h>, which C++17 does not have), so shapes travel as the mirror structs below
   and handles as opaque pointers. status.h is plain C and safe on both sides. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Inside the C linkage block: status.h has no guards of its own for C++. */
#include "mgt/status.h"

typedef struct mgt_cuda_set mgt_cuda_set;       /* one per devset: peers, algorithm cache */
typedef struct mgt_cuda_dev mgt_cuda_dev;       /* one per mgt_device (replica), not per GPU */
typedef struct mgt_cuda_stream mgt_cuda_stream; /* a cudaStream_t and its library handles */
typedef struct mgt_cuda_event mgt_cuda_event;

/* How the backend counts workspace it keeps against the device's limit (mgt_device_reserve
   behind it); owner is the mgt_device. */
typedef struct mgt_cuda_hooks {
    mgt_status (*reserve)(void *owner, size_t bytes, const char *what);
    void (*unreserve)(void *owner, size_t bytes);
} mgt_cuda_hooks;

/* Mirrors of mgt_conv2d_shape, mgt_pool2d_shape, mgt_bn_shape and mgt_sgd_params (same
   fields, same meaning; backend.c copies field by field). */
typedef struct mgt_cuda_conv {
    int n, c, h, w;
    int k, r, s;
    int stride_h, stride_w;
    int pad_h, pad_w;
    int groups;
} mgt_cuda_conv;

typedef struct mgt_cuda_pool {
    int n, c, h, w;
    int kh, kw;
    int stride_h, stride_w;
    int pad_h, pad_w;
} mgt_cuda_pool;

typedef struct mgt_cuda_bn {
    int n, c, hw;
    float eps, momentum;
} mgt_cuda_bn;

typedef struct mgt_cuda_sgd {
    float lr, momentum, dampening, weight_decay, grad_scale;
    int nesterov, first_step;
} mgt_cuda_sgd;

enum { MGT_CUDA_COPY_H2D, MGT_CUDA_COPY_D2H, MGT_CUDA_COPY_D2D };
enum { MGT_CUDA_CONV_FWD, MGT_CUDA_CONV_BWD_DATA, MGT_CUDA_CONV_BWD_FILTER };

/* ---- devices (runtime.cu) ---- */

/* GPUs the runtime sees; 0 when there is no driver or no GPU (never fails). */
int mgt_cuda_device_count(void);
/* The switches of mgt_devset_options that reach the CUDA backend (--no-p2p, --tf32,
   --deterministic); the environment variables MGT_NO_P2P, MGT_TF32 and MGT_DETERMINISTIC
   turn them on as well. */
typedef struct mgt_cuda_flags {
    bool no_p2p, tf32, deterministic;
} mgt_cuda_flags;

/* Opens n replicas on the GPUs `ids` (repeats allowed); owners[i] is handed to the hooks for
   replica i. Reads MGT_NO_P2P, MGT_TF32, MGT_DETERMINISTIC, MGT_CUDA_SYNC and
   MGT_CUDNN_WORKSPACE_MB from the environment. Verifies peer access between distinct GPUs. */
mgt_status mgt_cuda_set_open(const int *ids, int n, const mgt_cuda_flags *flags,
                             const mgt_cuda_hooks *hooks, void *const *owners, mgt_cuda_set **out);
/* Frees everything the set made (streams and events must be gone). NULL is a no-op. */
void mgt_cuda_set_close(mgt_cuda_set *set);
mgt_cuda_dev *mgt_cuda_set_dev(mgt_cuda_set *set, int i);
/* 1 when a copy from replica i to replica j may go directly (verified at open). */
int mgt_cuda_set_peer(const mgt_cuda_set *set, int i, int j);
/* The measured direct copy rate from replica i's GPU to j's in GB/s; 0 where not measured
   (same GPU, no peer access). Not yet reachable through the backend table. */
double mgt_cuda_set_peer_gbps(const mgt_cuda_set *set, int i, int j);
/* "NVIDIA H200 (gpu 0, pci 0000:19:00.0, 139.8 GiB)" and the memory this replica may use. */
void mgt_cuda_dev_describe(const mgt_cuda_dev *d, char *name, size_t cap, size_t *total_mem);
/* Polls every stream of the replica: *done = 1 when all are idle. */
mgt_status mgt_cuda_dev_query(mgt_cuda_dev *d, int *done);

/* ---- memory ---- */

mgt_status mgt_cuda_alloc(mgt_cuda_dev *d, size_t bytes, void **out);
/* Waits for the GPU's pending work, then keeps the block for reuse. */
void mgt_cuda_free(mgt_cuda_dev *d, void *ptr);
mgt_status mgt_cuda_host_alloc(mgt_cuda_dev *d, size_t bytes, void **out);
void mgt_cuda_host_free(mgt_cuda_dev *d, void *ptr);

/* ---- streams, events, copies ---- */

mgt_status mgt_cuda_stream_create(mgt_cuda_dev *d, mgt_cuda_stream **out);
void mgt_cuda_stream_destroy(mgt_cuda_stream *s);
/* *done = 1 when everything enqueued so far has run; then also reports a device error flag. */
mgt_status mgt_cuda_stream_query(mgt_cuda_stream *s, int *done);

mgt_status mgt_cuda_event_create(mgt_cuda_dev *d, mgt_cuda_event **out);
void mgt_cuda_event_destroy(mgt_cuda_event *e);
mgt_status mgt_cuda_event_record(mgt_cuda_event *e, mgt_cuda_stream *s);
mgt_status mgt_cuda_stream_wait_event(mgt_cuda_stream *s, mgt_cuda_event *e);
mgt_status mgt_cuda_event_query(mgt_cuda_event *e, int *done);
mgt_status mgt_cuda_event_elapsed(mgt_cuda_event *start, mgt_cuda_event *end, float *ms);

mgt_status mgt_cuda_memset(mgt_cuda_stream *s, void *dst, int value, size_t bytes);
mgt_status mgt_cuda_copy(mgt_cuda_stream *s, int kind, void *dst, const void *src, size_t bytes);
/* dst on s's replica, src on src_dev's replica; plain D2D when both sit on one GPU. */
mgt_status mgt_cuda_copy_peer(mgt_cuda_stream *s, void *dst, mgt_cuda_dev *src_dev, const void *src,
                              size_t bytes);

/* ---- own kernels (kernels.cu); semantics exactly those of mgt/device.h ---- */

mgt_status mgt_cuda_fill(mgt_cuda_stream *s, float *x, float value, size_t n);
mgt_status mgt_cuda_scale(mgt_cuda_stream *s, float *x, float alpha, size_t n);
mgt_status mgt_cuda_axpy(mgt_cuda_stream *s, float *y, float alpha, const float *x, size_t n);
mgt_status mgt_cuda_sum(mgt_cuda_stream *s, float *out, const float *x, size_t n);
mgt_status mgt_cuda_add(mgt_cuda_stream *s, float *y, const float *a, const float *b, size_t n);
mgt_status mgt_cuda_relu_forward(mgt_cuda_stream *s, float *y, const float *x, size_t n);
mgt_status mgt_cuda_relu_backward(mgt_cuda_stream *s, float *dx, const float *dy, const float *y,
                                  size_t n);
mgt_status mgt_cuda_maxpool_forward(mgt_cuda_stream *s, float *y, const float *x,
                                    const mgt_cuda_pool *sh);
mgt_status mgt_cuda_maxpool_backward(mgt_cuda_stream *s, float *dx, const float *dy, const float *x,
                                     const mgt_cuda_pool *sh);
mgt_status mgt_cuda_avgpool_forward(mgt_cuda_stream *s, float *y, const float *x, int n, int c,
                                    int hw);
mgt_status mgt_cuda_avgpool_backward(mgt_cuda_stream *s, float *dx, const float *dy, int n, int c,
                                     int hw);
mgt_status mgt_cuda_bias_forward(mgt_cuda_stream *s, float *y, const float *bias, int rows,
                                 int cols);
mgt_status mgt_cuda_bias_backward(mgt_cuda_stream *s, float *dbias, const float *dy, int rows,
                                  int cols);
mgt_status mgt_cuda_xent_forward(mgt_cuda_stream *s, float *loss, float *probs, const float *logits,
                                 const int32_t *labels, int n, int classes, float smoothing);
mgt_status mgt_cuda_xent_backward(mgt_cuda_stream *s, float *dlogits, const float *probs,
                                  const int32_t *labels, int n, int classes, float smoothing,
                                  float scale);
mgt_status mgt_cuda_topk(mgt_cuda_stream *s, int32_t *count, const float *logits,
                         const int32_t *labels, int n, int classes, int k);
mgt_status mgt_cuda_sgd_update(mgt_cuda_stream *s, float *param, float *momentum_buf,
                               const float *grad, size_t n, const mgt_cuda_sgd *p);

/* ---- library kernels (dnn.cu) ---- */

mgt_status mgt_cuda_gemm(mgt_cuda_stream *s, int trans_a, int trans_b, int m, int n, int k,
                         float alpha, const float *a, int lda, const float *b, int ldb, float beta,
                         float *c, int ldc);
/* dir MGT_CUDA_CONV_*: fwd out=y in1=x in2=w; bwd data out=dx in1=dy in2=w; bwd filter
   out=dw in1=dy in2=x (as mgt_op's conv arguments). out = conv + beta * out. */
mgt_status mgt_cuda_conv2d(mgt_cuda_stream *s, int dir, float *out, const float *in1,
                           const float *in2, const mgt_cuda_conv *sh, float beta);
mgt_status mgt_cuda_bn_forward_train(mgt_cuda_stream *s, float *y, float *save_mean,
                                     float *save_invstd, float *running_mean, float *running_var,
                                     const float *x, const float *gamma, const float *beta,
                                     const mgt_cuda_bn *sh);
mgt_status mgt_cuda_bn_forward_eval(mgt_cuda_stream *s, float *y, const float *x,
                                    const float *gamma, const float *beta,
                                    const float *running_mean, const float *running_var,
                                    const mgt_cuda_bn *sh);
mgt_status mgt_cuda_bn_backward(mgt_cuda_stream *s, float *dx, float *dgamma, float *dbeta,
                                const float *dy, const float *x, const float *gamma,
                                const float *save_mean, const float *save_invstd,
                                const mgt_cuda_bn *sh);

#ifdef __cplusplus
}
#endif

#endif
