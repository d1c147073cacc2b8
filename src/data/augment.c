/* torchvision's automatic augmentation (TrivialAugmentWide, RandAugment, AutoAugment's
   ImageNet policy) and RandomErasing. The ops are torchvision 0.14's _apply_op on a PIL
   image, so each is PIL's arithmetic, transcribed: affine transforms as ImagingTransform
   (the 16.16 fixed-point nearest path, the generic bilinear and bicubic filters, which
   truncate), rotations as Image.rotate (its matrix rounded to 15 decimals, and its exact
   transposes at 90 and 270 degrees), the enhancers as Image.blend against their degenerate
   images (float, truncated), SMOOTH as the 3x3 filter, and the ImageOps lookup tables. The
   random choices are drawn from the sample's Philox stream in torchvision's order. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/internal.h"

/* ---- names ---- */

static const char *const op_names[MGT_AUG_OP_COUNT] = {
    "Identity",  "ShearX",     "ShearY",       "TranslateX", "TranslateY",
    "Rotate",    "Brightness", "Color",        "Contrast",   "Sharpness",
    "Posterize", "Solarize",   "AutoContrast", "Equalize",   "Invert",
};

const char *mgt_aug_op_name(mgt_aug_op op)
{
    return op >= 0 && op < MGT_AUG_OP_COUNT ? op_names[op] : "?";
}

mgt_status mgt_aug_op_parse(const char *s, mgt_aug_op *out)
{
    for (int i = 0; i < MGT_AUG_OP_COUNT; i++)
        if (strcmp(s, op_names[i]) == 0) {
            *out = (mgt_aug_op)i;
            return MGT_OK;
        }
    return mgt_error_set(MGT_ERR_INVALID, "'%s' is not one of torchvision's augmentation ops", s);
}

static const char *const interp_names[] = {"bilinear", "nearest", "bicubic"};
static const char *const policy_names[] = {"none",    "ta_wide", "ra",    "imagenet",
                                           "cifar10", "svhn",    "augmix"};

const char *mgt_interp_name(mgt_interp m)
{
    return m >= 0 && m <= MGT_INTERP_BICUBIC ? interp_names[m] : "?";
}

const char *mgt_auto_augment_name(mgt_auto_augment a)
{
    return a >= 0 && a <= MGT_AUTO_AUGMENT_AUGMIX ? policy_names[a] : "?";
}

mgt_status mgt_interp_parse(const char *s, mgt_interp *out)
{
    for (int i = 0; i <= MGT_INTERP_BICUBIC; i++)
        if (strcmp(s, interp_names[i]) == 0) {
            *out = (mgt_interp)i;
            return MGT_OK;
        }
    return mgt_error_set(MGT_ERR_INVALID,
                         "--interpolation '%s': expected bilinear, bicubic or nearest", s);
}

mgt_status mgt_auto_augment_parse(const char *s, mgt_auto_augment *out)
{
    for (int i = 0; i <= MGT_AUTO_AUGMENT_AUGMIX; i++)
        if (strcmp(s, policy_names[i]) == 0) {
            *out = (mgt_auto_augment)i;
            return MGT_OK;
        }
    return mgt_error_set(MGT_ERR_INVALID,
                         "--auto-augment '%s': expected ta_wide, ra, imagenet, cifar10, svhn, "
                         "augmix or none",
                         s);
}

/* ---- PIL's geometry ---- */

/* Python's math.degrees and math.radians, with CPython's constants */
static const double rad_to_deg = 180.0 / M_PI, deg_to_rad = M_PI / 180.0;

static int pil_floor(double v) { return v < 0.0 ? (int)floor(v) : (int)v; }
static int pil_coord(double v) { return v < 0.0 ? -1 : (int)v; }
static int clip_i(int x, int n) { return x < 0 ? 0 : x < n ? x : n - 1; }

/* Image.transform(size, AFFINE, a, resample, fillcolor=0) of src into dst (zeroed first):
   a maps an output pixel's centre to the source. */
