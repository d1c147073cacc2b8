/* The byte model of the CUDA kernels (src/device/bytes.c, the byte-model devices of
   src/device/trace.c, `mgtrain model --bytes`): each op's bytes against the tensor sizes it
   moves, the old 16-bit path's three conversions per convolution pass, the channels-last
   path's halving of every elementwise op's bytes and its absence of transposes in a resnet50
   step, and a plan CUDA can run (every op of every zoo architecture's step taken by the CUDA
   backend's rule), computed bit for bit as NCHW computes it (seven architectures stepped on
   the reference). About 25 s of CPU, the plan check most of it; the rest plans and traces. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "app/commands.h"
#include "device/bytes.h"
#include "mgt/device.h"
#include "mgt/nn.h"

static float buf[4]; /* pointers the byte model never reads */

static mgt_op_bytes bytes_of(const mgt_op *op)
{
    assert_int_equal(mgt_op_check(op), MGT_OK);
    mgt_op_bytes b;
    mgt_op_bytes_cuda(op, &b);
    return b;
}

/* ReLU, its backward and add: one pass, every operand once, at the stored element size. */
static void test_elementwise_halves(void **state)
{
    (void)state;
    const size_t n = 1000;
    mgt_op relu = {.kind = MGT_OP_RELU_FWD};
    relu.u.relu_fwd = (mgt_relu_fwd_args){buf, buf, n};
    mgt_op_bytes f = bytes_of(&relu);
    assert_true(f.read == 4.0 * n && f.written == 4.0 * n && f.convert == 0 && f.passes == 1);
    relu.store_in = relu.store_out = MGT_PREC_BF16;
    mgt_op_bytes h = bytes_of(&relu);
    assert_true(h.read == 2.0 * n && h.written == 2.0 * n && h.passes == 1);

    mgt_op rb = {.kind = MGT_OP_RELU_BWD, .store_in = MGT_PREC_FP16, .store_out = MGT_PREC_FP16};
    rb.u.relu_bwd = (mgt_relu_bwd_args){buf, buf, buf, n};
    h = bytes_of(&rb);
    assert_true(h.read == 4.0 * n && h.written == 2.0 * n);

    mgt_op add = {.kind = MGT_OP_ADD};
    add.u.add = (mgt_add_args){buf, buf, buf, n};
    f = bytes_of(&add);
    add.store_in = add.store_out = MGT_PREC_BF16;
    h = bytes_of(&add);
    assert_true(f.read == 8.0 * n && f.written == 4.0 * n);
    assert_true(2 * h.read == f.read && 2 * h.written == f.written);
}

static mgt_op conv_op(mgt_op_kind kind, mgt_precision prec, mgt_precision store, mgt_layout x,
                      mgt_layout y, float beta)
{
    mgt_op op = {.kind = kind, .prec = prec, .store_in = store, .store_out = store};
    op.u.conv = (mgt_conv_args){buf, buf, buf,
                                (mgt_conv2d_shape){.n = 2,
                                                   .c = 8,
                                                   .h = 6,
                                                   .w = 6,
                                                   .k = 16,
                                                   .r = 3,
                                                   .s = 3,
                                                   .stride_h = 1,
                                                   .stride_w = 1,
                                                   .pad_h = 1,
                                                   .pad_w = 1,
                                                   .groups = 1,
                                                   .x_layout = x,
                                                   .y_layout = y},
                                beta};
    return op;
}

/* A convolution pass's bytes are its tensors' sizes: fp32 through cuDNN once; the old 16-bit
   path's two input conversions and one output conversion around cuDNN's 16-bit pass; the
   channels-last path reading and writing 16-bit activations where they lie, with the
   filter's 16-bit copy made by the forward pass only. */
