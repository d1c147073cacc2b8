/* The prefetching loader: decode threads fill a small ring of batches per device in pinned
 * host memory, each batch is copied to its device on a copy stream as soon as it is
 * complete, and the device's worker thread takes it with an event to wait on.
 *
 * Work is handed out by sample, oldest batch first over all devices, so that -j threads
 * stay busy however few batches are in flight. Everything that decides what a batch holds
 * (the epoch's order, a sample's random stream, the replacement of a bad file) is a
 * function of (seed, epoch, index), never of which thread got there first.
 *
 * Slot life: FREE -> (PREP: wait until the previous copy out of its host buffer ran) ->
 * FILL (samples claimed and decoded) -> READY (copy enqueued) -> HELD (by the consumer) ->
 * FREE at the consumer's next call, which records on its stream when the device copy may be
 * overwritten.
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/internal.h"

enum slot_state { SLOT_FREE, SLOT_PREP, SLOT_FILL, SLOT_READY, SLOT_HELD };

typedef struct slot {
    enum slot_state state;
    unsigned gen;   /* the loader's generation when this batch was assigned */
    int64_t ticket; /* the rank's batch number since set_epoch */
    int64_t epoch;
    size_t batch; /* within the epoch */
    int n;
    int next_sample;   /* first sample not yet claimed */
    int done;          /* samples finished */
    int outstanding;   /* claims (and a PREP) in flight */
    bool copy_pending; /* a copy out of host[] was enqueued and may not have run */
    bool consumed_recorded;
    uint8_t *host; /* labels, partners' labels, mix weights (each block aligned), images */
    int32_t *labels_host;
    int32_t *labels_b_host; /* the partner's label (mixing; else the sample's own) */
    float *weights_host;    /* the weight of labels_host (mixing; else 1) */
    size_t *partners;       /* with mixing: the partner's dataset index */
    size_t *places;         /* with mixing: the sample's place in the epoch's order */
    /* the key of each sample's (and partner's) augmentation draws: its dataset index, plus
       n times its repeat number under RA (so an image's repeats are augmented apart) */
    size_t *keys, *partner_keys;
    float *images_host;
    size_t *indices; /* dataset index per sample (original, then replacement) */
    mgt_buffer *dev;
    mgt_event *copied;   /* the H2D copy of this batch has run */
    mgt_event *consumed; /* the consumer's reads of this batch have run */
} slot;

typedef struct rank_state {
    mgt_device *dev;
    mgt_stream *copy;
    slot *slots;
    int64_t assign_next;  /* next ticket to assign */
    int64_t consume_next; /* next ticket the consumer takes */
    int held;             /* slot held by the consumer, -1 none */
    size_t count;         /* samples per epoch */
    size_t batches;       /* batches per epoch */
    double wait_total;
    long calls;
} rank_state;

typedef struct worker {
    mgt_loader *l;
    int id;
    bool ready;                   /* sw initialised */
    mgt_sample_worker sw;         /* decoder and buffers, reused */
    float *partner;               /* with mixing: the partner's image */
    atomic_uint_fast64_t growths; /* sw's, published after each sample */
} worker;

typedef struct order_cache {
    int64_t epoch;
    bool valid;
    size_t *order;
} order_cache;

struct mgt_loader {
    mgt_loader_options o;
    mgt_sampler sampler;
    size_t n; /* dataset size */
    int nslots;
    int chunk;          /* samples per claim */
    size_t img_floats;  /* per sample */
    size_t block_bytes; /* one of the three label blocks at a slot's head, aligned */
    size_t label_bytes; /* the three of them */
    bool mixing;
    size_t slot_bytes;
    rank_state *ranks;

    pthread_mutex_t lock;
    pthread_cond_t cond; /* a slot changed state or work appeared */
    pthread_t *threads;
    int nthreads;
    worker *workers; /* nthreads, then one per rank for inline decoding */
    int nworkers;
    mgt_abort quit; /* raised by mgt_loader_free */

    bool started;
    unsigned gen;
    int64_t base_epoch;
    size_t base_batch;
    int64_t last_epoch; /* non-continuous: the epoch set last */
    order_cache orders[2];

    _Atomic unsigned char *bad; /* n flags: known bad */
    size_t bad_count;
    atomic_uint_fast64_t images_done;

    mgt_status err; /* the first fatal error */
    char errtext[1024];
};

/* ---- helpers (lock held unless said otherwise) ---- */

static bool stopping(const mgt_loader *l)
{
    return mgt_abort_is_raised(&l->quit) || mgt_abort_is_raised(l->o.abort) || l->err != MGT_OK;
}

static void fail_locked(mgt_loader *l, mgt_status st, const char *text)
{
    if (l->err == MGT_OK) {
        l->err = st;
        snprintf(l->errtext, sizeof l->errtext, "%s", text);
    }
    if (l->o.abort)
        mgt_abort_raise(l->o.abort);
    pthread_cond_broadcast(&l->cond);
}

