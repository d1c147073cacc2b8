/* oneDNN on the CPU fast path: single-threaded sgemm and blocked-layout convolutions run over chunks of a batch on the device's pool. */

/* A convolution takes its batch in chunks of images small enough for the core's L2 cache: each
   chunk of an NCHW operand is reordered into the blocked layout oneDNN's direct kernels want
   (nChw16c for 16-channel multiples), convolved, and reordered back, with beta applied by the
   last reorder; an operand the model keeps in nChw16c between ops (mgt_layout) goes in and
   comes out as it is. Weights are reordered once per
   op. The filter gradient is summed per thread-part over its chunks and the parts are added
   in part order, so results never depend on timing. oneDNN's own OpenMP threads stay off:
   every thread that calls in runs single-threaded and the pool does the splitting. */
#include <omp.h>
#include <pthread.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "device/cpu/kernels.h"
#include "device/cpu/onednn.h"

/* Floats of a chunk's per-image operands: about half of a Zen/Skylake core's L2. */
#define CHUNK_FLOATS (128u * 1024)
/* Scratch regions start on a cache line. */
#define ALIGN_FLOATS 16

typedef enum { K_FWD, K_BWD_DATA, K_BWD_FILTER } conv_kind;

/* Memory-object slots of one primitive, per thread. */
enum { M_UA, M_IA, M_UB, M_IB, M_UW, M_IW, M_UO, M_IO, M_SP, M_COUNT };

/* One convolution over mb images with its reorders. a is the per-image input (src, or
   diff_dst for backward data), b the second one of the filter gradient (diff_dst), o the
   per-image output (dst or diff_src), w the weights (or their gradient). u* is mgtrain's
   plain layout, i* the layout oneDNN chose; a reorder exists only where they lay the bytes
   out differently (same_bytes), except that the output reorder also exists where beta
   applies, and the filter gradient always goes through w_out (plain) and w_acc (summing). */
typedef struct prim {
    int mb;
    dnnl_primitive_t conv;
    dnnl_primitive_t ra, rb, ro, rw, w_out, w_acc;
    /* beta 1 onto an output oneDNN writes in the op's own layout: the chunk lands in the o
       buffer and is added on here, instead of by a summing reorder (oneDNN 2.6 has no JIT
       kernel for one between equal layouts, and its reference loop ran at a fifth of this) */
    bool add_out;
    /* a 16-bit output with beta != 0 (oneDNN's backward passes take no sum post-op): the
       kernel writes fp32 in the output's own layout into the o buffer, and the chunk is
       rounded onto the stored values as the code of result + beta * stored (cpu16_round_acc) */
    bool add16;
    dnnl_memory_desc_t md[M_COUNT];
    size_t fa, fb, fo, fw, fsp; /* floats of the internal buffers each thread needs */
    size_t w_off;               /* forward/backward data: internal weights in shared scratch */
    dnnl_memory_t *mem;         /* threads x M_COUNT */
} prim;

struct onednn_plan {
    conv_kind kind;
    bool bf16; /* a conv2d_*_lp op in bf16: the reorders round its inputs to bf16 */
    /* the op's activation storage (mgt_op.store_in, store_out): a bf16 activation is handed
       to oneDNN as bf16 memory in its own layout, and a bf16 output written as bf16 by the
       kernel (fp32 sums rounded once, beta applied before the rounding) */
    bool x16, y16;
    mgt_conv2d_shape sh;
    uint32_t beta_bits;
    bool ok; /* false: oneDNN cannot do it (kept so the question is asked once) */
    int chunk, chunks, parts;
    prim full, last; /* last.mb == 0 when chunks divide the batch */
    size_t per_thread, shared, dw_n, part_stride;
    size_t off_b, off_o, off_w, off_sp; /* a thread's buffers after its a buffer, in floats */
    /* filter gradient: a part sums its chunks' gradients in oneDNN's layout (the two
       primitives' layouts are the same) in w, each next chunk's landing in w2 at off_w2, and
       reorders the sum to plain once, instead of once per chunk */
    bool w_blocked_sum;
    size_t off_w2;
    onednn_plan *next;
};

struct onednn {
    int threads;
    dnnl_engine_t eng;
    dnnl_stream_t *streams;
    onednn_plan *plans;
};

static _Thread_local bool omp_single;

/* oneDNN sizes its OpenMP teams by omp_get_max_threads(): one thread for every caller. */
static void single_threaded(void)
{
    if (!omp_single) {
        omp_set_num_threads(1);
        omp_single = true;
    }
}

static size_t align_up(size_t n) { return (n + ALIGN_FLOATS - 1) / ALIGN_FLOATS * ALIGN_FLOATS; }
static size_t max_z(size_t a, size_t b) { return a > b ? a : b; }

void onednn_sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda,
                  const float *b, int ldb, float beta, float *c, int ldc)
{
    single_threaded();
    dnnl_status_t s =
        dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    /* op.c has checked every shape and leading dimension: a refusal is a broken invariant */
    MGT_ASSERT(s == dnnl_success);
}

static pthread_once_t warm_once = PTHREAD_ONCE_INIT;
static void prim_free(onednn *o, prim *p);
static dnnl_status_t make_conv(onednn *o, const onednn_plan *pl, int mb, prim *p);

/* oneDNN builds its process-wide state (CPU detection, primitive cache and its lock, JIT
   runtime) lazily, on first use, behind C++ static guards that are invisible to the thread
   sanitizer in an uninstrumented library. Making one small convolution plan here, once and
   before any device thread exists, builds all of it on one thread first. */
