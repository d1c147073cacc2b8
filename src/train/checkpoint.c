/* Checkpoints: the training state (train_state, train_impl.h) saved and loaded through one
 * table of its metadata fields (so save and load cannot drift apart), beside the model's
 * torchvision-named state_dict and the optimizer's state tensors; --resume.
 *
 * Format 3 (this one) adds the optimizer's step count (AdamW's bias correction needs it),
 * the EMA model's n_averaged beside its "model_ema." tensors, and fp16 loss scaling's state
 * (loss_scale, loss_scale_growth; a format-2 file resumes with GradScaler's start). Format 2
 * keeps "format": "pt", as PyTorch's safetensors writer stores it, and says
 * "mgtrain_format": "2"; format 1 ("format": "mgtrain checkpoint 1", no optimizer key,
 * SGD) is still read. Every field is parsed strictly: a malformed or missing value is an
 * error naming the file and the key, never a silent 0. New state (a loss scale, a rank) is
 * one field in train_state and one row in fields[], with the format it first appears in.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/train_impl.h"

#define CKPT_FORMAT 3
#define CKPT_FORMAT_1 "mgtrain checkpoint 1"

/* F_EXACT: a double written with all its digits (%.17g), read back to the same bits */
typedef enum field_kind { F_INT, F_LONG, F_U64, F_DOUBLE, F_EXACT, F_TEXT } field_kind;

typedef struct state_field {
    const char *key;
    field_kind kind;
    size_t offset, size;
    int since;      /* the first format that has it; required from then on */
    double lo, hi;  /* the numbers allowed */
    bool info_only; /* written for people, never required */
} state_field;

#define FIELD(key, kind, member, since, lo, hi)                                                  \
    {                                                                                            \
        key, kind, offsetof(train_state, member), sizeof(((train_state *)0)->member), since, lo, \
            hi, false                                                                            \
    }
#define INFO(key, member)                                                                        \
    {                                                                                            \
        key, F_TEXT, offsetof(train_state, member), sizeof(((train_state *)0)->member), 1, 0, 0, \
            true                                                                                 \
    }

static const state_field fields[] = {
    FIELD("epoch", F_INT, epoch, 1, 0, 1e9),
    FIELD("step", F_LONG, step, 1, 0, 1e15),
    FIELD("best_acc1", F_DOUBLE, best_acc1, 1, 0, 100),
    FIELD("seed", F_U64, seed, 1, 0, 1.8e19),
    FIELD("batch_size", F_INT, batch_size, 1, 1, 1 << 30),
    FIELD("devices", F_INT, devices, 1, 1, 1 << 20),
    FIELD("optimizer", F_TEXT, optimizer, 2, 0, 0),
    FIELD("loss_scale", F_EXACT, loss_scale, 3, 0, 3.4e38),
    FIELD("loss_scale_growth", F_INT, loss_scale_growth, 3, 0, MGT_SCALER_INTERVAL),
    INFO("amp", amp),
    FIELD("optimizer_steps", F_LONG, optimizer_steps, 3, 0, 1e15),
    FIELD("model_ema_n_averaged", F_LONG, ema_n_averaged, 3, 0, 1e15),
    INFO("lr_schedule", lr_schedule),
    INFO("sampler", sampler),
    INFO("sync_bn", sync_bn),
    INFO("devices_lost", devices_lost),
    INFO("transform_input", transform_input),
};

static mgt_status field_write(mgt_st_writer *w, const state_field *f, const train_state *s)
{
    const char *p = (const char *)s + f->offset;
    char buf[192];
    switch (f->kind) {
    case F_INT: snprintf(buf, sizeof buf, "%d", *(const int *)p); break;
    case F_LONG: snprintf(buf, sizeof buf, "%ld", *(const long *)p); break;
    case F_U64: snprintf(buf, sizeof buf, "%" PRIu64, *(const uint64_t *)p); break;
    case F_DOUBLE: snprintf(buf, sizeof buf, "%.6f", *(const double *)p); break;
    case F_EXACT: snprintf(buf, sizeof buf, "%.17g", *(const double *)p); break;
    case F_TEXT: snprintf(buf, sizeof buf, "%s", p); break;
    }
    return mgt_st_writer_set_metadata(w, f->key, buf);
}

