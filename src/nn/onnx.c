/* ONNX export of a model's inference graph (mgt_model_export_onnx): the layer graph the family
   built, node by node, as ONNX operators of opset 17 over initializers that hold the model's
   tensors under their torchvision names. The messages are onnx.proto's, from Debian's
   libonnx-dev, packed by code protoc-c generates at build time; no schema is written here.

   Inference only: batch norm as BatchNormalization over its running statistics (not folded:
   the initializers are then the checkpoint's tensors, and ONNX Runtime folds it itself),
   dropout, stochastic depth and the auxiliary classifiers removed, the ReLU that a batch norm
   computes folded in the trainer written as the Relu it is. The input is "input", float32
   [batch, C, H, W] with a dynamic batch and the model's planned size; the output "logits",
   float32 [batch, classes] (before softmax). A model of more than 2 GiB of tensors is refused:
   one protobuf message holds no more, and ONNX's external data files are not written. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mgt/version.h"
#include "nn/model_impl.h"
#include "onnx.pb-c.h"

#define ONNX_OPSET 17 /* HardSwish (14) and LayerNormalization (17); onnx 1.12 checks to 17 */
#define ONNX_IR_VERSION 8

/* Everything one export allocates: freed together at the end. */
typedef struct onnx_build {
    void **allocs;
    int n_allocs, cap_allocs;
    bool oom;
    Onnx__NodeProto **nodes;
    int n_nodes, cap_nodes;
    Onnx__TensorProto **inits;
    int n_inits, cap_inits;
    char **vname;              /* per value of the model: its name in the graph */
    const char *params, *bufs; /* host copies of the arenas */
    const mgt_model *m;
} onnx_build;

static void *keep(onnx_build *b, void *p)
{
    if (!p) {
        b->oom = true;
        return NULL;
    }
    if (b->n_allocs == b->cap_allocs) {
        int cap = b->cap_allocs ? 2 * b->cap_allocs : 256;
        void **n = realloc(b->allocs, (size_t)cap * sizeof *n);
        if (!n) {
            free(p);
            b->oom = true;
            return NULL;
        }
        b->allocs = n;
        b->cap_allocs = cap;
    }
    b->allocs[b->n_allocs++] = p;
    return p;
}

static void *zalloc(onnx_build *b, size_t bytes) { return keep(b, calloc(1, bytes ? bytes : 1)); }

