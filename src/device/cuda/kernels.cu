// The CUDA backend's own kernels: element-wise ops, reductions, pooling, bias, softmax
// cross-entropy, top-k and the fused SGD step, each with the exact semantics of mgt/device.h.
//
// Every kernel is deterministic: no floating-point atomics, and each reduction adds in an
// order fixed by the sizes alone, so two runs (and two replicas) give identical bits.
#include <cmath>
#include <cstdint>

#include "device/cuda/common.cuh"
#include "mgt/rng.h"

namespace {

const int kThreads = 256; // threads per block of the 1-D kernels
const int kWarpsPerBlock = kThreads / 32;
const unsigned kFullMask = 0xffffffffu;

// Enough blocks to cover n with one element per thread, capped: the kernels loop
// (grid-stride), so the cap only bounds the launch, never the work.
unsigned blocks_for(size_t n)
{
    size_t b = (n + kThreads - 1) / kThreads;
    if (b < 1)
        b = 1;
    if (b > ((size_t)1 << 20))
        b = (size_t)1 << 20;
    return (unsigned)b;
}

// Blocks for kernels that give one warp to each of `rows` rows.
unsigned blocks_for_rows(long rows)
{
    long b = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
    if (b < 1)
        b = 1;
    if (b > 65535)
        b = 65535;
    return (unsigned)b;
}

__device__ inline size_t thread_index() { return (size_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ inline size_t thread_stride() { return (size_t)gridDim.x * blockDim.x; }

// Butterfly reductions: every lane ends with the same value, combined in a fixed order.
__device__ inline float warp_sum(float v)
{
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(kFullMask, v, off);
    return v;
}

__device__ inline int warp_sum_int(int v)
{
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(kFullMask, v, off);
    return v;
}

__device__ inline float warp_max(float v)
{
    for (int off = 16; off > 0; off >>= 1)
        v = fmaxf(v, __shfl_xor_sync(kFullMask, v, off));
    return v;
}

// Records the first bad label of the replica in its mapped flag; the host turns it into
// MGT_ERR_DEVICE at the next wait. The claim (in device memory) picks one writer; the code
// slot is written last, after a fence that makes row and label visible to the host first.
__device__ void raise_label_error(int *flag, int *claim, int code, int row, int label, int classes)
{
    if (atomicCAS(claim, 0, 1) != 0)
        return;
    flag[MGT_CUDA_FLAG_ROW] = row;
    flag[MGT_CUDA_FLAG_LABEL] = label;
    flag[MGT_CUDA_FLAG_CLASSES] = classes;
    __threadfence_system();
    *(volatile int *)&flag[MGT_CUDA_FLAG_CODE] = code;
}

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

// The same tree over float values (per-row losses) in one block: out[0] = sum / divisor.
__global__ void k_mean_rows(float *out, const float *v, int n, double divisor)
{
    __shared__ double sh[kThreads];
    double acc = 0.0;
    for (int i = threadIdx.x; i < n; i += kThreads)
        acc += (double)v[i];
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

// ---- max pooling: x [n][c][h][w] -> y [n][c][p][q], -inf padding (torch's MaxPool2d) ----

struct pool_dims {
    int n, c, h, w, p, q, kh, kw, sh, sw, ph, pw;
};

// The position (ih*w + iw within the plane) that receives window (oh, ow)'s gradient: its
// first maximum in raster order. The first in-bounds element starts the scan and only a
// strictly larger value replaces it, so ties keep the earliest; an all -inf window
// routes to its first in-bounds element.
__device__ inline int window_argmax(const float *xp, int oh, int ow, const pool_dims &d)
{
    const int h0 = oh * d.sh - d.ph, w0 = ow * d.sw - d.pw;
    int arg = -1;
    float best = 0.0f;
    for (int i = 0; i < d.kh; i++) {
        const int ih = h0 + i;
        if (ih < 0 || ih >= d.h)
            continue;
        for (int j = 0; j < d.kw; j++) {
            const int iw = w0 + j;
            if (iw < 0 || iw >= d.w)
                continue;
            const float v = xp[(size_t)ih * d.w + iw];
            if (arg < 0 || v > best) {
                best = v;
                arg = ih * d.w + iw;
            }
        }
    }
    return arg;
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

        int lo = ih + d.ph - d.kh + 1;
        const int oh_lo = lo <= 0 ? 0 : (lo + d.sh - 1) / d.sh;
        int oh_hi = (ih + d.ph) / d.sh;
        if (oh_hi > d.p - 1)
            oh_hi = d.p - 1;
        lo = iw + d.pw - d.kw + 1;
        const int ow_lo = lo <= 0 ? 0 : (lo + d.sw - 1) / d.sw;
        int ow_hi = (iw + d.pw) / d.sw;
        if (ow_hi > d.q - 1)
            ow_hi = d.q - 1;

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

// ---- softmax cross-entropy: logits, probs, dlogits [n][classes], labels [n] ----

// One warp per row. With m = max z, s = sum exp(z - m), lse = m + log s:
//   probs[j] = exp(z_j - m) / s
//   loss = (1-eps) * (lse - (w z_a + (1-w) z_b)) + eps * (lse - mean_j z_j)
// which is -(sum_j target_j * log p_j) for target = (1-eps) (w onehot(a) + (1-w) onehot(b)) +
// eps/classes (w = 1, b = a without weights), written with differences from m so that no
// large terms cancel. rowloss [n] feeds the mean.
__global__ void k_xent_rows(float *rowloss, float *probs, const float *logits,
                            const int32_t *labels_a, const int32_t *labels_b, const float *weights,
                            int n, int classes, float eps, int *flag, int *claim)
{
    const int lane = threadIdx.x & 31;
    const long warp = (long)(thread_index() >> 5);
    const long warps = (long)(thread_stride() >> 5);
    for (long row = warp; row < n; row += warps) {
        const float *z = logits + (size_t)row * classes;
        float *pr = probs + (size_t)row * classes;
        float m = -INFINITY;
        for (int j = lane; j < classes; j += 32)
            m = fmaxf(m, z[j]);
        m = warp_max(m);
        float s = 0.0f, dsum = 0.0f;
        for (int j = lane; j < classes; j += 32) {
            const float e = z[j] - m;
            s += expf(e);
            dsum += e;
        }
        s = warp_sum(s);
        dsum = warp_sum(dsum);
        for (int j = lane; j < classes; j += 32)
            pr[j] = expf(z[j] - m) / s;
        if (lane == 0) {
            const int a = labels_a[row], b = labels_b ? labels_b[row] : a;
            const float w = weights ? weights[row] : 1.0f;
            float loss = 0.0f;
            if (a < 0 || a >= classes || b < 0 || b >= classes) {
                raise_label_error(flag, claim, MGT_CUDA_FLAG_XENT_FWD_LABEL, (int)row,
                                  a < 0 || a >= classes ? a : b, classes);
            } else {
                const float log_s = logf(s);
                loss = (1.0f - eps) * (log_s - (w * (z[a] - m) + (1.0f - w) * (z[b] - m)));
                if (eps != 0.0f)
                    loss += eps * (log_s - dsum / (float)classes);
            }
            rowloss[row] = loss;
        }
    }
}

// One thread per element i = row*classes + j:
//   dlogits = scale * (probs - target), target = (1-eps)(w [j == a] + (1-w) [j == b]) + eps/C.
__global__ void k_xent_bwd(float *dlogits, const float *probs, const int32_t *labels_a,
                           const int32_t *labels_b, const float *weights, int n, int classes,
                           float eps, float scale, int *flag, int *claim)
{
    const size_t total = (size_t)n * classes;
    const float smooth = eps / (float)classes;
    for (size_t i = thread_index(); i < total; i += thread_stride()) {
        const int row = (int)(i / classes);
        const int j = (int)(i % classes);
        const int a = labels_a[row], b = labels_b ? labels_b[row] : a;
        const float w = weights ? weights[row] : 1.0f;
        float t = smooth;
        if (a < 0 || a >= classes || b < 0 || b >= classes) {
            if (j == 0)
                raise_label_error(flag, claim, MGT_CUDA_FLAG_XENT_BWD_LABEL, row,
                                  a < 0 || a >= classes ? a : b, classes);
        } else {
            t += (1.0f - eps) * ((j == a ? w : 0.0f) + (j == b ? 1.0f - w : 0.0f));
        }
        dlogits[i] = scale * (probs[i] - t);
    }
}

// ---- top-k: logits [n][classes], labels [n]; count[0] += rows with rank(label) < k ----

// One warp per row: rank = #{j : z_j > z_y} + #{j < y : z_j == z_y} (ties rank the lower
// class first), counted over lanes and summed; integer atomics are exact.
__global__ void k_topk(int32_t *count, const float *logits, const int32_t *labels, int n,
                       int classes, int k, int *flag, int *claim)
{
    const int lane = threadIdx.x & 31;
    const long warp = (long)(thread_index() >> 5);
    const long warps = (long)(thread_stride() >> 5);
    for (long row = warp; row < n; row += warps) {
        const int y = labels[row]; // the same for every lane: the branch below is uniform
        if (y < 0 || y >= classes) {
            if (lane == 0)
                raise_label_error(flag, claim, MGT_CUDA_FLAG_TOPK_LABEL, (int)row, y, classes);
            continue;
        }
        const float *z = logits + (size_t)row * classes;
        const float zy = z[y];
        int above = 0;
        for (int j = lane; j < classes; j += 32) {
            const float v = z[j];
            above += (v > zy) || (v == zy && j < y);
        }
        above = warp_sum_int(above);
        if (lane == 0 && above < k)
            atomicAdd((int *)count, 1);
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

// ---- channel bias: y, dy [n][c][hw], bias, dbias [c] ----

__global__ void k_chbias_fwd(float *y, const float *bias, size_t total, int c, int hw)
{
    for (size_t i = thread_index(); i < total; i += thread_stride())
        y[i] += bias[(i / (size_t)hw) % (size_t)c];
}

// One block per channel: threads stride over the channel's n*hw values in a fixed order,
// then a fixed-shape tree in shared memory; accumulated into dbias[ch].
__global__ void k_chbias_bwd(float *dbias, const float *dy, int n, int c, int hw)
{
    __shared__ float sh[kThreads];
    const int ch = blockIdx.x;
    const size_t total = (size_t)n * hw;
    float acc = 0.0f;
    for (size_t k = threadIdx.x; k < total; k += blockDim.x) {
        size_t im = k / (size_t)hw, j = k % (size_t)hw;
        acc += dy[(im * c + ch) * hw + j];
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

__device__ inline void philox10(uint32_t c[4], uint32_t k0, uint32_t k1)
{
    for (int round = 0; round < 10; round++) {
        uint32_t lo0 = 0xD2511F53u * c[0], hi0 = __umulhi(0xD2511F53u, c[0]);
        uint32_t lo1 = 0xCD9E8D57u * c[2], hi1 = __umulhi(0xCD9E8D57u, c[2]);
        uint32_t n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0;
        c[1] = lo1;
        c[2] = n2;
        c[3] = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}

// One thread per block of four elements (one Philox call each).
__global__ void k_dropout(float *y, const float *x, int n, dropout_key k)
{
    const size_t blocks_per_image = (k.per_image + 3) / 4;
    const size_t total = (size_t)n * blocks_per_image;
    for (size_t b = thread_index(); b < total; b += thread_stride()) {
        size_t im = b / blocks_per_image, blk = b % blocks_per_image;
        unsigned long long g = k.sample0 + (unsigned long long)im * k.stride;
        uint32_t c[4] = {(uint32_t)blk, k.step, (uint32_t)g,
                         ((uint32_t)(g >> 32) & 0x00FFFFFFu) | (6u << 24)};
        philox10(c, k.k0, k.k1);
        for (int q = 0; q < 4; q++) {
            size_t j = blk * 4 + q;
            if (j >= k.per_image)
                break;
            size_t e = im * k.per_image + j;
            y[e] = (c[q] >> 8) >= k.thr ? x[e] * k.scale : 0.0f;
        }
    }
}

// ---- activations (mgt_act) and channel scaling ----

// ---- activations: one struct per row of MGT_ACT_LIST, its value and derivative in float ----

struct act_relu6 {
    __device__ static float fwd(float x) { return x < 0.0f ? 0.0f : x > 6.0f ? 6.0f : x; }
    __device__ static float grad(float x) { return x > 0.0f && x < 6.0f ? 1.0f : 0.0f; }
};

struct act_hardsigmoid {
    __device__ static float fwd(float x)
    {
        return x <= -3.0f ? 0.0f : x >= 3.0f ? 1.0f : x / 6.0f + 0.5f;
    }
    __device__ static float grad(float x) { return x > -3.0f && x < 3.0f ? 1.0f / 6.0f : 0.0f; }
};

struct act_hardswish {
    __device__ static float fwd(float x)
    {
        return x <= -3.0f ? 0.0f : x >= 3.0f ? x : x * (x + 3.0f) / 6.0f;
    }
    __device__ static float grad(float x)
    {
        return x < -3.0f ? 0.0f : x <= 3.0f ? x / 3.0f + 0.5f : 1.0f;
    }
};

struct act_silu {
    __device__ static float fwd(float x) { return x / (1.0f + expf(-x)); }
    __device__ static float grad(float x)
    {
        float sg = 1.0f / (1.0f + expf(-x));
        return sg * (1.0f + x * (1.0f - sg));
    }
};

struct act_sigmoid {
    __device__ static float fwd(float x) { return 1.0f / (1.0f + expf(-x)); }
    __device__ static float grad(float x)
    {
        float sg = 1.0f / (1.0f + expf(-x));
        return sg * (1.0f - sg);
    }
};

struct act_gelu {
    __device__ static float fwd(float x)
    {
        return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    }
    __device__ static float grad(float x)
    {
        return 0.5f * (1.0f + erff(x * 0.70710678118654752f)) +
               x * expf(-0.5f * x * x) * 0.39894228040143268f;
    }
};

// y may alias x
template <class A> __global__ void k_act_fwd(float *y, const float *x, size_t n)
{
    for (size_t i = thread_index(); i < n; i += thread_stride())
        y[i] = A::fwd(x[i]);
}

// dx may alias dy
template <class A> __global__ void k_act_bwd(float *dx, const float *dy, const float *x, size_t n)
{
    for (size_t i = thread_index(); i < n; i += thread_stride())
        dx[i] = dy[i] * A::grad(x[i]);
}

__global__ void k_chscale_fwd(float *y, const float *x, const float *scale, size_t total, int c,
                              int hw, bool shared)
{
    for (size_t i = thread_index(); i < total; i += thread_stride()) {
        size_t pl = i / (size_t)hw;
        y[i] = x[i] * scale[shared ? pl % (size_t)c : pl];
    }
}

// One block per plane (image, channel), or with shared one per channel walking the images in
// order: dx = dy * scale, and the sum of dy * x in double, each thread's part then a fixed
// tree, written (per image) or added onto dscale (shared).
__global__ void k_chscale_bwd(float *dx, float *dscale, const float *dy, const float *x,
                              const float *scale, int n, int c, int hw, bool shared)
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
            float g = dy[base + e];
            if (dscale)
                acc += (double)g * x[base + e];
            dx[base + e] = g * sc;
        }
    }
    if (!dscale)
        return;
    part[t] = acc;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w /= 2) {
        if (t < w)
            part[t] += part[t + w];
        __syncthreads();
    }
    if (t == 0) {
        if (shared)
            dscale[b] = (float)(dscale[b] + part[0]);
        else
            dscale[b] = (float)part[0];
    }
}

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
        part[t] = acc;
        __syncthreads();
        for (int w = kThreads / 2; w > 0; w /= 2) {
            if (t < w)
                part[t] += part[t + w];
            __syncthreads();
        }
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

} // namespace

// ---- launchers ----

#define MGT_ENTER(s)                        \
    do {                                    \
        mgt_status st_ = mgt_cuda_enter(s); \
        if (st_ != MGT_OK)                  \
            return st_;                     \
    } while (0)

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
    k_chbias_fwd<<<blocks_for(total), kThreads, 0, s->stream>>>(a.y, a.bias, total, a.c, a.hw);
    return MGT_CUDA_AFTER(s, "channel_bias_forward");
}

mgt_status cuda_chbias_bwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.chbias_bwd;
    k_chbias_bwd<<<(unsigned)a.c, kThreads, 0, s->stream>>>(a.dbias, a.dy, a.n, a.c, a.hw);
    return MGT_CUDA_AFTER(s, "channel_bias_backward");
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
    size_t total = (size_t)a.n * ((a.per_image + 3) / 4);
    k_dropout<<<blocks_for(total), kThreads, 0, s->stream>>>(a.y, a.x, a.n, k);
    return MGT_CUDA_AFTER(s, "dropout");
}

mgt_status cuda_xent_fwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.xent_fwd;
    mgt_status st = mgt_cuda_scratch(s, (size_t)a.n * sizeof(float));
    if (st != MGT_OK)
        return st;
    float *rowloss = (float *)s->scratch;
    k_xent_rows<<<blocks_for_rows(a.n), kThreads, 0, s->stream>>>(
        rowloss, a.probs, a.logits, a.labels, a.labels_b, a.weights, a.n, a.classes, a.smoothing,
        s->dev->flag_dev, s->dev->claim_dev);
    k_mean_rows<<<1, kThreads, 0, s->stream>>>(a.loss, rowloss, a.n, (double)a.n);
    return MGT_CUDA_AFTER(s, "softmax_xent_forward");
}

mgt_status cuda_xent_bwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.xent_bwd;
    size_t total = (size_t)a.n * a.classes;
    k_xent_bwd<<<blocks_for(total), kThreads, 0, s->stream>>>(
        a.dlogits, a.probs, a.labels, a.labels_b, a.weights, a.n, a.classes, a.smoothing, a.scale,
        s->dev->flag_dev, s->dev->claim_dev);
    return MGT_CUDA_AFTER(s, "softmax_xent_backward");
}

mgt_status cuda_topk(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.topk;
    k_topk<<<blocks_for_rows(a.n), kThreads, 0, s->stream>>>(
        a.count, a.logits, a.labels, a.n, a.classes, a.k, s->dev->flag_dev, s->dev->claim_dev);
    return MGT_CUDA_AFTER(s, "topk_correct");
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

// The kind was checked (mgt_op_check): MGT_ACT_COUNT never reaches here.
mgt_status cuda_act_fwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.act_fwd;
    unsigned g = blocks_for(a.n);
    switch (a.act) {
#define ACT_FWD_CASE(KIND, name) \
    case MGT_ACT_##KIND: k_act_fwd<act_##name><<<g, kThreads, 0, s->stream>>>(a.y, a.x, a.n); break;
        MGT_ACT_LIST(ACT_FWD_CASE)
#undef ACT_FWD_CASE
    case MGT_ACT_COUNT: break;
    }
    return MGT_CUDA_AFTER(s, "activation_forward");
}

mgt_status cuda_act_bwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.act_bwd;
    unsigned g = blocks_for(a.n);
    switch (a.act) {
#define ACT_BWD_CASE(KIND, name)                                                    \
    case MGT_ACT_##KIND:                                                            \
        k_act_bwd<act_##name><<<g, kThreads, 0, s->stream>>>(a.dx, a.dy, a.x, a.n); \
        break;
        MGT_ACT_LIST(ACT_BWD_CASE)
#undef ACT_BWD_CASE
    case MGT_ACT_COUNT: break;
    }
    return MGT_CUDA_AFTER(s, "activation_backward");
}

