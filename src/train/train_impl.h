/* The trainer's private parts, shared by its files:
 *   run.c        the driver: configuration, the epoch loop, one cleanup path;
 *   setup.c      data, replicas, communication, broadcasts and the replica check;
 *   step.c       worker threads, the phase protocol, the training and validation steps;
 *   failure.c    the run's first failure: recorded once, placed on its device and step, its line;
 *   metrics.c    the per-step ring, the epoch's totals and the reporters (progress, JSON log);
 *   tensorboard.c the TensorBoard reporter: event records (length, masked CRC-32C, Event);
 *   checkpoint.c the training state and its symmetric save and load, --resume;
 *   pretrained.c --pretrained: weights from torchvision files or mgtrain checkpoints;
 *   source.c     the --resume and --pretrained files, opened first; what a checkpoint says of
 *                its model (mgt_ckpt_info) and the defaults that gives -e and --resume;
 *   predict.c    `mgtrain predict`: a checkpoint's top-k classes for image files;
 *   optimizer.c  the optimizer as the trainer sees it: an update and a table of state tensors.
 *
 * Threads. The main thread prepares data, replicas and communication, then drives phases
 * (an epoch's training, a validation) by bumping a phase counter that the workers wait on;
 * while a phase runs it only watches: the stop request, the time limit, the step timeout.
 * Worker i owns replica i, its streams and its optimizer state, and runs every step of the
 * phase. Any failure goes through failure.c: the first one is kept (r->fail), the abort flag
 * is raised, and every wait (loader, all-reduce, device, phase) leaves soon after; nothing
 * that follows (other threads' errors, cleanup) replaces it.
 *
 * Metrics without stalls. A step's loss and top-1/top-5 counts are copied to pinned host
 * slots on the device's stream; the worker reads step k's slot at the start of step k+LAG,
 * after waiting for its event, so the device keeps two steps queued while the host still
 * learns every loss (and stops on a NaN within two steps). Each worker adds the step's
 * numbers to a shared per-step accumulator under the run's lock; the worker that completes a
 * step (the last device to report it) folds it into the epoch's totals, in step order, and
 * formats the progress records when due. The text is written after the lock is released.
 */
#ifndef MGT_TRAIN_IMPL_H
#define MGT_TRAIN_IMPL_H

#include <pthread.h>
#include <stdio.h>

#include "mgt/comm.h"
#include "mgt/data.h"
#include "mgt/nn.h"
#include "mgt/optim.h"
#include "mgt/safetensors.h"
#include "mgt/text.h"
#include "mgt/train.h"

#define LAG 2        /* steps a worker's host runs ahead of reading their metrics */
#define SLOTS 4      /* metric slots per worker (> LAG) */
#define STEP_RING 16 /* per-step accumulators shared by the workers */
#define PROF_MARKS 5 /* profile events per step: start, forward, backward, reduce, optimizer */

typedef struct run run;

/* ---- optimizer.c ---- */

/* One tensor of optimizer state, as checkpoints and broadcasts see it: a flat F32 array on
   the worker's device, the same length on every replica. */
typedef struct train_opt_tensor {
    const char *name; /* the checkpoint's tensor name, "optimizer.<...>" (static) */
    float *dev;
    size_t floats;
} train_opt_tensor;

#define TRAIN_OPT_PREFIX "optimizer."
#define TRAIN_MAX_OPT_TENSORS 4
/* Seconds a node waits at start-up for the others (at least; --timeout when longer): one may
   scan its data or read a checkpoint much longer than another. */
#define TRAIN_START_WAIT_S 600.0

/* A replica's optimizer. A new optimizer is a kind in mgt/optim.h; its state tensors come
   through train_optim_state, and checkpoints and broadcasts follow that table. */
typedef struct train_optim {
    mgt_optimizer *o;
    mgt_opt_kind kind;
    int groups; /* weight-decay groups the arena is cut into */
    char names[MGT_OPT_MAX_STATE][48];
} train_optim;

/* --opt with --nesterov folded in (sgd + --nesterov is sgd_nesterov). */
mgt_opt_kind train_optim_kind_of(const mgt_train_config *c);
mgt_status train_optim_create(train_optim *o, mgt_device *d, const mgt_model *m,
                              const mgt_train_config *c);
