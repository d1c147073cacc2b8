/* The transformers' layer kinds as forward/backward pairs over flat device arrays: LayerNorm
   over the last dimension, the permutations (one mgt_permute each), multi-head attention with
   its relative position bias, ViT's class token and position embedding; and the graph's
   constants (index arrays, masks), uploaded once at creation. Token linears are NN_LINEAR
   with rows (layers.c). */
#include <assert.h>
#include <string.h>

#include "nn/model_impl.h"

mgt_status nn_consts_upload(mgt_model *m, mgt_stream *s)
{
    mgt_status st = MGT_OK;
    for (int i = 0; i < m->n_consts && st == MGT_OK; i++)
        st = mgt_copy_h2d(s, nn_const_ptr(m, i), m->consts[i].data, m->consts[i].bytes);
    return st;
}

static const nn_value *out_value(const nn_call *c) { return &c->m->values[c->node->out]; }
static const nn_value *in_value(const nn_call *c) { return &c->m->values[c->node->in[0]]; }

/* ---- layer norm over the last dimension: layernorm_channels with hw 1 over every row ---- */

static int ln_rows(const nn_call *c) { return c->n * out_value(c)->c * out_value(c)->h; }

mgt_status nn_ln_forward(nn_call *c)
{
    return mgt_layernorm_channels_forward_st(c->s, nn_store_of(c), c->y, c->x[0], c->p[0], c->p[1],
                                             ln_rows(c), out_value(c)->w, 1, c->node->u.ln_eps,
                                             MGT_LAYOUT_NCHW);
}

mgt_status nn_ln_backward(nn_call *c)
{
    if (!c->dx[0])
        return mgt_error_set(MGT_ERR_UNSUPPORTED,
                             "layer %s: a layer norm needs its input's gradient", c->node->name);
    assert(c->dx_beta[0] == 0.0f);
    mgt_status st = mgt_layernorm_channels_backward_st(
        c->s, nn_store_of(c), c->dx[0], c->g[0], c->g[1], c->dy, c->x[0], c->p[0], ln_rows(c),
        out_value(c)->w, 1, c->node->u.ln_eps, MGT_LAYOUT_NCHW);
    if (st == MGT_OK)
        st = nn_params_ready(c);
    return st;
}

/* ---- permutations ----
   The node's description is per image; its dim 0 and axis 0 walk the batch. A gather reads the
   input (grid) into the output (walk); a scatter the other way. Backward is the other
   direction with the same description, after zeroing where the map does not cover. */

mgt_permute_shape nn_permute_shape(const mgt_model *m, const nn_node *nd, int n, bool scatter)
{
    mgt_permute_shape sh = nd->u.permute.sh;
    const nn_value *in = &m->values[nd->in[0]], *out = &m->values[nd->out];
    const nn_value *walk = scatter ? in : out, *grid = scatter ? out : in;
    sh.size[0] = n;
    sh.axis[0] = 0;
    sh.coef[0] = 1;
    sh.walk_stride[0] = nn_value_floats(walk);
    sh.extent[0] = 0;
    sh.shift[0] = 0;
    sh.limit[0] = n;
    sh.grid_stride[0] = nn_value_floats(grid);
    return sh;
}

static mgt_permute_shape permute_shape(const nn_call *c, bool scatter)
{
    return nn_permute_shape(c->m, c->node, c->n, scatter);
}

mgt_status nn_permute_forward(nn_call *c)
{
    bool scatter = c->node->u.permute.sh.scatter;
    mgt_permute_shape sh = permute_shape(c, scatter);
    mgt_status st = MGT_OK;
    if (scatter && !c->node->u.permute.covers)
        st = mgt_memset(c->s, c->y, 0, (size_t)c->n * nn_value_bytes(out_value(c)));
    if (st != MGT_OK)
        return st;
    return scatter ? mgt_permute_st(c->s, nn_store_of(c), (float *)c->x[0], c->y, &sh)
                   : mgt_permute_st(c->s, nn_store_of(c), c->y, (float *)c->x[0], &sh);
}

mgt_status nn_permute_backward(nn_call *c)
{
    if (!c->dx[0])
        return MGT_OK;
    assert(c->dx_beta[0] == 0.0f);
    bool scatter = c->node->u.permute.sh.scatter;
    mgt_permute_shape sh = permute_shape(c, scatter);
    sh.scatter = !scatter;
    mgt_store gs = {nn_store_of(c).out, nn_store_of(c).in}; /* reads dy, writes dx */
    if (scatter) /* the gather of dy: every dx element written (0 where nothing was read) */
        return mgt_permute_st(c->s, gs, c->dx[0], (float *)c->dy, &sh);
    mgt_status st = MGT_OK;
    if (!c->node->u.permute.covers)
        st = mgt_memset(c->s, c->dx[0], 0, (size_t)c->n * nn_value_bytes(in_value(c)));
    return st != MGT_OK ? st : mgt_permute_st(c->s, gs, (float *)c->dy, c->dx[0], &sh);
}