/* Which epoch and batch a rank's ticket is. */
static void ticket_pos(const mgt_loader *l, const rank_state *r, int64_t t, int64_t *epoch,
                       size_t *batch)
{
    size_t g = l->base_batch + (size_t)t;
    *epoch = l->base_epoch + (int64_t)(g / r->batches);
    *batch = g % r->batches;
}

static int64_t min_consumer_epoch(const mgt_loader *l)
{
    int64_t m = INT64_MAX;
    for (int i = 0; i < l->o.replicas; i++) {
        int64_t e;
        size_t b;
        ticket_pos(l, &l->ranks[i], l->ranks[i].consume_next, &e, &b);
        if (e < m)
            m = e;
    }
    return m;
}

/* The epoch's order, computed once into one of two cached arrays; NULL when neither can be
   given up yet (then the work waits). Without shuffle the order is the identity and no
   array is kept. */
static const size_t *epoch_order(mgt_loader *l, int64_t epoch, bool *identity)
{
    *identity = !l->sampler.shuffle;
    if (*identity)
        return NULL;
    for (int i = 0; i < 2; i++)
        if (l->orders[i].valid && l->orders[i].epoch == epoch)
            return l->orders[i].order;
    int64_t minE = min_consumer_epoch(l);
    for (int i = 0; i < 2; i++) {
        order_cache *c = &l->orders[i];
        /* in use: the slowest consumer's epoch and the next (set_epoch may go back, so
           entries ahead of that are free too) */
        if (c->valid && c->epoch >= minE && c->epoch <= minE + 1)
            continue;
        /* O(n) under the lock, once per epoch: ~20 ms for a million samples */
        mgt_sampler_order(&l->sampler, epoch, c->order);
        c->epoch = epoch;
        c->valid = true;
        return c->order;
    }
    return NULL;
}

/* The sampler's shard of this loader's replica ri (they differ in a multi-node run). */
static int shard_of(const mgt_loader *l, int ri) { return l->o.world_first + ri; }

static size_t pick(const mgt_loader *l, const size_t *order, bool identity, int rank, size_t p)
{
    return mgt_sampler_pick(&l->sampler, identity ? NULL : order, shard_of(l, rank), p);
}

/* The augmentation key of dataset index idx at the given place of the (repeated) order. */
static size_t aug_key(const mgt_loader *l, size_t idx, size_t place)
{
    return idx + (place % (size_t)l->sampler.reps) * l->n;
}

/* Whether a rank's ticket may be prepared now. */
static bool producible(const mgt_loader *l, const rank_state *r, int64_t t, int64_t minE)
{
    if (t >= r->consume_next + l->o.prefetch)
        return false;
    int64_t e;
    size_t b;
    ticket_pos(l, r, t, &e, &b);
    if (e > l->last_epoch)
        return false;
    /* two cached orders: the slowest consumer's epoch and the one after it */
    return e <= minE + 1;
}

/* Gives FREE slots their next batches. Returns a slot that needs its host buffer's previous
   copy to finish first (its PREP is the caller's job), or NULL. */
static slot *assign(mgt_loader *l, int *prep_rank)
{
    if (!l->started)
        return NULL;
    int64_t minE = min_consumer_epoch(l);
    slot *prep = NULL;
    bool progress = true;
    /* round-robin by ticket so that every device's next batch comes before anyone's
       batch after that */
    while (progress) {
        progress = false;
        for (int ri = 0; ri < l->o.replicas; ri++) {
            rank_state *r = &l->ranks[ri];
            if (!producible(l, r, r->assign_next, minE))
                continue;
            slot *s = NULL;
            for (int k = 0; k < l->nslots; k++)
                if (r->slots[k].state == SLOT_FREE) {
                    s = &r->slots[k];
                    break;
                }
            if (!s)
                continue;
            int64_t t = r->assign_next, e;
            size_t b;
            ticket_pos(l, r, t, &e, &b);
            bool identity;
            const size_t *order = epoch_order(l, e, &identity);
            if (!order && !identity)
                continue;
            size_t first = b * (size_t)l->o.batch_size;
            size_t n = r->count - first;
            if (n > (size_t)l->o.batch_size)
                n = (size_t)l->o.batch_size;
            size_t places = l->n * (size_t)l->sampler.reps;
            for (size_t p = 0; p < n; p++) {
                s->indices[p] = pick(l, order, identity, ri, first + p);
                /* the place in the epoch's (repeated) order, modulo its length (a padded
                   repeat is keyed as its first appearance) */
                size_t k = mgt_sampler_place(&l->sampler, shard_of(l, ri), first + p);
                s->keys[p] = aug_key(l, s->indices[p], k);
                if (l->mixing) {
                    /* the partner: the sample one place before (the last for the first), as
                       a batch rolled by one */
                    size_t kp = (k + places - 1) % places, ip = kp / (size_t)l->sampler.reps;
                    s->places[p] = k;
                    s->partners[p] = identity ? ip : order[ip];
                    s->partner_keys[p] = aug_key(l, s->partners[p], kp);
                }
            }
            s->gen = l->gen;
            s->ticket = t;
            s->epoch = e;
            s->batch = b;
            s->n = (int)n;
            s->next_sample = 0;
            s->done = 0;
            s->outstanding = 0;
            r->assign_next++;
            progress = true;
            if (s->copy_pending && !prep) {
                s->state = SLOT_PREP;
                s->outstanding = 1;
                prep = s;
                *prep_rank = ri;
            } else if (s->copy_pending) {
                s->state = SLOT_PREP; /* someone else's turn; picked up on a later pass */
                s->outstanding = 0;
            } else {
                s->state = SLOT_FILL;
            }
        }
    }
    if (!prep) /* a PREP slot left without a thread */
        for (int ri = 0; ri < l->o.replicas && !prep; ri++)
            for (int k = 0; k < l->nslots; k++) {
                slot *s = &l->ranks[ri].slots[k];
                if (s->state == SLOT_PREP && s->outstanding == 0) {
                    s->outstanding = 1;
                    prep = s;
                    *prep_rank = ri;
                    break;
                }
            }
    return prep;
}

