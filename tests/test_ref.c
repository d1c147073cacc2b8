/* Holds the reference kernels (mgt_ref_run) to PyTorch's numbers, and checks op names, argument
 * checks and operand lists.
 *
 * The goldens under MGT_TEST_DATA_DIR/ops/ are written by scripts/make_op_goldens.py, in
 * tests/support/golden.h's format.
 *
 * Tolerance: |got - want| <= atol + rtol * |want|, 1e-5 + 1e-4 by default (the goldens are
 * float64 results rounded once, so only the reference's own float rounding is left). SGD is held
 * to 1e-6 + 1e-5, since its whole update is a few float operations and a missing weight decay
 * (1e-4 * p) would otherwise hide inside the default band.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "support/golden.h"
#include "device/op.h"
#include "mgt/nn.h"

#define ATOL 1e-5
#define RTOL 1e-4

/* ---- golden files (tests/support/golden.h) ---- */

static mgt_test_golden *golden_load(const char *name)
{
    return mgt_test_golden_load("ops", name, "scripts/make_op_goldens.py");
}

/* A fresh copy, so that the op can write its inputs' neighbours without touching the golden. */
static float *dup(const float *src, size_t n)
{
    float *p = malloc(n * sizeof *p + 1);
    assert_non_null(p);
    memcpy(p, src, n * sizeof *p);
    return p;
}

/* Outputs start as NaN: an op that reads an output it should only write, or leaves part of it
   unwritten, then shows NaN. */
static float *nans(size_t n)
{
    float *p = malloc(n * sizeof *p + 1);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
    return p;
}

static void expect_close_tol(const char *what, const float *got, const float *want, size_t n,
                             double atol, double rtol)
{
    size_t bad = 0, first = 0;
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]);
        double lim = atol + rtol * fabs((double)want[i]);
        if (!(err <= lim)) { /* NaN counts as a mismatch */
            if (bad == 0)
                first = i;
            bad++;
            if (err > worst || isnan(err))
                worst = err;
        }
    }
    if (bad)
        fail_msg("%s: %zu of %zu values off; first at %zu: got %.9g, want %.9g (worst error %g)",
                 what, bad, n, first, (double)got[first], (double)want[first], worst);
}

static void expect_close(const char *what, const float *got, const float *want, size_t n)
{
    expect_close_tol(what, got, want, n, ATOL, RTOL);
}

static void expect_ok(mgt_status st)
{
    if (st != MGT_OK)
        fail_msg("status %d (%s): %s", (int)st, mgt_status_str(st), mgt_error_last());
}

/* Runs the op through the check first, as the dispatch layer would. */
static void run(const mgt_op *op)
{
    expect_ok(mgt_op_check(op));
    expect_ok(mgt_ref_run(op));
}

/* ---- names ---- */

/* The names come from the op list; CTest, the mock's fault option and error texts use them,
   so each must be unique, an identifier, and map back to its kind. The ones spelled out are
   names users type (fault=kernel@D:N:OP) and must not change. */
static void test_names(void **state)
{
    (void)state;
    for (int i = 0; i < MGT_OP_COUNT; i++) {
        const char *name = mgt_op_name((mgt_op_kind)i);
        assert_true(name[0] != '\0');
        assert_int_equal(strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789_"), strlen(name));
        assert_int_equal(mgt_op_kind_from_name(name), i);
        for (int j = 0; j < i; j++)
            assert_string_not_equal(name, mgt_op_name((mgt_op_kind)j));
    }
    static const struct {
        mgt_op_kind kind;
        const char *name;
    } stable[] = {
        {MGT_OP_AXPY, "axpy"},
        {MGT_OP_CONV2D_FWD, "conv2d_forward"},
        {MGT_OP_CONV2D_BWD_FILTER, "conv2d_backward_filter"},
        {MGT_OP_BN_FWD_TRAIN, "batchnorm_forward_train"},
        {MGT_OP_XENT_FWD, "softmax_xent_forward"},
        {MGT_OP_TOPK, "topk_correct"},
        {MGT_OP_SGD, "sgd_update"},
    };
    for (size_t i = 0; i < sizeof stable / sizeof stable[0]; i++)
        assert_string_equal(mgt_op_name(stable[i].kind), stable[i].name);
    assert_int_equal(mgt_op_kind_from_name("conv2d"), MGT_OP_COUNT);
    assert_int_equal(mgt_op_kind_from_name(""), MGT_OP_COUNT);
    assert_int_equal(mgt_op_kind_from_name(NULL), MGT_OP_COUNT);
    assert_non_null(mgt_op_name(MGT_OP_COUNT));
}

/* ---- gemm ---- */

static void test_gemm(void **state)
{
    (void)state;
    mgt_test_golden *g = golden_load("gemm");
    int32_t *dims = mgt_test_golden_i32(g, "dims", 3);
    float *ab = mgt_test_golden_f32(g, "alpha_beta", 2);
    int m = dims[0], n = dims[1], k = dims[2];
    static const char *const tags[] = {"nn", "nt", "tn", "tt"};
    for (int t = 0; t < 4; t++) {
        bool ta = tags[t][0] == 't', tb = tags[t][1] == 't';
        char name[16];
        /* Stored shapes; rows are padded to ld with NaN, which must never be read. */
        int a_rows = ta ? k : m, a_row = ta ? m : k, lda = a_row + 3;
        int b_rows = tb ? n : k, b_row = tb ? k : n, ldb = b_row + 2;
        int ldc = n + 1;
        snprintf(name, sizeof name, "%s.a", tags[t]);
        float *a_dense = mgt_test_golden_f32(g, name, (size_t)a_rows * a_row);
        snprintf(name, sizeof name, "%s.b", tags[t]);
        float *b_dense = mgt_test_golden_f32(g, name, (size_t)b_rows * b_row);
        snprintf(name, sizeof name, "%s.c0", tags[t]);
        float *c0 = mgt_test_golden_f32(g, name, (size_t)m * n);
        snprintf(name, sizeof name, "%s.c", tags[t]);
        float *want = mgt_test_golden_f32(g, name, (size_t)m * n);

        float *a = nans((size_t)a_rows * lda), *b = nans((size_t)b_rows * ldb);
        float *c = nans((size_t)m * ldc);
        for (int i = 0; i < a_rows; i++)
            memcpy(a + (size_t)i * lda, a_dense + (size_t)i * a_row, a_row * sizeof(float));
        for (int i = 0; i < b_rows; i++)
            memcpy(b + (size_t)i * ldb, b_dense + (size_t)i * b_row, b_row * sizeof(float));
        for (int i = 0; i < m; i++)
            memcpy(c + (size_t)i * ldc, c0 + (size_t)i * n, n * sizeof(float));

        mgt_op op = {.kind = MGT_OP_GEMM};
        op.u.gemm.trans_a = ta;
        op.u.gemm.trans_b = tb;
        op.u.gemm.m = m;
        op.u.gemm.n = n;
        op.u.gemm.k = k;
        op.u.gemm.alpha = ab[0];
        op.u.gemm.a = a;
        op.u.gemm.lda = lda;
        op.u.gemm.b = b;
        op.u.gemm.ldb = ldb;
        op.u.gemm.beta = ab[1];
        op.u.gemm.c = c;
        op.u.gemm.ldc = ldc;
        run(&op);
        float *got = nans((size_t)m * n);
        for (int i = 0; i < m; i++) {
            memcpy(got + (size_t)i * n, c + (size_t)i * ldc, n * sizeof(float));
            assert_true(isnan(c[(size_t)i * ldc + n])); /* the gap between rows is left alone */
        }
        expect_close(tags[t], got, want, (size_t)m * n);

        /* beta 0 overwrites: the NaN already in c is not read. */
        for (size_t i = 0; i < (size_t)m * ldc; i++)
            c[i] = NAN;
        op.u.gemm.beta = 0.0f;
        run(&op);
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                got[(size_t)i * n + j] = c[(size_t)i * ldc + j];
                want[(size_t)i * n + j] -= ab[1] * c0[(size_t)i * n + j];
            }
        expect_close(tags[t], got, want, (size_t)m * n);
        free(a);
        free(b);
        free(c);
        free(got);
    }
    mgt_test_golden_free(g);
}

/* ---- convolution ---- */

