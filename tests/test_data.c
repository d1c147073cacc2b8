/* Tests of the data pipeline: Philox, ImageFolder scan, decoding, transforms against PIL and
   torchvision goldens, the sampler against DistributedSampler goldens, the loader (on the
   host and on mock devices), bad files, abort, the IDX import. Image trees are written into
   a temp folder at start. */
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include <stb/stb_image_write.h>
#include <turbojpeg.h>

#include "app/commands.h"
#include "mgt/data.h"
#include "mgt/device.h"
#include "mgt/rng.h"
#include "support/fixture.h"
#include "support/golden.h"

#define GOLDEN_DIR MGT_TEST_DATA_DIR "/pipeline"
/* the committed sample tree (data/README.md) */
#define SAMPLE_DIR MGT_TEST_DATA_DIR "/../../data/sample"

static char g_root[256];

/* a path built inline (support/fixture.h) */
#define P(...) mgt_test_path(__VA_ARGS__)

/* ---- helpers ---- */

/* Copies a JPEG fixture made by libjpeg (scripts/make_data_goldens.py): stb_image_write's
   own JPEG encoder shifts signed ints past their range, which UBSan stops on. */
static void copy_fixture(const char *name, const char *dst)
{
    size_t n;
    uint8_t *b = mgt_test_read_file(P("%s/%s", GOLDEN_DIR, name), &n);
    mgt_test_write_file(dst, b, n);
    free(b);
}

static void png8(const char *path, int w, int h, int c, const uint8_t *px)
{
    mgt_test_parent_dirs(path);
    assert_true(stbi_write_png(path, w, h, c, px, w * c));
}

static void be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* A PNG written chunk by chunk, for what stb_image_write cannot make (16 bits, palette). */
static void png_chunk(FILE *f, const char *type, const uint8_t *data, uint32_t len)
{
    uint8_t hdr[8];
    be32(hdr, len);
    memcpy(hdr + 4, type, 4);
    fwrite(hdr, 1, 8, f);
    if (len)
        fwrite(data, 1, len, f);
    uLong crc = crc32(0, (const Bytef *)type, 4);
    if (len)
        crc = crc32(crc, data, len);
    uint8_t c[4];
    be32(c, (uint32_t)crc);
    fwrite(c, 1, 4, f);
}

/* rows: h rows of rowbytes, written with filter 0 */
static void png_raw(const char *path, int w, int h, int depth, int ctype, const uint8_t *rows,
                    size_t rowbytes, const uint8_t *plte, int nplte, bool idat)
{
    mgt_test_parent_dirs(path);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    fwrite(sig, 1, 8, f);
    uint8_t ihdr[13] = {0};
    be32(ihdr, (uint32_t)w);
    be32(ihdr + 4, (uint32_t)h);
    ihdr[8] = (uint8_t)depth;
    ihdr[9] = (uint8_t)ctype;
    png_chunk(f, "IHDR", ihdr, 13);
    if (plte)
        png_chunk(f, "PLTE", plte, (uint32_t)(3 * nplte));
    if (idat) {
        size_t rawn = (size_t)h * (rowbytes + 1);
        uint8_t *raw = malloc(rawn);
        for (int y = 0; y < h; y++) {
            raw[(size_t)y * (rowbytes + 1)] = 0;
            memcpy(raw + (size_t)y * (rowbytes + 1) + 1, rows + (size_t)y * rowbytes, rowbytes);
        }
        uLongf zn = compressBound(rawn);
        uint8_t *z = malloc(zn);
        assert_int_equal(compress(z, &zn, raw, rawn), Z_OK);
        png_chunk(f, "IDAT", z, (uint32_t)zn);
        free(raw);
        free(z);
    }
    png_chunk(f, "IEND", NULL, 0);
    assert_int_equal(fclose(f), 0);
}

/* A GIF of a 2-colour palette, LZW-coded with a clear code before every pixel so that the
   code width stays at 3 bits (min code size 2: clear = 4, end = 5). */
static void gif2(const char *path, int w, int h, const uint8_t pal[6], const uint8_t *idx)
{
    uint8_t b[512];
    size_t n = 0;
    memcpy(b, "GIF89a", 6);
    n = 6;
    b[n++] = (uint8_t)w;
    b[n++] = (uint8_t)(w >> 8);
    b[n++] = (uint8_t)h;
    b[n++] = (uint8_t)(h >> 8);
    b[n++] = 0x80; /* a global colour table of 2 entries */
    b[n++] = 0;
    b[n++] = 0;
    memcpy(b + n, pal, 6);
    n += 6;
    b[n++] = 0x2c;
    memset(b + n, 0, 4);
    n += 4;
    b[n++] = (uint8_t)w;
    b[n++] = (uint8_t)(w >> 8);
    b[n++] = (uint8_t)h;
    b[n++] = (uint8_t)(h >> 8);
    b[n++] = 0;
    b[n++] = 2; /* LZW minimum code size */
    uint8_t data[256] = {0};
    unsigned bits = 0;
    int codes[130], nc = 0;
    for (int i = 0; i < w * h; i++) {
        codes[nc++] = 4;
        codes[nc++] = idx[i];
    }
    codes[nc++] = 5;
    for (int i = 0; i < nc; i++, bits += 3)
        for (int k = 0; k < 3; k++)
            if (codes[i] >> k & 1)
                data[(bits + k) / 8] |= (uint8_t)(1 << ((bits + k) % 8));
    size_t dn = (bits + 7) / 8;
    assert_true(dn < 255);
    b[n++] = (uint8_t)dn;
    memcpy(b + n, data, dn);
    n += dn;
    b[n++] = 0;
    b[n++] = 0x3b;
    mgt_test_write_file(path, b, n);
}

static void pnm(const char *path, int w, int h, int c, const uint8_t *px)
{
    char hdr[64];
    int n = snprintf(hdr, sizeof hdr, "P%d\n%d %d\n255\n", c == 1 ? 5 : 6, w, h);
    size_t len = (size_t)n + (size_t)w * h * c;
    uint8_t *b = malloc(len);
    memcpy(b, hdr, (size_t)n);
    memcpy(b + n, px, (size_t)w * h * c);
    mgt_test_write_file(path, b, len);
    free(b);
}

/* A small image whose pixels tell which file it is: every value = tag (gray). */
static void tagged_png(const char *path, int w, int h, uint8_t tag)
{
    uint8_t *px = malloc((size_t)w * h);
    memset(px, tag, (size_t)w * h);
    png8(path, w, h, 1, px);
    free(px);
}

/* Noise with some structure, as a colour image. */
static void noise_rgb(uint8_t *px, int w, int h, uint64_t seed)
{
    mgt_rng r;
    mgt_rng_init(&r, seed, 0, 0, MGT_RNG_OTHER);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++)
                px[((size_t)y * w + x) * 3 + c] =
                    (uint8_t)((x * 7 + y * 3 + c * 50 + (int)(mgt_rng_u32(&r) % 32)) & 0xff);
}

static bool contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* ---- fixtures: the trees, written once ---- */

static int setup(void **state)
{
    (void)state;
    snprintf(g_root, sizeof g_root, "/tmp/mgt_test_data_XXXXXX");
    if (!mkdtemp(g_root))
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    mgt_test_remove_tree(g_root); /* kept under MGT_KEEP_TEST_DIR */
    return 0;
}

/* ---- Philox ---- */

