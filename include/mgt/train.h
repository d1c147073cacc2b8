/* The multi-device trainer: one thread per device, each with a model replica and a shard of
 * the data, gradients summed by the bucketed all-reduce while backward runs, SGD on every
 * replica, exact validation, checkpoints and resume, and failure without hangs.
 */
#ifndef MGT_TRAIN_H
#define MGT_TRAIN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "mgt/comm.h"
#include "mgt/data.h"
#include "mgt/device.h"
#include "mgt/nn.h"
#include "mgt/optim.h"
#include "mgt/safetensors.h"
#include "mgt/world.h"

typedef enum mgt_augment {
    MGT_AUGMENT_DEFAULT,  /* the architecture's (mgt_arch_info.augment, mgt/nn.h) */
    MGT_AUGMENT_RRC,      /* RandomResizedCrop + flip */
    MGT_AUGMENT_PAD_CROP, /* RandomCrop(size, padding 4) + flip */
    MGT_AUGMENT_NONE,     /* the evaluation transform for training too */
} mgt_augment;

/* What a user sets: the recipe, the data, the checkpoints. Every field has the meaning of the
   mgtrain flag of the same name (mgtrain train --help). */
typedef struct mgt_train_config {
    const char *data_dir; /* ImageFolder root (DIR/train, DIR/val), a pack file or a folder
                             of train.pack and val.pack (mgt_data_open); unused with dummy */
    bool dummy;           /* synthetic data: fixed random batches, no files */
    int dummy_classes;    /* with dummy: 0 = the architecture's synthetic_classes */
    int dummy_steps;      /* with dummy: steps per epoch (100) */
    int dummy_channels;   /* with dummy: image channels (3) */
    const char *arch;     /* NULL: the checkpoint's (--resume, -e, or --pretrained's mgtrain
                         checkpoint), else resnet18 */
    int workers;          /* decode threads in total; -1: one per core */
    int epochs;           /* the run's length, and the length of the lr schedule */
    int start_epoch;      /* -1: 0, or the checkpoint's with resume */
    int batch_size;       /* over all devices; each gets batch_size / devices */
    mgt_lr_config lr;     /* lr.epochs is ignored: the schedule spans `epochs` */
    float momentum, weight_decay;
    bool nesterov;
    mgt_opt_kind opt;        /* --opt (sgd); sgd with nesterov is sgd_nesterov */
    float norm_weight_decay; /* norm layers' weight and bias (batch and layer norms); < 0:
                                weight_decay (not given) */
    float bias_weight_decay; /* every parameter named "bias", norms' too; < 0: not given */
    /* the parameters named class_token, position_embedding or relative_position_bias_table
       (the references' custom keys: ViT's class token, Swin's and MaxViT's tables; ViT's
       "pos_embedding" is not one of them, as in torchvision's train.py); < 0: not given */
    float transformer_embedding_decay;
    float clip_grad_norm;  /* the reduced gradients' global L2 norm at most this; 0: off */
    int accum_steps;       /* micro-batches per update, one all-reduce each K (1) */
    bool model_ema;        /* keep and validate an EMA of the weights and BN buffers */
    float model_ema_decay; /* the references' (0.99998), adjusted for batch and steps */
    int model_ema_steps;   /* update the EMA every this many optimizer steps (32) */
    float label_smoothing;
    int print_freq;
    const char *resume;         /* a checkpoint path, "auto" (checkpoint_dir's, if any), or NULL */
    bool evaluate;              /* validate once and stop */
    bool per_class;             /* -e: every class's top-1 (else the five lowest) */
    const char *confusion_path; /* -e: the confusion matrix as CSV with class names; NULL: none */
    bool overwrite;             /* a fresh run may overwrite checkpoint_dir's checkpoints */
    int keep_last;              /* also keep the last N epochs as model_<epoch>.safetensors */
    const char *pretrained;     /* safetensors weights with torchvision names (or an mgtrain
                               checkpoint, whose optimizer state and metadata are ignored) */
    uint64_t seed;
    const char *checkpoint_dir; /* NULL: no checkpoints */
    size_t bucket_bytes;
    mgt_allreduce_algo allreduce;    /* tree (the default) or ring */
    mgt_node_exchange node_exchange; /* across nodes: auto (the default), allgather or
                                        reduce-scatter (mgt/comm.h) */
    const char *log_path;            /* JSON lines; NULL: none */
    const char *tensorboard_dir;     /* TensorBoard event files go here; NULL: none */
    double time_limit_s;             /* stop (with a checkpoint) after this long; 0: none */
    double step_timeout_s;           /* abort when no step finishes for this long; 0: none */
    /* --on-device-failure continue: a device that fails in a training step (a kernel or
       runtime error, an allocation, a peer copy, no progress for device_timeout_s) is dropped
       and the survivors go on from that step at the same global batch, down to min_devices;
       false: the run ends (abort, the default). One node only. */
    bool continue_on_device_failure;
    int min_devices;         /* the fewest devices to go on with (0: 1) */
    double device_timeout_s; /* the longest a wait on one device may take; 0: --timeout's */
    int image_size;          /* 0: the checkpoint's (-e, --resume), else the
                                     architecture's (mgt_arch_info.image_size) */
    int image_channels;      /* 0: the checkpoint's (-e, --resume), else the data's */
    mgt_augment augment;
    bool mean_std_set; /* mean/std given; otherwise ImageNet's */
    float mean[3], std[3];
    bool normalize_auto; /* compute mean/std from the training images */
    bool zero_init_residual;
    /* Inception v3's and GoogLeNet's auxiliary classifiers (mgt/nn.h): -1 as torchvision
       builds them (on; GoogLeNet's off under --pretrained, its ported heads never trained),
       0 off, 1 on; each one's loss weight (< 0: mgt_arch_info.aux_weight); transform_input
       (-1: on under --pretrained, as torchvision sets it when it loads weights; 0 off, 1 on) */
    int aux_logits;
    float aux_weight;
    int transform_input;
    bool freeze_bn; /* BN normalises with its running statistics in training too and
                       leaves them alone; gamma and beta still train (mgt/nn.h) */
    bool sync_bn;   /* BN statistics over every device's batch (SyncBatchNorm; one node) */
    bool strict_data;
    double max_bad_frac;
    /* torchvision's references recipe (mgt/data.h) */
    mgt_interp interpolation;        /* resizes and geometric policy ops (bilinear) */
    bool interpolation_set;          /* given (else the checkpoint's under -e, --resume) */
    mgt_auto_augment auto_augment;   /* after the crop and flip (none) */
    int augmix_severity;             /* --auto-augment augmix: its severity, 1..10 (3) */
    float random_erase;              /* RandomErasing's probability (0) */
    float mixup_alpha, cutmix_alpha; /* batch mixing (0: off) */
    int ra_magnitude;                /* RandAugment's magnitude bin of 31 (9) */
    /* torchvision's RASampler for training (--ra-sampler): each image ra_reps times per epoch
       on different devices (mgt/data.h's MGT_SPLIT_RA) */
    bool ra_sampler;
    int ra_reps;         /* (3) */
    int val_resize_size; /* the shorter side before the centre crop (0: the arch's) */
    int val_crop_size;   /* 0: the training size; another (FixRes: train at 176,
                                      validate at 224) validates a twin of each replica
                                      planned for that size */
    bool exact_decode;   /* JPEGs whole at full scale: torchvision's pixels */
    /* mixed precision (mgt/nn.h's mgt_model_config.amp): F32 (off), BF16 or FP16; fp16 runs
       with dynamic loss scaling (MGT_SCALER_*) */
    mgt_precision amp;
    mgt_precision grad_dtype; /* the all-reduce's values: F32, or BF16 (rounded to bf16) */
    float loss_scale_init;    /* fp16: the first loss scale (GradScaler's init_scale); 0:
                                 MGT_SCALER_INIT */
} mgt_train_config;

