/* The CPU mock backend: devices whose streams run on their own threads, asynchronously, like a
 * GPU's, with a peer-access matrix, a memory limit, injected faults and random op delays.
 *
 * Each stream is a bounded ring of commands and one thread that runs them in order. Kernels
 * run on the device's thread pool (cpu_run), the stream thread taking part. An event
 * counts records: recording enqueues generation g, a wait captures the latest generation at
 * the time of the call (as cudaStreamWaitEvent does), so every wait points at a record that
 * was enqueued earlier and streams cannot wait on each other in a cycle.
 *
 * A failing kernel or an injected fault marks the device failed (sticky, as CUDA's errors
 * are): its streams skip the remaining work but still complete their event records, so no
 * other stream or host thread hangs on them, and every later call or wait on the device
 * returns MGT_ERR_DEVICE with the first failure's text. A device that is gone (fault=gone)
 * refuses allocations, streams and events as well, and its memory reads as all-one bytes to
 * the peers that copy from it, as a PCIe read of a device that has left the bus does.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "device/backend.h"
#include "device/cpu/kernels.h"

#define MOCK_RING 1024 /* commands queued per stream before enqueue blocks */
#define MOCK_ALIGN 64

typedef struct mock_event mock_event;
typedef struct mock_dev mock_dev;

typedef enum { CMD_OP, CMD_COPY, CMD_MEMSET, CMD_RECORD, CMD_WAIT } cmd_kind;

typedef struct cmd {
    cmd_kind kind;
    union {
        mgt_op op;
        struct {
            void *dst;
            const void *src;
            size_t n;
            bool peer;
            mock_dev *from; /* a peer copy's source device */
        } copy;
        struct {
            void *dst;
            int value;
            size_t n;
        } set;
        struct {
            mock_event *e;
            uint64_t gen;
        } ev;
    } u;
} cmd;

typedef struct mock_alloc {
    char *p;
    size_t n;
    bool retired; /* freed by the program, kept until queued work has passed the free */
} mock_alloc;

typedef struct mock_stream mock_stream;

struct mock_dev {
    mgt_device *dev;
    cpu_ctx ctx;
    pthread_mutex_t lock; /* guards allocs, streams and the failure text */
    mock_alloc *allocs;   /* sorted by address */
    int nallocs, cap_allocs;
    /* pinned host memory handed out: what a free kept behind a stalled stream goes at close */
    void **host;
    int nhost, cap_host;
    mock_stream *streams;
    atomic_long n_allocs, n_kernels;
    atomic_int failed;
    atomic_bool gone;    /* fault=gone has struck: every call fails, peers read all-ones */
    char fail_text[400]; /* the device name (127), ": ", a failure text (255) */
    mgt_fault_kind fault_kind;
    long fault_nth;
    char fault_op[32];
    atomic_long n_fault_op; /* kernels named fault_op run so far */
    atomic_long n_peer_in;  /* direct peer copies into the device run so far */
    atomic_long n_launched; /* kernels (of fault_op) launched by host threads */
    /* host threads stuck for good in a call (fault=stuck): their last touch of the device,
       which the frees of its streams and of the set read first, so that what the stuck
       thread read is ordered before them */
    atomic_int stuck_calls;
    atomic_bool closed; /* its set was freed (a stranded device's state outlives it) */
    int refusals[MGT_MOCK_MAX_REFUSALS]; /* fault=lowp's reasons for attempts N, N+1, ... */
    int nrefusals;
    long n_lowp; /* 16-bit convolutions the native kernel was asked to run (under ctx.lock) */
    unsigned delay_us;
    uint64_t seed;
    double link_bw, link_lat; /* the link model of direct peer copies */
    int n_streams_made;
    /* the per-op profile (mgt_device_op_profile), under prof_lock */
    atomic_bool profiling;
    pthread_mutex_t prof_lock;
    double op_s[MGT_OP_COUNT], op_flops[MGT_OP_COUNT];
    long op_calls[MGT_OP_COUNT];
};

typedef struct mock_set {
    mgt_mock_options opt;
} mock_set;

struct mock_stream {
    mgt_stream *s;
    mock_dev *md;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t work, done;
    cmd *ring;
    uint64_t enqueued, completed;
    bool stop;
    atomic_bool quit;           /* being freed: a hung kernel or a queued wait on it gives up */
    atomic_llong busy_since_us; /* when the kernel or copy running now began; 0: none runs */
    uint64_t rng;
    mock_stream *next;
};

/* Records are numbered 1, 2, ... as they are made; they may complete out of order when the
   event is recorded on several streams, and a wait is for one record, not for "some record
   at least as new": so completion is kept exactly, as everything up to `upto` plus the few
   records completed beyond it. */
struct mock_event {
    mock_dev *md;
    /* the owner's reference plus one per queued record or wait: as with cudaEventDestroy,
       an event freed while streams still hold work on it goes when that work has run */
    atomic_int refs;
    pthread_mutex_t lock;
    pthread_cond_t cv;
    uint64_t recorded;
    uint64_t upto;    /* records 1..upto have all run */
    uint64_t *beyond; /* records above upto that have run */
    int nbeyond, cap_beyond;
    uint64_t time_gen; /* the newest record that has run, and when */
    double time;
    uint64_t clean_gen; /* the newest record that ran while the device was sound */
};

static mock_dev *dev_of(const mgt_device *d) { return d->impl; }

/* ---- failure ---- */

/* Marks the device failed; the first failure's text is the one every later call reports. */
static void mock_fail(mock_dev *md, const char *text)
{
    pthread_mutex_lock(&md->lock);
    if (!atomic_load(&md->failed)) {
        snprintf(md->fail_text, sizeof md->fail_text, "%s: %s", md->dev->name, text);
        atomic_store(&md->failed, 1);
    }
    pthread_mutex_unlock(&md->lock);
}