/* Waits (lock released) until the copy out of s->host has run: usually long done. */
static void prepare(mgt_loader *l, slot *s)
{
    pthread_mutex_unlock(&l->lock);
    for (;;) {
        bool done = false;
        if (mgt_event_query(s->copied, &done) != MGT_OK)
            break; /* sticky device error:
                                                                   the consumer reports it */
        if (done || mgt_abort_is_raised(&l->quit) || mgt_abort_is_raised(l->o.abort))
            break;
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&l->lock);
    s->outstanding--;
    if (s->gen != l->gen) {
        if (s->outstanding == 0)
            s->state = SLOT_FREE;
        return;
    }
    s->copy_pending = false;
    s->state = SLOT_FILL;
    pthread_cond_broadcast(&l->cond);
}

/* The oldest batch with samples left to claim. */
static slot *claimable(mgt_loader *l, int *rank)
{
    slot *best = NULL;
    for (int ri = 0; ri < l->o.replicas; ri++)
        for (int k = 0; k < l->nslots; k++) {
            slot *s = &l->ranks[ri].slots[k];
            if (s->state != SLOT_FILL || s->gen != l->gen || s->next_sample >= s->n)
                continue;
            if (!best || s->ticket < best->ticket) {
                best = s;
                *rank = ri;
            }
        }
    return best;
}

/* The batch is complete: send it to its device. */
static void finish_batch(mgt_loader *l, rank_state *r, slot *s)
{
    if (r->dev) {
        mgt_status st = MGT_OK;
        if (s->consumed_recorded)
            st = mgt_stream_wait_event(r->copy, s->consumed);
        size_t bytes = l->label_bytes + (size_t)s->n * l->img_floats * sizeof(float);
        if (st == MGT_OK)
            st = mgt_copy_h2d(r->copy, mgt_buffer_ptr(s->dev), s->host, bytes);
        if (st == MGT_OK)
            st = mgt_event_record(s->copied, r->copy);
        if (st != MGT_OK) {
            char text[512];
            snprintf(text, sizeof text, "loader: copy of a batch to %s: %s",
                     mgt_device_name(r->dev), mgt_error_last());
            fail_locked(l, st, text);
            return;
        }
        s->copy_pending = true;
    }
    s->state = SLOT_READY;
    pthread_cond_broadcast(&l->cond);
}

/* Marks a file bad (warning once) and decides whether the run can go on. */
static void mark_bad(mgt_loader *l, size_t idx, const char *reason)
{
    pthread_mutex_lock(&l->lock);
    unsigned char was = atomic_exchange(&l->bad[idx], 1);
    if (!was) {
        l->bad_count++;
        FILE *f = l->o.bad.warn ? l->o.bad.warn : stderr;
        fprintf(f, "mgtrain: warning: skipping a bad image (the next file takes its place): %s\n",
                reason);
        fflush(f);
        char text[1024];
        if (l->o.bad.strict) {
            snprintf(text, sizeof text, "%s (--strict-data makes any bad image fatal)", reason);
            fail_locked(l, MGT_ERR_INVALID, text);
        } else if ((double)l->bad_count > l->o.bad.max_bad_frac * (double)l->n) {
            snprintf(text, sizeof text,
                     "%zu of the %zu images in %s are bad, more than --max-bad-frac %g allows; "
                     "the last: %s",
                     l->bad_count, l->n, mgt_dataset_dir(l->o.ds), l->o.bad.max_bad_frac, reason);
            fail_locked(l, MGT_ERR_INVALID, text);
        }
    }
    pthread_mutex_unlock(&l->lock);
}

/* Decodes and transforms dataset sample `first` into dst (no lock held). A bad file gives
   its place to the next index, deterministically, and keeps the first index's random draws;
   *used gets the index whose image it is. Returns false on a fatal error. */
