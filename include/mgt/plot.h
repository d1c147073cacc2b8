/* A small SVG line chart: a few panels side by side over their own x axes, each with its
   series and a legend. For `mgtrain bench --plot` and the training curves (curves.svg,
   `mgtrain plot`). */
#ifndef MGT_PLOT_H
#define MGT_PLOT_H

#include <stdbool.h>

#include "mgt/status.h"

#define MGT_PLOT_MAX_SERIES 48

typedef enum mgt_plot_dash { MGT_PLOT_SOLID, MGT_PLOT_DASHED, MGT_PLOT_DOTTED } mgt_plot_dash;

typedef struct mgt_plot_series {
    const char *name;
    const double *x, *y; /* borrowed, n points each */
    int n;
    int panel;          /* which side-by-side panel it is drawn in */
    int color;          /* 0: by its place among the series; k: the palette's k-th colour */
    mgt_plot_dash dash; /* the line's style */
    bool no_markers;    /* a line alone, without a dot at every point (dense series) */
} mgt_plot_series;

typedef struct mgt_plot {
    const char *title;
    const char *x_label;
    const char *panel_title[4];
    int panels;
    bool log2_x;  /* x on a log2 scale (message sizes) */
    bool x_bytes; /* x tick labels as KiB/MiB */
    bool x_nice;  /* x ticks at round numbers (else at the first series' points) */
    mgt_plot_series series[MGT_PLOT_MAX_SERIES];
    int n_series;
} mgt_plot;

/* Writes the chart to path through a temporary file beside it and a rename, so a reader
   never sees half a chart. */
mgt_status mgt_plot_write_svg(const mgt_plot *p, const char *path);

#endif