/* MGT_ERR_DEVICE with the device's first failure, or MGT_OK. */
static mgt_status mock_sticky(mock_dev *md)
{
    if (!atomic_load(&md->failed))
        return MGT_OK;
    pthread_mutex_lock(&md->lock);
    mgt_status st = mgt_error_set(MGT_ERR_DEVICE, "%s", md->fail_text);
    pthread_mutex_unlock(&md->lock);
    return st;
}

/* ---- allocations: kept sorted so that every pointer handed to an op can be checked ---- */

static int alloc_find(const mock_dev *md, const char *p)
{
    int lo = 0, hi = md->nallocs - 1, found = -1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (md->allocs[mid].p <= p) {
            found = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return found;
}

/* Whether [p, p+bytes) lies inside one live allocation of the device. */
static bool mock_owns(mock_dev *md, const void *p, size_t bytes)
{
    pthread_mutex_lock(&md->lock);
    int i = alloc_find(md, p);
    bool ok = i >= 0 && !md->allocs[i].retired &&
              (const char *)p + bytes <= md->allocs[i].p + md->allocs[i].n &&
              (const char *)p + bytes >= (const char *)p;
    pthread_mutex_unlock(&md->lock);
    return ok;
}

static mgt_status check_owned(mock_dev *md, const void *p, size_t bytes, const char *what,
                              const char *arg)
{
    if (mock_owns(md, p, bytes))
        return MGT_OK;
    return mgt_error_set(MGT_ERR_INVALID,
                         "%s: %s: %s (%zu bytes at %p) is not memory of this device", md->dev->name,
                         what, arg, bytes, p);
}

/* fault=alloc@D:N: every allocation asked of the device once its set is open, of its memory
   or of pinned host memory (which cudaHostAlloc may refuse as well), is counted; the Nth
   fails. */
static mgt_status injected_alloc_fault(mock_dev *md, size_t bytes, const char *what)
{
    if (atomic_load(&md->gone))
        return mock_sticky(md);
    if (!atomic_load(&md->dev->set->open))
        return MGT_OK;
    long n = atomic_fetch_add(&md->n_allocs, 1) + 1;
    if (md->fault_kind == MGT_FAULT_ALLOC && n == md->fault_nth)
        return mgt_error_set(MGT_ERR_OOM,
                             "%s: injected allocation failure (allocation #%ld on this "
                             "device, %zu %s)",
                             md->dev->name, n, bytes, what);
    return MGT_OK;
}

/* The queued work of every stream is skipped from now on (the device is failed) and a hung
   kernel leaves its loop (quit): records still complete, so nothing waits on the device. */
static void mock_abandon(mgt_device *d, const char *why)
{
    mock_dev *md = dev_of(d);
    mock_fail(md, why);
    pthread_mutex_lock(&md->lock);
    for (mock_stream *ms = md->streams; ms; ms = ms->next)
        atomic_store(&ms->quit, true);
    pthread_mutex_unlock(&md->lock);
}

static double mock_busy_s(const mgt_device *d)
{
    mock_dev *md = dev_of(d);
    double now = mgt_time_now(), most = 0;
    pthread_mutex_lock(&md->lock);
    for (mock_stream *ms = md->streams; ms; ms = ms->next) {
        long long since = atomic_load(&ms->busy_since_us);
        if (since && now - 1e-6 * (double)since > most)
            most = now - 1e-6 * (double)since;
    }
    pthread_mutex_unlock(&md->lock);
    return most;
}

static void mock_counts(const mgt_device *d, long *allocs, long *kernels)
{
    mock_dev *md = dev_of(d);
    *allocs = atomic_load(&md->n_allocs);
    *kernels = atomic_load(&md->n_kernels);
}

static mgt_status mock_alloc_mem(mgt_device *d, size_t bytes, void **ptr)
{
    mock_dev *md = dev_of(d);
    mgt_status st = injected_alloc_fault(md, bytes, "bytes");
    if (st != MGT_OK)
        return st;
    void *p = NULL;
    if (posix_memalign(&p, MOCK_ALIGN, bytes) != 0)
        return mgt_error_set(MGT_ERR_OOM, "%s: host memory exhausted allocating %zu bytes", d->name,
                             bytes);
    /* GPU memory comes back uninitialised; all-ones bytes are NaN floats, so code that
       forgets to initialise a buffer fails here too instead of reading convenient zeros. */
    memset(p, 0xff, bytes);
    pthread_mutex_lock(&md->lock);
    if (md->nallocs == md->cap_allocs) {
        int cap = md->cap_allocs ? 2 * md->cap_allocs : 64;
        mock_alloc *a = realloc(md->allocs, (size_t)cap * sizeof *a);
        if (!a) {
            pthread_mutex_unlock(&md->lock);
            free(p);
            return mgt_error_set(MGT_ERR_OOM, "%s: host memory exhausted", d->name);
        }
        md->allocs = a;
        md->cap_allocs = cap;
    }
    int i = alloc_find(md, p) + 1;
    memmove(&md->allocs[i + 1], &md->allocs[i], (size_t)(md->nallocs - i) * sizeof *md->allocs);
    md->allocs[i] = (mock_alloc){p, bytes, false};
    md->nallocs++;
    pthread_mutex_unlock(&md->lock);
    *ptr = p;
    return MGT_OK;
}

static void mock_retire_mem(mgt_device *d, void *ptr)
{
    mock_dev *md = dev_of(d);
    pthread_mutex_lock(&md->lock);
    int i = alloc_find(md, ptr);
    if (i >= 0 && md->allocs[i].p == ptr)
        md->allocs[i].retired = true;
    pthread_mutex_unlock(&md->lock);
}

/* The dispatch layer frees a block only once no queued work can use it. */
static void mock_free_mem(mgt_device *d, void *ptr)
{
    mock_dev *md = dev_of(d);
    pthread_mutex_lock(&md->lock);
    int i = alloc_find(md, ptr);
    if (i >= 0 && md->allocs[i].p == ptr) {
        memmove(&md->allocs[i], &md->allocs[i + 1],
                (size_t)(md->nallocs - i - 1) * sizeof *md->allocs);
        md->nallocs--;
    }
    pthread_mutex_unlock(&md->lock);
    free(ptr);
}

static mgt_status mock_host_alloc(mgt_device *d, size_t bytes, void **ptr)
{
    mock_dev *md = dev_of(d);
    mgt_status st = injected_alloc_fault(md, bytes, "pinned bytes");
    if (st != MGT_OK)
        return st;
    void *p = NULL;
    if (posix_memalign(&p, MOCK_ALIGN, bytes) != 0)
        return mgt_error_set(MGT_ERR_OOM, "%s: host memory exhausted allocating %zu pinned bytes",
                             d->name, bytes);
    pthread_mutex_lock(&md->lock);
    if (md->nhost == md->cap_host) {
        int cap = md->cap_host ? 2 * md->cap_host : 16;
        void **h = realloc(md->host, (size_t)cap * sizeof *h);
        if (!h) {
            pthread_mutex_unlock(&md->lock);
            free(p);
            return mgt_error_set(MGT_ERR_OOM, "%s: host memory exhausted", d->name);
        }
        md->host = h;
        md->cap_host = cap;
    }
    md->host[md->nhost++] = p;
    pthread_mutex_unlock(&md->lock);
    *ptr = p;
    return MGT_OK;
}

static void mock_host_free(mgt_device *d, void *ptr)
{
    mock_dev *md = dev_of(d);
    pthread_mutex_lock(&md->lock);
    for (int i = 0; i < md->nhost; i++)
        if (md->host[i] == ptr) {
            md->host[i] = md->host[--md->nhost];
            break;
        }
    pthread_mutex_unlock(&md->lock);
    free(ptr);
}

/* ---- events ---- */

/* Whether record `gen` has run. Lock held. */
static bool event_done(const mock_event *e, uint64_t gen)
{
    if (gen <= e->upto)
        return true;
    for (int i = 0; i < e->nbeyond; i++)
        if (e->beyond[i] == gen)
            return true;
    return false;
}

/* clean: the record ran while its device was sound (mgt_event_outcome). */
static void event_complete(mock_event *e, uint64_t gen, bool clean)
{
    pthread_mutex_lock(&e->lock);
    if (clean && gen > e->clean_gen)
        e->clean_gen = gen;
    if (gen == e->upto + 1) {
        e->upto = gen;
        for (int i = 0; i < e->nbeyond;) /* absorb records that ran early */
            if (e->beyond[i] == e->upto + 1) {
                e->upto++;
                e->beyond[i] = e->beyond[--e->nbeyond];
                i = 0;
            } else {
                i++;
            }
    } else if (gen > e->upto) {
        if (e->nbeyond == e->cap_beyond) {
            int cap = e->cap_beyond ? 2 * e->cap_beyond : 8;
            uint64_t *b = realloc(e->beyond, (size_t)cap * sizeof *b);
            if (b) {
                e->beyond = b;
                e->cap_beyond = cap;
            }
        }
        if (e->nbeyond < e->cap_beyond)
            e->beyond[e->nbeyond++] = gen;
        else /* no memory for exactness: everything up to gen counts as run */
            e->upto = gen;
    }
    if (gen >= e->time_gen) {
        e->time_gen = gen;
        e->time = mgt_time_now();
    }
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->lock);
}

