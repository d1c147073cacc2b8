/* Tests of packed datasets: packing data/sample and generated trees, reading them back
   through the loader against the folders they came from, the same bytes from two packings,
   corrupt records (strict and counted), bad files kept as bad records, hostile pack files,
   the atomic write, and the forms of --data. */
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include <turbojpeg.h>

#include "mgt/data.h"
#include "mgt/rng.h"
#include "support/fixture.h"

#define SAMPLE_DIR MGT_TEST_DATA_DIR "/../../data/sample"
#define GOLDEN_DIR MGT_TEST_DATA_DIR "/pipeline"

static char g_root[256];

/* a path built inline (support/fixture.h) */
#define P(...) mgt_test_path(__VA_ARGS__)

static bool contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

static int setup(void **state)
{
    (void)state;
    snprintf(g_root, sizeof g_root, "/tmp/mgt_test_pack_XXXXXX");
    return mkdtemp(g_root) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    mgt_test_remove_tree(g_root); /* kept under MGT_KEEP_TEST_DIR */
    return 0;
}

static void photo(uint8_t *px, int w, int h, uint64_t seed)
{
    mgt_rng r;
    mgt_rng_init(&r, seed, 0, 0, MGT_RNG_OTHER);
    double f = 6 + mgt_rng_below(&r, 20);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++) {
                double v = 128 + 90 * sin((x + 13 * c) / f) * cos(y / (f + 3)) +
                           (double)(mgt_rng_u32(&r) % 7);
                px[((size_t)y * w + x) * 3 + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
}

static void write_jpeg(const char *path, const uint8_t *px, int w, int h)
{
    tjhandle tj = tjInitCompress();
    unsigned char *buf = NULL;
    unsigned long len = 0;
    assert_int_equal(tjCompress2(tj, px, w, 0, h, TJPF_RGB, &buf, &len, TJSAMP_420, 90, 0), 0);
    mgt_test_write_file(path, buf, len);
    tjFree(buf);
    tjDestroy(tj);
}

/* A tree of w x h JPEGs, n per split over 2 classes. */
static void jpeg_tree(const char *root, int n, int w, int h)
{
    uint8_t *px = malloc((size_t)w * h * 3);
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < n; i++) {
            photo(px, w, h, (uint64_t)(100 * s + i));
            write_jpeg(P("%s/%s/k%d/%03d.jpg", root, s ? "val" : "train", i % 2, i), px, w, h);
        }
    free(px);
}

static mgt_pack_options quiet_options(mgt_pack_format f, int max_side)
{
    return (mgt_pack_options){.format = f, .max_side = max_side, .quality = 90, .workers = 2};
}

/* Packs DIR's train and val into out. */
static void pack_tree(const char *dir, const char *out, const mgt_pack_options *o,
                      mgt_pack_stats *stats)
{
    mgt_dataset *tr, *va;
    mgt_scan_options so = {.warn = mgt_test_quiet()};
    CHECK(mgt_imagefolder_open(dir, &so, &tr, &va));
    const mgt_dataset *ds[2] = {tr, va};
    const char *names[2] = {"train", "val"};
    mgt_pack_stats local;
    CHECK(mgt_pack_write(o, ds, names, 2, out, stats ? stats : &local));
    mgt_dataset_free(tr);
    mgt_dataset_free(va);
}

/* One epoch of ds through t by index (no shuffle, one thread): every image, with labels. */
static void epoch(const mgt_dataset *ds, const mgt_transform *t, float *by_index, int32_t *labels,
                  bool strict, size_t *bad, mgt_status *result)
{
    size_t floats = (size_t)t->channels * t->size * t->size;
    mgt_loader_options o;
    mgt_loader_options_init(&o, ds, t, 1, 8);
    o.workers = 1;
    o.shuffle = false;
    o.split = MGT_SPLIT_EXACT;
    o.continuous = false;
    o.bad.strict = strict;
    o.bad.max_bad_frac = 0.5;
    o.bad.warn = mgt_test_quiet();
    mgt_loader *l;
    CHECK(mgt_loader_create(&o, &l));
    CHECK(mgt_loader_set_epoch(l, 0, 0));
    mgt_status st = MGT_OK;
    for (size_t b = 0; st == MGT_OK && b < mgt_loader_batches(l, 0); b++) {
        mgt_batch bt;
        st = mgt_loader_next(l, 0, NULL, &bt);
        for (int k = 0; st == MGT_OK && k < bt.n; k++) {
            size_t i = (size_t)bt.index * 8 + (size_t)k; /* the slot's place, not a replacement */
            if (by_index)
                memcpy(by_index + i * floats, bt.images + (size_t)k * floats,
                       floats * sizeof(float));
            if (labels)
                labels[i] = bt.labels_host[k];
        }
    }
    if (bad)
        *bad = mgt_loader_bad_count(l);
    if (result)
        *result = st;
    else
        CHECK(st);
    mgt_loader_free(l);
}

