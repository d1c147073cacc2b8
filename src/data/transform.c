/* torchvision's transforms on decoded images: RandomResizedCrop, RandomCrop with padding,
   Resize + CenterCrop, RandomHorizontalFlip, ToTensor + Normalize, fused into one pass that
   writes float CHW (or 8-bit pixels for the policy augmentations). The resampling is PIL's
   (bilinear, bicubic or nearest), done in float, from any part of a decoded image at any
   DCT scale: the geometry is computed first, so that the decoder can be asked for only the
   pixels the resampling's taps read. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/internal.h"

const float mgt_imagenet_mean[3] = {0.485f, 0.456f, 0.406f};
const float mgt_imagenet_std[3] = {0.229f, 0.224f, 0.225f};

mgt_status mgt_transform_init(mgt_transform *t, mgt_transform_kind kind, int size, int channels)
{
    memset(t, 0, sizeof *t);
    t->kind = kind;
    t->size = size;
    t->channels = channels;
    t->resize = kind == MGT_TRANSFORM_RESIZE_CROP ? (int)((long)size * 256 / 224) : 0;
    t->padding = 4;
    t->scale_min = 0.08;
    t->scale_max = 1.0;
    t->ratio_min = 3.0 / 4.0;
    t->ratio_max = 4.0 / 3.0;
    t->hflip = kind != MGT_TRANSFORM_RESIZE_CROP;
    t->interp = MGT_INTERP_BILINEAR;
    t->auto_augment = MGT_AUTO_AUGMENT_NONE;
    t->augmix_severity = 3; /* AugMix's default */
    t->ra_magnitude = 9;
    if (channels == 1) {
        t->mean[0] = 0.4590f;
        t->std[0] = 0.2256f;
    } else {
        for (int c = 0; c < 3; c++) {
            t->mean[c] = mgt_imagenet_mean[c];
            t->std[c] = mgt_imagenet_std[c];
        }
    }
    return mgt_transform_check(t);
}

mgt_status mgt_transform_check(const mgt_transform *t)
{
    if (t->kind != MGT_TRANSFORM_RRC && t->kind != MGT_TRANSFORM_PAD_CROP &&
        t->kind != MGT_TRANSFORM_RESIZE_CROP)
        return mgt_error_set(MGT_ERR_INVALID, "transform: unknown kind %d", (int)t->kind);
    if (t->size < 1 || t->size > 8192)
        return mgt_error_set(MGT_ERR_INVALID, "transform: image size %d is not in 1..8192",
                             t->size);
    if (t->channels != 1 && t->channels != 3)
        return mgt_error_set(MGT_ERR_INVALID, "transform: channels must be 1 or 3, not %d",
                             t->channels);
    if (t->resize < 0 || t->resize > 65536)
        return mgt_error_set(MGT_ERR_INVALID, "transform: resize %d is not in 0..65536", t->resize);
    if (t->padding < 0 || t->padding > 4096)
        return mgt_error_set(MGT_ERR_INVALID, "transform: padding %d is not in 0..4096",
                             t->padding);
    if (t->kind == MGT_TRANSFORM_RRC) {
        if (!(t->scale_min > 0 && t->scale_min <= t->scale_max && t->scale_max <= 1.0))
            return mgt_error_set(MGT_ERR_INVALID,
                                 "transform: crop scale %g..%g is not within (0, 1]", t->scale_min,
                                 t->scale_max);
        if (!(t->ratio_min > 0 && t->ratio_min <= t->ratio_max && isfinite(t->ratio_max)))
            return mgt_error_set(MGT_ERR_INVALID,
                                 "transform: crop ratio %g..%g is not a range of positive numbers",
                                 t->ratio_min, t->ratio_max);
    }
    if (t->interp != MGT_INTERP_BILINEAR && t->interp != MGT_INTERP_NEAREST &&
        t->interp != MGT_INTERP_BICUBIC)
        return mgt_error_set(MGT_ERR_INVALID, "transform: unknown interpolation %d",
                             (int)t->interp);
    if (t->ra_magnitude < 0 || t->ra_magnitude > 30)
        return mgt_error_set(MGT_ERR_INVALID,
                             "transform: RandAugment magnitude %d (expected 0 to 30: a bin of 31)",
                             t->ra_magnitude);
    if (t->auto_augment < MGT_AUTO_AUGMENT_NONE || t->auto_augment > MGT_AUTO_AUGMENT_AUGMIX)
        return mgt_error_set(MGT_ERR_INVALID, "transform: unknown auto-augment policy %d",
                             (int)t->auto_augment);
    if (t->auto_augment == MGT_AUTO_AUGMENT_AUGMIX &&
        (t->augmix_severity < 1 || t->augmix_severity > 10))
        return mgt_error_set(MGT_ERR_INVALID, "--augmix-severity %d: expected 1 to 10",
                             t->augmix_severity);
    if (t->auto_augment != MGT_AUTO_AUGMENT_NONE && t->kind == MGT_TRANSFORM_RESIZE_CROP)
        return mgt_error_set(MGT_ERR_INVALID,
                             "transform: an auto-augment policy is for training transforms");
    if (!(t->random_erase >= 0 && t->random_erase <= 1))
        return mgt_error_set(MGT_ERR_INVALID,
                             "transform: random-erase probability %g is not in "
                             "0..1",
                             (double)t->random_erase);
    for (int c = 0; c < t->channels; c++) {
        if (!isfinite(t->mean[c]))
            return mgt_error_set(MGT_ERR_INVALID, "transform: mean[%d] is not finite", c);
        if (!(t->std[c] > 0) || !isfinite(t->std[c]))
            return mgt_error_set(MGT_ERR_INVALID, "transform: std[%d] = %g must be positive", c,
                                 (double)t->std[c]);
    }
    return MGT_OK;
}

