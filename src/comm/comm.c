/* Broadcast and the bucketed tree all-reduce of gradients across the devices of one process.
 *
 * Buckets: the gradient arena is cut at layer boundaries into buckets (the first one small,
 * as DDP does), in the order backward completes them. When a device's backward has enqueued a
 * whole bucket, its thread records a `ready` event on its compute stream and counts the
 * bucket as arrived. The thread whose arrival completes a bucket on all devices enqueues that
 * bucket's whole reduction, for every device, on the comm streams: the tree up (device r
 * receives from r + 2^k into its receive buffer and adds), then the sum back down. Enqueueing
 * takes microseconds, so whichever thread comes last does it for everyone, under one lock,
 * and no thread blocks on another's device work. The sum order is fixed by the tree, so
 * results do not depend on thread timing, and every replica gets device 0's bytes.
 *
 * Across nodes (a world of more than one process) a bucket goes in three parts: the
 * reduce-scatter inside the node, the exchange of each device's shard with the other nodes,
 * the all-gather inside the node (nodes.c).
 *
 * With grad_dtype bf16 (one node), what crosses between devices is bf16: each device first
 * rounds its bucket in place (cast to 16 bits into its g16 copy of the arena and back), a
 * receiver decodes what arrives into its fp32 receive buffer, adds it to its own (bf16-valued)
 * gradients in fp32 and rounds the sum back into g16 and its gradients, and the sums travel
 * down (tree) or around (ring all-gather) as bf16, decoded into every device's gradients at the
 * end. The additions and their order are the fp32 path's, each followed by a rounding.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"

mgt_status mgt_comm_plan_buckets(const mgt_comm_config *cfg, size_t *ends, int *n)
{
    *n = 0;
    size_t start = 0, cap = cfg->first_bucket_bytes ? cfg->first_bucket_bytes : cfg->bucket_bytes;
    for (int i = 0; i < cfg->n_layer_ends; i++) {
        size_t e = cfg->layer_ends[i];
        if (e <= start || e > cfg->bytes || e % sizeof(float))
            return mgt_error_set(MGT_ERR_INVALID,
                                 "comm: layer end %zu is not increasing, float-aligned and "
                                 "within the %zu-byte arena",
                                 e, cfg->bytes);
        if (e - start >= cap || i == cfg->n_layer_ends - 1) {
            ends[(*n)++] = e;
            start = e;
            cap = cfg->bucket_bytes;
        }
    }
    if (start != cfg->bytes)
        return mgt_error_set(MGT_ERR_INVALID,
                             "comm: the last layer end %zu is not the arena's "
                             "size %zu",
                             start, cfg->bytes);
    return MGT_OK;
}

static mgt_status plan_buckets(mgt_comm *c, const mgt_comm_config *cfg)
{
    c->begin = calloc((size_t)cfg->n_layer_ends, sizeof *c->begin);
    c->end = calloc((size_t)cfg->n_layer_ends, sizeof *c->end);
    if (!c->begin || !c->end)
        return mgt_error_set(MGT_ERR_OOM, "comm: host memory exhausted");
    mgt_status st = mgt_comm_plan_buckets(cfg, c->end, &c->nb);
    for (int b = 0; b < c->nb; b++)
        c->begin[b] = b ? c->end[b - 1] : 0;
    return st;
}

mgt_status mgt_comm_create(mgt_devset *set, const mgt_comm_config *cfg, mgt_comm **out)
{
    *out = NULL;
    if (!set || !cfg || !cfg->grads || !cfg->layer_ends || cfg->n_layer_ends < 1 ||
        cfg->bucket_bytes == 0)
        return mgt_error_set(MGT_ERR_INVALID, "comm: incomplete configuration");
    mgt_comm *c = calloc(1, sizeof *c);
    if (!c)
        return mgt_error_set(MGT_ERR_OOM, "comm: host memory exhausted");
    c->set = set;
    c->n = cfg->devices ? cfg->n_devices : mgt_devset_count(set);
    if (c->n < 1 || c->n > MGT_MAX_DEVICES) {
        int n = c->n;
        free(c);
        return mgt_error_set(MGT_ERR_INVALID, "comm: %d devices", n);
    }
    for (int i = 0; i < c->n; i++)
        c->devs[i] = cfg->devices ? cfg->devices[i] : mgt_devset_device(set, i);
    c->bytes = cfg->bytes;
    c->algo = cfg->algo;
    c->world = cfg->world;
    c->abort = cfg->abort;
    c->nodes = mgt_world_size(cfg->world);
    c->bf16 = cfg->grad_dtype == MGT_PREC_BF16;
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cv, NULL);
    pthread_mutex_init(&c->bn_lock, NULL);
    pthread_cond_init(&c->bn_cv, NULL);
    mgt_status st = MGT_OK;
    if (cfg->grad_dtype != MGT_PREC_F32 && cfg->grad_dtype != MGT_PREC_BF16)
        st = mgt_error_set(MGT_ERR_INVALID, "--grad-dtype %s: the all-reduce runs in f32 or bf16",
                           mgt_precision_name(cfg->grad_dtype));
    else if (c->bf16 && c->nodes > 1)
        st = mgt_error_set(MGT_ERR_UNSUPPORTED,
                           "--grad-dtype bf16: the compressed all-reduce is for one node; across "
                           "%d processes the gradients are reduced in f32 (drop the flag)",
                           c->nodes);
    if (st == MGT_OK)
        st = plan_buckets(c, cfg);
    size_t n = (size_t)c->n, nb = (size_t)c->nb;
    if (st == MGT_OK) {
        c->grads = calloc(n, sizeof *c->grads);
        c->stream = calloc(n, sizeof *c->stream);
        c->recv = calloc(n, sizeof *c->recv);
        c->ready = calloc(n * nb, sizeof *c->ready);
        c->done = calloc(n * nb, sizeof *c->done);
        c->arrived = calloc(nb, sizeof *c->arrived);
        c->next = calloc(n, sizeof *c->next);
        c->steps = calloc(n, sizeof *c->steps);
        c->send = calloc(n, sizeof *c->send);
        c->recv_ev = calloc(n, sizeof *c->recv_ev);
        c->send_ev = calloc(n, sizeof *c->send_ev);
        c->bn_src = calloc(n, sizeof *c->bn_src);
        c->g16 = calloc(n, sizeof *c->g16);
        c->recv16 = calloc(n, sizeof *c->recv16);
        if (!c->g16 || !c->recv16 || !c->bn_src || !c->grads || !c->stream || !c->recv ||
            !c->ready || !c->done || !c->arrived || !c->next || !c->steps || !c->send ||
            !c->recv_ev || !c->send_ev)
            st = mgt_error_set(MGT_ERR_OOM, "comm: host memory exhausted");
    }
    size_t largest = 0;
    for (int b = 0; b < c->nb; b++)
        if (c->end[b] - c->begin[b] > largest)
            largest = c->end[b] - c->begin[b];
    for (int i = 0; i < c->n && st == MGT_OK; i++) {
        mgt_device *d = c->devs[i];
        c->grads[i] = cfg->grads[i];
        st = mgt_stream_create(d, &c->stream[i]);
        if (st == MGT_OK && c->n > 1)
            st = mgt_buffer_alloc(d, largest, &c->recv[i]);
        if (st == MGT_OK && c->n > 1 && c->bf16)
            st = mgt_buffer_alloc(d, c->bytes / 2 + 2, &c->g16[i]);
        if (st == MGT_OK && c->n > 1 && c->bf16)
            st = mgt_buffer_alloc(d, largest / 2 + 2, &c->recv16[i]);
        if (st == MGT_OK && c->n > 1 && c->algo == MGT_ALLREDUCE_RING) {
            st = mgt_stream_create(d, &c->send[i]);
            if (st == MGT_OK)
                st = mgt_event_create(d, &c->recv_ev[i]);
            if (st == MGT_OK)
                st = mgt_event_create(d, &c->send_ev[i]);
        }
        for (int b = 0; b < c->nb && st == MGT_OK; b++) {
            st = mgt_event_create(d, &c->ready[(size_t)i * nb + (size_t)b]);
            if (st == MGT_OK)
                st = mgt_event_create(d, &c->done[(size_t)i * nb + (size_t)b]);
        }
    }
    if (st == MGT_OK && c->nodes > 1)
        st = comm_nodes_create(c, cfg);
    if (st != MGT_OK) {
        mgt_comm_free(c);
        return st;
    }
    *out = c;
    return MGT_OK;
}

void mgt_comm_free(mgt_comm *c)
{
    if (!c)
        return;
    mgt_error_saved saved; /* on mgt_comm_create's error path: its cause stays the text */
    mgt_error_save(&saved);
    comm_nodes_stop(c);
    for (int i = 0; c->stream && i < c->n; i++)
        if (c->stream[i])
            mgt_stream_synchronize(c->stream[i], NULL);
    comm_nodes_free(c);
    for (int i = 0; c->stream && i < c->n; i++)
        mgt_stream_free(c->stream[i]);
    for (int i = 0; c->send && i < c->n; i++) {
        mgt_stream_free(c->send[i]);
        mgt_event_free(c->recv_ev[i]);
        mgt_event_free(c->send_ev[i]);
    }
    free(c->send);
    free(c->recv_ev);
    free(c->send_ev);
    for (size_t k = 0; c->ready && c->done && k < (size_t)c->n * (size_t)c->nb; k++) {
        mgt_event_free(c->ready[k]);
        mgt_event_free(c->done[k]);
    }
    for (int i = 0; c->recv && i < c->n; i++)
        mgt_buffer_free(c->recv[i]);
    for (int i = 0; c->g16 && c->recv16 && i < c->n; i++) {
        mgt_buffer_free(c->g16[i]);
        mgt_buffer_free(c->recv16[i]);
    }
    free(c->g16);
    free(c->recv16);
    free(c->grads);
    free(c->stream);
    free(c->recv);
    free(c->ready);
    free(c->done);
    free(c->arrived);
    free(c->next);
    free(c->steps);
    free(c->begin);
    free(c->end);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cv);
    free(c->bn_src);
    pthread_mutex_destroy(&c->bn_lock);
    pthread_cond_destroy(&c->bn_cv);
    free(c);
    mgt_error_restore(&saved);
}