/* A queued wait: false when its stream is freed before the record comes (the record's stream
   hung or failed), the stream's later work then having no order to keep. */
static bool event_wait_gen(mock_event *e, uint64_t gen, const atomic_bool *quit)
{
    bool ok = true;
    pthread_mutex_lock(&e->lock);
    while (!event_done(e, gen)) {
        if (atomic_load(quit)) {
            ok = false;
            break;
        }
        mgt_cond_wait_slice(&e->cv, &e->lock);
    }
    pthread_mutex_unlock(&e->lock);
    return ok;
}

static void event_release(mock_event *e)
{
    if (atomic_fetch_sub(&e->refs, 1) != 1)
        return;
    pthread_mutex_destroy(&e->lock);
    pthread_cond_destroy(&e->cv);
    free(e->beyond);
    free(e);
}

/* ---- the stream thread ---- */

static uint64_t next_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void run_cmd(mock_stream *ms, const cmd *c)
{
    mock_dev *md = ms->md;
    /* a stream freed with work queued (its device stalled) gives that work up: the memory it
       names may be gone */
    bool failed = atomic_load(&md->failed) || atomic_load(&ms->quit);
    switch (c->kind) {
    case CMD_OP: {
        if (failed)
            return;
        long n = atomic_fetch_add(&md->n_kernels, 1) + 1;
        const char *name = mgt_op_name(c->u.op.kind);
        char text[256];
        if (md->fault_op[0]) /* count only the kernels of the named op */
            n = strcmp(name, md->fault_op) == 0 ? atomic_fetch_add(&md->n_fault_op, 1) + 1 : 0;
        if (md->fault_kind == MGT_FAULT_KERNEL && n == md->fault_nth) {
            snprintf(text, sizeof text, "injected fault in kernel %s (%s #%ld on this device)",
                     name, md->fault_op[0] ? name : "kernel", n);
            mock_fail(md, text);
            return;
        }
        if (md->fault_kind == MGT_FAULT_GONE && n == md->fault_nth) {
            snprintf(text, sizeof text,
                     "the device is gone (injected: it fell off the bus at kernel %s, #%ld on "
                     "this device)",
                     name, n);
            mock_fail(md, text);
            atomic_store(&md->gone, true);
            return;
        }
        if (md->fault_kind == MGT_FAULT_HANG && n == md->fault_nth) {
            /* a hung GPU kernel: nothing after it on this stream runs until the device is
               given up or the stream freed, and the device is failed then, as a reset would
               leave it. It notices later (20 ms) than a queued wait on another stream does
               (a 5 ms slice), so the peers' streams go on before its own records complete,
               as they would on a GPU: nothing the hung kernel wrote is ordered before them */
            while (!atomic_load(&ms->quit))
                usleep(20000);
            snprintf(text, sizeof text, "injected hang in kernel %s (%s #%ld on this device)", name,
                     md->fault_op[0] ? name : "kernel", n);
            mock_fail(md, text);
            return;
        }
        bool prof = atomic_load(&md->profiling);
        struct timespec t0, t1;
        if (prof)
            clock_gettime(CLOCK_MONOTONIC, &t0);
        if (cpu_run(&md->ctx, &c->u.op) != MGT_OK) {
            snprintf(text, sizeof text, "kernel %s failed: %s", name, mgt_error_last());
            mock_fail(md, text);
        }
        if (prof) {
            clock_gettime(CLOCK_MONOTONIC, &t1);
            int k = (int)c->u.op.kind;
            pthread_mutex_lock(&md->prof_lock);
            md->op_s[k] +=
                (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
            md->op_flops[k] += mgt_op_flops(&c->u.op);
            md->op_calls[k]++;
            pthread_mutex_unlock(&md->prof_lock);
        }
        return;
    }
    case CMD_COPY:
        if (failed)
            return;
        if (c->u.copy.peer && md->fault_kind == MGT_FAULT_PEER &&
            atomic_fetch_add(&md->n_peer_in, 1) + 1 == md->fault_nth) {
            char text[256];
            snprintf(text, sizeof text,
                     "injected failure of a peer copy of %zu bytes from %s (peer copy #%ld into "
                     "this device)",
                     c->u.copy.n, c->u.copy.from->dev->name, md->fault_nth);
            mock_fail(md, text);
            return;
        }
        /* a failed source is not read: it may have been given up with its work unfinished
           (mgt_device_abandon: a hung kernel may still be writing the memory, and the event
           records that let this copy start completed without waiting for it), so nothing
           orders its writes before this read. The copy gets all-one bytes (NaN floats), what
           a read of a device that left the bus gets; the step it belongs to is left out. */
        if (c->u.copy.peer && atomic_load(&c->u.copy.from->failed)) {
            memset(c->u.copy.dst, 0xff, c->u.copy.n);
            return;
        }
        if (c->u.copy.peer && md->link_bw > 0) {
            /* the link model: the copy takes latency + bytes / bandwidth, however fast the
               memcpy itself was, so the collectives' scaling can be studied on a CPU */
            double t0 = mgt_time_now();
            memmove(c->u.copy.dst, c->u.copy.src, c->u.copy.n);
            double left = md->link_lat + (double)c->u.copy.n / md->link_bw - (mgt_time_now() - t0);
            if (left > 0) {
                struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
                nanosleep(&ts, NULL);
            }
            return;
        }
        memmove(c->u.copy.dst, c->u.copy.src, c->u.copy.n);
        return;
    case CMD_MEMSET:
        if (!failed)
            memset(c->u.set.dst, c->u.set.value, c->u.set.n);
        return;
    case CMD_RECORD:
        event_complete(c->u.ev.e, c->u.ev.gen, !failed);
        event_release(c->u.ev.e);
        return;
    case CMD_WAIT:
        if (!event_wait_gen(c->u.ev.e, c->u.ev.gen, &ms->quit))
            mock_fail(md, "a stream was freed while it waited for an event that never came");
        event_release(c->u.ev.e);
        return;
    }
}

static void *stream_main(void *arg)
{
    mock_stream *ms = arg;
    pthread_mutex_lock(&ms->lock);
    for (;;) {
        while (ms->completed == ms->enqueued && !ms->stop)
            pthread_cond_wait(&ms->work, &ms->lock);
        if (ms->completed == ms->enqueued)
            break;
        cmd c = ms->ring[ms->completed % MOCK_RING];
        pthread_mutex_unlock(&ms->lock);
        if (ms->md->delay_us)
            usleep((useconds_t)(next_rand(&ms->rng) % (ms->md->delay_us + 1u)));
        bool work = c.kind == CMD_OP || c.kind == CMD_COPY || c.kind == CMD_MEMSET;
        if (work)
            atomic_store(&ms->busy_since_us, (long long)(mgt_time_now() * 1e6) | 1);
        run_cmd(ms, &c);
        if (work)
            atomic_store(&ms->busy_since_us, 0);
        pthread_mutex_lock(&ms->lock);
        ms->completed++;
        pthread_cond_broadcast(&ms->done);
    }
    pthread_mutex_unlock(&ms->lock);
    return NULL;
}

static mgt_status enqueue(mgt_stream *s, const cmd *c)
{
    mock_stream *ms = s->impl;
    mgt_status st = mock_sticky(ms->md);
    if (st != MGT_OK)
        return st;
    pthread_mutex_lock(&ms->lock);
    while (ms->enqueued - ms->completed == MOCK_RING)
        pthread_cond_wait(&ms->done, &ms->lock);
    ms->ring[ms->enqueued % MOCK_RING] = *c;
    ms->enqueued++;
    pthread_cond_signal(&ms->work);
    pthread_mutex_unlock(&ms->lock);
    return MGT_OK;
}

static mgt_status mock_stream_create(mgt_stream *s)
{
    mock_dev *md = dev_of(s->dev);
    if (atomic_load(&md->gone))
        return mock_sticky(md);
    mock_stream *ms = calloc(1, sizeof *ms);
    cmd *ring = malloc(MOCK_RING * sizeof *ring);
    if (!ms || !ring) {
        free(ms);
        free(ring);
        return mgt_error_set(MGT_ERR_OOM, "%s: host memory exhausted creating a stream",
                             s->dev->name);
    }
    ms->s = s;
    ms->md = md;
    atomic_init(&ms->quit, false);
    ms->ring = ring;
    pthread_mutex_init(&ms->lock, NULL);
    pthread_cond_init(&ms->work, NULL);
    pthread_cond_init(&ms->done, NULL);
    pthread_mutex_lock(&md->lock);
    ms->rng = (md->seed * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)s->dev->index << 32) ^
              (uint64_t)++md->n_streams_made;
    if (!ms->rng)
        ms->rng = 1;
    pthread_mutex_unlock(&md->lock);
    if (pthread_create(&ms->thread, NULL, stream_main, ms) != 0) {
        pthread_mutex_destroy(&ms->lock);
        pthread_cond_destroy(&ms->work);
        pthread_cond_destroy(&ms->done);
        free(ring);
        free(ms);
        return mgt_error_set(MGT_ERR_DEVICE, "%s: cannot start a stream thread", s->dev->name);
    }
    pthread_mutex_lock(&md->lock);
    ms->next = md->streams;
    md->streams = ms;
    pthread_mutex_unlock(&md->lock);
    s->impl = ms;
    return MGT_OK;
}

