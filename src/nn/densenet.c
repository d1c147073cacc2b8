/* torchvision's DenseNet-121, -161, -169 and -201 as layer graphs: conv0 (7x7/2), norm0, relu0, pool0
   (3x3/2 max), four dense blocks of _DenseLayers (norm1, relu1, conv1 1x1 to bn_size * growth,
   norm2, relu2, conv2 3x3 to growth) whose input is every earlier feature map of the block
   side by side, transitions (norm, relu, 1x1 conv halving the channels, AvgPool2d(2, 2)),
   norm5, ReLU, a global average pool and the classifier. Memory: as torchvision without
   memory_efficient, each layer's input is its own concatenation (the previous one and the new
   growth channels, one strided copy of each), so a block of L layers holds sum_i (c0 + i g)
   channels of concatenations and copies as much. The transition's AvgPool2d(2, 2) is the
   adaptive pool to (h / 2, w / 2), identical for even sides (bins [2i, 2i + 2)); odd sides are
   refused. Initialisation as torchvision's: kaiming_normal_ convs (std sqrt(2 / fan_in)),
   BN 1 and 0, classifier bias 0 (weight PyTorch's default). */
#include <math.h>
#include <stdio.h>

#include "nn/model_impl.h"

typedef struct densenet_def {
    int blocks[4];
    int growth, init_features, bn_size;
} densenet_def;

static int bn_relu_conv(mgt_model *m, const char *p, const char *bn, const char *relu,
                        const char *conv, int x, int out, int k)
{
    char a[NN_NAME], b[NN_NAME], c[NN_NAME];
    nn_name(m, a, sizeof a, "%s.%s", p, bn);
    nn_name(m, b, sizeof b, "%s.%s", p, relu);
    nn_name(m, c, sizeof c, "%s.%s", p, conv);
    x = nn_relu(m, b, nn_bn(m, a, x, 1e-5f, 0.1f));
    return nn_conv(m, c, x, out, k, 1, (k - 1) / 2, 1, false);
}

static mgt_status build_densenet(mgt_model *m, const void *arg)
{
    const densenet_def *d = arg;
    int x = nn_conv(m, "features.conv0", nn_input(m), d->init_features, 7, 2, 3, 1, false);
    x = nn_relu(m, "features.relu0", nn_bn(m, "features.norm0", x, 1e-5f, 0.1f));
    x = nn_maxpool(m, "features.pool0", x, 3, 2, 1);
    int c = d->init_features;
    for (int b = 0; b < 4; b++) {
        for (int l = 0; l < d->blocks[b]; l++) {
            char p[NN_NAME], q[NN_NAME];
            nn_name(m, p, sizeof p, "features.denseblock%d.denselayer%d", b + 1, l + 1);
            int y = bn_relu_conv(m, p, "norm1", "relu1", "conv1", x, d->bn_size * d->growth, 1);
            y = bn_relu_conv(m, p, "norm2", "relu2", "conv2", y, d->growth, 3);
            nn_name(m, q, sizeof q, "%s.cat", p);
            int in[2] = {x, y};
            x = nn_concat(m, q, in, 2);
            c += d->growth;
        }
        if (b < 3) {
            char p[NN_NAME], q[NN_NAME];
            nn_name(m, p, sizeof p, "features.transition%d", b + 1);
            x = bn_relu_conv(m, p, "norm", "relu", "conv", x, c / 2, 1);
            c /= 2;
            if (x < 0)
                return MGT_OK;
            const nn_value *v = &m->values[x];
            if (v->h % 2 || v->w % 2)
                return mgt_error_set(MGT_ERR_INVALID,
                                     "%s: %s sees %dx%d, an odd side (AvgPool2d(2, 2) is taken "
                                     "here only at even sides: use a multiple of 32)",
                                     m->arch, p, v->h, v->w);
            nn_name(m, q, sizeof q, "%s.pool", p);
            x = nn_apool(m, q, x, v->h / 2, v->w / 2);
        }
    }
    x = nn_relu(m, "features.relu5", nn_bn(m, "features.norm5", x, 1e-5f, 0.1f));
    nn_linear(m, "classifier", nn_gap(m, "avgpool", x), m->cfg.classes);
    for (int e = 0; e < m->n_table; e++) {
        const mgt_model_entry *t = &m->table[e];
        if (t->what == MGT_TENSOR_CONV_WEIGHT)
            m->init[e] = (nn_entry_init){
                NN_INIT_NORMAL, sqrt(2.0 / (double)(t->shape[1] * t->shape[2] * t->shape[3]))};
        else if (t->what == MGT_TENSOR_BIAS && m->nodes[t->layer].kind == NN_LINEAR)
            m->init[e] = (nn_entry_init){NN_INIT_CONST, 0.0};
    }
    return MGT_OK;
}

static const densenet_def d121 = {{6, 12, 24, 16}, 32, 64, 4}, d161 = {{6, 12, 36, 24}, 48, 96, 4},
                          d169 = {{6, 12, 32, 32}, 32, 64, 4}, d201 = {{6, 12, 48, 32}, 32, 64, 4};

const nn_arch nn_densenet_archs[] = {
    {"densenet121", "densenet", build_densenet, &d121, "classifier"},
    {"densenet161", "densenet", build_densenet, &d161, "classifier"},
    {"densenet169", "densenet", build_densenet, &d169, "classifier"},
    {"densenet201", "densenet", build_densenet, &d201, "classifier"},
    {NULL, NULL, NULL, NULL, NULL},
};
