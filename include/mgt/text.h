/* A growable text for messages assembled piece by piece (a weights file's mismatch lines, the
   training reporters' output). */
#ifndef MGT_TEXT_H
#define MGT_TEXT_H

#include <stdbool.h>
#include <stddef.h>

/* s is NUL-terminated once anything was added (NULL before); zero-initialise to start. */
typedef struct mgt_text {
    char *s;
    size_t len, cap;
} mgt_text;

/* Appends printf-style text. A failed allocation drops what did not fit and returns false:
   the text is output, never state. */
bool mgt_text_add(mgt_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Appends n bytes as they are (binary-safe: zero bytes too), NUL-terminated after them; false
   as mgt_text_add. */
bool mgt_text_append(mgt_text *t, const void *bytes, size_t n);

/* Frees the text and zeroes t; a zeroed t is a no-op. */
void mgt_text_free(mgt_text *t);

#endif
