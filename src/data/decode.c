/* Image decoding. JPEG goes through libjpeg-turbo: TurboJPEG for headers and whole-image
   decodes (the library PIL links, at PIL's settings, so the pixels are torchvision's), and
   the libjpeg API of the same library for region decodes at a DCT scale, which TurboJPEG 2.1
   does not offer (3.0's tj3SetCroppingRegion is built on the same two calls,
   jpeg_skip_scanlines and jpeg_crop_scanline). PNG, BMP, GIF, TGA and PNM go through
   stb_image, compiled here alone, with its allocations served from a per-decoder arena. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jpeglib.h>
#include <turbojpeg.h>

#include "data/internal.h"

/* ---- stb_image, allocating from the decoding thread's arena ---- */

/* A decoder's arena for stb: every allocation of one image is a bump of a pointer, frees are
   no-ops, and the whole arena is reset before the next image. When an image asks for more
   than the arena holds, the rest comes from malloc and the arena grows to the image's total
   at the next reset, so that a steady state allocates nothing. Allocations carry their size
   (stb's realloc needs it). */
typedef struct stb_arena {
    uint8_t *base;
    size_t cap, used;
    size_t want; /* what the current image asked for, arena or not */
    uint64_t *growths;
} stb_arena;

static _Thread_local stb_arena *tl_arena;

#define ARENA_HDR 16

static void *stb_alloc(size_t n)
{
    stb_arena *a = tl_arena;
    if (!a)
        return malloc(n);
    size_t need = ARENA_HDR + ((n + 15) & ~(size_t)15);
    a->want += need;
    if (a->used + need > a->cap)
        return malloc(n);
    uint8_t *p = a->base + a->used;
    a->used += need;
    memcpy(p, &n, sizeof n);
    return p + ARENA_HDR;
}

static bool in_arena(const void *p)
{
    const stb_arena *a = tl_arena;
    return a && a->base && (const uint8_t *)p >= a->base && (const uint8_t *)p < a->base + a->cap;
}

static void stb_free(void *p)
{
    if (p && !in_arena(p))
        free(p);
}

static void *stb_realloc(void *p, size_t n)
{
    if (!p)
        return stb_alloc(n);
    if (!in_arena(p)) {
        if (tl_arena)
            tl_arena->want += ARENA_HDR + n;
        return realloc(p, n);
    }
    size_t old;
    memcpy(&old, (uint8_t *)p - ARENA_HDR, sizeof old);
    void *q = stb_alloc(n);
    if (q)
        memcpy(q, p, old < n ? old : n);
    return q;
}

#define STBI_MALLOC(sz) stb_alloc(sz)
#define STBI_REALLOC(p, newsz) stb_realloc(p, newsz)
#define STBI_FREE(p) stb_free(p)

#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_JPEG
#define STBI_ONLY_PNG
#define STBI_ONLY_BMP
#define STBI_ONLY_GIF
#define STBI_ONLY_PNM
#define STBI_ONLY_TGA
#define STBI_MAX_DIMENSIONS MGT_IMAGE_MAX_SIDE
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wunused-function"
#include <stb/stb_image.h>
#pragma GCC diagnostic pop

/* Resets the arena for the next image, growing it first when the last image overflowed. */
static bool arena_reset(stb_arena *a)
{
    if (a->want > a->cap) {
        size_t cap = a->want + a->want / 4;
        uint8_t *p = malloc(cap);
        if (!p)
            return false;
        free(a->base);
        a->base = p;
        a->cap = cap;
        (*a->growths)++;
    }
    a->used = 0;
    a->want = 0;
    return true;
}

/* ---- the decoder ---- */

typedef struct jerr_mgr {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
} jerr_mgr;

struct mgt_decoder {
    tjhandle tj;
    struct jpeg_decompress_struct ci;
    jerr_mgr jerr;
    bool ci_ready;
    uint8_t *px; /* the pixels of the last decode */
    size_t px_cap;
    uint8_t *row; /* one CMYK scanline of a region decode */
    size_t row_cap;
    stb_arena arena;
    uint8_t *stb_px; /* stb's result when it did not fit the arena: freed at the next decode */
    mgt_decoder_stats stats;
};

