/* What `--data` names (an ImageFolder tree, a pack file, a folder of packs), and what every
   reader of a split needs whatever it is stored in (scan.c makes a split from a folder,
   pack.c from a pack): its classes, labels and paths, a sample's bytes, the images' sizes. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/internal.h"

/* ---- a split, whatever it is stored in ---- */

void mgt_dataset_free(mgt_dataset *ds)
{
    if (!ds)
        return;
    mgt_pack_release(ds->pack);
    free(ds->entries);
    free(ds->strings);
    for (int c = 0; c < ds->nclasses; c++)
        free(ds->class_names[c]);
    free(ds->class_names);
    free(ds->path_off);
    free(ds->labels);
    free(ds->paths);
    free(ds->dir);
    free(ds);
}

bool mgt_dataset_same_classes(const mgt_dataset *a, const mgt_dataset *b)
{
    if (a->nclasses != b->nclasses)
        return false;
    for (int c = 0; c < a->nclasses; c++)
        if (strcmp(a->class_names[c], b->class_names[c]) != 0)
            return false;
    return true;
}

size_t mgt_dataset_size(const mgt_dataset *ds) { return ds->n; }
int mgt_dataset_class_count(const mgt_dataset *ds) { return ds->nclasses; }
const char *mgt_dataset_dir(const mgt_dataset *ds) { return ds->dir; }
size_t mgt_dataset_links_skipped(const mgt_dataset *ds) { return ds->links_skipped; }

const char *mgt_dataset_class_name(const mgt_dataset *ds, int label)
{
    return label >= 0 && label < ds->nclasses ? ds->class_names[label] : NULL;
}

int mgt_dataset_label(const mgt_dataset *ds, size_t i) { return i < ds->n ? ds->labels[i] : -1; }

const char *mgt_dataset_relpath(const mgt_dataset *ds, size_t i)
{
    if (i >= ds->n)
        return NULL;
    return ds->pack ? mgt_pack_relpath(ds, i) : ds->paths + ds->path_off[i];
}

mgt_status mgt_dataset_path(const mgt_dataset *ds, size_t i, char *buf, size_t cap)
{
    if (i >= ds->n)
        return mgt_error_set(MGT_ERR_INVALID, "sample %zu of %zu", i, ds->n);
    const char *rel = mgt_dataset_relpath(ds, i);
    /* a split of loose files (mgt_dataset_from_paths) keeps each path whole */
    if ((size_t)snprintf(buf, cap, "%s%s%s", ds->dir, ds->dir[0] ? "/" : "", rel) >= cap)
        return mgt_error_set(MGT_ERR_INVALID, "%s/%s: path too long", ds->dir, rel);
    return MGT_OK;
}

bool mgt_dataset_is_pack(const mgt_dataset *ds) { return ds->pack != NULL; }

mgt_status mgt_dataset_fetch(const mgt_dataset *ds, size_t i, uint8_t **buf, size_t *cap,
                             mgt_record *out, char *name, size_t name_cap)
{
    memset(out, 0, sizeof *out);
    mgt_status st = mgt_dataset_path(ds, i, name, name_cap);
    if (st != MGT_OK)
        return st;
    if (ds->pack)
        return mgt_pack_fetch(ds, i, buf, cap, out);
    size_t len = 0;
    st = mgt_data_read_file(name, buf, cap, &len);
    out->bytes = *buf;
    out->len = len;
    return st;
}

static bool is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The two splits of a pack or of two packs, their classes compared. */
static mgt_status open_packs(const char *train_path, const char *val_path, mgt_dataset **train,
                             mgt_dataset **val)
{
    mgt_dataset *tr = NULL, *va = NULL;
    mgt_status st = MGT_OK;
    if (train)
        st = mgt_pack_open(train_path, "train", &tr);
    if (st == MGT_OK && val)
        st = mgt_pack_open(val_path, "val", &va);
    if (st == MGT_OK && tr && va && !mgt_dataset_same_classes(tr, va))
        st = mgt_error_set(MGT_ERR_INVALID,
                           "%s and %s have different classes (%d and %d): they were not packed "
                           "from one tree",
                           mgt_dataset_dir(tr), mgt_dataset_dir(va), mgt_dataset_class_count(tr),
                           mgt_dataset_class_count(va));
    if (st != MGT_OK) {
        mgt_dataset_free(tr);
        mgt_dataset_free(va);
        return st;
    }
    if (train)
        *train = tr;
    if (val)
        *val = va;
    return MGT_OK;
}

mgt_status mgt_data_open(const char *path, const mgt_scan_options *opt, mgt_dataset **train,
                         mgt_dataset **val)
{
    if (train)
        *train = NULL;
    if (val)
        *val = NULL;
    if (!path || !*path)
        return mgt_error_set(MGT_ERR_INVALID, "--data: empty path");
    if (is_file(path))
        return open_packs(path, path, train, val);
    char tp[4096], vp[4096];
    snprintf(tp, sizeof tp, "%s/train.pack", path);
    snprintf(vp, sizeof vp, "%s/val.pack", path);
    if (is_file(tp) || is_file(vp)) {
        if ((train && !is_file(tp)) || (val && !is_file(vp)))
            return mgt_error_set(MGT_ERR_IO,
                                 "%s: no such file (a folder of packs holds train.pack and "
                                 "val.pack)",
                                 train && !is_file(tp) ? tp : vp);
        return open_packs(tp, vp, train, val);
    }
    return mgt_imagefolder_open(path, opt, train, val);
}

mgt_status mgt_dataset_probe(const mgt_dataset *ds, int probe, int *w, int *h, int *channels)
{
    size_t n = mgt_dataset_size(ds);
    if (probe < 1)
        probe = 1;
    if ((size_t)probe > n)
        probe = (int)n;
    int *ws = malloc(sizeof(int) * 2 * (size_t)probe);
    mgt_decoder *dec = NULL;
    if (!ws || mgt_decoder_create(&dec) != MGT_OK) {
        free(ws);
        return mgt_error_set(MGT_ERR_OOM, "probe: out of memory");
    }
    int *hs = ws + probe;
    int got = 0;
    bool color = false;
    char path[8192];
    uint8_t *buf = NULL;
    size_t cap = 0;
    for (int k = 0; k < probe; k++) {
        size_t i = (size_t)((double)k * (double)n / probe);
        mgt_image_header hd;
        if (ds->pack) { /* the index has every size */
            mgt_pack_entry_size(ds, i, &hd.w, &hd.h, &hd.c);
            if (hd.c == 0)
                continue; /* a bad file */
        } else if (mgt_dataset_path(ds, i, path, sizeof path) != MGT_OK ||
                   mgt_data_file_header(dec, path, &buf, &cap, &hd) != MGT_OK) {
            continue;
        }
        if (hd.c == 3)
            color = true;
        ws[got] = hd.w;
        hs[got] = hd.h;
        got++;
    }
    free(buf);
    mgt_decoder_free(dec);
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
