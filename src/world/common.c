/* What both world implementations share: reading the launcher's environment, and the
   settings every node must agree on (their digest, the first difference). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

uint64_t world_digest(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* One line of a settings text: its name and value (not terminated), and where the next
   line starts; false at the end. */
static bool next_setting(const char **at, const char **name, int *nl, const char **value, int *vl)
{
    const char *s = *at;
    if (!*s)
        return false;
    const char *end = strchr(s, '\n');
    if (!end)
        end = s + strlen(s);
    const char *tab = memchr(s, '\t', (size_t)(end - s));
    *name = s;
    *nl = (int)((tab ? tab : end) - s);
    *value = tab ? tab + 1 : end;
    *vl = (int)(end - *value);
    *at = *end ? end + 1 : end;
    return true;
}

mgt_status world_settings_differ(const char *mine, int rank, const char *theirs)
{
    const char *a = mine, *b = theirs;
    for (;;) {
        const char *an = "", *av = "", *bn = "", *bv = "";
        int anl = 0, avl = 0, bnl = 0, bvl = 0;
        bool ha = next_setting(&a, &an, &anl, &av, &avl);
        bool hb = next_setting(&b, &bn, &bnl, &bv, &bvl);
        if (!ha && !hb)
            return MGT_OK;
        bool same_name = ha && hb && anl == bnl && memcmp(an, bn, (size_t)anl) == 0;
        if (same_name && avl == bvl && memcmp(av, bv, (size_t)avl) == 0)
            continue;
        const char *tail = "every node must run the same command line on the same data";
        if (same_name)
            return mgt_error_set(
                MGT_ERR_USAGE, "the nodes disagree on %.*s: %.*s on node %d, %.*s on node 0; %s",
                anl, an, avl > 120 ? 120 : avl, av, rank, bvl > 120 ? 120 : bvl, bv, tail);
        if (ha)
            return mgt_error_set(
                MGT_ERR_USAGE, "the nodes disagree: node %d has %.*s (%.*s), node 0 has %s%.*s; %s",
                rank, anl, an, avl > 120 ? 120 : avl, av, hb ? "" : "nothing more", hb ? bnl : 0,
                bn, tail);
        return mgt_error_set(MGT_ERR_USAGE,
                             "the nodes disagree: node 0 has %.*s (%.*s), node %d has nothing "
                             "more; %s",
                             bnl, bn, bvl > 120 ? 120 : bvl, bv, rank, tail);
    }
}

double mgt_world_kill_grace_s(void)
{
    if (!getenv("OMPI_COMM_WORLD_SIZE"))
        return -1;
    /* mpirun passes its --mca parameters to the ranks as OMPI_MCA_<name> */
    const char *v = getenv("OMPI_MCA_odls_base_sigkill_timeout");
    return v && *v ? atof(v) : 1.0;
}
