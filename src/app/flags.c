/* Numeric flag values, checked against their range with a message naming the flag. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/commands.h"

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
