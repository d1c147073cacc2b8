/* The dispatch layer of the device interface: checks arguments, keeps memory accounting and
 * limits, orders peer copies between two streams, stages copies between devices without
 * peer access through pinned host memory, and hands everything else to the backend table.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/backend.h"

#define STAGING_CHUNK (4u << 20) /* bytes per staging slot; two slots per source device */

/* Pinned bounce buffers of one source device. Slot k is written by a D2H on the source's
   stream and read by an H2D on the destination's stream; `full` (on the source device)
   orders the read after the write, and the reader's event (on the destination device)
   orders the next write after the read. */
typedef struct staging_slot {
    void *host;
    mgt_event *full;
    mgt_event *last_read; /* borrowed: the pair event of the last reader, or NULL */
} staging_slot;

typedef struct staging_dev {
    pthread_mutex_t lock;
    staging_slot slot[2];
    int next;
    mgt_event **read_done; /* [n][2]: per destination device and slot, created on first use */
} staging_dev;

static mgt_status bad_arg(const char *call, const char *what)
{
    return mgt_error_set(MGT_ERR_INVALID, "%s: %s", call, what);
}

/* The set's registry of live handles: a doubly linked list per kind, under reg_lock. */
#define REG_LINK(set, head, x)                  \
    do {                                        \
        pthread_mutex_lock(&(set)->reg_lock);   \
        (x)->reg_prev = NULL;                   \
        (x)->reg_next = (set)->head;            \
        if ((set)->head)                        \
            (set)->head->reg_prev = (x);        \
        (set)->head = (x);                      \
        pthread_mutex_unlock(&(set)->reg_lock); \
    } while (0)

#define REG_UNLINK(set, head, x)                     \
    do {                                             \
        pthread_mutex_lock(&(set)->reg_lock);        \
        if ((x)->reg_prev)                           \
            (x)->reg_prev->reg_next = (x)->reg_next; \
        else                                         \
            (set)->head = (x)->reg_next;             \
        if ((x)->reg_next)                           \
            (x)->reg_next->reg_prev = (x)->reg_prev; \
        pthread_mutex_unlock(&(set)->reg_lock);      \
    } while (0)

/* ---- deferred frees ----
   A buffer (or pinned host memory) freed while work enqueued before the free may still read
   or write it (on any stream of the set: a peer copy reads another device's memory) goes
   back to the backend once every stream has passed the free. An ordering event recorded on
   each live stream at the free marks the point; nothing waits there. Blocks are handed back
   as their events complete, looked at on every alloc, free and synchronize, waited for
   (bounded) when an allocation finds the device full, and drained when the set closes. So a
   free mid-step costs a few event records, not a wait on every stream. */

typedef struct mgt_deferred_free {
    mgt_device *dev;
    void *ptr;
    size_t size; /* 0: pinned host memory */
    int nev;
    mgt_event **ev;
    struct mgt_deferred_free *next;
} mgt_deferred_free;

static void release_block(mgt_device *d, void *ptr, size_t size)
{
    if (size == 0) {
        d->set->iface->host_free(d, ptr);
        return;
    }
    if (atomic_load(&d->keep_memory)) /* MPI's for good: left allocated (the backend holds it) */
        return;
    d->set->iface->free(d, ptr);
    mgt_device_unreserve(d, size);
}

static void deferred_drop(mgt_deferred_free *f)
{
    for (int i = 0; i < f->nev; i++)
        mgt_event_free(f->ev[i]);
    free(f->ev);
    free(f);
}

/* Whether every stream has passed the free (an event of a failed device counts as passed
   once its record has run or never will: mgt_event_query's *done says which). */
static bool deferred_done(mgt_deferred_free *f)
{
    for (int i = 0; i < f->nev; i++) {
        bool done = false;
        (void)mgt_event_query(f->ev[i], &done);
        if (!done)
            return false;
    }
    return true;
}

/* Takes the entries of device d (every device: NULL) out of the set's list. */
static mgt_deferred_free *deferred_take(mgt_devset *set, const mgt_device *d)
{
    mgt_deferred_free *taken = NULL;
    pthread_mutex_lock(&set->defer_lock);
    for (mgt_deferred_free **p = &set->deferred; *p;) {
        mgt_deferred_free *f = *p;
        if (d && f->dev != d) {
            p = &f->next;
            continue;
        }
        *p = f->next;
        f->next = taken;
        taken = f;
    }
    pthread_mutex_unlock(&set->defer_lock);
    return taken;
}

static void deferred_put(mgt_devset *set, mgt_deferred_free *f)
{
    pthread_mutex_lock(&set->defer_lock);
    f->next = set->deferred;
    set->deferred = f;
    pthread_mutex_unlock(&set->defer_lock);
}

/* Hands back every block whose free all streams have passed; returns how many. */
static int deferred_reap(mgt_devset *set)
{
    mgt_deferred_free *done = NULL;
    pthread_mutex_lock(&set->defer_lock);
    for (mgt_deferred_free **p = &set->deferred; *p;) {
        mgt_deferred_free *f = *p;
        if (!deferred_done(f)) {
            p = &f->next;
            continue;
        }
        *p = f->next;
        f->next = done;
        done = f;
    }
    pthread_mutex_unlock(&set->defer_lock);
    int n = 0;
    while (done) {
        mgt_deferred_free *next = done->next;
        release_block(done->dev, done->ptr, done->size);
        deferred_drop(done);
        done = next;
        n++;
    }
    return n;
}

/* Waits (bounded by the wait limit, and by the set's abort flag unless `final`) for the
   deferred frees of device d (NULL: all) and hands their blocks back; a block whose streams
   never pass the free (a hung kernel) is kept where final, put back otherwise. Returns how
   many went back. */