static void conv_case(const char *file)
{
    mgt_test_golden *g = golden_load(file);
    int32_t *s = mgt_test_golden_i32(g, "shape", 12);
    mgt_conv2d_shape sh = {
        .n = s[0],
        .c = s[1],
        .h = s[2],
        .w = s[3],
        .k = s[4],
        .r = s[5],
        .s = s[6],
        .stride_h = s[7],
        .stride_w = s[8],
        .pad_h = s[9],
        .pad_w = s[10],
        .groups = s[11],
    };
    int P = mgt_conv2d_out_h(&sh), Q = mgt_conv2d_out_w(&sh);
    size_t nx = (size_t)sh.n * sh.c * sh.h * sh.w, ny = (size_t)sh.n * sh.k * P * Q;
    size_t nw = (size_t)sh.k * (sh.c / sh.groups) * sh.r * sh.s;
    float *x = mgt_test_golden_f32(g, "x", nx), *w = mgt_test_golden_f32(g, "w", nw),
          *y = mgt_test_golden_f32(g, "y", ny);
    float *dy = mgt_test_golden_f32(g, "dy", ny), *dx = mgt_test_golden_f32(g, "dx", nx),
          *dw = mgt_test_golden_f32(g, "dw", nw);
    char what[96];

    /* forward, overwriting */
    float *out = nans(ny);
    mgt_op op = {.kind = MGT_OP_CONV2D_FWD};
    op.u.conv = (mgt_conv_args){.out = out, .in1 = x, .in2 = w, .sh = sh, .beta = 0.0f};
    run(&op);
    snprintf(what, sizeof what, "%s: conv2d_forward", file);
    expect_close(what, out, y, ny);
    /* forward with beta 0.5 on a buffer of ones */
    for (size_t i = 0; i < ny; i++)
        out[i] = 1.0f;
    op.u.conv.beta = 0.5f;
    run(&op);
    float *want = dup(y, ny);
    for (size_t i = 0; i < ny; i++)
        want[i] += 0.5f;
    snprintf(what, sizeof what, "%s: conv2d_forward beta 0.5", file);
    expect_close(what, out, want, ny);
    free(want);
    free(out);

    /* backward data */
    out = nans(nx);
    op.kind = MGT_OP_CONV2D_BWD_DATA;
    op.u.conv = (mgt_conv_args){.out = out, .in1 = dy, .in2 = w, .sh = sh, .beta = 0.0f};
    run(&op);
    snprintf(what, sizeof what, "%s: conv2d_backward_data", file);
    expect_close(what, out, dx, nx);
    free(out);

    /* backward filter, then once more with beta 1: the second pass accumulates */
    out = nans(nw);
    op.kind = MGT_OP_CONV2D_BWD_FILTER;
    op.u.conv = (mgt_conv_args){.out = out, .in1 = dy, .in2 = x, .sh = sh, .beta = 0.0f};
    run(&op);
    snprintf(what, sizeof what, "%s: conv2d_backward_filter", file);
    expect_close(what, out, dw, nw);
    op.u.conv.beta = 1.0f;
    run(&op);
    want = dup(dw, nw);
    for (size_t i = 0; i < nw; i++)
        want[i] *= 2.0f;
    snprintf(what, sizeof what, "%s: conv2d_backward_filter accumulating", file);
    expect_close(what, out, want, nw);
    free(want);
    free(out);
    mgt_test_golden_free(g);
}

static void test_conv_stride2_pad1(void **state)
{
    (void)state;
    conv_case("conv_s2p1");
}

static void test_conv_rect_groups(void **state)
{
    (void)state;
    conv_case("conv_rect_g2");
}

static void test_conv_depthwise(void **state)
{
    (void)state;
    conv_case("conv_dw");
}

static void test_conv_1x1_stride2(void **state)
{
    (void)state;
    conv_case("conv_1x1s2");
}

/* ---- batch norm ---- */

static void test_batchnorm(void **state)
{
    (void)state;
    mgt_test_golden *g = golden_load("batchnorm");
    int32_t *s = mgt_test_golden_i32(g, "shape", 3);
    float *em = mgt_test_golden_f32(g, "eps_momentum", 2);
    mgt_bn_shape sh = {.n = s[0], .c = s[1], .hw = s[2], .eps = em[0], .momentum = em[1]};
    size_t nx = (size_t)sh.n * sh.c * sh.hw, c = (size_t)sh.c;
    float *x = mgt_test_golden_f32(g, "x", nx), *gamma = mgt_test_golden_f32(g, "gamma", c),
          *beta = mgt_test_golden_f32(g, "beta", c);

    float *y = nans(nx), *mean = nans(c), *invstd = nans(c);
    float *rm = dup(mgt_test_golden_f32(g, "running_mean0", c), c),
          *rv = dup(mgt_test_golden_f32(g, "running_var0", c), c);
    mgt_op op = {.kind = MGT_OP_BN_FWD_TRAIN};
    op.u.bn_train.y = y;
    op.u.bn_train.save_mean = mean;
    op.u.bn_train.save_invstd = invstd;
    op.u.bn_train.running_mean = rm;
    op.u.bn_train.running_var = rv;
    op.u.bn_train.x = x;
    op.u.bn_train.gamma = gamma;
    op.u.bn_train.beta = beta;
    op.u.bn_train.sh = sh;
    run(&op);
    expect_close("batchnorm_forward_train y", y, mgt_test_golden_f32(g, "y", nx), nx);
    expect_close("batchnorm_forward_train save_mean", mean, mgt_test_golden_f32(g, "save_mean", c),
                 c);
    expect_close("batchnorm_forward_train save_invstd", invstd,
                 mgt_test_golden_f32(g, "save_invstd", c), c);
    expect_close("batchnorm_forward_train running_mean", rm,
                 mgt_test_golden_f32(g, "running_mean1", c), c);
    expect_close("batchnorm_forward_train running_var", rv,
                 mgt_test_golden_f32(g, "running_var1", c), c);

    /* backward from PyTorch's saved statistics; dgamma and dbeta start at 1 and accumulate */
    float *dx = nans(nx), *dgamma = malloc(c * sizeof(float)), *dbeta = malloc(c * sizeof(float));
    assert_true(dgamma && dbeta);
    for (size_t i = 0; i < c; i++)
        dgamma[i] = dbeta[i] = 1.0f;
    op = (mgt_op){.kind = MGT_OP_BN_BWD};
    op.u.bn_bwd.dx = dx;
    op.u.bn_bwd.dgamma = dgamma;
    op.u.bn_bwd.dbeta = dbeta;
    op.u.bn_bwd.dy = mgt_test_golden_f32(g, "dy", nx);
    op.u.bn_bwd.x = x;
    op.u.bn_bwd.gamma = gamma;
    op.u.bn_bwd.save_mean = mgt_test_golden_f32(g, "save_mean", c);
    op.u.bn_bwd.save_invstd = mgt_test_golden_f32(g, "save_invstd", c);
    op.u.bn_bwd.sh = sh;
    run(&op);
    expect_close("batchnorm_backward dx", dx, mgt_test_golden_f32(g, "dx", nx), nx);
    float *want_dgamma = dup(mgt_test_golden_f32(g, "dgamma", c), c),
          *want_dbeta = dup(mgt_test_golden_f32(g, "dbeta", c), c);
    for (size_t i = 0; i < c; i++) {
        want_dgamma[i] += 1.0f;
        want_dbeta[i] += 1.0f;
    }
    expect_close("batchnorm_backward dgamma", dgamma, want_dgamma, c);
    expect_close("batchnorm_backward dbeta", dbeta, want_dbeta, c);

    /* evaluation with other running statistics */
    float *ey = nans(nx);
    op = (mgt_op){.kind = MGT_OP_BN_FWD_EVAL};
    op.u.bn_eval.y = ey;
    op.u.bn_eval.x = x;
    op.u.bn_eval.gamma = gamma;
    op.u.bn_eval.beta = beta;
    op.u.bn_eval.running_mean = mgt_test_golden_f32(g, "eval_running_mean", c);
    op.u.bn_eval.running_var = mgt_test_golden_f32(g, "eval_running_var", c);
    op.u.bn_eval.sh = sh;
    run(&op);
    expect_close("batchnorm_forward_eval y", ey, mgt_test_golden_f32(g, "eval_y", nx), nx);

    free(y);
    free(mean);
    free(invstd);
    free(rm);
    free(rv);
    free(dx);
    free(dgamma);
    free(dbeta);
    free(want_dgamma);
    free(want_dbeta);
    free(ey);
    mgt_test_golden_free(g);
}

