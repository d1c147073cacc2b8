/* The Fashion-MNIST import: Debian's IDX files -> an ImageFolder tree of PNGs, written once.
   Also the one translation unit that compiles stb_image_write. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/internal.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#include <stb/stb_image_write.h>
#pragma GCC diagnostic pop

/* The dataset's documented names (zalandoresearch/fashion-mnist README), made safe for file
   names: "T-shirt/top" -> "T-shirt_top", "Ankle boot" -> "Ankle_boot". */
const char *const mgt_fashion_mnist_classes[10] = {
    "T-shirt_top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle_boot",
};

#define IMPORT_MARKER ".mgtrain-import-done"

static mgt_status mkdir_p(const char *path)
{
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s", path) >= sizeof tmp)
        return mgt_error_set(MGT_ERR_INVALID, "%s: path too long", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
            return mgt_error_set(MGT_ERR_IO, "%s: %s", tmp, strerror(errno));
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return mgt_error_set(MGT_ERR_IO, "%s: %s", tmp, strerror(errno));
    return MGT_OK;
}

/* stb hands the encoded PNG over in pieces; a sticky flag records the first failed write
   and the file is checked once at the end, as redis's rio does. */
typedef struct png_out {
    FILE *f;
    bool failed;
} png_out;

static void png_write(void *ctx, void *data, int size)
{
    png_out *o = ctx;
    if (!o->failed && fwrite(data, 1, (size_t)size, o->f) != (size_t)size)
        o->failed = true;
}

static mgt_status write_png(const char *path, const uint8_t *px, int w, int h)
{
    png_out o = {.f = fopen(path, "wb")};
    if (!o.f)
        return mgt_error_set(MGT_ERR_IO, "%s: %s", path, strerror(errno));
    int ok = stbi_write_png_to_func(png_write, &o, w, h, 1, px, w);
    int saved = errno;
    if (fclose(o.f) != 0 && !o.failed) {
        o.failed = true;
        saved = errno;
    }
    if (!ok)
        return mgt_error_set(MGT_ERR_IO, "%s: PNG encoding failed", path);
    if (o.failed)
        return mgt_error_set(MGT_ERR_IO, "%s: %s", path, strerror(saved));
    return MGT_OK;
}

/* Finds "<prefix>-<kind>-idxN-ubyte" with or without .gz. */
static mgt_status find_idx(const char *dir, const char *prefix, const char *kind, int ndim,
                           char *path, size_t cap)
{
    const char *ext[2] = {".gz", ""};
    for (int i = 0; i < 2; i++) {
        snprintf(path, cap, "%s/%s-%s-idx%d-ubyte%s", dir, prefix, kind, ndim, ext[i]);
        if (access(path, R_OK) == 0)
            return MGT_OK;
    }
    return mgt_error_set(MGT_ERR_IO,
                         "%s/%s-%s-idx%d-ubyte.gz: no such file (Debian's dataset-fashion-mnist "
                         "package installs it in /usr/share/datasets/fashion-mnist)",
                         dir, prefix, kind, ndim);
}

static mgt_status import_split(const char *src, const char *prefix, const char *out_dir,
                               const char *split, size_t per_class, FILE *progress, size_t *done,
                               size_t total, size_t *count)
{
    char ipath[4096], lpath[4096];
    mgt_status st;
    if ((st = find_idx(src, prefix, "images", 3, ipath, sizeof ipath)) != MGT_OK)
        return st;
    if ((st = find_idx(src, prefix, "labels", 1, lpath, sizeof lpath)) != MGT_OK)
        return st;
    mgt_idx im = {0}, lb = {0};
    if ((st = mgt_idx_read(ipath, &im)) != MGT_OK)
        return st;
    if ((st = mgt_idx_read(lpath, &lb)) != MGT_OK)
        goto done;
    if (im.ndim != 3 || im.dims[1] == 0 || im.dims[2] == 0 || im.dims[1] > 4096 ||
        im.dims[2] > 4096) {
        st = mgt_error_set(MGT_ERR_INVALID, "%s: expected images [n, rows, cols]", ipath);
        goto done;
    }
    if (lb.ndim != 1 || lb.dims[0] != im.dims[0]) {
        st = mgt_error_set(MGT_ERR_INVALID, "%s: %u labels for %u images in %s", lpath, lb.dims[0],
                           im.dims[0], ipath);
        goto done;
    }
    for (uint32_t i = 0; i < lb.dims[0]; i++)
        if (lb.data[i] > 9) {
            st = mgt_error_set(MGT_ERR_INVALID, "%s: label %u of image %u is not a class 0..9",
                               lpath, lb.data[i], i);
            goto done;
        }
    char dir[4096];
    for (int c = 0; c < 10; c++) {
        snprintf(dir, sizeof dir, "%s/%s/%s", out_dir, split, mgt_fashion_mnist_classes[c]);
        if ((st = mkdir_p(dir)) != MGT_OK)
            goto done;
    }
    int h = (int)im.dims[1], w = (int)im.dims[2];
    double last = 0;
    size_t taken[10] = {0}, n = 0;
    for (uint32_t i = 0; i < im.dims[0]; i++) {
        /* per_class: the first images of each class in the file's order */
        if (per_class > 0 && taken[lb.data[i]]++ >= per_class)
            continue;
        n++;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s/%s/%05u.png", out_dir, split,
                 mgt_fashion_mnist_classes[lb.data[i]], i);
        if ((st = write_png(path, im.data + (size_t)i * w * h, w, h)) != MGT_OK)
            goto done;
        (*done)++;
        double now = mgt_time_now();
        if (progress && now - last > 0.25) {
            last = now;
            fprintf(progress, "\rimporting Fashion-MNIST into %s: %zu of %zu images", out_dir,
                    *done, total);
            fflush(progress);
        }
    }
    *count = n;
done:
    mgt_idx_free(&im);
    mgt_idx_free(&lb);
    return st;
}