static void test_conv_bytes_are_tensor_sizes(void **state)
{
    (void)state;
    const double nx = 2.0 * 8 * 6 * 6, ny = 2.0 * 16 * 6 * 6, nw = 16.0 * 8 * 3 * 3;
    mgt_op op = conv_op(MGT_OP_CONV2D_FWD, MGT_PREC_F32, MGT_PREC_F32, MGT_LAYOUT_NCHW,
                        MGT_LAYOUT_NCHW, 0.0f);
    mgt_op_bytes b = bytes_of(&op);
    assert_true(b.read == 4 * (nx + nw) && b.written == 4 * ny && b.convert == 0 && b.passes == 1);

    op = conv_op(MGT_OP_CONV2D_FWD, MGT_PREC_BF16, MGT_PREC_F32, MGT_LAYOUT_NCHW, MGT_LAYOUT_NCHW,
                 0.0f);
    b = bytes_of(&op);
    assert_int_equal(b.passes, 4); /* x and w to NHWC 16-bit, cuDNN, y back to fp32 NCHW */
    assert_true(b.read == 4 * nx + 4 * nw + 2 * (nx + nw) + 2 * ny);
    assert_true(b.written == 2 * nx + 2 * nw + 2 * ny + 4 * ny);
    assert_true(b.convert == 6 * nx + 6 * nw + 6 * ny);

    op = conv_op(MGT_OP_CONV2D_FWD, MGT_PREC_BF16, MGT_PREC_BF16, MGT_LAYOUT_NHWC, MGT_LAYOUT_NHWC,
                 0.0f);
    b = bytes_of(&op);
    assert_int_equal(b.passes, 2); /* the filter's copy, cuDNN */
    assert_true(b.read == 4 * nw + 2 * (nx + nw) && b.written == 2 * nw + 2 * ny);
    assert_true(b.convert == 6 * nw);

    /* the model's input: fp32 NCHW into the first convolution, one coalesced relayout */
    op = conv_op(MGT_OP_CONV2D_FWD, MGT_PREC_BF16, MGT_PREC_F32, MGT_LAYOUT_NCHW, MGT_LAYOUT_NHWC,
                 0.0f);
    op.store_out = MGT_PREC_BF16;
    b = bytes_of(&op);
    assert_int_equal(b.passes, 3);
    assert_true(b.convert == 6 * nx + 6 * nw);

    op = conv_op(MGT_OP_CONV2D_BWD_DATA, MGT_PREC_FP16, MGT_PREC_FP16, MGT_LAYOUT_NHWC,
                 MGT_LAYOUT_NHWC, 1.0f);
    b = bytes_of(&op);
    assert_int_equal(b.passes, 1); /* the cached filter copy; beta blended by cuDNN */
    assert_true(b.read == 2 * (ny + nw + nx) && b.written == 2 * nx && b.convert == 0);

    op = conv_op(MGT_OP_CONV2D_BWD_FILTER, MGT_PREC_BF16, MGT_PREC_BF16, MGT_LAYOUT_NHWC,
                 MGT_LAYOUT_NHWC, 1.0f);
    b = bytes_of(&op);
    assert_int_equal(b.passes, 2); /* cuDNN, then the 16-bit KRSC gradient into fp32 KCRS */
    assert_true(b.read == 2 * (ny + nx) + 2 * nw + 4 * nw && b.written == 2 * nw + 4 * nw);
}

/* Batch norm reads its input twice (statistics, normalisation); the fp32 path pays a pass of
   its own for a folded ReLU, the 16-bit kernels fold it. */