static void pil_affine(uint8_t *dst, const uint8_t *src, int w, int h, int c, const double a[6],
                       mgt_interp m)
{
    const size_t stride = (size_t)w * c;
    memset(dst, 0, stride * h);
    if (m == MGT_INTERP_NEAREST) {
        if (a[1] == 0 && a[3] == 0) { /* ImagingScaleAffine */
            double xo = a[2] + a[0] * 0.5, yo = a[5] + a[4] * 0.5;
            int xin[MGT_AUG_MAX_SIDE]; /* mgt_augment_op checks w */
            int xmin = w, xmax = 0;
            for (int x = 0; x < w; x++) {
                int xi = pil_coord(xo);
                if (xi >= 0 && xi < w) {
                    xmax = x + 1;
                    if (x < xmin)
                        xmin = x;
                    xin[x] = xi;
                }
                xo += a[0];
            }
            for (int y = 0; y < h; y++) {
                int yi = pil_coord(yo);
                if (yi >= 0 && yi < h)
                    for (int x = xmin; x < xmax; x++)
                        memcpy(dst + (size_t)y * stride + (size_t)x * c,
                               src + (size_t)yi * stride + (size_t)xin[x] * c, (size_t)c);
                yo += a[4];
            }
            return;
        }
        bool fixed = true;
        const int cx[4] = {0, w, 0, w}, cy[4] = {0, h, h, 0};
        for (int k = 0; k < 4; k++)
            fixed = fixed && fabs(cx[k] * a[0] + cy[k] * a[1] + a[2]) < 32768.0 &&
                    fabs(cx[k] * a[3] + cy[k] * a[4] + a[5]) < 32768.0;
        if (fixed) { /* affine_fixed: 16.16 fixed point */
#define FIX(v) pil_floor((v)*65536.0 + 0.5)
            int a0 = FIX(a[0]), a1 = FIX(a[1]), a3 = FIX(a[3]), a4 = FIX(a[4]);
            int a2 = FIX(a[2] + a[0] * 0.5 + a[1] * 0.5), a5 = FIX(a[5] + a[3] * 0.5 + a[4] * 0.5);
#undef FIX
            for (int y = 0; y < h; y++) {
                int xx = a2, yy = a5;
                for (int x = 0; x < w; x++) {
                    int xi = xx >> 16;
                    if (xi >= 0 && xi < w) {
                        int yi = yy >> 16;
                        if (yi >= 0 && yi < h)
                            memcpy(dst + (size_t)y * stride + (size_t)x * c,
                                   src + (size_t)yi * stride + (size_t)xi * c, (size_t)c);
                    }
                    xx += a0;
                    yy += a3;
                }
                a2 += a1;
                a5 += a4;
            }
            return;
        }
        double xo = a[2] + a[1] * 0.5 + a[0] * 0.5, yo = a[5] + a[4] * 0.5 + a[3] * 0.5;
        for (int y = 0; y < h; y++) {
            double xx = xo, yy = yo;
            for (int x = 0; x < w; x++) {
                int xi = pil_coord(xx);
                if (xi >= 0 && xi < w) {
                    int yi = pil_coord(yy);
                    if (yi >= 0 && yi < h)
                        memcpy(dst + (size_t)y * stride + (size_t)x * c,
                               src + (size_t)yi * stride + (size_t)xi * c, (size_t)c);
                }
                xx += a[0];
                yy += a[3];
            }
            xo += a[1];
            yo += a[4];
        }
        return;
    }
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            double xin = a[0] * (x + 0.5) + a[1] * (y + 0.5) + a[2];
            double yin = a[3] * (x + 0.5) + a[4] * (y + 0.5) + a[5];
            if (xin < 0.0 || xin >= w || yin < 0.0 || yin >= h)
                continue; /* the fill */
            uint8_t *o = dst + (size_t)y * stride + (size_t)x * c;
            xin -= 0.5;
            yin -= 0.5;
            int xi = pil_floor(xin), yi = pil_floor(yin);
            double dx = xin - xi, dy = yin - yi;
            if (m == MGT_INTERP_BILINEAR) {
                int x0 = clip_i(xi, w) * c, x1 = clip_i(xi + 1, w) * c;
                const uint8_t *r0 = src + (size_t)clip_i(yi, h) * stride;
                const uint8_t *r1 =
                    yi + 1 >= 0 && yi + 1 < h ? src + (size_t)(yi + 1) * stride : NULL;
                for (int b = 0; b < c; b++) {
                    double v1 = r0[x0 + b] + (r0[x1 + b] - r0[x0 + b]) * dx;
                    double v2 = r1 ? r1[x0 + b] + (r1[x1 + b] - r1[x0 + b]) * dx : v1;
                    v1 = v1 + (v2 - v1) * dy;
                    o[b] = (uint8_t)v1;
                }
            } else {
                xi--;
                yi--;
                int xs[4];
                for (int k = 0; k < 4; k++)
                    xs[k] = clip_i(xi + k, w) * c;
                for (int b = 0; b < c; b++) {
                    double v[4];
                    for (int k = 0; k < 4; k++) {
                        if (k > 0 && !(yi + k >= 0 && yi + k < h)) {
                            v[k] = v[k - 1];
                            continue;
                        }
                        const uint8_t *r = src + (size_t)(k == 0 ? clip_i(yi, h) : yi + k) * stride;
                        double q1 = r[xs[0] + b], q2 = r[xs[1] + b], q3 = r[xs[2] + b],
                               q4 = r[xs[3] + b];
                        double p1 = q2, p2 = -q1 + q3, p3 = 2 * (q1 - q2) + q3 - q4,
                               p4 = -q1 + q2 - q3 + q4;
                        v[k] = p1 + dx * (p2 + dx * (p3 + dx * p4));
                    }
                    double p1 = v[1], p2 = -v[0] + v[2], p3 = 2 * (v[0] - v[1]) + v[2] - v[3],
                           p4 = -v[0] + v[1] - v[2] + v[3];
                    double r = p1 + dy * (p2 + dy * (p3 + dy * p4));
                    o[b] = r <= 0.0 ? 0 : r >= 255.0 ? 255 : (uint8_t)r;
                }
            }
        }
}

/* torchvision's _get_inverse_affine_matrix(center, angle, translate, scale=1, shear),
   operation for operation. */
static void tv_inverse_affine(double cx, double cy, double angle, double tx, double ty,
                              double shear_x, double shear_y, double m[6])
{
    double rot = angle * deg_to_rad, sx = shear_x * deg_to_rad, sy = shear_y * deg_to_rad;
    double a = cos(rot - sy) / cos(sy);
    double b = -cos(rot - sy) * tan(sx) / cos(sy) - sin(rot);
    double c = sin(rot - sy) / cos(sy);
    double d = -sin(rot - sy) * tan(sx) / cos(sy) + cos(rot);
    m[0] = d / 1.0;
    m[1] = -b / 1.0;
    m[2] = 0.0 / 1.0;
    m[3] = -c / 1.0;
    m[4] = a / 1.0;
    m[5] = 0.0 / 1.0;
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty);
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty);
    m[2] += cx;
    m[5] += cy;
}

/* Python's round(x, 15): the double nearest the decimal rounding of x's exact value;
   glibc's printf and strtod are both correctly rounded. */
static double round15(double x)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%.15f", x);
    return strtod(buf, NULL);
}

