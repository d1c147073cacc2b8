/* Measures GFLOP/s of the CPU fast path's gemm and convolutions per thread count. */

/* The kernels run directly through cpu_run (no device streams). The convolutions run on
   both paths of the fast kernels, oneDNN's direct kernels and mgtrain's im2col + gemm, side by
   side; --ref also times the plain reference for them. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device/cpu/kernels.h"
#include "mgt/thread.h"

#define MAX_THREAD_COUNTS 8
#define MAX_RESULTS (2 * MAX_THREAD_COUNTS + 1)
#define MAX_REPEATS 1000

typedef struct bench_case {
    const char *name;
    char shape[64];
    mgt_op op;
    bool conv; /* the reference is timed for these with --ref */
} bench_case;

typedef struct result {
    int threads; /* 0: the reference */
    bool im2col; /* the im2col + gemm path rather than oneDNN's */
    double median_s, gflops;
    double cpu_s; /* process CPU time of the median-wall run's peers: all threads, spinning too */
} result;

/* CPU seconds of the whole process. On a shared machine wall time also counts the time other
   programs held our cores; for one thread, CPU time is close to what an idle machine gives. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_kernels [--threads 1,2] [--repeats N] [--ref] [--json FILE]\n"
               "  --threads LIST  thread counts of the CPU kernel context (default 1,2)\n"
               "  --repeats N     timed runs per case after one warm-up; the median is shown "
               "(default 7)\n"
               "  --ref           also time the plain reference once per convolution pass\n"
               "  --json FILE     write the results as JSON to FILE\n"
               "The speed column is wall-time speed relative to the first row of each kernel;\n"
               "'i2c' rows are the convolutions on the im2col + gemm path instead of oneDNN.\n");
}

static float *rand_buf(size_t n, unsigned *seed)
{
    float *p = malloc(n * sizeof *p);
    if (p == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        p[i] = (float)(*seed >> 8) / (float)(1u << 24) - 0.5f;
    }
    return p;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int parse_threads(const char *s, int *out, int *n)
{
    *n = 0;
    while (*s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno != 0 || v < 1 || v > 1024 || *n == MAX_THREAD_COUNTS)
            return -1;
        out[(*n)++] = (int)v;
        s = end;
        if (*s == ',')
            s++;
        else if (*s != '\0')
            return -1;
    }
    return *n > 0 ? 0 : -1;
}

/* One warm-up (it also grows the ctx's scratch), then `repeats` timed runs; the medians of
   wall and of CPU time. */
static int time_fast(cpu_ctx *ctx, const mgt_op *op, int repeats, double *median,
                     double *cpu_median)
{
    double t[MAX_REPEATS], c[MAX_REPEATS];
    for (int i = -1; i < repeats; i++) {
        double t0 = mgt_time_now(), c0 = cpu_now();
        if (cpu_run(ctx, op) != MGT_OK) {
            fprintf(stderr, "bench_kernels: %s: %s\n", mgt_op_name(op->kind), mgt_error_last());
            return -1;
        }
        if (i >= 0) {
            t[i] = mgt_time_now() - t0;
            c[i] = cpu_now() - c0;
        }
    }
    qsort(t, (size_t)repeats, sizeof *t, cmp_double);
    qsort(c, (size_t)repeats, sizeof *c, cmp_double);
    *median = t[repeats / 2];
    *cpu_median = c[repeats / 2];
    return 0;
}

