/* Tests of the safetensors reader and writer: round trips, golden files, the bad-file corpus
   (tests/data/safetensors, made by scripts/make_safetensors_corpus.py) and failed saves. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "mgt/safetensors.h"

#define DATA_DIR MGT_TEST_DATA_DIR "/safetensors"

/* ---- helpers ---- */

static char *path_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    assert_non_null(p);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static unsigned char *read_all(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    assert_int_equal(fseek(fp, 0, SEEK_END), 0);
    long n = ftell(fp);
    assert_true(n >= 0);
    rewind(fp);
    unsigned char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    *len = (size_t)n;
    return buf;
}

static void write_all(const char *path, const void *buf, size_t len)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(buf, 1, len, fp), len);
    assert_int_equal(fclose(fp), 0);
}

static char *make_temp_dir(void)
{
    char tmpl[] = "/tmp/mgt_test_st_XXXXXX";
    char *dir = mkdtemp(tmpl);
    assert_non_null(dir);
    return strdup(dir);
}

/* How many entries a folder holds besides . and .. (to catch stray temp files). */
static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            n++;
    closedir(d);
    return n;
}

static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char *p = path_join(dir, e->d_name);
        unlink(p);
        free(p);
    }
    closedir(d);
    rmdir(dir);
}

static int find_checked(const mgt_st_file *f, const char *name)
{
    int i = mgt_st_find(f, name);
    if (i < 0)
        fail_msg("tensor %s is missing", name);
    return i;
}

/* Checks dtype and shape of a tensor and copies its data out (the pointer may be unaligned). */
static void expect_tensor(const mgt_st_file *f, const char *name, mgt_st_dtype dtype, int ndim,
                          const int64_t *shape, void *dst, size_t dst_bytes)
{
    int i = find_checked(f, name);
    assert_string_equal(mgt_st_tensor_name(f, i), name);
    assert_int_equal(mgt_st_tensor_dtype(f, i), dtype);
    assert_int_equal(mgt_st_tensor_ndim(f, i), ndim);
    uint64_t numel = 1;
    for (int k = 0; k < ndim; k++) {
        assert_int_equal(mgt_st_tensor_shape(f, i)[k], shape[k]);
        numel *= (uint64_t)shape[k];
    }
    assert_int_equal(mgt_st_tensor_numel(f, i), numel);
    assert_int_equal(mgt_st_tensor_bytes(f, i), dst_bytes);
    assert_int_equal(mgt_st_tensor_bytes(f, i), numel * mgt_st_dtype_size(dtype));
    if (dst_bytes > 0)
        memcpy(dst, mgt_st_tensor_data(f, i), dst_bytes);
}

/* ---- round trip ---- */