static void jerr_exit(j_common_ptr ci)
{
    jerr_mgr *e = (jerr_mgr *)ci->err;
    (*ci->err->format_message)(ci, e->msg);
    longjmp(e->jb, 1);
}

/* Warnings (corrupt data, extraneous bytes) are passed over as PIL does; libjpeg's default
   would print them. A truncated file is caught before decoding (jpeg_truncated). */
static void jerr_emit(j_common_ptr ci, int level)
{
    (void)ci;
    (void)level;
}

mgt_status mgt_decoder_create(mgt_decoder **out)
{
    *out = NULL;
    mgt_decoder *d = calloc(1, sizeof *d);
    if (!d)
        return mgt_error_set(MGT_ERR_OOM, "decoder: out of memory");
    d->arena.growths = &d->stats.growths;
    d->tj = tjInitDecompress();
    if (!d->tj) {
        free(d);
        return mgt_error_set(MGT_ERR_OOM, "decoder: TurboJPEG: %s", tjGetErrorStr2(NULL));
    }
    d->ci.err = jpeg_std_error(&d->jerr.pub);
    d->jerr.pub.error_exit = jerr_exit;
    d->jerr.pub.emit_message = jerr_emit;
    if (setjmp(d->jerr.jb)) {
        mgt_status st = mgt_error_set(MGT_ERR_OOM, "decoder: libjpeg: %s", d->jerr.msg);
        tjDestroy(d->tj);
        free(d);
        return st;
    }
    jpeg_create_decompress(&d->ci);
    d->ci_ready = true;
    *out = d;
    return MGT_OK;
}

void mgt_decoder_free(mgt_decoder *d)
{
    if (!d)
        return;
    if (d->ci_ready)
        jpeg_destroy_decompress(&d->ci);
    if (d->tj)
        tjDestroy(d->tj);
    free(d->px);
    free(d->row);
    free(d->arena.base);
    free(d->stb_px);
    free(d);
}

const mgt_decoder_stats *mgt_decoder_stats_get(const mgt_decoder *d) { return &d->stats; }

/* A fresh TurboJPEG handle. After a failed call, TurboJPEG 2.1's handle can report the
   next header as 0 x 0 (seen with a cut JPEG followed by a good one), so a failure always
   costs a new handle: rare, and a few microseconds. */
static mgt_status tj_reset(mgt_decoder *d)
{
    if (d->tj)
        tjDestroy(d->tj);
    d->tj = tjInitDecompress();
    if (!d->tj)
        return mgt_error_set(MGT_ERR_OOM, "decoder: TurboJPEG: %s", tjGetErrorStr2(NULL));
    return MGT_OK;
}

/* The decoder's pixel buffer at `bytes` or more; growing it is counted. */
static uint8_t *px_get(mgt_decoder *d, size_t bytes)
{
    if (bytes > d->px_cap) {
        size_t cap = bytes + bytes / 4;
        uint8_t *p = realloc(d->px, cap);
        if (!p)
            return NULL;
        d->px = p;
        d->px_cap = cap;
        d->stats.growths++;
    }
    return d->px;
}

mgt_status mgt_data_read_file(const char *path, uint8_t **buf, size_t *cap, size_t *len)
{
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return mgt_error_set(MGT_ERR_IO, "%s: %s", path, strerror(errno));
    mgt_status st = MGT_OK;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = mgt_error_set(MGT_ERR_IO, "%s: %s", path, strerror(errno));
        goto done;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = mgt_error_set(MGT_ERR_IO, "%s: not a regular file", path);
        goto done;
    }
    /* the decoders take an int length; no image we accept is anywhere near 1 GiB */
    if (sb.st_size > (1L << 30)) {
        st = mgt_error_set(MGT_ERR_INVALID, "%s: file too large (%lld bytes)", path,
                           (long long)sb.st_size);
        goto done;
    }
    size_t want = (size_t)sb.st_size;
    if (want + 1 > *cap) {
        size_t ncap = want + 1 + want / 4;
        uint8_t *p = realloc(*buf, ncap);
        if (!p) {
            st = mgt_error_set(MGT_ERR_OOM, "%s: out of memory reading %zu bytes", path, want);
            goto done;
        }
        *buf = p;
        *cap = ncap;
    }
    size_t got = 0;
    while (got < want) {
        ssize_t r = read(fd, *buf + got, want - got);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            st = mgt_error_set(MGT_ERR_IO, "%s: %s", path, strerror(errno));
            goto done;
        }
        if (r == 0)
            break; /* shrank under us: decode what is there */
        got += (size_t)r;
    }
    *len = got;