static int deferred_wait(mgt_devset *set, mgt_device *d, bool final)
{
    mgt_deferred_free *f = deferred_take(set, d);
    int n = 0;
    while (f) {
        mgt_deferred_free *next = f->next;
        for (int i = 0; i < f->nev; i++)
            if (!atomic_load(&f->ev[i]->dev->stalled))
                (void)mgt_event_synchronize(f->ev[i], final ? NULL : set->watch);
        if (deferred_done(f)) {
            release_block(f->dev, f->ptr, f->size);
            deferred_drop(f);
            n++;
        } else if (final) {
            /* queued work may still write it: the backend's close frees its memory */
            deferred_drop(f);
        } else {
            deferred_put(set, f);
        }
        f = next;
    }
    return n;
}

/* Frees the block (size 0: pinned host memory) now if no stream could be using it, else
   after every live stream has passed this point. */
static void free_after_streams(mgt_devset *set, mgt_device *d, void *ptr, size_t size)
{
    if (size > 0 && set->iface->retire)
        set->iface->retire(d, ptr);
    /* the live streams, pinned so that none is freed while an event is recorded on it */
    pthread_mutex_lock(&set->reg_lock);
    int n = 0;
    for (mgt_stream *s = set->streams; s; s = s->reg_next)
        n++;
    mgt_stream **list = n ? malloc((size_t)n * sizeof *list) : NULL;
    if (list) {
        int k = 0;
        for (mgt_stream *s = set->streams; s; s = s->reg_next) {
            atomic_fetch_add(&s->pins, 1);
            list[k++] = s;
        }
    }
    pthread_mutex_unlock(&set->reg_lock);
    if (n == 0) {
        release_block(d, ptr, size);
        return;
    }
    mgt_deferred_free *f = calloc(1, sizeof *f);
    if (f)
        f->ev = calloc((size_t)n, sizeof *f->ev);
    bool keep = false;
    for (int i = 0; i < n && list; i++) {
        mgt_stream *s = list[i];
        mgt_event *e = NULL;
        mgt_status st = f && f->ev ? mgt_event_create_ordering(s->dev, &e) : MGT_ERR_OOM;
        if (st == MGT_OK)
            st = mgt_event_record(e, s);
        if (st == MGT_OK) {
            f->ev[f->nev++] = e;
        } else {
            /* no event (host memory, or a failed device refusing the record): wait for the
               stream instead, bounded; a stream that never drains keeps the block */
            mgt_event_free(e);
            keep |= mgt_stream_synchronize(s, NULL) == MGT_ERR_TIMEOUT;
        }
        atomic_fetch_sub(&s->pins, 1);
    }
    free(list);
    if (!list) /* no room even for the list: every device, bounded */
        for (int i = 0; i < set->n; i++)
            keep |= mgt_device_synchronize(&set->devs[i], NULL) == MGT_ERR_TIMEOUT;
    if (f && f->ev && f->nev > 0 && !keep) {
        f->dev = d;
        f->ptr = ptr;
        f->size = size;
        deferred_put(set, f);
        return;
    }
    if (f)
        deferred_drop(f);
    if (!keep)
        release_block(d, ptr, size);
}

/* ---- bounded waits ---- */

void mgt_devset_set_waits(mgt_devset *set, const mgt_abort *abort, double limit_s,
                          const char *source)
{
    set->watch = abort;
    set->wait_limit_s = limit_s > 0 ? limit_s : MGT_DEVICE_WAIT_LIMIT_S;
    snprintf(set->wait_source, sizeof set->wait_source, "%s",
             limit_s > 0 && source ? source : "the default");
}

/* A wait on a device that stalled before gives up at once: a hung kernel makes one wait
   run out, not every wait of a teardown. */
static mgt_status stalled_error(const mgt_device *d)
{
    return mgt_error_set(MGT_ERR_TIMEOUT,
                         "%s: stalled: an earlier wait ran past the wait limit of %g s (%s)",
                         d->name, d->set->wait_limit_s, d->set->wait_source);
}

static mgt_status waited(mgt_device *d, mgt_status st)
{
    if (st == MGT_ERR_TIMEOUT)
        atomic_store(&d->stalled, true);
    else if (st == MGT_OK)
        deferred_reap(d->set);
    return st;
}

/* ---- devices ---- */

const char *mgt_device_kind_name(mgt_device_kind kind)
{
    switch (kind) {
    case MGT_DEVICE_AUTO: return "auto";
    case MGT_DEVICE_MOCK: return "mock";
    case MGT_DEVICE_CUDA: return "cuda";
    }
    return "unknown";
}

static const mgt_backend_i *backend_of(mgt_device_kind kind)
{
    return kind == MGT_DEVICE_CUDA ? mgt_backend_cuda() : mgt_backend_mock();
}

int mgt_device_kind_count(mgt_device_kind kind)
{
    if (kind == MGT_DEVICE_AUTO)
        kind = mgt_device_kind_count(MGT_DEVICE_CUDA) > 0 ? MGT_DEVICE_CUDA : MGT_DEVICE_MOCK;
    const mgt_backend_i *b = backend_of(kind);
    return b ? b->device_count() : 0;
}

mgt_status mgt_device_kind_probe(mgt_device_kind kind, int *count)
{
    *count = 0;
    if (kind == MGT_DEVICE_AUTO)
        kind = mgt_device_kind_count(MGT_DEVICE_CUDA) > 0 ? MGT_DEVICE_CUDA : MGT_DEVICE_MOCK;
    const mgt_backend_i *b = backend_of(kind);
    if (!b)
        return mgt_error_set(MGT_ERR_UNSUPPORTED,
                             "no CUDA device: this build has no CUDA backend (configured with "
                             "MGT_CUDA=OFF, or without nvcc, cuBLAS or cuDNN found)");
    if (b->probe)
        return b->probe(count);
    *count = b->device_count();
    if (*count > 0)
        return MGT_OK;
    return mgt_error_set(MGT_ERR_UNSUPPORTED, "no %s device", b->name);
}

