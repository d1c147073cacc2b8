// The CUDA backend's transformer ops: the general strided copy (permute), attention forward and
// backward, the relative position bias's gather and segment sum, and the row path of the layer
// norm (hw == 1: LayerNorm over the last dimension), with the exact semantics of mgt/device.h.
//
// Attention with a head size up to 128 runs fused, flash-attention style (k_flash_*: a warp
// per query row, keys and values through shared memory in tiles of 32, an online softmax in
// fp32; forward keeps only each row's log-sum-exp, backward recomputes the probabilities from
// it in two passes, dq by query rows, then dk and dv by key rows, without atomics). A larger
// head runs its products on cuBLAS (strided-batched SGEMM over the groups, one call per head,
// reading q, k, v and writing y, dq, dk, dv in place through the row strides) and everything
// between them in fused row kernels (one warp per query row: bias, mask, the softmax, the
// saved log-sum-exp, dropout; in backward the probabilities from the log-sum-exp, D = dy . y
// and the logits' gradient), the logits of every group and head in the stream's scratch for
// the call (two such tiles in backward). Swin V2's cosine attention normalizes q and k into
// unit copies first on either path. Every kernel is deterministic (no floating-point atomics;
// reductions in an order fixed by the sizes).
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

// ---- fused attention (flash-attention style), head size up to 128 ----
// A block is kFlashRows warps of one group and head, a warp to a query row (forward, and the
// dq pass of backward) or a key row (backward's dk and dv pass); the other side streams
// through shared memory in tiles of kFlashTile rows, a lane to each row of the tile. The
// softmax is online (running max and sum, fp32) and the logits never reach memory: forward
// keeps each row's log-sum-exp, backward recomputes the probabilities from it, once per pass.
// Every output element is one thread's sum in a fixed order: no atomics, the same bits on
// every run. DH is the head size rounded up to 32, 64 or 128 (lane + 32 i < dh are used).

constexpr int kFlashRows = 8;  // warps of a block
constexpr int kFlashTile = 32; // rows of a shared-memory tile: a lane each

// What the fused kernels read and write: q and k through qk_view (the unit copies under
// cosine), v, y and dy through the op's strides; dq and dk through their own (the unit
// gradients' under cosine), dv through k's and v's.
struct flash_io {
    const float *q, *k, *v, *y, *dy;
    size_t q_batch, q_row, k_batch, k_row, v_batch, v_row, y_batch, y_row;
    float *out, *lse_out; // forward: y and each row's log-sum-exp [batch, heads, tq]
    const float *lse;     // backward: the forward's
    float *dd;            // backward: D = dy . y per row [batch, heads, tq], scratch
    float *dq, *dk, *dv;
    size_t dq_batch, dq_row, dk_batch, dk_row;
    float *dsum; // optional: the logits' gradient [batch, heads, tq, tk] (for dbias)
    float *dls;  // optional (cosine): each row's share of d logit_scale [batch, heads, tq]
    const float *bias, *mask, *logit_scale;
};

// A tile of kFlashTile rows (row r = row r0 + r of the tensor) into s, the columns past dh
// and the rows past n 0.
template <int DH>
__device__ inline void flash_load(float (*s)[DH + 1], const float *x, size_t batch_off, size_t row,
                                  int r0, int n, int dh)
{
    for (int i = threadIdx.x; i < kFlashTile * DH; i += kFlashRows * 32) {
        const int r = i / DH, d = i % DH, at = r0 + r;
        s[r][d] = at < n && d < dh ? x[batch_off + (size_t)at * row + d] : 0.0f;
    }
}

// s . t over d < dh, in order of d.
__device__ inline float flash_dot(const float *s, const float *t, int dh)
{
    float acc = 0.0f;
    for (int d = 0; d < dh; d++)
        acc += s[d] * t[d];
    return acc;
}