static void test_batchnorm_passes(void **state)
{
    (void)state;
    float *p = buf;
    mgt_bn_shape sh = {.n = 4, .c = 32, .hw = 49, .eps = 1e-5f, .momentum = 0.1f, .relu = true};
    const double n = 4.0 * 32 * 49;
    mgt_op op = {.kind = MGT_OP_BN_FWD_TRAIN};
    op.u.bn_train = (mgt_bn_train_args){p, p, p, p, p, p, p, p, sh, NULL, MGT_PREC_F32};
    mgt_op_bytes f = bytes_of(&op);
    op.store_in = op.store_out = MGT_PREC_BF16;
    op.u.bn_train.sh.layout = MGT_LAYOUT_NHWC;
    mgt_op_bytes h = bytes_of(&op);
    assert_true(f.read >= 4 * n * 2 + 4 * n && f.written >= 4 * n * 2); /* + the ReLU pass */
    assert_true(h.read >= 2 * n * 2 && h.read < 2 * n * 2 + 2 * n);     /* x twice */
    assert_true(h.written >= 2 * n && h.written < 2 * n + n);
    assert_int_equal(f.passes, 4);
    assert_int_equal(h.passes, 3);

    /* a fused residual add and ReLU (plan_fusion): the residual read by the normalising pass,
       its gradient written by the backward's last, nothing else; where the three ops apart
       moved the BN's output out and in, the add's three operands and the ReLU's two */
    op.u.bn_train.sh.relu = true;
    op.u.bn_train.z = p;
    op.u.bn_train.z_round = MGT_PREC_BF16;
    mgt_op_bytes z = bytes_of(&op);
    assert_true(z.read == h.read + 2 * n && z.written == h.written && z.passes == 3);
    mgt_op bwd = {.kind = MGT_OP_BN_BWD, .store_in = MGT_PREC_BF16, .store_out = MGT_PREC_BF16};
    bwd.u.bn_bwd = (mgt_bn_bwd_args){p, p, p, p, p, p, p, p, p, op.u.bn_train.sh, NULL};
    mgt_op_bytes b = bytes_of(&bwd);
    bwd.u.bn_bwd.dz = p;
    mgt_op_bytes bz = bytes_of(&bwd);
    assert_true(bz.read == b.read && bz.written == b.written + 2 * n && bz.passes == b.passes);
}

static const mgt_bytes_row *row(const mgt_app_bytes_trace *t, const char *name)
{
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->rows[i].name, name) == 0)
            return &t->rows[i];
    fail_msg("no row %s in the trace", name);
    return NULL;
}

static double total(const mgt_bytes_row *r) { return r->read + r->written; }

/* The kernels a trace launched of one kind (0 where it has no row). */
static long calls_of(const mgt_app_bytes_trace *t, const char *name)
{
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->rows[i].name, name) == 0)
            return (long)t->rows[i].calls;
    return 0;
}

/* One resnet50 step at 224 (batch 64): the old path stores nothing in 16 bits and converts at
   every convolution pass (four kernels each: three conversions and cuDNN); the channels-last
   path keeps the body's activations NHWC 16-bit, halves every elementwise op's bytes, folds
   each block's residual add and ReLU into its last batch norm, runs one kernel per
   backward-data pass and converts only the input image and the filters. */
