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
    }
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

size_t mgt_sampler_pick(const mgt_sampler *s, const size_t *order, int rank, size_t p)
{
    /* padding appends the order's head again (cyclically when it is shorter than the
       padding), so position k of the padded list is order[k % n] */
    size_t k = (size_t)rank + p * (size_t)s->replicas;
    return order[k % s->n];
}
