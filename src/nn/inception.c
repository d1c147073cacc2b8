/* GoogLeNet and Inception v3 as layer graphs, as torchvision 0.14 defines them: BasicConv2d
   units (conv without bias, BN eps 1e-3, ReLU), Inception blocks whose branches are
   concatenated (GoogLeNet's 3x3 "5x5" branch as torchvision keeps it; Inception v3's A-E
   blocks with 1x7/7x1 and 1x3/3x1 factorised convolutions and avg_pool2d(3, 1, 1) branches,
   count_include_pad as torch's default), the auxiliary classifiers (GoogLeNet's aux1 after
   inception4a and aux2 after inception4d; Inception v3's AuxLogits after Mixed_6e), which run
   in training only and whose losses join the main one weighted (mgt_arch_info.aux_weight), and
   transform_input (mgt_model_config.transform_input) as the first layer where set.

   The auxiliary heads are built where torchvision's state_dict lists them: Inception v3's
   after Mixed_6e (where its forward computes it too), GoogLeNet's after inception5b, reading
   inception4a's and inception4d's outputs, which stay in the activation arena until then.
   Initialisation as torchvision's: trunc_normal_(std 0.1, at +-2) on Inception v3's conv and
   linear weights (0.01 on AuxLogits.conv1, 0.001 on AuxLogits.fc), trunc_normal_(std 0.01, at
   +-2) on GoogLeNet's; bounds 20 and 200 standard deviations out, so a plain normal here;
   linear biases keep PyTorch's default, BN 1 and 0. */
#include <stdio.h>
#include <string.h>

#include "nn/model_impl.h"

/* BasicConv2d "<p>": conv "<p>.conv" (rh x rw, padding ph, pw), BN "<p>.bn", ReLU */
static int basic(mgt_model *m, const char *p, int x, int out, int rh, int rw, int stride, int ph,
                 int pw)
{
    char cn[NN_NAME], bn[NN_NAME], rn[NN_NAME];
    nn_name(m, cn, sizeof cn, "%s.conv", p);
    nn_name(m, bn, sizeof bn, "%s.bn", p);
    nn_name(m, rn, sizeof rn, "%s.relu", p);
    x = nn_conv_rect(m, cn, x, out, rh, rw, stride, ph, pw, 1, false);
    return nn_relu(m, rn, nn_bn(m, bn, x, 1e-3f, 0.1f));
}

/* a square BasicConv2d "<block>.<branch>" */
static int bc(mgt_model *m, const char *block, const char *branch, int x, int out, int k,
              int stride, int pad)
{
    char p[NN_NAME];
    nn_name(m, p, sizeof p, "%s.%s", block, branch);
    return basic(m, p, x, out, k, k, stride, pad, pad);
}

/* a 1 x 7 (wide) or 7 x 1 BasicConv2d, or 1 x 3 / 3 x 1 (k = 3), padded to keep the side */
static int bc_row(mgt_model *m, const char *block, const char *branch, int x, int out, int k)
{
    char p[NN_NAME];
    nn_name(m, p, sizeof p, "%s.%s", block, branch);
    return basic(m, p, x, out, 1, k, 1, 0, k / 2);
}

static int bc_col(mgt_model *m, const char *block, const char *branch, int x, int out, int k)
{
    char p[NN_NAME];
    nn_name(m, p, sizeof p, "%s.%s", block, branch);
    return basic(m, p, x, out, k, 1, 1, k / 2, 0);
}

static void named(mgt_model *m, const char *block, const char *what, char *buf)
{
    nn_name(m, buf, NN_NAME, "%s.%s", block, what);
}

static int avg3(mgt_model *m, const char *block, int x)
{
    char n[NN_NAME];
    named(m, block, "avg_pool2d", n);
    return nn_avgpool2d(m, n, x, 3, 1, 1);
}

static int max3s2(mgt_model *m, const char *block, int x)
{
    char n[NN_NAME];
    named(m, block, "max_pool2d", n);
    return nn_maxpool(m, n, x, 3, 2, 0);
}

static int cat(mgt_model *m, const char *block, const int *in, int n)
{
    return nn_concat(m, block, in, n);
}

/* ---- Inception v3 ---- */

