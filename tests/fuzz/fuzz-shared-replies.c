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
 * brokerd/lua/batch.lua): the answer to one is an array of replies. One that begins with 's' (after the 'b',
 * if any) has a second pool "fuzz2" on the same backend, and its requests are all-or-nothing sets over both
 * (submit_set(), brokerd/lua/set.lua: one call, sent by the first pool, answered { status, pool, verdict,
 * { reply… } }); there
 *   'A' k w          is a set of k slots in each pool         'G'  the newest set said ready in both is granted
 *   'Z' VALUE VALUE  a stream entry of the second pool        'W'  withdraws both parts of a set
 * and 'U', 'D', 'T' act on both pools. Beyond the promises above: a set is never held in part (what an
 * answer grants in one pool while another refused it is given back, as the engine does, and must have been
 * answered so: never a part granted alone by a set's answer), and each part is answered. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool-shared.h"
#include "fuzz.h"

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
        bool live, answered, queued, granted;
        unsigned k;
        size_t pool;            /* its pool's index */
        struct Try *partner;    /* a set's other part (NULL: a lone request) */
        PoolWaiter *waiter;
        struct Lease *lease;
} Try;

typedef struct Lease {
        PoolGrant *grant;
        size_t pool;
        unsigned n_slots;
        unsigned slots[LIMIT];
        bool lost;
} Lease;

#define POOLS_MAX 2

typedef struct State {
        Pool *pool;             /* pools[0] */
        Pool *pools[POOLS_MAX];
        size_t n_pools;
        Try tries[TRIES_MAX];
        size_t n_tries;
        Lease leases[TRIES_MAX];
        size_t n_leases;
        uint64_t calls[CALLS_MAX];
        size_t call_pool[CALLS_MAX];
        bool call_set[CALLS_MAX];       /* a set's call (SHARED_SCRIPT_SET) */
        size_t n_calls;
        uint64_t random;
        usec_t now;
        char rids[TRIES_MAX][17];
        size_t n_rids;
} State;

