/* Tests of the trainer's checkpoints as files a user hands back: what a checkpoint holds,
   --resume refusing a malformed, missing or unknown training state with one message naming
   the file and the key, format-1 checkpoints still resuming, --pretrained taking the weights
   of a checkpoint (and ignoring its optimizer state) for another class count, PyTorch
   loading the state_dict with strict=True, and weights holding NaN or Inf refused at load,
   naming the tensor and the file. Each variant is written
   from one real checkpoint by changing one thing. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mgt/safetensors.h"
#include "mgt/train.h"
#include "support/fixture.h"

static char root[256];
static char data_dir[300];
static char base_ckpt[512]; /* one epoch of 2 steps on 1 device, momentum live */
static mgt_train_controls ctl;

static int corner(int c, int x, int y, uint32_t noise)
{
    int v = (int)(noise >> 27) * 4;
    return (c == 0 ? x < 6 && y < 6 : x >= 6 && y >= 6) ? v + 150 : v;
}

static void base_config(mgt_train_config *c)
{
    mgt_train_config_defaults(c);
    c->data_dir = data_dir;
    c->arch = "resnet20";
    c->batch_size = 8;
    c->epochs = 1;
    c->lr.lr = 0.05f;
    c->workers = 1;
    c->seed = 3;
    ctl = (mgt_train_controls){.out = mgt_test_quiet(), .max_steps = 2, .no_validation = true};
}

/* Runs c on one mock device; the error text survives the device set's free. */
static mgt_status run(mgt_train_config *c, mgt_train_result *res)
{
    mgt_devset *set = mgt_test_open_mock(1, "threads=1");
    mgt_status st = mgt_train_run(c, &ctl, set, res);
    char err[1024];
    snprintf(err, sizeof err, "%s", mgt_error_last());
    mgt_devset_free(set);
    mgt_error_set(st, "%s", err);
    return st;
}

static int setup(void **state)
{
    (void)state;
    static const char *const cls[2] = {"a", "b"};
    mgt_test_make_dataset(root, sizeof root, "checkpoint", cls, 2, 16, 4, 12, 99, corner);
    snprintf(data_dir, sizeof data_dir, "%s/data", root);
    mgt_train_config c;
    mgt_train_result res;
    base_config(&c);
    char dir[400];
    snprintf(dir, sizeof dir, "%s/base", root);
    c.checkpoint_dir = dir;
    if (run(&c, &res) != MGT_OK)
        fail_msg("%s", mgt_error_last());
    snprintf(base_ckpt, sizeof base_ckpt, "%s/checkpoint.safetensors", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return mgt_test_remove_tree(root);
}

/* What to change when copying a checkpoint. */
typedef struct change {
    const char *meta[3][2]; /* metadata {key, value} to set, or {key, NULL} to drop */
    const char *tensor;     /* a tensor whose element 1 becomes `bad` */
    float bad;
} change;

static const char *changed(const change *ch, const char *key, bool *hit)
{
    for (int i = 0; i < 3; i++)
        if (ch->meta[i][0] && strcmp(ch->meta[i][0], key) == 0) {
            *hit = true;
            return ch->meta[i][1];
        }
    *hit = false;
    return NULL;
}

/* Copies the base checkpoint to root/NAME with the changes; returns the new path (static). */
static const char *variant(const char *name, const change *ch)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", root, name);
    mgt_st_file *f;
    CHECK(mgt_st_open(base_ckpt, &f));
    mgt_st_writer *w;
    CHECK(mgt_st_writer_create(&w));
    void *copy = NULL;
    for (int i = 0; i < mgt_st_count(f); i++) {
        const char *n = mgt_st_tensor_name(f, i);
        const void *data = mgt_st_tensor_data(f, i);
        if (ch->tensor && strcmp(n, ch->tensor) == 0) {
            copy = malloc(mgt_st_tensor_bytes(f, i));
            assert_non_null(copy);
            memcpy(copy, data, mgt_st_tensor_bytes(f, i));
            memcpy((char *)copy + sizeof(float), &ch->bad, sizeof(float));
            data = copy;
        }
        CHECK(mgt_st_writer_add(w, n, mgt_st_tensor_dtype(f, i), mgt_st_tensor_ndim(f, i),
                                mgt_st_tensor_shape(f, i), data));
    }
    bool hit;
    for (int i = 0; i < mgt_st_metadata_count(f); i++)
        if (changed(ch, mgt_st_metadata_key(f, i), &hit), !hit)
            CHECK(mgt_st_writer_set_metadata(w, mgt_st_metadata_key(f, i),
                                             mgt_st_metadata_value(f, i)));
    for (int i = 0; i < 3; i++)
        if (ch->meta[i][0] && ch->meta[i][1])
            CHECK(mgt_st_writer_set_metadata(w, ch->meta[i][0], ch->meta[i][1]));
    CHECK(mgt_st_writer_save(w, path));
    mgt_st_writer_free(w);
    free(copy);
    mgt_st_close(f);
    return path;
}

