/* The ResNet model's private layout, shared by the building and step code (model.c) and the
   weights code (model_io.c). */
#ifndef MGT_NN_MODEL_IMPL_H
#define MGT_NN_MODEL_IMPL_H

#include "mgt/nn.h"

/* Every tensor in every arena starts on this boundary: what cudaMalloc gives, and enough for
   the vector loads of cuDNN and cuBLAS kernels. Costs at most 252 bytes per tensor. */
#define NN_ALIGN 256

/* A convolution, its batch norm and (when relu) a ReLU applied in place on the BN output. */
typedef struct nn_cbn {
    mgt_conv2d_shape conv; /* n is set per call */
    int p, q;              /* output side */
    bool relu;
    int w_entry;  /* table index of the conv weight */
    int bn_entry; /* table index of the BN weight; bias, running_mean, running_var and
                     num_batches_tracked follow it, in torchvision's state_dict order */
    int counter;  /* this BN's num_batches_tracked in bn_counts */
    /* activation arena offsets (bytes): conv output (BN input, kept for BN backward), BN
       output (the ReLU output too), per-channel saved mean and 1/std */
    size_t c_off, y_off, mean_off, invstd_off;
} nn_cbn;

/* A residual block: units 2 (BasicBlock) or 3 (Bottleneck); output = relu(last BN + identity),
   computed in place in the last unit's y. */
typedef struct nn_block {
    int units;
    nn_cbn u[3];
    bool has_ds; /* downsample: 1x1 conv with the block's stride + BN, where the shape changes */
    nn_cbn ds;
    size_t in_off; /* the block's input (the previous block's or the stem's output) */
} nn_block;

struct mgt_model {
    mgt_model_config cfg;
    char arch[16];
    mgt_device *dev;

    mgt_buffer *params_buf, *grads_buf, *bufs_buf, *acts_buf;
    char *params, *grads, *bufs, *acts; /* base pointers; NULL for a describing model */
    size_t params_bytes, bufs_bytes, acts_bytes;

    mgt_model_entry *table;
    int n_table, cap_table;
    int64_t *bn_counts;
    int n_bn;
    mgt_model_layer *layers;
    int n_layers, cap_layers;
    mgt_model_counts counts;

    nn_cbn stem;
    bool has_maxpool;
    mgt_pool2d_shape mp; /* n is set per call */
    size_t mp_off;
    nn_block *blocks;
    int n_blocks;
    int feat_c, feat_hw; /* the last block's output: channels and h*w */
    int min_bn_hw;       /* the smallest h*w any BN normalises over, per image */
    int max_bn_c;        /* the most channels any BN has */
    /* freeze_bn only: [max_bn_c] constant 1s and 0s (set at each training forward), which
       let batchnorm_forward_eval compute 1/sqrt(var + eps) and gamma * invstd * dy, as the
       device interface has no per-channel scale or rsqrt of its own */
    size_t ones_off, zeros_off;
    int fcw_entry; /* fc.weight; fc.bias is the next entry */
    size_t pool_off, logits_off, probs_off, dlogits_off, dpool_off, loss_off;
    size_t scratch_off[3]; /* gradient scratch, each max_act floats per image */
    size_t max_act;        /* floats per image of the largest gradient-carrying tensor */

    /* the step in flight */
    int n;          /* images in the last forward */
    bool trained;   /* the last forward was a training one */
    bool have_loss; /* mgt_model_loss ran after it */
    const float *x; /* the last forward's input (borrowed) */
    const int32_t *labels;
    float smoothing;
    size_t ready; /* grad bytes backward has completed so far */
};

static inline float *nn_param(const mgt_model *m, int e)
{
    return (float *)(m->params + m->table[e].offset);
}

static inline float *nn_grad(const mgt_model *m, int e)
{
    return (float *)(m->grads + m->table[e].offset);
}

static inline float *nn_buf(const mgt_model *m, int e)
{
    return (float *)(m->bufs + m->table[e].offset);
}

static inline float *nn_act(const mgt_model *m, size_t off) { return (float *)(m->acts + off); }

static inline size_t nn_align(size_t bytes) { return (bytes + NN_ALIGN - 1) / NN_ALIGN * NN_ALIGN; }

/* Refuses the calls that need memory on a describing model. */
mgt_status nn_need_device(const mgt_model *m, const char *what);

#endif
