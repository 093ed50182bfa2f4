/* SPDX-License-Identifier: MIT */
/* test-engine-async.c — the engine with pools that decide later (fake-pool.c): answers that arrive between
 * engine calls, cancels while a pool has not answered, lost grants, the pool's own measure of a wait, and
 * an engine that runs an instant once however long a pool keeps it due. */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"
#include "fake-pool.h"

#define S(x) ((usec_t) (x) * USEC_PER_SEC)

/* Pool "a" has a backend (a fake pool), pool "b" has none (the in-process pool). Lane "wait" waits on a,
 * "solo" does not; "fast" tries a then b and does not wait; "held" waits on a, with max-hold 10 s.
 *
 * The fake pool answers whenever it is run, and the engine runs the pools at a command's `now` before a
 * later command: a test that needs an answer still to come makes its next command at the same instant. */
static const char *const config_keys[][3] = {
        { "pool a", "limit", "1" },
        { "pool a", "backend", "redis://127.0.0.1:1/0" },
        { "pool b", "limit", "1" },
        { "lane wait", "pools", "a" },
        { "lane solo", "pools", "a" },
        { "lane solo", "policy", "fail-fast" },
        { "lane fast", "pools", "a b" },
        { "lane fast", "policy", "fail-fast" },
        { "lane held", "pools", "a" },
        { "lane held", "max-hold", "10s" },
};

typedef struct Fixture {
        BrokerConfig *config;
        FakePoolSet pools;
        Engine *engine;
        uint64_t rng;
        EngineEvent events[64];
        size_t n_events;
        EngineRequest *requests[16];
        size_t n_requests;
} Fixture;

static uint64_t counter_random(void *userdata) {
        return ++*(uint64_t *) userdata;
}

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof(Fixture));
        assert_non_null(f);
        assert_int_equal(conf_new(&f->config), 0);
        for (size_t i = 0; i < ELEMENTSOF(config_keys); i++)
                assert_int_equal(conf_set(f->config, config_keys[i][0], config_keys[i][1], config_keys[i][2], NULL, NULL), 0);
        assert_int_equal(conf_validate(f->config, NULL), 0);
        assert_int_equal(engine_new(counter_random, &f->rng, &f->engine), 0);
        engine_set_pool_factory(f->engine, fake_pool_factory, &f->pools);
        assert_int_equal(engine_configure(f->engine, f->config, 0), 0);
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;
        for (size_t i = 0; i < f->n_requests; i++)
                engine_request_unref(f->requests[i]);
        engine_free(f->engine); /* also with requests a pool has not answered: no leak */
        conf_free(f->config);
        free(f);
        return 0;
}

static FakePool *pool_a(Fixture *f) {
        FakePool *p = fake_pool_set_find(&f->pools, "a");
        assert_non_null(p);
        return p;
}

static void take_events(Fixture *f) {
        EngineEvent ev;
        while (engine_pop_event(f->engine, &ev)) {
                assert_true(f->n_events < ELEMENTSOF(f->events));
                f->events[f->n_events++] = ev;
        }
}

static EngineRequest *acquire(Fixture *f, const char *lane, usec_t now) {
        EngineRequest *r;
        assert_true(f->n_requests < ELEMENTSOF(f->requests));
        assert_int_equal(engine_acquire(f->engine, &(EngineAcquire) { .lane = lane, .slots = 1, .max_wait = USEC_INFINITY },
                                        now, &r),
                         0);
        f->requests[f->n_requests++] = r;
        take_events(f);
        return r;
}

static void run(Fixture *f, usec_t now) {
        engine_run(f->engine, now);
        take_events(f);
}

/* The last event about request r (NULL: none). */
static const EngineEvent *last_event(const Fixture *f, const EngineRequest *r) {
        for (size_t i = f->n_events; i > 0; i--)
                if (f->events[i - 1].request == r)
                        return &f->events[i - 1];
        return NULL;
}

static const EngineEvent *grant_of(const Fixture *f, const EngineRequest *r) {
        const EngineEvent *ev = last_event(f, r);
        assert_non_null(ev);
        assert_int_equal(ev->type, ENGINE_EVENT_GRANTED);
        return ev;
}

