/* Models built by name on the device interface: the architecture registry, creation and the
   arenas, torchvision's initialisation, and the forward / loss / backward of a step, which
   walk the layer graph (graph.c) a family's constructor built. Layers are the device kernels
   themselves, so this runs unchanged on every backend. */
#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mgt/rng.h"
#include "nn/model_impl.h"

/* Every family's architectures, in the order `mgtrain model` lists them. */
static const nn_arch *const families[] = {
    nn_resnet_archs,    nn_vgg_archs,        nn_alexnet_archs,  nn_squeezenet_archs,
    nn_mobile_archs,    nn_shufflenet_archs, nn_densenet_archs, nn_convnext_archs,
    nn_inception_archs, nn_vit_archs,        nn_swin_archs,     nn_maxvit_archs};

#define N_FAMILIES (sizeof families / sizeof *families)

static const nn_arch *find_arch(const char *name)
{
    for (size_t f = 0; f < N_FAMILIES; f++)
        for (const nn_arch *a = families[f]; a->name; a++)
            if (strcmp(a->name, name) == 0)
                return a;
    return NULL;
}

#define MAX_ARCHS 128

static const char *arch_names[MAX_ARCHS + 1];

static void fill_names(void)
{
    int n = 0;
    for (size_t f = 0; f < N_FAMILIES; f++)
        for (const nn_arch *a = families[f]; a->name; a++) {
            MGT_ASSERT(n < MAX_ARCHS);
            arch_names[n++] = a->name;
        }
    arch_names[n] = NULL;
}

const char *const *mgt_model_arch_names(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fill_names);
    return arch_names;
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

