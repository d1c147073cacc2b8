// The CUDA backend's transformer ops: the general strided copy (permute), attention forward and
// backward, the relative position bias's gather and segment sum, and the row path of the layer
// norm (hw == 1: LayerNorm over the last dimension), with the exact semantics of mgt/device.h.
//
// Attention runs its products on cuBLAS (strided-batched SGEMM over the groups, one call per
// head, reading q, k, v and writing y, dq, dk, dv in place through the row strides) and
// everything between them in fused row kernels (one warp per query row: bias, mask, the
// softmax, the saved log-sum-exp, dropout; in backward the probabilities from the log-sum-exp,
// D = dy . y and the logits' gradient). The logits of every group and head live in the
// stream's scratch for the duration of the call (two such tiles in backward): every shape
// takes this path. Every kernel is deterministic (no floating-point atomics; reductions in an
// order fixed by the sizes).
#include <cmath>
#include <cstdint>

#include "device/cuda/common.cuh"

namespace {

// ---- permute ----

struct permute_desc {
    int ndim, naxes;
    int size[MGT_PERMUTE_DIMS], axis[MGT_PERMUTE_DIMS], coef[MGT_PERMUTE_DIMS];
    int extent[MGT_PERMUTE_DIMS], shift[MGT_PERMUTE_DIMS], limit[MGT_PERMUTE_DIMS];
    unsigned long long walk_stride[MGT_PERMUTE_DIMS], grid_stride[MGT_PERMUTE_DIMS];
    bool scatter;
};

__global__ void k_permute(float *walk, float *grid, size_t total, permute_desc p)
{
    for (size_t e = thread_index(); e < total; e += thread_stride()) {
        long long idx[MGT_PERMUTE_DIMS];
        for (int a = 0; a < p.naxes; a++)
            idx[a] = p.shift[a];
        size_t r = e, w = 0;
        for (int d = p.ndim - 1; d >= 0; d--) {
            size_t i = r % (size_t)p.size[d];
            r /= (size_t)p.size[d];
            w += i * p.walk_stride[d];
            idx[p.axis[d]] += (long long)i * p.coef[d];
        }
        size_t g = 0;
        bool there = true;
        for (int a = 0; a < p.naxes; a++) {
            long long i = idx[a];
            if (p.extent[a] > 0)
                i = ((i % p.extent[a]) + p.extent[a]) % p.extent[a];
            there = there && i < p.limit[a];
            g += (size_t)i * p.grid_stride[a];
        }
        if (p.scatter) {
            if (there)
                grid[g] = walk[w];
        } else {
            walk[w] = there ? grid[g] : 0.0f;
        }
    }
}

// ---- attention ----

struct attn_desc {
    int batch, heads, tq, tk, dh, masks, gps;
    float scale, drop; // drop: 1 / (1 - p), 0 without dropout
    uint32_t thr, k0, k1, step;
    unsigned long long sample0, stride;
    bool cosine;
};

__device__ inline float head_gain(const attn_desc &a, const float *logit_scale, int h)
{
    return a.cosine ? expf(fminf(logit_scale[h], logf(100.0f))) : 1.0f;
}

// Dropout's factor of element (b, h, t, u): 0 or 1 / (1 - p); 1 without dropout.
__device__ inline float attn_drop(const attn_desc &a, int b, int h, int t, int u)
{
    if (a.drop == 0.0f)
        return 1.0f;
    unsigned long long g = a.sample0 + (unsigned long long)(b / a.gps) * a.stride;
    unsigned long long j =
        (((unsigned long long)(b % a.gps) * a.heads + h) * a.tq + t) * (unsigned long long)a.tk + u;
    uint32_t c[4] = {(uint32_t)(j / 4), a.step, (uint32_t)g,
                     ((uint32_t)(g >> 32) & 0x00FFFFFFu) | (6u << 24)};
    mgt_philox10(c, a.k0, a.k1);
    return (c[j % 4] >> 8) >= a.thr ? a.drop : 0.0f;
}

__device__ inline float attn_extra(const attn_desc &a, const float *bias, const float *mask, int b,
                                   int h, size_t at)
{
    size_t tt = (size_t)a.tq * a.tk;
    float v = 0.0f;
    if (bias)
        v += bias[(size_t)h * tt + at];
    if (mask)
        v += mask[(size_t)(b % a.masks) * tt + at];
    return v;
}

// One warp per row (b, h, t) of s [batch, heads, tq, tk] = scale * q.k: the logits with the
// head's gain, bias and mask, their log-sum-exp, and s overwritten by the probabilities times
// dropout's factors.
__global__ void k_attn_softmax(float *sc, float *lse, const float *bias, const float *mask,
                               const float *logit_scale, attn_desc a)
{
    const int lane = threadIdx.x & 31;
    const long rows = (long)a.batch * a.heads * a.tq;
    for (long row = (long)(thread_index() >> 5); row < rows; row += (long)(thread_stride() >> 5)) {
        const int t = (int)(row % a.tq), h = (int)((row / a.tq) % a.heads);
        const int b = (int)(row / ((long)a.tq * a.heads));
        float *sr = sc + (size_t)row * a.tk;
        const float gain = head_gain(a, logit_scale, h);
        float m = -INFINITY;
        for (int u = lane; u < a.tk; u += 32) {
            float l = sr[u] * gain + attn_extra(a, bias, mask, b, h, (size_t)t * a.tk + u);
            sr[u] = l;
            m = fmaxf(m, l);
        }
        m = warp_max(m);
        float sum = 0.0f;
        for (int u = lane; u < a.tk; u += 32)
            sum += expf(sr[u] - m);
        sum = warp_sum(sum);
        const float ls = m + logf(sum);
        for (int u = lane; u < a.tk; u += 32)
            sr[u] = expf(sr[u] - ls) * attn_drop(a, b, h, t, u);
        if (lane == 0)
            lse[row] = ls;
    }
}

// Backward, one warp per row: from s (scale * q.k), dp (dy . v) and lse: p, then s = p times
// dropout's factor (for dv) and dp = the logits' gradient times scale * gain (what dq and dk
// multiply); dls [rows] the row's share of d logit_scale (cosine), dsum (optional) the logits'
// gradient itself [batch, heads, tq, tk] for dbias.
__global__ void k_attn_bwd_rows(float *sc, float *dp, float *dls, float *dsum, const float *dy,
                                const float *y, size_t y_batch, size_t y_row, const float *lse,
                                const float *bias, const float *mask, const float *logit_scale,
                                attn_desc a)
{
    const int lane = threadIdx.x & 31;
    const long rows = (long)a.batch * a.heads * a.tq;
    for (long row = (long)(thread_index() >> 5); row < rows; row += (long)(thread_stride() >> 5)) {
        const int t = (int)(row % a.tq), h = (int)((row / a.tq) % a.heads);
        const int b = (int)(row / ((long)a.tq * a.heads));
        const size_t yo = (size_t)b * y_batch + (size_t)t * y_row + (size_t)h * a.dh;
        float dd = 0.0f;
        for (int d = lane; d < a.dh; d += 32)
            dd += dy[yo + d] * y[yo + d];
        dd = warp_sum(dd);
        const float gain = head_gain(a, logit_scale, h), l0 = lse[row];
        float *sr = sc + (size_t)row * a.tk, *dr = dp + (size_t)row * a.tk;
        float part = 0.0f;
        for (int u = lane; u < a.tk; u += 32) {
            const float raw = sr[u] * gain; // scale * gain * q.k
            const float p = expf(raw + attn_extra(a, bias, mask, b, h, (size_t)t * a.tk + u) - l0);
            const float f = attn_drop(a, b, h, t, u);
            const float ds = p * (dr[u] * f - dd);
            part += ds * raw;
            if (dsum)
                dsum[(size_t)row * a.tk + u] = ds;
            sr[u] = p * f;
            dr[u] = ds * a.scale * gain;
        }
        part = warp_sum(part);
        if (dls && lane == 0)
            dls[row] = part;
    }
}

// Unit copies: dst [groups, tokens, heads * dh] packed from src's strided vectors, each divided
// by max(|x|, 1e-12); norms [groups, tokens, heads] (one warp per vector).
__global__ void k_unit_rows(float *dst, float *norms, const float *src, size_t batch, size_t row,
                            int groups, int tokens, int heads, int dh)
{
    const int lane = threadIdx.x & 31;
    const long vecs = (long)groups * tokens * heads;
    for (long v = (long)(thread_index() >> 5); v < vecs; v += (long)(thread_stride() >> 5)) {
        const int h = (int)(v % heads), t = (int)((v / heads) % tokens);
        const int g = (int)(v / ((long)heads * tokens));
        const float *x = src + (size_t)g * batch + (size_t)t * row + (size_t)h * dh;
        float sq = 0.0f;
        for (int d = lane; d < dh; d += 32)
            sq += x[d] * x[d];
        const float n = fmaxf(sqrtf(warp_sum(sq)), 1e-12f);
        for (int d = lane; d < dh; d += 32)
            dst[(size_t)v * dh + d] = x[d] / n;
        if (lane == 0)
            norms[v] = n;
    }
}

// The way back: dst's strided vectors = (g - xh (xh . g)) / n, or g / 1e-12 where clamped.
__global__ void k_unnormalize(float *dst, size_t batch, size_t row, const float *g, const float *xh,
                              const float *norms, int groups, int tokens, int heads, int dh)
{
    const int lane = threadIdx.x & 31;
    const long vecs = (long)groups * tokens * heads;
    for (long v = (long)(thread_index() >> 5); v < vecs; v += (long)(thread_stride() >> 5)) {
        const int h = (int)(v % heads), t = (int)((v / heads) % tokens);
        const int gi = (int)(v / ((long)heads * tokens));
        float *o = dst + (size_t)gi * batch + (size_t)t * row + (size_t)h * dh;
        const float *gv = g + (size_t)v * dh, *x = xh + (size_t)v * dh;
        const float n = norms[v];
        float dot = 0.0f;
        for (int d = lane; d < dh; d += 32)
            dot += x[d] * gv[d];
        dot = warp_sum(dot);
        for (int d = lane; d < dh; d += 32)
            o[d] = n <= 1e-12f ? gv[d] / 1e-12f : (gv[d] - x[d] * dot) / n;
    }
}

// dbias [heads, tq * tk] = the sum over groups of dsum, in group order.
__global__ void k_dbias(float *dbias, const float *dsum, int batch, int heads, size_t tt)
{
    const size_t total = (size_t)heads * tt;
    for (size_t e = thread_index(); e < total; e += thread_stride()) {
        double acc = 0.0;
        for (int b = 0; b < batch; b++)
            acc += dsum[(size_t)b * total + e];
        dbias[e] = (float)acc;
    }
}

// dlogit_scale[h] += the sum of the rows' shares of head h (one block per head, a fixed tree),
// where the clamp passes a gradient.
__global__ void k_dlogit_scale(float *dls_out, const float *dls, const float *logit_scale,
                               int batch, int heads, int tq)
{
    __shared__ double part[kThreads];
    const int h = blockIdx.x, t = threadIdx.x;
    double acc = 0.0;
    for (long i = t; i < (long)batch * tq; i += kThreads) {
        const long b = i / tq, q = i % tq;
        acc += dls[((size_t)b * heads + h) * tq + q];
    }
    block_sum(part, acc);
    if (t == 0 && logit_scale[h] <= logf(100.0f))
        dls_out[h] += (float)part[0];
}

// ---- the relative position bias ----

__global__ void k_rpb_fwd(float *bias, const float *table, const int32_t *index, int rows,
                          int heads, int n, float alpha, int *flag, int *claim)
{
    const size_t total = (size_t)heads * n;
    for (size_t e = thread_index(); e < total; e += thread_stride()) {
        const int i = (int)(e % n), h = (int)(e / n), r = index[i];
        if (r < 0 || r >= rows) {
            raise_label_error(flag, claim, MGT_CUDA_FLAG_RPB_INDEX, i, r, rows);
            bias[e] = 0.0f;
            continue;
        }
        bias[e] = alpha * table[(size_t)r * heads + h];
    }
}

__global__ void k_rpb_bwd(float *dtable, const float *dbias, const int32_t *offsets,
                          const int32_t *order, int rows, int heads, int n, float alpha)
{
    const size_t total = (size_t)rows * heads;
    for (size_t e = thread_index(); e < total; e += thread_stride()) {
        const int r = (int)(e / heads), h = (int)(e % heads);
        double acc = 0.0;
        for (int q = offsets[r]; q < offsets[r + 1]; q++) {
            const int i = order[q];
            if (i >= 0 && i < n)
                acc += dbias[(size_t)h * n + i];
        }
        dtable[e] = (float)(dtable[e] + (double)alpha * acc);
    }
}

// ---- the layer norm's row path: x [rows, c], a warp per row, statistics in double ----

__device__ inline void row_stats(const float *x, int c, float eps, double *mean, double *rstd)
{
    const int lane = threadIdx.x & 31;
    double m = 0.0;
    for (int j = lane; j < c; j += 32)
        m += x[j];
    for (int off = 16; off > 0; off >>= 1)
        m += __shfl_xor_sync(kFullMask, m, off);
    m /= c;
    double v = 0.0;
    for (int j = lane; j < c; j += 32) {
        double d = x[j] - m;
        v += d * d;
    }
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(kFullMask, v, off);
    *mean = m;
    *rstd = 1.0 / sqrt(v / c + (double)eps);
}

__global__ void k_ln_rows_fwd(float *y, const float *x, const float *w, const float *b, long rows,
                              int c, float eps)
{
    const int lane = threadIdx.x & 31;
    for (long r = (long)(thread_index() >> 5); r < rows; r += (long)(thread_stride() >> 5)) {
        const float *xr = x + (size_t)r * c;
        double m, rs;
        row_stats(xr, c, eps, &m, &rs);
        for (int j = lane; j < c; j += 32)
            y[(size_t)r * c + j] = (float)((xr[j] - m) * rs * w[j] + b[j]);
    }
}

// dx per row; stats [rows][2] keeps each row's mean and rstd for the parameter sums.
__global__ void k_ln_rows_bwd(float *dx, double *stats, const float *dy, const float *x,
                              const float *w, long rows, int c, float eps)
{
    const int lane = threadIdx.x & 31;
    for (long r = (long)(thread_index() >> 5); r < rows; r += (long)(thread_stride() >> 5)) {
        const float *xr = x + (size_t)r * c, *dyr = dy + (size_t)r * c;
        double m, rs, mg = 0.0, mgx = 0.0;
        row_stats(xr, c, eps, &m, &rs);
        for (int j = lane; j < c; j += 32) {
            double g = (double)dyr[j] * w[j];
            mg += g;
            mgx += g * (xr[j] - m) * rs;
        }
        for (int off = 16; off > 0; off >>= 1) {
            mg += __shfl_xor_sync(kFullMask, mg, off);
            mgx += __shfl_xor_sync(kFullMask, mgx, off);
        }
        mg /= c;
        mgx /= c;
        for (int j = lane; j < c; j += 32) {
            double g = (double)dyr[j] * w[j];
            dx[(size_t)r * c + j] = (float)(rs * (g - mg - (xr[j] - m) * rs * mgx));
        }
        if (lane == 0) {
            stats[2 * r] = m;
            stats[2 * r + 1] = rs;
        }
    }
}

// partial [chunks][2c]: each chunk's (of `per` rows) sums of dy * xhat and dy per channel
// (thread per channel).
__global__ void k_ln_rows_partial(double *partial, const float *dy, const float *x,
                                  const double *stats, long rows, int c, long per)
{
    const long chunk = blockIdx.y;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < c; j += gridDim.x * blockDim.x) {
        double sw = 0.0, sb = 0.0;
        for (long r = chunk * per; r < rows && r < (chunk + 1) * per; r++) {
            const double g = dy[(size_t)r * c + j];
            sw += g * (x[(size_t)r * c + j] - stats[2 * r]) * stats[2 * r + 1];
            sb += g;
        }
        partial[(size_t)chunk * 2 * c + j] = sw;
        partial[(size_t)chunk * 2 * c + c + j] = sb;
    }
}