static bool transform_sample(worker *w, int64_t epoch, size_t first, size_t key, float *dst,
                             size_t *used)
{
    mgt_loader *l = w->l;
    size_t idx = first;
    for (size_t tries = 0; tries < l->n; tries++, idx = (idx + 1) % l->n) {
        if (atomic_load(&l->bad[idx]))
            continue;
        mgt_rng rng;
        mgt_rng_init(&rng, l->o.seed, (uint64_t)epoch, key, MGT_RNG_AUGMENT);
        mgt_status st = mgt_sample_transform(&w->sw, l->o.ds, idx, &l->o.transform, &rng, dst);
        atomic_store_explicit(&w->growths, mgt_sample_worker_growths(&w->sw), memory_order_relaxed);
        if (st == MGT_OK) {
            *used = idx;
            atomic_fetch_add(&l->images_done, 1);
            return true;
        }
        /* not the file's fault: memory, or a pack that changed under the run (or whose disk
           fails), which every later record would hit as well */
        if (st == MGT_ERR_OOM || (st == MGT_ERR_IO && mgt_dataset_is_pack(l->o.ds))) {
            char text[512];
            snprintf(text, sizeof text, "%s", mgt_error_last());
            pthread_mutex_lock(&l->lock);
            fail_locked(l, st, text);
            pthread_mutex_unlock(&l->lock);
            return false;
        }
        char reason[512];
        snprintf(reason, sizeof reason, "%s", mgt_error_last());
        mgt_data_sanitize(reason);
        mark_bad(l, idx, reason);
        pthread_mutex_lock(&l->lock);
        bool dead = l->err != MGT_OK;
        pthread_mutex_unlock(&l->lock);
        if (dead)
            return false;
    }
    pthread_mutex_lock(&l->lock);
    fail_locked(l, MGT_ERR_INVALID, "every image of the split is bad");
    pthread_mutex_unlock(&l->lock);
    return false;
}

/* Sample pos of a claimed batch: its image, and with mixing its partner's, mixed. The
   partner's image is the one the partner gets as a sample itself (the same key, the same
   replacement of a bad file), computed again here: mixing costs a second decode and
   transform per sample, the price of a partner that does not depend on which device or
   local batch holds it. */
static bool process(worker *w, slot *s, int pos)
{
    mgt_loader *l = w->l;
    float *dst = s->images_host + (size_t)pos * l->img_floats;
    size_t used;
    if (!transform_sample(w, s->epoch, s->indices[pos], s->keys[pos], dst, &used))
        return false;
    s->labels_host[pos] = mgt_dataset_label(l->o.ds, used);
    s->labels_b_host[pos] = s->labels_host[pos];
    s->weights_host[pos] = 1.0f;
    if (l->mixing) {
        size_t pused;
        if (!transform_sample(w, s->epoch, s->partners[pos], s->partner_keys[pos], w->partner,
                              &pused))
            return false;
        const mgt_transform *t = &l->o.transform;
        mgt_mix_draws md;
        mgt_mix_draw(&l->o.mix, l->o.seed, s->epoch, s->places[pos], t->size, t->size, &md);
        if (md.cutmix)
            mgt_cutmix_images(dst, w->partner, t->channels, t->size, t->size, &md.box);
        else
            mgt_mixup_images(dst, w->partner, l->img_floats, md.lam);
        s->labels_b_host[pos] = mgt_dataset_label(l->o.ds, pused);
        s->weights_host[pos] = (float)md.lam;
    }
    s->indices[pos] = used;
    return true;
}

/* One unit of work, if there is any: a PREP or a claim of a few samples. Lock held on
   entry and exit. Returns whether it did something. */
static bool work_once(mgt_loader *l, worker *w)
{
    int ri = -1;
    slot *s = assign(l, &ri);
    if (s) {
        prepare(l, s);
        return true;
    }
    s = claimable(l, &ri);
    if (!s)
        return false;
    int first = s->next_sample;
    int k = s->n - first < l->chunk ? s->n - first : l->chunk;
    s->next_sample += k;
    s->outstanding++;
    unsigned gen = s->gen;
    pthread_mutex_unlock(&l->lock);
    bool ok = true;
    for (int i = 0; i < k && ok; i++) {
        if (mgt_abort_is_raised(&l->quit) || mgt_abort_is_raised(l->o.abort))
            ok = false;
        else
            ok = process(w, s, first + i);
    }
    pthread_mutex_lock(&l->lock);
    s->outstanding--;
    if (s->gen != gen || gen != l->gen) { /* dropped by set_epoch meanwhile */
        if (s->outstanding == 0 && s->state != SLOT_HELD)
            s->state = SLOT_FREE;
        pthread_cond_broadcast(&l->cond);
        return true;
    }
    if (!ok)
        return true;
    s->done += k;
    if (s->done == s->n)
        finish_batch(l, &l->ranks[ri], s);
    return true;
}

/* Pins decode thread `id` to the id-th CPU of the process's affinity mask (round robin):
   a thread that stays on one core keeps its decoder's tables and buffers in that core's
   caches. Failure is harmless (the thread just floats). */