static void test_round_trip(void **state)
{
    (void)state;
    char *dir = make_temp_dir();
    char *path = path_join(dir, "ckpt.safetensors");

    /* bit patterns a float round trip could lose: -0, a NaN payload, a denormal, infinities */
    enum { CONV = 4 * 3 * 3 * 3 };
    uint32_t conv_bits[CONV];
    for (int i = 0; i < CONV; i++)
        conv_bits[i] = 0x3f800000u + (uint32_t)i * 0x01010101u;
    conv_bits[0] = 0x80000000u;
    conv_bits[1] = 0x7fc12345u;
    conv_bits[2] = 0x00000001u;
    conv_bits[3] = 0x7f800000u;
    conv_bits[4] = 0xff800000u;
    const float mean[4] = {0.1f, -0.2f, 3e-38f, 1e38f};
    const int64_t tracked = ((int64_t)1 << 40) + 5;
    const uint16_t fc_bias_f16[3] = {0x3c00, 0xc000, 0x7e01};
    const uint8_t odd[3] = {1, 2, 255};
    const double f64[2] = {-1.0 / 3.0, 6.02214076e23};
    const uint8_t flags[2] = {1, 0};

    mgt_st_writer *w = NULL;
    assert_int_equal(mgt_st_writer_create(&w), MGT_OK);
    const int64_t conv_shape[4] = {4, 3, 3, 3}, four[1] = {4}, three[1] = {3}, two[1] = {2};
    const int64_t empty_shape[2] = {0, 7};
    assert_int_equal(mgt_st_writer_add(w, "conv1.weight", MGT_ST_F32, 4, conv_shape, conv_bits),
                     MGT_OK);
    /* an odd-sized tensor before 4- and 8-byte ones leaves their data unaligned */
    assert_int_equal(mgt_st_writer_add(w, "odd.u8", MGT_ST_U8, 1, three, odd), MGT_OK);
    assert_int_equal(mgt_st_writer_add(w, "layer1.0.bn1.running_mean", MGT_ST_F32, 1, four, mean),
                     MGT_OK);
    assert_int_equal(mgt_st_writer_add(w, "bn1.num_batches_tracked", MGT_ST_I64, 0, NULL, &tracked),
                     MGT_OK);
    assert_int_equal(mgt_st_writer_add(w, "fc.bias", MGT_ST_F16, 1, three, fc_bias_f16), MGT_OK);
    assert_int_equal(mgt_st_writer_add(w, "extra.f64", MGT_ST_F64, 1, two, f64), MGT_OK);
    assert_int_equal(mgt_st_writer_add(w, "extra.bool", MGT_ST_BOOL, 1, two, flags), MGT_OK);
    assert_int_equal(mgt_st_writer_add(w, "extra.empty", MGT_ST_F32, 2, empty_shape, NULL), MGT_OK);
    assert_int_equal(mgt_st_writer_add(w, "n\u00e4me \"quoted\"\n", MGT_ST_I8, 1, two, flags),
                     MGT_OK);
    assert_int_equal(mgt_st_writer_set_metadata(w, "epoch", "1"), MGT_OK);
    assert_int_equal(mgt_st_writer_set_metadata(w, "best_top1", "0.7613"), MGT_OK);
    assert_int_equal(mgt_st_writer_set_metadata(w, "epoch", "2"), MGT_OK); /* replaces */
    assert_int_equal(mgt_st_writer_set_metadata(w, "note", "\u2713 \"q\" \\ \t"), MGT_OK);
    assert_int_equal(mgt_st_writer_save(w, path), MGT_OK);
    mgt_st_writer_free(w);
    assert_int_equal(count_entries(dir), 1);

    /* the header is padded to 8 bytes and the data follows in the order added */
    size_t len;
    unsigned char *raw = read_all(path, &len);
    uint64_t hlen = 0;
    for (int k = 7; k >= 0; k--)
        hlen = hlen << 8 | raw[k];
    assert_int_equal(hlen % 8, 0);
    assert_int_equal(raw[8], '{');
    assert_memory_equal(raw + 8 + hlen, conv_bits, sizeof conv_bits);
    assert_memory_equal(raw + 8 + hlen + sizeof conv_bits, odd, sizeof odd);
    free(raw);

    mgt_st_file *f = NULL;
    assert_int_equal(mgt_st_open(path, &f), MGT_OK);
    assert_int_equal(mgt_st_count(f), 9);
    assert_string_equal(mgt_st_tensor_name(f, 0), "conv1.weight");
    assert_string_equal(mgt_st_tensor_name(f, 1), "odd.u8");
    assert_string_equal(mgt_st_tensor_name(f, 8), "n\u00e4me \"quoted\"\n");

    uint32_t conv_back[CONV];
    expect_tensor(f, "conv1.weight", MGT_ST_F32, 4, conv_shape, conv_back, sizeof conv_back);
    assert_memory_equal(conv_back, conv_bits, sizeof conv_bits);
    float mean_back[4];
    expect_tensor(f, "layer1.0.bn1.running_mean", MGT_ST_F32, 1, four, mean_back, sizeof mean_back);
    assert_memory_equal(mean_back, mean, sizeof mean);
    int64_t tracked_back = 0;
    expect_tensor(f, "bn1.num_batches_tracked", MGT_ST_I64, 0, NULL, &tracked_back,
                  sizeof tracked_back);
    assert_int_equal(tracked_back, tracked);
    assert_null(mgt_st_tensor_shape(f, find_checked(f, "bn1.num_batches_tracked")));
    uint16_t f16_back[3];
    expect_tensor(f, "fc.bias", MGT_ST_F16, 1, three, f16_back, sizeof f16_back);
    assert_memory_equal(f16_back, fc_bias_f16, sizeof f16_back);
    double f64_back[2];
    expect_tensor(f, "extra.f64", MGT_ST_F64, 1, two, f64_back, sizeof f64_back);
    assert_memory_equal(f64_back, f64, sizeof f64);
    uint8_t b[3];
    expect_tensor(f, "extra.bool", MGT_ST_BOOL, 1, two, b, 2);
    assert_memory_equal(b, flags, 2);
    expect_tensor(f, "odd.u8", MGT_ST_U8, 1, three, b, 3);
    assert_memory_equal(b, odd, 3);
    expect_tensor(f, "extra.empty", MGT_ST_F32, 2, empty_shape, NULL, 0);
    expect_tensor(f, "n\u00e4me \"quoted\"\n", MGT_ST_I8, 1, two, b, 2);

    assert_int_equal(mgt_st_find(f, "fc.weight"), -1);
    assert_int_equal(mgt_st_find(f, "__metadata__"), -1);
    assert_int_equal(mgt_st_find(f, ""), -1);
    assert_int_equal(mgt_st_metadata_count(f), 3);
    assert_string_equal(mgt_st_metadata_get(f, "epoch"), "2");
    assert_string_equal(mgt_st_metadata_get(f, "best_top1"), "0.7613");
    assert_string_equal(mgt_st_metadata_get(f, "note"), "\u2713 \"q\" \\ \t");
    assert_null(mgt_st_metadata_get(f, "seed"));
    assert_string_equal(mgt_st_metadata_key(f, 0), "epoch");
    assert_string_equal(mgt_st_metadata_value(f, 1), "0.7613");
    mgt_st_close(f);

    remove_dir(dir);
    free(path);
    free(dir);
}

