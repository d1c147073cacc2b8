/* The trainer's numbers and their output: the per-step ring the workers report into, the
   epoch's totals, and the reporters (progress lines, JSON log) that format records under the
   run's lock and are written after it is released, so no device waits on a write. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "train/train_impl.h"

/* ---- text ---- */

void train_text_add(train_text *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int need = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (need < 0)
        return;
    if (t->len + (size_t)need + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 512;
        while (t->len + (size_t)need + 1 > cap)
            cap *= 2;
        char *s = realloc(t->s, cap);
        if (!s)
            return;
        t->s = s;
        t->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    t->len += (size_t)need;
}

/* ---- reporters ---- */

static void format_eta(double s, char *buf, size_t cap)
{
    long t = (long)(s + 0.5);
    snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
}

static void text_progress(train_text *out, const train_progress *p)
{
    char eta[32];
    format_eta(p->eta_s, eta, sizeof eta);
    int width = snprintf(NULL, 0, "%ld", p->steps);
    train_text_add(out,
                   "Epoch: [%d][%*ld/%ld]  Time %6.3f (%6.3f)  Data %6.3f (%6.3f)  Loss %.4e "
                   "(%.4e)  Acc@1 %6.2f (%6.2f)  Acc@5 %6.2f (%6.2f)  lr %.4g  %.1f img/s  ETA "
                   "%s\n",
                   p->epoch, width, p->step, p->steps, p->step_s, p->step_avg_s, p->data_s,
                   p->data_avg_s, p->loss, p->loss_avg, p->acc1, p->acc1_avg, p->acc5, p->acc5_avg,
                   p->lr, p->images_per_s, eta);
}

static void text_summary(train_text *out, const train_summary *s)
{
    if (s->validated)
        train_text_add(out, " * Acc@1 %.3f Acc@5 %.3f  Loss %.4f  (%ld validation images)\n",
                       s->val_acc1, s->val_acc5, s->val_loss, s->val_images);
    if (s->ema_validated)
        train_text_add(out, " * EMA Acc@1 %.3f Acc@5 %.3f  Loss %.4f\n", s->ema_val_acc1,
                       s->ema_val_acc5, s->ema_val_loss);
}

const train_reporter_i train_text_reporter = {.progress = text_progress, .summary = text_summary};

static void json_line(train_text *out, cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    if (s)
        train_text_add(out, "%s\n", s);
    free(s);
    cJSON_Delete(o);
}

static void json_progress(train_text *out, const train_progress *p)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "train");
    cJSON_AddNumberToObject(o, "epoch", p->epoch);
    cJSON_AddNumberToObject(o, "step", (double)p->step);
    cJSON_AddNumberToObject(o, "steps", (double)p->steps);
    cJSON_AddNumberToObject(o, "loss", p->loss);
    cJSON_AddNumberToObject(o, "loss_avg", p->loss_avg);
    cJSON_AddNumberToObject(o, "acc1", p->acc1);
    cJSON_AddNumberToObject(o, "acc5", p->acc5);
    cJSON_AddNumberToObject(o, "acc1_avg", p->acc1_avg);
    cJSON_AddNumberToObject(o, "acc5_avg", p->acc5_avg);
    cJSON_AddNumberToObject(o, "lr", p->lr);
    cJSON_AddNumberToObject(o, "images_per_s", p->images_per_s);
    cJSON_AddNumberToObject(o, "step_s", p->step_avg_s);
    cJSON_AddNumberToObject(o, "data_s", p->data_s);
    json_line(out, o);
}

static void json_summary(train_text *out, const train_summary *s)
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

const train_reporter_i train_json_reporter = {.progress = json_progress, .summary = json_summary};

void train_reports_init(train_reports *rep, FILE *out, FILE *log)
{
    memset(rep, 0, sizeof *rep);
    rep->sink[rep->n].i = &train_text_reporter;
    rep->sink[rep->n++].f = out;
    if (log) {
        rep->sink[rep->n].i = &train_json_reporter;
        rep->sink[rep->n++].f = log;
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

void train_reports_summary(train_reports *rep, const train_summary *s)
{
    pthread_mutex_lock(&rep->queue_lock);
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
        train_text t = rep->sink[i].queued;
        rep->sink[i].queued = (train_text){0};
        pthread_mutex_unlock(&rep->queue_lock);
        if (t.len) {
            fwrite(t.s, 1, t.len, rep->sink[i].f);
            fflush(rep->sink[i].f);
        }
        free(t.s);
    }
    pthread_mutex_unlock(&rep->write_lock);
}

/* ---- the epoch's numbers ---- */

void train_metrics_epoch_begin(run *r)
{
    train_metrics *m = &r->m;
    memset(m->ring, 0, sizeof m->ring);
    m->next_complete = r->first_step;
    m->loss_sum = m->data_s = 0;
    m->n = m->c1 = m->c5 = 0;
    m->start = m->last_complete = m->timed_start = m->last_progress = mgt_time_now();
    m->timed_n = m->timed_steps = 0;
}

/* Folds completed step k into the epoch totals and formats its records when due. */
static void complete_step(run *r, long k, const step_acc *a)
{
    train_metrics *m = &r->m;
    double now = mgt_time_now();
    m->loss_sum += a->loss_sum;
    m->n += a->n;
    m->c1 += a->c1;
    m->c5 += a->c5;
    m->data_s += a->data_s;
    double step_now = now - m->last_complete;
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
    double elapsed = now - m->start, steps = (double)r->data.steps_per_epoch;
    train_progress p = {
        .epoch = r->epoch,
        .step = k,
        .steps = r->data.steps_per_epoch,
        .step_s = step_now,
        .step_avg_s = elapsed / (double)done,
        .data_s = a->data_s,
        .data_avg_s = m->data_s / (double)done,
        .loss = a->loss_sum / (double)a->n,
        .loss_avg = m->loss_sum / (double)m->n,
        .acc1 = 100.0 * (double)a->c1 / (double)a->n,
        .acc1_avg = 100.0 * (double)m->c1 / (double)m->n,
        .acc5 = 100.0 * (double)a->c5 / (double)a->n,
        .acc5_avg = 100.0 * (double)m->c5 / (double)m->n,
        .lr = mgt_lr_at(&r->lr, r->epoch, (int)k, (int)steps),
        .images_per_s = (double)m->n / elapsed,
        .eta_s = elapsed / (double)done * (double)(r->stop_at - k - 1),
    };
    reports_progress(&r->reports, &p);
}

void train_metrics_add(run *r, worker *w, long k, int slot, float loss)
{
    w->metered = k + 1;
    step_acc *a = &r->m.ring[k % STEP_RING];
    int n = w->slot_n[slot];
    a->loss_sum += (double)loss * n;
    a->n += n;
    a->c1 += w->host_correct[2 * slot];
    a->c5 += w->host_correct[2 * slot + 1];
    if (w->slot_wait[slot] > a->data_s)
        a->data_s = w->slot_wait[slot];
    if (++a->reported == r->n) {
        /* steps complete in order: every device reports k before k+1 */
        step_acc done = *a;
        memset(a, 0, sizeof *a);
        r->m.next_complete = k + 1;
        complete_step(r, k, &done);
    }
}
