/* Data-parallel equivalence (issue 5): with frozen batch norm, N mock devices at global batch B
   end k steps with the weights of one device at B (to float rounding) for N = 2, 3, 4, while
   with live batch norm they measurably do not; validation of one checkpoint gives the same
   Acc@1 and loss on 1 to 4 devices; and the frozen BN's backward matches finite differences. */
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

#include "mgt/nn.h"
#include "mgt/safetensors.h"
#include "mgt/train.h"
#include "support/fixture.h"

/* max |a - b| / (1 + |a|) allowed between an N-device and the 1-device result: float
   rounding of the differently ordered gradient sums, carried through k SGD steps */
#define EQ_TOL 1e-5
#define STEPS 4
#define BATCH 12 /* divisible by 1, 2, 3 and 4 */

static char root[256]; /* the temp folder of this run */
static char data_dir[300];

/* 3 classes of 12x12 gray images, the class being which third (left, middle, right) holds a
   bright bar, with noise: 16 training images per class (48 = 4 steps of 12) and 10
   validation images per class (30, which 4 devices split unevenly: 8, 8, 7, 7). */
static int bar_third(int c, int x, int y, uint32_t noise)
{
    int v = (int)(noise >> 26) * 2;
    return x / 4 == c && y >= 2 && y < 10 ? v + 120 : v;
}

static int setup(void **state)
{
    (void)state;
    static const char *const cls[3] = {"a_left", "b_middle", "c_right"};
    mgt_test_make_dataset(root, sizeof root, "equivalence", cls, 3, 16, 10, 12, 4242, bar_third);
    snprintf(data_dir, sizeof data_dir, "%s/data", root);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return mgt_test_remove_tree(root);
}

/* The switches of the next run (set by base_config, changed by a test before run_on). */
static mgt_train_controls ctl;

/* lr 0.05, momentum 0.9, wd 1e-4, pad-crop (keyed by dataset index, so the same on any
   device count), global batch 12, STEPS steps of one epoch, no validation. */
static void base_config(mgt_train_config *c, bool freeze_bn, const char *ckpt_dir)
{
    mgt_train_config_defaults(c);
    c->data_dir = data_dir;
    c->arch = "resnet20";
    c->batch_size = BATCH;
    c->epochs = 1;
    c->lr.lr = 0.05f;
    c->momentum = 0.9f;
    c->weight_decay = 1e-4f;
    c->augment = MGT_AUGMENT_PAD_CROP;
    c->workers = 2;
    c->print_freq = 100;
    c->seed = 11;
    c->freeze_bn = freeze_bn;
    c->checkpoint_dir = ckpt_dir;
    ctl = (mgt_train_controls){.out = mgt_test_quiet(), .max_steps = STEPS, .no_validation = true};
}

static void run_on(mgt_train_config *c, int n, mgt_train_result *res)
{
    mgt_devset *set = mgt_test_open_mock(n, "threads=1");
    mgt_status st = mgt_train_run(c, &ctl, set, res);
    char err[1024];
    snprintf(err, sizeof err, "%s", mgt_error_last());
    mgt_devset_free(set);
    if (st != MGT_OK)
        fail_msg("%d devices: %s", n, err);
}

/* Trains (freeze_bn or not) on n devices; path gets the checkpoint. */
static void train_n(bool freeze_bn, int n, char *path, size_t cap)
{
    char dir[400];
    snprintf(dir, sizeof dir, "%s/%s%d", root, freeze_bn ? "frozen" : "live", n);
    mgt_train_config c;
    base_config(&c, freeze_bn, dir);
    mgt_train_result res;
    run_on(&c, n, &res);
    assert_int_equal(res.steps, STEPS);
    snprintf(path, cap, "%s/checkpoint.safetensors", dir);
}

typedef struct diff {
    double scaled; /* max |a - b| / (1 + |a|) */
    double abs;    /* max |a - b| */
    char where[80];
} diff;

typedef enum which {
    ALL,     /* every F32 tensor: weights, running statistics, the optimizer's momentum */
    WEIGHTS, /* the learnable parameters alone */
} which;