static size_t count_events(const Fixture *f, EngineEventType type) {
        size_t n = 0;
        for (size_t i = 0; i < f->n_events; i++)
                n += f->events[i].type == type;
        return n;
}

static void test_nothing_is_decided_until_the_pool_answers(void **state) {
        Fixture *f = *state;
        EngineRequest *r = acquire(f, "wait", S(1));
        assert_null(last_event(f, r));
        assert_true(engine_request_is_in_flight(r));
        assert_false(engine_request_is_waiting(r));
        assert_int_equal(fake_pool_stats(pool_a(f))->pending, 1);
        run(f, S(1)); /* the pool answers when it is run */
        assert_int_equal(grant_of(f, r)->at, S(1));
        assert_false(engine_request_is_in_flight(r));
}

static void test_an_answer_between_calls_is_handled_by_the_next_call(void **state) {
        Fixture *f = *state;
        EngineRequest *r = acquire(f, "wait", S(1));
        fake_pool_answer(pool_a(f), S(2)); /* a reply arrives: the engine is not running */
        assert_int_equal(f->n_events, 0);
        engine_take_decisions(f->engine);
        take_events(f);
        const EngineEvent *ev = grant_of(f, r);
        assert_int_equal(ev->at, S(2));
        assert_int_equal(ev->wait, S(1)); /* the engine's measure: at − arrival */
}

static void test_routing_goes_on_after_an_asynchronous_refusal(void **state) {
        Fixture *f = *state;
        fake_pool_refuse(pool_a(f), REFUSAL_UNAVAILABLE, "backend");
        EngineRequest *r = acquire(f, "fast", S(1));
        assert_null(last_event(f, r));
        fake_pool_answer(pool_a(f), S(3));
        run(f, S(3));
        /* a's refusal came at 3 s; the next pool of the lane, in-process, granted at that instant. */
        const EngineEvent *ev = grant_of(f, r);
        assert_string_equal(ev->pool, "b");
        assert_int_equal(ev->at, S(3));
        assert_int_equal(ev->wait, S(2));
}

static void test_the_last_pool_refusal_carries_its_reason(void **state) {
        Fixture *f = *state;
        fake_pool_refuse(pool_a(f), REFUSAL_UNAVAILABLE, "rules");
        EngineRequest *r = acquire(f, "wait", S(1));
        run(f, S(1));
        const EngineEvent *ev = last_event(f, r);
        assert_non_null(ev);
        assert_int_equal(ev->type, ENGINE_EVENT_REFUSED);
        assert_int_equal(ev->refusal, REFUSAL_UNAVAILABLE);
        assert_string_equal(ev->reason, "rules");
        assert_string_equal(ev->pool, "a");
}

static void test_busy_on_the_last_pool_has_no_reason(void **state) {
        Fixture *f = *state;
        acquire(f, "wait", 0);
        run(f, 0); /* a is full */
        EngineRequest *r = acquire(f, "solo", S(1));
        run(f, S(1));
        const EngineEvent *ev = last_event(f, r);
        assert_non_null(ev);
        assert_int_equal(ev->refusal, REFUSAL_BUSY);
        assert_null(ev->reason);
}

static void test_cancel_before_the_answer_tells_the_pool_and_nothing_follows(void **state) {
        Fixture *f = *state;
        EngineRequest *r = acquire(f, "wait", S(1));
        engine_request_cancel(r, S(1));
        take_events(f);
        const FakePoolStats *st = fake_pool_stats(pool_a(f));
        assert_int_equal(st->cancelled, 1);
        assert_ptr_equal(st->last_cancelled, r);
        assert_int_equal(st->pending, 0);
        assert_false(engine_request_is_in_flight(r));
        run(f, S(3));
        assert_null(last_event(f, r));
        assert_int_equal(f->n_events, 0);
        /* The slot it would have had goes to the next. */
        EngineRequest *next = acquire(f, "wait", S(4));
        run(f, S(4));
        assert_int_equal(grant_of(f, next)->at, S(4));
}

