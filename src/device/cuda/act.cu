// The CUDA backend's pointwise activations (MGT_ACT_LIST): one struct per activation with its
// value and derivative in float, and the kernels and launchers every activation shares.
#include <cmath>

#include "device/cuda/common.cuh"

namespace {

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

struct act_tanh {
    __device__ static float fwd(float x) { return tanhf(x); }
    __device__ static float grad(float x)
    {
        float t = tanhf(x);
        return 1.0f - t * t;
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

// The 16-bit storage forms: x and dx stored as store_in, y and dy as store_out; widened,
// computed in fp32, rounded once.
template <class A>
__global__ void k_act_fwd16(void *y, const void *x, size_t n, mgt_sto si, mgt_sto so)
{
    for (size_t i = thread_index(); i < n; i += thread_stride())
        sto_st(y, i, A::fwd(sto_ld(x, i, si)), so);
}

template <class A>
__global__ void k_act_bwd16(void *dx, const void *dy, const void *x, size_t n, mgt_sto si,
                            mgt_sto so)
{
    for (size_t i = thread_index(); i < n; i += thread_stride())
        sto_st(dx, i, sto_ld(dy, i, so) * A::grad(sto_ld(x, i, si)), si);
}

} // namespace

mgt_status mgt_cuda_act16(mgt_cuda_stream *s, const mgt_op *op)
{
    const mgt_sto si = mgt_sto_of(op->store_in), so = mgt_sto_of(op->store_out);
    if (op->kind == MGT_OP_ACT_FWD) {
        const auto &a = op->u.act_fwd;
        unsigned g = blocks_for(a.n);
        switch (a.act) {
#define ACT_FWD16_CASE(KIND, name)                                                     \
    case MGT_ACT_##KIND:                                                               \
        k_act_fwd16<act_##name><<<g, kThreads, 0, s->stream>>>(a.y, a.x, a.n, si, so); \
        break;
            MGT_ACT_LIST(ACT_FWD16_CASE)
#undef ACT_FWD16_CASE
        case MGT_ACT_COUNT: break;
        }
        return MGT_CUDA_AFTER(s, "activation_forward");
    }
    const auto &a = op->u.act_bwd;
    unsigned g = blocks_for(a.n);
    switch (a.act) {
#define ACT_BWD16_CASE(KIND, name)                                                            \
    case MGT_ACT_##KIND:                                                                      \
        k_act_bwd16<act_##name><<<g, kThreads, 0, s->stream>>>(a.dx, a.dy, a.x, a.n, si, so); \
        break;
        MGT_ACT_LIST(ACT_BWD16_CASE)
#undef ACT_BWD16_CASE
    case MGT_ACT_COUNT: break;
    }
    return MGT_CUDA_AFTER(s, "activation_backward");
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