/* Compares b's F32 tensors (`which` of them) with a's, and every I64 one exactly. */
static diff compare(const char *pa, const char *pb, which what)
{
    mgt_st_file *fa, *fb;
    if (mgt_st_open(pa, &fa) != MGT_OK || mgt_st_open(pb, &fb) != MGT_OK)
        fail_msg("open: %s", mgt_error_last());
    assert_int_equal(mgt_st_count(fa), mgt_st_count(fb));
    diff d = {0};
    for (int i = 0; i < mgt_st_count(fa); i++) {
        const char *name = mgt_st_tensor_name(fa, i);
        int j = mgt_st_find(fb, name);
        if (j < 0)
            fail_msg("%s lacks %s", pb, name);
        assert_int_equal(mgt_st_tensor_bytes(fa, i), mgt_st_tensor_bytes(fb, j));
        if (mgt_st_tensor_dtype(fa, i) == MGT_ST_I64) {
            if (memcmp(mgt_st_tensor_data(fa, i), mgt_st_tensor_data(fb, j),
                       mgt_st_tensor_bytes(fa, i)) != 0)
                fail_msg("%s differs between %s and %s", name, pa, pb);
            continue;
        }
        if (what == WEIGHTS && (strstr(name, ".running_") || strncmp(name, "optimizer.", 10) == 0))
            continue;
        assert_int_equal(mgt_st_tensor_dtype(fa, i), MGT_ST_F32);
        const float *a = mgt_st_tensor_data(fa, i), *b = mgt_st_tensor_data(fb, j);
        for (uint64_t k = 0; k < mgt_st_tensor_numel(fa, i); k++) {
            double e = fabs((double)a[k] - (double)b[k]);
            if (e > d.abs || isnan(e))
                d.abs = e;
            double sc = e / (1.0 + fabs((double)a[k]));
            if (sc > d.scaled || isnan(sc)) {
                d.scaled = sc;
                snprintf(d.where, sizeof d.where, "%s[%llu]", name, (unsigned long long)k);
            }
        }
    }
    mgt_st_close(fa);
    mgt_st_close(fb);
    return d;
}

/* The checkpoint's num_batches_tracked are all 0 (a frozen BN counts nothing) and its running
   statistics are still the initial mean 0, var 1. */
static void assert_bn_untouched(const char *path)
{
    mgt_st_file *f;
    if (mgt_st_open(path, &f) != MGT_OK)
        fail_msg("open: %s", mgt_error_last());
    for (int i = 0; i < mgt_st_count(f); i++) {
        const char *name = mgt_st_tensor_name(f, i);
        if (strstr(name, "num_batches_tracked")) {
            int64_t v;
            memcpy(&v, mgt_st_tensor_data(f, i), sizeof v);
            if (v != 0)
                fail_msg("%s = %lld under freeze_bn", name, (long long)v);
        } else if (strstr(name, ".running_")) {
            float want = strstr(name, "running_var") ? 1.0f : 0.0f;
            const float *p = mgt_st_tensor_data(f, i);
            for (uint64_t k = 0; k < mgt_st_tensor_numel(f, i); k++)
                if (p[k] != want)
                    fail_msg("%s[%llu] = %g under freeze_bn", name, (unsigned long long)k,
                             (double)p[k]);
        }
    }
    mgt_st_close(f);
}

static void test_frozen_bn_devices_agree(void **state)
{
    (void)state;
    char frozen1[512], pn[512];
    train_n(true, 1, frozen1, sizeof frozen1);
    assert_bn_untouched(frozen1);
    for (int n = 2; n <= 4; n++) {
        train_n(true, n, pn, sizeof pn);
        diff w = compare(frozen1, pn, WEIGHTS), d = compare(frozen1, pn, ALL);
        printf("freeze_bn, %d devices vs 1: weights max |diff| %.3g, max |diff|/(1+|w|) %.3g; "
               "with momentum %.3g, %.3g (%s)\n",
               n, w.abs, w.scaled, d.abs, d.scaled, d.where);
        if (!(d.scaled <= EQ_TOL))
            fail_msg("%d devices differ from 1 by %g (scaled) at %s", n, d.scaled, d.where);
    }
}

