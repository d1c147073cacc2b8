/* The inverted-residual families as layer graphs, as torchvision 0.14 defines them:
   mobilenet_v2 (ReLU6, depthwise 3x3), mobilenet_v3_small/large (hardswish, squeeze-excite
   gated by hardsigmoid, BN eps 1e-3 momentum 0.01), mnasnet0_5..1_3 (ReLU, no squeeze-excite,
   BN momentum 3e-4), efficientnet_b0..b7 (SiLU, sigmoid squeeze-excite, stochastic depth
   growing linearly over the blocks) and efficientnet_v2_s/m/l (FusedMBConv stages first), and
   the RegNets X and Y from 400MF to 32GF and Y 128GF (grouped 3x3 bottlenecks, Y with
   squeeze-excite), which share the conv-BN-act and squeeze-excite units. Module names are torchvision's (features.3.conv.1.0,
   features.4.block.2.fc1, trunk_output.block2.block2-0.f.se.fc1, classifier.1, ...). */
#include <math.h>
#include <stdio.h>

#include "nn/model_impl.h"

/* What follows a conv + BN: an mgt_act, plain ReLU, or nothing. */
enum { ACT_NONE = -1, ACT_RELU = MGT_ACT_COUNT };

static int act_node(mgt_model *m, const char *name, int x, int act)
{
    if (act == ACT_NONE)
        return x;
    if (act == ACT_RELU)
        return nn_relu(m, name, x);
    return nn_activation(m, name, x, (mgt_act)act);
}

typedef struct bn_cfg {
    float eps, momentum;
} bn_cfg;

/* torchvision's Conv2dNormActivation: conv (padding (k - 1) / 2, no bias) "<p>.0", BN "<p>.1",
   activation "<p>.2" */
static int cna(mgt_model *m, const char *p, int x, int out, int k, int stride, int groups, int act,
               bn_cfg bn)
{
    char cn[NN_NAME], bnn[NN_NAME], an[NN_NAME];
    nn_name(m, cn, sizeof cn, "%s.0", p);
    nn_name(m, bnn, sizeof bnn, "%s.1", p);
    nn_name(m, an, sizeof an, "%s.2", p);
    int y = nn_conv(m, cn, x, out, k, stride, (k - 1) / 2, groups, false);
    return act_node(m, an, nn_bn(m, bnn, y, bn.eps, bn.momentum), act);
}

/* torchvision's SqueezeExcitation "<p>": avgpool, fc1 (1x1 conv with bias), activation, fc2,
   scale_activation, then the input scaled per channel by the result */
static int squeeze_excite(mgt_model *m, const char *p, int x, int squeeze, int act, mgt_act gate)
{
    char n1[NN_NAME], n2[NN_NAME], n3[NN_NAME], n4[NN_NAME], n5[NN_NAME];
    nn_name(m, n1, sizeof n1, "%s.avgpool", p);
    nn_name(m, n2, sizeof n2, "%s.fc1", p);
    nn_name(m, n3, sizeof n3, "%s.activation", p);
    nn_name(m, n4, sizeof n4, "%s.fc2", p);
    nn_name(m, n5, sizeof n5, "%s.scale_activation", p);
    if (x < 0)
        return -1;
    int c = m->values[x].c;
    int s = nn_gap(m, n1, x);
    s = act_node(m, n3, nn_conv(m, n2, s, squeeze, 1, 1, 0, 1, true), act);
    s = nn_activation(m, n5, nn_conv(m, n4, s, c, 1, 1, 0, 1, true), gate);
    return nn_scale(m, p, x, s);
}

/* torchvision's _make_divisible(v, 8): the nearest multiple of 8, at least 8, never more than
   10% below v */
static int make_divisible(double v)
{
    int d = 8;
    int nv = (int)(v + d / 2.0) / d * d;
    if (nv < d)
        nv = d;
    if (nv < 0.9 * v)
        nv += d;
    return nv;
}

