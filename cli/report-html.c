/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli-util.h"
#include "report-html.h"

/* One geometry for every chart (SVG user units; the page scales them to its width). */
#define CHART_W 900.0
#define CHART_H 260.0
#define MARGIN_L 70.0
#define MARGIN_R 40.0
#define MARGIN_T 30.0
#define MARGIN_B 50.0
#define PLOT_W (CHART_W - MARGIN_L - MARGIN_R)
#define PLOT_H (CHART_H - MARGIN_T - MARGIN_B)

/* The Okabe–Ito palette, told apart by readers with any common colour-vision deficiency; every series also
 * differs by dash, marker or pattern, and prints in black and white. */
#define COLOUR_IN_USE "#0072B2"
#define COLOUR_WAITING "#D55E00"
#define COLOUR_INK "#222222"

static const struct {
        const char *fill;         /* a pattern id, or a colour */
        const char *colour;
} reason_style[_REPORT_REASON_MAX] = {
        [REPORT_REASON_BUSY] = { "url(#p-busy)", "#E69F00" },
        [REPORT_REASON_FULL] = { "url(#p-full)", "#56B4E9" },
        [REPORT_REASON_TIMEOUT] = { "url(#p-timeout)", "#009E73" },
        [REPORT_REASON_SHED] = { "url(#p-shed)", "#CC79A7" },
        [REPORT_REASON_UNAVAILABLE] = { "url(#p-unavailable)", "#555555" },
};

static const char css[] =
        "body{font:14px/1.45 system-ui,sans-serif;color:#222;background:#fff;max-width:960px;margin:1em auto;padding:0 1em}"
        "h1{font-size:1.5em}h2{font-size:1.25em;border-bottom:1px solid #999;margin-top:2em}h3{font-size:1.05em;margin:1.4em 0 .3em}"
        "p.summary{margin:.2em 0 .5em}svg.chart{width:100%;height:auto;display:block;break-inside:avoid}"
        "svg text{font:12px system-ui,sans-serif;fill:#222}svg .axis line,svg .axis path{stroke:#444}"
        "svg .grid line{stroke:#ddd}table{border-collapse:collapse;margin:.4em 0 1em}"
        "td,th{border:1px solid #bbb;padding:.15em .5em;text-align:left}td.n{text-align:right}"
        ".muted{color:#666}code{font-size:.95em}"
        "@media print{body{max-width:none}h2{break-before:page}section{break-inside:avoid-page}}";

/* ---- text ---- */

/* Strings from history.db are other users' words (a job label): made printable, then escaped for HTML. */
static void put_text(FILE *f, const char *s) {
        if (!s) {
                fputs("-", f);
                return;
        }
        size_t len = strlen(s);
        _cleanup_free_ char *buf = malloc(CLI_PRINTABLE_SIZE(len));
        if (!buf) {
                fputs("?", f);
                return;
        }
        for (const char *p = cli_printable(buf, CLI_PRINTABLE_SIZE(len), s); *p; p++)
                switch (*p) {
                case '&':
                        fputs("&amp;", f);
                        break;
                case '<':
                        fputs("&lt;", f);
                        break;
                case '>':
                        fputs("&gt;", f);
                        break;
                case '"':
                        fputs("&quot;", f);
                        break;
                case '\'':
                        fputs("&#39;", f);
                        break;
                default:
                        fputc(*p, f);
                }
}

static const char *duration(char buf[static CLI_DURATION_MAX], usec_t u) {
        if (u > 0 && u < USEC_PER_MSEC) {
                snprintf(buf, CLI_DURATION_MAX, "%" PRIu64 "µs", u);
                return buf;
        }
        /* Waits of a few seconds are the ones compared: a tenth, which cli_format_duration_ms() drops. */
        if (u >= USEC_PER_SEC && u < 10 * USEC_PER_SEC) {
                snprintf(buf, CLI_DURATION_MAX, "%" PRIu64 ".%" PRIu64 "s", u / USEC_PER_SEC, u % USEC_PER_SEC / (USEC_PER_SEC / 10));
                return buf;
        }
        return cli_format_duration_ms(buf, u / USEC_PER_MSEC);
}

#define TIME_MAX 64
/* The callers' formats are checked (the attribute); inside, the format is a parameter by design. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
__attribute__((format(strftime, 3, 0))) static const char *format_time(char buf[static TIME_MAX], usec_t t, const char *format) {
        time_t sec = (time_t) (t / USEC_PER_SEC);
        struct tm tm;
        if (!localtime_r(&sec, &tm) || strftime(buf, TIME_MAX, format, &tm) == 0)
                snprintf(buf, TIME_MAX, "@%" PRIu64, t / USEC_PER_SEC);
        return buf;
}

/* A time as the report shows it: a date and time of the local zone, or, on a simulation's virtual clock, the
 * offset from its start ("+1min 5s"). */
__attribute__((format(strftime, 4, 0))) static const char *when(const Report *r, char buf[static TIME_MAX], usec_t t,
                                                               const char *format) {
        if (!r->virtual_clock)
                return format_time(buf, t, format);
        char d[CLI_DURATION_MAX];
        snprintf(buf, TIME_MAX, "+%s", cli_format_duration_ms(d, (t - r->since) / USEC_PER_MSEC));
        return buf;
}
#pragma GCC diagnostic pop

static void put_figure(FILE *f, const char *name, uint64_t v) {
        fprintf(f, "<span data-figure=\"%s\">%" PRIu64 "</span>", name, v);
}

static void put_duration_figure(FILE *f, const char *name, usec_t v) {
        char b[CLI_DURATION_MAX];
        fprintf(f, "<span data-figure=\"%s\" data-ms=\"%" PRIu64 "\">%s</span>", name, v / USEC_PER_MSEC, duration(b, v));
}

static double percent(uint64_t part, uint64_t whole) {
        return whole > 0 ? 100.0 * (double) part / (double) whole : 0;
}

/* ---- axes ---- */

/* The smallest integer ≥ x, for x ≥ 0 (no libm: slotctl starts without it). */
static double ceil_positive(double x) {
        double t = (double) (uint64_t) x;
        return t < x ? t + 1 : t;
}

/* A step of 1, 2 or 5 × 10^k giving at most about `ticks` intervals up to max. */
static double nice_step(double max, unsigned ticks) {
        double raw = max / ticks, mag = 1;
        if (!(raw > 0))
                return 1;
        while (mag * 10 <= raw)
                mag *= 10;
        while (mag > raw)
                mag /= 10;
        double m = raw / mag;
        return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * mag;
}

/* A count axis: integer ticks from 0 to the top it returns (≥ max, ≥ 1). */
static double count_axis_top(double max, double *ret_step) {
        double step = MAX(nice_step(MAX(max, 1), 5), 1);
        *ret_step = step;
        return MAX(ceil_positive(max / step), 1) * step;
}

