/* SPDX-License-Identifier: MIT */
/* test-pool-shared.c — the pure half of a pool kept in Redis, against a fake backend: the test takes the
 * calls the pool makes, checks their ARGV against brokerd/lua/README and answers with canned replies in the
 * README's formats, on a fake clock. No Redis. */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pool-shared.h"
#include "strv.h"

#define S(x) ((usec_t) (x) * USEC_PER_SEC)
#define MS(x) ((usec_t) (x) * USEC_PER_MSEC)
#define TTL S(30)
#define REVOKE_GRACE S(5)
#define WAITER_GRACE S(5)
#define NODE "0123456789abcdef0123456789abcdef"

/* Every calloc() of the code linked in fails while set (meson links this test with --wrap=calloc): a call that
 * cannot be made. */
static bool calloc_fails;
void *__real_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size) {
        return calloc_fails ? NULL : __real_calloc(n, size);
}

/* ----------------------------------------------------------------------------- RESP values, canned */

/* Replies are built in an arena that lives for one test. */
static RespValue arena[8192];
static size_t arena_used;

static RespValue str(const char *s) {
        return (RespValue) { .type = RESP_STRING, .str = s, .len = strlen(s) };
}

static RespValue num(int64_t i) {
        return (RespValue) { .type = RESP_INTEGER, .integer = i };
}

static RespValue arr(size_t n, ...) {
        assert_true(arena_used + n <= ELEMENTSOF(arena));
        RespValue *e = &arena[arena_used];
        arena_used += n;
        va_list ap;
        va_start(ap, n);
        for (size_t i = 0; i < n; i++)
                e[i] = va_arg(ap, RespValue);
        va_end(ap);
        return (RespValue) { .type = RESP_ARRAY, .elements = e, .n = n };
}

#define EMPTY arr(0)
#define NIL ((RespValue) { .type = RESP_NIL }) /* Lua's false: how the scripts send an empty list */

static RespValue cache(int64_t in_use, int64_t waiting, int64_t congested, int64_t next_wakeup,
                       const char *stream_last) {
        return arr(11, num(in_use), num(waiting), num(congested), num(0), num(0), num(next_wakeup), num(100),
                   str("e1"), num(0), str(stream_last), num(2));
}

/* A cache whose recovery window ends at recovery_until (pool clock). */
static RespValue cache_in_recovery(int64_t in_use, int64_t recovery_until) {
        return arr(11, num(in_use), num(0), num(0), num(0), num(0), num(-1), num(100), str("e1"),
                   num(recovery_until), str(""), num(2));
}

static RespValue reply(const char *status, int64_t now, RespValue body, RespValue events, RespValue c) {
        return arr(6, str(status), num(now), body, events, c, EMPTY);
}

static RespValue decision(const char *verdict, const char *rid, int64_t at, int64_t wait, const char *refusal,
                          int64_t position, int64_t token, RespValue slots) {
        return arr(14, str(verdict), str(rid), num(at), num(wait), str(refusal), str(""), str("none"), num(0),
                   num(-1), num(position), num(position + 1), num(token), slots, EMPTY);
}

/* README "Fingerprint", for the test's own view of what Redis holds. */
static uint32_t fnv1a32(const char *rid, char kind) {
        uint32_t h = 2166136261u;
        for (const char *c = rid; *c; c++)
                h = (h ^ (uint8_t) *c) * 16777619u;
        return (h ^ (uint8_t) kind) * 16777619u;
}

static RespValue tick_body(const char *rules, RespValue diff, int64_t fp_n, int64_t fp_x, int64_t fp_s,
                           const char *reconciled_to) {
        return arr(9, num(0), str("e1"), num(0), str(rules), diff, arr(3, num(fp_n), num(fp_x), num(fp_s)),
                   str("0-0"), num(2), str(reconciled_to));
}

/* A reconcile page's answer with what it kept ("k"): lua/README, tick. */
static RespValue tick_body_kept(const char *rules, RespValue diff, int64_t fp_n, int64_t fp_x, int64_t fp_s,
                                const char *reconciled_to, int64_t kept_n, int64_t kept_x, int64_t kept_s) {
        return arr(10, num(0), str("e1"), num(0), str(rules), diff, arr(3, num(fp_n), num(fp_x), num(fp_s)),
                   str("0-0"), num(2), str(reconciled_to), arr(3, num(kept_n), num(kept_x), num(kept_s)));
}

/* ------------------------------------------------------------------------------------------ fixture */

typedef struct Seen {
        PoolVerdict verdict;
        void *cookie;
        usec_t at;
        Refusal refusal;
        const char *reason;
        uint64_t token;
        unsigned n_slots;
        unsigned slot0;
        bool has_wait;
        usec_t wait;
        bool congested;
        PoolGrant *grant;
        PoolWaiter *waiter;
        bool echo;
        char remote_id[64];
} Seen;

typedef struct Fixture {
        Pool *pool;
        Seen seen[64];
        size_t n_seen;
        uint64_t random;
        unsigned wakes;
        usec_t clock;  /* when the fake driver sends */
        unsigned next_slot; /* granted(): slots in turn, as Redis would (the limit is 2) */
        char *canon;
} Fixture;

static void on_decision(const PoolDecision *d, void *userdata) {
        Fixture *f = userdata;
        assert_true(f->n_seen < ELEMENTSOF(f->seen));
        Seen *s = &f->seen[f->n_seen++];
        *s = (Seen) {
                .verdict = d->verdict, .cookie = d->cookie, .at = d->at, .refusal = d->refusal,
                .reason = d->reason, .token = d->token, .n_slots = d->n_slots,
                .slot0 = d->n_slots > 0 ? d->slots[0] : 0, .has_wait = d->has_wait, .wait = d->wait,
                .congested = d->congested, .grant = d->grant, .waiter = d->waiter,
                .echo = d->echo,
        };
        if (d->remote_id)
                snprintf(s->remote_id, sizeof s->remote_id, "%s", d->remote_id);
}

static uint64_t next_random(void *userdata) {
        Fixture *f = userdata;
        return ++f->random;
}

static void on_wake(void *userdata) {
        Fixture *f = userdata;
        f->wakes++;
}

/* SharedPoolParams.batch_max of the next fixture (setup_batched()); 0: one call each. */
static unsigned fixture_batch_max;
/* SharedPoolParams.one_call_out of the next fixture (setup_one_call_out()). */
static bool fixture_one_call_out;
/* The next fixture's pool name and SharedPoolParams.find_pool (a set's fixture: setup_set()). */
static const char *fixture_name = "grid";
static Pool *(*fixture_find_pool)(const char *name, void *userdata);
static void *fixture_find_pool_userdata;
/* The next fixture's SharedPoolParams.call_order (NULL: its own count). */
static uint64_t *fixture_call_order;

/* confirm_stale: behind Sentinels (0: a plain redis://). */
static Fixture *fixture_new_confirmed(bool manual, usec_t confirm_stale) {
        Fixture *f = calloc(1, sizeof(Fixture));
        assert_non_null(f);
        arena_used = 0;
        SharedPoolParams params = {
                .node_id = NODE,
                .node_name = "runner-1",
                .node_ttl = TTL,
                .revoke_grace = REVOKE_GRACE,
                .waiter_grace = WAITER_GRACE,
                .heartbeat = S(1),
                .manual_clock = manual,
                .confirm_stale = confirm_stale,
                .random = next_random,
                .random_userdata = f,
                .wake = on_wake,
                .wake_userdata = f,
                .batch_max = fixture_batch_max,
                .one_call_out = fixture_one_call_out,
                .find_pool = fixture_find_pool,
                .find_pool_userdata = fixture_find_pool_userdata,
                .call_order = fixture_call_order,
        };
        fixture_batch_max = 0;
        fixture_one_call_out = false;
        assert_int_equal(pool_shared_new(fixture_name, &params, on_decision, f, &f->pool), 0);
        PoolConfig pc = { .name = (char *) fixture_name, .limit = 2, .max_queue = -1 };
        PoolLaneRule rules[] = { { .lane = "ci", .priority = 0, .max_in_use = -1 } };
        assert_int_equal(pool_configure(f->pool, &pc, rules, 1, S(1)), 0);
        return f;
}

static Fixture *fixture_new(bool manual) {
        return fixture_new_confirmed(manual, 0);
}

static void fixture_free(Fixture *f) {
        f->pool->ops->free(f->pool);
        free(f);
}

static int setup(void **state) {
        *state = fixture_new(false);
        return 0;
}

static int setup_manual(void **state) {
        *state = fixture_new(true);
        return 0;
}

#define CONFIRM_STALE S(3)

static int setup_batched(void **state) {
        fixture_batch_max = SHARED_BATCH_OPS_MAX;
        *state = fixture_new(false);
        return 0;
}

/* The daemon's form: batches, one call out at a time. */
static int setup_one_call_out(void **state) {
        fixture_batch_max = SHARED_BATCH_OPS_MAX;
        fixture_one_call_out = true;
        *state = fixture_new(false);
        return 0;
}

static int setup_sentinel(void **state) {
        *state = fixture_new_confirmed(false, CONFIRM_STALE);
        return 0;
}

static int teardown(void **state) {
        fixture_free(*state);
        return 0;
}

static const char *arg(const SharedCall *c, size_t i) {
        assert_true(i < c->argc);
        return c->argv[i];
}

/* The next call the pool sends, which must be of `script`. */
static const SharedCall *take(Fixture *f, SharedScript script) {
        const SharedCall *c = NULL;
        assert_true(pool_shared_take_call(f->pool, f->clock, &c));
        assert_string_equal(shared_script_to_string(c->script), shared_script_to_string(script));
        assert_int_equal(c->n_keys, 1);
        char key[64];
        snprintf(key, sizeof key, "{sb:%s}", f->pool->name);
        assert_string_equal(arg(c, 0), key);
        assert_string_equal(arg(c, 1), "1");
        assert_string_equal(arg(c, 2), NODE);
        return c;
}

static void no_call(Fixture *f) {
        const SharedCall *c = NULL;
        assert_false(pool_shared_take_call(f->pool, f->clock, &c));
}

static void done(Fixture *f, const SharedCall *c, RespValue r, usec_t boot, usec_t now) {
        pool_shared_call_done(f->pool, c->id, 0, &r, boot, now);
}

static uint64_t bad_inputs(Fixture *f) {
        PoolInfo info;
        f->pool->ops->info(f->pool, S(2), &info);
        return info.bad_input;
}

static void tick_ok(Fixture *f, usec_t boot, usec_t now) {
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        done(f, c, reply("ok", (int64_t) now, tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, cache(0, 0, 0, -1, "")),
             boot, now);
}

/* The link comes up and the first tick is answered: the pool is up. */
static void bring_up(Fixture *f, usec_t now) {
        pool_shared_link_up(f->pool, "run1", now);
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_REGISTERING);
        tick_ok(f, now, now);
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_UP);
}

static int submit(Fixture *f, void *cookie, unsigned k, bool may_wait, usec_t now) {
        PoolTry t = {
                .cookie = cookie, .lane = "ci", .slots = k, .may_wait = may_wait,
                .lane_budget = USEC_INFINITY, .client_cap = USEC_INFINITY, .arrival = now,
        };
        return f->pool->ops->submit(f->pool, &t, now);
}

/* Submits and answers with a grant of the next slot (0 first), token 7. Returns the rid. */
static const char *granted(Fixture *f, void *cookie, usec_t now, char rid[static 17]) {
        assert_int_equal(submit(f, cookie, 1, true, now), 0);
        const SharedCall *c = take(f, SHARED_SCRIPT_SUBMIT);
        snprintf(rid, 17, "%s", arg(c, 6));
        done(f, c, reply("ok", (int64_t) now, decision("granted", rid, (int64_t) now, 0, "", 0, 7,
                                                        arr(1, num(f->next_slot++ % 2))),
                         EMPTY, cache(1, 0, 0, -1, "")), now, now);
        assert_int_equal(f->seen[f->n_seen - 1].verdict, POOL_VERDICT_GRANTED);
        return rid;
}

/* A granted stream entry for rid with the given token, slots and members strings. */
static RespValue granted_entry(const char *rid, const char *token, const char *slots, const char *members) {
        return arr(28, str("verdict"), str("granted"), str("rid"), str(rid), str("at"), str("1500000"),
                   str("wait"), str("0"), str("refusal"), str(""), str("reason"), str(""), str("state"), str("none"),
                   str("idle"), str("0"), str("budget"), str("-1"), str("position"), str("0"), str("queued"),
                   str("0"), str("token"), str(token), str("slots"), str(slots), str("members"), str(members));
}

static const char *queued(Fixture *f, void *cookie, usec_t now, char rid[static 17]) {
        assert_int_equal(submit(f, cookie, 1, true, now), 0);
        const SharedCall *c = take(f, SHARED_SCRIPT_SUBMIT);
        snprintf(rid, 17, "%s", arg(c, 6));
        done(f, c, reply("ok", (int64_t) now, decision("queued", rid, (int64_t) now, 0, "", 3, 0, EMPTY),
                         EMPTY, cache(2, 4, 0, -1, "")), now, now);
        assert_int_equal(f->seen[f->n_seen - 1].verdict, POOL_VERDICT_QUEUED);
        return rid;
}

/* ------------------------------------------------------------------------------------------- tests */

/* ------------------------------------------------------------------- waiters resumed after a restart */

#define OLD_RID "00000000000000aa"

static int submit_resumed(Fixture *f, void *cookie, const char *remote_id, usec_t arrival, usec_t now) {
        PoolResume resume = {
                .state = QUEUE_STATE_KEEPING_UP, .idle = S(1), .budget = S(60), .remote_id = remote_id,
        };
        PoolTry t = {
                .cookie = cookie, .lane = "ci", .slots = 1, .may_wait = true, .lane_budget = USEC_INFINITY,
                .client_cap = USEC_INFINITY, .arrival = arrival, .resume = &resume,
        };
        return f->pool->ops->submit(f->pool, &t, now);
}

/* Whether a tick's reconcile page (ARGV[14…]) lists rid. */
static bool page_lists(const SharedCall *c, const char *rid) {
        for (size_t i = 16; i < c->argc; i++)
                if (streq(c->argv[i], rid))
                        return true;
        return false;
}

/* A new pool object (as after a restart, the same node id) takes its waiters back before it first reaches
 * Redis: their submits wait for the registration, under their old rids, and the registering tick's
 * reconcile lists them (a waiter a page misses is dropped at once: lua/README, "Orphans"). */
static void test_resumed_waiter_keeps_its_rid_and_is_listed_by_the_first_reconcile(void **state) {
        Fixture *f = *state;
        int a, b;
        assert_int_equal(submit_resumed(f, &a, OLD_RID, S(1), S(5)), 0);
        assert_int_equal(submit_resumed(f, &b, "00000000000000bb", S(2), S(5)), 0);
        assert_int_equal(f->n_seen, 0); /* not refused for want of a backend: kept for the registration */
        no_call(f);
        pool_shared_link_up(f->pool, "run1", S(6));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(c, 14), "-");
        assert_true(page_lists(c, OLD_RID));
        assert_true(page_lists(c, "00000000000000bb"));
        no_call(f); /* the submits wait for the answer */
        done(f, c, reply("ok", S(6), tick_body("ok", EMPTY, 2, 0, 0, ""), EMPTY, cache(1, 2, 0, -1, "")), S(6), S(6));
        c = take(f, SHARED_SCRIPT_SUBMIT);
        assert_string_equal(arg(c, 6), OLD_RID);
        assert_string_equal(arg(c, 15), "0"); /* Redis may know the rid: looked up (lua/submit.lua) */
        /* Redis still has it queued: its place now. */
        done(f, c, reply("ok", S(6), decision("queued", OLD_RID, S(6), 0, "", 0, 0, EMPTY), EMPTY,
                         cache(1, 2, 0, -1, "")), S(6), S(6));
        assert_int_equal(f->n_seen, 1);
        assert_int_equal(f->seen[0].verdict, POOL_VERDICT_QUEUED);
        assert_ptr_equal(f->seen[0].cookie, &a);
        assert_string_equal(f->pool->ops->remote_id(f->pool, f->seen[0].waiter), OLD_RID);
        size_t queued_n;
        assert_int_equal(f->pool->ops->position(f->pool, f->seen[0].waiter, &queued_n), 0);
        /* Redis granted the other one meanwhile: granted with its lease. */
        c = take(f, SHARED_SCRIPT_SUBMIT);
        assert_string_equal(arg(c, 6), "00000000000000bb");
        done(f, c, reply("ok", S(6), decision("granted", "00000000000000bb", S(4), S(2), "", 0, 9, arr(1, num(1))),
                         EMPTY, cache(2, 1, 0, -1, "")), S(6), S(6));
        assert_int_equal(f->n_seen, 2);
        assert_int_equal(f->seen[1].verdict, POOL_VERDICT_GRANTED);
        assert_ptr_equal(f->seen[1].cookie, &b);
        assert_int_equal(f->seen[1].token, 9);
        assert_string_equal(f->seen[1].remote_id, NODE ":00000000000000bb");
}

/* A resumed waiter whose budget had ended when it came back (SPEC §3.3: never granted after its budget ended):
 * a grant Redis made before its deadline stands; a grant made after it (Redis lost the waiter, its node reaped
 * while its brokerd was down, and decided the submit afresh) and a place in the queue are refused at the
 * deadline, timeout, and Redis is told to forget the rid (a withdraw releases a lease under it). */
static void test_resumed_waiter_whose_budget_ended_is_not_granted_late(void **state) {
        Fixture *f = *state;
        static const char *const rids[] = { "00000000000000aa", "00000000000000bb", "00000000000000cc" };
        int cookies[3];
        for (size_t i = 0; i < 3; i++) {
                PoolResume resume = {
                        .state = QUEUE_STATE_KEEPING_UP, .idle = S(1), .budget = S(60), .remote_id = rids[i],
                };
                PoolTry t = {
                        .cookie = &cookies[i], .lane = "ci", .slots = 1, .may_wait = true,
                        .lane_budget = USEC_INFINITY, .client_cap = USEC_INFINITY, .arrival = S(1), .resume = &resume,
                };
                assert_int_equal(f->pool->ops->submit(f->pool, &t, S(70)), 0); /* its deadline was 61 s */
        }
        f->clock = S(71);
        pool_shared_link_up(f->pool, "run1", S(71));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        done(f, c, reply("ok", S(71), tick_body("ok", EMPTY, 3, 0, 0, ""), EMPTY, cache(0, 3, 0, -1, "")), S(71), S(71));
        c = take(f, SHARED_SCRIPT_SUBMIT);
        assert_string_equal(arg(c, 6), rids[0]);
        done(f, c, reply("ok", S(71), decision("granted", rids[0], S(40), S(39), "", 0, 7, arr(1, num(0))), EMPTY,
                         cache(1, 2, 0, -1, "")), S(71), S(71));
        assert_int_equal(f->n_seen, 1);
        assert_int_equal(f->seen[0].verdict, POOL_VERDICT_GRANTED);
        assert_ptr_equal(f->seen[0].cookie, &cookies[0]);

        c = take(f, SHARED_SCRIPT_SUBMIT);
        assert_string_equal(arg(c, 6), rids[1]);
        done(f, c, reply("ok", S(71), decision("granted", rids[1], S(71), S(70), "", 0, 8, arr(1, num(1))), EMPTY,
                         cache(2, 1, 0, -1, "")), S(71), S(71));
        c = take(f, SHARED_SCRIPT_SUBMIT);
        assert_string_equal(arg(c, 6), rids[2]);
        done(f, c, reply("ok", S(71), decision("queued", rids[2], S(71), 0, "", 0, 0, EMPTY), EMPTY,
                         cache(2, 1, 0, -1, "")), S(71), S(71));
        assert_int_equal(f->n_seen, 3);
        for (size_t i = 1; i < 3; i++) {
                assert_int_equal(f->seen[i].verdict, POOL_VERDICT_REFUSED);
                assert_ptr_equal(f->seen[i].cookie, &cookies[i]);
                assert_int_equal(f->seen[i].refusal, REFUSAL_TIMEOUT);
                assert_int_equal(f->seen[i].at, S(61));
                c = take(f, SHARED_SCRIPT_WITHDRAW);
                assert_string_equal(arg(c, 6), rids[i]);
        }
}

/* Its budget still running when it came back, but Redis lost it and queued it afresh (a budget counted from
 * then): a grant after its deadline is refused at the deadline, the rid withdrawn. */
static void test_resumed_waiter_granted_after_its_deadline_is_refused(void **state) {
        Fixture *f = *state;
        const char *rid = "00000000000000dd";
        int cookie;
        PoolResume resume = { .state = QUEUE_STATE_KEEPING_UP, .idle = S(1), .budget = S(60), .remote_id = rid };
        PoolTry t = {
                .cookie = &cookie, .lane = "ci", .slots = 1, .may_wait = true, .lane_budget = USEC_INFINITY,
                .client_cap = USEC_INFINITY, .arrival = S(10), .resume = &resume,
        };
        assert_int_equal(f->pool->ops->submit(f->pool, &t, S(60)), 0); /* its deadline: 70 s */
        f->clock = S(61);
        pool_shared_link_up(f->pool, "run1", S(61));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        done(f, c, reply("ok", S(61), tick_body("ok", EMPTY, 1, 0, 0, ""), EMPTY, cache(1, 1, 0, -1, "")), S(61), S(61));
        c = take(f, SHARED_SCRIPT_SUBMIT);
        done(f, c, reply("ok", S(61), decision("queued", rid, S(61), 0, "", 0, 0, EMPTY), EMPTY, cache(1, 1, 0, -1, "")),
             S(61), S(61));
        assert_int_equal(f->n_seen, 1);
        assert_int_equal(f->seen[0].verdict, POOL_VERDICT_QUEUED);
        f->clock = S(90);
        f->pool->ops->run(f->pool, S(90));
        c = take(f, SHARED_SCRIPT_TICK);
        done(f, c, reply("ok", S(90), tick_body("ok", EMPTY, 1, 0, 0, ""),
                         arr(1, decision("granted", rid, S(90), S(80), "", 0, 7, arr(1, num(0)))), cache(1, 0, 0, -1, "")),
             S(90), S(90));
        assert_int_equal(f->n_seen, 2);
        assert_int_equal(f->seen[1].verdict, POOL_VERDICT_REFUSED);
        assert_int_equal(f->seen[1].refusal, REFUSAL_TIMEOUT);
        assert_int_equal(f->seen[1].at, S(70));
        /* (The places it asked for while it was queued go first.) */
        do
                assert_true(pool_shared_take_call(f->pool, f->clock, &c));
        while (c->script == SHARED_SCRIPT_POSITIONS);
        assert_int_equal(c->script, SHARED_SCRIPT_WITHDRAW);
        assert_string_equal(arg(c, 6), rid);
}

/* A tick queued before the waiter came back is made again with it in its page. */
static void test_resumed_waiter_remakes_a_reconcile_not_sent_yet(void **state) {
        Fixture *f = *state;
        pool_shared_link_up(f->pool, "run1", S(6));
        int a;
        assert_int_equal(submit_resumed(f, &a, OLD_RID, S(1), S(6)), 0);
        assert_int_equal(f->n_seen, 0);
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        assert_true(page_lists(c, OLD_RID));
        no_call(f); /* one tick, not two */
}

/* The rid comes from a file: malformed, too long, or one in use, it is not sent; a rid of the pool's own
 * goes instead (the waiter queues afresh). */
static void test_resumed_waiter_with_a_bogus_rid_gets_a_new_one(void **state) {
        Fixture *f = *state;
        static const char *const bogus[] = {
                "00000000000000AA", "00000000000000a", "00000000000000aaa", "0000000000000:aa", "", OLD_RID,
        };
        int cookies[ELEMENTSOF(bogus) + 1];
        assert_int_equal(submit_resumed(f, &cookies[0], OLD_RID, S(1), S(5)), 0);
        for (size_t i = 0; i < ELEMENTSOF(bogus); i++)
                assert_int_equal(submit_resumed(f, &cookies[i + 1], bogus[i], S(1), S(5)), 0);
        pool_shared_link_up(f->pool, "run1", S(6));
        tick_ok(f, S(6), S(6));
        const SharedCall *c = take(f, SHARED_SCRIPT_SUBMIT);
        assert_string_equal(arg(c, 6), OLD_RID);
        for (size_t i = 0; i < ELEMENTSOF(bogus); i++) {
                c = take(f, SHARED_SCRIPT_SUBMIT);
                assert_string_not_equal(arg(c, 6), OLD_RID);
                assert_int_equal(strlen(arg(c, 6)), 16);
                assert_string_equal(arg(c, 15), "1"); /* a new rid: nothing to look up */
        }
        no_call(f);
}

/* A backend never reached: resumed waiters wait out the waiter grace, as for a link gone down, then are
 * refused; a new request that may not wait is refused at once as before. */
static void test_resumed_waiter_is_refused_after_the_grace_without_a_backend(void **state) {
        Fixture *f = *state;
        int a, other;
        assert_int_equal(submit_resumed(f, &a, OLD_RID, S(1), S(5)), 0);
        assert_int_equal(submit(f, &other, 1, false, S(5)), 0);
        assert_int_equal(f->n_seen, 1);
        assert_ptr_equal(f->seen[0].cookie, &other);
        assert_int_equal(f->pool->ops->next_wakeup(f->pool), S(5) + WAITER_GRACE);
        f->pool->ops->run(f->pool, S(5) + WAITER_GRACE - 1);
        assert_int_equal(f->n_seen, 1);
        f->pool->ops->run(f->pool, S(5) + WAITER_GRACE);
        assert_int_equal(f->n_seen, 2);
        assert_ptr_equal(f->seen[1].cookie, &a);
        assert_int_equal(f->seen[1].refusal, REFUSAL_UNAVAILABLE);
        assert_string_equal(f->seen[1].reason, "backend");
        /* Up afterwards: its submit never went, so nothing goes for it (Redis reaps the old registration's
         * waiter with its reconcile: the page does not list it). */
        pool_shared_link_up(f->pool, "run1", S(20));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        assert_false(page_lists(c, OLD_RID));
        done(f, c, reply("ok", S(20), tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, cache(0, 0, 0, -1, "")), S(20), S(20));
        no_call(f);
}

/* Before the first registration (a brokerd just started): a request that may not wait is refused at once
 * (its lane tries its next pool); one that may wait is held for the waiter grace, counted from the first
 * one held, then refused; one that comes after that grace is refused at once. */
static void test_submit_before_the_backend_is_reached(void **state) {
        Fixture *f = *state;
        int cookie, waits, late;
        assert_int_equal(submit(f, &cookie, 1, false, S(2)), 0);
        assert_int_equal(f->n_seen, 1);
        assert_int_equal(f->seen[0].verdict, POOL_VERDICT_REFUSED);
        assert_int_equal(f->seen[0].refusal, REFUSAL_UNAVAILABLE);
        assert_string_equal(f->seen[0].reason, "backend");
        no_call(f);
        PoolInfo info;
        f->pool->ops->info(f->pool, S(2), &info);
        assert_true(info.remote);
        assert_false(info.backend_up);
        assert_string_equal(info.unavailable, "backend");

        assert_int_equal(submit(f, &waits, 1, true, S(3)), 0);
        assert_int_equal(f->n_seen, 1);
        assert_int_equal(f->pool->ops->next_wakeup(f->pool), S(3) + WAITER_GRACE);
        f->pool->ops->run(f->pool, S(3) + WAITER_GRACE - 1);
        assert_int_equal(f->n_seen, 1);
        f->pool->ops->run(f->pool, S(3) + WAITER_GRACE);
        assert_int_equal(f->n_seen, 2);
        assert_ptr_equal(f->seen[1].cookie, &waits);
        assert_int_equal(f->seen[1].refusal, REFUSAL_UNAVAILABLE);
        assert_string_equal(f->seen[1].reason, "backend");
        assert_int_equal(submit(f, &late, 1, true, S(9)), 0);
        assert_int_equal(f->n_seen, 3);
        assert_ptr_equal(f->seen[2].cookie, &late);
        assert_string_equal(f->seen[2].reason, "backend");
        no_call(f);
}

/* A brokerd started while its pool's link is not up yet: a request that may wait waits for the first
 * registration and is queued in Redis like any other (a fresh rid, listed by no reconcile: Redis has no
 * record of it to drop). Once the node served, a link lost is today's rule: new requests refused at once. */
static void test_request_that_may_wait_waits_for_the_first_registration(void **state) {
        Fixture *f = *state;
        int a, b, c2;
        assert_int_equal(submit(f, &a, 1, true, S(1)), 0);
        assert_int_equal(f->n_seen, 0);
        no_call(f);
        pool_shared_link_up(f->pool, "run1", S(2));
        assert_int_equal(submit(f, &b, 1, true, S(2)), 0); /* registering: held too */
        assert_int_equal(f->n_seen, 0);
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        no_call(f);
        done(f, c, reply("ok", S(2), tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, cache(0, 0, 0, -1, "")), S(2), S(2));
        c = take(f, SHARED_SCRIPT_SUBMIT);
        char rid[17];
        snprintf(rid, sizeof rid, "%s", arg(c, 6));
        done(f, c, reply("ok", S(2), decision("granted", rid, S(2), 0, "", 0, 7, arr(1, num(0))), EMPTY,
                         cache(1, 0, 0, -1, "")), S(2), S(2));
        assert_int_equal(f->seen[0].verdict, POOL_VERDICT_GRANTED);
        assert_ptr_equal(f->seen[0].cookie, &a);
        c = take(f, SHARED_SCRIPT_SUBMIT);
        snprintf(rid, sizeof rid, "%s", arg(c, 6));
        done(f, c, reply("ok", S(2), decision("queued", rid, S(2), 0, "", 0, 0, EMPTY), EMPTY,
                         cache(1, 1, 0, -1, "")), S(2), S(2));
        assert_int_equal(f->seen[1].verdict, POOL_VERDICT_QUEUED);
        assert_ptr_equal(f->seen[1].cookie, &b);
        /* No grace runs out once the pool served: the waiter is not refused later for the start's sake. */
        f->pool->ops->run(f->pool, S(1) + WAITER_GRACE);
        assert_int_equal(f->n_seen, 2);
        /* The link lost later: new requests are refused at once, as before. */
        pool_shared_link_down(f->pool, S(7));
        pool_shared_link_up(f->pool, "run1", S(8));
        assert_int_equal(submit(f, &c2, 1, true, S(8)), 0);
        assert_int_equal(f->n_seen, 3);
        assert_ptr_equal(f->seen[2].cookie, &c2);
        assert_int_equal(f->seen[2].verdict, POOL_VERDICT_REFUSED);
        assert_string_equal(f->seen[2].reason, "backend");
}

static void test_submit_checks_lane_and_size_itself(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookie;
        PoolTry t = { .cookie = &cookie, .lane = "nightly", .slots = 1, .lane_budget = USEC_INFINITY,
                      .client_cap = USEC_INFINITY };
        assert_int_equal(f->pool->ops->submit(f->pool, &t, S(1)), -EINVAL);
        assert_int_equal(submit(f, &cookie, 3, true, S(1)), -EINVAL);
        no_call(f);
}

static void test_registering_tick_carries_name_canon_and_floor(void **state) {
        Fixture *f = *state;
        f->pool->ops->set_token_floor(f->pool, 42);
        pool_shared_link_up(f->pool, "run1", S(1));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(c, 3), "-");   /* production: Redis's clock */
        assert_string_equal(arg(c, 4), "run1");
        assert_string_equal(arg(c, 5), "1");   /* its own instant */
        assert_string_equal(arg(c, 6), "runner-1");
        assert_string_equal(arg(c, 7), "backend-node-ttl=30000000\nlane.ci.max-in-use=-1\nlane.ci.priority=0\n"
                                       "lane.ci.reserve=0\nlimit=2\n");
        assert_string_equal(arg(c, 8), "0");
        assert_string_equal(arg(c, 11), "42");
        assert_int_equal(strlen(arg(c, 12)), 16);
        /* A whole reconcile: what Redis holds of this node id and no process knows (a brokerd killed and
         * started again) goes at once. */
        assert_string_equal(arg(c, 13), "1");   /* nothing to reclaim */
        assert_string_equal(arg(c, 14), "-");
        assert_string_equal(arg(c, 15), "+");
        assert_int_equal(c->argc, 16);
        /* Nothing but the tick goes before the node is registered: a request that may wait waits for it,
         * one that may not is refused. */
        int cookie, now_or_never;
        assert_int_equal(submit(f, &cookie, 1, true, S(1)), 0);
        assert_int_equal(submit(f, &now_or_never, 1, false, S(1)), 0);
        assert_int_equal(f->n_seen, 1);
        assert_ptr_equal(f->seen[0].cookie, &now_or_never);
        assert_int_equal(f->seen[0].verdict, POOL_VERDICT_REFUSED);
        no_call(f);
        done(f, c, reply("ok", 5000000, tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, cache(0, 0, 0, -1, "")),
             S(1), S(1));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_UP);
        c = take(f, SHARED_SCRIPT_SUBMIT);
        assert_string_equal(arg(c, 9), "1"); /* may wait */
        done(f, c, reply("ok", 5000000, decision("queued", arg(c, 6), 5000000, 0, "", 0, 0, EMPTY), EMPTY,
                         cache(0, 1, 0, -1, "")), S(1), S(1));
        assert_int_equal(f->seen[1].verdict, POOL_VERDICT_QUEUED);
        assert_ptr_equal(f->seen[1].cookie, &cookie);
        assert_string_equal(pool_shared_stream_resume_id(f->pool), "0-0");
        assert_string_equal(pool_shared_stream_key(f->pool), "{sb:grid}:s:" NODE);
        /* The floor goes with every tick (SPEC §11, "Tokens never go back"): a Redis that lost the pool
         * meets it within the recovery window, whenever that comes. */
        f->pool->ops->run(f->pool, S(2));
        c = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(c, 11), "42");
}

/* Every tick carries one above the highest token the node passed on: its grants and restored leases,
 * and the floor the daemon set (the lease log's mark). A lower floor set later lowers nothing; a token
 * beyond 2^53 (not Redis's to give) is not followed. */