static void test_empty_writer(void **state)
{
    (void)state;
    char *dir = make_temp_dir();
    char *path = path_join(dir, "empty.safetensors");
    mgt_st_writer *w = NULL;
    assert_int_equal(mgt_st_writer_create(&w), MGT_OK);
    assert_int_equal(mgt_st_writer_save(w, path), MGT_OK);
    mgt_st_writer_free(w);
    mgt_st_file *f = NULL;
    assert_int_equal(mgt_st_open(path, &f), MGT_OK);
    assert_int_equal(mgt_st_count(f), 0);
    assert_int_equal(mgt_st_metadata_count(f), 0);
    assert_int_equal(mgt_st_find(f, "a"), -1);
    mgt_st_close(f);
    mgt_st_close(NULL);
    mgt_st_writer_free(NULL);
    remove_dir(dir);
    free(path);
    free(dir);
}

/* ---- golden files (laid out by scripts/make_safetensors_corpus.py from the format text) ---- */

static void test_golden_torch_like(void **state)
{
    (void)state;
    mgt_st_file *f = NULL;
    if (mgt_st_open(DATA_DIR "/good/torch_like.safetensors", &f) != MGT_OK)
        fail_msg("%s", mgt_error_last());
    assert_int_equal(mgt_st_count(f), 18);

    float conv[18];
    const int64_t conv_shape[4] = {2, 1, 3, 3};
    expect_tensor(f, "conv1.weight", MGT_ST_F32, 4, conv_shape, conv, sizeof conv);
    for (int i = 0; i < 18; i++)
        assert_true(conv[i] == 0.25f * (float)i - 2.0f);
    float v2[2];
    const int64_t two[1] = {2}, three[1] = {3}, fc_shape[2] = {3, 2}, bool_shape[2] = {2, 2};
    expect_tensor(f, "bn1.running_mean", MGT_ST_F32, 1, two, v2, sizeof v2);
    assert_true(v2[0] == 0.5f && v2[1] == -0.5f);
    expect_tensor(f, "bn1.running_var", MGT_ST_F32, 1, two, v2, sizeof v2);
    assert_true(v2[0] == 1.5f && v2[1] == 2.5f);
    int64_t n = 0;
    expect_tensor(f, "bn1.num_batches_tracked", MGT_ST_I64, 0, NULL, &n, sizeof n);
    assert_int_equal(n, INT64_C(12345678901));
    expect_tensor(f, "layer1.0.bn1.num_batches_tracked", MGT_ST_I64, 0, NULL, &n, sizeof n);
    assert_int_equal(n, -1);
    float fcw[6], fcb[3];
    expect_tensor(f, "fc.weight", MGT_ST_F32, 2, fc_shape, fcw, sizeof fcw);
    for (int i = 0; i < 6; i++)
        assert_true(fcw[i] == (float)(1e-3 * i));
    expect_tensor(f, "fc.bias", MGT_ST_F32, 1, three, fcb, sizeof fcb);
    assert_true(fcb[0] == -1.0f && fcb[1] == 0.0f && fcb[2] == 1.0f);
    double d[2];
    expect_tensor(f, "extra.f64", MGT_ST_F64, 1, two, d, sizeof d);
    assert_true(d[0] == 3.141592653589793 && d[1] == -2.5e-300);
    uint16_t h[3];
    expect_tensor(f, "extra.f16", MGT_ST_F16, 1, three, h, sizeof h);
    assert_true(h[0] == 0x3c00 && h[1] == 0xc000 && h[2] == 0x3800);
    expect_tensor(f, "extra.bf16", MGT_ST_BF16, 1, two, h, 4);
    assert_true(h[0] == 0x3f80 && h[1] == 0xc040);
    int32_t i32[2];
    expect_tensor(f, "extra.i32", MGT_ST_I32, 1, two, i32, sizeof i32);
    assert_true(i32[0] == -7 && i32[1] == INT32_MAX);
    int16_t i16[2];
    expect_tensor(f, "extra.i16", MGT_ST_I16, 1, two, i16, sizeof i16);
    assert_true(i16[0] == -300 && i16[1] == 300);
    int8_t i8[2];
    expect_tensor(f, "extra.i8", MGT_ST_I8, 1, two, i8, sizeof i8);
    assert_true(i8[0] == -128 && i8[1] == 127);
    uint8_t u8[4];
    expect_tensor(f, "extra.u8", MGT_ST_U8, 1, three, u8, 3);
    assert_true(u8[0] == 0 && u8[1] == 128 && u8[2] == 255);
    expect_tensor(f, "extra.bool", MGT_ST_BOOL, 2, bool_shape, u8, 4);
    assert_true(u8[0] == 1 && u8[1] == 0 && u8[2] == 0 && u8[3] == 1);
    const int64_t empty_shape[2] = {0, 4};
    expect_tensor(f, "extra.empty", MGT_ST_F32, 2, empty_shape, NULL, 0);

    assert_string_equal(mgt_st_metadata_get(f, "format"), "pt");
    assert_string_equal(mgt_st_metadata_get(f, "epoch"), "3");
    assert_string_equal(mgt_st_metadata_get(f, "note"), "gr\u00fc\u00dfe \u2713");
    mgt_st_close(f);
}