static int count(const char *text, const char *what)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p += strlen(what))
        n++;
    return n;
}

/* --resume path must fail with status want and text that starts with "--resume PATH: ",
   holds that prefix once, and contains every one of the NULL-terminated needles. */
static void expect_resume_error(const char *path, mgt_status want, const char *const *needles)
{
    mgt_train_config c;
    mgt_train_result res;
    base_config(&c);
    c.resume = path;
    mgt_status st = run(&c, &res);
    const char *e = mgt_error_last();
    char prefix[600];
    snprintf(prefix, sizeof prefix, "--resume %s: ", path);
    if (st != want || strncmp(e, prefix, strlen(prefix)) != 0 || count(e, "--resume") != 1 ||
        count(e, path) != 1)
        fail_msg("--resume %s: status %d (expected %d), text: %s", path, st, want, e);
    for (; *needles; needles++)
        if (!strstr(e, *needles))
            fail_msg("--resume %s: expected \"%s\" in: %s", path, *needles, e);
}

/* The file holds the state_dict, the optimizer's state and the training state, and says
   "format": "pt" as PyTorch's writer does. */
static void test_checkpoint_contents(void **state)
{
    (void)state;
    mgt_st_file *f;
    CHECK(mgt_st_open(base_ckpt, &f));
    static const char *const meta[][2] = {{"format", "pt"},
                                          {"mgtrain_format", "3"},
                                          {"optimizer", "sgd"},
                                          {"epoch", "1"},
                                          {"step", "0"},
                                          {"seed", "3"},
                                          {"batch_size", "8"},
                                          {"devices", "1"},
                                          {"arch", "resnet20"},
                                          {"optimizer_steps", "2"},
                                          {"model_ema_n_averaged", "0"}};
    for (size_t i = 0; i < sizeof meta / sizeof *meta; i++) {
        const char *v = mgt_st_metadata_get(f, meta[i][0]);
        if (!v || strcmp(v, meta[i][1]) != 0)
            fail_msg("metadata %s is %s, expected %s", meta[i][0], v ? v : "(missing)", meta[i][1]);
    }
    assert_true(mgt_st_find(f, "conv1.weight") >= 0);
    assert_true(mgt_st_find(f, "layer3.2.bn2.num_batches_tracked") >= 0);
    assert_true(mgt_st_find(f, "fc.bias") >= 0);
    assert_true(mgt_st_find(f, "optimizer.momentum_buffer") >= 0);
    mgt_st_close(f);
}

/* A missing or corrupt file: one "--resume PATH: " and the real cause. */
static void test_resume_message_has_one_prefix(void **state)
{
    (void)state;
    char missing[512], corrupt[512];
    snprintf(missing, sizeof missing, "%s/no-such.safetensors", root);
    expect_resume_error(missing, MGT_ERR_IO,
                        (const char *const[]){"No such file or directory", NULL});
    snprintf(corrupt, sizeof corrupt, "%s/corrupt.safetensors", root);
    FILE *f = fopen(corrupt, "w");
    assert_non_null(f);
    static const char bytes[] = "\x10\x00\x00\x00\x00\x00\x00\x00{\"a\": [1, 2";
    fwrite(bytes, 1, sizeof bytes - 1, f);
    fclose(f);
    expect_resume_error(corrupt, MGT_ERR_INVALID, (const char *const[]){"header", NULL});
}