static double plot_y(double v, double top) {
        return MARGIN_T + PLOT_H - v / top * PLOT_H;
}

static void svg_open(FILE *f, const char *chart, const char *title) {
        fprintf(f,
                "<svg class=\"chart\" data-chart=\"%s\" viewBox=\"0 0 %.0f %.0f\" role=\"img\" "
                "xmlns=\"http://www.w3.org/2000/svg\"><title>",
                chart, CHART_W, CHART_H);
        put_text(f, title);
        fputs("</title>", f);
}

/* The y axis: grid lines, tick labels, and the axis title (with its unit) above it. */
static void y_axis(FILE *f, double top, double step, double scale, const char *unit_title) {
        fputs("<g class=\"grid\">", f);
        for (double v = step; v <= top + step / 2; v += step)
                fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>", MARGIN_L, MARGIN_L + PLOT_W,
                        plot_y(v, top), plot_y(v, top));
        fputs("</g><g class=\"axis\">", f);
        fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>", MARGIN_L, MARGIN_L, MARGIN_T,
                MARGIN_T + PLOT_H);
        fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>", MARGIN_L, MARGIN_L + PLOT_W,
                MARGIN_T + PLOT_H, MARGIN_T + PLOT_H);
        for (double v = 0; v <= top + step / 2; v += step)
                fprintf(f, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>", MARGIN_L - 6,
                        plot_y(v, top) + 4, v / scale);
        fprintf(f, "<text class=\"axis-title\" x=\"%.1f\" y=\"%.1f\">", 4.0, MARGIN_T - 12);
        put_text(f, unit_title);
        fputs("</text></g>", f);
}

/* Time ticks at whole steps of the local clock, few enough to read. */
static void time_axis(FILE *f, const Report *r) {
        usec_t since = r->since, until = r->until;
        static const usec_t steps[] = {
                10 * USEC_PER_MSEC, 50 * USEC_PER_MSEC, 100 * USEC_PER_MSEC, 500 * USEC_PER_MSEC, USEC_PER_SEC,
                2 * USEC_PER_SEC, 5 * USEC_PER_SEC, 10 * USEC_PER_SEC, 15 * USEC_PER_SEC, 30 * USEC_PER_SEC,
                USEC_PER_MINUTE, 2 * USEC_PER_MINUTE, 5 * USEC_PER_MINUTE, 10 * USEC_PER_MINUTE,
                15 * USEC_PER_MINUTE, 30 * USEC_PER_MINUTE, USEC_PER_HOUR, 2 * USEC_PER_HOUR, 3 * USEC_PER_HOUR,
                6 * USEC_PER_HOUR, 12 * USEC_PER_HOUR, USEC_PER_DAY, 2 * USEC_PER_DAY, USEC_PER_WEEK,
        };
        usec_t range = until - since;
        /* Beyond the table (two months), whole days: a tick a week over centuries would be tens of thousands. */
        usec_t step = (range / (8 * USEC_PER_DAY) + 1) * USEC_PER_DAY;
        for (size_t i = 0; i < ELEMENTSOF(steps); i++)
                if (range / steps[i] <= 8) {
                        step = steps[i];
                        break;
                }
        /* Whole steps of local time: shift by the zone's offset, round, shift back. */
        time_t s = (time_t) (since / USEC_PER_SEC);
        struct tm tm;
        int64_t offset = !r->virtual_clock && localtime_r(&s, &tm) ? (int64_t) tm.tm_gmtoff * (int64_t) USEC_PER_SEC : 0;
        usec_t local = (usec_t) ((int64_t) since + offset);
        usec_t first = (usec_t) ((int64_t) (DIV_ROUND_UP(local, step) * step) - offset);

        fputs("<g class=\"axis time\">", f);
        for (usec_t t = first; t < until; t += step) {
                char b[TIME_MAX];
                double x = MARGIN_L + (double) (t - since) / (double) range * PLOT_W;
                fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>", x, x, MARGIN_T + PLOT_H,
                        MARGIN_T + PLOT_H + 5);
                /* Hours read as a clock; the ticks at midnight say the day instead. */
                time_t ts = (time_t) (t / USEC_PER_SEC);
                struct tm lt;
                bool midnight = !r->virtual_clock && step >= USEC_PER_HOUR && localtime_r(&ts, &lt) && lt.tm_hour == 0 &&
                                lt.tm_min == 0;
                const char *label = step < USEC_PER_MINUTE           ? when(r, b, t, "%H:%M:%S") :
                                    step < USEC_PER_DAY && !midnight ? when(r, b, t, "%H:%M") :
                                    step <= USEC_PER_WEEK            ? when(r, b, t, "%b %d") :
                                                                       when(r, b, t, "%Y-%m-%d");
                fprintf(f, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s", x,
                        MARGIN_T + PLOT_H + 18, label);
                if (step < USEC_PER_SEC && !r->virtual_clock)
                        fprintf(f, ".%02" PRIu64, (t % USEC_PER_SEC) / (10 * USEC_PER_MSEC));
                fputs("</text>", f);
        }
        char z[TIME_MAX], a[TIME_MAX], b[TIME_MAX];
        if (r->virtual_clock)
                fprintf(f, "<text class=\"axis-title\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">time since the start of "
                           "the simulation</text>",
                        MARGIN_L + PLOT_W / 2, CHART_H - 8);
        else
                fprintf(f, "<text class=\"axis-title\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">time (%s, from %s to %s)</text>",
                        MARGIN_L + PLOT_W / 2, CHART_H - 8, format_time(z, since, "%Z"),
                        format_time(a, since, "%Y-%m-%d %H:%M:%S"), format_time(b, until, "%Y-%m-%d %H:%M:%S"));
        fputs("</g>", f);
}

static double time_x(const Report *r, usec_t t) {
        return MARGIN_L + (double) (t - r->since) / (double) (r->until - r->since) * PLOT_W;
}

/* A legend entry at (x, y): its sample drawn by the caller's markup, then the words. */
static void legend_text(FILE *f, double x, double y, const char *text) {
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s</text>", x, y + 4, text);
}

/* Durations on an axis: a unit that keeps the numbers short. */
static void duration_unit(usec_t max, double *ret_scale, const char **ret_unit) {
        if (max < 2 * USEC_PER_SEC)
                *ret_scale = (double) USEC_PER_MSEC, *ret_unit = "ms";
        else if (max < 3 * USEC_PER_MINUTE)
                *ret_scale = (double) USEC_PER_SEC, *ret_unit = "s";
        else if (max < 3 * USEC_PER_HOUR)
                *ret_scale = (double) USEC_PER_MINUTE, *ret_unit = "min";
        else
                *ret_scale = (double) USEC_PER_HOUR, *ret_unit = "h";
}

/* ---- the charts of a pool ---- */

