/* SPDX-License-Identifier: MIT */
/* bench-shared-replies — a shared pool's reply naming members by name, the engine alone: how long does a pool of
 * MEMBERS members take to read a reply whose cache lists LISTED of them quarantined (lua/README, "Members'
 * lives"), each found among the members by name, or lists them drained (each taken once)? The same reply listing
 * none is the reference, in the same run.
 *
 *   bench-shared-replies [MEMBERS [LISTED [ROUNDS]]]        (defaults 10000, 5000, 5)
 *
 * No Redis: the pool's calls are taken from its outbox and answered with canned replies on a fake clock, as
 * test-pool-shared does. Members are listed in an order that is not their names', the reply in another. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench-util.h"
#include "macro.h"
#include "pool-shared.h"
#include "resp.h"
#include "strv.h"

#define S(x) ((usec_t) (x) * USEC_PER_SEC)

static uint64_t random_state;
static uint64_t next_random(void *userdata) {
        return ++random_state;
}
static void on_wake(void *userdata) {
}
static void on_decision(const PoolDecision *d, void *userdata) {
}

static RespValue str(const char *s) {
        return (RespValue) { .type = RESP_STRING, .str = s, .len = strlen(s) };
}
static RespValue num(int64_t i) {
        return (RespValue) { .type = RESP_INTEGER, .integer = i };
}
static RespValue array(RespValue *e, size_t n) {
        return (RespValue) { .type = RESP_ARRAY, .elements = e, .n = n };
}

/* The pool's next tick, after *now (moved to it): answered, its cache listing `life` (n entries) as quarantined
 * and `drains` (n_drains entries) drained. Returns the time the answer took to read. */
static uint64_t answer_tick(Pool *pool, usec_t *now, const RespValue *life, size_t n, const RespValue *drains,
                           size_t n_drains) {
        const SharedCall *c = NULL;
        for (size_t i = 0; i < 120 && !pool_shared_take_call(pool, *now, &c); i++) {
                *now += S(1);
                pool->ops->run(pool, *now);
        }
        if (!c || c->script != SHARED_SCRIPT_TICK) {
                fprintf(stderr, "bench-shared-replies: no tick to answer at %llu s (%s)\n", (unsigned long long) (*now / USEC_PER_SEC), c ? shared_script_to_string(c->script) : "no call");
                exit(EXIT_FAILURE);
        }
        RespValue fp[] = { num(0), num(0), num(0) };
        RespValue body[] = { num(0), str("e1"), num(0), str("ok"), array(NULL, 0), array(fp, 3), str("0-0"), num(2),
                             str("") };
        RespValue cache[] = { num(0), num(0), num(0), num(0), num(0), num(-1), num(100), str("e1"), num(0), str(""),
                              num(2), str(""), array(NULL, 0), array((RespValue *) life, n),
                              array((RespValue *) drains, n_drains) };
        RespValue reply[] = { str("ok"), num((int64_t) *now), array(body, 9), array(NULL, 0), array(cache, 15),
                              array(NULL, 0) };
        RespValue r = array(reply, 6);
        uint64_t t0 = bench_now_ns();
        pool_shared_call_done(pool, c->id, 0, &r, *now, *now);
        return bench_now_ns() - t0;
}