/* Dropout's masks are keyed by the step and each sample's place in the epoch, not by where
   it runs: squeezenet1_1 (dropout before its classifier, no batch norm) at 32x32 on 2 devices
   ends STEPS steps with the weights of 1 device. */
static void test_dropout_devices_agree(void **state)
{
    (void)state;
    char p1[512], p2[512];
    for (int n = 1; n <= 2; n++) {
        char dir[400];
        snprintf(dir, sizeof dir, "%s/dropout%d", root, n);
        mgt_train_config c;
        base_config(&c, false, dir);
        c.arch = "squeezenet1_1";
        c.image_size = 32;
        c.lr.lr = 0.01f;
        mgt_train_result res;
        run_on(&c, n, &res);
        assert_int_equal(res.steps, STEPS);
        snprintf(n == 1 ? p1 : p2, sizeof p1, "%s/checkpoint.safetensors", dir);
    }
    diff d = compare(p1, p2, ALL);
    printf("squeezenet1_1 with dropout, 2 devices vs 1: max |diff|/(1+|w|) %.3g (%s)\n", d.scaled,
           d.where);
    if (!(d.scaled <= EQ_TOL))
        fail_msg("2 devices differ from 1 by %g (scaled) at %s", d.scaled, d.where);
}

/* The control: per-device batch statistics make the replicas' gradients those of smaller
   batches, so the same comparison must fail without freeze_bn (else it proves nothing). */
static void test_live_bn_devices_differ(void **state)
{
    (void)state;
    char p1[512], pn[512];
    train_n(false, 1, p1, sizeof p1);
    for (int n = 2; n <= 4; n++) {
        train_n(false, n, pn, sizeof pn);
        diff d = compare(p1, pn, WEIGHTS);
        printf("live BN,   %d devices vs 1: weights max |diff| %.3g, max |diff|/(1+|w|) %.3g "
               "(%s)\n",
               n, d.abs, d.scaled, d.where);
        if (!(d.scaled > 10 * EQ_TOL))
            fail_msg("without freeze_bn %d devices differ from 1 by only %g", n, d.scaled);
    }
}

/* --sync-bn: live BN whose statistics span every device's batch is the BN of the global
   batch, so N devices at global batch B step as 1 device at B does (weights, running
   statistics and momentum, i.e. the gradient), where per-device statistics do not. One step:
   the replicas differ from 1 device only by float rounding (the merged mean and variance are
   Chan's update in double over per-device float statistics; sum(dy), sum(dy*xhat) are float
   per device, added in device order, where 1 device takes them in one double pass), and
   lr 0.05 with momentum amplifies that rounding step after step (measured: 1.1e-7 on the
   weights and 2.5e-6 on the momentum after 1 step, 5e-5 and 1e-3 after 4, against 0.04 and
   0.7 after 1 step without --sync-bn), so 1 step against EQ_TOL, and the same run without
   sync_bn must miss it by 10x (else the comparison proves nothing). */
static void train_1step(bool sync, int n, char *path, size_t cap)
{
    char dir[400];
    snprintf(dir, sizeof dir, "%s/%s%d", root, sync ? "syncbn" : "live1step", n);
    mgt_train_config c;
    base_config(&c, false, dir);
    c.sync_bn = sync;
    ctl.max_steps = 1;
    mgt_train_result res;
    run_on(&c, n, &res);
    assert_int_equal(res.steps, 1);
    snprintf(path, cap, "%s/checkpoint.safetensors", dir);
}