int mgt_comm_bucket_count(const mgt_comm *c) { return c->nb; }

void mgt_comm_bucket_range(const mgt_comm *c, int b, size_t *begin, size_t *end)
{
    *begin = c->begin[b];
    *end = c->end[b];
}

int comm_top_level(int n)
{
    int k = 1;
    while (2 * k < n)
        k *= 2;
    return k;
}

mgt_status mgt_allreduce_algo_parse(const char *s, mgt_allreduce_algo *out)
{
    if (strcmp(s, "tree") == 0)
        *out = MGT_ALLREDUCE_TREE;
    else if (strcmp(s, "ring") == 0)
        *out = MGT_ALLREDUCE_RING;
    else
        return mgt_error_set(MGT_ERR_INVALID, "--allreduce '%s': expected tree or ring", s);
    return MGT_OK;
}

void comm_ring_chunk(size_t count, int n, int k, size_t *lo, size_t *hi)
{
    size_t q = count / (size_t)n, r = count % (size_t)n, kk = (size_t)k;
    *lo = kk * q + (kk < r ? kk : r);
    *hi = *lo + q + (kk < r ? 1 : 0);
}

/* ---- the bf16 all-reduce (grad_dtype bf16) ---- */

/* Device i's bf16 copy of the arena at the fp32 byte offset off. */
static uint16_t *g16_at(const mgt_comm *c, int i, size_t off)
{
    return (uint16_t *)mgt_buffer_ptr(c->g16[i]) + off / sizeof(float);
}

