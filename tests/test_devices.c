/* Mock devices: the options spelling (and its errors, through every command that takes it), the peer-access matrix and peer copies with and without it, the memory limit, injected allocation, kernel, hang, peer-copy, device-gone and 16-bit refusal faults, bounded and abortable waits, abandoned devices, deferred frees, ordering-only events, and pointer validation. */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "support/fixture.h"

#include "app/app.h"
#include "device/lowp.h"
#include "mgt/device.h"

/* The call must be refused with `want` and error text that contains `needle`. */
#define EXPECT_FAIL(call, want, needle)                                                     \
    do {                                                                                    \
        mgt_status st_ = (call);                                                            \
        if (st_ != (want))                                                                  \
            fail_msg("%s: returned %s (%s), expected %s", #call, mgt_status_str(st_),       \
                     mgt_error_last(), mgt_status_str(want));                               \
        if (!strstr(mgt_error_last(), (needle)))                                            \
            fail_msg("%s: error text \"%s\" does not name \"%s\"", #call, mgt_error_last(), \
                     (needle));                                                             \
    } while (0)

/* ---- the options spelling ---- */

static mgt_mock_options parsed(const char *spec)
{
    mgt_mock_options o;
    memset(&o, 0x5a, sizeof o); /* parse must reset everything it does not set */
    mgt_status st = mgt_mock_options_parse(&o, spec);
    if (st != MGT_OK)
        fail_msg("'%s' refused: %s", spec ? spec : "(null)", mgt_error_last());
    return o;
}

static void assert_defaults_except(const mgt_mock_options *o, const char *which)
{
    if (!strstr(which, "threads"))
        assert_int_equal(o->threads_per_device, 0);
    if (!strstr(which, "mem"))
        assert_int_equal(o->mem_limit, 0);
    if (!strstr(which, "peers"))
        assert_int_equal(o->peer_mode, MGT_PEER_ALL);
    if (!strstr(which, "fault"))
        assert_int_equal(o->fault[0].kind, MGT_FAULT_NONE);
    if (!strstr(which, "delay"))
        assert_int_equal(o->delay_us, 0);
    if (!strstr(which, "conv"))
        assert_false(o->conv_im2col);
    if (!strstr(which, "layout")) {
        assert_false(o->layout_nchw);
        assert_false(o->layout_blocked);
    }
}

static void test_options_accepted(void **state)
{
    (void)state;
    mgt_mock_options o = parsed(NULL);
    assert_defaults_except(&o, "");
    o = parsed("");
    assert_defaults_except(&o, "");

    o = parsed("threads=4");
    assert_int_equal(o.threads_per_device, 4);
    assert_defaults_except(&o, "threads");

    static const struct {
        const char *spec;
        size_t bytes;
    } sizes[] = {{"mem=512M", 512ull << 20},
                 {"mem=8G", 8ull << 30},
                 {"mem=4096K", 4096ull << 10},
                 {"mem=1M", 1ull << 20},
                 {"mem=1048577", 1048577}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        o = parsed(sizes[i].spec);
        if (o.mem_limit != sizes[i].bytes)
            fail_msg("'%s' gave %zu bytes, expected %zu", sizes[i].spec, o.mem_limit,
                     sizes[i].bytes);
        assert_defaults_except(&o, "mem");
    }

    o = parsed("peers=all");
    assert_int_equal(o.peer_mode, MGT_PEER_ALL);
    o = parsed("peers=none");
    assert_int_equal(o.peer_mode, MGT_PEER_NONE);
    o = parsed("peers=0-1,2-3");
    assert_int_equal(o.peer_mode, MGT_PEER_LIST);
    assert_true(o.peer[0][1] || o.peer[1][0]);
    assert_true(o.peer[2][3] || o.peer[3][2]);
    assert_false(o.peer[0][2] || o.peer[2][0] || o.peer[1][3] || o.peer[0][3]);
    assert_defaults_except(&o, "peers");

    o = parsed("fault=alloc@1:3");
    assert_int_equal(o.fault[0].kind, MGT_FAULT_ALLOC);
    assert_int_equal(o.fault[0].device, 1);
    assert_int_equal(o.fault[0].nth, 3);
    o = parsed("fault=kernel@0:2");
    assert_int_equal(o.fault[0].kind, MGT_FAULT_KERNEL);
    assert_int_equal(o.fault[0].device, 0);
    assert_int_equal(o.fault[0].nth, 2);
    assert_defaults_except(&o, "fault");
    o = parsed("fault=hang@1:4:axpy");
    assert_int_equal(o.fault[0].kind, MGT_FAULT_HANG);
    assert_int_equal(o.fault[0].device, 1);
    assert_int_equal(o.fault[0].nth, 4);
    assert_string_equal(o.fault[0].op, "axpy");
    o = parsed("fault=lowp@0:2:no_kernel,fault");
    assert_int_equal(o.fault[0].kind, MGT_FAULT_LOWP);
    assert_int_equal(o.fault[0].nth, 2);
    assert_int_equal(o.fault[0].nrefusals, 2);
    assert_int_not_equal(o.fault[0].refusals[0], o.fault[0].refusals[1]);

    o = parsed("delay=2000");
    assert_int_equal(o.delay_us, 2000);
    assert_defaults_except(&o, "delay");
    o = parsed("seed=42");
    assert_int_equal(o.seed, 42);
    assert_defaults_except(&o, "seed");
    o = parsed("conv=im2col");
    assert_true(o.conv_im2col);
    assert_defaults_except(&o, "conv");
    o = parsed("conv=onednn");
    assert_defaults_except(&o, "");
    o = parsed("layout=nchw");
    assert_true(o.layout_nchw);
    assert_defaults_except(&o, "layout");
    o = parsed("layout=blocked");
    assert_true(o.layout_blocked);
    assert_false(o.layout_nchw);
    assert_defaults_except(&o, "layout");
    /* where no layout is named, the commands' pick: NCHW without AVX-512F, else blocked */
    assert_false(mgt_mock_options_pick_layout(&o));
    assert_false(o.layout_nchw);
    o = parsed("conv=im2col");
    assert_false(mgt_mock_options_pick_layout(&o));
    o = parsed("threads=2");
    bool avx512 = __builtin_cpu_supports("avx512f");
    assert_int_equal(mgt_mock_options_pick_layout(&o), !avx512);
    assert_int_equal(o.layout_nchw, !avx512);

    /* several faults, each on its own device, in the order given */
    o = parsed("fault=peer@2:3;fault=gone@0:7;fault=kernel@1:1:axpy");
    assert_int_equal(o.nfaults, 3);
    assert_int_equal(o.fault[0].kind, MGT_FAULT_PEER);
    assert_int_equal(o.fault[0].device, 2);
    assert_int_equal(o.fault[0].nth, 3);
    assert_int_equal(o.fault[1].kind, MGT_FAULT_GONE);
    assert_int_equal(o.fault[1].device, 0);
    assert_int_equal(o.fault[1].nth, 7);
    assert_string_equal(o.fault[2].op, "axpy");

    o = parsed("threads=2;mem=1M;peers=none;fault=kernel@1:5;delay=100;seed=9");
    assert_int_equal(o.threads_per_device, 2);
    assert_int_equal(o.mem_limit, 1u << 20);
    assert_int_equal(o.peer_mode, MGT_PEER_NONE);
    assert_int_equal(o.fault[0].kind, MGT_FAULT_KERNEL);
    assert_int_equal(o.fault[0].device, 1);
    assert_int_equal(o.fault[0].nth, 5);
    assert_int_equal(o.delay_us, 100);
    assert_int_equal(o.seed, 9);
}

