/* Reads the tests' array goldens (scripts/make_op_goldens.py's format, also written by
   make_recipe_goldens.py and make_syncbn_goldens.py) and looks arrays up by name. */
#ifndef MGT_TEST_GOLDEN_H
#define MGT_TEST_GOLDEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The format, one file per case: a text line "mgt-golden 1 <arrays>\n", then per array a text
   line "<name> <f32|i32> <count>\n" followed at once by <count> raw little-endian 4-byte
   values. */
#define MGT_TEST_GOLDEN_MAX_ARRAYS 64

typedef struct mgt_test_golden_array {
    char name[64];
    bool is_int;
    size_t count;
    void *data; /* float or int32_t, malloc'd so it is aligned */
} mgt_test_golden_array;

typedef struct mgt_test_golden {
    char path[512];
    int n;
    mgt_test_golden_array a[MGT_TEST_GOLDEN_MAX_ARRAYS];
} mgt_test_golden;

/* Loads MGT_TEST_DATA_DIR/<dir>/<name>.bin; a missing or malformed file fails the running
   cmocka test, naming the file and `maker`, the script that writes it. */
mgt_test_golden *mgt_test_golden_load(const char *dir, const char *name, const char *maker);

void mgt_test_golden_free(mgt_test_golden *g);

/* The array `name`, of `count` values (0: any count) and of the given type; anything else
   fails the running test. */
mgt_test_golden_array *mgt_test_golden_find(mgt_test_golden *g, const char *name, size_t count,
                                            bool is_int);

/* Its float or int32 values (mgt_test_golden_find's checks). */
float *mgt_test_golden_f32(mgt_test_golden *g, const char *name, size_t count);
int32_t *mgt_test_golden_i32(mgt_test_golden *g, const char *name, size_t count);

/* ---- the hashes of the model goldens (scripts/make_model_goldens.py's fnv1a, fmix32,
   hash_uniform and sample positions, which the weights and the kept samples come from) ---- */

/* FNV-1a of a name: the salt of its tensor's values and of its samples. */
uint32_t mgt_test_fnv1a(const char *s);
/* Value i of the uniform [0, 1) sequence salted by salt, from murmur3's finaliser. */
double mgt_test_hash_uniform(uint32_t salt, size_t i);

/* The elements a summary golden keeps of a tensor: all of a small one, else
   MGT_TEST_SAMPLES positions hashed from "sample:<name>". Returns the count; idx gets them. */
#define MGT_TEST_SAMPLES 64
size_t mgt_test_sample_index(const char *name, size_t numel, size_t idx[MGT_TEST_SAMPLES]);

/* Whether s ends with suffix (the goldens' rules pick values by a name's ending). */
bool mgt_test_ends_with(const char *s, const char *suffix);

/* ---- recorded random draws (scripts/make_data_goldens.py writes torch's, in order) ---- */

/* The draws a torchvision transform made: kind 'u' (uniform in [lo, hi)) or 'i' (randint in
   [lo, hi)), the bounds asked for and the value returned. Replayed through the hooks below, the
   C transform gets the same values, and bad is set if it asks for another draw than recorded. */
typedef struct mgt_test_replay {
    int n, pos;
    char kind[64];
    double lo[64], hi[64], v[64];
    bool bad;
} mgt_test_replay;

double mgt_test_replay_uniform(void *replay, double lo, double hi);
int64_t mgt_test_replay_randint(void *replay, int64_t lo, int64_t hi);

#endif
