/* The exchange of gradient buckets across the nodes of a multi-node run (mgt_comm_config.world).
 *
 * Inside the node a bucket is first reduce-scattered over peer copies, so that device j holds
 * shard j summed over the node's devices (each addition the one the single-process tree makes,
 * placed where one of its two partial sums lives). Device j then exchanges shard j with device j
 * of every other node, on its own communicator and link (mgt_world_channels); the thread that
 * lands a bucket's last shard enqueues the all-gather inside the node.
 *
 * Two exchanges add the nodes' shards in the same order (the tree over the nodes), so they give
 * the same bytes and are picked per bucket (mgt_comm_exchange_pick, or --node-exchange):
 *  - all-gather: every node gathers every node's shard and adds the N; a node receives N - 1
 *    shards, in one collective: the cheaper for two nodes and for small shards;
 *  - reduce-scatter + all-gather: the shard is cut into N pieces, piece p of every node goes to
 *    node p (all-to-all), which adds the N in node order, and the N sums are all-gathered; a
 *    node receives 2 (N - 1) / N shards, what a ring all-reduce does, so the time per byte stays
 *    flat as nodes are added (the all-gather's grows with N).
 *
 * Over MPI (mock devices; CUDA without NCCL) device j's comm thread runs the chunks of its
 * shard as a pipeline: the next chunk's first collective travels while this chunk is added on
 * the host, and each chunk's sum is in place as soon as it is gathered. Where device memory is
 * host memory (mock devices) MPI reads and writes the shard where it lies, as a GPU's would
 * over GPUDirect, and the host adds into it; elsewhere each chunk is copied to pinned host
 * memory on device j's comm stream and its sum copied back. The comm threads keep MPI off the
 * worker threads and from under the lock. Where the backend has its own collective across
 * processes (NCCL on CUDA: mgt_xcomm), the exchange is enqueued on device j's comm stream
 * instead: the same collectives in device memory and the same additions as device kernels, with
 * no host staging and no comm thread.
 *
 * Everything a device does is a function of (bucket, device j, this node's rank, the node
 * count): a tree re-formed over surviving devices changes those, not the shape of this code.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"

/* How bucket b crosses the nodes. */
struct xbucket {
    mgt_node_exchange kind; /* ALLGATHER or REDUCE_SCATTER */
    int chunks;             /* the pipeline's chunks of a shard (1 on the backend's collective) */
    size_t stage_off;       /* floats: where its shard lies in a device's staging */
    size_t first_chunk;     /* its chunk 0 among all buckets' chunks (the staged events) */
};

/* A device's comm thread: the buckets it has yet to exchange. */
struct comm_thread {
    mgt_comm *c;
    int dev;
    pthread_t thread;
    bool started;
    int *queue; /* [nb] a ring */
    int head, count;
    size_t *counts, *displs; /* [nodes] a collective's pieces */
};

struct comm_nodes {
    int rank;                /* this node */
    struct xbucket *xb;      /* [nb] */
    size_t chunks;           /* all buckets' chunks */
    bool direct;             /* MPI works in device memory (host memory): no staging */
    float **stage;           /* [n] pinned: the shards, then their sums, a region per bucket */
    float **slot;            /* [n] what a chunk's first collective brings, slots of slot_floats */
    size_t slot_floats;      /* the largest chunk's: N pieces, or N whole chunks */
    mgt_event **staged;      /* [n * chunks] a chunk is on the host */
    bool *lost;              /* [n] a failed exchange left the device's buffers to MPI */
    int *landed;             /* [nb] shards back from the other nodes */
    struct comm_thread *thr; /* [n] */
    bool quit;               /* under c->lock */
    mgt_xcomm **xc;          /* [n] with a backend collective: device j's communicator */
    mgt_buffer **xbuf;       /* [n] on the device: every node's piece or shard */
    mgt_buffer **xsum;       /* [n] on the device: the all-gathered sums of the pieces */
    size_t *counts, *displs; /* [nodes] the device path's pieces (enqueued under c->lock) */
    char line[640];          /* mgt_comm_exchange_line */
};

/* ---- the model and the choice (public) ---- */

mgt_status mgt_node_exchange_parse(const char *s, mgt_node_exchange *out)
{
    if (strcmp(s, "auto") == 0)
        *out = MGT_NODE_EXCHANGE_AUTO;
    else if (strcmp(s, "allgather") == 0)
        *out = MGT_NODE_EXCHANGE_ALLGATHER;
    else if (strcmp(s, "reduce-scatter") == 0)
        *out = MGT_NODE_EXCHANGE_REDUCE_SCATTER;
    else
        return mgt_error_set(MGT_ERR_INVALID,
                             "--node-exchange '%s': expected auto, allgather or reduce-scatter", s);
    return MGT_OK;
}

