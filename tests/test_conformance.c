/* Kernel conformance: one op's cases on every backend present against the plain reference, with guard regions around every operand, and each backward kernel against central finite differences of its forward on the same backend. Usage: test_conformance OP [-v]; test_conformance --list prints every op of the op list, one
   a line, which is how CTest learns the cases conformance.<op> (tests/CMakeLists.txt). */
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/bytes.h"
#include "device/lowp.h"
#include "device/op.h"
#include "mgt/device.h"

/* Floats of sentinel on each side of every operand: a kernel that writes one element past an
   end (or reads its input one row too far) meets it. */
#define GUARD 64
/* A quiet NaN with a payload no arithmetic produces; it marks guards, and OUT operands start
   as it, so an element the kernel forgets to write shows up as this exact pattern. */
#define SENTINEL 0x7fc0deadu
#define MAX_ARRAYS 24
#define MAX_FAIL_LINES 8

static bool verbose;

/* ---- deterministic random numbers (splitmix64: every case is reproducible from its index) ---- */

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rng_u64(rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rng_unit(rng *r) { return (double)(rng_u64(r) >> 11) * 0x1.0p-53; }

static float rng_unif(rng *r, float lo, float hi)
{
    return lo + (float)(rng_unit(r) * ((double)hi - lo));
}

/* Inclusive at both ends. */
static int rng_int(rng *r, int lo, int hi)
{
    return lo + (int)(rng_u64(r) % (uint64_t)(hi - lo + 1));
}

/* An op's cases are seeded by its name (FNV-1a), not its place in the op list, so adding an
   op leaves every other op's cases as they were. */
static int op_seed(const char *name)
{
    uint32_t h = 2166136261u;
    for (const char *p = name; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    return (int)(h & 0xfffffu) + 1000; /* above the salts the finite-difference checks use */
}

static rng rng_for(int kind, int idx, int salt)
{
    rng r = {((uint64_t)(kind + 1) << 40) ^ ((uint64_t)(idx + 1) << 16) ^ (uint64_t)salt};
    rng_u64(&r);
    return r;
}

static float f32_of_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t bits_of_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* ---- a case: one op with host arrays it owns ---- */

/* One output of the forward in the loss sum(r * y). */
typedef struct fd_term {
    const float *y;
    const float *r;
    size_t n;
} fd_term;

/* An input x [n] of a forward and the gradient a backward writes for it. */
typedef struct fd_wrt {
    float *x;
    size_t n;
    const float *grad;
    const char *name;
} fd_wrt;

struct tcase;
struct backend;

/* A finite-difference case: the backward op(s) under test against central differences of the
   forward's loss sum(r * y). */
typedef struct fd_part {
    mgt_op fwd;
    mgt_op bwd[2]; /* gemm's two gradient products */
    int nbwd;
    bool fwd_first; /* the backward reads the forward's outputs */
    fd_term term;
    fd_wrt wrt[3];
    int nwrt; /* 0: the case is a comparison with the reference */
    float h;
    rng r; /* the generator after the data: the samples continue from it */
    /* (optional) run on each backend before the forward and after the checks; nonzero fails */
    int (*before)(struct backend *be, const char *opname, int t, struct tcase *c);
    int (*after)(struct backend *be, const char *opname, int t, struct tcase *c);
} fd_part;

/* A case: the op compared with the reference, or (fd.nwrt > 0) a finite-difference check. */
typedef struct tcase {
    mgt_op op; /* pointers into arr[] */
    char desc[200];
    double rtol; /* relative tolerance of float outputs */
    double mag;  /* a floor for the magnitude the tolerance scales (sum: the sum of |x|) */
    int narr;
    void *arr[MAX_ARRAYS];
    size_t len[MAX_ARRAYS]; /* elements */
    fd_part fd;
} tcase;

static void *case_array(tcase *c, size_t n)
{
    if (c->narr == MAX_ARRAYS) {
        fprintf(stderr, "conformance: too many arrays in one case\n");
        abort();
    }
    void *p = calloc(n ? n : 1, 4);
    if (!p) {
        fprintf(stderr, "conformance: out of host memory\n");
        abort();
    }
    c->arr[c->narr] = p;
    c->len[c->narr++] = n;
    return p;
}

static float *case_f32(tcase *c, size_t n) { return case_array(c, n); }
static int32_t *case_i32(tcase *c, size_t n) { return case_array(c, n); }

/* How many elements the case allocated at p (0: not one of its arrays). */
static size_t case_len(const tcase *c, const void *p)
{
    for (int i = 0; i < c->narr; i++)
        if (c->arr[i] == p)
            return c->len[i];
    return 0;
}

static void case_free(tcase *c)
{
    for (int i = 0; i < c->narr; i++)
        free(c->arr[i]);
    c->narr = 0;
}

static void case_desc(tcase *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void case_desc(tcase *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->desc, sizeof c->desc, fmt, ap);
    va_end(ap);
}

/* Relative tolerance for outputs that are sums of `red` products: float rounding grows about
   with the square root of the length, and a blocked or threaded sum regroups the terms. */
static double tol_for(double red) { return 1e-6 * (8.0 + 2.0 * sqrt(red)); }

static void fill_unif(rng *r, float *x, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = rng_unif(r, lo, hi);
}

static void fill_labels(rng *r, int32_t *l, int n, int classes)
{
    for (int i = 0; i < n; i++)
        l[i] = rng_int(r, 0, classes - 1);
}

/* ---- backends ---- */

typedef struct backend {
    char label[64];
    mgt_device_kind kind;
    bool has_opts;
    mgt_mock_options opts;
    mgt_devset *set;
    mgt_device *dev;
    mgt_stream *stream;
} backend;

static bool backend_open(backend *be)
{
    int id = 0;
    mgt_devset_options o = {.mock = be->has_opts ? &be->opts : NULL};
    mgt_status st = mgt_devset_open(be->kind, &id, 1, &o, &be->set);
    if (st != MGT_OK) {
        fprintf(stderr, "conformance: cannot open %s: %s: %s\n", be->label, mgt_status_str(st),
                mgt_error_last());
        return false;
    }
    be->dev = mgt_devset_device(be->set, 0);
    st = mgt_stream_create(be->dev, &be->stream);
    if (st != MGT_OK) {
        fprintf(stderr, "conformance: cannot create a stream on %s: %s: %s\n", be->label,
                mgt_status_str(st), mgt_error_last());
        mgt_devset_free(be->set);
        be->set = NULL;
        return false;
    }
    return true;
}

static void backend_close(backend *be)
{
    mgt_stream_free(be->stream);
    mgt_devset_free(be->set);
    be->stream = NULL;
    be->set = NULL;
    be->dev = NULL;
}

/* A device error is sticky, so after one the backend is opened afresh: the remaining cases
   still get reported instead of all failing with the first one's text. */
static bool backend_reopen(backend *be)
{
    backend_close(be);
    return backend_open(be);
}

/* ---- running an op on host (reference) and on a device ---- */

/* An operand's size in the 4-byte words the harness moves and guards (16-bit operands are
   packed, an odd count rounded up to a whole word). */
static size_t words(const mgt_operand *o) { return (o->count * mgt_dtype_size(o->dtype) + 3) / 4; }

/* The first operand with the same host pointer: aliased operands (relu's y == x) share one
   array on the host and one region on the device. */
static int owner_of(void *const orig[], int i)
{
    for (int j = 0; j < i; j++)
        if (orig[j] == orig[i])
            return j;
    return i;
}

/* The role of an operand group: written if any alias of it is written. */
static mgt_operand_role group_role(const mgt_operand ops[], void *const orig[], int n, int i)
{
    mgt_operand_role role = MGT_OPERAND_IN;
    for (int j = 0; j < n; j++)
        if (orig[j] == orig[i] && ops[j].role != MGT_OPERAND_IN)
            role = ops[j].role == MGT_OPERAND_INOUT || role == MGT_OPERAND_INOUT ? MGT_OPERAND_INOUT
                                                                                 : MGT_OPERAND_OUT;
    return role;
}

/* Checks the operand list against the case's arrays, then marks OUT-only arrays with the
   sentinel (on the host, so the reference and the device start from the same bytes). */
static bool case_prepare(tcase *c, const char *opname, int idx)
{
    mgt_op op = c->op;
    mgt_operand ops[MGT_OP_MAX_OPERANDS];
    void *orig[MGT_OP_MAX_OPERANDS];
    int n = mgt_op_operands(&op, ops);
    for (int i = 0; i < n; i++) {
        orig[i] = *ops[i].ptr;
        size_t have = case_len(c, orig[i]);
        if (words(&ops[i]) > have) {
            fprintf(stderr,
                    "FAIL %s case %d (%s): operand %s lists %zu elements, the case allocated "
                    "%zu\n",
                    opname, idx, c->desc, ops[i].name, ops[i].count, have);
            return false;
        }
    }
    for (int i = 0; i < n; i++) {
        if (owner_of(orig, i) != i || group_role(ops, orig, n, i) != MGT_OPERAND_OUT)
            continue;
        bool read = false;
        for (int j = 0; j < n; j++)
            read |= orig[j] == orig[i] && ops[j].role != MGT_OPERAND_OUT;
        if (read)
            continue;
        uint32_t *u = orig[i];
        for (size_t k = 0; k < words(&ops[i]); k++)
            u[k] = SENTINEL;
    }
    return true;
}

typedef struct refres {
    int n;
    mgt_operand ops[MGT_OP_MAX_OPERANDS];
    void *orig[MGT_OP_MAX_OPERANDS];
    void *data[MGT_OP_MAX_OPERANDS]; /* the reference's result; aliases share */
    mgt_op op;
} refres;

static void refres_free(refres *rr)
{
    for (int i = 0; i < rr->n; i++)
        if (owner_of(rr->orig, i) == i)
            free(rr->data[i]);
    rr->n = 0;
}

static bool ref_compute(const tcase *c, refres *rr, const char *opname, int idx)
{
    rr->op = c->op;
    rr->n = mgt_op_operands(&rr->op, rr->ops);
    for (int i = 0; i < rr->n; i++)
        rr->orig[i] = *rr->ops[i].ptr;
    for (int i = 0; i < rr->n; i++) {
        int o = owner_of(rr->orig, i);
        if (o == i) {
            size_t bytes = words(&rr->ops[i]) * 4;
            /* aliases may list different counts; the owner's copy covers the largest */
            for (int j = i + 1; j < rr->n; j++)
                if (rr->orig[j] == rr->orig[i] && words(&rr->ops[j]) * 4 > bytes)
                    bytes = words(&rr->ops[j]) * 4;
            rr->data[i] = malloc(bytes ? bytes : 1);
            memcpy(rr->data[i], rr->orig[i], bytes);
        } else {
            rr->data[i] = rr->data[o];
        }
        *rr->ops[i].ptr = rr->data[i];
    }
    mgt_status st = mgt_ref_run(&rr->op);
    if (st != MGT_OK) {
        fprintf(stderr, "FAIL %s case %d (%s): the reference failed: %s: %s\n", opname, idx,
                c->desc, mgt_status_str(st), mgt_error_last());
        return false;
    }
    return true;
}

/* One op run on a device: each operand group in its own buffer between two guards. */
typedef struct devrun {
    int n;
    mgt_operand ops[MGT_OP_MAX_OPERANDS];
    void *orig[MGT_OP_MAX_OPERANDS];
    size_t count[MGT_OP_MAX_OPERANDS]; /* elements of the group (the largest alias) */
    mgt_buffer *buf[MGT_OP_MAX_OPERANDS];
    uint32_t *up[MGT_OP_MAX_OPERANDS];   /* what was uploaded, guards included */
    uint32_t *back[MGT_OP_MAX_OPERANDS]; /* what came back, guards included */
} devrun;

static void devrun_free(devrun *dr)
{
    for (int i = 0; i < dr->n; i++) {
        mgt_buffer_free(dr->buf[i]);
        free(dr->up[i]);
        free(dr->back[i]);
    }
    memset(dr, 0, sizeof *dr);
}

/* Uploads the op's host arrays with guards, launches the op generically, downloads every
   group whole and synchronises. *what names the failing step. */
static mgt_status dev_exec(backend *be, const mgt_op *op, devrun *dr, const char **what)
{
    memset(dr, 0, sizeof *dr);
    mgt_op dop = *op;
    dr->n = mgt_op_operands(&dop, dr->ops);
    for (int i = 0; i < dr->n; i++)
        dr->orig[i] = *dr->ops[i].ptr;
    mgt_status st = MGT_OK;
    *what = "upload";
    for (int i = 0; i < dr->n && st == MGT_OK; i++) {
        int o = owner_of(dr->orig, i);
        if (o != i) {
            *dr->ops[i].ptr = (uint32_t *)mgt_buffer_ptr(dr->buf[o]) + GUARD;
            continue;
        }
        size_t cnt = 0;
        for (int j = i; j < dr->n; j++)
            if (dr->orig[j] == dr->orig[i] && words(&dr->ops[j]) > cnt)
                cnt = words(&dr->ops[j]);
        dr->count[i] = cnt;
        size_t total = cnt + 2 * GUARD;
        dr->up[i] = malloc(total * 4);
        dr->back[i] = malloc(total * 4);
        if (!dr->up[i] || !dr->back[i]) {
            st = mgt_error_set(MGT_ERR_OOM, "host memory");
            break;
        }
        for (size_t k = 0; k < GUARD; k++)
            dr->up[i][k] = dr->up[i][GUARD + cnt + k] = SENTINEL;
        memcpy(dr->up[i] + GUARD, dr->orig[i], cnt * 4);
        memset(dr->back[i], 0, total * 4);
        st = mgt_buffer_alloc(be->dev, total * 4, &dr->buf[i]);
        if (st == MGT_OK)
            st = mgt_copy_h2d(be->stream, mgt_buffer_ptr(dr->buf[i]), dr->up[i], total * 4);
        if (st == MGT_OK)
            *dr->ops[i].ptr = (uint32_t *)mgt_buffer_ptr(dr->buf[i]) + GUARD;
    }
    if (st == MGT_OK) {
        *what = "launch";
        st = mgt_op_launch(be->stream, &dop);
    }
    if (st == MGT_OK) {
        *what = "download";
        for (int i = 0; i < dr->n && st == MGT_OK; i++)
            if (owner_of(dr->orig, i) == i)
                st = mgt_copy_d2h(be->stream, dr->back[i], mgt_buffer_ptr(dr->buf[i]),
                                  (dr->count[i] + 2 * GUARD) * 4);
    }
    /* Synchronise even after a failed enqueue: the host arrays must outlive queued copies. */
    mgt_status sst = mgt_stream_synchronize(be->stream, NULL);
    if (st == MGT_OK && sst != MGT_OK) {
        *what = "synchronize";
        st = sst;
    }
    return st;
}

/* Runs op on the device as if it were a function of its host arrays: the written operands'
   results land back in them. For the finite-difference checks. */
static mgt_status dev_run_inplace(backend *be, mgt_op *op, const char **what)
{
    devrun dr;
    mgt_status st = dev_exec(be, op, &dr, what);
    if (st == MGT_OK)
        for (int i = 0; i < dr.n; i++)
            if (owner_of(dr.orig, i) == i && group_role(dr.ops, dr.orig, dr.n, i) != MGT_OPERAND_IN)
                memcpy(dr.orig[i], dr.back[i] + GUARD, dr.count[i] * 4);
    devrun_free(&dr);
    return st;
}

static void report_status(const char *opname, int idx, const char *desc, const backend *be,
                          const char *what, mgt_status st)
{
    fprintf(stderr, "FAIL %s case %d (%s) on %s: %s: %s: %s\n", opname, idx, desc, be->label, what,
            mgt_status_str(st), mgt_error_last());
}

/* CUDA runs the low-precision convolutions on cuDNN's tensor cores, whose 16-bit algorithms
   write a 16-bit result (as autocast's convolutions return one): one rounding more than the
   reference, which keeps the fp32 sum. There, and only there, the tolerance grows by one
   rounding's bound (2^-8 relative for bf16, 2^-11 for fp16) of the value plus the tensor's
   largest (the output may add beta times its old value to the rounded sum). The mock devices
   keep the reference's arithmetic and the plain tolerance. */
static double out16_allowance(const backend *be, const tcase *c)
{
    if (be->kind != MGT_DEVICE_CUDA)
        return 0.0;
    switch (c->op.kind) {
    case MGT_OP_CONV2D_FWD:
    case MGT_OP_CONV2D_BWD_DATA:
    case MGT_OP_CONV2D_BWD_FILTER:
        return c->op.prec == MGT_PREC_BF16 ? 0x1p-8 : c->op.prec == MGT_PREC_FP16 ? 0x1p-11 : 0.0;
    default: return 0.0;
    }
}

/* Whether a 16-bit output code g is the reference's e up to the op's fp32 tolerance: the fp32
   value before the rounding may be off by tol, so the rounded one by tol plus the spacing of
   16-bit values at e (both round to nearest). */
static bool code_within(mgt_precision p, uint16_t g, uint16_t e, double tol_rel, double scale)
{
    if (g == e)
        return true;
    double gv = mgt_lowp_decode(p, g), ev = mgt_lowp_decode(p, e);
    if (isnan(gv) || isnan(ev))
        return isnan(gv) && isnan(ev);
    double up =
        fabs((double)mgt_lowp_decode(p, (uint16_t)((e & 0x7fff) == 0x7fff ? e : e + 1)) - ev);
    return fabs(gv - ev) <= tol_rel * (fabs(ev) + scale) + up;
}

/* Compares one device run with the reference: guards intact, IN operands unchanged, written
   operands within tolerance (integers exact). Returns the number of failed operands. */
static int compare_run(const backend *be, const char *opname, int idx, const tcase *c,
                       const refres *rr, const devrun *dr)
{
    int fails = 0;
    double worst = 0.0; /* the largest error over tolerance, for -v */
    for (int i = 0; i < dr->n; i++) {
        if (owner_of(dr->orig, i) != i)
            continue;
        const char *name = dr->ops[i].name;
        size_t cnt = dr->count[i];
        const uint32_t *back = dr->back[i];
        int lines = 0;
        bool bad = false;
        for (size_t k = 0; k < GUARD; k++) {
            if (back[k] != SENTINEL || back[GUARD + cnt + k] != SENTINEL) {
                bool before = back[k] != SENTINEL;
                size_t at = before ? k : GUARD + cnt + k;
                fprintf(stderr,
                        "FAIL %s case %d (%s) on %s: operand %s: guard %s the data "
                        "overwritten at offset %+lld (0x%08" PRIx32 ")\n",
                        opname, idx, c->desc, be->label, name, before ? "before" : "after",
                        before ? (long long)k - GUARD : (long long)(k + 1), back[at]);
                bad = true;
                break;
            }
        }
        mgt_operand_role role = group_role(dr->ops, dr->orig, dr->n, i);
        if (role == MGT_OPERAND_IN) {
            for (size_t k = 0; k < cnt; k++)
                if (back[GUARD + k] != dr->up[i][GUARD + k]) {
                    if (lines++ < MAX_FAIL_LINES)
                        fprintf(stderr,
                                "FAIL %s case %d (%s) on %s: input %s changed at index %zu: "
                                "0x%08" PRIx32 " was 0x%08" PRIx32 "\n",
                                opname, idx, c->desc, be->label, name, k, back[GUARD + k],
                                dr->up[i][GUARD + k]);
                    bad = true;
                }
            fails += bad;
            continue;
        }
        const void *expv = rr->data[i];
        if (dr->ops[i].dtype == MGT_U16) {
            /* 16-bit codes, two to a word: exact, or (an activation stored in 16 bits by an op
               whose fp32 arithmetic is allowed a tolerance) one 16-bit step apart, which is
               where a value within that tolerance rounds to the neighbouring code */
            const uint32_t *e = expv;
            mgt_precision sp = mgt_op_store16(&c->op);
            bool step = c->rtol > 0 && sp != MGT_PREC_F32;
            double scale = c->mag;
            for (size_t k = 0; step && k < dr->ops[i].count; k++) { /* not the padding half */
                double v =
                    fabs((double)mgt_lowp_decode(sp, (uint16_t)(e[k / 2] >> (16 * (k % 2)))));
                if (isfinite(v) && v > scale)
                    scale = v;
            }
            for (size_t k = 0; k < cnt; k++)
                if (back[GUARD + k] != e[k] &&
                    !(step &&
                      code_within(sp, (uint16_t)back[GUARD + k], (uint16_t)e[k], c->rtol, scale) &&
                      code_within(sp, (uint16_t)(back[GUARD + k] >> 16), (uint16_t)(e[k] >> 16),
                                  c->rtol, scale))) {
                    if (lines++ < MAX_FAIL_LINES)
                        fprintf(stderr,
                                "FAIL %s case %d (%s) on %s: operand %s word %zu: got 0x%08" PRIx32
                                " expected 0x%08" PRIx32 "\n",
                                opname, idx, c->desc, be->label, name, k, back[GUARD + k], e[k]);
                    bad = true;
                }
            fails += bad;
            continue;
        }
        if (dr->ops[i].dtype == MGT_I32) {
            const int32_t *e = expv;
            for (size_t k = 0; k < cnt; k++) {
                int32_t g;
                memcpy(&g, &back[GUARD + k], 4);
                if (g != e[k]) {
                    if (lines++ < MAX_FAIL_LINES)
                        fprintf(stderr,
                                "FAIL %s case %d (%s) on %s: operand %s index %zu: got %" PRId32
                                " expected %" PRId32 "\n",
                                opname, idx, c->desc, be->label, name, k, g, e[k]);
                    bad = true;
                }
            }
            fails += bad;
            continue;
        }
        const float *e = expv;
        const double out16 = out16_allowance(be, c);
        double scale = c->mag;
        for (size_t k = 0; k < cnt; k++)
            if (isfinite(e[k]) && fabs(e[k]) > scale)
                scale = fabs(e[k]);
        for (size_t k = 0; k < cnt; k++) {
            uint32_t gb = back[GUARD + k];
            float g = f32_of_bits(gb);
            if (gb == bits_of_f32(e[k]))
                continue;
            /* a NaN's sign and payload are the hardware's (x86's default NaN is negative,
               CUDA's positive): a NaN where the reference has one matches */
            if (isnan(g) && isnan(e[k]) && gb != SENTINEL && bits_of_f32(e[k]) != SENTINEL)
                continue;
            if (bits_of_f32(e[k]) == SENTINEL) {
                if (lines++ < MAX_FAIL_LINES)
                    fprintf(stderr, "FAIL %s case %d (%s): the reference left %s[%zu] unwritten\n",
                            opname, idx, c->desc, name, k);
                bad = true;
                continue;
            }
            double tol = (c->rtol + out16) * (fabs(e[k]) + scale);
            double err = fabs((double)g - e[k]);
            bool ok = isfinite(g) && isfinite(e[k]) && err <= tol;
            if (ok) {
                if (tol > 0 && err / tol > worst)
                    worst = err / tol;
                continue;
            }
            if (lines++ < MAX_FAIL_LINES)
                fprintf(stderr,
                        "FAIL %s case %d (%s) on %s: operand %s index %zu: got %.9g%s "
                        "expected %.9g (tol %.3g)\n",
                        opname, idx, c->desc, be->label, name, k, g,
                        gb == SENTINEL ? " (never written)" : "", e[k], tol);
            bad = true;
        }
        if (lines > MAX_FAIL_LINES)
            fprintf(stderr, "FAIL %s case %d on %s: operand %s: %d mismatches in all\n", opname,
                    idx, be->label, name, lines);
        fails += bad;
    }
    if (verbose || fails)
        printf("%s case %2d on %-16s %-60s %s (max error %.3f of tolerance)\n", opname, idx,
               be->label, c->desc, fails ? "FAILED" : "ok", worst);
    return fails;
}

/* ---- finite differences ---- */

static double fd_loss(const fd_term *t, int nt)
{
    double l = 0;
    for (int j = 0; j < nt; j++)
        for (size_t i = 0; i < t[j].n; i++)
            l += (double)t[j].r[i] * t[j].y[i];
    return l;
}

/* The finite-difference check of a case's part (tcase.fd) on one backend. */
typedef struct fd_ctx {
    backend *be;
    const char *opname;
    int idx;
    tcase *c;    /* owns every array; restored from a snapshot before each forward */
    mgt_op *fwd; /* the forward, over c's arrays */
    const fd_term *terms;
    int nterms;
    float h;
} fd_ctx;

/* Checks grad (the backward's output for x) against (L(x+h) - L(x-h)) / 2h on a sample of
   coordinates, half of them where the gradient is non-zero (for relu and max pool most are
   zero). The tolerance is relative, plus the float rounding of the outputs that the step
   actually changed, divided by the step. */
static int fd_check(const fd_ctx *f, float *x, size_t nx, const float *grad, const char *wrt,
                    rng *r)
{
    tcase *c = f->c;
    void *snap[MAX_ARRAYS];
    for (int i = 0; i < c->narr; i++) {
        snap[i] = malloc(c->len[i] ? c->len[i] * 4 : 1);
        memcpy(snap[i], c->arr[i], c->len[i] * 4);
    }
    size_t ytot = 0;
    for (int j = 0; j < f->nterms; j++)
        ytot += f->terms[j].n;
    float *yplus = malloc((ytot ? ytot : 1) * sizeof *yplus);
    double gmax = 0;
    size_t nonzero = 0;
    for (size_t i = 0; i < nx; i++) {
        gmax = fabs(grad[i]) > gmax ? fabs(grad[i]) : gmax;
        nonzero += grad[i] != 0;
    }
    int fails = 0, nsamp = nx < 12 ? (int)nx : 12;
    double worst = 0;
    for (int s = 0; s < nsamp && !fails; s++) {
        size_t i;
        if (nsamp == (int)nx) {
            i = (size_t)s;
        } else if (s % 2 == 0 && nonzero) {
            size_t pick = rng_u64(r) % nonzero;
            for (i = 0; i < nx; i++)
                if (grad[i] != 0 && pick-- == 0)
                    break;
        } else {
            i = rng_u64(r) % nx;
        }
        double l[2];
        double lch = 0; /* sum of |r*y| over outputs the step changed */
        float xs[2];
        for (int side = 0; side < 2; side++) {
            for (int a = 0; a < c->narr; a++)
                memcpy(c->arr[a], snap[a], c->len[a] * 4);
            xs[side] = side == 0 ? x[i] + f->h : x[i] - f->h;
            x[i] = xs[side];
            const char *what;
            mgt_status st = dev_run_inplace(f->be, f->fwd, &what);
            if (st != MGT_OK) {
                report_status(f->opname, f->idx, c->desc, f->be, what, st);
                fails++;
                break;
            }
            l[side] = fd_loss(f->terms, f->nterms);
            size_t o = 0;
            for (int j = 0; j < f->nterms; j++)
                for (size_t k = 0; k < f->terms[j].n; k++, o++) {
                    float y = f->terms[j].y[k];
                    if (side == 0) {
                        yplus[o] = y;
                    } else if (y != yplus[o]) {
                        double m = fabs(y) > fabs(yplus[o]) ? fabs(y) : fabs(yplus[o]);
                        lch += fabs(f->terms[j].r[k]) * m;
                    }
                }
        }
        if (fails)
            break;
        double step = (double)xs[0] - xs[1];
        double fd = (l[0] - l[1]) / step;
        double g = grad[i];
        double tol = 1e-2 * fabs(g) + 1e-3 * gmax + 8.0 * FLT_EPSILON * lch / step;
        double err = fabs(fd - g);
        if (tol > 0 && err / tol > worst)
            worst = err / tol;
        if (!(err <= tol)) {
            fprintf(stderr,
                    "FAIL %s finite differences case %d (%s) on %s: d/d%s[%zu]: backward "
                    "gives %.7g, central difference %.7g (h %g, tol %.3g)\n",
                    f->opname, f->idx, c->desc, f->be->label, wrt, i, g, fd, (double)f->h, tol);
            fails++;
        }
    }
    for (int a = 0; a < c->narr; a++) {
        memcpy(c->arr[a], snap[a], c->len[a] * 4);
        free(snap[a]);
    }
    free(yplus);
    if (verbose || fails)
        printf("%s fd %2d on %-16s %-54s d/d%-6s %s (max error %.3f of tolerance)\n", f->opname,
               f->idx, f->be->label, c->desc, wrt, fails ? "FAILED" : "ok", worst);
    return fails;
}

/* Runs the backward on the device (its results land in its host arrays). */
static int fd_backward(const fd_ctx *f, mgt_op *bwd)
{
    const char *what;
    mgt_status st = dev_run_inplace(f->be, bwd, &what);
    if (st != MGT_OK) {
        report_status(f->opname, f->idx, f->c->desc, f->be, what, st);
        return 1;
    }
    return 0;
}

/* The skeleton of every finite-difference case, on one backend: the hook before, the forward
   where the backward reads its outputs, the backward op(s), then each input's gradient against
   central differences (the samples drawn by a copy of the case's generator, so every backend
   checks the same coordinates), then the hook after. Returns the failures. */
static int fd_run(backend *be, const char *opname, int t, tcase *c)
{
    fd_part *p = &c->fd;
    fd_ctx f = {be, opname, t, c, &p->fwd, &p->term, 1, p->h};
    if (p->before && p->before(be, opname, t, c))
        return 1;
    if (p->fwd_first) {
        const char *what;
        mgt_status st = dev_run_inplace(be, &p->fwd, &what);
        if (st != MGT_OK) {
            report_status(opname, t, c->desc, be, what, st);
            return 1;
        }
    }
    for (int i = 0; i < p->nbwd; i++)
        if (fd_backward(&f, &p->bwd[i]))
            return 1;
    rng r = p->r;
    int bad = 0;
    for (int i = 0; i < p->nwrt; i++)
        bad += fd_check(&f, p->wrt[i].x, p->wrt[i].n, p->wrt[i].grad, p->wrt[i].name, &r);
    if (!bad && p->after)
        bad = p->after(be, opname, t, c);
    return bad;
}

/* Makes c a finite-difference case whose data comes from (and whose samples continue) the
   generator r; returns its part for fd_ops and fd_wrt_add. */
static fd_part *fd_begin(tcase *c, rng r)
{
    c->fd.r = r;
    return &c->fd;
}

/* The forward, the backward under test (more with f->bwd[f->nbwd++]), whether the backward
   reads the forward's outputs, the loss's one term and the step. */
static void fd_ops(fd_part *f, const mgt_op *fwd, const mgt_op *bwd, bool fwd_first, fd_term term,
                   float h)
{
    f->fwd = *fwd;
    f->bwd[0] = *bwd;
    f->nbwd = 1;
    f->fwd_first = fwd_first;
    f->term = term;
    f->h = h;
}

/* An input x [n] of the forward and the gradient the backward writes for it. */
static void fd_wrt_add(fd_part *f, float *x, size_t n, const float *grad, const char *name)
{
    f->wrt[f->nwrt++] = (fd_wrt){x, n, grad, name};
}

/* ---- case generators: one per op; false once idx runs past the op's cases ---- */

typedef bool (*gen_fn)(tcase *c, int idx, rng *r);

static const size_t vec_sizes[] = {1, 2, 7, 33, 1000, 4097, 65539, 100003, 5, 256, 999, 12345};
#define N_VEC_SIZES (sizeof vec_sizes / sizeof vec_sizes[0])

static bool gen_fill(tcase *c, int idx, rng *r)
{
    if (idx >= (int)N_VEC_SIZES)
        return false;
    size_t n = vec_sizes[idx];
    float v = idx == 2 ? 0.0f : idx == 5 ? -INFINITY : rng_unif(r, -3, 3);
    c->op.kind = MGT_OP_FILL;
    c->op.u.fill.x = case_f32(c, n);
    c->op.u.fill.value = v;
    c->op.u.fill.n = n;
    c->rtol = 0;
    case_desc(c, "n=%zu value=%g", n, (double)v);
    return true;
}

static bool gen_scale(tcase *c, int idx, rng *r)
{
    static const float alphas[] = {0.0f, -1.0f, 0.5f, 3.75f, 1e-3f, 1.0f};
    if (idx >= (int)N_VEC_SIZES)
        return false;
    size_t n = vec_sizes[idx];
    float a = alphas[idx % 6];
    c->op.kind = MGT_OP_SCALE;
    c->op.u.scale.x = case_f32(c, n);
    fill_unif(r, c->op.u.scale.x, n, -2, 2);
    c->op.u.scale.alpha = a;
    c->op.u.scale.n = n;
    c->rtol = 1e-6;
    case_desc(c, "n=%zu alpha=%g", n, (double)a);
    return true;
}

static bool gen_axpy(tcase *c, int idx, rng *r)
{
    static const float alphas[] = {1.0f, 0.0f, -0.5f, 2.25f, -3.0f, 1e-2f};
    if (idx >= (int)N_VEC_SIZES)
        return false;
    size_t n = vec_sizes[idx];
    float a = alphas[idx % 6];
    c->op.kind = MGT_OP_AXPY;
    c->op.u.axpy.y = case_f32(c, n);
    c->op.u.axpy.x = case_f32(c, n);
    fill_unif(r, c->op.u.axpy.y, n, -2, 2);
    fill_unif(r, (float *)c->op.u.axpy.x, n, -2, 2);
    c->op.u.axpy.alpha = a;
    c->op.u.axpy.n = n;
    c->rtol = 2e-6;
    case_desc(c, "n=%zu alpha=%g", n, (double)a);
    return true;
}

static bool sum_plain(tcase *c, int idx, rng *r)
{
    static const size_t ns[] = {1, 2, 17, 1000, 65537, 300007, 4096, 77, 123457, 3};
    if (idx >= 10)
        return false;
    size_t n = ns[idx];
    float *x = case_f32(c, n);
    /* one case with a large common offset, where a naive float accumulator drifts */
    float off = idx == 6 ? 100.0f : 0.0f;
    fill_unif(r, x, n, off - 1, off + 1);
    double mag = 0;
    for (size_t i = 0; i < n; i++)
        mag += fabs(x[i]);
    c->op.kind = MGT_OP_SUM;
    c->op.u.sum.out = case_f32(c, 1);
    c->op.u.sum.x = x;
    c->op.u.sum.n = n;
    /* relative to the sum of |x|: what pairwise or blocked float sums keep to, and what a
       single float accumulator (the offset case) does not */
    c->rtol = 1e-6;
    c->mag = mag;
    case_desc(c, "n=%zu offset=%g", n, (double)off);
    return true;
}

static bool sum_squares(tcase *c, int idx, rng *r)
{
    static const size_t ns[] = {1, 2, 17, 1000, 65537, 300007, 4096, 77};
    if (idx >= 8)
        return false;
    size_t n = ns[idx];
    float *x = case_f32(c, n);
    /* one case of large values, whose squares a float accumulator would round away */
    float half = idx == 6 ? 100.0f : 1.0f;
    fill_unif(r, x, n, -half, half);
    double mag = 0;
    for (size_t i = 0; i < n; i++)
        mag += (double)x[i] * x[i];
    c->op.kind = MGT_OP_SUMSQ;
    c->op.u.sum.out = case_f32(c, 1);
    c->op.u.sum.x = x;
    c->op.u.sum.n = n;
    c->rtol = 1e-6;
    c->mag = mag;
    case_desc(c, "n=%zu range=+-%g", n, (double)half);
    return true;
}

/* sum and sum_squares */
static bool gen_sum(tcase *c, int idx, rng *r)
{
    return c->op.kind == MGT_OP_SUMSQ ? sum_squares(c, idx, r) : sum_plain(c, idx, r);
}

static bool gen_add(tcase *c, int idx, rng *r)
{
    if (idx >= (int)N_VEC_SIZES)
        return false;
    size_t n = vec_sizes[idx];
    float *a = case_f32(c, n), *b = case_f32(c, n);
    fill_unif(r, a, n, -2, 2);
    fill_unif(r, b, n, -2, 2);
    int alias = idx % 4; /* 0 none, 1 y == a, 2 y == b, 3 a == b */
    c->op.kind = MGT_OP_ADD;
    c->op.u.add.y = alias == 1 ? a : alias == 2 ? b : case_f32(c, n);
    c->op.u.add.a = a;
    c->op.u.add.b = alias == 3 ? a : b;
    c->op.u.add.n = n;
    c->rtol = 1e-6;
    static const char *const an[] = {"", " y=a", " y=b", " a=b"};
    case_desc(c, "n=%zu%s", n, an[alias]);
    return true;
}

/* The stored size of a matrix of `rows` rows `ld` apart. */
static size_t mat_len(int rows, int ld) { return (size_t)rows * ld; }

static void gemm_setup(tcase *c, rng *r, bool ta, bool tb, int m, int n, int k, int pad,
                       float alpha, float beta)
{
    int a_rows = ta ? k : m, a_row = ta ? m : k;
    int b_rows = tb ? n : k, b_row = tb ? k : n;
    int lda = a_row + pad, ldb = b_row + (pad ? pad + 1 : 0), ldc = n + (pad ? pad + 2 : 0);
    float *a = case_f32(c, mat_len(a_rows, lda));
    float *b = case_f32(c, mat_len(b_rows, ldb));
    float *cc = case_f32(c, mat_len(m, ldc));
    fill_unif(r, a, mat_len(a_rows, lda), -1, 1);
    fill_unif(r, b, mat_len(b_rows, ldb), -1, 1);
    fill_unif(r, cc, mat_len(m, ldc), -1, 1);
    c->op.kind = MGT_OP_GEMM;
    c->op.u.gemm.trans_a = ta;
    c->op.u.gemm.trans_b = tb;
    c->op.u.gemm.m = m;
    c->op.u.gemm.n = n;
    c->op.u.gemm.k = k;
    c->op.u.gemm.alpha = alpha;
    c->op.u.gemm.a = a;
    c->op.u.gemm.lda = lda;
    c->op.u.gemm.b = b;
    c->op.u.gemm.ldb = ldb;
    c->op.u.gemm.beta = beta;
    c->op.u.gemm.c = cc;
    c->op.u.gemm.ldc = ldc;
    c->rtol = tol_for(k);
    case_desc(c, "%c%c m=%d n=%d k=%d lda=%d ldb=%d ldc=%d alpha=%g beta=%g", ta ? 'T' : 'N',
              tb ? 'T' : 'N', m, n, k, lda, ldb, ldc, (double)alpha, (double)beta);
}

#define N_GEMM_CASES 20

static bool gemm_case(tcase *c, int idx, rng *r)
{
    static const int shapes[][3] = {{1, 1, 1},   {1, 7, 5},   {13, 1, 9},   {17, 19, 23},
                                    {64, 33, 1}, {5, 3, 130}, {31, 47, 64}, {40, 24, 17}};
    static const float betas[] = {0.0f, 1.0f, 0.5f};
    if (idx >= N_GEMM_CASES)
        return false;
    bool ta = idx & 1, tb = (idx >> 1) & 1;
    int m, n, k;
    if (idx < 16) {
        m = shapes[idx / 2 % 8][0];
        n = shapes[idx / 2 % 8][1];
        k = shapes[idx / 2 % 8][2];
    } else {
        m = rng_int(r, 1, 70);
        n = rng_int(r, 1, 70);
        k = rng_int(r, 1, 90);
    }
    int pad = (idx / 4) % 2 ? rng_int(r, 1, 5) : 0;
    float alpha = idx % 5 == 0 ? -0.75f : idx % 7 == 3 ? 2.0f : 1.0f;
    gemm_setup(c, r, ta, tb, m, n, k, pad, alpha, betas[idx % 3]);
    return true;
}

/* n, c, h, w, k, r, s, stride h/w, pad h/w, groups */
static const int conv_shapes[][12] = {
    {1, 3, 7, 5, 4, 3, 3, 1, 1, 1, 1, 1},    /* batch 1, non-square image */
    {2, 5, 10, 9, 7, 3, 3, 2, 2, 1, 1, 1},   /* stride 2, uncovered last row */
    {3, 4, 6, 11, 6, 1, 1, 1, 1, 0, 0, 1},   /* 1x1 */
    {2, 6, 8, 7, 4, 3, 1, 1, 2, 1, 0, 2},    /* 3x1 filter, groups 2, mixed stride */
    {1, 5, 10, 12, 5, 3, 3, 1, 1, 1, 1, 5},  /* depthwise */
    {2, 8, 9, 7, 8, 3, 3, 2, 2, 1, 1, 8},    /* depthwise, stride 2 */
    {2, 13, 5, 6, 9, 5, 3, 1, 1, 2, 1, 1},   /* 5x3 filter, 13 channels */
    {2, 3, 12, 11, 16, 7, 7, 2, 2, 3, 3, 1}, /* a ResNet stem in small */
    {1, 12, 6, 6, 18, 3, 3, 1, 1, 0, 0, 3},  /* groups 3, no padding */
    {2, 16, 7, 7, 16, 3, 3, 1, 1, 1, 1, 1},  /* a ResNet block's conv in small */
    {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1},    /* everything 1 */
    {3, 2, 4, 9, 3, 2, 4, 2, 3, 1, 2, 1},    /* even filter, stride 3 */
    {2, 10, 9, 9, 15, 2, 2, 2, 2, 0, 0, 5},  /* 2x2 stride 2, groups 5 */
};
#define N_CONV_SHAPES ((int)(sizeof conv_shapes / sizeof conv_shapes[0]))

static void conv_random(rng *r, mgt_conv2d_shape *sh)
{
    *sh = (mgt_conv2d_shape){0};
    int kind = rng_int(r, 0, 3);
    if (kind == 3) {
        sh->groups = rng_int(r, 1, 9);
        sh->c = sh->k = sh->groups;
    } else {
        sh->groups = kind + 1;
        sh->c = sh->groups * rng_int(r, 1, 5);
        sh->k = sh->groups * rng_int(r, 1, 5);
    }
    sh->n = rng_int(r, 1, 4);
    sh->r = rng_int(r, 1, 5);
    sh->s = rng_int(r, 1, 5);
    sh->pad_h = rng_int(r, 0, sh->r - 1);
    sh->pad_w = rng_int(r, 0, sh->s - 1);
    sh->h = rng_int(r, sh->r - 2 * sh->pad_h > 1 ? sh->r - 2 * sh->pad_h : 1, 13);
    sh->w = rng_int(r, sh->s - 2 * sh->pad_w > 1 ? sh->s - 2 * sh->pad_w : 1, 13);
    sh->stride_h = rng_int(r, 1, 3);
    sh->stride_w = rng_int(r, 1, 3);
}

/* Convolutions on activations kept in nChw16c (mgt_layout): both sides, a stem's NCHW input,
   an NCHW output, a stride, several blocks, depthwise ones. Cases N_CONV_SHAPES + 4 on; the backends that keep NCHW skip them. */
static const int conv_blocked_shapes[][14] = {
    {2, 16, 9, 9, 32, 3, 3, 1, 1, 1, 1, 1, MGT_LAYOUT_NCHW16C, MGT_LAYOUT_NCHW16C},
    {3, 1, 12, 12, 16, 3, 3, 1, 1, 1, 1, 1, MGT_LAYOUT_NCHW, MGT_LAYOUT_NCHW16C},
    {2, 32, 8, 8, 16, 1, 1, 2, 2, 0, 0, 1, MGT_LAYOUT_NCHW16C, MGT_LAYOUT_NCHW},
    {1, 48, 5, 7, 16, 3, 3, 2, 1, 1, 1, 1, MGT_LAYOUT_NCHW16C, MGT_LAYOUT_NCHW16C},
    /* more than 16 channels on both sides: oneDNN's bf16 kernels take and give NHWC, so
       every operand is reordered to and from nChw16c, the output set (beta 0: cases 21 and 24
       of the 16-bit variants, bf16) or added (beta 1: case 25, bf16, several images per chunk); 22
       and 23 are fp16 */
    {2, 32, 6, 6, 32, 3, 3, 1, 1, 1, 1, 1, MGT_LAYOUT_NCHW16C, MGT_LAYOUT_NCHW16C},
    {5, 32, 7, 5, 48, 3, 3, 1, 1, 1, 1, 1, MGT_LAYOUT_NCHW16C, MGT_LAYOUT_NCHW16C},
    {3, 48, 4, 6, 32, 1, 1, 1, 1, 0, 0, 1, MGT_LAYOUT_NCHW16C, MGT_LAYOUT_NCHW16C},
    {4, 64, 5, 5, 32, 3, 3, 1, 1, 1, 1, 1, MGT_LAYOUT_NCHW16C, MGT_LAYOUT_NCHW16C},
    {5, 32, 7, 5, 48, 3, 3, 1, 1, 1, 1, 1, MGT_LAYOUT_NCHW16C, MGT_LAYOUT_NCHW16C},
    /* depthwise (groups = channels = filters: oneDNN's depthwise kernels), as MobileNet's and
       EfficientNet's 3x3 and 5x5, stride 1 and 2 */
    {2, 32, 9, 9, 32, 3, 3, 1, 1, 1, 1, 32, MGT_LAYOUT_NCHW16C, MGT_LAYOUT_NCHW16C},
    {3, 16, 10, 8, 16, 3, 3, 2, 2, 1, 1, 16, MGT_LAYOUT_NCHW16C, MGT_LAYOUT_NCHW16C},
    {2, 48, 7, 7, 48, 5, 5, 1, 1, 2, 2, 48, MGT_LAYOUT_NCHW16C, MGT_LAYOUT_NCHW16C},
    {1, 32, 11, 11, 32, 5, 5, 2, 2, 2, 2, 32, MGT_LAYOUT_NCHW16C, MGT_LAYOUT_NCHW16C},
    /* a small input's last stages: fewer pixels than taps */
    {3, 16, 2, 2, 16, 5, 5, 2, 2, 2, 2, 16, MGT_LAYOUT_NCHW16C, MGT_LAYOUT_NCHW16C},
    {2, 32, 1, 1, 32, 5, 5, 1, 1, 2, 2, 32, MGT_LAYOUT_NCHW16C, MGT_LAYOUT_NCHW16C},
    {2, 16, 3, 3, 16, 5, 5, 1, 1, 2, 2, 16, MGT_LAYOUT_NCHW16C, MGT_LAYOUT_NCHW16C},
};
#define N_CONV_BLOCKED ((int)(sizeof conv_blocked_shapes / sizeof conv_blocked_shapes[0]))

static void conv_shape_of(int idx, rng *r, mgt_conv2d_shape *sh)
{
    bool blocked = idx >= N_CONV_SHAPES + 4;
    if (idx >= N_CONV_SHAPES && !blocked) {
        conv_random(r, sh);
        return;
    }
    const int *v = blocked ? conv_blocked_shapes[idx - N_CONV_SHAPES - 4] : conv_shapes[idx];
    *sh = (mgt_conv2d_shape){.n = v[0],
                             .c = v[1],
                             .h = v[2],
                             .w = v[3],
                             .k = v[4],
                             .r = v[5],
                             .s = v[6],
                             .stride_h = v[7],
                             .stride_w = v[8],
                             .pad_h = v[9],
                             .pad_w = v[10],
                             .groups = v[11]};
    if (blocked) {
        sh->x_layout = (mgt_layout)v[12];
        sh->y_layout = (mgt_layout)v[13];
    }
}

static size_t conv_x_len(const mgt_conv2d_shape *sh)
{
    return (size_t)sh->n * sh->c * sh->h * sh->w;
}

static size_t conv_y_len(const mgt_conv2d_shape *sh)
{
    return (size_t)sh->n * sh->k * mgt_conv2d_out_h(sh) * mgt_conv2d_out_w(sh);
}

static size_t conv_w_len(const mgt_conv2d_shape *sh)
{
    return (size_t)sh->k * (sh->c / sh->groups) * sh->r * sh->s;
}

static void conv_desc(tcase *c, const mgt_conv2d_shape *sh, float beta)
{
    case_desc(c, "n=%d c=%d %dx%d k=%d %dx%d s=%d,%d p=%d,%d g=%d beta=%g%s%s", sh->n, sh->c, sh->h,
              sh->w, sh->k, sh->r, sh->s, sh->stride_h, sh->stride_w, sh->pad_h, sh->pad_w,
              sh->groups, (double)beta, sh->x_layout ? " x=nChw16c" : "",
              sh->y_layout ? " y=nChw16c" : "");
}

#define N_CONV_CASES (N_CONV_SHAPES + 4 + N_CONV_BLOCKED)

static bool gen_conv(tcase *c, int idx, rng *r, mgt_op_kind kind)
{
    if (idx >= N_CONV_CASES)
        return false;
    mgt_conv2d_shape sh;
    conv_shape_of(idx, r, &sh);
    static const float betas[] = {0.0f, 1.0f, 0.5f};
    float beta = betas[idx % 3];
    size_t nx = conv_x_len(&sh), ny = conv_y_len(&sh), nw = conv_w_len(&sh);
    size_t nout = kind == MGT_OP_CONV2D_FWD ? ny : kind == MGT_OP_CONV2D_BWD_DATA ? nx : nw;
    size_t nin1 = kind == MGT_OP_CONV2D_FWD ? nx : ny;
    size_t nin2 = kind == MGT_OP_CONV2D_BWD_FILTER ? nx : nw;
    float *out = case_f32(c, nout), *in1 = case_f32(c, nin1), *in2 = case_f32(c, nin2);
    fill_unif(r, out, nout, -1, 1);
    fill_unif(r, in1, nin1, -1, 1);
    fill_unif(r, in2, nin2, -1, 1);
    c->op.kind = kind;
    c->op.u.conv.out = out;
    c->op.u.conv.in1 = in1;
    c->op.u.conv.in2 = in2;
    c->op.u.conv.sh = sh;
    c->op.u.conv.beta = beta;
    int cpg = sh.c / sh.groups, kpg = sh.k / sh.groups;
    double red = kind == MGT_OP_CONV2D_FWD        ? (double)cpg * sh.r * sh.s
                 : kind == MGT_OP_CONV2D_BWD_DATA ? (double)kpg * sh.r * sh.s
                                                  : (double)ny / sh.k;
    c->rtol = tol_for(red);
    conv_desc(c, &sh, beta);
    return true;
}

/* A variant of an op (a precision, mixed labels) is a parameter of it, not an op of its own:
   its cases follow the op's plain ones, case `idx` of the variant seeded by the name it had as
   an op of its own (`seed`), so that each keeps the data it had then. */
static rng variant_rng(const char *seed, int idx) { return rng_for(op_seed(seed), idx, 0); }

static bool gen_lowp(tcase *c, int idx, mgt_op_kind kind, const char *seed);

/* Gemm: C = alpha op(A) op(B) with loss weights R [m,n]; the gradients for A and B as stored
   are themselves gemms, run on the same device:
     dA = alpha R op(B)^T (or its transpose when A is stored transposed),
     dB = alpha op(A)^T R (or its transpose when B is stored transposed). */
static bool fd_gemm(tcase *c, int t)
{
    static const int shapes[][3] = {{3, 4, 5}, {7, 2, 9}, {1, 5, 3}, {6, 6, 1}};
    if (t >= 8)
        return false;
    fd_part *f = fd_begin(c, rng_for(800, t, 7));
    rng *r = &f->r;
    bool ta = t & 1, tb = (t >> 1) & 1;
    int m = shapes[t % 4][0], n = shapes[t % 4][1], k = shapes[t % 4][2];
    int pad = t >= 4 ? 2 : 0;
    float alpha = t % 3 == 0 ? -0.5f : 1.5f;
    int a_rows = ta ? k : m, lda = (ta ? m : k) + pad;
    int b_rows = tb ? n : k, ldb = (tb ? k : n) + pad;
    size_t na = mat_len(a_rows, lda), nb = mat_len(b_rows, ldb), ncm = mat_len(m, n);
    float *a = case_f32(c, na), *b = case_f32(c, nb), *cm = case_f32(c, ncm);
    float *rw = case_f32(c, ncm), *da = case_f32(c, na), *db = case_f32(c, nb);
    fill_unif(r, a, na, -1, 1);
    fill_unif(r, b, nb, -1, 1);
    fill_unif(r, rw, ncm, -1, 1);
    case_desc(c, "%c%c m=%d n=%d k=%d lda=%d ldb=%d alpha=%g", ta ? 'T' : 'N', tb ? 'T' : 'N', m, n,
              k, lda, ldb, (double)alpha);
    mgt_op fwd = {.kind = MGT_OP_GEMM};
    fwd.u.gemm =
        (mgt_gemm_args){ta, tb, m, n, k, alpha, a, lda, b, ldb, 0, cm, n, false, false, false};
    mgt_op ga = {.kind = MGT_OP_GEMM}, gb = {.kind = MGT_OP_GEMM};
    if (!ta) /* dA [m,k] = alpha R op(B)^T */
        ga.u.gemm = (mgt_gemm_args){false, !tb, m, k,  n,   alpha, rw,    n,
                                    b,     ldb, 0, da, lda, false, false, false};
    else /* dA [k,m] = alpha op(B) R^T */
        ga.u.gemm = (mgt_gemm_args){tb, true, k, m,  n,   alpha, b,     ldb,
                                    rw, n,    0, da, lda, false, false, false};
    if (!tb) /* dB [k,n] = alpha op(A)^T R */
        gb.u.gemm = (mgt_gemm_args){!ta, false, k, n,  m,   alpha, a,     lda,
                                    rw,  n,     0, db, ldb, false, false, false};
    else /* dB [n,k] = alpha R^T op(A) */
        gb.u.gemm = (mgt_gemm_args){true, ta,  n, k,  m,   alpha, rw,    n,
                                    a,    lda, 0, db, ldb, false, false, false};
    fd_ops(f, &fwd, &ga, false, (fd_term){cm, rw, ncm}, 1e-2f);
    f->bwd[f->nbwd++] = gb;
    fd_wrt_add(f, a, na, da, "a");
    fd_wrt_add(f, b, nb, db, "b");
    return true;
}

static bool gen_gemm(tcase *c, int idx, rng *r)
{
    if (idx < N_GEMM_CASES)
        return gemm_case(c, idx, r);
    idx -= N_GEMM_CASES;
    return gen_lowp(c, idx, MGT_OP_GEMM, "gemm_lp") || fd_gemm(c, idx - N_GEMM_CASES);
}

/* Conv: y = conv(x, w); dx from backward data, dw from backward filter, both with dy = r. */
static bool fd_conv(tcase *c, int t, bool filter)
{
    static const int pick[] = {0, 1, 3, 4, 6, 11, 12};
    if (t >= (int)(sizeof pick / sizeof pick[0]))
        return false;
    fd_part *f = fd_begin(c, rng_for(100 + filter, t, 7));
    rng *r = &f->r;
    mgt_conv2d_shape sh;
    conv_shape_of(pick[t], r, &sh);
    size_t nx = conv_x_len(&sh), ny = conv_y_len(&sh), nw = conv_w_len(&sh);
    float *x = case_f32(c, nx), *w = case_f32(c, nw), *y = case_f32(c, ny);
    float *rw = case_f32(c, ny), *g = case_f32(c, filter ? nw : nx);
    fill_unif(r, x, nx, -1, 1);
    fill_unif(r, w, nw, -1, 1);
    fill_unif(r, rw, ny, -1, 1);
    conv_desc(c, &sh, 0);
    mgt_op fwd = {.kind = MGT_OP_CONV2D_FWD};
    fwd.u.conv.out = y;
    fwd.u.conv.in1 = x;
    fwd.u.conv.in2 = w;
    fwd.u.conv.sh = sh;
    mgt_op bwd = {.kind = filter ? MGT_OP_CONV2D_BWD_FILTER : MGT_OP_CONV2D_BWD_DATA};
    bwd.u.conv.out = g;
    bwd.u.conv.in1 = rw;
    bwd.u.conv.in2 = filter ? x : w;
    bwd.u.conv.sh = sh;
    fd_ops(f, &fwd, &bwd, false, (fd_term){y, rw, ny}, 1e-2f);
    if (filter)
        fd_wrt_add(f, w, nw, g, "w");
    else
        fd_wrt_add(f, x, nx, g, "x");
    return true;
}

/* The three passes (the kind the driver set), fp32 then bf16 and fp16; the backward ones then
   their finite differences. */
static bool gen_conv2d(tcase *c, int idx, rng *r)
{
    mgt_op_kind kind = c->op.kind;
    if (idx < N_CONV_CASES)
        return gen_conv(c, idx, r, kind);
    idx -= N_CONV_CASES;
    const char *seed = kind == MGT_OP_CONV2D_FWD        ? "conv2d_forward_lp"
                       : kind == MGT_OP_CONV2D_BWD_DATA ? "conv2d_backward_data_lp"
                                                        : "conv2d_backward_filter_lp";
    if (gen_lowp(c, idx, kind, seed))
        return true;
    return kind != MGT_OP_CONV2D_FWD &&
           fd_conv(c, idx - N_CONV_CASES, kind == MGT_OP_CONV2D_BWD_FILTER);
}

/* n, c, hw; n*hw > 1 as the training forward requires */
static const int bn_shapes[][3] = {{1, 3, 7},  {2, 5, 1},   {4, 13, 9}, {3, 16, 49},
                                   {8, 7, 3},  {2, 1, 100}, {5, 9, 4},  {1, 17, 25},
                                   {16, 3, 1}, {2, 64, 16}, {3, 2, 2},  {1, 6, 2}};
#define N_BN_SHAPES ((int)(sizeof bn_shapes / sizeof bn_shapes[0]))

/* n, c, hw of the cases in nChw16c, after the NCHW ones (train, eval and backward only: the
   synchronised halves take NCHW) */
static const int bn_blocked_shapes[][3] = {{4, 16, 9}, {2, 32, 25}, {5, 48, 1}, {9, 16, 70}};
#define N_BN_BLOCKED ((int)(sizeof bn_blocked_shapes / sizeof bn_blocked_shapes[0]))

/* n, c, hw, blocked of the cases with a folded ReLU, last (train, eval and backward only);
   blocked 2: with a fused residual add too (the mock devices' nChw16c kernels, as plan_fusion
   folds a ResNet block's last batch norm there) */
static const int bn_relu_shapes[][4] = {{4, 13, 9, 0},  {3, 16, 49, 0}, {1, 6, 2, 0},
                                        {2, 32, 25, 1}, {9, 16, 70, 1}, {2, 32, 25, 2},
                                        {9, 16, 70, 2}, {3, 48, 13, 2}};
#define N_BN_RELU ((int)(sizeof bn_relu_shapes / sizeof bn_relu_shapes[0]))
#define N_BN_CASES (N_BN_SHAPES + 3 + N_BN_BLOCKED + N_BN_RELU)

static void bn_residual_add(tcase *c);

/* Whether case idx of the batch-norm kinds has a fused residual add. */
static bool bn_case_residual(int idx)
{
    return idx >= N_BN_SHAPES + 3 + N_BN_BLOCKED && idx < N_BN_CASES &&
           bn_relu_shapes[idx - N_BN_SHAPES - 3 - N_BN_BLOCKED][3] == 2;
}

static void bn_shape_of(int idx, rng *r, mgt_bn_shape *sh)
{
    sh->layout = MGT_LAYOUT_NCHW;
    sh->relu = false;
    if (idx >= N_BN_SHAPES + 3 + N_BN_BLOCKED) {
        const int *t = bn_relu_shapes[idx - N_BN_SHAPES - 3 - N_BN_BLOCKED];
        sh->n = t[0];
        sh->c = t[1];
        sh->hw = t[2];
        sh->layout = t[3] ? MGT_LAYOUT_NCHW16C : MGT_LAYOUT_NCHW;
        sh->relu = true;
    } else if (idx >= N_BN_SHAPES + 3) {
        sh->n = bn_blocked_shapes[idx - N_BN_SHAPES - 3][0];
        sh->c = bn_blocked_shapes[idx - N_BN_SHAPES - 3][1];
        sh->hw = bn_blocked_shapes[idx - N_BN_SHAPES - 3][2];
        sh->layout = MGT_LAYOUT_NCHW16C;
    } else if (idx < N_BN_SHAPES) {
        sh->n = bn_shapes[idx][0];
        sh->c = bn_shapes[idx][1];
        sh->hw = bn_shapes[idx][2];
    } else {
        sh->n = rng_int(r, 1, 9);
        sh->c = rng_int(r, 1, 20);
        sh->hw = rng_int(r, 2, 40);
    }
    sh->eps = idx % 4 == 3 ? 1e-3f : 1e-5f;
    sh->momentum = idx % 3 == 2 ? 0.3f : 0.1f;
}

/* Per-channel offsets and spreads, so the mean is not ~0 and the variance not ~1. */
static void fill_bn_x(rng *r, float *x, const mgt_bn_shape *sh)
{
    for (int ch = 0; ch < sh->c; ch++) {
        float mu = rng_unif(r, -3, 3), sd = rng_unif(r, 0.5f, 2.0f);
        for (int n = 0; n < sh->n; n++)
            for (int i = 0; i < sh->hw; i++)
                x[mgt_layout_at(sh->layout, sh->c, sh->hw, n, ch, i)] =
                    mu + sd * rng_unif(r, -1.7f, 1.7f);
    }
}

static void bn_desc(tcase *c, const mgt_bn_shape *sh)
{
    case_desc(c, "n=%d c=%d hw=%d eps=%g momentum=%g%s%s", sh->n, sh->c, sh->hw, (double)sh->eps,
              (double)sh->momentum, sh->layout ? " nChw16c" : "", sh->relu ? " relu" : "");
}

static bool gen_bn_train(tcase *c, int idx, rng *r)
{
    if (idx >= N_BN_CASES)
        return false;
    mgt_bn_shape sh;
    bn_shape_of(idx, r, &sh);
    size_t nx = (size_t)sh.n * sh.c * sh.hw;
    c->op.kind = MGT_OP_BN_FWD_TRAIN;
    mgt_bn_train_args *b = &c->op.u.bn_train;
    b->y = case_f32(c, nx);
    b->save_mean = case_f32(c, sh.c);
    b->save_invstd = case_f32(c, sh.c);
    b->running_mean = case_f32(c, sh.c);
    b->running_var = case_f32(c, sh.c);
    float *x = case_f32(c, nx), *gamma = case_f32(c, sh.c), *beta = case_f32(c, sh.c);
    fill_bn_x(r, x, &sh);
    fill_unif(r, gamma, sh.c, -1.5f, 1.5f);
    fill_unif(r, beta, sh.c, -1, 1);
    fill_unif(r, b->running_mean, sh.c, -1, 1);
    fill_unif(r, b->running_var, sh.c, 0.5f, 2);
    b->x = x;
    b->gamma = gamma;
    b->beta = beta;
    b->sh = sh;
    c->rtol = tol_for((double)sh.n * sh.hw) * 4;
    bn_desc(c, &sh);
    if (bn_case_residual(idx))
        bn_residual_add(c);
    return true;
}

static bool gen_bn_eval(tcase *c, int idx, rng *r)
{
    if (idx >= N_BN_CASES)
        return false;
    mgt_bn_shape sh;
    bn_shape_of(idx, r, &sh);
    size_t nx = (size_t)sh.n * sh.c * sh.hw;
    c->op.kind = MGT_OP_BN_FWD_EVAL;
    mgt_bn_eval_args *b = &c->op.u.bn_eval;
    float *x = case_f32(c, nx), *gamma = case_f32(c, sh.c), *beta = case_f32(c, sh.c);
    float *rm = case_f32(c, sh.c), *rv = case_f32(c, sh.c);
    b->y = case_f32(c, nx);
    fill_bn_x(r, x, &sh);
    fill_unif(r, gamma, sh.c, -1.5f, 1.5f);
    fill_unif(r, beta, sh.c, -1, 1);
    fill_unif(r, rm, sh.c, -3, 3);
    fill_unif(r, rv, sh.c, 0.1f, 3);
    b->x = x;
    b->gamma = gamma;
    b->beta = beta;
    b->running_mean = rm;
    b->running_var = rv;
    b->sh = sh;
    c->rtol = 4e-6;
    bn_desc(c, &sh);
    if (bn_case_residual(idx))
        bn_residual_add(c);
    return true;
}

/* The statistics a training forward would save for x, computed here in double. */
static void bn_stats(const float *x, const mgt_bn_shape *sh, float *mean, float *invstd)
{
    double m = (double)sh->n * sh->hw;
    for (int ch = 0; ch < sh->c; ch++) {
        double s = 0, ss = 0;
        for (int n = 0; n < sh->n; n++)
            for (int i = 0; i < sh->hw; i++)
                s += x[mgt_layout_at(sh->layout, sh->c, sh->hw, n, ch, i)];
        double mu = s / m;
        for (int n = 0; n < sh->n; n++)
            for (int i = 0; i < sh->hw; i++) {
                double d = x[mgt_layout_at(sh->layout, sh->c, sh->hw, n, ch, i)] - mu;
                ss += d * d;
            }
        mean[ch] = (float)mu;
        invstd[ch] = (float)(1.0 / sqrt(ss / m + sh->eps));
    }
}

/* A ReLU's kink is no place for a difference: the loss leaves out the values that a step of h
   in x, gamma or beta (moving them by up to about 3h) could carry across zero. */
static int fd_bn_relu_kink(backend *be, const char *opname, int t, tcase *c)
{
    mgt_op fwd = c->fd.fwd;
    float *y = fwd.u.bn_train.y, *rw = (float *)c->fd.term.r;
    fwd.u.bn_train.sh.relu = false;
    const char *what;
    mgt_status st = dev_run_inplace(be, &fwd, &what);
    if (st != MGT_OK) {
        report_status(opname, t, c->desc, be, what, st);
        return 1;
    }
    for (size_t i = 0; i < c->fd.term.n; i++)
        if (fabsf(y[i]) < 5 * c->fd.h)
            rw[i] = 0.0f;
    return 0;
}

/* Batch norm: the training forward, then the backward with dy = r from the forward's saved
   statistics; the gradients for x, gamma and beta. */
static bool fd_bn(tcase *c, int t)
{
    /* the last two: a folded ReLU, NCHW (the loss then sees relu(bn(x))) */
    static const int pick[] = {
        0, 2, 4, 7, 10, N_BN_SHAPES + 3 + N_BN_BLOCKED, N_BN_SHAPES + 4 + N_BN_BLOCKED};
    if (t >= (int)(sizeof pick / sizeof pick[0]))
        return false;
    fd_part *f = fd_begin(c, rng_for(200, t, 7));
    rng *r = &f->r;
    mgt_bn_shape sh;
    bn_shape_of(pick[t], r, &sh);
    size_t nx = (size_t)sh.n * sh.c * sh.hw;
    float *x = case_f32(c, nx), *gamma = case_f32(c, sh.c), *beta = case_f32(c, sh.c);
    float *y = case_f32(c, nx), *mean = case_f32(c, sh.c), *invstd = case_f32(c, sh.c);
    float *rm = case_f32(c, sh.c), *rv = case_f32(c, sh.c), *rw = case_f32(c, nx);
    float *dx = case_f32(c, nx), *dgamma = case_f32(c, sh.c), *dbeta = case_f32(c, sh.c);
    fill_bn_x(r, x, &sh);
    fill_unif(r, gamma, sh.c, -1.5f, 1.5f);
    fill_unif(r, beta, sh.c, -1, 1);
    fill_unif(r, rv, sh.c, 0.5f, 2);
    fill_unif(r, rw, nx, -1, 1);
    bn_desc(c, &sh);
    mgt_op fwd = {.kind = MGT_OP_BN_FWD_TRAIN};
    fwd.u.bn_train.y = y;
    fwd.u.bn_train.save_mean = mean;
    fwd.u.bn_train.save_invstd = invstd;
    fwd.u.bn_train.running_mean = rm;
    fwd.u.bn_train.running_var = rv;
    fwd.u.bn_train.x = x;
    fwd.u.bn_train.gamma = gamma;
    fwd.u.bn_train.beta = beta;
    fwd.u.bn_train.sh = sh;
    mgt_op bwd = {.kind = MGT_OP_BN_BWD};
    bwd.u.bn_bwd.dx = dx;
    bwd.u.bn_bwd.dgamma = dgamma; /* zero: the accumulation starts from nothing */
    bwd.u.bn_bwd.dbeta = dbeta;
    bwd.u.bn_bwd.dy = rw;
    bwd.u.bn_bwd.y = sh.relu ? y : NULL; /* the forward's output, as the model hands it */
    bwd.u.bn_bwd.x = x;
    bwd.u.bn_bwd.gamma = gamma;
    bwd.u.bn_bwd.save_mean = mean;
    bwd.u.bn_bwd.save_invstd = invstd;
    bwd.u.bn_bwd.sh = sh;
    fd_ops(f, &fwd, &bwd, true, (fd_term){y, rw, nx}, 1e-2f);
    if (sh.relu)
        f->before = fd_bn_relu_kink;
    fd_wrt_add(f, x, nx, dx, "x");
    fd_wrt_add(f, gamma, sh.c, dgamma, "gamma");
    fd_wrt_add(f, beta, sh.c, dbeta, "beta");
    return true;
}

static bool gen_bn_bwd(tcase *c, int idx, rng *r)
{
    if (idx >= N_BN_CASES)
        return fd_bn(c, idx - N_BN_CASES);
    mgt_bn_shape sh;
    bn_shape_of(idx, r, &sh);
    size_t nx = (size_t)sh.n * sh.c * sh.hw;
    c->op.kind = MGT_OP_BN_BWD;
    mgt_bn_bwd_args *b = &c->op.u.bn_bwd;
    b->dx = case_f32(c, nx);
    b->dgamma = case_f32(c, sh.c);
    b->dbeta = case_f32(c, sh.c);
    float *dy = case_f32(c, nx), *x = case_f32(c, nx), *gamma = case_f32(c, sh.c);
    float *mean = case_f32(c, sh.c), *invstd = case_f32(c, sh.c);
    fill_unif(r, b->dgamma, sh.c, -1, 1);
    fill_unif(r, b->dbeta, sh.c, -1, 1);
    fill_unif(r, dy, nx, -1, 1);
    fill_bn_x(r, x, &sh);
    fill_unif(r, gamma, sh.c, -1.5f, 1.5f);
    bn_stats(x, &sh, mean, invstd);
    if (sh.relu) { /* a forward output: zero where the ReLU cut, about half of it */
        float *y = case_f32(c, nx);
        fill_unif(r, y, nx, -1, 1);
        for (size_t i = 0; i < nx; i++)
            y[i] = y[i] > 0.0f ? y[i] : 0.0f;
        b->y = y;
    }
    b->dy = dy;
    b->x = x;
    b->gamma = gamma;
    b->save_mean = mean;
    b->save_invstd = invstd;
    b->sh = sh;
    c->rtol = tol_for((double)sh.n * sh.hw) * 4;
    bn_desc(c, &sh);
    if (bn_case_residual(idx))
        bn_residual_add(c);
    return true;
}

static bool gen_bn_stats(tcase *c, int idx, rng *r)
{
    if (idx >= N_BN_SHAPES + 3)
        return false;
    mgt_bn_shape sh;
    bn_shape_of(idx, r, &sh);
    size_t nx = (size_t)sh.n * sh.c * sh.hw;
    c->op.kind = MGT_OP_BN_STATS;
    mgt_bn_stats_args *b = &c->op.u.bn_stats;
    float *x = case_f32(c, nx);
    fill_bn_x(r, x, &sh);
    b->mean = case_f32(c, sh.c);
    b->var = case_f32(c, sh.c);
    b->x = x;
    b->sh = sh;
    c->rtol = tol_for((double)sh.n * sh.hw) * 4;
    bn_desc(c, &sh);
    return true;
}

/* The shard's own sums with its own count (then it is bn_bwd's dx, which fd_bn checks), or
   (odd cases, and where two values per channel would leave dx all cancellation) sums and a
   count that also hold another shard's: random sums over as many values again. */
static bool gen_bn_bwd_elemt(tcase *c, int idx, rng *r)
{
    if (idx >= N_BN_SHAPES + 3)
        return false;
    mgt_bn_shape sh;
    bn_shape_of(idx, r, &sh);
    size_t nx = (size_t)sh.n * sh.c * sh.hw;
    c->op.kind = MGT_OP_BN_BWD_ELEMT;
    mgt_bn_bwd_elemt_args *b = &c->op.u.bn_bwd_elemt;
    b->dx = case_f32(c, nx);
    float *dy = case_f32(c, nx), *x = case_f32(c, nx), *gamma = case_f32(c, sh.c);
    float *mean = case_f32(c, sh.c), *invstd = case_f32(c, sh.c);
    float *sdy = case_f32(c, sh.c), *sdyx = case_f32(c, sh.c);
    fill_unif(r, dy, nx, -1, 1);
    fill_bn_x(r, x, &sh);
    fill_unif(r, gamma, sh.c, -1.5f, 1.5f);
    bn_stats(x, &sh, mean, invstd);
    double m = (double)sh.n * sh.hw;
    bool other = idx % 2 || m <= 2;
    for (int ch = 0; ch < sh.c; ch++) {
        double s1 = 0, s2 = 0;
        for (int n = 0; n < sh.n; n++)
            for (int i = 0; i < sh.hw; i++) {
                size_t j = ((size_t)n * sh.c + ch) * sh.hw + i;
                s1 += dy[j];
                s2 += dy[j] * ((x[j] - mean[ch]) * (double)invstd[ch]);
            }
        if (other) {
            s1 += m * (rng_unit(r) - 0.5);
            s2 += m * (rng_unit(r) - 0.5);
        }
        sdy[ch] = (float)s1;
        sdyx[ch] = (float)s2;
    }
    b->dy = dy;
    b->x = x;
    b->gamma = gamma;
    b->mean = mean;
    b->invstd = invstd;
    b->sum_dy = sdy;
    b->sum_dy_xhat = sdyx;
    b->count = other ? 2 * m : m;
    b->sh = sh;
    c->rtol = tol_for(m) * 4;
    bn_desc(c, &sh);
    return true;
}

static bool gen_relu_fwd(tcase *c, int idx, rng *r)
{
    if (idx >= (int)N_VEC_SIZES)
        return false;
    size_t n = vec_sizes[idx];
    float *x = case_f32(c, n);
    fill_unif(r, x, n, -1, 1);
    for (size_t i = 0; i < n; i += 5)
        x[i] = i % 2 ? 0.0f : -0.0f; /* exact zeros, both signs */
    bool alias = idx % 3 == 2;
    c->op.kind = MGT_OP_RELU_FWD;
    c->op.u.relu_fwd.y = alias ? x : case_f32(c, n);
    c->op.u.relu_fwd.x = x;
    c->op.u.relu_fwd.n = n;
    c->rtol = 0;
    case_desc(c, "n=%zu%s", n, alias ? " y=x" : "");
    return true;
}

/* ReLU with inputs at least 0.05 from the kink, so x +- h never crosses it. */
static bool fd_relu(tcase *c, int t)
{
    static const size_t ns[] = {1, 7, 100, 1001};
    if (t >= 4)
        return false;
    fd_part *f = fd_begin(c, rng_for(300, t, 7));
    rng *r = &f->r;
    size_t n = ns[t];
    float *x = case_f32(c, n), *y = case_f32(c, n), *rw = case_f32(c, n);
    float *dx = case_f32(c, n);
    for (size_t i = 0; i < n; i++) {
        float v = rng_unif(r, 0.05f, 1);
        x[i] = rng_int(r, 0, 1) ? v : -v;
    }
    fill_unif(r, rw, n, -1, 1);
    case_desc(c, "n=%zu", n);
    mgt_op fwd = {.kind = MGT_OP_RELU_FWD};
    fwd.u.relu_fwd.y = y;
    fwd.u.relu_fwd.x = x;
    fwd.u.relu_fwd.n = n;
    mgt_op bwd = {.kind = MGT_OP_RELU_BWD};
    bwd.u.relu_bwd.dx = dx;
    bwd.u.relu_bwd.dy = rw;
    bwd.u.relu_bwd.y = y;
    bwd.u.relu_bwd.n = n;
    fd_ops(f, &fwd, &bwd, true, (fd_term){y, rw, n}, 1e-2f);
    fd_wrt_add(f, x, n, dx, "x");
    return true;
}

static bool gen_relu_bwd(tcase *c, int idx, rng *r)
{
    if (idx >= (int)N_VEC_SIZES)
        return fd_relu(c, idx - (int)N_VEC_SIZES);
    size_t n = vec_sizes[idx];
    float *y = case_f32(c, n), *dy = case_f32(c, n);
    fill_unif(r, dy, n, -1, 1);
    for (size_t i = 0; i < n; i++) {
        float v = rng_unif(r, -1, 1);
        y[i] = v > 0 ? v : 0.0f; /* as the forward leaves it: exact zeros */
    }
    bool alias = idx % 3 == 2;
    c->op.kind = MGT_OP_RELU_BWD;
    c->op.u.relu_bwd.dx = alias ? dy : case_f32(c, n);
    c->op.u.relu_bwd.dy = dy;
    c->op.u.relu_bwd.y = y;
    c->op.u.relu_bwd.n = n;
    c->rtol = 0;
    case_desc(c, "n=%zu%s", n, alias ? " dx=dy" : "");
    return true;
}

/* n, c, h, w, kh, kw, stride h/w, pad h/w */
static const int pool_shapes[][11] = {
    {1, 3, 7, 7, 3, 3, 2, 2, 1, 1},      /* ResNet's 3/2/1 */
    {2, 5, 8, 6, 2, 2, 2, 2, 0, 0},      /* 2/2/0 */
    {1, 1, 5, 9, 3, 2, 1, 2, 1, 0},      /* non-square window and stride */
    {3, 13, 11, 7, 3, 3, 1, 1, 1, 1},    /* overlapping windows */
    {2, 4, 6, 6, 4, 4, 2, 2, 2, 2},      /* even window, half of it padding at the corner */
    {1, 2, 1, 1, 1, 1, 1, 1, 0, 0},      /* 1x1 */
    {2, 3, 9, 10, 3, 3, 3, 3, 0, 1},     /* stride equals window */
    {4, 8, 12, 12, 3, 3, 2, 2, 1, 1},    /* ResNet's, larger */
    {1, 9, 13, 5, 5, 3, 2, 1, 2, 1},     /* tall window */
    {2, 6, 4, 4, 4, 4, 1, 1, 0, 0},      /* one window covering everything */
    {2, 3, 14, 14, 3, 3, 2, 2, 0, 0, 1}, /* SqueezeNet's ceil_mode: a last clipped window */
    {1, 2, 8, 7, 3, 3, 2, 2, 1, 1, 1},   /* ceil_mode with padding */
    {1, 2, 6, 6, 2, 2, 2, 2, 0, 0, 1},   /* ceil_mode where it rounds nothing */
};
#define N_POOL_SHAPES ((int)(sizeof pool_shapes / sizeof pool_shapes[0]))

/* Cases N_POOL_SHAPES + 4 on: the same windows over nChw16c (skipped where CUDA runs). */
static const int pool_blocked_shapes[][11] = {
    {2, 32, 12, 12, 3, 3, 2, 2, 1, 1, 0}, /* ResNet's stem pool */
    {1, 16, 14, 14, 3, 3, 2, 2, 0, 0, 1}, /* ceil_mode */
    {3, 16, 7, 9, 2, 3, 1, 2, 1, 1, 0},
};
#define N_POOL_BLOCKED ((int)(sizeof pool_blocked_shapes / sizeof pool_blocked_shapes[0]))

static void pool_shape_of(int idx, rng *r, mgt_pool2d_shape *sh)
{
    bool blocked = idx >= N_POOL_SHAPES + 4;
    if (idx < N_POOL_SHAPES || blocked) {
        const int *v = blocked ? pool_blocked_shapes[idx - N_POOL_SHAPES - 4] : pool_shapes[idx];
        *sh = (mgt_pool2d_shape){.n = v[0],
                                 .c = v[1],
                                 .h = v[2],
                                 .w = v[3],
                                 .kh = v[4],
                                 .kw = v[5],
                                 .stride_h = v[6],
                                 .stride_w = v[7],
                                 .pad_h = v[8],
                                 .pad_w = v[9],
                                 .ceil_mode = v[10] != 0,
                                 .layout = blocked ? MGT_LAYOUT_NCHW16C : MGT_LAYOUT_NCHW};
        return;
    }
    sh->layout = MGT_LAYOUT_NCHW;
    sh->n = rng_int(r, 1, 3);
    sh->c = rng_int(r, 1, 11);
    sh->kh = rng_int(r, 1, 4);
    sh->kw = rng_int(r, 1, 4);
    sh->pad_h = rng_int(r, 0, sh->kh / 2);
    sh->pad_w = rng_int(r, 0, sh->kw / 2);
    sh->h = rng_int(r, sh->kh - 2 * sh->pad_h > 1 ? sh->kh - 2 * sh->pad_h : 1, 12);
    sh->w = rng_int(r, sh->kw - 2 * sh->pad_w > 1 ? sh->kw - 2 * sh->pad_w : 1, 12);
    sh->stride_h = rng_int(r, 1, 3);
    sh->stride_w = rng_int(r, 1, 3);
    sh->ceil_mode = rng_int(r, 0, 1);
}

static size_t pool_x_len(const mgt_pool2d_shape *sh)
{
    return (size_t)sh->n * sh->c * sh->h * sh->w;
}

static size_t pool_y_len(const mgt_pool2d_shape *sh)
{
    return (size_t)sh->n * sh->c * mgt_pool2d_out_h(sh) * mgt_pool2d_out_w(sh);
}

/* Odd cases draw from five values only, so windows hold ties and the backward's "first
   maximum in raster order" rule decides where the gradient goes. */
static void fill_pool_x(rng *r, float *x, size_t n, bool ties)
{
    for (size_t i = 0; i < n; i++)
        x[i] = ties ? (float)rng_int(r, -2, 2) * 0.5f : rng_unif(r, -1, 1);
}

static void pool_desc(tcase *c, const mgt_pool2d_shape *sh, bool ties)
{
    case_desc(c, "n=%d c=%d %dx%d window %dx%d s=%d,%d p=%d,%d%s%s%s", sh->n, sh->c, sh->h, sh->w,
              sh->kh, sh->kw, sh->stride_h, sh->stride_w, sh->pad_h, sh->pad_w,
              sh->ceil_mode ? " ceil" : "", ties ? " ties" : "", sh->layout ? " nChw16c" : "");
}

static bool gen_maxpool_fwd(tcase *c, int idx, rng *r)
{
    if (idx >= N_POOL_SHAPES + 4 + N_POOL_BLOCKED)
        return false;
    mgt_pool2d_shape sh;
    pool_shape_of(idx, r, &sh);
    bool ties = idx % 2;
    float *x = case_f32(c, pool_x_len(&sh));
    fill_pool_x(r, x, pool_x_len(&sh), ties);
    c->op.kind = MGT_OP_MAXPOOL_FWD;
    c->op.u.maxpool_fwd.y = case_f32(c, pool_y_len(&sh));
    c->op.u.maxpool_fwd.x = x;
    c->op.u.maxpool_fwd.sh = sh;
    c->rtol = 0;
    pool_desc(c, &sh, ties);
    return true;
}

/* Max pool with distinct inputs 0.05 apart, so a step of 0.01 never changes a window's
   winner. */
static bool fd_maxpool(tcase *c, int t)
{
    static const int pick[] = {0, 2, 3, 4, 8, 10, 11};
    if (t >= (int)(sizeof pick / sizeof pick[0]))
        return false;
    fd_part *f = fd_begin(c, rng_for(400, t, 7));
    rng *r = &f->r;
    mgt_pool2d_shape sh;
    pool_shape_of(pick[t], r, &sh);
    size_t nx = pool_x_len(&sh), ny = pool_y_len(&sh);
    float *x = case_f32(c, nx), *y = case_f32(c, ny), *rw = case_f32(c, ny);
    float *dx = case_f32(c, nx);
    for (size_t i = 0; i < nx; i++)
        x[i] = (float)i * 0.05f;
    for (size_t i = nx; i > 1; i--) { /* shuffle */
        size_t j = rng_u64(r) % i;
        float tmp = x[i - 1];
        x[i - 1] = x[j];
        x[j] = tmp;
    }
    fill_unif(r, rw, ny, -1, 1);
    pool_desc(c, &sh, false);
    mgt_op fwd = {.kind = MGT_OP_MAXPOOL_FWD};
    fwd.u.maxpool_fwd.y = y;
    fwd.u.maxpool_fwd.x = x;
    fwd.u.maxpool_fwd.sh = sh;
    mgt_op bwd = {.kind = MGT_OP_MAXPOOL_BWD};
    bwd.u.maxpool_bwd.dx = dx;
    bwd.u.maxpool_bwd.dy = rw;
    bwd.u.maxpool_bwd.x = x;
    bwd.u.maxpool_bwd.y = y;
    bwd.u.maxpool_bwd.sh = sh;
    fd_ops(f, &fwd, &bwd, true, (fd_term){y, rw, ny}, 1e-2f);
    fd_wrt_add(f, x, nx, dx, "x");
    return true;
}

static bool gen_maxpool_bwd(tcase *c, int idx, rng *r)
{
    if (idx >= N_POOL_SHAPES + 4 + N_POOL_BLOCKED)
        return fd_maxpool(c, idx - (N_POOL_SHAPES + 4 + N_POOL_BLOCKED));
    mgt_pool2d_shape sh;
    pool_shape_of(idx, r, &sh);
    bool ties = idx % 2;
    size_t nx = pool_x_len(&sh), ny = pool_y_len(&sh);
    float *x = case_f32(c, nx), *y = case_f32(c, ny), *dy = case_f32(c, ny);
    fill_pool_x(r, x, nx, ties);
    fill_unif(r, dy, ny, -1, 1);
    /* y as the forward makes it, from the reference */
    mgt_op f = {.kind = MGT_OP_MAXPOOL_FWD};
    f.u.maxpool_fwd.y = y;
    f.u.maxpool_fwd.x = x;
    f.u.maxpool_fwd.sh = sh;
    mgt_ref_run(&f);
    c->op.kind = MGT_OP_MAXPOOL_BWD;
    c->op.u.maxpool_bwd.dx = case_f32(c, nx);
    c->op.u.maxpool_bwd.dy = dy;
    c->op.u.maxpool_bwd.x = x;
    c->op.u.maxpool_bwd.y = y;
    c->op.u.maxpool_bwd.sh = sh;
    /* overlapping windows add several gradients into one input */
    c->rtol = tol_for((double)((sh.kh + sh.stride_h - 1) / sh.stride_h) *
                      ((sh.kw + sh.stride_w - 1) / sh.stride_w));
    pool_desc(c, &sh, ties);
    return true;
}

static const int avg_shapes[][3] = {{1, 1, 1},   {2, 3, 49}, {4, 13, 9}, {1, 512, 1},   {3, 7, 100},
                                    {8, 64, 16}, {5, 1, 3},  {2, 33, 2}, {1, 10, 1000}, {7, 5, 7}};
#define N_AVG_SHAPES ((int)(sizeof avg_shapes / sizeof avg_shapes[0]))

#define N_AVG_CASES (N_AVG_SHAPES + 4)

static bool gen_avgpool(tcase *c, int idx, rng *r, bool fwd)
{
    if (idx >= N_AVG_CASES)
        return false;
    int n, ch, hw;
    /* the last two in nChw16c */
    mgt_layout lay = idx >= N_AVG_SHAPES + 2 ? MGT_LAYOUT_NCHW16C : MGT_LAYOUT_NCHW;
    if (lay == MGT_LAYOUT_NCHW16C) {
        n = idx == N_AVG_SHAPES + 2 ? 3 : 2;
        ch = idx == N_AVG_SHAPES + 2 ? 32 : 16;
        hw = idx == N_AVG_SHAPES + 2 ? 49 : 1;
    } else if (idx < N_AVG_SHAPES) {
        n = avg_shapes[idx][0];
        ch = avg_shapes[idx][1];
        hw = avg_shapes[idx][2];
    } else {
        n = rng_int(r, 1, 9);
        ch = rng_int(r, 1, 40);
        hw = rng_int(r, 1, 60);
    }
    size_t nx = (size_t)n * ch * hw, ny = (size_t)n * ch;
    if (fwd) {
        float *x = case_f32(c, nx);
        fill_unif(r, x, nx, -1, 1);
        c->op.kind = MGT_OP_AVGPOOL_FWD;
        c->op.u.avgpool_fwd.y = case_f32(c, ny);
        c->op.u.avgpool_fwd.x = x;
        c->op.u.avgpool_fwd.n = n;
        c->op.u.avgpool_fwd.c = ch;
        c->op.u.avgpool_fwd.hw = hw;
        c->op.u.avgpool_fwd.layout = lay;
        c->rtol = tol_for(hw);
    } else {
        float *dy = case_f32(c, ny);
        fill_unif(r, dy, ny, -1, 1);
        c->op.kind = MGT_OP_AVGPOOL_BWD;
        c->op.u.avgpool_bwd.dx = case_f32(c, nx);
        c->op.u.avgpool_bwd.dy = dy;
        c->op.u.avgpool_bwd.n = n;
        c->op.u.avgpool_bwd.c = ch;
        c->op.u.avgpool_bwd.hw = hw;
        c->op.u.avgpool_bwd.layout = lay;
        c->rtol = 2e-6;
    }
    case_desc(c, "n=%d c=%d hw=%d%s", n, ch, hw, lay ? " nChw16c" : "");
    return true;
}

static bool gen_avgpool_fwd(tcase *c, int idx, rng *r) { return gen_avgpool(c, idx, r, true); }

static bool fd_avgpool(tcase *c, int t)
{
    static const int shapes[][3] = {{1, 1, 1}, {2, 3, 49}, {3, 5, 7}};
    if (t >= 3)
        return false;
    fd_part *f = fd_begin(c, rng_for(500, t, 7));
    rng *r = &f->r;
    int n = shapes[t][0], ch = shapes[t][1], hw = shapes[t][2];
    size_t nx = (size_t)n * ch * hw, ny = (size_t)n * ch;
    float *x = case_f32(c, nx), *y = case_f32(c, ny), *rw = case_f32(c, ny);
    float *dx = case_f32(c, nx);
    fill_unif(r, x, nx, -1, 1);
    fill_unif(r, rw, ny, -1, 1);
    case_desc(c, "n=%d c=%d hw=%d", n, ch, hw);
    mgt_op fwd = {.kind = MGT_OP_AVGPOOL_FWD};
    fwd.u.avgpool_fwd.y = y;
    fwd.u.avgpool_fwd.x = x;
    fwd.u.avgpool_fwd.n = n;
    fwd.u.avgpool_fwd.c = ch;
    fwd.u.avgpool_fwd.hw = hw;
    mgt_op bwd = {.kind = MGT_OP_AVGPOOL_BWD};
    bwd.u.avgpool_bwd.dx = dx;
    bwd.u.avgpool_bwd.dy = rw;
    bwd.u.avgpool_bwd.n = n;
    bwd.u.avgpool_bwd.c = ch;
    bwd.u.avgpool_bwd.hw = hw;
    fd_ops(f, &fwd, &bwd, false, (fd_term){y, rw, ny}, 1e-2f);
    fd_wrt_add(f, x, nx, dx, "x");
    return true;
}

static bool gen_avgpool_bwd(tcase *c, int idx, rng *r)
{
    return gen_avgpool(c, idx, r, false) || fd_avgpool(c, idx - N_AVG_CASES);
}

static const int bias_shapes[][2] = {{1, 1},    {1, 10},  {7, 1},   {33, 17},  {128, 10},
                                     {5, 1000}, {64, 64}, {3, 513}, {1000, 3}, {9, 9}};
#define N_BIAS_SHAPES ((int)(sizeof bias_shapes / sizeof bias_shapes[0]))

#define N_BIAS_CASES (N_BIAS_SHAPES + 2)

static bool gen_bias(tcase *c, int idx, rng *r, bool fwd)
{
    if (idx >= N_BIAS_CASES)
        return false;
    int rows, cols;
    if (idx < N_BIAS_SHAPES) {
        rows = bias_shapes[idx][0];
        cols = bias_shapes[idx][1];
    } else {
        rows = rng_int(r, 1, 100);
        cols = rng_int(r, 1, 100);
    }
    size_t ny = (size_t)rows * cols;
    float *big = case_f32(c, ny), *vec = case_f32(c, cols);
    fill_unif(r, big, ny, -1, 1);
    fill_unif(r, vec, cols, -1, 1);
    if (fwd) {
        c->op.kind = MGT_OP_BIAS_FWD;
        c->op.u.bias_fwd.y = big;
        c->op.u.bias_fwd.bias = vec;
        c->op.u.bias_fwd.rows = rows;
        c->op.u.bias_fwd.cols = cols;
        c->rtol = 1e-6;
    } else {
        c->op.kind = MGT_OP_BIAS_BWD;
        c->op.u.bias_bwd.dbias = vec;
        c->op.u.bias_bwd.dy = big;
        c->op.u.bias_bwd.rows = rows;
        c->op.u.bias_bwd.cols = cols;
        c->rtol = tol_for(rows);
    }
    case_desc(c, "rows=%d cols=%d", rows, cols);
    return true;
}

static bool gen_bias_fwd(tcase *c, int idx, rng *r) { return gen_bias(c, idx, r, true); }

/* Bias: y += bias over rows; dL/dbias[j] = sum over rows of r, which the backward adds to a
   zeroed dbias. */
static bool fd_bias(tcase *c, int t)
{
    static const int shapes[][2] = {{1, 1}, {7, 3}, {33, 17}};
    if (t >= 3)
        return false;
    fd_part *f = fd_begin(c, rng_for(600, t, 7));
    rng *r = &f->r;
    int rows = shapes[t][0], cols = shapes[t][1];
    size_t ny = (size_t)rows * cols;
    float *y = case_f32(c, ny), *bias = case_f32(c, cols), *rw = case_f32(c, ny);
    float *db = case_f32(c, cols);
    fill_unif(r, y, ny, -1, 1);
    fill_unif(r, bias, cols, -1, 1);
    fill_unif(r, rw, ny, -1, 1);
    case_desc(c, "rows=%d cols=%d", rows, cols);
    mgt_op fwd = {.kind = MGT_OP_BIAS_FWD};
    fwd.u.bias_fwd.y = y;
    fwd.u.bias_fwd.bias = bias;
    fwd.u.bias_fwd.rows = rows;
    fwd.u.bias_fwd.cols = cols;
    mgt_op bwd = {.kind = MGT_OP_BIAS_BWD};
    bwd.u.bias_bwd.dbias = db;
    bwd.u.bias_bwd.dy = rw;
    bwd.u.bias_bwd.rows = rows;
    bwd.u.bias_bwd.cols = cols;
    fd_ops(f, &fwd, &bwd, false, (fd_term){y, rw, ny}, 1e-2f);
    fd_wrt_add(f, bias, cols, db, "bias");
    return true;
}

static bool gen_bias_bwd(tcase *c, int idx, rng *r)
{
    return gen_bias(c, idx, r, false) || fd_bias(c, idx - N_BIAS_CASES);
}

/* n, c, hw */
static const int chbias_shapes[][3] = {{1, 1, 1},   {2, 3, 49},  {4, 13, 9}, {1, 512, 1},
                                       {3, 7, 100}, {8, 64, 16}, {5, 1, 3},  {2, 33, 2}};
#define N_CHBIAS_SHAPES ((int)(sizeof chbias_shapes / sizeof chbias_shapes[0]))

#define N_CHBIAS_CASES (N_CHBIAS_SHAPES + 2)

static bool gen_chbias(tcase *c, int idx, rng *r, bool fwd)
{
    if (idx >= N_CHBIAS_CASES)
        return false;
    int n, ch, hw;
    if (idx < N_CHBIAS_SHAPES) {
        n = chbias_shapes[idx][0];
        ch = chbias_shapes[idx][1];
        hw = chbias_shapes[idx][2];
    } else {
        n = rng_int(r, 1, 9);
        ch = rng_int(r, 1, 40);
        hw = rng_int(r, 1, 60);
    }
    size_t ny = (size_t)n * ch * hw;
    float *big = case_f32(c, ny), *vec = case_f32(c, ch);
    fill_unif(r, big, ny, -1, 1);
    fill_unif(r, vec, ch, -1, 1);
    if (fwd) {
        c->op.kind = MGT_OP_CHBIAS_FWD;
        c->op.u.chbias_fwd.y = big;
        c->op.u.chbias_fwd.bias = vec;
        c->op.u.chbias_fwd.n = n;
        c->op.u.chbias_fwd.c = ch;
        c->op.u.chbias_fwd.hw = hw;
        c->rtol = 1e-6;
    } else {
        c->op.kind = MGT_OP_CHBIAS_BWD;
        c->op.u.chbias_bwd.dbias = vec;
        c->op.u.chbias_bwd.dy = big;
        c->op.u.chbias_bwd.n = n;
        c->op.u.chbias_bwd.c = ch;
        c->op.u.chbias_bwd.hw = hw;
        c->rtol = tol_for((double)n * hw);
    }
    case_desc(c, "n=%d c=%d hw=%d", n, ch, hw);
    return true;
}

static bool gen_chbias_fwd(tcase *c, int idx, rng *r) { return gen_chbias(c, idx, r, true); }

/* Channel bias: y += bias over n and hw; dL/dbias[ch] = the sum of r over its planes. */
static bool fd_chbias(tcase *c, int t)
{
    static const int shapes[][3] = {{1, 1, 1}, {2, 3, 5}, {3, 4, 7}};
    if (t >= 3)
        return false;
    fd_part *f = fd_begin(c, rng_for(610, t, 7));
    rng *r = &f->r;
    int n = shapes[t][0], ch = shapes[t][1], hw = shapes[t][2];
    size_t ny = (size_t)n * ch * hw;
    float *y = case_f32(c, ny), *bias = case_f32(c, ch), *rw = case_f32(c, ny);
    float *db = case_f32(c, ch);
    fill_unif(r, y, ny, -1, 1);
    fill_unif(r, bias, ch, -1, 1);
    fill_unif(r, rw, ny, -1, 1);
    case_desc(c, "n=%d c=%d hw=%d", n, ch, hw);
    mgt_op fwd = {.kind = MGT_OP_CHBIAS_FWD};
    fwd.u.chbias_fwd.y = y;
    fwd.u.chbias_fwd.bias = bias;
    fwd.u.chbias_fwd.n = n;
    fwd.u.chbias_fwd.c = ch;
    fwd.u.chbias_fwd.hw = hw;
    mgt_op bwd = {.kind = MGT_OP_CHBIAS_BWD};
    bwd.u.chbias_bwd.dbias = db;
    bwd.u.chbias_bwd.dy = rw;
    bwd.u.chbias_bwd.n = n;
    bwd.u.chbias_bwd.c = ch;
    bwd.u.chbias_bwd.hw = hw;
    fd_ops(f, &fwd, &bwd, false, (fd_term){y, rw, ny}, 1e-2f);
    fd_wrt_add(f, bias, (size_t)ch, db, "bias");
    return true;
}

static bool gen_chbias_bwd(tcase *c, int idx, rng *r)
{
    return gen_chbias(c, idx, r, false) || fd_chbias(c, idx - N_CHBIAS_CASES);
}

/* n, per image, p x100, sample0, stride; per-image sizes that are and are not multiples of
   four (the mask's blocks), p = 0 (identity) and large */
static const int dropout_shapes[][5] = {
    {1, 1, 50, 0, 1},   {2, 7, 50, 3, 2},    {4, 4096, 50, 0, 4}, {3, 4097, 10, 9, 3},
    {1, 1000, 0, 0, 1}, {8, 33, 90, 100, 8}, {5, 6, 20, 1, 1}};
#define N_DROPOUT_SHAPES ((int)(sizeof dropout_shapes / sizeof dropout_shapes[0]))

static void dropout_op(mgt_op *op, float *y, const float *x, int n, size_t per, float p,
                       uint64_t s0, uint64_t stride, uint64_t step, uint32_t stream)
{
    memset(op, 0, sizeof *op);
    op->kind = MGT_OP_DROPOUT;
    op->u.dropout.y = y;
    op->u.dropout.x = x;
    op->u.dropout.n = n;
    op->u.dropout.per_image = per;
    op->u.dropout.p = p;
    op->u.dropout.seed = 0x123456789abcull;
    op->u.dropout.step = step;
    op->u.dropout.sample0 = s0;
    op->u.dropout.sample_stride = stride;
    op->u.dropout.stream = stream;
}

/* What the key promises: the kept fraction is near 1 - p, the kept values are x / (1 - p),
   and a batch split into two calls (sample0 and the stride moved on) gives the same mask as one
   call, while another step or stream gives another one. */
static int fd_dropout_key(backend *be, const char *opname, int t, tcase *c)
{
    mgt_op fwd = c->fd.fwd;
    float *y = fwd.u.dropout.y, p = fwd.u.dropout.p;
    const float *x = fwd.u.dropout.x;
    int n = fwd.u.dropout.n;
    size_t per = fwd.u.dropout.per_image, nx = (size_t)n * per;
    const char *what;
    if (dev_run_inplace(be, &fwd, &what) != MGT_OK) {
        report_status(opname, t, c->desc, be, what, MGT_ERR_DEVICE);
        return 1;
    }
    size_t kept = 0;
    for (size_t i = 0; i < nx; i++) {
        if (y[i] != 0.0f) {
            kept++;
            if (y[i] != x[i] * (1.0f / (1.0f - p))) {
                printf("FAIL %s fd %d (%s) %s: kept y[%zu] = %g, x / (1 - p) = %g\n", opname, t,
                       c->desc, be->label, i, (double)y[i], (double)(x[i] / (1.0f - p)));
                return 1;
            }
        }
    }
    /* 6 standard deviations of a binomial */
    double mean = (double)nx * (1.0 - p), sd = sqrt((double)nx * p * (1.0 - p));
    if (fabs((double)kept - mean) > 6.0 * sd + 1.0) {
        printf("FAIL %s fd %d (%s) %s: kept %zu of %zu at p=%g\n", opname, t, c->desc, be->label,
               kept, nx, (double)p);
        return 1;
    }
    if (n == 1)
        return 0;
    /* the first image alone, then the rest from sample 5 + 3 */
    float *y2 = calloc(nx, sizeof *y2), *y3 = calloc(nx, sizeof *y3);
    if (!y2 || !y3) {
        fprintf(stderr, "conformance: out of host memory\n");
        abort();
    }
    mgt_op a, b2, other;
    dropout_op(&a, y2, x, 1, per, p, 5, 3, 11, 1);
    dropout_op(&b2, y2 + per, x + per, n - 1, per, p, 8, 3, 11, 1);
    dropout_op(&other, y3, x, n, per, p, 5, 3, 12, 1);
    int bad = 0;
    if (dev_run_inplace(be, &a, &what) != MGT_OK || dev_run_inplace(be, &b2, &what) != MGT_OK ||
        dev_run_inplace(be, &other, &what) != MGT_OK) {
        report_status(opname, t, c->desc, be, what, MGT_ERR_DEVICE);
        bad = 1;
    } else if (memcmp(y2, y, nx * sizeof *y) != 0) {
        printf("FAIL %s fd %d (%s) %s: a batch split in two calls gets another mask\n", opname, t,
               c->desc, be->label);
        bad = 1;
    } else if (nx > 64 && memcmp(y3, y, nx * sizeof *y) == 0) {
        printf("FAIL %s fd %d (%s) %s: the next step has the same mask\n", opname, t, c->desc,
               be->label);
        bad = 1;
    }
    free(y2);
    free(y3);
    return bad;
}

/* Dropout is its own backward: run on r with the same key it must give dL/dx of the forward;
   then fd_dropout_key. */
static bool fd_dropout(tcase *c, int t)
{
    static const int shapes[][3] = {{1, 9, 50}, {2, 13, 30}, {4, 2000, 50}};
    if (t >= 3)
        return false;
    fd_part *f = fd_begin(c, rng_for(620, t, 7));
    rng *r = &f->r;
    int n = shapes[t][0], per = shapes[t][1];
    float p = (float)shapes[t][2] / 100.0f;
    size_t nx = (size_t)n * per;
    float *x = case_f32(c, nx), *y = case_f32(c, nx), *rw = case_f32(c, nx);
    float *dx = case_f32(c, nx);
    fill_unif(r, x, nx, 0.5f, 1.0f); /* never 0, so a dropped element shows as 0 */
    fill_unif(r, rw, nx, -1, 1);
    case_desc(c, "n=%d per_image=%d p=%.2f", n, per, (double)p);
    mgt_op fwd, bwd;
    dropout_op(&fwd, y, x, n, (size_t)per, p, 5, 3, 11, 1);
    dropout_op(&bwd, dx, rw, n, (size_t)per, p, 5, 3, 11, 1);
    fd_ops(f, &fwd, &bwd, false, (fd_term){y, rw, nx}, 1e-2f);
    f->after = fd_dropout_key;
    fd_wrt_add(f, x, nx, dx, "x");
    return true;
}

static bool gen_dropout(tcase *c, int idx, rng *r)
{
    if (idx >= N_DROPOUT_SHAPES + 2)
        return fd_dropout(c, idx - (N_DROPOUT_SHAPES + 2));
    int n, per, pc, s0, stride;
    if (idx < N_DROPOUT_SHAPES) {
        n = dropout_shapes[idx][0];
        per = dropout_shapes[idx][1];
        pc = dropout_shapes[idx][2];
        s0 = dropout_shapes[idx][3];
        stride = dropout_shapes[idx][4];
    } else {
        n = rng_int(r, 1, 9);
        per = rng_int(r, 1, 300);
        pc = rng_int(r, 0, 95);
        s0 = rng_int(r, 0, 1000);
        stride = rng_int(r, 1, 8);
    }
    size_t nx = (size_t)n * per;
    float *x = case_f32(c, nx);
    fill_unif(r, x, nx, -1, 1);
    dropout_op(&c->op, case_f32(c, nx), x, n, (size_t)per, (float)pc / 100.0f, (uint64_t)s0,
               (uint64_t)stride, (uint64_t)idx * 7 + 1, (uint32_t)(idx % 3));
    c->rtol = 1e-6;
    case_desc(c, "n=%d per_image=%d p=%.2f sample0=%d stride=%d", n, per, pc / 100.0, s0, stride);
    return true;
}

/* n, c, h, w, oh, ow: VGG's 7x7 from 1x1 (replication), AlexNet's 6x6 from 13x13 (overlapping
   windows), exact divisions, 1x1 (global), growing and shrinking */
static const int apool_shapes[][6] = {{2, 3, 1, 1, 7, 7}, {1, 4, 13, 13, 6, 6}, {2, 5, 8, 8, 4, 4},
                                      {3, 2, 7, 5, 1, 1}, {1, 3, 5, 7, 3, 2},   {2, 2, 2, 3, 5, 4},
                                      {1, 1, 9, 9, 9, 9}, {4, 6, 14, 14, 7, 7}};
#define N_APOOL_SHAPES ((int)(sizeof apool_shapes / sizeof apool_shapes[0]))

#define N_APOOL_CASES (N_APOOL_SHAPES + 3)

static bool gen_apool(tcase *c, int idx, rng *r, bool fwd)
{
    if (idx >= N_APOOL_CASES)
        return false;
    int v[6];
    for (int k = 0; k < 6; k++)
        v[k] = idx < N_APOOL_SHAPES ? apool_shapes[idx][k] : 0;
    if (idx >= N_APOOL_SHAPES) {
        v[0] = rng_int(r, 1, 4);
        v[1] = rng_int(r, 1, 9);
        v[2] = rng_int(r, 1, 15);
        v[3] = rng_int(r, 1, 15);
        v[4] = rng_int(r, 1, 8);
        v[5] = rng_int(r, 1, 8);
    }
    size_t nx = (size_t)v[0] * v[1] * v[2] * v[3], ny = (size_t)v[0] * v[1] * v[4] * v[5];
    if (fwd) {
        float *x = case_f32(c, nx);
        fill_unif(r, x, nx, -1, 1);
        c->op.kind = MGT_OP_APOOL_FWD;
        c->op.u.apool_fwd.y = case_f32(c, ny);
        c->op.u.apool_fwd.x = x;
        c->op.u.apool_fwd.n = v[0];
        c->op.u.apool_fwd.c = v[1];
        c->op.u.apool_fwd.h = v[2];
        c->op.u.apool_fwd.w = v[3];
        c->op.u.apool_fwd.oh = v[4];
        c->op.u.apool_fwd.ow = v[5];
        c->rtol = tol_for((double)v[2] * v[3]);
    } else {
        float *dy = case_f32(c, ny);
        fill_unif(r, dy, ny, -1, 1);
        c->op.kind = MGT_OP_APOOL_BWD;
        c->op.u.apool_bwd.dx = case_f32(c, nx);
        c->op.u.apool_bwd.dy = dy;
        c->op.u.apool_bwd.n = v[0];
        c->op.u.apool_bwd.c = v[1];
        c->op.u.apool_bwd.h = v[2];
        c->op.u.apool_bwd.w = v[3];
        c->op.u.apool_bwd.oh = v[4];
        c->op.u.apool_bwd.ow = v[5];
        c->rtol = tol_for((double)v[4] * v[5]);
    }
    case_desc(c, "n=%d c=%d %dx%d -> %dx%d", v[0], v[1], v[2], v[3], v[4], v[5]);
    return true;
}

static bool gen_apool_fwd(tcase *c, int idx, rng *r) { return gen_apool(c, idx, r, true); }

static bool fd_apool(tcase *c, int t)
{
    static const int shapes[][6] = {{1, 2, 13, 13, 6, 6}, {2, 1, 1, 1, 3, 3}, {1, 3, 5, 7, 3, 2}};
    if (t >= 3)
        return false;
    fd_part *f = fd_begin(c, rng_for(630, t, 7));
    rng *r = &f->r;
    const int *v = shapes[t];
    size_t nx = (size_t)v[0] * v[1] * v[2] * v[3], ny = (size_t)v[0] * v[1] * v[4] * v[5];
    float *x = case_f32(c, nx), *y = case_f32(c, ny), *rw = case_f32(c, ny);
    float *dx = case_f32(c, nx);
    fill_unif(r, x, nx, -1, 1);
    fill_unif(r, rw, ny, -1, 1);
    case_desc(c, "n=%d c=%d %dx%d -> %dx%d", v[0], v[1], v[2], v[3], v[4], v[5]);
    mgt_op fwd = {.kind = MGT_OP_APOOL_FWD};
    fwd.u.apool_fwd.y = y;
    fwd.u.apool_fwd.x = x;
    mgt_op bwd = {.kind = MGT_OP_APOOL_BWD};
    bwd.u.apool_bwd.dx = dx;
    bwd.u.apool_bwd.dy = rw;
    fwd.u.apool_fwd.n = bwd.u.apool_bwd.n = v[0];
    fwd.u.apool_fwd.c = bwd.u.apool_bwd.c = v[1];
    fwd.u.apool_fwd.h = bwd.u.apool_bwd.h = v[2];
    fwd.u.apool_fwd.w = bwd.u.apool_bwd.w = v[3];
    fwd.u.apool_fwd.oh = bwd.u.apool_bwd.oh = v[4];
    fwd.u.apool_fwd.ow = bwd.u.apool_bwd.ow = v[5];
    fd_ops(f, &fwd, &bwd, false, (fd_term){y, rw, ny}, 1e-2f);
    fd_wrt_add(f, x, nx, dx, "x");
    return true;
}

static bool gen_apool_bwd(tcase *c, int idx, rng *r)
{
    return gen_apool(c, idx, r, false) || fd_apool(c, idx - N_APOOL_CASES);
}

/* n, rows, count, y_stride, y_row, x_stride, x_row: a channel slice into a concatenation and
   back out, a shuffle of 2 groups, contiguous, one element */
static const int scopy_shapes[][7] = {{2, 1, 12, 30, 12, 12, 12}, {3, 1, 8, 20, 8, 20, 8},
                                      {2, 4, 5, 40, 10, 20, 5},   {1, 1, 100, 100, 100, 100, 100},
                                      {1, 1, 1, 1, 1, 1, 1},      {4, 3, 7, 50, 14, 21, 7}};
#define N_SCOPY_SHAPES ((int)(sizeof scopy_shapes / sizeof scopy_shapes[0]))

static bool gen_scopy(tcase *c, int idx, rng *r)
{
    if (idx >= N_SCOPY_SHAPES + 3)
        return false;
    int n, rows;
    size_t count, ys, yr, xs, xr;
    if (idx < N_SCOPY_SHAPES) {
        const int *v = scopy_shapes[idx];
        n = v[0], rows = v[1], count = (size_t)v[2], ys = (size_t)v[3], yr = (size_t)v[4];
        xs = (size_t)v[5], xr = (size_t)v[6];
    } else {
        n = rng_int(r, 1, 5);
        rows = rng_int(r, 1, 6);
        count = (size_t)rng_int(r, 1, 20);
        yr = count + (size_t)rng_int(r, 0, 9);
        xr = (size_t)rng_int(r, 0, 25);
        ys = (size_t)rows * yr + (size_t)rng_int(r, 0, 9);
        xs = (size_t)rng_int(r, 0, 200);
    }
    size_t ny = (size_t)(n - 1) * ys + (size_t)(rows - 1) * yr + count;
    size_t nx = (size_t)(n - 1) * xs + (size_t)(rows - 1) * xr + count;
    float *y = case_f32(c, ny), *x = case_f32(c, nx);
    fill_unif(r, y, ny, -1, 1);
    fill_unif(r, x, nx, -1, 1);
    c->op.kind = MGT_OP_STRIDED_COPY;
    c->op.u.scopy.y = y;
    c->op.u.scopy.x = x;
    c->op.u.scopy.n = n;
    c->op.u.scopy.rows = rows;
    c->op.u.scopy.count = count;
    c->op.u.scopy.y_stride = ys;
    c->op.u.scopy.y_row = yr;
    c->op.u.scopy.x_stride = xs;
    c->op.u.scopy.x_row = xr;
    c->rtol = 0;
    case_desc(c, "n=%d rows=%d count=%zu y %zu/%zu x %zu/%zu", n, rows, count, ys, yr, xs, xr);
    return true;
}

/* n, classes, smoothing x10, logit scale */
static const int xent_shapes[][4] = {
    {1, 1, 0, 1},    {1, 10, 0, 1}, {4, 10, 1, 1}, {32, 10, 0, 3}, {7, 1000, 1, 2}, {3, 5, 1, 30},
    {16, 100, 0, 1}, {2, 3, 0, 80}, {5, 7, 1, 1},  {64, 2, 1, 4},  {9, 37, 0, 10},  {1, 1, 1, 1}};
#define N_XENT_SHAPES ((int)(sizeof xent_shapes / sizeof xent_shapes[0]))

static void xent_shape_of(int idx, rng *r, int *n, int *classes, float *smoothing, float *scale)
{
    if (idx < N_XENT_SHAPES) {
        *n = xent_shapes[idx][0];
        *classes = xent_shapes[idx][1];
        *smoothing = (float)xent_shapes[idx][2] * 0.1f;
        *scale = (float)xent_shapes[idx][3];
    } else {
        *n = rng_int(r, 1, 40);
        *classes = rng_int(r, 2, 200);
        *smoothing = rng_int(r, 0, 1) ? 0.1f : 0.0f;
        *scale = rng_unif(r, 0.5f, 5);
    }
}

#define N_XENT_CASES (N_XENT_SHAPES + 3)

static bool xent_plain_fwd(tcase *c, int idx, rng *r)
{
    if (idx >= N_XENT_CASES)
        return false;
    int n, classes;
    float smoothing, scale;
    xent_shape_of(idx, r, &n, &classes, &smoothing, &scale);
    size_t nc = (size_t)n * classes;
    float *logits = case_f32(c, nc);
    int32_t *labels = case_i32(c, n);
    fill_unif(r, logits, nc, -scale, scale);
    fill_labels(r, labels, n, classes);
    c->op.kind = MGT_OP_XENT_FWD;
    c->op.u.xent_fwd.loss = case_f32(c, 1);
    c->op.u.xent_fwd.probs = case_f32(c, nc);
    c->op.u.xent_fwd.logits = logits;
    c->op.u.xent_fwd.labels = labels;
    c->op.u.xent_fwd.n = n;
    c->op.u.xent_fwd.classes = classes;
    c->op.u.xent_fwd.smoothing = smoothing;
    /* probabilities go through exp of logits up to 80: relative accuracy is what counts */
    c->rtol = tol_for(classes) * 4;
    case_desc(c, "n=%d classes=%d smoothing=%g logits=+-%g", n, classes, (double)smoothing,
              (double)scale);
    return true;
}

static bool xent_plain_bwd(tcase *c, int idx, rng *r)
{
    if (idx >= N_XENT_CASES)
        return false;
    int n, classes;
    float smoothing, lscale;
    xent_shape_of(idx, r, &n, &classes, &smoothing, &lscale);
    size_t nc = (size_t)n * classes;
    float *probs = case_f32(c, nc);
    int32_t *labels = case_i32(c, n);
    for (int i = 0; i < n; i++) {
        double s = 0;
        float *p = probs + (size_t)i * classes;
        for (int j = 0; j < classes; j++)
            s += (p[j] = (float)exp(rng_unif(r, -lscale, lscale)));
        for (int j = 0; j < classes; j++)
            p[j] = (float)(p[j] / s);
    }
    fill_labels(r, labels, n, classes);
    static const float scales[] = {0, 1.0f, 0.37f};
    float scale = idx % 3 == 0 ? 1.0f / n : scales[idx % 3];
    c->op.kind = MGT_OP_XENT_BWD;
    c->op.u.xent_bwd.dlogits = case_f32(c, nc);
    c->op.u.xent_bwd.probs = probs;
    c->op.u.xent_bwd.labels = labels;
    c->op.u.xent_bwd.n = n;
    c->op.u.xent_bwd.classes = classes;
    c->op.u.xent_bwd.smoothing = smoothing;
    c->op.u.xent_bwd.scale = scale;
    c->rtol = 4e-6;
    case_desc(c, "n=%d classes=%d smoothing=%g scale=%g", n, classes, (double)smoothing,
              (double)scale);
    return true;
}

/* The mixed-label form: second labels equal to the first in some rows (the whole weight on
   one class), weights 0, 1 and 1/2 among random ones. */
static void fill_mix(rng *r, int32_t *a, int32_t *b, float *w, int n, int classes)
{
    fill_labels(r, a, n, classes);
    fill_labels(r, b, n, classes);
    for (int i = 0; i < n; i++) {
        int k = rng_int(r, 0, 5);
        w[i] = k == 0 ? 0.0f : k == 1 ? 1.0f : k == 2 ? 0.5f : rng_unif(r, 0, 1);
        if (rng_int(r, 0, 4) == 0)
            b[i] = a[i];
    }
}

static bool xent_mixed_fwd(tcase *c, int idx, rng *r)
{
    if (idx >= N_XENT_CASES)
        return false;
    int n, classes;
    float smoothing, scale;
    xent_shape_of(idx, r, &n, &classes, &smoothing, &scale);
    size_t nc = (size_t)n * classes;
    float *logits = case_f32(c, nc), *w = case_f32(c, n);
    int32_t *la = case_i32(c, n), *lb = case_i32(c, n);
    fill_unif(r, logits, nc, -scale, scale);
    fill_mix(r, la, lb, w, n, classes);
    c->op.kind = MGT_OP_XENT_FWD;
    c->op.u.xent_fwd.loss = case_f32(c, 1);
    c->op.u.xent_fwd.probs = case_f32(c, nc);
    c->op.u.xent_fwd.logits = logits;
    c->op.u.xent_fwd.labels = la;
    c->op.u.xent_fwd.labels_b = lb;
    c->op.u.xent_fwd.weights = w;
    c->op.u.xent_fwd.n = n;
    c->op.u.xent_fwd.classes = classes;
    c->op.u.xent_fwd.smoothing = smoothing;
    c->rtol = tol_for(classes) * 4;
    case_desc(c, "n=%d classes=%d smoothing=%g logits=+-%g mixed", n, classes, (double)smoothing,
              (double)scale);
    return true;
}

static bool xent_mixed_bwd(tcase *c, int idx, rng *r)
{
    if (idx >= N_XENT_CASES)
        return false;
    int n, classes;
    float smoothing, lscale;
    xent_shape_of(idx, r, &n, &classes, &smoothing, &lscale);
    size_t nc = (size_t)n * classes;
    float *probs = case_f32(c, nc), *w = case_f32(c, n);
    int32_t *la = case_i32(c, n), *lb = case_i32(c, n);
    for (int i = 0; i < n; i++) {
        double s = 0;
        float *p = probs + (size_t)i * classes;
        for (int j = 0; j < classes; j++)
            s += (p[j] = (float)exp(rng_unif(r, -lscale, lscale)));
        for (int j = 0; j < classes; j++)
            p[j] = (float)(p[j] / s);
    }
    fill_mix(r, la, lb, w, n, classes);
    static const float scales[] = {0, 1.0f, 0.37f};
    float scale = idx % 3 == 0 ? 1.0f / n : scales[idx % 3];
    c->op.kind = MGT_OP_XENT_BWD;
    c->op.u.xent_bwd.dlogits = case_f32(c, nc);
    c->op.u.xent_bwd.probs = probs;
    c->op.u.xent_bwd.labels = la;
    c->op.u.xent_bwd.labels_b = lb;
    c->op.u.xent_bwd.weights = w;
    c->op.u.xent_bwd.n = n;
    c->op.u.xent_bwd.classes = classes;
    c->op.u.xent_bwd.smoothing = smoothing;
    c->op.u.xent_bwd.scale = scale;
    c->rtol = 4e-6;
    case_desc(c, "n=%d classes=%d smoothing=%g scale=%g mixed", n, classes, (double)smoothing,
              (double)scale);
    return true;
}

/* The plain cases (one-hot targets), then the mixed ones. */
static bool gen_xent_fwd(tcase *c, int idx, rng *r)
{
    if (idx < N_XENT_CASES)
        return xent_plain_fwd(c, idx, r);
    rng vr = variant_rng("softmax_xent_mix_forward", idx - N_XENT_CASES);
    return xent_mixed_fwd(c, idx - N_XENT_CASES, &vr);
}

/* Softmax cross-entropy: L = the forward's mean loss; the backward with scale 1/n is its
   gradient for the logits. A larger step: the loss is smooth, and one float of it carries
   all the signal. */
static bool fd_xent(tcase *c, int t)
{
    static const int shapes[][3] = {{1, 10, 0}, {4, 10, 1}, {3, 5, 1}, {8, 7, 0}, {2, 1, 0}};
    if (t >= 10)
        return false;
    bool mixed = t >= 5; /* one-hot targets, then mixed ones */
    t %= 5;
    fd_part *f = fd_begin(c, rng_for(mixed ? 710 : 700, t, 7));
    rng *r = &f->r;
    int n = shapes[t][0], classes = shapes[t][1];
    float smoothing = shapes[t][2] ? 0.1f : 0.0f;
    size_t nc = (size_t)n * classes;
    float *logits = case_f32(c, nc), *probs = case_f32(c, nc), *loss = case_f32(c, 1);
    float *dl = case_f32(c, nc), *one = case_f32(c, 1), *w = mixed ? case_f32(c, n) : NULL;
    int32_t *la = case_i32(c, n), *lb = mixed ? case_i32(c, n) : NULL;
    fill_unif(r, logits, nc, -2, 2);
    if (mixed)
        fill_mix(r, la, lb, w, n, classes);
    else
        fill_labels(r, la, n, classes);
    one[0] = 1;
    case_desc(c, "n=%d classes=%d smoothing=%g%s", n, classes, (double)smoothing,
              mixed ? " mixed" : "");
    mgt_op fwd = {.kind = MGT_OP_XENT_FWD};
    fwd.u.xent_fwd = (mgt_xent_fwd_args){loss, probs, logits, la, lb, w, n, classes, smoothing};
    mgt_op bwd = {.kind = MGT_OP_XENT_BWD};
    bwd.u.xent_bwd =
        (mgt_xent_bwd_args){dl, probs, la, lb, w, n, classes, smoothing, 1.0f / (float)n};
    fd_ops(f, &fwd, &bwd, true, (fd_term){loss, one, 1}, 5e-2f);
    fd_wrt_add(f, logits, nc, dl, "logits");
    return true;
}

/* The plain cases and the mixed ones, then the finite differences of each. */
static bool gen_xent_bwd(tcase *c, int idx, rng *r)
{
    if (idx < N_XENT_CASES)
        return xent_plain_bwd(c, idx, r);
    idx -= N_XENT_CASES;
    rng vr = variant_rng("softmax_xent_mix_backward", idx);
    if (xent_mixed_bwd(c, idx, &vr))
        return true;
    idx -= N_XENT_CASES;
    return fd_xent(c, idx);
}

/* n, classes, k, ties */
static const int topk_shapes[][4] = {
    {1, 10, 1, 0},  {1, 10, 5, 0}, {8, 10, 1, 1},    {8, 10, 5, 1}, {32, 100, 5, 0},
    {5, 5, 5, 1},   {7, 6, 5, 1},  {16, 1000, 1, 0}, {3, 1, 1, 0},  {50, 7, 1, 1},
    {64, 20, 5, 1}, {2, 3, 1, 1},  {40, 1000, 5, 1}};
#define N_TOPK_SHAPES ((int)(sizeof topk_shapes / sizeof topk_shapes[0]))

static bool gen_topk(tcase *c, int idx, rng *r)
{
    if (idx >= N_TOPK_SHAPES + 5)
        return false;
    int n, classes, k, ties;
    /* the last two: NaN and infinite logits, the label's among them (a diverged model) */
    bool nonfinite = idx >= N_TOPK_SHAPES + 3;
    if (idx < N_TOPK_SHAPES) {
        n = topk_shapes[idx][0];
        classes = topk_shapes[idx][1];
        k = topk_shapes[idx][2];
        ties = topk_shapes[idx][3];
    } else {
        n = rng_int(r, 1, 60);
        classes = rng_int(r, 1, 50);
        k = rng_int(r, 0, 1) ? 5 : 1;
        ties = 1;
    }
    size_t nc = (size_t)n * classes;
    float *logits = case_f32(c, nc);
    int32_t *labels = case_i32(c, n);
    fill_labels(r, labels, n, classes);
    for (int i = 0; i < n; i++) {
        float *z = logits + (size_t)i * classes;
        for (int j = 0; j < classes; j++)
            z[j] = ties ? (float)rng_int(r, 0, 3) : rng_unif(r, -3, 3);
        /* every other row with ties: the label ties with the row's maximum */
        if (ties && i % 2) {
            float mx = z[0];
            for (int j = 1; j < classes; j++)
                mx = z[j] > mx ? z[j] : mx;
            z[labels[i]] = mx;
        }
        const float odd[3] = {NAN, INFINITY, -INFINITY};
        for (int j = 0; nonfinite && j < classes; j++)
            if (rng_int(r, 0, 3) == 0)
                z[j] = odd[rng_int(r, 0, 2)];
    }
    int32_t *count = case_i32(c, 1);
    count[0] = rng_int(r, 0, 1000); /* accumulates */
    c->op.kind = MGT_OP_TOPK;
    c->op.u.topk.count = count;
    c->op.u.topk.logits = logits;
    c->op.u.topk.labels = labels;
    c->op.u.topk.n = n;
    c->op.u.topk.classes = classes;
    c->op.u.topk.k = k;
    c->rtol = 0;
    case_desc(c, "n=%d classes=%d k=%d%s%s", n, classes, k, ties ? " ties" : "",
              nonfinite ? " nan/inf" : "");
    return true;
}

typedef struct sgd_case {
    int n;
    float lr, momentum, dampening, wd, grad_scale;
    bool nesterov, first_step;
} sgd_case;

static const sgd_case sgd_cases[] = {
    {1, 0.1f, 0, 0, 0, 1, false, false},
    {1000, 0.1f, 0.9f, 0, 0, 1, false, false},
    {1000, 0.1f, 0.9f, 0, 5e-4f, 1, true, false},
    {777, 0.05f, 0.9f, 0, 1e-4f, 0.5f, false, true},
    {777, 0.05f, 0.9f, 0, 1e-4f, 0.5f, true, true},
    {33, 0.2f, 0.5f, 0.1f, 0, 1, false, false},
    {65537, 0.01f, 0.9f, 0, 5e-4f, 0.25f, true, false},
    {5, 0.1f, 0, 0, 1e-2f, 2, false, false},
    {5, 0.1f, 0, 0, 0, 1, false, true},
    {4099, 0.4f, 0.99f, 0.5f, 1e-3f, 0.125f, false, false},
    {2, 0, 0.9f, 0, 5e-4f, 1, false, false},
    {100003, 0.1f, 0.9f, 0, 5e-5f, 1, false, false},
};
#define N_SGD_CASES ((int)(sizeof sgd_cases / sizeof sgd_cases[0]))

static bool gen_sgd(tcase *c, int idx, rng *r)
{
    if (idx >= N_SGD_CASES + 3)
        return false;
    sgd_case sc;
    if (idx < N_SGD_CASES) {
        sc = sgd_cases[idx];
    } else {
        sc.n = rng_int(r, 1, 5000);
        sc.lr = rng_unif(r, 0, 0.5f);
        sc.momentum = rng_int(r, 0, 2) ? rng_unif(r, 0.1f, 0.99f) : 0;
        sc.nesterov = sc.momentum > 0 && rng_int(r, 0, 1);
        sc.dampening = sc.nesterov || rng_int(r, 0, 1) ? 0 : rng_unif(r, 0, 0.5f);
        sc.wd = rng_int(r, 0, 1) ? rng_unif(r, 0, 1e-2f) : 0;
        sc.grad_scale = rng_unif(r, 0.1f, 2);
        sc.first_step = rng_int(r, 0, 3) == 0;
    }
    float *param = case_f32(c, sc.n), *grad = case_f32(c, sc.n);
    fill_unif(r, param, sc.n, -1, 1);
    fill_unif(r, grad, sc.n, -1, 1);
    c->op.kind = MGT_OP_SGD;
    c->op.u.sgd.param = param;
    /* With momentum 0 the buffer is optional and left NULL: op.h lists no operand for it. */
    if (sc.momentum != 0) {
        c->op.u.sgd.momentum_buf = case_f32(c, sc.n);
        fill_unif(r, c->op.u.sgd.momentum_buf, sc.n, -1, 1);
    }
    c->op.u.sgd.grad = grad;
    c->op.u.sgd.n = (size_t)sc.n;
    c->op.u.sgd.p = (mgt_sgd_params){.lr = sc.lr,
                                     .momentum = sc.momentum,
                                     .dampening = sc.dampening,
                                     .weight_decay = sc.wd,
                                     .grad_scale = sc.grad_scale,
                                     .nesterov = sc.nesterov,
                                     .first_step = sc.first_step};
    c->rtol = 2e-6;
    case_desc(c, "n=%d lr=%g m=%g damp=%g wd=%g scale=%g%s%s", sc.n, (double)sc.lr,
              (double)sc.momentum, (double)sc.dampening, (double)sc.wd, (double)sc.grad_scale,
              sc.nesterov ? " nesterov" : "", sc.first_step ? " first_step" : "");
    return true;
}

/* AdamW from step t with moments drawn as a run would have them (v >= 0); the bias
   corrections worked out as mgt/optim.h's optimizer does. */
static bool gen_adamw(tcase *c, int idx, rng *r)
{
    static const int ns[] = {1, 1000, 777, 65537, 5, 4099};
    static const int steps[] = {1, 2, 10, 1, 1000, 3};
    if (idx >= 6 + 3)
        return false;
    int n = idx < 6 ? ns[idx] : rng_int(r, 1, 5000);
    int t = idx < 6 ? steps[idx] : rng_int(r, 1, 50);
    double lr = idx < 6 ? 1e-3 * (idx + 1) : rng_unif(r, 0, 0.01f);
    double wd = idx % 2 ? 0.05 : idx == 4 ? 0 : 1e-4;
    float b1 = idx == 5 ? 0.5f : 0.9f, b2 = idx == 5 ? 0.9f : 0.999f;
    float *param = case_f32(c, n), *grad = case_f32(c, n);
    float *m = case_f32(c, n), *v = case_f32(c, n);
    fill_unif(r, param, n, -1, 1);
    fill_unif(r, grad, n, -1, 1);
    fill_unif(r, m, n, -0.1f, 0.1f);
    fill_unif(r, v, n, 0, 0.01f);
    if (t == 1) /* the first step starts from zero moments */
        for (int i = 0; i < n; i++)
            m[i] = v[i] = 0;
    c->op.kind = MGT_OP_ADAMW;
    c->op.u.adamw.param = param;
    c->op.u.adamw.exp_avg = m;
    c->op.u.adamw.exp_avg_sq = v;
    c->op.u.adamw.grad = grad;
    c->op.u.adamw.n = (size_t)n;
    c->op.u.adamw.p = (mgt_adamw_params){.beta1 = b1,
                                         .beta2 = b2,
                                         .eps = 1e-8f,
                                         .grad_scale = idx == 2 ? 0.25f : 1.0f,
                                         .decay = (float)(1 - lr * wd),
                                         .step_size = (float)(lr / (1 - pow(b1, t))),
                                         .bc2_sqrt = (float)sqrt(1 - pow(b2, t))};
    c->rtol = 4e-6;
    case_desc(c, "n=%d t=%d lr=%g wd=%g betas=%g,%g", n, t, lr, wd, (double)b1, (double)b2);
    return true;
}

static bool gen_rmsprop(tcase *c, int idx, rng *r)
{
    static const int ns[] = {1, 1000, 777, 65537, 5, 4099};
    if (idx >= 6 + 3)
        return false;
    int n = idx < 6 ? ns[idx] : rng_int(r, 1, 5000);
    float momentum = idx % 3 == 0 ? 0.0f : 0.9f;
    float *param = case_f32(c, n), *grad = case_f32(c, n), *sq = case_f32(c, n);
    fill_unif(r, param, n, -1, 1);
    fill_unif(r, grad, n, -1, 1);
    fill_unif(r, sq, n, 0, idx == 1 ? 0.0f : 0.01f);
    c->op.kind = MGT_OP_RMSPROP;
    c->op.u.rmsprop.param = param;
    c->op.u.rmsprop.square_avg = sq;
    if (momentum != 0) {
        c->op.u.rmsprop.momentum_buf = case_f32(c, n);
        fill_unif(r, c->op.u.rmsprop.momentum_buf, n, -0.1f, 0.1f);
    }
    c->op.u.rmsprop.grad = grad;
    c->op.u.rmsprop.n = (size_t)n;
    c->op.u.rmsprop.p = (mgt_rmsprop_params){.lr = idx < 6 ? 0.01f * (idx + 1) : 0.05f,
                                             .alpha = 0.9f,
                                             .eps = idx == 4 ? 1e-8f : 0.0316f,
                                             .weight_decay = idx % 2 ? 1e-4f : 0.0f,
                                             .momentum = momentum,
                                             .grad_scale = idx == 2 ? 0.5f : 1.0f};
    c->rtol = 4e-6;
    case_desc(c, "n=%d lr=%g m=%g wd=%g eps=%g", n, (double)c->op.u.rmsprop.p.lr, (double)momentum,
              (double)c->op.u.rmsprop.p.weight_decay, (double)c->op.u.rmsprop.p.eps);
    return true;
}

/* ---- mixed precision ---- */

/* Gemm and convolution variants: the fp32 cases with their inputs rounded: bf16 and fp16 alternate. The device sums in fp32
   what the reference sums in double, as for the fp32 kinds; a backend that skipped the
   rounding would be off by about 2^-9 (bf16) or 2^-12 (fp16) of each input, far past the
   tolerance. No finite differences: a rounded function is a staircase. */
static bool gen_lowp(tcase *c, int idx, mgt_op_kind kind, const char *seed)
{
    mgt_precision prec = (idx / 2) % 2 ? MGT_PREC_FP16 : MGT_PREC_BF16;
    rng vr = variant_rng(seed, idx);
    bool ok = kind == MGT_OP_GEMM ? gemm_case(c, idx, &vr) : gen_conv(c, idx, &vr, kind);
    if (!ok)
        return false;
    c->op.prec = prec;
    c->rtol *= 2;
    size_t len = strlen(c->desc);
    snprintf(c->desc + len, sizeof c->desc - len, " %s", mgt_precision_name(prec));
    return true;
}

/* Values that probe a cast: exact ties of both formats, the largest finite fp16 and the first
   value that rounds past it, fp16 subnormals and what underflows, infinities, NaN, and values
   over FLT_MAX's bf16 rounding; the rest uniform over many binades. */
static float cast_value(rng *r, size_t i)
{
    static const float special[] = {0.0f,
                                    -0.0f,
                                    1.0f + 0x1p-8f,
                                    1.0f + 0x3p-8f,
                                    1.0f + 0x1p-11f,
                                    1.0f + 0x3p-11f,
                                    65504.0f,
                                    65519.99f,
                                    65520.0f,
                                    -1e6f,
                                    0x1p-24f,
                                    0x1p-25f,
                                    0x3p-26f,
                                    0x1.8p-15f,
                                    INFINITY,
                                    -INFINITY,
                                    NAN,
                                    3.4e38f,
                                    -3.4028235e38f,
                                    1e-40f};
    size_t ns = sizeof special / sizeof special[0];
    if (i < ns)
        return special[i];
    float m = rng_unif(r, -2.0f, 2.0f);
    return ldexpf(m, rng_int(r, -30, 20));
}

static bool gen_cast(tcase *c, int idx, rng *r)
{
    bool to16 = c->op.kind == MGT_OP_CAST_TO_16;
    if (idx >= 12)
        return false;
    size_t n = vec_sizes[idx];
    mgt_precision prec = idx % 2 ? MGT_PREC_FP16 : MGT_PREC_BF16;
    c->op.kind = to16 ? MGT_OP_CAST_TO_16 : MGT_OP_CAST_FROM_16;
    c->op.u.cast.n = n;
    c->op.prec = prec;
    size_t nw = (n + 1) / 2;
    if (to16) {
        float *x = case_f32(c, n);
        for (size_t i = 0; i < n; i++)
            x[i] = cast_value(r, i);
        c->op.u.cast.src = x;
        c->op.u.cast.dst = case_f32(c, nw);
    } else {
        uint16_t *h = (uint16_t *)case_f32(c, nw);
        for (size_t i = 0; i < n; i++) /* every code, NaNs and subnormals too */
            h[i] = i < 65536 && n > 60000 ? (uint16_t)i : (uint16_t)rng_u64(r);
        c->op.u.cast.src = h;
        c->op.u.cast.dst = case_f32(c, n);
    }
    c->rtol = 0;
    case_desc(c, "n=%zu %s", n, mgt_precision_name(prec));
    return true;
}

static bool gen_nonfinite(tcase *c, int idx, rng *r)
{
    if (idx >= 12)
        return false;
    size_t n = vec_sizes[idx];
    float *x = case_f32(c, n);
    fill_unif(r, x, n, -3e38f, 3e38f);
    /* none in the even cases, a few (maybe on the same element) in the odd ones */
    int bad = idx % 2 ? rng_int(r, 1, 9) : 0;
    for (int b = 0; b < bad; b++) {
        size_t at = (size_t)rng_int(r, 0, (int)(n - 1));
        x[at] = b % 3 == 0 ? INFINITY : b % 3 == 1 ? -INFINITY : NAN;
    }
    c->op.kind = MGT_OP_NONFINITE;
    c->op.u.nonfinite.count = case_i32(c, 1);
    c->op.u.nonfinite.x = x;
    c->op.u.nonfinite.n = n;
    case_desc(c, "n=%zu with %d set nonfinite", n, bad);
    return true;
}

/* ---- activations, channel scaling ---- */

static const size_t act_sizes[] = {1, 7, 1000, 65539};
#define N_ACT_SIZES ((int)(sizeof act_sizes / sizeof act_sizes[0]))

/* x over [-8, 8] with every kink (0, 6, +-3) and both zeros present exactly. */
static void fill_act_x(rng *r, float *x, size_t n)
{
    static const float kinks[] = {0.0f, -0.0f, 6.0f, 3.0f, -3.0f};
    fill_unif(r, x, n, -8, 8);
    for (size_t i = 0; i < n; i += 7)
        x[i] = kinks[(i / 7) % 5];
}

/* Where exp overflows, underflows to denormals and to 0, infinities and a NaN, each with
   both signs, among values over [-120, 120]. */
static void fill_act_extremes(rng *r, float *x, size_t n)
{
    static const float ends[] = {88.5f, 88.8f, 89.5f,  100.0f, 103.5f,   104.5f,
                                 87.0f, 86.5f, 1e-40f, 1e-30f, INFINITY, NAN};
    const size_t count = sizeof ends / sizeof ends[0];
    fill_unif(r, x, n, -120, 120);
    for (size_t i = 0; i < n; i += 3)
        x[i] = (i / 3) % 2 ? -ends[(i / 6) % count] : ends[(i / 6) % count];
}

/* Cases: every activation at every size; y = x (or dx = dy) on every third; then every
   activation once more at n=1001 on fill_act_extremes' inputs. Tolerance: a few ulp of the
   result, or of 1 where it is small (gelu's and silu's tails cancel in float, as in
   PyTorch's float kernels); an infinity must match the reference's, a NaN be a NaN. */
static bool gen_act(tcase *c, int idx, rng *r, bool fwd)
{
    const int plain = N_ACT_SIZES * MGT_ACT_COUNT;
    if (idx >= plain + MGT_ACT_COUNT)
        return false;
    bool extremes = idx >= plain;
    size_t n = extremes ? 1001 : act_sizes[idx % N_ACT_SIZES];
    mgt_act act = (mgt_act)(extremes ? idx - plain : idx / N_ACT_SIZES);
    bool alias = idx % 3 == 2;
    float *x = case_f32(c, n);
    if (extremes)
        fill_act_extremes(r, x, n);
    else
        fill_act_x(r, x, n);
    if (fwd) {
        c->op.kind = MGT_OP_ACT_FWD;
        c->op.u.act_fwd.y = alias ? x : case_f32(c, n);
        c->op.u.act_fwd.x = x;
        c->op.u.act_fwd.n = n;
        c->op.u.act_fwd.act = act;
    } else {
        float *dy = case_f32(c, n);
        fill_unif(r, dy, n, -1, 1);
        c->op.kind = MGT_OP_ACT_BWD;
        c->op.u.act_bwd.dx = alias ? dy : case_f32(c, n);
        c->op.u.act_bwd.dy = dy;
        c->op.u.act_bwd.x = x;
        c->op.u.act_bwd.n = n;
        c->op.u.act_bwd.act = act;
    }
    c->rtol = 4e-6;
    c->mag = 1;
    case_desc(c, "%s n=%zu%s%s", mgt_act_name(act), n, extremes ? " extremes" : "",
              alias ? (fwd ? " y=x" : " dx=dy") : "");
    return true;
}

static bool gen_act_fwd(tcase *c, int idx, rng *r) { return gen_act(c, idx, r, true); }

/* Each activation away from its kinks (0 and 6, +-3) by 0.05 or more, so x +- h never
   crosses one; inputs over [-5, 7]. */
static bool fd_act(tcase *c, int t)
{
    static const float kinks[] = {0.0f, 6.0f, 3.0f, -3.0f};
    if (t >= MGT_ACT_COUNT * 2)
        return false;
    fd_part *f = fd_begin(c, rng_for(800, t, 7));
    rng *r = &f->r;
    mgt_act act = (mgt_act)(t / 2);
    size_t n = t % 2 ? 257 : 9;
    float *x = case_f32(c, n), *y = case_f32(c, n), *rw = case_f32(c, n);
    float *dx = case_f32(c, n);
    for (size_t i = 0; i < n; i++) {
        float v;
        bool near;
        do {
            v = rng_unif(r, -5, 7);
            near = false;
            for (int k = 0; k < 4; k++)
                near = near || fabsf(v - kinks[k]) < 0.05f;
        } while (near);
        x[i] = v;
    }
    fill_unif(r, rw, n, -1, 1);
    case_desc(c, "%s n=%zu", mgt_act_name(act), n);
    mgt_op fwd = {.kind = MGT_OP_ACT_FWD};
    fwd.u.act_fwd.y = y;
    fwd.u.act_fwd.x = x;
    fwd.u.act_fwd.n = n;
    fwd.u.act_fwd.act = act;
    mgt_op bwd = {.kind = MGT_OP_ACT_BWD};
    bwd.u.act_bwd.dx = dx;
    bwd.u.act_bwd.dy = rw;
    bwd.u.act_bwd.x = x;
    bwd.u.act_bwd.n = n;
    bwd.u.act_bwd.act = act;
    fd_ops(f, &fwd, &bwd, false, (fd_term){y, rw, n}, 1e-2f);
    fd_wrt_add(f, x, n, dx, "x");
    return true;
}

static bool gen_act_bwd(tcase *c, int idx, rng *r)
{
    return gen_act(c, idx, r, false) || fd_act(c, idx - (N_ACT_SIZES + 1) * MGT_ACT_COUNT);
}

/* n, c, hw, shared */
static const int chscale_shapes[][4] = {
    {1, 1, 1, 0},  {2, 3, 5, 0}, {2, 16, 49, 0}, {4, 1, 300, 0}, /* c = 1: per image */
    {3, 40, 1, 0}, {1, 1, 1, 1}, {2, 3, 5, 1},   {2, 16, 49, 1}, {5, 96, 196, 1}, {2, 7, 4099, 0},
};
#define N_CHSCALE_SHAPES ((int)(sizeof chscale_shapes / sizeof chscale_shapes[0]))
/* in nChw16c (the mock devices' squeeze-excite inside a blocked body), after the NCHW ones */
static const int chscale_blocked_shapes[][4] = {
    {2, 16, 49, 0}, {3, 32, 7, 0}, {1, 48, 1, 0}, {5, 96, 196, 1}, {2, 16, 13, 1}};
#define N_CHSCALE_BLOCKED ((int)(sizeof chscale_blocked_shapes / sizeof chscale_blocked_shapes[0]))

/* Every shape; backward also without dscale (the stochastic-depth use) and with dx = dy. */
static bool gen_chscale(tcase *c, int idx, rng *r, bool fwd)
{
    int reps = fwd ? 1 : 3;
    bool blocked = idx >= N_CHSCALE_SHAPES * reps;
    if (blocked)
        idx -= N_CHSCALE_SHAPES * reps;
    int per = blocked ? N_CHSCALE_BLOCKED : N_CHSCALE_SHAPES;
    if (idx >= per * reps)
        return false;
    const int *shp = blocked ? chscale_blocked_shapes[idx % per] : chscale_shapes[idx % per];
    int n = shp[0], ch = shp[1], hw = shp[2], variant = idx / per;
    mgt_layout layout = blocked ? MGT_LAYOUT_NCHW16C : MGT_LAYOUT_NCHW;
    bool shared = shp[3] != 0;
    size_t nx = (size_t)n * ch * hw, ns = (size_t)(shared ? 1 : n) * ch;
    float *x = case_f32(c, nx), *sc = case_f32(c, ns);
    fill_unif(r, x, nx, -2, 2);
    fill_unif(r, sc, ns, -1.5f, 1.5f);
    if (fwd) {
        c->op.kind = MGT_OP_CHSCALE_FWD;
        c->op.u.chscale_fwd.y = case_f32(c, nx);
        c->op.u.chscale_fwd.x = x;
        c->op.u.chscale_fwd.scale = sc;
        c->op.u.chscale_fwd.n = n;
        c->op.u.chscale_fwd.c = ch;
        c->op.u.chscale_fwd.hw = hw;
        c->op.u.chscale_fwd.shared = shared;
        c->op.u.chscale_fwd.layout = layout;
        c->rtol = 0;
    } else {
        float *dy = case_f32(c, nx), *ds = variant == 1 ? NULL : case_f32(c, ns);
        fill_unif(r, dy, nx, -1, 1);
        if (ds)
            fill_unif(r, ds, ns, -1, 1); /* accumulated onto with shared */
        c->op.kind = MGT_OP_CHSCALE_BWD;
        c->op.u.chscale_bwd.dx = variant == 2 ? dy : case_f32(c, nx);
        c->op.u.chscale_bwd.dscale = ds;
        c->op.u.chscale_bwd.dy = dy;
        c->op.u.chscale_bwd.x = x;
        c->op.u.chscale_bwd.scale = sc;
        c->op.u.chscale_bwd.n = n;
        c->op.u.chscale_bwd.c = ch;
        c->op.u.chscale_bwd.hw = hw;
        c->op.u.chscale_bwd.shared = shared;
        c->op.u.chscale_bwd.layout = layout;
        c->rtol = tol_for((double)hw * (shared ? n : 1)) * 2;
        c->mag = 1;
    }
    case_desc(c, "n=%d c=%d hw=%d%s%s%s", n, ch, hw, shared ? " shared" : "",
              fwd            ? ""
              : variant == 1 ? " no dscale"
              : variant == 2 ? " dx=dy"
                             : "",
              blocked ? " nChw16c" : "");
    return true;
}

static bool gen_chscale_fwd(tcase *c, int idx, rng *r) { return gen_chscale(c, idx, r, true); }

/* y = x * scale: dx and dscale (per image and shared) against differences of the forward. */
static bool fd_chscale(tcase *c, int t)
{
    static const int pick[] = {1, 2, 3, 6, 7};
    if (t >= (int)(sizeof pick / sizeof pick[0]))
        return false;
    fd_part *f = fd_begin(c, rng_for(900, t, 7));
    rng *r = &f->r;
    const int *shp = chscale_shapes[pick[t]];
    int n = shp[0], ch = shp[1], hw = shp[2];
    bool shared = shp[3] != 0;
    size_t nx = (size_t)n * ch * hw, ns = (size_t)(shared ? 1 : n) * ch;
    float *x = case_f32(c, nx), *sc = case_f32(c, ns), *y = case_f32(c, nx);
    float *rw = case_f32(c, nx), *dx = case_f32(c, nx), *ds = case_f32(c, ns);
    fill_unif(r, x, nx, -1, 1);
    fill_unif(r, sc, ns, -1, 1);
    fill_unif(r, rw, nx, -1, 1);
    case_desc(c, "n=%d c=%d hw=%d%s", n, ch, hw, shared ? " shared" : "");
    mgt_op fwd = {.kind = MGT_OP_CHSCALE_FWD};
    fwd.u.chscale_fwd.y = y;
    fwd.u.chscale_fwd.x = x;
    fwd.u.chscale_fwd.scale = sc;
    fwd.u.chscale_fwd.n = n;
    fwd.u.chscale_fwd.c = ch;
    fwd.u.chscale_fwd.hw = hw;
    fwd.u.chscale_fwd.shared = shared;
    mgt_op bwd = {.kind = MGT_OP_CHSCALE_BWD};
    bwd.u.chscale_bwd.dx = dx;
    bwd.u.chscale_bwd.dscale = ds;
    bwd.u.chscale_bwd.dy = rw;
    bwd.u.chscale_bwd.x = x;
    bwd.u.chscale_bwd.scale = sc;
    bwd.u.chscale_bwd.n = n;
    bwd.u.chscale_bwd.c = ch;
    bwd.u.chscale_bwd.hw = hw;
    bwd.u.chscale_bwd.shared = shared;
    fd_ops(f, &fwd, &bwd, false, (fd_term){y, rw, nx}, 1e-2f);
    fd_wrt_add(f, x, nx, dx, "x");
    fd_wrt_add(f, sc, ns, ds, "scale");
    return true;
}

static bool gen_chscale_bwd(tcase *c, int idx, rng *r)
{
    return gen_chscale(c, idx, r, false) || fd_chscale(c, idx - 3 * N_CHSCALE_SHAPES);
}

/* n, c, hw */
static const int lnc_shapes[][3] = {
    {1, 1, 1},    {2, 3, 5},     {2, 16, 49}, {1, 96, 64},
    {3, 7, 1},    {2, 5, 1031},  {37, 96, 1}, {197, 64, 1}, /* hw 1: the row path */
    {3, 1031, 1}, {1000, 33, 1},
};
#define N_LNC_SHAPES ((int)(sizeof lnc_shapes / sizeof lnc_shapes[0]))

static void lnc_fill(mgt_op *op, bool fwd, float *y, float *dx, float *dw, float *db,
                     const float *dy, const float *x, const float *w, const float *b,
                     const int *shp)
{
    if (fwd) {
        op->kind = MGT_OP_LNC_FWD;
        op->u.lnc_fwd.y = y;
        op->u.lnc_fwd.x = x;
        op->u.lnc_fwd.weight = w;
        op->u.lnc_fwd.bias = b;
        op->u.lnc_fwd.n = shp[0];
        op->u.lnc_fwd.c = shp[1];
        op->u.lnc_fwd.hw = shp[2];
        op->u.lnc_fwd.eps = 1e-6f;
    } else {
        op->kind = MGT_OP_LNC_BWD;
        op->u.lnc_bwd.dx = dx;
        op->u.lnc_bwd.dweight = dw;
        op->u.lnc_bwd.dbias = db;
        op->u.lnc_bwd.dy = dy;
        op->u.lnc_bwd.x = x;
        op->u.lnc_bwd.weight = w;
        op->u.lnc_bwd.n = shp[0];
        op->u.lnc_bwd.c = shp[1];
        op->u.lnc_bwd.hw = shp[2];
        op->u.lnc_bwd.eps = 1e-6f;
    }
}

#define N_LNC_CASES (N_LNC_SHAPES)

static bool gen_lnc(tcase *c, int idx, rng *r, bool fwd)
{
    if (idx >= N_LNC_CASES)
        return false;
    const int *shp = lnc_shapes[idx];
    size_t nx = (size_t)shp[0] * shp[1] * shp[2], nc = (size_t)shp[1];
    float *x = case_f32(c, nx), *w = case_f32(c, nc), *b = case_f32(c, nc);
    fill_unif(r, x, nx, -2, 2);
    fill_unif(r, w, nc, -1.5f, 1.5f);
    fill_unif(r, b, nc, -1, 1);
    if (fwd) {
        lnc_fill(&c->op, true, case_f32(c, nx), NULL, NULL, NULL, NULL, x, w, b, shp);
        c->rtol = tol_for((double)shp[1]) * 2;
        c->mag = 1;
    } else {
        float *dy = case_f32(c, nx), *dw = case_f32(c, nc), *db = case_f32(c, nc);
        fill_unif(r, dy, nx, -1, 1);
        fill_unif(r, dw, nc, -1, 1); /* added on */
        fill_unif(r, db, nc, -1, 1);
        lnc_fill(&c->op, false, NULL, case_f32(c, nx), dw, db, dy, x, w, NULL, shp);
        c->rtol = tol_for((double)shp[0] * shp[2] + shp[1]) * 2;
        c->mag = 1;
    }
    case_desc(c, "n=%d c=%d hw=%d", shp[0], shp[1], shp[2]);
    return true;
}

static bool gen_lnc_fwd(tcase *c, int idx, rng *r) { return gen_lnc(c, idx, r, true); }

/* dx, dweight and dbias against differences of the forward. */
static bool fd_lnc(tcase *c, int t)
{
    static const int pick[] = {1, 2, 4};
    if (t >= (int)(sizeof pick / sizeof pick[0]))
        return false;
    fd_part *f = fd_begin(c, rng_for(910, t, 7));
    rng *r = &f->r;
    const int *shp = lnc_shapes[pick[t]];
    size_t nx = (size_t)shp[0] * shp[1] * shp[2], nc = (size_t)shp[1];
    float *x = case_f32(c, nx), *w = case_f32(c, nc), *b = case_f32(c, nc);
    float *y = case_f32(c, nx), *rw = case_f32(c, nx), *dx = case_f32(c, nx);
    float *dw = case_f32(c, nc), *db = case_f32(c, nc);
    fill_unif(r, x, nx, -1, 1);
    fill_unif(r, w, nc, -1, 1);
    fill_unif(r, b, nc, -1, 1);
    fill_unif(r, rw, nx, -1, 1);
    case_desc(c, "n=%d c=%d hw=%d", shp[0], shp[1], shp[2]);
    mgt_op fwd = {0}, bwd = {0};
    lnc_fill(&fwd, true, y, NULL, NULL, NULL, NULL, x, w, b, shp);
    lnc_fill(&bwd, false, NULL, dx, dw, db, rw, x, w, NULL, shp);
    fd_ops(f, &fwd, &bwd, false, (fd_term){y, rw, nx}, 1e-2f);
    fd_wrt_add(f, x, nx, dx, "x");
    fd_wrt_add(f, w, nc, dw, "weight");
    fd_wrt_add(f, b, nc, db, "bias");
    return true;
}

static bool gen_lnc_bwd(tcase *c, int idx, rng *r)
{
    return gen_lnc(c, idx, r, false) || fd_lnc(c, idx - N_LNC_CASES);
}

/* ---- 16-bit activation storage ----
   Every comparison case of an op that takes a storage (mgt_op_takes_store) is run again with
   its activations in 16 bits: bf16 for even cases, fp16 for odd ones. The case's activation
   arrays (the operands the op then lists as MGT_U16) become arrays of the 16-bit codes of their
   values, pointers into them keeping their element offsets; a case whose array is read both as
   an activation and as fp32 is left out. The reference widens, runs its loops and rounds each
   16-bit output once, as the devices do. */

static int array_of(const tcase *c, const void *p, size_t *elem)
{
    for (int i = 0; i < c->narr; i++) {
        const char *a = c->arr[i];
        if ((const char *)p >= a && (const char *)p < a + (c->len[i] ? c->len[i] : 1) * 4) {
            *elem = (size_t)((const char *)p - a) / 4;
            return i;
        }
    }
    return -1;
}

static bool case_to16(tcase *c, int gidx, mgt_precision prec)
{
    c->op.store_in = c->op.store_out = prec;
    if (c->op.kind == MGT_OP_BN_FWD_TRAIN) /* a fused residual add rounds where the add would */
        c->op.u.bn_train.z_round = prec;
    if (c->op.kind == MGT_OP_BN_FWD_EVAL)
        c->op.u.bn_eval.z_round = prec;
    if (c->op.kind == MGT_OP_GEMM) { /* a linear layer's: y = x W^T and dx = dy W (a and c),
                                        dW = dy^T x (a and b), the class token's sum (b) */
        int form = gidx / 2 % 3;
        c->op.u.gemm.a16 = form < 2;
        c->op.u.gemm.b16 = form > 0;
        c->op.u.gemm.c16 = form == 0;
    }
    mgt_operand ops[MGT_OP_MAX_OPERANDS];
    int n = mgt_op_operands(&c->op, ops);
    int kind[MAX_ARRAYS] = {0}; /* 1: an fp32 operand's, 2: a 16-bit one's */
    for (int i = 0; i < n; i++) {
        size_t e;
        int a = array_of(c, *ops[i].ptr, &e);
        if (a < 0)
            return false;
        int k = ops[i].dtype == MGT_U16 ? 2 : 1;
        if (kind[a] && kind[a] != k)
            return false;
        kind[a] = k;
    }
    int narr = c->narr;
    uint16_t *codes[MAX_ARRAYS] = {0};
    for (int a = 0; a < narr; a++) {
        if (kind[a] != 2)
            continue;
        codes[a] = case_array(c, c->len[a] / 2 + 2);
        const float *v = c->arr[a];
        for (size_t k = 0; k < c->len[a]; k++)
            codes[a][k] = mgt_lowp_encode(prec, v[k]);
    }
    for (int i = 0; i < n; i++) {
        size_t e = 0;
        int a = array_of(c, *ops[i].ptr, &e);
        if (a >= 0 && kind[a] == 2)
            *ops[i].ptr = codes[a] + e;
    }
    size_t len = strlen(c->desc);
    snprintf(c->desc + len, sizeof c->desc - len, " stored %s", mgt_precision_name(prec));
    return true;
}

/* The layouts an op names (mgt_layout), as a bit set: 1 << MGT_LAYOUT_NCHW16C, ... */
static unsigned op_layouts(const mgt_op *op)
{
    switch (op->kind) {
    case MGT_OP_CONV2D_FWD:
    case MGT_OP_CONV2D_BWD_DATA:
    case MGT_OP_CONV2D_BWD_FILTER:
        return 1u << op->u.conv.sh.x_layout | 1u << op->u.conv.sh.y_layout;
    case MGT_OP_BN_FWD_TRAIN: return 1u << op->u.bn_train.sh.layout;
    case MGT_OP_BN_FWD_EVAL: return 1u << op->u.bn_eval.sh.layout;
    case MGT_OP_BN_BWD: return 1u << op->u.bn_bwd.sh.layout;
    case MGT_OP_MAXPOOL_FWD: return 1u << op->u.maxpool_fwd.sh.layout;
    case MGT_OP_MAXPOOL_BWD: return 1u << op->u.maxpool_bwd.sh.layout;
    case MGT_OP_AVGPOOL_FWD: return 1u << op->u.avgpool_fwd.layout;
    case MGT_OP_AVGPOOL_BWD: return 1u << op->u.avgpool_bwd.layout;
    case MGT_OP_APOOL_FWD: return 1u << op->u.apool_fwd.layout;
    case MGT_OP_APOOL_BWD: return 1u << op->u.apool_bwd.layout;
    case MGT_OP_CHBIAS_FWD: return 1u << op->u.chbias_fwd.layout;
    case MGT_OP_CHBIAS_BWD: return 1u << op->u.chbias_bwd.layout;
    case MGT_OP_CHSCALE_FWD: return 1u << op->u.chscale_fwd.layout;
    case MGT_OP_CHSCALE_BWD: return 1u << op->u.chscale_bwd.layout;
    case MGT_OP_LNC_FWD: return 1u << op->u.lnc_fwd.layout;
    case MGT_OP_LNC_BWD: return 1u << op->u.lnc_bwd.layout;
    case MGT_OP_DROPOUT: return 1u << op->u.dropout.layout;
    default: return 1u << MGT_LAYOUT_NCHW;
    }
}

/* The NHWC (channels-last) form of an NCHW case of a kind that takes a layout: the same data
   read as NHWC, which the reference handles through mgt_layout_at; false for other kinds and
   for cases in another layout. With case_to16 after it, this is what a CUDA model's body runs
   under --amp. */
/* Whether ops of this kind take a layout (mgt_layout). */
static bool takes_layout(mgt_op_kind kind)
{
    switch (kind) {
    case MGT_OP_CONV2D_FWD:
    case MGT_OP_CONV2D_BWD_DATA:
    case MGT_OP_CONV2D_BWD_FILTER:
    case MGT_OP_BN_FWD_TRAIN:
    case MGT_OP_BN_FWD_EVAL:
    case MGT_OP_BN_BWD:
    case MGT_OP_MAXPOOL_FWD:
    case MGT_OP_MAXPOOL_BWD:
    case MGT_OP_AVGPOOL_FWD:
    case MGT_OP_AVGPOOL_BWD:
    case MGT_OP_APOOL_FWD:
    case MGT_OP_APOOL_BWD:
    case MGT_OP_CHBIAS_FWD:
    case MGT_OP_CHBIAS_BWD:
    case MGT_OP_CHSCALE_FWD:
    case MGT_OP_CHSCALE_BWD:
    case MGT_OP_LNC_FWD:
    case MGT_OP_LNC_BWD:
    case MGT_OP_DROPOUT: return true;
    default: return false;
    }
}

/* Every other NHWC batch norm case with a folded ReLU also gets a fused residual add (what
   plan_fusion gives a ResNet block's last batch norm on CUDA): a residual z in [-1, 1) for the
   forwards, the residual's gradient dz for the backward; case_to16 sets the rounding. */
static void bn_residual(tcase *c)
{
    static unsigned turn;
    mgt_op *op = &c->op;
    const mgt_bn_shape *sh = op->kind == MGT_OP_BN_FWD_TRAIN  ? &op->u.bn_train.sh
                             : op->kind == MGT_OP_BN_FWD_EVAL ? &op->u.bn_eval.sh
                                                              : &op->u.bn_bwd.sh;
    if (sh->relu && turn++ % 2 == 0 && !mgt_op_bn_residual(op))
        bn_residual_add(c);
}

/* The fused residual add of a batch-norm case with a folded ReLU. */
static void bn_residual_add(tcase *c)
{
    mgt_op *op = &c->op;
    const mgt_bn_shape *sh = op->kind == MGT_OP_BN_FWD_TRAIN  ? &op->u.bn_train.sh
                             : op->kind == MGT_OP_BN_FWD_EVAL ? &op->u.bn_eval.sh
                                                              : &op->u.bn_bwd.sh;
    size_t n = (size_t)sh->n * sh->c * sh->hw;
    if (op->kind == MGT_OP_BN_BWD) {
        op->u.bn_bwd.dz = case_f32(c, n);
    } else {
        float *z = case_f32(c, n);
        rng r = rng_for((int)n, 7, 1);
        fill_unif(&r, z, n, -1, 1);
        if (op->kind == MGT_OP_BN_FWD_TRAIN)
            op->u.bn_train.z = z;
        else
            op->u.bn_eval.z = z;
    }
    size_t len = strlen(c->desc);
    snprintf(c->desc + len, sizeof c->desc - len, " +residual");
}

static bool case_to_nhwc(tcase *c)
{
    mgt_op *op = &c->op;
    if (op_layouts(op) != 1u << MGT_LAYOUT_NCHW)
        return false;
    switch (op->kind) {
    case MGT_OP_CONV2D_FWD:
    case MGT_OP_CONV2D_BWD_DATA:
    case MGT_OP_CONV2D_BWD_FILTER:
        op->u.conv.sh.x_layout = op->u.conv.sh.y_layout = MGT_LAYOUT_NHWC;
        break;
    case MGT_OP_BN_FWD_TRAIN:
        op->u.bn_train.sh.layout = MGT_LAYOUT_NHWC;
        bn_residual(c);
        break;
    case MGT_OP_BN_FWD_EVAL:
        op->u.bn_eval.sh.layout = MGT_LAYOUT_NHWC;
        bn_residual(c);
        break;
    case MGT_OP_BN_BWD:
        op->u.bn_bwd.sh.layout = MGT_LAYOUT_NHWC;
        bn_residual(c);
        break;
    case MGT_OP_MAXPOOL_FWD: op->u.maxpool_fwd.sh.layout = MGT_LAYOUT_NHWC; break;
    case MGT_OP_MAXPOOL_BWD: op->u.maxpool_bwd.sh.layout = MGT_LAYOUT_NHWC; break;
    case MGT_OP_AVGPOOL_FWD: op->u.avgpool_fwd.layout = MGT_LAYOUT_NHWC; break;
    case MGT_OP_AVGPOOL_BWD: op->u.avgpool_bwd.layout = MGT_LAYOUT_NHWC; break;
    case MGT_OP_APOOL_FWD: op->u.apool_fwd.layout = MGT_LAYOUT_NHWC; break;
    case MGT_OP_APOOL_BWD: op->u.apool_bwd.layout = MGT_LAYOUT_NHWC; break;
    case MGT_OP_CHBIAS_FWD: op->u.chbias_fwd.layout = MGT_LAYOUT_NHWC; break;
    case MGT_OP_CHBIAS_BWD: op->u.chbias_bwd.layout = MGT_LAYOUT_NHWC; break;
    case MGT_OP_CHSCALE_FWD: op->u.chscale_fwd.layout = MGT_LAYOUT_NHWC; break;
    case MGT_OP_CHSCALE_BWD: op->u.chscale_bwd.layout = MGT_LAYOUT_NHWC; break;
    case MGT_OP_LNC_FWD: op->u.lnc_fwd.layout = MGT_LAYOUT_NHWC; break;
    case MGT_OP_LNC_BWD: op->u.lnc_bwd.layout = MGT_LAYOUT_NHWC; break;
    case MGT_OP_DROPOUT: { /* images of c channels, c the per-image size over its least factor */
        mgt_dropout_args *d = &op->u.dropout;
        size_t hw = 2;
        while (hw < d->per_image && d->per_image % hw != 0)
            hw++;
        d->c = (int)(d->per_image / (hw <= d->per_image ? hw : 1));
        d->layout = MGT_LAYOUT_NHWC;
        break;
    }
    default: return false;
    }
    size_t len = strlen(c->desc);
    snprintf(c->desc + len, sizeof c->desc - len, " nhwc");
    return true;
}

/* ---- the transformer ops ---- */

/* Dense strides of sizes [n] (innermost last), each row padded by pad floats. */
static void dense_strides(const int *size, int n, int pad, size_t *stride)
{
    size_t s = 1;
    for (int d = n - 1; d >= 0; d--) {
        stride[d] = s;
        s *= (size_t)size[d] + (d == n - 1 ? (size_t)pad : 0);
    }
}

/* A window partition (or its reverse, scatter) of [n, h, w, c] maps into windows of ws x ws
   after a roll by -shift, the map padded to whole windows: Swin's. */
static mgt_permute_shape window_shape(int n, int h, int w, int c, int ws, int shift, bool scatter)
{
    int ph = (h + ws - 1) / ws * ws, pw = (w + ws - 1) / ws * ws;
    mgt_permute_shape sh = {.ndim = 6, .naxes = 4, .scatter = scatter};
    int size[6] = {n, ph / ws, pw / ws, ws, ws, c}, axis[6] = {0, 1, 2, 1, 2, 3};
    int coef[6] = {1, ws, ws, 1, 1, 1};
    for (int d = 0; d < 6; d++) {
        sh.size[d] = size[d];
        sh.axis[d] = axis[d];
        sh.coef[d] = coef[d];
    }
    dense_strides(sh.size, 6, 0, sh.walk_stride);
    int lim[4] = {n, h, w, c}, ext[4] = {0, ph, pw, 0}, sft[4] = {0, shift, shift, 0};
    for (int a = 0; a < 4; a++) {
        sh.limit[a] = lim[a];
        sh.extent[a] = ext[a];
        sh.shift[a] = sft[a];
    }
    dense_strides(sh.limit, 4, 0, sh.grid_stride);
    return sh;
}

static size_t walk_len(const mgt_permute_shape *sh)
{
    size_t n = 1;
    for (int d = 0; d < sh->ndim; d++)
        n += (size_t)(sh->size[d] - 1) * sh->walk_stride[d];
    return n;
}

static size_t grid_len(const mgt_permute_shape *sh)
{
    size_t n = 1;
    for (int a = 0; a < sh->naxes; a++)
        n += (size_t)(sh->limit[a] - 1) * sh->grid_stride[a];
    return n;
}

/* The fixed cases: a transposition (ViT's patches to tokens), the class token broadcast into
   each image's row 0, Swin's shifted window partition of a map that needs padding and its
   reverse, patch merging of an odd map (padding), MaxViT's grid partition, a strided walk,
   a ViT-sized transposition. Then random gathers (any coefs, wraps and limits) and random
   scatters (each dim its own axis, wraps of exactly its size: a bijection). */
#define N_PERMUTE_FIXED 8
#define N_PERMUTE_CASES (N_PERMUTE_FIXED + 10)

static mgt_permute_shape permute_fixed(int idx)
{
    mgt_permute_shape sh = {0};
    switch (idx) {
    case 0: { /* [2, 5, 6] (n, c, p) -> [2, 6, 5] */
        sh = (mgt_permute_shape){.ndim = 3, .naxes = 3, .size = {2, 6, 5}, .axis = {0, 2, 1}};
        break;
    }
    case 1: /* the class token [4] into row 0 of [3, 7, 4] */
        sh = (mgt_permute_shape){.ndim = 2,
                                 .naxes = 1,
                                 .size = {3, 4},
                                 .axis = {0, 0},
                                 .coef = {0, 1},
                                 .limit = {4},
                                 .grid_stride = {1},
                                 .walk_stride = {28, 1}};
        return sh;
    case 2: return window_shape(2, 7, 7, 3, 4, 2, false);
    case 3: return window_shape(2, 7, 7, 3, 4, 2, true);
    case 4: { /* patch merging [1, 5, 5, 3] -> [1, 3, 3, (kw, kh, c)] */
        sh = (mgt_permute_shape){.ndim = 6,
                                 .naxes = 4,
                                 .size = {1, 3, 3, 2, 2, 3},
                                 .axis = {0, 1, 2, 2, 1, 3},
                                 .coef = {1, 2, 2, 1, 1, 1},
                                 .limit = {1, 5, 5, 3}};
        dense_strides(sh.size, 6, 0, sh.walk_stride);
        dense_strides(sh.limit, 4, 0, sh.grid_stride);
        return sh;
    }
    case 5: { /* MaxViT's grid partition of [2, 8, 8, 4] with grid 2: token (i, j) of group
                 (gi, gj) is pixel (i * 4 + gi, j * 4 + gj) */
        sh = (mgt_permute_shape){.ndim = 6,
                                 .naxes = 4,
                                 .size = {2, 4, 4, 2, 2, 4},
                                 .axis = {0, 1, 2, 1, 2, 3},
                                 .coef = {1, 1, 1, 4, 4, 1},
                                 .limit = {2, 8, 8, 4}};
        dense_strides(sh.size, 6, 0, sh.walk_stride);
        dense_strides(sh.limit, 4, 0, sh.grid_stride);
        return sh;
    }
    case 6: /* a walk with gaps between rows */
        sh = (mgt_permute_shape){.ndim = 2, .naxes = 2, .size = {5, 9}, .axis = {1, 0}};
        dense_strides(sh.size, 2, 3, sh.walk_stride);
        for (int a = 0; a < 2; a++)
            sh.limit[a] = sh.size[1 - a];
        dense_strides(sh.limit, 2, 0, sh.grid_stride);
        return sh;
    case 7: /* [2, 768, 196] -> [2, 196, 768] */
        sh = (mgt_permute_shape){.ndim = 3, .naxes = 3, .size = {2, 196, 768}, .axis = {0, 2, 1}};
        break;
    }
    /* the transpositions: coef 1, limits the sizes in axis order */
    for (int d = 0; d < sh.ndim; d++) {
        sh.coef[d] = 1;
        sh.limit[sh.axis[d]] = sh.size[d];
    }
    dense_strides(sh.size, sh.ndim, 0, sh.walk_stride);
    dense_strides(sh.limit, sh.naxes, 0, sh.grid_stride);
    return sh;
}

static mgt_permute_shape permute_random(rng *r, bool scatter)
{
    mgt_permute_shape sh = {0};
    sh.ndim = rng_int(r, 1, 6);
    sh.naxes = scatter ? sh.ndim : rng_int(r, 1, sh.ndim);
    sh.scatter = scatter;
    int reach[MGT_PERMUTE_DIMS] = {0};
    for (int d = 0; d < sh.ndim; d++) {
        sh.size[d] = rng_int(r, 1, 4);
        sh.axis[d] = scatter ? d : rng_int(r, 0, sh.naxes - 1);
        sh.coef[d] = scatter ? 1 : rng_int(r, 0, 2);
        reach[sh.axis[d]] += sh.coef[d] * (sh.size[d] - 1);
    }
    for (int a = 0; a < sh.naxes; a++) {
        if (scatter) {
            sh.extent[a] = rng_int(r, 0, 1) ? sh.size[a] : 0;
            sh.shift[a] = sh.extent[a] ? rng_int(r, -5, 5) : 0;
            sh.limit[a] = sh.size[a];
        } else if (rng_int(r, 0, 1)) {
            sh.extent[a] = rng_int(r, 1, 6);
            sh.shift[a] = rng_int(r, -7, 7);
            sh.limit[a] = rng_int(r, 1, sh.extent[a]);
        } else {
            sh.shift[a] = rng_int(r, 0, 2);
            sh.limit[a] = rng_int(r, 1, reach[a] + sh.shift[a] + 2);
        }
    }
    dense_strides(sh.size, sh.ndim, rng_int(r, 0, 2), sh.walk_stride);
    dense_strides(sh.limit, sh.naxes, 0, sh.grid_stride);
    return sh;
}

static void permute_desc(tcase *c, const mgt_permute_shape *sh)
{
    char b[160];
    int o = 0;
    for (int d = 0; d < sh->ndim; d++)
        o += snprintf(b + o, sizeof b - (size_t)o, "%s%d:a%d*%d", d ? "," : "", sh->size[d],
                      sh->axis[d], sh->coef[d]);
    case_desc(c, "%s [%s]", sh->scatter ? "scatter" : "gather", b);
}

/* The window partition's gather against differences: its scatter is its adjoint (d/dgrid). */
static bool fd_permute(tcase *c, int t)
{
    if (t >= 1)
        return false;
    fd_part *f = fd_begin(c, rng_for(930, t, 7));
    rng *r = &f->r;
    mgt_permute_shape g = window_shape(1, 5, 6, 2, 4, 1, false), s = g;
    s.scatter = true;
    size_t nw = walk_len(&g), ng = grid_len(&g);
    float *grid = case_f32(c, ng), *walk = case_f32(c, nw), *rw = case_f32(c, nw);
    float *dgrid = case_f32(c, ng);
    fill_unif(r, grid, ng, -1, 1);
    fill_unif(r, rw, nw, -1, 1);
    /* the padding's positions read nothing: their weights must not reach dgrid */
    case_desc(c, "window partition 5x6 ws 4 shift 1");
    mgt_op fwd = {.kind = MGT_OP_PERMUTE}, bwd = {.kind = MGT_OP_PERMUTE};
    fwd.u.permute.walk = walk;
    fwd.u.permute.grid = grid;
    fwd.u.permute.sh = g;
    bwd.u.permute.walk = rw;
    bwd.u.permute.grid = dgrid;
    bwd.u.permute.sh = s;
    fd_ops(f, &fwd, &bwd, false, (fd_term){walk, rw, nw}, 1e-2f);
    fd_wrt_add(f, grid, ng, dgrid, "grid");
    return true;
}

static bool gen_permute(tcase *c, int idx, rng *r)
{
    if (idx >= N_PERMUTE_CASES)
        return fd_permute(c, idx - N_PERMUTE_CASES);
    mgt_permute_shape sh =
        idx < N_PERMUTE_FIXED ? permute_fixed(idx) : permute_random(r, idx >= N_PERMUTE_FIXED + 6);
    size_t nw = walk_len(&sh), ng = grid_len(&sh);
    float *walk = case_f32(c, nw), *grid = case_f32(c, ng);
    fill_unif(r, walk, nw, -1, 1);
    fill_unif(r, grid, ng, -1, 1);
    c->op.u.permute.walk = walk;
    c->op.u.permute.grid = grid;
    c->op.u.permute.sh = sh;
    c->rtol = 0;
    permute_desc(c, &sh);
    return true;
}

/* batch, heads, tq, tk, dh, layout (0: separate q, k, v with gaps; 1: one packed qkv), bias,
   masks (0: none), cosine, dropout p x100, groups per sample. The last three are CUDA's fused
   kernels at head-size templates 64 and 128 (dh 80: 80 of its lanes' columns used) and its
   cuBLAS path past 128; the others its template 32. */
static const int attn_shapes[][11] = {
    {2, 3, 5, 5, 4, 1, 0, 0, 0, 0, 1},      {1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 1},
    {2, 2, 7, 9, 8, 0, 0, 0, 0, 0, 1},      {4, 3, 49, 49, 32, 1, 1, 2, 0, 0, 2},
    {1, 2, 197, 197, 16, 1, 0, 0, 0, 0, 1}, {1, 1, 70, 300, 8, 0, 1, 0, 0, 0, 1},
    {2, 2, 16, 16, 8, 1, 1, 0, 1, 0, 1},    {2, 2, 9, 9, 4, 1, 0, 0, 0, 30, 2},
    {4, 2, 10, 10, 6, 0, 1, 2, 1, 20, 2},   {2, 1, 66, 66, 3, 1, 0, 1, 0, 0, 1},
    {2, 3, 50, 50, 64, 1, 1, 2, 0, 10, 2},  {1, 2, 40, 33, 80, 0, 1, 0, 1, 0, 1},
    {2, 1, 20, 20, 160, 0, 1, 1, 0, 0, 1},
};
#define N_ATTN_SHAPES ((int)(sizeof attn_shapes / sizeof attn_shapes[0]))

typedef struct attn_arrays {
    mgt_attn_shape sh;
    float *q, *k, *v, *bias, *mask, *ls, *y, *lse;
} attn_arrays;

/* The arrays of one attention shape, filled; q, k, v packed as a qkv linear's output, or
   apart with gaps between rows and groups. */
static attn_arrays attn_setup(tcase *c, rng *r, const int *v)
{
    attn_arrays a = {0};
    mgt_attn_shape *sh = &a.sh;
    sh->batch = v[0];
    sh->heads = v[1];
    sh->tq = v[2];
    sh->tk = v[3];
    sh->dh = v[4];
    size_t hd = (size_t)sh->heads * sh->dh, tt = (size_t)sh->tq * sh->tk;
    bool packed = v[5] && sh->tq == sh->tk;
    sh->masks = v[7];
    sh->cosine = v[8];
    sh->p = (float)v[9] / 100.0f;
    sh->groups_per_sample = v[10];
    sh->key =
        (mgt_dropout_key){.seed = 91, .step = 4, .sample0 = 3, .sample_stride = 2, .stream = 5};
    sh->scale = sh->cosine ? 1.0f : 1.0f / sqrtf((float)sh->dh);
    /* packed: the strides of one qkv linear's output [tokens, 3 hd] (each of q, k and v in an
       array of its own, which the guards need); otherwise gaps between rows and groups */
    if (packed) {
        sh->q_row = sh->kv_row = 3 * hd;
        sh->q_batch = sh->kv_batch = (size_t)sh->tq * 3 * hd;
        sh->y_row = hd;
        sh->y_batch = (size_t)sh->tq * hd;
    } else {
        sh->q_row = hd + 3;
        sh->q_batch = (size_t)sh->tq * sh->q_row + 5;
        sh->kv_row = hd + 1;
        sh->kv_batch = (size_t)sh->tk * sh->kv_row + 2;
        sh->y_row = hd + 2;
        sh->y_batch = (size_t)sh->tq * sh->y_row + 1;
    }
    size_t nq = (size_t)sh->batch * sh->q_batch, nk = (size_t)sh->batch * sh->kv_batch;
    a.q = case_f32(c, nq);
    a.k = case_f32(c, nk);
    a.v = case_f32(c, nk);
    fill_unif(r, a.q, nq, -1, 1);
    fill_unif(r, a.k, nk, -1, 1);
    fill_unif(r, a.v, nk, -1, 1);
    if (v[6]) {
        a.bias = case_f32(c, (size_t)sh->heads * tt);
        fill_unif(r, a.bias, (size_t)sh->heads * tt, -2, 2);
    }
    if (sh->masks) {
        size_t n = (size_t)sh->masks * tt;
        a.mask = case_f32(c, n);
        for (size_t i = 0; i < n; i++) /* Swin's: 0, or -100 between regions */
            a.mask[i] = rng_int(r, 0, 3) == 0 ? -100.0f : 0.0f;
    }
    if (sh->cosine) {
        a.ls = case_f32(c, (size_t)sh->heads);
        for (int h = 0; h < sh->heads; h++) /* one head past the clamp's bound */
            a.ls[h] = h == 1 ? 5.0f : rng_unif(r, 0.5f, 3.0f);
    }
    a.y = case_f32(c, (size_t)sh->batch * sh->y_batch);
    a.lse = case_f32(c, (size_t)sh->batch * sh->heads * sh->tq);
    return a;
}

static void attn_fwd_op(mgt_op *op, const attn_arrays *a)
{
    op->kind = MGT_OP_ATTN_FWD;
    op->u.attn_fwd.y = a->y;
    op->u.attn_fwd.lse = a->lse;
    op->u.attn_fwd.q = a->q;
    op->u.attn_fwd.k = a->k;
    op->u.attn_fwd.v = a->v;
    op->u.attn_fwd.bias = a->bias;
    op->u.attn_fwd.mask = a->mask;
    op->u.attn_fwd.logit_scale = a->ls;
    op->u.attn_fwd.sh = a->sh;
}

static void attn_bwd_op(mgt_op *op, const attn_arrays *a, float *dq, float *dk, float *dv,
                        float *dbias, float *dls, const float *dy)
{
    op->kind = MGT_OP_ATTN_BWD;
    op->u.attn_bwd.dq = dq;
    op->u.attn_bwd.dk = dk;
    op->u.attn_bwd.dv = dv;
    op->u.attn_bwd.dbias = dbias;
    op->u.attn_bwd.dlogit_scale = dls;
    op->u.attn_bwd.dy = dy;
    op->u.attn_bwd.y = a->y;
    op->u.attn_bwd.lse = a->lse;
    op->u.attn_bwd.q = a->q;
    op->u.attn_bwd.k = a->k;
    op->u.attn_bwd.v = a->v;
    op->u.attn_bwd.bias = a->bias;
    op->u.attn_bwd.mask = a->mask;
    op->u.attn_bwd.logit_scale = a->ls;
    op->u.attn_bwd.sh = a->sh;
}

static void attn_desc(tcase *c, const mgt_attn_shape *sh, const attn_arrays *a)
{
    case_desc(c, "b=%d h=%d tq=%d tk=%d dh=%d%s%s%s%s p=%.2f", sh->batch, sh->heads, sh->tq, sh->tk,
              sh->dh, sh->q_row == 3 * (size_t)sh->heads * sh->dh ? " qkv rows" : " gaps",
              a->bias ? " bias" : "", a->mask ? " mask" : "", sh->cosine ? " cosine" : "",
              (double)sh->p);
}

static size_t attn_q_len(const mgt_attn_shape *sh) { return (size_t)sh->batch * sh->q_batch; }
static size_t attn_kv_len(const mgt_attn_shape *sh) { return (size_t)sh->batch * sh->kv_batch; }

static bool gen_attn_fwd(tcase *c, int idx, rng *r)
{
    if (idx >= N_ATTN_SHAPES)
        return false;
    attn_arrays a = attn_setup(c, r, attn_shapes[idx]);
    attn_fwd_op(&c->op, &a);
    c->rtol = tol_for((double)a.sh.tk * a.sh.dh) * 4;
    c->mag = 1;
    attn_desc(c, &a.sh, &a);
    return true;
}

/* The backward against differences of the forward on the same backend: q, k and v on three
   shapes (one with dropout), then bias and logit_scale on a cosine one with a mask. */
static bool fd_attn(tcase *c, int t)
{
    static const int pick[] = {0, 2, 7, 8};
    if (t >= (int)(sizeof pick / sizeof pick[0]))
        return false;
    fd_part *f = fd_begin(c, rng_for(940, t, 7));
    rng *r = &f->r;
    attn_arrays a = attn_setup(c, r, attn_shapes[pick[t]]);
    const mgt_attn_shape *sh = &a.sh;
    size_t ny = (size_t)sh->batch * sh->y_batch, nq = attn_q_len(sh), nk = attn_kv_len(sh);
    float *rw = case_f32(c, ny), *dq = case_f32(c, nq), *dk = case_f32(c, nk);
    float *dv = case_f32(c, nk);
    size_t nb = (size_t)sh->heads * sh->tq * sh->tk;
    float *db = a.bias ? case_f32(c, nb) : NULL,
          *dls = a.ls ? case_f32(c, (size_t)sh->heads) : NULL;
    fill_unif(r, rw, ny, -1, 1);
    attn_desc(c, sh, &a);
    mgt_op fwd = {0}, bwd = {0};
    attn_fwd_op(&fwd, &a);
    attn_bwd_op(&bwd, &a, dq, dk, dv, db, dls, rw);
    fd_ops(f, &fwd, &bwd, true, (fd_term){a.y, rw, ny}, 5e-3f);
    if (t < 3) {
        fd_wrt_add(f, a.q, nq, dq, "q");
        fd_wrt_add(f, a.k, nk, dk, "k");
        fd_wrt_add(f, a.v, nk, dv, "v");
    } else {
        fd_wrt_add(f, a.bias, nb, db, "bias");
        fd_wrt_add(f, a.ls, (size_t)sh->heads, dls, "logit_scale");
        fd_wrt_add(f, a.k, nk, dk, "k");
    }
    return true;
}

static bool gen_attn_bwd(tcase *c, int idx, rng *r)
{
    if (idx >= N_ATTN_SHAPES)
        return fd_attn(c, idx - N_ATTN_SHAPES);
    attn_arrays a = attn_setup(c, r, attn_shapes[idx]);
    const mgt_attn_shape *sh = &a.sh;
    /* y and lse from the reference forward, so the inputs are what a forward leaves */
    mgt_op fwd = {0};
    attn_fwd_op(&fwd, &a);
    if (mgt_ref_run(&fwd) != MGT_OK) {
        fprintf(stderr, "conformance: the reference forward failed: %s\n", mgt_error_last());
        abort();
    }
    size_t ny = (size_t)sh->batch * sh->y_batch, nq = attn_q_len(sh), nk = attn_kv_len(sh);
    float *dy = case_f32(c, ny), *dq = case_f32(c, nq), *dk = case_f32(c, nk);
    float *dv = case_f32(c, nk);
    float *db = a.bias ? case_f32(c, (size_t)sh->heads * sh->tq * sh->tk) : NULL;
    float *dls = a.ls ? case_f32(c, (size_t)sh->heads) : NULL;
    fill_unif(r, dy, ny, -1, 1);
    if (dls)
        fill_unif(r, dls, (size_t)sh->heads, -1, 1); /* added on */
    attn_bwd_op(&c->op, &a, dq, dk, dv, db, dls, dy);
    c->rtol = tol_for((double)sh->tq * sh->tk * sh->dh) * 8;
    c->mag = 1;
    attn_desc(c, sh, &a);
    return true;
}

/* rows, heads, n (0: Swin's 7x7 window, 169 x 2401), alpha x10 */
static const int rpb_shapes[][4] = {
    {1, 1, 1, 10}, {5, 3, 20, 10}, {169, 3, 0, 10}, {225, 4, 0, 160}, {7, 2, 50, -5}};
#define N_RPB_SHAPES ((int)(sizeof rpb_shapes / sizeof rpb_shapes[0]))

/* Swin's relative_position_index of a ws x ws window (torchvision's formula). */
static void swin_index(int ws, int32_t *index)
{
    int t = ws * ws;
    for (int i = 0; i < t; i++)
        for (int j = 0; j < t; j++) {
            int dy = i / ws - j / ws + ws - 1, dx = i % ws - j % ws + ws - 1;
            index[i * t + j] = dy * (2 * ws - 1) + dx;
        }
}

static int rpb_setup(rng *r, const int *v, int32_t **index, tcase *c, int *rows, int *n)
{
    *rows = v[0];
    int ws = 0;
    for (int w = 1; w < 16; w++)
        if ((2 * w - 1) * (2 * w - 1) == v[0])
            ws = w;
    *n = v[2] ? v[2] : ws * ws * ws * ws;
    *index = case_i32(c, (size_t)*n);
    if (v[2])
        fill_labels(r, *index, *n, *rows);
    else
        swin_index(ws, *index);
    return ws;
}

static bool gen_rpb_fwd(tcase *c, int idx, rng *r)
{
    if (idx >= N_RPB_SHAPES)
        return false;
    const int *v = rpb_shapes[idx];
    int rows, n, heads = v[1];
    int32_t *index;
    rpb_setup(r, v, &index, c, &rows, &n);
    float *table = case_f32(c, (size_t)rows * heads), *bias = case_f32(c, (size_t)heads * n);
    fill_unif(r, table, (size_t)rows * heads, -1, 1);
    c->op.u.rpb_fwd.bias = bias;
    c->op.u.rpb_fwd.table = table;
    c->op.u.rpb_fwd.index = index;
    c->op.u.rpb_fwd.rows = rows;
    c->op.u.rpb_fwd.heads = heads;
    c->op.u.rpb_fwd.n = n;
    c->op.u.rpb_fwd.alpha = (float)v[3] / 10.0f;
    c->rtol = 0;
    case_desc(c, "rows=%d heads=%d n=%d alpha=%g", rows, heads, n, (double)v[3] / 10.0);
    return true;
}

static void rpb_bwd_fill(tcase *c, rng *r, const int *v, mgt_op *bwd, mgt_op *fwd, float **table,
                         float **bias, float **dtable, float **dbias)
{
    int rows, n, heads = v[1];
    int32_t *index;
    rpb_setup(r, v, &index, c, &rows, &n);
    int32_t *off = case_i32(c, (size_t)rows + 1), *order = case_i32(c, (size_t)n);
    if (!mgt_relpos_inverse(index, n, rows, off, order)) {
        fprintf(stderr, "conformance: mgt_relpos_inverse refused a valid index\n");
        abort();
    }
    *table = case_f32(c, (size_t)rows * heads);
    *bias = case_f32(c, (size_t)heads * n);
    *dtable = case_f32(c, (size_t)rows * heads);
    *dbias = case_f32(c, (size_t)heads * n);
    fill_unif(r, *table, (size_t)rows * heads, -1, 1);
    float alpha = (float)v[3] / 10.0f;
    *fwd = (mgt_op){.kind = MGT_OP_RPB_FWD};
    fwd->u.rpb_fwd.bias = *bias;
    fwd->u.rpb_fwd.table = *table;
    fwd->u.rpb_fwd.index = index;
    fwd->u.rpb_fwd.rows = rows;
    fwd->u.rpb_fwd.heads = heads;
    fwd->u.rpb_fwd.n = n;
    fwd->u.rpb_fwd.alpha = alpha;
    *bwd = (mgt_op){.kind = MGT_OP_RPB_BWD};
    bwd->u.rpb_bwd.dtable = *dtable;
    bwd->u.rpb_bwd.dbias = *dbias;
    bwd->u.rpb_bwd.offsets = off;
    bwd->u.rpb_bwd.order = order;
    bwd->u.rpb_bwd.rows = rows;
    bwd->u.rpb_bwd.heads = heads;
    bwd->u.rpb_bwd.n = n;
    bwd->u.rpb_bwd.alpha = alpha;
    case_desc(c, "rows=%d heads=%d n=%d alpha=%g", rows, heads, n, (double)alpha);
}

static bool fd_rpb(tcase *c, int t)
{
    static const int pick[] = {1, 2};
    if (t >= 2)
        return false;
    fd_part *f = fd_begin(c, rng_for(950, t, 7));
    mgt_op fwd, bwd;
    float *table, *bias, *dtable, *dbias;
    rpb_bwd_fill(c, &f->r, rpb_shapes[pick[t]], &bwd, &fwd, &table, &bias, &dtable, &dbias);
    size_t nb = (size_t)fwd.u.rpb_fwd.heads * fwd.u.rpb_fwd.n;
    fill_unif(&f->r, dbias, nb, -1, 1); /* the loss's weights */
    bwd.u.rpb_bwd.dbias = dbias;
    fd_ops(f, &fwd, &bwd, false, (fd_term){bias, dbias, nb}, 1e-2f);
    fd_wrt_add(f, table, (size_t)fwd.u.rpb_fwd.rows * fwd.u.rpb_fwd.heads, dtable, "table");
    return true;
}

static bool gen_rpb_bwd(tcase *c, int idx, rng *r)
{
    if (idx >= N_RPB_SHAPES)
        return fd_rpb(c, idx - N_RPB_SHAPES);
    mgt_op fwd;
    float *table, *bias, *dtable, *dbias;
    rpb_bwd_fill(c, r, rpb_shapes[idx], &c->op, &fwd, &table, &bias, &dtable, &dbias);
    fill_unif(r, dtable, (size_t)c->op.u.rpb_bwd.rows * c->op.u.rpb_bwd.heads, -1, 1);
    fill_unif(r, dbias, (size_t)c->op.u.rpb_bwd.heads * c->op.u.rpb_bwd.n, -1, 1);
    c->rtol = tol_for((double)c->op.u.rpb_bwd.n);
    c->mag = 1;
    return true;
}

/* ---- the driver ---- */

/* Every op's cases: gen_<stem> of its row of the op list (the driver sets c->op.kind first, so
   that rows sharing a stem tell themselves apart); a row without one does not compile. */
#define CONF_GEN(KIND, name, args, stem) [MGT_OP_##KIND] = gen_##stem,
static const gen_fn gens[MGT_OP_COUNT] = {MGT_OP_LIST(CONF_GEN)};
#undef CONF_GEN

/* A finite-difference case starts from the same bytes on every backend. */
static void **case_snapshot(const tcase *c)
{
    void **snap = calloc(MAX_ARRAYS, sizeof *snap);
    for (int i = 0; snap && i < c->narr; i++) {
        snap[i] = malloc(c->len[i] ? c->len[i] * 4 : 1);
        if (!snap[i])
            break;
        memcpy(snap[i], c->arr[i], c->len[i] * 4);
    }
    if (!snap || (c->narr && !snap[c->narr - 1])) {
        fprintf(stderr, "conformance: out of host memory\n");
        abort();
    }
    return snap;
}

static void case_restore(tcase *c, void **snap)
{
    for (int i = 0; i < c->narr; i++)
        memcpy(c->arr[i], snap[i], c->len[i] * 4);
}

static void snapshot_free(void **snap)
{
    for (int i = 0; i < MAX_ARRAYS; i++)
        free(snap[i]);
    free(snap);
}

#define MAX_BACKENDS 3

int main(int argc, char **argv)
{
    const char *opname = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-v") == 0) {
            verbose = true;
        } else if (strcmp(argv[i], "--list") == 0) {
            /* every op, with a case or not: an op without one then fails as its own test */
            for (int k = 0; k < MGT_OP_COUNT; k++)
                printf("%s\n", mgt_op_name((mgt_op_kind)k));
            return 0;
        } else if (!opname) {
            opname = argv[i];
        }
    }
    if (!opname) {
        fprintf(stderr, "usage: %s OP [-v] | --list\n", argv[0]);
        return 2;
    }
    mgt_op_kind kind = mgt_op_kind_from_name(opname);
    if (kind == MGT_OP_COUNT) {
        fprintf(stderr, "conformance: unknown op '%s'\n", opname);
        return 2;
    }

    /* The same cases on every backend: the mock with its default threads (MGT_MOCK applies),
       the mock split over 3 threads, and CUDA where a GPU answers. */
    backend bes[MAX_BACKENDS];
    int nb = 0;
    memset(bes, 0, sizeof bes);
    snprintf(bes[nb].label, sizeof bes[nb].label, "mock");
    bes[nb++].kind = MGT_DEVICE_MOCK;
    snprintf(bes[nb].label, sizeof bes[nb].label, "mock threads=3");
    bes[nb].kind = MGT_DEVICE_MOCK;
    bes[nb].has_opts = true;
    if (mgt_mock_options_parse(&bes[nb].opts, "threads=3") != MGT_OK) {
        fprintf(stderr, "conformance: mock options: %s\n", mgt_error_last());
        return 1;
    }
    nb++;
    int ncuda = 0;
    const char *require = getenv("MGT_REQUIRE_CUDA");
    if (mgt_device_kind_probe(MGT_DEVICE_CUDA, &ncuda) == MGT_OK) {
        snprintf(bes[nb].label, sizeof bes[nb].label, "cuda");
        bes[nb++].kind = MGT_DEVICE_CUDA;
    } else if (require && *require && strcmp(require, "0") != 0) {
        /* tools/gpu-check.sh: a GPU run must not pass on the mock alone */
        printf("FAIL %s: MGT_REQUIRE_CUDA=1 and %s\n", opname, mgt_error_last());
        return 1;
    } else {
        printf("cuda: skipped (%s)\n", mgt_error_last());
    }
    for (int b = 0; b < nb; b++)
        if (!backend_open(&bes[b])) {
            for (int k = 0; k < b; k++)
                backend_close(&bes[k]);
            return 1;
        }

    int fails = 0, ncases = 0, nfd = 0, n16 = 0, nnhwc = 0;
    /* the fp32 cases, then (idx - first16) the 16-bit storage forms of the comparison ones,
       then (idx - first_nhwc) their NHWC 16-bit forms where the kind takes a layout (what
       CUDA's kernels run under --amp) */
    int first16 = -1, first_nhwc = -1;
    for (int idx = 0;; idx++) {
        tcase c;
        memset(&c, 0, sizeof c);
        c.op.kind = kind;
        int gidx = idx - (first_nhwc >= 0 ? first_nhwc : first16 >= 0 ? first16 : 0);
        rng r = rng_for(op_seed(opname), gidx, 0);
        if (!gens[kind](&c, gidx, &r)) {
            case_free(&c);
            if (first16 < 0 && mgt_op_takes_store(kind)) {
                first16 = idx--; /* gidx 0 again, stored in 16 bits */
                continue;
            }
            if (first16 >= 0 && first_nhwc < 0 && takes_layout(kind)) {
                first_nhwc = idx--; /* and again, NHWC 16-bit */
                continue;
            }
            break;
        }
        if (first16 >= 0) {
            if (c.fd.nwrt || (first_nhwc >= 0 && !case_to_nhwc(&c)) ||
                !case_to16(&c, gidx, gidx % 2 ? MGT_PREC_FP16 : MGT_PREC_BF16)) {
                case_free(&c);
                continue;
            }
            n16++;
            nnhwc += first_nhwc >= 0;
        }
        if (c.fd.nwrt) {
            void **snap = case_snapshot(&c);
            for (int b = 0; b < nb; b++) {
                case_restore(&c, snap);
                fails += fd_run(&bes[b], opname, nfd, &c);
            }
            snapshot_free(snap);
            nfd++;
            case_free(&c);
            continue;
        }
        ncases++;
        refres rr = {0};
        if (!case_prepare(&c, opname, idx) || !ref_compute(&c, &rr, opname, idx)) {
            fails++;
            refres_free(&rr);
            case_free(&c);
            continue;
        }
        for (int b = 0; b < nb; b++) {
            devrun dr;
            const char *what;
            if (bes[b].kind == MGT_DEVICE_CUDA && (op_layouts(&c.op) >> MGT_LAYOUT_NCHW16C & 1)) {
                printf("%s %d (%s): skipped on cuda: nChw16c is the mock devices' layout\n", opname,
                       idx, c.desc);
                continue;
            }
            if (bes[b].kind == MGT_DEVICE_MOCK && (op_layouts(&c.op) >> MGT_LAYOUT_NHWC & 1)) {
                printf("%s %d (%s): skipped on %s: NHWC is CUDA's layout (the reference runs "
                       "it)\n",
                       opname, idx, c.desc, bes[b].label);
                continue;
            }
            mgt_status st = dev_exec(&bes[b], &c.op, &dr, &what);
            if (st != MGT_OK) {
                report_status(opname, idx, c.desc, &bes[b], what, st);
                fails++;
                devrun_free(&dr);
                if (!backend_reopen(&bes[b]))
                    return 1;
                continue;
            }
            fails += compare_run(&bes[b], opname, idx, &c, &rr, &dr) != 0;
            devrun_free(&dr);
        }
        refres_free(&rr);
        case_free(&c);
    }
    for (int b = 0; b < nb; b++)
        backend_close(&bes[b]);
    printf("conformance %s: %d cases (%d of them with 16-bit activations, %d NHWC) on %d "
           "backends%s: %s\n",
           opname, ncases, n16, nnhwc, nb, nfd ? " with finite differences" : "",
           fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
