/* Training curves from JSON logs (--log): loss, top-1 and lr against epochs, training per
   progress line, validation (and the EMA model's) per epoch, several logs overlaid; for
   `mgtrain plot` and the curves.svg a run keeps beside its checkpoints. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "mgt/plot.h"
#include "mgt/train.h"

#define MAX_LOGS 6

/* One curve: points in x order. A record at or before the last x (a resumed or restarted run
   writing the same epochs again) replaces the points from there on: the later run wins. */
typedef struct curve {
    double *x, *y;
    int n, cap;
} curve;

enum { C_TRAIN_LOSS, C_VAL_LOSS, C_EMA_LOSS, C_TRAIN_ACC1, C_VAL_ACC1, C_EMA_ACC1, C_LR, C_COUNT };

static bool curve_add(curve *c, double x, double y)
{
    while (c->n > 0 && c->x[c->n - 1] >= x)
        c->n--;
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 256;
        double *nx = realloc(c->x, (size_t)cap * sizeof *nx);
        if (!nx)
            return false;
        c->x = nx;
        double *ny = realloc(c->y, (size_t)cap * sizeof *ny);
        if (!ny)
            return false;
        c->y = ny;
        c->cap = cap;
    }
    c->x[c->n] = x;
    c->y[c->n++] = y;
    return true;
}

static bool num(const cJSON *o, const char *key, double *v)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(it))
        return false;
    *v = it->valuedouble;
    return true;
}

/* A line of the log into the curves. false: out of memory. */
static bool add_record(curve *cv, const cJSON *o)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(o, "type");
    double epoch, step, steps, v;
    if (!cJSON_IsString(type) || !num(o, "epoch", &epoch))
        return true;
    bool ok = true;
    if (strcmp(type->valuestring, "train") == 0 && num(o, "step", &step) &&
        num(o, "steps", &steps) && steps > 0) {
        double x = epoch + (step + 1) / steps;
        if (num(o, "loss", &v))
            ok = ok && curve_add(&cv[C_TRAIN_LOSS], x, v);
        if (num(o, "acc1", &v))
            ok = ok && curve_add(&cv[C_TRAIN_ACC1], x, v);
        if (num(o, "lr", &v))
            ok = ok && curve_add(&cv[C_LR], x, v);
    } else if (strcmp(type->valuestring, "epoch") == 0) {
        double x = epoch + 1;
        if (num(o, "val_loss", &v))
            ok = ok && curve_add(&cv[C_VAL_LOSS], x, v);
        if (num(o, "val_acc1", &v))
            ok = ok && curve_add(&cv[C_VAL_ACC1], x, v);
        if (num(o, "ema_val_loss", &v))
            ok = ok && curve_add(&cv[C_EMA_LOSS], x, v);
        if (num(o, "ema_val_acc1", &v))
            ok = ok && curve_add(&cv[C_EMA_ACC1], x, v);
    }
    return ok;
}

static mgt_status read_log(const char *path, curve *cv)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return mgt_error_set(MGT_ERR_IO, "%s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0, records = 0;
    mgt_status st = MGT_OK;
    while (st == MGT_OK && (len = getline(&line, &cap, f)) > 0) {
        lineno++;
        if (line[len - 1] != '\n')
            break; /* a line still being written by a running mgtrain */
        cJSON *o = cJSON_Parse(line);
        if (!cJSON_IsObject(o))
            st = mgt_error_set(MGT_ERR_INVALID,
                               "%s: line %ld is not a JSON record (is it an "
                               "mgtrain --log?)",
                               path, lineno);
        else if (!add_record(cv, o))
            st = mgt_error_set(MGT_ERR_OOM, "%s: out of memory at line %ld", path, lineno);
        else
            records++;
        cJSON_Delete(o);
    }
    if (st == MGT_OK && ferror(f))
        st = mgt_error_set(MGT_ERR_IO, "%s: %s", path, strerror(errno));
    free(line);
    fclose(f);
    if (st == MGT_OK && cv[C_TRAIN_LOSS].n == 0 && cv[C_VAL_LOSS].n == 0)
        st = mgt_error_set(MGT_ERR_INVALID, "%s: no training or epoch records in %ld lines", path,
                           records);
    return st;
}

