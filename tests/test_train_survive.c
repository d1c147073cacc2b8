/* Tests of --on-device-failure continue on mock devices: a device that fails in a training step
   (forward, backward, the all-reduce, the optimizer) is dropped and the survivors go on, with
   final weights bit-identical to those of a run that trains the steps every device completed on
   4 devices, checkpoints, and resumes on the 3 survivors; the checkpoint written where the
   survivors cannot go on (--min-devices) holds exactly the 4-device steps; the fault matrix
   (each device x each kind of fault) finishes the epoch on the survivors with one line per
   lost device; a hang inside the all-reduce; two failures in one run, two in one step, one in
   the validation; -b that does not divide over the survivors; Ctrl-C during the re-formation;
   a disk that fills up while the re-formation's checkpoint is written. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* fopencookie */
#endif
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "support/fixture.h"
#include "mgt/nn.h"
#include "mgt/safetensors.h"
#include "mgt/train.h"

static char root[256]; /* the temp folder of this run */
static char data_dir[300];

/* 4 classes of 12x12 gray images, the class being which quadrant holds a bright blob. */
static int quadrant_blob(int c, int x, int y, uint32_t noise)
{
    int cy = (c / 2) * 6 + 1, cx = (c % 2) * 6 + 1;
    int v = (int)(noise >> 27) * 4;
    return y >= cy && y < cy + 4 && x >= cx && x < cx + 4 ? v + 150 : v;
}

static int setup(void **state)
{
    (void)state;
    static const char *const cls[] = {"tl", "tr", "bl", "br"};
    mgt_test_make_dataset(root, sizeof root, "survive", cls, 4, 8, 3, 12, 321, quadrant_blob);
    snprintf(data_dir, sizeof data_dir, "%s/data", root);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return mgt_test_remove_tree(root);
}

static mgt_train_controls ctl;

/* resnet20 on the 32 training images, global batch 12 (3 per device on 4, 4 on 3: 3 steps),
   batch norm frozen so that the per-device batch does not change the arithmetic. */
static void base_config(mgt_train_config *c)
{
    mgt_train_config_defaults(c);
    c->data_dir = data_dir;
    c->arch = "resnet20";
    c->batch_size = 12;
    c->epochs = 1;
    c->lr.lr = 0.01f;
    c->freeze_bn = true;
    c->workers = 1;
    c->seed = 5;
    ctl = (mgt_train_controls){.out = mgt_test_quiet(), .no_validation = true};
}

/* A run of c on n mock devices with spec, its checkpoints in root/tag; *err its error text. */
static mgt_status run_in(mgt_train_config *c, int n, const char *spec, const char *tag, char *err,
                         size_t cap, mgt_train_result *res)
{
    static char dir[400];
    snprintf(dir, sizeof dir, "%s/%s", root, tag);
    c->checkpoint_dir = dir;
    mgt_devset *set = mgt_test_open_mock(n, spec);
    mgt_status st = mgt_train_run(c, &ctl, set, res);
    snprintf(err, cap, "%s", mgt_error_last());
    mgt_devset_free(set);
    return st;
}

/* Every tensor of a equals b's, bit for bit (the optimizer's momentum too). */
static void assert_same_tensors(const char *tag_a, const char *tag_b)
{
    char pa[512], pb[512];
    snprintf(pa, sizeof pa, "%s/%s/checkpoint.safetensors", root, tag_a);
    snprintf(pb, sizeof pb, "%s/%s/checkpoint.safetensors", root, tag_b);
    mgt_st_file *a, *b;
    if (mgt_st_open(pa, &a) != MGT_OK || mgt_st_open(pb, &b) != MGT_OK)
        fail_msg("%s", mgt_error_last());
    assert_int_equal(mgt_st_count(a), mgt_st_count(b));
    int differ = 0;
    const char *first = NULL;
    for (int i = 0; i < mgt_st_count(a); i++) {
        const char *name = mgt_st_tensor_name(a, i);
        int j = mgt_st_find(b, name);
        if (j < 0)
            fail_msg("%s: no tensor %s", pb, name);
        if (mgt_st_tensor_bytes(a, i) != mgt_st_tensor_bytes(b, j) ||
            memcmp(mgt_st_tensor_data(a, i), mgt_st_tensor_data(b, j), mgt_st_tensor_bytes(a, i))) {
            differ++;
            first = first ? first : name;
        }
    }
    if (differ)
        fail_msg("%s and %s: %d tensors differ (the first: %s)", tag_a, tag_b, differ, first);
    mgt_st_close(a);
    mgt_st_close(b);
}

