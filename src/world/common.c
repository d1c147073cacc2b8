/* What both world implementations share: reading the launcher's environment. */
#include <stdlib.h>

#include "world/world_impl.h"

int world_env_size(const char **var)
{
    /* Open MPI's mpirun, then PMI/PMIx (MPICH, Slurm's srun --mpi=pmi2/pmix), then Slurm */
    static const char *const names[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE",
                                        "SLURM_NTASKS", "SLURM_NPROCS"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) {
            if (var)
                *var = names[i];
            return atoi(v);
        }
    }
    if (var)
        *var = NULL;
    return 1;
}

double mgt_world_kill_grace_s(void)
{
    if (!getenv("OMPI_COMM_WORLD_SIZE"))
        return -1;
    /* mpirun passes its --mca parameters to the ranks as OMPI_MCA_<name> */
    const char *v = getenv("OMPI_MCA_odls_base_sigkill_timeout");
    return v && *v ? atof(v) : 1.0;
}