static void chart_timeline(FILE *f, const Report *r, const ReportPool *p) {
        char a[CLI_DURATION_MAX], b[CLI_DURATION_MAX], c[CLI_DURATION_MAX];
        size_t runs = 0;

        fputs("<h3>Slots in use and requests waiting</h3><p class=\"summary\">", f);
        fputs("At most ", f);
        put_figure(f, "peak-in-use", p->peak_in_use);
        fputs(" leases were held at once and ", f);
        put_figure(f, "peak-waiting", p->peak_waiting);
        fprintf(f, " requests waited at once. The pool was congested (a request waited with the saturated budget) "
                   "for %s of %s (%.1f%%). Each step is the most in one %s interval.",
                duration(a, p->congested_us), duration(b, r->until - r->since),
                percent(p->congested_us, r->until - r->since), duration(c, r->bucket_us));
        fputs("</p>", f);

        double step, top = count_axis_top(MAX(p->peak_in_use, p->peak_waiting), &step);
        svg_open(f, "timeline", "Slots in use and requests waiting over time");
        /* Congested intervals first, under the lines: hatched, not only tinted. */
        for (size_t i = 0; i < r->n_buckets;) {
                if (!p->buckets[i].congested) {
                        i++;
                        continue;
                }
                size_t j = i;
                while (j < r->n_buckets && p->buckets[j].congested)
                        j++;
                usec_t from = r->since + i * r->bucket_us, to = MIN(r->since + j * r->bucket_us, r->until);
                char t[TIME_MAX];
                fprintf(f,
                        "<rect class=\"congested\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                        "fill=\"url(#p-congested)\"><title>congested from %s</title></rect>",
                        time_x(r, from), MARGIN_T, MAX(time_x(r, to) - time_x(r, from), 1.0), PLOT_H,
                        when(r, t, from, "%H:%M:%S"));
                runs++;
                i = j;
        }
        y_axis(f, top, step, 1, "slots (leases)");
        time_axis(f, r);

        static const struct {
                const char *series, *colour, *dash, *label;
                size_t offset;
        } series[] = {
                { "in-use", COLOUR_IN_USE, "none", "in use", offsetof(ReportBucket, in_use) },
                { "waiting", COLOUR_WAITING, "6 4", "waiting", offsetof(ReportBucket, waiting) },
        };
        for (size_t s = 0; s < ELEMENTSOF(series); s++) {
                fprintf(f,
                        "<path class=\"series\" data-series=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\" "
                        "stroke-dasharray=\"%s\" d=\"",
                        series[s].series, series[s].colour, series[s].dash);
                for (size_t i = 0; i < r->n_buckets; i++) {
                        unsigned v = *(const unsigned *) ((const char *) &p->buckets[i] + series[s].offset);
                        double x0 = time_x(r, r->since + i * r->bucket_us);
                        double x1 = time_x(r, MIN(r->since + (i + 1) * r->bucket_us, r->until));
                        double y = plot_y(v, top);
                        if (i == 0)
                                fprintf(f, "M%.1f %.1fH%.1f", x0, y, x1);
                        else
                                fprintf(f, "V%.1fH%.1f", y, x1);
                }
                fputs("\"/>", f);
        }
        /* The legend, above the plot. */
        double lx = MARGIN_L + PLOT_W - 330, ly = 12;
        fprintf(f, "<g class=\"legend\"><line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>",
                lx, lx + 24, ly, ly, COLOUR_IN_USE);
        legend_text(f, lx + 28, ly, "in use");
        fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\" stroke-dasharray=\"6 4\"/>",
                lx + 90, lx + 114, ly, ly, COLOUR_WAITING);
        legend_text(f, lx + 118, ly, "waiting");
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"20\" height=\"12\" fill=\"url(#p-congested)\" stroke=\"#888\"/>",
                lx + 190, ly - 6);
        legend_text(f, lx + 214, ly, "congested");
        fprintf(f, "</g><desc>%zu congested intervals</desc></svg>\n", runs);
}

/* p50, p95 and max of each period with grants, told apart by marker shape as well as by words. */
static void put_marker(FILE *f, const char *class, const char *series, double x, double y, const char *title) {
        if (streq(series, "p50"))
                fprintf(f, "<circle class=\"%s\" data-series=\"p50\" cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\">",
                        class, x, y, COLOUR_IN_USE);
        else if (streq(series, "p95"))
                fprintf(f,
                        "<path class=\"%s\" data-series=\"p95\" d=\"M%.1f %.1fl5 9h-10z\" fill=\"none\" stroke=\"%s\" "
                        "stroke-width=\"1.5\">",
                        class, x, y - 5, COLOUR_WAITING);
        else
                fprintf(f,
                        "<path class=\"%s\" data-series=\"max\" d=\"M%.1f %.1fl8 8m0 -8l-8 8\" stroke=\"%s\" "
                        "stroke-width=\"1.5\">",
                        class, x - 4, y - 4, COLOUR_INK);
        fprintf(f, "<title>%s</title></%s>", title, streq(series, "p50") ? "circle" : "path");
}

#define PERIOD_WORD_MAX 32
static const char *period_word(const Report *r, char buf[static PERIOD_WORD_MAX]) {
        if (r->period_us <= USEC_PER_DAY)
                return r->period_us == USEC_PER_DAY ? "day" : "hour";
        snprintf(buf, PERIOD_WORD_MAX, "%" PRIu64 " days", r->period_us / USEC_PER_DAY);
        return buf;
}

static void chart_lane_waits(FILE *f, const Report *r, const ReportLane *l) {
        double scale;
        const char *unit;
        duration_unit(l->waits.max, &scale, &unit);
        double step = nice_step(MAX((double) l->waits.max / scale, 5), 5) * scale;
        double top = MAX(ceil_positive((double) l->waits.max / step), 1) * step;
        size_t points = 0;

        _cleanup_free_ char *title = NULL, *axis = NULL;
        char pw[PERIOD_WORD_MAX];
        if (asprintf(&title, "Waits of lane %s per %s", l->name, period_word(r, pw)) < 0 ||
            asprintf(&axis, "wait (%s)", unit) < 0)
                return;
        fputs("<figure data-lane=\"", f);
        put_text(f, l->name);
        fputs("\"><figcaption>Lane <b>", f);
        put_text(f, l->name);
        fputs("</b></figcaption>", f);
        svg_open(f, "waits", title);
        y_axis(f, top, step, scale, axis);
        time_axis(f, r);
        for (size_t i = 0; i < r->n_periods; i++) {
                const ReportWaits *w = &l->period_waits[i];
                if (w->n == 0)
                        continue;
                /* In the middle of the part of the period that the range covers. */
                usec_t from = MAX(r->period_start + i * r->period_us, r->since);
                usec_t to = MIN(r->period_start + (i + 1) * r->period_us, r->until);
                double x = time_x(r, from + (to - from) / 2);
                static const char *const series[] = { "p50", "p95", "max" };
                usec_t v[3] = { report_waits_quantile(w, 0.5), report_waits_quantile(w, 0.95), w->max };
                for (size_t s = 0; s < 3; s++) {
                        char t[64 + CLI_DURATION_MAX], d[CLI_DURATION_MAX];
                        snprintf(t, sizeof t, "%s %s of %" PRIu64 " grants", series[s], duration(d, v[s]), w->n);
                        put_marker(f, "point", series[s], x, plot_y((double) v[s], top), t);
                        points++;
                }
        }
        double lx = MARGIN_L + PLOT_W - 250, ly = 12;
        fputs("<g class=\"legend\">", f);
        put_marker(f, "key", "p50", lx, ly, "median");
        legend_text(f, lx + 10, ly, "median");
        put_marker(f, "key", "p95", lx + 80, ly, "p95");
        legend_text(f, lx + 90, ly, "95th percentile");
        put_marker(f, "key", "max", lx + 200, ly, "max");
        legend_text(f, lx + 210, ly, "longest");
        fprintf(f, "</g><desc>%zu points</desc></svg></figure>\n", points);
}