/* Every required field, malformed or missing, is an error naming the file and the key (the
   old reader took a malformed epoch or step as 0 and started over silently). */
static void test_resume_refuses_malformed_state(void **state)
{
    (void)state;
    static const struct {
        const char *key, *value, *says;
    } bad[] = {
        {"epoch", "3x", "expected a whole number"},
        {"epoch", "-1", "from 0"},
        {"step", "", "expected a whole number"},
        {"step", "1e3", "expected a whole number"},
        {"best_acc1", "NaN", "expected a number"},
        {"best_acc1", "101", "to 100"},
        {"seed", "-5", "expected a whole number"},
        {"batch_size", "0", "from 1"},
        {"devices", "two", "expected a whole number"},
        {"epoch", NULL, "is missing"},
        {"step", NULL, "is missing"},
        {"optimizer", NULL, "is missing"},
        {"optimizer", "adamw", "optimizer adamw"},
        {"arch", "resnet56", "a checkpoint of resnet56"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char name[64], key[80];
        snprintf(name, sizeof name, "bad-%zu.safetensors", i);
        const char *path = variant(name, &(change){.meta = {{bad[i].key, bad[i].value}}});
        snprintf(key, sizeof key, "\"%s\"", bad[i].key);
        bool named = strcmp(bad[i].key, "optimizer") == 0 && bad[i].value;
        named = named || strcmp(bad[i].key, "arch") == 0;
        /* -a that contradicts the checkpoint's architecture is the command line's error */
        mgt_status want = strcmp(bad[i].key, "arch") == 0 ? MGT_ERR_USAGE : MGT_ERR_INVALID;
        expect_resume_error(path, want,
                            (const char *const[]){bad[i].says, named ? bad[i].says : key, NULL});
    }
    /* what is written for people alone may be absent */
    const char *path = variant("no-sampler.safetensors", &(change){.meta = {{"sampler", NULL}}});
    mgt_train_config c;
    mgt_train_result res;
    base_config(&c);
    c.epochs = 2;
    c.resume = path;
    CHECK(run(&c, &res));
}

/* Format 1 (what mgtrain wrote before: "format" said the version, no optimizer key) still
   resumes; a newer or unknown format, and a file without training state, are refused. */
static void test_resume_formats(void **state)
{
    (void)state;
    /* what format 1 wrote: "format" said the version; no mgtrain_format, no optimizer */
    const char *path =
        variant("format1.safetensors", &(change){.meta = {{"format", "mgtrain checkpoint 1"},
                                                          {"mgtrain_format", NULL},
                                                          {"optimizer", NULL}}});
    char v1[512];
    snprintf(v1, sizeof v1, "%s", path);
    mgt_train_config c;
    mgt_train_result res;
    base_config(&c);
    c.epochs = 2;
    c.resume = v1;
    CHECK(run(&c, &res));
    assert_int_equal(res.epochs_done, 1); /* epoch 1 of 2, after the saved epoch 0 */

    /* format 2: no loss-scaling state, which then starts afresh */
    path = variant("format2.safetensors", &(change){.meta = {{"mgtrain_format", "2"},
                                                             {"loss_scale", NULL},
                                                             {"loss_scale_growth", NULL}}});
    char v2[512];
    snprintf(v2, sizeof v2, "%s", path);
    c.resume = v2;
    CHECK(run(&c, &res));
    assert_int_equal(res.epochs_done, 1);
    /* format 3 requires them */
    path = variant("format3_noscale.safetensors", &(change){.meta = {{"loss_scale", NULL}}});
    expect_resume_error(path, MGT_ERR_INVALID,
                        (const char *const[]){"loss_scale", "is missing", NULL});
    /* format 2: no optimizer step count (SGD's state is live when it is there), no EMA */
    path = variant("format2.safetensors", &(change){.meta = {{"mgtrain_format", "2"},
                                                             {"optimizer_steps", NULL},
                                                             {"model_ema_n_averaged", NULL}}});
    snprintf(v1, sizeof v1, "%s", path);
    base_config(&c);
    c.epochs = 2;
    c.resume = v1;
    CHECK(run(&c, &res));
    assert_int_equal(res.epochs_done, 1);
    /* format 3 requires the step count */
    path = variant("nosteps.safetensors", &(change){.meta = {{"optimizer_steps", NULL}}});
    expect_resume_error(path, MGT_ERR_INVALID, (const char *const[]){"optimizer_steps", NULL});

    path = variant("format4.safetensors", &(change){.meta = {{"mgtrain_format", "4"}}});
    expect_resume_error(path, MGT_ERR_UNSUPPORTED,
                        (const char *const[]){"newer mgtrain", "format 4", NULL});
    path =
        variant("format9.safetensors",
                &(change){.meta = {{"format", "mgtrain checkpoint 9"}, {"mgtrain_format", NULL}}});
    expect_resume_error(path, MGT_ERR_INVALID, (const char *const[]){"does not know", NULL});
    path = variant("weights.safetensors", &(change){.meta = {{"mgtrain_format", NULL}}});
    expect_resume_error(path, MGT_ERR_INVALID,
                        (const char *const[]){"not an mgtrain checkpoint", "--pretrained", NULL});
}

/* A checkpoint whose step lies beyond this run's steps per epoch (saved mid-epoch by a run
   with more steps: --max-steps, -b or the data changed) says so and goes on at the next
   epoch (before: silently); one at or past --epochs leaves nothing to train and is refused
   (before: "epochs 5 to 1", nothing trained, success). */
static void test_resume_past_the_epoch(void **state)
{
    (void)state;
    const char *path =
        variant("step5.safetensors", &(change){.meta = {{"epoch", "0"}, {"step", "5"}}});
    char p5[512];
    snprintf(p5, sizeof p5, "%s", path);
    mgt_train_config c;
    mgt_train_result res;
    base_config(&c);
    c.epochs = 2;
    c.resume = p5;
    char *text = NULL;
    size_t len = 0;
    ctl.out = open_memstream(&text, &len);
    assert_non_null(ctl.out);
    mgt_status st = run(&c, &res);
    fclose(ctl.out);
    if (st != MGT_OK)
        fail_msg("%s", mgt_error_last());
    if (!strstr(text, "past this run's 2 steps per epoch") || !strstr(text, "goes on at epoch 1"))
        fail_msg("no word of the step past the epoch:\n%s", text);
    free(text);
    assert_int_equal(res.epochs_done, 1); /* epoch 1 only */
    /* the base checkpoint is at epoch 1: --epochs 1 leaves nothing */
    base_config(&c);
    c.epochs = 1;
    c.resume = base_ckpt;
    assert_int_equal(run(&c, &res), MGT_ERR_USAGE);
    if (!strstr(mgt_error_last(), "nothing is left to train"))
        fail_msg("%s", mgt_error_last());
}

/* NaN or Inf in the weights or the optimizer's state is refused at load, naming the tensor,
   for --resume and --pretrained (before, such weights trained into a NaN loss). */
static void test_non_finite_state_refused(void **state)
{
    (void)state;
    const char *path =
        variant("nan.safetensors", &(change){.tensor = "layer2.1.conv1.weight", .bad = NAN});
    char nan_path[512];
    snprintf(nan_path, sizeof nan_path, "%s", path);
    expect_resume_error(
        nan_path, MGT_ERR_INVALID,
        (const char *const[]){"layer2.1.conv1.weight holds NaN at element 1", NULL});
    path = variant("inf.safetensors",
                   &(change){.tensor = "optimizer.momentum_buffer", .bad = -INFINITY});
    expect_resume_error(path, MGT_ERR_INVALID,
                        (const char *const[]){"optimizer.momentum_buffer holds Inf", NULL});

    mgt_train_config c;
    mgt_train_result res;
    base_config(&c);
    c.pretrained = nan_path;
    assert_int_equal(run(&c, &res), MGT_ERR_INVALID);
    const char *e = mgt_error_last();
    char prefix[600];
    snprintf(prefix, sizeof prefix, "--pretrained %s: ", nan_path);
    if (strncmp(e, prefix, strlen(prefix)) != 0 || !strstr(e, "layer2.1.conv1.weight holds NaN"))
        fail_msg("--pretrained of NaN weights: %s", e);
}

/* --pretrained given an mgtrain checkpoint for a model of another class count: the weights
   and buffers load, fc keeps its own, the optimizer state and metadata are ignored, and one
   line says so (before, it failed: "optimizer.momentum_buffer: unexpected"). With the same
   class count fc loads too. */
static void test_pretrained_from_a_checkpoint(void **state)
{
    (void)state;
    for (int classes = 5; classes >= 2; classes -= 3) {
        char out_path[512];
        snprintf(out_path, sizeof out_path, "%s/pretrained-%d.txt", root, classes);
        FILE *out = fopen(out_path, "w+");
        assert_non_null(out);
        mgt_train_config c;
        mgt_train_result res;
        base_config(&c);
        c.data_dir = NULL;
        c.dummy = true;
        c.dummy_classes = classes;
        c.dummy_channels = 1;
        c.image_size = 12;
        c.dummy_steps = 1;
        c.pretrained = base_ckpt;
        ctl.out = out;
        mgt_status st = run(&c, &res);
        char text[8192];
        rewind(out);
        size_t got = fread(text, 1, sizeof text - 1, out);
        text[got] = '\0';
        fclose(out);
        if (st != MGT_OK)
            fail_msg("--pretrained into %d classes: %s", classes, mgt_error_last());
        char line[700];
        snprintf(line, sizeof line,
                 "=> %s is an mgtrain checkpoint: --pretrained took its weights and buffers and "
                 "ignored its optimizer state (1 tensor) and training metadata (epoch 1 step 0)",
                 base_ckpt);
        if (!strstr(text, line))
            fail_msg("expected \"%s\" in:\n%s", line, text);
        bool kept_fc = strstr(text, "=> new head: fc re-initialised") != NULL;
        if (kept_fc != (classes != 2))
            fail_msg("%d classes: fc %s:\n%s", classes, kept_fc ? "kept" : "loaded", text);
    }
}

/* A PyTorch user loads the checkpoint into the architecture's model with strict=True once
   the optimizer's tensors are set aside (scripts/check_checkpoint_torch.py); skips where
   the test's Python has no torch (a failure under the test command). */
static void test_checkpoint_loads_in_pytorch(void **state)
{
    (void)state;
    if (!mgt_test_python_has("torch"))
        mgt_test_skip_missing("test_checkpoint_loads_in_pytorch", "PyTorch (python3-torch)");
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "'%s' " MGT_TEST_DATA_DIR "/../../scripts/check_checkpoint_torch.py "
             "'%s'",
             mgt_test_python(), base_ckpt);
    assert_int_equal(system(cmd), 0);
    /* with --model-ema and AdamW: the EMA model loads strictly too */
    mgt_train_config c;
    mgt_train_result res;
    char dir[400], path[512];
    snprintf(dir, sizeof dir, "%s/ema", root);
    base_config(&c);
    c.opt = MGT_OPT_ADAMW;
    c.model_ema = true;
    c.model_ema_steps = 1;
    c.checkpoint_dir = dir;
    CHECK(run(&c, &res));
    snprintf(path, sizeof path, "%s/checkpoint.safetensors", dir);
    snprintf(cmd, sizeof cmd,
             "'%s' " MGT_TEST_DATA_DIR "/../../scripts/check_checkpoint_torch.py "
             "'%s' | grep -q 'EMA model loaded'",
             mgt_test_python(), path);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checkpoint_contents),
        cmocka_unit_test(test_checkpoint_loads_in_pytorch),
        cmocka_unit_test(test_resume_message_has_one_prefix),
        cmocka_unit_test(test_resume_refuses_malformed_state),
        cmocka_unit_test(test_resume_formats),
        cmocka_unit_test(test_resume_past_the_epoch),
        cmocka_unit_test(test_non_finite_state_refused),
        cmocka_unit_test(test_pretrained_from_a_checkpoint),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