static void mock_stream_destroy(mgt_stream *s)
{
    mock_stream *ms = s->impl;
    mock_dev *md = ms->md;
    (void)atomic_load(&md->stuck_calls); /* after what a stuck host thread read */
    pthread_mutex_lock(&md->lock);
    for (mock_stream **p = &md->streams; *p; p = &(*p)->next)
        if (*p == ms) {
            *p = ms->next;
            break;
        }
    pthread_mutex_unlock(&md->lock);
    atomic_store(&ms->quit, true);
    pthread_mutex_lock(&ms->lock);
    ms->stop = true;
    pthread_cond_signal(&ms->work);
    pthread_mutex_unlock(&ms->lock);
    pthread_join(ms->thread, NULL);
    pthread_mutex_destroy(&ms->lock);
    pthread_cond_destroy(&ms->work);
    pthread_cond_destroy(&ms->done);
    free(ms->ring);
    free(ms);
}

/* MGT_ERR_TIMEOUT once a wait begun at t0 has run past the set's wait limit. */
static mgt_status past_limit(const mgt_device *d, double t0, const char *what)
{
    double limit = d->set->wait_limit_s;
    if (mgt_time_now() - t0 <= limit)
        return MGT_OK;
    return mgt_error_set(MGT_ERR_TIMEOUT,
                         "%s: a wait for %s ran past the wait limit of %g s (%s): its "
                         "queued work has stopped making progress",
                         d->name, what, limit, d->set->wait_source);
}

