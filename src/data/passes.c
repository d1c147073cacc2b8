/* Whole-split passes on a few threads: check-data's decode of every file, and the mean/std
   of `--normalize auto`. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "data/internal.h"

/* ---- check-data ---- */

typedef struct check_ctx {
    const mgt_dataset *ds;
    char **reasons; /* n, NULL for a good file */
    mgt_sample_worker *sw;
    atomic_size_t done, bad;
    FILE *progress;
    double t0;
    atomic_long last_print_ms;
} check_ctx;

static int check_one(void *arg, int worker, size_t i)
{
    check_ctx *c = arg;
    mgt_image_view v;
    /* 3 channels decodes every layout the training can ask for */
    mgt_status st = mgt_sample_decode(&c->sw[worker], c->ds, i, 3, &v);
    if (st == MGT_ERR_OOM)
        return (int)st;
    if (st != MGT_OK) {
        char *r = strdup(mgt_error_last());
        if (!r)
            return (int)mgt_error_set(MGT_ERR_OOM, "check: out of memory");
        mgt_data_sanitize(r);
        c->reasons[i] = r;
        atomic_fetch_add(&c->bad, 1);
    }
    size_t done = atomic_fetch_add(&c->done, 1) + 1;
    if (c->progress && worker == 0) {
        long now_ms = (long)((mgt_time_now() - c->t0) * 1000);
        if (now_ms - atomic_load(&c->last_print_ms) >= 250) {
            atomic_store(&c->last_print_ms, now_ms);
            fprintf(c->progress, "\rchecking %s: %zu of %zu files, %zu bad (%.0f files/s)",
                    mgt_dataset_dir(c->ds), done, mgt_dataset_size(c->ds), atomic_load(&c->bad),
                    now_ms > 0 ? (double)done * 1000.0 / (double)now_ms : 0.0);
            fflush(c->progress);
        }
    }
    return 0;
}

mgt_status mgt_data_check(const mgt_dataset *ds, int workers, const mgt_abort *abort,
                          FILE *progress, mgt_bad_report_fn report, void *ctx, size_t *bad_count)
{
    size_t n = mgt_dataset_size(ds);
    if (workers <= 0)
        workers = mgt_cpu_count();
    check_ctx c = {.ds = ds, .progress = progress, .t0 = mgt_time_now()};
    atomic_init(&c.done, 0);
    atomic_init(&c.bad, 0);
    atomic_init(&c.last_print_ms, 0);
    c.reasons = calloc(n, sizeof *c.reasons);
    c.sw = calloc((size_t)workers, sizeof *c.sw);
    mgt_status st = MGT_OK;
    if (!c.reasons || !c.sw)
        st = mgt_error_set(MGT_ERR_OOM, "check: out of memory");
    for (int w = 0; st == MGT_OK && w < workers; w++)
        st = mgt_sample_worker_init(&c.sw[w]);
    if (st == MGT_OK)
        st = (mgt_status)mgt_data_parallel_for(n, workers, abort, check_one, &c);
    if (st == MGT_ERR_ABORTED)
        mgt_error_set(st, "check of %s aborted", mgt_dataset_dir(ds));
    if (progress && n > 0) {
        double dt = mgt_time_now() - c.t0;
        fprintf(progress, "\rchecked %s: %zu files, %zu bad, %.1f s (%.0f files/s)\n",
                mgt_dataset_dir(ds), atomic_load(&c.done), atomic_load(&c.bad), dt,
                dt > 0 ? (double)atomic_load(&c.done) / dt : 0.0);
    }
    size_t bad = 0;
    for (size_t i = 0; c.reasons && i < n; i++)
        if (c.reasons[i]) {
            bad++;
            if (report && st == MGT_OK)
                report(ctx, i, c.reasons[i]);
            free(c.reasons[i]);
        }
    for (int w = 0; c.sw && w < workers; w++)
        mgt_sample_worker_free(&c.sw[w]);
    free(c.reasons);
    free(c.sw);
    if (bad_count)
        *bad_count = bad;
    return st;
}

/* ---- --normalize auto ---- */