/* The fault on device 2 (of 4) that strikes the given stage of step 1. */
typedef struct stage_fault {
    const char *stage; /* as the failure line names it */
    char spec[96];
    long resume; /* the step the survivors go on from */
} stage_fault;

/* The Nth peer copy into device 2 that lands in step 1's all-reduce: the first N whose failure
   (the run aborting) is placed there. The copies before training (the broadcasts) and per
   step depend on the bucket plan, so they are found, not assumed. */
static long peer_copy_in_step1_allreduce(void)
{
    mgt_train_config c;
    base_config(&c);
    for (long n = 1; n < 64; n++) {
        char spec[64], err[1024];
        snprintf(spec, sizeof spec, "threads=1;fault=peer@2:%ld", n);
        mgt_train_result res;
        run_in(&c, 4, spec, "probe", err, sizeof err, &res);
        if (strstr(err, "mock:2: epoch 0 step 1 (gradient all-reduce)"))
            return n;
        if (strstr(err, "step 2"))
            break;
    }
    fail_msg("no peer copy into mock:2 fails in step 1's all-reduce");
    return 0;
}

static void stage_faults(stage_fault f[4])
{
    f[0] = (stage_fault){.stage = "forward", .resume = 1};
    snprintf(f[0].spec, sizeof f[0].spec, "fault=kernel@2:%d:conv2d_forward",
             mgt_test_convs_per_forward() + 1);
    f[1] = (stage_fault){.stage = "backward", .resume = 1};
    snprintf(f[1].spec, sizeof f[1].spec, "fault=kernel@2:2:softmax_xent_backward");
    f[2] = (stage_fault){.stage = "gradient all-reduce", .resume = 1};
    snprintf(f[2].spec, sizeof f[2].spec, "fault=peer@2:%ld", peer_copy_in_step1_allreduce());
    /* the all-reduce completed on every device: the survivors make step 1's update */
    f[3] = (stage_fault){.stage = "optimizer", .resume = 2};
    snprintf(f[3].spec, sizeof f[3].spec, "fault=kernel@2:2:sgd_update");
}

/* Device 2 of 4 fails in each stage of step 1 in turn. With continue, the run finishes the
   epoch on the 3 survivors; its final weights and momentum equal, bit for bit, those of a
   4-device run stopped where the survivors cannot go on (--min-devices 4: it saves the
   4-device steps and exits, naming the lost device) and resumed on 3 devices. That checkpoint
   in turn equals a 4-device run of exactly those steps (--max-steps). Cost: 4 runs per stage
   and the all-reduce's probe, about 3 s on 2 cores. */
