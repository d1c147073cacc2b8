/* A smoke test of the CUDA backend's plumbing on a real GPU: replicas on one GPU, direct and
   staged peer copies, events, an abortable wait, the sticky bad-label error, id validation,
   and a set opened for --on-device-failure continue (guarded copies, a hung replica given up).
   The conformance suite checks the kernels; this checks what lies around them. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mgt/device.h"
#include "mgt/thread.h"

static int failures;

static void report(bool ok, const char *what, const char *detail)
{
    printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", what, detail[0] ? ": " : "", detail);
    failures += !ok;
}

static bool check(mgt_status st, const char *what)
{
    if (st == MGT_OK)
        return true;
    char detail[600];
    snprintf(detail, sizeof detail, "%s: %s", mgt_status_str(st), mgt_error_last());
    report(false, what, detail);
    return false;
}

static uint32_t pattern(size_t i, uint32_t salt) { return (uint32_t)(i * 2654435761u) ^ salt; }

/* Copies `bytes` of a pattern from replica 0 to replica 1 of `set` through mgt_copy_peer and
   back to the host; checks every word. */
static void peer_roundtrip(mgt_devset *set, const char *what, uint32_t salt)
{
    const size_t bytes = (size_t)48 << 20, words = bytes / 4;
    mgt_device *d0 = mgt_devset_device(set, 0), *d1 = mgt_devset_device(set, 1);
    mgt_stream *s0 = NULL, *s1 = NULL;
    mgt_buffer *b0 = NULL, *b1 = NULL;
    uint32_t *host = NULL;
    if (!check(mgt_stream_create(d0, &s0), what) || !check(mgt_stream_create(d1, &s1), what) ||
        !check(mgt_buffer_alloc(d0, bytes, &b0), what) ||
        !check(mgt_buffer_alloc(d1, bytes, &b1), what) ||
        !check(mgt_host_alloc(d0, bytes, (void **)&host), what))
        goto done;
    for (size_t i = 0; i < words; i++)
        host[i] = pattern(i, salt);
    if (!check(mgt_copy_h2d(s0, mgt_buffer_ptr(b0), host, bytes), what) ||
        !check(mgt_memset(s1, mgt_buffer_ptr(b1), 0, bytes), what) ||
        !check(mgt_copy_peer(s1, mgt_buffer_ptr(b1), s0, mgt_buffer_ptr(b0), bytes), what) ||
        !check(mgt_stream_synchronize(s1, NULL), what))
        goto done;
    memset(host, 0, bytes);
    if (!check(mgt_copy_d2h(s1, host, mgt_buffer_ptr(b1), bytes), what) ||
        !check(mgt_stream_synchronize(s1, NULL), what))
        goto done;
    size_t bad = 0;
    for (size_t i = 0; i < words; i++)
        bad += host[i] != pattern(i, salt);
    char detail[160];
    snprintf(detail, sizeof detail, "%zu MiB, %s, %zu wrong words", bytes >> 20,
             mgt_devset_can_access_peer(set, 0, 1) ? "direct" : "staged", bad);
    report(bad == 0, what, detail);
done:
    if (host != NULL)
        mgt_host_free(d0, host);
    mgt_buffer_free(b0);
    mgt_buffer_free(b1);
    mgt_stream_free(s0);
    mgt_stream_free(s1);
}

static mgt_devset *open_cuda_with(const int *ids, int n, bool recoverable, const char *what)
{
    mgt_devset *set = NULL;
    mgt_devset_options o = {.recoverable = recoverable};
    if (!check(mgt_devset_open(MGT_DEVICE_CUDA, ids, n, &o, &set), what))
        return NULL;
    for (int i = 0; i < n; i++) {
        size_t used = 0, total = 0;
        mgt_device_memory(mgt_devset_device(set, i), &used, &total);
        printf("     device %d: %s (%zu MiB usable)\n", i,
               mgt_device_name(mgt_devset_device(set, i)), total >> 20);
    }
    return set;
}

static mgt_devset *open_cuda(const int *ids, int n, const char *what)
{
    return open_cuda_with(ids, n, false, what);
}

/* open_cuda_with for a check that needs queued work still running when it looks: with
   MGT_CUDA_SYNC unset whatever the environment says (gpu-check.sh runs this program under
   MGT_CUDA_SYNC=1 too, where every enqueue would wait for its stream) */