/* The families' shared initialisation: kaiming_normal_(mode='fan_out') on every conv, zero
   biases (conv biases left at PyTorch's default with conv_bias_default), BN 1 and 0 (as
   built); Linear weights N(0, 0.01) (MobileNets, RegNet) or U(+-1/sqrt(out_features))
   (EfficientNet). */
static void init_mobile(mgt_model *m, bool linear_uniform, bool conv_bias_default)
{
    for (int e = 0; e < m->n_table; e++) {
        const mgt_model_entry *t = &m->table[e];
        if (t->what == MGT_TENSOR_CONV_WEIGHT)
            m->init[e] = (nn_entry_init){
                NN_INIT_NORMAL, sqrt(2.0 / (double)(t->shape[0] * t->shape[2] * t->shape[3]))};
        else if (t->what == MGT_TENSOR_BIAS &&
                 !(conv_bias_default && m->nodes[t->layer].kind == NN_CONV))
            m->init[e] = (nn_entry_init){NN_INIT_CONST, 0.0};
        else if (t->what == MGT_TENSOR_LINEAR_WEIGHT)
            m->init[e] = linear_uniform
                             ? (nn_entry_init){NN_INIT_UNIFORM, 1.0 / sqrt((double)t->shape[0])}
                             : (nn_entry_init){NN_INIT_NORMAL, 0.01};
    }
}

/* ---- MobileNet V2 ---- */

static const bn_cfg bn_default = {1e-5f, 0.1f};

static int v2_block(mgt_model *m, int idx, int x, int out, int stride, int t)
{
    char p[NN_NAME], q[NN_NAME];
    int inp = m->values[x].c, hidden = (int)lround((double)inp * t), y = x, j = 0;
    if (t != 1) {
        nn_name(m, p, sizeof p, "features.%d.conv.%d", idx, j++);
        y = cna(m, p, y, hidden, 1, 1, 1, MGT_ACT_RELU6, bn_default);
    }
    nn_name(m, p, sizeof p, "features.%d.conv.%d", idx, j++);
    y = cna(m, p, y, hidden, 3, stride, hidden, MGT_ACT_RELU6, bn_default);
    nn_name(m, p, sizeof p, "features.%d.conv.%d", idx, j++);
    nn_name(m, q, sizeof q, "features.%d.conv.%d", idx, j++);
    y = nn_bn(m, q, nn_conv(m, p, y, out, 1, 1, 0, 1, false), bn_default.eps, bn_default.momentum);
    if (stride == 1 && inp == out) {
        nn_name(m, p, sizeof p, "features.%d", idx);
        y = nn_add(m, p, x, y);
    }
    return y;
}

static mgt_status build_mobilenet_v2(mgt_model *m, const void *arg)
{
    (void)arg;
    static const int setting[][4] = {{1, 16, 1, 1}, {6, 24, 2, 2},  {6, 32, 3, 2}, {6, 64, 4, 2},
                                     {6, 96, 3, 1}, {6, 160, 3, 2}, {6, 320, 1, 1}};
    int x = cna(m, "features.0", nn_input(m), 32, 3, 2, 1, MGT_ACT_RELU6, bn_default);
    int idx = 1;
    for (int s = 0; s < 7; s++)
        for (int i = 0; i < setting[s][2]; i++)
            x = v2_block(m, idx++, x, setting[s][1], i == 0 ? setting[s][3] : 1, setting[s][0]);
    char p[NN_NAME];
    nn_name(m, p, sizeof p, "features.%d", idx);
    x = cna(m, p, x, 1280, 1, 1, 1, MGT_ACT_RELU6, bn_default);
    x = nn_dropout(m, "classifier.0", nn_gap(m, "avgpool", x), 0.2f);
    nn_linear(m, "classifier.1", x, m->cfg.classes);
    init_mobile(m, false, false);
    return MGT_OK;
}

/* ---- MobileNet V3 ---- */

typedef struct v3_conf {
    int in, k, exp, out;
    bool se;
    bool hs; /* hardswish, else ReLU */
    int stride;
} v3_conf;

typedef struct v3_def {
    const v3_conf *blocks;
    int n_blocks;
    int last_channel;
} v3_def;