static int inception_a(mgt_model *m, const char *b, int x, int pool_features)
{
    int y[4];
    y[0] = bc(m, b, "branch1x1", x, 64, 1, 1, 0);
    y[1] = bc(m, b, "branch5x5_1", x, 48, 1, 1, 0);
    y[1] = bc(m, b, "branch5x5_2", y[1], 64, 5, 1, 2);
    y[2] = bc(m, b, "branch3x3dbl_1", x, 64, 1, 1, 0);
    y[2] = bc(m, b, "branch3x3dbl_2", y[2], 96, 3, 1, 1);
    y[2] = bc(m, b, "branch3x3dbl_3", y[2], 96, 3, 1, 1);
    y[3] = bc(m, b, "branch_pool", avg3(m, b, x), pool_features, 1, 1, 0);
    return cat(m, b, y, 4);
}

static int inception_b(mgt_model *m, const char *b, int x)
{
    int y[3];
    y[0] = bc(m, b, "branch3x3", x, 384, 3, 2, 0);
    y[1] = bc(m, b, "branch3x3dbl_1", x, 64, 1, 1, 0);
    y[1] = bc(m, b, "branch3x3dbl_2", y[1], 96, 3, 1, 1);
    y[1] = bc(m, b, "branch3x3dbl_3", y[1], 96, 3, 2, 0);
    y[2] = max3s2(m, b, x);
    return cat(m, b, y, 3);
}

static int inception_c(mgt_model *m, const char *b, int x, int c7)
{
    int y[4];
    y[0] = bc(m, b, "branch1x1", x, 192, 1, 1, 0);
    y[1] = bc(m, b, "branch7x7_1", x, c7, 1, 1, 0);
    y[1] = bc_row(m, b, "branch7x7_2", y[1], c7, 7);
    y[1] = bc_col(m, b, "branch7x7_3", y[1], 192, 7);
    y[2] = bc(m, b, "branch7x7dbl_1", x, c7, 1, 1, 0);
    y[2] = bc_col(m, b, "branch7x7dbl_2", y[2], c7, 7);
    y[2] = bc_row(m, b, "branch7x7dbl_3", y[2], c7, 7);
    y[2] = bc_col(m, b, "branch7x7dbl_4", y[2], c7, 7);
    y[2] = bc_row(m, b, "branch7x7dbl_5", y[2], 192, 7);
    y[3] = bc(m, b, "branch_pool", avg3(m, b, x), 192, 1, 1, 0);
    return cat(m, b, y, 4);
}

static int inception_d(mgt_model *m, const char *b, int x)
{
    int y[3];
    y[0] = bc(m, b, "branch3x3_1", x, 192, 1, 1, 0);
    y[0] = bc(m, b, "branch3x3_2", y[0], 320, 3, 2, 0);
    y[1] = bc(m, b, "branch7x7x3_1", x, 192, 1, 1, 0);
    y[1] = bc_row(m, b, "branch7x7x3_2", y[1], 192, 7);
    y[1] = bc_col(m, b, "branch7x7x3_3", y[1], 192, 7);
    y[1] = bc(m, b, "branch7x7x3_4", y[1], 192, 3, 2, 0);
    y[2] = max3s2(m, b, x);
    return cat(m, b, y, 3);
}

/* torch.cat([branch1x1, cat(3x3_2a, 3x3_2b), cat(3x3dbl_3a, 3x3dbl_3b), branch_pool]) is
   one concatenation of the six */
static int inception_e(mgt_model *m, const char *b, int x)
{
    int y[6];
    y[0] = bc(m, b, "branch1x1", x, 320, 1, 1, 0);
    int t = bc(m, b, "branch3x3_1", x, 384, 1, 1, 0);
    y[1] = bc_row(m, b, "branch3x3_2a", t, 384, 3);
    y[2] = bc_col(m, b, "branch3x3_2b", t, 384, 3);
    t = bc(m, b, "branch3x3dbl_1", x, 448, 1, 1, 0);
    t = bc(m, b, "branch3x3dbl_2", t, 384, 3, 1, 1);
    y[3] = bc_row(m, b, "branch3x3dbl_3a", t, 384, 3);
    y[4] = bc_col(m, b, "branch3x3dbl_3b", t, 384, 3);
    y[5] = bc(m, b, "branch_pool", avg3(m, b, x), 192, 1, 1, 0);
    return cat(m, b, y, 6);
}

/* torchvision's _transform_input: the channels normalised with ImageNet's mean and std mapped
   to the (x - 0.5) / 0.5 its ported weights expect */
