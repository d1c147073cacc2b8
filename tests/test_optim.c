/* Tests of the learning-rate schedules and of SGD's state across steps on a mock device, and
   the references' recipe against PyTorch 1.13's goldens (scripts/make_recipe_goldens.py):
   every optimizer over weight-decay groups, the per-epoch schedulers with their warm-up,
   clip_grad_norm_'s factor and the EMA model's averaging. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "support/fixture.h"
#include "support/golden.h"

#include "mgt/optim.h"

static void near(double got, double want)
{
    if (fabs(got - want) > 1e-7 + 1e-6 * fabs(want))
        fail_msg("got %.9g, want %.9g", got, want);
}

static void test_step_schedule(void **state)
{
    (void)state;
    mgt_lr_config c = {.lr = 0.1f, .kind = MGT_LR_STEP, .step_epochs = 30, .gamma = 0.1f};
    near(mgt_lr_at(&c, 0, 0, 100), 0.1);
    near(mgt_lr_at(&c, 29, 99, 100), 0.1);
    near(mgt_lr_at(&c, 30, 0, 100), 0.01);
    near(mgt_lr_at(&c, 59, 5, 100), 0.01);
    near(mgt_lr_at(&c, 60, 0, 100), 0.001);
    near(mgt_lr_at(&c, 89, 0, 100), 0.001);
}

static void test_cosine_schedule(void **state)
{
    (void)state;
    mgt_lr_config c = {.lr = 0.4f, .kind = MGT_LR_COSINE, .epochs = 10};
    near(mgt_lr_at(&c, 0, 0, 10), 0.4);
    near(mgt_lr_at(&c, 5, 0, 10), 0.2);
    near(mgt_lr_at(&c, 2, 0, 10), 0.2 * (1 + cos(M_PI * 0.2)));
    /* per step: 5 epochs and 3 of 10 steps is 53% of the run */
    near(mgt_lr_at(&c, 5, 3, 10), 0.2 * (1 + cos(M_PI * 0.53)));
    near(mgt_lr_at(&c, 10, 0, 10), 0.0);
    /* after a warm-up of half an epoch the decay spans the remaining 9.5 epochs */
    c.warmup_epochs = 0.5f;
    near(mgt_lr_at(&c, 0, 4, 10), 0.4); /* the warm-up's last step reaches the full rate */
    near(mgt_lr_at(&c, 0, 1, 10), 0.4 * 2 / 5.0);
    near(mgt_lr_at(&c, 5, 0, 10), 0.2 * (1 + cos(M_PI * 4.5 / 9.5)));
}

static void test_warmup(void **state)
{
    (void)state;
    mgt_lr_config c = {
        .lr = 0.1f, .kind = MGT_LR_STEP, .step_epochs = 30, .gamma = 0.1f, .warmup_epochs = 2};
    near(mgt_lr_at(&c, 0, 0, 10), 0.1 / 20);
    near(mgt_lr_at(&c, 0, 9, 10), 0.1 * 10 / 20);
    near(mgt_lr_at(&c, 1, 9, 10), 0.1);
    near(mgt_lr_at(&c, 2, 0, 10), 0.1);
    mgt_lr_kind k;
    assert_int_equal(mgt_lr_kind_parse("cosine", &k), MGT_OK);
    assert_int_equal(k, MGT_LR_COSINE);
    assert_int_equal(mgt_lr_kind_parse("linear", &k), MGT_ERR_INVALID);
    assert_non_null(strstr(mgt_error_last(), "linear"));
}

/* Three steps of momentum SGD with weight decay and grad_scale against the same recurrence
   written out on the host; the first step must take the gradient as the buffer. One group, so
   one fused kernel. */
