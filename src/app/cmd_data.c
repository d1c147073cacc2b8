/* The data subcommands: `import-idx` (Fashion-MNIST IDX -> ImageFolder PNGs), `check-data`
   (decode every file and list the bad ones) and `bench-data` (loader throughput). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "app/commands.h"
#include "mgt/data.h"

static bool parse_long(const char *cmd, const char *flag, const char *s, long lo, long hi,
                       long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "mgtrain %s: %s '%s': expected a whole number from %ld to %ld\n", cmd, flag,
                s, lo, hi);
        return false;
    }
    *out = v;
    return true;
}

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* ---- import-idx ---- */

static void import_usage(FILE *f)
{
    fprintf(
        f,
        "usage: mgtrain import-idx [--src DIR] [--out DIR] [-q]\n"
        "\n"
        "Writes Fashion-MNIST's IDX files as an ImageFolder tree of 28x28 gray PNGs:\n"
        "OUT/train/<class>/NNNNN.png (60000) and OUT/val/<class>/NNNNN.png (10000), NNNNN being\n"
        "the image's position in its IDX file. Classes, in the dataset's label order:\n"
        "T-shirt_top Trouser Pullover Dress Coat Sandal Shirt Sneaker Bag Ankle_boot\n"
        "(ImageFolder numbers them alphabetically, as torchvision would on this tree).\n"
        "Does nothing when OUT/.mgtrain-import-done says an import finished before.\n"
        "\n"
        "  --src DIR   the IDX files (default /usr/share/datasets/fashion-mnist, from Debian's\n"
        "              dataset-fashion-mnist package)\n"
        "  --out DIR   the tree to write (default data/fashion-mnist)\n"
        "  -q, --quiet no progress line\n");
}