/* ---- pooling ---- */

static void maxpool_case(const char *file)
{
    mgt_test_golden *g = golden_load(file);
    int32_t *s = mgt_test_golden_i32(g, "shape", 10);
    mgt_pool2d_shape sh = {
        .n = s[0],
        .c = s[1],
        .h = s[2],
        .w = s[3],
        .kh = s[4],
        .kw = s[5],
        .stride_h = s[6],
        .stride_w = s[7],
        .pad_h = s[8],
        .pad_w = s[9],
    };
    size_t nx = (size_t)sh.n * sh.c * sh.h * sh.w;
    size_t ny = (size_t)sh.n * sh.c * mgt_pool2d_out_h(&sh) * mgt_pool2d_out_w(&sh);
    float *x = mgt_test_golden_f32(g, "x", nx), *y = mgt_test_golden_f32(g, "y", ny);
    char what[96];

    float *out = nans(ny);
    mgt_op op = {.kind = MGT_OP_MAXPOOL_FWD};
    op.u.maxpool_fwd.y = out;
    op.u.maxpool_fwd.x = x;
    op.u.maxpool_fwd.sh = sh;
    run(&op);
    snprintf(what, sizeof what, "%s: maxpool2d_forward", file);
    expect_close(what, out, y, ny);
    free(out);

    out = nans(nx);
    op = (mgt_op){.kind = MGT_OP_MAXPOOL_BWD};
    op.u.maxpool_bwd.dx = out;
    op.u.maxpool_bwd.dy = mgt_test_golden_f32(g, "dy", ny);
    op.u.maxpool_bwd.x = x;
    op.u.maxpool_bwd.y = y;
    op.u.maxpool_bwd.sh = sh;
    run(&op);
    snprintf(what, sizeof what, "%s: maxpool2d_backward", file);
    expect_close(what, out, mgt_test_golden_f32(g, "dx", nx), nx);
    free(out);
    mgt_test_golden_free(g);
}

/* --sync-bn against PyTorch's SyncBatchNorm arithmetic (scripts/make_syncbn_goldens.py, which
   checks it equals F.batch_norm over the concatenated batch): per shard bn_stats, the host
   merge every replica runs (mgt_bn_sync_merge), normalisation with the merged statistics
   (batchnorm_forward_eval), the shard's sums from batchnorm_backward with them, their sum in
   shard order, bn_backward_elemt with the global count. Float kernels against float64
   goldens over at most 27 values per channel and shard: 1e-5 absolute plus relative. */
static void check_syncbn(const char *name)
{
    char path[128];
    snprintf(path, sizeof path, "../syncbn/%s", name);
    mgt_test_golden *g = golden_load(path);
    mgt_test_golden_array *sz = mgt_test_golden_find(g, "sizes", 0, true);
    int R = (int)sz->count;
    const int32_t *sizes = sz->data, *shape = mgt_test_golden_i32(g, "shape", 3);
    int C = shape[0], hw = shape[1] * shape[2];
    float eps = mgt_test_golden_f32(g, "eps", 1)[0], mom = mgt_test_golden_f32(g, "momentum", 1)[0];
    size_t c = (size_t)C, per = 1 + 2 * c;
    const float *w = mgt_test_golden_f32(g, "weight", c), *b = mgt_test_golden_f32(g, "bias", c);
    double *all = malloc((size_t)R * per * sizeof *all), sum_dy[64] = {0}, sum_dyx[64] = {0};
    assert_true(all && C <= 64 && R <= 8);
    const double tol = 1e-5;
    for (int i = 0; i < R; i++) {
        char k[32];
        mgt_bn_shape sh = {.n = sizes[i], .c = C, .hw = hw, .eps = eps, .momentum = mom};
        size_t nx = (size_t)sizes[i] * c * hw;
        snprintf(k, sizeof k, "x%d", i);
        float *mean = nans(c), *var = nans(c);
        mgt_op op = {.kind = MGT_OP_BN_STATS};
        op.u.bn_stats = (mgt_bn_stats_args){mean, var, mgt_test_golden_f32(g, k, nx), sh};
        run(&op);
        snprintf(k, sizeof k, "mean%d", i);
        expect_close_tol("bn_stats mean", mean, mgt_test_golden_f32(g, k, c), c, tol, tol);
        float inv[64];
        for (size_t j = 0; j < c; j++)
            inv[j] = (float)(1.0 / sqrt((double)var[j] + eps));
        snprintf(k, sizeof k, "invstd%d", i);
        expect_close_tol("bn_stats invstd", inv, mgt_test_golden_f32(g, k, c), c, tol, tol);
        double *a = all + (size_t)i * per;
        a[0] = (double)sizes[i] * hw;
        for (size_t j = 0; j < c; j++) {
            a[1 + j] = mean[j];
            a[1 + c + j] = var[j];
        }
        free(mean);
        free(var);
    }
    float mean[64], var[64], invstd[64], *rm = dup(mgt_test_golden_f32(g, "running_mean", c), c),
                                         *rv = dup(mgt_test_golden_f32(g, "running_var", c), c);
    double count = 0, want = 0;
    mgt_bn_sync_merge(all, R, C, eps, mom, mean, var, invstd, rm, rv, &count);
    for (int i = 0; i < R; i++)
        want += (double)sizes[i] * hw;
    assert_true(count == want);
    expect_close_tol("merged mean", mean, mgt_test_golden_f32(g, "mean", c), c, tol, tol);
    expect_close_tol("merged invstd", invstd, mgt_test_golden_f32(g, "invstd", c), c, tol, tol);
    expect_close_tol("running_mean", rm, mgt_test_golden_f32(g, "running_mean_out", c), c, tol,
                     tol);
    expect_close_tol("running_var", rv, mgt_test_golden_f32(g, "running_var_out", c), c, tol, tol);
    float gw[64] = {0}, gb[64] = {0};
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < R; i++) {
            char k[32];
            mgt_bn_shape sh = {.n = sizes[i], .c = C, .hw = hw, .eps = eps, .momentum = mom};
            size_t nx = (size_t)sizes[i] * c * hw;
            snprintf(k, sizeof k, "x%d", i);
            const float *x = mgt_test_golden_f32(g, k, nx);
            snprintf(k, sizeof k, "dy%d", i);
            const float *dy = mgt_test_golden_f32(g, k, nx);
            float *out = nans(nx);
            mgt_op op = {.kind = pass == 0 ? MGT_OP_BN_FWD_EVAL : MGT_OP_BN_BWD_ELEMT};
            if (pass == 0) {
                op.u.bn_eval = (mgt_bn_eval_args){out, x, w, b, mean, var, sh, NULL, MGT_PREC_F32};
                run(&op);
                snprintf(k, sizeof k, "y%d", i);
                expect_close_tol("y", out, mgt_test_golden_f32(g, k, nx), nx, tol, tol);
                /* the shard's sums: batchnorm_backward's dbeta, dgamma from zero */
                float zg[64] = {0}, zb[64] = {0}, *dx = nans(nx);
                op = (mgt_op){.kind = MGT_OP_BN_BWD};
                op.u.bn_bwd = (mgt_bn_bwd_args){dx, zg, zb, dy, NULL, x, w, mean, invstd, sh, NULL};
                run(&op);
                snprintf(k, sizeof k, "sum_dy%d", i);
                expect_close_tol("sum_dy", zb, mgt_test_golden_f32(g, k, c), c, tol, tol);
                snprintf(k, sizeof k, "grad_weight%d", i);
                expect_close_tol("grad_weight", zg, mgt_test_golden_f32(g, k, c), c, tol, tol);
                for (size_t j = 0; j < c; j++) {
                    sum_dy[j] += zb[j];
                    sum_dyx[j] += zg[j];
                    gw[j] += zg[j];
                    gb[j] += zb[j];
                }
                free(dx);
            } else {
                float sdy[64], sdyx[64];
                for (size_t j = 0; j < c; j++) {
                    sdy[j] = (float)sum_dy[j];
                    sdyx[j] = (float)sum_dyx[j];
                }
                op.u.bn_bwd_elemt =
                    (mgt_bn_bwd_elemt_args){out, dy, x, w, mean, invstd, sdy, sdyx, sh, count};
                run(&op);
                snprintf(k, sizeof k, "dx%d", i);
                expect_close_tol("dx", out, mgt_test_golden_f32(g, k, nx), nx, tol, tol);
            }
            free(out);
        }
    expect_close_tol("grad_weight", gw, mgt_test_golden_f32(g, "grad_weight", c), c, tol, tol);
    expect_close_tol("grad_bias", gb, mgt_test_golden_f32(g, "grad_bias", c), c, tol, tol);
    free(all);
    free(rm);
    free(rv);
    mgt_test_golden_free(g);
}

