/* Streams and events on mock devices: order within a stream, waits across streams and devices, a missing wait caught by the delay option, event queries and timing, aborted host waits, and frees that hand memory back only after the pending work. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "support/fixture.h"

#include "mgt/device.h"

static float *dev_floats(mgt_device *d, size_t n, mgt_buffer **b)
{
    CHECK(mgt_buffer_alloc(d, n * sizeof(float), b));
    return mgt_buffer_ptr(*b);
}

static void sleep_ms(double ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(fmod(ms, 1000) * 1e6)};
    nanosleep(&ts, NULL);
}

/* ---- order within a stream ---- */

/* Copies, kernels and memsets interleave on one stream under random delays; every result
   depends on the op before it, so any reordering changes the numbers. */
static void test_order_within_stream(void **state)
{
    (void)state;
    mgt_devset *set = mgt_test_open_mock(1, "delay=300");
    mgt_device *d = mgt_devset_device(set, 0);
    mgt_stream *s;
    CHECK(mgt_stream_create(d, &s));
    enum { N = 257, ROUNDS = 48 };
    mgt_buffer *bx, *bones;
    float *x = dev_floats(d, N, &bx), *ones = dev_floats(d, N, &bones);
    CHECK(mgt_fill(s, ones, 1.0f, N));
    static float in[ROUNDS][N], out[ROUNDS][N];
    for (int r = 0; r < ROUNDS; r++)
        for (int i = 0; i < N; i++)
            in[r][i] = (float)(r * 7 + i % 13) * 0.25f;
    for (int r = 0; r < ROUNDS; r++) {
        if (r % 4 == 3)
            CHECK(mgt_memset(s, x, 0, N * sizeof(float))); /* overwritten by the copy next */
        CHECK(mgt_copy_h2d(s, x, in[r], sizeof in[r]));
        CHECK(mgt_scale(s, x, 2.0f, N));
        CHECK(mgt_axpy(s, x, 1.0f, ones, N));
        CHECK(mgt_copy_d2h(s, out[r], x, sizeof out[r]));
    }
    /* a chain that does not commute: v = 3v - 1, twelve times from 1 */
    CHECK(mgt_fill(s, x, 1.0f, N));
    for (int r = 0; r < 12; r++) {
        CHECK(mgt_scale(s, x, 3.0f, N));
        CHECK(mgt_axpy(s, x, -1.0f, ones, N));
    }
    float chain[N];
    CHECK(mgt_copy_d2h(s, chain, x, sizeof chain));
    CHECK(mgt_stream_synchronize(s, NULL));
    for (int r = 0; r < ROUNDS; r++)
        for (int i = 0; i < N; i++)
            if (out[r][i] != 2.0f * in[r][i] + 1.0f)
                fail_msg("round %d element %d: got %g expected %g", r, i, (double)out[r][i],
                         (double)(2.0f * in[r][i] + 1.0f));
    float v = 1.0f;
    for (int r = 0; r < 12; r++)
        v = v * 3.0f - 1.0f;
    for (int i = 0; i < N; i++)
        assert_true(chain[i] == v);
    mgt_buffer_free(bx);
    mgt_buffer_free(bones);
    mgt_stream_free(s);
    mgt_devset_free(set);
}

/* ---- waits across streams ---- */

/* Two streams of one device pass a buffer back and forth, each waiting on the other's event:
   A writes and doubles, B adds one and hands it back, five times. */
static void test_cross_stream_wait(void **state)
{
    (void)state;
    mgt_devset *set = mgt_test_open_mock(1, "delay=1500");
    mgt_device *d = mgt_devset_device(set, 0);
    mgt_stream *a, *b;
    mgt_event *ea, *eb;
    CHECK(mgt_stream_create(d, &a));
    CHECK(mgt_stream_create(d, &b));
    CHECK(mgt_event_create(d, &ea));
    CHECK(mgt_event_create(d, &eb));
    enum { N = 1000 };
    mgt_buffer *bx, *bones;
    float *x = dev_floats(d, N, &bx), *ones = dev_floats(d, N, &bones);
    CHECK(mgt_fill(b, ones, 1.0f, N));
    CHECK(mgt_event_record(eb, b));
    static float host[N], out[N];
    for (int i = 0; i < N; i++)
        host[i] = (float)i;
    CHECK(mgt_stream_wait_event(a, eb));
    CHECK(mgt_copy_h2d(a, x, host, sizeof host));
    for (int round = 0; round < 5; round++) {
        CHECK(mgt_scale(a, x, 2.0f, N));
        CHECK(mgt_event_record(ea, a));
        CHECK(mgt_stream_wait_event(b, ea));
        CHECK(mgt_axpy(b, x, 1.0f, ones, N));
        CHECK(mgt_event_record(eb, b));
        CHECK(mgt_stream_wait_event(a, eb));
    }
    CHECK(mgt_copy_d2h(a, out, x, sizeof out));
    CHECK(mgt_stream_synchronize(a, NULL));
    for (int i = 0; i < N; i++) {
        float e = host[i];
        for (int round = 0; round < 5; round++)
            e = e * 2.0f + 1.0f;
        if (out[i] != e)
            fail_msg("element %d: got %g expected %g", i, (double)out[i], (double)e);
    }
    mgt_event_free(ea);
    mgt_event_free(eb);
    mgt_buffer_free(bx);
    mgt_buffer_free(bones);
    mgt_stream_free(a);
    mgt_stream_free(b);
    mgt_devset_free(set);
}