/* Each bad spelling is refused with MGT_ERR_INVALID and a message that quotes the item. */
static void test_options_rejected(void **state)
{
    (void)state;
    static const struct {
        const char *spec, *item;
    } bad[] = {
        {"threads=0", "threads=0"},
        {"threads=abc", "threads=abc"},
        {"threads=-2", "threads=-2"},
        {"threads=", "threads="},
        {"threads", "threads"},
        {"mem=12X", "mem=12X"},
        {"mem=", "mem="},
        {"mem=M", "mem=M"},
        {"peers=0-", "peers=0-"},
        {"peers=foo", "peers=foo"},
        {"peers=1-1", "peers=1-1"},
        {"fault=disk@0:1", "fault=disk@0:1"},
        {"fault=alloc@0:0", "fault=alloc@0:0"},
        {"fault=alloc@x:1", "fault=alloc@x:1"},
        {"fault=kernel", "fault=kernel"},
        {"fault=kernel@0", "fault=kernel@0"},
        {"fault=lowp@0:1", "fault=lowp@0:1"},
        {"fault=lowp@0:1:maybe", "fault=lowp@0:1:maybe"},
        {"fault=lowp@0:1:no_kernel,,fault", "fault=lowp@0:1:no_kernel,,fault"},
        {"fault=alloc@0:1:axpy", "fault=alloc@0:1:axpy"},
        {"fault=peer@0:1:axpy", "fault=peer@0:1:axpy"},
        {"fault=gone@1:0", "fault=gone@1:0"},
        {"fault=kernel@1:2;fault=gone@1:3", "fault=gone@1:3"}, /* one fault per device */
        {"fault=gone@0:1;fault=gone@1:1;fault=gone@2:1;fault=gone@3:1;fault=gone@4:1",
         "fault=gone@4:1"},
        {"delay=-5", "delay=-5"},
        {"delay=abc", "delay=abc"},
        {"seed=x", "seed=x"},
        {"conv=fft", "conv=fft"},
        {"layout=nhwc", "layout=nhwc"},
        {"bogus=1", "bogus=1"},
        {"threads=2;bogus=1", "bogus=1"},
        {"mem=1M;peers=0-1;fault=alloc@1:x", "fault=alloc@1:x"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mgt_mock_options o;
        mgt_error_clear();
        mgt_status st = mgt_mock_options_parse(&o, bad[i].spec);
        if (st != MGT_ERR_INVALID)
            fail_msg("'%s' gave %s, expected invalid argument", bad[i].spec, mgt_status_str(st));
        if (!strstr(mgt_error_last(), bad[i].item))
            fail_msg("'%s': the message \"%s\" does not name the item '%s'", bad[i].spec,
                     mgt_error_last(), bad[i].item);
    }
}

/* ---- the peer-access matrix and peer copies ---- */

static void test_peer_matrix(void **state)
{
    (void)state;
    static const char *const specs[] = {"peers=all", "peers=none", "peers=0-1,2-3"};
    for (int m = 0; m < 3; m++) {
        mgt_devset *set = mgt_test_open_mock(4, specs[m]);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) {
                if (i == j)
                    continue;
                bool want = m == 0 || (m == 2 && i / 2 == j / 2);
                if (mgt_devset_can_access_peer(set, i, j) != want)
                    fail_msg("%s: can_access_peer(%d, %d) is %d, expected %d", specs[m], i, j,
                             !want, want);
            }
        mgt_devset_free(set);
    }
}

/* --no-p2p: every pair staged whatever the backend allows, copies still arrive whole, and the
   copy rate is measured either way; with the link model a direct pair is never faster than
   the link. */
static void test_no_p2p_and_copy_rate(void **state)
{
    (void)state;
    mgt_mock_options mo;
    assert_int_equal(mgt_mock_options_parse(&mo, "threads=1;peers=all;link=1GB/s,0us"), MGT_OK);
    int ids[] = {0, 1, 2};
    for (int staged = 0; staged < 2; staged++) {
        mgt_devset_options o = {.mock = &mo, .no_p2p = staged == 1};
        mgt_devset *set = NULL;
        CHECK(mgt_devset_open(MGT_DEVICE_MOCK, ids, 3, &o, &set));
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++)
                if (i != j && mgt_devset_can_access_peer(set, i, j) != !staged)
                    fail_msg("no_p2p %d: can_access_peer(%d, %d) is %d", staged, i, j,
                             !staged ? 0 : 1);
        size_t n = (1u << 20) + 7;
        mgt_buffer *a = NULL, *b = NULL;
        mgt_stream *sa = NULL, *sb = NULL;
        CHECK(mgt_buffer_alloc(mgt_devset_device(set, 0), n, &a));
        CHECK(mgt_buffer_alloc(mgt_devset_device(set, 2), n, &b));
        CHECK(mgt_stream_create(mgt_devset_device(set, 0), &sa));
        CHECK(mgt_stream_create(mgt_devset_device(set, 2), &sb));
        unsigned char *want = malloc(n), *got = malloc(n);
        assert_non_null(want);
        assert_non_null(got);
        for (size_t k = 0; k < n; k++)
            want[k] = (unsigned char)(k * 7 + 3);
        CHECK(mgt_copy_h2d(sa, mgt_buffer_ptr(a), want, n));
        CHECK(mgt_copy_peer(sb, mgt_buffer_ptr(b), sa, mgt_buffer_ptr(a), n));
        CHECK(mgt_copy_d2h(sb, got, mgt_buffer_ptr(b), n));
        CHECK(mgt_stream_synchronize(sb, NULL));
        assert_memory_equal(want, got, n);
        double rate = 0;
        CHECK(mgt_devset_copy_rate(set, 1, 0, 4u << 20, 2, &rate));
        if (!(rate > 0) || (!staged && rate > 1.05e9))
            fail_msg("no_p2p %d: copy rate %.3g B/s (a 1 GB/s link: > 0, and at most the "
                     "link's rate when direct)",
                     staged, rate);
        mgt_error_clear();
        assert_int_equal(mgt_devset_copy_rate(set, 1, 1, 4096, 1, &rate), MGT_ERR_INVALID);
        free(want);
        free(got);
        mgt_stream_free(sa);
        mgt_stream_free(sb);
        mgt_buffer_free(a);
        mgt_buffer_free(b);
        mgt_devset_free(set);
    }
}

/* A byte pattern that differs at every offset, so a chunk copied to the wrong place shows;
   made a word at a time, since the sanitizer builds pay per instrumented store. */
static void fill_bytes(unsigned char *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i += 4) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        memcpy(p + i, &x, n - i < 4 ? n - i : 4);
    }
}

#define PEER_GUARD 64

typedef struct peer_job {
    int src, dst;
    mgt_buffer *sbuf, *dbuf;
    mgt_event *after_src; /* recorded on the source stream after the copy */
    /* the destination buffer whole, guards included: read in order on the destination's
       stream (got) and on another stream that waits for after_src (got2) */
    unsigned char *want, *got, *got2;
} peer_job;

/* Copies between devices at odd offsets with guard bytes around the destination, several in
   flight at once (both directions of a pair, one source to two destinations, so staging
   slots are reused); right after each copy the source is overwritten on its own stream, which
   must not reach the destination because later work on the source stream runs after the
   copy. A third stream that waits for an event recorded on the source stream after the copy
   must also see it complete (work enqueued later on either stream runs after the copy).
   Every job's bytes must arrive exactly and nothing around them may change. */
static void peer_round(const char *spec, const size_t *sizes, int nsizes)
{
    size_t max = 0;
    for (int i = 0; i < nsizes; i++)
        max = sizes[i] > max ? sizes[i] : max;
    mgt_devset *set = mgt_test_open_mock(4, spec);
    mgt_stream *s[4], *reader[4];
    mgt_buffer *pad[4];
    for (int i = 0; i < 4; i++) {
        CHECK(mgt_stream_create(mgt_devset_device(set, i), &s[i]));
        CHECK(mgt_stream_create(mgt_devset_device(set, i), &reader[i]));
        CHECK(mgt_buffer_alloc(mgt_devset_device(set, i), 64, &pad[i]));
    }
    peer_job jobs[] = {{.src = 0, .dst = 1},
                       {.src = 1, .dst = 0},
                       {.src = 0, .dst = 2},
                       {.src = 2, .dst = 3},
                       {.src = 3, .dst = 1}};
    enum { NJ = sizeof jobs / sizeof jobs[0] };
    /* allocated once for the largest size: fresh pages cost more than the copies */
    for (int j = 0; j < NJ; j++) {
        peer_job *p = &jobs[j];
        mgt_device *sd = mgt_devset_device(set, p->src), *dd = mgt_devset_device(set, p->dst);
        CHECK(mgt_buffer_alloc(sd, max + 1, &p->sbuf));
        CHECK(mgt_buffer_alloc(dd, max + 2 * PEER_GUARD + 3, &p->dbuf));
        p->want = malloc(max);
        p->got = malloc(max + 2 * PEER_GUARD + 3);
        p->got2 = malloc(max + 2 * PEER_GUARD + 3);
        assert_non_null(p->want);
        assert_non_null(p->got);
        assert_non_null(p->got2);
        CHECK(mgt_event_create(sd, &p->after_src));
    }
    for (int z = 0; z < nsizes; z++) {
        size_t bytes = sizes[z], whole = bytes + 2 * PEER_GUARD + 3;
        for (int j = 0; j < NJ; j++) {
            peer_job *p = &jobs[j];
            fill_bytes(p->want, bytes, (uint32_t)(j * 131 + bytes));
            CHECK(mgt_copy_h2d(s[p->src], (char *)mgt_buffer_ptr(p->sbuf) + 1, p->want, bytes));
            CHECK(mgt_memset(s[p->dst], mgt_buffer_ptr(p->dbuf), 0xab, whole));
        }
        for (int j = 0; j < NJ; j++) {
            peer_job *p = &jobs[j];
            char *src = (char *)mgt_buffer_ptr(p->sbuf) + 1;
            char *dst = (char *)mgt_buffer_ptr(p->dbuf) + PEER_GUARD + 3;
            /* under a delay the destination lags the source, so a staging slot reused
               before its reader ran would be overwritten */
            for (int k = 0; k < 30; k++)
                CHECK(mgt_fill(s[p->dst], mgt_buffer_ptr(pad[p->dst]), (float)k, 16));
            CHECK(mgt_copy_peer(s[p->dst], dst, s[p->src], src, bytes));
            CHECK(mgt_memset(s[p->src], src, 0, bytes)); /* must run after the copy read */
            CHECK(mgt_event_record(p->after_src, s[p->src]));
        }
        for (int j = 0; j < NJ; j++) {
            peer_job *p = &jobs[j];
            CHECK(mgt_copy_d2h(s[p->dst], p->got, mgt_buffer_ptr(p->dbuf), whole));
            CHECK(mgt_stream_wait_event(reader[p->dst], p->after_src));
            CHECK(mgt_copy_d2h(reader[p->dst], p->got2, mgt_buffer_ptr(p->dbuf), whole));
        }
        for (int i = 0; i < 4; i++) {
            CHECK(mgt_stream_synchronize(s[i], NULL));
            CHECK(mgt_stream_synchronize(reader[i], NULL));
        }
        for (int j = 0; j < NJ; j++) {
            peer_job *p = &jobs[j];
            for (int v = 0; v < 2; v++) {
                const unsigned char *got = v ? p->got2 : p->got;
                const char *via = v ? "a stream waiting on the source" : "the destination stream";
                const unsigned char *after = got + PEER_GUARD + 3 + bytes;
                for (size_t k = 0; k < PEER_GUARD + 3; k++)
                    if (got[k] != 0xab || (k < PEER_GUARD && after[k] != 0xab))
                        fail_msg("%s: copy %d->%d of %zu bytes wrote outside its destination", spec,
                                 p->src, p->dst, bytes);
                const unsigned char *g = got + PEER_GUARD + 3;
                if (memcmp(g, p->want, bytes) != 0)
                    for (size_t k = 0; k < bytes; k++)
                        if (g[k] != p->want[k])
                            fail_msg("%s: copy %d->%d of %zu bytes, read on %s: byte %zu is "
                                     "0x%02x, expected 0x%02x",
                                     spec, p->src, p->dst, bytes, via, k, g[k], p->want[k]);
            }
        }
    }
    for (int j = 0; j < NJ; j++) {
        peer_job *p = &jobs[j];
        mgt_event_free(p->after_src);
        mgt_buffer_free(p->sbuf);
        mgt_buffer_free(p->dbuf);
        free(p->want);
        free(p->got);
        free(p->got2);
    }
    for (int i = 0; i < 4; i++) {
        mgt_buffer_free(pad[i]);
        mgt_stream_free(s[i]);
        mgt_stream_free(reader[i]);
    }
    mgt_devset_free(set);
}