static int write_json(const char *path, const bench_case *cases, int ncases,
                      result res[][MAX_RESULTS], const int *nres, int repeats)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "bench_kernels: %s: %s\n", path, strerror(errno));
        return -1;
    }
    fprintf(f, "{\n  \"repeats\": %d,\n  \"results\": [\n", repeats);
    bool first = true;
    for (int c = 0; c < ncases; c++)
        for (int r = 0; r < nres[c]; r++) {
            const result *x = &res[c][r];
            fprintf(f,
                    "%s    {\"kernel\": \"%s\", \"shape\": \"%s\", \"impl\": \"%s\", "
                    "\"threads\": %d, \"median_ms\": %.4f, \"gflops\": %.3f, "
                    "\"cpu_ms\": %.4f}",
                    first ? "" : ",\n", cases[c].name, cases[c].shape,
                    !x->threads ? "reference"
                    : x->im2col ? "im2col"
                                : "cpu",
                    x->threads ? x->threads : 1, x->median_s * 1e3, x->gflops, x->cpu_s * 1e3);
            first = false;
        }
    fprintf(f, "\n  ]\n}\n");
    if (ferror(f) | (fclose(f) != 0)) {
        fprintf(stderr, "bench_kernels: writing %s failed\n", path);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int threads[MAX_THREAD_COUNTS] = {1, 2}, nthreads = 2, repeats = 7;
    bool with_ref = false;
    const char *json = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--ref") == 0) {
            with_ref = true;
        } else if (strcmp(a, "--threads") == 0 && i + 1 < argc) {
            if (parse_threads(argv[++i], threads, &nthreads) != 0) {
                fprintf(stderr,
                        "bench_kernels: --threads wants a list such as 1,2 (each 1..1024,"
                        " at most %d), got \"%s\"\n",
                        MAX_THREAD_COUNTS, argv[i]);
                return 2;
            }
        } else if (strcmp(a, "--repeats") == 0 && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end != '\0' || v < 1 || v > MAX_REPEATS) {
                fprintf(stderr, "bench_kernels: --repeats wants 1..%d, got \"%s\"\n", MAX_REPEATS,
                        argv[i]);
                return 2;
            }
            repeats = (int)v;
        } else if (strcmp(a, "--json") == 0 && i + 1 < argc) {
            json = argv[++i];
        } else {
            fprintf(stderr, "bench_kernels: unknown or incomplete argument \"%s\"\n", a);
            usage(stderr);
            return 2;
        }
    }

    /* sgemm 1024^3 and a ResNet-style 3x3 16->16 layer at batch 128 on 28x28 */
    const int M = 1024;
    mgt_conv2d_shape sh = {.n = 128,
                           .c = 16,
                           .h = 28,
                           .w = 28,
                           .k = 16,
                           .r = 3,
                           .s = 3,
                           .stride_h = 1,
                           .stride_w = 1,
                           .pad_h = 1,
                           .pad_w = 1,
                           .groups = 1};
    size_t nx = (size_t)sh.n * sh.c * sh.h * sh.w;
    size_t ny = (size_t)sh.n * sh.k * mgt_conv2d_out_h(&sh) * mgt_conv2d_out_w(&sh);
    size_t nw = (size_t)sh.k * sh.c * sh.r * sh.s;
    unsigned seed = 12345;
    float *a = rand_buf((size_t)M * M, &seed), *b = rand_buf((size_t)M * M, &seed);
    float *c = rand_buf((size_t)M * M, &seed), *x = rand_buf(nx, &seed);
    float *y = rand_buf(ny, &seed), *w = rand_buf(nw, &seed), *dx = rand_buf(nx, &seed);
    float *dw = rand_buf(nw, &seed);
    int rc = 1;
    cpu_ctx ctx;
    bool have_ctx = false;
    if (!a || !b || !c || !x || !y || !w || !dx || !dw) {
        fprintf(stderr, "bench_kernels: out of memory\n");
        goto done;
    }

    bench_case cases[4] = {
        {.name = "sgemm",
         .op = {.kind = MGT_OP_GEMM,
                .u.gemm = {false, false, M, M, M, 1.0f, a, M, b, M, 0.0f, c, M}}},
        {.name = "conv2d_forward",
         .conv = true,
         .op = {.kind = MGT_OP_CONV2D_FWD, .u.conv = {y, x, w, sh, 0.0f}}},
        {.name = "conv2d_backward_data",
         .conv = true,
         .op = {.kind = MGT_OP_CONV2D_BWD_DATA, .u.conv = {dx, y, w, sh, 0.0f}}},
        {.name = "conv2d_backward_filter",
         .conv = true,
         .op = {.kind = MGT_OP_CONV2D_BWD_FILTER, .u.conv = {dw, y, x, sh, 0.0f}}},
    };
    const int ncases = 4;
    snprintf(cases[0].shape, sizeof cases[0].shape, "%dx%dx%d", M, M, M);
    for (int i = 1; i < ncases; i++)
        snprintf(cases[i].shape, sizeof cases[i].shape, "n%d %d->%d %dx%d 3x3 s1 p1", sh.n, sh.c,
                 sh.k, sh.h, sh.w);
    for (int i = 0; i < ncases; i++)
        if (mgt_op_check(&cases[i].op) != MGT_OK) {
            fprintf(stderr, "bench_kernels: %s\n", mgt_error_last());
            goto done;
        }

    result res[4][MAX_RESULTS];
    int nres[4] = {0};
    for (int t = 0; t < nthreads; t++) {
        if (cpu_ctx_init(&ctx, threads[t]) != MGT_OK) {
            fprintf(stderr, "bench_kernels: %s\n", mgt_error_last());
            goto done;
        }
        have_ctx = true;
        for (int path = 0; path < 2; path++) {
            ctx.conv_im2col = path == 1;
            for (int i = 0; i < ncases; i++) {
                double med, cpu;
                if (path == 1 && !cases[i].conv)
                    continue;
                if (time_fast(&ctx, &cases[i].op, repeats, &med, &cpu) != 0)
                    goto done;
                res[i][nres[i]++] = (result){threads[t], path == 1, med,
                                             mgt_op_flops(&cases[i].op) / med * 1e-9, cpu};
            }
        }
        cpu_ctx_destroy(&ctx);
        have_ctx = false;
    }
    if (with_ref)
        for (int i = 0; i < ncases; i++) {
            if (!cases[i].conv)
                continue;
            double t0 = mgt_time_now(), c0 = cpu_now();
            if (mgt_ref_run(&cases[i].op) != MGT_OK) {
                fprintf(stderr, "bench_kernels: reference: %s\n", mgt_error_last());
                goto done;
            }
            double s = mgt_time_now() - t0;
            res[i][nres[i]++] =
                (result){0, false, s, mgt_op_flops(&cases[i].op) / s * 1e-9, cpu_now() - c0};
        }

    printf("CPU kernels, median of %d runs after one warm-up (%d cores online)\n", repeats,
           mgt_cpu_count());
    printf("GFLOP/s from wall time; cpu ms is the process's CPU time per run (all threads), "
           "which a busy machine inflates less\n\n");
    printf("%-23s %-28s %-10s %9s %8s %8s %7s\n", "kernel", "shape", "impl", "wall ms", "GFLOP/s",
           "cpu ms", "speed");
    for (int i = 0; i < ncases; i++)
        for (int r = 0; r < nres[i]; r++) {
            const result *x0 = &res[i][0], *xr = &res[i][r];
            char impl[24];
            if (xr->threads)
                snprintf(impl, sizeof impl, "%d thr%s", xr->threads, xr->im2col ? " i2c" : "");
            else
                snprintf(impl, sizeof impl, "reference");
            printf("%-23s %-28s %-10s %9.2f %8.2f %8.2f %6.2fx\n", r == 0 ? cases[i].name : "",
                   r == 0 ? cases[i].shape : "", impl, xr->median_s * 1e3, xr->gflops,
                   xr->cpu_s * 1e3, x0->median_s / xr->median_s);
        }
    if (json != NULL && write_json(json, cases, ncases, res, nres, repeats) != 0)
        goto done;
    rc = 0;
done:
    if (have_ctx)
        cpu_ctx_destroy(&ctx);
    free(a);
    free(b);
    free(c);
    free(x);
    free(y);
    free(w);
    free(dx);
    free(dw);
    return rc;
}
