/* The layer graph: the calls families build it with, the plan made from it once (in-place
   outputs, activation regions, gradient slots, the parameter arena in backward's completion
   order), and the forward and backward walks that hand each node its flat device arrays. */
#include <assert.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/model_impl.h"

/* ---- building ---- */

static bool grow(mgt_model *m, void **p, int *cap, int need, size_t elem)
{
    if (need <= *cap)
        return true;
    int c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) {
        m->oom = true;
        return false;
    }
    *p = q;
    *cap = c;
    return true;
}

static int new_value(mgt_model *m, int c, int h, int w, int producer)
{
    if (!grow(m, (void **)&m->values, &m->cap_values, m->n_values + 1, sizeof *m->values))
        return -1;
    nn_value *v = &m->values[m->n_values];
    memset(v, 0, sizeof *v);
    v->c = c;
    v->h = h;
    v->w = w;
    v->producer = producer;
    v->storage = m->n_values;
    v->gslot = -1;
    return m->n_values++;
}

_Static_assert(sizeof(((nn_node *)0)->name) == NN_NAME &&
                   sizeof(((mgt_model_entry *)0)->name) == NN_NAME &&
                   sizeof(((mgt_model_layer *)0)->name) == NN_NAME,
               "layer, parameter and public layer names share NN_NAME");

/* Keeps the first name that did not fit (cut to NN_NAME - 1 characters). */
static void name_too_long(mgt_model *m, const char *name)
{
    if (m->long_name[0] == '\0')
        snprintf(m->long_name, sizeof m->long_name, "%.*s", (int)sizeof m->long_name - 1, name);
}

void nn_name(mgt_model *m, char *buf, size_t size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, size, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= size)
        name_too_long(m, buf);
}

int nn_input(mgt_model *m)
{
    assert(m->n_values == 0);
    return new_value(m, m->cfg.in_channels, m->cfg.image_size, m->cfg.image_size, -1);
}

int nn_add_entry(mgt_model *m, const char *prefix, const char *suffix, mgt_model_role role,
                 mgt_model_what what, int ndim, const int64_t *shape, nn_entry_init init)
{
    int cap = m->cap_table;
    if (!grow(m, (void **)&m->table, &cap, m->n_table + 1, sizeof *m->table))
        return -1;
    if (cap != m->cap_table) {
        int icap = m->cap_table;
        if (!grow(m, (void **)&m->init, &icap, cap, sizeof *m->init))
            return -1;
        m->cap_table = cap;
    }
    mgt_model_entry *e = &m->table[m->n_table];
    memset(e, 0, sizeof *e);
    /* no suffix: the prefix is the whole name (ViT's class_token) */
    size_t lp = strlen(prefix), ls = suffix ? strlen(suffix) : 0;
    if (lp + 1 + ls >= sizeof e->name) {
        name_too_long(m, prefix);
        return -1;
    }
    memcpy(e->name, prefix, lp + 1);
    if (suffix) {
        e->name[lp] = '.';
        memcpy(e->name + lp + 1, suffix, ls + 1);
    }
    e->role = role;
    e->what = what;
    e->layer = m->n_nodes;
    e->ndim = ndim;
    e->numel = 1;
    for (int i = 0; i < ndim; i++) {
        e->shape[i] = shape[i];
        e->numel *= (size_t)shape[i];
    }
    if (role == MGT_MODEL_BUFFER) {
        e->offset = m->bufs_bytes;
        m->bufs_bytes += nn_align(e->numel * sizeof(float));
        m->counts.buffer_floats += e->numel;
    } else if (role == MGT_MODEL_COUNTER) {
        e->offset = (size_t)m->n_bn++;
    } else if (role == MGT_MODEL_PARAM) {
        m->counts.params += e->numel;
    }
    m->init[m->n_table] = init;
    return m->n_table++;
}

/* A node of `kind` reading in[0..n_in) and producing a c x h x w value; NULL after a failed
   allocation (the caller returns -1 then). */
static nn_node *new_node(mgt_model *m, nn_kind kind, const char *name, const int *in, int n_in,
                         int c, int h, int w)
{
    for (int i = 0; i < n_in; i++)
        if (in[i] < 0)
            return NULL; /* an earlier call failed */
    if (!grow(m, (void **)&m->nodes, &m->cap_nodes, m->n_nodes + 1, sizeof *m->nodes))
        return NULL;
    int out = new_value(m, c, h, w, m->n_nodes);
    if (out < 0)
        return NULL;
    size_t len = strlen(name);
    if (len >= sizeof m->nodes[0].name) {
        name_too_long(m, name);
        return NULL;
    }
    if ((h < 1 || w < 1) && !m->small_layer[0]) {
        snprintf(m->small_layer, sizeof m->small_layer, "%s", name);
        m->small_h = h;
        m->small_w = w;
    }
    nn_node *nd = &m->nodes[m->n_nodes++];
    memset(nd, 0, sizeof *nd);
    nd->kind = kind;
    memcpy(nd->name, name, len + 1);
    MGT_ASSERT(n_in <= NN_MAX_IN);
    for (int i = 0; i < n_in; i++)
        nd->in[i] = in[i];
    nd->n_in = n_in;
    nd->out = out;
    nd->gtmp = -1;
    for (int i = 0; i < NN_MAX_IN; i++)
        nd->unshare[i] = -1;
    return nd;
}

/* Adds an entry to the node being built (the last one). */
static void node_entry(mgt_model *m, nn_node *nd, const char *suffix, mgt_model_role role,
                       mgt_model_what what, int ndim, const int64_t *shape, nn_entry_init init)
{
    int e = nn_add_entry(m, nd->name, suffix, role, what, ndim, shape, init);
    if (e < 0)
        return;
    m->table[e].layer = (int)(nd - m->nodes);
    MGT_ASSERT(nd->n_entries < NN_MAX_ENTRIES);
    nd->entry[nd->n_entries++] = e;
    if (role == MGT_MODEL_PARAM) {
        assert(nd->n_params == nd->n_entries - 1); /* parameters come first */
        nd->n_params++;
    }
}

static nn_entry_init init_const(double v) { return (nn_entry_init){NN_INIT_CONST, v}; }

int nn_conv(mgt_model *m, const char *name, int x, int k, int r, int stride, int pad, int groups,
            bool bias)
{
    return nn_conv_rect(m, name, x, k, r, r, stride, pad, pad, groups, bias);
}

static mgt_conv2d_shape conv_geometry(const mgt_model *m, int x, int k, int rh, int rw, int stride,
                                      int ph, int pw, int groups)
{
    const nn_value *v = &m->values[x];
    return (mgt_conv2d_shape){.n = m->cfg.batch,
                              .c = v->c,
                              .h = v->h,
                              .w = v->w,
                              .k = k,
                              .r = rh,
                              .s = rw,
                              .stride_h = stride,
                              .stride_w = stride,
                              .pad_h = ph,
                              .pad_w = pw,
                              .groups = groups};
}

int nn_conv_rect(mgt_model *m, const char *name, int x, int k, int rh, int rw, int stride, int ph,
                 int pw, int groups, bool bias)
{
    if (x < 0)
        return -1;
    mgt_conv2d_shape sh = conv_geometry(m, x, k, rh, rw, stride, ph, pw, groups);
    nn_node *nd =
        new_node(m, NN_CONV, name, &x, 1, k, mgt_conv2d_out_h(&sh), mgt_conv2d_out_w(&sh));
    if (!nd)
        return -1;
    nd->u.conv.sh = sh;
    nd->u.conv.bias = bias;
    /* PyTorch's default for Conv2d (kaiming_uniform_ with a = sqrt(5)): U(+-1/sqrt(fan_in));
       families that initialise otherwise say so */
    double fan_in = (double)(sh.c / groups) * rh * rw;
    nn_entry_init u = {NN_INIT_UNIFORM, 1.0 / sqrt(fan_in)};
    int64_t ws[4] = {k, sh.c / groups, rh, rw}, bs[1] = {k};
    node_entry(m, nd, "weight", MGT_MODEL_PARAM, MGT_TENSOR_CONV_WEIGHT, 4, ws, u);
    if (bias)
        node_entry(m, nd, "bias", MGT_MODEL_PARAM, MGT_TENSOR_BIAS, 1, bs, u);
    return nd->out;
}

/* A depthwise convolution with constant weights: NN_AVGPOOL2D or NN_AFFINE. */
static nn_node *fixed_node(mgt_model *m, nn_kind kind, const char *name, int x, int k, int stride,
                           int pad)
{
    if (x < 0)
        return NULL;
    int c = m->values[x].c;
    mgt_conv2d_shape sh = conv_geometry(m, x, c, k, k, stride, pad, pad, c);
    nn_node *nd = new_node(m, kind, name, &x, 1, c, mgt_conv2d_out_h(&sh), mgt_conv2d_out_w(&sh));
    if (nd)
        nd->u.fixed.sh = sh;
    return nd;
}

