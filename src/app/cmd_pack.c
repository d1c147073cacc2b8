/* `mgtrain pack`: an ImageFolder tree into one pack file (or a folder of train.pack and
   val.pack) that training reads record by record. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "app/commands.h"
#include "mgt/data.h"

static void pack_usage(FILE *f)
{
    fprintf(f,
            "usage: mgtrain pack --data DIR --out FILE|DIR/ [--max-side N] [--format jpeg|raw]\n"
            "                    [--quality Q] [--split NAME] [-j N] [-q]\n"
            "\n"
            "Packs an ImageFolder tree (DIR/train and DIR/val, whichever exist) into FILE, one\n"
            "file holding both splits; with --out naming an existing folder or ending in '/',\n"
            "into OUT/train.pack and OUT/val.pack. DIR may also be one split folder (class\n"
            "folders directly inside): its split is named by --split (train). Training reads\n"
            "either form with --data. Every image is decoded while packing; a bad one is kept\n"
            "as a bad record with its reason, and training skips it as it would the file.\n"
            "The same tree and options give the same bytes; the file appears only complete.\n"
            "\n"
            "  --data DIR       the ImageFolder tree\n"
            "  --out FILE|DIR/  the pack file, or a folder for train.pack and val.pack\n"
            "  --format F       jpeg (default): JPEGs that fit --max-side are kept as they are,\n"
            "                   every other image is resized (as torchvision's Resize) and\n"
            "                   encoded at --quality; raw: 8-bit pixels, for small images\n"
            "  --max-side N     the longer side at most N pixels (default 256; 0: as they are)\n"
            "  --quality Q      JPEG quality of re-encoded images (default 90)\n"
            "  --split NAME     the split's name when DIR is one split folder (train)\n"
            "  -j, --workers N  threads (default: the number of cores)\n"
            "  -q, --quiet      no progress line\n");
}

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static void warn_bad(void *ctx, const char *reason)
{
    (void)ctx;
    fprintf(stderr, "mgtrain pack: warning: a bad image, kept as a bad record: %s\n", reason);
}

enum { PK_DATA = 256, PK_OUT, PK_FORMAT, PK_MAX_SIDE, PK_QUALITY, PK_SPLIT };

static int write_one(const mgt_pack_options *o, const mgt_dataset *const *ds,
                     const char *const *names, int n, const char *path)
{
    double t0 = mgt_time_now();
    mgt_pack_stats s;
    if (mgt_pack_write(o, ds, names, n, path, &s) != MGT_OK) {
        fprintf(stderr, "mgtrain pack: %s\n", mgt_error_last());
        return 1;
    }
    double dt = mgt_time_now() - t0;
    printf("%s: %zu records (%zu re-encoded, %zu bad), %.1f MB, %.1f s (%.0f images/s)\n", path,
           s.records, s.reencoded, s.bad, (double)s.file_bytes / 1e6, dt,
           dt > 0 ? (double)s.records / dt : 0.0);
    return 0;
}

int mgt_app_cmd_pack(int argc, char **argv)
{
    const char *dir = NULL, *out = NULL, *split = "train";
    mgt_pack_options o = {.format = MGT_PACK_JPEG, .max_side = 256, .quality = 90};
    long v;
    bool quiet = false;
    static const struct option opts[] = {
        {"data", required_argument, NULL, PK_DATA},
        {"out", required_argument, NULL, PK_OUT},
        {"format", required_argument, NULL, PK_FORMAT},
        {"max-side", required_argument, NULL, PK_MAX_SIDE},
        {"quality", required_argument, NULL, PK_QUALITY},
        {"split", required_argument, NULL, PK_SPLIT},
        {"workers", required_argument, NULL, 'j'},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    optind = 0;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":j:qh", opts, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case PK_DATA: dir = optarg; break;
        case PK_OUT: out = optarg; break;
        case PK_FORMAT:
            if (strcmp(optarg, "jpeg") == 0)
                o.format = MGT_PACK_JPEG;
            else if (strcmp(optarg, "raw") == 0)
                o.format = MGT_PACK_RAW;
            else {
                fprintf(stderr, "mgtrain pack: --format '%s': expected jpeg or raw\n", optarg);
                ok = false;
            }
            break;
        case PK_MAX_SIDE:
            ok = mgt_app_flag_int("--max-side", optarg, 0, 65535, &v);
            o.max_side = (int)v;
            break;
        case PK_QUALITY:
            ok = mgt_app_flag_int("--quality", optarg, 1, 100, &v);
            o.quality = (int)v;
            break;
        case PK_SPLIT:
            split = optarg;
            if (strlen(split) == 0 || strlen(split) > 15) {
                fprintf(stderr, "mgtrain pack: --split '%s': 1 to 15 characters\n", split);
                ok = false;
            }
            break;
        case 'j':
            ok = mgt_app_flag_int("-j", optarg, 1, 1024, &v);
            o.workers = (int)v;
            break;
        case 'q': quiet = true; break;
        case 'h': pack_usage(stdout); return 0;
        default: return mgt_app_bad_option("pack", c, argv);
        }
        if (!ok)
            return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "mgtrain pack: unexpected argument '%s' (try --help)\n", argv[optind]);
        return 2;
    }
    if (!dir || !out) {
        fprintf(stderr, "mgtrain pack: --data DIR and --out FILE are required (try --help)\n");
        return 2;
    }
    o.progress = !quiet && isatty(fileno(stderr)) ? stderr : NULL;
    o.bad = warn_bad;
    mgt_scan_options so = {.progress = o.progress};
    char tp[4096], vp[4096];
    snprintf(tp, sizeof tp, "%s/train", dir);
    snprintf(vp, sizeof vp, "%s/val", dir);
    mgt_dataset *tr = NULL, *va = NULL, *ds[2];
    const char *names[2];
    int n = 0;
    mgt_status st;
    if (is_dir(tp) || is_dir(vp))
        st = mgt_imagefolder_open(dir, &so, is_dir(tp) ? &tr : NULL, is_dir(vp) ? &va : NULL);
    else
        st = mgt_dataset_scan(dir, &so, &tr);
    if (tr) {
        ds[n] = tr;
        names[n++] = is_dir(tp) ? "train" : split;
    }
    if (va) {
        ds[n] = va;
        names[n++] = "val";
    }
    if (st != MGT_OK) {
        fprintf(stderr, "mgtrain pack: %s\n", mgt_error_last());
        return 1;
    }
    int rc = 0;
    size_t ol = strlen(out);
    if (is_dir(out) || (ol > 0 && out[ol - 1] == '/')) {
        if (!is_dir(out) && mkdir(out, 0755) != 0) {
            perror(out);
            rc = 1;
        }
        for (int i = 0; rc == 0 && i < n; i++) {
            char path[4096];
            snprintf(path, sizeof path, "%s%s%s.pack", out, out[ol - 1] == '/' ? "" : "/",
                     names[i]);
            const mgt_dataset *one[1] = {ds[i]};
            rc = write_one(&o, one, &names[i], 1, path);
        }
    } else {
        rc = write_one(&o, (const mgt_dataset *const *)ds, names, n, out);
    }
    mgt_dataset_free(tr);
    mgt_dataset_free(va);
    return rc;
}