static void test_every_tick_carries_the_highest_token_passed_on(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        f->pool->ops->run(f->pool, S(2));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(c, 11), "-"); /* nothing passed on yet */
        done(f, c, reply("ok", 2000000, tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, cache(0, 0, 0, -1, "")),
             S(2), S(2));

        int cookie, other;
        char rid[17];
        granted(f, &cookie, S(3), rid); /* token 7 */
        f->pool->ops->release(f->pool, f->seen[f->n_seen - 1].grant, S(3));
        done(f, take(f, SHARED_SCRIPT_RELEASE), reply("ok", 3000000, arr(1, str("released")), EMPTY,
                                                       cache(0, 0, 0, -1, "")), S(3), S(3));
        f->pool->ops->set_token_floor(f->pool, 5); /* below: changes nothing */
        for (int i = 0; i < 2; i++) { /* and not only once */
                f->pool->ops->run(f->pool, S(5 + i * 5));
                c = take(f, SHARED_SCRIPT_TICK);
                assert_string_equal(arg(c, 11), "8");
                done(f, c, reply("ok", 5000000 + i * 5000000, tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY,
                                 cache(0, 0, 0, -1, "")), S(5 + i * 5), S(5 + i * 5));
        }

        assert_int_equal(submit(f, &other, 1, true, S(11)), 0);
        c = take(f, SHARED_SCRIPT_SUBMIT);
        snprintf(rid, sizeof rid, "%s", arg(c, 6));
        /* A token out of range is not a grant (untrusted input: the request is refused and withdrawn), and
         * not followed by the floor either. */
        done(f, c, reply("ok", 11000000, decision("granted", rid, 11000000, 0, "", 0, INT64_C(1) << 60, arr(1, num(0))),
                         EMPTY, cache(1, 0, 0, -1, "")), S(11), S(11));
        c = take(f, SHARED_SCRIPT_WITHDRAW);
        assert_string_equal(arg(c, 6), rid);
        done(f, c, reply("ok", 11000000, arr(1, str("withdrawn")), EMPTY, cache(0, 0, 0, -1, "")), S(11), S(11));
        f->pool->ops->run(f->pool, S(16));
        c = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(c, 11), "8");
}

static void test_submit_granted_at_once(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookie;
        assert_int_equal(submit(f, &cookie, 1, false, S(1)), 0);
        assert_int_equal(f->n_seen, 0);
        const SharedCall *c = take(f, SHARED_SCRIPT_SUBMIT);
        assert_int_equal(c->argc, 17);
        assert_string_equal(arg(c, 7), "ci");
        assert_string_equal(arg(c, 8), "1");
        assert_string_equal(arg(c, 9), "0");
        assert_string_equal(arg(c, 11), "-1");
        assert_string_equal(arg(c, 12), "-1");
        assert_string_equal(arg(c, 14), ""); /* any slot */
        assert_string_equal(arg(c, 15), "1"); /* its first sending */
        char rid[17];
        snprintf(rid, sizeof rid, "%s", arg(c, 6));
        assert_int_equal(strlen(rid), 16);
        char hash[16]; /* the lease's fingerprint hash (fnv1a32() above) */
        snprintf(hash, sizeof hash, "%" PRIu32, fnv1a32(rid, 'l'));
        assert_string_equal(arg(c, 16), hash);
        done(f, c, reply("ok", 9000000, decision("granted", rid, 9000000, 0, "", 0, 1700000000000000, arr(1, num(1))),
                         EMPTY, cache(1, 0, 0, -1, "")), S(1), S(1));
        assert_int_equal(f->n_seen, 1);
        assert_int_equal(f->seen[0].verdict, POOL_VERDICT_GRANTED);
        assert_ptr_equal(f->seen[0].cookie, &cookie);
        assert_int_equal(f->seen[0].token, 1700000000000000);
        assert_int_equal(f->seen[0].n_slots, 1);
        assert_int_equal(f->seen[0].slot0, 1);
        assert_true(f->seen[0].has_wait);
        char remote[64];
        snprintf(remote, sizeof remote, NODE ":%s", rid);
        assert_string_equal(f->seen[0].remote_id, remote);
        PoolInfo info;
        f->pool->ops->info(f->pool, S(1), &info);
        assert_int_equal(info.in_use, 1);
        assert_int_equal(info.waiting, 0);
        assert_true(info.backend_up);
        assert_null(info.unavailable);
        /* release: token and rid */
        f->pool->ops->release(f->pool, f->seen[0].grant, S(2));
        c = take(f, SHARED_SCRIPT_RELEASE);
        assert_string_equal(arg(c, 6), "1700000000000000");
        assert_string_equal(arg(c, 7), rid);
        done(f, c, reply("ok", 9500000, arr(1, str("released")), EMPTY, cache(0, 0, 0, -1, "")), S(2), S(2));
        f->pool->ops->info(f->pool, S(2), &info);
        assert_int_equal(info.in_use, 0);
}

static void test_queued_then_granted_through_the_stream_once(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookie;
        char rid[17];
        queued(f, &cookie, S(1), rid);
        size_t queued_at;
        size_t pos = f->pool->ops->position(f->pool, f->seen[0].waiter, &queued_at);
        assert_int_equal(pos, 3);
        assert_int_equal(queued_at, 4);
        PoolInfo info;
        f->pool->ops->info(f->pool, S(1), &info);
        assert_int_equal(info.waiting, 1);

        RespValue fields = arr(28, str("verdict"), str("granted"), str("rid"), str(rid), str("at"), str("1500000"),
                               str("wait"), str("250000"), str("refusal"), str(""), str("reason"), str(""),
                               str("state"), str("none"), str("idle"), str("0"), str("budget"), str("-1"),
                               str("position"), str("0"), str("queued"), str("0"), str("token"), str("9"),
                               str("slots"), str("1"), str("members"), str(""));
        pool_shared_stream_entry(f->pool, "1-1", &fields, S(2));
        assert_int_equal(f->n_seen, 2);
        assert_int_equal(f->seen[1].verdict, POOL_VERDICT_GRANTED);
        assert_int_equal(f->seen[1].token, 9);
        assert_int_equal(f->seen[1].n_slots, 1);
        assert_int_equal(f->seen[1].slot0, 1);
        assert_int_equal(f->seen[1].wait, 250000);
        assert_string_equal(pool_shared_stream_resume_id(f->pool), "1-1");
        /* The same decision again (the reply's copy, or a re-read): nothing. */
        pool_shared_stream_entry(f->pool, "1-2", &fields, S(2));
        assert_int_equal(f->n_seen, 2);
        no_call(f);
}

/* The stream's copy of this node's own grant read after the lease ended (the reply came first and its holder
 * went at once): a copy of a decision applied already, not input to count as bad (a BACKEND_BAD_INPUT warning),
 * nor a grant to release again. */
static void test_grant_copy_read_after_its_release_is_no_bad_input(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookie;
        char rid[17];
        queued(f, &cookie, S(1), rid);
        RespValue fields = granted_entry(rid, "9", "1", "");
        pool_shared_stream_entry(f->pool, "1-1", &fields, S(2));
        assert_int_equal(f->n_seen, 2);
        assert_int_equal(f->seen[1].verdict, POOL_VERDICT_GRANTED);
        f->pool->ops->release(f->pool, f->seen[1].grant, S(2));
        const SharedCall *c = take(f, SHARED_SCRIPT_RELEASE);
        assert_string_equal(arg(c, 6), "9");
        done(f, c, reply("ok", 2, arr(1, str("released")), EMPTY, cache(0, 0, 0, -1, "")), S(2), S(2));
        pool_shared_stream_entry(f->pool, "1-2", &fields, S(2));
        assert_int_equal(f->n_seen, 2);
        PoolInfo info;
        f->pool->ops->info(f->pool, S(2), &info);
        assert_int_equal(info.bad_input, 0);
        no_call(f);
}

/* A request queued (rid) and withdrawn, its withdraw taken; then held: answered with an error reply (parked
 * until the next heartbeat). Then its grant, made before the withdraw reached Redis, read from the stream
 * (token 11): released. */
static void withdrawn_then_granted(Fixture *f, bool held, char rid[static 17]) {
        bring_up(f, S(1));
        int cookie;
        queued(f, &cookie, S(1), rid);
        f->pool->ops->withdraw(f->pool, f->seen[0].waiter, S(2));
        const SharedCall *c = take(f, SHARED_SCRIPT_WITHDRAW);
        assert_string_equal(arg(c, 6), rid);
        if (held)
                done(f, c, (RespValue) { .type = RESP_ERROR, .str = "OOM", .len = 3 }, S(2), S(2));
        RespValue fields = arr(8, str("verdict"), str("granted"), str("rid"), str(rid), str("token"), str("11"),
                               str("slots"), str("1"));
        pool_shared_stream_entry(f->pool, "2-1", &fields, S(2));
        assert_int_equal(f->n_seen, 1);
        if (!held)
                done(f, c, reply("ok", 1, arr(1, str("released")), EMPTY, cache(0, 0, 0, -1, "")), S(2), S(2));
}

static void test_grant_for_a_withdrawn_rid_is_released(void **state) {
        Fixture *f = *state;
        char rid[17];
        withdrawn_then_granted(f, false, rid);
        const SharedCall *c = take(f, SHARED_SCRIPT_RELEASE);
        assert_string_equal(arg(c, 6), "11");
        assert_string_equal(arg(c, 7), rid);
}

/* Calls of one rid reach Redis in the order they were queued, whatever holds the earlier one: a withdraw
 * parked after an error reply (sent again after the next heartbeat) is not passed by the release of a grant
 * read for its rid meanwhile. */
static void test_a_call_waits_for_an_earlier_held_one_of_its_rid(void **state) {
        Fixture *f = *state;
        char rid[17];
        withdrawn_then_granted(f, true, rid);
        no_call(f);
        f->pool->ops->run(f->pool, S(3));
        tick_ok(f, S(3), S(3));
        assert_string_equal(arg(take(f, SHARED_SCRIPT_WITHDRAW), 6), rid);
        const SharedCall *c = take(f, SHARED_SCRIPT_RELEASE);
        assert_string_equal(arg(c, 6), "11");
        assert_string_equal(arg(c, 7), rid);
        no_call(f);
}

static void test_grant_read_after_the_vouch_deadline_is_released_not_handed_out(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1)); /* the heartbeat sent at boot time 1 s is acknowledged */
        int cookie;
        char rid[17];
        queued(f, &cookie, S(1), rid);
        /* brokerd stopped for longer than the TTL: Redis granted to our waiter, then dropped the node and
         * gave the slot to another. The grant's stream entry is read only after the resume. */
        usec_t V = S(1) + TTL - (REVOKE_GRACE + S(2));
        pool_shared_fence_check(f->pool, V - 1, S(2));
        assert_int_equal(f->n_seen, 1);
        pool_shared_fence_check(f->pool, V, S(40));
        assert_int_equal(f->n_seen, 2);
        assert_int_equal(f->seen[1].verdict, POOL_VERDICT_REFUSED);
        assert_int_equal(f->seen[1].refusal, REFUSAL_UNAVAILABLE);
        assert_ptr_equal(f->seen[1].cookie, &cookie);
        assert_string_equal(f->seen[1].reason, "backend");
        RespValue fields = arr(8, str("verdict"), str("granted"), str("rid"), str(rid), str("token"), str("11"),
                               str("slots"), str("1"));
        pool_shared_stream_entry(f->pool, "3-1", &fields, S(40));
        assert_int_equal(f->n_seen, 2);
        const SharedCall *c = take(f, SHARED_SCRIPT_WITHDRAW);
        assert_string_equal(arg(c, 6), rid);
        done(f, c, reply("ok", 1, arr(1, str("gone")), EMPTY, cache(0, 0, 0, -1, "")), S(40), S(40));
        c = take(f, SHARED_SCRIPT_RELEASE);
        assert_string_equal(arg(c, 6), "11");
        assert_string_equal(arg(c, 7), rid);
        /* Once per silence: a request made since is Redis's to decide. */
        int again;
        assert_int_equal(submit(f, &again, 1, true, S(41)), 0);
        pool_shared_fence_check(f->pool, V + S(1), S(41));
        assert_int_equal(f->n_seen, 2);
}

static void test_cancel_try_before_the_answer(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int a, b;
        /* Not yet sent: dropped, nothing goes to Redis. */
        assert_int_equal(submit(f, &a, 1, true, S(1)), 0);
        f->pool->ops->cancel_try(f->pool, &a, S(1));
        no_call(f);
        /* Sent: withdrawn after it (same connection, so after the submit), and its answer is not emitted. */
        assert_int_equal(submit(f, &b, 1, true, S(1)), 0);
        const SharedCall *c = take(f, SHARED_SCRIPT_SUBMIT);
        char rid[17];
        snprintf(rid, sizeof rid, "%s", arg(c, 6));
        f->pool->ops->cancel_try(f->pool, &b, S(1));
        const SharedCall *w = take(f, SHARED_SCRIPT_WITHDRAW);
        assert_string_equal(arg(w, 6), rid);
        done(f, c, reply("ok", 1, decision("granted", rid, 1, 0, "", 0, 5, arr(1, num(0))), EMPTY,
                         cache(1, 0, 0, -1, "")),
             S(1), S(1));
        assert_int_equal(f->n_seen, 0);
        PoolInfo info;
        f->pool->ops->info(f->pool, S(1), &info);
        assert_int_equal(info.in_use, 0);
        assert_int_equal(info.waiting, 0);
}

/* The pool up at 1 s, a request made (cookie) and its submit taken (its rid). */
static const SharedCall *submit_taken(Fixture *f, int *cookie, char rid[static 17]) {
        bring_up(f, S(1));
        assert_int_equal(submit(f, cookie, 1, true, S(1)), 0);
        const SharedCall *c = take(f, SHARED_SCRIPT_SUBMIT);
        snprintf(rid, 17, "%s", arg(c, 6));
        return c;
}

static void test_lost_reply_is_retried_with_the_same_rid(void **state) {
        Fixture *f = *state;
        int cookie;
        char rid[17];
        const SharedCall *c = submit_taken(f, &cookie, rid);
        uint64_t id = c->id;
        pool_shared_call_done(f->pool, id, -ETIMEDOUT, NULL, S(1), S(2));
        pool_shared_link_down(f->pool, S(2));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_DOWN);
        no_call(f);
        assert_int_equal(f->n_seen, 0);
        pool_shared_link_up(f->pool, "run1", S(3));
        /* The tick first (it registers again if needed), then the very same submit. */
        tick_ok(f, S(3), S(3));
        c = take(f, SHARED_SCRIPT_SUBMIT);
        assert_string_equal(arg(c, 6), rid);
        done(f, c, reply("ok", 1, decision("granted", rid, 1, 0, "", 0, 5, arr(1, num(0))), EMPTY,
                         cache(1, 0, 0, -1, "")),
             S(3), S(3));
        assert_int_equal(f->n_seen, 1);
        assert_int_equal(f->seen[0].verdict, POOL_VERDICT_GRANTED);
        no_call(f);
}

static void test_settling_sends_the_same_call_again(void **state) {
        Fixture *f = *state;
        int cookie;
        char rid[17];
        const SharedCall *c = submit_taken(f, &cookie, rid);
        uint64_t id = c->id;
        done(f, c, reply("settling", 1, EMPTY, EMPTY, cache(2, 100, 0, 0, "")), S(1), S(1));
        assert_int_equal(f->n_seen, 0);
        c = take(f, SHARED_SCRIPT_SUBMIT);
        assert_int_equal(c->id, id);
        assert_string_equal(arg(c, 6), rid);
}

/* A server that answers "settling" for ever does not keep the pool calling a round trip after another:
 * SHARED_SETTLING_MAX answers in a row are followed at once; then the call is held, counted as bad input, and
 * no tick goes until a heartbeat later (the cache's next_wakeup, in the past, asks for one at once); the
 * heartbeat's answer lets the call go again. */
static void test_settling_for_ever_waits_for_a_heartbeat(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookie;
        assert_int_equal(submit(f, &cookie, 1, true, S(1)), 0);
        uint64_t id = 0;
        for (unsigned i = 0; i < SHARED_SETTLING_MAX; i++) {
                const SharedCall *c = take(f, SHARED_SCRIPT_SUBMIT);
                if (i == 0)
                        id = c->id;
                assert_int_equal(c->id, id);
                assert_int_equal(bad_inputs(f), 0);
                done(f, c, reply("settling", 1, EMPTY, EMPTY, cache(2, 100, 0, 0, "")), S(1), S(1));
        }
        assert_int_equal(bad_inputs(f), 1);
        assert_int_equal(f->n_seen, 0);
        no_call(f);
        assert_true(f->pool->ops->next_wakeup(f->pool) >= S(2));
        f->pool->ops->run(f->pool, S(2) - 1);
        no_call(f);
        f->pool->ops->run(f->pool, S(2));
        tick_ok(f, S(2), S(2));
        const SharedCall *c = take(f, SHARED_SCRIPT_SUBMIT);
        assert_int_equal(c->id, id);
        /* Answered "settling" again: followed at once, a new run of SHARED_SETTLING_MAX. */
        done(f, c, reply("settling", 1, EMPTY, EMPTY, cache(2, 100, 0, -1, "")), S(2), S(2));
        assert_int_equal(take(f, SHARED_SCRIPT_SUBMIT)->id, id);
        assert_int_equal(bad_inputs(f), 1);
}

/* A request given up while its submit waits to go again (answered "settling": nothing of it done) never has
 * that submit overtaken by its own withdraw: sent after the withdraw, it would queue a waiter for a rid this
 * node forgot, holding a place in the queue of every node until a reconcile drops it. The submit is dropped
 * instead, and the withdraw goes alone (an earlier send of the submit may have run). held: given up while the
 * submit waits for a heartbeat after SHARED_SETTLING_MAX answers in a row (the withdraw would not); else
 * while it is out: its withdraw goes behind it on the link, and may run (settling what the submit's budget did
 * not) while the submit is answered "settling". */
static void submit_given_up_while_settling(Fixture *f, bool held) {
        int cookie;
        char rid[17];
        const SharedCall *c = submit_taken(f, &cookie, rid);
        for (unsigned i = 0; held && i < SHARED_SETTLING_MAX; i++) {
                if (i > 0)
                        c = take(f, SHARED_SCRIPT_SUBMIT);
                done(f, c, reply("settling", 1, EMPTY, EMPTY, cache(2, 100, 0, 0, "")), S(1), S(1));
        }
        no_call(f);
        f->pool->ops->cancel_try(f->pool, &cookie, S(1));
        const SharedCall *w = take(f, SHARED_SCRIPT_WITHDRAW);
        assert_string_equal(arg(w, 6), rid);
        if (!held)
                done(f, c, reply("settling", 1, EMPTY, EMPTY, cache(2, 100, 0, 0, "")), S(1), S(1));
        done(f, w, reply("ok", 1, arr(1, str("gone")), EMPTY, cache(0, 0, 0, -1, "")), S(1), S(1));
        no_call(f);
        f->pool->ops->run(f->pool, S(2));
        tick_ok(f, S(2), S(2));
        no_call(f);
        assert_int_equal(f->n_seen, 0);
}

static void test_withdraw_drops_a_submit_held_after_settling(void **state) {
        submit_given_up_while_settling(*state, true);
}

static void test_submit_answered_settling_after_its_withdraw_went_is_dropped(void **state) {
        submit_given_up_while_settling(*state, false);
}

static void test_waiters_are_kept_for_the_grace_then_refused(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookie;
        char rid[17];
        queued(f, &cookie, S(1), rid);
        pool_shared_link_down(f->pool, S(10));
        SharedNotice n;
        assert_true(pool_shared_pop_notice(f->pool, &n));
        assert_int_equal(n.type, SHARED_NOTICE_BACKEND_LOST);
        shared_notice_done(&n);
        assert_int_equal(f->pool->ops->next_wakeup(f->pool), S(10) + WAITER_GRACE);
        /* A new request is refused at once, so that its lane tries its next pool. */
        int other;
        assert_int_equal(submit(f, &other, 1, true, S(11)), 0);
        assert_int_equal(f->n_seen, 2);
        assert_int_equal(f->seen[1].refusal, REFUSAL_UNAVAILABLE);
        assert_string_equal(f->seen[1].reason, "backend");

        f->pool->ops->run(f->pool, S(10) + WAITER_GRACE - 1);
        assert_int_equal(f->n_seen, 2);
        f->pool->ops->run(f->pool, S(10) + WAITER_GRACE);
        assert_int_equal(f->n_seen, 3);
        assert_int_equal(f->seen[2].verdict, POOL_VERDICT_REFUSED);
        assert_ptr_equal(f->seen[2].cookie, &cookie);
        assert_string_equal(f->seen[2].reason, "backend");
        assert_int_equal(f->pool->ops->next_wakeup(f->pool), USEC_INFINITY);
        /* Redis is told once it can be: the registering tick, then the withdraw. */
        pool_shared_link_up(f->pool, "run1", S(20));
        assert_true(pool_shared_pop_notice(f->pool, &n));
        assert_int_equal(n.type, SHARED_NOTICE_BACKEND_REGAINED);
        shared_notice_done(&n);
        tick_ok(f, S(20), S(20));
        const SharedCall *c = take(f, SHARED_SCRIPT_WITHDRAW);
        assert_string_equal(arg(c, 6), rid);
}

static void test_fence_deadline_from_the_last_acknowledged_heartbeat(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        assert_int_equal(pool_shared_fence_deadline(f->pool), USEC_INFINITY); /* no lease */
        int cookie;
        char rid[17];
        granted(f, &cookie, S(1), rid);
        f->pool->ops->bind_grant(f->pool, f->seen[0].grant, &cookie);
        usec_t boot = S(1000);
        f->pool->ops->run(f->pool, S(2));
        tick_ok(f, boot, S(2));
        usec_t F = boot + TTL - (REVOKE_GRACE + S(2));
        assert_int_equal(pool_shared_fence_deadline(f->pool), F);
        pool_shared_link_down(f->pool, S(3));
        pool_shared_fence_check(f->pool, F - 1, S(4));
        assert_int_equal(f->n_seen, 1);
        pool_shared_fence_check(f->pool, F, S(5));
        assert_int_equal(f->n_seen, 2);
        assert_int_equal(f->seen[1].verdict, POOL_VERDICT_LOST);
        assert_ptr_equal(f->seen[1].cookie, &cookie);
        assert_string_equal(f->seen[1].reason, "fenced");
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_FENCED);
        assert_int_equal(pool_shared_fence_deadline(f->pool), USEC_INFINITY);
        pool_shared_fence_check(f->pool, F + S(1), S(6));
        assert_int_equal(f->n_seen, 2);
        /* The slots stay held here until the engine releases; then Redis is told (idempotent). */
        PoolInfo info;
        f->pool->ops->info(f->pool, S(6), &info);
        assert_int_equal(info.in_use, 1);
        f->pool->ops->release(f->pool, f->seen[0].grant, S(7));
        pool_shared_link_up(f->pool, "run1", S(8));
        tick_ok(f, S(8), S(8));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_UP);
        const SharedCall *c = take(f, SHARED_SCRIPT_RELEASE);
        assert_string_equal(arg(c, 7), rid);
}

/* backend-node-ttl= changed by reload (issue 19 c): a rule (a tick with the new canon goes out at once), and
 * the self-fence counts with the shorter of the two TTLs until Redis agreed to the new rules. */
static void test_node_ttl_by_reload_fences_on_the_shorter_until_agreed(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookie;
        char rid[17];
        granted(f, &cookie, S(1), rid);
        f->pool->ops->bind_grant(f->pool, f->seen[0].grant, &cookie);
        f->pool->ops->run(f->pool, S(2));
        tick_ok(f, S(1000), S(2));
        usec_t margin = REVOKE_GRACE + S(2);
        assert_int_equal(pool_shared_fence_deadline(f->pool), S(1000) + TTL - margin);

        PoolLaneRule rules[] = { { .lane = "ci", .priority = 0, .max_in_use = -1 } };
        PoolConfig shorter = { .name = (char *) "grid", .limit = 2, .max_queue = -1, .backend_node_ttl = S(20) };
        assert_int_equal(pool_configure(f->pool, &shorter, rules, 1, S(3)), 0);
        assert_int_equal(pool_shared_fence_deadline(f->pool), S(1000) + S(20) - margin); /* at once */
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        assert_non_null(strstr(arg(c, 7), "backend-node-ttl=20000000\n"));
        done(f, c, reply("ok", S(3), tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, cache(1, 0, 0, -1, "")), S(1003),
             S(3));
        assert_int_equal(pool_shared_fence_deadline(f->pool), S(1003) + S(20) - margin);

        /* Longer: the old, shorter TTL holds until Redis agreed (it drops this node by the stored rules). */
        PoolConfig longer = { .name = (char *) "grid", .limit = 2, .max_queue = -1, .backend_node_ttl = S(60) };
        assert_int_equal(pool_configure(f->pool, &longer, rules, 1, S(4)), 0);
        c = take(f, SHARED_SCRIPT_TICK);
        done(f, c, reply("rules", S(4), tick_body("rules", arr(1, str("backend-node-ttl")), 0, 0, 0, ""), EMPTY,
                         cache(1, 0, 0, -1, "")), S(1004), S(4));
        assert_int_equal(pool_shared_fence_deadline(f->pool), S(1004) + S(20) - margin);
        f->pool->ops->run(f->pool, S(5));
        c = take(f, SHARED_SCRIPT_TICK);
        done(f, c, reply("ok", S(5), tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, cache(1, 0, 0, -1, "")), S(1005),
             S(5));
        assert_int_equal(pool_shared_fence_deadline(f->pool), S(1005) + S(60) - margin);
}

/* Liveness per node: the renewal period is TTL/4 (7.5 s at the defaults; TTL/6 before, 5 s), no longer than
 * a third of the self-fence's window (TTL − revoke grace − 2 s: three renewals go out before the fence, so
 * one lost, and its retry, leave a third), between 1 s and SHARED_RENEW_PERIOD_MAX; and a covering renewal
 * moves the fence to its send time + that window. */
static void test_renew_period_is_a_quarter_of_the_ttl_within_a_third_of_the_fence_window(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1000));
        assert_int_equal(pool_shared_renew_period(f->pool), S(30) / 4); /* grace 5 s: window 23 s */
        for (usec_t grace = 0; grace <= S(30); grace += MS(500)) {
                pool_shared_set_revoke_grace(f->pool, grace);
                usec_t period = pool_shared_renew_period(f->pool);
                usec_t window = TTL > grace + SHARED_FENCE_SLACK ? TTL - grace - SHARED_FENCE_SLACK : 0;
                assert_true(period >= SHARED_RENEW_PERIOD_MIN && period <= SHARED_RENEW_PERIOD_MAX);
                assert_true(period <= TTL / 4);
                if (window >= 3 * SHARED_RENEW_PERIOD_MIN)
                        assert_true(3 * period <= window);
                else
                        assert_int_equal(period, SHARED_RENEW_PERIOD_MIN);
        }
        pool_shared_set_revoke_grace(f->pool, REVOKE_GRACE);
        /* A lease, then a renewal that covers the pool, sent at boot 2000 s: the fence counts from its send. */
        int cookie;
        char rid[17];
        granted(f, &cookie, S(1001), rid);
        pool_shared_renewed(f->pool, true, false, S(2000), pool_shared_renew_period(f->pool), S(1002));
        assert_int_equal(pool_shared_fence_deadline(f->pool), S(2000) + TTL - REVOKE_GRACE - SHARED_FENCE_SLACK);
}

/* A covered renewal at t, and the pool run then. */
static void renewed_at(Fixture *f, usec_t t) {
        pool_shared_renewed(f->pool, true, false, t, pool_shared_idle_renew_period(f->pool), t);
        f->pool->ops->run(f->pool, t);
}

/* A reload that changes the rules of a pool that the renewal covers (it ticks only every SHARED_IDLE_PERIOD
 * then) sends them at once; also when their call could not be made as the reload applied (out of memory: the
 * reload applies all the same, it cannot fail by then): at the pool's next run, not an idle period later. */
static void test_rules_a_reload_could_not_send_go_at_the_next_run(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1000));
        renewed_at(f, S(1001));
        no_call(f);
        PoolLaneRule rules[] = { { .lane = "ci", .priority = 0, .max_in_use = -1 } };
        PoolConfig wider = { .name = (char *) "grid", .limit = 3, .max_queue = -1 };
        PoolStaged *staged;
        assert_int_equal(f->pool->ops->configure_prepare(f->pool, &wider, rules, 1, NULL, S(1002), &staged), 0);
        calloc_fails = true;
        f->pool->ops->configure_commit(f->pool, staged, S(1002));
        calloc_fails = false;
        no_call(f);
        renewed_at(f, S(1002));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        assert_non_null(strstr(arg(c, 7), "limit=3\n"));
}

/* A renewal's full read brings the node hash's fingerprint (brokerd/lua/renew.lua): equal to the pool's own
 * (nothing held: 0, 0, 0), it stands for the idle tick's compare, so a covered pool that holds nothing ticks
 * SHARED_IDLE_PERIOD after that compare, not after its last tick; different, or not a number, it ticks at
 * once (whose own fingerprint decides). */
static void test_a_renewals_agreeing_fingerprint_stands_for_the_idle_tick(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1000)); /* its last tick */
        usec_t agreed = S(1000) + S(60);
        pool_shared_renewal_fingerprint(f->pool, 0, 0, 0, agreed);
        renewed_at(f, agreed);
        no_call(f);
        /* SHARED_IDLE_PERIOD after the last tick: no tick (the parent ticked here). */
        renewed_at(f, S(1000) + SHARED_IDLE_PERIOD + S(1));
        no_call(f);
        /* SHARED_IDLE_PERIOD after the compare: the idle tick. */
        usec_t t = agreed + SHARED_IDLE_PERIOD + S(1);
        renewed_at(f, t);
        tick_ok(f, t, t);
        /* A fingerprint that differs, or is garbage (-1), has the pool tick at once. */
        t += S(60);
        pool_shared_renewal_fingerprint(f->pool, 1, 2, 3, t);
        renewed_at(f, t);
        tick_ok(f, t, t);
        t += S(60);
        pool_shared_renewal_fingerprint(f->pool, -1, -1, -1, t);
        renewed_at(f, t);
        tick_ok(f, t, t);
        t += S(60);
        pool_shared_renewal_fingerprint(f->pool, 0, 0, 0, t);
        renewed_at(f, t);
        no_call(f);
}

/* A node that holds nothing renews every TTL/2 (15 s at the defaults), never faster than the busy period nor
 * slower than SHARED_IDLE_RENEW_PERIOD_MAX; it holds something from a request's submit (out or waiting)
 * while the lease is held (the self-fence's to guard), and nothing again once it is released. */
static void test_a_pool_that_holds_nothing_renews_every_half_ttl(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1000));
        assert_true(pool_shared_holds_nothing(f->pool));
        assert_int_equal(pool_shared_idle_renew_period(f->pool), S(15));
        for (usec_t grace = 0; grace <= S(30); grace += MS(500)) {
                pool_shared_set_revoke_grace(f->pool, grace);
                usec_t idle = pool_shared_idle_renew_period(f->pool);
                assert_true(idle >= pool_shared_renew_period(f->pool));
                assert_true(idle <= SHARED_IDLE_RENEW_PERIOD_MAX && 2 * idle <= TTL);
        }
        pool_shared_set_revoke_grace(f->pool, REVOKE_GRACE);
        int cookie;
        assert_int_equal(submit(f, &cookie, 1, true, S(1001)), 0);
        assert_false(pool_shared_holds_nothing(f->pool)); /* out */
        const SharedCall *c = take(f, SHARED_SCRIPT_SUBMIT);
        char rid[17];
        snprintf(rid, sizeof rid, "%s", arg(c, 6));
        done(f, c, reply("ok", S(1001), decision("queued", rid, S(1001), 0, "", 3, 0, EMPTY), EMPTY,
                         cache(2, 4, 0, -1, "")), S(1001), S(1001));
        assert_false(pool_shared_holds_nothing(f->pool)); /* waiting */
        RespValue fields = granted_entry(rid, "9", "1", "");
        pool_shared_stream_entry(f->pool, "1-1", &fields, S(1002));
        assert_int_equal(f->seen[f->n_seen - 1].verdict, POOL_VERDICT_GRANTED);
        assert_false(pool_shared_holds_nothing(f->pool)); /* held */
        f->pool->ops->release(f->pool, f->seen[f->n_seen - 1].grant, S(1003));
        assert_true(pool_shared_holds_nothing(f->pool));
}

/* revoke-grace= changed by reload: the self-fence margin follows at once (issue 19 c). */
static void test_revoke_grace_by_reload_moves_the_fence(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookie;
        char rid[17];
        granted(f, &cookie, S(1), rid);
        f->pool->ops->bind_grant(f->pool, f->seen[0].grant, &cookie);
        f->pool->ops->run(f->pool, S(2));
        tick_ok(f, S(1000), S(2));
        assert_int_equal(pool_shared_fence_deadline(f->pool), S(1000) + TTL - REVOKE_GRACE - S(2));
        pool_shared_set_revoke_grace(f->pool, S(12));
        assert_int_equal(pool_shared_fence_deadline(f->pool), S(1000) + TTL - S(12) - S(2));
}

/* The pool up, one lease granted (its cookie, its rid), then removed from the configuration at S(2): its leases
 * stay, and it wants whatever rules are stored from then on ("*"), said at once by a tick (answered here), so
 * that the other nodes' rule changes are not held back by its lease. */
static void retired_holding_one(Fixture *f, int *cookie, char rid[static 17]) {
        bring_up(f, S(1));
        granted(f, cookie, S(1), rid);
        f->pool->ops->retire(f->pool, S(2));
        PoolInfo info;
        f->pool->ops->info(f->pool, S(2), &info);
        assert_false(info.owes);
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(c, 7), "*");
        done(f, c, reply("ok", S(2), tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, cache(1, 0, 0, -1, "")), S(2), S(2));
}

/* A retired pool whose last lease ended owes Redis the release until it is answered (issue 19 f): the
 * engine frees it only then. */
static void test_a_release_is_owed_until_answered(void **state) {
        Fixture *f = *state;
        int cookie;
        char rid[17];
        retired_holding_one(f, &cookie, rid);
        PoolInfo info;
        f->pool->ops->release(f->pool, f->seen[0].grant, S(3));
        f->pool->ops->info(f->pool, S(3), &info);
        assert_int_equal(info.in_use, 0);
        assert_true(info.owes);
        const SharedCall *c = take(f, SHARED_SCRIPT_RELEASE);
        f->pool->ops->info(f->pool, S(3), &info);
        assert_true(info.owes); /* in flight */
        done(f, c, reply("ok", S(3), arr(1, str("released")), EMPTY, cache(0, 0, 0, -1, "")), S(3), S(3));
        f->pool->ops->info(f->pool, S(3), &info);
        assert_false(info.owes);
}

/* A pool a reload removed and a later reload brings back with the same rules, its lease held all along: it wants
 * them again at once, not "*" until its next heartbeat (a request made meanwhile would be answered "rules" by
 * Redis: its node wants no rules). */