done:
    close(fd);
    return st;
}

/* PIL refuses a JPEG cut short ("image file is truncated"), so do we (libjpeg would fill
   the rest with grey): the last marker of a complete JPEG is EOI (FF D9); entropy-coded data
   never holds FF followed by D9 or DA (FF is stuffed as FF 00), so the marker met first
   walking back from the end is EOI for a whole file and SOS (FF DA) of the last scan for a
   truncated one. */
static bool jpeg_truncated(const uint8_t *b, size_t n)
{
    for (size_t i = n - 1; i > 2; i--) {
        if (b[i - 1] != 0xFF)
            continue;
        if (b[i] == 0xD9)
            return false;
        if (b[i] == 0xDA)
            return true;
    }
    return true;
}

static bool is_jpeg(const uint8_t *b, size_t n) { return n >= 3 && b[0] == 0xFF && b[1] == 0xD8; }

static mgt_status check_size(const char *name, int w, int h)
{
    if (w <= 0 || h <= 0)
        return mgt_error_set(MGT_ERR_INVALID, "%s: empty image", name);
    if ((long)w * h > MGT_IMAGE_MAX_PIXELS)
        return mgt_error_set(MGT_ERR_INVALID, "%s: %dx%d is more than %ld pixels", name, w, h,
                             MGT_IMAGE_MAX_PIXELS);
    if (w > MGT_IMAGE_MAX_SIDE || h > MGT_IMAGE_MAX_SIDE)
        return mgt_error_set(MGT_ERR_INVALID, "%s: %dx%d has a side over %d", name, w, h,
                             MGT_IMAGE_MAX_SIDE);
    return MGT_OK;
}

/* The header of a file's bytes; `whole` when they are the whole file (then a truncated
   JPEG is refused here, before anything is decoded). */
static mgt_status parse_header(mgt_decoder *d, const uint8_t *b, size_t len, const char *name,
                               bool whole, mgt_image_header *out)
{
    memset(out, 0, sizeof *out);
    if (len == 0)
        return mgt_error_set(MGT_ERR_INVALID, "%s: empty file", name);
    if (len > INT32_MAX)
        return mgt_error_set(MGT_ERR_INVALID, "%s: file too large", name);
    if (is_jpeg(b, len)) {
        int w, h, sub, cs;
        if (!d->tj && tj_reset(d) != MGT_OK)
            return MGT_ERR_OOM;
        if (tjDecompressHeader3(d->tj, b, (unsigned long)len, &w, &h, &sub, &cs) != 0) {
            mgt_status st = mgt_error_set(MGT_ERR_INVALID, "%s: %s", name, tjGetErrorStr2(d->tj));
            tj_reset(d);
            return st;
        }
        mgt_status st = check_size(name, w, h);
        if (st != MGT_OK)
            return st;
        if (whole && jpeg_truncated(b, len))
            return mgt_error_set(MGT_ERR_INVALID, "%s: truncated JPEG (no end marker)", name);
        out->w = w;
        out->h = h;
        out->c = cs == TJCS_GRAY ? 1 : 3;
        out->jpeg = true;
        out->cmyk = cs == TJCS_CMYK || cs == TJCS_YCCK;
        return MGT_OK;
    }
    int w = 0, h = 0, comp = 0;
    if (!arena_reset(&d->arena))
        return mgt_error_set(MGT_ERR_OOM, "%s: out of memory for stb_image", name);
    tl_arena = &d->arena;
    int ok = stbi_info_from_memory(b, (int)len, &w, &h, &comp);
    tl_arena = NULL;
    if (!ok)
        return mgt_error_set(MGT_ERR_INVALID, "%s: %s", name, stbi_failure_reason());
    mgt_status st = check_size(name, w, h);
    if (st != MGT_OK)
        return st;
    out->w = w;
    out->h = h;
    out->c = comp <= 2 ? 1 : 3;
    return MGT_OK;
}

mgt_status mgt_decoder_header(mgt_decoder *d, const void *bytes, size_t len, const char *name,
                              mgt_image_header *out)
{
    return parse_header(d, bytes, len, name, true, out);
}