static void chart_waits(FILE *f, const Report *r, const ReportPool *p) {
        char a[CLI_DURATION_MAX], b[CLI_DURATION_MAX], c[CLI_DURATION_MAX], pw[PERIOD_WORD_MAX];

        fprintf(f, "<h3>Waits per lane, per %s</h3><p class=\"summary\">", period_word(r, pw));
        if (p->waits.n == 0) {
                fputs("No request was granted in this range.</p>\n", f);
                return;
        }
        fputs("Of ", f);
        put_figure(f, "granted", p->granted);
        fputs(" grants, half waited at most ", f);
        put_duration_figure(f, "p50-wait", report_waits_quantile(&p->waits, 0.5));
        fputs(", 95% at most ", f);
        put_duration_figure(f, "p95-wait", report_waits_quantile(&p->waits, 0.95));
        fputs("; the longest wait was ", f);
        put_duration_figure(f, "longest-wait", p->waits.max);
        fputs(". Percentiles are read from logarithmic bins (at most 9% high); the longest is exact.</p>\n", f);

        fputs("<table class=\"waits\"><tr><th>lane</th><th>grants</th><th>median</th><th>p95</th><th>longest</th></tr>", f);
        for (size_t i = 0; i < p->n_lanes; i++) {
                const ReportLane *l = &p->lanes[i];
                if (l->granted == 0)
                        continue;
                fputs("<tr><td>", f);
                put_text(f, l->name);
                fprintf(f, "</td><td class=\"n\">%" PRIu64 "</td><td class=\"n\">%s</td><td class=\"n\">%s</td><td class=\"n\">%s</td></tr>",
                        l->granted, duration(a, report_waits_quantile(&l->waits, 0.5)),
                        duration(b, report_waits_quantile(&l->waits, 0.95)), duration(c, l->waits.max));
        }
        fputs("</table>\n", f);
        for (size_t i = 0; i < p->n_lanes; i++)
                if (p->lanes[i].granted > 0)
                        chart_lane_waits(f, r, &p->lanes[i]);
}

/* A bar's label on a logarithmic wait axis: powers of two of a millisecond, in a short unit. */
static const char *octave_label(char buf[static CLI_DURATION_MAX], size_t octave) {
        if (octave == 0)
                return "0";
        return duration(buf, report_wait_bin_floor(1 + (octave - 1) * REPORT_WAIT_BINS_PER_OCTAVE));
}

static void chart_wait_histogram(FILE *f, const ReportPool *p) {
        /* Octaves: bin 0 (under 1 ms), then one bar per doubling. */
        enum { OCTAVES = 1 + (REPORT_WAIT_BINS - 1) / REPORT_WAIT_BINS_PER_OCTAVE };
        uint64_t bars[OCTAVES] = {}, max = 0;
        size_t first = OCTAVES, last = 0, n = 0;

        if (p->waits.n == 0)
                return;
        for (size_t i = 0; i < REPORT_WAIT_BINS; i++) {
                size_t o = i == 0 ? 0 : 1 + (i - 1) / REPORT_WAIT_BINS_PER_OCTAVE;
                bars[o] += p->waits.bins[i];
        }
        for (size_t o = 0; o < OCTAVES; o++)
                if (bars[o] > 0) {
                        first = MIN(first, o);
                        last = o;
                        max = MAX(max, bars[o]);
                }
        fputs("<h3>Distribution of waits</h3><p class=\"summary\">", f);
        fprintf(f, "How long the %" PRIu64 " grants waited, each bar a doubling of the wait (left edge to right edge); "
                   "%" PRIu64 " (%.1f%%) were granted in under 1 ms.</p>\n",
                p->waits.n, bars[0], percent(bars[0], p->waits.n));
        double step, top = count_axis_top((double) max, &step);
        svg_open(f, "wait-histogram", "Distribution of waits");
        y_axis(f, top, step, 1, "grants");
        size_t count = last - first + 1;
        double w = PLOT_W / (double) count;
        for (size_t o = first; o <= last; o++) {
                char a[CLI_DURATION_MAX], b[CLI_DURATION_MAX];
                double x = MARGIN_L + w * (double) (o - first), y = plot_y((double) bars[o], top);
                fprintf(f,
                        "<rect class=\"bar\" data-count=\"%" PRIu64 "\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                        "fill=\"%s\" stroke=\"%s\"><title>%" PRIu64 " waited %s to %s</title></rect>",
                        bars[o], x + 1, y, MAX(w - 2, 1.0), MARGIN_T + PLOT_H - y, COLOUR_IN_USE, COLOUR_INK, bars[o],
                        octave_label(a, o), o == 0 ? "1ms" : octave_label(b, o + 1));
                /* Labels at the bars' left edges, thinned to about a dozen. */
                if ((o - first) % DIV_ROUND_UP(count, 12) == 0)
                        fprintf(f, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>", x,
                                MARGIN_T + PLOT_H + 18, octave_label(a, o));
                n++;
        }
        fprintf(f, "<text class=\"axis-title\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">wait (logarithmic: each bar twice "
                   "as long as the one before)</text>",
                MARGIN_L + PLOT_W / 2, CHART_H - 8);
        fprintf(f, "<desc>%zu bars</desc></svg>\n", n);
}

static void reason_swatch(FILE *f, ReportReason k, double x, double y) {
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"16\" height=\"12\" fill=\"%s\" stroke=\"%s\"/>", x, y - 6,
                reason_style[k].fill, COLOUR_INK);
        legend_text(f, x + 20, y, report_reason_to_string(k));
}