static void test_continue_equals_checkpoint_and_resume(void **state)
{
    (void)state;
    stage_fault faults[4];
    stage_faults(faults);
    for (int k = 0; k < 4; k++) {
        const stage_fault *f = &faults[k];
        char spec[128], err[1024], want[128], tag[64];
        mgt_train_result res;
        snprintf(spec, sizeof spec, "threads=1;%s", f->spec);
        /* 1: the survivors go on */
        mgt_train_config c;
        base_config(&c);
        c.continue_on_device_failure = true;
        snprintf(tag, sizeof tag, "continue%d", k);
        mgt_status st = run_in(&c, 4, spec, tag, err, sizeof err, &res);
        if (st != MGT_OK)
            fail_msg("%s (%s): the run failed: %s", f->stage, spec, err);
        assert_int_equal(res.epochs_done, 1);
        mgt_train_result cont = res;
        /* 2: not enough devices left: the 4-device state is saved, the run ends naming it */
        base_config(&c);
        c.continue_on_device_failure = true;
        c.min_devices = 4;
        snprintf(tag, sizeof tag, "stopped%d", k);
        st = run_in(&c, 4, spec, tag, err, sizeof err, &res);
        snprintf(want, sizeof want, "devices lost: mock:2 (epoch 0 step 1)");
        if (st == MGT_OK || !strstr(err, want) || !strstr(err, "below --min-devices 4") ||
            strchr(err, '\n'))
            fail_msg("%s: expected one line with \"%s\", got status %d: %s", f->stage, want,
                     (int)st, err);
        /* 3: the 4-device steps alone */
        base_config(&c);
        ctl.max_steps = f->resume;
        snprintf(tag, sizeof tag, "steps%d", k);
        if (run_in(&c, 4, "threads=1", tag, err, sizeof err, &res) != MGT_OK)
            fail_msg("%s", err);
        mgt_train_result before = res;
        char a[32], b[32];
        snprintf(a, sizeof a, "stopped%d", k);
        assert_same_tensors(a, tag);
        /* 4: that checkpoint resumed on 3 devices */
        base_config(&c);
        char path[512];
        snprintf(path, sizeof path, "%s/stopped%d/checkpoint.safetensors", root, k);
        c.resume = path;
        c.start_epoch = -1;
        snprintf(tag, sizeof tag, "resumed%d", k);
        if (run_in(&c, 3, "threads=1", tag, err, sizeof err, &res) != MGT_OK)
            fail_msg("resume: %s", err);
        snprintf(a, sizeof a, "continue%d", k);
        snprintf(b, sizeof b, "resumed%d", k);
        assert_same_tensors(a, b);
        /* the epoch's loss and top-1 cover every step of it: the 4-device steps' (12 images
           each) with the survivors' (36 images in all); where the optimizer failed, after the
           commit, the lost device's share of step 1 was never metered */
        if (k < 3) {
            double n0 = (double)before.train_images, n1 = (double)res.train_images;
            double loss = (before.train_loss * n0 + res.train_loss * n1) / (n0 + n1);
            double acc1 = (before.train_acc1 * n0 + res.train_acc1 * n1) / (n0 + n1);
            if (cont.train_images != before.train_images + res.train_images ||
                fabs(cont.train_loss - loss) > 1e-5 * fabs(loss) ||
                fabs(cont.train_acc1 - acc1) > 1e-9)
                fail_msg("%s: the epoch's loss %.7f and top-1 %.4f over %ld images, expected "
                         "%.7f and %.4f (steps before the loss: %.7f, %.4f over %ld; after: "
                         "%.7f, %.4f over %ld)",
                         f->stage, cont.train_loss, cont.train_acc1, cont.train_images, loss, acc1,
                         before.train_loss, before.train_acc1, before.train_images, res.train_loss,
                         res.train_acc1, res.train_images);
        }
        /* the optimizer's failure: device 2's 3 images of step 1 never reached the host */
        if (k == 3 && cont.train_images != before.train_images + res.train_images - 3)
            fail_msg("%s: %ld images metered, expected %ld", f->stage, cont.train_images,
                     before.train_images + res.train_images - 3);
        if (cont.steps != 3)
            fail_msg("%s: %ld steps counted, the epoch has 3", f->stage, cont.steps);
        print_message("device 2 lost in step 1 (%s): identical to 4 devices + resume on 3\n",
                      f->stage);
    }
}

/* The run's progress text (ctl.out) as a string: malloc'd. */
static char *slurp(FILE *f)
{
    fflush(f);
    long n = ftell(f);
    char *s = calloc((size_t)n + 1, 1);
    assert_non_null(s);
    rewind(f);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    return s;
}

static int count_of(const char *text, const char *what)
{
    int n = 0;
    for (const char *p = strstr(text, what); p; p = strstr(p + 1, what))
        n++;
    return n;
}

/* A run with continue and validation whose output is kept; returns it (malloc'd). */
static char *run_continue(mgt_train_config *c, int n, const char *spec, const char *tag,
                          mgt_status *st, char *err, size_t cap, mgt_train_result *res)
{
    FILE *out = tmpfile();
    assert_non_null(out);
    ctl.out = out;
    ctl.no_validation = false;
    *st = run_in(c, n, spec, tag, err, cap, res);
    char *text = slurp(out);
    fclose(out);
    return text;
}

/* Kernels each device of 4 has run after set-up and one training step (no validation); the
   seconds the run took. */
static double kernels_after_one_step(long k[4])
{
    double t0 = mgt_time_now();
    mgt_train_config c;
    base_config(&c);
    ctl.max_steps = 1;
    mgt_devset *set = mgt_test_open_mock(4, "threads=1");
    mgt_train_result res;
    if (mgt_train_run(&c, &ctl, set, &res) != MGT_OK)
        fail_msg("%s", mgt_error_last());
    for (int d = 0; d < 4; d++) {
        long allocs;
        assert_true(mgt_device_counts(mgt_devset_device(set, d), &allocs, &k[d]));
    }
    mgt_devset_free(set);
    return mgt_time_now() - t0;
}

/* The first peer copy into device d in training (those before are the set-up's broadcasts,
   whose failure ends the run): found by runs that abort. */