static mgt_status field_read(const mgt_st_file *file, const char *path, const state_field *f,
                             train_state *s)
{
    const char *v = mgt_st_metadata_get(file, f->key);
    char *p = (char *)s + f->offset;
    if (!v) {
        if (f->info_only || s->format < f->since)
            return MGT_OK;
        return mgt_error_set(MGT_ERR_INVALID,
                             "%s: metadata \"%s\" is missing (an mgtrain checkpoint of format %d "
                             "has it)",
                             path, f->key, s->format);
    }
    if (f->kind == F_TEXT) {
        if (strlen(v) >= f->size)
            return mgt_error_set(MGT_ERR_INVALID, "%s: metadata \"%s\" is longer than %zu bytes",
                                 path, f->key, f->size - 1);
        memcpy(p, v, strlen(v) + 1);
        return MGT_OK;
    }
    char *end;
    errno = 0;
    double x = 0;
    uint64_t u = 0;
    long long i = 0;
    if (f->kind == F_DOUBLE || f->kind == F_EXACT)
        x = strtod(v, &end);
    else if (f->kind == F_U64 && *v != '-')
        x = (double)(u = strtoull(v, &end, 10));
    else
        x = (double)(i = strtoll(v, &end, 10));
    bool whole = f->kind != F_DOUBLE && f->kind != F_EXACT;
    if (errno || end == v || *end || !isfinite(x) || x < f->lo || x > f->hi ||
        (f->kind == F_U64 && *v == '-'))
        return mgt_error_set(
            MGT_ERR_INVALID, "%s: metadata \"%s\" is '%.40s': expected %s from %.0f to %.*g", path,
            f->key, v, whole ? "a whole number" : "a number", f->lo, whole ? 20 : 6, f->hi);
    switch (f->kind) {
    case F_INT: *(int *)p = (int)i; break;
    case F_LONG: *(long *)p = (long)i; break;
    case F_U64: *(uint64_t *)p = u; break;
    case F_DOUBLE:
    case F_EXACT: *(double *)p = x; break;
    case F_TEXT: break;
    }
    return MGT_OK;
}

/* The file's format: 2 says so in mgtrain_format; 1 in "format". A file with neither holds
   no training state (torchvision weights, mgtrain's own model export). */
static mgt_status read_format(const mgt_st_file *f, const char *path, int *format)
{
    const char *v = mgt_st_metadata_get(f, "mgtrain_format");
    const char *old = mgt_st_metadata_get(f, "format");
    *format = 0;
    if (!v) {
        if (old && strcmp(old, CKPT_FORMAT_1) == 0)
            *format = 1;
        else if (old && strncmp(old, "mgtrain checkpoint", 18) == 0)
            return mgt_error_set(MGT_ERR_INVALID,
                                 "%s: metadata \"format\" is '%.40s', a format this mgtrain does "
                                 "not know (it reads 1 to %d)",
                                 path, old, CKPT_FORMAT);
        return MGT_OK;
    }
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < 1)
        return mgt_error_set(MGT_ERR_INVALID,
                             "%s: metadata \"mgtrain_format\" is '%.40s': expected a whole "
                             "number from 1",
                             path, v);
    if (x > CKPT_FORMAT)
        return mgt_error_set(MGT_ERR_UNSUPPORTED,
                             "%s: written by a newer mgtrain (checkpoint format %ld; this one "
                             "reads 1 to %d)",
                             path, x, CKPT_FORMAT);
    *format = (int)x;
    return MGT_OK;
}

mgt_status train_state_read(const mgt_st_file *f, const char *path, train_state *s)
{
    memset(s, 0, sizeof *s);
    mgt_status st = read_format(f, path, &s->format);
    if (st != MGT_OK || s->format == 0)
        return st;
    if (s->format == 1)
        snprintf(s->optimizer, sizeof s->optimizer, "sgd"); /* format 1 knew no other */
    for (size_t i = 0; i < sizeof fields / sizeof *fields && st == MGT_OK; i++)
        st = field_read(f, path, &fields[i], s);
    return st;
}