const char *mgt_node_exchange_name(mgt_node_exchange x)
{
    switch (x) {
    case MGT_NODE_EXCHANGE_ALLGATHER: return "allgather";
    case MGT_NODE_EXCHANGE_REDUCE_SCATTER: return "reduce-scatter";
    default: return "auto";
    }
}

mgt_link mgt_comm_assumed_link(void) { return (mgt_link){12.5e9, 10e-6}; }

int mgt_comm_exchange_chunks(int nodes, size_t bytes)
{
    /* pieces of at least 1 MiB a node, so that the chunks' extra latencies stay small */
    size_t k = bytes / ((size_t)(nodes > 1 ? nodes : 1) << 20);
    return k < 1 ? 1 : k > 8 ? 8 : (int)k;
}

double mgt_comm_exchange_seconds(mgt_node_exchange x, int nodes, size_t bytes, const mgt_link *l)
{
    if (nodes < 2 || bytes == 0)
        return 0;
    double k = mgt_comm_exchange_chunks(nodes, bytes), n1 = nodes - 1;
    if (x == MGT_NODE_EXCHANGE_REDUCE_SCATTER)
        return 2 * k * n1 * l->latency_s + 2 * n1 * ((double)bytes / nodes) / l->bytes_per_s;
    return k * n1 * l->latency_s + n1 * (double)bytes / l->bytes_per_s;
}

double mgt_comm_ring_seconds(int nodes, size_t bytes, const mgt_link *l)
{
    if (nodes < 2 || bytes == 0)
        return 0;
    return 2.0 * (nodes - 1) * (l->latency_s + (double)bytes / nodes / l->bytes_per_s);
}

mgt_node_exchange mgt_comm_exchange_pick(int nodes, size_t bytes, const mgt_link *l)
{
    return mgt_comm_exchange_seconds(MGT_NODE_EXCHANGE_REDUCE_SCATTER, nodes, bytes, l) <
                   mgt_comm_exchange_seconds(MGT_NODE_EXCHANGE_ALLGATHER, nodes, bytes, l)
               ? MGT_NODE_EXCHANGE_REDUCE_SCATTER
               : MGT_NODE_EXCHANGE_ALLGATHER;
}

const char *mgt_comm_exchange_line(const mgt_comm *c) { return c->x ? c->x->line : ""; }

/* ---- geometry ---- */

/* Floats [*lo, *hi) of bucket b that device j exchanges with the other nodes. */
static void shard_range(const mgt_comm *c, int b, int j, size_t *lo, size_t *hi)
{
    comm_ring_chunk((c->end[b] - c->begin[b]) / sizeof(float), c->n, j, lo, hi);
}

/* Chunk k of bucket b's shard on device j: len floats at `bucket` floats into the bucket and
   `stage` into the staging, cut into pieces of q floats (the last ones shorter or empty):
   piece p is node p's to add. */
typedef struct xchunk {
    size_t bucket, stage, len, q;
} xchunk;

static xchunk chunk_of(const mgt_comm *c, int b, int j, int k)
{
    size_t slo, shi, lo, hi, nodes = (size_t)c->nodes;
    shard_range(c, b, j, &slo, &shi);
    comm_ring_chunk(shi - slo, c->x->xb[b].chunks, k, &lo, &hi);
    size_t len = hi - lo;
    return (xchunk){slo + lo, c->x->xb[b].stage_off + lo, len, (len + nodes - 1) / nodes};
}

/* Where the host and MPI see chunk ch of bucket b on device j: in place, or its staging. */
static float *chunk_host(const mgt_comm *c, int j, int b, const xchunk *ch)
{
    if (c->x->direct)
        return comm_at(c->grads[j], c->begin[b] + ch->bucket * sizeof(float));
    return c->x->stage[j] + ch->stage;
}

static size_t piece_len(const xchunk *ch, int p)
{
    size_t a = (size_t)p * ch->q;
    return a >= ch->len ? 0 : ch->len - a < ch->q ? ch->len - a : ch->q;
}

/* Floats of the largest shard of bucket b (device 0's). */
static size_t shard_floats(const mgt_comm *c, int b)
{
    size_t lo, hi;
    shard_range(c, b, 0, &lo, &hi);
    return hi - lo;
}

/* ---- the additions on the host ---- */

static void add_into(float *restrict x, const float *restrict y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] += y[i];
}

static void add_to(float *restrict out, const float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = x[i] + y[i];
}

/* Every element gets the additions of mgt_comm's tree (((r0 + r1) + (r2 + r3)) + ...), done a
   block at a time through all levels so that the block's rows stay in the cache: one pass over
   memory, not log2(N). */
