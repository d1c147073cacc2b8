/* AugMix (torchvision 0.14's transforms.AugMix): chains of ops on the uint8 image, mixed in
   float32 with Dirichlet weights. Unlike the other policies, which act on PIL images, AugMix
   converts the image to a uint8 tensor first, so its ops are torchvision's tensor arithmetic,
   transcribed here: the affine ones build torchvision's grid (_gen_affine_grid: float32
   linspace, the theta product) and sample it as PyTorch's CPU grid_sample does (bilinear,
   zero padding, align_corners False), rounding half to even; the enhancers are _blend in
   float32, truncated; autocontrast, equalize, posterize and solarize as functional_tensor
   has them. The draws (Dirichlet samples, chain depths, ops, bins, signs) come from a source
   the caller gives: the sample's Philox stream in training, recorded torch draws in tests. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/internal.h"

/* AugMix's _augmentation_space with all_ops, in its dict's order */
static const mgt_aug_op augmix_ops[13] = {
    MGT_AUG_SHEAR_X,   MGT_AUG_SHEAR_Y,    MGT_AUG_TRANSLATE_X, MGT_AUG_TRANSLATE_Y,
    MGT_AUG_ROTATE,    MGT_AUG_POSTERIZE,  MGT_AUG_SOLARIZE,    MGT_AUG_AUTOCONTRAST,
    MGT_AUG_EQUALIZE,  MGT_AUG_BRIGHTNESS, MGT_AUG_COLOR,       MGT_AUG_CONTRAST,
    MGT_AUG_SHARPNESS,
};

/* torch.linspace(start, end, steps) in float32 (the scalar rule; see augment.c) */
static float lin(float start, float end, int steps, int i)
{
    float step = (end - start) / (float)(steps - 1);
    return i < steps / 2 ? start + step * (float)i : end - step * (float)(steps - i - 1);
}

/* ---- the affine ops: torchvision's grid through grid_sample ---- */

/* functional._get_inverse_affine_matrix, in double as Python computes it */
static void inverse_affine(double cx, double cy, double angle, double tx, double ty, double shx,
                           double shy, double m[6])
{
    const double deg = M_PI / 180.0;
    double rot = angle * deg, sx = shx * deg, sy = shy * deg;
    double a = cos(rot - sy) / cos(sy);
    double b = -cos(rot - sy) * tan(sx) / cos(sy) - sin(rot);
    double c = sin(rot - sy) / cos(sy);
    double d = -sin(rot - sy) * tan(sx) / cos(sy) + cos(rot);
    m[0] = d;
    m[1] = -b;
    m[2] = 0.0;
    m[3] = -c;
    m[4] = a;
    m[5] = 0.0;
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty);
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty);
    m[2] += cx;
    m[5] += cy;
}

/* functional_tensor.affine's _gen_affine_grid and grid_sample on each channel: out is the
   rounded (half to even) result. */