int nn_avgpool2d(mgt_model *m, const char *name, int x, int k, int stride, int pad)
{
    nn_node *nd = fixed_node(m, NN_AVGPOOL2D, name, x, k, stride, pad);
    if (!nd)
        return -1;
    nd->u.fixed.tap = (float)(1.0 / (k * k));
    return nd->out;
}

int nn_affine(mgt_model *m, const char *name, int x, const float *scale, const float *shift)
{
    nn_node *nd = fixed_node(m, NN_AFFINE, name, x, 1, 1, 0);
    if (!nd)
        return -1;
    int c = m->values[nd->out].c;
    MGT_ASSERT(c <= 4);
    for (int i = 0; i < c; i++) {
        nd->u.fixed.scale[i] = scale[i];
        nd->u.fixed.shift[i] = shift[i];
    }
    return nd->out;
}

void nn_aux_logits(mgt_model *m, int v)
{
    if (v < 0)
        return;
    MGT_ASSERT(m->n_aux < NN_MAX_AUX);
    m->aux_value[m->n_aux++] = v;
    nn_node_of(m, v)->aux_out = m->n_aux;
}

int nn_bn(mgt_model *m, const char *name, int x, float eps, float momentum)
{
    if (x < 0)
        return -1;
    const nn_value *v = &m->values[x];
    int c = v->c, hw = v->h * v->w;
    nn_node *nd = new_node(m, NN_BN, name, &x, 1, v->c, v->h, v->w);
    if (!nd)
        return -1;
    nd->u.bn.eps = eps;
    nd->u.bn.momentum = momentum;
    nd->u.bn.counter = m->n_bn;
    int64_t cs[1] = {c};
    nn_entry_init none = {NN_INIT_NONE, 0};
    node_entry(m, nd, "weight", MGT_MODEL_PARAM, MGT_TENSOR_NORM_WEIGHT, 1, cs, init_const(1));
    node_entry(m, nd, "bias", MGT_MODEL_PARAM, MGT_TENSOR_NORM_BIAS, 1, cs, init_const(0));
    node_entry(m, nd, "running_mean", MGT_MODEL_BUFFER, MGT_TENSOR_RUNNING_MEAN, 1, cs, none);
    node_entry(m, nd, "running_var", MGT_MODEL_BUFFER, MGT_TENSOR_RUNNING_VAR, 1, cs, none);
    node_entry(m, nd, "num_batches_tracked", MGT_MODEL_COUNTER, MGT_TENSOR_NUM_BATCHES, 0, NULL,
               none);
    if (m->min_bn_hw == 0 || hw < m->min_bn_hw)
        m->min_bn_hw = hw;
    if (c > m->max_bn_c)
        m->max_bn_c = c;
    return nd->out;
}

int nn_relu(mgt_model *m, const char *name, int x)
{
    if (x < 0)
        return -1;
    const nn_value *v = &m->values[x];
    nn_node *nd = new_node(m, NN_RELU, name, &x, 1, v->c, v->h, v->w);
    return nd ? nd->out : -1;
}

static int maxpool_mode(mgt_model *m, const char *name, int x, int k, int stride, int pad,
                        bool ceil_mode)
{
    if (x < 0)
        return -1;
    const nn_value *v = &m->values[x];
    mgt_pool2d_shape sh = {.n = m->cfg.batch,
                           .c = v->c,
                           .h = v->h,
                           .w = v->w,
                           .kh = k,
                           .kw = k,
                           .stride_h = stride,
                           .stride_w = stride,
                           .pad_h = pad,
                           .pad_w = pad,
                           .ceil_mode = ceil_mode};
    nn_node *nd =
        new_node(m, NN_MAXPOOL, name, &x, 1, v->c, mgt_pool2d_out_h(&sh), mgt_pool2d_out_w(&sh));
    if (!nd)
        return -1;
    nd->u.pool = sh;
    return nd->out;
}

int nn_maxpool(mgt_model *m, const char *name, int x, int k, int stride, int pad)
{
    return maxpool_mode(m, name, x, k, stride, pad, false);
}

int nn_maxpool_ceil(mgt_model *m, const char *name, int x, int k, int stride, int pad)
{
    return maxpool_mode(m, name, x, k, stride, pad, true);
}

int nn_apool(mgt_model *m, const char *name, int x, int oh, int ow)
{
    if (x < 0)
        return -1;
    nn_node *nd = new_node(m, NN_APOOL, name, &x, 1, m->values[x].c, oh, ow);
    if (!nd)
        return -1;
    nd->u.apool.oh = oh;
    nd->u.apool.ow = ow;
    return nd->out;
}

int nn_concat(mgt_model *m, const char *name, const int *in, int n)
{
    MGT_ASSERT(n >= 1 && n <= NN_MAX_IN);
    int c = 0;
    for (int i = 0; i < n; i++) {
        if (in[i] < 0)
            return -1;
        MGT_ASSERT(m->values[in[i]].h == m->values[in[0]].h &&
                   m->values[in[i]].w == m->values[in[0]].w);
        c += m->values[in[i]].c;
    }
    nn_node *nd = new_node(m, NN_CONCAT, name, in, n, c, m->values[in[0]].h, m->values[in[0]].w);
    return nd ? nd->out : -1;
}

int nn_slice(mgt_model *m, const char *name, int x, int c0, int c)
{
    if (x < 0)
        return -1;
    const nn_value *v = &m->values[x];
    MGT_ASSERT(c0 >= 0 && c >= 1 && c0 + c <= v->c);
    nn_node *nd = new_node(m, NN_SLICE, name, &x, 1, c, v->h, v->w);
    if (!nd)
        return -1;
    nd->u.slice_c0 = c0;
    return nd->out;
}

int nn_cat_shuffle(mgt_model *m, const char *name, const int *in, int n)
{
    MGT_ASSERT(n >= 1 && n <= NN_MAX_IN);
    for (int i = 0; i < n; i++) {
        if (in[i] < 0)
            return -1;
        MGT_ASSERT(m->values[in[i]].c == m->values[in[0]].c &&
                   m->values[in[i]].h == m->values[in[0]].h &&
                   m->values[in[i]].w == m->values[in[0]].w);
    }
    const nn_value *v = &m->values[in[0]];
    nn_node *nd = new_node(m, NN_SHUFFLE, name, in, n, v->c * n, v->h, v->w);
    return nd ? nd->out : -1;
}

int nn_add(mgt_model *m, const char *name, int a, int b)
{
    if (a < 0 || b < 0)
        return -1;
    const nn_value *v = &m->values[a];
    MGT_ASSERT(nn_value_floats(v) == nn_value_floats(&m->values[b]));
    int in[2] = {a, b};
    nn_node *nd = new_node(m, NN_ADD, name, in, 2, v->c, v->h, v->w);
    return nd ? nd->out : -1;
}

int nn_gap(mgt_model *m, const char *name, int x)
{
    if (x < 0)
        return -1;
    nn_node *nd = new_node(m, NN_GAP, name, &x, 1, m->values[x].c, 1, 1);
    return nd ? nd->out : -1;
}

/* A linear layer over `rows` rows of `in` features per image into `out` features each, making
   an oc x oh x ow value. */
static int linear_rows(mgt_model *m, const char *name, int x, int rows, int in, int out, int oc,
                       int oh, int ow, bool bias, const char *wname, const char *bname)
{
    nn_node *nd = new_node(m, NN_LINEAR, name, &x, 1, oc, oh, ow);
    if (!nd)
        return -1;
    nd->u.linear.in = in;
    nd->u.linear.out = out;
    nd->u.linear.rows = rows;
    nd->u.linear.bias = bias;
    /* PyTorch's default for Linear: U(+-1/sqrt(in_features)) for weight and bias */
    nn_entry_init u = {NN_INIT_UNIFORM, 1.0 / sqrt((double)in)};
    int64_t ws[2] = {out, in}, bs[1] = {out};
    node_entry(m, nd, wname, MGT_MODEL_PARAM, MGT_TENSOR_LINEAR_WEIGHT, 2, ws, u);
    if (bias)
        node_entry(m, nd, bname, MGT_MODEL_PARAM, MGT_TENSOR_BIAS, 1, bs, u);
    return nd->out;
}

int nn_linear(mgt_model *m, const char *name, int x, int out)
{
    if (x < 0)
        return -1;
    int in = (int)nn_value_floats(&m->values[x]);
    return linear_rows(m, name, x, 1, in, out, out, 1, 1, true, "weight", "bias");
}

int nn_linear_nobias(mgt_model *m, const char *name, int x, int out)
{
    if (x < 0)
        return -1;
    int in = (int)nn_value_floats(&m->values[x]);
    return linear_rows(m, name, x, 1, in, out, out, 1, 1, false, "weight", NULL);
}

int nn_token_linear(mgt_model *m, const char *name, int x, int out, bool bias, const char *wname,
                    const char *bname)
{
    if (x < 0)
        return -1;
    const nn_value *v = &m->values[x];
    int c = v->c, h = v->h, in = v->w;
    return linear_rows(m, name, x, c * h, in, out, c, h, out, bias, wname, bname);
}