static void test_philox_kat(void **state)
{
    (void)state;
    /* Random123's tests/kat_vectors, the three philox4x32 10 lines */
    static const uint32_t ctr[3][4] = {{0, 0, 0, 0},
                                       {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
                                       {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}};
    static const uint32_t key[3][2] = {{0, 0}, {0xffffffff, 0xffffffff}, {0xa4093822, 0x299f31d0}};
    static const uint32_t want[3][4] = {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
                                        {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
                                        {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}};
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        mgt_philox4x32_10(ctr[i], key[i], out);
        for (int k = 0; k < 4; k++)
            assert_int_equal(out[k], want[i][k]);
    }
}

static void test_rng_draws(void **state)
{
    (void)state;
    mgt_rng a, b;
    mgt_rng_init(&a, 42, 3, 1000, MGT_RNG_AUGMENT);
    mgt_rng_init(&b, 42, 3, 1000, MGT_RNG_AUGMENT);
    for (int i = 0; i < 100; i++)
        assert_int_equal(mgt_rng_u32(&a), mgt_rng_u32(&b));
    /* the stream is the Philox block sequence of its key */
    mgt_rng_init(&a, 0x0000000500000007ull, 9, 0x0000000300000011ull, MGT_RNG_SHUFFLE);
    uint32_t ctr[4] = {0, 9, 0x11, 3 | (MGT_RNG_SHUFFLE << 24)}, key[2] = {7, 5}, out[4];
    mgt_philox4x32_10(ctr, key, out);
    for (int k = 0; k < 4; k++)
        assert_int_equal(mgt_rng_u32(&a), out[k]);
    ctr[0] = 1;
    mgt_philox4x32_10(ctr, key, out);
    assert_int_equal(mgt_rng_u32(&a), out[0]);
    /* a run of blocks is the words the stream hands out from its first block on, and the
       double of two words is uniform_double's */
    uint32_t run[4 * 7];
    mgt_rng_init(&a, 11, 2, 77, MGT_RNG_INIT);
    mgt_rng_blocks(&a, 3, 7, run);
    for (int k = 0; k < 12; k++)
        (void)mgt_rng_u32(&a);
    for (int k = 0; k < 4 * 7; k++)
        assert_int_equal(run[k], mgt_rng_u32(&a));
    mgt_rng_init(&b, 11, 2, 77, MGT_RNG_INIT);
    mgt_rng_blocks(&b, 0, 1, run);
    assert_true(mgt_rng_double_of(run[0], run[1]) == mgt_rng_uniform_double(&b));
    /* different keys differ */
    mgt_rng_init(&a, 42, 3, 1000, MGT_RNG_AUGMENT);
    mgt_rng_init(&b, 42, 3, 1001, MGT_RNG_AUGMENT);
    assert_int_not_equal(mgt_rng_u32(&a), mgt_rng_u32(&b));

    /* ranges, floats, and a rough uniformity check of below() */
    int hist[7] = {0};
    mgt_rng_init(&a, 1, 0, 0, MGT_RNG_OTHER);
    for (int i = 0; i < 70000; i++) {
        uint64_t v = mgt_rng_below(&a, 7);
        assert_true(v < 7);
        hist[v]++;
        float u = mgt_rng_uniform(&a);
        assert_true(u >= 0.0f && u < 1.0f);
        double d = mgt_rng_uniform_double(&a);
        assert_true(d >= 0.0 && d < 1.0);
        int64_t r = mgt_rng_range(&a, -3, 4);
        assert_true(r >= -3 && r < 4);
    }
    for (int k = 0; k < 7; k++)
        assert_true(abs(hist[k] - 10000) < 600);
    assert_true(mgt_rng_below(&a, (1ull << 40) + 3) < (1ull << 40) + 3);
    assert_int_equal(mgt_rng_below(&a, 1), 0);

    /* a shuffle is a permutation, keyed */
    size_t p[1000], q[1000];
    for (size_t i = 0; i < 1000; i++)
        p[i] = q[i] = i;
    mgt_rng_init(&a, 5, 1, 0, MGT_RNG_SHUFFLE);
    mgt_rng_shuffle(&a, p, 1000);
    mgt_rng_init(&a, 5, 1, 0, MGT_RNG_SHUFFLE);
    mgt_rng_shuffle(&a, q, 1000);
    assert_memory_equal(p, q, sizeof p);
    char seen[1000] = {0};
    size_t moved = 0;
    for (size_t i = 0; i < 1000; i++) {
        assert_true(p[i] < 1000 && !seen[p[i]]);
        seen[p[i]] = 1;
        moved += p[i] != i;
    }
    assert_true(moved > 900);
}

/* ---- ImageFolder scan ---- */

static void make_scan_tree(const char *root_arg)
{
    MGT_TEST_HOLD(root, "%s", root_arg);
    MGT_TEST_HOLD(t, "%s/train", root);
    tagged_png(P("%s/cat/x.png", t), 4, 4, 1);
    tagged_png(P("%s/cat/Y.PNG", t), 4, 4, 2);
    uint8_t rgb[4 * 4 * 3];
    noise_rgb(rgb, 4, 4, 1);
    copy_fixture("photo420.jpg", P("%s/cat/a/1.jpg", t));
    mgt_test_parent_dirs(P("%s/cat/a-b/2.bmp", t));
    assert_true(stbi_write_bmp(P("%s/cat/a-b/2.bmp", t), 4, 4, 3, rgb));
    tagged_png(P("%s/cat/a/z/3.png", t), 4, 4, 3);
    mgt_test_write_file(P("%s/cat/notes.txt", t), "hello", 5);
    tagged_png(P("%s/cat/.hidden.png", t), 4, 4, 9);
    tagged_png(P("%s/cat/.ipynb_checkpoints/4.png", t), 4, 4, 9);
    assert_int_equal(symlink(".", P("%s/cat/loop", t)), 0); /* a cycle */
    tagged_png(P("%s/dog/b.JpEg.png", t), 4, 4, 5);
    mgt_test_parent_dirs(P("%s/dog/c.TGA", t));
    assert_true(stbi_write_tga(P("%s/dog/c.TGA", t), 4, 4, 3, rgb));
    tagged_png(P("%s/Zebra/z.png", t), 4, 4, 6);
    tagged_png(P("%s/.hidden_class/h.png", t), 4, 4, 9);
    tagged_png(P("%s/stray.png", t), 4, 4, 9); /* files beside the classes do not count */
    mgt_test_mkdirs(P("%s/val", root));
    tagged_png(P("%s/val/cat/v.png", root), 4, 4, 7);
    tagged_png(P("%s/val/dog/v.png", root), 4, 4, 7);
    tagged_png(P("%s/val/Zebra/v.png", root), 4, 4, 7);
}

static void test_scan_order_and_labels(void **state)
{
    (void)state;
    MGT_TEST_HOLD(root, "%s/scan", g_root);
    make_scan_tree(root);
    mgt_dataset *tr = NULL, *va = NULL;
    char *progress_buf = NULL;
    size_t progress_len = 0;
    FILE *pf = open_memstream(&progress_buf, &progress_len);
    mgt_scan_options so = {.progress = pf, .warn = mgt_test_quiet()};
    assert_int_equal(mgt_imagefolder_open(root, &so, &tr, &va), MGT_OK);
    fclose(pf);
    assert_true(contains(progress_buf, "files/s"));
    free(progress_buf);

    assert_int_equal(mgt_dataset_class_count(tr), 3);
    assert_string_equal(mgt_dataset_class_name(tr, 0), "Zebra"); /* strcmp: capitals first */
    assert_string_equal(mgt_dataset_class_name(tr, 1), "cat");
    assert_string_equal(mgt_dataset_class_name(tr, 2), "dog");
    static const char *want[] = {
        /* torchvision: sorted(os.walk) orders folders by path ("cat/a-b" < "cat/a/z" since
           '-' < '/'), then sorted file names within each */
        "Zebra/z.png",   "cat/Y.PNG",     "cat/x.png",      "cat/a/1.jpg",
        "cat/a-b/2.bmp", "cat/a/z/3.png", "dog/b.JpEg.png", "dog/c.TGA",
    };
    static const int labels[] = {0, 1, 1, 1, 1, 1, 2, 2};
    assert_int_equal(mgt_dataset_size(tr), 8);
    for (size_t i = 0; i < 8; i++) {
        assert_string_equal(mgt_dataset_relpath(tr, i), want[i]);
        assert_int_equal(mgt_dataset_label(tr, i), labels[i]);
    }
    char path[4096];
    assert_int_equal(mgt_dataset_path(tr, 1, path, sizeof path), MGT_OK);
    assert_string_equal(path, P("%s/train/cat/Y.PNG", root));
    assert_int_equal(mgt_dataset_path(tr, 1, path, 8), MGT_ERR_INVALID);
    assert_int_equal(mgt_dataset_size(va), 3);
    assert_true(mgt_dataset_same_classes(tr, va));
    assert_true(mgt_dataset_scan_seconds(tr) >= 0);

    int w, h, c;
    assert_int_equal(mgt_dataset_probe(tr, 100, &w, &h, &c), MGT_OK);
    assert_int_equal(w, 4);
    assert_int_equal(h, 4);
    assert_int_equal(c, 3); /* the JPEG, BMP and TGA are colour */
    assert_int_equal(mgt_dataset_probe(va, 3, &w, &h, &c), MGT_OK);
    assert_int_equal(c, 1);
    mgt_dataset_free(tr);
    mgt_dataset_free(va);
    mgt_dataset_free(NULL);

    /* a trailing slash changes nothing */
    so.progress = NULL;
    assert_int_equal(mgt_dataset_scan(P("%s/train/", root), &so, &tr), MGT_OK);
    assert_string_equal(mgt_dataset_dir(tr), P("%s/train", root));
    mgt_dataset_free(tr);
}

/* Issue 17: symbolic links that loop. Each class folder of this val split holds a link to
   the split ("up" -> ..); one also a link to itself, one to another class, one a link one
   level up from a subfolder, and two links to one real subfolder. os.walk(followlinks=True)
   would count the split again inside every class (a 15-image split counted as 80 and more);
   the scan enters each folder once and names every link it does not follow. */
static void test_scan_symlink_loops(void **state)
{
    (void)state;
    MGT_TEST_HOLD(v, "%s/loops/val", g_root);
    for (int c = 0; c < 3; c++) {
        for (int i = 0; i < 5; i++)
            tagged_png(P("%s/c%d/%d.png", v, c, i), 4, 4, (uint8_t)(10 * c + i));
        assert_int_equal(symlink("..", P("%s/c%d/up", v, c)), 0);
    }
    assert_int_equal(symlink(".", P("%s/c0/loop", v)), 0);
    assert_int_equal(symlink("../c2", P("%s/c1/other", v)), 0);
    tagged_png(P("%s/c1/sub/s.png", v), 4, 4, 40);
    assert_int_equal(symlink("..", P("%s/c1/sub/back", v)), 0);
    tagged_png(P("%s/c2/real/r1.png", v), 4, 4, 50);
    tagged_png(P("%s/c2/real/r2.png", v), 4, 4, 51);
    assert_int_equal(symlink("real", P("%s/c2/e1", v)), 0);
    assert_int_equal(symlink("real", P("%s/c2/e2", v)), 0);

    char *buf = NULL;
    size_t len = 0;
    FILE *wf = open_memstream(&buf, &len);
    mgt_scan_options so = {.warn = wf};
    mgt_dataset *ds;
    CHECK(mgt_dataset_scan(v, &so, &ds));
    fclose(wf);
    /* 15 images, c1/sub/s.png, and c2's two in real/ once (reached first as e1, in sorted
       order) */
    assert_int_equal(mgt_dataset_size(ds), 18);
    assert_string_equal(mgt_dataset_relpath(ds, 17), "c2/e1/r2.png");
    int per_class[3] = {0};
    for (size_t i = 0; i < mgt_dataset_size(ds); i++)
        per_class[mgt_dataset_label(ds, i)]++;
    assert_int_equal(per_class[0], 5);
    assert_int_equal(per_class[1], 6);
    assert_int_equal(per_class[2], 7);
    /* not followed: three "up", c0/loop, c1/other, c1/sub/back, c2/e2, c2/real */
    assert_int_equal(mgt_dataset_links_skipped(ds), 8);
    assert_true(contains(buf, P("%s/c0/loop: a symbolic link loop (back to %s/c0)", v, v)));
    assert_true(contains(buf, P("%s/c0/up: a symbolic link loop (back to %s/)", v, v)));
    assert_true(contains(buf, P("%s/c1/sub/back: a symbolic link loop (back to %s/c1)", v, v)));
    assert_true(contains(buf, P("%s/c1/other: leads to a folder already scanned (%s/c2)", v, v)));
    assert_true(contains(buf, P("%s/c2/e2: leads to a folder already scanned (%s/c2/e1)", v, v)));
    free(buf);
    mgt_dataset_free(ds);
}

/* data/sample, real Fashion-MNIST images: scanned as torchvision would (10 classes in
   sorted order, 30 of each per split), every file decodes, the loader delivers each image
   once per epoch with its label, and the mean and std come out as Fashion-MNIST's. */
static void test_sample_tree(void **state)
{
    (void)state;
    mgt_dataset *tr, *va;
    CHECK(mgt_imagefolder_open(SAMPLE_DIR, NULL, &tr, &va));
    assert_int_equal(mgt_dataset_class_count(tr), 10);
    assert_int_equal(mgt_dataset_size(tr), 300);
    assert_int_equal(mgt_dataset_size(va), 300);
    assert_string_equal(mgt_dataset_class_name(tr, 0), "Ankle_boot");
    assert_string_equal(mgt_dataset_class_name(tr, 9), "Trouser");
    assert_string_equal(mgt_dataset_relpath(tr, 0), "Ankle_boot/00000.png");
    for (size_t i = 0; i < 300; i++)
        assert_int_equal(mgt_dataset_label(tr, i), (int)(i / 30));
    int w, h, c;
    CHECK(mgt_dataset_probe(tr, 50, &w, &h, &c));
    assert_true(w == 28 && h == 28 && c == 1);
    size_t bad = 1;
    CHECK(mgt_data_check(va, 2, NULL, NULL, NULL, NULL, &bad));
    assert_int_equal(bad, 0);
    float mean[3], std[3];
    CHECK(mgt_data_stats(tr, 1, 0, 2, NULL, mean, std));
    /* Fashion-MNIST's training set: mean 0.2860, std 0.3530 (this subset is close) */
    assert_true(fabsf(mean[0] - 0.286f) < 0.03f && fabsf(std[0] - 0.353f) < 0.03f);

    mgt_transform t;
    CHECK(mgt_transform_init(&t, MGT_TRANSFORM_PAD_CROP, 28, 1));
    mgt_loader_options o;
    mgt_loader_options_init(&o, tr, &t, 2, 32);
    o.workers = 2;
    o.continuous = false;
    o.split = MGT_SPLIT_EXACT;
    mgt_loader *l;
    CHECK(mgt_loader_create(&o, &l));
    CHECK(mgt_loader_set_epoch(l, 0, 0));
    int seen[300] = {0};
    double sum = 0;
    for (int r = 0; r < 2; r++)
        for (size_t b = 0; b < mgt_loader_batches(l, r); b++) {
            mgt_batch bt;
            CHECK(mgt_loader_next(l, r, NULL, &bt));
            for (int k = 0; k < bt.n; k++) {
                seen[bt.indices_host[k]]++;
                assert_int_equal(bt.labels_host[k], mgt_dataset_label(tr, bt.indices_host[k]));
                for (int p = 0; p < 28 * 28; p++)
                    sum += bt.images[(size_t)k * 784 + p];
            }
        }
    for (int i = 0; i < 300; i++)
        assert_int_equal(seen[i], 1);
    /* normalised with the gray ImageNet constants: the images' mean maps near
       (0.286 - 0.459) / 0.2256, a little lower for the zero padding the crops bring in */
    double m = sum / (300.0 * 784);
    assert_true(m > -1.2 && m < -0.5);
    mgt_loader_free(l);
    mgt_dataset_free(tr);
    mgt_dataset_free(va);
}

static void expect_open_error(const char *dir, mgt_status want, const char *needle1,
                              const char *needle2)
{
    mgt_dataset *tr = (mgt_dataset *)1, *va = (mgt_dataset *)1;
    mgt_status st = mgt_imagefolder_open(dir, NULL, &tr, &va);
    if (st != want || !contains(mgt_error_last(), needle1) ||
        (needle2 && !contains(mgt_error_last(), needle2)))
        fail_msg("open(%s) = %d '%s'; wanted %d with '%s' '%s'", dir, st, mgt_error_last(), want,
                 needle1, needle2 ? needle2 : "");
    assert_null(tr);
    assert_null(va);
}

static void test_dataset_errors(void **state)
{
    (void)state;
    MGT_TEST_HOLD(r, "%s/bad", g_root);
    expect_open_error(P("%s/missing", r), MGT_ERR_IO, P("%s/missing", r), "no such folder");
    mgt_test_mkdirs(P("%s/nosplits", r));
    expect_open_error(P("%s/nosplits", r), MGT_ERR_IO, P("%s/nosplits/train", r), "no such folder");
    tagged_png(P("%s/noval/train/a/1.png", r), 2, 2, 1);
    expect_open_error(P("%s/noval", r), MGT_ERR_IO, P("%s/noval/val", r), "no such folder");
    mgt_test_mkdirs(P("%s/noclass/train", r));
    mgt_test_mkdirs(P("%s/noclass/val", r));
    tagged_png(P("%s/noclass/train/loose.png", r), 2, 2, 1);
    expect_open_error(P("%s/noclass", r), MGT_ERR_INVALID, P("%s/noclass/train", r),
                      "no class folders");
    tagged_png(P("%s/empty/train/a/1.png", r), 2, 2, 1);
    mgt_test_write_file(P("%s/empty/train/b/readme.txt", r), "x", 1);
    tagged_png(P("%s/empty/val/a/1.png", r), 2, 2, 1);
    expect_open_error(P("%s/empty", r), MGT_ERR_INVALID, P("%s/empty/train/b", r),
                      "no image files");
    tagged_png(P("%s/mismatch/train/a/1.png", r), 2, 2, 1);
    tagged_png(P("%s/mismatch/train/b/1.png", r), 2, 2, 1);
    tagged_png(P("%s/mismatch/val/a/1.png", r), 2, 2, 1);
    tagged_png(P("%s/mismatch/val/c/1.png", r), 2, 2, 1);
    expect_open_error(P("%s/mismatch", r), MGT_ERR_INVALID, "different classes", "'b' is only in");
    mgt_test_write_file(P("%s/afile", r), "x", 1);
    expect_open_error(P("%s/afile", r), MGT_ERR_INVALID, P("%s/afile", r), "not a folder");

    /* fewer samples than devices: the loader names the split */
    mgt_dataset *ds = NULL;
    tagged_png(P("%s/few/train/a/1.png", r), 2, 2, 1);
    tagged_png(P("%s/few/train/b/1.png", r), 2, 2, 1);
    assert_int_equal(mgt_dataset_scan(P("%s/few/train", r), NULL, &ds), MGT_OK);
    mgt_transform t;
    assert_int_equal(mgt_transform_init(&t, MGT_TRANSFORM_RESIZE_CROP, 2, 1), MGT_OK);
    mgt_loader_options o;
    mgt_loader_options_init(&o, ds, &t, 3, 1);
    mgt_loader *l = NULL;
    assert_int_equal(mgt_loader_create(&o, &l), MGT_ERR_INVALID);
    assert_null(l);
    assert_true(contains(mgt_error_last(), P("%s/few/train", r)));
    assert_true(contains(mgt_error_last(), "2 samples for 3 devices"));
    /* ... and a batch bigger than a device's share with the short batch dropped */
    mgt_loader_options_init(&o, ds, &t, 1, 4);
    o.drop_last_batch = true;
    assert_int_equal(mgt_loader_create(&o, &l), MGT_ERR_INVALID);
    assert_true(contains(mgt_error_last(), "fewer than its batch"));
    mgt_dataset_free(ds);
}

/* ---- decoding ---- */

static void load_ok(const char *path, int channels, mgt_image *img)
{
    mgt_status st = mgt_image_load(path, channels, img);
    if (st != MGT_OK)
        fail_msg("%s: %s", path, mgt_error_last());
    assert_int_equal(img->c, channels);
}

static void test_decode_layouts(void **state)
{
    (void)state;
    MGT_TEST_HOLD(d, "%s/layouts", g_root);
    mgt_test_mkdirs(d);
    mgt_image img;
    const uint8_t gray[6] = {0, 50, 100, 150, 200, 255};
    png8(P("%s/gray.png", d), 3, 2, 1, gray);
    load_ok(P("%s/gray.png", d), 1, &img);
    assert_int_equal(img.w, 3);
    assert_int_equal(img.h, 2);
    assert_memory_equal(img.pixels, gray, 6);
    mgt_image_release(&img);
    load_ok(P("%s/gray.png", d), 3, &img);
    for (int i = 0; i < 6; i++)
        for (int c = 0; c < 3; c++)
            assert_int_equal(img.pixels[3 * i + c], gray[i]);
    mgt_image_release(&img);
    mgt_image_release(&img); /* twice is harmless */

    uint8_t ga[12];
    for (int i = 0; i < 6; i++) {
        ga[2 * i] = gray[i];
        ga[2 * i + 1] = (uint8_t)(i * 40);
    }
    png8(P("%s/ga.png", d), 3, 2, 2, ga);
    load_ok(P("%s/ga.png", d), 1, &img);
    assert_memory_equal(img.pixels, gray, 6); /* alpha dropped, not composited */
    mgt_image_release(&img);
    load_ok(P("%s/ga.png", d), 3, &img);
    assert_int_equal(img.pixels[3 * 5 + 1], 255);
    mgt_image_release(&img);

    uint8_t rgb[18], rgba[24];
    for (int i = 0; i < 6; i++) {
        rgb[3 * i] = (uint8_t)(i * 40);
        rgb[3 * i + 1] = (uint8_t)(255 - i * 30);
        rgb[3 * i + 2] = (uint8_t)(i * i * 7);
        memcpy(rgba + 4 * i, rgb + 3 * i, 3);
        rgba[4 * i + 3] = (uint8_t)(i * 50);
    }
    png8(P("%s/rgb.png", d), 3, 2, 3, rgb);
    png8(P("%s/rgba.png", d), 3, 2, 4, rgba);
    load_ok(P("%s/rgb.png", d), 3, &img);
    assert_memory_equal(img.pixels, rgb, 18);
    mgt_image_release(&img);
    load_ok(P("%s/rgba.png", d), 3, &img);
    assert_memory_equal(img.pixels, rgb, 18);
    mgt_image_release(&img);
    load_ok(P("%s/rgba.png", d), 1, &img);
    for (int i = 0; i < 6; i++) {
        unsigned l =
            (rgb[3 * i] * 19595u + rgb[3 * i + 1] * 38470u + rgb[3 * i + 2] * 7471u + 0x8000u) >>
            16;
        assert_int_equal(img.pixels[i], l);
    }
    mgt_image_release(&img);

    /* 16 bits per channel: the high byte */
    uint8_t g16[2 * 6], rgb16[6 * 6];
    for (int i = 0; i < 6; i++) {
        g16[2 * i] = gray[i];
        g16[2 * i + 1] = 0x5a;
        for (int c = 0; c < 3; c++) {
            rgb16[6 * i + 2 * c] = rgb[3 * i + c];
            rgb16[6 * i + 2 * c + 1] = 0xff;
        }
    }
    png_raw(P("%s/gray16.png", d), 3, 2, 16, 0, g16, 6, NULL, 0, true);
    load_ok(P("%s/gray16.png", d), 1, &img);
    assert_memory_equal(img.pixels, gray, 6);
    mgt_image_release(&img);
    png_raw(P("%s/rgb16.png", d), 3, 2, 16, 2, rgb16, 18, NULL, 0, true);
    load_ok(P("%s/rgb16.png", d), 3, &img);
    assert_memory_equal(img.pixels, rgb, 18);
    mgt_image_release(&img);

    /* palette */
    const uint8_t plte[9] = {10, 20, 30, 200, 100, 0, 255, 255, 255};
    const uint8_t idx[6] = {0, 1, 2, 2, 1, 0};
    png_raw(P("%s/pal.png", d), 3, 2, 8, 3, idx, 3, plte, 3, true);
    load_ok(P("%s/pal.png", d), 3, &img);
    for (int i = 0; i < 6; i++)
        assert_memory_equal(img.pixels + 3 * i, plte + 3 * idx[i], 3);
    mgt_image_release(&img);

    /* the other formats ImageFolder accepts */
    assert_true(stbi_write_bmp(P("%s/rgb.bmp", d), 3, 2, 3, rgb));
    assert_true(stbi_write_tga(P("%s/rgb.tga", d), 3, 2, 3, rgb));
    pnm(P("%s/gray.pgm", d), 3, 2, 1, gray);
    pnm(P("%s/rgb.ppm", d), 3, 2, 3, rgb);
    const char *same[] = {"rgb.bmp", "rgb.tga", "rgb.ppm"};
    for (int k = 0; k < 3; k++) {
        load_ok(P("%s/%s", d, same[k]), 3, &img);
        assert_memory_equal(img.pixels, rgb, 18);
        mgt_image_release(&img);
    }
    load_ok(P("%s/gray.pgm", d), 1, &img);
    assert_memory_equal(img.pixels, gray, 6);
    mgt_image_release(&img);

    const uint8_t gpal[6] = {200, 10, 30, 5, 250, 90};
    const uint8_t gidx[6] = {0, 1, 1, 0, 0, 1};
    gif2(P("%s/two.gif", d), 3, 2, gpal, gidx);
    load_ok(P("%s/two.gif", d), 3, &img);
    assert_int_equal(img.w, 3);
    for (int i = 0; i < 6; i++)
        assert_memory_equal(img.pixels + 3 * i, gpal + 3 * gidx[i], 3);
    mgt_image_release(&img);
}

static void expect_decode_error(const char *path, const char *needle)
{
    mgt_image img;
    mgt_status st = mgt_image_load(path, 3, &img);
    if (st == MGT_OK || !contains(mgt_error_last(), path) || !contains(mgt_error_last(), needle))
        fail_msg("load(%s) = %d '%s'; wanted an error naming it with '%s'", path, st,
                 mgt_error_last(), needle);
    assert_null(img.pixels);
}

static void make_bad_files(const char *d_arg)
{
    MGT_TEST_HOLD(d, "%s", d_arg);
    uint8_t junk[300];
    mgt_rng r;
    mgt_rng_init(&r, 3, 0, 0, MGT_RNG_OTHER);
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)mgt_rng_u32(&r);
    mgt_test_write_file(P("%s/junk.png", d), junk, sizeof junk);
    mgt_test_write_file(P("%s/empty.jpg", d), "", 0);
    uint8_t px[64 * 48 * 3];
    noise_rgb(px, 64, 48, 4);
    copy_fixture("photo444.jpg", P("%s/whole.jpg", d));
    size_t n;
    uint8_t *buf = mgt_test_read_file(P("%s/whole.jpg", d), &n);
    mgt_test_write_file(P("%s/truncated.jpg", d), buf, n / 2);
    free(buf);
    buf = mgt_test_read_file(P("%s/%s", GOLDEN_DIR, "progressive.jpg"), &n);
    mgt_test_write_file(P("%s/truncated_progressive.jpg", d), buf, n * 3 / 4);
    free(buf);
    /* a PNG header that announces 20000 x 20000 pixels (and has no data) */
    png_raw(P("%s/huge.png", d), 20000, 20000, 8, 0, NULL, 0, NULL, 0, false);
    /* a PNG whose compressed data is cut */
    png8(P("%s/cut_src.png", d), 64, 48, 3, px);
    buf = mgt_test_read_file(P("%s/cut_src.png", d), &n);
    mgt_test_write_file(P("%s/cut.png", d), buf, n * 2 / 3);
    free(buf);
}

