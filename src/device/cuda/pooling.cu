// The CUDA backend's pooling kernels: max pooling, the global average pool, the adaptive
// average pool, each with the exact semantics of mgt/device.h.
//
// Every kernel is deterministic: no floating-point atomics, and each reduction adds in an
// order fixed by the sizes alone, so two runs (and two replicas) give identical bits.
#include <cmath>

#include "device/cuda/common.cuh"

namespace {

// ---- max pooling: x [n][c][h][w] -> y [n][c][p][q], -inf padding (torch's MaxPool2d) ----

struct pool_dims {
    int n, c, h, w, p, q, kh, kw, sh, sw, ph, pw;
};

// The position (ih*w + iw within the plane) that receives window (oh, ow)'s gradient:
// window_first_max over the fp32 plane.
__device__ inline int window_argmax(const float *xp, int oh, int ow, const pool_dims &d)
{
    return window_first_max(oh, ow, d, [xp](int i) { return xp[i]; });
}

// One thread per output element o = ((ni*c + ci)*p + oh)*q + ow: y = x at the window's
// argmax, so forward and backward agree on the winner even for NaN input.
__global__ void k_maxpool_fwd(float *y, const float *x, pool_dims d)
{
    const size_t total = (size_t)d.n * d.c * d.p * d.q;
    for (size_t o = thread_index(); o < total; o += thread_stride()) {
        const int ow = (int)(o % d.q);
        const int oh = (int)((o / d.q) % d.p);
        const size_t plane = o / ((size_t)d.q * d.p); // ni*c + ci
        const float *xp = x + plane * d.h * d.w;
        const int arg = window_argmax(xp, oh, ow, d);
        // mgt_op_check keeps every window on real input; -inf only if it did not.
        y[o] = arg >= 0 ? xp[arg] : -INFINITY;
    }
}

// Gather form, one thread per input element e = ((ni*c + ci)*h + ih)*w + iw: it visits the
// windows that contain it, oh in [ceil((ih+ph-kh+1)/sh), floor((ih+ph)/sh)] clipped to
// [0,p) and likewise ow, in raster order, and adds dy of those whose argmax it is. No
// atomics, and the additions run in the order a scatter over outputs would make them.
__global__ void k_maxpool_bwd(float *dx, const float *dy, const float *x, pool_dims d)
{
    const size_t total = (size_t)d.n * d.c * d.h * d.w;
    for (size_t e = thread_index(); e < total; e += thread_stride()) {
        const int iw = (int)(e % d.w);
        const int ih = (int)((e / d.w) % d.h);
        const size_t plane = e / ((size_t)d.w * d.h);
        const float *xp = x + plane * d.h * d.w;
        const float *dyp = dy + plane * d.p * d.q;
        const int me = ih * d.w + iw;

        int oh_lo, oh_hi, ow_lo, ow_hi;
        pool_outputs_over(ih, d.kh, d.sh, d.ph, d.p, &oh_lo, &oh_hi);
        pool_outputs_over(iw, d.kw, d.sw, d.pw, d.q, &ow_lo, &ow_hi);

        float acc = 0.0f;
        for (int oh = oh_lo; oh <= oh_hi; oh++)
            for (int ow = ow_lo; ow <= ow_hi; ow++)
                if (window_argmax(xp, oh, ow, d) == me)
                    acc += dyp[(size_t)oh * d.q + ow];
        dx[e] = acc;
    }
}

// ---- global average pool: x [rows = n*c][hw] <-> y [rows] ----

// One warp per row: lanes stride over the row, then a butterfly sum; y = sum / hw.
__global__ void k_avgpool_fwd(float *y, const float *x, long rows, int hw)
{
    const int lane = threadIdx.x & 31;
    const long warp = (long)(thread_index() >> 5);
    const long warps = (long)(thread_stride() >> 5);
    for (long r = warp; r < rows; r += warps) {
        const float *xr = x + (size_t)r * hw;
        float acc = 0.0f;
        for (int j = lane; j < hw; j += 32)
            acc += xr[j];
        acc = warp_sum(acc);
        if (lane == 0)
            y[r] = acc / (float)hw;
    }
}

// dx [rows][hw]: dx[r][j] = dy[r] / hw.
__global__ void k_avgpool_bwd(float *dx, const float *dy, size_t total, int hw)
{
    for (size_t i = thread_index(); i < total; i += thread_stride())
        dx[i] = dy[i / (size_t)hw] / (float)hw;
}

// ---- adaptive average pool: x [n*c][h][w] <-> y [n*c][oh][ow] ----

__device__ inline void apool_range(int i, int in, int out, int *lo, int *hi)
{
    *lo = (int)((long long)i * in / out);
    *hi = (int)(((long long)(i + 1) * in + out - 1) / out);
}

__global__ void k_apool_fwd(float *y, const float *x, size_t total, int h, int w, int oh, int ow)
{
    for (size_t o = thread_index(); o < total; o += thread_stride()) {
        const int j = (int)(o % ow), i = (int)((o / ow) % oh);
        const float *xp = x + (o / ((size_t)oh * ow)) * h * w;
        int y0, y1, x0, x1;
        apool_range(i, h, oh, &y0, &y1);
        apool_range(j, w, ow, &x0, &x1);
        float s = 0.0f;
        for (int yy = y0; yy < y1; yy++)
            for (int xx = x0; xx < x1; xx++)
                s += xp[(size_t)yy * w + xx];
        y[o] = s / (float)((y1 - y0) * (x1 - x0));
    }
}

// Gather form, one thread per input element: the windows containing it, in raster order.
__global__ void k_apool_bwd(float *dx, const float *dy, size_t total, int h, int w, int oh, int ow)
{
    for (size_t e = thread_index(); e < total; e += thread_stride()) {
        const int ix = (int)(e % w), iy = (int)((e / w) % h);
        const float *dyp = dy + (e / ((size_t)h * w)) * oh * ow;
        float acc = 0.0f;
        for (int i = 0; i < oh; i++) {
            int y0, y1;
            apool_range(i, h, oh, &y0, &y1);
            if (iy < y0 || iy >= y1)
                continue;
            for (int j = 0; j < ow; j++) {
                int x0, x1;
                apool_range(j, w, ow, &x0, &x1);
                if (ix >= x0 && ix < x1)
                    acc += dyp[(size_t)i * ow + j] / (float)((y1 - y0) * (x1 - x0));
            }
        }
        dx[e] = acc;
    }
}

} // namespace