static void test_cancel_after_a_queued_answer_withdraws_the_waiter(void **state) {
        Fixture *f = *state;
        EngineRequest *holder = acquire(f, "wait", 0);
        run(f, 0);
        grant_of(f, holder);
        EngineRequest *r = acquire(f, "wait", S(1));
        fake_pool_answer(pool_a(f), S(1)); /* QUEUED is on its way when the client goes */
        engine_request_cancel(r, S(1));
        take_events(f);
        const EngineEvent *ev = last_event(f, r);
        assert_non_null(ev);
        assert_int_equal(ev->type, ENGINE_EVENT_QUEUED);
        const FakePoolStats *st = fake_pool_stats(pool_a(f));
        assert_int_equal(st->cancelled, 0);
        assert_int_equal(st->withdrawn, 1);
        assert_int_equal(st->waiting, 0);
        assert_false(engine_request_is_waiting(r));
}

static void test_cancel_after_a_grant_came_in_leaves_the_grant_to_the_caller(void **state) {
        Fixture *f = *state;
        EngineRequest *r = acquire(f, "wait", S(1));
        fake_pool_answer(pool_a(f), S(1)); /* GRANTED is on its way when the client goes */
        engine_request_cancel(r, S(1));
        take_events(f);
        const EngineEvent *ev = grant_of(f, r); /* the caller releases it, as for any grant to a gone client */
        assert_int_equal(fake_pool_stats(pool_a(f))->cancelled, 0);
        assert_int_equal(fake_pool_stats(pool_a(f))->in_use, 1);
        engine_lease_release(ev->lease, S(3));
        assert_int_equal(fake_pool_stats(pool_a(f))->released, 1);
        assert_int_equal(fake_pool_stats(pool_a(f))->in_use, 0);
}

static void test_a_lost_grant_revokes_the_lease_with_the_pool_reason(void **state) {
        Fixture *f = *state;
        fake_pool_name_grants(pool_a(f), "node1");
        EngineRequest *r = acquire(f, "held", S(1));
        run(f, S(1));
        EngineLease *l = grant_of(f, r)->lease;
        assert_true(engine_lease_is_shared(l));
        assert_string_equal(engine_lease_remote_id(l), "node1:1");
        assert_true(fake_pool_lose(pool_a(f), engine_lease_token(l), "node-expired", S(4)));
        run(f, S(5));
        const EngineEvent *ev = &f->events[f->n_events - 1];
        assert_int_equal(ev->type, ENGINE_EVENT_REVOKE);
        assert_ptr_equal(ev->lease, l);
        assert_int_equal(ev->at, S(4));
        assert_string_equal(ev->reason, "node-expired");
        assert_true(ev->lost);
        assert_true(engine_lease_is_revoked(l));
        /* Revoked once: its max-hold (11 s) passes without a second REVOKE. */
        run(f, S(20));
        assert_int_equal(count_events(f, ENGINE_EVENT_REVOKE), 1);
        /* Its slots count as held until the lease is released. */
        assert_int_equal(fake_pool_stats(pool_a(f))->in_use, 1);
        engine_lease_release(l, S(21));
        assert_int_equal(fake_pool_stats(pool_a(f))->in_use, 0);
}

/* Pool "c", a second pool with a backend (a fake pool), configured at S(1); with `lane_set`, lane "set" too:
 * pools=a also=c. conf refuses a set over pools kept by a backend today (not built in the scripts), so it is
 * set after conf_validate(): the engine's part is what is tested. */
static FakePool *add_pool_c(Fixture *f, bool lane_set) {
        assert_int_equal(conf_set(f->config, "pool c", "limit", "1", NULL, NULL), 0);
        assert_int_equal(conf_set(f->config, "pool c", "backend", "redis://127.0.0.1:1/0", NULL, NULL), 0);
        if (lane_set) {
                assert_int_equal(conf_set(f->config, "lane set", "pools", "a", NULL, NULL), 0);
                assert_int_equal(conf_set(f->config, "lane set", "also", "c", NULL, NULL), 0);
        }
        assert_int_equal(engine_configure(f->engine, f->config, S(1)), 0);
        FakePool *c = fake_pool_set_find(&f->pools, "c");
        assert_non_null(c);
        return c;
}

/* SPEC §3.5 (issue 22 item 5): a brokerd fenced from one pool of an all-or-nothing set revokes the whole lease.
 * A lane over two pools kept by a backend (fake pools a and c: add_pool_c()). */