void train_optim_free(train_optim *o);
/* The name the checkpoint's "optimizer" metadata holds (mgt_opt_kind_name). */
const char *train_optim_kind(const train_optim *o);
mgt_status train_optim_step(train_optim *o, mgt_stream *s, float *params, const float *grads,
                            float lr, float grad_scale);
/* Fills t (TRAIN_MAX_OPT_TENSORS long) with the state tensors; returns their count. */
int train_optim_state(const train_optim *o, train_opt_tensor *t);
/* Updates done so far (0: the state holds nothing yet); setting it marks restored or
   broadcast state as live. train_optim_live: steps > 0. */
long train_optim_steps(const train_optim *o);
void train_optim_set_steps(train_optim *o, long steps);
bool train_optim_live(const train_optim *o);

/* ---- the run's parts ---- */

/* GradScaler's state (fp16 only): the scale the loss gradient is multiplied by, the clean
   steps since it last changed, and the steps skipped for an inf or NaN. */
typedef struct train_scaler {
    float scale;
    int growth;
    long skipped;
} train_scaler;

typedef struct step_acc {
    double loss_sum;                   /* sum over devices of loss * n */
    double aux_sum[MGT_MODEL_MAX_AUX]; /* the same of each auxiliary loss */
    long n, c1, c5;
    double data_s; /* the slowest device's wait for this step's batch */
    double step_s; /* the slowest device's time for the step (0: not measured) */
    int reported;  /* devices that added to it */
} step_acc;

/* --model-ema on one replica (ema.c): the averages in arenas laid out as the model's, and
   where the model's own weights wait while the EMA ones are validated. */
typedef struct train_ema {
    mgt_buffer *params, *buffers;
    mgt_buffer *stash_params, *stash_buffers;
    int64_t *counts, *stash_counts; /* num_batches_tracked, host */
    long n_averaged;                /* AveragedModel's; 0: the next update copies */
} train_ema;

/* A failure: the cause and where it happened. */
typedef struct train_failure {
    bool set;
    mgt_status status;
    int device;      /* the index of the device it happened on; -1: not one device's */
    int epoch;       /* -1: not known (the text says where) */
    long step;       /* the training step, or with validation the batch; -1: none */
    bool validation; /* in a validation pass */
    char phase[32];  /* the stage of the step: "forward", "loss", "backward", ... */
    char cause[768];
    bool root;   /* a cause in itself (a NaN loss, a timeout, bad input), never the consequence
                    of a device fault that another device's marks might show */
    bool remote; /* another node's failure: that node prints the line */
} train_failure;

/* A worker's mark: an event recorded after a stage of its work, and what that stage was. */
#define TRAIN_MARKS \
    32 /* per worker: more than the stages in flight (LAG + 1 steps of 5, or a
                          validation's batches in the loader's few slots) */
typedef struct train_marker {
    mgt_event *ev;
    int epoch;
    long step; /* or the validation batch */
    bool validation;
    const char *phase; /* static: the stage that ends at this mark */
    long seq;          /* the mark's number in the worker's order (0: none yet) */
} train_marker;