int nn_token_linear_entry(mgt_model *m, const char *name, int x, int weight)
{
    if (x < 0 || weight < 0)
        return -1;
    const nn_value *v = &m->values[x];
    int c = v->c, h = v->h, in = v->w, out = (int)m->table[weight].shape[0];
    MGT_ASSERT(m->table[weight].numel == (size_t)in * out);
    nn_node *nd = new_node(m, NN_LINEAR, name, &x, 1, c, h, out);
    if (!nd)
        return -1;
    nd->u.linear.in = in;
    nd->u.linear.out = out;
    nd->u.linear.rows = c * h;
    nn_attach_param(m, nd, weight);
    return nd->out;
}

int nn_layernorm_entries(mgt_model *m, const char *name, int c)
{
    int64_t cs[1] = {c};
    int w = nn_add_entry(m, name, "weight", MGT_MODEL_PARAM, MGT_TENSOR_NORM_WEIGHT, 1, cs,
                         init_const(1));
    int b =
        nn_add_entry(m, name, "bias", MGT_MODEL_PARAM, MGT_TENSOR_NORM_BIAS, 1, cs, init_const(0));
    return w < 0 || b != w + 1 ? -1 : w;
}

int nn_layernorm_of(mgt_model *m, const char *name, int x, float eps, int weight)
{
    if (x < 0 || weight < 0)
        return -1;
    const nn_value *v = &m->values[x];
    MGT_ASSERT(m->table[weight].numel == (size_t)v->w);
    nn_node *nd = new_node(m, NN_LN, name, &x, 1, v->c, v->h, v->w);
    if (!nd)
        return -1;
    nd->u.ln_eps = eps;
    nn_attach_param(m, nd, weight);
    nn_attach_param(m, nd, weight + 1);
    return nd->out;
}

/* A layer norm node of x with its weight (1) and bias (0): NN_LN over the last dimension (w),
   NN_LN2D over each pixel's channels (c). */
static int norm_node(mgt_model *m, nn_kind kind, const char *name, int x, float eps)
{
    if (x < 0)
        return -1;
    /* the width before new_node, which may move m->values */
    const nn_value *v = &m->values[x];
    int64_t cs[1] = {kind == NN_LN ? v->w : v->c};
    nn_node *nd = new_node(m, kind, name, &x, 1, v->c, v->h, v->w);
    if (!nd)
        return -1;
    nd->u.ln_eps = eps;
    node_entry(m, nd, "weight", MGT_MODEL_PARAM, MGT_TENSOR_NORM_WEIGHT, 1, cs, init_const(1));
    node_entry(m, nd, "bias", MGT_MODEL_PARAM, MGT_TENSOR_NORM_BIAS, 1, cs, init_const(0));
    return nd->out;
}

int nn_layernorm(mgt_model *m, const char *name, int x, float eps)
{
    return norm_node(m, NN_LN, name, x, eps);
}

/* Whether every element of one image's grid value (n floats: a scatter's output, or a
   gather's input whose backward scatters) is reached by some position of sh: else the kernels
   zero it first. */
static bool permute_covers(const mgt_permute_shape *sh, size_t n)
{
    size_t span = 1;
    for (int a = 1; a < sh->naxes; a++)
        span += (size_t)(sh->limit[a] - 1) * sh->grid_stride[a];
    if (span < n)
        return false;
    MGT_ASSERT(span == n);
    unsigned char *hit = calloc(n, 1);
    if (!hit)
        return false;
    int pos[MGT_PERMUTE_DIMS] = {0};
    for (bool more = true; more;) {
        long long idx[MGT_PERMUTE_DIMS] = {0};
        for (int a = 1; a < sh->naxes; a++)
            idx[a] = sh->shift[a];
        for (int d = 1; d < sh->ndim; d++)
            idx[sh->axis[d]] += (long long)pos[d] * sh->coef[d];
        size_t g = 0;
        bool there = true;
        for (int a = 1; a < sh->naxes; a++) {
            long long i = idx[a];
            if (sh->extent[a] > 0)
                i = ((i % sh->extent[a]) + sh->extent[a]) % sh->extent[a];
            there &= i < sh->limit[a];
            g += (size_t)i * sh->grid_stride[a];
        }
        if (there)
            hit[g] = 1;
        int d = sh->ndim - 1;
        while (d >= 1 && ++pos[d] == sh->size[d])
            pos[d--] = 0;
        more = d >= 1;
    }
    bool all = true;
    for (size_t i = 0; i < n && all; i++)
        all = hit[i];
    free(hit);
    return all;
}

int nn_permute(mgt_model *m, const char *name, int x, const mgt_permute_shape *sh, int oc, int oh,
               int ow)
{
    if (x < 0)
        return -1;
    nn_node *nd = new_node(m, NN_PERMUTE, name, &x, 1, oc, oh, ow);
    if (!nd)
        return -1;
    nd->u.permute.sh = *sh;
    nd->u.permute.covers =
        permute_covers(sh, sh->scatter ? (size_t)oc * oh * ow : nn_value_floats(&m->values[x]));
    return nd->out;
}

void nn_init_normal_weights(mgt_model *m, double std)
{
    for (int e = 0; e < m->n_table; e++) {
        const mgt_model_entry *t = &m->table[e];
        if (t->what == MGT_TENSOR_CONV_WEIGHT || t->what == MGT_TENSOR_LINEAR_WEIGHT)
            m->init[e] = (nn_entry_init){NN_INIT_NORMAL, std};
        else if (t->what == MGT_TENSOR_BIAS)
            m->init[e] = (nn_entry_init){NN_INIT_CONST, 0.0};
    }
}

void nn_relative_index(int ws, int64_t *index)
{
    int t = ws * ws;
    for (int i = 0; i < t; i++)
        for (int j = 0; j < t; j++)
            index[i * t + j] =
                (int64_t)(i / ws - j / ws + ws - 1) * (2 * ws - 1) + (i % ws - j % ws + ws - 1);
}

int nn_attention(mgt_model *m, const char *name, int x, int heads, int windows, int table,
                 int table_rows, const int32_t *index, const float *mask)
{
    if (x < 0)
        return -1;
    const nn_value *v = &m->values[x];
    int tokens = v->h, dim = v->w / 3;
    MGT_ASSERT(v->c == windows && v->w == 3 * dim && dim % heads == 0);
    size_t tt = (size_t)tokens * tokens;
    int index_c = -1, off_c = -1, order_c = -1, mask_c = -1;
    if (table >= 0) {
        int32_t *off = malloc(((size_t)table_rows + 1) * sizeof *off);
        int32_t *order = malloc(tt * sizeof *order);
        bool ok = off && order && mgt_relpos_inverse(index, (int)tt, table_rows, off, order);
        MGT_ASSERT(!off || !order || ok);
        if (ok) {
            index_c = nn_const(m, index, tt * sizeof *index);
            off_c = nn_const(m, off, ((size_t)table_rows + 1) * sizeof *off);
            order_c = nn_const(m, order, tt * sizeof *order);
        } else {
            m->oom = true;
        }
        free(off);
        free(order);
    }
    if (mask)
        mask_c = nn_const(m, mask, (size_t)windows * tt * sizeof *mask);
    nn_node *nd = new_node(m, NN_ATTN, name, &x, 1, windows, tokens, dim);
    if (!nd)
        return -1;
    nd->u.attn.heads = heads;
    nd->u.attn.tokens = tokens;
    nd->u.attn.dh = dim / heads;
    nd->u.attn.windows = windows;
    nd->u.attn.scale = 1.0f / sqrtf((float)(dim / heads));
    nd->u.attn.stream = 0x10000u + (uint32_t)m->n_attn++;
    nd->u.attn.table = table;
    nd->u.attn.table_rows = table_rows;
    nd->u.attn.mask = mask_c;
    nd->u.attn.index = index_c;
    nd->u.attn.offsets = off_c;
    nd->u.attn.order = order_c;
    if (table >= 0)
        nn_attach_param(m, nd, table);
    return nd->out;
}

int nn_attention_v2(mgt_model *m, const char *name, int x, int heads, int windows, int logit_scale,
                    int table_rows, const int32_t *index, const float *mask)
{
    int y = nn_attention(m, name, x, heads, windows, -1, table_rows, NULL, mask);
    if (y < 0 || logit_scale < 0)
        return -1;
    nn_node *nd = nn_node_of(m, y);
    size_t tt = (size_t)nd->u.attn.tokens * nd->u.attn.tokens;
    int32_t *off = malloc(((size_t)table_rows + 1) * sizeof *off);
    int32_t *order = malloc(tt * sizeof *order);
    if (off && order && mgt_relpos_inverse(index, (int)tt, table_rows, off, order)) {
        nd->u.attn.index = nn_const(m, index, tt * sizeof *index);
        nd->u.attn.offsets = nn_const(m, off, ((size_t)table_rows + 1) * sizeof *off);
        nd->u.attn.order = nn_const(m, order, tt * sizeof *order);
    } else {
        m->oom = true;
    }
    free(off);
    free(order);
    nd = nn_node_of(m, y); /* nn_const may not move nodes, but stay safe */
    nd->u.attn.cosine = true;
    nd->u.attn.scale = 1.0f;
    nn_attach_param(m, nd, logit_scale);
    return y;
}