static void pin_thread(int id)
{
    cpu_set_t allowed, one;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
        return;
    int n = CPU_COUNT(&allowed);
    if (n < 1)
        return;
    int want = id % n;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
        if (CPU_ISSET(cpu, &allowed) && want-- == 0) {
            CPU_ZERO(&one);
            CPU_SET(cpu, &one);
            pthread_setaffinity_np(pthread_self(), sizeof one, &one);
            return;
        }
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    mgt_loader *l = w->l;
    if (l->o.pin_threads)
        pin_thread(w->id);
    pthread_mutex_lock(&l->lock);
    while (!stopping(l)) {
        if (!work_once(l, w))
            mgt_cond_wait_slice(&l->cond, &l->lock);
    }
    pthread_mutex_unlock(&l->lock);
    return NULL;
}

/* ---- public ---- */

void mgt_loader_options_init(mgt_loader_options *o, const mgt_dataset *ds, const mgt_transform *t,
                             int replicas, int batch_size)
{
    memset(o, 0, sizeof *o);
    o->ds = ds;
    if (t)
        o->transform = *t;
    o->replicas = replicas;
    o->batch_size = batch_size;
    o->workers = mgt_cpu_count();
    o->prefetch = 2;
    o->split = MGT_SPLIT_PAD;
    o->shuffle = true;
    o->continuous = true;
    o->bad.max_bad_frac = 0.01;
    o->pin_threads = true;
}

static mgt_status check_options(const mgt_loader_options *o)
{
    if (!o->ds)
        return mgt_error_set(MGT_ERR_INVALID, "loader: no dataset");
    mgt_status st = mgt_transform_check(&o->transform);
    if (st != MGT_OK)
        return st;
    if (o->replicas < 1 || o->replicas > MGT_MAX_DEVICES)
        return mgt_error_set(MGT_ERR_INVALID, "loader: %d devices is not in 1..%d", o->replicas,
                             MGT_MAX_DEVICES);
    if (o->batch_size < 1 || o->batch_size > (1 << 20))
        return mgt_error_set(MGT_ERR_INVALID, "loader: per-device batch %d is not in 1..%d",
                             o->batch_size, 1 << 20);
    if (o->workers < 0 || o->workers > 1024)
        return mgt_error_set(MGT_ERR_INVALID, "loader: -j %d is not in 0..1024", o->workers);
    if (o->prefetch < 1 || o->prefetch > 64)
        return mgt_error_set(MGT_ERR_INVALID, "loader: prefetch %d is not in 1..64", o->prefetch);
    if (!(o->mix.mixup_alpha >= 0 && o->mix.mixup_alpha <= 1e4 && o->mix.cutmix_alpha >= 0 &&
          o->mix.cutmix_alpha <= 1e4))
        return mgt_error_set(MGT_ERR_INVALID, "loader: mixup/cutmix alpha %g/%g is not in 0..1e4",
                             (double)o->mix.mixup_alpha, (double)o->mix.cutmix_alpha);
    if (!(o->bad.max_bad_frac >= 0 && o->bad.max_bad_frac <= 1))
        return mgt_error_set(MGT_ERR_INVALID, "loader: --max-bad-frac %g is not in 0..1",
                             o->bad.max_bad_frac);
    return MGT_OK;
}

static mgt_status alloc_slot(mgt_loader *l, rank_state *r, slot *s)
{
    mgt_status st;
    if (r->dev) {
        if ((st = mgt_host_alloc(r->dev, l->slot_bytes, (void **)&s->host)) != MGT_OK)
            return st;
        if ((st = mgt_buffer_alloc(r->dev, l->slot_bytes, &s->dev)) != MGT_OK)
            return st;
        if ((st = mgt_event_create(r->dev, &s->copied)) != MGT_OK)
            return st;
        if ((st = mgt_event_create(r->dev, &s->consumed)) != MGT_OK)
            return st;
    } else if (posix_memalign((void **)&s->host, 64, l->slot_bytes) != 0) {
        s->host = NULL;
        return mgt_error_set(MGT_ERR_OOM, "loader: out of memory for a batch (%zu bytes)",
                             l->slot_bytes);
    }
    s->labels_host = (int32_t *)s->host;
    s->labels_b_host = (int32_t *)(s->host + l->block_bytes);
    s->weights_host = (float *)(s->host + 2 * l->block_bytes);
    s->images_host = (float *)(s->host + l->label_bytes);
    if (l->mixing) {
        s->partners = calloc((size_t)l->o.batch_size, sizeof *s->partners);
        s->places = calloc((size_t)l->o.batch_size, sizeof *s->places);
        s->partner_keys = calloc((size_t)l->o.batch_size, sizeof *s->partner_keys);
        if (!s->partners || !s->places || !s->partner_keys)
            return mgt_error_set(MGT_ERR_OOM, "loader: out of memory");
    }
    s->indices = calloc((size_t)l->o.batch_size, sizeof *s->indices);
    s->keys = calloc((size_t)l->o.batch_size, sizeof *s->keys);
    if (!s->indices || !s->keys)
        return mgt_error_set(MGT_ERR_OOM, "loader: out of memory");
    return MGT_OK;
}