static void chart_refusals(FILE *f, const Report *r, const ReportPool *p) {
        char pw[PERIOD_WORD_MAX];
        fprintf(f, "<h3>Refusals per %s, by reason</h3><p class=\"summary\">", period_word(r, pw));
        if (p->refused_total == 0) {
                fputs("No request was refused in this range.</p>\n", f);
                return;
        }
        put_figure(f, "refused", p->refused_total);
        fprintf(f, " of %" PRIu64 " requests (%.1f%%) were refused: ", p->refused_total + p->granted,
                percent(p->refused_total, p->refused_total + p->granted));
        for (ReportReason k = 0; k < _REPORT_REASON_MAX; k++) {
                fputs(k == 0 ? "" : k + 1 == _REPORT_REASON_MAX ? " and " : ", ", f);
                put_figure(f, report_reason_to_string(k), p->refused[k]);
                fprintf(f, " %s", report_reason_to_string(k));
        }
        fputs(".</p>\n", f);

        fputs("<table class=\"refusals\"><tr><th>lane</th>", f);
        for (ReportReason k = 0; k < _REPORT_REASON_MAX; k++)
                fprintf(f, "<th>%s</th>", report_reason_to_string(k));
        fputs("</tr>", f);
        for (size_t i = 0; i < p->n_lanes; i++) {
                const ReportLane *l = &p->lanes[i];
                uint64_t sum = 0;
                for (ReportReason k = 0; k < _REPORT_REASON_MAX; k++)
                        sum += l->refused[k];
                if (sum == 0)
                        continue;
                fputs("<tr><td>", f);
                put_text(f, l->name);
                fputs("</td>", f);
                for (ReportReason k = 0; k < _REPORT_REASON_MAX; k++)
                        fprintf(f, "<td class=\"n\">%" PRIu64 "</td>", l->refused[k]);
                fputs("</tr>", f);
        }
        fputs("</table>\n", f);

        /* Stacked bars, one per period, summed over the lanes (the table above splits them by lane). */
        uint64_t max = 0;
        for (size_t i = 0; i < r->n_periods; i++) {
                uint64_t sum = 0;
                for (size_t j = 0; j < p->n_lanes; j++)
                        for (ReportReason k = 0; k < _REPORT_REASON_MAX; k++)
                                sum += p->lanes[j].period_refused[i][k];
                max = MAX(max, sum);
        }
        double step, top = count_axis_top((double) max, &step);
        svg_open(f, "refusals", "Refusals by reason over time");
        y_axis(f, top, step, 1, "refusals");
        double w = PLOT_W / (double) r->n_periods;
        size_t bars = 0;
        for (size_t i = 0; i < r->n_periods; i++) {
                double base = 0;
                char t[TIME_MAX];
                if (r->period_us >= USEC_PER_DAY)
                        when(r, t, r->period_start + i * r->period_us, "%Y-%m-%d");
                else
                        when(r, t, r->period_start + i * r->period_us, "%Y-%m-%d %H:00");
                for (ReportReason k = 0; k < _REPORT_REASON_MAX; k++) {
                        uint64_t n = 0;
                        for (size_t j = 0; j < p->n_lanes; j++)
                                n += p->lanes[j].period_refused[i][k];
                        if (n == 0)
                                continue;
                        double y0 = plot_y(base, top), y1 = plot_y(base + (double) n, top);
                        fprintf(f,
                                "<rect class=\"bar\" data-reason=\"%s\" data-count=\"%" PRIu64 "\" x=\"%.1f\" y=\"%.1f\" "
                                "width=\"%.1f\" height=\"%.1f\" fill=\"%s\" stroke=\"%s\"><title>%s: %" PRIu64 " %s</title></rect>",
                                report_reason_to_string(k), n, MARGIN_L + w * (double) i + 1, y1, MAX(w - 2, 1.0), y0 - y1,
                                reason_style[k].fill, COLOUR_INK, t, n, report_reason_to_string(k));
                        base += (double) n;
                        bars++;
                }
        }
        /* Period labels: thinned to about a dozen. */
        for (size_t i = 0; i < r->n_periods; i += DIV_ROUND_UP(r->n_periods, 12)) {
                char t[TIME_MAX];
                fprintf(f, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>",
                        MARGIN_L + w * ((double) i + 0.5), MARGIN_T + PLOT_H + 18,
                        r->period_us > USEC_PER_DAY  ? when(r, t, r->period_start + i * r->period_us, "%Y-%m-%d") :
                        r->period_us == USEC_PER_DAY ? when(r, t, r->period_start + i * r->period_us, "%b %d") :
                                                       when(r, t, r->period_start + i * r->period_us, "%H:00"));
        }
        char z[TIME_MAX];
        fprintf(f, "<text class=\"axis-title\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s starting (%s)</text>",
                MARGIN_L + PLOT_W / 2, CHART_H - 8, period_word(r, pw), r->virtual_clock ? "from the start" : format_time(z, r->since, "%Z"));
        fputs("<g class=\"legend\">", f);
        for (ReportReason k = 0; k < _REPORT_REASON_MAX; k++)
                reason_swatch(f, k, MARGIN_L + PLOT_W - 460 + 95 * (double) k, 12);
        fprintf(f, "</g><desc>%zu bars</desc></svg>\n", bars);
}

/* Per label set, for a pool some of whose requests asked for labels or a member: which set waits or is
 * refused, that is which rigs are short. The counts are the table (no chart: label sets have no order). */
static void table_selectors(FILE *f, const ReportPool *p) {
        char a[CLI_DURATION_MAX];

        if (!p->any_selector)
                return;
        fputs("<h3>Waits and refusals by what was asked of the members</h3><p class=\"summary\">", f);
        fprintf(f, "The requests grouped by the labels and member they asked for (<code>--label</code>, "
                   "<code>--member</code>; a lane's own <code>labels=</code> is its configuration's and not shown): "
                   "how many were granted, how many of those waited first, the longest wait, and the refusals by "
                   "reason. A label set that waits or is refused more than the others is short of members that "
                   "carry it. %zu of %" PRIu64 " label sets, those with the most requests first.</p>\n",
                p->n_selectors, p->selectors_total);
        fputs("<table class=\"selectors\"><tr><th>asked for</th><th>requests</th><th>granted</th><th>waited</th>"
              "<th>longest wait</th>",
              f);
        for (ReportReason k = 0; k < _REPORT_REASON_MAX; k++)
                fprintf(f, "<th>%s</th>", report_reason_to_string(k));
        fputs("</tr>", f);
        for (size_t i = 0; i < p->n_selectors; i++) {
                const ReportSelector *x = &p->selectors[i];
                fputs("<tr data-selector=\"", f);
                put_text(f, x->selector ?: "");
                fprintf(f, "\" data-requests=\"%" PRIu64 "\" data-granted=\"%" PRIu64 "\" data-waited=\"%" PRIu64
                           "\" data-longest-ms=\"%" PRIu64 "\"",
                        x->requests, x->granted, x->waited, x->longest_wait / USEC_PER_MSEC);
                for (ReportReason k = 0; k < _REPORT_REASON_MAX; k++)
                        fprintf(f, " data-%s=\"%" PRIu64 "\"", report_reason_to_string(k), x->refused[k]);
                fputs("><td>", f);
                if (x->selector)
                        put_text(f, x->selector);
                else
                        fputs("<em>anything</em>", f);
                fprintf(f, "</td><td class=\"n\">%" PRIu64 "</td><td class=\"n\">%" PRIu64 "</td><td class=\"n\">%" PRIu64
                           "</td><td class=\"n\">%s</td>",
                        x->requests, x->granted, x->waited, x->granted > 0 ? duration(a, x->longest_wait) : "-");
                for (ReportReason k = 0; k < _REPORT_REASON_MAX; k++)
                        fprintf(f, "<td class=\"n\">%" PRIu64 "</td>", x->refused[k]);
                fputs("</tr>", f);
        }
        fputs("</table>\n", f);
}

