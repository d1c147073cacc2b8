/* The CPU kernels of softmax cross-entropy (plain and mixed labels) and the top-k count. */
#include "device/cpu/vec.h"

static mgt_status check_labels(const mgt_op *op, const int32_t *labels, int n, int classes)
{
    for (int r = 0; r < n; r++)
        if (labels[r] < 0 || labels[r] >= classes)
            return mgt_error_set(MGT_ERR_DEVICE, "%s: label %d out of range [0, %d) at row %d",
                                 mgt_op_name(op->kind), (int)labels[r], classes, r);
    return MGT_OK;
}

typedef struct xent_job {
    const mgt_op *op;
    size_t units;
    double *row_loss;
} xent_job;

/* Per row in double: loss = lse - sum_j target_j * logit_j, target = (1-eps) (w onehot(a) +
   (1-w) onehot(b)) + eps/classes, that is lse - (1-eps)(w z_a + (1-w) z_b) - eps/classes sum z
   (w = 1, b = a without weights: w z_a + 0 z_a is z_a exactly); probs = exp(logit - lse). */
static void xent_fwd_item(void *c, int i, int t)
{
    (void)t;
    const xent_job *j = c;
    const mgt_xent_fwd_args *x = &j->op->u.xent_fwd;
    size_t classes = (size_t)x->classes, lo, hi;
    item_range((size_t)x->n, j->units, i, &lo, &hi);
    double eps = x->smoothing;
    for (size_t r = lo; r < hi; r++) {
        const float *l = x->logits + r * classes;
        float *pr = x->probs + r * classes;
        float mx = l[0];
        for (size_t e = 1; e < classes; e++)
            if (l[e] > mx)
                mx = l[e];
        double se = 0, sl = 0;
        for (size_t e = 0; e < classes; e++) {
            se += exp((double)l[e] - mx);
            sl += l[e];
        }
        double lse = mx + log(se), w = x->weights ? x->weights[r] : 1.0;
        for (size_t e = 0; e < classes; e++)
            pr[e] = (float)exp((double)l[e] - lse);
        int32_t a = x->labels[r], b = x->labels_b ? x->labels_b[r] : a;
        double mixed = w * l[a] + (1.0 - w) * l[b];
        j->row_loss[r] = lse - (1.0 - eps) * mixed - eps / (double)classes * sl;
    }
}

static mgt_status check_targets(const mgt_op *op, const int32_t *labels, const int32_t *labels_b,
                                int n, int classes)
{
    mgt_status st = check_labels(op, labels, n, classes);
    return st == MGT_OK && labels_b ? check_labels(op, labels_b, n, classes) : st;
}

mgt_status cpu_xent_fwd(cpu_ctx *ctx, const mgt_op *op)
{
    const mgt_xent_fwd_args *x = &op->u.xent_fwd;
    mgt_status st = check_targets(op, x->labels, x->labels_b, x->n, x->classes);
    if (st != MGT_OK)
        return st;
    if ((st = cpu_scratch_ensure(ctx, op, (size_t)x->n * 2)) != MGT_OK)
        return st;
    xent_job j = {op, units_per_item((size_t)x->classes * 4), (double *)(void *)ctx->scratch};
    cpu_pool_for(ctx->pool, items_of((size_t)x->n, j.units), xent_fwd_item, &j);
    double s = 0;
    for (int r = 0; r < x->n; r++)
        s += j.row_loss[r];
    x->loss[0] = (float)(s / x->n);
    return MGT_OK;
}

static void xent_bwd_item(void *c, int i, int t)
{
    (void)t;
    const plane_job *j = c;
    const mgt_xent_bwd_args *x = &j->op->u.xent_bwd;
    size_t classes = (size_t)x->classes, lo, hi;
    item_range((size_t)x->n, j->units, i, &lo, &hi);
    float off = x->smoothing / (float)x->classes, keep = 1.0f - x->smoothing;
    for (size_t r = lo; r < hi; r++) {
        const float *p = x->probs + r * classes;
        float *d = x->dlogits + r * classes;
        for (size_t e = 0; e < classes; e++)
            d[e] = x->scale * (p[e] - off);
        size_t a = (size_t)x->labels[r], b = x->labels_b ? (size_t)x->labels_b[r] : a;
        float w = x->weights ? x->weights[r] : 1.0f;
        /* a == b: the whole weight on one class */
        float ta = off + keep * (a == b ? 1.0f : w), tb = off + keep * (1.0f - w);
        d[a] = x->scale * (p[a] - ta);
        if (b != a)
            d[b] = x->scale * (p[b] - tb);
    }
}

mgt_status cpu_xent_bwd(cpu_ctx *ctx, const mgt_op *op)
{
    const mgt_xent_bwd_args *x = &op->u.xent_bwd;
    mgt_status st = check_targets(op, x->labels, x->labels_b, x->n, x->classes);
    if (st != MGT_OK)
        return st;
    plane_job j = {op, units_per_item((size_t)x->classes)};
    cpu_pool_for(ctx->pool, items_of((size_t)x->n, j.units), xent_bwd_item, &j);
    return MGT_OK;
}

typedef struct topk_job {
    const mgt_op *op;
    size_t units;
    atomic_int hits; /* an integer sum: the same whatever order threads add in */
} topk_job;

static void topk_item(void *c, int i, int t)
{
    (void)t;
    topk_job *j = c;
    const mgt_topk_args *k = &j->op->u.topk;
    size_t classes = (size_t)k->classes, lo, hi;
    item_range((size_t)k->n, j->units, i, &lo, &hi);
    int hits = 0;
    for (size_t r = lo; r < hi; r++) {
        const float *l = k->logits + r * classes;
        size_t lab = (size_t)k->labels[r];
        float v = l[lab];
        int rank = 0;
        for (size_t e = 0; e < classes; e++) /* NaN ranks first, as in torch.topk */
            rank += l[e] > v || (l[e] == v && e < lab) || isnan(l[e]);
        hits += rank < k->k && isfinite(v); /* a non-finite label logit is never correct */
    }
    atomic_fetch_add(&j->hits, hits);
}

mgt_status cpu_topk(cpu_ctx *ctx, const mgt_op *op)
{
    const mgt_topk_args *k = &op->u.topk;
    mgt_status st = check_labels(op, k->labels, k->n, k->classes);
    if (st != MGT_OK)
        return st;
    topk_job j = {.op = op, .units = units_per_item((size_t)k->classes)};
    atomic_init(&j.hits, 0);
    POOL_FOR(ctx, items_of((size_t)k->n, j.units), topk_item, &j);
    k->count[0] += atomic_load(&j.hits);
    return MGT_OK;
}