void comm_sum_rows(float *rows, size_t stride, int nodes, size_t n, float *out)
{
    enum { BLOCK = 2048 };
    int top = comm_top_level(nodes);
    for (size_t i0 = 0; i0 < n; i0 += BLOCK) {
        size_t m = n - i0 < BLOCK ? n - i0 : BLOCK;
        for (int k = 1; k < top; k *= 2)
            for (int r = 0; r + k < nodes; r += 2 * k)
                add_into(rows + (size_t)r * stride + i0, rows + (size_t)(r + k) * stride + i0, m);
        add_to(out + i0, rows + i0, rows + (size_t)top * stride + i0, m); /* the last level */
    }
}

/* ---- inside the node ---- */

/* The device holding the partial sum of devices [lo, hi) for shard j: j itself where it is
   in the group, else the group's first. */
static int holder(int lo, int hi, int j) { return j >= lo && j < hi ? j : lo; }

/* Shard j (floats [lo, hi) of the bucket at byte off) summed onto device j: the tree's
   additions, level by level, each made where one of its two partial sums lives (a + b is
   b + a to the bit), so the sum is the tree's over the node's devices. */
static mgt_status reduce_shard(mgt_comm *c, size_t off, int j, size_t lo, size_t hi)
{
    size_t o = off + lo * sizeof(float), len = (hi - lo) * sizeof(float);
    mgt_status st = MGT_OK;
    for (int k = 1; k < c->n && st == MGT_OK; k *= 2)
        for (int r = 0; r + k < c->n && st == MGT_OK; r += 2 * k) {
            int rend = r + 2 * k < c->n ? r + 2 * k : c->n;
            int hl = holder(r, r + k, j), hr = holder(r + k, rend, j);
            int dst = (j >= r + k && j < rend) ? hr : hl, src = dst == hl ? hr : hl;
            float *recv = mgt_buffer_ptr(c->recv[dst]);
            st =
                mgt_copy_peer(c->stream[dst], recv, c->stream[src], comm_at(c->grads[src], o), len);
            if (st == MGT_OK)
                st = mgt_axpy(c->stream[dst], comm_at(c->grads[dst], o), 1.0f, recv, hi - lo);
        }
    return st;
}

/* Shard j from device j to every other device of the node, down a tree rooted at j. */
static mgt_status gather_shard(mgt_comm *c, size_t off, int j, size_t lo, size_t hi)
{
    size_t o = off + lo * sizeof(float), len = (hi - lo) * sizeof(float);
    mgt_status st = MGT_OK;
    for (int k = comm_top_level(c->n); k >= 1 && st == MGT_OK; k /= 2)
        for (int v = 0; v + k < c->n && st == MGT_OK; v += 2 * k) {
            int from = (v + j) % c->n, to = (v + k + j) % c->n;
            st = mgt_copy_peer(c->stream[to], comm_at(c->grads[to], o), c->stream[from],
                               comm_at(c->grads[from], o), len);
        }
    return st;
}

/* The end of bucket b once every shard is back: the all-gather inside the node and the
   bucket's done events. c->lock held. */
static mgt_status enqueue_end(mgt_comm *c, int b)
{
    size_t off = c->begin[b], nb = (size_t)c->nb;
    mgt_status st = MGT_OK;
    for (int j = 0; j < c->n && st == MGT_OK && c->n > 1; j++) {
        size_t lo, hi;
        shard_range(c, b, j, &lo, &hi);
        if (hi > lo)
            st = gather_shard(c, off, j, lo, hi);
    }
    for (int i = 0; i < c->n && st == MGT_OK; i++)
        st = mgt_event_record(c->done[(size_t)i * nb + (size_t)b], c->stream[i]);
    c->enqueued++;
    pthread_cond_broadcast(&c->cv);
    return st;
}

/* ---- on the backend's collective (NCCL) ---- */

/* The tree over the nodes on the device: rows of n floats `stride` apart, the sum into row 0. */
static mgt_status device_sum(mgt_stream *s, float *rows, size_t stride, int nodes, size_t n)
{
    mgt_status st = MGT_OK;
    for (int k = 1; k < nodes && st == MGT_OK; k *= 2)
        for (int r = 0; r + k < nodes && st == MGT_OK; r += 2 * k)
            st = mgt_axpy(s, rows + (size_t)r * stride, 1.0f, rows + (size_t)(r + k) * stride, n);
    return st;
}

/* Bucket b across the nodes on the backend's collective, enqueued on the comm streams right
   after the reduce-scatter inside the node. c->lock held. */