static void test_syncbn_golden(void **state)
{
    (void)state;
    check_syncbn("three_unequal");
    check_syncbn("two_equal");
}

static void test_maxpool_k3s2p1(void **state)
{
    (void)state;
    maxpool_case("maxpool_k3s2p1");
}

static void test_maxpool_rect(void **state)
{
    (void)state;
    maxpool_case("maxpool_rect");
}

/* The first maximum in raster order takes the whole gradient, also where windows overlap. */
static void test_maxpool_ties(void **state)
{
    (void)state;
    float x[9] = {1, 5, 5, 5, 5, 0, -1, 5, 2};
    float dy[4] = {1, 10, 100, 1000}, dx[9], y[4];
    mgt_pool2d_shape sh = {
        .n = 1, .c = 1, .h = 3, .w = 3, .kh = 2, .kw = 2, .stride_h = 1, .stride_w = 1};
    mgt_op op = {.kind = MGT_OP_MAXPOOL_FWD};
    op.u.maxpool_fwd.y = y;
    op.u.maxpool_fwd.x = x;
    op.u.maxpool_fwd.sh = sh;
    run(&op);
    op = (mgt_op){.kind = MGT_OP_MAXPOOL_BWD};
    op.u.maxpool_bwd.dx = dx;
    op.u.maxpool_bwd.dy = dy;
    op.u.maxpool_bwd.x = x;
    op.u.maxpool_bwd.y = y;
    op.u.maxpool_bwd.sh = sh;
    run(&op);
    /* windows: (0,0) -> x[1]; (0,1) -> x[1]; (1,0) -> x[3]; (1,1) -> x[4] */
    float want[9] = {0, 11, 0, 100, 1000, 0, 0, 0, 0};
    expect_close("maxpool ties", dx, want, 9);

    /* All -inf: the first real element wins, so the gradient still lands somewhere. */
    float ninf[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, g1[1] = {3}, d4[4], y1[1];
    mgt_pool2d_shape one = {
        .n = 1, .c = 1, .h = 2, .w = 2, .kh = 2, .kw = 2, .stride_h = 2, .stride_w = 2};
    op = (mgt_op){.kind = MGT_OP_MAXPOOL_FWD};
    op.u.maxpool_fwd.y = y1;
    op.u.maxpool_fwd.x = ninf;
    op.u.maxpool_fwd.sh = one;
    run(&op);
    assert_true(isinf(y1[0]) && y1[0] < 0);
    op = (mgt_op){.kind = MGT_OP_MAXPOOL_BWD};
    op.u.maxpool_bwd.dx = d4;
    op.u.maxpool_bwd.dy = g1;
    op.u.maxpool_bwd.x = ninf;
    op.u.maxpool_bwd.y = y1;
    op.u.maxpool_bwd.sh = one;
    run(&op);
    float want4[4] = {3, 0, 0, 0};
    expect_close("maxpool all -inf", d4, want4, 4);
}

static void test_avgpool(void **state)
{
    (void)state;
    mgt_test_golden *g = golden_load("avgpool");
    int32_t *s = mgt_test_golden_i32(g, "shape", 3);
    size_t nx = (size_t)s[0] * s[1] * s[2], ny = (size_t)s[0] * s[1];
    float *y = nans(ny), *dx = nans(nx);
    mgt_op op = {.kind = MGT_OP_AVGPOOL_FWD};
    op.u.avgpool_fwd.y = y;
    op.u.avgpool_fwd.x = mgt_test_golden_f32(g, "x", nx);
    op.u.avgpool_fwd.n = s[0];
    op.u.avgpool_fwd.c = s[1];
    op.u.avgpool_fwd.hw = s[2];
    run(&op);
    expect_close("avgpool_forward", y, mgt_test_golden_f32(g, "y", ny), ny);
    op = (mgt_op){.kind = MGT_OP_AVGPOOL_BWD};
    op.u.avgpool_bwd.dx = dx;
    op.u.avgpool_bwd.dy = mgt_test_golden_f32(g, "dy", ny);
    op.u.avgpool_bwd.n = s[0];
    op.u.avgpool_bwd.c = s[1];
    op.u.avgpool_bwd.hw = s[2];
    run(&op);
    expect_close("avgpool_backward", dx, mgt_test_golden_f32(g, "dx", nx), nx);
    free(y);
    free(dx);
    mgt_test_golden_free(g);
}

/* ---- softmax cross-entropy ---- */

static void xent_case(const char *file)
{
    mgt_test_golden *g = golden_load(file);
    int32_t *s = mgt_test_golden_i32(g, "shape", 2);
    int n = s[0], classes = s[1];
    size_t nc = (size_t)n * classes;
    float smoothing = mgt_test_golden_f32(g, "smoothing", 1)[0];
    float *logits = mgt_test_golden_f32(g, "logits", nc);
    int32_t *labels = mgt_test_golden_i32(g, "labels", (size_t)n);
    char what[96];

    float loss = NAN, *probs = nans(nc);
    mgt_op op = {.kind = MGT_OP_XENT_FWD};
    op.u.xent_fwd.loss = &loss;
    op.u.xent_fwd.probs = probs;
    op.u.xent_fwd.logits = logits;
    op.u.xent_fwd.labels = labels;
    op.u.xent_fwd.n = n;
    op.u.xent_fwd.classes = classes;
    op.u.xent_fwd.smoothing = smoothing;
    run(&op);
    snprintf(what, sizeof what, "%s: softmax_xent_forward loss", file);
    expect_close(what, &loss, mgt_test_golden_f32(g, "loss", 1), 1);
    snprintf(what, sizeof what, "%s: softmax_xent_forward probs", file);
    expect_close(what, probs, mgt_test_golden_f32(g, "probs", nc), nc);

    /* The batch mean's gradient, from our own probabilities as in training. */
    float *dl = nans(nc);
    op = (mgt_op){.kind = MGT_OP_XENT_BWD};
    op.u.xent_bwd.dlogits = dl;
    op.u.xent_bwd.probs = probs;
    op.u.xent_bwd.labels = labels;
    op.u.xent_bwd.n = n;
    op.u.xent_bwd.classes = classes;
    op.u.xent_bwd.smoothing = smoothing;
    op.u.xent_bwd.scale = 1.0f / n;
    run(&op);
    snprintf(what, sizeof what, "%s: softmax_xent_backward", file);
    expect_close(what, dl, mgt_test_golden_f32(g, "dlogits", nc), nc);
    free(probs);
    free(dl);
    mgt_test_golden_free(g);
}

static void test_xent_smoothing(void **state)
{
    (void)state;
    xent_case("xent_ls");
}

static void test_xent_plain(void **state)
{
    (void)state;
    xent_case("xent_plain");
}

static void test_xent_bad_label(void **state)
{
    (void)state;
    float logits[6] = {0}, probs[6], loss, dl[6];
    int32_t labels[2] = {1, 3};
    mgt_op op = {.kind = MGT_OP_XENT_FWD};
    op.u.xent_fwd.loss = &loss;
    op.u.xent_fwd.probs = probs;
    op.u.xent_fwd.logits = logits;
    op.u.xent_fwd.labels = labels;
    op.u.xent_fwd.n = 2;
    op.u.xent_fwd.classes = 3;
    expect_ok(mgt_op_check(&op)); /* labels live on the device: only the run can see them */
    assert_int_equal(mgt_ref_run(&op), MGT_ERR_DEVICE);
    assert_string_equal(mgt_error_last(),
                        "softmax_xent_forward: label 3 out of range [0, 3) at row 1");
    labels[1] = -1;
    assert_int_equal(mgt_ref_run(&op), MGT_ERR_DEVICE);
    assert_non_null(strstr(mgt_error_last(), "label -1 out of range"));

    op = (mgt_op){.kind = MGT_OP_XENT_BWD};
    op.u.xent_bwd.dlogits = dl;
    op.u.xent_bwd.probs = probs;
    op.u.xent_bwd.labels = labels;
    op.u.xent_bwd.n = 2;
    op.u.xent_bwd.classes = 3;
    op.u.xent_bwd.scale = 1.0f;
    assert_int_equal(mgt_ref_run(&op), MGT_ERR_DEVICE);
    assert_non_null(strstr(mgt_error_last(), "softmax_xent_backward: label -1"));
}

/* ---- SGD ---- */

static void sgd_case(const char *file)
{
    mgt_test_golden *g = golden_load(file);
    int32_t *s = mgt_test_golden_i32(g, "shape", 2);
    size_t n = (size_t)s[0];
    int steps = s[1];
    float *hp = mgt_test_golden_f32(g, "lr_momentum_dampening_wd_scale_nesterov", 6);
    mgt_sgd_params p = {.lr = hp[0],
                        .momentum = hp[1],
                        .dampening = hp[2],
                        .weight_decay = hp[3],
                        .grad_scale = hp[4],
                        .nesterov = hp[5] != 0.0f,
                        .first_step = true};
    float *param = dup(mgt_test_golden_f32(g, "p0", n), n), *buf = nans(n);
    char name[16], what[96];
    for (int t = 1; t <= steps; t++) {
        mgt_op op = {.kind = MGT_OP_SGD};
        op.u.sgd.param = param;
        op.u.sgd.momentum_buf = buf;
        snprintf(name, sizeof name, "g%d", t);
        op.u.sgd.grad = mgt_test_golden_f32(g, name, n);
        op.u.sgd.n = n;
        op.u.sgd.p = p;
        run(&op);
        snprintf(name, sizeof name, "p%d", t);
        snprintf(what, sizeof what, "%s: param after step %d", file, t);
        expect_close_tol(what, param, mgt_test_golden_f32(g, name, n), n, 1e-6, 1e-5);
        snprintf(name, sizeof name, "buf%d", t);
        snprintf(what, sizeof what, "%s: momentum buffer after step %d", file, t);
        expect_close_tol(what, buf, mgt_test_golden_f32(g, name, n), n, 1e-6, 1e-5);
        p.first_step = false;
    }
    free(param);
    free(buf);
    mgt_test_golden_free(g);
}

static void test_sgd_momentum(void **state)
{
    (void)state;
    sgd_case("sgd_momentum");
}

static void test_sgd_nesterov(void **state)
{
    (void)state;
    sgd_case("sgd_nesterov");
}

static void test_sgd_dampening_scale(void **state)
{
    (void)state;
    sgd_case("sgd_dampening");
}

/* Momentum 0: plain steps, and no buffer at all. */
static void test_sgd_no_momentum(void **state)
{
    (void)state;
    float param[3] = {1, -2, 4}, grad[3] = {0.5f, 1, -1};
    mgt_op op = {.kind = MGT_OP_SGD};
    op.u.sgd.param = param;
    op.u.sgd.grad = grad;
    op.u.sgd.n = 3;
    op.u.sgd.p = (mgt_sgd_params){.lr = 0.5f, .weight_decay = 0.25f, .grad_scale = 2.0f};
    run(&op);
    /* p -= 0.5 * (2g + 0.25p) */
    float want[3] = {1 - 0.5f * (1 + 0.25f), -2 - 0.5f * (2 - 0.5f), 4 - 0.5f * (-2 + 1)};
    expect_close("sgd without momentum", param, want, 3);
}

/* ---- the small ops, by hand ---- */

static void test_elementwise(void **state)
{
    (void)state;
    float x[4] = {1, -2, 3, -4}, y[4] = {1, 1, 1, 1}, out[4];
    mgt_op op = {.kind = MGT_OP_FILL};
    op.u.fill.x = out;
    op.u.fill.value = 7.5f;
    op.u.fill.n = 4;
    run(&op);
    expect_close("fill", out, (float[]){7.5f, 7.5f, 7.5f, 7.5f}, 4);

    op = (mgt_op){.kind = MGT_OP_SCALE};
    op.u.scale.x = out;
    op.u.scale.alpha = -2.0f;
    op.u.scale.n = 3;
    run(&op);
    expect_close("scale", out, (float[]){-15, -15, -15, 7.5f}, 4);

    op = (mgt_op){.kind = MGT_OP_AXPY};
    op.u.axpy.y = y;
    op.u.axpy.alpha = 0.5f;
    op.u.axpy.x = x;
    op.u.axpy.n = 4;
    run(&op);
    expect_close("axpy", y, (float[]){1.5f, 0, 2.5f, -1}, 4);

    /* y aliasing a */
    op = (mgt_op){.kind = MGT_OP_ADD};
    op.u.add.y = y;
    op.u.add.a = y;
    op.u.add.b = x;
    op.u.add.n = 4;
    run(&op);
    expect_close("add", y, (float[]){2.5f, -2, 5.5f, -5}, 4);

    /* relu in place, then its backward with dx aliasing dy */
    float r[4] = {1, -2, 0, 3}, d[4] = {10, 20, 30, 40};
    op = (mgt_op){.kind = MGT_OP_RELU_FWD};
    op.u.relu_fwd.y = r;
    op.u.relu_fwd.x = r;
    op.u.relu_fwd.n = 4;
    run(&op);
    expect_close("relu_forward", r, (float[]){1, 0, 0, 3}, 4);
    op = (mgt_op){.kind = MGT_OP_RELU_BWD};
    op.u.relu_bwd.dx = d;
    op.u.relu_bwd.dy = d;
    op.u.relu_bwd.y = r;
    op.u.relu_bwd.n = 4;
    run(&op);
    expect_close("relu_backward", d, (float[]){10, 0, 0, 40}, 4);
}

/* 2^24 + 1 + 1 + 1 + 1 is 2^24 in float arithmetic but 2^24 + 4 in double. */
static void test_sum_double(void **state)
{
    (void)state;
    float x[5] = {16777216.0f, 1, 1, 1, 1}, out = NAN;
    mgt_op op = {.kind = MGT_OP_SUM};
    op.u.sum.out = &out;
    op.u.sum.x = x;
    op.u.sum.n = 5;
    run(&op);
    assert_true(out == 16777220.0f);
}

static void test_bias(void **state)
{
    (void)state;
    float y[6] = {0, 1, 2, 3, 4, 5}, bias[3] = {10, 20, 30}, dbias[3] = {1, 1, 1};
    mgt_op op = {.kind = MGT_OP_BIAS_FWD};
    op.u.bias_fwd.y = y;
    op.u.bias_fwd.bias = bias;
    op.u.bias_fwd.rows = 2;
    op.u.bias_fwd.cols = 3;
    run(&op);
    expect_close("bias_forward", y, (float[]){10, 21, 32, 13, 24, 35}, 6);
    op = (mgt_op){.kind = MGT_OP_BIAS_BWD};
    op.u.bias_bwd.dbias = dbias;
    op.u.bias_bwd.dy = y;
    op.u.bias_bwd.rows = 2;
    op.u.bias_bwd.cols = 3;
    run(&op);
    expect_close("bias_backward", dbias, (float[]){24, 46, 68}, 3);
}

static void test_topk_ties(void **state)
{
    (void)state;
    /* row 0: label 2 is below class 0 and ties with class 1 (lower index first): rank 2
       row 1: label 0 ties with class 3 (higher index, after it): rank 1, for class 2
       row 2: label 3 is the unique largest: rank 0
       row 3: all equal, label 3: rank 3 */
    float logits[16] = {
        6, 5, 5, 0, 4, 0, 9, 4, 0, 1, 2, 3, 7, 7, 7, 7,
    };
    int32_t labels[4] = {2, 0, 3, 3};
    int32_t want[5] = {0, 1, 2, 3, 4}; /* correct rows for k = 1..4, plus the starting 0 */
    for (int k = 1; k <= 4; k++) {
        int32_t count = 100; /* accumulates onto what is there */
        mgt_op op = {.kind = MGT_OP_TOPK};
        op.u.topk.count = &count;
        op.u.topk.logits = logits;
        op.u.topk.labels = labels;
        op.u.topk.n = 4;
        op.u.topk.classes = 4;
        op.u.topk.k = k;
        run(&op);
        if (count != 100 + want[k])
            fail_msg("topk k=%d: counted %d, want %d", k, count - 100, want[k]);
    }
}

/* ---- argument checks ---- */

static mgt_conv2d_shape good_conv(void)
{
    return (mgt_conv2d_shape){.n = 2,
                              .c = 4,
                              .h = 8,
                              .w = 8,
                              .k = 6,
                              .r = 3,
                              .s = 3,
                              .stride_h = 1,
                              .stride_w = 1,
                              .pad_h = 1,
                              .pad_w = 1,
                              .groups = 2};
}

static float dummy[4];

static void expect_conv_invalid(mgt_conv2d_shape sh, const char *text)
{
    mgt_op op = {.kind = MGT_OP_CONV2D_FWD};
    op.u.conv = (mgt_conv_args){.out = dummy, .in1 = dummy, .in2 = dummy, .sh = sh};
    mgt_error_clear();
    assert_int_equal(mgt_op_check(&op), MGT_ERR_INVALID);
    if (!strstr(mgt_error_last(), text) || strncmp(mgt_error_last(), "conv2d_forward: ", 16))
        fail_msg("error text \"%s\" lacks \"%s\"", mgt_error_last(), text);
}

static void expect_invalid(const mgt_op *op, const char *text)
{
    mgt_error_clear();
    assert_int_equal(mgt_op_check(op), MGT_ERR_INVALID);
    if (!strstr(mgt_error_last(), text) ||
        strncmp(mgt_error_last(), mgt_op_name(op->kind), strlen(mgt_op_name(op->kind))))
        fail_msg("error text \"%s\" lacks \"%s\" or the op's name", mgt_error_last(), text);
}

static void test_check_conv(void **state)
{
    (void)state;
    mgt_op op = {.kind = MGT_OP_CONV2D_FWD};
    op.u.conv = (mgt_conv_args){.out = dummy, .in1 = dummy, .in2 = dummy, .sh = good_conv()};
    expect_ok(mgt_op_check(&op));

    mgt_conv2d_shape sh = good_conv();
    sh.pad_h = 3;
    expect_conv_invalid(sh, "padding 3 >= filter height 3");
    sh = good_conv();
    sh.pad_w = -1;
    expect_conv_invalid(sh, "padding 1x-1");
    sh = good_conv();
    sh.groups = 3;
    expect_conv_invalid(sh, "groups 3 must divide channels 4 and filters 6");
    sh = good_conv();
    sh.groups = 0;
    expect_conv_invalid(sh, "groups 0");
    sh = good_conv();
    sh.stride_w = 0;
    expect_conv_invalid(sh, "stride 1x0");
    sh = good_conv();
    sh.h = 0;
    expect_conv_invalid(sh, "height h 0");
    sh = good_conv();
    sh.h = 1;
    sh.r = 5;
    sh.pad_h = 1; /* 1 + 2 - 5 < 0: no output row */
    expect_conv_invalid(sh, "output 0x8 is empty");
    /* nChw16c: whole 16-channel blocks on the side that has it, and no groups but depthwise */
    sh = good_conv();
    sh.groups = 1;
    sh.c = 16;
    sh.x_layout = MGT_LAYOUT_NCHW16C;
    op.u.conv.sh = sh;
    expect_ok(mgt_op_check(&op));
    sh.y_layout = MGT_LAYOUT_NCHW16C;
    expect_conv_invalid(sh, "y in nChw16c needs channels in multiples of 16, not 6");
    sh.k = 32;
    sh.groups = 2;
    expect_conv_invalid(sh, "a grouped convolution (groups 2 of 16 channels) takes NCHW or NHWC, "
                            "not nChw16c, unless depthwise");
    sh.groups = 16; /* depthwise: c = k = groups */
    sh.k = 16;
    op.u.conv.sh = sh;
    expect_ok(mgt_op_check(&op));
    sh.k = 32;
    sh.groups = 1;
    sh.x_layout = (mgt_layout)7;
    expect_conv_invalid(sh, "x layout 7 is none of mgt_layout's");
    op.u.conv.sh = good_conv();

    op.u.conv.in2 = NULL;
    expect_invalid(&op, "w is NULL");
    op.kind = MGT_OP_CONV2D_BWD_FILTER;
    expect_invalid(&op, "x is NULL");
}

static void test_check_other_ops(void **state)
{
    (void)state;
    mgt_op op = {.kind = MGT_OP_GEMM};
    op.u.gemm = (mgt_gemm_args){.trans_a = true,
                                .m = 4,
                                .n = 3,
                                .k = 5,
                                .a = dummy,
                                .lda = 4,
                                .b = dummy,
                                .ldb = 3,
                                .c = dummy,
                                .ldc = 3};
    expect_ok(mgt_op_check(&op));
    op.u.gemm.lda = 3; /* A is stored [k, m] = [5, 4] */
    expect_invalid(&op, "lda 3 < row length 4 of A (transposed)");
    op.u.gemm.lda = 4;
    op.u.gemm.trans_b = true; /* B is stored [n, k] = [3, 5] */
    expect_invalid(&op, "ldb 3 < row length 5 of B (transposed)");
    op.u.gemm.ldb = 5;
    op.u.gemm.ldc = 2;
    expect_invalid(&op, "ldc 2 < row length 3 of C");
    op.u.gemm.ldc = 3;
    op.u.gemm.k = 0;
    expect_invalid(&op, "k 0 must be positive");

    mgt_pool2d_shape ps = {.n = 1,
                           .c = 1,
                           .h = 8,
                           .w = 8,
                           .kh = 3,
                           .kw = 3,
                           .stride_h = 2,
                           .stride_w = 2,
                           .pad_h = 1,
                           .pad_w = 1};
    op = (mgt_op){.kind = MGT_OP_MAXPOOL_FWD};
    op.u.maxpool_fwd.y = dummy;
    op.u.maxpool_fwd.x = dummy;
    op.u.maxpool_fwd.sh = ps;
    expect_ok(mgt_op_check(&op));
    op.u.maxpool_fwd.sh.pad_w = 2;
    expect_invalid(&op, "padding 2 > half the window width 3");
    op.u.maxpool_fwd.sh = ps;
    op.u.maxpool_fwd.sh.stride_h = 0;
    expect_invalid(&op, "stride 0x2");

    op = (mgt_op){.kind = MGT_OP_BN_FWD_TRAIN};
    op.u.bn_train =
        (mgt_bn_train_args){.y = dummy,
                            .save_mean = dummy,
                            .save_invstd = dummy,
                            .running_mean = dummy,
                            .running_var = dummy,
                            .x = dummy,
                            .gamma = dummy,
                            .beta = dummy,
                            .sh = {.n = 2, .c = 3, .hw = 4, .eps = 1e-5f, .momentum = 0.1f}};
    expect_ok(mgt_op_check(&op));
    op.u.bn_train.sh.eps = 0.0f;
    expect_invalid(&op, "eps 0 must be positive");
    op.u.bn_train.sh.eps = 1e-5f;
    op.u.bn_train.sh.momentum = 1.5f;
    expect_invalid(&op, "momentum 1.5 must be in [0, 1]");
    op.u.bn_train.sh.momentum = 0.1f;
    op.u.bn_train.sh.n = 1;
    op.u.bn_train.sh.hw = 1;
    expect_invalid(&op, "more than one value per channel");
    op.u.bn_train.sh.n = 2;
    op.u.bn_train.sh.layout = MGT_LAYOUT_NCHW16C;
    expect_invalid(&op, "x in nChw16c needs channels in multiples of 16, not 3");
    op.u.bn_train.sh.c = 32;
    expect_ok(mgt_op_check(&op));
    mgt_op stats = {.kind = MGT_OP_BN_STATS};
    stats.u.bn_stats = (mgt_bn_stats_args){dummy, dummy, dummy, op.u.bn_train.sh};
    expect_invalid(&stats, "takes NCHW only, not layout 1");
    /* a folded ReLU: the synchronised halves refuse it; backward needs the forward's y */
    stats.u.bn_stats.sh.layout = MGT_LAYOUT_NCHW;
    stats.u.bn_stats.sh.relu = true;
    expect_invalid(&stats, "takes no folded ReLU (relu 1)");
    mgt_op bwd = {.kind = MGT_OP_BN_BWD};
    bwd.u.bn_bwd = (mgt_bn_bwd_args){
        dummy, dummy, dummy, dummy, NULL, dummy, dummy, dummy, dummy, stats.u.bn_stats.sh, NULL};
    expect_invalid(&bwd, "y is NULL");
    bwd.u.bn_bwd.y = dummy;
    expect_ok(mgt_op_check(&bwd));
    op.u.bn_train.sh.c = 3;
    op.u.bn_train.sh.layout = MGT_LAYOUT_NCHW;
    op.u.bn_train.running_var = NULL;
    expect_invalid(&op, "running_var is NULL");

    int32_t labels[1] = {0};
    op = (mgt_op){.kind = MGT_OP_XENT_FWD};
    op.u.xent_fwd = (mgt_xent_fwd_args){.loss = dummy,
                                        .probs = dummy,
                                        .logits = dummy,
                                        .labels = labels,
                                        .n = 1,
                                        .classes = 4,
                                        .smoothing = 1.0f};
    expect_invalid(&op, "label smoothing 1 must be in [0, 1)");
    op.u.xent_fwd.smoothing = 0.1f;
    op.u.xent_fwd.classes = 0;
    expect_invalid(&op, "classes 0 must be positive");
    op.u.xent_fwd.classes = 4;
    op.u.xent_fwd.labels_b = labels; /* mixed labels go with their weights */
    expect_invalid(&op, "labels_b without weights");

    op = (mgt_op){.kind = MGT_OP_TOPK};
    op.u.topk = (mgt_topk_args){
        .count = labels, .logits = dummy, .labels = labels, .n = 1, .classes = 4, .k = 0};
    expect_invalid(&op, "k 0 must be at least 1");

    op = (mgt_op){.kind = MGT_OP_FILL};
    op.u.fill.x = dummy;
    expect_invalid(&op, "element count 0");

    op = (mgt_op){.kind = MGT_OP_SGD};
    op.u.sgd.param = dummy;
    op.u.sgd.grad = dummy;
    op.u.sgd.n = 4;
    op.u.sgd.p = (mgt_sgd_params){.lr = 0.1f, .grad_scale = 1.0f};
    expect_ok(mgt_op_check(&op)); /* no momentum, no buffer needed */
    op.u.sgd.p.momentum = 0.9f;
    expect_invalid(&op, "momentum_buf is NULL with momentum 0.9");
    op.u.sgd.momentum_buf = dummy;
    expect_ok(mgt_op_check(&op));
    op.u.sgd.p.nesterov = true;
    op.u.sgd.p.dampening = 0.5f;
    expect_invalid(&op, "nesterov needs momentum > 0");

    op = (mgt_op){.kind = MGT_OP_COUNT};
    assert_int_equal(mgt_op_check(&op), MGT_ERR_INVALID);
}

/* ---- operands ---- */

static const mgt_operand *find_operand(const mgt_operand *o, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(o[i].name, name) == 0)
            return &o[i];
    fail_msg("no operand %s", name);
    return NULL;
}

