// The CUDA backend's softmax cross-entropy (one-hot or mixed labels) and top-k count, with
// the exact semantics of mgt/device.h; a label out of range raises the replica's flag.
//
// Every kernel is deterministic: no floating-point atomics, and each reduction adds in an
// order fixed by the sizes alone, so two runs (and two replicas) give identical bits.
#include <cmath>
#include <cstdint>

#include "device/cuda/common.cuh"

namespace {

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
            above += (v > zy) || (v == zy && j < y) || isnan(v); // NaN first, as torch.topk
        }
        above = warp_sum_int(above);
        if (lane == 0 && above < k && isfinite(zy)) // a non-finite label logit: never correct
            atomicAdd((int *)count, 1);
    }
}

} // namespace

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
