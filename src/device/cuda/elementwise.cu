// The CUDA backend's elementwise kernels: fill, scale, axpy, add, relu, the sums, the
// optimizer updates (SGD, AdamW, RMSprop), the biases, strided copies, dropout, channel
// scaling, each with the exact semantics of mgt/device.h. The channel bias, dropout and the
// channel scale also take activations stored in 16 bits (mgt_op.store_in, store_out) and in
// NHWC, CUDA's layout under --amp: widened on load, fp32 arithmetic, rounded once on store,
// as the reference computes them (mgt_op_run_widened).
//
// Every kernel is deterministic: no floating-point atomics, and each reduction adds in an
// order fixed by the sizes alone, so two runs (and two replicas) give identical bits.
#include <cmath>
#include <cstdint>

#include "device/cuda/common.cuh"
#include "mgt/rng.h"

namespace {

// ---- element-wise: x, y, a, b are flat arrays of n floats ----

__global__ void k_fill(float *x, float value, size_t n)
{
    for (size_t i = thread_index(); i < n; i += thread_stride())
        x[i] = value;
}

__global__ void k_scale(float *x, float alpha, size_t n)
{
    for (size_t i = thread_index(); i < n; i += thread_stride())
        x[i] *= alpha;
}

__global__ void k_axpy(float *y, float alpha, const float *x, size_t n)
{
    for (size_t i = thread_index(); i < n; i += thread_stride())
        y[i] += alpha * x[i];
}

// y may alias a or b: each element is read before it is written, by the same thread.
__global__ void k_add(float *y, const float *a, const float *b, size_t n)
{
    for (size_t i = thread_index(); i < n; i += thread_stride())
        y[i] = a[i] + b[i];
}

// y may alias x. NaN stays NaN (as torch.relu): !(v <= 0) is true for v > 0 and for NaN.
__global__ void k_relu_fwd(float *y, const float *x, size_t n)
{
    for (size_t i = thread_index(); i < n; i += thread_stride()) {
        float v = x[i];
        y[i] = !(v <= 0.0f) ? v : 0.0f;
    }
}

// dx may alias dy; y is the forward's output.
__global__ void k_relu_bwd(float *dx, const float *dy, const float *y, size_t n)
{
    for (size_t i = thread_index(); i < n; i += thread_stride())
        dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

// ---- sum: x [n] -> out[0], in two passes through `partial` [gridDim of pass 1] ----

// Pass 1: thread t of block b adds x[i] for i = b*256 + t, then every grid stride, in
// double (the reference accumulates in double); the block then adds its 256 sums as a tree.
// With square, each x[i]^2 (in double) instead: sum_squares.
__global__ void k_sum_partial(double *partial, const float *x, size_t n, bool square)
{
    __shared__ double sh[kThreads];
    double acc = 0.0;
    for (size_t i = thread_index(); i < n; i += thread_stride())
        acc += square ? (double)x[i] * (double)x[i] : (double)x[i];
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w)
            sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        partial[blockIdx.x] = sh[0];
}

// Pass 2, one block: adds the `parts` partial sums the same way; out[0] = total / divisor.
__global__ void k_sum_final(float *out, const double *partial, int parts, double divisor)
{
    __shared__ double sh[kThreads];
    double acc = 0.0;
    for (int i = threadIdx.x; i < parts; i += kThreads)
        acc += partial[i];
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w)
            sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        out[0] = (float)(sh[0] / divisor);
}

// ---- linear bias: y, dy [rows][cols], bias, dbias [cols] ----

__global__ void k_bias_fwd(float *y, const float *bias, size_t total, int cols)
{
    for (size_t i = thread_index(); i < total; i += thread_stride())
        y[i] += bias[i % (size_t)cols];
}

