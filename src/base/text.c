/* The growable text of mgt/text.h: doubling capacity, one vsnprintf to measure, one to write. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mgt/text.h"

/* Room for n more bytes and the terminating NUL. */
static bool reserve(mgt_text *t, size_t n)
{
    if (t->len + n + 1 <= t->cap)
        return true;
    size_t cap = t->cap ? t->cap : 256;
    while (t->len + n + 1 > cap)
        cap *= 2;
    char *s = realloc(t->s, cap);
    if (!s)
        return false;
    t->s = s;
    t->cap = cap;
    return true;
}

bool mgt_text_add(mgt_text *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int need = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (need < 0 || !reserve(t, (size_t)need))
        return false;
    va_start(ap, fmt);
    vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    t->len += (size_t)need;
    return true;
}

bool mgt_text_append(mgt_text *t, const void *bytes, size_t n)
{
    if (!reserve(t, n))
        return false;
    memcpy(t->s + t->len, bytes, n);
    t->len += n;
    t->s[t->len] = '\0';
    return true;
}

void mgt_text_free(mgt_text *t)
{
    free(t->s);
    *t = (mgt_text){0};
}