mgt_status mgt_model_create(const mgt_model_config *cfg, mgt_device *d, mgt_model **out)
{
    *out = NULL;
    if (!cfg || !cfg->arch)
        return mgt_error_set(MGT_ERR_INVALID, "no architecture given");
    const nn_arch *a = find_arch(cfg->arch);
    if (!a) { /* the list is longer than an error's text: the command that lists them */
        int known = 0;
        for (const char *const *n = mgt_model_arch_names(); *n; n++)
            known++;
        return mgt_error_set(MGT_ERR_INVALID,
                             "unknown architecture '%s' (`mgtrain model` lists the %d known)",
                             cfg->arch, known);
    }
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
    if (cfg->amp != MGT_PREC_F32 && cfg->amp != MGT_PREC_BF16 && cfg->amp != MGT_PREC_FP16)
        return mgt_error_set(MGT_ERR_INVALID, "model %s: unknown mixed precision %d", cfg->arch,
                             (int)cfg->amp);
    if (cfg->batch < 1 || cfg->batch > (1 << 20))
        return mgt_error_set(MGT_ERR_INVALID, "model %s: batch %d (expected 1 to %d)", cfg->arch,
                             cfg->batch, 1 << 20);

    const mgt_arch_info *info = mgt_arch_find(a->name);
    if (cfg->transform_input && !(info && info->transform_input))
        return mgt_error_set(MGT_ERR_INVALID,
                             "model %s: transform_input is Inception v3's and GoogLeNet's; "
                             "this architecture has none",
                             cfg->arch);
    if (cfg->transform_input && cfg->in_channels != 3)
        return mgt_error_set(MGT_ERR_INVALID,
                             "model %s: transform_input maps 3 ImageNet-normalised channels; "
                             "the input has %d",
                             cfg->arch, cfg->in_channels);

    mgt_model *m = calloc(1, sizeof *m);
    if (!m)
        return mgt_error_set(MGT_ERR_OOM, "model %s: out of host memory", cfg->arch);
    m->cfg = *cfg;
    m->loss_scale = 1.0f;
    m->aux_weight = info ? info->aux_weight : 0.0f;
    snprintf(m->arch, sizeof m->arch, "%s", a->name);
    m->cfg.arch = m->arch;
    m->head = a->head;
    m->dev = d;
    mgt_status st = a->build(m, a->arg);
    if (st == MGT_OK)
        st = nn_plan(m);
    if (st == MGT_OK && d) {
        mgt_stream *s = NULL;
        st = mgt_buffer_alloc(d, m->params_bytes, &m->params_buf);
        if (st == MGT_OK && !cfg->inference)
            st = mgt_buffer_alloc(d, m->params_bytes, &m->grads_buf);
        /* a model without batch norm has no buffers; the arena still exists */
        if (st == MGT_OK)
            st = mgt_buffer_alloc(d, m->bufs_bytes ? m->bufs_bytes : NN_ALIGN, &m->bufs_buf);
        if (st == MGT_OK)
            st = mgt_buffer_alloc(d, m->acts_bytes, &m->acts_buf);
        if (st == MGT_OK) {
            m->params = mgt_buffer_ptr(m->params_buf);
            m->grads = m->grads_buf ? mgt_buffer_ptr(m->grads_buf) : NULL;
            m->bufs = mgt_buffer_ptr(m->bufs_buf);
            m->acts = mgt_buffer_ptr(m->acts_buf);
            st = mgt_stream_create(d, &s);
        }
        /* Zeroed so the padding between tensors is 0, not the device's garbage: the
           optimizer and the all-reduce run over whole arenas. */
        if (st == MGT_OK)
            st = mgt_memset(s, m->params, 0, m->params_bytes);
        if (st == MGT_OK && m->grads)
            st = mgt_memset(s, m->grads, 0, m->params_bytes);
        if (st == MGT_OK && m->bufs_bytes)
            st = mgt_memset(s, m->bufs, 0, m->bufs_bytes);
        if (st == MGT_OK)
            st = nn_consts_upload(m, s);
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
    free(m->nodes);
    free(m->values);
    free(m->slot_bytes);
    free(m->slot_off);
    free(m->bn_hf);
    free(m->bn_mine);
    free(m->bn_all);
    free(m->bn_sync_count);
    free(m->layer_ends);
    free(m->bn_counts);
    free(m->layers);
    free(m->init);
    free(m->table);
    for (int i = 0; i < m->n_consts; i++)
        free(m->consts[i].data);
    free(m->consts);
    free(m->index_vals);
    free(m);
}

const mgt_model_config *mgt_model_get_config(const mgt_model *m) { return &m->cfg; }

const char *mgt_model_head(const mgt_model *m) { return m->head; }

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

const int64_t *mgt_model_index_values(const mgt_model *m, const mgt_model_entry *e)
{
    MGT_ASSERT(e->role == MGT_MODEL_INDEX && e->offset + e->numel <= m->n_index_vals);
    return m->index_vals + e->offset;
}

const mgt_model_entry *mgt_model_table(const mgt_model *m, int *n)
{
    if (n)
        *n = m->n_table;
    return m->table;
}

/* The graph's plan has them: one per node with parameters, in backward's order. */
int mgt_model_layer_ends(const mgt_model *m, size_t *ends, int cap)
{
    for (int i = 0; i < m->n_layer_ends && i < cap; i++)
        ends[i] = m->layer_ends[i];
    return m->n_layer_ends;
}

const mgt_model_layer *mgt_model_layers(const mgt_model *m, int *n)
{
    if (n)
        *n = m->n_nodes;
    return m->layers;
}

void mgt_model_get_counts(const mgt_model *m, mgt_model_counts *out) { *out = m->counts; }

const float *mgt_model_loss_ptr(const mgt_model *m)
{
    return m->acts ? nn_act(m, m->loss_off) : NULL;
}

int mgt_model_aux_count(const mgt_model *m) { return m->n_aux; }

const float *mgt_model_aux_loss_ptr(const mgt_model *m)
{
    return m->acts && m->n_aux ? nn_act(m, m->aux_loss_off) : NULL;
}

void mgt_model_set_aux_weight(mgt_model *m, float weight) { m->aux_weight = weight; }

float mgt_model_aux_weight(const mgt_model *m) { return m->aux_weight; }

/* ---- initialisation ---- */

/* Elements of a tensor drawn per run of stream blocks (INIT_RUN blocks at a time). */
#define INIT_RUN 512

/* Elements [lo, hi) of a tensor drawn from r's stream, into p[0, hi - lo): uniform in [-a, a)
   on one 53-bit uniform of two words each (two elements a block), or normal with standard
   deviation a by Box-Muller on two such uniforms (one element a block; 1 - u keeps the log
   finite). Element i takes the words mgt_rng_uniform_double would take for it drawing the
   tensor from its start; the blocks are drawn in runs (mgt_rng_blocks). */
static void init_random(const mgt_rng *r, bool normal, double a, size_t lo, size_t hi, float *p)
{
    uint32_t w[4 * INIT_RUN];
    const size_t per = normal ? 1 : 2; /* elements a block */
    for (size_t at = lo; at < hi;) {
        size_t block = at / per, blocks = (hi - 1) / per - block + 1;
        if (blocks > INIT_RUN)
            blocks = INIT_RUN;
        mgt_rng_blocks(r, (uint32_t)block, blocks, w);
        size_t end = (block + blocks) * per < hi ? (block + blocks) * per : hi;
        for (; at < end; at++) {
            const uint32_t *b = w + 4 * (at / per - block) + (normal ? 0 : 2 * (at % 2));
            double u1 = mgt_rng_double_of(b[0], b[1]);
            if (normal) {
                double u2 = mgt_rng_double_of(b[2], b[3]);
                p[at - lo] = (float)(a * (sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2)));
            } else {
                p[at - lo] = (float)((2.0 * u1 - 1.0) * a);
            }
        }
    }
}

