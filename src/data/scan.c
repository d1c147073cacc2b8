/* ImageFolder scan: class folders, their image files in torchvision's order, and the checks
   that name what is wrong with a dataset folder. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/internal.h"

static const char *const image_exts[] = {"jpg", "jpeg", "png", "bmp", "gif", "pgm", "ppm", "tga"};

/* ---- small growable containers; every growth doubles, so a million files cost ~20 moves ---- */

mgt_status data_strbuf_add(data_strbuf *b, const char *s, size_t n, size_t *off)
{
    *off = b->len; /* set on failure too: the callers' checks do not show the compiler why */
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return mgt_error_set(MGT_ERR_OOM, "out of host memory for file names");
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->p[b->len + n] = '\0';
    b->len += n + 1;
    return MGT_OK;
}

mgt_status data_offvec_push(data_offvec *o, size_t x)
{
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 256;
        size_t *v = realloc(o->v, cap * sizeof *v);
        if (!v)
            return mgt_error_set(MGT_ERR_OOM, "out of host memory for the file list");
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = x;
    return MGT_OK;
}

bool mgt_data_has_image_ext(const char *name)
{
    const char *dot = strrchr(name, '.');
    if (!dot || dot == name)
        return false;
    dot++;
    size_t len = strlen(dot);
    if (len < 3 || len > 4)
        return false;
    char low[5];
    for (size_t i = 0; i < len; i++)
        low[i] = (char)tolower((unsigned char)dot[i]);
    low[len] = '\0';
    for (size_t i = 0; i < sizeof image_exts / sizeof image_exts[0]; i++)
        if (strcmp(low, image_exts[i]) == 0)
            return true;
    return false;
}

void mgt_data_sanitize(char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            *s = '?';
}

/* ---- the walk ---- */

typedef enum entry_kind { ENTRY_OTHER, ENTRY_FILE, ENTRY_DIR } entry_kind;

static entry_kind classify(const char *parent, const struct dirent *e, dev_t *dev, ino_t *ino)
{
    if (e->d_type == DT_REG)
        return ENTRY_FILE;
    if (e->d_type == DT_DIR && !dev)
        return ENTRY_DIR;
    if (e->d_type != DT_DIR && e->d_type != DT_LNK && e->d_type != DT_UNKNOWN)
        return ENTRY_OTHER;
    /* symlinks and file systems without d_type need a stat; os.walk(followlinks=True)
       follows links, and a broken link to "x.jpg" counts as a file (it fails at decode,
       as it would in torchvision) */
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", parent, e->d_name) >= sizeof path)
        return ENTRY_OTHER;
    struct stat st;
    if (stat(path, &st) != 0)
        return e->d_type == DT_DIR ? ENTRY_OTHER : ENTRY_FILE;
    if (dev) {
        *dev = st.st_dev;
        *ino = st.st_ino;
    }
    if (S_ISDIR(st.st_mode))
        return ENTRY_DIR;
    if (S_ISREG(st.st_mode))
        return ENTRY_FILE;
    return ENTRY_OTHER;
}

/* The folders scanned so far in a split, by device and inode, so that each is entered once:
   a symbolic link back into a folder above it (a loop, which os.walk(followlinks=True)
   follows until the path is too long) or to a folder already scanned (another class, the
   split itself) is reported and not followed. Open addressing, grown at half full. */
typedef struct seen_dir {
    dev_t dev;
    ino_t ino;
    size_t name; /* offset of its path relative to the split in walk.seen_names; 0 = unused */
} seen_dir;

typedef struct seen_set {
    seen_dir *v;
    size_t cap, n;
} seen_set;

static size_t seen_hash(dev_t dev, ino_t ino, size_t cap)
{
    uint64_t h = ((uint64_t)dev * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)ino * 0xC2B2AE3D27D4EB4Full);
    return (size_t)(h ^ (h >> 29)) & (cap - 1);
}

/* The entry of (dev, ino), or NULL. */
static const seen_dir *seen_find(const seen_set *s, dev_t dev, ino_t ino)
{
    if (!s->cap)
        return NULL;
    for (size_t i = seen_hash(dev, ino, s->cap);; i = (i + 1) & (s->cap - 1)) {
        if (!s->v[i].name)
            return NULL;
        if (s->v[i].dev == dev && s->v[i].ino == ino)
            return &s->v[i];
    }
}

