/* `mgtrain export --onnx`, checked by implementations nobody here wrote:
     check light|heavy|ARCH...  every architecture of `mgtrain model` (light: all but those over
                          30 M parameters; heavy: those; or those named), filled with pseudo-random
                          values and saved as a checkpoint,
                          exported through the command, then Debian's python3-onnx checker and
                          the initializers against the checkpoint's tensors
                          (scripts/check_onnx.py, one architecture at a time); light
                          takes the smallest of each transformer family (vit_tiny_4, swin_t,
                          swin_v2_t, maxvit_t) too
     runtime [heavy|ARCH] a representative of each family (heavy: vit_b_16 and maxvit_t; or
                          ARCH) trained 4 steps on synthetic data
                          (mgt_train_run, a checkpoint with optimizer state), exported; ONNX Runtime's logits on a random
                          batch of 2 (and of 1: the batch is dynamic) against mgtrain's
                          (scripts/check_onnx_runtime.py, 1e-5 of the largest logit; the largest
                          difference measured is 9e-7 of it). Needs
                          onnxruntime: MGT_ORT_PYTHON names a Python that has it (PyPI, a venv
                          of one's own); without one it skips and says so.
     refuse               the command's bad input: one line, no file left behind.
   Cost on 2 cores shared with other work (2026-12-06): light 172 s at a load of 7 (the 44
   convolutional architectures and four transformers; 23 of the CNNs took 35 s on a quieter
   machine, 37 s under ASan without the Python check); heavy 589 s for the 13 largest CNNs
   (the VGGs hold 128 M parameters each at any input size: writing, reading back and checking
   them is most of it), plus about 13 s a ViT-B; runtime 100 to 240 s for the CNNs, vit_b_16
   45 s; refuse < 1 s. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "app/app.h"
#include "mgt/nn.h"
#include "mgt/train.h"
#include "support/fixture.h"

static char root[512];
static const char *mode = "all";
/* check's architectures by name (its arguments past `check`) */
static char **names;
static int n_names;

static int setup(void **state)
{
    (void)state;
    snprintf(root, sizeof root, "/tmp/mgt-test-export-%d", (int)getpid());
    return mgt_test_remove_tree(root) == 0 && mkdir(root, 0777) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return mgt_test_remove_tree(root);
}

/* `mgtrain ARGS...` with its output silenced unless MGT_TEST_VERBOSE is set. */
static int app(const char *first, ...)
{
    char *argv[32] = {"mgtrain", (char *)first};
    int argc = 2;
    va_list ap;
    va_start(ap, first);
    for (const char *a; argc < 31 && (a = va_arg(ap, const char *));)
        argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;
    return mgt_app_main(argc, argv);
}

/* The transformer families (ViT, Swin, Swin V2, MaxViT) */
static bool is_transformer(const mgt_arch_info *a)
{
    static const char *const fams[] = {"vit", "cifar_vit", "swin", "maxvit"};
    for (size_t i = 0; i < sizeof fams / sizeof *fams; i++)
        if (strcmp(a->family, fams[i]) == 0)
            return true;
    return false;
}

/* The input side an architecture is exported at: small, yet one every family takes. */
static int test_size(const mgt_arch_info *a)
{
    if (strcmp(a->family, "cifar_resnet") == 0 || strcmp(a->family, "cifar_vit") == 0)
        return 32;
    if (strcmp(a->family, "vit") == 0 && strstr(a->name, "_14"))
        return 56; /* a multiple of the patch */
    if (strcmp(a->family, "maxvit") == 0)
        return 224; /* 7x7 windows and grids down to the last stage's 7x7 */
    if (strcmp(a->family, "vgg") == 0)
        return 32; /* 1x1 before the adaptive pool to 7x7: the exporter's general bins */
    /* 64, or the architecture's own side where 64 is too small (inception_v3's auxiliary
       classifier needs 299) */
    mgt_model_config mc = {
        .arch = a->name, .classes = 10, .in_channels = 3, .image_size = 64, .batch = 1};
    mgt_model *m = NULL;
    if (mgt_model_create(&mc, NULL, &m) != MGT_OK) {
        mgt_error_clear();
        return a->image_size;
    }
    mgt_model_free(m);
    return 64;
}