__global__ void k_ln_rows_params(float *dw, float *db, const double *partial, long chunks, int c)
{
    for (size_t j = thread_index(); j < (size_t)c; j += thread_stride()) {
        double sw = 0.0, sb = 0.0;
        for (long k = 0; k < chunks; k++) {
            sw += partial[(size_t)k * 2 * c + j];
            sb += partial[(size_t)k * 2 * c + c + j];
        }
        dw[j] += (float)sw;
        db[j] += (float)sb;
    }
}

// ---- the products on cuBLAS ----

// Row-major C [m, n] = alpha op(A) op(B) + beta C for each group g < count, A, B and C
// advancing by sa, sb, sc per group: one strided-batched SGEMM (column-major, hence the
// operands swapped, as gemm_f32 in dnn.cu).
mgt_status gemm_groups(mgt_cuda_stream *s, bool ta, bool tb, int m, int n, int k, float alpha,
                       const float *a, size_t lda, long long sa, const float *b, size_t ldb,
                       long long sb, float beta, float *c, size_t ldc, long long sc, int count)
{
    MGT_CUBLAS_TRY(s->dev, cublasSgemmStridedBatched(s->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                     ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
                                                     &alpha, b, (int)ldb, sb, a, (int)lda, sa,
                                                     &beta, c, (int)ldc, sc, count));
    return MGT_OK;
}

