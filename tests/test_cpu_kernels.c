/* Tests of the CPU fast path (pool and kernels) against the plain reference. */

/* Every op runs on odd shapes with 1 and 3 threads, with guard regions around every operand,
   garbage in outputs that must be overwritten, and a bit-for-bit check of two runs; the
   convolutions on both paths (oneDNN and im2col + gemm). */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "device/cpu/kernels.h"
#include "device/lowp.h"

/* Floats before and after every operand copy; a kernel that writes there is caught. */
#define GUARD 16
static const uint32_t GUARD_BITS = 0x7fc0dead;   /* a NaN no kernel produces */
static const uint32_t GARBAGE_BITS = 0x7fc00bad; /* what OUT operands start as: must vanish */

static const int THREADS[] = {1, 3, 1, 3};
static const bool IM2COL[] = {false, false, true, true};
#define NCTX 4
static cpu_ctx ctxs[NCTX];

/* ---- random numbers (xorshift64*, fixed seed: failures reproduce) ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

static int rng_int(int lo, int hi) /* inclusive */
{
    return lo + (int)(rng_next() % (uint64_t)(hi - lo + 1));
}

static float rng_float(void) /* [-1, 1) */
{
    return (float)((double)(rng_next() >> 40) / (double)(1ull << 23) - 1.0);
}

static float *rand_floats(size_t n)
{
    float *p = malloc(n * sizeof *p);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = rng_float();
    return p;
}

/* Values on a coarse grid, so that pooling windows and logits have ties. */
static float *rand_ties(size_t n)
{
    float *p = malloc(n * sizeof *p);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = (float)rng_int(-4, 4) * 0.25f;
    return p;
}

static int32_t *rand_labels(int n, int classes)
{
    int32_t *p = malloc((size_t)n * sizeof *p);
    assert_non_null(p);
    for (int i = 0; i < n; i++)
        p[i] = rng_int(0, classes - 1);
    return p;
}

/* ---- the harness ---- */

typedef struct copy_set {
    int n;
    mgt_operand ops[MGT_OP_MAX_OPERANDS];
    uint32_t *mem[MGT_OP_MAX_OPERANDS]; /* GUARD + count + GUARD words */
} copy_set;

/* Points a copy of `proto` at fresh guarded copies of its operands. IN and INOUT operands
   start as the caller's buffers; OUT operands start as NaN garbage. */
static void copies_make(const mgt_op *proto, mgt_op *op, copy_set *cs)
{
    *op = *proto;
    cs->n = mgt_op_operands(op, cs->ops);
    for (int i = 0; i < cs->n; i++) {
        mgt_operand *o = &cs->ops[i];
        uint32_t *m = malloc((o->count + 2 * GUARD) * sizeof *m);
        assert_non_null(m);
        for (size_t j = 0; j < GUARD; j++)
            m[j] = m[GUARD + o->count + j] = GUARD_BITS;
        if (o->role == MGT_OPERAND_OUT)
            for (size_t j = 0; j < o->count; j++)
                m[GUARD + j] = GARBAGE_BITS;
        else
            memcpy(m + GUARD, *o->ptr, o->count * sizeof *m);
        cs->mem[i] = m;
        *o->ptr = m + GUARD;
    }
}

static void copies_free(copy_set *cs)
{
    for (int i = 0; i < cs->n; i++)
        free(cs->mem[i]);
}

static void check_guards(const copy_set *cs, const char *what)
{
    for (int i = 0; i < cs->n; i++) {
        const uint32_t *m = cs->mem[i];
        size_t count = cs->ops[i].count;
        for (size_t j = 0; j < GUARD; j++)
            if (m[j] != GUARD_BITS || m[GUARD + count + j] != GUARD_BITS)
                fail_msg("%s: operand %s written outside its %zu elements", what, cs->ops[i].name,
                         count);
    }
}

/* Outputs agree when |fast - ref| <= rtol * max|ref| elementwise (rtol 0: bit-identical);
   NaN must meet NaN. Inputs must be untouched. */
static void compare(const copy_set *ref, const copy_set *fast, const mgt_op *proto, double rtol,
                    const char *what)
{
    mgt_op tmp = *proto; /* its operand list points at the caller's untouched buffers */
    copy_set orig;
    orig.n = mgt_op_operands(&tmp, orig.ops);
    for (int i = 0; i < ref->n; i++) {
        const mgt_operand *o = &fast->ops[i];
        const void *f = fast->mem[i] + GUARD, *r = ref->mem[i] + GUARD;
        if (o->role == MGT_OPERAND_IN) {
            if (memcmp(f, *orig.ops[i].ptr, o->count * 4) != 0)
                fail_msg("%s: input %s was modified", what, o->name);
            continue;
        }
        if (o->dtype == MGT_I32) {
            for (size_t j = 0; j < o->count; j++)
                if (((const int32_t *)f)[j] != ((const int32_t *)r)[j])
                    fail_msg("%s: %s[%zu] = %d, reference %d", what, o->name, j,
                             ((const int32_t *)f)[j], ((const int32_t *)r)[j]);
            continue;
        }
        const float *ff = f, *rr = r;
        double scale = 0;
        for (size_t j = 0; j < o->count; j++)
            if (isfinite(rr[j]) && fabs(rr[j]) > scale)
                scale = fabs(rr[j]);
        double tol = rtol * (scale > 1e-30 ? scale : 1e-30);
        for (size_t j = 0; j < o->count; j++) {
            uint32_t fb, rb;
            memcpy(&fb, &ff[j], 4);
            memcpy(&rb, &rr[j], 4);
            /* the reference leaves garbage only between the rows of a strided matrix */
            if (fb == GARBAGE_BITS && rb != GARBAGE_BITS)
                fail_msg("%s: %s[%zu] was never written", what, o->name, j);
            if (rb == GARBAGE_BITS && fb != GARBAGE_BITS)
                fail_msg("%s: %s[%zu] outside the matrix was written", what, o->name, j);
            if (isnan(rr[j]) || isnan(ff[j])) {
                if (!(isnan(rr[j]) && isnan(ff[j])))
                    fail_msg("%s: %s[%zu] = %g, reference %g", what, o->name, j, (double)ff[j],
                             (double)rr[j]);
                continue;
            }
            bool ok = rtol == 0 ? fb == rb : fabs((double)ff[j] - rr[j]) <= tol;
            if (!ok)
                fail_msg("%s: %s[%zu] = %.9g, reference %.9g (|diff| %.3g > tol %.3g)", what,
                         o->name, j, (double)ff[j], (double)rr[j], fabs((double)ff[j] - rr[j]),
                         tol);
        }
    }
}

static void same_bits(const copy_set *a, const copy_set *b, const char *what)
{
    for (int i = 0; i < a->n; i++)
        if (a->ops[i].role != MGT_OPERAND_IN &&
            memcmp(a->mem[i], b->mem[i], (a->ops[i].count + 2 * GUARD) * 4) != 0)
            fail_msg("%s: two runs on the same inputs differ in %s", what, a->ops[i].name);
}

/* Runs `proto` (pointing at the caller's initialised buffers) through the reference and
   through the fast path on every ctx, twice each, and compares. */
static void check_op(const mgt_op *proto, double rtol, const char *label)
{
    char what[256];
    if (mgt_op_check(proto) != MGT_OK)
        fail_msg("%s: test builds an invalid op: %s", label, mgt_error_last());
    mgt_op rop;
    copy_set ref;
    copies_make(proto, &rop, &ref);
    assert_int_equal(mgt_ref_run(&rop), MGT_OK);
    for (int c = 0; c < NCTX; c++) {
        snprintf(what, sizeof what, "%s [%s, %d threads%s]", label, mgt_op_name(proto->kind),
                 THREADS[c], IM2COL[c] ? ", im2col" : "");
        mgt_op f1, f2;
        copy_set a, b;
        copies_make(proto, &f1, &a);
        copies_make(proto, &f2, &b);
        mgt_status st = cpu_run(&ctxs[c], &f1);
        if (st != MGT_OK)
            fail_msg("%s: %s", what, mgt_error_last());
        assert_int_equal(cpu_run(&ctxs[c], &f2), MGT_OK);
        check_guards(&a, what);
        compare(&ref, &a, proto, rtol, what);
        same_bits(&a, &b, what);
        copies_free(&a);
        copies_free(&b);
    }
    copies_free(&ref);
}

/* ---- the pool ---- */

typedef struct pool_probe {
    atomic_int *hits;
    atomic_int bad_thread;
    int threads;
} pool_probe;

