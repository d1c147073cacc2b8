// The CUDA backend's own normalisation kernels: SyncBN's per-shard statistics and
// elementwise backward, and the layer norm over channels (batch norm itself runs on cuDNN:
// dnn.cu), with the exact semantics of mgt/device.h. The layer norm over channels also takes
// activations stored in 16 bits and NHWC (CUDA's layout under --amp): widened on load, the
// reference's double arithmetic, rounded once on store (mgt_op_run_widened).
//
// Every kernel is deterministic: no floating-point atomics, and each reduction adds in an
// order fixed by the sizes alone, so two runs (and two replicas) give identical bits.
#include <cmath>

#include "device/cuda/common.cuh"

namespace {

// One block per channel: this shard's mean, then the biased variance from squared deviations
// (two passes in double, each thread's part then a fixed tree, as the reference).
__global__ void k_bn_stats(float *mean, float *var, const float *x, int n, int c, int hw)
{
    __shared__ double part[kThreads];
    __shared__ double mu;
    const int ch = blockIdx.x, t = threadIdx.x;
    const double m = (double)n * hw;
    for (int pass = 0; pass < 2; pass++) {
        double acc = 0.0;
        for (int im = 0; im < n; im++) {
            const size_t base = ((size_t)im * c + ch) * (size_t)hw;
            for (int e = t; e < hw; e += kThreads) {
                double v = x[base + e];
                acc += pass == 0 ? v : (v - mu) * (v - mu);
            }
        }
        block_sum(part, acc);
        if (t == 0) {
            if (pass == 0)
                mu = part[0] / m;
            else {
                mean[ch] = (float)mu;
                var[ch] = (float)(part[0] / m);
            }
        }
        __syncthreads();
    }
}

// dx = gamma*invstd/count * (count*dy - sum_dy - xhat*sum_dy_xhat), elementwise.
__global__ void k_bn_bwd_elemt(float *dx, const float *dy, const float *x, const float *gamma,
                               const float *mean, const float *invstd, const float *sum_dy,
                               const float *sum_dy_xhat, double count, int c, int hw, size_t total)
{
    for (size_t i = thread_index(); i < total; i += thread_stride()) {
        int ch = (int)((i / (size_t)hw) % (size_t)c);
        double inv = invstd[ch], xhat = ((double)x[i] - mean[ch]) * inv;
        dx[i] = (float)(gamma[ch] * inv / count *
                        (count * dy[i] - sum_dy[ch] - xhat * sum_dy_xhat[ch]));
    }
}

// LayerNorm over channels: each thread one pixel (image, position), its c values at stride
// hw in NCHW (neighbouring threads read neighbouring addresses) or contiguous in NHWC,
// statistics in double.
struct lnc_dims {
    int n, c, hw;
    bool nhwc;
    mgt_sto si, so; // x and dx; y and dy
};

// Pixel p's channel 0 and the step to the next channel.
__device__ inline size_t lnc_pixel(const lnc_dims &d, size_t p, size_t *step)
{
    *step = d.nhwc ? 1 : (size_t)d.hw;
    return d.nhwc ? p * d.c : (p / d.hw) * (size_t)d.c * d.hw + p % d.hw;
}

__device__ void lnc_stats_d(const void *x, size_t base, size_t step, const lnc_dims &d, float eps,
                            double *mean, double *rstd)
{
    double m = 0.0, v = 0.0;
    for (int ch = 0; ch < d.c; ch++)
        m += sto_ld(x, base + ch * step, d.si);
    m /= d.c;
    for (int ch = 0; ch < d.c; ch++) {
        double dv = sto_ld(x, base + ch * step, d.si) - m;
        v += dv * dv;
    }
    *mean = m;
    *rstd = 1.0 / sqrt(v / d.c + (double)eps);
}

__global__ void k_lnc_fwd(void *y, const void *x, const float *w, const float *b, lnc_dims d,
                          float eps)
{
    size_t pixels = (size_t)d.n * d.hw;
    for (size_t p = thread_index(); p < pixels; p += thread_stride()) {
        size_t step, base = lnc_pixel(d, p, &step);
        double m, rs;
        lnc_stats_d(x, base, step, d, eps, &m, &rs);
        for (int ch = 0; ch < d.c; ch++) {
            size_t e = base + ch * step;
            sto_st(y, e, (float)((sto_ld(x, e, d.si) - m) * rs * w[ch] + b[ch]), d.so);
        }
    }
}

// Each pixel's mean and 1/std, once, into stats[2p] and stats[2p+1]: both backward kernels
// read them there.
__global__ void k_lnc_stats(double *stats, const void *x, lnc_dims d, float eps)
{
    size_t pixels = (size_t)d.n * d.hw;
    for (size_t p = thread_index(); p < pixels; p += thread_stride()) {
        size_t step, base = lnc_pixel(d, p, &step);
        lnc_stats_d(x, base, step, d, eps, &stats[2 * p], &stats[2 * p + 1]);
    }
}

// Reads dy before it writes dx at each element, so dx may be dy.
__global__ void k_lnc_bwd_data(void *dx, const double *stats, const void *dy, const void *x,
                               const float *w, lnc_dims d)
{
    size_t pixels = (size_t)d.n * d.hw;
    for (size_t p = thread_index(); p < pixels; p += thread_stride()) {
        size_t step, base = lnc_pixel(d, p, &step);
        double m = stats[2 * p], rs = stats[2 * p + 1], mg = 0.0, mgx = 0.0;
        for (int ch = 0; ch < d.c; ch++) {
            size_t e = base + ch * step;
            double g = (double)sto_ld(dy, e, d.so) * w[ch];
            mg += g;
            mgx += g * (sto_ld(x, e, d.si) - m) * rs;
        }
        mg /= d.c;
        mgx /= d.c;
        for (int ch = 0; ch < d.c; ch++) {
            size_t e = base + ch * step;
            double g = (double)sto_ld(dy, e, d.so) * w[ch];
            sto_st(dx, e, (float)(rs * (g - mg - (sto_ld(x, e, d.si) - m) * rs * mgx)), d.si);
        }
    }
}

// NCHW: one block per channel: sums over every pixel of dy * xhat and dy, each thread's part
// then a fixed tree (the same bits on every run), added onto dweight and dbias. Each pixel's
// mean and 1/std come from k_lnc_stats: one read of dy and x per element, O(c x pixels) in all
// (computing them here cost c reads per pixel in each of c blocks: O(c^2 x pixels)).
__global__ void k_lnc_bwd_param(float *dw, float *db, const double *stats, const void *dy,
                                const void *x, lnc_dims d)
{
    __shared__ double pw[kThreads], pb[kThreads];
    const int ch = blockIdx.x, t = threadIdx.x;
    size_t pixels = (size_t)d.n * d.hw;
    double aw = 0.0, ab = 0.0;
    for (size_t p = t; p < pixels; p += kThreads) {
        size_t e = (p / d.hw) * (size_t)d.c * d.hw + p % d.hw + (size_t)ch * d.hw;
        const double g = sto_ld(dy, e, d.so);
        aw += g * (sto_ld(x, e, d.si) - stats[2 * p]) * stats[2 * p + 1];
        ab += g;
    }
    pw[t] = aw;
    pb[t] = ab;
    __syncthreads();
    for (int h = kThreads / 2; h > 0; h /= 2) {
        if (t < h) {
            pw[t] += pw[t + h];
            pb[t] += pb[t + h];
        }
        __syncthreads();
    }
    if (t == 0) {
        dw[ch] += (float)pw[0];
        db[ch] += (float)pb[0];
    }
}

// NHWC: the same sums as common.cuh's row sums (a row is a pixel), coalesced across channels.
struct lnc_param_rows {
    const double *stats;
    const void *dy, *x;
    lnc_dims d;
    __device__ double2 operator()(size_t p, int ch) const
    {
        const size_t e = p * d.c + ch;
        const double g = sto_ld(dy, e, d.so);
        return make_double2(g * (sto_ld(x, e, d.si) - stats[2 * p]) * stats[2 * p + 1], g);
    }
};

struct lnc_param_done {
    float *dw, *db;
    __device__ void operator()(size_t g, int ch, double2 v) const
    {
        (void)g;
        dw[ch] += (float)v.x;
        db[ch] += (float)v.y;
    }
};

lnc_dims lnc_dims_of(const mgt_op *op, int n, int c, int hw, mgt_layout l)
{
    return lnc_dims{
        n, c, hw, l == MGT_LAYOUT_NHWC, mgt_sto_of(op->store_in), mgt_sto_of(op->store_out)};
}

} // namespace