attn_desc make_desc(const mgt_attn_shape &sh)
{
    attn_desc a;
    a.batch = sh.batch;
    a.heads = sh.heads;
    a.tq = sh.tq;
    a.tk = sh.tk;
    a.dh = sh.dh;
    a.masks = sh.masks > 0 ? sh.masks : 1;
    a.gps = sh.groups_per_sample;
    a.scale = sh.scale;
    a.drop = sh.p > 0.0f ? 1.0f / (1.0f - sh.p) : 0.0f;
    a.thr = mgt_dropout_threshold(sh.p);
    a.k0 = (uint32_t)sh.key.seed;
    a.k1 = (uint32_t)(sh.key.seed >> 32) ^ (sh.key.stream * 0x9E3779B9u);
    a.step = (uint32_t)sh.key.step;
    a.sample0 = sh.key.sample0;
    a.stride = sh.key.sample_stride;
    a.cosine = sh.cosine;
    return a;
}

// Where q and k are read from: the op's own strided tensors, or their packed unit copies.
struct qk_view {
    const float *q, *k;
    size_t q_batch, q_row, kv_batch, kv_row;
};

// Floats of the packed unit copies of q and k and of their norms.
size_t unit_floats(const mgt_attn_shape &sh)
{
    size_t hd = (size_t)sh.heads * sh.dh, g = (size_t)sh.batch;
    return mgt_cuda_align256(
               (g * sh.tq * hd + g * sh.tk * hd + g * sh.tq * sh.heads + g * sh.tk * sh.heads) *
               sizeof(float)) /
           sizeof(float);
}