static const v3_conf v3_large[] = {
    {16, 3, 16, 16, false, false, 1},  {16, 3, 64, 24, false, false, 2},
    {24, 3, 72, 24, false, false, 1},  {24, 5, 72, 40, true, false, 2},
    {40, 5, 120, 40, true, false, 1},  {40, 5, 120, 40, true, false, 1},
    {40, 3, 240, 80, false, true, 2},  {80, 3, 200, 80, false, true, 1},
    {80, 3, 184, 80, false, true, 1},  {80, 3, 184, 80, false, true, 1},
    {80, 3, 480, 112, true, true, 1},  {112, 3, 672, 112, true, true, 1},
    {112, 5, 672, 160, true, true, 2}, {160, 5, 960, 160, true, true, 1},
    {160, 5, 960, 160, true, true, 1},
};

static const v3_conf v3_small[] = {
    {16, 3, 16, 16, true, false, 2},  {16, 3, 72, 24, false, false, 2},
    {24, 3, 88, 24, false, false, 1}, {24, 5, 96, 40, true, true, 2},
    {40, 5, 240, 40, true, true, 1},  {40, 5, 240, 40, true, true, 1},
    {40, 5, 120, 48, true, true, 1},  {48, 5, 144, 48, true, true, 1},
    {48, 5, 288, 96, true, true, 2},  {96, 5, 576, 96, true, true, 1},
    {96, 5, 576, 96, true, true, 1},
};

static const v3_def v3_large_def = {v3_large, (int)(sizeof v3_large / sizeof *v3_large), 1280};
static const v3_def v3_small_def = {v3_small, (int)(sizeof v3_small / sizeof *v3_small), 1024};

static mgt_status build_mobilenet_v3(mgt_model *m, const void *arg)
{
    const v3_def *d = arg;
    const bn_cfg bn = {1e-3f, 0.01f};
    char p[NN_NAME], q[NN_NAME];
    int x = cna(m, "features.0", nn_input(m), d->blocks[0].in, 3, 2, 1, MGT_ACT_HARDSWISH, bn);
    for (int b = 0; b < d->n_blocks; b++) {
        const v3_conf *c = &d->blocks[b];
        int act = c->hs ? MGT_ACT_HARDSWISH : ACT_RELU, y = x, j = 0;
        if (c->exp != c->in) {
            nn_name(m, p, sizeof p, "features.%d.block.%d", b + 1, j++);
            y = cna(m, p, y, c->exp, 1, 1, 1, act, bn);
        }
        nn_name(m, p, sizeof p, "features.%d.block.%d", b + 1, j++);
        y = cna(m, p, y, c->exp, c->k, c->stride, c->exp, act, bn);
        if (c->se) {
            nn_name(m, p, sizeof p, "features.%d.block.%d", b + 1, j++);
            y = squeeze_excite(m, p, y, make_divisible(c->exp / 4), ACT_RELU, MGT_ACT_HARDSIGMOID);
        }
        nn_name(m, p, sizeof p, "features.%d.block.%d", b + 1, j++);
        y = cna(m, p, y, c->out, 1, 1, 1, ACT_NONE, bn);
        if (c->stride == 1 && c->in == c->out) {
            nn_name(m, q, sizeof q, "features.%d", b + 1);
            y = nn_add(m, q, y, x);
        }
        x = y;
    }
    nn_name(m, p, sizeof p, "features.%d", d->n_blocks + 1);
    int last_in = d->blocks[d->n_blocks - 1].out;
    x = cna(m, p, x, 6 * last_in, 1, 1, 1, MGT_ACT_HARDSWISH, bn);
    x = nn_linear(m, "classifier.0", nn_gap(m, "avgpool", x), d->last_channel);
    x = nn_activation(m, "classifier.1", x, MGT_ACT_HARDSWISH);
    x = nn_dropout(m, "classifier.2", x, 0.2f);
    nn_linear(m, "classifier.3", x, m->cfg.classes);
    init_mobile(m, false, false);
    return MGT_OK;
}

/* ---- EfficientNet B0-B7, V2 S/M/L ---- */