/* ---- save ---- */

/* Copies the optimizer's live state to host buffers (*host, malloc'd) and adds it to w. */
static mgt_status add_optimizer(run *r, mgt_st_writer *wr, float **host)
{
    worker *w0 = &r->w[0];
    train_opt_tensor t[TRAIN_MAX_OPT_TENSORS];
    int nt = train_optim_live(&w0->opt) ? train_optim_state(&w0->opt, t) : 0;
    size_t total = 0;
    for (int k = 0; k < nt; k++)
        total += t[k].floats;
    *host = malloc((total ? total : 1) * sizeof(float));
    if (!*host)
        return mgt_error_set(MGT_ERR_OOM, "checkpoint: host memory exhausted");
    mgt_status st = MGT_OK;
    float *at = *host;
    for (int k = 0; k < nt && st == MGT_OK; k++) {
        st = mgt_copy_d2h(w0->s, at, t[k].dev, t[k].floats * sizeof(float));
        int64_t shape[1] = {(int64_t)t[k].floats};
        if (st == MGT_OK) /* the writer borrows the host copy, filled by the sync below */
            st = mgt_st_writer_add(wr, t[k].name, MGT_ST_F32, 1, shape, at);
        at += t[k].floats;
    }
    if (st == MGT_OK)
        st = mgt_stream_synchronize(w0->s, &r->abort);
    return st;
}

static void fill_state(run *r, int next_epoch, long next_step, train_state *s)
{
    const mgt_lr_config *lr = &r->lr;
    *s = (train_state){.format = CKPT_FORMAT,
                       .epoch = next_epoch,
                       .step = next_step,
                       .best_acc1 = r->best_acc1,
                       .seed = r->c->seed,
                       .batch_size = r->data.per_dev_batch * r->wn,
                       .devices = r->wn,
                       .loss_scale = r->scaler.scale,
                       .loss_scale_growth = r->scaler.growth,
                       .optimizer_steps = train_optim_steps(&r->w[0].opt),
                       .ema_n_averaged = r->w[0].ema.n_averaged};
    snprintf(s->amp, sizeof s->amp, "%s", mgt_precision_name(r->c->amp));
    snprintf(s->sync_bn, sizeof s->sync_bn, "%s", r->c->sync_bn ? "yes" : "no");
    snprintf(s->transform_input, sizeof s->transform_input, "%s",
             mgt_model_get_config(r->w[0].model)->transform_input ? "on" : "off");
    snprintf(s->optimizer, sizeof s->optimizer, "%s", train_optim_kind(&r->w[0].opt));
    snprintf(s->lr_schedule, sizeof s->lr_schedule,
             "%s lr %g step %d gamma %g min %g epochs %d warmup %g (%s, decay %g)",
             mgt_lr_kind_name(lr->kind), lr->lr, lr->step_epochs, lr->gamma, lr->lr_min, lr->epochs,
             lr->warmup_epochs,
             lr->warmup_method == MGT_LR_WARMUP_PER_STEP ? "per step"
             : lr->warmup_method == MGT_LR_WARMUP_LINEAR ? "linear"
                                                         : "constant",
             lr->warmup_decay);
    /* the epoch's shuffle is seed + epoch, and `step` batches of every shard are done */
    snprintf(s->sampler, sizeof s->sampler, "epoch %d batch %ld of %ld", next_epoch, next_step,
             r->data.steps_per_epoch);
    size_t len = 0;
    for (int i = 0; i < r->nlost && len < sizeof s->devices_lost; i++)
        len += (size_t)snprintf(s->devices_lost + len, sizeof s->devices_lost - len,
                                "%s%s at epoch %d step %ld (%s)", i ? "; " : "", r->lost[i].name,
                                r->lost[i].epoch, r->lost[i].step, r->lost[i].phase);
}

/* --keep-last N: the epoch checkpoints model_<epoch>.safetensors of epochs before the last N
   go (those a run with a larger N left too). */