/* The capacity curve: the recorded requests re-run at each limit; refusals as bars, the grants' p95 wait
 * written above each, and every figure in the table beside it. */
static void chart_sweep(FILE *f, const ReportPool *p) {
        char a[CLI_DURATION_MAX], b[CLI_DURATION_MAX];

        if (!p->sweep && !p->sweep_error)
                return;
        fputs("<h3>Capacity: the recorded requests at other limits</h3><p class=\"summary\">", f);
        if (!p->sweep) {
                fputs("The recorded requests could not be replayed: ", f);
                put_text(f, p->sweep_error);
                fputs(".</p>\n", f);
                return;
        }
        const ReportSweepPoint *first = &p->sweep[0], *last = &p->sweep[p->n_sweep - 1];
        fprintf(f, "The %" PRIu64 " requests recorded for this pool (its whole history), re-run by the simulator at "
                   "each limit (<code>slotctl simulate --replay</code>): at %u slots %" PRIu64 " would be refused "
                   "and 95%% of grants would wait at most %s; at %u slots %" PRIu64 " and %s.</p>\n",
                first->requests, first->limit, first->refused, duration(a, first->p95_wait), last->limit, last->refused,
                duration(b, last->p95_wait));

        fputs("<table class=\"sweep\"><tr><th>limit</th><th>requests</th><th>granted</th><th>refused</th><th>p95 wait</th>"
              "<th>longest wait</th></tr>",
              f);
        uint64_t max = 0;
        for (size_t i = 0; i < p->n_sweep; i++) {
                const ReportSweepPoint *pt = &p->sweep[i];
                fprintf(f, "<tr><td class=\"n\">%u</td><td class=\"n\">%" PRIu64 "</td><td class=\"n\">%" PRIu64
                           "</td><td class=\"n\">%" PRIu64 "</td><td class=\"n\">%s</td><td class=\"n\">%s</td></tr>",
                        pt->limit, pt->requests, pt->granted, pt->refused, duration(a, pt->p95_wait),
                        duration(b, pt->longest_wait));
                max = MAX(max, pt->refused);
        }
        fputs("</table>\n", f);

        double step, top = count_axis_top((double) max, &step);
        svg_open(f, "capacity", "Refusals and p95 wait of the recorded requests at each limit");
        y_axis(f, top, step, 1, "refused requests");
        double w = PLOT_W / (double) p->n_sweep;
        for (size_t i = 0; i < p->n_sweep; i++) {
                const ReportSweepPoint *pt = &p->sweep[i];
                double x = MARGIN_L + w * (double) i, y = plot_y((double) pt->refused, top);
                fprintf(f,
                        "<rect class=\"bar\" data-limit=\"%u\" data-count=\"%" PRIu64 "\" data-p95-ms=\"%" PRIu64 "\" "
                        "data-longest-ms=\"%" PRIu64 "\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"url(#p-busy)\" "
                        "stroke=\"%s\"><title>limit %u: %" PRIu64 " refused</title></rect>",
                        pt->limit, pt->refused, pt->p95_wait / USEC_PER_MSEC, pt->longest_wait / USEC_PER_MSEC, x + w * 0.15, y, w * 0.7, MARGIN_T + PLOT_H - y, COLOUR_INK, pt->limit,
                        pt->refused);
                fprintf(f, "<text class=\"value\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">p95 %s</text>", x + w / 2,
                        y - 4, duration(a, pt->p95_wait));
                fprintf(f, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%u</text>", x + w / 2,
                        MARGIN_T + PLOT_H + 18, pt->limit);
        }
        fprintf(f, "<text class=\"axis-title\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">limit (slots); above each bar, "
                   "the 95th percentile wait of the grants</text>",
                MARGIN_L + PLOT_W / 2, CHART_H - 8);
        fprintf(f, "<desc>%zu bars</desc></svg>\n", p->n_sweep);
}

/* The members a chart shows at most: beyond, bars too thin to read (the table lists them all). */
#define MEMBER_BARS_MAX 48
#define MEMBER_LABEL_MAX 16 /* bytes of a name under its bar */

static int member_cmp_use(const void *a, const void *b) {
        const ReportMember *x = *(const ReportMember *const *) a, *y = *(const ReportMember *const *) b;
        if (x->held != y->held)
                return x->held < y->held ? 1 : -1;
        return strcmp(x->name, y->name);
}

/* Per member of a member pool (SPEC §3.6): its share of the range held, its leases, the failures and
 * quarantines; the flaky rig stands out in the table, the worn one (most held) in the chart. */
static void chart_members(FILE *f, const Report *r, const ReportPool *p) {
        char a[CLI_DURATION_MAX];

        if (p->n_members == 0)
                return;
        uint64_t failures = 0, quarantines = 0;
        for (size_t i = 0; i < p->n_members; i++) {
                failures += p->members[i].failures;
                quarantines += p->members[i].quarantines;
        }
        fputs("<h3>Use per member</h3><p class=\"summary\">", f);
        fprintf(f, "Each member's share of the range held (the time in it of its leases that ended in it), the leases granted it and those "
                   "that ended, the failures (leases whose command exited non-zero, as <code>slotctl run</code> told at "
                   "the release) and the times it was quarantined (by a job or a person). "
                   "%zu members; %" PRIu64 " failures, %" PRIu64 " quarantines.</p>\n",
                p->n_members, failures, quarantines);
        fputs("<table class=\"members\"><tr><th>member</th><th>use</th><th>grants</th><th>holds</th><th>held</th>"
              "<th>failures</th><th>quarantines</th></tr>",
              f);
        for (size_t i = 0; i < p->n_members; i++) {
                const ReportMember *m = &p->members[i];
                double use = report_member_use(r, m);
                fputs("<tr data-member=\"", f);
                put_text(f, m->name);
                fprintf(f, "\" data-use=\"%.4f\" data-grants=\"%" PRIu64 "\" data-holds=\"%" PRIu64 "\" data-held-ms=\"%" PRIu64
                           "\" data-failures=\"%" PRIu64 "\" data-quarantines=\"%" PRIu64 "\"><td>",
                        use, m->grants, m->holds, m->held / USEC_PER_MSEC, m->failures, m->quarantines);
                put_text(f, m->name);
                fprintf(f, "</td><td class=\"n\">%.1f%%</td><td class=\"n\">%" PRIu64 "</td><td class=\"n\">%" PRIu64
                           "</td><td class=\"n\">%s</td><td class=\"n\">%" PRIu64 "</td><td class=\"n\">%" PRIu64 "</td></tr>",
                        use * 100, m->grants, m->holds, duration(a, m->held), m->failures, m->quarantines);
        }
        fputs("</table>\n", f);

        size_t n = MIN(p->n_members, (size_t) MEMBER_BARS_MAX);
        _cleanup_free_ const ReportMember **order = calloc(p->n_members, sizeof(ReportMember *));
        if (!order)
                return; /* the table has every figure */
        for (size_t i = 0; i < p->n_members; i++)
                order[i] = &p->members[i];
        qsort(order, p->n_members, sizeof(ReportMember *), member_cmp_use);

        svg_open(f, "members", n < p->n_members ? "Use per member (the most used)" : "Use per member");
        y_axis(f, 100, 20, 1, "% of the range held");
        double w = PLOT_W / (double) n;
        for (size_t i = 0; i < n; i++) {
                const ReportMember *m = order[i];
                double use = report_member_use(r, m) * 100, x = MARGIN_L + w * (double) i, y = plot_y(use, 100);
                fputs("<rect class=\"bar\" data-member=\"", f);
                put_text(f, m->name);
                fprintf(f, "\" data-use=\"%.4f\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\" "
                           "stroke=\"%s\"><title>",
                        use / 100, x + w * 0.15, y, w * 0.7, MARGIN_T + PLOT_H - y, COLOUR_IN_USE, COLOUR_INK);
                put_text(f, m->name);
                fprintf(f, ": %.1f%% held, %" PRIu64 " failures, %" PRIu64 " quarantines</title></rect>", use, m->failures,
                        m->quarantines);
                if (m->failures + m->quarantines > 0)
                        /* failures and quarantines above the bar: the flaky rig at a glance */
                        fprintf(f, "<text class=\"value\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%" PRIu64 "/%" PRIu64
                                   "</text>",
                                x + w / 2, y - 4, m->failures, m->quarantines);
                fputs("<text class=\"tick\" x=\"0\" y=\"0\" text-anchor=\"end\" ", f);
                fprintf(f, "transform=\"translate(%.1f %.1f) rotate(-30)\">", x + w / 2, MARGIN_T + PLOT_H + 14);
                /* a long name cut (at a whole UTF-8 character) so that it stays under its bar; the table has it whole */
                char label[MEMBER_LABEL_MAX + 4];
                size_t len = strlen(m->name);
                if (len > MEMBER_LABEL_MAX) {
                        len = MEMBER_LABEL_MAX;
                        while (len > 0 && ((unsigned char) m->name[len] & 0xC0) == 0x80)
                                len--;
                        snprintf(label, sizeof label, "%.*s…", (int) len, m->name);
                } else
                        snprintf(label, sizeof label, "%s", m->name);
                put_text(f, label);
                fputs("</text>", f);
        }
        fprintf(f, "<text class=\"axis-title\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">member; above a bar, "
                   "failures/quarantines</text>",
                MARGIN_L + PLOT_W, CHART_H - 4);
        fprintf(f, "<desc>%zu bars</desc></svg>\n", n);
}

static void pool_summary(FILE *f, const Report *r, const ReportPool *p) {
        fputs("<p class=\"summary\">", f);
        put_figure(f, "requests", p->granted + p->refused_total);
        fputs(" requests: ", f);
        put_figure(f, "grants", p->granted);
        fputs(" granted, ", f);
        put_figure(f, "refusals", p->refused_total);
        fprintf(f, " refused, %" PRIu64 " withdrawn by their clients while waiting; %" PRIu64 " leases ended, ", p->cancelled,
                p->released);
        put_figure(f, "revoked", p->revoked);
        fputs(" revoked.", f);
        if (p->clamped)
                fputs(" <span class=\"muted\">Some leases or waits began before the oldest row kept (history-retention=): "
                      "counts near the start may be low.</span>",
                      f);
        fputs("</p>\n", f);
}

static bool pool_is_empty(const ReportPool *p) {
        return p->granted + p->refused_total + p->cancelled + p->released + p->revoked == 0 && p->peak_in_use == 0 &&
               p->peak_waiting == 0;
}

static void section_pool(FILE *f, const Report *r, const ReportPool *p) {
        fputs("<section class=\"pool\" data-pool=\"", f);
        put_text(f, p->name);
        fputs("\"><h2>Pool ", f);
        put_text(f, p->name);
        fputs("</h2>\n", f);
        if (pool_is_empty(p)) {
                fputs("<p class=\"summary empty\">Nothing was recorded for this pool in this range: no request, no "
                      "lease.</p></section>\n",
                      f);
                return;
        }
        pool_summary(f, r, p);
        chart_timeline(f, r, p);
        chart_waits(f, r, p);
        chart_wait_histogram(f, p);
        chart_refusals(f, r, p);
        table_selectors(f, p);
        chart_members(f, r, p);
        chart_sweep(f, p);
        fputs("</section>\n", f);
}

/* ---- the tables across pools ---- */

static void table_rows(FILE *f, const Report *r, const char *class, const ReportRow *rows, size_t n, bool jobs) {
        fprintf(f, "<table class=\"%s\"><tr>", class);
        if (jobs) {
                fputs("<th>job</th><th>refusals</th>", f);
                for (ReportReason k = 0; k < _REPORT_REASON_MAX; k++)
                        fprintf(f, "<th>%s</th>", report_reason_to_string(k));
        } else
                fputs("<th>time</th><th>pool</th><th>lane</th><th>job</th><th>held</th><th>what</th><th>lease</th>", f);
        fputs("</tr>", f);
        for (size_t i = 0; i < n; i++) {
                const ReportRow *row = &rows[i];
                fputs("<tr><td>", f);
                if (jobs) {
                        put_text(f, row->job);
                        fprintf(f, "</td><td class=\"n\">%" PRIu64 "</td>", row->count);
                        for (ReportReason k = 0; k < _REPORT_REASON_MAX; k++)
                                fprintf(f, "<td class=\"n\">%" PRIu64 "</td>", row->refused[k]);
                } else {
                        char t[TIME_MAX], d[CLI_DURATION_MAX];
                        fputs(when(r, t, row->time, "%Y-%m-%d %H:%M:%S"), f);
                        fputs("</td><td>", f);
                        put_text(f, row->pool);
                        fputs("</td><td>", f);
                        put_text(f, row->lane);
                        fputs("</td><td>", f);
                        put_text(f, row->job);
                        fprintf(f, "</td><td class=\"n\">%s</td><td>",
                                row->duration == USEC_INFINITY ? "-" : duration(d, row->duration));
                        put_text(f, row->what);
                        fputs("</td><td><code>", f);
                        put_text(f, row->lease);
                        fputs("</code></td>", f);
                }
                fputs("</tr>", f);
        }
        fputs("</table>\n", f);
}

static void section_tables(FILE *f, const Report *r) {
        fputs("<section class=\"tables\"><h2>Jobs, holds and revocations</h2>\n", f);
        fputs("<h3>Jobs refused most</h3>", f);
        if (r->n_jobs == 0)
                fputs("<p class=\"summary\">No request was refused.</p>\n", f);
        else {
                fprintf(f, "<p class=\"summary\">The %zu jobs (by their %s) refused most often.</p>\n", r->n_jobs,
                        r->virtual_clock ? "request's name, or the arrivals that made them" : "--job label");
                table_rows(f, r, "jobs", r->jobs, r->n_jobs, true);
        }
        fputs("<h3>Longest holds</h3>", f);
        if (r->n_holds == 0)
                fputs("<p class=\"summary\">No lease ended in this range.</p>\n", f);
        else {
                char d[CLI_DURATION_MAX];
                fprintf(f, "<p class=\"summary\">The %zu longest leases that ended in this range; the longest was held %s.</p>\n",
                        r->n_holds, duration(d, r->holds[0].duration));
                table_rows(f, r, "holds", r->holds, r->n_holds, false);
        }
        fputs("<h3>Revocations</h3><p class=\"summary\">", f);
        put_figure(f, "revocations", r->revocations_total);
        if (r->revocations_total == 0)
                fputs(" leases were revoked or went overdue.</p>\n", f);
        else {
                fprintf(f, " leases were revoked (max-hold, a release or an administrator) or went overdue%s.</p>\n",
                        r->revocations_total > r->n_revocations ? "; the first are listed" : "");
                table_rows(f, r, "revocations", r->revocations, r->n_revocations, false);
        }
        fputs("</section>\n", f);
}

/* Fill patterns of the refusal reasons and of congestion: meaning carried by texture, not only by colour. */
static void defs(FILE *f) {
        fputs("<svg width=\"0\" height=\"0\" style=\"position:absolute\" aria-hidden=\"true\"><defs>", f);
        fprintf(f, "<pattern id=\"p-congested\" width=\"8\" height=\"8\" patternUnits=\"userSpaceOnUse\" "
                   "patternTransform=\"rotate(45)\"><rect width=\"8\" height=\"8\" fill=\"#f3e3c3\"/>"
                   "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"8\" stroke=\"#c9a25b\" stroke-width=\"3\"/></pattern>");
        fprintf(f, "<pattern id=\"p-busy\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\">"
                   "<rect width=\"6\" height=\"6\" fill=\"%s\"/></pattern>",
                reason_style[REPORT_REASON_BUSY].colour);
        fprintf(f, "<pattern id=\"p-full\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">"
                   "<rect width=\"6\" height=\"6\" fill=\"#fff\"/><line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"%s\" "
                   "stroke-width=\"3\"/></pattern>",
                reason_style[REPORT_REASON_FULL].colour);
        fprintf(f, "<pattern id=\"p-timeout\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\">"
                   "<rect width=\"6\" height=\"6\" fill=\"#fff\"/><circle cx=\"3\" cy=\"3\" r=\"1.8\" fill=\"%s\"/></pattern>",
                reason_style[REPORT_REASON_TIMEOUT].colour);
        fprintf(f, "<pattern id=\"p-shed\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\">"
                   "<rect width=\"6\" height=\"6\" fill=\"#fff\"/><path d=\"M0 0L6 6M6 0L0 6\" stroke=\"%s\" "
                   "stroke-width=\"1.5\"/></pattern>",
                reason_style[REPORT_REASON_SHED].colour);
        fprintf(f, "<pattern id=\"p-unavailable\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\">"
                   "<rect width=\"6\" height=\"6\" fill=\"#fff\"/><line x1=\"0\" y1=\"3\" x2=\"6\" y2=\"3\" stroke=\"%s\" "
                   "stroke-width=\"2\"/></pattern>",
                reason_style[REPORT_REASON_UNAVAILABLE].colour);
        fputs("</defs></svg>\n", f);
}

int report_html_write(const Report *r, const ReportHtmlOptions *o, FILE *f) {
        char a[TIME_MAX], b[TIME_MAX], z[TIME_MAX], d[CLI_DURATION_MAX];

        format_time(a, r->since, "%Y-%m-%d %H:%M:%S");
        format_time(b, r->until, "%Y-%m-%d %H:%M:%S");
        format_time(z, r->since, "%Z");
        /* A virtual clock has no date nor zone: its run as 1970 in local time made the page differ with TZ. */
        char title[2 * TIME_MAX + CLI_DURATION_MAX + 32];
        if (r->virtual_clock)
                snprintf(title, sizeof title, "a simulated run of %s", duration(d, r->until - r->since));
        else
                snprintf(title, sizeof title, "%s to %s", a, b);
        fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                   "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
                   "<title>slotbroker report, %s</title><style>%s</style></head>\n<body>\n",
                title, css);
        defs(f);
        if (r->virtual_clock)
                fprintf(f, "<h1>Slot usage report</h1>\n<p class=\"range\">A simulated run of %s",
                        duration(d, r->until - r->since));
        else
                fprintf(f, "<h1>Slot usage report</h1>\n<p class=\"range\">From <time>%s</time> to <time>%s</time> (%s)", a,
                        b, z);
        if (o && o->source) {
                fputs(", from <code>", f);
                put_text(f, o->source);
                fputs("</code>", f);
        }
        if (o && o->generator) {
                fputs(", by ", f);
                put_text(f, o->generator);
        }
        fputs(r->virtual_clock ? ". Leases count once whatever their number of slots; a lane's max-hold is not applied to "
                                 "the drawing.</p>\n" :
                                 ". Leases count once whatever their number of slots (history.db does not record it).</p>\n",
              f);

        if (r->n_pools == 0)
                fputs("<p class=\"summary empty\">The history holds no decision in this range.</p>\n", f);
        for (size_t i = 0; i < r->n_pools; i++)
                section_pool(f, r, &r->pools[i]);
        if (r->n_pools > 0)
                section_tables(f, r);
        fputs("</body></html>\n", f);
        if (fflush(f) != 0)
                return -errno; /* ENOSPC says more than EIO */
        return ferror(f) ? -EIO : 0;
}