void mgt_device_kind_versions(mgt_device_kind kind, char *text, size_t cap)
{
    const mgt_backend_i *b = backend_of(kind);
    if (cap > 0)
        text[0] = '\0';
    if (b && b->versions)
        b->versions(text, cap);
}

static void staging_free(mgt_devset *set)
{
    staging_dev *sd = set->staging;
    if (!sd)
        return;
    for (int i = 0; i < set->n; i++) {
        for (int k = 0; k < 2; k++) {
            mgt_host_free(&set->devs[i], sd[i].slot[k].host);
            mgt_event_free(sd[i].slot[k].full);
        }
        if (sd[i].read_done)
            for (int j = 0; j < 2 * set->n; j++)
                mgt_event_free(sd[i].read_done[j]);
        free(sd[i].read_done);
        pthread_mutex_destroy(&sd[i].lock);
    }
    free(sd);
    set->staging = NULL;
}

/* Staging for every device that lacks direct access to some other device of the set. */
static mgt_status staging_create(mgt_devset *set)
{
    staging_dev *sd = calloc((size_t)set->n, sizeof *sd);
    if (!sd)
        return mgt_error_set(MGT_ERR_OOM, "devices: host memory exhausted");
    for (int i = 0; i < set->n; i++)
        pthread_mutex_init(&sd[i].lock, NULL);
    set->staging = sd;
    for (int i = 0; i < set->n; i++) {
        bool needed = false;
        for (int j = 0; j < set->n; j++)
            needed |= i != j && !mgt_devset_can_access_peer(set, i, j);
        if (!needed)
            continue;
        sd[i].read_done = calloc((size_t)(2 * set->n), sizeof *sd[i].read_done);
        if (!sd[i].read_done)
            return mgt_error_set(MGT_ERR_OOM, "devices: host memory exhausted");
        for (int k = 0; k < 2; k++) {
            mgt_status st = mgt_host_alloc(&set->devs[i], STAGING_CHUNK, &sd[i].slot[k].host);
            if (st == MGT_OK)
                st = mgt_event_create_ordering(&set->devs[i], &sd[i].slot[k].full);
            if (st != MGT_OK)
                return st;
        }
    }
    return MGT_OK;
}

static mgt_status devset_open_with(const mgt_backend_i *iface, mgt_device_kind kind, const int *ids,
                                   int n, const mgt_devset_options *opts, mgt_devset **out);

mgt_status mgt_devset_open(mgt_device_kind kind, const int *ids, int n,
                           const mgt_devset_options *opts, mgt_devset **out)
{
    *out = NULL;
    mgt_devset_options o = opts ? *opts : (mgt_devset_options){0};
    const mgt_mock_options *mock = o.mock;
    if (n < 1 || n > MGT_MAX_DEVICES)
        return mgt_error_set(MGT_ERR_INVALID, "devices: %d devices asked for; 1 to %d can be used",
                             n, MGT_MAX_DEVICES);
    if (!ids)
        return bad_arg("devices", "no device ids");
    if (kind == MGT_DEVICE_AUTO)
        kind = mgt_device_kind_count(MGT_DEVICE_CUDA) > 0 ? MGT_DEVICE_CUDA : MGT_DEVICE_MOCK;
    const mgt_backend_i *iface = backend_of(kind);
    if (!iface)
        return mgt_error_set(MGT_ERR_UNSUPPORTED,
                             "no CUDA device: this build has no CUDA backend (configure with "
                             "MGT_CUDA=ON where the CUDA toolkit and cuDNN are installed)");
    mgt_mock_options env_opts;
    const char *source = NULL; /* set when the spec is the environment's */
    if (!mock) {
        mgt_status st = mgt_mock_options_parse(&env_opts, getenv("MGT_MOCK"));
        if (st != MGT_OK)
            return mgt_error_wrap(st, "MGT_MOCK");
        mock = &env_opts;
        source = "MGT_MOCK";
    }
    if (kind == MGT_DEVICE_MOCK) {
        mgt_status st = mgt_mock_options_check(mock, ids, n);
        if (st != MGT_OK)
            return source ? mgt_error_wrap(st, "%s", source) : st;
    }
    o.mock = mock;
    return devset_open_with(iface, kind, ids, n, &o, out);
}

/* Opens n devices through iface; opts is resolved (opts->mock not NULL). */
static mgt_status devset_open_with(const mgt_backend_i *iface, mgt_device_kind kind, const int *ids,
                                   int n, const mgt_devset_options *opts, mgt_devset **out)
{
    const mgt_devset_options o = *opts;
    mgt_devset *set = calloc(1, sizeof *set);
    mgt_device *devs = calloc((size_t)n, sizeof *devs);
    if (!set || !devs) {
        free(set);
        free(devs);
        return mgt_error_set(MGT_ERR_OOM, "devices: host memory exhausted");
    }
    set->iface = iface;
    set->kind = kind;
    set->no_p2p = o.no_p2p;
    set->wait_limit_s = MGT_DEVICE_WAIT_LIMIT_S;
    snprintf(set->wait_source, sizeof set->wait_source, "the default");
    pthread_mutex_init(&set->reg_lock, NULL);
    pthread_mutex_init(&set->defer_lock, NULL);
    set->n = n;
    set->devs = devs;
    for (int i = 0; i < n; i++) {
        devs[i].set = set;
        devs[i].index = i;
        devs[i].id = ids[i];
        atomic_init(&devs[i].used, 0);
        atomic_init(&devs[i].stalled, false);
        atomic_init(&devs[i].keep_memory, false);
        atomic_init(&devs[i].stranded, false);
    }
    mgt_status st = iface->devset_open(set, ids, &o);
    if (st != MGT_OK) {
        pthread_mutex_destroy(&set->defer_lock);
        pthread_mutex_destroy(&set->reg_lock);
        free(devs);
        free(set);
        return st;
    }
    st = staging_create(set);
    if (st != MGT_OK) {
        mgt_devset_free(set);
        return st;
    }
    atomic_store(&set->open, true);
    *out = set;
    return MGT_OK;
}