/* cnt floats of device i's gradients at byte o rounded to bf16, in place and into g16. */
static mgt_status round_own(mgt_comm *c, int i, size_t o, size_t cnt)
{
    mgt_status st =
        mgt_cast_to_16(c->stream[i], MGT_PREC_BF16, g16_at(c, i, o), comm_at(c->grads[i], o), cnt);
    if (st == MGT_OK)
        st = mgt_cast_from_16(c->stream[i], MGT_PREC_BF16, comm_at(c->grads[i], o), g16_at(c, i, o),
                              cnt);
    return st;
}

/* Device dst receives src's bf16 values of cnt floats at byte o (sent from src_stream),
   decodes them, adds them to its own in fp32 and rounds the sum back into g16 and its
   gradients. */
static mgt_status add16(mgt_comm *c, int dst, int src, mgt_stream *src_stream, size_t o, size_t cnt)
{
    uint16_t *r16 = mgt_buffer_ptr(c->recv16[dst]);
    float *r32 = mgt_buffer_ptr(c->recv[dst]);
    mgt_status st =
        mgt_copy_peer(c->stream[dst], r16, src_stream, g16_at(c, src, o), cnt * sizeof(uint16_t));
    if (st == MGT_OK)
        st = mgt_cast_from_16(c->stream[dst], MGT_PREC_BF16, r32, r16, cnt);
    if (st == MGT_OK)
        st = mgt_axpy(c->stream[dst], comm_at(c->grads[dst], o), 1.0f, r32, cnt);
    return st == MGT_OK ? round_own(c, dst, o, cnt) : st;
}