/* Python's float %: the result has the divisor's sign */
static double py_mod(double a, double b)
{
    double r = fmod(a, b);
    if (r != 0) {
        if ((b < 0) != (r < 0))
            r += b;
    } else {
        r = copysign(0.0, b);
    }
    return r;
}

/* Image.rotate(angle, resample, expand=False, center=None, fillcolor=0). */
static void pil_rotate(uint8_t *dst, const uint8_t *src, int w, int h, int c, double angle,
                       mgt_interp m)
{
    angle = py_mod(angle, 360.0);
    const size_t stride = (size_t)w * c;
    if (angle == 0) {
        memcpy(dst, src, stride * h);
        return;
    }
    if (angle == 180) {
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++)
                memcpy(dst + (size_t)(h - 1 - y) * stride + (size_t)(w - 1 - x) * c,
                       src + (size_t)y * stride + (size_t)x * c, (size_t)c);
        return;
    }
    if ((angle == 90 || angle == 270) && w == h) {
        /* ROTATE_90 (counter-clockwise): out(x'=y, y'=w-1-x) = in(x, y); ROTATE_270:
           out(x'=h-1-y, y'=x) */
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++) {
                int ox = angle == 90 ? y : h - 1 - y, oy = angle == 90 ? w - 1 - x : x;
                memcpy(dst + (size_t)oy * stride + (size_t)ox * c,
                       src + (size_t)y * stride + (size_t)x * c, (size_t)c);
            }
        return;
    }
    double cx = w / 2.0, cy = h / 2.0;
    double r = -(angle * deg_to_rad);
    double mt[6] = {round15(cos(r)), round15(sin(r)), 0.0, round15(-sin(r)), round15(cos(r)), 0.0};
    double x = -cx - 0, y = -cy - 0;
    double t2 = mt[0] * x + mt[1] * y + mt[2], t5 = mt[3] * x + mt[4] * y + mt[5];
    mt[2] = t2 + cx;
    mt[5] = t5 + cy;
    pil_affine(dst, src, w, h, c, mt, m);
}

/* ---- PIL's enhancers and lookup tables ---- */

/* Image.blend(degenerate, img, alpha) into img. */
static void pil_blend(uint8_t *img, const uint8_t *deg, size_t n, float alpha)
{
    if (alpha == 0.0f) {
        memcpy(img, deg, n);
        return;
    }
    if (alpha == 1.0f)
        return;
    if (alpha >= 0 && alpha <= 1.0f) {
        for (size_t i = 0; i < n; i++)
            img[i] = (uint8_t)((int)deg[i] + alpha * ((int)img[i] - (int)deg[i]));
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float t = (float)((int)deg[i] + alpha * ((int)img[i] - (int)deg[i]));
        img[i] = t <= 0.0f ? 0 : t >= 255.0f ? 255 : (uint8_t)t;
    }
}

static uint8_t pil_l(const uint8_t *p)
{
    return (uint8_t)((p[0] * 19595u + p[1] * 38470u + p[2] * 7471u + 0x8000u) >> 16);
}

/* ImageFilter.SMOOTH: the 3x3 kernel (1 1 1, 1 5 1, 1 1 1) / 13 in float with PIL's
   rounding, the border rows and columns copied. */
static void pil_smooth(uint8_t *dst, const uint8_t *src, int w, int h, int c)
{
    const size_t stride = (size_t)w * c;
    memcpy(dst, src, stride * h);
    if (w < 3 || h < 3)
        return;
    const float k1 = 1.0f / 13.0f, k5 = 5.0f / 13.0f;
    const float kern[9] = {k1, k1, k1, k1, k5, k1, k1, k1, k1};
    for (int y = 1; y < h - 1; y++) {
        const uint8_t *rm = src + (size_t)(y - 1) * stride, *r0 = src + (size_t)y * stride,
                      *rp = src + (size_t)(y + 1) * stride;
        uint8_t *o = dst + (size_t)y * stride;
        for (int x = 1; x < w - 1; x++)
            for (int b = 0; b < c; b++) {
                size_t i = (size_t)x * c + (size_t)b, d = (size_t)c;
                float ss = 0.5f;
                ss += (float)rp[i - d] * kern[0] + (float)rp[i] * kern[1] +
                      (float)rp[i + d] * kern[2];
                ss += (float)r0[i - d] * kern[3] + (float)r0[i] * kern[4] +
                      (float)r0[i + d] * kern[5];
                ss += (float)rm[i - d] * kern[6] + (float)rm[i] * kern[7] +
                      (float)rm[i + d] * kern[8];
                o[i] = ss <= 0.0f ? 0 : ss >= 255.0f ? 255 : (uint8_t)ss;
            }
    }
}