static void prune_epochs(run *r, int last_epoch)
{
    const char *dir = r->c->checkpoint_dir;
    DIR *dp = opendir(dir);
    if (!dp)
        return;
    struct dirent *e;
    while ((e = readdir(dp)) != NULL) {
        int ep, len = 0;
        if (sscanf(e->d_name, "model_%d.safetensors%n", &ep, &len) != 1 ||
            (size_t)len != strlen(e->d_name) || ep > last_epoch - r->c->keep_last)
            continue;
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) != 0)
            fprintf(r->out, "=> warning: --keep-last %d: cannot remove %s: %s\n", r->c->keep_last,
                    path, strerror(errno));
    }
    closedir(dp);
}

/* A checkpoint's writer and the host copies its tensors borrow. */
typedef struct checkpoint_parts {
    mgt_st_writer *wr;
    void *staging, *ema_host;
    float *opt_host;
} checkpoint_parts;

static void checkpoint_parts_free(checkpoint_parts *cp)
{
    mgt_st_writer_free(cp->wr);
    free(cp->staging);
    free(cp->opt_host);
    free(cp->ema_host);
}

/* Replica 0's state at (next_epoch, next_step) in a writer, checked finite (where: what a
   refusal says nothing was written over). */
static mgt_status checkpoint_build(run *r, int next_epoch, long next_step, const char *where,
                                   checkpoint_parts *cp)
{
    worker *w0 = &r->w[0];
    train_state s;
    fill_state(r, next_epoch, next_step, &s);
    mgt_status st = mgt_st_writer_create(&cp->wr);
    mgt_st_writer *wr = cp->wr;
    if (st == MGT_OK)
        st = mgt_model_add_to_writer(w0->model, w0->s, wr, &cp->staging);
    if (st == MGT_OK)
        st = train_add_model_info(r, wr);
    if (st == MGT_OK)
        st = add_optimizer(r, wr, &cp->opt_host);
    if (st == MGT_OK)
        st = train_ema_add_to_writer(r, wr, &cp->ema_host);
    if (st == MGT_OK)
        st = mgt_st_writer_set_metadata(wr, "mgtrain_format", "3");
    for (size_t i = 0; i < sizeof fields / sizeof *fields && st == MGT_OK; i++)
        st = field_write(wr, &fields[i], &s);
    size_t bad = 0;
    const char *first = st == MGT_OK ? mgt_st_writer_nonfinite(wr, &bad) : NULL;
    if (first) /* never a diverged model in place of the last good checkpoint */
        st = mgt_error_set(MGT_ERR_DEVICE,
                           "the model has diverged: %zu NaN or infinite values (the first in "
                           "%s); nothing was written over %s",
                           bad, first, where);
    return st;
}

mgt_status train_checkpoint_save(run *r, int next_epoch, long next_step, bool is_best, double acc1)
{
    const char *dir = r->c->checkpoint_dir;
    if (!dir || !r->primary) /* node 0 writes the world's (every replica holds the same) */
        return MGT_OK;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return mgt_error_set(MGT_ERR_IO, "--checkpoint-dir %s: %s", dir, strerror(errno));
    checkpoint_parts cp = {0};
    char path[4200], best[4200], kept[4200];
    snprintf(path, sizeof path, "%s/checkpoint.safetensors", dir);
    snprintf(best, sizeof best, "%s/model_best.safetensors", dir);
    /* the references' model_<epoch>.pth: the epoch just completed */
    snprintf(kept, sizeof kept, "%s/model_%d.safetensors", dir, next_epoch - 1);
    bool keep = r->c->keep_last > 0 && next_step == 0 && next_epoch > 0;
    mgt_status st = checkpoint_build(r, next_epoch, next_step, dir, &cp);
    mgt_st_writer *wr = cp.wr;
    if (st == MGT_OK)
        st = mgt_st_writer_save(wr, path);
    if (st == MGT_OK && is_best)
        st = mgt_st_writer_save(wr, best);
    if (st == MGT_OK && keep)
        st = mgt_st_writer_save(wr, kept);
    if (st == MGT_OK) {
        snprintf(r->res->checkpoint, sizeof r->res->checkpoint, "%s", path);
        if (next_step == 0 && acc1 >= 0)
            fprintf(r->out, "=> saved %s (epoch %d, Acc@1 %.3f)%s%s%s%s\n", path, next_epoch - 1,
                    acc1, is_best ? ", the best so far: also " : "", is_best ? best : "",
                    keep ? ", and " : "", keep ? kept : "");
        else if (next_step == 0)
            fprintf(r->out, "=> saved %s (epoch %d)%s%s\n", path, next_epoch - 1,
                    keep ? ", and " : "", keep ? kept : "");
        else
            fprintf(r->out, "=> saved %s (epoch %d, step %ld of %ld)\n", path, next_epoch,
                    next_step, r->data.steps_per_epoch);
    }
    if (st == MGT_OK && keep)
        prune_epochs(r, next_epoch - 1);
    checkpoint_parts_free(&cp);
    return st;
}

