/* The CPU fast path of the mock devices: a device's kernel context and the table of its kernels,
   one per row of the op list, defined in the file of their family (elementwise.c, conv.c,
   norm.c, pooling.c, act.c, loss.c, lowp.c; what they share is vec.h).

   gemm goes through oneDNN's sgemm and convolutions through oneDNN's direct kernels
   (onednn.c), single-threaded per call: the pool splits the work. Results match mgt_ref_run to
   float rounding and are bit-identical from run to run for a given thread count: every split
   is a function of the shape and the thread count, never of timing. Across thread counts the
   last bits may differ: the splits change the shapes handed to oneDNN (whose summation order
   depends on them) and the filter gradient's partial sums. oneDNN picks its kernels per
   instruction set (AVX2, AVX-512), so bits differ across machines too. */
#include <pthread.h>

#include "device/cpu/onednn.h"
#include "device/cpu/vec.h"

/* ---- context and scratch ---- */

mgt_status cpu_ctx_init(cpu_ctx *ctx, int threads)
{
    memset(ctx, 0, sizeof *ctx);
    mgt_status st = cpu_pool_create(threads, &ctx->pool);
    if (st == MGT_OK)
        st = onednn_create(threads, &ctx->onednn);
    if (st != MGT_OK) {
        cpu_pool_free(ctx->pool);
        ctx->pool = NULL;
        return st;
    }
    pthread_mutex_init(&ctx->lock, NULL);
    return MGT_OK;
}

void cpu_ctx_destroy(cpu_ctx *ctx)
{
    if (ctx == NULL)
        return;
    cpu_pool_free(ctx->pool);
    ctx->pool = NULL;
    onednn_free(ctx->onednn);
    ctx->onednn = NULL;
    free(ctx->scratch);
    if (ctx->unreserve != NULL && ctx->scratch_bytes > 0)
        ctx->unreserve(ctx->owner, ctx->scratch_bytes);
    ctx->scratch = NULL;
    ctx->scratch_bytes = 0;
    free(ctx->lowp);
    if (ctx->unreserve != NULL && ctx->lowp_bytes > 0)
        ctx->unreserve(ctx->owner, ctx->lowp_bytes);
    ctx->lowp = NULL;
    ctx->lowp_bytes = 0;
    free(ctx->wide);
    if (ctx->unreserve != NULL && ctx->wide_bytes > 0)
        ctx->unreserve(ctx->owner, ctx->wide_bytes);
    ctx->wide = NULL;
    ctx->wide_bytes = 0;
    free(ctx->lp_refused);
    ctx->lp_refused = NULL;
    ctx->n_lp_refused = ctx->cap_lp_refused = 0;
    pthread_mutex_destroy(&ctx->lock);
}

mgt_status cpu_buf_ensure(cpu_ctx *ctx, const mgt_op *op, float **buf, size_t *have, size_t floats)
{
    size_t bytes = floats * sizeof(float);
    if (bytes <= *have)
        return MGT_OK;
    size_t want = (bytes + 65535) / 65536 * 65536;
    size_t grow = want - *have;
    if (ctx->reserve != NULL) {
        mgt_status st = ctx->reserve(ctx->owner, grow);
        if (st != MGT_OK) {
            char why[256];
            snprintf(why, sizeof why, "%s", mgt_error_last());
            return mgt_error_set(MGT_ERR_OOM, "%s: cannot grow kernel scratch to %zu bytes: %s",
                                 mgt_op_name(op->kind), want, why);
        }
    }
    float *p = aligned_alloc(64, want);
    if (p == NULL) {
        if (ctx->unreserve != NULL)
            ctx->unreserve(ctx->owner, grow);
        return mgt_error_set(MGT_ERR_OOM, "%s: cannot allocate %zu bytes of kernel scratch",
                             mgt_op_name(op->kind), want);
    }
    free(*buf);
    *buf = p;
    *have = want;
    return MGT_OK;
}

mgt_status cpu_scratch_ensure(cpu_ctx *ctx, const mgt_op *op, size_t floats)
{
    return cpu_buf_ensure(ctx, op, &ctx->scratch, &ctx->scratch_bytes, floats);
}