/* Every device's bucket [off, off + len) decoded from its g16 copy, which holds the sum. */
static mgt_status decode_all(mgt_comm *c, size_t off, size_t len)
{
    mgt_status st = MGT_OK;
    for (int i = 0; i < c->n && st == MGT_OK; i++)
        st = mgt_cast_from_16(c->stream[i], MGT_PREC_BF16, comm_at(c->grads[i], off),
                              g16_at(c, i, off), len / sizeof(float));
    return st;
}

/* The tree of enqueue_bucket in bf16: the same pairs and order; bf16 on every link. */
static mgt_status enqueue_tree16(mgt_comm *c, size_t off, size_t len)
{
    size_t cnt = len / sizeof(float);
    mgt_status st = MGT_OK;
    for (int i = 0; i < c->n && st == MGT_OK; i++)
        st = round_own(c, i, off, cnt);
    for (int k = 1; k < c->n && st == MGT_OK; k *= 2)
        for (int r = 0; r + k < c->n && st == MGT_OK; r += 2 * k)
            st = add16(c, r, r + k, c->stream[r + k], off, cnt);
    for (int k = comm_top_level(c->n); k >= 1 && st == MGT_OK; k /= 2)
        for (int r = 0; r + k < c->n && st == MGT_OK; r += 2 * k)
            st = mgt_copy_peer(c->stream[r + k], g16_at(c, r + k, off), c->stream[r],
                               g16_at(c, r, off), cnt * sizeof(uint16_t));
    return st == MGT_OK ? decode_all(c, off, len) : st;
}

/* Start of a ring step: each device's sends wait for the receives of its previous step (the
   chunk it sends now is the one it finished then). Recorded for all devices before any copy
   of the step is enqueued, so no send waits for a receive of the same step: the n transfers
   of a step run side by side, not one after another around the ring. */
static mgt_status ring_step_begin(mgt_comm *c)
{
    mgt_status st = MGT_OK;
    for (int i = 0; i < c->n && st == MGT_OK; i++) {
        st = mgt_event_record(c->recv_ev[i], c->stream[i]);
        if (st == MGT_OK)
            st = mgt_stream_wait_event(c->send[i], c->recv_ev[i]);
    }
    return st;
}

/* Ring over the bucket's floats: in reduce-scatter step s device i sends chunk (i - s) to
   i + 1, which adds it to its own; after n - 1 steps device i holds the full sum of chunk
   (i + 1); in all-gather step s device i sends chunk (i + 1 - s) on, which overwrites. A
   device receives (copy, add) on its comm stream and sends from its send stream, so its
   receive and its send of one step overlap. */
static mgt_status enqueue_ring(mgt_comm *c, size_t off, size_t len)
{
    int n = c->n;
    size_t count = len / sizeof(float);
    mgt_status st = MGT_OK;
    for (int i = 0; i < n && c->bf16 && st == MGT_OK; i++)
        st = round_own(c, i, off, count);
    for (int s = 0; s < n - 1 && st == MGT_OK; s++) {
        st = ring_step_begin(c);
        for (int i = 0; i < n && st == MGT_OK; i++) {
            int to = (i + 1) % n, k = ((i - s) % n + n) % n;
            size_t lo, hi;
            comm_ring_chunk(count, n, k, &lo, &hi);
            if (hi == lo)
                continue;
            if (c->bf16) {
                st = add16(c, to, i, c->send[i], off + lo * sizeof(float), hi - lo);
                continue;
            }
            float *recv = mgt_buffer_ptr(c->recv[to]);
            st = mgt_copy_peer(c->stream[to], recv, c->send[i],
                               comm_at(c->grads[i], off + lo * sizeof(float)),
                               (hi - lo) * sizeof(float));
            if (st == MGT_OK)
                st = mgt_axpy(c->stream[to], comm_at(c->grads[to], off + lo * sizeof(float)), 1.0f,
                              recv, hi - lo);
        }
    }
    for (int s = 0; s < n - 1 && st == MGT_OK; s++) {
        st = ring_step_begin(c);
        for (int i = 0; i < n && st == MGT_OK; i++) {
            int to = (i + 1) % n, k = ((i + 1 - s) % n + n) % n;
            size_t lo, hi;
            comm_ring_chunk(count, n, k, &lo, &hi);
            if (hi == lo)
                continue;
            size_t o = off + lo * sizeof(float);
            if (c->bf16)
                st = mgt_copy_peer(c->stream[to], g16_at(c, to, o), c->send[i], g16_at(c, i, o),
                                   (hi - lo) * sizeof(uint16_t));
            else
                st = mgt_copy_peer(c->stream[to], comm_at(c->grads[to], o), c->send[i],
                                   comm_at(c->grads[i], o), (hi - lo) * sizeof(float));
        }
    }
    /* the gradients must not change (next step's backward) while a send still reads them */
    for (int i = 0; i < n && st == MGT_OK; i++) {
        st = mgt_event_record(c->send_ev[i], c->send[i]);
        if (st == MGT_OK)
            st = mgt_stream_wait_event(c->stream[i], c->send_ev[i]);
    }
    return st == MGT_OK && c->bf16 ? decode_all(c, off, len) : st;
}

