/* Image classifiers on the device interface: build by name, initialise, forward, loss, backward
 * with a gradient-ready hook, and weights in torchvision's names through safetensors.
 *
 * A model is a graph of layers (src/nn/model_impl.h) that a family's constructor builds in
 * forward order, each layer with its torchvision module name; the ResNets are one family.
 *
 * A model owns four device allocations made once at creation, none in the step loop:
 *   params   every learnable tensor, each at a 256-byte aligned offset (zero padding between);
 *   grads    the same layout; backward accumulates (+=) into it, mgt_model_zero_grad clears it;
 *   buffers  BN running_mean and running_var;
 *   acts     activations and what backward needs (every layer output that is not computed
 *            in place over its input, BN save_mean / save_invstd, probabilities, the loss,
 *            the gradient slots backward cycles through; under freeze_bn a constant ones and
 *            zeros vector), sized for config.batch images.
 * BN num_batches_tracked lives on the host (int64, one per BN), counted per training forward
 * (not under freeze_bn).
 *
 * Parameter offsets follow the order in which backward completes layers, the reverse of the
 * forward order (for a ResNet: fc first, then the blocks from the last to the first, in a
 * block the downsample BN and conv, then the main path's BN and conv pairs from the last,
 * conv1/bn1 last). So the gradients ready so far are always the prefix [0, ready) of the
 * grad arena, and the backward hook reports `ready` as each layer's parameter gradients are
 * enqueued (mgt_model_layer_ends lists those points): the all-reduce can start on buckets
 * early, for every family.
 *
 * Every call that enqueues work takes the stream it runs on; a model is used by one host
 * thread at a time. Pointers into the model (mgt_model_params, logits, ...) are borrowed and
 * die with it.
 */
#ifndef MGT_NN_H
#define MGT_NN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mgt/device.h"
#include "mgt/safetensors.h"
#include "mgt/status.h"

typedef struct mgt_model mgt_model;

typedef struct mgt_model_config {
    const char *arch;        /* one of mgt_model_arch_names(); copied */
    int classes;             /* fc outputs, >= 1 */
    int in_channels;         /* 1..4 (1 grey, 3 RGB) */
    int image_size;          /* square input side, >= 1 */
    int batch;               /* the most images one forward takes (sizes the activation arena) */
    bool zero_init_residual; /* mgt_model_init sets each block's last BN weight to 0 */
    /* Frozen batch norm: a training forward normalises with each BN's running statistics,
       as evaluation does, and leaves them (and num_batches_tracked) alone; gamma and beta
       still train. Backward is then that affine map's: with invstd = 1/sqrt(running_var +
       eps) and xhat = (x - running_mean) * invstd, dx = dy * gamma * invstd,
       dgamma += sum dy * xhat, dbeta += sum dy. No statistic then depends on how a batch is
       split, so N replicas at global batch B step exactly as one at B does (to float
       rounding), and a training batch of one image is allowed. */
    bool freeze_bn;
    /* Mixed precision as PyTorch's autocast runs it: MGT_PREC_BF16 or FP16 puts convolutions
       and linear layers (forward and both backward products) on their _lp kernels, inputs
       rounded to 16 bits, products summed and results kept in fp32; batch norm, the loss and
       every parameter, gradient and statistic stay fp32. MGT_PREC_F32 (0): plain fp32. */
    mgt_precision amp;
    /* Every dropout and stochastic-depth layer built with p = 0 (the deterministic form that
       PyTorch goldens compare against; the masks have tests of their own). */
    bool no_dropout;
    /* Synchronised batch norm (PyTorch's SyncBatchNorm): a training BN normalises with the
       statistics of every replica's batch, through the hook mgt_model_set_bn_sync installs
       (none installed: this replica alone). Ignored under freeze_bn. */
    bool sync_bn;
    /* Every layer on its own kernels: no ReLU folded into the batch norm before it. The
       folded pair gives the same bits; tests compare the two. */
    bool no_fusion;
    /* Inception v3 and GoogLeNet without their auxiliary classifiers (torchvision's
       aux_logits=False): neither built nor in the state_dict. Ignored by the architectures
       that have none. */
    bool no_aux_logits;
    /* torchvision's transform_input (Inception v3, GoogLeNet; refused elsewhere): the input,
       normalised with ImageNet's mean and std, is mapped per channel to (x - 0.5) / 0.5 of
       the pixel, the normalisation their ported weights were trained with. torchvision sets
       it when it loads pretrained weights and leaves it off otherwise. */
    bool transform_input;
    /* Evaluation only: no gradient arena is allocated (a training forward, backward and
       zero_grad are refused). What a validation twin at another input size needs (FixRes). */
    bool inference;
} mgt_model_config;

