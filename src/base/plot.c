/* A small SVG line chart (mgt/plot.h): for `mgtrain bench --plot` and the training curves. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "mgt/plot.h"

static const char *const colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
                                     "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
#define N_COLORS (int)(sizeof colors / sizeof *colors)

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

/* A round step (1, 2 or 5 x 10^k) that cuts span into at most `most` parts. */
static double nice_step(double span, int most)
{
    if (!(span > 0))
        return 1;
    double raw = span / most, p = pow(10, floor(log10(raw)));
    double m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

static const char *color_of(const mgt_plot *p, int s)
{
    int c = p->series[s].color;
    return colors[(c > 0 ? c - 1 : s) % N_COLORS];
}

static const char *dash_attr(mgt_plot_dash d)
{
    return d == MGT_PLOT_DASHED   ? " stroke-dasharray=\"7,4\""
           : d == MGT_PLOT_DOTTED ? " stroke-dasharray=\"2,3\""
                                  : "";
}

/* Writes the text with &, < and > escaped (series names come from file names). */
static void put_escaped(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        if (*s == '&')
            fputs("&amp;", f);
        else if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else
            fputc(*s, f);
    }
}

/* One panel: axes, ticks, the series that belong to it, its legend. */
static void panel(FILE *f, const mgt_plot *p, int which, double ox, double oy, double w, double h)
{
    double xlo = INFINITY, xhi = -INFINITY, ylo = 0, yhi = 0;
    for (int s = 0; s < p->n_series; s++) {
        if (p->series[s].panel != which)
            continue;
        for (int i = 0; i < p->series[s].n; i++) {
            double x = p->series[s].x[i], y = p->series[s].y[i];
            if (!isfinite(x) || !isfinite(y))
                continue;
            xlo = x < xlo ? x : xlo;
            xhi = x > xhi ? x : xhi;
            yhi = y > yhi ? y : yhi;
            ylo = y < ylo ? y : ylo;
        }
    }
    if (!(xhi >= xlo))
        return;
    if (p->x_nice && xlo > 0 && !p->log2_x)
        xlo = 0; /* epochs, steps: the axis starts where the run did */
    double ystep = nice_step((yhi > ylo ? yhi - ylo : 1) * 1.05, 5);
    yhi = ystep * ceil((yhi > ylo ? yhi * 1.05 : 1) / ystep);
    ylo = ystep * floor(ylo / ystep);
    double yspan = yhi - ylo;
    fprintf(f, "<g transform=\"translate(%.1f,%.1f)\">\n", ox, oy);
    fprintf(f,
            "<rect x=\"0\" y=\"0\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
            "stroke=\"#888\"/>\n",
            w, h);
    for (double y = ylo; y <= yhi + ystep * 1e-6; y += ystep) {
        double py = h - (y - ylo) / yspan * h;
        fprintf(f, "<line x1=\"0\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", w, py,
                py);
        fprintf(f, "<text x=\"-6\" y=\"%.1f\" text-anchor=\"end\" font-size=\"11\">%.4g</text>\n",
                py + 4, fabs(y) < ystep * 1e-6 ? 0 : y);
    }
    if (p->x_nice) {
        double step = nice_step(xhi - xlo, 8);
        for (double x = step * ceil(xlo / step - 1e-9); x <= xhi + step * 1e-6; x += step) {
            double px = tx(p, x, xlo, xhi, w);
            fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"0\" y2=\"%.1f\" stroke=\"#eee\"/>\n", px,
                    px, h);
            fprintf(f,
                    "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"10\">%g"
                    "</text>\n",
                    px, h + 14, fabs(x) < step * 1e-6 ? 0 : x);
        }
    } else { /* x ticks at the first series' points */
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
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"12\">", w / 2,
            h + 32);
    put_escaped(f, p->x_label);
    fprintf(f, "</text>\n<text x=\"%.1f\" y=\"-8\" font-size=\"12\" text-anchor=\"middle\">",
            w / 2);
    put_escaped(f, p->panel_title[which]);
    fprintf(f, "</text>\n");
    int legend = 0;
    for (int s = 0; s < p->n_series; s++) {
        const mgt_plot_series *se = &p->series[s];
        if (se->panel != which)
            continue;
        const char *col = color_of(p, s);
        /* a series breaks where a value is not finite */
        bool open = false;
        for (int i = 0; i < se->n; i++) {
            bool ok = isfinite(se->x[i]) && isfinite(se->y[i]);
            if (ok && !open) {
                fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%s\"%s points=\"",
                        col, se->no_markers ? "1.5" : "2", dash_attr(se->dash));
                open = true;
            }
            if (ok)
                fprintf(f, "%.1f,%.1f ", tx(p, se->x[i], xlo, xhi, w),
                        h - (se->y[i] - ylo) / yspan * h);
            if (open && (!ok || i + 1 == se->n)) {
                fprintf(f, "\"/>\n");
                open = false;
            }
        }
        for (int i = 0; !se->no_markers && i < se->n; i++)
            if (isfinite(se->x[i]) && isfinite(se->y[i]))
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                        tx(p, se->x[i], xlo, xhi, w), h - (se->y[i] - ylo) / yspan * h, col);
        double ly = 16 + 14 * legend++;
        fprintf(f,
                "<line x1=\"8\" x2=\"30\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                "stroke-width=\"2\"%s/>\n",
                ly - 4, ly - 4, col, dash_attr(se->dash));
        fprintf(f, "<text x=\"34\" y=\"%.1f\" font-size=\"11\" fill=\"%s\">", ly, col);
        put_escaped(f, se->name);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "</g>\n");
}

mgt_status mgt_plot_write_svg(const mgt_plot *p, const char *path)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return mgt_error_set(MGT_ERR_INVALID, "%s: the path is too long", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return mgt_error_set(MGT_ERR_IO, "%s: %s", path, strerror(errno));
    int panels = p->panels > 0 ? p->panels : 1;
    double w = 420, h = 260, W = 80 + panels * (w + 90), H = h + 110;
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" "
            "fill=\"white\"/>\n",
            W, H);
    fprintf(f, "<text x=\"%.1f\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">", W / 2);
    put_escaped(f, p->title);
    fprintf(f, "</text>\n");
    for (int k = 0; k < panels; k++)
        panel(f, p, k, 70 + k * (w + 90), 60, w, h);
    fprintf(f, "</svg>\n");
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
        int e = errno;
        remove(tmp);
        return mgt_error_set(MGT_ERR_IO, "%s: %s", path, strerror(e));
    }
    return MGT_OK;
}
