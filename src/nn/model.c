/* The ResNet family built by name on the device interface: layout of the arenas and the
   parameter table, torchvision's initialisation, and the forward / loss / backward of a step.
   Layers are the device kernels themselves; this file only decides which buffers they read and
   write, so it runs unchanged on every backend. */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mgt/rng.h"
#include "nn/model_impl.h"

#define BN_EPS 1e-5f
#define BN_MOMENTUM 0.1f

typedef struct arch_def {
    const char *name;
    bool bottleneck;
    bool cifar;
    int stages;
    int blocks[4];
} arch_def;

static const arch_def archs[] = {
    {"resnet18", false, false, 4, {2, 2, 2, 2}},  {"resnet34", false, false, 4, {3, 4, 6, 3}},
    {"resnet50", true, false, 4, {3, 4, 6, 3}},   {"resnet101", true, false, 4, {3, 4, 23, 3}},
    {"resnet152", true, false, 4, {3, 8, 36, 3}}, {"resnet20", false, true, 3, {3, 3, 3}},
    {"resnet32", false, true, 3, {5, 5, 5}},      {"resnet44", false, true, 3, {7, 7, 7}},
    {"resnet56", false, true, 3, {9, 9, 9}},      {"resnet110", false, true, 3, {18, 18, 18}},
};

#define N_ARCHS (sizeof archs / sizeof *archs)

const char *const *mgt_model_arch_names(void)
{
    static const char *const names[] = {"resnet18",  "resnet34",  "resnet50", "resnet101",
                                        "resnet152", "resnet20",  "resnet32", "resnet44",
                                        "resnet56",  "resnet110", NULL};
    static_assert(sizeof names / sizeof *names == N_ARCHS + 1, "names[] lists archs[]");
    return names;
}

mgt_status nn_need_device(const mgt_model *m, const char *what)
{
    if (!m)
        return mgt_error_set(MGT_ERR_INVALID, "%s: no model", what);
    if (!m->acts)
        return mgt_error_set(MGT_ERR_INVALID,
                             "%s: this %s was created without a device (it only describes "
                             "itself)",
                             what, m->arch);
    return MGT_OK;
}

/* ---- building ---- */

/* The builder: table, layer list and arena offsets grow while the architecture is walked in
   forward order. A failed allocation is sticky and checked once at the end. */
typedef struct builder {
    mgt_model *m;
    bool oom;
    size_t act_next;  /* bytes of the activation arena so far */
    size_t act_image; /* floats per image */
    size_t act_fixed; /* floats independent of the batch */
} builder;

static int add_entry(builder *b, const char *name, mgt_model_role role, int ndim,
                     const int64_t *shape)
{
    mgt_model *m = b->m;
    if (m->n_table == m->cap_table) {
        int cap = m->cap_table ? 2 * m->cap_table : 64;
        mgt_model_entry *t = realloc(m->table, (size_t)cap * sizeof *t);
        if (!t) {
            b->oom = true;
            return -1;
        }
        m->table = t;
        m->cap_table = cap;
    }
    mgt_model_entry *e = &m->table[m->n_table];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->role = role;
    e->ndim = ndim;
    e->numel = 1;
    for (int i = 0; i < ndim; i++) {
        e->shape[i] = shape[i];
        e->numel *= (size_t)shape[i];
    }
    if (role == MGT_MODEL_BUFFER) {
        e->offset = m->bufs_bytes;
        m->bufs_bytes += nn_align(e->numel * sizeof(float));
    } else if (role == MGT_MODEL_COUNTER) {
        e->offset = (size_t)m->n_bn++;
    } else {
        m->counts.params += e->numel;
    }
    if (role == MGT_MODEL_BUFFER)
        m->counts.buffer_floats += e->numel;
    return m->n_table++;
}

static void add_layer(builder *b, const char *name, const char *kind, int c, int h, int w,
                      size_t params, uint64_t macs)
{
    mgt_model *m = b->m;
    if (m->n_layers == m->cap_layers) {
        int cap = m->cap_layers ? 2 * m->cap_layers : 64;
        mgt_model_layer *l = realloc(m->layers, (size_t)cap * sizeof *l);
        if (!l) {
            b->oom = true;
            return;
        }
        m->layers = l;
        m->cap_layers = cap;
    }
    mgt_model_layer *l = &m->layers[m->n_layers++];
    snprintf(l->name, sizeof l->name, "%s", name);
    l->kind = kind;
    l->c = c;
    l->h = h;
    l->w = w;
    l->params = params;
    l->macs = macs;
    m->counts.macs += macs;
    if (strcmp(kind, "conv") == 0 || strcmp(kind, "linear") == 0)
        m->counts.macs_conv_fc += macs;
}

/* A tensor of `floats` per image, batch images. */
static size_t act_image(builder *b, size_t floats)
{
    size_t off = b->act_next;
    b->act_next += nn_align((size_t)b->m->cfg.batch * floats * sizeof(float));
    b->act_image += floats;
    return off;
}

static size_t act_fixed(builder *b, size_t floats)
{
    size_t off = b->act_next;
    b->act_next += nn_align(floats * sizeof(float));
    b->act_fixed += floats;
    return off;
}

static void note_act(mgt_model *m, size_t floats)
{
    if (floats > m->max_act)
        m->max_act = floats;
}

