/* SPDX-License-Identifier: MIT */
/* fuzz-shared-replies.c — what brokerd reads from Redis, fed into a shared pool (pool-shared.h) as script
 * replies and stream entries, between requests, releases and link changes, on a fake clock. Whatever comes,
 * the pool must not crash and must keep its promise: the leases it hands out hold each slot once, below the
 * limit, with a member per slot (or none), a token in (0, 2^53); it never hands out more slots than the
 * limit; each request gets at most one final answer.
 *
 * Input: a sequence of frames, each an op byte then its operands; RESP values in RESP's own text form
 * (a small decoder here, bounded like brokerd's reader), so that a corpus file reads as a transcript:
 *   'R' VALUE        the answer to the oldest call taken ('E' VALUE: the call failed, no answer)
 *   'S' VALUE VALUE  a stream entry: its id (a bulk or simple string) and its fields (an array)
 *   'A' k w          a request of k slots (1 + byte % (limit + 1)), may wait if w is odd
 *   'W'              the newest waiting request withdrawn     'L'  the oldest lease released
 *   'T' n            n × 100 ms pass: run, fence check        'U' / 'D'  the link up / down
 *   'C'              take every call the pool has queued (answered later, in order, by 'R')
 * A bulk string "@N" (N a digit) stands for the rid of the N-th request submitted (as its submit call said):
 * a corpus file does not depend on how many random numbers the pool drew before. Anything else ends the
 * input. An input that begins with 'b' is of a pool that sends batches (SharedPoolParams.batch_max,
 * brokerd/lua/batch.lua): the answer to one is an array of replies. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool-shared.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define check(expr)                                                              \
        do {                                                                     \
                if (!(expr)) {                                                   \
                        fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #expr); \
                        abort();                                                 \
                }                                                                \
        } while (0)

#define LIMIT 3
#define VALUES_MAX 4096
#define DEPTH_MAX 7
#define TRIES_MAX 64
#define CALLS_MAX 256
#define NODE "0123456789abcdef0123456789abcdef"

static const char *const members[] = { "a", "b", "c", NULL };

/* ---- RESP, decoded into an arena ---- */

typedef struct Decoder {
        const uint8_t *p, *end;
        RespValue values[VALUES_MAX];
        size_t used;
        char (*rids)[17];       /* "@N" */
        size_t n_rids;
} Decoder;

static bool read_line(Decoder *d, const char **ret, size_t *ret_len) {
        const uint8_t *s = d->p;
        while (d->p + 1 < d->end && !(d->p[0] == '\r' && d->p[1] == '\n'))
                d->p++;
        if (d->p + 1 >= d->end)
                return false;
        *ret = (const char *) s;
        *ret_len = (size_t) (d->p - s);
        d->p += 2;
        return true;
}

static bool parse_int(const char *s, size_t len, int64_t *ret) {
        if (len == 0 || len > 20)
                return false;
        char buf[24];
        memcpy(buf, s, len);
        buf[len] = 0;
        char *end;
        long long x = strtoll(buf, &end, 10);
        if (*end)
                return false;
        *ret = x;
        return true;
}

static bool decode(Decoder *d, RespValue *v, unsigned depth) {
        if (d->p >= d->end || depth > DEPTH_MAX)
                return false;
        char type = (char) *d->p++;
        const char *line;
        size_t len;
        int64_t n;
        if (!read_line(d, &line, &len))
                return false;
        switch (type) {
        case '+':
        case '-':
                *v = (RespValue) { .type = type == '+' ? RESP_STRING : RESP_ERROR, .str = line, .len = len };
                return true;
        case ':':
                if (!parse_int(line, len, &n))
                        return false;
                *v = (RespValue) { .type = RESP_INTEGER, .integer = n };
                return true;
        case '$':
                if (!parse_int(line, len, &n) || n < -1)
                        return false;
                if (n == -1) {
                        *v = (RespValue) { .type = RESP_NIL };
                        return true;
                }
                if ((uint64_t) n + 2 > (uint64_t) (d->end - d->p))
                        return false;
                *v = (RespValue) { .type = RESP_STRING, .str = (const char *) d->p, .len = (size_t) n };
                if (n == 2 && d->p[0] == '@' && d->p[1] >= '0' && d->p[1] <= '9' &&
                    (size_t) (d->p[1] - '0') < d->n_rids)
                        *v = (RespValue) { .type = RESP_STRING, .str = d->rids[d->p[1] - '0'], .len = 16 };
                d->p += n + 2;
                return true;
        case '*':
                if (!parse_int(line, len, &n) || n < -1 || n > (int64_t) (VALUES_MAX - d->used))
                        return false;
                if (n == -1) {
                        *v = (RespValue) { .type = RESP_NIL };
                        return true;
                }
                RespValue *e = &d->values[d->used];
                d->used += (size_t) n;
                for (int64_t i = 0; i < n; i++)
                        if (!decode(d, &e[i], depth + 1))
                                return false;
                *v = (RespValue) { .type = RESP_ARRAY, .elements = e, .n = (size_t) n };
                return true;
        default:
                return false;
        }
}

