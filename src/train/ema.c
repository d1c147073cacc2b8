/* --model-ema: torchvision's references' ExponentialMovingAverage (an AveragedModel over
   parameters and buffers, use_buffers=True) on every replica: the decay adjusted for the
   batch and the update interval, the first update a copy, n_averaged reset during the
   warm-up; validated beside the model by swapping its weights in, checkpointed as
   "model_ema.<name>" tensors with n_averaged in the metadata. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/train_impl.h"

mgt_status train_ema_create(run *r, worker *w)
{
    if (!r->c->model_ema)
        return MGT_OK;
    size_t pb, bb;
    int nbn;
    mgt_model_params(w->model, &pb);
    mgt_model_buffers(w->model, &bb);
    mgt_model_bn_counts(w->model, &nbn);
    mgt_status st = mgt_buffer_alloc(w->d, pb, &w->ema.params);
    if (st == MGT_OK)
        st = mgt_buffer_alloc(w->d, pb, &w->ema.stash_params);
    if (st == MGT_OK && bb)
        st = mgt_buffer_alloc(w->d, bb, &w->ema.buffers);
    if (st == MGT_OK && bb)
        st = mgt_buffer_alloc(w->d, bb, &w->ema.stash_buffers);
    w->ema.counts = calloc((size_t)nbn + 1, sizeof(int64_t));
    w->ema.stash_counts = calloc((size_t)nbn + 1, sizeof(int64_t));
    if (st == MGT_OK && (!w->ema.counts || !w->ema.stash_counts))
        st = mgt_error_set(MGT_ERR_OOM, "--model-ema: host memory exhausted");
    return st;
}

void train_ema_free(worker *w)
{
    mgt_buffer_free(w->ema.params);
    mgt_buffer_free(w->ema.buffers);
    mgt_buffer_free(w->ema.stash_params);
    mgt_buffer_free(w->ema.stash_buffers);
    free(w->ema.counts);
    free(w->ema.stash_counts);
    memset(&w->ema, 0, sizeof w->ema);
}

static void *ptr_or_null(mgt_buffer *b) { return b ? mgt_buffer_ptr(b) : NULL; }

mgt_status train_ema_update(worker *w)
{
    run *r = w->r;
    size_t pb, bb;
    int nbn;
    float *p = mgt_model_params(w->model, &pb), *b = mgt_model_buffers(w->model, &bb);
    int64_t *counts = mgt_model_bn_counts(w->model, &nbn);
    float *ep = mgt_buffer_ptr(w->ema.params), *eb = ptr_or_null(w->ema.buffers);
    mgt_status st;
    if (w->ema.n_averaged == 0) {
        st = mgt_copy_d2d(w->s, ep, p, pb);
        if (st == MGT_OK && bb)
            st = mgt_copy_d2d(w->s, eb, b, bb);
        memcpy(w->ema.counts, counts, (size_t)nbn * sizeof *counts);
    } else {
        st = mgt_ema_average(w->s, ep, p, pb / sizeof(float), r->ema_decay);
        if (st == MGT_OK && bb)
            st = mgt_ema_average(w->s, eb, b, bb / sizeof(float), r->ema_decay);
        /* num_batches_tracked is averaged too: int64 * float gives float32, copied back
           into int64 (truncated), as torch does */
        float d = (float)r->ema_decay, k = (float)(1.0 - r->ema_decay);
        for (int i = 0; i < nbn; i++)
            w->ema.counts[i] = (int64_t)(d * (float)w->ema.counts[i] + k * (float)counts[i]);
    }
    if (st != MGT_OK)
        return st;
    w->ema.n_averaged++;
    /* train.py: "Reset ema buffer to keep copying weights during warmup period" */
    if (r->epoch < r->lr.warmup_epochs)
        w->ema.n_averaged = 0;
    return MGT_OK;
}