/* conv `conv_name` (k filters r x r, stride, pad) + BN `bn_name` (+ ReLU) on c x h x h. */
static void build_cbn(builder *b, nn_cbn *u, const char *conv_name, const char *bn_name,
                      const char *relu_name, int c, int h, int k, int r, int stride, int pad,
                      bool relu)
{
    mgt_model *m = b->m;
    char name[64];
    u->conv = (mgt_conv2d_shape){.n = m->cfg.batch,
                                 .c = c,
                                 .h = h,
                                 .w = h,
                                 .k = k,
                                 .r = r,
                                 .s = r,
                                 .stride_h = stride,
                                 .stride_w = stride,
                                 .pad_h = pad,
                                 .pad_w = pad,
                                 .groups = 1};
    u->p = mgt_conv2d_out_h(&u->conv);
    u->q = mgt_conv2d_out_w(&u->conv);
    u->relu = relu;
    size_t out = (size_t)k * (size_t)u->p * (size_t)u->q;

    int64_t wshape[4] = {k, c, r, r}, cshape[1] = {k};
    snprintf(name, sizeof name, "%s.weight", conv_name);
    u->w_entry = add_entry(b, name, MGT_MODEL_PARAM, 4, wshape);
    add_layer(b, conv_name, "conv", k, u->p, u->q, (size_t)k * c * r * r,
              (uint64_t)out * (uint64_t)c * (uint64_t)r * (uint64_t)r);

    snprintf(name, sizeof name, "%s.weight", bn_name);
    u->bn_entry = add_entry(b, name, MGT_MODEL_PARAM, 1, cshape);
    snprintf(name, sizeof name, "%s.bias", bn_name);
    add_entry(b, name, MGT_MODEL_PARAM, 1, cshape);
    snprintf(name, sizeof name, "%s.running_mean", bn_name);
    add_entry(b, name, MGT_MODEL_BUFFER, 1, cshape);
    snprintf(name, sizeof name, "%s.running_var", bn_name);
    add_entry(b, name, MGT_MODEL_BUFFER, 1, cshape);
    snprintf(name, sizeof name, "%s.num_batches_tracked", bn_name);
    u->counter = m->n_bn;
    add_entry(b, name, MGT_MODEL_COUNTER, 0, NULL);
    add_layer(b, bn_name, "bn", k, u->p, u->q, 2 * (size_t)k, 2 * (uint64_t)out);
    if (relu)
        add_layer(b, relu_name, "relu", k, u->p, u->q, 0, 0);

    u->c_off = act_image(b, out);
    u->y_off = act_image(b, out);
    u->mean_off = act_fixed(b, (size_t)k);
    u->invstd_off = act_fixed(b, (size_t)k);
    note_act(m, out);
    int hw = u->p * u->q;
    if (m->min_bn_hw == 0 || hw < m->min_bn_hw)
        m->min_bn_hw = hw;
    if (k > m->max_bn_c)
        m->max_bn_c = k;
}

/* One residual block on c x h x h input; returns its output channels and side. */
static void build_block(builder *b, nn_block *blk, const char *prefix, bool bottleneck, int c,
                        int h, int planes, int stride, size_t in_off, int *c_out, int *h_out)
{
    char cn[48], bn[48], rn[48];
    int out_c = bottleneck ? planes * 4 : planes;
    blk->in_off = in_off;
    snprintf(rn, sizeof rn, "%s.relu", prefix);
    if (bottleneck) {
        blk->units = 3;
        snprintf(cn, sizeof cn, "%s.conv1", prefix);
        snprintf(bn, sizeof bn, "%s.bn1", prefix);
        build_cbn(b, &blk->u[0], cn, bn, rn, c, h, planes, 1, 1, 0, true);
        snprintf(cn, sizeof cn, "%s.conv2", prefix);
        snprintf(bn, sizeof bn, "%s.bn2", prefix);
        build_cbn(b, &blk->u[1], cn, bn, rn, planes, h, planes, 3, stride, 1, true);
        snprintf(cn, sizeof cn, "%s.conv3", prefix);
        snprintf(bn, sizeof bn, "%s.bn3", prefix);
        build_cbn(b, &blk->u[2], cn, bn, rn, planes, blk->u[1].p, out_c, 1, 1, 0, false);
    } else {
        blk->units = 2;
        snprintf(cn, sizeof cn, "%s.conv1", prefix);
        snprintf(bn, sizeof bn, "%s.bn1", prefix);
        build_cbn(b, &blk->u[0], cn, bn, rn, c, h, planes, 3, stride, 1, true);
        snprintf(cn, sizeof cn, "%s.conv2", prefix);
        snprintf(bn, sizeof bn, "%s.bn2", prefix);
        build_cbn(b, &blk->u[1], cn, bn, rn, planes, blk->u[0].p, planes, 3, 1, 1, false);
    }
    blk->has_ds = stride != 1 || c != out_c;
    if (blk->has_ds) {
        snprintf(cn, sizeof cn, "%s.downsample.0", prefix);
        snprintf(bn, sizeof bn, "%s.downsample.1", prefix);
        build_cbn(b, &blk->ds, cn, bn, NULL, c, h, out_c, 1, stride, 0, false);
    }
    const nn_cbn *last = &blk->u[blk->units - 1];
    add_layer(b, prefix, "add+relu", out_c, last->p, last->q, 0, 0);
    *c_out = out_c;
    *h_out = last->p;
}

/* Parameter offsets in the order backward completes them (see mgt/nn.h). */
static void place(mgt_model *m, int e)
{
    m->table[e].offset = m->params_bytes;
    m->params_bytes += nn_align(m->table[e].numel * sizeof(float));
}

static void place_cbn(mgt_model *m, const nn_cbn *u)
{
    place(m, u->bn_entry);
    place(m, u->bn_entry + 1);
    place(m, u->w_entry);
}

