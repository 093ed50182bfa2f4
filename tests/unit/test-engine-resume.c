/* SPDX-License-Identifier: MIT */
/* test-engine-resume.c — waiters handed over across a restart (SPEC §3.4, "A restart loses no waiter";
 * engine.h, EngineResume) on a fake clock. Each scenario runs twice: once in one engine, once with a
 * "restart" in the middle (a new engine, the leases restored, the pools' clocks carried, the waiters
 * resumed in their old queue order), and every decision must come at the same instant with the same
 * outcome either way. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"

#define S(x) ((usec_t) (x) * USEC_PER_SEC)

typedef struct Tag {
        char name[8];
        EngineRequest *request;
        EngineLease *lease;
        EngineEventType last;
        size_t n_events;
        usec_t at;               /* the last event's */
        usec_t wait;
        Refusal refusal;
        QueueState state;
        usec_t idle, budget;
        bool queued;
        uint64_t token;
        usec_t max_wait;         /* as asked: the handover keeps the client's cap (brokerd's HandoverAcquire) */
} Tag;

typedef struct Fixture {
        Engine *engine;
        uint64_t rng;
        BrokerConfig config;
        PoolConfig pools[4];
        PoolConfig *pool_ptrs[4];
        LaneConfig lane;
        LaneConfig *lane_ptr;
        char *lane_pools[4];
        Tag tags[32];
        size_t n_tags;
        size_t n_congestion;
        bool congested;          /* the last CONGESTION event's */
        Tag *gone;               /* restart(): its lease ended while no daemon ran (not restored; its token kept) */
} Fixture;

static uint64_t fake_random(void *userdata) {
        uint64_t *s = userdata;
        uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        return z ^ (z >> 31);
}

static void drain_events(Fixture *f) {
        EngineEvent ev;
        while (engine_pop_event(f->engine, &ev)) {
                if (ev.type == ENGINE_EVENT_CONGESTION) {
                        f->n_congestion++;
                        f->congested = ev.congested;
                        continue;
                }
                if (ev.type == ENGINE_EVENT_REVOKE)
                        continue;
                Tag *t = ev.userdata;
                assert_non_null(t);
                t->n_events++;
                t->last = ev.type;
                t->at = ev.at;
                t->wait = ev.wait;
                t->refusal = ev.refusal;
                t->state = ev.state;
                t->idle = ev.idle;
                t->budget = ev.budget;
                t->queued = ev.queued;
                if (ev.type == ENGINE_EVENT_GRANTED) {
                        t->lease = ev.lease;
                        t->token = engine_lease_token(ev.lease);
                }
        }
}

/* Pools "p" (and "q", "r" when n_pools says so) of `limit`, queue-timeout q (0: unset), max-queue; one
 * wait lane "l" over the first `n_lane_pools` of them. */
static void config_make(Fixture *f, size_t n_pools, size_t n_lane_pools, unsigned limit, usec_t q, int64_t max_queue) {
        static const char *const names[] = { "p", "q", "r" };
        f->config = (BrokerConfig) {};
        for (size_t i = 0; i < n_pools; i++) {
                f->pools[i] = (PoolConfig) {
                        .name = (char *) names[i],
                        .limit = limit,
                        .max_queue = max_queue,
                        .queue_timeout_set = q > 0,
                        .queue_timeout = q,
                };
                f->pool_ptrs[i] = &f->pools[i];
        }
        for (size_t i = 0; i < n_lane_pools; i++)
                f->lane_pools[i] = (char *) names[i];
        f->lane = (LaneConfig) {
                .name = (char *) "l",
                .policy = LANE_POLICY_WAIT,
                .max_in_use = -1,
                .max_hold = USEC_INFINITY,
                .pools = f->lane_pools,
                .n_pools = n_lane_pools,
        };
        f->lane_ptr = &f->lane;
        f->config.pools = f->pool_ptrs;
        f->config.n_pools = n_pools;
        f->config.lanes = &f->lane_ptr;
        f->config.n_lanes = 1;
}

