/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>

#include "heap.h"
#include "replay.h"
#include "simulate.h"

/* ---- peak queue by second ---- */

void peak_queue_init(PeakQueue *p) {
        *p = (PeakQueue) {};
}

void peak_queue_done(PeakQueue *p) {
        free(p->seconds);
        *p = (PeakQueue) {};
}

int peak_queue_observe(PeakQueue *p, uint64_t t_ms, uint32_t waiting) {
        uint64_t second = t_ms / 1000;

        assert(p->n == 0 || second + 1 >= p->n); /* instants come in time order */

        if (t_ms > SIM_SPAN_MAX_MS)
                return -E2BIG;
        if (second < p->n)
                p->seconds[second] = MAX(p->seconds[second], waiting);
        else {
                if (second >= p->allocated) {
                        size_t allocated = MIN(MAX((size_t) second + 1, p->allocated * 2),
                                               (size_t) (SIM_SPAN_MAX_MS / 1000 + 1));
                        uint32_t *a = reallocarray(p->seconds, allocated, sizeof(uint32_t));
                        if (!a)
                                return -ENOMEM;
                        p->seconds = a;
                        p->allocated = allocated;
                }
                /* Seconds without an instant carry the count the last instant left. */
                for (size_t k = p->n; k < second; k++)
                        p->seconds[k] = p->current;
                p->seconds[second] = waiting;
                p->n = (size_t) second + 1;
        }
        p->current = waiting;
        return 0;
}

uint32_t peak_queue_max(const PeakQueue *p) {
        uint32_t m = 0;
        for (size_t i = 0; i < p->n; i++)
                m = MAX(m, p->seconds[i]);
        return m;
}

/* ---- the run ---- */

typedef struct SimLease {
        HeapNode node;        /* keyed by when the lease ends, µs */
        EngineLease *lease;
        usec_t arrival;
        bool ending;          /* it will end: a finite hold, or max-hold revokes it */
        struct SimLease *next_free;
} SimLease;

typedef struct Sim {
        const Scenario *scenario;
        const SimOptions *options;
        Engine *engine;
        uint64_t random_state;
        Heap ends;
        SimLease **leases;    /* every lease struct allocated; live ones are reused through free_leases */
        size_t n_leases_allocated;
        SimLease *free_leases;
        uint64_t n_live;      /* leases held */
        uint64_t n_ending;    /* of which will end */
        uint64_t waiting;     /* summed over pools */
        uint64_t last_arrival_ms;
        uint64_t last_end_ms;
        bool any_arrival, any_end;
        SimRecord *records;   /* by id (all, with per_request), or by explicit request index */
        size_t n_records;
        SimResult *result;
} Sim;

uint64_t sim_splitmix64(void *state) {
        uint64_t *s = state;
        uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
        z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
        return z ^ (z >> 31);
}

static SimRecord *sim_record(Sim *sim, uint64_t id) {
        if (sim->options->per_request)
                return id < sim->n_records ? &sim->records[id] : NULL;
        if (id < sim->scenario->n_generated)
                return NULL;
        id -= sim->scenario->n_generated;
        return id < sim->n_records ? &sim->records[id] : NULL;
}

static SimLease *sim_lease_new(Sim *sim) {
        SimLease *l = sim->free_leases;

        if (l) {
                sim->free_leases = l->next_free;
                return l;
        }
        /* At most as many as slots in all pools: the list stays short. */
        SimLease **a = reallocarray(sim->leases, sim->n_leases_allocated + 1, sizeof(SimLease *));
        if (!a)
                return NULL;
        sim->leases = a;
        l = calloc(1, sizeof(SimLease));
        if (!l)
                return NULL;
        sim->leases[sim->n_leases_allocated++] = l;
        return l;
}

static void sim_lease_end(Sim *sim, SimLease *l, uint64_t t_ms) {
        usec_t now = t_ms * USEC_PER_MSEC;
        uint64_t deadline = sim->scenario->deadline_ms;

        /* Late: the client gave up before the work was done (wait + hold > deadline). */
        if (deadline != SIM_FOREVER && now - l->arrival > deadline * USEC_PER_MSEC)
                sim->result->late++;
        sim->last_end_ms = MAX(sim->last_end_ms, t_ms);
        sim->any_end = true;

        engine_lease_release(l->lease, now);
        sim->n_live--;
        if (l->ending)
                sim->n_ending--;
        *l = (SimLease) {
                .next_free = sim->free_leases,
        };
        heap_node_init(&l->node);
        sim->free_leases = l;
}

static int sim_lease_start(Sim *sim, const EngineEvent *ev, uint64_t id) {
        const ScenarioTraffic *t = scenario_traffic(sim->scenario, id);
        SimLease *l = sim_lease_new(sim);
        int r;

        if (!l)
                return -ENOMEM;
        heap_node_init(&l->node);
        l->lease = ev->lease;
        l->arrival = ev->arrival;
        l->next_free = NULL;
        engine_lease_set_userdata(ev->lease, l);
        sim->n_live++;

        if (t && t->hold_ms != SIM_FOREVER) {
                r = heap_push(&sim->ends, &l->node, usec_add(ev->at, t->hold_ms * USEC_PER_MSEC));
                if (r < 0)
                        return r;
                l->ending = true;
        } else
                l->ending = engine_lease_expires_at(ev->lease) != USEC_INFINITY;
        if (l->ending)
                sim->n_ending++;
        return 0;
}

static void record_queue_facts(SimRecord *rec, const Scenario *s, const EngineEvent *ev) {
        if (!rec)
                return;
        rec->pool = scenario_pool_name(s, ev->pool);
        rec->queued = ev->queued;
        rec->state = ev->state;
        rec->idle = ev->idle;
        rec->budget = ev->budget;
}