static void test_decode_errors(void **state)
{
    (void)state;
    MGT_TEST_HOLD(d, "%s/badfiles", g_root);
    make_bad_files(d);
    expect_decode_error(P("%s/junk.png", d), "unknown image type");
    expect_decode_error(P("%s/empty.jpg", d), "empty file");
    expect_decode_error(P("%s/truncated.jpg", d), "truncated JPEG");
    expect_decode_error(P("%s/truncated_progressive.jpg", d), "truncated JPEG");
    expect_decode_error(P("%s/huge.png", d), "pixels");
    expect_decode_error(P("%s/cut.png", d), ": ");
    expect_decode_error(P("%s/nonexistent.png", d), "No such file");
    mgt_image img;
    assert_int_equal(mgt_image_load(P("%s/whole.jpg", d), 3, &img), MGT_OK);
    mgt_image_release(&img);
    assert_int_equal(mgt_image_decode("x", 1, "mem", 2, &img), MGT_ERR_INVALID);
    assert_true(contains(mgt_error_last(), "channels"));
}

static int hexval(char c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

static uint8_t *read_hex(FILE *f, size_t n)
{
    uint8_t *b = malloc(n ? n : 1);
    char two[2];
    int c;
    while ((c = fgetc(f)) == '\n') {
    }
    ungetc(c, f);
    for (size_t i = 0; i < n; i++) {
        if (fread(two, 1, 2, f) != 2)
            fail_msg("golden hex ends early");
        b[i] = (uint8_t)(hexval(two[0]) << 4 | hexval(two[1]));
    }
    return b;
}

static FILE *open_golden(const char *name)
{
    FILE *f = fopen(P("%s/%s", GOLDEN_DIR, name), "r");
    if (!f)
        fail_msg("%s/%s: %s (make it with scripts/make_data_goldens.py)", GOLDEN_DIR, name,
                 strerror(errno));
    char line[1024];
    long pos = ftell(f);
    while (fgets(line, sizeof line, f) && line[0] == '#')
        pos = ftell(f);
    fseek(f, pos, SEEK_SET);
    return f;
}

static void test_gray_matches_pil(void **state)
{
    (void)state;
    FILE *f = open_golden("gray.txt");
    int n = 0;
    assert_int_equal(fscanf(f, "%d", &n), 1);
    uint8_t *rgb = read_hex(f, (size_t)n * 3), *want = read_hex(f, (size_t)n);
    fclose(f);
    MGT_TEST_HOLD(path, "%s/layouts/golden_rgb.png", g_root);
    png8(path, n, 1, 3, rgb);
    mgt_image img;
    load_ok(path, 1, &img);
    assert_memory_equal(img.pixels, want, (size_t)n);
    mgt_image_release(&img);
    free(rgb);
    free(want);
}

static void test_jpeg_matches_pil(void **state)
{
    (void)state;
    FILE *f = open_golden("jpeg.txt");
    char name[64];
    int w, h, ch, files = 0;
    while (fscanf(f, "%63s %d %d %d", name, &w, &h, &ch) == 4) {
        uint8_t *want = read_hex(f, (size_t)w * h * ch);
        mgt_image img;
        load_ok(P("%s/%s", GOLDEN_DIR, name), ch, &img);
        assert_int_equal(img.w, w);
        assert_int_equal(img.h, h);
        double sum = 0, worst = 0;
        for (size_t i = 0; i < (size_t)w * h * ch; i++) {
            double e = fabs((double)img.pixels[i] - want[i]);
            sum += e;
            if (e > worst)
                worst = e;
        }
        double mean = sum / ((double)w * h * ch);
        print_message("%s vs PIL: mean difference %.3f, worst %.0f levels\n", name, mean, worst);
        /* the same libjpeg-turbo at PIL's settings (and PIL's CMYK conversion): bit-exact */
        if (worst > 0)
            fail_msg("%s: mgtrain and PIL disagree: mean %.3f worst %.0f", name, mean, worst);
        mgt_image_release(&img);
        free(want);
        files++;
    }
    fclose(f);
    assert_int_equal(files, 5);
}

/* A photo-like w x h RGB image: smooth gradients, a few hard-edged shapes, a little noise. */
static void photo_rgb(uint8_t *px, int w, int h, uint64_t seed)
{
    mgt_rng r;
    mgt_rng_init(&r, seed, 0, 0, MGT_RNG_OTHER);
    double f1 = 7 + mgt_rng_below(&r, 30), f2 = 9 + mgt_rng_below(&r, 30);
    int cx = (int)mgt_rng_below(&r, (uint64_t)w), cy = (int)mgt_rng_below(&r, (uint64_t)h);
    int rad = h / 5 + (int)mgt_rng_below(&r, (uint64_t)h / 4);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint8_t *p = px + ((size_t)y * w + x) * 3;
            double v[3] = {128 + 100 * sin(x / f1), 128 + 100 * cos(y / f2),
                           128 + 90 * sin((x + y) / (f1 + f2))};
            bool in = (x - cx) * (x - cx) + (y - cy) * (y - cy) < rad * rad;
            bool bar = x > w / 3 && x < w / 3 + 12;
            for (int c = 0; c < 3; c++) {
                double q = in ? 40 + 70 * c : bar ? 250 - 100 * c : v[c];
                q += (double)(mgt_rng_u32(&r) % 9) - 4;
                p[c] = (uint8_t)(q < 0 ? 0 : q > 255 ? 255 : q);
            }
        }
}

/* The image as a JPEG written by TurboJPEG (quality 90; subsampling TJSAMP_*). */
static void write_jpeg(const char *path, const uint8_t *px, int w, int h, int c, int samp)
{
    tjhandle tj = tjInitCompress();
    assert_non_null(tj);
    unsigned char *buf = NULL;
    unsigned long len = 0;
    assert_int_equal(tjCompress2(tj, px, w, 0, h, c == 1 ? TJPF_GRAY : TJPF_RGB, &buf, &len,
                                 c == 1 ? TJSAMP_GRAY : samp, 90, 0),
                     0);
    mgt_test_write_file(path, buf, len);
    tjFree(buf);
    tjDestroy(tj);
}

/* Region decodes: at scale 1 a rectangle's pixels equal the whole decode's, bit for bit (the
   column of margin keeps libjpeg's smooth chroma upsampling away from the cut), in every
   layout; at 1/2..1/8 a rectangle equals the whole image decoded at that scale; a gray
   result from a colour file is the luma, close to PIL's L. */
static void test_region_decode(void **state)
{
    (void)state;
    MGT_TEST_HOLD(d, "%s/regions", g_root);
    mgt_test_mkdirs(d);
    uint8_t *px = malloc(320 * 240 * 3);
    photo_rgb(px, 320, 240, 5);
    write_jpeg(P("%s/p420.jpg", d), px, 320, 240, 3, TJSAMP_420);
    write_jpeg(P("%s/p422.jpg", d), px, 320, 240, 3, TJSAMP_422);
    const char *files[] = {P("%s/p420.jpg", d),           P("%s/p422.jpg", d),
                           GOLDEN_DIR "/photo444.jpg",    GOLDEN_DIR "/photo420.jpg",
                           GOLDEN_DIR "/progressive.jpg", GOLDEN_DIR "/gray.jpg",
                           GOLDEN_DIR "/cmyk.jpg"};
    MGT_TEST_HOLD(f0, "%s", files[0]);
    MGT_TEST_HOLD(f1, "%s", files[1]);
    files[0] = f0;
    files[1] = f1;
    mgt_decoder *whole, *part;
    CHECK(mgt_decoder_create(&whole));
    CHECK(mgt_decoder_create(&part));
    mgt_rng r;
    mgt_rng_init(&r, 17, 0, 0, MGT_RNG_OTHER);
    int checked = 0;
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
        size_t len;
        uint8_t *b = mgt_test_read_file(files[f], &len);
        for (int ch = 1; ch <= 3; ch += 2) {
            for (int scale = 1; scale <= 8; scale *= 2) {
                mgt_image_view wv, pv;
                mgt_decode_region all = {scale, 0, 0, 1 << 20, 1 << 20};
                if (scale == 1)
                    CHECK(mgt_decoder_decode(whole, b, len, files[f], ch, NULL, NULL, &wv));
                else
                    CHECK(mgt_decoder_decode(whole, b, len, files[f], ch, NULL, &all, &wv));
                for (int k = 0; k < 4; k++) {
                    int x0 = (int)mgt_rng_below(&r, (uint64_t)wv.full_w);
                    int y0 = (int)mgt_rng_below(&r, (uint64_t)wv.full_h);
                    int x1 = x0 + 1 + (int)mgt_rng_below(&r, (uint64_t)(wv.full_w - x0));
                    int y1 = y0 + 1 + (int)mgt_rng_below(&r, (uint64_t)(wv.full_h - y0));
                    mgt_decode_region reg = {scale, x0, y0, x1, y1};
                    CHECK(mgt_decoder_decode(part, b, len, files[f], ch, NULL, &reg, &pv));
                    assert_true(pv.x0 <= x0 && pv.y0 <= y0 && pv.x0 + pv.w >= x1 &&
                                pv.y0 + pv.h >= y1);
                    assert_int_equal(pv.full_w, wv.full_w);
                    /* gray from colour at scale 1: the luma against PIL's L of the RGB */
                    bool luma = ch == 1 && scale == 1 && !strstr(files[f], "gray");
                    int worst = 0;
                    for (int y = y0; y < y1; y++)
                        for (int x = x0 * ch; x < x1 * ch; x++) {
                            int a = pv.px[(size_t)(y - pv.y0) * pv.stride + (x - pv.x0 * ch)];
                            int e = wv.px[(size_t)y * wv.stride + x];
                            worst = abs(a - e) > worst ? abs(a - e) : worst;
                        }
                    if (worst > (luma ? 8 : 0))
                        fail_msg("%s, %d channel(s), scale 1/%d, rows %d..%d cols %d..%d: %d "
                                 "levels from the whole decode",
                                 files[f], ch, scale, y0, y1, x0, x1, worst);
                    checked++;
                }
            }
        }
        free(b);
    }
    print_message("region decodes: %d rectangles equal to the whole decodes\n", checked);
    const mgt_decoder_stats *st = mgt_decoder_stats_get(part);
    assert_true(st->jpeg_region > 0 && st->jpeg_scaled > 0);
    mgt_decoder_free(whole);
    mgt_decoder_free(part);
    free(px);
}