/* A stage of torchvision's inverted_residual_setting: MBConv (expand 1x1, depthwise, SE,
   project) or FusedMBConv (expand k x k, project 1x1; a single k x k conv when the ratio is 1),
   expand ratio, kernel, stride, in, out, layers (B0-B7: before the width and depth
   multipliers) */
typedef struct effnet_stage {
    bool fused;
    int expand, k, stride, in, out, layers;
} effnet_stage;

typedef struct effnet_def {
    double width, depth;
    float dropout;
    bn_cfg bn;
    const effnet_stage *stages;
    int n_stages;
    int last_channel; /* 0: 4 x the last stage's out */
} effnet_def;

static const effnet_stage effnet_v1[] = {
    {false, 1, 3, 1, 32, 16, 1},   {false, 6, 3, 2, 16, 24, 2},  {false, 6, 5, 2, 24, 40, 2},
    {false, 6, 3, 2, 40, 80, 3},   {false, 6, 5, 1, 80, 112, 3}, {false, 6, 5, 2, 112, 192, 4},
    {false, 6, 3, 1, 192, 320, 1},
};
static const effnet_stage effnet_v2_s[] = {
    {true, 1, 3, 1, 24, 24, 2},   {true, 4, 3, 2, 24, 48, 4},    {true, 4, 3, 2, 48, 64, 4},
    {false, 4, 3, 2, 64, 128, 6}, {false, 6, 3, 1, 128, 160, 9}, {false, 6, 3, 2, 160, 256, 15},
};
static const effnet_stage effnet_v2_m[] = {
    {true, 1, 3, 1, 24, 24, 3},    {true, 4, 3, 2, 24, 48, 5},     {true, 4, 3, 2, 48, 80, 5},
    {false, 4, 3, 2, 80, 160, 7},  {false, 6, 3, 1, 160, 176, 14}, {false, 6, 3, 2, 176, 304, 18},
    {false, 6, 3, 1, 304, 512, 5},
};
static const effnet_stage effnet_v2_l[] = {
    {true, 1, 3, 1, 32, 32, 4},    {true, 4, 3, 2, 32, 64, 7},     {true, 4, 3, 2, 64, 96, 7},
    {false, 4, 3, 2, 96, 192, 10}, {false, 6, 3, 1, 192, 224, 19}, {false, 6, 3, 2, 224, 384, 25},
    {false, 6, 3, 1, 384, 640, 7},
};

#define EFFNET_SD_PROB 0.2 /* torchvision's default stochastic_depth_prob */

/* One MBConv or FusedMBConv block "features.<s>.<i>" on x. */
static int effnet_block(mgt_model *m, const effnet_def *d, const effnet_stage *c, int s, int i,
                        int x, int out, float sd)
{
    char p[NN_NAME], q[NN_NAME];
    int in = m->values[x].c, stride = i == 0 ? c->stride : 1, y = x, j = 0;
    int expanded = make_divisible((double)in * c->expand);
    if (c->fused) {
        nn_name(m, p, sizeof p, "features.%d.%d.block.%d", s, i, j++);
        y = cna(m, p, y, expanded != in ? expanded : out, c->k, stride, 1, MGT_ACT_SILU, d->bn);
        if (expanded != in) {
            nn_name(m, p, sizeof p, "features.%d.%d.block.%d", s, i, j++);
            y = cna(m, p, y, out, 1, 1, 1, ACT_NONE, d->bn);
        }
    } else {
        if (expanded != in) {
            nn_name(m, p, sizeof p, "features.%d.%d.block.%d", s, i, j++);
            y = cna(m, p, y, expanded, 1, 1, 1, MGT_ACT_SILU, d->bn);
        }
        nn_name(m, p, sizeof p, "features.%d.%d.block.%d", s, i, j++);
        y = cna(m, p, y, expanded, c->k, stride, expanded, MGT_ACT_SILU, d->bn);
        nn_name(m, p, sizeof p, "features.%d.%d.block.%d", s, i, j++);
        y = squeeze_excite(m, p, y, in / 4 > 1 ? in / 4 : 1, MGT_ACT_SILU, MGT_ACT_SIGMOID);
        nn_name(m, p, sizeof p, "features.%d.%d.block.%d", s, i, j++);
        y = cna(m, p, y, out, 1, 1, 1, ACT_NONE, d->bn);
    }
    if (stride == 1 && in == out) {
        nn_name(m, q, sizeof q, "features.%d.%d.stochastic_depth", s, i);
        y = nn_stochastic_depth(m, q, y, sd);
        nn_name(m, q, sizeof q, "features.%d.%d", s, i);
        y = nn_add(m, q, y, x);
    }
    return y;
}