// The unit copies into u (cosine), or the op's q and k as they are.
qk_view view_qk(mgt_cuda_stream *s, const mgt_attn_shape &sh, const float *q, const float *k,
                float *u)
{
    qk_view v = {q, k, sh.q_batch, sh.q_row, sh.kv_batch, sh.kv_row};
    if (!sh.cosine)
        return v;
    size_t hd = (size_t)sh.heads * sh.dh, g = (size_t)sh.batch;
    float *qn = u, *kn = qn + g * sh.tq * hd, *qnorm = kn + g * sh.tk * hd;
    float *knorm = qnorm + g * sh.tq * sh.heads;
    k_unit_rows<<<blocks_for_rows((long)g * sh.tq * sh.heads), kThreads, 0, s->stream>>>(
        qn, qnorm, q, sh.q_batch, sh.q_row, sh.batch, sh.tq, sh.heads, sh.dh);
    k_unit_rows<<<blocks_for_rows((long)g * sh.tk * sh.heads), kThreads, 0, s->stream>>>(
        kn, knorm, k, sh.kv_batch, sh.kv_row, sh.batch, sh.tk, sh.heads, sh.dh);
    return {qn, kn, (size_t)sh.tq * hd, hd, (size_t)sh.tk * hd, hd};
}

// sc [batch, heads, tq, tk] = scale * q k^T, one strided-batched call per head.
mgt_status attn_scores(mgt_cuda_stream *s, const mgt_attn_shape &sh, const qk_view &v, float *sc)
{
    long long tt = (long long)sh.tq * sh.tk;
    for (int h = 0; h < sh.heads; h++) {
        mgt_status st = gemm_groups(s, false, true, sh.tq, sh.tk, sh.dh, sh.scale,
                                    v.q + (size_t)h * sh.dh, v.q_row, (long long)v.q_batch,
                                    v.k + (size_t)h * sh.dh, v.kv_row, (long long)v.kv_batch, 0.0f,
                                    sc + (size_t)h * tt, (size_t)sh.tk, tt * sh.heads, sh.batch);
        if (st != MGT_OK)
            return st;
    }
    return MGT_OK;
}

} // namespace

