/* MaxViT as a layer graph, as torchvision (0.15 and later; not in Debian's 0.14) defines
   maxvit_t: a stem (3x3 stride-2 conv, BN, GELU; 3x3 conv with bias), four blocks of MaxVit
   layers, each an MBConv (pre-norm BN, 1x1 expansion x4 with BN and GELU, depthwise 3x3 with
   BN and GELU, squeeze-excite with SiLU and sigmoid, 1x1 projection; the shortcut an
   AvgPool2d(3, 2, 1) and a 1x1 conv where the block downsamples) and two partition attention
   layers (7x7 windows, then a 7x7 grid with stride side / 7), each LayerNorm, multi-head
   attention with a relative position bias table (scale dim^-0.5, as torchvision's
   scale_factor), stochastic depth and the residual, then LayerNorm, MLP x4 with GELU,
   stochastic depth and the residual; the classifier: average pool, LayerNorm, Linear, Tanh,
   Linear without bias. BatchNorm eps 1e-3, momentum 0.01; stochastic depth from 0 to 0.2 over
   the 11 layers.

   The partitions are permutes of the NCHW map [C, H, W] to groups of tokens [groups, 49, C]
   and back (a scatter through the same description). Every block's input side must be a
   multiple of 7: 224 is the smallest input (torchvision fixes its input_size at 224). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/model_impl.h"

#define PART 7 /* partition_size */

typedef struct maxvit_def {
    int stem, channels[4], layers[4], head_dim;
    float sd_prob;
} maxvit_def;

/* [C, H, W] and its groups [gside^2, tside^2, C]: token (ti, tj) of group (gi, gj) is pixel
   (gi gcoef + ti tcoef, gj gcoef + tj tcoef): windows have gcoef PART and tcoef 1, grids gcoef
   1 and tcoef side / PART. */
static mgt_permute_shape group_map(int c, int h, int w, int gside, int tside, int gcoef, int tcoef,
                                   bool scatter)
{
    mgt_permute_shape p = {.ndim = 6,
                           .naxes = 4,
                           .size = {0, gside, gside, tside, tside, c},
                           .walk_stride = {0, (size_t)gside * tside * tside * c,
                                           (size_t)tside * tside * c, (size_t)tside * c, (size_t)c,
                                           1},
                           .axis = {0, 2, 3, 2, 3, 1},
                           .coef = {1, gcoef, gcoef, tcoef, tcoef, 1},
                           .limit = {0, c, h, w},
                           .grid_stride = {0, (size_t)h * w, (size_t)w, 1},
                           .scatter = scatter};
    return p;
}