static void test_peer_copies(void **state)
{
    (void)state;
    /* not multiples of any sensible staging chunk; the larger ones span two chunks, and
       three (so one copy reuses a staging slot) where every pair is staged and delayed,
       which makes the destination lag; the sanitizer builds pay dearly per megabyte */
    static const size_t sizes[] = {1, 3, 4096 + 5, (4u << 20) + 3, (8u << 20) + 5};
    static const char *const specs[] = {"peers=none;delay=300", "peers=all", "peers=0-1,2-3",
                                        "peers=none", "peers=0-1;delay=300"};
    for (int m = 0; m < (int)(sizeof specs / sizeof specs[0]); m++)
        peer_round(specs[m], sizes, m == 0 ? 5 : 4);
}

/* ---- the memory limit ---- */

static void test_memory_limit(void **state)
{
    (void)state;
    mgt_devset *set = mgt_test_open_mock(2, "mem=1M");
    mgt_device *d0 = mgt_devset_device(set, 0), *d1 = mgt_devset_device(set, 1);
    size_t used0, total0;
    mgt_device_memory(d0, &used0, &total0);
    assert_int_equal(total0, 1u << 20);
    mgt_buffer *b = NULL, *b2 = NULL, *other = NULL;
    EXPECT_FAIL(mgt_buffer_alloc(d0, 2u << 20, &b), MGT_ERR_OOM, mgt_device_name(d0));
    assert_null(b);
    size_t used;
    mgt_device_memory(d0, &used, NULL);
    assert_int_equal(used, used0); /* a refused allocation is not counted */
    CHECK(mgt_buffer_alloc(d0, 512u << 10, &b));
    mgt_device_memory(d0, &used, NULL);
    assert_int_equal(used, used0 + (512u << 10));
    EXPECT_FAIL(mgt_buffer_alloc(d0, 600u << 10, &b2), MGT_ERR_OOM, mgt_device_name(d0));
    CHECK(mgt_buffer_alloc(d1, 900u << 10, &other)); /* the limit is per device */
    mgt_buffer_free(b);
    mgt_device_memory(d0, &used, NULL);
    assert_int_equal(used, used0);
    CHECK(mgt_buffer_alloc(d0, 900u << 10, &b2)); /* the freed room is usable again */
    mgt_buffer_free(b2);
    mgt_buffer_free(other);
    mgt_device_memory(d0, &used, NULL);
    assert_int_equal(used, used0);
    mgt_devset_free(set);
}

/* A kernel whose workspace does not fit under the limit fails as a device error that names
   the device and the op (or, where a backend needs no workspace, simply runs): never a
   crash, a hang or an unaccounted allocation. */
static void test_workspace_over_limit(void **state)
{
    (void)state;
    mgt_devset *set = mgt_test_open_mock(1, "mem=48K;threads=2");
    mgt_device *d = mgt_devset_device(set, 0);
    mgt_stream *s;
    CHECK(mgt_stream_create(d, &s));
    mgt_conv2d_shape sh = {.n = 1,
                           .c = 64,
                           .h = 8,
                           .w = 8,
                           .k = 8,
                           .r = 3,
                           .s = 3,
                           .stride_h = 1,
                           .stride_w = 1,
                           .pad_h = 1,
                           .pad_w = 1,
                           .groups = 1};
    mgt_buffer *bx, *bw, *by;
    CHECK(mgt_buffer_alloc(d, 64 * 64 * sizeof(float), &bx));
    CHECK(mgt_buffer_alloc(d, 8 * 64 * 9 * sizeof(float), &bw));
    CHECK(mgt_buffer_alloc(d, 8 * 64 * sizeof(float), &by));
    CHECK(mgt_fill(s, mgt_buffer_ptr(bx), 1.0f, 64 * 64));
    CHECK(mgt_fill(s, mgt_buffer_ptr(bw), 0.5f, 8 * 64 * 9));
    mgt_status st = mgt_conv2d_forward(s, mgt_buffer_ptr(by), mgt_buffer_ptr(bx),
                                       mgt_buffer_ptr(bw), &sh, 0.0f);
    if (st == MGT_OK)
        st = mgt_stream_synchronize(s, NULL);
    size_t used, total;
    mgt_device_memory(d, &used, &total);
    assert_true(used <= total);
    if (st == MGT_OK) {
        print_message("conv ran within 48K: no workspace counted against the limit\n");
    } else {
        if (st != MGT_ERR_DEVICE && st != MGT_ERR_OOM)
            fail_msg("conv over the limit gave %s: %s", mgt_status_str(st), mgt_error_last());
        if (!strstr(mgt_error_last(), mgt_device_name(d)) ||
            !strstr(mgt_error_last(), "conv2d_forward"))
            fail_msg("error text \"%s\" does not name the device and the op", mgt_error_last());
        print_message("conv over the limit: %s\n", mgt_error_last());
    }
    mgt_buffer_free(bx);
    mgt_buffer_free(bw);
    mgt_buffer_free(by);
    mgt_stream_free(s);
    mgt_devset_free(set);
}

/* ---- injected faults ---- */

static void test_fault_alloc(void **state)
{
    (void)state;
    mgt_devset *set = mgt_test_open_mock(2, "fault=alloc@1:3");
    mgt_device *d0 = mgt_devset_device(set, 0), *d1 = mgt_devset_device(set, 1);
    mgt_buffer *a[5] = {0}, *b[4] = {0};
    for (int i = 0; i < 5; i++)
        CHECK(mgt_buffer_alloc(d0, 1000, &a[i])); /* device 0 is not the faulty one */
    CHECK(mgt_buffer_alloc(d1, 1000, &b[0]));
    CHECK(mgt_buffer_alloc(d1, 1000, &b[1]));
    size_t used_before, used;
    mgt_device_memory(d1, &used_before, NULL);
    mgt_status st = mgt_buffer_alloc(d1, 1000, &b[2]);
    if (st == MGT_OK)
        fail_msg("the 3rd allocation on device 1 succeeded");
    if (!strstr(mgt_error_last(), mgt_device_name(d1)))
        fail_msg("fault text \"%s\" does not name %s", mgt_error_last(), mgt_device_name(d1));
    assert_null(b[2]);
    mgt_device_memory(d1, &used, NULL);
    assert_int_equal(used, used_before);
    CHECK(mgt_buffer_alloc(d1, 1000, &b[3])); /* only the Nth fails */
    /* pinned host memory counts too (the set's own staging, made while it opened, does not) */
    mgt_devset *set2 = mgt_test_open_mock(1, "fault=alloc@0:2");
    mgt_device *e = mgt_devset_device(set2, 0);
    void *h1, *h2;
    CHECK(mgt_host_alloc(e, 64, &h1));
    mgt_status hst = mgt_host_alloc(e, 64, &h2);
    if (hst != MGT_ERR_OOM || !strstr(mgt_error_last(), "allocation #2 on this device, 64 pinned"))
        fail_msg("the 2nd allocation, pinned, did not fail as injected: %s", mgt_error_last());
    long allocs, kernels;
    assert_true(mgt_device_counts(e, &allocs, &kernels));
    assert_int_equal(allocs, 2);
    mgt_host_free(e, h1);
    mgt_devset_free(set2);
    for (int i = 0; i < 5; i++)
        mgt_buffer_free(a[i]);
    for (int i = 0; i < 4; i++)
        mgt_buffer_free(b[i]);
    mgt_devset_free(set);
}

