/* A model's weights to and from safetensors files in torchvision's names, staged through host
   memory: load checks the whole file against the table before it changes anything. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mgt/text.h"
#include "nn/model_impl.h"

static void shape_str(char *buf, size_t size, int ndim, const int64_t *shape)
{
    size_t n = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < size)
        snprintf(buf + n, size - n, "]");
}

static bool has_prefix(const char *name, const char *const *prefixes)
{
    for (; prefixes && *prefixes; prefixes++)
        if (strncmp(name, *prefixes, strlen(*prefixes)) == 0)
            return true;
    return false;
}

/* The first value of an F32 tensor that is not finite: a NaN or Inf in the weights only
   shows up steps later as a NaN loss (a device error), far from the file that held it. One
   pass over the weights on the host, which the load copies anyway. */
static mgt_status check_finite(const char *name, const void *data, size_t floats)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < floats; i++) {
        float v;
        memcpy(&v, p + i * sizeof v, sizeof v); /* the file's data may be unaligned */
        if (!isfinite(v))
            return mgt_error_set(MGT_ERR_INVALID, "%s holds %s at element %zu of %zu", name,
                                 isnan(v) ? "NaN"
                                 : v > 0  ? "+Inf"
                                          : "-Inf",
                                 i, floats);
    }
    return MGT_OK;
}

/* The error text holds the first mismatches that fit in it (mgt_error_set keeps 512 bytes);
   report->text holds them all. */
static mgt_status mismatch_error(const mgt_model *m, const mgt_text *t, int lines)
{
    char brief[400];
    size_t n = 0;
    int shown = 0;
    const char *p = t->s ? t->s : "";
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        if (n + len + 3 >= sizeof brief - 40)
            break;
        memcpy(brief + n, shown ? "; " : "", shown ? 2 : 0);
        n += shown ? 2 : 0;
        memcpy(brief + n, p, len);
        n += len;
        shown++;
        p += len + (nl ? 1 : 0);
    }
    brief[n] = '\0';
    return mgt_error_set(MGT_ERR_INVALID,
                         "weights do not fit %s (%d classes, %d channels): "
                         "%d mismatch%s: %s%s",
                         m->arch, m->cfg.classes, m->cfg.in_channels, lines, lines == 1 ? "" : "es",
                         brief, shown < lines ? "; ... (the load report lists all)" : "");
}

/* timm's adapt_input_conv: a [k, from, r, s] file weight into the model's [k, c, r, s]: for
   one channel the sum over the file's channels; otherwise channel j takes the file's
   channel j mod from, times from / c. The file's data may be unaligned. */
static void adapt_stem(float *dst, const int64_t *shape, const void *src, int from)
{
    const unsigned char *p = src;
    size_t k = (size_t)shape[0], c = (size_t)shape[1], rs = (size_t)(shape[2] * shape[3]);
    for (size_t o = 0; o < k; o++)
        for (size_t j = 0; j < c; j++)
            for (size_t q = 0; q < rs; q++) {
                float v, acc = 0;
                if (c == 1) {
                    for (size_t i = 0; i < (size_t)from; i++) {
                        memcpy(&v, p + ((o * (size_t)from + i) * rs + q) * sizeof v, sizeof v);
                        acc += v;
                    }
                } else {
                    memcpy(&v, p + ((o * (size_t)from + j % (size_t)from) * rs + q) * sizeof v,
                           sizeof v);
                    acc = v * (float)from / (float)c;
                }
                dst[(o * c + j) * rs + q] = acc;
            }
}