static long first_peer_copy_in_training(int d)
{
    mgt_train_config c;
    base_config(&c);
    ctl.max_steps = 1;
    for (long n = 1; n < 16; n++) {
        char spec[64], err[1024];
        snprintf(spec, sizeof spec, "threads=1;fault=peer@%d:%ld", d, n);
        mgt_train_result res;
        run_in(&c, 4, spec, "probe", err, sizeof err, &res);
        if (strstr(err, "epoch 0 step 0"))
            return n;
    }
    fail_msg("no peer copy into mock:%d fails in step 0", d);
    return 0;
}

/* Each device of 4 x each kind of fault in step 1 (a kernel error in the forward, a failed
   peer copy in the first all-reduce, a kernel that hangs past --device-timeout (1 s, or six
   times a set-up and step where that is longer), the device disappearing in step 1; the failed
   peer copy strikes step 0): the run finishes the epoch on the 3 survivors, says one line per
   lost device (the failure, placed in its device and stage, then the re-formation), and
   validation counts every one of the 12 images once. The lines it prints give the closing
   note's table. Cost: 16 runs and 4 probes, about 12 s on 2 busy cores (the hangs wait out
   their limit). */
static void test_fault_matrix(void **state)
{
    (void)state;
    long k1[4];
    /* the hang's limit: well above a step's time on this machine (busy, or sanitized): six
       times a set-up and a step */
    double hang_limit = 6 * kernels_after_one_step(k1);
    hang_limit = hang_limit > 1 ? hang_limit : 1;
    int convs = mgt_test_convs_per_forward();
    static const char *const kinds[] = {"kernel", "peer", "hang", "gone"};
    /* under the thread sanitizer each kind on the tree's root and on a leaf (45 s for all 16
       there); the plain and address builds run every device */
    for (int kind = 0; kind < 4; kind++)
        for (int d = 0; d < 4; d += MGT_TEST_THREAD_SANITIZED ? 3 : 1) {
            char spec[128], err[1024], tag[32], want[128];
            switch (kind) {
            case 0:
                snprintf(spec, sizeof spec, "threads=1;fault=kernel@%d:%d:conv2d_forward", d,
                         convs + 1);
                break;
            case 1:
                snprintf(spec, sizeof spec, "threads=1;fault=peer@%d:%ld", d,
                         first_peer_copy_in_training(d));
                break;
            case 2:
                snprintf(spec, sizeof spec, "threads=1;fault=hang@%d:%d:conv2d_forward", d,
                         convs + 1);
                break;
            default: snprintf(spec, sizeof spec, "threads=1;fault=gone@%d:%ld", d, k1[d] + 3);
            }
            mgt_train_config c;
            base_config(&c);
            c.continue_on_device_failure = true;
            if (kind == 2)
                c.device_timeout_s = hang_limit;
            snprintf(tag, sizeof tag, "matrix%d%d", kind, d);
            mgt_status st;
            mgt_train_result res;
            double t0 = mgt_time_now();
            char *text = run_continue(&c, 4, spec, tag, &st, err, sizeof err, &res);
            if (st != MGT_OK || res.epochs_done != 1)
                fail_msg("%s: the run failed: %s\n%s", spec, err, text);
            snprintf(want, sizeof want, "=> mock:%d dropped: training goes on with 3 devices", d);
            const char *line = strstr(text, want);
            if (!line || count_of(text, "dropped: training goes on") != 1 ||
                !strstr(text, "(12 validation images)"))
                fail_msg("%s: expected one \"%s\" and 12 validation images:\n%s", spec, want, text);
            /* the failure's line: its device, step, stage and cause (the failed peer copy
               runs in the all-reduce, which overlaps the backward: either stage names it) */
            char fault_line[256];
            const char *stage = kind == 1 ? "backward" : "forward";
            for (int alt = 0; alt < 2; alt++) {
                switch (kind) {
                case 0:
                    snprintf(want, sizeof want,
                             "(%s): injected fault in kernel conv2d_forward (conv2d_forward #%d "
                             "on this device)\n",
                             stage, convs + 1);
                    break;
                case 1:
                    snprintf(want, sizeof want, "(%s): injected failure of a peer copy of ", stage);
                    break;
                case 2: /* placed: device, stage and the flag that set it */
                    snprintf(want, sizeof want,
                             "(%s): its work made no progress within --device-timeout ", stage);
                    break;
                default:
                    snprintf(want, sizeof want,
                             "(%s): the device is gone (injected: it fell off the bus at kernel ",
                             stage);
                }
                snprintf(fault_line, sizeof fault_line, "=> mock:%d: epoch 0 step %d %s", d,
                         kind == 1 ? 0 : 1, want);
                if (strstr(text, fault_line) || kind != 1)
                    break;
                stage = "gradient all-reduce";
            }
            if (!strstr(text, fault_line) || count_of(text, "=> mock:") != 2)
                fail_msg("%s: expected \"%s\" and one line per lost device:\n%s", spec, fault_line,
                         text);
            const char *nl = strchr(line, '\n');
            const char *fault = strstr(text, "=> mock:");
            const char *fnl = fault ? strchr(fault, '\n') : NULL;
            print_message("%-7s mock:%d | %.*s | %.*s | run %.2f s\n", kinds[kind], d,
                          fnl ? (int)(fnl - fault - 3) : 0, fault ? fault + 3 : "",
                          nl ? (int)(nl - line - 3) : 0, line + 3, mgt_time_now() - t0);
            free(text);
        }
}

