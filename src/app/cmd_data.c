/* The data subcommands: `import-idx` (Fashion-MNIST IDX -> ImageFolder PNGs), `check-data`
   (decode every file and list the bad ones) and `bench-data` (loader throughput, and how many
   devices it feeds). Numbers go through the app's one flag parser (flags.c). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "app/commands.h"
#include "mgt/data.h"

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* ---- import-idx ---- */

static void import_usage(FILE *f)
{
    fprintf(
        f,
        "usage: mgtrain import-idx [--src DIR] [--out DIR] [--per-class N] [-q]\n"
        "\n"
        "Writes Fashion-MNIST's IDX files as an ImageFolder tree of 28x28 gray PNGs:\n"
        "OUT/train/<class>/NNNNN.png (60000) and OUT/val/<class>/NNNNN.png (10000), NNNNN being\n"
        "the image's position in its IDX file. Classes, in the dataset's label order:\n"
        "T-shirt_top Trouser Pullover Dress Coat Sandal Shirt Sneaker Bag Ankle_boot\n"
        "(ImageFolder numbers them alphabetically, as torchvision would on this tree).\n"
        "Does nothing when OUT/.mgtrain-import-done says an import finished before.\n"
        "\n"
        "  --src DIR       the IDX files (default /usr/share/datasets/fashion-mnist, from\n"
        "                  Debian's dataset-fashion-mnist package)\n"
        "  --out DIR       the tree to write (default data/fashion-mnist)\n"
        "  --per-class N   only the first N images of each class of each split (data/sample:\n"
        "                  30); the same files every time\n"
        "  -q, --quiet     no progress line\n");
}

