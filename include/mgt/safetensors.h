/* Reading and atomically writing safetensors files, the checkpoint format shared with PyTorch.
 *
 * Layout (https://github.com/huggingface/safetensors): an 8-byte little-endian header length
 * N, N bytes of UTF-8 JSON, then the data section. The JSON object maps each tensor name
 * (torchvision's: `conv1.weight`, `layer1.0.bn1.running_mean`, `fc.bias`) to
 * {"dtype", "shape", "data_offsets": [begin, end]}, offsets relative to the data section;
 * an optional "__metadata__" object maps strings to strings. Data is raw little-endian.
 *
 * The reader treats its input as hostile and validates everything before it returns a file:
 * the header length, UTF-8, the JSON, each dtype, shape and offset pair, and that the tensors
 * tile the data section exactly (no overlap, no hole, no trailing bytes), as the reference
 * implementation demands. Anything else is MGT_ERR_INVALID with text naming the file and the
 * tensor. Reader and writer run on little-endian hosts only (MGT_ERR_UNSUPPORTED elsewhere).
 */
#ifndef MGT_SAFETENSORS_H
#define MGT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "mgt/status.h"

/* The reference implementation's cap on the JSON header, which a reader enforces before it
   allocates anything for the header. */
#define MGT_ST_MAX_HEADER_BYTES 100000000u

typedef enum mgt_st_dtype {
    MGT_ST_F64,
    MGT_ST_F32,
    MGT_ST_F16,
    MGT_ST_BF16,
    MGT_ST_I64,
    MGT_ST_I32,
    MGT_ST_I16,
    MGT_ST_I8,
    MGT_ST_U8,
    MGT_ST_BOOL, /* one byte per element */
} mgt_st_dtype;

/* Bytes per element; 0 for a value outside the enum. */
size_t mgt_st_dtype_size(mgt_st_dtype dtype);

/* The header's spelling ("F32", "I64", ...); "?" for a value outside the enum. */
const char *mgt_st_dtype_name(mgt_st_dtype dtype);

/* ---- reader ---- */

typedef struct mgt_st_file mgt_st_file;

/* Reads the whole file at path into memory and validates it (see mgt_st_parse). */
mgt_status mgt_st_open(const char *path, mgt_st_file **out);

/* Validates len bytes at buf as a safetensors file and copies them, so buf may be freed at
   once. name_for_errors starts every error text (a path, "<memory>"). */
mgt_status mgt_st_parse(const void *buf, size_t len, const char *name_for_errors,
                        mgt_st_file **out);

/* NULL is a no-op. Every pointer the accessors below returned dies with the file. */
void mgt_st_close(mgt_st_file *f);

/* Tensors are numbered 0..count-1 in the order the header lists them; __metadata__ is not
   one of them. Accessors assert that the index is in range. */
int mgt_st_count(const mgt_st_file *f);

/* The index of the tensor called name, or -1 (O(log count)). */
int mgt_st_find(const mgt_st_file *f, const char *name);

const char *mgt_st_tensor_name(const mgt_st_file *f, int i); /* borrowed */
mgt_st_dtype mgt_st_tensor_dtype(const mgt_st_file *f, int i);
int mgt_st_tensor_ndim(const mgt_st_file *f, int i);             /* 0 for a scalar */
const int64_t *mgt_st_tensor_shape(const mgt_st_file *f, int i); /* borrowed; NULL if ndim 0 */
uint64_t mgt_st_tensor_numel(const mgt_st_file *f, int i);       /* 1 for a scalar */
size_t mgt_st_tensor_bytes(const mgt_st_file *f, int i);         /* numel * dtype size */

/* The tensor's raw little-endian bytes (borrowed). The pointer is only as aligned as the file
   made it (a header length that is not a multiple of 8, or a 1-byte tensor before a 4-byte
   one, leaves it unaligned), so read elements through memcpy. */
const void *mgt_st_tensor_data(const mgt_st_file *f, int i);

/* The metadata value stored under key, or NULL when there is none (borrowed). */
const char *mgt_st_metadata_get(const mgt_st_file *f, const char *key);

/* Metadata entries in header order, for listing them all (borrowed). */
int mgt_st_metadata_count(const mgt_st_file *f);
const char *mgt_st_metadata_key(const mgt_st_file *f, int i);
const char *mgt_st_metadata_value(const mgt_st_file *f, int i);

/* ---- writer ---- */

typedef struct mgt_st_writer mgt_st_writer;

mgt_status mgt_st_writer_create(mgt_st_writer **out);

/* NULL is a no-op. Frees the writer's copies; never the tensors' data. */
void mgt_st_writer_free(mgt_st_writer *w);

/* Appends a tensor; the file stores tensors in the order they were added. name and shape are
   copied. data is BORROWED: it must hold numel * dtype size little-endian bytes and stay
   valid and unchanged until the last mgt_st_writer_save (it may be NULL when that size is 0).
   Refuses a duplicate name, "__metadata__", a name that is not UTF-8, a negative ndim or dim,
   and a shape whose byte size overflows. */
mgt_status mgt_st_writer_add(mgt_st_writer *w, const char *name, mgt_st_dtype dtype, int ndim,
                             const int64_t *shape, const void *data);

/* The first floating-point tensor (F64, F32, F16, BF16; in the order added) holding a NaN or an infinity, or NULL
   when every one is finite; *count (may be NULL) gets how many such values the tensors hold
   in all. The name is the writer's (valid until it is freed). Reads every float tensor's
   data: the caller's guard against saving a diverged model. */
const char *mgt_st_writer_nonfinite(const mgt_st_writer *w, size_t *count);

/* Stores key -> value in __metadata__ (both copied, both UTF-8); a second call with the same
   key replaces the value. */
mgt_status mgt_st_writer_set_metadata(mgt_st_writer *w, const char *key, const char *value);

/* Writes the file atomically: a temp file beside path, every write checked once through a
   sticky error, fflush + fsync, rename over path, fsync of the folder. On failure path is
   untouched (the temp file is removed) and the status is MGT_ERR_IO naming path and the
   cause. The header is padded with spaces to a multiple of 8 bytes, as the reference
   writer does, so data starts 8-aligned. May be called again after more adds. */
mgt_status mgt_st_writer_save(const mgt_st_writer *w, const char *path);

#endif
