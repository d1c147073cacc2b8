/* Tests of the augmentations of torchvision's references recipe: every policy op against
   torchvision 0.14's own _apply_op on fixed images (exact; PIL images, and for AugMix uint8
   tensors), AugMix itself with torch's draws replayed (exact), the policies' magnitude tables
   and AutoAugment's IMAGENET, CIFAR10 and SVHN sub-policies against torchvision's,
   RandomErasing's parameters replayed from torch's generator, and the policies and erasing
   inside the transform. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include <cmocka.h>

#include "mgt/data.h"
#include "mgt/device.h"
#include "mgt/rng.h"
#include "support/fixture.h"
#include "support/golden.h"

#define GOLDEN_DIR MGT_TEST_DATA_DIR "/pipeline"

static int hexval(char c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

/* A line of the gzipped golden (growing buf as needed), without its newline. */
static char *gz_line(gzFile g, char **buf, size_t *cap)
{
    size_t len = 0;
    for (;;) {
        if (len + 4096 > *cap) {
            *cap = *cap ? *cap * 2 : 65536;
            *buf = realloc(*buf, *cap);
        }
        if (!gzgets(g, *buf + len, (int)(*cap - len)))
            return len ? *buf : NULL;
        len += strlen(*buf + len);
        if (len && (*buf)[len - 1] == '\n') {
            (*buf)[len - 1] = 0;
            return *buf;
        }
    }
}

static char *gz_data_line(gzFile g, char **buf, size_t *cap)
{
    char *l;
    while ((l = gz_line(g, buf, cap)) && l[0] == '#') {
    }
    return l;
}

static void unhex(const char *s, uint8_t *out, size_t n)
{
    if (strlen(s) != 2 * n)
        fail_msg("golden: %zu hex digits where %zu bytes were expected", strlen(s), n);
    for (size_t i = 0; i < n; i++)
        out[i] = (uint8_t)(hexval(s[2 * i]) << 4 | hexval(s[2 * i + 1]));
}

typedef struct gimg {
    int w, h, c;
    uint8_t *px;
} gimg;

/* A golden file of tests/data/pipeline, or the test fails naming the script that makes it. */
static gzFile open_golden(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", GOLDEN_DIR, name);
    gzFile g = gzopen(path, "rb");
    if (!g)
        fail_msg("%s missing (make it with scripts/make_data_goldens.py)", path);
    return g;
}

/* Every op of the three policies, as torchvision 0.14's _apply_op gives it on a PIL image,
   at fixed magnitudes (signs included) and every interpolation: pixel for pixel. */
static void test_policy_ops_golden(void **state)
{
    (void)state;
    gzFile g = open_golden("augment_ops.txt.gz");
    char *buf = NULL;
    size_t cap = 0;
    int nimg = atoi(gz_data_line(g, &buf, &cap));
    gimg imgs[4];
    assert_true(nimg > 0 && nimg <= 4);
    for (int k = 0; k < nimg; k++) {
        assert_int_equal(
            sscanf(gz_line(g, &buf, &cap), "%d %d %d", &imgs[k].w, &imgs[k].h, &imgs[k].c), 3);
        imgs[k].px = malloc((size_t)imgs[k].w * imgs[k].h * imgs[k].c);
        unhex(gz_line(g, &buf, &cap), imgs[k].px, (size_t)imgs[k].w * imgs[k].h * imgs[k].c);
    }
    int ncases = atoi(gz_line(g, &buf, &cap));
    mgt_transform_scratch s = {0};
    int failed = 0, per_op[MGT_AUG_OP_COUNT] = {0};
    for (int i = 0; i < ncases; i++) {
        char opname[32], iname[16];
        double mag;
        int k;
        assert_int_equal(
            sscanf(gz_line(g, &buf, &cap), "%31s %15s %lf %d", opname, iname, &mag, &k), 4);
        mgt_aug_op op;
        mgt_interp interp;
        CHECK(mgt_aug_op_parse(opname, &op));
        CHECK(mgt_interp_parse(iname, &interp));
        size_t n = (size_t)imgs[k].w * imgs[k].h * imgs[k].c;
        uint8_t *want = malloc(n), *got = malloc(n);
        unhex(gz_line(g, &buf, &cap), want, n);
        memcpy(got, imgs[k].px, n);
        CHECK(mgt_augment_op(op, mag, interp, got, imgs[k].w, imgs[k].h, imgs[k].c, &s));
        int diff = 0, worst = 0;
        for (size_t q = 0; q < n; q++)
            if (got[q] != want[q]) {
                diff++;
                worst = abs(got[q] - want[q]) > worst ? abs(got[q] - want[q]) : worst;
            }
        if (diff) {
            print_message("%s %s %g on image %d (%dx%dx%d): %d of %zu values differ, worst %d\n",
                          opname, iname, mag, k, imgs[k].w, imgs[k].h, imgs[k].c, diff, n, worst);
            failed++;
        }
        per_op[op]++;
        free(want);
        free(got);
    }
    gzclose(g);
    for (int op = 0; op < MGT_AUG_OP_COUNT; op++)
        assert_true(per_op[op] > 0); /* every op has cases */
    print_message("policy ops: %d cases against torchvision, %d differ\n", ncases, failed);
    assert_int_equal(failed, 0);
    for (int k = 0; k < nimg; k++)
        free(imgs[k].px);
    free(buf);
    mgt_transform_scratch_free(&s);
}