static void place_params(mgt_model *m)
{
    place(m, m->fcw_entry);
    place(m, m->fcw_entry + 1);
    for (int i = m->n_blocks - 1; i >= 0; i--) {
        const nn_block *blk = &m->blocks[i];
        if (blk->has_ds)
            place_cbn(m, &blk->ds);
        for (int j = blk->units - 1; j >= 0; j--)
            place_cbn(m, &blk->u[j]);
    }
    place_cbn(m, &m->stem);
}

static mgt_status build(mgt_model *m, const arch_def *a)
{
    builder b = {.m = m};
    const mgt_model_config *cfg = &m->cfg;
    int c = cfg->in_channels, h = cfg->image_size;

    if (a->cifar)
        build_cbn(&b, &m->stem, "conv1", "bn1", "relu", c, h, 16, 3, 1, 1, true);
    else
        build_cbn(&b, &m->stem, "conv1", "bn1", "relu", c, h, 64, 7, 2, 3, true);
    c = m->stem.conv.k;
    h = m->stem.p;
    size_t cur = m->stem.y_off;
    if (!a->cifar) {
        m->has_maxpool = true;
        m->mp = (mgt_pool2d_shape){.n = cfg->batch,
                                   .c = c,
                                   .h = h,
                                   .w = h,
                                   .kh = 3,
                                   .kw = 3,
                                   .stride_h = 2,
                                   .stride_w = 2,
                                   .pad_h = 1,
                                   .pad_w = 1};
        h = mgt_pool2d_out_h(&m->mp);
        m->mp_off = act_image(&b, (size_t)c * h * h);
        note_act(m, (size_t)c * h * h);
        add_layer(&b, "maxpool", "maxpool", c, h, h, 0, 0);
        cur = m->mp_off;
    }

    int total = 0;
    for (int s = 0; s < a->stages; s++)
        total += a->blocks[s];
    m->blocks = calloc((size_t)total, sizeof *m->blocks);
    if (!m->blocks)
        return mgt_error_set(MGT_ERR_OOM, "%s: out of host memory", a->name);
    m->n_blocks = total;
    int bi = 0;
    for (int s = 0; s < a->stages; s++) {
        int planes = (a->cifar ? 16 : 64) << s;
        for (int j = 0; j < a->blocks[s]; j++) {
            char prefix[32];
            snprintf(prefix, sizeof prefix, "layer%d.%d", s + 1, j);
            nn_block *blk = &m->blocks[bi++];
            build_block(&b, blk, prefix, a->bottleneck, c, h, planes, j == 0 && s > 0 ? 2 : 1, cur,
                        &c, &h);
            cur = blk->u[blk->units - 1].y_off;
        }
    }
    m->feat_c = c;
    m->feat_hw = h * h;
    m->pool_off = act_image(&b, (size_t)c);
    add_layer(&b, "avgpool", "avgpool", c, 1, 1, 0, (uint64_t)c * ((uint64_t)h * h + 1));

    int64_t wshape[2] = {cfg->classes, c}, bshape[1] = {cfg->classes};
    m->fcw_entry = add_entry(&b, "fc.weight", MGT_MODEL_PARAM, 2, wshape);
    add_entry(&b, "fc.bias", MGT_MODEL_PARAM, 1, bshape);
    add_layer(&b, "fc", "linear", cfg->classes, 1, 1, (size_t)cfg->classes * (c + 1),
              (uint64_t)cfg->classes * (uint64_t)c);
    m->logits_off = act_image(&b, (size_t)cfg->classes);
    m->probs_off = act_image(&b, (size_t)cfg->classes);
    m->dlogits_off = act_image(&b, (size_t)cfg->classes);
    m->dpool_off = act_image(&b, (size_t)c);
    m->loss_off = act_fixed(&b, 1);
    for (int i = 0; i < 3; i++)
        m->scratch_off[i] = act_image(&b, m->max_act);
    if (cfg->freeze_bn) {
        m->ones_off = act_fixed(&b, (size_t)m->max_bn_c);
        m->zeros_off = act_fixed(&b, (size_t)m->max_bn_c);
    }
    if (b.oom)
        return mgt_error_set(MGT_ERR_OOM, "%s: out of host memory", a->name);

    m->acts_bytes = b.act_next;
    m->counts.act_bytes_per_image = b.act_image * sizeof(float);
    m->counts.act_bytes_fixed = b.act_fixed * sizeof(float);
    place_params(m);
    m->bn_counts = calloc((size_t)m->n_bn, sizeof *m->bn_counts);
    if (!m->bn_counts)
        return mgt_error_set(MGT_ERR_OOM, "%s: out of host memory", a->name);
    return MGT_OK;
}