mgt_status train_handover_save(run *r, const char *path, int next_epoch, long next_step)
{
    checkpoint_parts cp = {0};
    mgt_status st = checkpoint_build(r, next_epoch, next_step, path, &cp);
    if (st == MGT_OK)
        st = mgt_st_writer_save(cp.wr, path);
    checkpoint_parts_free(&cp);
    return st;
}

/* A fresh run in a folder that holds another run's checkpoints would overwrite them,
   model_best included, with a worse model: refused unless --resume (which continues that run)
   or --overwrite says so. */
mgt_status train_checkpoint_dir_check(run *r)
{
    const mgt_train_config *c = r->c;
    if (!c->checkpoint_dir || c->resume || c->overwrite || c->evaluate || !r->primary)
        return MGT_OK;
    static const char *const names[] = {"checkpoint.safetensors", "model_best.safetensors"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", c->checkpoint_dir, names[i]);
        if (access(path, F_OK) == 0)
            return mgt_error_set(MGT_ERR_USAGE,
                                 "--checkpoint-dir %s holds another run's checkpoints (%s): "
                                 "--resume auto continues that run, --overwrite starts afresh "
                                 "over them",
                                 c->checkpoint_dir, names[i]);
    }
    return MGT_OK;
}

/* ---- load ---- */

mgt_status train_flag_error(mgt_status st, const char *flag)
{
    char why[512];
    snprintf(why, sizeof why, "%s", mgt_error_last());
    return mgt_error_set(st, "%s %s", flag, why);
}

const char *const train_opt_prefixes[] = {TRAIN_OPT_PREFIX, TRAIN_EMA_PREFIX, NULL};

/* The optimizer's state from f into replica 0, each tensor checked (dtype, length, finite).
   A file without it (saved before the first step, or with momentum 0) leaves it fresh. */
static mgt_status load_optimizer(run *r, const mgt_st_file *f, const char *path,
                                 const train_state *s)
{
    worker *w0 = &r->w[0];
    train_opt_tensor t[TRAIN_MAX_OPT_TENSORS];
    int nt = train_optim_state(&w0->opt, t), found = 0;
    mgt_status st = MGT_OK;
    for (int k = 0; k < nt && st == MGT_OK; k++) {
        int i = mgt_st_find(f, t[k].name);
        if (i < 0)
            continue;
        found++;
        if (mgt_st_tensor_dtype(f, i) != MGT_ST_F32 ||
            mgt_st_tensor_bytes(f, i) != t[k].floats * sizeof(float))
            return mgt_error_set(MGT_ERR_INVALID,
                                 "%s: %s does not fit this model (%zu bytes of %s, expected %zu "
                                 "of F32)",
                                 path, t[k].name, mgt_st_tensor_bytes(f, i),
                                 mgt_st_dtype_name(mgt_st_tensor_dtype(f, i)),
                                 t[k].floats * sizeof(float));
        const unsigned char *data = mgt_st_tensor_data(f, i);
        for (size_t e = 0; e < t[k].floats; e++) {
            float v;
            memcpy(&v, data + e * sizeof v, sizeof v);
            if (!isfinite(v))
                return mgt_error_set(MGT_ERR_INVALID, "%s: %s holds %s at element %zu of %zu", path,
                                     t[k].name, isnan(v) ? "NaN" : "Inf", e, t[k].floats);
        }
        st = mgt_copy_h2d(w0->s, t[k].dev, data, t[k].floats * sizeof(float));
    }
    if (st == MGT_OK)
        st = mgt_stream_synchronize(w0->s, &r->abort);
    if (st == MGT_OK && found > 0 && found < nt)
        st = mgt_error_set(MGT_ERR_INVALID, "%s: holds %d of the %d optimizer state tensors", path,
                           found, nt);
    if (st == MGT_OK && found == 0 && nt > 0 && s->format >= 3 && s->optimizer_steps > 0)
        st = mgt_error_set(MGT_ERR_INVALID,
                           "%s: says %ld optimizer steps were done but holds no optimizer state",
                           path, s->optimizer_steps);
    /* before format 3 only SGD was saved, whose state is live once it is there */
    if (st == MGT_OK)
        train_optim_set_steps(&w0->opt, s->format >= 3 ? s->optimizer_steps : found > 0);
    return st;
}

