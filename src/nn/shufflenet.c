/* torchvision's ShuffleNet V2 (x0_5, x1_0, x1_5, x2_0) as a layer graph: conv1 (3x3/2, BN, ReLU), a 3x3/2
   max pool, stages 2-4 of InvertedResidual units (stride 2: branch1 = depthwise 3x3/2 + BN +
   1x1 + BN + ReLU beside branch2; stride 1: the input's first half passed through beside
   branch2 of its second half, torch's chunk as two slices), each unit's two halves
   concatenated and channel-shuffled with groups 2 in one node, conv5 (1x1, BN, ReLU), the mean
   over H and W and fc. torchvision sets no init of its own: PyTorch's defaults (nn_conv's,
   BN 1 and 0, nn_linear's). */
#include <stdio.h>

#include "nn/model_impl.h"

/* conv (no bias) "<p>.<i>" then BN "<p>.<i+1>", and ReLU "<p>.<i+2>" where relu */
static int cbr(mgt_model *m, const char *p, int i, int x, int out, int k, int stride, int groups,
               bool relu)
{
    char cn[NN_NAME], bn[NN_NAME], rn[NN_NAME];
    nn_name(m, cn, sizeof cn, "%s.%d", p, i);
    nn_name(m, bn, sizeof bn, "%s.%d", p, i + 1);
    nn_name(m, rn, sizeof rn, "%s.%d", p, i + 2);
    x = nn_bn(m, bn, nn_conv(m, cn, x, out, k, stride, (k - 1) / 2, groups, false), 1e-5f, 0.1f);
    return relu ? nn_relu(m, rn, x) : x;
}

static int unit(mgt_model *m, int stage, int idx, int x, int oup, int stride)
{
    char p[NN_NAME], b1[NN_NAME], b2[NN_NAME], n[NN_NAME];
    nn_name(m, p, sizeof p, "stage%d.%d", stage, idx);
    nn_name(m, b1, sizeof b1, "stage%d.%d.branch1", stage, idx);
    nn_name(m, b2, sizeof b2, "stage%d.%d.branch2", stage, idx);
    if (x < 0)
        return -1;
    int inp = m->values[x].c, bf = oup / 2, left, right = x;
    if (stride > 1) {
        left = cbr(m, b1, 0, x, inp, 3, stride, inp, false);
        left = cbr(m, b1, 2, left, bf, 1, 1, 1, true);
    } else {
        nn_name(m, n, sizeof n, "stage%d.%d.chunk0", stage, idx);
        left = nn_slice(m, n, x, 0, bf);
        nn_name(m, n, sizeof n, "stage%d.%d.chunk1", stage, idx);
        right = nn_slice(m, n, x, bf, bf);
    }
    right = cbr(m, b2, 0, right, bf, 1, 1, 1, true);
    right = cbr(m, b2, 3, right, bf, 3, stride, bf, false);
    right = cbr(m, b2, 5, right, bf, 1, 1, 1, true);
    int in[2] = {left, right};
    return nn_cat_shuffle(m, p, in, 2);
}

static mgt_status build_shufflenet(mgt_model *m, const void *arg)
{
    const int *ch = arg; /* stages_out_channels */
    static const int repeats[3] = {4, 8, 4};
    int x = cbr(m, "conv1", 0, nn_input(m), ch[0], 3, 2, 1, true);
    x = nn_maxpool(m, "maxpool", x, 3, 2, 1);
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < repeats[s]; i++)
            x = unit(m, s + 2, i, x, ch[s + 1], i == 0 ? 2 : 1);
    x = cbr(m, "conv5", 0, x, ch[4], 1, 1, 1, true);
    nn_linear(m, "fc", nn_gap(m, "mean", x), m->cfg.classes);
    return MGT_OK;
}

static const int x0_5[5] = {24, 48, 96, 192, 1024}, x1_0[5] = {24, 116, 232, 464, 1024},
                 x1_5[5] = {24, 176, 352, 704, 1024}, x2_0[5] = {24, 244, 488, 976, 2048};

const nn_arch nn_shufflenet_archs[] = {
    {"shufflenet_v2_x0_5", "shufflenet", build_shufflenet, x0_5, "fc"},
    {"shufflenet_v2_x1_0", "shufflenet", build_shufflenet, x1_0, "fc"},
    {"shufflenet_v2_x1_5", "shufflenet", build_shufflenet, x1_5, "fc"},
    {"shufflenet_v2_x2_0", "shufflenet", build_shufflenet, x2_0, "fc"},
    {NULL, NULL, NULL, NULL, NULL},
};