/* fp16 loss scaling, torch.cuda.amp.GradScaler's defaults: the first scale, the factor after
   MGT_SCALER_INTERVAL steps without an inf or NaN in the reduced gradients, and the factor
   after a step with one (which is skipped on every replica). */
#define MGT_SCALER_INIT 65536.0f
#define MGT_SCALER_GROWTH 2.0f
#define MGT_SCALER_BACKOFF 0.5f
#define MGT_SCALER_INTERVAL 2000

/* What a checkpoint says of its model, from its metadata (every mgtrain checkpoint holds it;
   older ones the first four): what -e, --resume, `mgtrain predict` and `mgtrain export` take
   as their defaults. A field the file lacks is empty (arch ""), -1 or false. */
typedef struct mgt_ckpt_info {
    char arch[64];
    int classes, in_channels, image_size;
    char **class_names; /* classes strings (malloc'd), or NULL when the file has none */
    bool has_norm;      /* mean and std, per channel (in_channels of them) */
    float mean[3], std[3];
    int val_resize_size; /* the validation resize (shorter side) before the centre crop at
                                 image_size; -1: not saved */
    int val_crop_size;   /* the validation crop; -1: not saved (image_size) */
    bool has_interp;
    mgt_interp interpolation; /* the validation resize's */
    bool is_checkpoint;       /* it holds training state (epoch, step, ...) */
    int epoch;                /* with is_checkpoint: the next epoch it would train */
    double best_acc1;         /* with is_checkpoint */
} mgt_ckpt_info;

