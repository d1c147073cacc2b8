/* --pretrained: a torchvision state_dict, or an mgtrain checkpoint's weights and buffers, into
   replica 0 (broadcast later). fc keeps the model's own when the file's has another class
   count; an mgtrain checkpoint's optimizer state and training metadata are ignored, and one
   line says so. */
#include <stdlib.h>
#include <string.h>

#include "train/train_impl.h"

/* Whether the file's fc.weight has another shape than the model's (another class count):
   then fc keeps the model's initialisation, as fine-tuning wants. */
static bool fc_differs(const mgt_model *m, const mgt_st_file *f)
{
    int i = mgt_st_find(f, "fc.weight"), n;
    const mgt_model_entry *t = mgt_model_table(m, &n);
    for (int e = 0; e < n && i >= 0; e++) {
        if (strcmp(t[e].name, "fc.weight") != 0)
            continue;
        if (mgt_st_tensor_ndim(f, i) != t[e].ndim)
            return true;
        for (int d = 0; d < t[e].ndim; d++)
            if (mgt_st_tensor_shape(f, i)[d] != t[e].shape[d])
                return true;
    }
    return false;
}

/* Prints what --pretrained took; for an mgtrain checkpoint, the one line saying what it left. */
static void say_pretrained(run *r, const mgt_st_file *f, const train_state *s,
                           const mgt_model_load_report *rep)
{
    const char *path = r->c->pretrained;
    fprintf(r->out, "=> loaded pretrained weights from %s (%d tensors)\n", path, rep->loaded);
    if (rep->text)
        fprintf(r->out, "%s\n", rep->text);
    if (s->format == 0)
        return;
    int opt = 0;
    for (int i = 0; i < mgt_st_count(f); i++)
        opt += strncmp(mgt_st_tensor_name(f, i), TRAIN_OPT_PREFIX, strlen(TRAIN_OPT_PREFIX)) == 0;
    fprintf(r->out,
            "=> %s is an mgtrain checkpoint: --pretrained took its weights and buffers and "
            "ignored its optimizer state (%d tensor%s) and training metadata (epoch %d step "
            "%ld); --resume would continue that run\n",
            path, opt, opt == 1 ? "" : "s", s->epoch, s->step);
}

mgt_status train_load_pretrained(run *r)
{
    const char *path = r->c->pretrained;
    if (!path)
        return MGT_OK;
    worker *w0 = &r->w[0];
    mgt_st_file *f = NULL;
    mgt_model_load_report rep = {0};
    train_state s = {0};
    mgt_status st = mgt_st_open(path, &f);
    if (st == MGT_OK) {
        /* a malformed training state is no reason to refuse the weights: it is only shown */
        train_state_read(f, path, &s);
        mgt_error_clear();
        mgt_model_load_options lo = {.skip_fc = fc_differs(w0->model, f),
                                     .ignore_prefixes = train_opt_prefixes};
        st = mgt_model_load(w0->model, w0->s, f, &lo, &rep);
        if (st != MGT_OK)
            mgt_error_wrap(st, "%s", path);
    }
    if (st == MGT_OK)
        say_pretrained(r, f, &s, &rep);
    free(rep.text);
    mgt_st_close(f);
    return st != MGT_OK ? train_flag_error(st, "--pretrained") : MGT_OK;
}
