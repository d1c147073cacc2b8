/* The CPU kernels of mixed precision: the 16-bit emulation of gemm and the convolutions, the
   casts, the nonfinite count. */
#include "device/lowp.h"
#include "device/cpu/vec.h"

/* A 16-bit gemm or convolution rounds its inputs into ctx->lowp and runs the fp32 op on the copies:
   the products of 16-bit values are exact in fp32, so this is the op's arithmetic exactly
   (the sums in fp32, as oneDNN's and cuDNN's 16-bit kernels keep them). It costs one pass
   over the inputs, a few percent of a convolution. */

typedef struct round_job {
    mgt_precision prec;
    const float *src;
    float *dst;
    size_t n;
} round_job;

static void round_item(void *c, int i, int t)
{
    (void)t;
    const round_job *j = c;
    size_t lo, hi;
    item_range(j->n, CHUNK, i, &lo, &hi);
    if (j->prec == MGT_PREC_BF16)
        for (size_t k = lo; k < hi; k++)
            j->dst[k] = mgt_lowp_round_bf16(j->src[k]);
    else
        for (size_t k = lo; k < hi; k++)
            j->dst[k] = mgt_lowp_round_fp16(j->src[k]);
}

mgt_status cpu_lowp(cpu_ctx *ctx, const mgt_op *op, cpu_op_fn fp32)
{
    mgt_op f = *op;
    f.prec = MGT_PREC_F32;
    mgt_precision prec = op->prec;
    mgt_operand ops[MGT_OP_MAX_OPERANDS];
    int n = mgt_op_operands(&f, ops);
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (ops[i].role == MGT_OPERAND_IN)
            total += align_up(ops[i].count);
    mgt_status st = cpu_buf_ensure(ctx, op, &ctx->lowp, &ctx->lowp_bytes, total);
    if (st != MGT_OK)
        return st;
    float *at = ctx->lowp;
    for (int i = 0; i < n; i++) {
        if (ops[i].role != MGT_OPERAND_IN)
            continue;
        round_job j = {prec, *ops[i].ptr, at, ops[i].count};
        POOL_FOR(ctx, items_of(j.n, CHUNK), round_item, &j);
        *ops[i].ptr = at;
        at += align_up(ops[i].count);
    }
    return fp32(ctx, &f);
}

static void cast_item(void *c, int i, int t)
{
    (void)t;
    const mgt_op *op = c;
    const mgt_cast_args *k = &op->u.cast;
    size_t lo, hi;
    item_range(k->n, CHUNK, i, &lo, &hi);
    if (op->kind == MGT_OP_CAST_TO_16)
        for (size_t e = lo; e < hi; e++)
            ((uint16_t *)k->dst)[e] = mgt_lowp_encode(op->prec, ((const float *)k->src)[e]);
    else
        for (size_t e = lo; e < hi; e++)
            ((float *)k->dst)[e] = mgt_lowp_decode(op->prec, ((const uint16_t *)k->src)[e]);
}

mgt_status cpu_cast(cpu_ctx *ctx, const mgt_op *op)
{
    POOL_FOR(ctx, items_of(op->u.cast.n, CHUNK), cast_item, op);
    return MGT_OK;
}

typedef struct nonfinite_job {
    const mgt_op *op;
    atomic_int count;
} nonfinite_job;

static void nonfinite_item(void *c, int i, int t)
{
    (void)t;
    nonfinite_job *j = c;
    const float *x = j->op->u.nonfinite.x;
    size_t lo, hi;
    item_range(j->op->u.nonfinite.n, CHUNK, i, &lo, &hi);
    int bad = 0;
    for (size_t k = lo; k < hi; k++) /* exponent all ones: inf or NaN */
        bad += (~mgt_lowp_bits(x[k]) & 0x7f800000u) == 0;
    if (bad)
        atomic_fetch_add(&j->count, bad);
}

mgt_status cpu_nonfinite(cpu_ctx *ctx, const mgt_op *op)
{
    nonfinite_job j = {.op = op};
    atomic_init(&j.count, 0);
    POOL_FOR(ctx, items_of(op->u.nonfinite.n, CHUNK), nonfinite_item, &j);
    op->u.nonfinite.count[0] = atomic_load(&j.count);
    return MGT_OK;
}