static void warm_up(void)
{
    /* Plans are cached per device here; oneDNN's process-wide cache would only share
       primitives between device threads through synchronisation the sanitizer cannot see. */
    dnnl_set_primitive_cache_capacity(0);
    onednn o = {.threads = 1};
    dnnl_stream_t st = NULL;
    if (dnnl_engine_create(&o.eng, dnnl_cpu, 0) != dnnl_success)
        return;
    o.streams = &st;
    if (dnnl_stream_create(&st, o.eng, dnnl_stream_default_flags) == dnnl_success) {
        onednn_plan pl = {.kind = K_FWD, .sh = {1, 16, 4, 4, 16, 3, 3, 1, 1, 1, 1, 1}};
        float c[4] = {0};
        single_threaded();
        onednn_sgemm(false, false, 2, 2, 1, 1.0f, c, 1, c, 2, 0.0f, c, 2);
        (void)make_conv(&o, &pl, 1, &pl.full);
        prim_free(&o, &pl.full);
        dnnl_stream_destroy(st);
    }
    dnnl_engine_destroy(o.eng);
}

mgt_status onednn_create(int threads, onednn **out)
{
    *out = NULL;
    pthread_once(&warm_once, warm_up);
    onednn *o = calloc(1, sizeof *o);
    if (o == NULL)
        return mgt_error_set(MGT_ERR_OOM, "oneDNN: out of host memory");
    o->threads = threads;
    o->streams = calloc((size_t)threads, sizeof *o->streams);
    dnnl_status_t s = o->streams ? dnnl_engine_create(&o->eng, dnnl_cpu, 0) : dnnl_out_of_memory;
    for (int t = 0; t < threads && s == dnnl_success; t++)
        s = dnnl_stream_create(&o->streams[t], o->eng, dnnl_stream_default_flags);
    if (s != dnnl_success) {
        onednn_free(o);
        return mgt_error_set(MGT_ERR_DEVICE, "oneDNN: cannot open the CPU engine: %s",
                             dnnl_status2str(s));
    }
    *out = o;
    return MGT_OK;
}

static void prim_free(onednn *o, prim *p)
{
    dnnl_primitive_t *ps[] = {&p->conv, &p->ra, &p->rb, &p->ro, &p->rw, &p->w_out, &p->w_acc};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        if (*ps[i])
            dnnl_primitive_destroy(*ps[i]);
    if (p->mem) {
        for (int i = 0; i < o->threads * M_COUNT; i++)
            if (p->mem[i])
                dnnl_memory_destroy(p->mem[i]);
        free(p->mem);
    }
    memset(p, 0, sizeof *p);
}

void onednn_free(onednn *o)
{
    if (o == NULL)
        return;
    while (o->plans) {
        onednn_plan *pl = o->plans;
        o->plans = pl->next;
        prim_free(o, &pl->full);
        prim_free(o, &pl->last);
        free(pl);
    }
    for (int t = 0; o->streams && t < o->threads; t++)
        if (o->streams[t])
            dnnl_stream_destroy(o->streams[t]);
    free(o->streams);
    if (o->eng)
        dnnl_engine_destroy(o->eng);
    free(o);
}

/* ---- making a plan ---- */

/* Rounded up: a bf16 buffer of an odd element count still gets its last two bytes. */
static size_t md_floats(const dnnl_memory_desc_t *md)
{
    return (dnnl_memory_desc_get_size(md) + sizeof(float) - 1) / sizeof(float);
}

/* Each dimension's element stride of a blocked md whose inner blocks each span a whole
   dimension (so an index divided by its block is always 0), as a plain md has them; false
   where a block splits a dimension, or the md is not plainly blocked. */
static bool plain_strides(const dnnl_memory_desc_t *md, int64_t st[DNNL_MAX_NDIMS])
{
    const dnnl_blocking_desc_t *bl = &md->format_desc.blocking;
    if (md->format_kind != dnnl_blocked || md->extra.flags != 0)
        return false;
    for (int d = 0; d < md->ndims; d++) {
        if (md->padded_dims[d] != md->dims[d])
            return false;
        st[d] = bl->strides[d];
    }
    int64_t inner = 1;
    for (int b = bl->inner_nblks - 1; b >= 0; b--) {
        int d = (int)bl->inner_idxs[b];
        if (bl->inner_blks[b] != md->dims[d])
            return false;
        st[d] = inner;
        inner *= bl->inner_blks[b];
    }
    return true;
}

/* Whether two mds lay every element at the same byte: equal, or equal once whole-dimension
   blocks are seen as strides (nChw16c with 16 channels is NHWC), so no reorder is needed. */
static bool same_bytes(const dnnl_memory_desc_t *a, const dnnl_memory_desc_t *b)
{
    if (dnnl_memory_desc_equal(a, b))
        return true;
    int64_t sa[DNNL_MAX_NDIMS], sb[DNNL_MAX_NDIMS];
    if (a->ndims != b->ndims || a->data_type != b->data_type || a->offset0 != b->offset0 ||
        !plain_strides(a, sa) || !plain_strides(b, sb))
        return false;
    for (int d = 0; d < a->ndims; d++)
        if (a->dims[d] != b->dims[d] || (a->dims[d] > 1 && sa[d] != sb[d]))
            return false;
    return true;
}

