/* SPDX-License-Identifier: MIT */
/* report-sim.h — `slotctl simulate --html`: a simulated run as the report's aggregates, so that it is drawn
 * by the same charts as a recorded history (report-html.c), on the simulation's virtual clock. */
#pragma once

#include "report-data.h"
#include "scenario.h"
#include "simulate.h"

/* The run's requests (its records: run it with per_request) as report events in the simulator's
 * same-instant order: leases that end, then arrivals, then decisions. A lease holds its request's hold (a
 * lane's max-hold is not applied); one that is held forever is held to the end. Returns 0 and a finished
 * Report whose clock starts at 0 (virtual_clock), -ENOMEM. */
int report_from_simulation(const Scenario *s, const SimResult *res, Report **ret);