static mgt_status seen_add(seen_set *s, dev_t dev, ino_t ino, size_t name)
{
    if (2 * (s->n + 1) > s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        seen_dir *v = calloc(cap, sizeof *v);
        if (!v)
            return mgt_error_set(MGT_ERR_OOM, "scan: out of memory");
        for (size_t i = 0; i < s->cap; i++)
            if (s->v[i].name) {
                size_t j = seen_hash(s->v[i].dev, s->v[i].ino, cap);
                while (v[j].name)
                    j = (j + 1) & (cap - 1);
                v[j] = s->v[i];
            }
        free(s->v);
        s->v = v;
        s->cap = cap;
    }
    size_t i = seen_hash(dev, ino, s->cap);
    while (s->v[i].name)
        i = (i + 1) & (s->cap - 1);
    s->v[i] = (seen_dir){dev, ino, name};
    s->n++;
    return MGT_OK;
}

/* One visited folder of a class: its path relative to the split and its files. */
typedef struct walk_dir {
    size_t rel_off;      /* in walk.names */
    size_t first, count; /* range of walk.files */
} walk_dir;

typedef struct walk {
    const char *root;  /* the split folder */
    data_strbuf names; /* folder relpaths and file names */
    data_offvec files; /* offsets of file names in names */
    walk_dir *dirs;
    size_t ndirs, dircap;
    seen_set seen;          /* every folder entered in the split */
    data_strbuf seen_names; /* their relative paths ("" for the split; offset 0 is a pad) */
    size_t links_skipped;
    int depth;
    size_t total; /* files found in the whole split so far */
    double t0, last_print;
    const mgt_scan_options *opt;
} walk;

static const char *walk_str(const walk *w, size_t off) { return w->names.p + off; }

static void progress(walk *w, bool final)
{
    FILE *f = w->opt ? w->opt->progress : NULL;
    if (!f)
        return;
    double now = mgt_time_now();
    if (!final && now - w->last_print < 0.25)
        return;
    w->last_print = now;
    double dt = now - w->t0;
    fprintf(f, "\rscanning %s: %zu files (%.0f files/s)%s", w->root, w->total,
            dt > 0 ? (double)w->total / dt : 0.0, final ? "\n" : "");
    fflush(f);
}

static int cmp_str_at(const void *a, const void *b, void *base)
{
    const char *s = base;
    return strcmp(s + *(const size_t *)a, s + *(const size_t *)b);
}