static char *str(onnx_build *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *str(onnx_build *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    return keep(b, n < 0 ? NULL : s);
}

static void push(onnx_build *b, void ***arr, int *n, int *cap, void *item)
{
    if (!item)
        return;
    if (*n == *cap) {
        int c = *cap ? 2 * *cap : 64;
        void **a = realloc(*arr, (size_t)c * sizeof *a);
        if (!a) {
            b->oom = true;
            return;
        }
        *arr = a;
        *cap = c;
    }
    (*arr)[(*n)++] = item;
}

/* ---- attributes ---- */

static Onnx__AttributeProto *attr_int(onnx_build *b, const char *name, int64_t v)
{
    Onnx__AttributeProto *a = zalloc(b, sizeof *a);
    if (!a)
        return NULL;
    onnx__attribute_proto__init(a);
    a->name = (char *)name;
    a->has_type = true;
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
    a->has_i = true;
    a->i = v;
    return a;
}

static Onnx__AttributeProto *attr_float(onnx_build *b, const char *name, float v)
{
    Onnx__AttributeProto *a = zalloc(b, sizeof *a);
    if (!a)
        return NULL;
    onnx__attribute_proto__init(a);
    a->name = (char *)name;
    a->has_type = true;
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
    a->has_f = true;
    a->f = v;
    return a;
}

static Onnx__AttributeProto *attr_ints(onnx_build *b, const char *name, const int64_t *v, int n)
{
    Onnx__AttributeProto *a = zalloc(b, sizeof *a);
    int64_t *copy = zalloc(b, (size_t)n * sizeof *copy);
    if (!a || !copy)
        return NULL;
    onnx__attribute_proto__init(a);
    memcpy(copy, v, (size_t)n * sizeof *copy);
    a->name = (char *)name;
    a->has_type = true;
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS;
    a->n_ints = (size_t)n;
    a->ints = copy;
    return a;
}

/* ---- nodes and initializers ---- */

/* Adds a node of op with inputs in[0..n_in) and one output; attributes NULL-terminated. */
static void node(onnx_build *b, const char *op, const char *name, const char *const *in, int n_in,
                 const char *out, Onnx__AttributeProto *a0, Onnx__AttributeProto *a1,
                 Onnx__AttributeProto *a2, Onnx__AttributeProto *a3, Onnx__AttributeProto *a4)
{
    Onnx__NodeProto *nd = zalloc(b, sizeof *nd);
    char **ins = zalloc(b, (size_t)n_in * sizeof *ins);
    char **outs = zalloc(b, sizeof *outs);
    Onnx__AttributeProto **attrs = zalloc(b, 5 * sizeof *attrs);
    if (!nd || !ins || !outs || !attrs)
        return;
    onnx__node_proto__init(nd);
    for (int i = 0; i < n_in; i++)
        ins[i] = (char *)in[i];
    outs[0] = (char *)out;
    Onnx__AttributeProto *all[] = {a0, a1, a2, a3, a4};
    int na = 0;
    for (int i = 0; i < 5; i++)
        if (all[i])
            attrs[na++] = all[i];
    nd->op_type = (char *)op;
    nd->name = (char *)name;
    /* node names must be unique (ONNX Runtime refuses a repeat); torchvision calls one ReLU
       module several times in a block, so its second call becomes NAME#2 */
    for (int rep = 2, i = 0; i < b->n_nodes; i++)
        if (strcmp(b->nodes[i]->name, nd->name) == 0) {
            nd->name = str(b, "%s#%d", name, rep++);
            if (!nd->name)
                return;
            i = -1; /* the new name must be unique too */
        }
    nd->n_input = (size_t)n_in;
    nd->input = ins;
    nd->n_output = 1;
    nd->output = outs;
    nd->n_attribute = (size_t)na;
    nd->attribute = attrs;
    push(b, (void ***)&b->nodes, &b->n_nodes, &b->cap_nodes, nd);
}

/* An initializer of data_type dt over bytes the caller keeps alive until the file is written. */
static const char *init_raw(onnx_build *b, const char *name, int32_t dt, const int64_t *dims,
                            int ndim, const void *data, size_t bytes)
{
    Onnx__TensorProto *t = zalloc(b, sizeof *t);
    int64_t *d = zalloc(b, (size_t)ndim * sizeof *d);
    if (!t || (ndim && !d))
        return name;
    onnx__tensor_proto__init(t);
    if (ndim) /* a scalar has no dims (and dims may be NULL) */
        memcpy(d, dims, (size_t)ndim * sizeof *d);
    t->name = (char *)name;
    t->n_dims = (size_t)ndim;
    t->dims = d;
    t->has_data_type = true;
    t->data_type = dt;
    t->has_raw_data = true;
    t->raw_data.len = bytes;
    t->raw_data.data = (uint8_t *)data;
    push(b, (void ***)&b->inits, &b->n_inits, &b->cap_inits, t);
    return name;
}

/* A model tensor (table entry e) as an initializer named as in the state_dict; a 2-D weight of
   a convolution (ConvNeXt's Linear pair run as 1x1 convolutions) gets its [out, in, 1, 1]. */
static const char *init_entry(onnx_build *b, int e, bool as_conv)
{
    const mgt_model_entry *te = &b->m->table[e];
    const char *base = te->role == MGT_MODEL_PARAM ? b->params : b->bufs;
    int64_t dims[4];
    int nd = te->ndim;
    for (int i = 0; i < nd; i++)
        dims[i] = te->shape[i];
    if (as_conv && nd == 2) {
        dims[2] = dims[3] = 1;
        nd = 4;
    }
    return init_raw(b, te->name, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, dims, nd, base + te->offset,
                    te->numel * sizeof(float));
}

static const char *init_i64(onnx_build *b, const char *name, const int64_t *v, int n)
{
    int64_t *copy = zalloc(b, (size_t)n * sizeof *copy);
    if (!copy)
        return name;
    memcpy(copy, v, (size_t)n * sizeof *copy);
    int64_t dims[1] = {n};
    return init_raw(b, name, ONNX__TENSOR_PROTO__DATA_TYPE__INT64, dims, 1, copy,
                    (size_t)n * sizeof *copy);
}

/* A float scalar constant, made once per value. */
static const char *init_scalar(onnx_build *b, const char *name, float v)
{
    for (int i = 0; i < b->n_inits; i++)
        if (strcmp(b->inits[i]->name, name) == 0)
            return b->inits[i]->name;
    float *copy = zalloc(b, sizeof *copy);
    if (!copy)
        return name;
    *copy = v;
    return init_raw(b, name, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, NULL, 0, copy, sizeof *copy);
}

/* ---- the graph ---- */

static mgt_status export_node(onnx_build *b, int k)
{
    const mgt_model *m = b->m;
    const nn_node *nd = &m->nodes[k];
    const nn_value *xv = &m->values[nd->in[0]];
    const char *x = b->vname[nd->in[0]];
    const char *in[NN_MAX_IN];
    for (int i = 0; i < nd->n_in; i++)
        in[i] = b->vname[nd->in[i]];
    const char *name = nd->name, *out = b->vname[nd->out];
    switch (nd->kind) {
    case NN_CONV: {
        const mgt_conv2d_shape *sh = &nd->u.conv.sh;
        const char *ci[3] = {x, init_entry(b, nd->entry[0], true),
                             nd->u.conv.bias ? init_entry(b, nd->entry[1], false) : NULL};
        int64_t ks[2] = {sh->r, sh->s}, st[2] = {sh->stride_h, sh->stride_w},
                pads[4] = {sh->pad_h, sh->pad_w, sh->pad_h, sh->pad_w};
        node(b, "Conv", name, ci, nd->u.conv.bias ? 3 : 2, out, attr_ints(b, "kernel_shape", ks, 2),
             attr_ints(b, "strides", st, 2), attr_ints(b, "pads", pads, 4),
             attr_int(b, "group", sh->groups), NULL);
        break;
    }
    case NN_BN: {
        const char *bi[5] = {x, init_entry(b, nd->entry[0], false),
                             init_entry(b, nd->entry[1], false), init_entry(b, nd->entry[2], false),
                             init_entry(b, nd->entry[3], false)};
        node(b, "BatchNormalization", name, bi, 5, out, attr_float(b, "epsilon", nd->u.bn.eps),
             attr_float(b, "momentum", 1.0f - nd->u.bn.momentum), NULL, NULL, NULL);
        break;
    }
    case NN_RELU: node(b, "Relu", name, in, 1, out, NULL, NULL, NULL, NULL, NULL); break;
    case NN_ADD: node(b, "Add", name, in, 2, out, NULL, NULL, NULL, NULL, NULL); break;
    case NN_MAXPOOL: {
        const mgt_pool2d_shape *p = &nd->u.pool;
        int64_t ks[2] = {p->kh, p->kw}, st[2] = {p->stride_h, p->stride_w},
                pads[4] = {p->pad_h, p->pad_w, p->pad_h, p->pad_w};
        node(b, "MaxPool", name, in, 1, out, attr_ints(b, "kernel_shape", ks, 2),
             attr_ints(b, "strides", st, 2), attr_ints(b, "pads", pads, 4),
             attr_int(b, "ceil_mode", p->ceil_mode), NULL);
        break;
    }
    case NN_GAP:
        node(b, "GlobalAveragePool", name, in, 1, out, NULL, NULL, NULL, NULL, NULL);
        break;
    case NN_LINEAR: {
        const char *flat = str(b, "%s/flatten", name);
        node(b, "Flatten", str(b, "%s.flatten", name), in, 1, flat, attr_int(b, "axis", 1), NULL,
             NULL, NULL, NULL);
        const char *gi[3] = {flat, init_entry(b, nd->entry[0], false),
                             init_entry(b, nd->entry[1], false)};
        node(b, "Gemm", name, gi, 3, out, attr_int(b, "transB", 1), NULL, NULL, NULL, NULL);
        break;
    }
    case NN_APOOL: {
        const nn_value *yv = &m->values[nd->out];
        if (xv->h == yv->h && xv->w == yv->w) {
            node(b, "Identity", name, in, 1, out, NULL, NULL, NULL, NULL, NULL);
        } else if (xv->h % yv->h == 0 && xv->w % yv->w == 0) {
            /* equal bins: torch's adaptive pool is this average pool */
            int64_t ks[2] = {xv->h / yv->h, xv->w / yv->w};
            node(b, "AveragePool", name, in, 1, out, attr_ints(b, "kernel_shape", ks, 2),
                 attr_ints(b, "strides", ks, 2), NULL, NULL, NULL);
        } else {
            /* any other sides: a matrix P [h*w, oh*ow] holding each bin's weights (torch's
               bins [floor(i h / oh), ceil((i + 1) h / oh))), the planes times P */
            size_t hw = (size_t)xv->h * xv->w, ohw = (size_t)yv->h * yv->w;
            float *P = zalloc(b, hw * ohw * sizeof *P);
            if (!P)
                return MGT_OK;
            for (int oi = 0; oi < yv->h; oi++)
                for (int oj = 0; oj < yv->w; oj++) {
                    int i0 = oi * xv->h / yv->h, i1 = ((oi + 1) * xv->h + yv->h - 1) / yv->h;
                    int j0 = oj * xv->w / yv->w, j1 = ((oj + 1) * xv->w + yv->w - 1) / yv->w;
                    float wgt = 1.0f / (float)((i1 - i0) * (j1 - j0));
                    for (int i = i0; i < i1; i++)
                        for (int j = j0; j < j1; j++)
                            P[((size_t)i * xv->w + j) * ohw + (size_t)oi * yv->w + oj] = wgt;
                }
            int64_t pd[2] = {(int64_t)hw, (int64_t)ohw};
            const char *pn =
                init_raw(b, str(b, "%s.bins", name), ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, pd, 2, P,
                         hw * ohw * sizeof *P);
            int64_t s1[3] = {0, xv->c, (int64_t)hw}, s2[4] = {0, xv->c, yv->h, yv->w};
            const char *r1 = str(b, "%s/planes", name), *mm = str(b, "%s/pooled", name);
            const char *a1[2] = {x, init_i64(b, str(b, "%s.shape_in", name), s1, 3)};
            node(b, "Reshape", str(b, "%s.reshape_in", name), a1, 2, r1, NULL, NULL, NULL, NULL,
                 NULL);
            const char *a2[2] = {r1, pn};
            node(b, "MatMul", name, a2, 2, mm, NULL, NULL, NULL, NULL, NULL);
            const char *a3[2] = {mm, init_i64(b, str(b, "%s.shape_out", name), s2, 4)};
            node(b, "Reshape", str(b, "%s.reshape_out", name), a3, 2, out, NULL, NULL, NULL, NULL,
                 NULL);
        }
        break;
    }
    case NN_CONCAT:
        node(b, "Concat", name, in, nd->n_in, out, attr_int(b, "axis", 1), NULL, NULL, NULL, NULL);
        break;
    case NN_ACT:
        switch (nd->u.act) {
        case MGT_ACT_RELU6: {
            const char *ci[3] = {x, init_scalar(b, "const.zero", 0.0f),
                                 init_scalar(b, "const.six", 6.0f)};
            node(b, "Clip", name, ci, 3, out, NULL, NULL, NULL, NULL, NULL);
            break;
        }
        case MGT_ACT_HARDSIGMOID: /* torch: relu6(x + 3) / 6 */
            node(b, "HardSigmoid", name, in, 1, out, attr_float(b, "alpha", 1.0f / 6.0f),
                 attr_float(b, "beta", 0.5f), NULL, NULL, NULL);
            break;
        case MGT_ACT_HARDSWISH:
            node(b, "HardSwish", name, in, 1, out, NULL, NULL, NULL, NULL, NULL);
            break;
        case MGT_ACT_SIGMOID:
            node(b, "Sigmoid", name, in, 1, out, NULL, NULL, NULL, NULL, NULL);
            break;
        case MGT_ACT_SILU: {
            const char *sg = str(b, "%s/sigmoid", name);
            node(b, "Sigmoid", str(b, "%s.sigmoid", name), in, 1, sg, NULL, NULL, NULL, NULL, NULL);
            const char *mi[2] = {x, sg};
            node(b, "Mul", name, mi, 2, out, NULL, NULL, NULL, NULL, NULL);
            break;
        }
        case MGT_ACT_GELU: { /* exact GELU: x / 2 (1 + erf(x / sqrt 2)); opset 17 has no Gelu */
            const char *t1 = str(b, "%s/scaled", name), *t2 = str(b, "%s/erf", name),
                       *t3 = str(b, "%s/one_plus", name), *t4 = str(b, "%s/x_times", name);
            const char *a1[2] = {x, init_scalar(b, "const.sqrt2", (float)M_SQRT2)};
            node(b, "Div", str(b, "%s.div", name), a1, 2, t1, NULL, NULL, NULL, NULL, NULL);
            node(b, "Erf", str(b, "%s.erf", name), &t1, 1, t2, NULL, NULL, NULL, NULL, NULL);
            const char *a3[2] = {t2, init_scalar(b, "const.one", 1.0f)};
            node(b, "Add", str(b, "%s.add", name), a3, 2, t3, NULL, NULL, NULL, NULL, NULL);
            const char *a4[2] = {x, t3};
            node(b, "Mul", str(b, "%s.mul", name), a4, 2, t4, NULL, NULL, NULL, NULL, NULL);
            const char *a5[2] = {t4, init_scalar(b, "const.half", 0.5f)};
            node(b, "Mul", name, a5, 2, out, NULL, NULL, NULL, NULL, NULL);
            break;
        }
        default:
            return mgt_error_set(MGT_ERR_UNSUPPORTED, "%s: activation %s has no ONNX form here",
                                 name, mgt_act_name(nd->u.act));
        }
        break;
    case NN_SCALE: node(b, "Mul", name, in, 2, out, NULL, NULL, NULL, NULL, NULL); break;
    case NN_SLICE: {
        const nn_value *yv = &m->values[nd->out];
        int64_t s0 = nd->u.slice_c0, s1 = nd->u.slice_c0 + yv->c, ax = 1;
        const char *si[4] = {x, init_i64(b, str(b, "%s.starts", name), &s0, 1),
                             init_i64(b, str(b, "%s.ends", name), &s1, 1),
                             init_i64(b, str(b, "%s.axes", name), &ax, 1)};
        node(b, "Slice", name, si, 4, out, NULL, NULL, NULL, NULL, NULL);
        break;
    }
    case NN_SHUFFLE: { /* cat, then torchvision's channel_shuffle: view, transpose, view */
        const nn_value *yv = &m->values[nd->out];
        int g = nd->n_in;
        const char *cat = str(b, "%s/cat", name), *v5 = str(b, "%s/groups", name),
                   *tr = str(b, "%s/transposed", name);
        node(b, "Concat", str(b, "%s.cat", name), in, g, cat, attr_int(b, "axis", 1), NULL, NULL,
             NULL, NULL);
        int64_t s5[5] = {0, g, yv->c / g, yv->h, yv->w}, s4[4] = {0, yv->c, yv->h, yv->w},
                perm[5] = {0, 2, 1, 3, 4};
        const char *a1[2] = {cat, init_i64(b, str(b, "%s.shape_groups", name), s5, 5)};
        node(b, "Reshape", str(b, "%s.view", name), a1, 2, v5, NULL, NULL, NULL, NULL, NULL);
        node(b, "Transpose", str(b, "%s.transpose", name), &v5, 1, tr,
             attr_ints(b, "perm", perm, 5), NULL, NULL, NULL, NULL);
        const char *a2[2] = {tr, init_i64(b, str(b, "%s.shape_out", name), s4, 4)};
        node(b, "Reshape", name, a2, 2, out, NULL, NULL, NULL, NULL, NULL);
        break;
    }
    case NN_LN2D: { /* torchvision's LayerNorm2d: permute, layer_norm over C, permute back */
        int64_t to_last[4] = {0, 2, 3, 1}, back[4] = {0, 3, 1, 2};
        const char *t1 = str(b, "%s/nhwc", name), *t2 = str(b, "%s/normed", name);
        node(b, "Transpose", str(b, "%s.to_nhwc", name), in, 1, t1,
             attr_ints(b, "perm", to_last, 4), NULL, NULL, NULL, NULL);
        const char *li[3] = {t1, init_entry(b, nd->entry[0], false),
                             init_entry(b, nd->entry[1], false)};
        node(b, "LayerNormalization", name, li, 3, t2, attr_int(b, "axis", -1),
             attr_float(b, "epsilon", nd->u.ln_eps), NULL, NULL, NULL);
        node(b, "Transpose", str(b, "%s.to_nchw", name), &t2, 1, out, attr_ints(b, "perm", back, 4),
             NULL, NULL, NULL, NULL);
        break;
    }
    case NN_LSCALE: {
        const char *mi[2] = {x, init_entry(b, nd->entry[0], false)};
        node(b, "Mul", name, mi, 2, out, NULL, NULL, NULL, NULL, NULL);
        break;
    }
    case NN_AVGPOOL2D: {
        const mgt_conv2d_shape *sh = &nd->u.fixed.sh;
        int64_t ks[2] = {sh->r, sh->s}, st[2] = {sh->stride_h, sh->stride_w},
                pads[4] = {sh->pad_h, sh->pad_w, sh->pad_h, sh->pad_w};
        node(b, "AveragePool", name, in, 1, out, attr_ints(b, "kernel_shape", ks, 2),
             attr_ints(b, "strides", st, 2), attr_ints(b, "pads", pads, 4),
             attr_int(b, "count_include_pad", 1), NULL);
        break;
    }
    case NN_AFFINE: { /* x * scale + shift, each [1, C, 1, 1] */
        int64_t dims[4] = {1, xv->c, 1, 1};
        float *c = zalloc(b, 2 * (size_t)xv->c * sizeof *c);
        if (!c)
            return MGT_OK;
        memcpy(c, nd->u.fixed.scale, (size_t)xv->c * sizeof *c);
        memcpy(c + xv->c, nd->u.fixed.shift, (size_t)xv->c * sizeof *c);
        const char *scaled = str(b, "%s/scaled", name);
        const char *mi[2] = {x, init_raw(b, str(b, "%s.scale", name),
                                         ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, dims, 4, c,
                                         (size_t)xv->c * sizeof *c)};
        node(b, "Mul", str(b, "%s.mul", name), mi, 2, scaled, NULL, NULL, NULL, NULL, NULL);
        const char *ai[2] = {scaled, init_raw(b, str(b, "%s.shift", name),
                                              ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, dims, 4,
                                              c + xv->c, (size_t)xv->c * sizeof *c)};
        node(b, "Add", name, ai, 2, out, NULL, NULL, NULL, NULL, NULL);
        break;
    }
    case NN_DROPOUT:
    case NN_SDEPTH:
        break; /* identities at inference: their output is named as their input (below) */
    default:
        return mgt_error_set(MGT_ERR_UNSUPPORTED, "%s: layer kind %d has no ONNX form here", name,
                             (int)nd->kind);
    }
    return MGT_OK;
}

/* A ValueInfo of a float tensor [batch, dims...]. */
static Onnx__ValueInfoProto *value_info(onnx_build *b, const char *name, const int64_t *dims, int n,
                                        const char *doc)
{
    Onnx__ValueInfoProto *vi = zalloc(b, sizeof *vi);
    Onnx__TypeProto *tp = zalloc(b, sizeof *tp);
    Onnx__TypeProto__Tensor *tt = zalloc(b, sizeof *tt);
    Onnx__TensorShapeProto *sh = zalloc(b, sizeof *sh);
    Onnx__TensorShapeProto__Dimension **dp = zalloc(b, (size_t)(n + 1) * sizeof *dp);
    Onnx__TensorShapeProto__Dimension *d = zalloc(b, (size_t)(n + 1) * sizeof *d);
    if (!vi || !tp || !tt || !sh || !dp || !d)
        return NULL;
    onnx__value_info_proto__init(vi);
    onnx__type_proto__init(tp);
    onnx__type_proto__tensor__init(tt);
    onnx__tensor_shape_proto__init(sh);
    for (int i = 0; i <= n; i++) {
        onnx__tensor_shape_proto__dimension__init(&d[i]);
        if (i == 0) {
            d[i].value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
            d[i].dim_param = "batch";
        } else {
            d[i].value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
            d[i].dim_value = dims[i - 1];
        }
        dp[i] = &d[i];
    }
    sh->n_dim = (size_t)n + 1;
    sh->dim = dp;
    tt->has_elem_type = true;
    tt->elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    tt->shape = sh;
    tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    tp->tensor_type = tt;
    vi->name = (char *)name;
    vi->type = tp;
    vi->doc_string = (char *)doc;
    return vi;
}

/* protobuf-c's output straight into a file, with a sticky error */
typedef struct file_buffer {
    ProtobufCBuffer base;
    FILE *f;
    bool failed;
} file_buffer;

static void file_append(ProtobufCBuffer *buffer, size_t len, const uint8_t *data)
{
    file_buffer *fb = (file_buffer *)buffer;
    if (!fb->failed && len && fwrite(data, 1, len, fb->f) != len)
        fb->failed = true;
}

static mgt_status write_model(const Onnx__ModelProto *model, const char *path)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return mgt_error_set(MGT_ERR_INVALID, "%s: the path is too long", path);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return mgt_error_set(MGT_ERR_IO, "%s: %s", path, strerror(errno));
    file_buffer fb = {.base = {.append = file_append}, .f = f};
    onnx__model_proto__pack_to_buffer(model, &fb.base);
    int err = 0;
    if (fb.failed || fflush(f) != 0 || fsync(fileno(f)) != 0)
        err = errno ? errno : EIO;
    if (fclose(f) != 0 && !err)
        err = errno;
    if (!err && rename(tmp, path) != 0)
        err = errno;
    if (err) {
        remove(tmp);
        return mgt_error_set(MGT_ERR_IO, "%s: %s", path, strerror(err));
    }
    return MGT_OK;
}