/* A kernel of the all-reduce that hangs (device 2's first sum of a peer's gradients, on its
   comm stream): every device's own forward and backward are done and every device's wait for
   the exchange runs out, whichever first; the stall is still placed on device 2, in the
   gradient all-reduce, naming --device-timeout, and the epoch ends on the 3 others. Cost: one
   run that waits out twice the limit (1 s, or five times a set-up and step). */
static void test_hang_in_allreduce(void **state)
{
    (void)state;
    long k1[4];
    double hang_limit = 5 * kernels_after_one_step(k1);
    mgt_train_config c;
    base_config(&c);
    c.continue_on_device_failure = true;
    c.device_timeout_s = hang_limit > 1 ? hang_limit : 1;
    mgt_status st;
    mgt_train_result res;
    char err[1024];
    const char *spec = "threads=1;fault=hang@2:1:axpy";
    char *text = run_continue(&c, 4, spec, "hang_allreduce", &st, err, sizeof err, &res);
    if (st != MGT_OK || res.epochs_done != 1 ||
        !strstr(text, "=> mock:2: epoch 0 step 0 (gradient all-reduce): its work made no "
                      "progress within --device-timeout ") ||
        !strstr(text, "=> mock:2 dropped: training goes on with 3 devices") ||
        !strstr(text, "(12 validation images)"))
        fail_msg("%s: %s\n%s", spec, st == MGT_OK ? "" : err, text);
    free(text);
}

/* Device 2's worker thread never comes back from launching its first convolution of step 1
   (fault=stuck: a thread stuck in the driver; its device shows no stalled work, the host never
   queued it): the others' waits run out, the stuck worker is detached after the wait limit
   instead of joined, its device given up with one line, and the epoch ends on the 3 others;
   the call comes back once the device set is freed, and its thread then touches nothing freed.
   Cost: one run that waits out the limit four times (the run's watch, three times the limit,
   then the join's), the limit three times a set-up and step (no sound device's wait comes near
   it: the others wait on the host for the stuck one). */
static void test_stuck_worker_is_abandoned(void **state)
{
    (void)state;
    long k1[4];
    double hang_limit = 3 * kernels_after_one_step(k1);
    int convs = mgt_test_convs_per_forward();
    mgt_train_config c;
    base_config(&c);
    c.continue_on_device_failure = true;
    c.device_timeout_s = hang_limit > 1 ? hang_limit : 1;
    char spec[96], err[1024];
    snprintf(spec, sizeof spec, "threads=1;fault=stuck@2:%d:conv2d_forward", convs + 1);
    mgt_status st;
    mgt_train_result res;
    char *text = run_continue(&c, 4, spec, "stuck", &st, err, sizeof err, &res);
    /* the stuck call comes back once the set is freed (run_in's end) and its thread goes on
       through the trainer's code: what it touches was kept (mgt_device_strand); under the
       address sanitizer a read of freed memory ends the test here */
    usleep(100000);
    if (st != MGT_OK || res.epochs_done != 1 ||
        !strstr(text, "=> mock:2: epoch 0 step 1 (stuck in a call): its worker thread has not "
                      "come back from a call to the device within --device-timeout ") ||
        !strstr(text, "=> mock:2 dropped: training goes on with 3 devices") ||
        !strstr(text, "(12 validation images)"))
        fail_msg("%s: %s\n%s", spec, st == MGT_OK ? "" : err, text);
    free(text);
}

/* Two devices lost in one run, the second (device 1's first convolution after the first
   loss) in the re-run of the step the first lost: the epoch ends on the 2 left, each loss its
   line; the checkpoint says which devices were lost and where. Then, with --min-devices 3, the
   second is the last device above it: the state is saved and the run ends naming both. */
