/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>

#include "report-sim.h"

typedef struct SimEvent {
        ReportEvent event;
        unsigned order;           /* at one instant: ends 0, arrivals 1, decisions 2 */
        size_t seq;               /* then as the records come (arrival order) */
} SimEvent;

static int compare_events(const void *a, const void *b) {
        const SimEvent *x = a, *y = b;
        if (x->event.time != y->event.time)
                return x->event.time < y->event.time ? -1 : 1;
        if (x->order != y->order)
                return x->order < y->order ? -1 : 1;
        return x->seq < y->seq ? -1 : x->seq > y->seq;
}

int report_from_simulation(const Scenario *s, const SimResult *res, Report **ret) {
        _cleanup_(report_freep) Report *r = NULL;
        _cleanup_free_ SimEvent *events = calloc(MAX(res->n_records, 1u) * 3, sizeof(SimEvent));
        size_t n = 0;
        uint64_t end_ms = res->end_ms;

        if (!events)
                return -ENOMEM;
        for (size_t i = 0; i < res->n_records; i++) {
                const SimRecord *rec = &res->records[i];
                const ScenarioTraffic *t = scenario_traffic(s, rec->id);
                const char *lane = t && t->lane ? t->lane : "default";
                bool saturated = rec->queued && rec->state == QUEUE_STATE_SATURATED;

                if (!rec->pool || rec->outcome == SIM_OUTCOME_PENDING)
                        continue; /* no pool decided anything of it */
                usec_t wait = (rec->decided_ms - rec->arrived_ms) * USEC_PER_MSEC;
                ReportEvent decision = {
                        .kind = rec->outcome == SIM_OUTCOME_GRANTED ? REPORT_GRANTED : REPORT_REFUSED,
                        .time = rec->decided_ms * USEC_PER_MSEC,
                        .pool = rec->pool,
                        .lane = lane,
                        .wait = wait,
                        .saturated = saturated,
                        .reason = rec->outcome == SIM_OUTCOME_REFUSED ?
                                          report_reason_from_string(refusal_to_string(rec->refusal)) : 0,
                };
                if (report_event_ends_wait(&decision))
                        events[n++] = (SimEvent) {
                                .event = { .kind = REPORT_ARRIVED, .time = rec->arrived_ms * USEC_PER_MSEC,
                                           .pool = rec->pool, .saturated = saturated },
                                .order = 1, .seq = i,
                        };
                events[n++] = (SimEvent) { .event = decision, .order = 2, .seq = i };
                if (rec->outcome == SIM_OUTCOME_GRANTED && t && t->hold_ms != SIM_FOREVER) {
                        uint64_t until_ms = rec->decided_ms + t->hold_ms;
                        events[n++] = (SimEvent) {
                                .event = { .kind = REPORT_RELEASED, .time = until_ms * USEC_PER_MSEC,
                                           .pool = rec->pool, .lane = lane },
                                .order = 0, .seq = i,
                        };
                        end_ms = MAX(end_ms, until_ms);
                }
        }
        qsort(events, n, sizeof(SimEvent), compare_events);

        int k = report_new(0, (end_ms + 1) * USEC_PER_MSEC, &r);
        if (k < 0)
                return k;
        r->virtual_clock = true;
        for (size_t i = 0; i < n; i++) {
                k = report_add(r, &events[i].event);
                if (k < 0)
                        return k;
        }
        report_finish(r);
        *ret = TAKE_PTR(r);
        return 0;
}