static void test_operands(void **state)
{
    (void)state;
    mgt_operand o[MGT_OP_MAX_OPERANDS];
    float a[1], b[1], c[1], other[1];

    /* gemm, A transposed: stored [k=5, m=4] with lda 6 -> 4*6 + 4; B [k=5, n=3] with ldb 7
       -> 4*7 + 3; C [m=4, n=3] with ldc 3 -> 12 */
    mgt_op op = {.kind = MGT_OP_GEMM};
    op.u.gemm = (mgt_gemm_args){.trans_a = true,
                                .m = 4,
                                .n = 3,
                                .k = 5,
                                .a = a,
                                .lda = 6,
                                .b = b,
                                .ldb = 7,
                                .c = c,
                                .ldc = 3};
    int n = mgt_op_operands(&op, o);
    assert_int_equal(n, 3);
    assert_int_equal(find_operand(o, n, "a")->count, 28);
    assert_int_equal(find_operand(o, n, "a")->role, MGT_OPERAND_IN);
    assert_int_equal(find_operand(o, n, "b")->count, 31);
    assert_int_equal(find_operand(o, n, "c")->count, 12);
    assert_int_equal(find_operand(o, n, "c")->role, MGT_OPERAND_OUT);
    op.u.gemm.beta = 1.0f;
    n = mgt_op_operands(&op, o);
    assert_int_equal(find_operand(o, n, "c")->role, MGT_OPERAND_INOUT);
    /* the harness redirects through ptr */
    *find_operand(o, n, "a")->ptr = other;
    assert_ptr_equal(op.u.gemm.a, other);

    /* conv backward filter: dw [6, 4/2, 3, 3], dy [2, 6, 8, 8], x [2, 4, 8, 8] */
    op = (mgt_op){.kind = MGT_OP_CONV2D_BWD_FILTER};
    op.u.conv = (mgt_conv_args){.out = a, .in1 = b, .in2 = c, .sh = good_conv(), .beta = 1.0f};
    n = mgt_op_operands(&op, o);
    assert_int_equal(n, 3);
    assert_int_equal(find_operand(o, n, "dw")->count, 6 * 2 * 3 * 3);
    assert_int_equal(find_operand(o, n, "dw")->role, MGT_OPERAND_INOUT);
    assert_int_equal(find_operand(o, n, "dy")->count, 2 * 6 * 8 * 8);
    assert_int_equal(find_operand(o, n, "x")->count, 2 * 4 * 8 * 8);
    assert_ptr_equal(*find_operand(o, n, "x")->ptr, c);
    assert_true(mgt_op_flops(&op) == 2.0 * 2 * 6 * 8 * 8 * 2 * 3 * 3);

    /* batch norm backward: accumulating parameter gradients */
    op = (mgt_op){.kind = MGT_OP_BN_BWD};
    op.u.bn_bwd = (mgt_bn_bwd_args){.dx = a,
                                    .dgamma = a,
                                    .dbeta = a,
                                    .dy = a,
                                    .x = a,
                                    .gamma = a,
                                    .save_mean = a,
                                    .save_invstd = a,
                                    .sh = {.n = 2, .c = 3, .hw = 5, .eps = 1e-5f}};
    n = mgt_op_operands(&op, o);
    assert_int_equal(n, 8);
    assert_int_equal(find_operand(o, n, "dx")->role, MGT_OPERAND_OUT);
    assert_int_equal(find_operand(o, n, "dx")->count, 30);
    assert_int_equal(find_operand(o, n, "dgamma")->role, MGT_OPERAND_INOUT);
    assert_int_equal(find_operand(o, n, "dbeta")->count, 3);

    /* topk: an int32 counter that accumulates */
    int32_t cnt[1], lab[1];
    op = (mgt_op){.kind = MGT_OP_TOPK};
    op.u.topk =
        (mgt_topk_args){.count = cnt, .logits = a, .labels = lab, .n = 7, .classes = 10, .k = 5};
    n = mgt_op_operands(&op, o);
    assert_int_equal(n, 3);
    assert_int_equal(find_operand(o, n, "count")->dtype, MGT_I32);
    assert_int_equal(find_operand(o, n, "count")->role, MGT_OPERAND_INOUT);
    assert_int_equal(find_operand(o, n, "logits")->count, 70);
    assert_int_equal(find_operand(o, n, "labels")->dtype, MGT_I32);
    assert_true(mgt_op_flops(&op) == 0.0);

    /* SGD: the buffer is an operand only with momentum, and write-only on the first step */
    op = (mgt_op){.kind = MGT_OP_SGD};
    op.u.sgd = (mgt_sgd_args){.param = a, .momentum_buf = b, .grad = c, .n = 9, .p = {.lr = 0.1f}};
    n = mgt_op_operands(&op, o);
    assert_int_equal(n, 2);
    op.u.sgd.p.momentum = 0.9f;
    n = mgt_op_operands(&op, o);
    assert_int_equal(n, 3);
    assert_int_equal(find_operand(o, n, "momentum_buf")->role, MGT_OPERAND_INOUT);
    assert_int_equal(find_operand(o, n, "param")->role, MGT_OPERAND_INOUT);
    op.u.sgd.p.first_step = true;
    n = mgt_op_operands(&op, o);
    assert_int_equal(find_operand(o, n, "momentum_buf")->role, MGT_OPERAND_OUT);

    /* gemm flops */
    op = (mgt_op){.kind = MGT_OP_GEMM};
    op.u.gemm = (mgt_gemm_args){.m = 4, .n = 3, .k = 5};
    assert_true(mgt_op_flops(&op) == 120.0);
}