/* The images of augment_ops.txt.gz (which augmix_ops and augmix use too). */
static int load_aug_images(gimg *imgs, int cap)
{
    gzFile g = open_golden("augment_ops.txt.gz");
    char *buf = NULL;
    size_t bcap = 0;
    int nimg = atoi(gz_data_line(g, &buf, &bcap));
    assert_true(nimg > 0 && nimg <= cap);
    for (int k = 0; k < nimg; k++) {
        assert_int_equal(
            sscanf(gz_line(g, &buf, &bcap), "%d %d %d", &imgs[k].w, &imgs[k].h, &imgs[k].c), 3);
        imgs[k].px = malloc((size_t)imgs[k].w * imgs[k].h * imgs[k].c);
        unhex(gz_line(g, &buf, &bcap), imgs[k].px, (size_t)imgs[k].w * imgs[k].h * imgs[k].c);
    }
    gzclose(g);
    free(buf);
    return nimg;
}

/* AugMix's ops as torchvision 0.14's _apply_op gives them on a uint8 tensor (tensor
   arithmetic: grid_sample, float32 blends): pixel for pixel. */
static void test_augmix_ops_golden(void **state)
{
    (void)state;
    gimg imgs[4];
    int nimg = load_aug_images(imgs, 4);
    gzFile g = open_golden("augmix_ops.txt.gz");
    char *buf = NULL;
    size_t cap = 0;
    int ncases = atoi(gz_data_line(g, &buf, &cap)), failed = 0;
    mgt_transform_scratch s = {0};
    for (int i = 0; i < ncases; i++) {
        char opname[32];
        double mag;
        int k;
        assert_int_equal(sscanf(gz_line(g, &buf, &cap), "%31s %lf %d", opname, &mag, &k), 3);
        assert_true(k >= 0 && k < nimg);
        mgt_aug_op op;
        CHECK(mgt_aug_op_parse(opname, &op));
        size_t n = (size_t)imgs[k].w * imgs[k].h * imgs[k].c;
        uint8_t *want = malloc(n), *got = malloc(n);
        unhex(gz_line(g, &buf, &cap), want, n);
        memcpy(got, imgs[k].px, n);
        CHECK(mgt_augment_op_tensor(op, mag, got, imgs[k].w, imgs[k].h, imgs[k].c, &s));
        int diff = 0, worst = 0;
        for (size_t q = 0; q < n; q++)
            if (got[q] != want[q]) {
                diff++;
                worst = abs(got[q] - want[q]) > worst ? abs(got[q] - want[q]) : worst;
            }
        if (diff) {
            print_message("%s %g on image %d (%dx%dx%d): %d of %zu values differ, worst %d\n",
                          opname, mag, k, imgs[k].w, imgs[k].h, imgs[k].c, diff, n, worst);
            failed++;
        }
        free(want);
        free(got);
    }
    gzclose(g);
    print_message("augmix ops: %d cases against torchvision's tensor ops, %d differ\n", ncases,
                  failed);
    assert_int_equal(failed, 0);
    for (int k = 0; k < nimg; k++)
        free(imgs[k].px);
    free(buf);
    mgt_transform_scratch_free(&s);
}

