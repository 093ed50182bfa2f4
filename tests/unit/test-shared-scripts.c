/* SPDX-License-Identifier: MIT */
/* test-shared-scripts.c — the Lua scripts of shared pools (brokerd/lua) run by a real redis-server that
 * the test starts on a private Unix socket, driven through hiredis's synchronous API. Pools are made in
 * the manual clock mode (memo §3.10): every call says its `now`, so that times, budgets and tokens are
 * exact, as in test-engine.c, whose rules (pool-local.c) the scripts port. Each test flushes the server.
 * Without redis-server the whole test is one TAP skip. */
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "pool.h"
#include "redis-server.h"
#include "shared-scripts.h"

#define POOL "{sb:p}"
#define SETTLE_MAX 64
#define REAP_PAGE 128
#define SEC 1000000LL

/* Decision fields (brokerd/lua/README, "Decision"). */
enum { D_VERDICT, D_RID, D_AT, D_WAIT, D_REFUSAL, D_REASON, D_STATE, D_IDLE, D_BUDGET, D_POSITION, D_QUEUED,
       D_TOKEN, D_SLOTS, D_MEMBERS };
/* Cache fields. */
enum { C_IN_USE, C_WAITING, C_CONGESTED, C_IDLE, C_DRAINED, C_NEXT_WAKEUP, C_COUNTER, C_EPOCH, C_RECOVERY,
       C_STREAM_LAST, C_LIMIT, C_RECOVERY_WHY };
/* Reply elements. */
enum { R_STATUS, R_NOW, R_BODY, R_EVENTS, R_CACHE, R_NOTICES };

static TestRedis server;
static redisContext *redis;
static char shas[16][41]; /* one per entry of shared_scripts[] */
static const char *run_id = "run1";     /* the run id the calls say their link saw */
static const char *pool = POOL;         /* KEYS[1] of call() */
static const char *set_canon;           /* the rules of both pools in the set tests (setup()) */
static bool set_swapped;                /* set_call() names POOL2 first */

/* How calls reach the operations: FCALL of the library's functions (brokerd's way), or, with --alternate,
 * FCALL and EVALSHA of the EVAL scripts (a brokerd from before the library) in turn, call after call: a
 * fleet half upgraded on one pool (brokerd/lua/README, "Building and loading"). */
static bool alternate;
static unsigned long n_calls;

/* The command and its first argument (a function, or a script's SHA) for the next call of op. */
static void callee(const char *op, const char **ret_cmd, const char **ret_name) {
        bool eval = alternate && n_calls++ % 2 == 1;
        for (size_t i = 0; i < shared_scripts_n; i++)
                if (strcmp(shared_scripts[i].name, op) == 0) {
                        *ret_cmd = eval ? "EVALSHA" : "FCALL";
                        *ret_name = eval ? shas[i] : shared_scripts[i].function;
                        return;
                }
        fail_msg("no script %s", op);
}

/* Runs an operation script with the head (version 1, node, now or "-" for the redis clock, run_id,
 * settle) and the op's arguments (NULL-terminated). */
/* Nodes reaped so far, by any call's notices: a test on the Redis clock whose node paused past its TTL
 * (this process descheduled on a loaded machine) sees its leases go, as a real node would have fenced. */
static unsigned n_expired;

/* Set by test_hostile_writes_*: an error reply is returned to the test (which counts it) instead of failing. */
static bool tolerate_errors;

static redisReply *call_v(const char *op, const char *node, long long now, int settle, va_list ap) {
        const char *argv[600];
        char now_s[32], settle_s[4];
        size_t n = 0;

        if (now < 0)
                snprintf(now_s, sizeof now_s, "-");
        else
                snprintf(now_s, sizeof now_s, "%lld", now);
        snprintf(settle_s, sizeof settle_s, "%d", settle);
        callee(op, &argv[0], &argv[1]);
        n = 2;
        argv[n++] = "1";
        argv[n++] = pool;
        argv[n++] = "1";
        argv[n++] = node;
        argv[n++] = now_s;
        argv[n++] = run_id;
        argv[n++] = settle_s;
        for (const char *a; (a = va_arg(ap, const char *)); )
                argv[n++] = a;
        redisReply *r = redisCommandArgv(redis, (int) n, argv, NULL);
        assert_non_null(r);
        if (r->type == REDIS_REPLY_ERROR && tolerate_errors)
                return r;
        if (r->type == REDIS_REPLY_ERROR)
                fail_msg("%s: %s", op, r->str);
        assert_int_equal(r->type, REDIS_REPLY_ARRAY);
        assert_int_equal(r->elements, 6);
        for (size_t i = 0; i < r->element[R_NOTICES]->elements; i++)
                if (strcmp(r->element[R_NOTICES]->element[i]->element[0]->str, "node-expired") == 0)
                        n_expired++;
        return r;
}

static redisReply *call(const char *op, const char *node, long long now, int settle, ...) {
        va_list ap;
        va_start(ap, settle);
        redisReply *r = call_v(op, node, now, settle, ap);
        va_end(ap);
        return r;
}

static const char *status(const redisReply *r) {
        return r->element[R_STATUS]->str;
}

static const redisReply *body(const redisReply *r) {
        return r->element[R_BODY];
}

static long long cache(const redisReply *r, size_t i) {
        assert_true(r->element[R_CACHE]->elements > i);
        return r->element[R_CACHE]->element[i]->integer;
}

static const char *cache_s(const redisReply *r, size_t i) {
        assert_true(r->element[R_CACHE]->elements > i);
        assert_int_equal(r->element[R_CACHE]->element[i]->type, REDIS_REPLY_STRING);
        return r->element[R_CACHE]->element[i]->str;
}

static size_t n_events(const redisReply *r) {
        return r->element[R_EVENTS]->elements;
}

static const redisReply *event(const redisReply *r, size_t i) {
        assert_true(n_events(r) > i);
        return r->element[R_EVENTS]->element[i];
}

static const char *field_s(const redisReply *d, size_t i) {
        return d->element[i]->str;
}

static long long field_i(const redisReply *d, size_t i) {
        return d->element[i]->integer;
}

#define CANON_ONE_LANE "backend-node-ttl=30000000\nlane.ci.max-in-use=-1\nlane.ci.priority=0\nlane.ci.reserve=0\n"

static redisReply *tick_as(const char *node, long long now, const char *canon) {
        return call("tick", node, now, 1, node, canon, "0", "0", "0", "-", "epoch1", "1", "", NULL);
}

static void tick_ok(const char *node, long long now, const char *canon) {
        redisReply *r = tick_as(node, now, canon);
        assert_string_equal(status(r), "ok");
        freeReplyObject(r);
}

/* submit as node n1 at now, settle 0 (the tick completes the instant, as the engine's run()). */
static redisReply *submit_at(long long now, const char *rid, const char *lane, int k, bool may_wait,
                             long long client_cap) {
        char k_s[16], cap_s[32];
        snprintf(k_s, sizeof k_s, "%d", k);
        snprintf(cap_s, sizeof cap_s, "%lld", client_cap);
        redisReply *r = call("submit", "n1", now, 0, rid, lane, k_s, may_wait ? "1" : "0", "0", "-1", cap_s, "-",
                             NULL);
        assert_string_equal(status(r), "ok");
        return r;
}

static void expect_verdict(const char *rid, long long now, const char *lane, int k, const char *verdict) {
        redisReply *r = submit_at(now, rid, lane, k, true, -1);
        assert_string_equal(field_s(body(r), D_VERDICT), verdict);
        freeReplyObject(r);
}

static redisReply *release_at(long long now, long long token, const char *rid) {
        char t[32];
        snprintf(t, sizeof t, "%lld", token);
        redisReply *r = call("release", "n1", now, 0, t, rid, NULL);
        assert_string_equal(status(r), "ok");
        return r;
}

/* ---- fixture ---- */

static int setup(void **state) {
        redisReply *r = redisCommand(redis, "FLUSHALL");
        run_id = "run1";
        pool = POOL;
        set_canon = CANON_ONE_LANE "limit=1\n";
        set_swapped = false;
        assert_non_null(r);
        freeReplyObject(r);
        return 0;
}

/* ---- tests ---- */

static void test_a_callers_own_deadline_is_not_its_wakeup(void **state) {
        /* Alone and idle: nothing due for n1 (its heartbeats move its deadline at 1000 + 30 s). */
        redisReply *t = tick_as("n1", 1000, CANON_ONE_LANE "limit=2\n");
        assert_string_equal(status(t), "ok");
        assert_int_equal(cache(t, C_NEXT_WAKEUP), -1);
        freeReplyObject(t);
        /* Another node's deadline is: its expiry frees what it holds. */
        tick_ok("n2", 2000, CANON_ONE_LANE "limit=2\n");
        t = tick_as("n1", 3000, "=");
        assert_int_equal(cache(t, C_NEXT_WAKEUP), 2000 + 30 * SEC);
        freeReplyObject(t);
        t = tick_as("n2", 4000, "=");
        assert_int_equal(cache(t, C_NEXT_WAKEUP), 3000 + 30 * SEC);
        freeReplyObject(t);
}

/* Redis's count of changes (INFO persistence: what the AOF and the replicas receive, a field each). */
static long long redis_changes(void) {
        redisReply *r = redisCommand(redis, "INFO persistence");
        assert_non_null(r);
        const char *f = strstr(r->str, "rdb_changes_since_last_save:");
        assert_non_null(f);
        long long n = atoll(f + strlen("rdb_changes_since_last_save:"));
        freeReplyObject(r);
        return n;
}

/* An idle heartbeat writes its clock and its registration, nothing else: it rewrote the node's canon and
 * meta's instant fields every second, each of them replicated (issue 21, item 3). */
static void test_an_idle_heartbeat_writes_the_clock_and_the_registration_only(void **state) {
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=2\n");
        tick_ok("n1", 2000, CANON_ONE_LANE "limit=2\n");
        long long before = redis_changes();
        tick_ok("n1", 3000, CANON_ONE_LANE "limit=2\n");
        /* HSET clock last_time last_now skew (3), ZADD nodes (1). */
        assert_int_equal(redis_changes() - before, 4);
        before = redis_changes();
        tick_ok("n1", 4000, "=");
        assert_int_equal(redis_changes() - before, 4);
}

static void test_grants_up_to_the_limit_then_queues_and_hands_on_in_order(void **state) {
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=2\n");

        redisReply *a = submit_at(2000, "a", "ci", 1, true, -1);
        assert_string_equal(field_s(body(a), D_VERDICT), "granted");
        assert_int_equal(field_i(body(a), D_TOKEN), 1);
        assert_int_equal(body(a)->element[D_SLOTS]->element[0]->integer, 0);
        expect_verdict("b", 2000, "ci", 1, "granted");
        redisReply *c = submit_at(2000, "c", "ci", 1, true, -1);
        assert_string_equal(field_s(body(c), D_VERDICT), "queued");
        assert_int_equal(field_i(body(c), D_POSITION), 0);
        expect_verdict("d", 2000, "ci", 1, "queued");
        freeReplyObject(c);

        /* Slot 0 frees at 5000: the first waiter gets it, on the same slot, with the next token. */
        freeReplyObject(release_at(5000, field_i(body(a), D_TOKEN), "a"));
        freeReplyObject(a);
        redisReply *t = tick_as("n1", 5000, "=");
        assert_int_equal(n_events(t), 1);
        assert_string_equal(field_s(event(t, 0), D_VERDICT), "granted");
        assert_string_equal(field_s(event(t, 0), D_RID), "c");
        assert_int_equal(field_i(event(t, 0), D_AT), 5000);
        assert_int_equal(field_i(event(t, 0), D_WAIT), 3000);
        assert_int_equal(field_i(event(t, 0), D_TOKEN), 3);
        assert_int_equal(event(t, 0)->element[D_SLOTS]->element[0]->integer, 0);
        assert_int_equal(cache(t, C_IN_USE), 2);
        assert_int_equal(cache(t, C_WAITING), 1);
        freeReplyObject(t);
}

static void test_same_rid_twice_is_one_request(void **state) {
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\n");
        expect_verdict("a", 2000, "ci", 1, "granted");
        redisReply *b1 = submit_at(2000, "b", "ci", 1, true, -1);
        redisReply *b2 = submit_at(3000, "b", "ci", 1, true, -1);
        assert_string_equal(field_s(body(b2), D_VERDICT), "queued");
        assert_int_equal(cache(b2, C_WAITING), 1);
        freeReplyObject(b1);
        freeReplyObject(b2);
        /* A granted rid again: its grant, not a second one. */
        redisReply *a2 = submit_at(3000, "a", "ci", 1, true, -1);
        assert_string_equal(field_s(body(a2), D_VERDICT), "granted");
        assert_int_equal(field_i(body(a2), D_TOKEN), 1);
        assert_int_equal(cache(a2, C_IN_USE), 1);
        assert_int_equal(cache(a2, C_COUNTER), 1);
        freeReplyObject(a2);
        /* A refused one again (after its outcome was recorded): the same refusal. */
        redisReply *c1 = submit_at(3000, "c", "ci", 1, false, -1);
        assert_string_equal(field_s(body(c1), D_REFUSAL), "busy");
        freeReplyObject(c1);
        redisReply *c2 = submit_at(3000, "c", "ci", 1, true, -1);
        assert_string_equal(field_s(body(c2), D_VERDICT), "refused");
        assert_string_equal(field_s(body(c2), D_REFUSAL), "busy");
        assert_int_equal(cache(c2, C_WAITING), 1);
        freeReplyObject(c2);
}

/* FNV-1a 32, as pool-shared.c will compute it. */
static uint32_t fnv1a32(const char *s) {
        uint32_t h = 2166136261u;
        for (; *s; s++) {
                h ^= (unsigned char) *s;
                h *= 16777619u;
        }
        return h;
}

/* Node n1's fingerprint as Redis holds it: n, x, s. */
static void node_fp(long long ret[3]) {
        redisReply *m = redisCommand(redis, "HMGET " POOL ":node:n1 fp_n fp_x fp_s");
        assert_int_equal(m->type, REDIS_REPLY_ARRAY);
        for (size_t i = 0; i < 3; i++)
                ret[i] = m->element[i]->str ? strtoll(m->element[i]->str, NULL, 10) : 0;
        freeReplyObject(m);
}

static redisReply *submit_fresh(long long now, const char *rid, const char *fresh, const char *hash) {
        redisReply *r = call("submit", "n1", now, 0, rid, "ci", "1", "0", "0", "-1", "-1", "-", "", fresh, hash, NULL);
        assert_string_equal(status(r), "ok");
        return r;
}

/* A submit's ARGV[16] is its lease's fingerprint hash as the node counts it, kept for the lease's end
 * (anything but a 32-bit value is hashed by the script); ARGV[15] "1" (the node's first sending of the rid)
 * is not looked up: a rid sent again is sent "0" (or without it) and gets what it got. */
static void test_submit_fresh_and_its_lease_hash(void **state) {
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=2\n");
        redisReply *a = submit_fresh(2000, "a", "1", "12345");
        redisReply *b = submit_fresh(2000, "b", "1", "4294967296"); /* not 32 bits */
        assert_string_equal(field_s(body(a), D_VERDICT), "granted");
        assert_string_equal(field_s(body(b), D_VERDICT), "granted");
        long long fp[3];
        node_fp(fp);
        uint32_t hb = fnv1a32("bl");
        assert_int_equal(fp[0], 2);
        assert_int_equal(fp[1], 12345 ^ hb);
        assert_int_equal(fp[2], (uint32_t) (12345 + hb));
        /* a's end takes away the hash its grant kept. */
        freeReplyObject(release_at(3000, field_i(body(a), D_TOKEN), "a"));
        node_fp(fp);
        assert_int_equal(fp[0], 1);
        assert_int_equal(fp[1], hb);
        assert_int_equal(fp[2], hb);
        /* b again as a retry: its grant. */
        redisReply *b2 = submit_fresh(3000, "b", "0", "");
        assert_string_equal(field_s(body(b2), D_VERDICT), "granted");
        assert_int_equal(field_i(body(b2), D_TOKEN), field_i(body(b), D_TOKEN));
        freeReplyObject(b2);
        /* b again as fresh, which a node never sends: decided as a new request (no lookup was made). */
        redisReply *b3 = submit_fresh(3000, "b", "1", "");
        assert_string_equal(field_s(body(b3), D_VERDICT), "granted");
        assert_int_not_equal(field_i(body(b3), D_TOKEN), field_i(body(b), D_TOKEN));
        freeReplyObject(b3);
        freeReplyObject(a);
        freeReplyObject(b);
}

#define CANON_TWO_LANES \
        "backend-node-ttl=30000000\nlane.hi.max-in-use=-1\nlane.hi.priority=10\nlane.hi.reserve=0\n" \
        "lane.lo.max-in-use=-1\nlane.lo.priority=0\nlane.lo.reserve=0\nlimit=2\n"

/* A high-priority head that needs two slots holds everyone back: no barging by a one-slot waiter. */
static void test_priority_head_holds_back_smaller_waiters(void **state) {
        tick_ok("n1", 1000, CANON_TWO_LANES);
        redisReply *a = submit_at(2000, "a", "lo", 1, true, -1);
        redisReply *b = submit_at(2000, "b", "lo", 1, true, -1);
        expect_verdict("w1", 3000, "lo", 1, "queued");
        redisReply *w2 = submit_at(3000, "w2", "hi", 2, true, -1);
        assert_int_equal(field_i(body(w2), D_POSITION), 0); /* ahead of the earlier lo waiter */
        freeReplyObject(w2);

        freeReplyObject(release_at(4000, field_i(body(a), D_TOKEN), "a"));
        redisReply *t = tick_as("n1", 4000, "=");
        assert_int_equal(n_events(t), 0);
        freeReplyObject(t);

        freeReplyObject(release_at(5000, field_i(body(b), D_TOKEN), "b"));
        t = tick_as("n1", 5000, "=");
        assert_int_equal(n_events(t), 1);
        assert_string_equal(field_s(event(t, 0), D_RID), "w2");
        assert_int_equal(event(t, 0)->element[D_SLOTS]->elements, 2);
        freeReplyObject(t);
        freeReplyObject(a);
        freeReplyObject(b);
}

/* max-in-use passes a lane's waiter over; reserve keeps the last slot for the other lane. */
static void test_lane_limits_pass_over_and_reserve_holds_a_slot(void **state) {
        tick_ok("n1", 1000,
                "backend-node-ttl=30000000\nlane.merge.max-in-use=-1\nlane.merge.priority=0\nlane.merge.reserve=1\n"
                "lane.nightly.max-in-use=1\nlane.nightly.priority=0\nlane.nightly.reserve=0\nlimit=3\n");
        expect_verdict("n-a", 2000, "nightly", 1, "granted");
        /* nightly is at its max-in-use: queued, and passed over... */
        expect_verdict("n-b", 2000, "nightly", 1, "queued");
        /* ...so a merge request finds room although someone waits. */
        expect_verdict("m-a", 2000, "merge", 1, "granted");
        /* One slot left, reserved for merge by nobody (merge uses 1 ≥ reserve 1): a merge request takes it. */
        expect_verdict("m-b", 2000, "merge", 1, "granted");
}

static void test_reserve_keeps_the_last_slot_from_another_lane(void **state) {
        tick_ok("n1", 1000,
                "backend-node-ttl=30000000\nlane.merge.max-in-use=-1\nlane.merge.priority=0\nlane.merge.reserve=1\n"
                "lane.nightly.max-in-use=-1\nlane.nightly.priority=0\nlane.nightly.reserve=0\nlimit=2\n");
        expect_verdict("n-a", 2000, "nightly", 1, "granted");
        /* The last free slot is merge's reserve: nightly queues, merge still gets it. */
        expect_verdict("n-b", 2000, "nightly", 1, "queued");
        expect_verdict("m-a", 2000, "merge", 1, "granted");
}

/* SPEC §3.3: at one instant the releases come first, then arrivals (no barging past a waiter), then the
 * queue is served, then the budgets that end now are refused — a waiter whose budget ends at the
 * instant its slot frees is granted. */
static void test_same_instant_order(void **state) {
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\n");
        redisReply *a = submit_at(1000, "a", "ci", 1, true, -1);
        tick_ok("n1", 1000, "=");
        redisReply *w = submit_at(2000, "w", "ci", 1, true, 8000); /* budget ends at 10000 */
        assert_int_equal(field_i(body(w), D_BUDGET), 8000);
        freeReplyObject(w);
        tick_ok("n1", 2000, "=");

        freeReplyObject(release_at(10000, field_i(body(a), D_TOKEN), "a"));
        expect_verdict("late", 10000, "ci", 1, "queued");
        redisReply *t = tick_as("n1", 10000, "=");
        assert_int_equal(n_events(t), 1);
        assert_string_equal(field_s(event(t, 0), D_RID), "w");
        assert_string_equal(field_s(event(t, 0), D_VERDICT), "granted");
        freeReplyObject(t);
        freeReplyObject(a);
}

/* A budget ends at its own instant, even when the next call comes much later; the refusal says when. */
static void test_budget_runs_out_at_its_own_deadline(void **state) {
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\nqueue-timeout=10000000\n");
        expect_verdict("a", 1000, "ci", 1, "granted");
        redisReply *w = submit_at(2000, "w", "ci", 1, true, -1);
        assert_string_equal(field_s(body(w), D_STATE), "keeping-up");
        assert_int_equal(field_i(body(w), D_BUDGET), 10 * SEC);
        freeReplyObject(w);
        tick_ok("n1", 2000, "=");

        /* The gauge flips first (idle passes Q at 1000 + Q + 1), then the budget ends. (Before the node's
         * own deadline, 2000 + 30 s: past it the node's lease would be reaped too.) */
        redisReply *t = tick_as("n1", 20 * SEC, "=");
        assert_int_equal(n_events(t), 2);
        assert_string_equal(field_s(event(t, 0), 0), "congestion");
        assert_int_equal(field_i(event(t, 0), 1), 1000 + 10 * SEC + 1);
        assert_string_equal(field_s(event(t, 1), D_VERDICT), "refused");
        assert_string_equal(field_s(event(t, 1), D_RID), "w");
        assert_string_equal(field_s(event(t, 1), D_REFUSAL), "timeout");
        assert_int_equal(field_i(event(t, 1), D_AT), 10 * SEC + 2000);
        assert_int_equal(field_i(event(t, 1), D_WAIT), 10 * SEC);
        freeReplyObject(t);
}

/* The gauge turns on by itself once idle passes Q with no room, at last_fast + Q + 1. */
static void test_congestion_flips_at_its_own_instant(void **state) {
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\nqueue-timeout=10000000\n");
        expect_verdict("a", 1000, "ci", 1, "granted");
        redisReply *t = tick_as("n1", 1000, "=");
        assert_int_equal(cache(t, C_NEXT_WAKEUP), 1000 + 10 * SEC + 1);
        freeReplyObject(t);

        t = tick_as("n1", 20 * SEC, "=");
        assert_int_equal(n_events(t), 1);
        assert_string_equal(field_s(event(t, 0), 0), "congestion");
        assert_int_equal(field_i(event(t, 0), 1), 1000 + 10 * SEC + 1);
        assert_int_equal(field_i(event(t, 0), 3), 1);
        assert_int_equal(cache(t, C_CONGESTED), 1);
        freeReplyObject(t);
}

static void test_release_of_an_unknown_token_changes_nothing(void **state) {
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\n");
        expect_verdict("a", 1000, "ci", 1, "granted");
        redisReply *r = release_at(2000, 99, "a");
        assert_string_equal(body(r)->element[0]->str, "gone");
        assert_int_equal(cache(r, C_IN_USE), 1);
        freeReplyObject(r);
        /* The right token, another node: not its lease. */
        redisReply *o = call("release", "n2", 2000, 0, "1", "a", NULL);
        assert_string_equal(body(o)->element[0]->str, "gone");
        assert_int_equal(cache(o, C_IN_USE), 1);
        freeReplyObject(o);
        r = release_at(2000, 1, "a");
        assert_string_equal(body(r)->element[0]->str, "released");
        assert_int_equal(cache(r, C_IN_USE), 0);
        freeReplyObject(r);
        /* Twice: gone. */
        r = release_at(2000, 1, "a");
        assert_string_equal(body(r)->element[0]->str, "gone");
        freeReplyObject(r);
}

static void test_withdraw_unlinks_a_waiter_without_answer(void **state) {
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\n");
        redisReply *a = submit_at(1000, "a", "ci", 1, true, -1);
        expect_verdict("w", 1000, "ci", 1, "queued");
        redisReply *r = call("withdraw", "n1", 2000, 0, "w", NULL);
        assert_string_equal(body(r)->element[0]->str, "withdrawn");
        assert_int_equal(cache(r, C_WAITING), 0);
        assert_int_equal(n_events(r), 0);
        freeReplyObject(r);
        freeReplyObject(release_at(3000, field_i(body(a), D_TOKEN), "a"));
        redisReply *t = tick_as("n1", 3000, "=");
        assert_int_equal(n_events(t), 0);
        assert_int_equal(cache(t, C_IN_USE), 0);
        freeReplyObject(t);
        freeReplyObject(a);
}

/* Decisions for another node's requests go to that node's stream, not into the caller's reply. */
static void test_grants_for_another_node_go_to_its_stream(void **state) {
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\n");
        tick_ok("n2", 1000, CANON_ONE_LANE "limit=1\n");
        redisReply *a = submit_at(1000, "a", "ci", 1, true, -1);
        redisReply *w = call("submit", "n2", 1000, 0, "w", "ci", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(field_s(body(w), D_VERDICT), "queued");
        freeReplyObject(w);
        freeReplyObject(release_at(2000, field_i(body(a), D_TOKEN), "a"));
        redisReply *t = tick_as("n1", 2000, "=");
        assert_int_equal(n_events(t), 0);
        freeReplyObject(t);
        redisReply *s = redisCommand(redis, "XRANGE " POOL ":s:n2 - +");
        assert_int_equal(s->type, REDIS_REPLY_ARRAY);
        assert_int_equal(s->elements, 1);
        const redisReply *f = s->element[0]->element[1];
        const char *want[] = { "verdict", "granted", "rid", "w", "at", "2000", "wait", "1000", "refusal", "",
                               "reason", "", "state", "none", "idle", "0", "budget", "-1", "position", "0",
                               "queued", "0", "token", "2", "slots", "0", "members", "" };
        assert_int_equal(f->elements, sizeof want / sizeof want[0]);
        for (size_t i = 0; i < f->elements; i++)
                assert_string_equal(f->element[i]->str, want[i]);
        freeReplyObject(s);
        freeReplyObject(a);
}

/* The pool's keys made by a test (manual clock) are refused by a production node, and the other way. */
static void test_a_production_node_refuses_a_manual_clock_pool(void **state) {
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\n");
        redisReply *r = call("submit", "n2", -1, 1, "x", "ci", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(status(r), "manual-clock");
        freeReplyObject(r);
        r = call("tick", "n2", -1, 1, "n2", CANON_ONE_LANE "limit=1\n", "0", "0", "0", "-", "e2", "1", "", NULL);
        assert_string_equal(status(r), "manual-clock");
        freeReplyObject(r);
}

static void test_manual_now_never_goes_back(void **state) {
        tick_ok("n1", 5000, CANON_ONE_LANE "limit=1\n");
        redisReply *r = submit_at(5000, "a", "ci", 1, true, -1); /* equal: allowed */
        freeReplyObject(r);
        r = call("submit", "n1", 4999, 0, "b", "ci", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(status(r), "clock");
        freeReplyObject(r);
}

/* In the redis clock mode, a new pool (or one Redis lost) grants nothing for one node TTL. */
static void test_a_new_redis_clock_pool_starts_with_a_recovery_window(void **state) {
        redisReply *t = call("tick", "n1", -1, 1, "n1", CANON_ONE_LANE "limit=1\n", "0", "0", "0", "-", "e1", "1", "",
                             NULL);
        assert_string_equal(status(t), "ok");
        long long now = t->element[R_NOW]->integer;
        assert_int_equal(cache(t, C_RECOVERY), now + 30 * SEC);
        assert_string_equal(cache_s(t, C_RECOVERY_WHY), "new"); /* the journal says what opened it */
        freeReplyObject(t);
        redisReply *r = call("submit", "n1", -1, 1, "x", "ci", "1", "0", "0", "-1", "-1", "-", NULL);
        assert_string_equal(status(r), "ok");
        assert_string_equal(field_s(body(r), D_REFUSAL), "unavailable");
        assert_string_equal(field_s(body(r), D_REASON), "recovery");
        freeReplyObject(r);
        r = call("submit", "n1", -1, 1, "y", "ci", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(field_s(body(r), D_VERDICT), "queued");
        /* Its pool clock is strictly increasing. */
        assert_true(r->element[R_NOW]->integer > now);
        freeReplyObject(r);
}

static void test_rules_mismatch_names_the_keys_then_adoption(void **state) {
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=2\n");
        tick_ok("n2", 1000, CANON_ONE_LANE "limit=2\n");
        /* n2 wants limit 3: n1 still wants 2, so n2 is refused with the key that differs. */
        redisReply *t = tick_as("n2", 2000, CANON_ONE_LANE "limit=3\n");
        assert_string_equal(status(t), "rules");
        const redisReply *diff = body(t)->element[4];
        assert_int_equal(diff->elements, 1);
        assert_string_equal(diff->element[0]->str, "limit");
        freeReplyObject(t);
        redisReply *s = call("submit", "n2", 2000, 0, "x", "ci", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(status(s), "rules");
        freeReplyObject(s);
        /* n1 reloads too: every live node wants limit 3, which is adopted. */
        t = tick_as("n1", 3000, CANON_ONE_LANE "limit=3\n");
        assert_string_equal(status(t), "ok");
        assert_int_equal(cache(t, C_LIMIT), 3);
        freeReplyObject(t);
        tick_ok("n2", 3000, "=");
}

/* A node that removed the pool from its configuration and still holds a lease there wants "*": whatever rules
 * are stored. It holds no adoption back (the others agree without it), its ticks stay "ok" under the rules they
 * adopt, and it asks for nothing under them (its submit: "rules"). With no rules stored and none of its own
 * left, it is answered "canon". */
static void test_a_node_that_wants_any_rules_holds_no_adoption_back(void **state) {
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=2\n");
        tick_ok("n2", 1000, CANON_ONE_LANE "limit=2\n");
        tick_ok("n3", 1000, "*");
        redisReply *t = tick_as("n1", 2000, CANON_ONE_LANE "limit=3\n");
        assert_string_equal(status(t), "rules"); /* n2 still wants 2 */
        freeReplyObject(t);
        t = tick_as("n2", 3000, CANON_ONE_LANE "limit=3\n");
        assert_string_equal(status(t), "ok"); /* n3's "*" is no vote against */
        assert_int_equal(cache(t, C_LIMIT), 3);
        freeReplyObject(t);
        tick_ok("n1", 3000, "=");
        tick_ok("n3", 4000, "*");
        redisReply *s = call("submit", "n3", 4000, 0, "x", "ci", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(status(s), "rules");
        freeReplyObject(s);
        /* With the stored rules gone (deleted by hand), "*" has nothing to stand for. */
        freeReplyObject(redisCommand(redis, "DEL " POOL ":rules"));
        t = tick_as("n3", 5000, "*");
        assert_string_equal(status(t), "canon");
        freeReplyObject(t);
}

/* Lua 5.1 compiles no function with more than 200 locals alive at once, and the library's main chunk holds
 * every top-level local of prelude.lua (brokerd/lua/README, "Building and loading"): room for HEADROOM more,
 * in the library and in each EVAL script (prelude.lua + eval.lua + the operation's own top level), so that
 * the limit is met here first and not at a FUNCTION LOAD in the field. */
#define HEADROOM 16

/* text with HEADROOM locals declared after its first `after` bytes, and every `from` made `to`. */
static char *with_more_locals(const char *text, size_t after, const char *from, const char *to) {
        char locals[HEADROOM * 8 + 16] = "local h0";
        for (int i = 1; i < HEADROOM; i++)
                snprintf(locals + strlen(locals), sizeof locals - strlen(locals), ", h%d", i);
        strcat(locals, "\n");
        size_t n = strlen(text), room = n + strlen(locals) + 1;
        if (from)
                for (const char *p = strstr(text, from); p; p = strstr(p + 1, from))
                        room += strlen(to);
        char *out = malloc(room);
        assert_non_null(out);
        memcpy(out, text, after);
        strcpy(out + after, locals);
        char *w = out + strlen(out);
        for (const char *p = text + after; *p;) {
                if (from && strncmp(p, from, strlen(from)) == 0) {
                        w = stpcpy(w, to);
                        p += strlen(from);
                } else
                        *w++ = *p++;
        }
        *w = 0;
        return out;
}

static void test_the_scripts_have_room_for_more_locals(void **state) {
        /* The library, as another one (its name and functions' names changed), loaded and deleted. */
        const char *first_line_end = strchr(shared_library, '\n');
        assert_non_null(first_line_end);
        char *lib = with_more_locals(shared_library, (size_t) (first_line_end + 1 - shared_library),
                                     "register_function('sb_", "register_function('hr_");
        memcpy(lib + strlen("#!lua name="), "headroom__", strlen("slotbroker"));
        redisReply *r = redisCommand(redis, "FUNCTION LOAD %s", lib);
        assert_non_null(r);
        if (r->type == REDIS_REPLY_ERROR)
                fail_msg("the library has no room for %d more locals: %s", HEADROOM, r->str);
        freeReplyObject(r);
        const char *name = lib + strlen("#!lua name=");
        r = redisCommand(redis, "FUNCTION DELETE %b", name, (size_t) (strchr(name, '\n') - name));
        assert_non_null(r);
        assert_int_equal(r->type, REDIS_REPLY_STATUS);
        freeReplyObject(r);
        free(lib);
        for (size_t i = 0; i < shared_scripts_n; i++) {
                char *text = with_more_locals(shared_scripts[i].text, 0, NULL, NULL);
                r = redisCommand(redis, "SCRIPT LOAD %s", text);
                assert_non_null(r);
                if (r->type == REDIS_REPLY_ERROR)
                        fail_msg("%s has no room for %d more locals: %s", shared_scripts[i].name, HEADROOM, r->str);
                freeReplyObject(r);
                free(text);
        }
}

static void test_fingerprints_equal_the_c_implementation(void **state) {
        uint32_t x = 0, sum = 0;
        unsigned n = 0;
        char rid[17], kind_rid[20];
        uint64_t seed = 0x9e3779b97f4a7c15u;

        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1000\n");
        for (int i = 0; i < 10000; i++) {
                seed = seed * 6364136223846793005u + 1442695040888963407u;
                snprintf(rid, sizeof rid, "%016" PRIx64, seed);
                redisReply *r = submit_at(1000, rid, "ci", 1, true, -1);
                const char *v = field_s(body(r), D_VERDICT);
                snprintf(kind_rid, sizeof kind_rid, "%s%c", rid, strcmp(v, "granted") == 0 ? 'l' : 'w');
                freeReplyObject(r);
                uint32_t h = fnv1a32(kind_rid);
                x ^= h;
                sum += h;
                n++;
        }
        redisReply *t = tick_as("n1", 1000, "=");
        const redisReply *fp = body(t)->element[5];
        assert_int_equal(fp->element[0]->integer, n);
        assert_int_equal(fp->element[1]->integer, x);
        assert_int_equal(fp->element[2]->integer, sum);
        freeReplyObject(t);
}

/* Budgets: 100 waiters whose budgets all end at one instant are refused over two calls, at most
 * SETTLE_MAX steps each; the operation that found them unsettled is "settling" and changes nothing. */
static void test_expiries_beyond_the_budget_are_settled_over_calls(void **state) {
        char rid[16];
        size_t refused = 0, calls = 0;

        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\n");
        expect_verdict("a", 1000, "ci", 1, "granted");
        for (int i = 0; i < 100; i++) {
                snprintf(rid, sizeof rid, "w%03d", i);
                redisReply *r = submit_at(1000, rid, "ci", 1, true, 5 * SEC);
                freeReplyObject(r);
        }
        tick_ok("n1", 1000, "=");
        for (;;) {
                redisReply *s = call("submit", "n1", 10 * SEC, 0, "late", "ci", "1", "1", "0", "-1", "-1", "-", NULL);
                calls++;
                assert_true(n_events(s) <= SETTLE_MAX);
                refused += n_events(s);
                bool settling = strcmp(status(s), "settling") == 0;
                if (!settling)
                        assert_string_equal(field_s(body(s), D_VERDICT), "queued");
                freeReplyObject(s);
                if (!settling)
                        break;
                assert_true(calls < 10);
        }
        assert_int_equal(refused, 100);
        assert_true(calls >= 2);
}

/* Whether reply t tells a node's expiry; every notice it has must be one, freeing `leases` leases and
 * `waiters` waiters. */
static bool notices_node_expired(const redisReply *t, long long leases, long long waiters) {
        for (size_t i = 0; i < t->element[R_NOTICES]->elements; i++) {
                const redisReply *nt = t->element[R_NOTICES]->element[i];
                assert_string_equal(nt->element[0]->str, "node-expired");
                assert_int_equal(nt->element[3]->integer, leases);
                assert_int_equal(nt->element[4]->integer, waiters);
        }
        return t->element[R_NOTICES]->elements > 0;
}

/* A dead node's 1,000 waiters and its lease are freed a page per call; its slot then goes on in order. */
static void test_a_dead_node_is_reaped_in_pages(void **state) {
        char rid[16];
        size_t calls = 0, granted = 0;
        bool expired = false;

        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\n");
        tick_ok("n2", 1000, CANON_ONE_LANE "limit=1\n");
        redisReply *a = call("submit", "n2", 1000, 0, "a", "ci", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(field_s(body(a), D_VERDICT), "granted");
        freeReplyObject(a);
        for (int i = 0; i < 1000; i++) {
                snprintf(rid, sizeof rid, "d%04d", i);
                freeReplyObject(call("submit", "n2", 1000, 0, rid, "ci", "1", "1", "0", "-1", "-1", "-", NULL));
        }
        expect_verdict("mine", 2000, "ci", 1, "queued");
        tick_ok("n1", 2000, "=");

        /* n1 keeps heartbeating; n2 stopped at 1000, deadline 1000 + 30 s. */
        tick_ok("n1", 20 * SEC, "=");
        for (long long now = 31 * SEC; !expired; now += 1000) {
                redisReply *before = redisCommand(redis, "ZCARD " POOL ":nr:n2");
                redisReply *t = tick_as("n1", now, "=");
                redisReply *after = redisCommand(redis, "ZCARD " POOL ":nr:n2");
                /* One page per call, at most. */
                assert_true(before->integer - after->integer <= REAP_PAGE);
                freeReplyObject(before);
                freeReplyObject(after);
                calls++;
                if (notices_node_expired(t, 1, 1000))
                        expired = true;
                for (size_t i = 0; i < n_events(t); i++)
                        if (strcmp(field_s(event(t, i), D_VERDICT), "granted") == 0) {
                                assert_string_equal(field_s(event(t, i), D_RID), "mine");
                                /* Granted at the instant the node died, not when the reaping ended. */
                                assert_int_equal(field_i(event(t, i), D_AT), 1000 + 30 * SEC);
                                granted++;
                        }
                freeReplyObject(t);
                assert_true(calls < 100);
        }
        assert_true(calls >= 1000 / REAP_PAGE);
        assert_int_equal(granted, 1);
        redisReply *e = redisCommand(redis, "EXISTS " POOL ":nr:n2 " POOL ":node:n2");
        assert_int_equal(e->integer, 0);
        freeReplyObject(e);
}

/* A reap's cursor (the reaping hash) holds only the counts its notice tells: garbage there (anyone may write it)
 * counts from 0, and the dead node's records are freed all the same (it stopped the reap with an error). */
static void test_garbage_in_a_reaps_cursor_counts_from_zero(void **state) {
        bool expired = false;
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\n");
        tick_ok("n2", 1000, CANON_ONE_LANE "limit=1\n");
        expect_verdict("a", 1000, "ci", 1, "granted"); /* n1's */
        redisReply *w = call("submit", "n2", 1000, 0, "w", "ci", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(field_s(body(w), D_VERDICT), "queued");
        freeReplyObject(w);
        tick_ok("n1", 20 * SEC, "=");
        freeReplyObject(redisCommand(redis, "HSET " POOL ":reaping node n2 leases abc waiters nan"));
        for (long long now = 31 * SEC; !expired; now += SEC) {
                redisReply *t = tick_as("n1", now, "=");
                if (notices_node_expired(t, 0, 1))
                        expired = true;
                freeReplyObject(t);
                assert_true(now < 40 * SEC);
        }
        redisReply *e = redisCommand(redis, "EXISTS " POOL ":nr:n2 " POOL ":node:n2 " POOL ":reaping");
        assert_int_equal(e->integer, 0);
        freeReplyObject(e);
}

/* Script time with 10,000 waiters, as Redis measures it (INFO commandstats, reset before each call): a
 * queueing submit, a release, the tick that hands the freed slots on (SETTLE_MAX steps: the worst case a
 * call can do), a withdraw, positions of POSITIONS_MAX rids, a status snapshot. Printed; asserted only
 * loosely (the machine is shared), and the budget exactly. */
static long long call_usec(void) {
        redisReply *info = redisCommand(redis, "INFO commandstats");
        const char *p = strstr(info->str, "cmdstat_fcall:calls=1,usec=") ?: strstr(info->str, "cmdstat_evalsha:calls=1,usec=");
        assert_non_null(p);
        long long us = strtoll(strstr(p, "usec=") + strlen("usec="), NULL, 10);
        freeReplyObject(info);
        return us;
}

static redisReply *timed(const char *label, long long *worst, redisReply *(*fn)(void)) {
        freeReplyObject(redisCommand(redis, "CONFIG RESETSTAT"));
        redisReply *r = fn();
        long long us = call_usec();
        printf("# %-40s %6lld µs (%zu events)\n", label, us, n_events(r));
        if (us > *worst)
                *worst = us;
        return r;
}

static long long big_token;
static redisReply *t_submit(void) { return submit_at(2000, "x", "ci", 2, true, -1); }
static redisReply *t_release(void) { return release_at(3000, big_token, "big"); }
static redisReply *t_tick(void) { return tick_as("n1", 3000, "="); }
static redisReply *t_withdraw(void) { return call("withdraw", "n1", 4000, 1, "w05000", NULL); }
static redisReply *t_retry(void) {
        return call("submit", "n1", 4000, 1, "w09999", "ci", "1", "1", "0", "-1", "-1", "-", NULL);
}
static redisReply *t_positions(void) {
        const char *argv[9 + 4 + 256];
        static char rids[256][8];
        size_t n = 0;
        callee("positions", &argv[0], &argv[1]);
        n = 2; argv[n++] = "1"; argv[n++] = POOL;
        argv[n++] = "1"; argv[n++] = "n1"; argv[n++] = "4000"; argv[n++] = run_id; argv[n++] = "0";
        argv[n++] = "pos";
        for (int i = 0; i < 256; i++) {
                snprintf(rids[i], sizeof rids[i], "w%05d", 9000 + i);
                argv[n++] = rids[i];
        }
        return redisCommandArgv(redis, (int) n, argv, NULL);
}
static redisReply *t_status(void) { return call("positions", "n1", 4000, 0, "status", NULL); }

/* The library keeps the rules it parsed, by their canon, 64 at most: more pools than that, each with its
 * own canon, empty it (more than once here), and every call still decides by its own pool's stored rules:
 * k above the limit is invalid, k at the limit granted. */
static void test_more_canons_than_the_library_keeps_parsed(void **state) {
        char canon[256], name[32], k[8];

        for (int i = 1; i <= 150; i++) {
                snprintf(name, sizeof name, "{sb:c%d}", i);
                pool = name;
                snprintf(canon, sizeof canon, CANON_ONE_LANE "limit=%d\n", i);
                tick_ok("n1", 1000, canon);
        }
        for (int i = 1; i <= 150; i += 37) {
                snprintf(name, sizeof name, "{sb:c%d}", i);
                pool = name;
                snprintf(k, sizeof k, "%d", i + 1);
                redisReply *r = call("submit", "n1", 2000, 1, "over", "ci", k, "1", "0", "-1", "-1", "-", NULL);
                assert_string_equal(status(r), "invalid");
                freeReplyObject(r);
                expect_verdict("at", 2000, "ci", i, "granted");
                expect_verdict("more", 2000, "ci", 1, "queued");
        }
}

/* Issue 22 item 9 on a shared pool: 10,000 waiters with random label sets over 64 labelled members. A call
 * reads the heads of every (lane, k, selector) bucket with waiters once (prelude.lua, walk_heads()), then
 * walks them per grant: its cost follows the distinct selectors waiting, not the waiters. Prints the calls'
 * Redis time (INFO commandstats) and the number of buckets. */
static redisReply *submit_sel(long long now, const char *rid, int k, const char *selector);
static redisReply *t_sel_submit(void) { return submit_sel(2000, "xs", 1, "l1 !l2"); }
static redisReply *t_sel_tick(void) { return tick_as("n1", 3000, "="); }

static void test_script_time_at_10000_labelled_waiters(void **state) {
        char canon[8192], *p = canon, rid[16], sel[32];
        long long worst = 0;
        uint64_t s = 7;

        p += sprintf(p, CANON_ONE_LANE "limit=64\nqueue-timeout=600000000\nmembers=");
        for (int m = 0; m < 64; m++)
                p += sprintf(p, "%sr%02d", m > 0 ? "," : "", m);
        for (int l = 0; l < 6; l++) {
                p += sprintf(p, "\nlabel.l%d=", l);
                bool first = true;
                for (int m = 0; m < 64; m++)
                        if ((m * 7 + l * 13) % 3 != 0) {
                                p += sprintf(p, "%sr%02d", first ? "" : ",", m);
                                first = false;
                        }
        }
        sprintf(p, "\n");
        tick_ok("n1", 1000, canon);
        redisReply *big = submit_at(1000, "big", "ci", 64, true, -1);
        big_token = field_i(body(big), D_TOKEN);
        freeReplyObject(big);
        int queued = 0;
        for (int i = 0; i < 10000; i++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                unsigned a = (unsigned) (s >> 33) % 12, b = (unsigned) (s >> 45) % 13;
                int n = snprintf(sel, sizeof sel, "%sl%u", a % 2 ? "!" : "", a / 2);
                if (b < 12 && b / 2 != a / 2)
                        snprintf(sel + n, sizeof sel - (size_t) n, " %sl%u", b % 2 ? "!" : "", b / 2);
                snprintf(rid, sizeof rid, "s%05d", i);
                redisReply *r = submit_sel(1000, rid, 1 + (int) ((s >> 20) % 2), sel);
                queued += strcmp(status(r), "ok") == 0;
                freeReplyObject(r);
        }
        tick_ok("n1", 1000, "=");
        redisReply *b = redisCommand(redis, "EVAL %s 0", "local n = 0 for _, k in ipairs(redis.call('KEYS', '{sb:p}:ls:*')) do "
                                     "n = n + redis.call('SCARD', k) end return n");
        printf("# %d labelled waiters in %lld buckets\n", queued, b->integer);
        freeReplyObject(b);

        freeReplyObject(timed("labelled submit (queued)", &worst, t_sel_submit));
        freeReplyObject(timed("release of 64 members", &worst, t_release));
        redisReply *t = timed("tick handing 64 members on (budget)", &worst, t_sel_tick);
        assert_true(n_events(t) > 0);
        freeReplyObject(t);
        printf("# worst script call at 10,000 labelled waiters: %lld µs\n", worst);
        assert_true(worst > 0);
}

static void test_script_time_at_10000_waiters(void **state) {
        char rid[16];
        long long worst = 0;

        tick_ok("n1", 1000, CANON_ONE_LANE "limit=64\nqueue-timeout=600000000\n");
        redisReply *big = submit_at(1000, "big", "ci", 64, true, -1);
        big_token = field_i(body(big), D_TOKEN);
        freeReplyObject(big);
        for (int i = 0; i < 10000; i++) {
                snprintf(rid, sizeof rid, "w%05d", i);
                freeReplyObject(submit_at(1000, rid, "ci", 1 + i % 2, true, -1));
        }
        tick_ok("n1", 1000, "=");

        freeReplyObject(timed("submit (queued)", &worst, t_submit));
        freeReplyObject(timed("release", &worst, t_release));
        redisReply *t = timed("tick handing 64 slots on (budget)", &worst, t_tick);
        /* 43 grants (k = 1, 2, 1, … = 64 slots) and the instant: within SETTLE_MAX, and all of them. */
        assert_int_equal(n_events(t), 43);
        freeReplyObject(t);
        freeReplyObject(timed("withdraw", &worst, t_withdraw));
        redisReply *p = timed("submit again (idempotent)", &worst, t_retry);
        /* w00000…w00042 granted, w05000 withdrawn. */
        assert_int_equal(field_i(body(p), D_POSITION), 9999 - 43 - 1);
        freeReplyObject(p);
        freeReplyObject(timed("positions of 256 rids", &worst, t_positions));
        freeReplyObject(timed("positions status", &worst, t_status));
        printf("# worst script call at 10,000 waiters: %lld µs\n", worst);
        assert_true(worst > 0);
        assert_true(worst < 100000);
}

static void test_positions_say_queued_granted_refused_or_gone(void **state) {
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\n");
        expect_verdict("a", 1000, "ci", 1, "granted");
        expect_verdict("w1", 1000, "ci", 1, "queued");
        expect_verdict("w2", 1000, "ci", 1, "queued");
        freeReplyObject(submit_at(1000, "b", "ci", 1, false, -1)); /* refused busy */
        redisReply *r = call("positions", "n1", 1000, 0, "pos", "w2", "a", "b", "nope", NULL);
        assert_string_equal(status(r), "ok");
        const redisReply *p = body(r);
        assert_int_equal(p->elements, 4);
        assert_string_equal(p->element[0]->element[0]->str, "queued");
        assert_int_equal(p->element[0]->element[1]->integer, 1);
        assert_int_equal(p->element[0]->element[2]->integer, 2);
        assert_string_equal(p->element[1]->element[D_VERDICT]->str, "granted");
        assert_int_equal(p->element[1]->element[D_TOKEN]->integer, 1);
        assert_string_equal(p->element[2]->element[D_REFUSAL]->str, "busy");
        assert_string_equal(p->element[3]->element[0]->str, "gone");
        freeReplyObject(r);
}

static void test_status_lists_every_nodes_holders_and_the_first_waiters(void **state) {
        char rid[16];

        tick_ok("n1", 1000, CANON_TWO_LANES);
        redisReply *t = call("tick", "n2", 1000, 1, "host-two", CANON_TWO_LANES, "0", "0", "0", "-", "e", "1", "", NULL);
        freeReplyObject(t);
        expect_verdict("a", 1000, "lo", 1, "granted");
        freeReplyObject(call("submit", "n2", 1000, 0, "b", "hi", "1", "1", "0", "-1", "-1", "-", NULL));
        for (int i = 0; i < 150; i++) {
                snprintf(rid, sizeof rid, "w%03d", i);
                freeReplyObject(submit_at(1000, rid, "lo", 1, true, -1));
        }
        freeReplyObject(call("submit", "n2", 1000, 0, "late-hi", "hi", "1", "1", "0", "-1", "-1", "-", NULL));
        redisReply *r = call("positions", "n1", 1000, 0, "status", NULL);
        const redisReply *holders = body(r)->element[0], *waiters = body(r)->element[1];
        assert_int_equal(holders->elements, 2);
        bool saw_two = false;
        for (size_t i = 0; i < holders->elements; i++)
                if (strcmp(holders->element[i]->element[1]->str, "host-two") == 0) {
                        assert_string_equal(holders->element[i]->element[0]->str, "n2");
                        assert_string_equal(holders->element[i]->element[2]->str, "b");
                        assert_string_equal(holders->element[i]->element[3]->str, "hi");
                        saw_two = true;
                }
        assert_true(saw_two);
        assert_int_equal(waiters->elements, 100);
        /* The later high-priority waiter is first. */
        assert_string_equal(waiters->element[0]->element[1]->str, "host-two");
        assert_string_equal(waiters->element[0]->element[2]->str, "late-hi");
        assert_string_equal(waiters->element[0]->element[3]->str, "hi");
        assert_string_equal(waiters->element[1]->element[3]->str, "lo");
        assert_string_equal(waiters->element[1]->element[2]->str, "w000");
        assert_int_equal(waiters->element[99]->element[6]->integer, 99);
        assert_int_equal(body(r)->element[2]->integer, 151);
        freeReplyObject(r);
}

static void test_a_pool_drain_refuses_every_waiter_within_the_budget(void **state) {
        char rid[16];
        size_t refused = 0, calls = 0;

        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\n");
        redisReply *a = submit_at(1000, "a", "ci", 1, true, -1);
        for (int i = 0; i < 100; i++) {
                snprintf(rid, sizeof rid, "w%03d", i);
                freeReplyObject(submit_at(1000, rid, "ci", 1, true, -1));
        }
        tick_ok("n1", 1000, "=");
        for (;;) {
                redisReply *d = call("drain", "n1", 2000, 0, "", "1", NULL);
                calls++;
                assert_true(n_events(d) <= SETTLE_MAX);
                for (size_t i = 0; i < n_events(d); i++) {
                        assert_string_equal(field_s(event(d, i), D_REFUSAL), "unavailable");
                        assert_string_equal(field_s(event(d, i), D_REASON), "drained");
                }
                refused += n_events(d);
                bool settling = strcmp(status(d), "settling") == 0;
                assert_int_equal(cache(d, C_DRAINED), 1);
                freeReplyObject(d);
                if (!settling)
                        break;
                assert_true(calls < 10);
        }
        assert_int_equal(refused, 100);
        assert_int_equal(calls, 2);
        /* Drained: a new request is refused, a freed slot goes to nobody. */
        redisReply *s = submit_at(2000, "new", "ci", 1, true, -1);
        assert_string_equal(field_s(body(s), D_REASON), "drained");
        freeReplyObject(s);
        freeReplyObject(release_at(3000, field_i(body(a), D_TOKEN), "a"));
        freeReplyObject(call("drain", "n1", 4000, 0, "", "0", NULL));
        expect_verdict("after", 4000, "ci", 1, "granted");
        freeReplyObject(a);
}

#define CANON_MEMBERS CANON_ONE_LANE "limit=2\nmembers=alpha,beta\n"

static void test_a_drained_member_is_not_granted(void **state) {
        tick_ok("n1", 1000, CANON_MEMBERS);
        redisReply *d = call("drain", "n1", 1000, 0, "alpha", "1", NULL);
        assert_string_equal(body(d)->element[0]->str, "drained");
        freeReplyObject(d);
        d = call("drain", "n1", 1000, 0, "gamma", "1", NULL);
        assert_string_equal(body(d)->element[0]->str, "unknown-member");
        freeReplyObject(d);
        redisReply *b = submit_at(1000, "b", "ci", 1, true, -1);
        assert_string_equal(field_s(body(b), D_VERDICT), "granted");
        assert_string_equal(body(b)->element[D_MEMBERS]->element[0]->str, "beta");
        assert_int_equal(body(b)->element[D_SLOTS]->element[0]->integer, 1);
        freeReplyObject(b);
        expect_verdict("c", 1000, "ci", 1, "queued");
        tick_ok("n1", 1000, "=");
        freeReplyObject(call("drain", "n1", 2000, 0, "alpha", "0", NULL));
        redisReply *t = tick_as("n1", 2000, "=");
        assert_int_equal(n_events(t), 1);
        assert_string_equal(event(t, 0)->element[D_MEMBERS]->element[0]->str, "alpha");
        freeReplyObject(t);
}

/* ---- labels and a named member (SPEC §3.5) ---- */

#define CANON_RIGS CANON_ONE_LANE "label.arm64=a,b\nlabel.usb3=b,c\nlimit=4\nmembers=a,b,c,d\n"

/* submit of k slots of lane ci with a selector canon (submit's [14]), settle 0; any status. */
static redisReply *submit_sel(long long now, const char *rid, int k, const char *selector) {
        char k_s[16];
        snprintf(k_s, sizeof k_s, "%d", k);
        return call("submit", "n1", now, 0, rid, "ci", k_s, "1", "0", "-1", "-1", "-", selector, NULL);
}

static const char *member_of(const redisReply *d, size_t i) {
        assert_true(d->element[D_MEMBERS]->elements > i);
        return d->element[D_MEMBERS]->element[i]->str;
}

/* The waiter record's wid of rid (node n1). */
static void wid_of(const char *rid, char ret[static 32]) {
        redisReply *r = redisCommand(redis, "HGET " POOL ":rid n1:%s", rid);
        assert_non_null(r);
        assert_int_equal(r->type, REDIS_REPLY_STRING);
        assert_true(strncmp(r->str, "w:", 2) == 0);
        snprintf(ret, 32, "%s", r->str + 2);
        freeReplyObject(r);
}

static void test_labelled_waiters_set_aside_members_and_disjoint_ones_flow(void **state) {
        tick_ok("n1", 1000, CANON_RIGS);
        /* What no member can ever give is invalid before anything is queued. */
        static const char *const bad[] = { "gpu", "@z", "arm64 !arm64", "Arm64", "arm64 @c", "@", "!", "a b@c",
                                           "@a @b" };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                redisReply *r = submit_sel(1000, "bad", 1, bad[i]);
                assert_string_equal(status(r), "invalid");
                freeReplyObject(r);
        }
        redisReply *r = submit_sel(1000, "bad", 3, "arm64"); /* two members carry it */
        assert_string_equal(status(r), "invalid");
        freeReplyObject(r);

        redisReply *x = submit_sel(1000, "x", 1, "@a");
        assert_string_equal(field_s(body(x), D_VERDICT), "granted");
        assert_string_equal(member_of(body(x), 0), "a");
        long long x_token = field_i(body(x), D_TOKEN);
        freeReplyObject(x);
        r = submit_sel(2000, "w", 2, "arm64");
        assert_string_equal(field_s(body(r), D_VERDICT), "queued");
        freeReplyObject(r);
        /* b is free, set aside for w: a one-rig arm64 request queues behind it. */
        r = submit_sel(3000, "one", 1, "arm64");
        assert_string_equal(field_s(body(r), D_VERDICT), "queued");
        assert_int_equal(field_i(body(r), D_POSITION), 1);
        freeReplyObject(r);
        /* c is of no use to either: it flows on, and so does d to a request of any slot. */
        r = submit_sel(4000, "usb", 1, "usb3");
        assert_string_equal(field_s(body(r), D_VERDICT), "granted");
        assert_string_equal(member_of(body(r), 0), "c");
        freeReplyObject(r);
        r = submit_sel(4000, "any", 1, "");
        assert_string_equal(field_s(body(r), D_VERDICT), "granted");
        assert_string_equal(member_of(body(r), 0), "d");
        freeReplyObject(r);
        tick_ok("n1", 4000, "=");

        /* Bad input from Redis: "one"'s record says garbage, and a bucket of a garbage canon lists it too. */
        char wid[32];
        wid_of("one", wid);
        r = redisCommand(redis, "EVAL %s 1 %s %s",
                         "local a = cmsgpack.unpack(redis.call('HGET', KEYS[1], ARGV[1])) a[12] = '\\1 !! @' "
                         "redis.call('HSET', KEYS[1], ARGV[1], cmsgpack.pack(a))",
                         POOL ":w", wid);
        assert_non_null(r);
        assert_int_not_equal(r->type, REDIS_REPLY_ERROR);
        freeReplyObject(r);
        freeReplyObject(redisCommand(redis, "SADD " POOL ":ls:ci %s", "1:BAD CANON"));
        freeReplyObject(redisCommand(redis, "ZADD %s 0 %s", POOL ":b:ci:1:BAD CANON", wid));

        /* a frees: w gets a and b at once (the lowest it may use). */
        freeReplyObject(release_at(5000, x_token, "x"));
        redisReply *t = tick_as("n1", 5000, "=");
        assert_int_equal(n_events(t), 1);
        assert_string_equal(field_s(event(t, 0), D_RID), "w");
        assert_string_equal(member_of(event(t, 0), 0), "a");
        assert_string_equal(member_of(event(t, 0), 1), "b");
        long long w_token = field_i(event(t, 0), D_TOKEN);
        freeReplyObject(t);
        /* w ends: "one" gets a, once, whatever its record and the garbage bucket say. */
        freeReplyObject(release_at(6000, w_token, "w"));
        t = tick_as("n1", 6000, "=");
        assert_int_equal(n_events(t), 1);
        assert_string_equal(field_s(event(t, 0), D_RID), "one");
        assert_string_equal(member_of(event(t, 0), 0), "a");
        assert_int_equal(cache(t, C_IN_USE), 3);
        assert_int_equal(cache(t, C_WAITING), 0);
        freeReplyObject(t);
        t = tick_as("n1", 7000, "=");
        assert_int_equal(n_events(t), 0);
        assert_string_equal(status(t), "ok");
        freeReplyObject(t);
}

/* A pool drain refuses labelled waiters too (after the lane's plain ones), and so does an adopted reload that
 * removes their lane. */
static void test_a_drain_and_a_removed_lane_refuse_labelled_waiters(void **state) {
        tick_ok("n1", 1000, CANON_RIGS);
        freeReplyObject(submit_at(1000, "all", "ci", 4, true, -1));
        const char *const queued_rids[] = { "s1", "s2", "p" };
        const char *const selectors[] = { "arm64", "@c", "" };
        for (size_t i = 0; i < ELEMENTSOF(queued_rids); i++) {
                redisReply *r = submit_sel(1000, queued_rids[i], 1, selectors[i]);
                assert_string_equal(field_s(body(r), D_VERDICT), "queued");
                freeReplyObject(r);
        }
        tick_ok("n1", 1000, "=");
        redisReply *d = call("drain", "n1", 2000, 1, "", "1", NULL);
        assert_string_equal(body(d)->element[0]->str, "drained");
        assert_int_equal(n_events(d), 3);
        const char *const order[] = { "p", "s2", "s1" };
        for (size_t i = 0; i < 3; i++) {
                assert_string_equal(field_s(event(d, i), D_RID), order[i]);
                assert_string_equal(field_s(event(d, i), D_REFUSAL), "unavailable");
                assert_string_equal(field_s(event(d, i), D_REASON), "drained");
        }
        assert_int_equal(cache(d, C_WAITING), 0);
        freeReplyObject(d);
        freeReplyObject(call("drain", "n1", 3000, 1, "", "0", NULL));
        redisReply *r = submit_sel(3000, "s3", 1, "usb3");
        assert_string_equal(field_s(body(r), D_VERDICT), "queued");
        freeReplyObject(r);
        redisReply *t = tick_as("n1", 4000, "backend-node-ttl=30000000\nlane.cd.max-in-use=-1\nlane.cd.priority=0\n"
                                            "lane.cd.reserve=0\nlabel.arm64=a,b\nlabel.usb3=b,c\nlimit=4\n"
                                            "members=a,b,c,d\n");
        assert_string_equal(status(t), "ok");
        assert_int_equal(n_events(t), 1);
        assert_string_equal(field_s(event(t, 0), D_RID), "s3");
        assert_string_equal(field_s(event(t, 0), D_REFUSAL), "unavailable");
        assert_int_equal(cache(t, C_WAITING), 0);
        freeReplyObject(t);
}

/* A reload that takes a label away refuses the waiters it leaves without enough members; a held member keeps
 * its lease and the new labels apply to the next grant. */
static void test_relabel_refuses_what_no_member_can_give_and_keeps_holders(void **state) {
        tick_ok("n1", 1000, CANON_RIGS);
        redisReply *r = submit_sel(1000, "b", 1, "arm64 usb3");
        assert_string_equal(member_of(body(r), 0), "b");
        freeReplyObject(r);
        r = submit_sel(1000, "a", 1, "arm64");
        assert_string_equal(member_of(body(r), 0), "a");
        freeReplyObject(r);
        r = submit_sel(2000, "two", 2, "arm64");
        assert_string_equal(field_s(body(r), D_VERDICT), "queued");
        freeReplyObject(r);
        r = submit_sel(2000, "usb", 1, "usb3 !arm64");
        assert_string_equal(member_of(body(r), 0), "c");
        freeReplyObject(r);
        r = submit_sel(2000, "u2", 1, "usb3");
        assert_string_equal(field_s(body(r), D_VERDICT), "queued");
        freeReplyObject(r);
        tick_ok("n1", 2000, "=");
        /* arm64 is a alone now, usb3 moves to d: "two" can never be granted; u2 gets d. */
        redisReply *t = tick_as("n1", 3000, CANON_ONE_LANE "label.arm64=a\nlabel.usb3=c,d\nlimit=4\nmembers=a,b,c,d\n");
        assert_string_equal(status(t), "ok");
        assert_int_equal(n_events(t), 2);
        assert_string_equal(field_s(event(t, 0), D_RID), "two");
        assert_string_equal(field_s(event(t, 0), D_VERDICT), "refused");
        assert_string_equal(field_s(event(t, 0), D_REFUSAL), "unavailable");
        assert_string_equal(field_s(event(t, 1), D_RID), "u2");
        assert_string_equal(field_s(event(t, 1), D_VERDICT), "granted");
        assert_string_equal(member_of(event(t, 1), 0), "d");
        assert_int_equal(cache(t, C_IN_USE), 4); /* b kept by its holder */
        freeReplyObject(t);
}

/* Labels are rules: a node with other labels is refused, naming them. */
static void test_other_labels_are_refused_naming_the_keys(void **state) {
        tick_ok("n1", 1000, CANON_RIGS);
        redisReply *t = tick_as("n2", 1000, CANON_ONE_LANE "label.arm64=a\nlabel.usb3=b,c\nlimit=4\nmembers=a,b,c,d\n");
        assert_string_equal(status(t), "rules");
        const redisReply *diff = body(t)->element[4];
        assert_int_equal(diff->elements, 1);
        assert_string_equal(diff->element[0]->str, "label.arm64");
        freeReplyObject(t);
        t = tick_as("n3", 1000, CANON_ONE_LANE "lane.ci.labels=arm64\nlabel.arm64=a,b\nlabel.usb3=b,c\nlimit=4\n"
                                                "members=a,b,c,d\n");
        assert_string_equal(status(t), "rules");
        diff = body(t)->element[4];
        assert_int_equal(diff->elements, 1);
        assert_string_equal(diff->element[0]->str, "lane.ci.labels");
        freeReplyObject(t);
}

/* ---- members' lives (SPEC §3.6; README, "Members' lives") ---- */

static long long meta_number(const char *key, const char *field);

#define CANON_QUARANTINE CANON_MEMBERS "quarantine-after=2\nquarantine-exit-codes=3,4\n"

/* node's submit of one slot at now (settle 0), its decision. */
static redisReply *submit_as(const char *node, long long now, const char *rid) {
        redisReply *r = call("submit", node, now, 0, rid, "ci", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(status(r), "ok");
        return r;
}

/* n1's grant of rid at now: its member; *token its token. */
static const char *granted_member(long long now, const char *rid, long long *token) {
        static char member[32];
        redisReply *r = submit_as("n1", now, rid);
        assert_string_equal(field_s(body(r), D_VERDICT), "granted");
        *token = field_i(body(r), D_TOKEN);
        snprintf(member, sizeof member, "%s", body(r)->element[D_MEMBERS]->element[0]->str);
        freeReplyObject(r);
        return member;
}

static redisReply *release_with(long long now, long long token, const char *rid, const char *exit_status, const char *job) {
        char t[32];
        snprintf(t, sizeof t, "%lld", token);
        redisReply *r = call("release", "n1", now, 0, t, rid, exit_status, job, NULL);
        assert_string_equal(status(r), "ok");
        return r;
}

static const redisReply *quarantined_list(const redisReply *r) {
        assert_true(r->element[R_CACHE]->elements > 13);
        return r->element[R_CACHE]->element[13];
}

static size_t n_notices(const redisReply *r) {
        return r->element[R_NOTICES]->elements;
}

static void test_quarantine_counts_exit_statuses_in_redis_and_every_node_obeys_it(void **state) {
        tick_ok("n1", 1000, CANON_QUARANTINE);
        tick_ok("n2", 1000, CANON_QUARANTINE);
        long long token;
        /* One infrastructure failure of two: counted in Redis, nothing quarantined. */
        assert_string_equal(granted_member(1000, "a", &token), "alpha");
        redisReply *r = release_with(1000, token, "a", "3", "job-a");
        assert_int_equal(n_notices(r), 0);
        assert_int_equal(quarantined_list(r)->elements, 0);
        freeReplyObject(r);
        redisReply *v = redisCommand(redis, "HGET " POOL ":qf alpha");
        assert_string_equal(v->str, "1");
        freeReplyObject(v);
        /* A success starts the count again; a retried release ("gone") counts nothing. */
        assert_string_equal(granted_member(2000, "b", &token), "alpha");
        freeReplyObject(release_with(2000, token, "b", "0", "job-b"));
        freeReplyObject(release_with(2000, token, "b", "3", "job-b"));
        v = redisCommand(redis, "HEXISTS " POOL ":qf alpha");
        assert_int_equal(v->integer, 0);
        freeReplyObject(v);
        /* No status told (an older client): nothing counted either way. */
        assert_string_equal(granted_member(2000, "c", &token), "alpha");
        freeReplyObject(release_at(2000, token, "c"));
        assert_string_equal(granted_member(3000, "d", &token), "alpha");
        freeReplyObject(release_with(3000, token, "d", "4", "job-d"));
        assert_string_equal(granted_member(4000, "e", &token), "alpha");
        r = release_with(4000, token, "e", "3", "job-e");
        /* The second in a row: quarantined, told once, to the node whose call did it. */
        assert_int_equal(n_notices(r), 1);
        const redisReply *n = r->element[R_NOTICES]->element[0];
        assert_string_equal(n->element[0]->str, "quarantined");
        assert_string_equal(n->element[1]->str, "alpha");
        assert_int_equal(n->element[2]->integer, 4000);
        assert_string_equal(n->element[3]->str, "job-e");
        assert_int_equal(n->element[4]->integer, 3);
        assert_string_equal(n->element[5]->str, "n1");
        const redisReply *q = quarantined_list(r);
        assert_int_equal(q->elements, 1);
        assert_string_equal(q->element[0]->element[0]->str, "alpha");
        assert_int_equal(q->element[0]->element[1]->integer, 4000);
        assert_string_equal(q->element[0]->element[2]->str, "job-e");
        assert_int_equal(q->element[0]->element[3]->integer, 3);
        freeReplyObject(r);
        /* Node n2 sees it in any reply, and is never granted alpha. */
        r = submit_as("n2", 5000, "f");
        assert_string_equal(field_s(body(r), D_VERDICT), "granted");
        assert_string_equal(body(r)->element[D_MEMBERS]->element[0]->str, "beta");
        assert_int_equal(quarantined_list(r)->elements, 1);
        freeReplyObject(r);
        r = submit_as("n2", 5000, "g");
        assert_string_equal(field_s(body(r), D_VERDICT), "queued");
        freeReplyObject(r);
        tick_ok("n1", 5000, "=");
        /* Quarantining what is quarantined changes nothing; an unknown member is said so. */
        r = call("quarantine", "n2", 6000, 0, "alpha", "1", "uid 0", "again", NULL);
        assert_string_equal(body(r)->element[0]->str, "unchanged");
        assert_int_equal(n_notices(r), 0);
        freeReplyObject(r);
        r = call("quarantine", "n2", 6000, 0, "gamma", "1", "uid 0", "x", NULL);
        assert_string_equal(body(r)->element[0]->str, "unknown-member");
        freeReplyObject(r);
        /* Restored by n2: its reply tells it, and the waiter is granted alpha at that instant. */
        r = call("quarantine", "n2", 7000, 0, "alpha", "0", "uid 0", "", NULL);
        assert_string_equal(body(r)->element[0]->str, "restored");
        assert_int_equal(n_notices(r), 1);
        assert_string_equal(r->element[R_NOTICES]->element[0]->element[0]->str, "restored");
        assert_int_equal(quarantined_list(r)->elements, 0);
        freeReplyObject(r);
        r = tick_as("n2", 7000, "=");
        assert_int_equal(n_events(r), 1);
        assert_string_equal(field_s(event(r, 0), D_RID), "g");
        assert_string_equal(event(r, 0)->element[D_MEMBERS]->element[0]->str, "alpha");
        freeReplyObject(r);
}

static void test_a_held_member_quarantined_by_hand_stays_out_when_released(void **state) {
        tick_ok("n1", 1000, CANON_QUARANTINE);
        long long token;
        assert_string_equal(granted_member(1000, "a", &token), "alpha");
        redisReply *r = call("quarantine", "n1", 1000, 0, "alpha", "1", "uid 1000", "flash worn", NULL);
        assert_string_equal(body(r)->element[0]->str, "quarantined");
        const redisReply *n = r->element[R_NOTICES]->element[0];
        assert_string_equal(n->element[3]->str, "uid 1000");
        assert_int_equal(n->element[4]->integer, -1);
        assert_string_equal(n->element[6]->str, "flash worn");
        freeReplyObject(r);
        /* Drained and undrained by hand meanwhile: still out of use. */
        freeReplyObject(call("drain", "n1", 1000, 0, "alpha", "1", NULL));
        freeReplyObject(call("drain", "n1", 1000, 0, "alpha", "0", NULL));
        freeReplyObject(release_at(2000, token, "a"));
        assert_string_equal(granted_member(2000, "b", &token), "beta");
        expect_verdict("c", 2000, "ci", 1, "queued");
        tick_ok("n1", 2000, "=");
        assert_int_equal(meta_number("meta", "drained_free"), 1);
        r = call("quarantine", "n1", 3000, 0, "alpha", "0", "uid 0", "", NULL);
        assert_string_equal(body(r)->element[0]->str, "restored");
        freeReplyObject(r);
        r = tick_as("n1", 3000, "=");
        assert_int_equal(n_events(r), 1);
        assert_string_equal(event(r, 0)->element[D_MEMBERS]->element[0]->str, "alpha");
        freeReplyObject(r);
        assert_int_equal(meta_number("meta", "drained_free"), 0);
}

/* Garbage where the records are (written by hand: a hostile or broken writer): no error, no grant of the
 * quarantined member, a record of nobody known shown as such. */
static void test_garbage_quarantine_records_break_nothing_and_grant_nothing(void **state) {
        tick_ok("n1", 1000, CANON_QUARANTINE);
        freeReplyObject(call("quarantine", "n1", 1000, 0, "alpha", "1", "uid 0", "x", NULL));
        freeReplyObject(redisCommand(redis, "HSET " POOL ":qm alpha %b", "\xc1\xff\x00garbage", (size_t) 10));
        freeReplyObject(redisCommand(redis, "HSET " POOL ":qm gamma junk"));
        freeReplyObject(redisCommand(redis, "HSET " POOL ":qf beta 99999999999999999999"));
        redisReply *r = tick_as("n1", 1000, "=");
        assert_string_equal(status(r), "ok");
        const redisReply *q = quarantined_list(r);
        assert_int_equal(q->elements, 1);
        assert_string_equal(q->element[0]->element[0]->str, "alpha");
        assert_int_equal(q->element[0]->element[1]->integer, 0);
        assert_int_equal(q->element[0]->element[3]->integer, -1);
        freeReplyObject(r);
        long long token;
        assert_string_equal(granted_member(2000, "a", &token), "beta");
        expect_verdict("b", 2000, "ci", 1, "queued");
        /* A failure count of garbage counts from nothing. */
        freeReplyObject(release_with(2000, token, "a", "3", "job-a"));
        tick_ok("n1", 2000, "=");
        /* The keys of another type: every member counts as quarantined (no grant), nothing fails. */
        freeReplyObject(redisCommand(redis, "DEL " POOL ":qm " POOL ":qf"));
        freeReplyObject(redisCommand(redis, "SET " POOL ":qm garbage"));
        freeReplyObject(redisCommand(redis, "SET " POOL ":qf garbage"));
        r = tick_as("n1", 3000, "=");
        assert_string_equal(status(r), "ok");
        assert_int_equal(quarantined_list(r)->elements, 0);
        freeReplyObject(r);
        /* beta went to b at 2000; released with a quarantine code: beta stays out too. */
        redisReply *p = call("positions", "n1", 3000, 0, "pos", "b", NULL);
        long long tb = field_i(body(p)->element[0], D_TOKEN);
        freeReplyObject(p);
        freeReplyObject(release_with(3000, tb, "b", "3", "job-b"));
        expect_verdict("c", 3000, "ci", 1, "queued");
        r = tick_as("n1", 3000, "=");
        assert_int_equal(n_events(r), 0);
        freeReplyObject(r);
        /* A restore makes the key anew. */
        r = call("quarantine", "n1", 4000, 0, "alpha", "0", "uid 0", "", NULL);
        assert_string_equal(status(r), "ok");
        freeReplyObject(r);
        r = tick_as("n1", 4000, "=");
        assert_int_equal(n_events(r), 1);
        freeReplyObject(r);
}

/* Health lanes (README, "Health lanes"): beside the queue, counted apart (the integrity checks count both),
 * refused by a pool drain. */
static void test_health_waiters_wait_beside_the_queue_and_a_pool_drain_refuses_them(void **state) {
        tick_ok("n1", 1000, CANON_QUARANTINE "lane.hc.health=1\nlane.hc.max-in-use=-1\nlane.hc.priority=0\n"
                            "lane.hc.reserve=0\n");
        redisReply *r = call("submit", "n1", 1000, 0, "h0", "hc", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(field_s(body(r), D_REASON), "not-quarantined");
        freeReplyObject(r);
        freeReplyObject(call("quarantine", "n1", 1000, 0, "alpha", "1", "uid 0", "x", NULL));
        r = call("submit", "n1", 1000, 0, "h1", "hc", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(field_s(body(r), D_VERDICT), "granted");
        assert_string_equal(body(r)->element[D_MEMBERS]->element[0]->str, "alpha");
        freeReplyObject(r);
        r = call("submit", "n1", 1000, 0, "h2", "hc", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(field_s(body(r), D_VERDICT), "queued");
        freeReplyObject(r);
        tick_ok("n1", 1000, "=");
        /* The ordinary queue does not see it: beta is granted at once. */
        expect_verdict("b", 2000, "ci", 1, "granted");
        r = tick_as("n1", 2000, "=");
        assert_string_equal(status(r), "ok");
        assert_int_equal(cache(r, 1), 0); /* waiting: the ordinary queue's */
        freeReplyObject(r);
        redisReply *lost = redisCommand(redis, "HEXISTS " POOL ":meta lost");
        assert_int_equal(lost->integer, 0); /* no integrity check failed */
        freeReplyObject(lost);
        r = call("drain", "n1", 3000, 0, "", "1", NULL);
        assert_int_equal(n_events(r), 1);
        assert_string_equal(field_s(event(r, 0), D_RID), "h2");
        assert_string_equal(field_s(event(r, 0), D_REASON), "drained");
        freeReplyObject(r);
}

/* health = also (README, "Health lanes"; pool-local.c): quarantined members first when enough are free now, else
 * an ordinary request; whether a lease is a health job is fixed at its grant (the lease record's [14]). */
static void test_health_also_takes_quarantined_members_first_and_its_grant_says_which(void **state) {
        tick_ok("n1", 1000, CANON_QUARANTINE "lane.ha.health=also\nlane.ha.max-in-use=-1\nlane.ha.priority=0\n"
                            "lane.ha.reserve=0\n");
        /* Nothing quarantined: an ordinary grant, not a refusal (health=1 says not-quarantined). */
        redisReply *r = call("submit", "n1", 1000, 0, "o1", "ha", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(field_s(body(r), D_VERDICT), "granted");
        assert_string_equal(body(r)->element[D_MEMBERS]->element[0]->str, "alpha");
        long long t_o1 = field_i(body(r), D_TOKEN);
        freeReplyObject(r);
        freeReplyObject(release_with(1000, t_o1, "o1", "0", "job"));
        /* beta quarantined: taken first, though alpha is free and first; its exit 0 restores beta. */
        freeReplyObject(call("quarantine", "n1", 1000, 0, "beta", "1", "uid 0", "x", NULL));
        r = call("submit", "n1", 2000, 0, "h1", "ha", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(field_s(body(r), D_VERDICT), "granted");
        assert_string_equal(body(r)->element[D_MEMBERS]->element[0]->str, "beta");
        long long t_h1 = field_i(body(r), D_TOKEN);
        freeReplyObject(r);
        /* No quarantined member free: alpha, as any lane's; quarantined by hand while it runs, its exit 0 (an
         * ordinary job's) does not restore it. */
        r = call("submit", "n1", 2000, 0, "o2", "ha", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(field_s(body(r), D_VERDICT), "granted");
        assert_string_equal(body(r)->element[D_MEMBERS]->element[0]->str, "alpha");
        long long t_o2 = field_i(body(r), D_TOKEN);
        freeReplyObject(r);
        /* Full: it waits in the ordinary queue (waiting counts it). */
        r = call("submit", "n1", 2000, 0, "o3", "ha", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(field_s(body(r), D_VERDICT), "queued");
        freeReplyObject(r);
        r = tick_as("n1", 2000, "=");
        assert_int_equal(cache(r, 1), 1);
        freeReplyObject(r);
        freeReplyObject(call("quarantine", "n1", 3000, 0, "alpha", "1", "uid 0", "y", NULL));
        r = release_with(3000, t_o2, "o2", "0", "job-a");
        assert_int_equal(n_notices(r), 0);
        assert_int_equal(quarantined_list(r)->elements, 2);
        freeReplyObject(r);
        r = release_with(4000, t_h1, "h1", "0", "check-b");
        assert_int_equal(n_notices(r), 1);
        assert_string_equal(r->element[R_NOTICES]->element[0]->element[0]->str, "restored");
        assert_string_equal(r->element[R_NOTICES]->element[0]->element[1]->str, "beta");
        assert_int_equal(quarantined_list(r)->elements, 1);
        freeReplyObject(r);
        /* beta restored goes to the ordinary waiter o3 (at the instant's dispatch). */
        tick_ok("n1", 4000, "=");
        r = call("positions", "n1", 4000, 0, "pos", "o3", NULL);
        assert_string_equal(field_s(body(r)->element[0], D_VERDICT), "granted");
        freeReplyObject(r);
        redisReply *lost = redisCommand(redis, "HEXISTS " POOL ":meta lost");
        assert_int_equal(lost->integer, 0); /* no integrity check failed */
        freeReplyObject(lost);
}

/* A health waiter's place (README, "Health lanes"; pool-local.c's local_position()): among hq's, of meta.hwaiting,
 * in its queued decision, a retried submit, positions and the status snapshot (after the queue's waiters). */
static void test_health_waiters_have_their_place_among_hq(void **state) {
        tick_ok("n1", 1000, CANON_QUARANTINE "lane.hc.health=1\nlane.hc.max-in-use=-1\nlane.hc.priority=5\n"
                            "lane.hc.reserve=0\n");
        freeReplyObject(call("quarantine", "n1", 1000, 0, "alpha", "1", "uid 0", "x", NULL));
        expect_verdict("b", 1000, "ci", 1, "granted");
        expect_verdict("c", 1000, "ci", 1, "queued");
        redisReply *r = call("submit", "n1", 1000, 0, "h1", "hc", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(field_s(body(r), D_VERDICT), "granted");
        freeReplyObject(r);
        const char *rids[] = { "h2", "h3" };
        for (int i = 0; i < 2; i++) {
                r = call("submit", "n1", 1000, 0, rids[i], "hc", "1", "1", "0", "-1", "-1", "-", NULL);
                assert_string_equal(field_s(body(r), D_VERDICT), "queued");
                assert_int_equal(field_i(body(r), D_POSITION), i);
                assert_int_equal(field_i(body(r), D_QUEUED), i + 1);
                freeReplyObject(r);
        }
        /* The same rid again: where it stands. */
        r = call("submit", "n1", 1000, 0, "h3", "hc", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_int_equal(field_i(body(r), D_POSITION), 1);
        assert_int_equal(field_i(body(r), D_QUEUED), 2);
        freeReplyObject(r);
        r = call("positions", "n1", 1000, 0, "pos", "h3", "c", NULL);
        assert_string_equal(body(r)->element[0]->element[0]->str, "queued");
        assert_int_equal(body(r)->element[0]->element[1]->integer, 1);
        assert_int_equal(body(r)->element[0]->element[2]->integer, 2);
        /* The ordinary waiter is first in its queue of one, though hc's priority is higher. */
        assert_int_equal(body(r)->element[1]->element[1]->integer, 0);
        assert_int_equal(body(r)->element[1]->element[2]->integer, 1);
        freeReplyObject(r);
        r = call("positions", "n1", 1000, 0, "status", NULL);
        const redisReply *waiters = body(r)->element[1];
        assert_int_equal(waiters->elements, 3);
        assert_string_equal(waiters->element[0]->element[2]->str, "c");
        assert_int_equal(waiters->element[0]->element[6]->integer, 0);
        assert_string_equal(waiters->element[1]->element[2]->str, "h2");
        assert_int_equal(waiters->element[1]->element[6]->integer, 0);
        assert_string_equal(waiters->element[2]->element[2]->str, "h3");
        assert_int_equal(waiters->element[2]->element[6]->integer, 1);
        assert_int_equal(body(r)->element[2]->integer, 1); /* waiting: the queue's */
        freeReplyObject(r);
}

/* ---- drains with who, why and until (SPEC §3.6; README, "Drains with a reason") ---- */

static const redisReply *drains_list(const redisReply *r) {
        assert_true(r->element[R_CACHE]->elements > 14);
        return r->element[R_CACHE]->element[14];
}

static void test_a_drain_until_ends_by_itself_at_the_pools_own_instant(void **state) {
        tick_ok("n1", 1000, CANON_MEMBERS);
        tick_ok("n2", 1000, CANON_MEMBERS);
        redisReply *r = call("drain", "n1", 1000, 0, "alpha", "1", "uid 7", "reflash", "5000", NULL);
        assert_string_equal(body(r)->element[0]->str, "drained");
        assert_int_equal(n_notices(r), 1);
        const redisReply *n = r->element[R_NOTICES]->element[0];
        assert_string_equal(n->element[0]->str, "drained");
        assert_string_equal(n->element[1]->str, "alpha");
        assert_string_equal(n->element[3]->str, "uid 7");
        assert_string_equal(n->element[4]->str, "reflash");
        assert_int_equal(n->element[5]->integer, 5000);
        const redisReply *d = drains_list(r);
        assert_int_equal(d->elements, 1);
        assert_string_equal(d->element[0]->element[0]->str, "alpha");
        assert_int_equal(d->element[0]->element[1]->integer, 1000);
        assert_string_equal(d->element[0]->element[2]->str, "uid 7");
        assert_string_equal(d->element[0]->element[3]->str, "reflash");
        assert_int_equal(d->element[0]->element[4]->integer, 5000);
        assert_string_equal(d->element[0]->element[5]->str, "n1");
        freeReplyObject(r);
        /* Its until is the pool's own instant: every node's next wakeup, once the instant of 1000 is done. */
        r = tick_as("n2", 1000, "=");
        assert_int_equal(cache(r, 5), 5000);
        freeReplyObject(r);
        r = submit_as("n2", 2000, "b");
        assert_string_equal(body(r)->element[D_MEMBERS]->element[0]->str, "beta");
        assert_int_equal(drains_list(r)->elements, 1);
        freeReplyObject(r);
        r = submit_as("n2", 2000, "c");
        assert_string_equal(field_s(body(r), D_VERDICT), "queued");
        freeReplyObject(r);
        tick_ok("n1", 2000, "=");
        r = tick_as("n1", 4999, "=");
        assert_int_equal(n_events(r), 0);
        freeReplyObject(r);
        /* Whichever node's call comes at or after it runs the undrain, at 5000, and tells it once. */
        r = tick_as("n1", 7000, "=");
        assert_int_equal(n_notices(r), 1);
        n = r->element[R_NOTICES]->element[0];
        assert_string_equal(n->element[0]->str, "undrained");
        assert_string_equal(n->element[1]->str, "alpha");
        assert_int_equal(n->element[2]->integer, 5000);
        assert_int_equal(n->element[6]->integer, 1);
        assert_int_equal(drains_list(r)->elements, 0);
        freeReplyObject(r);
        r = tick_as("n2", 7000, "=");
        assert_int_equal(n_notices(r), 0);
        freeReplyObject(r);
        r = call("positions", "n2", 7000, 0, "pos", "c", NULL);
        assert_string_equal(field_s(body(r)->element[0], D_VERDICT), "granted");
        assert_int_equal(field_i(body(r)->element[0], D_AT), 5000);
        freeReplyObject(r);
}

static void test_a_pool_drain_with_a_reason_and_its_undrain(void **state) {
        tick_ok("n1", 1000, CANON_MEMBERS);
        expect_verdict("a", 1000, "ci", 1, "granted");
        expect_verdict("b", 1000, "ci", 1, "granted");
        expect_verdict("w", 1000, "ci", 1, "queued");
        redisReply *r = call("drain", "n1", 2000, 0, "", "1", "uid 0", "maintenance", "", NULL);
        assert_string_equal(body(r)->element[0]->str, "drained");
        assert_int_equal(cache(r, 4), 1);
        const redisReply *d = drains_list(r);
        assert_int_equal(d->elements, 1);
        assert_string_equal(d->element[0]->element[0]->str, "");
        assert_int_equal(d->element[0]->element[4]->integer, -1);
        freeReplyObject(r);
        r = call("drain", "n1", 3000, 0, "", "0", "", "", "", NULL);
        assert_string_equal(body(r)->element[0]->str, "undrained");
        assert_int_equal(drains_list(r)->elements, 0);
        assert_string_equal(r->element[R_NOTICES]->element[0]->element[0]->str, "undrained");
        assert_int_equal(r->element[R_NOTICES]->element[0]->element[6]->integer, 0);
        freeReplyObject(r);
        /* Garbage in the record: shown as a drain of nobody known; an until of garbage ends nothing. */
        freeReplyObject(redisCommand(redis, "HSET " POOL ":dr beta junk"));
        freeReplyObject(redisCommand(redis, "HSET " POOL ":dr nobody junk"));
        r = tick_as("n1", 4000, "=");
        assert_string_equal(status(r), "ok");
        assert_int_equal(drains_list(r)->elements, 1);
        assert_string_equal(drains_list(r)->element[0]->element[0]->str, "beta");
        freeReplyObject(r);
}

static redisReply *reclaim(long long now, const char *rid, const char *token, const char *slot) {
        return call("reclaim", "n1", now, 1, rid, "ci", "1", token, "1000", slot, NULL);
}

/* Redis lost the pool (a new redis-clock pool looks the same): inside the recovery window a node takes its
 * leases back, on the same slots and tokens; a slot taken is a conflict. */
static void test_reclaim_inside_the_recovery_window(void **state) {
        redisReply *t = call("tick", "n1", -1, 1, "n1", CANON_ONE_LANE "limit=2\n", "0", "0", "0", "-", "e1", "1", "",
                             NULL);
        freeReplyObject(t);
        redisReply *r = reclaim(-1, "a", "500", "1");
        assert_string_equal(status(r), "ok");
        assert_string_equal(body(r)->element[0]->str, "confirmed");
        assert_int_equal(cache(r, C_IN_USE), 1);
        assert_int_equal(cache(r, C_COUNTER), 500);
        freeReplyObject(r);
        r = reclaim(-1, "a", "500", "1");
        assert_string_equal(body(r)->element[0]->str, "confirmed");
        assert_int_equal(cache(r, C_IN_USE), 1);
        freeReplyObject(r);
        r = reclaim(-1, "b", "400", "1");
        assert_string_equal(body(r)->element[0]->str, "conflict");
        freeReplyObject(r);
        r = reclaim(-1, "c", "450", "0");
        assert_string_equal(body(r)->element[0]->str, "confirmed");
        assert_int_equal(cache(r, C_IN_USE), 2);
        assert_int_equal(cache(r, C_COUNTER), 500);
        freeReplyObject(r);
        /* Released as any lease. */
        r = call("release", "n1", -1, 1, "500", "a", NULL);
        assert_string_equal(body(r)->element[0]->str, "released");
        freeReplyObject(r);
}

static void test_reclaim_outside_a_recovery_window_is_lost(void **state) {
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=2\n");
        redisReply *a = submit_at(1000, "a", "ci", 1, true, -1);
        redisReply *r = reclaim(2000, "a", "1", "0");
        assert_string_equal(body(r)->element[0]->str, "confirmed");
        freeReplyObject(r);
        r = reclaim(2000, "gone", "7", "1");
        assert_string_equal(body(r)->element[0]->str, "lost");
        assert_int_equal(cache(r, C_IN_USE), 1);
        freeReplyObject(r);
        freeReplyObject(a);
}

/* Waits (for a condition: the pool's own clock passing its recovery window) until a redis-clock pool may
 * grant. */
static void wait_out_the_recovery_window(const char *canon) {
        for (int i = 0;; i++) {
                redisReply *t = call("tick", "n1", -1, 1, "n1", canon, "0", "0", "0", "-", "e1", "1", "", NULL);
                bool over = cache(t, C_RECOVERY) == 0;
                freeReplyObject(t);
                if (over)
                        return;
                assert_true(i < 100000);
                (void) nanosleep(&(struct timespec) { .tv_nsec = 1000 * 1000 }, NULL);
        }
}

/* Production tokens are max(counter + 1, Redis TIME µs): they pass a Redis that lost its data. */
static void test_redis_clock_tokens_follow_the_time(void **state) {
        const char *canon = "backend-node-ttl=100000\n" "lane.ci.priority=0\nlimit=2\n";
        struct timespec ts;

        wait_out_the_recovery_window(canon);
        redisReply *a = call("submit", "n1", -1, 1, "a", "ci", "1", "1", "0", "-1", "-1", "-", NULL);
        redisReply *b = call("submit", "n1", -1, 1, "b", "ci", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(field_s(body(a), D_VERDICT), "granted");
        assert_string_equal(field_s(body(b), D_VERDICT), "granted");
        clock_gettime(CLOCK_REALTIME, &ts);
        long long wall = (long long) ts.tv_sec * SEC + ts.tv_nsec / 1000;
        assert_true(field_i(body(a), D_TOKEN) > wall - 60 * SEC);
        assert_true(field_i(body(b), D_TOKEN) > field_i(body(a), D_TOKEN));
        freeReplyObject(a);
        freeReplyObject(b);
}

/* A redis-clock tick of node with its token floor ("-": none) and the reclaimed flag "1". */
static redisReply *tick_with_floor(const char *node, const char *canon, const char *floor) {
        redisReply *t = call("tick", node, -1, 1, node, canon, "0", "0", "0", floor, "e1", "1", "", NULL);
        assert_string_equal(status(t), "ok");
        return t;
}

/* Redis lost the pool (FLUSHALL, a restart without persistence) and its clock is behind the tokens the
 * nodes passed on (here: they are a day ahead of it). The pool made anew knows nobody, so its window runs
 * the full TTL whatever the nodes say ("reclaimed" ends nothing), every live node ticks within it with
 * its floor, and the first grant is above every floor (SPEC §11, "Tokens never go back"). A floor that is
 * not a decimal integer up to 2^53 is ignored. */
static void test_tokens_never_go_back_after_a_loss(void **state) {
        const char *canon = "backend-node-ttl=300000\n" "lane.ci.priority=0\nlimit=2\n";
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long long ahead = (long long) ts.tv_sec * SEC + ts.tv_nsec / 1000 + 86400 * SEC;
        char floor_1[32], floor_2[32];
        snprintf(floor_1, sizeof floor_1, "%lld", ahead + 1);
        snprintf(floor_2, sizeof floor_2, "%lld", ahead + 5);

        redisReply *t = tick_with_floor("n1", canon, floor_1);
        long long opened = t->element[R_NOW]->integer, until = cache(t, C_RECOVERY);
        assert_int_equal(until, opened + 300000);
        freeReplyObject(t);
        t = tick_with_floor("n2", canon, floor_2);
        assert_int_equal(cache(t, C_RECOVERY), until); /* nobody to wait for: not shortened */
        assert_int_equal(cache(t, C_COUNTER), ahead + 4);
        freeReplyObject(t);
        /* Not numbers to follow: a float, a sign, 2^53 + 2. */
        freeReplyObject(tick_with_floor("n2", canon, "1e300"));
        freeReplyObject(tick_with_floor("n2", canon, "-5"));
        t = tick_with_floor("n2", canon, "9007199254740994");
        assert_int_equal(cache(t, C_COUNTER), ahead + 4);
        freeReplyObject(t);

        wait_out_the_recovery_window(canon);
        redisReply *a = call("submit", "n1", -1, 1, "a", "ci", "1", "0", "0", "-1", "-1", "-", NULL);
        assert_string_equal(field_s(body(a), D_VERDICT), "granted");
        assert_true(a->element[R_NOW]->integer >= until);
        assert_int_equal(field_i(body(a), D_TOKEN), ahead + 5);
        freeReplyObject(a);
}

/* A Redis restart (a new run id) may have lost the last grants: no grant for one TTL. */
static void test_a_new_run_id_starts_a_recovery_window(void **state) {
        const char *canon = "backend-node-ttl=100000\n" "lane.ci.priority=0\nlimit=2\n";

        wait_out_the_recovery_window(canon);
        run_id = "run2";
        redisReply *r = call("submit", "n1", -1, 1, "x", "ci", "1", "0", "0", "-1", "-1", "-", NULL);
        assert_string_equal(field_s(body(r), D_REASON), "recovery");
        assert_true(cache(r, C_RECOVERY) >= r->element[R_NOW]->integer + 100000 - 1000);
        assert_string_equal(cache_s(r, C_RECOVERY_WHY), "restart");
        freeReplyObject(r);
}

/* A brokerd restarted (the same node id, the same Redis run id): its first tick registers it again with a
 * whole reconcile listing the lease it restored and says it has not reclaimed yet; its reclaim confirms
 * the lease. No recovery window opens at any step (nothing of the pool was lost), and another node is
 * granted at once meanwhile. */
static void test_a_node_restart_opens_no_recovery_window(void **state) {
        const char *canon = "backend-node-ttl=100000\n" "lane.ci.priority=0\nlimit=2\n";

        wait_out_the_recovery_window(canon);
        redisReply *a = call("submit", "n1", -1, 1, "a", "ci", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(field_s(body(a), D_VERDICT), "granted");
        char token[32];
        snprintf(token, sizeof token, "%lld", field_i(body(a), D_TOKEN));
        freeReplyObject(a);
        redisReply *t = call("tick", "n1", -1, 1, "n1", canon, "1", "0", "0", token, "e9", "0", "-", "+", "a", NULL);
        assert_string_equal(status(t), "ok");
        assert_int_equal(cache(t, C_RECOVERY), 0);
        assert_string_equal(cache_s(t, C_RECOVERY_WHY), "");
        freeReplyObject(t);
        redisReply *r = call("reclaim", "n1", -1, 1, "a", "ci", "1", token, "1000", "0", NULL);
        assert_string_equal(status(r), "ok");
        assert_string_equal(body(r)->element[0]->str, "confirmed");
        assert_int_equal(cache(r, C_RECOVERY), 0);
        freeReplyObject(r);
        freeReplyObject(tick_as("n2", -1, canon));
        redisReply *b = call("submit", "n2", -1, 1, "b", "ci", "1", "0", "0", "-1", "-1", "-", NULL);
        assert_string_equal(field_s(body(b), D_VERDICT), "granted");
        assert_int_equal(cache(b, C_RECOVERY), 0);
        freeReplyObject(b);
}

/* The run id with the replication id ("RUN/REPLID"): a bare run id of a brokerd from before is the same
 * server if its run id part is; another replication id is another data set (REPLICAOF by hand and back). */
static void test_a_new_replication_id_starts_a_recovery_window(void **state) {
        const char *canon = "backend-node-ttl=100000\n" "lane.ci.priority=0\nlimit=2\n";
        const char *same[] = { "run1/replA", "run1", "run1/replA" };

        wait_out_the_recovery_window(canon);
        for (size_t i = 0; i < 3; i++) {
                run_id = same[i];
                redisReply *r = call("submit", "n1", -1, 1, "x", "ci", "1", "0", "0", "-1", "-1", "-", NULL);
                assert_int_equal(cache(r, C_RECOVERY), 0);
                freeReplyObject(r);
                r = call("release", "n1", -1, 1, "0", "x", NULL); /* "gone" either way: no state kept */
                freeReplyObject(r);
        }
        run_id = "run1/replB";
        redisReply *r = call("submit", "n1", -1, 1, "y", "ci", "1", "0", "0", "-1", "-1", "-", NULL);
        assert_string_equal(field_s(body(r), D_REASON), "recovery");
        freeReplyObject(r);
}

/* A redis-clock tick of node with the reclaimed flag; returns the window's end after it (0: none). */
static long long tick_reclaimed(const char *node, const char *reclaimed) {
        redisReply *t = call("tick", node, -1, 1, node, CANON_ONE_LANE "limit=2\n", "0", "0", "0", "-", "e1",
                             reclaimed, "", NULL);
        assert_string_equal(status(t), "ok");
        long long until = cache(t, C_RECOVERY);
        freeReplyObject(t);
        return until;
}

static const char *impatient_verdict(const char *rid) {
        static char verdict[16];
        redisReply *r = call("submit", "n1", -1, 1, rid, "ci", "1", "0", "0", "-1", "-1", "-", NULL);
        snprintf(verdict, sizeof verdict, "%s", strcmp(field_s(body(r), D_VERDICT), "granted") == 0 ? "granted" :
                 field_s(body(r), D_REASON));
        freeReplyObject(r);
        return verdict;
}

static long long meta_number(const char *key, const char *field) {
        redisReply *m = redisCommand(redis, "HGET %s:%s %s", POOL, key, field);
        long long v = m->type == REDIS_REPLY_STRING ? atoll(m->str) : -1;
        freeReplyObject(m);
        return v;
}

/* When the window opened at `from` ends once every node it waited for has reclaimed: a second after it
 * opened, or at once if that second has passed (0: ended already). Waits, for a condition (the pool clock
 * passing that second), until it has ended. */
static void expect_window_ends_a_second_after(long long from, long long until) {
        /* 0: the second had passed already (a slow machine). */
        assert_true(until == from + SEC || (until == 0 && meta_number("clock", "last_now") >= from + SEC));
        for (int i = 0; until != 0; i++) {
                assert_true(i < 5000);
                (void) nanosleep(&(struct timespec) { .tv_nsec = 1000 * 1000 }, NULL);
                until = tick_reclaimed("n1", "1");
        }
}

/* A failover's window (a run id change) waits for the nodes registered when it opened, each saying that
 * it has its leases back; the last one ends it a second after it opened (the time for a node Redis does
 * not know to arrive), long before its TTL. A node that registers meanwhile with leases still to reclaim
 * (Redis lost its registration) joins the wait. */
static void test_a_run_id_window_ends_when_every_node_reclaimed(void **state) {
        const char *canon = CANON_ONE_LANE "limit=2\n"; /* TTL 30 s: the window cannot run out here */
        freeReplyObject(call("tick", "n1", -1, 1, "n1", canon, "0", "0", "0", "-", "e1", "1", "", NULL));
        freeReplyObject(call("tick", "n2", -1, 1, "n2", canon, "0", "0", "0", "-", "e1", "1", "", NULL));
        /* The new pool's own window is the full TTL (tested above): ended by hand here. */
        freeReplyObject(redisCommand(redis, "HSET %s:meta recovery_until 0", POOL));
        assert_string_equal(impatient_verdict("a"), "granted");

        run_id = "run2";
        long long opened = tick_reclaimed("n1", "0");
        long long from = meta_number("meta", "recovery_from");
        assert_true(opened > 0 && from > 0);
        assert_string_equal(impatient_verdict("b"), "recovery");
        assert_int_equal(tick_reclaimed("n1", "1"), opened); /* n2 has not said it yet */
        assert_int_equal(tick_reclaimed("n3", "0"), opened); /* a newcomer with leases to reclaim */
        assert_int_equal(tick_reclaimed("n2", "1"), opened);
        assert_string_equal(impatient_verdict("c"), "recovery");
        expect_window_ends_a_second_after(from, tick_reclaimed("n3", "1"));
        assert_string_equal(impatient_verdict("d"), "granted");
        /* A window of a new Redis run id again waits for all three. */
        run_id = "run3";
        opened = tick_reclaimed("n1", "1");
        from = meta_number("meta", "recovery_from");
        assert_true(opened > 0 && from > 0);
        assert_int_equal(tick_reclaimed("n2", "1"), opened);
        expect_window_ends_a_second_after(from, tick_reclaimed("n3", "1"));
}

/* The pool clock: a gap (no call for over 2 s: Redis unreachable for everyone) stops time but for one
 * second; a backward step of Redis's clock (here: a clock hash from the future) does not take it back:
 * it goes on from where it was, strictly increasing. Sleeping is the point here: the gap is what is tested, nothing waits for it to end. */
static void test_the_pool_clock_absorbs_gaps_and_backward_steps(void **state) {
        const char *canon = "backend-node-ttl=600000000\n" "lane.ci.priority=0\nlimit=2\n";
        redisReply *t = call("tick", "n1", -1, 1, "n1", canon, "0", "0", "0", "-", "e1", "1", "", NULL);
        long long t1 = t->element[R_NOW]->integer;
        freeReplyObject(t);
        (void) nanosleep(&(struct timespec) { .tv_sec = 2, .tv_nsec = 300 * 1000 * 1000 }, NULL);
        t = call("tick", "n1", -1, 1, "n1", "=", "0", "0", "0", "-", "e1", "1", "", NULL);
        long long t2 = t->element[R_NOW]->integer;
        freeReplyObject(t);
        assert_true(t2 - t1 >= SEC);
        assert_true(t2 - t1 < 2 * SEC);

        redisReply *c = redisCommand(redis, "HSET " POOL ":clock last_time %lld last_now %lld", t2 + 3600 * SEC,
                                     t2 + 3600 * SEC);
        freeReplyObject(c);
        t = call("tick", "n1", -1, 1, "n1", "=", "0", "0", "0", "-", "e1", "1", "", NULL);
        assert_int_equal(t->element[R_NOW]->integer, t2 + 3600 * SEC + 1);
        freeReplyObject(t);
        /* From there it runs on at Redis's rate: the skew took the step. */
        t = call("tick", "n1", -1, 1, "n1", "=", "0", "0", "0", "-", "e1", "1", "", NULL);
        assert_true(t->element[R_NOW]->integer > t2 + 3600 * SEC + 1);
        assert_true(t->element[R_NOW]->integer < t2 + 3600 * SEC + SEC);
        freeReplyObject(t);
}

#define CANON_A_B(prio_b) \
        "backend-node-ttl=30000000\nlane.a.priority=0\nlane.b.priority=" prio_b "\nlimit=1\n"

/* A reload adopted by every node applies as pool-local's configure_commit(): a re-prioritised lane's waiters go
 * ahead (positions follow), a removed lane's waiters are refused unavailable at the adoption's instant. */
static void test_adopted_rules_move_and_refuse_waiters(void **state) {
        tick_ok("n1", 1000, CANON_A_B("0"));
        redisReply *h = submit_at(1000, "h", "a", 1, true, -1);
        expect_verdict("a1", 1000, "a", 1, "queued");
        expect_verdict("b1", 1000, "b", 1, "queued");
        expect_verdict("a2", 1000, "a", 1, "queued");
        tick_ok("n1", 1000, "=");

        tick_ok("n1", 2000, CANON_A_B("10"));
        redisReply *p = call("positions", "n1", 2000, 0, "pos", "b1", "a1", "a2", NULL);
        assert_int_equal(body(p)->element[0]->element[1]->integer, 0);
        assert_int_equal(body(p)->element[1]->element[1]->integer, 1);
        assert_int_equal(body(p)->element[2]->element[1]->integer, 2);
        freeReplyObject(p);

        redisReply *t = tick_as("n1", 3000, "backend-node-ttl=30000000\nlane.b.priority=10\nlimit=1\n");
        assert_string_equal(status(t), "ok");
        assert_int_equal(n_events(t), 2);
        assert_string_equal(field_s(event(t, 0), D_RID), "a1");
        assert_string_equal(field_s(event(t, 0), D_REFUSAL), "unavailable");
        assert_int_equal(field_i(event(t, 0), D_AT), 3000);
        assert_string_equal(field_s(event(t, 1), D_RID), "a2");
        assert_int_equal(cache(t, C_WAITING), 1);
        freeReplyObject(t);
        /* The removed lane's holder finishes; its slot goes to b1. */
        freeReplyObject(release_at(4000, field_i(body(h), D_TOKEN), "h"));
        t = tick_as("n1", 4000, "=");
        assert_int_equal(n_events(t), 1);
        assert_string_equal(field_s(event(t, 0), D_RID), "b1");
        freeReplyObject(t);
        freeReplyObject(h);
}

/* Members reordered and one removed while held: held slots follow their member (pool-local's
 * layout_plan()), the removed one counts as held above the limit until released. */
static void test_adopted_members_lay_held_slots_out_again(void **state) {
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=3\nmembers=alpha,beta,gamma\n");
        redisReply *a = submit_at(1000, "a", "ci", 1, true, -1);
        redisReply *b = submit_at(1000, "b", "ci", 1, true, -1);
        assert_string_equal(body(b)->element[D_MEMBERS]->element[0]->str, "beta");
        tick_ok("n1", 1000, "=");

        tick_ok("n1", 2000, CANON_ONE_LANE "limit=2\nmembers=gamma,alpha\n");
        /* alpha at its new place 1, beta above the limit: both held, nothing free. */
        expect_verdict("c", 2000, "ci", 1, "queued");
        tick_ok("n1", 2000, "=");
        freeReplyObject(release_at(3000, field_i(body(b), D_TOKEN), "b"));
        redisReply *t = tick_as("n1", 3000, "=");
        assert_int_equal(n_events(t), 1);
        assert_string_equal(field_s(event(t, 0), D_RID), "c");
        assert_string_equal(event(t, 0)->element[D_MEMBERS]->element[0]->str, "gamma");
        assert_int_equal(event(t, 0)->element[D_SLOTS]->element[0]->integer, 0);
        assert_int_equal(cache(t, C_IN_USE), 2);
        freeReplyObject(t);
        /* alpha's holder releases at its new place: alpha is granted next. */
        expect_verdict("d", 3000, "ci", 1, "queued");
        tick_ok("n1", 3000, "=");
        freeReplyObject(release_at(4000, field_i(body(a), D_TOKEN), "a"));
        t = tick_as("n1", 4000, "=");
        assert_int_equal(n_events(t), 1);
        assert_string_equal(event(t, 0)->element[D_MEMBERS]->element[0]->str, "alpha");
        assert_int_equal(event(t, 0)->element[D_SLOTS]->element[0]->integer, 1);
        freeReplyObject(t);
        freeReplyObject(a);
        freeReplyObject(b);
}

/* SPEC §3.1: a pool idle for longer than Q is saturated: a newcomer's budget is the saturated one (Q/10,
 * at least 1 s), and running out of it is "shed", not "timeout". */
static void test_a_saturated_pool_sheds_at_the_saturated_budget(void **state) {
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\nqueue-timeout=20000000\n");
        expect_verdict("a", 1000, "ci", 1, "granted");
        tick_ok("n1", 25 * SEC, "=");
        redisReply *w = submit_at(25 * SEC, "w", "ci", 1, true, -1);
        assert_string_equal(field_s(body(w), D_STATE), "saturated");
        assert_int_equal(field_i(body(w), D_IDLE), 25 * SEC - 1000);
        assert_int_equal(field_i(body(w), D_BUDGET), 2 * SEC);
        freeReplyObject(w);
        /* A client cap below the saturated budget: its own timeout, not a shed. */
        redisReply *c = submit_at(25 * SEC, "c", "ci", 1, true, SEC);
        assert_int_equal(field_i(body(c), D_BUDGET), SEC);
        freeReplyObject(c);
        tick_ok("n1", 25 * SEC, "=");
        redisReply *t = tick_as("n1", 28 * SEC, "=");
        assert_int_equal(n_events(t), 2);
        assert_string_equal(field_s(event(t, 0), D_RID), "c");
        assert_string_equal(field_s(event(t, 0), D_REFUSAL), "timeout");
        assert_string_equal(field_s(event(t, 1), D_RID), "w");
        assert_string_equal(field_s(event(t, 1), D_REFUSAL), "shed");
        assert_int_equal(field_i(event(t, 1), D_AT), 27 * SEC);
        freeReplyObject(t);
}

static void test_max_queue_refuses_full_and_an_unknown_lane_is_invalid(void **state) {
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\nmax-queue=1\n");
        expect_verdict("a", 1000, "ci", 1, "granted");
        expect_verdict("w", 1000, "ci", 1, "queued");
        redisReply *f = submit_at(1000, "f", "ci", 1, true, -1);
        assert_string_equal(field_s(body(f), D_REFUSAL), "full");
        freeReplyObject(f);
        redisReply *r = call("submit", "n1", 1000, 0, "x", "nope", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(status(r), "invalid");
        freeReplyObject(r);
        r = call("submit", "n1", 1000, 0, "y", "ci", "2", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(status(r), "invalid");
        freeReplyObject(r);
}

static void test_an_unregistered_node_or_another_version_is_refused(void **state) {
        redisReply *r = call("submit", "n1", 1000, 0, "x", "ci", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(status(r), "unregistered");
        freeReplyObject(r);
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\n");
        r = call("submit", "n9", 1000, 0, "x", "ci", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(status(r), "unregistered");
        freeReplyObject(r);
        const char *cmd, *fn;
        callee("submit", &cmd, &fn);
        const char *argv[] = { cmd, fn, "1", POOL, "2", "n1", "1000", "run1", "0", "x", "ci", "1",
                               "1", "0", "-1", "-1", "-" };
        r = redisCommandArgv(redis, sizeof argv / sizeof argv[0], argv, NULL);
        assert_string_equal(r->element[R_STATUS]->str, "version");
        freeReplyObject(r);
}

/* Reconcile: the node's page lists what it has; a record Redis has in that range and the page lacks (a
 * waiter withdrawn, a lease released while a reply was lost) is dropped, and the fingerprint follows. */
static void test_reconcile_drops_what_the_node_no_longer_has(void **state) {
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\n");
        redisReply *a = submit_at(1000, "a", "ci", 1, true, -1);
        long long token = field_i(body(a), D_TOKEN);
        expect_verdict("w", 1000, "ci", 1, "queued");
        expect_verdict("x", 1000, "ci", 1, "queued");
        tick_ok("n1", 1000, "=");
        /* The page lists x only: w's record goes at once; the lease a, which the node cannot account for,
         * is neither freed nor handed on (SPEC §11, "a restart reconciles conservatively"). */
        redisReply *t = call("tick", "n1", 2000, 1, "n1", "=", "0", "0", "0", "-", "e1", "1", "-", "+", "x", NULL);
        assert_string_equal(status(t), "ok");
        assert_string_equal(body(t)->element[8]->str, "");
        assert_int_equal(cache(t, C_IN_USE), 1);
        assert_int_equal(cache(t, C_WAITING), 1);
        assert_int_equal(n_events(t), 0);
        /* It left the node's records: the node's fingerprint (x alone) is Redis's now. */
        const redisReply *fp = body(t)->element[5];
        assert_int_equal(fp->element[0]->integer, 1);
        assert_int_equal(fp->element[1]->integer, fnv1a32("xw"));
        /* It lapses one node TTL after the reconcile that missed it: then x gets the slot, at that instant. */
        assert_int_equal(cache(t, C_NEXT_WAKEUP), 2000 + 30 * SEC);
        freeReplyObject(t);
        t = tick_as("n1", 2000 + 30 * SEC - 1, "=");
        assert_int_equal(cache(t, C_IN_USE), 1);
        freeReplyObject(t);
        t = tick_as("n1", 2000 + 30 * SEC, "=");
        assert_int_equal(cache(t, C_IN_USE), 1);
        assert_int_equal(n_events(t), 1);
        assert_string_equal(field_s(event(t, 0), D_VERDICT), "granted");
        assert_string_equal(field_s(event(t, 0), D_RID), "x");
        assert_int_equal(field_i(event(t, 0), D_AT), 2000 + 30 * SEC);
        assert_true(field_i(event(t, 0), D_TOKEN) > token);
        freeReplyObject(t);
        freeReplyObject(a);
}

/* SPEC §3.4: a node that cannot account for its leases (its state directory unread, or damaged) reconciles
 * with "k": the lease its page misses stays its own, held while it lives, instead of an orphan that lapses a
 * TTL later while its holder may run. Accounting again ("1" without "k"), the same page makes it one. */
static void test_a_node_that_cannot_account_keeps_the_leases_its_page_misses(void **state) {
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\n");
        redisReply *a = submit_at(1000, "a", "ci", 1, true, -1);
        freeReplyObject(a);
        expect_verdict("w", 1000, "ci", 1, "queued");
        expect_verdict("x", 1000, "ci", 1, "queued");
        tick_ok("n1", 1000, "=");
        redisReply *t = call("tick", "n1", 2000, 1, "n1", "=", "0", "0", "0", "-", "e1", "1k", "-", "+", "x", NULL);
        assert_string_equal(status(t), "ok");
        assert_int_equal(cache(t, C_IN_USE), 1);
        assert_int_equal(cache(t, C_WAITING), 1); /* w's record went at once, as ever */
        /* Still the node's: counted in its fingerprint (a and x), not an orphan, no lapse to wake for. */
        const redisReply *fp = body(t)->element[5];
        assert_int_equal(fp->element[0]->integer, 2);
        assert_int_equal(fp->element[1]->integer, fnv1a32("al") ^ fnv1a32("xw"));
        /* And the page says what it kept, for the node to count as Redis does: a alone. */
        assert_int_equal(body(t)->elements, 10);
        const redisReply *kept = body(t)->element[9];
        assert_int_equal(kept->elements, 3);
        assert_int_equal(kept->element[0]->integer, 1);
        assert_int_equal(kept->element[1]->integer, fnv1a32("al"));
        assert_int_equal(kept->element[2]->integer, fnv1a32("al"));
        freeReplyObject(t);
        /* A page that keeps nothing says nothing of it. */
        t = call("tick", "n1", 2000, 1, "n1", "=", "0", "0", "0", "-", "e1", "1k", "-", "+", "a", "x", NULL);
        assert_int_equal(body(t)->elements, 9);
        freeReplyObject(t);
        redisReply *o = redisCommand(redis, "ZCARD " POOL ":orph");
        assert_int_equal(o->integer, 0);
        freeReplyObject(o);
        /* A TTL on, the node alive (its heartbeats): nothing lapsed, x still waits. */
        tick_ok("n1", 2000 + 16 * SEC, "=");
        t = tick_as("n1", 2000 + 31 * SEC, "=");
        assert_int_equal(cache(t, C_IN_USE), 1);
        assert_int_equal(n_events(t), 0);
        freeReplyObject(t);
        /* Accounting again: the page orphans a, which lapses one TTL after that, and x gets the slot. */
        t = call("tick", "n1", 2000 + 32 * SEC, 1, "n1", "=", "0", "0", "0", "-", "e1", "1", "-", "+", "x", NULL);
        assert_int_equal(cache(t, C_IN_USE), 1);
        assert_int_equal(cache(t, C_NEXT_WAKEUP), 2000 + 62 * SEC);
        freeReplyObject(t);
        t = tick_as("n1", 2000 + 62 * SEC, "=");
        assert_int_equal(n_events(t), 1);
        assert_string_equal(field_s(event(t, 0), D_VERDICT), "granted");
        assert_string_equal(field_s(event(t, 0), D_RID), "x");
        freeReplyObject(t);
}

static void test_an_orphan_released_by_its_node_is_freed_at_once(void **state) {
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\n");
        redisReply *a = submit_at(1000, "a", "ci", 1, true, -1);
        long long token = field_i(body(a), D_TOKEN);
        freeReplyObject(a);
        expect_verdict("x", 1000, "ci", 1, "queued");
        tick_ok("n1", 1000, "=");
        freeReplyObject(call("tick", "n1", 2000, 1, "n1", "=", "0", "0", "0", "-", "e1", "1", "-", "+", "x", NULL));
        /* The release that the page raced: the normal case, freed and handed on at once. */
        redisReply *r = release_at(3000, token, "a");
        assert_string_equal(body(r)->element[0]->str, "released");
        freeReplyObject(r);
        redisReply *t = tick_as("n1", 3000, "=");
        assert_int_equal(cache(t, C_IN_USE), 1);
        assert_int_equal(cache(t, C_WAITING), 0);
        assert_int_equal(n_events(t), 1);
        assert_string_equal(field_s(event(t, 0), D_RID), "x");
        freeReplyObject(t);
        redisReply *o = redisCommand(redis, "ZCARD " POOL ":orph");
        assert_int_equal(o->integer, 0);
        freeReplyObject(o);
}

/* ---- what is checked at connect is watched: keys lost between two calls ---- */

static bool granted_in(const redisReply *r) {
        if (strcmp(status(r), "ok") == 0 && body(r)->type == REDIS_REPLY_ARRAY && body(r)->elements > D_VERDICT &&
            body(r)->element[D_VERDICT]->type == REDIS_REPLY_STRING &&
            strcmp(field_s(body(r), D_VERDICT), "granted") == 0)
                return true;
        for (size_t i = 0; i < n_events(r); i++)
                if (event(r, i)->element[0]->type == REDIS_REPLY_STRING &&
                    strcmp(field_s(event(r, i), D_VERDICT), "granted") == 0)
                        return true;
        return false;
}

static bool has_notice(const redisReply *r, const char *kind, const char *what);

#define LOSS_CANON "backend-node-ttl=400000\n" "lane.ci.priority=0\nlimit=1\n"

/* A tick of n1 (redis clock) that must grant nothing; registers n1 again if Redis lost it. */
static void tick_granting_nothing(const char *reclaimed) {
        redisReply *t = call("tick", "n1", -1, 1, "n1", LOSS_CANON, "0", "0", "0", "-", "e1", reclaimed, "", NULL);
        assert_string_equal(status(t), "ok");
        assert_false(granted_in(t));
        freeReplyObject(t);
}

/* Every key of a pool but meta deleted by hand, one at a time, while a lease holds the only slot and a
 * waiter waits: no call grants the slot again while the lease is held. A loss the counts see opens a
 * recovery window in which the node reclaims its lease (same slot, same token); after it the slot is
 * still the lease's, and it is granted again once released.
 * One pool per key, all at once, step by step: their recovery windows (a second or more each, on the
 * Redis clock) then pass together, not one after another. */
#define LOSS_MAX 64

struct loss_case {
        char pool[32];
        char key[96];      /* the key of this pool deleted */
        char token[32];    /* lease a's */
        char epoch[64];    /* meta's epoch before the deletion */
        bool renewed;      /* the loss was seen: a recovery window opened */
};

/* Ticks every case's pool (n1 reclaimed) until none has a recovery window open. */
static void loss_cases_wait_out_windows(struct loss_case *c, size_t n) {
        for (int i = 0;; i++) {
                bool open = false;
                for (size_t k = 0; k < n; k++) {
                        pool = c[k].pool;
                        redisReply *t = call("tick", "n1", -1, 1, "n1", LOSS_CANON, "0", "0", "0", "-", "e1", "1",
                                             "", NULL);
                        assert_false(granted_in(t));
                        open |= cache(t, C_RECOVERY) != 0;
                        freeReplyObject(t);
                }
                if (!open)
                        return;
                assert_true(i < 100000);
                (void) nanosleep(&(struct timespec) { .tv_nsec = 1000 * 1000 }, NULL);
        }
}

/* One round over the cases: true if each ran through; false if n1 lapsed meanwhile (this process paused
 * past its 0.4 s TTL: its leases went, as a fenced node's would), which is not what the test is about. */
static bool loss_cases_run(struct loss_case *c, size_t n) {
        unsigned expired = n_expired;

        for (size_t k = 0; k < n; k++) {
                pool = c[k].pool;
                redisReply *r = redisCommand(redis, "DEL %s:meta", pool); /* a round again starts afresh */
                freeReplyObject(r);
                r = redisCommand(redis, "EVAL %s 0 %s", "for _, k in ipairs(redis.call('KEYS', ARGV[1] .. '*')) do "
                                 "redis.call('DEL', k) end", pool);
                freeReplyObject(r);
        }
        /* Each pool made anew waits for its nodes' word: a window of its own. */
        for (size_t k = 0; k < n; k++) {
                pool = c[k].pool;
                redisReply *t = call("tick", "n1", -1, 1, "n1", LOSS_CANON, "0", "0", "0", "-", "e1", "1", "", NULL);
                freeReplyObject(t);
        }
        loss_cases_wait_out_windows(c, n);

        for (size_t k = 0; k < n; k++) {
                pool = c[k].pool;
                redisReply *a = call("submit", "n1", -1, 1, "a", "ci", "1", "1", "0", "-1", "-1", "-", NULL);
                assert_string_equal(field_s(body(a), D_VERDICT), "granted");
                snprintf(c[k].token, sizeof c[k].token, "%lld", field_i(body(a), D_TOKEN));
                freeReplyObject(a);
                redisReply *w = call("submit", "n1", -1, 1, "w", "ci", "1", "1", "0", "-1", "-1", "-", NULL);
                assert_string_equal(field_s(body(w), D_VERDICT), "queued");
                freeReplyObject(w);
        }
        for (size_t k = 0; k < n; k++) {
                pool = c[k].pool;
                redisReply *e = redisCommand(redis, "DEL %s", c[k].key);
                assert_int_equal(e->integer, 1);
                freeReplyObject(e);
                redisReply *m = redisCommand(redis, "HGET %s:meta epoch", pool);
                snprintf(c[k].epoch, sizeof c[k].epoch, "%s", m->str);
                freeReplyObject(m);

                /* Whatever Redis has left: nothing is granted, neither to a new request nor to the waiter. */
                redisReply *x = call("submit", "n1", -1, 1, "x", "ci", "1", "0", "0", "-1", "-1", "-", NULL);
                assert_false(granted_in(x));
                freeReplyObject(x);
                tick_granting_nothing("0");
                m = redisCommand(redis, "HGET %s:meta epoch", pool);
                c[k].renewed = strcmp(m->str, c[k].epoch) != 0;
                freeReplyObject(m);
                if (c[k].renewed) {
                        /* The window says what opened it: the count that found the loss. */
                        m = redisCommand(redis, "HMGET %s:meta recovery_why lost recovery_from recovery_until", pool);
                        for (size_t i = 0; i < 4; i++)
                                assert_int_equal(m->element[i]->type, REDIS_REPLY_STRING);
                        char want[64];
                        snprintf(want, sizeof want, "lost:%s", m->element[1]->str);
                        assert_string_equal(m->element[0]->str, want);
                        /* One node TTL, the pool's own, even when its rules were what was lost (the caller's). */
                        long long from = atoll(m->element[2]->str), until = atoll(m->element[3]->str);
                        if (until - from != 400000)
                                fail_msg("%s deleted: a recovery window of %lld µs, not the TTL's 400000", c[k].key,
                                         until - from);
                        freeReplyObject(m);

                        /* The node reclaims its lease (it learns of the new epoch from the tick). */
                        redisReply *r = call("reclaim", "n1", -1, 1, "a", "ci", "1", c[k].token, "1000", "0", NULL);
                        bool confirmed = strcmp(status(r), "ok") == 0 &&
                                         strcmp(body(r)->element[0]->str, "confirmed") == 0;
                        if (!confirmed && n_expired != expired) {
                                freeReplyObject(r);
                                return false;
                        }
                        if (!confirmed)
                                fail_msg("%s: the reclaim of a is %s %s", c[k].key, status(r),
                                         strcmp(status(r), "ok") == 0 ? body(r)->element[0]->str : "");
                        freeReplyObject(r);
                }
        }
        loss_cases_wait_out_windows(c, n);

        for (size_t k = 0; k < n; k++) {
                pool = c[k].pool;
                redisReply *x = call("submit", "n1", -1, 1, "y", "ci", "1", "0", "0", "-1", "-1", "-", NULL);
                bool again = granted_in(x);
                freeReplyObject(x);
                if (again && n_expired != expired)
                        return false;
                if (again)
                        fail_msg("%s deleted: slot 0 granted again while a holds it", c[k].key);

                /* Released, it is granted again: to the waiter if Redis still has it, else to a new request. */
                redisReply *r = call("release", "n1", -1, 1, c[k].token, "a", NULL);
                if (!c[k].renewed && strcmp(c[k].key + strlen(c[k].key) - 4, ":sid") == 0) {
                        /* sid, which no count compares, is found lost here: it no longer says that a's slot is
                         * a's, so a's release frees nothing (its record dropped, "bad-key" "h": prelude.lua,
                         * lease_free()) and the next call makes the pool anew, granting nothing. */
                        assert_string_equal(body(r)->element[0]->str, "gone");
                        assert_true(has_notice(r, "bad-key", "h"));
                        freeReplyObject(r);
                        x = call("submit", "n1", -1, 1, "z", "ci", "1", "0", "0", "-1", "-1", "-", NULL);
                        assert_false(granted_in(x));
                        freeReplyObject(x);
                        redisReply *m = redisCommand(redis, "HGET %s:meta lost", pool);
                        assert_string_equal(m->str, "leases");
                        freeReplyObject(m);
                        continue;
                }
                assert_string_equal(body(r)->element[0]->str, "released");
                x = call("submit", "n1", -1, 1, "z", "ci", "1", "0", "0", "-1", "-1", "-", NULL);
                if (!granted_in(r) && !granted_in(x))
                        fail_msg("%s deleted: no grant after the release: %s %s %s", c[k].key, status(x),
                                 strcmp(status(x), "ok") == 0 ? field_s(body(x), D_VERDICT) : "",
                                 strcmp(status(x), "ok") == 0 ? field_s(body(x), D_REFUSAL) : "");
                freeReplyObject(r);
                freeReplyObject(x);
        }
        return true;
}

static void test_a_key_lost_never_grants_a_held_slot_twice(void **state) {
        static struct loss_case c[LOSS_MAX];
        size_t n = 0, n_renewed = 0;

        /* The keys of a pool with a lease and a waiter, meta aside. */
        wait_out_the_recovery_window(LOSS_CANON);
        redisReply *a = call("submit", "n1", -1, 1, "a", "ci", "1", "1", "0", "-1", "-1", "-", NULL);
        redisReply *w = call("submit", "n1", -1, 1, "w", "ci", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(field_s(body(a), D_VERDICT), "granted");
        assert_string_equal(field_s(body(w), D_VERDICT), "queued");
        freeReplyObject(a);
        freeReplyObject(w);
        redisReply *keys = redisCommand(redis, "KEYS %s*", POOL);
        for (size_t i = 0; i < keys->elements; i++) {
                const char *suffix = keys->element[i]->str + strlen(POOL);
                if (strcmp(suffix, ":meta") == 0)
                        continue;
                assert_true(n < LOSS_MAX);
                snprintf(c[n].pool, sizeof c[n].pool, "{sb:loss%zu}", n);
                snprintf(c[n].key, sizeof c[n].key, "{sb:loss%zu}%s", n, suffix);
                n++;
        }
        freeReplyObject(keys);
        assert_true(n >= 15);

        bool ran = false;
        for (int round = 0; !ran && round < 5; round++)
                ran = loss_cases_run(c, n);
        assert_true(ran);
        for (size_t k = 0; k < n; k++)
                n_renewed += c[k].renewed;
        pool = POOL;
        printf("# %zu keys deleted, one a pool, %zu of them seen lost (a recovery window)\n", n, n_renewed);
        assert_true(n_renewed >= 8);
}

/* ---- one node, one identity ---- */

#define ID_A "n1/aaaaaaaaaaaaaaaa/"
#define ID_B "n1/bbbbbbbbbbbbbbbb/"
#define ID_A2 "n1/cccccccccccccccc/aaaaaaaaaaaaaaaa"         /* a restart of A */
#define ID_A3 "n1/dddddddddddddddd/eeeeeeeeeeeeeeee,cccccccccccccccc" /* A2's, after a start that never ticked */

static void test_a_second_live_incarnation_is_refused_before_anything(void **state) {
        tick_ok(ID_A, 1000, CANON_ONE_LANE "limit=1\n");
        redisReply *a = call("submit", ID_A, 1000, 0, "a", "ci", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(field_s(body(a), D_VERDICT), "granted");
        freeReplyObject(a);
        tick_ok(ID_A, 1000, "=");

        /* A clone's first heartbeat with an empty reconcile page: refused, nothing reconciled. */
        redisReply *t = call("tick", ID_B, 2000, 1, "n1", CANON_ONE_LANE "limit=1\n", "0", "0", "0", "-", "e1", "1",
                             "-", "+", NULL);
        assert_string_equal(status(t), "identity");
        assert_int_equal(t->element[R_CACHE]->elements, 0);
        freeReplyObject(t);
        const char *ops[][3] = { { "submit", "b", "ci" }, { "withdraw", "a", NULL }, { "drain", "", "1" } };
        for (size_t i = 0; i < 3; i++) {
                redisReply *r = strcmp(ops[i][0], "submit") == 0
                                        ? call("submit", ID_B, 2000, 0, "b", "ci", "1", "1", "0", "-1", "-1", "-", NULL)
                                        : call(ops[i][0], ID_B, 2000, 0, ops[i][1], ops[i][2], NULL);
                assert_string_equal(status(r), "identity");
                freeReplyObject(r);
        }
        redisReply *r = call("release", ID_B, 2000, 0, "1", "a", NULL);
        assert_string_equal(status(r), "identity");
        freeReplyObject(r);
        r = call("reclaim", ID_B, 2000, 0, "a", "ci", "1", "1", "1000", "0", NULL);
        assert_string_equal(status(r), "identity");
        freeReplyObject(r);

        /* A's lease is untouched, and A goes on. */
        t = tick_as(ID_A, 3000, "=");
        assert_string_equal(status(t), "ok");
        assert_int_equal(cache(t, C_IN_USE), 1);
        assert_int_equal(body(t)->element[5]->element[0]->integer, 1);
        freeReplyObject(t);

        /* A restart of A (its incarnation among the caller's previous ones) is the node: it takes over, and
         * the one it succeeded is refused from then on. */
        t = tick_as(ID_A2, 4000, "=");
        assert_string_equal(status(t), "ok");
        assert_int_equal(cache(t, C_IN_USE), 1);
        freeReplyObject(t);
        t = tick_as(ID_A, 5000, "=");
        assert_string_equal(status(t), "identity");
        freeReplyObject(t);
        /* A start that died before its first tick is skipped by the next one's list. */
        t = tick_as(ID_A3, 6000, "=");
        assert_string_equal(status(t), "ok");
        freeReplyObject(t);

        /* B is refused as long as the registration heartbeats; once it lapsed (and was reaped with its
         * lease, whose holder fenced itself by then), B may be the node. */
        t = tick_as(ID_B, 6000 + 30 * SEC - 1, "=");
        assert_string_equal(status(t), "identity");
        freeReplyObject(t);
        t = call("tick", ID_B, 6000 + 30 * SEC, 1, "n1", CANON_ONE_LANE "limit=1\n", "0", "0", "0", "-", "e1", "1", "",
                 "", NULL);
        assert_string_equal(status(t), "ok");
        assert_int_equal(cache(t, C_IN_USE), 0);
        assert_int_equal(t->element[R_NOTICES]->elements, 1);
        freeReplyObject(t);
        t = tick_as(ID_A3, 6000 + 30 * SEC + 1, "=");
        assert_string_equal(status(t), "identity");
        freeReplyObject(t);
}

/* ---- liveness per node (brokerd/lua/README, "Liveness per node") ----
 *
 * The redis clock mode with a TTL of 2 s: time passes for real (sleeps let it pass; nothing waits for a
 * condition). */

#define LIVE_TTL "2000000"
#define CANON_LIVE "backend-node-ttl=2000000\nlane.ci.max-in-use=-1\nlane.ci.priority=0\nlane.ci.reserve=0\nlimit=2\n"
#define LIVE_N1 "n1/aaaaaaaaaaaaaaaa/"
#define LIVE_N2 "n2/bbbbbbbbbbbbbbbb/"

static void msleep(long ms) {
        (void) nanosleep(&(struct timespec) { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000 * 1000 }, NULL);
}

static redisReply *live_tick(const char *node, const char *name, const char *canon) {
        return call("tick", node, -1, 1, name, canon, "0", "0", "0", "-", "e1", "1", "", NULL);
}

/* A renewal of `node` ("ID/INCARNATION/…") under `key`, naming one or two pools. */
static redisReply *live_renew(const char *node, const char *key, const char *p1, const char *p2) {
        const char *saved = pool;
        pool = key;
        redisReply *r = p2 ? call("renew", node, -1, 1, LIVE_TTL, p1, p2, NULL)
                           : call("renew", node, -1, 1, LIVE_TTL, p1, NULL);
        pool = saved;
        return r;
}

static void live_renew_ok(const char *node, const char *key, long long covered) {
        redisReply *r = live_renew(node, key, POOL, NULL);
        assert_string_equal(status(r), "ok");
        assert_int_equal(body(r)->elements, 1);
        assert_int_equal(body(r)->element[0]->integer, covered);
        freeReplyObject(r);
}

/* Two nodes registered, each holding one slot, once the new pool's recovery window (one TTL) passed. */
static void live_setup(void) {
        redisReply *r = live_tick(LIVE_N1, "n1", CANON_LIVE);
        assert_string_equal(status(r), "ok");
        freeReplyObject(r);
        r = live_tick(LIVE_N2, "n2", CANON_LIVE);
        assert_string_equal(status(r), "ok");
        freeReplyObject(r);
        /* The renewals keep the backend clock going (a gap of 2 s with no call would stand still). */
        for (int i = 0; i < 5; i++) {
                msleep(450);
                live_renew_ok(LIVE_N1, "sb:live:n1", 1);
                live_renew_ok(LIVE_N2, "sb:live:n2", 1);
        }
        const char *nodes[2][2] = { { LIVE_N1, "n1" }, { LIVE_N2, "n2" } };
        for (size_t i = 0; i < 2; i++) {
                r = live_tick(nodes[i][0], nodes[i][1], "=");
                assert_string_equal(status(r), "ok");
                freeReplyObject(r);
                r = call("submit", nodes[i][0], -1, 1, nodes[i][1], "ci", "1", "0", "0", "-1", "-1", "-", NULL);
                assert_string_equal(status(r), "ok");
                assert_string_equal(field_s(body(r), D_VERDICT), "granted");
                freeReplyObject(r);
        }
}

static size_t expired_in(const redisReply *r, const char *node) {
        size_t n = 0;
        for (size_t i = 0; i < r->element[R_NOTICES]->elements; i++)
                if (strcmp(r->element[R_NOTICES]->element[i]->element[1]->str, node) == 0)
                        n++;
        return n;
}

/* A node that renews stays registered for several TTLs without a call of the pool; once it stops, its
 * registration (and its lease) lapses one TTL after its last renewal, not sooner, and not later than the
 * first call after that. */
static void test_a_renewing_node_is_kept_and_a_silent_one_lapses_at_its_ttl(void **state) {
        live_setup();
        for (int i = 0; i < 12; i++) { /* 6 s: three TTLs */
                live_renew_ok(LIVE_N1, "sb:live:n1", 1);
                live_renew_ok(LIVE_N2, "sb:live:n2", 1);
                msleep(500);
        }
        redisReply *t = live_tick(LIVE_N1, "n1", "=");
        assert_string_equal(status(t), "ok");
        assert_int_equal(cache(t, C_IN_USE), 2);
        assert_int_equal(t->element[R_NOTICES]->elements, 0);
        /* Live nodes: both. */
        assert_int_equal(body(t)->element[7]->integer, 2);
        /* n2's registration is covered: +inf in nodes, which a reader of a version before the live keys
         * (ZRANGEBYSCORE nodes -inf t) never reaps; its deadline is in lv. */
        redisReply *z = redisCommand(redis, "ZSCORE " POOL ":nodes n2");
        assert_string_equal(z->str, "inf");
        freeReplyObject(z);
        /* The registrations covered were re-scored ahead: no next_wakeup within half a TTL. */
        assert_true(cache(t, C_NEXT_WAKEUP) < 0 || cache(t, C_NEXT_WAKEUP) > t->element[R_NOW]->integer + 1000000);
        freeReplyObject(t);

        /* n2 goes silent; n1 renews on. */
        for (int i = 0; i < 3; i++) {
                live_renew_ok(LIVE_N1, "sb:live:n1", 1);
                msleep(400);
        }
        t = live_tick(LIVE_N1, "n1", "=");   /* 1.2 s after n2's last renewal */
        assert_int_equal(cache(t, C_IN_USE), 2);
        assert_int_equal(expired_in(t, "n2"), 0);
        freeReplyObject(t);
        for (int i = 0; i < 3; i++) {
                live_renew_ok(LIVE_N1, "sb:live:n1", 1);
                msleep(400);
        }
        t = live_tick(LIVE_N1, "n1", "=");   /* 2.4 s after */
        assert_int_equal(expired_in(t, "n2"), 1);
        assert_int_equal(cache(t, C_IN_USE), 1);
        assert_int_equal(t->element[R_NOTICES]->element[0]->element[3]->integer, 1);
        freeReplyObject(t);
        /* A lapsed registration is not covered again by a renewal: its node ticks (and registers anew). */
        live_renew_ok(LIVE_N2, "sb:live:n2", 0);
}

/* An idle pool's clock runs at Redis's rate while renewals reach Redis (the backend clock): a pool called
 * once in 3 s is not taken for one that no node reached (whose time would stand still but for 1 s). */
static void test_an_idle_pools_clock_runs_while_its_nodes_renew(void **state) {
        redisReply *t = live_tick(LIVE_N1, "n1", CANON_LIVE);
        long long t1 = t->element[R_NOW]->integer;
        freeReplyObject(t);
        for (int i = 0; i < 6; i++) {
                msleep(500);
                live_renew_ok(LIVE_N1, "sb:live:n1", i < 3 ? 1 : 1);
        }
        t = live_tick(LIVE_N1, "n1", "=");
        long long t2 = t->element[R_NOW]->integer;
        freeReplyObject(t);
        assert_true(t2 - t1 >= 2900000);
        /* Without the backend clock (deleted by hand), the pool's own rule again: a gap stands still. */
        freeReplyObject(redisCommand(redis, "DEL sb:clock"));
        msleep(2500);
        t = live_tick(LIVE_N1, "n1", "=");
        long long t3 = t->element[R_NOW]->integer;
        freeReplyObject(t);
        assert_true(t3 - t2 >= SEC);
        assert_true(t3 - t2 < 2 * SEC);
}

/* A clone (another incarnation, not a successor) renewing under a live node id is refused and changes
 * nothing; a successor takes the key over, and covers the pool once its tick registered it. */
static void test_a_clones_renewal_is_refused_and_reaps_nothing(void **state) {
        live_setup();
        live_renew_ok(LIVE_N1, "sb:live:n1", 1);
        redisReply *before = redisCommand(redis, "HGETALL sb:live:n1");
        redisReply *r = live_renew("n1/bbbbbbbbbbbbbbbb/", "sb:live:n1", POOL, NULL);
        assert_string_equal(status(r), "identity");
        freeReplyObject(r);
        redisReply *after = redisCommand(redis, "HGETALL sb:live:n1");
        assert_int_equal(before->elements, after->elements);
        for (size_t i = 0; i < before->elements; i++)
                assert_string_equal(before->element[i]->str, after->element[i]->str);
        freeReplyObject(before);
        freeReplyObject(after);
        /* Its key, its pool: refused "invalid" under another node's key. */
        r = live_renew("n9/bbbbbbbbbbbbbbbb/", "sb:live:n1", POOL, NULL);
        assert_string_equal(status(r), "invalid");
        freeReplyObject(r);
        /* n1's registration and lease are untouched, over more than a TTL of renewals. */
        for (int i = 0; i < 6; i++) {
                live_renew_ok(LIVE_N1, "sb:live:n1", 1);
                live_renew_ok(LIVE_N2, "sb:live:n2", 1);
                r = live_renew("n1/bbbbbbbbbbbbbbbb/", "sb:live:n1", POOL, NULL);
                assert_string_equal(status(r), "identity");
                freeReplyObject(r);
                msleep(500);
        }
        redisReply *t = live_tick(LIVE_N2, "n2", "=");
        assert_int_equal(cache(t, C_IN_USE), 2);
        assert_int_equal(t->element[R_NOTICES]->elements, 0);
        freeReplyObject(t);
        /* A successor (A among its previous incarnations) takes the key; the pool still names A until the
         * successor's tick: not covered. */
        live_renew_ok("n1/cccccccccccccccc/aaaaaaaaaaaaaaaa", "sb:live:n1", 0);
        t = live_tick("n1/cccccccccccccccc/aaaaaaaaaaaaaaaa", "n1", "=");
        assert_string_equal(status(t), "ok");
        freeReplyObject(t);
        live_renew_ok("n1/cccccccccccccccc/aaaaaaaaaaaaaaaa", "sb:live:n1", 1);
        /* And A, succeeded, is refused. */
        r = live_renew(LIVE_N1, "sb:live:n1", POOL, NULL);
        assert_string_equal(status(r), "identity");
        freeReplyObject(r);
}

/* Live keys are anyone's to write: of another type, garbage, huge, from the future. No call fails; garbage
 * covers nothing (the registration lapses at its score, its lease with it); an `at` ahead of the clock
 * counts as "renewed now", never more. */
static void test_bad_live_keys_cover_nothing_and_break_nothing(void **state) {
        live_setup();
        /* n2's key: a string. */
        freeReplyObject(redisCommand(redis, "SET sb:live:n2 garbage"));
        live_renew_ok(LIVE_N1, "sb:live:n1", 1);
        redisReply *t = live_tick(LIVE_N1, "n1", "=");
        assert_string_equal(status(t), "ok");
        freeReplyObject(t);
        /* Its renewal replaces it. */
        live_renew_ok(LIVE_N2, "sb:live:n2", 1);
        redisReply *k = redisCommand(redis, "HGET sb:live:n2 inc");
        assert_string_equal(k->str, "bbbbbbbbbbbbbbbb");
        freeReplyObject(k);

        /* Garbage fields under n2's incarnation: covers nothing. */
        char huge[70000];
        memset(huge, 'x', sizeof huge - 1);
        huge[sizeof huge - 1] = '\0';
        memcpy(huge, ",{sb:p},", 8);
        freeReplyObject(redisCommand(redis, "HSET sb:live:n2 at inf"));
        for (int i = 0; i < 6; i++) {
                live_renew_ok(LIVE_N1, "sb:live:n1", 1);
                if (i == 2)
                        freeReplyObject(redisCommand(redis, "HSET sb:live:n2 at 1e300 pools %s", huge));
                msleep(500);
        }
        t = live_tick(LIVE_N1, "n1", "=");
        assert_string_equal(status(t), "ok");
        assert_int_equal(expired_in(t, "n2"), 1);
        assert_int_equal(cache(t, C_IN_USE), 1);
        freeReplyObject(t);

        /* An `at` far ahead, under the registered incarnation: as if renewed now, no more. */
        t = live_tick(LIVE_N2, "n2", CANON_LIVE);
        freeReplyObject(t);
        live_renew_ok(LIVE_N2, "sb:live:n2", 1);
        freeReplyObject(redisCommand(redis, "HSET sb:live:n2 at 99999999999999999 cid x"));
        freeReplyObject(redisCommand(redis, "ZADD " POOL ":lv 0 n2")); /* lapsed: re-scored from the key */
        t = live_tick(LIVE_N1, "n1", "=");
        assert_string_equal(status(t), "ok");
        assert_int_equal(expired_in(t, "n2"), 0);
        freeReplyObject(t);
        redisReply *score = redisCommand(redis, "ZSCORE " POOL ":lv n2");
        redisReply *now = redisCommand(redis, "HGET " POOL ":clock last_now");
        assert_true(strtoll(score->str, NULL, 10) <= strtoll(now->str, NULL, 10) + 2 * SEC);
        freeReplyObject(score);
        freeReplyObject(now);

        /* A renewal with garbage: refused "invalid", or the pool not covered. */
        redisReply *r = live_renew(LIVE_N1, "sb:live:n1", "{sb:nosuchpool}", "not-a-prefix");
        assert_string_equal(status(r), "ok");
        assert_int_equal(body(r)->element[0]->integer, 0);
        assert_int_equal(body(r)->element[1]->integer, 0);
        freeReplyObject(r);
        const char *saved = pool;
        pool = "sb:live:n1";
        r = call("renew", LIVE_N1, -1, 1, "inf", POOL, NULL);
        assert_string_equal(status(r), "invalid");
        freeReplyObject(r);
        r = call("renew", "n1", -1, 1, LIVE_TTL, POOL, NULL); /* no incarnation */
        assert_string_equal(status(r), "invalid");
        freeReplyObject(r);
        r = call("renew", LIVE_N1, 5, 1, LIVE_TTL, POOL, NULL);
        assert_string_equal(status(r), "manual-clock");
        freeReplyObject(r);
        pool = saved;
}

/* Redis lost the live keys and the backend clock (a restart without them): registrations are their
 * scores again, and lapse at them; the pool's time stands still over the gap, as before. */
static void test_live_keys_lost_fall_back_to_the_registrations(void **state) {
        live_setup();
        for (int i = 0; i < 6; i++) {
                live_renew_ok(LIVE_N1, "sb:live:n1", 1);
                live_renew_ok(LIVE_N2, "sb:live:n2", 1);
                msleep(500);
        }
        freeReplyObject(redisCommand(redis, "DEL sb:live:n1 sb:live:n2 sb:clock"));
        redisReply *t = live_tick(LIVE_N1, "n1", "=");
        assert_string_equal(status(t), "ok");
        /* n2's score was re-scored from its key by the last calls: still ahead. */
        assert_int_equal(cache(t, C_IN_USE), 2);
        freeReplyObject(t);
        for (int i = 0; i < 6; i++) {
                t = live_tick(LIVE_N1, "n1", "=");
                freeReplyObject(t);
                msleep(500);
        }
        t = live_tick(LIVE_N1, "n1", "=");
        assert_int_equal(cache(t, C_IN_USE), 1);
        freeReplyObject(t);
        redisReply *z = redisCommand(redis, "ZSCORE " POOL ":nodes n2");
        assert_int_equal(z->type, REDIS_REPLY_NIL);
        freeReplyObject(z);
}

/* A user whose ACL reaches the pools' keys only (~{sb:*, brokerd.conf(5)'s example before the live keys):
 * the pools work as before (their own clock rule, no coverage), a renewal is an error. */
static void test_an_acl_of_the_pools_keys_only_keeps_the_pools_working(void **state) {
        freeReplyObject(redisCommand(redis, "ACL SETUSER narrow on nopass ~{sb:* resetchannels +@all"));
        redisContext *saved = redis;
        redis = redisConnectUnix(server.socket_path);
        assert_non_null(redis);
        redisReply *a = redisCommand(redis, "AUTH narrow x");
        assert_int_equal(a->type, REDIS_REPLY_STATUS);
        freeReplyObject(a);
        redisReply *t = live_tick(LIVE_N1, "n1", CANON_LIVE);
        assert_string_equal(status(t), "ok");
        freeReplyObject(t);
        msleep(300);
        t = live_tick(LIVE_N1, "n1", "=");
        assert_string_equal(status(t), "ok");
        freeReplyObject(t);
        a = redisCommand(redis, "FCALL %s 1 sb:live:n1 1 %s - run1 1 " LIVE_TTL " " POOL, shared_function_renew, LIVE_N1);
        assert_int_equal(a->type, REDIS_REPLY_ERROR);
        freeReplyObject(a);
        redisFree(redis);
        redis = saved;
        freeReplyObject(redisCommand(redis, "ACL DELUSER narrow"));
}

/* INFO commandstats' calls of `cmd` (the commands a script runs count there too). */
static long long cmd_calls(const char *cmd) {
        redisReply *r = redisCommand(redis, "INFO commandstats");
        char needle[64];
        snprintf(needle, sizeof needle, "cmdstat_%s:calls=", cmd);
        const char *p = strstr(r->str, needle);
        long long n = p ? strtoll(p + strlen(needle), NULL, 10) : 0;
        freeReplyObject(r);
        return n;
}

/* While both nodes renew, an idle pool has nothing to wake for: the other node's covered deadline is not
 * in next_wakeup (before: the earliest lv score, half a TTL to a TTL ahead, so every node ticked every
 * pool that often). And a renewal covered a renewal ago reads two keys a pool (the score, meta's
 * recovery_until): no node hash, no rules, no lv. */
static void test_an_idle_pool_has_no_wakeup_and_a_renewal_reads_two_keys_a_pool(void **state) {
        live_setup();
        for (int i = 0; i < 3; i++) {
                live_renew_ok(LIVE_N1, "sb:live:n1", 1);
                live_renew_ok(LIVE_N2, "sb:live:n2", 1);
                msleep(300);
        }
        redisReply *t = live_tick(LIVE_N1, "n1", "=");
        assert_string_equal(status(t), "ok");
        assert_int_equal(cache(t, C_NEXT_WAKEUP), -1);
        freeReplyObject(t);

        freeReplyObject(redisCommand(redis, "CONFIG RESETSTAT"));
        live_renew_ok(LIVE_N1, "sb:live:n1", 1);
        assert_int_equal(cmd_calls("zscore"), 1);
        assert_int_equal(cmd_calls("hget"), 1);
        assert_int_equal(cmd_calls("hmget"), 2); /* sb:clock, the node's own key */
        /* Its live key and its deadline among the live keys. */
        redisReply *z = redisCommand(redis, "ZSCORE sb:lives n1");
        assert_int_equal(z->type, REDIS_REPLY_STRING);
        freeReplyObject(z);
}

/* A renewal's full read (no previous key of the node's, or every FULL_PERIOD) answers the fingerprint of each
 * pool it covers (reply [5]: place, n, x, s), as the node's tick has it; one that reads only the score answers
 * none; a field that is not a number is -1. */
static void test_a_renewals_full_read_answers_the_nodes_fingerprint(void **state) {
        live_setup(); /* n1 holds a lease */
        redisReply *t = live_tick(LIVE_N1, "n1", "=");
        assert_string_equal(status(t), "ok");
        const redisReply *fp = body(t)->element[5];
        assert_int_equal(fp->element[0]->integer, 1);
        long long x = fp->element[1]->integer, sum = fp->element[2]->integer;
        freeReplyObject(t);

        /* Its key as the last renewal left it: the score alone is read. */
        redisReply *r = live_renew(LIVE_N1, "sb:live:n1", POOL, NULL);
        assert_string_equal(status(r), "ok");
        assert_int_equal(body(r)->element[0]->integer, 1);
        assert_int_equal(r->element[R_CACHE]->elements, 0);
        freeReplyObject(r);

        /* No key: read in full. */
        freeReplyObject(redisCommand(redis, "DEL sb:live:n1"));
        r = live_renew(LIVE_N1, "sb:live:n1", POOL, NULL);
        assert_string_equal(status(r), "ok");
        assert_int_equal(body(r)->element[0]->integer, 1);
        const redisReply *f = r->element[R_CACHE];
        assert_int_equal(f->elements, 4);
        assert_int_equal(f->element[0]->integer, 1); /* the first pool named */
        assert_int_equal(f->element[1]->integer, 1);
        assert_int_equal(f->element[2]->integer, x);
        assert_int_equal(f->element[3]->integer, sum);
        freeReplyObject(r);

        /* Someone's garbage in it: -1, which no node's count is. */
        freeReplyObject(redisCommand(redis, "HSET " POOL ":node:n1 fp_x garbage"));
        freeReplyObject(redisCommand(redis, "DEL sb:live:n1"));
        r = live_renew(LIVE_N1, "sb:live:n1", POOL, NULL);
        assert_string_equal(status(r), "ok");
        f = r->element[R_CACHE];
        assert_int_equal(f->elements, 4);
        assert_int_equal(f->element[2]->integer, -1);
        freeReplyObject(r);
}

/* Ticks of the pools named by the renewal: none while every node renews; once one stops, the first
 * renewal after its deadline (and only that one) names its pool, whose tick reaps it, though no node has
 * anything waiting there; n2's key says a longer TTL elsewhere: claimed again then, not removed. */
static void test_a_silent_nodes_pools_are_ticked_by_one_renewal_after_its_ttl(void **state) {
        live_setup();
        redisReply *r;
        struct timespec t0;
        for (int i = 0; i < 4; i++) {
                msleep(400);
                r = live_renew(LIVE_N1, "sb:live:n1", POOL, NULL);
                assert_int_equal(r->element[R_EVENTS]->elements, 0);
                freeReplyObject(r);
                live_renew_ok(LIVE_N2, "sb:live:n2", 1);
                clock_gettime(CLOCK_MONOTONIC, &t0);
        }
        /* n2 goes silent; n1 renews on, every 250 ms: exactly one of its renewals names the pool, no sooner
         * than n2's TTL after its last renewal. */
        int named = 0;
        long long named_ms = 0;
        for (int i = 0; i < 16; i++) {
                r = live_renew(LIVE_N1, "sb:live:n1", POOL, NULL);
                assert_string_equal(status(r), "ok");
                if (r->element[R_EVENTS]->elements > 0) {
                        struct timespec t1;
                        clock_gettime(CLOCK_MONOTONIC, &t1);
                        named_ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
                        assert_int_equal(r->element[R_EVENTS]->elements, 1);
                        assert_int_equal(r->element[R_EVENTS]->element[0]->integer, 1);
                        named++;
                }
                freeReplyObject(r);
                msleep(250);
        }
        printf("# the pool named %lld ms after n2's last renewal (TTL 2000 ms)\n", named_ms);
        assert_int_equal(named, 1);
        assert_true(named_ms >= 1900);
        redisReply *t = live_tick(LIVE_N1, "n1", "=");
        assert_int_equal(expired_in(t, "n2"), 1);
        assert_int_equal(cache(t, C_IN_USE), 1);
        freeReplyObject(t);
        redisReply *z = redisCommand(redis, "ZSCORE sb:lives n2");
        assert_int_equal(z->type, REDIS_REPLY_NIL);
        freeReplyObject(z);

        /* A key whose TTL is longer than its shortest pool's: claimed at the shortest, again at the longest. */
        redisReply *last = redisCommand(redis, "HGET sb:clock last_now");
        freeReplyObject(redisCommand(redis, "HSET sb:live:n2 ttl 4000000 mttl 2000000 at %lld",
                                     strtoll(last->str, NULL, 10) - 2500000));
        freeReplyObject(last);
        freeReplyObject(redisCommand(redis, "ZADD sb:lives 0 n2"));
        r = live_renew(LIVE_N1, "sb:live:n1", POOL, NULL);
        assert_int_equal(r->element[R_EVENTS]->elements, 1);
        freeReplyObject(r);
        z = redisCommand(redis, "ZSCORE sb:lives n2");
        assert_int_equal(z->type, REDIS_REPLY_STRING);
        freeReplyObject(z);
}

/* A covered node that is idle must still learn of a recovery window within it (keys lost: its lease is to
 * be reclaimed before anyone else is granted the slot): its renewal names the pool to tick while the window
 * is open. */
static void test_a_renewal_names_a_pool_whose_recovery_window_is_open(void **state) {
        live_setup();
        redisReply *r = live_renew(LIVE_N1, "sb:live:n1", POOL, NULL);
        assert_int_equal(r->element[R_EVENTS]->elements, 0);
        freeReplyObject(r);
        freeReplyObject(redisCommand(redis, "DEL " POOL ":busy"));
        redisReply *t = live_tick(LIVE_N2, "n2", "=");   /* n2's call finds the loss: a window opens */
        assert_true(cache(t, C_RECOVERY) > 0);
        freeReplyObject(t);
        r = live_renew(LIVE_N1, "sb:live:n1", POOL, NULL);
        assert_string_equal(status(r), "ok");
        assert_int_equal(body(r)->element[0]->integer, 1);
        assert_int_equal(r->element[R_EVENTS]->elements, 1);
        assert_int_equal(r->element[R_EVENTS]->element[0]->integer, 1);
        freeReplyObject(r);
}

/* A covered registration deleted by hand (anything in Redis may be written by someone else): the next renewal
 * does not cover the pool, so the node ticks it; the pool's next call (here another node's) finds the loss
 * and makes the pool anew under a recovery window, which grants nothing. */
static void test_a_renewal_finds_a_covered_registration_lost(void **state) {
        live_setup();
        live_renew_ok(LIVE_N1, "sb:live:n1", 1);
        freeReplyObject(redisCommand(redis, "DEL " POOL ":nodes"));
        live_renew_ok(LIVE_N1, "sb:live:n1", 0);
        redisReply *t = live_tick(LIVE_N2, "n2", "=");
        assert_true(cache(t, C_RECOVERY) > 0);
        freeReplyObject(t);
        redisReply *a = call("submit", LIVE_N2, -1, 1, "n2", "ci", "1", "0", "0", "-1", "-1", "-", NULL);
        assert_string_equal(status(a), "ok");
        assert_string_not_equal(field_s(body(a), D_VERDICT), "granted");
        freeReplyObject(a);
}

/* sb:lives and the live keys' new fields are anyone's to write: another type, members that are no node,
 * keys gone, garbage TTLs. No renewal fails; a member without a readable key is dropped and every pool of
 * the claimer named (whose it was is unknown); a live node is never reaped by it. */
static void test_bad_lives_entries_break_nothing(void **state) {
        live_setup();
        freeReplyObject(redisCommand(redis, "SET sb:lives garbage"));
        live_renew_ok(LIVE_N1, "sb:live:n1", 1);
        redisReply *ty = redisCommand(redis, "TYPE sb:lives");
        assert_string_equal(ty->str, "zset");
        freeReplyObject(ty);
        char huge[200];
        memset(huge, 'x', sizeof huge - 1);
        huge[sizeof huge - 1] = '\0';
        freeReplyObject(redisCommand(redis, "ZADD sb:lives 0 %s 0 nosuchnode -inf n3", huge));
        freeReplyObject(redisCommand(redis, "HSET sb:live:n3 at x ttl -5 mttl inf pools 7"));
        redisReply *r = live_renew(LIVE_N2, "sb:live:n2", POOL, NULL);
        assert_string_equal(status(r), "ok");
        assert_int_equal(body(r)->element[0]->integer, 1);
        assert_int_equal(r->element[R_EVENTS]->elements, 1);
        freeReplyObject(r);
        redisReply *n = redisCommand(redis, "ZCARD sb:lives");
        assert_int_equal(n->integer, 2); /* n1, n2 */
        freeReplyObject(n);
        /* n1's own fields garbled: its renewal reads in full and covers as before; garbage mttl never
         * makes its deadline in sb:lives earlier than a TTL from now. */
        freeReplyObject(redisCommand(redis, "HSET sb:live:n1 mttl -1 full 99999999999999999"));
        live_renew_ok(LIVE_N1, "sb:live:n1", 1);
        freeReplyObject(redisCommand(redis, "HSET sb:live:n1 mttl 1 full x"));
        live_renew_ok(LIVE_N1, "sb:live:n1", 1);
        redisReply *sc = redisCommand(redis, "ZSCORE sb:lives n1");
        redisReply *at = redisCommand(redis, "HGET sb:live:n1 at");
        assert_true(strtoll(sc->str, NULL, 10) >= strtoll(at->str, NULL, 10) + 2 * SEC);
        freeReplyObject(sc);
        freeReplyObject(at);
        /* Both nodes renewing, nobody reaped. */
        for (int i = 0; i < 6; i++) {
                live_renew_ok(LIVE_N1, "sb:live:n1", 1);
                live_renew_ok(LIVE_N2, "sb:live:n2", 1);
                msleep(500);
        }
        redisReply *t = live_tick(LIVE_N1, "n1", "=");
        assert_int_equal(cache(t, C_IN_USE), 2);
        assert_int_equal(t->element[R_NOTICES]->elements, 0);
        freeReplyObject(t);
        /* A period of garbage is refused "invalid". */
        const char *saved = pool;
        pool = "sb:live:n1";
        r = call("renew", LIVE_N1, -1, 1, "2000000/x", POOL, NULL);
        assert_string_equal(status(r), "invalid");
        freeReplyObject(r);
        pool = saved;
}

/* Renewals 5 s apart (backend-node-ttl 30 s): the backend clock's gap grows to 7 s, so a fleet of one node
 * renewing that often keeps the clock at Redis's rate (with 2 s a 3 s gap would stand still but for 1 s);
 * a garbage gap is 2 s again. */
static void test_a_slow_renewal_widens_the_backend_clocks_gap(void **state) {
        redisReply *t = live_tick(LIVE_N1, "n1", CANON_LIVE);
        freeReplyObject(t);
        const char *saved = pool;
        pool = "sb:live:n1";
        redisReply *r = call("renew", LIVE_N1, -1, 1, "2000000/5000000", POOL, NULL);
        assert_string_equal(status(r), "ok");
        long long b1 = r->element[R_NOW]->integer;
        freeReplyObject(r);
        redisReply *g = redisCommand(redis, "HGET sb:clock gap");
        assert_string_equal(g->str, "7000000");
        freeReplyObject(g);
        msleep(3200);
        r = call("renew", LIVE_N1, -1, 1, "2000000/5000000", POOL, NULL);
        long long b2 = r->element[R_NOW]->integer;
        freeReplyObject(r);
        assert_true(b2 - b1 >= 3000000);
        freeReplyObject(redisCommand(redis, "HSET sb:clock gap 1e300"));
        msleep(2600);
        r = call("renew", LIVE_N1, -1, 1, LIVE_TTL, POOL, NULL);
        long long b3 = r->element[R_NOW]->integer;
        freeReplyObject(r);
        assert_true(b3 - b2 < 2 * SEC);
        pool = saved;
}

/* Renewals every TTL/4 (7.5 s at backend-node-ttl 30 s; at most 10 s), every TTL/2 (at most 15 s) while the
 * node holds nothing: the backend clock's gap grows to the period + 2 s, at most 17 s (it was capped at 7 s,
 * then 12 s: a fleet of one node renewing every 7.5 s would see its clock stand still but for 1 s between
 * renewals, its dead found 7 times late). */
static void test_a_renewal_every_ttl_4_widens_the_backend_clocks_gap_to_its_period(void **state) {
        redisReply *t = live_tick(LIVE_N1, "n1", CANON_LIVE);
        freeReplyObject(t);
        const char *saved = pool;
        pool = "sb:live:n1";
        /* A period, and the gap after it (the longest kept: a shorter period later leaves it). */
        static const char *const steps[][2] = {
                { "30000000/7500000", "9500000" },
                { "30000000/15000000", "17000000" },
                { "30000000/20000000", "17000000" },
                { "30000000/7500000", "17000000" },
        };
        for (size_t i = 0; i < ELEMENTSOF(steps); i++) {
                redisReply *r = call("renew", LIVE_N1, -1, 1, steps[i][0], POOL, NULL);
                assert_string_equal(status(r), "ok");
                freeReplyObject(r);
                redisReply *g = redisCommand(redis, "HGET sb:clock gap");
                assert_string_equal(g->str, steps[i][1]);
                freeReplyObject(g);
        }
        pool = saved;
}

/* ---- the scripts against pool-local.c itself ----
 *
 * The same random sequence of requests, releases, withdrawals and drains, instant by instant, through
 * pool-local (the reference) and through the scripts in the manual clock mode; the decisions of both,
 * in order, must be equal: verdict, request, instant, refusal, state, idle, budget, token, slots, and the
 * congestion flips. The lanes are configured in name order, the order in which the scripts walk them. */

typedef struct Dec {
        char verdict[12], rid[16], refusal[12], state[12];
        long long at, idle, budget, token;
        unsigned n_slots, slots[4];
        int congested;
} Dec;

typedef struct Req {
        char rid[16];
        int phase;              /* 0 none, 1 waiting, 2 held, 3 done */
        PoolWaiter *waiter;
        PoolGrant *grant;
        long long token;
        bool health;            /* on the health lane */
        bool also;              /* on the health = also lane */
} Req;

#define DIFF_REQS 400
#define DIFF_DECS 4096

typedef struct Diff {
        Dec local[DIFF_DECS], remote[DIFF_DECS];
        size_t n_local, n_remote;
        Req reqs[DIFF_REQS];
        size_t n_reqs;
} Diff;

static const char *const refusal_names[] = { "busy", "full", "timeout", "shed", "unavailable" };
static const char *const state_names[] = { "none", "keeping-up", "saturated" };

static unsigned long diff_quarantines, diff_health_grants, diff_also_grants; /* compared (issue 23 item 7) */

static void on_local_decision(const PoolDecision *d, void *userdata) {
        Diff *df = userdata;
        Req *r = d->cookie;
        Dec *o = &df->local[df->n_local++];

        assert_true(df->n_local < DIFF_DECS);
        *o = (Dec) { .at = (long long) d->at };
        switch (d->verdict) {
        case POOL_VERDICT_MEMBER:
                /* A quarantine or a restore: the scripts' reply says it in its notices (README, "Members' lives"). */
                snprintf(o->verdict, sizeof o->verdict, "%s", d->quarantined ? "quarantined" : "restored");
                snprintf(o->rid, sizeof o->rid, "%s", d->member);
                diff_quarantines += d->quarantined;
                return;
        case POOL_VERDICT_CONGESTION:
                snprintf(o->verdict, sizeof o->verdict, "congestion");
                o->idle = (long long) d->idle;
                o->congested = d->congested;
                return;
        case POOL_VERDICT_GRANTED:
                snprintf(o->verdict, sizeof o->verdict, "granted");
                diff_health_grants += r->health;
                diff_also_grants += r->also;
                r->phase = 2;
                r->grant = d->grant;
                r->token = (long long) d->token;
                o->token = (long long) d->token;
                o->n_slots = d->n_slots;
                for (unsigned i = 0; i < d->n_slots && i < 4; i++)
                        o->slots[i] = d->slots[i];
                break;
        case POOL_VERDICT_QUEUED:
                snprintf(o->verdict, sizeof o->verdict, "queued");
                r->phase = 1;
                r->waiter = d->waiter;
                break;
        case POOL_VERDICT_REFUSED:
                snprintf(o->verdict, sizeof o->verdict, "refused");
                snprintf(o->refusal, sizeof o->refusal, "%s", refusal_names[d->refusal]);
                r->phase = 3;
                break;
        default:
                fail();
        }
        snprintf(o->rid, sizeof o->rid, "%s", r->rid);
        snprintf(o->state, sizeof o->state, "%s", state_names[d->state]);
        o->idle = (long long) d->idle;
        o->budget = d->budget == USEC_INFINITY ? -1 : (long long) d->budget;
}

static void remote_decision(Diff *df, const redisReply *d) {
        Dec *o = &df->remote[df->n_remote++];

        assert_true(df->n_remote < DIFF_DECS);
        *o = (Dec) {};
        snprintf(o->verdict, sizeof o->verdict, "%s", d->element[0]->str);
        if (strcmp(o->verdict, "congestion") == 0) {
                o->at = d->element[1]->integer;
                o->idle = d->element[2]->integer;
                o->congested = (int) d->element[3]->integer;
                return;
        }
        snprintf(o->rid, sizeof o->rid, "%s", d->element[D_RID]->str);
        o->at = d->element[D_AT]->integer;
        snprintf(o->refusal, sizeof o->refusal, "%s", d->element[D_REFUSAL]->str);
        snprintf(o->state, sizeof o->state, "%s", d->element[D_STATE]->str);
        o->idle = d->element[D_IDLE]->integer;
        o->budget = d->element[D_BUDGET]->integer;
        o->token = d->element[D_TOKEN]->integer;
        o->n_slots = (unsigned) d->element[D_SLOTS]->elements;
        for (unsigned i = 0; i < o->n_slots && i < 4; i++)
                o->slots[i] = (unsigned) d->element[D_SLOTS]->element[i]->integer;
}

static void remote_notices(Diff *df, const redisReply *r) {
        for (size_t i = 0; i < r->element[R_NOTICES]->elements; i++) {
                const redisReply *n = r->element[R_NOTICES]->element[i];
                if (strcmp(n->element[0]->str, "quarantined") != 0 && strcmp(n->element[0]->str, "restored") != 0)
                        continue;
                Dec *o = &df->remote[df->n_remote++];
                assert_true(df->n_remote < DIFF_DECS);
                *o = (Dec) { .at = n->element[2]->integer };
                snprintf(o->verdict, sizeof o->verdict, "%s", n->element[0]->str);
                snprintf(o->rid, sizeof o->rid, "%s", n->element[1]->str);
        }
}

/* A script call's decisions: its events, its notices of members' lives, then (submit) its own; "settling"
 * is sent again. */
static void remote_call(Diff *df, bool is_submit, const char *op, long long now, ...) {
        for (int tries = 0;; tries++) {
                va_list ap;
                va_start(ap, now);
                redisReply *r = call_v(op, "n1", now, 0, ap);
                va_end(ap);
                for (size_t i = 0; i < n_events(r); i++)
                        remote_decision(df, event(r, i));
                remote_notices(df, r);
                bool settling = strcmp(status(r), "settling") == 0;
                if (!settling) {
                        assert_string_equal(status(r), "ok");
                        if (is_submit)
                                remote_decision(df, body(r));
                }
                freeReplyObject(r);
                if (!settling)
                        return;
                assert_true(tries < 100);
        }
}

static void remote_tick(Diff *df, long long now) {
        for (int tries = 0;; tries++) {
                redisReply *r = tick_as("n1", now, "=");
                for (size_t i = 0; i < n_events(r); i++)
                        remote_decision(df, event(r, i));
                bool settling = strcmp(status(r), "settling") == 0;
                freeReplyObject(r);
                if (!settling)
                        return;
                assert_true(tries < 100);
        }
}

static unsigned long diff_seen[8];      /* granted, queued, busy, full, timeout, shed, unavailable, congestion */

static void count(const Dec *d) {
        static const char *const kinds[] = { "busy", "full", "timeout", "shed", "unavailable" };
        if (strcmp(d->verdict, "granted") == 0)
                diff_seen[0]++;
        else if (strcmp(d->verdict, "queued") == 0)
                diff_seen[1]++;
        else if (strcmp(d->verdict, "congestion") == 0)
                diff_seen[7]++;
        else
                for (size_t i = 0; i < 5; i++)
                        if (strcmp(d->refusal, kinds[i]) == 0)
                                diff_seen[2 + i]++;
}

static void compare(Diff *df, unsigned seed, int step) {
        size_t n = df->n_local > df->n_remote ? df->n_local : df->n_remote;
        for (size_t i = 0; i < df->n_local; i++)
                count(&df->local[i]);
        for (size_t i = 0; i < n; i++) {
                const Dec *a = i < df->n_local ? &df->local[i] : NULL, *b = i < df->n_remote ? &df->remote[i] : NULL;
                if (a && b && strcmp(a->verdict, b->verdict) == 0 && strcmp(a->rid, b->rid) == 0 && a->at == b->at &&
                    strcmp(a->refusal, b->refusal) == 0 && strcmp(a->state, b->state) == 0 && a->idle == b->idle &&
                    a->budget == b->budget && a->token == b->token && a->n_slots == b->n_slots &&
                    memcmp(a->slots, b->slots, sizeof a->slots) == 0 && a->congested == b->congested)
                        continue;
                if (getenv("DIFF_DEBUG"))
                        for (size_t j = 0; j < n; j++)
                                fprintf(stderr, "%zu: L %s %s %lld %s | R %s %s %lld %s\n", j,
                                        j < df->n_local ? df->local[j].verdict : "-", j < df->n_local ? df->local[j].rid : "",
                                        j < df->n_local ? df->local[j].at : 0, j < df->n_local ? df->local[j].refusal : "",
                                        j < df->n_remote ? df->remote[j].verdict : "-", j < df->n_remote ? df->remote[j].rid : "",
                                        j < df->n_remote ? df->remote[j].at : 0, j < df->n_remote ? df->remote[j].refusal : "");
                fail_msg("seed %u step %d decision %zu: pool-local %s %s at=%lld %s %s idle=%lld budget=%lld "
                         "token=%lld slots=%u/%u c=%d, scripts %s %s at=%lld %s %s idle=%lld budget=%lld token=%lld "
                         "slots=%u/%u c=%d",
                         seed, step, i,
                         a ? a->verdict : "-", a ? a->rid : "", a ? a->at : 0, a ? a->refusal : "", a ? a->state : "",
                         a ? a->idle : 0, a ? a->budget : 0, a ? a->token : 0, a ? a->n_slots : 0,
                         a ? a->slots[0] : 0, a ? a->congested : 0,
                         b ? b->verdict : "-", b ? b->rid : "", b ? b->at : 0, b ? b->refusal : "", b ? b->state : "",
                         b ? b->idle : 0, b ? b->budget : 0, b ? b->token : 0, b ? b->n_slots : 0,
                         b ? b->slots[0] : 0, b ? b->congested : 0);
        }
        df->n_local = df->n_remote = 0;
}

static unsigned next_random(unsigned *s) {
        *s = *s * 1103515245u + 12345u;
        return (*s >> 8) & 0xffffff;
}

/* variant 0: queue-timeout 5 s, limit 4; 1: no queue-timeout, limit 3, max-queue 5; 2: members alpha…delta,
 * queue-timeout 5 s with a congestion timeout of 2 s, lane a's own budget of 4 s, member drains, quarantine
 * after 2 exit statuses 3 in a row (releases with 3, 0 or none), restores by hand, and a health lane h (its
 * requests granted quarantined members only, its exit 0 restoring them). */
static void run_differential(unsigned seed, int variant) {
        bool with_q = variant != 1, members = variant == 2;
        char *member_names[] = { (char *) "alpha", (char *) "beta", (char *) "gamma", (char *) "delta", NULL };
        const char *drained_member = NULL;
        static Diff df;
        static const PoolLaneRule rules[] = {
                { .lane = "a", .priority = 0, .max_in_use = -1 },
                { .lane = "b", .priority = 5, .max_in_use = 2 },
                { .lane = "c", .priority = 0, .max_in_use = -1, .reserve = 1 },
                { .lane = "h", .priority = 0, .max_in_use = -1, .health = true }, /* variant 2 only */
                { .lane = "x", .priority = 0, .max_in_use = -1, .health = true, .health_also = true }, /* variant 2 */
        };
        const char *lanes[] = { "a", "b", "c" };
        PoolConfig pc = {
                .limit = with_q ? 4 : 3,
                .members = members ? member_names : NULL,
                .n_members = members ? 4 : 0,
                .queue_timeout_set = with_q,
                .queue_timeout = 5 * SEC,
                .congestion_timeout_set = members,
                .congestion_timeout = 2 * SEC,
                .max_queue = with_q ? -1 : 5,
                .quarantine_exit_codes = { members ? UINT64_C(1) << 3 : 0 },
                .quarantine_exit_codes_set = members,
                .quarantine_after = 2,
        };
        const char *const canons[] = {
                "backend-node-ttl=600000000\nlane.a.priority=0\nlane.b.max-in-use=2\nlane.b.priority=5\n"
                "lane.c.priority=0\nlane.c.reserve=1\nlimit=4\nqueue-timeout=5000000\n",
                "backend-node-ttl=600000000\nlane.a.priority=0\nlane.b.max-in-use=2\nlane.b.priority=5\n"
                "lane.c.priority=0\nlane.c.reserve=1\nlimit=3\nmax-queue=5\n",
                "backend-node-ttl=600000000\nlane.a.priority=0\nlane.a.queue-timeout=4000000\nlane.b.max-in-use=2\n"
                "lane.b.priority=5\nlane.c.priority=0\nlane.c.reserve=1\n"
                "lane.h.health=1\nlane.h.max-in-use=-1\nlane.h.priority=0\nlane.h.reserve=0\n"
                "lane.x.health=also\nlane.x.max-in-use=-1\nlane.x.priority=0\nlane.x.reserve=0\n"
                "limit=4\nmembers=alpha,beta,gamma,delta\nquarantine-after=2\nquarantine-exit-codes=3\nqueue-congestion-timeout=2000000\nqueue-timeout=5000000\n",
        };
        const char *canon = canons[variant];
        Pool *p = NULL;
        long long now = 1000;
        unsigned rnd = seed, n_lanes = 3;
        bool drained = false;

        freeReplyObject(redisCommand(redis, "FLUSHALL"));
        df.n_local = df.n_remote = df.n_reqs = 0;
        assert_int_equal(pool_local_new("p", on_local_decision, &df, &p), 0);
        assert_int_equal(pool_configure(p, &pc, rules, members ? 5 : 3, (usec_t) now), 0);
        tick_ok("n1", now, canon);

        for (int step = 0; step < 300; step++) {
                unsigned dt = next_random(&rnd) % 4;
                if (dt > 0)
                        now += (long long) (next_random(&rnd) % (3 * SEC)) + 1;
                /* The instants before now, at their own times (engine_advance()). */
                for (usec_t t; (t = p->ops->next_wakeup(p)) < (usec_t) now; )
                        p->ops->run(p, t);

                /* Half-way, a reload: lane b's priority drops below a's, lane c goes, and in the member pool
                 * the members are reordered and beta removed (held slots follow their member). */
                if (step == 150 && variant != 1) {
                        static const PoolLaneRule reloaded[] = {
                                { .lane = "a", .priority = 0, .max_in_use = -1 },
                                { .lane = "b", .priority = -1, .max_in_use = 2 },
                                { .lane = "h", .priority = 0, .max_in_use = -1, .health = true }, /* variant 2 */
                                { .lane = "x", .priority = 0, .max_in_use = -1, .health = true, .health_also = true },
                        };
                        char *new_members[] = { (char *) "delta", (char *) "gamma", (char *) "alpha", NULL };
                        PoolConfig pc2 = pc;
                        if (members) {
                                pc2.members = new_members;
                                pc2.n_members = 3;
                                pc2.limit = 3;
                        }
                        if (drained_member && strcmp(drained_member, "beta") == 0) {
                                /* Undrained first: a removed member's drain is not carried over the same way. */
                                assert_int_equal(p->ops->drain(p, "beta", false, (usec_t) now), 0);
                                remote_call(&df, false, "drain", now, "beta", "0", NULL);
                                drained_member = NULL;
                        }
                        assert_int_equal(pool_configure(p, &pc2, reloaded, members ? 4 : 2, (usec_t) now), 0);
                        /* A configure's tick leaves the instant open (settle 0): run() completes it. */
                        redisReply *t = call("tick", "n1", now, 0, "n1", members ?
                                "backend-node-ttl=600000000\nlane.a.priority=0\nlane.a.queue-timeout=4000000\n"
                                "lane.b.max-in-use=2\nlane.b.priority=-1\n"
                                "lane.h.health=1\nlane.h.max-in-use=-1\nlane.h.priority=0\nlane.h.reserve=0\n"
                                "lane.x.health=also\nlane.x.max-in-use=-1\nlane.x.priority=0\nlane.x.reserve=0\n"
                                "limit=3\nmembers=delta,gamma,alpha\n"
                                "quarantine-after=2\nquarantine-exit-codes=3\n"
                                "queue-congestion-timeout=2000000\nqueue-timeout=5000000\n" :
                                "backend-node-ttl=600000000\nlane.a.priority=0\nlane.b.max-in-use=2\n"
                                "lane.b.priority=-1\nlimit=4\nqueue-timeout=5000000\n",
                                "0", "0", "0", "-", "e1", "1", "", NULL);
                        assert_string_equal(status(t), "ok");
                        for (size_t i = 0; i < n_events(t); i++)
                                remote_decision(&df, event(t, i));
                        freeReplyObject(t);
                        n_lanes = 2;
                        if (members)
                                for (size_t i = 0; i < 4; i++)
                                        member_names[i] = i < 3 ? new_members[i] : NULL;
                }

                unsigned n_ops = 1 + next_random(&rnd) % 3;
                for (unsigned o = 0; o < n_ops; o++) {
                        unsigned what = next_random(&rnd) % 100;
                        if (what < 50 && df.n_reqs < DIFF_REQS) {
                                Req *r = &df.reqs[df.n_reqs++];
                                *r = (Req) {};
                                snprintf(r->rid, sizeof r->rid, "r%04zu", df.n_reqs);
                                const char *lane = lanes[next_random(&rnd) % n_lanes];
                                /* The member pool: now and then a health job, for one member, and a request of
                                 * the health = also lane x (quarantined members first, else ordinary ones). */
                                unsigned special = members ? next_random(&rnd) % 8 : 1;
                                if (members && special == 0)
                                        lane = "h";
                                else if (members && special == 1 && next_random(&rnd) % 2 == 0)
                                        lane = "x";
                                r->health = strcmp(lane, "h") == 0;
                                r->also = strcmp(lane, "x") == 0;
                                unsigned k = strcmp(lane, "h") == 0 ? 1 : 1 + next_random(&rnd) % 3;
                                bool may_wait = next_random(&rnd) % 100 < 85;
                                long long cap = next_random(&rnd) % 3 == 0 ? (long long) (1 + next_random(&rnd) % 12) * SEC : -1;
                                bool lane_budget = members && strcmp(lane, "a") == 0;
                                char k_s[8], cap_s[32];
                                snprintf(k_s, sizeof k_s, "%u", k);
                                snprintf(cap_s, sizeof cap_s, "%lld", cap);
                                assert_int_equal(p->ops->submit(p, &(PoolTry) {
                                        .cookie = r, .lane = lane, .slots = k, .may_wait = may_wait,
                                        .lane_budget_set = lane_budget,
                                        .lane_budget = lane_budget ? 4 * SEC : USEC_INFINITY,
                                        .client_cap = cap < 0 ? USEC_INFINITY : (usec_t) cap,
                                        .arrival = (usec_t) now,
                                }, (usec_t) now), 0);
                                remote_call(&df, true, "submit", now, r->rid, lane, k_s, may_wait ? "1" : "0",
                                            lane_budget ? "1" : "0", lane_budget ? "4000000" : "-1", cap_s, "-", NULL);
                        } else if (what < 92) {
                                int want = what < 80 ? 2 : 1;
                                size_t n = 0, pick;
                                for (size_t i = 0; i < df.n_reqs; i++)
                                        n += df.reqs[i].phase == want;
                                if (n == 0)
                                        continue;
                                pick = next_random(&rnd) % n;
                                for (size_t i = 0; i < df.n_reqs; i++) {
                                        Req *r = &df.reqs[i];
                                        if (r->phase != want || pick-- > 0)
                                                continue;
                                        r->phase = 3;
                                        if (want == 2) {
                                                char tok[32];
                                                snprintf(tok, sizeof tok, "%lld", r->token);
                                                /* In the member pool: its command's exit status, 3 (an
                                                 * infrastructure failure), 0, or none told. */
                                                unsigned e = members ? next_random(&rnd) % 4 : 0;
                                                if (e > 0)
                                                        p->ops->report_exit(p, r->grant, e == 1 ? 0 : 3, "j", (usec_t) now);
                                                p->ops->release(p, r->grant, (usec_t) now);
                                                remote_call(&df, false, "release", now, tok, r->rid,
                                                            e == 0 ? "" : e == 1 ? "0" : "3", "j", NULL);
                                        } else {
                                                p->ops->withdraw(p, r->waiter, (usec_t) now);
                                                remote_call(&df, false, "withdraw", now, r->rid, NULL);
                                        }
                                        break;
                                }
                        } else if (members && what >= 92 && what < 95) {
                                /* A member restored by hand (nothing to do when it is not quarantined). */
                                const char *m = member_names[next_random(&rnd) % (n_lanes == 3 ? 4 : 3)];
                                assert_int_equal(p->ops->quarantine(p, m, NULL, (usec_t) now), 0);
                                remote_call(&df, false, "quarantine", now, m, "0", "", "", NULL);
                        } else if (members && what >= 95) {
                                /* One member drained at a time: on, then off again. */
                                const char *m = drained_member ?: member_names[next_random(&rnd) % (n_lanes == 3 ? 4 : 3)];
                                assert_int_equal(p->ops->drain(p, m, !drained_member, (usec_t) now), 0);
                                remote_call(&df, false, "drain", now, m, drained_member ? "0" : "1", NULL);
                                drained_member = drained_member ? NULL : m;
                        } else if (drained ? what >= 94 : what >= 99) {
                                drained = !drained;
                                assert_int_equal(p->ops->drain(p, NULL, drained, (usec_t) now), 0);
                                remote_call(&df, false, "drain", now, "", drained ? "1" : "0", NULL);
                        }
                }
                /* The end of the instant (engine_run()). */
                p->ops->run(p, (usec_t) now);
                remote_tick(&df, now);
                if (getenv("DIFF_DEBUG"))
                        fprintf(stderr, "step %d now %lld\n", step, now);
                compare(&df, seed, step);
        }
        /* The engine ends its leases before it frees a pool; so does the test. */
        for (size_t i = 0; i < df.n_reqs; i++)
                if (df.reqs[i].phase == 2)
                        p->ops->release(p, df.reqs[i].grant, (usec_t) now);
        p->ops->free(p);
}

static void test_scripts_decide_as_pool_local_does(void **state) {
        for (unsigned seed = 1; seed <= 6; seed++)
                for (int variant = 0; variant < 3; variant++)
                        run_differential(seed * 7919 + (unsigned) variant, variant);
        printf("# compared: %lu granted, %lu queued, refused %lu busy %lu full %lu timeout %lu shed "
               "%lu unavailable, %lu congestion flips\n", diff_seen[0], diff_seen[1], diff_seen[2], diff_seen[3],
               diff_seen[4], diff_seen[5], diff_seen[6], diff_seen[7]);
        /* Every kind of decision was compared at least once. */
        for (size_t i = 0; i < 8; i++)
                assert_true(diff_seen[i] > 0);
        printf("# compared: %lu quarantines, %lu health grants, %lu health = also grants\n", diff_quarantines,
               diff_health_grants, diff_also_grants);
        assert_true(diff_quarantines > 0);
        assert_true(diff_health_grants > 0);
        assert_true(diff_also_grants > 0);
}

/* An instant cut short by the budget is finished before anything later at that instant: pool-local's
 * run() would have granted every waiter it could before a later arrival of the same instant came, which
 * then finds the free slot and nobody ahead of it. */
static void test_an_instant_cut_short_is_finished_before_a_later_arrival(void **state) {
        char rid[16];
        size_t granted = 0;

        tick_ok("n1", 1000, CANON_ONE_LANE "limit=101\n");
        redisReply *big = submit_at(1000, "big", "ci", 100, true, -1);
        expect_verdict("one", 1000, "ci", 1, "granted");
        for (int i = 0; i < 100; i++) {
                snprintf(rid, sizeof rid, "w%03d", i);
                expect_verdict(rid, 1000, "ci", 1, "queued");
        }
        tick_ok("n1", 1000, "=");

        /* 100 slots free at 2000: the run of 2000 grants 64 (the budget), the rest is left under way. */
        freeReplyObject(release_at(2000, field_i(body(big), D_TOKEN), "big"));
        freeReplyObject(big);
        redisReply *t = tick_as("n1", 2000, "=");
        assert_int_equal(n_events(t), SETTLE_MAX);
        granted += n_events(t);
        freeReplyObject(t);
        /* "one" ends at 2000 too, after the run: its slot is free, and nobody waits any more. */
        redisReply *r = release_at(2000, 2, "one");
        assert_string_equal(body(r)->element[0]->str, "released");
        granted += n_events(r);
        freeReplyObject(r);
        assert_int_equal(granted, 100);
        redisReply *late = submit_at(2000, "late", "ci", 1, false, -1);
        assert_string_equal(field_s(body(late), D_VERDICT), "granted");
        freeReplyObject(late);
}

/* Pages: a reconcile looks at RECONCILE_PAGE records at most and says where to go on; positions takes
 * POSITIONS_MAX rids at most. */
static void test_reconcile_and_positions_are_paged(void **state) {
        static char rids[600][8];
        const char *argv[32 + 600];
        size_t n = 0;

        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\n");
        for (int i = 0; i < 600; i++) {
                snprintf(rids[i], sizeof rids[i], "r%03d", i);
                freeReplyObject(submit_at(1000, rids[i], "ci", 1, true, -1));
        }
        tick_ok("n1", 1000, "=");
        const char *cmd, *fn;
        callee("tick", &cmd, &fn);
        const char *head[] = { cmd, fn, "1", POOL, "1", "n1", "2000", "run1", "1", "n1", "=", "0",
                               "0", "0", "-", "e1", "1", "-", "+" };
        for (size_t i = 0; i < sizeof head / sizeof head[0]; i++)
                argv[n++] = head[i];
        for (int i = 0; i < 600; i++)
                argv[n++] = rids[i];
        redisReply *t = redisCommandArgv(redis, (int) n, argv, NULL);
        assert_string_equal(t->element[R_STATUS]->str, "ok");
        assert_string_equal(t->element[R_BODY]->element[8]->str, "r511");
        assert_int_equal(cache(t, C_WAITING), 599); /* nothing dropped: every record was listed */
        freeReplyObject(t);

        n = 0;
        callee("positions", &cmd, &fn);
        const char *phead[] = { cmd, fn, "1", POOL, "1", "n1", "2000", "run1", "0", "pos" };
        for (size_t i = 0; i < sizeof phead / sizeof phead[0]; i++)
                argv[n++] = phead[i];
        for (int i = 0; i < 257; i++)
                argv[n++] = rids[i];
        redisReply *p = redisCommandArgv(redis, (int) n, argv, NULL);
        assert_string_equal(p->element[R_STATUS]->str, "invalid");
        freeReplyObject(p);
        p = redisCommandArgv(redis, (int) n - 1, argv, NULL);
        assert_string_equal(p->element[R_STATUS]->str, "ok");
        assert_int_equal(p->element[R_BODY]->elements, 256);
        freeReplyObject(p);
}

/* ---- outcome records ---- */

static long long redis_int(const char *fmt, const char *a, const char *b) {
        redisReply *r = redisCommand(redis, fmt, a, b);
        assert_non_null(r);
        long long v = r->type == REDIS_REPLY_INTEGER ? r->integer : r->type == REDIS_REPLY_ARRAY ? (long long) r->elements : -2;
        freeReplyObject(r);
        return v;
}

/* Issue 21 item 2: a node's outcome records are one hash and an index of their expiries, no key per request
 * and none with a TTL (Redis's expiry cycle walked thousands of keys); a retry within the window gets the
 * outcome, one after it is decided afresh, and the caller's calls trim what expired. A grant at once has no
 * record: its lease answers a retry. */
static void test_outcome_records_are_a_hash_per_node_trimmed_by_its_calls(void **state) {
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\n");
        expect_verdict("a", 2000, "ci", 1, "granted");
        redisReply *b = submit_at(2000, "b", "ci", 1, false, -1);
        assert_string_equal(field_s(body(b), D_REFUSAL), "busy");
        freeReplyObject(b);
        assert_int_equal(redis_int("KEYS %s:o:*", pool, ""), 0);
        assert_int_equal(redis_int("HLEN %s:oh:%s", pool, "n1"), 1); /* b's refusal; a's lease answers for a */
        assert_int_equal(redis_int("HEXISTS %s:oh:n1 %s", pool, "a"), 0);
        assert_int_equal(redis_int("PTTL %s:oh:%s", pool, "n1"), -1);
        assert_int_equal(redis_int("PTTL %s:ox:%s", pool, "n1"), -1);
        /* Within its 10 s: the same refusal, even to a request that may wait now. */
        b = submit_at(5 * SEC, "b", "ci", 1, true, -1);
        assert_string_equal(field_s(body(b), D_VERDICT), "refused");
        freeReplyObject(b);
        /* After them: decided afresh (queued behind a), and its record trimmed by the call. */
        b = submit_at(13 * SEC, "b", "ci", 1, true, -1);
        assert_string_equal(field_s(body(b), D_VERDICT), "queued");
        freeReplyObject(b);
        assert_int_equal(redis_int("HEXISTS %s:oh:n1 %s", pool, "b"), 0);
        assert_int_equal(redis_int("ZSCORE %s:ox:n1 %s", pool, "b"), -2); /* nil */
        assert_int_equal(redis_int("HLEN %s:oh:%s", pool, "n1"), 0);
        /* A retry of a's submit: its lease, found by its rid, and still no record. */
        expect_verdict("a", 13 * SEC, "ci", 1, "granted");
        assert_int_equal(redis_int("HLEN %s:oh:%s", pool, "n1"), 0);
        redisReply *w = call("withdraw", "n1", 14 * SEC, 0, "b", NULL);
        assert_string_equal(field_s(body(w), 0), "withdrawn");
        freeReplyObject(w);
        /* A waiter's grant is recorded: positions answers it after its lease, within its window; a lease
         * granted at once and released is "gone". */
        expect_verdict("c", 14 * SEC, "ci", 1, "queued");
        redisReply *r = call("release", "n1", 15 * SEC, 1, "1", "a", NULL); /* settled: c granted, token 2 */
        assert_string_equal(field_s(body(r), 0), "released");
        freeReplyObject(r);
        assert_int_equal(redis_int("HEXISTS %s:oh:n1 %s", pool, "c"), 1);
        freeReplyObject(release_at(16 * SEC, 2, "c"));
        redisReply *p = call("positions", "n1", 17 * SEC, 0, "pos", "c", "a", NULL);
        assert_string_equal(field_s(body(p)->element[0], D_VERDICT), "granted"); /* c's outcome */
        assert_string_equal(field_s(body(p)->element[1], 0), "gone");             /* a: released, no record */
        freeReplyObject(p);
        p = call("positions", "n1", 15 * SEC + 41 * SEC, 0, "pos", "c", NULL);
        assert_string_equal(field_s(body(p)->element[0], 0), "gone");
        freeReplyObject(p);
        assert_int_equal(redis_int("HLEN %s:oh:%s", pool, "n1"), 0);
}

/* ---- all-or-nothing sets (brokerd/lua/set.lua; SPEC §3.5, issue 22 item 5) ---- */

#define POOL2 "{sb:q}"

/* One FCALL of the set function over POOL and POOL2 as n1 at now (settle 0): mode, rid, then the mode's
 * arguments (NULL-terminated). The reply { status, pool, verdict, { reply… } }, checked for its shape. */
static redisReply *set_call(long long now, const char *mode, const char *rid, ...) {
        const char *argv[64] = { "FCALL", shared_function_set, "2", set_swapped ? POOL2 : POOL,
                                 set_swapped ? POOL : POOL2, "1", "n1" };
        char now_s[32];
        size_t n = 7;
        snprintf(now_s, sizeof now_s, "%lld", now);
        argv[n++] = now_s;
        argv[n++] = run_id;
        argv[n++] = "0";
        argv[n++] = mode;
        argv[n++] = rid;
        va_list ap;
        va_start(ap, rid);
        for (const char *a; (a = va_arg(ap, const char *)); )
                argv[n++] = a;
        va_end(ap);
        redisReply *r = redisCommandArgv(redis, (int) n, argv, NULL);
        assert_non_null(r);
        if (r->type == REDIS_REPLY_ERROR)
                fail_msg("set: %s", r->str);
        assert_int_equal(r->type, REDIS_REPLY_ARRAY);
        assert_int_equal(r->elements, 4);
        return r;
}

/* A set of lane ci: k=1 of each pool, may wait or not. */
static redisReply *set_submit(long long now, const char *rid, bool may_wait) {
        return set_call(now, "submit", rid, "ci", may_wait ? "1" : "0", "2", "1", "0", "-1", "-1", "-", "", "1", "0",
                        "-1", "-1", "-", "", NULL);
}

static redisReply *set_grant(long long now, const char *rid) {
        return set_call(now, "grant", rid, "2", NULL);
}

static const char *set_verdict(const redisReply *r) {
        return r->element[2]->str;
}

/* Pool i's (0-based) reply of a set's call. */
static const redisReply *set_reply(const redisReply *r, size_t i) {
        assert_true(r->element[3]->elements > i);
        return r->element[3]->element[i];
}


/* Both pools made, n1 registered in each, limit 1. */
static void set_pools(long long now) {
        tick_ok("n1", now, set_canon);
        pool = POOL2;
        tick_ok("n1", now, set_canon);
        pool = POOL;
}

/* A tick of pool p (completing the instant), whether its events say the set rid is ready there. */
static bool tick_says_ready(const char *p, long long now, const char *rid) {
        const char *was = pool;
        pool = p;
        redisReply *t = tick_as("n1", now, set_canon);
        pool = was;
        assert_string_equal(status(t), "ok");
        bool ready = false;
        for (size_t i = 0; i < n_events(t); i++)
                ready = ready || (strcmp(field_s(event(t, i), D_VERDICT), "ready") == 0 &&
                                  strcmp(field_s(event(t, i), D_RID), rid) == 0);
        freeReplyObject(t);
        return ready;
}

static long long in_use_of(const char *p, long long now) {
        const char *was = pool;
        pool = p;
        redisReply *t = tick_as("n1", now, set_canon);
        long long n = cache(t, C_IN_USE);
        freeReplyObject(t);
        pool = was;
        return n;
}

static void test_a_set_is_granted_in_every_pool_in_one_call(void **state) {
        set_pools(1000);
        redisReply *r = set_submit(2000, "0000000000000a01", true);
        assert_string_equal(status(r), "ok");
        assert_string_equal(set_verdict(r), "granted");
        for (size_t i = 0; i < 2; i++) {
                const redisReply *d = body(set_reply(r, i));
                assert_string_equal(field_s(d, D_VERDICT), "granted");
                assert_string_equal(field_s(d, D_RID), "0000000000000a01");
                assert_true(field_i(d, D_TOKEN) > 0);
        }
        freeReplyObject(r);
        assert_int_equal(in_use_of(POOL, 3000), 1);
        assert_int_equal(in_use_of(POOL2, 3000), 1);
        /* The same rid again (a reply lost): each pool's lease, nothing more taken. */
        r = set_submit(4000, "0000000000000a01", true);
        assert_string_equal(set_verdict(r), "known");
        assert_string_equal(field_s(body(set_reply(r, 0)), D_VERDICT), "granted");
        assert_string_equal(field_s(body(set_reply(r, 1)), D_VERDICT), "granted");
        freeReplyObject(r);
        assert_int_equal(in_use_of(POOL, 5000), 1);
        assert_int_equal(in_use_of(POOL2, 5000), 1);
}

/* A set's call sent again after its chosen pool's part was withdrawn while another pool still has its part (the
 * node gave the set up while the call's answer was lost with the link, and the chosen pool's withdraw went
 * first): each pool's state ("known"), nothing written. Decided afresh, the other pool got a second record
 * under the rid, which its counts found wrong at its next call: the pool made anew, a recovery window of one
 * node TTL for every node. */
static void test_a_set_sent_again_after_one_part_was_withdrawn_writes_nothing_twice(void **state) {
        const char *rid = "0000000000000a0f";
        set_pools(1000);
        redisReply *r = set_submit(2000, rid, true);
        assert_string_equal(set_verdict(r), "granted");
        freeReplyObject(r);
        redisReply *w = call("withdraw", "n1", 3000, 0, rid, NULL);
        assert_string_equal(field_s(body(w), 0), "released");
        freeReplyObject(w);
        r = set_submit(4000, rid, true);
        assert_string_equal(status(r), "ok");
        assert_string_equal(set_verdict(r), "known");
        assert_string_equal(field_s(body(set_reply(r, 0)), 0), "gone");
        assert_string_equal(field_s(body(set_reply(r, 1)), D_VERDICT), "granted");
        freeReplyObject(r);
        /* POOL2 keeps its one lease, its counts right: not made anew. */
        assert_int_equal(in_use_of(POOL2, 5000), 1);
        assert_int_equal(redis_int("HEXISTS %s:meta %s", POOL2, "lost"), 0);
}

/* No part held while it waits; it holds back those behind it in each pool, also where it has room; granted
 * whole once every pool is ready, by the grant call; a grant before that changes nothing. */
static void test_a_queued_set_holds_nothing_and_holds_back_those_behind_it(void **state) {
        set_pools(1000);
        redisReply *r = submit_at(2000, "0000000000000b01", "ci", 1, true, -1); /* POOL is full */
        long long token = field_i(body(r), D_TOKEN);
        assert_string_equal(field_s(body(r), D_VERDICT), "granted");
        freeReplyObject(r);

        r = set_submit(3000, "0000000000000b02", false); /* may not wait: busy, naming POOL */
        assert_string_equal(set_verdict(r), "refused");
        assert_int_equal(r->element[1]->integer, 1);
        assert_string_equal(field_s(body(set_reply(r, 0)), D_REFUSAL), "busy");
        freeReplyObject(r);
        assert_int_equal(in_use_of(POOL2, 3500), 0);

        r = set_submit(4000, "0000000000000b03", true);
        assert_string_equal(set_verdict(r), "queued");
        assert_string_equal(field_s(body(set_reply(r, 0)), D_VERDICT), "queued");
        assert_string_equal(field_s(body(set_reply(r, 1)), D_VERDICT), "queued");
        /* Ready in POOL2 (room, first there) once its instant is complete: said so, not granted. */
        bool ready2 = false;
        freeReplyObject(r);
        pool = POOL2;
        r = tick_as("n1", 4000, CANON_ONE_LANE "limit=1\n"); /* completes the instant: dispatch */
        pool = POOL;
        for (size_t i = 0; i < n_events(r); i++)
                ready2 = ready2 || strcmp(field_s(event(r, i), D_VERDICT), "ready") == 0;
        assert_true(ready2);
        assert_int_equal(cache(r, C_IN_USE), 0); /* no part held while it waits */
        freeReplyObject(r);

        /* A single-pool request behind it in POOL2 waits though POOL2 has room (no barging). */
        pool = POOL2;
        r = submit_at(5000, "0000000000000b04", "ci", 1, true, -1);
        assert_string_equal(field_s(body(r), D_VERDICT), "queued");
        freeReplyObject(r);
        pool = POOL;
        assert_int_equal(in_use_of(POOL2, 5500), 0);

        /* Not ready in POOL (full): a grant changes nothing. */
        r = set_grant(6000, "0000000000000b03");
        assert_string_equal(set_verdict(r), "not-ready");
        assert_int_equal(r->element[1]->integer, 1);
        freeReplyObject(r);
        assert_int_equal(in_use_of(POOL, 6500), 1);
        assert_int_equal(in_use_of(POOL2, 6500), 0);

        /* POOL's holder goes: the set is ready there too (said to its node), and its grant takes both. */
        r = release_at(7000, token, "0000000000000b01");
        freeReplyObject(r);
        r = tick_as("n1", 7000, CANON_ONE_LANE "limit=1\n"); /* completes the instant: dispatch */
        bool ready1 = false;
        for (size_t i = 0; i < n_events(r); i++)
                ready1 = ready1 || strcmp(field_s(event(r, i), D_VERDICT), "ready") == 0;
        assert_true(ready1);
        assert_int_equal(cache(r, C_IN_USE), 0); /* not granted by the pool alone */
        freeReplyObject(r);
        r = set_grant(8000, "0000000000000b03");
        assert_string_equal(set_verdict(r), "granted");
        assert_true(field_i(body(set_reply(r, 0)), D_TOKEN) > 0);
        assert_true(field_i(body(set_reply(r, 1)), D_TOKEN) > 0);
        freeReplyObject(r);
        assert_int_equal(in_use_of(POOL, 8500), 1);
        assert_int_equal(in_use_of(POOL2, 8500), 1);
        /* The single-pool waiter behind it in POOL2 still waits (the set holds POOL2's slot). */
        pool = POOL2;
        r = submit_at(9000, "0000000000000b04", "ci", 1, true, -1);
        assert_string_equal(field_s(body(r), D_VERDICT), "queued");
        freeReplyObject(r);
        pool = POOL;
}

/* A part said ready that a request of a higher priority passes is no longer ready: the set's grant says
 * not-ready, naming that pool, and the pool says ready again when it is (else the set would wait for good). */
static void test_a_set_not_ready_at_its_grant_is_said_ready_again(void **state) {
        set_canon = "backend-node-ttl=30000000\nlane.ci.max-in-use=-1\nlane.ci.priority=0\nlane.ci.reserve=0\n"
                    "lane.hi.max-in-use=-1\nlane.hi.priority=5\nlane.hi.reserve=0\nlimit=1\n";
        set_pools(1000);
        redisReply *r = submit_at(2000, "0000000000000d01", "ci", 1, true, -1); /* POOL is full */
        long long token = field_i(body(r), D_TOKEN);
        freeReplyObject(r);
        r = set_submit(3000, "0000000000000d02", true);
        assert_string_equal(set_verdict(r), "queued");
        freeReplyObject(r);
        assert_true(tick_says_ready(POOL2, 3000, "0000000000000d02"));

        /* A request of lane hi (priority 5) goes first in POOL2 and takes its slot. */
        pool = POOL2;
        r = submit_at(4000, "0000000000000d03", "hi", 1, true, -1);
        freeReplyObject(r);
        pool = POOL;
        assert_false(tick_says_ready(POOL2, 4000, "0000000000000d02"));
        assert_int_equal(in_use_of(POOL2, 4000), 1);
        r = release_at(5000, token, "0000000000000d01");
        freeReplyObject(r);
        assert_true(tick_says_ready(POOL, 5000, "0000000000000d02"));

        r = set_grant(6000, "0000000000000d02");
        assert_string_equal(set_verdict(r), "not-ready");
        assert_int_equal(r->element[1]->integer, 2);
        freeReplyObject(r);

        /* hi's lease ends: POOL2 says the set ready again, and its grant takes both. */
        pool = POOL2;
        r = call("positions", "n1", 7000, 0, "pos", "0000000000000d03", NULL);
        long long hi_token = field_i(body(r)->element[0], D_TOKEN);
        freeReplyObject(r);
        r = release_at(7000, hi_token, "0000000000000d03");
        freeReplyObject(r);
        pool = POOL;
        assert_true(tick_says_ready(POOL2, 7000, "0000000000000d02"));
        r = set_grant(8000, "0000000000000d02");
        assert_string_equal(set_verdict(r), "granted");
        freeReplyObject(r);
        assert_int_equal(in_use_of(POOL, 8500), 1);
        assert_int_equal(in_use_of(POOL2, 8500), 1);
}

/* A set's submit sent again (a node restarted, or lost the reply): each part as it stands ("known"), and a
 * part said ready already is said again in that pool's events, or the node, which grants only on that word,
 * would wait for good. */
static void test_a_known_set_part_said_ready_is_said_again(void **state) {
        set_pools(1000);
        redisReply *r = submit_at(2000, "0000000000000e01", "ci", 1, true, -1); /* POOL is full */
        freeReplyObject(r);
        r = set_submit(3000, "0000000000000e02", true);
        assert_string_equal(set_verdict(r), "queued");
        freeReplyObject(r);
        assert_true(tick_says_ready(POOL2, 3000, "0000000000000e02"));

        r = set_submit(4000, "0000000000000e02", true);
        assert_string_equal(set_verdict(r), "known");
        bool ready[2] = { false, false };
        for (size_t i = 0; i < 2; i++) {
                const redisReply *p = set_reply(r, i);
                assert_string_equal(field_s(body(p), D_VERDICT), "queued");
                for (size_t j = 0; j < n_events(p); j++)
                        ready[i] = ready[i] || (strcmp(field_s(event(p, j), D_VERDICT), "ready") == 0 &&
                                                strcmp(field_s(event(p, j), D_RID), "0000000000000e02") == 0);
        }
        assert_false(ready[0]); /* POOL is full: never said */
        assert_true(ready[1]);
        freeReplyObject(r);
        assert_int_equal(in_use_of(POOL2, 4500), 0); /* said, not granted */
}

/* Two sets that cross (one names POOL first, the other POOL2) stand in the same order in both pools, by one
 * call each: the first is ready in both and granted, the second is said ready in neither (no deadlock, where
 * each holding the head of one pool would wait for the other for good). */
static void test_crossing_sets_stand_in_one_order_in_every_pool(void **state) {
        set_pools(1000);
        redisReply *r = submit_at(2000, "0000000000000f01", "ci", 1, true, -1);
        long long t1 = field_i(body(r), D_TOKEN);
        freeReplyObject(r);
        pool = POOL2;
        r = submit_at(2000, "0000000000000f02", "ci", 1, true, -1);
        long long t2 = field_i(body(r), D_TOKEN);
        freeReplyObject(r);
        pool = POOL;
        r = set_submit(3000, "0000000000000f03", true);
        assert_string_equal(set_verdict(r), "queued");
        freeReplyObject(r);
        set_swapped = true;
        r = set_submit(3000, "0000000000000f04", true);
        assert_string_equal(set_verdict(r), "queued");
        freeReplyObject(r);
        set_swapped = false;

        r = release_at(4000, t1, "0000000000000f01");
        freeReplyObject(r);
        pool = POOL2;
        r = release_at(4000, t2, "0000000000000f02");
        freeReplyObject(r);
        pool = POOL;
        assert_false(tick_says_ready(POOL, 4000, "0000000000000f04"));
        assert_false(tick_says_ready(POOL2, 4000, "0000000000000f04"));
        set_swapped = true;
        r = set_grant(5000, "0000000000000f04");
        assert_string_equal(set_verdict(r), "not-ready");
        freeReplyObject(r);
        set_swapped = false;
        r = set_grant(5000, "0000000000000f03");
        assert_string_equal(set_verdict(r), "granted");
        freeReplyObject(r);
        assert_int_equal(in_use_of(POOL, 6000), 1);
        assert_int_equal(in_use_of(POOL2, 6000), 1);
}

/* A malformed set call (brokerd never sends one) is an error reply before anything is begun. */
static void test_a_malformed_set_call_is_an_error(void **state) {
        set_pools(1000);
        static const char *const bad[][16] = {
                { "FCALL", NULL, "2", POOL, POOL, "1", "n1", "2000", "run1", "0", "grant", "00000000000000e1", "2" },
                { "FCALL", NULL, "1", POOL, "1", "n1", "2000", "run1", "0", "grant", "00000000000000e1", "1" },
                { "FCALL", NULL, "2", POOL, POOL2, "1", "n1", "2000", "run1", "0", "grant", "00000000000000e1", "3" },
                { "FCALL", NULL, "2", POOL, POOL2, "1", "n1", "2000", "run1", "0", "take", "00000000000000e1", "2" },
                { "FCALL", NULL, "2", POOL, POOL2, "1", "n1", "2000", "run1", "0", "grant", "x y", "2" },
                { "FCALL", NULL, "2", POOL, POOL2, "1", "n1", "2000", "run1", "0", "submit", "00000000000000e1", "ci",
                  "1", "2", "1" },
        };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                const char *argv[16];
                size_t n = 0;
                for (; n < 16 && (n == 1 || bad[i][n]); n++)
                        argv[n] = n == 1 ? shared_function_set : bad[i][n];
                redisReply *r = redisCommandArgv(redis, (int) n, argv, NULL);
                assert_non_null(r);
                assert_int_equal(r->type, REDIS_REPLY_ERROR);
                assert_non_null(strstr(r->str, "slotbroker set"));
                freeReplyObject(r);
        }
        assert_int_equal(in_use_of(POOL, 3000), 0);
        assert_int_equal(in_use_of(POOL2, 3000), 0);
}

/* A drained pool refuses the set, naming it, and nothing is taken in the other. */
/* Two lanes a and b whose sets cross the same two pools; b's priority is given. */
#define CANON_SETS_AB(prio_b)                                                                                   \
        "backend-node-ttl=30000000\nlane.a.max-in-use=-1\nlane.a.priority=0\nlane.a.reserve=0\n"                \
        "lane.b.max-in-use=-1\nlane.b.priority=" prio_b "\nlane.b.reserve=0\nlimit=1\n"

/* A set of lane `lane` as n1: k=1 of each pool, may wait. */
static redisReply *set_submit_lane(long long now, const char *rid, const char *lane) {
        return set_call(now, "submit", rid, lane, "1", "2", "1", "0", "-1", "-1", "-", "", "1", "0", "-1", "-1", "-",
                        "", NULL);
}

/* A tick of pool p as node with canon (completing the instant): its status, whether its events say rid_a
 * (bit 0) and rid_b (bit 1) ready, and the pool's slots in use. */
static unsigned tick_readies(const char *p, const char *node, long long now, const char *canon, const char *rid_a,
                             const char *rid_b, const char **ret_status, long long *ret_in_use) {
        const char *was = pool;
        pool = p;
        redisReply *t = tick_as(node, now, canon);
        pool = was;
        static char st[16];
        snprintf(st, sizeof st, "%s", status(t));
        *ret_status = st;
        unsigned ready = 0;
        for (size_t i = 0; i < n_events(t); i++)
                if (strcmp(field_s(event(t, i), D_VERDICT), "ready") == 0) {
                        ready |= strcmp(field_s(event(t, i), D_RID), rid_a) == 0 ? 1u : 0u;
                        ready |= strcmp(field_s(event(t, i), D_RID), rid_b) == 0 ? 2u : 0u;
                }
        *ret_in_use = cache(t, C_IN_USE);
        freeReplyObject(t);
        return ready;
}

/* Both pools full (a lease of lane a in each, tokens returned), then n1's set s1 of lane a and s2 of lane b
 * waiting in both, s1 ahead (same priority, earlier). n2 is registered in POOL2, and in POOL if both. */
static void crossed_sets(const char *s1, const char *s2, bool n2_in_both, long long *ret_tokens) {
        set_canon = CANON_SETS_AB("0");
        set_pools(1000);
        if (n2_in_both)
                tick_ok("n2", 1000, set_canon);
        pool = POOL2;
        tick_ok("n2", 1000, set_canon);
        for (size_t i = 0; i < 2; i++) {
                pool = i == 0 ? POOL : POOL2;
                redisReply *r = submit_at(2000, i == 0 ? "0000000000000f01" : "0000000000000f02", "a", 1, true, -1);
                assert_string_equal(field_s(body(r), D_VERDICT), "granted");
                ret_tokens[i] = field_i(body(r), D_TOKEN);
                freeReplyObject(r);
        }
        pool = POOL;
        redisReply *r = set_submit_lane(3000, s1, "a");
        assert_string_equal(set_verdict(r), "queued");
        freeReplyObject(r);
        r = set_submit_lane(4000, s2, "b");
        assert_string_equal(set_verdict(r), "queued");
        freeReplyObject(r);
}

/* A rolling change of a lane's priority (brokerd.conf(5), "Agreement on the rules", and also=): each pool
 * adopts the new rules at its own tick, so between the last node's tick of POOL and its tick of POOL2 two
 * sets stand in opposite orders in the two pools. Slots freed in that window: s2 (raised) is ready in POOL
 * only, s1 in POOL2 only, and neither set's grant takes anything while both pools have a free slot. The
 * standoff lasts exactly until POOL2 adopts too (the same node's next call of that pool: brokerd sends the
 * ticks of every pool at its reload), which says s2 ready there: it is granted, s1 after it. */
static void test_crossed_sets_stand_off_only_until_the_second_pool_adopts(void **state) {
        const char *s1 = "0000000000000f11", *s2 = "0000000000000f12", *st;
        long long tokens[2], in_use;
        crossed_sets(s1, s2, true, tokens);
        /* n2 reloads first: both pools refuse it (n1 wants the old rules). */
        redisReply *t = tick_as("n2", 5000, CANON_SETS_AB("10"));
        assert_string_equal(status(t), "rules");
        freeReplyObject(t);
        pool = POOL2;
        t = tick_as("n2", 5000, CANON_SETS_AB("10"));
        assert_string_equal(status(t), "rules");
        freeReplyObject(t);
        pool = POOL;
        /* n1 reloads: POOL adopts at its tick; POOL2 has not had n1's tick yet. */
        assert_int_equal(tick_readies(POOL, "n1", 6000, CANON_SETS_AB("10"), s1, s2, &st, &in_use), 0);
        assert_string_equal(st, "ok");
        /* The window: both leases end. */
        freeReplyObject(release_at(6100, tokens[0], "0000000000000f01"));
        pool = POOL2;
        freeReplyObject(release_at(6100, tokens[1], "0000000000000f02"));
        pool = POOL;
        assert_int_equal(tick_readies(POOL, "n1", 6200, "=", s1, s2, &st, &in_use), 2);
        assert_int_equal(in_use, 0);
        assert_int_equal(tick_readies(POOL2, "n1", 6200, "=", s1, s2, &st, &in_use), 1);
        assert_int_equal(in_use, 0);
        redisReply *r = set_grant(6300, s1);
        assert_string_equal(set_verdict(r), "not-ready");
        assert_int_equal(r->element[1]->integer, 1);
        freeReplyObject(r);
        r = set_grant(6300, s2);
        assert_string_equal(set_verdict(r), "not-ready");
        assert_int_equal(r->element[1]->integer, 2);
        freeReplyObject(r);
        /* n1's tick of POOL2 adopts there too: s2 goes ahead, is said ready, and its grant takes both. */
        assert_int_equal(tick_readies(POOL2, "n1", 6400, CANON_SETS_AB("10"), s1, s2, &st, &in_use), 2);
        assert_string_equal(st, "ok");
        r = set_grant(6500, s2);
        assert_string_equal(set_verdict(r), "granted");
        long long s2_tokens[2] = { field_i(body(set_reply(r, 0)), D_TOKEN), field_i(body(set_reply(r, 1)), D_TOKEN) };
        freeReplyObject(r);
        /* s1 after it, in both. */
        for (size_t i = 0; i < 2; i++) {
                pool = i == 0 ? POOL : POOL2;
                freeReplyObject(release_at(7000, s2_tokens[i], s2));
        }
        pool = POOL;
        assert_int_equal(tick_readies(POOL, "n1", 7100, "=", s1, s2, &st, &in_use), 1);
        r = set_grant(7200, s1);
        assert_string_equal(set_verdict(r), "granted");
        freeReplyObject(r);
}

/* "POOL2 never agrees": a live node (n2) that uses POOL2 alone keeps wanting its old rules, so POOL2 keeps them
 * while POOL adopted the new ones. The node whose sets stand crossed (n1) wants the new rules for both pools
 * (one lane, one priority: engine.c, rules_for_pool()), so POOL2 refuses it ("rules"): its tick says so (and
 * brokerd refuses its requests there, withdrawing their parts: test-pool-shared,
 * test_rules_mismatch_refuses_and_keeps_heartbeating), and the set's grant is refused the same way, changing
 * nothing. The sets are refused, not left to wait for each other. */
static void test_crossed_sets_of_a_node_a_pool_disagrees_with_are_refused_there(void **state) {
        const char *s1 = "0000000000000f21", *s2 = "0000000000000f22", *st;
        long long tokens[2], in_use;
        crossed_sets(s1, s2, false, tokens);
        assert_int_equal(tick_readies(POOL, "n1", 5000, CANON_SETS_AB("10"), s1, s2, &st, &in_use), 0);
        assert_string_equal(st, "ok"); /* n1 is POOL's only node: adopted */
        assert_int_equal(tick_readies(POOL2, "n1", 5000, CANON_SETS_AB("10"), s1, s2, &st, &in_use), 0);
        assert_string_equal(st, "rules");
        freeReplyObject(release_at(5100, tokens[0], "0000000000000f01"));
        redisReply *r = set_grant(5200, s2);
        assert_string_equal(status(r), "rules");
        assert_int_equal(r->element[1]->integer, 2);
        freeReplyObject(r);
        /* What brokerd does on "rules": each part withdrawn, in each pool. */
        for (size_t i = 0; i < 2; i++) {
                pool = i == 0 ? POOL : POOL2;
                for (size_t k = 0; k < 2; k++) {
                        r = call("withdraw", "n1", 5300, 0, k == 0 ? s1 : s2, NULL);
                        assert_string_equal(field_s(body(r), 0), "withdrawn");
                        freeReplyObject(r);
                }
        }
        pool = POOL;
        r = tick_as("n1", 5400, "=");
        assert_int_equal(cache(r, C_WAITING), 0);
        freeReplyObject(r);
}

static void test_a_set_refused_by_one_pool_takes_nothing_in_the_others(void **state) {
        set_pools(1000);
        pool = POOL2;
        redisReply *r = call("drain", "n1", 2000, 0, "", "1", NULL);
        assert_string_equal(status(r), "ok");
        freeReplyObject(r);
        pool = POOL;
        r = set_submit(3000, "0000000000000c01", true);
        assert_string_equal(set_verdict(r), "refused");
        assert_int_equal(r->element[1]->integer, 2);
        assert_string_equal(field_s(body(set_reply(r, 1)), D_REASON), "drained");
        freeReplyObject(r);
        assert_int_equal(in_use_of(POOL, 4000), 0);
        /* Nothing waits in POOL either: a single request is granted there at once. */
        expect_verdict("0000000000000c02", 5000, "ci", 1, "granted");
}

/* ---- batches (brokerd/lua/batch.lua) ---- */

/* FCALLs Redis ran so far (INFO commandstats). */
static long long fcalls(void) {
        redisReply *r = redisCommand(redis, "INFO commandstats");
        assert_non_null(r);
        const char *f = strstr(r->str, "cmdstat_fcall:calls=");
        long long n = f ? atoll(f + strlen("cmdstat_fcall:calls=")) : 0;
        freeReplyObject(r);
        return n;
}

/* The settle flag of batch_as() and calls_as(): 0 (the tick completes the instant) unless a test sets it. */
static int batch_settle;

/* One FCALL of the batch function as node at now (settle batch_settle): ops is "OP", "M", M arguments, …
 * NULL; the count is theirs, or say_n when ≥ 0. An error reply is returned as it is. */
static redisReply *batch_as_n(const char *node, long long now, const char *const *ops, long say_n) {
        const char *argv[600] = { "FCALL", shared_function_batch, "1", pool, "1", node };
        char now_s[32], n_s[16];
        size_t n = 6, n_ops = 0;
        snprintf(now_s, sizeof now_s, "%lld", now);
        argv[n++] = now_s;
        argv[n++] = run_id;
        argv[n++] = batch_settle ? "1" : "0";
        argv[n++] = n_s;
        for (size_t i = 0; ops[i]; n_ops++) {
                size_t m = strtoul(ops[i + 1], NULL, 10);
                for (size_t j = 0; j < 2 + m; j++)
                        argv[n++] = ops[i + j];
                i += 2 + m;
        }
        snprintf(n_s, sizeof n_s, "%ld", say_n >= 0 ? say_n : (long) n_ops);
        redisReply *r = redisCommandArgv(redis, (int) n, argv, NULL);
        assert_non_null(r);
        return r;
}

static redisReply *batch_as(const char *node, long long now, const char *const *ops) {
        return batch_as_n(node, now, ops, -1);
}

/* The same operations one by one through call() (so FCALL and EVALSHA in turn with --alternate), their
 * replies in ret[]. */
static size_t calls_as(const char *node, long long now, const char *const *ops, redisReply **ret) {
        size_t n = 0;
        for (size_t i = 0; ops[i]; n++) {
                const char *a[10] = {};
                size_t m = strtoul(ops[i + 1], NULL, 10);
                assert_true(m <= 9);
                for (size_t j = 0; j < m; j++)
                        a[j] = ops[i + 2 + j];
                ret[n] = call(ops[i], node, now, batch_settle, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8],
                              NULL);
                i += 2 + m;
        }
        return n;
}

static bool is_stream_id(const redisReply *r) {
        return r->type == REDIS_REPLY_STRING && r->len > 2 && strspn(r->str, "0123456789-") == r->len &&
               strchr(r->str, '-');
}

/* Equal replies, but for stream ids (XADD's, from Redis's clock). */
static void assert_same_reply(const redisReply *a, const redisReply *b, const char *where) {
        if (is_stream_id(a) && is_stream_id(b))
                return;
        if (a->type != b->type)
                fail_msg("%s: type %d, not %d", where, b->type, a->type);
        if (a->type == REDIS_REPLY_INTEGER && a->integer != b->integer)
                fail_msg("%s: %lld, not %lld", where, b->integer, a->integer);
        if ((a->type == REDIS_REPLY_STRING || a->type == REDIS_REPLY_STATUS) &&
            (a->len != b->len || memcmp(a->str, b->str, a->len) != 0))
                fail_msg("%s: \"%s\", not \"%s\"", where, b->str, a->str);
        if (a->type == REDIS_REPLY_ARRAY) {
                if (a->elements != b->elements)
                        fail_msg("%s: %zu elements, not %zu", where, b->elements, a->elements);
                for (size_t i = 0; i < a->elements; i++) {
                        char w[256];
                        snprintf(w, sizeof w, "%s[%zu]", where, i);
                        assert_same_reply(a->element[i], b->element[i], w);
                }
        }
}

static bool is_status(const redisReply *r, const char *what) {
        return r->type == REDIS_REPLY_STRING && strcmp(r->str, what) == 0;
}

/* assert_same_reply() of two replies of 6, element by element, but for their caches. */
static void assert_same_reply_but_cache(const redisReply *one, const redisReply *b, const char *where) {
        for (size_t i = 0; i < 6; i++) {
                char w[256];
                snprintf(w, sizeof w, "%s[%zu]", where, i);
                if (i != R_CACHE)
                        assert_same_reply(one->element[i], b->element[i], w);
        }
}

/* A batch's reply against the same operation's own (assert_same_reply()), but for the cache ([4]) of an
 * operation whose next one carries the state on: {} there, left to the last reply of that run (README,
 * "Batches"), whose stream_last then says what the run appended last (*appended: whether an operation of the
 * run so far did, where its cache was left; the caller starts it false). Returns whether the cache was left. */
static bool assert_same_batch_reply(const redisReply *one, const redisReply *b, bool last, const char *where,
                                    bool *appended) {
        bool arrays = one->type == REDIS_REPLY_ARRAY && b->type == REDIS_REPLY_ARRAY && one->elements == 6 &&
                      b->elements == 6;
        const redisReply *oc = arrays ? one->element[R_CACHE] : NULL, *bc = arrays ? b->element[R_CACHE] : NULL;
        if (!last && arrays && bc->type == REDIS_REPLY_NIL && oc->type == REDIS_REPLY_ARRAY && oc->elements > 0) {
                if (!is_status(b->element[R_STATUS], "ok") && !is_status(b->element[R_STATUS], "invalid"))
                        fail_msg("%s: a \"%s\" reply, which ends the batch, left its cache", where,
                                 b->element[R_STATUS]->str);
                assert_same_reply_but_cache(one, b, where);
                *appended = *appended || is_stream_id(oc->element[C_STREAM_LAST]);
                return true;
        }
        if (*appended && arrays && oc->elements > C_STREAM_LAST && bc->elements == oc->elements &&
            !is_stream_id(oc->element[C_STREAM_LAST])) {
                /* This operation appended nothing, an earlier one of the run did: the cache says its entry. */
                if (!is_stream_id(bc->element[C_STREAM_LAST]))
                        fail_msg("%s: the run's cache does not say its last stream entry", where);
                assert_same_reply_but_cache(one, b, where);
                for (size_t j = 0; j < oc->elements; j++) {
                        char w[256];
                        snprintf(w, sizeof w, "%s[%d][%zu]", where, R_CACHE, j);
                        if (j != C_STREAM_LAST)
                                assert_same_reply(oc->element[j], bc->element[j], w);
                }
        } else
                assert_same_reply(one, b, where);
        *appended = false;
        return false;
}

/* Everything of the pool under prefix, as text: each key (the prefix taken off, in name order) with its
 * content (hash fields, set members in order; zset members with scores; strings byte for byte; stream
 * entries without their ids, which are Redis's clock), and the clock hash without last_time (Redis's TIME).
 * Two pools that went through the same decisions have the same text. */
static int strcmp_p(const void *a, const void *b) {
        return strcmp(*(char *const *) a, *(char *const *) b);
}

static char *pool_dump(const char *prefix) {
        char *text = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&text, &size);
        assert_non_null(f);
        redisReply *keys = redisCommand(redis, "KEYS %s*", prefix);
        assert_non_null(keys);
        char **names = calloc(keys->elements + 1, sizeof *names);
        assert_non_null(names);
        for (size_t i = 0; i < keys->elements; i++)
                names[i] = keys->element[i]->str;
        qsort(names, keys->elements, sizeof *names, strcmp_p);
        for (size_t i = 0; i < keys->elements; i++) {
                const char *key = names[i];
                bool clock = strcmp(key + strlen(prefix), ":clock") == 0;
                redisReply *t = redisCommand(redis, "TYPE %s", key);
                fprintf(f, "%s %s:", key + strlen(prefix), t->str);
                redisReply *v = NULL;
                if (strcmp(t->str, "hash") == 0 || strcmp(t->str, "set") == 0) {
                        bool hash = t->str[0] == 'h';
                        v = redisCommand(redis, hash ? "HGETALL %s" : "SMEMBERS %s", key);
                        size_t step = hash ? 2 : 1, n = v->elements / step;
                        char **items = calloc(n + 1, sizeof *items);
                        assert_non_null(items);
                        for (size_t j = 0; j < n; j++) {
                                const redisReply *k = v->element[j * step];
                                if (clock && strcmp(k->str, "last_time") == 0)
                                        continue;
                                /* Values may hold any byte (cmsgpack): hex. */
                                char *item = NULL;
                                size_t item_size = 0;
                                FILE *g = open_memstream(&item, &item_size);
                                fprintf(g, "%s", k->str);
                                if (hash) {
                                        fputc('=', g);
                                        const redisReply *x = v->element[j * 2 + 1];
                                        for (size_t b = 0; b < x->len; b++)
                                                fprintf(g, "%02x", (unsigned char) x->str[b]);
                                }
                                fclose(g);
                                items[j] = item;
                        }
                        size_t m = 0;
                        for (size_t j = 0; j < n; j++)
                                if (items[j])
                                        items[m++] = items[j];
                        qsort(items, m, sizeof *items, strcmp_p);
                        for (size_t j = 0; j < m; j++) {
                                fprintf(f, " %s", items[j]);
                                free(items[j]);
                        }
                        free(items);
                } else if (strcmp(t->str, "zset") == 0) {
                        v = redisCommand(redis, "ZRANGE %s 0 -1 WITHSCORES", key);
                        for (size_t j = 0; j < v->elements; j++)
                                fprintf(f, " %s", v->element[j]->str);
                } else if (strcmp(t->str, "string") == 0) {
                        v = redisCommand(redis, "GET %s", key);
                        for (size_t b = 0; b < v->len; b++)
                                fprintf(f, "%02x", (unsigned char) v->str[b]);
                } else if (strcmp(t->str, "stream") == 0) {
                        v = redisCommand(redis, "XRANGE %s - +", key);
                        for (size_t j = 0; j < v->elements; j++) {
                                const redisReply *fields = v->element[j]->element[1];
                                fputs(" {", f);
                                for (size_t k = 0; k < fields->elements; k++)
                                        fprintf(f, " %s", fields->element[k]->str);
                                fputs(" }", f);
                        }
                } else
                        fail_msg("%s: a key of type %s", key, t->str);
                fputc('\n', f);
                freeReplyObject(v);
                freeReplyObject(t);
        }
        free(names);
        freeReplyObject(keys);
        fclose(f);
        return text;
}

static void assert_same_pools(const char *a, const char *b) {
        char *x = pool_dump(a), *y = pool_dump(b);
        if (strcmp(x, y) != 0)
                fail_msg("the pools differ:\n%s\n---\n%s", x, y);
        free(x);
        free(y);
}

/* Issue 21 item 2: a batch is one FCALL, and each of its operations answers what it answers alone, in
 * order (grants, a queueing, a refusal, an invalid lane — which does not stop the batch —, a release that
 * hands on, a withdrawal, a retried rid, a heartbeat). */
static void test_a_batch_answers_as_its_operations_one_by_one(void **state) {
        static const char *const ops[] = {
                "submit", "8", "a", "ci", "1", "1", "0", "-1", "-1", "-",
                "submit", "8", "b", "ci", "1", "1", "0", "-1", "-1", "-",
                "submit", "8", "c", "ci", "1", "1", "0", "-1", "-1", "-",
                "submit", "8", "d", "ci", "1", "0", "0", "-1", "-1", "-",
                "submit", "8", "e", "nope", "1", "1", "0", "-1", "-1", "-",
                "release", "2", "1", "a",
                "submit", "8", "f", "ci", "2", "1", "0", "-1", "-1", "-",
                "withdraw", "1", "f",
                "submit", "8", "b", "ci", "1", "1", "0", "-1", "-1", "-",
                "tick", "9", "n1", "=", "0", "0", "0", "-", "epoch1", "1", "",
                NULL,
        };
        redisReply *one[16];

        tick_ok("n1", 1000, CANON_ONE_LANE "limit=2\n");
        size_t n = calls_as("n1", 2000, ops, one);
        assert_string_equal(status(one[4]), "invalid");

        pool = "{sb:q}";
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=2\n");
        long long before = fcalls();
        redisReply *b = batch_as("n1", 2000, ops);
        assert_int_equal(fcalls() - before, 1);
        if (b->type == REDIS_REPLY_ERROR)
                fail_msg("batch: %s", b->str);
        assert_int_equal(b->type, REDIS_REPLY_ARRAY);
        assert_int_equal(b->elements, n);
        size_t left = 0;
        bool appended = false;
        for (size_t i = 0; i < n; i++) {
                char w[32];
                snprintf(w, sizeof w, "reply %zu", i);
                left += assert_same_batch_reply(one[i], b->element[i], i + 1 == n, w, &appended);
                freeReplyObject(one[i]);
        }
        /* Every submit, release and withdrawal followed by one of those left its cache to it: all but the
         * last submit (a tick follows, which reads the state afresh) and the tick. */
        assert_int_equal(left, n - 2);
        assert_int_not_equal(b->element[n - 2]->element[R_CACHE]->elements, 0);
        freeReplyObject(b);
        assert_same_pools(POOL, "{sb:q}");
}

/* The cache a carried run's last reply has says what the whole run appended to the caller's stream
 * (stream_last): brokerd counts the pool settled only once it has read its stream that far.
 * Here a release hands its slot on to this node's waiter (an entry in n1's stream), and the submit after it
 * in the run appends nothing. */
static void test_a_batch_run_says_its_last_stream_entry(void **state) {
        static const char *const first[] = {
                "submit", "8", "a", "ci", "1", "1", "0", "-1", "-1", "-",
                "submit", "8", "w", "ci", "1", "1", "0", "-1", "-1", "-",
                NULL,
        };
        char token[24];

        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\n");
        batch_settle = 1;
        redisReply *b = batch_as("n1", 2000, first);
        assert_int_equal(b->elements, 2);
        assert_string_equal(field_s(body(b->element[0]), D_VERDICT), "granted");
        assert_string_equal(field_s(body(b->element[1]), D_VERDICT), "queued");
        snprintf(token, sizeof token, "%lld", field_i(body(b->element[0]), D_TOKEN));
        freeReplyObject(b);

        const char *const second[] = {
                "release", "2", token, "a",
                "submit", "8", "x", "ci", "1", "0", "0", "-1", "-1", "-",
                NULL,
        };
        b = batch_as("n1", 3000, second);
        batch_settle = 0;
        assert_int_equal(b->elements, 2);
        assert_int_equal(b->element[0]->element[R_CACHE]->elements, 0); /* left to the submit's reply */
        assert_string_equal(field_s(body(b->element[1]), D_VERDICT), "refused");
        redisReply *last = redisCommand(redis, "XREVRANGE %s:s:n1 + - COUNT 1", POOL);
        assert_non_null(last);
        assert_int_equal(last->elements, 1);
        assert_string_equal(cache_s(b->element[1], C_STREAM_LAST), last->element[0]->element[0]->str);
        freeReplyObject(last);
        freeReplyObject(b);
}

/* Runs ops one by one in POOL, then as one batch in "{sb:q}", with the same replies (compared) and the same
 * keys left (compared), from a tick at 1000 with canon; batches: each { now, ops }. */
struct batch_step {
        long long now;
        const char *const *ops;
};

static void batches_as_one_by_one(const char *canon, const struct batch_step *steps, size_t n_steps) {
        for (int form = 0; form < 2; form++) {
                pool = form == 0 ? POOL : "{sb:q}";
                tick_ok("n1", 1000, canon);
        }
        for (size_t s = 0; s < n_steps; s++) {
                redisReply *one[16];
                pool = POOL;
                size_t n = calls_as("n1", steps[s].now, steps[s].ops, one);
                pool = "{sb:q}";
                redisReply *b = batch_as("n1", steps[s].now, steps[s].ops);
                if (b->type == REDIS_REPLY_ERROR)
                        fail_msg("batch %zu: %s", s, b->str);
                assert_int_equal(b->type, REDIS_REPLY_ARRAY);
                assert_int_equal(b->elements, n);
                bool appended = false;
                for (size_t i = 0; i < n; i++) {
                        char w[48];
                        snprintf(w, sizeof w, "batch %zu reply %zu", s, i);
                        (void) assert_same_batch_reply(one[i], b->element[i], i + 1 == n, w, &appended);
                        freeReplyObject(one[i]);
                }
                freeReplyObject(b);
                assert_same_pools(POOL, "{sb:q}");
        }
}

/* A batch's operations carry meta, the rules, the clock, the lane counters, the fingerprints and the
 * queue's heads from one to the next and write them once, at its end (README, "Batches"): what it leaves
 * in Redis is what the same operations leave one by one, key for key, and they answer the same — here with
 * the instant settled by each operation (settle 1): grants at once, queueing with and without a budget,
 * releases that hand on, withdrawals (of a waiter with a budget too), budgets that run out at the first
 * operation of a later batch, a refusal, an invalid lane, a retried rid, and a heartbeat in the middle (which reads meta and the
 * fingerprints back: written before it). */
static void test_a_batch_leaves_the_keys_its_operations_leave_one_by_one(void **state) {
        static const char *const b1[] = {
                "submit", "8", "a", "ci", "1", "1", "0", "-1", "-1", "-",
                "submit", "8", "b", "ci", "1", "1", "0", "-1", "-1", "-",
                "submit", "8", "c", "ci", "1", "1", "0", "-1", "5000000", "-",
                "submit", "8", "d", "ci", "1", "1", "0", "-1", "-1", "-",
                "submit", "8", "e", "ci", "2", "1", "0", "-1", "1000000", "-",
                "release", "2", "1", "a",
                "withdraw", "1", "d",
                "submit", "8", "f", "ci", "1", "1", "0", "-1", "2000000", "-",
                "submit", "8", "x", "nope", "1", "1", "0", "-1", "-1", "-",
                NULL,
        };
        static const char *const b2[] = {
                "submit", "8", "g", "ci", "1", "0", "0", "-1", "-1", "-",
                "release", "2", "2", "b",
                "submit", "8", "c", "ci", "1", "1", "0", "-1", "5000000", "-",
                "tick", "9", "n1", "=", "0", "0", "0", "-", "epoch1", "1", "",
                "submit", "8", "h", "ci", "1", "1", "0", "-1", "1000000", "-",
                "withdraw", "1", "zz",
                "release", "2", "99", "b",
                NULL,
        };
        static const char *const b3[] = {
                "release", "2", "3", "c",
                "release", "2", "4", "f",
                "submit", "8", "i", "ci", "1", "1", "0", "-1", "-1", "-",
                "submit", "8", "j", "ci", "2", "1", "0", "-1", "-1", "-",
                "release", "2", "5", "i",
                "withdraw", "1", "j",
                "submit", "8", "k", "ci", "2", "1", "0", "-1", "9000000", "-",
                "submit", "8", "l", "ci", "1", "1", "0", "-1", "9000000", "-",
                "withdraw", "1", "k",
                "release", "2", "6", "j",
                NULL,
        };
        const struct batch_step steps[] = { { 2000, b1 }, { 3500000, b2 }, { 10000000, b3 } };
        batch_settle = 1;
        batches_as_one_by_one(CANON_ONE_LANE "limit=2\n", steps, sizeof steps / sizeof steps[0]);
        batch_settle = 0;
}

/* Issue 21 item 2: a submit granted at once and a release in a batch after its first operation run a
 * handful of commands (the pool's state, rules and clock read once a batch, the instant's scans skipped when
 * nothing is due): before, ~42 and ~37 an operation. Counted by Redis (INFO commandstats). */
static long long script_commands(void) {
        redisReply *r = redisCommand(redis, "INFO commandstats");
        assert_non_null(r);
        long long n = 0;
        for (const char *p = r->str; (p = strstr(p, "cmdstat_")); p++) {
                const char *c = strstr(p, ":calls=");
                if (strncmp(p, "cmdstat_fcall:", 14) != 0 && strncmp(p, "cmdstat_info:", 13) != 0 &&
                    strncmp(p, "cmdstat_config", 14) != 0)
                        n += atoll(c + strlen(":calls="));
        }
        freeReplyObject(r);
        return n;
}

static void test_a_batch_reads_the_pools_state_once(void **state) {
        const char *ops[8 * 10 + 1], *rel[8 * 4 + 1];
        char rids[8][8], tokens[8][24];
        size_t n = 0, m = 0;

        tick_ok("n1", 1000, CANON_ONE_LANE "limit=64\n");
        batch_settle = 1;
        for (int i = 0; i < 8; i++) {
                snprintf(rids[i], sizeof rids[i], "r%d", i);
                const char *a[] = { "submit", "8", rids[i], "ci", "1", "1", "0", "-1", "-1", "-" };
                memcpy(ops + n, a, sizeof a);
                n += 10;
        }
        ops[n] = NULL;
        freeReplyObject(redisCommand(redis, "CONFIG RESETSTAT"));
        redisReply *b = batch_as("n1", 2000, ops);
        long long submits = script_commands();
        assert_int_equal(b->elements, 8);
        for (int i = 0; i < 8; i++) {
                assert_string_equal(field_s(body(b->element[i]), D_VERDICT), "granted");
                snprintf(tokens[i], sizeof tokens[i], "%lld", field_i(body(b->element[i]), D_TOKEN));
                const char *a[] = { "release", "2", tokens[i], rids[i] };
                memcpy(rel + m, a, sizeof a);
                m += 4;
        }
        rel[m] = NULL;
        freeReplyObject(b);
        freeReplyObject(redisCommand(redis, "CONFIG RESETSTAT"));
        b = batch_as("n1", 3000, rel);
        long long releases = script_commands();
        for (int i = 0; i < 8; i++)
                assert_string_equal(field_s(body(b->element[i]), 0), "released");
        freeReplyObject(b);
        batch_settle = 0;
        if (submits > 8 * 16 || releases > 8 * 13)
                fail_msg("commands: 8 submits %lld (at most %d), 8 releases %lld (at most %d)", submits, 8 * 16,
                         releases, 8 * 13);
}

static long long rid_known(const char *node_rid) {
        redisReply *r = redisCommand(redis, "HEXISTS %s:rid %s", pool, node_rid);
        assert_non_null(r);
        long long v = r->integer;
        freeReplyObject(r);
        return v;
}

/* An operation that does not answer "ok" (here "settling": 100 expiries at one instant, more than a call's
 * budget) stops the batch there: the ones after it are not run, and the node sends them again. A malformed
 * batch runs nothing. */
static void test_a_batch_stops_where_an_operation_does_not_answer_ok(void **state) {
        static const char *const late[] = {
                "submit", "8", "late1", "ci", "1", "1", "0", "-1", "-1", "-",
                "submit", "8", "late2", "ci", "1", "1", "0", "-1", "-1", "-",
                NULL,
        };
        char rid[16];

        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\n");
        expect_verdict("a", 1000, "ci", 1, "granted");
        for (int i = 0; i < 100; i++) {
                snprintf(rid, sizeof rid, "w%03d", i);
                freeReplyObject(submit_at(1000, rid, "ci", 1, true, 5 * SEC));
        }
        tick_ok("n1", 1000, "=");
        redisReply *b = batch_as("n1", 10 * SEC, late);
        assert_int_equal(b->type, REDIS_REPLY_ARRAY);
        assert_int_equal(b->elements, 1);
        assert_string_equal(b->element[0]->element[R_STATUS]->str, "settling");
        assert_int_equal(rid_known("n1:late2"), 0);
        freeReplyObject(b);
        for (int calls = 0;; calls++) {
                assert_true(calls < 10);
                b = batch_as("n1", 10 * SEC, late);
                assert_int_equal(b->type, REDIS_REPLY_ARRAY);
                bool done = b->elements == 2;
                if (done) {
                        assert_string_equal(field_s(b->element[0]->element[R_BODY], D_VERDICT), "queued");
                        assert_string_equal(field_s(b->element[1]->element[R_BODY], D_VERDICT), "queued");
                }
                freeReplyObject(b);
                if (done)
                        break;
        }

        /* Malformed: a count of more operations than it carries, arguments left over, an operation that
         * does not go in a batch, a count of none or above the bound. */
        static const char *const z[] = { "submit", "8", "z", "ci", "1", "1", "0", "-1", "-1", "-",
                                         "submit", "8", "z2", "ci", "1", "1", "0", "-1", "-1", "-", NULL };
        static const char *const zp[] = { "submit", "8", "z", "ci", "1", "1", "0", "-1", "-1", "-",
                                          "positions", "2", "pos", "z", NULL };
        const struct { const char *const *ops; long n; } bad[] = { { z, 3 }, { z, 1 }, { zp, -1 }, { z, 0 },
                                                                    { z, 17 } };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                b = batch_as_n("n1", 11 * SEC, bad[i].ops, bad[i].n);
                assert_int_equal(b->type, REDIS_REPLY_ERROR);
                freeReplyObject(b);
                assert_int_equal(rid_known("n1:z"), 0);
        }
}

/* ---- cooldown (issue 23 item 5; brokerd/lua/README, "Cooldown") ---- */

#define CANON_COOL CANON_ONE_LANE "cooldown=5000\n"

static bool has_notice(const redisReply *r, const char *kind, const char *what) {
        const redisReply *n = r->element[R_NOTICES];
        for (size_t i = 0; i < n->elements; i++)
                if (strcmp(n->element[i]->element[0]->str, kind) == 0 &&
                    strcmp(n->element[i]->element[1]->str, what) == 0)
                        return true;
        return false;
}

static bool has_notice_kind(const redisReply *r, const char *kind) {
        const redisReply *n = r->element[R_NOTICES];
        for (size_t i = 0; i < n->elements; i++)
                if (strcmp(n->element[i]->element[0]->str, kind) == 0)
                        return true;
        return false;
}

static void redis_do(const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        redisReply *r = redisvCommand(redis, fmt, ap);
        va_end(ap);
        assert_non_null(r);
        assert_int_not_equal(r->type, REDIS_REPLY_ERROR);
        freeReplyObject(r);
}

static void test_a_released_slot_rests_until_its_end_and_is_the_next_wakeup(void **state) {
        tick_ok("n1", 1000, CANON_COOL "limit=1\n");
        redisReply *a = submit_at(1000, "a", "ci", 1, true, -1);
        long long token = field_i(body(a), D_TOKEN);
        freeReplyObject(a);
        tick_ok("n1", 1000, "=");
        expect_verdict("b", 2000, "ci", 1, "queued");
        tick_ok("n1", 2000, "=");
        redisReply *r = release_at(3000, token, "a");
        assert_int_equal(cache(r, C_IN_USE), 0);
        /* The cache lists it for every node's Status: { identity, end }. */
        const redisReply *rests = r->element[R_CACHE]->element[12];
        assert_int_equal(rests->elements, 2);
        assert_string_equal(rests->element[0]->str, "#0");
        assert_string_equal(rests->element[1]->str, "8000");
        freeReplyObject(r);
        r = tick_as("n1", 3000, "=");
        assert_int_equal(n_events(r), 0);
        assert_int_equal(cache(r, C_NEXT_WAKEUP), 8000); /* every node's timer: the rest's end */
        freeReplyObject(r);
        r = tick_as("n1", 7999, "=");
        assert_int_equal(n_events(r), 0);                    /* neither free nor held */
        freeReplyObject(r);
        r = tick_as("n1", 8000, "=");
        assert_int_equal(n_events(r), 1);
        assert_string_equal(field_s(event(r, 0), D_VERDICT), "granted");
        assert_string_equal(field_s(event(r, 0), D_RID), "b");
        assert_int_equal(field_i(event(r, 0), D_AT), 8000);
        assert_int_equal(r->element[R_CACHE]->element[12]->elements, 0);
        freeReplyObject(r);
        /* A pool without cooldown= lists no rests, and reads none (an empty 13th cache element). */
        pool = "{sb:q}";
        r = tick_as("n1", 9000, CANON_ONE_LANE "limit=1\n");
        assert_int_equal(r->element[R_CACHE]->elements, 15);
        assert_int_equal(r->element[R_CACHE]->element[12]->elements, 0);
        freeReplyObject(r);
}

static void test_a_fail_fast_request_is_told_when_the_rest_ends(void **state) {
        tick_ok("n1", 1000, CANON_COOL "limit=2\n");
        redisReply *a = submit_at(1000, "a", "ci", 1, true, -1);
        long long ta = field_i(body(a), D_TOKEN);
        freeReplyObject(a);
        redisReply *b = submit_at(1000, "b", "ci", 1, true, -1);
        long long tb = field_i(body(b), D_TOKEN);
        freeReplyObject(b);
        tick_ok("n1", 1000, "=");
        freeReplyObject(release_at(2000, ta, "a"));          /* rests until 7000 */
        freeReplyObject(release_at(3000, tb, "b"));          /* rests until 8000 */
        tick_ok("n1", 3000, "=");
        redisReply *r = submit_at(4000, "c", "ci", 2, false, -1);
        assert_string_equal(field_s(body(r), D_VERDICT), "refused");
        assert_string_equal(field_s(body(r), D_REFUSAL), "busy");
        assert_string_equal(field_s(body(r), D_REASON), "cooldown");
        assert_int_equal(body(r)->elements, 15);
        assert_int_equal(body(r)->element[14]->integer, 8000); /* when the second of them ends */
        freeReplyObject(r);
}

/* Hostile content of the rest key: a real rest's end made huge, a "rest" of a held slot and of nothing,
 * one in the past: each is ended at its first wake and reported; none frees a held slot or parks one. */
static void test_garbage_rests_are_ended_and_reported_never_granted_twice(void **state) {
        tick_ok("n1", 1000, CANON_COOL "limit=3\n");
        redisReply *a = submit_at(1000, "a", "ci", 1, true, -1);
        long long ta = field_i(body(a), D_TOKEN);
        freeReplyObject(a);
        tick_ok("n1", 1000, "=");
        freeReplyObject(release_at(2000, ta, "a"));          /* #0 rests until 7000 */
        expect_verdict("b", 2000, "ci", 1, "granted");       /* #1 */
        tick_ok("n1", 2000, "=");
        redis_do("ZADD " POOL ":rest 1e300 #0");             /* the real rest, made endless */
        redis_do("ZADD " POOL ":rest -5 #1");                /* a held slot */
        redis_do("ZADD " POOL ":rest 5000 nonesuch");
        redisReply *r = tick_as("n1", 2500, "=");
        assert_true(has_notice(r, "bad-rest", "#0"));
        assert_true(has_notice(r, "bad-rest", "#1"));
        freeReplyObject(r);
        /* #0 is free again, #1 still held (never handed out twice), #2 free. */
        redisReply *c = submit_at(2500, "c", "ci", 2, true, -1);
        assert_string_equal(field_s(body(c), D_VERDICT), "granted");
        assert_int_equal(body(c)->element[D_SLOTS]->element[0]->integer, 0);
        assert_int_equal(body(c)->element[D_SLOTS]->element[1]->integer, 2);
        freeReplyObject(c);
        expect_verdict("d", 2500, "ci", 1, "queued");
        r = tick_as("n1", 5000, "=");
        assert_true(has_notice(r, "bad-rest", "nonesuch"));
        assert_int_equal(n_events(r), 0);
        freeReplyObject(r);
        assert_int_equal(meta_number("meta", "resting_free"), 0);
        /* A key of another type is deleted and reported; the next rest is kept as usual. */
        redis_do("DEL " POOL ":rest");
        redis_do("SET " POOL ":rest garbage");
        r = release_at(6000, 0, "nobody");                   /* a release that frees nothing */
        assert_true(has_notice(r, "bad-rest", "?"));
        freeReplyObject(r);
}

#define CANON_COOL_MEMBERS CANON_COOL "limit=2\nmembers=alpha,beta\n"

/* A member drained while it rests, and undrained: it rests on (neither free nor counted twice); one whose rest
 * ends while drained is free at its undrain (pool-local.c counts them so: drained_free, resting_free). */
static void test_a_resting_member_drained_and_undrained_keeps_the_books(void **state) {
        tick_ok("n1", 1000, CANON_COOL_MEMBERS);
        redisReply *a = submit_at(1000, "a", "ci", 1, true, -1);
        assert_string_equal(body(a)->element[D_MEMBERS]->element[0]->str, "alpha");
        long long ta = field_i(body(a), D_TOKEN);
        freeReplyObject(a);
        tick_ok("n1", 1000, "=");
        freeReplyObject(release_at(2000, ta, "a"));           /* alpha rests until 7000 */
        freeReplyObject(call("drain", "n1", 3000, 0, "alpha", "1", NULL));
        assert_int_equal(meta_number("meta", "drained_free"), 1);
        assert_int_equal(meta_number("meta", "resting_free"), 0);
        freeReplyObject(call("drain", "n1", 4000, 0, "alpha", "0", NULL));
        assert_int_equal(meta_number("meta", "drained_free"), 0);
        assert_int_equal(meta_number("meta", "resting_free"), 1);
        redisReply *b = submit_at(4000, "b", "ci", 1, true, -1);
        assert_string_equal(body(b)->element[D_MEMBERS]->element[0]->str, "beta");
        freeReplyObject(b);
        expect_verdict("c", 4000, "ci", 1, "queued");
        redisReply *r = tick_as("n1", 6999, "=");
        assert_int_equal(n_events(r), 0);
        freeReplyObject(r);
        r = tick_as("n1", 7000, "=");
        assert_int_equal(n_events(r), 1);
        assert_string_equal(event(r, 0)->element[D_MEMBERS]->element[0]->str, "alpha");
        long long tc = field_i(event(r, 0), D_TOKEN);
        freeReplyObject(r);
        assert_int_equal(meta_number("meta", "resting_free"), 0);
        /* Its rest ends while it is drained: free at the undrain, not before. */
        freeReplyObject(release_at(8000, tc, "c"));           /* alpha rests until 13000 */
        freeReplyObject(call("drain", "n1", 8000, 0, "alpha", "1", NULL));
        tick_ok("n1", 13000, "=");
        assert_int_equal(meta_number("meta", "drained_free"), 1);
        assert_int_equal(meta_number("meta", "resting_free"), 0);
        expect_verdict("d", 13000, "ci", 1, "queued");
        freeReplyObject(call("drain", "n1", 14000, 0, "alpha", "0", NULL));
        r = tick_as("n1", 14000, "=");
        assert_int_equal(n_events(r), 1);
        assert_string_equal(field_s(event(r, 0), D_RID), "d");
        freeReplyObject(r);
}

/* A dead node's lease ends with its reap: its slot rests as one released (from the reaping call's now), and the
 * waiter of another node gets it at the rest's end, not at the reap. */
static void test_a_dead_nodes_slot_rests_from_its_reap(void **state) {
        tick_ok("n1", 1000, CANON_COOL "limit=1\n");
        tick_ok("n2", 1000, CANON_COOL "limit=1\n");
        redisReply *a = call("submit", "n2", 1000, 0, "a", "ci", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(field_s(body(a), D_VERDICT), "granted");
        freeReplyObject(a);
        expect_verdict("mine", 2000, "ci", 1, "queued");
        tick_ok("n1", 2000, "=");
        tick_ok("n1", 20 * SEC, "=");
        /* n2's deadline is 1000 + 30 s: n1's tick at 31 s reaps it, and the slot rests until 31 s + 5000. */
        redisReply *r = tick_as("n1", 31 * SEC, "=");
        assert_int_equal(r->element[R_NOTICES]->elements, 1);
        assert_string_equal(r->element[R_NOTICES]->element[0]->element[0]->str, "node-expired");
        assert_int_equal(n_events(r), 0);
        assert_int_equal(cache(r, C_NEXT_WAKEUP), 31 * SEC + 5000);
        freeReplyObject(r);
        r = tick_as("n1", 31 * SEC + 5000, "=");
        assert_int_equal(n_events(r), 1);
        assert_string_equal(field_s(event(r, 0), D_RID), "mine");
        assert_int_equal(field_i(event(r, 0), D_AT), 31 * SEC + 5000);
        freeReplyObject(r);
}

/* Rolling change (brokerd.conf(5), "Upgrading a fleet"): cooldown= is a rule like any, adopted only when every
 * live node wants it; meanwhile the node that wants it is answered "rules" naming the key, and the pool
 * rests nothing. Adopted, the next release rests. */
static void test_cooldown_is_adopted_only_when_every_node_wants_it(void **state) {
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\n");
        tick_ok("n2", 1000, CANON_ONE_LANE "limit=1\n");
        redisReply *t = tick_as("n2", 2000, CANON_COOL "limit=1\n");
        assert_string_equal(status(t), "rules");
        assert_int_equal(body(t)->element[4]->elements, 1);
        assert_string_equal(body(t)->element[4]->element[0]->str, "cooldown");
        freeReplyObject(t);
        redisReply *a = submit_at(2000, "a", "ci", 1, true, -1);
        long long ta = field_i(body(a), D_TOKEN);
        freeReplyObject(a);
        redisReply *r = release_at(3000, ta, "a");
        assert_int_equal(r->element[R_CACHE]->element[12]->elements, 0); /* no cooldown: nothing rests */
        freeReplyObject(r);
        expect_verdict("b", 3000, "ci", 1, "granted");
        t = tick_as("n1", 4000, CANON_COOL "limit=1\n");
        assert_string_equal(status(t), "ok");
        freeReplyObject(t);
        redisReply *canon = redisCommand(redis, "HGET %s:rules canon", pool);
        assert_int_equal(canon->type, REDIS_REPLY_STRING);
        assert_non_null(strstr(canon->str, "\ncooldown="));
        freeReplyObject(canon);
        tick_ok("n2", 4000, "=");
}

/* ---- hostile writes to the members' lives (README, "Members' lives", "Health lanes", "Drains with a reason",
 * "Cooldown", "Selectors"): anything in Redis written by someone else is untrusted input ---- */

#define CANON_HOSTILE CANON_ONE_LANE "cooldown=5000\nlane.hc.health=1\nlane.hc.max-in-use=-1\nlane.hc.priority=0\n" \
        "lane.hc.reserve=0\nlimit=3\nmembers=alpha,beta,gamma\nquarantine-after=2\nquarantine-exit-codes=3\n"

/* One hostile write: up to three commands, split on spaces; "$W" / "$H" the wids of the waiters w (ordinary)
 * and h1 (health), "$A" the token of a's lease, "$BIG" a 1 MiB string. "REC KEY FIELD INDEX TYPE VALUE" sets
 * element INDEX of the cmsgpack'd record KEY FIELD (TYPE n: a number, s: a string, t: a table, x: nil). notice:
 * a notice kind some call of the run must report (the contract's "counted as bad input"), or NULL: then no call
 * may report "bad-key" (garbage the scripts repaired: a row without one has nothing to repair). */
struct hostile_write {
        const char *cmd[3];
        const char *notice;
};

static const struct hostile_write hostile_writes[] = {
        /* {sb:P}:qm, the quarantines */
        { { "DEL {sb:p}:qm", "SET {sb:p}:qm junk" }, "bad-key" },
        { { "DEL {sb:p}:qm", "ZADD {sb:p}:qm 1 gamma" }, "bad-key" },
        { { "HSET {sb:p}:qm alpha $BIG" } },
        { { "HSET {sb:p}:qm gamma \xc1\xff" } },
        { { "HSET {sb:p}:qm nobody 1", "HSET {sb:p}:qm $BIG 1" } },
        /* {sb:P}:qf, the failure counts */
        { { "DEL {sb:p}:qf", "SADD {sb:p}:qf beta" }, "bad-key" },
        { { "HSET {sb:p}:qf alpha nan", "HSET {sb:p}:qf beta -5" } },
        { { "HSET {sb:p}:qf alpha 1e308", "HSET {sb:p}:qf beta 99999999999999999" } },
        { { "HSET {sb:p}:qf alpha $BIG", "HSET {sb:p}:qf nobody 7" } },
        /* {sb:P}:hq, the health waiters */
        { { "DEL {sb:p}:hq", "SET {sb:p}:hq junk" }, "bad-key" },
        { { "DEL {sb:p}:hq", "HSET {sb:p}:hq $H 0" }, "bad-key" },
        { { "ZADD {sb:p}:hq 0 $W" }, "bad-key" },
        { { "ZADD {sb:p}:hq -inf nonesuch", "ZADD {sb:p}:hq 0 $BIG" }, "bad-key" },
        { { "ZREM {sb:p}:hq $H" }, "bad-key" },
        /* {sb:P}:dr and :du, the drains */
        { { "DEL {sb:p}:dr", "SET {sb:p}:dr junk" }, "bad-key" },
        { { "DEL {sb:p}:dr", "ZADD {sb:p}:dr 1 beta" }, "bad-key" },
        { { "HSET {sb:p}:dr beta $BIG", "HSET {sb:p}:dr alpha \xc1", "HSET {sb:p}:dr $BIG x" }, "bad-key" },
        { { "DEL {sb:p}:du", "SET {sb:p}:du junk" }, "bad-key" },
        { { "DEL {sb:p}:du", "HSET {sb:p}:du beta 5000" }, "bad-key" },
        { { "ZADD {sb:p}:du -inf beta" }, "bad-key" },
        { { "ZADD {sb:p}:du +inf beta" }, "bad-key" },
        { { "ZADD {sb:p}:du 1e308 beta", "ZADD {sb:p}:du -1e308 nobody" }, "bad-key" },
        { { "ZADD {sb:p}:du 1500 alpha", "ZADD {sb:p}:du 1500 \"\"" } },
        { { "ZADD {sb:p}:du -5 $BIG" }, "bad-key" },
        /* {sb:P}:rest, the rests */
        { { "ZADD {sb:p}:rest +inf beta", "ZADD {sb:p}:rest -inf alpha" }, "bad-rest" },
        { { "ZADD {sb:p}:rest 1e308 gamma", "ZADD {sb:p}:rest 0 $BIG" }, "bad-rest" },
        { { "DEL {sb:p}:rest", "HSET {sb:p}:rest beta 6000" }, "bad-rest" },
        /* the lease record's [14] (health job), the waiter record's [12] (selector) and [13] (health flag) */
        { { "REC {sb:p}:h $A 14 s junk" } },
        { { "REC {sb:p}:h $A 14 n 1" } },
        { { "REC {sb:p}:h $A 14 t x" } },
        { { "REC {sb:p}:w $W 12 n 12345" } },
        /* (a plain waiter's record given a selector: its unlink takes it off meta.selective, which
         * lanes_audit() then counts again from the buckets: told) */
        { { "REC {sb:p}:w $W 12 s @nobody" }, "bad-key" },
        { { "REC {sb:p}:w $W 12 s $BIG" }, "bad-key" },
        { { "REC {sb:p}:w $W 13 n 1" }, "bad-key" },
        { { "REC {sb:p}:w $H 13 x x" }, "bad-key" },
        { { "REC {sb:p}:w $H 12 s !alpha" } },
        { { "REC {sb:p}:w $H 13 s yes", "REC {sb:p}:w $W 13 t x" }, "bad-key" },
        { { "REC {sb:p}:w $W 3 s hc" } },
        /* the waiter record's numbers: its priority (positions stopped with an error on it), arrival and idle time,
         * and its state: dropped as garbage (then the pool made anew) */
        { { "REC {sb:p}:w $W 11 s junk" }, "bad-key" },
        { { "REC {sb:p}:w $W 5 s junk" }, "bad-key" },
        { { "REC {sb:p}:w $W 8 t x", "REC {sb:p}:w $H 7 n 5" }, "bad-key" },
        { { "REC {sb:p}:w $W 4 n 2", "REC {sb:p}:w $W 6 n 1500" } },
        /* rekey jobs: selector drops, lane drops, health drops, moves */
        { { "HSET {sb:p}:rekey drop:ci 1" }, "bad-key" },
        { { "HSET {sb:p}:rekey at nan hdrop:hc 1 sdrop:ci 1" }, "bad-key" },
        { { "HSET {sb:p}:rekey at 1e308 drop:hc 1 drop:nobody 1" }, "bad-key" },
        { { "HSET {sb:p}:rekey at -inf move:ci nan" }, "bad-key" },
        { { "HSET {sb:p}:rekey at 1500 move:ci junk move:hc 1e308" }, "bad-key" },
        { { "HSET {sb:p}:rekey at 1500 sdrop:$BIG 1 x 1" }, "bad-key" },
        { { "SET {sb:p}:rekey junk" }, "bad-key" },
        /* the stored rules' canon (its label.* and members= lines) */
        { { "HSET {sb:p}:rules canon junk" } },
        { { "HSET {sb:p}:rules canon $BIG" } },
        { { "HSET {sb:p}:rules canon label.x=nobody,alpha\nlane.ci.labels=x\nlimit=99\nmembers=alpha" } },
        /* meta's counts of them */
        { { "HSET {sb:p}:meta hwaiting nan", "HSET {sb:p}:meta drain_next nan" } },
        /* numbers, but wrong: more free slots than busy has sent grant() past the last one, a Lua error on
         * every submit (the pool made anew now: "free slots"); fewer kept free slots out for good */
        { { "HSET {sb:p}:meta drained_free -5" } },
        { { "HSET {sb:p}:meta drained_free 0" } },
        { { "HSET {sb:p}:meta resting_free -3" } },
        { { "HSET {sb:p}:meta drained_free 3" } },
        { { "HSET {sb:p}:meta in_use 0", "HSET {sb:p}:meta leases 0" } },
        { { "HSET {sb:p}:meta drain_next -inf", "HSET {sb:p}:meta life junk" } },
        { { "HSET {sb:p}:meta drain_next 1e308", "HSET {sb:p}:meta drain_records 1" } },
        /* numbers the scripts count with, and the records, where a script once stopped with an error (issue 21,
         * stop 38): garbage in meta or the clock makes the pool anew ("Integrity"); a lane's counts and a node's
         * fingerprint are counted again, a garbage lease or waiter record dropped (then the pool made anew) */
        { { "HSET {sb:p}:meta recovery_until junk", "HSET {sb:p}:meta counter nan" } },
        { { "HSET {sb:p}:meta phase inf", "HSET {sb:p}:meta integrity x" } },
        { { "HSET {sb:p}:clock skew junk" } },
        { { "HSET {sb:p}:clock last_now -", "HSET {sb:p}:clock last_time 1e400" } },
        { { "HSET {sb:p}:lane:ci used junk" }, "bad-key" },
        { { "HSET {sb:p}:lane:ci waiting -", "HSET {sb:p}:lane:hc used nan" }, "bad-key" },
        { { "HSET {sb:p}:node:n1 fp_x junk" }, "bad-key" },
        { { "HSET {sb:p}:node:n2 fp_s 1.5" }, "bad-key" },
        { { "HSET {sb:p}:node:n2 fp_n x" } }, /* ZCARD nr:n2 differs: the pool made anew, fp_n with it */
        { { "HSET {sb:p}:w $W \xc1", "HSET {sb:p}:w $H \x93\x01" }, "bad-key" }, /* told by the status snapshot */
};

static char *hostile_big(void) {
        static char *big;
        if (!big) {
                big = malloc(1 << 20);
                assert_non_null(big);
                memset(big, 'x', (1 << 20) - 1);
                big[(1 << 20) - 1] = '\0';
        }
        return big;
}

static void hostile_apply(const char *cmd, const char *w, const char *h, const char *a) {
        char buf[256], *save = NULL;
        const char *argv[16];
        size_t n = 0;
        snprintf(buf, sizeof buf, "%s", cmd);
        for (char *t = strtok_r(buf, " ", &save); t && n < 16; t = strtok_r(NULL, " ", &save))
                argv[n++] = strcmp(t, "$W") == 0 ? w : strcmp(t, "$H") == 0 ? h : strcmp(t, "$A") == 0 ? a :
                            strcmp(t, "$BIG") == 0 ? hostile_big() : strcmp(t, "\"\"") == 0 ? "" :
                            strncmp(t, "sdrop:$BIG", 10) == 0 ? "sdrop:xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx" : t;
        if (strcmp(argv[0], "REC") == 0) {
                assert_int_equal(n, 6);
                const char *script =
                        "local v = redis.call('HGET', KEYS[1], ARGV[1]) "
                        "if not v then return redis.error_reply('no record') end "
                        "local a = cmsgpack.unpack(v) local x = ARGV[4] "
                        "if ARGV[3] == 'n' then x = tonumber(x) elseif ARGV[3] == 't' then x = { x } "
                        "elseif ARGV[3] == 'x' then x = nil end "
                        "a[tonumber(ARGV[2])] = x "
                        "redis.call('HSET', KEYS[1], ARGV[1], cmsgpack.pack(a)) return 1";
                const char *ev[] = { "EVAL", script, "1", argv[1], argv[2], argv[3], argv[4], argv[5] };
                redisReply *r = redisCommandArgv(redis, 8, ev, NULL);
                assert_non_null(r);
                assert_int_not_equal(r->type, REDIS_REPLY_ERROR);
                freeReplyObject(r);
                return;
        }
        redisReply *r = redisCommandArgv(redis, (int) n, argv, NULL);
        assert_non_null(r);
        if (r->type == REDIS_REPLY_ERROR)
                fail_msg("%s: %s", cmd, r->str);
        freeReplyObject(r);
}

struct hostile_run {
        size_t c, errors;
        bool saw_notice, saw_bad_key;
        const char *notice;
};

/* Redis's own view, checked after every call: no slot and no member held twice, never more than the limit
 * (the status snapshot's holders), and `occ` says the same. The snapshot's notices count for the run as the
 * calls' do: it may be the call that makes a repair, and tells it. */
static void hostile_check(struct hostile_run *run, const char *after, long long now) {
        size_t c = run->c;
        redisReply *r = call("positions", "n1", now, 0, "status", NULL);
        if (r->type == REDIS_REPLY_ERROR || strcmp(status(r), "ok") != 0) {
                freeReplyObject(r);
                return; /* counted by the caller's next call */
        }
        if (run->notice && has_notice_kind(r, run->notice))
                run->saw_notice = true;
        if (has_notice_kind(r, "bad-key"))
                run->saw_bad_key = true;
        const redisReply *holders = body(r)->element[0];
        bool slot[3] = { false }, member[3] = { false };
        size_t held = 0;
        for (size_t i = 0; i < holders->elements; i++) {
                const redisReply *slots = holders->element[i]->element[6], *members = holders->element[i]->element[7];
                for (size_t j = 0; j < slots->elements; j++) {
                        long long s = slots->element[j]->integer;
                        if (s < 0 || s >= 3 || slot[s])
                                fail_msg("case %zu, after %s: slot %lld held twice or out of range", c, after, s);
                        slot[s] = true;
                        held++;
                }
                for (size_t j = 0; j < members->elements; j++) {
                        const char *m = members->element[j]->str;
                        int k = strcmp(m, "alpha") == 0 ? 0 : strcmp(m, "beta") == 0 ? 1 : strcmp(m, "gamma") == 0 ? 2 : -1;
                        if (k < 0 || member[k])
                                fail_msg("case %zu, after %s: member %s held twice or unknown", c, after, m);
                        member[k] = true;
                }
        }
        freeReplyObject(r);
        redisReply *occ = redisCommand(redis, "BITCOUNT " POOL ":occ");
        if ((size_t) occ->integer != held)
                fail_msg("case %zu, after %s: occ counts %lld, the holders %zu", c, after, occ->integer, held);
        freeReplyObject(occ);
}

/* What the node reads of a reply carries no garbage number: the next wakeup none or an instant of the pool
 * clock, no decision and no notice at an instant that is not one up to now. */
static void hostile_numbers(struct hostile_run *run, const char *what, const redisReply *r, long long now) {
        const long long max = 1LL << 53;
        bool bad = false;
        if (r->element[R_CACHE]->elements > C_NEXT_WAKEUP) {
                long long nw = cache(r, C_NEXT_WAKEUP);
                bad |= nw != -1 && (nw < 0 || nw >= max);
        }
        for (size_t i = 0; i < n_events(r); i++)
                if (event(r, i)->type == REDIS_REPLY_ARRAY && event(r, i)->elements > D_AT &&
                    strcmp(event(r, i)->element[0]->str, "congestion") != 0)
                        bad |= field_i(event(r, i), D_AT) < 0 || field_i(event(r, i), D_AT) > now;
        for (size_t i = 0; i < n_notices(r); i++) {
                const redisReply *n = r->element[R_NOTICES]->element[i];
                if (strcmp(n->element[0]->str, "undrained") == 0 || strcmp(n->element[0]->str, "drained") == 0)
                        bad |= n->element[2]->integer < 0 || n->element[2]->integer > now ||
                               (n->element[5]->integer != -1 && (n->element[5]->integer < 0 || n->element[5]->integer >= max));
        }
        if (bad) {
                if (run->errors++ == 0)
                        fprintf(stderr, "# case %zu, %s: a number out of range in the reply\n", run->c, what);
        }
}

/* One call of the run; an error reply is counted, the reply's notices looked at, then Redis checked. */
static void hostile_call(struct hostile_run *run, const char *what, const char *op, const char *node, long long now, ...) {
        va_list ap;
        va_start(ap, now);
        redisReply *r = call_v(op, node, now, 0, ap);
        va_end(ap);
        if (r->type == REDIS_REPLY_ERROR) {
                if (run->errors++ == 0)
                        fprintf(stderr, "# case %zu, %s: %s\n", run->c, what, r->str);
        } else {
                if (run->notice && has_notice_kind(r, run->notice))
                        run->saw_notice = true;
                if (has_notice_kind(r, "bad-key"))
                        run->saw_bad_key = true;
                if (getenv("HOSTILE_DEBUG")) /* each notice of the run's calls */
                        for (size_t i = 0; i < n_notices(r); i++)
                                fprintf(stderr, "# case %zu %s: notice %s %s\n", run->c, what,
                                        r->element[R_NOTICES]->element[i]->element[0]->str,
                                        r->element[R_NOTICES]->element[i]->element[1]->type == REDIS_REPLY_STRING ? r->element[R_NOTICES]->element[i]->element[1]->str : "#");
                hostile_numbers(run, what, r, now);
        }
        freeReplyObject(r);
        hostile_check(run, what, now);
}

/* The waiters' counts as the records have them (README, "Integrity"): meta.hwaiting the records flagged health,
 * each of them in hq and nothing else there, meta.waiting the others. "" when they agree, else what differs. */
static void hostile_counts(char *buf, size_t size) {
        const char *script =
                "local h, q = 0, {} "
                "local a = redis.call('HGETALL', KEYS[1] .. ':w') "
                "for i = 1, #a, 2 do local ok, r = pcall(cmsgpack.unpack, a[i + 1]) "
                "  if ok and type(r) == 'table' and r[13] == 1 then h = h + 1 q[a[i]] = true end end "
                "local ok, hq = pcall(redis.call, 'ZRANGE', KEYS[1] .. ':hq', 0, -1) "
                "if not ok then hq = {} end "
                "local stray = 0 "
                "for _, wid in ipairs(hq) do if q[wid] then q[wid] = nil else stray = stray + 1 end end "
                "local missing = 0 for _ in pairs(q) do missing = missing + 1 end "
                "local m = redis.call('HMGET', KEYS[1] .. ':meta', 'waiting', 'hwaiting') "
                "local w, hw = tonumber(m[1] or '0') or -1, tonumber(m[2] or '0') or -1 "
                "if hw == h and w == #a / 2 - h and stray == 0 and missing == 0 then return '' end "
                "return string.format('waiting %s hwaiting %s, records %d of which health %d, hq %d stray %d missing', "
                "  tostring(m[1]), tostring(m[2]), #a / 2, h, stray, missing)";
        redisReply *r = redisCommand(redis, "EVAL %s 1 %s", script, POOL);
        assert_non_null(r);
        snprintf(buf, size, "%s", r->type == REDIS_REPLY_STRING ? r->str : r->type == REDIS_REPLY_ERROR ? r->str : "?");
        freeReplyObject(r);
}

/* An ordinary waiter's wid written into hq is no health waiter: it is neither granted quarantined members as a
 * health job nor refused "not-quarantined" (it waits in its queue), and leaves hq. */
static void test_an_ordinary_wid_in_the_health_queue_is_passed_over(void **state) {
        char w[32];
        tick_ok("n1", 1000, CANON_HOSTILE);
        freeReplyObject(call("quarantine", "n1", 1000, 0, "alpha", "1", "uid 0", "x", NULL));
        redisReply *r = call("submit", "n1", 1000, 0, "h0", "hc", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(body(r)->element[D_MEMBERS]->element[0]->str, "alpha");
        freeReplyObject(r);
        r = call("submit", "n1", 1000, 0, "h1", "hc", "1", "1", "0", "-1", "-1", "-", NULL);
        assert_string_equal(field_s(body(r), D_VERDICT), "queued");
        freeReplyObject(r);
        expect_verdict("a", 1000, "ci", 1, "granted");
        expect_verdict("w", 1000, "ci", 2, "queued");
        tick_ok("n1", 1000, "=");
        wid_of("w", w);
        redis_do("ZADD " POOL ":hq 0 %s", w);
        r = tick_as("n1", 2000, "=");
        assert_int_equal(n_events(r), 0);
        freeReplyObject(r);
        r = call("positions", "n1", 2000, 0, "pos", "w", NULL);
        assert_string_equal(body(r)->element[0]->element[0]->str, "queued");
        freeReplyObject(r);
        redisReply *in_hq = redisCommand(redis, "ZSCORE " POOL ":hq %s", w);
        assert_int_equal(in_hq->type, REDIS_REPLY_NIL);
        freeReplyObject(in_hq);
}

/* A waiter record whose [13] says "health" though the waiter is in the ordinary queue: its unlink (a withdraw)
 * leaves its wid in its bucket and queue, with no record; the dispatch that meets it drops it and goes on. */
static void test_a_wid_left_without_its_record_is_dropped_by_the_dispatch(void **state) {
        char w[32];
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\n");
        redisReply *a = submit_at(1000, "a", "ci", 1, true, -1);
        long long ta = field_i(body(a), D_TOKEN);
        freeReplyObject(a);
        expect_verdict("w", 1000, "ci", 1, "queued");
        tick_ok("n1", 1000, "=");
        wid_of("w", w);
        tolerate_errors = true;
        hostile_apply("REC {sb:p}:w $W 13 n 1", w, "", "");
        freeReplyObject(call("withdraw", "n1", 2000, 0, "w", NULL));
        expect_verdict("x", 2000, "ci", 1, "queued");
        tick_ok("n1", 2000, "=");
        redisReply *r = call("release", "n1", 3000, 1, "0", "a", NULL);
        freeReplyObject(r);
        char t[32];
        snprintf(t, sizeof t, "%lld", ta);
        r = call("release", "n1", 3000, 1, t, "a", NULL);
        tolerate_errors = false;
        assert_int_equal(r->type, REDIS_REPLY_ARRAY);
        assert_string_equal(status(r), "ok");
        assert_int_equal(n_events(r), 1);
        assert_string_equal(field_s(event(r, 0), D_RID), "x");
        freeReplyObject(r);
}

/* Whether the set KEY of the pool has MEMBER, and whether KEY exists. */
static bool pool_set_has(const char *key, const char *member) {
        redisReply *r = redisCommand(redis, "SISMEMBER %s:%s %s", POOL, key, member);
        assert_non_null(r);
        bool has = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
        freeReplyObject(r);
        return has;
}

static bool pool_key_exists(const char *key) {
        redisReply *r = redisCommand(redis, "EXISTS %s:%s", POOL, key);
        assert_non_null(r);
        bool has = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
        freeReplyObject(r);
        return has;
}

/* lk:L lists the k of lane L's buckets b:L:K, as waiter_link() writes them (anyone may write it). A member that is
 * not the decimal of a slot count named a bucket the queue could not judge: not a number ("x") stopped every
 * call that looked at the queue with a Lua error, the tick included, for good (the error came before any write);
 * "01" made the dispatch drop its head from b:ci:1, not b:ci:01, so the same head came back at every step:
 * "settling" for good; one above the free slots ("2147483649", "inf") held the queue back for good. Such a
 * member leaves lk:L with its bucket (but a selector's, "K:CANON"), told ("bad-key" "lk"), by the dispatch and by
 * a drain of the pool (whose sort of the k failed on it). */
static void test_an_lk_member_that_is_no_slot_count_is_dropped_and_told(void **state) {
        static const char *const bad[] = { "x", "01", "0", "-1", "1.0", "0x1", " 1", "1e0", "2147483649", "inf",
                                           "nan", "", "1:x" };
        tolerate_errors = true;
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                char bucket[64];
                snprintf(bucket, sizeof bucket, "b:ci:%s", bad[i]);
                redis_do("FLUSHALL");
                tick_ok("n1", 1000, CANON_ONE_LANE "limit=2\n");
                redisReply *a = submit_at(1000, "a", "ci", 1, true, -1);
                long long ta = field_i(body(a), D_TOKEN);
                freeReplyObject(a);
                expect_verdict("b", 1000, "ci", 1, "granted");
                expect_verdict("c", 1000, "ci", 1, "queued");
                tick_ok("n1", 1000, "=");
                /* "0": a wid no record has, before every real one. */
                redis_do("SADD " POOL ":lk:ci %s", bad[i]);
                redis_do("ZADD " POOL ":%s 0 0", bucket);

                /* a's release frees a slot: the tick's dispatch grants c, the garbage gone and told. */
                char t[32];
                snprintf(t, sizeof t, "%lld", ta);
                redisReply *r = call("release", "n1", 2000, 0, t, "a", NULL);
                if (r->type == REDIS_REPLY_ERROR)
                        fail_msg("lk member \"%s\", a release: %s", bad[i], r->str);
                freeReplyObject(r);
                r = tick_as("n1", 2000, "=");
                if (r->type == REDIS_REPLY_ERROR)
                        fail_msg("lk member \"%s\", the tick: %s", bad[i], r->str);
                if (strcmp(status(r), "ok") != 0)
                        fail_msg("lk member \"%s\", the tick: %s", bad[i], status(r));
                if (n_events(r) != 1 || strcmp(field_s(event(r, 0), D_RID), "c") != 0 ||
                    strcmp(field_s(event(r, 0), D_VERDICT), "granted") != 0)
                        fail_msg("lk member \"%s\": c was not granted (%zu events)", bad[i], n_events(r));
                if (!has_notice(r, "bad-key", "lk"))
                        fail_msg("lk member \"%s\": not told", bad[i]);
                freeReplyObject(r);
                assert_false(pool_set_has("lk:ci", bad[i]));
                /* (A selector's bucket's name, "K:CANON", is ls:L's to list: the member goes, not the bucket.) */
                assert_int_equal(pool_key_exists(bucket), strchr(bad[i], ':') != NULL);

                /* A drain of the pool: every waiter refused, the garbage gone and told. */
                expect_verdict("d", 2000, "ci", 1, "queued");
                redis_do("SADD " POOL ":lk:ci %s", bad[i]);
                redis_do("ZADD " POOL ":%s 0 0", bucket);
                r = call("drain", "n1", 3000, 0, "", "1", NULL);
                if (r->type == REDIS_REPLY_ERROR)
                        fail_msg("lk member \"%s\", a drain: %s", bad[i], r->str);
                assert_string_equal(status(r), "ok");
                assert_int_equal(n_events(r), 1);
                assert_string_equal(field_s(event(r, 0), D_RID), "d");
                assert_string_equal(field_s(event(r, 0), D_VERDICT), "refused");
                if (!has_notice(r, "bad-key", "lk"))
                        fail_msg("lk member \"%s\": not told by the drain", bad[i]);
                assert_int_equal(cache(r, C_WAITING), 0);
                freeReplyObject(r);
                assert_false(pool_set_has("lk:ci", bad[i]));
                /* (A selector's bucket's name, "K:CANON", is ls:L's to list: the member goes, not the bucket.) */
                assert_int_equal(pool_key_exists(bucket), strchr(bad[i], ':') != NULL);
        }
        tolerate_errors = false;
}

/* A stale wid (no waiter record) in a bucket whose k is above the free slots: the queue's head, held back (HOLD),
 * whose record the dispatch never read (only a grantable head's): nobody behind it was granted, and every new
 * request queued behind it ("no barging"), for good. The head's record is read whatever its verdict; a wid whose
 * record is gone, or names another bucket, leaves the bucket. Buckets: one of k = 2 (above the one slot free),
 * k = 3 (above the limit: only a reload that shrank the limit leaves real waiters there), and a real waiter's
 * wid copied into a bucket its record does not name. */
static void test_a_stale_head_held_back_is_dropped_by_the_dispatch(void **state) {
        static const char *const ks[] = { "2", "3", "2" };
        for (size_t i = 0; i < ELEMENTSOF(ks); i++) {
                char c_wid[32];
                redis_do("FLUSHALL");
                tick_ok("n1", 1000, CANON_ONE_LANE "limit=2\n");
                redisReply *a = submit_at(1000, "a", "ci", 1, true, -1);
                long long ta = field_i(body(a), D_TOKEN);
                freeReplyObject(a);
                expect_verdict("b", 1000, "ci", 1, "granted");
                expect_verdict("c", 1000, "ci", 1, "queued");
                tick_ok("n1", 1000, "=");
                wid_of("c", c_wid);
                redis_do("SADD " POOL ":lk:ci %s", ks[i]);
                redis_do("ZADD " POOL ":b:ci:%s 0 %s", ks[i], i < 2 ? "0" : c_wid);

                freeReplyObject(release_at(2000, ta, "a"));
                redisReply *r = tick_as("n1", 2000, "=");
                assert_string_equal(status(r), "ok");
                if (n_events(r) != 1)
                        fail_msg("case %zu: %zu grants where c should have one slot", i, n_events(r));
                assert_string_equal(field_s(event(r, 0), D_RID), "c");
                assert_string_equal(field_s(event(r, 0), D_VERDICT), "granted");
                assert_false(has_notice_kind(r, "bad-key"));
                freeReplyObject(r);
                /* (The copy of c's wid, when c was granted from its own bucket first, is left to the dispatch
                 * that next finds it a head: its record is gone then.) */
                redisReply *z = redisCommand(redis, "ZCARD " POOL ":b:ci:%s", ks[i]);
                if (i < 2 && z->integer != 0)
                        fail_msg("case %zu: b:ci:%s holds %lld wids", i, ks[i], z->integer);
                freeReplyObject(z);
        }
}

/* The stored rules are read as they are, and anyone may write them: a canon whose numbers are not numbers (or out
 * of what shared-rules.c can write) made R.limit or a lane's counts nil, a Lua error on every call once
 * anything was due, the tick included (it settles before agree() would store its own canon), for good. Such a
 * canon is no rules: the pool is made anew ("lost:rules", README "Integrity"), as when the canon is deleted, and
 * the next tick stores its own. A node's wanted canon ("=") that is not rules is none: "canon". */
static void test_stored_rules_that_are_not_rules_are_rules_lost(void **state) {
        static const char *const bad[] = {
                "limit=x", "limit=", "limit=-1", "limit=1.5", "limit=4294967296", "limit=inf", "limit=nan",
                "limit=0x10", "limit= 1", "backend-node-ttl=0", "backend-node-ttl=junk",
                "backend-node-ttl=9223372036854775808", "lane.ci.priority=x", "lane.ci.priority=2147483648",
                "lane.ci.priority=-2147483649", "lane.ci.max-in-use=x", "lane.ci.max-in-use=-2",
                "lane.ci.reserve=-1", "lane.ci.reserve=nan", "lane.ci.reserve=4294967296", "lane.ci.queue-timeout=-2",
                "lane.ci.queue-timeout=x", "queue-timeout=-1", "queue-timeout=1e6", "queue-timeout=99999999999999999999",
                "queue-congestion-timeout=-5", "max-queue=-2", "max-queue=x", "cooldown=x", "cooldown=-1",
                "quarantine-after=0", "quarantine-after=x", "quarantine-exit-codes=3,256", "quarantine-exit-codes=x",
        };
        const char *canon = CANON_ONE_LANE "limit=1\n";
        tolerate_errors = true;
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                char garbage[512];
                redis_do("FLUSHALL");
                tick_ok("n1", 1000, canon);
                expect_verdict("a", 1000, "ci", 1, "granted");
                redisReply *b = submit_at(1000, "b", "ci", 1, true, SEC); /* due at 1.001 s */
                assert_string_equal(field_s(body(b), D_VERDICT), "queued");
                freeReplyObject(b);
                tick_ok("n1", 1000, "=");
                /* (a later line of a key wins: the canon's own limit=1 stays in it) */
                snprintf(garbage, sizeof garbage, "%s%s\n", canon, bad[i]);
                redis_do("HSET " POOL ":rules canon %s", garbage);

                redisReply *r = call("release", "n1", 3 * SEC, 0, "1", "a", NULL);
                if (r->type == REDIS_REPLY_ERROR)
                        fail_msg("canon with %s, a release: %s", bad[i], r->str);
                assert_string_equal(status(r), "unregistered");
                freeReplyObject(r);
                r = tick_as("n1", 3 * SEC, canon);
                if (r->type == REDIS_REPLY_ERROR)
                        fail_msg("canon with %s, the tick: %s", bad[i], r->str);
                assert_string_equal(status(r), "ok");
                freeReplyObject(r);
                r = redisCommand(redis, "HGET " POOL ":rules canon");
                assert_string_equal(r->str, canon);
                freeReplyObject(r);
                r = redisCommand(redis, "HGET " POOL ":meta lost");
                assert_string_equal(r->str, "rules");
                freeReplyObject(r);
                /* The pool made anew serves (the manual clock's pool: no recovery window). */
                expect_verdict("c", 3 * SEC, "ci", 1, "granted");

                /* The node's own wanted rules, garbage: no canon of this node. */
                redis_do("HSET " POOL ":node:n1 rules %s", garbage);
                r = tick_as("n1", 4 * SEC, "=");
                if (r->type == REDIS_REPLY_ERROR)
                        fail_msg("wanted canon with %s, the tick: %s", bad[i], r->str);
                assert_string_equal(status(r), "canon");
                freeReplyObject(r);
                tick_ok("n1", 4 * SEC, canon);
                r = redisCommand(redis, "HGET " POOL ":rules canon");
                assert_string_equal(r->str, canon);
                freeReplyObject(r);
        }

        /* The Redis clock, and a new run id (a restart) in the same call: the restart's window took the stored
         * TTL, nil without rules (deleted or not rules), a Lua error on every call for good (the run id never
         * stored). */
        static const char *const lost[] = { "HDEL " POOL ":rules canon", "HSET " POOL ":rules canon limit=x" };
        for (size_t i = 0; i < ELEMENTSOF(lost); i++) {
                redis_do("FLUSHALL");
                run_id = "run1";
                redisReply *r = call("tick", "n1", -1, 1, "n1", canon, "0", "0", "0", "-", "e1", "1", "", NULL);
                assert_string_equal(status(r), "ok");
                freeReplyObject(r);
                redis_do(lost[i]);
                run_id = "run2";
                r = call("tick", "n1", -1, 1, "n1", canon, "0", "0", "0", "-", "e1", "1", "", NULL);
                if (r->type == REDIS_REPLY_ERROR)
                        fail_msg("%s, a new run id: %s", lost[i], r->str);
                assert_string_equal(status(r), "ok");
                freeReplyObject(r);
                r = redisCommand(redis, "HGET " POOL ":rules canon");
                assert_string_equal(r->str, canon);
                freeReplyObject(r);
                r = redisCommand(redis, "HGET " POOL ":meta run_id");
                assert_string_equal(r->str, "run2");
                freeReplyObject(r);
        }
        tolerate_errors = false;
}

/* A key of a pool that holds another type (a hostile write, another program's key) stops no call for good: the
 * call drops the keys of another type and runs again (prelude.lua, call_guarded()), the pool then one whose keys
 * were deleted by hand ("Integrity"), and it serves again; a renewal naming the pool too. Without the guard every
 * call of the pool, and every renewal naming it, answered WRONGTYPE. */
static void test_a_key_of_another_type_is_dropped_and_the_call_run_again(void **state) {
        static const char *const keys[] = { "meta", "clock", "rules", "occ", "busy", "h", "w", "rid", "nodes", "dl",
                                            "lane:ci", "lk:ci", "ls:ci", "b:ci:1", "q:0", "node:n1", "nr:n1", "oh:n1" };
        bool was_alternate = alternate; /* (the library's functions: EVAL scripts, for tests, are not guarded) */
        alternate = false;
        tolerate_errors = true;
        for (size_t i = 0; i < ELEMENTSOF(keys); i++) {
                freeReplyObject(redisCommand(redis, "FLUSHALL"));
                tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\n");
                redisReply *a = submit_at(1000, "a", "ci", 1, false, -1);
                char token[24];
                snprintf(token, sizeof token, "%lld", field_i(body(a), D_TOKEN));
                freeReplyObject(a);
                redisReply *w = submit_at(1000, "w", "ci", 1, true, 5000); /* a bucket, a queue, a deadline */
                freeReplyObject(w);
                freeReplyObject(call("submit", "n1", 1000, 0, "r", "ci", "1", "0", "0", "-1", "-1", "-", NULL));
                freeReplyObject(redisCommand(redis, "DEL %s:%s", pool, keys[i]));
                freeReplyObject(redisCommand(redis, "RPUSH %s:%s junk", pool, keys[i]));
                redisReply *r = call("submit", "n1", 2000, 0, "x", "ci", "1", "0", "0", "-1", "-1", "-", NULL);
                if (r->type == REDIS_REPLY_ERROR)
                        fail_msg("%s of another type: %s", keys[i], r->str);
                freeReplyObject(r);
                r = call("release", "n1", 2000, 0, token, "a", NULL);
                if (r->type == REDIS_REPLY_ERROR)
                        fail_msg("%s of another type, a release: %s", keys[i], r->str);
                freeReplyObject(r);
                tick_ok("n1", 3000, CANON_ONE_LANE "limit=1\n");
        }
        freeReplyObject(redisCommand(redis, "FLUSHALL"));
        redisReply *l = live_tick(LIVE_N1, "n1", CANON_LIVE);
        assert_string_equal(status(l), "ok");
        freeReplyObject(l);
        freeReplyObject(redisCommand(redis, "DEL %s:clock", pool));
        freeReplyObject(redisCommand(redis, "RPUSH %s:clock junk", pool));
        redisReply *r = live_renew(LIVE_N1, "sb:live:n1", POOL, NULL);
        if (r->type == REDIS_REPLY_ERROR)
                fail_msg("a renewal naming a pool whose clock is of another type: %s", r->str);
        assert_string_equal(status(r), "ok");
        freeReplyObject(r);
        tolerate_errors = false;
        alternate = was_alternate;
}

/* A lease record that is garbage (anyone may write h): no script stops on it. Its release finds a lease that is
 * gone and says so (bad-key "h"); the record is dropped, its slot stays taken (no grant on it), and the next call
 * finds HLEN h below meta's count: the pool is made anew, its holders reclaiming their leases ("Integrity"). */
static void test_a_garbage_lease_record_is_dropped_and_the_pool_made_anew(void **state) {
        tick_ok("n1", 1000, CANON_ONE_LANE "limit=1\n");
        redisReply *a = submit_at(1000, "a", "ci", 1, false, -1);
        char token[24];
        snprintf(token, sizeof token, "%lld", field_i(body(a), D_TOKEN));
        freeReplyObject(a);
        freeReplyObject(redisCommand(redis, "HSET %s:h %s %b", pool, token, "\x93\x01", (size_t) 2));
        redisReply *r = release_at(2000, atoll(token), "a");
        assert_string_equal(status(r), "ok");
        assert_string_equal(body(r)->element[0]->str, "gone");
        assert_true(has_notice_kind(r, "bad-key"));
        assert_int_equal(cache(r, C_IN_USE), 1);
        freeReplyObject(r);
        redisReply *h = redisCommand(redis, "HEXISTS %s:h %s", pool, token);
        assert_int_equal(h->integer, 0);
        freeReplyObject(h);
        redisReply *e = redisCommand(redis, "HGET %s:meta epoch", pool);
        char *epoch = strdup(e->str);
        freeReplyObject(e);
        freeReplyObject(submit_at(2000, "b", "ci", 1, true, -1));
        redisReply *m = redisCommand(redis, "HMGET %s:meta lost epoch", pool);
        assert_string_equal(m->element[0]->str, "leases");
        assert_string_not_equal(m->element[1]->str, epoch); /* (a manual clock's pool opens no window) */
        freeReplyObject(m);
        free(epoch);
}

/* A lease record keeps its fingerprint hash ([15], issue 21), so that its end need not hash its rid again; the
 * record is untrusted: a [15] that is not a 32-bit value (a string, a table, negative, beyond 2^32, a fraction)
 * is hashed again, and the node's fingerprint comes back to nothing once every lease ended. */
static void test_a_lease_record_keeps_its_hash_and_garbage_there_is_hashed_again(void **state) {
        static const char *const garbage[] = { NULL, "s junk", "t x", "n -1", "n 4294967296", "n 1.5", "x -" };
        const char *script = "local a = cmsgpack.unpack(redis.call('HGET', KEYS[1], ARGV[1])) "
                             "return type(a[15]) == 'number' and tostring(a[15]) or 'none'";

        tick_ok("n1", 1000, CANON_ONE_LANE "limit=8\n");
        for (size_t i = 0; i < ELEMENTSOF(garbage); i++) {
                char rid[8], rid_l[9], token[24], cmd[64], want[16];
                snprintf(rid, sizeof rid, "g%zu", i);
                snprintf(rid_l, sizeof rid_l, "%sl", rid);
                redisReply *r = submit_at(2000 + 10 * (long long) i, rid, "ci", 1, false, -1);
                snprintf(token, sizeof token, "%lld", field_i(body(r), D_TOKEN));
                freeReplyObject(r);
                redisReply *v = redisCommand(redis, "EVAL %s 1 %s:h %s", script, pool, token);
                snprintf(want, sizeof want, "%" PRIu32, fnv1a32(rid_l));
                assert_string_equal(v->str, want);
                freeReplyObject(v);
                if (garbage[i]) {
                        snprintf(cmd, sizeof cmd, "REC %s:h $A 15 %s", pool, garbage[i]);
                        hostile_apply(cmd, NULL, NULL, token);
                }
                freeReplyObject(release_at(2005 + 10 * (long long) i, atoll(token), rid));
        }
        redisReply *t = tick_as("n1", 4000, "=");
        const redisReply *fp = body(t)->element[5];
        assert_int_equal(fp->element[0]->integer, 0);
        assert_int_equal(fp->element[1]->integer, 0);
        assert_int_equal(fp->element[2]->integer, 0);
        freeReplyObject(t);
}

static void test_hostile_writes_to_the_members_lives_break_nothing(void **state) {
        size_t failed = 0;
        tolerate_errors = true;
        for (size_t c = 0; c < sizeof hostile_writes / sizeof hostile_writes[0]; c++) {
                struct hostile_run run = { .c = c, .notice = hostile_writes[c].notice };
                char w[32], h[32], a[32];
                long long ta, th0;
                freeReplyObject(redisCommand(redis, "FLUSHALL"));
                tick_ok("n1", 1000, CANON_HOSTILE);
                tick_ok("n2", 1000, CANON_HOSTILE);
                assert_string_equal(granted_member(1000, "a", &ta), "alpha");
                long long tb;
                assert_string_equal(granted_member(1000, "b", &tb), "beta");
                freeReplyObject(release_with(1000, tb, "b", "3", "job-b")); /* beta rests until 6000; qf 1 */
                freeReplyObject(call("quarantine", "n1", 1000, 0, "gamma", "1", "uid 0", "x", NULL));
                redisReply *r = call("submit", "n1", 1000, 0, "h0", "hc", "1", "1", "0", "-1", "-1", "-", NULL);
                assert_string_equal(body(r)->element[D_MEMBERS]->element[0]->str, "gamma");
                th0 = field_i(body(r), D_TOKEN);
                freeReplyObject(r);
                r = call("submit", "n1", 1000, 0, "h1", "hc", "1", "1", "0", "-1", "-1", "-", NULL);
                assert_string_equal(field_s(body(r), D_VERDICT), "queued");
                freeReplyObject(r);
                expect_verdict("w", 1000, "ci", 1, "queued");
                freeReplyObject(call("drain", "n1", 1000, 0, "beta", "1", "uid 1", "reflash", "50000", NULL));
                tick_ok("n1", 1000, "=");
                wid_of("w", w);
                wid_of("h1", h);
                snprintf(a, sizeof a, "%lld", ta);
                for (size_t i = 0; i < 3 && hostile_writes[c].cmd[i]; i++)
                        hostile_apply(hostile_writes[c].cmd[i], w, h, a);

                char ta_s[32], th0_s[32];
                snprintf(ta_s, sizeof ta_s, "%lld", ta);
                snprintf(th0_s, sizeof th0_s, "%lld", th0);
                hostile_call(&run, "tick", "tick", "n1", 2000, "n1", "=", "0", "0", "0", "-", "e", "1", "", NULL);
                hostile_call(&run, "withdraw", "withdraw", "n1", 2000, "w", NULL);
                hostile_call(&run, "submit", "submit", "n2", 2000, "x", "ci", "1", "1", "0", "-1", "-1", "-", NULL);
                hostile_call(&run, "submit", "submit", "n2", 2000, "x2", "ci", "1", "1", "0", "-1", "-1", "-", NULL);
                hostile_call(&run, "release 3", "release", "n1", 3000, ta_s, "a", "3", "job-a", NULL);
                hostile_call(&run, "release 0", "release", "n1", 3000, th0_s, "h0", "0", "check", NULL);
                hostile_call(&run, "drain", "drain", "n1", 4000, "alpha", "1", "uid 2", "why", "20000", NULL);
                hostile_call(&run, "quarantine", "quarantine", "n1", 4000, "beta", "1", "uid 0", "y", NULL);
                hostile_call(&run, "health submit", "submit", "n1", 5000, "h2", "hc", "1", "1", "0", "-1", "-1", "-",
                             NULL);
                hostile_call(&run, "restore", "quarantine", "n1", 5000, "beta", "0", "uid 0", "", NULL);
                hostile_call(&run, "pool drain", "drain", "n2", 6000, "", "1", "uid 3", "pool", "9000", NULL);
                hostile_call(&run, "positions", "positions", "n1", 6000, "pos", "w", "h1", "h2", "x", NULL);
                static const long long times[] = { 10000, 30000, 25 * SEC, 50 * SEC, 75 * SEC };
                for (size_t i = 0; i < sizeof times / sizeof times[0]; i++) {
                        long long t = times[i];
                        hostile_call(&run, "tick n1", "tick", "n1", t, "n1", "=", "0", "0", "0", "-", "e", "1", "", NULL);
                        hostile_call(&run, "tick n2", "tick", "n2", t, "n2", "=", "0", "0", "0", "-", "e", "1", "", NULL);
                        hostile_call(&run, "submit", "submit", "n1", t, t < 20 * SEC ? "y1" : "y2", "ci", "1", "1", "0",
                                     "-1", "-1", "-", NULL);
                }
                /* After all that the pool works: its calls are answered, and its free slots granted. */
                r = call("tick", "n1", 90 * SEC, 1, "n1", "=", "0", "0", "0", "-", "e", "1", "", NULL);
                /* (the run's only call that settles its instant: a du score below zero ends there) */
                if (r->type != REDIS_REPLY_ERROR && run.notice && has_notice_kind(r, run.notice))
                        run.saw_notice = true;
                if (r->type != REDIS_REPLY_ERROR && has_notice_kind(r, "bad-key"))
                        run.saw_bad_key = true;
                if (r->type == REDIS_REPLY_ERROR || strcmp(status(r), "ok") != 0) {
                        fprintf(stderr, "# case %zu (%s): the pool is wedged: %s\n", c, hostile_writes[c].cmd[0],
                                r->type == REDIS_REPLY_ERROR ? r->str : status(r));
                        failed++;
                } else if (run.errors) {
                        fprintf(stderr, "# case %zu (%s): %zu calls answered with an error\n", c, hostile_writes[c].cmd[0],
                                run.errors);
                        failed++;
                } else if (run.notice && !run.saw_notice) {
                        fprintf(stderr, "# case %zu (%s): no notice %s\n", c, hostile_writes[c].cmd[0], run.notice);
                        failed++;
                } else if (!run.notice && run.saw_bad_key) {
                        fprintf(stderr, "# case %zu (%s): a notice bad-key with nothing to repair\n", c,
                                hostile_writes[c].cmd[0]);
                        failed++;
                }
                freeReplyObject(r);
                /* The counts heal: whatever was flipped or written, the waiters' counts are the records' again. */
                char counts[256];
                hostile_counts(counts, sizeof counts);
                if (counts[0]) {
                        fprintf(stderr, "# case %zu (%s): the counts are off: %s\n", c, hostile_writes[c].cmd[0], counts);
                        failed++;
                }
        }
        tolerate_errors = false;
        assert_int_equal(failed, 0);
}

/* A lane's counts that are numbers but wrong (its key evicted, or written by hand) are counted again from
 * the records within 10 s of pool time (prelude.lua, lanes_audit()): before, a used count set to 0 let the
 * lane pass its cap, one set high blocked it, and a waiting count of 0 passed its waiters over, for as long as
 * the pool lived. */
#define CANON_CAPPED "backend-node-ttl=300000000\nlane.ci.max-in-use=1\nlane.ci.priority=0\nlane.ci.reserve=0\n" \
        "lane.nb.max-in-use=-1\nlane.nb.priority=0\nlane.nb.reserve=0\nlimit=3\n"

static long long lane_count(const char *lane, const char *field) {
        redisReply *r = redisCommand(redis, "HGET " POOL ":lane:%s %s", lane, field);
        assert_int_equal(r->type, REDIS_REPLY_STRING);
        long long v = strtoll(r->str, NULL, 10);
        freeReplyObject(r);
        return v;
}

static void test_wrong_lane_counts_are_counted_again(void **state) {
        tick_ok("n1", 1000, CANON_CAPPED);
        redisReply *a = submit_at(1000, "a", "ci", 1, true, -1);
        assert_string_equal(field_s(body(a), D_VERDICT), "granted");
        redisReply *n = submit_at(1000, "n", "nb", 2, true, -1);
        assert_string_equal(field_s(body(n), D_VERDICT), "granted");

        /* used 0 where ci holds 1 (cap 1): within the period it is taken as it is; after it, counted again. */
        redis_do("HSET " POOL ":lane:ci used 0");
        redisReply *b = submit_at(1000 + 10 * SEC, "b", "ci", 1, true, -1);
        assert_string_equal(field_s(body(b), D_VERDICT), "queued");
        assert_true(has_notice(b, "bad-key", "lane"));
        assert_int_equal(lane_count("ci", "used"), 1);
        assert_int_equal(lane_count("ci", "waiting"), 1);
        freeReplyObject(b);

        /* waiting 0 where b waits, and used 5 where nb holds 2: the release of a must still grant b. */
        redis_do("HSET " POOL ":lane:ci waiting 0");
        redis_do("HSET " POOL ":lane:nb used 5");
        redisReply *r = release_at(1000 + 20 * SEC, field_i(body(a), D_TOKEN), "a");
        assert_true(has_notice(r, "bad-key", "lane"));
        freeReplyObject(r);
        redisReply *t = tick_as("n1", 1000 + 20 * SEC, "=");
        assert_int_equal(n_events(t), 1);
        assert_string_equal(field_s(event(t, 0), D_RID), "b");
        assert_string_equal(field_s(event(t, 0), D_VERDICT), "granted");
        freeReplyObject(t);
        assert_int_equal(lane_count("ci", "used"), 1);
        assert_int_equal(lane_count("ci", "waiting"), 0);
        assert_int_equal(lane_count("nb", "used"), 2);

        /* Right counts are left alone: no notice at the next period. */
        t = tick_as("n1", 1000 + 30 * SEC, "=");
        assert_false(has_notice_kind(t, "bad-key"));
        freeReplyObject(t);

        /* A repair in a call that then answers early (a tick of a node without rules: "canon") is told too. */
        redis_do("HSET " POOL ":lane:nb used 0");
        t = tick_as("n9", 1000 + 40 * SEC, "=");
        assert_string_equal(status(t), "canon");
        assert_true(has_notice(t, "bad-key", "lane"));
        freeReplyObject(t);
        assert_int_equal(lane_count("nb", "used"), 2);
        freeReplyObject(a);
        freeReplyObject(n);
}

/* meta.selective written down by hand while a selector waiter waits: dispatch would no longer walk the selector
 * buckets, and a plain request would take the member set aside for it. At lanes_audit()'s period the count is
 * the buckets' again (told), before the request is decided. */
static void test_a_wrong_selective_count_is_counted_again(void **state) {
        tick_ok("n1", 1000, CANON_RIGS);
        redisReply *r = submit_sel(1000, "x", 1, "@a");
        assert_string_equal(field_s(body(r), D_VERDICT), "granted");
        freeReplyObject(r);
        r = submit_sel(2000, "w", 2, "arm64"); /* a is held: b is set aside for w */
        assert_string_equal(field_s(body(r), D_VERDICT), "queued");
        freeReplyObject(r);

        redis_do("HSET " POOL ":meta selective 0");
        r = submit_sel(2000 + 10 * SEC, "any", 1, "");
        assert_string_equal(field_s(body(r), D_VERDICT), "granted");
        assert_string_equal(member_of(body(r), 0), "c");
        assert_true(has_notice(r, "bad-key", "sel"));
        freeReplyObject(r);
        r = redisCommand(redis, "HGET " POOL ":meta selective");
        assert_string_equal(r->str, "1");
        freeReplyObject(r);

        /* A right count is left alone: no notice at the next period. */
        r = tick_as("n1", 2000 + 20 * SEC, "=");
        assert_false(has_notice_kind(r, "bad-key"));
        freeReplyObject(r);
}

/* ---- hostile writes to the references and records: rid, h, recovering, dm, qm ---- */

/* A command's integer reply, or its string reply's number; -1 for anything else. */
static long long redis_integer(const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        redisReply *r = redisvCommand(redis, fmt, ap);
        va_end(ap);
        assert_non_null(r);
        long long v = r->type == REDIS_REPLY_INTEGER ? r->integer : r->type == REDIS_REPLY_STRING ? atoll(r->str) : -1;
        freeReplyObject(r);
        return v;
}

/* {sb:P}:rid maps NODE:RID to its record ("w:WID" | "l:TOKEN"), and anyone may write it. n2's queued b made to
 * name n1's lease a: no operation that follows the reference takes a for b's (withdraw freed it and granted its
 * slot again while n1 held it; a retried submit and positions answered n1's grant to n2; a reconcile page that
 * missed b orphaned it; n2's reap freed it). The reference is dropped and told ("bad-key" "rid"); a stays as it
 * was: in h, under n1:a, its slot taken, no orphan. */
static void test_a_rid_reference_to_another_nodes_lease_is_not_followed(void **state) {
        static const char *const ops[] = { "submit", "withdraw", "positions", "reconcile", "reap" };
        const char *canon = CANON_ONE_LANE "limit=1\n";

        for (size_t i = 0; i < ELEMENTSOF(ops); i++) {
                char ref[40];
                freeReplyObject(redisCommand(redis, "FLUSHALL"));
                tick_ok("n1", 1000, canon);
                tick_ok("n2", 1000, canon);
                redisReply *a = submit_at(1000, "a", "ci", 1, true, -1);
                assert_string_equal(field_s(body(a), D_VERDICT), "granted");
                long long ta = field_i(body(a), D_TOKEN);
                freeReplyObject(a);
                redisReply *b = call("submit", "n2", 1000, 0, "b", "ci", "1", "1", "0", "-1", "-1", "-", NULL);
                assert_string_equal(field_s(body(b), D_VERDICT), "queued");
                freeReplyObject(b);
                tick_ok("n1", 1000, "=");
                snprintf(ref, sizeof ref, "l:%lld", ta);
                redis_do("HSET " POOL ":rid n2:b %s", ref);

                redisReply *r;
                if (strcmp(ops[i], "submit") == 0) {
                        r = call("submit", "n2", 2000, 1, "b", "ci", "1", "1", "0", "-1", "-1", "-", NULL);
                        assert_string_not_equal(field_s(body(r), D_VERDICT), "granted");
                } else if (strcmp(ops[i], "withdraw") == 0) {
                        r = call("withdraw", "n2", 2000, 1, "b", NULL);
                        assert_string_equal(body(r)->element[0]->str, "gone");
                        assert_int_equal(n_events(r), 0);
                } else if (strcmp(ops[i], "positions") == 0) {
                        r = call("positions", "n2", 2000, 1, "pos", "b", NULL);
                        assert_string_not_equal(body(r)->element[0]->element[0]->str, "granted");
                } else if (strcmp(ops[i], "reconcile") == 0) {
                        r = call("tick", "n2", 2000, 1, "n2", "=", "0", "0", "0", "-", "e1", "1", "-", "+", NULL);
                } else {
                        tick_ok("n1", 20 * SEC, "=");
                        r = tick_as("n1", 1000 + 30 * SEC + 1, "=");
                        assert_true(has_notice_kind(r, "node-expired"));
                }
                assert_string_equal(status(r), "ok");
                if (!has_notice(r, "bad-key", "rid"))
                        fail_msg("%s: no bad-key rid", ops[i]);
                freeReplyObject(r);
                assert_int_equal(redis_integer("HEXISTS " POOL ":h %lld", ta), 1);
                assert_int_equal(redis_integer("GETBIT " POOL ":occ 0"), 1);
                assert_int_equal(redis_integer("ZCARD " POOL ":orph"), 0);
                r = redisCommand(redis, "HGET " POOL ":rid n1:a");
                assert_int_equal(r->type, REDIS_REPLY_STRING);
                assert_string_equal(r->str, ref);
                freeReplyObject(r);
                r = redisCommand(redis, "HGET " POOL ":rid n2:b"); /* dropped (a submit's new waiter's since) */
                assert_true(r->type == REDIS_REPLY_NIL || strcmp(r->str, ref) != 0);
                freeReplyObject(r);
        }
}

/* A lease record rewritten in place (lease_get() checks its fields' types only) to name another lease's slot:
 * its release frees nothing of that slot (before: it was freed, and granted to the next waiter while its holder
 * held it). The record is dropped as garbage ("bad-key" "h"; the next call makes the pool anew). Cases: an
 * anonymous slot's index and position both rewritten (sid's identity is another token's); the position alone
 * (the identity is its own, the position another's); the same in a pool of members. */
static void test_a_lease_record_naming_another_leases_slot_frees_nothing(void **state) {
        static const struct {
                const char *canon;
                int slot, pos;
        } cases[] = {
                { CANON_ONE_LANE "limit=2\n", 1, 1 },
                { CANON_ONE_LANE "limit=2\n", 0, 1 },
                { CANON_ONE_LANE "limit=2\nmembers=m0,m1\n", 0, 1 },
        };
        const char *script = "local a = cmsgpack.unpack(redis.call('HGET', KEYS[1], ARGV[1])) "
                             "a[5] = { tonumber(ARGV[2]) } a[6] = { tonumber(ARGV[3]) } "
                             "return redis.call('HSET', KEYS[1], ARGV[1], cmsgpack.pack(a))";

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                char ta[24], slot[8], pos[8];
                freeReplyObject(redisCommand(redis, "FLUSHALL"));
                tick_ok("n1", 1000, cases[i].canon);
                redisReply *a = submit_at(1000, "a", "ci", 1, true, -1);
                assert_int_equal(body(a)->element[D_SLOTS]->element[0]->integer, 0);
                snprintf(ta, sizeof ta, "%lld", field_i(body(a), D_TOKEN));
                freeReplyObject(a);
                redisReply *b = submit_at(1000, "b", "ci", 1, true, -1);
                assert_int_equal(body(b)->element[D_SLOTS]->element[0]->integer, 1);
                long long tb = field_i(body(b), D_TOKEN);
                freeReplyObject(b);
                expect_verdict("c", 1000, "ci", 1, "queued");
                tick_ok("n1", 1000, "=");
                snprintf(slot, sizeof slot, "%d", cases[i].slot);
                snprintf(pos, sizeof pos, "%d", cases[i].pos);
                redisReply *e = redisCommand(redis, "EVAL %s 1 %s:h %s %s %s", script, POOL, ta, slot, pos);
                assert_int_equal(e->type, REDIS_REPLY_INTEGER);
                freeReplyObject(e);

                redisReply *r = call("release", "n1", 2000, 1, ta, "a", NULL);
                assert_string_equal(status(r), "ok");
                assert_string_equal(body(r)->element[0]->str, "gone");
                assert_int_equal(n_events(r), 0); /* c is not granted b's slot */
                assert_true(has_notice(r, "bad-key", "h"));
                freeReplyObject(r);
                assert_int_equal(redis_integer("GETBIT " POOL ":occ 1"), 1);
                assert_int_equal(redis_integer("GETBIT " POOL ":busy 1"), 1);
                assert_int_equal(redis_integer("HEXISTS " POOL ":h %lld", tb), 1);
                assert_int_equal(redis_integer("HEXISTS " POOL ":h %s", ta), 0);
        }
}

/* A member drained (or quarantined) while free is out of `busy`, counted in drained_free. Its dm entry (qm
 * field) lost meanwhile, its undrain (restore) found nothing to undo, and the slot stayed parked until a reload
 * laid the pool out again (the counts agree: no integrity check saw it). Now the undrain (restore) puts a place
 * that is out for no drain or quarantine back, told ("bad-key" "dm" / "qm"). */
static void test_an_undrain_or_restore_whose_record_was_lost_gives_the_place_back(void **state) {
        static const char *const keys[] = { "dm", "qm" };

        for (size_t i = 0; i < ELEMENTSOF(keys); i++) {
                bool dm = strcmp(keys[i], "dm") == 0;
                freeReplyObject(redisCommand(redis, "FLUSHALL"));
                tick_ok("n1", 1000, CANON_ONE_LANE "limit=2\nmembers=m0,m1\n");
                redisReply *r = dm ? call("drain", "n1", 2000, 1, "m1", "1", "uid 0", "x", "", NULL) :
                                     call("quarantine", "n1", 2000, 1, "m1", "1", "uid 0", "x", NULL);
                assert_string_equal(status(r), "ok");
                freeReplyObject(r);
                assert_int_equal(meta_number("meta", "drained_free"), 1);
                redis_do("DEL " POOL ":%s", keys[i]);
                r = dm ? call("drain", "n1", 3000, 1, "m1", "0", "uid 0", "", "", NULL) :
                         call("quarantine", "n1", 3000, 1, "m1", "0", "uid 0", "", NULL);
                assert_string_equal(status(r), "ok");
                assert_true(has_notice(r, "bad-key", keys[i]));
                freeReplyObject(r);
                assert_int_equal(meta_number("meta", "drained_free"), 0);
                assert_int_equal(redis_integer("GETBIT " POOL ":busy 1"), 0);
                expect_verdict("a", 4000, "ci", 1, "granted");
                r = submit_at(4000, "b", "ci", 1, false, -1);
                assert_string_equal(field_s(body(r), D_VERDICT), "granted");
                assert_string_equal(body(r)->element[D_MEMBERS]->element[0]->str, "m1");
                freeReplyObject(r);
        }
}

/* A run id window waits for the nodes registered when it opened ({sb:P}:recovering). That set deleted or evicted
 * while the window is open looked like a set emptied by the last node's vouch: n1's next reclaimed tick ended
 * the window a second after it opened, and n1 could be granted the slot of a lease Redis lost, which n2 (not yet
 * reclaimed) still held. Now such a window runs to its full length (the set's RECOVERY_OPEN member is gone: who
 * is left is unknown), whoever vouches. */
static void test_a_run_id_window_whose_set_was_lost_runs_its_length(void **state) {
        const char *canon = CANON_ONE_LANE "limit=2\n"; /* TTL 30 s: the window cannot run out here */
        freeReplyObject(call("tick", "n1", -1, 1, "n1", canon, "0", "0", "0", "-", "e1", "1", "", NULL));
        freeReplyObject(call("tick", "n2", -1, 1, "n2", canon, "0", "0", "0", "-", "e1", "1", "", NULL));
        freeReplyObject(redisCommand(redis, "HSET %s:meta recovery_until 0", POOL));

        run_id = "run2";
        long long opened = tick_reclaimed("n1", "1"); /* opened, n1 off the set at once */
        long long from = meta_number("meta", "recovery_from");
        assert_true(opened > 0 && from > 0);
        redis_do("DEL " POOL ":recovering");
        /* The second a window lasts at least passes (the pool clock: a condition, waited for). */
        for (int i = 0; meta_number("clock", "last_now") <= from + SEC; i++) {
                assert_true(i < 5000);
                (void) nanosleep(&(struct timespec) { .tv_nsec = 1000 * 1000 }, NULL);
                assert_int_equal(tick_reclaimed("n1", "1"), opened);
        }
        assert_int_equal(tick_reclaimed("n1", "1"), opened);
        assert_string_equal(impatient_verdict("b"), "recovery");
        assert_int_equal(tick_reclaimed("n2", "1"), opened);
        assert_string_equal(impatient_verdict("c"), "recovery");
}

/* Which cases a run takes (main()'s arguments): all of them, or one of two parts that together are all of them, each
 * case in exactly one. The liveness cases sleep for real (a TTL of 2 s; about a minute in all, with next to no
 * CPU): meson runs them as tests of their own (test-shared-scripts-liveness, -mixed-liveness) beside the others
 * (tests/meson.build, tools/test.sh). */
enum part {
        PART_ALL,
        PART_LIVENESS,  /* "liveness": the cases marked L() below */
        PART_OTHERS,    /* "others": every case but those */
};

int main(int argc, char *argv[]) {
        static const struct {
                struct CMUnitTest test;
                bool liveness;
        } cases[] = {
#define T(f) { cmocka_unit_test_setup(f, setup), false }
#define L(f) { cmocka_unit_test_setup(f, setup), true }
                T(test_grants_up_to_the_limit_then_queues_and_hands_on_in_order),
                T(test_a_callers_own_deadline_is_not_its_wakeup),
                T(test_an_idle_heartbeat_writes_the_clock_and_the_registration_only),
                T(test_same_rid_twice_is_one_request),
                T(test_submit_fresh_and_its_lease_hash),
                T(test_priority_head_holds_back_smaller_waiters),
                T(test_lane_limits_pass_over_and_reserve_holds_a_slot),
                T(test_reserve_keeps_the_last_slot_from_another_lane),
                T(test_same_instant_order),
                T(test_budget_runs_out_at_its_own_deadline),
                T(test_congestion_flips_at_its_own_instant),
                T(test_release_of_an_unknown_token_changes_nothing),
                T(test_withdraw_unlinks_a_waiter_without_answer),
                T(test_grants_for_another_node_go_to_its_stream),
                T(test_a_production_node_refuses_a_manual_clock_pool),
                T(test_manual_now_never_goes_back),
                T(test_a_new_redis_clock_pool_starts_with_a_recovery_window),
                T(test_rules_mismatch_names_the_keys_then_adoption),
                T(test_a_node_that_wants_any_rules_holds_no_adoption_back),
                T(test_adopted_rules_move_and_refuse_waiters),
                T(test_adopted_members_lay_held_slots_out_again),
                T(test_fingerprints_equal_the_c_implementation),
                T(test_the_scripts_have_room_for_more_locals),
                T(test_expiries_beyond_the_budget_are_settled_over_calls),
                T(test_a_dead_node_is_reaped_in_pages),
                T(test_garbage_in_a_reaps_cursor_counts_from_zero),
                T(test_positions_say_queued_granted_refused_or_gone),
                T(test_status_lists_every_nodes_holders_and_the_first_waiters),
                T(test_a_pool_drain_refuses_every_waiter_within_the_budget),
                T(test_a_drained_member_is_not_granted),
                T(test_labelled_waiters_set_aside_members_and_disjoint_ones_flow),
                T(test_relabel_refuses_what_no_member_can_give_and_keeps_holders),
                T(test_other_labels_are_refused_naming_the_keys),
                T(test_a_drain_and_a_removed_lane_refuse_labelled_waiters),
                T(test_quarantine_counts_exit_statuses_in_redis_and_every_node_obeys_it),
                T(test_a_held_member_quarantined_by_hand_stays_out_when_released),
                T(test_garbage_quarantine_records_break_nothing_and_grant_nothing),
                T(test_a_drain_until_ends_by_itself_at_the_pools_own_instant),
                T(test_health_waiters_wait_beside_the_queue_and_a_pool_drain_refuses_them),
                T(test_health_also_takes_quarantined_members_first_and_its_grant_says_which),
                T(test_health_waiters_have_their_place_among_hq),
                T(test_a_pool_drain_with_a_reason_and_its_undrain),
                T(test_reclaim_inside_the_recovery_window),
                T(test_reclaim_outside_a_recovery_window_is_lost),
                T(test_redis_clock_tokens_follow_the_time),
                T(test_a_new_run_id_starts_a_recovery_window),
                T(test_a_node_restart_opens_no_recovery_window),
                T(test_tokens_never_go_back_after_a_loss),
                T(test_a_new_replication_id_starts_a_recovery_window),
                T(test_a_run_id_window_ends_when_every_node_reclaimed),
                T(test_the_pool_clock_absorbs_gaps_and_backward_steps),
                T(test_a_saturated_pool_sheds_at_the_saturated_budget),
                T(test_max_queue_refuses_full_and_an_unknown_lane_is_invalid),
                T(test_an_unregistered_node_or_another_version_is_refused),
                T(test_reconcile_drops_what_the_node_no_longer_has),
                T(test_an_orphan_released_by_its_node_is_freed_at_once),
                T(test_a_node_that_cannot_account_keeps_the_leases_its_page_misses),
                T(test_a_second_live_incarnation_is_refused_before_anything),
                T(test_a_key_lost_never_grants_a_held_slot_twice),
                T(test_reconcile_and_positions_are_paged),
                T(test_outcome_records_are_a_hash_per_node_trimmed_by_its_calls),
                T(test_a_set_is_granted_in_every_pool_in_one_call),
                T(test_a_set_sent_again_after_one_part_was_withdrawn_writes_nothing_twice),
                T(test_a_queued_set_holds_nothing_and_holds_back_those_behind_it),
                T(test_a_set_refused_by_one_pool_takes_nothing_in_the_others),
                T(test_crossed_sets_stand_off_only_until_the_second_pool_adopts),
                T(test_crossed_sets_of_a_node_a_pool_disagrees_with_are_refused_there),
                T(test_a_set_not_ready_at_its_grant_is_said_ready_again),
                T(test_a_known_set_part_said_ready_is_said_again),
                T(test_a_malformed_set_call_is_an_error),
                T(test_crossing_sets_stand_in_one_order_in_every_pool),
                T(test_a_batch_answers_as_its_operations_one_by_one),
                T(test_a_batch_run_says_its_last_stream_entry),
                T(test_a_batch_stops_where_an_operation_does_not_answer_ok),
                T(test_a_batch_leaves_the_keys_its_operations_leave_one_by_one),
                T(test_a_batch_reads_the_pools_state_once),
                T(test_an_instant_cut_short_is_finished_before_a_later_arrival),
                T(test_scripts_decide_as_pool_local_does),
                T(test_more_canons_than_the_library_keeps_parsed),
                T(test_script_time_at_10000_waiters),
                T(test_script_time_at_10000_labelled_waiters),
                L(test_a_renewing_node_is_kept_and_a_silent_one_lapses_at_its_ttl),
                L(test_an_idle_pools_clock_runs_while_its_nodes_renew),
                L(test_an_idle_pool_has_no_wakeup_and_a_renewal_reads_two_keys_a_pool),
                L(test_a_renewals_full_read_answers_the_nodes_fingerprint),
                L(test_a_silent_nodes_pools_are_ticked_by_one_renewal_after_its_ttl),
                L(test_a_renewal_names_a_pool_whose_recovery_window_is_open),
                L(test_a_renewal_finds_a_covered_registration_lost),
                L(test_bad_lives_entries_break_nothing),
                L(test_a_slow_renewal_widens_the_backend_clocks_gap),
                L(test_a_renewal_every_ttl_4_widens_the_backend_clocks_gap_to_its_period),
                L(test_a_clones_renewal_is_refused_and_reaps_nothing),
                L(test_bad_live_keys_cover_nothing_and_break_nothing),
                L(test_live_keys_lost_fall_back_to_the_registrations),
                L(test_an_acl_of_the_pools_keys_only_keeps_the_pools_working),
                T(test_a_released_slot_rests_until_its_end_and_is_the_next_wakeup),
                T(test_a_fail_fast_request_is_told_when_the_rest_ends),
                T(test_garbage_rests_are_ended_and_reported_never_granted_twice),
                T(test_a_resting_member_drained_and_undrained_keeps_the_books),
                T(test_a_dead_nodes_slot_rests_from_its_reap),
                T(test_cooldown_is_adopted_only_when_every_node_wants_it),
                T(test_a_lease_record_keeps_its_hash_and_garbage_there_is_hashed_again),
                T(test_a_garbage_lease_record_is_dropped_and_the_pool_made_anew),
                T(test_a_key_of_another_type_is_dropped_and_the_call_run_again),
                T(test_an_lk_member_that_is_no_slot_count_is_dropped_and_told),
                T(test_a_stale_head_held_back_is_dropped_by_the_dispatch),
                T(test_stored_rules_that_are_not_rules_are_rules_lost),
                T(test_hostile_writes_to_the_members_lives_break_nothing),
                T(test_wrong_lane_counts_are_counted_again),
                T(test_a_wrong_selective_count_is_counted_again),
                T(test_an_ordinary_wid_in_the_health_queue_is_passed_over),
                T(test_a_wid_left_without_its_record_is_dropped_by_the_dispatch),
                T(test_a_rid_reference_to_another_nodes_lease_is_not_followed),
                T(test_a_lease_record_naming_another_leases_slot_frees_nothing),
                T(test_an_undrain_or_restore_whose_record_was_lost_gives_the_place_back),
                T(test_a_run_id_window_whose_set_was_lost_runs_its_length),
#undef L
#undef T
        };
        struct CMUnitTest tests[ELEMENTSOF(cases)];
        enum part part = PART_ALL;
        size_t n = 0;
        int r;

        for (int i = 1; i < argc; i++) {
                if (strcmp(argv[i], "--alternate") == 0)
                        alternate = true;
                else if (strcmp(argv[i], "liveness") == 0)
                        part = PART_LIVENESS;
                else if (strcmp(argv[i], "others") == 0)
                        part = PART_OTHERS;
                else {
                        /* A misspelt part would run no case and pass. */
                        printf("Bail out! unknown argument %s (--alternate, liveness, others)\n", argv[i]);
                        return 1;
                }
        }
        for (size_t i = 0; i < ELEMENTSOF(cases); i++)
                if (part == PART_ALL || cases[i].liveness == (part == PART_LIVENESS))
                        tests[n++] = cases[i].test;

        if (!test_redis_find()) {
                printf("1..0 # SKIP redis-server not found (install redis-server, or set REDIS_SERVER)\n");
                return 0;
        }
        signal(SIGPIPE, SIG_IGN);
        r = test_redis_start(&server);
        if (r < 0) {
                printf("Bail out! redis-server did not start: %s\n", strerror(-r));
                return 1;
        }
        redis = redisConnectUnix(server.socket_path);
        if (!redis || redis->err) {
                printf("Bail out! cannot connect to %s\n", server.socket_path);
                test_redis_stop(&server);
                return 1;
        }
        if (getenv("TEST_FILTER")) /* one test while working on it: TEST_FILTER='test_hostile*' */
                cmocka_set_test_filter(getenv("TEST_FILTER"));
        redisReply *l = redisCommand(redis, "FUNCTION LOAD %s", shared_library);
        if (!l || l->type != REDIS_REPLY_STRING || strcmp(l->str, shared_library_name) != 0) {
                printf("Bail out! the library does not load: %s\n", l ? l->str : "?");
                test_redis_stop(&server);
                return 1;
        }
        freeReplyObject(l);
        for (size_t i = 0; i < shared_scripts_n; i++) {
                redisReply *s = redisCommand(redis, "SCRIPT LOAD %s", shared_scripts[i].text);
                if (!s || s->type != REDIS_REPLY_STRING) {
                        printf("Bail out! script %s does not load: %s\n", shared_scripts[i].name, s ? s->str : "?");
                        test_redis_stop(&server);
                        return 1;
                }
                snprintf(shas[i], sizeof shas[i], "%s", s->str);
                freeReplyObject(s);
        }
        r = _cmocka_run_group_tests("tests", tests, n, NULL, NULL);
        redisFree(redis);
        test_redis_stop(&server);
        return r;
}