static void test_two_failures(void **state)
{
    (void)state;
    int convs = mgt_test_convs_per_forward();
    char spec[160], err[1024];
    snprintf(spec, sizeof spec,
             "threads=1;fault=kernel@2:%d:conv2d_forward;fault=kernel@1:%d:conv2d_forward",
             convs + 1, 2 * convs + 1);
    mgt_train_config c;
    base_config(&c);
    c.continue_on_device_failure = true;
    mgt_status st;
    mgt_train_result res;
    char *text = run_continue(&c, 4, spec, "two", &st, err, sizeof err, &res);
    if (st != MGT_OK || res.epochs_done != 1 ||
        !strstr(text, "=> mock:2 dropped: training goes on with 3 devices") ||
        !strstr(text, "=> mock:1 dropped: training goes on with 2 devices (mock:0, mock:3)") ||
        !strstr(text, "(12 validation images)") || count_of(text, "=> mock:") != 4)
        fail_msg("%s: %s\n%s", spec, st == MGT_OK ? "" : err, text);
    /* each failure's line: its device, step, stage and cause. Device 1's convolution #43 is
       the first of its forward after the first loss: step 1's re-run, or step 2's forward
       where the abort came before device 1 had begun step 1's (its count then lags a step) */
    for (int i = 0; i < 2; i++) {
        char want[192];
        snprintf(want, sizeof want,
                 " (forward): injected fault in kernel conv2d_forward (conv2d_forward #%d on "
                 "this device)\n",
                 (i + 1) * convs + 1);
        char head[64];
        snprintf(head, sizeof head, "=> mock:%d: epoch 0 step ", 2 - i);
        const char *at = strstr(text, head);
        char *rest = NULL;
        long step = at ? strtol(at + strlen(head), &rest, 10) : -1;
        if (!at || step != 1 + (i && step == 2) || strncmp(rest, want, strlen(want)) != 0)
            fail_msg("%s: expected \"%s1%s\":\n%s", spec, head, want, text);
    }
    free(text);
    char path[512];
    snprintf(path, sizeof path, "%s/two/checkpoint.safetensors", root);
    mgt_st_file *f;
    if (mgt_st_open(path, &f) != MGT_OK)
        fail_msg("%s", mgt_error_last());
    const char *lost = mgt_st_metadata_get(f, "devices_lost");
    if (!lost || !strstr(lost, "mock:2 at epoch 0 step 1 (forward)") ||
        !strstr(lost, "mock:1 at epoch 0 step"))
        fail_msg("devices_lost: %s", lost ? lost : "(none)");
    mgt_st_close(f);

    base_config(&c);
    c.continue_on_device_failure = true;
    c.min_devices = 3;
    text = run_continue(&c, 4, spec, "min3", &st, err, sizeof err, &res);
    if (st == MGT_OK || !strstr(err, "2 devices left, below --min-devices 3") ||
        !strstr(err, "devices lost: mock:2 (epoch 0 step 1), mock:1 (epoch 0 step") ||
        !strstr(err, "saved ") || strchr(err, '\n'))
        fail_msg("--min-devices 3: status %d: %s", (int)st, err);
    free(text);
}

/* Two devices fail in the same step (step 1's optimizer on devices 1 and 2: after the step's
   commit every device queues its update, so both faults strike whichever is noticed first; two
   in the forward would race the first one's abort): both are dropped in one re-formation, each
   said in its own line with its device, step, stage and cause, whichever thread noticed first
   (a device whose record of its optimizer mark failed at once, the fault already known, is
   placed by where its worker stood), and the epoch ends on the 2 left. Then device 1
   fails in the validation (its first convolution after the 3 training steps): the validation
   runs again on the 3 survivors, counting each of the 12 images once, and the epoch ends.
   Cost: 2 runs, about 1 s. */
