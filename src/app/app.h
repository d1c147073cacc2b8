/* The app module's entry point: subcommand dispatch for the mgtrain executable. */
#ifndef MGT_APP_APP_H
#define MGT_APP_APP_H

/* Runs `mgtrain ARGS...`; returns the process exit status. */
int mgt_app_main(int argc, char **argv);

#endif
