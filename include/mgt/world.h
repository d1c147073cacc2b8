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

/* The inter-node link model of mock runs (--mock xlink=BW,LAT): each channel all-gather of
   b bytes then takes at least (nodes - 1) x (latency + b / bandwidth), the time a ring
   all-gather over one link per device would. 0: none. */
void mgt_world_set_link(mgt_world *w, double bytes_per_s, double latency_s);

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
/* mgt_world_allgather on channel `chan`, from that device's thread. */
mgt_status mgt_world_chan_allgather(mgt_world *w, int chan, const void *mine, size_t bytes,
                                    void *all, const mgt_abort *abort);

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
