/* The trainer's numbers and their output: the per-step ring the workers report into, the
   epoch's totals, and the reporters (progress lines, JSON log, TensorBoard) that format records
   under the run's lock and are written after it is released, so no device waits on a write;
   after an epoch's record is written, curves.svg is drawn again from the log. */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "mgt/version.h"
#include "train/train_impl.h"

/* ---- reporters ---- */

static void format_eta(double s, char *buf, size_t cap)
{
    long t = (long)(s + 0.5);
    snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
}

static void text_progress(mgt_text *out, const train_progress *p)
{
    char eta[32], aux[128] = "";
    format_eta(p->eta_s, eta, sizeof eta);
    int width = snprintf(NULL, 0, "%ld", p->steps);
    /* the auxiliary classifiers' own losses, after the loss that weights them in */
    for (int i = 0, len = 0; i < p->n_aux; i++)
        len += snprintf(aux + len, sizeof aux - (size_t)len, "  Aux%s %.4e (%.4e)",
                        p->n_aux > 1 ? (i ? "2" : "1") : "", p->aux[i], p->aux_avg[i]);
    mgt_text_add(out,
                 "Epoch: [%d][%*ld/%ld]  Time %6.3f (%6.3f)  Data %6.3f (%6.3f)  Loss %.4e "
                 "(%.4e)%s  Acc@1 %6.2f (%6.2f)  Acc@5 %6.2f (%6.2f)  lr %.4g  %.1f img/s  ETA "
                 "%s\n",
                 p->epoch, width, p->step, p->steps, p->step_s, p->step_avg_s, p->data_s,
                 p->data_avg_s, p->loss, p->loss_avg, aux, p->acc1, p->acc1_avg, p->acc5,
                 p->acc5_avg, p->lr, p->images_per_s, eta);
}

static void text_summary(mgt_text *out, const train_summary *s)
{
    if (s->validated)
        mgt_text_add(out, " * Acc@1 %.3f Acc@5 %.3f  Loss %.4f  (%ld validation images)\n",
                     s->val_acc1, s->val_acc5, s->val_loss, s->val_images);
    if (s->devices_lost && s->trained)
        mgt_text_add(out, " * trained on %d device%s (%d lost: --on-device-failure continue)\n",
                     s->devices, s->devices == 1 ? "" : "s", s->devices_lost);
    if (s->ema_validated)
        mgt_text_add(out, " * EMA Acc@1 %.3f Acc@5 %.3f  Loss %.4f\n", s->ema_val_acc1,
                     s->ema_val_acc5, s->ema_val_loss);
}

const train_reporter_i train_text_reporter = {.progress = text_progress, .summary = text_summary};

static void json_line(mgt_text *out, cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    if (s)
        mgt_text_add(out, "%s\n", s);
    free(s);
    cJSON_Delete(o);
}

/* A float as the shortest decimal that reads back as it (JSON has only doubles: 0.1f would
   print as 0.10000000149011612). */
static double f32(double v)
{
    char b[32];
    snprintf(b, sizeof b, "%.7g", v);
    return strtod(b, NULL);
}

static const char *precision_name(mgt_precision p)
{
    return p == MGT_PREC_BF16 ? "bf16" : p == MGT_PREC_FP16 ? "fp16" : "fp32";
}