static void test_out_sizes(void **state)
{
    (void)state;
    mgt_conv2d_shape c = {.n = 1,
                          .c = 1,
                          .h = 224,
                          .w = 223,
                          .k = 1,
                          .r = 7,
                          .s = 7,
                          .stride_h = 2,
                          .stride_w = 2,
                          .pad_h = 3,
                          .pad_w = 3,
                          .groups = 1};
    assert_int_equal(mgt_conv2d_out_h(&c), 112);
    assert_int_equal(mgt_conv2d_out_w(&c), 112);
    mgt_pool2d_shape p = {.n = 1,
                          .c = 1,
                          .h = 112,
                          .w = 7,
                          .kh = 3,
                          .kw = 3,
                          .stride_h = 2,
                          .stride_w = 2,
                          .pad_h = 1,
                          .pad_w = 1};
    assert_int_equal(mgt_pool2d_out_h(&p), 56);
    assert_int_equal(mgt_pool2d_out_w(&p), 4);
    c.h = 2; /* 2 + 6 - 7 = 1: one step of 2 fits once, plus the first */
    assert_int_equal(mgt_conv2d_out_h(&c), 1);
    c.pad_h = 0; /* the filter does not fit */
    assert_int_equal(mgt_conv2d_out_h(&c), 0);
}

