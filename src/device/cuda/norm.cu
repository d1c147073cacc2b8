// The CUDA backend's own normalisation kernels: SyncBN's per-shard statistics and
// elementwise backward, and the layer norm over channels (batch norm itself runs on cuDNN:
// dnn.cu), with the exact semantics of mgt/device.h.
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

// LayerNorm over channels: each thread one pixel (image, position), its c values at stride hw
// (neighbouring threads read neighbouring addresses), statistics in double.
__device__ void lnc_stats_d(const float *x, int c, int hw, float eps, double *mean, double *rstd)
{
    double m = 0.0, v = 0.0;
    for (int ch = 0; ch < c; ch++)
        m += x[(size_t)ch * hw];
    m /= c;
    for (int ch = 0; ch < c; ch++) {
        double d = x[(size_t)ch * hw] - m;
        v += d * d;
    }
    *mean = m;
    *rstd = 1.0 / sqrt(v / c + (double)eps);
}

__global__ void k_lnc_fwd(float *y, const float *x, const float *w, const float *b, int n, int c,
                          int hw, float eps)
{
    size_t pixels = (size_t)n * hw;
    for (size_t p = thread_index(); p < pixels; p += thread_stride()) {
        size_t base = (p / hw) * (size_t)c * hw + p % hw;
        double m, rs;
        lnc_stats_d(x + base, c, hw, eps, &m, &rs);
        for (int ch = 0; ch < c; ch++) {
            size_t e = base + (size_t)ch * hw;
            y[e] = (float)((x[e] - m) * rs * w[ch] + b[ch]);
        }
    }
}

// Each pixel's mean and 1/std, once, into stats[2p] and stats[2p+1]: both backward kernels
// read them there.
__global__ void k_lnc_stats(double *stats, const float *x, int n, int c, int hw, float eps)
{
    size_t pixels = (size_t)n * hw;
    for (size_t p = thread_index(); p < pixels; p += thread_stride()) {
        size_t base = (p / hw) * (size_t)c * hw + p % hw;
        lnc_stats_d(x + base, c, hw, eps, &stats[2 * p], &stats[2 * p + 1]);
    }
}

// Reads dy before it writes dx at each element, so dx may be dy.
__global__ void k_lnc_bwd_data(float *dx, const double *stats, const float *dy, const float *x,
                               const float *w, int n, int c, int hw)
{
    size_t pixels = (size_t)n * hw;
    for (size_t p = thread_index(); p < pixels; p += thread_stride()) {
        size_t base = (p / hw) * (size_t)c * hw + p % hw;
        double m = stats[2 * p], rs = stats[2 * p + 1], mg = 0.0, mgx = 0.0;
        for (int ch = 0; ch < c; ch++) {
            size_t e = base + (size_t)ch * hw;
            double g = (double)dy[e] * w[ch];
            mg += g;
            mgx += g * (x[e] - m) * rs;
        }
        mg /= c;
        mgx /= c;
        for (int ch = 0; ch < c; ch++) {
            size_t e = base + (size_t)ch * hw;
            double g = (double)dy[e] * w[ch];
            dx[e] = (float)(rs * (g - mg - (x[e] - m) * rs * mgx));
        }
    }
}

// One block per channel: sums over every pixel of dy * xhat and dy, each thread's part then a
// fixed tree (the same bits on every run), added onto dweight and dbias. Each pixel's mean and
// 1/std come from k_lnc_stats: one read of dy and x per element, O(c x pixels) in all
// (computing them here cost c reads per pixel in each of c blocks: O(c^2 x pixels)).
__global__ void k_lnc_bwd_param(float *dw, float *db, const double *stats, const float *dy,
                                const float *x, int n, int c, int hw)
{
    __shared__ double pw[kThreads], pb[kThreads];
    const int ch = blockIdx.x, t = threadIdx.x;
    size_t pixels = (size_t)n * hw;
    double aw = 0.0, ab = 0.0;
    for (size_t p = t; p < pixels; p += kThreads) {
        size_t e = (p / hw) * (size_t)c * hw + p % hw + (size_t)ch * hw;
        aw += (double)dy[e] * (x[e] - stats[2 * p]) * stats[2 * p + 1];
        ab += dy[e];
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

} // namespace

mgt_status cuda_lnc_fwd(mgt_cuda_stream *s, const mgt_op *op)
{
    if (op->u.lnc_fwd.hw == 1)
        return cuda_ln_rows_fwd(s, op);
    MGT_ENTER(s);
    const auto &a = op->u.lnc_fwd;
    size_t pixels = (size_t)a.n * a.hw;
    k_lnc_fwd<<<blocks_for(pixels), kThreads, 0, s->stream>>>(a.y, a.x, a.weight, a.bias, a.n, a.c,
                                                              a.hw, a.eps);
    return MGT_CUDA_AFTER(s, "layernorm_channels_forward");
}

mgt_status cuda_lnc_bwd(mgt_cuda_stream *s, const mgt_op *op)
{
    if (op->u.lnc_bwd.hw == 1)
        return cuda_ln_rows_bwd(s, op);
    MGT_ENTER(s);
    const auto &a = op->u.lnc_bwd;
    size_t pixels = (size_t)a.n * a.hw;
    // 16 bytes per pixel of scratch (a c-th of the activation's size for c = 4 in fp32).
    mgt_status st = mgt_cuda_scratch(s, pixels * 2 * sizeof(double));
    if (st != MGT_OK)
        return st;
    double *stats = (double *)s->scratch;
    k_lnc_stats<<<blocks_for(pixels), kThreads, 0, s->stream>>>(stats, a.x, a.n, a.c, a.hw, a.eps);
    // parameters before data: dx may overwrite dy
    k_lnc_bwd_param<<<(unsigned)a.c, kThreads, 0, s->stream>>>(a.dweight, a.dbias, stats, a.dy, a.x,
                                                               a.n, a.c, a.hw);
    k_lnc_bwd_data<<<blocks_for(pixels), kThreads, 0, s->stream>>>(a.dx, stats, a.dy, a.x, a.weight,
                                                                   a.n, a.c, a.hw);
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