static void probe_fn(void *c, int i, int t)
{
    pool_probe *p = c;
    atomic_fetch_add(&p->hits[i], 1);
    if (t < 0 || t >= p->threads)
        atomic_store(&p->bad_thread, 1);
}

static void test_pool(void **state)
{
    (void)state;
    const int sizes[] = {0, 1, 2, 3, 7, 64, 1000};
    const int threads[] = {1, 2, 3, 8};
    for (size_t ti = 0; ti < sizeof threads / sizeof *threads; ti++) {
        cpu_pool *pool;
        assert_int_equal(cpu_pool_create(threads[ti], &pool), MGT_OK);
        assert_int_equal(cpu_pool_threads(pool), threads[ti]);
        atomic_int hits[1000];
        pool_probe p = {hits, 0, threads[ti]};
        /* Many short jobs back to back: the hand-over between generations is where a pool
           loses or repeats items. */
        for (int rep = 0; rep < 300; rep++) {
            for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
                int n = sizes[si];
                for (int i = 0; i < n; i++)
                    atomic_init(&hits[i], 0);
                cpu_pool_for(pool, n, probe_fn, &p);
                for (int i = 0; i < n; i++)
                    if (atomic_load(&hits[i]) != 1)
                        fail_msg("%d threads, n %d: item %d ran %d times", threads[ti], n, i,
                                 atomic_load(&hits[i]));
            }
        }
        assert_int_equal(atomic_load(&p.bad_thread), 0);
        cpu_pool_free(pool);
    }
    cpu_pool_free(NULL);
    cpu_pool *pool = NULL;
    assert_int_equal(cpu_pool_create(0, &pool), MGT_ERR_INVALID);
    assert_null(pool);
}

/* ---- elementwise ---- */

static void test_elementwise(void **state)
{
    (void)state;
    const size_t sizes[] = {1, 17, 16384, 16385, 100003};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        size_t n = sizes[si];
        float *x = rand_floats(n), *y = rand_floats(n), *z = rand_floats(n);
        x[0] = NAN; /* relu keeps NaN; the others carry it through */
        if (n > 2)
            x[1] = -0.0f;
        mgt_op op = {.kind = MGT_OP_FILL, .u.fill = {x, 0.375f, n}};
        check_op(&op, 0, "fill");
        op = (mgt_op){.kind = MGT_OP_SCALE, .u.scale = {x, -1.5f, n}};
        check_op(&op, 0, "scale");
        op = (mgt_op){.kind = MGT_OP_AXPY, .u.axpy = {y, 0.7f, x, n}};
        check_op(&op, 0, "axpy");
        op = (mgt_op){.kind = MGT_OP_ADD, .u.add = {z, x, y, n}};
        check_op(&op, 0, "add");
        op = (mgt_op){.kind = MGT_OP_SUM, .u.sum = {z, y, n}};
        check_op(&op, 1e-6, "sum");
        op = (mgt_op){.kind = MGT_OP_RELU_FWD, .u.relu_fwd = {z, x, n}};
        check_op(&op, 0, "relu_fwd");
        op = (mgt_op){.kind = MGT_OP_RELU_BWD, .u.relu_bwd = {z, y, x, n}};
        check_op(&op, 0, "relu_bwd");
        free(x);
        free(y);
        free(z);
    }
}

/* y may alias an input of add and relu: the same answer as the reference in place. */
static void test_aliasing(void **state)
{
    (void)state;
    size_t n = 40000;
    float *a = rand_floats(n), *b = rand_floats(n), *a2 = malloc(n * 4), *b2 = malloc(n * 4);
    assert_non_null(a2);
    assert_non_null(b2);
    for (int c = 0; c < NCTX; c++) {
        memcpy(a2, a, n * 4);
        mgt_op op = {.kind = MGT_OP_ADD, .u.add = {a2, a2, b, n}};
        assert_int_equal(cpu_run(&ctxs[c], &op), MGT_OK);
        for (size_t i = 0; i < n; i++)
            assert_true(a2[i] == a[i] + b[i]);
        memcpy(a2, a, n * 4);
        op = (mgt_op){.kind = MGT_OP_RELU_FWD, .u.relu_fwd = {a2, a2, n}};
        assert_int_equal(cpu_run(&ctxs[c], &op), MGT_OK);
        for (size_t i = 0; i < n; i++)
            assert_true(a2[i] == (a[i] > 0 ? a[i] : 0.0f));
        memcpy(b2, b, n * 4);
        op = (mgt_op){.kind = MGT_OP_RELU_BWD, .u.relu_bwd = {b2, b2, a, n}};
        assert_int_equal(cpu_run(&ctxs[c], &op), MGT_OK);
        for (size_t i = 0; i < n; i++)
            assert_true(b2[i] == (a[i] > 0 ? b[i] : 0.0f));
    }
    free(a);
    free(b);
    free(a2);
    free(b2);
}

static void test_sgd(void **state)
{
    (void)state;
    const size_t sizes[] = {5, 40001};
    mgt_sgd_params variants[] = {
        {.lr = 0.1f, .grad_scale = 1.0f},
        {.lr = 0.1f,
         .momentum = 0.9f,
         .weight_decay = 1e-4f,
         .grad_scale = 0.5f,
         .first_step = true},
        {.lr = 0.05f,
         .momentum = 0.9f,
         .dampening = 0.1f,
         .weight_decay = 5e-4f,
         .grad_scale = 0.25f},
        {.lr = 0.05f,
         .momentum = 0.9f,
         .weight_decay = 5e-4f,
         .grad_scale = 1.0f,
         .nesterov = true},
    };
    for (size_t si = 0; si < 2; si++)
        for (size_t v = 0; v < sizeof variants / sizeof *variants; v++) {
            size_t n = sizes[si];
            float *p = rand_floats(n), *buf = rand_floats(n), *g = rand_floats(n);
            mgt_op op = {.kind = MGT_OP_SGD, .u.sgd = {p, buf, g, n, variants[v]}};
            check_op(&op, 0, "sgd");
            free(p);
            free(buf);
            free(g);
        }
}

/* ---- gemm ---- */

static void gemm_case(int m, int n, int k, bool ta, bool tb, int pad, float alpha, float beta)
{
    int lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
    size_t na = (size_t)(ta ? k : m) * lda, nb = (size_t)(tb ? n : k) * ldb;
    size_t nc = (size_t)m * ldc;
    float *a = rand_floats(na), *b = rand_floats(nb), *c = rand_floats(nc);
    mgt_op op = {.kind = MGT_OP_GEMM,
                 .u.gemm = {ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc}};
    char label[128];
    snprintf(label, sizeof label, "gemm %dx%dx%d ta %d tb %d pad %d beta %g", m, n, k, ta, tb, pad,
             (double)beta);
    check_op(&op, 1e-5, label);
    free(a);
    free(b);
    free(c);
}

static void test_gemm(void **state)
{
    (void)state;
    for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t & 2;
        gemm_case(1, 1, 1, ta, tb, 0, 1.0f, 0.0f);
        gemm_case(7, 5, 3, ta, tb, 2, -0.5f, 0.5f);
        gemm_case(150, 130, 70, ta, tb, 3, 1.0f, 0.0f); /* split by rows */
        gemm_case(5, 3000, 100, ta, tb, 1, 2.0f, 1.0f); /* split by columns */
    }
    for (int i = 0; i < 6; i++)
        gemm_case(rng_int(1, 90), rng_int(1, 90), rng_int(1, 200), rng_int(0, 1), rng_int(0, 1),
                  rng_int(0, 3), 1.0f, i % 2 ? 1.0f : 0.0f);
}

/* ---- convolution ---- */

static void conv_case(const mgt_conv2d_shape *sh, const char *why)
{
    size_t nx = (size_t)sh->n * sh->c * sh->h * sh->w;
    size_t ny = (size_t)sh->n * sh->k * mgt_conv2d_out_h(sh) * mgt_conv2d_out_w(sh);
    size_t nw = (size_t)sh->k * (sh->c / sh->groups) * sh->r * sh->s;
    float *x = rand_floats(nx), *y = rand_floats(ny), *w = rand_floats(nw);
    float *dx = rand_floats(nx), *dw = rand_floats(nw);
    const float betas[] = {0.0f, 1.0f, 0.5f};
    for (int bi = 0; bi < 3; bi++) {
        char label[256];
        snprintf(label, sizeof label,
                 "%s: n %d c %d %dx%d k %d %dx%d stride %dx%d pad %dx%d groups %d beta %g", why,
                 sh->n, sh->c, sh->h, sh->w, sh->k, sh->r, sh->s, sh->stride_h, sh->stride_w,
                 sh->pad_h, sh->pad_w, sh->groups, (double)betas[bi]);
        mgt_op op = {.kind = MGT_OP_CONV2D_FWD, .u.conv = {y, x, w, *sh, betas[bi]}};
        check_op(&op, 1e-4, label);
        op = (mgt_op){.kind = MGT_OP_CONV2D_BWD_DATA, .u.conv = {dx, y, w, *sh, betas[bi]}};
        check_op(&op, 1e-4, label);
        op = (mgt_op){.kind = MGT_OP_CONV2D_BWD_FILTER, .u.conv = {dw, y, x, *sh, betas[bi]}};
        check_op(&op, 1e-4, label);
    }
    free(x);
    free(y);
    free(w);
    free(dx);
    free(dw);
}