/* The 2nd kernel on device 0 fails while it runs: the enqueue succeeded, the synchronize
   reports MGT_ERR_DEVICE naming the device and the op, the error stays, and device 1 goes
   on, including a stream that waits on an event device 0 recorded after the failure. */
static void test_fault_kernel(void **state)
{
    (void)state;
    mgt_devset *set = mgt_test_open_mock(2, "fault=kernel@0:2;delay=2000");
    mgt_device *d0 = mgt_devset_device(set, 0), *d1 = mgt_devset_device(set, 1);
    mgt_stream *s0, *s1, *s0b;
    mgt_event *e0;
    CHECK(mgt_stream_create(d0, &s0));
    CHECK(mgt_stream_create(d1, &s1));
    CHECK(mgt_event_create(d0, &e0));
    mgt_event *before, *after; /* recorded around the failing kernel: what ran, what did not */
    CHECK(mgt_event_create_ordering(d0, &before));
    CHECK(mgt_event_create_ordering(d0, &after));
    bool clean;
    assert_false(mgt_event_outcome(before, &clean)); /* never recorded: not known */
    enum { N = 100 };
    mgt_buffer *b0, *b1;
    CHECK(mgt_buffer_alloc(d0, N * sizeof(float), &b0));
    CHECK(mgt_buffer_alloc(d1, N * sizeof(float), &b1));
    float *x0 = mgt_buffer_ptr(b0), *x1 = mgt_buffer_ptr(b1);
    static float host[N], out[N];
    for (int i = 0; i < N; i++)
        host[i] = (float)i;
    CHECK(mgt_copy_h2d(s0, x0, host, sizeof host)); /* a copy, not a kernel */
    CHECK(mgt_fill(s0, x0, 1.0f, N));               /* kernel 1 */
    CHECK(mgt_event_record(before, s0));
    CHECK(mgt_scale(s0, x0, 2.0f, N));         /* kernel 2: fails when it runs */
    mgt_status rec = mgt_event_record(e0, s0); /* ok unless the failure already ran */
    mgt_status rec_after = mgt_event_record(after, s0);
    if (rec == MGT_OK)
        CHECK(mgt_stream_wait_event(s1, e0));
    CHECK(mgt_copy_h2d(s1, x1, host, sizeof host));
    CHECK(mgt_scale(s1, x1, 3.0f, N));
    CHECK(mgt_copy_d2h(s1, out, x1, sizeof out));

    EXPECT_FAIL(mgt_stream_synchronize(s0, NULL), MGT_ERR_DEVICE, mgt_device_name(d0));
    if (!strstr(mgt_error_last(), "scale"))
        fail_msg("fault text \"%s\" does not name the op (scale)", mgt_error_last());
    /* sticky: later calls and waits on device 0 fail the same way */
    EXPECT_FAIL(mgt_stream_synchronize(s0, NULL), MGT_ERR_DEVICE, mgt_device_name(d0));
    EXPECT_FAIL(mgt_device_synchronize(d0, NULL), MGT_ERR_DEVICE, mgt_device_name(d0));
    EXPECT_FAIL(mgt_fill(s0, x0, 0.0f, N), MGT_ERR_DEVICE, mgt_device_name(d0));
    mgt_status st = mgt_stream_create(d0, &s0b);
    if (st == MGT_OK) {
        EXPECT_FAIL(mgt_stream_synchronize(s0b, NULL), MGT_ERR_DEVICE, mgt_device_name(d0));
        mgt_stream_free(s0b);
    } else {
        assert_int_equal(st, MGT_ERR_DEVICE);
    }

    /* the work before the failure ran on a sound device; a record after it (or refused by
       the failed device) did not; the kernel count stopped at the failure */
    assert_true(mgt_event_outcome(before, &clean));
    assert_true(clean);
    if (rec_after == MGT_OK) {
        assert_true(mgt_event_outcome(after, &clean));
        assert_false(clean);
    }
    long allocs, kernels;
    assert_true(mgt_device_counts(d0, &allocs, &kernels));
    assert_int_equal(allocs, 1);
    assert_int_equal(kernels, 2);

    /* device 1: unaffected, and not hung on the failed device's event */
    CHECK(mgt_stream_synchronize(s1, NULL));
    CHECK(mgt_device_synchronize(d1, NULL));
    for (int i = 0; i < N; i++)
        assert_true(out[i] == 3.0f * host[i]);

    mgt_event_free(e0);
    mgt_event_free(before);
    mgt_event_free(after);
    mgt_buffer_free(b0);
    mgt_buffer_free(b1);
    mgt_stream_free(s0);
    mgt_stream_free(s1);
    mgt_devset_free(set);
}

/* fault=peer@1:2: the second direct peer copy into device 1 fails when it runs, sticky for
   device 1 and naming the copy; the source device and the first copy are untouched. */
static void test_fault_peer_copy(void **state)
{
    (void)state;
    mgt_devset *set = mgt_test_open_mock(2, "fault=peer@1:2");
    mgt_device *d0 = mgt_devset_device(set, 0), *d1 = mgt_devset_device(set, 1);
    mgt_stream *s0, *s1;
    CHECK(mgt_stream_create(d0, &s0));
    CHECK(mgt_stream_create(d1, &s1));
    enum { N = 256 };
    mgt_buffer *b0, *b1;
    CHECK(mgt_buffer_alloc(d0, N * sizeof(float), &b0));
    CHECK(mgt_buffer_alloc(d1, 2 * N * sizeof(float), &b1));
    float *x0 = mgt_buffer_ptr(b0), *x1 = mgt_buffer_ptr(b1);
    CHECK(mgt_fill(s0, x0, 5.0f, N));
    CHECK(mgt_stream_synchronize(s0, NULL));
    CHECK(mgt_copy_peer(s1, x1, s0, x0, N * sizeof(float))); /* #1: runs */
    CHECK(mgt_stream_synchronize(s1, NULL));
    static float out[N];
    CHECK(mgt_copy_d2h(s1, out, x1, sizeof out));
    CHECK(mgt_stream_synchronize(s1, NULL));
    for (int i = 0; i < N; i++)
        assert_true(out[i] == 5.0f);
    /* #2 fails as it runs: the call itself may see it (its ordering event comes after) */
    if (mgt_copy_peer(s1, x1 + N, s0, x0, N * sizeof(float)) == MGT_OK)
        EXPECT_FAIL(mgt_stream_synchronize(s1, NULL), MGT_ERR_DEVICE, "peer copy #2");
    EXPECT_FAIL(mgt_stream_synchronize(s1, NULL), MGT_ERR_DEVICE, "peer copy #2");
    if (!strstr(mgt_error_last(), mgt_device_name(d1)) || !strstr(mgt_error_last(), "from mock:"))
        fail_msg("\"%s\" does not name the device and the copy's source", mgt_error_last());
    EXPECT_FAIL(mgt_fill(s1, x1, 0.0f, N), MGT_ERR_DEVICE, "peer copy #2"); /* sticky */
    /* device 0 goes on */
    CHECK(mgt_scale(s0, x0, 2.0f, N));
    CHECK(mgt_copy_d2h(s0, out, x0, sizeof out));
    CHECK(mgt_stream_synchronize(s0, NULL));
    for (int i = 0; i < N; i++)
        assert_true(out[i] == 10.0f);
    mgt_buffer_free(b0);
    mgt_buffer_free(b1);
    mgt_stream_free(s0);
    mgt_stream_free(s1);
    mgt_devset_free(set);
}

/* fault=gone@1:2: at its second kernel device 1 disappears: that kernel and every later call
   on it fail (kernels, copies, allocations of device and pinned memory, streams, events,
   waits), each naming the device; device 0 reads all-one bytes (NaN) from its memory without
   failing (or is refused the copy once the device has gone), and goes on. */