static int transform_input(mgt_model *m, int x)
{
    if (!m->cfg.transform_input)
        return x;
    const float scale[3] = {(float)(0.229 / 0.5), (float)(0.224 / 0.5), (float)(0.225 / 0.5)};
    const float shift[3] = {(float)((0.485 - 0.5) / 0.5), (float)((0.456 - 0.5) / 0.5),
                            (float)((0.406 - 0.5) / 0.5)};
    return nn_affine(m, "transform_input", x, scale, shift);
}

/* std of trunc_normal_ per weight: AuxLogits.conv1's and AuxLogits.fc's own, else `std` */
static void init_trunc_normal(mgt_model *m, double std)
{
    for (int e = 0; e < m->n_table; e++) {
        const mgt_model_entry *t = &m->table[e];
        if (t->what != MGT_TENSOR_CONV_WEIGHT && t->what != MGT_TENSOR_LINEAR_WEIGHT)
            continue;
        double s = std;
        if (strcmp(t->name, "AuxLogits.conv1.conv.weight") == 0)
            s = 0.01;
        else if (strcmp(t->name, "AuxLogits.fc.weight") == 0)
            s = 0.001;
        m->init[e] = (nn_entry_init){NN_INIT_NORMAL, s};
    }
}

static mgt_status build_inception_v3(mgt_model *m, const void *arg)
{
    (void)arg;
    bool aux = !m->cfg.no_aux_logits;
    int x = transform_input(m, nn_input(m));
    x = basic(m, "Conv2d_1a_3x3", x, 32, 3, 3, 2, 0, 0);
    x = basic(m, "Conv2d_2a_3x3", x, 32, 3, 3, 1, 0, 0);
    x = basic(m, "Conv2d_2b_3x3", x, 64, 3, 3, 1, 1, 1);
    x = nn_maxpool(m, "maxpool1", x, 3, 2, 0);
    x = basic(m, "Conv2d_3b_1x1", x, 80, 1, 1, 1, 0, 0);
    x = basic(m, "Conv2d_4a_3x3", x, 192, 3, 3, 1, 0, 0);
    x = nn_maxpool(m, "maxpool2", x, 3, 2, 0);
    x = inception_a(m, "Mixed_5b", x, 32);
    x = inception_a(m, "Mixed_5c", x, 64);
    x = inception_a(m, "Mixed_5d", x, 64);
    x = inception_b(m, "Mixed_6a", x);
    x = inception_c(m, "Mixed_6b", x, 128);
    x = inception_c(m, "Mixed_6c", x, 160);
    x = inception_c(m, "Mixed_6d", x, 160);
    x = inception_c(m, "Mixed_6e", x, 192);
    if (aux && x >= 0) {
        /* avg_pool2d(5, 3) then a valid 5x5 conv: Mixed_6e must be 17x17 at least */
        if (m->values[x].h < 17)
            return mgt_error_set(MGT_ERR_INVALID,
                                 "%s: its auxiliary classifier needs a 299x299 input at least "
                                 "(this %dx%d leaves Mixed_6e at %dx%d, under 17x17); without it "
                                 "(--aux-logits off) 75x75 will do",
                                 m->arch, m->cfg.image_size, m->cfg.image_size, m->values[x].h,
                                 m->values[x].w);
        int a = nn_avgpool2d(m, "AuxLogits.avg_pool2d", x, 5, 3, 0);
        a = basic(m, "AuxLogits.conv0", a, 128, 1, 1, 1, 0, 0);
        a = basic(m, "AuxLogits.conv1", a, 768, 5, 5, 1, 0, 0);
        a = nn_linear(m, "AuxLogits.fc", nn_gap(m, "AuxLogits.adaptive_avg_pool2d", a),
                      m->cfg.classes);
        nn_aux_logits(m, a);
    }
    x = inception_d(m, "Mixed_7a", x);
    x = inception_e(m, "Mixed_7b", x);
    x = inception_e(m, "Mixed_7c", x);
    x = nn_dropout(m, "dropout", nn_gap(m, "avgpool", x), 0.5f);
    nn_linear(m, "fc", x, m->cfg.classes);
    init_trunc_normal(m, 0.1);
    return MGT_OK;
}

/* ---- GoogLeNet ---- */

