/* Swin Transformers as layer graphs, as torchvision 0.14 defines them (swin_t, swin_s, swin_b;
   swin_v2_t, swin_v2_s, swin_v2_b with window 8, cosine attention with a learned logit scale per
   head, the continuous position bias MLP, post-norm blocks and PatchMergingV2):
   the 4x4 stride-4 patch embedding conv, a permute to [H, W, C] and LayerNorm; four stages of
   blocks (norm1, shifted window attention, stochastic depth, the residual; norm2, MLP with
   GELU, stochastic depth, the residual), patch merging between stages (the four 2x2 phases
   side by side, LayerNorm over 4C, a linear 4C -> 2C without bias); norm, a permute back to
   NCHW, the average pool and the head.

   Shifted window attention is, per block: a permute that pads the map to whole windows, rolls
   it by -shift and gathers the windows [windows, ws^2, C]; the qkv linear; attention with the
   relative position bias (the [(2 ws - 1)^2, heads] table gathered by relative_position_index)
   and, where shifted, the mask that keeps windows' regions apart; the proj linear; and the
   permute back (a scatter through the same description: the reverse partition, the roll back
   and the crop). As torchvision, a window as large as the padded map is not shifted. Values
   are token maps [H, W, C] and windows [windows, ws^2, C]. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/model_impl.h"

typedef struct swin_def {
    int embed, depths[4], heads[4], window;
    float sd_prob;
    bool v2; /* Swin V2: cosine attention, the continuous position bias, post-norm blocks */
} swin_def;

/* The hidden width of V2's continuous position bias MLP. */
#define CPB_HIDDEN 512

/* V2's relative_coords_table [1, 2 ws - 1, 2 ws - 1, 2]: each relative offset (dy, dx) over
   ws - 1, times 8, as sign(v) log2(|v| + 1) / 3 (float32, as torchvision computes it). */
static void relative_coords(int ws, float *table)
{
    int n = 2 * ws - 1;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            for (int k = 0; k < 2; k++) {
                float v = (float)((k == 0 ? i : j) - (ws - 1)) / (float)(ws - 1) * 8.0f;
                float a = log2f(fabsf(v) + 1.0f) / 3.0f;
                table[(i * n + j) * 2 + k] = v > 0.0f ? a : v < 0.0f ? -a : 0.0f;
            }
}

/* The permute description between a map [h, w, c] and its windows [windows, ws^2, c] after a
   pad to whole windows and a roll by -shift (sh, sw per side): the window partition's gather,
   or (scatter) the reverse's. Dim 0 and axis 0 are the batch's, filled per call. */
static mgt_permute_shape window_map(int h, int w, int c, int ws, int sh, int sw, bool scatter)
{
    int ph = (h + ws - 1) / ws * ws, pw = (w + ws - 1) / ws * ws;
    mgt_permute_shape p = {.ndim = 6,
                           .naxes = 4,
                           .size = {0, ph / ws, pw / ws, ws, ws, c},
                           .walk_stride = {0, (size_t)(pw / ws) * ws * ws * c, (size_t)ws * ws * c,
                                           (size_t)ws * c, (size_t)c, 1},
                           .axis = {0, 1, 2, 1, 2, 3},
                           .coef = {1, ws, ws, 1, 1, 1},
                           .extent = {0, ph, pw, 0},
                           .shift = {0, sh, sw, 0},
                           .limit = {0, h, w, c},
                           .grid_stride = {0, (size_t)w * c, (size_t)c, 1},
                           .scatter = scatter};
    return p;
}

/* Python's slice [a:b] of a side of n, a and b possibly negative, b "None" as INT32_MAX: the
   range [lo, hi) it covers. */
static void py_slice(int a, int b, int n, int *lo, int *hi)
{
    *lo = a < 0 ? (a + n < 0 ? 0 : a + n) : (a > n ? n : a);
    *hi = b == INT32_MAX ? n : b < 0 ? (b + n < 0 ? 0 : b + n) : (b > n ? n : b);
    if (*hi < *lo)
        *hi = *lo;
}

/* torchvision's attention mask of a shifted block: the padded map [ph, pw] labelled by the
   3 x 3 regions of its slices, windows' token pairs of different regions -100, others 0.
   mask [windows, ws^2, ws^2]. */
