/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report-sim.h"
#include "selector.h"

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

/* A request's label in the tables, where a recorded history has its --job: the request's name, or the
 * traffic that generated it ("--arrivals", "arrivals[0]"). */
static const char *sim_job(const Scenario *s, const SimRecord *rec) {
        const char *name = scenario_request_name(s, rec->id);
        if (name)
                return name;
        const ScenarioTraffic *t = scenario_traffic(s, rec->id);
        return t && t->origin ? t->origin : "-";
}

typedef struct SimHold {
        const SimRecord *rec;
        uint64_t hold_ms;
} SimHold;

static int compare_holds(const void *a, const void *b) {
        const SimHold *x = a, *y = b;
        if (x->hold_ms != y->hold_ms)
                return x->hold_ms > y->hold_ms ? -1 : 1;
        return x->rec->id < y->rec->id ? -1 : x->rec->id > y->rec->id;
}

/* The tables a recorded history fills from history.db (report.c): the longest holds that ended, the jobs
 * refused most. A simulation revokes nothing. */
static int sim_tables(Report *r, const Scenario *s, const SimResult *res) {
        _cleanup_free_ SimHold *holds = calloc(MAX(res->n_records, 1u), sizeof(SimHold));
        size_t n = 0;
        if (!holds)
                return -ENOMEM;
        for (size_t i = 0; i < res->n_records; i++) {
                const SimRecord *rec = &res->records[i];
                const ScenarioTraffic *t = scenario_traffic(s, rec->id);
                if (rec->pool && rec->outcome == SIM_OUTCOME_GRANTED && t && t->hold_ms != SIM_FOREVER)
                        holds[n++] = (SimHold) { rec, t->hold_ms };
        }
        qsort(holds, n, sizeof(SimHold), compare_holds);
        for (size_t i = 0; i < MIN(n, (size_t) REPORT_TABLE_ROWS); i++) {
                const SimRecord *rec = holds[i].rec;
                const ScenarioTraffic *t = scenario_traffic(s, rec->id);
                char lease[32];
                snprintf(lease, sizeof lease, "#%" PRIu64, rec->id + 1);
                int k = report_table_add(r->holds, &r->n_holds,
                                         &(ReportRow) {
                                                 .time = (rec->decided_ms + holds[i].hold_ms) * USEC_PER_MSEC,
                                                 .pool = (char *) rec->pool,
                                                 .lane = t->lane ?: (char *) "default",
                                                 .job = (char *) sim_job(s, rec),
                                                 .lease = lease,
                                                 .duration = holds[i].hold_ms * USEC_PER_MSEC,
                                         });
                if (k < 0)
                        return k;
        }

        /* Refusals by job: as many jobs as the scenario has traffics and named requests. */
        ReportRow *jobs = NULL;
        size_t n_jobs = 0;
        int k = 0;
        for (size_t i = 0; i < res->n_records && k >= 0; i++) {
                const SimRecord *rec = &res->records[i];
                if (!rec->pool || rec->outcome != SIM_OUTCOME_REFUSED)
                        continue;
                ReportReason reason = report_reason_from_string(refusal_to_string(rec->refusal));
                if (reason < 0)
                        continue;
                const char *job = sim_job(s, rec);
                size_t j = 0;
                while (j < n_jobs && !streq(jobs[j].job, job))
                        j++;
                if (j == n_jobs) {
                        ReportRow *a = reallocarray(jobs, n_jobs + 1, sizeof(ReportRow));
                        if (!a) {
                                k = -ENOMEM;
                                break;
                        }
                        jobs = a;
                        jobs[n_jobs++] = (ReportRow) { .job = (char *) job, .duration = USEC_INFINITY };
                }
                jobs[j].count++;
                jobs[j].refused[reason]++;
        }
        if (k >= 0) {
                /* Most refused first, then by label, as report.c's query orders them. */
                for (size_t i = 1; i < n_jobs; i++)
                        for (size_t j = i; j > 0 && (jobs[j].count > jobs[j - 1].count ||
                                                     (jobs[j].count == jobs[j - 1].count && strcmp(jobs[j].job, jobs[j - 1].job) < 0)); j--) {
                                ReportRow tmp = jobs[j];
                                jobs[j] = jobs[j - 1];
                                jobs[j - 1] = tmp;
                        }
                for (size_t i = 0; i < MIN(n_jobs, (size_t) REPORT_TABLE_ROWS) && k >= 0; i++)
                        k = report_table_add(r->jobs, &r->n_jobs, &jobs[i]);
        }
        free(jobs);
        return k;
}

