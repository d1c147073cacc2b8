/* The optimizer as the trainer sees it: --opt's kind over the parameter arena cut into the
   references' weight-decay groups (set_weight_decay: the custom keys first, every parameter
   called "bias" under --bias-weight-decay, class_token, position_embedding and
   relative_position_bias_table under --transformer-embedding-decay; then norm layers'
   parameters under --norm-weight-decay),
   and its state as a table of named device tensors that checkpoints save and load and
   broadcasts copy. */
#include <stdlib.h>
#include <string.h>

#include "train/train_impl.h"

/* The weight decay of one parameter, as references/classification/utils.py's
   set_weight_decay decides it: the custom keys, matched against the parameter's own name
   (the last part of its state_dict name), first: "bias" (so MultiheadAttention's
   in_proj_bias is not one), then the transformer embeddings' three names; then norm layers'
   parameters (batch norms and layer norms) under norm_weight_decay. Negative: the flag was not
   given. */
float mgt_train_weight_decay(const mgt_train_config *c, const mgt_model_entry *e)
{
    static const char *const embeddings[] = {"class_token", "position_embedding",
                                             "relative_position_bias_table"};
    const char *dot = strrchr(e->name, '.'), *own = dot ? dot + 1 : e->name;
    bool in_norm = e->what == MGT_TENSOR_NORM_WEIGHT || e->what == MGT_TENSOR_NORM_BIAS;
    if (strcmp(own, "bias") == 0 && c->bias_weight_decay >= 0)
        return c->bias_weight_decay;
    for (int k = 0; k < 3 && c->transformer_embedding_decay >= 0; k++)
        if (strcmp(own, embeddings[k]) == 0)
            return c->transformer_embedding_decay;
    if (in_norm && c->norm_weight_decay >= 0)
        return c->norm_weight_decay;
    return c->weight_decay;
}

static int by_offset(const void *a, const void *b)
{
    const mgt_model_entry *x = *(const mgt_model_entry *const *)a;
    const mgt_model_entry *y = *(const mgt_model_entry *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Runs of the arena in offset order with one decay each; a run reaches the next run's first
   tensor, so the zero padding between tensors belongs to a group (and stays zero). */
static mgt_status make_groups(const mgt_model *m, size_t floats, const mgt_train_config *c,
                              mgt_opt_group **out, int *n)
{
    int ne;
    const mgt_model_entry *t = mgt_model_table(m, &ne);
    const mgt_model_entry **ps = malloc((size_t)(ne ? ne : 1) * sizeof *ps);
    mgt_opt_group *g = malloc((size_t)(ne ? ne : 1) * sizeof *g);
    if (!ps || !g) {
        free(ps);
        free(g);
        return mgt_error_set(MGT_ERR_OOM, "optimizer: host memory exhausted");
    }
    int np = 0, ng = 0;
    for (int i = 0; i < ne; i++)
        if (t[i].role == MGT_MODEL_PARAM)
            ps[np++] = &t[i];
    qsort(ps, (size_t)np, sizeof *ps, by_offset);
    for (int i = 0; i < np; i++) {
        float wd = mgt_train_weight_decay(c, ps[i]);
        size_t at = i == 0 ? 0 : ps[i]->offset / sizeof(float);
        if (ng > 0 && g[ng - 1].weight_decay == wd)
            continue;
        if (ng > 0)
            g[ng - 1].floats = at - g[ng - 1].offset;
        g[ng++] = (mgt_opt_group){at, 0, wd};
    }
    if (ng == 0)
        g[ng++] = (mgt_opt_group){0, 0, c->weight_decay};
    g[ng - 1].floats = floats - g[ng - 1].offset;
    free(ps);
    *out = g;
    *n = ng;
    return MGT_OK;
}

mgt_opt_kind train_optim_kind_of(const mgt_train_config *c)
{
    return c->opt == MGT_OPT_SGD && c->nesterov ? MGT_OPT_SGD_NESTEROV : c->opt;
}

mgt_status train_optim_create(train_optim *o, mgt_device *d, const mgt_model *m,
                              const mgt_train_config *c)
{
    memset(o, 0, sizeof *o);
    size_t bytes;
    mgt_model_params(m, &bytes);
    mgt_opt_config oc;
    mgt_opt_config_defaults(&oc, train_optim_kind_of(c), c->momentum);
    mgt_opt_group *g = NULL;
    int ng = 0;
    mgt_status st = make_groups(m, bytes / sizeof(float), c, &g, &ng);
    if (st != MGT_OK)
        return st;
    o->groups = ng;
    o->kind = oc.kind;
    st = mgt_optimizer_create(d, bytes / sizeof(float), &oc, g, ng, &o->o);
    free(g);
    if (st != MGT_OK)
        return st;
    const char *names[MGT_OPT_MAX_STATE];
    float *dev[MGT_OPT_MAX_STATE];
    int n = mgt_optimizer_state(o->o, names, dev, NULL);
    for (int k = 0; k < n; k++)
        snprintf(o->names[k], sizeof o->names[k], TRAIN_OPT_PREFIX "%s", names[k]);
    return MGT_OK;
}

void train_optim_free(train_optim *o)
{
    mgt_optimizer_free(o->o);
    o->o = NULL;
}

const char *train_optim_kind(const train_optim *o) { return mgt_opt_kind_name(o->kind); }

mgt_status train_optim_step(train_optim *o, mgt_stream *s, float *params, const float *grads,
                            float lr, float grad_scale)
{
    return mgt_optimizer_step(o->o, s, params, grads, lr, grad_scale);
}

int train_optim_state(const train_optim *o, train_opt_tensor *t)
{
    if (!o->o)
        return 0;
    const char *names[MGT_OPT_MAX_STATE];
    float *dev[MGT_OPT_MAX_STATE];
    size_t floats;
    int n = mgt_optimizer_state(o->o, names, dev, &floats);
    for (int k = 0; k < n; k++)
        t[k] = (train_opt_tensor){o->names[k], dev[k], floats};
    return n;
}

long train_optim_steps(const train_optim *o) { return o->o ? mgt_optimizer_steps(o->o) : 0; }

void train_optim_set_steps(train_optim *o, long steps)
{
    if (o->o)
        mgt_optimizer_set_steps(o->o, steps);
}

bool train_optim_live(const train_optim *o) { return train_optim_steps(o) > 0; }