/* Elements [lo, hi) of table entry e (a parameter or a buffer) at their initial values, into
   p[0, hi - lo). */
static void init_entry(const mgt_model *m, int e, uint64_t seed, size_t lo, size_t hi, float *p)
{
    const mgt_model_entry *t = &m->table[e];
    const nn_entry_init *in = &m->init[e];
    if (t->role == MGT_MODEL_BUFFER && in->kind == NN_INIT_VALUES) {
        const nn_constant *k = &m->consts[(int)in->arg];
        MGT_ASSERT(k->bytes == t->numel * sizeof(float));
        memcpy(p, (const float *)k->data + lo, (hi - lo) * sizeof *p);
    } else if (t->role == MGT_MODEL_BUFFER) {
        float v = t->what == MGT_TENSOR_RUNNING_VAR ? 1.0f : 0.0f;
        for (size_t i = lo; i < hi; i++)
            p[i - lo] = v;
    } else if (in->kind == NN_INIT_UNIFORM || in->kind == NN_INIT_NORMAL) {
        mgt_rng r;
        mgt_rng_init(&r, seed, 0, (uint64_t)e, MGT_RNG_INIT);
        init_random(&r, in->kind == NN_INIT_NORMAL, in->arg, lo, hi, p);
    } else {
        assert(in->kind == NN_INIT_CONST);
        for (size_t i = lo; i < hi; i++)
            p[i - lo] = (float)in->arg;
    }
}

/* Host staging of the initial values: windows of at most this many bytes of the parameter and
   buffer arenas, each filled and copied in turn (a model's whole arena at once took as much
   host memory again, 2.5 GB for vit_h_14, and the kernel's page clearing was 14% of
   resnet152's initialisation). */
#define INIT_WINDOW ((size_t)8 << 20)