static void grid_affine(uint8_t *px, const uint8_t *src, int w, int h, int c, const double m[6])
{
    float th[6];
    for (int i = 0; i < 6; i++)
        th[i] = (float)m[i];
    /* rescaled_theta = theta^T / [0.5 w, 0.5 h]: [3][2] */
    float hw = 0.5f * (float)w, hh = 0.5f * (float)h;
    float r[3][2] = {{th[0] / hw, th[3] / hh}, {th[1] / hw, th[4] / hh}, {th[2] / hw, th[5] / hh}};
    /* grid_sample's unnormalize: (g + 1) * size / 2 - 0.5 */
    float sw = (float)w / 2, sh = (float)h / 2;
    for (int i = 0; i < h; i++) {
        float y = lin(-(float)h * 0.5f + 0.5f, (float)h * 0.5f + 0.5f - 1.0f, h, i);
        for (int j = 0; j < w; j++) {
            float x = lin(-(float)w * 0.5f + 0.5f, (float)w * 0.5f + 0.5f - 1.0f, w, j);
            /* base_grid [x, y, 1] bmm rescaled_theta */
            /* the product as the BLAS sgemm gives it (two roundings), then grid_sample's
               vector code, whose multiply-adds the compiler fused: the combination that
               matches torch 1.13 on every golden case (the other seven differ in 2 to 8) */
            float gx = (x * r[0][0] + y * r[1][0]) + r[2][0];
            float gy = (x * r[0][1] + y * r[1][1]) + r[2][1];
            float ix = fmaf(gx + 1.0f, sw, -0.5f), iy = fmaf(gy + 1.0f, sh, -0.5f);
            float xw = floorf(ix), yn = floorf(iy);
            float we = ix - xw, e = 1.0f - we, n = iy - yn, s = 1.0f - n;
            float nw = s * e, ne = s * we, sww = n * e, se = n * we;
            int x0 = (int)xw, y0 = (int)yn, x1 = x0 + 1, y1 = y0 + 1;
            bool in_w = x0 > -1 && x0<w, in_e = x1> - 1 && x1 < w;
            bool in_n = y0 > -1 && y0<h, in_s = y1> - 1 && y1 < h;
            for (int ch = 0; ch < c; ch++) {
                float vnw = in_w && in_n ? src[((size_t)y0 * w + x0) * c + ch] : 0.0f;
                float vne = in_e && in_n ? src[((size_t)y0 * w + x1) * c + ch] : 0.0f;
                float vsw = in_w && in_s ? src[((size_t)y1 * w + x0) * c + ch] : 0.0f;
                float vse = in_e && in_s ? src[((size_t)y1 * w + x1) * c + ch] : 0.0f;
                float v = fmaf(vse, se, fmaf(vsw, sww, fmaf(vne, ne, vnw * nw)));
                v = nearbyintf(v); /* torch.round: half to even */
                px[((size_t)i * w + j) * c + ch] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
        }
    }
}

/* ---- the enhancers: _blend(img1, img2, ratio) in float32, clamped, truncated ---- */

static uint8_t blend1(double ratio, uint8_t a, float b)
{
    /* torch multiplies by each Python float rounded to float32: ratio, and 1.0 - ratio as
       Python computes it */
    float v = (float)ratio * (float)a + (float)(1.0 - ratio) * b;
    v = v < 0 ? 0 : v > 255 ? 255 : v;
    return (uint8_t)v;
}

/* rgb_to_grayscale: (0.2989 r + 0.587 g + 0.114 b).to(uint8) */
static uint8_t gray_of(const uint8_t *p)
{
    float v = 0.2989f * (float)p[0] + 0.587f * (float)p[1];
    v = v + 0.114f * (float)p[2];
    return (uint8_t)v;
}

static void enhance(mgt_aug_op op, double ratio, uint8_t *px, const uint8_t *src, int w, int h,
                    int c)
{
    size_t np = (size_t)w * h;
    if (op == MGT_AUG_BRIGHTNESS) {
        for (size_t i = 0; i < np * c; i++)
            px[i] = blend1(ratio, src[i], 0.0f);
    } else if (op == MGT_AUG_COLOR) { /* one channel: unchanged, as PIL's */
        for (size_t i = 0; i < np; i++) {
            float g = c == 3 ? (float)gray_of(src + i * 3) : 0;
            for (int ch = 0; ch < c; ch++)
                px[i * c + ch] = c == 3 ? blend1(ratio, src[i * c + ch], g) : src[i * c + ch];
        }
    } else if (op == MGT_AUG_CONTRAST) {
        /* the mean of the (grey) image in float32: a sum of whole numbers, exact below 2^24 */
        float sum = 0;
        for (size_t i = 0; i < np; i++)
            sum += c == 3 ? (float)gray_of(src + i * 3) : (float)src[i];
        float mean = sum / (float)np;
        for (size_t i = 0; i < np * c; i++)
            px[i] = blend1(ratio, src[i], mean);
    } else { /* SHARPNESS: against the 3x3 [1 1 1; 1 5 1; 1 1 1] / 13 blur inside a 1 px border */
        if (w <= 2 || h <= 2) {
            memcpy(px, src, np * c);
            return;
        }
        const float k = 1.0f / 13.0f, k5 = 5.0f / 13.0f;
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++)
                for (int ch = 0; ch < c; ch++) {
                    size_t at = ((size_t)y * w + x) * c + ch;
                    float deg = src[at];
                    if (y > 0 && y < h - 1 && x > 0 && x < w - 1) {
                        float acc = 0;
                        for (int dy = -1; dy <= 1; dy++)
                            for (int dx = -1; dx <= 1; dx++)
                                acc += (float)src[at + ((ptrdiff_t)dy * w + dx) * c] *
                                       (dy == 0 && dx == 0 ? k5 : k);
                        deg = nearbyintf(acc); /* _cast_squeeze_out rounds, then uint8 */
                    }
                    px[at] = blend1(ratio, src[at], deg);
                }
    }
}

/* ---- the lookup ops ---- */

