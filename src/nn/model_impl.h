/* A model's private layout: the layer graph the families build (nodes over values), the plan
   made from it (activation regions, in-place outputs, gradient slots, parameter arena order),
   shared by the builder and step code (graph.c), the layer kinds (layers.c), the families
   (resnet.c, ...), initialisation and weights (model.c, model_io.c). */
#ifndef MGT_NN_MODEL_IMPL_H
#define MGT_NN_MODEL_IMPL_H

#include "mgt/nn.h"

/* Every tensor in every arena starts on this boundary: what cudaMalloc gives, and enough for
   the vector loads of cuDNN and cuBLAS kernels. Costs at most 252 bytes per tensor. */
#define NN_ALIGN 256

#define NN_MAX_IN 6      /* inputs of one node (Inception-E concatenates six) */
#define NN_MAX_ENTRIES 6 /* table entries of one node (BN: 2 params, 2 buffers, a counter) */
#define NN_NAME 128      /* a name buffer of a definition's: the longest of a table entry's */
#define NN_MAX_AUX MGT_MODEL_MAX_AUX /* auxiliary classifiers of one model (GoogLeNet's two) */

/* ---- the graph ---- */

/* What a node computes. Each kind is a forward/backward pair in layers.c (nn_kinds[]). */
typedef enum nn_kind {
    NN_CONV,    /* conv2d of in[0] (optional bias) */
    NN_BN,      /* batch norm 2d of in[0], eps and momentum per node */
    NN_RELU,    /* max(x, 0) */
    NN_MAXPOOL, /* max pooling */
    NN_ADD,     /* in[0] + in[1] */
    NN_GAP,     /* global average pool: [c, h, w] -> [c, 1, 1] */
    NN_LINEAR,  /* in[0] flattened to [c*h*w] -> [out, 1, 1], with bias */
    NN_DROPOUT, /* training: x * keep / (1 - p), the mask from the model's dropout key */
    NN_APOOL,   /* adaptive average pool to oh x ow (torch's AdaptiveAvgPool2d) */
    NN_CONCAT,  /* the inputs side by side along channels (torch.cat(dim=1)) */
    NN_ACT,     /* a pointwise activation (mgt_act: relu6, hardswish, silu, ...) */
    NN_SCALE,   /* in[0] [c, h, w] times in[1] [c, 1, 1] per channel (squeeze-excite) */
    NN_SDEPTH,  /* stochastic depth, row mode: training zeroes whole images, scales the rest */
    NN_SLICE,   /* channels [c0, c0 + c) of in[0] (torch's chunk) */
    NN_SHUFFLE, /* the inputs concatenated, then channel_shuffle(groups = n_in) */
    NN_LN2D,    /* LayerNorm over each pixel's channels (torchvision's LayerNorm2d) */
    NN_LSCALE,  /* in[0] times a [c, 1, 1] parameter per channel (ConvNeXt's layer_scale) */
    /* the transformers' (transformer.c); their values are token maps: c x h rows of w
       features each (ViT's [tokens, 1, dim], Swin's [H, W, dim], windows [n, tokens, dim]) */
    NN_LN,      /* LayerNorm over the last dimension (w) of every row */
    NN_PERMUTE, /* one mgt_permute per image: a gather of in[0] or a scatter into the output */
    NN_ATTN,    /* multi-head attention of a qkv value [groups, tokens, 3 dim] -> [.., dim] */
    NN_CLS,     /* ViT's class token before the patches: [dim, h, w] -> [1, h w + 1, dim] */
    NN_POSADD,  /* in[0] plus a parameter of its shape (ViT's position embedding) */
    /* The two below are depthwise convolutions with constant weights (not parameters): */
    NN_AVGPOOL2D, /* torch's avg_pool2d with count_include_pad (every tap 1 / (kh kw)) */
    NN_AFFINE,    /* x * scale[c] + shift[c] per channel (Inception's transform_input) */
    NN_KIND_COUNT
} nn_kind;