static int sim_handle_event(Sim *sim, const EngineEvent *ev) {
        SimResult *res = sim->result;
        uint64_t id = (uint64_t) (uintptr_t) ev->userdata - 1;
        SimRecord *rec;
        int r;

        switch (ev->type) {
        case ENGINE_EVENT_QUEUED:
                sim->waiting++;
                rec = sim_record(sim, id);
                record_queue_facts(rec, sim->scenario, ev);
                if (rec)
                        rec->queued = true;
                return 0;

        case ENGINE_EVENT_GRANTED:
                if (ev->queued)
                        sim->waiting--;
                res->granted++;
                res->longest_wait_ms = MAX(res->longest_wait_ms, ev->wait / USEC_PER_MSEC);
                rec = sim_record(sim, id);
                record_queue_facts(rec, sim->scenario, ev);
                if (rec) {
                        rec->outcome = SIM_OUTCOME_GRANTED;
                        rec->decided_ms = ev->at / USEC_PER_MSEC;
                        rec->waited_ms = ev->wait / USEC_PER_MSEC;
                }
                r = sim_lease_start(sim, ev, id);
                return r;

        case ENGINE_EVENT_REFUSED:
                if (ev->queued)
                        sim->waiting--;
                if (ev->refusal >= 0 && ev->refusal < _REFUSAL_MAX)
                        res->refused[ev->refusal]++;
                res->first_refusal_ms = MIN(res->first_refusal_ms, ev->at / USEC_PER_MSEC);
                rec = sim_record(sim, id);
                record_queue_facts(rec, sim->scenario, ev);
                if (rec) {
                        rec->outcome = SIM_OUTCOME_REFUSED;
                        rec->refusal = ev->refusal;
                        rec->decided_ms = ev->at / USEC_PER_MSEC;
                }
                return 0;

        case ENGINE_EVENT_REVOKE: {
                /* max-hold: the command is killed, so the lease ends at this instant (a second pass of it). */
                SimLease *l = engine_lease_get_userdata(ev->lease);
                if (!l)
                        return 0;
                heap_remove(&sim->ends, &l->node);
                if (!l->ending) {
                        l->ending = true;
                        sim->n_ending++;
                }
                return heap_push(&sim->ends, &l->node, ev->at);
        }

        case ENGINE_EVENT_CONGESTION:
        default:
                return 0;
        }
}

static int sim_arrive(Sim *sim, const Arrival *a) {
        const ScenarioTraffic *t = a->traffic;
        EngineRequest *request = NULL;
        int r;

        EngineAcquire acquire = {
                .lane = t->lane,
                .slots = t->slots,
                .no_wait = t->no_wait,
                .max_wait = t->max_wait,
                .userdata = (void *) (uintptr_t) (a->id + 1),
        };
        r = engine_acquire(sim->engine, &acquire, a->at_ms * USEC_PER_MSEC, &request);
        if (r < 0)
                return r;
        /* Events tell everything that follows; the request itself is not needed. */
        engine_request_unref(request);

        sim->result->requests++;
        sim->last_arrival_ms = a->at_ms;
        sim->any_arrival = true;

        SimRecord *rec = sim_record(sim, a->id);
        if (rec) {
                *rec = (SimRecord) {
                        .id = a->id,
                        .arrived_ms = a->at_ms,
                        .idle = USEC_INFINITY,
                        .budget = USEC_INFINITY,
                        .outcome = SIM_OUTCOME_PENDING,
                };
        }
        return 0;
}

/* The next instant, in ms: the next arrival, hold end or engine wakeup. SIM_FOREVER when nothing is left. */
static uint64_t sim_next_instant(Sim *sim, const ArrivalCursor *cursor, bool started, uint64_t t) {
        uint64_t next = arrival_cursor_peek(cursor);

        HeapNode *top = heap_peek(&sim->ends);
        if (top)
                next = MIN(next, top->key / USEC_PER_MSEC + (top->key % USEC_PER_MSEC != 0));

        usec_t wake = engine_next_wakeup(sim->engine);
        if (wake != USEC_INFINITY) {
                uint64_t wake_ms = wake / USEC_PER_MSEC + (wake % USEC_PER_MSEC != 0);
                /* engine_run(t) settled everything up to t; a wakeup at or before it would spin. */
                if (started)
                        wake_ms = MAX(wake_ms, t + 1);
                next = MIN(next, wake_ms);
        }
        return next;
}

/* Records in arrival order, as printed: walking the arrivals again costs O(n) and no sort. */
static int sim_order_records(Sim *sim) {
        const Scenario *s = sim->scenario;
        SimResult *res = sim->result;
        ArrivalCursor cursor;
        Arrival a;
        size_t k = 0;

        if (sim->n_records == 0)
                return 0;
        res->records = calloc(sim->n_records, sizeof(SimRecord));
        if (!res->records)
                return -ENOMEM;

        if (sim->options->per_request) {
                arrival_cursor_init(&cursor, s);
                while (k < sim->n_records && arrival_cursor_next(&cursor, &a))
                        res->records[k++] = sim->records[a.id];
        } else
                for (size_t i = 0; i < s->n_requests; i++)
                        res->records[k++] = sim->records[s->request_order[i]];
        res->n_records = k;
        return 0;
}

static void sim_done(Sim *sim) {
        heap_done(&sim->ends);
        engine_free(sim->engine);
        for (size_t i = 0; i < sim->n_leases_allocated; i++)
                free(sim->leases[i]);
        free(sim->leases);
        free(sim->records);
        sim_result_free(sim->result);
}

SimResult *sim_result_free(SimResult *r) {
        if (!r)
                return NULL;
        peak_queue_done(&r->peaks);
        free(r->records);
        return mfree(r);
}