static void autocontrast_t(uint8_t *px, int w, int h, int c)
{
    size_t np = (size_t)w * h;
    for (int ch = 0; ch < c; ch++) {
        int lo = 255, hi = 0;
        for (size_t i = 0; i < np; i++) {
            int v = px[i * c + ch];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        /* bound / (max - min) is torch's reciprocal times 255, not a division (1.1383929
           for 255 / 224, where the division gives 1.1383928 and then 254.99998) */
        float mn = (float)lo, scale = (1.0f / ((float)hi - mn)) * 255.0f;
        if (!isfinite(scale)) {
            mn = 0;
            scale = 1;
        }
        for (size_t i = 0; i < np; i++) {
            float v = ((float)px[i * c + ch] - mn) * scale;
            px[i * c + ch] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
    }
}

/* _scale_channel: the histogram's lookup table, all integer */
static void equalize_t(uint8_t *px, int w, int h, int c)
{
    size_t np = (size_t)w * h;
    for (int ch = 0; ch < c; ch++) {
        long hist[256] = {0};
        for (size_t i = 0; i < np; i++)
            hist[px[i * c + ch]]++;
        long total = 0, last = 0;
        for (int v = 0; v < 256; v++)
            if (hist[v]) {
                total += hist[v];
                last = hist[v];
            }
        long step = (total - last) / 255;
        if (step == 0)
            continue;
        uint8_t lut[256];
        long cum = 0;
        for (int v = 0; v < 256; v++) { /* lut shifted by one: entry v uses the sum below v */
            long l = (cum + step / 2) / step;
            lut[v] = (uint8_t)(l > 255 ? 255 : l);
            cum += hist[v];
        }
        for (size_t i = 0; i < np; i++)
            px[i * c + ch] = lut[px[i * c + ch]];
    }
}

mgt_status mgt_augment_op_tensor(mgt_aug_op op, double mag, uint8_t *px, int w, int h, int c,
                                 mgt_transform_scratch *s)
{
    if (w < 1 || h < 1 || w > MGT_AUG_MAX_SIDE || h > MGT_AUG_MAX_SIDE || (c != 1 && c != 3))
        return mgt_error_set(MGT_ERR_INVALID, "augmix op %s: image %dx%dx%d", mgt_aug_op_name(op),
                             w, h, c);
    size_t bytes = (size_t)w * h * c;
    uint8_t *src = NULL;
    bool geometric = op >= MGT_AUG_SHEAR_X && op <= MGT_AUG_ROTATE;
    bool blend = op >= MGT_AUG_BRIGHTNESS && op <= MGT_AUG_SHARPNESS;
    if (geometric || blend) { /* a copy of the input the op reads while it writes px */
        if (s && s->img_cap[1] < bytes) {
            void *p = realloc(s->img[1], bytes);
            if (!p)
                return mgt_error_set(MGT_ERR_OOM, "augmix: host memory exhausted");
            s->img[1] = p;
            s->img_cap[1] = bytes;
            s->growths++;
        }
        src = s ? s->img[1] : malloc(bytes);
        if (!src)
            return mgt_error_set(MGT_ERR_OOM, "augmix: host memory exhausted");
        memcpy(src, px, bytes);
    }
    double m[6];
    switch (op) {
    case MGT_AUG_SHEAR_X:
    case MGT_AUG_SHEAR_Y: {
        /* F.affine(shear=[degrees(atan(mag)), 0] or its y twin, center=[0, 0]): the centre
           in torch's convention, the image's middle at 0 */
        double sh = atan(mag) * (180.0 / M_PI);
        inverse_affine(-w * 0.5, -h * 0.5, 0.0, 0.0, 0.0, op == MGT_AUG_SHEAR_X ? sh : 0.0,
                       op == MGT_AUG_SHEAR_Y ? sh : 0.0, m);
        grid_affine(px, src, w, h, c, m);
        break;
    }
    case MGT_AUG_TRANSLATE_X:
    case MGT_AUG_TRANSLATE_Y: {
        double t = (double)(int)mag; /* translate=[int(magnitude), 0] */
        inverse_affine(0, 0, 0.0, op == MGT_AUG_TRANSLATE_X ? t : 0,
                       op == MGT_AUG_TRANSLATE_Y ? t : 0, 0.0, 0.0, m);
        grid_affine(px, src, w, h, c, m);
        break;
    }
    case MGT_AUG_ROTATE: /* F.rotate: the matrix of -angle about the middle */
        inverse_affine(0, 0, -mag, 0, 0, 0.0, 0.0, m);
        grid_affine(px, src, w, h, c, m);
        break;
    case MGT_AUG_BRIGHTNESS:
    case MGT_AUG_COLOR:
    case MGT_AUG_CONTRAST:
    case MGT_AUG_SHARPNESS: enhance(op, 1.0 + mag, px, src, w, h, c); break;
    case MGT_AUG_POSTERIZE: {
        int bits = (int)mag;
        uint8_t mask = (uint8_t)(-(1 << (8 - bits)) & 0xff);
        for (size_t i = 0; i < bytes; i++)
            px[i] &= mask;
        break;
    }
    case MGT_AUG_SOLARIZE:
        for (size_t i = 0; i < bytes; i++)
            if ((double)px[i] >= (double)(float)mag)
                px[i] = (uint8_t)(255 - px[i]);
        break;
    case MGT_AUG_AUTOCONTRAST: autocontrast_t(px, w, h, c); break;
    case MGT_AUG_EQUALIZE: equalize_t(px, w, h, c); break;
    case MGT_AUG_INVERT:
        for (size_t i = 0; i < bytes; i++)
            px[i] = (uint8_t)(255 - px[i]);
        break;
    case MGT_AUG_IDENTITY:
    case MGT_AUG_OP_COUNT: break;
    }
    if (!s)
        free(src);
    return MGT_OK;
}

/* ---- AugMix ---- */

mgt_status mgt_augmix(int severity, const mgt_augmix_draws *d, uint8_t *px, int w, int h, int c,
                      mgt_transform_scratch *s)
{
    if (severity < 1 || severity > 10)
        return mgt_error_set(MGT_ERR_INVALID, "--augmix-severity %d: expected 1 to 10", severity);
    size_t bytes = (size_t)w * h * c;
    /* scratch: the chain's image (img[0]) beside the op's copy (img[1]), and the float mix */
    if (s->img_cap[0] < bytes) {
        void *p = realloc(s->img[0], bytes);
        if (!p)
            return mgt_error_set(MGT_ERR_OOM, "augmix: host memory exhausted");
        s->img[0] = p;
        s->img_cap[0] = bytes;
        s->growths++;
    }
    if (s->cap < bytes * sizeof(float)) {
        void *p = realloc(s->buf, bytes * sizeof(float));
        if (!p)
            return mgt_error_set(MGT_ERR_OOM, "augmix: host memory exhausted");
        s->buf = p;
        s->cap = bytes * sizeof(float);
        s->growths++;
    }
    uint8_t *aug = s->img[0];
    float *mix = s->buf;
    float m[2], wts[3];
    d->dirichlet(d->ctx, 2, m);
    d->dirichlet(d->ctx, 3, wts);
    for (int i = 0; i < 3; i++)
        wts[i] *= m[1];
    for (size_t i = 0; i < bytes; i++)
        mix[i] = m[0] * (float)px[i];
    for (int chain = 0; chain < 3; chain++) {
        memcpy(aug, px, bytes);
        int depth = (int)d->randint(d->ctx, 1, 4);
        for (int k = 0; k < depth; k++) {
            mgt_aug_op op = augmix_ops[d->randint(d->ctx, 0, 13)];
            bool sg;
            double mag = 0;
            bool has = op != MGT_AUG_AUTOCONTRAST && op != MGT_AUG_EQUALIZE;
            if (has)
                mag = mgt_augment_magnitude(MGT_AUTO_AUGMENT_AUGMIX, op, 10,
                                            (int)d->randint(d->ctx, 0, severity), h, w, &sg);
            else
                mgt_augment_magnitude(MGT_AUTO_AUGMENT_AUGMIX, op, 10, 0, h, w, &sg);
            if (sg && d->randint(d->ctx, 0, 2))
                mag *= -1.0;
            mgt_status st = mgt_augment_op_tensor(op, mag, aug, w, h, c, s);
            if (st != MGT_OK)
                return st;
        }
        for (size_t i = 0; i < bytes; i++)
            mix[i] = mix[i] + wts[chain] * (float)aug[i];
    }
    for (size_t i = 0; i < bytes; i++) /* .to(uint8): truncation */
        px[i] = (uint8_t)(mix[i] < 0 ? 0 : mix[i] > 255 ? 255 : mix[i]);
    return MGT_OK;
}

/* ---- draws from the sample's Philox stream ---- */

/* Dirichlet(1, ..., 1): normalised Exponential(1) draws, as Gamma(1) is */
static void philox_dirichlet(void *ctx, int n, float *out)
{
    double e[4], sum = 0;
    for (int i = 0; i < n; i++) {
        e[i] = -log(1.0 - (double)mgt_rng_uniform(ctx));
        sum += e[i];
    }
    for (int i = 0; i < n; i++)
        out[i] = (float)(e[i] / sum);
}

static int64_t philox_randint(void *ctx, int64_t lo, int64_t hi)
{
    return lo + (int64_t)mgt_rng_below(ctx, (uint64_t)(hi - lo));
}

mgt_augmix_draws mgt_augmix_draws_philox(mgt_rng *rng)
{
    return (mgt_augmix_draws){.dirichlet = philox_dirichlet, .randint = philox_randint, .ctx = rng};
}