static void test_resnet50_step(void **state)
{
    (void)state;
    mgt_model_config cfg = {
        .arch = "resnet50", .classes = 1000, .in_channels = 3, .image_size = 224, .batch = 64};
    cfg.amp = MGT_PREC_BF16;
    static mgt_app_bytes_trace old, nhwc;
    assert_int_equal(mgt_app_trace_step(&cfg, 64, MGT_PREC_F32, &old), MGT_OK);
    assert_int_equal(mgt_app_trace_step(&cfg, 64, MGT_PREC_BF16, &nhwc), MGT_OK);
    assert_int_equal(old.values_16, 0);
    /* every activation but the input image, the global pool's output and the logits */
    assert_int_equal(nhwc.values_16, nhwc.values - 2);

    /* the 16 blocks' adds and the ReLUs after them (the only ReLUs not folded into a batch
       norm on either path) run inside the blocks' last batch norms on the channels-last path */
    assert_int_equal(calls_of(&old, "add"), 16);
    assert_int_equal(calls_of(&old, "relu_forward"), 16);
    assert_int_equal(calls_of(&old, "relu_backward"), 16);
    assert_int_equal(calls_of(&nhwc, "add") + calls_of(&nhwc, "relu_forward") +
                         calls_of(&nhwc, "relu_backward"),
                     0);
    const char *elementwise[] = {"maxpool2d_forward", "maxpool2d_backward"};
    for (size_t i = 0; i < sizeof elementwise / sizeof *elementwise; i++) {
        const mgt_bytes_row *o = row(&old, elementwise[i]), *h = row(&nhwc, elementwise[i]);
        assert_int_equal(o->calls, h->calls);
        if (total(o) != 2 * total(h))
            fail_msg("%s: %.0f bytes on fp32 activations, %.0f on 16-bit ones", elementwise[i],
                     total(o), total(h));
    }
    const char *convs[] = {"conv2d_forward", "conv2d_backward_data", "conv2d_backward_filter"};
    for (int i = 0; i < 3; i++) {
        const mgt_bytes_row *o = row(&old, convs[i]);
        assert_int_equal(o->passes, 4 * o->calls);
    }
    const mgt_bytes_row *bd = row(&nhwc, "conv2d_backward_data");
    assert_int_equal(bd->passes, bd->calls);
    assert_true(bd->convert == 0.0);

    /* conversions of the channels-last forward: each filter's 16-bit copy (4 bytes read, 2
       written per weight) and the input image (4 + 2 per value), nothing else */
    mgt_model *m;
    assert_int_equal(mgt_model_create(&cfg, NULL, &m), MGT_OK);
    int nt;
    const mgt_model_entry *t = mgt_model_table(m, &nt);
    double wconv = 0;
    for (int i = 0; i < nt; i++)
        if (t[i].ndim == 4)
            wconv += (double)t[i].shape[0] * t[i].shape[1] * t[i].shape[2] * t[i].shape[3];
    mgt_model_free(m);
    const double image = 64.0 * 3 * 224 * 224;
    assert_true(row(&nhwc, "conv2d_forward")->convert == 6 * wconv + 6 * image);
    /* and backward filter: the input image again, each 16-bit gradient into fp32 (2 read, 4
       read and 4 written: the gradients accumulate) */
    assert_true(row(&nhwc, "conv2d_backward_filter")->convert == 10 * wconv + 6 * image);

    double to = 0, tn = 0;
    for (int i = 0; i < old.n; i++)
        to += total(&old.rows[i]);
    for (int i = 0; i < nhwc.n; i++)
        tn += total(&nhwc.rows[i]);
    assert_true(tn < 0.45 * to); /* 0.37 at batch 256 */
}

/* Every zoo architecture's training step under --amp bf16 is one the CUDA backend runs: the
   byte model refuses what mgt_op_cuda_takes refuses, as CUDA's supports_op does. */
static void test_zoo_plans_run_on_cuda(void **state)
{
    (void)state;
    int n;
    const mgt_arch_info *archs = mgt_arch_list(&n);
    static mgt_app_bytes_trace t;
    for (int i = 0; i < n; i++) {
        mgt_model_config cfg = {.arch = archs[i].name,
                                .classes = archs[i].synthetic_classes,
                                .in_channels = 3,
                                .image_size = archs[i].synthetic_size,
                                .batch = 2,
                                .amp = MGT_PREC_BF16};
        if (mgt_app_trace_step(&cfg, 2, MGT_PREC_BF16, &t) != MGT_OK)
            fail_msg("%s: %s", archs[i].name, mgt_error_last());
    }
}

/* One training forward and backward of cfg on d: the loss and the parameter gradients, on
   the host (grads gets *n floats, malloc'ed). Weights from seed 7, the same input and labels
   on every device. */