void mgt_transform_scratch_free(mgt_transform_scratch *s)
{
    if (!s)
        return;
    free(s->buf);
    free(s->img[0]);
    free(s->img[1]);
    memset(s, 0, sizeof *s);
}

/* ---- random parameters ---- */

static double philox_uniform(void *ctx, double lo, double hi)
{
    /* as torch's CPU uniform_ on a float tensor: u * (to - from) + from in float */
    float u = mgt_rng_uniform(ctx);
    return (double)(u * ((float)hi - (float)lo) + (float)lo);
}

static int64_t philox_randint(void *ctx, int64_t lo, int64_t hi)
{
    return mgt_rng_range(ctx, lo, hi);
}

mgt_draws mgt_draws_philox(mgt_rng *rng)
{
    return (mgt_draws){.uniform = philox_uniform, .randint = philox_randint, .ctx = rng};
}

int mgt_transform_rrc_params(const mgt_draws *d, int w, int h, double scale_min, double scale_max,
                             double ratio_min, double ratio_max, mgt_crop *out)
{
    double area = (double)w * h;
    /* torch.log(torch.tensor(ratio)): the bounds are float32 and so are their logs */
    float log_lo = logf((float)ratio_min), log_hi = logf((float)ratio_max);
    for (int attempt = 1; attempt <= 10; attempt++) {
        double target_area = area * d->uniform(d->ctx, scale_min, scale_max);
        double aspect = (double)expf((float)d->uniform(d->ctx, log_lo, log_hi));
        /* Python's round() is half-to-even, which rint() is in the default rounding mode */
        double cw_d = rint(sqrt(target_area * aspect));
        double ch_d = rint(sqrt(target_area / aspect));
        if (cw_d > 0 && cw_d <= w && ch_d > 0 && ch_d <= h) {
            int cw = (int)cw_d, ch = (int)ch_d;
            out->h = ch;
            out->w = cw;
            out->top = (int)d->randint(d->ctx, 0, (int64_t)h - ch + 1);
            out->left = (int)d->randint(d->ctx, 0, (int64_t)w - cw + 1);
            return attempt;
        }
    }
    double in_ratio = (double)w / (double)h;
    int cw, ch;
    if (in_ratio < ratio_min) {
        cw = w;
        ch = (int)rint(cw / ratio_min);
    } else if (in_ratio > ratio_max) {
        ch = h;
        cw = (int)rint(ch * ratio_max);
    } else {
        cw = w;
        ch = h;
    }
    out->h = ch;
    out->w = cw;
    out->top = (h - ch) / 2;
    out->left = (w - cw) / 2;
    return 0;
}

