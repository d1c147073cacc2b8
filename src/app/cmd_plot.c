/* `mgtrain plot LOG.jsonl [LOG2.jsonl ...] [-o curves.svg]`: training curves from --log files,
   several overlaid for comparison (mgt_train_plot_curves). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "app/commands.h"
#include "mgt/train.h"

static void plot_usage(FILE *f)
{
    fprintf(f, "usage: mgtrain plot LOG.jsonl [LOG.jsonl ...] [-o FILE.svg] [--label NAME ...]\n"
               "\n"
               "Draws loss, top-1 and learning rate against epochs from the JSON logs that\n"
               "`mgtrain --log` writes: training per progress line (solid), validation per\n"
               "epoch (dashed) and the EMA model's (dotted), each log in its own colour.\n"
               "\n"
               "  -o, --out FILE.svg  where the chart goes (curves.svg)\n"
               "  --label NAME        the next log's name in the legend (default: its file\n"
               "                      name); once per log, in order\n");
}

int mgt_app_cmd_plot(int argc, char **argv)
{
    static const struct option opts[] = {{"out", required_argument, NULL, 'o'},
                                         {"label", required_argument, NULL, 'l'},
                                         {"help", no_argument, NULL, 'h'},
                                         {0, 0, 0, 0}};
    const char *out = "curves.svg";
    const char *labels[6] = {0};
    int n_labels = 0;
    optind = 1;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, ":o:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'o': out = optarg; break;
        case 'l':
            if (n_labels == 6) {
                fprintf(stderr, "mgtrain plot: --label: at most 6, one per log\n");
                return 2;
            }
            labels[n_labels++] = optarg;
            break;
        case 'h': plot_usage(stdout); return 0;
        default: return mgt_app_bad_option("plot", ch, argv);
        }
    }
    int n = argc - optind;
    if (n < 1 || n > 6) {
        fprintf(stderr, "mgtrain plot: give 1 to 6 logs (mgtrain --log FILE writes one), not %d\n",
                n);
        return 2;
    }
    if (n_labels > n) {
        fprintf(stderr, "mgtrain plot: %d --label for %d logs\n", n_labels, n);
        return 2;
    }
    mgt_status st = mgt_train_plot_curves((const char *const *)argv + optind, labels, n, out);
    if (st != MGT_OK) {
        fprintf(stderr, "mgtrain plot: %s\n", mgt_error_last());
        return 1;
    }
    printf("%s\n", out);
    return 0;
}
