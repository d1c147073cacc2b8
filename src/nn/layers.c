/* The layer kinds: each a forward/backward pair over flat device arrays (the node's inputs,
   output, parameters and gradients, handed in by graph.c), their planning flags and their
   multiply-accumulate counts. Convolutions and linear layers each go through one forward and
   one backward function here, the places where a lower-precision path would cast. */
#include <assert.h>
#include <math.h>
#include <stddef.h>

#include "nn/model_impl.h"

static size_t out_count(const nn_call *c)
{
    return (size_t)c->n * nn_value_floats(&c->m->values[c->node->out]);
}

static uint64_t out_floats(const mgt_model *m, const nn_node *nd)
{
    return nn_value_floats(&m->values[nd->out]);
}

/* Bytes of `count` elements of the node's output as stored. */
static size_t out_bytes(const nn_call *c, size_t count)
{
    return count * (c->m->values[c->node->out].dtype == MGT_PREC_F32 ? sizeof(float) : 2);
}

/* ---- convolution ---- */

static mgt_conv2d_shape conv_shape(const nn_call *c)
{
    mgt_conv2d_shape sh = c->node->u.conv.sh;
    sh.n = c->n;
    return sh;
}

/* Under cfg.amp every product of a convolution or linear layer goes through the _lp kernels
   (the one place the precision is chosen); the activations between ops are stored as the plan
   chose (store_of), parameters and gradients stay fp32. */
static mgt_precision amp_of(const nn_call *c) { return c->m->cfg.amp; }
static int conv_out_hw(const nn_call *c)
{
    const nn_value *v = &c->m->values[c->node->out];
    return v->h * v->w;
}

/* The layout of the node's output as planned (the channel ops' layout argument). */
static mgt_layout out_layout(const nn_call *c) { return c->m->values[c->node->out].layout; }

static mgt_status conv_forward(nn_call *c)
{
    mgt_conv2d_shape sh = conv_shape(c);
    mgt_status st =
        mgt_conv2d_forward_st(c->s, amp_of(c), nn_store_of(c), c->y, c->x[0], c->p[0], &sh, 0.0f);
    /* the bias touches y only: its storage both ways, whatever x's (an op stores in one
       16-bit format or none; CUDA keeps a biased output fp32 after a 16-bit input) */
    mgt_store ys = {nn_store_of(c).out, nn_store_of(c).out};
    if (st == MGT_OK && c->node->u.conv.bias)
        st = mgt_channel_bias_forward_st(c->s, ys, c->y, c->p[1], c->n, sh.k, conv_out_hw(c),
                                         out_layout(c));
    return st;
}

/* The filter (and bias) gradients first, so the all-reduce can take them, then the input
   gradient. */
static mgt_status conv_backward(nn_call *c)
{
    mgt_conv2d_shape sh = conv_shape(c);
    mgt_precision amp = amp_of(c);
    mgt_status st = mgt_conv2d_backward_filter_st(c->s, amp, nn_store_of(c), c->g[0], c->dy,
                                                  c->x[0], &sh, 1.0f);
    mgt_store ys = {nn_store_of(c).out, nn_store_of(c).out}; /* dy only, as the forward's bias */
    if (st == MGT_OK && c->node->u.conv.bias)
        st = mgt_channel_bias_backward_st(c->s, ys, c->g[1], c->dy, c->n, sh.k, conv_out_hw(c),
                                          out_layout(c));
    if (st == MGT_OK)
        st = nn_params_ready(c);
    if (st == MGT_OK && c->dx[0])
        st = mgt_conv2d_backward_data_st(c->s, amp, nn_store_of(c), c->dx[0], c->dy, c->p[0], &sh,
                                         c->dx_beta[0]);
    return st;
}

static uint64_t conv_macs(const mgt_model *m, const nn_node *nd)
{
    const mgt_conv2d_shape *sh = &nd->u.conv.sh;
    return out_floats(m, nd) * (uint64_t)(sh->c / sh->groups) * (uint64_t)sh->r * (uint64_t)sh->s;
}

/* ---- batch norm ----
   The training forward is one device call today: batch statistics, normalisation and the
   running-statistics update. A synchronised BN splits exactly this function (statistics,
   an all-reduce of them through the trainer, then normalisation) and its backward
   (the two per-channel sums, their all-reduce, then dx); nothing outside these two changes. */

static mgt_bn_shape bn_shape(const nn_call *c)
{
    const nn_value *v = &c->m->values[c->node->out];
    return (mgt_bn_shape){.n = c->n,
                          .c = v->c,
                          .hw = v->h * v->w,
                          .eps = c->node->u.bn.eps,
                          .momentum = c->node->u.bn.momentum,
                          .layout = v->layout,
                          .relu = c->node->u.bn.relu};
}

static float *bn_save_mean(const nn_call *c) { return nn_act(c->m, c->node->u.bn.save_off); }

static float *bn_save_invstd(const nn_call *c)
{
    return nn_act(c->m, c->node->u.bn.save_off + c->node->u.bn.save_stride);
}

/* The training forward of a frozen BN: the evaluation forward, plus the saved mean and invstd
   that backward's parameter gradients read, taken from the running statistics (nothing is
   counted, nothing moves). invstd comes out of batchnorm_forward_eval run on one value per
   channel: gamma 1 times (1 - mean 0) times 1/sqrt(var + eps), plus beta 0 -- the same
   expression, rounded the same way, as the scale the forward itself applies. */
static mgt_status bn_forward_frozen(nn_call *c, const mgt_bn_shape *bsh)
{
    const mgt_model *m = c->m;
    const float *ones = nn_act(m, m->ones_off), *zeros = nn_act(m, m->zeros_off);
    const float *rmean = c->p[2], *rvar = c->p[3];
    mgt_bn_shape one = *bsh;
    one.n = 1;
    one.hw = 1;
    mgt_status st =
        mgt_batchnorm_forward_eval(c->s, c->y, c->x[0], c->p[0], c->p[1], rmean, rvar, bsh);
    if (st == MGT_OK)
        st = mgt_copy_d2d(c->s, bn_save_mean(c), rmean, (size_t)bsh->c * sizeof(float));
    if (st == MGT_OK)
        st = mgt_batchnorm_forward_eval(c->s, bn_save_invstd(c), ones, ones, zeros, zeros, rvar,
                                        &one);
    return st;
}

