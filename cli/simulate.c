/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "heap.h"
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
        uint64_t id;          /* its request's */
        bool ending;          /* it will end: a finite hold, or max-hold revokes it */
        bool revoked;         /* max-hold ends it: its command was killed, and tells no exit status */
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
        size_t next_drain;    /* the scenario's drains applied so far */
        size_t next_reservation; /* … and reservations submitted */
        size_t next_quarantine;  /* … and quarantines and restores by hand */
        size_t next_cancel;      /* the scenario's cancels (cancel_order) done or moot so far */
        size_t next_reload;      /* … and reloads done */
        BrokerConfig **configs;  /* the reloads' configurations, kept until the engine is gone */
        EngineRequest **requests; /* by explicit request index: those with a cancel, until it comes */
        SimResult *result;
} Sim;

uint64_t sim_splitmix64(void *state) {
        uint64_t *s = state;
        uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
        z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
        return z ^ (z >> 31);
}

/* A reservation's request id (scenario_reservation_id()), not a request's. */
static bool sim_is_reservation(const Sim *sim, uint64_t id) {
        return id >= sim->scenario->n_generated + sim->scenario->n_requests;
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

/* After every engine call: the answers of pools that decide later are in, and handled, before anything else
 * happens (a no-op for in-process pools, which answer during the call). */
static void sim_quiesce(Sim *sim) {
        if (!sim->options->quiesce)
                return;
        /* Until nothing more comes: as an in-process pool, whose answers and their consequences are all in
         * before the call returns. */
        while (sim->options->quiesce(sim->options->quiesce_userdata))
                engine_take_decisions(sim->engine);
}

static void sim_lease_end(Sim *sim, SimLease *l, uint64_t t_ms) {
        usec_t now = t_ms * USEC_PER_MSEC;
        uint64_t deadline = sim->scenario->deadline_ms;

        /* Late: the client gave up before the work was done (wait + hold > deadline). A person's reservation
         * has no such client. */
        if (deadline != SIM_FOREVER && !sim_is_reservation(sim, l->id) && now - l->arrival > deadline * USEC_PER_MSEC)
                sim->result->late++;
        sim->last_end_ms = MAX(sim->last_end_ms, t_ms);
        sim->any_end = true;

        /* What the command tells at its end (SPEC §3.6): its hold ran its course, so its exit status counts
         * (quarantine-exit-codes=, a health lane's restore), under its request's name as the job. */
        const ScenarioTraffic *tr = scenario_traffic(sim->scenario, l->id);
        if (tr && tr->exits && !l->revoked) {
                char buf[32];
                const char *job = scenario_request_name(sim->scenario, l->id);
                if (!job) {
                        snprintf(buf, sizeof buf, "%" PRIu64, l->id + 1);
                        job = buf;
                }
                (void) engine_lease_set_exit_status(l->lease, tr->exit_status, job);
        }
        engine_lease_release(l->lease, now);
        sim_quiesce(sim);
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
        l->id = id;
        l->revoked = false;
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

        if (sim->options->on_event)
                sim->options->on_event(ev, sim->options->on_event_userdata);

        switch (ev->type) {
        case ENGINE_EVENT_QUEUED:
                if (++sim->waiting > SIM_WAITING_MAX)
                        return -ENOBUFS;
                rec = sim_record(sim, id);
                record_queue_facts(rec, sim->scenario, ev);
                if (rec)
                        rec->queued = true;
                return 0;

        case ENGINE_EVENT_GRANTED:
                if (ev->queued)
                        sim->waiting--;
                if (sim_is_reservation(sim, id)) {
                        /* Counted apart: reports without reservations stay as they were. */
                        res->reserved++;
                        res->longest_reservation_wait_ms = MAX(res->longest_reservation_wait_ms,
                                                               ev->wait / USEC_PER_MSEC);
                        return sim_lease_start(sim, ev, id);
                }
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
                if (sim_is_reservation(sim, id)) {
                        res->reservations_refused++;
                        return 0;
                }
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
                l->revoked = true;
                if (!l->ending) {
                        l->ending = true;
                        sim->n_ending++;
                }
                return heap_push(&sim->ends, &l->node, ev->at);
        }

        case ENGINE_EVENT_MEMBER:
                if (ev->quarantined)
                        res->quarantined++;
                else
                        res->restored++;
                return 0;

        case ENGINE_EVENT_CONGESTION:
        case ENGINE_EVENT_DRAIN:
        default:
                return 0;
        }
}