/* Attributes in user-scratchpad mode (each thread brings its own scratchpad, so threads can
   run the same primitive at once), with a sum post-op (dst = result + sum * dst) where
   sum != 0. *attr is NULL on failure. */
static dnnl_status_t make_attr(float sum, dnnl_primitive_attr_t *attr)
{
    dnnl_post_ops_t po = NULL;
    dnnl_status_t s = dnnl_primitive_attr_create(attr);
    if (s == dnnl_success)
        s = dnnl_primitive_attr_set_scratchpad_mode(*attr, dnnl_scratchpad_mode_user);
    if (s == dnnl_success && sum != 0.0f) {
        s = dnnl_post_ops_create(&po);
        if (s == dnnl_success)
            s = dnnl_post_ops_append_sum(po, sum);
        if (s == dnnl_success)
            s = dnnl_primitive_attr_set_post_ops(*attr, po);
    }
    if (po)
        dnnl_post_ops_destroy(po);
    if (s != dnnl_success && *attr) {
        dnnl_primitive_attr_destroy(*attr);
        *attr = NULL;
    }
    return s;
}

/* A primitive from its descriptor (see make_attr); *sp grows to its scratchpad. ref_ok:
   whether oneDNN's reference implementation is acceptable, or means "not supported". */
static dnnl_status_t make_prim(onednn *o, const_dnnl_op_desc_t desc, float sum,
                               const_dnnl_primitive_desc_t hint, bool ref_ok,
                               dnnl_primitive_desc_t *pd_out, dnnl_primitive_t *out, size_t *sp)
{
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t s = make_attr(sum, &attr);
    if (s == dnnl_success)
        s = dnnl_primitive_desc_create(&pd, desc, attr, o->eng, hint);
    if (s == dnnl_success && !ref_ok) {
        const char *impl = NULL;
        if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success ||
            impl == NULL || strncmp(impl, "ref", 3) == 0)
            s = dnnl_unimplemented;
    }
    if (s == dnnl_success) {
        *sp = max_z(*sp, md_floats(dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0)));
        if (out)
            s = dnnl_primitive_create(out, pd);
    }
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    if (pd && (s != dnnl_success || pd_out == NULL))
        dnnl_primitive_desc_destroy(pd);
    else if (pd_out)
        *pd_out = pd;
    return s;
}

/* A reorder from -> to, accumulating (to = reorder(from) + sum * to) where sum != 0. */
static dnnl_status_t make_reorder(onednn *o, const dnnl_memory_desc_t *from,
                                  const dnnl_memory_desc_t *to, float sum, dnnl_primitive_t *out,
                                  size_t *sp)
{
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t s = make_attr(sum, &attr);
    if (s == dnnl_success)
        s = dnnl_reorder_primitive_desc_create(&pd, from, o->eng, to, o->eng, attr);
    if (s == dnnl_success) {
        *sp = max_z(*sp, md_floats(dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0)));
        s = dnnl_primitive_create(out, pd);
    }
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    return s;
}

static void dims4(dnnl_dims_t d, int a, int b, int c, int e)
{
    d[0] = a;
    d[1] = b;
    d[2] = c;
    d[3] = e;
}

/* Whether pd is oneDNN's im2col + gemm filter gradient of an fp32 depthwise convolution on
   NCHW activations. oneDNN 2.6 has a direct depthwise filter gradient for AVX2 in 3x3 only;
   for 5x5 (EfficientNet's) it falls back to im2col and a 1-channel sgemm per group, which
   took 846 of 1135 ms of efficientnet_b0's filter gradients (b8 224, 1 thread, Zen 3,
   ONEDNN_VERBOSE). mgtrain's own depthwise loops (conv.c) take those shapes instead. */
static bool gemm_depthwise_filter(const onednn_plan *pl, const_dnnl_primitive_desc_t pd)
{
    const mgt_conv2d_shape *sh = &pl->sh;
    if (pl->kind != K_BWD_FILTER || pl->bf16 || sh->groups <= 1 || sh->groups != sh->c ||
        sh->groups != sh->k || sh->x_layout != MGT_LAYOUT_NCHW || sh->y_layout != MGT_LAYOUT_NCHW)
        return false;
    const char *impl = NULL;
    return dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
           impl != NULL && strstr(impl, "gemm") != NULL;
}