// Block (32, 8): column j = blockIdx.x*32 + tx; row lane ty adds rows ty, ty+8, ...; the 8
// lane sums are then added in order 0..7 and accumulated into dbias[j].
__global__ void k_bias_bwd(float *dbias, const float *dy, int rows, int cols)
{
    __shared__ float sh[8][32];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int j = blockIdx.x * 32 + tx;
    float acc = 0.0f;
    if (j < cols)
        for (int r = ty; r < rows; r += 8)
            acc += dy[(size_t)r * cols + j];
    sh[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && j < cols) {
        float t = sh[0][tx];
        for (int k = 1; k < 8; k++)
            t += sh[k][tx];
        dbias[j] += t;
    }
}

// ---- SGD, PyTorch's: param, momentum_buf, grad [n] ----
//   d = s*g + wd*p
//   momentum != 0: buf = first ? d : m*buf + (1-dampening)*d;  d = nesterov ? d + m*buf : buf
//   p -= lr*d
// With momentum 0 the buffer is never read or written (it may be NULL).
__global__ void k_sgd(float *param, float *buf, const float *grad, size_t n, mgt_sgd_params p)
{
    for (size_t i = thread_index(); i < n; i += thread_stride()) {
        const float w = param[i];
        float d = p.grad_scale * grad[i] + p.weight_decay * w;
        if (p.momentum != 0.0f) {
            const float b = p.first_step ? d : p.momentum * buf[i] + (1.0f - p.dampening) * d;
            buf[i] = b;
            d = p.nesterov ? d + p.momentum * b : b;
        }
        param[i] = w - p.lr * d;
    }
}

// ---- AdamW and RMSprop, PyTorch 1.13's (mgt/device.h), in the reference's order ----
__global__ void k_adamw(float *param, float *m, float *v, const float *grad, size_t n,
                        mgt_adamw_params p)
{
    for (size_t i = thread_index(); i < n; i += thread_stride()) {
        const float g = __fmul_rn(p.grad_scale, grad[i]);
        const float w = __fmul_rn(param[i], p.decay);
        const float mi = __fadd_rn(__fmul_rn(m[i], p.beta1), __fmul_rn(1.0f - p.beta1, g));
        const float vi =
            __fadd_rn(__fmul_rn(v[i], p.beta2), __fmul_rn(1.0f - p.beta2, __fmul_rn(g, g)));
        m[i] = mi;
        v[i] = vi;
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), p.bc2_sqrt), p.eps);
        param[i] = __fadd_rn(w, __fmul_rn(-p.step_size, __fdiv_rn(mi, denom)));
    }
}

__global__ void k_rmsprop(float *param, float *sq, float *buf, const float *grad, size_t n,
                          mgt_rmsprop_params p)
{
    for (size_t i = thread_index(); i < n; i += thread_stride()) {
        const float g =
            __fadd_rn(__fmul_rn(p.grad_scale, grad[i]), __fmul_rn(p.weight_decay, param[i]));
        const float s2 =
            __fadd_rn(__fmul_rn(sq[i], p.alpha), __fmul_rn(1.0f - p.alpha, __fmul_rn(g, g)));
        sq[i] = s2;
        const float avg = __fadd_rn(__fsqrt_rn(s2), p.eps);
        if (p.momentum > 0.0f) {
            const float b = __fadd_rn(__fmul_rn(buf[i], p.momentum), __fdiv_rn(g, avg));
            buf[i] = b;
            param[i] = __fadd_rn(param[i], __fmul_rn(-p.lr, b));
        } else {
            param[i] = __fadd_rn(param[i], __fmul_rn(-p.lr, __fdiv_rn(g, avg)));
        }
    }
}

// ---- channel bias: y, dy [n, c, hw] in NCHW or NHWC, either storage; bias, dbias [c] ----

__global__ void k_chbias_fwd(void *y, const float *bias, size_t total, int c, int hw, bool nhwc,
                             mgt_sto sy)
{
    for (size_t i = thread_index(); i < total; i += thread_stride()) {
        const size_t ch = nhwc ? i % (size_t)c : (i / (size_t)hw) % (size_t)c;
        sto_st(y, i, sto_ld(y, i, sy) + bias[ch], sy);
    }
}