static void test_fault_device_gone(void **state)
{
    (void)state;
    mgt_devset *set = mgt_test_open_mock(2, "fault=gone@1:2");
    mgt_device *d0 = mgt_devset_device(set, 0), *d1 = mgt_devset_device(set, 1);
    mgt_stream *s0, *s1, *extra;
    mgt_event *e1, *e_extra;
    CHECK(mgt_stream_create(d0, &s0));
    CHECK(mgt_stream_create(d1, &s1));
    CHECK(mgt_event_create(d1, &e1));
    enum { N = 64 };
    mgt_buffer *b0, *b1, *more;
    CHECK(mgt_buffer_alloc(d0, N * sizeof(float), &b0));
    CHECK(mgt_buffer_alloc(d1, N * sizeof(float), &b1));
    float *x0 = mgt_buffer_ptr(b0), *x1 = mgt_buffer_ptr(b1);
    CHECK(mgt_fill(s1, x1, 3.0f, N)); /* kernel 1 */
    CHECK(mgt_stream_synchronize(s1, NULL));
    CHECK(mgt_fill(s0, x0, 1.0f, N));
    mgt_status st = mgt_scale(s1, x1, 2.0f, N); /* kernel 2: the device goes */
    /* a peer copy out of it, queued behind that kernel: device 0 reads all-one bytes (NaN)
       from the missing device and stays sound; one asked once the device has gone is refused */
    static float out[N];
    mgt_status cp = st == MGT_OK ? mgt_copy_peer(s0, x0, s1, x1, N * sizeof(float)) : st;
    if (cp == MGT_OK) {
        CHECK(mgt_copy_d2h(s0, out, x0, sizeof out));
        CHECK(mgt_stream_synchronize(s0, NULL));
        for (int i = 0; i < N; i++)
            assert_true(isnan(out[i]));
    } else {
        assert_int_equal(cp, MGT_ERR_DEVICE);
    }
    EXPECT_FAIL(mgt_copy_peer(s0, x0, s1, x1, N * sizeof(float)), MGT_ERR_DEVICE, "gone");
    const char *name = mgt_device_name(d1);
    EXPECT_FAIL(mgt_stream_synchronize(s1, NULL), MGT_ERR_DEVICE, name);
    EXPECT_FAIL(mgt_fill(s1, x1, 0.0f, N), MGT_ERR_DEVICE, "gone");
    EXPECT_FAIL(mgt_event_record(e1, s1), MGT_ERR_DEVICE, "gone");
    EXPECT_FAIL(mgt_buffer_alloc(d1, 4096, &more), MGT_ERR_DEVICE, "gone");
    void *pinned;
    EXPECT_FAIL(mgt_host_alloc(d1, 4096, &pinned), MGT_ERR_DEVICE, "gone");
    EXPECT_FAIL(mgt_stream_create(d1, &extra), MGT_ERR_DEVICE, "gone");
    EXPECT_FAIL(mgt_event_create(d1, &e_extra), MGT_ERR_DEVICE, "gone");
    EXPECT_FAIL(mgt_device_synchronize(d1, NULL), MGT_ERR_DEVICE, "gone");
    /* device 0 goes on */
    CHECK(mgt_fill(s0, x0, 4.0f, N));
    CHECK(mgt_copy_d2h(s0, out, x0, sizeof out));
    CHECK(mgt_stream_synchronize(s0, NULL));
    assert_true(out[0] == 4.0f && out[N - 1] == 4.0f);
    /* its buffers, stream and event are still freed, and nothing leaks */
    mgt_event_free(e1);
    mgt_buffer_free(b0);
    mgt_buffer_free(b1);
    mgt_stream_free(s0);
    mgt_stream_free(s1);
    mgt_devset_free(set);
}

/* A label outside [0, classes) is a device error while the kernel runs, naming the op. */
static void test_bad_label_is_device_error(void **state)
{
    (void)state;
    mgt_devset *set = mgt_test_open_mock(1, "");
    mgt_device *d = mgt_devset_device(set, 0);
    mgt_stream *s;
    CHECK(mgt_stream_create(d, &s));
    mgt_buffer *bl, *bp, *bz, *bloss;
    CHECK(mgt_buffer_alloc(d, 4 * sizeof(int32_t), &bl));
    CHECK(mgt_buffer_alloc(d, 4 * 3 * sizeof(float), &bp));
    CHECK(mgt_buffer_alloc(d, 4 * 3 * sizeof(float), &bz));
    CHECK(mgt_buffer_alloc(d, sizeof(float), &bloss));
    static const int32_t labels[4] = {0, 2, 3, 1}; /* 3 is out of range for 3 classes */
    CHECK(mgt_copy_h2d(s, mgt_buffer_ptr(bl), labels, sizeof labels));
    CHECK(mgt_fill(s, mgt_buffer_ptr(bz), 0.5f, 12));
    CHECK(mgt_softmax_xent_forward(s, mgt_buffer_ptr(bloss), mgt_buffer_ptr(bp), mgt_buffer_ptr(bz),
                                   mgt_buffer_ptr(bl), NULL, NULL, 4, 3, 0.0f));
    EXPECT_FAIL(mgt_stream_synchronize(s, NULL), MGT_ERR_DEVICE, mgt_device_name(d));
    if (!strstr(mgt_error_last(), "softmax_xent_forward"))
        fail_msg("error text \"%s\" does not name the op", mgt_error_last());
    mgt_buffer_free(bl);
    mgt_buffer_free(bp);
    mgt_buffer_free(bz);
    mgt_buffer_free(bloss);
    mgt_stream_free(s);
    mgt_devset_free(set);
}

/* ---- pointer validation ---- */

/* Host memory, another device's memory, a range past a buffer's end and a freed buffer are
   refused at enqueue time; a refusal is no device error, so the device carries on. */
static void test_pointer_validation(void **state)
{
    (void)state;
    mgt_devset *set = mgt_test_open_mock(2, "");
    mgt_device *d0 = mgt_devset_device(set, 0), *d1 = mgt_devset_device(set, 1);
    mgt_stream *s0;
    CHECK(mgt_stream_create(d0, &s0));
    enum { N = 64 };
    mgt_buffer *b0, *b1, *gone;
    CHECK(mgt_buffer_alloc(d0, N * sizeof(float), &b0));
    CHECK(mgt_buffer_alloc(d1, N * sizeof(float), &b1));
    CHECK(mgt_buffer_alloc(d0, N * sizeof(float), &gone));
    float *x0 = mgt_buffer_ptr(b0), *x1 = mgt_buffer_ptr(b1), *xg = mgt_buffer_ptr(gone);
    mgt_buffer_free(gone);
    static float host[N];

    assert_int_not_equal(mgt_fill(s0, host, 1.0f, N), MGT_OK);
    assert_int_not_equal(mgt_fill(s0, x1, 1.0f, N), MGT_OK);
    assert_int_not_equal(mgt_fill(s0, x0 + 1, 1.0f, N), MGT_OK); /* one past the end */
    assert_int_not_equal(mgt_fill(s0, xg, 1.0f, N), MGT_OK);
    assert_int_not_equal(mgt_axpy(s0, x0, 1.0f, x1, N), MGT_OK); /* an input elsewhere */
    assert_int_not_equal(mgt_gemm(s0, false, false, 8, 8, 8, 1.0f, x0, 8, host, 8, 0.0f, x0, 8),
                         MGT_OK);
    assert_int_not_equal(mgt_copy_h2d(s0, host, host, sizeof host), MGT_OK);
    assert_int_not_equal(mgt_copy_d2h(s0, host, x1, sizeof host), MGT_OK);
    assert_int_not_equal(mgt_copy_d2d(s0, x0, x1, sizeof host), MGT_OK);
    assert_int_not_equal(mgt_memset(s0, x1, 0, sizeof host), MGT_OK);
    /* the refusal names the device it was checked against */
    EXPECT_FAIL(mgt_fill(s0, x1, 1.0f, N), MGT_ERR_INVALID, mgt_device_name(d0));

    /* none of that poisoned the device */
    CHECK(mgt_fill(s0, x0, 2.0f, N));
    CHECK(mgt_copy_d2h(s0, host, x0, sizeof host));
    CHECK(mgt_stream_synchronize(s0, NULL));
    for (int i = 0; i < N; i++)
        assert_true(host[i] == 2.0f);

    mgt_buffer_free(b0);
    mgt_buffer_free(b1);
    mgt_stream_free(s0);
    mgt_devset_free(set);
}

/* ---- specs that name what does not exist (issue 17) ---- */

/* A fault or a peer pair naming a device the set does not open, and a fault naming an op
   that does not exist, are refused at open (or parse) with the item and the reason; before,
   they were accepted and the run trained as if they were not there. */
