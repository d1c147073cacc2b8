/* Tests of the model zoo, one architecture list for every family: `test_zoo tables` holds
   every architecture mgtrain registers (bar the CIFAR ResNets, which torchvision lacks) to
   torchvision 0.14's parameter count, convolution + linear MACs at 224 and every state_dict
   name and shape in order (tests/data/zoo/torchvision_archs.txt, scripts/make_zoo_tables.py);
   `test_zoo learn FAMILY` trains the family's representative on a fixed tiny batch on two
   mock devices: the loss must fall and the replicas stay bit-identical. CTest runs one entry
   per family (tests/CMakeLists.txt, MGT_ZOO_FAMILIES); a family of the other helpers is one
   row of learn_cases[] and one word of that list. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mgt/device.h"
#include "mgt/nn.h"
#include "support/fixture.h"

#define TABLE MGT_TEST_DATA_DIR "/zoo/torchvision_archs.txt"

static const char *arg; /* the family of `learn` */

/* ---- torchvision's table ---- */

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    assert_non_null(s);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

static void shape_text(const mgt_model_entry *e, char *buf, size_t cap)
{
    if (e->ndim == 0) {
        snprintf(buf, cap, "-");
        return;
    }
    size_t o = 0;
    for (int d = 0; d < e->ndim && o < cap; d++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", d ? "x" : "", (long long)e->shape[d]);
}

static void test_tables(void **state)
{
    (void)state;
    char *text = read_file(TABLE);
    int checked = 0;
    for (const char *const *a = mgt_model_arch_names(); *a; a++) {
        const mgt_arch_info *info = mgt_arch_find(*a);
        assert_non_null(info);
        if (strcmp(info->family, "cifar_resnet") == 0)
            continue;
        char key[64];
        snprintf(key, sizeof key, "\narch %s ", *a);
        const char *p = strstr(text, key);
        if (!p)
            fail_msg("%s is not in %s (run scripts/make_zoo_tables.py)", *a, TABLE);
        unsigned long long params, macs;
        int n_entries;
        p += strlen(key);
        assert_int_equal(sscanf(p, "%llu %llu %d", &params, &macs, &n_entries), 3);
        mgt_model_config cfg = {
            .arch = *a, .classes = 1000, .in_channels = 3, .image_size = 224, .batch = 1};
        mgt_model *m;
        CHECK(mgt_model_create(&cfg, NULL, &m));
        mgt_model_counts c;
        mgt_model_get_counts(m, &c);
        if (c.params != params)
            fail_msg("%s: %zu parameters, torchvision %llu", *a, c.params, params);
        if (c.macs_conv_fc != macs)
            fail_msg("%s: %llu conv + linear MACs at 224, torchvision %llu", *a,
                     (unsigned long long)c.macs_conv_fc, macs);
        int n;
        const mgt_model_entry *t = mgt_model_table(m, &n);
        if (n != n_entries)
            fail_msg("%s: %d state_dict entries, torchvision %d", *a, n, n_entries);
        p = strchr(p, '\n');
        for (int i = 0; i < n; i++) {
            char name[128], shape[64], ours[64];
            assert_non_null(p);
            assert_int_equal(sscanf(p + 1, "%127s %63s", name, shape), 2);
            shape_text(&t[i], ours, sizeof ours);
            if (strcmp(name, t[i].name) != 0 || strcmp(shape, ours) != 0)
                fail_msg("%s: state_dict entry %d is %s %s, torchvision's %s %s", *a, i, t[i].name,
                         ours, name, shape);
            p = strchr(p + 1, '\n');
        }
        mgt_model_free(m);
        checked++;
    }
    print_message("%d architectures match torchvision's table\n", checked);
    assert_true(checked > 0);
    free(text);
}

/* ---- learning on two mock devices ---- */

typedef struct learn_case {
    const char *family;
    const char *arch;
    int size, classes, batch, steps;
    float lr;
} learn_case;

/* One representative per family at the smallest input it takes here. */
static const learn_case learn_cases[] = {
    {"vgg", "vgg11_bn", 32, 4, 4, 6, 0.002f},
    {"alexnet", "alexnet", 63, 4, 4, 8, 0.05f},
    {"squeezenet", "squeezenet1_1", 32, 4, 4, 8, 0.05f},
};

#define N_LEARN ((int)(sizeof learn_cases / sizeof learn_cases[0]))

typedef struct replica {
    mgt_device *d;
    mgt_stream *s;
    mgt_model *m;
    mgt_buffer *io, *mom;
    float *x;
    int32_t *labels;
} replica;

static float train_loss(replica *r, const learn_case *lc, uint64_t step)
{
    mgt_dropout_key k = {.seed = 7, .step = step, .sample0 = 0, .sample_stride = 1};
    mgt_model_set_dropout_key(r->m, &k);
    CHECK(mgt_model_forward(r->m, r->s, r->x, lc->batch, true, NULL));
    CHECK(mgt_model_loss(r->m, r->s, r->labels, 0.0f, NULL));
    float loss;
    CHECK(mgt_copy_d2h(r->s, &loss, mgt_model_loss_ptr(r->m), sizeof loss));
    CHECK(mgt_stream_synchronize(r->s, NULL));
    return loss;
}

static void test_learn(void **state)
{
    (void)state;
    const learn_case *lc = NULL;
    for (int i = 0; i < N_LEARN; i++)
        if (arg && strcmp(learn_cases[i].family, arg) == 0)
            lc = &learn_cases[i];
    if (!lc)
        fail_msg("no learning case for family '%s'", arg ? arg : "(none)");
    mgt_devset *set = mgt_test_open_mock(2, "");
    size_t nx = (size_t)lc->batch * 3 * lc->size * lc->size;
    float *x = malloc(nx * sizeof *x);
    int32_t labels[64];
    assert_non_null(x);
    uint32_t h = 12345;
    for (size_t i = 0; i < nx; i++) {
        h = h * 1664525u + 1013904223u;
        x[i] = (float)(h >> 8) / 16777216.0f * 2.0f - 1.0f;
    }
    for (int i = 0; i < lc->batch; i++)
        labels[i] = i % lc->classes;
    replica r[2];
    for (int k = 0; k < 2; k++) {
        r[k].d = mgt_devset_device(set, k);
        CHECK(mgt_stream_create(r[k].d, &r[k].s));
        mgt_model_config cfg = {.arch = lc->arch,
                                .classes = lc->classes,
                                .in_channels = 3,
                                .image_size = lc->size,
                                .batch = lc->batch};
        CHECK(mgt_model_create(&cfg, r[k].d, &r[k].m));
        CHECK(mgt_model_init(r[k].m, r[k].s, 42));
        size_t pb;
        mgt_model_params(r[k].m, &pb);
        CHECK(mgt_buffer_alloc(r[k].d, nx * sizeof(float) + sizeof labels, &r[k].io));
        CHECK(mgt_buffer_alloc(r[k].d, pb, &r[k].mom));
        r[k].x = mgt_buffer_ptr(r[k].io);
        r[k].labels = (int32_t *)(r[k].x + nx);
        CHECK(mgt_copy_h2d(r[k].s, r[k].x, x, nx * sizeof(float)));
        CHECK(mgt_copy_h2d(r[k].s, r[k].labels, labels, sizeof labels));
    }
    float first = train_loss(&r[0], lc, 0), last = 0;
    for (int step = 1; step <= lc->steps; step++)
        for (int k = 0; k < 2; k++) {
            size_t pb;
            float *params = mgt_model_params(r[k].m, &pb);
            mgt_dropout_key key = {
                .seed = 7, .step = (uint64_t)step, .sample0 = 0, .sample_stride = 1};
            mgt_model_set_dropout_key(r[k].m, &key);
            CHECK(mgt_model_zero_grad(r[k].m, r[k].s));
            CHECK(mgt_model_forward(r[k].m, r[k].s, r[k].x, lc->batch, true, NULL));
            CHECK(mgt_model_loss(r[k].m, r[k].s, r[k].labels, 0.0f, NULL));
            CHECK(mgt_model_backward(r[k].m, r[k].s, NULL, NULL));
            mgt_sgd_params sp = {.lr = lc->lr,
                                 .momentum = 0.9f,
                                 .weight_decay = 0.0f,
                                 .grad_scale = 1.0f,
                                 .first_step = step == 1};
            CHECK(mgt_sgd_update(r[k].s, params, mgt_buffer_ptr(r[k].mom),
                                 mgt_model_grads(r[k].m, NULL), pb / sizeof(float), &sp));
            CHECK(mgt_stream_synchronize(r[k].s, NULL));
        }
    last = train_loss(&r[0], lc, 0);
    float other = train_loss(&r[1], lc, 0);
    print_message("%s: loss %.4f -> %.4f after %d steps\n", lc->arch, (double)first, (double)last,
                  lc->steps);
    if (!(last < first - 0.05f))
        fail_msg("%s: the loss went from %g to %g in %d steps on one batch", lc->arch,
                 (double)first, (double)last, lc->steps);
    assert_true(last == other);
    size_t pb;
    float *p0 = mgt_model_params(r[0].m, &pb), *p1 = mgt_model_params(r[1].m, NULL);
    char *h0 = malloc(pb), *h1 = malloc(pb);
    assert_non_null(h0);
    assert_non_null(h1);
    CHECK(mgt_copy_d2h(r[0].s, h0, p0, pb));
    CHECK(mgt_copy_d2h(r[1].s, h1, p1, pb));
    CHECK(mgt_stream_synchronize(r[0].s, NULL));
    CHECK(mgt_stream_synchronize(r[1].s, NULL));
    if (memcmp(h0, h1, pb) != 0)
        fail_msg("%s: the two replicas' parameters differ after %d steps", lc->arch, lc->steps);
    free(h0);
    free(h1);
    for (int k = 0; k < 2; k++) {
        mgt_buffer_free(r[k].io);
        mgt_buffer_free(r[k].mom);
        mgt_model_free(r[k].m);
        mgt_stream_free(r[k].s);
    }
    mgt_devset_free(set);
    free(x);
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "tables";
    arg = argc > 2 ? argv[2] : NULL;
    if (strcmp(what, "tables") == 0) {
        const struct CMUnitTest t[] = {cmocka_unit_test(test_tables)};
        return cmocka_run_group_tests(t, NULL, NULL);
    }
    if (strcmp(what, "learn") == 0) {
        const struct CMUnitTest t[] = {cmocka_unit_test(test_learn)};
        return cmocka_run_group_tests(t, NULL, NULL);
    }
    fprintf(stderr, "usage: test_zoo tables | learn FAMILY\n");
    return 2;
}