static void test_a_set_is_revoked_whole_when_any_pool_loses_its_share(void **state) {
        Fixture *f = *state;
        FakePool *c = add_pool_c(f, true);

        EngineRequest *r = acquire(f, "set", S(1));
        EngineLease *l = grant_of(f, r)->lease;
        assert_int_equal(engine_lease_also_count(l), 1);
        EngineLeaseAlso also;
        assert_int_equal(engine_lease_also(l, 0, &also), 0);
        assert_string_equal(also.pool, "c");
        assert_int_equal(fake_pool_stats(pool_a(f))->in_use, 1);
        assert_int_equal(fake_pool_stats(c)->in_use, 1);

        /* The also= pool loses its share (its backend fenced this node): the lease is lost whole, told once,
         * naming the pool that lost it; every share stays held until the holder releases the lease. */
        assert_true(fake_pool_lose(c, also.token, "fenced", S(3)));
        run(f, S(4));
        const EngineEvent *ev = &f->events[f->n_events - 1];
        assert_int_equal(ev->type, ENGINE_EVENT_REVOKE);
        assert_ptr_equal(ev->lease, l);
        assert_int_equal(ev->at, S(3));
        assert_string_equal(ev->reason, "fenced");
        assert_string_equal(ev->pool, "c");
        assert_true(ev->lost);
        assert_true(engine_lease_is_revoked(l));
        /* The chosen pool's loss of it too is not told again. */
        assert_true(fake_pool_lose(pool_a(f), engine_lease_token(l), "fenced", S(5)));
        run(f, S(6));
        assert_int_equal(count_events(f, ENGINE_EVENT_REVOKE), 1);
        assert_int_equal(fake_pool_stats(pool_a(f))->in_use, 1);
        assert_int_equal(fake_pool_stats(c)->in_use, 1);
        engine_lease_release(l, S(7));
        assert_int_equal(fake_pool_stats(pool_a(f))->in_use, 0);
        assert_int_equal(fake_pool_stats(c)->in_use, 0);
}

/* A set over two pools of one backend: the lease and each share keep the backend's name of them, so that the
 * lease log can reclaim every share after a restart (SPEC §3.5, §11). */
static void test_a_set_keeps_each_shares_remote_id(void **state) {
        Fixture *f = *state;
        FakePool *c = add_pool_c(f, true);
        fake_pool_name_grants(pool_a(f), "node1/a");
        fake_pool_name_grants(c, "node1/c");

        EngineRequest *r = acquire(f, "set", S(1));
        EngineLease *l = grant_of(f, r)->lease;
        char want[64];
        snprintf(want, sizeof want, "node1/a:%" PRIu64, engine_lease_token(l));
        assert_non_null(engine_lease_remote_id(l));
        assert_string_equal(engine_lease_remote_id(l), want);
        assert_int_equal(engine_lease_also_count(l), 1);
        EngineLeaseAlso also;
        assert_int_equal(engine_lease_also(l, 0, &also), 0);
        snprintf(want, sizeof want, "node1/c:%" PRIu64, also.token);
        assert_non_null(also.remote_id);
        assert_string_equal(also.remote_id, want);
        engine_lease_release(l, S(2));
}

/* A lease of lane "wait" on slot 0 of `pool`, restored as the lease log restores one its backend names `remote_id`. */
static EngineLease *restore_lease(Fixture *f, const char *pool, uint64_t token, usec_t granted_at,
                                  const char *remote_id) {
        const unsigned slots[] = { 0 };
        EngineLease *l;
        assert_int_equal(engine_lease_restore(f->engine,
                                              &(EngineLeaseRestore) {
                                                      .pool = pool,
                                                      .lane = "wait",
                                                      .slots = slots,
                                                      .n_slots = 1,
                                                      .token = token,
                                                      .granted_at = granted_at,
                                                      .expires_at = USEC_INFINITY,
                                                      .remote_id = remote_id,
                                              },
                                              &l),
                         0);
        return l;
}

/* A set lease restored as the lease log would: its share in pool a, then its also= share in pool c. Returns c. */
static FakePool *restore_set(Fixture *f, const char *also_remote_id, int want, EngineLease **ret) {
        FakePool *c = add_pool_c(f, false);
        const unsigned slots[] = { 0 };
        EngineLease *l = restore_lease(f, "a", 7, S(1), "node1:7");
        assert_int_equal(engine_lease_restore_also(l,
                                                   &(EngineLeaseRestore) {
                                                           .pool = "c",
                                                           .slots = slots,
                                                           .n_slots = 1,
                                                           .token = 9,
                                                           .remote_id = also_remote_id,
                                                   }),
                         want);
        *ret = l;
        return c;
}