int sim_run(const Scenario *s, const BrokerConfig *c, const SimOptions *o, SimResult **ret) {
        ArrivalCursor cursor;
        Arrival a;
        EngineEvent ev;
        uint64_t t = 0;
        bool started = false;
        int r;

        assert_return(s && s->finished && c && o && ret, -EINVAL);

        Sim sim = {
                .scenario = s,
                .options = o,
                .random_state = o->seed,
        };
        heap_init(&sim.ends);

        sim.result = calloc(1, sizeof(SimResult));
        if (!sim.result) {
                r = -ENOMEM;
                goto finish;
        }
        peak_queue_init(&sim.result->peaks);
        sim.result->first_refusal_ms = SIM_FOREVER;
        sim.result->drained_ms = SIM_FOREVER;

        /* Per-request records only when they will be printed: a million arrivals need none. */
        sim.n_records = o->per_request ? s->n_generated + s->n_requests : s->n_requests;
        if (sim.n_records > 0) {
                sim.records = calloc(sim.n_records, sizeof(SimRecord));
                if (!sim.records) {
                        r = -ENOMEM;
                        goto finish;
                }
        }

        r = engine_new(sim_splitmix64, &sim.random_state, &sim.engine);
        if (r < 0)
                goto finish;
        r = engine_configure(sim.engine, c, 0);
        if (r < 0)
                goto finish;

        arrival_cursor_init(&cursor, s);
        for (;;) {
                /* The end: all arrivals done, nobody waiting, no hold left that will end. */
                if (arrival_cursor_peek(&cursor) == SIM_FOREVER && sim.waiting == 0 && sim.n_ending == 0)
                        break;
                uint64_t next = sim_next_instant(&sim, &cursor, started, t);
                if (next == SIM_FOREVER || next > UINT64_MAX / USEC_PER_MSEC)
                        break; /* waiters that nothing will ever serve or refuse */
                t = next;
                started = true;
                usec_t now = t * USEC_PER_MSEC;

                /* SPEC §3.3: (1) leases that end free their slots, */
                for (HeapNode *top; (top = heap_peek(&sim.ends)) && top->key <= now;) {
                        heap_pop(&sim.ends);
                        sim_lease_end(&sim, container_of(top, SimLease, node), t);
                }
                /* (2) arrivals in generated order, */
                while (arrival_cursor_peek(&cursor) == t) {
                        arrival_cursor_next(&cursor, &a);
                        r = sim_arrive(&sim, &a);
                        if (r < 0)
                                goto finish;
                }
                /* (3) freed slots go to waiters, (4) budgets that end now refuse. */
                engine_run(sim.engine, now);
                while (engine_pop_event(sim.engine, &ev)) {
                        r = sim_handle_event(&sim, &ev);
                        if (r < 0)
                                goto finish;
                }

                r = peak_queue_observe(&sim.result->peaks, t, (uint32_t) MIN(sim.waiting, (uint64_t) UINT32_MAX));
                if (r < 0)
                        goto finish;
        }

        SimResult *res = sim.result;
        res->end_ms = t;
        /* Drained: from the last arrival until the last finite hold ended; unknown while a hold lasts forever. */
        if (sim.n_live == 0 && sim.any_arrival)
                res->drained_ms = sim.any_end ? usec_sub_unsigned(sim.last_end_ms, sim.last_arrival_ms) : 0;

        r = sim_order_records(&sim);
        if (r < 0)
                goto finish;

        *ret = TAKE_PTR(sim.result);
        r = 0;
finish:
        sim_done(&sim);
        return r;
}

/* ---- reports ---- */

const char *sim_format_tenths(char *buf, size_t size, uint64_t ms) {
        snprintf(buf, size, "%" PRIu64 ".%" PRIu64, ms / 1000, ms % 1000 / 100);
        return buf;
}

static const char *outcome_to_string(const SimRecord *rec) {
        switch (rec->outcome) {
        case SIM_OUTCOME_GRANTED:
                return "granted";
        case SIM_OUTCOME_REFUSED:
                return refusal_to_string(rec->refusal) ?: "refused";
        case SIM_OUTCOME_PENDING:
        default:
                return NULL;
        }
}

static const char *record_state(const SimRecord *rec) {
        if (!rec->queued || rec->state == QUEUE_STATE_NONE)
                return NULL;
        return queue_state_to_string(rec->state);
}

static const char *record_name(const Scenario *s, const SimRecord *rec, char *buf, size_t size) {
        const char *name = scenario_request_name(s, rec->id);
        if (name)
                return name;
        snprintf(buf, size, "%" PRIu64, rec->id + 1);
        return buf;
}

#define LABEL "%-16s"

/* A full row of ten seconds, all of them `value`. */
static bool row_is_uniform(const PeakQueue *p, size_t start, uint32_t value) {
        if (start + 10 > p->n)
                return false;
        for (size_t k = start; k < start + 10; k++)
                if (p->seconds[k] != value)
                        return false;
        return true;
}

static void format_seconds(char *buf, size_t size, uint64_t ms) {
        snprintf(buf, size, "%" PRIu64 ".%" PRIu64 " s", ms / 1000, ms % 1000 / 100);
}