/* torch's recorded draws, replayed: Dirichlet samples and randint results in order. */
typedef struct torch_draws {
    float dir[2][3];
    int n_dir;
    long ints[64];
    int n_int, next_int, next_dir;
} torch_draws;

static void torch_dirichlet(void *ctx, int n, float *out)
{
    torch_draws *r = ctx;
    assert_true(r->next_dir < r->n_dir);
    memcpy(out, r->dir[r->next_dir++], (size_t)n * sizeof(float));
}

static int64_t torch_randint(void *ctx, int64_t lo, int64_t hi)
{
    torch_draws *r = ctx;
    assert_true(r->next_int < r->n_int);
    long v = r->ints[r->next_int++];
    assert_true(v >= lo && v < hi); /* the same call, in the same order */
    return v;
}

/* AugMix(severity) as torchvision runs it on a uint8 tensor, with torch's own draws replayed:
   the chains, their ops and magnitudes, the float32 mix and its truncation, pixel for pixel;
   every draw consumed, in torchvision's order. */
static void test_augmix_golden(void **state)
{
    (void)state;
    gimg imgs[4];
    int nimg = load_aug_images(imgs, 4);
    gzFile g = open_golden("augmix.txt.gz");
    char *buf = NULL;
    size_t cap = 0;
    int cases = 0, failed = 0;
    mgt_transform_scratch s = {0};
    char *l;
    while ((l = gz_data_line(g, &buf, &cap)) != NULL) {
        int k, severity, nd;
        assert_int_equal(sscanf(l, "%d %d %d", &k, &severity, &nd), 3);
        torch_draws r = {0};
        for (int i = 0; i < nd; i++) {
            l = gz_line(g, &buf, &cap);
            if (l[0] == 'd') {
                size_t n = (strlen(l) - 2) / 8;
                assert_true(r.n_dir < 2 && n <= 3);
                unhex(l + 2, (uint8_t *)r.dir[r.n_dir++], n * sizeof(float));
            } else {
                assert_true(r.n_int < 64);
                r.ints[r.n_int++] = atol(l + 2);
            }
        }
        size_t n = (size_t)imgs[k].w * imgs[k].h * imgs[k].c;
        uint8_t *want = malloc(n), *got = malloc(n);
        unhex(gz_line(g, &buf, &cap), want, n);
        memcpy(got, imgs[k].px, n);
        mgt_augmix_draws d = {.dirichlet = torch_dirichlet, .randint = torch_randint, .ctx = &r};
        CHECK(mgt_augmix(severity, &d, got, imgs[k].w, imgs[k].h, imgs[k].c, &s));
        assert_int_equal(r.next_dir, r.n_dir);
        assert_int_equal(r.next_int, r.n_int);
        int diff = 0;
        for (size_t q = 0; q < n; q++)
            diff += got[q] != want[q];
        if (diff) {
            print_message("augmix severity %d on image %d: %d of %zu values differ\n", severity, k,
                          diff, n);

            failed++;
        }
        cases++;
        free(want);
        free(got);
    }
    gzclose(g);
    print_message("augmix: %d cases against torchvision's AugMix, %d differ\n", cases, failed);
    assert_true(cases >= 50);
    assert_int_equal(failed, 0);
    for (int k = 0; k < nimg; k++)
        free(imgs[k].px);
    free(buf);
    mgt_transform_scratch_free(&s);
}

/* The magnitudes each policy draws from, and AutoAugment's ImageNet sub-policies, as
   torchvision's own tables (within one float ulp: torch's linspace computes a few middle
   values with a vector loop whose last bit depends on the CPU). */
