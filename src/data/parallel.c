/* The data module's parallel-for (mgt_data_parallel_for in internal.h): a few threads over
   [0, n) in small claimed chunks, the first failure's status and text kept, the abort flag
   honoured; what pack writing and the whole-split passes run on. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "data/internal.h"

typedef struct pfor {
    size_t n, chunk;
    atomic_size_t next;
    atomic_int result;
    const mgt_abort *abort;
    mgt_data_for_fn fn;
    void *ctx;
    char err[512]; /* the failing thread's error text, which is thread-local */
} pfor;

typedef struct pfor_arg {
    pfor *p;
    int worker;
} pfor_arg;

static void *pfor_main(void *arg)
{
    pfor_arg *a = arg;
    pfor *p = a->p;
    for (;;) {
        if (atomic_load(&p->result) != 0)
            break;
        if (mgt_abort_is_raised(p->abort)) {
            int zero = 0;
            atomic_compare_exchange_strong(&p->result, &zero, (int)MGT_ERR_ABORTED);
            break;
        }
        size_t i0 = atomic_fetch_add(&p->next, p->chunk);
        if (i0 >= p->n)
            break;
        size_t i1 = i0 + p->chunk < p->n ? i0 + p->chunk : p->n;
        for (size_t i = i0; i < i1; i++) {
            int r = p->fn(p->ctx, a->worker, i);
            if (r != 0) {
                int zero = 0;
                if (atomic_compare_exchange_strong(&p->result, &zero, r))
                    snprintf(p->err, sizeof p->err, "%s", mgt_error_last());
                return NULL;
            }
        }
    }
    return NULL;
}

int mgt_data_parallel_for(size_t n, int workers, const mgt_abort *abort, mgt_data_for_fn fn,
                          void *ctx)
{
    if (workers < 1)
        workers = 1;
    pfor p = {.n = n, .abort = abort, .fn = fn, .ctx = ctx};
    /* chunks small enough to balance, big enough that the counter is not contended */
    p.chunk = n / ((size_t)workers * 64);
    if (p.chunk < 1)
        p.chunk = 1;
    if (p.chunk > 64)
        p.chunk = 64;
    atomic_init(&p.next, 0);
    atomic_init(&p.result, 0);
    pthread_t *th = calloc((size_t)workers, sizeof *th);
    pfor_arg *args = calloc((size_t)workers, sizeof *args);
    if (!th || !args) {
        free(th);
        free(args);
        return mgt_error_set(MGT_ERR_OOM, "out of memory starting %d threads", workers);
    }
    int started = 0;
    for (int w = 1; w < workers; w++) {
        args[w] = (pfor_arg){&p, w};
        if (pthread_create(&th[w], NULL, pfor_main, &args[w]) != 0)
            break;
        started = w;
    }
    args[0] = (pfor_arg){&p, 0};
    pfor_main(&args[0]);
    for (int w = 1; w <= started; w++)
        pthread_join(th[w], NULL);
    free(th);
    free(args);
    int r = atomic_load(&p.result);
    if (r != 0 && r != MGT_ERR_ABORTED)
        mgt_error_set((mgt_status)r, "%s", p.err);
    return r;
}