/* An image of 3 channels, size x size: a product of waves of frequencies f1 (rows) and f2
   (columns) plus an offset, values within [-1.3, 1.3]. Noise would not do: two noise images
   pool to nearly the same features, logits that hardly depend on the input. */
static void pattern(float *x, int size, float f1, float f2, float offset)
{
    for (int c = 0; c < 3; c++)
        for (int yy = 0; yy < size; yy++)
            for (int xx = 0; xx < size; xx++)
                x[((size_t)c * size + yy) * size + xx] =
                    0.8f * sinf(0.3f * f1 * (float)(yy + 1) + (float)c) *
                        cosf(0.2f * f2 * (float)(xx + 1)) +
                    offset;
}

/* A model of arch on d (10 classes, 3 channels), every tensor filled with distinct
   pseudo-random values (a few times faster than torchvision's initialisation on the VGGs'
   128 M parameters; running variances positive); the caller frees it. */
static mgt_model *make_model(mgt_device *d, mgt_stream *s, const char *arch, int size)
{
    mgt_model_config mc = {
        .arch = arch, .classes = 10, .in_channels = 3, .image_size = size, .batch = 1};
    mgt_model *m = NULL;
    CHECK(mgt_model_create(&mc, d, &m));
    size_t pb, bb;
    float *dp = mgt_model_params(m, &pb), *db = mgt_model_buffers(m, &bb);
    char *hp = calloc(1, pb), *hb = calloc(1, bb ? bb : 1);
    assert_true(hp && hb);
    int n;
    const mgt_model_entry *t = mgt_model_table(m, &n);
    uint32_t r = 7;
    for (int e = 0; e < n; e++) {
        if (t[e].role != MGT_MODEL_PARAM && t[e].role != MGT_MODEL_BUFFER)
            continue; /* counters; index arrays (int64, on the host) */
        float *v = (float *)((t[e].role == MGT_MODEL_PARAM ? hp : hb) + t[e].offset);
        for (size_t i = 0; i < t[e].numel; i++) {
            r = r * 1664525u + 1013904223u;
            v[i] = (float)(r >> 8) / (float)(1u << 24) - 0.5f;
            if (t[e].what == MGT_TENSOR_RUNNING_VAR)
                v[i] += 1.0f;
        }
    }
    CHECK(mgt_copy_h2d(s, dp, hp, pb));
    if (bb)
        CHECK(mgt_copy_h2d(s, db, hb, bb));
    CHECK(mgt_stream_synchronize(s, NULL));
    free(hp);
    free(hb);
    return m;
}

/* Multiplies the linear layers' weights: torchvision's normal(0, 0.01) shrinks the features
   through the V3s' and AlexNet's two or three classifier layers until the logits are their
   biases and hardly depend on the input. */
static void scale_linear(mgt_model *m, mgt_stream *s, float f)
{
    size_t pb;
    float *dp = mgt_model_params(m, &pb);
    char *hp = malloc(pb);
    assert_non_null(hp);
    CHECK(mgt_copy_d2h(s, hp, dp, pb));
    CHECK(mgt_stream_synchronize(s, NULL));
    int n;
    const mgt_model_entry *t = mgt_model_table(m, &n);
    for (int e = 0; e < n; e++)
        if (t[e].what == MGT_TENSOR_LINEAR_WEIGHT)
            for (size_t i = 0; i < t[e].numel; i++)
                ((float *)(hp + t[e].offset))[i] *= f;
    CHECK(mgt_copy_h2d(s, dp, hp, pb));
    CHECK(mgt_stream_synchronize(s, NULL));
    free(hp);
}

static size_t params_of(const mgt_arch_info *a)
{
    mgt_model_config mc = {
        .arch = a->name, .classes = 10, .in_channels = 3, .image_size = test_size(a), .batch = 1};
    mgt_model *m = NULL;
    CHECK(mgt_model_create(&mc, NULL, &m));
    mgt_model_counts c;
    mgt_model_get_counts(m, &c);
    mgt_model_free(m);
    return c.params;
}

/* Over 30 M parameters; maxvit_t's 30.9 M: the smallest of each transformer family is light */
static bool is_heavy(const mgt_arch_info *a)
{
    return params_of(a) > (is_transformer(a) ? 31000000u : 30000000u);
}