// NCHW: one block per channel: threads stride over the channel's n*hw values in a fixed order,
// then a fixed-shape tree in shared memory; accumulated into dbias[ch].
__global__ void k_chbias_bwd(float *dbias, const void *dy, int n, int c, int hw, mgt_sto sdy)
{
    __shared__ float sh[kThreads];
    const int ch = blockIdx.x;
    const size_t total = (size_t)n * hw;
    float acc = 0.0f;
    for (size_t k = threadIdx.x; k < total; k += blockDim.x) {
        size_t im = k / (size_t)hw, j = k % (size_t)hw;
        acc += sto_ld(dy, (im * c + ch) * hw + j, sdy);
    }
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w)
            sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        dbias[ch] += sh[0];
}

// NHWC: the row sums of common.cuh over dy, added onto dbias.
struct chbias_rows {
    const void *dy;
    int c;
    mgt_sto s;
    __device__ double2 operator()(size_t row, int ch) const
    {
        return make_double2(sto_ld(dy, row * c + ch, s), 0.0);
    }
};

struct add_sum_to {
    float *out;
    __device__ void operator()(size_t g, int ch, double2 v) const
    {
        (void)g;
        out[ch] = (float)(out[ch] + v.x);
    }
};

// ---- strided copy: one thread per element of the n * rows * count copied ----

__global__ void k_scopy(float *y, const float *x, size_t total, int rows, size_t count, size_t ys,
                        size_t yr, size_t xs, size_t xr)
{
    for (size_t e = thread_index(); e < total; e += thread_stride()) {
        const size_t k = e % count, q = e / count;
        const size_t r = q % (size_t)rows, im = q / (size_t)rows;
        y[im * ys + r * yr + k] = x[im * xs + r * xr + k];
    }
}

// ---- dropout: the mask of mgt_dropout_key, word for word ----

struct dropout_key {
    uint32_t k0, k1, step;
    unsigned long long sample0, stride;
    size_t per_image;
    uint32_t thr;
    float scale;
};

// Philox block blk of image im's mask: four 24-bit draws.
__device__ inline void dropout_words(const dropout_key &k, size_t im, size_t blk, uint32_t c[4])
{
    unsigned long long g = k.sample0 + (unsigned long long)im * k.stride;
    c[0] = (uint32_t)blk;
    c[1] = k.step;
    c[2] = (uint32_t)g;
    c[3] = ((uint32_t)(g >> 32) & 0x00FFFFFFu) | (6u << 24);
    mgt_philox10(c, k.k0, k.k1);
}

// NCHW: one thread per block of four elements (one Philox call each).
__global__ void k_dropout(void *y, const void *x, int n, dropout_key k, mgt_sto sx, mgt_sto sy)
{
    const size_t blocks_per_image = (k.per_image + 3) / 4;
    const size_t total = (size_t)n * blocks_per_image;
    for (size_t b = thread_index(); b < total; b += thread_stride()) {
        size_t im = b / blocks_per_image, blk = b % blocks_per_image;
        uint32_t c[4];
        dropout_words(k, im, blk, c);
        for (int q = 0; q < 4; q++) {
            size_t j = blk * 4 + q;
            if (j >= k.per_image)
                break;
            size_t e = im * k.per_image + j;
            sto_st(y, e, (c[q] >> 8) >= k.thr ? sto_ld(x, e, sx) * k.scale : 0.0f, sy);
        }
    }
}

