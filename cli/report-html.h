/* SPDX-License-Identifier: MIT */
/* report-html.h — a Report drawn as one self-contained HTML page: inline SVG charts and CSS, no script, no
 * font or image from anywhere else, so that it opens from a file on an air-gapped machine and prints. Pure:
 * writes to the FILE it is given, reads no clock (times are shown in the local zone, TZ). */
#pragma once

#include <stdio.h>

#include "report-data.h"

typedef struct ReportHtmlOptions {
        const char *source;       /* what the report was made from ("/var/lib/brokerd/history.db"), or NULL */
        const char *generator;    /* "slotctl 1.0", or NULL */
} ReportHtmlOptions;

/* Every chart is an <svg class="chart" data-chart="timeline|waits|wait-histogram|refusals"> inside the
 * <section class="pool" data-pool="NAME"> of its pool, after a <p class="summary"> that says in words what
 * it shows; the summary's figures are <span data-figure="granted|refused|busy|…">. Meaning never rests on
 * colour alone: series differ by dash, marker shape or fill pattern too, and are labelled.
 * Returns 0, or -EIO when the stream failed. */
int report_html_write(const Report *r, const ReportHtmlOptions *o, FILE *f);