/* ---- mixed precision ---- */

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* The casts against torch's own: every code exact, the decoded values bit for bit (NaN as
   NaN). */
static void test_casts(void **state)
{
    (void)state;
    mgt_test_golden *g = golden_load("casts");
    mgt_test_golden_array *xa = mgt_test_golden_find(g, "x", 0, false);
    size_t n = xa->count;
    const float *x = xa->data;
    static const mgt_precision precs[] = {MGT_PREC_BF16, MGT_PREC_FP16};
    static const char *const code_names[] = {"bf16", "fp16"};
    static const char *const value_names[] = {"bf16_value", "fp16_value"};
    mgt_test_golden_array *ca = mgt_test_golden_find(g, "codes", 0, true);
    size_t nc = ca->count;
    for (int p = 0; p < 2; p++) {
        const int32_t *want = mgt_test_golden_i32(g, code_names[p], n);
        uint16_t *h = malloc(n * sizeof *h);
        assert_non_null(h);
        mgt_op op = {.kind = MGT_OP_CAST_TO_16, .prec = precs[p]};
        op.u.cast.dst = h;
        op.u.cast.src = x;
        op.u.cast.n = n;
        run(&op);
        for (size_t i = 0; i < n; i++)
            if (h[i] != (uint16_t)want[i])
                fail_msg("cast_to_16 %s: x[%zu] = %.9g (0x%08x) gave 0x%04x, torch 0x%04x",
                         code_names[p], i, (double)x[i], bits_of(x[i]), h[i], (unsigned)want[i]);
        free(h);

        const int32_t *codes = mgt_test_golden_i32(g, "codes", nc);
        const float *vwant = mgt_test_golden_f32(g, value_names[p], nc);
        uint16_t *hc = malloc(nc * sizeof *hc);
        float *got = nans(nc);
        assert_non_null(hc);
        for (size_t i = 0; i < nc; i++)
            hc[i] = (uint16_t)codes[i];
        mgt_op back = {.kind = MGT_OP_CAST_FROM_16, .prec = precs[p]};
        back.u.cast.dst = got;
        back.u.cast.src = hc;
        back.u.cast.n = nc;
        run(&back);
        for (size_t i = 0; i < nc; i++) {
            bool same = isnan(vwant[i]) ? isnan(got[i]) : bits_of(got[i]) == bits_of(vwant[i]);
            if (!same)
                fail_msg("cast_from_16 %s: code 0x%04x gave %.9g, torch %.9g", code_names[p], hc[i],
                         (double)got[i], (double)vwant[i]);
        }
        free(hc);
        free(got);
    }
    mgt_test_golden_free(g);
}