/* ---- attention ---- */

static mgt_attn_shape attn_shape(const nn_call *c)
{
    const nn_node *nd = c->node;
    int dim = out_value(c)->w, t = nd->u.attn.tokens;
    mgt_attn_shape sh = {
        .batch = c->n * nd->u.attn.windows,
        .heads = nd->u.attn.heads,
        .tq = t,
        .tk = t,
        .dh = nd->u.attn.dh,
        .q_batch = (size_t)t * 3 * dim,
        .q_row = (size_t)3 * dim,
        .kv_batch = (size_t)t * 3 * dim,
        .kv_row = (size_t)3 * dim,
        .y_batch = (size_t)t * dim,
        .y_row = (size_t)dim,
        .scale = nd->u.attn.scale,
        .masks = nd->u.attn.mask >= 0 ? nd->u.attn.windows : 0,
        .cosine = nd->u.attn.cosine,
        .p = c->train ? nd->u.attn.p : 0.0f,
        .groups_per_sample = nd->u.attn.windows,
        .key = c->m->drop_key,
    };
    sh.key.stream = nd->u.attn.stream;
    return sh;
}

static int attn_bias_n(const nn_node *nd) { return nd->u.attn.tokens * nd->u.attn.tokens; }

static float *attn_bias(const nn_call *c)
{
    const nn_node *nd = c->node;
    return nd->u.attn.table >= 0 || nd->u.attn.cpb ? nn_act(c->m, nd->u.attn.bias_off) : NULL;
}

/* ---- Swin V2's continuous position bias: 16 sigmoid(cpb_mlp(coords)) gathered ----
   cpb_mlp is Linear(2, hidden) + ReLU + Linear(hidden, heads, no bias) over the R rows of the
   coordinates buffer, batch-independent, in fp32 (autocast would round its linears: the bias
   it makes is tiny work). Its activations live in cpb_off: h1 and dh1 [R, hidden], then t
   (pre-sigmoid), s = sigmoid(t) and their gradient [R, heads]. */

typedef struct cpb_bufs {
    float *h1, *dh1, *t, *s, *dt;
} cpb_bufs;

static cpb_bufs cpb_of(const nn_call *c)
{
    const nn_node *nd = c->node;
    size_t r = (size_t)nd->u.attn.table_rows, hid = (size_t)nd->u.attn.cpb;
    size_t h = (size_t)nd->u.attn.heads;
    float *b = nn_act(c->m, nd->u.attn.cpb_off);
    return (cpb_bufs){b, b + r * hid, b + 2 * r * hid, b + 2 * r * hid + r * h,
                      b + 2 * r * hid + 2 * r * h};
}

static mgt_status cpb_forward(nn_call *c, float *bias)
{
    const nn_node *nd = c->node;
    int r = nd->u.attn.table_rows, hid = nd->u.attn.cpb, h = nd->u.attn.heads;
    cpb_bufs b = cpb_of(c);
    const float *w1 = c->p[1], *b1 = c->p[2], *w2 = c->p[3], *coords = c->p[4];
    mgt_status st = mgt_gemm(c->s, false, true, r, hid, 2, 1.0f, coords, 2, w1, 2, 0.0f, b.h1, hid);
    if (st == MGT_OK)
        st = mgt_bias_forward(c->s, b.h1, b1, r, hid);
    if (st == MGT_OK)
        st = mgt_relu_forward(c->s, b.h1, b.h1, (size_t)r * hid);
    if (st == MGT_OK)
        st = mgt_gemm(c->s, false, true, r, h, hid, 1.0f, b.h1, hid, w2, hid, 0.0f, b.t, h);
    if (st == MGT_OK)
        st = mgt_activation_forward(c->s, b.s, b.t, (size_t)r * h, MGT_ACT_SIGMOID);
    if (st == MGT_OK)
        st = mgt_relpos_bias_forward(c->s, bias, b.s, nn_const_ptr(c->m, nd->u.attn.index), r, h,
                                     attn_bias_n(nd), 16.0f);
    return st;
}