mgt_status cuda_permute(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const mgt_permute_shape &sh = op->u.permute.sh;
    permute_desc p;
    p.ndim = sh.ndim;
    p.naxes = sh.naxes;
    size_t total = 1;
    for (int d = 0; d < MGT_PERMUTE_DIMS; d++) {
        p.size[d] = sh.size[d];
        p.axis[d] = sh.axis[d];
        p.coef[d] = sh.coef[d];
        p.extent[d] = sh.extent[d];
        p.shift[d] = sh.shift[d];
        p.limit[d] = sh.limit[d];
        p.walk_stride[d] = sh.walk_stride[d];
        p.grid_stride[d] = sh.grid_stride[d];
        if (d < sh.ndim)
            total *= (size_t)sh.size[d];
    }
    p.scatter = sh.scatter;
    k_permute<<<blocks_for(total), kThreads, 0, s->stream>>>(op->u.permute.walk, op->u.permute.grid,
                                                             total, p);
    return MGT_CUDA_AFTER(s, "permute");
}

mgt_status cuda_attn_fwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.attn_fwd;
    const mgt_attn_shape &sh = a.sh;
    mgt_status st = mgt_cuda_blas(s);
    size_t tiles = mgt_cuda_align256((size_t)sh.batch * sh.heads * sh.tq * sh.tk * sizeof(float));
    size_t units = sh.cosine ? unit_floats(sh) * sizeof(float) : 0;
    if (st == MGT_OK)
        st = mgt_cuda_scratch(s, tiles + units);
    if (st != MGT_OK)
        return st;
    float *sc = (float *)s->scratch, *u = (float *)((char *)s->scratch + tiles);
    qk_view v = view_qk(s, sh, a.q, a.k, u);
    st = attn_scores(s, sh, v, sc);
    if (st != MGT_OK)
        return st;
    attn_desc d = make_desc(sh);
    long rows = (long)sh.batch * sh.heads * sh.tq;
    k_attn_softmax<<<blocks_for_rows(rows), kThreads, 0, s->stream>>>(sc, a.lse, a.bias, a.mask,
                                                                      a.logit_scale, d);
    long long tt = (long long)sh.tq * sh.tk;
    for (int h = 0; h < sh.heads && st == MGT_OK; h++)
        st = gemm_groups(s, false, false, sh.tq, sh.dh, sh.tk, 1.0f, sc + (size_t)h * tt,
                         (size_t)sh.tk, tt * sh.heads, a.v + (size_t)h * sh.dh, sh.kv_row,
                         (long long)sh.kv_batch, 0.0f, a.y + (size_t)h * sh.dh, sh.y_row,
                         (long long)sh.y_batch, sh.batch);
    if (st != MGT_OK)
        return st;
    return MGT_CUDA_AFTER(s, "attention_forward");
}

