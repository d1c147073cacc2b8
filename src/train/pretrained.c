/* --pretrained: a torchvision state_dict, or an mgtrain checkpoint's weights and buffers, into
   replica 0 (broadcast later). The head (mgt_model_head, and the auxiliary classifiers' last
   layers) keeps the model's own, torchvision-initialised, when the file's has another class
   count, and a stem of another input channel count is adapted; one line says each. The file's
   auxiliary classifiers are ignored when the model is built without them. An mgtrain
   checkpoint's optimizer state and training metadata are ignored, and one line says so. */
#include <stdlib.h>
#include <string.h>

#include "train/train_impl.h"

/* The modules of the auxiliary classifiers ("AuxLogits.", "aux1.", ...) that a model built
   without them lacks, from the same architecture described with them: their tensors in a
   file are ignored then, as torchvision's builder drops them after loading its weights.
   prefixes gets at most cap - 1 of them, malloc'd, NULL-terminated; returns the count. */
static int aux_prefixes(const mgt_model *m, char **prefixes, int cap)
{
    int count = 0;
    prefixes[0] = NULL;
    if (mgt_model_aux_count(m) > 0 || mgt_arch_find(mgt_model_get_config(m)->arch)->aux_weight == 0)
        return 0;
    mgt_model_config cfg = *mgt_model_get_config(m);
    cfg.no_aux_logits = false;
    mgt_model *with;
    if (mgt_model_create(&cfg, NULL, &with) != MGT_OK) {
        mgt_error_clear();
        return 0;
    }
    int n;
    const mgt_model_entry *t = mgt_model_table(with, &n);
    const mgt_model_layer *layers = mgt_model_layers(with, NULL);
    for (int e = 0; e < n && count < cap - 1; e++) {
        if (!layers[t[e].layer].aux)
            continue;
        size_t len = (size_t)(strchr(t[e].name, '.') - t[e].name) + 1;
        bool seen = false;
        for (int i = 0; i < count; i++)
            seen |= strlen(prefixes[i]) == len && strncmp(prefixes[i], t[e].name, len) == 0;
        if (!seen && (prefixes[count] = strndup(t[e].name, len)) != NULL)
            prefixes[++count] = NULL;
    }
    mgt_model_free(with);
    return count;
}

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
    /* the optimizer's state of a checkpoint, and auxiliary classifiers the model has not */
    const char *ignore[8] = {NULL};
    char *aux[4];
    int n_ign = 0, n_aux = aux_prefixes(w0->model, aux, 4);
    for (const char *const *p = train_opt_prefixes; *p; p++)
        ignore[n_ign++] = *p;
    for (int i = 0; i < n_aux; i++)
        ignore[n_ign++] = aux[i];
    /* -e evaluates the file's model as it is: no new head, no adapted stem */
    bool tune = !r->c->evaluate;
    mgt_model_load_options lo = {.new_head = tune, .adapt_stem = tune, .ignore_prefixes = ignore};
    mgt_status st = mgt_model_load(w0->model, w0->s, f, &lo, &rep);
    if (st == MGT_OK && n_aux)
        fprintf(r->out,
                "=> built without the auxiliary classifiers (--aux-logits off): the file's "
                "%s*%s%s%s tensors are not used\n",
                aux[0], n_aux > 1 ? " and " : "", n_aux > 1 ? aux[1] : "", n_aux > 1 ? "*" : "");
    for (int i = 0; i < n_aux; i++)
        free(aux[i]);
    if (st != MGT_OK)
        mgt_error_wrap(st, "%s", path);
    if (st == MGT_OK)
        say_pretrained(r, f, &s, &rep);
    free(rep.text);
    return st != MGT_OK ? train_flag_error(st, "--pretrained") : MGT_OK;
}