/* ---- synchronised batch norm (cfg.sync_bn with a hook) ----
   PyTorch's SyncBatchNorm: this shard's per-channel mean and biased variance with its count
   (bn_stats), gathered from every replica through the hook, merged on the host in replica
   order (Chan's pairwise update in double, which is batch_norm_gather_stats_with_counts's
   Welford merge), the running statistics moved with the unbiased variance of the whole
   batch, then y normalised with the merged statistics (batchnorm_forward_eval with them as
   its mean and variance). Backward: batchnorm_backward with the merged statistics gives this
   shard's sum(dy*xhat) and sum(dy) (its parameter gradients, added to g), their sums over
   the replicas in replica order, then bn_backward_elemt with every replica's count. Every
   replica does the same arithmetic on the same gathered numbers, so they stay identical. */
void mgt_bn_sync_merge(const double *all, int replicas, int channels, double eps, double momentum,
                       float *mean, float *var, float *invstd, float *running_mean,
                       float *running_var, double *count)
{
    size_t C = (size_t)channels, per = 1 + 2 * C;
    double total = 0;
    for (int r = 0; r < replicas; r++)
        total += all[(size_t)r * per];
    *count = total;
    for (size_t k = 0; k < C; k++) {
        double na = 0, mu = 0, m2 = 0;
        for (int r = 0; r < replicas; r++) {
            const double *a = all + (size_t)r * per;
            double nb = a[0], mb = a[1 + k], vb = a[1 + C + k];
            if (nb <= 0)
                continue;
            double tot = na + nb, d = mb - mu;
            mu += d * nb / tot;
            m2 += vb * nb + d * d * na * nb / tot;
            na = tot;
        }
        mean[k] = (float)mu;
        var[k] = (float)(m2 / na);
        /* from the float variance, as batchnorm_forward_eval normalises with it */
        invstd[k] = (float)(1.0 / sqrt((double)var[k] + eps));
        running_mean[k] = (float)((1.0 - momentum) * running_mean[k] + momentum * mu);
        running_var[k] = (float)((1.0 - momentum) * running_var[k] + momentum * m2 / (na - 1.0));
    }
}

static bool bn_synced(const nn_call *c)
{
    return c->m->cfg.sync_bn && !c->m->cfg.freeze_bn && c->m->bn_sync.gather;
}

static mgt_status bn_host_wait(nn_call *c)
{
    return mgt_stream_synchronize(c->s, c->m->bn_sync.abort);
}

static mgt_status bn_forward_synced(nn_call *c, const mgt_bn_shape *bsh)
{
    mgt_model *m = c->m;
    size_t C = (size_t)bsh->c, per = 1 + 2 * C;
    float *hf = m->bn_hf, *mean = bn_save_mean(c), *invstd = bn_save_invstd(c);
    mgt_status st = mgt_bn_stats(c->s, mean, invstd, c->x[0], bsh);
    if (st == MGT_OK)
        st = mgt_copy_d2h(c->s, hf, mean, C * sizeof(float));
    if (st == MGT_OK)
        st = mgt_copy_d2h(c->s, hf + C, invstd, C * sizeof(float));
    if (st == MGT_OK)
        st = mgt_copy_d2h(c->s, hf + 2 * C, c->p[2], C * sizeof(float));
    if (st == MGT_OK)
        st = mgt_copy_d2h(c->s, hf + 3 * C, c->p[3], C * sizeof(float));
    if (st == MGT_OK)
        st = bn_host_wait(c);
    if (st != MGT_OK)
        return st;
    double *mine = m->bn_mine, *all = m->bn_all;
    mine[0] = (double)bsh->n * bsh->hw;
    for (size_t k = 0; k < C; k++) {
        mine[1 + k] = hf[k];
        mine[1 + C + k] = hf[C + k];
    }
    st = m->bn_sync.gather(m->bn_sync.ctx, mine, all, per);
    if (st != MGT_OK)
        return st;
    mgt_bn_sync_merge(all, m->bn_sync.replicas, bsh->c, bsh->eps, bsh->momentum, hf, hf + C,
                      hf + 4 * C, hf + 2 * C, hf + 3 * C, &m->bn_sync_count[c->node->u.bn.counter]);
    st = mgt_copy_h2d(c->s, mean, hf, C * sizeof(float));
    if (st == MGT_OK)
        st = mgt_copy_h2d(c->s, invstd, hf + C, C * sizeof(float)); /* the variance, first */
    if (st == MGT_OK)
        st = mgt_copy_h2d(c->s, c->p[2], hf + 2 * C, C * sizeof(float));
    if (st == MGT_OK)
        st = mgt_copy_h2d(c->s, c->p[3], hf + 3 * C, C * sizeof(float));
    if (st == MGT_OK)
        st = mgt_batchnorm_forward_eval(c->s, c->y, c->x[0], c->p[0], c->p[1], mean, invstd, bsh);
    if (st == MGT_OK)
        st = bn_host_wait(c);
    if (st != MGT_OK)
        return st;
    st = mgt_copy_h2d(c->s, invstd, hf + 4 * C, C * sizeof(float));
    if (st == MGT_OK)
        st = bn_host_wait(c);
    return st;
}