#define SHAPE_L(n_, c_, h_, w_, k_, r_, s_, sth, stw, ph, pw, g_, xl, yl) \
    (mgt_conv2d_shape) { n_, c_, h_, w_, k_, r_, s_, sth, stw, ph, pw, g_, xl, yl }
#define SHAPE(n_, c_, h_, w_, k_, r_, s_, sth, stw, ph, pw, g_) \
    SHAPE_L(n_, c_, h_, w_, k_, r_, s_, sth, stw, ph, pw, g_, MGT_LAYOUT_NCHW, MGT_LAYOUT_NCHW)
#define BLK MGT_LAYOUT_NCHW16C
#define PLAIN MGT_LAYOUT_NCHW

static void test_conv(void **state)
{
    (void)state;
    const struct {
        mgt_conv2d_shape sh;
        const char *why;
    } cases[] = {
        {SHAPE(2, 3, 7, 5, 4, 3, 3, 1, 1, 1, 1, 1), "3x3 non-square image"},
        {SHAPE(1, 5, 9, 11, 6, 3, 2, 2, 2, 1, 0, 1), "3x2 filter, stride 2, batch 1"},
        {SHAPE(3, 6, 8, 8, 9, 1, 1, 1, 1, 0, 0, 3), "1x1 direct, groups 3"},
        {SHAPE(2, 12, 13, 13, 10, 1, 1, 2, 2, 0, 0, 1), "1x1 stride 2 (im2col)"},
        {SHAPE(2, 8, 10, 10, 8, 3, 3, 1, 1, 1, 1, 8), "depthwise"},
        {SHAPE(2, 5, 9, 8, 5, 3, 3, 2, 2, 1, 1, 5), "depthwise stride 2"},
        {SHAPE(1, 4, 6, 6, 8, 3, 3, 2, 2, 1, 1, 2), "groups 2 stride 2"},
        {SHAPE(2, 6, 7, 9, 4, 3, 1, 1, 2, 1, 0, 2), "3x1 filter, stride 1x2, groups 2"},
        {SHAPE(2, 4, 5, 5, 12, 3, 3, 1, 1, 1, 1, 4), "grouped with 3 filters per channel"},
        {SHAPE(1, 16, 28, 28, 16, 3, 3, 1, 1, 1, 1, 1), "batch 1: tiles and channel chunks"},
        {SHAPE(4, 16, 20, 20, 16, 3, 3, 1, 1, 1, 1, 1), "filter gradient in partitions"},
        {SHAPE(22, 16, 14, 14, 32, 3, 3, 1, 1, 1, 1, 1), "chunks of images, a short last one"},
        {SHAPE(9, 32, 8, 8, 64, 1, 1, 2, 2, 0, 0, 1), "1x1 stride 2 projection"},
        {SHAPE(5, 1, 28, 28, 16, 3, 3, 1, 1, 1, 1, 1), "one input channel"},
        {SHAPE(3, 16, 9, 9, 16, 3, 3, 2, 2, 1, 1, 1), "stride 2 with a short right pad"},
        {SHAPE(1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1), "1x1x1x1"},
        {SHAPE(3, 3, 17, 15, 7, 5, 5, 1, 1, 2, 2, 1), "5x5 pad 2, odd sizes"},
        {SHAPE(2, 3, 23, 23, 8, 7, 7, 2, 2, 3, 3, 1), "7x7 stride 2 stem"},
        {SHAPE(1, 24, 9, 9, 40, 1, 1, 1, 1, 0, 0, 1), "1x1 direct batch 1"},
        {SHAPE_L(22, 16, 14, 14, 32, 3, 3, 1, 1, 1, 1, 1, BLK, BLK), "nChw16c in and out, chunks"},
        {SHAPE_L(5, 1, 28, 28, 16, 3, 3, 1, 1, 1, 1, 1, PLAIN, BLK), "stem: NCHW in, nChw16c out"},
        {SHAPE_L(9, 32, 8, 8, 64, 1, 1, 2, 2, 0, 0, 1, BLK, PLAIN), "nChw16c in, NCHW out"},
        {SHAPE_L(3, 16, 9, 9, 16, 3, 3, 2, 2, 1, 1, 1, BLK, BLK), "nChw16c stride 2"},
        {SHAPE_L(2, 32, 7, 7, 16, 1, 1, 1, 1, 0, 0, 1, BLK, BLK), "nChw16c 1x1, 7x7"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        conv_case(&cases[i].sh, cases[i].why);
    /* random shapes; invalid draws are skipped */
    for (int done = 0; done < 12;) {
        int groups = rng_int(1, 3);
        int r = rng_int(1, 4), s = rng_int(1, 4);
        mgt_conv2d_shape sh = SHAPE(rng_int(1, 3), groups * rng_int(1, 5), rng_int(1, 12),
                                    rng_int(1, 12), groups * rng_int(1, 5), r, s, rng_int(1, 3),
                                    rng_int(1, 3), rng_int(0, r - 1), rng_int(0, s - 1), groups);
        mgt_op op = {.kind = MGT_OP_CONV2D_FWD,
                     .u.conv = {(float *)1, (float *)1, (float *)1, sh, 0}};
        if (mgt_op_check(&op) != MGT_OK)
            continue;
        conv_case(&sh, "random");
        done++;
    }
}

/* The filter gradient's partials must be reduced in a fixed order: many runs on 3 threads,
   every one bit-identical to the first, on both paths. */
static void test_conv_filter_determinism(void **state)
{
    (void)state;
    mgt_conv2d_shape sh = SHAPE(6, 16, 14, 14, 32, 3, 3, 1, 1, 1, 1, 1);
    size_t nx = (size_t)sh.n * sh.c * sh.h * sh.w, ny = (size_t)sh.n * sh.k * sh.h * sh.w;
    size_t nw = (size_t)sh.k * sh.c * 9;
    float *x = rand_floats(nx), *dy = rand_floats(ny), *first = malloc(nw * 4),
          *dw = malloc(nw * 4);
    assert_non_null(first);
    assert_non_null(dw);
    mgt_op op = {.kind = MGT_OP_CONV2D_BWD_FILTER, .u.conv = {dw, dy, x, sh, 0.0f}};
    for (int c = 1; c < NCTX; c += 2) {
        for (int rep = 0; rep < 20; rep++) {
            assert_int_equal(cpu_run(&ctxs[c], &op), MGT_OK);
            if (rep == 0)
                memcpy(first, dw, nw * 4);
            else
                assert_memory_equal(first, dw, nw * 4);
        }
    }
    free(x);
    free(dy);
    free(first);
    free(dw);
}

/* ---- batch norm ---- */

static void test_batchnorm(void **state)
{
    (void)state;
    /* the last of each layout: a mean 1000 times the spread, for the one-pass variance */
    const mgt_bn_shape shapes[] = {
        {3, 5, 7, 1e-5f, 0.1f, PLAIN, false},   {1, 3, 1000, 1e-5f, 0.1f, PLAIN, false},
        {8, 17, 49, 1e-3f, 0.2f, PLAIN, false}, {2, 1, 1, 1e-5f, 0.1f, PLAIN, false},
        {16, 64, 1, 1e-5f, 0.1f, PLAIN, false}, {4, 3, 2000, 1e-5f, 1.0f, PLAIN, false},
        {6, 4, 300, 1e-5f, 0.1f, PLAIN, false}, {3, 16, 7, 1e-5f, 0.1f, BLK, false},
        {1, 16, 1000, 1e-5f, 0.1f, BLK, false}, {9, 32, 49, 1e-3f, 0.2f, BLK, false},
        {16, 64, 1, 1e-5f, 0.1f, BLK, false},   {13, 48, 130, 1e-5f, 1.0f, BLK, false},
        {6, 16, 300, 1e-5f, 0.1f, BLK, false},
    };
    /* each shape twice: plain, and with a ReLU folded in (forward max(bn, 0), backward dy
       masked by a forward output ym, zero where the ReLU cut) */
    for (size_t i = 0; i < 2 * (sizeof shapes / sizeof *shapes); i++) {
        mgt_bn_shape sh = shapes[i / 2];
        sh.relu = i % 2 == 1;
        float offset = i / 2 == 6 || i / 2 + 1 == sizeof shapes / sizeof *shapes ? 1000.0f : 3.0f;
        size_t nx = (size_t)sh.n * sh.c * sh.hw, c = (size_t)sh.c;
        float *x = rand_floats(nx), *y = rand_floats(nx), *dy = rand_floats(nx);
        float *ym = rand_floats(nx);
        for (size_t j = 0; j < nx; j++)
            ym[j] = ym[j] > 0.0f ? ym[j] : 0.0f;
        float *gamma = rand_floats(c), *beta = rand_floats(c), *rm = rand_floats(c);
        float *rv = rand_floats(c), *mean = rand_floats(c), *invstd = rand_floats(c);
        float *dg = rand_floats(c), *db = rand_floats(c);
        for (size_t j = 0; j < nx; j++)
            x[j] = offset + 2.0f * x[j]; /* a mean far from 0 */
        for (size_t j = 0; j < c; j++) {
            rv[j] = 0.5f + fabsf(rv[j]);
            invstd[j] = 0.5f + fabsf(invstd[j]);
            mean[j] = offset + mean[j];
        }
        char label[96];
        snprintf(label, sizeof label, "bn n %d c %d hw %d%s%s", sh.n, sh.c, sh.hw,
                 sh.layout == BLK ? " nChw16c" : "", sh.relu ? " relu" : "");
        mgt_op op = {.kind = MGT_OP_BN_FWD_TRAIN,
                     .u.bn_train = {y, mean, invstd, rm, rv, x, gamma, beta, sh}};
        /* the ReLU clips the negative half, whose extremes set the tolerance's scale */
        if (sh.n * sh.hw > 1)
            check_op(&op, sh.relu ? 2e-5 : 1e-5, label);
        op = (mgt_op){.kind = MGT_OP_BN_FWD_EVAL, .u.bn_eval = {y, x, gamma, beta, rm, rv, sh}};
        check_op(&op, 1e-5, label);
        op = (mgt_op){.kind = MGT_OP_BN_BWD,
                      .u.bn_bwd = {y, dg, db, dy, ym, x, gamma, mean, invstd, sh}};
        check_op(&op, 1e-5, label);
        float *bufs[] = {x, y, dy, ym, gamma, beta, rm, rv, mean, invstd, dg, db};
        for (size_t j = 0; j < sizeof bufs / sizeof *bufs; j++)
            free(bufs[j]);
    }
}

/* ---- pooling and bias ---- */

static void test_pooling(void **state)
{
    (void)state;
    const mgt_pool2d_shape shapes[] = {
        {2, 3, 8, 8, 2, 2, 2, 2, 0, 0, false, PLAIN},
        {1, 4, 9, 7, 3, 3, 2, 2, 1, 1, false, PLAIN},
        {3, 2, 11, 13, 3, 2, 1, 2, 1, 1, false, PLAIN},
        {2, 64, 16, 16, 3, 3, 2, 2, 1, 1, false, PLAIN},
        {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, false, PLAIN},
        {2, 3, 14, 14, 3, 3, 2, 2, 0, 0, true, PLAIN},
        {2, 64, 16, 16, 3, 3, 2, 2, 1, 1, false, BLK}, /* resnet's stem pool in nChw16c */
        {3, 16, 14, 14, 3, 3, 2, 2, 0, 0, true, BLK},
        {1, 32, 9, 7, 3, 2, 1, 2, 1, 1, false, BLK},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        mgt_pool2d_shape sh = shapes[i];
        size_t nx = (size_t)sh.n * sh.c * sh.h * sh.w;
        size_t ny = (size_t)sh.n * sh.c * mgt_pool2d_out_h(&sh) * mgt_pool2d_out_w(&sh);
        float *x = rand_ties(nx), *y = rand_floats(ny), *dy = rand_floats(ny);
        float *dx = rand_floats(nx);
        mgt_op op = {.kind = MGT_OP_MAXPOOL_FWD, .u.maxpool_fwd = {y, x, sh}};
        check_op(&op, 0, "maxpool");
        assert_int_equal(mgt_ref_run(&op), MGT_OK); /* y as the forward gives it */
        op = (mgt_op){.kind = MGT_OP_MAXPOOL_BWD, .u.maxpool_bwd = {dx, dy, x, y, sh}};
        check_op(&op, 0, "maxpool");
        free(x);
        free(y);
        free(dy);
        free(dx);
    }
    const int avg[][3] = {{2, 3, 49}, {1, 1, 1}, {5, 300, 7}, {1, 7, 40000}};
    for (size_t i = 0; i < 4; i++) {
        int n = avg[i][0], c = avg[i][1], hw = avg[i][2];
        float *x = rand_floats((size_t)n * c * hw), *y = rand_floats((size_t)n * c);
        mgt_op op = {.kind = MGT_OP_AVGPOOL_FWD, .u.avgpool_fwd = {y, x, n, c, hw}};
        check_op(&op, 1e-6, "avgpool");
        op = (mgt_op){.kind = MGT_OP_AVGPOOL_BWD, .u.avgpool_bwd = {x, y, n, c, hw}};
        check_op(&op, 0, "avgpool");
        free(x);
        free(y);
    }
    const int bias[][2] = {{1, 1}, {37, 10}, {5, 300}, {300, 513}, {2000, 20}};
    for (size_t i = 0; i < 5; i++) {
        int rows = bias[i][0], cols = bias[i][1];
        float *y = rand_floats((size_t)rows * cols), *b = rand_floats((size_t)cols);
        mgt_op op = {.kind = MGT_OP_BIAS_FWD, .u.bias_fwd = {y, b, rows, cols}};
        check_op(&op, 0, "bias");
        op = (mgt_op){.kind = MGT_OP_BIAS_BWD, .u.bias_bwd = {b, y, rows, cols}};
        check_op(&op, 1e-6, "bias");
        free(y);
        free(b);
    }
}

/* ---- loss and accuracy ---- */

static void test_xent_topk(void **state)
{
    (void)state;
    const int shapes[][2] = {{1, 1}, {1, 10}, {37, 10}, {256, 1000}, {3000, 7}};
    const float eps[] = {0.0f, 0.1f};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        int n = shapes[i][0], classes = shapes[i][1];
        size_t nc = (size_t)n * classes;
        float *logits = rand_floats(nc), *probs = rand_floats(nc), *d = rand_floats(nc);
        float loss;
        for (size_t j = 0; j < nc; j++)
            logits[j] *= 20.0f; /* large enough that a naive exp would lose precision */
        int32_t *labels = rand_labels(n, classes);
        for (int e = 0; e < 2; e++) {
            mgt_op op = {
                .kind = MGT_OP_XENT_FWD,
                .u.xent_fwd = {&loss, probs, logits, labels, NULL, NULL, n, classes, eps[e]}};
            check_op(&op, 1e-5, "xent");
            assert_int_equal(mgt_ref_run(&op), MGT_OK); /* real probabilities for backward */
            op = (mgt_op){
                .kind = MGT_OP_XENT_BWD,
                .u.xent_bwd = {d, probs, labels, NULL, NULL, n, classes, eps[e], 1.0f / n}};
            check_op(&op, 1e-6, "xent");
        }
        float *ties = rand_ties(nc);
        for (int k = 1; k <= 5; k += 2) {
            int32_t count = 3;
            mgt_op op = {.kind = MGT_OP_TOPK, .u.topk = {&count, logits, labels, n, classes, k}};
            check_op(&op, 0, "topk");
            op.u.topk.logits = ties;
            check_op(&op, 0, "topk with ties");
        }
        free(ties);
        free(logits);
        free(probs);
        free(d);
        free(labels);
    }
}

/* A NaN or infinite logit of the label is never correct, and a NaN elsewhere ranks above the
   label (as torch.topk ranks NaN above every number): a diverged model's validation counts no
   image as correct (before: a row of NaN logits was rank 0, and Acc@1 read 100). The reference
   and every kernel configuration, rows of 4 classes, k = 1 and 2. */
static void test_topk_nonfinite(void **state)
{
    (void)state;
    const float nan = NAN, inf = INFINITY;
    enum { ROWS = 9, CLASSES = 4 };
    const float z[ROWS][CLASSES] = {
        {nan, nan, nan, nan}, /* every logit NaN */
        {0.5f, nan, 0.1f, 0}, /* the label's (1) is NaN */
        {0.5f, inf, 0.1f, 0}, /* the label's (1) is +inf */
        {-inf, 2, 1, 0},      /* the label's (0) is -inf */
        {1, 2, nan, 0},       /* label 1 is the largest number, but a NaN ranks above it */
        {1, 2, 0, -inf},      /* label 1 first: -inf elsewhere is below it (correct) */
        {inf, 2, 0, 0},       /* label 1 second after +inf elsewhere (top-2 only) */
        {1, nan, nan, 3},     /* label 3 below two NaNs: not even top-2 */
        {1, 5, 2, 0},         /* finite: label 1 first (correct) */
    };
    const int32_t labels[ROWS] = {0, 1, 1, 0, 1, 1, 1, 3, 1};
    const int32_t want[3] = {0, 2, 4}; /* correct rows for k = 1 and k = 2 (index k) */
    float logits[ROWS * CLASSES];
    memcpy(logits, z, sizeof logits);
    for (int k = 1; k <= 2; k++) {
        int32_t count = 0;
        mgt_op op = {.kind = MGT_OP_TOPK,
                     .u.topk = {.count = &count,
                                .logits = logits,
                                .labels = labels,
                                .n = ROWS,
                                .classes = CLASSES,
                                .k = k}};
        assert_int_equal(mgt_ref_run(&op), MGT_OK);
        if (count != want[k])
            fail_msg("reference, k=%d: %d rows correct, expected %d", k, count, want[k]);
        for (int c = 0; c < NCTX; c++) {
            count = 0;
            assert_int_equal(cpu_run(&ctxs[c], &op), MGT_OK);
            if (count != want[k])
                fail_msg("kernel (context %d), k=%d: %d rows correct, expected %d", c, k, count,
                         want[k]);
        }
    }
}

static void bad_label_case(mgt_op *op, int32_t *labels, int row, int32_t bad)
{
    labels[row] = bad;
    char want_label[32], want_row[32];
    snprintf(want_label, sizeof want_label, "label %d", (int)bad);
    snprintf(want_row, sizeof want_row, "row %d", row);
    for (int c = 0; c < NCTX; c++) {
        mgt_error_clear();
        assert_int_equal(cpu_run(&ctxs[c], op), MGT_ERR_DEVICE);
        const char *msg = mgt_error_last();
        if (!strstr(msg, mgt_op_name(op->kind)) || !strstr(msg, want_label) ||
            !strstr(msg, want_row))
            fail_msg("bad label message lacks the op, label or row: \"%s\"", msg);
    }
    labels[row] = 0;
}

static void test_bad_label(void **state)
{
    (void)state;
    int n = 40, classes = 10;
    float *logits = rand_floats((size_t)n * classes), *probs = rand_floats((size_t)n * classes);
    int32_t *labels = rand_labels(n, classes);
    float loss;
    int32_t count = 0;
    mgt_op fwd = {.kind = MGT_OP_XENT_FWD,
                  .u.xent_fwd = {&loss, probs, logits, labels, NULL, NULL, n, classes, 0.1f}};
    mgt_op bwd = {.kind = MGT_OP_XENT_BWD,
                  .u.xent_bwd = {probs, logits, labels, NULL, NULL, n, classes, 0.0f, 1.0f}};
    mgt_op topk = {.kind = MGT_OP_TOPK, .u.topk = {&count, logits, labels, n, classes, 5}};
    bad_label_case(&fwd, labels, 7, classes);
    bad_label_case(&fwd, labels, 0, -1);
    bad_label_case(&bwd, labels, 39, 1000);
    bad_label_case(&topk, labels, 12, -5);
    assert_int_equal(count, 0);
    free(logits);
    free(probs);
    free(labels);
}

/* ---- scratch accounting ---- */

typedef struct budget {
    size_t used, limit;
    int grows;
} budget;

static mgt_status budget_reserve(void *owner, size_t bytes)
{
    budget *b = owner;
    if (b->used + bytes > b->limit)
        return mgt_error_set(MGT_ERR_OOM, "test budget of %zu bytes exceeded", b->limit);
    b->used += bytes;
    b->grows++;
    return MGT_OK;
}

static void budget_unreserve(void *owner, size_t bytes)
{
    budget *b = owner;
    assert_true(bytes <= b->used);
    b->used -= bytes;
}

static void test_scratch(void **state)
{
    (void)state;
    mgt_conv2d_shape sh = SHAPE(4, 16, 20, 20, 16, 3, 3, 1, 1, 1, 1, 1);
    size_t nx = (size_t)sh.n * sh.c * sh.h * sh.w, nw = (size_t)sh.k * sh.c * 9;
    float *x = rand_floats(nx), *y = rand_floats(nx), *w = rand_floats(nw);
    mgt_op fwd = {.kind = MGT_OP_CONV2D_FWD, .u.conv = {y, x, w, sh, 0.0f}};
    mgt_op bwf = {.kind = MGT_OP_CONV2D_BWD_FILTER, .u.conv = {w, y, x, sh, 1.0f}};

    budget b = {0, 1000, 0};
    cpu_ctx ctx;
    assert_int_equal(cpu_ctx_init(&ctx, 3), MGT_OK);
    ctx.reserve = budget_reserve;
    ctx.unreserve = budget_unreserve;
    ctx.owner = &b;
    mgt_status st = cpu_run(&ctx, &fwd);
    assert_int_equal(st, MGT_ERR_OOM);
    assert_non_null(strstr(mgt_error_last(), "conv2d_forward"));
    assert_int_equal(b.used, 0);

    b.limit = (size_t)1 << 30;
    assert_int_equal(cpu_run(&ctx, &fwd), MGT_OK);
    assert_int_equal(cpu_run(&ctx, &bwf), MGT_OK);
    assert_true(b.used == ctx.scratch_bytes && b.used > 0);
    /* steady state: the same ops again grow nothing */
    int grows = b.grows;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(cpu_run(&ctx, &fwd), MGT_OK);
        assert_int_equal(cpu_run(&ctx, &bwf), MGT_OK);
    }
    assert_int_equal(b.grows, grows);
    cpu_ctx_destroy(&ctx);
    assert_int_equal(b.used, 0);
    free(x);
    free(y);
    free(w);
}

