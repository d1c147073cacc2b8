/* The comm module's private parts: a comm's state, shared by the all-reduce inside the node
 * (comm.c) and the exchange of the buckets across nodes (nodes.c), and the helpers both use. */
#ifndef MGT_COMM_IMPL_H
#define MGT_COMM_IMPL_H

#include <pthread.h>

#include "mgt/comm.h"
#include "mgt/thread.h"

typedef struct comm_nodes comm_nodes; /* nodes.c: the exchange across nodes */

struct mgt_comm {
    mgt_devset *set;
    int n;
    mgt_device *devs[MGT_MAX_DEVICES]; /* the n devices it spans: the set's, or a subset */
    float **grads;
    size_t bytes;
    int nb;
    mgt_allreduce_algo algo;
    size_t *begin, *end;            /* [nb] bucket byte ranges */
    mgt_stream **stream;            /* [n] comm streams */
    mgt_stream **send;              /* [n] ring only: the streams a device's sends are ordered on */
    mgt_event **recv_ev, **send_ev; /* [n] ring only: a step's receives done, sends done */
    mgt_buffer **recv;              /* [n] receive buffers, the largest bucket each */
    bool bf16;                      /* grad_dtype bf16: the compressed all-reduce */
    mgt_buffer **g16, **recv16;     /* [n] bf16 only: the arena's bf16 copy; a bucket's receive */
    mgt_event **ready, **done;      /* [n * nb] */
    pthread_mutex_t lock;
    pthread_cond_t cv;
    int *arrived;  /* [nb] devices that marked the bucket in the current step */
    int *next;     /* [n] next bucket each device has yet to mark */
    long *steps;   /* [n] steps each device has ended */
    long enqueued; /* buckets enqueued over all steps */
    /* across nodes (nodes > 1) */
    mgt_world *world;
    mgt_abort *abort;
    int nodes;
    comm_nodes *x;
    /* mgt_comm_bn_gather: a two-phase barrier over the devices of this process */
    pthread_mutex_t bn_lock;
    pthread_cond_t bn_cv;
    const double **bn_src; /* [n] each device's numbers for the gather in progress */
    int bn_in, bn_out;     /* devices arrived in phase 1, left in phase 2 */
    long bn_gen1, bn_gen2;
    /* a comm thread's failure (nodes.c), under lock */
    bool failed;
    mgt_status fail_status;
    char fail_text[512];
};

/* base + byte_off, as floats. */
static inline float *comm_at(float *base, size_t byte_off)
{
    return (float *)((char *)base + byte_off);
}

/* Floats [*lo, *hi) of chunk k when `count` floats are cut into n nearly equal chunks. */
void comm_ring_chunk(size_t count, int n, int k, size_t *lo, size_t *hi);
/* Largest power of two below n (n >= 2). */
int comm_top_level(int n);

/* ---- nodes.c ---- */

/* The exchange's plan, buffers, communicators and threads for c->nodes > 1 (c's buckets,
   streams and events made). */
mgt_status comm_nodes_create(mgt_comm *c, const mgt_comm_config *cfg);
/* Stops the comm threads (before the streams are drained). */
void comm_nodes_stop(mgt_comm *c);
/* Frees what comm_nodes_create made, but the buffers a failed exchange left to MPI. NULL
   c->x is a no-op. */
void comm_nodes_free(mgt_comm *c);
/* The tree over the nodes on n floats of each of `nodes` rows (row r at rows + r * stride), the
   sum into out; the rows are scratch. */
void comm_sum_rows(float *rows, size_t stride, int nodes, size_t n, float *out);
/* Bucket b's way across the nodes, enqueued once every device has marked it ready (their
   ready events already waited for on the comm streams). c->lock held. */
mgt_status comm_nodes_enqueue(mgt_comm *c, int b);

#endif