int mgt_app_cmd_import_idx(int argc, char **argv)
{
    const char *src = "/usr/share/datasets/fashion-mnist", *out = "data/fashion-mnist";
    bool quiet = false;
    static const struct option opts[] = {
        {"src", required_argument, NULL, 's'},
        {"out", required_argument, NULL, 'o'},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    optind = 0;
    int c;
    while ((c = getopt_long(argc, argv, "qh", opts, NULL)) != -1) {
        switch (c) {
        case 's': src = optarg; break;
        case 'o': out = optarg; break;
        case 'q': quiet = true; break;
        case 'h': import_usage(stdout); return 0;
        default: fprintf(stderr, "mgtrain import-idx: try --help\n"); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "mgtrain import-idx: unexpected argument '%s' (try --help)\n",
                argv[optind]);
        return 2;
    }
    bool already = false;
    double t0 = mgt_time_now();
    FILE *progress = !quiet && isatty(fileno(stderr)) ? stderr : NULL;
    mgt_status st = mgt_data_import_fashion_mnist(src, out, progress, &already);
    if (st != MGT_OK) {
        fprintf(stderr, "mgtrain import-idx: %s\n", mgt_error_last());
        return 1;
    }
    if (already)
        printf("%s: already imported (remove %s/.mgtrain-import-done to import again)\n", out, out);
    else
        printf("%s: Fashion-MNIST imported in %.1f s\n", out, mgt_time_now() - t0);
    return 0;
}

/* ---- check-data ---- */

static void check_usage(FILE *f)
{
    fprintf(f,
            "usage: mgtrain check-data --data DIR [-j N]\n"
            "\n"
            "Scans DIR/train and DIR/val as training would (or DIR itself when it holds class\n"
            "folders directly), decodes every image file and lists each bad one with the reason.\n"
            "Exit status 0 when every file decodes, 1 when any does not or the folders are wrong.\n"
            "\n"
            "  --data DIR       the dataset folder\n"
            "  -j, --workers N  decode threads (default: the number of cores)\n");
}

static void report_bad(void *ctx, size_t index, const char *reason)
{
    (void)ctx;
    (void)index;
    printf("bad: %s\n", reason);
}

static int check_split(const mgt_dataset *ds, int workers, FILE *progress, size_t *bad)
{
    printf("%s: %zu files in %d classes (scanned in %.2f s)\n", mgt_dataset_dir(ds),
           mgt_dataset_size(ds), mgt_dataset_class_count(ds), mgt_dataset_scan_seconds(ds));
    fflush(stdout);
    size_t b = 0;
    mgt_status st = mgt_data_check(ds, workers, NULL, progress, report_bad, NULL, &b);
    if (st != MGT_OK) {
        fprintf(stderr, "mgtrain check-data: %s\n", mgt_error_last());
        return 1;
    }
    *bad += b;
    return 0;
}

int mgt_app_cmd_check_data(int argc, char **argv)
{
    const char *dir = NULL;
    long workers = 0;
    static const struct option opts[] = {
        {"data", required_argument, NULL, 'd'},
        {"workers", required_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    optind = 0;
    int c;
    while ((c = getopt_long(argc, argv, "j:h", opts, NULL)) != -1) {
        switch (c) {
        case 'd': dir = optarg; break;
        case 'j':
            if (!parse_long("check-data", "-j", optarg, 1, 1024, &workers))
                return 2;
            break;
        case 'h': check_usage(stdout); return 0;
        default: fprintf(stderr, "mgtrain check-data: try --help\n"); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "mgtrain check-data: unexpected argument '%s' (try --help)\n",
                argv[optind]);
        return 2;
    }
    if (!dir) {
        fprintf(stderr, "mgtrain check-data: --data DIR is required (try --help)\n");
        return 2;
    }
    FILE *progress = isatty(fileno(stderr)) ? stderr : NULL;
    mgt_scan_options so = {.progress = progress};
    char train_dir[4096], val_dir[4096];
    snprintf(train_dir, sizeof train_dir, "%s/train", dir);
    snprintf(val_dir, sizeof val_dir, "%s/val", dir);
    size_t bad = 0;
    int rc = 0;
    if (is_dir(train_dir) || is_dir(val_dir)) {
        mgt_dataset *tr = NULL, *va = NULL;
        mgt_status st = mgt_imagefolder_open(dir, &so, &tr, &va);
        if (st != MGT_OK) {
            fprintf(stderr, "mgtrain check-data: %s\n", mgt_error_last());
            return 1;
        }
        rc = check_split(tr, (int)workers, progress, &bad);
        if (rc == 0)
            rc = check_split(va, (int)workers, progress, &bad);
        mgt_dataset_free(tr);
        mgt_dataset_free(va);
    } else {
        mgt_dataset *ds = NULL;
        if (mgt_dataset_scan(dir, &so, &ds) != MGT_OK) {
            fprintf(stderr, "mgtrain check-data: %s\n", mgt_error_last());
            return 1;
        }
        rc = check_split(ds, (int)workers, progress, &bad);
        mgt_dataset_free(ds);
    }
    if (rc != 0)
        return rc;
    if (bad > 0) {
        printf("%s: %zu bad files\n", dir, bad);
        return 1;
    }
    printf("%s: every file decodes\n", dir);
    return 0;
}

/* ---- bench-data ---- */

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
           (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

static void bench_usage(FILE *f)
{
    fprintf(f,
            "usage: mgtrain bench-data --data DIR [options]\n"
            "\n"
            "Runs the loader (in host memory, no device) for a few seconds and prints images/s in\n"
            "total and per decode thread, and the scan's files/s.\n"
            "\n"
            "  --data DIR        a dataset folder (DIR/train is used when it exists) or a split\n"
            "  --transform KIND  rrc (default), pad-crop or resize-crop\n"
            "  --size N          output size (default 224; pad-crop: the images' own size)\n"
            "  --channels 1|3    (default: 1 when the files are gray, else 3)\n"
            "  -j, --workers N   decode threads (default: the number of cores)\n"
            "  -b, --batch N     batch per replica (default 64)\n"
            "  --replicas N      shards served at once, as devices would take them (default 1)\n"
            "  --seconds S       how long to measure (default 5)\n");
}

int mgt_app_cmd_bench_data(int argc, char **argv)
{
    const char *dir = NULL, *kind_s = "rrc";
    long size = 0, channels = 0, workers = mgt_cpu_count(), batch = 64, replicas = 1, seconds = 5;
    static const struct option opts[] = {
        {"data", required_argument, NULL, 'd'},     {"transform", required_argument, NULL, 't'},
        {"size", required_argument, NULL, 's'},     {"channels", required_argument, NULL, 'c'},
        {"workers", required_argument, NULL, 'j'},  {"batch", required_argument, NULL, 'b'},
        {"replicas", required_argument, NULL, 'r'}, {"seconds", required_argument, NULL, 'S'},
        {"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0},
    };
    optind = 0;
    int c;
    const char *cmd = "bench-data";
    while ((c = getopt_long(argc, argv, "j:b:h", opts, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case 'd': dir = optarg; break;
        case 't': kind_s = optarg; break;
        case 's': ok = parse_long(cmd, "--size", optarg, 1, 8192, &size); break;
        case 'c':
            ok = parse_long(cmd, "--channels", optarg, 1, 3, &channels) && channels != 2;
            break;
        case 'j': ok = parse_long(cmd, "-j", optarg, 0, 1024, &workers); break;
        case 'b': ok = parse_long(cmd, "-b", optarg, 1, 65536, &batch); break;
        case 'r': ok = parse_long(cmd, "--replicas", optarg, 1, MGT_MAX_DEVICES, &replicas); break;
        case 'S': ok = parse_long(cmd, "--seconds", optarg, 1, 3600, &seconds); break;
        case 'h': bench_usage(stdout); return 0;
        default: fprintf(stderr, "mgtrain bench-data: try --help\n"); return 2;
        }
        if (!ok) {
            if (c == 'c')
                fprintf(stderr, "mgtrain bench-data: --channels must be 1 or 3\n");
            return 2;
        }
    }
    if (optind < argc || !dir) {
        fprintf(stderr, "mgtrain bench-data: %s (try --help)\n",
                dir ? "unexpected argument" : "--data DIR is required");
        return 2;
    }
    mgt_transform_kind kind;
    if (strcmp(kind_s, "rrc") == 0)
        kind = MGT_TRANSFORM_RRC;
    else if (strcmp(kind_s, "pad-crop") == 0)
        kind = MGT_TRANSFORM_PAD_CROP;
    else if (strcmp(kind_s, "resize-crop") == 0)
        kind = MGT_TRANSFORM_RESIZE_CROP;
    else {
        fprintf(stderr,
                "mgtrain bench-data: --transform '%s': expected rrc, pad-crop or resize-crop\n",
                kind_s);
        return 2;
    }

    char split[4096];
    snprintf(split, sizeof split, "%s/train", dir);
    if (!is_dir(split))
        snprintf(split, sizeof split, "%s", dir);
    mgt_scan_options so = {.progress = isatty(fileno(stderr)) ? stderr : NULL};
    mgt_dataset *ds = NULL;
    mgt_loader *l = NULL;
    int rc = 1;
    if (mgt_dataset_scan(split, &so, &ds) != MGT_OK)
        goto fail;
    double scan_s = mgt_dataset_scan_seconds(ds);
    printf("scan: %s: %zu files, %d classes in %.3f s (%.0f files/s)\n", split,
           mgt_dataset_size(ds), mgt_dataset_class_count(ds), scan_s,
           scan_s > 0 ? (double)mgt_dataset_size(ds) / scan_s : 0.0);
    int pw = 0, ph = 0, pc = 3;
    if (mgt_dataset_probe(ds, 64, &pw, &ph, &pc) != MGT_OK)
        goto fail;
    if (!channels)
        channels = pc;
    if (!size)
        size = kind == MGT_TRANSFORM_PAD_CROP ? (pw < ph ? pw : ph) : 224;
    mgt_transform t;
    if (mgt_transform_init(&t, kind, (int)size, (int)channels) != MGT_OK)
        goto fail;
    mgt_loader_options o;
    mgt_loader_options_init(&o, ds, &t, (int)replicas, (int)batch);
    o.workers = (int)workers;
    o.bad.warn = stderr;
    if (mgt_loader_create(&o, &l) != MGT_OK)
        goto fail;
    if (mgt_loader_set_epoch(l, 0, 0) != MGT_OK)
        goto fail;

    /* one consumer takes every replica's batches in turn, as lock-stepped devices would;
       on a shared machine wall time undercounts what a thread can do, so the process's CPU
       time is reported beside it */
    double t0 = mgt_time_now(), warm_end = t0 + 0.5, t_start = 0;
    uint64_t base = 0;
    double cpu0 = 0;
    long batches = 0;
    double waited = 0;
    for (;;) { /* a continuous loader runs on into the next epoch by itself */
        for (int r = 0; r < (int)replicas; r++) {
            mgt_batch b;
            if (mgt_loader_next(l, r, NULL, &b) != MGT_OK)
                goto fail;
            if (t_start > 0) {
                waited += b.wait_s;
                batches++;
            }
        }
        double now = mgt_time_now();
        if (t_start == 0 && now >= warm_end) { /* the first half second fills the queues */
            t_start = now;
            base = mgt_loader_images_done(l);
            cpu0 = cpu_seconds();
        } else if (t_start > 0 && now - t_start >= (double)seconds) {
            break;
        }
    }
    double dt = mgt_time_now() - t_start, cpu = cpu_seconds() - cpu0;
    double images = (double)(mgt_loader_images_done(l) - base), ips = images / dt;
    printf("loader: %s, %s %ldx%ld, %ld channel%s, batch %ld x %ld replica%s, -j %ld\n", split,
           kind_s, size, size, channels, channels == 1 ? "" : "s", batch, replicas,
           replicas == 1 ? "" : "s", workers);
    printf("loader: %.0f images/s, %.0f images/s per decode thread, %.0f images per CPU-second, "
           "mean wait %.2f ms per batch, %zu bad files\n",
           ips, ips / (double)(workers > 0 ? workers : 1), cpu > 0 ? images / cpu : 0.0,
           batches ? 1e3 * waited / (double)batches : 0.0, mgt_loader_bad_count(l));
    rc = 0;
fail:
    if (rc != 0)
        fprintf(stderr, "mgtrain bench-data: %s\n", mgt_error_last());
    mgt_loader_free(l);
    mgt_dataset_free(ds);
    return rc;
}
