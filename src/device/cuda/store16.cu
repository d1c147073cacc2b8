// The CUDA backend's kernels for activations stored in 16 bits (mgt_op.store_in, store_out),
// NHWC (channels last, what cuDNN's tensor cores take: the layout a CUDA model keeps under
// --amp) or NCHW: ReLU, add, copies of channel slices, max pooling, the global and the
// adaptive average pool, batch norm with its folded ReLU, and the relayout that the
// convolutions' edges use where a value is not NHWC 16-bit (the model's input). The channel
// bias and scale, dropout and the layer norm over channels are elementwise.cu's and norm.cu's
// kernels, which take either storage.
//
// Every kernel widens its 16-bit loads, computes and accumulates in fp32 (batch norm's
// statistics and the adaptive pool's windows in double, as the reference) and rounds each
// 16-bit store once, as the reference does around its fp32 loops (mgt_op_run_widened). One pass over memory per kernel, indexed so that
// neighbouring threads touch neighbouring elements in NHWC (the channel varies fastest);
// no floating-point atomics, every sum in an order fixed by the sizes alone.
#include <cmath>

#include "device/cuda/common.cuh"

namespace {

// ---- elementwise ----

// NaN stays NaN (as torch.relu): !(v <= 0) is true for v > 0 and for NaN. y may alias x.
__global__ void k_relu_fwd(void *y, const void *x, size_t n, mgt_sto si, mgt_sto so)
{
    for (size_t i = thread_index(); i < n; i += thread_stride()) {
        float v = sto_ld(x, i, si);
        sto_st(y, i, !(v <= 0.0f) ? v : 0.0f, so);
    }
}

// dx (stored as x) may alias dy; y is the forward's output (stored as dy).
__global__ void k_relu_bwd(void *dx, const void *dy, const void *y, size_t n, mgt_sto si,
                           mgt_sto so)
{
    for (size_t i = thread_index(); i < n; i += thread_stride())
        sto_st(dx, i, sto_ld(y, i, so) > 0.0f ? sto_ld(dy, i, so) : 0.0f, si);
}

__global__ void k_add(void *y, const void *a, const void *b, size_t n, mgt_sto si, mgt_sto so)
{
    for (size_t i = thread_index(); i < n; i += thread_stride())
        sto_st(y, i, sto_ld(a, i, si) + sto_ld(b, i, si), so);
}

// The strided copy of 16-bit codes as they are (both sides share the storage).
__global__ void k_scopy16(uint16_t *y, const uint16_t *x, size_t total, int rows, size_t count,
                          size_t ys, size_t yr, size_t xs, size_t xr)
{
    for (size_t e = thread_index(); e < total; e += thread_stride()) {
        size_t k = e % count, r = (e / count) % (size_t)rows, i = e / (count * (size_t)rows);
        y[i * ys + r * yr + k] = x[i * xs + r * xr + k];
    }
}

// ---- max pooling (torch's MaxPool2d, -inf padding), NCHW or NHWC ----

struct pool16 {
    int n, c, h, w, p, q, kh, kw, sh, sw, ph, pw;
    bool nhwc;
};

// The window's first maximum (window_first_max) over plane (ni, ci) of a 16-bit or fp32
// activation in NCHW or NHWC.
__device__ inline int window_argmax16(const void *x, mgt_sto sx, int ni, int ci, int oh, int ow,
                                      const pool16 &d)
{
    return window_first_max(
        oh, ow, d, [&](int i) { return sto_ld(x, lay_at(d.nhwc, d.c, d.h * d.w, ni, ci, i), sx); });
}

// Element e of a [n, c, hw] tensor in memory order: its image, channel and pixel.
__device__ inline void unravel(size_t e, bool nhwc, int c, int hw, int *ni, int *ci, int *pi)
{
    if (nhwc) {
        *ci = (int)(e % (size_t)c);
        *pi = (int)((e / (size_t)c) % (size_t)hw);
        *ni = (int)(e / ((size_t)c * hw));
    } else {
        *pi = (int)(e % (size_t)hw);
        *ci = (int)((e / (size_t)hw) % (size_t)c);
        *ni = (int)(e / ((size_t)c * hw));
    }
}

__global__ void k_maxpool_fwd16(void *y, const void *x, pool16 d, mgt_sto si, mgt_sto so)
{
    const size_t total = (size_t)d.n * d.c * d.p * d.q;
    for (size_t o = thread_index(); o < total; o += thread_stride()) {
        int ni, ci, pi;
        unravel(o, d.nhwc, d.c, d.p * d.q, &ni, &ci, &pi);
        const int arg = window_argmax16(x, si, ni, ci, pi / d.q, pi % d.q, d);
        // the value itself, widened and rounded back: the same code where both are 16-bit
        sto_st(y, o,
               arg >= 0 ? sto_ld(x, lay_at(d.nhwc, d.c, d.h * d.w, ni, ci, arg), si) : -INFINITY,
               so);
    }
}

// Gather form, one thread per input element: the windows that contain it, in raster order,
// adding dy of those whose argmax it is (the fp32 kernel's order).
__global__ void k_maxpool_bwd16(void *dx, const void *dy, const void *x, pool16 d, mgt_sto si,
                                mgt_sto so)
{
    const size_t total = (size_t)d.n * d.c * d.h * d.w;
    for (size_t e = thread_index(); e < total; e += thread_stride()) {
        int ni, ci, pi;
        unravel(e, d.nhwc, d.c, d.h * d.w, &ni, &ci, &pi);
        const int ih = pi / d.w, iw = pi % d.w;
        int oh_lo, oh_hi, ow_lo, ow_hi;
        pool_outputs_over(ih, d.kh, d.sh, d.ph, d.p, &oh_lo, &oh_hi);
        pool_outputs_over(iw, d.kw, d.sw, d.pw, d.q, &ow_lo, &ow_hi);
        float acc = 0.0f;
        for (int oh = oh_lo; oh <= oh_hi; oh++)
            for (int ow = ow_lo; ow <= ow_hi; ow++)
                if (window_argmax16(x, si, ni, ci, oh, ow, d) == pi)
                    acc += sto_ld(dy, lay_at(d.nhwc, d.c, d.p * d.q, ni, ci, oh * d.q + ow), so);
        sto_st(dx, e, acc, si);
    }
}

// ---- global average pool: x [n, c, hw] <-> y [n, c] ----

// One thread per (image, channel), adjacent threads on adjacent channels (coalesced in NHWC);
// the sum in pixel order, as the fp32 kernel's lanes would not: within fp32's tolerance.
__global__ void k_gap_fwd16(void *y, const void *x, int n, int c, int hw, bool nhwc, mgt_sto si,
                            mgt_sto so)
{
    const size_t total = (size_t)n * c;
    for (size_t o = thread_index(); o < total; o += thread_stride()) {
        const int ni = (int)(o / (size_t)c), ci = (int)(o % (size_t)c);
        float acc = 0.0f;
        for (int i = 0; i < hw; i++)
            acc += sto_ld(x, lay_at(nhwc, c, hw, ni, ci, i), si);
        sto_st(y, o, acc / (float)hw, so);
    }
}

__global__ void k_gap_bwd16(void *dx, const void *dy, int n, int c, int hw, bool nhwc, mgt_sto si,
                            mgt_sto so)
{
    const size_t total = (size_t)n * c * hw;
    for (size_t e = thread_index(); e < total; e += thread_stride()) {
        int ni, ci, pi;
        unravel(e, nhwc, c, hw, &ni, &ci, &pi);
        sto_st(dx, e, sto_ld(dy, (size_t)ni * c + ci, so) / (float)hw, si);
    }
}

// ---- adaptive average pool (torch's AdaptiveAvgPool2d), NCHW or NHWC ----

__device__ inline void apool_range16(int i, int in, int out, int *lo, int *hi)
{
    *lo = (int)((long long)i * in / out);
    *hi = (int)(((long long)(i + 1) * in + out - 1) / out);
}

struct apool16 {
    int n, c, h, w, oh, ow;
    bool nhwc;
};

// One thread per output element in memory order (adjacent threads on adjacent channels in
// NHWC); the window summed in double in raster order, divided, then rounded to fp32 and to
// the storage: the reference's rounding points.
__global__ void k_apool_fwd16(void *y, const void *x, apool16 d, mgt_sto si, mgt_sto so)
{
    const size_t total = (size_t)d.n * d.c * d.oh * d.ow;
    for (size_t o = thread_index(); o < total; o += thread_stride()) {
        int ni, ci, pi;
        unravel(o, d.nhwc, d.c, d.oh * d.ow, &ni, &ci, &pi);
        int y0, y1, x0, x1;
        apool_range16(pi / d.ow, d.h, d.oh, &y0, &y1);
        apool_range16(pi % d.ow, d.w, d.ow, &x0, &x1);
        double s = 0.0;
        for (int yy = y0; yy < y1; yy++)
            for (int xx = x0; xx < x1; xx++)
                s += sto_ld(x, lay_at(d.nhwc, d.c, d.h * d.w, ni, ci, yy * d.w + xx), si);
        sto_st(y, o, (float)(s / (double)((y1 - y0) * (x1 - x0))), so);
    }
}

// Gather form, one thread per input element: the windows that hold it in raster order, each
// adding its dy / area in fp32, as the reference's scatter adds them.
__global__ void k_apool_bwd16(void *dx, const void *dy, apool16 d, mgt_sto si, mgt_sto so)
{
    const size_t total = (size_t)d.n * d.c * d.h * d.w;
    for (size_t e = thread_index(); e < total; e += thread_stride()) {
        int ni, ci, pi;
        unravel(e, d.nhwc, d.c, d.h * d.w, &ni, &ci, &pi);
        const int iy = pi / d.w, ix = pi % d.w;
        float acc = 0.0f;
        for (int i = 0; i < d.oh; i++) {
            int y0, y1;
            apool_range16(i, d.h, d.oh, &y0, &y1);
            if (iy < y0 || iy >= y1)
                continue;
            for (int j = 0; j < d.ow; j++) {
                int x0, x1;
                apool_range16(j, d.w, d.ow, &x0, &x1);
                if (ix >= x0 && ix < x1)
                    acc += sto_ld(dy, lay_at(d.nhwc, d.c, d.oh * d.ow, ni, ci, i * d.ow + j), so) /
                           (float)((y1 - y0) * (x1 - x0));
            }
        }
        sto_st(dx, e, acc, si);
    }
}

// ---- batch norm over [n, c, hw] (statistics per channel over n*hw values) ----
//
// Three launches each way: per-chunk partial sums (thread (chunk, channel) walks its rows of
// the channel: coalesced across channels in NHWC), a per-channel finish over the chunks in a
// fixed order (double), and the elementwise pass. Forward training reads x twice and writes
// y once; backward reads dy, x (and y for a folded ReLU) twice and writes dx once.

struct bn16 {
    int n, c, hw;
    bool nhwc;
    int chunks; // row chunks of the partial sums
};

__device__ inline size_t bn_index(const bn16 &d, size_t row, int ci)
{
    const int ni = (int)(row / (size_t)d.hw), pi = (int)(row % (size_t)d.hw);
    return lay_at(d.nhwc, d.c, d.hw, ni, ci, pi);
}

// partial[chunk][c] = {sum x, sum x^2} over the chunk's rows
__global__ void k_bn_partial(double2 *partial, const void *x, bn16 d, mgt_sto sx)
{
    const size_t rows = (size_t)d.n * d.hw, per = (rows + d.chunks - 1) / d.chunks;
    const size_t total = (size_t)d.chunks * d.c;
    for (size_t t = thread_index(); t < total; t += thread_stride()) {
        const int ci = (int)(t % (size_t)d.c);
        const size_t k = t / (size_t)d.c, r0 = k * per, r1 = r0 + per < rows ? r0 + per : rows;
        double s = 0.0, ss = 0.0;
        for (size_t r = r0; r < r1; r++) {
            const double v = sto_ld(x, bn_index(d, r, ci), sx);
            s += v;
            ss += v * v;
        }
        partial[t] = make_double2(s, ss);
    }
}

// Per channel: the batch's mean and biased variance, the saved mean and inverse std, the
// running estimates (the unbiased variance), as cuDNN's SPATIAL mode and the reference.
__global__ void k_bn_finish(float *save_mean, float *save_invstd, float *running_mean,
                            float *running_var, const double2 *partial, bn16 d, float eps,
                            float momentum)
{
    const double m = (double)d.n * d.hw;
    for (size_t ci = thread_index(); ci < (size_t)d.c; ci += thread_stride()) {
        double s = 0.0, ss = 0.0;
        for (int k = 0; k < d.chunks; k++) {
            s += partial[(size_t)k * d.c + ci].x;
            ss += partial[(size_t)k * d.c + ci].y;
        }
        const double mean = s / m;
        double var = ss / m - mean * mean;
        if (var < 0.0)
            var = 0.0;
        save_mean[ci] = (float)mean;
        save_invstd[ci] = (float)(1.0 / sqrt(var + (double)eps));
        running_mean[ci] = (float)((1.0 - momentum) * running_mean[ci] + momentum * mean);
        running_var[ci] =
            (float)((1.0 - momentum) * running_var[ci] + momentum * var * m / (m - 1.0));
    }
}

// y = gamma (x - mean) invstd + beta, the folded ReLU after, rounded once. eval: mean and
// invstd from the running estimates. A fused residual add (z, stored as y; z may be y): the
// normalised value rounded to zr as the unfused batch norm stored it, z added, then the ReLU
// and the rounding of the add's output: the unfused ops' bits in one pass.
__global__ void k_bn_apply(void *y, const void *x, const float *gamma, const float *beta,
                           const float *mean, const float *invstd_or_var, bool from_var, float eps,
                           bool relu, bn16 d, mgt_sto si, mgt_sto so, const void *z,
                           mgt_precision zr)
{
    const size_t total = (size_t)d.n * d.c * d.hw;
    for (size_t e = thread_index(); e < total; e += thread_stride()) {
        int ni, ci, pi;
        unravel(e, d.nhwc, d.c, d.hw, &ni, &ci, &pi);
        const float is = from_var ? (float)(1.0 / sqrt((double)invstd_or_var[ci] + (double)eps))
                                  : invstd_or_var[ci];
        float v = gamma[ci] * ((sto_ld(x, e, si) - mean[ci]) * is) + beta[ci];
        if (z)
            v = mgt_lowp_round(zr, v) + sto_ld(z, e, so);
        if (relu && !(v > 0.0f || isnan(v)))
            v = 0.0f;
        sto_st(y, e, v, so);
    }
}

// partial[chunk][c] = {sum dy', sum dy' xhat}, dy' = dy masked by the folded ReLU's output
__global__ void k_bn_bwd_partial(double2 *partial, const void *dy, const void *y, const void *x,
                                 const float *mean, const float *invstd, bool relu, bn16 d,
                                 mgt_sto si, mgt_sto so)
{
    const size_t rows = (size_t)d.n * d.hw, per = (rows + d.chunks - 1) / d.chunks;
    const size_t total = (size_t)d.chunks * d.c;
    for (size_t t = thread_index(); t < total; t += thread_stride()) {
        const int ci = (int)(t % (size_t)d.c);
        const size_t k = t / (size_t)d.c, r0 = k * per, r1 = r0 + per < rows ? r0 + per : rows;
        const double mu = mean[ci], is = invstd[ci];
        double s = 0.0, sx = 0.0;
        for (size_t r = r0; r < r1; r++) {
            const size_t j = bn_index(d, r, ci);
            const double g = relu && !(sto_ld(y, j, so) > 0.0f) ? 0.0 : (double)sto_ld(dy, j, so);
            s += g;
            sx += g * (((double)sto_ld(x, j, si) - mu) * is);
        }
        partial[t] = make_double2(s, sx);
    }
}

// sums[c] = the batch's {sum dy', sum dy' xhat}; dgamma and dbeta accumulate them.
__global__ void k_bn_bwd_finish(double2 *sums, float *dgamma, float *dbeta, const double2 *partial,
                                bn16 d)
{
    for (size_t ci = thread_index(); ci < (size_t)d.c; ci += thread_stride()) {
        double s = 0.0, sx = 0.0;
        for (int k = 0; k < d.chunks; k++) {
            s += partial[(size_t)k * d.c + ci].x;
            sx += partial[(size_t)k * d.c + ci].y;
        }
        sums[ci] = make_double2(s, sx);
        dgamma[ci] = (float)(dgamma[ci] + sx);
        dbeta[ci] = (float)(dbeta[ci] + s);
    }
}

// dx = gamma invstd / m (m dy' - sum dy' - xhat sum dy' xhat), rounded once; a fused residual
// add's gradient dz = dy' (exact: dy or 0), written after dy is read (dz may be dy).
__global__ void k_bn_bwd_apply(void *dx, const void *dy, const void *y, const void *x,
                               const float *gamma, const float *mean, const float *invstd,
                               const double2 *sums, bool relu, bn16 d, mgt_sto si, mgt_sto so,
                               void *dz)
{
    const size_t total = (size_t)d.n * d.c * d.hw;
    const double m = (double)d.n * d.hw;
    for (size_t e = thread_index(); e < total; e += thread_stride()) {
        int ni, ci, pi;
        unravel(e, d.nhwc, d.c, d.hw, &ni, &ci, &pi);
        const double is = invstd[ci];
        const double g = relu && !(sto_ld(y, e, so) > 0.0f) ? 0.0 : (double)sto_ld(dy, e, so);
        const double xhat = ((double)sto_ld(x, e, si) - mean[ci]) * is;
        sto_st(dx, e, (float)(gamma[ci] * is / m * (m * g - sums[ci].x - xhat * sums[ci].y)), si);
        if (dz)
            sto_st(dz, e, (float)g, so);
    }
}

// ---- relayout: [n, c, hw] between NCHW and NHWC and between storages ----

const int kTile = 32;

// Block (32, 8) per 32x32 tile of image blockIdx.z's [c][hw] plane: loaded along the
// source's fastest dimension, stored along the destination's, both coalesced.
__global__ void k_relayout(void *dst, bool dst_nhwc, mgt_sto sd, const void *src, bool src_nhwc,
                           mgt_sto ss, int c, int hw, float beta)
{
    __shared__ float tile[kTile][kTile + 1]; // [channel][pixel] of the tile
    const int ni = blockIdx.z;
    const int c0 = blockIdx.y * kTile, p0 = blockIdx.x * kTile;
    for (int k = threadIdx.y; k < kTile; k += blockDim.y) {
        // src_nhwc: the lanes walk channels; else pixels
        const int ci = c0 + (src_nhwc ? (int)threadIdx.x : k);
        const int pi = p0 + (src_nhwc ? k : (int)threadIdx.x);
        if (ci < c && pi < hw)
            tile[ci - c0][pi - p0] = sto_ld(src, lay_at(src_nhwc, c, hw, ni, ci, pi), ss);
    }
    __syncthreads();
    for (int k = threadIdx.y; k < kTile; k += blockDim.y) {
        const int ci = c0 + (dst_nhwc ? (int)threadIdx.x : k);
        const int pi = p0 + (dst_nhwc ? k : (int)threadIdx.x);
        if (ci < c && pi < hw) {
            const size_t at = lay_at(dst_nhwc, c, hw, ni, ci, pi);
            float v = tile[ci - c0][pi - p0];
            if (beta != 0.0f)
                v = __fadd_rn(v, __fmul_rn(beta, sto_ld(dst, at, sd)));
            sto_st(dst, at, v, sd);
        }
    }
}

// ---- launchers ----

// Row chunks of batch norm's partial sums (mgt_cuda_row_chunks: device/bytes.c counts the
// same).
int bn_chunks(size_t rows, int c) { return mgt_cuda_row_chunks(rows, (size_t)c); }

mgt_status bn_train16(mgt_cuda_stream *s, const mgt_op *op, mgt_sto si, mgt_sto so)
{
    const auto &b = op->u.bn_train;
    bn16 d = {b.sh.n, b.sh.c, b.sh.hw, b.sh.layout == MGT_LAYOUT_NHWC, 0};
    d.chunks = bn_chunks((size_t)d.n * d.hw, d.c);
    mgt_status st = mgt_cuda_scratch(s, (size_t)d.chunks * d.c * sizeof(double2));
    if (st != MGT_OK)
        return st;
    double2 *partial = (double2 *)s->scratch;
    k_bn_partial<<<blocks_for((size_t)d.chunks * d.c), kThreads, 0, s->stream>>>(partial, b.x, d,
                                                                                 si);
    k_bn_finish<<<blocks_for((size_t)d.c), kThreads, 0, s->stream>>>(
        b.save_mean, b.save_invstd, b.running_mean, b.running_var, partial, d, b.sh.eps,
        b.sh.momentum);
    k_bn_apply<<<blocks_for((size_t)d.n * d.c * d.hw), kThreads, 0, s->stream>>>(
        b.y, b.x, b.gamma, b.beta, b.save_mean, b.save_invstd, false, b.sh.eps, b.sh.relu, d, si,
        so, b.z, b.z_round);
    return MGT_CUDA_AFTER(s, "batchnorm_forward_train");
}

mgt_status bn_eval16(mgt_cuda_stream *s, const mgt_op *op, mgt_sto si, mgt_sto so)
{
    const auto &b = op->u.bn_eval;
    bn16 d = {b.sh.n, b.sh.c, b.sh.hw, b.sh.layout == MGT_LAYOUT_NHWC, 1};
    k_bn_apply<<<blocks_for((size_t)d.n * d.c * d.hw), kThreads, 0, s->stream>>>(
        b.y, b.x, b.gamma, b.beta, b.running_mean, b.running_var, true, b.sh.eps, b.sh.relu, d, si,
        so, b.z, b.z_round);
    return MGT_CUDA_AFTER(s, "batchnorm_forward_eval");
}

mgt_status bn_bwd16(mgt_cuda_stream *s, const mgt_op *op, mgt_sto si, mgt_sto so)
{
    const auto &b = op->u.bn_bwd;
    bn16 d = {b.sh.n, b.sh.c, b.sh.hw, b.sh.layout == MGT_LAYOUT_NHWC, 0};
    d.chunks = bn_chunks((size_t)d.n * d.hw, d.c);
    const size_t pbytes = mgt_cuda_align256((size_t)d.chunks * d.c * sizeof(double2));
    mgt_status st = mgt_cuda_scratch(s, pbytes + (size_t)d.c * sizeof(double2));
    if (st != MGT_OK)
        return st;
    double2 *partial = (double2 *)s->scratch, *sums = (double2 *)((char *)s->scratch + pbytes);
    k_bn_bwd_partial<<<blocks_for((size_t)d.chunks * d.c), kThreads, 0, s->stream>>>(
        partial, b.dy, b.y, b.x, b.save_mean, b.save_invstd, b.sh.relu, d, si, so);
    k_bn_bwd_finish<<<blocks_for((size_t)d.c), kThreads, 0, s->stream>>>(sums, b.dgamma, b.dbeta,
                                                                         partial, d);
    k_bn_bwd_apply<<<blocks_for((size_t)d.n * d.c * d.hw), kThreads, 0, s->stream>>>(
        b.dx, b.dy, b.y, b.x, b.gamma, b.save_mean, b.save_invstd, sums, b.sh.relu, d, si, so,
        b.dz);
    return MGT_CUDA_AFTER(s, "batchnorm_backward");
}

pool16 pool16_of(const mgt_pool2d_shape *sh)
{
    return pool16{sh->n,
                  sh->c,
                  sh->h,
                  sh->w,
                  mgt_pool2d_out_h(sh),
                  mgt_pool2d_out_w(sh),
                  sh->kh,
                  sh->kw,
                  sh->stride_h,
                  sh->stride_w,
                  sh->pad_h,
                  sh->pad_w,
                  sh->layout == MGT_LAYOUT_NHWC};
}

} // namespace

