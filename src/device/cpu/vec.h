/* What the CPU kernel files (kernels.c and one file per family of ops) share: the work split
   into items for the device's pool, the vector loops, the scratch buffers, the low-precision
   emulation. Private to src/device/cpu/. */
#ifndef MGT_DEVICE_CPU_VEC_H
#define MGT_DEVICE_CPU_VEC_H

#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/cpu/kernels.h"

/* Elements per item of the elementwise loops (64 KB of floats): one claim (a CAS) per item
   is lost in the work, and a busy machine still gets enough items to balance. */
#define CHUNK 16384
/* Per-thread scratch regions start on a cache line so that threads never share one. */
#define ALIGN_FLOATS 16

static inline size_t min_z(size_t a, size_t b) { return a < b ? a : b; }
static inline size_t max_z(size_t a, size_t b) { return a > b ? a : b; }
static inline size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }
static inline size_t align_up(size_t n)
{
    return (n + ALIGN_FLOATS - 1) / ALIGN_FLOATS * ALIGN_FLOATS;
}

/* Items of `per` elements over n elements; the last may be short. */
static inline int items_of(size_t n, size_t per) { return (int)ceil_div(n, per); }

static inline void item_range(size_t n, size_t per, int i, size_t *lo, size_t *hi)
{
    *lo = (size_t)i * per;
    *hi = min_z(n, *lo + per);
}

/* Whole units (planes, rows) per item such that an item holds about CHUNK elements. */
static inline size_t units_per_item(size_t unit_elems)
{
    return max_z(1, CHUNK / max_z(1, unit_elems));
}

/* ---- vector loops ----
   GCC at -O2 (the default RelWithDebInfo build) vectorises only loops whose trip count is a
   known multiple of the vector width, which leaves every kernel loop here scalar; so the hot
   loops use GCC's vector extensions: 16 bytes, the x86-64 baseline (SSE2), which also keeps
   vector values out of the AVX calling-convention question. Each element goes through the same
   IEEE operations as in the scalar tail (no contraction under -std=c11), so these loops give
   the same bits as plain scalar code. */