static mgt_status bn_backward_synced(nn_call *c, const mgt_bn_shape *bsh)
{
    mgt_model *m = c->m;
    size_t C = (size_t)bsh->c;
    float *hf = m->bn_hf, *sums = nn_act(m, m->bnsync_off); /* sum(dy*xhat) then sum(dy) */
    mgt_status st = mgt_memset(c->s, sums, 0, 2 * C * sizeof(float));
    if (st == MGT_OK)
        st = mgt_batchnorm_backward(c->s, c->dx[0], sums, sums + C, c->dy, NULL, c->x[0], c->p[0],
                                    bn_save_mean(c), bn_save_invstd(c), bsh);
    if (st == MGT_OK)
        st = mgt_axpy(c->s, c->g[0], 1.0f, sums, C);
    if (st == MGT_OK)
        st = mgt_axpy(c->s, c->g[1], 1.0f, sums + C, C);
    if (st == MGT_OK)
        st = mgt_copy_d2h(c->s, hf, sums, 2 * C * sizeof(float));
    if (st == MGT_OK)
        st = bn_host_wait(c);
    if (st != MGT_OK)
        return st;
    double *mine = m->bn_mine, *all = m->bn_all;
    for (size_t k = 0; k < 2 * C; k++)
        mine[k] = hf[k];
    st = m->bn_sync.gather(m->bn_sync.ctx, mine, all, 2 * C);
    if (st != MGT_OK)
        return st;
    for (size_t k = 0; k < 2 * C; k++) {
        double sum = 0;
        for (int r = 0; r < m->bn_sync.replicas; r++)
            sum += all[(size_t)r * 2 * C + k];
        hf[k] = (float)sum;
    }
    st = mgt_copy_h2d(c->s, sums, hf, 2 * C * sizeof(float));
    if (st == MGT_OK)
        st = mgt_bn_backward_elemt(c->s, c->dx[0], c->dy, c->x[0], c->p[0], bn_save_mean(c),
                                   bn_save_invstd(c), sums + C, sums,
                                   m->bn_sync_count[c->node->u.bn.counter], bsh);
    if (st == MGT_OK)
        st = bn_host_wait(c);
    if (st == MGT_OK)
        st = nn_params_ready(c);
    return st;
}

static mgt_status bn_forward(nn_call *c)
{
    mgt_bn_shape bsh = bn_shape(c);
    if (c->train && c->m->cfg.freeze_bn)
        return bn_forward_frozen(c, &bsh);
    if (c->train) {
        c->m->bn_counts[c->node->u.bn.counter]++;
        if (bn_synced(c))
            return bn_forward_synced(c, &bsh);
        return mgt_batchnorm_forward_train_st(c->s, nn_store_of(c), c->y, bn_save_mean(c),
                                              bn_save_invstd(c), c->p[2], c->p[3], c->x[0], c->p[0],
                                              c->p[1], &bsh, c->z);
    }
    return mgt_batchnorm_forward_eval_st(c->s, nn_store_of(c), c->y, c->x[0], c->p[0], c->p[1],
                                         c->p[2], c->p[3], &bsh, c->z);
}

/* A frozen BN still goes through batchnorm_backward, which with the running statistics as
   the saved ones gives exactly its dgamma = sum dy*xhat and dbeta = sum dy; the
   batch-statistics dx it writes is then replaced by the frozen one, gamma * invstd * dy,
   which is batchnorm_forward_eval of dy with mean 0 and beta 0. */
static mgt_status bn_backward(nn_call *c)
{
    mgt_bn_shape bsh = bn_shape(c);
    if (!c->dx[0])
        return mgt_error_set(MGT_ERR_UNSUPPORTED,
                             "layer %s: a batch norm needs its input's "
                             "gradient",
                             c->node->name);
    assert(c->dx_beta[0] == 0.0f);
    if (bn_synced(c))
        return bn_backward_synced(c, &bsh);
    /* with a folded ReLU, y is its output (the ReLU runs in place over this BN's output); with
       a folded residual add, the masked dy is also the residual's gradient, in dy's slot */
    mgt_status st = mgt_batchnorm_backward_st(
        c->s, nn_store_of(c), c->dx[0], c->g[0], c->g[1], c->dy, bsh.relu ? c->y : NULL, c->x[0],
        c->p[0], bn_save_mean(c), bn_save_invstd(c), &bsh, c->z ? (float *)c->dy : NULL);
    if (st == MGT_OK && c->m->cfg.freeze_bn) {
        const float *zeros = nn_act(c->m, c->m->zeros_off);
        st =
            mgt_batchnorm_forward_eval(c->s, c->dx[0], c->dy, c->p[0], zeros, zeros, c->p[3], &bsh);
    }
    if (st == MGT_OK)
        st = nn_params_ready(c);
    return st;
}

static uint64_t bn_macs(const mgt_model *m, const nn_node *nd) { return 2 * out_floats(m, nd); }

/* ---- elementwise ---- */

/* A folded ReLU (plan_fusion) has run inside its batch norm, in place: its output is that
   BN's, and its input gradient shares its output gradient's slot, which the BN masks. */
static mgt_status relu_forward(nn_call *c)
{
    if (c->node->folded)
        return MGT_OK;
    return mgt_relu_forward_st(c->s, nn_store_of(c), c->y, c->x[0], out_count(c));
}

static mgt_status relu_backward(nn_call *c)
{
    assert(c->dx_beta[0] == 0.0f);
    if (c->node->folded)
        return MGT_OK;
    return mgt_relu_backward_st(c->s, nn_store_of(c), c->dx[0], c->dy, c->y, out_count(c));
}

/* A folded add (plan_fusion) has run inside the batch norm before it, with the ReLU after. */
static mgt_status add_forward(nn_call *c)
{
    if (c->node->folded)
        return MGT_OK;
    return mgt_add_st(c->s, nn_store_of(c), c->y, c->x[0], c->x[1], out_count(c));
}

/* Training: the mask of the model's key for this layer's stream; evaluation: the identity
   (nothing to do in place). Backward is the same mask on dy. */