static mgt_status build_efficientnet(mgt_model *m, const void *arg)
{
    const effnet_def *d = arg;
    char p[NN_NAME];
    int layers[8], total = 0;
    MGT_ASSERT(d->n_stages <= 8);
    for (int s = 0; s < d->n_stages; s++) {
        layers[s] = (int)ceil(d->stages[s].layers * d->depth);
        total += layers[s];
    }
    int x = cna(m, "features.0", nn_input(m), make_divisible(d->stages[0].in * d->width), 3, 2, 1,
                MGT_ACT_SILU, d->bn);
    int block_id = 0;
    for (int s = 0; s < d->n_stages; s++) {
        int out = make_divisible(d->stages[s].out * d->width);
        for (int i = 0; i < layers[s] && x >= 0; i++, block_id++)
            x = effnet_block(m, d, &d->stages[s], s + 1, i, x, out,
                             (float)(EFFNET_SD_PROB * block_id / total));
    }
    if (x < 0)
        return MGT_OK;
    nn_name(m, p, sizeof p, "features.%d", d->n_stages + 1);
    x = cna(m, p, x, d->last_channel ? d->last_channel : 4 * m->values[x].c, 1, 1, 1, MGT_ACT_SILU,
            d->bn);
    x = nn_dropout(m, "classifier.0", nn_gap(m, "avgpool", x), d->dropout);
    nn_linear(m, "classifier.1", x, m->cfg.classes);
    init_mobile(m, true, false);
    return MGT_OK;
}

/* ---- RegNet X and Y ---- */

typedef struct regnet_def {
    int depths[4], widths[4], group_widths[4];
    bool se; /* se_ratio 0.25 */
} regnet_def;

/* torchvision's BlockParams.from_init_params(depth, w_0, w_a, w_m, group_width[, se_ratio])
   expanded (stage depths, widths and group widths after _adjust_widths_groups_compatibilty;
   bottleneck multiplier 1, stride 2, stem 32 channels for all): quantised in float32 by torch
   there, so taken here as torchvision computes them rather than recomputed (the state_dict
   table of every member, tests/data/zoo/torchvision_archs.txt, holds them to it). */
static const regnet_def rx400 = {{1, 2, 7, 12}, {32, 64, 160, 400}, {16, 16, 16, 16}, false};
static const regnet_def rx800 = {{1, 3, 7, 5}, {64, 128, 288, 672}, {16, 16, 16, 16}, false};
static const regnet_def rx1_6 = {{2, 4, 10, 2}, {72, 168, 408, 912}, {24, 24, 24, 24}, false};
static const regnet_def rx3_2 = {{2, 6, 15, 2}, {96, 192, 432, 1008}, {48, 48, 48, 48}, false};
static const regnet_def rx8 = {{2, 5, 15, 1}, {80, 240, 720, 1920}, {80, 120, 120, 120}, false};
static const regnet_def rx16 = {{2, 6, 13, 1}, {256, 512, 896, 2048}, {128, 128, 128, 128}, false};
static const regnet_def rx32 = {{2, 7, 13, 1}, {336, 672, 1344, 2520}, {168, 168, 168, 168}, false};
static const regnet_def ry400 = {{1, 3, 6, 6}, {48, 104, 208, 440}, {8, 8, 8, 8}, true};
static const regnet_def ry800 = {{1, 3, 8, 2}, {64, 144, 320, 784}, {16, 16, 16, 16}, true};
static const regnet_def ry1_6 = {{2, 6, 17, 2}, {48, 120, 336, 888}, {24, 24, 24, 24}, true};
static const regnet_def ry3_2 = {{2, 5, 13, 1}, {72, 216, 576, 1512}, {24, 24, 24, 24}, true};
static const regnet_def ry8 = {{2, 4, 10, 1}, {224, 448, 896, 2016}, {56, 56, 56, 56}, true};
static const regnet_def ry16 = {{2, 4, 11, 1}, {224, 448, 1232, 3024}, {112, 112, 112, 112}, true};
static const regnet_def ry32 = {{2, 5, 12, 1}, {232, 696, 1392, 3712}, {232, 232, 232, 232}, true};
static const regnet_def ry128 = {
    {2, 7, 17, 1}, {528, 1056, 2904, 7392}, {264, 264, 264, 264}, true};