/* dst <- src for the params, buffers and counters of one replica, on its stream. */
static mgt_status copy_set(worker *w, float *dp, float *db, int64_t *dc, const float *sp,
                           const float *sb, const int64_t *sc)
{
    size_t pb, bb;
    int nbn;
    mgt_model_params(w->model, &pb);
    mgt_model_buffers(w->model, &bb);
    mgt_model_bn_counts(w->model, &nbn);
    mgt_status st = mgt_copy_d2d(w->s, dp, sp, pb);
    if (st == MGT_OK && bb)
        st = mgt_copy_d2d(w->s, db, sb, bb);
    memcpy(dc, sc, (size_t)nbn * sizeof *dc);
    return st;
}

mgt_status train_ema_swap_in(run *r)
{
    mgt_status st = MGT_OK;
    for (int i = 0; i < r->n && st == MGT_OK; i++) {
        worker *w = &r->w[i];
        float *p = mgt_model_params(w->model, NULL), *b = mgt_model_buffers(w->model, NULL);
        int64_t *c = mgt_model_bn_counts(w->model, NULL);
        st = copy_set(w, mgt_buffer_ptr(w->ema.stash_params), ptr_or_null(w->ema.stash_buffers),
                      w->ema.stash_counts, p, b, c);
        if (st == MGT_OK)
            st = copy_set(w, p, b, c, mgt_buffer_ptr(w->ema.params), ptr_or_null(w->ema.buffers),
                          w->ema.counts);
    }
    /* replica 0's EMA statistics for all, as the model's own are before validation; kept
       in every replica's EMA so that all of them hold the same from here on */
    if (st == MGT_OK)
        st = train_broadcast(r, TRAIN_SYNC_BUFFERS);
    for (int i = 0; i < r->n && st == MGT_OK; i++) {
        worker *w = &r->w[i];
        size_t bb;
        float *b = mgt_model_buffers(w->model, &bb);
        int nbn;
        int64_t *c = mgt_model_bn_counts(w->model, &nbn);
        if (bb)
            st = mgt_copy_d2d(w->s, mgt_buffer_ptr(w->ema.buffers), b, bb);
        memcpy(w->ema.counts, c, (size_t)nbn * sizeof *c);
    }
    return st;
}

mgt_status train_ema_swap_out(run *r)
{
    mgt_status st = MGT_OK;
    for (int i = 0; i < r->n && st == MGT_OK; i++) {
        worker *w = &r->w[i];
        st = copy_set(w, mgt_model_params(w->model, NULL), mgt_model_buffers(w->model, NULL),
                      mgt_model_bn_counts(w->model, NULL), mgt_buffer_ptr(w->ema.stash_params),
                      ptr_or_null(w->ema.stash_buffers), w->ema.stash_counts);
    }
    for (int i = 0; i < r->n && st == MGT_OK; i++)
        st = mgt_stream_synchronize(r->w[i].s, &r->abort);
    return st;
}

/* ---- checkpoints ---- */

mgt_status train_ema_add_to_writer(run *r, mgt_st_writer *wr, void **host)
{
    *host = NULL;
    if (!r->c->model_ema)
        return MGT_OK;
    worker *w = &r->w[0];
    size_t pb, bb;
    int nt, nbn;
    mgt_model_params(w->model, &pb);
    mgt_model_buffers(w->model, &bb);
    mgt_model_bn_counts(w->model, &nbn);
    const mgt_model_entry *t = mgt_model_table(w->model, &nt);
    char *h = malloc(pb + bb + (size_t)nbn * sizeof(int64_t) + 1);
    if (!h)
        return mgt_error_set(MGT_ERR_OOM, "checkpoint: host memory exhausted");
    *host = h;
    char *hb = h + pb, *hc = hb + bb;
    mgt_status st = mgt_copy_d2h(w->s, h, mgt_buffer_ptr(w->ema.params), pb);
    if (st == MGT_OK && bb)
        st = mgt_copy_d2h(w->s, hb, mgt_buffer_ptr(w->ema.buffers), bb);
    if (st == MGT_OK)
        st = mgt_stream_synchronize(w->s, &r->abort);
    memcpy(hc, w->ema.counts, (size_t)nbn * sizeof(int64_t));
    for (int e = 0; e < nt && st == MGT_OK; e++) {
        const mgt_model_entry *te = &t[e];
        const char *data = te->role == MGT_MODEL_PARAM    ? h + te->offset
                           : te->role == MGT_MODEL_BUFFER ? hb + te->offset
                           : te->role == MGT_MODEL_INDEX
                               ? (const char *)mgt_model_index_values(w->model, te)
                               : hc + te->offset * sizeof(int64_t);
        char name[160];
        snprintf(name, sizeof name, TRAIN_EMA_PREFIX "%s", te->name);
        st = mgt_st_writer_add(wr, name, mgt_model_entry_i64(te) ? MGT_ST_I64 : MGT_ST_F32,
                               te->ndim, te->shape, data);
    }
    return st;
}