static void engine_start(Fixture *f, usec_t now) {
        assert_int_equal(engine_new(fake_random, &f->rng, &f->engine), 0);
        assert_int_equal(engine_configure(f->engine, &f->config, now), 0);
        drain_events(f);
}

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof(Fixture));
        f->rng = 7;
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;
        for (size_t i = 0; i < f->n_tags; i++)
                engine_request_unref(f->tags[i].request);
        engine_free(f->engine);
        free(f);
        return 0;
}

static Tag *tag_new(Fixture *f, const char *name) {
        assert_true(f->n_tags < ELEMENTSOF(f->tags));
        Tag *t = &f->tags[f->n_tags++];
        snprintf(t->name, sizeof t->name, "%s", name);
        return t;
}

static Tag *acquire_ex(Fixture *f, const char *name, unsigned slots, usec_t max_wait, const EngineResume *resume,
                       usec_t now) {
        Tag *t = tag_new(f, name);
        t->max_wait = max_wait;
        assert_int_equal(engine_acquire(f->engine,
                                        &(EngineAcquire) {
                                                .lane = "l",
                                                .slots = slots,
                                                .max_wait = max_wait,
                                                .userdata = t,
                                                .resume = resume,
                                        },
                                        now, &t->request),
                         0);
        drain_events(f);
        return t;
}

static Tag *acquire(Fixture *f, const char *name, unsigned slots, usec_t max_wait, usec_t now) {
        Tag *t = acquire_ex(f, name, slots, max_wait, NULL, now);
        engine_run(f->engine, now);
        drain_events(f);
        return t;
}

static void run(Fixture *f, usec_t now) {
        engine_run(f->engine, now);
        drain_events(f);
}

static void end(Fixture *f, Tag *t, usec_t now) {
        assert_non_null(t->lease);
        engine_lease_release(t->lease, now);
        t->lease = NULL;
        run(f, now);
}

static bool pool_congested(Fixture *f, size_t i, usec_t now) {
        EnginePoolInfo info;
        assert_int_equal(engine_pool_info(f->engine, i, now, &info), 0);
        return info.congested;
}

/* The restart: a new engine configured at `now`, every lease restored (tokens kept), every pool's clock
 * carried (carry_clock), every waiting tag resumed in its old queue order under a new Tag of the same
 * name (the old tag keeps what it saw before). What the fd store hand-over does, minus the sockets. */