/* Device 0 writes through host memory, device 1 reads it after waiting on device 0's event:
   the only thing ordering the read is the cross-device wait. */
static void test_cross_device_wait(void **state)
{
    (void)state;
    mgt_devset *set = mgt_test_open_mock(2, "delay=1500");
    mgt_device *d0 = mgt_devset_device(set, 0), *d1 = mgt_devset_device(set, 1);
    mgt_stream *a, *b;
    mgt_event *e;
    CHECK(mgt_stream_create(d0, &a));
    CHECK(mgt_stream_create(d1, &b));
    CHECK(mgt_event_create(d0, &e));
    enum { N = 4096 };
    mgt_buffer *b0, *b1, *bpad;
    float *x0 = dev_floats(d0, N, &b0), *x1 = dev_floats(d1, N, &b1);
    float *pad = dev_floats(d0, 16, &bpad);
    float *host;
    CHECK(mgt_host_alloc(d0, N * sizeof(float), (void **)&host));
    static float out[N];
    /* an event records only on a stream of its own device */
    assert_int_equal(mgt_event_record(e, b), MGT_ERR_INVALID);
    /* waiting on an event never recorded is no wait at all */
    mgt_event *fresh;
    CHECK(mgt_event_create(d0, &fresh));
    CHECK(mgt_stream_wait_event(b, fresh));
    CHECK(mgt_stream_synchronize(b, NULL));
    mgt_event_free(fresh);
    for (int trial = 0; trial < 4; trial++) {
        float v = 3.0f + trial;
        memset(host, 0, N * sizeof(float));
        for (int k = 0; k < 10; k++) /* make device 0's write late */
            CHECK(mgt_scale(a, pad, 1.0f, 16));
        CHECK(mgt_fill(a, x0, v, N));
        CHECK(mgt_copy_d2h(a, host, x0, N * sizeof(float)));
        CHECK(mgt_event_record(e, a));
        CHECK(mgt_stream_wait_event(b, e));
        CHECK(mgt_copy_h2d(b, x1, host, N * sizeof(float)));
        CHECK(mgt_scale(b, x1, 2.0f, N));
        CHECK(mgt_copy_d2h(b, out, x1, sizeof out));
        CHECK(mgt_stream_synchronize(b, NULL));
        for (int i = 0; i < N; i++)
            if (out[i] != 2.0f * v)
                fail_msg("trial %d element %d: got %g expected %g", trial, i, (double)out[i],
                         (double)(2.0f * v));
        CHECK(mgt_stream_synchronize(a, NULL));
    }
    mgt_host_free(d0, host);
    mgt_event_free(e);
    mgt_buffer_free(b0);
    mgt_buffer_free(b1);
    mgt_buffer_free(bpad);
    mgt_stream_free(a);
    mgt_stream_free(b);
    mgt_devset_free(set);
}

/* A wait holds on to the record that was latest when it was made: recording the same event
   again on another, idle stream afterwards must not release it (CUDA's semantics; a mock
   that keeps only the highest completed record would let the waiter run early). */
