/* `mgtrain model`: a model's layers with their output shapes, its parameter count, forward
   multiply-accumulates and activation memory per image, without touching any device; with no
   architecture, every architecture with its counts. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/commands.h"
#include "mgt/nn.h"

static void model_usage(FILE *f)
{
    fprintf(f, "usage: mgtrain model [-a NAME] [--classes K] [--in-channels C] [--size S] "
               "[--amp bf16|fp16] [--params]\n"
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
               "  --params       also list every tensor: name, shape, arena and byte offset\n");
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
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *arch = NULL;
    int classes = 0, in_channels = 3, size = 0, opt, aux = -1, ti = -1;
    bool params = false;
    mgt_precision amp = MGT_PREC_F32;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "ha:", longopts, NULL)) != -1) {
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
