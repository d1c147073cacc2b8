/* The optimizer as the trainer sees it: one update over the parameter arena, and its state as
   a table of named device tensors that checkpoints save and load and broadcasts copy, so
   that another optimizer (adamw's two moments, rmsprop's square average) adds rows to the
   table instead of code to every place that handles state. */
#include "train/train_impl.h"

mgt_status train_optim_create(train_optim *o, mgt_device *d, size_t floats,
                              const mgt_train_config *c)
{
    return mgt_sgd_create(d, floats, c->momentum, c->weight_decay, c->nesterov, &o->sgd);
}

void train_optim_free(train_optim *o)
{
    mgt_sgd_free(o->sgd);
    o->sgd = NULL;
}

const char *train_optim_kind(const train_optim *o)
{
    (void)o;
    return "sgd";
}

mgt_status train_optim_step(train_optim *o, mgt_stream *s, float *params, const float *grads,
                            float lr, float grad_scale)
{
    return mgt_sgd_step(o->sgd, s, params, grads, lr, grad_scale);
}

int train_optim_state(const train_optim *o, train_opt_tensor *t)
{
    size_t floats = 0;
    float *mom = o->sgd ? mgt_sgd_momentum(o->sgd, &floats) : NULL;
    if (!mom) /* momentum 0: SGD keeps no state */
        return 0;
    t[0] = (train_opt_tensor){TRAIN_OPT_PREFIX "momentum_buffer", mom, floats};
    return 1;
}

bool train_optim_live(const train_optim *o) { return o->sgd && mgt_sgd_started(o->sgd); }

void train_optim_set_live(train_optim *o, bool live)
{
    if (o->sgd)
        mgt_sgd_set_started(o->sgd, live);
}
