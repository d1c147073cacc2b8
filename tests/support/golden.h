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

#endif
