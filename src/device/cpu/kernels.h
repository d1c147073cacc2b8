/* The CPU fast path: a per-device thread pool and the kernels the mock backend runs on it. */
#ifndef MGT_DEVICE_CPU_KERNELS_H
#define MGT_DEVICE_CPU_KERNELS_H

#include <pthread.h>
#include <stdbool.h>

#include "device/op.h"
#include "device/refusal.h"

typedef struct cpu_pool cpu_pool;

/* A pool of `threads` workers counting the caller: threads - 1 are spawned. */
mgt_status cpu_pool_create(int threads, cpu_pool **out);
/* NULL is a no-op. */
void cpu_pool_free(cpu_pool *p);
int cpu_pool_threads(const cpu_pool *p);
/* Runs fn(ctx, i, thread) for every i in [0, n), spread over the pool's threads with the
   caller as thread 0; returns when all have run. thread < cpu_pool_threads(p), so it can
   index per-thread scratch. One parallel-for at a time per pool (callers serialise). */
void cpu_pool_for(cpu_pool *p, int n, void (*fn)(void *ctx, int i, int thread), void *ctx);

/* A 16-bit convolution shape as a refusal remembers it: the pass, the precision and the
   shape but its batch (CUDA keys its algorithm cache alike). */
typedef struct cpu_lp_key {
    mgt_op_kind kind;
    mgt_precision prec;
    mgt_precision store_in, store_out; /* the activation storage: bf16 is handed to oneDNN */
    mgt_conv2d_shape sh;               /* n is 0 */
} cpu_lp_key;

/* What a device's kernels run with. The owner (the mock device) fills pool, reserve and
   owner; scratch grows on demand and is kept, so a steady step loop allocates nothing. */
typedef struct cpu_ctx {
    cpu_pool *pool;
    pthread_mutex_t lock; /* held by cpu_run: one kernel at a time per device */
    /* counts scratch growth against the device's memory; NULL: unlimited */
    mgt_status (*reserve)(void *owner, size_t bytes);
    void (*unreserve)(void *owner, size_t bytes);
    void *owner;
    float *scratch;
    size_t scratch_bytes;
    float *lowp; /* the rounded inputs of a low-precision op (kept and grown like scratch) */
    size_t lowp_bytes;
    float *wide; /* 16-bit activations widened to fp32 for one op (mgt_op_run_widened) */
    size_t wide_bytes;
    struct onednn *onednn; /* convolutions (groups 1) and sgemm */
    bool conv_im2col;      /* convolutions on the im2col + gemm path even where oneDNN can */
    bool vec_baseline;     /* activations on x86-64's baseline vectors even with AVX-512F */
    /* (optional) the owner's verdict on the next attempt of a native 16-bit convolution
       (the mock's fault=lowp); NULL or MGT_LP_REFUSAL_NONE: the kernel is tried */
    mgt_lp_refusal (*lp_refusal)(void *owner);
    /* 16-bit convolution shapes refused for good (mgt_lp_refusal_action): the rounded-fp32
       path at once, as CUDA remembers a shape cuDNN refuses */
    struct cpu_lp_key *lp_refused;
    int n_lp_refused, cap_lp_refused;
    /* set while a 16-bit-stored convolution the native path declined runs widened: the inner
       fp32-stored call goes to the emulation without asking the refusal hook a second time */
    bool lp_decided;
} cpu_ctx;

mgt_status cpu_ctx_init(cpu_ctx *ctx, int threads);
void cpu_ctx_destroy(cpu_ctx *ctx);

/* Runs one checked op on host memory with the ctx's pool: gemm through oneDNN's sgemm,
   convolutions through oneDNN's blocked direct kernels (im2col/col2im + gemm where oneDNN has
   none, or where ctx->conv_im2col asks for it), depthwise ones as direct loops, the rest as
   parallel loops. Returns MGT_ERR_OOM when scratch cannot grow and MGT_ERR_DEVICE for a label
   out of range (or a oneDNN failure). */
mgt_status cpu_run(cpu_ctx *ctx, const mgt_op *op);
/* op (whose activations are stored in 16 bits) as its fp32 kernel between a widening and a
   rounding pass (mgt_op_run_widened): the route of the kinds without a one-pass 16-bit kernel,
   and of a convolution the native path declines. Called with ctx->lock held. */
mgt_status cpu_run_widened(cpu_ctx *ctx, const mgt_op *op);
/* Whether cpu_run has a kernel for the kind (MGT_ERR_UNSUPPORTED otherwise). */
bool cpu_supports(mgt_op_kind kind);

/* ---- 16-bit activation codes (store16.c) ----
   dst[i] = the fp32 value of code src[i]; dst[i] = the code of src[i] (rounded to nearest even,
   as device/lowp.h); dst[i] = the code of src[i] + beta * (the value of dst[i]). Bit-exact with
   lowp.h, AVX-512 where the CPU has it. */
void cpu16_widen(mgt_precision p, const uint16_t *src, float *dst, size_t n);
void cpu16_round(mgt_precision p, const float *src, uint16_t *dst, size_t n);
void cpu16_round_acc(mgt_precision p, const float *src, float beta, uint16_t *dst, size_t n);

/* ---- the activations' loops of the narrower builds (act_avx2.c, act_base.c; act.c) ----
   y = act(x) and dx = dy * act'(x) over [0, n); _avx2 only where the CPU has AVX2. */
void cpu_act_fwd_avx2(mgt_act act, float *y, const float *x, size_t n);
void cpu_act_bwd_avx2(mgt_act act, float *dx, const float *dy, const float *x, size_t n);
void cpu_act_fwd_base(mgt_act act, float *y, const float *x, size_t n);
void cpu_act_bwd_base(mgt_act act, float *dx, const float *dy, const float *x, size_t n);
/* y[i] = e^(x[i] - shift) over [0, n) (y may be x), within 2 ulp of expf, or 0 where expf is
   below FLT_MIN (no denormals), returning their sum (the softmax's exponentials, on the widest
   vectors the CPU has); _avx2 and _base are its builds. */
float cpu_exp_shift(float *y, const float *x, float shift, size_t n);
float cpu_exp_shift_avx2(float *y, const float *x, float shift, size_t n);
float cpu_exp_shift_base(float *y, const float *x, float shift, size_t n);
/* The largest of m and x[0, n), NaNs passed over (the softmax's row maximum). */
float cpu_max_above(const float *x, size_t n, float m);
float cpu_max_above_avx2(const float *x, size_t n, float m);
float cpu_max_above_base(const float *x, size_t n, float m);

/* The kernels, one per row of the op list (cpu_<stem>), each given a checked op; what
   cpu_run calls with ctx->lock held. */
typedef mgt_status (*cpu_op_fn)(cpu_ctx *ctx, const mgt_op *op);
#define CPU_OP_DECL_(KIND, name, args, stem) mgt_status cpu_##stem(cpu_ctx *ctx, const mgt_op *op);
MGT_OP_LIST(CPU_OP_DECL_)
#undef CPU_OP_DECL_

#endif