static mgt_status build_regnet(mgt_model *m, const void *arg)
{
    const regnet_def *d = arg;
    char p[NN_NAME], q[NN_NAME];
    int x = cna(m, "stem", nn_input(m), 32, 3, 2, 1, ACT_RELU, bn_default);
    for (int st = 0; st < 4; st++)
        for (int i = 0; i < d->depths[st] && x >= 0; i++) {
            char blk[NN_NAME];
            nn_name(m, blk, sizeof blk, "trunk_output.block%d.block%d-%d", st + 1, st + 1, i);
            int w_in = m->values[x].c, w_out = d->widths[st], stride = i == 0 ? 2 : 1;
            int identity = x;
            if (w_in != w_out || stride != 1) {
                nn_name(m, p, sizeof p, "%s.proj", blk);
                identity = cna(m, p, x, w_out, 1, stride, 1, ACT_NONE, bn_default);
            }
            nn_name(m, p, sizeof p, "%s.f.a", blk);
            int y = cna(m, p, x, w_out, 1, 1, 1, ACT_RELU, bn_default);
            nn_name(m, p, sizeof p, "%s.f.b", blk);
            y = cna(m, p, y, w_out, 3, stride, w_out / d->group_widths[st], ACT_RELU, bn_default);
            if (d->se) {
                /* int(round(0.25 * width_in)): the widths are multiples of 8, so exact */
                nn_name(m, p, sizeof p, "%s.f.se", blk);
                y = squeeze_excite(m, p, y, w_in / 4, ACT_RELU, MGT_ACT_SIGMOID);
            }
            nn_name(m, p, sizeof p, "%s.f.c", blk);
            y = cna(m, p, y, w_out, 1, 1, 1, ACT_NONE, bn_default);
            nn_name(m, q, sizeof q, "%s.activation", blk);
            x = nn_relu(m, q, nn_add(m, blk, identity, y));
        }
    nn_linear(m, "fc", nn_gap(m, "avgpool", x), m->cfg.classes);
    /* conv N(0, sqrt(2 / (k k out))), BN 1 and 0, Linear N(0, 0.01) and 0: init_mobile's; the
       squeeze-excite convs' biases keep PyTorch's default (RegNet's init leaves them) */
    init_mobile(m, false, true);
    return MGT_OK;
}

/* ---- MNASNet 0.5, 0.75, 1.0, 1.3 (the B1 variant, torchvision's version 2) ---- */

/* torchvision's _BN_MOMENTUM, 1 - 0.9997, and BatchNorm2d's eps */
static const bn_cfg bn_mnasnet = {1e-5f, (float)(1.0 - 0.9997)};

/* conv "layers.<i>", BN "layers.<i+1>" (and ReLU "layers.<i+2>") of the stem's Sequential */
static int mnas_cbr(mgt_model *m, const char *p, int i, int x, int out, int k, int stride,
                    int groups, bool relu)
{
    char cn[NN_NAME], bn[NN_NAME], rn[NN_NAME];
    nn_name(m, cn, sizeof cn, "%s.%d", p, i);
    nn_name(m, bn, sizeof bn, "%s.%d", p, i + 1);
    nn_name(m, rn, sizeof rn, "%s.%d", p, i + 2);
    x = nn_conv(m, cn, x, out, k, stride, k / 2, groups, false);
    x = nn_bn(m, bn, x, bn_mnasnet.eps, bn_mnasnet.momentum);
    return relu ? nn_relu(m, rn, x) : x;
}

