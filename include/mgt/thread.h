/* The abort flag every cross-thread wait checks, and thin helpers for abortable waits. */
#ifndef MGT_THREAD_H
#define MGT_THREAD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

/* Raised once by whoever fails first; every wait that is handed it leaves with
   MGT_ERR_ABORTED soon after (within MGT_WAIT_SLICE_MS). Zero-initialise to use. */
typedef struct mgt_abort mgt_abort;
struct mgt_abort {
    atomic_int raised;
};

/* How long a blocked wait sleeps before it looks at its abort flag again. */
#define MGT_WAIT_SLICE_MS 5

static inline void mgt_abort_raise(mgt_abort *a) { atomic_store(&a->raised, 1); }

/* NULL is a flag that is never raised. */
static inline bool mgt_abort_is_raised(const mgt_abort *a)
{
    return a != NULL && atomic_load(&((mgt_abort *)a)->raised) != 0;
}

/* pthread_cond_wait for at most MGT_WAIT_SLICE_MS; callers loop on their predicate and
   on their abort flag around it. */
void mgt_cond_wait_slice(pthread_cond_t *cond, pthread_mutex_t *mutex);

/* The number of online cores, at least 1. */
int mgt_cpu_count(void);

/* Monotonic time in seconds. */
double mgt_time_now(void);

#endif