void nn_attention_cpb(mgt_model *m, int attn_value, int w1, int b1, int w2, int coords, int hidden)
{
    if (attn_value < 0 || w1 < 0 || b1 < 0 || w2 < 0 || coords < 0)
        return;
    nn_node *nd = nn_node_of(m, attn_value);
    nd->u.attn.cpb = hidden;
    nn_attach_param(m, nd, w1);
    nn_attach_param(m, nd, b1);
    nn_attach_param(m, nd, w2);
    nn_attach_buffer(m, nd, coords);
}

void nn_linear_zero_mid_bias(mgt_model *m, int value)
{
    if (value < 0)
        return;
    nn_node *nd = nn_node_of(m, value);
    size_t n = (size_t)m->cfg.batch * nd->u.linear.rows;
    float *ones = malloc(n * sizeof *ones);
    if (!ones) {
        m->oom = true;
        return;
    }
    for (size_t i = 0; i < n; i++)
        ones[i] = 1.0f;
    int c = nn_const(m, ones, n * sizeof *ones);
    free(ones);
    nd = nn_node_of(m, value);
    nd->u.linear.zero_mid_bias = true;
    nd->u.linear.ones = c;
}

int nn_class_token(mgt_model *m, const char *name, int x, int token)
{
    if (x < 0 || token < 0)
        return -1;
    const nn_value *v = &m->values[x];
    int dim = v->c, patches = v->h * v->w;
    MGT_ASSERT(m->table[token].numel == (size_t)dim);
    float *ones = malloc((size_t)m->cfg.batch * sizeof *ones);
    if (!ones) {
        m->oom = true;
        return -1;
    }
    for (int i = 0; i < m->cfg.batch; i++)
        ones[i] = 1.0f;
    int oc = nn_const(m, ones, (size_t)m->cfg.batch * sizeof *ones);
    free(ones);
    nn_node *nd = new_node(m, NN_CLS, name, &x, 1, 1, patches + 1, dim);
    if (!nd)
        return -1;
    nd->u.cls_ones = oc;
    nn_attach_param(m, nd, token);
    return nd->out;
}

int nn_pos_add(mgt_model *m, const char *name, int x, int param)
{
    if (x < 0 || param < 0)
        return -1;
    const nn_value *v = &m->values[x];
    MGT_ASSERT(m->table[param].numel == nn_value_floats(v));
    nn_node *nd = new_node(m, NN_POSADD, name, &x, 1, v->c, v->h, v->w);
    if (!nd)
        return -1;
    nn_attach_param(m, nd, param);
    return nd->out;
}

int nn_const(mgt_model *m, const void *data, size_t bytes)
{
    for (int i = 0; i < m->n_consts; i++)
        if (m->consts[i].bytes == bytes && memcmp(m->consts[i].data, data, bytes) == 0)
            return i;
    if (!grow(m, (void **)&m->consts, &m->cap_consts, m->n_consts + 1, sizeof *m->consts))
        return -1;
    void *copy = malloc(bytes ? bytes : 1);
    if (!copy) {
        m->oom = true;
        return -1;
    }
    memcpy(copy, data, bytes);
    m->consts[m->n_consts] = (nn_constant){copy, bytes, 0};
    return m->n_consts++;
}

int nn_add_index(mgt_model *m, const char *prefix, const char *suffix, int ndim,
                 const int64_t *shape, const int64_t *values)
{
    size_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= (size_t)shape[d];
    int64_t *v = realloc(m->index_vals, (m->n_index_vals + n) * sizeof *v);
    if (!v) {
        m->oom = true;
        return -1;
    }
    m->index_vals = v;
    memcpy(v + m->n_index_vals, values, n * sizeof *v);
    int e = nn_add_entry(m, prefix, suffix, MGT_MODEL_INDEX, MGT_TENSOR_CONSTANT, ndim, shape,
                         (nn_entry_init){NN_INIT_NONE, 0});
    if (e >= 0)
        m->table[e].offset = m->n_index_vals;
    m->n_index_vals += n;
    return e;
}

int nn_dropout(mgt_model *m, const char *name, int x, float p)
{
    if (x < 0)
        return -1;
    const nn_value *v = &m->values[x];
    nn_node *nd = new_node(m, NN_DROPOUT, name, &x, 1, v->c, v->h, v->w);
    if (!nd)
        return -1;
    nd->u.dropout.p = m->cfg.no_dropout ? 0.0f : p;
    nd->u.dropout.stream = (uint32_t)m->n_dropout++;
    return nd->out;
}

int nn_activation(mgt_model *m, const char *name, int x, mgt_act act)
{
    if (x < 0)
        return -1;
    const nn_value *v = &m->values[x];
    nn_node *nd = new_node(m, NN_ACT, name, &x, 1, v->c, v->h, v->w);
    if (!nd)
        return -1;
    nd->u.act = act;
    return nd->out;
}

int nn_scale(mgt_model *m, const char *name, int x, int s)
{
    if (x < 0 || s < 0)
        return -1;
    const nn_value *v = &m->values[x];
    MGT_ASSERT(m->values[s].c == v->c && m->values[s].h == 1 && m->values[s].w == 1);
    int in[2] = {x, s};
    nn_node *nd = new_node(m, NN_SCALE, name, in, 2, v->c, v->h, v->w);
    return nd ? nd->out : -1;
}

int nn_stochastic_depth(mgt_model *m, const char *name, int x, float p)
{
    if (x < 0)
        return -1;
    const nn_value *v = &m->values[x];
    nn_node *nd = new_node(m, NN_SDEPTH, name, &x, 1, v->c, v->h, v->w);
    if (!nd)
        return -1;
    nd->u.sdepth.p = m->cfg.no_dropout ? 0.0f : p;
    nd->u.sdepth.stream = (uint32_t)m->n_dropout++;
    return nd->out;
}

int nn_layernorm2d(mgt_model *m, const char *name, int x, float eps)
{
    return norm_node(m, NN_LN2D, name, x, eps);
}

void nn_attach_buffer(mgt_model *m, nn_node *nd, int entry)
{
    MGT_ASSERT(m->table[entry].role == MGT_MODEL_BUFFER && nd->n_entries < NN_MAX_ENTRIES);
    m->table[entry].layer = (int)(nd - m->nodes);
    nd->entry[nd->n_entries++] = entry;
}

void nn_attach_param(mgt_model *m, nn_node *nd, int entry)
{
    MGT_ASSERT(m->table[entry].role == MGT_MODEL_PARAM && nd->n_params == nd->n_entries &&
               nd->n_entries < NN_MAX_ENTRIES);
    m->table[entry].layer = (int)(nd - m->nodes);
    nd->entry[nd->n_entries++] = entry;
    nd->n_params++;
}

int nn_layer_scale(mgt_model *m, const char *name, int x, int param)
{
    if (x < 0 || param < 0)
        return -1;
    const nn_value *v = &m->values[x];
    MGT_ASSERT(m->table[param].numel == (size_t)v->c && m->table[param].role == MGT_MODEL_PARAM);
    nn_node *nd = new_node(m, NN_LSCALE, name, &x, 1, v->c, v->h, v->w);
    if (!nd)
        return -1;
    nn_attach_param(m, nd, param);
    return nd->out;
}

/* ---- planning ---- */

typedef struct planner {
    mgt_model *m;
    size_t act_next;  /* bytes of the activation arena so far */
    size_t act_image; /* bytes per image */
    size_t act_fixed; /* floats independent of the batch */
    int *slot_ref;    /* live values holding each gradient slot */
    int *free_slots, n_free;
    int cap_slots;
} planner;

/* A region of `elems` elements of `esize` bytes per image. */
static size_t act_image(planner *p, size_t elems, size_t esize)
{
    size_t off = p->act_next;
    p->act_next += nn_align((size_t)p->m->cfg.batch * elems * esize);
    p->act_image += elems * esize;
    return off;
}

static size_t act_fixed(planner *p, size_t floats)
{
    size_t off = p->act_next;
    p->act_next += nn_align(floats * sizeof(float));
    p->act_fixed += floats;
    return off;
}

/* A gradient slot of at least `bytes` per image: a free one (the most recently freed) or a
   new one. Slot sizes grow to the largest gradient they ever hold (a gradient is stored as its
   value is). */