static void test_golden_sloppy(void **state)
{
    (void)state;
    mgt_st_file *f = NULL;
    if (mgt_st_open(DATA_DIR "/good/sloppy.safetensors", &f) != MGT_OK)
        fail_msg("%s", mgt_error_last());
    assert_int_equal(mgt_st_count(f), 3);
    assert_string_equal(mgt_st_tensor_name(f, 0), "c.\u00e9"); /* header order */
    assert_int_equal(mgt_st_metadata_count(f), 0);
    const int64_t one[1] = {1}, two[1] = {2}, three[1] = {3};
    int64_t c = 0;
    expect_tensor(f, "c.\u00e9", MGT_ST_I64, 1, one, &c, sizeof c);
    assert_int_equal(c, INT64_C(-9007199254740993));
    float b[2];
    expect_tensor(f, "b.f32", MGT_ST_F32, 1, two, b, sizeof b);
    assert_true(b[0] == 1.5f && b[1] == -1.5f);
    uint8_t a[3];
    expect_tensor(f, "a.u8", MGT_ST_U8, 1, three, a, sizeof a);
    assert_true(a[0] == 1 && a[1] == 2 && a[2] == 3);
    mgt_st_close(f);

    assert_int_equal(mgt_st_open(DATA_DIR "/good/empty_header.safetensors", &f), MGT_OK);
    assert_int_equal(mgt_st_count(f), 0);
    mgt_st_close(f);
}

/* ---- hostile input ---- */

/* The reason each corpus file must give (a fragment of the message). A file missing from this
   table is still required to fail. */