/* PartitionAttentionLayer of x [c, side, side] (p = "...layers.window_attention"). */
static int partition_attention(mgt_model *m, const char *p, int x, bool grid, int head_dim,
                               float sd)
{
    char n[NN_NAME];
    const nn_value *v = &m->values[x];
    int c = v->c, side = v->h, heads = c / head_dim, t = PART * PART;
    int groups = (side / PART) * (side / PART), rows = (2 * PART - 1) * (2 * PART - 1);
    /* (side / PART)^2 groups of PART x PART tokens either way: windows of neighbours, or
       grids of pixels side / PART apart (torchvision's partition with p = side / PART, then
       the swap of its two middle axes) */
    int gside = side / PART, tside = PART;
    int gcoef = grid ? 1 : PART, tcoef = grid ? side / PART : 1;
    int64_t *index = malloc((size_t)t * t * sizeof *index);
    int32_t *index32 = malloc((size_t)t * t * sizeof *index32);
    if (!index || !index32) {
        free(index);
        free(index32);
        m->oom = true;
        return -1;
    }
    nn_relative_index(PART, index);
    for (int i = 0; i < t * t; i++)
        index32[i] = (int32_t)index[i];
    mgt_permute_shape part = group_map(c, side, side, gside, tside, gcoef, tcoef, false);
    nn_name(m, n, sizeof n, "%s.partition", p);
    int xp = nn_permute(m, n, x, &part, groups, t, c);
    nn_name(m, n, sizeof n, "%s.attn_layer.0", p);
    int y = nn_layernorm(m, n, xp, 1e-5f);
    nn_name(m, n, sizeof n, "%s.attn_layer.1", p);
    int64_t ts[2] = {rows, heads}, is[2] = {t, t};
    int table = nn_add_entry(m, n, "relative_position_bias_table", MGT_MODEL_PARAM,
                             MGT_TENSOR_EMBEDDING, 2, ts, (nn_entry_init){NN_INIT_NORMAL, 0.02});
    nn_add_index(m, n, "relative_position_index", 2, is, index);
    char q[NN_NAME];
    nn_name(m, q, sizeof q, "%s.to_qkv", n);
    y = nn_token_linear(m, q, y, 3 * c, true, "weight", "bias");
    y = nn_attention(m, n, y, heads, groups, table, rows, index32, NULL);
    if (y >= 0) /* torchvision scales k by feat_dim^-0.5 (the whole width, not a head's) */
        nn_node_of(m, y)->u.attn.scale = 1.0f / sqrtf((float)c);
    nn_name(m, q, sizeof q, "%s.merge", n);
    y = nn_token_linear(m, q, y, c, true, "weight", "bias");
    nn_name(m, n, sizeof n, "%s.stochastic_dropout", p);
    y = nn_stochastic_depth(m, n, y, sd);
    nn_name(m, n, sizeof n, "%s.attention_residual", p);
    xp = nn_add(m, n, xp, y);
    nn_name(m, n, sizeof n, "%s.mlp_layer.0", p);
    y = nn_layernorm(m, n, xp, 1e-5f);
    nn_name(m, n, sizeof n, "%s.mlp_layer.1", p);
    y = nn_token_linear(m, n, y, 4 * c, true, "weight", "bias");
    nn_name(m, n, sizeof n, "%s.mlp_layer.2", p);
    y = nn_activation(m, n, y, MGT_ACT_GELU);
    nn_name(m, n, sizeof n, "%s.mlp_layer.3", p);
    y = nn_token_linear(m, n, y, c, true, "weight", "bias");
    nn_name(m, n, sizeof n, "%s.stochastic_dropout_mlp", p);
    y = nn_stochastic_depth(m, n, y, sd);
    nn_name(m, n, sizeof n, "%s.mlp_residual", p);
    xp = nn_add(m, n, xp, y);
    mgt_permute_shape back = group_map(c, side, side, gside, tside, gcoef, tcoef, true);
    nn_name(m, n, sizeof n, "%s.departition", p);
    y = nn_permute(m, n, xp, &back, c, side, side);
    free(index);
    free(index32);
    return y;
}

/* conv (no bias), BN(1e-3, 0.01), GELU: Conv2dNormActivation's children 0, 1, 2 */
static int conv_bn_gelu(mgt_model *m, const char *p, int x, int out, int k, int stride, int groups)
{
    char n[NN_NAME];
    nn_name(m, n, sizeof n, "%s.0", p);
    x = nn_conv(m, n, x, out, k, stride, k / 2, groups, false);
    nn_name(m, n, sizeof n, "%s.1", p);
    x = nn_bn(m, n, x, 1e-3f, 0.01f);
    nn_name(m, n, sizeof n, "%s.2", p);
    return nn_activation(m, n, x, MGT_ACT_GELU);
}

