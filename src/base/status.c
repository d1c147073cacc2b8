/* Status names and the per-thread error text that goes with a failed call. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mgt/status.h"

static _Thread_local char error_text[512];

const char *mgt_status_str(mgt_status st)
{
    switch (st) {
    case MGT_OK: return "ok";
    case MGT_ERR_INVALID: return "invalid argument";
    case MGT_ERR_OOM: return "out of memory";
    case MGT_ERR_DEVICE: return "device error";
    case MGT_ERR_ABORTED: return "aborted";
    case MGT_ERR_IO: return "I/O error";
    case MGT_ERR_UNSUPPORTED: return "unsupported";
    case MGT_ERR_TIMEOUT: return "timed out";
    case MGT_ERR_USAGE: return "bad usage";
    }
    return "unknown status";
}

mgt_status mgt_error_set(mgt_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_text, sizeof error_text, fmt, ap);
    va_end(ap);
    return st;
}

mgt_status mgt_error_wrap(mgt_status st, const char *fmt, ...)
{
    char prev[sizeof error_text];
    memcpy(prev, error_text, sizeof prev);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(error_text, sizeof error_text, fmt, ap);
    va_end(ap);
    size_t at = n >= 0 ? (size_t)n : sizeof error_text;
    if (at + 3 <= sizeof error_text && prev[0]) { /* ": " and as much of prev as fits */
        size_t len = strlen(prev), room = sizeof error_text - at - 3;
        if (len > room)
            len = room;
        memcpy(error_text + at, ": ", 2);
        memcpy(error_text + at + 2, prev, len);
        error_text[at + 2 + len] = '\0';
    }
    return st;
}

const char *mgt_error_last(void) { return error_text; }

void mgt_error_clear(void) { error_text[0] = '\0'; }

void mgt_assert_fail(const char *cond, const char *file, int line, const char *func)
{
    fprintf(stderr, "mgtrain: internal error: %s:%d: %s: %s is false\n", file, line, func, cond);
    abort();
}

void mgt_error_save(mgt_error_saved *s)
{
    _Static_assert(sizeof s->text == sizeof error_text, "the saved text holds all of it");
    memcpy(s->text, error_text, sizeof error_text);
}

void mgt_error_restore(const mgt_error_saved *s) { memcpy(error_text, s->text, sizeof error_text); }