static mgt_status walk_dir_rec(walk *w, const char *rel)
{
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", w->root, rel) >= sizeof path)
        return mgt_error_set(MGT_ERR_INVALID, "%s/%s: path too long", w->root, rel);
    DIR *d = opendir(path);
    if (!d)
        return mgt_error_set(MGT_ERR_IO, "%s: %s", path, strerror(errno));

    mgt_status st = MGT_OK;
    size_t rel_off;
    if ((st = data_strbuf_add(&w->names, rel, strlen(rel), &rel_off)) != MGT_OK)
        goto done;
    if (w->ndirs == w->dircap) {
        size_t cap = w->dircap ? w->dircap * 2 : 64;
        walk_dir *p = realloc(w->dirs, cap * sizeof *p);
        if (!p) {
            st = mgt_error_set(MGT_ERR_OOM, "scan: out of memory");
            goto done;
        }
        w->dirs = p;
        w->dircap = cap;
    }
    size_t me = w->ndirs++;
    w->dirs[me] = (walk_dir){.rel_off = rel_off, .first = w->files.n, .count = 0};

    data_offvec subdirs = {0};
    struct dirent *e;
    errno = 0;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue; /* ".", "..", hidden */
        dev_t dev = 0;
        ino_t ino = 0;
        entry_kind k = classify(path, e, &dev, &ino);
        if (k == ENTRY_FILE) {
            if (!mgt_data_has_image_ext(e->d_name))
                continue;
            size_t off;
            if ((st = data_strbuf_add(&w->names, e->d_name, strlen(e->d_name), &off)) != MGT_OK ||
                (st = data_offvec_push(&w->files, off)) != MGT_OK)
                break;
            w->total++;
            if ((w->total & 1023) == 0) {
                progress(w, false);
                if (w->opt && mgt_abort_is_raised(w->opt->abort)) {
                    st = mgt_error_set(MGT_ERR_ABORTED, "scan of %s aborted", w->root);
                    break;
                }
            }
        } else if (k == ENTRY_DIR) {
            char sub[4096];
            if ((size_t)snprintf(sub, sizeof sub, "%s/%s", rel, e->d_name) >= sizeof sub)
                continue;
            size_t off;
            if ((st = data_strbuf_add(&w->names, sub, strlen(sub), &off)) != MGT_OK ||
                (st = data_offvec_push(&subdirs, off)) != MGT_OK)
                break;
        }
        errno = 0;
    }
    if (st == MGT_OK && errno != 0)
        st = mgt_error_set(MGT_ERR_IO, "%s: %s", path, strerror(errno));
    closedir(d);
    d = NULL;
    w->dirs[me].count = w->files.n - w->dirs[me].first;

    /* entered in sorted order, so that which of two ways to one folder is taken (the first)
       does not depend on the file system's order */
    if (subdirs.n > 1)
        qsort_r(subdirs.v, subdirs.n, sizeof(size_t), cmp_str_at, w->names.p);
    for (size_t i = 0; st == MGT_OK && i < subdirs.n; i++) {
        if (w->depth >= 64) {
            st = mgt_error_set(MGT_ERR_INVALID, "%s/%s: folders nested too deep", w->root,
                               walk_str(w, subdirs.v[i]));
            break;
        }
        /* copy: names may move while the recursion appends to it */
        char sub[4096];
        snprintf(sub, sizeof sub, "%s", walk_str(w, subdirs.v[i]));
        char subpath[4096];
        struct stat sst;
        if ((size_t)snprintf(subpath, sizeof subpath, "%s/%s", w->root, sub) >= sizeof subpath ||
            stat(subpath, &sst) != 0)
            continue;
        const seen_dir *was = seen_find(&w->seen, sst.st_dev, sst.st_ino);
        if (was) {
            const char *prev = w->seen_names.p + was->name;
            size_t pl = strlen(prev);
            bool loop = pl == 0 || (strncmp(sub, prev, pl) == 0 && sub[pl] == '/');
            FILE *f = w->opt && w->opt->warn ? w->opt->warn : stderr;
            char shown[4096];
            snprintf(shown, sizeof shown, "%s", sub);
            mgt_data_sanitize(shown);
            if (loop)
                fprintf(f,
                        "mgtrain: warning: %s/%s: a symbolic link loop (back to %s/%s); not "
                        "followed\n",
                        w->root, shown, w->root, prev);
            else
                fprintf(f,
                        "mgtrain: warning: %s/%s: leads to a folder already scanned (%s/%s); "
                        "not followed, so that its files count once\n",
                        w->root, shown, w->root, prev);
            w->links_skipped++;
            continue;
        }
        size_t off;
        if ((st = data_strbuf_add(&w->seen_names, sub, strlen(sub), &off)) != MGT_OK ||
            (st = seen_add(&w->seen, sst.st_dev, sst.st_ino, off)) != MGT_OK)
            break;
        w->depth++;
        st = walk_dir_rec(w, sub);
        w->depth--;
    }
    free(subdirs.v);
done:
    if (d)
        closedir(d);
    return st;
}

static int cmp_dirs(const void *a, const void *b, void *base)
{
    const char *s = base;
    return strcmp(s + ((const walk_dir *)a)->rel_off, s + ((const walk_dir *)b)->rel_off);
}

/* Walks one class folder and appends its files, in torchvision's order, to ds. */
static mgt_status scan_class(walk *w, mgt_dataset *ds, int label, data_strbuf *paths,
                             data_offvec *offs, int32_t **labels, size_t *labcap)
{
    w->names.len = 0;
    w->files.n = 0;
    w->ndirs = 0;
    w->depth = 0;
    const char *cls = ds->class_names[label];
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", w->root, cls);
    struct stat st;
    if (stat(path, &st) != 0)
        return mgt_error_set(MGT_ERR_IO, "%s: %s", path, strerror(errno));
    w->depth = 1;
    mgt_status s = walk_dir_rec(w, cls);
    if (s != MGT_OK)
        return s;
    if (w->files.n == 0)
        return mgt_error_set(MGT_ERR_INVALID,
                             "%s: class folder has no image files (extensions: jpg jpeg png "
                             "bmp gif pgm ppm tga)",
                             path);

    /* sorted(os.walk(...)) orders folders by path, then sorted(fnames) within each */
    qsort_r(w->dirs, w->ndirs, sizeof *w->dirs, cmp_dirs, w->names.p);
    for (size_t d = 0; d < w->ndirs; d++) {
        walk_dir *wd = &w->dirs[d];
        qsort_r(w->files.v + wd->first, wd->count, sizeof(size_t), cmp_str_at, w->names.p);
        const char *rel = walk_str(w, wd->rel_off);
        size_t rel_len = strlen(rel);
        for (size_t i = 0; i < wd->count; i++) {
            const char *name = walk_str(w, w->files.v[wd->first + i]);
            size_t name_len = strlen(name);
            char full[8192];
            if (rel_len + 1 + name_len + 1 > sizeof full)
                return mgt_error_set(MGT_ERR_INVALID, "%s/%s/%s: path too long", w->root, rel,
                                     name);
            memcpy(full, rel, rel_len);
            full[rel_len] = '/';
            memcpy(full + rel_len + 1, name, name_len + 1);
            size_t off;
            if ((s = data_strbuf_add(paths, full, rel_len + 1 + name_len, &off)) != MGT_OK ||
                (s = data_offvec_push(offs, off)) != MGT_OK)
                return s;
            if (offs->n > *labcap) {
                size_t cap = *labcap ? *labcap * 2 : 256;
                int32_t *p = realloc(*labels, cap * sizeof *p);
                if (!p)
                    return mgt_error_set(MGT_ERR_OOM, "scan: out of memory");
                *labels = p;
                *labcap = cap;
            }
            (*labels)[offs->n - 1] = label;
        }
    }
    return MGT_OK;
}