static mgt_status stream_wait_drained(mock_stream *ms, const mgt_abort *abort)
{
    const double t0 = mgt_time_now();
    pthread_mutex_lock(&ms->lock);
    uint64_t target = ms->enqueued;
    while (ms->completed < target) {
        if (mgt_abort_is_raised(abort)) {
            pthread_mutex_unlock(&ms->lock);
            return mgt_error_set(MGT_ERR_ABORTED, "%s: wait for a stream aborted",
                                 ms->md->dev->name);
        }
        mgt_status st = past_limit(ms->md->dev, t0, "a stream");
        if (st != MGT_OK) {
            pthread_mutex_unlock(&ms->lock);
            return st;
        }
        mgt_cond_wait_slice(&ms->done, &ms->lock);
    }
    pthread_mutex_unlock(&ms->lock);
    return MGT_OK;
}

static mgt_status mock_stream_synchronize(mgt_stream *s, const mgt_abort *abort)
{
    mock_stream *ms = s->impl;
    mgt_status st = stream_wait_drained(ms, abort);
    return st != MGT_OK ? st : mock_sticky(ms->md);
}

static mgt_status mock_device_synchronize(mgt_device *d, const mgt_abort *abort)
{
    mock_dev *md = dev_of(d);
    /* Streams are created and destroyed by their owners, never while the device is being
       synchronised, so the list can be walked after the lock is dropped for each wait. */
    pthread_mutex_lock(&md->lock);
    mock_stream *list[256];
    int n = 0;
    for (mock_stream *ms = md->streams; ms && n < 256; ms = ms->next)
        list[n++] = ms;
    pthread_mutex_unlock(&md->lock);
    for (int i = 0; i < n; i++) {
        mgt_status st = stream_wait_drained(list[i], abort);
        if (st != MGT_OK)
            return st;
    }
    return mock_sticky(md);
}

static mgt_status mock_event_create(mgt_event *e)
{
    if (atomic_load(&dev_of(e->dev)->gone))
        return mock_sticky(dev_of(e->dev));
    mock_event *me = calloc(1, sizeof *me);
    if (!me)
        return mgt_error_set(MGT_ERR_OOM, "%s: host memory exhausted creating an event",
                             e->dev->name);
    me->md = dev_of(e->dev);
    atomic_init(&me->refs, 1);
    pthread_mutex_init(&me->lock, NULL);
    pthread_cond_init(&me->cv, NULL);
    e->impl = me;
    return MGT_OK;
}

