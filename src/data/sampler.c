/* DistributedSampler with PyTorch's padding, dropping and striding, plus the exact split
   that evaluation needs; the permutation comes from Philox instead of torch.randperm. */
#include <string.h>

#include "data/internal.h"

mgt_status mgt_sampler_init(mgt_sampler *s, size_t n, int replicas, mgt_split_mode mode,
                            bool shuffle, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    if (replicas < 1)
        return mgt_error_set(MGT_ERR_INVALID, "sampler: %d replicas", replicas);
    if (mode != MGT_SPLIT_PAD && mode != MGT_SPLIT_DROP && mode != MGT_SPLIT_EXACT)
        return mgt_error_set(MGT_ERR_INVALID, "sampler: unknown split mode %d", (int)mode);
    if (n < (size_t)replicas)
        return mgt_error_set(MGT_ERR_INVALID,
                             "%zu samples for %d devices: every device needs at least one", n,
                             replicas);
    s->n = n;
    s->replicas = replicas;
    s->mode = mode;
    s->reps = 1;
    s->shuffle = shuffle;
    s->seed = seed;
    size_t r = (size_t)replicas;
    switch (mode) {
    case MGT_SPLIT_PAD: /* math.ceil(len / replicas) */
        s->num_samples = (n + r - 1) / r;
        s->total_size = s->num_samples * r;
        break;
    case MGT_SPLIT_DROP: /* math.ceil((len - replicas) / replicas) when len % replicas, which
                            is len // replicas for len >= replicas */
        s->num_samples = n / r;
        s->total_size = s->num_samples * r;
        break;
    case MGT_SPLIT_EXACT:
        s->num_samples = (n + r - 1) / r;
        s->total_size = n;
        break;
    case MGT_SPLIT_RA:
        return mgt_error_set(MGT_ERR_INVALID, "sampler: RA takes mgt_sampler_init_ra");
    }
    return MGT_OK;
}

mgt_status mgt_sampler_init_ra(mgt_sampler *s, size_t n, int replicas, int reps, bool shuffle,
                               uint64_t seed)
{
    mgt_status st = mgt_sampler_init(s, n, replicas, MGT_SPLIT_PAD, shuffle, seed);
    if (st != MGT_OK)
        return st;
    if (reps < 1)
        return mgt_error_set(MGT_ERR_INVALID, "sampler: %d repetitions (expected 1 or more)", reps);
    size_t r = (size_t)replicas;
    s->mode = MGT_SPLIT_RA;
    s->reps = reps;
    /* RASampler: num_samples = ceil(n reps / replicas) of the padded list per rank, of which
       it yields num_selected_samples = floor(n // 256 * 256 / replicas) */
    s->total_size = (n * (size_t)reps + r - 1) / r * r;
    s->num_samples = n / 256 * 256 / r;
    if (s->num_samples == 0)
        return mgt_error_set(MGT_ERR_INVALID,
                             "--ra-sampler: %zu samples give none to each of %d devices "
                             "(torchvision's RASampler keeps the first n // 256 * 256 = %zu)",
                             n, replicas, n / 256 * 256);
    return MGT_OK;
}

size_t mgt_sampler_count(const mgt_sampler *s, int rank)
{
    if (rank < 0 || rank >= s->replicas)
        return 0;
    if (s->mode != MGT_SPLIT_EXACT)
        return s->num_samples;
    /* positions rank, rank + N, ... below n */
    return (s->n - (size_t)rank + (size_t)s->replicas - 1) / (size_t)s->replicas;
}

void mgt_sampler_order(const mgt_sampler *s, int64_t epoch, size_t *order)
{
    for (size_t i = 0; i < s->n; i++)
        order[i] = i;
    if (!s->shuffle)
        return;
    /* PyTorch seeds its generator with seed + epoch; so does this stream's key */
    mgt_rng r;
    mgt_rng_init(&r, s->seed + (uint64_t)epoch, 0, 0, MGT_RNG_SHUFFLE);
    mgt_rng_shuffle(&r, order, s->n);
}

size_t mgt_sampler_place(const mgt_sampler *s, int rank, size_t p)
{
    /* padding appends the (repeated) order's head again, so position k of the padded list is
       position k % (n reps) of the repeated one */
    size_t k = (size_t)rank + p * (size_t)s->replicas;
    return k % (s->n * (size_t)s->reps);
}

size_t mgt_sampler_pick(const mgt_sampler *s, const size_t *order, int rank, size_t p)
{
    size_t i = mgt_sampler_place(s, rank, p) / (size_t)s->reps;
    return order ? order[i] : i;
}