mgt_status cuda_attn_bwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.attn_bwd;
    const mgt_attn_shape &sh = a.sh;
    size_t hd = (size_t)sh.heads * sh.dh, g = (size_t)sh.batch;
    long rows = (long)sh.batch * sh.heads * sh.tq;
    size_t tile = mgt_cuda_align256((size_t)rows * sh.tk * sizeof(float));
    size_t units = sh.cosine ? unit_floats(sh) * sizeof(float) : 0;
    // the unit gradients of q and k (cosine) and the rows' shares of d logit_scale
    size_t ugrads = sh.cosine ? mgt_cuda_align256((g * sh.tq * hd + g * sh.tk * hd) * 4) : 0;
    size_t dls = sh.cosine ? mgt_cuda_align256((size_t)rows * sizeof(float)) : 0;
    size_t dsum = a.dbias ? tile : 0;
    mgt_status st = mgt_cuda_blas(s);
    if (st == MGT_OK)
        st = mgt_cuda_scratch(s, 2 * tile + units + ugrads + dls + dsum);
    if (st != MGT_OK)
        return st;
    char *base = (char *)s->scratch;
    float *sc = (float *)base, *dp = (float *)(base + tile), *u = (float *)(base + 2 * tile);
    float *dqn = (float *)(base + 2 * tile + units), *dkn = dqn + g * sh.tq * hd;
    float *rdls = sh.cosine ? (float *)(base + 2 * tile + units + ugrads) : NULL;
    float *ds = a.dbias ? (float *)(base + 2 * tile + units + ugrads + dls) : NULL;
    qk_view v = view_qk(s, sh, a.q, a.k, u);
    st = attn_scores(s, sh, v, sc);
    long long tt = (long long)sh.tq * sh.tk;
    // dp = dy v^T
    for (int h = 0; h < sh.heads && st == MGT_OK; h++)
        st = gemm_groups(s, false, true, sh.tq, sh.tk, sh.dh, 1.0f, a.dy + (size_t)h * sh.dh,
                         sh.y_row, (long long)sh.y_batch, a.v + (size_t)h * sh.dh, sh.kv_row,
                         (long long)sh.kv_batch, 0.0f, dp + (size_t)h * tt, (size_t)sh.tk,
                         tt * sh.heads, sh.batch);
    if (st != MGT_OK)
        return st;
    attn_desc d = make_desc(sh);
    k_attn_bwd_rows<<<blocks_for_rows(rows), kThreads, 0, s->stream>>>(
        sc, dp, rdls, ds, a.dy, a.y, sh.y_batch, sh.y_row, a.lse, a.bias, a.mask, a.logit_scale, d);
    // dv = p^T dy; dq = ds k; dk = ds^T q (ds already times scale and gain)
    float *dq = sh.cosine ? dqn : a.dq, *dk = sh.cosine ? dkn : a.dk;
    size_t dq_row = sh.cosine ? hd : sh.q_row, dk_row = sh.cosine ? hd : sh.kv_row;
    long long dq_batch = sh.cosine ? (long long)(sh.tq * hd) : (long long)sh.q_batch;
    long long dk_batch = sh.cosine ? (long long)(sh.tk * hd) : (long long)sh.kv_batch;
    for (int h = 0; h < sh.heads && st == MGT_OK; h++) {
        size_t ho = (size_t)h * sh.dh;
        st = gemm_groups(s, true, false, sh.tk, sh.dh, sh.tq, 1.0f, sc + (size_t)h * tt,
                         (size_t)sh.tk, tt * sh.heads, a.dy + ho, sh.y_row, (long long)sh.y_batch,
                         0.0f, a.dv + ho, sh.kv_row, (long long)sh.kv_batch, sh.batch);
        if (st == MGT_OK)
            st = gemm_groups(s, false, false, sh.tq, sh.dh, sh.tk, 1.0f, dp + (size_t)h * tt,
                             (size_t)sh.tk, tt * sh.heads, v.k + ho, v.kv_row,
                             (long long)v.kv_batch, 0.0f, dq + ho, dq_row, dq_batch, sh.batch);
        if (st == MGT_OK)
            st = gemm_groups(s, true, false, sh.tk, sh.dh, sh.tq, 1.0f, dp + (size_t)h * tt,
                             (size_t)sh.tk, tt * sh.heads, v.q + ho, v.q_row, (long long)v.q_batch,
                             0.0f, dk + ho, dk_row, dk_batch, sh.batch);
    }
    if (st != MGT_OK)
        return st;
    if (sh.cosine) {
        const float *qn = u, *kn = qn + g * sh.tq * hd, *qnorm = kn + g * sh.tk * hd;
        const float *knorm = qnorm + g * sh.tq * sh.heads;
        k_unnormalize<<<blocks_for_rows((long)g * sh.tq * sh.heads), kThreads, 0, s->stream>>>(
            a.dq, sh.q_batch, sh.q_row, dqn, qn, qnorm, sh.batch, sh.tq, sh.heads, sh.dh);
        k_unnormalize<<<blocks_for_rows((long)g * sh.tk * sh.heads), kThreads, 0, s->stream>>>(
            a.dk, sh.kv_batch, sh.kv_row, dkn, kn, knorm, sh.batch, sh.tk, sh.heads, sh.dh);
        k_dlogit_scale<<<(unsigned)sh.heads, kThreads, 0, s->stream>>>(
            a.dlogit_scale, rdls, a.logit_scale, sh.batch, sh.heads, sh.tq);
    }
    if (a.dbias)
        k_dbias<<<blocks_for((size_t)sh.heads * tt), kThreads, 0, s->stream>>>(
            a.dbias, ds, sh.batch, sh.heads, (size_t)tt);
    return MGT_CUDA_AFTER(s, "attention_backward");
}