void sim_print_text(const Scenario *s, const SimResult *r, FILE *f) {
        char a[32];
        uint64_t refused = 0;

        for (size_t i = 0; i < _REFUSAL_MAX; i++)
                refused += r->refused[i];

        fprintf(f, LABEL "%4" PRIu64 "\n", "requests", r->requests);
        fprintf(f, LABEL "%4" PRIu64 "\n", "granted", r->granted);
        fprintf(f, LABEL "%4" PRIu64 "  (busy %" PRIu64 ", full %" PRIu64 ", timeout %" PRIu64 ", shed %" PRIu64, "refused",
                refused, r->refused[REFUSAL_BUSY], r->refused[REFUSAL_FULL], r->refused[REFUSAL_TIMEOUT],
                r->refused[REFUSAL_SHED]);
        if (r->refused[REFUSAL_UNAVAILABLE] > 0)
                fprintf(f, ", unavailable %" PRIu64, r->refused[REFUSAL_UNAVAILABLE]);
        fputs(")\n", f);
        if (s->deadline_ms == SIM_FOREVER)
                fprintf(f, LABEL "%4" PRIu64 "  (no deadline)\n", "late", r->late);
        else
                fprintf(f, LABEL "%4" PRIu64 "  (wait + hold over %s s)\n", "late", r->late,
                        sim_format_tenths(a, sizeof a, s->deadline_ms));
        if (r->first_refusal_ms == SIM_FOREVER)
                fprintf(f, LABEL "%4s\n", "first refusal", "none");
        else
                fprintf(f, LABEL "%4s s\n", "first refusal", sim_format_tenths(a, sizeof a, r->first_refusal_ms));
        fprintf(f, LABEL "%4s s\n", "longest wait", sim_format_tenths(a, sizeof a, r->longest_wait_ms));
        if (r->drained_ms != SIM_FOREVER)
                fprintf(f, LABEL "%4s s after the last arrival\n", "drained",
                        sim_format_tenths(a, sizeof a, r->drained_ms));
        else if (r->requests == 0)
                fprintf(f, LABEL "%4s  (nothing arrived)\n", "drained", "-");
        else
                fprintf(f, LABEL "%4s  (a hold lasts forever)\n", "drained", "never");

        /* Ten seconds per row, the row labelled with its seconds; full rows of one value run together. */
        uint32_t peak = peak_queue_max(&r->peaks);
        int width = snprintf(NULL, 0, "%" PRIu32, peak) + 2;
        width = MAX(width, 4);
        fputs("\npeak queue by second\n", f);
        for (size_t i = 0; i < r->peaks.n;) {
                size_t end = i;
                while (row_is_uniform(&r->peaks, end, r->peaks.seconds[i]))
                        end += 10;
                if (end - i >= 20) {
                        snprintf(a, sizeof a, "%zu-%zu", i + 1, end);
                        fprintf(f, "%11s:%*" PRIu32 " in every second\n", a, width, r->peaks.seconds[i]);
                        i = end;
                        continue;
                }
                snprintf(a, sizeof a, "%zu-%zu", i + 1, MIN(i + 10, r->peaks.n));
                fprintf(f, "%11s:", a);
                for (size_t k = i; k < MIN(i + 10, r->peaks.n); k++)
                        fprintf(f, "%*" PRIu32, width, r->peaks.seconds[k]);
                fputc('\n', f);
                i += 10;
        }
        if (r->peaks.n == 0)
                fputs("  (no instant)\n", f);

        if (r->n_records == 0)
                return;

        int name_width = 4, pool_width = 4;
        for (size_t i = 0; i < r->n_records; i++) {
                const SimRecord *rec = &r->records[i];
                name_width = MAX(name_width, (int) strlen(record_name(s, rec, a, sizeof a)));
                if (rec->pool)
                        pool_width = MAX(pool_width, (int) strlen(rec->pool));
        }
        fprintf(f, "\n%-*s  %9s  %-*s  %-10s  %9s  %9s  %-11s  %9s  %9s\n", name_width, "name", "arrived", pool_width,
                "pool", "state", "idle", "budget", "outcome", "decided", "waited");
        for (size_t i = 0; i < r->n_records; i++) {
                const SimRecord *rec = &r->records[i];
                const char *state = record_state(rec);
                const char *outcome = outcome_to_string(rec);
                char arrived[32], idle[32], budget[32], decided[32], waited[32];

                format_seconds(arrived, sizeof arrived, rec->arrived_ms);
                if (state)
                        format_seconds(idle, sizeof idle, rec->idle / USEC_PER_MSEC);
                else
                        snprintf(idle, sizeof idle, "-");
                if (rec->queued && rec->budget != USEC_INFINITY)
                        format_seconds(budget, sizeof budget, rec->budget / USEC_PER_MSEC);
                else
                        snprintf(budget, sizeof budget, rec->queued ? "unbounded" : "-");
                if (outcome)
                        format_seconds(decided, sizeof decided, rec->decided_ms);
                else
                        snprintf(decided, sizeof decided, "-");
                if (rec->outcome == SIM_OUTCOME_GRANTED)
                        format_seconds(waited, sizeof waited, rec->waited_ms);
                else
                        snprintf(waited, sizeof waited, "-");

                fprintf(f, "%-*s  %9s  %-*s  %-10s  %9s  %9s  %-11s  %9s  %9s\n", name_width,
                        record_name(s, rec, a, sizeof a), arrived, pool_width, rec->pool ?: "-", state ?: "-", idle,
                        budget, outcome ?: "waiting", decided, waited);
        }
}

static void json_print_string(FILE *f, const char *s) {
        fputc('"', f);
        for (const unsigned char *p = (const unsigned char *) s; *p; p++) {
                if (*p == '"' || *p == '\\')
                        fprintf(f, "\\%c", *p);
                else if (*p < 0x20 || *p == 0x7f)
                        fprintf(f, "\\u%04x", *p);
                else
                        fputc(*p, f);
        }
        fputc('"', f);
}

static void json_print_ms(FILE *f, uint64_t ms) {
        if (ms == SIM_FOREVER)
                fputs("null", f);
        else
                fprintf(f, "%" PRIu64, ms);
}