static void test_two_in_one_step_and_validation(void **state)
{
    (void)state;
    int convs = mgt_test_convs_per_forward();
    char spec[160], err[1024];
    snprintf(spec, sizeof spec,
             "threads=1;fault=kernel@1:2:sgd_update;fault=kernel@2:2:sgd_update");
    mgt_train_config c;
    base_config(&c);
    c.continue_on_device_failure = true;
    mgt_status st;
    mgt_train_result res;
    char *text = run_continue(&c, 4, spec, "two_in_one", &st, err, sizeof err, &res);
    if (st != MGT_OK || res.epochs_done != 1 || count_of(text, " dropped: ") != 1 ||
        count_of(text, "=> mock:") != 3 ||
        !strstr(text, "=> mock:1: epoch 0 step 1 (optimizer): injected fault in kernel "
                      "sgd_update (sgd_update #2 on this device)\n") ||
        !strstr(text, "=> mock:2: epoch 0 step 1 (optimizer): injected fault in kernel "
                      "sgd_update (sgd_update #2 on this device)\n") ||
        !strstr(text, "dropped: training goes on with 2 devices (mock:0, mock:3) from epoch 0 "
                      "step 2, 6 images per device") ||
        !strstr(text, "(12 validation images)"))
        fail_msg("%s: %s\n%s", spec, st == MGT_OK ? "" : err, text);
    free(text);

    snprintf(spec, sizeof spec, "threads=1;fault=kernel@1:%d:conv2d_forward", 3 * convs + 1);
    base_config(&c);
    c.continue_on_device_failure = true;
    text = run_continue(&c, 4, spec, "in_validation", &st, err, sizeof err, &res);
    if (st != MGT_OK || res.epochs_done != 1 ||
        !strstr(text, "=> mock:1: validation of epoch 0, batch 0: injected fault") ||
        !strstr(text, "=> mock:1 dropped: the validation of epoch 0 runs again on 3 devices "
                      "(mock:0, mock:2, mock:3)") ||
        count_of(text, "validation images)") != 1 || !strstr(text, "(12 validation images)"))
        fail_msg("%s: %s\n%s", spec, st == MGT_OK ? "" : err, text);
    free(text);
}

/* An output stream that copies what the run prints into `copy` and, on the first line holding
   `needle`, calls `act`: something that happens while the run is at that line (the failure's
   line is printed as the re-formation begins). */
typedef struct watch {
    FILE *copy;
    const char *needle;
    void (*act)(void);
    bool acted;
} watch;

static ssize_t watch_write(void *cookie, const char *buf, size_t n)
{
    watch *w = cookie;
    fwrite(buf, 1, n, w->copy);
    char line[1024];
    snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line ? n : sizeof line - 1), buf);
    if (!w->acted && strstr(line, w->needle)) {
        w->acted = true;
        w->act();
    }
    return (ssize_t)n;
}

/* A run of c on 4 mock devices whose output is watched; returns the output (malloc'd). */
static char *run_watched(mgt_train_config *c, const char *spec, const char *tag, watch *w,
                         mgt_status *st, char *err, size_t cap, mgt_train_result *res)
{
    w->copy = tmpfile();
    assert_non_null(w->copy);
    FILE *out = fopencookie(w, "w", (cookie_io_functions_t){.write = watch_write});
    assert_non_null(out);
    setvbuf(out, NULL, _IOLBF, 0); /* each line reaches watch_write as it is printed */
    ctl.out = out;
    ctl.no_validation = false;
    *st = run_in(c, 4, spec, tag, err, cap, res);
    fclose(out);
    char *text = slurp(w->copy);
    fclose(w->copy);
    return text;
}

static atomic_int stop_flag;
static void press_ctrl_c(void) { atomic_store(&stop_flag, 1); }

/* The disk fills up: no file of this process may grow past 64 KiB (a checkpoint is 2 MiB). */
static void limit_file_size(void)
{
    struct rlimit low;
    getrlimit(RLIMIT_FSIZE, &low);
    low.rlim_cur = 64 << 10;
    setrlimit(RLIMIT_FSIZE, &low);
}

/* Ctrl-C (the stop flag that SIGINT raises) while the survivors of device 2's loss re-form: the
   run stops there, once they are set up, with the state they hold saved (epoch 0 step 1, the
   re-formation's checkpoint) and one line saying so; that checkpoint resumes on 3 devices. A
   disk that fills up while the re-formation's checkpoint is written (the file size limit set
   as device 2's loss is printed, in epoch 1): the run ends with one line naming the lost
   device and the failed write, and the checkpoint of epoch 0 stays whole and loadable. Cost:
   4 runs, about 2 s. */