/* ---- activations: the AVX-512F (or AVX2) build of their loops against the baseline one ---- */

/* Both builds make every element with the same IEEE operations, so they must agree to the
   bit: on [-8, 8] and on values where exp overflows and underflows, infinities, NaN and
   denormals, with lengths that end in a partial vector and span several items. */
static void test_activation_vectors(void **state)
{
    (void)state;
    static const float ends[] = {88.5f,  88.8f, 89.5f, 100.0f, 103.5f,   104.5f,
                                 1e-40f, 0.0f,  6.0f,  3.0f,   INFINITY, NAN};
    static const size_t lens[] = {1, 15, 17, 1000, 40001};
    const size_t nmax = 40001;
    const char *wide_isa = __builtin_cpu_supports("avx512f") ? "AVX-512F"
                           : __builtin_cpu_supports("avx2")  ? "AVX2"
                                                             : NULL;
    if (!wide_isa)
        print_message("this CPU has neither AVX-512F nor AVX2: both runs take the baseline "
                      "loops\n");
    float *x = malloc(nmax * 4), *dy = rand_floats(nmax), *base = malloc(nmax * 4),
          *wide = malloc(nmax * 4);
    assert_true(x && base && wide);
    for (size_t i = 0; i < nmax; i++) {
        float e = ends[(i / 2) % (sizeof ends / sizeof ends[0])];
        x[i] = i % 4 == 0 ? e : i % 4 == 2 ? -e : 8.0f * rng_float();
    }
    for (int act = 0; act < MGT_ACT_COUNT; act++)
        for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
            for (int fwd = 0; fwd < 2; fwd++) {
                size_t n = lens[l];
                for (int pass = 0; pass < 2; pass++) {
                    float *out = pass ? wide : base;
                    mgt_op op = {.kind = fwd ? MGT_OP_ACT_FWD : MGT_OP_ACT_BWD};
                    if (fwd)
                        op.u.act_fwd = (mgt_act_fwd_args){out, x, n, (mgt_act)act};
                    else
                        op.u.act_bwd = (mgt_act_bwd_args){out, dy, x, n, (mgt_act)act};
                    ctxs[1].vec_baseline = pass == 0;
                    assert_int_equal(cpu_run(&ctxs[1], &op), MGT_OK);
                }
                ctxs[1].vec_baseline = false;
                if (memcmp(base, wide, n * 4) != 0) {
                    for (size_t i = 0; i < n; i++)
                        if (memcmp(&base[i], &wide[i], 4) != 0) {
                            print_error("%s %s n=%zu: element %zu of x=%.9g: baseline %.9g, "
                                        "%s %.9g\n",
                                        mgt_act_name((mgt_act)act), fwd ? "forward" : "backward", n,
                                        i, x[i], base[i], wide_isa ? wide_isa : "baseline",
                                        wide[i]);
                            break;
                        }
                    fail();
                }
            }
    free(x);
    free(dy);
    free(base);
    free(wide);
}