mgt_status mgt_model_create(const mgt_model_config *cfg, mgt_device *d, mgt_model **out)
{
    *out = NULL;
    if (!cfg || !cfg->arch)
        return mgt_error_set(MGT_ERR_INVALID, "no architecture given");
    const arch_def *a = NULL;
    for (size_t i = 0; i < N_ARCHS; i++)
        if (strcmp(cfg->arch, archs[i].name) == 0)
            a = &archs[i];
    if (!a)
        return mgt_error_set(MGT_ERR_INVALID,
                             "unknown architecture '%s' (resnet18, resnet34, resnet50, "
                             "resnet101, resnet152, resnet20, resnet32, resnet44, resnet56, "
                             "resnet110)",
                             cfg->arch);
    if (cfg->classes < 1 || cfg->classes > (1 << 24))
        return mgt_error_set(MGT_ERR_INVALID, "model %s: %d classes (expected 1 to %d)", cfg->arch,
                             cfg->classes, 1 << 24);
    if (cfg->in_channels < 1 || cfg->in_channels > 4)
        return mgt_error_set(MGT_ERR_INVALID, "model %s: %d input channels (expected 1 to 4)",
                             cfg->arch, cfg->in_channels);
    /* 8192 keeps every per-image tensor of the largest model under 2^31 elements. */
    if (cfg->image_size < 1 || cfg->image_size > 8192)
        return mgt_error_set(MGT_ERR_INVALID, "model %s: image size %d (expected 1 to 8192)",
                             cfg->arch, cfg->image_size);
    if (cfg->batch < 1 || cfg->batch > (1 << 20))
        return mgt_error_set(MGT_ERR_INVALID, "model %s: batch %d (expected 1 to %d)", cfg->arch,
                             cfg->batch, 1 << 20);

    mgt_model *m = calloc(1, sizeof *m);
    if (!m)
        return mgt_error_set(MGT_ERR_OOM, "model %s: out of host memory", cfg->arch);
    m->cfg = *cfg;
    snprintf(m->arch, sizeof m->arch, "%s", a->name);
    m->cfg.arch = m->arch;
    m->dev = d;
    mgt_status st = build(m, a);
    if (st == MGT_OK && d) {
        mgt_stream *s = NULL;
        st = mgt_buffer_alloc(d, m->params_bytes, &m->params_buf);
        if (st == MGT_OK)
            st = mgt_buffer_alloc(d, m->params_bytes, &m->grads_buf);
        if (st == MGT_OK)
            st = mgt_buffer_alloc(d, m->bufs_bytes, &m->bufs_buf);
        if (st == MGT_OK)
            st = mgt_buffer_alloc(d, m->acts_bytes, &m->acts_buf);
        if (st == MGT_OK) {
            m->params = mgt_buffer_ptr(m->params_buf);
            m->grads = mgt_buffer_ptr(m->grads_buf);
            m->bufs = mgt_buffer_ptr(m->bufs_buf);
            m->acts = mgt_buffer_ptr(m->acts_buf);
            st = mgt_stream_create(d, &s);
        }
        /* Zeroed so the padding between tensors is 0, not the device's garbage: the
           optimizer and the all-reduce run over whole arenas. */
        if (st == MGT_OK)
            st = mgt_memset(s, m->params, 0, m->params_bytes);
        if (st == MGT_OK)
            st = mgt_memset(s, m->grads, 0, m->params_bytes);
        if (st == MGT_OK)
            st = mgt_memset(s, m->bufs, 0, m->bufs_bytes);
        if (st == MGT_OK)
            st = mgt_stream_synchronize(s, NULL);
        mgt_stream_free(s);
        if (st != MGT_OK && st != MGT_ERR_OOM) {
            /* keep the cause, add which model it was */
            mgt_error_wrap(st, "model %s", m->arch);
        } else if (st == MGT_ERR_OOM) {
            char why[300];
            snprintf(why, sizeof why, "%s", mgt_error_last());
            mgt_error_set(st,
                          "model %s at batch %d needs %.1f MiB of device memory "
                          "(params, grads, buffers, activations %.1f MiB): %s",
                          m->arch, cfg->batch,
                          (2.0 * m->params_bytes + m->bufs_bytes + m->acts_bytes) / 1048576.0,
                          m->acts_bytes / 1048576.0, why);
        }
    }
    if (st != MGT_OK) {
        mgt_model_free(m);
        return st;
    }
    *out = m;
    return MGT_OK;
}

void mgt_model_free(mgt_model *m)
{
    if (!m)
        return;
    mgt_buffer_free(m->acts_buf);
    mgt_buffer_free(m->bufs_buf);
    mgt_buffer_free(m->grads_buf);
    mgt_buffer_free(m->params_buf);
    free(m->blocks);
    free(m->bn_counts);
    free(m->layers);
    free(m->table);
    free(m);
}

const mgt_model_config *mgt_model_get_config(const mgt_model *m) { return &m->cfg; }

/* ---- accessors ---- */

float *mgt_model_params(const mgt_model *m, size_t *bytes)
{
    if (bytes)
        *bytes = m->params ? m->params_bytes : 0;
    return (float *)m->params;
}

float *mgt_model_grads(const mgt_model *m, size_t *bytes)
{
    if (bytes)
        *bytes = m->grads ? m->params_bytes : 0;
    return (float *)m->grads;
}

float *mgt_model_buffers(const mgt_model *m, size_t *bytes)
{
    if (bytes)
        *bytes = m->bufs ? m->bufs_bytes : 0;
    return (float *)m->bufs;
}

size_t mgt_model_activation_bytes(const mgt_model *m) { return m->acts_bytes; }

int64_t *mgt_model_bn_counts(mgt_model *m, int *n)
{
    if (n)
        *n = m->n_bn;
    return m->bn_counts;
}

const mgt_model_entry *mgt_model_table(const mgt_model *m, int *n)
{
    if (n)
        *n = m->n_table;
    return m->table;
}

/* A layer's tensors share the name up to the last dot (conv1.weight, bn1.weight + bn1.bias):
   backward reports each layer once its last tensor's gradient is enqueued. */
static bool same_layer(const char *a, const char *b)
{
    const char *da = strrchr(a, '.'), *db = strrchr(b, '.');
    size_t la = da ? (size_t)(da - a) : strlen(a), lb = db ? (size_t)(db - b) : strlen(b);
    return la == lb && strncmp(a, b, la) == 0;
}