/* Runs two epochs of t over ds on one decode thread and keeps every image by index; returns
   the loader's buffer growths after the first and after the second epoch in g1, g2. */
static void epoch_images(const mgt_dataset *ds, const mgt_transform *t, float *by_index,
                         uint64_t *g1, uint64_t *g3)
{
    size_t n = mgt_dataset_size(ds), floats = (size_t)t->channels * t->size * t->size;
    mgt_loader_options o;
    mgt_loader_options_init(&o, ds, t, 1, 4);
    o.workers = 1;
    o.shuffle = false;
    o.split = MGT_SPLIT_EXACT;
    o.continuous = false;
    mgt_loader *l = NULL;
    CHECK(mgt_loader_create(&o, &l));
    for (int epoch = 0; epoch < 2; epoch++) {
        CHECK(mgt_loader_set_epoch(l, 0, 0));
        for (size_t b = 0; b < mgt_loader_batches(l, 0); b++) {
            mgt_batch bt;
            CHECK(mgt_loader_next(l, 0, NULL, &bt));
            for (int k = 0; k < bt.n; k++)
                memcpy(by_index + bt.indices_host[k] * floats, bt.images + (size_t)k * floats,
                       floats * sizeof(float));
        }
        if (epoch == 0 && g1)
            *g1 = mgt_loader_buffer_growths(l);
    }
    if (g3)
        *g3 = mgt_loader_buffer_growths(l);
    assert_int_equal(mgt_loader_images_done(l), 2 * n);
    mgt_loader_free(l);
}

/* The fast JPEG path (DCT scale, region) against --exact-decode's (whole image, full scale,
   torchvision's pixels) on photo-sized JPEGs. Stated tolerance: where no DCT scale applies
   (RandomResizedCrop(224) of 320x240 images, whose crops are never twice the output) the two
   are identical; at a DCT scale the mean difference is under 1.5 levels of 255 in every
   image and under 1 over all, single pixels at hard edges up to 80 levels (the scaled IDCT
   is a box filter where torchvision's antialias is a triangle). A steady state makes no
   allocation: no buffer grows after the first epoch. */
static void test_fast_decode_tolerance(void **state)
{
    (void)state;
    MGT_TEST_HOLD(root, "%s/jpegs320", g_root);
    uint8_t *px = malloc(320 * 240 * 3);
    for (int i = 0; i < 8; i++) {
        photo_rgb(px, 320, 240, 100 + (uint64_t)i);
        write_jpeg(P("%s/c%d/%02d.jpg", root, i % 2, i), px, 320, 240, 3, TJSAMP_420);
    }
    free(px);
    mgt_dataset *ds;
    CHECK(mgt_dataset_scan(root, NULL, &ds));
    struct {
        mgt_transform_kind kind;
        int size;
        bool scaled;
    } cases[] = {{MGT_TRANSFORM_RRC, 224, false},
                 {MGT_TRANSFORM_RRC, 64, true},
                 {MGT_TRANSFORM_RESIZE_CROP, 64, true}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        mgt_transform t;
        CHECK(mgt_transform_init(&t, cases[c].kind, cases[c].size, 3));
        size_t floats = (size_t)3 * t.size * t.size;
        float *fast = malloc(8 * floats * sizeof(float)),
              *exact = malloc(8 * floats * sizeof(float));
        uint64_t g1, g3;
        epoch_images(ds, &t, fast, &g1, &g3);
        assert_int_equal(g1, g3);
        t.exact_decode = true;
        epoch_images(ds, &t, exact, NULL, NULL);
        double all = 0, worst_mean = 0, worst = 0;
        for (int i = 0; i < 8; i++) {
            double sum = 0;
            for (size_t k = 0; k < floats; k++) {
                double d = fabs(fast[i * floats + k] - exact[i * floats + k]) * 255 *
                           t.std[k / ((size_t)t.size * t.size)];
                sum += d;
                worst = d > worst ? d : worst;
            }
            worst_mean = sum / floats > worst_mean ? sum / floats : worst_mean;
            all += sum / floats / 8;
        }
        print_message("fast vs exact decode, %s %d: mean %.3f levels, worst image %.3f, worst "
                      "pixel %.1f\n",
                      cases[c].kind == MGT_TRANSFORM_RRC ? "rrc" : "resize-crop", t.size, all,
                      worst_mean, worst);
        if (!cases[c].scaled)
            assert_true(worst == 0);
        else
            assert_true(all > 0 && all < 1.0 && worst_mean < 1.5 && worst < 80);
        free(fast);
        free(exact);
    }
    mgt_dataset_free(ds);
}

/* One decoder for a file that fails and then a good one: TurboJPEG 2.1's handle, reused after
   a failure, read the next header as 0 x 0; the decoder starts a new handle instead. */
static void test_decoder_after_error(void **state)
{
    (void)state;
    size_t n;
    uint8_t *good = mgt_test_read_file(GOLDEN_DIR "/photo420.jpg", &n);
    mgt_decoder *d;
    CHECK(mgt_decoder_create(&d));
    for (int k = 0; k < 3; k++) {
        mgt_image_view v;
        size_t cut = k == 0 ? n / 8 : n / 2; /* before the SOS marker, and in the scan */
        assert_int_equal(mgt_decoder_decode(d, good, cut, "cut.jpg", 3, NULL, NULL, &v),
                         MGT_ERR_INVALID);
        CHECK(mgt_decoder_decode(d, good, n, "good.jpg", 3, NULL, NULL, &v));
        assert_true(v.w == 64 && v.h == 48);
    }
    mgt_decoder_free(d);
    free(good);
}

/* ---- transforms ---- */

static void test_resize_matches_pil(void **state)
{
    (void)state;
    FILE *f = open_golden("resize.txt");
    int c, w, h, bl, bt, bw, bh, ow, oh, cases = 0;
    mgt_transform_scratch scratch = {0};
    double worst = 0;
    while (fscanf(f, "%d %d %d %d %d %d %d %d %d", &c, &w, &h, &bl, &bt, &bw, &bh, &ow, &oh) == 9) {
        uint8_t *px = read_hex(f, (size_t)w * h * c), *want = read_hex(f, (size_t)ow * oh * c);
        mgt_image img = {.pixels = px, .w = w, .h = h, .c = c};
        mgt_crop box = {.top = bt, .left = bl, .h = bh, .w = bw};
        float *out = malloc(sizeof(float) * (size_t)ow * oh * c);
        assert_int_equal(mgt_image_resize(&img, &box, ow, oh, &scratch, out), MGT_OK);
        double case_worst = 0;
        for (int y = 0; y < oh; y++)
            for (int x = 0; x < ow; x++)
                for (int k = 0; k < c; k++) {
                    double ours = out[(size_t)k * ow * oh + (size_t)y * ow + x];
                    double pil = want[((size_t)y * ow + x) * c + k];
                    double e = fabs(ours - pil);
                    if (e > case_worst)
                        case_worst = e;
                }
        /* PIL rounds to 8 bits after each pass; the float result may differ by that much */
        if (case_worst > 1.0 + 1e-3)
            fail_msg("resize case %d (%dx%d box %d,%d %dx%d -> %dx%d): off by %.3f levels", cases,
                     w, h, bl, bt, bw, bh, ow, oh, case_worst);
        if (case_worst > worst)
            worst = case_worst;
        free(px);
        free(want);
        free(out);
        cases++;
    }
    fclose(f);
    assert_int_equal(cases, 11);
    print_message("resize vs PIL: %d cases, worst difference %.3f of 255\n", cases, worst);
    mgt_transform_scratch_free(&scratch);
}

/* --interpolation nearest and bicubic against PIL's crop + resize: nearest exactly; bicubic
   within PIL's 8-bit rounding and clipping between its two passes. */
static void test_resize_interp_matches_pil(void **state)
{
    (void)state;
    FILE *f = open_golden("resize_interp.txt");
    char name[16];
    int c, w, h, bl, bt, bw, bh, ow, oh, cases = 0;
    mgt_transform_scratch scratch = {0};
    double worst[3] = {0};
    while (fscanf(f, "%15s %d %d %d %d %d %d %d %d %d", name, &c, &w, &h, &bl, &bt, &bw, &bh, &ow,
                  &oh) == 10) {
        mgt_interp m;
        CHECK(mgt_interp_parse(name, &m));
        uint8_t *px = read_hex(f, (size_t)w * h * c), *want = read_hex(f, (size_t)ow * oh * c);
        mgt_image img = {.pixels = px, .w = w, .h = h, .c = c};
        mgt_crop box = {.top = bt, .left = bl, .h = bh, .w = bw};
        float *out = malloc(sizeof(float) * (size_t)ow * oh * c);
        CHECK(mgt_image_resize_with(&img, &box, ow, oh, m, &scratch, out));
        double cw = 0;
        for (int y = 0; y < oh; y++)
            for (int x = 0; x < ow; x++)
                for (int k = 0; k < c; k++) {
                    double ours = out[(size_t)k * ow * oh + (size_t)y * ow + x];
                    double e = fabs(fmin(255, fmax(0, ours)) - want[((size_t)y * ow + x) * c + k]);
                    cw = e > cw ? e : cw;
                }
        if (cw > (m == MGT_INTERP_NEAREST ? 0 : 1.0 + 1e-3))
            fail_msg("%s case %d (%dx%d box %d,%d %dx%d -> %dx%d): off by %.3f levels", name, cases,
                     w, h, bl, bt, bw, bh, ow, oh, cw);
        worst[m] = cw > worst[m] ? cw : worst[m];
        free(px);
        free(want);
        free(out);
        cases++;
    }
    fclose(f);
    assert_int_equal(cases, 16);
    print_message("nearest and bicubic vs PIL: %d cases, worst %.3f and %.3f of 255\n", cases,
                  worst[MGT_INTERP_NEAREST], worst[MGT_INTERP_BICUBIC]);
    mgt_transform_scratch_free(&scratch);
}

static void test_resize_by_hand(void **state)
{
    (void)state;
    /* PIL's bilinear, worked out on paper: 2 -> 4 uses weights (1,0) (.75,.25) (.25,.75)
       (0,1); 4 -> 2 (antialias, support 2) uses (3,3,1,0)/7 and (0,1,3,3)/7 */
    const uint8_t px2[4] = {0, 100, 200, 40};
    mgt_image img = {.pixels = (uint8_t *)px2, .w = 2, .h = 2, .c = 1};
    float out[16];
    assert_int_equal(mgt_image_resize(&img, NULL, 4, 4, NULL, out), MGT_OK);
    const double up[4][2] = {{1, 0}, {.75, .25}, {.25, .75}, {0, 1}};
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 4; x++) {
            double v = 0;
            for (int sy = 0; sy < 2; sy++)
                for (int sx = 0; sx < 2; sx++)
                    v += up[y][sy] * up[x][sx] * px2[sy * 2 + sx];
            assert_float_equal(out[y * 4 + x], v, 1e-3);
        }
    uint8_t px4[16];
    for (int i = 0; i < 16; i++)
        px4[i] = (uint8_t)(i * 15 + (i % 3) * 7);
    img = (mgt_image){.pixels = px4, .w = 4, .h = 4, .c = 1};
    assert_int_equal(mgt_image_resize(&img, NULL, 2, 2, NULL, out), MGT_OK);
    const double down[2][4] = {{3 / 7., 3 / 7., 1 / 7., 0}, {0, 1 / 7., 3 / 7., 3 / 7.}};
    for (int y = 0; y < 2; y++)
        for (int x = 0; x < 2; x++) {
            double v = 0;
            for (int sy = 0; sy < 4; sy++)
                for (int sx = 0; sx < 4; sx++)
                    v += down[y][sy] * down[x][sx] * px4[sy * 4 + sx];
            assert_float_equal(out[y * 2 + x], v, 1e-3);
        }
    mgt_crop bad = {.top = 3, .left = 0, .h = 2, .w = 2};
    assert_int_equal(mgt_image_resize(&img, &bad, 2, 2, NULL, out), MGT_ERR_INVALID);
}

static void test_resize_and_center_crop_sizes(void **state)
{
    (void)state;
    int w, h;
    mgt_transform_resize_size(500, 375, 256, &w, &h); /* int(256 * 500 / 375) = 341 */
    assert_int_equal(w, 341);
    assert_int_equal(h, 256);
    mgt_transform_resize_size(375, 500, 256, &w, &h);
    assert_int_equal(w, 256);
    assert_int_equal(h, 341);
    mgt_transform_resize_size(300, 300, 256, &w, &h);
    assert_int_equal(w, 256);
    assert_int_equal(h, 256);
    mgt_transform_resize_size(10, 7, 0, &w, &h);
    assert_int_equal(w, 10);
    mgt_crop c;
    mgt_transform_center_crop(341, 256, 224, &c); /* round(58.5) = 58: half to even */
    assert_int_equal(c.left, 58);
    assert_int_equal(c.top, 16);
    mgt_transform_center_crop(343, 256, 224, &c); /* round(59.5) = 60 */
    assert_int_equal(c.left, 60);
    mgt_transform_center_crop(20, 30, 28, &c); /* narrower than the crop: padded */
    assert_int_equal(c.left, -4);
    assert_int_equal(c.top, 1);
    mgt_transform_center_crop(21, 28, 28, &c); /* pad (28-21)//2 = 3 on the left */
    assert_int_equal(c.left, -3);
    assert_int_equal(c.top, 0);
}

