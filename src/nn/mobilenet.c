/* The inverted-residual families as layer graphs, as torchvision 0.14 defines them:
   mobilenet_v2 (ReLU6, depthwise 3x3), mobilenet_v3_small/large (hardswish, squeeze-excite
   gated by hardsigmoid, BN eps 1e-3 momentum 0.01) and efficientnet_b0/b1 (SiLU, sigmoid
   squeeze-excite, stochastic depth growing linearly over the blocks), and regnet_x_400mf and
   regnet_y_400mf (grouped 3x3 bottlenecks, Y with squeeze-excite), which share the conv-BN-act
   and squeeze-excite units. Module names are torchvision's (features.3.conv.1.0,
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

/* ---- EfficientNet B0, B1 ---- */

typedef struct effnet_def {
    double width, depth;
    float dropout;
} effnet_def;

/* expand ratio, kernel, stride, in, out, layers (before the depth multiplier) */
static const int effnet_setting[7][6] = {
    {1, 3, 1, 32, 16, 1},  {6, 3, 2, 16, 24, 2},   {6, 5, 2, 24, 40, 2},   {6, 3, 2, 40, 80, 3},
    {6, 5, 1, 80, 112, 3}, {6, 5, 2, 112, 192, 4}, {6, 3, 1, 192, 320, 1},
};

#define EFFNET_SD_PROB 0.2 /* torchvision's default stochastic_depth_prob */

static mgt_status build_efficientnet(mgt_model *m, const void *arg)
{
    const effnet_def *d = arg;
    char p[NN_NAME], q[NN_NAME];
    int layers[7], total = 0;
    for (int s = 0; s < 7; s++) {
        layers[s] = (int)ceil(effnet_setting[s][5] * d->depth);
        total += layers[s];
    }
    int x = cna(m, "features.0", nn_input(m), make_divisible(32 * d->width), 3, 2, 1, MGT_ACT_SILU,
                bn_default);
    int block_id = 0;
    for (int s = 0; s < 7; s++) {
        const int *c = effnet_setting[s];
        int out = make_divisible(c[4] * d->width);
        for (int i = 0; i < layers[s]; i++, block_id++) {
            int in = m->values[x].c, stride = i == 0 ? c[2] : 1, y = x, j = 0;
            int expanded = make_divisible((double)in * c[0]);
            if (expanded != in) {
                nn_name(m, p, sizeof p, "features.%d.%d.block.%d", s + 1, i, j++);
                y = cna(m, p, y, expanded, 1, 1, 1, MGT_ACT_SILU, bn_default);
            }
            nn_name(m, p, sizeof p, "features.%d.%d.block.%d", s + 1, i, j++);
            y = cna(m, p, y, expanded, c[1], stride, expanded, MGT_ACT_SILU, bn_default);
            nn_name(m, p, sizeof p, "features.%d.%d.block.%d", s + 1, i, j++);
            y = squeeze_excite(m, p, y, in / 4 > 1 ? in / 4 : 1, MGT_ACT_SILU, MGT_ACT_SIGMOID);
            nn_name(m, p, sizeof p, "features.%d.%d.block.%d", s + 1, i, j++);
            y = cna(m, p, y, out, 1, 1, 1, ACT_NONE, bn_default);
            if (stride == 1 && in == out) {
                nn_name(m, q, sizeof q, "features.%d.%d.stochastic_depth", s + 1, i);
                y = nn_stochastic_depth(m, q, y, (float)(EFFNET_SD_PROB * block_id / total));
                nn_name(m, q, sizeof q, "features.%d.%d", s + 1, i);
                y = nn_add(m, q, y, x);
            }
            x = y;
        }
    }
    nn_name(m, p, sizeof p, "features.%d", 8);
    x = cna(m, p, x, 4 * m->values[x].c, 1, 1, 1, MGT_ACT_SILU, bn_default);
    x = nn_dropout(m, "classifier.0", nn_gap(m, "avgpool", x), d->dropout);
    nn_linear(m, "classifier.1", x, m->cfg.classes);
    init_mobile(m, true, false);
    return MGT_OK;
}

/* ---- RegNet X/Y 400MF ---- */

typedef struct regnet_def {
    int depths[4], widths[4];
    int group_width;
    bool se; /* se_ratio 0.25 */
} regnet_def;

/* torchvision's BlockParams.from_init_params for the two 400MF models, already expanded (the
   widths need no group adjustment; bottleneck 1, every stage stride 2):
   X: depth 22, w_0 24, w_a 24.48, w_m 2.54, group width 16;
   Y: depth 16, w_0 48, w_a 27.89, w_m 2.09, group width 8, se_ratio 0.25 */
static const regnet_def rx400 = {{1, 2, 7, 12}, {32, 64, 160, 400}, 16, false};
static const regnet_def ry400 = {{1, 3, 6, 6}, {48, 104, 208, 440}, 8, true};

static mgt_status build_regnet(mgt_model *m, const void *arg)
{
    const regnet_def *d = arg;
    char p[NN_NAME], q[NN_NAME];
    int x = cna(m, "stem", nn_input(m), 32, 3, 2, 1, ACT_RELU, bn_default);
    for (int st = 0; st < 4; st++)
        for (int i = 0; i < d->depths[st]; i++) {
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
            y = cna(m, p, y, w_out, 3, stride, w_out / d->group_width, ACT_RELU, bn_default);
            if (d->se) {
                nn_name(m, p, sizeof p, "%s.f.se", blk);
                y = squeeze_excite(m, p, y, (int)lround(0.25 * w_in), ACT_RELU, MGT_ACT_SIGMOID);
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

static const effnet_def b0 = {1.0, 1.0, 0.2f};
static const effnet_def b1 = {1.0, 1.1, 0.2f};

const nn_arch nn_mobile_archs[] = {
    {"mobilenet_v2", "mobilenet", build_mobilenet_v2, NULL, "classifier.1"},
    {"mobilenet_v3_large", "mobilenet", build_mobilenet_v3, &v3_large_def, "classifier.3"},
    {"mobilenet_v3_small", "mobilenet", build_mobilenet_v3, &v3_small_def, "classifier.3"},
    {"efficientnet_b0", "efficientnet", build_efficientnet, &b0, "classifier.1"},
    {"efficientnet_b1", "efficientnet", build_efficientnet, &b1, "classifier.1"},
    {"regnet_x_400mf", "regnet", build_regnet, &rx400, "fc"},
    {"regnet_y_400mf", "regnet", build_regnet, &ry400, "fc"},
    {NULL, NULL, NULL, NULL, NULL},
};