static mgt_devset *open_cuda_async(const int *ids, int n, bool recoverable, const char *what)
{
    const char *sync = getenv("MGT_CUDA_SYNC");
    char saved[32] = "";
    if (sync)
        snprintf(saved, sizeof saved, "%s", sync);
    unsetenv("MGT_CUDA_SYNC");
    mgt_devset *set = open_cuda_with(ids, n, recoverable, what);
    if (sync)
        setenv("MGT_CUDA_SYNC", saved, 1);
    return set;
}

/* Reads `bytes` of a device buffer back through `host`: *same gets whether every byte equals
   `value`. */
static bool bytes_are(mgt_stream *s, const void *dev, size_t bytes, unsigned char value,
                      unsigned char *host, bool *same)
{
    if (mgt_copy_d2h(s, host, dev, bytes) != MGT_OK || mgt_stream_synchronize(s, NULL) != MGT_OK)
        return false;
    *same = true;
    for (size_t i = 0; i < bytes; i++)
        *same = *same && host[i] == value;
    return true;
}

/* --on-device-failure continue on two replicas of GPU 0: replica 1 hangs (MGT_CUDA_FAULT
   hang@1:1, a kernel spinning until the set closes) before the work a copy from it into
   replica 0 waits for. Replica 0's stream must hold at that wait, then go on once replica 1 is
   given up, with the copy skipped (replica 0's buffer keeps its bytes), and replica 0 must go on
   working. Before that, MGT_CUDA_FAULT gone@1:1: replica 1's first kernel fails, sticky, and
   replica 0 is untouched. */