cJSON *train_start_json(const train_start *s)
{
    const mgt_train_config *c = s->c;
    cJSON *o = cJSON_CreateObject();
    /* the flags, by their names in `mgtrain train --help` */
    cJSON *f = cJSON_AddObjectToObject(o, "config");
    if (c->dummy)
        cJSON_AddBoolToObject(f, "dummy", true);
    else if (c->data_dir)
        cJSON_AddStringToObject(f, "data", c->data_dir);
    cJSON_AddStringToObject(f, "arch", s->arch);
    cJSON_AddNumberToObject(f, "epochs", c->epochs);
    cJSON_AddNumberToObject(f, "batch_size", c->batch_size);
    cJSON_AddNumberToObject(f, "workers", c->workers);
    cJSON_AddStringToObject(f, "opt", mgt_opt_kind_name(c->opt));
    cJSON_AddNumberToObject(f, "lr", f32(c->lr.lr));
    cJSON_AddStringToObject(f, "lr_schedule", mgt_lr_kind_name(c->lr.kind));
    cJSON_AddNumberToObject(f, "lr_step", c->lr.step_epochs);
    cJSON_AddNumberToObject(f, "lr_gamma", f32(c->lr.gamma));
    cJSON_AddNumberToObject(f, "lr_min", f32(c->lr.lr_min));
    cJSON_AddNumberToObject(f, "warmup_epochs", f32(c->lr.warmup_epochs));
    cJSON_AddNumberToObject(f, "lr_warmup_decay", f32(c->lr.warmup_decay));
    cJSON_AddNumberToObject(f, "momentum", f32(c->momentum));
    cJSON_AddBoolToObject(f, "nesterov", c->nesterov);
    cJSON_AddNumberToObject(f, "wd", f32(c->weight_decay));
    if (c->norm_weight_decay >= 0)
        cJSON_AddNumberToObject(f, "norm_weight_decay", f32(c->norm_weight_decay));
    if (c->bias_weight_decay >= 0)
        cJSON_AddNumberToObject(f, "bias_weight_decay", f32(c->bias_weight_decay));
    cJSON_AddNumberToObject(f, "clip_grad_norm", f32(c->clip_grad_norm));
    cJSON_AddNumberToObject(f, "accum_steps", c->accum_steps);
    cJSON_AddBoolToObject(f, "model_ema", c->model_ema);
    if (c->model_ema) {
        cJSON_AddNumberToObject(f, "model_ema_decay", f32(c->model_ema_decay));
        cJSON_AddNumberToObject(f, "model_ema_steps", c->model_ema_steps);
    }
    cJSON_AddNumberToObject(f, "label_smoothing", f32(c->label_smoothing));
    cJSON_AddNumberToObject(f, "mixup_alpha", f32(c->mixup_alpha));
    cJSON_AddNumberToObject(f, "cutmix_alpha", f32(c->cutmix_alpha));
    cJSON_AddNumberToObject(f, "random_erase", f32(c->random_erase));
    cJSON_AddNumberToObject(f, "image_size", c->image_size);
    static const char *const augments[] = {"default", "rrc", "pad-crop", "none"};
    cJSON_AddStringToObject(f, "augment", augments[c->augment]);
    cJSON_AddStringToObject(f, "auto_augment", mgt_auto_augment_name(c->auto_augment));
    cJSON_AddStringToObject(f, "interpolation", mgt_interp_name(c->interpolation));
    cJSON_AddNumberToObject(f, "val_resize_size", c->val_resize_size);
    cJSON_AddNumberToObject(f, "val_crop_size", c->val_crop_size);
    if (c->normalize_auto) {
        cJSON_AddStringToObject(f, "normalize", "auto");
    } else if (c->mean_std_set) {
        double ms[6];
        for (int i = 0; i < 3; i++) {
            ms[i] = f32(c->mean[i]);
            ms[3 + i] = f32(c->std[i]);
        }
        cJSON_AddItemToObject(f, "mean", cJSON_CreateDoubleArray(ms, 3));
        cJSON_AddItemToObject(f, "std", cJSON_CreateDoubleArray(ms + 3, 3));
    }
    if (c->dummy) {
        cJSON_AddNumberToObject(f, "dummy_steps", c->dummy_steps);
        cJSON_AddNumberToObject(f, "dummy_classes", c->dummy_classes);
    }
    cJSON_AddStringToObject(f, "amp", precision_name(c->amp));
    cJSON_AddStringToObject(f, "grad_dtype", precision_name(c->grad_dtype));
    cJSON_AddBoolToObject(f, "sync_bn", c->sync_bn);
    cJSON_AddBoolToObject(f, "freeze_bn", c->freeze_bn);
    cJSON_AddBoolToObject(f, "zero_init_residual", c->zero_init_residual);
    cJSON_AddNumberToObject(f, "seed", (double)c->seed);
    cJSON_AddNumberToObject(f, "print_freq", c->print_freq);
    cJSON_AddNumberToObject(f, "bucket_mb", (double)c->bucket_bytes / (1 << 20));
    cJSON_AddStringToObject(f, "allreduce", c->allreduce == MGT_ALLREDUCE_RING ? "ring" : "tree");
    if (c->resume)
        cJSON_AddStringToObject(f, "resume", c->resume);
    if (c->pretrained)
        cJSON_AddStringToObject(f, "pretrained", c->pretrained);
    if (c->checkpoint_dir)
        cJSON_AddStringToObject(f, "checkpoint_dir", c->checkpoint_dir);
    if (c->tensorboard_dir)
        cJSON_AddStringToObject(f, "tensorboard", c->tensorboard_dir);
    cJSON_AddBoolToObject(f, "evaluate", c->evaluate);
    cJSON_AddBoolToObject(f, "strict_data", c->strict_data);
    cJSON_AddNumberToObject(f, "max_bad_frac", c->max_bad_frac);
    cJSON_AddBoolToObject(f, "exact_decode", c->exact_decode);
    cJSON_AddNumberToObject(f, "time_limit", c->time_limit_s);
    cJSON_AddNumberToObject(f, "timeout", c->step_timeout_s);
    /* what the run made of them */
    cJSON *r = cJSON_AddObjectToObject(o, "run");
    cJSON_AddStringToObject(r, "family", s->family);
    cJSON_AddNumberToObject(r, "devices", s->devices);
    cJSON_AddNumberToObject(r, "nodes", s->nodes);
    cJSON_AddNumberToObject(r, "per_device_batch", s->per_device_batch);
    cJSON_AddNumberToObject(r, "classes", s->classes);
    cJSON_AddNumberToObject(r, "in_channels", s->channels);
    cJSON_AddNumberToObject(r, "image_size", s->image_size);
    cJSON_AddNumberToObject(r, "steps_per_epoch", (double)s->steps_per_epoch);
    cJSON_AddNumberToObject(r, "train_images", (double)s->train_images);
    cJSON_AddNumberToObject(r, "val_images", (double)s->val_images);
    cJSON_AddNumberToObject(r, "start_epoch", s->start_epoch);
    cJSON_AddNumberToObject(r, "start_step", (double)s->start_step);
    return o;
}

