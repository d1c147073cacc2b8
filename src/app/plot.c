/* A small SVG line chart, for `mgtrain bench --plot`: a few series over a shared x axis. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "app/plot.h"

static const char *const colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"};

static double tx(const mgt_plot *p, double x, double lo, double hi, double w)
{
    if (p->log2_x) {
        x = log2(x);
        lo = log2(lo);
        hi = log2(hi);
    }
    return hi > lo ? (x - lo) / (hi - lo) * w : w / 2;
}

static void fmt_x(const mgt_plot *p, double x, char *buf, size_t cap)
{
    if (p->x_bytes) {
        static const char *const units[] = {"B", "KiB", "MiB", "GiB"};
        int u = 0;
        while (x >= 1024 && u < 3) {
            x /= 1024;
            u++;
        }
        snprintf(buf, cap, "%g %s", x, units[u]);
    } else {
        snprintf(buf, cap, "%g", x);
    }
}

/* One panel: axes, ticks, the series that belong to it. */
static void panel(FILE *f, const mgt_plot *p, int which, double ox, double oy, double w, double h)
{
    double xlo = INFINITY, xhi = -INFINITY, yhi = 0;
    for (int s = 0; s < p->n_series; s++) {
        if (p->series[s].panel != which)
            continue;
        for (int i = 0; i < p->series[s].n; i++) {
            double x = p->series[s].x[i], y = p->series[s].y[i];
            xlo = x < xlo ? x : xlo;
            xhi = x > xhi ? x : xhi;
            yhi = y > yhi ? y : yhi;
        }
    }
    if (!(xhi >= xlo))
        return;
    yhi = yhi > 0 ? yhi * 1.1 : 1;
    fprintf(f, "<g transform=\"translate(%.1f,%.1f)\">\n", ox, oy);
    fprintf(f,
            "<rect x=\"0\" y=\"0\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
            "stroke=\"#888\"/>\n",
            w, h);
    for (int t = 0; t <= 4; t++) {
        double y = yhi * t / 4, py = h - y / yhi * h;
        fprintf(f, "<line x1=\"0\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", w, py,
                py);
        fprintf(f, "<text x=\"-6\" y=\"%.1f\" text-anchor=\"end\" font-size=\"11\">%.3g</text>\n",
                py + 4, y);
    }
    /* x ticks at the first series' points */
    for (int s = 0; s < p->n_series; s++) {
        if (p->series[s].panel != which)
            continue;
        int step = p->series[s].n > 10 ? (p->series[s].n + 9) / 10 : 1;
        for (int i = 0; i < p->series[s].n; i += step) {
            char lab[32];
            fmt_x(p, p->series[s].x[i], lab, sizeof lab);
            double px = tx(p, p->series[s].x[i], xlo, xhi, w);
            fprintf(f,
                    "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"10\">%s"
                    "</text>\n",
                    px, h + 14, lab);
        }
        break;
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"12\">%s</text>\n",
            w / 2, h + 32, p->x_label);
    fprintf(f, "<text x=\"%.1f\" y=\"-8\" font-size=\"12\" text-anchor=\"middle\">%s</text>\n",
            w / 2, p->panel_title[which]);
    int legend = 0;
    for (int s = 0; s < p->n_series; s++) {
        if (p->series[s].panel != which)
            continue;
        const char *col = colors[s % 5];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", col);
        for (int i = 0; i < p->series[s].n; i++)
            fprintf(f, "%.1f,%.1f ", tx(p, p->series[s].x[i], xlo, xhi, w),
                    h - p->series[s].y[i] / yhi * h);
        fprintf(f, "\"/>\n");
        for (int i = 0; i < p->series[s].n; i++)
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                    tx(p, p->series[s].x[i], xlo, xhi, w), h - p->series[s].y[i] / yhi * h, col);
        fprintf(f, "<text x=\"10\" y=\"%d\" font-size=\"11\" fill=\"%s\">%s</text>\n",
                16 + 14 * legend++, col, p->series[s].name);
    }
    fprintf(f, "</g>\n");
}

mgt_status mgt_plot_write_svg(const mgt_plot *p, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return mgt_error_set(MGT_ERR_IO, "--plot %s: %s", path, strerror(errno));
    int panels = p->panels > 0 ? p->panels : 1;
    double w = 420, h = 260, W = 80 + panels * (w + 90), H = h + 110;
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" "
            "fill=\"white\"/>\n",
            W, H);
    fprintf(f, "<text x=\"%.1f\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">%s</text>\n",
            W / 2, p->title);
    for (int k = 0; k < panels; k++)
        panel(f, p, k, 70 + k * (w + 90), 60, w, h);
    fprintf(f, "</svg>\n");
    if (fclose(f) != 0)
        return mgt_error_set(MGT_ERR_IO, "--plot %s: %s", path, strerror(errno));
    return MGT_OK;
}