mgt_status mgt_model_load(mgt_model *m, mgt_stream *s, const mgt_st_file *f,
                          const mgt_model_load_options *opts, mgt_model_load_report *report)
{
    mgt_model_load_options none = {0};
    mgt_model_load_report rep = {0};
    if (!opts)
        opts = &none;
    if (report)
        *report = rep;
    mgt_status st = nn_need_device(m, "model load");
    if (st != MGT_OK)
        return st;
    int nf = mgt_st_count(f);
    bool *used = calloc((size_t)nf + 1, sizeof *used);
    int *where = malloc(((size_t)m->n_table + 1) * sizeof *where);
    char *hp = malloc(m->params_bytes), *hb = malloc(m->bufs_bytes ? m->bufs_bytes : 1);
    mgt_text t = {0}, note = {0}; /* the mismatch lines (counted in mismatches), the notes */
    int mismatches = 0;
    if (!used || !where || !hp || !hb) {
        st = mgt_error_set(MGT_ERR_OOM, "model load: out of host memory");
        goto done;
    }

    for (int e = 0; e < m->n_table; e++) {
        const mgt_model_entry *te = &m->table[e];
        where[e] = -1;
        int i = mgt_st_find(f, te->name);
        if (i < 0) {
            mismatches++;
            mgt_text_add(&t, "%s: missing\n", te->name);
            continue;
        }
        used[i] = true;
        mgt_st_dtype want = mgt_model_entry_i64(te) ? MGT_ST_I64 : MGT_ST_F32;
        mgt_st_dtype got = mgt_st_tensor_dtype(f, i);
        int nd = mgt_st_tensor_ndim(f, i);
        const int64_t *shape = mgt_st_tensor_shape(f, i);
        bool same = nd == te->ndim;
        for (int d = 0; same && d < nd; d++)
            same = shape[d] == te->shape[d];
        if (!same && opts->new_head && te->classifier && nd >= 1) {
            /* another class count: the model's own head stays */
            rep.skipped++;
            if (te->what != MGT_TENSOR_BIAS || !rep.head_classes)
                rep.head_classes = (int)shape[0];
            continue;
        }
        bool stem = !same && opts->adapt_stem && te->stem && nd == 4 && got == want &&
                    te->shape[1] == m->cfg.in_channels && shape[0] == te->shape[0] &&
                    shape[2] == te->shape[2] && shape[3] == te->shape[3] && shape[1] >= 1 &&
                    shape[1] <= 64;
        if ((!same && !stem) || got != want)
            mismatches++;
        if (stem) {
            where[e] = i;
            rep.stem_channels = (int)shape[1];
        } else if (!same) {
            char a[96], b[96];
            shape_str(a, sizeof a, nd, shape);
            shape_str(b, sizeof b, te->ndim, te->shape);
            mgt_text_add(&t, "%s: shape %s in the file, %s expected\n", te->name, a, b);
        } else if (got != want) {
            mgt_text_add(&t, "%s: dtype %s in the file, %s expected\n", te->name,
                         mgt_st_dtype_name(got), mgt_st_dtype_name(want));
        } else if (te->role == MGT_MODEL_INDEX &&
                   memcmp(mgt_st_tensor_data(f, i), mgt_model_index_values(m, te),
                          te->numel * sizeof(int64_t)) != 0) {
            mismatches++;
            mgt_text_add(&t,
                         "%s: other values than this model's (a model of another window size?)\n",
                         te->name);
        } else {
            where[e] = i;
        }
    }
    for (int i = 0; i < nf; i++) {
        if (used[i])
            continue;
        const char *name = mgt_st_tensor_name(f, i);
        if (opts->allow_unexpected || has_prefix(name, opts->ignore_prefixes))
            rep.ignored++;
        else {
            mismatches++;
            mgt_text_add(&t, "%s: unexpected (the model has no such tensor)\n", name);
        }
    }
    if (mismatches) {
        st = mismatch_error(m, &t, mismatches);
        rep.text = t.s;
        t.s = NULL;
        goto done;
    }

    for (int e = 0; e < m->n_table && st == MGT_OK; e++)
        if (where[e] >= 0 && !mgt_model_entry_i64(&m->table[e]))
            st = check_finite(m->table[e].name, mgt_st_tensor_data(f, where[e]),
                              mgt_st_tensor_bytes(f, where[e]) / sizeof(float));
    if (st != MGT_OK)
        goto done;

    /* The device's current values first, so that what the file does not set (new_head) stays. */
    st = mgt_copy_d2h(s, hp, m->params, m->params_bytes);
    if (st == MGT_OK && m->bufs_bytes)
        st = mgt_copy_d2h(s, hb, m->bufs, m->bufs_bytes);
    if (st == MGT_OK)
        st = mgt_stream_synchronize(s, NULL);
    if (st != MGT_OK)
        goto done;
    for (int e = 0; e < m->n_table; e++) {
        const mgt_model_entry *te = &m->table[e];
        if (where[e] < 0)
            continue;
        const void *src = mgt_st_tensor_data(f, where[e]);
        size_t bytes = mgt_st_tensor_bytes(f, where[e]);
        if (te->stem && rep.stem_channels && bytes != te->numel * sizeof(float))
            adapt_stem((float *)(hp + te->offset), te->shape, src, rep.stem_channels);
        else if (te->role == MGT_MODEL_PARAM)
            memcpy(hp + te->offset, src, bytes);
        else if (te->role == MGT_MODEL_BUFFER)
            memcpy(hb + te->offset, src, bytes);
        else if (te->role == MGT_MODEL_COUNTER)
            memcpy(&m->bn_counts[te->offset], src, sizeof(int64_t));
        /* an index was checked equal above: nothing to take */
        rep.loaded++;
    }
    st = mgt_copy_h2d(s, m->params, hp, m->params_bytes);
    if (st == MGT_OK && m->bufs_bytes)
        st = mgt_copy_h2d(s, m->bufs, hb, m->bufs_bytes);
    mgt_status st2 = mgt_stream_synchronize(s, NULL);
    if (st == MGT_OK)
        st = st2;
    if (st == MGT_OK && rep.head_classes) {
        char names[160] = "";
        size_t len = 0;
        for (int e = 0; e < m->n_table && len < sizeof names; e++)
            if (m->table[e].classifier)
                len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", len ? ", " : "",
                                        m->table[e].name);
        mgt_text_add(&note,
                     "%s: the file's are for %d classes; kept the model's own, initialised as "
                     "torchvision initialises them, for %d classes (fine-tuning)\n",
                     names, rep.head_classes, m->cfg.classes);
    }
    for (int e = 0; st == MGT_OK && rep.stem_channels && e < m->n_table; e++)
        if (m->table[e].stem)
            mgt_text_add(&note,
                         "%s: adapted from the file's %d input channels to %d (%s, as timm's "
                         "adapt_input_conv)\n",
                         m->table[e].name, rep.stem_channels, m->cfg.in_channels,
                         m->cfg.in_channels == 1 ? "summed over them"
                                                 : "repeated in turn, scaled by their ratio");
    if (note.s) {
        rep.text = note.s;
        note.s = NULL;
    }