mgt_status mgt_model_init(mgt_model *m, mgt_stream *s, uint64_t seed)
{
    mgt_status st = nn_need_device(m, "model init");
    if (st != MGT_OK)
        return st;
    size_t most = m->params_bytes > m->bufs_bytes ? m->params_bytes : m->bufs_bytes;
    size_t cap = most < INIT_WINDOW ? most : INIT_WINDOW;
    char *stage = malloc(cap ? cap : 1);
    if (!stage)
        return mgt_error_set(MGT_ERR_OOM, "model init: out of host memory (%zu bytes)", cap);
    for (int e = 0; e < m->n_table; e++)
        if (m->table[e].role == MGT_MODEL_COUNTER)
            m->bn_counts[m->table[e].offset] = 0;
    for (int arena = 0; arena < 2 && st == MGT_OK; arena++) {
        mgt_model_role role = arena ? MGT_MODEL_BUFFER : MGT_MODEL_PARAM;
        size_t bytes = arena ? m->bufs_bytes : m->params_bytes;
        char *dev = (char *)(arena ? m->bufs : m->params);
        for (size_t w0 = 0; w0 < bytes && st == MGT_OK; w0 += cap) {
            size_t w1 = bytes - w0 < cap ? bytes : w0 + cap;
            memset(stage, 0, w1 - w0); /* what no entry covers (alignment) stays zero */
            for (int e = 0; e < m->n_table; e++) {
                const mgt_model_entry *t = &m->table[e];
                size_t b0 = t->offset, b1 = t->offset + t->numel * sizeof(float);
                if (t->role != role || b1 <= w0 || b0 >= w1)
                    continue;
                size_t lo = b0 < w0 ? w0 : b0, hi = b1 > w1 ? w1 : b1;
                MGT_ASSERT((lo - b0) % sizeof(float) == 0 && (hi - b0) % sizeof(float) == 0);
                init_entry(m, e, seed, (lo - b0) / sizeof(float), (hi - b0) / sizeof(float),
                           (float *)(stage + (lo - w0)));
            }
            /* the window is copied before the staging is filled again */
            st = mgt_copy_h2d(s, dev + w0, stage, w1 - w0);
            mgt_status st2 = mgt_stream_synchronize(s, NULL);
            if (st == MGT_OK)
                st = st2;
        }
    }
    free(stage);
    return st;
}

/* ---- the step ---- */

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
    if (train && m->cfg.inference)
        return mgt_error_set(MGT_ERR_INVALID,
                             "model forward: this %s was made for inference (no gradients)",
                             m->arch);
    /* PyTorch refuses this too ("Expected more than 1 value per channel when training"):
       the batch variance of one value is 0 and the BN output would be its bias alone.
       A frozen BN takes no batch statistics, so any batch will do. */
    if (train && !m->cfg.freeze_bn && m->min_bn_hw > 0 && batch * m->min_bn_hw < 2)
        return mgt_error_set(MGT_ERR_INVALID,
                             "model forward: a training batch of 1 image leaves a batch norm of "
                             "this %s at 1x1 with one value per channel; use a larger batch "
                             "(or drop the last partial batch)",
                             m->arch);
    m->n = batch;
    m->x = x;
    m->trained = false;
    m->have_loss = false;
    /* Set here rather than once at creation, so nothing that ever writes the activation
       arena can leave them stale; two tiny fills per step. */
    if (train && m->cfg.freeze_bn && m->max_bn_c > 0) {
        st = mgt_fill(s, nn_act(m, m->ones_off), 1.0f, (size_t)m->max_bn_c);
        if (st == MGT_OK)
            st = mgt_memset(s, nn_act(m, m->zeros_off), 0, (size_t)m->max_bn_c * sizeof(float));
        if (st != MGT_OK)
            return st;
    }
    st = nn_graph_forward(m, s, train);
    if (st != MGT_OK)
        return st;
    m->trained = train;
    if (logits)
        *logits = nn_logits(m);
    return MGT_OK;
}

void mgt_model_set_dropout_key(mgt_model *m, const mgt_dropout_key *key) { m->drop_key = *key; }

mgt_status mgt_model_set_bn_sync(mgt_model *m, const mgt_bn_sync *sync)
{
    if (!m->cfg.sync_bn || !sync->gather || sync->replicas < 1)
        return mgt_error_set(MGT_ERR_INVALID,
                             "model %s: a bn sync needs a sync_bn model, "
                             "a gather and at least one replica",
                             m->arch);
    size_t c = (size_t)(m->max_bn_c > 0 ? m->max_bn_c : 1), per = 1 + 2 * c;
    free(m->bn_hf);
    free(m->bn_mine);
    free(m->bn_all);
    free(m->bn_sync_count);
    m->bn_hf = malloc(5 * c * sizeof *m->bn_hf);
    m->bn_mine = malloc(per * sizeof *m->bn_mine);
    m->bn_all = malloc((size_t)sync->replicas * per * sizeof *m->bn_all);
    m->bn_sync_count = calloc((size_t)(m->n_bn ? m->n_bn : 1), sizeof *m->bn_sync_count);
    if (!m->bn_hf || !m->bn_mine || !m->bn_all || !m->bn_sync_count)
        return mgt_error_set(MGT_ERR_OOM, "model %s: out of host memory", m->arch);
    m->bn_sync = *sync;
    return MGT_OK;
}