// NHWC (c channels): one thread per element in memory order, which keeps the mask of its NCHW
// element (ch hw + pixel): one Philox call per element (four times NCHW's arithmetic, for
// coalesced loads and stores).
__global__ void k_dropout_nhwc(void *y, const void *x, int n, int c, dropout_key k, mgt_sto sx,
                               mgt_sto sy)
{
    const size_t hw = k.per_image / (size_t)c, total = (size_t)n * k.per_image;
    for (size_t e = thread_index(); e < total; e += thread_stride()) {
        const size_t im = e / k.per_image, r = e % k.per_image;
        const size_t j = (r % (size_t)c) * hw + r / (size_t)c;
        uint32_t w[4];
        dropout_words(k, im, j / 4, w);
        sto_st(y, e, (w[j % 4] >> 8) >= k.thr ? sto_ld(x, e, sx) * k.scale : 0.0f, sy);
    }
}

__global__ void k_chscale_fwd(void *y, const void *x, const float *scale, size_t total, int c,
                              int hw, bool shared, bool nhwc, mgt_sto sx, mgt_sto sy)
{
    for (size_t i = thread_index(); i < total; i += thread_stride()) {
        const size_t ch = nhwc ? i % (size_t)c : (i / (size_t)hw) % (size_t)c;
        const size_t im = i / ((size_t)c * hw);
        sto_st(y, i, sto_ld(x, i, sx) * scale[shared ? ch : im * c + ch], sy);
    }
}

// NCHW: one block per plane (image, channel), or with shared one per channel walking the
// images in order: dx = dy * scale, and the sum of dy * x in double, each thread's part then a
// fixed tree, written (per image) or added onto dscale (shared).
__global__ void k_chscale_bwd(void *dx, float *dscale, const void *dy, const void *x,
                              const float *scale, int n, int c, int hw, bool shared, mgt_sto si,
                              mgt_sto so)
{
    __shared__ double part[kThreads];
    const int b = blockIdx.x, t = threadIdx.x;
    const int images = shared ? n : 1;
    double acc = 0.0;
    for (int im = 0; im < images; im++) {
        size_t pl = shared ? (size_t)im * c + b : (size_t)b;
        float sc = scale[shared ? b : pl];
        const size_t base = pl * (size_t)hw;
        for (int e = t; e < hw; e += kThreads) {
            float g = sto_ld(dy, base + e, so);
            if (dscale)
                acc += (double)g * sto_ld(x, base + e, si);
            sto_st(dx, base + e, g * sc, si);
        }
    }
    if (!dscale)
        return;
    block_sum(part, acc);
    if (t == 0) {
        if (shared)
            dscale[b] = (float)(dscale[b] + part[0]);
        else
            dscale[b] = (float)part[0];
    }
}

// NHWC: the row sums of common.cuh (groups: the images, unless shared), writing dx on the way.
struct chscale_rows {
    void *dx;
    const void *dy, *x;
    const float *scale;
    int c, hw;
    bool shared, want;
    mgt_sto si, so;
    __device__ double2 operator()(size_t row, int ch) const
    {
        const size_t e = row * c + ch, im = row / (size_t)hw;
        const float g = sto_ld(dy, e, so);
        sto_st(dx, e, g * scale[shared ? (size_t)ch : im * c + ch], si);
        return make_double2(want ? (double)g * sto_ld(x, e, si) : 0.0, 0.0);
    }
};

struct chscale_done {
    float *dscale;
    int c;
    bool shared;
    __device__ void operator()(size_t g, int ch, double2 v) const
    {
        if (!dscale)
            return;
        if (shared)
            dscale[ch] = (float)(dscale[ch] + v.x);
        else
            dscale[g * c + ch] = (float)v.x;
    }
};

} // namespace

mgt_status cuda_fill(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.fill;
    k_fill<<<blocks_for(a.n), kThreads, 0, s->stream>>>(a.x, a.value, a.n);
    return MGT_CUDA_AFTER(s, "fill");
}

mgt_status cuda_scale(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.scale;
    k_scale<<<blocks_for(a.n), kThreads, 0, s->stream>>>(a.x, a.alpha, a.n);
    return MGT_CUDA_AFTER(s, "scale");
}