static void test_sync_bn_devices_agree(void **state)
{
    (void)state;
    char p1[512], pn[512], plain[512];
    /* on one device sync_bn is plain live BN (other ops, the same arithmetic to rounding) */
    train_1step(true, 1, p1, sizeof p1);
    train_1step(false, 1, plain, sizeof plain);
    diff d = compare(plain, p1, ALL);
    printf("sync_bn on 1 device vs live BN, 1 step: max |diff|/(1+|w|) %.3g (%s)\n", d.scaled,
           d.where);
    if (!(d.scaled <= EQ_TOL))
        fail_msg("sync_bn on 1 device differs from live BN by %g at %s", d.scaled, d.where);
    for (int n = 2; n <= 3; n++) {
        train_1step(true, n, pn, sizeof pn);
        diff w = compare(p1, pn, WEIGHTS);
        d = compare(p1, pn, ALL);
        printf("sync_bn, %d devices vs 1, 1 step: weights max |diff| %.3g, max |diff|/(1+|w|) "
               "%.3g; all %.3g, %.3g (%s)\n",
               n, w.abs, w.scaled, d.abs, d.scaled, d.where);
        if (!(d.scaled <= EQ_TOL))
            fail_msg("sync_bn: %d devices differ from 1 by %g (scaled) at %s", n, d.scaled,
                     d.where);
        train_1step(false, n, pn, sizeof pn);
        d = compare(plain, pn, ALL);
        printf("live BN, %d devices vs 1, 1 step (control): max |diff|/(1+|w|) %.3g\n", n,
               d.scaled);
        if (!(d.scaled > 10 * EQ_TOL))
            fail_msg("without sync_bn %d devices differ from 1 by only %g", n, d.scaled);
    }
}

/* Validation splits the set exactly (every image once), so one checkpoint scores the same on
   any device count: Acc@1 and Acc@5 to the image, the loss to float rounding of the sums.
   The checkpoint is trained (live BN, so its running statistics matter) until it is right on
   some images and wrong on others, or equal scores would prove little: one epoch at a time,
   stopping at the first that lands there (how many that takes depends on the CPU's rounding:
   AVX2 and AVX-512 kernels round differently). */
static void test_validation_same_on_any_device_count(void **state)
{
    (void)state;
    char dir[400], ckpt[512];
    snprintf(dir, sizeof dir, "%s/val", root);
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint.safetensors", dir);
    mgt_train_config c;
    mgt_train_result res;
    bool mixed = false;
    for (int e = 1; e <= 8 && !mixed; e++) {
        base_config(&c, false, dir);
        c.epochs = e;
        ctl.max_steps = 0;
        c.augment = MGT_AUGMENT_NONE;
        ctl.no_validation = false;
        c.resume = e > 1 ? ckpt : NULL;
        run_on(&c, 2, &res);
        mixed = res.val_acc1 > 40.0 && res.val_acc1 < 100.0;
    }
    if (!mixed)
        fail_msg("no epoch of 8 left the checkpoint right on some images and wrong on others "
                 "(last Acc@1 %.3f)",
                 res.val_acc1);
    double acc1 = 0, acc5 = 0, loss = 0;
    long *cm1 = NULL;
    int k = 0;
    for (int n = 1; n <= 4; n++) {
        base_config(&c, false, NULL);
        ctl.no_validation = false;
        c.evaluate = true;
        c.resume = ckpt;
        mgt_train_result res;
        run_on(&c, n, &res);
        printf("validation on %d devices: Acc@1 %.3f Acc@5 %.3f loss %.9f\n", n, res.val_acc1,
               res.val_acc5, res.val_loss);
        /* -e's confusion matrix: every image once, its diagonal the top-1 */
        assert_non_null(res.confusion);
        long total = 0, right = 0;
        for (int i = 0; i < res.confusion_classes; i++)
            for (int j = 0; j < res.confusion_classes; j++) {
                total += res.confusion[(size_t)i * res.confusion_classes + j];
                right += i == j ? res.confusion[(size_t)i * res.confusion_classes + j] : 0;
            }
        assert_true(fabs(100.0 * (double)right / (double)total - res.val_acc1) < 1e-9);
        if (n == 1) {
            /* 30 images: neither none nor all right, and not one class for all */
            assert_true(res.val_acc1 > 40.0 && res.val_acc1 < 100.0);
            assert_int_equal(total, 30);
            acc1 = res.val_acc1;
            acc5 = res.val_acc5;
            loss = res.val_loss;
            cm1 = res.confusion;
            k = res.confusion_classes;
            res.confusion = NULL;
            continue;
        }
        assert_int_equal(res.confusion_classes, k);
        assert_memory_equal(res.confusion, cm1, (size_t)k * k * sizeof *cm1);
        mgt_train_result_free(&res);
        assert_true(res.val_acc1 == acc1);
        assert_true(res.val_acc5 == acc5);
        if (!(fabs(res.val_loss - loss) <= 1e-6 * (1.0 + fabs(loss))))
            fail_msg("validation loss %.9f on %d devices, %.9f on 1", res.val_loss, n, loss);
    }
    free(cm1);
}