/* The events of the engine calls so far, in order. */
static int sim_handle_events(Sim *sim) {
        EngineEvent ev;
        int r;

        while (engine_pop_event(sim->engine, &ev)) {
                r = sim_handle_event(sim, &ev);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* The scenario's drains of instant t, in file order (SPEC §3.6: as `slotctl drain`/`undrain`). */
static int sim_drain(Sim *sim, uint64_t t) {
        const Scenario *s = sim->scenario;
        usec_t now = t * USEC_PER_MSEC;
        int r;

        for (; sim->next_drain < s->n_drains && s->drains[sim->next_drain].at_ms == t; sim->next_drain++) {
                const ScenarioDrain *d = &s->drains[sim->next_drain];
                EngineDrain drain = {
                        .since = now,
                        .until = d->until_ms == SIM_FOREVER ? USEC_INFINITY : d->until_ms * USEC_PER_MSEC,
                        .reason = d->reason,
                };
                r = engine_drain_with(sim->engine, d->pool, d->member, d->undrain ? NULL : &drain, now);
                if (r < 0)
                        return r;
                sim_quiesce(sim);
        }
        return 0;
}

/* The scenario's quarantines and restores by hand of instant t, in file order (SPEC §3.6: as `slotctl quarantine`
 * and `restore`; nobody as who). */
static int sim_quarantine(Sim *sim, uint64_t t) {
        const Scenario *s = sim->scenario;
        usec_t now = t * USEC_PER_MSEC;
        int r;

        for (; sim->next_quarantine < s->n_quarantines && s->quarantines[sim->next_quarantine].at_ms == t;
             sim->next_quarantine++) {
                const ScenarioDrain *q = &s->quarantines[sim->next_quarantine];
                EngineQuarantine quarantine = {
                        .restore = q->undrain,
                        .since = now,
                        .exit_status = -1,
                        .reason = q->reason,
                };
                r = engine_member_quarantine(sim->engine, q->pool, q->member, &quarantine, now);
                if (r < 0)
                        return r;
                sim_quiesce(sim);
        }
        return 0;
}

/* The scenario's reloads of instant t (SPEC §4: as brokerd's on SIGHUP), each its configuration with the
 * changes of every reload up to it. */
static int sim_reload(Sim *sim, uint64_t t) {
        const Scenario *s = sim->scenario;
        int r;

        for (; sim->next_reload < s->n_reloads && s->reloads[sim->next_reload] == t; sim->next_reload++) {
                _cleanup_free_ char *error = NULL;
                BrokerConfig *c = NULL;
                /* Checked when the run's first configuration was built: only memory can fail here. */
                /* On the one before, but for the first reload: the run's first configuration is sim_run()'s
                 * caller's, which this cannot tell was built as the scenario builds it. */
                r = scenario_build_config_reload(s, sim->options->config_key, sim->options->config_value,
                                                 sim->next_reload + 1,
                                                 sim->next_reload > 0 ? sim->configs[sim->next_reload - 1] : NULL,
                                                 &error, &c);
                if (r < 0)
                        return r;
                sim->configs[sim->next_reload] = c;
                r = engine_configure(sim->engine, c, t * USEC_PER_MSEC);
                if (r < 0)
                        return r;
                sim_quiesce(sim);
        }
        return 0;
}

/* Whether explicit request k is still undecided: waiting, or not yet answered by a pool that decides later. */
static bool sim_request_undecided(const Sim *sim, size_t k) {
        EngineRequest *r = sim->requests[k];
        return r && (engine_request_is_waiting(r) || engine_request_is_in_flight(r));
}

/* When the next cancel that can still matter comes: those of requests decided meanwhile are dropped. */
static uint64_t sim_next_cancel(Sim *sim) {
        const Scenario *s = sim->scenario;
        for (; sim->next_cancel < s->n_cancels; sim->next_cancel++) {
                size_t k = s->cancel_order[sim->next_cancel];
                /* Not arrived yet (its cancel comes after its arrival), or still undecided: it counts. */
                if (!sim->requests[k] || sim_request_undecided(sim, k))
                        return scenario_request_cancel_at(&s->requests[k]);
                sim->requests[k] = engine_request_unref(sim->requests[k]);
        }
        return SIM_FOREVER;
}

/* The cancels of instant t (a client gone away: engine_request_cancel(), no event), in cancel_order. */
static void sim_cancel(Sim *sim, uint64_t t) {
        const Scenario *s = sim->scenario;

        while (sim_next_cancel(sim) == t) {
                size_t k = s->cancel_order[sim->next_cancel++];
                bool waiting = engine_request_is_waiting(sim->requests[k]);
                engine_request_cancel(sim->requests[k], t * USEC_PER_MSEC);
                sim_quiesce(sim);
                sim->requests[k] = engine_request_unref(sim->requests[k]);
                /* Its QUEUED event counted it: events of earlier instants are all handled. */
                if (waiting && sim->waiting > 0)
                        sim->waiting--;
                sim->result->cancelled++;
                SimRecord *rec = sim_record(sim, s->n_generated + k);
                if (rec) {
                        rec->outcome = SIM_OUTCOME_CANCELLED;
                        rec->decided_ms = t;
                }
        }
}

/* The scenario's reservations of instant t, in file order, as brokerd takes a Reserve call (SPEC §3.6;
 * session_reserve()): lane @reserve of the pool, one slot, waiting as long as it takes, a lease that max-hold
 * ends `for` after its grant (the engine revokes it then, and the run ends it as any revoked lease). */
static int sim_reserve(Sim *sim, uint64_t t) {
        const Scenario *s = sim->scenario;
        int r;

        for (; sim->next_reservation < s->n_reservations && s->reservations[sim->next_reservation].at_ms == t;
             sim->next_reservation++) {
                size_t k = sim->next_reservation;
                const ScenarioReservation *v = &s->reservations[k];
                EngineRequest *request = NULL;

                r = engine_acquire(sim->engine,
                                   &(EngineAcquire) {
                                           .reserve_pool = v->pool,
                                           .slots = 1,
                                           .max_wait = USEC_INFINITY,
                                           .max_hold = v->for_ms * USEC_PER_MSEC,
                                           .userdata = (void *) (uintptr_t) (scenario_reservation_id(s, k) + 1),
                                           .labels = (const char *const *) v->labels,
                                           .member = v->member,
                                   },
                                   t * USEC_PER_MSEC, &request);
                if (r < 0)
                        return r;
                sim_quiesce(sim);
                engine_request_unref(request);
                sim->result->reservations++;
        }
        return 0;
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
                .labels = (const char *const *) t->labels,
                .member = t->member,
        };
        r = engine_acquire(sim->engine, &acquire, a->at_ms * USEC_PER_MSEC, &request);
        if (r < 0)
                return r;
        sim_quiesce(sim);
        /* Events tell everything that follows; the request itself is needed only by its cancel. */
        uint64_t k = a->id - sim->scenario->n_generated;
        if (a->id >= sim->scenario->n_generated && sim->scenario->requests[k].cancel_ms != SIM_FOREVER)
                sim->requests[k] = request;
        else
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

/* The next instant, in ms: the next arrival, drain, hold end or engine wakeup. SIM_FOREVER when nothing is left. */
static uint64_t sim_next_instant(Sim *sim, const ArrivalCursor *cursor, bool started, uint64_t t) {
        uint64_t next = arrival_cursor_peek(cursor);

        if (sim->next_drain < sim->scenario->n_drains)
                next = MIN(next, sim->scenario->drains[sim->next_drain].at_ms);
        if (sim->next_reservation < sim->scenario->n_reservations)
                next = MIN(next, sim->scenario->reservations[sim->next_reservation].at_ms);
        if (sim->next_quarantine < sim->scenario->n_quarantines)
                next = MIN(next, sim->scenario->quarantines[sim->next_quarantine].at_ms);
        if (sim->next_reload < sim->scenario->n_reloads)
                next = MIN(next, sim->scenario->reloads[sim->next_reload]);
        next = MIN(next, sim_next_cancel(sim));

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
        for (size_t k = 0; sim->requests && k < sim->scenario->n_requests; k++)
                engine_request_unref(sim->requests[k]);
        free(sim->requests);
        heap_done(&sim->ends);
        engine_free(sim->engine);
        for (size_t k = 0; sim->configs && k < sim->scenario->n_reloads; k++)
                conf_free(sim->configs[k]);
        free(sim->configs);
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

        if (s->n_reloads > 0) {
                sim.configs = calloc(s->n_reloads, sizeof(BrokerConfig *));
                if (!sim.configs) {
                        r = -ENOMEM;
                        goto finish;
                }
        }
        if (s->n_cancels > 0) {
                sim.requests = calloc(s->n_requests, sizeof(EngineRequest *));
                if (!sim.requests) {
                        r = -ENOMEM;
                        goto finish;
                }
        }

        r = engine_new(sim_splitmix64, &sim.random_state, &sim.engine);
        if (r < 0)
                goto finish;
        engine_set_pool_factory(sim.engine, o->factory ?: engine_pool_factory_local, o->factory_userdata);
        r = engine_configure(sim.engine, c, 0);
        if (r < 0)
                goto finish;
        sim_quiesce(&sim);

        arrival_cursor_init(&cursor, s);
        for (;;) {
                /* The end: all arrivals and drains done, nobody waiting, no hold left that will end. */
                bool end = arrival_cursor_peek(&cursor) == SIM_FOREVER && sim.next_drain >= s->n_drains &&
                           sim.next_reservation >= s->n_reservations && sim.next_quarantine >= s->n_quarantines &&
                           sim.next_reload >= s->n_reloads && sim.waiting == 0 && sim.n_ending == 0;
                uint64_t next = end ? SIM_FOREVER : sim_next_instant(&sim, &cursor, started, t);
                /* An instant settles when the next one is later: a lease that ends at its own instant (max-hold,
                 * a hold of 0) takes a second pass, whose waiters granted are no longer waiting at its end. */
                if (started && next != t) {
                        r = peak_queue_observe(&sim.result->peaks, t,
                                               (uint32_t) MIN(sim.waiting, (uint64_t) UINT32_MAX));
                        if (r < 0)
                                goto finish;
                }
                if (next == SIM_FOREVER || next > UINT64_MAX / USEC_PER_MSEC)
                        break; /* the end, or waiters that nothing will ever serve or refuse */
                t = next;
                started = true;
                usec_t now = t * USEC_PER_MSEC;

                /* SPEC §3.3: (1) leases that end free their slots, */
                for (HeapNode *top; (top = heap_peek(&sim.ends)) && top->key <= now;) {
                        heap_pop(&sim.ends);
                        sim_lease_end(&sim, container_of(top, SimLease, node), t);
                }
                /* clients that go away (as a release, a waiter less), */
                sim_cancel(&sim, t);
                /* then drains and undrains (as an operator's, before the arrivals of the instant), */
                r = sim_drain(&sim, t);
                if (r < 0)
                        goto finish;
                /* quarantines and restores by hand (an operator's too), reloads, */
                r = sim_quarantine(&sim, t);
                if (r < 0)
                        goto finish;
                r = sim_reload(&sim, t);
                if (r < 0)
                        goto finish;
                /* reservations (people's, as drains, ahead of the arrivals of the instant), */
                r = sim_reserve(&sim, t);
                if (r < 0)
                        goto finish;
                /* (2) arrivals in generated order, the events of each handled as it comes: an instant of a
                 * million arrivals keeps no million events, and stops at SIM_WAITING_MAX waiters, */
                while (arrival_cursor_peek(&cursor) == t) {
                        arrival_cursor_next(&cursor, &a);
                        r = sim_arrive(&sim, &a);
                        if (r < 0)
                                goto finish;
                        r = sim_handle_events(&sim);
                        if (r < 0)
                                goto finish;
                }
                /* (3) freed slots go to waiters, (4) budgets that end now refuse. */
                engine_run(sim.engine, now);
                sim_quiesce(&sim);
                r = sim_handle_events(&sim);
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

char *sim_bound_text(int r) {
        char *m = NULL;

        if (r == -E2BIG)
                return strdup("the simulation runs past " SIM_SPAN_MAX_TEXT " of virtual time, the most it covers "
                              "(holds, arrivals and waits add up): shorten them");
        if (r == -ENOBUFS && asprintf(&m, "more than %" PRIu64 " requests wait at once, more than any brokerd keeps "
                                          "(max-connections=): set max-queue= or make fewer arrive",
                                      SIM_WAITING_MAX) < 0)
                return NULL;
        return m;
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
        case SIM_OUTCOME_CANCELLED:
                return "cancelled";
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
        /* Only where exit statuses quarantined something: other reports stay as they were. */
        if (r->quarantined > 0 || r->restored > 0)
                fprintf(f, LABEL "%4" PRIu64 "  (restored %" PRIu64 ")\n", "quarantined", r->quarantined, r->restored);
        if (r->cancelled > 0)
                fprintf(f, LABEL "%4" PRIu64 "\n", "cancelled", r->cancelled);
        /* Only where the scenario reserves: other reports stay as they were. */
        if (r->reservations > 0) {
                fprintf(f, LABEL "%4" PRIu64 "  (granted %" PRIu64, "reservations", r->reservations, r->reserved);
                if (r->reservations_refused > 0)
                        fprintf(f, ", refused %" PRIu64, r->reservations_refused);
                fprintf(f, ", longest wait %s s)\n", sim_format_tenths(a, sizeof a, r->longest_reservation_wait_ms));
        }
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
        fprintf(f, "},\n  \"late\": %" PRIu64 ",\n", r->late);
        if (r->quarantined > 0 || r->restored > 0)
                fprintf(f, "  \"quarantined\": %" PRIu64 ",\n  \"restored\": %" PRIu64 ",\n", r->quarantined, r->restored);
        if (r->cancelled > 0)
                fprintf(f, "  \"cancelled\": %" PRIu64 ",\n", r->cancelled);
        if (r->reservations > 0)
                fprintf(f,
                        "  \"reservations\": {\"count\": %" PRIu64 ", \"granted\": %" PRIu64 ", \"refused\": %" PRIu64
                        ", \"longestWaitMs\": %" PRIu64 "},\n",
                        r->reservations, r->reserved, r->reservations_refused, r->longest_reservation_wait_ms);
        fputs("  \"peakQueueBySecond\": [", f);
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

void sim_sweep_row_init(SimSweepRow *row, uint64_t value, const SimResult *r) {
        *row = (SimSweepRow) {
                .value = value,
                .requests = r->requests,
                .granted = r->granted,
                .late = r->late,
                .longest_wait_ms = r->longest_wait_ms,
                .peak = peak_queue_max(&r->peaks),
        };
        memcpy(row->refused, r->refused, sizeof row->refused);
}

void sim_sweep_print_text(const char *key, const SimSweepRow *rows, size_t n, FILE *f) {
        int kw = MAX((int) strlen(key), 5);

        fprintf(f, "%*s  %8s  %8s  %8s  %8s  %8s  %8s  %8s  %12s  %10s\n", kw, key, "requests", "granted", "busy",
                "full", "timeout", "shed", "late", "longest wait", "peak queue");
        for (size_t i = 0; i < n; i++) {
                const SimSweepRow *w = &rows[i];
                char wait[40];
                format_seconds(wait, sizeof wait, w->longest_wait_ms);
                fprintf(f,
                        "%*" PRIu64 "  %8" PRIu64 "  %8" PRIu64 "  %8" PRIu64 "  %8" PRIu64 "  %8" PRIu64 "  %8" PRIu64
                        "  %8" PRIu64 "  %12s  %10" PRIu32 "\n",
                        kw, w->value, w->requests, w->granted, w->refused[REFUSAL_BUSY], w->refused[REFUSAL_FULL],
                        w->refused[REFUSAL_TIMEOUT], w->refused[REFUSAL_SHED], w->late, wait, w->peak);
        }
}

void sim_sweep_print_json(const SimSweepRow *rows, size_t n, FILE *f) {
        fputc('[', f);
        for (size_t i = 0; i < n; i++) {
                const SimSweepRow *w = &rows[i];
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