/* A tensor some node produces (or the model input, value 0): c x h x w per image. */
typedef struct nn_value {
    int c, h, w;
    int producer;    /* node index, -1 for the model input */
    int consumers;   /* how many node inputs read it */
    bool needs_grad; /* some parameter lies before it */
    int storage;     /* the value whose activation region holds it (itself, or an input that
                        an in-place node overwrote) */
    size_t off;      /* its region in the activation arena (bytes), when storage is itself */
    int gslot;       /* backward: the gradient slot it ends up in (planning scratch) */
    /* how it (and its gradient) lies in memory (plan_layouts) */
    mgt_layout layout;
    /* how it and its gradient are stored (plan_dtypes): fp32, or the 16-bit format of --amp */
    mgt_precision dtype;
} nn_value;

/* How a node's backward delivers the gradient of one input (planned once, see graph.c). */
typedef enum nn_gmode {
    NN_G_NONE,      /* the input needs no gradient */
    NN_G_WRITE,     /* the kernel writes it (beta 0) */
    NN_G_ACCUM,     /* the kernel adds onto it (beta 1: conv, linear) */
    NN_G_ACCUM_TMP, /* the kernel writes a temporary slot, then it is added on */
    NN_G_ALIAS,     /* it is the output's gradient itself (an add passes it through) */
} nn_gmode;

typedef struct nn_node {
    nn_kind kind;
    char name[NN_NAME]; /* the torchvision module name: "layer1.0.conv1", "fc" */
    int in[NN_MAX_IN], n_in;
    int out;
    /* table entries: the parameters first (n_params of them, in arena order), then buffers
       and the counter */
    int entry[NN_MAX_ENTRIES], n_entries, n_params;
    union {
        struct {
            mgt_conv2d_shape sh; /* n is set per call */
            bool bias;
        } conv;
        struct {
            float eps, momentum;
            int counter;     /* index into bn_counts */
            size_t save_off; /* save_mean [c] then save_invstd [c] (bytes into acts) */
            size_t save_stride;
            bool relu; /* the ReLU after it is folded in (plan_fusion) */
            /* a residual add folded in with the ReLU after it (plan_fusion): the add's other
               input z and the ReLU's output, which this BN writes (0: none) */
            int res_z, res_y;
        } bn;
        mgt_pool2d_shape pool; /* n is set per call */
        struct {
            int in, out;
            int rows; /* per image: 1 for a classifier, c x h for a token linear */
            bool bias;
            /* torch calls it through F.linear or inside MultiheadAttention: a forward hook
               does not see it, so its MACs are not conv + linear MACs (counts.macs has them) */
            bool functional;
            /* Swin V2's qkv: the middle third of the bias (k's) is taken as 0, as torchvision
               zeroes it in a copy at every forward; ones is a const of [batch x rows] ones
               that adds the other two thirds (and sums their gradients) through gemm */
            bool zero_mid_bias;
            int ones;
        } linear;
        struct {
            float p;
            uint32_t stream; /* this layer's place among the model's dropout layers */
        } dropout;
        struct {
            int oh, ow;
        } apool;
        mgt_act act;
        int slice_c0; /* NN_SLICE: the first channel taken */
        struct {
            float p;
            uint32_t stream; /* a dropout stream: the mask is dropout's, one word per image */
            size_t mask_off; /* [batch] floats: the step's per-image factors (bytes into acts) */
        } sdepth;
        float ln_eps; /* NN_LN2D, NN_LN */
        struct {
            mgt_permute_shape sh; /* per image; dim 0 and axis 0 are the batch, set per call */
            bool covers;          /* every element of the grid side is reached */
        } permute;
        struct {
            int heads, tokens, dh, windows; /* windows: groups per image */
            float scale, p;
            uint32_t stream; /* its dropout stream (0x10000 + its place: no nn.Dropout's) */
            int table;       /* the relative position bias table's entry, or -1 */
            int table_rows;  /* (2 ws - 1)^2 */
            /* Swin V2: cosine attention with the node's first parameter as logit_scale, and
               the bias 16 sigmoid(cpb_mlp(coords)) of the continuous position bias MLP (its
               parameters the node's next three, the coordinates buffer its last entry): cpb is
               that MLP's hidden width, 0 for a learned table */
            bool cosine;
            int cpb;
            size_t cpb_off;   /* its activations and gradients (bytes into acts) */
            size_t bias_off;  /* [heads, tokens^2] gathered bias (bytes into acts) */
            size_t dbias_off; /* its gradient */
            size_t lse_off;   /* [windows, heads, tokens] per image */
            int mask;         /* const: the shifted windows' mask [windows, tokens^2], or -1 */
            int index, offsets, order; /* int32 consts of the gather and its inverse */
        } attn;
        int cls_ones; /* NN_CLS: a const of [batch] ones, for the class token's gradient sum */
        struct {
            mgt_conv2d_shape sh;      /* groups = channels; n is set per call */
            float tap;                /* NN_AVGPOOL2D: every weight */
            float scale[4], shift[4]; /* NN_AFFINE: per channel (its bias) */
            size_t w_off;             /* the weights [c r s], then the bias [c] (bytes into acts) */
        } fixed;
    } u;
    /* training only: the node feeds auxiliary classifiers alone, and evaluation skips it */
    bool aux;
    int aux_out; /* > 0: its output is auxiliary logits aux_out - 1 (the loss starts there) */
    /* the plan */
    bool inplace; /* out is written over in[0]'s storage */
    bool folded;  /* NN_RELU, NN_ADD: the batch norm before computes it; no kernel runs here */
    int gout;     /* slot of the output's gradient */
    int gin[NN_MAX_IN];
    unsigned char gmode[NN_MAX_IN];
    int unshare[NN_MAX_IN]; /* >= 0: before backward, slot gin[i] gets a copy of this slot */
    int gtmp;               /* the temporary slot of NN_G_ACCUM_TMP, or -1 */
} nn_node;

