/* Tests of the learning-rate schedules and of SGD's state across steps on a mock device. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "support/fixture.h"

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
   written out on the host; the first step must take the gradient as the buffer. */
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
    mgt_sgd *o;
    CHECK(mgt_sgd_create(d, N, 0.9f, 1e-2f, nesterov, &o));
    assert_false(mgt_sgd_started(o));
    const float lr = 0.05f, scale = 0.5f;
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < N; i++)
            g[i] = (float)((i * 3 + step * 5) % 11) * 0.1f - 0.5f;
        CHECK(mgt_copy_h2d(s, mgt_buffer_ptr(gb), g, sizeof g));
        CHECK(mgt_sgd_step(o, s, mgt_buffer_ptr(pb), mgt_buffer_ptr(gb), lr, scale));
        /* the copy reads g when the stream gets to it, so g must not change before then */
        CHECK(mgt_stream_synchronize(s, NULL));
        for (int i = 0; i < N; i++) {
            float dp = scale * g[i] + 1e-2f * p[i];
            buf[i] = step == 0 ? dp : 0.9f * buf[i] + dp;
            float upd = nesterov ? dp + 0.9f * buf[i] : buf[i];
            p[i] -= lr * upd;
        }
    }
    assert_true(mgt_sgd_started(o));
    CHECK(mgt_copy_d2h(s, got, mgt_buffer_ptr(pb), sizeof got));
    CHECK(mgt_stream_synchronize(s, NULL));
    for (int i = 0; i < N; i++)
        near(got[i], p[i]);
    mgt_sgd_free(o);
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
    mgt_sgd *o;
    assert_int_equal(mgt_sgd_create(NULL, 4, 0.0f, 0.0f, true, &o), MGT_ERR_INVALID);
    assert_non_null(strstr(mgt_error_last(), "nesterov"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step_schedule), cmocka_unit_test(test_cosine_schedule),
        cmocka_unit_test(test_warmup),        cmocka_unit_test(test_sgd_steps),
        cmocka_unit_test(test_sgd_rejects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