/* Reads what f (opened from path) says of its model. Errors name the path and the key of a
   malformed value (a class_names that is not a list of `classes` strings, a mean that is not
   numbers); a key the file lacks is no error. Free with mgt_ckpt_info_free. */
mgt_status mgt_ckpt_info_read(const mgt_st_file *f, const char *path, mgt_ckpt_info *out);
void mgt_ckpt_info_free(mgt_ckpt_info *i);
/* The validation transform the info describes: RESIZE_CROP at image_size (or val_crop_size)
   from val_resize_size, with its mean, std and interpolation; what the file lacks comes from
   the architecture's policy and ImageNet's normalisation. MGT_ERR_INVALID when it has no
   architecture, size or channels. */
mgt_status mgt_ckpt_info_transform(const mgt_ckpt_info *i, mgt_transform *t);

/* The defaults of the ImageNet example (resnet18, 90 epochs, -b 256, lr 0.1, ...). */
void mgt_train_config_defaults(mgt_train_config *c);

/* The weight decay c gives parameter e, as the references' set_weight_decay groups it: the
   custom keys by the parameter's own name first (bias_weight_decay for "bias",
   transformer_embedding_decay for class_token, position_embedding and
   relative_position_bias_table), then norm_weight_decay for batch and layer norms' weights
   and biases, else weight_decay (a negative one of the three: not given). */
float mgt_train_weight_decay(const mgt_train_config *c, const mgt_model_entry *e);

/* What the caller of a run switches, which is no part of the recipe: where the output goes,
   how the run is stopped and cut short, what is measured. Zeroed (or a NULL pointer to
   mgt_train_run): progress to stdout, no stop flag, whole epochs, validation, no profile. */
typedef struct mgt_train_controls {
    FILE *out;                /* progress lines; NULL: stdout */
    const atomic_int *stop;   /* (optional) raised by Ctrl-C: stop at a step boundary, save */
    long max_steps;           /* training steps per epoch at most; 0: all (--max-steps, tests) */
    int warmup_steps;         /* steps of each epoch left out of the timed throughput and the
                               profile (the first steps grow caches and fault pages in) */
    bool no_validation;       /* skip validation (benchmarks) */
    bool profile;             /* time forward, backward, exposed reduction and optimizer on
                               each device with events (for mgtrain bench) */
    bool op_profile;          /* the devices' per-op profile (mgt_device_op_profile) over the
                                 steps after warmup_steps, read from the device set after the
                                 run (mgtrain bench --op-profile) */
    mgt_world *world;         /* (optional) the nodes of a multi-node run, each running this
                               with the same flags and local device count: the replicas are
                               the world's devices (node rank x local devices + local index),
                               -b is over all of them, node 0's replica 0 is the source of
                               every broadcast, only node 0 writes logs and checkpoints
                               (progress lines go to `out` on every node: the caller silences
                               the others). NULL: this process alone */
    const char *command_line; /* (optional) what started the run, for the log's first record */
} mgt_train_controls;

/* Device time per step, averaged over the timed steps, from events on the compute stream. */
typedef struct mgt_step_profile {
    double data_s;    /* the host's wait for the batch */
    double forward_s; /* forward and loss */
    double backward_s;
    double reduce_exposed_s; /* the all-reduce's tail that backward did not hide */
    double optimizer_s;
    long steps;
} mgt_step_profile;