/* One function per row of the op list, cpu_<stem>. */
#define CPU_OP(KIND, name, args, stem) [MGT_OP_##KIND] = cpu_##stem,
static const cpu_op_fn cpu_ops[MGT_OP_COUNT] = {MGT_OP_LIST(CPU_OP)};
#undef CPU_OP

bool cpu_supports(mgt_op_kind kind)
{
    return (unsigned)kind < MGT_OP_COUNT && cpu_ops[kind] != NULL;
}

/* 16-bit activation storage (mgt_op_run_widened): the 16-bit operands widened into ctx->wide
   (kept and grown like scratch, reserved against the device's memory), the fp32 kernel run on
   them, the outputs rounded back; the copies split over the pool. A strided copy moves 16-bit
   codes itself. */
typedef struct cpu_wide {
    cpu_ctx *ctx;
    const mgt_op *op;
} cpu_wide;

static float *cpu_widen(void *c, size_t n)
{
    cpu_wide *w = c;
    if (cpu_buf_ensure(w->ctx, w->op, &w->ctx->wide, &w->ctx->wide_bytes, n) != MGT_OK)
        return NULL;
    return w->ctx->wide;
}

static void store_item(void *c, int i, int t)
{
    (void)t;
    const mgt_store_job *j = c;
    size_t lo, hi;
    item_range(j->n, CHUNK, i, &lo, &hi);
    if (j->to16)
        cpu16_round(j->prec, (const float *)j->src + lo, (uint16_t *)j->dst + lo, hi - lo);
    else
        cpu16_widen(j->prec, (const uint16_t *)j->src + lo, (float *)j->dst + lo, hi - lo);
}

static void cpu_store_copy(void *c, const mgt_store_job *job)
{
    cpu_wide *w = c;
    POOL_FOR(w->ctx, items_of(job->n, CHUNK), store_item, job);
}

static mgt_status cpu_fp32(void *c, const mgt_op *op)
{
    cpu_wide *w = c;
    return cpu_ops[op->kind](w->ctx, op);
}

mgt_status cpu_run_widened(cpu_ctx *ctx, const mgt_op *op)
{
    cpu_wide w = {ctx, op};
    return mgt_op_run_widened(op, &w, cpu_widen, cpu_store_copy, cpu_fp32);
}

/* The ops whose kernels take 16-bit storage themselves, in one pass over memory: strided
   copies move the codes; the convolutions hand bf16 to oneDNN (or run widened themselves
   where it cannot); add, ReLU and the other activations widen and round tile by tile, and
   batch norm likewise (nChw16c: a sums block at a time; NCHW: an image plane at a time). */
static bool native16(const mgt_op *op)
{
    switch (op->kind) {
    case MGT_OP_STRIDED_COPY:
    case MGT_OP_CONV2D_FWD:
    case MGT_OP_CONV2D_BWD_DATA:
    case MGT_OP_CONV2D_BWD_FILTER:
    case MGT_OP_ADD:
    case MGT_OP_RELU_FWD:
    case MGT_OP_RELU_BWD:
    case MGT_OP_ACT_FWD:
    case MGT_OP_ACT_BWD: return true;
    case MGT_OP_BN_FWD_TRAIN:
    case MGT_OP_BN_FWD_EVAL:
    case MGT_OP_BN_BWD: return true;
    default: return false;
    }
}

mgt_status cpu_run(cpu_ctx *ctx, const mgt_op *op)
{
    if (!cpu_supports(op->kind))
        return mgt_error_set(MGT_ERR_UNSUPPORTED, "cpu kernels: %s is not supported",
                             mgt_op_name(op->kind));
    pthread_mutex_lock(&ctx->lock);
    mgt_status st = mgt_op_store16(op) != MGT_PREC_F32 && !native16(op)
                        ? cpu_run_widened(ctx, op)
                        : cpu_ops[op->kind](ctx, op);
    pthread_mutex_unlock(&ctx->lock);
    return st;
}