mgt_status cuda_axpy(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.axpy;
    k_axpy<<<blocks_for(a.n), kThreads, 0, s->stream>>>(a.y, a.alpha, a.x, a.n);
    return MGT_CUDA_AFTER(s, "axpy");
}

mgt_status cuda_sum(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.sum;
    // The block count depends on n alone, so the order of additions (and the result) is
    // the same on every GPU.
    unsigned parts = blocks_for(a.n);
    if (parts > 1024)
        parts = 1024;
    mgt_status st = mgt_cuda_scratch(s, parts * sizeof(double));
    if (st != MGT_OK)
        return st;
    double *partial = (double *)s->scratch;
    const bool square = op->kind == MGT_OP_SUMSQ;
    k_sum_partial<<<parts, kThreads, 0, s->stream>>>(partial, a.x, a.n, square);
    k_sum_final<<<1, kThreads, 0, s->stream>>>(a.out, partial, (int)parts, 1.0);
    return MGT_CUDA_AFTER(s, square ? "sum_squares" : "sum");
}

mgt_status cuda_add(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.add;
    k_add<<<blocks_for(a.n), kThreads, 0, s->stream>>>(a.y, a.a, a.b, a.n);
    return MGT_CUDA_AFTER(s, "add");
}

mgt_status cuda_relu_fwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.relu_fwd;
    k_relu_fwd<<<blocks_for(a.n), kThreads, 0, s->stream>>>(a.y, a.x, a.n);
    return MGT_CUDA_AFTER(s, "relu_forward");
}

mgt_status cuda_relu_bwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.relu_bwd;
    k_relu_bwd<<<blocks_for(a.n), kThreads, 0, s->stream>>>(a.dx, a.dy, a.y, a.n);
    return MGT_CUDA_AFTER(s, "relu_backward");
}

mgt_status cuda_bias_fwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.bias_fwd;
    size_t total = (size_t)a.rows * a.cols;
    k_bias_fwd<<<blocks_for(total), kThreads, 0, s->stream>>>(a.y, a.bias, total, a.cols);
    return MGT_CUDA_AFTER(s, "bias_forward");
}

mgt_status cuda_bias_bwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.bias_bwd;
    dim3 block(32, 8);
    unsigned grid = (unsigned)((a.cols + 31) / 32);
    k_bias_bwd<<<grid, block, 0, s->stream>>>(a.dbias, a.dy, a.rows, a.cols);
    return MGT_CUDA_AFTER(s, "bias_backward");
}

mgt_status cuda_chbias_fwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.chbias_fwd;
    size_t total = (size_t)a.n * a.c * a.hw;
    k_chbias_fwd<<<blocks_for(total), kThreads, 0, s->stream>>>(
        a.y, a.bias, total, a.c, a.hw, a.layout == MGT_LAYOUT_NHWC, mgt_sto_of(op->store_out));
    return MGT_CUDA_AFTER(s, "channel_bias_forward");
}

mgt_status cuda_chbias_bwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.chbias_bwd;
    const mgt_sto so = mgt_sto_of(op->store_out);
    if (a.layout == MGT_LAYOUT_NHWC) {
        mgt_status st = mgt_cuda_row_sums(s, (size_t)a.n * a.hw, a.c, 1, chbias_rows{a.dy, a.c, so},
                                          add_sum_to{a.dbias});
        if (st != MGT_OK)
            return st;
    } else {
        k_chbias_bwd<<<(unsigned)a.c, kThreads, 0, s->stream>>>(a.dbias, a.dy, a.n, a.c, a.hw, so);
    }
    return MGT_CUDA_AFTER(s, "channel_bias_backward");
}

mgt_status cuda_scopy(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.scopy;
    size_t total = (size_t)a.n * a.rows * a.count;
    k_scopy<<<blocks_for(total), kThreads, 0, s->stream>>>(
        a.y, a.x, total, a.rows, a.count, a.y_stride, a.y_row, a.x_stride, a.x_row);
    return MGT_CUDA_AFTER(s, "strided_copy");
}