static void test_rrc_params_golden(void **state)
{
    (void)state;
    FILE *f = open_golden("rrc.txt");
    int w, h, nd, cases = 0, fallbacks = 0;
    double smin, smax, rmin, rmax;
    while (fscanf(f, "%d %d %lf %lf %lf %lf %d", &w, &h, &smin, &smax, &rmin, &rmax, &nd) == 7) {
        mgt_test_replay r = {.n = nd};
        assert_true(nd <= 64);
        for (int i = 0; i < nd; i++) {
            char k[4];
            assert_int_equal(fscanf(f, "%3s %lf %lf %lf", k, &r.lo[i], &r.hi[i], &r.v[i]), 4);
            r.kind[i] = k[0];
        }
        int top, left, ch, cw, tries;
        assert_int_equal(fscanf(f, "%d %d %d %d %d", &top, &left, &ch, &cw, &tries), 5);
        mgt_draws d = {mgt_test_replay_uniform, mgt_test_replay_randint, &r};
        mgt_crop c;
        int got = mgt_transform_rrc_params(&d, w, h, smin, smax, rmin, rmax, &c);
        if (r.bad || r.pos != r.n || got != tries || c.top != top || c.left != left || c.h != ch ||
            c.w != cw)
            fail_msg(
                "rrc case %d (%dx%d): got %d,%d %dx%d tries %d (draws %d of %d%s); golden %d,%d "
                "%dx%d tries %d",
                cases, w, h, c.top, c.left, c.h, c.w, got, r.pos, r.n, r.bad ? ", mismatch" : "",
                top, left, ch, cw, tries);
        fallbacks += tries == 0;
        cases++;
    }
    fclose(f);
    assert_true(cases > 100);
    assert_true(fallbacks >= 5); /* the fallback branch is covered */
}

static double const_uniform(void *ctx, double lo, double hi)
{
    (void)ctx;
    (void)lo;
    return hi; /* the largest area and the widest ratio: never fits a 1000 x 10 image */
}

static int64_t const_randint(void *ctx, int64_t lo, int64_t hi)
{
    (void)ctx;
    (void)hi;
    return lo;
}

static void test_rrc_fallback(void **state)
{
    (void)state;
    mgt_draws d = {const_uniform, const_randint, NULL};
    mgt_crop c;
    assert_int_equal(mgt_transform_rrc_params(&d, 1000, 10, 0.08, 1, 0.75, 4 / 3.0, &c), 0);
    /* in_ratio 100 > 4/3: h = 10, w = round(10 * 4/3) = 13, centred */
    assert_int_equal(c.h, 10);
    assert_int_equal(c.w, 13);
    assert_int_equal(c.top, 0);
    assert_int_equal(c.left, 493);
    assert_int_equal(mgt_transform_rrc_params(&d, 10, 1000, 0.08, 1, 0.75, 4 / 3.0, &c), 0);
    assert_int_equal(c.w, 10);
    assert_int_equal(c.h, 13);
    assert_int_equal(c.top, 493);
}

static void fill_pattern(uint8_t *px, int w, int h, int c)
{
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int k = 0; k < c; k++)
                px[((size_t)y * w + x) * c + k] = (uint8_t)(1 + 10 * y + x + 100 * k);
}

static void test_pad_crop_geometry(void **state)
{
    (void)state;
    uint8_t px[4 * 4 * 3];
    fill_pattern(px, 4, 4, 3);
    mgt_image img = {.pixels = px, .w = 4, .h = 4, .c = 3};
    mgt_transform t;
    assert_int_equal(mgt_transform_init(&t, MGT_TRANSFORM_PAD_CROP, 4, 3), MGT_OK);
    t.padding = 2;
    for (int c = 0; c < 3; c++) {
        t.mean[c] = 0;
        t.std[c] = 1.0f / 255.0f; /* outputs in pixel units */
    }
    int flips = 0, shifted = 0;
    for (uint64_t idx = 0; idx < 40; idx++) {
        float out[3 * 16];
        mgt_rng rng, again;
        mgt_rng_init(&rng, 7, 1, idx, MGT_RNG_AUGMENT);
        again = rng;
        assert_int_equal(mgt_transform_apply(&t, &img, &rng, NULL, out), MGT_OK);
        /* RandomCrop.get_params on the padded 8x8: i, j = randint(0, 5); then the flip */
        int i = (int)mgt_rng_range(&again, 0, 5), j = (int)mgt_rng_range(&again, 0, 5);
        bool flip = mgt_rng_uniform(&again) < 0.5f;
        flips += flip;
        shifted += i != 2 || j != 2;
        for (int k = 0; k < 3; k++)
            for (int y = 0; y < 4; y++)
                for (int x = 0; x < 4; x++) {
                    int sx = (flip ? 3 - x : x) + j - 2, sy = y + i - 2;
                    float want =
                        sx < 0 || sy < 0 || sx >= 4 || sy >= 4 ? 0.0f : px[(sy * 4 + sx) * 3 + k];
                    assert_float_equal(out[k * 16 + y * 4 + x], want, 1e-3);
                }
    }
    assert_true(flips > 5 && flips < 35);
    assert_true(shifted > 20);
}

static void test_transform_outputs(void **state)
{
    (void)state;
    /* identity: RESIZE_CROP without a resize on an image of the output size */
    uint8_t px[5 * 5 * 3];
    fill_pattern(px, 5, 5, 3);
    mgt_image img = {.pixels = px, .w = 5, .h = 5, .c = 3};
    mgt_transform t;
    assert_int_equal(mgt_transform_init(&t, MGT_TRANSFORM_RESIZE_CROP, 5, 3), MGT_OK);
    t.resize = 0;
    float out[3 * 25];
    assert_int_equal(mgt_transform_apply(&t, &img, NULL, NULL, out), MGT_OK);
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 25; i++)
            assert_float_equal(out[k * 25 + i], (px[i * 3 + k] / 255.0f - t.mean[k]) / t.std[k],
                               1e-5);

    /* RandomResizedCrop(32) of a photo-sized image: shape, range, determinism by key */
    int W = 120, H = 90;
    uint8_t *big = malloc((size_t)W * H * 3);
    noise_rgb(big, W, H, 11);
    img = (mgt_image){.pixels = big, .w = W, .h = H, .c = 3};
    assert_int_equal(mgt_transform_init(&t, MGT_TRANSFORM_RRC, 32, 3), MGT_OK);
    float *a = malloc(sizeof(float) * 3 * 32 * 32), *b = malloc(sizeof(float) * 3 * 32 * 32);
    mgt_transform_scratch s = {0};
    int differ = 0;
    for (uint64_t idx = 0; idx < 20; idx++) {
        mgt_rng r1, r2;
        mgt_rng_init(&r1, 3, 0, idx, MGT_RNG_AUGMENT);
        mgt_rng_init(&r2, 3, 0, idx, MGT_RNG_AUGMENT);
        assert_int_equal(mgt_transform_apply(&t, &img, &r1, &s, a), MGT_OK);
        assert_int_equal(mgt_transform_apply(&t, &img, &r2, NULL, b), MGT_OK);
        assert_memory_equal(a, b, sizeof(float) * 3 * 32 * 32);
        for (int k = 0; k < 3; k++) {
            float lo = (0 - t.mean[k]) / t.std[k] - 1e-4f, hi = (1 - t.mean[k]) / t.std[k] + 1e-4f;
            for (int i = 0; i < 32 * 32; i++) {
                float v = a[k * 1024 + i];
                assert_true(v >= lo && v <= hi);
            }
        }
        mgt_rng_init(&r2, 3, 1, idx, MGT_RNG_AUGMENT); /* another epoch */
        assert_int_equal(mgt_transform_apply(&t, &img, &r2, &s, b), MGT_OK);
        differ += memcmp(a, b, sizeof(float) * 3 * 32 * 32) != 0;
    }
    assert_true(differ >= 18);

    /* Resize(36) + CenterCrop(32), gray */
    uint8_t *g = malloc((size_t)W * H);
    for (int i = 0; i < W * H; i++)
        g[i] = big[3 * i];
    img = (mgt_image){.pixels = g, .w = W, .h = H, .c = 1};
    assert_int_equal(mgt_transform_init(&t, MGT_TRANSFORM_RESIZE_CROP, 32, 1), MGT_OK);
    assert_int_equal(t.resize, 36);
    assert_int_equal(mgt_transform_apply(&t, &img, NULL, &s, a), MGT_OK);
    /* the same as resizing to 48x36 and cutting the middle */
    float *full = malloc(sizeof(float) * 48 * 36);
    assert_int_equal(mgt_image_resize(&img, NULL, 48, 36, &s, full), MGT_OK);
    mgt_crop cc;
    mgt_transform_center_crop(48, 36, 32, &cc);
    for (int y = 0; y < 32; y++)
        for (int x = 0; x < 32; x++)
            assert_float_equal(
                a[y * 32 + x],
                (full[(y + cc.top) * 48 + x + cc.left] / 255.0f - t.mean[0]) / t.std[0], 1e-4);

    /* refusals */
    mgt_rng r;
    mgt_rng_init(&r, 0, 0, 0, MGT_RNG_AUGMENT);
    assert_int_equal(mgt_transform_init(&t, MGT_TRANSFORM_RRC, 32, 3), MGT_OK);
    assert_int_equal(mgt_transform_apply(&t, &img, &r, &s, a),
                     MGT_ERR_INVALID); /* 1 vs 3 channels */
    assert_int_equal(mgt_transform_init(&t, MGT_TRANSFORM_RRC, 32, 1), MGT_OK);
    assert_int_equal(mgt_transform_apply(&t, &img, NULL, &s, a), MGT_ERR_INVALID); /* no rng */
    t.std[0] = 0;
    assert_int_equal(mgt_transform_check(&t), MGT_ERR_INVALID);
    assert_true(contains(mgt_error_last(), "std"));
    assert_int_equal(mgt_transform_init(&t, MGT_TRANSFORM_RRC, 0, 3), MGT_ERR_INVALID);
    assert_int_equal(mgt_transform_init(&t, MGT_TRANSFORM_RRC, 8, 2), MGT_ERR_INVALID);
    mgt_transform_scratch_free(&s);
    free(big);
    free(g);
    free(a);
    free(b);
    free(full);
}

/* ---- sampler ---- */

static void test_sampler_golden(void **state)
{
    (void)state;
    FILE *f = open_golden("sampler.txt");
    int n, reps, drop, rank, count, lines = 0;
    size_t *order = malloc(sizeof(size_t) * 200);
    while (fscanf(f, "%d %d %d %d %d", &n, &reps, &drop, &rank, &count) == 5) {
        mgt_sampler s;
        assert_int_equal(
            mgt_sampler_init(&s, (size_t)n, reps, drop ? MGT_SPLIT_DROP : MGT_SPLIT_PAD, false, 0),
            MGT_OK);
        mgt_sampler_order(&s, 0, order);
        assert_int_equal(mgt_sampler_count(&s, rank), count);
        for (int p = 0; p < count; p++) {
            int want;
            assert_int_equal(fscanf(f, "%d", &want), 1);
            if (mgt_sampler_pick(&s, order, rank, (size_t)p) != (size_t)want)
                fail_msg("sampler n=%d replicas=%d drop_last=%d rank=%d: position %d is %zu, "
                         "DistributedSampler says %d",
                         n, reps, drop, rank, p, mgt_sampler_pick(&s, order, rank, (size_t)p),
                         want);
        }
        lines++;
    }
    fclose(f);
    free(order);
    assert_true(lines > 600);
}

static void test_sampler_properties(void **state)
{
    (void)state;
    static const size_t sizes[] = {8, 9, 13, 17, 31, 100, 101, 257};
    size_t *order = malloc(sizeof(size_t) * 300), *prev = malloc(sizeof(size_t) * 300);
    int *seen = malloc(sizeof(int) * 300);
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
        for (int N = 1; N <= 8; N++)
            for (int mode = 0; mode < 3; mode++) {
                size_t n = sizes[si];
                mgt_sampler s;
                assert_int_equal(mgt_sampler_init(&s, n, N, (mgt_split_mode)mode, mode != 2, 1234),
                                 MGT_OK);
                for (int64_t epoch = 0; epoch < 3; epoch++) {
                    mgt_sampler_order(&s, epoch, order);
                    memset(seen, 0, sizeof(int) * n);
                    size_t total = 0;
                    for (int r = 0; r < N; r++) {
                        size_t c = mgt_sampler_count(&s, r);
                        if (mode == MGT_SPLIT_PAD)
                            assert_int_equal(c, (n + N - 1) / N);
                        if (mode == MGT_SPLIT_DROP)
                            assert_int_equal(c, n / N);
                        if (mode == MGT_SPLIT_EXACT)
                            assert_true(c == n / N || c == n / N + 1);
                        for (size_t p = 0; p < c; p++)
                            seen[mgt_sampler_pick(&s, order, r, p)]++;
                        total += c;
                    }
                    size_t distinct = 0, dups = 0;
                    for (size_t i = 0; i < n; i++) {
                        distinct += seen[i] > 0;
                        dups += seen[i] > 1 ? (size_t)seen[i] - 1 : 0;
                    }
                    if (mode == MGT_SPLIT_PAD) { /* all of it, plus the padding's repeats */
                        assert_int_equal(distinct, n);
                        assert_int_equal(dups, total - n);
                        assert_true(total - n < (size_t)N);
                    } else if (mode == MGT_SPLIT_DROP) { /* disjoint; the tail dropped */
                        assert_int_equal(dups, 0);
                        assert_int_equal(distinct, total);
                        assert_true(n - total < (size_t)N);
                    } else { /* every sample exactly once */
                        assert_int_equal(total, n);
                        assert_int_equal(distinct, n);
                    }
                    if (mode != 2 && epoch > 0) /* a new order each epoch */
                        assert_true(memcmp(order, prev, sizeof(size_t) * n) != 0);
                    memcpy(prev, order, sizeof(size_t) * n);
                }
            }
    mgt_sampler s;
    assert_int_equal(mgt_sampler_init(&s, 3, 4, MGT_SPLIT_PAD, true, 0), MGT_ERR_INVALID);
    assert_true(contains(mgt_error_last(), "3 samples for 4 devices"));
    assert_int_equal(mgt_sampler_init(&s, 3, 0, MGT_SPLIT_PAD, true, 0), MGT_ERR_INVALID);
    free(order);
    free(prev);
    free(seen);
}