/* ---- the pool's side, checked ---- */

typedef struct Try {
        bool live, answered, queued;
        unsigned k;
        PoolWaiter *waiter;
} Try;

typedef struct Lease {
        PoolGrant *grant;
        unsigned n_slots;
        unsigned slots[LIMIT];
        bool lost;
} Lease;

typedef struct State {
        Pool *pool;
        Try tries[TRIES_MAX];
        size_t n_tries;
        Lease leases[TRIES_MAX];
        size_t n_leases;
        uint64_t calls[CALLS_MAX];
        size_t n_calls;
        uint64_t random;
        usec_t now;
        char rids[TRIES_MAX][17];
        size_t n_rids;
} State;

static void check_leases(const State *s) {
        unsigned held = 0;
        bool used[LIMIT] = {};
        for (size_t i = 0; i < s->n_leases; i++) {
                const Lease *l = &s->leases[i];
                if (l->lost)
                        continue;
                held += l->n_slots;
                for (unsigned j = 0; j < l->n_slots; j++) {
                        check(l->slots[j] < LIMIT);
                        check(!used[l->slots[j]]);
                        used[l->slots[j]] = true;
                }
        }
        check(held <= LIMIT);
        PoolInfo info;
        s->pool->ops->info(s->pool, s->now, &info);
        check(info.in_use <= LIMIT);
}

static bool verbose;

static void on_decision(const PoolDecision *d, void *userdata) {
        State *s = userdata;
        if (verbose)
                fprintf(stderr, "decision %d, %u slots, token %llu, reason %s\n", (int) d->verdict, d->n_slots,
                        (unsigned long long) d->token, d->reason ?: "-");
        Try *t = NULL;
        if (d->verdict != POOL_VERDICT_LOST && d->verdict != POOL_VERDICT_CONGESTION) {
                check(d->cookie);
                t = d->cookie;
                check(t->live && !t->answered);
        }
        switch (d->verdict) {
        case POOL_VERDICT_GRANTED: {
                check(d->grant && d->n_slots == t->k && d->n_slots <= LIMIT);
                check(d->token > 0 && d->token < (UINT64_C(1) << 53));
                check(s->n_leases < TRIES_MAX);
                Lease *l = &s->leases[s->n_leases++];
                *l = (Lease) { .grant = d->grant, .n_slots = d->n_slots };
                for (unsigned i = 0; i < d->n_slots; i++) {
                        l->slots[i] = d->slots[i];
                        /* A member per slot, the configured one (engine_lease_new() reads n_slots of them). */
                        check(d->members && d->slots[i] < LIMIT && strcmp(d->members[i], members[d->slots[i]]) == 0);
                }
                s->pool->ops->bind_grant(s->pool, d->grant, l);
                t->answered = true;
                break;
        }
        case POOL_VERDICT_REFUSED:
                t->answered = true;
                break;
        case POOL_VERDICT_QUEUED:
                check(!t->queued);
                t->queued = true;
                t->waiter = d->waiter;
                break;
        case POOL_VERDICT_LOST: {
                Lease *l = d->cookie;
                check(l && !l->lost);
                l->lost = true;
                break;
        }
        default:
                break;
        }
        check_leases(s);
}

static uint64_t next_random(void *userdata) {
        State *s = userdata;
        return ++s->random * 0x9e3779b97f4a7c15ULL;
}

/* A submit's rid, the first time it is sent (README: ARGV [6]). */
static void rid_seen(State *s, const char *rid) {
        if (strlen(rid) != 16 || s->n_rids >= TRIES_MAX)
                return;
        for (size_t i = 0; i < s->n_rids; i++)
                if (strcmp(s->rids[i], rid) == 0)
                        return;
        memcpy(s->rids[s->n_rids++], rid, 17);
}

static void take_calls(State *s) {
        const SharedCall *c;
        while (s->n_calls < CALLS_MAX && pool_shared_take_call(s->pool, s->now, &c)) {
                s->calls[s->n_calls++] = c->id;
                if (c->script == SHARED_SCRIPT_SUBMIT && c->argc > 6)
                        rid_seen(s, c->argv[6]);
                /* A batch: [6] n, then OP, M, M arguments (brokerd/lua/batch.lua). */
                for (size_t i = 7; c->script == SHARED_SCRIPT_BATCH && i + 1 < c->argc;) {
                        size_t m = strtoul(c->argv[i + 1], NULL, 10);
                        check(i + 2 + m <= c->argc);
                        if (strcmp(c->argv[i], "submit") == 0 && m > 0)
                                rid_seen(s, c->argv[i + 2]);
                        i += 2 + m;
                }
        }
}

