/* The global-memory bytes the CUDA backend's kernels move for one op (the byte model of
   docs/mixed-precision.md): what `mgtrain model --bytes` adds up over a training step. */
#ifndef MGT_DEVICE_BYTES_H
#define MGT_DEVICE_BYTES_H

#include "device/op.h"

typedef struct mgt_op_bytes {
    double read, written; /* bytes, every pass of every kernel the op launches */
    /* of read + written, the passes that only change layout or precision: the transposes of
       the 16-bit convolutions over fp32 NCHW activations, their inputs rounded into 16-bit
       copies and their 16-bit results widened back, the filters' 16-bit copies, a 16-bit
       gemm's input casts */
    double convert;
    int passes; /* kernels launched (cuDNN and cuBLAS calls count one each) */
} mgt_op_bytes;

/* The bytes of a checked op as src/device/cuda/ runs it, pass by pass: each pass reads every
   input tensor it needs once and writes each output once (the traffic to memory; re-reads of
   a window that the caches hold, as pooling's and a convolution's, count once), at the element
   size the op stores (mgt_op_operands). Convolutions follow dnn.cu's path for the op: fp32
   NCHW through cuDNN; a 16-bit arithmetic over fp32 NCHW activations through its three
   conversions (both inputs to NHWC 16-bit copies, the 16-bit result back); 16-bit NHWC
   activations read and written where they lie, the filter's 16-bit copy made by the forward
   pass and read by the backward ones. Batch norm reads its input twice (the statistics, then
   the normalisation), as cuDNN's spatial kernels and store16.cu's do, and a folded ReLU costs
   the fp32 path a pass of its own each way. */
void mgt_op_bytes_cuda(const mgt_op *op, mgt_op_bytes *out);

/* Whether an op names oneDNN's nChw16c, the mock devices' layout. */
static inline bool mgt_op_names_nchw16c(const mgt_op *op)
{
    switch (op->kind) {
    case MGT_OP_CONV2D_FWD:
    case MGT_OP_CONV2D_BWD_DATA:
    case MGT_OP_CONV2D_BWD_FILTER:
        return op->u.conv.sh.x_layout == MGT_LAYOUT_NCHW16C ||
               op->u.conv.sh.y_layout == MGT_LAYOUT_NCHW16C;
    case MGT_OP_BN_FWD_TRAIN: return op->u.bn_train.sh.layout == MGT_LAYOUT_NCHW16C;
    case MGT_OP_BN_FWD_EVAL: return op->u.bn_eval.sh.layout == MGT_LAYOUT_NCHW16C;
    case MGT_OP_BN_BWD: return op->u.bn_bwd.sh.layout == MGT_LAYOUT_NCHW16C;
    case MGT_OP_MAXPOOL_FWD: return op->u.maxpool_fwd.sh.layout == MGT_LAYOUT_NCHW16C;
    case MGT_OP_MAXPOOL_BWD: return op->u.maxpool_bwd.sh.layout == MGT_LAYOUT_NCHW16C;
    case MGT_OP_AVGPOOL_FWD: return op->u.avgpool_fwd.layout == MGT_LAYOUT_NCHW16C;
    case MGT_OP_AVGPOOL_BWD: return op->u.avgpool_bwd.layout == MGT_LAYOUT_NCHW16C;
    case MGT_OP_CHSCALE_FWD: return op->u.chscale_fwd.layout == MGT_LAYOUT_NCHW16C;
    case MGT_OP_CHSCALE_BWD: return op->u.chscale_bwd.layout == MGT_LAYOUT_NCHW16C;
    default: return false;
    }
}

/* Whether the CUDA backend's kernels take the op: fp32 activations in NCHW (cuDNN's fp32 path
   and each family's kernels), 16-bit ones in NHWC or NCHW for every kind that takes a storage
   (mgt_op_cuda_store16_kind: store16.cu's switch, with act.cu's, dnn.cu's channels-last
   convolutions and the channel ops of elementwise.cu and norm.cu); never nChw16c, nor fp32
   NHWC. The CUDA backend's supports_op, and the byte model's, so that a traced step is one
   CUDA can run. */
/* The kinds with CUDA kernels for 16-bit activations: of mgt_op_takes_store's, all but the
   transformers' ops (gemm, bias, permute, attention), whose values a CUDA model keeps fp32
   (nn/graph.c's takes_16). */
static inline bool mgt_op_cuda_store16_kind(mgt_op_kind kind)
{
    switch (kind) {
    case MGT_OP_GEMM:
    case MGT_OP_BIAS_FWD:
    case MGT_OP_BIAS_BWD:
    case MGT_OP_PERMUTE:
    case MGT_OP_ATTN_FWD:
    case MGT_OP_ATTN_BWD: return false;
    default: return mgt_op_takes_store(kind);
    }
}

static inline bool mgt_op_cuda_takes(const mgt_op *op)
{
    if (mgt_op_names_nchw16c(op))
        return false;
    if (mgt_op_store16(op) == MGT_PREC_F32) /* cuDNN's batch norm: no fused residual add */
        return !mgt_op_blocked(op) && !mgt_op_bn_residual(op);
    return mgt_op_cuda_store16_kind(op->kind);
}

#endif