/* The layer norm's row path: its AVX2 and baseline builds agree to the bit (y, dx, dweight and
   dbias), over row lengths that end in a partial vector and row counts that span several items
   and blocks; and rows whose mean is 1e5 times their spread keep float precision (the mean is
   split into its float rounding and the remainder): y within 2e-5 of the double answer. */
static void test_layernorm_rows_vectors(void **state)
{
    (void)state;
    static const int cs[] = {7, 33, 96, 384, 1031};
    const int rows = 300;
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        size_t c = (size_t)cs[ci], n = (size_t)rows * c;
        float *x = rand_floats(n), *dy = rand_floats(n), *w = rand_floats(c), *b = rand_floats(c);
        for (size_t r = 0; r < (size_t)rows; r += 3) /* every third row far off zero */
            for (size_t k = 0; k < c; k++)
                x[r * c + k] = (r % 2 ? -1000.0f : 1000.0f) + 0.01f * x[r * c + k];
        float *out[2][4];
        for (int pass = 0; pass < 2; pass++) {
            for (int k = 0; k < 4; k++) {
                out[pass][k] = calloc(k < 2 ? n : c, sizeof(float));
                assert_non_null(out[pass][k]);
            }
            ctxs[1].vec_baseline = pass == 0;
            mgt_op f = {
                .kind = MGT_OP_LNC_FWD,
                .u.lnc_fwd = {out[pass][0], x, w, b, rows, (int)c, 1, 1e-5f, MGT_LAYOUT_NCHW}};
            mgt_op g = {.kind = MGT_OP_LNC_BWD,
                        .u.lnc_bwd = {out[pass][1], out[pass][2], out[pass][3], dy, x, w, rows,
                                      (int)c, 1, 1e-5f, MGT_LAYOUT_NCHW}};
            assert_int_equal(cpu_run(&ctxs[1], &f), MGT_OK);
            assert_int_equal(cpu_run(&ctxs[1], &g), MGT_OK);
        }
        ctxs[1].vec_baseline = false;
        static const char *const what[] = {"y", "dx", "dweight", "dbias"};
        for (int k = 0; k < 4; k++)
            if (memcmp(out[0][k], out[1][k], (k < 2 ? n : c) * sizeof(float)) != 0)
                fail_msg("layer norm rows c=%zu: %s of the AVX2 build differs from the baseline", c,
                         what[k]);
        for (size_t r = 0; r < (size_t)rows; r += 3) {
            const float *xr = x + r * c, *yr = out[0][0] + r * c;
            double m = 0.0, v = 0.0;
            for (size_t k = 0; k < c; k++)
                m += xr[k];
            m /= (double)c;
            for (size_t k = 0; k < c; k++)
                v += (xr[k] - m) * (xr[k] - m);
            double rs = 1.0 / sqrt(v / (double)c + 1e-5);
            for (size_t k = 0; k < c; k++) {
                double want = (xr[k] - m) * rs * w[k] + b[k];
                if (fabs(yr[k] - want) > 2e-5)
                    fail_msg("layer norm rows c=%zu row %zu (mean %.6g): y[%zu] %.9g, the double "
                             "answer %.9g",
                             c, r, m, k, (double)yr[k], want);
            }
        }
        for (int pass = 0; pass < 2; pass++)
            for (int k = 0; k < 4; k++)
                free(out[pass][k]);
        free(x);
        free(dy);
        free(w);
        free(b);
    }
}