int mgt_model_layer_ends(const mgt_model *m, size_t *ends, int cap)
{
    /* Params are placed back to back in arena order (place_params): walk them by offset. */
    int n = 0;
    size_t at = 0;
    const mgt_model_entry *prev = NULL;
    while (at < m->params_bytes) {
        const mgt_model_entry *e = NULL;
        for (int i = 0; i < m->n_table && !e; i++)
            if (m->table[i].role == MGT_MODEL_PARAM && m->table[i].offset == at)
                e = &m->table[i];
        assert(e);
        if (prev && !same_layer(prev->name, e->name))
            n++;
        at += nn_align(e->numel * sizeof(float));
        if (n < cap)
            ends[n] = at;
        prev = e;
    }
    return prev ? n + 1 : 0;
}

const mgt_model_layer *mgt_model_layers(const mgt_model *m, int *n)
{
    if (n)
        *n = m->n_layers;
    return m->layers;
}

void mgt_model_get_counts(const mgt_model *m, mgt_model_counts *out) { *out = m->counts; }

const float *mgt_model_loss_ptr(const mgt_model *m)
{
    return m->acts ? nn_act(m, m->loss_off) : NULL;
}

/* ---- initialisation ---- */

/* Box-Muller on two 53-bit uniforms; 1 - u keeps the log finite. */
static double normal(mgt_rng *r)
{
    double u1 = mgt_rng_uniform_double(r), u2 = mgt_rng_uniform_double(r);
    return sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
}

mgt_status mgt_model_init(mgt_model *m, mgt_stream *s, uint64_t seed)
{
    mgt_status st = nn_need_device(m, "model init");
    if (st != MGT_OK)
        return st;
    /* Host staging the size of params + buffers; freed before returning, so this costs one
       copy of the model on the host once per run. */
    char *hp = calloc(1, m->params_bytes), *hb = calloc(1, m->bufs_bytes ? m->bufs_bytes : 1);
    if (!hp || !hb) {
        free(hp);
        free(hb);
        return mgt_error_set(MGT_ERR_OOM, "model init: out of host memory (%zu bytes)",
                             m->params_bytes + m->bufs_bytes);
    }
    double fc_bound = 1.0 / sqrt((double)m->feat_c);
    for (int e = 0; e < m->n_table; e++) {
        const mgt_model_entry *t = &m->table[e];
        mgt_rng r;
        mgt_rng_init(&r, seed, 0, (uint64_t)e, MGT_RNG_INIT);
        size_t len = strlen(t->name);
        bool is_weight = len > 7 && strcmp(t->name + len - 7, ".weight") == 0;
        if (t->role == MGT_MODEL_COUNTER) {
            m->bn_counts[t->offset] = 0;
        } else if (t->role == MGT_MODEL_BUFFER) {
            float v = strstr(t->name, "running_var") ? 1.0f : 0.0f;
            float *p = (float *)(hb + t->offset);
            for (size_t i = 0; i < t->numel; i++)
                p[i] = v;
        } else if (strncmp(t->name, "fc.", 3) == 0) {
            float *p = (float *)(hp + t->offset);
            for (size_t i = 0; i < t->numel; i++)
                p[i] = (float)((2.0 * mgt_rng_uniform_double(&r) - 1.0) * fc_bound);
        } else if (t->ndim == 4) {
            double std = sqrt(2.0 / (double)(t->shape[0] * t->shape[2] * t->shape[3]));
            float *p = (float *)(hp + t->offset);
            for (size_t i = 0; i < t->numel; i++)
                p[i] = (float)(std * normal(&r));
        } else {
            float *p = (float *)(hp + t->offset);
            for (size_t i = 0; i < t->numel; i++)
                p[i] = is_weight ? 1.0f : 0.0f;
        }
    }
    if (m->cfg.zero_init_residual)
        for (int i = 0; i < m->n_blocks; i++) {
            const mgt_model_entry *t = &m->table[m->blocks[i].u[m->blocks[i].units - 1].bn_entry];
            memset(hp + t->offset, 0, t->numel * sizeof(float));
        }
    st = mgt_copy_h2d(s, m->params, hp, m->params_bytes);
    if (st == MGT_OK && m->bufs_bytes)
        st = mgt_copy_h2d(s, m->bufs, hb, m->bufs_bytes);
    mgt_status st2 = mgt_stream_synchronize(s, NULL);
    if (st == MGT_OK)
        st = st2;
    free(hp);
    free(hb);
    return st;
}

/* ---- forward ---- */

/* The training forward of a frozen BN: the evaluation forward, plus the saved mean and invstd
   that backward's parameter gradients read, taken from the running statistics (nothing is
   counted, nothing moves). invstd comes out of batchnorm_forward_eval run on one value per
   channel: gamma 1 times (1 - mean 0) times 1/sqrt(var + eps), plus beta 0 -- the same
   expression, rounded the same way, as the scale the forward itself applies. */
static mgt_status frozen_bn_forward(mgt_model *m, mgt_stream *s, const nn_cbn *u, float *y,
                                    const float *x, const mgt_bn_shape *bsh)
{
    const float *ones = nn_act(m, m->ones_off), *zeros = nn_act(m, m->zeros_off);
    const float *rmean = nn_buf(m, u->bn_entry + 2), *rvar = nn_buf(m, u->bn_entry + 3);
    mgt_bn_shape one = *bsh;
    one.n = 1;
    one.hw = 1;
    mgt_status st = mgt_batchnorm_forward_eval(s, y, x, nn_param(m, u->bn_entry),
                                               nn_param(m, u->bn_entry + 1), rmean, rvar, bsh);
    if (st == MGT_OK)
        st = mgt_copy_d2d(s, nn_act(m, u->mean_off), rmean, (size_t)bsh->c * sizeof(float));
    if (st == MGT_OK)
        st = mgt_batchnorm_forward_eval(s, nn_act(m, u->invstd_off), ones, ones, zeros, zeros, rvar,
                                        &one);
    return st;
}