mgt_status mgt_loader_create(const mgt_loader_options *o, mgt_loader **out)
{
    *out = NULL;
    mgt_status st = check_options(o);
    if (st != MGT_OK)
        return st;
    mgt_loader *l = calloc(1, sizeof *l);
    if (!l)
        return mgt_error_set(MGT_ERR_OOM, "loader: out of memory");
    l->o = *o;
    l->n = mgt_dataset_size(o->ds);
    pthread_mutex_init(&l->lock, NULL);
    pthread_cond_init(&l->cond, NULL);
    atomic_init(&l->images_done, 0);
    const char *dir = mgt_dataset_dir(o->ds);
    int shards = o->world_replicas > 0 ? o->world_replicas : o->replicas;
    if (o->world_first < 0 || o->world_first + o->replicas > shards) {
        st = mgt_error_set(MGT_ERR_INVALID, "loader: shards %d..%d are not within the world's %d",
                           o->world_first, o->world_first + o->replicas - 1, shards);
        goto fail;
    }
    if ((st = o->split == MGT_SPLIT_RA
                  ? mgt_sampler_init_ra(&l->sampler, l->n, shards, o->ra_reps, o->shuffle, o->seed)
                  : mgt_sampler_init(&l->sampler, l->n, shards, o->split, o->shuffle, o->seed)) !=
        MGT_OK) {
        st = mgt_error_wrap(st, "%s", dir);
        goto fail;
    }
    l->nslots = o->prefetch + 1;
    l->img_floats = (size_t)o->transform.channels * o->transform.size * o->transform.size;
    l->block_bytes = ((size_t)o->batch_size * sizeof(int32_t) + 255) & ~(size_t)255;
    l->label_bytes = 3 * l->block_bytes;
    l->mixing = o->mix.mixup_alpha > 0 || o->mix.cutmix_alpha > 0;
    l->slot_bytes = l->label_bytes + (size_t)o->batch_size * l->img_floats * sizeof(float);
    int nthreads = o->workers;
    l->chunk = o->batch_size / (2 * (nthreads > 0 ? nthreads : 1));
    if (l->chunk < 1)
        l->chunk = 1;
    if (l->chunk > 16)
        l->chunk = 16;
    l->last_epoch = o->continuous ? INT64_MAX : -1;

    if (!(l->bad = calloc(l->n, sizeof *l->bad))) {
        st = mgt_error_set(MGT_ERR_OOM, "loader: out of memory");
        goto fail;
    }
    if (o->shuffle)
        for (int i = 0; i < 2; i++)
            if (!(l->orders[i].order = malloc(l->n * sizeof(size_t)))) {
                st = mgt_error_set(MGT_ERR_OOM, "loader: out of memory for the epoch order");
                goto fail;
            }
    if (!(l->ranks = calloc((size_t)o->replicas, sizeof *l->ranks))) {
        st = mgt_error_set(MGT_ERR_OOM, "loader: out of memory");
        goto fail;
    }
    for (int ri = 0; ri < o->replicas; ri++) {
        rank_state *r = &l->ranks[ri];
        r->held = -1;
        r->count = mgt_sampler_count(&l->sampler, shard_of(l, ri));
        r->batches = o->drop_last_batch
                         ? r->count / (size_t)o->batch_size
                         : (r->count + (size_t)o->batch_size - 1) / (size_t)o->batch_size;
        if (r->batches == 0) {
            st =
                mgt_error_set(MGT_ERR_INVALID,
                              "%s: a device gets %zu samples per epoch, fewer than its batch of %d "
                              "(with the short last batch dropped, no batch is left)",
                              dir, r->count, o->batch_size);
            goto fail;
        }
        r->dev = o->devices ? o->devices[ri] : NULL;
        if (o->devices && !r->dev) {
            st = mgt_error_set(MGT_ERR_INVALID, "loader: device %d is missing", ri);
            goto fail;
        }
        if (r->dev && (st = mgt_stream_create(r->dev, &r->copy)) != MGT_OK)
            goto fail;
        if (!(r->slots = calloc((size_t)l->nslots, sizeof *r->slots))) {
            st = mgt_error_set(MGT_ERR_OOM, "loader: out of memory");
            goto fail;
        }
        for (int k = 0; k < l->nslots; k++)
            if ((st = alloc_slot(l, r, &r->slots[k])) != MGT_OK)
                goto fail;
    }

    l->nworkers = nthreads + o->replicas;
    l->workers = calloc((size_t)(nthreads + o->replicas), sizeof *l->workers);
    l->threads = calloc((size_t)(nthreads > 0 ? nthreads : 1), sizeof *l->threads);
    if (!l->workers || !l->threads) {
        st = mgt_error_set(MGT_ERR_OOM, "loader: out of memory");
        goto fail;
    }
    for (int i = 0; i < nthreads + o->replicas; i++) {
        l->workers[i].l = l;
        l->workers[i].id = i;
        atomic_init(&l->workers[i].growths, 0);
        if (l->mixing && !(l->workers[i].partner = malloc(l->img_floats * sizeof(float)))) {
            st = mgt_error_set(MGT_ERR_OOM, "loader: out of memory");
            goto fail;
        }
        if ((st = mgt_sample_worker_init(&l->workers[i].sw)) != MGT_OK)
            goto fail;
        l->workers[i].ready = true;
    }
    for (int i = 0; i < nthreads; i++) {
        if (pthread_create(&l->threads[i], NULL, worker_main, &l->workers[i]) != 0) {
            st = mgt_error_set(MGT_ERR_OOM, "loader: could not start decode thread %d of %d", i + 1,
                               nthreads);
            goto fail;
        }
        l->nthreads++;
    }
    *out = l;
    return MGT_OK;
fail : {
    char text[512];
    snprintf(text, sizeof text, "%s", mgt_error_last());
    mgt_loader_free(l);
    return mgt_error_set(st, "%s", text);
}
}