static void restart(Fixture *f, usec_t now, bool carry_clock) {
        Engine *old = f->engine;
        size_t n = engine_pool_count(old);
        usec_t last_fast[4] = {};
        for (size_t i = 0; i < n; i++) {
                EnginePoolInfo info;
                assert_int_equal(engine_pool_info(old, i, now, &info), 0);
                assert_int_equal(engine_pool_get_last_fast(old, info.name, &last_fast[i]), 0);
        }

        /* Waiters by their place: the order they are resumed in. */
        Tag *order[32] = {};
        size_t n_waiting = 0, n_old = f->n_tags;
        for (size_t i = 0; i < n_old; i++)
                if (engine_request_is_waiting(f->tags[i].request)) {
                        size_t pos, queued;
                        assert_int_equal(engine_request_position(f->tags[i].request, &pos, &queued), 0);
                        assert_true(pos < ELEMENTSOF(order) && !order[pos]);
                        order[pos] = &f->tags[i];
                        n_waiting++;
                }
        EngineResume resumes[32];
        char pools[32][8];
        for (size_t i = 0; i < n_waiting; i++) {
                EngineRequest *r = order[i]->request;
                assert_non_null(r);
                assert_null(engine_request_remote_id(r)); /* an in-process pool names no waiter */
                snprintf(pools[i], sizeof pools[i], "%s", engine_request_pool(r));
                resumes[i] = (EngineResume) {
                        .pool = pools[i],
                        .arrival = engine_request_arrival(r),
                        .state = engine_request_state(r),
                        .idle = engine_request_idle(r),
                        .budget = engine_request_budget(r),
                };
        }

        /* The new daemon. */
        assert_int_equal(engine_new(fake_random, &f->rng, &f->engine), 0);
        assert_int_equal(engine_configure(f->engine, &f->config, now), 0);
        for (size_t i = 0; i < n_old; i++) {
                Tag *t = &f->tags[i];
                if (!t->lease)
                        continue;
                if (t == f->gone) {
                        /* The lease log's token mark keeps its token used. */
                        assert_int_equal(engine_set_token_floor(f->engine, engine_lease_pool(t->lease), t->token + 1), 0);
                        t->lease = NULL;
                        continue;
                }
                const unsigned *slots;
                unsigned k = engine_lease_slots(t->lease, &slots, NULL);
                EngineLease *l;
                assert_int_equal(engine_lease_restore(f->engine,
                                                      &(EngineLeaseRestore) {
                                                              .pool = engine_lease_pool(t->lease),
                                                              .lane = engine_lease_lane(t->lease),
                                                              .slots = slots,
                                                              .n_slots = k,
                                                              .token = engine_lease_token(t->lease),
                                                              .granted_at = engine_lease_granted_at(t->lease),
                                                              .expires_at = USEC_INFINITY,
                                                              .userdata = t,
                                                      },
                                                      &l),
                                 0);
                t->lease = l;
        }
        for (size_t i = 0; carry_clock && i < n; i++) {
                EnginePoolInfo info;
                assert_int_equal(engine_pool_info(f->engine, i, now, &info), 0);
                assert_int_equal(engine_pool_set_last_fast(f->engine, info.name, last_fast[i], now), 0);
        }
        drain_events(f);
        for (size_t i = 0; i < n_waiting; i++) {
                Tag *t = tag_new(f, order[i]->name);
                t->max_wait = order[i]->max_wait;
                assert_int_equal(engine_acquire(f->engine,
                                                &(EngineAcquire) {
                                                        .lane = "l",
                                                        .slots = 1,
                                                        .max_wait = t->max_wait,
                                                        .userdata = t,
                                                        .resume = &resumes[i],
                                                },
                                                now, &t->request),
                                 0);
                drain_events(f);
        }
        /* The old daemon is gone: its requests with it. */
        for (size_t i = 0; i < n_old; i++)
                f->tags[i].request = engine_request_unref(f->tags[i].request);
        engine_free(old);
}

/* The tag of this name that decided last (after a restart: the resumed one). */
static Tag *find(Fixture *f, const char *name) {
        for (size_t i = f->n_tags; i > 0; i--)
                if (streq(f->tags[i - 1].name, name))
                        return &f->tags[i - 1];
        fail_msg("no tag %s", name);
        return NULL;
}

typedef struct Outcome {
        EngineEventType last;
        usec_t at, wait, budget, idle;
        QueueState state;
        Refusal refusal;
        uint64_t token;
} Outcome;

static Outcome outcome(Fixture *f, const char *name) {
        Tag *t = find(f, name);
        return (Outcome) {
                .last = t->last,
                .at = t->at,
                .wait = t->wait,
                .budget = t->budget,
                .idle = t->idle,
                .state = t->state,
                .refusal = t->refusal,
                .token = t->token,
        };
}

static void assert_outcome_equal(Outcome a, Outcome b) {
        assert_int_equal(a.last, b.last);
        assert_int_equal(a.at, b.at);
        assert_int_equal(a.wait, b.wait);
        assert_int_equal(a.budget, b.budget);
        assert_int_equal(a.idle, b.idle);
        assert_int_equal(a.state, b.state);
        assert_int_equal(a.refusal, b.refusal);
        assert_int_equal(a.token, b.token);
}

/* ---- order, budgets, deadlines ---- */

/* One slot, Q = 60 s. A holds; B, C, D, E wait (D with a 10 s cap: it times out at 13 s, E with a 15 s cap:
 * at 19 s); the restart comes at 16 s (after D's deadline was settled) or at 20 s (after E's passed,
 * unsettled: the new engine refuses it at 19 s). Then A, B, C end one by one. */
typedef struct Run1 {
        Outcome b, c, d, e, late;
        bool congested;
} Run1;