static mgt_status cbn_forward(mgt_model *m, mgt_stream *s, const nn_cbn *u, const float *x, int n,
                              bool train)
{
    mgt_conv2d_shape sh = u->conv;
    sh.n = n;
    mgt_bn_shape bsh = {
        .n = n, .c = sh.k, .hw = u->p * u->q, .eps = BN_EPS, .momentum = BN_MOMENTUM};
    float *c = nn_act(m, u->c_off), *y = nn_act(m, u->y_off);
    const float *gamma = nn_param(m, u->bn_entry), *beta = nn_param(m, u->bn_entry + 1);
    mgt_status st = mgt_conv2d_forward(s, c, x, nn_param(m, u->w_entry), &sh, 0.0f);
    if (st != MGT_OK)
        return st;
    if (train && m->cfg.freeze_bn) {
        st = frozen_bn_forward(m, s, u, y, c, &bsh);
    } else if (train) {
        st = mgt_batchnorm_forward_train(s, y, nn_act(m, u->mean_off), nn_act(m, u->invstd_off),
                                         nn_buf(m, u->bn_entry + 2), nn_buf(m, u->bn_entry + 3), c,
                                         gamma, beta, &bsh);
        m->bn_counts[u->counter]++;
    } else {
        st = mgt_batchnorm_forward_eval(s, y, c, gamma, beta, nn_buf(m, u->bn_entry + 2),
                                        nn_buf(m, u->bn_entry + 3), &bsh);
    }
    if (st == MGT_OK && u->relu)
        st = mgt_relu_forward(s, y, y, (size_t)n * sh.k * u->p * u->q);
    return st;
}

static mgt_status block_forward(mgt_model *m, mgt_stream *s, const nn_block *blk, int n, bool train)
{
    const float *in = nn_act(m, blk->in_off);
    const float *x = in;
    mgt_status st = MGT_OK;
    for (int i = 0; i < blk->units && st == MGT_OK; i++) {
        st = cbn_forward(m, s, &blk->u[i], x, n, train);
        x = nn_act(m, blk->u[i].y_off);
    }
    const float *identity = in;
    if (st == MGT_OK && blk->has_ds) {
        st = cbn_forward(m, s, &blk->ds, in, n, train);
        identity = nn_act(m, blk->ds.y_off);
    }
    const nn_cbn *last = &blk->u[blk->units - 1];
    float *out = nn_act(m, last->y_off);
    size_t count = (size_t)n * last->conv.k * last->p * last->q;
    if (st == MGT_OK)
        st = mgt_add(s, out, out, identity, count);
    if (st == MGT_OK)
        st = mgt_relu_forward(s, out, out, count);
    return st;
}

mgt_status mgt_model_forward(mgt_model *m, mgt_stream *s, const float *x, int batch, bool train,
                             const float **logits)
{
    mgt_status st = nn_need_device(m, "model forward");
    if (st != MGT_OK)
        return st;
    if (batch < 1 || batch > m->cfg.batch)
        return mgt_error_set(MGT_ERR_INVALID,
                             "model forward: batch %d (this %s was sized for 1 to %d)", batch,
                             m->arch, m->cfg.batch);
    if (!x)
        return mgt_error_set(MGT_ERR_INVALID, "model forward: no input");
    /* PyTorch refuses this too ("Expected more than 1 value per channel when training"):
       the batch variance of one value is 0 and the BN output would be its bias alone.
       A frozen BN takes no batch statistics, so any batch will do. */
    if (train && !m->cfg.freeze_bn && batch * m->min_bn_hw < 2)
        return mgt_error_set(MGT_ERR_INVALID,
                             "model forward: a training batch of 1 image leaves a batch norm of "
                             "this %s at 1x1 with one value per channel; use a larger batch "
                             "(or drop the last partial batch)",
                             m->arch);
    m->n = batch;
    m->x = x;
    m->trained = false;
    m->have_loss = false;
    int n = batch;
    /* Set here rather than once at creation, so nothing that ever writes the activation
       arena can leave them stale; two tiny fills per step. */
    if (train && m->cfg.freeze_bn) {
        st = mgt_fill(s, nn_act(m, m->ones_off), 1.0f, (size_t)m->max_bn_c);
        if (st == MGT_OK)
            st = mgt_memset(s, nn_act(m, m->zeros_off), 0, (size_t)m->max_bn_c * sizeof(float));
        if (st != MGT_OK)
            return st;
    }
    st = cbn_forward(m, s, &m->stem, x, n, train);
    if (st == MGT_OK && m->has_maxpool) {
        mgt_pool2d_shape mp = m->mp;
        mp.n = n;
        st = mgt_maxpool2d_forward(s, nn_act(m, m->mp_off), nn_act(m, m->stem.y_off), &mp);
    }
    for (int i = 0; i < m->n_blocks && st == MGT_OK; i++)
        st = block_forward(m, s, &m->blocks[i], n, train);
    const nn_block *lastb = &m->blocks[m->n_blocks - 1];
    const float *feat = nn_act(m, lastb->u[lastb->units - 1].y_off);
    float *pooled = nn_act(m, m->pool_off), *out = nn_act(m, m->logits_off);
    int k = m->cfg.classes, c = m->feat_c;
    if (st == MGT_OK)
        st = mgt_avgpool_forward(s, pooled, feat, n, c, m->feat_hw);
    /* logits [n,k] = pooled [n,c] . fc.weight [k,c]^T + fc.bias */
    if (st == MGT_OK)
        st = mgt_gemm(s, false, true, n, k, c, 1.0f, pooled, c, nn_param(m, m->fcw_entry), c, 0.0f,
                      out, k);
    if (st == MGT_OK)
        st = mgt_bias_forward(s, out, nn_param(m, m->fcw_entry + 1), n, k);
    if (st != MGT_OK)
        return st;
    m->trained = train;
    if (logits)
        *logits = out;
    return MGT_OK;
}

