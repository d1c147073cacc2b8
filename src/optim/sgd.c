/* SGD over a parameter arena: one fused update kernel per step, momentum kept on the device. */
#include <stdlib.h>

#include "mgt/optim.h"

struct mgt_sgd {
    mgt_buffer *momentum_buf;
    size_t floats;
    float momentum, weight_decay;
    bool nesterov, started;
};

mgt_status mgt_sgd_create(mgt_device *d, size_t floats, float momentum, float weight_decay,
                          bool nesterov, mgt_sgd **out)
{
    *out = NULL;
    if (momentum < 0 || weight_decay < 0 || (nesterov && momentum <= 0))
        return mgt_error_set(MGT_ERR_INVALID,
                             "sgd: momentum %g and weight decay %g must not be negative, and "
                             "nesterov needs momentum",
                             momentum, weight_decay);
    mgt_sgd *o = calloc(1, sizeof *o);
    if (!o)
        return mgt_error_set(MGT_ERR_OOM, "sgd: host memory exhausted");
    o->floats = floats;
    o->momentum = momentum;
    o->weight_decay = weight_decay;
    o->nesterov = nesterov;
    if (momentum > 0) {
        mgt_status st = mgt_buffer_alloc(d, floats * sizeof(float), &o->momentum_buf);
        if (st != MGT_OK) {
            free(o);
            return st;
        }
    }
    *out = o;
    return MGT_OK;
}

void mgt_sgd_free(mgt_sgd *o)
{
    if (!o)
        return;
    mgt_buffer_free(o->momentum_buf);
    free(o);
}

mgt_status mgt_sgd_step(mgt_sgd *o, mgt_stream *s, float *params, const float *grads, float lr,
                        float grad_scale)
{
    mgt_sgd_params p = {
        .lr = lr,
        .momentum = o->momentum,
        .dampening = 0.0f,
        .weight_decay = o->weight_decay,
        .grad_scale = grad_scale,
        .nesterov = o->nesterov,
        .first_step = !o->started,
    };
    mgt_status st = mgt_sgd_update(
        s, params, o->momentum_buf ? mgt_buffer_ptr(o->momentum_buf) : NULL, grads, o->floats, &p);
    if (st == MGT_OK)
        o->started = true;
    return st;
}

float *mgt_sgd_momentum(const mgt_sgd *o, size_t *floats)
{
    if (floats)
        *floats = o->momentum_buf ? o->floats : 0;
    return o->momentum_buf ? mgt_buffer_ptr(o->momentum_buf) : NULL;
}

bool mgt_sgd_started(const mgt_sgd *o) { return o->started; }

void mgt_sgd_set_started(mgt_sgd *o, bool started) { o->started = started; }