static void test_check(void **state)
{
    (void)state;
    mgt_devset *set = mgt_test_open_mock(1, "threads=2");
    mgt_device *d = mgt_devset_device(set, 0);
    mgt_stream *s;
    CHECK(mgt_stream_create(d, &s));
    int n;
    const mgt_arch_info *archs = mgt_arch_list(&n);
    int done = 0;
    for (int i = 0; i < n; i++) {
        bool heavy = is_heavy(&archs[i]), named = false;
        for (int j = 0; j < n_names; j++)
            named |= strcmp(names[j], archs[i].name) == 0;
        if ((strcmp(mode, "light") == 0 && heavy) || (strcmp(mode, "heavy") == 0 && !heavy) ||
            (strcmp(mode, "light") != 0 && strcmp(mode, "heavy") != 0 && !named))
            continue;
        /* regnet_y_128gf: 2.4 GiB of tensors, past one protobuf message (the exporter refuses
           it in one line rather than write a broken file) */
        if (params_of(&archs[i]) * sizeof(float) > ((size_t)2 << 30) - ((size_t)64 << 20)) {
            print_message("%s: %.2f GiB of tensors: past ONNX's 2 GiB without external data, "
                          "not exported\n",
                          archs[i].name, (double)params_of(&archs[i]) * 4 / (1 << 30));
            continue;
        }
        char ckpt[640], onnx[640], cmd[2048];
        snprintf(ckpt, sizeof ckpt, "%s/%s.safetensors", root, archs[i].name);
        snprintf(onnx, sizeof onnx, "%s/%s.onnx", root, archs[i].name);
        double t0 = mgt_time_now();
        mgt_model *m = make_model(d, s, archs[i].name, test_size(&archs[i]));
        double t1 = mgt_time_now();
        CHECK(mgt_model_save_safetensors(m, s, ckpt));
        mgt_model_free(m);
        double t2 = mgt_time_now();
        if (app("export", "--onnx", onnx, "--checkpoint", ckpt, NULL) != 0)
            fail_msg("%s: mgtrain export failed: %s", archs[i].name, mgt_error_last());
        print_message("%s: model %.1f s, checkpoint %.1f s, export %.1f s\n", archs[i].name,
                      t1 - t0, t2 - t1, mgt_time_now() - t2);
        /* one at a time: the heavy ones are half a gigabyte each. MGT_EXPORT_PYTHON=0 (the
           sanitizer build, whose subject is mgtrain's side) leaves the Python check out. */
        const char *py = getenv("MGT_EXPORT_PYTHON");
        if (py && strcmp(py, "0") == 0)
            snprintf(cmd, sizeof cmd, "true");
        else
            snprintf(cmd, sizeof cmd,
                     "/usr/bin/python3 " MGT_TEST_DATA_DIR "/../../scripts/check_onnx.py %s:%s",
                     onnx, ckpt);
        if (system(cmd) != 0)
            fail_msg("%s: scripts/check_onnx.py refused the export", archs[i].name);
        remove(ckpt);
        remove(onnx);
        done++;
    }
    const char *py = getenv("MGT_EXPORT_PYTHON");
    print_message("export check %s: %d architectures exported%s\n", mode, done,
                  py && strcmp(py, "0") == 0 ? " (MGT_EXPORT_PYTHON=0: no ONNX checker)"
                                             : " and passed the ONNX checker");
    assert_true(done > 0);
    mgt_devset_free(set);
}