typedef struct worker {
    run *r;
    int dev;
    pthread_t thread;
    bool thread_started, thread_joined;
    /* left: the thread has returned (under r->lock); detached: it did not within the wait
       limit (stuck in a call that does not return) and was abandoned: nothing of this worker
       is freed, since the thread may still hold it */
    bool left, detached;
    bool given_up; /* detached and its device abandoned (run.c) */
    mgt_device *d;
    mgt_stream *s;
    mgt_model *model;
    mgt_model *val_model; /* FixRes: the replica planned for the validation crop (or NULL) */
    train_optim opt;
    train_ema ema;
    /* metrics */
    float *host_loss;        /* pinned [SLOTS] */
    float *host_aux;         /* pinned [SLOTS][MGT_MODEL_MAX_AUX]: the auxiliary losses */
    int32_t *host_correct;   /* pinned [SLOTS][2] */
    mgt_buffer *dev_correct; /* [SLOTS][2] counters on the device, and [2] for validation */
    mgt_buffer *dev_val;     /* [1] float: validation loss sum */
    mgt_event *slot_ev[SLOTS];
    mgt_event *prof_ev[SLOTS][PROF_MARKS]; /* with profile */
    mgt_step_profile prof;
    int slot_n[SLOTS];
    double slot_wait[SLOTS];
    long slot_k[SLOTS];        /* the training step whose metrics the slot holds (-1: none) */
    double slot_step_s[SLOTS]; /* the step's time on the device (0: the epoch's first) */
    /* dummy data */
    mgt_buffer *dummy_x, *dummy_y;
    long phase_seen; /* the phase counter when its thread started */
    long started;    /* steps begun in this phase, under r->lock */
    long metered;    /* steps whose metrics this worker has read, under r->lock */
    /* fp16 loss scaling: this replica's copy of the scaler (every replica decides alike, from
       the same reduced gradients), its inf/NaN count on the device and in pinned memory */
    train_scaler scaler;
    mgt_buffer *dev_nonfinite;
    int32_t *host_nonfinite;
    /* --on-device-failure continue: the event after its own work of a step (forward and
       backward, before the all-reduce waits on the peers), and the batch-norm statistics as
       they were at the start of the step `keep_step` (a re-run step must not count twice) */
    mgt_event *own_ev, *reduced_ev;
    mgt_buffer *bn_keep;
    int64_t *counts_keep; /* num_batches_tracked, host */
    long keep_step;
    /* failure: the marks of its work, and where it stood when it noticed a failure */
    train_marker marks[TRAIN_MARKS];
    long mark_seq;
    train_failure noticed;
    /* -e: each validation batch's logits (pinned [batch][classes]) and this replica's
       confusion counts [true][predicted] (host; NULL past TRAIN_CONFUSION_MAX classes) */
    float *host_logits;
    long *confusion;
} worker;

#define TRAIN_CONFUSION_MAX 4096 /* classes up to which -e counts the confusion matrix */

typedef struct train_data {
    mgt_dataset *train_ds, *val_ds;
    mgt_loader *train_ld, *val_ld;
    int classes, channels, size;
    mgt_transform val_t; /* the validation transform (with --dummy: zeroed) */
    int per_dev_batch;
    mgt_transform tt, vt; /* the loaders' transforms, kept to make them again */
    size_t train_samples, val_samples;
    long steps_per_epoch; /* training batches per device this run takes per epoch */
} train_data;

/* The current epoch's numbers (metrics.c), under the run's lock. */
typedef struct train_metrics {
    step_acc ring[STEP_RING];
    long next_complete; /* the next step to complete */
    double loss_sum;
    double aux_sum[MGT_MODEL_MAX_AUX];
    long n, c1, c5;
    double data_s;
    double start, last_progress, last_complete;
    long epoch_first; /* the step the epoch's sums begin at (before any re-formation) */
    double timed_start;
    long timed_n, timed_steps;
    /* validation totals */
    double val_loss_sum;
    long val_n, val_c1, val_c5;
    /* -e: the totals so far, batch by batch (for the progress lines), and when it began */
    double val_run_loss;
    long val_run_n, val_run_c1, val_run_c5, val_batches_done;
    double val_start;
} train_metrics;

/* What one progress line says. */
typedef struct train_progress {
    int epoch;
    long step, steps;
    double step_s, step_avg_s, data_s, data_avg_s;
    double loss, loss_avg, acc1, acc1_avg, acc5, acc5_avg;
    double lr, images_per_s, eta_s;
    int n_aux; /* auxiliary classifiers: their own losses (the loss above weights them in) */
    double aux[MGT_MODEL_MAX_AUX], aux_avg[MGT_MODEL_MAX_AUX];
} train_progress;

/* What the run's first record says: the configuration, resolved where the run resolved it. */
typedef struct train_start {
    const mgt_train_config *c;
    const char *command_line; /* may be NULL */
    const char *arch, *family;
    int devices, nodes, per_device_batch, classes, channels, image_size;
    long steps_per_epoch;
    size_t train_images, val_images;
    int start_epoch;
    long start_step;
    double wall_time; /* seconds since the epoch (1970) */
} train_start;