static int slot_take(planner *p, size_t bytes)
{
    mgt_model *m = p->m;
    int s;
    if (p->n_free > 0) {
        s = p->free_slots[--p->n_free];
    } else {
        int cap = p->cap_slots;
        if (!grow(m, (void **)&m->slot_bytes, &cap, m->n_slots + 1, sizeof *m->slot_bytes))
            return -1;
        if (cap != p->cap_slots) {
            int c2 = p->cap_slots, c3 = p->cap_slots;
            if (!grow(m, (void **)&p->slot_ref, &c2, cap, sizeof *p->slot_ref) ||
                !grow(m, (void **)&p->free_slots, &c3, cap, sizeof *p->free_slots))
                return -1;
            p->cap_slots = cap;
        }
        s = m->n_slots++;
        m->slot_bytes[s] = 0;
        p->slot_ref[s] = 0;
    }
    if (bytes > m->slot_bytes[s])
        m->slot_bytes[s] = bytes;
    p->slot_ref[s] = 1;
    return s;
}

static void slot_release(planner *p, int s)
{
    MGT_ASSERT(p->slot_ref[s] > 0);
    if (--p->slot_ref[s] == 0)
        p->free_slots[p->n_free++] = s;
}

/* Whether a node of this kind reads (and, but for the global pool, writes) the device's
   blocked layout: the convolution without bias, plain or depthwise (oneDNN's direct and
   depthwise kernels; other groups would take its reference loops), batch norm, ReLU, the other
   activations and add (elementwise, so any layout), the channel scale (squeeze-excite's; its
   gate, [n, c, 1, 1], stays NCHW), stochastic depth (a scale per image, whose values are
   contiguous in either layout), max pooling, and the global average pool as a reader
   (its output has no pixels). */
static bool takes_blocked(const mgt_model *m, const nn_node *nd, bool as_reader)
{
    const mgt_conv2d_shape *sh = &nd->u.conv.sh;
    switch (nd->kind) {
    case NN_CONV: /* bias: an NCHW kernel */
        return (sh->groups == 1 || (sh->groups == sh->c && sh->groups == sh->k)) &&
               !nd->u.conv.bias;
    case NN_BN: return !m->cfg.sync_bn && !m->cfg.freeze_bn; /* their kernels take NCHW */
    case NN_RELU:
    case NN_ACT:
    case NN_SCALE:
    case NN_SDEPTH:
    case NN_ADD:
    case NN_MAXPOOL: return true;
    case NN_GAP: return as_reader;
    default: return false;
    }
}

/* Input j of a node that takes 16-bit activations but reads that input in fp32 whatever the
   others are: the squeeze-excite gate (the channel scale ops take their scale in fp32, as the
   stochastic depth mask and the layer scale parameter are). */
static bool scale_input_fp32(const nn_node *nd, int j) { return nd->kind == NN_SCALE && j == 1; }

static bool layout_plain(const nn_value *x) { return x->layout == MGT_LAYOUT_NCHW; }
static void layout_make_plain(nn_value *x) { x->layout = MGT_LAYOUT_NCHW; }
static bool dtype_plain(const nn_value *x) { return x->dtype == MGT_PREC_F32; }
static void dtype_make_plain(nn_value *x) { x->dtype = MGT_PREC_F32; }

/* A node other than a convolution, a linear layer or the global pool keeps one layout and one
   storage across its inputs and output (the squeeze-excite gate's storage aside; no kernel that
   takes a blocked or channels-last layout reads a gate): where one operand is plain (NCHW,
   fp32), all of them become so. The planners below run it after their first guess: a plain value pulls
   its neighbours along, and the fixed point is reached in a few sweeps. */
static void spread_plain(mgt_model *m, bool (*plain)(const nn_value *),
                         void (*make_plain)(nn_value *))
{
    for (bool changed = true; changed;) {
        changed = false;
        for (int i = 0; i < m->n_nodes; i++) {
            nn_node *nd = &m->nodes[i];
            if (nd->kind == NN_CONV || nd->kind == NN_GAP || nd->kind == NN_LINEAR)
                continue;
            bool any = plain(&m->values[nd->out]);
            for (int j = 0; j < nd->n_in; j++)
                any |= !scale_input_fp32(nd, j) && plain(&m->values[nd->in[j]]);
            if (!any)
                continue;
            for (int j = -1; j < nd->n_in; j++) {
                if (j >= 0 && scale_input_fp32(nd, j))
                    continue;
                nn_value *x = &m->values[j < 0 ? nd->out : nd->in[j]];
                changed |= !plain(x);
                make_plain(x);
            }
        }
    }
}

/* Each convolution's shape carries the layouts of its input and output as planned. */
static void note_conv_layouts(mgt_model *m)
{
    for (int i = 0; i < m->n_nodes; i++) {
        nn_node *nd = &m->nodes[i];
        if (nd->kind == NN_CONV) {
            nd->u.conv.sh.x_layout = m->values[nd->in[0]].layout;
            nd->u.conv.sh.y_layout = m->values[nd->out].layout;
        }
    }
}

/* The layout of every value: the device's blocked one where the value has whole 16-channel
   blocks and pixels, and its producer and every reader take it; NCHW elsewhere (the model's
   input and everything a family feeds to other ops). A node that is not a convolution keeps
   one layout across its inputs and output, so a value that must stay NCHW pulls its
   neighbours through BN, ReLU and add along; the fixed point is reached in a few sweeps. */
static void plan_layouts(mgt_model *m)
{
    /* a model made without a device (to count or describe it) keeps NCHW */
    mgt_layout want = m->dev ? mgt_device_act_layout(m->dev) : MGT_LAYOUT_NCHW;
    if (want == MGT_LAYOUT_NHWC) /* with the storage, in plan_channels_last */
        want = MGT_LAYOUT_NCHW;
    for (int v = 0; v < m->n_values; v++) {
        nn_value *x = &m->values[v];
        x->layout = MGT_LAYOUT_NCHW;
        if (want == MGT_LAYOUT_NCHW || v == 0 || x->c % 16 != 0 || x->h * x->w < 2 ||
            !takes_blocked(m, &m->nodes[x->producer], false))
            continue;
        x->layout = want;
    }
    for (int i = 0; i < m->n_nodes; i++)
        for (int j = 0; j < m->nodes[i].n_in; j++)
            if (!takes_blocked(m, &m->nodes[i], true))
                m->values[m->nodes[i].in[j]].layout = MGT_LAYOUT_NCHW;
    spread_plain(m, layout_plain, layout_make_plain);
    note_conv_layouts(m);
}

/* Whether a node of this kind reads (as_reader) or writes 16-bit activations (mgt_store): the
   convolution (a bias is added onto its stored output), batch norm (not the synchronised or
   frozen ones: their kernels take fp32), ReLU and the other activations, add, dropout, the
   squeeze-excite scale (its gate stays fp32: scale_input_fp32), stochastic depth, the layer norm
   over channels, the layer scale, max pooling, adaptive average pooling, concatenation, slices
   and shuffles (copies of 16-bit codes), the global average pool as a reader (its [c] output
   goes to the classifier in fp32); the transformers' layer norm, permutations, attention (its
   softmax statistics and sums fp32), class token and position embedding, MaxViT's average pool
   (a depthwise convolution of constant taps); the linear layer as a reader, and as a writer of
   anything but logits (what the loss reads stays fp32: the last node's output, and here the
   auxiliary classifiers'). */
static bool takes_16(const mgt_model *m, const nn_node *nd, bool as_reader)
{
    /* CUDA (and the byte-model devices that plan as it does) has no 16-bit kernels for the
       transformers' ops (the linear layer's gemm, layer norm, permutes, attention, the token
       ops, avgpool2d): their values stay fp32 there (mgt_op_cuda_store16_kind) */
    if (m->dev && mgt_device_get_kind(m->dev) == MGT_DEVICE_CUDA) {
        switch (nd->kind) {
        case NN_LINEAR:
        case NN_LN:
        case NN_PERMUTE:
        case NN_ATTN:
        case NN_CLS:
        case NN_POSADD:
        case NN_AVGPOOL2D: return false;
        default: break;
        }
    }
    switch (nd->kind) {
    case NN_BN: return !m->cfg.sync_bn && !m->cfg.freeze_bn;
    case NN_CONV:
    case NN_RELU:
    case NN_ACT:
    case NN_DROPOUT:
    case NN_SCALE:
    case NN_SDEPTH:
    case NN_LN2D:
    case NN_LSCALE:
    case NN_ADD:
    case NN_MAXPOOL:
    case NN_CONCAT:
    case NN_SLICE:
    case NN_SHUFFLE:
    case NN_APOOL:
    case NN_LN:
    case NN_PERMUTE:
    case NN_ATTN:
    case NN_CLS:
    case NN_POSADD:
    case NN_AVGPOOL2D: return true;
    case NN_LINEAR: return as_reader || nd->aux_out == 0;
    case NN_GAP: return as_reader;
    default: return false;
    }
}

/* The storage of every value: the device's 16-bit format under cfg.amp where its producer and
   every reader take it (takes_16), fp32 elsewhere (the model input, what a classifier, the
   loss or an fp32-only kind reads). A node other than a convolution or the global pool keeps
   one storage across its inputs and output (one store per op), so an fp32 value pulls its
   neighbours along, as in plan_layouts; the fixed point is reached in a few sweeps. */