static void test_augment_space_golden(void **state)
{
    (void)state;
    FILE *f = fopen(GOLDEN_DIR "/augment_space.txt", "r");
    assert_non_null(f);
    char line[8192];
    int spaces = 0, values = 0, ulps = 0, policies = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#')
            continue;
        char name[32];
        int bins, h, w, nops;
        if (sscanf(line, "space %31s %d %d %d %d", name, &bins, &h, &w, &nops) == 5) {
            mgt_auto_augment pol;
            CHECK(mgt_auto_augment_parse(name, &pol));
            for (int o = 0; o < nops; o++) {
                char opname[32];
                int sg, count, at;
                assert_non_null(fgets(line, sizeof line, f));
                assert_int_equal(sscanf(line, "%31s %d %d%n", opname, &sg, &count, &at), 3);
                mgt_aug_op op;
                CHECK(mgt_aug_op_parse(opname, &op));
                const char *p = line + at;
                for (int b = 0; b < (count ? count : 1); b++) {
                    double want = 0;
                    int used = 0;
                    if (count)
                        assert_int_equal(sscanf(p, "%lf%n", &want, &used), 1);
                    p += used;
                    bool signed_op;
                    float got = mgt_augment_magnitude(pol, op, bins, b, h, w, &signed_op);
                    assert_int_equal(signed_op, sg);
                    float wf = (float)want;
                    if (got != wf) {
                        if (nextafterf(got, wf) != wf)
                            fail_msg("%s %s bin %d: %.9g, torchvision %.9g", name, opname, b,
                                     (double)got, want);
                        ulps++;
                    }
                    values++;
                }
            }
            spaces++;
        } else if (sscanf(line, "%31s %d", name, &nops) == 2 &&
                   (strcmp(name, "imagenet") == 0 || strcmp(name, "cifar10") == 0 ||
                    strcmp(name, "svhn") == 0)) {
            const mgt_aa_step(*pol)[2] = strcmp(name, "cifar10") == 0 ? mgt_aa_cifar10
                                         : strcmp(name, "svhn") == 0  ? mgt_aa_svhn
                                                                      : mgt_aa_imagenet;
            policies++;
            assert_int_equal(nops, 25);
            for (int i = 0; i < 25; i++) {
                char a[32], b[32];
                double pa, pb;
                int ba, bb;
                assert_non_null(fgets(line, sizeof line, f));
                assert_int_equal(sscanf(line, "%31s %lf %d %31s %lf %d", a, &pa, &ba, b, &pb, &bb),
                                 6);
                mgt_aug_op oa, ob;
                CHECK(mgt_aug_op_parse(a, &oa));
                CHECK(mgt_aug_op_parse(b, &ob));
                assert_int_equal(pol[i][0].op, oa);
                assert_int_equal(pol[i][1].op, ob);
                assert_true(pol[i][0].p == (float)pa);
                assert_true(pol[i][1].p == (float)pb);
                assert_int_equal(pol[i][0].bin, ba);
                assert_int_equal(pol[i][1].bin, bb);
            }
        }
    }
    fclose(f);
    print_message("policy magnitudes: %d spaces, %d values, %d one ulp off\n", spaces, values,
                  ulps);
    assert_int_equal(spaces, 5);
    assert_int_equal(policies, 3);
    assert_true(ulps <= values / 20);
}

static void test_erase_params_golden(void **state)
{
    (void)state;
    FILE *f = fopen(GOLDEN_DIR "/erase.txt", "r");
    assert_non_null(f);
    char line[16384];
    int cases = 0, erased = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#')
            continue;
        mgt_test_replay r = {0};
        int w, h, at, used;
        assert_int_equal(sscanf(line, "%d %d %d%n", &w, &h, &r.n, &at), 3);
        const char *p = line + at;
        for (int i = 0; i < r.n; i++) {
            char k;
            assert_int_equal(sscanf(p, " %c %lf %lf %lf%n", &k, &r.lo[i], &r.hi[i], &r.v[i], &used),
                             4);
            r.kind[i] = k;
            p += used;
        }
        int top, left, eh, ew, tries;
        assert_int_equal(sscanf(p, "%d %d %d %d %d", &top, &left, &eh, &ew, &tries), 5);
        mgt_draws d = {
            .uniform = mgt_test_replay_uniform, .randint = mgt_test_replay_randint, .ctx = &r};
        mgt_crop c;
        int got = mgt_erase_params(&d, w, h, 0.02, 0.33, 0.3, 3.3, &c);
        assert_false(r.bad);
        assert_int_equal(r.pos, r.n);
        assert_int_equal(got, tries);
        assert_int_equal(c.top, top);
        assert_int_equal(c.left, left);
        assert_int_equal(c.h, eh);
        assert_int_equal(c.w, ew);
        erased += tries > 0;
        cases++;
    }
    fclose(f);
    assert_int_equal(cases, 48);
    assert_true(erased > 20 && erased < 48); /* both outcomes are covered */
}