mgt_status cuda_rpb_fwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.rpb_fwd;
    k_rpb_fwd<<<blocks_for((size_t)a.heads * a.n), kThreads, 0, s->stream>>>(
        a.bias, a.table, a.index, a.rows, a.heads, a.n, a.alpha, s->dev->flag_dev,
        s->dev->claim_dev);
    return MGT_CUDA_AFTER(s, "relpos_bias_forward");
}

mgt_status cuda_rpb_bwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.rpb_bwd;
    k_rpb_bwd<<<blocks_for((size_t)a.rows * a.heads), kThreads, 0, s->stream>>>(
        a.dtable, a.dbias, a.offsets, a.order, a.rows, a.heads, a.n, a.alpha);
    return MGT_CUDA_AFTER(s, "relpos_bias_backward");
}

mgt_status cuda_ln_rows_fwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.lnc_fwd;
    k_ln_rows_fwd<<<blocks_for_rows(a.n), kThreads, 0, s->stream>>>(a.y, a.x, a.weight, a.bias, a.n,
                                                                    a.c, a.eps);
    return MGT_CUDA_AFTER(s, "layernorm_channels_forward (rows)");
}

mgt_status cuda_ln_rows_bwd(mgt_cuda_stream *s, const mgt_op *op)
{
    MGT_ENTER(s);
    const auto &a = op->u.lnc_bwd;
    // 64 rows per partial sum, more where the grid's 65535 rows of blocks would not hold them
    long per = (long)a.n > 64L * 65535 ? ((long)a.n + 65534) / 65535 : 64;
    long chunks = ((long)a.n + per - 1) / per;
    size_t stats = mgt_cuda_align256((size_t)a.n * 2 * sizeof(double));
    mgt_status st = mgt_cuda_scratch(s, stats + (size_t)chunks * 2 * a.c * sizeof(double));
    if (st != MGT_OK)
        return st;
    double *sd = (double *)s->scratch, *partial = (double *)((char *)s->scratch + stats);
    k_ln_rows_bwd<<<blocks_for_rows(a.n), kThreads, 0, s->stream>>>(a.dx, sd, a.dy, a.x, a.weight,
                                                                    a.n, a.c, a.eps);
    dim3 grid((unsigned)((a.c + kThreads - 1) / kThreads), (unsigned)chunks);
    k_ln_rows_partial<<<grid, kThreads, 0, s->stream>>>(partial, a.dy, a.x, sd, a.n, a.c, per);
    k_ln_rows_params<<<blocks_for((size_t)a.c), kThreads, 0, s->stream>>>(a.dweight, a.dbias,
                                                                          partial, chunks, a.c);
    return MGT_CUDA_AFTER(s, "layernorm_channels_backward (rows)");
}