/* How a sync_bn model reaches the other replicas without knowing them: gather(ctx, mine,
   all, n) returns every replica's n numbers in all[replica * n], the same order in every
   replica; replicas counts them (this one included). */
typedef struct mgt_bn_sync {
    mgt_status (*gather)(void *ctx, const double *mine, double *all, size_t n);
    void *ctx;
    int replicas;
    const mgt_abort *abort; /* the host waits for the device's numbers abortably */
} mgt_bn_sync;

/* The architecture names mgt_model_create accepts, NULL-terminated (static). */
const char *const *mgt_model_arch_names(void);

/* ---- architecture policy (arch.c) ---- */

typedef enum mgt_arch_augment {
    MGT_ARCH_AUGMENT_RRC,      /* RandomResizedCrop + flip (torchvision's ImageNet recipe) */
    MGT_ARCH_AUGMENT_PAD_CROP, /* RandomCrop(size, padding 4) + flip (the CIFAR recipe) */
} mgt_arch_augment;

typedef enum mgt_arch_eval {
    MGT_ARCH_EVAL_RESIZE_CROP, /* Resize(resize_size, or size * 256 / 224) + CenterCrop(size) */
    MGT_ARCH_EVAL_NATIVE,      /* the images as they are; resized to size (shorter side) and
                                  centre-cropped only when they are not size x size */
} mgt_arch_eval;

/* What an architecture is trained and validated with unless the user says otherwise. */
typedef struct mgt_arch_info {
    const char *name;         /* as mgt_model_create takes it */
    const char *family;       /* "resnet" (torchvision), "cifar_resnet" (He et al. 2016) */
    int image_size;           /* the default input side; 0: the images' own (their shorter side) */
    int synthetic_size;       /* the input side of synthetic (--dummy) data */
    int synthetic_classes;    /* the class count of synthetic data */
    mgt_arch_augment augment; /* the default training augmentation */
    mgt_arch_eval eval;       /* the validation transform */
    /* MGT_ARCH_EVAL_RESIZE_CROP: the shorter side before the centre crop at image_size
       (torchvision's weights' resize_size); at another input side it scales with it. 0: 256
       at 224 */
    int resize_size;
    /* The auxiliary classifiers' loss weight (each one's: the loss trained is the main loss
       plus aux_weight times each auxiliary loss), 0 for an architecture without them */
    float aux_weight;
    /* torchvision's transform_input: what the model does to its input when pretrained
       weights are loaded (mgt_model_config.transform_input), false where it has none */
    bool transform_input;
    /* torchvision's builder drops the auxiliary classifiers when it loads pretrained weights
       unless asked to keep them (GoogLeNet: its ported heads were never trained) */
    bool pretrained_drops_aux;
} mgt_arch_info;

/* The policy of every architecture, in table order (static); *n gets the count. */
const mgt_arch_info *mgt_arch_list(int *n);
/* The policy of the architecture called name, or NULL when there is none. */
const mgt_arch_info *mgt_arch_find(const char *name);
/* The input side to train a at on width x height images: its default, or their shorter side. */
int mgt_arch_image_size(const mgt_arch_info *a, int width, int height);
/* The validation resize (shorter side) of a's MGT_ARCH_EVAL_RESIZE_CROP before a centre crop
   of size: resize_size at a's own side, the same ratio at another (256/224 by default). */
int mgt_arch_resize_size(const mgt_arch_info *a, int size);

/* Builds the model's layout and, when d is not NULL, allocates its arenas on d (parameters
   zeroed, not initialised: call mgt_model_init or a load). With d NULL the model only
   describes itself (table, layers, counts): the calls that touch memory refuse it. */