static mgt_status dropout_run(nn_call *c, float *y, const float *x)
{
    const nn_node *nd = c->node;
    mgt_dropout_key k = c->m->drop_key;
    k.stream = nd->u.dropout.stream;
    const nn_value *v = &c->m->values[nd->out];
    return mgt_dropout_st(c->s, nn_store_of(c), y, x, c->n, nn_value_floats(v), nd->u.dropout.p, &k,
                          v->c, v->layout);
}

static mgt_status dropout_forward(nn_call *c)
{
    if (c->train && c->node->u.dropout.p > 0.0f)
        return dropout_run(c, c->y, c->x[0]);
    if (c->y == c->x[0])
        return MGT_OK;
    return mgt_copy_d2d(c->s, c->y, c->x[0], out_bytes(c, out_count(c)));
}

static mgt_status dropout_backward(nn_call *c)
{
    assert(c->dx_beta[0] == 0.0f);
    if (c->node->u.dropout.p > 0.0f)
        return dropout_run(c, c->dx[0], c->dy);
    if (c->dx[0] == c->dy)
        return MGT_OK;
    return mgt_copy_d2d(c->s, c->dx[0], c->dy, out_bytes(c, out_count(c)));
}

/* ---- concatenation ----
   Each input is copied into its channel slice of the output, one strided copy per input (not
   per image); backward copies the slices of dy back out. Channels last (NHWC, CUDA under
   --amp: the node's operands share one layout), the slice is a run of channels at every
   pixel. */

static bool nhwc(const nn_call *c) { return c->m->values[c->node->out].layout == MGT_LAYOUT_NHWC; }

static mgt_strided_copy_shape concat_slice(const nn_call *c, int j, size_t *off)
{
    const mgt_model *m = c->m;
    const nn_node *nd = c->node;
    size_t plane = (size_t)m->values[nd->out].h * m->values[nd->out].w;
    size_t c0 = 0, cj = (size_t)m->values[nd->in[j]].c, cs = (size_t)m->values[nd->out].c;
    for (int i = 0; i < j; i++)
        c0 += (size_t)m->values[nd->in[i]].c;
    size_t part = cj * plane;
    size_t whole = nn_value_floats(&m->values[nd->out]);
    if (nhwc(c)) {
        *off = c0;
        return (mgt_strided_copy_shape){.n = c->n,
                                        .rows = (int)plane,
                                        .count = cj,
                                        .y_stride = whole,
                                        .y_row = cs,
                                        .x_stride = part,
                                        .x_row = cj};
    }
    *off = c0 * plane;
    return (mgt_strided_copy_shape){.n = c->n,
                                    .rows = 1,
                                    .count = part,
                                    .y_stride = whole,
                                    .y_row = part,
                                    .x_stride = part,
                                    .x_row = part};
}

static mgt_status concat_forward(nn_call *c)
{
    mgt_status st = MGT_OK;
    for (int j = 0; j < c->node->n_in && st == MGT_OK; j++) {
        size_t off;
        mgt_strided_copy_shape sh = concat_slice(c, j, &off);
        st = mgt_strided_copy_st(c->s, nn_store_of(c), nn_act_at(c->y, nn_store_of(c).out, off),
                                 c->x[j], &sh);
    }
    return st;
}

static mgt_status concat_backward(nn_call *c)
{
    mgt_status st = MGT_OK;
    for (int j = 0; j < c->node->n_in && st == MGT_OK; j++) {
        if (!c->dx[j])
            continue;
        assert(c->dx_beta[j] == 0.0f);
        size_t off;
        mgt_strided_copy_shape sh = concat_slice(c, j, &off);
        size_t t = sh.x_stride, r = sh.x_row;
        sh.x_stride = sh.y_stride;
        sh.y_stride = t;
        sh.x_row = sh.y_row; /* NHWC: the rows differ too */
        sh.y_row = r;
        mgt_store gs = {nn_store_of(c).out,
                        nn_store_of(c).out}; /* dy's slices into dx, one storage */
        st = mgt_strided_copy_st(c->s, gs, c->dx[j], nn_act_at(c->dy, gs.in, off), &sh);
    }
    return st;
}

/* ---- channel slices and shuffles ----
   A slice is one strided copy of its channels; its backward zeroes dx and copies dy into the
   slice (the kind does not add onto dx: the planner gives a second reader a temporary). The
   shuffle of n inputs puts input i's channel j at output channel j * n + i: one strided copy
   per input (rows = its channels), and backward the same copies the other way. */

static mgt_strided_copy_shape slice_shape(const nn_call *c, size_t *off)
{
    const mgt_model *m = c->m;
    const nn_value *x = &m->values[c->node->in[0]], *y = &m->values[c->node->out];
    size_t plane = (size_t)x->h * x->w, part = (size_t)y->c * plane;
    if (nhwc(c)) { /* channels [c0, c0 + c) of every pixel */
        *off = (size_t)c->node->u.slice_c0;
        return (mgt_strided_copy_shape){.n = c->n,
                                        .rows = (int)plane,
                                        .count = (size_t)y->c,
                                        .y_stride = part,
                                        .y_row = (size_t)y->c,
                                        .x_stride = nn_value_floats(x),
                                        .x_row = (size_t)x->c};
    }
    *off = (size_t)c->node->u.slice_c0 * plane;
    return (mgt_strided_copy_shape){.n = c->n,
                                    .rows = 1,
                                    .count = part,
                                    .y_stride = part,
                                    .y_row = part,
                                    .x_stride = nn_value_floats(x),
                                    .x_row = part};
}

static mgt_status slice_forward(nn_call *c)
{
    size_t off;
    mgt_strided_copy_shape sh = slice_shape(c, &off);
    return mgt_strided_copy_st(c->s, nn_store_of(c), c->y,
                               nn_act_at(c->x[0], nn_store_of(c).in, off), &sh);
}

