/* The CPU kernels of the transformer ops: the general strided copy (permute), attention forward
   and backward (blocked over queries and keys with an online softmax, the products on oneDNN's
   sgemm), and the relative position bias's gather and segment sum.

   Attention never holds a group's whole score matrix: an item of the forward is one (group,
   head, block of QB queries), whose scores live in a QB x KB tile of its thread's scratch; keys
   past KB are taken block by block, the running maximum and sum rescaling what was already
   accumulated (the online softmax), and only each row's log-sum-exp is kept for backward. An
   item of the backward is one (group, head): it owns that head's dk and dv, recomputes each
   tile's probabilities from the saved log-sum-exp and writes dq, dk and dv in place through
   sgemm's strides. Which shapes take which path: every shape takes this one; tk <= KB (every
   Swin window, ViT up to 256 tokens) is one key block, so the online rescaling never runs. */
#include "device/cpu/onednn.h"
#include "device/cpu/vec.h"

/* ---- permute ---- */

typedef struct permute_job {
    const mgt_op *op;
    size_t rows;  /* positions of the outer dims (all but the last) */
    size_t units; /* rows per item */
} permute_job;

/* The offsets of outer position r (the last dim at 0) and each axis's raw index there. */
static void permute_row(const mgt_permute_shape *sh, size_t r, size_t *walk, long long *idx)
{
    *walk = 0;
    for (int a = 0; a < sh->naxes; a++)
        idx[a] = sh->shift[a];
    for (int d = sh->ndim - 2; d >= 0; d--) {
        size_t i = r % (size_t)sh->size[d];
        r /= (size_t)sh->size[d];
        *walk += i * sh->walk_stride[d];
        idx[sh->axis[d]] += (long long)i * sh->coef[d];
    }
}

static void permute_item(void *v, int item, int t)
{
    (void)t;
    const permute_job *j = v;
    const mgt_permute_args *a = &j->op->u.permute;
    const mgt_permute_shape *sh = &a->sh;
    int last = sh->ndim - 1, ax = sh->axis[last], n = sh->size[last], coef = sh->coef[last];
    int ext = sh->extent[ax], lim = sh->limit[ax];
    size_t ws = sh->walk_stride[last], gs = sh->grid_stride[ax];
    size_t lo, hi;
    item_range(j->rows, j->units, item, &lo, &hi);
    for (size_t r = lo; r < hi; r++) {
        size_t walk, grid = 0;
        long long idx[MGT_PERMUTE_DIMS];
        permute_row(sh, r, &walk, idx);
        bool there = true; /* every other axis's index (the last dim's axis: below) */
        for (int b = 0; b < sh->naxes; b++) {
            if (b == ax)
                continue;
            long long i = idx[b];
            if (sh->extent[b] > 0)
                i = ((i % sh->extent[b]) + sh->extent[b]) % sh->extent[b];
            there &= i < sh->limit[b];
            grid += (size_t)i * sh->grid_stride[b];
        }
        long long i = idx[ax];
        if (ext > 0)
            i = ((i % ext) + ext) % ext;
        float *w = a->walk + walk, *g = a->grid + grid;
        if (!there) {
            if (!sh->scatter)
                for (int k = 0; k < n; k++)
                    w[(size_t)k * ws] = 0.0f;
            continue;
        }
        /* runs of the last dim that are contiguous on both sides go as memcpy */
        for (int k = 0; k < n;) {
            int run = 1;
            if (coef == 1 && ws == 1 && gs == 1 && i < lim) {
                long long room = (ext > 0 ? (long long)ext : (long long)lim) - i;
                long long upto = lim - i < room ? lim - i : room;
                run = (int)(upto < n - k ? upto : n - k);
                if (sh->scatter)
                    memcpy(g + i, w + k, (size_t)run * sizeof(float));
                else
                    memcpy(w + k, g + i, (size_t)run * sizeof(float));
            } else if (i < lim) {
                if (sh->scatter)
                    g[(size_t)i * gs] = w[(size_t)k * ws];
                else
                    w[(size_t)k * ws] = g[(size_t)i * gs];
            } else if (!sh->scatter) {
                w[(size_t)k * ws] = 0.0f;
            }
            k += run;
            i += (long long)run * coef;
            while (ext > 0 && i >= ext)
                i -= ext;
        }
    }
}