/* A restored set lease over shared pools takes its shared shares back, each bound to the lease: a reclaim
 * refused in the also= pool revokes the whole lease, naming that pool. */
static void test_a_restored_set_takes_its_shared_shares_bound(void **state) {
        Fixture *f = *state;
        EngineLease *l;
        FakePool *c = restore_set(f, "node1:9", 0, &l);
        assert_string_equal(fake_pool_stats(c)->restored_remote_id, "node1:9");
        assert_int_equal(fake_pool_stats(c)->in_use, 1);
        EngineLeaseAlso also;
        assert_int_equal(engine_lease_also(l, 0, &also), 0);
        assert_string_equal(also.remote_id, "node1:9");
        assert_int_equal(also.token, 9);

        assert_true(fake_pool_lose(c, 9, "reclaim-conflict", S(2)));
        run(f, S(2));
        const EngineEvent *ev = &f->events[f->n_events - 1];
        assert_int_equal(ev->type, ENGINE_EVENT_REVOKE);
        assert_ptr_equal(ev->lease, l);
        assert_string_equal(ev->pool, "c");
        assert_true(engine_lease_is_revoked(l));
        engine_lease_release(l, S(3));
        assert_int_equal(fake_pool_stats(pool_a(f))->in_use, 0);
        assert_int_equal(fake_pool_stats(c)->in_use, 0);
}

/* A set is never mixed: a local share of a shared lease is refused, the lease unchanged. */
static void test_a_restored_shared_set_refuses_a_local_share(void **state) {
        Fixture *f = *state;
        EngineLease *l;
        FakePool *c = restore_set(f, NULL, -EINVAL, &l);
        assert_int_equal(engine_lease_also_count(l), 0);
        assert_int_equal(fake_pool_stats(c)->in_use, 0);
        engine_lease_release(l, S(2));
}

/* Lane "set": pools=a also=c, both pools of a backend whose set parts are decided, and granted, on the
 * pool's answer (as a shared pool's come from Redis later): f's pools a and c. */
static FakePool *set_pools_deferred(Fixture *f) {
        FakePool *c = add_pool_c(f, true);
        fake_pool_defer_sets(pool_a(f), true);
        fake_pool_defer_sets(c, true);
        fake_pool_hold_answers(pool_a(f), true);
        fake_pool_hold_answers(c, true);
        return c;
}

static void answer(Fixture *f, FakePool *p, usec_t now) {
        fake_pool_answer(p, now);
        engine_take_decisions(f->engine);
        take_events(f);
}

/* A set whose pools answer later is decided when the last of them has answered, and granted whole when the
 * last grant has come: nothing is told before, and never one pool's share alone (SPEC §3.5). */
static void test_a_set_over_pools_that_answer_later_awaits_every_answer(void **state) {
        Fixture *f = *state;
        FakePool *c = set_pools_deferred(f);
        EngineRequest *r = acquire(f, "set", S(1));
        assert_null(last_event(f, r));
        answer(f, pool_a(f), S(2));
        assert_null(last_event(f, r)); /* c has not answered: nothing decided (no budget of 0 from it) */
        assert_true(engine_request_is_in_flight(r));
        answer(f, c, S(3));
        /* Both queued with room: the engine asks both to grant; nothing told until both have. */
        assert_null(last_event(f, r));
        size_t pos = 9, queued = 9;
        assert_int_equal(engine_request_position(r, &pos, &queued), 0); /* first everywhere; no pool asked */
        assert_int_equal(pos, 0);
        answer(f, c, S(4));
        assert_null(last_event(f, r));
        assert_int_equal(fake_pool_stats(c)->in_use, 1);
        answer(f, pool_a(f), S(5));
        const EngineEvent *ev = grant_of(f, r);
        assert_int_equal(ev->at, S(5));
        assert_int_equal(count_events(f, ENGINE_EVENT_QUEUED), 0);
        EngineLease *l = ev->lease;
        assert_int_equal(engine_lease_also_count(l), 1);
        assert_int_equal(fake_pool_stats(pool_a(f))->in_use, 1);
        /* One call over the set to submit it and one to grant it (pools of one backend), none a pool. */
        assert_int_equal(fake_pool_stats(pool_a(f))->set_calls, 2);
        assert_int_equal(fake_pool_stats(c)->set_calls, 0);
        engine_lease_release(l, S(6));
        assert_int_equal(fake_pool_stats(pool_a(f))->in_use, 0);
        assert_int_equal(fake_pool_stats(c)->in_use, 0);
}