static pool_dims pool_dims_of(const mgt_pool2d_shape *sh)
{
    pool_dims d;
    d.n = sh->n;
    d.c = sh->c;
    d.h = sh->h;
    d.w = sh->w;
    d.kh = sh->kh;
    d.kw = sh->kw;
    d.sh = sh->stride_h;
    d.sw = sh->stride_w;
    d.ph = sh->pad_h;
    d.pw = sh->pad_w;
    d.p = mgt_pool2d_out_h(sh);
    d.q = mgt_pool2d_out_w(sh);
    return d;
}

mgt_status cuda_maxpool_fwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.maxpool_fwd;
    pool_dims d = pool_dims_of(&a.sh);
    size_t total = (size_t)d.n * d.c * d.p * d.q;
    k_maxpool_fwd<<<blocks_for(total), kThreads, 0, s->stream>>>(a.y, a.x, d);
    return MGT_CUDA_AFTER(s, "maxpool2d_forward");
}

// y is not needed: the argmax is recomputed from x with the raster-order tie rule.
mgt_status cuda_maxpool_bwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.maxpool_bwd;
    pool_dims d = pool_dims_of(&a.sh);
    size_t total = (size_t)d.n * d.c * d.h * d.w;
    k_maxpool_bwd<<<blocks_for(total), kThreads, 0, s->stream>>>(a.dx, a.dy, a.x, d);
    return MGT_CUDA_AFTER(s, "maxpool2d_backward");
}

mgt_status cuda_avgpool_fwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.avgpool_fwd;
    long rows = (long)a.n * a.c;
    k_avgpool_fwd<<<blocks_for_rows(rows), kThreads, 0, s->stream>>>(a.y, a.x, rows, a.hw);
    return MGT_CUDA_AFTER(s, "avgpool_forward");
}

mgt_status cuda_avgpool_bwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.avgpool_bwd;
    size_t total = (size_t)a.n * a.c * a.hw;
    k_avgpool_bwd<<<blocks_for(total), kThreads, 0, s->stream>>>(a.dx, a.dy, total, a.hw);
    return MGT_CUDA_AFTER(s, "avgpool_backward");
}

mgt_status cuda_apool_fwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.apool_fwd;
    size_t total = (size_t)a.n * a.c * a.oh * a.ow;
    k_apool_fwd<<<blocks_for(total), kThreads, 0, s->stream>>>(a.y, a.x, total, a.h, a.w, a.oh,
                                                               a.ow);
    return MGT_CUDA_AFTER(s, "adaptive_avgpool_forward");
}

mgt_status cuda_apool_bwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.apool_bwd;
    size_t total = (size_t)a.n * a.c * a.h * a.w;
    k_apool_bwd<<<blocks_for(total), kThreads, 0, s->stream>>>(a.dx, a.dy, total, a.h, a.w, a.oh,
                                                               a.ow);
    return MGT_CUDA_AFTER(s, "adaptive_avgpool_backward");
}