/* PIL's convert("L"): L = R*299/1000 + G*587/1000 + B*114/1000, which PIL computes as
   19595/38470/7471 of 65536, rounded; in place (n pixels of 3 bytes -> n bytes). */
static void rgb_to_l(uint8_t *px, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned r = px[3 * i], g = px[3 * i + 1], b = px[3 * i + 2];
        px[i] = (uint8_t)((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
    }
}

/* A CMYK JPEG as PIL reads it: libjpeg hands over Adobe's inverted values, which PIL takes
   as "CMYK;I" (c = 255 - raw) and converts with cmyk2rgb: nk = 255 - k,
   out = nk - c * nk / 255 (rounded by PIL's MULDIV255). src and dst may be the same
   (4 bytes in, 3 out, forward). */
static void cmyk_to_rgb(uint8_t *dst, const uint8_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int nk = src[4 * i + 3]; /* 255 - (255 - raw k) */
        int v[3];
        for (int c = 0; c < 3; c++) {
            int cc = 255 - src[4 * i + c];
            int tmp = cc * nk + 128;
            int m = ((tmp >> 8) + tmp) >> 8;
            int o = nk - m;
            v[c] = o < 0 ? 0 : o > 255 ? 255 : o;
        }
        for (int c = 0; c < 3; c++)
            dst[3 * i + c] = (uint8_t)v[c];
    }
}

/* The whole image at full scale through TurboJPEG at its defaults (accurate integer IDCT,
   smooth upsampling), which are PIL's. */
static mgt_status jpeg_whole(mgt_decoder *d, const uint8_t *b, size_t len, const char *name,
                             int channels, const mgt_image_header *hd, mgt_image_view *v)
{
    int pf = hd->cmyk ? TJPF_CMYK : channels == 1 && hd->c == 1 ? TJPF_GRAY : TJPF_RGB;
    size_t n = (size_t)hd->w * hd->h;
    uint8_t *px = px_get(d, n * (size_t)tjPixelSize[pf]);
    if (!px)
        return mgt_error_set(MGT_ERR_OOM, "%s: out of memory for %dx%d pixels", name, hd->w, hd->h);
    if (tjDecompress2(d->tj, b, (unsigned long)len, px, hd->w, 0, hd->h, pf, 0) != 0 &&
        tjGetErrorCode(d->tj) != TJERR_WARNING) {
        mgt_status st = mgt_error_set(MGT_ERR_INVALID, "%s: %s", name, tjGetErrorStr2(d->tj));
        tj_reset(d);
        return st;
    }
    if (hd->cmyk)
        cmyk_to_rgb(px, px, n);
    if (channels == 1 && pf != TJPF_GRAY)
        rgb_to_l(px, n);
    d->stats.jpeg_whole++;
    *v = (mgt_image_view){.px = px,
                          .stride = (size_t)hd->w * channels,
                          .w = hd->w,
                          .h = hd->h,
                          .full_w = hd->w,
                          .full_h = hd->h,
                          .c = channels,
                          .scale = 1};
    return MGT_OK;
}

static int clampi(int x, int lo, int hi) { return x < lo ? lo : x > hi ? hi : x; }

/* Rows y0..y1 and columns x0..x1 (at least) of the image scaled by 1/scale, through the
   libjpeg API: jpeg_skip_scanlines skips the IDCT and colour conversion of the rows above,
   jpeg_crop_scanline those of the columns outside, and the decode stops after the last row
   wanted. Huffman decoding still reads every row above the last one (JPEG has no index).
   A column of margin on either side keeps libjpeg's smooth chroma upsampling from treating
   the cut as an image edge, so the pixels returned equal a whole decode's. A gray result
   from a colour file is libjpeg's Y channel, which is PIL's L up to rounding. */