static Run1 scenario_order(Fixture *f, int restart_at) {
        config_make(f, 1, 1, 1, S(60), -1);
        engine_start(f, 0);
        Tag *a = acquire(f, "A", 1, USEC_INFINITY, 0);
        assert_int_equal(a->last, ENGINE_EVENT_GRANTED);
        acquire(f, "B", 1, USEC_INFINITY, S(1));
        acquire(f, "C", 1, USEC_INFINITY, S(2));
        acquire(f, "D", 1, S(10), S(3));
        acquire(f, "E", 1, S(15), S(4));
        if (restart_at == 16)
                run(f, S(16));
        if (restart_at > 0)
                restart(f, S(restart_at), true);
        run(f, S(20));
        assert_int_equal(find(f, "D")->last, ENGINE_EVENT_REFUSED);
        assert_int_equal(find(f, "E")->last, ENGINE_EVENT_REFUSED);
        assert_int_equal(find(f, "B")->last, ENGINE_EVENT_QUEUED);
        assert_int_equal(find(f, "C")->last, ENGINE_EVENT_QUEUED);
        Tag *ra = find(f, "A");
        assert_non_null(ra->lease);
        end(f, ra, S(30));
        assert_int_equal(find(f, "B")->last, ENGINE_EVENT_GRANTED);
        assert_int_equal(find(f, "C")->last, ENGINE_EVENT_QUEUED);
        end(f, find(f, "B"), S(40));
        assert_int_equal(find(f, "C")->last, ENGINE_EVENT_GRANTED);
        /* C's grant was slow (38 s): idle runs on from A's fast grant at 0 (carried across the restart). */
        Tag *late = acquire(f, "F", 1, USEC_INFINITY, S(70));
        Run1 r = {
                .b = outcome(f, "B"),
                .c = outcome(f, "C"),
                .d = outcome(f, "D"),
                .e = outcome(f, "E"),
                .late = outcome(f, late->name),
        };
        run(f, S(71));
        r.congested = pool_congested(f, 0, S(71));
        return r;
}

static void test_resumed_waiters_keep_order_and_deadlines(void **state) {
        Fixture *f = *state;
        Run1 plain = scenario_order(f, 0);
        assert_int_equal(plain.d.last, ENGINE_EVENT_REFUSED);
        assert_int_equal(plain.d.refusal, REFUSAL_TIMEOUT);
        assert_int_equal(plain.d.at, S(13));
        assert_int_equal(plain.e.at, S(19));
        assert_int_equal(plain.b.at, S(30));
        assert_int_equal(plain.c.at, S(40));
        assert_int_equal(plain.late.state, QUEUE_STATE_SATURATED);
        assert_int_equal(plain.late.idle, S(70));
        assert_true(plain.congested);

        for (int at = 16; at <= 20; at += 4) {
                teardown(state);
                setup(state);
                f = *state;
                Run1 r = scenario_order(f, at);
                assert_outcome_equal(r.b, plain.b);
                assert_outcome_equal(r.c, plain.c);
                assert_outcome_equal(r.d, plain.d);
                assert_outcome_equal(r.e, plain.e); /* at 20 s: refused by the new engine, at its 19 s deadline */
                assert_outcome_equal(r.late, plain.late);
                assert_true(r.congested == plain.congested);
        }
}

/* Without the pool's clock carried, the next waiter's budget would count idle time from the restart. */
static void test_without_last_fast_the_budget_differs(void **state) {
        Fixture *f = *state;
        config_make(f, 1, 1, 1, S(60), -1);
        engine_start(f, 0);
        acquire(f, "A", 1, USEC_INFINITY, 0);
        restart(f, S(100), false);
        Tag *b = acquire(f, "B", 1, USEC_INFINITY, S(110));
        assert_int_equal(b->idle, S(10));
        assert_int_equal(b->state, QUEUE_STATE_KEEPING_UP);

        teardown(state);
        setup(state);
        f = *state;
        config_make(f, 1, 1, 1, S(60), -1);
        engine_start(f, 0);
        acquire(f, "A", 1, USEC_INFINITY, 0);
        restart(f, S(100), true);
        b = acquire(f, "B", 1, USEC_INFINITY, S(110));
        assert_int_equal(b->idle, S(110));
        assert_int_equal(b->state, QUEUE_STATE_SATURATED);
        assert_int_equal(b->budget, S(6)); /* Q/10 */
        run(f, S(116));
        assert_int_equal(b->last, ENGINE_EVENT_REFUSED);
        assert_int_equal(b->refusal, REFUSAL_SHED);
}