#define VW 4
typedef float vf __attribute__((vector_size(VW * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(VW * sizeof(int32_t))));
typedef float vf2 __attribute__((vector_size(2 * sizeof(float))));
typedef double vd2 __attribute__((vector_size(2 * sizeof(double))));

static inline vf vld(const float *p)
{
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void vst(float *p, vf v) { memcpy(p, &v, sizeof v); }

static inline vf vdup(float a) { return (vf){a, a, a, a}; }

/* two floats widened to doubles */
static inline vd2 vld_d2(const float *p)
{
    vf2 v;
    memcpy(&v, p, sizeof v);
    return __builtin_convertvector(v, vd2);
}

static inline vd2 vdup_d2(double a) { return (vd2){a, a}; }

/* Eight double lanes (four vectors of two) summed in a fixed order. */
static inline double hsum_d2x4(vd2 a0, vd2 a1, vd2 a2, vd2 a3)
{
    vd2 a = (a0 + a1) + (a2 + a3);
    return a[0] + a[1];
}

/* d[i] = a */
static inline void v_fill(float *d, float a, size_t n)
{
    vf va = vdup(a);
    size_t j = 0;
    for (; j + VW <= n; j += VW)
        vst(d + j, va);
    for (; j < n; j++)
        d[j] = a;
}

/* d[i] *= a */
static inline void v_scale(float *d, float a, size_t n)
{
    size_t j = 0;
    for (; j + VW <= n; j += VW)
        vst(d + j, vld(d + j) * a);
    for (; j < n; j++)
        d[j] *= a;
}

/* d[i] += a * s[i] */
static inline void v_axpy(float *d, float a, const float *src, size_t n)
{
    size_t j = 0;
    for (; j + VW <= n; j += VW)
        vst(d + j, vld(d + j) + a * vld(src + j));
    for (; j < n; j++)
        d[j] += a * src[j];
}

/* d[i] += s[i] */
static inline void v_add_to(float *d, const float *src, size_t n)
{
    size_t j = 0;
    for (; j + VW <= n; j += VW)
        vst(d + j, vld(d + j) + vld(src + j));
    for (; j < n; j++)
        d[j] += src[j];
}

/* d[i] = (src[i] - sub) * mul + add: batch norm's normalisation; with relu, then
   relu_fwd_item's max(., 0) (NaN passes, +0.0) */
static inline void v_affine(float *d, const float *src, size_t n, float sub, float mul, float add,
                            bool relu)
{
    size_t j = 0;
    for (; j + VW <= n; j += VW) {
        vf v = (vld(src + j) - sub) * mul + add;
        vst(d + j, relu ? (vf)((vi)v & ~(v <= 0.0f)) : v);
    }
    for (; j < n; j++) {
        float v = (src[j] - sub) * mul + add;
        d[j] = relu && v <= 0.0f ? 0.0f : v;
    }
}

/* The gradient a BN with a folded ReLU sees: relu_bwd_item's y > 0 ? dy : 0 (y NULL: dy). */
static inline vf v_relu_dy(const float *dy, const float *y, size_t j)
{
    return y ? (vf)((vi)vld(dy + j) & (vld(y + j) > 0.0f)) : vld(dy + j);
}

static inline float relu_dy(const float *dy, const float *y, size_t j)
{
    return y && !(y[j] > 0.0f) ? 0.0f : dy[j];
}

/* sum of a[i] * b[i] in float, eight lanes then the tail */
static inline float v_dot(const float *a, const float *b, size_t n)
{
    vf acc = vdup(0.0f);
    size_t j = 0;
    for (; j + VW <= n; j += VW)
        acc += vld(a + j) * vld(b + j);
    float s = 0.0f;
    for (; j < n; j++)
        s += a[j] * b[j];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + s;
}

/* Sum in double over eight lanes and the tail: a single accumulator serialises on the add
   latency, about 8x slower. The lane assignment is fixed, so the result does not depend on
   threads. */
static inline double sum_f(const float *x, size_t n)
{
    vd2 a0 = vdup_d2(0.0), a1 = a0, a2 = a0, a3 = a0;
    size_t j = 0;
    for (; j + 8 <= n; j += 8) {
        a0 += vld_d2(x + j);
        a1 += vld_d2(x + j + 2);
        a2 += vld_d2(x + j + 4);
        a3 += vld_d2(x + j + 6);
    }
    double s = 0;
    for (; j < n; j++)
        s += x[j];
    return hsum_d2x4(a0, a1, a2, a3) + s;
}

/* The same for x[i]^2, each square taken in double. */
static inline double sum_sq_f(const float *x, size_t n)
{
    vd2 a0 = vdup_d2(0.0), a1 = a0, a2 = a0, a3 = a0;
    size_t j = 0;
    for (; j + 8 <= n; j += 8) {
        vd2 b0 = vld_d2(x + j), b1 = vld_d2(x + j + 2), b2 = vld_d2(x + j + 4),
            b3 = vld_d2(x + j + 6);
        a0 += b0 * b0;
        a1 += b1 * b1;
        a2 += b2 * b2;
        a3 += b3 * b3;
    }
    double s = 0;
    for (; j < n; j++)
        s += (double)x[j] * x[j];
    return hsum_d2x4(a0, a1, a2, a3) + s;
}

/* ---- the pool ---- */

static inline int pool_threads(const cpu_ctx *ctx) { return cpu_pool_threads(ctx->pool); }

#define POOL_FOR(ctx, items, fn, op) cpu_pool_for((ctx)->pool, (items), (fn), (void *)(op))

/* Whether the loops compiled twice (blocked batch-norm sums, activations) take their AVX-512F
   build: the CPU has it and the tests do not ask for the baseline. */
static inline bool vec_avx512(const cpu_ctx *ctx)
{
    return !ctx->vec_baseline && __builtin_cpu_supports("avx512f");
}

/* Whether the activations' loops take their AVX2 build (a CPU with AVX2 but not AVX-512F). */
static inline bool vec_avx2(const cpu_ctx *ctx)
{
    return !ctx->vec_baseline && !__builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx2");
}

/* The op and how many whole units (planes, rows, columns) one item covers. */
typedef struct plane_job {
    const mgt_op *op;
    size_t units; /* planes (or rows, or columns) per item */
} plane_job;

/* Sixteen lanes, read and written where a row lies (4-byte aligned: test cases may place a
   tensor anywhere); without AVX-512 in the build GCC splits them into four SSE operations. */
typedef float vf16 __attribute__((vector_size(16 * sizeof(float)), aligned(4)));
typedef int32_t vi16 __attribute__((vector_size(16 * sizeof(int32_t)), aligned(4)));
#define V16_LD(p) (*(const vf16 *)(const void *)(p))
#define V16_ST(p, v) (*(vf16 *)(void *)(p) = (v))

/* ---- scratch (kernels.c) and the low-precision emulation (lowp.c) ---- */

/* Makes *buf hold at least `floats` floats: it only grows (rounded up to 64 KB so that a
   warm-up of slowly growing layers does not reallocate each time) and is kept, so a steady
   step loop never allocates. The growth is counted against the device first. */
mgt_status cpu_buf_ensure(cpu_ctx *ctx, const mgt_op *op, float **buf, size_t *have, size_t floats);
/* The same for ctx->scratch, the kernels' working memory. */
mgt_status cpu_scratch_ensure(cpu_ctx *ctx, const mgt_op *op, size_t floats);
/* A gemm or convolution in bf16 or fp16 as fp32 on inputs rounded to the format (in
   ctx->lowp): fp32 is the op's own kernel, called back with the copies. */
mgt_status cpu_lowp(cpu_ctx *ctx, const mgt_op *op, cpu_op_fn fp32);
/* The layer norm's row path (hw == 1: LayerNorm over the last dimension), which
   layernorm_channels_forward and _backward take (ln_rows.c). */
mgt_status cpu_ln_rows_fwd(cpu_ctx *ctx, const mgt_op *op);
mgt_status cpu_ln_rows_bwd(cpu_ctx *ctx, const mgt_op *op);

#endif
