/* Numeric flag values, checked against their range with a message naming the flag. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/commands.h"
#include "mgt/nn.h"

int mgt_app_bad_option(const char *cmd, int c, char **argv)
{
    if (c == ':')
        fprintf(stderr, "mgtrain %s: %s needs a value (mgtrain %s --help)\n", cmd, argv[optind - 1],
                cmd);
    else
        fprintf(stderr, "mgtrain %s: unknown option '%s' (mgtrain %s --help)\n", cmd,
                argv[optind - 1], cmd);
    return 2;
}

bool mgt_app_flag_int(const char *flag, const char *v, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "mgtrain: %s '%s': expected a whole number from %ld to %ld\n", flag, v, lo,
                hi);
        return false;
    }
    *out = x;
    return true;
}

bool mgt_app_flag_float(const char *flag, const char *v, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x) || x < lo || x > hi) {
        fprintf(stderr, "mgtrain: %s '%s': expected a number from %g to %g\n", flag, v, lo, hi);
        return false;
    }
    *out = x;
    return true;
}

bool mgt_app_flag_precision(const char *flag, const char *v, bool allow_fp16, mgt_precision *out)
{
    mgt_precision p;
    bool ok = mgt_precision_parse(v, &p) && (allow_fp16 ? p != MGT_PREC_F32 : p != MGT_PREC_FP16);
    if (!ok) {
        fprintf(stderr, "mgtrain: %s '%s': expected %s\n", flag, v,
                allow_fp16 ? "bf16 or fp16" : "f32 or bf16");
        return false;
    }
    *out = p;
    return true;
}

bool mgt_app_flag_onoff(const char *flag, const char *v, int *out)
{
    if (strcmp(v, "on") != 0 && strcmp(v, "off") != 0) {
        fprintf(stderr, "mgtrain: %s '%s': expected on or off\n", flag, v);
        return false;
    }
    *out = strcmp(v, "on") == 0;
    return true;
}

int mgt_app_arch_count(void)
{
    int n;
    mgt_arch_list(&n);
    return n;
}

void mgt_app_print_archs(FILE *f)
{
    int n;
    const mgt_arch_info *a = mgt_arch_list(&n);
    int col = 0;
    for (int i = 0; i < n; i++) {
        bool first = i == 0 || strcmp(a[i - 1].family, a[i].family) != 0;
        bool last = i + 1 == n || strcmp(a[i + 1].family, a[i].family) != 0;
        if (first)
            col = fprintf(f, "  %-14s", a[i].family);
        else if (col + 1 + (int)strlen(a[i].name) > 96) /* a long family wraps under itself */
            col = fprintf(f, "\n  %-14s", "") - 1;
        col += fprintf(f, " %s", a[i].name);
        if (last)
            fprintf(f, "\n");
    }
}

void mgt_app_print_family_defaults(FILE *f)
{
    int n;
    const mgt_arch_info *a = mgt_arch_list(&n);
    for (int i = 0, end; i < n; i = end) {
        /* the members' sides and validation resizes: one (vgg: 224, 256), a range at one side
           (resnet: its weights' 232 to 256 at 224), or each member its own (efficientnet) */
        int lo = a[i].image_size, hi = lo;
        int rlo = mgt_arch_resize_size(&a[i], lo), rhi = rlo;
        for (end = i + 1; end < n && strcmp(a[end].family, a[i].family) == 0; end++) {
            int side = a[end].image_size, r = mgt_arch_resize_size(&a[end], side);
            lo = side < lo ? side : lo;
            hi = side > hi ? side : hi;
            rlo = r < rlo ? r : rlo;
            rhi = r > rhi ? r : rhi;
        }
        char side[32], eval[64];
        if (lo <= 0)
            snprintf(side, sizeof side, "images' own size");
        else if (lo == hi)
            snprintf(side, sizeof side, "%d px", lo);
        else
            snprintf(side, sizeof side, "%d to %d px", lo, hi);
        if (a[i].eval != MGT_ARCH_EVAL_RESIZE_CROP)
            snprintf(eval, sizeof eval, "the images as they are");
        else if (lo != hi)
            snprintf(eval, sizeof eval, "resize and centre crop: each its own");
        else if (rlo == rhi)
            snprintf(eval, sizeof eval, "resize %d, centre crop %d", rlo, lo);
        else
            snprintf(eval, sizeof eval, "resize %d to %d, centre crop %d", rlo, rhi, lo);
        fprintf(f, "  %-14s %-17s %-25s %s\n", a[i].family, side,
                a[i].augment == MGT_ARCH_AUGMENT_RRC ? "rrc (RandomResizedCrop)"
                                                     : "pad-crop (4 px)",
                eval);
    }
}