mgt_status mgt_model_create(const mgt_model_config *cfg, mgt_device *d, mgt_model **out);
/* Waits for the device's pending work (as buffer frees do). NULL is a no-op. */
void mgt_model_free(mgt_model *m);
const mgt_model_config *mgt_model_get_config(const mgt_model *m); /* arch is the model's copy */
/* The architecture's classifier head: its module names, space-separated ("fc", "classifier.1"),
   whose tensors have `classifier` set in the table, as have the auxiliary classifiers' last
   layers (Inception v3's AuxLogits.fc, GoogLeNet's aux1.fc2 and aux2.fc2: training only, not
   named here). Static. */
const char *mgt_model_head(const mgt_model *m);

/* torchvision's initialisation, drawn on the host from a Philox stream per tensor keyed by
   seed (MGT_RNG_INIT, index = the tensor's table position) and copied in: convs
   kaiming_normal_(mode='fan_out', nonlinearity='relu'), BN weight 1 and bias 0 (0 for the last
   BN of each block under zero_init_residual), running mean 0 and var 1, num_batches_tracked 0,
   fc weight and bias uniform(+-1/sqrt(fan_in)). Synchronises s before it returns. */
mgt_status mgt_model_init(mgt_model *m, mgt_stream *s, uint64_t seed);

/* ---- the step ---- */

/* Enqueues the forward of `batch` images (1..config.batch) at x [batch, in_channels, size,
   size]. train: BN uses batch statistics, moves the running ones and counts
   num_batches_tracked (under config.freeze_bn it uses the running ones, unchanged, as
   evaluation does, but backward may follow); otherwise it uses the running ones.
   *logits (may be NULL) gets the device pointer of [batch, classes]. x is borrowed until
   backward has been enqueued (conv1's filter gradient reads it) and must not change before
   that work runs. Under freeze_bn the running statistics must not change between a training
   forward and its backward either (nothing in the step changes them). */
mgt_status mgt_model_forward(mgt_model *m, mgt_stream *s, const float *x, int batch, bool train,
                             const float **logits);

/* The key of the next training forwards' dropout masks (and so of their backward): seed,
   step, and the global sample index of image 0 and the distance between images (the key's
   stream is each dropout layer's own). With the sampler's layout, image i of replica r at
   step k of a global batch B is the sample k*B + r + i*N of the epoch (N replicas), so the
   masks do not depend on the device count. Until set: all zero. */
void mgt_model_set_dropout_key(mgt_model *m, const mgt_dropout_key *key);

/* sync_bn's merge, as every replica runs it: all holds `replicas` blocks of [count, mean[c],
   biased var[c]] (one per replica, in order); out: the merged mean, biased variance, invstd
   (of the float variance), the running statistics moved (momentum, unbiased variance) and
   the total count. Chan's pairwise update in double, replica after replica: PyTorch's
   batch_norm_gather_stats_with_counts. */
void mgt_bn_sync_merge(const double *all, int replicas, int channels, double eps, double momentum,
                       float *mean, float *var, float *invstd, float *running_mean,
                       float *running_var, double *count);

/* Installs the sync_bn exchange (copied); host memory for it is sized here. */
mgt_status mgt_model_set_bn_sync(mgt_model *m, const mgt_bn_sync *sync);

/* Enqueues softmax cross-entropy of the last forward's logits against int32 labels [batch]
   (device; borrowed until backward) with label smoothing; the mean over the batch goes to
   mgt_model_loss_ptr. correct (device int32 [2], may be NULL) accumulates top-1 and top-5
   (top-min(5, classes)) hits. */
mgt_status mgt_model_loss(mgt_model *m, mgt_stream *s, const int32_t *labels, float smoothing,
                          int32_t *correct);
/* device float [1]; after a training forward of a model with auxiliary classifiers, the main
   loss plus aux_weight times each auxiliary loss (what backward differentiates) */
const float *mgt_model_loss_ptr(const mgt_model *m);

/* Auxiliary classifiers (Inception v3's one, GoogLeNet's two, unless config.no_aux_logits):
   run by training forwards only, as torchvision's; the loss adds each one's cross-entropy
   (the same targets, smoothing and mixing as the main one) times the weight. */
#define MGT_MODEL_MAX_AUX 2 /* the most any architecture has */
int mgt_model_aux_count(const mgt_model *m);
/* device float [aux_count]: each auxiliary loss, unweighted, of the last training loss; NULL
   without auxiliary classifiers */