mgt_status cuda_lnc_fwd(mgt_cuda_stream *s, const mgt_op *op)
{
    if (op->u.lnc_fwd.hw == 1 && mgt_op_store16(op) == MGT_PREC_F32)
        return cuda_ln_rows_fwd(s, op);
    MGT_ENTER(s);
    const auto &a = op->u.lnc_fwd;
    size_t pixels = (size_t)a.n * a.hw;
    k_lnc_fwd<<<blocks_for(pixels), kThreads, 0, s->stream>>>(
        a.y, a.x, a.weight, a.bias, lnc_dims_of(op, a.n, a.c, a.hw, a.layout), a.eps);
    return MGT_CUDA_AFTER(s, "layernorm_channels_forward");
}

mgt_status cuda_lnc_bwd(mgt_cuda_stream *s, const mgt_op *op)
{
    if (op->u.lnc_bwd.hw == 1 && mgt_op_store16(op) == MGT_PREC_F32)
        return cuda_ln_rows_bwd(s, op);
    MGT_ENTER(s);
    const auto &a = op->u.lnc_bwd;
    size_t pixels = (size_t)a.n * a.hw;
    const lnc_dims d = lnc_dims_of(op, a.n, a.c, a.hw, a.layout);
    // 16 bytes per pixel of scratch (a c-th of the activation's size for c = 4 in fp32), and in
    // NHWC the row sums' partials after them, asked for at once (a scratch that grows loses
    // what it held)
    const size_t sbytes = mgt_cuda_align256(pixels * 2 * sizeof(double));
    mgt_status st =
        mgt_cuda_scratch(s, sbytes + (d.nhwc ? mgt_cuda_row_sums_bytes(pixels, a.c, 1) : 0));
    if (st != MGT_OK)
        return st;
    double *stats = (double *)s->scratch;
    k_lnc_stats<<<blocks_for(pixels), kThreads, 0, s->stream>>>(stats, a.x, d, a.eps);
    // parameters before data: dx may overwrite dy
    if (d.nhwc) {
        st = mgt_cuda_row_sums_at(s, sbytes, pixels, a.c, 1, lnc_param_rows{stats, a.dy, a.x, d},
                                  lnc_param_done{a.dweight, a.dbias});
        if (st != MGT_OK)
            return st;
    } else {
        k_lnc_bwd_param<<<(unsigned)a.c, kThreads, 0, s->stream>>>(a.dweight, a.dbias, stats, a.dy,
                                                                   a.x, d);
    }
    k_lnc_bwd_data<<<blocks_for(pixels), kThreads, 0, s->stream>>>(a.dx, stats, a.dy, a.x, a.weight,
                                                                   d);
    return MGT_CUDA_AFTER(s, "layernorm_channels_backward");
}

mgt_status cuda_bn_stats(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.bn_stats;
    k_bn_stats<<<(unsigned)a.sh.c, kThreads, 0, s->stream>>>(a.mean, a.var, a.x, a.sh.n, a.sh.c,
                                                             a.sh.hw);
    return MGT_CUDA_AFTER(s, "bn_stats");
}

mgt_status cuda_bn_bwd_elemt(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.bn_bwd_elemt;
    size_t total = (size_t)a.sh.n * a.sh.c * a.sh.hw;
    k_bn_bwd_elemt<<<blocks_for(total), kThreads, 0, s->stream>>>(a.dx, a.dy, a.x, a.gamma, a.mean,
                                                                  a.invstd, a.sum_dy, a.sum_dy_xhat,
                                                                  a.count, a.sh.c, a.sh.hw, total);
    return MGT_CUDA_AFTER(s, "bn_backward_elemt");
}