/* The convolution of sh (n = mb) of the plan's kind, with reorders and memory objects. */
static dnnl_status_t make_conv(onednn *o, const onednn_plan *pl, int mb, prim *p)
{
    const mgt_conv2d_shape *sh = &pl->sh;
    int pp = mgt_conv2d_out_h(sh), qq = mgt_conv2d_out_w(sh);
    dnnl_dims_t xd, wd, yd, strides, pad_l, pad_r;
    dims4(xd, mb, sh->c, sh->h, sh->w);
    /* grouped: weights [groups, k / groups, c / groups, r, s] (goihw, the same bytes as
       PyTorch's [k, c / groups, r, s]) */
    int g = sh->groups > 1 ? sh->groups : 1, wn = g > 1 ? 5 : 4;
    if (g > 1) {
        wd[0] = g;
        wd[1] = sh->k / g;
        wd[2] = sh->c / g;
        wd[3] = sh->r;
        wd[4] = sh->s;
    } else {
        dims4(wd, sh->k, sh->c, sh->r, sh->s);
    }
    dims4(yd, mb, sh->k, pp, qq);
    strides[0] = sh->stride_h;
    strides[1] = sh->stride_w;
    pad_l[0] = sh->pad_h;
    pad_l[1] = sh->pad_w;
    /* oneDNN wants the right padding that makes the output size exact: PyTorch's floor
       leaves input columns unread, which is a negative right padding (-1 for a 1x1 stride-2
       projection of an even size) */
    pad_r[0] = (int64_t)(pp - 1) * sh->stride_h + sh->r - sh->h - sh->pad_h;
    pad_r[1] = (int64_t)(qq - 1) * sh->stride_w + sh->s - sh->w - sh->pad_w;

    p->mb = mb;
    /* bf16 (a _lp op): the op's two inputs are bf16 inside oneDNN (the reorders from the
       user's fp32 round them, to nearest even), its output fp32; a backward primitive's
       forward hint is the all-bf16 training forward */
    dnnl_data_type_t tx = pl->bf16 && (pl->kind != K_BWD_DATA || pl->x16) ? dnnl_bf16 : dnnl_f32;
    dnnl_data_type_t tw = pl->bf16 && pl->kind != K_BWD_FILTER ? dnnl_bf16 : dnnl_f32;
    dnnl_data_type_t ty = pl->bf16 && (pl->kind != K_FWD || pl->y16) ? dnnl_bf16 : dnnl_f32;
    float beta;
    memcpy(&beta, &pl->beta_bits, sizeof beta);
    dnnl_data_type_t th = pl->bf16 ? dnnl_bf16 : dnnl_f32;
    dnnl_memory_desc_t x_any, w_any, y_any, x_u, w_u, y_u, xh, wh, yh;
    /* a 16-bit output with beta: the kernel's sum post-op adds beta times the stored value to
       the fp32 result and rounds once; that needs the output in the user's layout, so the
       primitive is made again for it below if oneDNN chose another */
    bool out16 = (pl->kind == K_FWD && pl->y16) || (pl->kind == K_BWD_DATA && pl->x16);
    bool add16 = out16 && beta != 0.0f;
    if (add16 && pl->kind == K_FWD)
        ty = dnnl_f32;
    if (add16 && pl->kind == K_BWD_DATA)
        tx = dnnl_f32;
    dnnl_status_t s = dnnl_memory_desc_init_by_tag(&x_any, 4, xd, tx, dnnl_format_tag_any);
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_tag(&w_any, wn, wd, tw, dnnl_format_tag_any);
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_tag(&y_any, 4, yd, ty, dnnl_format_tag_any);
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_tag(&xh, 4, xd, th, dnnl_format_tag_any);
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_tag(&wh, wn, wd, th, dnnl_format_tag_any);
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_tag(&yh, 4, yd, th, dnnl_format_tag_any);
    /* the activations as the op has them: NCHW, or kept blocked between ops, in which case the
       reorder disappears wherever oneDNN wants the same layout */
    dnnl_format_tag_t xt = sh->x_layout == MGT_LAYOUT_NCHW16C ? dnnl_nChw16c : dnnl_nchw;
    dnnl_format_tag_t yt = sh->y_layout == MGT_LAYOUT_NCHW16C ? dnnl_nChw16c : dnnl_nchw;
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_tag(&x_u, 4, xd, pl->x16 ? dnnl_bf16 : dnnl_f32, xt);
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_tag(&w_u, wn, wd, dnnl_f32, g > 1 ? dnnl_goihw : dnnl_oihw);
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_tag(&y_u, 4, yd, pl->y16 ? dnnl_bf16 : dnnl_f32, yt);
    if (s != dnnl_success)
        return s;

    /* backward primitives are made with the forward one as their hint, as oneDNN requires */
    dnnl_convolution_desc_t fd, bd;
    dnnl_primitive_desc_t fpd = NULL, pd = NULL;
    size_t sp = 0;
    bool fwd = pl->kind == K_FWD;
    s = dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct,
                                           fwd ? &x_any : &xh, fwd ? &w_any : &wh, NULL,
                                           fwd ? &y_any : &yh, strides, pad_l, pad_r);
    if (s == dnnl_success && fwd) {
        s = make_prim(o, &fd, 0.0f, NULL, false, &pd, &p->conv, &sp);
    } else if (s == dnnl_success) {
        s = make_prim(o, &fd, 0.0f, NULL, true, &fpd, NULL, &(size_t){0});
        if (s == dnnl_success && pl->kind == K_BWD_DATA)
            s = dnnl_convolution_backward_data_desc_init(&bd, dnnl_convolution_direct, &x_any,
                                                         &w_any, &y_any, strides, pad_l, pad_r);
        else if (s == dnnl_success)
            s = dnnl_convolution_backward_weights_desc_init(
                &bd, dnnl_convolution_direct, &x_any, &w_any, NULL, &y_any, strides, pad_l, pad_r);
        if (s == dnnl_success)
            s = make_prim(o, &bd, 0.0f, fpd, false, &pd, &p->conv, &sp);
        if (s == dnnl_success && gemm_depthwise_filter(pl, pd))
            s = dnnl_unimplemented; /* the caller frees p->conv with the plan */
    }
    if (fpd)
        dnnl_primitive_desc_destroy(fpd);
    if (s != dnnl_success) {
        if (pd)
            dnnl_primitive_desc_destroy(pd);
        return s;
    }

    /* plain and chosen layouts of each operand */
    const dnnl_memory_desc_t *xi, *wi, *yi;
    if (pl->kind == K_FWD) {
        xi = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
        wi = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        yi = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    } else if (pl->kind == K_BWD_DATA) {
        xi = dnnl_primitive_desc_query_md(pd, dnnl_query_diff_src_md, 0);
        wi = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        yi = dnnl_primitive_desc_query_md(pd, dnnl_query_diff_dst_md, 0);
    } else {
        xi = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
        wi = dnnl_primitive_desc_query_md(pd, dnnl_query_diff_weights_md, 0);
        yi = dnnl_primitive_desc_query_md(pd, dnnl_query_diff_dst_md, 0);
    }
    memset(p->md, 0, sizeof p->md);
    p->md[M_UW] = w_u;
    p->md[M_IW] = *wi;
    if (pl->kind == K_BWD_DATA) { /* a = dy, o = dx */
        p->md[M_UA] = y_u;
        p->md[M_IA] = *yi;
        p->md[M_UO] = x_u;
        p->md[M_IO] = *xi;
    } else { /* a = x; forward: o = y; filter gradient: b = dy */
        p->md[M_UA] = x_u;
        p->md[M_IA] = *xi;
        if (pl->kind == K_FWD) {
            p->md[M_UO] = y_u;
            p->md[M_IO] = *yi;
        } else {
            p->md[M_UB] = y_u;
            p->md[M_IB] = *yi;
        }
    }
    dnnl_primitive_desc_destroy(pd);
    if (!same_bytes(&p->md[M_UA], &p->md[M_IA])) {
        p->fa = md_floats(&p->md[M_IA]);
        s = make_reorder(o, &p->md[M_UA], &p->md[M_IA], 0.0f, &p->ra, &sp);
    }
    if (s == dnnl_success && pl->kind == K_BWD_FILTER && !same_bytes(&p->md[M_UB], &p->md[M_IB])) {
        p->fb = md_floats(&p->md[M_IB]);
        s = make_reorder(o, &p->md[M_UB], &p->md[M_IB], 0.0f, &p->rb, &sp);
    }
    bool same_out = same_bytes(&p->md[M_UO], &p->md[M_IO]);
    if (add16) {
        /* the fp32 result laid out as the stored codes are, element for element: reordered
           into the b buffer (unused by the data passes) where oneDNN chose another layout */
        dnnl_memory_desc_t uo32 = p->md[M_UO];
        uo32.data_type = dnnl_f32;
        p->add16 = true;
        p->fo = md_floats(&p->md[M_IO]);
        if (s == dnnl_success && !same_bytes(&uo32, &p->md[M_IO])) {
            p->md[M_UB] = uo32;
            p->fb = md_floats(&uo32);
            s = make_reorder(o, &p->md[M_IO], &uo32, 0.0f, &p->ro, &sp);
        }
    } else if (pl->kind != K_BWD_FILTER && (beta != 0.0f || !same_out)) {
        p->fo = md_floats(&p->md[M_IO]);
        p->add_out = same_out && beta == 1.0f;
        if (s == dnnl_success && !p->add_out)
            s = make_reorder(o, &p->md[M_IO], &p->md[M_UO], beta, &p->ro, &sp);
    }
    if (s == dnnl_success && pl->kind != K_BWD_FILTER && !same_bytes(&p->md[M_UW], &p->md[M_IW])) {
        p->fw = md_floats(&p->md[M_IW]);
        s = make_reorder(o, &p->md[M_UW], &p->md[M_IW], 0.0f, &p->rw, &sp);
    }
    if (s == dnnl_success && pl->kind == K_BWD_FILTER) {
        p->fw = md_floats(&p->md[M_IW]);
        s = make_reorder(o, &p->md[M_IW], &p->md[M_UW], 0.0f, &p->w_out, &sp);
        if (s == dnnl_success)
            s = make_reorder(o, &p->md[M_IW], &p->md[M_UW], 1.0f, &p->w_acc, &sp);
    }
    p->fsp = sp;
    if (s == dnnl_success && sp > 0) {
        dnnl_dims_t d = {(int64_t)sp};
        s = dnnl_memory_desc_init_by_tag(&p->md[M_SP], 1, d, dnnl_f32, dnnl_a);
    }
    if (s == dnnl_success) {
        p->mem = calloc((size_t)o->threads * M_COUNT, sizeof *p->mem);
        s = p->mem ? dnnl_success : dnnl_out_of_memory;
    }
    for (int t = 0; t < o->threads && s == dnnl_success; t++)
        for (int m = 0; m < M_COUNT && s == dnnl_success; m++)
            if (p->md[m].ndims > 0)
                s = dnnl_memory_create(&p->mem[t * M_COUNT + m], &p->md[m], o->eng,
                                       DNNL_MEMORY_NONE);
    return s;
}