static void shift_mask(int ph, int pw, int ws, int sh, int sw, float *mask)
{
    int *label = calloc((size_t)ph * pw, sizeof *label);
    if (!label)
        return;
    int hs[3][2] = {{0, -ws}, {-ws, -sh}, {-sh, INT32_MAX}};
    int wsl[3][2] = {{0, -ws}, {-ws, -sw}, {-sw, INT32_MAX}};
    int count = 0;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++, count++) {
            int h0, h1, w0, w1;
            py_slice(hs[i][0], hs[i][1], ph, &h0, &h1);
            py_slice(wsl[j][0], wsl[j][1], pw, &w0, &w1);
            for (int y = h0; y < h1; y++)
                for (int x = w0; x < w1; x++)
                    label[y * pw + x] = count;
        }
    int nh = ph / ws, nw = pw / ws, t = ws * ws;
    for (int wy = 0; wy < nh; wy++)
        for (int wx = 0; wx < nw; wx++) {
            float *mk = mask + (size_t)(wy * nw + wx) * t * t;
            for (int a = 0; a < t; a++)
                for (int b = 0; b < t; b++) {
                    int la = label[(wy * ws + a / ws) * pw + wx * ws + a % ws];
                    int lb = label[(wy * ws + b / ws) * pw + wx * ws + b % ws];
                    mk[a * t + b] = la != lb ? -100.0f : 0.0f;
                }
        }
    free(label);
}

/* Shifted window attention of x [h, w, dim] (name p = "features.S.B.attn"); V2's with cosine
   attention and the continuous position bias. Its entries in torchvision's state_dict order:
   the table (V1) or logit_scale and relative_coords_table (V2), relative_position_index, qkv,
   proj, then V2's cpb_mlp. */