/* What a transformer layer is, for the refusal; NULL for a layer export_node writes. The
   transformers (ViT, Swin, Swin V2, MaxViT) have no ONNX form here yet: their token linears,
   layer norms over rows, permutations, attention, class token and position embedding. */
static const char *transformer_layer(const nn_node *nd)
{
    switch (nd->kind) {
    case NN_LN: return "LayerNorm over tokens";
    case NN_PERMUTE: return "token permutation";
    case NN_ATTN: return "attention";
    case NN_CLS: return "class token";
    case NN_POSADD: return "position embedding";
    case NN_LINEAR: return nd->u.linear.rows > 1 ? "linear over tokens" : NULL;
    default: return NULL;
    }
}

mgt_status mgt_model_export_onnx(mgt_model *m, mgt_stream *s, const char *path,
                                 const char *const *metadata, const char *doc)
{
    mgt_status st = nn_need_device(m, "ONNX export");
    if (st != MGT_OK)
        return st;
    /* refused before anything is written: the first layer without an ONNX form, named */
    for (int k = 0; k < m->n_nodes; k++) {
        const char *what = transformer_layer(&m->nodes[k]);
        if (what)
            return mgt_error_set(MGT_ERR_UNSUPPORTED,
                                 "%s: layer %s (%s) has no ONNX form in mgtrain yet "
                                 "(the transformers are not exported)",
                                 m->arch, m->nodes[k].name, what);
    }
    /* one protobuf message holds at most 2 GiB; ONNX's external data files are not written */
    if (m->params_bytes + m->bufs_bytes > ((size_t)2 << 30) - ((size_t)64 << 20))
        return mgt_error_set(MGT_ERR_UNSUPPORTED,
                             "ONNX export: %s holds %.2f GiB of tensors, past the 2 GiB of one "
                             "protobuf message (ONNX's external data is not written here)",
                             m->arch, (double)(m->params_bytes + m->bufs_bytes) / (1 << 30));
    onnx_build B = {.m = m}, *b = &B;
    char *host = malloc(m->params_bytes + m->bufs_bytes + 1);
    b->vname = calloc((size_t)m->n_values, sizeof *b->vname);
    if (!host || !b->vname) {
        free(host);
        free(b->vname);
        return mgt_error_set(MGT_ERR_OOM, "ONNX export: out of host memory");
    }
    b->params = host;
    b->bufs = host + m->params_bytes;
    st = mgt_copy_d2h(s, host, m->params, m->params_bytes);
    if (st == MGT_OK && m->bufs_bytes)
        st = mgt_copy_d2h(s, host + m->params_bytes, m->bufs, m->bufs_bytes);
    mgt_status st2 = mgt_stream_synchronize(s, NULL);
    if (st == MGT_OK)
        st = st2;
    /* the values' names: the input, each node's output by its module name (a node of several
       outputs' worth of ops names its intermediates NAME/what), the last "logits" */
    int last = m->nodes[m->n_nodes - 1].out;
    bool last_linear = m->nodes[m->n_nodes - 1].kind == NN_LINEAR;
    b->vname[0] = "input";
    for (int k = 0; k < m->n_nodes && st == MGT_OK; k++) {
        const nn_node *nd = &m->nodes[k];
        if (nd->aux) /* the auxiliary classifiers run in training only */
            continue;
        if (nd->kind == NN_DROPOUT || nd->kind == NN_SDEPTH)
            b->vname[nd->out] = b->vname[nd->in[0]];
        else if (nd->out == last && last_linear)
            b->vname[nd->out] = "logits";
        else
            b->vname[nd->out] = str(b, "%s:%d", nd->name, nd->out);
    }
    for (int k = 0; k < m->n_nodes && st == MGT_OK && !b->oom; k++)
        if (!m->nodes[k].aux)
            st = export_node(b, k);
    const nn_value *in = &m->values[0];
    if (st == MGT_OK && !last_linear) { /* a classifier ending in a pool: [batch, classes] */
        const char *x = b->vname[last];
        node(b, "Flatten", "logits.flatten", &x, 1, "logits", attr_int(b, "axis", 1), NULL, NULL,
             NULL, NULL);
    }
    if (st == MGT_OK && b->oom)
        st = mgt_error_set(MGT_ERR_OOM, "ONNX export: out of host memory");
    if (st == MGT_OK) {
        int64_t din[3] = {in->c, in->h, in->w}, dout[1] = {m->values[last].c};
        Onnx__ValueInfoProto *vin =
            value_info(b, "input", din, 3,
                       "float32 images, normalised as in training: (pixel / 255 - mean) / std");
        Onnx__ValueInfoProto *vout =
            value_info(b, "logits", dout, 1, "float32 class scores before softmax");
        Onnx__GraphProto g = ONNX__GRAPH_PROTO__INIT;
        g.name = m->arch;
        g.n_node = (size_t)b->n_nodes;
        g.node = b->nodes;
        g.n_initializer = (size_t)b->n_inits;
        g.initializer = b->inits;
        g.n_input = 1;
        g.input = &vin;
        g.n_output = 1;
        g.output = &vout;
        Onnx__OperatorSetIdProto opset = ONNX__OPERATOR_SET_ID_PROTO__INIT;
        opset.domain = "";
        opset.has_version = true;
        opset.version = ONNX_OPSET;
        Onnx__OperatorSetIdProto *ops = &opset;
        int n_meta = 0;
        while (metadata && metadata[2 * n_meta])
            n_meta++;
        Onnx__StringStringEntryProto *props = zalloc(b, (size_t)(n_meta + 1) * sizeof *props);
        Onnx__StringStringEntryProto **pp = zalloc(b, (size_t)(n_meta + 1) * sizeof *pp);
        if (!props || !pp || !vin || !vout) {
            st = mgt_error_set(MGT_ERR_OOM, "ONNX export: out of host memory");
        } else {
            for (int i = 0; i < n_meta; i++) {
                onnx__string_string_entry_proto__init(&props[i]);
                props[i].key = (char *)metadata[2 * i];
                props[i].value = (char *)metadata[2 * i + 1];
                pp[i] = &props[i];
            }
            Onnx__ModelProto model = ONNX__MODEL_PROTO__INIT;
            model.has_ir_version = true;
            model.ir_version = ONNX_IR_VERSION;
            model.n_opset_import = 1;
            model.opset_import = &ops;
            model.producer_name = "mgtrain";
            model.producer_version = (char *)mgt_version();
            model.doc_string = (char *)doc;
            model.graph = &g;
            model.n_metadata_props = (size_t)n_meta;
            model.metadata_props = pp;
            st = write_model(&model, path);
        }
    }
    for (int i = 0; i < b->n_allocs; i++)
        free(b->allocs[i]);
    free(b->allocs);
    free(b->nodes);
    free(b->inits);
    free(b->vname);
    free(host);
    return st;
}