/* ---- the frozen backward against finite differences ---- */

typedef struct fd_model {
    mgt_devset *set;
    mgt_stream *s;
    mgt_model *m;
    mgt_buffer *x, *y;
    int n;
} fd_model;

static uint32_t lcg(uint32_t *h)
{
    *h = *h * 1664525u + 1013904223u;
    return *h >> 8;
}

static float uni(uint32_t *h, float lo, float hi)
{
    return lo + (hi - lo) * (float)lcg(h) / (float)(1u << 24);
}

static int entry_of(const mgt_model *m, const char *name)
{
    int n;
    const mgt_model_entry *t = mgt_model_table(m, &n);
    for (int i = 0; i < n; i++)
        if (strcmp(t[i].name, name) == 0)
            return i;
    fail_msg("no tensor %s", name);
    return -1;
}

/* A resnet20 for 8x8 gray images under freeze_bn, with running statistics, BN weights and
   biases away from their initial values so that every term of the backward matters. */
static void fd_open(fd_model *f, int batch)
{
    memset(f, 0, sizeof *f);
    f->n = batch;
    f->set = mgt_test_open_mock(1, "threads=1");
    mgt_device *d = mgt_devset_device(f->set, 0);
    assert_int_equal(mgt_stream_create(d, &f->s), MGT_OK);
    mgt_model_config mc = {.arch = "resnet20",
                           .classes = 3,
                           .in_channels = 1,
                           .image_size = 8,
                           .batch = batch,
                           .freeze_bn = true};
    if (mgt_model_create(&mc, d, &f->m) != MGT_OK)
        fail_msg("create: %s", mgt_error_last());
    assert_int_equal(mgt_model_init(f->m, f->s, 5), MGT_OK);

    size_t pb, bb;
    char *params = (char *)mgt_model_params(f->m, &pb);
    char *bufs = (char *)mgt_model_buffers(f->m, &bb);
    char *hp = malloc(pb), *hb = malloc(bb);
    assert_non_null(hp);
    assert_non_null(hb);
    assert_int_equal(mgt_copy_d2h(f->s, hp, params, pb), MGT_OK);
    assert_int_equal(mgt_copy_d2h(f->s, hb, bufs, bb), MGT_OK);
    assert_int_equal(mgt_stream_synchronize(f->s, NULL), MGT_OK);
    int nt;
    const mgt_model_entry *t = mgt_model_table(f->m, &nt);
    uint32_t h = 99;
    for (int i = 0; i < nt; i++) {
        const char *name = t[i].name;
        float *p = (float *)((t[i].role == MGT_MODEL_BUFFER ? hb : hp) + t[i].offset);
        float lo = 0, hi = 0;
        if (strstr(name, "running_mean"))
            lo = -0.3f, hi = 0.3f;
        else if (strstr(name, "running_var"))
            lo = 0.5f, hi = 2.0f;
        else if (t[i].ndim == 1 && strncmp(name, "fc.", 3) != 0 && strstr(name, ".weight"))
            lo = 0.6f, hi = 1.4f;
        else if (t[i].ndim == 1 && strncmp(name, "fc.", 3) != 0 && strstr(name, ".bias"))
            lo = -0.2f, hi = 0.2f;
        else
            continue;
        for (size_t k = 0; k < t[i].numel; k++)
            p[k] = uni(&h, lo, hi);
    }
    assert_int_equal(mgt_copy_h2d(f->s, params, hp, pb), MGT_OK);
    assert_int_equal(mgt_copy_h2d(f->s, bufs, hb, bb), MGT_OK);

    size_t nx = (size_t)batch * 64;
    float *x = malloc(nx * sizeof *x);
    int32_t y[4];
    assert_non_null(x);
    for (size_t i = 0; i < nx; i++)
        x[i] = uni(&h, -1.0f, 1.0f);
    for (int i = 0; i < batch; i++)
        y[i] = i % 3;
    assert_int_equal(mgt_buffer_alloc(d, nx * sizeof *x, &f->x), MGT_OK);
    assert_int_equal(mgt_buffer_alloc(d, sizeof y, &f->y), MGT_OK);
    assert_int_equal(mgt_copy_h2d(f->s, mgt_buffer_ptr(f->x), x, nx * sizeof *x), MGT_OK);
    assert_int_equal(mgt_copy_h2d(f->s, mgt_buffer_ptr(f->y), y, (size_t)batch * sizeof *y),
                     MGT_OK);
    assert_int_equal(mgt_stream_synchronize(f->s, NULL), MGT_OK);
    free(x);
    free(hp);
    free(hb);
}