/* The policies and erasing inside the training transform: the same key gives the same
   image, other keys other images; pixels stay in range; erasing writes zeros (the
   normalised value 0) over a rectangle. */
static void test_policies_in_transform(void **state)
{
    (void)state;
    int W = 60, H = 45;
    uint8_t *px = malloc((size_t)W * H * 3);
    for (int i = 0; i < W * H * 3; i++)
        px[i] = (uint8_t)((i * 37 + (i / 7) * 11) & 0xff);
    mgt_image img = {.pixels = px, .w = W, .h = H, .c = 3};
    const mgt_auto_augment pols[] = {MGT_AUTO_AUGMENT_NONE,    MGT_AUTO_AUGMENT_TA_WIDE,
                                     MGT_AUTO_AUGMENT_RA,      MGT_AUTO_AUGMENT_IMAGENET,
                                     MGT_AUTO_AUGMENT_CIFAR10, MGT_AUTO_AUGMENT_SVHN,
                                     MGT_AUTO_AUGMENT_AUGMIX};
    float *a = malloc(sizeof(float) * 3 * 32 * 32), *b = malloc(sizeof(float) * 3 * 32 * 32),
          *base = malloc(sizeof(float) * 3 * 32 * 32);
    mgt_transform_scratch s = {0};
    for (size_t p = 0; p < sizeof pols / sizeof *pols; p++) {
        mgt_transform t;
        CHECK(mgt_transform_init(&t, MGT_TRANSFORM_RRC, 32, 3));
        t.auto_augment = pols[p];
        t.random_erase = p == 3 ? 1.0f : 0.0f;
        CHECK(mgt_transform_check(&t));
        int changed = 0, differ = 0, zeros = 0;
        for (uint64_t idx = 0; idx < 40; idx++) {
            mgt_rng r1, r2, r0;
            mgt_rng_init(&r1, 7, 0, idx, MGT_RNG_AUGMENT);
            mgt_rng_init(&r2, 7, 0, idx, MGT_RNG_AUGMENT);
            CHECK(mgt_transform_apply(&t, &img, &r1, &s, a));
            CHECK(mgt_transform_apply(&t, &img, &r2, &s, b));
            assert_memory_equal(a, b, sizeof(float) * 3 * 32 * 32);
            /* without the policy, from the same key: the crop and flip are drawn first, so
               the policy changes the image, not the crop */
            mgt_transform plain = t;
            plain.auto_augment = MGT_AUTO_AUGMENT_NONE;
            plain.random_erase = 0;
            mgt_rng_init(&r0, 7, 0, idx, MGT_RNG_AUGMENT);
            CHECK(mgt_transform_apply(&plain, &img, &r0, &s, base));
            /* the policy path rounds to 8 bits as PIL does: an identity op moves a value by
               at most half a level */
            float worst = 0;
            for (int i = 0; i < 3 * 32 * 32; i++)
                worst = fmaxf(worst, fabsf(a[i] - base[i]) * t.std[i / 1024] * 255);
            changed += worst > 0.51f;
            mgt_rng_init(&r2, 7, 0, idx + 1000, MGT_RNG_AUGMENT);
            CHECK(mgt_transform_apply(&t, &img, &r2, &s, b));
            differ += memcmp(a, b, sizeof(float) * 3 * 32 * 32) != 0;
            for (int c = 0; c < 3; c++)
                for (int i = 0; i < 32 * 32; i++) {
                    float v = a[c * 1024 + i];
                    assert_true(v >= (0 - t.mean[c]) / t.std[c] - 1e-4f &&
                                v <= (1 - t.mean[c]) / t.std[c] + 1e-4f);
                    zeros += v == 0.0f;
                }
        }
        print_message("%s: %d of 40 images changed by the policy\n", mgt_auto_augment_name(pols[p]),
                      changed);
        if (p == 0)
            assert_int_equal(changed, 0);
        else
            /* some draws are identity ops, a zero magnitude, or (AutoAugment) fail their p;
               TrivialAugmentWide's one op is an identity about one time in ten */
            assert_true(changed >= 20 && (p != 1 || changed < 40));
        assert_true(differ >= 36);
        if (p == 3) /* erased rectangles: at least 2% of the area in most images */
            assert_true(zeros > 40 * 3 * 20);
    }
    /* --ra-magnitude: RandAugment's bin (9 by default); the same draws at another magnitude
       give another image (bar identity-like ops), at 9 the default's */
    int moved[2] = {0, 0};
    for (uint64_t idx = 0; idx < 20; idx++) {
        mgt_transform t;
        CHECK(mgt_transform_init(&t, MGT_TRANSFORM_RRC, 32, 3));
        t.auto_augment = MGT_AUTO_AUGMENT_RA;
        assert_int_equal(t.ra_magnitude, 9);
        mgt_rng r;
        mgt_rng_init(&r, 7, 0, idx, MGT_RNG_AUGMENT);
        CHECK(mgt_transform_apply(&t, &img, &r, &s, base));
        for (int k = 0; k < 2; k++) {
            t.ra_magnitude = k == 0 ? 0 : 30;
            CHECK(mgt_transform_check(&t));
            mgt_rng_init(&r, 7, 0, idx, MGT_RNG_AUGMENT);
            CHECK(mgt_transform_apply(&t, &img, &r, &s, a));
            moved[k] += memcmp(a, base, sizeof(float) * 3 * 32 * 32) != 0;
        }
        t.ra_magnitude = 9;
        mgt_rng_init(&r, 7, 0, idx, MGT_RNG_AUGMENT);
        CHECK(mgt_transform_apply(&t, &img, &r, &s, a));
        assert_memory_equal(a, base, sizeof(float) * 3 * 32 * 32);
    }
    print_message("ra magnitude 0 and 30: %d and %d of 20 images differ from 9's\n", moved[0],
                  moved[1]);
    assert_true(moved[0] >= 12 && moved[1] >= 12);
    mgt_transform t;
    CHECK(mgt_transform_init(&t, MGT_TRANSFORM_RRC, 32, 3));
    t.ra_magnitude = 31;
    assert_int_equal(mgt_transform_check(&t), MGT_ERR_INVALID);
    assert_non_null(strstr(mgt_error_last(), "0 to 30"));
    CHECK(mgt_transform_init(&t, MGT_TRANSFORM_RESIZE_CROP, 32, 3));
    t.auto_augment = MGT_AUTO_AUGMENT_RA;
    assert_int_equal(mgt_transform_check(&t), MGT_ERR_INVALID);
    CHECK(mgt_transform_init(&t, MGT_TRANSFORM_RRC, 32, 3));
    t.random_erase = 1.5f;
    assert_int_equal(mgt_transform_check(&t), MGT_ERR_INVALID);
    mgt_auto_augment aa;
    assert_int_equal(mgt_auto_augment_parse("fancy", &aa), MGT_ERR_INVALID);
    assert_non_null(strstr(mgt_error_last(), "ta_wide, ra, imagenet, cifar10, svhn, augmix"));
    CHECK(mgt_transform_init(&t, MGT_TRANSFORM_RRC, 32, 3));
    t.auto_augment = MGT_AUTO_AUGMENT_AUGMIX;
    t.augmix_severity = 11;
    assert_int_equal(mgt_transform_check(&t), MGT_ERR_INVALID);
    assert_non_null(strstr(mgt_error_last(), "--augmix-severity 11"));
    mgt_interp m;
    assert_int_equal(mgt_interp_parse("lanczos", &m), MGT_ERR_INVALID);
    mgt_transform_scratch_free(&s);
    free(px);
    free(a);
    free(b);
    free(base);
}