/* How a parameter is initialised (torchvision's rule for its module; see mgt_model_init). */
typedef enum nn_init {
    NN_INIT_NONE, /* buffers and counters: their own rule */
    NN_INIT_CONST,
    NN_INIT_NORMAL,  /* mean 0, std = arg (kaiming_normal_ gives std = gain / sqrt(fan)) */
    NN_INIT_UNIFORM, /* in [-arg, arg) (PyTorch's default for Linear and Conv2d) */
    NN_INIT_VALUES,  /* the values of const (int)arg (nn_const): Swin V2's coordinates table */
} nn_init;

typedef struct nn_entry_init {
    nn_init kind;
    double arg;
} nn_entry_init;

/* A constant of the graph (nn_const): host data and, once planned, its place in acts. */
typedef struct nn_constant {
    void *data;
    size_t bytes;
    size_t off;
} nn_constant;

/* ---- the model ---- */

struct mgt_model {
    mgt_model_config cfg;
    char arch[32];
    const char *head; /* nn_arch.head (static) */
    mgt_device *dev;

    mgt_buffer *params_buf, *grads_buf, *bufs_buf, *acts_buf;
    char *params, *grads, *bufs, *acts; /* base pointers; NULL for a describing model */
    size_t params_bytes, bufs_bytes, acts_bytes;

    mgt_model_entry *table;
    nn_entry_init *init; /* one per table entry */
    int n_table, cap_table;
    int64_t *bn_counts;
    int n_bn;
    mgt_model_layer *layers; /* one per node */
    mgt_model_counts counts;
    size_t *layer_ends; /* the hook's ready_bytes, in arena order */
    int n_layer_ends;

    nn_node *nodes;
    int n_nodes, cap_nodes;
    nn_value *values;
    int n_values, cap_values;
    bool oom; /* a building allocation failed: checked once at the end */
    /* the first name a definition built too long for a node or a table entry (nn_name,
       new_node, nn_add_entry): checked once at the end, as oom is */
    char long_name[NN_NAME];
    /* the first layer whose output the input size leaves without a pixel, and that output's
       sides: checked once at the end, as long_name is */
    char small_layer[NN_NAME];
    int small_h, small_w;

