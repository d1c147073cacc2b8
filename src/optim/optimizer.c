/* The references' optimizers over weight-decay groups: SGD (Nesterov too), AdamW and RMSprop
   with PyTorch 1.13's arithmetic, one fused kernel per group, state kept on the device. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mgt/optim.h"

static const char *const kind_names[] = {"sgd", "sgd_nesterov", "adamw", "rmsprop"};

mgt_status mgt_opt_kind_parse(const char *s, mgt_opt_kind *out)
{
    for (int k = 0; k < 4; k++)
        if (strcmp(s, kind_names[k]) == 0) {
            *out = (mgt_opt_kind)k;
            return MGT_OK;
        }
    return mgt_error_set(MGT_ERR_INVALID,
                         "--opt '%s': expected sgd, sgd_nesterov, adamw or rmsprop", s);
}

const char *mgt_opt_kind_name(mgt_opt_kind k)
{
    return (unsigned)k < 4 ? kind_names[k] : "unknown";
}

void mgt_opt_config_defaults(mgt_opt_config *c, mgt_opt_kind kind, float momentum)
{
    *c = (mgt_opt_config){.kind = kind, .momentum = momentum, .beta1 = 0.9f, .beta2 = 0.999f};
    c->eps = kind == MGT_OPT_RMSPROP ? 0.0316f : 1e-8f;
    c->alpha = 0.9f;
}

struct mgt_optimizer {
    mgt_opt_config c;
    size_t floats;
    mgt_opt_group *groups;
    int ngroups;
    mgt_buffer *state[MGT_OPT_MAX_STATE];
    const char *names[MGT_OPT_MAX_STATE];
    int nstate;
    long steps;
};

mgt_status mgt_optimizer_create(mgt_device *d, size_t floats, const mgt_opt_config *c,
                                const mgt_opt_group *groups, int ngroups, mgt_optimizer **out)
{
    *out = NULL;
    const char *what = mgt_opt_kind_name(c->kind);
    if (!(c->momentum >= 0) || (c->kind == MGT_OPT_SGD_NESTEROV && c->momentum <= 0))
        return mgt_error_set(MGT_ERR_INVALID,
                             "%s: momentum %g must not be negative (and nesterov needs it above 0)",
                             what, (double)c->momentum);
    size_t at = 0;
    for (int g = 0; g < ngroups; g++) {
        if (groups[g].offset != at || !(groups[g].weight_decay >= 0))
            return mgt_error_set(MGT_ERR_INVALID,
                                 "%s: parameter group %d starts at %zu (expected %zu) or has a "
                                 "negative weight decay %g",
                                 what, g, groups[g].offset, at, (double)groups[g].weight_decay);
        at += groups[g].floats;
    }
    if (at != floats)
        return mgt_error_set(MGT_ERR_INVALID, "%s: the groups cover %zu of %zu parameters", what,
                             at, floats);
    mgt_optimizer *o = calloc(1, sizeof *o);
    if (!o || !(o->groups = malloc((size_t)(ngroups ? ngroups : 1) * sizeof *groups))) {
        free(o);
        return mgt_error_set(MGT_ERR_OOM, "%s: host memory exhausted", what);
    }
    memcpy(o->groups, groups, (size_t)ngroups * sizeof *groups);
    o->ngroups = ngroups;
    o->c = *c;
    o->floats = floats;
    switch (c->kind) {
    case MGT_OPT_SGD:
    case MGT_OPT_SGD_NESTEROV:
        if (c->momentum > 0)
            o->names[o->nstate++] = "momentum_buffer";
        break;
    case MGT_OPT_ADAMW:
        o->names[o->nstate++] = "exp_avg";
        o->names[o->nstate++] = "exp_avg_sq";
        break;
    case MGT_OPT_RMSPROP:
        o->names[o->nstate++] = "square_avg";
        if (c->momentum > 0)
            o->names[o->nstate++] = "momentum_buffer";
        break;
    }
    mgt_status st = MGT_OK;
    for (int k = 0; k < o->nstate && st == MGT_OK; k++)
        st = mgt_buffer_alloc(d, (floats ? floats : 1) * sizeof(float), &o->state[k]);
    if (st != MGT_OK) {
        mgt_optimizer_free(o);
        return st;
    }
    *out = o;
    return MGT_OK;
}

void mgt_optimizer_free(mgt_optimizer *o)
{
    if (!o)
        return;
    for (int k = 0; k < o->nstate; k++)
        mgt_buffer_free(o->state[k]);
    free(o->groups);
    free(o);
}

static float *state_at(const mgt_optimizer *o, int k, size_t offset)
{
    return k < o->nstate ? (float *)mgt_buffer_ptr(o->state[k]) + offset : NULL;
}

mgt_status mgt_optimizer_step(mgt_optimizer *o, mgt_stream *s, float *params, const float *grads,
                              float lr, float grad_scale)
{
    const mgt_opt_config *c = &o->c;
    mgt_status st = MGT_OK;
    /* AdamW's and RMSprop's state starts at zero (SGD's buffer takes the first gradient) */
    if (o->steps == 0 && c->kind != MGT_OPT_SGD && c->kind != MGT_OPT_SGD_NESTEROV)
        for (int k = 0; k < o->nstate && st == MGT_OK; k++)
            st = mgt_memset(s, mgt_buffer_ptr(o->state[k]), 0, o->floats * sizeof(float));
    long t = o->steps + 1;
    for (int g = 0; g < o->ngroups && st == MGT_OK; g++) {
        const mgt_opt_group *gr = &o->groups[g];
        if (gr->floats == 0)
            continue;
        float *p = params + gr->offset;
        const float *gd = grads + gr->offset;
        switch (c->kind) {
        case MGT_OPT_SGD:
        case MGT_OPT_SGD_NESTEROV: {
            mgt_sgd_params sp = {.lr = lr,
                                 .momentum = c->momentum,
                                 .weight_decay = gr->weight_decay,
                                 .grad_scale = grad_scale,
                                 .nesterov = c->kind == MGT_OPT_SGD_NESTEROV,
                                 .first_step = o->steps == 0};
            st = mgt_sgd_update(s, p, state_at(o, 0, gr->offset), gd, gr->floats, &sp);
            break;
        }
        case MGT_OPT_ADAMW: {
            /* torch works these out in Python, in double, from the step count */
            mgt_adamw_params ap = {
                .beta1 = c->beta1,
                .beta2 = c->beta2,
                .eps = c->eps,
                .grad_scale = grad_scale,
                .decay = (float)(1.0 - (double)lr * gr->weight_decay),
                .step_size = (float)((double)lr / (1.0 - pow(c->beta1, (double)t))),
                .bc2_sqrt = (float)sqrt(1.0 - pow(c->beta2, (double)t)),
            };
            st = mgt_adamw_update(s, p, state_at(o, 0, gr->offset), state_at(o, 1, gr->offset), gd,
                                  gr->floats, &ap);
            break;
        }
        case MGT_OPT_RMSPROP: {
            mgt_rmsprop_params rp = {.lr = lr,
                                     .alpha = c->alpha,
                                     .eps = c->eps,
                                     .weight_decay = gr->weight_decay,
                                     .momentum = c->momentum,
                                     .grad_scale = grad_scale};
            st = mgt_rmsprop_update(s, p, state_at(o, 0, gr->offset), state_at(o, 1, gr->offset),
                                    gd, gr->floats, &rp);
            break;
        }
        }
    }
    if (st == MGT_OK)
        o->steps = t;
    return st;
}

int mgt_optimizer_state(const mgt_optimizer *o, const char **names, float **dev, size_t *floats)
{
    for (int k = 0; k < o->nstate; k++) {
        names[k] = o->names[k];
        dev[k] = mgt_buffer_ptr(o->state[k]);
    }
    if (floats)
        *floats = o->floats;
    return o->nstate;
}

long mgt_optimizer_steps(const mgt_optimizer *o) { return o->steps; }

void mgt_optimizer_set_steps(mgt_optimizer *o, long steps) { o->steps = steps; }