static mgt_status enqueue_device(mgt_comm *c, int b)
{
    comm_nodes *x = c->x;
    mgt_status st = MGT_OK;
    for (int j = 0; j < c->n && st == MGT_OK; j++) {
        xchunk ch = chunk_of(c, b, j, 0); /* one chunk: NCCL pipelines by itself */
        if (ch.len == 0)
            continue;
        float *g = comm_at(c->grads[j], c->begin[b] + ch.bucket * sizeof(float));
        float *rows = mgt_buffer_ptr(x->xbuf[j]);
        mgt_stream *s = c->stream[j];
        if (x->xb[b].kind == MGT_NODE_EXCHANGE_ALLGATHER) {
            st = mgt_xcomm_allgather(x->xc[j], s, g, rows, ch.len);
            if (st == MGT_OK)
                st = device_sum(s, rows, ch.len, c->nodes, ch.len);
            if (st == MGT_OK)
                st = mgt_copy_d2d(s, g, rows, ch.len * sizeof(float));
            continue;
        }
        /* rows ch.q apart, so that row 0's sum goes out as NCCL's all-gather wants: q floats
           from every node (the last pieces' tails are padding), the shard in order at the front
           of what comes back */
        for (int p = 0; p < c->nodes; p++) {
            x->counts[p] = piece_len(&ch, p);
            x->displs[p] = (size_t)p * ch.q;
        }
        size_t mine = piece_len(&ch, x->rank);
        float *sums = mgt_buffer_ptr(x->xsum[j]);
        st = mgt_xcomm_alltoall(x->xc[j], s, g, x->counts, x->displs, rows, mine, ch.q);
        if (st == MGT_OK && mine > 0)
            st = device_sum(s, rows, ch.q, c->nodes, mine);
        if (st == MGT_OK)
            st = mgt_xcomm_allgather(x->xc[j], s, rows, sums, ch.q);
        if (st == MGT_OK)
            st = mgt_copy_d2d(s, g, sums, ch.len * sizeof(float));
    }
    return st == MGT_OK ? enqueue_end(c, b) : st;
}

/* ---- over MPI, on the comm threads ---- */

/* Chunk k's first collective, into receive slot k % 2 once the chunk is on the host: the
   all-to-all of its pieces (reduce-scatter) or the all-gather of it. */
static mgt_status start_first(mgt_comm *c, struct comm_thread *t, int b, int k, int *op)
{
    comm_nodes *x = c->x;
    int j = t->dev;
    xchunk ch = chunk_of(c, b, j, k);
    float *mine = chunk_host(c, j, b, &ch);
    float *recv = x->slot[j] + (size_t)(k % 2) * x->slot_floats;
    mgt_status st = mgt_event_synchronize(
        x->staged[(size_t)j * x->chunks + x->xb[b].first_chunk + (size_t)k], c->abort);
    if (st != MGT_OK)
        return st;
    bool rs = x->xb[b].kind == MGT_NODE_EXCHANGE_REDUCE_SCATTER;
    for (int p = 0; p < c->nodes; p++) {
        t->counts[p] = (rs ? piece_len(&ch, p) : ch.len) * sizeof(float);
        t->displs[p] = (size_t)p * (rs ? ch.q : ch.len) * sizeof(float);
    }
    if (rs)
        return mgt_world_chan_alltoall(c->world, j, mine, t->counts, t->displs, recv,
                                       t->counts[x->rank], op);
    return mgt_world_chan_allgather(c->world, j, mine, recv, t->counts, t->displs, op);
}

/* Chunk k's nodes added in node order: its piece's sum into its place in the chunk
   (reduce-scatter), or the whole chunk's. */
static void sum_chunk(mgt_comm *c, int j, int b, int k)
{
    comm_nodes *x = c->x;
    xchunk ch = chunk_of(c, b, j, k);
    float *rows = x->slot[j] + (size_t)(k % 2) * x->slot_floats;
    float *out = chunk_host(c, j, b, &ch);
    if (x->xb[b].kind == MGT_NODE_EXCHANGE_REDUCE_SCATTER) {
        size_t n = piece_len(&ch, x->rank);
        if (n > 0)
            comm_sum_rows(rows, n, c->nodes, n, out + (size_t)x->rank * ch.q);
    } else {
        comm_sum_rows(rows, ch.len, c->nodes, ch.len, out);
    }
}

/* Reduce-scatter: chunk k's sums gathered from their nodes, in place. */
static mgt_status start_gather(mgt_comm *c, struct comm_thread *t, int b, int k, int *op)
{
    xchunk ch = chunk_of(c, b, t->dev, k);
    for (int p = 0; p < c->nodes; p++) {
        t->counts[p] = piece_len(&ch, p) * sizeof(float);
        t->displs[p] = (size_t)p * ch.q * sizeof(float);
    }
    return mgt_world_chan_allgather(c->world, t->dev, NULL, chunk_host(c, t->dev, b, &ch),
                                    t->counts, t->displs, op);
}

