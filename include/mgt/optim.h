/* SGD with PyTorch's semantics over a whole parameter arena, and the learning-rate schedules
   of the ImageNet example (step), with cosine and linear warm-up as options. */
#ifndef MGT_OPTIM_H
#define MGT_OPTIM_H

#include <stdbool.h>
#include <stddef.h>

#include "mgt/device.h"

typedef enum mgt_lr_kind {
    MGT_LR_STEP,   /* lr * gamma^(epoch // step_epochs), changed at epoch starts */
    MGT_LR_COSINE, /* 0.5 * lr * (1 + cos(pi * p)), p the fraction of the run after warm-up
                      done, per step (CosineAnnealingLR stepped every iteration) */
} mgt_lr_kind;

typedef struct mgt_lr_config {
    float lr; /* the base rate */
    mgt_lr_kind kind;
    int step_epochs;     /* step: every this many epochs (30) */
    float gamma;         /* step: the factor (0.1) */
    int epochs;          /* cosine: the run's length */
    float warmup_epochs; /* length of the linear warm-up, per step (see mgt_lr_at); may be a
                            fraction of an epoch; 0: none */
} mgt_lr_config;

/* "step" or "cosine" */
mgt_status mgt_lr_kind_parse(const char *s, mgt_lr_kind *out);

/* The rate for step `iter` (0-based) of epoch `epoch` (0-based) of `iters_per_epoch` steps.
   Warm-up, when set, scales the rate by (epoch * iters + iter + 1) / (warmup_epochs * iters)
   until that reaches 1 (Goyal et al.). The step schedule counts epochs from the start of the
   run, warm-up included, as the example's does; cosine decays over the steps after warm-up. */
float mgt_lr_at(const mgt_lr_config *c, int epoch, int iter, int iters_per_epoch);

typedef struct mgt_sgd mgt_sgd;

/* Momentum state for `floats` parameters on device d (none when momentum is 0). */
mgt_status mgt_sgd_create(mgt_device *d, size_t floats, float momentum, float weight_decay,
                          bool nesterov, mgt_sgd **out);
void mgt_sgd_free(mgt_sgd *o); /* NULL is a no-op */

/* Enqueues one update of params from grads, each scaled by grad_scale first (1/devices turns
   a sum over devices into DDP's mean). The first update after create or reset sets the
   momentum buffer to the gradient, as torch.optim.SGD does. */
mgt_status mgt_sgd_step(mgt_sgd *o, mgt_stream *s, float *params, const float *grads, float lr,
                        float grad_scale);

/* The momentum buffer (device, floats long; NULL without momentum) and whether it holds
   state yet: for checkpoints. mgt_sgd_set_started marks a restored buffer as live. */
float *mgt_sgd_momentum(const mgt_sgd *o, size_t *floats);
bool mgt_sgd_started(const mgt_sgd *o);
void mgt_sgd_set_started(mgt_sgd *o, bool started);

#endif