typedef struct mgt_train_result {
    int epochs_done;                     /* complete epochs run in this call */
    long steps;                          /* training steps run in this call */
    double train_loss;                   /* the last epoch's mean training loss over all devices */
    double val_loss, val_acc1, val_acc5; /* the last validation */
    double ema_val_loss, ema_val_acc1, ema_val_acc5; /* with model_ema: the EMA model's */
    double best_acc1;
    double images_per_s;                       /* training images per second, the last epoch */
    double timed_images_per_s;                 /* the same after the warm-up steps */
    double timed_step_s;                       /* seconds per step after the warm-up steps */
    mgt_step_profile profile[MGT_MAX_DEVICES]; /* with profile: per device, the last epoch */
    float loss_scale;        /* --amp fp16: the loss scale at the end (GradScaler's) */
    long skipped_steps;      /* --amp fp16: steps this call skipped for an inf or NaN */
    bool interrupted;        /* stopped early by stop or the time limit, checkpoint saved */
    bool remote_failure;     /* the run failed because another node did (which says why) */
    char checkpoint[4200];   /* the last checkpoint written ("" when none) */
    int best_epoch;          /* the epoch of best_acc1 (-1: none validated in this run) */
    double total_s;          /* the whole run, set-up included */
    double run_images_per_s; /* training images per second over every epoch of this call */
    size_t peak_bytes[MGT_MAX_DEVICES]; /* each device's most memory in use */
    /* -e: the confusion matrix [true][predicted] (classes x classes; mgt_train_result_free
       frees it) and its class count; NULL without -e */
    long *confusion;
    int confusion_classes;
} mgt_train_result;

/* Runs the training (or, with evaluate, one validation) on the devices of set; ctl may be
   NULL. Errors carry one line naming the device, the step and the cause (a bad or
   contradictory setting: MGT_ERR_USAGE naming the field's flag; a bad file: MGT_ERR_INVALID);
   the last good checkpoint is kept, and nothing is saved from a diverged model. */
mgt_status mgt_train_run(const mgt_train_config *c, const mgt_train_controls *ctl, mgt_devset *set,
                         mgt_train_result *r);
/* Frees what a result holds (-e's confusion matrix); the numbers stay. */
void mgt_train_result_free(mgt_train_result *r);

/* ---- mgtrain predict ---- */

#define MGT_PREDICT_MAX_K 20

typedef struct mgt_predict_config {
    const char *weights;       /* an mgtrain checkpoint (its metadata describes the model), or
                                torchvision weights (then arch is needed) */
    const char *arch;          /* NULL: the checkpoint's */
    int image_size;            /* 0: the checkpoint's, else the architecture's */
    int in_channels;           /* 0: the checkpoint's, else 3 */
    const char *class_names;   /* (optional) a file of names, one a line */
    const char *const *inputs; /* image files and folders (every image under them) */
    int n_inputs;
    int top_k;         /* classes per image (5) */
    int batch_size;    /* images per step over all devices (32) */
    int workers;       /* decode threads; -1: one per core */
    mgt_precision amp; /* as --amp */
    bool json;         /* one JSON object a line: path, top [{class, index, probability}] */
    FILE *out;         /* the predictions */
    FILE *info;        /* the "=>" line and the warnings; NULL: stderr */
} mgt_predict_config;

typedef struct mgt_predict_result {
    size_t images, failed; /* images named, and those that could not be read */
} mgt_predict_result;

void mgt_predict_config_defaults(mgt_predict_config *c);
/* Predicts every image of c->inputs with the model of c->weights through its validation
   transform (mgt_ckpt_info_transform), batched over set's devices, in the order the inputs
   name them (a folder's images sorted); an image that cannot be read gets its line with the
   reason in the warnings and counts as failed. MGT_ERR_USAGE for contradictory settings. */
mgt_status mgt_predict_run(const mgt_predict_config *c, mgt_devset *set, mgt_predict_result *r);

/* Training curves from JSON logs written by --log: loss, top-1 and lr against epochs
   (training per progress line, validation and the EMA model's per epoch), the logs overlaid
   in one SVG at svg_path (written through a temporary file and a rename). labels (may be
   NULL) name the logs in the legend; by default their file names. 1 to 6 logs. */
mgt_status mgt_train_plot_curves(const char *const *logs, const char *const *labels, int n,
                                 const char *svg_path);

#endif