static void step_on(mgt_device *d, const mgt_model_config *cfg, float *loss, float **grads,
                    size_t *n)
{
    mgt_stream *s;
    mgt_model *m;
    assert_int_equal(mgt_stream_create(d, &s), MGT_OK);
    if (mgt_model_create(cfg, d, &m) != MGT_OK)
        fail_msg("%s: %s", cfg->arch, mgt_error_last());
    assert_int_equal(mgt_model_init(m, s, 7), MGT_OK);
    size_t image = (size_t)cfg->in_channels * cfg->image_size * cfg->image_size;
    size_t xn = (size_t)cfg->batch * image;
    float *hx = malloc(xn * sizeof *hx);
    int32_t hl[4] = {1, 3, 0, 2}; /* cfg->batch is 4 at most */
    assert_non_null(hx);
    uint32_t r = 12345;
    for (size_t i = 0; i < xn; i++) {
        r = r * 1664525u + 1013904223u;
        hx[i] = (float)(r >> 8) / 16777216.0f * 2.0f - 1.0f;
    }
    mgt_buffer *x, *labels;
    assert_int_equal(mgt_buffer_alloc(d, xn * sizeof(float), &x), MGT_OK);
    assert_int_equal(mgt_buffer_alloc(d, sizeof hl, &labels), MGT_OK);
    assert_int_equal(mgt_copy_h2d(s, mgt_buffer_ptr(x), hx, xn * sizeof(float)), MGT_OK);
    assert_int_equal(mgt_copy_h2d(s, mgt_buffer_ptr(labels), hl, sizeof hl), MGT_OK);
    assert_int_equal(mgt_model_zero_grad(m, s), MGT_OK);
    if (mgt_model_forward(m, s, mgt_buffer_ptr(x), cfg->batch, true, NULL) != MGT_OK ||
        mgt_model_loss(m, s, mgt_buffer_ptr(labels), 0.0f, NULL) != MGT_OK ||
        mgt_model_backward(m, s, NULL, NULL) != MGT_OK)
        fail_msg("%s: %s", cfg->arch, mgt_error_last());
    size_t gbytes;
    const float *g = mgt_model_grads(m, &gbytes);
    *n = gbytes / sizeof(float);
    *grads = malloc(gbytes);
    assert_non_null(*grads);
    assert_int_equal(mgt_copy_d2h(s, *grads, g, gbytes), MGT_OK);
    assert_int_equal(mgt_copy_d2h(s, loss, mgt_model_loss_ptr(m), sizeof(float)), MGT_OK);
    assert_int_equal(mgt_stream_synchronize(s, NULL), MGT_OK);
    mgt_buffer_free(labels);
    mgt_buffer_free(x);
    mgt_model_free(m);
    mgt_stream_free(s);
    free(hx);
}

/* The plan CUDA runs under --amp (NHWC 16-bit activations, layers.c's channels-last strides
   for concatenation, slices and shuffles, the relayouts at its edges), computed by the
   reference on a running byte-model device, against the same storage kept NCHW, also on the
   reference: its loops visit every sum in the same order whatever the layout, so the two
   steps must agree bit for bit. A wrong NHWC stride or layout anywhere in the step fails it
   (it found concatenation's and slices' backward strides). The seven architectures take
   every kind with an NHWC 16-bit kernel on CUDA: adaptive pooling (densenet121, googlenet's
   aux logits), the channel bias, layer norm and layer scale (convnext_tiny), the
   squeeze-excite scale and stochastic depth (efficientnet_b0). 32x32, batch 2: about 20 s of
   CPU, convnext_tiny and densenet121 most of it. */
static const char *const cl_archs[] = {"resnet18",       "shufflenet_v2_x0_5", "googlenet",
                                       "mobilenet_v2",   "densenet121",        "convnext_tiny",
                                       "efficientnet_b0"};
#define N_CL_ARCHS (sizeof cl_archs / sizeof *cl_archs)

/* state: the one architecture to run (its index in cl_archs picks the precision), or NULL for
   all of them */