static void test_a_pool_taken_back_wants_its_rules_again_at_once(void **state) {
        Fixture *f = *state;
        int cookie;
        char rid[17];
        retired_holding_one(f, &cookie, rid);
        PoolConfig same = { .name = (char *) "grid", .limit = 2, .max_queue = -1 };
        PoolLaneRule rules[] = { { .lane = "ci", .priority = 0, .max_in_use = -1 } };
        assert_int_equal(pool_configure(f->pool, &same, rules, 1, S(3)), 0);
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        assert_non_null(strstr(arg(c, 7), "limit=2\n"));
}

static void test_intents_are_replayed_in_order_after_a_reconnect(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int a, b, w;
        char rid_a[17], rid_b[17], rid_w[17];
        granted(f, &a, S(1), rid_a);
        PoolGrant *ga = f->seen[f->n_seen - 1].grant;
        granted(f, &b, S(1), rid_b);
        PoolGrant *gb = f->seen[f->n_seen - 1].grant;
        queued(f, &w, S(1), rid_w);
        PoolWaiter *ww = f->seen[f->n_seen - 1].waiter;
        pool_shared_link_down(f->pool, S(2));
        f->pool->ops->release(f->pool, gb, S(2));
        f->pool->ops->withdraw(f->pool, ww, S(2));
        f->pool->ops->release(f->pool, ga, S(3));
        no_call(f);
        pool_shared_link_up(f->pool, "run1", S(4));
        tick_ok(f, S(4), S(4));
        assert_string_equal(arg(take(f, SHARED_SCRIPT_RELEASE), 7), rid_b);
        assert_string_equal(arg(take(f, SHARED_SCRIPT_WITHDRAW), 6), rid_w);
        assert_string_equal(arg(take(f, SHARED_SCRIPT_RELEASE), 7), rid_a);
        no_call(f);
}

static void test_epoch_change_reclaims_every_lease(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookie;
        char rid[17];
        granted(f, &cookie, S(1), rid);
        f->pool->ops->run(f->pool, S(2));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        RespValue body = arr(9, num(0), str("e2"), num(S(32)), str("ok"), EMPTY, arr(3, num(0), num(0), num(0)),
                             str("0-0"), num(1), str(""));
        done(f, c, reply("ok", 1, body, EMPTY, cache(0, 0, 0, -1, "")), S(2), S(2));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_RECLAIMING);
        c = take(f, SHARED_SCRIPT_RECLAIM);
        assert_string_equal(arg(c, 6), rid);
        /* Submits still go: Redis's recovery window decides them. */
        int other;
        assert_int_equal(submit(f, &other, 1, true, S(2)), 0);
        take(f, SHARED_SCRIPT_SUBMIT);
        done(f, c, reply("ok", 1, arr(1, str("confirmed")), EMPTY, cache(1, 0, 0, -1, "")), S(2), S(2));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_UP);
        assert_int_equal(f->n_seen, 1); /* no LOST */
}

static void test_refused_pool_comes_back_when_the_cause_is_gone(void **state) {
        Fixture *f = *state;
        pool_shared_link_up(f->pool, "run1", S(1));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        done(f, c, arr(6, str("version"), num(0), arr(1, num(2)), EMPTY, EMPTY, EMPTY), S(1), S(1));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_REFUSED);
        pool_shared_link_down(f->pool, S(2));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_REFUSED);
        pool_shared_link_up(f->pool, "run9", S(3));
        tick_ok(f, S(3), S(3));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_UP);
}

static void test_link_failure_refuses_the_pool_loudly(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int lease, waiter;
        char rid_l[17], rid_w[17];
        granted(f, &lease, S(1), rid_l);
        queued(f, &waiter, S(1), rid_w);
        pool_shared_link_failed(f->pool, "eviction-policy", S(2));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_REFUSED);
        PoolInfo info;
        f->pool->ops->info(f->pool, S(2), &info);
        assert_string_equal(info.unavailable, "eviction-policy");
        assert_false(info.backend_up);
        int other;
        assert_int_equal(submit(f, &other, 1, true, S(2)), 0);
        assert_string_equal(f->seen[2].reason, "backend");
        /* Waiters: the grace as for an outage; the lease: until the fence. */
        f->pool->ops->run(f->pool, S(2) + WAITER_GRACE);
        assert_ptr_equal(f->seen[3].cookie, &waiter);
        assert_int_equal(f->seen[3].verdict, POOL_VERDICT_REFUSED);
        assert_int_not_equal(pool_shared_fence_deadline(f->pool), USEC_INFINITY);
        bool refused = false;
        SharedNotice n;
        while (pool_shared_pop_notice(f->pool, &n)) {
                if (n.type == SHARED_NOTICE_REFUSED) {
                        refused = true;
                        assert_string_equal(n.detail, "eviction-policy");
                }
                shared_notice_done(&n);
        }
        assert_true(refused);
}

/* SPEC §11, "One node, one identity": Redis refuses this incarnation (another live process heartbeats
 * under the node id). The pool is refused (node-id-conflict) and says so once; only ticks go on; one that
 * is accepted (the other registration lapsed) brings the pool back, reclaiming what it holds. */
static void test_identity_refusal_keeps_ticking_and_clears_when_accepted(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int lease;
        char rid[17];
        granted(f, &lease, S(1), rid);
        f->pool->ops->run(f->pool, S(2));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        done(f, c, arr(6, str("identity"), num(0), EMPTY, EMPTY, EMPTY, EMPTY), S(2), S(2));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_REFUSED);
        PoolInfo info;
        f->pool->ops->info(f->pool, S(2), &info);
        assert_string_equal(info.unavailable, "node-id-conflict");
        int other;
        assert_int_equal(submit(f, &other, 1, true, S(2)), 0);
        assert_int_equal(f->seen[f->n_seen - 1].verdict, POOL_VERDICT_REFUSED);
        assert_string_equal(f->seen[f->n_seen - 1].reason, "node-id-conflict");
        /* The lease is not released, not lost: its fence deadline runs from the last accepted heartbeat. */
        assert_int_equal(pool_shared_fence_deadline(f->pool), S(1) + TTL - REVOKE_GRACE - SHARED_FENCE_SLACK);

        /* Refused again at the next heartbeat: said once. */
        f->pool->ops->run(f->pool, S(3));
        c = take(f, SHARED_SCRIPT_TICK);
        done(f, c, arr(6, str("identity"), num(0), EMPTY, EMPTY, EMPTY, EMPTY), S(3), S(3));
        no_call(f);
        unsigned identity = 0, cleared = 0;
        SharedNotice n;
        while (pool_shared_pop_notice(f->pool, &n)) {
                identity += n.type == SHARED_NOTICE_IDENTITY;
                shared_notice_done(&n);
        }
        assert_int_equal(identity, 1);

        /* Accepted: up again, and what it holds is reclaimed (the other registration's records were reaped). */
        f->pool->ops->run(f->pool, S(4));
        tick_ok(f, S(4), S(4));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_RECLAIMING);
        c = take(f, SHARED_SCRIPT_RECLAIM);
        assert_string_equal(arg(c, 6), rid);
        while (pool_shared_pop_notice(f->pool, &n)) {
                cleared += n.type == SHARED_NOTICE_IDENTITY_CLEARED;
                shared_notice_done(&n);
        }
        assert_int_equal(cleared, 1);
        f->pool->ops->info(f->pool, S(4), &info);
        assert_null(info.unavailable);
}

/* ARGV[2] carries the incarnation with the node id when the daemon gives one. */
static void test_calls_carry_the_incarnation(void **state) {
        Fixture *f = *state;
        Pool *p;
        SharedPoolParams params = {
                .node_id = NODE, .identity = "00112233445566778899/aabbccddeeff0011", .node_name = "runner-1",
                .node_ttl = TTL, .revoke_grace = REVOKE_GRACE, .waiter_grace = WAITER_GRACE, .heartbeat = S(1),
                .random = next_random, .random_userdata = f,
        };
        assert_int_equal(pool_shared_new("grid", &params, on_decision, f, &p), 0);
        pool_shared_link_up(p, "run1", S(1));
        const SharedCall *c = NULL;
        assert_true(pool_shared_take_call(p, S(1), &c));
        assert_string_equal(c->argv[2], NODE "/00112233445566778899/aabbccddeeff0011");
        p->ops->free(p);
}

static void test_restored_lease_fences_from_the_alive_mark(void **state) {
        Fixture *f = *state;
        unsigned slot = 1;
        PoolRestore r = { .lane = "ci", .slots = &slot, .n_slots = 1, .token = 77,
                          .remote_id = NODE ":00000000000000aa", .granted_at = 5 };
        PoolGrant *g;
        assert_int_equal(f->pool->ops->restore(f->pool, &r, &g), 0);
        assert_int_equal(f->pool->ops->restore(f->pool, &r, &g), -EEXIST);
        assert_int_equal(pool_shared_fence_deadline(f->pool), USEC_INFINITY);
        pool_shared_set_last_ack(f->pool, S(100));
        assert_int_equal(pool_shared_fence_deadline(f->pool), S(100) + TTL - REVOKE_GRACE - S(2));
}

/* A restart with a longer backend-node-ttl= than the one a restored lease was granted under (Redis enforces
 * that one until it agreed to the new rules): the restored lease fences with the shorter, until Redis agreed. */
static void test_restored_lease_fences_on_its_recorded_ttl_until_agreed(void **state) {
        Fixture *f = *state;
        unsigned slot = 1;
        PoolRestore r = { .lane = "ci", .slots = &slot, .n_slots = 1, .token = 77,
                          .remote_id = NODE ":00000000000000aa", .granted_at = 5, .node_ttl = S(20) };
        PoolGrant *g;
        assert_int_equal(f->pool->ops->restore(f->pool, &r, &g), 0);
        usec_t margin = REVOKE_GRACE + S(2);
        pool_shared_set_last_ack(f->pool, S(100));
        assert_int_equal(pool_shared_fence_deadline(f->pool), S(100) + S(20) - margin);
        pool_shared_link_up(f->pool, "run1", S(1));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        done(f, c, reply("rules", S(1), tick_body("rules", arr(1, str("backend-node-ttl")), 0, 0, 0, ""), EMPTY,
                         cache(1, 0, 0, -1, "")), S(101), S(1));
        assert_int_equal(pool_shared_fence_deadline(f->pool), S(101) + S(20) - margin);
        f->pool->ops->run(f->pool, S(2));
        tick_ok(f, S(102), S(2));
        assert_int_equal(pool_shared_fence_deadline(f->pool), S(102) + TTL - margin);
}

static void test_restored_lease_is_reclaimed(void **state) {
        Fixture *f = *state;
        unsigned slots[] = { 0, 1 };
        int lease_a, lease_b;
        PoolRestore ra = { .lane = "ci", .slots = &slots[0], .n_slots = 1, .token = 77,
                           .remote_id = NODE ":00000000000000aa", .granted_at = 5 };
        PoolRestore rb = { .lane = "ci", .slots = &slots[1], .n_slots = 1, .token = 78,
                           .remote_id = NODE ":00000000000000bb", .granted_at = 6 };
        PoolGrant *ga, *gb;
        assert_int_equal(f->pool->ops->restore(f->pool, &ra, &ga), 0);
        assert_int_equal(f->pool->ops->restore(f->pool, &rb, &gb), 0);
        f->pool->ops->bind_grant(f->pool, ga, &lease_a);
        f->pool->ops->bind_grant(f->pool, gb, &lease_b);
        no_call(f);
        pool_shared_link_up(f->pool, "run1", S(1));
        tick_ok(f, S(1), S(1));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_RECLAIMING);
        const SharedCall *c = take(f, SHARED_SCRIPT_RECLAIM);
        assert_int_equal(c->argc, 12);
        /* Queued before the link was up, sent with the run id it has now: any other starts a recovery
         * window in Redis (every grant of the pool held back for a TTL). */
        assert_string_equal(arg(c, 4), "run1");
        assert_string_equal(arg(c, 6), "00000000000000aa");
        assert_string_equal(arg(c, 7), "ci");
        assert_string_equal(arg(c, 8), "1");
        assert_string_equal(arg(c, 9), "77");
        assert_string_equal(arg(c, 10), "5");
        assert_string_equal(arg(c, 11), "0");
        const SharedCall *d = take(f, SHARED_SCRIPT_RECLAIM);
        done(f, c, reply("ok", 1, arr(1, str("confirmed")), EMPTY, cache(1, 0, 0, -1, "")), S(1), S(1));
        assert_int_equal(f->n_seen, 0);
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_RECLAIMING);
        done(f, d, reply("ok", 1, arr(1, str("conflict")), EMPTY, cache(1, 0, 0, -1, "")), S(1), S(1));
        assert_int_equal(f->n_seen, 1);
        assert_int_equal(f->seen[0].verdict, POOL_VERDICT_LOST);
        assert_ptr_equal(f->seen[0].cookie, &lease_b);
        assert_string_equal(f->seen[0].reason, "reclaim-conflict");
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_UP);
        /* Redis freed the conflicting one already: its release sends nothing. */
        f->pool->ops->release(f->pool, gb, S(2));
        no_call(f);
}

/* A lease restored (rid 00000000000000aa, token 77), the link up and the registering tick answered: the pool
 * reclaims it; returns the reclaim. */
static const SharedCall *reclaim_restored(Fixture *f, PoolGrant **ret) {
        unsigned slot = 0;
        PoolRestore r = { .lane = "ci", .slots = &slot, .n_slots = 1, .token = 77,
                          .remote_id = NODE ":00000000000000aa", .granted_at = 5 };
        assert_int_equal(f->pool->ops->restore(f->pool, &r, ret), 0);
        pool_shared_link_up(f->pool, "run1", S(1));
        tick_ok(f, S(1), S(1));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_RECLAIMING);
        return take(f, SHARED_SCRIPT_RECLAIM);
}

static void test_lease_released_while_reclaimed_ends_the_reclaiming(void **state) {
        Fixture *f = *state;
        PoolGrant *g;
        const SharedCall *c = reclaim_restored(f, &g);
        f->pool->ops->release(f->pool, g, S(1));
        done(f, c, reply("ok", 1, arr(1, str("confirmed")), EMPTY, cache(1, 0, 0, -1, "")), S(1), S(1));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_UP);
        assert_string_equal(arg(take(f, SHARED_SCRIPT_RELEASE), 6), "77");
        assert_int_equal(f->n_seen, 0);
}

/* A reclaim parked after an error reply, and its lease released meanwhile: the release does not go alone
 * ahead of a reclaim sent again after it (inside a recovery window, that would occupy the slots again under
 * a lease nobody holds); the reclaim is dropped, the release goes, the pool is no longer reclaiming. */
static void test_release_drops_a_reclaim_parked_after_an_error(void **state) {
        Fixture *f = *state;
        PoolGrant *g;
        const SharedCall *c = reclaim_restored(f, &g);
        done(f, c, (RespValue) { .type = RESP_ERROR, .str = "OOM", .len = 3 }, S(1), S(1));
        no_call(f); /* held until a heartbeat */
        f->pool->ops->release(f->pool, g, S(1));
        assert_string_equal(arg(take(f, SHARED_SCRIPT_RELEASE), 7), "00000000000000aa");
        f->pool->ops->run(f->pool, S(2));
        tick_ok(f, S(2), S(2));
        no_call(f);
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_UP);
}

/* A lease granted (rid, bound to *cookie), then the link down and up again on a Redis with another run id
 * (restarted, or another primary): returns the registering tick, with that run id. */
static const SharedCall *restart_holding_a_lease(Fixture *f, int *cookie, char rid[static 17]) {
        bring_up(f, S(1));
        granted(f, cookie, S(1), rid);
        f->pool->ops->bind_grant(f->pool, f->seen[0].grant, cookie);
        pool_shared_link_down(f->pool, S(2));
        pool_shared_link_up(f->pool, "run2", S(3));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(c, 4), "run2");
        return c;
}

static void test_run_id_change_reclaims_every_lease(void **state) {
        Fixture *f = *state;
        int cookie;
        char rid[17];
        const SharedCall *c = restart_holding_a_lease(f, &cookie, rid);
        done(f, c, reply("ok", 1, tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, cache(0, 0, 0, -1, "")), S(3), S(3));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_RECLAIMING);
        c = take(f, SHARED_SCRIPT_RECLAIM);
        assert_int_equal(c->argc, 12);
        assert_string_equal(arg(c, 6), rid);
        assert_string_equal(arg(c, 7), "ci");
        assert_string_equal(arg(c, 8), "1");
        assert_string_equal(arg(c, 9), "7");
        assert_string_equal(arg(c, 11), "0");
        done(f, c, reply("ok", 1, arr(1, str("lost")), EMPTY, cache(0, 0, 0, -1, "")), S(3), S(3));
        assert_int_equal(f->seen[1].verdict, POOL_VERDICT_LOST);
        assert_string_equal(f->seen[1].reason, "node-expired");
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_UP);
        SharedNotice n;
        bool recovery = false;
        while (pool_shared_pop_notice(f->pool, &n)) {
                recovery = recovery || n.type == SHARED_NOTICE_RECOVERY;
                shared_notice_done(&n);
        }
        assert_true(recovery);
}

/* A recovery window that waits for this node: the tick after a Redis restart says "0" (a lease to
 * reclaim), and the moment Redis confirms the last one a tick says "1" (the window may end then). */
static void test_reclaimed_flag_follows_the_reclaims(void **state) {
        Fixture *f = *state;
        int cookie;
        char rid[17];
        const SharedCall *c = restart_holding_a_lease(f, &cookie, rid);
        assert_string_equal(arg(c, 13), "0");
        done(f, c, reply("ok", 1, tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, cache_in_recovery(0, S(33))), S(3),
             S(3));
        c = take(f, SHARED_SCRIPT_RECLAIM);
        no_call(f);
        done(f, c, reply("ok", 1, arr(1, str("confirmed")), EMPTY, cache_in_recovery(1, S(33))), S(3), S(3));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_UP);
        c = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(c, 13), "1");
}

/* The registering tick of a pool object just made (a brokerd just started) finds a window open: its notice
 * carries what opened it (the cache's last element, lua/README "Recovery windows"), so that the journal
 * does not blame a restart of Redis for a pool's first use. A word not among the scripts' is not passed on. */
static void test_recovery_notice_carries_what_opened_the_window(void **state) {
        static const struct {
                const char *why, *detail;
        } cases[] = {
                { "new", "new" }, { "restart", "restart" }, { "lost:leases", "lost:leases" },
                { "lost:rm -rf", NULL }, { "", NULL }, { "restarted or so", NULL },
        };
        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                Fixture *f = fixture_new(false);
                pool_shared_link_up(f->pool, "run1", S(1));
                const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
                RespValue window = arr(12, num(0), num(0), num(0), num(0), num(0), num(-1), num(100), str("e1"),
                                       num(S(30)), str(""), num(2), str(cases[i].why));
                done(f, c, reply("ok", S(1), tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, window), S(1), S(1));
                SharedNotice n;
                bool found = false;
                while (pool_shared_pop_notice(f->pool, &n)) {
                        if (n.type == SHARED_NOTICE_RECOVERY) {
                                assert_false(found); /* once per window */
                                found = true;
                                if (cases[i].detail)
                                        assert_string_equal(n.detail, cases[i].detail);
                                else
                                        assert_null(n.detail);
                        }
                        shared_notice_done(&n);
                }
                assert_true(found);
                fixture_free(f);
        }
}

static void test_rules_mismatch_refuses_and_keeps_heartbeating(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int lease, waiter;
        char rid_l[17], rid_w[17];
        granted(f, &lease, S(1), rid_l);
        queued(f, &waiter, S(1), rid_w);
        f->pool->ops->run(f->pool, S(2));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        assert_false(pool_shared_take_send_first(f->pool));
        done(f, c, reply("rules", 1, tick_body("rules", arr(1, str("limit")), 0, 0, 0, ""), EMPTY,
                         cache(1, 1, 0, -1, "")),
             S(2), S(2));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_MISMATCH);
        assert_int_equal(f->seen[2].verdict, POOL_VERDICT_REFUSED);
        assert_ptr_equal(f->seen[2].cookie, &waiter);
        assert_string_equal(f->seen[2].reason, "rules");
        /* Its withdraw is to go before the refusal is told, once. */
        assert_true(pool_shared_take_send_first(f->pool));
        assert_false(pool_shared_take_send_first(f->pool));
        PoolInfo info;
        f->pool->ops->info(f->pool, S(2), &info);
        assert_string_equal(info.unavailable, "rules");
        assert_string_equal(info.differing_keys[0], "limit");
        assert_null(info.differing_keys[1]);
        SharedNotice n;
        assert_true(pool_shared_pop_notice(f->pool, &n));
        assert_int_equal(n.type, SHARED_NOTICE_RULES_MISMATCH);
        assert_string_equal(n.detail, "limit");
        shared_notice_done(&n);
        /* New requests: at once. */
        int other;
        assert_int_equal(submit(f, &other, 1, true, S(3)), 0);
        assert_string_equal(f->seen[3].reason, "rules");
        assert_false(pool_shared_take_send_first(f->pool)); /* Redis never had it: nothing to withdraw */
        /* The waiter refused leaves Redis's queue at once: it would stay there (and be granted a slot nobody
         * releases) for as long as the rules differ. */
        c = take(f, SHARED_SCRIPT_WITHDRAW);
        assert_string_equal(arg(c, 6), rid_w);
        done(f, c, reply("ok", 1, arr(1, str("withdrawn")), EMPTY, cache(1, 0, 0, -1, "")), S(3), S(3));
        /* The lease stays, and heartbeats go on (the fence moves with them). */
        f->pool->ops->run(f->pool, S(3));
        c = take(f, SHARED_SCRIPT_TICK);
        done(f, c, reply("rules", 1, tick_body("rules", arr(1, str("limit")), 0, 0, 0, ""), EMPTY,
                         cache(1, 0, 0, -1, "")),
             S(50), S(3));
        assert_int_equal(pool_shared_fence_deadline(f->pool), S(50) + TTL - REVOKE_GRACE - S(2));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_MISMATCH);
        /* A lease that ends is released in Redis at once too, and owed until it is answered. */
        f->pool->ops->release(f->pool, f->seen[0].grant, S(4));
        f->pool->ops->info(f->pool, S(4), &info);
        assert_true(info.owes);
        c = take(f, SHARED_SCRIPT_RELEASE);
        assert_string_equal(arg(c, 7), rid_l);
        done(f, c, reply("ok", 1, arr(1, str("released")), EMPTY, cache(0, 0, 0, -1, "")), S(4), S(4));
        f->pool->ops->info(f->pool, S(4), &info);
        assert_false(info.owes);
        no_call(f);
        f->pool->ops->run(f->pool, S(5));
        tick_ok(f, S(5), S(5));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_UP);
        assert_true(pool_shared_pop_notice(f->pool, &n));
        assert_int_equal(n.type, SHARED_NOTICE_RULES_AGREED);
        shared_notice_done(&n);
}

/* Two reloads in a row, the second back to the agreed rules: the answer "rules" to the first one's tick, which
 * comes while the node wants the agreed rules again, refuses nobody; the second one's tick decides. */
static void test_a_rules_answer_to_rules_no_longer_wanted_refuses_nobody(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int waiter;
        char rid[17];
        queued(f, &waiter, S(1), rid);
        PoolLaneRule rules[] = { { .lane = "ci", .priority = 0, .max_in_use = -1 } };
        PoolConfig wider = { .name = (char *) "grid", .limit = 3, .max_queue = -1 };
        PoolConfig agreed = { .name = (char *) "grid", .limit = 2, .max_queue = -1 };
        assert_int_equal(pool_configure(f->pool, &wider, rules, 1, S(2)), 0);
        const SharedCall *first = take(f, SHARED_SCRIPT_TICK);
        assert_int_equal(pool_configure(f->pool, &agreed, rules, 1, S(2)), 0);
        const SharedCall *second = take(f, SHARED_SCRIPT_TICK);
        assert_string_not_equal(arg(first, 7), arg(second, 7));
        done(f, first, reply("rules", S(2), tick_body("rules", arr(1, str("limit")), 0, 0, 0, ""), EMPTY,
                             cache(0, 1, 0, -1, "")), S(2), S(2));
        assert_int_equal(f->n_seen, 1); /* the waiter's "queued" only */
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_UP);
        done(f, second, reply("ok", S(2), tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, cache(0, 1, 0, -1, "")), S(2),
             S(2));
        assert_int_equal(f->n_seen, 1);
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_UP);
        /* The rules this node wants now differing, as ever: refused. */
        assert_int_equal(pool_configure(f->pool, &wider, rules, 1, S(3)), 0);
        done(f, take(f, SHARED_SCRIPT_TICK), reply("rules", S(3), tick_body("rules", arr(1, str("limit")), 0, 0, 0, ""),
                                                   EMPTY, cache(0, 1, 0, -1, "")), S(3), S(3));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_MISMATCH);
        assert_int_equal(f->seen[1].verdict, POOL_VERDICT_REFUSED);
        assert_string_equal(f->seen[1].reason, "rules");
}

static void test_keys_made_by_a_test_are_refused(void **state) {
        Fixture *f = *state;
        pool_shared_link_up(f->pool, "run1", S(1));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        RespValue r = arr(6, str("manual-clock"), num(0), arr(1, str("manual")), EMPTY, EMPTY, EMPTY);
        done(f, c, r, S(1), S(1));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_REFUSED);
        SharedNotice n;
        assert_true(pool_shared_pop_notice(f->pool, &n));
        assert_int_equal(n.type, SHARED_NOTICE_REFUSED);
        assert_string_equal(n.detail, "manual-clock");
        shared_notice_done(&n);
        int cookie;
        assert_int_equal(submit(f, &cookie, 1, true, S(2)), 0);
        assert_string_equal(f->seen[0].reason, "backend");
        f->pool->ops->run(f->pool, S(5));
        no_call(f);
}

static void test_lost_stream_entry_found_by_the_positions_round(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookie;
        char rid[17];
        queued(f, &cookie, S(1), rid);
        /* Another node's release granted it; the stream entry was lost (trimmed). The heartbeat's round of
         * places asks for it and gets the grant. */
        f->pool->ops->run(f->pool, S(2));
        const SharedCall *t = take(f, SHARED_SCRIPT_TICK);
        const SharedCall *c = take(f, SHARED_SCRIPT_POSITIONS);
        assert_string_equal(arg(c, 6), "pos");
        assert_int_equal(c->argc, 8);
        assert_string_equal(arg(c, 7), rid);
        done(f, t, reply("ok", 1, tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, cache(2, 0, 0, -1, "")), S(2), S(2));
        done(f, c, reply("ok", 1, arr(1, decision("granted", rid, 1, 0, "", 0, 12, arr(1, num(1)))), EMPTY,
                         cache(2, 0, 0, -1, "")), S(2), S(2));
        assert_int_equal(f->n_seen, 2);
        assert_int_equal(f->seen[1].verdict, POOL_VERDICT_GRANTED);
        assert_int_equal(f->seen[1].token, 12);
        no_call(f);
}

static void test_positions_round_updates_places(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookie;
        char rid[17];
        queued(f, &cookie, S(1), rid);
        f->pool->ops->run(f->pool, S(2));
        take(f, SHARED_SCRIPT_TICK);
        const SharedCall *c = take(f, SHARED_SCRIPT_POSITIONS);
        done(f, c, reply("ok", 1, arr(1, arr(3, str("queued"), num(1), num(2))), EMPTY, cache(2, 2, 0, -1, "")),
             S(2), S(2));
        size_t queued_n;
        assert_int_equal(f->pool->ops->position(f->pool, f->seen[0].waiter, &queued_n), 1);
        assert_int_equal(queued_n, 2);
}

static void test_fingerprint_mismatch_twice_reconciles(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookie;
        char rid[17];
        granted(f, &cookie, S(1), rid);
        /* Redis holds a record this node does not know (a grant for a try it forgot, say): n = 2. */
        uint32_t h = fnv1a32(rid, 'l') ^ fnv1a32("00000000000000ff", 'l');
        uint32_t sum = fnv1a32(rid, 'l') + fnv1a32("00000000000000ff", 'l');
        for (int i = 0; i < 2; i++) {
                f->pool->ops->run(f->pool, S(2 + i));
                const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
                done(f, c, reply("ok", 1, tick_body("ok", EMPTY, 2, h, sum, ""), EMPTY, cache(2, 0, 0, -1, "")),
                     S(2 + i), S(2 + i));
                if (i == 0)
                        no_call(f); /* once may be a stream entry on its way */
        }
        /* A page of every rid this node has: the script drops what the page does not list. */
        const SharedCall *t = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(t, 14), "-");
        assert_string_equal(arg(t, 15), "+");
        assert_int_equal(t->argc, 17);
        assert_string_equal(arg(t, 16), rid);
        done(f, t, reply("ok", 1, tick_body("ok", EMPTY, 1, fnv1a32(rid, 'l'), fnv1a32(rid, 'l'), ""), EMPTY,
                         cache(1, 0, 0, -1, "")), S(4), S(4));
        no_call(f);
        /* Agreed again: the next heartbeat carries no page. */
        f->pool->ops->run(f->pool, S(5));
        t = take(f, SHARED_SCRIPT_TICK);
        assert_int_equal(t->argc, 16);
        assert_string_equal(arg(t, 14), "");
}

/* SPEC §3.4: a node that cannot account for its leases (brokerd: its state directory unread, or state.damaged)
 * says so with every tick ("k"), so that a reconcile keeps what Redis holds for it instead of orphaning it; its
 * fingerprint differs meanwhile by what Redis keeps, which reconciles no more often than a busy node does.
 * Accounting again, the next tick reconciles in full, without "k". */
/* n heartbeats from `from`, a second apart, none with a page, each answered with Redis's fingerprint (n, x, s). */
static void heartbeats(Fixture *f, usec_t from, int count, int64_t n, int64_t x, int64_t s) {
        for (int i = 0; i < count; i++) {
                usec_t t = from + S(i);
                f->pool->ops->run(f->pool, t);
                const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
                assert_string_equal(arg(c, 14), "");
                done(f, c, reply("ok", 1, tick_body("ok", EMPTY, n, x, s, ""), EMPTY, cache(1, 0, 0, -1, "")), t, t);
        }
}

static void test_a_node_that_cannot_account_keeps_its_records_and_reconciles_once_it_can(void **state) {
        Fixture *f = *state;
        pool_shared_set_records_unknown(f->pool, true);
        pool_shared_link_up(f->pool, "run1", S(1));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        /* Not "reclaimed" either: a recovery window waits its length for a lease Redis lost and nobody names. */
        assert_string_equal(arg(c, 13), "0k");
        assert_string_equal(arg(c, 14), "-");
        assert_string_equal(arg(c, 15), "+");
        /* Redis keeps a lease this node cannot name, and says so: n = 1 there, 0 here, and 1 kept. */
        uint32_t h = fnv1a32("00000000000000ff", 'l');
        done(f, c, reply("ok", 1, tick_body_kept("ok", EMPTY, 1, h, h, "", 1, h, h), EMPTY, cache(1, 0, 0, -1, "")),
             S(1), S(1));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_UP);
        /* The kept lease counts in the comparison: the heartbeats agree, and nothing is reconciled again. */
        heartbeats(f, S(2), 3, 1, h, h);
        no_call(f);
        /* A waiter of this node's that it forgot: two heartbeats differ, and a reconcile (still "k") goes at
         * once, not a SHARED_RECONCILE_PERIOD later; it drops the waiter and keeps the lease. */
        uint32_t w = fnv1a32("00000000000000fe", 'w');
        heartbeats(f, S(5), 2, 2, h ^ w, (uint32_t) (h + w));
        c = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(c, 13), "0k");
        assert_string_equal(arg(c, 14), "-");
        assert_string_equal(arg(c, 15), "+");
        done(f, c, reply("ok", 1, tick_body_kept("ok", EMPTY, 1, h, h, "", 1, h, h), EMPTY, cache(1, 0, 0, -1, "")),
             S(6), S(6));
        no_call(f);
        heartbeats(f, S(7), 1, 1, h, h);
        no_call(f);
        uint64_t bad = bad_inputs(f);

        pool_shared_set_records_unknown(f->pool, false);
        f->pool->ops->run(f->pool, S(8));
        c = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(c, 13), "1");
        assert_string_equal(arg(c, 14), "-");
        assert_string_equal(arg(c, 15), "+");
        assert_int_equal(c->argc, 16);
        done(f, c, reply("ok", 1, tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, cache(0, 0, 0, -1, "")), S(8), S(8));
        no_call(f);
        /* Accounting, nothing is kept any more: Redis's lease, were it still there, differs. */
        heartbeats(f, S(9), 2, 1, h, h);
        c = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(c, 13), "1");
        assert_string_equal(arg(c, 14), "-");
        done(f, c, reply("ok", 1, tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, cache(0, 0, 0, -1, "")), S(10), S(10));
        no_call(f);

        /* Unknown again, and accounting once more while a kept page is out: that reconcile, once done, runs
         * again without "k" (what the page kept would stay until the fingerprint found it). */
        pool_shared_set_records_unknown(f->pool, true);
        heartbeats(f, S(11), 2, 1, h, h);
        c = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(c, 13), "0k");
        assert_string_equal(arg(c, 14), "-");
        /* That page out, the node accounts again: once it is done, a whole reconcile without "k" follows. */
        pool_shared_set_records_unknown(f->pool, false);
        done(f, c, reply("ok", 1, tick_body_kept("ok", EMPTY, 1, h, h, "", 1, h, h), EMPTY, cache(1, 0, 0, -1, "")),
             S(12), S(12));
        c = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(c, 13), "1");
        assert_string_equal(arg(c, 14), "-");
        assert_string_equal(arg(c, 15), "+");
        assert_int_equal(bad_inputs(f), bad);
}

/* A page's count of kept leases is untrusted: one that is not a fingerprint is bad input and keeps nothing, so
 * the difference stays and is reconciled again. */
static void test_a_malformed_kept_fingerprint_is_bad_input(void **state) {
        Fixture *f = *state;
        pool_shared_set_records_unknown(f->pool, true);
        pool_shared_link_up(f->pool, "run1", S(1));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        uint32_t h = fnv1a32("00000000000000ff", 'l');
        uint64_t bad = bad_inputs(f);
        done(f, c, reply("ok", 1, tick_body_kept("ok", EMPTY, 1, h, h, "", -1, h, (int64_t) UINT32_MAX + 1), EMPTY,
                         cache(1, 0, 0, -1, "")), S(1), S(1));
        assert_int_equal(bad_inputs(f), bad + 1);
        heartbeats(f, S(2), 2, 1, h, h);
        c = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(c, 13), "0k");
        assert_string_equal(arg(c, 14), "-");
}

