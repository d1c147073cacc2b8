/* libFuzzer target: mgt_st_parse on arbitrary bytes must refuse them with a reason or return a
   file whose every accessor stays inside the input; built and run by tools/fuzz-safetensors.sh. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "mgt/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Aborts in a way libFuzzer reports with the input, without needing assert() enabled. */
#define CHECK(cond)           \
    do {                      \
        if (!(cond))          \
            __builtin_trap(); \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mgt_st_file *f = NULL;
    mgt_error_clear();
    if (mgt_st_parse(data, size, "fuzz", &f) != MGT_OK) {
        CHECK(f == NULL);
        CHECK(mgt_error_last()[0] != '\0');
        return 0;
    }
    uint64_t total = 0;
    volatile unsigned char sink = 0;
    for (int i = 0; i < mgt_st_count(f); i++) {
        const char *name = mgt_st_tensor_name(f, i);
        CHECK(mgt_st_find(f, name) == i);
        size_t esize = mgt_st_dtype_size(mgt_st_tensor_dtype(f, i));
        CHECK(esize > 0);
        uint64_t numel = 1;
        for (int k = 0; k < mgt_st_tensor_ndim(f, i); k++) {
            CHECK(mgt_st_tensor_shape(f, i)[k] >= 0);
            numel *= (uint64_t)mgt_st_tensor_shape(f, i)[k];
        }
        CHECK(numel == mgt_st_tensor_numel(f, i));
        size_t bytes = mgt_st_tensor_bytes(f, i);
        CHECK(bytes == numel * esize);
        /* touch every byte so that ASan sees any pointer past the copy */
        const unsigned char *p = mgt_st_tensor_data(f, i);
        for (size_t b = 0; b < bytes; b++)
            sink ^= p[b];
        total += bytes;
    }
    CHECK(total + 8 <= size);
    for (int i = 0; i < mgt_st_metadata_count(f); i++)
        CHECK(mgt_st_metadata_get(f, mgt_st_metadata_key(f, i)) != NULL);
    (void)sink;
    mgt_st_close(f);
    return 0;
}