/* The whole reduction of bucket b on every device's comm stream. Called with c->lock held. */
static mgt_status enqueue_bucket(mgt_comm *c, int b)
{
    size_t off = c->begin[b], len = c->end[b] - c->begin[b], nb = (size_t)c->nb;
    mgt_status st = MGT_OK;
    for (int i = 0; i < c->n && st == MGT_OK; i++)
        st = mgt_stream_wait_event(c->stream[i], c->ready[(size_t)i * nb + (size_t)b]);
    if (st == MGT_OK && c->nodes > 1)
        return comm_nodes_enqueue(c, b);
    if (c->n > 1 && c->algo == MGT_ALLREDUCE_RING) {
        if (st == MGT_OK)
            st = enqueue_ring(c, off, len);
    } else if (c->n > 1 && c->bf16) {
        if (st == MGT_OK)
            st = enqueue_tree16(c, off, len);
    } else if (c->n > 1) {
        for (int k = 1; k < c->n && st == MGT_OK; k *= 2)
            for (int r = 0; r + k < c->n && st == MGT_OK; r += 2 * k) {
                float *recv = mgt_buffer_ptr(c->recv[r]);
                st = mgt_copy_peer(c->stream[r], recv, c->stream[r + k],
                                   comm_at(c->grads[r + k], off), len);
                if (st == MGT_OK)
                    st = mgt_axpy(c->stream[r], comm_at(c->grads[r], off), 1.0f, recv,
                                  len / sizeof(float));
            }
        for (int k = comm_top_level(c->n); k >= 1 && st == MGT_OK; k /= 2)
            for (int r = 0; r + k < c->n && st == MGT_OK; r += 2 * k)
                st = mgt_copy_peer(c->stream[r + k], comm_at(c->grads[r + k], off), c->stream[r],
                                   comm_at(c->grads[r], off), len);
    }
    /* every sound device's done mark, even when the bucket was left half enqueued (a peer
       failed): its optimizer waits on that mark (mgt_comm_step_end), and a copy already queued
       into its gradients, a NaN one out of the failed peer included, must land before the
       update reads them. A stale mark would let the update run beside the copy. */
    char text[512] = "";
    if (st != MGT_OK)
        snprintf(text, sizeof text, "%s", mgt_error_last());
    for (int i = 0; i < c->n; i++) {
        mgt_status rs = mgt_event_record(c->done[(size_t)i * nb + (size_t)b], c->stream[i]);
        if (st == MGT_OK && rs != MGT_OK) {
            st = rs;
            snprintf(text, sizeof text, "%s", mgt_error_last());
        }
    }
    return st == MGT_OK ? MGT_OK : mgt_error_set(st, "%s", text);
}

mgt_status mgt_comm_step_begin(mgt_comm *c, int dev)
{
    if (dev < 0 || dev >= c->n)
        return mgt_error_set(MGT_ERR_INVALID, "comm: no device %d", dev);
    pthread_mutex_lock(&c->lock);
    c->next[dev] = 0;
    pthread_mutex_unlock(&c->lock);
    return MGT_OK;
}

mgt_status mgt_comm_grads_ready(mgt_comm *c, int dev, mgt_stream *compute, size_t done)
{
    size_t nb = (size_t)c->nb;
    mgt_status st = MGT_OK;
    /* next[dev] is only written by dev's own thread, so reading it unlocked is safe */
    while (st == MGT_OK && c->next[dev] < c->nb && c->end[c->next[dev]] <= done) {
        int b = c->next[dev];
        st = mgt_event_record(c->ready[(size_t)dev * nb + (size_t)b], compute);
        if (st != MGT_OK)
            break;
        pthread_mutex_lock(&c->lock);
        c->next[dev] = b + 1;
        if (++c->arrived[b] == c->n) {
            c->arrived[b] = 0;
            st = enqueue_bucket(c, b);
            if (c->nodes == 1) { /* across nodes the comm thread of the last shard counts it */
                c->enqueued++;
                pthread_cond_broadcast(&c->cv);
            }
        }
        pthread_mutex_unlock(&c->lock);
    }
    return st;
}