static void plan_dtypes(mgt_model *m)
{
    /* a model made without a device (to count or describe it) stores as mock devices do */
    mgt_precision want = m->dev ? mgt_device_act_dtype(m->dev, m->cfg.amp) : m->cfg.amp;
    for (int v = 0; v < m->n_values; v++) {
        nn_value *x = &m->values[v];
        x->dtype = MGT_PREC_F32;
        if (want != MGT_PREC_F32 && v != 0 && takes_16(m, &m->nodes[x->producer], false))
            x->dtype = want;
    }
    m->values[m->nodes[m->n_nodes - 1].out].dtype = MGT_PREC_F32; /* the logits: the loss's */
    for (int i = 0; i < m->n_nodes; i++)
        for (int j = 0; j < m->nodes[i].n_in; j++)
            if (!takes_16(m, &m->nodes[i], true) || scale_input_fp32(&m->nodes[i], j))
                m->values[m->nodes[i].in[j]].dtype = MGT_PREC_F32;
    spread_plain(m, dtype_plain, dtype_make_plain);
}

/* On a device whose layout is channels last (mgt_device_act_layout NHWC: CUDA under --amp), a
   value is NHWC exactly where it is 16-bit: every kind that takes 16-bit activations there
   (takes_16) has CUDA kernels for them in NHWC (store16.cu, act.cu, dnn.cu's channels-last
   convolutions, the channel bias and scale, dropout and the layer norm of elementwise.cu and
   norm.cu), so plan_dtypes' storage stands and an fp32 value stays NCHW (a 16-bit NCHW
   activation or an fp32 NHWC one is a storage the device has no kernels for). Runs after
   plan_layouts and plan_dtypes, which left every value NCHW on such a device. */
static void plan_channels_last(mgt_model *m)
{
    if (!m->dev || mgt_device_act_layout(m->dev) != MGT_LAYOUT_NHWC)
        return;
    for (int v = 0; v < m->n_values; v++)
        m->values[v].layout =
            m->values[v].dtype != MGT_PREC_F32 ? MGT_LAYOUT_NHWC : MGT_LAYOUT_NCHW;
    note_conv_layouts(m);
}

/* Which outputs overwrite their input: the kind allows it, the input is read by nothing
   else, and neither the input's producer nor this node needs the overwritten values in
   backward. Applied in forward order, this keeps every chain of in-place outputs safe: each
   earlier member was checked the same way when its successor went in place. */
static void plan_inplace(mgt_model *m)
{
    for (int i = 0; i < m->n_nodes; i++) {
        nn_node *nd = &m->nodes[i];
        const nn_kind_i *k = &nn_kinds[nd->kind];
        nn_value *x = &m->values[nd->in[0]], *y = &m->values[nd->out];
        if (!(k->flags & NN_F_INPLACE) || nd->in[0] == 0 || x->consumers != 1 ||
            (k->flags & NN_F_NEEDS_X) || nn_value_floats(x) != nn_value_floats(y) ||
            x->dtype != y->dtype)
            continue;
        if (nn_kinds[m->nodes[x->producer].kind].flags & NN_F_NEEDS_Y)
            continue;
        nd->inplace = true;
        y->storage = x->storage;
    }
}

/* Gradient slots, by walking backward as the step will: each value's gradient lives in a
   slot from when its last reader's backward produces it until its producer's backward has
   read it. An add passes its output's slot on to its inputs (no copy); a ReLU's backward
   writes over its output's gradient where nothing else holds that slot. A value whose
   gradient already exists gets the later contributions added on; if it shares the slot with
   another live value, it first moves to a slot of its own (a copy; the families built here
   never need one). */
static mgt_status plan_grads(planner *p)
{
    mgt_model *m = p->m;
    nn_node *last = &m->nodes[m->n_nodes - 1];
    nn_value *logits = &m->values[last->out];
    logits->gslot = slot_take(p, nn_value_bytes(logits));
    for (int i = m->n_nodes - 1; i >= 0 && !m->oom; i--) {
        nn_node *nd = &m->nodes[i];
        const nn_kind_i *k = &nn_kinds[nd->kind];
        nn_value *o = &m->values[nd->out];
        /* auxiliary logits: their loss's gradient is written here when backward gets here */
        if (o->gslot < 0 && nd->aux_out)
            o->gslot = slot_take(p, nn_value_floats(o));
        if (o->gslot < 0)
            return mgt_error_set(MGT_ERR_INVALID, "model %s: layer %s does not reach the output",
                                 m->arch, nd->name);
        nd->gout = o->gslot;
        bool out_taken = false; /* an input already writes over the output's slot */
        for (int j = 0; j < nd->n_in; j++) {
            nn_value *x = &m->values[nd->in[j]];
            for (int q = 0; q < j; q++)
                assert(nd->in[q] != nd->in[j]);
            if (!x->needs_grad) {
                nd->gmode[j] = NN_G_NONE;
                continue;
            }
            if (x->gslot >= 0) {
                if (p->slot_ref[x->gslot] > 1) {
                    int t = slot_take(p, nn_value_bytes(x));
                    if (t < 0)
                        break;
                    nd->unshare[j] = x->gslot;
                    slot_release(p, x->gslot);
                    x->gslot = t;
                }
                if (k->flags & (NN_F_DX_BETA | NN_F_PASSTHROUGH)) {
                    nd->gmode[j] = NN_G_ACCUM;
                } else {
                    assert(nd->gtmp < 0); /* one input per node needs the temporary */
                    nd->gmode[j] = NN_G_ACCUM_TMP;
                    nd->gtmp = slot_take(p, nn_value_bytes(x));
                }
            } else if (k->flags & NN_F_PASSTHROUGH) {
                x->gslot = o->gslot;
                p->slot_ref[o->gslot]++;
                nd->gmode[j] = NN_G_ALIAS;
            } else if ((k->flags & NN_F_DX_ON_DY) && !out_taken && p->slot_ref[o->gslot] == 1) {
                x->gslot = o->gslot;
                p->slot_ref[o->gslot]++;
                if (nn_value_bytes(x) > m->slot_bytes[o->gslot])
                    m->slot_bytes[o->gslot] = nn_value_bytes(x);
                nd->gmode[j] = NN_G_WRITE;
                out_taken = true;
            } else {
                x->gslot = slot_take(p, nn_value_bytes(x));
                nd->gmode[j] = NN_G_WRITE;
            }
            nd->gin[j] = x->gslot;
        }
        slot_release(p, o->gslot);
        if (nd->gtmp >= 0)
            slot_release(p, nd->gtmp);
    }
    return m->oom ? mgt_error_set(MGT_ERR_OOM, "model %s: out of host memory", m->arch) : MGT_OK;
}

/* A residual add and the ReLU after it folded into the batch norm that makes one of the add's
   inputs (mgt_bn_train_args.z), on a channels-last device (CUDA's NHWC 16-bit kernels: one
   pass each way, as cuDNN's CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION) or in the mock devices'
   nChw16c (their blocked batch-norm kernels, fp32 or 16-bit), where
   - the BN is the node just before the add and the ReLU the one just after it, so that in
     backward the BN masks the gradient where the ReLU would have (nothing runs in between);
   - the BN's output is 16-bit and read by the add alone, the add's by the ReLU alone;
   - the add runs in place over its first input and the ReLU over the add's output, the ReLU
     writes its input gradient over its output gradient, and the add hands that slot to both
     inputs as it is (NN_G_ALIAS: no earlier contribution to add onto).
   The BN then writes the ReLU's output where the ReLU would (over the add's first input: its
   own output, or the other input z, each element read before it is overwritten), and its
   backward writes the masked gradient into the shared slot: the residual's gradient. The same
   bits as the three ops: the BN's result is rounded to its storage before z is added
   (z_round). ResNet's blocks: their last BN, or the downsample's (built just before the add). */
static void fold_residual_adds(mgt_model *m)
{
    mgt_layout dl = m->dev ? mgt_device_act_layout(m->dev) : MGT_LAYOUT_NCHW;
    if (dl != MGT_LAYOUT_NHWC && dl != MGT_LAYOUT_NCHW16C)
        return;
    for (int i = 1; i + 1 < m->n_nodes; i++) {
        nn_node *d = &m->nodes[i], *bn = &m->nodes[i - 1], *r = &m->nodes[i + 1];
        if (d->kind != NN_ADD || d->n_in != 2 || bn->kind != NN_BN || r->kind != NN_RELU ||
            bn->u.bn.relu || r->in[0] != d->out)
            continue;
        const int k = d->in[0] == bn->out ? 0 : d->in[1] == bn->out ? 1 : -1;
        if (k < 0)
            continue;
        const nn_value *v = &m->values[bn->out], *a = &m->values[d->out];
        bool kernel = dl == MGT_LAYOUT_NHWC ? v->dtype != MGT_PREC_F32 /* CUDA: 16-bit NHWC */
                                            : v->layout == MGT_LAYOUT_NCHW16C; /* mock */
        if (!kernel || v->consumers != 1 || a->consumers != 1 || !d->inplace || !r->inplace ||
            r->gmode[0] != NN_G_WRITE || r->gin[0] != r->gout || r->unshare[0] >= 0 ||
            d->gmode[k] != NN_G_ALIAS ||
            (d->gmode[1 - k] != NN_G_ALIAS && d->gmode[1 - k] != NN_G_NONE) || d->unshare[0] >= 0 ||
            d->unshare[1] >= 0)
            continue;
        bn->u.bn.relu = true;
        bn->u.bn.res_z = d->in[1 - k];
        bn->u.bn.res_y = r->out;
        d->folded = r->folded = true;
    }
}

