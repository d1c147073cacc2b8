/* A persistent pthread pool with a low-overhead parallel-for, one per mock device. */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "device/cpu/kernels.h"

/* How long an idle worker polls for the next parallel-for before it sleeps on the condition
   variable. Kernels of one step follow each other within microseconds, so a short spin saves
   a futex wake per kernel; longer spins would steal cores from the other devices' threads.
   About 20-50 us on current x86. */
#define POOL_SPIN 2000

typedef void (*pool_fn)(void *ctx, int i, int thread);

/* Jobs are published through atomics and every claim of an item is a compare-and-swap on
   `next`, whose high half is the job's generation. A worker that wakes late and reads a job
   that is already over (or half-overwritten by the next one) can therefore never claim an
   item: its CAS fails on the generation. This lets the caller return as soon as every item
   has run, without waiting for sleeping workers to check in. */
struct cpu_pool {
    int threads;
    pthread_t *tids;

    pthread_mutex_t mu;
    pthread_cond_t wake;    /* workers sleep here for a new generation or stop */
    pthread_cond_t done_cv; /* the caller sleeps here for the last item */
    int sleepers;           /* workers blocked on `wake`; under mu */

    atomic_uint gen;
    atomic_bool stop;
    _Atomic uint64_t next; /* gen << 32 | index of the next unclaimed item */
    _Atomic pool_fn fn;
    _Atomic(void *) ctx;
    atomic_int n;
    atomic_int done; /* items of the current job that have finished */
};

typedef struct worker_arg {
    cpu_pool *pool;
    int thread;
} worker_arg;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Claims and runs items of generation g until none is left. */
static void run_items(cpu_pool *p, unsigned g, pool_fn fn, void *ctx, int n, int thread)
{
    uint64_t v = atomic_load(&p->next);
    for (;;) {
        if ((unsigned)(v >> 32) != g || (uint32_t)v >= (uint32_t)n)
            return;
        if (!atomic_compare_exchange_weak(&p->next, &v, v + 1))
            continue;
        fn(ctx, (int)(uint32_t)v, thread);
        if (atomic_fetch_add(&p->done, 1) + 1 == n) {
            /* under mu so that the caller cannot miss it between its check and its wait */
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
            return;
        }
        v = atomic_load(&p->next);
    }
}

static void *worker_main(void *arg)
{
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    cpu_pool *p = wa.pool;
    unsigned seen = 0;
    for (;;) {
        for (int i = 0; i < POOL_SPIN && atomic_load(&p->gen) == seen && !atomic_load(&p->stop);
             i++)
            cpu_relax();
        if (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->mu);
            p->sleepers++;
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->mu);
            p->sleepers--;
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop))
            return NULL;
        /* The loads below may see a later job than `seen`; the generation check in the CAS
           of run_items keeps such a mix from running anything. */
        seen = atomic_load(&p->gen);
        pool_fn fn = atomic_load(&p->fn);
        void *ctx = atomic_load(&p->ctx);
        int n = atomic_load(&p->n);
        run_items(p, seen, fn, ctx, n, wa.thread);
    }
}

static void pool_stop_join(cpu_pool *p, int started)
{
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < started; i++)
        pthread_join(p->tids[i], NULL);
}

mgt_status cpu_pool_create(int threads, cpu_pool **out)
{
    *out = NULL;
    if (threads < 1 || threads > 4096)
        return mgt_error_set(MGT_ERR_INVALID, "cpu pool: %d threads (1..4096)", threads);
    cpu_pool *p = calloc(1, sizeof *p);
    if (p == NULL)
        return mgt_error_set(MGT_ERR_OOM, "cpu pool: out of memory");
    p->threads = threads;
    atomic_init(&p->gen, 0);
    atomic_init(&p->stop, false);
    atomic_init(&p->next, 0);
    atomic_init(&p->fn, NULL);
    atomic_init(&p->ctx, NULL);
    atomic_init(&p->n, 0);
    atomic_init(&p->done, 0);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    mgt_status st = MGT_OK;
    int started = 0;
    if (threads > 1) {
        p->tids = calloc((size_t)threads - 1, sizeof *p->tids);
        if (p->tids == NULL) {
            st = mgt_error_set(MGT_ERR_OOM, "cpu pool: out of memory");
            goto fail;
        }
    }
    for (; started < threads - 1; started++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa == NULL) {
            st = mgt_error_set(MGT_ERR_OOM, "cpu pool: out of memory");
            goto fail;
        }
        wa->pool = p;
        wa->thread = started + 1;
        int rc = pthread_create(&p->tids[started], NULL, worker_main, wa);
        if (rc != 0) {
            free(wa);
            st = mgt_error_set(rc == EAGAIN ? MGT_ERR_OOM : MGT_ERR_DEVICE,
                               "cpu pool: starting thread %d of %d: %s", started + 1, threads,
                               strerror(rc));
            goto fail;
        }
    }
    *out = p;
    return MGT_OK;
fail:
    pool_stop_join(p, started);
    pthread_cond_destroy(&p->done_cv);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    free(p->tids);
    free(p);
    return st;
}

void cpu_pool_free(cpu_pool *p)
{
    if (p == NULL)
        return;
    pool_stop_join(p, p->threads - 1);
    pthread_cond_destroy(&p->done_cv);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    free(p->tids);
    free(p);
}

int cpu_pool_threads(const cpu_pool *p) { return p->threads; }

void cpu_pool_for(cpu_pool *p, int n, void (*fn)(void *ctx, int i, int thread), void *ctx)
{
    if (n <= 0)
        return;
    if (p->threads == 1 || n == 1) {
        for (int i = 0; i < n; i++)
            fn(ctx, i, 0);
        return;
    }
    /* Order matters: `next` carries the new generation before the job's fields change, so a
       late worker holding the old generation fails its CAS whatever fields it reads. */
    unsigned g = atomic_load(&p->gen) + 1;
    atomic_store(&p->next, (uint64_t)g << 32);
    atomic_store(&p->fn, fn);
    atomic_store(&p->ctx, ctx);
    atomic_store(&p->n, n);
    atomic_store(&p->done, 0);
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->gen, g);
    if (p->sleepers > 0)
        pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);

    run_items(p, g, fn, ctx, n, 0);

    for (int i = 0; i < POOL_SPIN && atomic_load(&p->done) != n; i++)
        cpu_relax();
    if (atomic_load(&p->done) != n) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->done) != n)
            pthread_cond_wait(&p->done_cv, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
