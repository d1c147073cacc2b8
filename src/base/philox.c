/* Philox4x32-10 (Salmon et al., SC'11) and the draws built on it: floats, ranges, shuffles. */
#include "mgt/rng.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u /* golden ratio */
#define PHILOX_W1 0xBB67AE85u /* sqrt(3) - 1 */

static inline void mulhilo(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo)
{
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

/* One block of the counter (c0, c1, c2, c3) under the key (k0, k1), on scalars: no array of
   its own for an instrumented build to check on every round. */
static inline void philox_block(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                uint32_t k1, uint32_t out[4])
{
    for (int round = 0; round < 10; round++) {
        uint32_t hi0, lo0, hi1, lo1;
        mulhilo(PHILOX_M0, c0, &hi0, &lo0);
        mulhilo(PHILOX_M1, c2, &hi1, &lo1);
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

void mgt_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    philox_block(ctr[0], ctr[1], ctr[2], ctr[3], key[0], key[1], out);
}

void mgt_rng_init(mgt_rng *r, uint64_t seed, uint64_t epoch, uint64_t index,
                  mgt_rng_purpose purpose)
{
    r->key[0] = (uint32_t)seed;
    r->key[1] = (uint32_t)(seed >> 32);
    r->ctr[0] = 0;
    r->ctr[1] = (uint32_t)epoch;
    r->ctr[2] = (uint32_t)index;
    r->ctr[3] = ((uint32_t)(index >> 32) & 0x00FFFFFFu) | ((uint32_t)purpose << 24);
    r->avail = 0;
}

uint32_t mgt_rng_u32(mgt_rng *r)
{
    if (r->avail == 0) {
        mgt_philox4x32_10(r->ctr, r->key, r->out);
        r->ctr[0]++;
        r->avail = 4;
    }
    /* words are handed out in order out[0], out[1], ... */
    return r->out[4 - r->avail--];
}

float mgt_rng_uniform(mgt_rng *r) { return (float)(mgt_rng_u32(r) >> 8) * (1.0f / 16777216.0f); }

double mgt_rng_uniform_double(mgt_rng *r)
{
    uint32_t hi = mgt_rng_u32(r);
    return mgt_rng_double_of(hi, mgt_rng_u32(r));
}

void mgt_rng_blocks(const mgt_rng *r, uint32_t first, size_t n, uint32_t *out)
{
    /* one independent block per iteration (the counter's first word wraps as mgt_rng_u32's
       does): GCC vectorises the loop at -O3 (CMakeLists.txt). The key and the counter's other
       words are read once, into locals: out might alias r as far as the compiler knows, and
       under the address sanitizer, rereading and checking them after every store made this
       loop 35% of zoo.finetune's samples (25% now) */
    const uint32_t k0 = r->key[0], k1 = r->key[1];
    const uint32_t c1 = r->ctr[1], c2 = r->ctr[2], c3 = r->ctr[3];
    for (size_t i = 0; i < n; i++)
        philox_block(first + (uint32_t)i, c1, c2, c3, k0, k1, out + 4 * i);
}

static uint64_t rng_u64(mgt_rng *r)
{
    uint64_t hi = mgt_rng_u32(r);
    return (hi << 32) | mgt_rng_u32(r);
}

uint64_t mgt_rng_below(mgt_rng *r, uint64_t n)
{
    if (n <= UINT32_MAX) {
        /* Lemire: the high word of x*n is uniform in [0, n) once the low word's bias zone
           (below 2^32 mod n) is rejected; costs one multiply, rarely a second draw */
        uint32_t n32 = (uint32_t)n;
        uint64_t m = (uint64_t)mgt_rng_u32(r) * n32;
        uint32_t low = (uint32_t)m;
        if (low < n32) {
            uint32_t threshold = (uint32_t)(-n32) % n32;
            while (low < threshold) {
                m = (uint64_t)mgt_rng_u32(r) * n32;
                low = (uint32_t)m;
            }
        }
        return m >> 32;
    }
    /* wide ranges: plain rejection of the top partial interval */
    uint64_t limit = UINT64_MAX - (UINT64_MAX % n);
    uint64_t x;
    do {
        x = rng_u64(r);
    } while (x >= limit);
    return x % n;
}

int64_t mgt_rng_range(mgt_rng *r, int64_t lo, int64_t hi)
{
    return lo + (int64_t)mgt_rng_below(r, (uint64_t)(hi - lo));
}

void mgt_rng_shuffle(mgt_rng *r, size_t *a, size_t n)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)mgt_rng_below(r, i);
        size_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}