int mgt_app_cmd_import_idx(int argc, char **argv)
{
    const char *src = "/usr/share/datasets/fashion-mnist", *out = "data/fashion-mnist";
    bool quiet = false;
    long per_class = 0;
    static const struct option opts[] = {
        {"src", required_argument, NULL, 's'},
        {"out", required_argument, NULL, 'o'},
        {"per-class", required_argument, NULL, 'n'},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    optind = 0;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":qh", opts, NULL)) != -1) {
        switch (c) {
        case 's': src = optarg; break;
        case 'o': out = optarg; break;
        case 'n':
            if (!mgt_app_flag_int("--per-class", optarg, 1, 100000, &per_class))
                return 2;
            break;
        case 'q': quiet = true; break;
        case 'h': import_usage(stdout); return 0;
        default: return mgt_app_bad_option("import-idx", c, argv);
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
    mgt_status st = mgt_data_import_fashion_mnist(src, out, (size_t)per_class, progress, &already);
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
    fprintf(f, "usage: mgtrain check-data --data DIR|FILE [-j N]\n"
               "\n"
               "Scans DIR/train and DIR/val as training would (or DIR itself when it holds class\n"
               "folders directly), or reads a pack (FILE, or DIR/train.pack and DIR/val.pack),\n"
               "decodes every image and lists each bad one with the reason (in a pack also a\n"
               "record whose checksum does not match). Exit status 0 when every image decodes, 1\n"
               "when any does not or the folders are wrong.\n"
               "\n"
               "  --data DIR|FILE  the dataset\n"
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
    printf("%s: %zu %s in %d classes (%s in %.2f s)\n", mgt_dataset_dir(ds), mgt_dataset_size(ds),
           mgt_dataset_is_pack(ds) ? "records" : "files", mgt_dataset_class_count(ds),
           mgt_dataset_is_pack(ds) ? "index read" : "scanned", mgt_dataset_scan_seconds(ds));
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

/* What bench-data and check-data read from --data: the train and val splits of a tree or
   pack (val may be left NULL), or DIR itself when it is a split folder. */
static mgt_status open_data(const char *dir, const mgt_scan_options *so, mgt_dataset **train,
                            mgt_dataset **val)
{
    char p1[4096], p2[4096], p3[4096], p4[4096];
    snprintf(p1, sizeof p1, "%s/train", dir);
    snprintf(p2, sizeof p2, "%s/val", dir);
    snprintf(p3, sizeof p3, "%s/train.pack", dir);
    snprintf(p4, sizeof p4, "%s/val.pack", dir);
    if (is_file(dir)) /* a pack: its val split when it has one */
        return mgt_data_open(dir, so, train, val && mgt_pack_has_split(dir, "val") ? val : NULL);
    if (is_file(p3) || is_file(p4))
        return mgt_data_open(dir, so, is_file(p3) ? train : NULL, is_file(p4) && val ? val : NULL);
    if (is_dir(p1) || is_dir(p2))
        return mgt_imagefolder_open(dir, so, is_dir(p1) ? train : NULL,
                                    is_dir(p2) && val ? val : NULL);
    if (val)
        *val = NULL;
    return mgt_dataset_scan(dir, so, train);
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
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":j:h", opts, NULL)) != -1) {
        switch (c) {
        case 'd': dir = optarg; break;
        case 'j':
            if (!mgt_app_flag_int("-j", optarg, 1, 1024, &workers))
                return 2;
            break;
        case 'h': check_usage(stdout); return 0;
        default: return mgt_app_bad_option("check-data", c, argv);
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
    mgt_dataset *tr = NULL, *va = NULL;
    if (open_data(dir, &so, &tr, &va) != MGT_OK) {
        fprintf(stderr, "mgtrain check-data: %s\n", mgt_error_last());
        return 1;
    }
    size_t bad = 0;
    int rc = 0;
    if (tr)
        rc = check_split(tr, (int)workers, progress, &bad);
    if (rc == 0 && va)
        rc = check_split(va, (int)workers, progress, &bad);
    mgt_dataset_free(tr);
    mgt_dataset_free(va);
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
    fprintf(
        f, "usage: mgtrain bench-data --data DIR|FILE [options]\n"
           "\n"
           "Runs the loader (in host memory, no device) for a few seconds and prints images/s in\n"
           "total, per decode thread and per CPU-second, the scan's files/s, and how many devices\n"
           "that rate feeds at --step-images-per-s.\n"
           "\n"
           "  --data DIR|FILE        a dataset folder (DIR/train is used when it exists), a split\n"
           "                         folder, a pack file or a folder of packs (its train split)\n"
           "  --transform KIND       rrc (default), pad-crop or resize-crop\n"
           "  --size N               output size (default 224; pad-crop: the images' own size)\n"
           "  --channels 1|3         (default: 1 when the files are gray, else 3)\n"
           "  --interpolation M      bilinear (default), bicubic or nearest\n"
           "  --auto-augment P       ta_wide, ra or imagenet (default: none)\n"
           "  --random-erase P       RandomErasing's probability (0)\n"
           "  --exact-decode         JPEGs decoded whole at full scale (torchvision's pixels)\n"
           "  -j, --workers N        decode threads (default: the number of cores)\n"
           "  -b, --batch N          batch per replica (default 64)\n"
           "  --replicas N           shards served at once, as devices would take them (1)\n"
           "  --seconds S            how long to measure (default 5)\n"
           "  --step-images-per-s R  images/s one device trains on (e.g. from mgtrain bench):\n"
           "                         the line 'feeds N devices' divides the rate by it\n");
}

enum {
    BD_DATA = 256,
    BD_TRANSFORM,
    BD_SIZE,
    BD_CHANNELS,
    BD_REPLICAS,
    BD_SECONDS,
    BD_INTERP,
    BD_AUTO,
    BD_ERASE,
    BD_EXACT,
    BD_STEP,
};

int mgt_app_cmd_bench_data(int argc, char **argv)
{
    const char *dir = NULL, *kind_s = "rrc";
    long size = 0, channels = 0, workers = mgt_cpu_count(), batch = 64, replicas = 1, seconds = 5;
    double erase = 0, step_rate = 0;
    bool exact = false;
    mgt_interp interp = MGT_INTERP_BILINEAR;
    mgt_auto_augment aa = MGT_AUTO_AUGMENT_NONE;
    static const struct option opts[] = {
        {"data", required_argument, NULL, BD_DATA},
        {"transform", required_argument, NULL, BD_TRANSFORM},
        {"size", required_argument, NULL, BD_SIZE},
        {"channels", required_argument, NULL, BD_CHANNELS},
        {"workers", required_argument, NULL, 'j'},
        {"batch", required_argument, NULL, 'b'},
        {"replicas", required_argument, NULL, BD_REPLICAS},
        {"seconds", required_argument, NULL, BD_SECONDS},
        {"interpolation", required_argument, NULL, BD_INTERP},
        {"auto-augment", required_argument, NULL, BD_AUTO},
        {"random-erase", required_argument, NULL, BD_ERASE},
        {"exact-decode", no_argument, NULL, BD_EXACT},
        {"step-images-per-s", required_argument, NULL, BD_STEP},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    optind = 0;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":j:b:h", opts, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case BD_DATA: dir = optarg; break;
        case BD_TRANSFORM: kind_s = optarg; break;
        case BD_SIZE: ok = mgt_app_flag_int("--size", optarg, 1, 8192, &size); break;
        case BD_CHANNELS:
            ok = mgt_app_flag_int("--channels", optarg, 1, 3, &channels);
            if (ok && channels == 2) {
                fprintf(stderr, "mgtrain: --channels must be 1 or 3\n");
                ok = false;
            }
            break;
        case 'j': ok = mgt_app_flag_int("-j", optarg, 0, 1024, &workers); break;
        case 'b': ok = mgt_app_flag_int("-b", optarg, 1, 65536, &batch); break;
        case BD_REPLICAS:
            ok = mgt_app_flag_int("--replicas", optarg, 1, MGT_MAX_DEVICES, &replicas);
            break;
        case BD_SECONDS: ok = mgt_app_flag_int("--seconds", optarg, 1, 3600, &seconds); break;
        case BD_INTERP:
        case BD_AUTO:
            if ((c == BD_INTERP ? mgt_interp_parse(optarg, &interp)
                                : mgt_auto_augment_parse(optarg, &aa)) != MGT_OK) {
                fprintf(stderr, "mgtrain: %s\n", mgt_error_last());
                ok = false;
            }
            break;
        case BD_ERASE: ok = mgt_app_flag_float("--random-erase", optarg, 0, 1, &erase); break;
        case BD_EXACT: exact = true; break;
        case BD_STEP:
            ok = mgt_app_flag_float("--step-images-per-s", optarg, 1e-3, 1e9, &step_rate);
            break;
        case 'h': bench_usage(stdout); return 0;
        default: return mgt_app_bad_option("bench-data", c, argv);
        }
        if (!ok)
            return 2;
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

    mgt_scan_options so = {.progress = isatty(fileno(stderr)) ? stderr : NULL};
    mgt_dataset *ds = NULL;
    mgt_loader *l = NULL;
    int rc = 1;
    if (open_data(dir, &so, &ds, NULL) != MGT_OK)
        goto fail;
    if (!ds) {
        mgt_error_set(MGT_ERR_INVALID, "%s: no training split", dir);
        goto fail;
    }
    double scan_s = mgt_dataset_scan_seconds(ds);
    printf("scan: %s: %zu files, %d classes in %.3f s (%.0f files/s)\n", mgt_dataset_dir(ds),
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
    t.interp = interp;
    t.auto_augment = aa;
    t.random_erase = (float)erase;
    t.exact_decode = exact;
    if (mgt_transform_check(&t) != MGT_OK)
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
    uint64_t base = 0, growths0 = 0;
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
            growths0 = mgt_loader_buffer_growths(l);
            cpu0 = cpu_seconds();
        } else if (t_start > 0 && now - t_start >= (double)seconds) {
            break;
        }
    }
    double dt = mgt_time_now() - t_start, cpu = cpu_seconds() - cpu0;
    double images = (double)(mgt_loader_images_done(l) - base), ips = images / dt;
    printf("loader: %s, %s %ldx%ld, %ld channel%s, %s, batch %ld x %ld replica%s, -j %ld%s%s%s\n",
           mgt_dataset_dir(ds), kind_s, size, size, channels, channels == 1 ? "" : "s",
           mgt_interp_name(interp), batch, replicas, replicas == 1 ? "" : "s", workers,
           exact ? ", exact decode" : "", aa ? ", auto-augment " : "",
           aa ? mgt_auto_augment_name(aa) : "");
    printf("loader: %.0f images/s, %.0f images/s per decode thread, %.0f images per CPU-second, "
           "mean wait %.2f ms per batch, %zu bad files, %llu buffer growths while measured\n",
           ips, ips / (double)(workers > 0 ? workers : 1), cpu > 0 ? images / cpu : 0.0,
           batches ? 1e3 * waited / (double)batches : 0.0, mgt_loader_bad_count(l),
           (unsigned long long)(mgt_loader_buffer_growths(l) - growths0));
    if (step_rate > 0)
        printf("loader: feeds %.1f devices that each train on %.0f images/s\n", ips / step_rate,
               step_rate);
    rc = 0;
fail:
    if (rc != 0)
        fprintf(stderr, "mgtrain bench-data: %s\n", mgt_error_last());
    mgt_loader_free(l);
    mgt_dataset_free(ds);
    return rc;
}