static void test_runtime(void **state)
{
    (void)state;
    const char *py = getenv("MGT_ORT_PYTHON");
    char probe[600];
    snprintf(probe, sizeof probe, "%s -c 'import onnxruntime' >/dev/null 2>&1",
             py && *py ? py : "/usr/bin/python3");
    if (system(probe) != 0) {
        print_message("skipped: no onnxruntime (set MGT_ORT_PYTHON to a Python that has it, "
                      "e.g. a venv with `pip install onnxruntime`)\n");
        skip();
    }
    if (!py || !*py)
        py = "/usr/bin/python3";
    /* one of each family (mgt_arch_info.family) but MNASNet, whose BN momentum of 3e-4 leaves
       the running statistics at their start after any affordable number of forwards (its
       logits then reach 1e13: a check of nothing; its operators are the others') */
    static const char *const reps[] = {
        "resnet18",           "resnet20",           "vgg11_bn",        "alexnet",
        "squeezenet1_1",      "mobilenet_v3_small", "efficientnet_b0", "regnet_y_400mf",
        "shufflenet_v2_x0_5", "densenet121",        "convnext_tiny",   "googlenet",
        "inception_v3",       "vit_tiny_4",         "swin_t",          "swin_v2_t"};
    /* `runtime heavy`: ViT-B and MaxViT (at 224, its smallest side); `runtime ARCH`: one */
    static const char *const heavy[] = {"vit_b_16", "maxvit_t"};
    const char *const *archs = reps;
    size_t n_archs = sizeof reps / sizeof *reps;
    if (strcmp(mode, "heavy") == 0) {
        archs = heavy;
        n_archs = sizeof heavy / sizeof *heavy;
    } else if (strcmp(mode, "all") != 0) {
        archs = &mode;
        n_archs = 1;
    }
    mgt_devset *set = mgt_test_open_mock(1, "threads=2");
    mgt_device *d = mgt_devset_device(set, 0);
    mgt_stream *s;
    CHECK(mgt_stream_create(d, &s));
    for (size_t i = 0; i < n_archs; i++) {
        const mgt_arch_info *a = mgt_arch_find(archs[i]);
        assert_non_null(a);
        int size = test_size(a), batch = 2;
        char dir[640], ckpt[700], onnx[640], xin[640], yin[640], cmd[4096];
        snprintf(dir, sizeof dir, "%s/%s", root, archs[i]);
        snprintf(ckpt, sizeof ckpt, "%s/checkpoint.safetensors", dir);
        snprintf(onnx, sizeof onnx, "%s/%s.onnx", root, archs[i]);
        snprintf(xin, sizeof xin, "%s/%s.input.f32", root, archs[i]);
        snprintf(yin, sizeof yin, "%s/%s.logits.f32", root, archs[i]);
        /* a checkpoint of a few real steps (synthetic data, lr 0.01): weights and batch-norm
           statistics away from their initialisation, which leaves whole blocks near
           identities (ConvNeXt's layer_scale 1e-6) and logits that hardly depend on the
           input; the optimizer state in the file is what export must leave out */
        mgt_train_config c;
        mgt_train_config_defaults(&c);
        c.dummy = true;
        c.dummy_classes = 10;
        c.dummy_steps = 4;
        c.arch = archs[i];
        c.image_size = size;
        c.epochs = 1;
        c.batch_size = 4;
        c.checkpoint_dir = dir;
        c.lr.lr = 0.01f;
        mgt_train_controls ctl = {.out = mgt_test_quiet(), .no_validation = true};
        mgt_train_result res;
        CHECK(mgt_train_run(&c, &ctl, set, &res));
        /* mgtrain's logits: the checkpoint in a fresh model, evaluated on two patterns */
        mgt_model_config mc = {
            .arch = archs[i], .classes = 10, .in_channels = 3, .image_size = size, .batch = batch};
        mgt_model *m = NULL;
        CHECK(mgt_model_create(&mc, d, &m));
        static const char *const ignore[] = {"optimizer.", NULL};
        mgt_model_load_options lo = {.ignore_prefixes = ignore};
        CHECK(mgt_model_load_safetensors(m, s, ckpt, &lo, NULL));
        size_t nx = (size_t)batch * 3 * size * size;
        float *x = malloc(nx * sizeof *x), logits[2 * 10];
        assert_non_null(x);
        mgt_buffer *xb = NULL;
        CHECK(mgt_buffer_alloc(d, nx * sizeof(float), &xb));
        /* (not the transformers': their layer norms keep the features' scale, and 10 times
           every token linear makes attention's logits 100 times larger) */
        if (!is_transformer(a))
            scale_linear(m, s, 10.0f);
        /* batch-norm statistics of patterns like the ones evaluated (training forwards; 300
           for the V3s' momentum 0.01): with statistics far from the activations' own, the V3s'
           logits do not depend on the input at all */
        uint32_t r = 12345;
        for (int k = 0, moves = strstr(archs[i], "_v3_") ? 300 : 30; k < moves; k++) {
            for (int im = 0; im < batch; im++) {
                float u[3];
                for (int j = 0; j < 3; j++) {
                    r = r * 1664525u + 1013904223u;
                    u[j] = (float)(r >> 8) / (float)(1u << 24);
                }
                pattern(x + (size_t)im * 3 * size * size, size, 0.5f + 2.0f * u[0],
                        0.5f + 2.0f * u[1], u[2] - 0.5f);
            }
            CHECK(mgt_copy_h2d(s, mgt_buffer_ptr(xb), x, nx * sizeof(float)));
            CHECK(mgt_model_forward(m, s, mgt_buffer_ptr(xb), batch, true, NULL));
            CHECK(mgt_stream_synchronize(s, NULL));
        }
        CHECK(mgt_model_save_safetensors(m, s, ckpt)); /* the weights as evaluated */
        pattern(x, size, 1.0f, 2.0f, -0.3f);
        pattern(x + (size_t)3 * size * size, size, 2.0f, 1.0f, 0.3f);
        const float *dl;
        CHECK(mgt_copy_h2d(s, mgt_buffer_ptr(xb), x, nx * sizeof(float)));
        CHECK(mgt_model_forward(m, s, mgt_buffer_ptr(xb), batch, false, &dl));
        CHECK(mgt_copy_d2h(s, logits, dl, sizeof logits));
        CHECK(mgt_stream_synchronize(s, NULL));
        mgt_model_free(m);
        mgt_buffer_free(xb);
        FILE *f = fopen(xin, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(x, sizeof *x, nx, f), nx);
        fclose(f);
        f = fopen(yin, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(logits, sizeof *logits, 20, f), 20);
        fclose(f);
        free(x);
        if (app("export", "--onnx", onnx, "--checkpoint", ckpt, NULL) != 0)
            fail_msg("%s: mgtrain export failed: %s", archs[i], mgt_error_last());
        snprintf(cmd, sizeof cmd,
                 "%s " MGT_TEST_DATA_DIR "/../../scripts/check_onnx_runtime.py %s %s %s %d 3 %d "
                 "%d 10 1e-5",
                 py, onnx, xin, yin, batch, size, size);
        if (system(cmd) != 0)
            fail_msg("%s: ONNX Runtime's logits differ from mgtrain's", archs[i]);
        snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, onnx);
        assert_int_equal(system(cmd), 0);
    }
    mgt_devset_free(set);
}