static void test_wait_captures_record(void **state)
{
    (void)state;
    mgt_devset *set = mgt_test_open_mock(1, "delay=3000");
    mgt_device *d = mgt_devset_device(set, 0);
    mgt_stream *slow, *idle, *waiter;
    mgt_event *e;
    CHECK(mgt_stream_create(d, &slow));
    CHECK(mgt_stream_create(d, &idle));
    CHECK(mgt_stream_create(d, &waiter));
    CHECK(mgt_event_create(d, &e));
    enum { N = 64 };
    mgt_buffer *bx, *bpad;
    float *x = dev_floats(d, N, &bx), *pad = dev_floats(d, N, &bpad);
    CHECK(mgt_fill(slow, x, 0.0f, N));
    CHECK(mgt_stream_synchronize(slow, NULL));
    for (int k = 0; k < 40; k++) /* about 60 ms */
        CHECK(mgt_fill(slow, pad, (float)k, N));
    CHECK(mgt_fill(slow, x, 1.0f, N));
    CHECK(mgt_event_record(e, slow));
    CHECK(mgt_stream_wait_event(waiter, e)); /* captures the record on `slow` */
    CHECK(mgt_event_record(e, idle));        /* a later record, done almost at once */
    float out[N];
    CHECK(mgt_copy_d2h(waiter, out, x, sizeof out));
    CHECK(mgt_stream_synchronize(waiter, NULL));
    for (int i = 0; i < N; i++)
        if (out[i] != 1.0f)
            fail_msg("the waiting stream ran before the record it waited for (element %d is "
                     "%g): a later record of the event on another stream released it",
                     i, (double)out[i]);
    CHECK(mgt_stream_synchronize(slow, NULL));
    mgt_buffer_free(bx);
    mgt_buffer_free(bpad);
    mgt_event_free(e);
    mgt_stream_free(slow);
    mgt_stream_free(idle);
    mgt_stream_free(waiter);
    mgt_devset_free(set);
}

/* ---- the delay option catches a missing wait ---- */

/* Stream A runs 60 delayed padding ops (about 150 ms at delay=5000) before it writes x;
   stream B reads x at once. Without a wait B sees the old contents: B's single op is due
   after at most 5 ms, A's write after the sum of 61 random delays, so the race is decided by
   a margin of two orders of magnitude, not by luck. With the wait B always sees the write. */
static int race_trial(mgt_devset *set, bool with_wait)
{
    mgt_device *d = mgt_devset_device(set, 0);
    mgt_stream *a, *b;
    mgt_event *e;
    CHECK(mgt_stream_create(d, &a));
    CHECK(mgt_stream_create(d, &b));
    CHECK(mgt_event_create(d, &e));
    enum { N = 64 };
    mgt_buffer *bx, *bpad;
    float *x = dev_floats(d, N, &bx), *pad = dev_floats(d, N, &bpad);
    CHECK(mgt_fill(a, x, 0.0f, N));
    CHECK(mgt_fill(a, pad, 0.0f, N));
    CHECK(mgt_stream_synchronize(a, NULL));
    float out[N];
    for (int k = 0; k < 60; k++)
        CHECK(mgt_scale(a, pad, 1.0f, N));
    CHECK(mgt_fill(a, x, 1.0f, N));
    CHECK(mgt_event_record(e, a));
    if (with_wait)
        CHECK(mgt_stream_wait_event(b, e));
    CHECK(mgt_copy_d2h(b, out, x, sizeof out));
    CHECK(mgt_stream_synchronize(b, NULL));
    CHECK(mgt_stream_synchronize(a, NULL));
    int stale = 0;
    for (int i = 0; i < N; i++)
        stale += out[i] != 1.0f;
    mgt_event_free(e);
    mgt_buffer_free(bx);
    mgt_buffer_free(bpad);
    mgt_stream_free(a);
    mgt_stream_free(b);
    return stale;
}

static void test_missing_wait_is_caught(void **state)
{
    (void)state;
    mgt_devset *set = mgt_test_open_mock(1, "delay=5000");
    int raced = 0;
    for (int t = 0; t < 3; t++)
        raced += race_trial(set, false) > 0;
    for (int t = 0; t < 3; t++) {
        int stale = race_trial(set, true);
        if (stale)
            fail_msg("with the wait, trial %d still read %d stale elements", t, stale);
    }
    mgt_devset_free(set);
    if (!raced)
        fail_msg("without the wait, no trial read stale data: the delay option did not "
                 "expose the missing synchronisation");
    print_message("missing wait read stale data in %d of 3 trials\n", raced);
}

/* ---- event query and elapsed time ---- */