template <int DH>
__global__ void __launch_bounds__(kFlashRows * 32) k_flash_fwd(flash_io io, attn_desc a)
{
    __shared__ float sk[kFlashTile][DH + 1], sv[kFlashTile][DH + 1]; // +1: no bank conflicts
    __shared__ float sq[kFlashRows][DH];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int q_tiles = (a.tq + kFlashRows - 1) / kFlashRows;
    const int bh = blockIdx.x / q_tiles, b = bh / a.heads, h = bh % a.heads;
    const int t = (blockIdx.x % q_tiles) * kFlashRows + warp;
    const bool live = t < a.tq; // the same for the whole warp
    const size_t ho = (size_t)h * a.dh;
    for (int d = lane; d < DH; d += 32)
        sq[warp][d] =
            live && d < a.dh ? io.q[(size_t)b * io.q_batch + (size_t)t * io.q_row + ho + d] : 0.0f;
    const float sg = a.scale * head_gain(a, io.logit_scale, h);
    float m = -INFINITY, l = 0.0f, acc[DH / 32];
#pragma unroll
    for (int i = 0; i < DH / 32; i++)
        acc[i] = 0.0f;
    for (int u0 = 0; u0 < a.tk; u0 += kFlashTile) {
        __syncthreads(); // the last tile is used up (and sq written, the first time)
        flash_load<DH>(sk, io.k, (size_t)b * io.k_batch + ho, io.k_row, u0, a.tk, a.dh);
        flash_load<DH>(sv, io.v, (size_t)b * io.v_batch + ho, io.v_row, u0, a.tk, a.dh);
        __syncthreads();
        if (!live)
            continue;
        const int u = u0 + lane, nk = min(kFlashTile, a.tk - u0);
        float s = -INFINITY;
        if (u < a.tk)
            s = flash_dot(sq[warp], sk[lane], a.dh) * sg +
                attn_extra(a, io.bias, io.mask, b, h, (size_t)t * a.tk + u);
        const float mn = fmaxf(m, warp_max(s)); // finite: lane 0's key exists
        const float p = u < a.tk ? expf(s - mn) : 0.0f;
        const float corr = m == -INFINITY ? 0.0f : expf(m - mn);
        l = l * corr + warp_sum(p);
        const float pf = u < a.tk ? p * attn_drop(a, b, h, t, u) : 0.0f;
#pragma unroll
        for (int i = 0; i < DH / 32; i++)
            acc[i] *= corr;
        for (int j = 0; j < nk; j++) {
            const float pj = __shfl_sync(kFullMask, pf, j);
#pragma unroll
            for (int i = 0; i < DH / 32; i++)
                acc[i] += pj * sv[j][lane + 32 * i];
        }
        m = mn;
    }
    if (!live)
        return;
    const size_t row = ((size_t)b * a.heads + h) * a.tq + t;
    if (lane == 0)
        io.lse_out[row] = m + logf(l);
    float *y = io.out + (size_t)b * io.y_batch + (size_t)t * io.y_row + ho;
#pragma unroll
    for (int i = 0; i < DH / 32; i++)
        if (lane + 32 * i < a.dh)
            y[lane + 32 * i] = acc[i] / l;
}