done:
    mgt_text_free(&t);
    mgt_text_free(&note);
    free(used);
    free(where);
    free(hp);
    free(hb);
    if (report)
        *report = rep;
    else
        free(rep.text);
    return st;
}

mgt_status mgt_model_load_safetensors(mgt_model *m, mgt_stream *s, const char *path,
                                      const mgt_model_load_options *opts,
                                      mgt_model_load_report *report)
{
    if (report)
        memset(report, 0, sizeof *report);
    mgt_st_file *f = NULL;
    mgt_status st = mgt_st_open(path, &f);
    if (st != MGT_OK)
        return st;
    st = mgt_model_load(m, s, f, opts, report);
    mgt_st_close(f);
    if (st != MGT_OK) {
        mgt_error_wrap(st, "%s", path);
    }
    return st;
}

mgt_status mgt_model_add_to_writer(mgt_model *m, mgt_stream *s, mgt_st_writer *w, void **staging)
{
    *staging = NULL;
    mgt_status st = nn_need_device(m, "model save");
    if (st != MGT_OK)
        return st;
    size_t nb = (size_t)m->n_bn * sizeof(int64_t);
    char *h = malloc(m->params_bytes + m->bufs_bytes + nb);
    if (!h)
        return mgt_error_set(MGT_ERR_OOM, "model save: out of host memory");
    char *hp = h, *hb = h + m->params_bytes, *hc = hb + m->bufs_bytes;
    st = mgt_copy_d2h(s, hp, m->params, m->params_bytes);
    if (st == MGT_OK && m->bufs_bytes)
        st = mgt_copy_d2h(s, hb, m->bufs, m->bufs_bytes);
    mgt_status st2 = mgt_stream_synchronize(s, NULL);
    if (st == MGT_OK)
        st = st2;
    memcpy(hc, m->bn_counts, nb);
    for (int e = 0; e < m->n_table && st == MGT_OK; e++) {
        const mgt_model_entry *te = &m->table[e];
        const void *data = te->role == MGT_MODEL_PARAM    ? (const void *)(hp + te->offset)
                           : te->role == MGT_MODEL_BUFFER ? (const void *)(hb + te->offset)
                           : te->role == MGT_MODEL_INDEX
                               ? (const void *)mgt_model_index_values(m, te)
                               : (const void *)(hc + te->offset * 8);
        st = mgt_st_writer_add(w, te->name, mgt_model_entry_i64(te) ? MGT_ST_I64 : MGT_ST_F32,
                               te->ndim, te->shape, data);
    }
    char num[3][16];
    snprintf(num[0], sizeof num[0], "%d", m->cfg.classes);
    snprintf(num[1], sizeof num[1], "%d", m->cfg.in_channels);
    snprintf(num[2], sizeof num[2], "%d", m->cfg.image_size);
    /* "format": "pt" is what PyTorch's safetensors writer stores; some readers look for it. */
    if (st == MGT_OK)
        st = mgt_st_writer_set_metadata(w, "format", "pt");
    if (st == MGT_OK)
        st = mgt_st_writer_set_metadata(w, "arch", m->arch);
    if (st == MGT_OK)
        st = mgt_st_writer_set_metadata(w, "classes", num[0]);
    if (st == MGT_OK)
        st = mgt_st_writer_set_metadata(w, "in_channels", num[1]);
    if (st == MGT_OK)
        st = mgt_st_writer_set_metadata(w, "image_size", num[2]);
    if (st != MGT_OK) {
        free(h);
        return st;
    }
    *staging = h;
    return MGT_OK;
}

mgt_status mgt_model_save_safetensors(mgt_model *m, mgt_stream *s, const char *path)
{
    mgt_st_writer *w = NULL;
    void *staging = NULL;
    mgt_status st = mgt_st_writer_create(&w);
    if (st == MGT_OK)
        st = mgt_model_add_to_writer(m, s, w, &staging);
    if (st == MGT_OK)
        st = mgt_st_writer_save(w, path);
    mgt_st_writer_free(w);
    free(staging);
    return st;
}