mgt_status mgt_model_loss(mgt_model *m, mgt_stream *s, const int32_t *labels, float smoothing,
                          int32_t *correct)
{
    return mgt_model_loss_mixed(m, s, labels, NULL, NULL, smoothing, correct);
}

mgt_status mgt_model_loss_mixed(mgt_model *m, mgt_stream *s, const int32_t *labels,
                                const int32_t *labels_b, const float *weights, float smoothing,
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
    const float *logits = nn_logits(m);
    if ((labels_b == NULL) != (weights == NULL))
        return mgt_error_set(MGT_ERR_INVALID, "model loss: mixed labels without weights");
    st = mgt_softmax_xent_forward(s, nn_act(m, m->loss_off), nn_act(m, m->probs_off), logits,
                                  labels, labels_b, weights, n, k, smoothing);
    /* after a training forward, the auxiliary classifiers' losses (the same targets) join
       the main one, weighted */
    for (int a = 0; a < m->n_aux && m->trained && st == MGT_OK; a++) {
        float *aloss = nn_act(m, m->aux_loss_off) + a;
        const float *alogits = nn_act(m, m->values[m->values[m->aux_value[a]].storage].off);
        float *aprobs = nn_act(m, m->aux_probs_off[a]);
        st = mgt_softmax_xent_forward(s, aloss, aprobs, alogits, labels, labels_b, weights, n, k,
                                      smoothing);
        if (st == MGT_OK)
            st = mgt_axpy(s, nn_act(m, m->loss_off), m->aux_weight, aloss, 1);
    }
    if (st == MGT_OK && correct)
        st = mgt_topk_correct(s, correct, logits, labels, n, k, 1);
    if (st == MGT_OK && correct)
        st = mgt_topk_correct(s, correct + 1, logits, labels, n, k, k < 5 ? k : 5);
    if (st != MGT_OK)
        return st;
    m->labels = labels;
    m->labels_b = labels_b;
    m->weights = weights;
    m->smoothing = smoothing;
    m->have_loss = true;
    return MGT_OK;
}

/* ---- backward ---- */

mgt_status nn_loss_backward(mgt_model *m, mgt_stream *s, float *dlogits, const float *probs,
                            float scale)
{
    return mgt_softmax_xent_backward(s, dlogits, probs, m->labels, m->labels_b, m->weights, m->n,
                                     m->cfg.classes, m->smoothing,
                                     scale * m->loss_scale / (float)m->n);
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
    m->ready = 0;
    m->hook = hook;
    m->hook_ctx = ctx;
    /* A second backward without a forward would read the slots this one overwrites. */
    m->have_loss = false;
    st = nn_loss_backward(m, s, nn_logits_grad(m), nn_act(m, m->probs_off), 1.0f);
    if (st == MGT_OK)
        st = nn_graph_backward(m, s);
    if (st == MGT_OK)
        assert(m->ready == m->params_bytes);
    m->hook = NULL;
    m->hook_ctx = NULL;
    return st;
}

void mgt_model_set_loss_scale(mgt_model *m, float scale) { m->loss_scale = scale; }

mgt_status mgt_model_zero_grad(mgt_model *m, mgt_stream *s)
{
    mgt_status st = nn_need_device(m, "model zero_grad");
    if (st != MGT_OK)
        return st;
    if (!m->grads)
        return mgt_error_set(MGT_ERR_INVALID, "model zero_grad: this %s has no gradients", m->arch);
    return mgt_memset(s, m->grads, 0, m->params_bytes);
}
