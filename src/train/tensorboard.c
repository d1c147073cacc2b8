/* The TensorBoard reporter (--tensorboard DIR): the run's records as TensorBoard event files,
   which TensorBoard and torch.utils.tensorboard's readers open. A file is a sequence of
   records, each
       uint64 length, uint32 masked CRC-32C of those 8 bytes, length bytes of an Event
       protobuf, uint32 masked CRC-32C of them            (all little-endian)
   with mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8, as TensorFlow's record writer makes
   them (tensorflow/core/lib/io/record_writer.cc, crc32c.h). The first Event carries
   file_version "brain.Event:2". The Event messages are packed by protobuf-c from
   proto/tensorboard_event.proto (TensorBoard's field numbers); CRC-32C is ISA-L's
   crc32_iscsi (Debian's libisal-dev), whose CRC is the standard one with the initial value
   and final inversion left to the caller. */
#include <errno.h>
#include <isa-l/crc.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "tensorboard_event.pb-c.h"
#include "mgt/version.h"
#include "train/train_impl.h"

static uint32_t masked_crc32c(const void *p, size_t n)
{
    uint32_t c = ~crc32_iscsi((unsigned char *)p, (int)n, 0xffffffffu);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static void put_le(unsigned char *b, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        b[i] = (unsigned char)(v >> (8 * i));
}

/* One record holding ev, appended to out. */
static void add_event(mgt_text *out, const Tensorboard__Event *ev)
{
    size_t n = tensorboard__event__get_packed_size(ev);
    unsigned char *buf = malloc(n + 16);
    if (!buf)
        return; /* output, never state: the record is dropped (as mgt_text does) */
    tensorboard__event__pack(ev, buf + 12);
    put_le(buf, n, 8);
    put_le(buf + 8, masked_crc32c(buf, 8), 4);
    put_le(buf + 12 + n, masked_crc32c(buf + 12, n), 4);
    mgt_text_append(out, buf, n + 16);
    free(buf);
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The scalars of one step, as simple_value (what torch.utils.tensorboard's add_scalar
   writes). */
typedef struct tb_scalars {
    Tensorboard__Summary__Value v[40];
    Tensorboard__Summary__Value *p[40];
    char tags[40][48];
    int n;
} tb_scalars;

static void scalar(tb_scalars *s, const char *tag, double value)
{
    if (s->n == (int)(sizeof s->v / sizeof *s->v))
        return;
    Tensorboard__Summary__Value *v = &s->v[s->n];
    tensorboard__summary__value__init(v);
    snprintf(s->tags[s->n], sizeof s->tags[s->n], "%s", tag);
    v->tag = s->tags[s->n];
    v->value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
    v->simple_value = (float)value;
    s->p[s->n] = v;
    s->n++;
}

static void add_scalars(mgt_text *out, tb_scalars *s, long step)
{
    Tensorboard__Summary sum = TENSORBOARD__SUMMARY__INIT;
    sum.n_value = (size_t)s->n;
    sum.value = s->p;
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_now();
    ev.step = step;
    ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    add_event(out, &ev);
}

/* A text summary (TensorBoard's text plugin: a scalar DT_STRING tensor of markdown). */
static void add_text(mgt_text *out, const char *tag, const char *markdown, double wall_time)
{
    Tensorboard__SummaryMetadata__PluginData plugin =
        TENSORBOARD__SUMMARY_METADATA__PLUGIN_DATA__INIT;
    plugin.plugin_name = "text";
    Tensorboard__SummaryMetadata meta = TENSORBOARD__SUMMARY_METADATA__INIT;
    meta.plugin_data = &plugin;
    meta.data_class = TENSORBOARD__DATA_CLASS__DATA_CLASS_TENSOR;
    Tensorboard__TensorShapeProto shape = TENSORBOARD__TENSOR_SHAPE_PROTO__INIT;
    ProtobufCBinaryData str = {strlen(markdown), (uint8_t *)markdown};
    Tensorboard__TensorProto t = TENSORBOARD__TENSOR_PROTO__INIT;
    t.dtype = TENSORBOARD__DATA_TYPE__DT_STRING;
    t.tensor_shape = &shape;
    t.n_string_val = 1;
    t.string_val = &str;
    Tensorboard__Summary__Value v = TENSORBOARD__SUMMARY__VALUE__INIT;
    v.tag = (char *)tag;
    v.metadata = &meta;
    v.value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_TENSOR;
    v.tensor = &t;
    Tensorboard__Summary__Value *vp = &v;
    Tensorboard__Summary sum = TENSORBOARD__SUMMARY__INIT;
    sum.n_value = 1;
    sum.value = &vp;
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_time;
    ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    add_event(out, &ev);
}

static void tb_start(mgt_text *out, const train_start *s)
{
    Tensorboard__SourceMetadata src = TENSORBOARD__SOURCE_METADATA__INIT;
    src.writer = "mgtrain";
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = s->wall_time;
    ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    ev.source_metadata = &src;
    add_event(out, &ev);
    /* the configuration as markdown: the command line, then the JSON in a code block */
    cJSON *o = train_start_json(s);
    char *json = o ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    mgt_text md = {0};
    mgt_text_add(&md, "mgtrain %s\n\n", mgt_version());
    if (s->command_line)
        mgt_text_add(&md, "    %s\n\n", s->command_line);
    if (json) {
        /* an indented block: markdown shows it as code, line for line */
        mgt_text_add(&md, "    ");
        for (const char *c = json; *c; c++)
            mgt_text_add(&md, *c == '\n' ? "\n    " : "%c", *c);
        mgt_text_add(&md, "\n");
    }
    free(json);
    if (md.s)
        add_text(out, "config", md.s, s->wall_time);
    free(md.s);
}

static void tb_progress(mgt_text *out, const train_progress *p)
{
    tb_scalars s = {.n = 0};
    scalar(&s, "train/loss", p->loss);
    scalar(&s, "train/acc1", p->acc1);
    scalar(&s, "train/acc5", p->acc5);
    scalar(&s, "train/lr", p->lr);
    scalar(&s, "train/images_per_s", p->images_per_s);
    scalar(&s, "train/data_wait", p->step_avg_s > 0 ? p->data_avg_s / p->step_avg_s : 0);
    add_scalars(out, &s, (long)p->epoch * p->steps + p->step + 1);
}

static void tb_summary(mgt_text *out, const train_summary *sm)
{
    tb_scalars s = {.n = 0};
    if (sm->trained) {
        scalar(&s, "epoch/train_loss", sm->train_loss);
        scalar(&s, "epoch/train_acc1", sm->train_acc1);
        scalar(&s, "epoch/images_per_s", sm->images_per_s);
        scalar(&s, "epoch/lr", sm->lr);
        scalar(&s, "epoch/epoch", sm->epoch);
    }
    if (sm->validated) {
        scalar(&s, "val/loss", sm->val_loss);
        scalar(&s, "val/acc1", sm->val_acc1);
        scalar(&s, "val/acc5", sm->val_acc5);
    }
    if (sm->ema_validated) {
        scalar(&s, "val_ema/loss", sm->ema_val_loss);
        scalar(&s, "val_ema/acc1", sm->ema_val_acc1);
        scalar(&s, "val_ema/acc5", sm->ema_val_acc5);
    }
    /* the step broken down per device, seconds per step (where the run measured it) */
    for (int i = 0; sm->profile && i < sm->devices && s.n + 5 <= 40; i++) {
        const mgt_step_profile *d = &sm->profile[i];
        if (!d->steps)
            continue;
        char tag[48];
        static const char *const part[] = {"data_s", "forward_s", "backward_s", "reduce_exposed_s",
                                           "optimizer_s"};
        const double val[] = {d->data_s, d->forward_s, d->backward_s, d->reduce_exposed_s,
                              d->optimizer_s};
        for (int k = 0; k < 5; k++) {
            snprintf(tag, sizeof tag, "device%d/%s", i, part[k]);
            scalar(&s, tag, val[k]);
        }
    }
    if (s.n)
        add_scalars(out, &s, sm->global_step);
}

const train_reporter_i train_tensorboard_reporter = {
    .start = tb_start, .progress = tb_progress, .summary = tb_summary};

mgt_status train_tensorboard_open(const char *dir, FILE **out, char *path, size_t cap)
{
    *out = NULL;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return mgt_error_set(MGT_ERR_IO, "--tensorboard %s: %s", dir, strerror(errno));
    char host[64] = "localhost";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    /* TensorBoard reads every file whose name holds "tfevents", in name order: the time first,
       as TensorFlow and torch.utils.tensorboard name them; "x": never over another's file */
    static atomic_int files; /* runs of one process (a library caller's) each get their own */
    int len = snprintf(path, cap, "%s/events.out.tfevents.%ld.%s.%ld.%d.mgtrain", dir,
                       (long)time(NULL), host, (long)getpid(), atomic_fetch_add(&files, 1));
    if (len < 0 || (size_t)len >= cap)
        return mgt_error_set(MGT_ERR_INVALID, "--tensorboard %s: the path is too long", dir);
    FILE *f = fopen(path, "wbx");
    if (!f)
        return mgt_error_set(MGT_ERR_IO, "--tensorboard %s: %s", path, strerror(errno));
    *out = f;
    return MGT_OK;
}