void mgt_transform_resize_size(int w, int h, int resize, int *out_w, int *out_h)
{
    if (resize <= 0) {
        *out_w = w;
        *out_h = h;
        return;
    }
    int shorter = w <= h ? w : h, longer = w <= h ? h : w;
    /* int(size * long / short): Python's true division, then truncation */
    int new_long = (int)((double)((long)resize * longer) / (double)shorter);
    if (w <= h) {
        *out_w = resize;
        *out_h = new_long;
    } else {
        *out_w = new_long;
        *out_h = resize;
    }
}

void mgt_transform_center_crop(int w, int h, int size, mgt_crop *out)
{
    out->h = size;
    out->w = size;
    /* torchvision pads a side smaller than the crop by (size - side) // 2 before it, then
       the crop of that side starts at 0 */
    out->top = size > h ? -((size - h) / 2) : (int)rint((h - size) / 2.0);
    out->left = size > w ? -((size - w) / 2) : (int)rint((w - size) / 2.0);
}

/* ---- geometry ---- */

mgt_status mgt_transform_geometry(const mgt_transform *t, int w, int h, mgt_rng *rng, mgt_geom *g)
{
    memset(g, 0, sizeof *g);
    const int S = t->size;
    g->ow = g->oh = S;
    mgt_draws d = {0};
    if (rng)
        d = mgt_draws_philox(rng);
    else if (t->kind != MGT_TRANSFORM_RESIZE_CROP)
        return mgt_error_set(MGT_ERR_INVALID, "transform: a random transform needs an rng");
    switch (t->kind) {
    case MGT_TRANSFORM_RRC: {
        /* torchvision crops, then resizes the crop: the taps stay inside it */
        mgt_crop c;
        mgt_transform_rrc_params(&d, w, h, t->scale_min, t->scale_max, t->ratio_min, t->ratio_max,
                                 &c);
        g->box[0] = c.left;
        g->box[1] = c.top;
        g->box[2] = c.left + c.w;
        g->box[3] = c.top + c.h;
        g->sw = g->sh = S;
        g->flip = t->hflip && mgt_rng_uniform(rng) < 0.5f;
        break;
    }
    case MGT_TRANSFORM_PAD_CROP: {
        int p = t->padding;
        long ph = (long)h + 2L * p, pw = (long)w + 2L * p;
        long i = 0, j = 0;
        /* RandomCrop.get_params: no draw when the padded image is exactly the crop; where
           it is smaller (torchvision raises) the crop is centred on it */
        if (!(ph == S && pw == S)) {
            i = ph >= S ? d.randint(d.ctx, 0, ph - S + 1) : -((S - ph) / 2);
            j = pw >= S ? d.randint(d.ctx, 0, pw - S + 1) : -((S - pw) / 2);
        }
        g->box[2] = g->sw = w;
        g->box[3] = g->sh = h;
        g->wx = (int)(j - p);
        g->wy = (int)(i - p);
        g->flip = t->hflip && mgt_rng_uniform(rng) < 0.5f;
        break;
    }
    case MGT_TRANSFORM_RESIZE_CROP: {
        mgt_transform_resize_size(w, h, t->resize, &g->sw, &g->sh);
        mgt_crop c;
        mgt_transform_center_crop(g->sw, g->sh, S, &c);
        g->box[2] = w;
        g->box[3] = h;
        g->wx = c.left;
        g->wy = c.top;
        break;
    }
    default: return mgt_error_set(MGT_ERR_INVALID, "transform: unknown kind %d", (int)t->kind);
    }
    if (t->kind == MGT_TRANSFORM_RRC) {
        g->lim[0] = (int)g->box[0];
        g->lim[1] = (int)g->box[1];
        g->lim[2] = (int)g->box[2];
        g->lim[3] = (int)g->box[3];
    } else {
        g->lim[2] = w;
        g->lim[3] = h;
    }
    return MGT_OK;
}

int mgt_geom_dct_scale(const mgt_geom *g)
{
    double bw = g->box[2] - g->box[0], bh = g->box[3] - g->box[1];
    for (int k = 8; k > 1; k /= 2)
        if (bw / k >= g->sw && bh / k >= g->sh)
            return k;
    return 1;
}

void mgt_geom_scale(mgt_geom *g, int k, int full_w, int full_h)
{
    if (k == 1)
        return;
    for (int i = 0; i < 4; i++)
        g->box[i] /= k;
    g->lim[0] /= k;
    g->lim[1] /= k;
    g->lim[2] = (g->lim[2] + k - 1) / k;
    g->lim[3] = (g->lim[3] + k - 1) / k;
    if (g->lim[2] > full_w)
        g->lim[2] = full_w;
    if (g->lim[3] > full_h)
        g->lim[3] = full_h;
    if (g->box[2] > full_w)
        g->box[2] = full_w;
    if (g->box[3] > full_h)
        g->box[3] = full_h;
}