static bool plan_matches(const onednn_plan *pl, conv_kind kind, bool bf16, bool x16, bool y16,
                         const mgt_conv2d_shape *sh, uint32_t beta_bits)
{
    return pl->kind == kind && pl->bf16 == bf16 && pl->x16 == x16 && pl->y16 == y16 &&
           pl->beta_bits == beta_bits && memcmp(&pl->sh, sh, sizeof *sh) == 0;
}

/* Scratch of a plan whose primitives exist: shared weights or parts, then per thread the
   internal a, b, o and w buffers and the scratchpad, each the larger of the two primitives'. */
static void plan_layout(onednn_plan *pl)
{
    const prim *ps[2] = {&pl->full, pl->last.mb ? &pl->last : NULL};
    size_t fa = 0, fb = 0, fo = 0, fw = 0, fsp = 0;
    for (int i = 0; i < 2 && ps[i]; i++) {
        fa = max_z(fa, ps[i]->fa);
        fb = max_z(fb, ps[i]->fb);
        fo = max_z(fo, ps[i]->fo);
        fsp = max_z(fsp, ps[i]->fsp);
        if (pl->kind == K_BWD_FILTER)
            fw = max_z(fw, ps[i]->fw);
    }
    pl->off_b = align_up(fa);
    pl->off_o = pl->off_b + align_up(fb);
    pl->off_w = pl->off_o + align_up(fo);
    pl->w_blocked_sum =
        pl->kind == K_BWD_FILTER &&
        (!pl->last.mb || dnnl_memory_desc_equal(&pl->full.md[M_IW], &pl->last.md[M_IW]));
    pl->off_w2 = pl->off_w + align_up(fw);
    pl->off_sp = pl->off_w2 + (pl->w_blocked_sum ? align_up(fw) : 0);
    pl->per_thread = pl->off_sp + align_up(fsp);
    pl->dw_n = (size_t)pl->sh.k * (pl->sh.c / (pl->sh.groups > 1 ? pl->sh.groups : 1)) * pl->sh.r *
               pl->sh.s;
    if (pl->kind == K_BWD_FILTER) {
        pl->part_stride = align_up(pl->dw_n);
        pl->shared = (size_t)pl->parts * pl->part_stride;
    } else {
        pl->full.w_off = 0;
        pl->shared = align_up(pl->full.fw);
        if (pl->last.mb && pl->last.fw) {
            pl->last.w_off = pl->shared;
            pl->shared += align_up(pl->last.fw);
        }
    }
}

