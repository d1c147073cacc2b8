/* Collectives across the devices of one process: broadcast, and the bucketed gradient
 * all-reduce that overlaps backward (a tree over peer copies, adds on the devices); across
 * nodes (a world of several processes, mgt/world.h) the same all-reduce made hierarchical.
 *
 * All work is enqueued on one comm stream per device and ordered by events; host threads
 * block only where a device's work must wait for another thread's enqueue (the end of the
 * step), and those waits take the abort flag.
 */
#ifndef MGT_COMM_H
#define MGT_COMM_H

#include <stddef.h>

#include "mgt/device.h"
#include "mgt/world.h"

typedef struct mgt_comm mgt_comm;

typedef enum mgt_allreduce_algo {
    MGT_ALLREDUCE_TREE, /* reduce up a binary tree, then broadcast the sum back down:
                           2 log2(n) transfers of the whole bucket, few latencies */
    MGT_ALLREDUCE_RING, /* reduce-scatter then all-gather around a ring: 2(n-1) transfers of
                           1/n of the bucket each, so bandwidth-optimal for large buckets */
} mgt_allreduce_algo;

/* "tree" or "ring" */
mgt_status mgt_allreduce_algo_parse(const char *s, mgt_allreduce_algo *out);

/* How device j's shard of a bucket crosses the nodes (a world of N > 1). Both add the N nodes'
   values in the same order (the tree over the nodes: ((n0 + n1) + (n2 + n3)) + ...), so they
   give the same bytes and either may serve any bucket. */
typedef enum mgt_node_exchange {
    MGT_NODE_EXCHANGE_AUTO,           /* per bucket, the one the link model says is faster */
    MGT_NODE_EXCHANGE_ALLGATHER,      /* every node's whole shard gathered by every node and
                                         added there: N - 1 shards in per node, N - 1 latencies */
    MGT_NODE_EXCHANGE_REDUCE_SCATTER, /* the shard cut into N pieces, piece p of every node
                                         sent to node p (all-to-all) and added there, the N sums
                                         all-gathered: 2 (N - 1) / N shards in, as a ring, and
                                         2 (N - 1) latencies */
} mgt_node_exchange;

/* "auto", "allgather" or "reduce-scatter" */
mgt_status mgt_node_exchange_parse(const char *s, mgt_node_exchange *out);
const char *mgt_node_exchange_name(mgt_node_exchange x);

/* One device's link to the other nodes. */
typedef struct mgt_link {
    double bytes_per_s, latency_s;
} mgt_link;

/* The link MGT_NODE_EXCHANGE_AUTO decides on where the run models none (the world's
   --mock xlink): 12.5 GB/s and 10 us, an InfiniBand HDR-class rail. */
mgt_link mgt_comm_assumed_link(void);
/* The chunks a shard of `bytes` is exchanged in over the MPI path, so that the host's additions
   of one chunk overlap the next chunk's transfer: bytes / (nodes x 1 MiB), 1 to 8. */
int mgt_comm_exchange_chunks(int nodes, size_t bytes);
/* The link model's time for exchange x (not AUTO) of a shard of `bytes` among `nodes` nodes:
   each collective of each chunk costs (nodes - 1) latencies, and the bytes a node receives
   pass at the link's bandwidth. */
double mgt_comm_exchange_seconds(mgt_node_exchange x, int nodes, size_t bytes, const mgt_link *l);
/* A ring all-reduce of `bytes` over `nodes` nodes with one such link each: 2 (nodes - 1)
   (latency + bytes / (nodes x bandwidth)), the bound on the bytes a node must receive (at 2
   nodes the all-gather's one latency beats its two). */
double mgt_comm_ring_seconds(int nodes, size_t bytes, const mgt_link *l);
/* The exchange AUTO gives a shard of `bytes`: the faster in the model, the all-gather on a tie
   (2 nodes: the same bytes, half the latencies). */
mgt_node_exchange mgt_comm_exchange_pick(int nodes, size_t bytes, const mgt_link *l);