static mgt_status slice_backward(nn_call *c)
{
    if (!c->dx[0])
        return MGT_OK;
    assert(c->dx_beta[0] == 0.0f);
    size_t off;
    mgt_strided_copy_shape sh = slice_shape(c, &off);
    size_t whole = sh.x_stride, whole_row = sh.x_row;
    mgt_store gs = nn_store_of(c); /* dx as x, dy as y: one storage */
    size_t es = gs.in == MGT_PREC_F32 ? sizeof(float) : 2;
    mgt_status st = mgt_memset(c->s, c->dx[0], 0, (size_t)c->n * whole * es); /* 0 is +0 */
    sh.x_stride = sh.y_stride;
    sh.y_stride = whole;
    sh.x_row = sh.y_row; /* NHWC: the rows differ too */
    sh.y_row = whole_row;
    return st != MGT_OK
               ? st
               : mgt_strided_copy_st(c->s, gs, nn_act_at(c->dx[0], gs.in, off), c->dy, &sh);
}

static mgt_strided_copy_shape shuffle_part(const nn_call *c, int j, size_t *off)
{
    const mgt_model *m = c->m;
    const nn_node *nd = c->node;
    const nn_value *x = &m->values[nd->in[0]];
    size_t plane = (size_t)x->h * x->w;
    if (nhwc(c)) { /* input j's channel i at output channel i * n_in + j, every pixel: the
                      output's channels are n_in x x->c, so element r = p * x->c + i of x
                      lands at r * n_in + j */
        *off = (size_t)j;
        return (mgt_strided_copy_shape){.n = c->n,
                                        .rows = (int)(plane * (size_t)x->c),
                                        .count = 1,
                                        .y_stride = nn_value_floats(&m->values[nd->out]),
                                        .y_row = (size_t)nd->n_in,
                                        .x_stride = nn_value_floats(x),
                                        .x_row = 1};
    }
    *off = (size_t)j * plane;
    return (mgt_strided_copy_shape){.n = c->n,
                                    .rows = x->c,
                                    .count = plane,
                                    .y_stride = nn_value_floats(&m->values[nd->out]),
                                    .y_row = (size_t)nd->n_in * plane,
                                    .x_stride = nn_value_floats(x),
                                    .x_row = plane};
}

static mgt_status shuffle_forward(nn_call *c)
{
    mgt_status st = MGT_OK;
    for (int j = 0; j < c->node->n_in && st == MGT_OK; j++) {
        size_t off;
        mgt_strided_copy_shape sh = shuffle_part(c, j, &off);
        st = mgt_strided_copy_st(c->s, nn_store_of(c), nn_act_at(c->y, nn_store_of(c).out, off),
                                 c->x[j], &sh);
    }
    return st;
}

static mgt_status shuffle_backward(nn_call *c)
{
    mgt_status st = MGT_OK;
    for (int j = 0; j < c->node->n_in && st == MGT_OK; j++) {
        if (!c->dx[j])
            continue;
        assert(c->dx_beta[j] == 0.0f);
        size_t off;
        mgt_strided_copy_shape sh = shuffle_part(c, j, &off);
        size_t t = sh.x_stride, r = sh.x_row;
        sh.x_stride = sh.y_stride;
        sh.x_row = sh.y_row;
        sh.y_stride = t;
        sh.y_row = r;
        mgt_store gs = {nn_store_of(c).out, nn_store_of(c).out};
        st = mgt_strided_copy_st(c->s, gs, c->dx[j], nn_act_at(c->dy, gs.in, off), &sh);
    }
    return st;
}

/* ---- pooling ---- */

static mgt_pool2d_shape pool_shape(const nn_call *c)
{
    mgt_pool2d_shape sh = c->node->u.pool;
    sh.n = c->n;
    sh.layout = c->m->values[c->node->out].layout; /* its input's too (plan_layouts) */
    return sh;
}

static mgt_status maxpool_forward(nn_call *c)
{
    mgt_pool2d_shape sh = pool_shape(c);
    return mgt_maxpool2d_forward_st(c->s, nn_store_of(c), c->y, c->x[0], &sh);
}

static mgt_status maxpool_backward(nn_call *c)
{
    mgt_pool2d_shape sh = pool_shape(c);
    assert(c->dx_beta[0] == 0.0f);
    return mgt_maxpool2d_backward_st(c->s, nn_store_of(c), c->dx[0], c->dy, c->x[0], c->y, &sh);
}

static const nn_value *gap_in(const nn_call *c) { return &c->m->values[c->node->in[0]]; }

static mgt_status gap_forward(nn_call *c)
{
    const nn_value *v = gap_in(c);
    return mgt_avgpool_forward_st(c->s, nn_store_of(c), c->y, c->x[0], c->n, v->c, v->h * v->w,
                                  v->layout);
}

static mgt_status gap_backward(nn_call *c)
{
    const nn_value *v = gap_in(c);
    assert(c->dx_beta[0] == 0.0f);
    return mgt_avgpool_backward_st(c->s, nn_store_of(c), c->dx[0], c->dy, c->n, v->c, v->h * v->w,
                                   v->layout);
}

static mgt_status apool_forward(nn_call *c)
{
    const nn_value *v = &c->m->values[c->node->in[0]];
    return mgt_adaptive_avgpool_forward_st(c->s, nn_store_of(c), c->y, c->x[0], c->n, v->c, v->h,
                                           v->w, c->node->u.apool.oh, c->node->u.apool.ow,
                                           v->layout);
}

static mgt_status apool_backward(nn_call *c)
{
    const nn_value *v = &c->m->values[c->node->in[0]];
    assert(c->dx_beta[0] == 0.0f);
    return mgt_adaptive_avgpool_backward_st(c->s, nn_store_of(c), c->dx[0], c->dy, c->n, v->c, v->h,
                                            v->w, c->node->u.apool.oh, c->node->u.apool.ow,
                                            v->layout);
}

/* THOP's adaptive average pool: (kernel + 1) per output, the kernel being the largest window
   (torch's ceil(h / oh) x ceil(w / ow)) */