void mgt_loader_free(mgt_loader *l)
{
    if (!l)
        return;
    mgt_abort_raise(&l->quit);
    pthread_mutex_lock(&l->lock);
    pthread_cond_broadcast(&l->cond);
    pthread_mutex_unlock(&l->lock);
    for (int i = 0; i < l->nthreads; i++)
        pthread_join(l->threads[i], NULL);
    if (l->ranks)
        for (int ri = 0; ri < l->o.replicas; ri++) {
            rank_state *r = &l->ranks[ri];
            mgt_stream_free(r->copy); /* waits for copies in flight */
            if (r->slots)
                for (int k = 0; k < l->nslots; k++) {
                    slot *s = &r->slots[k];
                    mgt_event_free(s->copied);
                    mgt_event_free(s->consumed);
                    mgt_buffer_free(s->dev);
                    if (r->dev)
                        mgt_host_free(r->dev, s->host);
                    else
                        free(s->host);
                    free(s->indices);
                    free(s->keys);
                    free(s->partner_keys);
                    free(s->partners);
                    free(s->places);
                }
            free(r->slots);
        }
    if (l->workers)
        for (int i = 0; i < l->nworkers; i++) {
            if (l->workers[i].ready)
                mgt_sample_worker_free(&l->workers[i].sw);
            free(l->workers[i].partner);
        }
    free(l->workers);
    free(l->threads);
    free(l->ranks);
    free(l->orders[0].order);
    free(l->orders[1].order);
    free((void *)l->bad);
    pthread_mutex_destroy(&l->lock);
    pthread_cond_destroy(&l->cond);
    free(l);
}

size_t mgt_loader_batches(const mgt_loader *l, int rank)
{
    return rank >= 0 && rank < l->o.replicas ? l->ranks[rank].batches : 0;
}

const mgt_sampler *mgt_loader_sampler(const mgt_loader *l) { return &l->sampler; }

mgt_status mgt_loader_set_epoch(mgt_loader *l, int64_t epoch, size_t first_batch)
{
    if (epoch < 0)
        return mgt_error_set(MGT_ERR_INVALID, "loader: epoch %lld", (long long)epoch);
    /* a pack rewritten or cut since it was opened: said now, before a record is read */
    mgt_status cst = mgt_dataset_is_pack(l->o.ds) ? mgt_pack_check(l->o.ds) : MGT_OK;
    if (cst != MGT_OK)
        return cst;
    pthread_mutex_lock(&l->lock);
    for (int ri = 0; ri < l->o.replicas; ri++)
        if (first_batch >= l->ranks[ri].batches) {
            size_t b = l->ranks[ri].batches;
            pthread_mutex_unlock(&l->lock);
            return mgt_error_set(MGT_ERR_INVALID, "loader: batch %zu of an epoch of %zu batches",
                                 first_batch, b);
        }
    bool same = l->started;
    for (int ri = 0; ri < l->o.replicas && same; ri++) {
        int64_t e;
        size_t b;
        ticket_pos(l, &l->ranks[ri], l->ranks[ri].consume_next, &e, &b);
        same = e == epoch && b == first_batch;
    }
    if (!same) {
        /* drop what was prepared: slots with claims in flight are freed by the last claim */
        l->gen++;
        for (int ri = 0; ri < l->o.replicas; ri++) {
            rank_state *r = &l->ranks[ri];
            for (int k = 0; k < l->nslots; k++) {
                slot *s = &r->slots[k];
                if (s->state == SLOT_HELD)
                    continue;
                if (s->outstanding == 0)
                    s->state = SLOT_FREE;
            }
            r->assign_next = 0;
            r->consume_next = 0;
        }
        l->base_epoch = epoch;
        l->base_batch = first_batch;
    }
    if (!l->o.continuous)
        l->last_epoch = epoch;
    l->started = true;
    pthread_cond_broadcast(&l->cond);
    pthread_mutex_unlock(&l->lock);
    return MGT_OK;
}

mgt_status mgt_loader_error(mgt_loader *l)
{
    pthread_mutex_lock(&l->lock);
    mgt_status st = l->err;
    if (st != MGT_OK)
        mgt_error_set(st, "%s", l->errtext);
    pthread_mutex_unlock(&l->lock);
    return st;
}