static int window_attention(mgt_model *m, const char *p, int x, int heads, int ws, int shift,
                            bool v2)
{
    char n[NN_NAME];
    const nn_value *v = &m->values[x];
    int h = v->c, w = v->h, dim = v->w;
    int ph = (h + ws - 1) / ws * ws, pw = (w + ws - 1) / ws * ws;
    int sh = ws >= ph ? 0 : shift, sw = ws >= pw ? 0 : shift;
    int windows = (ph / ws) * (pw / ws), t = ws * ws, rows = (2 * ws - 1) * (2 * ws - 1);
    int64_t is[1] = {(int64_t)t * t};
    int table = -1, logit_scale = -1, coords = -1;
    int64_t *index = malloc((size_t)t * t * sizeof *index);
    int32_t *index32 = malloc((size_t)t * t * sizeof *index32);
    float *mask = sh + sw > 0 ? malloc((size_t)windows * t * t * sizeof *mask) : NULL;
    float *table_v2 = v2 ? malloc((size_t)rows * 2 * sizeof *table_v2) : NULL;
    if (!index || !index32 || (sh + sw > 0 && !mask) || (v2 && !table_v2)) {
        free(index);
        free(index32);
        free(mask);
        free(table_v2);
        m->oom = true;
        return -1;
    }
    if (v2) {
        int64_t ls[3] = {heads, 1, 1}, cs[4] = {1, 2 * ws - 1, 2 * ws - 1, 2};
        logit_scale = nn_add_entry(m, p, "logit_scale", MGT_MODEL_PARAM, MGT_TENSOR_SCALE, 3, ls,
                                   (nn_entry_init){NN_INIT_CONST, log(10.0)});
        relative_coords(ws, table_v2);
        int k = nn_const(m, table_v2, (size_t)rows * 2 * sizeof *table_v2);
        coords = nn_add_entry(m, p, "relative_coords_table", MGT_MODEL_BUFFER, MGT_TENSOR_CONSTANT,
                              4, cs, (nn_entry_init){NN_INIT_VALUES, k});
    } else {
        int64_t ts[2] = {rows, heads};
        table = nn_add_entry(m, p, "relative_position_bias_table", MGT_MODEL_PARAM,
                             MGT_TENSOR_EMBEDDING, 2, ts, (nn_entry_init){NN_INIT_NORMAL, 0.02});
    }
    nn_relative_index(ws, index);
    for (int i = 0; i < t * t; i++)
        index32[i] = (int32_t)index[i];
    nn_add_index(m, p, "relative_position_index", 1, is, index);
    if (mask)
        shift_mask(ph, pw, ws, sh, sw, mask);
    mgt_permute_shape part = window_map(h, w, dim, ws, sh, sw, false);
    nn_name(m, n, sizeof n, "%s.partition", p);
    int y = nn_permute(m, n, x, &part, windows, t, dim);
    nn_name(m, n, sizeof n, "%s.qkv", p);
    y = nn_token_linear(m, n, y, 3 * dim, true, "weight", "bias");
    if (y >= 0)
        nn_last_node(m)->u.linear.functional = true;
    if (v2)
        nn_linear_zero_mid_bias(m, y);
    int a = v2 ? nn_attention_v2(m, p, y, heads, windows, logit_scale, rows, index32, mask)
               : nn_attention(m, p, y, heads, windows, table, rows, index32, mask);
    nn_name(m, n, sizeof n, "%s.proj", p);
    y = nn_token_linear(m, n, a, dim, true, "weight", "bias");
    if (y >= 0)
        nn_last_node(m)->u.linear.functional = true;
    if (v2) {
        int64_t w1s[2] = {CPB_HIDDEN, 2}, b1s[1] = {CPB_HIDDEN}, w2s[2] = {heads, CPB_HIDDEN};
        nn_entry_init none = {NN_INIT_NONE, 0};
        nn_name(m, n, sizeof n, "%s.cpb_mlp.0", p);
        int w1 =
            nn_add_entry(m, n, "weight", MGT_MODEL_PARAM, MGT_TENSOR_LINEAR_WEIGHT, 2, w1s, none);
        int b1 = nn_add_entry(m, n, "bias", MGT_MODEL_PARAM, MGT_TENSOR_BIAS, 1, b1s, none);
        nn_name(m, n, sizeof n, "%s.cpb_mlp.2", p);
        int w2 =
            nn_add_entry(m, n, "weight", MGT_MODEL_PARAM, MGT_TENSOR_LINEAR_WEIGHT, 2, w2s, none);
        nn_attention_cpb(m, a, w1, b1, w2, coords, CPB_HIDDEN);
    }
    mgt_permute_shape back = window_map(h, w, dim, ws, sh, sw, true);
    nn_name(m, n, sizeof n, "%s.reverse", p);
    y = nn_permute(m, n, y, &back, h, w, dim);
    free(index);
    free(index32);
    free(mask);
    free(table_v2);
    return y;
}

/* V1: x + sd(attn(norm1(x))), then x + sd(mlp(norm2(x))); V2 puts each norm after its branch
   (its entries still first in the state_dict: torchvision registers norm1 before attn). */
static int swin_block(mgt_model *m, const char *p, int x, int heads, int ws, int shift, float sd,
                      bool v2)
{
    char n[NN_NAME];
    int dim = m->values[x].w, norm1 = -1, norm2 = -1, y = x;
    nn_name(m, n, sizeof n, "%s.norm1", p);
    if (v2)
        norm1 = nn_layernorm_entries(m, n, dim);
    else
        y = nn_layernorm(m, n, x, 1e-5f);
    nn_name(m, n, sizeof n, "%s.attn", p);
    y = window_attention(m, n, y, heads, ws, shift, v2);
    if (v2) {
        nn_name(m, n, sizeof n, "%s.norm1", p);
        y = nn_layernorm_of(m, n, y, 1e-5f, norm1);
    }
    nn_name(m, n, sizeof n, "%s.stochastic_depth", p);
    y = nn_stochastic_depth(m, n, y, sd);
    nn_name(m, n, sizeof n, "%s.attention_residual", p);
    x = nn_add(m, n, x, y);
    nn_name(m, n, sizeof n, "%s.norm2", p);
    if (v2)
        norm2 = nn_layernorm_entries(m, n, dim);
    y = v2 ? x : nn_layernorm(m, n, x, 1e-5f);
    nn_name(m, n, sizeof n, "%s.mlp.0", p);
    y = nn_token_linear(m, n, y, 4 * dim, true, "weight", "bias");
    nn_name(m, n, sizeof n, "%s.mlp.1", p);
    y = nn_activation(m, n, y, MGT_ACT_GELU);
    nn_name(m, n, sizeof n, "%s.mlp.3", p);
    y = nn_token_linear(m, n, y, dim, true, "weight", "bias");
    if (v2) {
        nn_name(m, n, sizeof n, "%s.norm2", p);
        y = nn_layernorm_of(m, n, y, 1e-5f, norm2);
    }
    nn_name(m, n, sizeof n, "%s.stochastic_depth_mlp", p);
    y = nn_stochastic_depth(m, n, y, sd);
    return nn_add(m, p, x, y);
}