static uint64_t apool_macs(const mgt_model *m, const nn_node *nd)
{
    const nn_value *v = &m->values[nd->in[0]];
    uint64_t kh = (uint64_t)(v->h + nd->u.apool.oh - 1) / (uint64_t)nd->u.apool.oh;
    uint64_t kw = (uint64_t)(v->w + nd->u.apool.ow - 1) / (uint64_t)nd->u.apool.ow;
    return out_floats(m, nd) * (kh * kw + 1);
}

/* THOP's adaptive average pool: (kernel + 1) per output, the kernel being the whole plane */
static uint64_t gap_macs(const mgt_model *m, const nn_node *nd)
{
    const nn_value *v = &m->values[nd->in[0]];
    return (uint64_t)v->c * ((uint64_t)v->h * v->w + 1);
}

/* ---- linear ---- */

/* The layer's gemm calls: fp32, or the _lp arithmetic under cfg.amp; the operands that are
   the node's input (x, dx) or output (y, dy) stored as the plan stored them (a16 etc.: 'x',
   'y' or 0 for a parameter, its gradient or a const). */
static mgt_status linear_gemm(nn_call *c, bool ta, bool tb, int m, int n, int k, float alpha,
                              const float *a, char a_is, int lda, const float *b, char b_is,
                              int ldb, float beta, float *out, char c_is, int ldc)
{
    mgt_store st = nn_store_of(c);
    mgt_precision fmt = st.in != MGT_PREC_F32 ? st.in : st.out;
#define IS16(w) ((w) == 'x' ? st.in != MGT_PREC_F32 : (w) == 'y' ? st.out != MGT_PREC_F32 : false)
    mgt_gemm_store gs = {fmt, IS16(a_is), IS16(b_is), IS16(c_is)};
#undef IS16
    return mgt_gemm_st(c->s, amp_of(c), gs, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, out, ldc);
}

/* The rows of a call: one per image for a classifier, every token of every image for a
   token linear (the gemm runs on [tokens, features] as they lie: no copies). */
static int linear_rows(const nn_call *c) { return c->n * c->node->u.linear.rows; }

/* The bias ops touch y (dy) only: the output's storage both ways. */
static mgt_store linear_ys(const nn_call *c)
{
    return (mgt_store){nn_store_of(c).out, nn_store_of(c).out};
}

/* y [rows,out] = x [rows,in] . W [out,in]^T + b */
static mgt_status linear_forward(nn_call *c)
{
    int in = c->node->u.linear.in, out = c->node->u.linear.out, rows = linear_rows(c);
    mgt_status st = linear_gemm(c, false, true, rows, out, in, 1.0f, c->x[0], 'x', in, c->p[0], 0,
                                in, 0.0f, c->y, 'y', out);
    if (st == MGT_OK && c->node->u.linear.zero_mid_bias) {
        /* y[:, part] += ones [rows, 1] . bias[part] for the first and last thirds */
        const float *ones = nn_const_ptr(c->m, c->node->u.linear.ones);
        int third = out / 3;
        for (int k = 0; k < 3 && st == MGT_OK; k += 2) {
            float *yk = nn_act_at(c->y, nn_store_of(c).out, (size_t)k * third);
            st = mgt_gemm_st(
                c->s, MGT_PREC_F32, (mgt_gemm_store){nn_store_of(c).out, false, false, true}, false,
                false, rows, third, 1, 1.0f, ones, 1, c->p[1] + k * third, third, 1.0f, yk, out);
        }
    } else if (st == MGT_OK && c->node->u.linear.bias) {
        st = mgt_bias_forward_st(c->s, linear_ys(c), c->y, c->p[1], rows, out);
    }
    return st;
}

/* dW [out,in] += dy^T [out,rows] . x [rows,in]; db += column sums; dx = dy . W */
static mgt_status linear_backward(nn_call *c)
{
    int in = c->node->u.linear.in, out = c->node->u.linear.out, rows = linear_rows(c);
    mgt_status st = linear_gemm(c, true, false, out, in, rows, 1.0f, c->dy, 'y', out, c->x[0], 'x',
                                in, 1.0f, c->g[0], 0, in);
    if (st == MGT_OK && c->node->u.linear.zero_mid_bias) {
        /* dbias[part] += ones [1, rows] . dy[:, part]; the middle third gets none */
        const float *ones = nn_const_ptr(c->m, c->node->u.linear.ones);
        int third = out / 3;
        for (int k = 0; k < 3 && st == MGT_OK; k += 2) {
            const float *dyk = nn_act_at(c->dy, nn_store_of(c).out, (size_t)k * third);
            st = mgt_gemm_st(c->s, MGT_PREC_F32,
                             (mgt_gemm_store){nn_store_of(c).out, false, true, false}, false, false,
                             1, third, rows, 1.0f, ones, rows, dyk, out, 1.0f, c->g[1] + k * third,
                             third);
        }
    } else if (st == MGT_OK && c->node->u.linear.bias) {
        st = mgt_bias_backward_st(c->s, linear_ys(c), c->g[1], c->dy, rows, out);
    }
    if (st == MGT_OK)
        st = nn_params_ready(c);
    if (st == MGT_OK && c->dx[0])
        st = linear_gemm(c, false, false, rows, in, out, 1.0f, c->dy, 'y', out, c->p[0], 0, in,
                         c->dx_beta[0], c->dx[0], 'x', in);
    return st;
}

static uint64_t linear_macs(const mgt_model *m, const nn_node *nd)
{
    (void)m;
    return (uint64_t)nd->u.linear.rows * (uint64_t)nd->u.linear.in * (uint64_t)nd->u.linear.out;
}

/* ---- activations, squeeze-excite scaling ---- */

static mgt_status act_forward(nn_call *c)
{
    return mgt_activation_forward_st(c->s, nn_store_of(c), c->y, c->x[0], out_count(c),
                                     c->node->u.act);
}