/* From dbias: the MLP's parameter gradients (added on). */
static mgt_status cpb_backward(nn_call *c, const float *dbias)
{
    const nn_node *nd = c->node;
    int r = nd->u.attn.table_rows, hid = nd->u.attn.cpb, h = nd->u.attn.heads;
    cpb_bufs b = cpb_of(c);
    const float *w2 = c->p[3], *coords = c->p[4];
    mgt_status st = mgt_memset(c->s, b.dt, 0, (size_t)r * h * sizeof(float));
    if (st == MGT_OK) /* ds = 16 x the segment sums of dbias */
        st = mgt_relpos_bias_backward(c->s, b.dt, dbias, nn_const_ptr(c->m, nd->u.attn.offsets),
                                      nn_const_ptr(c->m, nd->u.attn.order), r, h, attn_bias_n(nd),
                                      16.0f);
    if (st == MGT_OK)
        st = mgt_activation_backward(c->s, b.dt, b.dt, b.t, (size_t)r * h, MGT_ACT_SIGMOID);
    if (st == MGT_OK) /* dW2 += dt^T h1 */
        st = mgt_gemm(c->s, true, false, h, hid, r, 1.0f, b.dt, h, b.h1, hid, 1.0f, c->g[3], hid);
    if (st == MGT_OK) /* dh1 = dt W2, through the ReLU */
        st = mgt_gemm(c->s, false, false, r, hid, h, 1.0f, b.dt, h, w2, hid, 0.0f, b.dh1, hid);
    if (st == MGT_OK)
        st = mgt_relu_backward(c->s, b.dh1, b.dh1, b.h1, (size_t)r * hid);
    if (st == MGT_OK) /* dW1 += dh1^T coords, db1 += its column sums */
        st = mgt_gemm(c->s, true, false, hid, 2, r, 1.0f, b.dh1, hid, coords, 2, 1.0f, c->g[1], 2);
    if (st == MGT_OK)
        st = mgt_bias_backward(c->s, c->g[2], b.dh1, r, hid);
    return st;
}

static const float *attn_mask(const nn_call *c)
{
    return c->node->u.attn.mask >= 0 ? nn_const_ptr(c->m, c->node->u.attn.mask) : NULL;
}

mgt_status nn_attn_forward(nn_call *c)
{
    const nn_node *nd = c->node;
    mgt_attn_shape sh = attn_shape(c);
    int dim = out_value(c)->w;
    float *bias = attn_bias(c);
    mgt_status st = MGT_OK;
    if (nd->u.attn.cpb)
        st = cpb_forward(c, bias);
    else if (bias)
        st = mgt_relpos_bias_forward(c->s, bias, c->p[0], nn_const_ptr(c->m, nd->u.attn.index),
                                     nd->u.attn.table_rows, sh.heads, attn_bias_n(nd), 1.0f);
    if (st != MGT_OK)
        return st;
    const float *x = c->x[0];
    mgt_precision xt = nn_store_of(c).in;
    return mgt_attention_forward_st(c->s, nn_store_of(c), c->y, nn_act(c->m, nd->u.attn.lse_off), x,
                                    nn_act_at(x, xt, dim), nn_act_at(x, xt, 2 * (size_t)dim), bias,
                                    attn_mask(c), sh.cosine ? c->p[0] : NULL, &sh);
}

/* dq, dk and dv fill the qkv value's gradient column by column; then the bias table's. */
mgt_status nn_attn_backward(nn_call *c)
{
    const nn_node *nd = c->node;
    if (!c->dx[0])
        return mgt_error_set(MGT_ERR_UNSUPPORTED, "layer %s: attention needs its input's gradient",
                             nd->name);
    assert(c->dx_beta[0] == 0.0f);
    mgt_attn_shape sh = attn_shape(c);
    int dim = out_value(c)->w;
    float *bias = attn_bias(c);
    float *dbias = bias ? nn_act(c->m, nd->u.attn.dbias_off) : NULL;
    mgt_precision xt = nn_store_of(c).in;
    mgt_attn_grads g = {c->dx[0], nn_act_at(c->dx[0], xt, dim),
                        nn_act_at(c->dx[0], xt, 2 * (size_t)dim), dbias,
                        sh.cosine ? c->g[0] : NULL};
    const float *x = c->x[0];
    mgt_status st = mgt_attention_backward_st(
        c->s, nn_store_of(c), &g, c->dy, c->y, nn_act(c->m, nd->u.attn.lse_off), x,
        nn_act_at(x, xt, dim), nn_act_at(x, xt, 2 * (size_t)dim), bias, attn_mask(c),
        sh.cosine ? c->p[0] : NULL, &sh);
    if (st == MGT_OK && nd->u.attn.cpb)
        st = cpb_backward(c, dbias);
    else if (st == MGT_OK && bias)
        st = mgt_relpos_bias_backward(c->s, c->g[0], dbias, nn_const_ptr(c->m, nd->u.attn.offsets),
                                      nn_const_ptr(c->m, nd->u.attn.order), nd->u.attn.table_rows,
                                      sh.heads, attn_bias_n(nd), 1.0f);
    if (st == MGT_OK)
        st = nn_params_ready(c);
    return st;
}