/* PatchMerging: [h, w, c] padded to even sides, the phases x0 (0, 0), x1 (1, 0), x2 (0, 1),
   x3 (1, 1) side by side [h / 2, w / 2, 4c], LayerNorm(4c), Linear(4c -> 2c, no bias);
   PatchMergingV2 the linear, then LayerNorm(2c). */
static int patch_merging(mgt_model *m, const char *p, int x, bool v2)
{
    char n[NN_NAME];
    const nn_value *v = &m->values[x];
    int h = v->c, w = v->h, c = v->w, h2 = (h + 1) / 2, w2 = (w + 1) / 2;
    mgt_permute_shape sh = {
        .ndim = 6,
        .naxes = 4,
        .size = {0, h2, w2, 2, 2, c},
        .walk_stride = {0, (size_t)w2 * 4 * c, (size_t)4 * c, (size_t)2 * c, (size_t)c, 1},
        .axis = {0, 1, 2, 2, 1, 3},
        .coef = {1, 2, 2, 1, 1, 1},
        .limit = {0, h, w, c},
        .grid_stride = {0, (size_t)w * c, (size_t)c, 1}};
    if (v2) {
        nn_name(m, n, sizeof n, "%s.merge", p);
        int y = nn_permute(m, n, x, &sh, h2, w2, 4 * c);
        nn_name(m, n, sizeof n, "%s.reduction", p);
        y = nn_token_linear(m, n, y, 2 * c, false, "weight", NULL);
        nn_name(m, n, sizeof n, "%s.norm", p);
        return nn_layernorm(m, n, y, 1e-5f);
    }
    /* torchvision registers reduction before norm: its weight comes first in the state_dict */
    nn_name(m, n, sizeof n, "%s.reduction", p);
    int64_t ws[2] = {2 * c, 4 * c};
    int weight = nn_add_entry(m, n, "weight", MGT_MODEL_PARAM, MGT_TENSOR_LINEAR_WEIGHT, 2, ws,
                              (nn_entry_init){NN_INIT_NORMAL, 0.02});
    nn_name(m, n, sizeof n, "%s.merge", p);
    int y = nn_permute(m, n, x, &sh, h2, w2, 4 * c);
    nn_name(m, n, sizeof n, "%s.norm", p);
    y = nn_layernorm(m, n, y, 1e-5f);
    nn_name(m, n, sizeof n, "%s.reduction", p);
    return nn_token_linear_entry(m, n, y, weight);
}

/* [c, h, w] <-> [h, w, c] (torchvision's Permute([0, 2, 3, 1]) and back): to_maps true makes
   the token map of an NCHW value. */
static int permute_nhwc(mgt_model *m, const char *name, int x, bool to_maps)
{
    const nn_value *v = &m->values[x];
    int c = to_maps ? v->c : v->w, h = to_maps ? v->h : v->c, w = to_maps ? v->w : v->h;
    mgt_permute_shape sh = {.ndim = 4, .naxes = 4, .coef = {1, 1, 1, 1}};
    if (to_maps) { /* walk [h, w, c] of grid [c, h, w] */
        int size[3] = {h, w, c}, axis[3] = {2, 3, 1};
        for (int d = 0; d < 3; d++) {
            sh.size[d + 1] = size[d];
            sh.axis[d + 1] = axis[d];
        }
        sh.walk_stride[1] = (size_t)w * c, sh.walk_stride[2] = (size_t)c, sh.walk_stride[3] = 1;
    } else { /* walk [c, h, w] of grid [h, w, c] */
        int size[3] = {c, h, w}, axis[3] = {3, 1, 2};
        for (int d = 0; d < 3; d++) {
            sh.size[d + 1] = size[d];
            sh.axis[d + 1] = axis[d];
        }
        sh.walk_stride[1] = (size_t)h * w, sh.walk_stride[2] = (size_t)w, sh.walk_stride[3] = 1;
    }
    /* grid axes 1, 2, 3: [c, h, w] as the NCHW side lies, or [h, w, c] */
    if (to_maps) {
        sh.limit[1] = c, sh.limit[2] = h, sh.limit[3] = w;
        sh.grid_stride[1] = (size_t)h * w, sh.grid_stride[2] = (size_t)w, sh.grid_stride[3] = 1;
        return nn_permute(m, name, x, &sh, h, w, c);
    }
    sh.limit[1] = h, sh.limit[2] = w, sh.limit[3] = c;
    sh.grid_stride[1] = (size_t)w * c, sh.grid_stride[2] = (size_t)c, sh.grid_stride[3] = 1;
    return nn_permute(m, name, x, &sh, c, h, w);
}