/* torchvision's references' RASampler (a transcription: tests/data/pipeline/ra_sampler.txt,
   scripts/make_data_goldens.py) position by position, unshuffled. */
static void test_ra_sampler_golden(void **state)
{
    (void)state;
    FILE *f = open_golden("ra_sampler.txt");
    int n, replicas, reps, rank, count, lines = 0;
    while (fscanf(f, "%d %d %d %d %d", &n, &replicas, &reps, &rank, &count) == 5) {
        mgt_sampler s;
        assert_int_equal(mgt_sampler_init_ra(&s, (size_t)n, replicas, reps, false, 0), MGT_OK);
        assert_int_equal(mgt_sampler_count(&s, rank), count);
        for (int p = 0; p < count; p++) {
            int want;
            assert_int_equal(fscanf(f, "%d", &want), 1);
            size_t got = mgt_sampler_pick(&s, NULL, rank, (size_t)p);
            if (got != (size_t)want)
                fail_msg("RA sampler n=%d replicas=%d reps=%d rank=%d: position %d is %zu, "
                         "RASampler's %d",
                         n, replicas, reps, rank, p, got, want);
        }
        lines++;
    }
    fclose(f);
    assert_int_equal(lines, 126);
    mgt_sampler s; /* fewer than 256 images: RASampler yields nothing */
    assert_int_equal(mgt_sampler_init_ra(&s, 255, 2, 3, true, 0), MGT_ERR_INVALID);
    assert_true(contains(mgt_error_last(), "n // 256 * 256"));
    assert_int_equal(mgt_sampler_init_ra(&s, 300, 2, 0, true, 0), MGT_ERR_INVALID);
}

/* RA with shuffling, as the trainer uses it: each epoch every image of the first n // 256 *
   256 places comes reps times in a row of the order, so its copies land on reps different
   devices (reps <= devices) with different places (their augmentation keys); and the global
   batches (places k*B .. (k+1)*B - 1) are the same on 1, 2 and 4 devices. */
static void test_ra_sampler_properties(void **state)
{
    (void)state;
    const size_t n = 600;
    const int reps = 3, B = 8;
    size_t *order = malloc(n * sizeof *order);
    size_t *place1 = malloc(n * 3 * sizeof *place1);
    assert_non_null(order);
    assert_non_null(place1);
    for (int N = 1; N <= 4; N *= 2) {
        mgt_sampler s;
        assert_int_equal(mgt_sampler_init_ra(&s, n, N, reps, true, 77), MGT_OK);
        assert_int_equal(mgt_sampler_count(&s, 0), 512 / (size_t)N);
        mgt_sampler_order(&s, 2, order);
        /* the epoch's places in global order: step k, device r, image i is place k*B + r + i*N
           of the padded list, which every device count must agree on */
        size_t steps = mgt_sampler_count(&s, 0) / (size_t)(B / N);
        for (size_t k = 0; k < steps; k++)
            for (int r = 0; r < N; r++)
                for (int i = 0; i < B / N; i++) {
                    size_t p = k * (size_t)(B / N) + (size_t)i;
                    size_t g = k * (size_t)B + (size_t)r + (size_t)i * (size_t)N;
                    size_t place = mgt_sampler_place(&s, r, p);
                    assert_int_equal(place, g % (n * (size_t)reps));
                    assert_int_equal(mgt_sampler_pick(&s, order, r, p), order[place / reps]);
                    if (N == 1)
                        place1[g] = place;
                    else
                        assert_int_equal(place1[g], place);
                }
        /* the copies of order[j] sit at places 3j, 3j + 1, 3j + 2: devices (3j + c) % N */
        if (N >= reps) {
            for (size_t j = 0; j < 512 / (size_t)reps; j++) {
                int dev[3];
                for (int c = 0; c < reps; c++)
                    dev[c] = (int)((j * (size_t)reps + (size_t)c) % (size_t)N);
                assert_true(dev[0] != dev[1] && dev[1] != dev[2] && dev[0] != dev[2]);
            }
        }
    }
    free(order);
    free(place1);
}

/* ---- loader ---- */

/* n gray 6x6 PNGs in 3 classes, pixel value = 1 + index, so a batch shows which files it
   holds; with the transform below the output is that value exactly. */
static mgt_dataset *tagged_dataset(const char *name, int n)
{
    MGT_TEST_HOLD(root, "%s/%s", g_root, name);
    for (int i = 0; i < n; i++)
        tagged_png(P("%s/c%d/%03d.png", root, i % 3, i), 6, 6, (uint8_t)(1 + i));
    mgt_dataset *ds = NULL;
    assert_int_equal(mgt_dataset_scan(root, NULL, &ds), MGT_OK);
    assert_int_equal(mgt_dataset_size(ds), n);
    return ds;
}

/* the tag of dataset index i (the scan orders by class, then name) */
static int tag_of(const mgt_dataset *ds, size_t i)
{
    int v = 0;
    sscanf(strchr(mgt_dataset_relpath(ds, i), '/') + 1, "%d", &v);
    return v + 1;
}

static void plain_transform(mgt_transform *t, int size)
{
    assert_int_equal(mgt_transform_init(t, MGT_TRANSFORM_PAD_CROP, size, 1), MGT_OK);
    t->padding = 0;
    t->hflip = false;
    t->mean[0] = 0;
    t->std[0] = 1.0f / 255.0f;
}

static void test_loader_exact_once(void **state)
{
    (void)state;
    mgt_dataset *ds = tagged_dataset("tagged37", 37);
    mgt_transform t;
    plain_transform(&t, 6);
    for (int N = 1; N <= 4; N++)
        for (int workers = 0; workers <= 3; workers += 3) {
            mgt_loader_options o;
            mgt_loader_options_init(&o, ds, &t, N, 4);
            o.workers = workers;
            o.split = MGT_SPLIT_EXACT;
            o.shuffle = false;
            o.continuous = false;
            mgt_loader *l = NULL;
            assert_int_equal(mgt_loader_create(&o, &l), MGT_OK);
            int seen[37];
            for (int epoch = 0; epoch < 2; epoch++) {
                memset(seen, 0, sizeof seen);
                assert_int_equal(mgt_loader_set_epoch(l, epoch, 0), MGT_OK);
                for (int r = 0; r < N; r++) {
                    size_t nb = mgt_loader_batches(l, r);
                    for (size_t b = 0; b < nb; b++) {
                        mgt_batch bt;
                        assert_int_equal(mgt_loader_next(l, r, NULL, &bt), MGT_OK);
                        assert_int_equal(bt.index, b);
                        assert_int_equal(bt.epoch, epoch);
                        for (int k = 0; k < bt.n; k++) {
                            size_t idx = bt.indices_host[k];
                            seen[idx]++;
                            assert_int_equal(bt.labels_host[k], mgt_dataset_label(ds, idx));
                            assert_int_equal(bt.labels[k], bt.labels_host[k]);
                            for (int p = 0; p < 36; p++)
                                assert_float_equal(bt.images[k * 36 + p], tag_of(ds, idx), 1e-3);
                        }
                    }
                    mgt_batch extra;
                    assert_int_equal(mgt_loader_next(l, r, NULL, &extra), MGT_ERR_INVALID);
                }
                for (int i = 0; i < 37; i++)
                    assert_int_equal(seen[i], 1);
            }
            long calls = 0;
            assert_true(mgt_loader_wait_total(l, 0, &calls) >= 0);
            assert_true(calls > 0);
            assert_int_equal(mgt_loader_bad_count(l), 0);
            mgt_loader_free(l);
        }
    mgt_dataset_free(ds);
}

/* --ra-sampler in the loader: on 3 devices with 3 repetitions an epoch holds the first 85
   images of its order three times each, once per device, and each copy is augmented apart
   (its own random crop: RASampler's point); the same order on one device at the same global
   batch gives every copy the same pixels. */
static void test_loader_ra(void **state)
{
    (void)state;
    const int n = 260, reps = 3, batch = 5;
    /* 16x16 gray images with a pattern, so that crops and flips show */
    MGT_TEST_HOLD(root, "%s/%s", g_root, "ra260");
    uint8_t px[256];
    for (int i = 0; i < n; i++) {
        for (int p = 0; p < 256; p++)
            px[p] = (uint8_t)((p * 7 + (p / 16) * 31 + i) & 255);
        png8(P("%s/c%d/%03d.png", root, i % 3, i), 16, 16, 1, px);
    }
    mgt_dataset *ds = NULL;
    assert_int_equal(mgt_dataset_scan(root, NULL, &ds), MGT_OK);
    mgt_transform t;
    assert_int_equal(mgt_transform_init(&t, MGT_TRANSFORM_RRC, 8, 1), MGT_OK);
    const size_t floats = 64;
    float *first = calloc((size_t)n * reps * floats, sizeof *first);
    int *count = calloc((size_t)n, sizeof *count), *dev = calloc((size_t)n * reps, sizeof *dev);
    assert_non_null(first);
    assert_non_null(count);
    assert_non_null(dev);
    for (int N = 3; N >= 1; N -= 2) {
        mgt_loader_options o;
        mgt_loader_options_init(&o, ds, &t, N, batch);
        o.workers = 2;
        o.seed = 5;
        o.split = MGT_SPLIT_RA;
        o.ra_reps = reps;
        mgt_loader *l = NULL;
        assert_int_equal(mgt_loader_create(&o, &l), MGT_OK);
        assert_int_equal(mgt_loader_sampler(l)->num_samples, (size_t)(256 / N));
        assert_int_equal(mgt_loader_set_epoch(l, 1, 0), MGT_OK);
        size_t nb = mgt_loader_batches(l, 0);
        int seen = 0;
        memset(count, 0, (size_t)n * sizeof *count);
        for (size_t b = 0; b < nb; b++)
            for (int r = 0; r < N; r++) {
                mgt_batch bt;
                assert_int_equal(mgt_loader_next(l, r, NULL, &bt), MGT_OK);
                for (int k = 0; k < bt.n; k++, seen++) {
                    size_t idx = bt.indices_host[k];
                    int c = count[idx]++;
                    assert_true(c < reps);
                    float *slot = first + (idx * reps + (size_t)c) * floats;
                    const float *img = bt.images + (size_t)k * floats;
                    if (N == 3) {
                        memcpy(slot, img, floats * sizeof *slot);
                        dev[idx * reps + (size_t)c] = r;
                    } else if (seen < 255) { /* the places the 3-device epoch had */
                        assert_memory_equal(slot, img, floats * sizeof *slot);
                    }
                }
            }
        if (N == 3) {
            int full = 0, apart = 0;
            for (int i = 0; i < n; i++) {
                if (count[i] == 0)
                    continue;
                assert_int_equal(count[i], reps);
                full++;
                const float *a = first + (size_t)i * reps * floats;
                int *d = dev + (size_t)i * reps;
                assert_true(d[0] != d[1] && d[1] != d[2] && d[0] != d[2]);
                apart += memcmp(a, a + floats, floats * sizeof *a) != 0 &&
                         memcmp(a + floats, a + 2 * floats, floats * sizeof *a) != 0;
            }
            assert_int_equal(full, 85);
            assert_true(apart > 80); /* two random crops of a 6x6 image can coincide */
        }
        mgt_loader_free(l);
    }
    free(first);
    free(count);
    free(dev);
    mgt_dataset_free(ds);
}

/* Collects every image of one training epoch by dataset index. */
static void collect_epoch(const mgt_dataset *ds, int N, int workers, int batch, int64_t epoch,
                          float *by_index, int *count, size_t floats)
{
    mgt_transform t;
    assert_int_equal(mgt_transform_init(&t, MGT_TRANSFORM_RRC, 8, 1), MGT_OK);
    mgt_loader_options o;
    mgt_loader_options_init(&o, ds, &t, N, batch);
    o.workers = workers;
    o.seed = 99;
    o.prefetch = 1 + workers % 3;
    mgt_loader *l = NULL;
    assert_int_equal(mgt_loader_create(&o, &l), MGT_OK);
    assert_int_equal(mgt_loader_set_epoch(l, epoch, 0), MGT_OK);
    size_t nb = mgt_loader_batches(l, 0);
    for (size_t b = 0; b < nb; b++)
        for (int r = 0; r < N; r++) { /* lock-step, as devices */
            mgt_batch bt;
            assert_int_equal(mgt_loader_next(l, r, NULL, &bt), MGT_OK);
            for (int k = 0; k < bt.n; k++) {
                size_t idx = bt.indices_host[k];
                if (count[idx] == 0)
                    memcpy(by_index + idx * floats, bt.images + (size_t)k * floats,
                           floats * sizeof(float));
                else
                    assert_memory_equal(by_index + idx * floats, bt.images + (size_t)k * floats,
                                        floats * sizeof(float));
                count[idx]++;
            }
        }
    mgt_loader_free(l);
}

/* Mixup and cutmix in the loader: a sample's partner is the sample one place before it in
   the epoch's order, its label the partner's and its weight the lambda the image was mixed
   with; and all of it is the same whether 1, 2 or 3 devices share the epoch. */