/* torchvision's _get_depths: _round_to_multiple_of(d * alpha, 8) is make_divisible's rule */
static mgt_status build_mnasnet(mgt_model *m, const void *arg)
{
    const double alpha = *(const double *)arg;
    static const int base[8] = {32, 16, 24, 40, 80, 96, 192, 320};
    /* _stack(in, out, kernel, stride, expansion, repeats) for depths[1..7] */
    static const int stacks[6][4] = {{3, 2, 3, 3}, {5, 2, 3, 3}, {5, 2, 6, 3},
                                     {3, 1, 6, 2}, {5, 2, 6, 4}, {3, 1, 6, 1}};
    int depth[8];
    for (int i = 0; i < 8; i++)
        depth[i] = make_divisible(base[i] * alpha);
    int x = mnas_cbr(m, "layers", 0, nn_input(m), depth[0], 3, 2, 1, true);
    x = mnas_cbr(m, "layers", 3, x, depth[0], 3, 1, depth[0], true);
    x = mnas_cbr(m, "layers", 6, x, depth[1], 1, 1, 1, false);
    for (int s = 0; s < 6; s++) {
        const int *c = stacks[s];
        for (int r = 0; r < c[3] && x >= 0; r++) {
            char p[NN_NAME], q[NN_NAME];
            nn_name(m, p, sizeof p, "layers.%d.%d.layers", 8 + s, r);
            int in = m->values[x].c, out = depth[s + 2], stride = r == 0 ? c[1] : 1;
            int mid = in * c[2];
            int y = mnas_cbr(m, p, 0, x, mid, 1, 1, 1, true);
            y = mnas_cbr(m, p, 3, y, mid, c[0], stride, mid, true);
            y = mnas_cbr(m, p, 6, y, out, 1, 1, 1, false);
            if (in == out && stride == 1) {
                nn_name(m, q, sizeof q, "layers.%d.%d", 8 + s, r);
                y = nn_add(m, q, y, x);
            }
            x = y;
        }
    }
    x = mnas_cbr(m, "layers", 14, x, 1280, 1, 1, 1, true);
    x = nn_dropout(m, "classifier.0", nn_gap(m, "mean", x), 0.2f);
    nn_linear(m, "classifier.1", x, m->cfg.classes);
    /* kaiming_normal_(fan_out, relu) convs, BN 1 and 0, Linear kaiming_uniform_(mode fan_out,
       nonlinearity sigmoid): U(+-sqrt(3 / out_features)), bias 0 */
    init_mobile(m, false, false);
    for (int e = 0; e < m->n_table; e++)
        if (m->table[e].what == MGT_TENSOR_LINEAR_WEIGHT)
            m->init[e] = (nn_entry_init){NN_INIT_UNIFORM, sqrt(3.0 / (double)m->table[e].shape[0])};
    return MGT_OK;
}

static const double mnas0_5 = 0.5, mnas0_75 = 0.75, mnas1_0 = 1.0, mnas1_3 = 1.3;

/* width, depth, dropout, BN (B5-B7 as ported from TensorFlow: eps 1e-3, momentum 0.01; V2:
   eps 1e-3), stages, last channel */
static const bn_cfg bn_tf = {1e-3f, 0.01f}, bn_v2 = {1e-3f, 0.1f};
#define V1(w, d, p, bn)              \
    {                                \
        w, d, p, bn, effnet_v1, 7, 0 \
    }
static const effnet_def b0 = V1(1.0, 1.0, 0.2f, bn_default), b1 = V1(1.0, 1.1, 0.2f, bn_default),
                        b2 = V1(1.1, 1.2, 0.3f, bn_default), b3 = V1(1.2, 1.4, 0.3f, bn_default),
                        b4 = V1(1.4, 1.8, 0.4f, bn_default), b5 = V1(1.6, 2.2, 0.4f, bn_tf),
                        b6 = V1(1.8, 2.6, 0.5f, bn_tf), b7 = V1(2.0, 3.1, 0.5f, bn_tf);
