/* The optimizers of torchvision's references (SGD, SGD with Nesterov momentum, AdamW,
   RMSprop) with PyTorch 1.13's semantics over a whole parameter arena split into weight-decay
   groups, and the learning-rate schedules: the ImageNet example's (step), mgtrain's per-step
   cosine and linear warm-up, and the references' per-epoch ones (StepLR, CosineAnnealingLR,
   ExponentialLR after a LinearLR or ConstantLR warm-up, as SequentialLR chains them). */
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

/* ---- the references' optimizers over weight-decay groups ---- */

typedef enum mgt_opt_kind {
    MGT_OPT_SGD,          /* torch.optim.SGD(momentum, weight_decay) */
    MGT_OPT_SGD_NESTEROV, /* the same with nesterov=True */
    MGT_OPT_ADAMW,        /* torch.optim.AdamW(weight_decay), betas 0.9, 0.999, eps 1e-8 */
    MGT_OPT_RMSPROP,      /* torch.optim.RMSprop(momentum, weight_decay, eps=0.0316, alpha=0.9) */
} mgt_opt_kind;

/* "sgd", "sgd_nesterov", "adamw", "rmsprop" (as --opt names them) */
mgt_status mgt_opt_kind_parse(const char *s, mgt_opt_kind *out);
const char *mgt_opt_kind_name(mgt_opt_kind k);

typedef struct mgt_opt_config {
    mgt_opt_kind kind;
    float momentum;          /* sgd, rmsprop */
    float beta1, beta2, eps; /* adamw; eps also rmsprop's */
    float alpha;             /* rmsprop's smoothing constant */
} mgt_opt_config;

/* The references' constants for kind (train.py: AdamW's defaults, RMSprop eps 0.0316 and
   alpha 0.9) with the given momentum. */
void mgt_opt_config_defaults(mgt_opt_config *c, mgt_opt_kind kind, float momentum);

/* A run of the arena [offset, offset + floats) (in floats) sharing one weight decay: a
   parameter group of torch.optim, cut at tensor boundaries. */
typedef struct mgt_opt_group {
    size_t offset, floats;
    float weight_decay;
} mgt_opt_group;

typedef struct mgt_optimizer mgt_optimizer;

#define MGT_OPT_MAX_STATE 2

/* State for `floats` parameters on d; groups (copied) must tile [0, floats) in order. */
mgt_status mgt_optimizer_create(mgt_device *d, size_t floats, const mgt_opt_config *c,
                                const mgt_opt_group *groups, int ngroups, mgt_optimizer **out);
void mgt_optimizer_free(mgt_optimizer *o); /* NULL is a no-op */

/* Enqueues one update of params from grads scaled by grad_scale, one fused kernel per group.
   The first step (steps() == 0) starts from zero state, as torch's lazily made state does
   (SGD's momentum buffer takes the first gradient). */
mgt_status mgt_optimizer_step(mgt_optimizer *o, mgt_stream *s, float *params, const float *grads,
                              float lr, float grad_scale);

/* The state tensors (device, floats long each) and their names in torch's state dict
   ("momentum_buffer"; "exp_avg", "exp_avg_sq"; "square_avg", "momentum_buffer"): fills
   names and dev (MGT_OPT_MAX_STATE long), returns the count (SGD without momentum: 0). */
int mgt_optimizer_state(const mgt_optimizer *o, const char **names, float **dev, size_t *floats);
/* Updates done (torch's per-parameter "step"; AdamW's bias correction counts it). Setting it
   marks restored state as live (> 0) or as to be started afresh (0). */
long mgt_optimizer_steps(const mgt_optimizer *o);
void mgt_optimizer_set_steps(mgt_optimizer *o, long steps);

#endif