/* ---- resampling ---- */

/* PIL's resampling filters (Resample.c): the kernel and its support before widening. */
static double filter_triangle(double x)
{
    if (x < 0)
        x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

static double filter_bicubic(double x)
{
    const double a = -0.5;
    if (x < 0)
        x = -x;
    if (x < 1.0)
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0)
        return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

static double filter_support(mgt_interp m) { return m == MGT_INTERP_BICUBIC ? 2.0 : 1.0; }

/* The taps of one axis: output o (o0 <= o < o0 + n) reads source pixels first[o] ..
   first[o]+count[o]-1 with weights wt[o*ksize ...]. As PIL's precompute_coeffs, for the box
   [in0, in1) mapped onto osize outputs: the filter widens by the scale when shrinking
   (antialias), windows clamp to [lim0, lim1) and the weights renormalise. NEAREST is PIL's
   affine scale (a running sum of the step, floored). A box of exactly osize whole pixels is
   copied (PIL skips that pass). */
static bool axis_identity(mgt_interp m, double in0, double in1, int osize)
{
    return m != MGT_INTERP_NEAREST && in1 - in0 == osize && in0 == floor(in0);
}

static int axis_ksize(mgt_interp m, double in0, double in1, int osize)
{
    if (m == MGT_INTERP_NEAREST || axis_identity(m, in0, in1, osize))
        return 1;
    double scale = (in1 - in0) / osize;
    double support = filter_support(m) * (scale > 1.0 ? scale : 1.0);
    return (int)ceil(support) * 2 + 1;
}

static void axis_weights(mgt_axis *a, mgt_interp m, double in0, double in1, int lim0, int lim1,
                         int osize, int o0, int n)
{
    double bsize = in1 - in0, base = floor(in0), frac = in0 - base;
    if (axis_identity(m, in0, in1, osize)) {
        for (int k = 0; k < n; k++) {
            a->first[k] = (int)base + o0 + k;
            a->count[k] = 1;
            a->wt[k] = 1.0f;
        }
        return;
    }
    double scale = bsize / osize;
    if (m == MGT_INTERP_NEAREST) {
        double xo = frac + scale * 0.5;
        for (int o = 0; o < o0 + n; o++, xo += scale) {
            if (o < o0)
                continue;
            int x = (int)base + (xo < 0 ? -1 : (int)xo);
            x = x < lim0 ? lim0 : x >= lim1 ? lim1 - 1 : x;
            a->first[o - o0] = x;
            a->count[o - o0] = 1;
            a->wt[o - o0] = 1.0f;
        }
        return;
    }
    double (*f)(double) = m == MGT_INTERP_BICUBIC ? filter_bicubic : filter_triangle;
    double fscale = scale > 1.0 ? scale : 1.0;
    double support = filter_support(m) * fscale, ss = 1.0 / fscale;
    int rlo = lim0 - (int)base, rhi = lim1 - (int)base;
    for (int k = 0; k < n; k++) {
        int o = o0 + k;
        double center = frac + (o + 0.5) * scale;
        int xmin = (int)(center - support + 0.5);
        if (xmin < rlo)
            xmin = rlo;
        int xmax = (int)(center + support + 0.5);
        if (xmax > rhi)
            xmax = rhi;
        int cnt = xmax - xmin;
        if (cnt > a->ksize)
            cnt = a->ksize;
        if (cnt < 1) { /* a box past the image's edge: the nearest pixel */
            xmin = xmin >= rhi ? rhi - 1 : xmin;
            cnt = 1;
        }
        double total = 0;
        for (int x = 0; x < cnt; x++)
            total += f((x + xmin - center + 0.5) * ss);
        float *dst = a->wt + (size_t)k * a->ksize;
        for (int x = 0; x < cnt; x++) {
            double w = f((x + xmin - center + 0.5) * ss);
            dst[x] = (float)(total != 0.0 ? w / total : (cnt == 1 ? 1.0 : 0.0));
        }
        a->first[k] = (int)base + xmin;
        a->count[k] = cnt;
    }
}

/* acc[i] += w * r[i]. Written with vector types because the build's -O2 does not
   vectorise a loop of unknown length: this halves the cost of the vertical pass. */
typedef float v4f __attribute__((vector_size(16)));

static void axpy_row(float *restrict acc, float w, const float *restrict r, size_t n)
{
    size_t i = 0;
    v4f wv = {w, w, w, w};
    for (; i + 8 <= n; i += 8) {
        v4f a0, a1, r0, r1;
        memcpy(&a0, acc + i, 16);
        memcpy(&a1, acc + i + 4, 16);
        memcpy(&r0, r + i, 16);
        memcpy(&r1, r + i + 4, 16);
        a0 += wv * r0;
        a1 += wv * r1;
        memcpy(acc + i, &a0, 16);
        memcpy(acc + i + 4, &a1, 16);
    }
    for (; i < n; i++)
        acc[i] += w * r[i];
}

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

void *mgt_scratch_get(mgt_transform_scratch *s, int which, size_t bytes)
{
    void **p = which == 0 ? &s->buf : &s->img[which - 1];
    size_t *cap = which == 0 ? &s->cap : &s->img_cap[which - 1];
    if (bytes > *cap) {
        size_t ncap = bytes + bytes / 4;
        void *q = realloc(*p, ncap);
        if (!q)
            return NULL;
        *p = q;
        *cap = ncap;
        s->growths++;
    }
    return *p;
}

mgt_status mgt_resample_plan(const mgt_geom *g, mgt_interp m, int channels,
                             mgt_transform_scratch *s, mgt_resample *rs)
{
    memset(rs, 0, sizeof *rs);
    rs->g = *g;
    rs->interp = m;
    rs->c = channels;
    const int OW = g->ow, OH = g->oh;
    /* outputs inside the scaled image: columns [cx0, cx1), rows [cy0, cy1) of the window */
    int cx0 = g->wx < 0 ? -g->wx : 0, cy0 = g->wy < 0 ? -g->wy : 0;
    int cx1 = g->sw - g->wx < OW ? g->sw - g->wx : OW,
        cy1 = g->sh - g->wy < OH ? g->sh - g->wy : OH;
    rs->empty = cx1 <= cx0 || cy1 <= cy0;
    rs->partial = rs->empty || cx0 > 0 || cy0 > 0 || cx1 < OW || cy1 < OH;
    if (rs->empty)
        return MGT_OK;
    rs->cx0 = cx0;
    rs->cy0 = cy0;
    rs->nx = cx1 - cx0;
    rs->ny = cy1 - cy0;
    const int nx = rs->nx, ny = rs->ny, C = channels;
    rs->ax.ksize = axis_ksize(m, g->box[0], g->box[2], g->sw);
    rs->ay.ksize = axis_ksize(m, g->box[1], g->box[3], g->sh);
    int lw = g->lim[2] - g->lim[0], lh = g->lim[3] - g->lim[1];
    if (lw < 1 || lh < 1)
        return mgt_error_set(MGT_ERR_INVALID, "transform: empty source box");
    size_t o_axf = 0;
    size_t o_axc = align64(o_axf + sizeof(int) * nx);
    size_t o_axw = align64(o_axc + sizeof(int) * nx);
    size_t o_ayf = align64(o_axw + sizeof(float) * nx * rs->ax.ksize);
    size_t o_ayc = align64(o_ayf + sizeof(int) * ny);
    size_t o_ayw = align64(o_ayc + sizeof(int) * ny);
    size_t o_acc = align64(o_ayw + sizeof(float) * ny * rs->ay.ksize);
    /* one source row in float (RGB only), padded so a 4-wide load at the last pixel stays
       inside */
    size_t o_srow = align64(o_acc + sizeof(float) * nx * C);
    size_t o_tmp = align64(o_srow + sizeof(float) * ((size_t)lw * 3 + 4));
    /* the horizontal pass keeps every source row the vertical taps touch: at most the
       clamp range's height, so the scratch is sized before the taps are known */
    size_t bytes = o_tmp + sizeof(float) * (size_t)lh * nx * C;
    char *base = mgt_scratch_get(s, 0, bytes);
    if (!base)
        return mgt_error_set(MGT_ERR_OOM, "transform: out of memory (%zu bytes)", bytes);
    rs->ax.first = (int *)(base + o_axf);
    rs->ax.count = (int *)(base + o_axc);
    rs->ax.wt = (float *)(base + o_axw);
    rs->ay.first = (int *)(base + o_ayf);
    rs->ay.count = (int *)(base + o_ayc);
    rs->ay.wt = (float *)(base + o_ayw);
    rs->acc = (float *)(base + o_acc);
    rs->srow = (float *)(base + o_srow);
    rs->tmp = (float *)(base + o_tmp);
    axis_weights(&rs->ax, m, g->box[0], g->box[2], g->lim[0], g->lim[2], g->sw, g->wx + cx0, nx);
    axis_weights(&rs->ay, m, g->box[1], g->box[3], g->lim[1], g->lim[3], g->sh, g->wy + cy0, ny);
    int c0 = rs->ax.first[0], c1 = c0, r0 = rs->ay.first[0], r1 = r0;
    for (int k = 0; k < nx; k++) {
        if (rs->ax.first[k] < c0)
            c0 = rs->ax.first[k];
        if (rs->ax.first[k] + rs->ax.count[k] > c1)
            c1 = rs->ax.first[k] + rs->ax.count[k];
    }
    for (int k = 0; k < ny; k++) {
        if (rs->ay.first[k] < r0)
            r0 = rs->ay.first[k];
        if (rs->ay.first[k] + rs->ay.count[k] > r1)
            r1 = rs->ay.first[k] + rs->ay.count[k];
    }
    rs->src[0] = c0;
    rs->src[1] = r0;
    rs->src[2] = c1;
    rs->src[3] = r1;
    return MGT_OK;
}

mgt_status mgt_resample_run(const mgt_resample *rs, const mgt_image_view *v,
                            const mgt_resample_out *o)
{
    const int C = rs->c, OW = rs->g.ow, OH = rs->g.oh;
    const size_t plane = (size_t)OW * OH;
    if (rs->partial) {
        if (o->u8)
            memset(o->u8, 0, plane * C);
        else
            for (int c = 0; c < C; c++) {
                float *dst = o->f + (size_t)c * plane;
                for (size_t i = 0; i < plane; i++)
                    dst[i] = o->b[c];
            }
    }
    if (rs->empty)
        return MGT_OK;
    if (v->c != C || rs->src[0] < v->x0 || rs->src[1] < v->y0 || rs->src[2] > v->x0 + v->w ||
        rs->src[3] > v->y0 + v->h)
        return mgt_error_set(MGT_ERR_INVALID,
                             "transform: decoded rows %d..%d, columns %d..%d do not cover the "
                             "%d..%d, %d..%d the resampling reads",
                             v->y0, v->y0 + v->h, v->x0, v->x0 + v->w, rs->src[1], rs->src[3],
                             rs->src[0], rs->src[2]);
    const int nx = rs->nx, ny = rs->ny, c0 = rs->src[0], r0 = rs->src[1], r1 = rs->src[3];
    const mgt_axis *ax = &rs->ax, *ay = &rs->ay;
    const bool clip = rs->interp == MGT_INTERP_BICUBIC; /* PIL's 8 bits between the passes */
    float *tmp = rs->tmp, *srow = rs->srow, *acc = rs->acc;

    /* horizontal pass over the rows r0..r1-1: tmp[row][x][c] */
    for (int r = r0; r < r1; r++) {
        const uint8_t *src = v->px + (size_t)(r - v->y0) * v->stride;
        float *dst = tmp + (size_t)(r - r0) * nx * C;
        if (C == 3) {
            /* a pixel is one 4-wide multiply-add per tap (the 4th lane is the next pixel's
               red, never stored) */
            const uint8_t *s8 = src + (size_t)(c0 - v->x0) * 3;
            size_t n = (size_t)(rs->src[2] - c0) * 3;
            for (size_t i = 0; i < n; i++)
                srow[i] = s8[i];
            for (size_t i = n; i < n + 4; i++)
                srow[i] = 0;
            for (int k = 0; k < nx; k++) {
                const float *w = ax->wt + (size_t)k * ax->ksize;
                const float *p = srow + (size_t)(ax->first[k] - c0) * 3;
                v4f sum = {0, 0, 0, 0};
                for (int x = 0; x < ax->count[k]; x++) {
                    v4f pv, wv = {w[x], w[x], w[x], w[x]};
                    memcpy(&pv, p + 3 * x, 16);
                    sum += wv * pv;
                }
                dst[3 * k] = sum[0];
                dst[3 * k + 1] = sum[1];
                dst[3 * k + 2] = sum[2];
            }
        } else {
            for (int k = 0; k < nx; k++) {
                const float *w = ax->wt + (size_t)k * ax->ksize;
                const uint8_t *p = src + (ax->first[k] - v->x0);
                float s0 = 0;
                for (int x = 0; x < ax->count[k]; x++)
                    s0 += w[x] * p[x];
                dst[k] = s0;
            }
        }
        if (clip) /* and rounds: bicubic's negative lobes would amplify the difference */
            for (int i = 0; i < nx * C; i++)
                dst[i] = dst[i] <= 0 ? 0 : dst[i] >= 255 ? 255 : floorf(dst[i] + 0.5f);
    }

    /* vertical pass (whole rows at a time, so the inner loop runs over contiguous floats),
       then mirror and write; the fill written above already sits wherever the mirrored
       interior does not land */
    const size_t rowlen = (size_t)nx * C;
    for (int k = 0; k < ny; k++) {
        const float *w = ay->wt + (size_t)k * ay->ksize;
        const float *rows = tmp + (size_t)(ay->first[k] - r0) * rowlen;
        int cnt = ay->count[k];
        for (size_t x = 0; x < rowlen; x++)
            acc[x] = 0;
        for (int y = 0; y < cnt; y++)
            axpy_row(acc, w[y], rows + (size_t)y * rowlen, rowlen);
        size_t orow = (size_t)(rs->cy0 + k) * OW;
        if (o->u8) {
            /* PIL's 8-bit result: rounded half up, clamped */
            for (int x = 0; x < nx; x++) {
                int ox = rs->cx0 + x;
                if (rs->g.flip)
                    ox = OW - 1 - ox;
                uint8_t *dst = o->u8 + (orow + (size_t)ox) * C;
                for (int c = 0; c < C; c++) {
                    float a = acc[(size_t)x * C + c] + 0.5f;
                    dst[c] = (uint8_t)(a <= 0 ? 0 : a >= 255 ? 255 : (int)a);
                }
            }
        } else {
            /* plane by plane: the planes of a 224x224 output lie a multiple of 4 KiB apart,
               and three interleaved store streams at one page offset stall on 4K aliasing
               (a third of the resampling's time) */
            for (int c = 0; c < C; c++) {
                float *dst = o->f + c * plane + orow;
                const float a = o->a[c], b = o->b[c];
                if (rs->g.flip)
                    for (int x = 0; x < nx; x++)
                        dst[OW - 1 - (rs->cx0 + x)] = acc[(size_t)x * C + c] * a + b;
                else
                    for (int x = 0; x < nx; x++)
                        dst[rs->cx0 + x] = acc[(size_t)x * C + c] * a + b;
            }
        }
    }
    return MGT_OK;
}

/* ---- the whole transform ---- */

void mgt_transform_norm(const mgt_transform *t, float a[3], float b[3])
{
    for (int c = 0; c < t->channels; c++) {
        a[c] = 1.0f / (255.0f * t->std[c]);
        b[c] = -t->mean[c] / t->std[c];
    }
}

mgt_status mgt_transform_finish(const mgt_transform *t, const mgt_resample *rs,
                                const mgt_image_view *v, mgt_rng *rng, mgt_transform_scratch *s,
                                float *out)
{
    const int OW = rs->g.ow, OH = rs->g.oh, C = t->channels;
    mgt_resample_out o = {.f = out};
    mgt_transform_norm(t, o.a, o.b);
    mgt_status st;
    if (t->auto_augment == MGT_AUTO_AUGMENT_NONE) {
        st = mgt_resample_run(rs, v, &o);
    } else {
        /* the policies work on 8-bit pixels, as torchvision's do on the PIL image after the
           crop and flip */
        uint8_t *px = mgt_scratch_get(s, 1, (size_t)OW * OH * C);
        if (!px)
            return mgt_error_set(MGT_ERR_OOM, "transform: out of memory");
        mgt_resample_out o8 = {.u8 = px};
        st = mgt_resample_run(rs, v, &o8);
        if (st == MGT_OK)
            st = mgt_augment_policy(t, px, OW, OH, C, rng, s);
        if (st == MGT_OK) {
            const size_t plane = (size_t)OW * OH;
            for (int c = 0; c < C; c++)
                for (size_t i = 0; i < plane; i++)
                    out[c * plane + i] = px[i * C + c] * o.a[c] + o.b[c];
        }
    }
    if (st == MGT_OK && t->random_erase > 0)
        mgt_augment_erase(t->random_erase, out, OW, OH, C, rng);
    return st;
}

mgt_status mgt_transform_render(const mgt_transform *t, const mgt_geom *g, const mgt_image_view *v,
                                mgt_rng *rng, mgt_transform_scratch *s, float *out)
{
    mgt_resample rs;
    mgt_status st = mgt_resample_plan(g, t->interp, t->channels, s, &rs);
    if (st == MGT_OK)
        st = mgt_transform_finish(t, &rs, v, rng, s, out);
    return st;
}

/* ---- whole-image entry points ---- */

static mgt_image_view whole_view(const mgt_image *img)
{
    return (mgt_image_view){.px = img->pixels,
                            .stride = (size_t)img->w * img->c,
                            .w = img->w,
                            .h = img->h,
                            .full_w = img->w,
                            .full_h = img->h,
                            .c = img->c,
                            .scale = 1};
}

mgt_status mgt_transform_apply(const mgt_transform *t, const mgt_image *img, mgt_rng *rng,
                               mgt_transform_scratch *scratch, float *out)
{
    if (img->c != t->channels)
        return mgt_error_set(MGT_ERR_INVALID, "transform: image has %d channels, transform %d",
                             img->c, t->channels);
    if (img->w < 1 || img->h < 1 || !img->pixels)
        return mgt_error_set(MGT_ERR_INVALID, "transform: empty image");
    mgt_transform_scratch local = {0};
    if (!scratch)
        scratch = &local;
    mgt_geom g;
    mgt_status st = mgt_transform_geometry(t, img->w, img->h, rng, &g);
    mgt_image_view v = whole_view(img);
    if (st == MGT_OK)
        st = mgt_transform_render(t, &g, &v, rng, scratch, out);
    mgt_transform_scratch_free(&local);
    return st;
}

mgt_status mgt_image_resize(const mgt_image *img, const mgt_crop *box, int out_w, int out_h,
                            mgt_transform_scratch *scratch, float *out)
{
    return mgt_image_resize_with(img, box, out_w, out_h, MGT_INTERP_BILINEAR, scratch, out);
}

mgt_status mgt_image_resize_with(const mgt_image *img, const mgt_crop *box, int out_w, int out_h,
                                 mgt_interp interp, mgt_transform_scratch *scratch, float *out)
{
    if (!img->pixels || img->w < 1 || img->h < 1 || img->c < 1 || img->c > 3)
        return mgt_error_set(MGT_ERR_INVALID, "resize: empty image");
    mgt_crop whole = {0, 0, img->h, img->w};
    if (!box)
        box = &whole;
    if (box->left < 0 || box->top < 0 || box->w < 1 || box->h < 1 || box->left + box->w > img->w ||
        box->top + box->h > img->h)
        return mgt_error_set(MGT_ERR_INVALID,
                             "resize: box %d,%d %dx%d is not inside the %dx%d image", box->left,
                             box->top, box->w, box->h, img->w, img->h);
    if (out_w < 1 || out_h < 1 || out_w > 65536 || out_h > 65536)
        return mgt_error_set(MGT_ERR_INVALID, "resize: output %dx%d", out_w, out_h);
    mgt_transform_scratch local = {0};
    if (!scratch)
        scratch = &local;
    mgt_geom g = {.box = {box->left, box->top, box->left + box->w, box->top + box->h},
                  .lim = {box->left, box->top, box->left + box->w, box->top + box->h},
                  .sw = out_w,
                  .sh = out_h,
                  .ow = out_w,
                  .oh = out_h};
    mgt_resample rs;
    mgt_status st = mgt_resample_plan(&g, interp, img->c, scratch, &rs);
    mgt_image_view v = whole_view(img);
    mgt_resample_out o = {.f = out, .a = {1, 1, 1}, .b = {0, 0, 0}};
    if (st == MGT_OK)
        st = mgt_resample_run(&rs, &v, &o);
    mgt_transform_scratch_free(&local);
    return st;
}