/* Saturated waiters' budgets (Q/10 = 6 s: shed) end during the restart or after it: the new engine refuses
 * them shed, each at its own deadline, and its gauge is on as the old one's is. */
static void test_resumed_shed_waiter_refused_at_its_deadline(void **state) {
        Outcome b[2], c[2];
        bool congested[2];
        for (int k = 0; k < 2; k++) {
                if (k) {
                        teardown(state);
                        setup(state);
                }
                Fixture *f = *state;
                config_make(f, 1, 1, 1, S(60), -1);
                engine_start(f, 0);
                acquire(f, "A", 1, USEC_INFINITY, 0);
                Tag *tb = acquire(f, "B", 1, USEC_INFINITY, S(100));
                assert_int_equal(tb->state, QUEUE_STATE_SATURATED);
                assert_true(pool_congested(f, 0, S(100)));
                acquire(f, "C", 1, USEC_INFINITY, S(103));
                if (k) {
                        restart(f, S(107), true);
                        /* The gauge comes with the clock: on before any waiter is back (no room: A holds). */
                        assert_true(pool_congested(f, 0, S(107)));
                }
                run(f, S(108));
                b[k] = outcome(f, "B");
                assert_int_equal(outcome(f, "C").last, ENGINE_EVENT_QUEUED);
                run(f, S(110));
                c[k] = outcome(f, "C");
                congested[k] = pool_congested(f, 0, S(110));
        }
        assert_int_equal(b[0].refusal, REFUSAL_SHED);
        assert_int_equal(b[0].at, S(106));
        assert_int_equal(c[0].refusal, REFUSAL_SHED);
        assert_int_equal(c[0].at, S(109));
        assert_outcome_equal(b[1], b[0]);
        assert_outcome_equal(c[1], c[0]);
        assert_true(congested[0] && congested[1]);
}

/* ---- admission of resumed waiters ---- */

/* The holder's command ended while no daemon ran (A, gone at the restart at 107 s): the new daemon starts with
 * room. B (saturated: budget Q/10 = 6 s, to 106 s) and C (a 2 s cap, to 104 s) ran out of budget meanwhile:
 * each is refused at its deadline, shed and timeout, as without the restart (SPEC §3.3: never granted after
 * its budget ended), not granted because the slot is free. D (to 109 s) is granted at once, as A's end at
 * 107 s grants it without the restart. */
typedef struct Run2 {
        Outcome b, c, d;
} Run2;

static Run2 scenario_ended_while_down(Fixture *f, bool restarted) {
        config_make(f, 1, 1, 1, S(60), -1);
        engine_start(f, 0);
        Tag *a = acquire(f, "A", 1, USEC_INFINITY, 0);
        assert_int_equal(a->last, ENGINE_EVENT_GRANTED);
        assert_int_equal(acquire(f, "B", 1, USEC_INFINITY, S(100))->state, QUEUE_STATE_SATURATED);
        assert_int_equal(acquire(f, "C", 1, S(2), S(102))->budget, S(2));
        assert_int_equal(acquire(f, "D", 1, USEC_INFINITY, S(103))->budget, S(6));
        if (restarted) {
                f->gone = a;
                restart(f, S(107), true);
        } else {
                run(f, S(107));
                end(f, a, S(107));
        }
        run(f, S(107));
        return (Run2) { .b = outcome(f, "B"), .c = outcome(f, "C"), .d = outcome(f, "D") };
}