static const struct {
    const char *file, *why;
} expected_reason[] = {
    {"empty", "too short"},
    {"seven_bytes", "too short"},
    {"truncated_length", "too short"},
    {"header_beyond_file", "beyond the end of the file"},
    {"huge_header_length", "exceeds the limit"},
    {"header_over_limit", "exceeds the limit"},
    {"zero_header_length", "does not start with"},
    {"not_json", "malformed JSON"},
    {"not_json_start", "does not start with"},
    {"bom", "does not start with"},
    {"non_utf8", "UTF-8"},
    {"overlong_utf8", "UTF-8"},
    {"surrogate_utf8", "UTF-8"},
    {"truncated_utf8", "UTF-8"},
    {"control_char", "control character"},
    {"nul_in_header", "control character"},
    {"nul_escape", "\\u0000"},
    {"lone_surrogate_escape", "malformed JSON"},
    {"trailing_garbage", "after its JSON object"},
    {"two_objects", "after its JSON object"},
    {"deep_nesting", "nests deeper than 64 levels"},
    {"not_object", "does not start with"},
    {"entry_not_object", "not a JSON object"},
    {"missing_dtype", "missing \"dtype\""},
    {"missing_shape", "missing \"shape\""},
    {"missing_offsets", "missing \"data_offsets\""},
    {"duplicate_field", "\"dtype\" appears 2 times"},
    {"dtype_not_string", "dtype is not a string"},
    {"unknown_dtype", "unsupported dtype \"F33\""},
    {"lowercase_dtype", "unsupported dtype"},
    {"shape_not_list", "shape is not a list"},
    {"shape_bool", "shape entry 0 is not a number"},
    {"shape_string", "shape entry 0 is not a number"},
    {"negative_dim", "shape entry 0 is negative"},
    {"fractional_dim", "shape entry 0 is not an integer"},
    {"huge_dim", "shape entry 0 is larger than 2^53"},
    {"overflowing_shape", "overflows"},
    {"overflow_then_zero", "overflows"},
    {"overflowing_bytes", "overflows"},
    {"offsets_reversed", "reversed"},
    {"offsets_beyond_data", "beyond the data section"},
    {"offsets_one_entry", "not a list of two"},
    {"offsets_three_entries", "not a list of two"},
    {"offsets_negative", "data_offsets[0] is negative"},
    {"offsets_fractional", "data_offsets[1] is not an integer"},
    {"offsets_huge", "larger than 2^53"},
    {"overlapping_tensors", "overlap"},
    {"same_offsets", "overlap"},
    {"empty_inside_other", "overlap"},
    {"hole", "belong to no tensor"},
    {"leading_hole", "belong to no tensor"},
    {"trailing_bytes", "trailing bytes"},
    {"no_tensors_with_data", "trailing bytes"},
    {"size_mismatch", "span 8 bytes but 3 element(s) of F32 need 12"},
    {"f64_size_mismatch", "need 16"},
    {"i64_as_i32_size", "bn1.num_batches_tracked"},
    {"duplicate_names", "tensor \"a\" appears twice"},
    {"metadata_non_string", "metadata \"epoch\" is not a string"},
    {"metadata_not_object", "__metadata__ is not a JSON object"},
    {"metadata_twice", "__metadata__ appears twice"},
    {"metadata_duplicate_key", "metadata key \"k\" appears twice"},
};

static void expect_refused(mgt_status st, mgt_st_file *f, const char *what, const char *why)
{
    const char *msg = mgt_error_last();
    if (st == MGT_OK)
        fail_msg("%s was accepted", what);
    assert_int_equal(st, MGT_ERR_INVALID);
    assert_null(f);
    if (msg[0] == '\0' || strstr(msg, what) == NULL)
        fail_msg("%s: message \"%s\" does not name the file", what, msg);
    if (why != NULL && strstr(msg, why) == NULL)
        fail_msg("%s: message \"%s\" lacks \"%s\"", what, msg, why);
}

static void test_bad_corpus(void **state)
{
    (void)state;
    const char *bad = DATA_DIR "/bad";
    DIR *d = opendir(bad);
    assert_non_null(d);
    int files = 0, explained = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *dot = strrchr(e->d_name, '.');
        if (e->d_name[0] == '.' || dot == NULL || strcmp(dot, ".safetensors") != 0)
            continue;
        const char *why = NULL;
        size_t stem = (size_t)(dot - e->d_name);
        for (size_t k = 0; k < sizeof expected_reason / sizeof expected_reason[0]; k++)
            if (strlen(expected_reason[k].file) == stem &&
                strncmp(expected_reason[k].file, e->d_name, stem) == 0)
                why = expected_reason[k].why;
        explained += why != NULL;
        files++;

        char *path = path_join(bad, e->d_name);
        mgt_st_file *f = (mgt_st_file *)&f; /* must come back NULL */
        mgt_error_clear();
        mgt_status st = mgt_st_open(path, &f);
        expect_refused(st, f, path, why);

        /* the same bytes from memory, with no slack after them for an over-read to hit */
        size_t len;
        unsigned char *buf = read_all(path, &len);
        unsigned char *exact = malloc(len ? len : 1);
        assert_non_null(exact);
        memcpy(exact, buf, len);
        f = (mgt_st_file *)&f;
        mgt_error_clear();
        st = mgt_st_parse(exact, len, e->d_name, &f);
        expect_refused(st, f, e->d_name, why);
        free(exact);
        free(buf);
        free(path);
    }
    closedir(d);
    /* every reason in the table has its file, so none can silently vanish from the corpus */
    assert_int_equal(explained, (int)(sizeof expected_reason / sizeof expected_reason[0]));
    assert_true(files >= explained);
}