/* The cpb MLP's two Linear modules (torch's hooks count them: out * in each). */
uint64_t nn_attn_linear_macs(const mgt_model *m, const nn_node *nd)
{
    (void)m;
    uint64_t r = (uint64_t)nd->u.attn.table_rows, hid = (uint64_t)nd->u.attn.cpb;
    return nd->u.attn.cpb ? r * hid * 2 + r * (uint64_t)nd->u.attn.heads * hid : 0;
}

/* q k^T and p v: 2 tokens^2 dim per window (the softmax and the bias are not counted), and the
   cpb MLP's */
uint64_t nn_attn_macs(const mgt_model *m, const nn_node *nd)
{
    uint64_t t = (uint64_t)nd->u.attn.tokens;
    return 2 * (uint64_t)nd->u.attn.windows * t * t * (uint64_t)nd->u.attn.heads *
               (uint64_t)nd->u.attn.dh +
           nn_attn_linear_macs(m, nd);
}

/* ---- ViT's class token and position embedding ----
   The patches [dim, P] of each image become rows 1..P of [1, P + 1, dim] (one transposing
   gather) and the class token row 0 (a gather that broadcasts: its batch step is 0). The
   token's gradient is the sum over images of row 0 of dy: a gemm of a ones vector (a const)
   with those rows, strided as they lie. */

static mgt_permute_shape cls_patches(const nn_call *c)
{
    int d = out_value(c)->w, p = out_value(c)->h - 1;
    return (mgt_permute_shape){
        .ndim = 3,
        .naxes = 3,
        .size = {c->n, p, d},
        .walk_stride = {(size_t)(p + 1) * d, (size_t)d, 1},
        .axis = {0, 2, 1},
        .coef = {1, 1, 1},
        .limit = {c->n, d, p},
        .grid_stride = {(size_t)d * p, (size_t)p, 1},
    };
}

mgt_status nn_cls_forward(nn_call *c)
{
    int d = out_value(c)->w, p = out_value(c)->h - 1;
    mgt_permute_shape sh = cls_patches(c);
    mgt_store st16 = nn_store_of(c);
    mgt_status st =
        mgt_permute_st(c->s, st16, nn_act_at(c->y, st16.out, (size_t)d), (float *)c->x[0], &sh);
    mgt_permute_shape tok = {.ndim = 2,
                             .naxes = 1,
                             .size = {c->n, d},
                             .walk_stride = {(size_t)(p + 1) * d, 1},
                             .axis = {0, 0},
                             .coef = {0, 1},
                             .limit = {d},
                             .grid_stride = {1}};
    /* the token (a parameter) rounded into 16-bit rows where the output is so stored */
    mgt_store ts = {MGT_PREC_F32, st16.out};
    return st != MGT_OK ? st : mgt_permute_st(c->s, ts, c->y, c->p[0], &tok);
}

mgt_status nn_cls_backward(nn_call *c)
{
    int d = out_value(c)->w, p = out_value(c)->h - 1;
    mgt_precision yt = nn_store_of(c).out;
    mgt_status st = mgt_gemm_st(c->s, MGT_PREC_F32, (mgt_gemm_store){yt, false, true, false}, false,
                                false, 1, d, c->n, 1.0f, nn_const_ptr(c->m, c->node->u.cls_ones),
                                c->n, c->dy, (p + 1) * d, 1.0f, c->g[0], d);
    if (st == MGT_OK)
        st = nn_params_ready(c);
    if (st != MGT_OK || !c->dx[0])
        return st;
    assert(c->dx_beta[0] == 0.0f);
    mgt_permute_shape sh = cls_patches(c);
    sh.scatter = true;
    mgt_store gs = {nn_store_of(c).out, nn_store_of(c).in}; /* reads dy, writes dx */
    return mgt_permute_st(c->s, gs, nn_act_at(c->dy, gs.out, (size_t)d), c->dx[0], &sh);
}

mgt_status nn_posadd_forward(nn_call *c)
{
    size_t per = nn_value_floats(out_value(c));
    mgt_status st = MGT_OK;
    mgt_store ys = {nn_store_of(c).out, nn_store_of(c).out};
    if (c->y != c->x[0])
        st = mgt_copy_d2d(c->s, c->y, c->x[0], (size_t)c->n * nn_value_bytes(out_value(c)));
    return st != MGT_OK ? st : mgt_bias_forward_st(c->s, ys, c->y, c->p[0], c->n, (int)per);
}

/* The input's gradient is dy itself (NN_F_PASSTHROUGH); the embedding's the sum over images. */
mgt_status nn_posadd_backward(nn_call *c)
{
    size_t per = nn_value_floats(out_value(c));
    mgt_store ys = {nn_store_of(c).out, nn_store_of(c).out};
    mgt_status st = mgt_bias_backward_st(c->s, ys, c->g[0], c->dy, c->n, (int)per);
    return st != MGT_OK ? st : nn_params_ready(c);
}