mgt_status mgt_model_loss(mgt_model *m, mgt_stream *s, const int32_t *labels, float smoothing,
                          int32_t *correct)
{
    mgt_status st = nn_need_device(m, "model loss");
    if (st != MGT_OK)
        return st;
    if (m->n == 0)
        return mgt_error_set(MGT_ERR_INVALID, "model loss: no forward has run");
    if (!labels)
        return mgt_error_set(MGT_ERR_INVALID, "model loss: no labels");
    if (!(smoothing >= 0.0f && smoothing <= 1.0f))
        return mgt_error_set(MGT_ERR_INVALID, "model loss: label smoothing %g not in [0, 1]",
                             (double)smoothing);
    int n = m->n, k = m->cfg.classes;
    const float *logits = nn_act(m, m->logits_off);
    st = mgt_softmax_xent_forward(s, nn_act(m, m->loss_off), nn_act(m, m->probs_off), logits,
                                  labels, n, k, smoothing);
    if (st == MGT_OK && correct)
        st = mgt_topk_correct(s, correct, logits, labels, n, k, 1);
    if (st == MGT_OK && correct)
        st = mgt_topk_correct(s, correct + 1, logits, labels, n, k, k < 5 ? k : 5);
    if (st != MGT_OK)
        return st;
    m->labels = labels;
    m->smoothing = smoothing;
    m->have_loss = true;
    return MGT_OK;
}

/* ---- backward ---- */

/* Marks the table entries [e, e + count) complete; they must be the next ones in the grad
   arena (place_params and the backward below walk the same order). */
static mgt_status grads_ready(mgt_model *m, mgt_stream *s, int e, int count, mgt_grad_ready_fn hook,
                              void *ctx)
{
    for (int i = e; i < e + count; i++) {
        assert(m->table[i].role == MGT_MODEL_PARAM && m->table[i].offset == m->ready);
        m->ready += nn_align(m->table[i].numel * sizeof(float));
    }
    return hook ? hook(ctx, s, m->ready) : MGT_OK;
}

/* Backward of conv + BN given dy, the gradient of the BN output (any ReLU already applied):
   BN backward into tmp, the conv's filter gradient from x, and when dx is not NULL the input
   gradient dx = conv_T(tmp) + dx_beta * dx. dx may be dy's buffer: BN backward has consumed
   dy before the conv writes dx. tmp is never dy's buffer (the callers pass distinct scratch).
   A frozen BN (see frozen_bn_forward) still goes through batchnorm_backward, which with the
   running statistics as the saved ones gives exactly its dgamma = sum dy*xhat and dbeta =
   sum dy; the batch-statistics dx it writes to tmp is then replaced by the frozen one,
   gamma * invstd * dy, which is batchnorm_forward_eval of dy with mean 0 and beta 0. */
static mgt_status cbn_backward(mgt_model *m, mgt_stream *s, const nn_cbn *u, const float *x,
                               const float *dy, float *tmp, float *dx, float dx_beta,
                               mgt_grad_ready_fn hook, void *ctx)
{
    mgt_conv2d_shape sh = u->conv;
    sh.n = m->n;
    mgt_bn_shape bsh = {
        .n = m->n, .c = sh.k, .hw = u->p * u->q, .eps = BN_EPS, .momentum = BN_MOMENTUM};
    const float *gamma = nn_param(m, u->bn_entry);
    mgt_status st = mgt_batchnorm_backward(
        s, tmp, nn_grad(m, u->bn_entry), nn_grad(m, u->bn_entry + 1), dy, nn_act(m, u->c_off),
        gamma, nn_act(m, u->mean_off), nn_act(m, u->invstd_off), &bsh);
    if (st == MGT_OK && m->cfg.freeze_bn) {
        const float *zeros = nn_act(m, m->zeros_off);
        st = mgt_batchnorm_forward_eval(s, tmp, dy, gamma, zeros, zeros, nn_buf(m, u->bn_entry + 3),
                                        &bsh);
    }
    if (st == MGT_OK)
        st = grads_ready(m, s, u->bn_entry, 2, hook, ctx);
    if (st == MGT_OK)
        st = mgt_conv2d_backward_filter(s, nn_grad(m, u->w_entry), tmp, x, &sh, 1.0f);
    if (st == MGT_OK)
        st = grads_ready(m, s, u->w_entry, 1, hook, ctx);
    if (st == MGT_OK && dx)
        st = mgt_conv2d_backward_data(s, dx, tmp, nn_param(m, u->w_entry), &sh, dx_beta);
    return st;
}

/* Backward of one block whose output gradient is in scratch[*cur]; leaves the input gradient
   in scratch[*cur] (possibly another buffer). Three scratch tensors suffice:
   S holds d(out), then d(sum) after the final ReLU, which is also d(identity);
   Q takes each BN backward's output; D receives the block's input gradient.
   Without downsample D = S (d(identity) is already there: conv1's backward-data adds onto it
   with beta 1) and the main path's inner gradients go to the third buffer. With downsample,
   D gets the projection's input gradient first (beta 0) and the main path reuses S once its
   last BN has read it. */