/* Every proper prefix of a valid file is refused: the tensors must reach the end exactly. */
static void test_truncations(void **state)
{
    (void)state;
    size_t len;
    unsigned char *buf = read_all(DATA_DIR "/good/torch_like.safetensors", &len);
    for (size_t n = 0; n < len; n++) {
        mgt_st_file *f = NULL;
        mgt_error_clear();
        if (mgt_st_parse(buf, n, "prefix", &f) == MGT_OK)
            fail_msg("a %zu-byte prefix of a %zu-byte file was accepted", n, len);
        assert_true(mgt_error_last()[0] != '\0');
    }
    free(buf);
}

/* Single-byte corruptions anywhere in a valid file: some survive (a changed data byte or
   letter in a name), none may crash or read out of bounds, and whatever parses must be
   self-consistent. */
static void test_byte_flips(void **state)
{
    (void)state;
    size_t len;
    unsigned char *buf = read_all(DATA_DIR "/good/torch_like.safetensors", &len);
    static const unsigned char replace[] = {0x00, 0x22, 0x2c, 0x30, 0x39, 0x5b,
                                            0x5d, 0x7b, 0x7d, 0x80, 0xff};
    int accepted = 0;
    for (size_t at = 0; at < len; at++) {
        for (size_t r = 0; r < sizeof replace; r++) {
            unsigned char *copy = malloc(len);
            assert_non_null(copy);
            memcpy(copy, buf, len);
            copy[at] = replace[r];
            mgt_st_file *f = NULL;
            if (mgt_st_parse(copy, len, "flip", &f) == MGT_OK) {
                accepted++;
                size_t total = 0;
                for (int i = 0; i < mgt_st_count(f); i++)
                    total += mgt_st_tensor_bytes(f, i);
                assert_true(total <= len);
                mgt_st_close(f);
            } else {
                assert_true(mgt_error_last()[0] != '\0');
            }
            free(copy);
        }
    }
    assert_true(accepted > 0);
    free(buf);
}

static void test_open_errors(void **state)
{
    (void)state;
    mgt_st_file *f = NULL;
    mgt_error_clear();
    assert_int_equal(mgt_st_open(DATA_DIR "/no/such.safetensors", &f), MGT_ERR_IO);
    assert_null(f);
    assert_non_null(strstr(mgt_error_last(), "no/such.safetensors"));
    assert_int_equal(mgt_st_open(DATA_DIR "/good", &f), MGT_ERR_INVALID);
    assert_non_null(strstr(mgt_error_last(), "not a regular file"));
    /* a FIFO with no writer would block a plain open forever */
    char *dir = make_temp_dir();
    char *fifo = path_join(dir, "fifo.safetensors");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(mgt_st_open(fifo, &f), MGT_ERR_INVALID);
    assert_non_null(strstr(mgt_error_last(), "not a regular file"));
    remove_dir(dir);
    free(fifo);
    free(dir);
    assert_int_equal(mgt_st_open(NULL, &f), MGT_ERR_INVALID);
    assert_int_equal(mgt_st_parse(NULL, 8, NULL, &f), MGT_ERR_INVALID);
    assert_null(f);
}