mgt_status cpu_permute(cpu_ctx *ctx, const mgt_op *op)
{
    const mgt_permute_shape *sh = &op->u.permute.sh;
    size_t rows = 1;
    for (int d = 0; d < sh->ndim - 1; d++)
        rows *= (size_t)sh->size[d];
    permute_job j = {op, rows, units_per_item((size_t)sh->size[sh->ndim - 1])};
    POOL_FOR(ctx, items_of(rows, j.units), permute_item, &j);
    return MGT_OK;
}

/* ---- attention ---- */

#define QB 64  /* queries per tile */
#define KB 256 /* keys per tile */

typedef struct attn_job {
    const mgt_op *op;
    const mgt_attn_shape *sh;
    float *scratch;
    size_t per_thread;
    int qblocks;
    float *dsum;  /* backward with dbias: [batch, heads, tq, tk], every group's dlogits */
    double *dls;  /* backward, cosine: [batch, heads] partial sums of dlogit_scale */
    float drop;   /* 1 / (1 - p) */
    uint32_t thr; /* dropout's threshold */
} attn_job;

static void sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, size_t lda,
                  const float *b, size_t ldb, float beta, float *c, size_t ldc)
{
    onednn_sgemm(ta, tb, m, n, k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

static float attn_factor(const mgt_attn_shape *sh, const float *logit_scale, int h)
{
    if (!sh->cosine)
        return sh->scale;
    return sh->scale * (float)exp(fmin((double)logit_scale[h], log(100.0)));
}

/* Rows of dh floats at stride `row` copied to dst [rows, dh], each divided by max(|x|, 1e-12)
   (as a product with its reciprocal); norms (optional) gets those divisors. The norm is a float
   sum over four lanes, as F.normalize's is a float one. */
static void unit_rows(float *dst, const float *src, size_t row, int rows, int dh, float *norms)
{
    for (int r = 0; r < rows; r++) {
        const float *x = src + (size_t)r * row;
        float *d = dst + (size_t)r * dh;
        float n = sqrtf(v_dot(x, x, (size_t)dh));
        n = n > 1e-12f ? n : 1e-12f; /* NaN too, as fmax */
        float inv = 1.0f / n;
        int k = 0;
        for (; k + VW <= dh; k += VW)
            vst(d + k, vld(x + k) * inv);
        for (; k < dh; k++)
            d[k] = x[k] * inv;
        if (norms)
            norms[r] = n;
    }
}

/* The dropout factors of row t's keys [u0, u0 + n) of group b, head h (0 or 1 / (1 - p)). */
static void drop_row(const attn_job *j, int b, int h, int t, int u0, int n, float *f)
{
    const mgt_attn_shape *sh = j->sh;
    int gps = sh->groups_per_sample;
    uint64_t g = sh->key.sample0 + (uint64_t)(b / gps) * sh->key.sample_stride;
    uint64_t j0 = (((uint64_t)(b % gps) * (uint64_t)sh->heads + (uint64_t)h) * (uint64_t)sh->tq +
                   (uint64_t)t) *
                      (uint64_t)sh->tk +
                  (uint64_t)u0;
    uint32_t w[4];
    uint64_t have = UINT64_MAX;
    for (int u = 0; u < n; u++) {
        uint64_t e = j0 + (uint64_t)u;
        if (e / 4 != have) {
            have = e / 4;
            mgt_dropout_philox(&sh->key, g, (uint32_t)have, w);
        }
        f[u] = (w[e % 4] >> 8) >= j->thr ? j->drop : 0.0f;
    }
}

/* Where the bias's and the mask's rows for logit row (b, h, t) start at key u0 (NULL for
   either the op has not). */
static void bias_rows(const mgt_attn_shape *sh, const float *bias, const float *mask, int b, int h,
                      int t, int u0, const float **br, const float **mr)
{
    size_t tt = (size_t)sh->tq * sh->tk, at = (size_t)t * sh->tk + (size_t)u0;
    *br = bias ? bias + (size_t)h * tt + at : NULL;
    *mr = mask ? mask + (size_t)(b % sh->masks) * tt + at : NULL;
}

/* The sum over keys [u0, u0 + n) of row t of ds[u] times d logit / d logit_scale: the logit
   less what the bias and the mask added, over four float lanes. */
static double cosine_term(const attn_job *j, int b, int h, int t, int u0, const float *ds,
                          const float *logit, int n)
{
    const float *br, *mr;
    bias_rows(j->sh, j->op->u.attn_bwd.bias, j->op->u.attn_bwd.mask, b, h, t, u0, &br, &mr);
    vf acc = vdup(0.0f);
    int u = 0;
    for (; u + VW <= n; u += VW) {
        vf v = vdup(0.0f);
        if (br)
            v += vld(br + u);
        if (mr)
            v += vld(mr + u);
        acc += vld(ds + u) * (vld(logit + u) - v);
    }
    double s = ((double)acc[0] + acc[1]) + ((double)acc[2] + acc[3]);
    for (; u < n; u++) {
        float v = 0.0f;
        if (br)
            v += br[u];
        if (mr)
            v += mr[u];
        s += (double)ds[u] * (logit[u] - v);
    }
    return s;
}

/* The tile's logits: s [rows, kn] = f q k^T + bias + mask, for queries t0.. and keys u0.. */
static void attn_logits(const attn_job *j, int b, int h, int t0, int rows, int u0, int kn,
                        const float *q, size_t q_row, const float *k, size_t k_row, float *s)
{
    const mgt_attn_shape *sh = j->sh;
    const float *bias =
        j->op->kind == MGT_OP_ATTN_FWD ? j->op->u.attn_fwd.bias : j->op->u.attn_bwd.bias;
    const float *mask =
        j->op->kind == MGT_OP_ATTN_FWD ? j->op->u.attn_fwd.mask : j->op->u.attn_bwd.mask;
    const float *ls = j->op->kind == MGT_OP_ATTN_FWD ? j->op->u.attn_fwd.logit_scale
                                                     : j->op->u.attn_bwd.logit_scale;
    sgemm(false, true, rows, kn, sh->dh, attn_factor(sh, ls, h), q, q_row, k, k_row, 0.0f, s,
          (size_t)kn);
    for (int r = 0; r < rows; r++) {
        const float *br, *mr;
        bias_rows(sh, bias, mask, b, h, t0 + r, u0, &br, &mr);
        float *sr = s + (size_t)r * kn;
        if (br && mr) { /* both in one pass, in the same order as one at a time */
            for (int u = 0; u < kn; u++)
                sr[u] = (sr[u] + br[u]) + mr[u];
        } else if (br) {
            v_add_to(sr, br, (size_t)kn);
        } else if (mr) {
            v_add_to(sr, mr, (size_t)kn);
        }
    }
}

/* Per-thread scratch of the forward: the tile, the output accumulator, the row statistics,
   the unit q and k rows (cosine) and a row of dropout factors. */
static size_t attn_fwd_scratch(const mgt_attn_shape *sh)
{
    size_t kb = (size_t)(sh->tk < KB ? sh->tk : KB), dh = (size_t)sh->dh;
    return align_up(QB * kb) + align_up(QB * dh) + 2 * align_up(QB) + align_up(QB * dh) +
           align_up(kb * dh) + align_up(kb);
}

static void attn_fwd_item(void *v, int item, int t)
{
    const attn_job *j = v;
    const mgt_attn_fwd_args *a = &j->op->u.attn_fwd;
    const mgt_attn_shape *sh = j->sh;
    int qbi = item % j->qblocks, bh = item / j->qblocks, h = bh % sh->heads, b = bh / sh->heads;
    int t0 = qbi * QB, rows = sh->tq - t0 < QB ? sh->tq - t0 : QB, dh = sh->dh;
    int kbmax = sh->tk < KB ? sh->tk : KB;
    float *s = j->scratch + (size_t)t * j->per_thread;
    float *o = s + align_up((size_t)QB * kbmax), *m = o + align_up((size_t)QB * dh);
    float *l = m + align_up(QB), *qn = l + align_up(QB), *kn = qn + align_up((size_t)QB * dh);
    float *df = kn + align_up((size_t)kbmax * dh);
    const float *q = a->q + (size_t)b * sh->q_batch + (size_t)t0 * sh->q_row + (size_t)h * dh;
    size_t q_row = sh->q_row;
    if (sh->cosine) {
        unit_rows(qn, q, sh->q_row, rows, dh, NULL);
        q = qn;
        q_row = (size_t)dh;
    }
    for (int r = 0; r < rows; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    memset(o, 0, (size_t)rows * dh * sizeof *o);
    for (int u0 = 0; u0 < sh->tk; u0 += kbmax) {
        int kc = sh->tk - u0 < kbmax ? sh->tk - u0 : kbmax;
        const float *k = a->k + (size_t)b * sh->kv_batch + (size_t)u0 * sh->kv_row + (size_t)h * dh;
        const float *vv =
            a->v + (size_t)b * sh->kv_batch + (size_t)u0 * sh->kv_row + (size_t)h * dh;
        size_t k_row = sh->kv_row;
        if (sh->cosine) {
            unit_rows(kn, k, sh->kv_row, kc, dh, NULL);
            k = kn;
            k_row = (size_t)dh;
        }
        attn_logits(j, b, h, t0, rows, u0, kc, q, q_row, k, k_row, s);
        for (int r = 0; r < rows; r++) {
            float *sr = s + (size_t)r * kc, mx = cpu_max_above(sr, (size_t)kc, m[r]);
            /* a row of -inf logits (a full mask) keeps its sum 0 and a NaN output, as torch */
            float corr = m[r] == -INFINITY ? 0.0f : expf(m[r] - mx);
            float sum = cpu_exp_shift(sr, sr, mx, (size_t)kc);
            l[r] = l[r] * corr + sum;
            m[r] = mx;
            if (corr != 1.0f)
                v_scale(o + (size_t)r * dh, corr, (size_t)dh);
            if (sh->p > 0.0f) {
                drop_row(j, b, h, t0 + r, u0, kc, df);
                for (int u = 0; u < kc; u++)
                    sr[u] *= df[u];
            }
        }
        sgemm(false, false, rows, dh, kc, 1.0f, s, (size_t)kc, vv, sh->kv_row, 1.0f, o, (size_t)dh);
    }
    for (int r = 0; r < rows; r++) {
        float *y = a->y + (size_t)b * sh->y_batch + (size_t)(t0 + r) * sh->y_row + (size_t)h * dh;
        float inv = 1.0f / l[r];
        for (int d = 0; d < dh; d++)
            y[d] = o[(size_t)r * dh + d] * inv;
        a->lse[((size_t)b * sh->heads + h) * sh->tq + t0 + r] = m[r] + logf(l[r]);
    }
}

mgt_status cpu_attn_fwd(cpu_ctx *ctx, const mgt_op *op)
{
    const mgt_attn_shape *sh = &op->u.attn_fwd.sh;
    attn_job j = {.op = op,
                  .sh = sh,
                  .per_thread = attn_fwd_scratch(sh),
                  .qblocks = (int)ceil_div((size_t)sh->tq, QB),
                  .drop = 1.0f / (1.0f - sh->p),
                  .thr = mgt_dropout_threshold(sh->p)};
    mgt_status st = cpu_scratch_ensure(ctx, op, j.per_thread * (size_t)pool_threads(ctx));
    if (st != MGT_OK)
        return st;
    j.scratch = ctx->scratch;
    POOL_FOR(ctx, sh->batch * sh->heads * j.qblocks, attn_fwd_item, &j);
    return MGT_OK;
}

/* Per-thread scratch of the backward: the tile's probabilities and their gradient, the unit
   q rows and their norms, the unit k rows of the whole group and their norms, dq's unit
   gradient for a block, the rows' D, a row of dropout factors and a row of logits (cosine). */
static size_t attn_bwd_scratch(const mgt_attn_shape *sh)
{
    size_t kb = (size_t)(sh->tk < KB ? sh->tk : KB), dh = (size_t)sh->dh, tk = (size_t)sh->tk;
    return 2 * align_up(QB * kb) + align_up(QB * dh) + align_up(QB) + align_up(tk * dh) +
           align_up(tk) + align_up(QB * dh) + align_up(QB) + align_up(2 * kb);
}

/* Replaces the gradient g of unit rows xh (divisors n) by the gradient of the raw rows:
   (g - xh (xh . g)) / n, or g / 1e-12 where the norm was clamped (F.normalize's backward). */
static void unnormalize(float *g, size_t g_row, const float *xh, const float *n, int rows, int dh)
{
    for (int r = 0; r < rows; r++) {
        float *gr = g + (size_t)r * g_row;
        const float *xr = xh + (size_t)r * dh;
        if (n[r] <= 1e-12f) {
            v_scale(gr, 1.0f / 1e-12f, (size_t)dh);
            continue;
        }
        float dot = v_dot(xr, gr, (size_t)dh), inv = 1.0f / n[r];
        for (int d = 0; d < dh; d++)
            gr[d] = (gr[d] - xr[d] * dot) * inv;
    }
}

static void attn_bwd_item(void *v, int item, int t)
{
    const attn_job *j = v;
    const mgt_attn_bwd_args *a = &j->op->u.attn_bwd;
    const mgt_attn_shape *sh = j->sh;
    int h = item % sh->heads, b = item / sh->heads, dh = sh->dh, tk = sh->tk;
    int kbmax = tk < KB ? tk : KB;
    float *p = j->scratch + (size_t)t * j->per_thread, *dp = p + align_up((size_t)QB * kbmax);
    float *qn = dp + align_up((size_t)QB * kbmax), *qnorm = qn + align_up((size_t)QB * dh);
    float *kn = qnorm + align_up(QB), *knorm = kn + align_up((size_t)tk * dh);
    float *dqn = knorm + align_up((size_t)tk), *dd = dqn + align_up((size_t)QB * dh);
    float *df = dd + align_up(QB);
    const float *ls = a->logit_scale;
    float f = attn_factor(sh, ls, h);
    size_t kvo = (size_t)b * sh->kv_batch + (size_t)h * dh;
    const float *k = a->k + kvo, *vv = a->v + kvo;
    float *dk = a->dk + kvo, *dv = a->dv + kvo;
    size_t k_row = sh->kv_row;
    if (sh->cosine) {
        unit_rows(kn, k, sh->kv_row, tk, dh, knorm);
        k = kn;
        k_row = (size_t)dh;
    }
    double dls = 0.0;
    for (int t0 = 0; t0 < sh->tq; t0 += QB) {
        int rows = sh->tq - t0 < QB ? sh->tq - t0 : QB;
        size_t qo = (size_t)b * sh->q_batch + (size_t)t0 * sh->q_row + (size_t)h * dh;
        size_t yo = (size_t)b * sh->y_batch + (size_t)t0 * sh->y_row + (size_t)h * dh;
        const float *q = a->q + qo, *dy = a->dy + yo, *y = a->y + yo;
        const float *lse = a->lse + ((size_t)b * sh->heads + h) * sh->tq + t0;
        size_t q_row = sh->q_row;
        /* dq's unit gradient collects in dqn (cosine), or dq itself */
        float *dq = sh->cosine ? dqn : a->dq + qo;
        size_t dq_row = sh->cosine ? (size_t)dh : sh->q_row;
        if (sh->cosine) {
            unit_rows(qn, q, sh->q_row, rows, dh, qnorm);
            q = qn;
            q_row = (size_t)dh;
        }
        for (int r = 0; r < rows; r++)
            dd[r] = v_dot(dy + (size_t)r * sh->y_row, y + (size_t)r * sh->y_row, (size_t)dh);
        for (int u0 = 0; u0 < tk; u0 += kbmax) {
            int kc = tk - u0 < kbmax ? tk - u0 : kbmax;
            const float *ku = k + (size_t)u0 * k_row, *vu = vv + (size_t)u0 * sh->kv_row;
            attn_logits(j, b, h, t0, rows, u0, kc, q, q_row, ku, k_row, p);
            /* dp = dy v^T, before dropout's factors */
            sgemm(false, true, rows, kc, dh, 1.0f, dy, sh->y_row, vu, sh->kv_row, 0.0f, dp,
                  (size_t)kc);
            for (int r = 0; r < rows; r++) {
                float *pr = p + (size_t)r * kc, *dpr = dp + (size_t)r * kc;
                float *lg = j->dsum
                                ? j->dsum +
                                      (((size_t)b * sh->heads + h) * sh->tq + t0 + r) * (size_t)tk +
                                      (size_t)u0
                                : NULL;
                if (sh->p > 0.0f)
                    drop_row(j, b, h, t0 + r, u0, kc, df);
                /* the logits are still needed for cosine attention's logit scale */
                const float *lr = pr;
                if (sh->cosine) {
                    memcpy(df + kbmax, pr, (size_t)kc * sizeof(float));
                    lr = df + kbmax;
                }
                cpu_exp_shift(pr, pr, lse[r], (size_t)kc);
                float d = dd[r];
                if (sh->p == 0.0f) { /* a loop GCC vectorises */
                    for (int u = 0; u < kc; u++)
                        dpr[u] = pr[u] * (dpr[u] - d);
                } else {
                    for (int u = 0; u < kc; u++) {
                        float pu = pr[u];
                        dpr[u] = pu * (dpr[u] * df[u] - d);
                        pr[u] = pu * df[u]; /* the dropped probabilities, for dv */
                    }
                }
                if (sh->cosine) /* d logit / d logit_scale is f times the cosine */
                    dls += cosine_term(j, b, h, t0 + r, u0, dpr, lr, kc);
                if (lg)
                    memcpy(lg, dpr, (size_t)kc * sizeof *lg);
            }
            /* dv += p^T dy; dq (+)= f ds k; dk += f ds^T q */
            sgemm(true, false, kc, dh, rows, 1.0f, p, (size_t)kc, dy, sh->y_row,
                  t0 == 0 ? 0.0f : 1.0f, dv + (size_t)u0 * sh->kv_row, sh->kv_row);
            sgemm(false, false, rows, dh, kc, f, dp, (size_t)kc, ku, k_row, u0 == 0 ? 0.0f : 1.0f,
                  dq, dq_row);
            sgemm(true, false, kc, dh, rows, f, dp, (size_t)kc, q, q_row, t0 == 0 ? 0.0f : 1.0f,
                  dk + (size_t)u0 * sh->kv_row, sh->kv_row);
        }
        if (sh->cosine) {
            unnormalize(dqn, (size_t)dh, qn, qnorm, rows, dh);
            for (int r = 0; r < rows; r++)
                memcpy(a->dq + qo + (size_t)r * sh->q_row, dqn + (size_t)r * dh,
                       (size_t)dh * sizeof(float));
        }
    }
    if (sh->cosine) {
        unnormalize(dk, sh->kv_row, kn, knorm, tk, dh);
        j->dls[item] = dls;
    }
}

typedef struct dbias_job {
    const mgt_op *op;
    const float *dsum;
} dbias_job;

/* Elements of dbias per item: their running sums (doubles) stay in L1 while the groups'
   rows of dlogits stream past. */
#define DBIAS_ITEM 1024

/* dbias [heads, tq, tk] = the sum over groups of the dlogits, each element's in group order;
   groups outer, so each group's dlogits are read along their rows. */
static void dbias_item(void *v, int item, int t)
{
    (void)t;
    const dbias_job *j = v;
    const mgt_attn_shape *sh = &j->op->u.attn_bwd.sh;
    size_t per_group = (size_t)sh->heads * sh->tq * sh->tk, lo, hi;
    item_range(per_group, DBIAS_ITEM, item, &lo, &hi);
    double acc[DBIAS_ITEM];
    for (size_t e = lo; e < hi; e++)
        acc[e - lo] = 0.0;
    for (int b = 0; b < sh->batch; b++) {
        const float *d = j->dsum + (size_t)b * per_group;
        for (size_t e = lo; e < hi; e++)
            acc[e - lo] += d[e];
    }
    for (size_t e = lo; e < hi; e++)
        j->op->u.attn_bwd.dbias[e] = (float)acc[e - lo];
}

mgt_status cpu_attn_bwd(cpu_ctx *ctx, const mgt_op *op)
{
    const mgt_attn_bwd_args *a = &op->u.attn_bwd;
    const mgt_attn_shape *sh = &a->sh;
    attn_job j = {.op = op,
                  .sh = sh,
                  .per_thread = attn_bwd_scratch(sh),
                  .drop = 1.0f / (1.0f - sh->p),
                  .thr = mgt_dropout_threshold(sh->p)};
    size_t groups = (size_t)sh->batch * sh->heads;
    size_t dsum = a->dbias ? align_up(groups * sh->tq * sh->tk) : 0;
    size_t dls = sh->cosine ? align_up(2 * groups) : 0; /* doubles in pairs of floats */
    mgt_status st =
        cpu_scratch_ensure(ctx, op, j.per_thread * (size_t)pool_threads(ctx) + dsum + dls);
    if (st != MGT_OK)
        return st;
    j.scratch = ctx->scratch;
    float *extra = ctx->scratch + j.per_thread * (size_t)pool_threads(ctx);
    j.dsum = a->dbias ? extra : NULL;
    j.dls = sh->cosine ? (double *)(void *)(extra + dsum) : NULL;
    POOL_FOR(ctx, (int)groups, attn_bwd_item, &j);
    if (a->dbias) {
        dbias_job dj = {op, j.dsum};
        POOL_FOR(ctx, items_of((size_t)sh->heads * sh->tq * sh->tk, DBIAS_ITEM), dbias_item, &dj);
    }
    if (sh->cosine)
        for (int h = 0; h < sh->heads; h++) {
            if (!(a->logit_scale[h] <= (float)log(100.0)))
                continue;
            double s = 0.0;
            for (int b = 0; b < sh->batch; b++)
                s += j.dls[(size_t)b * sh->heads + h];
            a->dlogit_scale[h] += (float)s;
        }
    return MGT_OK;
}

/* ---- the relative position bias ---- */

mgt_status cpu_rpb_fwd(cpu_ctx *ctx, const mgt_op *op)
{
    (void)ctx;
    const mgt_rpb_fwd_args *a = &op->u.rpb_fwd;
    for (int i = 0; i < a->n; i++)
        if (a->index[i] < 0 || a->index[i] >= a->rows)
            return mgt_error_set(MGT_ERR_DEVICE, "%s: index %d out of range [0, %d) at %d",
                                 mgt_op_name(op->kind), (int)a->index[i], a->rows, i);
    for (int h = 0; h < a->heads; h++) {
        float *bias = a->bias + (size_t)h * a->n;
        for (int i = 0; i < a->n; i++)
            bias[i] = a->alpha * a->table[(size_t)a->index[i] * a->heads + h];
    }
    return MGT_OK;
}

mgt_status cpu_rpb_bwd(cpu_ctx *ctx, const mgt_op *op)
{
    (void)ctx;
    const mgt_rpb_bwd_args *a = &op->u.rpb_bwd;
    if (a->offsets[0] != 0 || a->offsets[a->rows] != a->n)
        return mgt_error_set(MGT_ERR_DEVICE, "%s: the inverse index does not cover %d positions",
                             mgt_op_name(op->kind), a->n);
    for (int r = 0; r < a->rows; r++) {
        int lo = a->offsets[r], hi = a->offsets[r + 1];
        if (hi < lo)
            return mgt_error_set(MGT_ERR_DEVICE, "%s: offsets decrease at row %d",
                                 mgt_op_name(op->kind), r);
        for (int h = 0; h < a->heads; h++) {
            const float *db = a->dbias + (size_t)h * a->n;
            double s = 0.0;
            for (int q = lo; q < hi; q++) {
                if (a->order[q] < 0 || a->order[q] >= a->n)
                    return mgt_error_set(MGT_ERR_DEVICE, "%s: position %d out of range [0, %d)",
                                         mgt_op_name(op->kind), (int)a->order[q], a->n);
                s += db[a->order[q]];
            }
            float *d = &a->dtable[(size_t)r * a->heads + h];
            *d = (float)(*d + (double)a->alpha * s);
        }
    }
    return MGT_OK;
}