/* Chunk k's sum back to device j, on its comm stream (in place already where MPI works in
   device memory). */
static mgt_status land(mgt_comm *c, int j, int b, int k)
{
    if (c->x->direct)
        return MGT_OK;
    xchunk ch = chunk_of(c, b, j, k);
    pthread_mutex_lock(&c->lock);
    mgt_status st =
        mgt_copy_h2d(c->stream[j], comm_at(c->grads[j], c->begin[b] + ch.bucket * sizeof(float)),
                     c->x->stage[j] + ch.stage, ch.len * sizeof(float));
    pthread_mutex_unlock(&c->lock);
    return st;
}

/* Device j's shard of bucket b across the nodes, a pipeline over its chunks. On the link, in
   order: first(0), first(1), gather(0), first(2), gather(1), ...: two chunks' first
   collectives are in flight before chunk k is added, and chunk k's gather queues behind them,
   so the link has the next transfer queued while the host adds and while this thread waits to
   be scheduled again after a wait (on a loaded machine, milliseconds a chunk). Chunk k + 2's
   first collective reuses chunk k's receive slot once chunk k is added. At most four
   operations are in flight (MGT_WORLD_CHAN_OPS). */
static mgt_status exchange(mgt_comm *c, struct comm_thread *t, int b)
{
    int j = t->dev, chunks = c->x->xb[b].chunks;
    bool rs = c->x->xb[b].kind == MGT_NODE_EXCHANGE_REDUCE_SCATTER;
    int first[2], gather = -1, prev = -1;
    mgt_status st = start_first(c, t, b, 0, &first[0]);
    if (st == MGT_OK && chunks > 1)
        st = start_first(c, t, b, 1, &first[1]);
    for (int k = 0; k < chunks && st == MGT_OK; k++) {
        st = mgt_world_chan_wait(c->world, j, first[k % 2], c->abort);
        if (st != MGT_OK)
            break;
        sum_chunk(c, j, b, k);
        if (rs) {
            prev = gather;
            st = start_gather(c, t, b, k, &gather);
        }
        if (st == MGT_OK && k + 2 < chunks)
            st = start_first(c, t, b, k + 2, &first[k % 2]);
        if (st == MGT_OK && !rs)
            st = land(c, j, b, k);
        if (st == MGT_OK && rs && k > 0)
            st = mgt_world_chan_wait(c->world, j, prev, c->abort);
        if (st == MGT_OK && rs && k > 0)
            st = land(c, j, b, k - 1);
    }
    if (st == MGT_OK && rs)
        st = mgt_world_chan_wait(c->world, j, gather, c->abort);
    if (st == MGT_OK && rs)
        st = land(c, j, b, chunks - 1);
    return st;
}

/* A comm thread's failure: the first one's text is kept and the run's abort flag raised, so
   the workers' waits end and mgt_comm_step_end reports it. */
static void comm_fail(mgt_comm *c, mgt_status st)
{
    pthread_mutex_lock(&c->lock);
    if (!c->failed) {
        c->failed = true;
        c->fail_status = st;
        snprintf(c->fail_text, sizeof c->fail_text, "%s", mgt_error_last());
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->lock);
    if (c->abort)
        mgt_abort_raise(c->abort);
}

/* Device dev's exchange of its shards with the other nodes, bucket after bucket. */
static void *comm_thread_main(void *arg)
{
    struct comm_thread *t = arg;
    mgt_comm *c = t->c;
    comm_nodes *x = c->x;
    for (;;) {
        pthread_mutex_lock(&c->lock);
        while (t->count == 0 && !x->quit && !c->failed)
            mgt_cond_wait_slice(&c->cv, &c->lock);
        if (x->quit || c->failed) {
            pthread_mutex_unlock(&c->lock);
            return NULL;
        }
        int b = t->queue[t->head];
        t->head = (t->head + 1) % c->nb;
        t->count--;
        pthread_mutex_unlock(&c->lock);
        /* device j's shard is as long on every node: an empty one is exchanged by none */
        size_t lo, hi;
        shard_range(c, b, t->dev, &lo, &hi);
        mgt_status st = hi > lo ? exchange(c, t, b) : MGT_OK;
        if (st != MGT_OK) {
            /* MPI may still use the slots, and the staging or the device's own memory */
            x->lost[t->dev] = true;
            if (x->direct)
                mgt_device_keep_memory(c->devs[t->dev]);
            comm_fail(c, mgt_error_wrap(st,
                                        "device %d: the exchange of bucket %d with the "
                                        "other nodes",
                                        t->dev, b));
            return NULL;
        }
        pthread_mutex_lock(&c->lock);
        if (++x->landed[b] == c->n) {
            x->landed[b] = 0;
            st = enqueue_end(c, b);
        }
        pthread_mutex_unlock(&c->lock);
        if (st != MGT_OK) {
            comm_fail(
                c, mgt_error_wrap(st, "device %d: bucket %d back from the other nodes", t->dev, b));
            return NULL;
        }
    }
}

