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
    MGT_LR_COSINE, /* mgtrain's own: 0.5 * lr * (1 + cos(pi * p)), p the fraction of the run
                      after warm-up done, per step (CosineAnnealingLR stepped every iteration) */
    /* torchvision's references (--lr-scheduler), stepped once per epoch, after an optional
       warm-up of warmup_epochs whole epochs (LinearLR or ConstantLR) chained by SequentialLR,
       which starts the main scheduler afresh at the milestone: */
    MGT_LR_STEPLR,            /* StepLR(step_size = step_epochs, gamma) */
    MGT_LR_COSINEANNEALINGLR, /* CosineAnnealingLR(T_max = epochs - warm-up, eta_min = lr_min) */
    MGT_LR_EXPONENTIALLR,     /* ExponentialLR(gamma) */
} mgt_lr_kind;

typedef enum mgt_lr_warmup {
    MGT_LR_WARMUP_PER_STEP, /* mgtrain's own linear ramp per step (step and cosine) */
    MGT_LR_WARMUP_LINEAR,   /* LinearLR(start_factor = warmup_decay, total_iters = warm-up) */
    MGT_LR_WARMUP_CONSTANT, /* ConstantLR(factor = warmup_decay, total_iters = warm-up) */
} mgt_lr_warmup;

typedef struct mgt_lr_config {
    float lr; /* the base rate */
    mgt_lr_kind kind;
    int step_epochs;             /* step: every this many epochs (30) */
    float gamma;                 /* step: the factor (0.1) */
    int epochs;                  /* cosine: the run's length */
    float warmup_epochs;         /* length of the warm-up; step and cosine: linear per step (see
                            mgt_lr_at), fractions allowed; the references' kinds: whole
                            epochs; 0: none */
    mgt_lr_warmup warmup_method; /* the references' kinds: linear or constant */
    float warmup_decay;          /* their warm-up's start factor (0.01) */
    float lr_min;                /* cosineannealinglr's eta_min (0) */
} mgt_lr_config;

/* "step" or "cosine" (--lr-schedule, mgtrain's) */
mgt_status mgt_lr_kind_parse(const char *s, mgt_lr_kind *out);
/* "steplr", "cosineannealinglr" or "exponentiallr" (--lr-scheduler, the references') */
mgt_status mgt_lr_scheduler_parse(const char *s, mgt_lr_kind *out);
/* "linear" or "constant" (--lr-warmup-method) */
mgt_status mgt_lr_warmup_parse(const char *s, mgt_lr_warmup *out);
/* "step", "cosine", "steplr", ...; whether the kind is a per-epoch one of the references */
const char *mgt_lr_kind_name(mgt_lr_kind k);
bool mgt_lr_per_epoch(mgt_lr_kind k);

/* The rate for step `iter` (0-based) of epoch `epoch` (0-based) of `iters_per_epoch` steps.
   Warm-up, when set, scales the rate by (epoch * iters + iter + 1) / (warmup_epochs * iters)
   until that reaches 1 (Goyal et al.). The step schedule counts epochs from the start of the
   run, warm-up included, as the example's does; cosine decays over the steps after warm-up.
   The references' kinds depend on the epoch alone: the closed forms of what their schedulers
   give after `epoch` calls of step(). */
float mgt_lr_at(const mgt_lr_config *c, int epoch, int iter, int iters_per_epoch);

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

/* ---- clipping and the EMA model ---- */

/* torch.nn.utils.clip_grad_norm_'s factor, max_norm / (norm + 1e-6) at most 1, where norm =
   sqrt(sum_squares) * mean_scale: sum_squares of summed gradients, mean_scale what makes
   them the mean that torch clips. */
float mgt_clip_coef(float sum_squares, double mean_scale, float max_norm);

/* The EMA decay train.py uses: 1 - min(1, (1 - decay) * images_per_update * every / epochs)
   (adjust = world_size * batch_size * model_ema_steps / epochs). */
double mgt_ema_decay(double decay, long images_per_update, int every, int epochs);

/* avg = decay * avg + (1 - decay) * x over n floats (AveragedModel's ema_avg). */
mgt_status mgt_ema_average(mgt_stream *s, float *avg, const float *x, size_t n, double decay);

#endif
