/* Helpers shared by the files of src/data/ and by nothing else. */
#ifndef MGT_DATA_INTERNAL_H
#define MGT_DATA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mgt/data.h"

/* Reads a whole file into *buf (grown with realloc as needed; *cap its size), so that a
   thread reading many files allocates only when a file is bigger than any before.
   MGT_ERR_IO with "path: strerror" on failure. */
mgt_status mgt_data_read_file(const char *path, uint8_t **buf, size_t *cap, size_t *len);

/* Runs fn(ctx, worker, i) for i in [0, n) on `workers` threads (the caller being one of
   them), handing out indices in chunks in increasing order. Stops early when fn returns
   non-zero or the abort flag is raised; returns the first non-zero value, or
   MGT_ERR_ABORTED. */
typedef int (*mgt_data_for_fn)(void *ctx, int worker, size_t i);
int mgt_data_parallel_for(size_t n, int workers, const mgt_abort *abort, mgt_data_for_fn fn,
                          void *ctx);

/* Whether a file name ends in one of ImageFolder's extensions (any case). */
bool mgt_data_has_image_ext(const char *name);

/* The printable form of a path for a one-line message: control characters as '?'. */
void mgt_data_sanitize(char *s);

#endif
