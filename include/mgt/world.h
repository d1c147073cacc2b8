/* The processes of a multi-node run: one per node, joined through MPI when a launcher
 * (mpirun, srun) started them, else a world of one that needs no MPI at all.
 *
 * Every MPI call of the program lives behind this header (src/world/mpi.c; src/world/none.c
 * where mgtrain was built without MPI), so no other module has an #ifdef for it. Waits are
 * non-blocking requests polled with the run's abort flag and the step timeout: a blocking
 * MPI collective could not be left when another thread or another node fails.
 *
 * Threads: MPI_THREAD_MULTIPLE. Each local device gets its own duplicated communicator
 * (mgt_world_channels, made by the main thread before the workers start, as MPI_Comm_dup is
 * collective), because the devices' cross-node exchanges run concurrently from their own
 * threads and MPI matches collectives on one communicator by their order of issue: on
 * separate communicators each device's sequence is ordered by its own thread alone, and no
 * single communication thread serialises the shards of a bucket.
 */
#ifndef MGT_WORLD_H
#define MGT_WORLD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mgt/status.h"
#include "mgt/thread.h"

typedef struct mgt_world mgt_world;

/* Whether this build has MPI (MGT_MPI at configure time). */
bool mgt_world_have_mpi(void);

/* Joins the launcher's world: MPI_Init_thread (MPI_THREAD_MULTIPLE) when the environment
   says a launcher started this process with more than one rank (OMPI_COMM_WORLD_SIZE,
   PMI_SIZE, PMIX_RANK with SLURM_NTASKS...), else a world of one without MPI. Errors: a
   launcher's world in a build without MPI (saying how to get it), a thread level below
   MPI_THREAD_MULTIPLE. */
mgt_status mgt_world_open(mgt_world **out);
/* Leaves the world: MPI_Finalize, or MPI_Abort of every rank when `failed` (a failed run may
   have requests in flight that never complete). NULL is a no-op. */
void mgt_world_close(mgt_world *w, bool failed);

int mgt_world_rank(const mgt_world *w); /* this node's rank, 0 for a world of one */
int mgt_world_size(const mgt_world *w); /* nodes */
const char *mgt_world_host(const mgt_world *w);
/* How Open MPI's mpirun ends the job on Ctrl-C: SIGCONT to every rank, SIGTERM this many
   seconds later, SIGKILL as long after that (its odls_base_sigkill_timeout, 1 unless given);
   -1 where the launcher is not Open MPI's. */
double mgt_world_kill_grace_s(void);

/* Time a wait may take before it fails with MGT_ERR_TIMEOUT (0: no limit; --timeout). */
void mgt_world_set_timeout(mgt_world *w, double seconds);

/* The inter-node link model of mock runs (--mock xlink=BW,LAT): one link per channel (per
   local device, as a rail of one NIC per GPU), which the channel's collectives use one after
   another. A collective that brings this node b bytes from the other nodes occupies it for
   (nodes - 1) x LAT + b / BW from the time it is started or the link is free, whichever is
   later, and completes no earlier than that: a ring all-gather of b / (nodes - 1) bytes a node,
   or an all-to-all in nodes - 1 pairwise steps. 0: none. */
void mgt_world_set_link(mgt_world *w, double bytes_per_s, double latency_s);
/* The link model set (false, and zeros, where none). */
bool mgt_world_link(const mgt_world *w, double *bytes_per_s, double *latency_s);

/* Every node must bring the same number of local devices: MGT_ERR_INVALID otherwise,
   naming the nodes and their counts. Collective. */
mgt_status mgt_world_check_devices(mgt_world *w, int local_devices);

/* Every node must run with the same settings: those that shape a step (the flags, the data's
   size and classes). settings holds lines "NAME\tVALUE\n" in an order every node follows.
   Collective: digests of them are compared; where they differ, every node returns
   MGT_ERR_USAGE with the same text, naming the first setting that differs and both values,
   and *speaker is true on the one node whose line it is (the lowest that differs from node 0)
   and false on the others, which say nothing. A world of one: MGT_OK. */
mgt_status mgt_world_check_same(mgt_world *w, const char *settings, const mgt_abort *abort,
                                bool *speaker);

/* Collectives of the main thread over the world communicator. All abortable. */
mgt_status mgt_world_bcast(mgt_world *w, void *buf, size_t bytes, int root, const mgt_abort *abort);
/* all[r * bytes ..] gets rank r's `mine`. */
mgt_status mgt_world_allgather(mgt_world *w, const void *mine, size_t bytes, void *all,
                               const mgt_abort *abort);
/* Sums n doubles over the ranks, in rank order (the same result on every rank). */
mgt_status mgt_world_sum(mgt_world *w, double *v, int n, const mgt_abort *abort);
/* Waits until every rank has arrived. */
mgt_status mgt_world_barrier(mgt_world *w, const mgt_abort *abort);

/* One duplicated communicator per local device (at least n, kept across calls); collective,
   before the workers start. */
mgt_status mgt_world_channels(mgt_world *w, int n);

/* Non-blocking collectives of one device's thread on its channel, for the gradient shards.
   They run in the caller's buffers (shards are large: no copies through the world's), so the
   contract is the buffers': lent to MPI from the start until the operation's wait returns
   MGT_OK. After a failed start or wait, every buffer lent on the channel and not yet waited
   for is MPI's for good (MPI cannot cancel a collective: it may read or write it until the
   process ends in MPI_Abort): the caller must never free or reuse it. Several operations may be
   in flight on a channel (at most MGT_WORLD_CHAN_OPS), started in the same order on every
   rank; *op names one for mgt_world_chan_wait. Counts and offsets are in bytes, arrays of one
   entry per rank, copied (the caller's may go). In a world of one they are copies. */
#define MGT_WORLD_CHAN_OPS 4
/* Rank p gets counts[p] bytes at send + displs[p]; recv + r * each gets rank r's piece for
   this rank (each == counts[this rank] on every rank). */
mgt_status mgt_world_chan_alltoall(mgt_world *w, int chan, const void *send, const size_t *counts,
                                   const size_t *displs, void *recv, size_t each, int *op);
/* Every rank's counts[r] bytes land at recv + displs[r] on every rank: from send, or, with send
   NULL, from recv + displs[r] itself (in place). */
mgt_status mgt_world_chan_allgather(mgt_world *w, int chan, const void *send, void *recv,
                                    const size_t *counts, const size_t *displs, int *op);
/* Completes operation op of channel chan: MPI's part, then the link model's time. Abortable
   (the flag, another node's failure, --timeout). */
mgt_status mgt_world_chan_wait(mgt_world *w, int chan, int op, const mgt_abort *abort);
/* Bytes this node's channels were sent by the other ranks (the collectives' receive counts,
   its own pieces left out) since the channels were made: what crossed the link into the node. */
uint64_t mgt_world_chan_bytes_in(const mgt_world *w);

/* Control messages beside the data: a failure's one line, a stop's proposed step. */
/* Tells every other rank that this one failed (text: the line it prints); waits up to a
   second for the messages to leave. */
void mgt_world_notify_failure(mgt_world *w, const char *text);
/* Whether another rank has failed; its line into text. */
bool mgt_world_poll_failure(mgt_world *w, char *text, size_t cap);
/* A stop is agreed on as the largest of the steps the ranks propose: each rank proposes once
   (the steps its devices have begun), and the agreed step is known once all have. */
void mgt_world_stop_propose(mgt_world *w, long step);
/* requested: some rank proposed a stop; when every rank has, *agreed gets the step and the
   return is true. */
bool mgt_world_stop_poll(mgt_world *w, bool *requested, long *agreed);

#endif
