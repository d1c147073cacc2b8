/* Tests of --on-device-failure continue on mock devices: a device that fails in a training step
   (forward, backward, the all-reduce, the optimizer) is dropped and the survivors go on, with
   final weights bit-identical to those of a run that trains the steps every device completed on
   4 devices, checkpoints, and resumes on the 3 survivors; the checkpoint written where the
   survivors cannot go on (--min-devices) holds exactly the 4-device steps; the fault matrix
   (each device x each kind of fault) finishes the epoch on the survivors with one line per
   lost device; two failures in one run; -b that does not divide over the survivors. */
#include <setjmp.h>
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
   peer copy in the first all-reduce, a kernel that hangs past --device-timeout (1 s, or ten
   times a set-up and step where that is longer), the device
   disappearing in step 1; the failed peer copy strikes step 0): the run finishes the epoch on
   the 3 survivors, says one line per
   lost device (the failure, then the re-formation), and validation counts every one of the 12
   images once. The lines it prints give the closing note's table. Cost: 16 runs and 4 probes,
   about 12 s on 2 busy cores (the hangs wait out their limit). */
static void test_fault_matrix(void **state)
{
    (void)state;
    long k1[4];
    /* the hang's limit: well above a step's time on this machine (busy, or sanitized) */
    double hang_limit = 10 * kernels_after_one_step(k1);
    hang_limit = hang_limit > 1 ? hang_limit : 1;
    int convs = mgt_test_convs_per_forward();
    static const char *const kinds[] = {"kernel", "peer", "hang", "gone"};
    for (int kind = 0; kind < 4; kind++)
        for (int d = 0; d < 4; d++) {
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
            const char *nl = strchr(line, '\n');
            const char *fault = strstr(text, "=> mock:");
            const char *fnl = fault ? strchr(fault, '\n') : NULL;
            print_message("%-7s mock:%d | %.*s | %.*s | run %.2f s\n", kinds[kind], d,
                          fnl ? (int)(fnl - fault - 3) : 0, fault ? fault + 3 : "",
                          nl ? (int)(nl - line - 3) : 0, line + 3, mgt_time_now() - t0);
            free(text);
        }
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
        !strstr(text, "(12 validation images)"))
        fail_msg("%s: %s\n%s", spec, st == MGT_OK ? "" : err, text);
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
        cmocka_unit_test(test_two_failures),
        cmocka_unit_test(test_batch_does_not_divide),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