static void check_leases(const State *s) {
        for (size_t p = 0; p < s->n_pools; p++) {
                unsigned held = 0;
                bool used[LIMIT] = {};
                for (size_t i = 0; i < s->n_leases; i++) {
                        const Lease *l = &s->leases[i];
                        if (l->lost || l->pool != p)
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
                s->pools[p]->ops->info(s->pools[p], s->now, &info);
                check(info.in_use <= LIMIT);
        }
}

static size_t pool_index(const State *s, const Pool *p) {
        for (size_t i = 0; i < s->n_pools; i++)
                if (s->pools[i] == p)
                        return i;
        check(!"a decision of no pool of ours");
        return 0;
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
                check(pool_index(s, d->pool) == t->pool);
        }
        switch (d->verdict) {
        case POOL_VERDICT_GRANTED: {
                check(d->grant && d->n_slots == t->k && d->n_slots <= LIMIT);
                check(d->token > 0 && d->token < (UINT64_C(1) << 53));
                check(s->n_leases < TRIES_MAX);
                Lease *l = &s->leases[s->n_leases++];
                *l = (Lease) { .grant = d->grant, .pool = t->pool, .n_slots = d->n_slots };
                for (unsigned i = 0; i < d->n_slots; i++) {
                        l->slots[i] = d->slots[i];
                        /* A member per slot, the configured one (engine_lease_new() reads n_slots of them). */
                        check(d->members && d->slots[i] < LIMIT && strcmp(d->members[i], members[d->slots[i]]) == 0);
                }
                s->pools[t->pool]->ops->bind_grant(s->pools[t->pool], d->grant, l);
                t->answered = t->granted = true;
                t->lease = l;
                break;
        }
        case POOL_VERDICT_REFUSED:
                t->answered = true;
                break;
        case POOL_VERDICT_QUEUED:
                /* A set's part is queued again after a grant call found it not ready ('G' unqueues it). */
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
        for (size_t p = 0; p < s->n_pools; p++) {
                while (s->n_calls < CALLS_MAX && pool_shared_take_call(s->pools[p], s->now, &c)) {
                        s->call_pool[s->n_calls] = p;
                        s->call_set[s->n_calls] = c->script == SHARED_SCRIPT_SET;
                        s->calls[s->n_calls++] = c->id;
                        if (c->script == SHARED_SCRIPT_SUBMIT && c->argc > 6)
                                rid_seen(s, c->argv[6]);
                        /* A set: KEYS, the head, [6] mode, [7] rid (set.lua's ARGV). */
                        if (c->script == SHARED_SCRIPT_SET && c->argc > c->n_keys + 6)
                                rid_seen(s, c->argv[c->n_keys + 6]);
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
}

static void answer(State *s, int error, const RespValue *v) {
        if (s->n_calls == 0)
                return;
        uint64_t id = s->calls[0];
        size_t p = s->call_pool[0];
        bool set = s->call_set[0];
        memmove(s->calls, s->calls + 1, --s->n_calls * sizeof(uint64_t));
        memmove(s->call_pool, s->call_pool + 1, s->n_calls * sizeof(size_t));
        memmove(s->call_set, s->call_set + 1, s->n_calls * sizeof(bool));
        bool granted[TRIES_MAX];
        for (size_t i = 0; i < s->n_tries; i++)
                granted[i] = s->tries[i].granted;
        pool_shared_call_done(s->pools[p], id, error, v, s->now, s->now);
        /* A set's answer grants every part or none; only "known" (each pool's state of a rid Redis knew) may
         * say otherwise, and the engine gives that back. */
        bool known = v && v->type == RESP_ARRAY && v->n == 4 && v->elements[2].type == RESP_STRING &&
                     v->elements[2].len == 5 && memcmp(v->elements[2].str, "known", 5) == 0;
        for (size_t i = 0; set && !known && i < s->n_tries; i++) {
                const Try *t = &s->tries[i];
                if (t->partner && t->granted && !granted[i])
                        check(t->partner->granted);
        }
}

static Pool *find_pool(const char *name, void *userdata) {
        State *s = userdata;
        for (size_t i = 0; i < s->n_pools; i++)
                if (s->pools[i] && strcmp(s->pools[i]->name, name) == 0)
                        return s->pools[i];
        return NULL;
}

static void try_withdraw(State *s, Try *t) {
        if (t->live && !t->answered && t->queued)
                s->pools[t->pool]->ops->withdraw(s->pools[t->pool], t->waiter, s->now);
        else if (t->live && !t->answered)
                s->pools[t->pool]->ops->cancel_try(s->pools[t->pool], t, s->now);
        t->live = false;
}

static void lease_release(State *s, Lease *l) {
        if (!l->grant)
                return;
        s->pools[l->pool]->ops->release(s->pools[l->pool], l->grant, s->now);
        l->grant = NULL;
        l->lost = true; /* not held any more */
}

/* The engine's part (engine.c, set_route_decide(), set_grant_done()): a set granted in one pool and refused
 * (or left waiting) in the other after its answers is given back whole. A set's own answer never does so:
 * its "granted" grants every part or none. Only "known" (each pool's state of a rid Redis knew) may. */
static void sets_settle(State *s) {
        for (size_t i = 0; i < s->n_tries; i++) {
                Try *t = &s->tries[i], *o = t->partner;
                if (!o || t->pool != 0 || !t->live || !o->live)
                        continue;
                bool settled = (t->answered || t->queued) && (o->answered || o->queued);
                if (!settled || t->granted == o->granted)
                        continue;
                Try *parts[2] = { t, o };
                for (size_t j = 0; j < 2; j++) {
                        if (parts[j]->granted)
                                lease_release(s, parts[j]->lease);
                        else
                                try_withdraw(s, parts[j]);
                        parts[j]->live = false;
                }
        }
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
                .find_pool = find_pool,
                .find_pool_userdata = &s,
        };
        if (params.batch_max > 0) {
                data++;
                size--;
        }
        bool sets = size > 0 && data[0] == 's';
        if (sets) {
                data++;
                size--;
        }
        static const char *const names[POOLS_MAX] = { "fuzz", "fuzz2" };
        s.n_pools = sets ? 2 : 1;
        for (size_t i = 0; i < s.n_pools; i++) {
                check(pool_shared_new(names[i], &params, on_decision, &s, &s.pools[i]) == 0);
                PoolConfig pc = { .name = (char *) names[i], .limit = LIMIT, .members = (char **) members,
                                  .max_queue = -1 };
                PoolLaneRule rules[] = { { .lane = "ci", .priority = 0, .max_in_use = -1 } };
                check(pool_configure(s.pools[i], &pc, rules, 1, s.now) == 0);
                pool_shared_link_up(s.pools[i], "run", s.now);
        }
        s.pool = s.pools[0];

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
                } else if (op == 'S' || (op == 'Z' && sets)) {
                        if (!decode(&d, &a, 0) || !decode(&d, &b, 0))
                                break;
                        if (a.type == RESP_STRING && a.len < 64) {
                                char id[64];
                                memcpy(id, a.str, a.len);
                                id[a.len] = 0;
                                pool_shared_stream_entry(s.pools[op == 'Z'], id, &b, s.now);
                        }
                } else if (op == 'A') {
                        if (d.end - d.p < 2 || s.n_tries + s.n_pools > TRIES_MAX)
                                break;
                        PoolTry pt[POOLS_MAX];
                        Try *t = &s.tries[s.n_tries];
                        for (size_t i = 0; i < s.n_pools; i++) {
                                t[i] = (Try) { .live = true, .k = 1 + d.p[0] % LIMIT, .pool = i,
                                               .partner = sets ? &t[1 - i] : NULL };
                                pt[i] = (PoolTry) { .cookie = &t[i], .lane = "ci", .slots = t[i].k,
                                                    .may_wait = d.p[1] & 1, .lane_budget = USEC_INFINITY,
                                                    .client_cap = USEC_INFINITY, .arrival = s.now };
                        }
                        s.n_tries += s.n_pools;
                        d.p += 2;
                        if (sets)
                                check(s.pool->ops->submit_set(s.pools, pt, 2, s.now) == 0);
                        else
                                check(s.pool->ops->submit(s.pool, pt, s.now) == 0);
                } else if (op == 'W') {
                        for (size_t i = s.n_tries; i-- > 0;) {
                                Try *t = &s.tries[i];
                                if (t->live && !t->answered && t->queued) {
                                        try_withdraw(&s, t);
                                        if (t->partner)
                                                try_withdraw(&s, t->partner);
                                        break;
                                }
                        }
                } else if (op == 'G' && sets) {
                        for (size_t i = s.n_tries; i-- > 0;) {
                                Try *t = &s.tries[i], *o = t->partner;
                                if (t->pool != 0 || !t->live || t->answered || !t->queued || !o->live ||
                                    o->answered || !o->queued || !s.pools[0]->ops->ready(s.pools[0], t->waiter) ||
                                    !s.pools[1]->ops->ready(s.pools[1], o->waiter))
                                        continue;
                                PoolWaiter *w[2] = { t->waiter, o->waiter };
                                if (s.pool->ops->grant_set(s.pools, w, 2, s.now) == 0)
                                        t->queued = o->queued = false; /* their answers awaited */
                                break;
                        }
                } else if (op == 'L') {
                        for (size_t i = 0; i < s.n_leases; i++) {
                                Lease *l = &s.leases[i];
                                if (l->grant) {
                                        lease_release(&s, l);
                                        break;
                                }
                        }
                } else if (op == 'T') {
                        if (d.p >= d.end)
                                break;
                        s.now += (usec_t) (1 + *d.p++) * 100 * USEC_PER_MSEC;
                        for (size_t i = 0; i < s.n_pools; i++) {
                                s.pools[i]->ops->run(s.pools[i], s.now);
                                pool_shared_fence_check(s.pools[i], s.now, s.now);
                        }
                } else if (op == 'U') {
                        for (size_t i = 0; i < s.n_pools; i++)
                                pool_shared_link_up(s.pools[i], "run", s.now);
                } else if (op == 'D') {
                        for (size_t i = 0; i < s.n_pools; i++)
                                pool_shared_link_down(s.pools[i], s.now);
                        s.n_calls = 0;
                } else if (op == 'C') {
                        take_calls(&s);
                } else
                        break;
                SharedNotice n;
                for (size_t i = 0; i < s.n_pools; i++)
                        while (pool_shared_pop_notice(s.pools[i], &n))
                                shared_notice_done(&n);
                sets_settle(&s);
                check_leases(&s);
        }
        /* Grants still held are the engine's to release before the pool goes. */
        for (size_t i = 0; i < s.n_leases; i++)
                lease_release(&s, &s.leases[i]);
        for (size_t i = s.n_pools; i-- > 0;) {
                s.pools[i]->ops->free(s.pools[i]);
                s.pools[i] = NULL;
        }
        return 0;
}