static void run_sgd(bool nesterov)
{
    enum { N = 37 };
    int id = 0;
    mgt_devset *set;
    CHECK(mgt_devset_open(MGT_DEVICE_MOCK, &id, 1, NULL, &set));
    mgt_device *d = mgt_devset_device(set, 0);
    mgt_stream *s;
    CHECK(mgt_stream_create(d, &s));
    mgt_buffer *pb, *gb;
    CHECK(mgt_buffer_alloc(d, N * sizeof(float), &pb));
    CHECK(mgt_buffer_alloc(d, N * sizeof(float), &gb));
    float p[N], g[N], buf[N], got[N];
    for (int i = 0; i < N; i++)
        p[i] = (float)(i % 7) * 0.25f - 0.7f;
    CHECK(mgt_copy_h2d(s, mgt_buffer_ptr(pb), p, sizeof p));
    CHECK(mgt_stream_synchronize(s, NULL));
    mgt_opt_config cfg;
    mgt_opt_config_defaults(&cfg, nesterov ? MGT_OPT_SGD_NESTEROV : MGT_OPT_SGD, 0.9f);
    mgt_opt_group group = {0, N, 1e-2f};
    mgt_optimizer *o;
    CHECK(mgt_optimizer_create(d, N, &cfg, &group, 1, &o));
    assert_int_equal(mgt_optimizer_steps(o), 0);
    const float lr = 0.05f, scale = 0.5f;
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < N; i++)
            g[i] = (float)((i * 3 + step * 5) % 11) * 0.1f - 0.5f;
        CHECK(mgt_copy_h2d(s, mgt_buffer_ptr(gb), g, sizeof g));
        CHECK(mgt_optimizer_step(o, s, mgt_buffer_ptr(pb), mgt_buffer_ptr(gb), lr, scale));
        /* the copy reads g when the stream gets to it, so g must not change before then */
        CHECK(mgt_stream_synchronize(s, NULL));
        for (int i = 0; i < N; i++) {
            float dp = scale * g[i] + 1e-2f * p[i];
            buf[i] = step == 0 ? dp : 0.9f * buf[i] + dp;
            float upd = nesterov ? dp + 0.9f * buf[i] : buf[i];
            p[i] -= lr * upd;
        }
    }
    assert_int_equal(mgt_optimizer_steps(o), 3);
    CHECK(mgt_copy_d2h(s, got, mgt_buffer_ptr(pb), sizeof got));
    CHECK(mgt_stream_synchronize(s, NULL));
    for (int i = 0; i < N; i++)
        near(got[i], p[i]);
    mgt_optimizer_free(o);
    mgt_buffer_free(pb);
    mgt_buffer_free(gb);
    mgt_stream_free(s);
    mgt_devset_free(set);
}

static void test_sgd_steps(void **state)
{
    (void)state;
    run_sgd(false);
    run_sgd(true);
}

static void test_sgd_rejects(void **state)
{
    (void)state;
    mgt_opt_config cfg;
    mgt_opt_config_defaults(&cfg, MGT_OPT_SGD_NESTEROV, 0.0f);
    mgt_opt_group group = {0, 4, 0.0f};
    mgt_optimizer *o;
    assert_int_equal(mgt_optimizer_create(NULL, 4, &cfg, &group, 1, &o), MGT_ERR_INVALID);
    assert_non_null(strstr(mgt_error_last(), "nesterov"));
}

/* ---- goldens (tests/support/golden.h) ---- */

static mgt_test_golden *golden_load(const char *name)
{
    return mgt_test_golden_load("recipe", name, "scripts/make_recipe_goldens.py");
}

static void close_to(const char *what, int i, double got, double want, double tol)
{
    if (fabs(got - want) > tol * (1 + fabs(want)))
        fail_msg("%s[%d]: got %.9g, torch %.9g", what, i, got, want);
}

/* Four steps over three tensors in weight-decay runs a | b | c (a and c one group, b the
   other), the lr changing between steps, the gradients twice torch's with grad_scale 0.5. */
static void optimizer_golden(const char *name, mgt_opt_kind kind, float momentum)
{
    mgt_test_golden *g = golden_load(name);
    const int32_t *sz = mgt_test_golden_i32(g, "sizes", 3);
    const float *lrs = mgt_test_golden_f32(g, "lrs", 4), *wd = mgt_test_golden_f32(g, "wd", 2);
    size_t n = (size_t)(sz[0] + sz[1] + sz[2]);
    mgt_opt_group groups[3] = {{0, (size_t)sz[0], wd[0]},
                               {(size_t)sz[0], (size_t)sz[1], wd[1]},
                               {(size_t)(sz[0] + sz[1]), (size_t)sz[2], wd[0]}};
    int id = 0;
    mgt_devset *set;
    CHECK(mgt_devset_open(MGT_DEVICE_MOCK, &id, 1, NULL, &set));
    mgt_device *d = mgt_devset_device(set, 0);
    mgt_stream *s;
    CHECK(mgt_stream_create(d, &s));
    mgt_buffer *pb, *gb;
    CHECK(mgt_buffer_alloc(d, n * sizeof(float), &pb));
    CHECK(mgt_buffer_alloc(d, n * sizeof(float), &gb));
    CHECK(
        mgt_copy_h2d(s, mgt_buffer_ptr(pb), mgt_test_golden_f32(g, "init", n), n * sizeof(float)));
    mgt_opt_config oc;
    mgt_opt_config_defaults(&oc, kind, momentum);
    mgt_optimizer *o;
    CHECK(mgt_optimizer_create(d, n, &oc, groups, 3, &o));
    float *got = malloc(n * sizeof(float));
    assert_non_null(got);
    for (int t = 0; t < 4; t++) {
        char key[16];
        snprintf(key, sizeof key, "grad%d", t);
        CHECK(
            mgt_copy_h2d(s, mgt_buffer_ptr(gb), mgt_test_golden_f32(g, key, n), n * sizeof(float)));
        CHECK(mgt_optimizer_step(o, s, mgt_buffer_ptr(pb), mgt_buffer_ptr(gb), lrs[t], 0.5f));
        CHECK(mgt_copy_d2h(s, got, mgt_buffer_ptr(pb), n * sizeof(float)));
        CHECK(mgt_stream_synchronize(s, NULL));
        snprintf(key, sizeof key, "param%d", t);
        const float *want = mgt_test_golden_f32(g, key, n);
        char what[64];
        snprintf(what, sizeof what, "%s step %d", name, t);
        for (size_t i = 0; i < n; i++)
            close_to(what, (int)i, got[i], want[i], 2e-6);
    }
    assert_int_equal(mgt_optimizer_steps(o), 4);
    free(got);
    mgt_optimizer_free(o);
    mgt_buffer_free(pb);
    mgt_buffer_free(gb);
    mgt_stream_free(s);
    mgt_devset_free(set);
    mgt_test_golden_free(g);
}