static void test_spec_names_missing_device_or_op(void **state)
{
    (void)state;
    static const struct {
        const char *spec, *needle;
    } bad[] = {
        {"fault=kernel@7:5", "'fault=kernel@7:5': no device 7 among the 2 opened (ids 0, 1)"},
        {"fault=alloc@2:1", "'fault=alloc@2:1': no device 2 among the 2 opened"},
        {"fault=kernel@3:1:axpy", "'fault=kernel@3:1:axpy': no device 3"},
        {"peers=0-9", "'peers=0-9': no device 9 among the 2 opened (ids 0, 1)"},
        {"peers=0-1,1-5", "no device 5"},
    };
    int ids[] = {0, 1};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mgt_mock_options mo;
        CHECK(mgt_mock_options_parse(&mo, bad[i].spec));
        mgt_devset *set = NULL;
        mgt_devset_options o = {.mock = &mo};
        EXPECT_FAIL(mgt_devset_open(MGT_DEVICE_MOCK, ids, 2, &o, &set), MGT_ERR_INVALID,
                    bad[i].needle);
        assert_null(set);
    }
    /* the same specs are fine where the devices exist, whatever their order in the set */
    int all[] = {9, 0, 5, 7, 2, 1, 3};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mgt_mock_options mo;
        CHECK(mgt_mock_options_parse(&mo, bad[i].spec));
        mgt_devset *set = NULL;
        mgt_devset_options o = {.mock = &mo};
        CHECK(mgt_devset_open(MGT_DEVICE_MOCK, all, 7, &o, &set));
        mgt_devset_free(set);
    }

    mgt_mock_options mo;
    EXPECT_FAIL(mgt_mock_options_parse(&mo, "fault=kernel@0:5:bogus_op"), MGT_ERR_INVALID,
                "'fault=kernel@0:5:bogus_op': no op is named 'bogus_op' (ops: fill, scale");
    EXPECT_FAIL(mgt_mock_options_parse(&mo, "fault=kernel@0:5:conv2d"), MGT_ERR_INVALID,
                "no op is named 'conv2d'");
    CHECK(mgt_mock_options_parse(&mo, "fault=kernel@0:5:conv2d_backward_filter"));
    assert_string_equal(mo.fault[0].op, "conv2d_backward_filter");
}

/* How often `needle` occurs in `hay`. */
static int occurrences(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* Runs `mgtrain ARGS` in this process with stdout discarded and stderr captured into err;
   returns the exit status. */
static int run_mgtrain(char **argv, char *err, size_t cap)
{
    int argc = 0;
    while (argv[argc])
        argc++;
    fflush(stdout);
    fflush(stderr);
    FILE *cap_f = tmpfile(), *null_f = fopen("/dev/null", "w");
    assert_non_null(cap_f);
    assert_non_null(null_f);
    int saved_out = dup(1), saved_err = dup(2);
    dup2(fileno(null_f), 1);
    dup2(fileno(cap_f), 2);
    int rc = mgt_app_main(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(saved_out, 1);
    dup2(saved_err, 2);
    close(saved_out);
    close(saved_err);
    rewind(cap_f);
    size_t got = fread(err, 1, cap - 1, cap_f);
    err[got] = '\0';
    fclose(cap_f);
    fclose(null_f);
    return rc;
}

/* A bad --mock or MGT_MOCK reaches the user as one line with one prefix saying where the spec
   came from, through every command that opens devices (before: "--mock: mock options: ...",
   "--mock: --mock: ions: ...", and bench called MGT_MOCK's spec --mock). */
static void test_spec_errors_have_one_prefix(void **state)
{
    (void)state;
    char *cmds[][12] = {
        {"mgtrain", "train", "--dummy", "-a", "resnet20", "--gpus", "0,1", NULL},
        {"mgtrain", "devices", "--gpus", "0,1", "--no-bandwidth", NULL},
        {"mgtrain", "bench", "--dummy", "-a", "resnet20", "--gpus", "0,1", NULL},
        {"mgtrain", "bench", "allreduce", "--gpus", "0,1", NULL},
    };
    static const struct {
        const char *flag, *env, *want;
    } cases[] = {
        {"mem=abc", NULL, "--mock: 'mem=abc': expected a size such as 512M or 8G\n"},
        {"fault=kernel@7:5", NULL,
         "--mock: 'fault=kernel@7:5': no device 7 among the 2 opened (ids 0, 1)\n"},
        {"peers=0-9", NULL, "--mock: 'peers=0-9': no device 9 among the 2 opened (ids 0, 1)\n"},
        {"fault=kernel@0:5:bogus_op", NULL, "--mock: 'fault=kernel@0:5:bogus_op': no op is named"},
        {NULL, "garbage", "MGT_MOCK: 'garbage': expected key=value\n"},
        {NULL, "peers=0-3", "MGT_MOCK: 'peers=0-3': no device 3 among the 2 opened"},
    };
    char err[4096];
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        for (size_t c = 0; c < sizeof cmds / sizeof cmds[0]; c++) {
            char *argv[16];
            int argc = 0;
            for (; cmds[c][argc]; argc++)
                argv[argc] = cmds[c][argc];
            argv[argc++] = "--device";
            argv[argc++] = "cpu";
            if (cases[k].flag) {
                argv[argc++] = "--mock";
                argv[argc++] = (char *)cases[k].flag;
            }
            argv[argc] = NULL;
            if (cases[k].env)
                setenv("MGT_MOCK", cases[k].env, 1);
            else
                unsetenv("MGT_MOCK");
            int rc = run_mgtrain(argv, err, sizeof err);
            unsetenv("MGT_MOCK");
            const char *source = cases[k].flag ? "--mock" : "MGT_MOCK";
            if (rc == 0 || !strstr(err, cases[k].want) || occurrences(err, source) != 1 ||
                occurrences(err, cases[k].flag ? "MGT_MOCK" : "--mock") != 0 ||
                strstr(err, "mock options"))
                fail_msg("mgtrain %s %s with %s %s: exit %d, stderr:\n%s(wanted one line with "
                         "\"%s\" and one %s)",
                         cmds[c][1], cmds[c][2] ? cmds[c][2] : "", source,
                         cases[k].flag ? cases[k].flag : cases[k].env, rc, err, cases[k].want,
                         source);
        }
    }
}

/* ---- ordering-only events ---- */

static void test_ordering_event(void **state)
{
    (void)state;
    mgt_devset *set = mgt_test_open_mock(2, "threads=1");
    mgt_device *d0 = mgt_devset_device(set, 0), *d1 = mgt_devset_device(set, 1);
    mgt_stream *s0 = NULL, *s1 = NULL;
    mgt_event *ord = NULL, *t0 = NULL, *t1 = NULL;
    mgt_buffer *b = NULL;
    CHECK(mgt_stream_create(d0, &s0));
    CHECK(mgt_stream_create(d1, &s1));
    CHECK(mgt_event_create_ordering(d0, &ord));
    CHECK(mgt_event_create(d0, &t0));
    CHECK(mgt_event_create(d0, &t1));
    CHECK(mgt_buffer_alloc(d0, 4096, &b));
    /* it orders as any event: s1 waits for s0's fill */
    CHECK(mgt_event_record(t0, s0));
    CHECK(mgt_fill(s0, mgt_buffer_ptr(b), 3.0f, 1024));
    CHECK(mgt_event_record(ord, s0));
    CHECK(mgt_event_record(t1, s0));
    CHECK(mgt_stream_wait_event(s1, ord));
    CHECK(mgt_stream_synchronize(s1, NULL));
    bool done = false;
    CHECK(mgt_event_query(ord, &done));
    assert_true(done);
    CHECK(mgt_event_synchronize(ord, NULL));
    /* t1 comes after ord on s0: wait for it too, or it may not have run yet */
    CHECK(mgt_event_synchronize(t1, NULL));
    float ms = -1;
    CHECK(mgt_event_elapsed_ms(t0, t1, &ms));
    assert_true(ms >= 0);
    /* but keeps no time */
    EXPECT_FAIL(mgt_event_elapsed_ms(t0, ord, &ms), MGT_ERR_INVALID, "ordering-only");
    EXPECT_FAIL(mgt_event_elapsed_ms(ord, t1, &ms), MGT_ERR_INVALID, "ordering-only");
    mgt_buffer_free(b);
    mgt_event_free(ord);
    mgt_event_free(t0);
    mgt_event_free(t1);
    mgt_stream_free(s0);
    mgt_stream_free(s1);
    mgt_devset_free(set);
}

/* ---- bounded waits, deferred frees ---- */

static double seconds_since(double t0) { return mgt_time_now() - t0; }

/* A kernel that never finishes (a hung GPU): a wait without an abort flag ends at the set's
   wait limit naming the device, later waits give up at once, a free of a buffer the hung
   kernel may still write returns at once without handing the memory back, and freeing the
   stream and the set ends it all. Before the limit, each of these waited forever. */
static void test_hung_kernel_waits_are_bounded(void **state)
{
    (void)state;
    mgt_devset *set = mgt_test_open_mock(1, "threads=1;fault=hang@0:2");
    mgt_devset_set_waits(set, NULL, 0.3, "--timeout");
    mgt_device *d = mgt_devset_device(set, 0);
    mgt_stream *s;
    mgt_buffer *b;
    mgt_event *e;
    CHECK(mgt_stream_create(d, &s));
    CHECK(mgt_event_create(d, &e));
    CHECK(mgt_buffer_alloc(d, 4096, &b));
    size_t used0;
    mgt_device_memory(d, &used0, NULL);
    CHECK(mgt_fill(s, mgt_buffer_ptr(b), 1.0f, 1024));  /* kernel 1 */
    CHECK(mgt_scale(s, mgt_buffer_ptr(b), 2.0f, 1024)); /* kernel 2: hangs */
    CHECK(mgt_event_record(e, s));
    double t0 = mgt_time_now();
    EXPECT_FAIL(mgt_stream_synchronize(s, NULL), MGT_ERR_TIMEOUT, mgt_device_name(d));
    double waited = seconds_since(t0);
    if (waited < 0.25 || waited > 5)
        fail_msg("the wait ended after %.2f s, the limit is 0.3 s", waited);
    if (!strstr(mgt_error_last(), "0.3 s (--timeout)"))
        fail_msg("\"%s\" does not say the limit and what set it", mgt_error_last());
    t0 = mgt_time_now();
    EXPECT_FAIL(mgt_event_synchronize(e, NULL), MGT_ERR_TIMEOUT, "stalled");
    EXPECT_FAIL(mgt_device_synchronize(d, NULL), MGT_ERR_TIMEOUT, "stalled");
    mgt_buffer_free(b);
    size_t used;
    mgt_device_memory(d, &used, NULL);
    assert_int_equal(used, used0); /* still counted: the hung kernel may write it */
    mgt_event_free(e);
    mgt_stream_free(s); /* ends the hang */
    if (seconds_since(t0) > 1)
        fail_msg("waits on a stalled device took %.2f s", seconds_since(t0));
    mgt_devset_free(set);
}

/* A device given up (mgt_device_abandon) with a kernel hung: its streams skip their queued
   work and complete their records, so that no peer waits on it for ever; a peer copy out of
   it that was queued behind them does not read its memory (nothing orders the hung device's
   writes before the read: the thread sanitizer reported that race in train_survive's fault
   matrix), it gets all-one bytes (NaN), and the peer stays sound. Device 1's second stream
   (its comm stream, in the trainer) waits on the hung one: the abandonment lets that wait go
   before the hung kernel notices, as on a GPU the reset would come later. */
static void test_abandoned_device_is_not_read(void **state)
{
    (void)state;
    mgt_devset *set = mgt_test_open_mock(2, "threads=1;fault=hang@1:2");
    mgt_device *d0 = mgt_devset_device(set, 0), *d1 = mgt_devset_device(set, 1);
    mgt_stream *s0, *s1, *c1;
    mgt_event *e1;
    enum { N = 256 };
    mgt_buffer *b0, *b1;
    CHECK(mgt_stream_create(d0, &s0));
    CHECK(mgt_stream_create(d1, &s1));
    CHECK(mgt_stream_create(d1, &c1));
    CHECK(mgt_event_create(d1, &e1));
    CHECK(mgt_buffer_alloc(d0, N * sizeof(float), &b0));
    CHECK(mgt_buffer_alloc(d1, N * sizeof(float), &b1));
    float *x0 = mgt_buffer_ptr(b0), *x1 = mgt_buffer_ptr(b1);
    CHECK(mgt_fill(s0, x0, 1.0f, N));
    CHECK(mgt_fill(s1, x1, 3.0f, N));  /* kernel 1 */
    CHECK(mgt_scale(s1, x1, 2.0f, N)); /* kernel 2: hangs */
    CHECK(mgt_event_record(e1, s1));
    CHECK(mgt_stream_wait_event(c1, e1));
    CHECK(mgt_copy_peer(s0, x0, c1, x1, N * sizeof(float)));
    static float out[N];
    CHECK(mgt_copy_d2h(s0, out, x0, sizeof out));
    usleep(20 * 1000); /* every stream at its wait */
    mgt_device_abandon(d1, "given up by the test");
    CHECK(mgt_stream_synchronize(s0, NULL));
    for (int i = 0; i < N; i++)
        if (!isnan(out[i]))
            fail_msg("float %d read from the abandoned device: %g", i, (double)out[i]);
    EXPECT_FAIL(mgt_device_synchronize(d1, NULL), MGT_ERR_DEVICE, "given up by the test");
    CHECK(mgt_fill(s0, x0, 4.0f, N)); /* device 0 goes on */
    CHECK(mgt_copy_d2h(s0, out, x0, sizeof out));
    CHECK(mgt_stream_synchronize(s0, NULL));
    assert_true(out[0] == 4.0f && out[N - 1] == 4.0f);
    mgt_buffer_free(b0);
    mgt_buffer_free(b1);
    mgt_event_free(e1);
    mgt_stream_free(c1);
    mgt_stream_free(s1);
    mgt_stream_free(s0);
    mgt_devset_free(set);
}

static void *raise_later(void *arg)
{
    usleep(50 * 1000);
    mgt_abort_raise(arg);
    return NULL;
}

/* Waits with an abort flag leave soon after it is raised, hung kernel or not. */
static void test_abort_leaves_waits(void **state)
{
    (void)state;
    mgt_devset *set = mgt_test_open_mock(1, "threads=1;fault=hang@0:1");
    mgt_device *d = mgt_devset_device(set, 0);
    mgt_stream *s;
    mgt_event *e;
    mgt_buffer *b;
    CHECK(mgt_stream_create(d, &s));
    CHECK(mgt_event_create(d, &e));
    CHECK(mgt_buffer_alloc(d, 4096, &b));
    CHECK(mgt_fill(s, mgt_buffer_ptr(b), 1.0f, 1024)); /* hangs */
    CHECK(mgt_event_record(e, s));
    for (int k = 0; k < 3; k++) {
        mgt_abort abort = {0};
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, raise_later, &abort), 0);
        double t0 = mgt_time_now();
        mgt_status st = k == 0   ? mgt_stream_synchronize(s, &abort)
                        : k == 1 ? mgt_event_synchronize(e, &abort)
                                 : mgt_device_synchronize(d, &abort);
        pthread_join(t, NULL);
        if (st != MGT_ERR_ABORTED || seconds_since(t0) > 2)
            fail_msg("wait %d: %s after %.2f s (%s)", k, mgt_status_str(st), seconds_since(t0),
                     mgt_error_last());
    }
    mgt_devset_set_waits(set, NULL, 0.1, NULL); /* the teardown's waits on the hung stream */
    mgt_buffer_free(b);
    mgt_event_free(e);
    mgt_stream_free(s);
    mgt_devset_free(set);
}

