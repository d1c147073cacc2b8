/* `mgtrain model`: a model's layers with their output shapes, its parameter count, forward
   multiply-accumulates and activation memory per image, without touching any device; with no
   architecture, every architecture with its counts. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/commands.h"
#include "mgt/device.h"
#include "mgt/nn.h"
#include "mgt/optim.h"

static void model_usage(FILE *f)
{
    fprintf(f, "usage: mgtrain model [-a NAME] [--classes K] [--in-channels C] [--size S] "
               "[--amp bf16|fp16] [--params]\n"
               "       mgtrain model -a NAME --amp bf16|fp16 --bytes [-b BATCH]\n"
               "  -a, --arch     the architecture (without it: every architecture, with its "
               "counts)\n"
               "  --classes      classifier outputs (default 1000; 10 for the CIFAR networks)\n"
               "  --in-channels  1 or 3 (default 3)\n"
               "  --size         input side in pixels (default: the architecture's, as listed;\n"
               "                 32 for the CIFAR networks)\n"
               "  --amp          activation memory with activations stored in 16 bits, as\n"
               "                 mock devices store them under train --amp\n"
               "  --aux-logits on|off       inception_v3's and googlenet's auxiliary "
               "classifiers (on)\n"
               "  --transform-input on|off  their input map (off; on as --pretrained sets it)\n"
               "  --params       also list every tensor: name, shape, arena and byte offset\n"
               "  --bytes        the bytes one training step moves through a GPU's memory under\n"
               "                 --amp, counted from the CUDA kernels op by op: the 16-bit path\n"
               "                 over fp32 NCHW activations against the NHWC 16-bit one, and\n"
               "                 what each predicts at H100 HBM3's 3.35 TB/s\n"
               "  -b, --batch    images per step of --bytes (default 256)\n");
}

static bool parse_int(const char *flag, const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "mgtrain model: %s '%s': expected a whole number from %d to %d\n", flag, s,
                lo, hi);
        return false;
    }
    *out = (int)v;
    return true;
}

/* 11689512 -> "11,689,512" */
static const char *grouped(char *buf, size_t size, unsigned long long v)
{
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%llu", v), o = 0;
    for (int i = 0; i < n && (size_t)o + 2 < size; i++) {
        if (i && (n - i) % 3 == 0)
            buf[o++] = ',';
        buf[o++] = tmp[i];
    }
    buf[o] = '\0';
    return buf;
}

static void print_layers(const mgt_model *m)
{
    int n;
    const mgt_model_layer *l = mgt_model_layers(m, &n);
    char a[32], b[32], shape[32], kind[32];
    printf("%-30s %-16s %-16s %12s %15s\n", "layer", "kind", "output", "params", "MACs");
    for (int i = 0; i < n; i++) {
        snprintf(shape, sizeof shape, "%dx%dx%d", l[i].c, l[i].h, l[i].w);
        snprintf(kind, sizeof kind, "%s%s", l[i].kind, l[i].aux ? " (aux)" : "");
        printf("%-30s %-16s %-16s %12s %15s\n", l[i].name, kind, shape,
               l[i].params ? grouped(a, sizeof a, l[i].params) : "",
               l[i].macs ? grouped(b, sizeof b, l[i].macs) : "");
    }
}

/* How the validation transform of a prepares an input of side size: "Resize(256) +
   CenterCrop(224)", or the CIFAR networks' images as they are. */
static void eval_transform(const mgt_arch_info *a, int size, char *buf, size_t cap)
{
    if (!a || a->eval == MGT_ARCH_EVAL_NATIVE)
        snprintf(buf, cap, "the images as they are");
    else
        snprintf(buf, cap, "Resize(%d) + CenterCrop(%d)", mgt_arch_resize_size(a, size), size);
}

static void print_params(const mgt_model *m)
{
    int n;
    const mgt_model_entry *t = mgt_model_table(m, &n);
    char shape[64];
    printf("\n%-40s %-20s %-8s %12s\n", "tensor", "shape", "arena", "offset");
    for (int i = 0; i < n; i++) {
        size_t o = 0;
        o += (size_t)snprintf(shape, sizeof shape, "[");
        for (int d = 0; d < t[i].ndim && o < sizeof shape; d++)
            o += (size_t)snprintf(shape + o, sizeof shape - o, "%s%lld", d ? ", " : "",
                                  (long long)t[i].shape[d]);
        if (o < sizeof shape)
            snprintf(shape + o, sizeof shape - o, "]");
        const char *arena = t[i].role == MGT_MODEL_PARAM    ? "params"
                            : t[i].role == MGT_MODEL_BUFFER ? "buffers"
                                                            : "host";
        printf("%-40s %-20s %-8s %12zu\n", t[i].name, shape, arena, t[i].offset);
    }
}