static void test_event_query_elapsed(void **state)
{
    (void)state;
    mgt_devset *set = mgt_test_open_mock(1, "delay=5000");
    mgt_device *d = mgt_devset_device(set, 0);
    mgt_stream *s;
    mgt_event *e0, *e1, *never;
    CHECK(mgt_stream_create(d, &s));
    CHECK(mgt_event_create(d, &e0));
    CHECK(mgt_event_create(d, &e1));
    CHECK(mgt_event_create(d, &never));
    bool done = false;
    CHECK(mgt_event_query(never, &done));
    assert_true(done); /* a never-recorded event is complete */
    CHECK(mgt_event_synchronize(never, NULL));

    mgt_buffer *bx;
    float *x = dev_floats(d, 16, &bx);
    double t0 = mgt_time_now();
    CHECK(mgt_event_record(e0, s));
    for (int k = 0; k < 40; k++) /* about 100 ms of delays */
        CHECK(mgt_fill(s, x, (float)k, 16));
    CHECK(mgt_event_record(e1, s));
    CHECK(mgt_event_query(e1, &done));
    assert_false(done);
    float ms = 0;
    assert_int_not_equal(mgt_event_elapsed_ms(e0, e1, &ms), MGT_OK); /* e1 has not run */
    CHECK(mgt_event_synchronize(e1, NULL));
    double wall_ms = (mgt_time_now() - t0) * 1e3;
    CHECK(mgt_event_query(e1, &done));
    assert_true(done);
    CHECK(mgt_event_query(e0, &done));
    assert_true(done);
    CHECK(mgt_event_elapsed_ms(e0, e1, &ms));
    /* 41 delays of 0..5 ms: far above 10 ms unless the delays did not happen */
    if (!(ms > 10.0f && ms <= wall_ms + 1.0))
        fail_msg("elapsed %g ms between the events, %g ms on the host clock", (double)ms, wall_ms);
    /* re-recording moves the event: it is pending again until the new record runs */
    CHECK(mgt_fill(s, x, 1.0f, 16));
    CHECK(mgt_fill(s, x, 2.0f, 16));
    CHECK(mgt_event_record(e1, s));
    CHECK(mgt_event_synchronize(e1, NULL));
    CHECK(mgt_event_elapsed_ms(e0, e1, &ms));
    assert_true(ms > 0);
    mgt_buffer_free(bx);
    mgt_event_free(e0);
    mgt_event_free(e1);
    mgt_event_free(never);
    mgt_stream_free(s);
    mgt_devset_free(set);
}

/* ---- abort of a blocked host wait ---- */

typedef struct raiser {
    mgt_abort *flag;
    double after_ms;
    double raised_at;
} raiser;

static void *raise_later(void *arg)
{
    raiser *r = arg;
    sleep_ms(r->after_ms);
    r->raised_at = mgt_time_now();
    mgt_abort_raise(r->flag);
    return NULL;
}

enum { WAIT_STREAM, WAIT_EVENT, WAIT_DEVICE };

/* A queue of about a second of delayed work; another thread raises the flag after 50 ms; the
   host wait must give up with MGT_ERR_ABORTED within 300 ms of that, long before the queue
   drains (100 ms was missed by 5 ms on 2 cores under a load of 21: a bound on the scheduler,
   not on the wait). */
static void abort_case(int which)
{
    mgt_devset *set = mgt_test_open_mock(1, "delay=5000");
    mgt_device *d = mgt_devset_device(set, 0);
    mgt_stream *s;
    mgt_event *e;
    CHECK(mgt_stream_create(d, &s));
    CHECK(mgt_event_create(d, &e));
    mgt_buffer *bx;
    float *x = dev_floats(d, 16, &bx);
    for (int k = 0; k < 200; k++)
        CHECK(mgt_fill(s, x, (float)k, 16));
    CHECK(mgt_event_record(e, s));
    mgt_abort flag = {0};
    raiser r = {&flag, 50, 0};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, raise_later, &r), 0);
    mgt_status st = which == WAIT_STREAM  ? mgt_stream_synchronize(s, &flag)
                    : which == WAIT_EVENT ? mgt_event_synchronize(e, &flag)
                                          : mgt_device_synchronize(d, &flag);
    double left_at = mgt_time_now();
    pthread_join(t, NULL);
    static const char *const names[] = {"stream", "event", "device"};
    if (st != MGT_ERR_ABORTED)
        fail_msg("%s wait returned %s (%s), not aborted", names[which], mgt_status_str(st),
                 mgt_error_last());
    double late_ms = (left_at - r.raised_at) * 1e3;
    if (late_ms > 300)
        fail_msg("%s wait left %.1f ms after the abort flag was raised", names[which], late_ms);
    /* the abort leaves the device usable: the queue still drains */
    bool done = true;
    CHECK(mgt_event_query(e, &done));
    assert_false(done);
    CHECK(mgt_stream_synchronize(s, NULL));
    mgt_buffer_free(bx);
    mgt_event_free(e);
    mgt_stream_free(s);
    mgt_devset_free(set);
}

static void test_abort_stream_wait(void **state)
{
    (void)state;
    abort_case(WAIT_STREAM);
}