/* What the end of an epoch (or a lone validation) says. */
typedef struct train_summary {
    int epoch;
    bool trained, validated;
    double train_loss, train_acc1, images_per_s, epoch_s;
    double val_loss, val_acc1, val_acc5;
    long val_images;
    bool ema_validated; /* --model-ema: the EMA model's numbers too */
    double ema_val_loss, ema_val_acc1, ema_val_acc5;
    double lr;        /* the rate of the epoch's last step */
    long global_step; /* (epoch + 1) x steps per epoch: where its points go on a step axis */
    long steps_per_epoch;
    int devices;                     /* training now; profile[0 .. devices - 1] */
    int devices_lost;                /* --on-device-failure continue: dropped so far */
    const mgt_step_profile *profile; /* per device, when the run measured one; else NULL */
} train_summary;

/* A reporter formats records as text, without I/O: it runs under the run's lock. Each entry
   may be NULL (nothing to say about that record). */
typedef struct train_reporter_i {
    void (*start)(mgt_text *out, const train_start *s);
    void (*progress)(mgt_text *out, const train_progress *p);
    void (*summary)(mgt_text *out, const train_summary *s);
} train_reporter_i;

extern const train_reporter_i train_text_reporter; /* the progress lines, " * Acc@1 ..." */
/* JSON lines: "type" "config" (first), then "train" / "epoch" */
extern const train_reporter_i train_json_reporter;
/* TensorBoard event records (tensorboard.c) */
extern const train_reporter_i train_tensorboard_reporter;

/* The reporters of a run and the text they have formatted but not yet written. Formatting
   appends under queue_lock (taken inside the run's lock); writing takes write_lock, then
   queue_lock only to take the queued text, so the devices never wait on a write and lines
   come out in the order they were formatted. */
typedef struct train_reports {
    struct {
        const train_reporter_i *i;
        FILE *f;
        mgt_text queued;
    } sink[3];
    int n;
    pthread_mutex_t queue_lock, write_lock;
    /* curves.svg, drawn from the JSON log after each epoch's record is written (NULL: none) */
    const char *curves_path, *log_path;
    bool epoch_queued; /* an epoch record waits to be written: redraw the curves */
    FILE *warn;        /* where a failed redraw is said, once */
    bool curves_failed;
} train_reports;

/* ---- the run ---- */

enum train_phase { PHASE_TRAIN, PHASE_VAL, PHASE_EXIT };

