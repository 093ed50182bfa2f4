/* SPDX-License-Identifier: MIT */
/* report.h — `slotctl report` (report.c): history.db read as a stream of rows in time order into
 * report-data's aggregates, then drawn by report-html into one self-contained HTML file; and the writing
 * of such a file, which `slotctl simulate --html` shares. */
#pragma once

#include "report-data.h"
#include "report-html.h"

/* Writes the page to path ("-": standard output), whole or not at all (a temporary file beside it, renamed
 * over it). Returns 0, or a negative errno after logging. */
int report_write_file(const Report *r, const ReportHtmlOptions *o, const char *path);