/* The file's name without its folder and a .jsonl or .json ending. */
static void label_of(const char *path, char *buf, size_t cap)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    snprintf(buf, cap, "%s", b);
    size_t n = strlen(buf);
    if (n > 6 && strcmp(buf + n - 6, ".jsonl") == 0)
        buf[n - 6] = 0;
    else if (n > 5 && strcmp(buf + n - 5, ".json") == 0)
        buf[n - 5] = 0;
}

mgt_status mgt_train_plot_curves(const char *const *logs, const char *const *labels, int n,
                                 const char *svg_path)
{
    if (n < 1 || n > MAX_LOGS)
        return mgt_error_set(MGT_ERR_INVALID, "%d logs: give 1 to %d", n, MAX_LOGS);
    curve cv[MAX_LOGS][C_COUNT];
    memset(cv, 0, sizeof cv);
    char names[MAX_LOGS][C_COUNT][96];
    mgt_status st = MGT_OK;
    for (int l = 0; l < n && st == MGT_OK; l++)
        st = read_log(logs[l], cv[l]);
    if (st == MGT_OK) {
        mgt_plot p = {.title = n == 1 ? "mgtrain: training curves"
                                      : "mgtrain: training curves "
                                        "compared",
                      .x_label = "epoch",
                      .panel_title = {"loss", "top-1 (%)", "learning rate"},
                      .panels = 3,
                      .x_nice = true};
        static const struct {
            const char *what;
            int panel;
            mgt_plot_dash dash;
            bool dense;
        } kinds[C_COUNT] = {
            [C_TRAIN_LOSS] = {"train", 0, MGT_PLOT_SOLID, true},
            [C_VAL_LOSS] = {"val", 0, MGT_PLOT_DASHED, false},
            [C_EMA_LOSS] = {"EMA val", 0, MGT_PLOT_DOTTED, false},
            [C_TRAIN_ACC1] = {"train", 1, MGT_PLOT_SOLID, true},
            [C_VAL_ACC1] = {"val", 1, MGT_PLOT_DASHED, false},
            [C_EMA_ACC1] = {"EMA val", 1, MGT_PLOT_DOTTED, false},
            [C_LR] = {"lr", 2, MGT_PLOT_SOLID, true},
        };
        for (int l = 0; l < n; l++) {
            char label[64];
            if (labels && labels[l])
                snprintf(label, sizeof label, "%s", labels[l]);
            else
                label_of(logs[l], label, sizeof label);
            for (int k = 0; k < C_COUNT; k++) {
                if (!cv[l][k].n)
                    continue;
                if (n == 1)
                    snprintf(names[l][k], sizeof names[l][k], "%s", kinds[k].what);
                else
                    snprintf(names[l][k], sizeof names[l][k], "%s %s", label, kinds[k].what);
                p.series[p.n_series++] = (mgt_plot_series){
                    .name = names[l][k],
                    .x = cv[l][k].x,
                    .y = cv[l][k].y,
                    .n = cv[l][k].n,
                    .panel = kinds[k].panel,
                    /* one colour per log when several are compared; else one per kind */
                    .color = n > 1                                  ? l + 1
                             : (k == C_VAL_LOSS || k == C_VAL_ACC1) ? 2
                             : (k == C_EMA_LOSS || k == C_EMA_ACC1) ? 3
                                                                    : 1,
                    .dash = kinds[k].dash,
                    .no_markers = kinds[k].dense};
            }
        }
        st = mgt_plot_write_svg(&p, svg_path);
    }
    for (int l = 0; l < n; l++)
        for (int k = 0; k < C_COUNT; k++) {
            free(cv[l][k].x);
            free(cv[l][k].y);
        }
    return st;
}