static mgt_status block_backward(mgt_model *m, mgt_stream *s, const nn_block *blk, int *cur,
                                 mgt_grad_ready_fn hook, void *ctx)
{
    int S = *cur, o1 = (S + 1) % 3, o2 = (S + 2) % 3;
    float *g[3] = {nn_act(m, m->scratch_off[0]), nn_act(m, m->scratch_off[1]),
                   nn_act(m, m->scratch_off[2])};
    const nn_cbn *last = &blk->u[blk->units - 1];
    const float *in = nn_act(m, blk->in_off);
    size_t out_count = (size_t)m->n * last->conv.k * last->p * last->q;
    mgt_status st = mgt_relu_backward(s, g[S], g[S], nn_act(m, last->y_off), out_count);
    int D, Q = o1, Y;
    if (blk->has_ds) {
        D = o2;
        Y = S;
        if (st == MGT_OK)
            st = cbn_backward(m, s, &blk->ds, in, g[S], g[Q], g[D], 0.0f, hook, ctx);
    } else {
        D = S;
        Y = o2;
    }
    int from = S;
    for (int i = blk->units - 1; i >= 1 && st == MGT_OK; i--) {
        const nn_cbn *prev = &blk->u[i - 1];
        st = cbn_backward(m, s, &blk->u[i], nn_act(m, prev->y_off), g[from], g[Q], g[Y], 0.0f, hook,
                          ctx);
        if (st == MGT_OK)
            st = mgt_relu_backward(s, g[Y], g[Y], nn_act(m, prev->y_off),
                                   (size_t)m->n * prev->conv.k * prev->p * prev->q);
        from = Y;
    }
    if (st == MGT_OK)
        st = cbn_backward(m, s, &blk->u[0], in, g[from], g[Q], g[D], 1.0f, hook, ctx);
    *cur = D;
    return st;
}

mgt_status mgt_model_backward(mgt_model *m, mgt_stream *s, mgt_grad_ready_fn hook, void *ctx)
{
    mgt_status st = nn_need_device(m, "model backward");
    if (st != MGT_OK)
        return st;
    if (!m->trained)
        return mgt_error_set(MGT_ERR_INVALID,
                             "model backward: the last forward was not a training one");
    if (!m->have_loss)
        return mgt_error_set(MGT_ERR_INVALID, "model backward: no loss after the last forward");
    int n = m->n, k = m->cfg.classes, c = m->feat_c;
    float *dlogits = nn_act(m, m->dlogits_off), *dpool = nn_act(m, m->dpool_off);
    float *g[3] = {nn_act(m, m->scratch_off[0]), nn_act(m, m->scratch_off[1]),
                   nn_act(m, m->scratch_off[2])};
    m->ready = 0;
    /* A second backward without a forward would read the scratch this one overwrites. */
    m->have_loss = false;

    st = mgt_softmax_xent_backward(s, dlogits, nn_act(m, m->probs_off), m->labels, n, k,
                                   m->smoothing, 1.0f / (float)n);
    /* fc: dW [k,c] += dlogits^T [k,n] . pooled [n,c]; db += column sums; dpooled = dlogits . W */
    if (st == MGT_OK)
        st = mgt_gemm(s, true, false, k, c, n, 1.0f, dlogits, k, nn_act(m, m->pool_off), c, 1.0f,
                      nn_grad(m, m->fcw_entry), c);
    if (st == MGT_OK)
        st = mgt_bias_backward(s, nn_grad(m, m->fcw_entry + 1), dlogits, n, k);
    if (st == MGT_OK)
        st = grads_ready(m, s, m->fcw_entry, 2, hook, ctx);
    if (st == MGT_OK)
        st = mgt_gemm(s, false, false, n, c, k, 1.0f, dlogits, k, nn_param(m, m->fcw_entry), c,
                      0.0f, dpool, c);
    int cur = 0;
    if (st == MGT_OK)
        st = mgt_avgpool_backward(s, g[cur], dpool, n, c, m->feat_hw);
    for (int i = m->n_blocks - 1; i >= 0 && st == MGT_OK; i--)
        st = block_backward(m, s, &m->blocks[i], &cur, hook, ctx);

    const nn_cbn *u = &m->stem;
    size_t count = (size_t)n * u->conv.k * u->p * u->q;
    int a = (cur + 1) % 3, b = (cur + 2) % 3;
    float *dy = g[cur], *tmp = g[a];
    if (m->has_maxpool) {
        mgt_pool2d_shape mp = m->mp;
        mp.n = n;
        if (st == MGT_OK)
            st = mgt_maxpool2d_backward(s, g[a], g[cur], nn_act(m, u->y_off), nn_act(m, m->mp_off),
                                        &mp);
        dy = g[a];
        tmp = g[b];
    }
    if (st == MGT_OK)
        st = mgt_relu_backward(s, dy, dy, nn_act(m, u->y_off), count);
    /* conv1's input gradient is nobody's business: skipped */
    if (st == MGT_OK)
        st = cbn_backward(m, s, u, m->x, dy, tmp, NULL, 0.0f, hook, ctx);
    if (st == MGT_OK)
        assert(m->ready == m->params_bytes);
    return st;
}

mgt_status mgt_model_zero_grad(mgt_model *m, mgt_stream *s)
{
    mgt_status st = nn_need_device(m, "model zero_grad");
    if (st != MGT_OK)
        return st;
    return mgt_memset(s, m->grads, 0, m->params_bytes);
}