static mgt_status build_swin(mgt_model *m, const void *arg)
{
    const swin_def *d = arg;
    char p[NN_NAME];
    int x = nn_conv(m, "features.0.0", nn_input(m), d->embed, 4, 4, 0, 1, true);
    x = permute_nhwc(m, "features.0.1", x, true);
    x = nn_layernorm(m, "features.0.2", x, 1e-5f);
    int total = 0, id = 0, f = 1;
    for (int s = 0; s < 4; s++)
        total += d->depths[s];
    for (int s = 0; s < 4; s++, f++) {
        for (int i = 0; i < d->depths[s] && x >= 0; i++, id++) {
            nn_name(m, p, sizeof p, "features.%d.%d", f, i);
            x = swin_block(m, p, x, d->heads[s], d->window, i % 2 ? d->window / 2 : 0,
                           d->sd_prob * (float)id / (float)(total - 1), d->v2);
        }
        if (s < 3 && x >= 0) {
            nn_name(m, p, sizeof p, "features.%d", ++f);
            x = patch_merging(m, p, x, d->v2);
        }
    }
    x = nn_layernorm(m, "norm", x, 1e-5f);
    x = permute_nhwc(m, "permute", x, false);
    x = nn_gap(m, "avgpool", x);
    nn_linear(m, "head", x, m->cfg.classes);
    /* every Linear: trunc_normal_(std 0.02) (at +-2: 100 std, a plain normal), bias 0; the
       tables trunc_normal_(std 0.02) as built; the patch conv and LayerNorms their defaults */
    for (int e = 0; e < m->n_table; e++) {
        const mgt_model_entry *t = &m->table[e];
        if (t->what == MGT_TENSOR_LINEAR_WEIGHT)
            m->init[e] = (nn_entry_init){NN_INIT_NORMAL, 0.02};
        else if (t->what == MGT_TENSOR_BIAS && strncmp(t->name, "features.0.0.", 13) != 0)
            m->init[e] = (nn_entry_init){NN_INIT_CONST, 0.0};
    }
    return MGT_OK;
}

static const swin_def t = {96, {2, 2, 6, 2}, {3, 6, 12, 24}, 7, 0.2f, false},
                      s = {96, {2, 2, 18, 2}, {3, 6, 12, 24}, 7, 0.3f, false},
                      b = {128, {2, 2, 18, 2}, {4, 8, 16, 32}, 7, 0.5f, false},
                      v2_t = {96, {2, 2, 6, 2}, {3, 6, 12, 24}, 8, 0.2f, true},
                      v2_s = {96, {2, 2, 18, 2}, {3, 6, 12, 24}, 8, 0.3f, true},
                      v2_b = {128, {2, 2, 18, 2}, {4, 8, 16, 32}, 8, 0.5f, true};

const nn_arch nn_swin_archs[] = {
    {"swin_t", "swin", build_swin, &t, "head"},
    {"swin_s", "swin", build_swin, &s, "head"},
    {"swin_b", "swin", build_swin, &b, "head"},
    {"swin_v2_t", "swin", build_swin, &v2_t, "head"},
    {"swin_v2_s", "swin", build_swin, &v2_s, "head"},
    {"swin_v2_b", "swin", build_swin, &v2_b, "head"},
    {NULL, NULL, NULL, NULL, NULL},
};