int main(int argc, char **argv) {
        size_t n = argc > 1 ? strtoul(argv[1], NULL, 10) : 10000;
        size_t listed = argc > 2 ? strtoul(argv[2], NULL, 10) : 5000;
        size_t rounds = argc > 3 ? strtoul(argv[3], NULL, 10) : 5;
        char load[128];
        if (n == 0 || listed > n || rounds == 0) {
                fprintf(stderr, "usage: bench-shared-replies [MEMBERS [LISTED ≤ MEMBERS [ROUNDS]]]\n");
                return EXIT_FAILURE;
        }
        char **members = calloc(n + 1, sizeof(char *));
        RespValue *life = calloc(listed, sizeof(RespValue)), *fields = calloc(listed * 6, sizeof(RespValue)),
                  *drains = calloc(listed, sizeof(RespValue)), *drain_fields = calloc(listed * 6, sizeof(RespValue));
        if (!members || !life || !fields || !drains || !drain_fields)
                return EXIT_FAILURE;
        for (size_t i = 0; i < n; i++)
                if (asprintf(&members[i], "rig-%zu", (i * 7919) % n) < 0)
                        return EXIT_FAILURE;
        /* From the last member back, every (n / listed)th. */
        for (size_t k = 0; k < listed; k++) {
                RespValue *e = fields + 6 * k;
                e[0] = str(members[n - 1 - k * (n / listed)]);
                e[1] = num(S(1));
                e[2] = str("job");
                e[3] = num(3);
                e[4] = str("node-b");
                e[5] = str("");
                life[k] = array(e, 6);
                RespValue *d = drain_fields + 6 * k;
                d[0] = e[0];
                d[1] = num(S(1));
                d[2] = str("uid 0");
                d[3] = str("");
                d[4] = num(-1);
                d[5] = str("node-b");
                drains[k] = array(d, 6);
        }

        SharedPoolParams params = { .node_id = "0123456789abcdef0123456789abcdef", .node_name = "runner-1",
                                    .node_ttl = S(30), .revoke_grace = S(5), .waiter_grace = S(5), .heartbeat = S(1),
                                    .random = next_random, .wake = on_wake };
        Pool *pool = NULL;
        if (pool_shared_new("grid", &params, on_decision, NULL, &pool) < 0)
                return EXIT_FAILURE;
        PoolConfig pc = { .name = (char *) "grid", .limit = (unsigned) n, .max_queue = -1, .members = members,
                          .n_members = n, .quarantine_exit_codes = { UINT64_C(1) << 3 },
                          .quarantine_exit_codes_set = true, .quarantine_after = 2 };
        PoolLaneRule rules[] = { { .lane = "ci", .priority = 0, .max_in_use = -1 } };
        if (pool_configure(pool, &pc, rules, 1, S(1)) < 0)
                return EXIT_FAILURE;
        usec_t now = S(1);
        pool_shared_link_up(pool, "run1", now);
        answer_tick(pool, &now, NULL, 0, NULL, 0);

        printf("bench-shared-replies: load average %s\n", bench_loadavg(load, sizeof load));
        uint64_t none_max = 0, listed_max = 0, listed_min = UINT64_MAX, drains_max = 0, drains_min = UINT64_MAX;
        for (size_t i = 0; i < rounds; i++) {
                /* Each round the list and then none: every quarantine is new, then every one ends; the same with
                 * drains. */
                uint64_t t = answer_tick(pool, &now, life, listed, NULL, 0);
                listed_max = MAX(listed_max, t);
                listed_min = MIN(listed_min, t);
                none_max = MAX(none_max, answer_tick(pool, &now, NULL, 0, NULL, 0));
                t = answer_tick(pool, &now, NULL, 0, drains, listed);
                drains_max = MAX(drains_max, t);
                drains_min = MIN(drains_min, t);
                none_max = MAX(none_max, answer_tick(pool, &now, NULL, 0, NULL, 0));
        }
        PoolInfo info;
        size_t quarantined = 0;
        answer_tick(pool, &now, life, listed, drains, listed);
        pool->ops->info(pool, now, &info);
        for (size_t i = 0; i < info.n_life; i++)
                quarantined += info.life[i].quarantined;
        if (quarantined != listed || info.n_drains != listed) {
                fprintf(stderr, "bench-shared-replies: %zu quarantined and %zu drained, expected %zu\n", quarantined,
                        info.n_drains, listed);
                return EXIT_FAILURE;
        }
        printf("members %zu, listed %zu, %zu rounds: a reply listing them quarantined read in %.2f ms (fastest) to "
               "%.2f ms, drained %.2f ms to %.2f ms, one listing none at most %.2f ms\n",
               n, listed, rounds, listed_min / 1e6, listed_max / 1e6, drains_min / 1e6, drains_max / 1e6,
               none_max / 1e6);
        pool->ops->free(pool);
        free(drain_fields);
        free(drains);
        free(fields);
        free(life);
        strv_free(members);
        return 0;
}