static void test_abort_event_wait(void **state)
{
    (void)state;
    abort_case(WAIT_EVENT);
}

static void test_abort_device_wait(void **state)
{
    (void)state;
    abort_case(WAIT_DEVICE);
}

/* ---- frees wait for pending work ---- */

/* Freeing a stream with delayed work queued runs that work first: the host array its last
   copy writes is complete when mgt_stream_free returns. */
static void test_stream_free_waits(void **state)
{
    (void)state;
    mgt_devset *set = mgt_test_open_mock(1, "delay=2000");
    mgt_device *d = mgt_devset_device(set, 0);
    mgt_stream *s;
    CHECK(mgt_stream_create(d, &s));
    enum { N = 512 };
    mgt_buffer *bx;
    float *x = dev_floats(d, N, &bx);
    static float out[N];
    for (int k = 0; k < 20; k++)
        CHECK(mgt_fill(s, x, (float)k, N));
    CHECK(mgt_fill(s, x, 7.0f, N));
    CHECK(mgt_copy_d2h(s, out, x, sizeof out));
    mgt_stream_free(s);
    for (int i = 0; i < N; i++)
        assert_true(out[i] == 7.0f);
    mgt_buffer_free(bx);
    mgt_devset_free(set);
}

/* Freeing a buffer with delayed kernels queued on it does not wait for them, and hands the
   memory back only after them: a kernel writing freed memory is what the address sanitizer
   reports. (test_devices: a free also waits out other devices' streams.) */
static void test_buffer_free_is_deferred(void **state)
{
    (void)state;
    mgt_devset *set = mgt_test_open_mock(1, "delay=2000");
    mgt_device *d = mgt_devset_device(set, 0);
    mgt_stream *s;
    mgt_event *e;
    CHECK(mgt_stream_create(d, &s));
    CHECK(mgt_event_create(d, &e));
    size_t used0, used;
    mgt_device_memory(d, &used0, NULL);
    mgt_buffer *bx;
    float *x = dev_floats(d, 1 << 16, &bx);
    for (int k = 0; k < 20; k++)
        CHECK(mgt_fill(s, x, (float)k, 1 << 16));
    CHECK(mgt_event_record(e, s));
    mgt_buffer_free(bx);
    bool done = true;
    CHECK(mgt_event_query(e, &done));
    assert_false(done); /* the free did not wait for the 20 delayed fills */
    CHECK(mgt_stream_synchronize(s, NULL));
    mgt_device_memory(d, &used, NULL);
    assert_int_equal(used, used0); /* back once the stream passed the free */
    mgt_event_free(e);
    mgt_stream_free(s);
    mgt_devset_free(set);
}

/* The set's free waits for all work and frees the streams and events still open (the leak
   sanitizer reports any it forgets). The queued work is events only: a buffer freed by its
   owner would drain the queue first. */
static void test_devset_free_frees_leftovers(void **state)
{
    (void)state;
    mgt_devset *set = mgt_test_open_mock(2, "delay=1000");
    for (int i = 0; i < 2; i++) {
        mgt_device *d = mgt_devset_device(set, i);
        mgt_stream *s1, *s2;
        mgt_event *e1, *e2;
        CHECK(mgt_stream_create(d, &s1));
        CHECK(mgt_stream_create(d, &s2));
        CHECK(mgt_event_create(d, &e1));
        CHECK(mgt_event_create(d, &e2));
        for (int k = 0; k < 10; k++)
            CHECK(mgt_event_record(e1, s1));
        CHECK(mgt_stream_wait_event(s2, e1));
        CHECK(mgt_event_record(e2, s2));
    }
    double t0 = mgt_time_now();
    mgt_devset_free(set);
    print_message("devset free with queued work took %.1f ms\n", (mgt_time_now() - t0) * 1e3);
}

/* An argument picks the tests to run by name pattern (cmocka's filter), e.g. '*peer*'. */
int main(int argc, char **argv)
{
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_within_stream),
        cmocka_unit_test(test_cross_stream_wait),
        cmocka_unit_test(test_cross_device_wait),
        cmocka_unit_test(test_wait_captures_record),
        cmocka_unit_test(test_missing_wait_is_caught),
        cmocka_unit_test(test_event_query_elapsed),
        cmocka_unit_test(test_abort_stream_wait),
        cmocka_unit_test(test_abort_event_wait),
        cmocka_unit_test(test_abort_device_wait),
        cmocka_unit_test(test_stream_free_waits),
        cmocka_unit_test(test_buffer_free_is_deferred),
        cmocka_unit_test(test_devset_free_frees_leftovers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