mgt_status mgt_cuda_relayout(mgt_cuda_stream *s, void *dst, bool dst_nhwc, mgt_sto dst_sto,
                             const void *src, bool src_nhwc, mgt_sto src_sto, int n, int c, int hw,
                             float beta)
{
    dim3 grid((unsigned)((hw + kTile - 1) / kTile), (unsigned)((c + kTile - 1) / kTile),
              (unsigned)n);
    k_relayout<<<grid, dim3(kTile, 8), 0, s->stream>>>(dst, dst_nhwc, dst_sto, src, src_nhwc,
                                                       src_sto, c, hw, beta);
    return MGT_CUDA_AFTER(s, "relayout");
}

mgt_status mgt_cuda_store16(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const mgt_sto si = mgt_sto_of(op->store_in), so = mgt_sto_of(op->store_out);
    switch (op->kind) {
    case MGT_OP_RELU_FWD: {
        const auto &a = op->u.relu_fwd;
        k_relu_fwd<<<blocks_for(a.n), kThreads, 0, s->stream>>>(a.y, a.x, a.n, si, so);
        return MGT_CUDA_AFTER(s, "relu_forward");
    }
    case MGT_OP_RELU_BWD: {
        const auto &a = op->u.relu_bwd;
        k_relu_bwd<<<blocks_for(a.n), kThreads, 0, s->stream>>>(a.dx, a.dy, a.y, a.n, si, so);
        return MGT_CUDA_AFTER(s, "relu_backward");
    }
    case MGT_OP_ADD: {
        const auto &a = op->u.add;
        k_add<<<blocks_for(a.n), kThreads, 0, s->stream>>>(a.y, a.a, a.b, a.n, si, so);
        return MGT_CUDA_AFTER(s, "add");
    }
    case MGT_OP_STRIDED_COPY: {
        const auto &a = op->u.scopy;
        size_t total = (size_t)a.n * a.rows * a.count;
        k_scopy16<<<blocks_for(total), kThreads, 0, s->stream>>>(
            (uint16_t *)a.y, (const uint16_t *)a.x, total, a.rows, a.count, a.y_stride, a.y_row,
            a.x_stride, a.x_row);
        return MGT_CUDA_AFTER(s, "strided_copy");
    }
    case MGT_OP_MAXPOOL_FWD: {
        const auto &a = op->u.maxpool_fwd;
        pool16 d = pool16_of(&a.sh);
        k_maxpool_fwd16<<<blocks_for((size_t)d.n * d.c * d.p * d.q), kThreads, 0, s->stream>>>(
            a.y, a.x, d, si, so);
        return MGT_CUDA_AFTER(s, "maxpool2d_forward");
    }
    case MGT_OP_MAXPOOL_BWD: {
        const auto &a = op->u.maxpool_bwd;
        pool16 d = pool16_of(&a.sh);
        k_maxpool_bwd16<<<blocks_for((size_t)d.n * d.c * d.h * d.w), kThreads, 0, s->stream>>>(
            a.dx, a.dy, a.x, d, si, so);
        return MGT_CUDA_AFTER(s, "maxpool2d_backward");
    }
    case MGT_OP_AVGPOOL_FWD: {
        const auto &a = op->u.avgpool_fwd;
        k_gap_fwd16<<<blocks_for((size_t)a.n * a.c), kThreads, 0, s->stream>>>(
            a.y, a.x, a.n, a.c, a.hw, a.layout == MGT_LAYOUT_NHWC, si, so);
        return MGT_CUDA_AFTER(s, "avgpool_forward");
    }
    case MGT_OP_AVGPOOL_BWD: {
        const auto &a = op->u.avgpool_bwd;
        k_gap_bwd16<<<blocks_for((size_t)a.n * a.c * a.hw), kThreads, 0, s->stream>>>(
            a.dx, a.dy, a.n, a.c, a.hw, a.layout == MGT_LAYOUT_NHWC, si, so);
        return MGT_CUDA_AFTER(s, "avgpool_backward");
    }
    case MGT_OP_APOOL_FWD: {
        const auto &a = op->u.apool_fwd;
        apool16 d = {a.n, a.c, a.h, a.w, a.oh, a.ow, a.layout == MGT_LAYOUT_NHWC};
        k_apool_fwd16<<<blocks_for((size_t)a.n * a.c * a.oh * a.ow), kThreads, 0, s->stream>>>(
            a.y, a.x, d, si, so);
        return MGT_CUDA_AFTER(s, "adaptive_avgpool_forward");
    }
    case MGT_OP_APOOL_BWD: {
        const auto &a = op->u.apool_bwd;
        apool16 d = {a.n, a.c, a.h, a.w, a.oh, a.ow, a.layout == MGT_LAYOUT_NHWC};
        k_apool_bwd16<<<blocks_for((size_t)a.n * a.c * a.h * a.w), kThreads, 0, s->stream>>>(
            a.dx, a.dy, d, si, so);
        return MGT_CUDA_AFTER(s, "adaptive_avgpool_backward");
    }
    case MGT_OP_BN_FWD_TRAIN: return bn_train16(s, op, si, so);
    case MGT_OP_BN_FWD_EVAL: return bn_eval16(s, op, si, so);
    case MGT_OP_BN_BWD: return bn_bwd16(s, op, si, so);
    case MGT_OP_ACT_FWD:
    case MGT_OP_ACT_BWD: return mgt_cuda_act16(s, op);
    // the channel ops' kernels take either storage and layout themselves
    case MGT_OP_CHBIAS_FWD: return cuda_chbias_fwd(s, op);
    case MGT_OP_CHBIAS_BWD: return cuda_chbias_bwd(s, op);
    case MGT_OP_CHSCALE_FWD: return cuda_chscale_fwd(s, op);
    case MGT_OP_CHSCALE_BWD: return cuda_chscale_bwd(s, op);
    case MGT_OP_DROPOUT: return cuda_dropout(s, op);
    case MGT_OP_LNC_FWD: return cuda_lnc_fwd(s, op);
    case MGT_OP_LNC_BWD: return cuda_lnc_bwd(s, op);
    case MGT_OP_CONV2D_FWD:
    case MGT_OP_CONV2D_BWD_DATA:
    case MGT_OP_CONV2D_BWD_FILTER: return mgt_cuda_conv16(s, op);
    default:
        return mgt_error_set(MGT_ERR_UNSUPPORTED, "cuda: %s has no 16-bit activation kernel",
                             mgt_op_name(op->kind));
    }
}