/* The natural input of an architecture (its policy's synthetic input: the CIFAR networks at
   32x32 with 10 classes, the others at torchvision's 224x224 with 1000); a flag given wins. */
static mgt_model_config default_config(const char *arch, int classes, int in_channels, int size,
                                       int aux, int ti)
{
    const mgt_arch_info *a = mgt_arch_find(arch);
    return (mgt_model_config){.arch = arch,
                              .classes = classes ? classes
                                         : a     ? a->synthetic_classes
                                                 : 1000,
                              .in_channels = in_channels,
                              .image_size = size ? size
                                            : a  ? a->synthetic_size
                                                 : 224,
                              .batch = 1,
                              .no_aux_logits = aux == 0,
                              .transform_input = ti == 1};
}

static int list_archs(int classes, int in_channels, int size, mgt_precision amp)
{
    char a[32], b[32];
    printf("%-20s %-14s %-13s %-10s %14s %10s %14s\n", "architecture", "family", "input",
           "val resize", "parameters", "GMACs", "act MiB/image");
    for (const char *const *n = mgt_model_arch_names(); *n; n++) {
        mgt_model_config cfg = default_config(*n, classes, in_channels, size, -1, -1);
        cfg.amp = amp;
        mgt_model *m;
        if (mgt_model_create(&cfg, NULL, &m) != MGT_OK) {
            fprintf(stderr, "mgtrain model: %s\n", mgt_error_last());
            return 2;
        }
        mgt_model_counts c;
        mgt_model_get_counts(m, &c);
        snprintf(b, sizeof b, "%dx%dx%d", cfg.in_channels, cfg.image_size, cfg.image_size);
        const mgt_arch_info *ai = mgt_arch_find(*n);
        char resize[16] = "-";
        if (ai && ai->eval == MGT_ARCH_EVAL_RESIZE_CROP)
            snprintf(resize, sizeof resize, "%d", mgt_arch_resize_size(ai, cfg.image_size));
        printf("%-20s %-14s %-13s %-10s %14s %10.3f %14.2f\n", *n, ai ? ai->family : "?", b, resize,
               grouped(a, sizeof a, c.params), c.macs / 1e9, c.act_bytes_per_image / 1048576.0);
        mgt_model_free(m);
    }
    printf("\n(input: the default --image-size, torchvision's weights' crop; val resize: the "
           "shorter side before the validation's centre crop; parameters as torchvision counts "
           "them, sum of numel, auxiliary classifiers included; MACs by THOP's rules, of an "
           "evaluation; `mgtrain model -a NAME` for the layers)\n");
    return 0;
}

/* ---- --bytes: the byte model of a CUDA training step ---- */

#define HBM3_BYTES_PER_S 3.35e12        /* H100 SXM5's HBM3, NVIDIA's datasheet */
#define PYTORCH_AMP_IMAGES_PER_S 2791.0 /* NVIDIA's published ResNet-50 AMP training, 1 H100 */