static void test_resumed_waiter_whose_budget_ended_is_refused_with_room(void **state) {
        Fixture *f = *state;
        Run2 plain = scenario_ended_while_down(f, false);
        assert_int_equal(plain.b.last, ENGINE_EVENT_REFUSED);
        assert_int_equal(plain.b.refusal, REFUSAL_SHED);
        assert_int_equal(plain.b.at, S(106));
        assert_int_equal(plain.c.last, ENGINE_EVENT_REFUSED);
        assert_int_equal(plain.c.refusal, REFUSAL_TIMEOUT);
        assert_int_equal(plain.c.at, S(104));
        assert_int_equal(plain.d.last, ENGINE_EVENT_GRANTED);
        assert_int_equal(plain.d.at, S(107));

        teardown(state);
        setup(state);
        f = *state;
        Run2 r = scenario_ended_while_down(f, true);
        assert_int_equal(find(f, "B")->n_events, 1); /* the resumed B: refused, never granted nor queued */
        assert_outcome_equal(r.b, plain.b);
        assert_outcome_equal(r.c, plain.c);
        assert_outcome_equal(r.d, plain.d);
}


static void test_max_queue_does_not_refuse_resumed_waiters(void **state) {
        Fixture *f = *state;
        config_make(f, 1, 1, 1, 0, 3);
        engine_start(f, 0);
        acquire(f, "A", 1, USEC_INFINITY, 0);
        acquire(f, "B", 1, USEC_INFINITY, S(1));
        acquire(f, "C", 1, USEC_INFINITY, S(2));
        acquire(f, "D", 1, USEC_INFINITY, S(3));
        assert_int_equal(acquire(f, "X", 1, USEC_INFINITY, S(4))->refusal, REFUSAL_FULL);
        /* The new daemon's max-queue is lower: the three admitted before stay. */
        f->pools[0].max_queue = 1;
        restart(f, S(10), true);
        run(f, S(10));
        assert_int_equal(find(f, "B")->last, ENGINE_EVENT_QUEUED);
        assert_int_equal(find(f, "C")->last, ENGINE_EVENT_QUEUED);
        assert_int_equal(find(f, "D")->last, ENGINE_EVENT_QUEUED);
        size_t pos;
        assert_int_equal(engine_request_position(find(f, "D")->request, &pos, NULL), 0);
        assert_int_equal(pos, 2);
        Tag *y = acquire(f, "Y", 1, USEC_INFINITY, S(11));
        assert_int_equal(y->last, ENGINE_EVENT_REFUSED);
        assert_int_equal(y->refusal, REFUSAL_FULL);
}

/* Someone ahead (B, 2 slots, of which 1 is free): queued behind it, as a new request would be; room and
 * nobody ahead: granted at once, its wait counted from its old arrival. */
static void test_resumed_waiter_granted_only_as_a_new_request_would_be(void **state) {
        Fixture *f = *state;
        config_make(f, 1, 1, 2, 0, -1);
        engine_start(f, S(10));
        const unsigned slot0 = 0;
        EngineLease *hl;
        assert_int_equal(engine_lease_restore(f->engine,
                                              &(EngineLeaseRestore) { .pool = "p", .lane = "l", .slots = &slot0,
                                                                      .n_slots = 1, .token = 1, .expires_at = USEC_INFINITY },
                                              &hl),
                         0);
        EngineResume rb = { .pool = "p", .arrival = S(1), .budget = USEC_INFINITY };
        EngineResume rc = { .pool = "p", .arrival = S(2), .budget = USEC_INFINITY };
        Tag *b = acquire_ex(f, "B", 2, USEC_INFINITY, &rb, S(10));
        Tag *c = acquire_ex(f, "C", 1, USEC_INFINITY, &rc, S(10));
        run(f, S(10));
        assert_int_equal(b->last, ENGINE_EVENT_QUEUED);
        assert_int_equal(c->last, ENGINE_EVENT_QUEUED); /* no barging behind B */
        assert_int_equal(engine_request_arrival(c->request), S(2));
        engine_lease_release(hl, S(12));
        run(f, S(12));
        assert_int_equal(b->last, ENGINE_EVENT_GRANTED);
        assert_int_equal(b->wait, S(11));
        assert_int_equal(c->last, ENGINE_EVENT_QUEUED);
        end(f, b, S(14));
        assert_int_equal(c->last, ENGINE_EVENT_GRANTED);
        assert_int_equal(c->at, S(14));
        EngineResume rd = { .pool = "p", .arrival = S(3), .budget = USEC_INFINITY };
        Tag *d = acquire_ex(f, "D", 1, USEC_INFINITY, &rd, S(15));
        assert_int_equal(d->last, ENGINE_EVENT_GRANTED);
        assert_int_equal(d->at, S(15));
        assert_int_equal(d->wait, S(12));
        assert_true(d->queued); /* its events say it waited */
}