/* A global step takes the next `batch` images of the epoch's one permutation, whatever the
   device count, so a run with another global batch goes on from the same image: the saved
   step's images, counted in this run's batches (an image of a cut batch is seen twice, none
   is skipped). */
static long rescale_step(run *r, const train_state *s)
{
    long batch = (long)r->data.per_dev_batch * r->wn, step = s->step;
    if (s->batch_size == batch)
        return step;
    fprintf(r->out,
            "=> warning: the checkpoint was trained with a global batch of %d (%d devices), "
            "this run uses %ld (%d devices)\n",
            s->batch_size, s->devices, batch, r->wn);
    if (step > 0) {
        long images = step * s->batch_size, now = images / batch;
        fprintf(r->out,
                "=> the epoch goes on from image %ld: step %ld of %ld-image steps (saved: step "
                "%ld of %d)\n",
                now * batch, now, batch, step, s->batch_size);
        step = now;
    }
    return step;
}

/* The checkpoint at path into replica 0: weights, optimizer state, where to go on. Errors
   start with path. */
static mgt_status load_checkpoint(run *r, const char *path, const mgt_st_file *f, int *epoch,
                                  long *step)
{
    train_state s;
    mgt_status st = train_state_read(f, path, &s);
    if (st != MGT_OK)
        return st;
    if (s.format == 0)
        return mgt_error_set(MGT_ERR_INVALID,
                             "%s: not an mgtrain checkpoint (its metadata holds no training "
                             "state); --pretrained starts from its weights",
                             path);
    const char *kind = train_optim_kind(&r->w[0].opt);
    /* plain and Nesterov SGD keep the same momentum buffer (format 2 called both "sgd") */
    bool both_sgd = strncmp(s.optimizer, "sgd", 3) == 0 && strncmp(kind, "sgd", 3) == 0;
    bool eval = r->c->evaluate; /* -e takes the model alone */
    if (strcmp(s.optimizer, kind) != 0 && !both_sgd && !eval)
        return mgt_error_set(MGT_ERR_INVALID,
                             "%s: holds the state of optimizer %s; this run uses %s", path,
                             s.optimizer, kind);
    const char *arch = mgt_st_metadata_get(f, "arch");
    if (arch && strcmp(arch, r->c->arch) != 0)
        return mgt_error_set(MGT_ERR_INVALID, "%s: a checkpoint of %s; this run trains %s", path,
                             arch, r->c->arch);
    worker *w0 = &r->w[0];
    /* the same weights behind another input map would be another model */
    const char *ti = mgt_model_get_config(w0->model)->transform_input ? "on" : "off";
    if (s.transform_input[0] && strcmp(s.transform_input, ti) != 0)
        return mgt_error_set(MGT_ERR_INVALID,
                             "%s: trained with transform_input %s, this run has it %s (under "
                             "--pretrained it is on): resume with --transform-input %s",
                             path, s.transform_input, ti, s.transform_input);
    mgt_model_load_options lo = {.ignore_prefixes = train_opt_prefixes};
    st = mgt_model_load(w0->model, w0->s, f, &lo, NULL);
    if (st != MGT_OK)
        return mgt_error_wrap(st, "%s", path);
    if (!eval)
        st = load_optimizer(r, f, path, &s);
    if (st == MGT_OK && !eval)
        st = train_ema_load(r, f, path, s.ema_n_averaged);
    if (st != MGT_OK)
        return st;
    *epoch = s.epoch;
    *step = eval ? 0 : rescale_step(r, &s);
    r->best_acc1 = s.best_acc1;
    if (s.format >= 3) /* older files: GradScaler's start, as a fresh run */
        r->scaler = (train_scaler){.scale = (float)s.loss_scale, .growth = s.loss_scale_growth};
    /* a change of precision is allowed (fp16 that overflows, going on in bf16) and said once:
       only fp16 reads the loss scale, and a non-fp16 run leaves it at its start */
    const char *now = mgt_precision_name(r->c->amp);
    if (s.amp[0] && strcmp(s.amp, now) != 0 && !eval)
        fprintf(r->out, "=> %s was saved by a run in %s%s; this one runs in %s%s%s\n", path, s.amp,
                strcmp(s.amp, "f32") ? " (--amp)" : "", now,
                r->c->amp != MGT_PREC_F32 ? " (--amp)" : "",
                strcmp(s.amp, "fp16") == 0 ? ": its loss scale is not used" : "");
    return MGT_OK;
}