/* ReLUs folded into the batch norm before them (mgt_bn_shape.relu): the BN's output is read by
   the ReLU alone, which runs in place over it, and whose backward writes its input gradient over
   its output gradient. Then the BN writes max(bn(x), 0) where the ReLU would have, and its
   backward reads the ReLU's output gradient and output (its own storage): one pass over the
   activation fewer each way, the same bits. The synchronised and frozen BNs keep their ReLU:
   their kernels take none. */
static void plan_fusion(mgt_model *m)
{
    if (m->cfg.no_fusion || m->cfg.sync_bn || m->cfg.freeze_bn)
        return;
    for (int i = 0; i < m->n_nodes; i++) {
        nn_node *r = &m->nodes[i];
        if (r->kind != NN_RELU)
            continue;
        const nn_value *x = &m->values[r->in[0]];
        if (x->producer < 0)
            continue;
        nn_node *bn = &m->nodes[x->producer];
        if (bn->kind != NN_BN || x->consumers != 1 || !r->inplace || r->gmode[0] != NN_G_WRITE ||
            r->gin[0] != r->gout || r->unshare[0] >= 0)
            continue;
        bn->u.bn.relu = true;
        r->folded = true;
    }
    fold_residual_adds(m);
}

/* The parameter arena in the order backward completes nodes: the reverse of the forward
   order, each node's parameters in their own order. */
static void plan_arena(mgt_model *m)
{
    for (int i = m->n_nodes - 1; i >= 0; i--) {
        const nn_node *nd = &m->nodes[i];
        for (int j = 0; j < nd->n_params; j++) {
            mgt_model_entry *e = &m->table[nd->entry[j]];
            e->offset = m->params_bytes;
            m->params_bytes += nn_align(e->numel * sizeof(float));
        }
        if (nd->n_params)
            m->layer_ends[m->n_layer_ends++] = m->params_bytes;
    }
}

/* The architecture's head (nn_arch.head) and the auxiliary classifiers' last layers (Inception
   v3's AuxLogits.fc, GoogLeNet's aux1.fc2 and aux2.fc2), whose tensors follow the class count,
   and the stem (the first convolution, whose weight follows the input channels): marked in
   the table, so that fine-tuning replaces or adapts them by what they are, not by name
   patterns. */
static mgt_status mark_head_and_stem(mgt_model *m)
{
    if (!m->head || !*m->head)
        return mgt_error_set(MGT_ERR_INVALID,
                             "model %s: its architecture names no classifier head (nn_arch.head)",
                             m->arch);
    for (const char *p = m->head; *p;) {
        size_t len = strcspn(p, " ");
        int found = -1;
        for (int i = 0; i < m->n_nodes && found < 0; i++)
            if (strlen(m->nodes[i].name) == len && strncmp(m->nodes[i].name, p, len) == 0)
                found = i;
        if (found < 0 || m->nodes[found].n_params == 0 ||
            m->values[m->nodes[found].out].c != m->cfg.classes)
            return mgt_error_set(MGT_ERR_INVALID,
                                 "model %s: its head '%.*s' is not a layer with parameters and "
                                 "one output per class",
                                 m->arch, (int)len, p);
        for (int j = 0; j < m->nodes[found].n_entries; j++)
            m->table[m->nodes[found].entry[j]].classifier = true;
        p += len;
        p += strspn(p, " ");
    }
    for (int a = 0; a < m->n_aux; a++) { /* the auxiliary classifiers' last layers */
        const nn_node *nd = nn_node_of(m, m->aux_value[a]);
        for (int j = 0; j < nd->n_entries; j++)
            m->table[nd->entry[j]].classifier = true;
    }
    for (int i = 0; i < m->n_nodes; i++)
        if (m->nodes[i].kind == NN_CONV) {
            m->table[m->nodes[i].entry[0]].stem = true;
            break;
        }
    return MGT_OK;
}

mgt_status nn_plan(mgt_model *m)
{
    if (m->long_name[0])
        return mgt_error_set(MGT_ERR_INVALID,
                             "model %s: the name '%s' is longer than the %d characters a "
                             "layer's or a parameter's name may have",
                             m->arch, m->long_name, NN_NAME - 1);
    if (m->oom || m->n_nodes == 0)
        return mgt_error_set(MGT_ERR_OOM, "model %s: out of host memory", m->arch);
    if (m->small_layer[0])
        return mgt_error_set(MGT_ERR_INVALID,
                             "model %s: a %dx%d input is too small: layer %s would give %dx%d "
                             "(use a larger --image-size)",
                             m->arch, m->cfg.image_size, m->cfg.image_size, m->small_layer,
                             m->small_h, m->small_w);
    nn_node *last = &m->nodes[m->n_nodes - 1];
    nn_value *lv = &m->values[last->out];
    if (lv->c != m->cfg.classes || lv->h != 1 || lv->w != 1)
        return mgt_error_set(MGT_ERR_INVALID,
                             "model %s: the last layer %s gives %dx%dx%d, not %d "
                             "logits",
                             m->arch, last->name, lv->c, lv->h, lv->w, m->cfg.classes);

    for (int i = 0; i < m->n_nodes; i++) {
        nn_node *nd = &m->nodes[i];
        bool g = nd->n_params > 0;
        for (int j = 0; j < nd->n_in; j++) {
            m->values[nd->in[j]].consumers++;
            g |= m->values[nd->in[j]].needs_grad;
        }
        m->values[nd->out].needs_grad = g;
    }
    mgt_status st = mark_head_and_stem(m);
    if (st != MGT_OK)
        return st;
    /* the nodes the main logits do not need: the auxiliary classifiers' (training only) */
    bool *reach = calloc((size_t)m->n_values, sizeof *reach);
    if (!reach)
        return mgt_error_set(MGT_ERR_OOM, "model %s: out of host memory", m->arch);
    reach[last->out] = true;
    for (int i = m->n_nodes - 1; i >= 0; i--) {
        nn_node *nd = &m->nodes[i];
        nd->aux = !reach[nd->out];
        for (int j = 0; j < nd->n_in && !nd->aux; j++)
            reach[nd->in[j]] = true;
    }
    free(reach);

    plan_layouts(m);
    plan_dtypes(m);
    plan_channels_last(m);
    plan_inplace(m);
    planner p = {.m = m};
    for (int v = 1; v < m->n_values; v++)
        if (m->values[v].storage == v) {
            m->values[v].off =
                act_image(&p, nn_value_floats(&m->values[v]), nn_value_esize(&m->values[v]));
            m->counts.values++;
            m->counts.values_16 += m->values[v].dtype != MGT_PREC_F32;
        }
    for (int i = 0; i < m->n_nodes; i++) {
        nn_node *nd = &m->nodes[i];
        if (nd->kind == NN_BN) {
            size_t c = (size_t)m->values[nd->out].c;
            nd->u.bn.save_off = act_fixed(&p, c);
            nd->u.bn.save_stride = act_fixed(&p, c) - nd->u.bn.save_off;
        }
        if (nd->kind == NN_SDEPTH)
            nd->u.sdepth.mask_off = act_image(&p, 1, sizeof(float));
        if (nd->kind == NN_ATTN) {
            size_t tt = (size_t)nd->u.attn.tokens * nd->u.attn.tokens * nd->u.attn.heads;
            nd->u.attn.lse_off =
                act_image(&p, (size_t)nd->u.attn.windows * nd->u.attn.heads * nd->u.attn.tokens,
                          sizeof(float));
            if (nd->u.attn.table >= 0 || nd->u.attn.cosine) {
                nd->u.attn.bias_off = act_fixed(&p, tt);
                nd->u.attn.dbias_off = act_fixed(&p, tt);
            }
            if (nd->u.attn.cpb) /* h1 and its gradient [R, cpb], t, sigmoid(t) and dt [R, heads] */
                nd->u.attn.cpb_off =
                    act_fixed(&p, (size_t)nd->u.attn.table_rows *
                                      (2 * (size_t)nd->u.attn.cpb + 3 * (size_t)nd->u.attn.heads));
        }
        if (nd->kind == NN_AVGPOOL2D || nd->kind == NN_AFFINE) {
            const mgt_conv2d_shape *sh = &nd->u.fixed.sh;
            nd->u.fixed.w_off = act_fixed(&p, (size_t)sh->c * sh->r * sh->s + (size_t)sh->c);
        }
    }
    for (int i = 0; i < m->n_consts; i++)
        m->consts[i].off = act_fixed(&p, (m->consts[i].bytes + 3) / 4);
    m->probs_off = act_image(&p, (size_t)m->cfg.classes, sizeof(float));
    m->loss_off = act_fixed(&p, 1);
    for (int a = 0; a < m->n_aux; a++)
        m->aux_probs_off[a] = act_image(&p, (size_t)m->cfg.classes, sizeof(float));
    if (m->n_aux)
        m->aux_loss_off = act_fixed(&p, (size_t)m->n_aux);
    st = plan_grads(&p);
    if (st == MGT_OK)
        plan_fusion(m);
    if (st == MGT_OK) {
        m->slot_off = malloc((size_t)m->n_slots * sizeof *m->slot_off);
        if (!m->slot_off)
            st = mgt_error_set(MGT_ERR_OOM, "model %s: out of host memory", m->arch);
    }
    for (int s = 0; st == MGT_OK && s < m->n_slots; s++)
        m->slot_off[s] = act_image(&p, m->slot_bytes[s], 1);
    if (st == MGT_OK && m->cfg.freeze_bn) {
        m->ones_off = act_fixed(&p, (size_t)m->max_bn_c);
        m->zeros_off = act_fixed(&p, (size_t)m->max_bn_c);
    }
    if (st == MGT_OK && m->cfg.sync_bn && !m->cfg.freeze_bn && m->max_bn_c > 0)
        m->bnsync_off = act_fixed(&p, 2 * (size_t)m->max_bn_c);
    free(p.slot_ref);
    free(p.free_slots);
    if (st != MGT_OK)
        return st;
    m->acts_bytes = p.act_next;
    m->counts.act_bytes_per_image = p.act_image;
    m->counts.act_bytes_fixed = p.act_fixed * sizeof(float);

    m->layer_ends = malloc((size_t)m->n_nodes * sizeof *m->layer_ends);
    m->layers = calloc((size_t)m->n_nodes, sizeof *m->layers);
    m->bn_counts = calloc((size_t)(m->n_bn ? m->n_bn : 1), sizeof *m->bn_counts);
    if (!m->layer_ends || !m->layers || !m->bn_counts)
        return mgt_error_set(MGT_ERR_OOM, "model %s: out of host memory", m->arch);
    plan_arena(m);

    for (int i = 0; i < m->n_nodes; i++) {
        const nn_node *nd = &m->nodes[i];
        const nn_value *v = &m->values[nd->out];
        mgt_model_layer *l = &m->layers[i];
        snprintf(l->name, sizeof l->name, "%s", nd->name);
        l->kind = nn_kinds[nd->kind].label;
        l->c = v->c;
        l->h = v->h;
        l->w = v->w;
        l->layout = v->layout;
        l->dtype = v->dtype;
        l->folded = nd->folded;
        l->aux = nd->aux;
        for (int j = 0; j < nd->n_params; j++)
            l->params += m->table[nd->entry[j]].numel;
        l->macs = nn_kinds[nd->kind].macs ? nn_kinds[nd->kind].macs(m, nd) : 0;
        if (nd->aux) {
            m->counts.macs_aux += l->macs;
            continue;
        }
        m->counts.macs += l->macs;
        if (nd->kind == NN_CONV || (nd->kind == NN_LINEAR && !nd->u.linear.functional))
            m->counts.macs_conv_fc += l->macs;
        if (nd->kind == NN_ATTN)
            m->counts.macs_conv_fc += nn_attn_linear_macs(m, nd);
    }
    return MGT_OK;
}