struct run {
    const mgt_train_config *c; /* &cfg */
    mgt_train_config cfg;      /* the caller's, with the checkpoint's defaults (source.c) */
    mgt_train_controls ctl;    /* the caller's, or the defaults */
    mgt_lr_config lr;          /* c->lr spanning c->epochs */
    const mgt_arch_info *arch;
    mgt_devset *set;
    int n;
    mgt_device *devs[MGT_MAX_DEVICES]; /* the n devices training: the set's, less those lost */
    /* the world: nodes x n replicas; this node's are world ranks wfirst .. wfirst + n - 1 */
    mgt_world *world;
    int node, nodes, wn, wfirst;
    bool primary; /* node 0: logs, checkpoints, the broadcasts' source */
    FILE *out;
    FILE *log;
    FILE *tb;               /* --tensorboard: the event file */
    char curves_path[4096]; /* checkpoint_dir/curves.svg, with a log */
    worker *w;
    mgt_comm *comm;
    float **params, **buffers; /* per device, for broadcasts */
    train_data data;
    /* the phase protocol (step.c), under lock */
    pthread_mutex_t lock;
    pthread_cond_t cv;
    enum train_phase phase_kind;
    long phase;        /* bumped by main to start a phase */
    int done_in_phase; /* workers finished with the current phase */
    int epoch;
    long first_step; /* the epoch's first step (resume mid-epoch) */
    long stop_at;    /* steps of the epoch to run (lowered by a stop) */
    /* --on-device-failure continue: the last step whose all-reduce every device completed
       cleanly (its update is then made by every replica), and the devices that have reached
       the current step's commit */
    long committed;
    int commit_arrived;
    /* the next training phase goes on with the epoch after a re-formation: its metrics carry
       the steps before it (train_metrics_epoch_begin) */
    bool carry_metrics;
    /* a device was lost in the validation of epoch `epoch`: it runs again on the survivors,
       after the epoch's training figures (epoch_summary) */
    bool revalidate;
    /* a worker thread was abandoned (detached): the run itself (heap-allocated) and the worker
       arrays it may still reach are kept, never freed */
    int detached;
    int nw; /* the workers in w (the devices before a re-formation) */
    train_summary epoch_summary;
    /* the devices lost so far and where (--on-device-failure continue) */
    struct train_lost {
        char name[64];
        int epoch;
        long step;
        char phase[32];
        double at;       /* seconds since the run's start, when it was noticed */
        double resume_s; /* from then to training again on the survivors */
    } lost[MGT_MAX_DEVICES];
    int nlost;
    /* failure */
    mgt_abort abort;
    train_failure fail; /* the first (failure.c), under lock */
    double fail_at;     /* when it was recorded (mgt_time_now) */
    /* --on-device-failure continue met a lost device in a multi-node run: it ends the run */
    bool lost_across_nodes;
    bool stop_world; /* a stop is being agreed with the other nodes */
    train_metrics m;
    train_reports reports;
    double best_acc1;
    double ema_decay; /* --model-ema: the adjusted decay (train_ema_decay) */
    double start_s;
    mgt_train_result *res;
    train_scaler scaler; /* between training phases: worker 0's, for checkpoints and resume */
    /* the model's sources (source.c), opened before anything is built */
    mgt_st_file *resume_f, *pretrained_f;
    char resume_path[4096]; /* --resume's file ("auto" resolved); "" when none */
    mgt_ckpt_info ckpt;     /* what the resumed (or -e'd, or --pretrained) checkpoint says */
    long run_images;        /* training images of this call, over its epochs */
    double run_train_s;     /* and the seconds their training phases took */
    bool have_ckpt;
};

/* failure.c: the first failure recorded wins; each records this thread's error text as the
   cause, raises the abort flag and wakes every wait. */
void train_fail(run *r, mgt_status st); /* the text says where */
/* The same for a cause in itself (a timeout, a diverged model): a device fault found after
   it does not take its place. */
void train_fail_root(run *r, mgt_status st);
/* A worker's failure at a step (or validation batch) and stage; root: a cause in itself. An
   MGT_ERR_ABORTED after the flag was raised is another thread's failure and not recorded. */
void train_fail_worker(worker *w, mgt_status st, long step, bool validation, const char *phase,
                       bool root);
void train_fail_remote(run *r, const char *text); /* another node failed: its line */
mgt_status train_marks_create(worker *w);
void train_marks_free(worker *w);
/* Records w's next mark on its stream: the stage `phase` of `step` ends here. */
mgt_status train_mark(worker *w, long step, bool validation, const char *phase);
/* Once the threads have stopped: a device that failed is the failure, placed at the first of
   its worker's marks that ran after the fault (else where its worker noticed it). */
void train_failure_settle(run *r);
/* Whether device i has failed (0: no), and where: 2 with *f its failure placed by its marks or
   its worker's notice, 1 where no step of its worker's names it (*f has its text). */
int train_device_failure(const run *r, int i, train_failure *f);
/* The text of a worker thread stuck in a call past the wait limit (detached, its device
   stranded: mgt_device_strand). */
void train_stuck_text(const run *r, char *out, size_t cap);
/* Keeps p (the run, a worker array) for the process's life: a detached worker's thread may
   reach it when its call comes back. */
void train_keep(void *p);
/* The failure as the run's one line: "mock:0: epoch 1 step 8 (forward): cause". */
void train_failure_line(const run *r, char *out, size_t cap);
void train_failure_format(const run *r, const train_failure *f, char *out, size_t cap);

/* step.c */
/* The longest a wait on a device may take (--device-timeout, else --timeout, else the
   default), and *flag the flag that set it (NULL: none). */
