/* Tests of how a training run fails, on mock devices: every allocation of a run failing in
   turn, on each device, ends it with one line naming that allocation (no crash, no leak, the
   injected cause never replaced by what cleanup says); a kernel fault is reported with the
   device and the step where it happened, whichever thread noticed it first, run after run
   under random op delays; a NaN loss names the step it came from; a diverged model (NaN
   logits, non-finite weights or statistics) stops the run, counts no image as correct and is
   never saved. (Faults in every phase and the step timeout: test_train.c.) */
#include <math.h>
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
    static const char *const cls[4] = {"a", "b", "c", "d"};
    mgt_test_make_dataset(root, sizeof root, "failure", cls, 4, 8, 3, 12, 321, quadrant_blob);
    snprintf(data_dir, sizeof data_dir, "%s/data", root);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return mgt_test_remove_tree(root);
}

static mgt_train_controls ctl;

/* resnet20 on the 32 training images, global batch 8, one decode thread. */
static void base_config(mgt_train_config *c)
{
    mgt_train_config_defaults(c);
    c->data_dir = data_dir;
    c->arch = "resnet20";
    c->batch_size = 8;
    c->epochs = 1;
    c->lr.lr = 0.05f;
    c->workers = 1;
    c->seed = 3;
    ctl = (mgt_train_controls){.out = mgt_test_quiet()};
}

/* The run of c on n mock devices with spec; *err gets its error text, *allocs and *kernels
   what device `dev` counted. */
static mgt_status run_counted(const mgt_train_config *c, int n, const char *spec, int dev,
                              char *err, size_t cap, long *allocs, long *kernels)
{
    mgt_devset *set = mgt_test_open_mock(n, spec);
    mgt_train_result res;
    mgt_status st = mgt_train_run(c, &ctl, set, &res);
    snprintf(err, cap, "%s", mgt_error_last());
    assert_true(mgt_device_counts(mgt_devset_device(set, dev), allocs, kernels));
    mgt_devset_free(set);
    return st;
}

/* ---- 1, 2: every allocation of a run fails in turn ---- */

#define SWEEP_DEVICES 3

/* On 3 devices (0 and 1 peers, 2 reached through pinned host memory), the Nth allocation of
   device d fails for every N up to the last one the run makes there (the trainer's set-up:
   loaders, replicas, optimizer state, metric slots, the all-reduce; and whatever a step or
   the validation might add): each run must end with MGT_ERR_OOM and one line that names
   device d and allocation #N (a swallowed fault would train on; a cleanup's error would
   replace the cause). The run after the last allocation must succeed. Cost: 69 runs (22
   allocations on each device, and a clean run each) of 2 steps and a validation: 4 to 6 s on 2
   cores, 39 s under the address sanitizer. */
static void test_every_allocation_fails_cleanly(void **state)
{
    (void)state;
    mgt_train_config c;
    base_config(&c);
    ctl.max_steps = 2;
    int runs = 0;
    double t0 = mgt_time_now();
    for (int d = 0; d < SWEEP_DEVICES; d++) {
        for (long n = 1;; n++) {
            char spec[96], err[1024], want[96];
            snprintf(spec, sizeof spec, "threads=1;peers=0-1;fault=alloc@%d:%ld", d, n);
            long allocs, kernels;
            mgt_status st =
                run_counted(&c, SWEEP_DEVICES, spec, d, err, sizeof err, &allocs, &kernels);
            runs++;
            if (allocs < n) { /* the fault never came: the run is a clean one */
                if (st != MGT_OK)
                    fail_msg("%s: no injected fault, yet the run failed: %s", spec, err);
                print_message("mock:%d: %ld allocations, each failed in turn\n", d, n - 1);
                assert_true(n > 5); /* replica, optimizer, slots at least */
                break;
            }
            snprintf(want, sizeof want,
                     "mock:%d: injected allocation failure (allocation #%ld on this device", d, n);
            if (st != MGT_ERR_OOM || !strstr(err, want) || strchr(err, '\n'))
                fail_msg("%s: expected MGT_ERR_OOM and one line with \"%s\", got status %d: %s",
                         spec, want, (int)st, err);
            assert_true(n < 1000);
        }
    }
    print_message("%d runs in %.1f s\n", runs, mgt_time_now() - t0);
}

/* ---- 5: the failure line names where the fault happened ---- */

/* The first convolution of step 2's forward on device 0 of 4 fails. Under random delays of
   every queued op, which thread notices first (device 0's worker, a peer's all-reduce, the
   loader copying to device 0, a metrics wait) changes from run to run; the line must not:
   device 0, epoch 0, step 2, forward, the injected cause. */
static void test_fault_line_names_device_and_step(void **state)
{
    (void)state;
    mgt_train_config c;
    base_config(&c);
    c.batch_size = 8; /* 2 images per device: 4 steps */
    ctl.no_validation = true;
    long nth = 2L * mgt_test_convs_per_forward() + 1;
    char want[256];
    snprintf(want, sizeof want,
             "mock:0: epoch 0 step 2 (forward): injected fault in kernel conv2d_forward "
             "(conv2d_forward #%ld on this device)",
             nth);
    for (int seed = 1; seed <= 6; seed++) {
        char spec[128], err[1024];
        snprintf(spec, sizeof spec, "threads=1;delay=300;seed=%d;fault=kernel@0:%ld:conv2d_forward",
                 seed, nth);
        long allocs, kernels;
        mgt_status st = run_counted(&c, 4, spec, 0, err, sizeof err, &allocs, &kernels);
        if (st != MGT_ERR_DEVICE || strcmp(err, want) != 0)
            fail_msg("%s: status %d, line\n  %s\nexpected\n  %s", spec, (int)st, err, want);
    }
}