/* Inception(in, ch1x1, ch3x3red, ch3x3, ch5x5red, ch5x5, pool_proj) "<b>" */
static int inception(mgt_model *m, const char *b, int x, const int *ch)
{
    int y[4];
    char n[NN_NAME];
    y[0] = bc(m, b, "branch1", x, ch[0], 1, 1, 0);
    y[1] = bc(m, b, "branch2.0", x, ch[1], 1, 1, 0);
    y[1] = bc(m, b, "branch2.1", y[1], ch[2], 3, 1, 1);
    y[2] = bc(m, b, "branch3.0", x, ch[3], 1, 1, 0);
    /* torchvision's 3x3 where the paper has 5x5, kept for its ported weights */
    y[2] = bc(m, b, "branch3.1", y[2], ch[4], 3, 1, 1);
    named(m, b, "branch4.0", n);
    y[3] = bc(m, b, "branch4.1", nn_maxpool_ceil(m, n, x, 3, 1, 1), ch[5], 1, 1, 0);
    return cat(m, b, y, 4);
}

/* InceptionAux "<p>" on x: adaptive avg pool to 4x4, BasicConv2d 1x1 to 128, fc1 (2048 to
   1024), ReLU, dropout 0.7, fc2 */
static int googlenet_aux(mgt_model *m, const char *p, int x)
{
    char n[NN_NAME];
    named(m, p, "adaptive_avg_pool2d", n);
    x = nn_apool(m, n, x, 4, 4);
    x = bc(m, p, "conv", x, 128, 1, 1, 0);
    named(m, p, "fc1", n);
    x = nn_linear(m, n, x, 1024);
    named(m, p, "relu", n);
    x = nn_relu(m, n, x);
    named(m, p, "dropout", n);
    x = nn_dropout(m, n, x, 0.7f);
    named(m, p, "fc2", n);
    return nn_linear(m, n, x, m->cfg.classes);
}

static mgt_status build_googlenet(mgt_model *m, const void *arg)
{
    (void)arg;
    static const int i3a[6] = {64, 96, 128, 16, 32, 32}, i3b[6] = {128, 128, 192, 32, 96, 64},
                     i4a[6] = {192, 96, 208, 16, 48, 64}, i4b[6] = {160, 112, 224, 24, 64, 64},
                     i4c[6] = {128, 128, 256, 24, 64, 64}, i4d[6] = {112, 144, 288, 32, 64, 64},
                     i4e[6] = {256, 160, 320, 32, 128, 128}, i5a[6] = {256, 160, 320, 32, 128, 128},
                     i5b[6] = {384, 192, 384, 48, 128, 128};
    int x = transform_input(m, nn_input(m));
    x = basic(m, "conv1", x, 64, 7, 7, 2, 3, 3);
    x = nn_maxpool_ceil(m, "maxpool1", x, 3, 2, 0);
    x = basic(m, "conv2", x, 64, 1, 1, 1, 0, 0);
    x = basic(m, "conv3", x, 192, 3, 3, 1, 1, 1);
    x = nn_maxpool_ceil(m, "maxpool2", x, 3, 2, 0);
    x = inception(m, "inception3a", x, i3a);
    x = inception(m, "inception3b", x, i3b);
    x = nn_maxpool_ceil(m, "maxpool3", x, 3, 2, 0);
    int x4a = inception(m, "inception4a", x, i4a);
    x = inception(m, "inception4b", x4a, i4b);
    x = inception(m, "inception4c", x, i4c);
    int x4d = inception(m, "inception4d", x, i4d);
    x = inception(m, "inception4e", x4d, i4e);
    x = nn_maxpool_ceil(m, "maxpool4", x, 2, 2, 0);
    x = inception(m, "inception5a", x, i5a);
    x = inception(m, "inception5b", x, i5b);
    if (!m->cfg.no_aux_logits) {
        nn_aux_logits(m, googlenet_aux(m, "aux1", x4a));
        nn_aux_logits(m, googlenet_aux(m, "aux2", x4d));
    }
    x = nn_dropout(m, "dropout", nn_gap(m, "avgpool", x), 0.2f);
    nn_linear(m, "fc", x, m->cfg.classes);
    init_trunc_normal(m, 0.01);
    return MGT_OK;
}

const nn_arch nn_inception_archs[] = {
    /* the main head; the auxiliary classifiers' last layers (aux1.fc2 and aux2.fc2,
       AuxLogits.fc), training only, follow the class count too (nn_plan marks them) */
    {"googlenet", "googlenet", build_googlenet, NULL, "fc"},
    {"inception_v3", "inception", build_inception_v3, NULL, "fc"},
    {NULL, NULL, NULL, NULL, NULL},
};