/* One pool refuses the set's part after the other queued it: the set is refused naming that pool, its part
 * in the other withdrawn. */
static void test_a_set_refused_later_by_one_pool_leaves_none_queued(void **state) {
        Fixture *f = *state;
        FakePool *c = set_pools_deferred(f);
        fake_pool_refuse(c, REFUSAL_UNAVAILABLE, "backend");
        EngineRequest *r = acquire(f, "set", S(1));
        answer(f, pool_a(f), S(2));
        assert_null(last_event(f, r));
        answer(f, c, S(3));
        const EngineEvent *ev = last_event(f, r);
        assert_non_null(ev);
        assert_int_equal(ev->type, ENGINE_EVENT_REFUSED);
        assert_string_equal(ev->pool, "c");
        assert_int_equal(fake_pool_stats(pool_a(f))->withdrawn, 1);
        assert_int_equal(fake_pool_stats(pool_a(f))->waiting, 0);
}

/* A pool whose grant comes back refused (its room went meanwhile): the share the other pool granted is given
 * back and the set is refused whole, naming that pool. */
static void test_a_set_whose_grant_fails_in_one_pool_holds_nothing(void **state) {
        Fixture *f = *state;
        FakePool *c = set_pools_deferred(f);
        EngineRequest *r = acquire(f, "set", S(1));
        answer(f, pool_a(f), S(2));
        answer(f, c, S(2));
        assert_null(last_event(f, r));
        answer(f, pool_a(f), S(3)); /* a granted its share */
        assert_int_equal(fake_pool_stats(pool_a(f))->in_use, 1);
        /* c's room goes before its grant is decided (another node's lease, restored here). */
        EngineLease *other = restore_lease(f, "c", 40, S(3), "node2:40");
        answer(f, c, S(4));
        const EngineEvent *ev = last_event(f, r);
        assert_non_null(ev);
        assert_int_equal(ev->type, ENGINE_EVENT_REFUSED);
        assert_string_equal(ev->pool, "c");
        assert_int_equal(fake_pool_stats(pool_a(f))->in_use, 0); /* a's share given back */
        assert_int_equal(fake_pool_stats(pool_a(f))->released, 1);
        engine_lease_release(other, S(5));
}

/* A set cancelled while one pool has answered and the other has not: the part queued is withdrawn, the try
 * still out is cancelled; nothing comes later. */
static void test_a_set_cancelled_while_routing_leaves_nothing_behind(void **state) {
        Fixture *f = *state;
        FakePool *c = set_pools_deferred(f);
        EngineRequest *r = acquire(f, "set", S(1));
        answer(f, pool_a(f), S(2));
        engine_request_cancel(r, S(2));
        assert_int_equal(fake_pool_stats(pool_a(f))->withdrawn, 1);
        assert_int_equal(fake_pool_stats(c)->cancelled, 1);
        assert_int_equal(fake_pool_stats(c)->pending, 0);
        answer(f, c, S(3));
        assert_null(last_event(f, r));
        assert_int_equal(fake_pool_stats(pool_a(f))->waiting, 0);
}

static void test_a_lease_released_as_its_loss_comes_in_is_not_revoked(void **state) {
        Fixture *f = *state;
        EngineRequest *r = acquire(f, "held", S(1));
        run(f, S(1));
        EngineLease *l = grant_of(f, r)->lease;
        assert_true(fake_pool_lose(pool_a(f), engine_lease_token(l), "node-expired", S(2)));
        /* The release is the first call after the loss came in: it ends the lease, whose REVOKE would point
         * at nothing. */
        engine_lease_release(l, S(2));
        take_events(f);
        assert_int_equal(count_events(f, ENGINE_EVENT_REVOKE), 0);
        assert_int_equal(fake_pool_stats(pool_a(f))->in_use, 0);
}