mgt_status train_handover_load(run *r, const char *path)
{
    mgt_st_file *f = NULL;
    int epoch = 0;
    long step = 0;
    mgt_status st = mgt_st_open(path, &f);
    if (st == MGT_OK)
        st = load_checkpoint(r, path, f, &epoch, &step);
    mgt_st_close(f);
    return st;
}

mgt_status train_resume(run *r, int *epoch, long *step)
{
    const mgt_train_config *c = r->c;
    if (!c->resume)
        return MGT_OK;
    if (!r->resume_f) { /* --resume auto without a checkpoint there (train_open_sources) */
        fprintf(r->out,
                "=> --resume auto: no checkpoint at %s/checkpoint.safetensors, starting "
                "afresh\n",
                c->checkpoint_dir);
        return MGT_OK;
    }
    const char *path = r->resume_path;
    int saved_epoch = 0;
    long saved_step = 0;
    mgt_status st = load_checkpoint(r, path, r->resume_f, &saved_epoch, &saved_step);
    /* every text above starts with the path: one prefix names the flag */
    if (st != MGT_OK)
        return train_flag_error(st, "--resume");
    if (c->evaluate) {
        *epoch = saved_epoch;
        return MGT_OK; /* the evaluation's first line names the file */
    }
    if (c->start_epoch < 0) {
        *epoch = saved_epoch;
        *step = saved_step;
    } else {
        *step = 0; /* --start-epoch given: that epoch from its start */
    }
    if (*step >= r->data.steps_per_epoch) { /* the epoch's images are all seen */
        fprintf(r->out,
                "=> %s stopped at step %ld of epoch %d, past this run's %ld steps per epoch "
                "(--max-steps, -b or the data differ from the run that saved it): that epoch "
                "counts as done, and training goes on at epoch %d\n",
                path, *step, *epoch, r->data.steps_per_epoch, *epoch + 1);
        ++*epoch;
        *step = 0;
    }
    if (*epoch >= c->epochs && !c->evaluate)
        return mgt_error_set(MGT_ERR_USAGE,
                             "--epochs %d: %s has trained %d epoch%s already: nothing is left to "
                             "train (raise --epochs to go on, or --evaluate it)",
                             c->epochs, path, *epoch, *epoch == 1 ? "" : "s");
    fprintf(r->out, "=> resumed from %s at epoch %d step %ld (best Acc@1 %.3f)\n", path, *epoch,
            *step, r->best_acc1);
    return MGT_OK;
}