/* Its pool gone from the lane (or drained): routed as a new request, its arrival kept. */
static void test_resumed_waiter_of_a_removed_pool_is_routed_afresh(void **state) {
        Fixture *f = *state;
        config_make(f, 2, 2, 1, 0, -1);
        engine_start(f, 0);
        EngineResume gone = { .pool = "zz", .arrival = S(3), .budget = S(7), .state = QUEUE_STATE_KEEPING_UP };
        Tag *a = acquire_ex(f, "A", 1, USEC_INFINITY, &gone, S(10));
        assert_int_equal(a->last, ENGINE_EVENT_GRANTED);
        assert_string_equal(engine_lease_pool(a->lease), "p");
        assert_int_equal(a->wait, S(7));
        assert_false(a->queued); /* a new request, not the old waiter */

        /* q drained: no place to go back to; as a new request it queues on p (full), its arrival kept. */
        assert_int_equal(engine_drain(f->engine, "q", NULL, true, S(11)), 0);
        EngineResume drained = { .pool = "q", .arrival = S(4), .budget = S(1), .state = QUEUE_STATE_SATURATED };
        Tag *b = acquire_ex(f, "B", 1, USEC_INFINITY, &drained, S(11));
        assert_int_equal(b->last, ENGINE_EVENT_QUEUED);
        assert_string_equal(engine_request_pool(b->request), "p");
        assert_int_equal(engine_request_arrival(b->request), S(4));
        assert_int_equal(engine_request_budget(b->request), USEC_INFINITY); /* p has no queue-timeout */
        engine_request_cancel(b->request, S(11));

        /* Its pool still in the lane (not the last one): back there, waiting, though a new request would
         * have gone by it. */
        assert_int_equal(engine_drain(f->engine, "q", NULL, false, S(12)), 0);
        EngineResume back = { .pool = "p", .arrival = S(5), .budget = S(100), .state = QUEUE_STATE_KEEPING_UP,
                              .idle = S(2) };
        Tag *c = acquire_ex(f, "C", 1, USEC_INFINITY, &back, S(12));
        assert_int_equal(c->last, ENGINE_EVENT_QUEUED);
        assert_string_equal(engine_request_pool(c->request), "p");
        assert_int_equal(engine_request_budget(c->request), S(100));
        assert_int_equal(engine_request_idle(c->request), S(2));
        assert_int_equal(engine_request_state(c->request), QUEUE_STATE_KEEPING_UP);
        run(f, S(105));
        assert_int_equal(c->last, ENGINE_EVENT_REFUSED);
        assert_int_equal(c->refusal, REFUSAL_TIMEOUT);
        assert_int_equal(c->at, S(105));
        assert_int_equal(c->wait, S(100));
}

/* A lane whose also= changed across the restart (a new configuration at the start) refuses its resumed waiter as
 * a reload refuses it ("reload"), rather than granting it without the pools it waited for; the same rules, or none
 * known (a state from before they were kept), resume it. */