static void survive(void)
{
    const size_t bytes = (size_t)4 << 20;
    const int same[2] = {0, 0};
    /* a malformed MGT_CUDA_FAULT, or one naming a replica past the set, is refused at open */
    static const char *const bad[] = {"stall@1:3", "hang@1", "gone@2:5"};
    for (int i = 0; i < 3; i++) {
        mgt_devset *refused = NULL;
        setenv("MGT_CUDA_FAULT", bad[i], 1);
        mgt_status st = mgt_devset_open(MGT_DEVICE_CUDA, same, 2, NULL, &refused);
        unsetenv("MGT_CUDA_FAULT");
        char detail[600];
        snprintf(detail, sizeof detail, "%s: %s: %s", bad[i], mgt_status_str(st), mgt_error_last());
        report(st == MGT_ERR_INVALID && strstr(mgt_error_last(), "MGT_CUDA_FAULT=") != NULL,
               "MGT_CUDA_FAULT: a bad value refused, naming it", detail);
        mgt_devset_free(refused);
    }
    setenv("MGT_CUDA_FAULT", "gone@1:1", 1);
    mgt_devset *set = open_cuda_with(same, 2, true, "continue: open with gone@1:1");
    unsetenv("MGT_CUDA_FAULT");
    if (set != NULL) {
        mgt_stream *s0 = NULL, *s1 = NULL;
        mgt_buffer *b0 = NULL, *b1 = NULL;
        if (check(mgt_stream_create(mgt_devset_device(set, 0), &s0), "gone: setup") &&
            check(mgt_stream_create(mgt_devset_device(set, 1), &s1), "gone: setup") &&
            check(mgt_buffer_alloc(mgt_devset_device(set, 0), bytes, &b0), "gone: setup") &&
            check(mgt_buffer_alloc(mgt_devset_device(set, 1), bytes, &b1), "gone: setup")) {
            mgt_status st = mgt_fill(s1, mgt_buffer_ptr(b1), 1.0f, bytes / 4);
            char detail[600];
            snprintf(detail, sizeof detail, "%s: %s", mgt_status_str(st), mgt_error_last());
            report(st == MGT_ERR_DEVICE && strstr(mgt_error_last(), "injected fault") != NULL,
                   "gone: replica 1's first kernel fails", detail);
            st = mgt_fill(s1, mgt_buffer_ptr(b1), 1.0f, bytes / 4);
            report(st == MGT_ERR_DEVICE, "gone: and stays failed", mgt_status_str(st));
            st = mgt_fill(s0, mgt_buffer_ptr(b0), 1.0f, bytes / 4);
            if (st == MGT_OK)
                st = mgt_stream_synchronize(s0, NULL);
            report(st == MGT_OK, "gone: replica 0 goes on", mgt_status_str(st));
        }
        mgt_buffer_free(b0);
        mgt_buffer_free(b1);
        mgt_stream_free(s0);
        mgt_stream_free(s1);
        mgt_devset_free(set);
    }

    /* the guarded copy kernel, then (MGT_NO_P2P=1) the staged copy ordered through marks */
    for (int staged = 0; staged < 2; staged++) {
        if (staged)
            setenv("MGT_NO_P2P", "1", 1);
        set = open_cuda_with(same, 2, true, staged ? "continue, staged: open" : "continue: open");
        unsetenv("MGT_NO_P2P");
        if (set == NULL)
            continue;
        peer_roundtrip(set,
                       staged ? "continue: staged peer copy through marks"
                              : "continue: guarded peer copy",
                       staged ? 0x0f1e2d3cu : 0x2468ace0u);
        mgt_devset_free(set);
    }

    /* MGT_CUDA_SYNC=1 would wait for the hung stream at the launch itself */
    setenv("MGT_CUDA_FAULT", "hang@1:1", 1);
    set = open_cuda_async(same, 2, true, "continue: open with hang@1:1 (MGT_CUDA_SYNC unset)");
    unsetenv("MGT_CUDA_FAULT");
    if (set == NULL)
        return;
    mgt_devset_set_waits(set, NULL, 20.0, "cuda_smoke");
    mgt_device *d0 = mgt_devset_device(set, 0), *d1 = mgt_devset_device(set, 1);
    mgt_stream *s0 = NULL, *s1 = NULL;
    mgt_buffer *b0 = NULL, *b1 = NULL;
    mgt_event *after = NULL;
    unsigned char *host = NULL;
    char detail[600];
    double t0 = 0.0;
    bool finished = true, kept = false;
    mgt_status st = MGT_OK;
    if (!check(mgt_stream_create(d0, &s0), "hang: setup") ||
        !check(mgt_stream_create(d1, &s1), "hang: setup") ||
        !check(mgt_buffer_alloc(d0, bytes, &b0), "hang: setup") ||
        !check(mgt_buffer_alloc(d1, bytes, &b1), "hang: setup") ||
        !check(mgt_event_create(d0, &after), "hang: setup") ||
        !check(mgt_host_alloc(d0, bytes, (void **)&host), "hang: setup"))
        goto done;
    if (!check(mgt_memset(s0, mgt_buffer_ptr(b0), 0x11, bytes), "hang: memset") ||
        !check(mgt_stream_synchronize(s0, NULL), "hang: memset") ||
        !check(mgt_fill(s1, mgt_buffer_ptr(b1), 2.0f, bytes / 4), "hang: replica 1's kernel") ||
        !check(mgt_copy_peer(s0, mgt_buffer_ptr(b0), s1, mgt_buffer_ptr(b1), bytes),
               "hang: the copy from replica 1") ||
        !check(mgt_event_record(after, s0), "hang: record"))
        goto done;
    nanosleep(&(struct timespec){0, 300 * 1000 * 1000}, NULL);
    if (!check(mgt_event_query(after, &finished), "hang: query"))
        goto done;
    report(!finished, "hang: replica 0's stream waits behind the hung replica",
           finished ? "it went on: the copy did not wait for replica 1's work" : "");
    t0 = mgt_time_now();
    mgt_device_abandon(d1, "given up by cuda_smoke");
    st = mgt_stream_synchronize(s0, NULL);
    double took = mgt_time_now() - t0;
    snprintf(detail, sizeof detail, "%s after %.1f ms%s%s", mgt_status_str(st), took * 1e3,
             st == MGT_OK ? "" : ": ", st == MGT_OK ? "" : mgt_error_last());
    report(st == MGT_OK && took < 2.0, "hang: given up, replica 0's stream goes on", detail);
    if (st != MGT_OK)
        goto done;
    if (!bytes_are(s0, mgt_buffer_ptr(b0), bytes, 0x11, host, &kept))
        report(false, "hang: read back", mgt_error_last());
    else
        report(kept, "hang: the copy from the lost replica was skipped",
               kept ? "" : "replica 0's buffer was written");
    st = mgt_fill(s0, mgt_buffer_ptr(b0), 3.0f, bytes / 4);
    if (st == MGT_OK)
        st = mgt_stream_synchronize(s0, NULL);
    report(st == MGT_OK, "hang: replica 0 goes on working", mgt_status_str(st));
done:
    if (host != NULL)
        mgt_host_free(d0, host);
    mgt_event_free(after);
    mgt_buffer_free(b0);
    mgt_buffer_free(b1);
    mgt_stream_free(s0);
    mgt_stream_free(s1);
    t0 = mgt_time_now();
    mgt_devset_free(set); /* ends the hang; leaves replica 1's memory */
    snprintf(detail, sizeof detail, "%.1f ms", (mgt_time_now() - t0) * 1e3);
    report(mgt_time_now() - t0 < 30.0, "hang: the set closes", detail);
}

