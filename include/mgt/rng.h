/* Counter-based random numbers (Philox4x32-10) keyed by seed, epoch, sample index and purpose.
 *
 * Every stream is a pure function of its key, so a sample's augmentation or an epoch's
 * shuffle is the same whichever thread computes it, in whatever order, on however many
 * devices. A stream costs nothing to create (no state to seed) and ten rounds of two 32-bit
 * multiplies per four words drawn.
 *
 * Stream layout: key = seed (64 bits); counter = {block, epoch, index low 32 bits,
 * index bits 32..55 | purpose << 24}. Indices up to 2^56 and 2^32 blocks (16 GiB of
 * draws) per stream.
 */
#ifndef MGT_RNG_H
#define MGT_RNG_H

#include <stddef.h>
#include <stdint.h>

/* What a stream is for; streams of different purposes never overlap. */
typedef enum mgt_rng_purpose {
    MGT_RNG_SHUFFLE = 1, /* the sampler's per-epoch permutation */
    MGT_RNG_AUGMENT = 2, /* a sample's random crop and flip */
    MGT_RNG_INIT = 3,    /* parameter initialisation */
    MGT_RNG_OTHER = 4,   /* anything else (tests, synthetic data) */
    MGT_RNG_MIX = 5,     /* a sample's mixup / cutmix draws (keyed by its place in the epoch) */
    MGT_RNG_DROPOUT = 6, /* dropout masks (keyed by step and global sample; mgt_dropout_key) */
} mgt_rng_purpose;

typedef struct mgt_rng {
    uint32_t key[2];
    uint32_t ctr[4];
    uint32_t out[4]; /* the current block's words */
    int avail;       /* words of out[] not yet used (taken from the back) */
} mgt_rng;

/* One Philox4x32-10 block: out = philox(ctr, key), as Random123's philox4x32_R(10, ...). */
void mgt_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* Starts the stream for (seed, epoch, index, purpose) at its first word. */
void mgt_rng_init(mgt_rng *r, uint64_t seed, uint64_t epoch, uint64_t index,
                  mgt_rng_purpose purpose);

/* The next 32 random bits. */
uint32_t mgt_rng_u32(mgt_rng *r);

/* Uniform in [0, 1) with 24 random bits (every value exactly a float). */
float mgt_rng_uniform(mgt_rng *r);

/* Uniform in [0, 1) with 53 random bits (two words). */
double mgt_rng_uniform_double(mgt_rng *r);

/* The double mgt_rng_uniform_double makes of its two words, hi drawn first. */
static inline double mgt_rng_double_of(uint32_t hi, uint32_t lo)
{
    uint64_t h = hi >> 5; /* 27 bits */
    uint64_t l = lo >> 6; /* 26 bits */
    return (double)((h << 26) | l) * (1.0 / 9007199254740992.0);
}

/* Blocks first .. first + n - 1 of the stream r was started on, four words each, into
   out[4 * n]: the words mgt_rng_u32 hands out from the start of block `first` on, in its order
   (r itself is neither read past its key and counter nor moved). The blocks are independent, so
   a long run of them is computed several at a time: a bulk draw (parameter initialisation)
   takes a fraction of the time word-by-word draws take. */
void mgt_rng_blocks(const mgt_rng *r, uint32_t first, size_t n, uint32_t *out);

/* Uniform integer in [0, n) without bias (Lemire's multiply-and-reject); n > 0.
   n < 2^32 takes one word per try, larger n two. */
uint64_t mgt_rng_below(mgt_rng *r, uint64_t n);

/* Uniform integer in [lo, hi) (hi > lo), as torch.randint(lo, hi). */
int64_t mgt_rng_range(mgt_rng *r, int64_t lo, int64_t hi);

/* Fisher-Yates shuffle of a[0..n): a uniformly random permutation, the same for the same
   stream. */
void mgt_rng_shuffle(mgt_rng *r, size_t *a, size_t n);

#endif