mgt_status onednn_conv_plan(onednn *o, const mgt_op *op, onednn_plan **plan, size_t *scratch_floats)
{
    mgt_op_kind fk = op->kind;
    conv_kind kind = fk == MGT_OP_CONV2D_FWD        ? K_FWD
                     : fk == MGT_OP_CONV2D_BWD_DATA ? K_BWD_DATA
                                                    : K_BWD_FILTER;
    bool bf16 = op->prec == MGT_PREC_BF16;
    /* bf16 storage only with bf16 arithmetic (cpu_conv2d asks for nothing else) */
    bool x16 = op->store_in == MGT_PREC_BF16, y16 = op->store_out == MGT_PREC_BF16;
    MGT_ASSERT(bf16 || (!x16 && !y16));
    const mgt_conv2d_shape *sh = &op->u.conv.sh;
    uint32_t beta_bits;
    memcpy(&beta_bits, &op->u.conv.beta, sizeof beta_bits);
    onednn_plan **link = &o->plans, *pl = NULL;
    for (; *link; link = &(*link)->next) {
        if (plan_matches(*link, kind, bf16, x16, y16, sh, beta_bits)) {
            pl = *link;
            *link = pl->next; /* to the front: a step reuses the same few dozen */
            pl->next = o->plans;
            o->plans = pl;
            break;
        }
    }
    if (pl == NULL) {
        pl = calloc(1, sizeof *pl);
        if (pl == NULL)
            return mgt_error_set(MGT_ERR_OOM, "oneDNN: out of host memory for a plan");
        pl->kind = kind;
        pl->bf16 = bf16;
        pl->x16 = x16;
        pl->y16 = y16;
        pl->sh = *sh;
        pl->beta_bits = beta_bits;
        {
            single_threaded();
            size_t per_image = (size_t)sh->c * sh->h * sh->w +
                               (size_t)sh->k * mgt_conv2d_out_h(sh) * mgt_conv2d_out_w(sh);
            size_t chunk = max_z(1, CHUNK_FLOATS / per_image);
            /* enough chunks to keep every thread busy; the filter gradient wants one part
               per thread at least */
            size_t want = (size_t)o->threads * (kind == K_BWD_FILTER ? 1 : 2);
            size_t even = ((size_t)sh->n + want - 1) / want;
            if (chunk > even)
                chunk = max_z(1, even);
            pl->chunk = (int)chunk;
            pl->chunks = (int)(((size_t)sh->n + chunk - 1) / chunk);
            pl->parts = pl->chunks < o->threads ? pl->chunks : o->threads;
            int rest = sh->n - (pl->chunks - 1) * pl->chunk;
            dnnl_status_t s = make_conv(o, pl, pl->chunk, &pl->full);
            if (s == dnnl_success && rest != pl->chunk)
                s = make_conv(o, pl, rest, &pl->last);
            pl->ok = s == dnnl_success;
            if (!pl->ok) {
                prim_free(o, &pl->full);
                prim_free(o, &pl->last);
            } else {
                plan_layout(pl);
            }
        }
        pl->next = o->plans;
        o->plans = pl;
    }
    *plan = pl;
    *scratch_floats = pl->ok ? pl->shared + pl->per_thread * (size_t)o->threads : 0;
    return pl->ok ? MGT_OK : MGT_ERR_UNSUPPORTED;
}

/* ---- running ---- */

typedef struct run_job {
    onednn *o;
    const onednn_plan *pl;
    const mgt_op *op;
    float *scratch;
    atomic_int failed; /* the first dnnl_status_t != success */
} run_job;

static void note(run_job *j, dnnl_status_t s)
{
    int none = dnnl_success;
    if (s != dnnl_success)
        atomic_compare_exchange_strong(&j->failed, &none, (int)s);
}