typedef struct mgt_comm_config {
    /* the gradient arena of each device, `bytes` long, same layout on every device */
    float **grads;
    size_t bytes;
    /* byte offsets where backward completes a layer, increasing, the last == bytes; buckets
       end only at these (a bucket never splits a layer's gradients) */
    const size_t *layer_ends;
    int n_layer_ends;
    size_t bucket_bytes;       /* cap of a bucket (DDP's 25 MiB) */
    size_t first_bucket_bytes; /* cap of the first bucket, small so reduction starts early */
    mgt_allreduce_algo algo;
    /* (optional) the nodes of a multi-node run. With more than one, each bucket is reduced
       hierarchically: a reduce-scatter inside the node over peer copies (device j ends with
       shard j summed over the node's devices), shard j across the nodes on device j's own
       thread and communicator (node_exchange: all-gathered, or reduce-scattered and
       all-gathered; on the host through pinned memory, or on the device where the backend has a
       collective of its own), then an all-gather inside the node. Every element is the node
       tree's sum (in node order) of the node sums (each the tree over the node's L devices),
       whichever exchange, so a run's bytes do not depend on it. Where L is a power of two this
       is the order of the single-process tree over all N x L devices, so N nodes x L devices
       give the bytes of one process with N x L (any N: 3 x 1 = 1 x 3, 3 x 2 = 1 x 6, 4 x 1 =
       2 x 2 = 1 x 4). Where it is not, the single-process tree pairs devices across node
       boundaries (1 x 6 adds (d0 + d1) + (d2 + d3) first; 2 x 3 adds (d0 + d1) + d2), so N x L
       equals only N x L: the same bytes on every run and every replica, whichever exchange. */
    mgt_world *world;
    mgt_abort *abort; /* with world: raised when a cross-node exchange fails */
    /* with world: how shards cross the nodes (AUTO, the default: per bucket, on the world's
       link model or mgt_comm_assumed_link; node 0's choice holds for every node) */
    mgt_node_exchange node_exchange;
    /* MGT_PREC_F32 (0, the default) or MGT_PREC_BF16: the compressed all-reduce of DDP's
       bf16_compress_hook. Each device's bucket is rounded to bf16 (nearest even) and only
       bf16 values cross between devices (half the bytes); every addition is made in fp32 from
       two bf16 values and rounded back to bf16 before it is sent on or kept, as NCCL's bf16 sum
       does; every device ends with the same bf16 sum, decoded into its fp32 gradients. One node
       only (refused with a world of more than one process). */
    mgt_precision grad_dtype;
    /* (optional) the devices of the set it spans, in rank order (all n_devices of the set's):
       the survivors of a lost device re-form the tree and the ring over themselves. NULL:
       every device of the set. Rank i of every call below is devices[i]. */
    mgt_device *const *devices;
    int n_devices;
} mgt_comm_config;

/* The buckets cfg's layer ends and caps make (as mgt_comm_create cuts them): ends[i] gets bucket
   i's end (cap cfg->n_layer_ends), *n the count. MGT_ERR_INVALID for a bad layer list. */
mgt_status mgt_comm_plan_buckets(const mgt_comm_config *cfg, size_t *ends, int *n);

/* Creates one comm stream, a receive buffer and events per device it spans. */
mgt_status mgt_comm_create(mgt_devset *set, const mgt_comm_config *cfg, mgt_comm **out);
void mgt_comm_free(mgt_comm *c); /* NULL is a no-op */

int mgt_comm_bucket_count(const mgt_comm *c);
/* Bytes [*begin, *end) of the gradient arena that bucket b covers. */
void mgt_comm_bucket_range(const mgt_comm *c, int b, size_t *begin, size_t *end);

/* Starts a step's all-reduce; every device's thread calls it before its first
   mgt_comm_grads_ready of the step. */
mgt_status mgt_comm_step_begin(mgt_comm *c, int dev);

/* Device `dev`'s backward has enqueued, on `compute`, every gradient below byte `done` of the
   arena. Each bucket this completes is marked ready on the device; the thread that marks a
   bucket ready last enqueues that bucket's reduction on every device's comm stream, so the
   sum runs while backward goes on. */
mgt_status mgt_comm_grads_ready(mgt_comm *c, int dev, mgt_stream *compute, size_t done);

/* Makes `compute` wait until every bucket's sum has arrived on device `dev`. Blocks the host
   until every device has marked every bucket ready (so the events exist), abortably. After
   this the device's gradient arena holds the sum over devices (not the mean). */
mgt_status mgt_comm_step_end(mgt_comm *c, int dev, mgt_stream *compute, const mgt_abort *abort);

/* With nodes > 1, one line saying how the buckets cross the nodes and why (the exchange each
   got, on which link model); "" with one node. Borrowed. */
const char *mgt_comm_exchange_line(const mgt_comm *c);

/* A comm thread's failure, if one has had one (the exchange with the other nodes): its status,
   with its text set as this thread's error; MGT_OK when none. It raises the run's abort flag
   itself, so a caller woken by the flag asks here for the cause. */
mgt_status mgt_comm_error(mgt_comm *c);

/* Synchronised batch norm's exchange: every device's thread calls it with its own `n`
   numbers; `all` receives every device's, in device order ([dev * n]), so each replica merges
   the same values in the same order. Blocks until every device has called it, abortably.
   One node only for now (MGT_ERR_UNSUPPORTED with nodes > 1). */
mgt_status mgt_comm_bn_gather(mgt_comm *c, int dev, const double *mine, double *all, size_t n,
                              const mgt_abort *abort);

/* Copies `bytes` at bufs[root] to bufs[i] for every other device, down the tree, after the
   work enqueued so far on each streams[i]; later work on streams[i] follows it. Called from
   one thread. */
mgt_status mgt_comm_broadcast(mgt_comm *c, mgt_stream **streams, float **bufs, size_t bytes,
                              int root);

#endif