static void test_optimizers_match_torch(void **state)
{
    (void)state;
    optimizer_golden("sgd", MGT_OPT_SGD, 0.9f);
    optimizer_golden("sgd_nesterov", MGT_OPT_SGD_NESTEROV, 0.9f);
    optimizer_golden("sgd_nomomentum", MGT_OPT_SGD, 0.0f);
    optimizer_golden("adamw", MGT_OPT_ADAMW, 0.9f);
    optimizer_golden("rmsprop", MGT_OPT_RMSPROP, 0.9f);
    optimizer_golden("rmsprop_nomomentum", MGT_OPT_RMSPROP, 0.0f);
}

static void scheduler_golden(const char *name)
{
    mgt_test_golden *g = golden_load(name);
    const int32_t *cfg = mgt_test_golden_i32(g, "config", 5);
    const float *par = mgt_test_golden_f32(g, "params", 4);
    static const mgt_lr_kind kinds[] = {MGT_LR_STEPLR, MGT_LR_COSINEANNEALINGLR,
                                        MGT_LR_EXPONENTIALLR};
    mgt_lr_config c = {.lr = par[0],
                       .kind = kinds[cfg[0]],
                       .epochs = cfg[1],
                       .step_epochs = cfg[2],
                       .warmup_epochs = (float)cfg[3],
                       .warmup_method = cfg[4] ? MGT_LR_WARMUP_LINEAR : MGT_LR_WARMUP_CONSTANT,
                       .gamma = par[1],
                       .lr_min = par[2],
                       .warmup_decay = par[3]};
    const float *lrs = mgt_test_golden_f32(g, "lrs", (size_t)cfg[1]);
    for (int e = 0; e < cfg[1]; e++) {
        /* per epoch: every step of an epoch has the epoch's rate */
        close_to(name, e, mgt_lr_at(&c, e, 0, 10), lrs[e], 1e-6);
        close_to(name, e, mgt_lr_at(&c, e, 9, 10), lrs[e], 1e-6);
    }
    mgt_test_golden_free(g);
}

static void test_schedulers_match_torch(void **state)
{
    (void)state;
    scheduler_golden("lr_steplr");
    scheduler_golden("lr_steplr_warmup");
    scheduler_golden("lr_cosine");
    scheduler_golden("lr_cosine_warmup");
    scheduler_golden("lr_cosine_constant");
    scheduler_golden("lr_exponential");
    mgt_lr_kind k;
    assert_int_equal(mgt_lr_scheduler_parse("cosineannealinglr", &k), MGT_OK);
    assert_int_equal(k, MGT_LR_COSINEANNEALINGLR);
    assert_int_equal(mgt_lr_scheduler_parse("cosine", &k), MGT_ERR_INVALID);
    assert_non_null(strstr(mgt_error_last(), "--lr-scheduler"));
}