static void test_resumed_waiter_of_a_changed_lane_is_refused_as_after_a_reload(void **state) {
        Fixture *f = *state;
        config_make(f, 3, 1, 1, 0, -1);
        LaneAlso also[2] = { { .pool = (char *) "q", .slots = 1 }, { .pool = (char *) "r", .slots = 1 } };
        f->lane.also = also;
        f->lane.n_also = 2;
        engine_start(f, 0);
        Tag *held = acquire(f, "H", 1, USEC_INFINITY, S(1));
        assert_int_equal(held->last, ENGINE_EVENT_GRANTED);
        Tag *w = acquire(f, "W", 1, USEC_INFINITY, S(2));
        assert_int_equal(w->last, ENGINE_EVENT_QUEUED);
        _cleanup_free_ char *rules = NULL;
        assert_int_equal(engine_request_lane_rules(w->request, &rules), 0);
        assert_string_equal(rules, "also q:1,also r:1");

        static const struct {
                const char *rules;
                bool refused;
        } cases[] = {
                { "also q:1,also r:1", false },
                { NULL, false },
                { "also q:2,also r:1", true },
                { "also q:1,also r:1,label arm64", true },
        };
        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                EngineResume resume = { .pool = "p", .arrival = S(2), .budget = USEC_INFINITY,
                                        .state = QUEUE_STATE_KEEPING_UP, .lane_rules = cases[i].rules };
                Tag *t = acquire_ex(f, "R", 1, USEC_INFINITY, &resume, S(3));
                run(f, S(3));
                if (cases[i].refused) {
                        assert_int_equal(t->last, ENGINE_EVENT_REFUSED);
                        assert_int_equal(t->refusal, REFUSAL_UNAVAILABLE);
                } else {
                        assert_int_not_equal(t->last, ENGINE_EVENT_REFUSED); /* waiting in the set's pools */
                        assert_string_equal(engine_request_pool(t->request), "p");
                        engine_request_cancel(t->request, S(4));
                }
        }
        engine_request_cancel(w->request, S(4));
}

static void test_resume_and_clock_arguments_are_checked(void **state) {
        Fixture *f = *state;
        config_make(f, 1, 1, 1, S(60), -1);
        engine_start(f, S(1));
        EngineRequest *r = NULL;
        EngineResume future = { .pool = "p", .arrival = S(20), .budget = USEC_INFINITY };
        assert_int_equal(engine_acquire(f->engine, &(EngineAcquire) { .lane = "l", .slots = 1, .resume = &future },
                                        S(10), &r),
                         -EINVAL);
        EngineResume bad_state = { .pool = "p", .arrival = S(2), .state = _QUEUE_STATE_MAX };
        assert_int_equal(engine_acquire(f->engine, &(EngineAcquire) { .lane = "l", .slots = 1, .resume = &bad_state },
                                        S(10), &r),
                         -EINVAL);
        assert_null(r);
        usec_t t;
        assert_int_equal(engine_pool_get_last_fast(f->engine, "p", &t), 0);
        assert_int_equal(t, S(1)); /* a pool starts measuring idle time when configured */
        assert_int_equal(engine_pool_get_last_fast(f->engine, "nope", &t), -ENOENT);
        assert_int_equal(engine_pool_set_last_fast(f->engine, "nope", 0, S(10)), -ENOENT);
        assert_int_equal(engine_pool_set_last_fast(f->engine, "p", S(11), S(10)), -EINVAL);
        assert_int_equal(engine_pool_set_last_fast(f->engine, "p", S(5), S(10)), 0);
        assert_int_equal(engine_pool_get_last_fast(f->engine, "p", &t), 0);
        assert_int_equal(t, S(5));
}

int main(void) {
        const struct CMUnitTest tests[] = {
#define T(x) cmocka_unit_test_setup_teardown(x, setup, teardown)
                T(test_resumed_waiters_keep_order_and_deadlines),
                T(test_without_last_fast_the_budget_differs),
                T(test_resumed_shed_waiter_refused_at_its_deadline),
                T(test_resumed_waiter_whose_budget_ended_is_refused_with_room),
                T(test_max_queue_does_not_refuse_resumed_waiters),
                T(test_resumed_waiter_granted_only_as_a_new_request_would_be),
                T(test_resumed_waiter_of_a_removed_pool_is_routed_afresh),
                T(test_resumed_waiter_of_a_changed_lane_is_refused_as_after_a_reload),
                T(test_resume_and_clock_arguments_are_checked),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
