/* The app module's entry point: subcommand dispatch for the mgtrain executable. */
#ifndef MGT_APP_APP_H
#define MGT_APP_APP_H

/* Runs `mgtrain ARGS...`; returns the process exit status. */
int mgt_app_main(int argc, char **argv);

/* The command line mgt_app_main was given, words joined by spaces, those holding a space or a
   quote in single quotes (as a shell would take them back): for the log's first record. */
const char *mgt_app_command_line(void);

#endif
