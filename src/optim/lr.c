/* Learning-rate schedules: the ImageNet example's step decay, mgtrain's per-step cosine and
   warm-up, and torchvision's references' per-epoch schedulers with their warm-up; and the
   recipe's small formulas beside them (clip_grad_norm_'s factor, the EMA's decay). */
#include <math.h>
#include <string.h>

#include "mgt/optim.h"

mgt_status mgt_lr_kind_parse(const char *s, mgt_lr_kind *out)
{
    if (strcmp(s, "step") == 0)
        *out = MGT_LR_STEP;
    else if (strcmp(s, "cosine") == 0)
        *out = MGT_LR_COSINE;
    else
        return mgt_error_set(MGT_ERR_INVALID, "--lr-schedule '%s': expected step or cosine", s);
    return MGT_OK;
}

mgt_status mgt_lr_scheduler_parse(const char *s, mgt_lr_kind *out)
{
    if (strcmp(s, "steplr") == 0)
        *out = MGT_LR_STEPLR;
    else if (strcmp(s, "cosineannealinglr") == 0)
        *out = MGT_LR_COSINEANNEALINGLR;
    else if (strcmp(s, "exponentiallr") == 0)
        *out = MGT_LR_EXPONENTIALLR;
    else
        return mgt_error_set(MGT_ERR_INVALID,
                             "--lr-scheduler '%s': expected steplr, cosineannealinglr or "
                             "exponentiallr",
                             s);
    return MGT_OK;
}

mgt_status mgt_lr_warmup_parse(const char *s, mgt_lr_warmup *out)
{
    if (strcmp(s, "linear") == 0)
        *out = MGT_LR_WARMUP_LINEAR;
    else if (strcmp(s, "constant") == 0)
        *out = MGT_LR_WARMUP_CONSTANT;
    else
        return mgt_error_set(MGT_ERR_INVALID,
                             "--lr-warmup-method '%s': expected linear or constant", s);
    return MGT_OK;
}

const char *mgt_lr_kind_name(mgt_lr_kind k)
{
    static const char *const names[] = {"step", "cosine", "steplr", "cosineannealinglr",
                                        "exponentiallr"};
    return (unsigned)k < 5 ? names[k] : "unknown";
}

bool mgt_lr_per_epoch(mgt_lr_kind k) { return k >= MGT_LR_STEPLR; }

/* The references' schedule at `epoch` (0-based; the rate that epoch trains with). */
static double per_epoch_lr(const mgt_lr_config *c, int epoch)
{
    double lr = c->lr;
    int warm = (int)c->warmup_epochs;
    if (warm > 0 && epoch < warm) {
        double d = c->warmup_decay;
        if (c->warmup_method == MGT_LR_WARMUP_LINEAR)
            return lr * (d + (1.0 - d) * epoch / warm);
        return lr * d;
    }
    int e = epoch - (warm > 0 ? warm : 0); /* SequentialLR restarts the main one at 0 */
    switch (c->kind) {
    case MGT_LR_STEPLR: return lr * pow(c->gamma, c->step_epochs > 0 ? e / c->step_epochs : 0);
    case MGT_LR_EXPONENTIALLR: return lr * pow(c->gamma, e);
    case MGT_LR_COSINEANNEALINGLR: {
        int t_max = c->epochs - (warm > 0 ? warm : 0);
        if (t_max <= 0)
            return lr;
        return c->lr_min + (lr - c->lr_min) * 0.5 * (1.0 + cos(M_PI * e / t_max));
    }
    default: return lr;
    }
}

float mgt_lr_at(const mgt_lr_config *c, int epoch, int iter, int iters_per_epoch)
{
    if (mgt_lr_per_epoch(c->kind))
        return (float)per_epoch_lr(c, epoch);
    double lr = c->lr;
    if (c->kind == MGT_LR_STEP) {
        int steps = c->step_epochs > 0 ? epoch / c->step_epochs : 0;
        lr *= pow(c->gamma, steps);
    } else {
        /* progress in epochs, fractions included, from the end of the warm-up */
        double ipe = iters_per_epoch > 0 ? iters_per_epoch : 1;
        double t = (double)epoch + (double)iter / ipe - c->warmup_epochs;
        double span = (c->epochs > 0 ? c->epochs : 1) - c->warmup_epochs;
        double p = span > 0 ? t / span : 1;
        p = p < 0 ? 0 : p > 1 ? 1 : p;
        lr *= 0.5 * (1.0 + cos(M_PI * p));
    }
    if (c->warmup_epochs > 0 && iters_per_epoch > 0) {
        double done = (double)epoch * iters_per_epoch + iter + 1;
        double span = (double)c->warmup_epochs * iters_per_epoch;
        if (done < span)
            lr *= done / span;
    }
    return (float)lr;
}

float mgt_clip_coef(float sum_squares, double mean_scale, float max_norm)
{
    double total = sqrt((double)sum_squares) * mean_scale;
    double coef = (double)max_norm / (total + 1e-6);
    return (float)(coef < 1.0 ? coef : 1.0);
}

double mgt_ema_decay(double decay, long images_per_update, int every, int epochs)
{
    double adjust = (double)images_per_update * every / (epochs > 0 ? epochs : 1);
    double alpha = (1.0 - decay) * adjust;
    return 1.0 - (alpha < 1.0 ? alpha : 1.0);
}

mgt_status mgt_ema_average(mgt_stream *s, float *avg, const float *x, size_t n, double decay)
{
    if (n == 0)
        return MGT_OK;
    mgt_status st = mgt_scale(s, avg, (float)decay, n);
    if (st == MGT_OK)
        st = mgt_axpy(s, avg, (float)(1.0 - decay), x, n);
    return st;
}
