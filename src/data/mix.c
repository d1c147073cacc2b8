/* Mixup and CutMix as torchvision's references recipe applies them to a batch
   (references/classification/transforms.py, RandomMixup and RandomCutmix, chosen by
   RandomChoice), but drawn per sample: a sample's partner is the sample before it in the
   epoch's order and its choice, lambda and box come from Philox keyed by (seed, epoch, its
   place in the order), so nothing depends on the device count or the local batch. */
#include <math.h>
#include <string.h>

#include "data/internal.h"

/* A standard normal by Box-Muller (one of the pair). */
static double normal(mgt_rng *r)
{
    double u1 = mgt_rng_uniform_double(r), u2 = mgt_rng_uniform_double(r);
    return sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
}

/* Gamma(a, 1) by Marsaglia and Tsang (2000); a < 1 through Gamma(a + 1) * U^(1/a). */
static double gamma_draw(mgt_rng *r, double a)
{
    if (a < 1.0) {
        double g = gamma_draw(r, a + 1.0);
        double u = mgt_rng_uniform_double(r);
        return g * pow(1.0 - u, 1.0 / a);
    }
    double d = a - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x = normal(r), v = 1.0 + c * x;
        if (v <= 0)
            continue;
        v = v * v * v;
        double u = mgt_rng_uniform_double(r);
        if (u < 1.0 - 0.0331 * x * x * x * x || log(u) < 0.5 * x * x + d * (1.0 - v + log(v)))
            return d * v;
    }
}

double mgt_beta_draw(mgt_rng *r, double alpha)
{
    /* torch._sample_dirichlet([alpha, alpha])[0]: Beta(alpha, alpha) as X / (X + Y) */
    double x = gamma_draw(r, alpha), y = gamma_draw(r, alpha);
    return x + y > 0 ? x / (x + y) : 0.5;
}

void mgt_cutmix_box(double lam, int rx, int ry, int w, int h, mgt_crop *box, double *lam_out)
{
    /* RandomCutmix.forward: the box centred at (rx, ry), half sides int(r * side) with
       r = sqrt(1 - lam) / 2, clamped to the image; lambda then the area left */
    double r = 0.5 * sqrt(1.0 - lam);
    int rw = (int)(r * w), rh = (int)(r * h);
    int x1 = rx - rw < 0 ? 0 : rx - rw, y1 = ry - rh < 0 ? 0 : ry - rh;
    int x2 = rx + rw > w ? w : rx + rw, y2 = ry + rh > h ? h : ry + rh;
    *box = (mgt_crop){.top = y1, .left = x1, .h = y2 - y1, .w = x2 - x1};
    *lam_out = 1.0 - (double)(x2 - x1) * (y2 - y1) / ((double)w * h);
}

void mgt_mixup_images(float *a, const float *b, size_t n, double lam)
{
    /* batch.mul_(lam).add_(batch_rolled.mul_(1 - lam)), in float as torch computes it */
    float la = (float)lam, lb = (float)(1.0 - lam);
    for (size_t i = 0; i < n; i++)
        a[i] = a[i] * la + b[i] * lb;
}

void mgt_cutmix_images(float *a, const float *b, int c, int h, int w, const mgt_crop *box)
{
    for (int ch = 0; ch < c; ch++)
        for (int y = box->top; y < box->top + box->h; y++) {
            size_t at = (size_t)ch * h * w + (size_t)y * w + box->left;
            memcpy(a + at, b + at, sizeof(float) * box->w);
        }
}

void mgt_mix_draw(const mgt_mix *m, uint64_t seed, int64_t epoch, size_t place, int h, int w,
                  mgt_mix_draws *out)
{
    mgt_rng r;
    mgt_rng_init(&r, seed, (uint64_t)epoch, place, MGT_RNG_MIX);
    bool both = m->mixup_alpha > 0 && m->cutmix_alpha > 0;
    /* RandomChoice([RandomMixup, RandomCutmix]): either, with even odds */
    out->cutmix = both ? mgt_rng_uniform(&r) >= 0.5f : m->cutmix_alpha > 0;
    out->lam = mgt_beta_draw(&r, out->cutmix ? m->cutmix_alpha : m->mixup_alpha);
    if (out->cutmix) {
        int rx = (int)mgt_rng_below(&r, (uint64_t)w), ry = (int)mgt_rng_below(&r, (uint64_t)h);
        mgt_cutmix_box(out->lam, rx, ry, w, h, &out->box, &out->lam);
    }
}
