/* Image decoding: the one translation unit that compiles stb_image, limited to the formats
   ImageFolder accepts and to a maximum size, with errors that carry the path and the reason. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/internal.h"

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
    /* stb takes an int length; no image we accept is anywhere near 1 GiB */
    if (sb.st_size > (1L << 30)) {
        st = mgt_error_set(MGT_ERR_INVALID, "%s: file too large (%lld bytes)", path,
                           (long long)sb.st_size);
        goto done;
    }
    size_t want = (size_t)sb.st_size;
    if (want + 1 > *cap) {
        uint8_t *p = realloc(*buf, want + 1);
        if (!p) {
            st = mgt_error_set(MGT_ERR_OOM, "%s: out of memory reading %zu bytes", path, want);
            goto done;
        }
        *buf = p;
        *cap = want + 1;
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

/* stb decodes a JPEG cut short without complaint (the missing data reads as zeros, a grey
   smear at the bottom). PIL refuses such a file ("image file is truncated"), so do we: the
   last marker of a complete JPEG is EOI (FF D9); entropy-coded data never holds FF followed
   by D9 or DA (FF is stuffed as FF 00), so the marker met first walking back from the end
   is EOI for a whole file and SOS (FF DA) of the last scan for a truncated one. */
static bool jpeg_truncated(const uint8_t *b, size_t n)
{
    if (n < 4 || b[0] != 0xFF || b[1] != 0xD8)
        return false; /* not a JPEG */
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

mgt_status mgt_image_decode(const void *bytes, size_t len, const char *name, int channels,
                            mgt_image *out)
{
    memset(out, 0, sizeof *out);
    if (channels != 1 && channels != 3)
        return mgt_error_set(MGT_ERR_INVALID, "%s: channels must be 1 or 3, not %d", name,
                             channels);
    if (len == 0)
        return mgt_error_set(MGT_ERR_INVALID, "%s: empty file", name);
    if (len > INT32_MAX)
        return mgt_error_set(MGT_ERR_INVALID, "%s: file too large", name);
    const stbi_uc *b = bytes;
    int w = 0, h = 0, comp = 0;
    if (!stbi_info_from_memory(b, (int)len, &w, &h, &comp))
        return mgt_error_set(MGT_ERR_INVALID, "%s: %s", name, stbi_failure_reason());
    if (w <= 0 || h <= 0)
        return mgt_error_set(MGT_ERR_INVALID, "%s: empty image", name);
    if ((long)w * h > MGT_IMAGE_MAX_PIXELS)
        return mgt_error_set(MGT_ERR_INVALID, "%s: %dx%d is more than %ld pixels", name, w, h,
                             MGT_IMAGE_MAX_PIXELS);
    if (jpeg_truncated(b, len))
        return mgt_error_set(MGT_ERR_INVALID, "%s: truncated JPEG (no end marker)", name);

    /* stb's own RGB->gray weights are 77/150/29 of 256; PIL's L (299/587/114 per mille,
       which PIL computes as 19595/38470/7471 of 65536, rounded) differs, so colour sources
       are decoded to RGB and converted here, bit-exact with PIL's convert("L") */
    int req = channels == 3 ? 3 : (comp <= 2 ? 1 : 3);
    int dw = 0, dh = 0, dcomp = 0;
    stbi_uc *px = stbi_load_from_memory(b, (int)len, &dw, &dh, &dcomp, req);
    if (!px)
        return mgt_error_set(MGT_ERR_INVALID, "%s: %s", name, stbi_failure_reason());
    if (channels == 1 && req == 3) {
        size_t n = (size_t)dw * dh;
        for (size_t i = 0; i < n; i++) {
            unsigned r = px[3 * i], g = px[3 * i + 1], bl = px[3 * i + 2];
            px[i] = (stbi_uc)((r * 19595 + g * 38470 + bl * 7471 + 0x8000) >> 16);
        }
    }
    out->pixels = px;
    out->w = dw;
    out->h = dh;
    out->c = channels;
    return MGT_OK;
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
    stbi_image_free(img->pixels);
    memset(img, 0, sizeof *img);
}

mgt_status mgt_dataset_probe(const mgt_dataset *ds, int probe, int *w, int *h, int *channels)
{
    size_t n = mgt_dataset_size(ds);
    if (probe < 1)
        probe = 1;
    if ((size_t)probe > n)
        probe = (int)n;
    int *ws = malloc(sizeof(int) * 2 * (size_t)probe);
    if (!ws)
        return mgt_error_set(MGT_ERR_OOM, "probe: out of memory");
    int *hs = ws + probe;
    int got = 0;
    bool color = false;
    char path[8192];
    for (int k = 0; k < probe; k++) {
        size_t i = (size_t)((double)k * (double)n / probe);
        int iw, ih, ic;
        if (mgt_dataset_path(ds, i, path, sizeof path) != MGT_OK)
            continue;
        if (!stbi_info(path, &iw, &ih, &ic))
            continue;
        if (ic >= 3)
            color = true;
        ws[got] = iw;
        hs[got] = ih;
        got++;
    }
    mgt_status st = MGT_OK;
    if (got == 0) {
        st = mgt_error_set(MGT_ERR_INVALID, "%s: none of %d probed image files could be read",
                           mgt_dataset_dir(ds), probe);
    } else {
        /* the most common size; a few hundred probes make quadratic counting cheap */
        int best = 0, best_count = 0;
        for (int a = 0; a < got; a++) {
            int c = 0;
            for (int b = 0; b < got; b++)
                c += ws[a] == ws[b] && hs[a] == hs[b];
            if (c > best_count) {
                best_count = c;
                best = a;
            }
        }
        *w = ws[best];
        *h = hs[best];
        *channels = color ? 3 : 1;
    }
    free(ws);
    return st;
}