// Backward's first pass, a warp to a query row: D = dy . y (kept for the second pass), the
// logits' gradient ds = p (f dy . v - D) of each key (into dsum for dbias; its share of
// d logit_scale under cosine) and dq = sum over keys of ds scale gain k.
template <int DH>
__global__ void __launch_bounds__(kFlashRows * 32) k_flash_bwd_q(flash_io io, attn_desc a)
{
    __shared__ float sk[kFlashTile][DH + 1], sv[kFlashTile][DH + 1];
    __shared__ float sq[kFlashRows][DH], sdy[kFlashRows][DH];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int q_tiles = (a.tq + kFlashRows - 1) / kFlashRows;
    const int bh = blockIdx.x / q_tiles, b = bh / a.heads, h = bh % a.heads;
    const int t = (blockIdx.x % q_tiles) * kFlashRows + warp;
    const bool live = t < a.tq;
    const size_t ho = (size_t)h * a.dh, row = ((size_t)b * a.heads + h) * a.tq + t;
    const size_t yo = (size_t)b * io.y_batch + (size_t)t * io.y_row + ho;
    float dd = 0.0f;
    for (int d = lane; d < DH; d += 32) {
        const bool in = live && d < a.dh;
        sq[warp][d] = in ? io.q[(size_t)b * io.q_batch + (size_t)t * io.q_row + ho + d] : 0.0f;
        sdy[warp][d] = in ? io.dy[yo + d] : 0.0f;
        if (in)
            dd += io.dy[yo + d] * io.y[yo + d];
    }
    dd = warp_sum(dd);
    if (live && lane == 0)
        io.dd[row] = dd;
    const float sg = a.scale * head_gain(a, io.logit_scale, h);
    const float l0 = live ? io.lse[row] : 0.0f;
    float part = 0.0f, acc[DH / 32];
#pragma unroll
    for (int i = 0; i < DH / 32; i++)
        acc[i] = 0.0f;
    for (int u0 = 0; u0 < a.tk; u0 += kFlashTile) {
        __syncthreads();
        flash_load<DH>(sk, io.k, (size_t)b * io.k_batch + ho, io.k_row, u0, a.tk, a.dh);
        flash_load<DH>(sv, io.v, (size_t)b * io.v_batch + ho, io.v_row, u0, a.tk, a.dh);
        __syncthreads();
        if (!live)
            continue;
        const int u = u0 + lane, nk = min(kFlashTile, a.tk - u0);
        float ds = 0.0f;
        if (u < a.tk) {
            const float raw = flash_dot(sq[warp], sk[lane], a.dh) * sg;
            const float p =
                expf(raw + attn_extra(a, io.bias, io.mask, b, h, (size_t)t * a.tk + u) - l0);
            const float dp = flash_dot(sdy[warp], sv[lane], a.dh);
            ds = p * (dp * attn_drop(a, b, h, t, u) - dd);
            part += ds * raw;
            if (io.dsum)
                io.dsum[row * a.tk + u] = ds;
        }
        for (int j = 0; j < nk; j++) {
            const float dj = __shfl_sync(kFullMask, ds, j) * sg;
#pragma unroll
            for (int i = 0; i < DH / 32; i++)
                acc[i] += dj * sk[j][lane + 32 * i];
        }
    }
    if (!live)
        return;
    part = warp_sum(part);
    if (io.dls && lane == 0)
        io.dls[row] = part;
    float *dq = io.dq + (size_t)b * io.dq_batch + (size_t)t * io.dq_row + ho;
#pragma unroll
    for (int i = 0; i < DH / 32; i++)
        if (lane + 32 * i < a.dh)
            dq[lane + 32 * i] = acc[i];
}