/* Review s52: a reconcile page is a snapshot of this node's rids, made when it was queued; "k" is made when it is
 * sent. A page queued while the node could not account (listing nothing), a lease restored by the late read of the
 * state, then accounting again before the page goes: it goes without "k" and does not list the restored lease, so
 * Redis makes that lease an orphan that lapses a TTL later while its command runs (and reclaim.lua answers
 * "confirmed" for an orphan, so the node never learns). The page must keep "k" or be made again. */
static void test_a_page_made_unknowing_goes_with_k_or_lists_what_was_restored(void **state) {
        Fixture *f = *state;
        pool_shared_set_records_unknown(f->pool, true);
        pool_shared_link_up(f->pool, "run1", S(1)); /* the registering tick: a whole page, queued */
        unsigned slot = 1;
        PoolRestore r = { .lane = "ci", .slots = &slot, .n_slots = 1, .token = 77,
                          .remote_id = NODE ":00000000000000aa", .granted_at = 5 };
        PoolGrant *g;
        assert_int_equal(f->pool->ops->restore(f->pool, &r, &g), 0); /* manager_apply_state() */
        pool_shared_set_records_unknown(f->pool, false);            /* manager_check_damage() */
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(c, 14), "-");
        bool listed = false;
        for (size_t i = 16; i < c->argc; i++)
                listed = listed || streq(c->argv[i], "00000000000000aa");
        bool keeps = strlen(arg(c, 13)) == 2 && arg(c, 13)[1] == 'k';
        assert_true(listed || keeps);
}

/* A node whose heartbeats always find another call in flight never compares its fingerprint: it reconciles
 * in full at SHARED_RECONCILE_PERIOD all the same (lua/README, "Fingerprint"), and only then. */
static void test_busy_node_reconciles_at_a_bounded_period(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookie, cookie2;
        char rid[17], rid2[17];
        granted(f, &cookie, S(1), rid);
        /* A submit out and never answered: every heartbeat below has company. */
        assert_int_equal(submit(f, &cookie2, 1, true, S(1)), 0);
        const SharedCall *busy = take(f, SHARED_SCRIPT_SUBMIT);
        snprintf(rid2, sizeof rid2, "%s", arg(busy, 6));
        /* Redis holds a record this node does not know: the fingerprints differ at every heartbeat. */
        uint32_t h = fnv1a32(rid, 'l') ^ fnv1a32("00000000000000ff", 'l');
        uint32_t sum = fnv1a32(rid, 'l') + fnv1a32("00000000000000ff", 'l');
        usec_t t = S(2);
        for (; t < S(1) + SHARED_RECONCILE_PERIOD; t += S(1)) {
                arena_used = 0; /* the replies are read by done() alone */
                f->clock = t;
                f->pool->ops->run(f->pool, t);
                const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
                assert_string_equal(arg(c, 14), "");
                done(f, c, reply("ok", 1, tick_body("ok", EMPTY, 2, h, sum, ""), EMPTY, cache(2, 0, 0, -1, "")),
                     t, t);
                no_call(f);
        }
        f->clock = t;
        f->pool->ops->run(f->pool, t);
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        done(f, c, reply("ok", 1, tick_body("ok", EMPTY, 2, h, sum, ""), EMPTY, cache(2, 0, 0, -1, "")), t, t);
        /* The period passed: a whole reconcile, listing the lease and the waiter out. */
        c = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(c, 14), "-");
        assert_string_equal(arg(c, 15), "+");
        assert_true(page_lists(c, rid));
        assert_true(page_lists(c, rid2));
        done(f, c, reply("ok", 1, tick_body("ok", EMPTY, 2, h, sum, ""), EMPTY, cache(2, 0, 0, -1, "")), t, t);
        no_call(f);
        /* And not again before another period. */
        f->clock = t + S(1);
        f->pool->ops->run(f->pool, t + S(1));
        c = take(f, SHARED_SCRIPT_TICK);
        done(f, c, reply("ok", 1, tick_body("ok", EMPTY, 2, h, sum, ""), EMPTY, cache(2, 0, 0, -1, "")),
             t + S(1), t + S(1));
        no_call(f);
}

/* A reconcile tick answered "settling" goes again, and a submit sent behind it may have run by then: its
 * page is made again, with that waiter (otherwise Redis would drop it as one this node forgot). */
static void test_a_settling_reconcile_tick_lists_what_was_sent_behind_it(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookie, cookie2;
        char rid[17], rid2[17];
        granted(f, &cookie, S(1), rid);
        uint32_t h = fnv1a32(rid, 'l') ^ fnv1a32("00000000000000ff", 'l');
        uint32_t sum = fnv1a32(rid, 'l') + fnv1a32("00000000000000ff", 'l');
        for (int i = 0; i < 2; i++) {
                f->pool->ops->run(f->pool, S(2 + i));
                const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
                done(f, c, reply("ok", 1, tick_body("ok", EMPTY, 2, h, sum, ""), EMPTY, cache(2, 0, 0, -1, "")),
                     S(2 + i), S(2 + i));
        }
        const SharedCall *t = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(t, 14), "-");
        assert_int_equal(t->argc, 17);
        /* A submit sent behind it; Redis answers the tick "settling", then queues the waiter. */
        assert_int_equal(submit(f, &cookie2, 1, true, S(4)), 0);
        const SharedCall *sub = take(f, SHARED_SCRIPT_SUBMIT);
        snprintf(rid2, sizeof rid2, "%s", arg(sub, 6));
        done(f, t, reply("settling", 1, EMPTY, EMPTY, cache(1, 0, 0, -1, "")), S(4), S(4));
        done(f, sub, reply("ok", 1, decision("queued", rid2, 1, 0, "", 0, 0, EMPTY), EMPTY, cache(2, 1, 0, -1, "")),
             S(4), S(4));
        t = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(t, 14), "-");
        assert_string_equal(arg(t, 15), "+");
        assert_true(page_lists(t, rid));
        assert_true(page_lists(t, rid2));
}

static void test_positions_gone_refuses_the_waiter(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookie;
        char rid[17];
        queued(f, &cookie, S(1), rid);
        f->pool->ops->run(f->pool, S(2));
        take(f, SHARED_SCRIPT_TICK);
        const SharedCall *c = take(f, SHARED_SCRIPT_POSITIONS);
        done(f, c, reply("ok", 1, arr(1, arr(1, str("gone"))), EMPTY, cache(0, 0, 0, -1, "")), S(2), S(2));
        assert_int_equal(f->seen[1].verdict, POOL_VERDICT_REFUSED);
        assert_string_equal(f->seen[1].reason, "node-expired");
}

/* Redis lost the pool's data since it queued the waiter (restarted empty: another run id; FLUSHALL: the pool
 * made anew, another epoch). The node is live and its client waits: "gone" sends the submit again, under
 * its rid and arrival, and the waiter keeps waiting (no refusal) until Redis grants it. */
/* The pool's epoch as Redis has it after the loss (the test's own replies say it). */
static RespValue cache_lost(const char *epoch) {
        return arr(11, num(0), num(0), num(0), num(0), num(0), num(-1), num(100), str(epoch), num(S(33)), str(""),
                   num(2));
}

static RespValue tick_body_lost(const char *epoch) {
        return arr(9, num(0), str(epoch), num(S(33)), str("ok"), EMPTY, arr(3, num(0), num(0), num(0)), str("0-0"),
                   num(2), str(""));
}

/* A waiter queued; then Redis lost the pool's data: restarted empty (another run id, the pool made anew),
 * or FLUSHALL (the same run id, the pool made anew: another epoch). Returns the epoch Redis has now. */
static const char *lose_the_waiters_record(Fixture *f, bool restart, int *cookie, char rid[static 17],
                                           char arrival[static 32]) {
        /* Each call answered the instant it is sent: the pool clock is the local one, so an arrival reads the
         * same in every call. */
        f->clock = S(1);
        bring_up(f, S(1));
        assert_int_equal(submit(f, cookie, 1, true, S(1)), 0);
        const SharedCall *sub = take(f, SHARED_SCRIPT_SUBMIT);
        snprintf(rid, 17, "%s", arg(sub, 6));
        snprintf(arrival, 32, "%s", arg(sub, 13));
        assert_string_equal(arrival, "1000000");
        done(f, sub, reply("ok", (int64_t) S(1), decision("queued", rid, (int64_t) S(1), 0, "", 0, 0, EMPTY),
                           EMPTY, cache(1, 1, 0, -1, "")), S(1), S(1));
        assert_int_equal(f->n_seen, 1);
        assert_int_equal(f->seen[0].verdict, POOL_VERDICT_QUEUED);
        const char *epoch = restart ? "e1" : "e2";
        f->clock = S(3);
        if (restart) {
                pool_shared_link_down(f->pool, S(2));
                pool_shared_link_up(f->pool, "run2", S(3));
        } else
                f->pool->ops->run(f->pool, S(3));
        const SharedCall *t = take(f, SHARED_SCRIPT_TICK);
        done(f, t, reply("ok", (int64_t) S(3), tick_body_lost(epoch), EMPTY, cache_lost(epoch)), S(3), S(3));
        assert_int_equal(f->n_seen, 1);
        return epoch;
}

/* The next heartbeat's places query (after the ticks the loss queued, answered) finds no record. */
static void positions_gone(Fixture *f, const char *epoch, usec_t now) {
        f->clock = now;
        for (int i = 0;; i++) {
                assert_true(i < 4);
                f->pool->ops->run(f->pool, now);
                const SharedCall *c = NULL;
                assert_true(pool_shared_take_call(f->pool, f->clock, &c));
                if (c->script == SHARED_SCRIPT_POSITIONS) {
                        done(f, c, reply("ok", (int64_t) now, arr(1, arr(1, str("gone"))), EMPTY, cache_lost(epoch)),
                             now, now);
                        return;
                }
                assert_int_equal(c->script, SHARED_SCRIPT_TICK);
                done(f, c, reply("ok", (int64_t) now, tick_body_lost(epoch), EMPTY, cache_lost(epoch)), now, now);
        }
}

/* The next call of `script`, the ticks before it answered as heartbeats, the places queries as finding
 * nothing. */
static const SharedCall *take_after_ticks(Fixture *f, SharedScript script, const char *epoch, usec_t now) {
        for (;;) {
                const SharedCall *c = NULL;
                assert_true(pool_shared_take_call(f->pool, f->clock, &c));
                if (c->script == script)
                        return c;
                if (c->script == SHARED_SCRIPT_POSITIONS) {
                        /* A places query sent before the submit (the fingerprints differ): it finds nothing. */
                        assert_int_equal(c->argc, 8);
                        done(f, c, reply("ok", (int64_t) now, arr(1, arr(1, str("gone"))), EMPTY, cache_lost(epoch)),
                             now, now);
                        continue;
                }
                assert_int_equal(c->script, SHARED_SCRIPT_TICK);
                done(f, c, reply("ok", (int64_t) now, tick_body_lost(epoch), EMPTY, cache_lost(epoch)), now, now);
        }
}

static void test_positions_gone_after_redis_lost_its_data_submits_again(void **state) {
        (void) state;
        for (int restart = 0; restart < 2; restart++) {
                Fixture *f = fixture_new(false);
                int cookie;
                char rid[17], arrival[32];
                const char *epoch = lose_the_waiters_record(f, restart, &cookie, rid, arrival);
                positions_gone(f, epoch, S(4));
                assert_int_equal(f->n_seen, 1); /* not refused */
                const SharedCall *sub = take_after_ticks(f, SHARED_SCRIPT_SUBMIT, epoch, S(4));
                assert_string_equal(arg(sub, 6), rid);
                assert_string_equal(arg(sub, 7), "ci");
                assert_string_equal(arg(sub, 8), "1");
                assert_string_equal(arg(sub, 9), "1");
                /* Its arrival, not now: its wait counts from when it came. */
                assert_string_equal(arg(sub, 13), arrival);
                assert_string_equal(arg(sub, 15), "0"); /* "gone" is Redis's word: looked up */
                done(f, sub, reply("ok", (int64_t) S(4), decision("queued", rid, (int64_t) S(4), 0, "", 0, 0, EMPTY),
                                   EMPTY, cache_lost(epoch)), S(4), S(4));
                assert_int_equal(f->n_seen, 1); /* QUEUED once */
                /* Granted once the recovery window is over, as any waiter. */
                const SharedCall *t;
                f->clock = S(34);
                f->pool->ops->run(f->pool, S(34));
                t = take_after_ticks(f, SHARED_SCRIPT_TICK, epoch, S(34));
                done(f, t, reply("ok", (int64_t) S(34), tick_body_lost(epoch),
                                 arr(1, decision("granted", rid, (int64_t) S(34), 0, "", 0, 9, arr(1, num(0)))),
                                 cache_lost(epoch)), S(34), S(34));
                assert_int_equal(f->n_seen, 2);
                assert_int_equal(f->seen[1].verdict, POOL_VERDICT_GRANTED);
                assert_int_equal(f->seen[1].token, 9);
                fixture_free(f);
        }
}

/* Lost again in the same data: someone deletes it (a Redis does not lose a record twice without a restart
 * or a pool made anew). Refused as garbage in Redis is, counted, and withdrawn. */
static void test_positions_gone_again_in_the_same_data_is_refused(void **state) {
        Fixture *f = *state;
        int cookie;
        char rid[17], arrival[32];
        const char *epoch = lose_the_waiters_record(f, true, &cookie, rid, arrival);
        positions_gone(f, epoch, S(4));
        const SharedCall *sub = take_after_ticks(f, SHARED_SCRIPT_SUBMIT, epoch, S(4));
        done(f, sub, reply("ok", (int64_t) S(4), decision("queued", rid, (int64_t) S(4), 0, "", 0, 0, EMPTY),
                           EMPTY, cache_lost(epoch)), S(4), S(4));
        positions_gone(f, epoch, S(5));
        assert_int_equal(f->n_seen, 2);
        assert_int_equal(f->seen[1].verdict, POOL_VERDICT_REFUSED);
        assert_string_equal(f->seen[1].reason, "bad-reply");
        PoolInfo info;
        f->pool->ops->info(f->pool, S(5), &info);
        assert_int_equal(info.bad_input, 1);
        const SharedCall *w = take_after_ticks(f, SHARED_SCRIPT_WITHDRAW, epoch, S(5));
        assert_string_equal(arg(w, 6), rid);
}

/* A loss after each resubmission (the epoch changing every time: a hand writing it): sent again
 * SHARED_RESUBMITS_MAX times, then refused as garbage in Redis. */
static void test_resubmits_are_bounded_across_losses(void **state) {
        Fixture *f = *state;
        static const char *const epochs[] = { "e2", "e3", "e4", "e5", "e6" };
        assert_int_equal(ELEMENTSOF(epochs), SHARED_RESUBMITS_MAX + 1);
        int cookie;
        char rid[17], arrival[32];
        lose_the_waiters_record(f, false, &cookie, rid, arrival);
        for (size_t i = 0; i < ELEMENTSOF(epochs); i++) {
                usec_t now = S(4 + i);
                positions_gone(f, epochs[i], now);
                if (i == SHARED_RESUBMITS_MAX)
                        break;
                const SharedCall *sub = take_after_ticks(f, SHARED_SCRIPT_SUBMIT, epochs[i], now);
                assert_string_equal(arg(sub, 6), rid);
                assert_string_equal(arg(sub, 13), arrival);
                done(f, sub, reply("ok", (int64_t) now, decision("queued", rid, (int64_t) now, 0, "", 0, 0, EMPTY),
                                   EMPTY, cache_lost(epochs[i])), now, now);
                assert_int_equal(f->n_seen, 1);
        }
        assert_int_equal(f->n_seen, 2);
        assert_int_equal(f->seen[1].verdict, POOL_VERDICT_REFUSED);
        assert_string_equal(f->seen[1].reason, "bad-reply");
}

/* "gone" while the submit sent again is out (a places query sent before it): nothing more is sent. The
 * client hangs up meanwhile: the rid is withdrawn after the submit, sent or not (Redis said it lost it;
 * that is Redis's word). */
static void test_resubmit_races_the_clients_cancel(void **state) {
        (void) state;
        for (int sent = 0; sent < 2; sent++) {
                Fixture *f = fixture_new(false);
                int cookie;
                char rid[17], arrival[32];
                const char *epoch = lose_the_waiters_record(f, true, &cookie, rid, arrival);
                positions_gone(f, epoch, S(4));
                const SharedCall *sub = NULL;
                if (sent) {
                        sub = take_after_ticks(f, SHARED_SCRIPT_SUBMIT, epoch, S(4));
                        positions_gone(f, epoch, S(5)); /* asked before the submit ran */
                        assert_int_equal(f->n_seen, 1);
                }
                f->pool->ops->cancel_try(f->pool, &cookie, S(5));
                if (sent)
                        done(f, sub, reply("ok", (int64_t) S(5), decision("queued", rid, (int64_t) S(5), 0, "", 0, 0,
                                                                          EMPTY), EMPTY, cache_lost(epoch)),
                             S(5), S(5));
                const SharedCall *w = take_after_ticks(f, SHARED_SCRIPT_WITHDRAW, epoch, S(5));
                assert_string_equal(arg(w, 6), rid);
                no_call(f);
                assert_int_equal(f->n_seen, 1); /* cancelled: no decision for it */
                fixture_free(f);
        }
}

static void test_status_snapshot_from_the_cache(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        PoolSnapshot snap;
        assert_int_equal(f->pool->ops->snapshot(f->pool, &snap), -ENODATA);
        f->pool->ops->run(f->pool, S(1) + 1);
        const SharedCall *c = take(f, SHARED_SCRIPT_POSITIONS);
        assert_string_equal(arg(c, 6), "status");
        assert_int_equal(c->argc, 7);
        RespValue holders = arr(2,
                                arr(8, str(NODE), str("runner-1"), str("0000000000000001"), str("ci"), num(5),
                                    num(S(1)), arr(1, num(0)), EMPTY),
                                arr(8, str("ffff"), str("runner-2"), str("0000000000000009"), str("ci"), num(6),
                                    num(S(1)), arr(1, num(1)), EMPTY));
        RespValue waiters = arr(1, arr(7, str("ffff"), str("runner-2"), str("000000000000000a"), str("ci"), num(2),
                                       num(S(1)), num(0)));
        done(f, c, reply("ok", S(1), arr(3, holders, waiters, num(1)), EMPTY, cache(2, 1, 0, -1, "")), S(1), S(1));
        f->pool->ops->run(f->pool, S(1) + S(1) / 2);
        no_call(f); /* at most one a second */
        assert_int_equal(f->pool->ops->snapshot(f->pool, &snap), 0);
        assert_int_equal(snap.n_holders, 2);
        assert_true(snap.holders[0].own);
        assert_false(snap.holders[1].own);
        assert_string_equal(snap.holders[1].node, "runner-2");
        assert_int_equal(snap.holders[1].token, 6);
        assert_int_equal(snap.holders[1].slots[0], 1);
        assert_int_equal(snap.n_waiters, 1);
        assert_int_equal(snap.waiters[0].n_slots, 2);
        assert_int_equal(snap.waiting, 1);
        assert_int_equal(snap.age, S(1) / 2 - 1); /* from the ask: Redis as of then or later */
        assert_int_equal(snap.at, S(1) + 1);
        /* Nobody asks for 30 s: the fetches stop. */
        f->pool->ops->run(f->pool, S(2) + 2);
        c = take(f, SHARED_SCRIPT_POSITIONS);
        done(f, c, reply("ok", S(1), arr(3, EMPTY, EMPTY, num(0)), EMPTY, cache(0, 0, 0, -1, "")), S(2), S(2));
        tick_ok(f, S(2), S(2));
        f->pool->ops->run(f->pool, S(40));
        c = take(f, SHARED_SCRIPT_TICK);
        no_call(f);
}

/* Status wants a snapshot asked for after it came: one is fetched at once (not at the next second), a
 * fetch already out is waited for, and one asked for before the call is not enough. A pool that does not
 * serve fetches nothing: its last snapshot is all there is. */
static void test_refresh_snapshot_asks_after_the_call(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        assert_int_equal(f->pool->ops->refresh_snapshot(f->pool, S(2), S(2)), 1);
        const SharedCall *c = take(f, SHARED_SCRIPT_POSITIONS);
        assert_string_equal(arg(c, 6), "status");
        assert_int_equal(f->pool->ops->refresh_snapshot(f->pool, S(2), S(2) + 5), 1); /* it is out */
        no_call(f);
        done(f, c, reply("ok", S(2), arr(3, EMPTY, EMPTY, num(0)), EMPTY, cache(0, 0, 0, -1, "")), S(2) + 10, S(2) + 10);
        assert_int_equal(f->pool->ops->refresh_snapshot(f->pool, S(2), S(2) + 10), 0);
        PoolSnapshot snap;
        assert_int_equal(f->pool->ops->snapshot(f->pool, &snap), 0);
        assert_int_equal(snap.at, S(2));
        /* A later call: that snapshot was asked for before it. */
        assert_int_equal(f->pool->ops->refresh_snapshot(f->pool, S(2) + 20, S(2) + 20), 1);
        c = take(f, SHARED_SCRIPT_POSITIONS);
        assert_string_equal(arg(c, 6), "status");
        pool_shared_link_down(f->pool, S(3));
        assert_int_equal(f->pool->ops->refresh_snapshot(f->pool, S(3), S(3)), 0);
}

/* Status shows this node's own waiters' places beside the snapshot's: the snapshot's fetch asks for their
 * places first (the round robin's page), so that a place it shows is not a heartbeat old (an urgent
 * request queued since, ahead of it, not counted). */
static void test_a_status_fetch_asks_for_own_places_first(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookie;
        char rid[17];
        queued(f, &cookie, S(1), rid);
        size_t n_queued;
        assert_int_equal(f->pool->ops->position(f->pool, f->seen[0].waiter, &n_queued), 3);
        assert_int_equal(f->pool->ops->refresh_snapshot(f->pool, S(1) + 10, S(1) + 10), 1);
        const SharedCall *c = take(f, SHARED_SCRIPT_POSITIONS);
        assert_string_equal(arg(c, 6), "pos");
        assert_int_equal(c->argc, 8);
        assert_string_equal(arg(c, 7), rid);
        /* Two urgent requests queued ahead of it since its submit: 5 of 6 now. */
        done(f, c, reply("ok", S(1), arr(1, arr(3, str("queued"), num(5), num(6))), EMPTY, cache(2, 6, 0, -1, "")),
             S(1) + 20, S(1) + 20);
        assert_int_equal(f->pool->ops->position(f->pool, f->seen[0].waiter, &n_queued), 5);
        assert_int_equal(n_queued, 6);
        c = take(f, SHARED_SCRIPT_POSITIONS);
        assert_string_equal(arg(c, 6), "status");
        no_call(f);
        done(f, c, reply("ok", S(1), arr(3, EMPTY, EMPTY, num(6)), EMPTY, cache(2, 6, 0, -1, "")), S(1) + 30,
             S(1) + 30);
        /* A second on, while Status is watched: the status fetch and the heartbeat fall in one run. Its page of
         * places goes once, ahead of the status call, not again after the tick. */
        f->pool->ops->run(f->pool, S(3));
        c = take(f, SHARED_SCRIPT_POSITIONS);
        assert_string_equal(arg(c, 6), "pos");
        const SharedCall *st = take(f, SHARED_SCRIPT_POSITIONS);
        assert_string_equal(arg(st, 6), "status");
        take(f, SHARED_SCRIPT_TICK);
        no_call(f);
}

static void test_next_wakeup_is_never_left_in_the_past(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        assert_int_equal(f->pool->ops->next_wakeup(f->pool), S(2)); /* the heartbeat */
        f->pool->ops->run(f->pool, S(2));
        assert_int_equal(f->pool->ops->next_wakeup(f->pool), USEC_INFINITY);
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        assert_int_equal(f->pool->ops->next_wakeup(f->pool), USEC_INFINITY);
        /* The pool has something due at once (unsettled work): reported, and run sends one tick only. */
        done(f, c, reply("ok", S(2), tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, cache(0, 0, 0, S(2), "")), S(2), S(2));
        assert_true(f->pool->ops->next_wakeup(f->pool) <= S(2));
        f->pool->ops->run(f->pool, S(2));
        assert_int_equal(f->pool->ops->next_wakeup(f->pool), USEC_INFINITY);
        f->pool->ops->run(f->pool, S(2));
        take(f, SHARED_SCRIPT_TICK);
        no_call(f);
}

static void test_info_and_congestion_from_the_cache(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        f->pool->ops->run(f->pool, S(2));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        RespValue events = arr(1, arr(4, str("congestion"), num(S(2) - 10), num(S(9)), num(1)));
        RespValue notices = arr(1, arr(5, str("node-expired"), str("ffff"), str("runner-9"), num(3), num(4)));
        RespValue r = arr(6, str("ok"), num(S(2)), tick_body("ok", EMPTY, 0, 0, 0, ""), events,
                          cache(2, 5, 1, -1, ""), notices);
        done(f, c, r, S(2), S(2));
        assert_int_equal(f->n_seen, 1);
        assert_int_equal(f->seen[0].verdict, POOL_VERDICT_CONGESTION);
        assert_true(f->seen[0].congested);
        PoolInfo info;
        f->pool->ops->info(f->pool, S(3), &info);
        assert_true(info.congested);
        assert_int_equal(info.n_nodes, 2);
        assert_int_equal(info.in_use, 0);    /* this node's own */
        assert_int_equal(info.cache_age, S(1));
        assert_int_equal(info.next_token, 101);
        SharedNotice n;
        assert_true(pool_shared_pop_notice(f->pool, &n));
        assert_int_equal(n.type, SHARED_NOTICE_NODE_EXPIRED);
        assert_string_equal(n.node, "runner-9");
        assert_int_equal(n.freed_leases, 3);
        assert_int_equal(n.freed_waiters, 4);
        shared_notice_done(&n);
        /* Another node's call flipped it back: the cache says so. */
        f->pool->ops->run(f->pool, S(3));
        c = take(f, SHARED_SCRIPT_TICK);
        done(f, c, reply("ok", S(3), tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, cache(0, 0, 0, -1, "")), S(3), S(3));
        assert_int_equal(f->n_seen, 2);
        assert_false(f->seen[1].congested);
}

static void test_unregistered_registers_again(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookie;
        assert_int_equal(submit(f, &cookie, 1, true, S(2)), 0);
        const SharedCall *c = take(f, SHARED_SCRIPT_SUBMIT);
        char rid[17];
        snprintf(rid, sizeof rid, "%s", arg(c, 6));
        RespValue r = arr(6, str("unregistered"), num(0), EMPTY, EMPTY, EMPTY, EMPTY);
        done(f, c, r, S(2), S(2));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_REGISTERING);
        /* Not refused (it was, "backend"): the same request goes again, after the registering tick. */
        assert_int_equal(f->n_seen, 0);
        tick_ok(f, S(3), S(3));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_UP);
        for (unsigned i = 1; i < SHARED_RESUBMITS_MAX; i++) {
                c = take(f, SHARED_SCRIPT_SUBMIT);
                assert_string_equal(arg(c, 6), rid);
                done(f, c, r, S(3 + i), S(3 + i));
                assert_int_equal(f->n_seen, 0);
                tick_ok(f, S(3 + i), S(3 + i));
        }
        /* A Redis that says so every time is not followed forever: the last answer refuses it. */
        c = take(f, SHARED_SCRIPT_SUBMIT);
        assert_string_equal(arg(c, 6), rid);
        done(f, c, r, S(9), S(9));
        assert_int_equal(f->n_seen, 1);
        assert_string_equal(f->seen[0].reason, "backend");
        take(f, SHARED_SCRIPT_TICK);
        no_call(f);
}

/* SPEC §3.6 on a shared pool (brokerd/lua/README, "Members' lives"): the quarantine rules are in the canon;
 * every reply's cache says who is quarantined, and this node mirrors it for Status; a notice is this node's
 * to tell (a MEMBER decision). What Redis says is untrusted: an entry that is not one is dropped and counted. */
static void test_quarantines_from_replies_hostile_entries_dropped(void **state) {
        Fixture *f = *state;
        char *members[] = { (char *) "a", (char *) "b", NULL };
        PoolConfig pc = { .name = (char *) "grid", .limit = 2, .max_queue = -1, .members = members, .n_members = 2,
                          .quarantine_exit_codes = { UINT64_C(1) << 3 | UINT64_C(1) << 4 },
                          .quarantine_exit_codes_set = true, .quarantine_after = 2 };
        PoolLaneRule rules[] = { { .lane = "ci", .priority = 0, .max_in_use = -1 } };
        assert_int_equal(pool_configure(f->pool, &pc, rules, 1, S(1)), 0);
        pool_shared_link_up(f->pool, "run1", S(1));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        assert_non_null(strstr(arg(c, 7), "\nquarantine-after=2\nquarantine-exit-codes=3,4\n"));
        RespValue life = arr(6,
                             arr(6, str("b"), num(S(1)), str("job-9"), num(3), str("node-b"), str("")),
                             arr(6, str("b"), num(S(1)), str("twice"), num(4), str("x"), str("")),
                             arr(6, str("zz"), num(0), str(""), num(-1), str(""), str("")),
                             arr(2, str("a"), num(0)),
                             arr(6, str("a"), str("x"), str(""), num(-1), str(""), str("")),
                             num(7));
        RespValue cache14 = arr(14, num(0), num(0), num(0), num(0), num(0), num(-1), num(100), str("e1"), num(0),
                                str(""), num(2), str(""), EMPTY, life);
        RespValue notices = arr(3,
                                arr(7, str("quarantined"), str("b"), num(S(1)), str("job-9"), num(3), str("node-b"), str("")),
                                arr(7, str("quarantined"), str("zz"), num(S(1)), str(""), num(3), str(""), str("")),
                                arr(7, str("restored"), str("a"), num(S(1)), str("bell\a"), num(-1), str(""), str("")));
        RespValue r = arr(6, str("ok"), num(S(1)), tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, cache14, notices);
        done(f, c, r, S(1), S(1));
        PoolInfo info;
        f->pool->ops->info(f->pool, S(2), &info);
        assert_int_equal(info.n_life, 2);
        assert_string_equal(info.life[0].member, "a");
        assert_false(info.life[0].quarantined);
        assert_true(info.life[1].quarantined);
        assert_string_equal(info.life[1].job, "job-9");
        assert_int_equal(info.life[1].exit_status, 3);
        assert_string_equal(info.life[1].node, "node-b");
        assert_null(info.life[1].reason);
        assert_true(info.life[1].since <= S(1)); /* the pool clock mapped by the round trip */
        assert_int_equal(info.bad_input, 3); /* the list (once a reply), zz's notice, a's job */
        /* b's quarantine and a's restore (its job with a control character: none); zz is nobody's. */
        size_t n = 0;
        for (size_t i = 0; i < f->n_seen; i++)
                n += f->seen[i].verdict == POOL_VERDICT_MEMBER;
        assert_int_equal(n, 2);
        /* A reply that lists nobody: b is restored in the mirror. A reply without the list (scripts from
         * before) changes nothing. */
        f->pool->ops->run(f->pool, S(3));
        c = take(f, SHARED_SCRIPT_TICK);
        RespValue none = arr(14, num(0), num(0), num(0), num(0), num(0), num(-1), num(100), str("e1"), num(0), str(""),
                             num(2), str(""), EMPTY, EMPTY);
        done(f, c, reply("ok", S(3), tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, none), S(3), S(3));
        f->pool->ops->info(f->pool, S(3), &info);
        assert_false(info.life[1].quarantined);
        assert_null(info.life[1].job);
        /* The list as the scripts send an empty one (nil): b, quarantined again, is restored the same way,
         * and nothing is bad input. */
        f->pool->ops->run(f->pool, S(4));
        c = take(f, SHARED_SCRIPT_TICK);
        done(f, c, reply("ok", S(4), tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, cache14), S(4), S(4));
        f->pool->ops->info(f->pool, S(4), &info);
        assert_true(info.life[1].quarantined);
        uint64_t bad = info.bad_input;
        f->pool->ops->run(f->pool, S(5));
        c = take(f, SHARED_SCRIPT_TICK);
        RespValue nil = arr(15, num(0), num(0), num(0), num(0), num(0), num(-1), num(100), str("e1"), num(0), str(""),
                            num(2), str(""), NIL, NIL, NIL);
        done(f, c, reply("ok", S(5), tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, nil), S(5), S(5));
        f->pool->ops->info(f->pool, S(5), &info);
        assert_false(info.life[1].quarantined);
        assert_int_equal(info.bad_input, bad); /* nil is none, not a malformed list */
}

/* n members rig-0 … rig-{n-1}, each once, listed in an order that is not their names'. */
static char **big_members(size_t n) {
        char **members = calloc(n + 1, sizeof(char *));
        assert_non_null(members);
        for (size_t i = 0; i < n; i++)
                assert_true(asprintf(&members[i], "rig-%zu", i * 7919 % n) > 0);
        return members;
}

/* A pool of 2,000 members listed in an order that is not their names': a reply's quarantine list naming 500 of
 * them, in yet another order, maps each to its member by name (a binary search, member_index()); a name that
 * extends or cuts one is no member, dropped and counted. */
static void test_quarantine_list_of_a_big_pool_found_by_name(void **state) {
        enum { N = 2000, Q = 500 };
        Fixture *f = *state;
        char **members = big_members(N);
        PoolConfig pc = { .name = (char *) "grid", .limit = N, .max_queue = -1, .members = members, .n_members = N,
                          .quarantine_exit_codes = { UINT64_C(1) << 3 }, .quarantine_exit_codes_set = true,
                          .quarantine_after = 2 };
        PoolLaneRule rules[] = { { .lane = "ci", .priority = 0, .max_in_use = -1 } };
        assert_int_equal(pool_configure(f->pool, &pc, rules, 1, S(1)), 0);
        pool_shared_link_up(f->pool, "run1", S(1));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);

        static char jobs[Q][16];
        static const char *const strangers[] = { "rig-19990", "rig-", "rig-01", "Rig-1" };
        RespValue *entries = calloc(Q + ELEMENTSOF(strangers), sizeof(RespValue)),
                  *fields = calloc((Q + ELEMENTSOF(strangers)) * 6, sizeof(RespValue));
        assert_non_null(entries);
        assert_non_null(fields);
        for (size_t k = 0; k < Q + ELEMENTSOF(strangers); k++) {
                size_t i = N - 1 - 4 * k; /* from the end, every fourth */
                RespValue *e = fields + 6 * k;
                if (k < Q) {
                        snprintf(jobs[k], sizeof jobs[k], "job-%zu", i);
                        e[0] = str(members[i]);
                        e[2] = str(jobs[k]);
                } else {
                        e[0] = str(strangers[k - Q]);
                        e[2] = str("");
                }
                e[1] = num(S(1));
                e[3] = num(3);
                e[4] = str("node-b");
                e[5] = str("");
                entries[k] = (RespValue) { .type = RESP_ARRAY, .elements = e, .n = 6 };
        }
        RespValue life = { .type = RESP_ARRAY, .elements = entries, .n = Q + ELEMENTSOF(strangers) };
        RespValue cache14 = arr(14, num(0), num(0), num(0), num(0), num(0), num(-1), num(100), str("e1"), num(0),
                                str(""), num(2), str(""), EMPTY, life);
        done(f, c, arr(6, str("ok"), num(S(1)), tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, cache14, EMPTY), S(1),
             S(1));
        PoolInfo info;
        f->pool->ops->info(f->pool, S(2), &info);
        assert_int_equal(info.n_life, N);
        size_t quarantined = 0;
        for (size_t i = 0; i < N; i++) {
                bool listed = (N - 1 - i) % 4 == 0 && (N - 1 - i) / 4 < Q;
                assert_string_equal(info.life[i].member, members[i]);
                assert_int_equal(info.life[i].quarantined, listed);
                if (listed) {
                        char job[16];
                        snprintf(job, sizeof job, "job-%zu", i);
                        assert_string_equal(info.life[i].job, job);
                        quarantined++;
                }
        }
        assert_int_equal(quarantined, Q);
        assert_int_equal(info.bad_input, 1); /* the list, once a reply */
        free(fields);
        free(entries);
        strv_free(members);
}