static void test_loader_mix_device_count(void **state)
{
    (void)state;
    mgt_dataset *ds = tagged_dataset("tagged31mix", 31);
    size_t n = 31;
    mgt_transform t;
    plain_transform(&t, 6);
    float img[3][31][36], wts[3][31];
    int32_t lab_b[3][31];
    size_t order[31];
    for (int N = 1; N <= 3; N++) {
        mgt_loader_options o;
        mgt_loader_options_init(&o, ds, &t, N, 4);
        o.workers = 2;
        o.seed = 5;
        o.continuous = false;
        o.mix = (mgt_mix){.mixup_alpha = 0.4f, .cutmix_alpha = 1.0f};
        mgt_loader *l;
        CHECK(mgt_loader_create(&o, &l));
        CHECK(mgt_loader_set_epoch(l, 1, 0));
        mgt_sampler_order(mgt_loader_sampler(l), 1, order);
        bool seen[31] = {false};
        for (size_t b = 0; b < mgt_loader_batches(l, 0); b++)
            for (int r = 0; r < N; r++) {
                mgt_batch bt;
                CHECK(mgt_loader_next(l, r, NULL, &bt));
                assert_true(bt.mixed);
                for (int k = 0; k < bt.n; k++) {
                    size_t i = bt.indices_host[k];
                    if (seen[i]) { /* a padded repeat: mixed as its first appearance */
                        assert_memory_equal(img[N - 1][i], bt.images + (size_t)k * 36,
                                            sizeof img[0][0]);
                        continue;
                    }
                    seen[i] = true;
                    memcpy(img[N - 1][i], bt.images + (size_t)k * 36, sizeof img[0][0]);
                    wts[N - 1][i] = bt.weights_host[k];
                    lab_b[N - 1][i] = bt.labels_b_host[k];
                    assert_int_equal(bt.labels_host[k], mgt_dataset_label(ds, i));
                }
            }
        for (size_t i = 0; i < n; i++)
            assert_true(seen[i]);
        mgt_loader_free(l);
    }
    int cutmixed = 0;
    for (size_t k = 0; k < n; k++) {
        size_t i = order[k], p = order[(k + n - 1) % n];
        assert_int_equal(lab_b[0][i], mgt_dataset_label(ds, p));
        float w = wts[0][i], a = (float)tag_of(ds, i), b = (float)tag_of(ds, p);
        int own = 0;
        bool cut = false;
        for (int q = 0; q < 36; q++) {
            float v = img[0][i][q];
            if (fabsf(v - a) < 1e-4f)
                own++;
            else if (fabsf(v - b) < 1e-4f)
                cut = true;
            else
                assert_float_equal(v, w * a + (1 - w) * b, 1e-3);
        }
        if (cut) { /* cutmix: the weight is the share of the sample's own pixels */
            cutmixed++;
            assert_float_equal(w, own / 36.0f, 1e-6);
        }
        for (int N = 2; N <= 3; N++) {
            assert_memory_equal(img[N - 1][i], img[0][i], sizeof img[0][0]);
            assert_true(wts[N - 1][i] == w && lab_b[N - 1][i] == lab_b[0][i]);
        }
    }
    assert_true(cutmixed > 3 && cutmixed < 28);
    mgt_dataset_free(ds);
}

static void test_loader_determinism(void **state)
{
    (void)state;
    MGT_TEST_HOLD(root, "%s/photos", g_root);
    uint8_t px[40 * 30 * 3];
    for (int i = 0; i < 23; i++) {
        noise_rgb(px, 40, 30, (uint64_t)i);
        png8(P("%s/k%d/%02d.png", root, i % 2, i), 40, 30, 3, px);
    }
    mgt_dataset *ds = NULL;
    assert_int_equal(mgt_dataset_scan(root, NULL, &ds), MGT_OK);
    size_t floats = 64, n = 23;
    float *a = calloc(n * floats, sizeof(float)), *b = calloc(n * floats, sizeof(float));
    int ca[23] = {0}, cb[23] = {0};
    /* a sample's augmentation depends on (seed, epoch, index) only: not on the thread count,
       the prefetch depth, or the number of devices */
    collect_epoch(ds, 1, 0, 5, 2, a, ca, floats);
    collect_epoch(ds, 3, 3, 2, 2, b, cb, floats);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(ca[i], 1);
        assert_true(cb[i] >= 1);
        assert_memory_equal(a + i * floats, b + i * floats, floats * sizeof(float));
    }
    int c2[23] = {0};
    collect_epoch(ds, 2, 2, 4, 3, b, c2, floats); /* another epoch: other crops */
    int differ = 0;
    for (size_t i = 0; i < n; i++)
        differ += memcmp(a + i * floats, b + i * floats, floats * sizeof(float)) != 0;
    assert_true(differ > 20);
    free(a);
    free(b);
    mgt_dataset_free(ds);
}

static void test_loader_epochs_and_resume(void **state)
{
    (void)state;
    mgt_dataset *ds = tagged_dataset("tagged20", 20);
    mgt_transform t;
    plain_transform(&t, 6);
    mgt_loader_options o;
    mgt_loader_options_init(&o, ds, &t, 2, 3);
    o.workers = 2;
    o.seed = 5;
    mgt_loader *l = NULL;
    assert_int_equal(mgt_loader_create(&o, &l), MGT_OK);
    assert_int_equal(mgt_loader_batches(l, 0), 4); /* 10 per device in batches of 3 */
    /* two epochs straight, continuous: the second needs no set_epoch; record rank 0's order */
    size_t first[2][10];
    assert_int_equal(mgt_loader_set_epoch(l, 0, 0), MGT_OK);
    for (int e = 0; e < 2; e++) {
        if (e == 1)
            assert_int_equal(mgt_loader_set_epoch(l, 1, 0), MGT_OK); /* keeps the prefetch */
        int got = 0;
        for (int b = 0; b < 4; b++)
            for (int r = 0; r < 2; r++) {
                mgt_batch bt;
                assert_int_equal(mgt_loader_next(l, r, NULL, &bt), MGT_OK);
                assert_int_equal(bt.epoch, e);
                assert_int_equal(bt.n, b == 3 ? 1 : 3);
                for (int k = 0; k < bt.n && r == 0; k++)
                    first[e][got++] = bt.indices_host[k];
            }
        assert_int_equal(got, 10);
    }
    assert_true(memcmp(first[0], first[1], sizeof first[0]) != 0);
    /* resume in the middle of epoch 1: batch 2 holds what it held the first time */
    assert_int_equal(mgt_loader_set_epoch(l, 1, 2), MGT_OK);
    mgt_batch bt;
    assert_int_equal(mgt_loader_next(l, 0, NULL, &bt), MGT_OK);
    assert_int_equal(bt.index, 2);
    assert_int_equal(bt.indices_host[0], first[1][6]);
    assert_int_equal(mgt_loader_next(l, 1, NULL, &bt), MGT_OK);
    /* and going back to epoch 0 gives epoch 0's order again */
    assert_int_equal(mgt_loader_set_epoch(l, 0, 0), MGT_OK);
    assert_int_equal(mgt_loader_next(l, 0, NULL, &bt), MGT_OK);
    assert_int_equal(bt.indices_host[0], first[0][0]);
    assert_int_equal(mgt_loader_set_epoch(l, 0, 4), MGT_ERR_INVALID);
    mgt_loader_free(l);
    mgt_dataset_free(ds);
}

static void test_loader_bad_files(void **state)
{
    (void)state;
    MGT_TEST_HOLD(root, "%s/withbad", g_root);
    tagged_png(P("%s/a/0.png", root), 6, 6, 10);
    mgt_test_write_file(P("%s/a/1.png", root), "not a png at all", 16);
    tagged_png(P("%s/a/2.png", root), 6, 6, 30);
    tagged_png(P("%s/b/3.png", root), 6, 6, 40);
    mgt_dataset *ds = NULL;
    assert_int_equal(mgt_dataset_scan(root, NULL, &ds), MGT_OK);
    mgt_transform t;
    plain_transform(&t, 6);
    char *warn_buf = NULL;
    size_t warn_len = 0;
    FILE *warn = open_memstream(&warn_buf, &warn_len);
    mgt_loader_options o;
    mgt_loader_options_init(&o, ds, &t, 1, 4);
    o.workers = 2;
    o.split = MGT_SPLIT_EXACT;
    o.shuffle = false;
    o.bad.max_bad_frac = 0.5;
    o.bad.warn = warn;
    mgt_loader *l = NULL;
    assert_int_equal(mgt_loader_create(&o, &l), MGT_OK);
    for (int epoch = 0; epoch < 2; epoch++) {
        assert_int_equal(mgt_loader_set_epoch(l, epoch, 0), MGT_OK);
        mgt_batch bt;
        assert_int_equal(mgt_loader_next(l, 0, NULL, &bt), MGT_OK);
        assert_int_equal(bt.n, 4);
        /* the bad file's slot holds the next index, deterministically */
        static const size_t want_idx[4] = {0, 2, 2, 3};
        static const float want_px[4] = {10, 30, 30, 40};
        for (int k = 0; k < 4; k++) {
            assert_int_equal(bt.indices_host[k], want_idx[k]);
            assert_float_equal(bt.images[k * 36], want_px[k], 1e-3);
        }
    }
    assert_int_equal(mgt_loader_bad_count(l), 1);
    mgt_loader_free(l);
    fclose(warn);
    /* warned once, naming the file */
    const char *w1 = strstr(warn_buf, "a/1.png");
    assert_non_null(w1);
    assert_null(strstr(w1 + 1, "a/1.png"));
    free(warn_buf);

    /* past --max-bad-frac, and under --strict-data: the run stops with the file's name */
    for (int strict = 0; strict < 2; strict++) {
        mgt_abort ab = {0};
        o.bad.warn = fopen("/dev/null", "w");
        o.bad.max_bad_frac = strict ? 1.0 : 0.1;
        o.bad.strict = strict;
        o.abort = &ab;
        assert_int_equal(mgt_loader_create(&o, &l), MGT_OK);
        assert_int_equal(mgt_loader_set_epoch(l, 0, 0), MGT_OK);
        mgt_batch bt;
        assert_int_equal(mgt_loader_next(l, 0, NULL, &bt), MGT_ERR_INVALID);
        assert_true(contains(mgt_error_last(), "a/1.png"));
        assert_true(contains(mgt_error_last(), strict ? "--strict-data" : "--max-bad-frac"));
        assert_true(mgt_abort_is_raised(&ab)); /* the whole run hears of it */
        mgt_loader_free(l);
        fclose(o.bad.warn);
    }
    mgt_dataset_free(ds);
}

typedef struct next_arg {
    mgt_loader *l;
    int rank;
    mgt_stream *stream;
    mgt_status st;
    double returned_at;
} next_arg;

static void *next_thread(void *p)
{
    next_arg *a = p;
    mgt_batch bt;
    a->st = mgt_loader_next(a->l, a->rank, a->stream, &bt);
    a->returned_at = mgt_time_now();
    return NULL;
}

static void test_loader_abort(void **state)
{
    (void)state;
    /* noise PNGs of 600 x 450 decode slowly enough that a batch of 16 takes a while (and
       are small enough that writing them stays quick under the thread sanitizer); at 400 x
       300 the batch was once ready within the 5 ms before the flag on a fast CPU */
    MGT_TEST_HOLD(root, "%s/slow", g_root);
    uint8_t *px = malloc(600 * 450 * 3);
    for (int i = 0; i < 16; i++) {
        noise_rgb(px, 600, 450, (uint64_t)i + 100);
        png8(P("%s/c/%d.png", root, i), 600, 450, 3, px);
    }
    free(px);
    mgt_dataset *ds = NULL;
    assert_int_equal(mgt_dataset_scan(root, NULL, &ds), MGT_OK);
    mgt_transform t;
    assert_int_equal(mgt_transform_init(&t, MGT_TRANSFORM_RRC, 64, 3), MGT_OK);
    mgt_abort ab = {0};
    mgt_loader_options o;
    mgt_loader_options_init(&o, ds, &t, 1, 16);
    o.workers = 1;
    o.prefetch = 1;
    o.abort = &ab;
    mgt_loader *l = NULL;
    assert_int_equal(mgt_loader_create(&o, &l), MGT_OK);
    assert_int_equal(mgt_loader_set_epoch(l, 0, 0), MGT_OK);
    /* the first batch takes 16 slow decodes (20 ms and more on any machine); a consumer
       waits for it and the flag goes up long before it can be ready */
    next_arg a = {.l = l, .rank = 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, next_thread, &a), 0);
    usleep(1000);
    double raised = mgt_time_now();
    mgt_abort_raise(&ab);
    pthread_join(th, NULL);
    assert_int_equal(a.st, MGT_ERR_ABORTED);
    assert_true(a.returned_at - raised < 0.5);
    mgt_batch bt;
    assert_int_equal(mgt_loader_next(l, 0, NULL, &bt), MGT_ERR_ABORTED);
    double t0 = mgt_time_now();
    mgt_loader_free(l); /* the decode thread finishes the image in hand */
    double freed = mgt_time_now() - t0;
    print_message("loader abort: next() left %.3f ms after the flag, free took %.1f ms\n",
                  1e3 * (a.returned_at - raised), 1e3 * freed);
    /* a hang check, not a timing: one image in hand, which under the thread sanitizer on a
       loaded machine can take a second to decode */
    assert_true(freed < 10.0);

    /* free while the queues are full and nobody consumes, without any flag */
    o.abort = NULL;
    o.workers = 2;
    o.prefetch = 2;
    assert_int_equal(mgt_loader_create(&o, &l), MGT_OK);
    assert_int_equal(mgt_loader_set_epoch(l, 0, 0), MGT_OK);
    usleep(20000);
    t0 = mgt_time_now();
    mgt_loader_free(l);
    assert_true(mgt_time_now() - t0 < 10.0);
    mgt_dataset_free(ds);
}

/* ---- loader on mock devices ---- */

typedef struct dev_worker {
    mgt_loader *l;
    mgt_device *dev;
    int rank;
    int epochs;
    const mgt_dataset *ds;
    int *seen; /* per dataset index, this rank's count */
    pthread_mutex_t *lock;
    mgt_status st;
    char err[256];
} dev_worker;

static void *dev_worker_main(void *p)
{
    dev_worker *w = p;
    mgt_stream *s = NULL;
    float *host = NULL;
    size_t floats = 36 * 4 + 8;
    w->st = mgt_stream_create(w->dev, &s);
    if (w->st == MGT_OK)
        w->st = mgt_host_alloc(w->dev, floats * sizeof(float), (void **)&host);
    size_t nb = mgt_loader_batches(w->l, w->rank);
    for (size_t b = 0; w->st == MGT_OK && b < nb; b++) {
        mgt_batch bt;
        if ((w->st = mgt_loader_next(w->l, w->rank, s, &bt)) != MGT_OK)
            break;
        /* read the batch back on the compute stream, as a kernel would */
        if ((w->st = mgt_copy_d2h(s, host, bt.images, sizeof(float) * 36 * (size_t)bt.n)) != MGT_OK)
            break;
        if ((w->st = mgt_copy_d2h(s, host + 36 * 4, bt.labels, sizeof(int32_t) * (size_t)bt.n)) !=
            MGT_OK)
            break;
        if ((w->st = mgt_stream_synchronize(s, NULL)) != MGT_OK)
            break;
        const int32_t *lab = (const int32_t *)(host + 36 * 4);
        for (int k = 0; k < bt.n; k++) {
            size_t idx = bt.indices_host[k];
            if (lab[k] != mgt_dataset_label(w->ds, idx) ||
                host[k * 36 + 7] != (float)tag_of(w->ds, idx)) {
                w->st = MGT_ERR_INVALID;
                snprintf(w->err, sizeof w->err,
                         "rank %d batch %zu sample %d: label %d pixel %g for index %zu", w->rank, b,
                         k, lab[k], (double)host[k * 36 + 7], idx);
                break;
            }
            pthread_mutex_lock(w->lock);
            w->seen[idx]++;
            pthread_mutex_unlock(w->lock);
        }
    }
    if (w->st != MGT_OK && !w->err[0])
        snprintf(w->err, sizeof w->err, "%s", mgt_error_last());
    if (host)
        mgt_host_free(w->dev, host);
    mgt_stream_free(s);
    return NULL;
}