// Backward's second pass, a warp to a key row: dv = sum over queries of p f dy and
// dk = sum of ds scale gain q, with p and ds recomputed as the first pass has them (the same
// products in the same order: the same bits) from lse and its D.
template <int DH>
__global__ void __launch_bounds__(kFlashRows * 32) k_flash_bwd_kv(flash_io io, attn_desc a)
{
    __shared__ float sq[kFlashTile][DH + 1], sdy[kFlashTile][DH + 1];
    __shared__ float slse[kFlashTile], sdd[kFlashTile];
    __shared__ float sk[kFlashRows][DH], sv[kFlashRows][DH];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int k_tiles = (a.tk + kFlashRows - 1) / kFlashRows;
    const int bh = blockIdx.x / k_tiles, b = bh / a.heads, h = bh % a.heads;
    const int u = (blockIdx.x % k_tiles) * kFlashRows + warp;
    const bool live = u < a.tk;
    const size_t ho = (size_t)h * a.dh, rows0 = ((size_t)b * a.heads + h) * a.tq;
    for (int d = lane; d < DH; d += 32) {
        const bool in = live && d < a.dh;
        sk[warp][d] = in ? io.k[(size_t)b * io.k_batch + (size_t)u * io.k_row + ho + d] : 0.0f;
        sv[warp][d] = in ? io.v[(size_t)b * io.v_batch + (size_t)u * io.v_row + ho + d] : 0.0f;
    }
    const float sg = a.scale * head_gain(a, io.logit_scale, h);
    float dka[DH / 32], dva[DH / 32];
#pragma unroll
    for (int i = 0; i < DH / 32; i++)
        dka[i] = dva[i] = 0.0f;
    for (int t0 = 0; t0 < a.tq; t0 += kFlashTile) {
        __syncthreads();
        flash_load<DH>(sq, io.q, (size_t)b * io.q_batch + ho, io.q_row, t0, a.tq, a.dh);
        flash_load<DH>(sdy, io.dy, (size_t)b * io.y_batch + ho, io.y_row, t0, a.tq, a.dh);
        if (threadIdx.x < kFlashTile) {
            const int t = t0 + (int)threadIdx.x;
            slse[threadIdx.x] = t < a.tq ? io.lse[rows0 + t] : 0.0f;
            sdd[threadIdx.x] = t < a.tq ? io.dd[rows0 + t] : 0.0f;
        }
        __syncthreads();
        if (!live)
            continue;
        const int t = t0 + lane, nq = min(kFlashTile, a.tq - t0);
        float ds = 0.0f, pf = 0.0f;
        if (t < a.tq) {
            const float raw = flash_dot(sq[lane], sk[warp], a.dh) * sg;
            const float p = expf(raw + attn_extra(a, io.bias, io.mask, b, h, (size_t)t * a.tk + u) -
                                 slse[lane]);
            const float f = attn_drop(a, b, h, t, u);
            const float dp = flash_dot(sdy[lane], sv[warp], a.dh);
            ds = p * (dp * f - sdd[lane]);
            pf = p * f;
        }
        for (int j = 0; j < nq; j++) {
            const float pj = __shfl_sync(kFullMask, pf, j);
            const float dj = __shfl_sync(kFullMask, ds, j) * sg;
#pragma unroll
            for (int i = 0; i < DH / 32; i++) {
                dva[i] += pj * sdy[j][lane + 32 * i];
                dka[i] += dj * sq[j][lane + 32 * i];
            }
        }
    }
    if (!live)
        return;
    float *dk = io.dk + (size_t)b * io.dk_batch + (size_t)u * io.dk_row + ho;
    float *dv = io.dv + (size_t)b * io.v_batch + (size_t)u * io.v_row + ho;
#pragma unroll
    for (int i = 0; i < DH / 32; i++)
        if (lane + 32 * i < a.dh) {
            dk[lane + 32 * i] = dka[i];
            dv[lane + 32 * i] = dva[i];
        }
}

// The fused kernels' head-size template for dh, or 0 where dh > 128 (the cuBLAS path).
int flash_dh(int dh) { return dh <= 32 ? 32 : dh <= 64 ? 64 : dh <= 128 ? 128 : 0; }

unsigned flash_blocks(const mgt_attn_shape &sh, int rows)
{
    return (unsigned)((long)sh.batch * sh.heads * ((rows + kFlashRows - 1) / kFlashRows));
}

void flash_fwd(mgt_cuda_stream *s, const mgt_attn_shape &sh, const flash_io &io, const attn_desc &d)
{
    const unsigned n = flash_blocks(sh, sh.tq), th = kFlashRows * 32;
    switch (flash_dh(sh.dh)) {
    case 32: k_flash_fwd<32><<<n, th, 0, s->stream>>>(io, d); break;
    case 64: k_flash_fwd<64><<<n, th, 0, s->stream>>>(io, d); break;
    default: k_flash_fwd<128><<<n, th, 0, s->stream>>>(io, d); break;
    }
}