    /* auxiliary classifiers (training only, as torchvision's Inception v3 and GoogLeNet): their
       logits values, in table order; the loss weight of each; their probabilities [batch,
       classes] and losses [n_aux] in acts */
    int aux_value[NN_MAX_AUX], n_aux;
    float aux_weight;
    size_t aux_probs_off[NN_MAX_AUX], aux_loss_off;

    int n_dropout; /* dropout layers so far (their streams) */
    int n_attn;    /* attention layers so far (their dropout streams) */
    /* Constants the graph's kernels read (index arrays, masks, a vector of ones), uploaded
       into the activation arena once at creation (nn_const); identical ones are shared. */
    nn_constant *consts;
    int n_consts, cap_consts;
    /* The values of the MGT_MODEL_INDEX entries (int64, offset = index into it). */
    int64_t *index_vals;
    size_t n_index_vals;
    mgt_dropout_key drop_key; /* the next training forward's (mgt_model_set_dropout_key) */

    int min_bn_hw; /* the smallest h*w any BN normalises over, per image */
    int max_bn_c;  /* the most channels any BN has */
    /* freeze_bn only: [max_bn_c] constant 1s and 0s (set at each training forward), which
       let batchnorm_forward_eval compute 1/sqrt(var + eps) and gamma * invstd * dy, as the
       device interface has no per-channel scale or rsqrt of its own */
    size_t ones_off, zeros_off;
    /* sync_bn only: [2 * max_bn_c] device floats for the backward sums; the exchange; its
       host staging; and each BN's count over every replica from the last forward */
    size_t bnsync_off;
    mgt_bn_sync bn_sync;
    float *bn_hf;          /* [4 * max_bn_c] */
    double *bn_mine;       /* [1 + 2 * max_bn_c] */
    double *bn_all;        /* [replicas * (1 + 2 * max_bn_c)] */
    double *bn_sync_count; /* [n_bn] */
    size_t probs_off, loss_off;
    int n_slots;
    size_t *slot_bytes; /* per image */
    size_t *slot_off;   /* bytes into acts */

    /* the step in flight */
    int n;          /* images in the last forward */
    bool trained;   /* the last forward was a training one */
    bool have_loss; /* mgt_model_loss ran after it */
    const float *x; /* the last forward's input (borrowed) */
    const int32_t *labels;
    const int32_t *labels_b; /* mixed targets (mgt_model_loss_mixed); NULL: one-hot */
    const float *weights;
    float smoothing;
    float loss_scale;       /* multiplies the loss gradient (fp16 loss scaling); 1 by default */
    size_t ready;           /* grad bytes backward has completed so far */
    mgt_grad_ready_fn hook; /* backward's hook and its context */
    void *hook_ctx;
};

static inline float *nn_param(const mgt_model *m, int e)
{
    return (float *)(m->params + m->table[e].offset);
}

static inline float *nn_grad(const mgt_model *m, int e)
{
    return (float *)(m->grads + m->table[e].offset);
}

static inline float *nn_buf(const mgt_model *m, int e)
{
    return (float *)(m->bufs + m->table[e].offset);
}

static inline float *nn_act(const mgt_model *m, size_t off) { return (float *)(m->acts + off); }

static inline size_t nn_align(size_t bytes) { return (bytes + NN_ALIGN - 1) / NN_ALIGN * NN_ALIGN; }

static inline size_t nn_value_floats(const nn_value *v) { return (size_t)v->c * v->h * v->w; }

/* Bytes of one element of the value's storage (its gradient's too). */
static inline size_t nn_value_esize(const nn_value *v)
{
    return v->dtype == MGT_PREC_F32 ? sizeof(float) : sizeof(uint16_t);
}

/* Bytes of the value (or its gradient) per image. */
static inline size_t nn_value_bytes(const nn_value *v)
{
    return nn_value_floats(v) * nn_value_esize(v);
}

