/* Status codes returned by every mgtrain call that can fail, and the per-thread error text. */
#ifndef MGT_STATUS_H
#define MGT_STATUS_H

#include <stddef.h>

typedef enum mgt_status {
    MGT_OK = 0,
    MGT_ERR_INVALID,     /* a bad argument or bad input (flag, shape, file contents) */
    MGT_ERR_OOM,         /* device or host memory exhausted, or the device's limit reached */
    MGT_ERR_DEVICE,      /* a device op failed (kernel, copy, driver, injected fault) */
    MGT_ERR_ABORTED,     /* a wait was left because the abort flag was raised */
    MGT_ERR_IO,          /* a file or folder could not be read or written */
    MGT_ERR_UNSUPPORTED, /* the backend or build cannot do this */
    MGT_ERR_TIMEOUT,     /* a bounded wait ran out */
    MGT_ERR_USAGE,       /* a setting (a flag's value) that cannot work, alone or with another,
                            or differs between the nodes: the command line is wrong (exit 2) */
} mgt_status;

/* A short name for a status ("out of memory"); never NULL. */
const char *mgt_status_str(mgt_status st);

/* Sets this thread's error text (printf-style) and returns st, so that a failure reads
   `return mgt_error_set(MGT_ERR_IO, "%s: %s", path, strerror(errno));`. */
mgt_status mgt_error_set(mgt_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Puts context in front of this thread's error text, "CONTEXT: previous text", and returns
   st: `return mgt_error_wrap(st, "--resume %s", path);`. The previous text is copied before
   the context is formatted, so it may be passed nowhere else: never hand mgt_error_last() to
   mgt_error_set or mgt_error_wrap as an argument (both write the buffer it points to). */
mgt_status mgt_error_wrap(mgt_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* This thread's last error text; "" when none was set since the last clear. Borrowed. */
const char *mgt_error_last(void);

void mgt_error_clear(void);

/* An invariant whose failure would corrupt memory or hand back garbage (an index past a fixed
   array, two shapes a copy relies on, a library call whose arguments were all checked):
   checked in every build, where assert() is compiled out by NDEBUG, which the default
   RelWithDebInfo build defines. A broken one prints the condition and where, and aborts. */
#define MGT_ASSERT(cond) ((cond) ? (void)0 : mgt_assert_fail(#cond, __FILE__, __LINE__, __func__))
__attribute__((noreturn)) void mgt_assert_fail(const char *cond, const char *file, int line,
                                               const char *func);

/* Cleanup keeps a failure's text: a function that frees runs on the error path of the call
   that failed, and what it calls (a wait on a failed device, a stream that was never made)
   sets text of its own. It saves the text first and puts it back when it is done. */
typedef struct mgt_error_saved {
    char text[512];
} mgt_error_saved;
void mgt_error_save(mgt_error_saved *s);
void mgt_error_restore(const mgt_error_saved *s);

#endif