static void test_max_hold_revocation_says_so(void **state) {
        Fixture *f = *state;
        EngineRequest *r = acquire(f, "held", S(1));
        run(f, S(1));
        EngineLease *l = grant_of(f, r)->lease;
        assert_false(engine_lease_is_shared(l));
        assert_null(engine_lease_remote_id(l));
        run(f, S(11));
        const EngineEvent *ev = &f->events[f->n_events - 1];
        assert_int_equal(ev->type, ENGINE_EVENT_REVOKE);
        assert_string_equal(ev->reason, "max-hold");
        assert_false(ev->lost);
        /* A loss after that is told once more, as lost (issue 19 d): the holder may be letting go already,
         * but a command nobody stops is brokerd's to fence before its slots are another node's. */
        assert_true(fake_pool_lose(pool_a(f), engine_lease_token(l), "fenced", S(12)));
        run(f, S(12));
        assert_int_equal(count_events(f, ENGINE_EVENT_REVOKE), 2);
        ev = &f->events[f->n_events - 1];
        assert_int_equal(ev->type, ENGINE_EVENT_REVOKE);
        assert_true(ev->lost);
        assert_string_equal(ev->reason, "fenced");
        /* A second loss tells nobody. */
        (void) fake_pool_lose(pool_a(f), engine_lease_token(l), "node-expired", S(13));
        run(f, S(13));
        assert_int_equal(count_events(f, ENGINE_EVENT_REVOKE), 2);
}

static void test_the_pool_measures_the_wait_when_it_says(void **state) {
        Fixture *f = *state;
        fake_pool_measure_wait(pool_a(f), S(3));
        EngineRequest *r = acquire(f, "wait", 0);
        run(f, 0);
        const EngineEvent *ev = grant_of(f, r);
        assert_int_equal(ev->at, 0);
        assert_int_equal(ev->wait, S(3)); /* not at − arrival */

        /* A queued request refused later: the pool's measure too. */
        EngineRequest *q = acquire(f, "wait", S(11));
        run(f, S(11));
        assert_int_equal(last_event(f, q)->type, ENGINE_EVENT_QUEUED);
        fake_pool_refuse_waiters(pool_a(f), REFUSAL_TIMEOUT);
        run(f, S(40));
        ev = last_event(f, q);
        assert_int_equal(ev->type, ENGINE_EVENT_REFUSED);
        assert_int_equal(ev->refusal, REFUSAL_TIMEOUT);
        assert_int_equal(ev->wait, S(3));
}

static void test_a_restored_lease_is_bound_with_its_remote_id(void **state) {
        Fixture *f = *state;
        EngineLease *l = restore_lease(f, "a", 7, S(1), "node1:7");
        assert_string_equal(fake_pool_stats(pool_a(f))->restored_remote_id, "node1:7");
        assert_string_equal(engine_lease_remote_id(l), "node1:7");
        assert_true(engine_lease_is_shared(l));
        /* Bound: a reclaim that fails later revokes it. */
        assert_true(fake_pool_lose(pool_a(f), 7, "reclaim-conflict", S(2)));
        run(f, S(2));
        assert_int_equal(f->events[f->n_events - 1].type, ENGINE_EVENT_REVOKE);
        assert_ptr_equal(f->events[f->n_events - 1].lease, l);
        assert_string_equal(f->events[f->n_events - 1].reason, "reclaim-conflict");
        engine_lease_release(l, S(3));
}

static void test_a_wakeup_that_stays_due_is_run_once_per_call(void **state) {
        Fixture *f = *state;
        FakePool *a = pool_a(f);
        const FakePoolStats *st = fake_pool_stats(a);
        EngineRequest *r = acquire(f, "held", S(1));
        run(f, S(1));
        EngineLease *l = grant_of(f, r)->lease;
        assert_true(engine_lease_expires_at(l) == S(11));
        size_t n = st->n_runs;

        /* Asked to settle 2 s, the pool still reports 2 s until its answer comes: the engine must not spin on
         * it (the fake pool aborts on the 65th run), nor skip the instants after it. */
        fake_pool_set_wakeup(a, S(2), true);
        run(f, S(5));
        assert_int_equal(st->n_runs, n + 2);
        assert_int_equal(st->runs[n], S(2));
        assert_int_equal(st->runs[n + 1], S(5));
        run(f, S(20));
        assert_int_equal(count_events(f, ENGINE_EVENT_REVOKE), 1);
        assert_int_equal(f->events[f->n_events - 1].at, S(11)); /* max-hold, at its own instant */
        assert_int_equal(st->n_runs, n + 5);
        assert_int_equal(st->runs[n + 2], S(2)); /* once in this call too */
        assert_int_equal(st->runs[n + 3], S(11));
        assert_int_equal(st->runs[n + 4], S(20));
}