const float *mgt_model_aux_loss_ptr(const mgt_model *m);
/* The weight of each auxiliary loss; mgt_arch_info.aux_weight until set (0.4 for Inception
   v3, 0.3 for GoogLeNet). */
void mgt_model_set_aux_weight(mgt_model *m, float weight);
float mgt_model_aux_weight(const mgt_model *m);
/* The same against mixup/cutmix targets w onehot(labels) + (1 - w) onehot(labels_b) (device
   int32 [batch] twice, float [batch]; borrowed until backward), smoothing on top; the
   accuracy counts `labels`, the sample's own. */
mgt_status mgt_model_loss_mixed(mgt_model *m, mgt_stream *s, const int32_t *labels,
                                const int32_t *labels_b, const float *weights, float smoothing,
                                int32_t *correct);

/* Called on the host while backward enqueues, each time a layer's parameter gradients have
   been enqueued on s: grads [0, ready_bytes) are then final once s reaches this point. The
   last call has ready_bytes == mgt_model_grads' bytes. A non-OK status stops backward and is
   returned from it. */
typedef mgt_status (*mgt_grad_ready_fn)(void *ctx, mgt_stream *s, size_t ready_bytes);

/* Enqueues the backward of the last forward + loss (which must have been a training one):
   parameter gradients accumulate into the grad arena. hook may be NULL. */
mgt_status mgt_model_backward(mgt_model *m, mgt_stream *s, mgt_grad_ready_fn hook, void *ctx);

/* Backward starts from scale times the loss's gradient (fp16 loss scaling: the parameter
   gradients come out multiplied by scale); 1 until set. */
void mgt_model_set_loss_scale(mgt_model *m, float scale);

/* One memset over the whole grad arena. */
mgt_status mgt_model_zero_grad(mgt_model *m, mgt_stream *s);

/* ---- memory ---- */

/* Device base pointer and bytes of each arena (NULL, 0 for a model without a device). */
float *mgt_model_params(const mgt_model *m, size_t *bytes);
float *mgt_model_grads(const mgt_model *m, size_t *bytes);
float *mgt_model_buffers(const mgt_model *m, size_t *bytes);
/* The activation arena's bytes (as allocated, or as it would be for a describing model). */
size_t mgt_model_activation_bytes(const mgt_model *m);
/* num_batches_tracked of every BN, in table order of the BN layers; n gets the count. */
int64_t *mgt_model_bn_counts(mgt_model *m, int *n);

/* ---- the table ---- */

typedef enum mgt_model_role {
    MGT_MODEL_PARAM,   /* in params (and grads at the same offset) */
    MGT_MODEL_BUFFER,  /* in buffers */
    MGT_MODEL_COUNTER, /* num_batches_tracked: host int64, offset = index into bn_counts */
    /* a constant int64 tensor of the definition (Swin's relative_position_index): on the host
       (mgt_model_index_values), saved as torchvision has it; a load checks the file's values
       are the same (they follow from the window size) and takes nothing */
    MGT_MODEL_INDEX,
} mgt_model_role;

/* What a tensor is, so that optimizers can group parameters (weight decay for norms and
   biases, ...) without parsing names. */
typedef enum mgt_model_what {
    MGT_TENSOR_CONV_WEIGHT,
    MGT_TENSOR_LINEAR_WEIGHT,
    MGT_TENSOR_BIAS,        /* of a convolution or a linear layer */
    MGT_TENSOR_NORM_WEIGHT, /* batch norm (or layer norm) gamma */
    MGT_TENSOR_NORM_BIAS,   /* beta */
    MGT_TENSOR_SCALE,       /* a learnable per-channel multiplier (ConvNeXt's layer_scale) */
    MGT_TENSOR_RUNNING_MEAN,
    MGT_TENSOR_RUNNING_VAR,
    MGT_TENSOR_NUM_BATCHES, /* num_batches_tracked */
    /* a learned embedding: ViT's class token and position embedding, a relative position
       bias table (--transformer-embedding-decay's group) */
    MGT_TENSOR_EMBEDDING,
    MGT_TENSOR_CONSTANT, /* a constant of the definition: relative_position_index, relative_coords_table */
} mgt_model_what;