static void json_print_record(const Scenario *s, const SimRecord *rec, FILE *f) {
        const char *state = record_state(rec);
        const char *outcome = outcome_to_string(rec);
        char buf[32];

        fputs("{\"name\": ", f);
        json_print_string(f, record_name(s, rec, buf, sizeof buf));
        fprintf(f, ", \"arrivedMs\": %" PRIu64 ", \"pool\": ", rec->arrived_ms);
        if (rec->pool)
                json_print_string(f, rec->pool);
        else
                fputs("null", f);
        fputs(", \"state\": ", f);
        if (state)
                json_print_string(f, state);
        else
                fputs("null", f);
        fputs(", \"idleMs\": ", f);
        json_print_ms(f, state ? rec->idle / USEC_PER_MSEC : SIM_FOREVER);
        fputs(", \"budgetMs\": ", f);
        json_print_ms(f, rec->queued && rec->budget != USEC_INFINITY ? rec->budget / USEC_PER_MSEC : SIM_FOREVER);
        fputs(", \"outcome\": ", f);
        if (outcome)
                json_print_string(f, outcome);
        else
                fputs("null", f);
        fputs(", \"decidedMs\": ", f);
        json_print_ms(f, outcome ? rec->decided_ms : SIM_FOREVER);
        fputs(", \"waitedMs\": ", f);
        json_print_ms(f, rec->outcome == SIM_OUTCOME_GRANTED ? rec->waited_ms : SIM_FOREVER);
        fputc('}', f);
}

void sim_print_json(const Scenario *s, const SimResult *r, FILE *f) {
        fprintf(f, "{\n  \"requests\": %" PRIu64 ",\n  \"granted\": %" PRIu64 ",\n", r->requests, r->granted);
        fprintf(f, "  \"refused\": {\"busy\": %" PRIu64 ", \"full\": %" PRIu64 ", \"timeout\": %" PRIu64
                   ", \"shed\": %" PRIu64,
                r->refused[REFUSAL_BUSY], r->refused[REFUSAL_FULL], r->refused[REFUSAL_TIMEOUT], r->refused[REFUSAL_SHED]);
        /* Cannot happen without drain or reload; shown rather than lost if it ever does. */
        if (r->refused[REFUSAL_UNAVAILABLE] > 0)
                fprintf(f, ", \"unavailable\": %" PRIu64, r->refused[REFUSAL_UNAVAILABLE]);
        fprintf(f, "},\n  \"late\": %" PRIu64 ",\n  \"peakQueueBySecond\": [", r->late);
        for (size_t i = 0; i < r->peaks.n; i++)
                fprintf(f, "%s%" PRIu32, i > 0 ? ", " : "", r->peaks.seconds[i]);
        fputs("],\n  \"firstRefusalMs\": ", f);
        json_print_ms(f, r->first_refusal_ms);
        fprintf(f, ",\n  \"longestWaitMs\": %" PRIu64 ",\n  \"drainedMs\": ", r->longest_wait_ms);
        json_print_ms(f, r->drained_ms);
        fputs(",\n  \"perRequest\": [", f);
        for (size_t i = 0; i < r->n_records; i++) {
                fputs(i > 0 ? ",\n    " : "\n    ", f);
                json_print_record(s, &r->records[i], f);
        }
        fputs(r->n_records > 0 ? "\n  ]\n}\n" : "]\n}\n", f);
}

/* ---- sweep ---- */

typedef struct SweepRow {
        uint64_t value;
        uint64_t requests, granted, late, longest_wait_ms;
        uint64_t refused[_REFUSAL_MAX];
        uint32_t peak;
} SweepRow;

static void sweep_print_text(const char *key, const SweepRow *rows, size_t n, FILE *f) {
        int kw = MAX((int) strlen(key), 5);

        fprintf(f, "%*s  %8s  %8s  %8s  %8s  %8s  %8s  %8s  %12s  %10s\n", kw, key, "requests", "granted", "busy",
                "full", "timeout", "shed", "late", "longest wait", "peak queue");
        for (size_t i = 0; i < n; i++) {
                const SweepRow *w = &rows[i];
                char wait[40];
                format_seconds(wait, sizeof wait, w->longest_wait_ms);
                fprintf(f,
                        "%*" PRIu64 "  %8" PRIu64 "  %8" PRIu64 "  %8" PRIu64 "  %8" PRIu64 "  %8" PRIu64 "  %8" PRIu64
                        "  %8" PRIu64 "  %12s  %10" PRIu32 "\n",
                        kw, w->value, w->requests, w->granted, w->refused[REFUSAL_BUSY], w->refused[REFUSAL_FULL],
                        w->refused[REFUSAL_TIMEOUT], w->refused[REFUSAL_SHED], w->late, wait, w->peak);
        }
}

static void sweep_print_json(const SweepRow *rows, size_t n, FILE *f) {
        fputc('[', f);
        for (size_t i = 0; i < n; i++) {
                const SweepRow *w = &rows[i];
                fprintf(f,
                        "%s\n  {\"value\": %" PRIu64 ", \"requests\": %" PRIu64 ", \"granted\": %" PRIu64
                        ", \"busy\": %" PRIu64 ", \"full\": %" PRIu64 ", \"timeout\": %" PRIu64 ", \"shed\": %" PRIu64
                        ", \"late\": %" PRIu64 ", \"longestWaitMs\": %" PRIu64 ", \"peakQueue\": %" PRIu32 "}",
                        i > 0 ? "," : "", w->value, w->requests, w->granted, w->refused[REFUSAL_BUSY],
                        w->refused[REFUSAL_FULL], w->refused[REFUSAL_TIMEOUT], w->refused[REFUSAL_SHED], w->late,
                        w->longest_wait_ms, w->peak);
        }
        fputs(n > 0 ? "\n]\n" : "]\n", f);
}