static mgt_status jpeg_region(mgt_decoder *d, const uint8_t *b, size_t len, const char *name,
                              int channels, const mgt_image_header *hd, const mgt_decode_region *r,
                              mgt_image_view *v)
{
    struct jpeg_decompress_struct *ci = &d->ci;
    if (setjmp(d->jerr.jb)) {
        jpeg_abort_decompress(ci);
        return mgt_error_set(MGT_ERR_INVALID, "%s: %s", name, d->jerr.msg);
    }
    jpeg_mem_src(ci, b, (unsigned long)len);
    jpeg_read_header(ci, TRUE);
    ci->out_color_space = hd->cmyk ? JCS_CMYK : channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
    ci->scale_num = 1;
    ci->scale_denom = (unsigned)r->scale;
    jpeg_start_decompress(ci);
    int W = (int)ci->output_width, H = (int)ci->output_height;
    int x0 = clampi(r->x0 - 1, 0, W), x1 = clampi(r->x1 + 1, 0, W);
    int y0 = clampi(r->y0, 0, H), y1 = clampi(r->y1, 0, H);
    if (x1 <= x0 || y1 <= y0) {
        x0 = 0;
        x1 = W;
        y0 = 0;
        y1 = H;
    }
    JDIMENSION xoff = (JDIMENSION)x0, cw = (JDIMENSION)(x1 - x0);
    if ((int)cw < W)
        jpeg_crop_scanline(ci, &xoff, &cw);
    int oc = ci->output_components;
    int c = hd->cmyk ? channels : oc;
    size_t stride = (size_t)cw * c, rows = (size_t)(y1 - y0);
    uint8_t *px = px_get(d, stride * rows);
    if (hd->cmyk && (size_t)cw * 4 > d->row_cap) {
        uint8_t *p = realloc(d->row, (size_t)cw * 4);
        if (p) {
            d->row = p;
            d->row_cap = (size_t)cw * 4;
            d->stats.growths++;
        } else {
            px = NULL;
        }
    }
    if (!px) {
        jpeg_abort_decompress(ci);
        return mgt_error_set(MGT_ERR_OOM, "%s: out of memory for %ux%zu pixels", name, cw, rows);
    }
    if (y0 > 0)
        jpeg_skip_scanlines(ci, (JDIMENSION)y0);
    while ((int)ci->output_scanline < y1) {
        size_t at = ci->output_scanline - (size_t)y0;
        if (hd->cmyk) {
            JSAMPROW row = d->row;
            jpeg_read_scanlines(ci, &row, 1);
            uint8_t *dst = px + at * stride;
            cmyk_to_rgb(dst, d->row, cw);
            if (channels == 1)
                rgb_to_l(dst, cw);
        } else {
            JSAMPROW rowp[16];
            int k = 0;
            for (; k < 16 && (int)(ci->output_scanline + (unsigned)k) < y1; k++)
                rowp[k] = px + (at + (size_t)k) * stride;
            jpeg_read_scanlines(ci, rowp, (JDIMENSION)k);
        }
    }
    jpeg_abort_decompress(ci);
    d->stats.jpeg_region++;
    if (r->scale > 1)
        d->stats.jpeg_scaled++;
    *v = (mgt_image_view){.px = px,
                          .stride = stride,
                          .x0 = (int)xoff,
                          .y0 = y0,
                          .w = (int)cw,
                          .h = y1 - y0,
                          .full_w = W,
                          .full_h = H,
                          .c = channels,
                          .scale = r->scale};
    return MGT_OK;
}

/* Any other format through stb_image; the result lives in the arena (or, the first time an
   image is this large, in memory freed at the next decode). */
static mgt_status stb_whole(mgt_decoder *d, const uint8_t *b, size_t len, const char *name,
                            int channels, const mgt_image_header *hd, mgt_image_view *v)
{
    free(d->stb_px);
    d->stb_px = NULL;
    /* stb's own RGB->gray weights (77/150/29 of 256) are not PIL's: colour sources are
       decoded to RGB and converted here */
    int req = channels == 3 ? 3 : (hd->c == 1 ? 1 : 3);
    int w = 0, h = 0, comp = 0;
    if (!arena_reset(&d->arena))
        return mgt_error_set(MGT_ERR_OOM, "%s: out of memory for stb_image", name);
    tl_arena = &d->arena;
    stbi_uc *px = stbi_load_from_memory(b, (int)len, &w, &h, &comp, req);
    if (px && !in_arena(px))
        d->stb_px = px;
    tl_arena = NULL;
    if (!px)
        return mgt_error_set(MGT_ERR_INVALID, "%s: %s", name, stbi_failure_reason());
    if (channels == 1 && req == 3)
        rgb_to_l(px, (size_t)w * h);
    d->stats.stb++;
    *v = (mgt_image_view){.px = px,
                          .stride = (size_t)w * channels,
                          .w = w,
                          .h = h,
                          .full_w = w,
                          .full_h = h,
                          .c = channels,
                          .scale = 1};
    return MGT_OK;
}