static void test_loader_mock_devices(void **state)
{
    (void)state;
    mgt_dataset *ds = tagged_dataset("tagged29", 29);
    int ids[3] = {0, 1, 2};
    mgt_devset *set = NULL;
    mgt_status st = mgt_devset_open(MGT_DEVICE_MOCK, ids, 3, NULL, &set);
    if (st != MGT_OK)
        fail_msg("mock devices: %s", mgt_error_last());
    mgt_device *devs[3];
    for (int i = 0; i < 3; i++)
        devs[i] = mgt_devset_device(set, i);
    mgt_transform t;
    plain_transform(&t, 6);
    mgt_loader_options o;
    mgt_loader_options_init(&o, ds, &t, 3, 4);
    o.devices = devs;
    o.workers = 2;
    o.split = MGT_SPLIT_EXACT;
    o.shuffle = false;
    o.continuous = false;
    mgt_loader *l = NULL;
    if (mgt_loader_create(&o, &l) != MGT_OK)
        fail_msg("loader: %s", mgt_error_last());
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    for (int epoch = 0; epoch < 2; epoch++) {
        int seen[29] = {0};
        assert_int_equal(mgt_loader_set_epoch(l, epoch, 0), MGT_OK);
        dev_worker w[3];
        pthread_t th[3];
        for (int r = 0; r < 3; r++) {
            w[r] = (dev_worker){
                .l = l, .dev = devs[r], .rank = r, .ds = ds, .seen = seen, .lock = &lock};
            assert_int_equal(pthread_create(&th[r], NULL, dev_worker_main, &w[r]), 0);
        }
        for (int r = 0; r < 3; r++)
            pthread_join(th[r], NULL);
        for (int r = 0; r < 3; r++)
            if (w[r].st != MGT_OK)
                fail_msg("device worker %d: %s", r, w[r].err);
        for (int i = 0; i < 29; i++)
            assert_int_equal(seen[i], 1);
    }
    mgt_loader_free(l);

    /* abort while device threads wait for batches that are slow to come */
    mgt_abort ab = {0};
    mgt_mock_options mo;
    assert_int_equal(mgt_mock_options_parse(&mo, "delay=2000;seed=3"), MGT_OK);
    mgt_devset_free(set);
    assert_int_equal(
        mgt_devset_open(MGT_DEVICE_MOCK, ids, 3, &(mgt_devset_options){.mock = &mo}, &set), MGT_OK);
    for (int i = 0; i < 3; i++)
        devs[i] = mgt_devset_device(set, i);
    o.abort = &ab;
    o.continuous = true;
    o.split = MGT_SPLIT_PAD;
    o.shuffle = true;
    o.workers = 1;
    assert_int_equal(mgt_loader_create(&o, &l), MGT_OK);
    assert_int_equal(mgt_loader_set_epoch(l, 0, 0), MGT_OK);
    dev_worker w[3];
    pthread_t th[3];
    int seen[29] = {0};
    for (int r = 0; r < 3; r++) {
        w[r] =
            (dev_worker){.l = l, .dev = devs[r], .rank = r, .ds = ds, .seen = seen, .lock = &lock};
        assert_int_equal(pthread_create(&th[r], NULL, dev_worker_main, &w[r]), 0);
    }
    usleep(3000);
    double raised = mgt_time_now();
    mgt_abort_raise(&ab);
    for (int r = 0; r < 3; r++)
        pthread_join(th[r], NULL);
    double joined = mgt_time_now() - raised;
    mgt_loader_free(l);
    double freed = mgt_time_now() - raised;
    print_message("mock devices abort: workers out %.1f ms, loader freed %.1f ms after the flag\n",
                  1e3 * joined, 1e3 * freed);
    /* a hang check, not a timing: one image in hand, which under the thread sanitizer on a
       loaded machine can take a second to decode */
    assert_true(freed < 10.0);
    for (int r = 0; r < 3; r++)
        assert_true(w[r].st == MGT_OK || w[r].st == MGT_ERR_ABORTED);
    mgt_devset_free(set);
    mgt_dataset_free(ds);
}

/* ---- passes: check-data and --normalize auto ---- */

static void test_check_and_stats(void **state)
{
    (void)state;
    MGT_TEST_HOLD(root, "%s/checkme", g_root);
    tagged_png(P("%s/train/a/0.png", root), 4, 4, 51);
    mgt_test_write_file(P("%s/train/a/1.png", root), "garbage", 7);
    tagged_png(P("%s/train/b/2.png", root), 4, 4, 102);
    make_bad_files(P("%s/train/b", root)); /* junk, empty, truncated, huge, cut + 2 good */
    tagged_png(P("%s/val/a/0.png", root), 4, 4, 51);
    tagged_png(P("%s/val/b/0.png", root), 4, 4, 51);
    mgt_dataset *tr = NULL;
    assert_int_equal(mgt_dataset_scan(P("%s/train", root), NULL, &tr), MGT_OK);
    size_t bad = 0;
    assert_int_equal(mgt_data_check(tr, 2, NULL, NULL, NULL, NULL, &bad), MGT_OK);
    assert_int_equal(bad, 7); /* a/1.png, junk, empty, 2 truncated, huge, cut */

    /* the subcommand: exit 1, and 0 on a clean tree */
    char *argv1[] = {"check-data", "--data", (char *)P("%s", root), "-j", "2", NULL};
    FILE *saved = stdout;
    stdout = fopen("/dev/null", "w");
    int rc = mgt_app_cmd_check_data(5, argv1);
    char *argv2[] = {"check-data", "--data", (char *)P("%s/val", root), NULL};
    int rc2 = mgt_app_cmd_check_data(3, argv2);
    char *argv3[] = {"check-data", NULL};
    int rc3 = mgt_app_cmd_check_data(1, argv3);
    fclose(stdout);
    stdout = saved;
    assert_int_equal(rc, 1);
    assert_int_equal(rc2, 0);
    assert_int_equal(rc3, 2);

    /* statistics: two flat gray images 51 and 102 -> mean 76.5/255, std 25.5/255 */
    mgt_dataset *va = NULL;
    MGT_TEST_HOLD(sroot, "%s/statsset", g_root);
    tagged_png(P("%s/a/0.png", sroot), 4, 4, 51);
    tagged_png(P("%s/b/0.png", sroot), 4, 4, 102);
    mgt_test_write_file(P("%s/b/1.png", sroot), "garbage", 7); /* passed over */
    assert_int_equal(mgt_dataset_scan(sroot, NULL, &va), MGT_OK);
    float mean[3], std[3];
    assert_int_equal(mgt_data_stats(va, 1, 0, 2, NULL, mean, std), MGT_OK);
    assert_float_equal(mean[0], 76.5f / 255.0f, 1e-5);
    assert_float_equal(std[0], 25.5f / 255.0f, 1e-5);
    assert_int_equal(mgt_data_stats(va, 3, 0, 1, NULL, mean, std), MGT_OK);
    assert_float_equal(mean[2], 76.5f / 255.0f, 1e-5);
    mgt_dataset_free(tr);
    mgt_dataset_free(va);
}

/* ---- IDX and the Fashion-MNIST import ---- */

static void write_idx_gz(const char *path, const uint8_t *hdr, size_t hn, const uint8_t *data,
                         size_t n)
{
    mgt_test_parent_dirs(path);
    gzFile f = gzopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(gzwrite(f, hdr, (unsigned)hn), (int)hn);
    if (n)
        assert_int_equal(gzwrite(f, data, (unsigned)n), (int)n);
    assert_int_equal(gzclose(f), Z_OK);
}

static void test_idx_and_import(void **state)
{
    (void)state;
    MGT_TEST_HOLD(src, "%s/idxsrc", g_root);
    /* 12 training and 5 test images of 4 x 3, labels 0..9 cycling */
    uint8_t imgs[12 * 12], labs[12];
    for (int i = 0; i < 12 * 12; i++)
        imgs[i] = (uint8_t)(i * 3);
    for (int i = 0; i < 12; i++)
        labs[i] = (uint8_t)(i % 10);
    const uint8_t ih[16] = {0, 0, 8, 3, 0, 0, 0, 12, 0, 0, 0, 3, 0, 0, 0, 4};
    const uint8_t lh[8] = {0, 0, 8, 1, 0, 0, 0, 12};
    write_idx_gz(P("%s/train-images-idx3-ubyte.gz", src), ih, 16, imgs, sizeof imgs);
    write_idx_gz(P("%s/train-labels-idx1-ubyte.gz", src), lh, 8, labs, sizeof labs);
    const uint8_t th[16] = {0, 0, 8, 3, 0, 0, 0, 5, 0, 0, 0, 3, 0, 0, 0, 4};
    const uint8_t tl[8] = {0, 0, 8, 1, 0, 0, 0, 5};
    write_idx_gz(P("%s/t10k-images-idx3-ubyte.gz", src), th, 16, imgs, 5 * 12);
    /* a plain (not gzipped) file works too */
    uint8_t plain[8 + 5];
    memcpy(plain, tl, 8);
    memcpy(plain + 8, labs, 5);
    mgt_test_write_file(P("%s/t10k-labels-idx1-ubyte", src), plain, sizeof plain);

    mgt_idx idx;
    assert_int_equal(mgt_idx_read(P("%s/train-images-idx3-ubyte.gz", src), &idx), MGT_OK);
    assert_int_equal(idx.ndim, 3);
    assert_int_equal(idx.dims[0], 12);
    assert_int_equal(idx.dims[1], 3);
    assert_int_equal(idx.dims[2], 4);
    assert_memory_equal(idx.data, imgs, sizeof imgs);
    mgt_idx_free(&idx);
    /* broken files */
    write_idx_gz(P("%s/bad/short.gz", src), ih, 16, imgs, 20);
    assert_int_equal(mgt_idx_read(P("%s/bad/short.gz", src), &idx), MGT_ERR_INVALID);
    assert_true(contains(mgt_error_last(), "ends inside"));
    const uint8_t badmagic[8] = {1, 2, 8, 1, 0, 0, 0, 1};
    mgt_test_write_file(P("%s/bad/magic", src), badmagic, 8);
    assert_int_equal(mgt_idx_read(P("%s/bad/magic", src), &idx), MGT_ERR_INVALID);
    assert_true(contains(mgt_error_last(), "not an IDX"));
    const uint8_t floats[8] = {0, 0, 0x0d, 1, 0, 0, 0, 1};
    mgt_test_write_file(P("%s/bad/float", src), floats, 8);
    assert_int_equal(mgt_idx_read(P("%s/bad/float", src), &idx), MGT_ERR_INVALID);
    assert_int_equal(mgt_idx_read(P("%s/bad/none.gz", src), &idx), MGT_ERR_IO);
    assert_true(contains(mgt_error_last(), "none.gz"));

    MGT_TEST_HOLD(out, "%s/fm", g_root);
    bool already = true;
    assert_int_equal(mgt_data_import_fashion_mnist(src, out, 0, NULL, &already), MGT_OK);
    assert_false(already);
    mgt_image img;
    load_ok(P("%s/train/Trouser/00001.png", out), 1, &img); /* image 1 has label 1 */
    assert_int_equal(img.w, 4);
    assert_int_equal(img.h, 3);
    assert_memory_equal(img.pixels, imgs + 12, 12);
    mgt_image_release(&img);
    load_ok(P("%s/val/Coat/00004.png", out), 1, &img); /* test image 4, label 4 */
    assert_memory_equal(img.pixels, imgs + 4 * 12, 12);
    mgt_image_release(&img);
    mgt_dataset *tr = NULL, *va = NULL;
    /* 5 test images leave val's other class folders empty: refused, by name */
    assert_int_equal(mgt_imagefolder_open(out, NULL, &tr, &va), MGT_ERR_INVALID);
    assert_true(contains(mgt_error_last(), "no image files"));
    assert_int_equal(mgt_dataset_scan(P("%s/train", out), NULL, &tr), MGT_OK);
    assert_int_equal(mgt_dataset_size(tr), 12);
    assert_int_equal(mgt_dataset_class_count(tr), 10);
    assert_string_equal(mgt_dataset_class_name(tr, 0), "Ankle_boot");
    assert_string_equal(mgt_dataset_class_name(tr, 8), "T-shirt_top");
    mgt_dataset_free(tr);
    /* a second import does nothing */
    assert_int_equal(mgt_data_import_fashion_mnist(src, out, 0, NULL, &already), MGT_OK);
    assert_true(already);
    assert_int_equal(mgt_data_import_fashion_mnist(P("%s/nothere", g_root), P("%s/fm2", g_root), 0,
                                                   NULL, &already),
                     MGT_ERR_IO);
    assert_true(contains(mgt_error_last(), "dataset-fashion-mnist"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_kat),
        cmocka_unit_test(test_rng_draws),
        cmocka_unit_test(test_scan_order_and_labels),
        cmocka_unit_test(test_scan_symlink_loops),
        cmocka_unit_test(test_sample_tree),
        cmocka_unit_test(test_dataset_errors),
        cmocka_unit_test(test_decode_layouts),
        cmocka_unit_test(test_decode_errors),
        cmocka_unit_test(test_gray_matches_pil),
        cmocka_unit_test(test_jpeg_matches_pil),
        cmocka_unit_test(test_region_decode),
        cmocka_unit_test(test_decoder_after_error),
        cmocka_unit_test(test_fast_decode_tolerance),
        cmocka_unit_test(test_resize_matches_pil),
        cmocka_unit_test(test_resize_interp_matches_pil),
        cmocka_unit_test(test_resize_by_hand),
        cmocka_unit_test(test_resize_and_center_crop_sizes),
        cmocka_unit_test(test_rrc_params_golden),
        cmocka_unit_test(test_rrc_fallback),
        cmocka_unit_test(test_pad_crop_geometry),
        cmocka_unit_test(test_transform_outputs),
        cmocka_unit_test(test_sampler_golden),
        cmocka_unit_test(test_sampler_properties),
        cmocka_unit_test(test_ra_sampler_golden),
        cmocka_unit_test(test_ra_sampler_properties),
        cmocka_unit_test(test_loader_ra),
        cmocka_unit_test(test_loader_exact_once),
        cmocka_unit_test(test_loader_determinism),
        cmocka_unit_test(test_loader_mix_device_count),
        cmocka_unit_test(test_loader_epochs_and_resume),
        cmocka_unit_test(test_loader_bad_files),
        cmocka_unit_test(test_loader_abort),
        cmocka_unit_test(test_loader_mock_devices),
        cmocka_unit_test(test_check_and_stats),
        cmocka_unit_test(test_idx_and_import),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