static void mock_event_destroy(mgt_event *e) { event_release(e->impl); }

/* A record refused by enqueue (a failed device) still counts as run. */
static void run_unqueued(const cmd *c)
{
    event_complete(c->u.ev.e, c->u.ev.gen, false);
    event_release(c->u.ev.e);
}

static mgt_status mock_event_record(mgt_event *e, mgt_stream *s)
{
    mock_event *me = e->impl;
    mgt_status st = mock_sticky(me->md);
    if (st != MGT_OK)
        return st;
    cmd c = {.kind = CMD_RECORD};
    pthread_mutex_lock(&me->lock);
    c.u.ev.e = me;
    c.u.ev.gen = ++me->recorded;
    pthread_mutex_unlock(&me->lock);
    atomic_fetch_add(&me->refs, 1);
    st = enqueue(s, &c);
    if (st != MGT_OK) /* never queued: complete it here, so that no waiter hangs on it */
        run_unqueued(&c);
    return st;
}

static mgt_status mock_stream_wait_event(mgt_stream *s, mgt_event *e)
{
    mock_event *me = e->impl;
    pthread_mutex_lock(&me->lock);
    uint64_t gen = me->recorded;
    bool done = event_done(me, gen);
    pthread_mutex_unlock(&me->lock);
    if (gen == 0 || done)
        return mock_sticky(dev_of(s->dev));
    cmd c = {.kind = CMD_WAIT};
    c.u.ev.e = me;
    c.u.ev.gen = gen;
    atomic_fetch_add(&me->refs, 1);
    mgt_status st = enqueue(s, &c);
    if (st != MGT_OK)
        event_release(me);
    return st;
}

static mgt_status mock_event_synchronize(mgt_event *e, const mgt_abort *abort)
{
    mock_event *me = e->impl;
    const double t0 = mgt_time_now();
    pthread_mutex_lock(&me->lock);
    uint64_t gen = me->recorded;
    while (!event_done(me, gen)) {
        if (mgt_abort_is_raised(abort)) {
            pthread_mutex_unlock(&me->lock);
            return mgt_error_set(MGT_ERR_ABORTED, "%s: wait for an event aborted", e->dev->name);
        }
        mgt_status st = past_limit(e->dev, t0, "an event");
        if (st != MGT_OK) {
            pthread_mutex_unlock(&me->lock);
            return st;
        }
        mgt_cond_wait_slice(&me->cv, &me->lock);
    }
    pthread_mutex_unlock(&me->lock);
    return mock_sticky(me->md);
}

static mgt_status mock_event_query(mgt_event *e, bool *done)
{
    mock_event *me = e->impl;
    pthread_mutex_lock(&me->lock);
    *done = event_done(me, me->recorded);
    pthread_mutex_unlock(&me->lock);
    return mock_sticky(me->md);
}

static bool mock_event_outcome(mgt_event *e, bool *clean)
{
    mock_event *me = e->impl;
    pthread_mutex_lock(&me->lock);
    bool known = me->recorded > 0 && event_done(me, me->recorded);
    *clean = known && me->clean_gen >= me->recorded;
    pthread_mutex_unlock(&me->lock);
    return known;
}

static mgt_status mock_event_elapsed_ms(mgt_event *start, mgt_event *end, float *ms)
{
    mock_event *a = start->impl, *b = end->impl;
    pthread_mutex_lock(&a->lock);
    bool a_ok = a->recorded > 0 && event_done(a, a->recorded);
    double ta = a->time;
    pthread_mutex_unlock(&a->lock);
    pthread_mutex_lock(&b->lock);
    bool b_ok = b->recorded > 0 && event_done(b, b->recorded);
    double tb = b->time;
    pthread_mutex_unlock(&b->lock);
    if (!a_ok || !b_ok)
        return mgt_error_set(MGT_ERR_INVALID, "%s: elapsed time of an event that has not run",
                             start->dev->name);
    *ms = (float)((tb - ta) * 1e3);
    return MGT_OK;
}

/* ---- copies and kernels ---- */

static mgt_status mock_memset(mgt_stream *s, void *dst, int value, size_t bytes)
{
    mgt_status st = check_owned(dev_of(s->dev), dst, bytes, "memset", "destination");
    if (st != MGT_OK)
        return st;
    cmd c = {.kind = CMD_MEMSET};
    c.u.set.dst = dst;
    c.u.set.value = value;
    c.u.set.n = bytes;
    return enqueue(s, &c);
}

static mgt_status mock_copy(mgt_stream *s, mgt_copy_kind kind, void *dst, const void *src,
                            size_t bytes)
{
    mock_dev *md = dev_of(s->dev);
    mgt_status st = MGT_OK;
    if (kind == MGT_COPY_H2D || kind == MGT_COPY_D2D)
        st = check_owned(md, dst, bytes, "copy", "destination");
    if (st == MGT_OK && (kind == MGT_COPY_D2H || kind == MGT_COPY_D2D))
        st = check_owned(md, src, bytes, "copy", "source");
    if (st != MGT_OK)
        return st;
    cmd c = {.kind = CMD_COPY};
    c.u.copy.dst = dst;
    c.u.copy.src = src;
    c.u.copy.n = bytes;
    return enqueue(s, &c);
}

