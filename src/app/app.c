/* mgtrain's subcommands: the table that maps a name to its handler, and the top-level help. */
#include <stdio.h>
#include <string.h>

#include "app/app.h"
#include "app/commands.h"

typedef struct app_command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} app_command;

static const app_command commands[] = {
    {"devices", mgt_app_cmd_devices, "list the devices, their memory and the peer-access matrix"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: mgtrain COMMAND [OPTIONS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n`mgtrain COMMAND --help` describes a command's options.\n");
}

int mgt_app_main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "mgtrain: unknown command '%s' (try mgtrain --help)\n", argv[1]);
    return 2;
}