mgt_status mgt_loader_next(mgt_loader *l, int rank, mgt_stream *compute, mgt_batch *out)
{
    memset(out, 0, sizeof *out);
    if (rank < 0 || rank >= l->o.replicas)
        return mgt_error_set(MGT_ERR_INVALID, "loader: rank %d of %d", rank, l->o.replicas);
    rank_state *r = &l->ranks[rank];
    if (r->dev && !compute)
        return mgt_error_set(MGT_ERR_INVALID,
                             "loader: next() needs the stream that reads the batch");
    pthread_mutex_lock(&l->lock);
    mgt_status st = MGT_OK;
    if (!l->started) {
        pthread_mutex_unlock(&l->lock);
        return mgt_error_set(MGT_ERR_INVALID, "loader: next() before set_epoch()");
    }
    /* release the batch handed out last time: the consumer has enqueued its reads */
    if (r->held >= 0) {
        slot *s = &r->slots[r->held];
        if (r->dev) {
            st = mgt_event_record(s->consumed, compute);
            s->consumed_recorded = st == MGT_OK;
        }
        s->state = SLOT_FREE; /* complete when handed out: nothing in flight */
        r->held = -1;
        pthread_cond_broadcast(&l->cond);
        if (st != MGT_OK) {
            pthread_mutex_unlock(&l->lock);
            return st;
        }
    }
    int64_t t = r->consume_next, e;
    size_t b;
    ticket_pos(l, r, t, &e, &b);
    if (e > l->last_epoch) {
        pthread_mutex_unlock(&l->lock);
        return mgt_error_set(MGT_ERR_INVALID, "loader: all %zu batches of epoch %lld were taken",
                             r->batches, (long long)l->last_epoch);
    }
    double t0 = mgt_time_now();
    slot *got = NULL;
    for (;;) {
        for (int k = 0; k < l->nslots; k++) {
            slot *s = &r->slots[k];
            if (s->state == SLOT_READY && s->gen == l->gen && s->ticket == t)
                got = s;
        }
        if (got)
            break;
        if (l->err != MGT_OK) {
            st = mgt_error_set(l->err, "%s", l->errtext);
            break;
        }
        if (mgt_abort_is_raised(l->o.abort) || mgt_abort_is_raised(&l->quit)) {
            st = mgt_error_set(MGT_ERR_ABORTED, "loader: aborted");
            break;
        }
        /* -j 0: the consumer decodes; with threads it could too, but its time belongs to
           the device it feeds */
        if (l->nthreads == 0 && work_once(l, &l->workers[l->nthreads + rank]))
            continue;
        mgt_cond_wait_slice(&l->cond, &l->lock);
    }
    if (st != MGT_OK) {
        pthread_mutex_unlock(&l->lock);
        return st;
    }
    got->state = SLOT_HELD;
    r->held = (int)(got - r->slots);
    r->consume_next++;
    double waited = mgt_time_now() - t0;
    r->wait_total += waited;
    r->calls++;
    pthread_cond_broadcast(&l->cond); /* the window moved: more work may be assigned */
    if (r->dev)
        st = mgt_stream_wait_event(compute, got->copied);
    pthread_mutex_unlock(&l->lock);
    if (st != MGT_OK)
        return st;

    if (r->dev) {
        uint8_t *base = mgt_buffer_ptr(got->dev);
        out->labels = (int32_t *)base;
        out->labels_b = (int32_t *)(base + l->block_bytes);
        out->weights = (float *)(base + 2 * l->block_bytes);
        out->images = (float *)(base + l->label_bytes);
    } else {
        out->labels = got->labels_host;
        out->labels_b = got->labels_b_host;
        out->weights = got->weights_host;
        out->images = got->images_host;
    }
    out->labels_host = got->labels_host;
    out->labels_b_host = got->labels_b_host;
    out->weights_host = got->weights_host;
    out->mixed = l->mixing;
    out->indices_host = got->indices;
    out->n = got->n;
    out->epoch = got->epoch;
    out->index = got->batch;
    out->wait_s = waited;
    return MGT_OK;
}

double mgt_loader_wait_total(const mgt_loader *l, int rank, long *calls)
{
    if (rank < 0 || rank >= l->o.replicas)
        return 0;
    pthread_mutex_lock((pthread_mutex_t *)&l->lock);
    double w = l->ranks[rank].wait_total;
    if (calls)
        *calls = l->ranks[rank].calls;
    pthread_mutex_unlock((pthread_mutex_t *)&l->lock);
    return w;
}

size_t mgt_loader_bad_count(const mgt_loader *l)
{
    pthread_mutex_lock((pthread_mutex_t *)&l->lock);
    size_t n = l->bad_count;
    pthread_mutex_unlock((pthread_mutex_t *)&l->lock);
    return n;
}

uint64_t mgt_loader_images_done(const mgt_loader *l)
{
    return atomic_load(&((mgt_loader *)l)->images_done);
}

uint64_t mgt_loader_buffer_growths(const mgt_loader *l)
{
    uint64_t g = 0;
    for (int i = 0; i < l->nworkers; i++)
        g += atomic_load_explicit(&l->workers[i].growths, memory_order_relaxed);
    return g;
}