static mgt_status mock_copy_peer(mgt_stream *s, void *dst, mgt_device *src_dev, const void *src,
                                 size_t bytes)
{
    mgt_status st = check_owned(dev_of(s->dev), dst, bytes, "peer copy", "destination");
    if (st == MGT_OK)
        st = check_owned(dev_of(src_dev), src, bytes, "peer copy", "source");
    if (st != MGT_OK)
        return st;
    cmd c = {.kind = CMD_COPY};
    c.u.copy.dst = dst;
    c.u.copy.src = src;
    c.u.copy.n = bytes;
    c.u.copy.peer = true;
    c.u.copy.from = dev_of(src_dev);
    return enqueue(s, &c);
}

/* nChw16c between ops where the convolutions run on oneDNN, which wants it: the reorders at
   every convolution's edges go, and batch norm sums a 16-channel block per vector. */
static void mock_op_profile(mgt_device *d, bool on)
{
    mock_dev *md = dev_of(d);
    pthread_mutex_lock(&md->prof_lock);
    if (on) {
        memset(md->op_s, 0, sizeof md->op_s);
        memset(md->op_flops, 0, sizeof md->op_flops);
        memset(md->op_calls, 0, sizeof md->op_calls);
    }
    atomic_store(&md->profiling, on);
    pthread_mutex_unlock(&md->prof_lock);
}

static void mock_op_times(const mgt_device *d, double *seconds, long *calls, double *flops)
{
    mock_dev *md = dev_of(d);
    pthread_mutex_lock(&md->prof_lock);
    memcpy(seconds, md->op_s, sizeof md->op_s);
    memcpy(flops, md->op_flops, sizeof md->op_flops);
    memcpy(calls, md->op_calls, sizeof md->op_calls);
    pthread_mutex_unlock(&md->prof_lock);
}

static mgt_layout mock_act_layout(const mgt_device *d)
{
    const mock_set *ms = d->set->impl;
    return ms->opt.conv_im2col || ms->opt.layout_nchw ? MGT_LAYOUT_NCHW : MGT_LAYOUT_NCHW16C;
}

/* Under --amp the activations are kept in its 16-bit format, as autocast keeps a convolution's
   result: half the bytes of every activation between ops. */
static mgt_precision mock_act_dtype(const mgt_device *d, mgt_precision amp)
{
    (void)d;
    return amp;
}

static bool mock_supports_op(mgt_device *d, const mgt_op *op)
{
    (void)d;
    /* a fused residual add: the nChw16c batch-norm kernels only */
    return cpu_supports(op->kind) && (!mgt_op_bn_residual(op) || mgt_op_blocked(op));
}

static mgt_status mock_launch(mgt_stream *s, const mgt_op *op)
{
    mock_dev *md = dev_of(s->dev);
    mgt_op copy = *op;
    mgt_operand ops[MGT_OP_MAX_OPERANDS];
    int n = mgt_op_operands(&copy, ops);
    for (int i = 0; i < n; i++) {
        size_t bytes = ops[i].count * mgt_dtype_size(ops[i].dtype);
        mgt_status st = check_owned(md, *ops[i].ptr, bytes, mgt_op_name(op->kind), ops[i].name);
        if (st != MGT_OK)
            return st;
    }
    if (md->fault_kind == MGT_FAULT_STUCK &&
        (!md->fault_op[0] || strcmp(mgt_op_name(op->kind), md->fault_op) == 0) &&
        atomic_fetch_add(&md->n_launched, 1) + 1 == md->fault_nth) {
        atomic_fetch_add(&md->stuck_calls, 1);
        /* a host thread stuck in the driver: it comes back only once its device set has been
           freed, as a driver call that finally returns would, and goes on from there: what it
           touches then must still be there (mgt_device_strand) */
        while (!atomic_load(&md->closed))
            usleep(5000);
    }
    cmd c = {.kind = CMD_OP};
    c.u.op = *op;
    return enqueue(s, &c);
}

/* ---- the set ---- */

static int mock_device_count(void) { return MGT_MAX_DEVICES; }

static mgt_status mock_reserve(void *owner, size_t bytes)
{
    return mgt_device_reserve(owner, bytes, "kernel workspace");
}

static void mock_unreserve(void *owner, size_t bytes) { mgt_device_unreserve(owner, bytes); }

static void mock_devset_close(mgt_devset *set);

/* fault=lowp: the refusal of this 16-bit convolution attempt, if the spec names one. */
static mgt_lp_refusal mock_lp_refusal(void *owner)
{
    mock_dev *md = dev_of(owner);
    if (md->fault_kind != MGT_FAULT_LOWP)
        return MGT_LP_REFUSAL_NONE;
    long k = ++md->n_lowp - md->fault_nth;
    return k >= 0 && k < md->nrefusals ? (mgt_lp_refusal)md->refusals[k] : MGT_LP_REFUSAL_NONE;
}