mgt_status comm_nodes_enqueue(mgt_comm *c, int b)
{
    comm_nodes *x = c->x;
    size_t off = c->begin[b];
    mgt_status st = MGT_OK;
    for (int j = 0; j < c->n && st == MGT_OK; j++) {
        size_t lo, hi;
        shard_range(c, b, j, &lo, &hi);
        if (hi > lo && c->n > 1)
            st = reduce_shard(c, off, j, lo, hi);
        /* the comm thread waits for each chunk's event: the device's last write to it done, and
           a copy of it on the host where it needs one */
        for (int k = 0; !x->xc && k < x->xb[b].chunks && st == MGT_OK; k++) {
            xchunk ch = chunk_of(c, b, j, k);
            if (ch.len > 0 && !x->direct)
                st = mgt_copy_d2h(c->stream[j], x->stage[j] + ch.stage,
                                  comm_at(c->grads[j], off + ch.bucket * sizeof(float)),
                                  ch.len * sizeof(float));
            if (st == MGT_OK)
                st = mgt_event_record(
                    x->staged[(size_t)j * x->chunks + x->xb[b].first_chunk + (size_t)k],
                    c->stream[j]);
        }
    }
    if (st != MGT_OK || x->xc)
        return st == MGT_OK ? enqueue_device(c, b) : st;
    for (int j = 0; j < c->n; j++) {
        struct comm_thread *t = &x->thr[j];
        t->queue[(t->head + t->count) % c->nb] = b;
        t->count++;
    }
    pthread_cond_broadcast(&c->cv);
    return MGT_OK;
}

/* ---- making and freeing ---- */

/* The backend's communicators (one per device, across the nodes: the id from node 0 through
   the world) and the device buffers of the exchange. */
static mgt_status make_device(mgt_comm *c)
{
    comm_nodes *x = c->x;
    size_t rows = 0, sums = 0, nodes = (size_t)c->nodes;
    for (int b = 0; b < c->nb; b++) {
        xchunk ch = chunk_of(c, b, 0, 0);
        bool rs = x->xb[b].kind == MGT_NODE_EXCHANGE_REDUCE_SCATTER;
        size_t r = nodes * (rs ? ch.q : ch.len), s = rs ? nodes * ch.q : 0;
        rows = r > rows ? r : rows;
        sums = s > sums ? s : sums;
    }
    x->xc = calloc((size_t)c->n, sizeof *x->xc);
    x->xbuf = calloc((size_t)c->n, sizeof *x->xbuf);
    x->xsum = calloc((size_t)c->n, sizeof *x->xsum);
    if (!x->xc || !x->xbuf || !x->xsum)
        return mgt_error_set(MGT_ERR_OOM, "comm: host memory exhausted");
    mgt_status st = MGT_OK;
    for (int j = 0; j < c->n && st == MGT_OK; j++) {
        mgt_device *d = c->devs[j];
        unsigned char id[MGT_XCOMM_ID_MAX + sizeof(uint64_t)];
        uint64_t len = 0;
        size_t l = 0;
        if (x->rank == 0) {
            st = mgt_xcomm_id(c->set, id + sizeof len, &l);
            len = l;
        }
        memcpy(id, &len, sizeof len);
        /* node 0's failure to make an id reaches the others as its failure line */
        if (st == MGT_OK)
            st = mgt_world_bcast(c->world, id, sizeof id, 0, c->abort);
        memcpy(&len, id, sizeof len);
        if (st == MGT_OK)
            st = mgt_xcomm_create(d, id + sizeof len, (size_t)len, c->nodes, x->rank, &x->xc[j]);
        if (st == MGT_OK)
            st = mgt_buffer_alloc(d, (rows ? rows : 1) * sizeof(float), &x->xbuf[j]);
        if (st == MGT_OK && sums)
            st = mgt_buffer_alloc(d, sums * sizeof(float), &x->xsum[j]);
    }
    return st;
}

