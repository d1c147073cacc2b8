/* Learning-rate schedules: the ImageNet example's step decay, cosine annealing, warm-up. */
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

float mgt_lr_at(const mgt_lr_config *c, int epoch, int iter, int iters_per_epoch)
{
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
