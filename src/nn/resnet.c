/* The ResNet family as layer graphs: torchvision's resnet18..152, resnext50_32x4d,
   resnext101_32x8d, resnext101_64x4d, wide_resnet50_2 and wide_resnet101_2 (BasicBlock, Bottleneck with the stride and the groups
   on the 3x3 conv, downsample = 1x1 conv + BN), and the CIFAR ResNets of He et al. 2016
   (16/32/64 channels, 1x1 conv + BN projections where the shape changes, option B). */
#include <math.h>
#include <stdio.h>

#include "nn/model_impl.h"

#define BN_EPS 1e-5f
#define BN_MOMENTUM 0.1f

typedef struct resnet_def {
    bool bottleneck;
    bool cifar;
    int stages;
    int blocks[4];
    int groups, width_per_group; /* Bottleneck's 3x3: groups x (planes * wpg / 64) channels */
} resnet_def;

/* torchvision's kaiming_normal_(mode='fan_out', nonlinearity='relu') on every conv */
static void init_convs_fan_out(mgt_model *m)
{
    for (int e = 0; e < m->n_table; e++) {
        const mgt_model_entry *t = &m->table[e];
        if (t->what == MGT_TENSOR_CONV_WEIGHT)
            m->init[e] = (nn_entry_init){
                NN_INIT_NORMAL, sqrt(2.0 / (double)(t->shape[0] * t->shape[2] * t->shape[3]))};
    }
}

/* conv + BN (+ ReLU), the unit every block is made of */
static int cbn(mgt_model *m, const char *prefix, const char *conv, const char *bn, int x, int k,
               int r, int stride, int pad, int groups, bool relu)
{
    char cn[NN_NAME], bnn[NN_NAME], rn[NN_NAME];
    nn_name(m, cn, sizeof cn, "%s%s", prefix, conv);
    nn_name(m, bnn, sizeof bnn, "%s%s", prefix, bn);
    nn_name(m, rn, sizeof rn, "%srelu", prefix);
    int y = nn_bn(m, bnn, nn_conv(m, cn, x, k, r, stride, pad, groups, false), BN_EPS, BN_MOMENTUM);
    return relu ? nn_relu(m, rn, y) : y;
}

/* One block on x; its last BN's weight is zero-initialised under zero_init_residual. */
static int block(mgt_model *m, const resnet_def *a, const char *name, int x, int planes, int stride)
{
    char prefix[NN_NAME], ds[NN_NAME];
    nn_name(m, prefix, sizeof prefix, "%s.", name);
    int cin = m->values[x].c, out_c = a->bottleneck ? planes * 4 : planes, y;
    if (a->bottleneck) {
        int width = planes * a->width_per_group / 64 * a->groups;
        y = cbn(m, prefix, "conv1", "bn1", x, width, 1, 1, 0, 1, true);
        y = cbn(m, prefix, "conv2", "bn2", y, width, 3, stride, 1, a->groups, true);
        y = cbn(m, prefix, "conv3", "bn3", y, out_c, 1, 1, 0, 1, false);
    } else {
        y = cbn(m, prefix, "conv1", "bn1", x, planes, 3, stride, 1, 1, true);
        y = cbn(m, prefix, "conv2", "bn2", y, planes, 3, 1, 1, 1, false);
    }
    if (y >= 0 && m->cfg.zero_init_residual)
        m->init[nn_node_of(m, y)->entry[0]] = (nn_entry_init){NN_INIT_CONST, 0.0};
    int identity = x;
    if (stride != 1 || cin != out_c) {
        nn_name(m, ds, sizeof ds, "%s.downsample.", name);
        identity = cbn(m, ds, "0", "1", x, out_c, 1, stride, 0, 1, false);
    }
    nn_name(m, ds, sizeof ds, "%s.relu", name);
    return nn_relu(m, ds, nn_add(m, name, y, identity));
}

static mgt_status build_resnet(mgt_model *m, const void *arg)
{
    const resnet_def *a = arg;
    int x = nn_input(m);
    if (a->cifar)
        x = cbn(m, "", "conv1", "bn1", x, 16, 3, 1, 1, 1, true);
    else
        x = nn_maxpool(m, "maxpool", cbn(m, "", "conv1", "bn1", x, 64, 7, 2, 3, 1, true), 3, 2, 1);
    for (int s = 0; s < a->stages; s++)
        for (int j = 0; j < a->blocks[s]; j++) {
            char name[NN_NAME];
            nn_name(m, name, sizeof name, "layer%d.%d", s + 1, j);
            x = block(m, a, name, x, (a->cifar ? 16 : 64) << s, j == 0 && s > 0 ? 2 : 1);
        }
    nn_linear(m, "fc", nn_gap(m, "avgpool", x), m->cfg.classes);
    init_convs_fan_out(m);
    return MGT_OK;
}

static const resnet_def r18 = {false, false, 4, {2, 2, 2, 2}, 1, 64};
static const resnet_def r34 = {false, false, 4, {3, 4, 6, 3}, 1, 64};
static const resnet_def r50 = {true, false, 4, {3, 4, 6, 3}, 1, 64};
static const resnet_def r101 = {true, false, 4, {3, 4, 23, 3}, 1, 64};
static const resnet_def r152 = {true, false, 4, {3, 8, 36, 3}, 1, 64};
static const resnet_def rx50 = {true, false, 4, {3, 4, 6, 3}, 32, 4};
static const resnet_def rx101 = {true, false, 4, {3, 4, 23, 3}, 32, 8};
static const resnet_def rx101_64 = {true, false, 4, {3, 4, 23, 3}, 64, 4};
static const resnet_def wr50 = {true, false, 4, {3, 4, 6, 3}, 1, 128};
static const resnet_def wr101 = {true, false, 4, {3, 4, 23, 3}, 1, 128};
static const resnet_def c20 = {false, true, 3, {3, 3, 3}, 1, 64};
static const resnet_def c32 = {false, true, 3, {5, 5, 5}, 1, 64};
static const resnet_def c44 = {false, true, 3, {7, 7, 7}, 1, 64};
static const resnet_def c56 = {false, true, 3, {9, 9, 9}, 1, 64};
static const resnet_def c110 = {false, true, 3, {18, 18, 18}, 1, 64};

const nn_arch nn_resnet_archs[] = {
    {"resnet18", "resnet", build_resnet, &r18, "fc"},
    {"resnet34", "resnet", build_resnet, &r34, "fc"},
    {"resnet50", "resnet", build_resnet, &r50, "fc"},
    {"resnet101", "resnet", build_resnet, &r101, "fc"},
    {"resnet152", "resnet", build_resnet, &r152, "fc"},
    {"resnext50_32x4d", "resnet", build_resnet, &rx50, "fc"},
    {"resnext101_32x8d", "resnet", build_resnet, &rx101, "fc"},
    {"resnext101_64x4d", "resnet", build_resnet, &rx101_64, "fc"},
    {"wide_resnet50_2", "resnet", build_resnet, &wr50, "fc"},
    {"wide_resnet101_2", "resnet", build_resnet, &wr101, "fc"},
    {"resnet20", "cifar_resnet", build_resnet, &c20, "fc"},
    {"resnet32", "cifar_resnet", build_resnet, &c32, "fc"},
    {"resnet44", "cifar_resnet", build_resnet, &c44, "fc"},
    {"resnet56", "cifar_resnet", build_resnet, &c56, "fc"},
    {"resnet110", "cifar_resnet", build_resnet, &c110, "fc"},
    {NULL, NULL, NULL, NULL, NULL},
};