mgt_status mgt_devset_open_bytes(mgt_layout layout, mgt_precision act, bool run, mgt_devset **out)
{
    *out = NULL;
    static const mgt_mock_options no_mock; /* the backend contract: never NULL */
    const int id = 0;
    const mgt_devset_options o = {.mock = &no_mock};
    mgt_status st = devset_open_with(mgt_backend_trace(), MGT_DEVICE_CUDA, &id, 1, &o, out);
    if (st == MGT_OK)
        mgt_trace_set_mode(*out, layout, act, run);
    return st;
}

/* Sets with a stranded device (mgt_device_strand), kept for the process's life: a thread
   stuck in a call may come back into them; listed so that they stay reachable. */
typedef struct kept_set {
    mgt_devset *set;
    struct kept_set *next;
} kept_set;
static kept_set *kept_sets;
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;

static bool set_stranded(const mgt_devset *set)
{
    for (int i = 0; i < set->n; i++)
        if (atomic_load(&set->devs[i].stranded))
            return true;
    return false;
}

/* The first registered handle of the list whose device is not stranded. */
#define FIRST_UNSTRANDED(set, head, out)                    \
    do {                                                    \
        pthread_mutex_lock(&(set)->reg_lock);               \
        (out) = (set)->head;                                \
        while ((out) && atomic_load(&(out)->dev->stranded)) \
            (out) = (out)->reg_next;                        \
        pthread_mutex_unlock(&(set)->reg_lock);             \
    } while (0)

void mgt_devset_free(mgt_devset *set)
{
    if (!set)
        return;
    mgt_error_saved saved; /* frees leave the text of the failure that led here */
    mgt_error_save(&saved);
    bool stranded = set_stranded(set);
    for (int i = 0; i < set->n; i++)
        mgt_device_synchronize(&set->devs[i], NULL);
    /* what the set's users did not free themselves, streams first: a stalled device's stream
       gives up its queued work as it goes, and the frees deferred behind it can then end; a
       stranded device's handles stay (a call stuck on them may come back) */
    mgt_stream *s;
    mgt_event *e;
    mgt_buffer *b;
    for (;;) {
        FIRST_UNSTRANDED(set, streams, s);
        if (!s)
            break;
        mgt_stream_free(s);
    }
    deferred_wait(set, NULL, true);
    if (!stranded)
        staging_free(set);
    /* a stream took its aux event along */
    for (;;) {
        FIRST_UNSTRANDED(set, events, e);
        if (!e)
            break;
        mgt_event_free(e);
    }
    for (;;) {
        FIRST_UNSTRANDED(set, buffers, b);
        if (!b)
            break;
        mgt_buffer_free(b);
    }
    set->iface->devset_close(set); /* keeps a stranded device's own state */
    kept_set *k = stranded ? malloc(sizeof *k) : NULL;
    if (k) {
        pthread_mutex_lock(&kept_lock);
        *k = (kept_set){set, kept_sets};
        kept_sets = k;
        pthread_mutex_unlock(&kept_lock);
    } else if (!stranded) {
        pthread_mutex_destroy(&set->defer_lock);
        pthread_mutex_destroy(&set->reg_lock);
        free(set->devs);
        free(set);
    } /* else no room to list it: left unreachable, still allocated */
    mgt_error_restore(&saved);
}

int mgt_devset_count(const mgt_devset *set) { return set->n; }

mgt_device *mgt_devset_device(const mgt_devset *set, int i)
{
    return i >= 0 && i < set->n ? &set->devs[i] : NULL;
}

mgt_device_kind mgt_devset_kind(const mgt_devset *set) { return set->kind; }
bool mgt_devset_host_memory(const mgt_devset *set) { return set->iface->host_memory; }
void mgt_device_keep_memory(mgt_device *d) { atomic_store(&d->keep_memory, true); }

bool mgt_devset_can_access_peer(const mgt_devset *set, int i, int j)
{
    if (i < 0 || j < 0 || i >= set->n || j >= set->n)
        return false;
    return i == j || (!set->no_p2p && set->iface->can_access_peer(set, i, j));
}