/* Pool grid, members a and b, its link up at S(1): its first tick, called. */
static const SharedCall *members_pool_up(Fixture *f) {
        char *members[] = { (char *) "a", (char *) "b", NULL };
        PoolConfig pc = { .name = (char *) "grid", .limit = 2, .max_queue = -1, .members = members, .n_members = 2 };
        PoolLaneRule rules[] = { { .lane = "ci", .priority = 0, .max_in_use = -1 } };
        assert_int_equal(pool_configure(f->pool, &pc, rules, 1, S(1)), 0);
        pool_shared_link_up(f->pool, "run1", S(1));
        return take(f, SHARED_SCRIPT_TICK);
}

/* A quarantine an older node wrote to Redis may carry C1 characters and U+2028/U+2029 in its job and reason (a
 * node maps them now, conf_text_sanitize()): not bad input, but mapped as this node maps them, so that Status and
 * the journal get one line of text. C0 stays bad input (above). */
static void test_quarantine_texts_from_replies_are_one_line(void **state) {
        Fixture *f = *state;
        const SharedCall *c = members_pool_up(f);
        RespValue life = arr(1, arr(6, str("b"), num(S(1)), str("nel\xc2\x85" "csi\xc2\x9b" "[1m ls\xe2\x80\xa8" "ok\xc2\xa0"),
                                    num(3), str("node-b"), str("ps\xe2\x80\xa9" "r")));
        RespValue cache14 = arr(14, num(0), num(0), num(0), num(0), num(0), num(-1), num(100), str("e1"), num(0),
                                str(""), num(2), str(""), EMPTY, life);
        RespValue r = arr(6, str("ok"), num(S(1)), tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, cache14, EMPTY);
        done(f, c, r, S(1), S(1));
        PoolInfo info;
        f->pool->ops->info(f->pool, S(2), &info);
        assert_true(info.life[1].quarantined);
        assert_string_equal(info.life[1].job, "nel?csi?[1m ls?ok\xc2\xa0"); /* a no-break space is text */
        assert_string_equal(info.life[1].reason, "ps?r");
        assert_int_equal(info.bad_input, 0);
}

/* SPEC §3.6, slotbroker_member_*_total (brokerd(8) METRICS): this node's counts of a member survive reloads,
 * one that drops the member and another that lists it again too, as a local pool's do: counters that went
 * back to 0 while brokerd ran would be read by Prometheus as a restart. */
static void test_member_counts_survive_a_reload_without_the_member(void **state) {
        Fixture *f = *state;
        char *ab[] = { (char *) "a", (char *) "b", NULL }, *a[] = { (char *) "a", NULL };
        PoolConfig pc = { .name = (char *) "grid", .limit = 2, .max_queue = -1, .members = ab, .n_members = 2 };
        PoolLaneRule rules[] = { { .lane = "ci", .priority = 0, .max_in_use = -1 } };
        assert_int_equal(pool_configure(f->pool, &pc, rules, 1, S(1)), 0);
        const EngineMemberUse use = { .grants = 5, .held = S(7), .quarantines = 2 };
        assert_int_equal(f->pool->ops->set_use(f->pool, "b", &use), 0);
        PoolConfig only_a = pc;
        only_a.limit = 1;
        only_a.members = a;
        only_a.n_members = 1;
        assert_int_equal(pool_configure(f->pool, &only_a, rules, 1, S(2)), 0);
        EngineMemberUse u;
        assert_int_equal(f->pool->ops->get_use(f->pool, "b", &u), -ENOENT);
        assert_int_equal(pool_configure(f->pool, &pc, rules, 1, S(3)), 0);
        assert_int_equal(f->pool->ops->get_use(f->pool, "b", &u), 0);
        assert_int_equal(u.grants, 5);
        assert_int_equal(u.held, S(7));
        assert_int_equal(u.quarantines, 2);
        assert_int_equal(f->pool->ops->get_use(f->pool, "a", &u), 0);
        assert_int_equal(u.grants, 0);
}

/* The same across 40 reloads that each list a random part of 40 names in a random order: every member's counts
 * are the last ones set for its name, through reloads that dropped it, and a name never counted has none. */
static void test_member_counts_follow_their_names_across_reorders(void **state) {
        Fixture *f = *state;
        enum { NAMES = 40 };
        char names[NAMES][8];
        EngineMemberUse model[NAMES] = {};
        uint64_t rng = 99;
        for (size_t i = 0; i < NAMES; i++)
                snprintf(names[i], sizeof names[i], "u%02zu", i);
        PoolLaneRule rules[] = { { .lane = "ci", .priority = 0, .max_in_use = -1 } };
        for (size_t round = 0; round < 40; round++) {
                size_t order[NAMES];
                for (size_t i = 0; i < NAMES; i++)
                        order[i] = i;
                for (size_t i = NAMES - 1; i > 0; i--) {
                        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
                        size_t j = (size_t) (rng >> 33) % (i + 1), t = order[i];
                        order[i] = order[j];
                        order[j] = t;
                }
                rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
                size_t n = 1 + (size_t) (rng >> 33) % NAMES;
                char *members[NAMES + 1] = {};
                bool listed[NAMES] = {};
                for (size_t i = 0; i < n; i++) {
                        members[i] = names[order[i]];
                        listed[order[i]] = true;
                }
                PoolConfig pc = { .name = (char *) "grid", .limit = (unsigned) n, .max_queue = -1, .members = members,
                                  .n_members = n };
                assert_int_equal(pool_configure(f->pool, &pc, rules, 1, S(1 + round)), 0);
                for (size_t i = 0; i < NAMES; i++) {
                        EngineMemberUse u;
                        if (!listed[i]) {
                                assert_int_equal(f->pool->ops->get_use(f->pool, names[i], &u), -ENOENT);
                                continue;
                        }
                        assert_int_equal(f->pool->ops->get_use(f->pool, names[i], &u), 0);
                        assert_int_equal(u.grants, model[i].grants);
                        assert_int_equal(u.held, model[i].held);
                        assert_int_equal(u.quarantines, model[i].quarantines);
                }
                /* A third of the members counted anew. */
                for (size_t i = 0; i < n; i += 3) {
                        size_t k = order[i];
                        model[k] = (EngineMemberUse) { .grants = round * 100 + k + 1, .held = S(round + k),
                                                       .quarantines = (unsigned) (round % 4) };
                        assert_int_equal(f->pool->ops->set_use(f->pool, names[k], &model[k]), 0);
                }
        }
}

/* The cache's drains ([15]) and the drain notices with hostile content (brokerd/lua/README, "Drains with a
 * reason"): entries that are not one are dropped and counted, a member listed twice is one drain, numbers at
 * the ends of int64 are mapped to the node's clock without overflow (the pool clock 500 µs ahead of it). */
static void test_drains_from_replies_hostile_entries_dropped(void **state) {
        Fixture *f = *state;
        const SharedCall *c = members_pool_up(f);
        static char big[1 << 16];
        memset(big, 'w', sizeof big - 1);
        RespValue drains = arr(10,
                               arr(6, str(""), num(S(1)), str("uid 0"), str("why"), num(-1), str("n1")),
                               arr(6, str("a"), num(S(1)), str("uid 1"), str("r"), num(S(9)), str("n1")),
                               arr(6, str("a"), num(S(1)), str("twice"), str(""), num(-1), str("n1")),
                               arr(6, str("b"), num(INT64_MIN), str(big), str("r\n"), num(INT64_MAX), str("")),
                               arr(6, str("zz"), num(S(1)), str(""), str(""), num(-1), str("")),
                               arr(6, num(7), num(S(1)), str(""), str(""), num(-1), str("")),
                               arr(6, str("b"), str("x"), str(""), str(""), num(-1), str("")),
                               arr(2, str("a"), num(0)),
                               num(7),
                               str(big));
        RespValue cache15 = arr(15, num(0), num(0), num(0), num(0), num(1), num(-1), num(100), str("e1"), num(0),
                                str(""), num(2), str(""), EMPTY, EMPTY, drains);
        RespValue notices = arr(6,
                                arr(7, str("drained"), str("zz"), num(S(1)), str(""), str(""), num(-1), num(0)),
                                arr(7, str("drained"), num(3), num(S(1)), str(""), str(""), num(-1), num(0)),
                                arr(1, str("undrained")),
                                arr(7, str("undrained"), str("a"), num(INT64_MIN), str(big), str("r"), num(INT64_MAX),
                                    num(1)),
                                arr(7, str("drained"), str("b"), num(INT64_MAX), num(1), arr(0), num(INT64_MIN), str("x")),
                                arr(7, str("quarantined"), str("a"), num(INT64_MIN), num(1), num(INT64_MAX), arr(0), str("")));
        RespValue r = arr(6, str("ok"), num(S(1) + 500), tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, cache15,
                          notices);
        done(f, c, r, S(1), S(1));
        PoolInfo info;
        f->pool->ops->info(f->pool, S(2), &info);
        assert_int_equal(info.n_drains, 3); /* the pool, a (once), b */
        bool seen_a = false;
        for (size_t i = 0; i < info.n_drains; i++) {
                const EngineDrainInfo *d = &info.drains[i];
                assert_true(d->since <= S(2));
                assert_true(d->until == USEC_INFINITY || d->until <= USEC_INFINITY - 1);
                if (d->member && streq(d->member, "a")) {
                        assert_false(seen_a);
                        seen_a = true;
                        assert_string_equal(d->who, "uid 1");
                }
                if (d->member && streq(d->member, "b")) {
                        assert_null(d->who);    /* over 1024 bytes */
                        assert_null(d->reason); /* a control character */
                }
        }
        assert_true(seen_a);
        /* Three notices of members this pool has: emitted, at an instant no later than the reply's. */
        size_t n = 0;
        for (size_t i = 0; i < f->n_seen; i++)
                if (f->seen[i].verdict == POOL_VERDICT_DRAIN || f->seen[i].verdict == POOL_VERDICT_MEMBER) {
                        assert_true(f->seen[i].at <= S(1));
                        n++;
                }
        assert_int_equal(n, 3);
        assert_true(info.bad_input >= 4);
        /* An empty list goes as nil: no drain left, and nil is no bad input. */
        uint64_t bad = info.bad_input;
        f->pool->ops->run(f->pool, S(3));
        c = take(f, SHARED_SCRIPT_TICK);
        RespValue none = arr(15, num(0), num(0), num(0), num(0), num(0), num(-1), num(100), str("e1"), num(0),
                             str(""), num(2), str(""), NIL, NIL, NIL);
        done(f, c, reply("ok", S(3), tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, none), S(3), S(3));
        f->pool->ops->info(f->pool, S(3), &info);
        assert_int_equal(info.n_drains, 0);
        assert_null(info.drains);
        assert_int_equal(info.bad_input, bad);
}

/* A pool of 2,000 members: a reply's drains naming 1,000 of them, each a second time further on, and the pool
 * twice: the first listing of each is the drain (its who kept), the others dropped and counted. */
static void test_drains_of_a_big_pool_each_once(void **state) {
        enum { N = 2000, D = 1000 };
        Fixture *f = *state;
        char **members = big_members(N);
        PoolConfig pc = { .name = (char *) "grid", .limit = N, .max_queue = -1, .members = members, .n_members = N };
        PoolLaneRule rules[] = { { .lane = "ci", .priority = 0, .max_in_use = -1 } };
        assert_int_equal(pool_configure(f->pool, &pc, rules, 1, S(1)), 0);
        pool_shared_link_up(f->pool, "run1", S(1));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);

        enum { ENTRIES = 2 * D + 2 };
        static char who[ENTRIES][16];
        RespValue *entries = calloc(ENTRIES, sizeof(RespValue)), *fields = calloc(ENTRIES * 6, sizeof(RespValue));
        assert_non_null(entries);
        assert_non_null(fields);
        for (size_t k = 0; k < ENTRIES; k++) {
                /* Members 2j from the end, then the same again in the other order; the pool at 0 and D + 1. */
                RespValue *e = fields + 6 * k;
                size_t j = k <= D ? k : ENTRIES - k;
                bool pool = k == 0 || k == D + 1;
                snprintf(who[k], sizeof who[k], "uid %zu", k);
                e[0] = str(pool ? "" : members[N - 2 * j]);
                e[1] = num(S(1));
                e[2] = str(who[k]);
                e[3] = str("");
                e[4] = num(-1);
                e[5] = str("n1");
                entries[k] = (RespValue) { .type = RESP_ARRAY, .elements = e, .n = 6 };
        }
        RespValue drains = { .type = RESP_ARRAY, .elements = entries, .n = ENTRIES };
        RespValue cache15 = arr(15, num(0), num(0), num(0), num(0), num(1), num(-1), num(100), str("e1"), num(0),
                                str(""), num(2), str(""), EMPTY, EMPTY, drains);
        done(f, c, arr(6, str("ok"), num(S(1)), tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, cache15, EMPTY), S(1),
             S(1));
        PoolInfo info;
        f->pool->ops->info(f->pool, S(2), &info);
        assert_int_equal(info.n_drains, D + 1);
        for (size_t k = 0; k <= D; k++) {
                const EngineDrainInfo *d = &info.drains[k];
                if (k == 0)
                        assert_null(d->member);
                else
                        assert_string_equal(d->member, members[N - 2 * k]);
                assert_string_equal(d->who, who[k]);
        }
        assert_int_equal(info.bad_input, 1);
        free(fields);
        free(entries);
        strv_free(members);
}

/* A lane's queue-timeout is one of the rules nodes must agree on (SPEC §11): it is in the canon. */
static void test_canon_carries_lane_budgets(void **state) {
        Fixture *f = *state;
        PoolConfig pc = { .name = (char *) "grid", .limit = 2, .max_queue = -1 };
        PoolLaneRule rules[] = {
                { .lane = "ci", .priority = 0, .max_in_use = -1, .budget_set = true, .budget = S(90) },
                { .lane = "nightly", .priority = 0, .max_in_use = -1, .budget_set = true, .budget = USEC_INFINITY },
        };
        assert_int_equal(pool_configure(f->pool, &pc, rules, 2, S(1)), 0);
        pool_shared_link_up(f->pool, "run1", S(1));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(c, 7), "backend-node-ttl=30000000\nlane.ci.max-in-use=-1\nlane.ci.priority=0\n"
                                       "lane.ci.queue-timeout=90000000\nlane.ci.reserve=0\n"
                                       "lane.nightly.max-in-use=-1\nlane.nightly.priority=0\n"
                                       "lane.nightly.queue-timeout=-1\nlane.nightly.reserve=0\nlimit=2\n");
}

/* Labels and a lane's labels= are rules too (SPEC §3.5), as sets: sorted, a label naming no member left out. A
 * request with a selector carries its canon as submit's ARGV[14]; one without, none (brokerd/lua/README). */
static void test_canon_carries_labels_and_submit_its_selector(void **state) {
        Fixture *f = *state;
        char *members[] = { (char *) "c", (char *) "b", (char *) "a", NULL };
        char *arm64[] = { (char *) "b", (char *) "a", NULL };
        char *none[] = { NULL };
        PoolLabel labels[] = { { .name = (char *) "arm64", .members = arm64 }, { .name = (char *) "gpu", .members = none } };
        PoolConfig pc = { .name = (char *) "grid", .limit = 3, .members = members, .n_members = 3, .max_queue = -1,
                          .labels = labels, .n_labels = 2 };
        char *lane_labels[] = { (char *) "arm64", (char *) "!flaky", NULL };
        PoolLaneRule rules[] = { { .lane = "ci", .priority = 0, .max_in_use = -1, .labels = lane_labels } };
        assert_int_equal(pool_configure(f->pool, &pc, rules, 1, S(1)), 0);
        /* The engine resolves selectors against the pool's labels. */
        assert_int_equal(pool_selector_capacity(f->pool, &(Selector) { .terms = (char *[]) { (char *) "arm64", NULL } }), 2);
        pool_shared_link_up(f->pool, "run1", S(1));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(c, 7), "backend-node-ttl=30000000\nlabel.arm64=a,b\nlane.ci.labels=!flaky,arm64\n"
                                       "lane.ci.max-in-use=-1\nlane.ci.priority=0\nlane.ci.reserve=0\nlimit=3\n"
                                       "members=c,b,a\n");
        done(f, c, reply("ok", S(1), tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, cache(0, 0, 0, -1, "")), S(1), S(1));
        int cookie, plain;
        PoolTry t = {
                .cookie = &cookie, .lane = "ci", .slots = 1, .may_wait = true, .lane_budget = USEC_INFINITY,
                .client_cap = USEC_INFINITY, .arrival = S(2),
                .selector = &(Selector) { .terms = (char *[]) { (char *) "usb3", (char *) "!flaky", NULL }, .member = "a" },
        };
        assert_int_equal(f->pool->ops->submit(f->pool, &t, S(2)), 0);
        c = take(f, SHARED_SCRIPT_SUBMIT);
        assert_int_equal(c->argc, 17);
        assert_string_equal(arg(c, 14), "!flaky usb3 @a");
        assert_int_equal(submit(f, &plain, 1, true, S(2)), 0);
        c = take(f, SHARED_SCRIPT_SUBMIT);
        assert_int_equal(c->argc, 17);
        assert_string_equal(arg(c, 14), "");
}

static void test_manual_clock_passes_now_and_leaves_the_instant_to_run(void **state) {
        Fixture *f = *state;
        /* The engine stands at 1 s; the driver's clock (monotonic, here 1000 s) is not the pool's. */
        f->pool->ops->run(f->pool, S(1));
        pool_shared_link_up(f->pool, "run1", S(1000));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(c, 3), "1000000");
        assert_string_equal(arg(c, 5), "0");   /* a configure's tick leaves the instant open */
        done(f, c, reply("ok", S(1), tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, cache(0, 0, 0, -1, "")), S(1000),
             S(1000));
        int cookie;
        PoolTry t = { .cookie = &cookie, .lane = "ci", .slots = 1, .may_wait = true,
                      .lane_budget = USEC_INFINITY, .client_cap = S(4), .arrival = S(1) + 5 };
        assert_int_equal(f->pool->ops->submit(f->pool, &t, S(2)), 0);
        c = take(f, SHARED_SCRIPT_SUBMIT);
        assert_string_equal(arg(c, 3), "2000000");
        assert_string_equal(arg(c, 5), "0");
        assert_string_equal(arg(c, 12), "4000000");
        assert_string_equal(arg(c, 13), "1000005");
        f->pool->ops->run(f->pool, S(2));
        const SharedCall *tick = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(tick, 3), "2000000");
        assert_string_equal(arg(tick, 5), "1");
        char rid[17];
        snprintf(rid, sizeof rid, "%s", arg(c, 6));
        done(f, c, reply("ok", S(2), decision("queued", rid, S(2), 0, "", 0, 0, EMPTY), EMPTY, cache(2, 1, 0, -1, "")),
             S(2), S(2));
        /* The decision's time is the pool's: the engine's own in this mode. */
        done(f, tick, reply("ok", S(2), tick_body("ok", EMPTY, 1, fnv1a32(rid, 'w'), fnv1a32(rid, 'w'), ""),
                            arr(1, decision("refused", rid, S(2), S(1) - 5, "timeout", 0, 0, EMPTY)),
                            cache(2, 0, 0, -1, "")), S(2), S(2));
        assert_int_equal(f->n_seen, 2);
        assert_int_equal(f->seen[1].verdict, POOL_VERDICT_REFUSED);
        assert_int_equal(f->seen[1].refusal, REFUSAL_TIMEOUT);
        assert_int_equal(f->seen[1].at, S(2));
        assert_int_equal(f->seen[1].wait, S(1) - 5);
}

static void test_manual_clock_has_no_instants_of_its_own(void **state) {
        Fixture *f = *state;
        pool_shared_link_up(f->pool, "run1", S(1000));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        done(f, c, reply("ok", S(1), tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY, cache(0, 0, 0, -1, "")), S(1000),
             S(1000));
        /* Every run() is a heartbeat: nothing due in the pool, no wakeup (an in-process pool has none). */
        assert_int_equal(f->pool->ops->next_wakeup(f->pool), USEC_INFINITY);
        /* The engine settles an earlier instant, then its own, before the first answer: a tick for each. */
        f->pool->ops->run(f->pool, S(2));
        c = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(c, 3), "2000000");
        f->pool->ops->run(f->pool, S(3));
        c = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(c, 3), "3000000");
        assert_string_equal(arg(c, 5), "1");
        no_call(f);
}

static void test_manual_clock_reads_places_after_a_reload(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookie;
        assert_int_equal(submit(f, &cookie, 1, true, S(2)), 0);
        const SharedCall *c = take(f, SHARED_SCRIPT_SUBMIT);
        char rid[17];
        snprintf(rid, sizeof rid, "%s", arg(c, 6));
        done(f, c, reply("ok", S(2), decision("queued", rid, S(2), 0, "", 1, 0, EMPTY), EMPTY, cache(2, 2, 0, -1, "")),
             S(2), S(2));
        /* A new priority moves waiters: the reload's tick, then their places, as after a run(). */
        PoolConfig pc = { .name = (char *) "grid", .limit = 2, .max_queue = -1 };
        PoolLaneRule rules[] = { { .lane = "ci", .priority = 5, .max_in_use = -1 } };
        assert_int_equal(pool_configure(f->pool, &pc, rules, 1, S(3)), 0);
        c = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(c, 5), "0");
        c = take(f, SHARED_SCRIPT_POSITIONS);
        assert_string_equal(arg(c, 6), "pos");
        assert_string_equal(arg(c, 7), rid);
}

static void test_manual_clock_applies_stream_entries_in_reply_order(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookie;
        assert_int_equal(submit(f, &cookie, 1, true, S(2)), 0);
        const SharedCall *c = take(f, SHARED_SCRIPT_SUBMIT);
        char rid[17];
        snprintf(rid, sizeof rid, "%s", arg(c, 6));
        f->pool->ops->run(f->pool, S(2));
        const SharedCall *tick = take(f, SHARED_SCRIPT_TICK);
        /* The tick's grant is read from the stream before either reply (another connection): it waits. */
        RespValue fields = arr(28, str("verdict"), str("granted"), str("rid"), str(rid), str("at"), str("2000000"),
                               str("wait"), str("0"), str("refusal"), str(""), str("reason"), str(""), str("state"),
                               str("none"), str("idle"), str("0"), str("budget"), str("-1"), str("position"), str("0"),
                               str("queued"), str("0"), str("token"), str("7"), str("slots"), str("0"), str("members"),
                               str(""));
        pool_shared_stream_entry(f->pool, "9-1", &fields, S(2));
        assert_int_equal(f->n_seen, 0);
        done(f, c, reply("ok", S(2), decision("queued", rid, S(2), 0, "", 0, 0, EMPTY), EMPTY, cache(0, 1, 0, -1, "9-1")),
             S(2), S(2));
        done(f, tick, reply("ok", S(2), tick_body("ok", EMPTY, 1, fnv1a32(rid, 'l'), fnv1a32(rid, 'l'), ""),
                            arr(1, decision("granted", rid, S(2), 0, "", 0, 7, arr(1, num(0)))),
                            cache(1, 0, 0, -1, "9-1")),
             S(2), S(2));
        /* Queued, then granted, as the calls decided; the entry repeated the grant. */
        assert_int_equal(f->n_seen, 2);
        assert_int_equal(f->seen[0].verdict, POOL_VERDICT_QUEUED);
        assert_int_equal(f->seen[1].verdict, POOL_VERDICT_GRANTED);
        assert_int_equal(f->seen[1].token, 7);
}

static void test_pool_clock_is_mapped_by_the_round_trip(void **state) {
        Fixture *f = *state;
        /* Redis's pool clock reads 1000 s + 2 ms at the midpoint of a 4 ms round trip sent at 1 s here. */
        pool_shared_link_up(f->pool, "run1", S(1));
        f->clock = S(1);
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        done(f, c, reply("ok", S(1000) + MS(2), tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY,
                         cache(0, 0, 0, -1, "")), S(1), S(1) + MS(4));
        PoolInfo info;
        f->pool->ops->info(f->pool, S(2), &info);
        assert_int_equal(info.rtt, MS(4));
        /* The pool's next instant (1001.5 s there), on the local clock, before the heartbeat (2 s). */
        f->pool->ops->run(f->pool, S(1) + MS(4));
        assert_int_equal(f->pool->ops->next_wakeup(f->pool), S(2));
        f->pool->ops->run(f->pool, S(2));
        f->clock = S(2);
        c = take(f, SHARED_SCRIPT_TICK);
        done(f, c, reply("ok", S(1001) + MS(2), tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY,
                         cache(0, 0, 0, S(1001) + MS(500), "")), S(2), S(2) + MS(4));
        assert_int_equal(f->pool->ops->next_wakeup(f->pool), S(2) + MS(500));
        /* A request that arrived 1 s ago (routed on from another pool) keeps its arrival on the pool clock. */
        int cookie;
        PoolTry t = { .cookie = &cookie, .lane = "ci", .slots = 1, .may_wait = true,
                      .lane_budget = USEC_INFINITY, .client_cap = USEC_INFINITY, .arrival = S(2) };
        assert_int_equal(f->pool->ops->submit(f->pool, &t, S(3)), 0);
        f->clock = S(3);
        c = take(f, SHARED_SCRIPT_SUBMIT);
        assert_string_equal(arg(c, 13), "1001000000");
        char rid[17];
        snprintf(rid, sizeof rid, "%s", arg(c, 6));
        done(f, c, reply("ok", S(1002), decision("queued", rid, S(1002), 0, "", 0, 0, EMPTY), EMPTY,
                         cache(2, 1, 0, -1, "")), S(3), S(3));
        /* Granted at pool time 1003 s: 4 s here. */
        RespValue fields = arr(10, str("verdict"), str("granted"), str("rid"), str(rid), str("at"), str("1003000000"),
                               str("token"), str("3"), str("slots"), str("0"));
        pool_shared_stream_entry(f->pool, "5-1", &fields, S(6));
        assert_int_equal(f->seen[1].verdict, POOL_VERDICT_GRANTED);
        assert_int_equal(f->seen[1].at, S(4));
}

static void test_recovery_window_refusal_carries_its_reason(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookie;
        assert_int_equal(submit(f, &cookie, 1, false, S(2)), 0);
        const SharedCall *c = take(f, SHARED_SCRIPT_SUBMIT);
        char rid[17];
        snprintf(rid, sizeof rid, "%s", arg(c, 6));
        RespValue d = arr(14, str("refused"), str(rid), num(S(2)), num(0), str("unavailable"), str("recovery"),
                          str("none"), num(0), num(-1), num(0), num(0), num(0), EMPTY, EMPTY);
        done(f, c, reply("ok", S(2), d, EMPTY, cache(0, 0, 0, S(31), "")), S(2), S(2));
        assert_int_equal(f->n_seen, 1);
        assert_int_equal(f->seen[0].verdict, POOL_VERDICT_REFUSED);
        assert_int_equal(f->seen[0].refusal, REFUSAL_UNAVAILABLE);
        assert_string_equal(f->seen[0].reason, "recovery");
}

static void test_drain_is_a_call(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        assert_int_equal(f->pool->ops->drain(f->pool, "nope", true, S(1)), -ENOENT);
        assert_int_equal(f->pool->ops->drain(f->pool, NULL, true, S(1)), 0);
        PoolInfo info;
        f->pool->ops->info(f->pool, S(1), &info);
        assert_true(info.drained);
        const SharedCall *c = take(f, SHARED_SCRIPT_DRAIN);
        assert_string_equal(arg(c, 6), "");
        assert_string_equal(arg(c, 7), "1");
}

/* A clean stop of brokerd waits (bounded) while the pool gives something back to Redis that it can deliver. */
static void test_giving_back_while_a_withdrawal_can_go_out(void **state) {
        Fixture *f = *state;
        assert_false(pool_shared_giving_back(f->pool));
        bring_up(f, S(1));
        int a, b;
        char rid[17];
        queued(f, &a, S(1), rid);
        assert_false(pool_shared_giving_back(f->pool)); /* a waiter is not a debt: its withdrawal is */
        f->pool->ops->withdraw(f->pool, f->seen[0].waiter, S(2));
        assert_true(pool_shared_giving_back(f->pool));
        const SharedCall *c = take(f, SHARED_SCRIPT_WITHDRAW);
        assert_true(pool_shared_giving_back(f->pool)); /* in flight: not answered yet */
        done(f, c, reply("ok", 2, arr(1, str("withdrawn")), EMPTY, cache(0, 0, 0, -1, "")), S(2), S(2));
        assert_false(pool_shared_giving_back(f->pool));

        /* Unreachable: nothing can be delivered, nothing to wait for (Redis reaps the node after its TTL). */
        queued(f, &b, S(3), rid);
        f->pool->ops->withdraw(f->pool, f->seen[f->n_seen - 1].waiter, S(3));
        pool_shared_link_down(f->pool, S(3));
        assert_false(pool_shared_giving_back(f->pool));
        /* Back: the registering tick goes first, the withdrawal after it on the same link. */
        pool_shared_link_up(f->pool, "run1", S(4));
        assert_true(pool_shared_giving_back(f->pool));
        tick_ok(f, S(4), S(4));
        c = take(f, SHARED_SCRIPT_WITHDRAW);
        assert_string_equal(arg(c, 6), rid);
        done(f, c, reply("ok", 4, arr(1, str("withdrawn")), EMPTY, cache(0, 0, 0, -1, "")), S(4), S(4));
        assert_false(pool_shared_giving_back(f->pool));
}

/* ------------------------------------------------------------------------------- backend-min-replicas */

/* backend-min-replicas=1 with a 250 ms timeout: this node's setting, not a rule (the canon stays the same,
 * so no tick goes to agree on it). */
static void min_replicas_on(Fixture *f) {
        PoolConfig pc = { .name = (char *) "grid", .limit = 2, .max_queue = -1, .backend_min_replicas = 1,
                          .backend_min_replicas_timeout = MS(250) };
        PoolLaneRule rules[] = { { .lane = "ci", .priority = 0, .max_in_use = -1 } };
        assert_int_equal(pool_configure(f->pool, &pc, rules, 1, S(1)), 0);
}

/* The next call, which must be a WAIT for one replica (not a script: no key, no ARGV head). */
static const SharedCall *take_wait(Fixture *f) {
        const SharedCall *c = NULL;
        assert_true(pool_shared_take_call(f->pool, f->clock, &c));
        assert_true(c->wait);
        assert_int_equal(c->n_keys, 0);
        assert_int_equal(c->argc, 3);
        assert_string_equal(arg(c, 0), "WAIT");
        assert_string_equal(arg(c, 1), "1");
        assert_string_equal(arg(c, 2), "250");
        return c;
}

/* The submit's reply grants: the grant is held until WAIT says a replica has the lease. */
static const char *granted_held(Fixture *f, void *cookie, usec_t now, char rid[static 17]) {
        assert_int_equal(submit(f, cookie, 1, true, now), 0);
        const SharedCall *c = take(f, SHARED_SCRIPT_SUBMIT);
        snprintf(rid, 17, "%s", arg(c, 6));
        size_t seen = f->n_seen;
        done(f, c, reply("ok", (int64_t) now, decision("granted", rid, (int64_t) now, 0, "", 0, 7, arr(1, num(0))),
                         EMPTY, cache(1, 0, 0, -1, "")), now, now);
        assert_int_equal(f->n_seen, seen);
        return rid;
}

static void test_min_replicas_grant_is_answered_once_wait_says_enough(void **state) {
        Fixture *f = *state;
        min_replicas_on(f);
        no_call(f);
        bring_up(f, S(1));
        int cookie;
        char rid[17];
        granted_held(f, &cookie, S(1), rid);
        PoolInfo info;
        f->pool->ops->info(f->pool, S(1), &info);
        assert_int_equal(info.in_use, 0);
        assert_int_equal(info.waiting, 1);
        assert_int_equal(info.min_replicas, 1);
        assert_int_equal(info.replicas_acked, -1);
        const SharedCall *c = take_wait(f);
        RespValue one = num(1);
        pool_shared_call_done(f->pool, c->id, 0, &one, S(1), S(1));
        assert_int_equal(f->n_seen, 1);
        assert_int_equal(f->seen[0].verdict, POOL_VERDICT_GRANTED);
        assert_ptr_equal(f->seen[0].cookie, &cookie);
        assert_int_equal(f->seen[0].token, 7);
        f->pool->ops->info(f->pool, S(1), &info);
        assert_int_equal(info.in_use, 1);
        assert_int_equal(info.waiting, 0);
        assert_int_equal(info.replicas_acked, 1);
        no_call(f);
        assert_true(pool_shared_is_settled(f->pool));
}