static void test_channels_last_plan_computes(void **state)
{
    const char *only = *state;
    for (size_t a = 0; a < N_CL_ARCHS; a++) {
        if (only && strcmp(only, cl_archs[a]) != 0)
            continue;
        mgt_model_config cfg = {.arch = cl_archs[a],
                                .classes = 4,
                                .in_channels = 3,
                                .image_size = 32,
                                .batch = 2,
                                .amp = a % 2 ? MGT_PREC_FP16 : MGT_PREC_BF16};
        mgt_devset *nhwc, *nchw;
        assert_int_equal(mgt_devset_open_bytes(MGT_LAYOUT_NHWC, cfg.amp, true, &nhwc), MGT_OK);
        assert_int_equal(mgt_devset_open_bytes(MGT_LAYOUT_NCHW, cfg.amp, true, &nchw), MGT_OK);
        float l1, l2;
        float *g1, *g2;
        size_t n1, n2;
        step_on(mgt_devset_device(nhwc, 0), &cfg, &l1, &g1, &n1);
        step_on(mgt_devset_device(nchw, 0), &cfg, &l2, &g2, &n2);
        assert_int_equal(n1, n2);
        size_t differ = 0;
        for (size_t i = 0; i < n1; i++)
            differ += memcmp(&g1[i], &g2[i], sizeof(float)) != 0;
        printf("%s --amp %s: loss %.6f channels last, %.6f NCHW (the reference both); %zu of "
               "%zu gradients differ\n",
               cl_archs[a], mgt_precision_name(cfg.amp), (double)l1, (double)l2, differ, n1);
        if (memcmp(&l1, &l2, sizeof l1) != 0 || differ)
            fail_msg("%s: the channels-last plan computes another step", cl_archs[a]);
        free(g1);
        free(g2);
        mgt_devset_free(nchw);
        mgt_devset_free(nhwc);
    }
}

/* `mgtrain model --bytes`'s flags: one line each for what is missing. */
static void test_model_bytes_flags(void **state)
{
    (void)state;
    char *no_amp[] = {"model", "-a", "resnet18", "--bytes", NULL};
    assert_int_equal(mgt_app_cmd_model(4, no_amp), 2);
    char *no_bytes[] = {"model", "-a", "resnet18", "-b", "8", NULL};
    assert_int_equal(mgt_app_cmd_model(5, no_bytes), 2);
    char *no_arch[] = {"model", "--amp", "bf16", "--bytes", NULL};
    assert_int_equal(mgt_app_cmd_model(4, no_arch), 2);
    char *ok[] = {"model", "-a", "resnet18", "--amp", "fp16", "--bytes", "-b", "2", NULL};
    assert_int_equal(mgt_app_cmd_model(8, ok), 0);
}

/* No argument: every test but the channels-last steps; "channels_last ARCH": that
   architecture's step, a CTest test of its own (bytes.channels_last.ARCH: the seven steps run
   on the reference backend, 323 s under the address sanitizer on an AVX2 CPU, 2026-12-06,
   AMD EPYC Zen 3); another argument: a cmocka filter of the tests' names. */
int main(int argc, char **argv)
{
    if (argc > 2 && strcmp(argv[1], "channels_last") == 0) {
        bool known = false;
        for (size_t a = 0; a < N_CL_ARCHS; a++)
            known |= strcmp(argv[2], cl_archs[a]) == 0;
        if (!known) {
            fprintf(stderr, "test_bytes: no channels-last case '%s'\n", argv[2]);
            return 2;
        }
        const struct CMUnitTest t[] = {
            cmocka_unit_test_prestate(test_channels_last_plan_computes, argv[2]),
        };
        return cmocka_run_group_tests(t, NULL, NULL);
    }
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_elementwise_halves),
        cmocka_unit_test(test_conv_bytes_are_tensor_sizes),
        cmocka_unit_test(test_batchnorm_passes),
        cmocka_unit_test(test_resnet50_step),
        cmocka_unit_test(test_zoo_plans_run_on_cuda),
        cmocka_unit_test(test_model_bytes_flags),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