/* data/sample as a raw pack holds the PNGs' own pixels: the loader's output from the pack
   equals the folder's for every image, bit for bit; as a JPEG pack (gray JPEGs at quality
   90) it is close. The index keeps labels, class names and sizes. */
static void test_pack_sample(void **state)
{
    (void)state;
    MGT_TEST_HOLD(raw, "%s/sample-raw.pack", g_root);
    MGT_TEST_HOLD(jpg, "%s/sample-jpeg.pack", g_root);
    mgt_pack_options o = quiet_options(MGT_PACK_RAW, 256);
    mgt_pack_stats st;
    pack_tree(SAMPLE_DIR, raw, &o, &st);
    assert_int_equal(st.records, 600);
    assert_int_equal(st.bad, 0);
    /* 600 records of 784 bytes, each at a multiple of 64 (832), plus the index */
    assert_true(st.file_bytes > 600 * 784 && st.file_bytes < 600 * 832 + 64 * 1024);
    o.format = MGT_PACK_JPEG;
    pack_tree(SAMPLE_DIR, jpg, &o, &st);
    assert_int_equal(st.reencoded, 600); /* PNGs become JPEGs */

    mgt_dataset *folder, *fval, *praw, *pval, *pjpg;
    CHECK(mgt_imagefolder_open(SAMPLE_DIR, NULL, &folder, &fval));
    CHECK(mgt_data_open(raw, NULL, &praw, &pval));
    CHECK(mgt_pack_open(jpg, "train", &pjpg));
    assert_true(mgt_dataset_is_pack(praw) && !mgt_dataset_is_pack(folder));
    assert_int_equal(mgt_dataset_size(praw), 300);
    assert_int_equal(mgt_dataset_size(pval), 300);
    assert_true(mgt_dataset_same_classes(praw, folder));
    for (size_t i = 0; i < 300; i++) {
        assert_int_equal(mgt_dataset_label(praw, i), mgt_dataset_label(folder, i));
        assert_string_equal(mgt_dataset_relpath(praw, i), mgt_dataset_relpath(folder, i));
    }
    assert_true(contains(mgt_dataset_dir(praw), "sample-raw.pack[train]"));
    int w, h, c;
    CHECK(mgt_dataset_probe(praw, 300, &w, &h, &c));
    assert_true(w == 28 && h == 28 && c == 1);

    mgt_transform t;
    CHECK(mgt_transform_init(&t, MGT_TRANSFORM_PAD_CROP, 28, 1));
    size_t floats = 784;
    float *a = malloc(300 * floats * sizeof(float)), *b = malloc(300 * floats * sizeof(float));
    int32_t la[300], lb[300];
    epoch(folder, &t, a, la, true, NULL, NULL);
    epoch(praw, &t, b, lb, true, NULL, NULL);
    assert_memory_equal(a, b, 300 * floats * sizeof(float));
    assert_memory_equal(la, lb, sizeof la);
    /* three channels from the gray records: the same conversion as from the files */
    CHECK(mgt_transform_init(&t, MGT_TRANSFORM_RESIZE_CROP, 24, 3));
    float *a3 = malloc(300 * 3 * 576 * sizeof(float)), *b3 = malloc(300 * 3 * 576 * sizeof(float));
    epoch(fval, &t, a3, NULL, true, NULL, NULL);
    epoch(pval, &t, b3, NULL, true, NULL, NULL);
    assert_memory_equal(a3, b3, 300 * 3 * 576 * sizeof(float));
    free(a3);
    free(b3);

    CHECK(mgt_transform_init(&t, MGT_TRANSFORM_PAD_CROP, 28, 1));
    epoch(pjpg, &t, b, NULL, true, NULL, NULL);
    double sum = 0;
    for (size_t i = 0; i < 300 * floats; i++)
        sum += fabs(a[i] - b[i]) * 255 * t.std[0];
    print_message("data/sample as JPEGs at quality 90: mean %.2f levels from the PNGs\n",
                  sum / (300.0 * floats));
    assert_true(sum / (300.0 * floats) < 4);
    free(a);
    free(b);
    mgt_dataset_free(folder);
    mgt_dataset_free(fval);
    mgt_dataset_free(praw);
    mgt_dataset_free(pval);
    mgt_dataset_free(pjpg);
}