static dnnl_memory_t mem_at(const prim *p, int t, int slot, const void *ptr)
{
    dnnl_memory_t m = p->mem[t * M_COUNT + slot];
    dnnl_memory_set_data_handle(m, (void *)ptr);
    return m;
}

static dnnl_status_t exec2(const prim *p, dnnl_primitive_t r, dnnl_stream_t st, int t,
                           dnnl_memory_t from, dnnl_memory_t to, float *sp)
{
    dnnl_exec_arg_t a[3] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    int n = 2;
    if (p->fsp)
        a[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, mem_at(p, t, M_SP, sp)};
    return dnnl_primitive_execute(r, st, n, a);
}

/* Thread t's internal buffers: a, b, o, w, scratchpad. */
typedef struct bufs {
    float *a, *b, *o, *w, *w2, *sp;
} bufs;

static bufs bufs_of(const run_job *j, int t)
{
    const onednn_plan *pl = j->pl;
    float *a = j->scratch + pl->shared + (size_t)t * pl->per_thread;
    return (bufs){a, a + pl->off_b, a + pl->off_o, a + pl->off_w, a + pl->off_w2, a + pl->off_sp};
}

/* Image offset and primitive of chunk i. */
static const prim *chunk_prim(const onednn_plan *pl, int i, size_t *n0)
{
    *n0 = (size_t)i * pl->chunk;
    return i == pl->chunks - 1 && pl->last.mb ? &pl->last : &pl->full;
}

/* Forward and backward data: chunk i in, convolved, out. */
static void data_item(void *c, int i, int t)
{
    run_job *j = c;
    const onednn_plan *pl = j->pl;
    const mgt_conv2d_shape *sh = &pl->sh;
    single_threaded();
    size_t n0;
    const prim *p = chunk_prim(pl, i, &n0);
    size_t xs = (size_t)sh->c * sh->h * sh->w;
    size_t ys = (size_t)sh->k * mgt_conv2d_out_h(sh) * mgt_conv2d_out_w(sh);
    bool fwd = pl->kind == K_FWD;
    size_t ea = (fwd ? pl->x16 : pl->y16) ? 2 : 4, eo = (fwd ? pl->y16 : pl->x16) ? 2 : 4;
    const void *ua = (const char *)j->op->u.conv.in1 + n0 * (fwd ? xs : ys) * ea;
    void *uo = (char *)j->op->u.conv.out + n0 * (fwd ? ys : xs) * eo;
    const float *w = p->rw ? j->scratch + p->w_off : j->op->u.conv.in2;
    dnnl_stream_t st = j->o->streams[t];
    bufs b = bufs_of(j, t);
    dnnl_status_t s = dnnl_success;
    const void *ia = ua;
    if (p->ra) {
        s = exec2(p, p->ra, st, t, mem_at(p, t, M_UA, ua), mem_at(p, t, M_IA, b.a), b.sp);
        ia = b.a;
    }
    void *io = p->ro || p->add_out || p->add16 ? b.o : uo;
    if (s == dnnl_success) {
        dnnl_exec_arg_t a[4] = {
            {fwd ? DNNL_ARG_SRC : DNNL_ARG_DIFF_DST, mem_at(p, t, M_IA, ia)},
            {DNNL_ARG_WEIGHTS, mem_at(p, t, M_IW, w)},
            {fwd ? DNNL_ARG_DST : DNNL_ARG_DIFF_SRC, mem_at(p, t, M_IO, io)},
        };
        int n = 3;
        if (p->fsp)
            a[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, mem_at(p, t, M_SP, b.sp)};
        s = dnnl_primitive_execute(p->conv, st, n, a);
    }
    const float *res16 = io; /* add16: the fp32 result in the stored layout */
    if (s == dnnl_success && p->ro && p->add16) {
        s = exec2(p, p->ro, st, t, mem_at(p, t, M_IO, io), mem_at(p, t, M_UB, b.b), b.sp);
        res16 = b.b;
    } else if (s == dnnl_success && p->ro) {
        s = exec2(p, p->ro, st, t, mem_at(p, t, M_IO, io), mem_at(p, t, M_UO, uo), b.sp);
    }
    if (s == dnnl_success)
        s = dnnl_stream_wait(st);
    if (s == dnnl_success && p->add16)
        cpu16_round_acc(MGT_PREC_BF16, res16, j->op->u.conv.beta, uo,
                        (size_t)p->mb * (fwd ? ys : xs));
    if (s == dnnl_success && p->add_out) /* the summing reorder's dst + src, bit for bit */
        for (size_t k = 0, n = (size_t)p->mb * (fwd ? ys : xs); k < n; k++)
            ((float *)uo)[k] += ((const float *)io)[k];
    note(j, s);
}

/* Filter gradient: part i sums its chunks' gradients into its own plain accumulator: in
   oneDNN's layout and reordered once where the plan allows (w_blocked_sum), else reordered and
   added chunk by chunk. The sums are the same additions in the same order either way (a
   reorder's beta 1 adds as `+` does), so the bits do not change. */