static void json_start(mgt_text *out, const train_start *s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "config");
    cJSON_AddStringToObject(o, "version", mgt_version());
    if (s->command_line)
        cJSON_AddStringToObject(o, "command_line", s->command_line);
    cJSON_AddNumberToObject(o, "wall_time", s->wall_time);
    cJSON *body = train_start_json(s);
    cJSON *item;
    while (body && (item = body->child) != NULL)
        cJSON_AddItemToObject(o, item->string, cJSON_DetachItemViaPointer(body, item));
    cJSON_Delete(body);
    json_line(out, o);
}

static void json_progress(mgt_text *out, const train_progress *p)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "train");
    cJSON_AddNumberToObject(o, "epoch", p->epoch);
    cJSON_AddNumberToObject(o, "step", (double)p->step);
    cJSON_AddNumberToObject(o, "steps", (double)p->steps);
    cJSON_AddNumberToObject(o, "loss", p->loss);
    cJSON_AddNumberToObject(o, "loss_avg", p->loss_avg);
    if (p->n_aux) {
        cJSON_AddItemToObject(o, "aux_loss", cJSON_CreateDoubleArray(p->aux, p->n_aux));
        cJSON_AddItemToObject(o, "aux_loss_avg", cJSON_CreateDoubleArray(p->aux_avg, p->n_aux));
    }
    cJSON_AddNumberToObject(o, "acc1", p->acc1);
    cJSON_AddNumberToObject(o, "acc5", p->acc5);
    cJSON_AddNumberToObject(o, "acc1_avg", p->acc1_avg);
    cJSON_AddNumberToObject(o, "acc5_avg", p->acc5_avg);
    cJSON_AddNumberToObject(o, "lr", f32(p->lr));
    cJSON_AddNumberToObject(o, "images_per_s", p->images_per_s);
    cJSON_AddNumberToObject(o, "step_s", p->step_avg_s);
    cJSON_AddNumberToObject(o, "data_s", p->data_s);
    cJSON_AddNumberToObject(o, "data_wait", p->step_avg_s > 0 ? p->data_avg_s / p->step_avg_s : 0);
    json_line(out, o);
}

static void json_summary(mgt_text *out, const train_summary *s)
{
    if (!s->trained)
        return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "epoch");
    cJSON_AddNumberToObject(o, "epoch", s->epoch);
    cJSON_AddNumberToObject(o, "train_loss", s->train_loss);
    cJSON_AddNumberToObject(o, "train_acc1", s->train_acc1);
    cJSON_AddNumberToObject(o, "images_per_s", s->images_per_s);
    cJSON_AddNumberToObject(o, "epoch_s", s->epoch_s);
    cJSON_AddNumberToObject(o, "lr", f32(s->lr));
    cJSON_AddNumberToObject(o, "devices", s->devices);
    if (s->devices_lost)
        cJSON_AddNumberToObject(o, "devices_lost", s->devices_lost);
    if (s->validated) {
        cJSON_AddNumberToObject(o, "val_loss", s->val_loss);
        cJSON_AddNumberToObject(o, "val_acc1", s->val_acc1);
        cJSON_AddNumberToObject(o, "val_acc5", s->val_acc5);
    }
    if (s->ema_validated) {
        cJSON_AddNumberToObject(o, "ema_val_loss", s->ema_val_loss);
        cJSON_AddNumberToObject(o, "ema_val_acc1", s->ema_val_acc1);
        cJSON_AddNumberToObject(o, "ema_val_acc5", s->ema_val_acc5);
    }
    json_line(out, o);
}