/* The marker goes through a temp file, fsync and rename, after every PNG is on disk: a
   marker present means a complete tree. */
static mgt_status write_marker(const char *out_dir, const char *text)
{
    char tmp[4096], final[4096];
    snprintf(tmp, sizeof tmp, "%s/%s.tmp", out_dir, IMPORT_MARKER);
    snprintf(final, sizeof final, "%s/%s", out_dir, IMPORT_MARKER);
    int dfd = open(out_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return mgt_error_set(MGT_ERR_IO, "%s: %s", out_dir, strerror(errno));
    mgt_status st = MGT_OK;
    /* one syncfs instead of 70000 fsyncs */
    if (syncfs(dfd) != 0)
        st = mgt_error_set(MGT_ERR_IO, "%s: sync: %s", out_dir, strerror(errno));
    int fd = st == MGT_OK ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
    if (st == MGT_OK && fd < 0)
        st = mgt_error_set(MGT_ERR_IO, "%s: %s", tmp, strerror(errno));
    if (fd >= 0) {
        size_t len = strlen(text);
        if (write(fd, text, len) != (ssize_t)len || fsync(fd) != 0)
            st = mgt_error_set(MGT_ERR_IO, "%s: %s", tmp, strerror(errno));
        close(fd);
    }
    if (st == MGT_OK && rename(tmp, final) != 0)
        st = mgt_error_set(MGT_ERR_IO, "%s: %s", final, strerror(errno));
    if (st == MGT_OK && fsync(dfd) != 0)
        st = mgt_error_set(MGT_ERR_IO, "%s: %s", out_dir, strerror(errno));
    close(dfd);
    return st;
}

mgt_status mgt_data_import_fashion_mnist(const char *src_dir, const char *out_dir, size_t per_class,
                                         FILE *progress, bool *already)
{
    if (already)
        *already = false;
    if (!src_dir || !*src_dir || !out_dir || !*out_dir)
        return mgt_error_set(MGT_ERR_INVALID, "import: empty source or output folder");
    char marker[4096];
    if ((size_t)snprintf(marker, sizeof marker, "%s/%s", out_dir, IMPORT_MARKER) >= sizeof marker)
        return mgt_error_set(MGT_ERR_INVALID, "%s: path too long", out_dir);
    if (access(marker, F_OK) == 0) {
        if (already)
            *already = true;
        return MGT_OK;
    }
    struct stat sb;
    if (stat(src_dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return mgt_error_set(MGT_ERR_IO,
                             "%s: no such folder (install Debian's dataset-fashion-mnist package)",
                             src_dir);
    mgt_status st = mkdir_p(out_dir);
    if (st != MGT_OK)
        return st;
    size_t done = 0, ntrain = 0, nval = 0, total = per_class ? 20 * per_class : 70000;
    if ((st = import_split(src_dir, "train", out_dir, "train", per_class, progress, &done, total,
                           &ntrain)) != MGT_OK ||
        (st = import_split(src_dir, "t10k", out_dir, "val", per_class, progress, &done, total,
                           &nval)) != MGT_OK) {
        if (progress)
            fputc('\n', progress);
        return st;
    }
    if (progress)
        fprintf(progress, "\rimported Fashion-MNIST into %s: %zu train and %zu val images\n",
                out_dir, ntrain, nval);
    char text[4300];
    if (per_class > 0)
        snprintf(text, sizeof text,
                 "fashion-mnist from %s, the first %zu of each class: train %zu, val %zu\n",
                 src_dir, per_class, ntrain, nval);
    else
        snprintf(text, sizeof text, "fashion-mnist from %s: train %zu, val %zu\n", src_dir, ntrain,
                 nval);
    return write_marker(out_dir, text);
}
