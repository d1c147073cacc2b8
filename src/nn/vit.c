/* The Vision Transformers as layer graphs, as torchvision 0.14 defines them (vit_b_16,
   vit_b_32, vit_l_16, vit_l_32, vit_h_14): conv_proj (patch x patch, stride patch, with bias),
   the class token before the patches, the position embedding added, `layers` encoder blocks
   (ln_1, multi-head self-attention with the packed in_proj and out_proj, the residual; ln_2,
   MLP dim -> mlp_dim, GELU, -> dim, the residual), encoder.ln, the class token's row into
   heads.head. Dropout and attention dropout are torchvision's defaults, 0, and so not built.

   Tokens are values [1, tokens, dim] (one window of `tokens` rows). The image side must be a
   multiple of the patch; the position embedding has (side / patch)^2 + 1 rows, as torchvision's
   image_size argument makes it. */
#include <math.h>
#include <stdio.h>

#include "nn/model_impl.h"

typedef struct vit_def {
    int patch, layers, heads, hidden, mlp;
} vit_def;

/* torchvision's inits that are not the defaults of the layers as built */
static void set_init(mgt_model *m, int entry, nn_init kind, double arg)
{
    if (entry >= 0)
        m->init[entry] = (nn_entry_init){kind, arg};
}

static int last_entry(mgt_model *m, int j) { return nn_last_node(m)->entry[j]; }

static int encoder_block(mgt_model *m, const char *p, int x, const vit_def *d)
{
    char n[NN_NAME];
    int dim = d->hidden;
    nn_name(m, n, sizeof n, "%s.ln_1", p);
    int y = nn_layernorm(m, n, x, 1e-6f);
    /* nn.MultiheadAttention: in_proj xavier_uniform_ (fan_in dim, fan_out 3 dim), in_proj_bias
       and out_proj.bias 0, out_proj.weight Linear's default; both run as F.linear */
    nn_name(m, n, sizeof n, "%s.self_attention", p);
    y = nn_token_linear(m, n, y, 3 * dim, true, "in_proj_weight", "in_proj_bias");
    if (y >= 0) {
        nn_last_node(m)->u.linear.functional = true;
        set_init(m, last_entry(m, 0), NN_INIT_UNIFORM, sqrt(6.0 / (4.0 * dim)));
        set_init(m, last_entry(m, 1), NN_INIT_CONST, 0.0);
    }
    y = nn_attention(m, n, y, d->heads, 1, -1, 0, NULL, NULL);
    nn_name(m, n, sizeof n, "%s.self_attention.out_proj", p);
    y = nn_token_linear(m, n, y, dim, true, "weight", "bias");
    if (y >= 0) {
        nn_last_node(m)->u.linear.functional = true;
        set_init(m, last_entry(m, 1), NN_INIT_CONST, 0.0);
    }
    nn_name(m, n, sizeof n, "%s.attention_residual", p);
    x = nn_add(m, n, x, y);
    nn_name(m, n, sizeof n, "%s.ln_2", p);
    y = nn_layernorm(m, n, x, 1e-6f);
    /* MLPBlock: xavier_uniform_ weights, normal_(std 1e-6) biases */
    static const char *const mlp[2] = {"mlp.0", "mlp.3"};
    for (int i = 0; i < 2; i++) {
        int in = i == 0 ? dim : d->mlp, out = i == 0 ? d->mlp : dim;
        nn_name(m, n, sizeof n, "%s.%s", p, mlp[i]);
        y = nn_token_linear(m, n, y, out, true, "weight", "bias");
        if (y >= 0) {
            set_init(m, last_entry(m, 0), NN_INIT_UNIFORM, sqrt(6.0 / (in + out)));
            set_init(m, last_entry(m, 1), NN_INIT_NORMAL, 1e-6);
        }
        if (i == 0) {
            nn_name(m, n, sizeof n, "%s.mlp.1", p);
            y = nn_activation(m, n, y, MGT_ACT_GELU);
        }
    }
    return nn_add(m, p, x, y);
}