static void test_min_replicas_too_few_refuse_and_release_the_lease(void **state) {
        Fixture *f = *state;
        min_replicas_on(f);
        bring_up(f, S(1));
        int cookie;
        char rid[17];
        granted_held(f, &cookie, S(1), rid);
        const SharedCall *c = take_wait(f);
        RespValue zero = num(0);
        pool_shared_call_done(f->pool, c->id, 0, &zero, S(2), S(2));
        assert_int_equal(f->n_seen, 1);
        assert_int_equal(f->seen[0].verdict, POOL_VERDICT_REFUSED);
        assert_int_equal(f->seen[0].refusal, REFUSAL_UNAVAILABLE);
        assert_string_equal(f->seen[0].reason, "replicas");
        PoolInfo info;
        f->pool->ops->info(f->pool, S(2), &info);
        assert_int_equal(info.in_use, 0);
        assert_int_equal(info.waiting, 0);
        assert_int_equal(info.replicas_acked, 0);
        /* Redis wrote the lease: it goes back (withdraw releases a lease under the rid). */
        c = take(f, SHARED_SCRIPT_WITHDRAW);
        assert_string_equal(arg(c, 6), rid);
        done(f, c, reply("ok", 3, arr(1, str("released")), EMPTY, cache(0, 0, 0, -1, "")), S(2), S(2));
        /* The fingerprint counts nothing of it any more: Redis's empty one agrees. */
        f->pool->ops->run(f->pool, S(3));
        c = take(f, SHARED_SCRIPT_TICK);
        assert_string_equal(arg(c, 8), "0");
}

static void test_min_replicas_stream_grant_gets_a_write_of_this_node_then_wait(void **state) {
        Fixture *f = *state;
        min_replicas_on(f);
        bring_up(f, S(1));
        int cookie;
        char rid[17];
        queued(f, &cookie, S(1), rid);
        /* Another node's release granted our waiter: its write is not this connection's. */
        RespValue fields = arr(8, str("verdict"), str("granted"), str("rid"), str(rid), str("token"), str("9"),
                               str("slots"), str("1"));
        pool_shared_stream_entry(f->pool, "1-1", &fields, S(2));
        assert_int_equal(f->n_seen, 1);
        /* A heartbeat (it writes) goes first, the WAIT after it. */
        const SharedCall *t = take(f, SHARED_SCRIPT_TICK);
        const SharedCall *w = take_wait(f);
        no_call(f);
        /* The fingerprint counts the lease Redis holds, not the waiter. */
        assert_string_equal(arg(t, 8), "1");
        char x[16];
        snprintf(x, sizeof x, "%" PRIu32, fnv1a32(rid, 'l'));
        assert_string_equal(arg(t, 9), x);
        done(f, t, reply("ok", 2000000, tick_body("ok", EMPTY, 1, fnv1a32(rid, 'l'), fnv1a32(rid, 'l'), ""), EMPTY,
                         cache(1, 0, 0, -1, "")), S(2), S(2));
        assert_int_equal(f->n_seen, 1);
        RespValue one = num(1);
        pool_shared_call_done(f->pool, w->id, 0, &one, S(2), S(2));
        assert_int_equal(f->n_seen, 2);
        assert_int_equal(f->seen[1].verdict, POOL_VERDICT_GRANTED);
        assert_int_equal(f->seen[1].token, 9);
        assert_int_equal(f->seen[1].slot0, 1);
}

static void test_min_replicas_link_down_refuses_the_grants_held(void **state) {
        Fixture *f = *state;
        min_replicas_on(f);
        bring_up(f, S(1));
        int a, b;
        char rid_a[17], rid_b[17];
        granted_held(f, &a, S(1), rid_a);
        uint64_t wait_id = take_wait(f)->id; /* the call is the pool's: freed with the link */
        /* One WAIT out at a time: the second grant's waits behind it. */
        granted_held(f, &b, S(1), rid_b);
        no_call(f);
        pool_shared_link_down(f->pool, S(2));
        assert_int_equal(f->n_seen, 2);
        for (size_t i = 0; i < 2; i++) {
                assert_int_equal(f->seen[i].verdict, POOL_VERDICT_REFUSED);
                assert_string_equal(f->seen[i].reason, "replicas");
        }
        /* The WAIT's late answer (-ECONNRESET) changes nothing. */
        pool_shared_call_done(f->pool, wait_id, -ECONNRESET, NULL, S(2), S(2));
        assert_int_equal(f->n_seen, 2);
        /* Back: the leases are given back after the registering tick; no WAIT is left to send. */
        pool_shared_link_up(f->pool, "run1", S(3));
        tick_ok(f, S(3), S(3));
        const SharedCall *c = take(f, SHARED_SCRIPT_WITHDRAW);
        assert_string_equal(arg(c, 6), rid_a);
        c = take(f, SHARED_SCRIPT_WITHDRAW);
        assert_string_equal(arg(c, 6), rid_b);
        no_call(f);
}

/* ------------------------------------------------------------------ behind Sentinels: confirmations */

static void expect_notice(Fixture *f, SharedNoticeType type) {
        SharedNotice n;
        assert_true(pool_shared_pop_notice(f->pool, &n));
        assert_int_equal(n.type, type);
        shared_notice_done(&n);
}

static void test_sentinel_pool_grants_nothing_before_a_confirmation(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookie;
        assert_int_equal(submit(f, &cookie, 1, false, S(1)), 0); /* fail-fast: refused at once */
        assert_int_equal(f->n_seen, 1);
        assert_int_equal(f->seen[0].refusal, REFUSAL_UNAVAILABLE);
        assert_string_equal(f->seen[0].reason, "unconfirmed");
        PoolInfo info;
        f->pool->ops->info(f->pool, S(1), &info);
        assert_false(info.backend_up);
        assert_string_equal(info.unavailable, "unconfirmed");
        /* Heartbeats go on meanwhile; nothing else does. */
        f->pool->ops->run(f->pool, S(2));
        take(f, SHARED_SCRIPT_TICK);
        no_call(f);
        SharedNotice n;
        assert_false(pool_shared_pop_notice(f->pool, &n)); /* never served: nothing lost to tell of */

        pool_shared_set_confirmed(f->pool, S(2), S(2), S(2));
        assert_int_equal(pool_shared_get_confirmed(f->pool), S(2));
        assert_false(pool_shared_pop_notice(f->pool, &n));
        f->pool->ops->info(f->pool, S(2), &info);
        assert_true(info.backend_up);
        assert_null(info.unavailable);
        assert_int_equal(submit(f, &cookie, 1, true, S(2)), 0);
        take(f, SHARED_SCRIPT_SUBMIT);
}

/* A brokerd started behind Sentinels (a restart, a job queued again): a request that may wait waits for the
 * first confirmation of the primary as for the first registration (the waiter grace, from the first one
 * held), and is then sent and decided like any other; only heartbeats go meanwhile. */
static void test_sentinel_start_request_that_may_wait_waits_for_the_first_confirmation(void **state) {
        Fixture *f = *state;
        int a, b;
        assert_int_equal(submit(f, &a, 1, true, S(1)), 0); /* no link yet */
        assert_int_equal(f->n_seen, 0);
        pool_shared_link_up(f->pool, "run1", S(2));
        tick_ok(f, S(2), S(2));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_UP);
        assert_int_equal(submit(f, &b, 1, true, S(2)), 0); /* registered, not confirmed: held too */
        assert_int_equal(f->n_seen, 0);
        no_call(f);
        assert_true(f->pool->ops->next_wakeup(f->pool) <= S(1) + WAITER_GRACE); /* or the heartbeat */
        f->pool->ops->run(f->pool, S(3));
        take(f, SHARED_SCRIPT_TICK);
        no_call(f);
        assert_int_equal(f->n_seen, 0);

        pool_shared_set_confirmed(f->pool, S(4), S(4), S(4));
        SharedNotice n;
        assert_false(pool_shared_pop_notice(f->pool, &n));
        const SharedCall *c = take(f, SHARED_SCRIPT_SUBMIT);
        char rid[17];
        snprintf(rid, sizeof rid, "%s", arg(c, 6));
        done(f, c, reply("ok", S(4), decision("granted", rid, S(4), 0, "", 0, 7, arr(1, num(0))), EMPTY,
                         cache(1, 0, 0, -1, "")), S(4), S(4));
        assert_int_equal(f->seen[0].verdict, POOL_VERDICT_GRANTED);
        assert_ptr_equal(f->seen[0].cookie, &a);
        c = take(f, SHARED_SCRIPT_SUBMIT);
        snprintf(rid, sizeof rid, "%s", arg(c, 6));
        done(f, c, reply("ok", S(4), decision("queued", rid, S(4), 0, "", 0, 0, EMPTY), EMPTY,
                         cache(1, 1, 0, -1, "")), S(4), S(4));
        assert_int_equal(f->seen[1].verdict, POOL_VERDICT_QUEUED);
        assert_ptr_equal(f->seen[1].cookie, &b);
        /* Served: no grace of the start's runs out later. */
        f->pool->ops->run(f->pool, S(1) + WAITER_GRACE);
        assert_int_equal(f->n_seen, 2);
}

/* A waiter resumed from the fd store behind Sentinels keeps its rid through the wait for the first
 * confirmation: the registering tick's reconcile lists it, a grant of it by a tick of the still unconfirmed
 * primary is neither handed out nor makes it refused, and its submit, sent once confirmed, gets the grant
 * from the confirmed primary. */
static void test_sentinel_start_resumed_waiter_keeps_its_rid_until_confirmed(void **state) {
        Fixture *f = *state;
        int a;
        assert_int_equal(submit_resumed(f, &a, OLD_RID, S(1), S(5)), 0);
        assert_int_equal(f->n_seen, 0);
        pool_shared_link_up(f->pool, "run1", S(6));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        assert_true(page_lists(c, OLD_RID));
        done(f, c, reply("ok", S(6), tick_body("ok", EMPTY, 1, 0, 0, ""), EMPTY, cache(0, 1, 0, -1, "")), S(6), S(6));
        no_call(f);
        RespValue fields = arr(8, str("verdict"), str("granted"), str("rid"), str(OLD_RID), str("token"), str("11"),
                               str("slots"), str("1"));
        pool_shared_stream_entry(f->pool, "6-1", &fields, S(6));
        assert_int_equal(f->n_seen, 0);
        no_call(f); /* no release: the rid is still its waiter's */

        pool_shared_set_confirmed(f->pool, S(7), S(7), S(7));
        c = take(f, SHARED_SCRIPT_SUBMIT);
        assert_string_equal(arg(c, 6), OLD_RID);
        done(f, c, reply("ok", S(7), decision("granted", OLD_RID, S(6), S(5), "", 0, 11, arr(1, num(1))), EMPTY,
                         cache(1, 0, 0, -1, "")), S(7), S(7));
        assert_int_equal(f->n_seen, 1);
        assert_int_equal(f->seen[0].verdict, POOL_VERDICT_GRANTED);
        assert_ptr_equal(f->seen[0].cookie, &a);
        assert_int_equal(f->seen[0].token, 11);
        assert_string_equal(f->seen[0].remote_id, NODE ":" OLD_RID);
}

/* No confirmation within the waiter grace: the held requests are refused "unconfirmed" then, not before;
 * later ones at once; their submits never go. Never reached at all, they are refused "backend". */
static void test_sentinel_start_without_a_confirmation_refuses_after_the_grace(void **state) {
        Fixture *f = *state;
        int a, b, late;
        assert_int_equal(submit(f, &a, 1, true, S(1)), 0);
        assert_int_equal(submit_resumed(f, &b, OLD_RID, S(1), S(2)), 0);
        bring_up(f, S(2));
        assert_true(f->pool->ops->next_wakeup(f->pool) <= S(1) + WAITER_GRACE);
        f->pool->ops->run(f->pool, S(1) + WAITER_GRACE - 1);
        assert_int_equal(f->n_seen, 0);
        f->pool->ops->run(f->pool, S(1) + WAITER_GRACE);
        assert_int_equal(f->n_seen, 2);
        for (size_t i = 0; i < 2; i++) {
                assert_int_equal(f->seen[i].verdict, POOL_VERDICT_REFUSED);
                assert_int_equal(f->seen[i].refusal, REFUSAL_UNAVAILABLE);
                assert_string_equal(f->seen[i].reason, "unconfirmed");
        }
        assert_int_equal(submit(f, &late, 1, true, S(1) + WAITER_GRACE), 0);
        assert_int_equal(f->n_seen, 3);
        assert_ptr_equal(f->seen[2].cookie, &late);
        assert_string_equal(f->seen[2].reason, "unconfirmed");
        const SharedCall *c;
        while (pool_shared_take_call(f->pool, f->clock, &c))
                assert_int_equal(c->script, SHARED_SCRIPT_TICK);
        /* The registering tick's reconcile kept the resumed waiter in Redis: its old rid is withdrawn once
         * a confirmed primary can take it (it releases a grant made meanwhile); a's submit never goes. */
        pool_shared_set_confirmed(f->pool, S(8), S(8), S(8));
        unsigned withdrawn = 0;
        while (pool_shared_take_call(f->pool, f->clock, &c)) {
                assert_int_not_equal(c->script, SHARED_SCRIPT_SUBMIT);
                if (c->script == SHARED_SCRIPT_WITHDRAW) {
                        assert_string_equal(arg(c, 6), OLD_RID);
                        withdrawn++;
                }
        }
        assert_int_equal(withdrawn, 1);

        Fixture *g = fixture_new_confirmed(false, CONFIRM_STALE);
        assert_int_equal(submit(g, &a, 1, true, S(1)), 0);
        g->pool->ops->run(g->pool, S(1) + WAITER_GRACE - 1);
        assert_int_equal(g->n_seen, 0);
        g->pool->ops->run(g->pool, S(1) + WAITER_GRACE);
        assert_int_equal(g->n_seen, 1);
        assert_string_equal(g->seen[0].reason, "backend");
        fixture_free(g);
}

/* Fail-fast requests are refused at once at a start behind Sentinels, before the link ("backend") and
 * after the registration ("unconfirmed"); once the pool served, a lost confirmation refuses a request that
 * may wait at once too (the primary may be one cut off): only the start is waited for. */
static void test_sentinel_start_fail_fast_is_refused_at_once(void **state) {
        Fixture *f = *state;
        int a, b, c2, d;
        assert_int_equal(submit(f, &a, 1, false, S(1)), 0);
        assert_int_equal(f->n_seen, 1);
        assert_string_equal(f->seen[0].reason, "backend");
        bring_up(f, S(2));
        assert_int_equal(submit(f, &b, 1, false, S(2)), 0);
        assert_int_equal(f->n_seen, 2);
        assert_string_equal(f->seen[1].reason, "unconfirmed");
        no_call(f);
        pool_shared_set_confirmed(f->pool, S(3), S(3), S(3));
        char rid[17];
        queued(f, &c2, S(3), rid);
        pool_shared_fence_check(f->pool, S(3) + CONFIRM_STALE, S(6));
        expect_notice(f, SHARED_NOTICE_UNCONFIRMED);
        assert_int_equal(submit(f, &d, 1, true, S(6)), 0);
        assert_int_equal(f->n_seen, 4);
        assert_ptr_equal(f->seen[3].cookie, &d);
        assert_int_equal(f->seen[3].verdict, POOL_VERDICT_REFUSED);
        assert_string_equal(f->seen[3].reason, "unconfirmed");
        /* The waiter queued before is kept for the grace from the loss, then refused. */
        f->pool->ops->run(f->pool, S(6) + WAITER_GRACE - 1);
        assert_int_equal(f->n_seen, 4);
        f->pool->ops->run(f->pool, S(6) + WAITER_GRACE);
        assert_int_equal(f->n_seen, 5);
        assert_ptr_equal(f->seen[4].cookie, &c2);
        assert_string_equal(f->seen[4].reason, "unconfirmed");
}

/* An idle node's rounds rest: its pool reads as served, quietly, and a request that may not wait is held (not
 * refused "unconfirmed") until the round its arrival wakes confirms the primary, then decided by Redis. */
static void test_sentinel_rest_holds_a_fail_fast_request_for_the_round_it_wakes(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        pool_shared_set_confirmed(f->pool, S(1), S(1), S(1));
        assert_true(pool_shared_confirm_may_rest(f->pool));
        pool_shared_set_confirm_resting(f->pool, true, S(2), S(2));
        SharedNotice n;
        assert_false(pool_shared_pop_notice(f->pool, &n));
        PoolInfo info;
        f->pool->ops->info(f->pool, S(10), &info);
        assert_true(info.backend_up);
        assert_null(info.unavailable);

        int a;
        assert_int_equal(submit(f, &a, 1, false, S(10)), 0);
        assert_int_equal(f->n_seen, 0);
        no_call(f);
        assert_false(pool_shared_confirm_may_rest(f->pool));
        pool_shared_set_confirm_resting(f->pool, false, S(10), S(10)); /* stale: still held */
        no_call(f);
        pool_shared_set_confirmed(f->pool, S(10), S(10), S(10));
        assert_false(pool_shared_pop_notice(f->pool, &n)); /* nothing was lost, nothing is regained */
        const SharedCall *c = take(f, SHARED_SCRIPT_SUBMIT);
        char rid[17];
        snprintf(rid, sizeof rid, "%s", arg(c, 6));
        done(f, c, reply("ok", S(10), decision("granted", rid, S(10), 0, "", 0, 7, arr(1, num(0))), EMPTY,
                         cache(1, 0, 0, -1, "")), S(10), S(10));
        assert_int_equal(f->n_seen, 1);
        assert_int_equal(f->seen[0].verdict, POOL_VERDICT_GRANTED);
        assert_ptr_equal(f->seen[0].cookie, &a);
}

/* A rest shorter than the confirmation's freshness: the request that ends it goes at once. */
static void test_sentinel_short_rest_serves_at_once(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        pool_shared_set_confirmed(f->pool, S(1), S(1), S(1));
        pool_shared_set_confirm_resting(f->pool, true, S(2), S(2));
        int a;
        assert_int_equal(submit(f, &a, 1, false, S(3)), 0);
        no_call(f);
        pool_shared_set_confirm_resting(f->pool, false, S(3), S(3));
        take(f, SHARED_SCRIPT_SUBMIT);
        SharedNotice n;
        assert_false(pool_shared_pop_notice(f->pool, &n));
}

/* The round a request woke does not confirm the primary (a brokerd cut off with an old one, idle until then): the
 * confirmation is lost as if the rounds had gone on. The held request that may not wait is refused at once,
 * the one that may is kept for the waiter grace from its arrival; nothing was sent for either. */
static void test_sentinel_wake_round_without_a_majority_refuses_as_a_lost_confirmation(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        pool_shared_set_confirmed(f->pool, S(1), S(1), S(1));
        pool_shared_set_confirm_resting(f->pool, true, S(2), S(2));
        int a, b;
        assert_int_equal(submit(f, &a, 1, false, S(10)), 0);
        assert_int_equal(submit(f, &b, 1, true, S(10)), 0);
        pool_shared_set_confirm_resting(f->pool, false, S(10), S(10));
        pool_shared_set_confirmed(f->pool, S(1), S(11), S(11)); /* no majority */
        assert_int_equal(f->n_seen, 0);
        pool_shared_confirm_round_failed(f->pool, S(11));
        expect_notice(f, SHARED_NOTICE_UNCONFIRMED);
        assert_int_equal(f->n_seen, 1);
        assert_ptr_equal(f->seen[0].cookie, &a);
        assert_int_equal(f->seen[0].refusal, REFUSAL_UNAVAILABLE);
        assert_string_equal(f->seen[0].reason, "unconfirmed");
        PoolInfo info;
        f->pool->ops->info(f->pool, S(11), &info);
        assert_false(info.backend_up);
        assert_string_equal(info.unavailable, "unconfirmed");
        f->pool->ops->run(f->pool, S(10) + WAITER_GRACE - 1);
        assert_int_equal(f->n_seen, 1);
        f->pool->ops->run(f->pool, S(10) + WAITER_GRACE);
        assert_int_equal(f->n_seen, 2);
        assert_ptr_equal(f->seen[1].cookie, &b);
        assert_string_equal(f->seen[1].reason, "unconfirmed");
        const SharedCall *c = NULL;
        while (pool_shared_take_call(f->pool, f->clock, &c))
                assert_int_not_equal(c->script, SHARED_SCRIPT_SUBMIT);
        /* Lost, the confirmation keeps the rounds going (a refused request would never wake them). */
        assert_false(pool_shared_confirm_may_rest(f->pool));
}

/* The hole of issue 12: a brokerd cut off with the old primary gets every heartbeat acknowledged by it. Its
 * leases must end by the last confirmation + TTL − margin all the same, and it must grant nothing new. */
static void test_fence_counts_from_the_last_confirmation_not_the_heartbeats(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        pool_shared_set_confirmed(f->pool, S(1), S(1), S(1));
        int cookie;
        char rid[17];
        granted(f, &cookie, S(1), rid);
        f->pool->ops->bind_grant(f->pool, f->seen[0].grant, &cookie);
        usec_t margin = REVOKE_GRACE + S(2);
        assert_int_equal(pool_shared_fence_deadline(f->pool), S(1) + TTL - margin);
        /* Rounds go on without a majority; the old primary keeps acknowledging. */
        for (usec_t t = S(2); t < S(1) + CONFIRM_STALE; t += S(1)) {
                f->pool->ops->run(f->pool, t);
                tick_ok(f, t, t);
                pool_shared_set_confirmed(f->pool, S(1), t, t);
                assert_true(pool_shared_state(f->pool) == SHARED_STATE_UP);
        }
        SharedNotice n;
        assert_false(pool_shared_pop_notice(f->pool, &n));
        /* Three seconds after the round that confirmed it: refused, at once. */
        pool_shared_set_confirmed(f->pool, S(1), S(1) + CONFIRM_STALE, S(1) + CONFIRM_STALE);
        expect_notice(f, SHARED_NOTICE_UNCONFIRMED);
        int other;
        assert_int_equal(submit(f, &other, 1, true, S(5)), 0);
        assert_int_equal(f->seen[f->n_seen - 1].refusal, REFUSAL_UNAVAILABLE);
        assert_string_equal(f->seen[f->n_seen - 1].reason, "unconfirmed");
        for (usec_t t = S(5); t < S(40); t += S(1)) {
                f->pool->ops->run(f->pool, t);
                tick_ok(f, t, t);
                pool_shared_fence_check(f->pool, t, t);
                /* The deadline stays at the confirmation, whatever the heartbeats say. */
                if (t < S(1) + TTL - margin) {
                        assert_int_equal(pool_shared_fence_deadline(f->pool), S(1) + TTL - margin);
                        assert_int_equal(f->seen[f->n_seen - 1].verdict, POOL_VERDICT_REFUSED);
                }
        }
        assert_int_equal(f->seen[f->n_seen - 1].verdict, POOL_VERDICT_LOST);
        assert_ptr_equal(f->seen[f->n_seen - 1].cookie, &cookie);
        assert_string_equal(f->seen[f->n_seen - 1].reason, "fenced");
        assert_int_equal(pool_shared_fence_deadline(f->pool), USEC_INFINITY);
}

static void test_grant_from_an_unconfirmed_primary_is_refused_and_released(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        pool_shared_set_confirmed(f->pool, S(1), S(1), S(1));
        int a, b;
        char rid_a[17], rid_b[17];
        queued(f, &a, S(1), rid_a);
        queued(f, &b, S(1), rid_b);
        pool_shared_fence_check(f->pool, S(4), S(4));
        expect_notice(f, SHARED_NOTICE_UNCONFIRMED);
        assert_true(f->pool->ops->next_wakeup(f->pool) <= S(4) + WAITER_GRACE);
        /* A tick run on the old primary granted a: not handed out. */
        RespValue fields = arr(8, str("verdict"), str("granted"), str("rid"), str(rid_a), str("token"), str("11"),
                               str("slots"), str("1"));
        pool_shared_stream_entry(f->pool, "4-1", &fields, S(4));
        assert_int_equal(f->n_seen, 3);
        assert_int_equal(f->seen[2].verdict, POOL_VERDICT_REFUSED);
        assert_ptr_equal(f->seen[2].cookie, &a);
        assert_string_equal(f->seen[2].reason, "unconfirmed");
        /* b is kept for the grace, then refused. */
        f->pool->ops->run(f->pool, S(4) + WAITER_GRACE - 1);
        assert_int_equal(f->n_seen, 3);
        f->pool->ops->run(f->pool, S(4) + WAITER_GRACE);
        assert_int_equal(f->n_seen, 4);
        assert_ptr_equal(f->seen[3].cookie, &b);
        assert_string_equal(f->seen[3].reason, "unconfirmed");
        /* Only heartbeats go to an unconfirmed primary; the give-backs wait for a confirmed one. */
        const SharedCall *c;
        while (pool_shared_take_call(f->pool, f->clock, &c))
                assert_int_equal(c->script, SHARED_SCRIPT_TICK);
        assert_false(pool_shared_giving_back(f->pool));
        pool_shared_set_confirmed(f->pool, S(10), S(10), S(10));
        expect_notice(f, SHARED_NOTICE_CONFIRMED);
        bool released = false;
        while (pool_shared_take_call(f->pool, f->clock, &c))
                if (c->script == SHARED_SCRIPT_RELEASE) {
                        assert_string_equal(arg(c, 7), rid_a);
                        released = true;
                }
        assert_true(released);
}

/* One Sentinel alone (a lagging or lying one; the query link's) names another primary while the last round's
 * confirmation of the one before is fresh: the driver hands in 0, and the pool stops serving at once, not
 * when that confirmation goes stale (a grant from the new primary would sit beside the other brokerds' on
 * the majority's primary: a slot held twice). The fence keeps counting from the last confirmation; a round
 * that confirms the new primary serves the pool again. */
static void test_primary_named_by_one_sentinel_is_unconfirmed_at_once(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        pool_shared_set_confirmed(f->pool, S(1), S(1), S(1));
        int held, waiter, fast;
        char rid_held[17], rid_waiter[17];
        granted(f, &held, S(1), rid_held);
        f->pool->ops->bind_grant(f->pool, f->seen[0].grant, &held);
        queued(f, &waiter, S(1), rid_waiter);
        usec_t margin = REVOKE_GRACE + S(2);
        assert_int_equal(pool_shared_fence_deadline(f->pool), S(1) + TTL - margin);
        SharedNotice n;
        assert_false(pool_shared_pop_notice(f->pool, &n));

        /* 1.5 s after the round that confirmed the old primary: the move. */
        usec_t moved = S(1) + S(1) / 2;
        pool_shared_set_confirmed(f->pool, 0, moved, moved);
        expect_notice(f, SHARED_NOTICE_UNCONFIRMED);
        PoolInfo info;
        f->pool->ops->info(f->pool, moved, &info);
        assert_false(info.backend_up);
        assert_string_equal(info.unavailable, "unconfirmed");
        assert_int_equal(submit(f, &fast, 1, false, moved), 0);
        assert_ptr_equal(f->seen[f->n_seen - 1].cookie, &fast);
        assert_int_equal(f->seen[f->n_seen - 1].refusal, REFUSAL_UNAVAILABLE);
        assert_string_equal(f->seen[f->n_seen - 1].reason, "unconfirmed");
        /* The new primary grants the waiter (its tick, read from its stream): not handed out. */
        RespValue fields = granted_entry(rid_waiter, "12", "1", "");
        pool_shared_stream_entry(f->pool, "2-1", &fields, moved);
        assert_int_equal(f->seen[f->n_seen - 1].verdict, POOL_VERDICT_REFUSED);
        assert_ptr_equal(f->seen[f->n_seen - 1].cookie, &waiter);
        assert_string_equal(f->seen[f->n_seen - 1].reason, "unconfirmed");
        for (size_t i = 0; i < f->n_seen; i++)
                if (f->seen[i].verdict == POOL_VERDICT_GRANTED)
                        assert_ptr_equal(f->seen[i].cookie, &held);
        /* Rounds without a majority for it say so again: still refused; the fence stays at the old
         * confirmation, whatever the new primary acknowledges. */
        for (usec_t t = S(2); t < S(5); t += S(1)) {
                f->pool->ops->run(f->pool, t);
                tick_ok(f, t, t);
                pool_shared_set_confirmed(f->pool, 0, t, t);
                f->pool->ops->info(f->pool, t, &info);
                assert_string_equal(info.unavailable, "unconfirmed");
                assert_int_equal(pool_shared_fence_deadline(f->pool), S(1) + TTL - margin);
        }
        assert_int_equal(pool_shared_get_confirmed(f->pool), S(1));
        assert_false(pool_shared_pop_notice(f->pool, &n));

        /* A round's majority names it: served again (the grant made meanwhile goes back), and the fence
         * moves on with the heartbeats. */
        pool_shared_set_confirmed(f->pool, S(5), S(5), S(5));
        expect_notice(f, SHARED_NOTICE_CONFIRMED);
        f->pool->ops->info(f->pool, S(5), &info);
        assert_true(info.backend_up);
        assert_null(info.unavailable);
        assert_int_equal(pool_shared_get_confirmed(f->pool), S(5));
        bool released = false;
        const SharedCall *c;
        while (pool_shared_take_call(f->pool, f->clock, &c))
                if (c->script == SHARED_SCRIPT_RELEASE && streq(arg(c, 7), rid_waiter))
                        released = true;
        assert_true(released);
        assert_int_equal(pool_shared_fence_deadline(f->pool), S(4) + TTL - margin);
}

/* ------------------------------------------------------------- untrusted input (SPEC §11, issue 19 g) */

/* Every forged grant of a waiter's rid is dropped, counted, and its waiter refused "bad-reply" with its rid
 * withdrawn (which releases whatever Redis holds under it): a slot list longer than the members (the
 * crash of issue 19 g), a member in a pool of anonymous slots, a slot at or above the limit, a slot twice,
 * more slots than asked for, a token of 0, 2^53 or negative, a slot that is not a number, a list far longer
 * than the limit. */
static void test_forged_grants_are_dropped_and_the_waiter_refused(void **state) {
        static const struct {
                const char *token, *slots, *members;
        } forged[] = {
                { "9", "0,1", "a" },
                { "9", "0", "a" },
                { "9", "2", "" },
                { "9", "4294967296", "" },
                { "9", "1,1", "" },
                { "9", "0,1", "" },
                { "0", "0", "" },
                { "9007199254740992", "0", "" },
                { "-5", "0", "" },
                { "9", "0x1", "" },
                { "9", " 1", "" },
                { "9", "", "" },
                { "9", ",,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,", "" },
        };
        Fixture *f = *state;
        bring_up(f, S(1));
        for (size_t i = 0; i < ELEMENTSOF(forged); i++) {
                int cookie;
                char rid[17];
                size_t seen = f->n_seen;
                queued(f, &cookie, S(1), rid);
                RespValue fields = granted_entry(rid, forged[i].token, forged[i].slots, forged[i].members);
                char id[32];
                snprintf(id, sizeof id, "7-%zu", i + 1);
                pool_shared_stream_entry(f->pool, id, &fields, S(2));
                assert_int_equal(f->n_seen, seen + 2);
                assert_int_equal(f->seen[seen + 1].verdict, POOL_VERDICT_REFUSED);
                assert_int_equal(f->seen[seen + 1].refusal, REFUSAL_UNAVAILABLE);
                assert_string_equal(f->seen[seen + 1].reason, "bad-reply");
                assert_int_equal(bad_inputs(f), i + 1);
                const SharedCall *c = take(f, SHARED_SCRIPT_WITHDRAW);
                assert_string_equal(arg(c, 6), rid);
                done(f, c, reply("ok", 2, arr(1, str("withdrawn")), EMPTY, cache(0, 0, 0, -1, "")), S(2), S(2));
                no_call(f);
        }
        PoolInfo info;
        f->pool->ops->info(f->pool, S(2), &info);
        assert_int_equal(info.in_use, 0);
        /* Told once, not once per entry: the next notice comes a minute later, with the count since. */
        SharedNotice n;
        size_t told = 0;
        while (pool_shared_pop_notice(f->pool, &n)) {
                if (n.type == SHARED_NOTICE_BAD_INPUT) {
                        told++;
                        assert_non_null(n.detail);
                }
                shared_notice_done(&n);
        }
        assert_int_equal(told, 1);
        pool_shared_bad_input(f->pool, "a reply over the size cap", S(30));
        assert_false(pool_shared_pop_notice(f->pool, &n));
        pool_shared_bad_input(f->pool, "a reply over the size cap", S(62));
        assert_true(pool_shared_pop_notice(f->pool, &n));
        assert_int_equal(n.type, SHARED_NOTICE_BAD_INPUT);
        assert_string_equal(n.detail, "a reply over the size cap");
        assert_int_equal(n.freed_leases, ELEMENTSOF(forged) - 1 + 2);
        shared_notice_done(&n);
        assert_int_equal(bad_inputs(f), ELEMENTSOF(forged) + 2);
}

/* Garbage the scripts repaired in the members' lives' keys (brokerd/lua/README, "Members' lives": notice
 * "bad-key") is bad input of the pool, counted and told as such, whatever key it names; the other notices of
 * the reply are still applied. */
static void test_a_repaired_key_is_counted_as_bad_input(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        f->pool->ops->run(f->pool, S(2));
        const SharedCall *c = take(f, SHARED_SCRIPT_TICK);
        RespValue notices = arr(4, arr(3, str("bad-key"), str("hq"), str("0000000000000001")),
                                arr(3, str("bad-key"), str("rekey"), str("at")),
                                arr(3, str("bad-key"), str("no-such-key"), str("?")),
                                arr(5, str("node-expired"), str("n9"), str("host9"), num(1), num(0)));
        RespValue r = arr(6, str("ok"), num(S(2)), tick_body("ok", EMPTY, 0, 0, 0, ""), EMPTY,
                          cache(0, 0, 0, -1, ""), notices);
        done(f, c, r, S(2), S(2));
        assert_int_equal(bad_inputs(f), 3);
        SharedNotice n;
        size_t told = 0, expired = 0;
        while (pool_shared_pop_notice(f->pool, &n)) {
                if (n.type == SHARED_NOTICE_BAD_INPUT) {
                        told++;
                        assert_string_equal(n.detail, "garbage in Redis's health queue (repaired)");
                }
                expired += n.type == SHARED_NOTICE_NODE_EXPIRED;
                shared_notice_done(&n);
        }
        assert_int_equal(told, 1); /* once a minute: the count goes with the next */
        assert_int_equal(expired, 1);
}

/* A repair the call made before it answered "unregistered" (prelude.lua's audits run first) is told all the
 * same: notices are applied whatever the status. */
static void test_a_repair_in_an_unregistered_reply_is_told(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookie;
        assert_int_equal(submit(f, &cookie, 1, true, S(2)), 0);
        const SharedCall *c = take(f, SHARED_SCRIPT_SUBMIT);
        RespValue r = arr(6, str("unregistered"), num(0), EMPTY, EMPTY, EMPTY,
                          arr(1, arr(3, str("bad-key"), str("lane"), str("ci"))));
        done(f, c, r, S(2), S(2));
        assert_int_equal(pool_shared_state(f->pool), SHARED_STATE_REGISTERING);
        assert_int_equal(bad_inputs(f), 1);
}

/* Entries that are not this node's to answer: a grant for a rid it never sent is dropped, not released
 * (it would answer another node's entries); entries with a malformed id, rid or shape are dropped, and an
 * id that is not one is not read past (it goes back to Redis as XREAD's argument). */