/* The trainer's step, as commands.h says. */
mgt_status mgt_app_trace_step(const mgt_model_config *cfg0, int batch, mgt_precision act,
                              mgt_app_bytes_trace *t)
{
    mgt_devset *set = NULL;
    mgt_model *m = NULL;
    mgt_optimizer *o = NULL;
    mgt_buffer *x = NULL, *labels = NULL, *correct = NULL, *bad = NULL;
    mgt_stream *s = NULL;
    mgt_status st = mgt_devset_open_bytes(MGT_LAYOUT_NHWC, act, false, &set);
    if (st != MGT_OK)
        return st;
    mgt_device *d = mgt_devset_device(set, 0);
    mgt_model_config cfg = *cfg0;
    cfg.batch = batch;
    size_t image = (size_t)cfg.in_channels * cfg.image_size * cfg.image_size;
    st = mgt_stream_create(d, &s);
    if (st == MGT_OK)
        st = mgt_model_create(&cfg, d, &m);
    if (st == MGT_OK)
        st = mgt_buffer_alloc(d, (size_t)batch * image * sizeof(float), &x);
    if (st == MGT_OK)
        st = mgt_buffer_alloc(d, (size_t)batch * sizeof(int32_t), &labels);
    if (st == MGT_OK)
        st = mgt_buffer_alloc(d, 2 * sizeof(int32_t), &correct);
    if (st == MGT_OK)
        st = mgt_buffer_alloc(d, sizeof(int32_t), &bad);
    size_t pbytes = 0;
    float *params = m ? mgt_model_params(m, &pbytes) : NULL;
    float *grads = m ? mgt_model_grads(m, NULL) : NULL;
    if (st == MGT_OK) {
        mgt_opt_config oc;
        mgt_opt_config_defaults(&oc, MGT_OPT_SGD, 0.9f);
        mgt_opt_group g = {0, pbytes / sizeof(float), 1e-4f};
        st = mgt_optimizer_create(d, pbytes / sizeof(float), &oc, &g, 1, &o);
    }
    if (st == MGT_OK) {
        mgt_device_bytes_reset(d); /* the step only, not the set-up */
        st = mgt_model_zero_grad(m, s);
    }
    if (st == MGT_OK)
        st = mgt_model_forward(m, s, mgt_buffer_ptr(x), batch, true, NULL);
    if (st == MGT_OK)
        st = mgt_model_loss(m, s, mgt_buffer_ptr(labels), 0.0f, mgt_buffer_ptr(correct));
    if (st == MGT_OK)
        st = mgt_model_backward(m, s, NULL, NULL);
    /* fp16's loss scaling counts the non-finite gradients before the update */
    if (st == MGT_OK && cfg.amp == MGT_PREC_FP16)
        st = mgt_nonfinite_count(s, mgt_buffer_ptr(bad), grads, pbytes / sizeof(float));
    if (st == MGT_OK)
        st = mgt_optimizer_step(o, s, params, grads, 0.1f, 1.0f);
    if (st == MGT_OK) {
        t->n = mgt_device_bytes_rows(d, t->rows, MGT_APP_BYTES_MAX_ROWS);
        if (t->n > MGT_APP_BYTES_MAX_ROWS)
            t->n = MGT_APP_BYTES_MAX_ROWS;
        mgt_model_counts c;
        mgt_model_get_counts(m, &c);
        t->values = c.values;
        t->values_16 = c.values_16;
    }
    mgt_optimizer_free(o);
    mgt_buffer_free(bad);
    mgt_buffer_free(correct);
    mgt_buffer_free(labels);
    mgt_buffer_free(x);
    mgt_model_free(m);
    mgt_stream_free(s);
    mgt_devset_free(set);
    return st;
}

static const mgt_bytes_row *find_row(const mgt_app_bytes_trace *t, const char *name)
{
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->rows[i].name, name) == 0)
            return &t->rows[i];
    return NULL;
}

static void trace_totals(const mgt_app_bytes_trace *t, double *total, double *convert)
{
    *total = *convert = 0.0;
    for (int i = 0; i < t->n; i++) {
        *total += t->rows[i].read + t->rows[i].written;
        *convert += t->rows[i].convert;
    }
}

static void print_bytes_cell(const mgt_bytes_row *r)
{
    if (!r)
        printf(" %6s %9s %9s", "-", "-", "-");
    else
        printf(" %6ld %9.2f %9.2f", r->calls, (r->read + r->written) / 1e9, r->convert / 1e9);
}