/* clip_grad_norm_ on a device's sum of squares (of twice the gradients, mean_scale 0.5) */
static void test_clip_matches_torch(void **state)
{
    (void)state;
    mgt_test_golden *g = golden_load("clip");
    int id = 0;
    mgt_devset *set;
    CHECK(mgt_devset_open(MGT_DEVICE_MOCK, &id, 1, NULL, &set));
    mgt_device *d = mgt_devset_device(set, 0);
    mgt_stream *s;
    CHECK(mgt_stream_create(d, &s));
    mgt_buffer *xb, *ob;
    CHECK(mgt_buffer_alloc(d, 17 * sizeof(float), &xb));
    CHECK(mgt_buffer_alloc(d, sizeof(float), &ob));
    static const char *const tags[] = {"clip", "keep"};
    for (int k = 0; k < 2; k++) {
        char key[32];
        snprintf(key, sizeof key, "%s.grad", tags[k]);
        const float *grad = mgt_test_golden_f32(g, key, 17);
        float twice[17], sumsq, clipped[17];
        for (int i = 0; i < 17; i++)
            twice[i] = 2 * grad[i];
        CHECK(mgt_copy_h2d(s, mgt_buffer_ptr(xb), twice, sizeof twice));
        CHECK(mgt_sum_squares(s, mgt_buffer_ptr(ob), mgt_buffer_ptr(xb), 17));
        CHECK(mgt_copy_d2h(s, &sumsq, mgt_buffer_ptr(ob), sizeof sumsq));
        CHECK(mgt_stream_synchronize(s, NULL));
        snprintf(key, sizeof key, "%s.norm", tags[k]);
        close_to(key, 0, 0.5 * sqrt(sumsq), *mgt_test_golden_f32(g, key, 1), 1e-6);
        snprintf(key, sizeof key, "%s.max_norm", tags[k]);
        float coef = mgt_clip_coef(sumsq, 0.5, *mgt_test_golden_f32(g, key, 1));
        if (k == 1)
            assert_true(coef == 1.0f); /* below max_norm: left alone */
        else
            assert_true(coef < 1.0f);
        for (int i = 0; i < 17; i++)
            clipped[i] = 0.5f * coef * twice[i];
        snprintf(key, sizeof key, "%s.clipped", tags[k]);
        const float *want = mgt_test_golden_f32(g, key, 17);
        for (int i = 0; i < 17; i++)
            close_to(key, i, clipped[i], want[i], 1e-6);
    }
    mgt_buffer_free(xb);
    mgt_buffer_free(ob);
    mgt_stream_free(s);
    mgt_devset_free(set);
    mgt_test_golden_free(g);
}

/* train.py's adjusted decay, and ExponentialMovingAverage's updates: a copy, then averages */
static void test_ema_matches_torch(void **state)
{
    (void)state;
    mgt_test_golden *g = golden_load("ema");
    const int32_t *cfg = mgt_test_golden_i32(g, "config", 3);
    const float *dec = mgt_test_golden_f32(g, "decay", 2);
    double decay = mgt_ema_decay(dec[0], cfg[0], cfg[1], cfg[2]);
    close_to("decay", 0, decay, dec[1], 1e-7);
    enum { N = 18 }; /* Linear(5, 3): weight and bias */
    int id = 0;
    mgt_devset *set;
    CHECK(mgt_devset_open(MGT_DEVICE_MOCK, &id, 1, NULL, &set));
    mgt_device *d = mgt_devset_device(set, 0);
    mgt_stream *s;
    CHECK(mgt_stream_create(d, &s));
    mgt_buffer *mb, *eb;
    CHECK(mgt_buffer_alloc(d, N * sizeof(float), &mb));
    CHECK(mgt_buffer_alloc(d, N * sizeof(float), &eb));
    for (int t = 0; t < 4; t++) {
        char key[16];
        snprintf(key, sizeof key, "model%d", t);
        CHECK(
            mgt_copy_h2d(s, mgt_buffer_ptr(mb), mgt_test_golden_f32(g, key, N), N * sizeof(float)));
        if (t == 0)
            CHECK(mgt_copy_d2d(s, mgt_buffer_ptr(eb), mgt_buffer_ptr(mb), N * sizeof(float)));
        else
            CHECK(mgt_ema_average(s, mgt_buffer_ptr(eb), mgt_buffer_ptr(mb), N, decay));
        float got[N];
        CHECK(mgt_copy_d2h(s, got, mgt_buffer_ptr(eb), sizeof got));
        CHECK(mgt_stream_synchronize(s, NULL));
        snprintf(key, sizeof key, "ema%d", t);
        const float *want = mgt_test_golden_f32(g, key, N);
        for (int i = 0; i < N; i++)
            close_to(key, i, got[i], want[i], 1e-6);
    }
    mgt_buffer_free(mb);
    mgt_buffer_free(eb);
    mgt_stream_free(s);
    mgt_devset_free(set);
    mgt_test_golden_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step_schedule),
        cmocka_unit_test(test_cosine_schedule),
        cmocka_unit_test(test_warmup),
        cmocka_unit_test(test_sgd_steps),
        cmocka_unit_test(test_sgd_rejects),
        cmocka_unit_test(test_optimizers_match_torch),
        cmocka_unit_test(test_schedulers_match_torch),
        cmocka_unit_test(test_clip_matches_torch),
        cmocka_unit_test(test_ema_matches_torch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
