/* mgtrain's subcommands: the table that maps a name to its handler, the top-level help, and
   `mgtrain DIR ...` (a dataset folder as the first argument trains, as `python main.py DIR`). */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "app/app.h"
#include "app/commands.h"
#include "mgt/version.h"

typedef struct app_command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} app_command;

static const app_command commands[] = {
    {"train", mgt_app_cmd_train, "train a classifier (the default: `mgtrain --data DIR ...`)"},
    {"bench", mgt_app_cmd_bench,
     "measure training-step scaling over 1..N devices, or the all-reduce"},
    {"devices", mgt_app_cmd_devices, "list the devices, their memory and the peer-access matrix"},
    {"model", mgt_app_cmd_model, "print an architecture's layers, parameters and MACs"},
    {"check-data", mgt_app_cmd_check_data, "decode every image of a dataset and list bad files"},
    {"import-idx", mgt_app_cmd_import_idx,
     "turn Fashion-MNIST's IDX files into an ImageFolder tree"},
    {"bench-data", mgt_app_cmd_bench_data, "measure decode + augment images/s per thread"},
    {"pack", mgt_app_cmd_pack, "pack an ImageFolder tree into one file of records"},
    {"predict", mgt_app_cmd_predict,
     "a trained model's top classes for images (predict --checkpoint FILE IMAGE|DIR...)"},
    {"export", mgt_app_cmd_export, "write a trained model as ONNX (export --onnx OUT.onnx ...)"},
    {"plot", mgt_app_cmd_plot, "draw training curves (loss, top-1, lr) from --log files"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: mgtrain [train] DIR [OPTIONS]     (or --data DIR)\n"
               "       mgtrain COMMAND [OPTIONS]\n\n"
               "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n`mgtrain COMMAND --help` describes a command's options. Exit status: 0 done, 1 a "
               "run that\ncannot be done or failed, 2 a bad command line, 128 + N stopped by "
               "signal N.\n");
}

static char command_line[4096];

const char *mgt_app_command_line(void) { return command_line; }

static void keep_command_line(int argc, char **argv)
{
    size_t len = 0;
    command_line[0] = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = i == 0 ? "mgtrain" : argv[i];
        bool quote = a[0] == 0 || strpbrk(a, " \t\n'\"$\\;&|<>*?()") != NULL;
        char word[1024];
        size_t n = 0;
        if (quote)
            word[n++] = '\'';
        for (const char *c = a; *c && n + 6 < sizeof word; c++) {
            if (*c == '\'') { /* ' becomes '\'' */
                memcpy(word + n, "'\\''", 4);
                n += 4;
            } else {
                word[n++] = *c;
            }
        }
        if (quote)
            word[n++] = '\'';
        word[n] = 0;
        int w = snprintf(command_line + len, sizeof command_line - len, "%s%s", i ? " " : "", word);
        if (w < 0 || (size_t)w >= sizeof command_line - len)
            break; /* a command line past 4 KiB is kept cut short */
        len += (size_t)w;
    }
}

int mgt_app_main(int argc, char **argv)
{
    keep_command_line(argc, argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("mgtrain %s\n", mgt_version());
        return 0;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    /* `mgtrain --gpus 0,1 --data DIR` trains, as the ImageNet example's command line does */
    if (argv[1][0] == '-')
        return mgt_app_cmd_train(argc, argv);
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    /* `mgtrain DIR --epochs 1`: the dataset as the first argument; train's flag parser takes
       it as its positional argument */
    struct stat sb;
    if (stat(argv[1], &sb) == 0)
        return mgt_app_cmd_train(argc, argv);
    fprintf(stderr, "mgtrain: unknown command or dataset folder '%s' (try mgtrain --help)\n",
            argv[1]);
    return MGT_APP_EXIT_USAGE;
}
