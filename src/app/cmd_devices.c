/* `mgtrain devices`: the devices a run would use, their memory and who reaches whom directly. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/commands.h"

static void devices_usage(FILE *f)
{
    fprintf(f, "usage: mgtrain devices [--device auto|cuda|cpu] [--gpus LIST] [--mock SPEC]\n"
               "                       [--no-p2p] [--no-bandwidth] [--copy-mb N]\n"
               "  --device               which devices to list (auto: CUDA where present, else\n"
               "                         CPU mock)\n"
               "  --gpus                 device ids, e.g. 0,1,2,3 (ids may repeat)\n"
               "  --mock                 mock-device options, e.g. 'threads=1;mem=2G;peers=0-1'\n"
               "                         (see README)\n"
               "  --no-bandwidth         skip measuring the copy rate of every pair\n"
               "  --copy-mb N            bytes per timed copy, in MiB (64)\n" MGT_APP_SWITCH_USAGE);
}

int mgt_app_cmd_devices(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"device", required_argument, NULL, 'd'},
        {"gpus", required_argument, NULL, 'g'},
        {"mock", required_argument, NULL, 'm'},
        {"no-bandwidth", no_argument, NULL, 'B'},
        {"copy-mb", required_argument, NULL, 'C'},
        {"help", no_argument, NULL, 'h'},
        MGT_APP_SWITCH_LONGOPTS,
        {NULL, 0, NULL, 0},
    };
    mgt_app_devices devs = {0};
    bool bandwidth = true;
    long copy_mb = 64;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'd':
            if (mgt_app_parse_device_kind(optarg, &devs.kind) != MGT_OK) {
                fprintf(stderr, "mgtrain devices: %s\n", mgt_error_last());
                return 2;
            }
            break;
        case 'g': devs.gpus = optarg; break;
        case 'm': devs.mock = optarg; break;
        case 'B': bandwidth = false; break;
        case 'C':
            if (!mgt_app_flag_int("--copy-mb", optarg, 1, 4096, &copy_mb))
                return 2;
            break;
        case 'h': devices_usage(stdout); return 0;
        default:
            if (mgt_app_device_switch(c, &devs.sw))
                break;
            fprintf(stderr, "mgtrain devices: unknown or incomplete option '%s'\n",
                    argv[optind - 1]);
            devices_usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "mgtrain devices: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    int cuda = 0;
    if (mgt_device_kind_probe(MGT_DEVICE_CUDA, &cuda) == MGT_OK)
        printf("CUDA: available, %d device%s\n", cuda, cuda == 1 ? "" : "s");
    else
        printf("CUDA: %s\n", mgt_error_last());
    char versions[256];
    mgt_device_kind_versions(MGT_DEVICE_CUDA, versions, sizeof versions);
    if (versions[0])
        printf("CUDA libraries: %s\n", versions);
    mgt_devset *set;
    mgt_status st = mgt_app_open_devices(&devs, 0, &set);
    if (st != MGT_OK) {
        fprintf(stderr, "mgtrain devices: %s\n", mgt_error_last());
        return mgt_app_device_exit(st);
    }
    int n = mgt_devset_count(set);
    bool is_mock = mgt_devset_kind(set) == MGT_DEVICE_MOCK;
    printf("%d %s device%s:\n", n, is_mock ? "mock (CPU)" : "CUDA", n == 1 ? "" : "s");
    printf("  %-6s %-5s %-48s %12s\n", "index", "id", "name", "memory");
    for (int i = 0; i < n; i++) {
        mgt_device *d = mgt_devset_device(set, i);
        size_t total;
        mgt_device_memory(d, NULL, &total);
        printf("  %-6d %-5d %-48s %8.1f GiB\n", i, mgt_device_id(d), mgt_device_name(d),
               (double)total / (1024.0 * 1024.0 * 1024.0));
    }
    /* P: direct (on CUDA: reported by the driver and verified by copying a pattern both
       ways at start), H: staged */
    printf("peer access (row copies to column; P = direct peer copy, verified at start, H = "
           "staged through pinned host memory%s):\n      ",
           devs.sw.no_p2p ? "; --no-p2p stages every pair" : "");
    for (int j = 0; j < n; j++)
        printf(" %3d", j);
    printf("\n");
    for (int i = 0; i < n; i++) {
        printf("  %3d ", i);
        for (int j = 0; j < n; j++)
            printf(" %3s", i == j ? "-" : mgt_devset_can_access_peer(set, i, j) ? "P" : "H");
        printf("\n");
    }
    int rc = 0;
    if (bandwidth && n > 1) {
        size_t bytes = (size_t)copy_mb << 20;
        printf("copy rate, GB/s (row copies to column; best of 3 copies of %ld MiB):\n      ",
               copy_mb);
        for (int j = 0; j < n; j++)
            printf(" %7d", j);
        printf("\n");
        for (int i = 0; i < n && rc == 0; i++) {
            printf("  %3d ", i);
            for (int j = 0; j < n; j++) {
                double rate = 0;
                if (i == j) {
                    printf(" %7s", "-");
                } else if (mgt_devset_copy_rate(set, i, j, bytes, 3, &rate) != MGT_OK) {
                    printf("\n");
                    fprintf(stderr, "mgtrain devices: copy %d -> %d: %s\n", i, j, mgt_error_last());
                    rc = 1;
                    break;
                } else {
                    printf(" %7.1f", rate / 1e9);
                }
            }
            if (rc == 0)
                printf("\n");
            fflush(stdout);
        }
    }
    mgt_devset_free(set);
    return rc;
}