static mgt_status act_backward(nn_call *c)
{
    assert(c->dx_beta[0] == 0.0f);
    return mgt_activation_backward_st(c->s, nn_store_of(c), c->dx[0], c->dy, c->x[0], out_count(c),
                                      c->node->u.act);
}

static mgt_status scale_forward(nn_call *c)
{
    const nn_value *v = &c->m->values[c->node->out];
    return mgt_channel_scale_forward_st(c->s, nn_store_of(c), c->y, c->x[0], c->x[1], c->n, v->c,
                                        v->h * v->w, false, v->layout);
}

/* dx = dy * s and ds = sum over the plane of dy * x; the feature map always needs its
   gradient (a convolution's output), the gate's is skipped where nothing before it learns. */
static mgt_status scale_backward(nn_call *c)
{
    const nn_value *v = &c->m->values[c->node->out];
    if (!c->dx[0])
        return mgt_error_set(MGT_ERR_UNSUPPORTED,
                             "layer %s: a channel scale needs its input's gradient", c->node->name);
    assert(c->dx_beta[0] == 0.0f && c->dx_beta[1] == 0.0f);
    return mgt_channel_scale_backward_st(c->s, nn_store_of(c), c->dx[0], c->dx[1], c->dy, c->x[0],
                                         c->x[1], c->n, v->c, v->h * v->w, false, v->layout);
}

/* ---- stochastic depth ----
   torchvision's row mode: each image's residual branch is kept with probability 1 - p and
   then scaled by 1 / (1 - p). The per-image factors are dropout's mask over a vector of ones
   (one element per image, so keyed by the global sample index as dropout is: the same on
   any device count), kept for backward; the branch is scaled by them as c = 1 planes. */

static bool sdepth_active(const nn_call *c) { return c->node->u.sdepth.p > 0.0f; }

static mgt_status sdepth_forward(nn_call *c)
{
    const nn_node *nd = c->node;
    int floats = (int)nn_value_floats(&c->m->values[nd->out]);
    if (!c->train || !sdepth_active(c)) {
        if (c->y == c->x[0])
            return MGT_OK;
        return mgt_copy_d2d(c->s, c->y, c->x[0], out_bytes(c, out_count(c)));
    }
    float *mask = nn_act(c->m, nd->u.sdepth.mask_off);
    mgt_dropout_key k = c->m->drop_key;
    k.stream = nd->u.sdepth.stream;
    mgt_status st = mgt_fill(c->s, mask, 1.0f, (size_t)c->n);
    if (st == MGT_OK)
        st = mgt_dropout(c->s, mask, mask, c->n, 1, nd->u.sdepth.p, &k);
    if (st == MGT_OK)
        st =
            mgt_channel_scale_forward_st(c->s, nn_store_of(c), c->y, c->x[0], mask, c->n, 1, floats,
                                         false, MGT_LAYOUT_NCHW); /* one channel: any layout */
    return st;
}

static mgt_status sdepth_backward(nn_call *c)
{
    const nn_node *nd = c->node;
    assert(c->dx_beta[0] == 0.0f);
    if (!sdepth_active(c)) {
        if (c->dx[0] == c->dy)
            return MGT_OK;
        return mgt_copy_d2d(c->s, c->dx[0], c->dy, out_bytes(c, out_count(c)));
    }
    int floats = (int)nn_value_floats(&c->m->values[nd->out]);
    return mgt_channel_scale_backward_st(c->s, nn_store_of(c), c->dx[0], NULL, c->dy, NULL,
                                         nn_act(c->m, nd->u.sdepth.mask_off), c->n, 1, floats,
                                         false, MGT_LAYOUT_NCHW);
}

/* ---- layer norm over channels ---- */

static mgt_status ln2d_forward(nn_call *c)
{
    const nn_value *v = &c->m->values[c->node->out];
    return mgt_layernorm_channels_forward_st(c->s, nn_store_of(c), c->y, c->x[0], c->p[0], c->p[1],
                                             c->n, v->c, v->h * v->w, c->node->u.ln_eps, v->layout);
}

static mgt_status ln2d_backward(nn_call *c)
{
    const nn_value *v = &c->m->values[c->node->out];
    if (!c->dx[0])
        return mgt_error_set(MGT_ERR_UNSUPPORTED,
                             "layer %s: a layer norm needs its input's gradient", c->node->name);
    assert(c->dx_beta[0] == 0.0f);
    mgt_status st = mgt_layernorm_channels_backward_st(c->s, nn_store_of(c), c->dx[0], c->g[0],
                                                       c->g[1], c->dy, c->x[0], c->p[0], c->n, v->c,
                                                       v->h * v->w, c->node->u.ln_eps, v->layout);
    if (st == MGT_OK)
        st = nn_params_ready(c);
    return st;
}

/* ---- layer scale: the channel scale ops with one shared [c] vector ---- */

static mgt_status lscale_forward(nn_call *c)
{
    const nn_value *v = &c->m->values[c->node->out];
    return mgt_channel_scale_forward_st(c->s, nn_store_of(c), c->y, c->x[0], c->p[0], c->n, v->c,
                                        v->h * v->w, true, v->layout);
}

static mgt_status lscale_backward(nn_call *c)
{
    const nn_value *v = &c->m->values[c->node->out];
    if (!c->dx[0])
        return mgt_error_set(MGT_ERR_UNSUPPORTED,
                             "layer %s: a layer scale needs its input's gradient", c->node->name);
    assert(c->dx_beta[0] == 0.0f);
    mgt_status st =
        mgt_channel_scale_backward_st(c->s, nn_store_of(c), c->dx[0], c->g[0], c->dy, c->x[0],
                                      c->p[0], c->n, v->c, v->h * v->w, true, v->layout);
    if (st == MGT_OK)
        st = nn_params_ready(c);
    return st;
}