/* A free does not wait for the work queued before it: it returns at once, and the memory goes
   back once every stream that may use it has passed the free, also another device's stream
   reading it by a peer copy. Under the address sanitizer a block handed back early is a
   use-after-free in the kernels still writing it. */
static void test_free_is_deferred_not_waited(void **state)
{
    (void)state;
    mgt_devset *set = mgt_test_open_mock(2, "threads=1;delay=60000;seed=3");
    mgt_device *d0 = mgt_devset_device(set, 0), *d1 = mgt_devset_device(set, 1);
    mgt_stream *s0, *s1;
    mgt_buffer *b0, *b1, *other;
    enum { N = 4096, OPS = 8 };
    CHECK(mgt_stream_create(d0, &s0));
    CHECK(mgt_stream_create(d1, &s1));
    CHECK(mgt_buffer_alloc(d1, N * sizeof(float), &b1));
    CHECK(mgt_buffer_alloc(d1, N * sizeof(float), &other));
    size_t used0, used;
    mgt_device_memory(d0, &used0, NULL);
    CHECK(mgt_buffer_alloc(d0, N * sizeof(float), &b0));
    for (int i = 0; i < OPS; i++) /* each op after a random delay of up to 60 ms */
        CHECK(mgt_fill(s0, mgt_buffer_ptr(b0), (float)i, N));
    CHECK(mgt_copy_peer(s1, mgt_buffer_ptr(b1), s0, mgt_buffer_ptr(b0), N * sizeof(float)));
    for (int i = 0; i < OPS; i++) /* device 1 goes on long after device 0's work */
        CHECK(mgt_fill(s1, mgt_buffer_ptr(other), (float)i, N));
    double t0 = mgt_time_now();
    mgt_buffer_free(b0);
    if (seconds_since(t0) > 0.03)
        fail_msg("the free waited %.3f s for the queued work", seconds_since(t0));
    mgt_device_memory(d0, &used, NULL);
    assert_int_equal(used, used0 + N * sizeof(float)); /* not back while work may use it */
    CHECK(mgt_stream_synchronize(s0, NULL));
    mgt_device_memory(d0, &used, NULL);
    assert_int_equal(used, used0 + N * sizeof(float)); /* device 1 still reads it */
    CHECK(mgt_stream_synchronize(s1, NULL));
    mgt_device_memory(d0, &used, NULL);
    assert_int_equal(used, used0); /* both streams have passed the free */
    float host[N];
    CHECK(mgt_copy_d2h(s1, host, mgt_buffer_ptr(b1), sizeof host));
    CHECK(mgt_stream_synchronize(s1, NULL));
    for (int i = 0; i < N; i++)
        assert_true(host[i] == (float)(OPS - 1));
    /* a full device waits for its deferred frees instead of failing */
    mgt_devset_free(set);
    set = mgt_test_open_mock(1, "threads=1;delay=20000;mem=64K");
    mgt_device *d = mgt_devset_device(set, 0);
    mgt_stream *s;
    CHECK(mgt_stream_create(d, &s));
    for (int round = 0; round < 4; round++) {
        mgt_buffer *big;
        CHECK(mgt_buffer_alloc(d, 48u << 10, &big));
        CHECK(mgt_fill(s, mgt_buffer_ptr(big), 1.0f, (48u << 10) / sizeof(float)));
        mgt_buffer_free(big);
    }
    mgt_stream_free(s);
    mgt_devset_free(set);
}

