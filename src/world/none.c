/* The world of a build without MPI: one process, every collective a copy or nothing, and a
   clear error when a launcher started several ranks of it. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "world/world_impl.h"

struct mgt_world {
    char host[256];
};

bool mgt_world_have_mpi(void) { return false; }

mgt_status mgt_world_open(mgt_world **out)
{
    *out = NULL;
    const char *var;
    int n = world_env_size(&var);
    if (n > 1)
        return mgt_error_set(MGT_ERR_INVALID,
                             "launched as one of %d ranks (%s) but this mgtrain was built "
                             "without MPI: install Open MPI (scripts/setup.sh, or apt-get "
                             "install libopenmpi-dev openmpi-bin) and rebuild with cmake "
                             "-DMGT_MPI=ON",
                             n, var);
    mgt_world *w = calloc(1, sizeof *w);
    if (!w)
        return mgt_error_set(MGT_ERR_OOM, "world: host memory exhausted");
    if (gethostname(w->host, sizeof w->host - 1) != 0)
        strcpy(w->host, "localhost");
    *out = w;
    return MGT_OK;
}

void mgt_world_close(mgt_world *w, bool failed)
{
    (void)failed;
    free(w);
}

int mgt_world_rank(const mgt_world *w) { return w ? 0 : 0; }
int mgt_world_size(const mgt_world *w) { return w ? 1 : 1; }
const char *mgt_world_host(const mgt_world *w) { return w ? w->host : "localhost"; }
void mgt_world_set_timeout(mgt_world *w, double seconds) { (void)w, (void)seconds; }
void mgt_world_set_link(mgt_world *w, double bytes_per_s, double latency_s)
{
    (void)w, (void)bytes_per_s, (void)latency_s;
}

bool mgt_world_link(const mgt_world *w, double *bytes_per_s, double *latency_s)
{
    (void)w;
    *bytes_per_s = *latency_s = 0;
    return false;
}

mgt_status mgt_world_check_devices(mgt_world *w, int local_devices)
{
    (void)w, (void)local_devices;
    return MGT_OK;
}

mgt_status mgt_world_check_same(mgt_world *w, const char *settings, const mgt_abort *abort,
                                bool *speaker)
{
    (void)w, (void)settings, (void)abort;
    *speaker = false;
    return MGT_OK;
}

mgt_status mgt_world_bcast(mgt_world *w, void *buf, size_t bytes, int root, const mgt_abort *abort)
{
    (void)w, (void)buf, (void)bytes, (void)root, (void)abort;
    return MGT_OK;
}

mgt_status mgt_world_allgather(mgt_world *w, const void *mine, size_t bytes, void *all,
                               const mgt_abort *abort)
{
    (void)w, (void)abort;
    memmove(all, mine, bytes);
    return MGT_OK;
}

mgt_status mgt_world_sum(mgt_world *w, double *v, int n, const mgt_abort *abort)
{
    (void)w, (void)v, (void)n, (void)abort;
    return MGT_OK;
}

mgt_status mgt_world_barrier(mgt_world *w, const mgt_abort *abort)
{
    (void)w, (void)abort;
    return MGT_OK;
}

mgt_status mgt_world_channels(mgt_world *w, int n)
{
    (void)w, (void)n;
    return MGT_OK;
}

mgt_status mgt_world_chan_alltoall(mgt_world *w, int chan, const void *send, const size_t *counts,
                                   const size_t *displs, void *recv, size_t each, int *op)
{
    (void)w, (void)chan, (void)counts;
    *op = 0;
    memmove(recv, (const char *)send + displs[0], each);
    return MGT_OK;
}

mgt_status mgt_world_chan_allgather(mgt_world *w, int chan, const void *send, void *recv,
                                    const size_t *counts, const size_t *displs, int *op)
{
    (void)w, (void)chan;
    *op = 0;
    if (send)
        memmove((char *)recv + displs[0], send, counts[0]);
    return MGT_OK;
}

uint64_t mgt_world_chan_bytes_in(const mgt_world *w)
{
    (void)w;
    return 0;
}

mgt_status mgt_world_chan_wait(mgt_world *w, int chan, int op, const mgt_abort *abort)
{
    (void)w, (void)chan, (void)op, (void)abort;
    return MGT_OK;
}

void mgt_world_notify_failure(mgt_world *w, const char *text) { (void)w, (void)text; }

bool mgt_world_poll_failure(mgt_world *w, char *text, size_t cap)
{
    (void)w, (void)text, (void)cap;
    return false;
}

void mgt_world_stop_propose(mgt_world *w, long step) { (void)w, (void)step; }

bool mgt_world_stop_poll(mgt_world *w, bool *requested, long *agreed)
{
    (void)w, (void)agreed;
    *requested = false;
    return false;
}