mgt_status mgt_devset_copy_rate(mgt_devset *set, int i, int j, size_t bytes, int reps,
                                double *bytes_per_s)
{
    *bytes_per_s = 0;
    if (i < 0 || j < 0 || i >= set->n || j >= set->n || i == j || bytes == 0 || reps < 1)
        return bad_arg("copy rate", "two distinct devices of the set, bytes > 0 and reps >= 1");
    mgt_device *a = &set->devs[i], *b = &set->devs[j];
    mgt_buffer *src = NULL, *dst = NULL;
    mgt_stream *sa = NULL, *sb = NULL;
    mgt_event *e0 = NULL, *e1 = NULL;
    mgt_status st = mgt_buffer_alloc(a, bytes, &src);
    if (st == MGT_OK)
        st = mgt_buffer_alloc(b, bytes, &dst);
    if (st == MGT_OK)
        st = mgt_stream_create(a, &sa);
    if (st == MGT_OK)
        st = mgt_stream_create(b, &sb);
    if (st == MGT_OK)
        st = mgt_event_create(b, &e0);
    if (st == MGT_OK)
        st = mgt_event_create(b, &e1);
    if (st == MGT_OK)
        st = mgt_memset(sa, mgt_buffer_ptr(src), 0, bytes);
    /* one untimed copy: first-touch page faults, peer mappings, staging warm-up */
    if (st == MGT_OK)
        st = mgt_copy_peer(sb, mgt_buffer_ptr(dst), sa, mgt_buffer_ptr(src), bytes);
    double best = 0;
    for (int r = 0; r < reps && st == MGT_OK; r++) {
        float ms = 0;
        st = mgt_event_record(e0, sb);
        if (st == MGT_OK)
            st = mgt_copy_peer(sb, mgt_buffer_ptr(dst), sa, mgt_buffer_ptr(src), bytes);
        if (st == MGT_OK)
            st = mgt_event_record(e1, sb);
        if (st == MGT_OK)
            st = mgt_event_synchronize(e1, NULL);
        if (st == MGT_OK)
            st = mgt_event_elapsed_ms(e0, e1, &ms);
        if (st == MGT_OK && ms > 0 && (double)bytes / (ms * 1e-3) > best)
            best = (double)bytes / (ms * 1e-3);
    }
    mgt_event_free(e1);
    mgt_event_free(e0);
    mgt_stream_free(sb);
    mgt_stream_free(sa);
    mgt_buffer_free(dst);
    mgt_buffer_free(src);
    *bytes_per_s = best;
    return st;
}

int mgt_device_index(const mgt_device *d) { return d->index; }
int mgt_device_id(const mgt_device *d) { return d->id; }
const char *mgt_device_name(const mgt_device *d) { return d->name; }
mgt_device_kind mgt_device_get_kind(const mgt_device *d) { return d->set->kind; }

mgt_status mgt_device_op_profile(mgt_device *d, bool on)
{
    const mgt_backend_i *iface = d->set->iface;
    if (!iface->op_profile)
        return mgt_error_set(MGT_ERR_UNSUPPORTED, "%s: the %s backend keeps no per-op profile",
                             d->name, iface->name);
    iface->op_profile(d, on);
    return MGT_OK;
}

static int by_seconds(const void *a, const void *b)
{
    const mgt_op_time *x = a, *y = b;
    return x->seconds < y->seconds ? 1 : x->seconds > y->seconds ? -1 : 0;
}

int mgt_device_op_times(const mgt_device *d, mgt_op_time *out, int cap)
{
    const mgt_backend_i *iface = d->set->iface;
    if (!iface->op_times)
        return 0;
    double s[MGT_OP_COUNT], f[MGT_OP_COUNT];
    long c[MGT_OP_COUNT];
    iface->op_times(d, s, c, f);
    mgt_op_time all[MGT_OP_COUNT];
    int n = 0;
    for (int k = 0; k < MGT_OP_COUNT; k++)
        if (c[k] > 0)
            all[n++] = (mgt_op_time){mgt_op_name((mgt_op_kind)k), s[k], f[k], c[k]};
    qsort(all, (size_t)n, sizeof *all, by_seconds);
    for (int i = 0; i < n && i < cap; i++)
        out[i] = all[i];
    return n;
}

mgt_layout mgt_device_act_layout(const mgt_device *d)
{
    const mgt_backend_i *iface = d->set->iface;
    return iface->act_layout ? iface->act_layout(d) : MGT_LAYOUT_NCHW;
}

mgt_precision mgt_device_act_dtype(const mgt_device *d, mgt_precision amp)
{
    const mgt_backend_i *iface = d->set->iface;
    return amp != MGT_PREC_F32 && iface->act_dtype ? iface->act_dtype(d, amp) : MGT_PREC_F32;
}

void mgt_device_memory(const mgt_device *d, size_t *used, size_t *total)
{
    if (used)
        *used = atomic_load(&((mgt_device *)d)->used);
    if (total)
        *total = d->total_mem;
}

mgt_status mgt_device_synchronize(mgt_device *d, const mgt_abort *abort)
{
    if (atomic_load(&d->stalled))
        return stalled_error(d);
    return waited(d, d->set->iface->device_synchronize(d, abort));
}

bool mgt_device_counts(const mgt_device *d, long *allocs, long *kernels)
{
    *allocs = *kernels = 0;
    if (!d || !d->set->iface->counts)
        return false;
    d->set->iface->counts(d, allocs, kernels);
    return true;
}

void mgt_device_abandon(mgt_device *d, const char *why)
{
    if (!d)
        return;
    if (!atomic_load(&d->abandoned)) {
        snprintf(d->abandon_why, sizeof d->abandon_why, "%s", why);
        atomic_store(&d->abandoned, true);
    }
    if (d->set->iface->abandon)
        d->set->iface->abandon(d, why);
}

void mgt_device_strand(mgt_device *d, const char *why)
{
    if (!d)
        return;
    atomic_store(&d->stranded, true);
    mgt_device_abandon(d, why);
}

void mgt_device_unstall(mgt_device *d)
{
    if (d)
        atomic_store(&d->stalled, false);
}

double mgt_device_busy_s(const mgt_device *d)
{
    return d && d->set->iface->busy_s ? d->set->iface->busy_s(d) : -1;
}

static double mib(size_t b) { return (double)b / (1024.0 * 1024.0); }

mgt_status mgt_device_reserve(mgt_device *d, size_t bytes, const char *what)
{
    size_t used = atomic_load(&d->used);
    do {
        if (bytes > d->total_mem || used > d->total_mem - bytes)
            return mgt_error_set(MGT_ERR_OOM,
                                 "%s: out of memory: %s of %.1f MiB with %.1f MiB of %.1f MiB "
                                 "in use",
                                 d->name, what, mib(bytes), mib(used), mib(d->total_mem));
    } while (!atomic_compare_exchange_weak(&d->used, &used, used + bytes));
    return MGT_OK;
}