/* ---- the softmax rows' helpers (attention) ----
   cpu_max_above gives the scalar loop's value exactly (NaNs passed over); cpu_exp_shift's
   exponentials are within 2 ulp of expf and 0 for -inf, the same bits in every build (per-lane
   operations), nothing past n written, and its sum that of its outputs. Lengths end in every
   partial vector of 4, 8 and 16 lanes. */
static uint32_t ulp_dist(float a, float b)
{
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    ia = ia < 0 ? INT32_MIN - ia : ia;
    ib = ib < 0 ? INT32_MIN - ib : ib;
    return ia > ib ? (uint32_t)ia - (uint32_t)ib : (uint32_t)ib - (uint32_t)ia;
}

static void test_softmax_row_helpers(void **state)
{
    (void)state;
    static const size_t lens[] = {1, 3, 4, 7, 8, 9, 15, 16, 17, 31, 49, 197, 256};
    const size_t nmax = 256, pad = 16;
    float *x = malloc((nmax + pad) * 4), *y = malloc((nmax + pad) * 4),
          *yb = malloc((nmax + pad) * 4);
    assert_true(x && y && yb);
    bool avx2 = __builtin_cpu_supports("avx2");
    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
        size_t n = lens[l];
        for (size_t i = 0; i < n; i++)
            x[i] = 10.0f * rng_float();
        if (n > 1) /* a masked key; a row of them alone: below */
            x[n / 2] = -INFINITY;
        if (n > 2) /* a logit Swin's mask lowered by 100: e^-95 is below FLT_MIN */
            x[n / 3] = -95.0f + x[n / 3];
        /* the maximum, with a NaN anywhere but first, and below or above m */
        for (int with_nan = 0; with_nan < 2; with_nan++) {
            float saved = x[n - 1];
            if (with_nan && n > 1)
                x[n - 1] = NAN;
            for (int k = 0; k < 3; k++) {
                float m0 = k == 0 ? -INFINITY : k == 1 ? 0.0f : 50.0f, want = m0;
                for (size_t i = 0; i < n; i++)
                    want = x[i] > want ? x[i] : want;
                assert_memory_equal(&(float){cpu_max_above(x, n, m0)}, &want, 4);
                assert_memory_equal(&(float){cpu_max_above_base(x, n, m0)}, &want, 4);
                if (avx2)
                    assert_memory_equal(&(float){cpu_max_above_avx2(x, n, m0)}, &want, 4);
            }
            x[n - 1] = saved;
        }
        float shift = cpu_max_above(x, n, -INFINITY);
        for (int build = 0; build < 3; build++) {
            if (build == 2 && !avx2)
                continue;
            float *out = build == 0 ? y : yb;
            for (size_t i = 0; i < n + pad; i++)
                out[i] = -1.0f;
            float sum = build == 0   ? cpu_exp_shift(out, x, shift, n)
                        : build == 1 ? cpu_exp_shift_base(out, x, shift, n)
                                     : cpu_exp_shift_avx2(out, x, shift, n);
            double want_sum = 0.0;
            for (size_t i = 0; i < n; i++) {
                float e = expf(x[i] - shift);
                if (e < FLT_MIN ? out[i] != 0.0f : ulp_dist(out[i], e) > 2)
                    fail_msg("n=%zu: e^(%.9g - %.9g) = %.9g, expf %.9g", n, x[i], shift, out[i], e);
                want_sum += out[i];
            }
            for (size_t i = n; i < n + pad; i++)
                assert_true(out[i] == -1.0f);
            /* a float sum of n terms: within n float roundings of the exact one */
            if (!(fabs(sum - want_sum) <= (double)n * FLT_EPSILON * want_sum))
                fail_msg("build %d n=%zu: sum %.9g, of the outputs %.9g", build, n, sum, want_sum);
            if (build > 0)
                assert_memory_equal(out, y, n * 4);
        }
        /* a fully masked row: NaN, as expf(-inf - -inf) in the scalar loop */
        yb[0] = -INFINITY;
        assert_true(isnan(cpu_exp_shift(yb, yb, -INFINITY, 1)) && isnan(yb[0]));
        /* in place, as the attention rows use it */
        memcpy(yb, x, n * 4);
        cpu_exp_shift(yb, yb, shift, n);
        assert_memory_equal(yb, y, n * 4);
    }
    free(x);
    free(y);
    free(yb);
}

/* ---- 16-bit storage: the AVX-512 lanes against the baseline's tiles ----
   Batch norm (training forward with a folded ReLU and a fused residual add, backward masked by
   it, with the residual's gradient) in nChw16c, add and
   ReLU over bf16 and fp16 codes: the lanes widen and round in registers what the baseline widens
   into tiles, with the same operations between, so both must give the same codes, statistics
   and parameter gradients, including lengths that end in a partial vector. */