/* A 16-bit gemm rounds what enters the product and nothing else: 1 + 2^-10 is 1 in bf16 and
   itself in fp16; the fp32 C it adds to (beta) keeps its low bits. */
static void test_gemm_lp_rounds_inputs(void **state)
{
    (void)state;
    float a = 1.0f + 0x1p-10f, b = 3.0f, c0 = 1.0f + 0x1p-20f;
    static const struct {
        mgt_precision p;
        float want;
    } cases[] = {{MGT_PREC_BF16, 3.0f + 1.0f + 0x1p-20f},
                 {MGT_PREC_FP16, 3.0f * (1.0f + 0x1p-10f) + 1.0f + 0x1p-20f}};
    for (size_t i = 0; i < 2; i++) {
        float c = c0;
        mgt_op op = {.kind = MGT_OP_GEMM, .prec = cases[i].p};
        op.u.gemm = (mgt_gemm_args){false, false, 1,    1,  1, 1.0f,  &a,    1,
                                    &b,    1,     1.0f, &c, 1, false, false, false};
        run(&op);
        assert_true(bits_of(c) == bits_of(cases[i].want));
    }
    /* and a precision none of the three is refused */
    float c = 0;
    mgt_op bad = {.kind = MGT_OP_GEMM, .prec = (mgt_precision)7};
    bad.u.gemm = (mgt_gemm_args){false, false, 1,    1,  1, 1.0f,  &a,    1,
                                 &b,    1,     0.0f, &c, 1, false, false, false};
    assert_int_equal(mgt_op_check(&bad), MGT_ERR_INVALID);
}

/* The nonfinite count sees inf, -inf and NaN and nothing else (FLT_MAX, subnormals). */
static void test_nonfinite(void **state)
{
    (void)state;
    float x[] = {1.0f, INFINITY, 3.4028235e38f, -INFINITY, NAN, 1e-45f, -0.0f, NAN};
    int32_t count = -1;
    mgt_op op = {.kind = MGT_OP_NONFINITE};
    op.u.nonfinite.count = &count;
    op.u.nonfinite.x = x;
    op.u.nonfinite.n = sizeof x / sizeof x[0];
    run(&op);
    assert_int_equal(count, 4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_conv_stride2_pad1),
        cmocka_unit_test(test_conv_rect_groups),
        cmocka_unit_test(test_conv_depthwise),
        cmocka_unit_test(test_conv_1x1_stride2),
        cmocka_unit_test(test_batchnorm),
        cmocka_unit_test(test_syncbn_golden),
        cmocka_unit_test(test_maxpool_k3s2p1),
        cmocka_unit_test(test_maxpool_rect),
        cmocka_unit_test(test_maxpool_ties),
        cmocka_unit_test(test_avgpool),
        cmocka_unit_test(test_xent_smoothing),
        cmocka_unit_test(test_xent_plain),
        cmocka_unit_test(test_xent_bad_label),
        cmocka_unit_test(test_sgd_momentum),
        cmocka_unit_test(test_sgd_nesterov),
        cmocka_unit_test(test_sgd_dampening_scale),
        cmocka_unit_test(test_sgd_no_momentum),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_sum_double),
        cmocka_unit_test(test_bias),
        cmocka_unit_test(test_topk_ties),
        cmocka_unit_test(test_check_conv),
        cmocka_unit_test(test_check_other_ops),
        cmocka_unit_test(test_operands),
        cmocka_unit_test(test_out_sizes),
        cmocka_unit_test(test_casts),
        cmocka_unit_test(test_gemm_lp_rounds_inputs),
        cmocka_unit_test(test_nonfinite),
    };
    return cmocka_run_group_tests_name("ref", tests, NULL, NULL);
}