static void test_writer_refuses(void **state)
{
    (void)state;
    mgt_st_writer *w = NULL;
    assert_int_equal(mgt_st_writer_create(&w), MGT_OK);
    const float x[2] = {1, 2};
    const int64_t two[1] = {2}, neg[1] = {-1}, big[3] = {INT64_C(1) << 30, INT64_C(1) << 30, 64};
    const int64_t huge[1] = {(INT64_C(1) << 53) + 1};
    assert_int_equal(mgt_st_writer_add(w, "a", MGT_ST_F32, 1, two, x), MGT_OK);
    assert_int_equal(mgt_st_writer_add(w, "a", MGT_ST_F32, 1, two, x), MGT_ERR_INVALID);
    assert_non_null(strstr(mgt_error_last(), "added twice"));
    assert_int_equal(mgt_st_writer_add(w, "__metadata__", MGT_ST_F32, 1, two, x), MGT_ERR_INVALID);
    assert_int_equal(mgt_st_writer_add(w, "bad\xff", MGT_ST_F32, 1, two, x), MGT_ERR_INVALID);
    assert_int_equal(mgt_st_writer_add(w, "b", MGT_ST_F32, 1, neg, x), MGT_ERR_INVALID);
    assert_int_equal(mgt_st_writer_add(w, "b", MGT_ST_F32, 1, huge, x), MGT_ERR_INVALID);
    assert_int_equal(mgt_st_writer_add(w, "b", MGT_ST_F64, 3, big, x), MGT_ERR_INVALID);
    assert_int_equal(mgt_st_writer_add(w, "b", MGT_ST_F32, 1, two, NULL), MGT_ERR_INVALID);
    assert_int_equal(mgt_st_writer_add(w, "b", MGT_ST_F32, 1, NULL, x), MGT_ERR_INVALID);
    assert_int_equal(mgt_st_writer_add(w, "b", MGT_ST_F32, -1, two, x), MGT_ERR_INVALID);
    assert_int_equal(mgt_st_writer_add(w, "b", (mgt_st_dtype)99, 1, two, x), MGT_ERR_INVALID);
    assert_int_equal(mgt_st_writer_set_metadata(w, "k", "\xc0\xaf"), MGT_ERR_INVALID);
    assert_int_equal(mgt_st_writer_set_metadata(w, NULL, "v"), MGT_ERR_INVALID);
    assert_int_equal(mgt_st_writer_save(w, ""), MGT_ERR_INVALID);
    mgt_st_writer_free(w);

    assert_int_equal(mgt_st_dtype_size(MGT_ST_BF16), 2);
    assert_int_equal(mgt_st_dtype_size((mgt_st_dtype)99), 0);
    assert_string_equal(mgt_st_dtype_name(MGT_ST_BOOL), "BOOL");
}

/* The writer names the first tensor holding a NaN or an infinity, in any float type, and
   counts them all: the checkpoint's guard against writing a diverged model over the last good
   one (issue 32: model_best.safetensors was written with an infinite running variance). */
static void test_writer_nonfinite(void **state)
{
    (void)state;
    mgt_st_writer *w = NULL;
    assert_int_equal(mgt_st_writer_create(&w), MGT_OK);
    const int64_t two[1] = {2};
    const float fine[2] = {1, -2}, var[2] = {0.5f, INFINITY}, w32[2] = {NAN, NAN};
    const double f64[2] = {-INFINITY, 0};
    const uint16_t f16[2] = {0x3c00, 0x7e00} /* 1, NaN */, bf16[2] = {0x3f80, 0xff80} /* 1, -inf */;
    const uint16_t ok16[2] = {0x7bff, 0xfbff}; /* the largest finite halves */
    const int32_t ints[2] = {-1, 0x7f800000};  /* an int's bits are no float's */
    size_t bad = 99;
    assert_int_equal(mgt_st_writer_add(w, "fc.weight", MGT_ST_F32, 1, two, fine), MGT_OK);
    assert_int_equal(mgt_st_writer_add(w, "half.ok", MGT_ST_F16, 1, two, ok16), MGT_OK);
    assert_int_equal(mgt_st_writer_add(w, "step", MGT_ST_I32, 1, two, ints), MGT_OK);
    assert_null(mgt_st_writer_nonfinite(w, &bad));
    assert_int_equal(bad, 0);
    assert_int_equal(mgt_st_writer_add(w, "bn1.running_var", MGT_ST_F32, 1, two, var), MGT_OK);
    assert_int_equal(mgt_st_writer_add(w, "conv1.weight", MGT_ST_F32, 1, two, w32), MGT_OK);
    assert_int_equal(mgt_st_writer_add(w, "x.f64", MGT_ST_F64, 1, two, f64), MGT_OK);
    assert_int_equal(mgt_st_writer_add(w, "x.f16", MGT_ST_F16, 1, two, f16), MGT_OK);
    assert_int_equal(mgt_st_writer_add(w, "x.bf16", MGT_ST_BF16, 1, two, bf16), MGT_OK);
    const char *first = mgt_st_writer_nonfinite(w, &bad);
    assert_non_null(first);
    assert_string_equal(first, "bn1.running_var");
    assert_int_equal(bad, 6);
    mgt_st_writer_free(w);
}

/* ---- failed saves ---- */