static int mbconv(mgt_model *m, const char *p, int x, int out, int stride, float sd)
{
    char n[NN_NAME], q[NN_NAME];
    int in = m->values[x].c, mid = out * 4, sqz = (int)(out * 0.25);
    int res = x;
    if (stride != 1 || in != out) {
        if (stride == 2) {
            nn_name(m, n, sizeof n, "%s.proj.0", p);
            res = nn_avgpool2d(m, n, x, 3, 2, 1);
        }
        nn_name(m, n, sizeof n, "%s.proj.%d", p, stride == 2 ? 1 : 0);
        res = nn_conv(m, n, res, out, 1, 1, 0, 1, true);
    }
    nn_name(m, n, sizeof n, "%s.layers.pre_norm", p);
    int y = nn_bn(m, n, x, 1e-3f, 0.01f);
    nn_name(m, n, sizeof n, "%s.layers.conv_a", p);
    y = conv_bn_gelu(m, n, y, mid, 1, 1, 1);
    nn_name(m, n, sizeof n, "%s.layers.conv_b", p);
    y = conv_bn_gelu(m, n, y, mid, 3, stride, mid);
    /* SqueezeExcitation(mid, sqz, SiLU): avgpool, fc1, SiLU, fc2, sigmoid, scale */
    nn_name(m, n, sizeof n, "%s.layers.squeeze_excitation", p);
    nn_name(m, q, sizeof q, "%s.avgpool", n);
    int s = nn_gap(m, q, y);
    nn_name(m, q, sizeof q, "%s.fc1", n);
    s = nn_conv(m, q, s, sqz, 1, 1, 0, 1, true);
    nn_name(m, q, sizeof q, "%s.activation", n);
    s = nn_activation(m, q, s, MGT_ACT_SILU);
    nn_name(m, q, sizeof q, "%s.fc2", n);
    s = nn_conv(m, q, s, mid, 1, 1, 0, 1, true);
    nn_name(m, q, sizeof q, "%s.scale_activation", n);
    s = nn_activation(m, q, s, MGT_ACT_SIGMOID);
    y = nn_scale(m, n, y, s);
    nn_name(m, n, sizeof n, "%s.layers.conv_c", p);
    y = nn_conv(m, n, y, out, 1, 1, 0, 1, true);
    if (sd > 0.0f) { /* torchvision's MBConv has an Identity where p is 0 */
        nn_name(m, n, sizeof n, "%s.stochastic_depth", p);
        y = nn_stochastic_depth(m, n, y, sd);
    }
    return nn_add(m, p, res, y);
}

static mgt_status build_maxvit(mgt_model *m, const void *arg)
{
    const maxvit_def *d = arg;
    int side = (m->cfg.image_size + 2 - 3) / 2 + 1; /* after the stem */
    for (int b = 0, s = side; b < 4; b++) {
        s = (s + 2 - 3) / 2 + 1;
        if (s % PART != 0)
            return mgt_error_set(MGT_ERR_INVALID,
                                 "model %s: image size %d gives block %d a %dx%d input, not a "
                                 "multiple of the partition size %d (224 is the smallest input)",
                                 m->arch, m->cfg.image_size, b, s, s, PART);
    }
    int x = conv_bn_gelu(m, "stem.0", nn_input(m), d->stem, 3, 2, 1);
    x = nn_conv(m, "stem.1.0", x, d->stem, 3, 1, 1, 1, true);
    int total = 0, id = 0;
    for (int b = 0; b < 4; b++)
        total += d->layers[b];
    char p[NN_NAME], n[NN_NAME];
    for (int b = 0; b < 4; b++)
        for (int l = 0; l < d->layers[b] && x >= 0; l++, id++) {
            /* np.linspace(0, sd_prob, total) */
            float sd = (float)((double)d->sd_prob * id / (double)(total - 1));
            nn_name(m, p, sizeof p, "blocks.%d.layers.%d.layers", b, l);
            nn_name(m, n, sizeof n, "%s.MBconv", p);
            x = mbconv(m, n, x, d->channels[b], l == 0 ? 2 : 1, sd);
            nn_name(m, n, sizeof n, "%s.window_attention", p);
            x = partition_attention(m, n, x, false, d->head_dim, sd);
            nn_name(m, n, sizeof n, "%s.grid_attention", p);
            x = partition_attention(m, n, x, true, d->head_dim, sd);
        }
    x = nn_gap(m, "classifier.0", x);
    x = nn_layernorm2d(m, "classifier.2", x, 1e-5f);
    x = nn_linear(m, "classifier.3", x, d->channels[3]);
    x = nn_activation(m, "classifier.4", x, MGT_ACT_TANH);
    nn_linear_nobias(m, "classifier.5", x, m->cfg.classes);
    /* _init_weights: Conv2d and Linear weights normal_(std 0.02), their biases 0; BN 1 and 0;
       the tables trunc_normal_(std 0.02) (as built) */
    nn_init_normal_weights(m, 0.02);
    return MGT_OK;
}

static const maxvit_def t = {64, {64, 128, 256, 512}, {2, 2, 5, 2}, 32, 0.2f};

const nn_arch nn_maxvit_archs[] = {
    {"maxvit_t", "maxvit", build_maxvit, &t, "classifier.5"},
    {NULL, NULL, NULL, NULL, NULL},
};
