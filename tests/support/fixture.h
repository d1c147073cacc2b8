/* Shared by the tests: a CHECK for calls that return a status, a temp folder, a small synthetic ImageFolder tree, mock devices
   and quiet progress output. */
#ifndef MGT_TEST_FIXTURE_H
#define MGT_TEST_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "mgt/device.h"
#include "mgt/thread.h" /* the abort flags and clocks the tests use beside the devices */

/* Fails the running cmocka test when a call does not return MGT_OK, with the call, the
   status and the error text. Include <cmocka.h> first. */
#define CHECK(call)                                                               \
    do {                                                                          \
        mgt_status st_ = (call);                                                  \
        if (st_ != MGT_OK)                                                        \
            fail_msg("%s: %s: %s", #call, mgt_status_str(st_), mgt_error_last()); \
    } while (0)

/* 1 in a sanitizer build (address or thread), else 0. There a learning run is for memory and
   races, not for its bar: the same code runs for fewer epochs (MGT_TEST_EPOCHS) and its result
   is held to being finite, the plain build holding it to the bar. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MGT_TEST_SANITIZED 1
#else
#define MGT_TEST_SANITIZED 0
#endif

/* Under the thread sanitizer, whose run is there for the threads' races: a case that repeats
   one threading pattern over many inputs takes fewer of them there. */
#if defined(__SANITIZE_THREAD__)
#define MGT_TEST_THREAD_SANITIZED 1
#else
#define MGT_TEST_THREAD_SANITIZED 0
#endif

/* The epochs of a learning run: n, or 1 under a sanitizer. */
#define MGT_TEST_EPOCHS(n) (MGT_TEST_SANITIZED ? 1 : (n))

/* The grey value (before clamping to 0..255) of pixel (x, y) of an image of class `cls`;
   `noise` is a fresh pseudo-random number for this pixel. */
typedef int (*mgt_test_pixel_fn)(int cls, int x, int y, uint32_t noise);

/* Makes a temp folder named after `tag` (root gets its path) and in it root/data/{train,val}/
   <class>/NNN.png: `side`x`side` grey PNGs, n_train and n_val per class. Fails the test on
   any error. */
void mgt_test_make_dataset(char *root, size_t cap, const char *tag, const char *const *classes,
                           int n_classes, int n_train, int n_val, int side, uint32_t seed,
                           mgt_test_pixel_fn pixel);

/* rm -rf root (kept when MGT_KEEP_TEST_DIR is set, to look at); 0 on success (a cmocka
   teardown's answer). */
int mgt_test_remove_tree(const char *root);

/* ---- files ---- */

/* printf into one of eight rotating 4096-byte buffers: a path built inline, good for the next
   seven calls (MGT_TEST_HOLD keeps one longer). */
const char *mgt_test_path(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* char name[4096] = the formatted path, in the caller's frame; a longer one fails the test. */
#define MGT_TEST_HOLD(name, ...)                                         \
    char name[4096];                                                     \
    if ((size_t)snprintf(name, sizeof name, __VA_ARGS__) >= sizeof name) \
    fail_msg("path too long")

/* mkdir -p path, and the same for the folder path is in. */
void mgt_test_mkdirs(const char *path);
void mgt_test_parent_dirs(const char *path);
/* Writes n bytes to path, making its folders first; fails the test on any error. */
void mgt_test_write_file(const char *path, const void *p, size_t n);
/* The whole file, malloc'd with a spare byte, its size in *n; fails the test when it cannot
   be read. */
uint8_t *mgt_test_read_file(const char *path, size_t *n);

/* Convolution kernels one training forward of resnet20 (4 classes, 1x12x12) runs on a device:
   the count a test's fault=kernel@D:N aims past. */
int mgt_test_convs_per_forward(void);

/* Mock devices 0..n-1 with the options in spec; fails the test when they cannot be opened. */
mgt_devset *mgt_test_open_mock(int n, const char *spec);

/* Whether a test's CUDA part must skip here: says why (the CUDA runtime's own reason) and
   returns true, for the caller to skip(); under MGT_REQUIRE_CUDA=1 (tools/gpu-check.sh) it
   fails the running test instead, so that a GPU run cannot pass by skipping. */
bool mgt_test_cuda_unavailable(const char *what);

/* Where progress lines go: nowhere, or stdout when MGT_TEST_VERBOSE is set. */
FILE *mgt_test_quiet(void);

/* The Python that the interop tests call: MGT_TEST_PYTHON, else Debian's /usr/bin/python3
   (whose python3-torch and python3-torchvision `scripts/setup.sh --test` installs). */
const char *mgt_test_python(void);
/* Whether that Python imports `module` (asked once per module name and process). */
bool mgt_test_python_has(const char *module);
/* Skips the running test for want of `what`, saying so, where scripts/setup.sh --test would
   have installed it; under the test command (MGT_TEST_REQUIRE_DEPS=1, set by
   scripts/test.sh) that skip is a failure instead: a test that needs what the setup installs
   must run there, not pass as skipped. */
void mgt_test_skip_missing(const char *test, const char *what);

#endif