/* ---- the verb ---- */

#define SWEEP_VALUES_MAX 1000

static const char *arg_limit = NULL;
static const char *arg_max_queue = NULL;
static const char *arg_queue_timeout = NULL;
static const char *arg_queue_congestion_timeout = NULL;
static const char *arg_hold = NULL;
static const char *arg_arrivals = NULL;
static const char *arg_deadline = NULL;
static const char *arg_scenario = NULL;
static const char *arg_replay = NULL;
static const char *arg_replay_pool = NULL;
static uint64_t arg_seed = 1;
static bool arg_per_request = false;
static bool arg_json = false;
static const char *arg_sweep_key = NULL;
static uint64_t arg_sweep_from = 0, arg_sweep_to = 0;

static void help(void) {
        printf("slotctl simulate [OPTIONS…]\n"
               "slotctl simulate --scenario FILE.json [OPTIONS…]\n"
               "slotctl simulate --replay history.db [--pool NAME] [OPTIONS…]\n\n"
               "Run the admission engine on a virtual millisecond clock: capacity planning without a daemon.\n\n"
               "  --limit N                      Slots of the pool\n"
               "  --max-queue N                  Most requests waiting (default: no cap)\n"
               "  --queue-timeout DUR            Q: enables controlled-delay budgets\n"
               "  --queue-congestion-timeout DUR Budget while saturated (default Q/10)\n"
               "  --hold DUR                     How long every request holds its slot\n"
               "  --arrivals RATE/s:DUR[,…]      Arrival phases, back to back\n"
               "  --deadline DUR                 The client's patience: wait + hold beyond it is late\n"
               "  --scenario FILE                Pools, lanes, arrivals and requests from a JSON file\n"
               "  --replay HISTORY.DB            The requests brokerd recorded, against the pool options given\n"
               "                                 (the recorded pool's otherwise)\n"
               "  --pool NAME                    With --replay: the pool whose requests to replay\n"
               "  --seed N                       Seed of the random source (default 1)\n"
               "  --per-request                  Report every generated request too\n"
               "  --sweep KEY=A..B               One run per value of limit, max-queue or queue-timeout (s)\n"
               "  --json                         Machine-readable output\n"
               "  -h --help                      Show this help\n");
}

static int parse_u64(const char *s, uint64_t *ret) {
        char *end;

        if (!s || *s < '0' || *s > '9')
                return -EINVAL;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno != 0 || *end != '\0')
                return -EINVAL;
        *ret = v;
        return 0;
}

/* The program logs where it decides; usage errors name the culprit and lead to exit 64. */
_printf_(1, 2) static int log_usage(const char *fmt, ...) {
        va_list ap;

        fputs("slotctl simulate: ", stderr);
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
        return -EINVAL;
}

static int log_error_errno(int r, const char *what) {
        fprintf(stderr, "slotctl simulate: %s: %s\n", what, strerror(-r));
        return r;
}

static int parse_sweep(const char *spec) {
        static const char *const keys[] = { "limit", "max-queue", "queue-timeout" };
        uint64_t from, to;

        _cleanup_free_ char *copy = strdup(spec);
        if (!copy)
                return log_error_errno(-ENOMEM, "--sweep");
        char *eq = strchr(copy, '='), *dots = eq ? strstr(eq + 1, "..") : NULL;
        if (!eq || !dots)
                return log_usage("--sweep: expected KEY=A..B, got \"%s\"", spec);
        *eq = '\0';
        *dots = '\0';

        const char *key = NULL;
        for (size_t i = 0; i < ELEMENTSOF(keys); i++)
                if (streq(copy, keys[i]))
                        key = keys[i];
        if (!key)
                return log_usage("--sweep: unknown key \"%s\" (limit, max-queue or queue-timeout)", copy);
        if (parse_u64(eq + 1, &from) < 0 || parse_u64(dots + 2, &to) < 0 || from > to || to > UINT32_MAX)
                return log_usage("--sweep: invalid range \"%s..%s\"", eq + 1, dots + 2);
        if (to - from >= SWEEP_VALUES_MAX)
                return log_usage("--sweep: more than %d values", SWEEP_VALUES_MAX);

        arg_sweep_key = key;
        arg_sweep_from = from;
        arg_sweep_to = to;
        return 0;
}