/* A NaN loss is reported at the step whose loss it is, once: not "epoch 0 step 4 (reading
   metrics): the loss is NaN at epoch 0 step 2". */
static void test_nan_line_names_its_step(void **state)
{
    (void)state;
    mgt_train_config c;
    base_config(&c);
    c.lr.lr = 1e30f;
    c.epochs = 2;
    ctl.no_validation = true;
    char first[1024] = "";
    for (int seed = 1; seed <= 3; seed++) {
        char spec[64], err[1024];
        snprintf(spec, sizeof spec, "threads=1;delay=200;seed=%d", seed);
        long allocs, kernels;
        mgt_status st = run_counted(&c, 2, spec, 0, err, sizeof err, &allocs, &kernels);
        const char *at = strstr(err, "step ");
        if (st != MGT_ERR_DEVICE || !at || strstr(at + 1, "step ") ||
            !strstr(err, "(loss): the loss is NaN"))
            fail_msg("%s: status %d: %s", spec, (int)st, err);
        /* the device may differ (each replica's own loss is NaN), the step may not */
        const char *step = strstr(err, "epoch ");
        if (!first[0])
            snprintf(first, sizeof first, "%s", step);
        else if (strcmp(first, step) != 0)
            fail_msg("the NaN is placed at \"%s\", then at \"%s\"", first, step);
    }
}

/* ---- 3: a diverged model is neither counted correct nor saved ---- */

/* lr 1e6 on the committed sample: two steps keep finite losses (1e11) and weights while the
   logits overflow, so validation's loss is NaN (before: " * Acc@1 100.000 Loss -nan", exit 0,
   and model_best.safetensors written); also with AdamW. A third step makes the running
   variances infinite: the end-of-epoch check names them. Each stops the run naming why, counts
   no image as correct, and writes nothing: the folder's last good checkpoint stays as it was. */
static void test_diverged_model_is_not_saved(void **state)
{
    (void)state;
    static const struct {
        mgt_opt_kind opt;
        long steps;
        const char *want, *want2; /* (the count of values is the arithmetic's) */
    } cases[] = {
        {MGT_OPT_SGD, 2, "epoch 0: the validation loss is NaN: the model has diverged", ""},
        {MGT_OPT_ADAMW, 2, "epoch 0: the validation loss is NaN: the model has diverged", ""},
        {MGT_OPT_SGD, 3, "epoch 0: the model has diverged (a lower --lr?): ",
         " of 2688 batch-norm statistics (the first in layer1.0.bn1.running_var) are NaN or "
         "infinite"},
    };
    static const char last_good[] = "the last good checkpoint";
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        mgt_train_config c;
        base_config(&c);
        c.data_dir = MGT_TEST_DATA_DIR "/../../data/sample";
        c.batch_size = 32;
        c.lr.lr = 1e6f;
        c.opt = cases[i].opt;
        ctl.max_steps = cases[i].steps;
        char dir[400], path[512], best[512];
        snprintf(dir, sizeof dir, "%s/diverged%zu", root, i);
        assert_int_equal(mkdir(dir, 0755), 0);
        snprintf(path, sizeof path, "%s/checkpoint.safetensors", dir);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(last_good, f);
        fclose(f);
        mgt_devset *set = mgt_test_open_mock(2, "threads=1");
        mgt_train_result res;
        mgt_status st = mgt_train_run(&c, &ctl, set, &res);
        char err[1024];
        snprintf(err, sizeof err, "%s", mgt_error_last());
        mgt_devset_free(set);
        if (st == MGT_OK)
            fail_msg("case %zu: the run succeeded (Acc@1 %.3f, loss %g)", i, res.val_acc1,
                     res.val_loss);
        if (!strstr(err, cases[i].want) || !strstr(err, cases[i].want2) ||
            !strstr(err, "no checkpoint is written from it") || strchr(err, '\n'))
            fail_msg("case %zu: expected \"%s...%s\", got: %s", i, cases[i].want, cases[i].want2,
                     err);
        assert_true(res.val_acc1 < 100);
        snprintf(best, sizeof best, "%s/model_best.safetensors", dir);
        assert_int_not_equal(access(best, F_OK), 0);
        char kept[64] = "";
        f = fopen(path, "r");
        assert_non_null(f);
        size_t got = fread(kept, 1, sizeof kept - 1, f);
        fclose(f);
        assert_int_equal(got, strlen(last_good));
        assert_string_equal(kept, last_good);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_allocation_fails_cleanly),
        cmocka_unit_test(test_fault_line_names_device_and_step),
        cmocka_unit_test(test_nan_line_names_its_step),
        cmocka_unit_test(test_diverged_model_is_not_saved),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