/* The staging, slots, events and comm threads of the MPI path. */
static mgt_status make_host(mgt_comm *c)
{
    comm_nodes *x = c->x;
    size_t n = (size_t)c->n, stage = 0, nodes = (size_t)c->nodes;
    int slots = 1;
    for (int b = 0; b < c->nb; b++) {
        stage += shard_floats(c, b);
        for (int k = 0; k < x->xb[b].chunks; k++) {
            xchunk ch = chunk_of(c, b, 0, k);
            size_t f = nodes * (x->xb[b].kind == MGT_NODE_EXCHANGE_REDUCE_SCATTER ? ch.q : ch.len);
            x->slot_floats = f > x->slot_floats ? f : x->slot_floats;
        }
        slots = x->xb[b].chunks > 1 ? 2 : slots;
    }
    x->staged = calloc(n * x->chunks, sizeof *x->staged);
    x->thr = calloc(n, sizeof *x->thr);
    if (!x->staged || !x->thr)
        return mgt_error_set(MGT_ERR_OOM, "comm: host memory exhausted");
    mgt_status st = mgt_world_channels(c->world, c->n);
    for (int i = 0; i < c->n && st == MGT_OK; i++) {
        mgt_device *d = c->devs[i];
        if (!x->direct)
            st = mgt_host_alloc(d, (stage ? stage : 1) * sizeof(float), (void **)&x->stage[i]);
        /* written by MPI and read by the host alone: not pinned */
        x->slot[i] = malloc((x->slot_floats ? x->slot_floats : 1) * (size_t)slots * sizeof(float));
        if (st == MGT_OK && !x->slot[i])
            st = mgt_error_set(MGT_ERR_OOM, "comm: host memory exhausted");
        for (size_t k = 0; k < x->chunks && st == MGT_OK; k++)
            st = mgt_event_create(d, &x->staged[(size_t)i * x->chunks + k]);
        struct comm_thread *t = &x->thr[i];
        t->c = c;
        t->dev = i;
        t->queue = calloc((size_t)c->nb, sizeof(int));
        t->counts = calloc(nodes, sizeof(size_t));
        t->displs = calloc(nodes, sizeof(size_t));
        if (st == MGT_OK && (!t->queue || !t->counts || !t->displs))
            st = mgt_error_set(MGT_ERR_OOM, "comm: host memory exhausted");
    }
    for (int i = 0; i < c->n && st == MGT_OK; i++) {
        if (pthread_create(&x->thr[i].thread, NULL, comm_thread_main, &x->thr[i]) != 0)
            st =
                mgt_error_set(MGT_ERR_DEVICE, "comm: cannot start the comm thread of device %d", i);
        else
            x->thr[i].started = true;
    }
    return st;
}

/* x->line: which exchange each bucket got, and why. */
static void describe(mgt_comm *c, mgt_node_exchange asked, const mgt_link *l, bool modelled,
                     bool no_alltoall)
{
    comm_nodes *x = c->x;
    int rs = 0, nodes = c->nodes;
    size_t ag_max = 0;
    for (int b = 0; b < c->nb; b++)
        if (x->xb[b].kind == MGT_NODE_EXCHANGE_REDUCE_SCATTER)
            rs++;
        else if (shard_floats(c, b) * sizeof(float) > ag_max)
            ag_max = shard_floats(c, b) * sizeof(float);
    char what[160], why[200];
    if (rs == c->nb)
        snprintf(what, sizeof what, "reduce-scatter + all-gather for every bucket");
    else if (rs == 0)
        snprintf(what, sizeof what, "all-gather for every bucket");
    else
        snprintf(what, sizeof what,
                 "reduce-scatter + all-gather for %d of %d buckets, all-gather for the %d whose "
                 "shards are %.3g KiB or less",
                 rs, c->nb, c->nb - rs, (double)ag_max / 1024);
    if (asked != MGT_NODE_EXCHANGE_AUTO)
        snprintf(why, sizeof why, "--node-exchange %s%s", mgt_node_exchange_name(asked),
                 no_alltoall ? ", but the backend's collective has no all-to-all" : "");
    else if (no_alltoall)
        snprintf(why, sizeof why, "the backend's collective has no all-to-all");
    else
        snprintf(why, sizeof why, "the faster on %s link of %.3g GB/s and %.3g us%s",
                 modelled ? "the modelled (--mock xlink)" : "an assumed", l->bytes_per_s / 1e9,
                 l->latency_s * 1e6,
                 nodes == 2 ? "; at 2 nodes the all-gather receives what a reduce-scatter would, "
                              "with half the latencies"
                            : "");
    snprintf(x->line, sizeof x->line,
             "node exchange: %s (%s); per shard a node receives %.3g shards with reduce-scatter "
             "+ all-gather, %d with all-gather; %s",
             what, why, 2.0 * (nodes - 1) / nodes, nodes - 1,
             x->xc       ? "on the devices' own collective"
             : x->direct ? "over MPI in the devices' memory, in pipelined chunks"
                         : "over MPI through pinned host memory, in pipelined chunks");
}

