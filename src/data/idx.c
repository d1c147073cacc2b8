/* IDX files (the MNIST family's format), read through zlib so that .gz and plain files both
   work. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "data/internal.h"

/* gzread takes an unsigned count; read big payloads in pieces. */
static mgt_status read_exact(gzFile f, const char *path, void *dst, size_t n, const char *what)
{
    uint8_t *p = dst;
    while (n > 0) {
        unsigned want = n > (1u << 30) ? (1u << 30) : (unsigned)n;
        int got = gzread(f, p, want);
        if (got < 0) {
            int zerr = 0;
            const char *msg = gzerror(f, &zerr);
            return mgt_error_set(MGT_ERR_IO, "%s: %s", path,
                                 zerr == Z_ERRNO ? strerror(errno) : msg);
        }
        if (got == 0)
            return mgt_error_set(MGT_ERR_INVALID, "%s: file ends inside the %s", path, what);
        p += got;
        n -= (size_t)got;
    }
    return MGT_OK;
}

mgt_status mgt_idx_read(const char *path, mgt_idx *out)
{
    memset(out, 0, sizeof *out);
    gzFile f = gzopen(path, "rb");
    if (!f)
        return mgt_error_set(MGT_ERR_IO, "%s: %s", path, errno ? strerror(errno) : "cannot open");
    gzbuffer(f, 1 << 17);
    mgt_status st;
    uint8_t magic[4];
    if ((st = read_exact(f, path, magic, 4, "header")) != MGT_OK)
        goto fail;
    if (magic[0] != 0 || magic[1] != 0) {
        st = mgt_error_set(MGT_ERR_INVALID, "%s: not an IDX file (bad magic number)", path);
        goto fail;
    }
    if (magic[2] != 0x08) {
        st = mgt_error_set(MGT_ERR_INVALID,
                           "%s: IDX data type 0x%02x; only unsigned bytes (0x08) are read", path,
                           magic[2]);
        goto fail;
    }
    if (magic[3] < 1 || magic[3] > 4) {
        st = mgt_error_set(MGT_ERR_INVALID, "%s: IDX with %d dimensions; 1..4 are read", path,
                           magic[3]);
        goto fail;
    }
    out->ndim = magic[3];
    uint8_t dims[16];
    if ((st = read_exact(f, path, dims, 4 * (size_t)out->ndim, "header")) != MGT_OK)
        goto fail;
    size_t size = 1;
    for (int d = 0; d < out->ndim; d++) {
        uint32_t v = (uint32_t)dims[4 * d] << 24 | (uint32_t)dims[4 * d + 1] << 16 |
                     (uint32_t)dims[4 * d + 2] << 8 | dims[4 * d + 3];
        out->dims[d] = v;
        /* a hostile header must not ask for more than 4 GiB */
        if (v != 0 && size > ((size_t)1 << 32) / v) {
            st = mgt_error_set(MGT_ERR_INVALID, "%s: IDX dimensions too large", path);
            goto fail;
        }
        size *= v;
    }
    out->size = size;
    if (!(out->data = malloc(size ? size : 1))) {
        st = mgt_error_set(MGT_ERR_OOM, "%s: out of memory for %zu bytes", path, size);
        goto fail;
    }
    if ((st = read_exact(f, path, out->data, size, "data")) != MGT_OK)
        goto fail;
    gzclose(f);
    return MGT_OK;
fail:
    gzclose(f);
    mgt_idx_free(out);
    return st;
}

void mgt_idx_free(mgt_idx *idx)
{
    if (!idx)
        return;
    free(idx->data);
    memset(idx, 0, sizeof *idx);
}
