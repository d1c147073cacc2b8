/* torchvision's AlexNet as a layer graph (the one-GPU variant of "One weird trick"): five
   convs with bias and ReLU, three 3/2 max pools, an adaptive average pool to 6x6 and the
   classifier Dropout, Linear(9216, 4096), ReLU, Dropout, Linear(4096, 4096), ReLU,
   Linear(4096, classes). torchvision leaves PyTorch's default initialisation, as nn_conv and
   nn_linear do. The smallest input is 63x63. */
#include "nn/model_impl.h"

static mgt_status build_alexnet(mgt_model *m, const void *arg)
{
    (void)arg;
    int x = nn_input(m);
    x = nn_relu(m, "features.1", nn_conv(m, "features.0", x, 64, 11, 4, 2, 1, true));
    x = nn_maxpool(m, "features.2", x, 3, 2, 0);
    x = nn_relu(m, "features.4", nn_conv(m, "features.3", x, 192, 5, 1, 2, 1, true));
    x = nn_maxpool(m, "features.5", x, 3, 2, 0);
    x = nn_relu(m, "features.7", nn_conv(m, "features.6", x, 384, 3, 1, 1, 1, true));
    x = nn_relu(m, "features.9", nn_conv(m, "features.8", x, 256, 3, 1, 1, 1, true));
    x = nn_relu(m, "features.11", nn_conv(m, "features.10", x, 256, 3, 1, 1, 1, true));
    x = nn_maxpool(m, "features.12", x, 3, 2, 0);
    x = nn_apool(m, "avgpool", x, 6, 6);
    x = nn_dropout(m, "classifier.0", x, 0.5f);
    x = nn_relu(m, "classifier.2", nn_linear(m, "classifier.1", x, 4096));
    x = nn_dropout(m, "classifier.3", x, 0.5f);
    x = nn_relu(m, "classifier.5", nn_linear(m, "classifier.4", x, 4096));
    nn_linear(m, "classifier.6", x, m->cfg.classes);
    return MGT_OK;
}

const nn_arch nn_alexnet_archs[] = {
    {"alexnet", "alexnet", build_alexnet, NULL, "classifier.6"},
    {NULL, NULL, NULL, NULL, NULL},
};