static void fd_close(fd_model *f)
{
    mgt_buffer_free(f->x);
    mgt_buffer_free(f->y);
    mgt_model_free(f->m);
    mgt_stream_free(f->s);
    mgt_devset_free(f->set);
}

/* A training forward and the loss; with backward, gradients too (zeroed first). */
static double fd_loss(fd_model *f, bool backward)
{
    float loss;
    mgt_status st = MGT_OK;
    if (backward)
        st = mgt_model_zero_grad(f->m, f->s);
    if (st == MGT_OK)
        st = mgt_model_forward(f->m, f->s, mgt_buffer_ptr(f->x), f->n, true, NULL);
    if (st == MGT_OK)
        st = mgt_model_loss(f->m, f->s, mgt_buffer_ptr(f->y), 0.0f, NULL);
    if (st == MGT_OK && backward)
        st = mgt_model_backward(f->m, f->s, NULL, NULL);
    if (st == MGT_OK)
        st = mgt_copy_d2h(f->s, &loss, mgt_model_loss_ptr(f->m), sizeof loss);
    if (st == MGT_OK)
        st = mgt_stream_synchronize(f->s, NULL);
    if (st != MGT_OK)
        fail_msg("step: %s", mgt_error_last());
    return loss;
}

static float *fd_at(const fd_model *f, const char *arena, int e, size_t k)
{
    const mgt_model_entry *t = &mgt_model_table(f->m, NULL)[e];
    return (float *)(arena + t->offset) + k;
}

static void fd_put(fd_model *f, int e, size_t k, float v)
{
    float *p = fd_at(f, (char *)mgt_model_params(f->m, NULL), e, k);
    assert_int_equal(mgt_copy_h2d(f->s, p, &v, sizeof v), MGT_OK);
    assert_int_equal(mgt_stream_synchronize(f->s, NULL), MGT_OK);
}

static float fd_get(fd_model *f, char *arena, int e, size_t k)
{
    float v;
    assert_int_equal(mgt_copy_d2h(f->s, &v, fd_at(f, arena, e, k), sizeof v), MGT_OK);
    assert_int_equal(mgt_stream_synchronize(f->s, NULL), MGT_OK);
    return v;
}