static void read_floats_hex(FILE *f, float *out, size_t n)
{
    static char line[1 << 16];
    assert_non_null(fgets(line, sizeof line, f));
    uint8_t *b = (uint8_t *)out;
    for (size_t i = 0; i < 4 * n; i++)
        b[i] = (uint8_t)(hexval(line[2 * i]) << 4 | hexval(line[2 * i + 1]));
}

static void read_ints(FILE *f, int32_t *out, int n)
{
    for (int i = 0; i < n; i++)
        assert_int_equal(fscanf(f, "%d", &out[i]), 1);
    int c;
    while ((c = fgetc(f)) != '\n' && c != EOF) {
    }
}

/* Mixup and cutmix against a transcription of torchvision's references RandomMixup and
   RandomCutmix (a batch rolled by one: image i's partner is image i-1), for given lambdas
   and boxes: the images bit for bit, the soft targets lam * onehot(label) + (1 - lam) *
   onehot(partner's) as the loss op builds them; and the mixed-label softmax cross-entropy
   (forward and backward on mock devices) against torch's CrossEntropyLoss with those soft
   targets and label smoothing. */
static void test_mix_golden(void **state)
{
    (void)state;
    FILE *f = fopen(GOLDEN_DIR "/mix.txt", "r");
    assert_non_null(f);
    char line[256];
    do
        assert_non_null(fgets(line, sizeof line, f));
    while (line[0] == '#');
    int N, C, H, W, K;
    assert_int_equal(sscanf(line, "batch %d %d %d %d %d", &N, &C, &H, &W, &K), 5);
    size_t img = (size_t)C * H * W;
    float *batch = malloc(sizeof(float) * N * img), *want = malloc(sizeof(float) * N * img);
    float *tgt = malloc(sizeof(float) * N * K), *mine = malloc(sizeof(float) * img);
    int32_t labels[8];
    read_floats_hex(f, batch, (size_t)N * img);
    read_ints(f, labels, N);
    mgt_devset *set = mgt_test_open_mock(1, "threads=1");
    mgt_device *dev = mgt_devset_device(set, 0);
    mgt_stream *st;
    CHECK(mgt_stream_create(dev, &st));
    int cases = 0;
    while (fgets(line, sizeof line, f)) {
        double lam, lam_out = 0;
        int rx = 0, ry = 0;
        bool cut = sscanf(line, "cutmix %lf %d %d %lf", &lam, &rx, &ry, &lam_out) == 4;
        if (cut || sscanf(line, "mixup %lf", &lam) == 1) {
            read_floats_hex(f, want, (size_t)N * img);
            read_floats_hex(f, tgt, (size_t)N * K);
            for (int i = 0; i < N; i++) {
                int p = (i + N - 1) % N;
                memcpy(mine, batch + (size_t)i * img, sizeof(float) * img);
                double w = lam;
                if (cut) {
                    mgt_crop box;
                    mgt_cutmix_box(lam, rx, ry, W, H, &box, &w);
                    assert_true(w == lam_out);
                    mgt_cutmix_images(mine, batch + (size_t)p * img, C, H, W, &box);
                } else {
                    mgt_mixup_images(mine, batch + (size_t)p * img, img, lam);
                }
                assert_memory_equal(mine, want + (size_t)i * img, sizeof(float) * img);
                for (int k = 0; k < K; k++) {
                    double t = (k == labels[i] ? w : 0.0) + (k == labels[p] ? 1.0 - w : 0.0);
                    assert_float_equal(tgt[i * K + k], t, 1e-6);
                }
            }
            cases++;
            continue;
        }
        int n, classes;
        double eps;
        if (sscanf(line, "loss %d %d %lf", &n, &classes, &eps) != 3)
            continue;
        size_t nc = (size_t)n * classes;
        float *logits = malloc(sizeof(float) * nc), *grad = malloc(sizeof(float) * nc);
        float *w = malloc(sizeof(float) * n);
        int32_t *a = malloc(sizeof(int32_t) * n), *b = malloc(sizeof(int32_t) * n);
        read_floats_hex(f, logits, nc);
        read_ints(f, a, n);
        read_ints(f, b, n);
        read_floats_hex(f, w, (size_t)n);
        double want_loss;
        assert_int_equal(fscanf(f, "%lf", &want_loss), 1);
        assert_non_null(fgets(line, sizeof line, f));
        read_floats_hex(f, grad, nc);
        /* on the device: logits, labels, weights in; loss, probs, dlogits out */
        size_t bytes = sizeof(float) * (3 * nc + 1 + n) + sizeof(int32_t) * 2 * n;
        mgt_buffer *buf;
        CHECK(mgt_buffer_alloc(dev, bytes, &buf));
        float *dz = mgt_buffer_ptr(buf), *dp = dz + nc, *dd = dp + nc, *dl = dd + nc;
        float *dw = dl + 1;
        int32_t *da = (int32_t *)(dw + n), *db = da + n;
        CHECK(mgt_copy_h2d(st, dz, logits, sizeof(float) * nc));
        CHECK(mgt_copy_h2d(st, dw, w, sizeof(float) * n));
        CHECK(mgt_copy_h2d(st, da, a, sizeof(int32_t) * n));
        CHECK(mgt_copy_h2d(st, db, b, sizeof(int32_t) * n));
        CHECK(mgt_softmax_xent_forward(st, dl, dp, dz, da, db, dw, n, classes, (float)eps));
        CHECK(mgt_softmax_xent_backward(st, dd, dp, da, db, dw, n, classes, (float)eps, 1.0f / n));
        float loss, *got = malloc(sizeof(float) * nc);
        CHECK(mgt_copy_d2h(st, &loss, dl, sizeof loss));
        CHECK(mgt_copy_d2h(st, got, dd, sizeof(float) * nc));
        CHECK(mgt_stream_synchronize(st, NULL));
        assert_float_equal(loss, want_loss, 2e-6 * fabs(want_loss) + 1e-7);
        for (size_t q = 0; q < nc; q++)
            assert_float_equal(got[q], grad[q], 1e-6);
        mgt_buffer_free(buf);
        free(logits);
        free(grad);
        free(w);
        free(a);
        free(b);
        free(got);
        cases++;
    }
    fclose(f);
    assert_int_equal(cases, 12);
    mgt_stream_free(st);
    mgt_devset_free(set);
    free(batch);
    free(want);
    free(tgt);
    free(mine);
}