void mgt_device_unreserve(mgt_device *d, size_t bytes) { atomic_fetch_sub(&d->used, bytes); }

/* ---- memory ---- */

mgt_status mgt_buffer_alloc(mgt_device *d, size_t bytes, mgt_buffer **out)
{
    *out = NULL;
    if (!d)
        return bad_arg("buffer alloc", "no device");
    if (bytes == 0)
        return mgt_error_set(MGT_ERR_INVALID, "%s: buffer alloc of 0 bytes", d->name);
    mgt_buffer *b = malloc(sizeof *b);
    if (!b)
        return mgt_error_set(MGT_ERR_OOM, "%s: host memory exhausted", d->name);
    deferred_reap(d->set);
    mgt_status st = mgt_device_reserve(d, bytes, "buffer");
    /* full: the blocks freed but not yet passed by the streams are this device's memory */
    if (st == MGT_ERR_OOM && deferred_wait(d->set, d, false) > 0)
        st = mgt_device_reserve(d, bytes, "buffer");
    if (st == MGT_OK) {
        st = d->set->iface->alloc(d, bytes, &b->ptr);
        if (st == MGT_ERR_OOM && deferred_wait(d->set, d, false) > 0)
            st = d->set->iface->alloc(d, bytes, &b->ptr);
        if (st != MGT_OK)
            mgt_device_unreserve(d, bytes);
    }
    if (st != MGT_OK) {
        free(b);
        return st;
    }
    b->dev = d;
    b->size = bytes;
    REG_LINK(d->set, buffers, b);
    *out = b;
    return MGT_OK;
}

void mgt_buffer_free(mgt_buffer *b)
{
    if (!b)
        return;
    mgt_devset *set = b->dev->set;
    REG_UNLINK(set, buffers, b);
    mgt_error_saved saved; /* a wait for a failed device's work sets its text */
    mgt_error_save(&saved);
    free_after_streams(set, b->dev, b->ptr, b->size);
    free(b);
    deferred_reap(set);
    mgt_error_restore(&saved);
}

void *mgt_buffer_ptr(const mgt_buffer *b) { return b->ptr; }
size_t mgt_buffer_size(const mgt_buffer *b) { return b->size; }
mgt_device *mgt_buffer_device(const mgt_buffer *b) { return b->dev; }

mgt_status mgt_host_alloc(mgt_device *d, size_t bytes, void **out)
{
    *out = NULL;
    if (!d || bytes == 0)
        return bad_arg("host alloc", "no device or 0 bytes");
    return d->set->iface->host_alloc(d, bytes, out);
}

void mgt_host_free(mgt_device *d, void *p)
{
    if (!p)
        return;
    mgt_error_saved saved; /* a wait for a failed device's work sets its text */
    mgt_error_save(&saved);
    free_after_streams(d->set, d, p, 0);
    deferred_reap(d->set);
    mgt_error_restore(&saved);
}

/* ---- streams and events ---- */

mgt_status mgt_stream_create(mgt_device *d, mgt_stream **out)
{
    *out = NULL;
    if (!d)
        return bad_arg("stream create", "no device");
    mgt_stream *s = calloc(1, sizeof *s);
    if (!s)
        return mgt_error_set(MGT_ERR_OOM, "%s: host memory exhausted", d->name);
    s->dev = d;
    atomic_init(&s->pins, 0);
    pthread_mutex_init(&s->aux_lock, NULL);
    mgt_status st = d->set->iface->stream_create(s);
    if (st == MGT_OK) {
        st = mgt_event_create_ordering(d, &s->aux);
        if (st != MGT_OK)
            d->set->iface->stream_destroy(s);
    }
    if (st != MGT_OK) {
        pthread_mutex_destroy(&s->aux_lock);
        free(s);
        return st;
    }
    REG_LINK(d->set, streams, s);
    *out = s;
    return MGT_OK;
}

void mgt_stream_free(mgt_stream *s)
{
    if (!s)
        return;
    REG_UNLINK(s->dev->set, streams, s);
    mgt_error_saved saved; /* a wait for a failed device's work sets its text */
    mgt_error_save(&saved);
    while (atomic_load(&s->pins)) /* a buffer free recording its event here */
        sched_yield();
    if (!atomic_load(&s->dev->stalled))
        waited(s->dev, s->dev->set->iface->stream_synchronize(s, NULL));
    s->dev->set->iface->stream_destroy(s);
    mgt_error_restore(&saved);
    mgt_event_free(s->aux);
    pthread_mutex_destroy(&s->aux_lock);
    free(s);
}

mgt_device *mgt_stream_device(const mgt_stream *s) { return s->dev; }

mgt_status mgt_stream_synchronize(mgt_stream *s, const mgt_abort *abort)
{
    if (!s)
        return bad_arg("stream synchronize", "no stream");
    if (atomic_load(&s->dev->stalled))
        return stalled_error(s->dev);
    return waited(s->dev, s->dev->set->iface->stream_synchronize(s, abort));
}

static mgt_status event_create(mgt_device *d, bool timing, mgt_event **out)
{
    *out = NULL;
    if (!d)
        return bad_arg("event create", "no device");
    mgt_event *e = calloc(1, sizeof *e);
    if (!e)
        return mgt_error_set(MGT_ERR_OOM, "%s: host memory exhausted", d->name);
    e->dev = d;
    e->timing = timing;
    mgt_status st = d->set->iface->event_create(e);
    if (st != MGT_OK) {
        free(e);
        return st;
    }
    REG_LINK(d->set, events, e);
    *out = e;
    return MGT_OK;
}

mgt_status mgt_event_create(mgt_device *d, mgt_event **out) { return event_create(d, true, out); }