static int cmp_cstr(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static mgt_status list_classes(mgt_dataset *ds)
{
    DIR *d = opendir(ds->dir);
    if (!d) {
        if (errno == ENOENT)
            return mgt_error_set(MGT_ERR_IO, "%s: no such folder", ds->dir);
        if (errno == ENOTDIR)
            return mgt_error_set(MGT_ERR_INVALID, "%s: not a folder", ds->dir);
        return mgt_error_set(MGT_ERR_IO, "%s: %s", ds->dir, strerror(errno));
    }
    mgt_status st = MGT_OK;
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (classify(ds->dir, e, NULL, NULL) != ENTRY_DIR)
            continue;
        if (ds->nclasses == cap) {
            cap = cap ? cap * 2 : 64;
            char **p = realloc(ds->class_names, (size_t)cap * sizeof *p);
            if (!p) {
                st = mgt_error_set(MGT_ERR_OOM, "scan: out of memory");
                break;
            }
            ds->class_names = p;
        }
        if (!(ds->class_names[ds->nclasses] = strdup(e->d_name))) {
            st = mgt_error_set(MGT_ERR_OOM, "scan: out of memory");
            break;
        }
        ds->nclasses++;
        if (ds->nclasses > INT32_MAX / 2) {
            st = mgt_error_set(MGT_ERR_INVALID, "%s: too many class folders", ds->dir);
            break;
        }
    }
    closedir(d);
    if (st != MGT_OK)
        return st;
    if (ds->nclasses == 0)
        return mgt_error_set(MGT_ERR_INVALID,
                             "%s: no class folders (expected %s/<class>/<image files>)", ds->dir,
                             ds->dir);
    qsort(ds->class_names, (size_t)ds->nclasses, sizeof *ds->class_names, cmp_cstr);
    return MGT_OK;
}

/* The split folder and every class folder count as entered before any class is walked: a
   link from one class into another, or up to the split, is not followed. */
static mgt_status register_roots(walk *w, const mgt_dataset *ds)
{
    size_t pad, off;
    mgt_status st = data_strbuf_add(&w->seen_names, "", 0, &pad); /* offset 0 means unused */
    struct stat sb;
    if (st == MGT_OK && stat(ds->dir, &sb) == 0 &&
        (st = data_strbuf_add(&w->seen_names, "", 0, &off)) == MGT_OK)
        st = seen_add(&w->seen, sb.st_dev, sb.st_ino, off);
    for (int c = 0; st == MGT_OK && c < ds->nclasses; c++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", ds->dir, ds->class_names[c]);
        if (stat(path, &sb) != 0)
            continue; /* scan_class reports it */
        const char *name = ds->class_names[c];
        if (seen_find(&w->seen, sb.st_dev, sb.st_ino))
            continue; /* two class names for one folder: walked under the first */
        if ((st = data_strbuf_add(&w->seen_names, name, strlen(name), &off)) == MGT_OK)
            st = seen_add(&w->seen, sb.st_dev, sb.st_ino, off);
    }
    return st;
}