const train_reporter_i train_json_reporter = {
    .start = json_start, .progress = json_progress, .summary = json_summary};

void train_reports_init(train_reports *rep, FILE *out, FILE *log, FILE *tb)
{
    memset(rep, 0, sizeof *rep);
    rep->warn = out;
    rep->sink[rep->n].i = &train_text_reporter;
    rep->sink[rep->n++].f = out;
    if (log) {
        rep->sink[rep->n].i = &train_json_reporter;
        rep->sink[rep->n++].f = log;
    }
    if (tb) {
        rep->sink[rep->n].i = &train_tensorboard_reporter;
        rep->sink[rep->n++].f = tb;
    }
    pthread_mutex_init(&rep->queue_lock, NULL);
    pthread_mutex_init(&rep->write_lock, NULL);
}

void train_reports_free(train_reports *rep)
{
    for (int i = 0; i < rep->n; i++)
        free(rep->sink[i].queued.s);
    pthread_mutex_destroy(&rep->queue_lock);
    pthread_mutex_destroy(&rep->write_lock);
}

static void reports_progress(train_reports *rep, const train_progress *p)
{
    pthread_mutex_lock(&rep->queue_lock);
    for (int i = 0; i < rep->n; i++)
        if (rep->sink[i].i->progress)
            rep->sink[i].i->progress(&rep->sink[i].queued, p);
    pthread_mutex_unlock(&rep->queue_lock);
}

void train_reports_start(train_reports *rep, const train_start *s)
{
    pthread_mutex_lock(&rep->queue_lock);
    for (int i = 0; i < rep->n; i++)
        if (rep->sink[i].i->start)
            rep->sink[i].i->start(&rep->sink[i].queued, s);
    pthread_mutex_unlock(&rep->queue_lock);
}

void train_reports_summary(train_reports *rep, const train_summary *s)
{
    pthread_mutex_lock(&rep->queue_lock);
    rep->epoch_queued = rep->epoch_queued || s->trained;
    for (int i = 0; i < rep->n; i++)
        if (rep->sink[i].i->summary)
            rep->sink[i].i->summary(&rep->sink[i].queued, s);
    pthread_mutex_unlock(&rep->queue_lock);
}

void train_reports_flush(train_reports *rep)
{
    pthread_mutex_lock(&rep->write_lock);
    for (int i = 0; i < rep->n; i++) {
        pthread_mutex_lock(&rep->queue_lock);
        mgt_text t = rep->sink[i].queued;
        rep->sink[i].queued = (mgt_text){0};
        pthread_mutex_unlock(&rep->queue_lock);
        if (t.len) {
            fwrite(t.s, 1, t.len, rep->sink[i].f);
            fflush(rep->sink[i].f);
        }
        free(t.s);
    }
    pthread_mutex_lock(&rep->queue_lock);
    bool redraw = rep->epoch_queued && rep->curves_path;
    rep->epoch_queued = false;
    pthread_mutex_unlock(&rep->queue_lock);
    if (redraw) {
        const char *logs[] = {rep->log_path};
        mgt_status st = mgt_train_plot_curves(logs, NULL, 1, rep->curves_path);
        if (st != MGT_OK && !rep->curves_failed) { /* the run goes on: the log holds it all */
            fprintf(rep->warn, "=> warning: %s\n", mgt_error_last());
            rep->curves_failed = true;
        }
    }
    pthread_mutex_unlock(&rep->write_lock);
}

/* ---- the epoch's numbers ---- */

/* Adds a step's sums (loss, auxiliary losses, images, top-1 and top-5 hits, data wait) to the
   epoch's. */