static int model_bytes(const mgt_model_config *cfg, int batch)
{
    if (cfg->amp == MGT_PREC_F32) {
        fprintf(stderr, "mgtrain model: --bytes compares the 16-bit paths: give --amp bf16 or "
                        "--amp fp16\n");
        return 2;
    }
    mgt_app_bytes_trace *traces = calloc(2, sizeof *traces); /* a few KiB each */
    if (!traces) {
        fprintf(stderr, "mgtrain model: --bytes: out of host memory\n");
        return 1;
    }
    const mgt_app_bytes_trace *old = &traces[0], *nhwc = &traces[1];
    if (mgt_app_trace_step(cfg, batch, MGT_PREC_F32, &traces[0]) != MGT_OK ||
        mgt_app_trace_step(cfg, batch, cfg->amp, &traces[1]) != MGT_OK) {
        fprintf(stderr, "mgtrain model: --bytes: %s\n", mgt_error_last());
        free(traces);
        return 1;
    }
    printf("%s, batch %d, %dx%dx%d, --amp %s: bytes one training step moves through a GPU's "
           "memory,\ncounted from the CUDA backend's kernels op by op (src/device/bytes.c; each "
           "pass reads\nevery tensor it needs once and writes each output once)\n\n",
           cfg->arch, batch, cfg->in_channels, cfg->image_size, cfg->image_size,
           mgt_precision_name(cfg->amp));
    printf("%-28s %26s %26s\n", "", "fp32 NCHW activations", "NHWC 16-bit activations");
    printf("%-28s %6s %9s %9s %6s %9s %9s\n", "op", "calls", "GB", "convert", "calls", "GB",
           "convert");
    /* every row of either trace, in the op list's order (both traces keep it) */
    for (int pass = 0; pass < 2; pass++) {
        const mgt_app_bytes_trace *t = pass ? nhwc : old;
        for (int i = 0; i < t->n; i++) {
            const char *name = t->rows[i].name;
            if (pass && find_row(old, name))
                continue;
            printf("%-28s", name);
            print_bytes_cell(find_row(old, name));
            print_bytes_cell(find_row(nhwc, name));
            printf("\n");
        }
    }
    double to, co, tn, cn;
    trace_totals(old, &to, &co);
    trace_totals(nhwc, &tn, &cn);
    printf("%-28s %6s %9.2f %9.2f %6s %9.2f %9.2f\n", "total", "", to / 1e9, co / 1e9, "", tn / 1e9,
           cn / 1e9);
    char o16[32], n16[32];
    snprintf(o16, sizeof o16, "%d of %d", old->values_16, old->values);
    snprintf(n16, sizeof n16, "%d of %d", nhwc->values_16, nhwc->values);
    printf("%-28s %26s %26s\n", "activations in 16 bits", o16, n16);
    double so = to / HBM3_BYTES_PER_S, sn = tn / HBM3_BYTES_PER_S;
    double spt = batch / PYTORCH_AMP_IMAGES_PER_S;
    printf("\nat %.2f TB/s (H100 SXM HBM3), memory traffic alone:\n", HBM3_BYTES_PER_S / 1e12);
    printf("  fp32 NCHW activations:   %7.2f ms per step, %6.0f images/s at most\n", so * 1e3,
           batch / so);
    printf("  NHWC 16-bit activations: %7.2f ms per step, %6.0f images/s at most (%.2fx fewer "
           "bytes)\n",
           sn * 1e3, batch / sn, to / tn);
    printf("  PyTorch AMP (published, 1 H100, %.0f images/s): %.2f ms per step of %d, time "
           "for %.1f GB at that rate\n",
           PYTORCH_AMP_IMAGES_PER_S, spt * 1e3, batch, spt * HBM3_BYTES_PER_S / 1e9);
    printf("(GB = 1e9 bytes; convert: of GB, the passes that only change layout or precision; a "
           "bound from bytes alone: tensor-core time, launch gaps and cuDNN's own workspace "
           "traffic not counted)\n");
    free(traces);
    return 0;
}