static void test_entries_not_of_this_node_are_dropped(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        RespValue fields = granted_entry("00000000deadbeef", "9", "0", "");
        pool_shared_stream_entry(f->pool, "8-1", &fields, S(2));
        assert_int_equal(f->n_seen, 0);
        no_call(f);
        assert_int_equal(bad_inputs(f), 1);
        assert_string_equal(pool_shared_stream_resume_id(f->pool), "8-1");

        RespValue bad_rid = granted_entry("../../etc/passwd", "9", "0", "");
        pool_shared_stream_entry(f->pool, "8-2", &bad_rid, S(2));
        RespValue odd = arr(3, str("verdict"), str("granted"), str("rid"));
        pool_shared_stream_entry(f->pool, "8-3", &odd, S(2));
        RespValue wrong_type = arr(2, str("slots"), arr(1, arr(0)));
        pool_shared_stream_entry(f->pool, "8-4", &wrong_type, S(2));
        RespValue no_rid = arr(2, str("verdict"), str("granted"));
        pool_shared_stream_entry(f->pool, "8-5", &no_rid, S(2));
        pool_shared_stream_entry(f->pool, "$", &fields, S(2));
        pool_shared_stream_entry(f->pool, "9-1 COUNT 1", &fields, S(2));
        assert_int_equal(f->n_seen, 0);
        no_call(f);
        assert_int_equal(bad_inputs(f), 7);
        assert_string_equal(pool_shared_stream_resume_id(f->pool), "8-5");

        /* A rid this node sent and withdrew: its late grant is released, as before. */
        int cookie;
        char rid[17];
        queued(f, &cookie, S(2), rid);
        f->pool->ops->withdraw(f->pool, f->seen[0].waiter, S(2));
        const SharedCall *c = take(f, SHARED_SCRIPT_WITHDRAW);
        done(f, c, reply("ok", 2, arr(1, str("gone")), EMPTY, cache(0, 0, 0, -1, "")), S(2), S(2));
        RespValue late = granted_entry(rid, "11", "1", "");
        pool_shared_stream_entry(f->pool, "9-2", &late, S(2));
        c = take(f, SHARED_SCRIPT_RELEASE);
        assert_string_equal(arg(c, 7), rid);
        assert_int_equal(bad_inputs(f), 7);
}

/* A grant of a slot that a lease of this node holds is one slot granted twice: dropped, the waiter refused. */
static void test_grant_of_a_slot_held_here_is_dropped(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int holder, cookie;
        char held[17], rid[17];
        granted(f, &holder, S(1), held); /* slot 0 */
        queued(f, &cookie, S(1), rid);
        RespValue fields = granted_entry(rid, "12", "0", "");
        pool_shared_stream_entry(f->pool, "6-1", &fields, S(2));
        assert_int_equal(f->seen[f->n_seen - 1].verdict, POOL_VERDICT_REFUSED);
        assert_string_equal(f->seen[f->n_seen - 1].reason, "bad-reply");
        assert_int_equal(bad_inputs(f), 1);
        PoolInfo info;
        f->pool->ops->info(f->pool, S(2), &info);
        assert_int_equal(info.in_use, 1);
}

/* A release answered with an error or garbage is not sent again at once (a server answering garbage at
 * once would make the loop spin): after the next heartbeat. Garbage is bad input; an error reply is Redis's
 * own word (out of memory, NOSCRIPT), not input that failed a check: not counted, as a set's is not
 * (test_set_error_reply_refuses_in_every_pool). */
static void test_call_answered_with_garbage_waits_for_the_next_heartbeat(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookie;
        char rid[17];
        granted(f, &cookie, S(1), rid);
        f->pool->ops->release(f->pool, f->seen[f->n_seen - 1].grant, S(1));
        const SharedCall *c = take(f, SHARED_SCRIPT_RELEASE);
        done(f, c, str("garbage"), S(1), S(1));
        assert_int_equal(bad_inputs(f), 1);
        no_call(f);
        f->pool->ops->run(f->pool, S(2));
        tick_ok(f, S(2), S(2));
        c = take(f, SHARED_SCRIPT_RELEASE);
        done(f, c, (RespValue) { .type = RESP_ERROR, .str = "OOM", .len = 3 }, S(2), S(2));
        assert_int_equal(bad_inputs(f), 1); /* the garbage's */
        no_call(f);
        f->pool->ops->run(f->pool, S(3));
        tick_ok(f, S(3), S(3));
        c = take(f, SHARED_SCRIPT_RELEASE);
        assert_string_equal(arg(c, 7), rid);
}

/* A reply is checked like an entry: the decision of another rid than the one submitted, a reply of another
 * shape than the scripts' (not an array of 6, no status word, a pool clock that is not a number) refuse the
 * request "bad-reply" and withdraw its rid. */
static void test_replies_of_another_shape_refuse_the_request(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        RespValue replies[] = {
                reply("ok", S(1), decision("granted", "00000000deadbeef", S(1), 0, "", 0, 7, arr(1, num(0))), EMPTY,
                      cache(1, 0, 0, -1, "")),
                arr(2, str("ok"), num(1)),
                arr(6, num(1), num(1), EMPTY, EMPTY, EMPTY, EMPTY),
                arr(6, str("ok"), str("soon"), EMPTY, EMPTY, EMPTY, EMPTY),
                str("OK"),
        };
        for (size_t i = 0; i < ELEMENTSOF(replies); i++) {
                int cookie;
                size_t seen = f->n_seen;
                assert_int_equal(submit(f, &cookie, 1, true, S(1)), 0);
                const SharedCall *c = take(f, SHARED_SCRIPT_SUBMIT);
                char rid[17];
                snprintf(rid, sizeof rid, "%s", arg(c, 6));
                done(f, c, replies[i], S(1), S(1));
                assert_int_equal(f->n_seen, seen + 1);
                assert_int_equal(f->seen[seen].verdict, POOL_VERDICT_REFUSED);
                assert_string_equal(f->seen[seen].reason, "bad-reply");
                c = take(f, SHARED_SCRIPT_WITHDRAW);
                assert_string_equal(arg(c, 6), rid);
                done(f, c, reply("ok", 2, arr(1, str("gone")), EMPTY, cache(0, 0, 0, -1, "")), S(1), S(1));
                assert_int_equal(bad_inputs(f), i + 1);
        }
}

/* A status snapshot whose holder has fewer members than slots (Status would print past them), or more
 * holders than the limit, is dropped whole and counted. */
static void test_malformed_status_snapshot_is_dropped(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        PoolSnapshot snap;
        assert_int_equal(f->pool->ops->snapshot(f->pool, &snap), -ENODATA);
        f->pool->ops->run(f->pool, S(1) + 1);
        const SharedCall *c = take(f, SHARED_SCRIPT_POSITIONS);
        assert_string_equal(arg(c, 6), "status");
        RespValue holder = arr(8, str("ffffffffffffffffffffffffffffffff"), str("runner-2"), str("00000000000000aa"),
                               str("ci"), num(5), num(0), arr(2, num(0), num(1)), arr(1, str("a")));
        done(f, c, reply("ok", S(2), arr(3, arr(1, holder), EMPTY, num(0)), EMPTY, cache(2, 0, 0, -1, "")), S(2),
             S(2));
        assert_int_equal(f->pool->ops->snapshot(f->pool, &snap), -ENODATA);
        assert_int_equal(bad_inputs(f), 1);
}

/* ------------------------------------------------------------------------------------------ batches */

/* Submits n requests of one slot at now (cookies[i]); their rids in rids[i]. */
static void submit_n(Fixture *f, int *cookies, size_t n, usec_t now) {
        for (size_t i = 0; i < n; i++)
                assert_int_equal(submit(f, &cookies[i], 1, true, now), 0);
}

/* The batch the pool sends now, of n operations; each one's rid (ARGV[6] of a submit) in rids[]; fresh (or
 * NULL): each submit's ARGV[15] in turn, "1" or "0" (call_set_fresh()). */
static const SharedCall *take_batch_fresh(Fixture *f, size_t n, char rids[][17], const char *fresh) {
        const SharedCall *c = take(f, SHARED_SCRIPT_BATCH);
        assert_string_equal(arg(c, 6), (char[16]) { (char) ('0' + n) });
        size_t i = 7;
        for (size_t j = 0; j < n; j++) {
                size_t m = strtoul(arg(c, i + 1), NULL, 10);
                if (streq(arg(c, i), "submit")) {
                        assert_int_equal(m, 11);
                        if (rids)
                                snprintf(rids[j], 17, "%s", arg(c, i + 2));
                        if (fresh) {
                                assert_true(*fresh);
                                assert_string_equal(arg(c, i + 2 + 9), (char[2]) { *fresh++ });
                        }
                }
                i += 2 + m;
        }
        assert_int_equal(i, c->argc);
        assert_true(!fresh || !*fresh);
        return c;
}

static const SharedCall *take_batch(Fixture *f, size_t n, char rids[][17]) {
        return take_batch_fresh(f, n, rids, NULL);
}

static RespValue granted_reply(const char *rid, int64_t now, int64_t token, int64_t slot) {
        return reply("ok", now, decision("granted", rid, now, 0, "", 0, token, arr(1, num(slot))), EMPTY,
                     cache(1, 0, 0, -1, ""));
}

static RespValue queued_reply(const char *rid, int64_t now) {
        return reply("ok", now, decision("queued", rid, now, 0, "", 0, 0, EMPTY), EMPTY, cache(2, 1, 0, -1, ""));
}

/* Issue 21 item 2: what the outbox holds when the driver takes a call goes as one (brokerd/lua/batch.lua):
 * the head once, each operation's name, count and own arguments in order; the answer is split back, each
 * reply handled as its call's. */
static void test_batch_carries_the_outbox_and_splits_the_answer(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookies[3];
        char rids[3][17];
        submit_n(f, cookies, 3, S(2));
        const SharedCall *c = take_batch(f, 3, rids);
        assert_string_equal(arg(c, 3), "-");
        assert_string_equal(arg(c, 7), "submit");
        assert_string_equal(arg(c, 10), "ci");
        no_call(f); /* all three are out */
        assert_false(pool_shared_is_settled(f->pool));
        done(f, c, arr(3, granted_reply(rids[0], S(2), 7, 0), granted_reply(rids[1], S(2), 8, 1),
                       queued_reply(rids[2], S(2))), S(2), S(2));
        assert_int_equal(f->n_seen, 3);
        assert_int_equal(f->seen[0].verdict, POOL_VERDICT_GRANTED);
        assert_ptr_equal(f->seen[0].cookie, &cookies[0]);
        assert_int_equal(f->seen[0].token, 7);
        assert_int_equal(f->seen[1].verdict, POOL_VERDICT_GRANTED);
        assert_ptr_equal(f->seen[1].cookie, &cookies[1]);
        assert_int_equal(f->seen[2].verdict, POOL_VERDICT_QUEUED);
        assert_ptr_equal(f->seen[2].cookie, &cookies[2]);
        no_call(f);

        /* A release and a withdrawal of one loop iteration: one call too, in their order. */
        f->pool->ops->release(f->pool, f->seen[0].grant, S(3));
        f->pool->ops->withdraw(f->pool, f->seen[2].waiter, S(3));
        c = take_batch(f, 2, NULL);
        assert_string_equal(arg(c, 7), "release");
        assert_string_equal(arg(c, 8), "2");
        assert_string_equal(arg(c, 9), "7");
        assert_string_equal(arg(c, 10), rids[0]);
        assert_string_equal(arg(c, 11), "withdraw");
        assert_string_equal(arg(c, 13), rids[2]);
        assert_true(pool_shared_giving_back(f->pool));
        /* The release's cache is left to the withdrawal's reply, which carries its state on (README,
         * "Batches"): an empty one is no bad input. */
        uint64_t bad = bad_inputs(f);
        done(f, c, arr(2, reply("ok", S(3), arr(1, str("released")), EMPTY, EMPTY),
                       reply("ok", S(3), arr(1, str("withdrawn")), EMPTY, cache(1, 0, 0, -1, ""))), S(3), S(3));
        assert_false(pool_shared_giving_back(f->pool));
        assert_int_equal(bad_inputs(f), bad);
        no_call(f);
}

/* A batch is bounded (SHARED_BATCH_OPS_MAX operations): the rest goes in the next. One by one when not asked
 * for (the EVALSHA form, and every other test here). */
static void test_batch_is_bounded(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookies[SHARED_BATCH_OPS_MAX + 3];
        submit_n(f, cookies, ELEMENTSOF(cookies), S(2));
        const SharedCall *c = take(f, SHARED_SCRIPT_BATCH);
        assert_int_equal(strtoul(arg(c, 6), NULL, 10), SHARED_BATCH_OPS_MAX);
        c = take_batch(f, 3, NULL);
        no_call(f);
}

static void test_without_batches_each_call_goes_alone(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookies[2];
        submit_n(f, cookies, 2, S(2));
        take(f, SHARED_SCRIPT_SUBMIT);
        take(f, SHARED_SCRIPT_SUBMIT);
        no_call(f);
}

/* One call out at a time (the daemon's group commit): what is queued while a call is out waits for its answer
 * and then goes as one batch; a tick too. */
static void test_one_call_out_the_next_waits_for_its_answer(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int first, more[3];
        char rids[3][17];
        assert_int_equal(submit(f, &first, 1, true, S(2)), 0);
        const SharedCall *c = take(f, SHARED_SCRIPT_SUBMIT);
        char rid[17];
        snprintf(rid, sizeof rid, "%s", arg(c, 6));
        submit_n(f, more, 3, S(2));
        no_call(f);
        assert_int_equal(f->n_seen, 0);
        done(f, c, granted_reply(rid, S(2), 7, 0), S(2), S(2));
        assert_int_equal(f->n_seen, 1);
        c = take_batch(f, 3, rids);
        no_call(f);
        f->clock = S(4); /* a heartbeat is due: it waits too */
        f->pool->ops->run(f->pool, S(4));
        no_call(f);
        done(f, c, arr(3, granted_reply(rids[0], S(2), 8, 1), queued_reply(rids[1], S(2)),
                       queued_reply(rids[2], S(2))), S(2), S(4));
        assert_int_equal(f->n_seen, 4);
        tick_ok(f, S(4), S(4));
        no_call(f);
}

/* A full batch does not wait: a busy pool is not held to one batch a round trip. */
static void test_one_call_out_a_full_batch_goes_at_once(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int first, more[SHARED_BATCH_OPS_MAX + 1];
        assert_int_equal(submit(f, &first, 1, true, S(2)), 0);
        take(f, SHARED_SCRIPT_SUBMIT);
        submit_n(f, more, SHARED_BATCH_OPS_MAX - 1, S(2));
        no_call(f);
        submit_n(f, more + SHARED_BATCH_OPS_MAX - 1, 2, S(2));
        const SharedCall *c = take(f, SHARED_SCRIPT_BATCH);
        assert_int_equal(strtoul(arg(c, 6), NULL, 10), SHARED_BATCH_OPS_MAX);
        no_call(f); /* the one left waits */
}

/* What must reach Redis before a decision is told (pool_shared_send_queued_now(): a refusal's withdraw) goes
 * whatever is out, with every call before it; one queued after it waits again. A link lost takes what was out
 * with it: nothing waits for its answer. */
static void test_one_call_out_gives_way_to_send_now_and_to_a_lost_link(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int a, b, c2;
        assert_int_equal(submit(f, &a, 1, true, S(2)), 0);
        const SharedCall *c = take(f, SHARED_SCRIPT_SUBMIT);
        uint64_t out = c->id;
        assert_int_equal(submit(f, &b, 1, true, S(2)), 0);
        no_call(f);
        pool_shared_send_queued_now(f->pool);
        take(f, SHARED_SCRIPT_SUBMIT);
        assert_int_equal(submit(f, &c2, 1, true, S(2)), 0);
        no_call(f);

        pool_shared_link_down(f->pool, S(3));
        pool_shared_link_up(f->pool, "run1", S(3));
        pool_shared_call_done(f->pool, out, -ECONNRESET, NULL, S(2), S(3)); /* the old link's, late */
        tick_ok(f, S(3), S(3));
        take_batch(f, 3, NULL);
        no_call(f);
}

/* A submit answered "rules" did not run: refused here, it is not out any more (the heartbeat behind it goes)
 * and nothing is withdrawn. */
static void test_one_call_out_a_submit_refused_rules_is_not_out(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int a;
        assert_int_equal(submit(f, &a, 1, true, S(2)), 0);
        const SharedCall *c = take(f, SHARED_SCRIPT_SUBMIT);
        f->clock = S(4);
        f->pool->ops->run(f->pool, S(4));
        no_call(f);
        done(f, c, reply("rules", S(4), EMPTY, EMPTY, cache(0, 0, 0, -1, "")), S(2), S(4));
        assert_int_equal(f->n_seen, 1);
        assert_int_equal(f->seen[0].verdict, POOL_VERDICT_REFUSED);
        assert_string_equal(f->seen[0].reason, "rules");
        take(f, SHARED_SCRIPT_TICK);
        no_call(f);
}

/* A call marked out far longer than a link lets a command be (a bug would leave it so) holds nothing back. */
static void test_one_call_out_ignores_a_call_out_too_long(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int a, b;
        assert_int_equal(submit(f, &a, 1, true, S(2)), 0);
        f->clock = S(2);
        take(f, SHARED_SCRIPT_SUBMIT);
        assert_int_equal(submit(f, &b, 1, true, S(2)), 0);
        f->clock = S(6);
        no_call(f);
        f->clock = S(8);
        take(f, SHARED_SCRIPT_SUBMIT);
}

/* The pool up, three requests (cookies) made in one loop iteration: their batch, taken (their rids). */
static const SharedCall *batch_of_three(Fixture *f, int cookies[static 3], char rids[3][17]) {
        bring_up(f, S(1));
        submit_n(f, cookies, 3, S(2));
        return take_batch_fresh(f, 3, rids, "111");
}

/* "settling" of one operation stops the batch there (batch.lua runs nothing after it): that one and the
 * ones after it go again, in order, under the same rids. */
static void test_batch_settling_in_the_middle_sends_the_rest_again(void **state) {
        Fixture *f = *state;
        int cookies[3];
        char rids[3][17], again[2][17];
        const SharedCall *c = batch_of_three(f, cookies, rids);
        done(f, c, arr(2, granted_reply(rids[0], S(2), 7, 0), reply("settling", S(2), EMPTY, EMPTY,
                                                                    cache(1, 100, 0, 0, ""))), S(2), S(2));
        assert_int_equal(f->n_seen, 1);
        assert_ptr_equal(f->seen[0].cookie, &cookies[0]);
        assert_int_equal(bad_inputs(f), 0);
        /* The one answered "settling" ran (it may have, for all brokerd knows): not fresh; the one after it
         * never ran: fresh still. */
        c = take_batch_fresh(f, 2, again, "01");
        assert_string_equal(again[0], rids[1]);
        assert_string_equal(again[1], rids[2]);
        done(f, c, arr(2, granted_reply(rids[1], S(2), 8, 1), queued_reply(rids[2], S(2))), S(2), S(2));
        assert_int_equal(f->n_seen, 3);
        assert_ptr_equal(f->seen[1].cookie, &cookies[1]);
        assert_int_equal(f->seen[2].verdict, POOL_VERDICT_QUEUED);
        no_call(f);
}

/* A batch stopped by "settling" before some of its submits, whose requests were given up meanwhile (their
 * withdraws went behind it): those submits are not sent again after their withdraws; the rest is. */
static void test_batch_submits_given_up_are_not_sent_again(void **state) {
        Fixture *f = *state;
        int cookies[3];
        char rids[3][17];
        const SharedCall *c = batch_of_three(f, cookies, rids);
        f->pool->ops->cancel_try(f->pool, &cookies[1], S(2));
        f->pool->ops->cancel_try(f->pool, &cookies[2], S(2));
        const SharedCall *w = take_batch(f, 2, NULL);
        assert_string_equal(arg(w, 9), rids[1]);
        assert_string_equal(arg(w, 12), rids[2]);
        done(f, c, arr(1, reply("settling", S(2), EMPTY, EMPTY, cache(1, 100, 0, 0, ""))), S(2), S(2));
        done(f, w, arr(2, reply("ok", S(2), arr(1, str("gone")), EMPTY, EMPTY),
                       reply("ok", S(2), arr(1, str("gone")), EMPTY, cache(0, 0, 0, -1, ""))), S(2), S(2));
        c = take(f, SHARED_SCRIPT_SUBMIT);
        assert_string_equal(arg(c, 6), rids[0]);
        no_call(f);
}

/* A batch lost with the link (its answer never comes, or comes late from the old connection) is sent again
 * whole after the registering tick: the same operations, the same rids (each idempotent). */
static void test_batch_lost_with_the_link_is_sent_again_whole(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        int cookies[3];
        char rids[3][17], again[3][17];
        submit_n(f, cookies, 3, S(2));
        const SharedCall *c = take_batch(f, 3, rids);
        uint64_t lost = c->id;
        pool_shared_link_down(f->pool, S(3));
        pool_shared_link_up(f->pool, "run1", S(4));
        pool_shared_call_done(f->pool, lost, -ECONNRESET, NULL, S(2), S(4)); /* the old link's, late */
        tick_ok(f, S(4), S(4));
        c = take_batch_fresh(f, 3, again, "000"); /* they may have run: looked up */
        for (size_t i = 0; i < 3; i++)
                assert_string_equal(again[i], rids[i]);
        /* The old connection's answer, if it came now, is of nothing sent: dropped. */
        pool_shared_call_done(f->pool, lost, 0, &(RespValue) { .type = RESP_NIL }, S(2), S(4));
        assert_int_equal(f->n_seen, 0);
        assert_int_equal(bad_inputs(f), 0);
        done(f, c, arr(3, granted_reply(rids[0], S(4), 7, 0), granted_reply(rids[1], S(4), 8, 1),
                       queued_reply(rids[2], S(4))), S(4), S(4));
        assert_int_equal(f->n_seen, 3);
        /* An error before the answer (a timeout): each goes again, as one call would. */
        int more[2];
        char r2[2][17], r3[2][17];
        submit_n(f, more, 2, S(5));
        c = take_batch_fresh(f, 2, r2, "11");
        pool_shared_call_done(f->pool, c->id, -ETIMEDOUT, NULL, S(5), S(6));
        c = take_batch_fresh(f, 2, r3, "00");
        assert_string_equal(r2[0], r3[0]);
        assert_string_equal(r2[1], r3[1]);
}

/* The answer to a batch is untrusted input (SPEC §11): more replies than operations, none, not an array,
 * fewer without a status that stops, an element not a reply — counted as bad input, the requests refused
 * ("bad-reply") as one call's would be, never a crash. */
static void test_batch_bad_replies_are_bad_input(void **state) {
        Fixture *f = *state;
        bring_up(f, S(1));
        RespValue ok = queued_reply("0000000000000000", S(2));
        const RespValue forged[] = {
                arr(3, ok, ok, ok),
                EMPTY,
                num(2),
                str("ok"),
                arr(1, granted_reply("0000000000000000", S(2), 7, 0)), /* fewer, the last "ok" */
                arr(2, num(1), str("x")),
                arr(2, EMPTY, arr(6, num(1), num(2), num(3), num(4), num(5), num(6))),
        };
        for (size_t i = 0; i < ELEMENTSOF(forged); i++) {
                int cookies[2];
                f->n_seen = 0;
                submit_n(f, cookies, 2, S(2));
                const SharedCall *c = take_batch(f, 2, NULL);
                uint64_t before = bad_inputs(f);
                done(f, c, forged[i], S(2), S(2));
                assert_true(bad_inputs(f) > before);
                /* Both answered here, refused; their withdrawals go out (they may have run). */
                assert_int_equal(f->n_seen, 2);
                assert_int_equal(f->seen[0].verdict, POOL_VERDICT_REFUSED);
                assert_int_equal(f->seen[1].verdict, POOL_VERDICT_REFUSED);
                const SharedCall *w = take_batch(f, 2, NULL);
                assert_string_equal(arg(w, 7), "withdraw");
                RespValue gone = reply("ok", S(2), arr(1, str("gone")), EMPTY, cache(0, 0, 0, -1, ""));
                done(f, w, arr(2, gone, gone), S(2), S(2));
                no_call(f);
        }
}

/* ------------------------------------------------------------------ cooldown: rests in the cache (issue 23) */

/* A cache with its 13th element, the rests (brokerd/lua/README, "Replies"). */
static RespValue cache_rests(RespValue rests) {
        return arr(13, num(0), num(1), num(0), num(0), num(0), num(-1), num(100), str("e1"), num(0), str(""), num(2),
                   str(""), rests);
}

static void submit_answered_with(Fixture *f, void *cookie, usec_t now, RespValue with) {
        assert_int_equal(submit(f, cookie, 1, true, now), 0);
        const SharedCall *c = take(f, SHARED_SCRIPT_SUBMIT);
        char rid[17];
        snprintf(rid, sizeof rid, "%s", arg(c, 6));
        done(f, c, reply("ok", (int64_t) now, decision("queued", rid, (int64_t) now, 0, "", 0, 0, EMPTY), EMPTY, with),
             now, now);
}

/* Every node shows the pool's rests from its last reply; an identity it does not know is left out (a reload
 * not agreed yet); a list of another shape, or an end that is not an integer, is bad input and shows none. */
static void test_rests_in_the_cache_are_shown_and_bad_ones_counted(void **state) {
        Fixture *f = *state;
        int cookie[8];
        bring_up(f, S(1));
        submit_answered_with(f, &cookie[0], S(1),
                             cache_rests(arr(4, str("#1"), str("5000000"), str("#7"), str("6000000"))));
        PoolInfo info;
        f->pool->ops->info(f->pool, S(1), &info);
        assert_int_equal(info.n_resting, 1);
        assert_int_equal(info.resting[0].index, 1);
        assert_null(info.resting[0].member);
        assert_int_equal(info.resting[0].until, S(5));
        assert_int_equal(bad_inputs(f), 0);
        static const char *const ends[] = { "1e+20", "inf", "-5", "", "12345678901234567", "5 " };
        for (size_t i = 0; i < ELEMENTSOF(ends); i++) {
                submit_answered_with(f, &cookie[1], S(2), cache_rests(arr(2, str("#0"), str(ends[i]))));
                f->pool->ops->info(f->pool, S(2), &info);
                assert_int_equal(info.n_resting, 0);
                assert_int_equal(bad_inputs(f), i + 1);
        }
        submit_answered_with(f, &cookie[2], S(2), cache_rests(arr(1, str("#0"))));
        assert_int_equal(bad_inputs(f), ELEMENTSOF(ends) + 1);
        submit_answered_with(f, &cookie[3], S(2), cache_rests(arr(2, num(0), num(5000000))));
        assert_int_equal(bad_inputs(f), ELEMENTSOF(ends) + 2);
        /* A cache without the element (a pool without cooldown=): none. */
        submit_answered_with(f, &cookie[4], S(2), cache_rests(arr(2, str("#0"), str("5000000"))));
        f->pool->ops->info(f->pool, S(2), &info);
        assert_int_equal(info.n_resting, 1);
        submit_answered_with(f, &cookie[5], S(3), cache(0, 1, 0, -1, ""));
        f->pool->ops->info(f->pool, S(3), &info);
        assert_int_equal(info.n_resting, 0);
        assert_null(info.resting);
        /* An empty list as the scripts send it (nil): none, and no bad input. */
        submit_answered_with(f, &cookie[6], S(3), cache_rests(arr(2, str("#1"), str("5000000"))));
        f->pool->ops->info(f->pool, S(3), &info);
        assert_int_equal(info.n_resting, 1);
        submit_answered_with(f, &cookie[7], S(4), cache_rests(NIL));
        f->pool->ops->info(f->pool, S(4), &info);
        assert_int_equal(info.n_resting, 0);
        assert_int_equal(bad_inputs(f), ELEMENTSOF(ends) + 2);
}

/* ------------------------------------------------------------------- all-or-nothing sets (set.lua) */

/* Two pools of one backend, "grid" (the chosen pool: it sends the set's call) and "db", each finding the
 * other by name (SharedPoolParams.find_pool), both up. A set asks one slot of each. */
typedef struct SetFixture {
        Fixture *grid, *db;
        Pool *pools[2];
        int cookie[2];
        char rid[17];
        uint64_t call_order; /* both pools' SharedPoolParams.call_order: one link's */
} SetFixture;

static Pool *set_find_pool(const char *name, void *userdata) {
        SetFixture *s = userdata;
        return streq(name, "grid") ? s->grid->pool : streq(name, "db") ? s->db->pool : NULL;
}

static int setup_set(void **state) {
        SetFixture *s = calloc(1, sizeof(SetFixture));
        assert_non_null(s);
        fixture_find_pool = set_find_pool;
        fixture_find_pool_userdata = s;
        fixture_call_order = &s->call_order;
        s->grid = fixture_new(false);
        fixture_name = "db";
        s->db = fixture_new(false);
        fixture_name = "grid";
        fixture_find_pool = NULL;
        fixture_find_pool_userdata = NULL;
        fixture_call_order = NULL;
        s->pools[0] = s->grid->pool;
        s->pools[1] = s->db->pool;
        bring_up(s->grid, S(1));
        bring_up(s->db, S(1));
        *state = s;
        return 0;
}

static int teardown_set(void **state) {
        SetFixture *s = *state;
        fixture_free(s->grid);
        fixture_free(s->db);
        free(s);
        return 0;
}

static int set_submit(SetFixture *s, bool may_wait, usec_t now) {
        PoolTry t[2];
        for (size_t i = 0; i < 2; i++)
                t[i] = (PoolTry) { .cookie = &s->cookie[i], .lane = "ci", .slots = 1, .may_wait = may_wait,
                                   .lane_budget = USEC_INFINITY, .client_cap = USEC_INFINITY, .arrival = now };
        return s->pools[0]->ops->submit_set(s->pools, t, 2, now);
}

/* The set's call, from the chosen pool only: KEYS both prefixes (set.lua's order), then ARGV [1..5] the
 * head, [6] mode, [7] rid (kept in s->rid). */
static const SharedCall *take_set(SetFixture *s, const char *mode) {
        no_call(s->db);
        const SharedCall *c = NULL;
        assert_true(pool_shared_take_call(s->grid->pool, s->grid->clock, &c));
        assert_string_equal(shared_script_to_string(c->script), "set");
        assert_int_equal(c->n_keys, 2);
        assert_string_equal(arg(c, 0), "{sb:grid}");
        assert_string_equal(arg(c, 1), "{sb:db}");
        assert_string_equal(arg(c, 2), "1");
        assert_string_equal(arg(c, 3), NODE);
        assert_string_equal(arg(c, 7), mode);
        snprintf(s->rid, sizeof s->rid, "%s", arg(c, 8));
        return c;
}

/* The pools of one link number their calls with one count (SharedPoolParams.call_order), so that the driver
 * sends them in the order the engine made them whatever the pool (backend.c; test-shared-diff's
 * set-refused-frees-two-pools): the next call of each says its number; one taken, or of a pool whose link is
 * down, is not next. */
static void test_calls_are_numbered_across_the_pools_of_one_link(void **state) {
        SetFixture *s = *state;
        uint64_t grid, db, again;
        assert_false(pool_shared_next_call(s->grid->pool, &grid));
        assert_false(pool_shared_next_call(s->db->pool, &db));

        /* db's call made first, then grid's: db's is the older, whichever pool the driver asks first. */
        assert_int_equal(submit(s->db, &s->cookie[1], 1, true, S(2)), 0);
        assert_int_equal(submit(s->grid, &s->cookie[0], 1, true, S(2)), 0);
        assert_true(pool_shared_next_call(s->grid->pool, &grid));
        assert_true(pool_shared_next_call(s->db->pool, &db));
        assert_true(db < grid);
        assert_int_equal(grid, s->call_order);

        take(s->db, SHARED_SCRIPT_SUBMIT);
        assert_false(pool_shared_next_call(s->db->pool, &again));
        assert_true(pool_shared_next_call(s->grid->pool, &again));
        assert_int_equal(again, grid);

        /* Nothing goes on a link that is down. */
        pool_shared_link_down(s->grid->pool, S(3));
        assert_false(pool_shared_next_call(s->grid->pool, &again));
}

/* One pool's reply inside the set's answer; the answer itself: { status, pool, verdict, { reply… } }. */
static RespValue part(RespValue body) {
        return reply("ok", S(2), body, EMPTY, cache(1, 0, 0, -1, ""));
}

static RespValue set_answer(const char *status, int64_t by, const char *verdict, RespValue replies) {
        return arr(4, str(status), num(by), str(verdict), replies);
}

static RespValue queued_d(const char *rid) {
        return decision("queued", rid, S(2), 0, "", 0, 1, EMPTY);
}

static RespValue granted_d(const char *rid, int64_t token, int64_t slot) {
        return decision("granted", rid, S(2), 0, "", 0, token, arr(1, num(slot)));
}

static void set_reply(SetFixture *s, const SharedCall *c, RespValue answer) {
        pool_shared_call_done(s->grid->pool, c->id, 0, &answer, S(2), S(2));
}

static const Seen *last_seen(const Fixture *f) {
        assert_true(f->n_seen > 0);
        return &f->seen[f->n_seen - 1];
}

/* Both parts queued: their waiters are the last QUEUED of each pool. */
static void set_queued(SetFixture *s) {
        assert_int_equal(set_submit(s, true, S(2)), 0);
        const SharedCall *c = take_set(s, "submit");
        set_reply(s, c, set_answer("ok", 0, "queued", arr(2, part(queued_d(s->rid)), part(queued_d(s->rid)))));
        assert_int_equal(last_seen(s->grid)->verdict, POOL_VERDICT_QUEUED);
        assert_int_equal(last_seen(s->db)->verdict, POOL_VERDICT_QUEUED);
}

/* A set's part that Redis lost with its data is not submitted again alone (its set's call grants it, in
 * every pool at once): refused "backend" (not "node-expired": the node did not expire), its rid withdrawn. */
static void test_set_part_lost_with_redis_data_is_refused_backend(void **state) {
        SetFixture *s = *state;
        set_queued(s);
        Fixture *f = s->grid;
        size_t seen = f->n_seen;
        f->clock = S(3);
        pool_shared_link_down(f->pool, S(2));
        pool_shared_link_up(f->pool, "run2", S(3));
        const SharedCall *t = take(f, SHARED_SCRIPT_TICK);
        done(f, t, reply("ok", (int64_t) S(3), tick_body_lost("e2"), EMPTY, cache_lost("e2")), S(3), S(3));
        assert_int_equal(f->n_seen, seen);
        positions_gone(f, "e2", S(4));
        assert_int_equal(f->n_seen, seen + 1);
        assert_int_equal(last_seen(f)->verdict, POOL_VERDICT_REFUSED);
        assert_string_equal(last_seen(f)->reason, "backend");
        const SharedCall *w = take_after_ticks(f, SHARED_SCRIPT_WITHDRAW, "e2", S(4));
        assert_string_equal(arg(w, 6), s->rid);
}

