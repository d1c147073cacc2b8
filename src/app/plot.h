/* A small SVG line chart for the benchmark's figures. */
#ifndef MGT_APP_PLOT_H
#define MGT_APP_PLOT_H

#include <stdbool.h>

#include "mgt/status.h"

typedef struct mgt_plot_series {
    const char *name;
    const double *x, *y; /* borrowed, n points each */
    int n;
    int panel; /* which side-by-side panel it is drawn in */
} mgt_plot_series;

typedef struct mgt_plot {
    const char *title;
    const char *x_label;
    const char *panel_title[4];
    int panels;
    bool log2_x;  /* x on a log2 scale (message sizes) */
    bool x_bytes; /* x tick labels as KiB/MiB */
    mgt_plot_series series[8];
    int n_series;
} mgt_plot;

mgt_status mgt_plot_write_svg(const mgt_plot *p, const char *path);

#endif