typedef struct stats_acc {
    double sum[3], sumsq[3], count;
    mgt_sample_worker sw;
    char pad[64]; /* keeps workers' accumulators off one cache line */
} stats_acc;

typedef struct stats_ctx {
    const mgt_dataset *ds;
    int channels;
    size_t n, m; /* dataset size, images looked at */
    stats_acc *acc;
} stats_ctx;

static int stats_one(void *arg, int worker, size_t k)
{
    stats_ctx *c = arg;
    size_t i = (size_t)((double)k * (double)c->n / (double)c->m);
    stats_acc *a = &c->acc[worker];
    mgt_image_view img;
    mgt_status st = mgt_sample_decode(&a->sw, c->ds, i, c->channels, &img);
    if (st == MGT_ERR_OOM)
        return (int)st;
    if (st != MGT_OK)
        return 0; /* bad files are check-data's business */
    size_t px = (size_t)img.w * img.h;
    for (int ch = 0; ch < c->channels; ch++) {
        /* integer sums per image are exact; the double totals then lose nothing that
           matters for a mean and a std */
        uint64_t s = 0, s2 = 0;
        for (int y = 0; y < img.h; y++)
            for (int x = 0; x < img.w; x++) {
                unsigned v = img.px[(size_t)y * img.stride + (size_t)x * c->channels + ch];
                s += v;
                s2 += v * v;
            }
        a->sum[ch] += (double)s / 255.0;
        a->sumsq[ch] += (double)s2 / (255.0 * 255.0);
    }
    a->count += (double)px;
    return 0;
}

mgt_status mgt_data_stats(const mgt_dataset *ds, int channels, size_t max_images, int workers,
                          const mgt_abort *abort, float mean[3], float std[3])
{
    if (channels != 1 && channels != 3)
        return mgt_error_set(MGT_ERR_INVALID, "stats: channels must be 1 or 3, not %d", channels);
    if (workers <= 0)
        workers = mgt_cpu_count();
    stats_ctx c = {.ds = ds, .channels = channels, .n = mgt_dataset_size(ds)};
    c.m = max_images > 0 && max_images < c.n ? max_images : c.n;
    c.acc = calloc((size_t)workers, sizeof *c.acc);
    if (!c.acc)
        return mgt_error_set(MGT_ERR_OOM, "stats: out of memory");
    mgt_status st = MGT_OK;
    for (int w = 0; st == MGT_OK && w < workers; w++)
        st = mgt_sample_worker_init(&c.acc[w].sw);
    if (st == MGT_OK)
        st = (mgt_status)mgt_data_parallel_for(c.m, workers, abort, stats_one, &c);
    if (st == MGT_ERR_ABORTED)
        mgt_error_set(st, "statistics of %s aborted", mgt_dataset_dir(ds));
    double sum[3] = {0}, sumsq[3] = {0}, count = 0;
    for (int w = 0; w < workers; w++) {
        for (int ch = 0; ch < channels; ch++) {
            sum[ch] += c.acc[w].sum[ch];
            sumsq[ch] += c.acc[w].sumsq[ch];
        }
        count += c.acc[w].count;
        mgt_sample_worker_free(&c.acc[w].sw);
    }
    free(c.acc);
    if (st != MGT_OK)
        return st;
    if (count == 0)
        return mgt_error_set(MGT_ERR_INVALID, "%s: no readable image to compute mean and std from",
                             mgt_dataset_dir(ds));
    for (int ch = 0; ch < channels; ch++) {
        double m = sum[ch] / count;
        double var = sumsq[ch] / count - m * m;
        mean[ch] = (float)m;
        std[ch] = (float)sqrt(var > 0 ? var : 0);
        if (!(std[ch] > 0))
            return mgt_error_set(MGT_ERR_INVALID,
                                 "%s: channel %d has the same value everywhere; its std is 0",
                                 mgt_dataset_dir(ds), ch);
    }
    for (int ch = channels; ch < 3; ch++) {
        mean[ch] = 0;
        std[ch] = 1;
    }
    return MGT_OK;
}