typedef struct SimSelector {
        const char *pool;
        ReportSelector row;       /* row.selector owned; NULL: nothing asked */
} SimSelector;

static int compare_selectors(const void *a, const void *b) {
        const SimSelector *x = a, *y = b;
        int c = strcmp(x->pool, y->pool);
        if (c != 0)
                return c;
        if (x->row.requests != y->row.requests)
                return x->row.requests > y->row.requests ? -1 : 1;
        return strcmp(x->row.selector ?: "", y->row.selector ?: ""); /* as report.c's query: NULL first */
}

/* Waits and refusals per label set, as report.c reads them from events.selector: grouped by what each
 * request's traffic asked of the members (as many groups as the scenario has traffics at most). */
static int sim_selectors(Report *r, const Scenario *s, const SimResult *res) {
        SimSelector *groups = NULL;
        size_t n = 0;
        int k = 0;

        for (size_t i = 0; i < res->n_records && k >= 0; i++) {
                const SimRecord *rec = &res->records[i];
                const ScenarioTraffic *t = scenario_traffic(s, rec->id);
                _cleanup_free_ char *canon = NULL;
                ReportReason reason = _REPORT_REASON_INVALID;

                if (!rec->pool || rec->outcome == SIM_OUTCOME_PENDING || !t)
                        continue;
                if (rec->outcome == SIM_OUTCOME_REFUSED &&
                    (reason = report_reason_from_string(refusal_to_string(rec->refusal))) < 0)
                        continue;
                Selector sel = { .terms = t->labels, .member = t->member };
                if (!selector_is_empty(&sel) && (k = selector_canon(&sel, &canon)) < 0)
                        break;
                size_t j = 0;
                while (j < n && !(streq(groups[j].pool, rec->pool) && streq_ptr(groups[j].row.selector, canon)))
                        j++;
                if (j == n) {
                        SimSelector *a = reallocarray(groups, n + 1, sizeof(SimSelector));
                        if (!a) {
                                k = -ENOMEM;
                                break;
                        }
                        groups = a;
                        groups[n++] = (SimSelector) { .pool = rec->pool, .row.selector = TAKE_PTR(canon) };
                }
                ReportSelector *row = &groups[j].row;
                row->requests++;
                if (rec->outcome == SIM_OUTCOME_GRANTED) {
                        usec_t wait = (rec->decided_ms - rec->arrived_ms) * USEC_PER_MSEC;
                        row->granted++;
                        row->waited += wait > 0;
                        row->longest_wait = MAX(row->longest_wait, wait);
                } else
                        row->refused[reason]++;
        }
        if (k >= 0 && n > 0)
                qsort(groups, n, sizeof(SimSelector), compare_selectors);
        for (size_t i = 0; i < n && k >= 0; i++) {
                ReportPool *p = report_pool(r, groups[i].pool);
                k = p ? report_pool_add_selector(p, &groups[i].row) : -ENOMEM;
        }
        for (size_t i = 0; i < n; i++)
                free(groups[i].row.selector);
        free(groups);
        return k;
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

        int k = report_new(0, (end_ms + 1) * USEC_PER_MSEC, 0, &r);
        if (k < 0)
                return k;
        r->virtual_clock = true;
        for (size_t i = 0; i < n; i++) {
                k = report_add(r, &events[i].event);
                if (k < 0)
                        return k;
        }
        report_finish(r);
        k = sim_tables(r, s, res);
        if (k >= 0)
                k = sim_selectors(r, s, res);
        if (k < 0)
                return k;
        *ret = TAKE_PTR(r);
        return 0;
}