void flash_bwd(mgt_cuda_stream *s, const mgt_attn_shape &sh, const flash_io &io, const attn_desc &d)
{
    const unsigned nq = flash_blocks(sh, sh.tq), nk = flash_blocks(sh, sh.tk);
    const unsigned th = kFlashRows * 32;
    switch (flash_dh(sh.dh)) {
    case 32:
        k_flash_bwd_q<32><<<nq, th, 0, s->stream>>>(io, d);
        k_flash_bwd_kv<32><<<nk, th, 0, s->stream>>>(io, d);
        break;
    case 64:
        k_flash_bwd_q<64><<<nq, th, 0, s->stream>>>(io, d);
        k_flash_bwd_kv<64><<<nk, th, 0, s->stream>>>(io, d);
        break;
    default:
        k_flash_bwd_q<128><<<nq, th, 0, s->stream>>>(io, d);
        k_flash_bwd_kv<128><<<nk, th, 0, s->stream>>>(io, d);
        break;
    }
}

// The fields of flash_io both directions read: q and k as v (the view) has them, the op's v
// and y strides, bias, mask and logit_scale.
flash_io flash_inputs(const mgt_attn_shape &sh, const qk_view &v, const float *vv,
                      const float *bias, const float *mask, const float *logit_scale)
{
    flash_io io = {};
    io.q = v.q;
    io.k = v.k;
    io.q_batch = v.q_batch;
    io.q_row = v.q_row;
    io.k_batch = v.kv_batch;
    io.k_row = v.kv_row;
    io.v = vv;
    io.v_batch = sh.kv_batch;
    io.v_row = sh.kv_row;
    io.y_batch = sh.y_batch;
    io.y_row = sh.y_row;
    io.bias = bias;
    io.mask = mask;
    io.logit_scale = logit_scale;
    return io;
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
    if (flash_dh(sh.dh)) { /* fused: no logits in memory */
        size_t units = sh.cosine ? unit_floats(sh) * sizeof(float) : 0;
        mgt_status st = units ? mgt_cuda_scratch(s, units) : MGT_OK;
        if (st != MGT_OK)
            return st;
        qk_view v = view_qk(s, sh, a.q, a.k, (float *)s->scratch);
        flash_io io = flash_inputs(sh, v, a.v, a.bias, a.mask, a.logit_scale);
        io.out = a.y;
        io.lse_out = a.lse;
        flash_fwd(s, sh, io, make_desc(sh));
        return MGT_CUDA_AFTER(s, "attention_forward");
    }
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
    const bool fused = flash_dh(sh.dh) != 0;
    size_t hd = (size_t)sh.heads * sh.dh, g = (size_t)sh.batch;
    long rows = (long)sh.batch * sh.heads * sh.tq;
    size_t tile = mgt_cuda_align256((size_t)rows * sh.tk * sizeof(float));
    // the logits and their gradient (the cuBLAS path), the unit copies of q and k, their
    // gradients (cosine), the rows' shares of d logit_scale, the logits' gradient for dbias, and
    // D per row (fused)
    size_t tiles = fused ? 0 : 2 * tile;
    size_t units = sh.cosine ? unit_floats(sh) * sizeof(float) : 0;
    size_t ugrads = sh.cosine ? mgt_cuda_align256((g * sh.tq * hd + g * sh.tk * hd) * 4) : 0;
    size_t dls = sh.cosine ? mgt_cuda_align256((size_t)rows * sizeof(float)) : 0;
    size_t dsum = a.dbias ? tile : 0;
    size_t dd = fused ? mgt_cuda_align256((size_t)rows * sizeof(float)) : 0;
    mgt_status st = fused ? MGT_OK : mgt_cuda_blas(s);
    if (st == MGT_OK)
        st = mgt_cuda_scratch(s, tiles + units + ugrads + dls + dsum + dd);
    if (st != MGT_OK)
        return st;
    char *base = (char *)s->scratch;
    float *sc = (float *)base, *dp = (float *)(base + tile), *u = (float *)(base + tiles);
    float *dqn = (float *)(base + tiles + units), *dkn = dqn + g * sh.tq * hd;
    float *rdls = sh.cosine ? (float *)(base + tiles + units + ugrads) : NULL;
    float *ds = a.dbias ? (float *)(base + tiles + units + ugrads + dls) : NULL;
    float *rdd = (float *)(base + tiles + units + ugrads + dls + dsum);
    qk_view v = view_qk(s, sh, a.q, a.k, u);
    // dq and dk: the unit copies' gradients under cosine (unnormalized below)
    float *dq = sh.cosine ? dqn : a.dq, *dk = sh.cosine ? dkn : a.dk;
    size_t dq_row = sh.cosine ? hd : sh.q_row, dk_row = sh.cosine ? hd : sh.kv_row;
    long long dq_batch = sh.cosine ? (long long)(sh.tq * hd) : (long long)sh.q_batch;
    long long dk_batch = sh.cosine ? (long long)(sh.tk * hd) : (long long)sh.kv_batch;
    attn_desc d = make_desc(sh);
    if (fused) {
        flash_io io = flash_inputs(sh, v, a.v, a.bias, a.mask, a.logit_scale);
        io.y = a.y;
        io.dy = a.dy;
        io.lse = a.lse;
        io.dd = rdd;
        io.dq = dq;
        io.dk = dk;
        io.dv = a.dv;
        io.dq_batch = (size_t)dq_batch;
        io.dq_row = dq_row;
        io.dk_batch = (size_t)dk_batch;
        io.dk_row = dk_row;
        io.dsum = ds;
        io.dls = rdls;
        flash_bwd(s, sh, io, d);
    } else {
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
        k_attn_bwd_rows<<<blocks_for_rows(rows), kThreads, 0, s->stream>>>(
            sc, dp, rdls, ds, a.dy, a.y, sh.y_batch, sh.y_row, a.lse, a.bias, a.mask, a.logit_scale,
            d);
        // dv = p^T dy; dq = ds k; dk = ds^T q (ds already times scale and gain)
        for (int h = 0; h < sh.heads && st == MGT_OK; h++) {
            size_t ho = (size_t)h * sh.dh;
            st = gemm_groups(s, true, false, sh.tk, sh.dh, sh.tq, 1.0f, sc + (size_t)h * tt,
                             (size_t)sh.tk, tt * sh.heads, a.dy + ho, sh.y_row,
                             (long long)sh.y_batch, 0.0f, a.dv + ho, sh.kv_row,
                             (long long)sh.kv_batch, sh.batch);
            if (st == MGT_OK)
                st = gemm_groups(s, false, false, sh.tq, sh.dh, sh.tk, 1.0f, dp + (size_t)h * tt,
                                 (size_t)sh.tk, tt * sh.heads, v.k + ho, v.kv_row,
                                 (long long)v.kv_batch, 0.0f, dq + ho, dq_row, dq_batch, sh.batch);
            if (st == MGT_OK)
                st = gemm_groups(s, true, false, sh.tk, sh.dh, sh.tq, 1.0f, dp + (size_t)h * tt,
                                 (size_t)sh.tk, tt * sh.heads, v.q + ho, v.q_row,
                                 (long long)v.q_batch, 0.0f, dk + ho, dk_row, dk_batch, sh.batch);
        }
        if (st != MGT_OK)
            return st;
    }
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
        k_dbias<<<blocks_for((size_t)sh.heads * sh.tq * sh.tk), kThreads, 0, s->stream>>>(
            a.dbias, ds, sh.batch, sh.heads, (size_t)sh.tq * sh.tk);
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