int mgt_app_cmd_model(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"arch", required_argument, NULL, 'a'},
        {"classes", required_argument, NULL, 'k'},
        {"in-channels", required_argument, NULL, 'c'},
        {"size", required_argument, NULL, 's'},
        {"params", no_argument, NULL, 'p'},
        {"amp", required_argument, NULL, 'm'},
        {"aux-logits", required_argument, NULL, 'x'},
        {"transform-input", required_argument, NULL, 't'},
        {"bytes", no_argument, NULL, 'y'},
        {"batch", required_argument, NULL, 'b'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *arch = NULL;
    int classes = 0, in_channels = 3, size = 0, opt, aux = -1, ti = -1, batch = 256;
    bool params = false, bytes = false, batch_set = false;
    mgt_precision amp = MGT_PREC_F32;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "ha:b:", longopts, NULL)) != -1) {
        switch (opt) {
        case 'a': arch = optarg; break;
        case 'k':
            if (!parse_int("--classes", optarg, 1, 1 << 24, &classes))
                return 2;
            break;
        case 'c':
            if (!parse_int("--in-channels", optarg, 1, 4, &in_channels))
                return 2;
            break;
        case 's':
            if (!parse_int("--size", optarg, 1, 8192, &size))
                return 2;
            break;
        case 'p': params = true; break;
        case 'y': bytes = true; break;
        case 'b':
            if (!parse_int("--batch", optarg, 1, 1 << 16, &batch))
                return 2;
            batch_set = true;
            break;
        case 'm':
            if (!mgt_app_flag_precision("--amp", optarg, true, &amp))
                return 2;
            break;
        case 'x':
        case 't':
            if (!mgt_app_flag_onoff(opt == 'x' ? "--aux-logits" : "--transform-input", optarg,
                                    opt == 'x' ? &aux : &ti))
                return 2;
            break;
        case 'h': model_usage(stdout); return 0;
        default:
            fprintf(stderr, "mgtrain model: unknown or incomplete option '%s'\n", argv[optind - 1]);
            model_usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "mgtrain model: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (batch_set && !bytes) {
        fprintf(stderr, "mgtrain model: -b/--batch sizes the step of --bytes; give --bytes too\n");
        return 2;
    }
    if (bytes && !arch) {
        fprintf(stderr, "mgtrain model: --bytes traces one architecture: give -a NAME\n");
        return 2;
    }
    if (!arch)
        return list_archs(classes, in_channels, size, amp);
    if (!mgt_arch_find(arch)) { /* every name, however many there are */
        fprintf(stderr, "mgtrain model: -a '%s': unknown architecture; the %d known:\n", arch,
                mgt_app_arch_count());
        mgt_app_print_archs(stderr);
        return 2;
    }
    mgt_model_config cfg = default_config(arch, classes, in_channels, size, aux, ti);
    cfg.amp = amp;
    if (bytes)
        return model_bytes(&cfg, batch);
    mgt_model *m;
    if (mgt_model_create(&cfg, NULL, &m) != MGT_OK) {
        fprintf(stderr, "mgtrain model: %s\n", mgt_error_last());
        return 2;
    }
    mgt_model_counts c;
    mgt_model_get_counts(m, &c);
    const mgt_arch_info *ai = mgt_arch_find(cfg.arch);
    char vt[64];
    eval_transform(ai, cfg.image_size, vt, sizeof vt);
    printf("%s: input %dx%dx%d, %d classes, classifier head %s; validation: %s\n", cfg.arch,
           cfg.in_channels, cfg.image_size, cfg.image_size, cfg.classes, mgt_model_head(m), vt);
    if (mgt_model_aux_count(m))
        printf("auxiliary classifiers: %d, in training only (marked aux), each loss weighted %g "
               "(--aux-weight; --aux-logits off builds none)\n",
               mgt_model_aux_count(m), (double)mgt_model_aux_weight(m));
    printf("\n");
    print_layers(m);
    if (params)
        print_params(m);
    char a[32], b[32];
    printf("\nparameters:                %s (%.2f M; %.1f MiB fp32)\n",
           grouped(a, sizeof a, c.params), c.params / 1e6, c.params * 4.0 / 1048576.0);
    /* G for the ImageNet networks (as torchvision's tables quote them), M for small inputs */
    double unit = c.macs >= 1000000000ull ? 1e9 : 1e6;
    const char *un = unit == 1e9 ? "G" : "M";
    printf("forward MACs per image:    %.2f %s (%s as THOP counts: convolutions, fc, 2 per "
           "batch-norm element, average pool; convolutions and fc alone %s = %.2f %s)\n",
           c.macs / unit, un, grouped(a, sizeof a, c.macs), grouped(b, sizeof b, c.macs_conv_fc),
           c.macs_conv_fc / unit, un);
    if (c.macs_aux)
        printf("auxiliary classifiers:     %s more MACs per training image (%.2f %s)\n",
               grouped(a, sizeof a, c.macs_aux), c.macs_aux / unit, un);
    printf("activation memory / image: %.2f MiB (%s bytes: the layer outputs not computed in "
           "place, probabilities and the gradient slots backward cycles through; plus %s bytes "
           "of per-channel statistics per batch)\n",
           c.act_bytes_per_image / 1048576.0, grouped(a, sizeof a, c.act_bytes_per_image),
           grouped(b, sizeof b, c.act_bytes_fixed));
    if (amp != MGT_PREC_F32)
        printf("stored in %s:              %d of %d layer outputs and their gradients (the "
               "rest fp32), as mock devices store them under --amp %s\n",
               mgt_precision_name(amp), c.values_16, c.values, mgt_precision_name(amp));
    mgt_model_free(m);
    return 0;
}