/* The draws: lambda ~ Beta(alpha, alpha) (mean 1/2, variance 1 / (4 (2 alpha + 1))), the
   choice between mixup and cutmix even, a box that leaves the lambda it reports; all a
   function of (seed, epoch, place). */
static void test_mix_draws(void **state)
{
    (void)state;
    const double alphas[] = {0.2, 1.0, 4.0};
    for (int k = 0; k < 3; k++) {
        double a = alphas[k], s = 0, s2 = 0;
        int n = 20000;
        for (int i = 0; i < n; i++) {
            mgt_rng r;
            mgt_rng_init(&r, 3, 0, (uint64_t)i, MGT_RNG_MIX);
            double x = mgt_beta_draw(&r, a);
            assert_true(x >= 0 && x <= 1);
            s += x;
            s2 += x * x;
        }
        double mean = s / n, var = s2 / n - mean * mean, want = 1.0 / (4 * (2 * a + 1));
        print_message("Beta(%g, %g): mean %.4f (0.5), variance %.4f (%.4f)\n", a, a, mean, var,
                      want);
        assert_true(fabs(mean - 0.5) < 0.01 && fabs(var - want) < 0.1 * want);
    }
    mgt_mix m = {.mixup_alpha = 0.2f, .cutmix_alpha = 1.0f};
    int cut = 0;
    for (size_t place = 0; place < 2000; place++) {
        mgt_mix_draws d1, d2;
        mgt_mix_draw(&m, 5, 2, place, 32, 48, &d1);
        mgt_mix_draw(&m, 5, 2, place, 32, 48, &d2);
        assert_true(d1.cutmix == d2.cutmix && d1.lam == d2.lam);
        assert_memory_equal(&d1.box, &d2.box, sizeof d1.box);
        if (d1.cutmix) {
            cut++;
            double left = 1.0 - (double)d1.box.w * d1.box.h / (32.0 * 48);
            assert_true(fabs(left - d1.lam) < 1e-12);
            assert_true(d1.box.left >= 0 && d1.box.left + d1.box.w <= 48 && d1.box.top >= 0 &&
                        d1.box.top + d1.box.h <= 32);
        }
    }
    assert_true(cut > 900 && cut < 1100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_policy_ops_golden),   cmocka_unit_test(test_augmix_ops_golden),
        cmocka_unit_test(test_augmix_golden),       cmocka_unit_test(test_augment_space_golden),
        cmocka_unit_test(test_erase_params_golden), cmocka_unit_test(test_policies_in_transform),
        cmocka_unit_test(test_mix_golden),          cmocka_unit_test(test_mix_draws),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
