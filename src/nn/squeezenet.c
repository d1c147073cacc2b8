/* torchvision's SqueezeNet 1.0 and 1.1 as layer graphs: Fire modules (a 1x1 squeeze conv and
   ReLU, then 1x1 and 3x3 expand convs each with ReLU, concatenated along channels), max pools
   with ceil_mode, and the classifier Dropout, a 1x1 final conv to the classes, ReLU and an
   adaptive average pool to 1x1. Initialisation as torchvision's: final_conv N(0, 0.01), the
   other convs kaiming_uniform_ (U(+-sqrt(6 / fan_in))), every bias 0. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "nn/model_impl.h"

static int fire(mgt_model *m, int idx, int x, int squeeze, int e1, int e3)
{
    char a[NN_NAME], b[NN_NAME];
    nn_name(m, a, sizeof a, "features.%d.squeeze", idx);
    nn_name(m, b, sizeof b, "features.%d.squeeze_activation", idx);
    x = nn_relu(m, b, nn_conv(m, a, x, squeeze, 1, 1, 0, 1, true));
    nn_name(m, a, sizeof a, "features.%d.expand1x1", idx);
    nn_name(m, b, sizeof b, "features.%d.expand1x1_activation", idx);
    int y1 = nn_relu(m, b, nn_conv(m, a, x, e1, 1, 1, 0, 1, true));
    nn_name(m, a, sizeof a, "features.%d.expand3x3", idx);
    nn_name(m, b, sizeof b, "features.%d.expand3x3_activation", idx);
    int y3 = nn_relu(m, b, nn_conv(m, a, x, e3, 3, 1, 1, 1, true));
    nn_name(m, a, sizeof a, "features.%d", idx);
    int in[2] = {y1, y3};
    return nn_concat(m, a, in, 2);
}

static mgt_status build_squeezenet(mgt_model *m, const void *arg)
{
    const int version = *(const int *)arg;
    int x = nn_input(m);
    if (version == 10) {
        x = nn_relu(m, "features.1", nn_conv(m, "features.0", x, 96, 7, 2, 0, 1, true));
        x = nn_maxpool_ceil(m, "features.2", x, 3, 2, 0);
        x = fire(m, 3, x, 16, 64, 64);
        x = fire(m, 4, x, 16, 64, 64);
        x = fire(m, 5, x, 32, 128, 128);
        x = nn_maxpool_ceil(m, "features.6", x, 3, 2, 0);
        x = fire(m, 7, x, 32, 128, 128);
        x = fire(m, 8, x, 48, 192, 192);
        x = fire(m, 9, x, 48, 192, 192);
        x = fire(m, 10, x, 64, 256, 256);
        x = nn_maxpool_ceil(m, "features.11", x, 3, 2, 0);
        x = fire(m, 12, x, 64, 256, 256);
    } else {
        x = nn_relu(m, "features.1", nn_conv(m, "features.0", x, 64, 3, 2, 0, 1, true));
        x = nn_maxpool_ceil(m, "features.2", x, 3, 2, 0);
        x = fire(m, 3, x, 16, 64, 64);
        x = fire(m, 4, x, 16, 64, 64);
        x = nn_maxpool_ceil(m, "features.5", x, 3, 2, 0);
        x = fire(m, 6, x, 32, 128, 128);
        x = fire(m, 7, x, 32, 128, 128);
        x = nn_maxpool_ceil(m, "features.8", x, 3, 2, 0);
        x = fire(m, 9, x, 48, 192, 192);
        x = fire(m, 10, x, 48, 192, 192);
        x = fire(m, 11, x, 64, 256, 256);
        x = fire(m, 12, x, 64, 256, 256);
    }
    x = nn_dropout(m, "classifier.0", x, 0.5f);
    x = nn_conv(m, "classifier.1", x, m->cfg.classes, 1, 1, 0, 1, true);
    x = nn_relu(m, "classifier.2", x);
    nn_apool(m, "classifier.3", x, 1, 1);
    for (int e = 0; e < m->n_table; e++) {
        const mgt_model_entry *t = &m->table[e];
        if (t->what == MGT_TENSOR_BIAS)
            m->init[e] = (nn_entry_init){NN_INIT_CONST, 0.0};
        else if (t->what == MGT_TENSOR_CONV_WEIGHT && strcmp(t->name, "classifier.1.weight") == 0)
            m->init[e] = (nn_entry_init){NN_INIT_NORMAL, 0.01};
        else if (t->what == MGT_TENSOR_CONV_WEIGHT)
            m->init[e] = (nn_entry_init){
                NN_INIT_UNIFORM, sqrt(6.0 / (double)(t->shape[1] * t->shape[2] * t->shape[3]))};
    }
    return MGT_OK;
}

static const int v10 = 10, v11 = 11;

const nn_arch nn_squeezenet_archs[] = {
    {"squeezenet1_0", "squeezenet", build_squeezenet, &v10, "classifier.1"},
    {"squeezenet1_1", "squeezenet", build_squeezenet, &v11, "classifier.1"},
    {NULL, NULL, NULL, NULL, NULL},
};
