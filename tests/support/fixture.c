/* Shared by the trainer tests: a temp folder, a small synthetic ImageFolder tree, mock devices
   and quiet progress output. */
#include <errno.h>
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>
#include <stb/stb_image_write.h>

#include "mgt/nn.h"
#include "support/fixture.h"

void mgt_test_make_dataset(char *root, size_t cap, const char *tag, const char *const *classes,
                           int n_classes, int n_train, int n_val, int side, uint32_t seed,
                           mgt_test_pixel_fn pixel)
{
    snprintf(root, cap, "/tmp/mgt-test-%s-XXXXXX", tag);
    assert_non_null(mkdtemp(root));
    static const char *const split[2] = {"train", "val"};
    char path[768];
    uint32_t h = seed;
    uint8_t *px = malloc((size_t)side * (size_t)side);
    assert_non_null(px);
    snprintf(path, sizeof path, "%s/data", root);
    assert_int_equal(mkdir(path, 0777), 0);
    for (int s = 0; s < 2; s++) {
        snprintf(path, sizeof path, "%s/data/%s", root, split[s]);
        assert_int_equal(mkdir(path, 0777), 0);
        for (int c = 0; c < n_classes; c++) {
            snprintf(path, sizeof path, "%s/data/%s/%s", root, split[s], classes[c]);
            assert_int_equal(mkdir(path, 0777), 0);
            for (int k = 0; k < (s == 0 ? n_train : n_val); k++) {
                for (int y = 0; y < side; y++)
                    for (int x = 0; x < side; x++) {
                        h = h * 1664525u + 1013904223u;
                        int v = pixel(c, x, y, h);
                        px[y * side + x] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
                    }
                snprintf(path, sizeof path, "%s/data/%s/%s/%03d.png", root, split[s], classes[c],
                         k);
                assert_true(stbi_write_png(path, side, side, 1, px, side));
            }
        }
    }
    free(px);
}

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int mgt_test_remove_tree(const char *root)
{
    if (getenv("MGT_KEEP_TEST_DIR"))
        return 0;
    /* a tree that is not there is removed, as `rm -rf` had it */
    return nftw(root, remove_one, 16, FTW_DEPTH | FTW_PHYS) == 0 || errno == ENOENT ? 0 : -1;
}

const char *mgt_test_path(const char *fmt, ...)
{
    static char bufs[8][4096];
    static int k;
    char *b = bufs[k++ & 7];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, 4096, fmt, ap);
    va_end(ap);
    return b;
}

void mgt_test_mkdirs(const char *path)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(tmp, 0755);
            *p = '/';
        }
    mkdir(tmp, 0755);
}

void mgt_test_parent_dirs(const char *path)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = 0;
        mgt_test_mkdirs(dir);
    }
}

void mgt_test_write_file(const char *path, const void *p, size_t n)
{
    mgt_test_parent_dirs(path);
    FILE *f = fopen(path, "wb");
    if (!f)
        fail_msg("%s: %s", path, strerror(errno));
    assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

uint8_t *mgt_test_read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("%s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    assert_true(len >= 0);
    uint8_t *b = malloc((size_t)len + 1);
    assert_non_null(b);
    *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

int mgt_test_convs_per_forward(void)
{
    mgt_devset *set = mgt_test_open_mock(1, "threads=1");
    mgt_model_config mc = {
        .arch = "resnet20", .classes = 4, .in_channels = 1, .image_size = 12, .batch = 2};
    mgt_model *m;
    if (mgt_model_create(&mc, mgt_devset_device(set, 0), &m) != MGT_OK)
        fail_msg("model: %s", mgt_error_last());
    int n, convs = 0;
    const mgt_model_layer *l = mgt_model_layers(m, &n);
    for (int i = 0; i < n; i++)
        convs += strcmp(l[i].kind, "conv") == 0;
    mgt_model_free(m);
    mgt_devset_free(set);
    return convs;
}

mgt_devset *mgt_test_open_mock(int n, const char *spec)
{
    int ids[MGT_MAX_DEVICES];
    for (int i = 0; i < n; i++)
        ids[i] = i;
    mgt_mock_options o;
    assert_int_equal(mgt_mock_options_parse(&o, spec), MGT_OK);
    mgt_devset *set;
    if (mgt_devset_open(MGT_DEVICE_MOCK, ids, n, &(mgt_devset_options){.mock = &o}, &set) != MGT_OK)
        fail_msg("open: %s", mgt_error_last());
    return set;
}

bool mgt_test_cuda_unavailable(const char *what)
{
    int count = 0;
    if (mgt_device_kind_probe(MGT_DEVICE_CUDA, &count) == MGT_OK)
        return false;
    const char *req = getenv("MGT_REQUIRE_CUDA");
    if (req && *req && strcmp(req, "0") != 0)
        fail_msg("%s: MGT_REQUIRE_CUDA=1 and %s", what, mgt_error_last());
    print_message("%s: skipped: %s\n", what, mgt_error_last());
    return true;
}

FILE *mgt_test_quiet(void)
{
    static FILE *f;
    if (getenv("MGT_TEST_VERBOSE"))
        return stdout;
    if (!f)
        f = fopen("/dev/null", "w");
    return f;
}

const char *mgt_test_python(void)
{
    const char *py = getenv("MGT_TEST_PYTHON");
    return py && *py ? py : "/usr/bin/python3";
}

bool mgt_test_python_has(const char *module)
{
    static char asked[4][32];
    static bool answer[4];
    for (int i = 0; i < 4 && asked[i][0]; i++)
        if (strcmp(asked[i], module) == 0)
            return answer[i];
    char cmd[512];
    snprintf(cmd, sizeof cmd, "'%s' -c 'import %s' >/dev/null 2>&1", mgt_test_python(), module);
    bool has = system(cmd) == 0;
    for (int i = 0; i < 4; i++)
        if (!asked[i][0]) {
            snprintf(asked[i], sizeof asked[i], "%s", module);
            answer[i] = has;
            break;
        }
    return has;
}

void mgt_test_skip_missing(const char *test, const char *what)
{
    const char *req = getenv("MGT_TEST_REQUIRE_DEPS");
    if (req && strcmp(req, "1") == 0)
        fail_msg("%s: %s is not available, and scripts/setup.sh --test installs it: under the "
                 "test command (MGT_TEST_REQUIRE_DEPS=1) this test must run, not skip",
                 test, what);
    print_message("%s: skipped: %s is not available (scripts/setup.sh --test installs it)\n", test,
                  what);
    skip();
}