static mgt_status build_vit(mgt_model *m, const void *arg)
{
    const vit_def *d = arg;
    int side = m->cfg.image_size, patch = d->patch, dim = d->hidden;
    if (side % patch != 0)
        return mgt_error_set(MGT_ERR_INVALID,
                             "model %s: image size %d is not a multiple of its patch size %d "
                             "(torchvision: \"Input shape indivisible by patch size!\")",
                             m->arch, side, patch);
    int tokens = (side / patch) * (side / patch) + 1;
    int64_t ts[3] = {1, 1, dim}, ps[3] = {1, tokens, dim};
    int tok = nn_add_entry(m, "class_token", NULL, MGT_MODEL_PARAM, MGT_TENSOR_EMBEDDING, 3, ts,
                           (nn_entry_init){NN_INIT_CONST, 0.0});
    int x = nn_conv(m, "conv_proj", nn_input(m), dim, patch, patch, 0, 1, true);
    if (x >= 0) { /* trunc_normal_(std sqrt(1 / fan_in)) (at +-2: a plain normal), bias 0 */
        set_init(m, last_entry(m, 0), NN_INIT_NORMAL, sqrt(1.0 / (3.0 * patch * patch)));
        set_init(m, last_entry(m, 1), NN_INIT_CONST, 0.0);
    }
    x = nn_class_token(m, "class_token", x, tok);
    int pos = nn_add_entry(m, "encoder.pos_embedding", NULL, MGT_MODEL_PARAM, MGT_TENSOR_EMBEDDING,
                           3, ps, (nn_entry_init){NN_INIT_NORMAL, 0.02});
    x = nn_pos_add(m, "encoder.pos_embedding", x, pos);
    char p[NN_NAME];
    for (int i = 0; i < d->layers; i++) {
        nn_name(m, p, sizeof p, "encoder.layers.encoder_layer_%d", i);
        x = encoder_block(m, p, x, d);
    }
    x = nn_layernorm(m, "encoder.ln", x, 1e-6f);
    /* x[:, 0]: the class token's row */
    mgt_permute_shape row0 = {.ndim = 2,
                              .naxes = 2,
                              .size = {0, dim},
                              .walk_stride = {0, 1},
                              .axis = {0, 1},
                              .coef = {1, 1},
                              .limit = {0, dim},
                              .grid_stride = {0, 1}};
    x = nn_permute(m, "encoder.class_token_out", x, &row0, 1, 1, dim);
    x = nn_linear(m, "heads.head", x, m->cfg.classes);
    if (x >= 0) { /* zeros_ */
        set_init(m, last_entry(m, 0), NN_INIT_CONST, 0.0);
        set_init(m, last_entry(m, 1), NN_INIT_CONST, 0.0);
    }
    return MGT_OK;
}

static const vit_def b_16 = {16, 12, 12, 768, 3072}, b_32 = {32, 12, 12, 768, 3072},
                     l_16 = {16, 24, 16, 1024, 4096}, l_32 = {32, 24, 16, 1024, 4096},
                     h_14 = {14, 32, 16, 1280, 5120},
                     /* mgtrain's own, not torchvision's: DeiT-Tiny's width (192, 3 heads, MLP
                        768) at half its depth (6) on 4x4 patches, for 28 to 32 pixel images
                        (Fashion-MNIST, CIFAR); torchvision's VisionTransformer(image_size,
                        patch_size=4, num_layers=6, num_heads=3, hidden_dim=192, mlp_dim=768)
                        has its state_dict */
    tiny_4 = {4, 6, 3, 192, 768};

const nn_arch nn_vit_archs[] = {
    {"vit_b_16", "vit", build_vit, &b_16, "heads.head"},
    {"vit_b_32", "vit", build_vit, &b_32, "heads.head"},
    {"vit_l_16", "vit", build_vit, &l_16, "heads.head"},
    {"vit_l_32", "vit", build_vit, &l_32, "heads.head"},
    {"vit_h_14", "vit", build_vit, &h_14, "heads.head"},
    {"vit_tiny_4", "cifar_vit", build_vit, &tiny_4, "heads.head"},
    {NULL, NULL, NULL, NULL, NULL},
};