mgt_status mgt_event_create_ordering(mgt_device *d, mgt_event **out)
{
    return event_create(d, false, out);
}

void mgt_event_free(mgt_event *e)
{
    if (!e)
        return;
    REG_UNLINK(e->dev->set, events, e);
    e->dev->set->iface->event_destroy(e);
    free(e);
}

mgt_status mgt_event_record(mgt_event *e, mgt_stream *s)
{
    if (!e || !s)
        return bad_arg("event record", "no event or stream");
    if (e->dev != s->dev)
        return mgt_error_set(MGT_ERR_INVALID,
                             "event record: the event belongs to %s, the stream to %s",
                             e->dev->name, s->dev->name);
    return s->dev->set->iface->event_record(e, s);
}

mgt_status mgt_stream_wait_event(mgt_stream *s, mgt_event *e)
{
    if (!e || !s)
        return bad_arg("stream wait event", "no event or stream");
    if (e->dev->set != s->dev->set)
        return bad_arg("stream wait event", "the event and the stream are of different sets");
    return s->dev->set->iface->stream_wait_event(s, e);
}

mgt_status mgt_event_synchronize(mgt_event *e, const mgt_abort *abort)
{
    if (!e)
        return bad_arg("event synchronize", "no event");
    if (atomic_load(&e->dev->stalled))
        return stalled_error(e->dev);
    return waited(e->dev, e->dev->set->iface->event_synchronize(e, abort));
}

mgt_status mgt_event_query(mgt_event *e, bool *done)
{
    if (!e || !done)
        return bad_arg("event query", "no event");
    return e->dev->set->iface->event_query(e, done);
}

bool mgt_event_outcome(mgt_event *e, bool *clean)
{
    *clean = false;
    return e && e->dev->set->iface->event_outcome && e->dev->set->iface->event_outcome(e, clean);
}

mgt_status mgt_event_elapsed_ms(mgt_event *start, mgt_event *end, float *ms)
{
    if (!start || !end || !ms)
        return bad_arg("event elapsed", "no event");
    if (!start->timing || !end->timing)
        return bad_arg("event elapsed",
                       "an ordering-only event (mgt_event_create_ordering) keeps no time");
    return start->dev->set->iface->event_elapsed_ms(start, end, ms);
}

/* ---- copies ---- */

mgt_status mgt_memset(mgt_stream *s, void *dst, int value, size_t bytes)
{
    if (!s || (!dst && bytes))
        return bad_arg("memset", "no stream or destination");
    if (bytes == 0)
        return MGT_OK;
    return s->dev->set->iface->memset(s, dst, value, bytes);
}

static mgt_status copy(const char *call, mgt_stream *s, mgt_copy_kind kind, void *dst,
                       const void *src, size_t bytes)
{
    if (!s || ((!dst || !src) && bytes))
        return bad_arg(call, "no stream, source or destination");
    if (bytes == 0)
        return MGT_OK;
    return s->dev->set->iface->copy(s, kind, dst, src, bytes);
}

mgt_status mgt_copy_h2d(mgt_stream *s, void *dst, const void *host_src, size_t bytes)
{
    return copy("copy h2d", s, MGT_COPY_H2D, dst, host_src, bytes);
}

mgt_status mgt_copy_d2h(mgt_stream *s, void *host_dst, const void *src, size_t bytes)
{
    return copy("copy d2h", s, MGT_COPY_D2H, host_dst, src, bytes);
}

mgt_status mgt_copy_d2d(mgt_stream *s, void *dst, const void *src, size_t bytes)
{
    return copy("copy d2d", s, MGT_COPY_D2D, dst, src, bytes);
}

/* Makes `later` wait for everything enqueued so far on `earlier`, through earlier's own aux
   event; the lock keeps another thread's record of the same event from slipping between. */
static mgt_status order_after(mgt_stream *later, mgt_stream *earlier)
{
    if (later == earlier)
        return MGT_OK;
    pthread_mutex_lock(&earlier->aux_lock);
    mgt_status st = mgt_event_record(earlier->aux, earlier);
    if (st == MGT_OK)
        st = mgt_stream_wait_event(later, earlier->aux);
    pthread_mutex_unlock(&earlier->aux_lock);
    return st;
}

static mgt_status copy_staged(mgt_stream *dst_s, char *dst, mgt_stream *src_s, const char *src,
                              size_t bytes)
{
    mgt_devset *set = src_s->dev->set;
    staging_dev *sd = &((staging_dev *)set->staging)[src_s->dev->index];
    int di = dst_s->dev->index;
    mgt_status st = MGT_OK;
    pthread_mutex_lock(&sd->lock);
    mgt_event *last = NULL;
    for (size_t off = 0; off < bytes && st == MGT_OK; off += STAGING_CHUNK) {
        size_t n = bytes - off < STAGING_CHUNK ? bytes - off : STAGING_CHUNK;
        int k = sd->next;
        sd->next ^= 1;
        staging_slot *slot = &sd->slot[k];
        mgt_event **read_done = &sd->read_done[2 * di + k];
        if (!*read_done)
            st = mgt_event_create_ordering(dst_s->dev, read_done);
        if (st == MGT_OK && slot->last_read)
            st = mgt_stream_wait_event(src_s, slot->last_read);
        if (st == MGT_OK)
            st = mgt_copy_d2h(src_s, slot->host, src + off, n);
        if (st == MGT_OK)
            st = mgt_event_record(slot->full, src_s);
        if (st == MGT_OK)
            st = mgt_stream_wait_event(dst_s, slot->full);
        if (st == MGT_OK)
            st = mgt_copy_h2d(dst_s, dst + off, slot->host, n);
        if (st == MGT_OK)
            st = mgt_event_record(*read_done, dst_s);
        if (st == MGT_OK) {
            slot->last_read = *read_done;
            last = *read_done;
        }
    }
    /* the source stream's later work also follows the whole copy, as on the direct path */
    if (st == MGT_OK && last)
        st = mgt_stream_wait_event(src_s, last);
    pthread_mutex_unlock(&sd->lock);
    return st;
}