static void apply_lut(uint8_t *px, size_t npix, int c, const int lut[][256])
{
    for (size_t i = 0; i < npix; i++)
        for (int b = 0; b < c; b++) {
            int v = lut[b][px[i * c + b]];
            px[i * c + b] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
}

static void histograms(const uint8_t *px, size_t npix, int c, long hist[][256])
{
    memset(hist, 0, sizeof(long) * 256 * (size_t)c);
    for (size_t i = 0; i < npix; i++)
        for (int b = 0; b < c; b++)
            hist[b][px[i * c + b]]++;
}

static void autocontrast(uint8_t *px, size_t npix, int c)
{
    long hist[3][256];
    int lut[3][256];
    histograms(px, npix, c, hist);
    for (int b = 0; b < c; b++) {
        int lo = 0, hi = 255;
        while (lo < 255 && !hist[b][lo])
            lo++;
        while (hi > 0 && !hist[b][hi])
            hi--;
        if (hi <= lo) {
            for (int i = 0; i < 256; i++)
                lut[b][i] = i;
            continue;
        }
        double scale = 255.0 / (hi - lo), offset = -lo * scale;
        for (int i = 0; i < 256; i++) {
            int v = (int)(i * scale + offset);
            lut[b][i] = v < 0 ? 0 : v > 255 ? 255 : v;
        }
    }
    apply_lut(px, npix, c, (const int(*)[256])lut);
}

static void equalize(uint8_t *px, size_t npix, int c)
{
    long hist[3][256];
    int lut[3][256];
    histograms(px, npix, c, hist);
    for (int b = 0; b < c; b++) {
        long total = 0, last = 0;
        int nonzero = 0;
        for (int i = 0; i < 256; i++)
            if (hist[b][i]) {
                nonzero++;
                total += hist[b][i];
                last = hist[b][i];
            }
        long step = nonzero <= 1 ? 0 : (total - last) / 255;
        if (!step) {
            for (int i = 0; i < 256; i++)
                lut[b][i] = i;
            continue;
        }
        long n = step / 2;
        for (int i = 0; i < 256; i++) {
            long v = n / step;
            lut[b][i] = v > 255 ? 255 : (int)v;
            n += hist[b][i];
        }
    }
    apply_lut(px, npix, c, (const int(*)[256])lut);
}

mgt_status mgt_augment_op(mgt_aug_op op, double mag, mgt_interp interp, uint8_t *px, int w, int h,
                          int c, mgt_transform_scratch *s)
{
    if (w < 1 || h < 1 || w > MGT_AUG_MAX_SIDE || h > MGT_AUG_MAX_SIDE || (c != 1 && c != 3))
        return mgt_error_set(MGT_ERR_INVALID,
                             "augment: a %dx%dx%d image (sides 1..%d, 1 or 3 "
                             "channels)",
                             w, h, c, MGT_AUG_MAX_SIDE);
    const size_t npix = (size_t)w * h, n = npix * c;
    uint8_t *tmp = NULL;
    bool needs_tmp = op == MGT_AUG_SHEAR_X || op == MGT_AUG_SHEAR_Y || op == MGT_AUG_TRANSLATE_X ||
                     op == MGT_AUG_TRANSLATE_Y || op == MGT_AUG_ROTATE || op == MGT_AUG_COLOR ||
                     op == MGT_AUG_CONTRAST || op == MGT_AUG_SHARPNESS || op == MGT_AUG_BRIGHTNESS;
    if (needs_tmp && !(tmp = mgt_scratch_get(s, 2, n)))
        return mgt_error_set(MGT_ERR_OOM, "augment: out of memory");
    double m[6];
    switch (op) {
    case MGT_AUG_IDENTITY: break;
    case MGT_AUG_SHEAR_X:
    case MGT_AUG_SHEAR_Y: {
        /* F.affine(angle 0, translate 0, scale 1, shear=[degrees(atan(mag)), 0] (or the
           other way round), center=[0, 0]) */
        double sh = atan(mag) * rad_to_deg;
        tv_inverse_affine(0, 0, 0.0, 0, 0, op == MGT_AUG_SHEAR_X ? sh : 0.0,
                          op == MGT_AUG_SHEAR_Y ? sh : 0.0, m);
        memcpy(tmp, px, n);
        pil_affine(px, tmp, w, h, c, m, interp);
        break;
    }
    case MGT_AUG_TRANSLATE_X:
    case MGT_AUG_TRANSLATE_Y: {
        int t = (int)mag; /* int(magnitude) */
        tv_inverse_affine(w * 0.5, h * 0.5, 0.0, op == MGT_AUG_TRANSLATE_X ? t : 0,
                          op == MGT_AUG_TRANSLATE_Y ? t : 0, 0.0, 0.0, m);
        memcpy(tmp, px, n);
        pil_affine(px, tmp, w, h, c, m, interp);
        break;
    }
    case MGT_AUG_ROTATE:
        memcpy(tmp, px, n);
        pil_rotate(px, tmp, w, h, c, mag, interp);
        break;
    case MGT_AUG_BRIGHTNESS:
        memset(tmp, 0, n);
        pil_blend(px, tmp, n, (float)(1.0 + mag));
        break;
    case MGT_AUG_COLOR:
        if (c == 1)
            break; /* the degenerate image of a gray one is itself */
        for (size_t i = 0; i < npix; i++)
            tmp[3 * i] = tmp[3 * i + 1] = tmp[3 * i + 2] = pil_l(px + 3 * i);
        pil_blend(px, tmp, n, (float)(1.0 + mag));
        break;
    case MGT_AUG_CONTRAST: {
        /* ImageEnhance.Contrast: a flat image of int(mean(L) + 0.5) */
        double sum = 0;
        for (size_t i = 0; i < npix; i++)
            sum += c == 3 ? pil_l(px + 3 * i) : px[i];
        int mean = (int)(sum / (double)npix + 0.5);
        memset(tmp, mean, n);
        pil_blend(px, tmp, n, (float)(1.0 + mag));
        break;
    }
    case MGT_AUG_SHARPNESS:
        pil_smooth(tmp, px, w, h, c);
        pil_blend(px, tmp, n, (float)(1.0 + mag));
        break;
    case MGT_AUG_POSTERIZE: {
        int bits = (int)mag, lut[3][256];
        if (bits < 0 || bits > 8)
            return mgt_error_set(MGT_ERR_INVALID, "augment: posterize to %d bits", bits);
        int mask = ~((1 << (8 - bits)) - 1);
        for (int i = 0; i < 256; i++)
            lut[0][i] = lut[1][i] = lut[2][i] = i & mask;
        apply_lut(px, npix, c, (const int(*)[256])lut);
        break;
    }
    case MGT_AUG_SOLARIZE: {
        int lut[3][256];
        for (int i = 0; i < 256; i++)
            lut[0][i] = lut[1][i] = lut[2][i] = i < mag ? i : 255 - i;
        apply_lut(px, npix, c, (const int(*)[256])lut);
        break;
    }
    case MGT_AUG_AUTOCONTRAST: autocontrast(px, npix, c); break;
    case MGT_AUG_EQUALIZE: equalize(px, npix, c); break;
    case MGT_AUG_INVERT:
        for (size_t i = 0; i < n; i++)
            px[i] = (uint8_t)(255 - px[i]);
        break;
    default: return mgt_error_set(MGT_ERR_INVALID, "augment: unknown op %d", (int)op);
    }
    return MGT_OK;
}

/* ---- the policies' magnitudes ---- */

/* torch.linspace(start, end, steps) in float32, by torch's scalar rule (the lower half
   counted up from start, the upper half down from end). torch's vectorised loop computes
   a few of the middle values another way, so the last bit of those can differ from
   torchvision's on some CPUs: the tests compare within one ulp. */
static float linspace_at(float start, float end, int steps, int i)
{
    float step = (end - start) / (float)(steps - 1);
    return i < steps / 2 ? start + step * (float)i : end - step * (float)(steps - i - 1);
}

/* 8 - (torch.arange(bins) / ((bins - 1) / k)).round().int() */
static float posterize_at(int bins, double k, int i)
{
    float div = (float)((bins - 1) / k);
    return (float)(8 - (int)rintf((float)i / div));
}

/* The op's magnitude in bin i of `bins` for a policy, as _augmentation_space gives it
   (RandAugment's and AutoAugment's translations scale with the image: 150/331 of it);
   *signed_op: whether the sign is drawn. Ops without magnitudes give 0. */
float mgt_augment_magnitude(mgt_auto_augment pol, mgt_aug_op op, int bins, int i, int img_h,
                            int img_w, bool *signed_op)
{
    bool wide = pol == MGT_AUTO_AUGMENT_TA_WIDE;
    *signed_op = op >= MGT_AUG_SHEAR_X && op <= MGT_AUG_SHARPNESS;
    if (pol == MGT_AUTO_AUGMENT_AUGMIX) /* AugMix._augmentation_space */
        switch (op) {
        case MGT_AUG_SHEAR_X:
        case MGT_AUG_SHEAR_Y: return linspace_at(0.0f, 0.3f, bins, i);
        case MGT_AUG_TRANSLATE_X: return linspace_at(0.0f, (float)(img_w / 3.0), bins, i);
        case MGT_AUG_TRANSLATE_Y: return linspace_at(0.0f, (float)(img_h / 3.0), bins, i);
        case MGT_AUG_ROTATE: return linspace_at(0.0f, 30.0f, bins, i);
        case MGT_AUG_BRIGHTNESS:
        case MGT_AUG_COLOR:
        case MGT_AUG_CONTRAST:
        case MGT_AUG_SHARPNESS: return linspace_at(0.0f, 0.9f, bins, i);
        case MGT_AUG_POSTERIZE: return posterize_at(bins, 4.0, i) - 4.0f; /* 4 - round(...) */
        case MGT_AUG_SOLARIZE: return linspace_at(255.0f, 0.0f, bins, i);
        default: return 0.0f;
        }
    switch (op) {
    case MGT_AUG_SHEAR_X:
    case MGT_AUG_SHEAR_Y: return linspace_at(0.0f, wide ? 0.99f : 0.3f, bins, i);
    case MGT_AUG_TRANSLATE_X:
        return linspace_at(0.0f, wide ? 32.0f : (float)(150.0 / 331.0 * img_w), bins, i);
    case MGT_AUG_TRANSLATE_Y:
        return linspace_at(0.0f, wide ? 32.0f : (float)(150.0 / 331.0 * img_h), bins, i);
    case MGT_AUG_ROTATE: return linspace_at(0.0f, wide ? 135.0f : 30.0f, bins, i);
    case MGT_AUG_BRIGHTNESS:
    case MGT_AUG_COLOR:
    case MGT_AUG_CONTRAST:
    case MGT_AUG_SHARPNESS: return linspace_at(0.0f, wide ? 0.99f : 0.9f, bins, i);
    case MGT_AUG_POSTERIZE: return posterize_at(bins, wide ? 6.0 : 4.0, i);
    case MGT_AUG_SOLARIZE: return linspace_at(255.0f, 0.0f, bins, i);
    default: return 0.0f;
    }
}

/* The ops each policy draws from, in torchvision's order of its dict. */
static const mgt_aug_op ta_ops[14] = {
    MGT_AUG_IDENTITY,     MGT_AUG_SHEAR_X,   MGT_AUG_SHEAR_Y,    MGT_AUG_TRANSLATE_X,
    MGT_AUG_TRANSLATE_Y,  MGT_AUG_ROTATE,    MGT_AUG_BRIGHTNESS, MGT_AUG_COLOR,
    MGT_AUG_CONTRAST,     MGT_AUG_SHARPNESS, MGT_AUG_POSTERIZE,  MGT_AUG_SOLARIZE,
    MGT_AUG_AUTOCONTRAST, MGT_AUG_EQUALIZE,
};

static bool has_magnitudes(mgt_aug_op op)
{
    return op != MGT_AUG_IDENTITY && op != MGT_AUG_AUTOCONTRAST && op != MGT_AUG_EQUALIZE &&
           op != MGT_AUG_INVERT;
}

/* AutoAugmentPolicy.IMAGENET: 25 sub-policies of two (op, probability, magnitude bin of
   10; -1: none). */
const mgt_aa_step mgt_aa_imagenet[25][2] = {
    {{MGT_AUG_POSTERIZE, 0.4f, 8}, {MGT_AUG_ROTATE, 0.6f, 9}},
    {{MGT_AUG_SOLARIZE, 0.6f, 5}, {MGT_AUG_AUTOCONTRAST, 0.6f, -1}},
    {{MGT_AUG_EQUALIZE, 0.8f, -1}, {MGT_AUG_EQUALIZE, 0.6f, -1}},
    {{MGT_AUG_POSTERIZE, 0.6f, 7}, {MGT_AUG_POSTERIZE, 0.6f, 6}},
    {{MGT_AUG_EQUALIZE, 0.4f, -1}, {MGT_AUG_SOLARIZE, 0.2f, 4}},
    {{MGT_AUG_EQUALIZE, 0.4f, -1}, {MGT_AUG_ROTATE, 0.8f, 8}},
    {{MGT_AUG_SOLARIZE, 0.6f, 3}, {MGT_AUG_EQUALIZE, 0.6f, -1}},
    {{MGT_AUG_POSTERIZE, 0.8f, 5}, {MGT_AUG_EQUALIZE, 1.0f, -1}},
    {{MGT_AUG_ROTATE, 0.2f, 3}, {MGT_AUG_SOLARIZE, 0.6f, 8}},
    {{MGT_AUG_EQUALIZE, 0.6f, -1}, {MGT_AUG_POSTERIZE, 0.4f, 6}},
    {{MGT_AUG_ROTATE, 0.8f, 8}, {MGT_AUG_COLOR, 0.4f, 0}},
    {{MGT_AUG_ROTATE, 0.4f, 9}, {MGT_AUG_EQUALIZE, 0.6f, -1}},
    {{MGT_AUG_EQUALIZE, 0.0f, -1}, {MGT_AUG_EQUALIZE, 0.8f, -1}},
    {{MGT_AUG_INVERT, 0.6f, -1}, {MGT_AUG_EQUALIZE, 1.0f, -1}},
    {{MGT_AUG_COLOR, 0.6f, 4}, {MGT_AUG_CONTRAST, 1.0f, 8}},
    {{MGT_AUG_ROTATE, 0.8f, 8}, {MGT_AUG_COLOR, 1.0f, 2}},
    {{MGT_AUG_COLOR, 0.8f, 8}, {MGT_AUG_SOLARIZE, 0.8f, 7}},
    {{MGT_AUG_SHARPNESS, 0.4f, 7}, {MGT_AUG_INVERT, 0.6f, -1}},
    {{MGT_AUG_SHEAR_X, 0.6f, 5}, {MGT_AUG_EQUALIZE, 1.0f, -1}},
    {{MGT_AUG_COLOR, 0.4f, 0}, {MGT_AUG_EQUALIZE, 0.6f, -1}},
    {{MGT_AUG_EQUALIZE, 0.4f, -1}, {MGT_AUG_SOLARIZE, 0.2f, 4}},
    {{MGT_AUG_SOLARIZE, 0.6f, 5}, {MGT_AUG_AUTOCONTRAST, 0.6f, -1}},
    {{MGT_AUG_INVERT, 0.6f, -1}, {MGT_AUG_EQUALIZE, 1.0f, -1}},
    {{MGT_AUG_COLOR, 0.6f, 4}, {MGT_AUG_CONTRAST, 1.0f, 8}},
    {{MGT_AUG_EQUALIZE, 0.8f, -1}, {MGT_AUG_EQUALIZE, 0.6f, -1}},
};

/* AutoAugmentPolicy.CIFAR10: 25 sub-policies, as IMAGENET's. */
const mgt_aa_step mgt_aa_cifar10[25][2] = {
    {{MGT_AUG_INVERT, 0.1f, -1}, {MGT_AUG_CONTRAST, 0.2f, 6}},
    {{MGT_AUG_ROTATE, 0.7f, 2}, {MGT_AUG_TRANSLATE_X, 0.3f, 9}},
    {{MGT_AUG_SHARPNESS, 0.8f, 1}, {MGT_AUG_SHARPNESS, 0.9f, 3}},
    {{MGT_AUG_SHEAR_Y, 0.5f, 8}, {MGT_AUG_TRANSLATE_Y, 0.7f, 9}},
    {{MGT_AUG_AUTOCONTRAST, 0.5f, -1}, {MGT_AUG_EQUALIZE, 0.9f, -1}},
    {{MGT_AUG_SHEAR_Y, 0.2f, 7}, {MGT_AUG_POSTERIZE, 0.3f, 7}},
    {{MGT_AUG_COLOR, 0.4f, 3}, {MGT_AUG_BRIGHTNESS, 0.6f, 7}},
    {{MGT_AUG_SHARPNESS, 0.3f, 9}, {MGT_AUG_BRIGHTNESS, 0.7f, 9}},
    {{MGT_AUG_EQUALIZE, 0.6f, -1}, {MGT_AUG_EQUALIZE, 0.5f, -1}},
    {{MGT_AUG_CONTRAST, 0.6f, 7}, {MGT_AUG_SHARPNESS, 0.6f, 5}},
    {{MGT_AUG_COLOR, 0.7f, 7}, {MGT_AUG_TRANSLATE_X, 0.5f, 8}},
    {{MGT_AUG_EQUALIZE, 0.3f, -1}, {MGT_AUG_AUTOCONTRAST, 0.4f, -1}},
    {{MGT_AUG_TRANSLATE_Y, 0.4f, 3}, {MGT_AUG_SHARPNESS, 0.2f, 6}},
    {{MGT_AUG_BRIGHTNESS, 0.9f, 6}, {MGT_AUG_COLOR, 0.2f, 8}},
    {{MGT_AUG_SOLARIZE, 0.5f, 2}, {MGT_AUG_INVERT, 0.0f, -1}},
    {{MGT_AUG_EQUALIZE, 0.2f, -1}, {MGT_AUG_AUTOCONTRAST, 0.6f, -1}},
    {{MGT_AUG_EQUALIZE, 0.2f, -1}, {MGT_AUG_EQUALIZE, 0.6f, -1}},
    {{MGT_AUG_COLOR, 0.9f, 9}, {MGT_AUG_EQUALIZE, 0.6f, -1}},
    {{MGT_AUG_AUTOCONTRAST, 0.8f, -1}, {MGT_AUG_SOLARIZE, 0.2f, 8}},
    {{MGT_AUG_BRIGHTNESS, 0.1f, 3}, {MGT_AUG_COLOR, 0.7f, 0}},
    {{MGT_AUG_SOLARIZE, 0.4f, 5}, {MGT_AUG_AUTOCONTRAST, 0.9f, -1}},
    {{MGT_AUG_TRANSLATE_Y, 0.9f, 9}, {MGT_AUG_TRANSLATE_Y, 0.7f, 9}},
    {{MGT_AUG_AUTOCONTRAST, 0.9f, -1}, {MGT_AUG_SOLARIZE, 0.8f, 3}},
    {{MGT_AUG_EQUALIZE, 0.8f, -1}, {MGT_AUG_INVERT, 0.1f, -1}},
    {{MGT_AUG_TRANSLATE_Y, 0.7f, 9}, {MGT_AUG_AUTOCONTRAST, 0.9f, -1}},
};

/* AutoAugmentPolicy.SVHN: 25 sub-policies, as IMAGENET's. */
const mgt_aa_step mgt_aa_svhn[25][2] = {
    {{MGT_AUG_SHEAR_X, 0.9f, 4}, {MGT_AUG_INVERT, 0.2f, -1}},
    {{MGT_AUG_SHEAR_Y, 0.9f, 8}, {MGT_AUG_INVERT, 0.7f, -1}},
    {{MGT_AUG_EQUALIZE, 0.6f, -1}, {MGT_AUG_SOLARIZE, 0.6f, 6}},
    {{MGT_AUG_INVERT, 0.9f, -1}, {MGT_AUG_EQUALIZE, 0.6f, -1}},
    {{MGT_AUG_EQUALIZE, 0.6f, -1}, {MGT_AUG_ROTATE, 0.9f, 3}},
    {{MGT_AUG_SHEAR_X, 0.9f, 4}, {MGT_AUG_AUTOCONTRAST, 0.8f, -1}},
    {{MGT_AUG_SHEAR_Y, 0.9f, 8}, {MGT_AUG_INVERT, 0.4f, -1}},
    {{MGT_AUG_SHEAR_Y, 0.9f, 5}, {MGT_AUG_SOLARIZE, 0.2f, 6}},
    {{MGT_AUG_INVERT, 0.9f, -1}, {MGT_AUG_AUTOCONTRAST, 0.8f, -1}},
    {{MGT_AUG_EQUALIZE, 0.6f, -1}, {MGT_AUG_ROTATE, 0.9f, 3}},
    {{MGT_AUG_SHEAR_X, 0.9f, 4}, {MGT_AUG_SOLARIZE, 0.3f, 3}},
    {{MGT_AUG_SHEAR_Y, 0.8f, 8}, {MGT_AUG_INVERT, 0.7f, -1}},
    {{MGT_AUG_EQUALIZE, 0.9f, -1}, {MGT_AUG_TRANSLATE_Y, 0.6f, 6}},
    {{MGT_AUG_INVERT, 0.9f, -1}, {MGT_AUG_EQUALIZE, 0.6f, -1}},
    {{MGT_AUG_CONTRAST, 0.3f, 3}, {MGT_AUG_ROTATE, 0.8f, 4}},
    {{MGT_AUG_INVERT, 0.8f, -1}, {MGT_AUG_TRANSLATE_Y, 0.0f, 2}},
    {{MGT_AUG_SHEAR_Y, 0.7f, 6}, {MGT_AUG_SOLARIZE, 0.4f, 8}},
    {{MGT_AUG_INVERT, 0.6f, -1}, {MGT_AUG_ROTATE, 0.8f, 4}},
    {{MGT_AUG_SHEAR_Y, 0.3f, 7}, {MGT_AUG_TRANSLATE_X, 0.9f, 3}},
    {{MGT_AUG_SHEAR_X, 0.1f, 6}, {MGT_AUG_INVERT, 0.6f, -1}},
    {{MGT_AUG_SOLARIZE, 0.7f, 2}, {MGT_AUG_TRANSLATE_Y, 0.6f, 7}},
    {{MGT_AUG_SHEAR_Y, 0.8f, 4}, {MGT_AUG_INVERT, 0.8f, -1}},
    {{MGT_AUG_SHEAR_X, 0.7f, 9}, {MGT_AUG_TRANSLATE_Y, 0.8f, 3}},
    {{MGT_AUG_SHEAR_Y, 0.8f, 5}, {MGT_AUG_AUTOCONTRAST, 0.7f, -1}},
    {{MGT_AUG_SHEAR_X, 0.7f, 2}, {MGT_AUG_INVERT, 0.1f, -1}},
};

/* One op of a policy with its drawn sign. */
static mgt_status signed_op(mgt_aug_op op, double mag, bool sign_drawn_negative, mgt_interp interp,
                            uint8_t *px, int w, int h, int c, mgt_transform_scratch *s)
{
    if (sign_drawn_negative)
        mag *= -1.0;
    return mgt_augment_op(op, mag, interp, px, w, h, c, s);
}

mgt_status mgt_augment_policy(const mgt_transform *t, uint8_t *px, int w, int h, int c,
                              mgt_rng *rng, mgt_transform_scratch *s)
{
    bool sg;
    switch (t->auto_augment) {
    case MGT_AUTO_AUGMENT_NONE: return MGT_OK;
    case MGT_AUTO_AUGMENT_TA_WIDE: {
        /* TrivialAugmentWide.forward: op, then (when it has magnitudes) a bin of 31, then
           (when signed) the sign */
        mgt_aug_op op = ta_ops[mgt_rng_below(rng, 14)];
        double mag = 0.0;
        if (has_magnitudes(op))
            mag = mgt_augment_magnitude(t->auto_augment, op, 31, (int)mgt_rng_below(rng, 31), h, w,
                                        &sg);
        else
            mgt_augment_magnitude(t->auto_augment, op, 31, 0, h, w, &sg);
        bool neg = sg && mgt_rng_below(rng, 2);
        return signed_op(op, mag, neg, t->interp, px, w, h, c, s);
    }
    case MGT_AUTO_AUGMENT_RA: {
        /* RandAugment(num_ops=2, magnitude=ra_magnitude (9), num_magnitude_bins=31) */
        for (int k = 0; k < 2; k++) {
            mgt_aug_op op = ta_ops[mgt_rng_below(rng, 14)];
            double mag = mgt_augment_magnitude(t->auto_augment, op, 31, t->ra_magnitude, h, w, &sg);
            bool neg = sg && mgt_rng_below(rng, 2);
            mgt_status st = signed_op(op, mag, neg, t->interp, px, w, h, c, s);
            if (st != MGT_OK)
                return st;
        }
        return MGT_OK;
    }
    case MGT_AUTO_AUGMENT_AUGMIX: {
        mgt_augmix_draws d = mgt_augmix_draws_philox(rng);
        return mgt_augmix(t->augmix_severity, &d, px, w, h, c, s);
    }
    case MGT_AUTO_AUGMENT_IMAGENET:
    case MGT_AUTO_AUGMENT_CIFAR10:
    case MGT_AUTO_AUGMENT_SVHN: {
        /* AutoAugment.get_params: the sub-policy, two probabilities, two signs; then each
           op runs when its probability draw is <= p, negated when its sign draw is 0 */
        const mgt_aa_step(*pol)[2] = t->auto_augment == MGT_AUTO_AUGMENT_CIFAR10 ? mgt_aa_cifar10
                                     : t->auto_augment == MGT_AUTO_AUGMENT_SVHN  ? mgt_aa_svhn
                                                                                 : mgt_aa_imagenet;
        int id = (int)mgt_rng_below(rng, 25);
        float probs[2] = {mgt_rng_uniform(rng), mgt_rng_uniform(rng)};
        int signs[2] = {(int)mgt_rng_below(rng, 2), (int)mgt_rng_below(rng, 2)};
        for (int k = 0; k < 2; k++) {
            const mgt_aa_step *st = &pol[id][k];
            if (!(probs[k] <= st->p))
                continue;
            double mag = st->bin >= 0 ? mgt_augment_magnitude(t->auto_augment, st->op, 10, st->bin,
                                                              h, w, &sg)
                                      : 0.0;
            if (st->bin < 0)
                mgt_augment_magnitude(t->auto_augment, st->op, 10, 0, h, w, &sg);
            mgt_status r = signed_op(st->op, mag, sg && signs[k] == 0, t->interp, px, w, h, c, s);
            if (r != MGT_OK)
                return r;
        }
        return MGT_OK;
    }
    }
    return mgt_error_set(MGT_ERR_INVALID, "augment: unknown policy %d", (int)t->auto_augment);
}

/* ---- RandomErasing ---- */

int mgt_erase_params(const mgt_draws *d, int w, int h, double scale_lo, double scale_hi,
                     double ratio_lo, double ratio_hi, mgt_crop *out)
{
    double area = (double)h * w;
    float log_lo = logf((float)ratio_lo), log_hi = logf((float)ratio_hi);
    for (int attempt = 1; attempt <= 10; attempt++) {
        double erase_area = area * d->uniform(d->ctx, scale_lo, scale_hi);
        double aspect = (double)expf((float)d->uniform(d->ctx, log_lo, log_hi));
        int eh = (int)rint(sqrt(erase_area * aspect));
        int ew = (int)rint(sqrt(erase_area / aspect));
        if (!(eh < h && ew < w))
            continue;
        out->h = eh;
        out->w = ew;
        out->top = (int)d->randint(d->ctx, 0, (int64_t)h - eh + 1);
        out->left = (int)d->randint(d->ctx, 0, (int64_t)w - ew + 1);
        return attempt;
    }
    *out = (mgt_crop){0, 0, h, w};
    return 0;
}

void mgt_augment_erase(float p, float *chw, int w, int h, int c, mgt_rng *rng)
{
    /* RandomErasing(p, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0) */
    if (!(mgt_rng_uniform(rng) < p))
        return;
    mgt_draws d = mgt_draws_philox(rng);
    mgt_crop e;
    if (mgt_erase_params(&d, w, h, 0.02, 0.33, 0.3, 3.3, &e) == 0)
        return;
    for (int ch = 0; ch < c; ch++)
        for (int y = e.top; y < e.top + e.h; y++)
            memset(chw + (size_t)ch * w * h + (size_t)y * w + e.left, 0, sizeof(float) * e.w);
}