/* Returns 1 to run, 0 after --help, -EINVAL on a usage error (already reported). */
static int parse_argv(int argc, char *argv[]) {
        enum {
                ARG_LIMIT = 0x100,
                ARG_MAX_QUEUE,
                ARG_QUEUE_TIMEOUT,
                ARG_QUEUE_CONGESTION_TIMEOUT,
                ARG_HOLD,
                ARG_ARRIVALS,
                ARG_DEADLINE,
                ARG_SCENARIO,
                ARG_SEED,
                ARG_PER_REQUEST,
                ARG_JSON,
                ARG_SWEEP,
                ARG_REPLAY,
                ARG_POOL,
        };
        static const struct option options[] = {
                { "help", no_argument, NULL, 'h' },
                { "limit", required_argument, NULL, ARG_LIMIT },
                { "max-queue", required_argument, NULL, ARG_MAX_QUEUE },
                { "queue-timeout", required_argument, NULL, ARG_QUEUE_TIMEOUT },
                { "queue-congestion-timeout", required_argument, NULL, ARG_QUEUE_CONGESTION_TIMEOUT },
                { "hold", required_argument, NULL, ARG_HOLD },
                { "arrivals", required_argument, NULL, ARG_ARRIVALS },
                { "deadline", required_argument, NULL, ARG_DEADLINE },
                { "scenario", required_argument, NULL, ARG_SCENARIO },
                { "seed", required_argument, NULL, ARG_SEED },
                { "per-request", no_argument, NULL, ARG_PER_REQUEST },
                { "json", no_argument, NULL, ARG_JSON },
                { "sweep", required_argument, NULL, ARG_SWEEP },
                { "replay", required_argument, NULL, ARG_REPLAY },
                { "pool", required_argument, NULL, ARG_POOL },
                {}
        };
        /* The pool and traffic options of the command-line mode, which a scenario file replaces. */
        const struct {
                const char *name;
                const char **value;
        } cli_only[] = {
                { "--limit", &arg_limit },       { "--max-queue", &arg_max_queue },
                { "--queue-timeout", &arg_queue_timeout },
                { "--queue-congestion-timeout", &arg_queue_congestion_timeout },
                { "--hold", &arg_hold },         { "--arrivals", &arg_arrivals },
                { "--deadline", &arg_deadline },
        };
        int c, r;

        /* Our own messages: getopt's would be prefixed with the verb's name only. */
        opterr = 0;
        optind = 0;
        while ((c = getopt_long(argc, argv, ":h", options, NULL)) >= 0)
                switch (c) {
                case 'h':
                        help();
                        return 0;
                case ARG_LIMIT:
                        arg_limit = optarg;
                        break;
                case ARG_MAX_QUEUE:
                        arg_max_queue = optarg;
                        break;
                case ARG_QUEUE_TIMEOUT:
                        arg_queue_timeout = optarg;
                        break;
                case ARG_QUEUE_CONGESTION_TIMEOUT:
                        arg_queue_congestion_timeout = optarg;
                        break;
                case ARG_HOLD:
                        arg_hold = optarg;
                        break;
                case ARG_ARRIVALS:
                        arg_arrivals = optarg;
                        break;
                case ARG_DEADLINE:
                        arg_deadline = optarg;
                        break;
                case ARG_SCENARIO:
                        arg_scenario = optarg;
                        break;
                case ARG_REPLAY:
                        arg_replay = optarg;
                        break;
                case ARG_POOL:
                        arg_replay_pool = optarg;
                        break;
                case ARG_SEED:
                        if (parse_u64(optarg, &arg_seed) < 0)
                                return log_usage("--seed: invalid number \"%s\"", optarg);
                        break;
                case ARG_PER_REQUEST:
                        arg_per_request = true;
                        break;
                case ARG_JSON:
                        arg_json = true;
                        break;
                case ARG_SWEEP:
                        r = parse_sweep(optarg);
                        if (r < 0)
                                return r;
                        break;
                case ':':
                        return log_usage("option '%s' needs a value", argv[optind - 1]);
                case '?':
                default:
                        return log_usage("unknown option '%s'", argv[optind - 1]);
                }

        if (optind < argc)
                return log_usage("unexpected argument '%s'", argv[optind]);

        for (size_t i = 0; i < ELEMENTSOF(cli_only); i++) {
                if (arg_scenario && *cli_only[i].value)
                        return log_usage("%s cannot be combined with --scenario (set it in the scenario file)",
                                         cli_only[i].name);
        }
        if (arg_replay && (arg_scenario || arg_arrivals || arg_hold))
                return log_usage("--replay cannot be combined with %s (the history gives the requests)",
                                 arg_scenario ? "--scenario" : arg_arrivals ? "--arrivals" : "--hold");
        if (arg_replay_pool && !arg_replay)
                return log_usage("--pool needs --replay");
        if (!arg_scenario && !arg_replay) {
                if (!arg_limit)
                        return log_usage("--limit is missing (or give --scenario FILE)");
                if (!arg_hold)
                        return log_usage("--hold is missing (or give --scenario FILE)");
                if (!arg_arrivals)
                        return log_usage("--arrivals is missing (or give --scenario FILE)");
        }
        if (arg_sweep_key && arg_per_request)
                return log_usage("--per-request cannot be combined with --sweep");
        return 1;
}

/* The command-line mode: pool "default" from the options, and one lane "default" that waits on it. */
static int build_cli_scenario(char **error, Scenario **ret) {
        static const struct {
                const char *key;
                const char *origin;
                const char **value;
        } pool_options[] = {
                { "limit", "--limit", &arg_limit },
                { "max-queue", "--max-queue", &arg_max_queue },
                { "queue-timeout", "--queue-timeout", &arg_queue_timeout },
                { "queue-congestion-timeout", "--queue-congestion-timeout", &arg_queue_congestion_timeout },
        };
        _cleanup_(scenario_freep) Scenario *s = NULL;
        uint64_t hold, deadline = SIM_FOREVER;
        int r;

        r = parse_duration_ms(arg_hold, true, &hold);
        if (r < 0)
                return scenario_duration_error(error, "--hold", arg_hold, r);
        if (arg_deadline) {
                r = parse_duration_ms(arg_deadline, true, &deadline);
                if (r < 0)
                        return scenario_duration_error(error, "--deadline", arg_deadline, r);
        }

        r = scenario_new("slotctl simulate", &s);
        if (r < 0)
                return r;
        r = scenario_add_pool(s, "default", "--limit");
        if (r < 0)
                return r;
        for (size_t i = 0; i < ELEMENTSOF(pool_options); i++) {
                if (!*pool_options[i].value)
                        continue;
                r = scenario_add_setting(s, "pool default", pool_options[i].key, *pool_options[i].value,
                                         pool_options[i].origin, pool_options[i].origin);
                if (r < 0)
                        return r;
        }
        r = scenario_add_lane(s, "default", "the default lane");
        if (r < 0)
                return r;
        r = scenario_add_setting(s, "lane default", "pools", "default", "the default lane", "the default lane");
        if (r < 0)
                return r;
        r = scenario_add_setting(s, "lane default", "policy", "wait", "the default lane", "the default lane");
        if (r < 0)
                return r;

        char lane[] = "default", origin[] = "--arrivals";
        ScenarioTraffic traffic = {
                .lane = lane,
                .slots = 1,
                .hold_ms = hold,
                .max_wait = USEC_INFINITY,
                .origin = origin,
        };
        r = scenario_add_phases(s, arg_arrivals, &traffic, error);
        if (r < 0)
                return r;
        s->deadline_ms = deadline;
        r = scenario_finish(s, error);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(s);
        return 0;
}