mgt_status cuda_lnc_fwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.lnc_fwd;
    size_t pixels = (size_t)a.n * a.hw;
    k_lnc_fwd<<<blocks_for(pixels), kThreads, 0, s->stream>>>(a.y, a.x, a.weight, a.bias, a.n, a.c,
                                                              a.hw, a.eps);
    return MGT_CUDA_AFTER(s, "layernorm_channels_forward");
}

mgt_status cuda_lnc_bwd(mgt_cuda_stream *s, const mgt_op *op)
{
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

mgt_status cuda_chscale_fwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.chscale_fwd;
    size_t total = (size_t)a.n * a.c * a.hw;
    k_chscale_fwd<<<blocks_for(total), kThreads, 0, s->stream>>>(a.y, a.x, a.scale, total, a.c,
                                                                 a.hw, a.shared);
    return MGT_CUDA_AFTER(s, "channel_scale_forward");
}

mgt_status cuda_chscale_bwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.chscale_bwd;
    unsigned grid = (unsigned)(a.shared ? a.c : a.n * a.c);
    k_chscale_bwd<<<grid, kThreads, 0, s->stream>>>(a.dx, a.dscale, a.dy, a.x, a.scale, a.n, a.c,
                                                    a.hw, a.shared);
    return MGT_CUDA_AFTER(s, "channel_scale_backward");
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