static void filter_item(void *c, int i, int t)
{
    run_job *j = c;
    const onednn_plan *pl = j->pl;
    const mgt_conv2d_shape *sh = &pl->sh;
    single_threaded();
    size_t xs = (size_t)sh->c * sh->h * sh->w;
    size_t ys = (size_t)sh->k * mgt_conv2d_out_h(sh) * mgt_conv2d_out_w(sh);
    int c0 = (int)((long long)pl->chunks * i / pl->parts);
    int c1 = (int)((long long)pl->chunks * (i + 1) / pl->parts);
    float *acc = j->scratch + (size_t)i * pl->part_stride;
    dnnl_stream_t st = j->o->streams[t];
    bufs b = bufs_of(j, t);
    dnnl_status_t s = dnnl_success;
    for (int ch = c0; ch < c1 && s == dnnl_success; ch++) {
        size_t n0;
        const prim *p = chunk_prim(pl, ch, &n0);
        const void *ux = (const char *)j->op->u.conv.in2 + n0 * xs * (pl->x16 ? 2 : 4);
        const void *udy = (const char *)j->op->u.conv.in1 + n0 * ys * (pl->y16 ? 2 : 4);
        const void *ix = ux, *idy = udy;
        if (p->ra) {
            s = exec2(p, p->ra, st, t, mem_at(p, t, M_UA, ux), mem_at(p, t, M_IA, b.a), b.sp);
            ix = b.a;
        }
        if (s == dnnl_success && p->rb) {
            s = exec2(p, p->rb, st, t, mem_at(p, t, M_UB, udy), mem_at(p, t, M_IB, b.b), b.sp);
            idy = b.b;
        }
        float *dw = pl->w_blocked_sum && ch != c0 ? b.w2 : b.w;
        if (s == dnnl_success) {
            dnnl_exec_arg_t a[4] = {
                {DNNL_ARG_SRC, mem_at(p, t, M_IA, ix)},
                {DNNL_ARG_DIFF_DST, mem_at(p, t, M_IB, idy)},
                {DNNL_ARG_DIFF_WEIGHTS, mem_at(p, t, M_IW, dw)},
            };
            int n = 3;
            if (p->fsp)
                a[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, mem_at(p, t, M_SP, b.sp)};
            s = dnnl_primitive_execute(p->conv, st, n, a);
        }
        if (s == dnnl_success && pl->w_blocked_sum && ch != c0) {
            s = dnnl_stream_wait(st);
            float *restrict sum = b.w;
            const float *restrict next = b.w2;
            for (size_t e = 0; e < p->fw; e++)
                sum[e] += next[e];
        } else if (s == dnnl_success && !pl->w_blocked_sum) {
            s = exec2(p, ch == c0 ? p->w_out : p->w_acc, st, t, mem_at(p, t, M_IW, b.w),
                      mem_at(p, t, M_UW, acc), b.sp);
        }
    }
    if (s == dnnl_success && pl->w_blocked_sum && c1 > c0)
        s = exec2(&pl->full, pl->full.w_out, st, t, mem_at(&pl->full, t, M_IW, b.w),
                  mem_at(&pl->full, t, M_UW, acc), b.sp);
    if (s == dnnl_success)
        s = dnnl_stream_wait(st);
    note(j, s);
}

/* dW = beta dW + part 0 + part 1 + ..., in part order, over a range of elements. */
#define REDUCE_ITEM 16384
static void reduce_item(void *c, int i, int t)
{
    (void)t;
    run_job *j = c;
    const onednn_plan *pl = j->pl;
    size_t lo = (size_t)i * REDUCE_ITEM,
           hi = lo + REDUCE_ITEM < pl->dw_n ? lo + REDUCE_ITEM : pl->dw_n;
    float *dw = j->op->u.conv.out, beta = j->op->u.conv.beta;
    for (size_t e = lo; e < hi; e++) {
        float s = j->scratch[e];
        for (int p = 1; p < pl->parts; p++)
            s += j->scratch[(size_t)p * pl->part_stride + e];
        dw[e] = beta == 0.0f ? s : beta * dw[e] + s;
    }
}

mgt_status onednn_conv_run(onednn *o, onednn_plan *pl, cpu_pool *pool, const mgt_op *op,
                           float *scratch)
{
    run_job j = {.o = o, .pl = pl, .op = op, .scratch = scratch};
    atomic_init(&j.failed, dnnl_success);
    single_threaded();
    if (pl->kind == K_BWD_FILTER) {
        cpu_pool_for(pool, pl->parts, filter_item, &j);
        if (atomic_load(&j.failed) == dnnl_success)
            cpu_pool_for(pool, (int)((pl->dw_n + REDUCE_ITEM - 1) / REDUCE_ITEM), reduce_item, &j);
    } else {
        /* the weights once, on this thread, for the primitive(s) that want them blocked */
        const prim *ps[2] = {&pl->full, pl->last.mb ? &pl->last : NULL};
        bufs b = bufs_of(&j, 0);
        for (int i = 0; i < 2 && ps[i]; i++)
            if (ps[i]->rw)
                note(&j, exec2(ps[i], ps[i]->rw, o->streams[0], 0,
                               mem_at(ps[i], 0, M_UW, op->u.conv.in2),
                               mem_at(ps[i], 0, M_IW, scratch + ps[i]->w_off), b.sp));
        if (atomic_load(&j.failed) == dnnl_success)
            cpu_pool_for(pool, pl->chunks, data_item, &j);
    }
    int f = atomic_load(&j.failed);
    if (f != dnnl_success)
        return mgt_error_set(MGT_ERR_DEVICE, "%s: oneDNN failed: %s", mgt_op_name(op->kind),
                             dnnl_status2str((dnnl_status_t)f));
    return MGT_OK;
}