static const unsigned char old_contents[] = "the last good checkpoint";

static mgt_st_writer *big_writer(float **data, size_t n)
{
    mgt_st_writer *w = NULL;
    assert_int_equal(mgt_st_writer_create(&w), MGT_OK);
    *data = calloc(n, sizeof **data);
    assert_non_null(*data);
    const int64_t shape[1] = {(int64_t)n};
    assert_int_equal(mgt_st_writer_add(w, "fc.weight", MGT_ST_F32, 1, shape, *data), MGT_OK);
    return w;
}

static void expect_old_contents(const char *path)
{
    size_t len;
    unsigned char *back = read_all(path, &len);
    assert_int_equal(len, sizeof old_contents);
    assert_memory_equal(back, old_contents, len);
    free(back);
}

/* A temp file that cannot be created (its folder is a regular file) fails the save. */
static void test_save_into_missing_folder(void **state)
{
    (void)state;
    char *dir = make_temp_dir();
    char *path = path_join(dir, "ckpt.safetensors");
    char *under = path_join(path, "ckpt.safetensors");
    write_all(path, old_contents, sizeof old_contents);
    float *data;
    mgt_st_writer *w = big_writer(&data, 16);
    mgt_error_clear();
    assert_int_equal(mgt_st_writer_save(w, under), MGT_ERR_IO);
    assert_non_null(strstr(mgt_error_last(), under));
    assert_non_null(strstr(mgt_error_last(), "temp file"));
    expect_old_contents(path);
    assert_int_equal(count_entries(dir), 1);
    mgt_st_writer_free(w);
    free(data);
    remove_dir(dir);
    free(under);
    free(path);
    free(dir);
}

/* A write that fails half-way (a file-size limit makes it EFBIG) leaves the old file as it
   was and no temp file behind. */
static void test_save_failing_midway(void **state)
{
    (void)state;
    char *dir = make_temp_dir();
    char *path = path_join(dir, "ckpt.safetensors");
    write_all(path, old_contents, sizeof old_contents);
    float *data;
    mgt_st_writer *w = big_writer(&data, 1 << 18); /* 1 MiB of data */

    struct rlimit old;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    struct rlimit low = {64 * 1024, old.rlim_max};
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN); /* else the signal kills us */
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &low), 0);
    mgt_error_clear();
    mgt_status st = mgt_st_writer_save(w, path);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, old_handler);

    assert_int_equal(st, MGT_ERR_IO);
    assert_non_null(strstr(mgt_error_last(), path));
    assert_non_null(strstr(mgt_error_last(), strerror(EFBIG)));
    expect_old_contents(path);
    assert_int_equal(count_entries(dir), 1);

    /* and with the limit lifted the same writer replaces the file */
    assert_int_equal(mgt_st_writer_save(w, path), MGT_OK);
    assert_int_equal(count_entries(dir), 1);
    mgt_st_file *f = NULL;
    assert_int_equal(mgt_st_open(path, &f), MGT_OK);
    assert_int_equal(mgt_st_tensor_bytes(f, 0), (size_t)(1 << 18) * sizeof(float));
    mgt_st_close(f);

    mgt_st_writer_free(w);
    free(data);
    remove_dir(dir);
    free(path);
    free(dir);
}

/* A relative path (no folder part) saves in the working folder and syncs ".". */
static void test_save_relative_path(void **state)
{
    (void)state;
    char *dir = make_temp_dir();
    char cwd[4096];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(dir), 0);
    float *data;
    mgt_st_writer *w = big_writer(&data, 3);
    mgt_status st = mgt_st_writer_save(w, "rel.safetensors");
    assert_int_equal(chdir(cwd), 0);
    assert_int_equal(st, MGT_OK);
    assert_int_equal(count_entries(dir), 1);
    mgt_st_writer_free(w);
    free(data);
    remove_dir(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_empty_writer),
        cmocka_unit_test(test_golden_torch_like),
        cmocka_unit_test(test_golden_sloppy),
        cmocka_unit_test(test_bad_corpus),
        cmocka_unit_test(test_truncations),
        cmocka_unit_test(test_byte_flips),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_writer_refuses),
        cmocka_unit_test(test_writer_nonfinite),
        cmocka_unit_test(test_save_into_missing_folder),
        cmocka_unit_test(test_save_failing_midway),
        cmocka_unit_test(test_save_relative_path),
    };
    return cmocka_run_group_tests_name("safetensors", tests, NULL, NULL);
}