static void test_a_pool_with_a_backend_needs_a_factory(void **state) {
        Fixture *f = *state;
        _cleanup_(engine_freep) Engine *e = NULL;
        assert_int_equal(engine_new(counter_random, &f->rng, &e), 0);
        assert_int_equal(engine_configure(e, f->config, 0), -EOPNOTSUPP);
        engine_set_pool_factory(e, engine_pool_factory_local, NULL);
        assert_int_equal(engine_configure(e, f->config, 0), 0);
}

static void test_snapshot_is_for_pools_with_a_backend(void **state) {
        Fixture *f = *state;
        acquire(f, "wait", 0);
        run(f, 0);
        acquire(f, "wait", 0);
        run(f, 0);
        PoolSnapshot snapshot;
        assert_int_equal(engine_pool_snapshot(f->engine, 0, &snapshot), 0);
        assert_int_equal(snapshot.waiting, 1);
        assert_int_equal(engine_pool_snapshot(f->engine, 1, &snapshot), -EOPNOTSUPP);
        assert_int_equal(engine_pool_snapshot(f->engine, 2, &snapshot), -ENOENT);
}

/* A pool kept by a backend keeps its own controlled-delay clock: nothing to carry across a restart. */
static void test_backend_pool_has_no_last_fast_to_carry(void **state) {
        Fixture *f = *state;
        usec_t t = 7;
        assert_int_equal(engine_pool_get_last_fast(f->engine, "a", &t), -EOPNOTSUPP);
        assert_int_equal(t, 7);
        assert_int_equal(engine_pool_set_last_fast(f->engine, "a", 0, S(1)), -EOPNOTSUPP);
}

int main(void) {
        const struct CMUnitTest tests[] = {
#define T(x) cmocka_unit_test_setup_teardown(x, setup, teardown)
                T(test_nothing_is_decided_until_the_pool_answers),
                T(test_backend_pool_has_no_last_fast_to_carry),
                T(test_an_answer_between_calls_is_handled_by_the_next_call),
                T(test_routing_goes_on_after_an_asynchronous_refusal),
                T(test_the_last_pool_refusal_carries_its_reason),
                T(test_busy_on_the_last_pool_has_no_reason),
                T(test_cancel_before_the_answer_tells_the_pool_and_nothing_follows),
                T(test_cancel_after_a_queued_answer_withdraws_the_waiter),
                T(test_cancel_after_a_grant_came_in_leaves_the_grant_to_the_caller),
                T(test_a_lost_grant_revokes_the_lease_with_the_pool_reason),
                T(test_a_set_is_revoked_whole_when_any_pool_loses_its_share),
                T(test_a_set_keeps_each_shares_remote_id),
                T(test_a_restored_set_takes_its_shared_shares_bound),
                T(test_a_restored_shared_set_refuses_a_local_share),
                T(test_a_set_over_pools_that_answer_later_awaits_every_answer),
                T(test_a_set_refused_later_by_one_pool_leaves_none_queued),
                T(test_a_set_whose_grant_fails_in_one_pool_holds_nothing),
                T(test_a_set_cancelled_while_routing_leaves_nothing_behind),
                T(test_a_lease_released_as_its_loss_comes_in_is_not_revoked),
                T(test_max_hold_revocation_says_so),
                T(test_the_pool_measures_the_wait_when_it_says),
                T(test_a_restored_lease_is_bound_with_its_remote_id),
                T(test_a_wakeup_that_stays_due_is_run_once_per_call),
                T(test_a_pool_with_a_backend_needs_a_factory),
                T(test_snapshot_is_for_pools_with_a_backend),
#undef T
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
