/* ConvNeXt as a layer graph, as torchvision 0.14 defines it: convnext_tiny, _small, _base and _large (stem conv 4x4 s4
   + LayerNorm2d; CNBlocks of depthwise 7x7 conv with bias, LayerNorm over channels, Linear
   dim -> 4 dim, GELU, Linear 4 dim -> dim, layer_scale, stochastic depth growing linearly to
   0.1, 0.4, 0.5 and 0.5; downsampling LayerNorm2d + conv 2x2 s2; head avgpool, LayerNorm2d, Linear). The
   blocks' Linear layers run as 1x1 convolutions on NCHW (the same arithmetic as torch's
   permute + Linear + permute); their state_dict tensors are 2-D [out, in] as torchvision's. */
#include <math.h>
#include <stdio.h>

#include "nn/model_impl.h"

typedef struct convnext_def {
    int depths[4], dims[4];
    float sd_prob;
} convnext_def;

/* A 1x1 convolution whose weight entry is torchvision's nn.Linear weight [out, in]. */
static int pointwise_linear(mgt_model *m, const char *name, int x, int out)
{
    int y = nn_conv(m, name, x, out, 1, 1, 0, 1, true);
    if (y < 0)
        return -1;
    mgt_model_entry *t = &m->table[nn_node_of(m, y)->entry[0]];
    t->ndim = 2;
    t->what = MGT_TENSOR_LINEAR_WEIGHT;
    return y;
}

static int cn_block(mgt_model *m, const char *p, int x, float sd)
{
    char n[NN_NAME];
    int dim = m->values[x].c;
    int64_t ls[3] = {dim, 1, 1};
    /* layer_scale is the block's own parameter: state_dict lists it before the block's */
    int ls_entry = nn_add_entry(m, p, "layer_scale", MGT_MODEL_PARAM, MGT_TENSOR_SCALE, 3, ls,
                                (nn_entry_init){NN_INIT_CONST, 1e-6});
    nn_name(m, n, sizeof n, "%s.block.0", p);
    int y = nn_conv(m, n, x, dim, 7, 1, 3, dim, true);
    nn_name(m, n, sizeof n, "%s.block.2", p);
    y = nn_layernorm2d(m, n, y, 1e-6f);
    nn_name(m, n, sizeof n, "%s.block.3", p);
    y = pointwise_linear(m, n, y, 4 * dim);
    nn_name(m, n, sizeof n, "%s.block.4", p);
    y = nn_activation(m, n, y, MGT_ACT_GELU);
    nn_name(m, n, sizeof n, "%s.block.5", p);
    y = pointwise_linear(m, n, y, dim);
    nn_name(m, n, sizeof n, "%s.layer_scale", p);
    y = nn_layer_scale(m, n, y, ls_entry);
    nn_name(m, n, sizeof n, "%s.stochastic_depth", p);
    y = nn_stochastic_depth(m, n, y, sd);
    return nn_add(m, p, x, y);
}

static mgt_status build_convnext(mgt_model *m, const void *arg)
{
    const convnext_def *d = arg;
    char p[NN_NAME], q[NN_NAME];
    int total = 0, id = 0;
    for (int s = 0; s < 4; s++)
        total += d->depths[s];
    int x = nn_conv(m, "features.0.0", nn_input(m), d->dims[0], 4, 4, 0, 1, true);
    x = nn_layernorm2d(m, "features.0.1", x, 1e-6f);
    int f = 1;
    for (int s = 0; s < 4; s++) {
        for (int i = 0; i < d->depths[s]; i++, id++) {
            nn_name(m, p, sizeof p, "features.%d.%d", f, i);
            x = cn_block(m, p, x, d->sd_prob * (float)id / (float)(total - 1));
        }
        f++;
        if (s < 3) {
            nn_name(m, p, sizeof p, "features.%d.0", f);
            nn_name(m, q, sizeof q, "features.%d.1", f);
            x = nn_layernorm2d(m, p, x, 1e-6f);
            x = nn_conv(m, q, x, d->dims[s + 1], 2, 2, 0, 1, true);
            f++;
        }
    }
    x = nn_layernorm2d(m, "classifier.0", nn_gap(m, "avgpool", x), 1e-6f);
    nn_linear(m, "classifier.2", x, m->cfg.classes);
    /* trunc_normal_(std 0.02) on conv and linear weights (truncated at +-2, i.e. 100 std:
       a plain normal), zero biases; LayerNorms 1 and 0, layer_scale 1e-6 (as built) */
    nn_init_normal_weights(m, 0.02);
    return MGT_OK;
}

static const convnext_def tiny = {{3, 3, 9, 3}, {96, 192, 384, 768}, 0.1f},
                          small = {{3, 3, 27, 3}, {96, 192, 384, 768}, 0.4f},
                          base = {{3, 3, 27, 3}, {128, 256, 512, 1024}, 0.5f},
                          large = {{3, 3, 27, 3}, {192, 384, 768, 1536}, 0.5f};

const nn_arch nn_convnext_archs[] = {
    {"convnext_tiny", "convnext", build_convnext, &tiny, "classifier.2"},
    {"convnext_small", "convnext", build_convnext, &small, "classifier.2"},
    {"convnext_base", "convnext", build_convnext, &base, "classifier.2"},
    {"convnext_large", "convnext", build_convnext, &large, "classifier.2"},
    {NULL, NULL, NULL, NULL, NULL},
};