/* ---- depthwise convolutions with constant weights: avg_pool2d and transform_input ----
   The weights (and the affine map's bias) sit in the node's region of the activation arena,
   written at each forward (a few floats per channel) so that nothing that writes the arena
   can leave them stale; the fp32 convolution always: pooling and an input map are not among
   autocast's lower-precision ops. */

static mgt_conv2d_shape fixed_shape(const nn_call *c)
{
    mgt_conv2d_shape sh = c->node->u.fixed.sh;
    sh.n = c->n;
    return sh;
}

static float *fixed_weights(const nn_call *c) { return nn_act(c->m, c->node->u.fixed.w_off); }

static mgt_status fixed_forward(nn_call *c)
{
    const nn_node *nd = c->node;
    mgt_conv2d_shape sh = fixed_shape(c);
    float *w = fixed_weights(c), *b = w + (size_t)sh.c * sh.r * sh.s;
    mgt_status st = MGT_OK;
    if (nd->kind == NN_AVGPOOL2D)
        st = mgt_fill(c->s, w, nd->u.fixed.tap, (size_t)sh.c * sh.r * sh.s);
    for (int ch = 0; ch < sh.c && nd->kind == NN_AFFINE && st == MGT_OK; ch++) {
        st = mgt_fill(c->s, w + ch, nd->u.fixed.scale[ch], 1);
        if (st == MGT_OK)
            st = mgt_fill(c->s, b + ch, nd->u.fixed.shift[ch], 1);
    }
    if (st == MGT_OK)
        st = mgt_conv2d_forward_st(c->s, MGT_PREC_F32, nn_store_of(c), c->y, c->x[0], w, &sh, 0.0f);
    if (st == MGT_OK && nd->kind == NN_AFFINE)
        st = mgt_channel_bias_forward(c->s, c->y, b, c->n, sh.c, conv_out_hw(c));
    return st;
}

static mgt_status fixed_backward(nn_call *c)
{
    mgt_conv2d_shape sh = fixed_shape(c);
    if (!c->dx[0])
        return MGT_OK;
    return mgt_conv2d_backward_data_st(c->s, MGT_PREC_F32, nn_store_of(c), c->dx[0], c->dy,
                                       fixed_weights(c), &sh, c->dx_beta[0]);
}

const nn_kind_i nn_kinds[NN_KIND_COUNT] = {
    [NN_CONV] = {"conv", NN_F_NEEDS_X | NN_F_DX_BETA, conv_forward, conv_backward, conv_macs},
    [NN_BN] = {"bn", NN_F_NEEDS_X, bn_forward, bn_backward, bn_macs},
    [NN_RELU] = {"relu", NN_F_INPLACE | NN_F_NEEDS_Y | NN_F_DX_ON_DY, relu_forward, relu_backward,
                 NULL},
    [NN_MAXPOOL] = {"maxpool", NN_F_NEEDS_X | NN_F_NEEDS_Y, maxpool_forward, maxpool_backward,
                    NULL},
    [NN_ADD] = {"add", NN_F_INPLACE | NN_F_PASSTHROUGH, add_forward, NULL, NULL},
    [NN_GAP] = {"avgpool", 0, gap_forward, gap_backward, gap_macs},
    [NN_LINEAR] = {"linear", NN_F_NEEDS_X | NN_F_DX_BETA, linear_forward, linear_backward,
                   linear_macs},
    [NN_ACT] = {"act", NN_F_NEEDS_X | NN_F_DX_ON_DY, act_forward, act_backward, NULL},
    /* no MACs: THOP does not count the functional product of a squeeze-excite */
    [NN_SCALE] = {"scale", NN_F_NEEDS_X | NN_F_DX_ON_DY, scale_forward, scale_backward, NULL},
    [NN_SDEPTH] = {"stochastic_depth", NN_F_INPLACE | NN_F_DX_ON_DY, sdepth_forward,
                   sdepth_backward, NULL},
    [NN_DROPOUT] = {"dropout", NN_F_INPLACE | NN_F_DX_ON_DY, dropout_forward, dropout_backward,
                    NULL},
    [NN_APOOL] = {"avgpool", 0, apool_forward, apool_backward, apool_macs},
    [NN_CONCAT] = {"concat", 0, concat_forward, concat_backward, NULL},
    [NN_SLICE] = {"slice", 0, slice_forward, slice_backward, NULL},
    [NN_SHUFFLE] = {"shuffle", 0, shuffle_forward, shuffle_backward, NULL},
    /* no MACs: THOP does not count torchvision's LayerNorm2d (a functional layer_norm) */
    [NN_LN2D] = {"layernorm", NN_F_NEEDS_X, ln2d_forward, ln2d_backward, NULL},
    [NN_LSCALE] = {"layer_scale", NN_F_NEEDS_X | NN_F_DX_ON_DY, lscale_forward, lscale_backward,
                   NULL},
    /* no MACs for the layer norm, the permutations and the token additions (THOP's rules) */
    [NN_LN] = {"layernorm", NN_F_NEEDS_X, nn_ln_forward, nn_ln_backward, NULL},
    [NN_PERMUTE] = {"permute", 0, nn_permute_forward, nn_permute_backward, NULL},
    [NN_ATTN] = {"attention", NN_F_NEEDS_X | NN_F_NEEDS_Y, nn_attn_forward, nn_attn_backward,
                 nn_attn_macs},
    [NN_CLS] = {"class_token", 0, nn_cls_forward, nn_cls_backward, NULL},
    [NN_POSADD] = {"pos_embedding", NN_F_INPLACE | NN_F_PASSTHROUGH, nn_posadd_forward,
                   nn_posadd_backward, NULL},
    /* no MACs: THOP counts neither the functional avg_pool2d nor the input map */
    [NN_AVGPOOL2D] = {"avgpool2d", NN_F_DX_BETA, fixed_forward, fixed_backward, NULL},
    [NN_AFFINE] = {"transform_input", NN_F_DX_BETA, fixed_forward, fixed_backward, NULL},
};