mgt_status train_ema_load(run *r, const mgt_st_file *f, const char *path, long n_averaged)
{
    if (!r->c->model_ema)
        return MGT_OK;
    worker *w0 = &r->w[0];
    int nt, found = 0;
    const mgt_model_entry *t = mgt_model_table(w0->model, &nt);
    for (int e = 0; e < nt; e++) {
        char name[160];
        snprintf(name, sizeof name, TRAIN_EMA_PREFIX "%s", t[e].name);
        found += mgt_st_find(f, name) >= 0;
    }
    if (found == 0) { /* a checkpoint of a run without --model-ema: the EMA starts here */
        fprintf(r->out, "=> %s holds no EMA model: --model-ema starts from these weights\n", path);
        for (int i = 0; i < r->n; i++)
            r->w[i].ema.n_averaged = 0;
        return MGT_OK;
    }
    if (found < nt)
        return mgt_error_set(MGT_ERR_INVALID, "%s: holds %d of the %d model_ema tensors", path,
                             found, nt);
    mgt_status st = MGT_OK;
    for (int e = 0; e < nt && st == MGT_OK; e++) {
        const mgt_model_entry *te = &t[e];
        char name[160];
        snprintf(name, sizeof name, TRAIN_EMA_PREFIX "%s", te->name);
        int i = mgt_st_find(f, name);
        size_t bytes = te->role == MGT_MODEL_COUNTER ? sizeof(int64_t)
                       : te->role == MGT_MODEL_INDEX ? te->numel * sizeof(int64_t)
                                                     : te->numel * sizeof(float);
        mgt_st_dtype want = mgt_model_entry_i64(te) ? MGT_ST_I64 : MGT_ST_F32;
        if (mgt_st_tensor_dtype(f, i) != want || mgt_st_tensor_bytes(f, i) != bytes)
            return mgt_error_set(
                MGT_ERR_INVALID, "%s: %s does not fit this model (%zu bytes of %s)", path, name,
                mgt_st_tensor_bytes(f, i), mgt_st_dtype_name(mgt_st_tensor_dtype(f, i)));
        const void *data = mgt_st_tensor_data(f, i);
        if (want == MGT_ST_F32)
            for (size_t k = 0; k < te->numel; k++) {
                float v;
                memcpy(&v, (const char *)data + k * sizeof v, sizeof v);
                if (!isfinite(v))
                    return mgt_error_set(MGT_ERR_INVALID, "%s: %s holds %s at element %zu", path,
                                         name, isnan(v) ? "NaN" : "Inf", k);
            }
        if (te->role == MGT_MODEL_INDEX) { /* a constant: only checked */
            if (memcmp(data, mgt_model_index_values(w0->model, te), bytes) != 0)
                return mgt_error_set(MGT_ERR_INVALID, "%s: %s holds other values than the model's",
                                     path, name);
            continue;
        }
        for (int j = 0; j < r->n && st == MGT_OK; j++) {
            worker *w = &r->w[j];
            if (te->role == MGT_MODEL_COUNTER)
                memcpy(&w->ema.counts[te->offset], data, sizeof(int64_t));
            else
                st =
                    mgt_copy_h2d(w->s,
                                 (char *)mgt_buffer_ptr(
                                     te->role == MGT_MODEL_PARAM ? w->ema.params : w->ema.buffers) +
                                     te->offset,
                                 data, bytes);
        }
    }
    for (int j = 0; j < r->n && st == MGT_OK; j++) {
        st = mgt_stream_synchronize(r->w[j].s, &r->abort);
        r->w[j].ema.n_averaged = n_averaged;
    }
    return st;
}