/* ---- the step ---- */

static const float *value_ptr(const mgt_model *m, int v)
{
    if (v == 0)
        return m->x;
    return nn_act(m, m->values[m->values[v].storage].off);
}

static float *slot_ptr(const mgt_model *m, int s) { return nn_act(m, m->slot_off[s]); }

static void call_params(nn_call *c, const nn_node *nd)
{
    const mgt_model *m = c->m;
    for (int j = 0; j < nd->n_entries; j++) {
        const mgt_model_entry *e = &m->table[nd->entry[j]];
        if (e->role == MGT_MODEL_PARAM) {
            c->p[j] = nn_param(m, nd->entry[j]);
            c->g[j] = nn_grad(m, nd->entry[j]);
        } else if (e->role == MGT_MODEL_BUFFER) {
            c->p[j] = nn_buf(m, nd->entry[j]);
        }
    }
}

/* A batch norm with a folded residual add writes the ReLU's output and reads the add's other
   input (plan_fusion). */
static void call_values(nn_call *c, const nn_node *nd)
{
    for (int j = 0; j < nd->n_in; j++)
        c->x[j] = value_ptr(c->m, nd->in[j]);
    c->y = (float *)value_ptr(c->m, nd->out);
    c->z = NULL;
    if (nd->kind == NN_BN && nd->u.bn.res_y > 0) {
        c->y = (float *)value_ptr(c->m, nd->u.bn.res_y);
        c->z = value_ptr(c->m, nd->u.bn.res_z);
    }
}

mgt_status nn_graph_forward(mgt_model *m, mgt_stream *s, bool train)
{
    mgt_status st = MGT_OK;
    for (int i = 0; i < m->n_nodes && st == MGT_OK; i++) {
        const nn_node *nd = &m->nodes[i];
        if (nd->aux && !train)
            continue;
        nn_call c = {.m = m, .s = s, .node = nd, .n = m->n, .train = train};
        call_values(&c, nd);
        call_params(&c, nd);
        st = nn_kinds[nd->kind].forward(&c);
    }
    return st;
}

mgt_status nn_params_ready(nn_call *c)
{
    mgt_model *m = c->m;
    const nn_node *nd = c->node;
    if (nd->n_params == 0)
        return MGT_OK;
    for (int j = 0; j < nd->n_params; j++) {
        const mgt_model_entry *e = &m->table[nd->entry[j]];
        assert(e->role == MGT_MODEL_PARAM && e->offset == m->ready);
        m->ready += nn_align(e->numel * sizeof(float));
    }
    return m->hook ? m->hook(m->hook_ctx, c->s, m->ready) : MGT_OK;
}

/* The gradient of the logits is in the last node's output slot when this is called; that of
   auxiliary logits is written when the walk reaches their layer. */
mgt_status nn_graph_backward(mgt_model *m, mgt_stream *s)
{
    mgt_status st = MGT_OK;
    for (int i = m->n_nodes - 1; i >= 0 && st == MGT_OK; i--) {
        const nn_node *nd = &m->nodes[i];
        const nn_kind_i *k = &nn_kinds[nd->kind];
        nn_call c = {.m = m, .s = s, .node = nd, .n = m->n, .train = true};
        call_values(&c, nd);
        call_params(&c, nd);
        c.dy = slot_ptr(m, nd->gout);
        if (nd->aux_out)
            st = nn_loss_backward(m, s, slot_ptr(m, nd->gout),
                                  nn_act(m, m->aux_probs_off[nd->aux_out - 1]), m->aux_weight);
        for (int j = 0; j < nd->n_in && st == MGT_OK; j++) {
            const nn_value *xv = &m->values[nd->in[j]];
            size_t bytes = (size_t)m->n * nn_value_bytes(xv);
            if (nd->unshare[j] >= 0)
                st = mgt_copy_d2d(s, slot_ptr(m, nd->gin[j]), slot_ptr(m, nd->unshare[j]), bytes);
            switch ((nn_gmode)nd->gmode[j]) {
            case NN_G_NONE:
            case NN_G_ALIAS: break;
            case NN_G_WRITE: c.dx[j] = slot_ptr(m, nd->gin[j]); break;
            case NN_G_ACCUM:
                c.dx[j] = slot_ptr(m, nd->gin[j]);
                c.dx_beta[j] = 1.0f;
                break;
            case NN_G_ACCUM_TMP: c.dx[j] = slot_ptr(m, nd->gtmp); break;
            }
        }
        if (st == MGT_OK && k->backward)
            st = k->backward(&c);
        for (int j = 0; j < nd->n_in && st == MGT_OK; j++) {
            const nn_value *xv = &m->values[nd->in[j]];
            size_t count = (size_t)m->n * nn_value_floats(xv);
            float *g = slot_ptr(m, nd->gin[j]);
            mgt_store gs = {xv->dtype, xv->dtype}; /* a gradient is stored as its value */
            if (nd->gmode[j] == NN_G_ACCUM_TMP)
                st = mgt_add_st(s, gs, g, g, slot_ptr(m, nd->gtmp), count);
            else if (nd->gmode[j] == NN_G_ACCUM && (k->flags & NN_F_PASSTHROUGH))
                st = mgt_add_st(s, gs, g, g, c.dy, count);
        }
    }
    return st;
}