#undef V1
static const effnet_def v2_s = {1.0, 1.0, 0.2f, bn_v2, effnet_v2_s, 6, 1280},
                        v2_m = {1.0, 1.0, 0.3f, bn_v2, effnet_v2_m, 7, 1280},
                        v2_l = {1.0, 1.0, 0.4f, bn_v2, effnet_v2_l, 7, 1280};

const nn_arch nn_mobile_archs[] = {
    {"mobilenet_v2", "mobilenet", build_mobilenet_v2, NULL, "classifier.1"},
    {"mobilenet_v3_large", "mobilenet", build_mobilenet_v3, &v3_large_def, "classifier.3"},
    {"mobilenet_v3_small", "mobilenet", build_mobilenet_v3, &v3_small_def, "classifier.3"},
    {"mnasnet0_5", "mnasnet", build_mnasnet, &mnas0_5, "classifier.1"},
    {"mnasnet0_75", "mnasnet", build_mnasnet, &mnas0_75, "classifier.1"},
    {"mnasnet1_0", "mnasnet", build_mnasnet, &mnas1_0, "classifier.1"},
    {"mnasnet1_3", "mnasnet", build_mnasnet, &mnas1_3, "classifier.1"},
    {"efficientnet_b0", "efficientnet", build_efficientnet, &b0, "classifier.1"},
    {"efficientnet_b1", "efficientnet", build_efficientnet, &b1, "classifier.1"},
    {"efficientnet_b2", "efficientnet", build_efficientnet, &b2, "classifier.1"},
    {"efficientnet_b3", "efficientnet", build_efficientnet, &b3, "classifier.1"},
    {"efficientnet_b4", "efficientnet", build_efficientnet, &b4, "classifier.1"},
    {"efficientnet_b5", "efficientnet", build_efficientnet, &b5, "classifier.1"},
    {"efficientnet_b6", "efficientnet", build_efficientnet, &b6, "classifier.1"},
    {"efficientnet_b7", "efficientnet", build_efficientnet, &b7, "classifier.1"},
    {"efficientnet_v2_s", "efficientnet", build_efficientnet, &v2_s, "classifier.1"},
    {"efficientnet_v2_m", "efficientnet", build_efficientnet, &v2_m, "classifier.1"},
    {"efficientnet_v2_l", "efficientnet", build_efficientnet, &v2_l, "classifier.1"},
    {"regnet_x_400mf", "regnet", build_regnet, &rx400, "fc"},
    {"regnet_x_800mf", "regnet", build_regnet, &rx800, "fc"},
    {"regnet_x_1_6gf", "regnet", build_regnet, &rx1_6, "fc"},
    {"regnet_x_3_2gf", "regnet", build_regnet, &rx3_2, "fc"},
    {"regnet_x_8gf", "regnet", build_regnet, &rx8, "fc"},
    {"regnet_x_16gf", "regnet", build_regnet, &rx16, "fc"},
    {"regnet_x_32gf", "regnet", build_regnet, &rx32, "fc"},
    {"regnet_y_400mf", "regnet", build_regnet, &ry400, "fc"},
    {"regnet_y_800mf", "regnet", build_regnet, &ry800, "fc"},
    {"regnet_y_1_6gf", "regnet", build_regnet, &ry1_6, "fc"},
    {"regnet_y_3_2gf", "regnet", build_regnet, &ry3_2, "fc"},
    {"regnet_y_8gf", "regnet", build_regnet, &ry8, "fc"},
    {"regnet_y_16gf", "regnet", build_regnet, &ry16, "fc"},
    {"regnet_y_32gf", "regnet", build_regnet, &ry32, "fc"},
    {"regnet_y_128gf", "regnet", build_regnet, &ry128, "fc"},
    {NULL, NULL, NULL, NULL, NULL},
};