/* One line naming the thing and the reason; exit 2 for the command line, 1 for a file; no
   output file left. */
static void test_refuse(void **state)
{
    (void)state;
    char out[640], bad[640];
    snprintf(out, sizeof out, "%s/x.onnx", root);
    snprintf(bad, sizeof bad, "%s/bad.safetensors", root);
    FILE *f = fopen(bad, "w");
    assert_non_null(f);
    fputs("not a safetensors file", f);
    fclose(f);
    assert_int_equal(app("export", "--checkpoint", bad, NULL), 2);                /* no --onnx */
    assert_int_equal(app("export", "--onnx", out, NULL), 2);                      /* no weights */
    assert_int_equal(app("export", "--onnx", out, "--pretrained", bad, NULL), 2); /* no -a */
    assert_int_equal(app("export", "--onnx", out, "--checkpoint", bad, "-a", "resnet18", NULL), 2);
    assert_int_equal(app("export", "--onnx", out, "--checkpoint", bad, NULL), 1);
    assert_int_equal(app("export", "--onnx", out, "-a", "nonet", "--pretrained", bad, NULL), 1);
    assert_int_equal(app("export", "--onnx", out, "--checkpoint", "/nonexistent", NULL), 1);
    assert_int_equal(access(out, F_OK), -1);
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "refuse";
    if (argc > 2) {
        mode = argv[2];
        names = argv + 2;
        n_names = argc - 2;
    }
    const struct CMUnitTest check[] = {cmocka_unit_test(test_check)};
    const struct CMUnitTest runtime[] = {cmocka_unit_test(test_runtime)};
    const struct CMUnitTest refuse[] = {cmocka_unit_test(test_refuse)};
    if (strcmp(what, "check") == 0)
        return cmocka_run_group_tests(check, setup, teardown);
    if (strcmp(what, "runtime") == 0)
        return cmocka_run_group_tests(runtime, setup, teardown);
    return cmocka_run_group_tests(refuse, setup, teardown);
}