typedef struct mgt_model_entry {
    char name[128]; /* torchvision's state_dict name (MaxViT's reach 83 characters) */
    mgt_model_role role;
    mgt_model_what what;
    int layer; /* index into mgt_model_layers of the layer that owns it */
    /* its shape depends on the class count: a tensor of the architecture's classifier head
       (mgt_model_head) or of an auxiliary classifier's last layer */
    bool classifier;
    bool stem; /* the first convolution's weight, whose second dimension is the input channels */
    int ndim;  /* 0 for num_batches_tracked */
    int64_t shape[4];
    size_t offset; /* bytes into its arena (COUNTER: an index) */
    size_t numel;
} mgt_model_entry;

/* Whether an entry is stored as int64 (num_batches_tracked, an index), not float32. */
static inline bool mgt_model_entry_i64(const mgt_model_entry *e)
{
    return e->role == MGT_MODEL_COUNTER || e->role == MGT_MODEL_INDEX;
}

/* The values of an MGT_MODEL_INDEX entry (e->numel int64, host, borrowed). */
const int64_t *mgt_model_index_values(const mgt_model *m, const mgt_model_entry *e);

/* Every tensor of the state_dict, in torchvision's state_dict order (offsets of params are
   not monotonic in this order; sort by offset for the arena order). Borrowed. */
const mgt_model_entry *mgt_model_table(const mgt_model *m, int *n);

/* Where gradient buckets may end: the byte offsets into the grad arena at which backward has
   completed a layer's parameter gradients (the ready_bytes the backward hook reports), in
   arena order, increasing, the last equal to the arena's bytes. Writes the first cap of them
   to ends (ends may be NULL when cap is 0) and returns how many there are. */
int mgt_model_layer_ends(const mgt_model *m, size_t *ends, int cap);

/* ---- description and counts ---- */

typedef struct mgt_model_layer {
    char name[128];   /* "conv1", "layer1.0.bn2", "layer2.0" (the add), "fc" */
    const char *kind; /* "conv", "bn", "relu", "maxpool", "add", "avgpool", "linear", ... */
    int c, h, w;      /* output shape per image (h = w = 1 for avgpool and fc) */
    size_t params;    /* learnable parameters of this layer */
    uint64_t macs;    /* per image, THOP's rules (see mgt_model_counts) */
    /* how its output lies in the device's memory: the device's blocked layout where every op
       around it takes that (mgt_device_act_layout), NCHW elsewhere and without a device */
    mgt_layout layout;
    /* how its output is stored: the 16-bit format of cfg.amp where the device keeps 16-bit
       activations (mgt_device_act_dtype) and every op around it takes them, fp32 elsewhere */
    mgt_precision dtype;
    /* a ReLU that the batch norm before it computes (mgt_bn_shape.relu): no kernel of its own */
    bool folded;
    /* training only: it feeds the auxiliary classifiers alone (evaluation skips it) */
    bool aux;
} mgt_model_layer;

const mgt_model_layer *mgt_model_layers(const mgt_model *m, int *n); /* forward order */

typedef struct mgt_model_counts {
    size_t params;        /* learnable parameters (torchvision's sum of numel) */
    size_t buffer_floats; /* BN running stats */
    /* Forward multiply-accumulates per image as THOP counts them (the figure torchvision
       users quote: resnet18 1.82 G, resnet50 4.11 G at 224): conv out*(cin*r*s), linear
       in*out, BN 2 per element, global avgpool hw+1 per output, relu/maxpool/add 0. */
    uint64_t macs;
    uint64_t macs_conv_fc; /* the conv and linear part alone (1.81 G, 4.09 G) */
    uint64_t macs_aux;     /* the auxiliary classifiers' (training only), in none of the above */
    /* activation arena bytes that scale with the batch: every value in the storage the plan
       chose (16-bit ones under --amp), the gradient slots (a gradient stored as its value),
       the probabilities */
    size_t act_bytes_per_image;
    size_t act_bytes_fixed; /* per-channel saved statistics and the loss */
    int values, values_16;  /* layer outputs with storage of their own; those in 16 bits */
} mgt_model_counts;