/* Refuses the calls that need memory on a describing model. */
mgt_status nn_need_device(const mgt_model *m, const char *what);

/* ---- building (graph.c): families call these in forward order ---- */

/* A name formatted into buf (size bytes; NN_NAME holds any a definition builds): one that
   does not fit is kept, cut, in m->long_name, and nn_plan refuses the model. */
void nn_name(mgt_model *m, char *buf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The model input, value 0: in_channels x image_size x image_size. */
int nn_input(mgt_model *m);
/* A table entry named "<prefix>.<suffix>" of a role and meaning; returns its index. */
int nn_add_entry(mgt_model *m, const char *prefix, const char *suffix, mgt_model_role role,
                 mgt_model_what what, int ndim, const int64_t *shape, nn_entry_init init);

/* Each returns the node's output value (or -1 once an allocation has failed). */
int nn_activation(mgt_model *m, const char *name, int x, mgt_act act);
/* x [c, h, w] scaled per image and channel by s [c, 1, 1] */
int nn_scale(mgt_model *m, const char *name, int x, int s);
/* torchvision's StochasticDepth(p, "row") */
int nn_stochastic_depth(mgt_model *m, const char *name, int x, float p);
/* torchvision's LayerNorm2d (weight 1, bias 0) */
int nn_layernorm2d(mgt_model *m, const char *name, int x, float eps);
/* x times the [c, 1, 1] parameter entry `param` (made beforehand with nn_add_entry, so that
   it sits in the table where torchvision's state_dict has it) */
int nn_layer_scale(mgt_model *m, const char *name, int x, int param);
int nn_conv(mgt_model *m, const char *name, int x, int k, int r, int stride, int pad, int groups,
            bool bias);
/* the same with an rh x rw kernel and padding ph, pw (Inception's 1x7 and 7x1) */
int nn_conv_rect(mgt_model *m, const char *name, int x, int k, int rh, int rw, int stride, int ph,
                 int pw, int groups, bool bias);
/* torch's avg_pool2d(k, stride, pad) with count_include_pad (every window divided by k k) */
int nn_avgpool2d(mgt_model *m, const char *name, int x, int k, int stride, int pad);
/* x * scale[ch] + shift[ch] for each of x's channels (at most 4), constants of the model */
int nn_affine(mgt_model *m, const char *name, int x, const float *scale, const float *shift);
/* Marks v ([classes, 1, 1]) as auxiliary logits: training forwards compute them, their loss
   joins the main one weighted by m->aux_weight, and evaluation skips the nodes that feed
   them alone. */
void nn_aux_logits(mgt_model *m, int v);
int nn_bn(mgt_model *m, const char *name, int x, float eps, float momentum);
int nn_relu(mgt_model *m, const char *name, int x);
int nn_maxpool(mgt_model *m, const char *name, int x, int k, int stride, int pad);
int nn_add(mgt_model *m, const char *name, int a, int b);
int nn_gap(mgt_model *m, const char *name, int x);
int nn_linear(mgt_model *m, const char *name, int x, int out);
int nn_dropout(mgt_model *m, const char *name, int x, float p);
/* max pooling with torch's ceil_mode */
int nn_maxpool_ceil(mgt_model *m, const char *name, int x, int k, int stride, int pad);
int nn_apool(mgt_model *m, const char *name, int x, int oh, int ow);
/* in[0..n) concatenated along channels (same h x w), n <= NN_MAX_IN */
int nn_concat(mgt_model *m, const char *name, const int *in, int n);
/* channels [c0, c0 + c) of x, as a value of its own (one strided copy) */
int nn_slice(mgt_model *m, const char *name, int x, int c0, int c);
/* torchvision's channel_shuffle(torch.cat(in, 1), groups = n) for n inputs of equal shape:
   output channel j * n + i is input i's channel j (one strided copy per input) */
int nn_cat_shuffle(mgt_model *m, const char *name, const int *in, int n);

/* A node's table entry made beforehand (nn_add_entry) joins it as its next parameter; a
   buffer's joins after its parameters (nn_attach_buffer). */
void nn_attach_param(mgt_model *m, nn_node *nd, int entry);
void nn_attach_buffer(mgt_model *m, nn_node *nd, int entry);
/* The node being built last (the producer of the value just returned). */
static inline nn_node *nn_last_node(mgt_model *m) { return &m->nodes[m->n_nodes - 1]; }

/* nn_linear without a bias (MaxViT's last classifier layer). */
int nn_linear_nobias(mgt_model *m, const char *name, int x, int out);

/* ---- the transformers' nodes (transformer.c) ---- */

/* A constant the kernels read: `bytes` of data (copied) placed in the activation arena at
   planning and uploaded at creation; returns its id (-1 after a failed allocation). Identical
   data share one. */
int nn_const(mgt_model *m, const void *data, size_t bytes);
static inline void *nn_const_ptr(const mgt_model *m, int id) { return m->acts + m->consts[id].off; }
/* Uploads every constant (mgt_model_create, once the arena exists). */
mgt_status nn_consts_upload(mgt_model *m, mgt_stream *s);
/* An MGT_MODEL_INDEX entry of n int64 values (copied), named prefix.suffix. */
int nn_add_index(mgt_model *m, const char *prefix, const char *suffix, int ndim,
                 const int64_t *shape, const int64_t *values);

/* torch's Linear over the rows of a token map x [c, h, w] (w = in features): y [c, h, out];
   weight [out, in] and (bias) [out] named name.<wname> and name.<bname>. */
int nn_token_linear(mgt_model *m, const char *name, int x, int out, bool bias, const char *wname,
                    const char *bname);
/* The same without a bias, its weight the entry made beforehand (where torchvision registers
   the linear before a layer that precedes it in the graph). */
int nn_token_linear_entry(mgt_model *m, const char *name, int x, int weight);
/* torch's LayerNorm(w) over the last dimension of x [c, h, w] (weight 1, bias 0) */
int nn_layernorm(mgt_model *m, const char *name, int x, float eps);
/* A LayerNorm's weight and bias entries made ahead of its node (where torchvision registers
   the norm before layers that run before it: Swin V2's post-norms); returns the weight's,
   the bias's is the next. nn_layernorm_of builds the node on them. */
int nn_layernorm_entries(mgt_model *m, const char *name, int c);
int nn_layernorm_of(mgt_model *m, const char *name, int x, float eps, int weight);
/* x [c, h, w] gathered by the per-image description sh (dims and axes from index 1: index 0 is
   the batch's) into a value [oc, oh, ow]; scatter: x walked, the output its grid. */
int nn_permute(mgt_model *m, const char *name, int x, const mgt_permute_shape *sh, int oc, int oh,
               int ow);
/* Every convolution's and linear layer's weight normal(0, std), every bias 0 (ConvNeXt's and
   MaxViT's _init_weights; their trunc_normal_ at +-2 is 100 std: a plain normal). */
void nn_init_normal_weights(mgt_model *m, double std);
/* relative_position_index of a ws x ws window (Swin's formula, MaxViT's
   _get_relative_position_index): (dy + ws - 1) (2 ws - 1) + dx + ws - 1 for token i's
   coordinates minus token j's, index [ws^4]. */
void nn_relative_index(int ws, int64_t *index);
/* Attention over a qkv value [windows, tokens, 3 dim] -> [windows, tokens, dim]: heads of
   dim / heads, scaled dot products; table (>= 0) a [rows, heads] relative position bias entry
   gathered by index [tokens^2] (int32); mask (NULL: none) [windows, tokens^2]. */
int nn_attention(mgt_model *m, const char *name, int x, int heads, int windows, int table,
                 int table_rows, const int32_t *index, const float *mask);
/* Swin V2's: cosine attention with logit_scale (a [heads, 1, 1] entry) and the continuous
   position bias, whose MLP (cpb hidden, its three parameters and the coordinates buffer
   [1, 2 ws - 1, 2 ws - 1, 2]) nn_attention_cpb attaches once they are made. */
int nn_attention_v2(mgt_model *m, const char *name, int x, int heads, int windows, int logit_scale,
                    int table_rows, const int32_t *index, const float *mask);
void nn_attention_cpb(mgt_model *m, int attn_value, int w1, int b1, int w2, int coords, int hidden);
/* Swin V2's qkv linear: the middle third of its bias taken as 0 (nn_node's zero_mid_bias). */
void nn_linear_zero_mid_bias(mgt_model *m, int value);
/* The MACs of a node that are conv + linear MACs beyond its own kind's (V2's cpb MLP, whose
   Linear modules torch's hooks see). */
uint64_t nn_attn_linear_macs(const mgt_model *m, const nn_node *nd);
/* ViT's class token (the parameter `token`, [1, 1, dim]) before the patches of x [dim, h, w]. */
int nn_class_token(mgt_model *m, const char *name, int x, int token);
/* x plus the parameter `param` of x's shape (per image; ViT's position embedding). */
int nn_pos_add(mgt_model *m, const char *name, int x, int param);

/* The node that produced value v. */
static inline nn_node *nn_node_of(mgt_model *m, int v) { return &m->nodes[m->values[v].producer]; }

/* Plans the graph once the family has built it: in-place outputs, activation regions,
   gradient slots, the parameter arena (backward's completion order), counts and layers. */
mgt_status nn_plan(mgt_model *m);

/* The walks of a step over the nodes (m->n images, m->x the input): forward in order,
   backward in reverse with the logits' gradient already in the last node's output slot. */
mgt_status nn_graph_forward(mgt_model *m, mgt_stream *s, bool train);
mgt_status nn_graph_backward(mgt_model *m, mgt_stream *s);

/* Softmax cross-entropy backward of logits whose probabilities are at probs, against the last
   loss's targets, into dlogits, times scale / batch (model.c). */
mgt_status nn_loss_backward(mgt_model *m, mgt_stream *s, float *dlogits, const float *probs,
                            float scale);

/* The slot holding the gradient of the model's output (the logits). */
static inline float *nn_logits_grad(const mgt_model *m)
{
    return nn_act(m, m->slot_off[m->nodes[m->n_nodes - 1].gout]);
}

/* The model's output, the logits [n, classes]. */
static inline float *nn_logits(const mgt_model *m)
{
    const nn_value *v = &m->values[m->nodes[m->n_nodes - 1].out];
    return nn_act(m, m->values[v->storage].off);
}

/* ---- the families (resnet.c, ...) ---- */

/* Builds the graph of cfg->arch; m->cfg is filled. */
typedef mgt_status (*nn_family_build_fn)(mgt_model *m, const void *arg);

typedef struct nn_arch {
    const char *name;
    const char *family; /* as arch.c's policy table names it */
    nn_family_build_fn build;
    const void *arg; /* the family's description of this member */
    /* The classifier head: the module(s) whose outputs are the class scores, by their
       torchvision names ("fc", "classifier.1", "heads.head"; several separated by spaces).
       Their tensors, with the auxiliary classifiers' last layers (nn_plan marks those), are
       the ones a class-count change replaces (mgt_model_entry.classifier); every
       architecture names its own, or the model is refused. */
    const char *head;
} nn_arch;

/* The architectures of each family, NULL-name terminated. */
extern const nn_arch nn_resnet_archs[];
extern const nn_arch nn_vgg_archs[];
extern const nn_arch nn_alexnet_archs[];
extern const nn_arch nn_squeezenet_archs[];
extern const nn_arch nn_mobile_archs[]; /* mobilenet.c: MobileNet V2/V3, EfficientNet B0/B1 */
extern const nn_arch nn_shufflenet_archs[];
extern const nn_arch nn_densenet_archs[];
extern const nn_arch nn_convnext_archs[];  /* convnext.c */
extern const nn_arch nn_inception_archs[]; /* inception.c: GoogLeNet, Inception v3 */
extern const nn_arch nn_vit_archs[];       /* vit.c */
extern const nn_arch nn_swin_archs[];      /* swin.c */
extern const nn_arch nn_maxvit_archs[];    /* maxvit.c */

/* ---- the layer kinds (layers.c) ---- */

/* One node's call: flat device arrays for the kind's forward or backward. */
typedef struct nn_call {
    mgt_model *m;
    mgt_stream *s;
    const nn_node *node;
    int n;      /* images */
    bool train; /* forward: training mode */
    const float *x[NN_MAX_IN];
    float *y;
    const float *z; /* a batch norm's folded residual (plan_fusion), or NULL */
    /* backward */
    const float *dy;
    float *dx[NN_MAX_IN]; /* NULL: that input needs no gradient */
    float dx_beta[NN_MAX_IN];
    float *p[NN_MAX_ENTRIES], *g[NN_MAX_ENTRIES]; /* params (and grads), buffers (g NULL) */
} nn_call;

/* How the node's op stores activations: its input's storage and its output's (plan_dtypes gives
   every input of a node but a convolution, linear or global pool the output's). */
static inline mgt_store nn_store_of(const nn_call *c)
{
    return (mgt_store){c->m->values[c->node->in[0]].dtype, c->m->values[c->node->out].dtype};
}

/* Element `off` of an activation stored as dt (strides and offsets count elements). */
static inline float *nn_act_at(const float *p, mgt_precision dt, size_t off)
{
    return (float *)((const char *)p + off * (dt == MGT_PREC_F32 ? sizeof(float) : 2));
}

enum {
    NN_F_INPLACE = 1 << 0,     /* forward may write y over x[0] */
    NN_F_NEEDS_X = 1 << 1,     /* backward reads the inputs' values */
    NN_F_NEEDS_Y = 1 << 2,     /* backward reads the output's value */
    NN_F_DX_BETA = 1 << 3,     /* backward can add dx onto what is there (dx_beta 1) */
    NN_F_DX_ON_DY = 1 << 4,    /* backward may write dx over dy */
    NN_F_PASSTHROUGH = 1 << 5, /* every input's gradient is dy itself */
};

typedef struct nn_kind_i {
    const char *label; /* "conv", "bn", ... (mgt_model_layer.kind) */
    unsigned flags;
    mgt_status (*forward)(nn_call *c);
    /* Enqueues the parameter gradients (accumulated) and calls nn_params_ready once they are
       enqueued, then the inputs' gradients into dx[] (where not NULL). NULL for a kind
       whose gradients are all NN_F_PASSTHROUGH. */
    mgt_status (*backward)(nn_call *c);
    uint64_t (*macs)(const mgt_model *m, const nn_node *node); /* per image, THOP's rules */
} nn_kind_i;

extern const nn_kind_i nn_kinds[NN_KIND_COUNT];

/* The transformers' kinds (transformer.c), each a row of nn_kinds. */
mgt_status nn_ln_forward(nn_call *c);
mgt_status nn_ln_backward(nn_call *c);
mgt_status nn_permute_forward(nn_call *c);
/* A permute node's description over n images, walked from its input when scatter (its own
   direction, or backward's reverse of it) */
mgt_permute_shape nn_permute_shape(const mgt_model *m, const nn_node *nd, int n, bool scatter);
mgt_status nn_permute_backward(nn_call *c);
mgt_status nn_attn_forward(nn_call *c);
mgt_status nn_attn_backward(nn_call *c);
uint64_t nn_attn_macs(const mgt_model *m, const nn_node *nd);
mgt_status nn_cls_forward(nn_call *c);
mgt_status nn_cls_backward(nn_call *c);
mgt_status nn_posadd_forward(nn_call *c);
mgt_status nn_posadd_backward(nn_call *c);

/* Reports the node's parameter gradients as enqueued (the backward hook). */
mgt_status nn_params_ready(nn_call *c);

#endif