double train_wait_limit(const mgt_train_config *c, const char **flag);
/* --on-device-failure continue, after a failed phase (workers joined): the metrics of the
   steps before upto that the surviving workers enqueued but had not read (a worker
   reads LAG steps behind) go into the epoch's sums, and those of the lost devices where they
   reached the host before the failure. */
void train_meter_left(run *r, const bool *lost, long upto);
mgt_status train_workers_start(run *r);
void train_workers_stop(run *r);
/* train_workers_stop without waiting for the devices; a worker that has not left within the
   wait limit (a thread stuck in a call that does not return) is detached: the number of those
   newly detached. */
int train_workers_join(run *r);
bool train_run_phase(run *r, enum train_phase kind); /* false: the run failed */

/* setup.c */
mgt_status train_open_data(run *r);
mgt_status train_make_workers(run *r);
mgt_status train_make_comm(run *r);
void train_free_parts(run *r);
/* --on-device-failure continue: every worker, the comm and the loaders freed (the datasets
   kept), then made again over r->devs[0 .. r->n - 1] at r->data.per_dev_batch. */
mgt_status train_remake_parts(run *r);

/* run.c, between phases */
/* What train_broadcast copies from replica 0 (node 0's across nodes) to every other replica:
   the batch-norm statistics and counts always (TRAIN_SYNC_BUFFERS alone, before validation and
   checkpoints), with the parameters and the optimizer state too at the start of a run. */
enum train_sync {
    TRAIN_SYNC_BUFFERS = 0,
    TRAIN_SYNC_PARAMS = 1u << 0,
    TRAIN_SYNC_OPTIMIZER = 1u << 1,
};
mgt_status train_broadcast(run *r, unsigned what);
mgt_status train_check_replicas(run *r);
/* Replica 0's parameters and batch-norm statistics are all finite; else MGT_ERR_DEVICE saying
   how many are not and the first tensor of each that holds one. Between phases. */
mgt_status train_check_finite(run *r);
/* A multi-node run's start (epoch, step, best top-1) from node 0, where --resume found it. */
mgt_status train_world_position(run *r, int *epoch, long *step);

/* metrics.c */
void train_metrics_epoch_begin(run *r, bool carry);
/* Adds worker w's numbers for step k (slot) and completes the step when w is the last to
   report it. r->lock held. */
void train_metrics_add(run *r, worker *w, long k, int slot, float loss);
/* out: progress lines; log (may be NULL): JSON lines; tb (may be NULL): TensorBoard records */
void train_reports_init(train_reports *rep, FILE *out, FILE *log, FILE *tb);
void train_reports_free(train_reports *rep);
void train_reports_start(train_reports *rep, const train_start *s);
void train_reports_summary(train_reports *rep, const train_summary *s);
void train_reports_flush(train_reports *rep); /* never with the run's lock held */
/* The configuration of the start record as a JSON object (metrics.c), for the log and
   TensorBoard's text. */
struct cJSON *train_start_json(const train_start *s);

/* tensorboard.c: a new event file in dir (created when missing), for writing records */
mgt_status train_tensorboard_open(const char *dir, FILE **out, char *path, size_t cap);

/* checkpoint.c */

/* The training state a checkpoint holds beside the weights and the optimizer's tensors: one
   member here and one row in checkpoint.c's fields[] each (with the format that adds it). */
typedef struct train_state {
    int format;       /* on load: the file's format */
    int epoch;        /* the epoch to run next */
    long step;        /* the steps of that epoch already done */
    double best_acc1; /* the best validation top-1 so far */
    uint64_t seed;
    int batch_size;        /* the global batch of the run that saved it */
    int devices;           /* its device count */
    char optimizer[16];    /* the kind whose state tensors the file holds */
    double loss_scale;     /* format 3: fp16 loss scaling's scale (MGT_SCALER_INIT unused) */
    int loss_scale_growth; /* format 3: its clean steps since the last change */
    char amp[8];           /* the run's --amp, for people (not read back) */
    char sync_bn[4];       /* the run's --sync-bn ("yes"/"no"), for people (not read back) */
    /* "on" where the model maps its input (transform_input): a resumed run must too */
    char transform_input[4];
    long optimizer_steps;   /* (3) updates done: torch's per-parameter "step" */
    long ema_n_averaged;    /* (3) the EMA model's n_averaged (0 without --model-ema) */
    char lr_schedule[160];  /* what the schedule was, for people (not read back) */
    char sampler[96];       /* where the sampler stood, for people (not read back) */
    char devices_lost[160]; /* --on-device-failure continue: who and when (not read back) */
} train_state;

