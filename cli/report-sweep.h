/* SPDX-License-Identifier: MIT */
/* report-sweep.h — `slotctl report --replay-sweep limit=A..B`: a pool's recorded arrivals and holds re-run by
 * the simulator at each limit, the engine and replay of `slotctl simulate --replay … --sweep`, as the
 * report's capacity curve. */
#pragma once

#include "report-data.h"

/* Replays the requests history holds for pool p (all of them: the replay does not take the report's range)
 * at every limit from..to, filling p->sweep. A pool the replay cannot model (no requests, no lease that
 * ended to borrow a hold from, …) gets p->sweep_error instead. Returns 0, -ENOMEM, or what the simulator
 * returned. */
int report_sweep_pool(const char *history, ReportPool *p, unsigned from, unsigned to);