void mgt_model_get_counts(const mgt_model *m, mgt_model_counts *out);

/* ---- weights ---- */

typedef struct mgt_model_load_options {
    /* Fine-tuning to another class count: head tensors (entries with `classifier` set, the
       architecture's mgt_model_head and the auxiliary classifiers' last layers) whose shape in the file differs from the model's keep
       the model's values (torchvision's initialisation, after mgt_model_init) and the file's
       are ignored; report->head_classes says how many classes the file's head had. A head of
       the same shape loads as usual. */
    bool new_head;
    /* Another input channel count: a stem weight (the first convolution's, `stem` set) whose
       file shape differs in its input channels only is adapted as timm's adapt_input_conv
       does: to 1 channel, the file's channels summed (exact for grey images that the file's
       model saw as equal R, G and B); to k channels, the file's repeated in turn and scaled
       by file channels / k. report->stem_channels says from how many. A grouped stem is not
       adapted (a mismatch as usual). */
    bool adapt_stem;
    /* Tensors in the file that the model lacks are ignored (a checkpoint that also holds
       optimizer state) instead of being errors. */
    bool allow_unexpected;
    /* (optional, NULL-terminated) file tensors whose names start with one of these are
       ignored and counted in report->ignored (a training checkpoint's "optimizer." state). */
    const char *const *ignore_prefixes;
} mgt_model_load_options;

typedef struct mgt_model_load_report {
    int loaded;        /* model tensors taken from the file (an adapted stem counts) */
    int skipped;       /* model tensors left as they were (new_head) */
    int ignored;       /* file tensors not used */
    int head_classes;  /* new_head replaced the head: the file's class count; else 0 */
    int stem_channels; /* adapt_stem adapted the stem: the file's input channels; else 0 */
    /* malloc'd text, caller frees (NULL when there is nothing to say): on a mismatch every
       mismatch, one per line; after new_head or adapt_stem a line for each naming what was
       replaced or adapted. The error text of a failed load holds as many of the mismatches
       as fit in it, and their count. */
    char *text;
} mgt_model_load_report;

/* Loads every table entry from an open file: each name must be there with the table's shape
   and dtype (F32, I64 for num_batches_tracked), and (unless allowed) no other name may be;
   every F32 value loaded must be finite (a NaN or Inf is refused naming the tensor and the
   element, as it would only fail later as a device error). Nothing changes unless everything
   passes. Synchronises s. opts and report may be NULL. */
mgt_status mgt_model_load(mgt_model *m, mgt_stream *s, const mgt_st_file *f,
                          const mgt_model_load_options *opts, mgt_model_load_report *report);
mgt_status mgt_model_load_safetensors(mgt_model *m, mgt_stream *s, const char *path,
                                      const mgt_model_load_options *opts,
                                      mgt_model_load_report *report);

/* Copies params, buffers and counters to a host snapshot (*staging, malloc'd, caller frees
   after the last save) and adds every table entry to w, borrowing the snapshot, plus metadata
   arch, classes, in_channels and image_size. The caller may add more (optimizer state) before
   mgt_st_writer_save. Synchronises s. */
mgt_status mgt_model_add_to_writer(mgt_model *m, mgt_stream *s, mgt_st_writer *w, void **staging);
/* The state_dict alone, written atomically to path. */
mgt_status mgt_model_save_safetensors(mgt_model *m, mgt_stream *s, const char *path);

/* ---- export (onnx.c) ---- */

/* Writes the inference graph as an ONNX model (opset 17, IR version 8) to path, through a
   temporary file, fsync and a rename: every layer as ONNX operators (batch norm as
   BatchNormalization over its running statistics, dropout and stochastic depth left out), the
   parameters and buffers as initializers under their state_dict names with the table's shapes
   (a convolution's 2-D weight as [out, in, 1, 1]). Input "input" float32 [batch, C, H, W],
   H = W = the model's image_size, batch a dynamic dimension; output "logits" float32
   [batch, classes]. metadata: NULL-terminated key, value pairs for the model's
   metadata_props; doc (may be NULL) its doc_string. Reads the arenas (synchronises s). */
mgt_status mgt_model_export_onnx(mgt_model *m, mgt_stream *s, const char *path,
                                 const char *const *metadata, const char *doc);

#endif