static void test_frozen_bn_gradients(void **state)
{
    (void)state;
    fd_model f;
    fd_open(&f, 3);
    size_t bb;
    float *bufs = mgt_model_buffers(f.m, &bb);
    float *before = malloc(bb), *after = malloc(bb);
    assert_non_null(before);
    assert_non_null(after);
    assert_int_equal(mgt_copy_d2h(f.s, before, bufs, bb), MGT_OK);

    (void)fd_loss(&f, true);
    /* a training step moved no statistic and counted nothing */
    assert_int_equal(mgt_copy_d2h(f.s, after, bufs, bb), MGT_OK);
    assert_int_equal(mgt_stream_synchronize(f.s, NULL), MGT_OK);
    assert_memory_equal(before, after, bb);
    int nbn;
    const int64_t *counts = mgt_model_bn_counts(f.m, &nbn);
    for (int i = 0; i < nbn; i++)
        assert_int_equal(counts[i], 0);

    /* the training forward is the evaluation forward, to the bit */
    float lt[9], le[9];
    const float *logits;
    assert_int_equal(mgt_model_forward(f.m, f.s, mgt_buffer_ptr(f.x), 3, true, &logits), MGT_OK);
    assert_int_equal(mgt_copy_d2h(f.s, lt, logits, sizeof lt), MGT_OK);
    assert_int_equal(mgt_model_forward(f.m, f.s, mgt_buffer_ptr(f.x), 3, false, &logits), MGT_OK);
    assert_int_equal(mgt_copy_d2h(f.s, le, logits, sizeof le), MGT_OK);
    assert_int_equal(mgt_stream_synchronize(f.s, NULL), MGT_OK);
    assert_memory_equal(lt, le, sizeof lt);

    /* BN weights and biases (stem, a block's inner and last BN, a downsample) and conv
       weights upstream of frozen BNs, whose gradients flow through the frozen dx */
    static const struct {
        const char *name;
        size_t k;
    } probe[] = {
        {"bn1.weight", 3},
        {"bn1.bias", 7},
        {"layer1.0.bn1.weight", 0},
        {"layer1.2.bn2.bias", 5},
        {"layer2.0.downsample.1.weight", 4},
        {"layer2.0.downsample.1.bias", 9},
        {"layer3.2.bn2.weight", 11},
        {"layer3.1.bn1.bias", 2},
        {"conv1.weight", 4},
        {"layer1.0.conv1.weight", 17},
        {"layer2.1.conv2.weight", 100},
        {"layer3.0.conv1.weight", 33},
    };
    (void)fd_loss(&f, true);
    char *grads = (char *)mgt_model_grads(f.m, NULL), *params = (char *)mgt_model_params(f.m, NULL);
    double worst = 0;
    for (size_t i = 0; i < sizeof probe / sizeof *probe; i++) {
        int e = entry_of(f.m, probe[i].name);
        size_t k = probe[i].k;
        float g = fd_get(&f, grads, e, k);
        float w = fd_get(&f, params, e, k);
        /* Central differences on a float loss: a large step crosses ReLU kinks, a small one
           drowns in the loss's rounding (~1e-7 over 2h), so two steps are tried and the
           closer one counts. The backward of batch statistics (the mistake this guards
           against) is off here by far more: signs flip, factors of 10. */
        static const float steps[2] = {2e-3f, 5e-4f};
        double best = INFINITY, best_fd = 0;
        for (int hi = 0; hi < 2; hi++) {
            float hstep = steps[hi];
            fd_put(&f, e, k, w + hstep);
            double lp = fd_loss(&f, false);
            fd_put(&f, e, k, w - hstep);
            double lm = fd_loss(&f, false);
            fd_put(&f, e, k, w);
            double fd = (lp - lm) / (2.0 * (double)hstep);
            double err = fabs(fd - (double)g) / (5e-5 / 0.06 + fabs(fd));
            if (err < best) {
                best = err;
                best_fd = fd;
            }
        }
        if (getenv("MGT_TEST_VERBOSE"))
            printf("%-30s[%3zu] analytic %+.6e  finite differences %+.6e\n", probe[i].name, k,
                   (double)g, best_fd);
        if (best > worst)
            worst = best;
        /* |fd - g| <= 6% of |fd| + 5e-5 */
        if (!(best <= 0.06))
            fail_msg("%s[%zu]: backward %g, finite differences %g", probe[i].name, k, (double)g,
                     best_fd);
    }
    printf("frozen BN backward vs finite differences: worst error %.3g (of |fd| + 8.3e-4)\n",
           worst);

    /* a training batch of one image is fine: no batch statistic is taken */
    f.n = 1;
    (void)fd_loss(&f, true);
    free(before);
    free(after);
    fd_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_frozen_bn_gradients),
        cmocka_unit_test(test_frozen_bn_devices_agree),
        cmocka_unit_test(test_live_bn_devices_differ),
        cmocka_unit_test(test_sync_bn_devices_agree),
        cmocka_unit_test(test_dropout_devices_agree),
        cmocka_unit_test(test_validation_same_on_any_device_count),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