/* Packing twice gives the same bytes, whatever the thread count; JPEGs that fit the
   maximum side are kept as they are (so the loader's output equals the folder's), larger
   ones are resized to it. */
static void test_pack_deterministic_and_max_side(void **state)
{
    (void)state;
    MGT_TEST_HOLD(tree, "%s/jpegs", g_root);
    jpeg_tree(tree, 6, 300, 200);
    MGT_TEST_HOLD(p1, "%s/a.pack", g_root);
    MGT_TEST_HOLD(p2, "%s/b.pack", g_root);
    MGT_TEST_HOLD(p3, "%s/small.pack", g_root);
    mgt_pack_options o = quiet_options(MGT_PACK_JPEG, 0);
    mgt_pack_stats st;
    pack_tree(tree, p1, &o, &st);
    assert_int_equal(st.reencoded, 0);
    o.workers = 1;
    pack_tree(tree, p2, &o, &st);
    size_t n1, n2;
    uint8_t *b1 = mgt_test_read_file(p1, &n1), *b2 = mgt_test_read_file(p2, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(b1, b2, n1);
    free(b1);
    free(b2);
    o.max_side = 150;
    o.workers = 2;
    pack_tree(tree, p3, &o, &st);
    assert_int_equal(st.reencoded, 12);
    MGT_TEST_HOLD(p4, "%s/small2.pack", g_root);
    pack_tree(tree, p4, &o, &st);
    b1 = mgt_test_read_file(p3, &n1);
    b2 = mgt_test_read_file(p4, &n2);
    assert_true(n1 == n2 && memcmp(b1, b2, n1) == 0);
    free(b1);
    free(b2);

    mgt_dataset *folder, *kept, *small;
    CHECK(mgt_dataset_scan(P("%s/train", tree), NULL, &folder));
    CHECK(mgt_pack_open(p1, "train", &kept));
    CHECK(mgt_pack_open(p3, "train", &small));
    int w, h, c;
    CHECK(mgt_dataset_probe(small, 6, &w, &h, &c));
    assert_true(w == 150 && h == 100 && c == 3);
    mgt_transform t;
    CHECK(mgt_transform_init(&t, MGT_TRANSFORM_RRC, 64, 3));
    size_t floats = 3 * 64 * 64;
    float *a = malloc(6 * floats * sizeof(float)), *b = malloc(6 * floats * sizeof(float));
    epoch(folder, &t, a, NULL, true, NULL, NULL);
    epoch(kept, &t, b, NULL, true, NULL, NULL);
    assert_memory_equal(a, b, 6 * floats * sizeof(float));
    epoch(small, &t, b, NULL, true, NULL, NULL); /* runs; the pixels are the smaller image's */
    free(a);
    free(b);
    mgt_dataset_free(folder);
    mgt_dataset_free(kept);
    mgt_dataset_free(small);
}

/* The record `i` of split 0 of a pack: its offset and size from the index (format in
   src/data/pack.c). */
static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) { return rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static void wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static const uint8_t *entry(const uint8_t *b, int split, size_t i)
{
    const uint8_t *row = b + rd64(b + 16) + 64 * split;
    return b + rd64(row + 32) + 32 * i;
}

/* Bad files in a folder become bad records; a record changed after packing fails its CRC.
   Under --strict-data either is a clear error naming the pack, the file and the reason;
   otherwise each is a counted skip whose place the next image takes, as in a folder. */
static void test_pack_bad_and_corrupt(void **state)
{
    (void)state;
    MGT_TEST_HOLD(tree, "%s/withbad", g_root);
    jpeg_tree(tree, 8, 64, 48);
    /* a truncated JPEG and a file that is no image, in train */
    size_t n;
    uint8_t *b = mgt_test_read_file(P("%s/train/k0/000.jpg", tree), &n);
    mgt_test_write_file(P("%s/train/k0/002.jpg", tree), b, n / 2);
    free(b);
    mgt_test_write_file(P("%s/train/k1/003.jpg", tree), "not a picture", 13);
    MGT_TEST_HOLD(pk, "%s/withbad.pack", g_root);
    mgt_pack_options o = quiet_options(MGT_PACK_JPEG, 0);
    mgt_pack_stats st;
    pack_tree(tree, pk, &o, &st);
    assert_int_equal(st.bad, 2);

    mgt_dataset *ds;
    CHECK(mgt_pack_open(pk, "train", &ds));
    mgt_transform t;
    CHECK(mgt_transform_init(&t, MGT_TRANSFORM_RESIZE_CROP, 32, 3));
    size_t bad = 0;
    mgt_status res;
    epoch(ds, &t, NULL, NULL, false, &bad, &res);
    assert_int_equal(res, MGT_OK);
    assert_int_equal(bad, 2);
    epoch(ds, &t, NULL, NULL, true, NULL, &res);
    assert_int_equal(res, MGT_ERR_INVALID);
    assert_true(contains(mgt_error_last(), "withbad.pack[train]/k0/002.jpg: "));
    assert_true(contains(mgt_error_last(), "(a bad file when it was packed)"));
    size_t checked_bad = 0;
    CHECK(mgt_data_check(ds, 1, NULL, NULL, NULL, NULL, &checked_bad));
    assert_int_equal(checked_bad, 2);
    mgt_dataset_free(ds);

    /* one byte of a good record changed */
    b = mgt_test_read_file(pk, &n);
    const uint8_t *e = entry(b, 0, 2); /* k0/004.jpg, a good one */
    b[rd64(e) + rd32(e + 8) / 2] ^= 0x55;
    MGT_TEST_HOLD(corrupt, "%s/corrupt.pack", g_root);
    mgt_test_write_file(corrupt, b, n);
    free(b);
    CHECK(mgt_pack_open(corrupt, "train", &ds));
    epoch(ds, &t, NULL, NULL, false, &bad, &res);
    assert_int_equal(res, MGT_OK);
    assert_int_equal(bad, 3);
    epoch(ds, &t, NULL, NULL, true, NULL, &res);
    assert_int_equal(res, MGT_ERR_INVALID);
    CHECK(mgt_data_check(ds, 2, NULL, NULL, NULL, NULL, &checked_bad));
    assert_int_equal(checked_bad, 3);
    mgt_status s2 = MGT_OK;
    {
        /* the record's error text itself */
        mgt_loader_options lo;
        mgt_loader_options_init(&lo, ds, &t, 1, 16);
        lo.workers = 0;
        lo.shuffle = false;
        lo.split = MGT_SPLIT_EXACT;
        lo.continuous = false;
        lo.bad.strict = true;
        lo.bad.warn = mgt_test_quiet();
        mgt_loader *l;
        CHECK(mgt_loader_create(&lo, &l));
        CHECK(mgt_loader_set_epoch(l, 0, 0));
        mgt_batch bt;
        s2 = mgt_loader_next(l, 0, NULL, &bt);
        mgt_loader_free(l);
    }
    assert_int_equal(s2, MGT_ERR_INVALID);
    mgt_dataset_free(ds);
}

/* A record's CRC failure names the pack, the record and the file. */
static void test_pack_crc_message(void **state)
{
    (void)state;
    MGT_TEST_HOLD(pk, "%s/crc.pack", g_root);
    mgt_pack_options o = quiet_options(MGT_PACK_RAW, 0);
    pack_tree(SAMPLE_DIR, pk, &o, NULL);
    size_t n;
    uint8_t *b = mgt_test_read_file(pk, &n);
    const uint8_t *e = entry(b, 1, 7); /* val, record 7 */
    b[rd64(e)] ^= 1;
    mgt_test_write_file(pk, b, n);
    free(b);
    mgt_dataset *ds;
    CHECK(mgt_pack_open(pk, "val", &ds));
    size_t bad = 0;
    char *reason = NULL;
    size_t rl = 0;
    FILE *f = open_memstream(&reason, &rl);
    mgt_transform t;
    CHECK(mgt_transform_init(&t, MGT_TRANSFORM_RESIZE_CROP, 28, 1));
    t.resize = 0;
    mgt_loader_options lo;
    mgt_loader_options_init(&lo, ds, &t, 1, 10);
    lo.workers = 0;
    lo.shuffle = false;
    lo.split = MGT_SPLIT_EXACT;
    lo.continuous = false;
    lo.bad.warn = f;
    mgt_loader *l;
    CHECK(mgt_loader_create(&lo, &l));
    CHECK(mgt_loader_set_epoch(l, 0, 0));
    mgt_batch bt;
    CHECK(mgt_loader_next(l, 0, NULL, &bt));
    bad = mgt_loader_bad_count(l);
    mgt_loader_free(l);
    fclose(f);
    assert_int_equal(bad, 1);
    assert_true(contains(reason, "crc.pack[val]/Ankle_boot/00007.png") ||
                contains(reason, "crc.pack[val]/"));
    assert_true(contains(reason, "record 7 is corrupt (CRC-32"));
    free(reason);
    mgt_dataset_free(ds);
}

static void expect_pack_error(const char *path, const char *needle)
{
    mgt_dataset *ds = (mgt_dataset *)1;
    mgt_status st = mgt_pack_open(path, "train", &ds);
    if (st == MGT_OK || !contains(mgt_error_last(), needle) || !contains(mgt_error_last(), path))
        fail_msg("open(%s) = %d '%s'; wanted an error naming it with '%s'", path, st,
                 mgt_error_last(), needle);
    assert_null(ds);
}

/* A pack that shrinks under a run (truncate -s while training from it) ends the run with an
   error naming the file, never SIGBUS (before: records and index were read through a map,
   and a page past the new end killed the process, exit 135). Mid-epoch, the first record
   past the end is fatal (not a bad image to skip); at the next epoch, the size check says so
   before a record is read. A record changed in place fails its CRC, naming pack and record. */
static void test_pack_changed_under_a_run(void **state)
{
    (void)state;
    MGT_TEST_HOLD(pk, "%s/shrinks.pack", g_root);
    mgt_pack_options o = quiet_options(MGT_PACK_RAW, 0);
    pack_tree(SAMPLE_DIR, pk, &o, NULL);
    mgt_dataset *ds;
    CHECK(mgt_pack_open(pk, "train", &ds));
    mgt_transform t;
    CHECK(mgt_transform_init(&t, MGT_TRANSFORM_RESIZE_CROP, 28, 1));
    t.resize = 0;
    mgt_loader_options lo;
    mgt_loader_options_init(&lo, ds, &t, 1, 10);
    lo.workers = 1;
    lo.shuffle = false;
    lo.split = MGT_SPLIT_EXACT;
    lo.continuous = false;
    lo.prefetch = 1;
    lo.bad.warn = mgt_test_quiet();
    mgt_loader *l;
    CHECK(mgt_loader_create(&lo, &l));
    CHECK(mgt_loader_set_epoch(l, 0, 0));
    mgt_batch bt;
    CHECK(mgt_loader_next(l, 0, NULL, &bt));
    assert_int_equal(truncate(pk, 20000), 0); /* 20 of the 600 records left, no index */
    mgt_status st = MGT_OK;
    for (size_t b = 1; st == MGT_OK && b < mgt_loader_batches(l, 0); b++)
        st = mgt_loader_next(l, 0, NULL, &bt);
    if (st == MGT_OK || !contains(mgt_error_last(), pk) || !contains(mgt_error_last(), "changed"))
        fail_msg("reading past the new end: status %d, '%s'", st, mgt_error_last());
    mgt_loader_free(l);
    /* the next epoch (a fresh loader here) is refused before it reads */
    CHECK(mgt_loader_create(&lo, &l));
    st = mgt_loader_set_epoch(l, 1, 0);
    if (st == MGT_OK || !contains(mgt_error_last(), pk) || !contains(mgt_error_last(), "changed"))
        fail_msg("a new epoch of a shrunk pack: status %d, '%s'", st, mgt_error_last());
    mgt_loader_free(l);
    mgt_dataset_free(ds);
}

/* Hostile pack files are refused with a message naming the file and the fault, never a
   crash: every offset, size, label and string is checked before use. */
static void test_pack_hostile(void **state)
{
    (void)state;
    MGT_TEST_HOLD(good, "%s/good.pack", g_root);
    mgt_pack_options o = quiet_options(MGT_PACK_RAW, 0);
    pack_tree(SAMPLE_DIR, good, &o, NULL);
    size_t n;
    uint8_t *g = mgt_test_read_file(good, &n), *b = malloc(n);
    MGT_TEST_HOLD(bad, "%s/hostile.pack", g_root);
#define MUTATE(code, needle)              \
    do {                                  \
        memcpy(b, g, n);                  \
        size_t len = n;                   \
        code;                             \
        mgt_test_write_file(bad, b, len); \
        expect_pack_error(bad, needle);   \
    } while (0)
#define FIX_HEADER() wr32(b + 60, (uint32_t)crc32(0, b, 60))
    uint64_t table = rd64(g + 16);
    MUTATE(len = 10, "shorter than its header");
    MUTATE(b[0] = 'X', "no MGTPACK magic");
    MUTATE(b[9] ^= 1, "header checksum mismatch");
    MUTATE((wr32(b + 8, 2), FIX_HEADER()), "pack format version 2");
    /* an unknown record format (0 JPEG, 1 raw) was taken as it came */
    MUTATE((wr32(b + 28, 7), FIX_HEADER()), "record format 7");
    MUTATE((b[16] ^= 0x40, FIX_HEADER()), "split table");
    MUTATE(len = (size_t)table + 10, "split table outside the file");
    MUTATE(b[table + 20] ^= 1, "split table checksum mismatch");
    /* an entry changed, the checksums redone: the check of the entry itself speaks */
    const uint8_t *e0 = entry(g, 0, 3);
    size_t eo = (size_t)(e0 - g);
    uint64_t eoff = rd64(g + table + 32), ecount = rd64(g + table + 16);
#define FIX_ENTRIES()                                                         \
    (wr32(b + table + 28, (uint32_t)crc32(0, b + eoff, (uInt)(ecount * 32))), \
     wr32(b + 24, (uint32_t)crc32(0, b + table, 64 * rd32(b + 12))), FIX_HEADER())
    MUTATE(b[eo] ^= 1, "index checksum mismatch");
    MUTATE((wr32(b + eo + 16, 99), FIX_ENTRIES()), "record 3: its label is not a class");
    MUTATE((wr32(b + eo + 8, 1u << 31), FIX_ENTRIES()), "record 3: its bytes lie outside");
    MUTATE((b[eo + 24] = 7, FIX_ENTRIES()), "record 3: unknown record kind");
    MUTATE((wr32(b + eo + 8, 100), FIX_ENTRIES()), "record 3: raw pixels of the wrong size");
    MUTATE((wr32(b + eo + 28, 1u << 30), FIX_ENTRIES()), "name lies outside the strings");
    /* a split of no records (was "entries outside the file") */
    MUTATE((wr32(b + table + 16, 0), wr32(b + table + 20, 0),
            wr32(b + 24, (uint32_t)crc32(0, b + table, 64 * rd32(b + 12))), FIX_HEADER()),
           "split train holds no records");
    /* no such split */
    mgt_test_write_file(bad, g, n);
    mgt_dataset *ds = (mgt_dataset *)1;
    assert_int_equal(mgt_pack_open(bad, "test", &ds), MGT_ERR_INVALID);
    assert_true(contains(mgt_error_last(), "no split 'test' in the pack (it has: train, val)"));
    /* not a file */
    assert_int_equal(mgt_pack_open(g_root, "train", &ds), MGT_ERR_INVALID);
    assert_int_equal(mgt_pack_open(P("%s/none.pack", g_root), "train", &ds), MGT_ERR_IO);
    assert_true(contains(mgt_error_last(), "No such file"));
    /* a random-byte fuzz of the index region: refused or read, never a crash */
    mgt_rng r;
    mgt_rng_init(&r, 5, 0, 0, MGT_RNG_OTHER);
    for (int k = 0; k < 200; k++) {
        memcpy(b, g, n);
        size_t at = (size_t)eoff + mgt_rng_below(&r, n - (size_t)eoff);
        b[at] = (uint8_t)mgt_rng_u32(&r);
        mgt_test_write_file(bad, b, n);
        if (mgt_pack_open(bad, "val", &ds) == MGT_OK)
            mgt_dataset_free(ds);
    }
#undef MUTATE
    free(g);
    free(b);
}

/* The write is atomic: a failed pack leaves no temp file, and a pack already at the path
   stays as it was. --data finds a pack file, a folder of packs, or a tree. */
static void test_pack_atomic_and_open_forms(void **state)
{
    (void)state;
    MGT_TEST_HOLD(dir, "%s/forms", g_root);
    mgt_test_mkdirs(dir);
    MGT_TEST_HOLD(pk, "%s/both.pack", dir);
    mgt_pack_options o = quiet_options(MGT_PACK_RAW, 0);
    pack_tree(SAMPLE_DIR, pk, &o, NULL);
    size_t n0;
    uint8_t *before = mgt_test_read_file(pk, &n0);
    /* an abort raised before the first record: the write fails, the old pack stays */
    mgt_abort ab = {0};
    mgt_abort_raise(&ab);
    o.abort = &ab;
    mgt_dataset *tr;
    CHECK(mgt_dataset_scan(SAMPLE_DIR "/train", NULL, &tr));
    const mgt_dataset *one[1] = {tr};
    const char *names[1] = {"train"};
    mgt_pack_stats st;
    assert_int_equal(mgt_pack_write(&o, one, names, 1, pk, &st), MGT_ERR_ABORTED);
    size_t n1;
    uint8_t *after = mgt_test_read_file(pk, &n1);
    assert_true(n0 == n1 && memcmp(before, after, n0) == 0);
    free(before);
    free(after);
    o.abort = NULL;
    /* a folder that cannot be written */
    assert_int_equal(mgt_pack_write(&o, one, names, 1, P("%s/no/such/dir/x.pack", dir), &st),
                     MGT_ERR_IO);
    assert_true(contains(mgt_error_last(), "No such file"));
    /* no temp file left behind */
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "ls %s | grep -c tmp", dir);
    FILE *p = popen(cmd, "r");
    int tmps = -1;
    assert_int_equal(fscanf(p, "%d", &tmps), 1);
    pclose(p);
    assert_int_equal(tmps, 0);

    /* a folder of train.pack and val.pack */
    MGT_TEST_HOLD(two, "%s/two", dir);
    mgt_test_mkdirs(two);
    CHECK(mgt_pack_write(&o, one, names, 1, P("%s/train.pack", two), &st));
    mgt_dataset *va;
    CHECK(mgt_dataset_scan(SAMPLE_DIR "/val", NULL, &va));
    const mgt_dataset *vone[1] = {va};
    const char *vnames[1] = {"val"};
    CHECK(mgt_pack_write(&o, vone, vnames, 1, P("%s/val.pack", two), &st));
    mgt_dataset *a, *b;
    CHECK(mgt_data_open(two, NULL, &a, &b));
    assert_int_equal(mgt_dataset_size(a), 300);
    assert_int_equal(mgt_dataset_size(b), 300);
    mgt_dataset_free(a);
    mgt_dataset_free(b);
    CHECK(mgt_data_open(pk, NULL, &a, &b));
    mgt_dataset_free(a);
    mgt_dataset_free(b);
    CHECK(mgt_data_open(SAMPLE_DIR, NULL, &a, &b));
    assert_false(mgt_dataset_is_pack(a));
    mgt_dataset_free(a);
    mgt_dataset_free(b);
    /* a val.pack missing beside train.pack */
    assert_int_equal(unlink(P("%s/val.pack", two)), 0);
    assert_int_equal(mgt_data_open(two, NULL, &a, &b), MGT_ERR_IO);
    assert_true(contains(mgt_error_last(), "val.pack: no such file"));
    /* splits packed from different trees */
    MGT_TEST_HOLD(other, "%s/other", g_root);
    jpeg_tree(other, 2, 16, 16);
    mgt_dataset *ov;
    CHECK(mgt_dataset_scan(P("%s/val", other), NULL, &ov));
    const mgt_dataset *oone[1] = {ov};
    CHECK(mgt_pack_write(&o, oone, vnames, 1, P("%s/val.pack", two), &st));
    assert_int_equal(mgt_data_open(two, NULL, &a, &b), MGT_ERR_INVALID);
    assert_true(contains(mgt_error_last(), "different classes"));
    mgt_dataset_free(ov);
    mgt_dataset_free(tr);
    mgt_dataset_free(va);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_sample),
        cmocka_unit_test(test_pack_deterministic_and_max_side),
        cmocka_unit_test(test_pack_bad_and_corrupt),
        cmocka_unit_test(test_pack_crc_message),
        cmocka_unit_test(test_pack_hostile),
        cmocka_unit_test(test_pack_changed_under_a_run),
        cmocka_unit_test(test_pack_atomic_and_open_forms),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