static void configs_free(BrokerConfig **configs, size_t n) {
        for (size_t i = 0; i < n; i++)
                conf_free(configs[i]);
        free(configs);
}

/* Returns the exit status. */
static int run(void) {
        _cleanup_(scenario_freep) Scenario *s = NULL;
        _cleanup_free_ char *error = NULL;
        _cleanup_free_ SweepRow *rows = NULL;
        BrokerConfig **configs = NULL;
        size_t n_values = arg_sweep_key ? (size_t) (arg_sweep_to - arg_sweep_from + 1) : 1, n_configs = 0;
        int r, ret = EXIT_FAILURE;

        if (arg_scenario)
                r = scenario_load_file(arg_scenario, &error, &s);
        else if (arg_replay) {
                _cleanup_(replay_info_done) ReplayInfo info = {};
                r = replay_load(&(ReplayOptions) {
                                        .path = arg_replay,
                                        .pool = arg_replay_pool,
                                        .limit = arg_limit,
                                        .max_queue = arg_max_queue,
                                        .queue_timeout = arg_queue_timeout,
                                        .queue_congestion_timeout = arg_queue_congestion_timeout,
                                        .deadline = arg_deadline,
                                        .sweep_key = arg_sweep_key,
                                },
                                &error, &s, &info);
                if (r >= 0)
                        replay_info_print(&info, stderr);
        } else
                r = build_cli_scenario(&error, &s);
        if (r == -EINVAL) {
                if (error)
                        log_usage("%s", error);
                return EX_USAGE;
        }
        if (r < 0) {
                log_error_errno(r, "Failed to prepare the simulation");
                return EXIT_FAILURE;
        }

        /* Every configuration is checked before anything runs, so a bad value prints nothing on stdout. */
        configs = calloc(n_values, sizeof(BrokerConfig *));
        if (!configs) {
                log_error_errno(-ENOMEM, "Failed to prepare the simulation");
                return EXIT_FAILURE;
        }
        for (; n_configs < n_values; n_configs++) {
                char value[32] = "";
                uint64_t v = arg_sweep_from + n_configs;

                if (arg_sweep_key)
                        snprintf(value, sizeof value, "%" PRIu64 "%s", v,
                                 streq(arg_sweep_key, "queue-timeout") ? "s" : "");
                r = scenario_build_config(s, arg_sweep_key, arg_sweep_key ? value : NULL, &error, &configs[n_configs]);
                if (r == -EINVAL) {
                        log_usage("%s", error ?: "invalid configuration");
                        ret = EX_USAGE;
                        goto finish;
                }
                if (r < 0) {
                        log_error_errno(r, "Failed to build the configuration");
                        goto finish;
                }
        }

        if (arg_sweep_key) {
                rows = calloc(n_values, sizeof(SweepRow));
                if (!rows) {
                        log_error_errno(-ENOMEM, "Failed to simulate");
                        goto finish;
                }
        }

        SimOptions options = {
                .seed = arg_seed,
                .per_request = arg_per_request,
        };
        for (size_t i = 0; i < n_values; i++) {
                _cleanup_(sim_result_freep) SimResult *result = NULL;

                r = sim_run(s, configs[i], &options, &result);
                if (r == -E2BIG) {
                        log_usage("the simulation runs past " SIM_SPAN_MAX_TEXT " of virtual time, the most it covers "
                                  "(holds, arrivals and waits add up): shorten them");
                        ret = EX_USAGE;
                        goto finish;
                }
                if (r < 0) {
                        log_error_errno(r, "Failed to simulate");
                        goto finish;
                }
                if (arg_replay && !arg_per_request)
                        replay_result_trim(result); /* thousands of recorded requests: only on request */
                if (!arg_sweep_key) {
                        if (arg_json)
                                sim_print_json(s, result, stdout);
                        else
                                sim_print_text(s, result, stdout);
                        continue;
                }
                rows[i] = (SweepRow) {
                        .value = arg_sweep_from + i,
                        .requests = result->requests,
                        .granted = result->granted,
                        .late = result->late,
                        .longest_wait_ms = result->longest_wait_ms,
                        .peak = peak_queue_max(&result->peaks),
                };
                memcpy(rows[i].refused, result->refused, sizeof rows[i].refused);
        }
        if (arg_sweep_key) {
                if (arg_json)
                        sweep_print_json(rows, n_values, stdout);
                else
                        sweep_print_text(arg_sweep_key, rows, n_values, stdout);
        }

        if (fflush(stdout) != 0 || ferror(stdout)) {
                log_error_errno(errno > 0 ? -errno : -EIO, "Failed to write the report");
                goto finish;
        }
        ret = EXIT_SUCCESS;
finish:
        configs_free(configs, n_configs);
        return ret;
}

int verb_simulate(int argc, char *argv[]) {
        int r;

        r = parse_argv(argc, argv);
        if (r <= 0)
                return r < 0 ? EX_USAGE : EXIT_SUCCESS;
        return run();
}