mgt_status mgt_comm_error(mgt_comm *c)
{
    pthread_mutex_lock(&c->lock);
    mgt_status st = c->failed ? c->fail_status : MGT_OK;
    if (st != MGT_OK)
        mgt_error_set(st, "%s", c->fail_text);
    pthread_mutex_unlock(&c->lock);
    return st;
}

mgt_status mgt_comm_step_end(mgt_comm *c, int dev, mgt_stream *compute, const mgt_abort *abort)
{
    mgt_status st = mgt_comm_grads_ready(c, dev, compute, c->bytes);
    if (st != MGT_OK)
        return st;
    pthread_mutex_lock(&c->lock);
    long target = (c->steps[dev] + 1) * c->nb;
    while (c->enqueued < target) {
        if (c->failed) {
            mgt_status fst = c->fail_status;
            char text[sizeof c->fail_text];
            snprintf(text, sizeof text, "%s", c->fail_text);
            pthread_mutex_unlock(&c->lock);
            return mgt_error_set(fst, "%s", text);
        }
        if (mgt_abort_is_raised(abort)) {
            pthread_mutex_unlock(&c->lock);
            return mgt_error_set(MGT_ERR_ABORTED,
                                 "comm: device %d's wait for the gradient "
                                 "all-reduce aborted",
                                 dev);
        }
        mgt_cond_wait_slice(&c->cv, &c->lock);
    }
    c->steps[dev]++;
    pthread_mutex_unlock(&c->lock);
    /* buckets are enqueued in order on each comm stream, so the last one's event covers all */
    return mgt_stream_wait_event(compute, c->done[(size_t)dev * (size_t)c->nb + (size_t)c->nb - 1]);
}

mgt_status mgt_comm_broadcast(mgt_comm *c, mgt_stream **streams, float **bufs, size_t bytes,
                              int root)
{
    if (root < 0 || root >= c->n)
        return mgt_error_set(MGT_ERR_INVALID, "comm: broadcast root %d out of range", root);
    if (c->n == 1 || bytes == 0)
        return MGT_OK;
    mgt_status st = MGT_OK;
    /* positions relative to the root: position v is device (v + root) % n */
    for (int k = comm_top_level(c->n); k >= 1 && st == MGT_OK; k /= 2)
        for (int v = 0; v + k < c->n && st == MGT_OK; v += 2 * k) {
            int from = (v + root) % c->n, to = (v + k + root) % c->n;
            st = mgt_copy_peer(streams[to], bufs[to], streams[from], bufs[from], bytes);
        }
    return st;
}

/* One phase of the gather's barrier: the last device to arrive moves the generation on;
   the others wait for it, abortably. Called and returns with bn_lock held. */
static mgt_status bn_phase(mgt_comm *c, int *count, long *gen, const mgt_abort *abort)
{
    long g = *gen;
    if (++*count == c->n) {
        *count = 0;
        ++*gen;
        pthread_cond_broadcast(&c->bn_cv);
        return MGT_OK;
    }
    while (*gen == g) {
        if (abort && mgt_abort_is_raised(abort))
            return mgt_error_set(MGT_ERR_ABORTED, "comm: batch-norm exchange aborted");
        mgt_cond_wait_slice(&c->bn_cv, &c->bn_lock);
    }
    return MGT_OK;
}

mgt_status mgt_comm_bn_gather(mgt_comm *c, int dev, const double *mine, double *all, size_t n,
                              const mgt_abort *abort)
{
    if (c->nodes > 1)
        return mgt_error_set(MGT_ERR_UNSUPPORTED,
                             "comm: the batch-norm exchange spans the devices of one node only");
    pthread_mutex_lock(&c->bn_lock);
    c->bn_src[dev] = mine;
    mgt_status st = bn_phase(c, &c->bn_in, &c->bn_gen1, abort);
    if (st == MGT_OK) {
        /* every source stays put until every device has copied it (phase 2) */
        for (int j = 0; j < c->n; j++)
            memcpy(all + (size_t)j * n, c->bn_src[j], n * sizeof *all);
        st = bn_phase(c, &c->bn_out, &c->bn_gen2, abort);
    }
    pthread_mutex_unlock(&c->bn_lock);
    return st;
}
