/* torchvision's VGG family as layer graphs: vgg11/13/16/19 and their _bn variants
   (configurations A, B, D, E; 3x3 convs with bias, BN after each under _bn, 2x2 max pools),
   an adaptive average pool to 7x7 and the classifier Linear(25088, 4096), ReLU, Dropout,
   Linear(4096, 4096), ReLU, Dropout, Linear(4096, classes). Initialisation as torchvision's:
   convs kaiming_normal_(fan_out, relu) with bias 0, BN 1 and 0, linears N(0, 0.01) with
   bias 0. */
#include <math.h>
#include <stdio.h>

#include "nn/model_impl.h"

#define BN_EPS 1e-5f
#define BN_MOMENTUM 0.1f

typedef struct vgg_def {
    const int *cfg; /* channels of each conv, 0 for a max pool, -1 at the end */
    bool bn;
} vgg_def;

static const int cfg_a[] = {64, 0, 128, 0, 256, 256, 0, 512, 512, 0, 512, 512, 0, -1};
static const int cfg_b[] = {64, 64, 0, 128, 128, 0, 256, 256, 0, 512, 512, 0, 512, 512, 0, -1};
static const int cfg_d[] = {64,  64,  0,   128, 128, 0,   256, 256, 256, 0,
                            512, 512, 512, 0,   512, 512, 512, 0,   -1};
static const int cfg_e[] = {64,  64,  0,   128, 128, 0,   256, 256, 256, 256, 0,
                            512, 512, 512, 512, 0,   512, 512, 512, 512, 0,   -1};

/* The init rules the family shares with AlexNet's classifier where they differ from the
   defaults nn_conv and nn_linear set. */
static void init_vgg(mgt_model *m)
{
    for (int e = 0; e < m->n_table; e++) {
        const mgt_model_entry *t = &m->table[e];
        if (t->what == MGT_TENSOR_CONV_WEIGHT)
            m->init[e] = (nn_entry_init){
                NN_INIT_NORMAL, sqrt(2.0 / (double)(t->shape[0] * t->shape[2] * t->shape[3]))};
        else if (t->what == MGT_TENSOR_LINEAR_WEIGHT)
            m->init[e] = (nn_entry_init){NN_INIT_NORMAL, 0.01};
        else if (t->what == MGT_TENSOR_BIAS)
            m->init[e] = (nn_entry_init){NN_INIT_CONST, 0.0};
    }
}

static mgt_status build_vgg(mgt_model *m, const void *arg)
{
    const vgg_def *a = arg;
    int x = nn_input(m), i = 0;
    char name[NN_NAME];
    for (const int *c = a->cfg; *c >= 0; c++) {
        if (*c == 0) {
            nn_name(m, name, sizeof name, "features.%d", i++);
            x = nn_maxpool(m, name, x, 2, 2, 0);
            continue;
        }
        nn_name(m, name, sizeof name, "features.%d", i++);
        x = nn_conv(m, name, x, *c, 3, 1, 1, 1, true);
        if (a->bn) {
            nn_name(m, name, sizeof name, "features.%d", i++);
            x = nn_bn(m, name, x, BN_EPS, BN_MOMENTUM);
        }
        nn_name(m, name, sizeof name, "features.%d", i++);
        x = nn_relu(m, name, x);
    }
    x = nn_apool(m, "avgpool", x, 7, 7);
    x = nn_relu(m, "classifier.1", nn_linear(m, "classifier.0", x, 4096));
    x = nn_dropout(m, "classifier.2", x, 0.5f);
    x = nn_relu(m, "classifier.4", nn_linear(m, "classifier.3", x, 4096));
    x = nn_dropout(m, "classifier.5", x, 0.5f);
    nn_linear(m, "classifier.6", x, m->cfg.classes);
    init_vgg(m);
    return MGT_OK;
}

static const vgg_def v11 = {cfg_a, false}, v13 = {cfg_b, false}, v16 = {cfg_d, false},
                     v19 = {cfg_e, false}, v11b = {cfg_a, true}, v13b = {cfg_b, true},
                     v16b = {cfg_d, true}, v19b = {cfg_e, true};

const nn_arch nn_vgg_archs[] = {
    {"vgg11", "vgg", build_vgg, &v11, "classifier.6"},
    {"vgg13", "vgg", build_vgg, &v13, "classifier.6"},
    {"vgg16", "vgg", build_vgg, &v16, "classifier.6"},
    {"vgg19", "vgg", build_vgg, &v19, "classifier.6"},
    {"vgg11_bn", "vgg", build_vgg, &v11b, "classifier.6"},
    {"vgg13_bn", "vgg", build_vgg, &v13b, "classifier.6"},
    {"vgg16_bn", "vgg", build_vgg, &v16b, "classifier.6"},
    {"vgg19_bn", "vgg", build_vgg, &v19b, "classifier.6"},
    {NULL, NULL, NULL, NULL, NULL},
};