mgt_status mgt_decoder_decode(mgt_decoder *d, const void *bytes, size_t len, const char *name,
                              int channels, const mgt_image_header *hd,
                              const mgt_decode_region *region, mgt_image_view *out)
{
    memset(out, 0, sizeof *out);
    if (channels != 1 && channels != 3)
        return mgt_error_set(MGT_ERR_INVALID, "%s: channels must be 1 or 3, not %d", name,
                             channels);
    mgt_image_header own;
    if (!hd) {
        mgt_status st = mgt_decoder_header(d, bytes, len, name, &own);
        if (st != MGT_OK)
            return st;
        hd = &own;
    }
    if (!hd->jpeg)
        return stb_whole(d, bytes, len, name, channels, hd, out);
    if (!region)
        return jpeg_whole(d, bytes, len, name, channels, hd, out);
    if (region->scale != 1 && region->scale != 2 && region->scale != 4 && region->scale != 8)
        return mgt_error_set(MGT_ERR_INVALID, "%s: DCT scale 1/%d is not 1, 1/2, 1/4 or 1/8", name,
                             region->scale);
    return jpeg_region(d, bytes, len, name, channels, hd, region, out);
}

/* ---- the one-call API: an owned copy of the whole image ---- */

mgt_status mgt_image_decode(const void *bytes, size_t len, const char *name, int channels,
                            mgt_image *out)
{
    memset(out, 0, sizeof *out);
    if (channels != 1 && channels != 3)
        return mgt_error_set(MGT_ERR_INVALID, "%s: channels must be 1 or 3, not %d", name,
                             channels);
    mgt_decoder *d;
    mgt_status st = mgt_decoder_create(&d);
    if (st != MGT_OK)
        return st;
    mgt_image_view v;
    st = mgt_decoder_decode(d, bytes, len, name, channels, NULL, NULL, &v);
    if (st == MGT_OK) {
        size_t n = (size_t)v.w * v.h * (size_t)channels;
        out->pixels = malloc(n);
        if (!out->pixels) {
            st = mgt_error_set(MGT_ERR_OOM, "%s: out of memory", name);
        } else {
            for (int y = 0; y < v.h; y++)
                memcpy(out->pixels + (size_t)y * v.w * channels, v.px + (size_t)y * v.stride,
                       (size_t)v.w * channels);
            out->w = v.w;
            out->h = v.h;
            out->c = channels;
        }
    }
    mgt_decoder_free(d);
    return st;
}

mgt_status mgt_image_load(const char *path, int channels, mgt_image *out)
{
    memset(out, 0, sizeof *out);
    uint8_t *buf = NULL;
    size_t cap = 0, len = 0;
    mgt_status st = mgt_data_read_file(path, &buf, &cap, &len);
    if (st == MGT_OK)
        st = mgt_image_decode(buf, len, path, channels, out);
    free(buf);
    return st;
}

void mgt_image_release(mgt_image *img)
{
    if (!img)
        return;
    free(img->pixels);
    memset(img, 0, sizeof *img);
}

/* Header sizes for mgt_dataset_probe: the first 64 KiB of a file are read (a JPEG's SOF and
   every other format's header sit well inside it). */
mgt_status mgt_data_file_header(mgt_decoder *d, const char *path, uint8_t **buf, size_t *cap,
                                mgt_image_header *out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return mgt_error_set(MGT_ERR_IO, "%s: %s", path, strerror(errno));
    size_t want = 1 << 16;
    if (*cap < want) {
        uint8_t *p = realloc(*buf, want);
        if (!p) {
            close(fd);
            return mgt_error_set(MGT_ERR_OOM, "%s: out of memory", path);
        }
        *buf = p;
        *cap = want;
    }
    ssize_t n = read(fd, *buf, want);
    int saved = errno;
    close(fd);
    if (n < 0)
        return mgt_error_set(MGT_ERR_IO, "%s: %s", path, strerror(saved));
    return parse_header(d, *buf, (size_t)n, path, false, out);
}