mgt_status mgt_dataset_scan(const char *dir, const mgt_scan_options *opt, mgt_dataset **out)
{
    *out = NULL;
    if (!dir || !*dir)
        return mgt_error_set(MGT_ERR_INVALID, "dataset folder: empty path");
    mgt_dataset *ds = calloc(1, sizeof *ds);
    if (!ds)
        return mgt_error_set(MGT_ERR_OOM, "scan: out of memory");
    mgt_status st;
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/')
        dl--; /* "data/train/" names files as "data/train/x" */
    if (!(ds->dir = strndup(dir, dl))) {
        free(ds);
        return mgt_error_set(MGT_ERR_OOM, "scan: out of memory");
    }
    double t0 = mgt_time_now();
    walk w = {.root = ds->dir, .opt = opt, .t0 = t0, .last_print = t0};
    data_strbuf paths = {0};
    data_offvec offs = {0};
    size_t labcap = 0;

    if ((st = list_classes(ds)) != MGT_OK || (st = register_roots(&w, ds)) != MGT_OK)
        goto fail;
    for (int c = 0; c < ds->nclasses; c++)
        if ((st = scan_class(&w, ds, c, &paths, &offs, &ds->labels, &labcap)) != MGT_OK)
            goto fail;
    progress(&w, true);
    ds->links_skipped = w.links_skipped;

    ds->n = offs.n;
    ds->path_off = offs.v;
    ds->paths = paths.p;
    ds->paths_len = paths.len;
    ds->scan_s = mgt_time_now() - t0;
    free(w.names.p);
    free(w.files.v);
    free(w.dirs);
    free(w.seen.v);
    free(w.seen_names.p);
    *out = ds;
    return MGT_OK;

fail:
    if (w.total > 0 && opt && opt->progress)
        fputc('\n', opt->progress);
    free(w.names.p);
    free(w.files.v);
    free(w.dirs);
    free(w.seen.v);
    free(w.seen_names.p);
    free(paths.p);
    free(offs.v);
    mgt_dataset_free(ds);
    return st;
}

/* The first class (in sorted order) present in one list and absent from the other. */
static const char *first_difference(const mgt_dataset *a, const mgt_dataset *b, bool *in_a)
{
    int i = 0, j = 0;
    while (i < a->nclasses || j < b->nclasses) {
        int c = i >= a->nclasses   ? 1
                : j >= b->nclasses ? -1
                                   : strcmp(a->class_names[i], b->class_names[j]);
        if (c < 0) {
            *in_a = true;
            return a->class_names[i];
        }
        if (c > 0) {
            *in_a = false;
            return b->class_names[j];
        }
        i++;
        j++;
    }
    return NULL;
}

mgt_status mgt_imagefolder_open(const char *dir, const mgt_scan_options *opt, mgt_dataset **train,
                                mgt_dataset **val)
{
    if (train)
        *train = NULL;
    if (val)
        *val = NULL;
    if (!dir || !*dir)
        return mgt_error_set(MGT_ERR_INVALID, "--data: empty path");
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno == ENOENT)
            return mgt_error_set(MGT_ERR_IO, "%s: no such folder", dir);
        return mgt_error_set(MGT_ERR_IO, "%s: %s", dir, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode))
        return mgt_error_set(MGT_ERR_INVALID, "%s: not a folder", dir);

    char path[4096];
    mgt_dataset *tr = NULL, *va = NULL;
    mgt_status s;
    /* both folders' absence is reported before scanning anything: a missing val found
       after a ten-minute scan of train would be rude */
    const char *splits[2] = {train ? "train" : NULL, val ? "val" : NULL};
    for (int i = 0; i < 2; i++) {
        if (!splits[i])
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, splits[i]);
        if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
            return mgt_error_set(
                MGT_ERR_IO,
                "%s: no such folder (an ImageFolder dataset has %s/train/<class>/* "
                "and %s/val/<class>/*)",
                path, dir, dir);
    }
    if (train) {
        snprintf(path, sizeof path, "%s/train", dir);
        if ((s = mgt_dataset_scan(path, opt, &tr)) != MGT_OK)
            return s;
    }
    if (val) {
        snprintf(path, sizeof path, "%s/val", dir);
        if ((s = mgt_dataset_scan(path, opt, &va)) != MGT_OK) {
            mgt_dataset_free(tr);
            return s;
        }
    }
    if (tr && va && !mgt_dataset_same_classes(tr, va)) {
        bool in_train = false;
        const char *c = first_difference(tr, va, &in_train);
        s = mgt_error_set(
            MGT_ERR_INVALID,
            "%s/train and %s/val have different classes (%d and %d): '%s' is only in %s/%s", dir,
            dir, tr->nclasses, va->nclasses, c ? c : "?", dir, in_train ? "train" : "val");
        mgt_dataset_free(tr);
        mgt_dataset_free(va);
        return s;
    }
    if (train)
        *train = tr;
    if (val)
        *val = va;
    return MGT_OK;
}

double mgt_dataset_scan_seconds(const mgt_dataset *ds) { return ds->scan_s; }