static mgt_status mock_devset_open(mgt_devset *set, const int *ids, const mgt_devset_options *opts)
{
    const mgt_mock_options *opt = opts->mock;
    mock_set *ms = calloc(1, sizeof *ms);
    if (!ms)
        return mgt_error_set(MGT_ERR_OOM, "mock: host memory exhausted");
    ms->opt = *opt;
    set->impl = ms;
    int threads = opt->threads_per_device;
    if (threads <= 0) {
        threads = mgt_cpu_count() / set->n;
        if (threads < 1)
            threads = 1;
    }
    size_t total = opt->mem_limit;
    if (!total)
        total = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
    for (int i = 0; i < set->n; i++) {
        mgt_device *d = &set->devs[i];
        if (ids[i] < 0 || ids[i] >= MGT_MAX_DEVICES) {
            mock_devset_close(set);
            return mgt_error_set(MGT_ERR_INVALID, "mock device id %d: ids run from 0 to %d", ids[i],
                                 MGT_MAX_DEVICES - 1);
        }
        mock_dev *md = calloc(1, sizeof *md);
        if (!md) {
            mock_devset_close(set);
            return mgt_error_set(MGT_ERR_OOM, "mock: host memory exhausted");
        }
        md->dev = d;
        pthread_mutex_init(&md->lock, NULL);
        pthread_mutex_init(&md->prof_lock, NULL);
        d->impl = md;
        snprintf(d->name, sizeof d->name, "mock:%d", ids[i]);
        d->total_mem = total;
        for (int f = 0; f < opt->nfaults; f++) {
            const mgt_mock_fault *ft = &opt->fault[f];
            if (ft->device != ids[i])
                continue;
            md->fault_kind = ft->kind;
            md->fault_nth = ft->nth;
            memcpy(md->fault_op, ft->op, sizeof md->fault_op);
            md->nrefusals = ft->nrefusals;
            memcpy(md->refusals, ft->refusals, sizeof md->refusals);
        }
        md->delay_us = opt->delay_us;
        md->seed = opt->seed;
        md->link_bw = opt->link_bytes_per_s;
        md->link_lat = opt->link_latency_s;
        if (cpu_ctx_init(&md->ctx, threads) != MGT_OK) {
            mock_devset_close(set);
            return mgt_error_set(MGT_ERR_DEVICE, "%s: cannot start %d compute threads", d->name,
                                 threads);
        }
        md->ctx.conv_im2col = opt->conv_im2col;
        md->ctx.reserve = mock_reserve;
        md->ctx.unreserve = mock_unreserve;
        md->ctx.owner = d;
        md->ctx.lp_refusal = mock_lp_refusal;
    }
    return MGT_OK;
}

/* The blocks of devices whose memory was lent to a transfer that cannot be cancelled
   (mgt_device_keep_memory): they outlive their set, held here until the process ends. */
typedef struct mock_kept {
    mock_alloc *allocs;
    int n;
    struct mock_kept *next;
} mock_kept;
static mock_kept *kept_blocks;
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;

static void mock_devset_close(mgt_devset *set)
{
    for (int i = 0; i < set->n; i++) {
        mock_dev *md = set->devs[i].impl;
        if (!md)
            continue;
        if (atomic_load(&set->devs[i].stranded)) { /* a call stuck on it may come back: kept */
            atomic_store(&md->closed, true);
            continue;
        }
        (void)atomic_load(&md->stuck_calls); /* after what a stuck host thread read */
        if (md->ctx.pool)
            cpu_ctx_destroy(&md->ctx);
        mock_kept *k = atomic_load(&set->devs[i].keep_memory) ? malloc(sizeof *k) : NULL;
        if (k) {
            *k = (mock_kept){md->allocs, md->nallocs, NULL};
            pthread_mutex_lock(&kept_lock);
            k->next = kept_blocks;
            kept_blocks = k;
            pthread_mutex_unlock(&kept_lock);
        } else if (!atomic_load(&set->devs[i].keep_memory)) {
            for (int k = 0; k < md->nallocs; k++)
                free(md->allocs[k].p);
            free(md->allocs);
        } /* else no room to hold them: left unreachable, still allocated */
        for (int k = 0; k < md->nhost; k++)
            free(md->host[k]);
        free(md->host);
        pthread_mutex_destroy(&md->lock);
        pthread_mutex_destroy(&md->prof_lock);
        free(md);
        set->devs[i].impl = NULL;
    }
    bool stranded = false;
    for (int i = 0; i < set->n; i++)
        stranded = stranded || atomic_load(&set->devs[i].stranded);
    if (!stranded) { /* else the set's own state is kept with it (mgt_devset_free) */
        free(set->impl);
        set->impl = NULL;
    }
}

static bool mock_can_access_peer(const mgt_devset *set, int i, int j)
{
    const mock_set *ms = set->impl;
    int a = set->devs[i].id, b = set->devs[j].id;
    if (a == b)
        return true;
    switch (ms->opt.peer_mode) {
    case MGT_PEER_ALL: return true;
    case MGT_PEER_NONE: return false;
    case MGT_PEER_LIST: return ms->opt.peer[a][b] != 0;
    }
    return false;
}

static const mgt_backend_i mock_backend = {
    .name = "mock",
    .host_memory = true,
    .device_count = mock_device_count,
    .devset_open = mock_devset_open,
    .devset_close = mock_devset_close,
    .can_access_peer = mock_can_access_peer,
    .alloc = mock_alloc_mem,
    .free = mock_free_mem,
    .retire = mock_retire_mem,
    .host_alloc = mock_host_alloc,
    .host_free = mock_host_free,
    .stream_create = mock_stream_create,
    .stream_destroy = mock_stream_destroy,
    .stream_synchronize = mock_stream_synchronize,
    .device_synchronize = mock_device_synchronize,
    .event_create = mock_event_create,
    .event_destroy = mock_event_destroy,
    .event_record = mock_event_record,
    .stream_wait_event = mock_stream_wait_event,
    .event_synchronize = mock_event_synchronize,
    .event_query = mock_event_query,
    .event_elapsed_ms = mock_event_elapsed_ms,
    .event_outcome = mock_event_outcome,
    .memset = mock_memset,
    .copy = mock_copy,
    .copy_peer = mock_copy_peer,
    .act_layout = mock_act_layout,
    .act_dtype = mock_act_dtype,
    .supports_op = mock_supports_op,
    .launch = mock_launch,
    .counts = mock_counts,
    .abandon = mock_abandon,
    .op_profile = mock_op_profile,
    .op_times = mock_op_times,
    .busy_s = mock_busy_s,
};

const mgt_backend_i *mgt_backend_mock(void) { return &mock_backend; }