/* Keeps the GPU busy, then waits with the abort flag raised: the wait must leave with
   MGT_ERR_ABORTED long before the work is done, and a later plain wait must still work.
   Under MGT_CUDA_SYNC=1 (as gpu-check.sh runs this) every enqueue waits for its stream, so the
   stream would be idle before the wait began and the wait rightly return MGT_OK: the check
   opens its own replica with MGT_CUDA_SYNC unset, and first confirms the work is still
   running, so it tests the abort path and nothing else. */
static void abortable_wait(void)
{
    const size_t n = (size_t)64 << 20; /* 256 MiB of floats */
    int id[1] = {0};
    mgt_devset *set = open_cuda_async(id, 1, false, "abort: open (MGT_CUDA_SYNC unset)");
    if (set == NULL)
        return;
    mgt_device *d = mgt_devset_device(set, 0);
    mgt_stream *s = NULL;
    mgt_buffer *b = NULL;
    mgt_event *t0 = NULL, *t1 = NULL;
    if (!check(mgt_stream_create(d, &s), "abort: setup") ||
        !check(mgt_buffer_alloc(d, n * sizeof(float), &b), "abort: setup") ||
        !check(mgt_event_create(d, &t0), "abort: setup") ||
        !check(mgt_event_create(d, &t1), "abort: setup"))
        goto done;
    float *x = mgt_buffer_ptr(b);
    if (!check(mgt_fill(s, x, 1.0f, n), "abort: fill") ||
        !check(mgt_event_record(t0, s), "abort: event"))
        goto done;
    for (int i = 0; i < 2000; i++)
        if (!check(mgt_scale(s, x, 1.0f, n), "abort: scale"))
            goto done;
    if (!check(mgt_event_record(t1, s), "abort: event"))
        goto done;
    bool finished = true;
    if (!check(mgt_event_query(t1, &finished), "abort: query"))
        goto done;
    char detail[200];
    if (finished) {
        report(false, "abort: raised flag leaves a busy wait",
               "the 2000 kernels finished before the wait began: nothing to abort");
        goto done;
    }
    mgt_abort flag = {0};
    mgt_abort_raise(&flag);
    double start = mgt_time_now();
    mgt_status st = mgt_stream_synchronize(s, &flag);
    double left = mgt_time_now() - start;
    snprintf(detail, sizeof detail, "status %s after %.1f ms", mgt_status_str(st), left * 1e3);
    report(st == MGT_ERR_ABORTED && left < 0.05, "abort: raised flag leaves a busy wait", detail);
    if (!check(mgt_stream_synchronize(s, NULL), "abort: plain wait afterwards"))
        goto done;
    float ms = 0.0f;
    if (check(mgt_event_elapsed_ms(t0, t1, &ms), "events: elapsed")) {
        snprintf(detail, sizeof detail, "2000 x scale of 256 MiB took %.1f ms (%.0f GB/s)", ms,
                 2000.0 * 2 * n * sizeof(float) / (ms * 1e6));
        report(ms > 0.0f, "events: elapsed time", detail);
    }
done:
    mgt_event_free(t0);
    mgt_event_free(t1);
    mgt_buffer_free(b);
    mgt_stream_free(s);
    mgt_devset_free(set);
}

/* A label out of range must come back as MGT_ERR_DEVICE naming the op at the next wait, and
   stay (sticky) for later calls on that device. */