static bool set_ready(SetFixture *s, size_t i) {
        Fixture *f = i == 0 ? s->grid : s->db;
        for (size_t j = f->n_seen; j-- > 0;)
                if (f->seen[j].verdict == POOL_VERDICT_QUEUED)
                        return f->pool->ops->ready(f->pool, f->seen[j].waiter);
        fail();
        return false;
}

static PoolWaiter *set_waiter(Fixture *f) {
        for (size_t j = f->n_seen; j-- > 0;)
                if (f->seen[j].verdict == POOL_VERDICT_QUEUED)
                        return f->seen[j].waiter;
        fail();
        return NULL;
}

static void set_said_ready(SetFixture *s) {
        RespValue fields = arr(4, str("verdict"), str("ready"), str("rid"), str(s->rid));
        pool_shared_stream_entry(s->grid->pool, "9-1", &fields, S(2));
        pool_shared_stream_entry(s->db->pool, "9-1", &fields, S(2));
        assert_int_equal(last_seen(s->grid)->verdict, POOL_VERDICT_READY);
        assert_int_equal(last_seen(s->db)->verdict, POOL_VERDICT_READY);
}

static const SharedCall *set_grant_call(SetFixture *s) {
        PoolWaiter *w[2] = { set_waiter(s->grid), set_waiter(s->db) };
        assert_int_equal(s->pools[0]->ops->grant_set(s->pools, w, 2, S(2)), 0);
        const SharedCall *c = take_set(s, "grant");
        assert_int_equal(c->argc, 10);
        assert_string_equal(arg(c, 9), "2"); /* ARGV[8]: n */
        return c;
}

/* Each part refused here, "bad-reply" (or reason), and its rid withdrawn in its pool (which releases a lease
 * Redis may hold under it); nothing held in either pool. */
static void assert_set_refused(SetFixture *s, const char *reason) {
        Fixture *fs[2] = { s->grid, s->db };
        for (size_t i = 0; i < 2; i++) {
                const Seen *l = last_seen(fs[i]);
                assert_int_equal(l->verdict, POOL_VERDICT_REFUSED);
                assert_ptr_equal(l->cookie, &s->cookie[i]);
                assert_string_equal(l->reason, reason);
                const SharedCall *w = take(fs[i], SHARED_SCRIPT_WITHDRAW);
                assert_string_equal(arg(w, 6), s->rid);
                done(fs[i], w, reply("ok", S(2), arr(1, str("gone")), EMPTY, cache(0, 0, 0, -1, "")), S(2), S(2));
                PoolInfo info;
                fs[i]->pool->ops->info(fs[i]->pool, S(2), &info);
                assert_int_equal(info.in_use, 0);
                assert_int_equal(info.waiting, 0);
        }
        no_call(s->grid);
        no_call(s->db);
}

static uint64_t set_bad_inputs(SetFixture *s) {
        return bad_inputs(s->grid) + bad_inputs(s->db);
}

static void test_set_submit_carries_every_pool_and_is_queued_in_both(void **state) {
        SetFixture *s = *state;
        assert_int_equal(set_submit(s, true, S(2)), 0);
        const SharedCall *c = take_set(s, "submit");
        /* ARGV [8] lane [9] may_wait [10] n, then per pool k, lane_budget_set, lane_budget, client_cap, arrival,
         * selector. */
        assert_int_equal(c->argc, 2 + 10 + 2 * 6);
        assert_string_equal(arg(c, 9), "ci");
        assert_string_equal(arg(c, 10), "1");
        assert_string_equal(arg(c, 11), "2");
        for (size_t i = 0; i < 2; i++) {
                assert_string_equal(arg(c, 12 + 6 * i), "1");
                assert_string_equal(arg(c, 13 + 6 * i), "0");
                assert_string_equal(arg(c, 14 + 6 * i), "-1");
                assert_string_equal(arg(c, 15 + 6 * i), "-1");
                assert_string_equal(arg(c, 17 + 6 * i), "");
        }
        set_reply(s, c, set_answer("ok", 0, "queued", arr(2, part(queued_d(s->rid)), part(queued_d(s->rid)))));
        assert_int_equal(s->grid->n_seen, 1);
        assert_int_equal(s->db->n_seen, 1);
        assert_int_equal(s->grid->seen[0].verdict, POOL_VERDICT_QUEUED);
        assert_ptr_equal(s->grid->seen[0].cookie, &s->cookie[0]);
        assert_int_equal(s->db->seen[0].verdict, POOL_VERDICT_QUEUED);
        assert_ptr_equal(s->db->seen[0].cookie, &s->cookie[1]);
        assert_false(set_ready(s, 0));
        assert_false(set_ready(s, 1));
        assert_int_equal(set_bad_inputs(s), 0);
}

static void test_set_granted_in_both_with_each_pool_token(void **state) {
        SetFixture *s = *state;
        assert_int_equal(set_submit(s, false, S(2)), 0);
        const SharedCall *c = take_set(s, "submit");
        assert_string_equal(arg(c, 10), "0");
        set_reply(s, c, set_answer("ok", 0, "granted", arr(2, part(granted_d(s->rid, 7, 1)),
                                                             part(granted_d(s->rid, 31, 0)))));
        assert_int_equal(s->grid->n_seen, 1);
        assert_int_equal(s->grid->seen[0].verdict, POOL_VERDICT_GRANTED);
        assert_int_equal(s->grid->seen[0].token, 7);
        assert_int_equal(s->grid->seen[0].slot0, 1);
        assert_int_equal(s->db->n_seen, 1);
        assert_int_equal(s->db->seen[0].verdict, POOL_VERDICT_GRANTED);
        assert_int_equal(s->db->seen[0].token, 31);
        assert_int_equal(s->db->seen[0].slot0, 0);
        no_call(s->grid);
        no_call(s->db);
        assert_int_equal(set_bad_inputs(s), 0);
}

static void test_set_refused_by_pool_2_is_echoed_by_pool_1(void **state) {
        SetFixture *s = *state;
        assert_int_equal(set_submit(s, false, S(2)), 0);
        const SharedCall *c = take_set(s, "submit");
        set_reply(s, c, set_answer("ok", 2, "refused",
                                   arr(2, part(EMPTY), part(decision("refused", s->rid, S(2), 0, "busy", 0, 0, EMPTY)))));
        assert_int_equal(s->db->n_seen, 1);
        assert_int_equal(s->db->seen[0].verdict, POOL_VERDICT_REFUSED);
        assert_int_equal(s->db->seen[0].refusal, REFUSAL_BUSY);
        assert_int_equal(s->grid->n_seen, 1);
        assert_int_equal(s->grid->seen[0].verdict, POOL_VERDICT_REFUSED);
        assert_int_equal(s->grid->seen[0].refusal, REFUSAL_BUSY);
        assert_true(s->grid->seen[0].echo);
        assert_false(s->db->seen[0].echo);
        /* Nothing was written in Redis: nothing to withdraw. */
        no_call(s->grid);
        no_call(s->db);
        assert_int_equal(set_bad_inputs(s), 0);
}

/* Said ready in its answer's events (pool 1) and in the stream (pool 2); the grant call then, granted. */
static void test_set_said_ready_then_granted_in_one_call(void **state) {
        SetFixture *s = *state;
        assert_int_equal(set_submit(s, true, S(2)), 0);
        const SharedCall *c = take_set(s, "submit");
        RespValue ready = decision("ready", s->rid, S(2), 0, "", 0, 0, EMPTY);
        set_reply(s, c, set_answer("ok", 0, "queued",
                                   arr(2, reply("ok", S(2), queued_d(s->rid), arr(1, ready), cache(1, 1, 0, -1, "")),
                                       part(queued_d(s->rid)))));
        assert_true(set_ready(s, 0));
        assert_false(set_ready(s, 1));
        RespValue fields = arr(4, str("verdict"), str("ready"), str("rid"), str(s->rid));
        pool_shared_stream_entry(s->db->pool, "9-1", &fields, S(2));
        assert_int_equal(last_seen(s->db)->verdict, POOL_VERDICT_READY);
        assert_true(set_ready(s, 1));
        /* Ready of a rid that is no set's part here: nothing. */
        size_t n = s->db->n_seen;
        RespValue other = arr(4, str("verdict"), str("ready"), str("rid"), str("00000000000000ff"));
        pool_shared_stream_entry(s->db->pool, "9-2", &other, S(2));
        assert_int_equal(s->db->n_seen, n);

        c = set_grant_call(s);
        assert_string_equal(arg(c, 8), s->rid);
        set_reply(s, c, set_answer("ok", 0, "granted", arr(2, part(granted_d(s->rid, 8, 0)),
                                                             part(granted_d(s->rid, 9, 1)))));
        assert_int_equal(last_seen(s->grid)->verdict, POOL_VERDICT_GRANTED);
        assert_int_equal(last_seen(s->grid)->token, 8);
        assert_int_equal(last_seen(s->db)->verdict, POOL_VERDICT_GRANTED);
        assert_int_equal(last_seen(s->db)->token, 9);
        assert_int_equal(set_bad_inputs(s), 0);
}

/* "not-ready" and "gone": nothing granted, both parts QUEUED again (the engine awaits every part); the part
 * of the pool named is not ready until said so again, the other stays as it was said (set.lua unreadies only
 * the part it found not ready). */
static void test_set_grant_not_ready_or_gone_waits_again(void **state) {
        static const char *const verdicts[] = { "not-ready", "gone" };
        SetFixture *s = *state;
        set_queued(s);
        for (size_t i = 0; i < ELEMENTSOF(verdicts); i++) {
                set_said_ready(s);
                const SharedCall *c = set_grant_call(s);
                RespValue body2 = i == 0 ? EMPTY : arr(1, str("gone"));
                set_reply(s, c, set_answer("ok", 2, verdicts[i], arr(2, part(EMPTY), part(body2))));
                assert_int_equal(last_seen(s->grid)->verdict, POOL_VERDICT_QUEUED);
                assert_int_equal(last_seen(s->db)->verdict, POOL_VERDICT_QUEUED);
                assert_true(set_ready(s, 0));
                assert_false(set_ready(s, 1));
                no_call(s->grid);
        }
        assert_int_equal(set_bad_inputs(s), 0);
}

static void test_set_settling_is_sent_again(void **state) {
        SetFixture *s = *state;
        assert_int_equal(set_submit(s, true, S(2)), 0);
        const SharedCall *c = take_set(s, "submit");
        char rid[17];
        snprintf(rid, sizeof rid, "%s", s->rid);
        set_reply(s, c, set_answer("settling", 1, "", arr(1, reply("settling", S(2), EMPTY, EMPTY, EMPTY))));
        assert_int_equal(s->grid->n_seen + s->db->n_seen, 0);
        c = take_set(s, "submit");
        assert_string_equal(s->rid, rid);
        set_reply(s, c, set_answer("ok", 0, "queued", arr(2, part(queued_d(rid)), part(queued_d(rid)))));
        assert_int_equal(last_seen(s->grid)->verdict, POOL_VERDICT_QUEUED);
        assert_int_equal(last_seen(s->db)->verdict, POOL_VERDICT_QUEUED);
}

/* Pool 2 lost its registration: it registers again (its tick) before the set goes again, unchanged. */
static void test_set_unregistered_of_pool_2_waits_until_it_serves(void **state) {
        SetFixture *s = *state;
        assert_int_equal(set_submit(s, true, S(2)), 0);
        const SharedCall *c = take_set(s, "submit");
        char rid[17];
        snprintf(rid, sizeof rid, "%s", s->rid);
        set_reply(s, c, set_answer("unregistered", 2, "",
                                   arr(2, part(EMPTY), reply("unregistered", 0, EMPTY, EMPTY, EMPTY))));
        assert_int_equal(s->grid->n_seen + s->db->n_seen, 0);
        assert_int_equal(pool_shared_state(s->db->pool), SHARED_STATE_REGISTERING);
        no_call(s->grid); /* held while pool 2 does not serve */
        tick_ok(s->db, S(3), S(3));
        assert_int_equal(pool_shared_state(s->db->pool), SHARED_STATE_UP);
        c = take_set(s, "submit");
        assert_string_equal(s->rid, rid);
        set_reply(s, c, set_answer("ok", 0, "queued", arr(2, part(queued_d(rid)), part(queued_d(rid)))));
        assert_int_equal(last_seen(s->db)->verdict, POOL_VERDICT_QUEUED);
}

/* A script error (out of memory under noeviction): refused in both, not sent again. Not bad input: Redis's own
 * word, as for a lone call (test_call_answered_with_garbage_waits_for_the_next_heartbeat). */
static void test_set_error_reply_refuses_in_every_pool(void **state) {
        SetFixture *s = *state;
        assert_int_equal(set_submit(s, true, S(2)), 0);
        const SharedCall *c = take_set(s, "submit");
        RespValue e = { .type = RESP_ERROR, .str = "OOM", .len = 3 };
        set_reply(s, c, e);
        assert_set_refused(s, "backend");
        assert_int_equal(set_bad_inputs(s), 0);
}

/* Answers of another shape than set.lua's, each to a fresh set (submit mode): counted, the set refused in
 * both pools and its rid withdrawn in each, nothing held. */
static RespValue bad_set_answer(size_t i, const char *rid) {
        switch (i) {
        case 0: /* wrong length */
                return arr(3, str("ok"), num(0), str("queued"));
        case 1: /* pool index out of range */
                return set_answer("ok", 3, "refused", arr(2, part(EMPTY), part(EMPTY)));
        case 2:
                return set_answer("ok", -1, "queued", arr(2, part(queued_d(rid)), part(queued_d(rid))));
        case 3: /* more replies than pools */
                return set_answer("ok", 0, "queued",
                                  arr(3, part(queued_d(rid)), part(queued_d(rid)), part(queued_d(rid))));
        case 4: /* a verdict that is not a string */
                return arr(4, str("ok"), num(0), num(1), arr(2, part(queued_d(rid)), part(queued_d(rid))));
        case 5: /* bodies that are not Decisions */
                return set_answer("ok", 0, "queued", arr(2, part(queued_d(rid)), part(arr(1, str("x")))));
        case 6:
                return set_answer("ok", 0, "queued", arr(2, part(num(5)), part(queued_d(rid))));
        case 7: /* a Decision of another rid */
                return set_answer("ok", 0, "queued", arr(2, part(queued_d(rid)), part(queued_d("00000000000000ff"))));
        case 8: /* fewer replies than pools */
                return set_answer("ok", 0, "queued", arr(1, part(queued_d(rid))));
        case 9: /* an unknown verdict */
                return set_answer("ok", 0, "maybe", arr(2, part(queued_d(rid)), part(queued_d(rid))));
        case 10: /* a reply of another shape in it */
                return set_answer("ok", 0, "queued", arr(2, part(queued_d(rid)), arr(2, str("ok"), num(1))));
        case 11: /* "refused" whose body is not that pool's refusal */
                return set_answer("ok", 2, "refused", arr(2, part(EMPTY), part(queued_d(rid))));
        case 12: /* "queued" whose bodies say otherwise */
                return set_answer("ok", 0, "queued", arr(2, part(queued_d(rid)), part(granted_d(rid, 5, 0))));
        case 13: /* "not-ready" to a submit: nothing would ever answer the parts */
                return set_answer("ok", 2, "not-ready", arr(2, part(EMPTY), part(EMPTY)));
        case 14:
                return set_answer("ok", 2, "gone", arr(2, part(EMPTY), part(arr(1, str("gone")))));
        default: /* "refused" naming no pool */
                return set_answer("ok", 0, "refused", arr(2, part(EMPTY), part(EMPTY)));
        }
}

static void test_set_answers_of_another_shape_refuse_the_set_in_every_pool(void **state) {
        SetFixture *s = *state;
        for (size_t i = 0; i < 16; i++) {
                uint64_t bad = set_bad_inputs(s);
                arena_used = 0;
                assert_int_equal(set_submit(s, true, S(2)), 0);
                const SharedCall *c = take_set(s, "submit");
                set_reply(s, c, bad_set_answer(i, s->rid));
                assert_set_refused(s, "bad-reply");
                assert_true(set_bad_inputs(s) > bad);
        }
}

/* Granted, but one part grants a slot out of its pool's range: no part is handed out, and the good part's
 * lease goes back (its rid withdrawn: withdraw releases a lease under it). Either order. */
static void test_set_granted_with_a_bad_part_gives_the_good_part_back(void **state) {
        SetFixture *s = *state;
        for (size_t bad_pool = 0; bad_pool < 2; bad_pool++) {
                size_t grid_seen = s->grid->n_seen, db_seen = s->db->n_seen;
                uint64_t bad = set_bad_inputs(s);
                assert_int_equal(set_submit(s, false, S(2)), 0);
                const SharedCall *c = take_set(s, "submit");
                RespValue good = part(granted_d(s->rid, 7, 0)), wrong = part(granted_d(s->rid, 8, 5));
                set_reply(s, c, set_answer("ok", 0, "granted", bad_pool == 0 ? arr(2, wrong, good) : arr(2, good, wrong)));
                assert_int_equal(s->grid->n_seen, grid_seen + 1);
                assert_int_equal(s->db->n_seen, db_seen + 1);
                assert_set_refused(s, "bad-reply");
                assert_true(set_bad_inputs(s) > bad);
        }
}

/* The grant call answered "queued" (set.lua's grant never says so): the engine awaits an answer of every
 * part, so the set is refused, not left waiting for nothing. */
static void test_set_grant_answered_queued_is_refused(void **state) {
        SetFixture *s = *state;
        set_queued(s);
        set_said_ready(s);
        const SharedCall *c = set_grant_call(s);
        set_reply(s, c, set_answer("ok", 0, "queued", arr(2, part(queued_d(s->rid)), part(queued_d(s->rid)))));
        assert_set_refused(s, "bad-reply");
}

/* A set's part is granted only by its set's call (lua/README: its pool never grants it alone). A grant of one
 * part from the stream while no call of its set is out would hold that pool's slot while the set waits for
 * the other: dropped, counted, the set refused and its rid withdrawn in each pool (which releases the lease
 * Redis may hold under it). While the grant call is out, its stream copy may come before its reply: taken. */
static void test_set_part_granted_outside_its_call_is_refused(void **state) {
        SetFixture *s = *state;
        set_queued(s);
        uint64_t bad = set_bad_inputs(s);
        RespValue fields = granted_entry(s->rid, "11", "0", "");
        pool_shared_stream_entry(s->db->pool, "9-3", &fields, S(2));
        assert_true(set_bad_inputs(s) > bad);
        const Seen *l = last_seen(s->db);
        assert_int_equal(l->verdict, POOL_VERDICT_REFUSED);
        assert_string_equal(l->reason, "bad-reply");
        const SharedCall *w = take(s->db, SHARED_SCRIPT_WITHDRAW);
        assert_string_equal(arg(w, 6), s->rid);

        /* Another set, its grant call out: the stream's copy first, then the reply. */
        arena_used = 0;
        set_queued(s);
        set_said_ready(s);
        const SharedCall *c = set_grant_call(s);
        bad = set_bad_inputs(s);
        fields = granted_entry(s->rid, "12", "1", "");
        pool_shared_stream_entry(s->db->pool, "9-4", &fields, S(2));
        assert_int_equal(last_seen(s->db)->verdict, POOL_VERDICT_GRANTED);
        set_reply(s, c, set_answer("ok", 0, "granted", arr(2, part(granted_d(s->rid, 8, 0)),
                                                             part(granted_d(s->rid, 12, 1)))));
        assert_int_equal(last_seen(s->grid)->verdict, POOL_VERDICT_GRANTED);
        assert_int_equal(set_bad_inputs(s), bad);
}

/* The link lost while the call is out: the same call again (idempotent by rid) once the pools are up. */
static void test_set_lost_with_the_link_is_sent_again(void **state) {
        SetFixture *s = *state;
        assert_int_equal(set_submit(s, true, S(2)), 0);
        const SharedCall *c = take_set(s, "submit");
        char rid[17];
        snprintf(rid, sizeof rid, "%s", s->rid);
        size_t argc = c->argc;
        uint64_t id = c->id;
        pool_shared_call_done(s->grid->pool, id, -ECONNRESET, NULL, S(2), S(2));
        pool_shared_link_down(s->grid->pool, S(2));
        pool_shared_link_down(s->db->pool, S(2));
        no_call(s->grid);
        assert_int_equal(s->grid->n_seen + s->db->n_seen, 0);
        bring_up(s->grid, S(3));
        no_call(s->grid); /* db does not serve yet */
        bring_up(s->db, S(3));
        c = take_set(s, "submit");
        assert_string_equal(s->rid, rid);
        assert_int_equal(c->argc, argc);
        set_reply(s, c, set_answer("ok", 0, "queued", arr(2, part(queued_d(rid)), part(queued_d(rid)))));
        assert_int_equal(last_seen(s->grid)->verdict, POOL_VERDICT_QUEUED);
        assert_int_equal(last_seen(s->db)->verdict, POOL_VERDICT_QUEUED);
}

/* The client goes: the engine cancels the set's try in each pool (no part was answered yet). */
static void set_cancel(SetFixture *s, usec_t now) {
        s->grid->pool->ops->cancel_try(s->grid->pool, &s->cookie[0], now);
        s->db->pool->ops->cancel_try(s->db->pool, &s->cookie[1], now);
}

/* A set given up while its call is to go again (its answer lost with the link; given up while the call was
 * out, or after): each pool withdraws its rid (the call may have run), but only the chosen pool's withdraw
 * would follow the set's call in one outbox. Here db is back first: its withdraw goes first and finds
 * nothing; the set's call, sent after it, would queue a part in db that nobody waits for (gated, it would
 * hold back db's queue on every node until a reconcile dropped it). The set's call is dropped instead: no
 * call of the rid after its withdraws. */
static void set_given_up_and_back(SetFixture *s, bool while_out) {
        assert_int_equal(set_submit(s, true, S(2)), 0);
        const SharedCall *c = take_set(s, "submit");
        char rid[17];
        snprintf(rid, sizeof rid, "%s", s->rid);
        if (while_out)
                set_cancel(s, S(2));
        pool_shared_call_done(s->grid->pool, c->id, -ECONNRESET, NULL, S(2), S(2));
        pool_shared_link_down(s->grid->pool, S(2));
        pool_shared_link_down(s->db->pool, S(2));
        if (!while_out)
                set_cancel(s, S(3));
        bring_up(s->db, S(3));
        const SharedCall *w = take(s->db, SHARED_SCRIPT_WITHDRAW);
        assert_string_equal(arg(w, 6), rid);
        done(s->db, w, reply("ok", S(3), arr(1, str("gone")), EMPTY, cache(0, 0, 0, -1, "")), S(3), S(3));
        no_call(s->db);
        /* grid is back: its withdraw goes, and the set's call does not. */
        bring_up(s->grid, S(3));
        w = take(s->grid, SHARED_SCRIPT_WITHDRAW);
        assert_string_equal(arg(w, 6), rid);
        no_call(s->grid);
        no_call(s->db);
        assert_int_equal(s->grid->n_seen + s->db->n_seen, 0); /* nothing reaches the client, gone */
        assert_int_equal(set_bad_inputs(s), 0);
}

static void test_set_given_up_while_its_call_goes_again_leaves_no_part_queued(void **state) {
        set_given_up_and_back(*state, false);
}

static void test_set_given_up_while_out_is_not_sent_after_the_link_is_back(void **state) {
        set_given_up_and_back(*state, true);
}

int main(void) {
#define T(x) cmocka_unit_test_setup_teardown(x, setup, teardown)
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_resumed_waiter_keeps_its_rid_and_is_listed_by_the_first_reconcile,
                                                setup, teardown),
                cmocka_unit_test_setup_teardown(test_resumed_waiter_remakes_a_reconcile_not_sent_yet, setup, teardown),
                cmocka_unit_test_setup_teardown(test_resumed_waiter_whose_budget_ended_is_not_granted_late, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_resumed_waiter_granted_after_its_deadline_is_refused, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_resumed_waiter_with_a_bogus_rid_gets_a_new_one, setup, teardown),
                cmocka_unit_test_setup_teardown(test_resumed_waiter_is_refused_after_the_grace_without_a_backend,
                                                setup, teardown),
                T(test_submit_before_the_backend_is_reached),
                T(test_recovery_notice_carries_what_opened_the_window),
                T(test_request_that_may_wait_waits_for_the_first_registration),
                T(test_submit_checks_lane_and_size_itself),
                T(test_registering_tick_carries_name_canon_and_floor),
                T(test_every_tick_carries_the_highest_token_passed_on),
                T(test_refresh_snapshot_asks_after_the_call),
                T(test_a_status_fetch_asks_for_own_places_first),
                T(test_canon_carries_lane_budgets),
                T(test_canon_carries_labels_and_submit_its_selector),
                T(test_quarantines_from_replies_hostile_entries_dropped),
                T(test_quarantine_list_of_a_big_pool_found_by_name),
                T(test_quarantine_texts_from_replies_are_one_line),
                T(test_member_counts_survive_a_reload_without_the_member),
                T(test_member_counts_follow_their_names_across_reorders),
                T(test_submit_granted_at_once),
                T(test_queued_then_granted_through_the_stream_once),
                T(test_grant_copy_read_after_its_release_is_no_bad_input),
        T(test_grant_for_a_withdrawn_rid_is_released),
                T(test_a_call_waits_for_an_earlier_held_one_of_its_rid),
                T(test_cancel_try_before_the_answer),
                T(test_lost_reply_is_retried_with_the_same_rid),
                T(test_settling_sends_the_same_call_again),
                T(test_settling_for_ever_waits_for_a_heartbeat),
                T(test_withdraw_drops_a_submit_held_after_settling),
                T(test_submit_answered_settling_after_its_withdraw_went_is_dropped),
                T(test_waiters_are_kept_for_the_grace_then_refused),
                T(test_fence_deadline_from_the_last_acknowledged_heartbeat),
                T(test_node_ttl_by_reload_fences_on_the_shorter_until_agreed),
                T(test_a_release_is_owed_until_answered),
                T(test_a_pool_taken_back_wants_its_rules_again_at_once),
                T(test_revoke_grace_by_reload_moves_the_fence),
                T(test_renew_period_is_a_quarter_of_the_ttl_within_a_third_of_the_fence_window),
                T(test_a_pool_that_holds_nothing_renews_every_half_ttl),
                T(test_a_renewals_agreeing_fingerprint_stands_for_the_idle_tick),
                T(test_rules_a_reload_could_not_send_go_at_the_next_run),
                T(test_grant_read_after_the_vouch_deadline_is_released_not_handed_out),
                T(test_intents_are_replayed_in_order_after_a_reconnect),
                T(test_epoch_change_reclaims_every_lease),
                T(test_refused_pool_comes_back_when_the_cause_is_gone),
                T(test_link_failure_refuses_the_pool_loudly),
                T(test_identity_refusal_keeps_ticking_and_clears_when_accepted),
                T(test_calls_carry_the_incarnation),
                T(test_restored_lease_fences_from_the_alive_mark),
                T(test_restored_lease_fences_on_its_recorded_ttl_until_agreed),
                T(test_restored_lease_is_reclaimed),
                T(test_lease_released_while_reclaimed_ends_the_reclaiming),
                T(test_release_drops_a_reclaim_parked_after_an_error),
                T(test_run_id_change_reclaims_every_lease),
                T(test_reclaimed_flag_follows_the_reclaims),
                T(test_rules_mismatch_refuses_and_keeps_heartbeating),
                T(test_a_rules_answer_to_rules_no_longer_wanted_refuses_nobody),
                T(test_keys_made_by_a_test_are_refused),
                T(test_lost_stream_entry_found_by_the_positions_round),
                T(test_positions_round_updates_places),
                T(test_fingerprint_mismatch_twice_reconciles),
                T(test_a_node_that_cannot_account_keeps_its_records_and_reconciles_once_it_can),
                T(test_a_malformed_kept_fingerprint_is_bad_input),
                T(test_a_page_made_unknowing_goes_with_k_or_lists_what_was_restored),
                T(test_busy_node_reconciles_at_a_bounded_period),
                T(test_a_settling_reconcile_tick_lists_what_was_sent_behind_it),
                T(test_status_snapshot_from_the_cache),
                T(test_positions_gone_refuses_the_waiter),
                T(test_positions_gone_after_redis_lost_its_data_submits_again),
                T(test_positions_gone_again_in_the_same_data_is_refused),
                T(test_resubmits_are_bounded_across_losses),
                T(test_resubmit_races_the_clients_cancel),
                T(test_next_wakeup_is_never_left_in_the_past),
                T(test_info_and_congestion_from_the_cache),
                T(test_unregistered_registers_again),
                cmocka_unit_test_setup_teardown(test_manual_clock_passes_now_and_leaves_the_instant_to_run,
                                                setup_manual, teardown),
                cmocka_unit_test_setup_teardown(test_manual_clock_has_no_instants_of_its_own, setup_manual, teardown),
                cmocka_unit_test_setup_teardown(test_rests_in_the_cache_are_shown_and_bad_ones_counted, setup_manual,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_manual_clock_reads_places_after_a_reload, setup_manual, teardown),
                cmocka_unit_test_setup_teardown(test_manual_clock_applies_stream_entries_in_reply_order, setup_manual,
                                                teardown),
                T(test_pool_clock_is_mapped_by_the_round_trip),
                T(test_recovery_window_refusal_carries_its_reason),
                T(test_drain_is_a_call),
                T(test_drains_from_replies_hostile_entries_dropped),
                T(test_drains_of_a_big_pool_each_once),
                T(test_a_repaired_key_is_counted_as_bad_input),
                T(test_a_repair_in_an_unregistered_reply_is_told),
                T(test_giving_back_while_a_withdrawal_can_go_out),
                T(test_min_replicas_grant_is_answered_once_wait_says_enough),
                T(test_min_replicas_too_few_refuse_and_release_the_lease),
                T(test_min_replicas_stream_grant_gets_a_write_of_this_node_then_wait),
                T(test_min_replicas_link_down_refuses_the_grants_held),
                T(test_forged_grants_are_dropped_and_the_waiter_refused),
                T(test_entries_not_of_this_node_are_dropped),
                T(test_grant_of_a_slot_held_here_is_dropped),
                T(test_call_answered_with_garbage_waits_for_the_next_heartbeat),
                T(test_replies_of_another_shape_refuse_the_request),
                T(test_malformed_status_snapshot_is_dropped),
                cmocka_unit_test_setup_teardown(test_batch_carries_the_outbox_and_splits_the_answer, setup_batched,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_batch_is_bounded, setup_batched, teardown),
                cmocka_unit_test_setup_teardown(test_one_call_out_the_next_waits_for_its_answer, setup_one_call_out,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_one_call_out_a_full_batch_goes_at_once, setup_one_call_out,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_one_call_out_gives_way_to_send_now_and_to_a_lost_link,
                                                setup_one_call_out, teardown),
                cmocka_unit_test_setup_teardown(test_one_call_out_a_submit_refused_rules_is_not_out, setup_one_call_out,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_one_call_out_ignores_a_call_out_too_long, setup_one_call_out,
                                                teardown),
                T(test_without_batches_each_call_goes_alone),
                cmocka_unit_test_setup_teardown(test_batch_settling_in_the_middle_sends_the_rest_again, setup_batched,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_batch_submits_given_up_are_not_sent_again, setup_batched,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_batch_lost_with_the_link_is_sent_again_whole, setup_batched,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_batch_bad_replies_are_bad_input, setup_batched, teardown),
                cmocka_unit_test_setup_teardown(test_sentinel_pool_grants_nothing_before_a_confirmation, setup_sentinel,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_sentinel_start_request_that_may_wait_waits_for_the_first_confirmation,
                                                setup_sentinel, teardown),
                cmocka_unit_test_setup_teardown(test_sentinel_start_resumed_waiter_keeps_its_rid_until_confirmed,
                                                setup_sentinel, teardown),
                cmocka_unit_test_setup_teardown(test_sentinel_start_without_a_confirmation_refuses_after_the_grace,
                                                setup_sentinel, teardown),
                cmocka_unit_test_setup_teardown(test_sentinel_start_fail_fast_is_refused_at_once, setup_sentinel,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_sentinel_rest_holds_a_fail_fast_request_for_the_round_it_wakes,
                                                setup_sentinel, teardown),
                cmocka_unit_test_setup_teardown(test_sentinel_short_rest_serves_at_once, setup_sentinel, teardown),
                cmocka_unit_test_setup_teardown(test_sentinel_wake_round_without_a_majority_refuses_as_a_lost_confirmation,
                                                setup_sentinel, teardown),
                cmocka_unit_test_setup_teardown(test_fence_counts_from_the_last_confirmation_not_the_heartbeats,
                                                setup_sentinel, teardown),
                cmocka_unit_test_setup_teardown(test_grant_from_an_unconfirmed_primary_is_refused_and_released,
                                                setup_sentinel, teardown),
                cmocka_unit_test_setup_teardown(test_primary_named_by_one_sentinel_is_unconfirmed_at_once,
                                                setup_sentinel, teardown),
#define TS(x) cmocka_unit_test_setup_teardown(x, setup_set, teardown_set)
                TS(test_calls_are_numbered_across_the_pools_of_one_link),
                TS(test_set_submit_carries_every_pool_and_is_queued_in_both),
                TS(test_set_granted_in_both_with_each_pool_token),
                TS(test_set_refused_by_pool_2_is_echoed_by_pool_1),
                TS(test_set_said_ready_then_granted_in_one_call),
                TS(test_set_grant_not_ready_or_gone_waits_again),
                TS(test_set_part_lost_with_redis_data_is_refused_backend),
                TS(test_set_settling_is_sent_again),
                TS(test_set_unregistered_of_pool_2_waits_until_it_serves),
                TS(test_set_error_reply_refuses_in_every_pool),
                TS(test_set_answers_of_another_shape_refuse_the_set_in_every_pool),
                TS(test_set_granted_with_a_bad_part_gives_the_good_part_back),
                TS(test_set_grant_answered_queued_is_refused),
                TS(test_set_lost_with_the_link_is_sent_again),
                TS(test_set_given_up_while_its_call_goes_again_leaves_no_part_queued),
                TS(test_set_given_up_while_out_is_not_sent_after_the_link_is_back),
                TS(test_set_part_granted_outside_its_call_is_refused),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