mgt_status comm_nodes_create(mgt_comm *c, const mgt_comm_config *cfg)
{
    size_t n = (size_t)c->n, nb = (size_t)c->nb;
    comm_nodes *x = calloc(1, sizeof *x);
    if (!x)
        return mgt_error_set(MGT_ERR_OOM, "comm: host memory exhausted");
    c->x = x;
    x->rank = mgt_world_rank(c->world);
    x->xb = calloc(nb, sizeof *x->xb);
    x->landed = calloc(nb, sizeof *x->landed);
    x->lost = calloc(n, sizeof *x->lost);
    x->stage = calloc(n, sizeof *x->stage);
    x->slot = calloc(n, sizeof *x->slot);
    x->counts = calloc((size_t)c->nodes, sizeof *x->counts);
    x->displs = calloc((size_t)c->nodes, sizeof *x->displs);
    int *kinds = calloc(nb, sizeof *kinds);
    if (!x->xb || !x->landed || !x->lost || !x->stage || !x->slot || !x->counts || !x->displs ||
        !kinds) {
        free(kinds);
        return mgt_error_set(MGT_ERR_OOM, "comm: host memory exhausted");
    }
    bool device = mgt_xcomm_available(c->set);
    x->direct = !device && mgt_devset_host_memory(c->set);
    bool no_alltoall = device && !mgt_xcomm_can_alltoall(c->set);
    mgt_link l = mgt_comm_assumed_link();
    bool modelled = mgt_world_link(c->world, &l.bytes_per_s, &l.latency_s);
    if (!modelled)
        l = mgt_comm_assumed_link();
    for (int b = 0; b < c->nb; b++) {
        size_t bytes = shard_floats(c, b) * sizeof(float);
        mgt_node_exchange k = cfg->node_exchange == MGT_NODE_EXCHANGE_AUTO
                                  ? mgt_comm_exchange_pick(c->nodes, bytes, &l)
                                  : cfg->node_exchange;
        kinds[b] = no_alltoall ? MGT_NODE_EXCHANGE_ALLGATHER : k;
    }
    /* node 0's plan for all: the collectives of a bucket must match on every node, whatever
       link model or flag another node was given */
    mgt_status st = mgt_world_bcast(c->world, kinds, nb * sizeof *kinds, 0, c->abort);
    for (int b = 0; b < c->nb && st == MGT_OK; b++) {
        size_t floats = shard_floats(c, b);
        x->xb[b].kind = (mgt_node_exchange)kinds[b];
        x->xb[b].chunks = device ? 1 : mgt_comm_exchange_chunks(c->nodes, floats * sizeof(float));
        x->xb[b].stage_off = b ? x->xb[b - 1].stage_off + shard_floats(c, b - 1) : 0;
        x->xb[b].first_chunk = x->chunks;
        x->chunks += (size_t)x->xb[b].chunks;
    }
    free(kinds);
    if (st == MGT_OK)
        st = device ? make_device(c) : make_host(c);
    if (st == MGT_OK)
        describe(c, cfg->node_exchange, &l, modelled, no_alltoall);
    return st;
}

void comm_nodes_stop(mgt_comm *c)
{
    comm_nodes *x = c->x;
    if (!x || !x->thr)
        return;
    pthread_mutex_lock(&c->lock);
    x->quit = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->lock);
    for (int i = 0; i < c->n; i++)
        if (x->thr[i].started) {
            pthread_join(x->thr[i].thread, NULL);
            x->thr[i].started = false;
        }
}

void comm_nodes_free(mgt_comm *c)
{
    comm_nodes *x = c->x;
    if (!x)
        return;
    for (int i = 0; x->xc && i < c->n; i++) {
        mgt_xcomm_free(x->xc[i]);
        mgt_buffer_free(x->xbuf[i]);
        mgt_buffer_free(x->xsum[i]);
    }
    free(x->xc);
    free(x->xbuf);
    free(x->xsum);
    for (size_t k = 0; x->staged && k < (size_t)c->n * x->chunks; k++)
        mgt_event_free(x->staged[k]);
    free(x->staged);
    for (int i = 0; x->stage && i < c->n; i++) {
        if (x->lost[i]) /* MPI's for good (mgt/world.h): the process ends in MPI_Abort */
            continue;
        if (x->stage[i])
            mgt_host_free(c->devs[i], x->stage[i]);
        free(x->slot[i]);
    }
    for (int i = 0; x->thr && i < c->n; i++) {
        free(x->thr[i].queue);
        free(x->thr[i].counts);
        free(x->thr[i].displs);
    }
    free(x->thr);
    free(x->stage);
    free(x->slot);
    free(x->lost);
    free(x->landed);
    free(x->xb);
    free(x->counts);
    free(x->displs);
    free(x);
    c->x = NULL;
}