/* ---- 16-bit convolution refusals: every reason's branch, through fault=lowp ---- */

/* One bf16 forward convolution of a c-channel 6x6 input on d, compared with the fp32
   convolution of the rounded inputs (the fallback's arithmetic, which the native kernel's
   also is within fp32 summation order). Returns the status of the run. */
static mgt_status conv16(mgt_devset *set, int c)
{
    mgt_device *d = mgt_devset_device(set, 0);
    mgt_conv2d_shape sh = {.n = 2,
                           .c = c,
                           .h = 6,
                           .w = 6,
                           .k = 4,
                           .r = 3,
                           .s = 3,
                           .stride_h = 1,
                           .stride_w = 1,
                           .pad_h = 1,
                           .pad_w = 1,
                           .groups = 1};
    const size_t nx = (size_t)2 * c * 36, nw = (size_t)4 * c * 9, ny = (size_t)2 * 4 * 36;
    float *hx = malloc(nx * sizeof *hx), *hw = malloc(nw * sizeof *hw);
    float *y16 = malloc(ny * sizeof *y16), *y32 = malloc(ny * sizeof *y32);
    assert_true(hx && hw && y16 && y32);
    for (size_t i = 0; i < nx; i++)
        hx[i] = (float)((i * 37) % 23) / 7.0f - 1.5f;
    for (size_t i = 0; i < nw; i++)
        hw[i] = (float)((i * 11) % 17) / 9.0f - 0.9f;
    mgt_stream *s;
    mgt_buffer *x, *w, *y;
    CHECK(mgt_stream_create(d, &s));
    CHECK(mgt_buffer_alloc(d, nx * sizeof(float), &x));
    CHECK(mgt_buffer_alloc(d, nw * sizeof(float), &w));
    CHECK(mgt_buffer_alloc(d, ny * sizeof(float), &y));
    CHECK(mgt_copy_h2d(s, mgt_buffer_ptr(x), hx, nx * sizeof(float)));
    CHECK(mgt_copy_h2d(s, mgt_buffer_ptr(w), hw, nw * sizeof(float)));
    mgt_status st = mgt_conv2d_forward_lp(s, MGT_PREC_BF16, mgt_buffer_ptr(y), mgt_buffer_ptr(x),
                                          mgt_buffer_ptr(w), &sh, 0.0f);
    if (st == MGT_OK)
        st = mgt_copy_d2h(s, y16, mgt_buffer_ptr(y), ny * sizeof(float));
    if (st == MGT_OK)
        st = mgt_stream_synchronize(s, NULL);
    char err[512];
    snprintf(err, sizeof err, "%s", mgt_error_last());
    if (st == MGT_OK) { /* the reference: the inputs rounded here, the fp32 convolution */
        for (size_t i = 0; i < nx; i++)
            hx[i] = mgt_lowp_round_bf16(hx[i]);
        for (size_t i = 0; i < nw; i++)
            hw[i] = mgt_lowp_round_bf16(hw[i]);
        CHECK(mgt_copy_h2d(s, mgt_buffer_ptr(x), hx, nx * sizeof(float)));
        CHECK(mgt_copy_h2d(s, mgt_buffer_ptr(w), hw, nw * sizeof(float)));
        CHECK(mgt_conv2d_forward(s, mgt_buffer_ptr(y), mgt_buffer_ptr(x), mgt_buffer_ptr(w), &sh,
                                 0.0f));
        CHECK(mgt_copy_d2h(s, y32, mgt_buffer_ptr(y), ny * sizeof(float)));
        CHECK(mgt_stream_synchronize(s, NULL));
        for (size_t i = 0; i < ny; i++)
            if (fabsf(y16[i] - y32[i]) > 1e-4f * (1.0f + fabsf(y32[i])))
                fail_msg("c=%d: y[%zu] = %g, the rounded fp32 convolution gives %g", c, i,
                         (double)y16[i], (double)y32[i]);
    }
    mgt_buffer_free(x);
    mgt_buffer_free(w);
    mgt_buffer_free(y);
    mgt_stream_free(s);
    free(hx);
    free(hw);
    free(y16);
    free(y32);
    mgt_error_set(st, "%s", err);
    return st;
}

/* Each refusal reason takes its branch (src/device/refusal.h), as cuDNN's statuses do on CUDA:
   no_kernel and bad_param send the shape to the rounded-fp32 path for good (the second call
   of shape 3 does not ask again, so the next refusal in the list reaches shape 5 instead),
   no_memory for one call (the second call of shape 3 asks again and meets the next refusal),
   broken and fault fail the op naming the reason. */
static void test_lowp_refusals_decide_per_reason(void **state)
{
    (void)state;
    static const char *const remembered[] = {"no_kernel", "bad_param"};
    for (int i = 0; i < 2; i++) {
        char spec[96];
        snprintf(spec, sizeof spec, "threads=1;fault=lowp@0:1:%s,fault", remembered[i]);
        mgt_devset *set = mgt_test_open_mock(1, spec);
        CHECK(conv16(set, 3));          /* refused: fp32 path, remembered */
        CHECK(conv16(set, 3));          /* not asked again: the 'fault' refusal stays unused */
        mgt_status st = conv16(set, 5); /* another shape: asked, and refused with 'fault' */
        if (st != MGT_ERR_DEVICE || !strstr(mgt_error_last(), "fault"))
            fail_msg("%s: shape 5 gave %s: %s", spec, mgt_status_str(st), mgt_error_last());
        mgt_devset_free(set);
    }
    mgt_devset *set = mgt_test_open_mock(1, "threads=1;fault=lowp@0:1:no_memory,fault");
    CHECK(conv16(set, 3)); /* short of memory: fp32 path this once */
    mgt_status st = conv16(set, 3);
    if (st != MGT_ERR_DEVICE || !strstr(mgt_error_last(), "fault"))
        fail_msg("no_memory: the second call gave %s: %s", mgt_status_str(st), mgt_error_last());
    mgt_devset_free(set);
    static const char *const failing[] = {"broken", "fault"};
    for (int i = 0; i < 2; i++) {
        char spec[96];
        snprintf(spec, sizeof spec, "threads=1;fault=lowp@0:1:%s", failing[i]);
        set = mgt_test_open_mock(1, spec);
        st = conv16(set, 3);
        if (st != MGT_ERR_DEVICE || !strstr(mgt_error_last(), failing[i]) ||
            !strstr(mgt_error_last(), "conv2d_forward"))
            fail_msg("%s: gave %s: %s", spec, mgt_status_str(st), mgt_error_last());
        mgt_devset_free(set);
    }
}

/* MGT_ASSERT, which guards memory (op.c's operand list, the graph's fixed arrays), is checked
   in this build too, which defines NDEBUG as the default RelWithDebInfo does: a broken one
   aborts the process. */
static void test_assert_survives_ndebug(void **state)
{
    (void)state;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        volatile int n = 3;
        MGT_ASSERT(n < 3);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
#ifdef NDEBUG
    const char *build = "with NDEBUG";
#else
    const char *build = "without NDEBUG";
#endif
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT)
        fail_msg("MGT_ASSERT on a false condition did not abort (built %s)", build);
}

/* An argument picks the tests to run by name pattern (cmocka's filter), e.g. '*peer*'. */
int main(int argc, char **argv)
{
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_options_accepted),
        cmocka_unit_test(test_options_rejected),
        cmocka_unit_test(test_peer_matrix),
        cmocka_unit_test(test_peer_copies),
        cmocka_unit_test(test_no_p2p_and_copy_rate),
        cmocka_unit_test(test_memory_limit),
        cmocka_unit_test(test_workspace_over_limit),
        cmocka_unit_test(test_fault_alloc),
        cmocka_unit_test(test_fault_kernel),
        cmocka_unit_test(test_fault_peer_copy),
        cmocka_unit_test(test_fault_device_gone),
        cmocka_unit_test(test_bad_label_is_device_error),
        cmocka_unit_test(test_pointer_validation),
        cmocka_unit_test(test_assert_survives_ndebug),
        cmocka_unit_test(test_spec_names_missing_device_or_op),
        cmocka_unit_test(test_spec_errors_have_one_prefix),
        cmocka_unit_test(test_ordering_event),
        cmocka_unit_test(test_hung_kernel_waits_are_bounded),
        cmocka_unit_test(test_abort_leaves_waits),
        cmocka_unit_test(test_abandoned_device_is_not_read),
        cmocka_unit_test(test_free_is_deferred_not_waited),
        cmocka_unit_test(test_lowp_refusals_decide_per_reason),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