mgt_status mgt_copy_peer(mgt_stream *dst_stream, void *dst, mgt_stream *src_stream, const void *src,
                         size_t bytes)
{
    if (!dst_stream || !src_stream || ((!dst || !src) && bytes))
        return bad_arg("copy peer", "no stream, source or destination");
    mgt_device *dd = dst_stream->dev, *sd = src_stream->dev;
    if (dd->set != sd->set)
        return bad_arg("copy peer", "the two streams are of different device sets");
    if (bytes == 0)
        return MGT_OK;
    const mgt_backend_i *iface = dd->set->iface;
    if (dd == sd) {
        mgt_status st = order_after(dst_stream, src_stream);
        if (st == MGT_OK)
            st = iface->copy(dst_stream, MGT_COPY_D2D, dst, src, bytes);
        return st != MGT_OK ? st : order_after(src_stream, dst_stream);
    }
    if (!mgt_devset_can_access_peer(dd->set, sd->index, dd->index))
        return copy_staged(dst_stream, dst, src_stream, src, bytes);
    mgt_status st = order_after(dst_stream, src_stream);
    if (st == MGT_OK)
        st = iface->copy_peer(dst_stream, dst, sd, src, bytes);
    return st != MGT_OK ? st : order_after(src_stream, dst_stream);
}

/* ---- kernels ---- */

mgt_status mgt_op_launch(mgt_stream *s, const mgt_op *op)
{
    if (!s || !op)
        return bad_arg("launch", "no stream or op");
    mgt_status st = mgt_op_check(op);
    if (st != MGT_OK)
        return st;
    const mgt_backend_i *iface = s->dev->set->iface;
    if (iface->supports_op && !iface->supports_op(s->dev, op))
        return mgt_error_set(MGT_ERR_UNSUPPORTED, "%s: %s is not supported by this backend",
                             s->dev->name, mgt_op_name(op->kind));
    return iface->launch(s, op);
}

/* ---- across processes ---- */

struct mgt_xcomm {
    mgt_device *dev;
    void *impl;
};

bool mgt_xcomm_available(const mgt_devset *set)
{
    const mgt_backend_i *b = set->iface;
    return b->xcomm_id && b->xcomm_create && b->xcomm_allgather && b->xcomm_free;
}

mgt_status mgt_xcomm_id(mgt_devset *set, void *id, size_t *len)
{
    if (!mgt_xcomm_available(set))
        return mgt_error_set(MGT_ERR_UNSUPPORTED,
                             "%s devices have no collective across "
                             "processes",
                             set->iface->name);
    return set->iface->xcomm_id(id, MGT_XCOMM_ID_MAX, len);
}

mgt_status mgt_xcomm_create(mgt_device *d, const void *id, size_t len, int nranks, int rank,
                            mgt_xcomm **out)
{
    *out = NULL;
    if (!mgt_xcomm_available(d->set))
        return mgt_error_set(MGT_ERR_UNSUPPORTED, "%s: no collective across processes", d->name);
    if (nranks < 1 || rank < 0 || rank >= nranks || !id || len == 0)
        return mgt_error_set(MGT_ERR_INVALID, "%s: rank %d of %d is not a communicator place",
                             d->name, rank, nranks);
    mgt_xcomm *x = calloc(1, sizeof *x);
    if (!x)
        return mgt_error_set(MGT_ERR_OOM, "%s: host memory exhausted", d->name);
    x->dev = d;
    mgt_status st = d->set->iface->xcomm_create(d, id, len, nranks, rank, &x->impl);
    if (st != MGT_OK) {
        free(x);
        return st;
    }
    *out = x;
    return MGT_OK;
}

mgt_status mgt_xcomm_allgather(mgt_xcomm *x, mgt_stream *s, const float *send, float *recv,
                               size_t n)
{
    if (!x || !s || s->dev != x->dev)
        return mgt_error_set(MGT_ERR_INVALID, "xcomm: the stream is not on the communicator's "
                                              "device");
    if (n == 0)
        return MGT_OK;
    return x->dev->set->iface->xcomm_allgather(x->impl, s, send, recv, n);
}

bool mgt_xcomm_can_alltoall(const mgt_devset *set)
{
    return mgt_xcomm_available(set) && set->iface->xcomm_alltoall;
}

mgt_status mgt_xcomm_alltoall(mgt_xcomm *x, mgt_stream *s, const float *send, const size_t *counts,
                              const size_t *displs, float *recv, size_t each, size_t stride)
{
    if (!x || !s || s->dev != x->dev)
        return mgt_error_set(MGT_ERR_INVALID, "xcomm: the stream is not on the communicator's "
                                              "device");
    if (!mgt_xcomm_can_alltoall(x->dev->set))
        return mgt_error_set(MGT_ERR_UNSUPPORTED,
                             "%s: the collective across processes has no "
                             "all-to-all",
                             x->dev->name);
    if (stride < each)
        return mgt_error_set(MGT_ERR_INVALID, "xcomm: all-to-all rows of %zu floats %zu apart",
                             each, stride);
    return x->dev->set->iface->xcomm_alltoall(x->impl, s, send, counts, displs, recv, each, stride);
}

void mgt_xcomm_free(mgt_xcomm *x)
{
    if (!x)
        return;
    mgt_error_saved saved;
    mgt_error_save(&saved);
    x->dev->set->iface->xcomm_free(x->impl);
    mgt_error_restore(&saved);
    free(x);
}