static void bad_label(void)
{
    int ids[1] = {0};
    mgt_devset *set = open_cuda(ids, 1, "bad label: open");
    if (set == NULL)
        return;
    mgt_device *d = mgt_devset_device(set, 0);
    mgt_stream *s = NULL;
    mgt_buffer *b = NULL;
    const int n = 4, classes = 10;
    int32_t labels[4] = {1, 2, classes, 3};
    float logits[40];
    for (int i = 0; i < n * classes; i++)
        logits[i] = (float)(i % 7) * 0.25f;
    if (!check(mgt_stream_create(d, &s), "bad label: setup") ||
        !check(mgt_buffer_alloc(d, 4096, &b), "bad label: setup"))
        goto done;
    char *base = mgt_buffer_ptr(b);
    float *dlogits = (float *)base, *dprobs = (float *)(base + 1024);
    float *dloss = (float *)(base + 2048);
    int32_t *dlabels = (int32_t *)(base + 3072);
    if (!check(mgt_copy_h2d(s, dlogits, logits, sizeof logits), "bad label: copy") ||
        !check(mgt_copy_h2d(s, dlabels, labels, sizeof labels), "bad label: copy"))
        goto done;
    mgt_status st =
        mgt_softmax_xent_forward(s, dloss, dprobs, dlogits, dlabels, NULL, NULL, n, classes, 0.1f);
    if (st == MGT_OK)
        st = mgt_stream_synchronize(s, NULL);
    char detail[600];
    snprintf(detail, sizeof detail, "%s: %s", mgt_status_str(st), mgt_error_last());
    report(st == MGT_ERR_DEVICE && strstr(mgt_error_last(), "softmax_xent_forward") != NULL,
           "bad label: device error naming the op", detail);
    st = mgt_fill(s, dloss, 0.0f, 1);
    if (st == MGT_OK)
        st = mgt_stream_synchronize(s, NULL);
    snprintf(detail, sizeof detail, "%s", mgt_status_str(st));
    report(st == MGT_ERR_DEVICE, "bad label: the error is sticky", detail);
done:
    mgt_buffer_free(b);
    mgt_stream_free(s);
    mgt_devset_free(set);
}

int main(void)
{
    int count = 0;
    if (mgt_device_kind_probe(MGT_DEVICE_CUDA, &count) != MGT_OK) {
        /* a skip passes only where nobody asked for CUDA: under tools/gpu-check.sh
           (MGT_REQUIRE_CUDA=1) it is the failure it is */
        const char *req = getenv("MGT_REQUIRE_CUDA");
        bool required = req && *req && strcmp(req, "0") != 0;
        printf("cuda_smoke: %s (%s)\n", required ? "FAIL" : "skipped", mgt_error_last());
        return required ? 1 : 0;
    }
    printf("cuda_smoke: %d CUDA device(s)\n", count);

    int bad_ids[1] = {count};
    mgt_devset *set = NULL;
    mgt_status st = mgt_devset_open(MGT_DEVICE_CUDA, bad_ids, 1, NULL, &set);
    char detail[600];
    snprintf(detail, sizeof detail, "%s: %s", mgt_status_str(st), mgt_error_last());
    report(st == MGT_ERR_INVALID, "ids: out-of-range id refused", detail);
    mgt_devset_free(set);

    int same[2] = {0, 0};
    set = open_cuda(same, 2, "replicas 0,0: open");
    if (set != NULL) {
        report(mgt_devset_can_access_peer(set, 0, 1), "replicas 0,0: direct copy", "");
        peer_roundtrip(set, "replicas 0,0: peer copy", 0x5a5a1234u);
        mgt_devset_free(set);
    }
    abortable_wait();

    setenv("MGT_NO_P2P", "1", 1);
    set = open_cuda(same, 2, "replicas 0,0 with MGT_NO_P2P=1: open");
    if (set != NULL) {
        report(!mgt_devset_can_access_peer(set, 0, 1), "MGT_NO_P2P=1: staging forced", "");
        peer_roundtrip(set, "MGT_NO_P2P=1: staged peer copy", 0x0badf00du);
        mgt_devset_free(set);
    }
    unsetenv("MGT_NO_P2P");

    if (count >= 2) {
        int pair[2] = {0, 1};
        set = open_cuda(pair, 2, "gpus 0,1: open");
        if (set != NULL) {
            printf("     gpus 0,1: peer access %s\n",
                   mgt_devset_can_access_peer(set, 0, 1) ? "verified" : "not available (staged)");
            peer_roundtrip(set, "gpus 0,1: peer copy", 0x13572468u);
            mgt_devset_free(set);
        }
    }

    bad_label();
    survive();

    printf("cuda_smoke: %d failure(s)\n", failures);
    return failures == 0 ? 0 : 1;
}