static void test_lanes16_bits(void **state)
{
    (void)state;
    if (!__builtin_cpu_supports("avx512bw"))
        print_message("this CPU has no AVX-512BW: both runs take the baseline loops\n");
    const int shapes[][3] = {{5, 32, 49}, {9, 16, 1100}, {2, 16, 7}};
    for (int pi = 0; pi < 2; pi++)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
            mgt_precision p = pi ? MGT_PREC_FP16 : MGT_PREC_BF16;
            int n = shapes[si][0], c = shapes[si][1], hw = shapes[si][2];
            size_t nx = (size_t)n * c * hw, ne = nx - 3; /* the elementwise ops' odd length */
            float *xf = rand_floats(nx), *dyf = rand_floats(nx), *gamma = rand_floats((size_t)c),
                  *beta = rand_floats((size_t)c);
            uint16_t *x = malloc(nx * 2), *dy = malloc(nx * 2), *out[2][6];
            assert_true(x && dy);
            for (size_t i = 0; i < nx; i++) {
                x[i] = mgt_lowp_encode(p, 5.0f + 3.0f * xf[i]);
                dy[i] = mgt_lowp_encode(p, dyf[i]);
            }
            float st[2][6][32] = {{{0}}};       /* mean, invstd, running mean, var, dgamma, dbeta */
            for (int run = 0; run < 2; run++) { /* the lanes, then the baseline */
                for (int k = 0; k < 6; k++) {   /* y, dx, x + dy, relu(dy), relu'(dy; x), dz */
                    out[run][k] = malloc(nx * 2);
                    assert_non_null(out[run][k]);
                }
                float(*s)[32] = st[run];
                for (int ch = 0; ch < c; ch++)
                    s[3][ch] = 1.0f;
                void *y = out[run][0], *dx = out[run][1];
                mgt_bn_shape sh = {n, c, hw, 1e-5f, 0.1f, BLK, true};
                /* the batch norm with a fused residual add (z: dy's codes) */
                mgt_op ops[5] = {
                    {.kind = MGT_OP_BN_FWD_TRAIN,
                     .u.bn_train = {y, s[0], s[1], s[2], s[3], (float *)x, gamma, beta, sh,
                                    (float *)dy, p}},
                    {.kind = MGT_OP_BN_BWD,
                     .u.bn_bwd = {dx, s[4], s[5], (float *)dy, y, (float *)x, gamma, s[0], s[1], sh,
                                  (float *)out[run][5]}},
                    {.kind = MGT_OP_ADD,
                     .u.add = {(float *)out[run][2], (float *)x, (float *)dy, ne}},
                    {.kind = MGT_OP_RELU_FWD,
                     .u.relu_fwd = {(float *)out[run][3], (float *)dy, ne}},
                    {.kind = MGT_OP_RELU_BWD,
                     .u.relu_bwd = {(float *)out[run][4], (float *)dy, (float *)dy, ne}},
                };
                ctxs[1].vec_baseline = run == 1;
                for (int k = 0; k < 5; k++) {
                    ops[k].store_in = ops[k].store_out = p;
                    assert_int_equal(cpu_run(&ctxs[1], &ops[k]), MGT_OK);
                }
            }
            ctxs[1].vec_baseline = false;
            static const char *const what[] = {
                "batchnorm_forward_train", "batchnorm_backward",     "add", "relu_forward",
                "relu_backward",           "batchnorm_backward's dz"};
            for (int k = 0; k < 6; k++)
                if (memcmp(out[0][k], out[1][k], (k < 2 || k == 5 ? nx : ne) * 2) != 0)
                    fail_msg("%s n %d c %d hw %d: %s on the lanes differs from the baseline",
                             mgt_precision_name(p), n, c, hw, what[k]);
            if (memcmp(st[0], st[1], sizeof st[0]) != 0)
                fail_msg("%s n %d c %d hw %d: statistics or dgamma/dbeta differ on the lanes",
                         mgt_precision_name(p), n, c, hw);
            for (int r = 0; r < 2; r++)
                for (int k = 0; k < 6; k++)
                    free(out[r][k]);
            void *bufs[] = {xf, dyf, gamma, beta, x, dy};
            for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
                free(bufs[i]);
        }
}

/* ---- the blocked layout: the same bits as NCHW ---- */

/* x [n, c, hw] in NCHW copied into nChw16c. */
static float *to_blocked(const float *x, int n, int c, int hw)
{
    size_t len = (size_t)n * c * hw;
    float *b = malloc(len * 4);
    assert_non_null(b);
    for (int i = 0; i < n; i++)
        for (int ch = 0; ch < c; ch++)
            for (int e = 0; e < hw; e++)
                b[mgt_layout_at(MGT_LAYOUT_NCHW16C, c, hw, i, ch, e)] =
                    x[mgt_layout_at(MGT_LAYOUT_NCHW, c, hw, i, ch, e)];
    return b;
}

/* Whether y_blocked holds y_plain's bits, element for element. */
static bool same_bits_blocked(const float *plain, const float *blocked, int n, int c, int hw)
{
    float *b = to_blocked(plain, n, c, hw);
    bool same = memcmp(b, blocked, (size_t)n * c * hw * 4) == 0;
    free(b);
    return same;
}

/* Batch norm (train, eval, backward), max pooling and the global average pool give the NCHW
   kernels' bits in nChw16c, on the baseline and the AVX-512F builds of the sums, with planes of less than one
   16-pixel group, of whole 1024-element blocks and of a block and a tail, and with 1 to 9
   images (BNB_PARTS splits them). Models then train to the same bits in either layout. */