/* The training state of an open file; format 0 (nothing else set) when it holds none. Errors
   name the file and the key. */
mgt_status train_state_read(const mgt_st_file *f, const char *path, train_state *s);
/* "--resume PATH: cause" from an error whose text starts with the path, as every error of the
   loads does: the flag goes in front with a space, the way the user typed them. */
mgt_status train_flag_error(mgt_status st, const char *flag);
/* The tensor name prefixes of the training state, NULL-terminated: a model load ignores them. */
extern const char *const train_opt_prefixes[];
/* Writes checkpoint.safetensors (and model_best when is_best, model_<epoch> under
   --keep-last) and says so in one line with acc1 (< 0: not validated). */
mgt_status train_checkpoint_save(run *r, int next_epoch, long next_step, bool is_best, double acc1);
/* A fresh run into a folder with another run's checkpoints: MGT_ERR_USAGE unless --resume,
   --overwrite or -e. */
mgt_status train_checkpoint_dir_check(run *r);
/* --on-device-failure continue: replica 0's state at (next_epoch, next_step) as a checkpoint
   at path, and such a file back into replica 0 of the re-formed run (broadcast later). */
mgt_status train_handover_save(run *r, const char *path, int next_epoch, long next_step);
mgt_status train_handover_load(run *r, const char *path);
/* --resume: the checkpoint into replica 0 (broadcast later); *epoch and *step (on entry the
   start the flags give) get where to go on; untouched when there is nothing to resume. */
mgt_status train_resume(run *r, int *epoch, long *step);

/* ema.c */
#define TRAIN_EMA_PREFIX "model_ema."
mgt_status train_ema_create(run *r, worker *w); /* nothing without --model-ema */
void train_ema_free(worker *w);
/* After an optimizer step, on w's stream: the references' update_parameters. */
mgt_status train_ema_update(worker *w);
/* The EMA weights into every replica's model (its own kept aside), replica 0's statistics
   broadcast; and back. Both between phases. */
mgt_status train_ema_swap_in(run *r);
mgt_status train_ema_swap_out(run *r);
/* Replica 0's EMA as "model_ema." tensors borrowing *host (malloc'd; free after the save). */
mgt_status train_ema_add_to_writer(run *r, mgt_st_writer *wr, void **host);
/* The file's EMA into every replica (none in the file: the EMA starts afresh). */
mgt_status train_ema_load(run *r, const mgt_st_file *f, const char *path, long n_averaged);

/* pretrained.c */
mgt_status train_load_pretrained(run *r);

/* source.c */
/* Opens --resume's file (auto: CHECKPOINT_DIR/checkpoint.safetensors, when there) and
   --pretrained's, so that a file that cannot be used is said before anything is built. */
mgt_status train_open_sources(run *r);
void train_close_sources(run *r);
/* The checkpoint's architecture, input size and channels, normalisation and validation
   transform into c where the flags left them unset (-e, --resume; --pretrained gives the
   architecture only), in one "=> from FILE: ..." line; a flag that overrides one says so.
   A -a that contradicts the checkpoint of -e or --resume is refused. */
mgt_status train_checkpoint_defaults(run *r, mgt_train_config *c);
/* After the data is open: the checkpoint's class count must be the data's (-e, --resume), and
   other class names are said. */
mgt_status train_check_data_against(run *r);
/* The model's description every checkpoint carries beside mgt_model_add_to_writer's arch,
   classes, in_channels and image_size: family, class_names (a JSON list), mean and std (JSON
   lists, one number per channel), val_resize_size, val_crop_size, interpolation: what
   mgt_ckpt_info_read gives back. */
mgt_status train_add_model_info(run *r, mgt_st_writer *w);

#endif
