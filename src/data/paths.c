/* A split of loose image files for `mgtrain predict`: the files named, and every image file
   under each folder named (recursively, in sorted order, names starting with '.' skipped,
   links to folders not followed), one class, paths kept as given. */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/internal.h"

typedef struct path_list {
    data_strbuf names;
    data_offvec off;
} path_list;

static mgt_status add_path(path_list *p, const char *path)
{
    size_t off;
    mgt_status st = data_strbuf_add(&p->names, path, strlen(path), &off);
    return st == MGT_OK ? data_offvec_push(&p->off, off) : st;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

static mgt_status walk(path_list *p, const char *dir, int depth)
{
    if (depth > 64)
        return mgt_error_set(MGT_ERR_INVALID, "%s: folders nested deeper than 64", dir);
    struct dirent **list;
    int n = scandir(dir, &list, NULL, by_name);
    if (n < 0)
        return mgt_error_set(MGT_ERR_IO, "%s: %s", dir, strerror(errno));
    mgt_status st = MGT_OK;
    for (int i = 0; i < n; i++) {
        const char *name = list[i]->d_name;
        if (st == MGT_OK && name[0] != '.') {
            size_t len = strlen(dir) + strlen(name) + 2;
            char *path = malloc(len);
            struct stat sb;
            if (!path) {
                st = mgt_error_set(MGT_ERR_OOM, "predict: host memory exhausted");
            } else {
                snprintf(path, len, "%s%s%s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", name);
                if (lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
                    st = walk(p, path, depth + 1);
                else if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode) &&
                         mgt_data_has_image_ext(name))
                    st = add_path(p, path);
            }
            free(path);
        }
        free(list[i]);
    }
    free(list);
    return st;
}

mgt_status mgt_dataset_from_paths(const char *const *paths, int n, mgt_dataset **out)
{
    *out = NULL;
    path_list p = {0};
    mgt_status st = MGT_OK;
    for (int i = 0; i < n && st == MGT_OK; i++) {
        struct stat sb;
        if (stat(paths[i], &sb) != 0)
            st = mgt_error_set(MGT_ERR_IO, "%s: %s", paths[i], strerror(errno));
        else if (S_ISDIR(sb.st_mode)) {
            size_t before = p.off.n;
            st = walk(&p, paths[i], 0);
            if (st == MGT_OK && p.off.n == before)
                st = mgt_error_set(MGT_ERR_INVALID,
                                   "%s: no image files in it (extensions: jpg jpeg png bmp gif "
                                   "pgm ppm tga)",
                                   paths[i]);
        } else if (!S_ISREG(sb.st_mode))
            st = mgt_error_set(MGT_ERR_INVALID, "%s: not a file or a folder", paths[i]);
        else
            st = add_path(&p, paths[i]); /* named: taken whatever its extension */
    }
    if (st == MGT_OK && p.off.n == 0)
        st = mgt_error_set(MGT_ERR_INVALID, "no image given");
    mgt_dataset *ds = st == MGT_OK ? calloc(1, sizeof *ds) : NULL;
    if (st == MGT_OK && !ds)
        st = mgt_error_set(MGT_ERR_OOM, "predict: host memory exhausted");
    if (st == MGT_OK) {
        ds->dir = strdup("");
        ds->nclasses = 1;
        ds->class_names = calloc(1, sizeof *ds->class_names);
        ds->labels = calloc(p.off.n, sizeof *ds->labels);
        if (ds->class_names)
            ds->class_names[0] = strdup("?");
        if (!ds->dir || !ds->class_names || !ds->class_names[0] || !ds->labels)
            st = mgt_error_set(MGT_ERR_OOM, "predict: host memory exhausted");
        ds->n = p.off.n;
        ds->paths = p.names.p;
        ds->paths_len = p.names.len;
        ds->path_off = p.off.v;
        p.names.p = NULL;
        p.off.v = NULL;
    }
    free(p.names.p);
    free(p.off.v);
    if (st != MGT_OK) {
        mgt_dataset_free(ds);
        return st;
    }
    *out = ds;
    return MGT_OK;
}