static void test_blocked_bits(void **state)
{
    (void)state;
    static const char *const stage[] = {"batchnorm_forward_train", "batchnorm_backward",
                                        "batchnorm_forward_eval"};
    const int shapes[][3] = {{2, 16, 7}, {3, 32, 49}, {1, 16, 1024}, {9, 48, 1100}, {5, 16, 64}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int n = shapes[si][0], c = shapes[si][1], hw = shapes[si][2];
        size_t nx = (size_t)n * c * hw;
        float *x = rand_floats(nx), *dy = rand_floats(nx), *gamma = rand_floats((size_t)c),
              *beta = rand_floats((size_t)c);
        for (size_t i = 0; i < nx; i++)
            x[i] = 5.0f + 3.0f * x[i];
        float *in[2][2] = {{x, dy}, {to_blocked(x, n, c, hw), to_blocked(dy, n, c, hw)}};
        /* per run (NCHW, nChw16c, nChw16c on the baseline build): the three tensor outputs, the
           pool, and save_mean, save_invstd, running mean and variance, dgamma, dbeta */
        float *out[3][4], st[3][6][64] = {{{0}}};
        assert_true(c <= 64);
        for (int run = 0; run < 3; run++) {
            bool blk = run > 0;
            ctxs[1].vec_baseline = run == 2;
            for (int k = 0; k < 4; k++) {
                out[run][k] = malloc((k < 3 ? nx : (size_t)n * c) * 4);
                assert_non_null(out[run][k]);
            }
            float(*s)[64] = st[run];
            for (int ch = 0; ch < c; ch++) {
                s[2][ch] = 0.5f;
                s[3][ch] = 2.0f;
                s[4][ch] = s[5][ch] = 0.25f;
            }
            mgt_bn_shape sh = {n, c, hw, 1e-5f, 0.1f, blk ? BLK : PLAIN, false};
            mgt_op ops[4] = {
                {.kind = MGT_OP_BN_FWD_TRAIN,
                 .u.bn_train = {out[run][0], s[0], s[1], s[2], s[3], in[blk][0], gamma, beta, sh}},
                {.kind = MGT_OP_BN_BWD,
                 .u.bn_bwd = {out[run][1], s[4], s[5], in[blk][1], NULL, in[blk][0], gamma, s[0],
                              s[1], sh}},
                {.kind = MGT_OP_BN_FWD_EVAL,
                 .u.bn_eval = {out[run][2], in[blk][0], gamma, beta, s[2], s[3], sh}},
                {.kind = MGT_OP_AVGPOOL_FWD},
            };
            ops[3].u.avgpool_fwd =
                (mgt_avgpool_fwd_args){out[run][3], in[blk][0], n, c, hw, sh.layout};
            for (int k = 0; k < 4; k++)
                assert_int_equal(cpu_run(&ctxs[1], &ops[k]), MGT_OK);
        }
        ctxs[1].vec_baseline = false;
        for (int run = 1; run < 3; run++) {
            const char *why = run == 2 ? " (baseline build)" : "";
            for (int k = 0; k < 3; k++)
                if (!same_bits_blocked(out[0][k], out[run][k], n, c, hw))
                    fail_msg("n %d c %d hw %d: %s in nChw16c%s differs from NCHW", n, c, hw,
                             stage[k], why);
            if (memcmp(out[0][3], out[run][3], (size_t)n * c * 4) != 0)
                fail_msg("n %d c %d hw %d: avgpool_forward in nChw16c%s differs", n, c, hw, why);
            if (memcmp(st[0], st[run], sizeof st[0]) != 0)
                fail_msg("n %d c %d hw %d: statistics or dgamma/dbeta in nChw16c%s differ", n, c,
                         hw, why);
        }
        for (int run = 0; run < 3; run++)
            for (int k = 0; k < 4; k++)
                free(out[run][k]);
        float *bufs[] = {x, dy, gamma, beta, in[1][0], in[1][1]};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            free(bufs[i]);
    }
    /* max pooling, with ties (the first maximum in raster order takes the gradient) */
    const mgt_pool2d_shape pools[] = {{3, 32, 12, 12, 3, 3, 2, 2, 1, 1, false, PLAIN},
                                      {2, 16, 9, 7, 2, 3, 1, 2, 1, 1, true, PLAIN}};
    for (size_t pi = 0; pi < sizeof pools / sizeof *pools; pi++) {
        mgt_pool2d_shape sh = pools[pi];
        int hw = sh.h * sh.w, pq = mgt_pool2d_out_h(&sh) * mgt_pool2d_out_w(&sh);
        size_t nx = (size_t)sh.n * sh.c * hw, ny = (size_t)sh.n * sh.c * pq;
        float *x = rand_ties(nx), *dy = rand_floats(ny);
        float *in[2][2] = {{x, dy},
                           {to_blocked(x, sh.n, sh.c, hw), to_blocked(dy, sh.n, sh.c, pq)}};
        float *y[3], *dx[3];
        for (int run = 0; run < 3; run++) {
            bool blk = run > 0;
            ctxs[1].vec_baseline = run == 2;
            sh.layout = blk ? BLK : PLAIN;
            y[run] = malloc(ny * 4);
            dx[run] = malloc(nx * 4);
            assert_true(y[run] && dx[run]);
            mgt_op op = {.kind = MGT_OP_MAXPOOL_FWD, .u.maxpool_fwd = {y[run], in[blk][0], sh}};
            assert_int_equal(cpu_run(&ctxs[1], &op), MGT_OK);
            op = (mgt_op){.kind = MGT_OP_MAXPOOL_BWD,
                          .u.maxpool_bwd = {dx[run], in[blk][1], in[blk][0], y[run], sh}};
            assert_int_equal(cpu_run(&ctxs[1], &op), MGT_OK);
        }
        ctxs[1].vec_baseline = false;
        for (int run = 1; run < 3; run++)
            if (!same_bits_blocked(y[0], y[run], sh.n, sh.c, pq) ||
                !same_bits_blocked(dx[0], dx[run], sh.n, sh.c, hw))
                fail_msg("maxpool n %d c %d %dx%d in nChw16c%s differs from NCHW", sh.n, sh.c, sh.h,
                         sh.w, run == 2 ? " (baseline build)" : "");
        for (int run = 0; run < 3; run++) {
            free(y[run]);
            free(dx[run]);
        }
        float *bufs[] = {x, dy, in[1][0], in[1][1]};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            free(bufs[i]);
    }
}

/* Batch norm with a folded ReLU gives the bits of batch norm then relu_forward (train and eval),
   and of relu_backward then batch norm's backward, in either layout and on either build of the
   sums: a model folds them (plan_fusion) and must train as it did unfolded. */
static void test_folded_relu_bits(void **state)
{
    (void)state;
    const int shapes[][3] = {{5, 32, 49}, {9, 16, 1100}, {2, 16, 7}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (int run = 0; run < 3; run++) { /* NCHW, nChw16c, nChw16c on the baseline build */
            int n = shapes[si][0], c = shapes[si][1], hw = shapes[si][2];
            size_t nx = (size_t)n * c * hw;
            float *x = rand_floats(nx), *dy = rand_floats(nx), *gamma = rand_floats((size_t)c),
                  *beta = rand_floats((size_t)c), *t[2][4];
            for (size_t i = 0; i < nx; i++)
                x[i] = 5.0f + 3.0f * x[i];
            float st[2][6][32] = {{{0}}}; /* mean, invstd, running mean, var, dgamma, dbeta */
            ctxs[1].vec_baseline = run == 2;
            for (int fold = 0; fold < 2; fold++) {
                for (int k = 0; k < 4; k++) { /* y, dx, eval y, masked dy */
                    t[fold][k] = malloc(nx * 4);
                    assert_non_null(t[fold][k]);
                }
                float(*s)[32] = st[fold], *y = t[fold][0], *dx = t[fold][1], *ye = t[fold][2];
                for (int ch = 0; ch < c; ch++)
                    s[3][ch] = 1.0f;
                mgt_bn_shape sh = {n, c, hw, 1e-5f, 0.1f, run ? BLK : PLAIN, fold == 1};
                mgt_op ops[6] = {
                    {.kind = MGT_OP_BN_FWD_TRAIN,
                     .u.bn_train = {y, s[0], s[1], s[2], s[3], x, gamma, beta, sh}},
                    {.kind = MGT_OP_RELU_FWD, .u.relu_fwd = {y, y, nx}},
                    {.kind = MGT_OP_RELU_BWD, .u.relu_bwd = {t[fold][3], dy, y, nx}},
                    {.kind = MGT_OP_BN_BWD,
                     .u.bn_bwd = {dx, s[4], s[5], fold ? dy : t[fold][3], fold ? y : NULL, x, gamma,
                                  s[0], s[1], sh}},
                    {.kind = MGT_OP_BN_FWD_EVAL, .u.bn_eval = {ye, x, gamma, beta, s[2], s[3], sh}},
                    {.kind = MGT_OP_RELU_FWD, .u.relu_fwd = {ye, ye, nx}},
                };
                for (int k = 0; k < 6; k++) {
                    bool relu = ops[k].kind == MGT_OP_RELU_FWD || ops[k].kind == MGT_OP_RELU_BWD;
                    if (!fold || !relu)
                        assert_int_equal(cpu_run(&ctxs[1], &ops[k]), MGT_OK);
                }
            }
            static const char *const what[] = {"forward_train", "backward", "forward_eval"};
            for (int k = 0; k < 3; k++)
                if (memcmp(t[0][k], t[1][k], nx * 4) != 0)
                    fail_msg("n %d c %d hw %d run %d: batchnorm_%s with a folded ReLU differs", n,
                             c, hw, run, what[k]);
            if (memcmp(st[0], st[1], sizeof st[0]) != 0)
                fail_msg("n %d c %d hw %d run %d: statistics or dgamma/dbeta differ folded", n, c,
                         hw, run);
            for (int f = 0; f < 2; f++)
                for (int k = 0; k < 4; k++)
                    free(t[f][k]);
            float *bufs[] = {x, dy, gamma, beta};
            for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
                free(bufs[i]);
        }
    ctxs[1].vec_baseline = false;
}

/* ---- main ---- */

static int ctx_setup(void **state)
{
    (void)state;
    for (int c = 0; c < NCTX; c++) {
        if (cpu_ctx_init(&ctxs[c], THREADS[c]) != MGT_OK)
            return -1;
        ctxs[c].conv_im2col = IM2COL[c];
    }
    return 0;
}

static int ctx_teardown(void **state)
{
    (void)state;
    for (int c = 0; c < NCTX; c++)
        cpu_ctx_destroy(&ctxs[c]);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_aliasing),
        cmocka_unit_test(test_sgd),
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_conv),
        cmocka_unit_test(test_conv_filter_determinism),
        cmocka_unit_test(test_batchnorm),
        cmocka_unit_test(test_pooling),
        cmocka_unit_test(test_xent_topk),
        cmocka_unit_test(test_topk_nonfinite),
        cmocka_unit_test(test_bad_label),
        cmocka_unit_test(test_scratch),
        cmocka_unit_test(test_activation_vectors),
        cmocka_unit_test(test_layernorm_rows_vectors),
        cmocka_unit_test(test_softmax_row_helpers),
        cmocka_unit_test(test_blocked_bits),
        cmocka_unit_test(test_folded_relu_bits),
        cmocka_unit_test(test_lanes16_bits),
    };
    return cmocka_run_group_tests_name("cpu_kernels", tests, ctx_setup, ctx_teardown);
}