static void add_step(train_metrics *m, const step_acc *a)
{
    m->loss_sum += a->loss_sum;
    for (int i = 0; i < MGT_MODEL_MAX_AUX; i++)
        m->aux_sum[i] += a->aux_sum[i];
    m->n += a->n;
    m->c1 += a->c1;
    m->c5 += a->c5;
    m->data_s += a->data_s;
}

void train_metrics_epoch_begin(run *r, bool carry)
{
    train_metrics *m = &r->m;
    if (carry) {
        /* the epoch goes on over the survivors of a lost device from r->first_step: the steps
           before it that every device had committed but not every device had metered (the
           lost one never did) count with the images that were metered */
        for (long k = m->next_complete; k < r->first_step && k < m->next_complete + STEP_RING; k++)
            add_step(m, &m->ring[k % STEP_RING]);
    } else {
        m->loss_sum = m->data_s = 0;
        memset(m->aux_sum, 0, sizeof m->aux_sum);
        m->n = m->c1 = m->c5 = 0;
        m->start = mgt_time_now();
        m->epoch_first = r->first_step;
    }
    memset(m->ring, 0, sizeof m->ring);
    m->next_complete = r->first_step;
    m->last_complete = m->timed_start = m->last_progress = mgt_time_now();
    m->timed_n = m->timed_steps = 0;
}

/* Folds completed step k into the epoch totals and formats its records when due. */
static void complete_step(run *r, long k, const step_acc *a)
{
    train_metrics *m = &r->m;
    double now = mgt_time_now();
    add_step(m, a);
    double step_now = a->step_s > 0 ? a->step_s : now - m->last_complete;
    m->last_complete = now;
    m->last_progress = now;
    long done = k - r->first_step + 1;
    if (done == r->ctl.warmup_steps) {
        m->timed_start = now;
    } else if (done > r->ctl.warmup_steps) {
        m->timed_n += a->n;
        m->timed_steps++;
    }
    if (k % r->c->print_freq != 0 && k + 1 != r->stop_at)
        return;
    /* the averages are the epoch's (over a re-formation too), the warm-up this phase's */
    double elapsed = now - m->start, steps = (double)r->data.steps_per_epoch;
    long done_ep = k - m->epoch_first + 1;
    train_progress p = {
        .epoch = r->epoch,
        .step = k,
        .steps = r->data.steps_per_epoch,
        .step_s = step_now,
        .step_avg_s = elapsed / (double)done_ep,
        .data_s = a->data_s,
        .data_avg_s = m->data_s / (double)done_ep,
        .loss = a->loss_sum / (double)a->n,
        .loss_avg = m->loss_sum / (double)m->n,
        .acc1 = 100.0 * (double)a->c1 / (double)a->n,
        .acc1_avg = 100.0 * (double)m->c1 / (double)m->n,
        .acc5 = 100.0 * (double)a->c5 / (double)a->n,
        .acc5_avg = 100.0 * (double)m->c5 / (double)m->n,
        .lr = mgt_lr_at(&r->lr, r->epoch, (int)k, (int)steps),
        .images_per_s = (double)m->n / elapsed,
        .eta_s = elapsed / (double)done_ep * (double)(r->stop_at - k - 1),
        .n_aux = mgt_model_aux_count(r->w[0].model),
    };
    for (int i = 0; i < p.n_aux; i++) {
        p.aux[i] = a->aux_sum[i] / (double)a->n;
        p.aux_avg[i] = m->aux_sum[i] / (double)m->n;
    }
    reports_progress(&r->reports, &p);
}

void train_metrics_add(run *r, worker *w, long k, int slot, float loss)
{
    w->metered = k + 1;
    step_acc *a = &r->m.ring[k % STEP_RING];
    int n = w->slot_n[slot];
    a->loss_sum += (double)loss * n;
    for (int i = 0; i < mgt_model_aux_count(w->model); i++)
        a->aux_sum[i] += (double)w->host_aux[slot * MGT_MODEL_MAX_AUX + i] * n;
    a->n += n;
    a->c1 += w->host_correct[2 * slot];
    a->c5 += w->host_correct[2 * slot + 1];
    if (w->slot_wait[slot] > a->data_s)
        a->data_s = w->slot_wait[slot];
    if (w->slot_step_s[slot] > a->step_s)
        a->step_s = w->slot_step_s[slot];
    if (++a->reported == r->n) {
        /* steps complete in order: every device reports k before k+1 */
        step_acc done = *a;
        memset(a, 0, sizeof *a);
        r->m.next_complete = k + 1;
        complete_step(r, k, &done);
    }
}