static void test_interrupt_and_full_disk_in_reformation(void **state)
{
    (void)state;
    int convs = mgt_test_convs_per_forward();
    char spec[96], err[1024], path[512];
    snprintf(spec, sizeof spec, "threads=1;fault=kernel@2:%d:conv2d_forward", convs + 1);
    mgt_train_config c;
    base_config(&c);
    c.continue_on_device_failure = true;
    atomic_store(&stop_flag, 0);
    ctl.stop = &stop_flag;
    watch w = {.needle = "=> mock:2: epoch 0 step 1", .act = press_ctrl_c};
    mgt_status st;
    mgt_train_result res;
    char *text = run_watched(&c, spec, "interrupted", &w, &st, err, sizeof err, &res);
    if (st != MGT_OK || !res.interrupted || res.epochs_done != 0 || !w.acted ||
        !strstr(text, "=> mock:2 dropped: training goes on with 3 devices") ||
        !strstr(text, "=> stopped at epoch 0 step 1, during the re-formation; checkpoint ") ||
        strstr(text, "Epoch: [0][2/3]"))
        fail_msg("status %d: %s\n%s", (int)st, st == MGT_OK ? "" : err, strstr(text, "=> mock:2"));
    free(text);
    base_config(&c);
    snprintf(path, sizeof path, "%s/interrupted/checkpoint.safetensors", root);
    c.resume = path;
    c.start_epoch = -1;
    if (run_in(&c, 3, "threads=1", "interrupted3", err, sizeof err, &res) != MGT_OK ||
        res.epochs_done != 1)
        fail_msg("resume on 3: %s", err);

    /* the disk fills up: epoch 1 step 1 (after 3 steps and a validation batch in epoch 0) */
    snprintf(spec, sizeof spec, "threads=1;fault=kernel@2:%d:conv2d_forward", 5 * convs + 1);
    base_config(&c);
    c.epochs = 2;
    c.continue_on_device_failure = true;
    struct rlimit old;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN); /* a write past it fails with EFBIG */
    watch full = {.needle = "=> mock:2: epoch 1 step 1", .act = limit_file_size};
    text = run_watched(&c, spec, "full", &full, &st, err, sizeof err, &res);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, old_handler);
    if (st == MGT_OK || !full.acted || res.epochs_done != 1 || strchr(err, '\n') ||
        !strstr(err, "--on-device-failure continue: the survivors' state could not be handed "
                     "over: ") ||
        !strstr(err, "devices lost: mock:2 (epoch 1 step 1)") ||
        !strstr(err, "nothing saved since the last checkpoint"))
        fail_msg("status %d: %s\n%s", (int)st, err, text);
    free(text);
    snprintf(path, sizeof path, "%s/full/checkpoint.safetensors", root);
    mgt_st_file *f;
    if (mgt_st_open(path, &f) != MGT_OK)
        fail_msg("the previous checkpoint: %s", mgt_error_last());
    const char *ep = mgt_st_metadata_get(f, "epoch");
    if (!ep || strcmp(ep, "1") != 0)
        fail_msg("the checkpoint left is not epoch 0's: epoch %s", ep ? ep : "(none)");
    mgt_st_close(f);
    base_config(&c);
    c.epochs = 2;
    c.resume = path;
    c.start_epoch = -1;
    if (run_in(&c, 3, "threads=1", "full3", err, sizeof err, &res) != MGT_OK ||
        res.epochs_done != 1)
        fail_msg("resume on 3: %s", err);
}

/* -b 8 over 4 devices, one lost: 8 does not divide over 3, the global batch must stay: the
   state is saved and the run ends saying so; the checkpoint resumes on 2 devices. */
static void test_batch_does_not_divide(void **state)
{
    (void)state;
    int convs = mgt_test_convs_per_forward();
    char spec[96], err[1024];
    snprintf(spec, sizeof spec, "threads=1;fault=kernel@3:%d:conv2d_forward", convs + 1);
    mgt_train_config c;
    base_config(&c);
    c.batch_size = 8;
    c.continue_on_device_failure = true;
    mgt_status st;
    mgt_train_result res;
    char *text = run_continue(&c, 4, spec, "nodiv", &st, err, sizeof err, &res);
    free(text);
    if (st == MGT_OK || !strstr(err, "-b 8 does not divide over the 3 devices left") ||
        !strstr(err, "saved ") || !strstr(err, "step 1"))
        fail_msg("status %d: %s", (int)st, err);
    base_config(&c);
    c.batch_size = 8;
    char path[512];
    snprintf(path, sizeof path, "%s/nodiv/checkpoint.safetensors", root);
    c.resume = path;
    if (run_in(&c, 2, "threads=1", "nodiv2", err, sizeof err, &res) != MGT_OK)
        fail_msg("resume on 2: %s", err);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_continue_equals_checkpoint_and_resume),
        cmocka_unit_test(test_fault_matrix),
        cmocka_unit_test(test_hang_in_allreduce),
        cmocka_unit_test(test_stuck_worker_is_abandoned),
        cmocka_unit_test(test_two_failures),
        cmocka_unit_test(test_two_in_one_step_and_validation),
        cmocka_unit_test(test_interrupt_and_full_disk_in_reformation),
        cmocka_unit_test(test_batch_does_not_divide),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