mgt_status cuda_dropout(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.dropout;
    static_assert(MGT_RNG_DROPOUT == 6, "k_dropout's purpose word");
    dropout_key k;
    k.k0 = (uint32_t)a.seed;
    k.k1 = (uint32_t)(a.seed >> 32) ^ (a.stream * 0x9E3779B9u);
    k.step = (uint32_t)a.step;
    k.sample0 = a.sample0;
    k.stride = a.sample_stride;
    k.per_image = a.per_image;
    k.thr = mgt_dropout_threshold(a.p);
    k.scale = 1.0f / (1.0f - a.p);
    const mgt_sto sx = mgt_sto_of(op->store_in), sy = mgt_sto_of(op->store_out);
    if (a.layout == MGT_LAYOUT_NHWC)
        k_dropout_nhwc<<<blocks_for((size_t)a.n * a.per_image), kThreads, 0, s->stream>>>(
            a.y, a.x, a.n, a.c, k, sx, sy);
    else
        k_dropout<<<blocks_for((size_t)a.n * ((a.per_image + 3) / 4)), kThreads, 0, s->stream>>>(
            a.y, a.x, a.n, k, sx, sy);
    return MGT_CUDA_AFTER(s, "dropout");
}

mgt_status cuda_sgd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.sgd;
    k_sgd<<<blocks_for(a.n), kThreads, 0, s->stream>>>(a.param, a.momentum_buf, a.grad, a.n, a.p);
    return MGT_CUDA_AFTER(s, "sgd_update");
}

mgt_status cuda_adamw(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.adamw;
    k_adamw<<<blocks_for(a.n), kThreads, 0, s->stream>>>(a.param, a.exp_avg, a.exp_avg_sq, a.grad,
                                                         a.n, a.p);
    return MGT_CUDA_AFTER(s, "adamw_update");
}

mgt_status cuda_rmsprop(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.rmsprop;
    k_rmsprop<<<blocks_for(a.n), kThreads, 0, s->stream>>>(a.param, a.square_avg, a.momentum_buf,
                                                           a.grad, a.n, a.p);
    return MGT_CUDA_AFTER(s, "rmsprop_update");
}

mgt_status cuda_chscale_fwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.chscale_fwd;
    size_t total = (size_t)a.n * a.c * a.hw;
    k_chscale_fwd<<<blocks_for(total), kThreads, 0, s->stream>>>(
        a.y, a.x, a.scale, total, a.c, a.hw, a.shared, a.layout == MGT_LAYOUT_NHWC,
        mgt_sto_of(op->store_in), mgt_sto_of(op->store_out));
    return MGT_CUDA_AFTER(s, "channel_scale_forward");
}

mgt_status cuda_chscale_bwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.chscale_bwd;
    const mgt_sto si = mgt_sto_of(op->store_in), so = mgt_sto_of(op->store_out);
    if (a.layout == MGT_LAYOUT_NHWC) {
        const int groups = a.shared ? 1 : a.n;
        const size_t rows = (size_t)a.n * a.hw / (size_t)groups;
        chscale_rows f = {a.dx, a.dy, a.x, a.scale, a.c, a.hw, a.shared, a.dscale != NULL, si, so};
        mgt_status st =
            mgt_cuda_row_sums(s, rows, a.c, groups, f, chscale_done{a.dscale, a.c, a.shared});
        if (st != MGT_OK)
            return st;
        return MGT_CUDA_AFTER(s, "channel_scale_backward");
    }
    unsigned grid = (unsigned)(a.shared ? a.c : a.n * a.c);
    k_chscale_bwd<<<grid, kThreads, 0, s->stream>>>(a.dx, a.dscale, a.dy, a.x, a.scale, a.n, a.c,
                                                    a.hw, a.shared, si, so);
    return MGT_CUDA_AFTER(s, "channel_scale_backward");
}
