/* torchvision's transforms on decoded images: RandomResizedCrop, RandomCrop with padding,
   Resize + CenterCrop, RandomHorizontalFlip, ToTensor + Normalize, fused into one pass that
   writes float CHW. The resampling is PIL's bilinear filter, done in float. */
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
    s->buf = NULL;
    s->cap = 0;
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

/* ---- resampling ---- */

/* PIL's bilinear kernel ("triangle"); support 1 before widening. */
static double triangle(double x)
{
    if (x < 0)
        x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* The taps of one axis: output pixel o reads source pixels first[o] .. first[o]+count[o]-1
   with weights wt[o*ksize ...]. As PIL's precompute_coeffs: box of bsize source pixels
   starting at b0 mapped onto `osize` outputs; the filter widens by the scale when
   shrinking (antialias); windows clamp to the box and weights renormalise. Only outputs
   o0 .. o0+n-1 are computed. */
typedef struct axis {
    int ksize;
    int *first, *count;
    float *wt;
} axis;

static int axis_ksize(int bsize, int osize)
{
    if (bsize == osize)
        return 1;
    double scale = (double)bsize / osize;
    double support = scale > 1.0 ? scale : 1.0;
    return (int)ceil(support) * 2 + 1;
}

static void axis_weights(axis *a, int b0, int bsize, int osize, int o0, int n)
{
    if (bsize == osize) { /* identity: PIL skips the pass */
        for (int k = 0; k < n; k++) {
            a->first[k] = b0 + o0 + k;
            a->count[k] = 1;
            a->wt[k] = 1.0f;
        }
        return;
    }
    double scale = (double)bsize / osize;
    double fscale = scale > 1.0 ? scale : 1.0;
    double support = fscale, ss = 1.0 / fscale;
    for (int k = 0; k < n; k++) {
        int o = o0 + k;
        double center = (o + 0.5) * scale;
        int xmin = (int)(center - support + 0.5);
        if (xmin < 0)
            xmin = 0;
        int xmax = (int)(center + support + 0.5);
        if (xmax > bsize)
            xmax = bsize;
        int cnt = xmax - xmin;
        if (cnt > a->ksize)
            cnt = a->ksize;
        double total = 0;
        for (int x = 0; x < cnt; x++)
            total += triangle((x + xmin - center + 0.5) * ss);
        float *dst = a->wt + (size_t)k * a->ksize;
        for (int x = 0; x < cnt; x++) {
            double w = triangle((x + xmin - center + 0.5) * ss);
            dst[x] = (float)(total != 0.0 ? w / total : 0.0);
        }
        a->first[k] = b0 + xmin;
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

static void *scratch_get(mgt_transform_scratch *s, size_t bytes)
{
    if (bytes > s->cap) {
        void *p = realloc(s->buf, bytes);
        if (!p)
            return NULL;
        s->buf = p;
        s->cap = bytes;
    }
    return s->buf;
}

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

/* The fused core. The source box (bx, by, bw, bh) of img is scaled to sw x sh; the output
   is the size x size window at (wx, wy) of the scaled image (pixels outside it are zero
   before normalisation, torchvision's fill), optionally mirrored, normalised into CHW. */
static mgt_status render(const mgt_image *img, const float a[3], const float b[3], int bx, int by,
                         int bw, int bh, int sw, int sh, int wx, int wy, int OW, int OH, bool flip,
                         mgt_transform_scratch *scratch, float *out)
{
    const int C = img->c;
    /* outputs inside the scaled image: columns [cx0, cx1), rows [cy0, cy1) of the window */
    int cx0 = wx < 0 ? -wx : 0, cy0 = wy < 0 ? -wy : 0;
    int cx1 = sw - wx < OW ? sw - wx : OW, cy1 = sh - wy < OH ? sh - wy : OH;
    bool empty = cx1 <= cx0 || cy1 <= cy0;
    bool partial = empty || cx0 > 0 || cy0 > 0 || cx1 < OW || cy1 < OH;
    if (partial)
        for (int c = 0; c < C; c++) {
            float *o = out + (size_t)c * OW * OH;
            for (size_t i = 0; i < (size_t)OW * OH; i++)
                o[i] = b[c];
        }
    if (empty)
        return MGT_OK;
    int nx = cx1 - cx0, ny = cy1 - cy0;

    axis ax = {.ksize = axis_ksize(bw, sw)}, ay = {.ksize = axis_ksize(bh, sh)};
    size_t off_ax_first = 0;
    size_t off_ax_count = align64(off_ax_first + sizeof(int) * nx);
    size_t off_ax_wt = align64(off_ax_count + sizeof(int) * nx);
    size_t off_ay_first = align64(off_ax_wt + sizeof(float) * nx * ax.ksize);
    size_t off_ay_count = align64(off_ay_first + sizeof(int) * ny);
    size_t off_ay_wt = align64(off_ay_count + sizeof(int) * ny);
    size_t off_acc = align64(off_ay_wt + sizeof(float) * ny * ay.ksize);
    /* one source row in float (RGB only), padded so a 4-wide load at the last pixel stays
       inside */
    size_t off_srow = align64(off_acc + sizeof(float) * nx * C);
    size_t off_tmp = align64(off_srow + sizeof(float) * ((size_t)bw * 3 + 4));
    /* the horizontal pass keeps every source row the vertical taps touch: at most bh */
    size_t bytes = off_tmp + sizeof(float) * (size_t)bh * nx * C;
    mgt_transform_scratch local = {0};
    if (!scratch)
        scratch = &local;
    char *base = scratch_get(scratch, bytes);
    if (!base)
        return mgt_error_set(MGT_ERR_OOM, "transform: out of memory (%zu bytes)", bytes);
    ax.first = (int *)(base + off_ax_first);
    ax.count = (int *)(base + off_ax_count);
    ax.wt = (float *)(base + off_ax_wt);
    ay.first = (int *)(base + off_ay_first);
    ay.count = (int *)(base + off_ay_count);
    ay.wt = (float *)(base + off_ay_wt);
    float *acc = (float *)(base + off_acc);
    float *srow = (float *)(base + off_srow);
    float *tmp = (float *)(base + off_tmp);

    axis_weights(&ax, bx, bw, sw, wx + cx0, nx);
    axis_weights(&ay, by, bh, sh, wy + cy0, ny);
    int r0 = ay.first[0], r1 = ay.first[0];
    for (int k = 0; k < ny; k++) {
        if (ay.first[k] < r0)
            r0 = ay.first[k];
        if (ay.first[k] + ay.count[k] > r1)
            r1 = ay.first[k] + ay.count[k];
    }

    /* horizontal pass over the rows r0..r1-1: tmp[row][x][c] */
    const size_t stride = (size_t)img->w * C;
    int c0 = ax.first[0], c1 = ax.first[0]; /* source columns the taps touch */
    for (int k = 0; k < nx; k++) {
        if (ax.first[k] < c0)
            c0 = ax.first[k];
        if (ax.first[k] + ax.count[k] > c1)
            c1 = ax.first[k] + ax.count[k];
    }
    for (int r = r0; r < r1; r++) {
        const uint8_t *src = img->pixels + (size_t)r * stride;
        float *dst = tmp + (size_t)(r - r0) * nx * C;
        if (C == 3) {
            /* a pixel is one 4-wide multiply-add per tap (the 4th lane is the next pixel's
               red, never stored) */
            const uint8_t *s8 = src + (size_t)c0 * 3;
            size_t n = (size_t)(c1 - c0) * 3;
            for (size_t i = 0; i < n; i++)
                srow[i] = s8[i];
            for (size_t i = n; i < n + 4; i++)
                srow[i] = 0;
            for (int k = 0; k < nx; k++) {
                const float *w = ax.wt + (size_t)k * ax.ksize;
                const float *p = srow + (size_t)(ax.first[k] - c0) * 3;
                v4f sum = {0, 0, 0, 0};
                for (int x = 0; x < ax.count[k]; x++) {
                    v4f v, wv = {w[x], w[x], w[x], w[x]};
                    memcpy(&v, p + 3 * x, 16);
                    sum += wv * v;
                }
                dst[3 * k] = sum[0];
                dst[3 * k + 1] = sum[1];
                dst[3 * k + 2] = sum[2];
            }
        } else {
            for (int k = 0; k < nx; k++) {
                const float *w = ax.wt + (size_t)k * ax.ksize;
                const uint8_t *p = src + ax.first[k];
                float s0 = 0;
                for (int x = 0; x < ax.count[k]; x++)
                    s0 += w[x] * p[x];
                dst[k] = s0;
            }
        }
    }

    /* vertical pass (whole rows at a time, so the inner loop runs over contiguous floats),
       then mirror and normalise into CHW; the fill written above already sits wherever
       the mirrored interior does not land */
    const size_t plane = (size_t)OW * OH, rowlen = (size_t)nx * C;
    for (int k = 0; k < ny; k++) {
        const float *w = ay.wt + (size_t)k * ay.ksize;
        const float *rows = tmp + (size_t)(ay.first[k] - r0) * rowlen;
        int cnt = ay.count[k];
        for (size_t x = 0; x < rowlen; x++)
            acc[x] = 0;
        for (int y = 0; y < cnt; y++)
            axpy_row(acc, w[y], rows + (size_t)y * rowlen, rowlen);
        size_t orow = (size_t)(cy0 + k) * OW;
        for (int x = 0; x < nx; x++) {
            int ox = cx0 + x;
            if (flip)
                ox = OW - 1 - ox;
            for (int c = 0; c < C; c++)
                out[c * plane + orow + ox] = acc[(size_t)x * C + c] * a[c] + b[c];
        }
    }
    mgt_transform_scratch_free(&local);
    return MGT_OK;
}

mgt_status mgt_transform_apply(const mgt_transform *t, const mgt_image *img, mgt_rng *rng,
                               mgt_transform_scratch *scratch, float *out)
{
    if (img->c != t->channels)
        return mgt_error_set(MGT_ERR_INVALID, "transform: image has %d channels, transform %d",
                             img->c, t->channels);
    if (img->w < 1 || img->h < 1 || !img->pixels)
        return mgt_error_set(MGT_ERR_INVALID, "transform: empty image");
    if (t->kind != MGT_TRANSFORM_RESIZE_CROP && !rng)
        return mgt_error_set(MGT_ERR_INVALID, "transform: a random transform needs an rng");
    const int S = t->size;
    float a[3], b[3];
    for (int c = 0; c < t->channels; c++) {
        a[c] = 1.0f / (255.0f * t->std[c]);
        b[c] = -t->mean[c] / t->std[c];
    }
    mgt_draws d = {0};
    if (rng)
        d = mgt_draws_philox(rng);
    switch (t->kind) {
    case MGT_TRANSFORM_RRC: {
        mgt_crop c;
        mgt_transform_rrc_params(&d, img->w, img->h, t->scale_min, t->scale_max, t->ratio_min,
                                 t->ratio_max, &c);
        bool flip = t->hflip && mgt_rng_uniform(rng) < 0.5f;
        return render(img, a, b, c.left, c.top, c.w, c.h, S, S, 0, 0, S, S, flip, scratch, out);
    }
    case MGT_TRANSFORM_PAD_CROP: {
        int p = t->padding;
        long ph = (long)img->h + 2L * p, pw = (long)img->w + 2L * p;
        long i = 0, j = 0;
        /* RandomCrop.get_params: no draw when the padded image is exactly the crop; where
           it is smaller (torchvision raises) the crop is centred on it */
        if (!(ph == S && pw == S)) {
            i = ph >= S ? d.randint(d.ctx, 0, ph - S + 1) : -((S - ph) / 2);
            j = pw >= S ? d.randint(d.ctx, 0, pw - S + 1) : -((S - pw) / 2);
        }
        bool flip = t->hflip && mgt_rng_uniform(rng) < 0.5f;
        return render(img, a, b, 0, 0, img->w, img->h, img->w, img->h, (int)(j - p), (int)(i - p),
                      S, S, flip, scratch, out);
    }
    case MGT_TRANSFORM_RESIZE_CROP: {
        int sw, sh;
        mgt_transform_resize_size(img->w, img->h, t->resize, &sw, &sh);
        mgt_crop c;
        mgt_transform_center_crop(sw, sh, S, &c);
        return render(img, a, b, 0, 0, img->w, img->h, sw, sh, c.left, c.top, S, S, false, scratch,
                      out);
    }
    }
    return mgt_error_set(MGT_ERR_INVALID, "transform: unknown kind %d", (int)t->kind);
}

mgt_status mgt_image_resize(const mgt_image *img, const mgt_crop *box, int out_w, int out_h,
                            mgt_transform_scratch *scratch, float *out)
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
    const float a[3] = {1, 1, 1}, b[3] = {0, 0, 0};
    return render(img, a, b, box->left, box->top, box->w, box->h, out_w, out_h, 0, 0, out_w, out_h,
                  false, scratch, out);
}
