/* --pretrained: a torchvision state_dict, or an mgtrain checkpoint's weights and buffers, into
   replica 0 (broadcast later). The architecture's head (mgt_model_head) keeps the model's own,
   torchvision-initialised, when the file's has another class count, and a stem of another
   input channel count is adapted; one line says each. An mgtrain checkpoint's optimizer state
   and training metadata are ignored, and one line says so. */
#include <stdlib.h>
#include <string.h>

#include "train/train_impl.h"

/* Prints what --pretrained took; for an mgtrain checkpoint, the one line saying what it left. */
static void say_pretrained(run *r, const mgt_st_file *f, const train_state *s,
                           const mgt_model_load_report *rep)
{
    const char *path = r->c->pretrained;
    const mgt_model *m = r->w[0].model;
    const mgt_model_config *mc = mgt_model_get_config(m);
    if (r->c->evaluate) /* the evaluation's first line names the file */
        return;
    fprintf(r->out, "=> loaded pretrained weights from %s (%d tensors)\n", path, rep->loaded);
    if (rep->head_classes)
        fprintf(r->out,
                "=> new head: %s re-initialised as torchvision initialises it, for %d "
                "classes (the file's is for %d)\n",
                mgt_model_head(m), mc->classes, rep->head_classes);
    if (rep->stem_channels)
        fprintf(r->out,
                "=> input channels: the stem adapted from the file's %d channels to %d (%s, "
                "as timm's adapt_input_conv)\n",
                rep->stem_channels, mc->in_channels,
                mc->in_channels == 1 ? "summed" : "repeated in turn, scaled by their ratio");
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
    const mgt_st_file *f = r->pretrained_f; /* opened by train_open_sources */
    mgt_model_load_report rep = {0};
    train_state s = {0};
    /* a malformed training state is no reason to refuse the weights: it is only shown */
    train_state_read(f, path, &s);
    mgt_error_clear();
    /* -e evaluates the file's model as it is: no new head, no adapted stem */
    bool tune = !r->c->evaluate;
    mgt_model_load_options lo = {
        .new_head = tune, .adapt_stem = tune, .ignore_prefixes = train_opt_prefixes};
    mgt_status st = mgt_model_load(w0->model, w0->s, f, &lo, &rep);
    if (st != MGT_OK)
        mgt_error_wrap(st, "%s", path);
    if (st == MGT_OK)
        say_pretrained(r, f, &s, &rep);
    free(rep.text);
    return st != MGT_OK ? train_flag_error(st, "--pretrained") : MGT_OK;
}