static void answer(State *s, int error, const RespValue *v) {
        if (s->n_calls == 0)
                return;
        uint64_t id = s->calls[0];
        memmove(s->calls, s->calls + 1, --s->n_calls * sizeof(uint64_t));
        pool_shared_call_done(s->pool, id, error, v, s->now, s->now);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        static State s;
        static Decoder d;
        verbose = getenv("FUZZ_VERBOSE");
        memset(&s, 0, sizeof s);
        s.now = 1000 * USEC_PER_SEC;
        SharedPoolParams params = {
                .node_id = NODE,
                .node_name = "fuzz",
                .node_ttl = 30 * USEC_PER_SEC,
                .revoke_grace = 5 * USEC_PER_SEC,
                .waiter_grace = 5 * USEC_PER_SEC,
                .heartbeat = USEC_PER_SEC,
                .random = next_random,
                .random_userdata = &s,
                .batch_max = size > 0 && data[0] == 'b' ? SHARED_BATCH_OPS_MAX : 0,
        };
        if (params.batch_max > 0) {
                data++;
                size--;
        }
        check(pool_shared_new("fuzz", &params, on_decision, &s, &s.pool) == 0);
        PoolConfig pc = { .name = (char *) "fuzz", .limit = LIMIT, .members = (char **) members, .max_queue = -1 };
        PoolLaneRule rules[] = { { .lane = "ci", .priority = 0, .max_in_use = -1 } };
        check(s.pool->ops->configure(s.pool, &pc, rules, 1, s.now) == 0);
        pool_shared_link_up(s.pool, "run", s.now);

        d.p = data;
        d.end = data + size;
        d.rids = s.rids;
        while (d.p < d.end) {
                uint8_t op = *d.p++;
                RespValue a, b;
                d.used = 0;
                d.n_rids = s.n_rids;
                if (op == 'R' || op == 'E') {
                        if (!decode(&d, &a, 0))
                                break;
                        take_calls(&s);
                        answer(&s, op == 'E' ? -ECONNRESET : 0, op == 'E' ? NULL : &a);
                } else if (op == 'S') {
                        if (!decode(&d, &a, 0) || !decode(&d, &b, 0))
                                break;
                        if (a.type == RESP_STRING && a.len < 64) {
                                char id[64];
                                memcpy(id, a.str, a.len);
                                id[a.len] = 0;
                                pool_shared_stream_entry(s.pool, id, &b, s.now);
                        }
                } else if (op == 'A') {
                        if (d.end - d.p < 2 || s.n_tries == TRIES_MAX)
                                break;
                        Try *t = &s.tries[s.n_tries++];
                        *t = (Try) { .live = true, .k = 1 + d.p[0] % LIMIT };
                        PoolTry pt = { .cookie = t, .lane = "ci", .slots = t->k, .may_wait = d.p[1] & 1,
                                       .lane_budget = USEC_INFINITY, .client_cap = USEC_INFINITY, .arrival = s.now };
                        d.p += 2;
                        check(s.pool->ops->submit(s.pool, &pt, s.now) == 0);
                } else if (op == 'W') {
                        for (size_t i = s.n_tries; i-- > 0;) {
                                Try *t = &s.tries[i];
                                if (t->live && !t->answered && t->queued) {
                                        s.pool->ops->withdraw(s.pool, t->waiter, s.now);
                                        t->live = false;
                                        break;
                                }
                        }
                } else if (op == 'L') {
                        for (size_t i = 0; i < s.n_leases; i++) {
                                Lease *l = &s.leases[i];
                                if (l->grant) {
                                        s.pool->ops->release(s.pool, l->grant, s.now);
                                        l->grant = NULL;
                                        l->lost = true; /* not held any more */
                                        break;
                                }
                        }
                } else if (op == 'T') {
                        if (d.p >= d.end)
                                break;
                        s.now += (usec_t) (1 + *d.p++) * 100 * USEC_PER_MSEC;
                        s.pool->ops->run(s.pool, s.now);
                        pool_shared_fence_check(s.pool, s.now, s.now);
                } else if (op == 'U') {
                        pool_shared_link_up(s.pool, "run", s.now);
                } else if (op == 'D') {
                        pool_shared_link_down(s.pool, s.now);
                        s.n_calls = 0;
                } else if (op == 'C') {
                        take_calls(&s);
                } else
                        break;
                SharedNotice n;
                while (pool_shared_pop_notice(s.pool, &n))
                        shared_notice_done(&n);
                check_leases(&s);
        }
        /* Grants still held are the engine's to release before the pool goes. */
        for (size_t i = 0; i < s.n_leases; i++)
                if (s.leases[i].grant)
                        s.pool->ops->release(s.pool, s.leases[i].grant, s.now);
        s.pool->ops->free(s.pool);
        return 0;
}
