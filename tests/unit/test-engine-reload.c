/* SPDX-License-Identifier: MIT */
/* test-engine-reload.c — a reload applies wholly or not at all: engine_configure() made to fail at its N-th
 * allocation, for every N until a run makes fewer than N, leaves the engine as it was.
 *
 * meson links this test with --wrap for every allocation function the engine's objects call (tests/meson.build):
 * while a countdown is armed, the N-th allocation fails. Two engines go through the same history: one (A)
 * gets the failing reload, the other (B) none. "As it was" is then A's state equal to B's: every pool's info
 * (limit, members, drains, quarantines, rests, holders, waiters), every request's and lease's, the drain
 * records, the next wakeup, and no event from the failed call. Lanes and their rules are not visible but by
 * what they decide: both engines then get the same requests, and must decide them alike (the old lanes still
 * route, the new ones do not exist yet). Last, both apply the new configuration for real and must agree again.
 *
 * Pool "farm" is kept by a backend (a shared pool, its link up and no Redis behind it): a failed reload must not
 * have queued anything for Redis either (its rules, a fingerprint): the calls its engine's pools queued are
 * counted (SharedPoolParams.call_order). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"
#include "pool-shared.h"
#include "pool.h"
#include "strv.h"

/* ---- allocation failure, by countdown ---- */

static bool alloc_armed;
static unsigned long alloc_count, alloc_fail_at;
static bool alloc_failed;

static bool alloc_fails(void) {
        if (!alloc_armed)
                return false;
        if (++alloc_count != alloc_fail_at)
                return false;
        alloc_failed = true;
        return true;
}

void *__real_malloc(size_t size);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t size);
void *__real_reallocarray(void *p, size_t n, size_t size);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
int __real___vasprintf_chk(char **ret, int flag, const char *format, va_list ap);
int __real_vasprintf(char **ret, const char *format, va_list ap);

void *__wrap_malloc(size_t size);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t size);
void *__wrap_reallocarray(void *p, size_t n, size_t size);
char *__wrap_strdup(const char *s);
char *__wrap_strndup(const char *s, size_t n);
int __wrap___vasprintf_chk(char **ret, int flag, const char *format, va_list ap);
int __wrap___asprintf_chk(char **ret, int flag, const char *format, ...);
int __wrap_vasprintf(char **ret, const char *format, va_list ap);
int __wrap_asprintf(char **ret, const char *format, ...);

void *__wrap_malloc(size_t size) {
        return alloc_fails() ? NULL : __real_malloc(size);
}
void *__wrap_calloc(size_t n, size_t size) {
        return alloc_fails() ? NULL : __real_calloc(n, size);
}
void *__wrap_realloc(void *p, size_t size) {
        return alloc_fails() ? NULL : __real_realloc(p, size);
}
void *__wrap_reallocarray(void *p, size_t n, size_t size) {
        return alloc_fails() ? NULL : __real_reallocarray(p, n, size);
}
char *__wrap_strdup(const char *s) {
        return alloc_fails() ? NULL : __real_strdup(s);
}
char *__wrap_strndup(const char *s, size_t n) {
        return alloc_fails() ? NULL : __real_strndup(s, n);
}
int __wrap___vasprintf_chk(char **ret, int flag, const char *format, va_list ap) {
        return alloc_fails() ? -1 : __real___vasprintf_chk(ret, flag, format, ap);
}
int __wrap___asprintf_chk(char **ret, int flag, const char *format, ...) {
        if (alloc_fails())
                return -1;
        va_list ap;
        va_start(ap, format);
        int r = __real___vasprintf_chk(ret, flag, format, ap);
        va_end(ap);
        return r;
}
/* Unfortified builds call these. */
int __wrap_vasprintf(char **ret, const char *format, va_list ap) {
        return alloc_fails() ? -1 : __real_vasprintf(ret, format, ap);
}
int __wrap_asprintf(char **ret, const char *format, ...) {
        if (alloc_fails())
                return -1;
        va_list ap;
        va_start(ap, format);
        int r = __real_vasprintf(ret, format, ap);
        va_end(ap);
        return r;
}

/* ---- configurations ---- */

#define MS(x) ((usec_t) (x) * USEC_PER_MSEC)
#define S(x) ((usec_t) (x) * USEC_PER_SEC)

typedef struct Key {
        const char *section, *key, *value;
} Key;

static void keys_set(BrokerConfig *c, const Key *keys) {
        for (const Key *k = keys; k->section; k++) {
                ConfSource src = {};
                if (conf_set(c, k->section, k->key, k->value, &src, NULL) != 0)
                        fail_msg("[%s] %s=%s refused", k->section, k->key, k->value);
        }
}

/* The keys of `keys`, then of `more` (NULL: none). */
static BrokerConfig *config_make(const Key *keys, const Key *more) {
        BrokerConfig *c;
        assert_int_equal(conf_new(&c), 0);
        keys_set(c, keys);
        if (more)
                keys_set(c, more);
        assert_int_equal(conf_validate(c, NULL), 0);
        return c;
}

/* The running configuration when the reload comes. */
static const Key config_old[] = {
        { "pool grid", "members", "m1 m2 m3 m4" },
        { "pool grid", "label.gpu", "m1 m2" },
        { "pool grid", "label.big", "m3" },
        { "pool grid", "cooldown", "1m" },
        { "pool spare", "limit", "2" },
        { "pool old", "limit", "1" },
        { "lane ci", "pools", "grid" },
        { "lane ci", "policy", "wait" },
        { "lane ci", "priority", "1" },
        { "lane ci", "labels", "gpu" },
        { "lane bulk", "pools", "grid spare" },
        { "lane bulk", "policy", "wait" },
        { "lane bulk", "max-in-use", "2" },
        { "lane legacy", "pools", "old" },
        { "lane legacy", "policy", "wait" },
        { "pool farm", "backend", "redis://127.0.0.1:1" },
        { "pool farm", "members", "f1 f2" },
        { "pool farm", "label.fast", "f1" },
        { "lane far", "pools", "farm" },
        { "lane far", "policy", "wait" },
        {},
};

/* Before it, with config_old: pool "back", removed (config_old) while a lease holds it (retired), and revived
 * by the reload under test, with its drain record. */
static const Key config_back[] = {
        { "pool back", "members", "b1 b2 b3" },
        { "lane b", "pools", "back" },
        { "lane b", "policy", "wait" },
        {},
};

/* The reload: grid's members and labels change (m1 goes while held, m5 comes), spare grows, "old" goes with a
 * waiter in it, "fresh" is added, "back" comes back; lanes change priority, limits and pools, one goes, one
 * comes. */
static const Key config_new[] = {
        { "pool grid", "members", "m2 m3 m4 m5" },
        { "pool grid", "label.gpu", "m2 m5" },
        { "pool grid", "label.big", "m3 m4" },
        { "pool grid", "cooldown", "2m" },
        { "pool grid", "queue-timeout", "10m" },
        { "pool spare", "limit", "3" },
        { "pool fresh", "limit", "2" },
        { "pool back", "members", "b1 b2 b3" },
        { "lane ci", "pools", "grid" },
        { "lane ci", "policy", "wait" },
        { "lane ci", "priority", "5" },
        { "lane ci", "labels", "gpu" },
        { "lane bulk", "pools", "grid fresh" },
        { "lane bulk", "policy", "wait" },
        { "lane bulk", "max-in-use", "1" },
        { "lane newbie", "pools", "fresh spare" },
        { "lane newbie", "policy", "wait" },
        { "lane b", "pools", "back" },
        { "lane b", "policy", "wait" },
        { "pool farm", "backend", "redis://127.0.0.1:1" },
        { "pool farm", "members", "f1 f2 f3" },
        { "pool farm", "label.fast", "f1 f3" },
        { "lane far", "pools", "farm" },
        { "lane far", "policy", "wait" },
        { "lane far", "priority", "3" },
        {},
};

/* ---- two engines with one history ---- */

#define TAGS_MAX 64

typedef struct Side {
        Engine *engine;
        uint64_t rng;
        EngineRequest *requests[TAGS_MAX];
        EngineLease *leases[TAGS_MAX];
        size_t n;
        /* Every event, as text: what both engines decided, in order. */
        char *log;
        size_t log_size;
        FILE *logf;
        uint64_t calls;           /* queued for Redis by its shared pools, all told */
} Side;

static uint64_t fake_random(void *userdata) {
        uint64_t *s = userdata;
        uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        return z ^ (z >> 31);
}

/* Shared pools with their link up and no Redis: what they queue is counted, never sent. */
static int shared_factory(const PoolConfig *pc, const char *name, PoolEmitFn emit, void *emit_userdata,
                          void *userdata, Pool **ret) {
        Side *s = userdata;
        const SharedPoolParams params = {
                .node_id = "0123456789abcdef0123456789abcdef",
                .node_name = "runner-1",
                .node_ttl = pc->backend_node_ttl,
                .revoke_grace = S(2),
                .waiter_grace = S(5),
                .heartbeat = S(1),
                .manual_clock = true,
                .random = fake_random,
                .random_userdata = &s->rng,
                .call_order = &s->calls,
        };
        int r = pool_shared_new(name, &params, emit, emit_userdata, ret);
        if (r < 0)
                return r;
        pool_shared_link_up(*ret, "run-1", 0);
        return 0;
}

static void take_events(Side *s) {
        EngineEvent ev;
        while (engine_pop_event(s->engine, &ev)) {
                size_t tag = (size_t) (uintptr_t) ev.userdata;
                fprintf(s->logf, "event %d at=%llu tag=%zu pool=%s lane=%s refusal=%d reason=%s congested=%d member=%s "
                        "quarantined=%d drained=%d\n",
                        ev.type, (unsigned long long) ev.at, tag, ev.pool ?: "-", ev.lane ?: "-",
                        ev.type == ENGINE_EVENT_REFUSED ? (int) ev.refusal : -1, ev.reason ?: "-", ev.congested,
                        ev.member ?: "-", ev.quarantined, ev.drained);
                if (ev.type == ENGINE_EVENT_GRANTED && tag > 0 && tag <= TAGS_MAX) {
                        const unsigned *idx;
                        const char *const *members;
                        unsigned n = engine_lease_slots(ev.lease, &idx, &members);
                        fprintf(s->logf, "  token=%llu slots=", (unsigned long long) engine_lease_token(ev.lease));
                        for (unsigned i = 0; i < n; i++)
                                fprintf(s->logf, "%u/%s ", idx[i], members && members[i] ? members[i] : "-");
                        fputc('\n', s->logf);
                        s->leases[tag - 1] = ev.lease;
                }
        }
        fflush(s->logf);
}

static void acquire(Side *s, const char *lane, unsigned slots, usec_t now) {
        assert_true(s->n < TAGS_MAX);
        size_t tag = ++s->n;
        int r = engine_acquire(s->engine,
                               &(EngineAcquire) {
                                       .lane = lane,
                                       .slots = slots,
                                       .max_wait = USEC_INFINITY,
                                       .userdata = (void *) (uintptr_t) tag,
                               },
                               now, &s->requests[tag - 1]);
        fprintf(s->logf, "acquire %s %u: %d\n", lane, slots, r);
        take_events(s);
}

static void release(Side *s, size_t tag, usec_t now) {
        assert_non_null(s->leases[tag - 1]);
        engine_lease_release(s->leases[tag - 1], now);
        s->leases[tag - 1] = NULL;
        take_events(s);
}

static void configure(Side *s, const Key *keys, const Key *more, usec_t now) {
        BrokerConfig *c = config_make(keys, more);
        assert_int_equal(engine_configure(s->engine, c, now), 0);
        conf_free(c);
        take_events(s);
}

/* The history before the reload, the same for both engines. */
static void side_start(Side *s) {
        *s = (Side) { .rng = 42 };
        s->logf = open_memstream(&s->log, &s->log_size);
        assert_non_null(s->logf);
        assert_int_equal(engine_new(fake_random, &s->rng, &s->engine), 0);
        engine_set_pool_factory(s->engine, shared_factory, s);

        configure(s, config_old, config_back, 0);
        acquire(s, "b", 1, S(1));                 /* 1: b1, holds "back" past its removal */
        assert_int_equal(engine_drain_with(s->engine, "back", "b2",
                                           &(EngineDrain) { .since = S(1), .until = USEC_INFINITY, .who = "ops" }, S(1)), 0);
        take_events(s);
        configure(s, config_old, NULL, S(2));

        assert_int_equal(engine_drain_with(s->engine, "grid", "m4",
                                           &(EngineDrain) { .since = S(3), .until = USEC_INFINITY, .who = "ops",
                                                            .reason = "disk" }, S(3)), 0);
        assert_int_equal(engine_member_quarantine(s->engine, "grid", "m3",
                                                  &(EngineQuarantine) { .since = S(3), .job = "j", .exit_status = -1,
                                                                        .reason = "flaky" }, S(3)), 0);
        take_events(s);
        acquire(s, "ci", 1, S(4));    /* 2: m1 */
        acquire(s, "ci", 1, S(4));    /* 3: m2 */
        acquire(s, "ci", 1, S(5));    /* 4: waits for a gpu member */
        acquire(s, "bulk", 1, S(5));  /* 5: grid has none free for it (m3 quarantined, m4 drained): spare */
        acquire(s, "bulk", 1, S(5));  /* 6: spare */
        acquire(s, "bulk", 1, S(6));  /* 7: waits (max-in-use 2) */
        acquire(s, "legacy", 1, S(6)); /* 8: old */
        acquire(s, "legacy", 1, S(6)); /* 9: waits in "old", removed by the reload */
        release(s, 3, S(7));          /* m2 rests a minute: 4 keeps waiting */
        engine_run(s->engine, S(7));
        take_events(s);
}

static void side_done(Side *s) {
        for (size_t i = 0; i < s->n; i++)
                engine_request_unref(s->requests[i]);
        engine_free(s->engine);
        fclose(s->logf);
        free(s->log);
}

static void dump_strv(FILE *f, const char *what, char *const *l) {
        fprintf(f, " %s=", what);
        for (char *const *i = l; i && *i; i++)
                fprintf(f, "%s,", *i);
}

/* Everything the engine shows of its state, as text. */
static char *dump(Side *s, usec_t now) {
        char *buf = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&buf, &size);
        assert_non_null(f);
        size_t n_pools = engine_pool_count(s->engine);
        for (size_t i = 0; i < n_pools; i++) {
                EnginePoolInfo pi;
                assert_int_equal(engine_pool_info(s->engine, i, now, &pi), 0);
                fprintf(f, "pool %s limit=%u in_use=%u waiting=%zu congested=%d drained=%d q=%d/%llu idle=%llu "
                        "token=%llu cooldown=%llu",
                        pi.name, pi.limit, pi.in_use, pi.waiting, pi.congested, pi.drained, pi.queue_timeout_set,
                        (unsigned long long) pi.queue_timeout, (unsigned long long) pi.idle,
                        (unsigned long long) pi.next_token, (unsigned long long) pi.cooldown);
                dump_strv(f, "members", pi.members);
                dump_strv(f, "drained", pi.drained_members);
                if (pi.remote) {
                        fprintf(f, " backend_up=%d unavailable=%s", pi.backend_up, pi.unavailable ?: "-");
                        dump_strv(f, "differing", pi.differing_keys);
                }
                fputc('\n', f);
                for (size_t k = 0; k < pi.n_life; k++) {
                        const EngineMemberLife *m = pi.life + k;
                        fprintf(f, "  life %s q=%d since=%llu job=%s exit=%d reason=%s failures=%u quarantines=%llu "
                                "grants=%llu held=%llu\n",
                                m->member, m->quarantined, (unsigned long long) m->since, m->job ?: "-",
                                m->exit_status, m->reason ?: "-", m->failures, (unsigned long long) m->quarantines,
                                (unsigned long long) m->grants, (unsigned long long) m->held);
                }
                for (size_t k = 0; k < pi.n_resting; k++)
                        fprintf(f, "  rest %u/%s until=%llu\n", pi.resting[k].index, pi.resting[k].member ?: "-",
                                (unsigned long long) pi.resting[k].until);
        }
        for (size_t i = 0; i < engine_drain_count(s->engine); i++) {
                EngineDrainInfo d;
                assert_int_equal(engine_drain_info(s->engine, i, &d), 0);
                fprintf(f, "drain %s/%s since=%llu until=%llu who=%s reason=%s\n", d.pool, d.member ?: "-",
                        (unsigned long long) d.since, (unsigned long long) d.until, d.who ?: "-", d.reason ?: "-");
        }
        for (size_t i = 0; i < s->n; i++) {
                EngineRequest *r = s->requests[i];
                if (r && engine_request_is_waiting(r)) {
                        size_t pos = 0, queued = 0;
                        (void) engine_request_position(r, &pos, &queued);
                        fprintf(f, "request %zu waits in %s at %zu of %zu budget=%llu\n", i + 1,
                                engine_request_pool(r) ?: "-", pos, queued,
                                (unsigned long long) engine_request_budget(r));
                }
                EngineLease *l = s->leases[i];
                if (l) {
                        const unsigned *idx;
                        const char *const *members;
                        unsigned n = engine_lease_slots(l, &idx, &members);
                        fprintf(f, "lease %zu %s/%s token=%llu revoked=%d slots=", i + 1, engine_lease_pool(l),
                                engine_lease_lane(l), (unsigned long long) engine_lease_token(l),
                                engine_lease_is_revoked(l));
                        for (unsigned k = 0; k < n; k++)
                                fprintf(f, "%u/%s ", idx[k], members && members[k] ? members[k] : "-");
                        fputc('\n', f);
                }
        }
        fprintf(f, "wakeup %llu calls %llu\n", (unsigned long long) engine_next_wakeup(s->engine),
                (unsigned long long) s->calls);
        fclose(f);
        return buf;
}

static void assert_same(Side *a, Side *b, usec_t now, const char *when, unsigned long n) {
        char *da = dump(a, now), *db = dump(b, now);
        if (!streq(da, db))
                fail_msg("N=%lu, %s: the engines differ:\n--- failed reload\n%s--- no reload\n%s", n, when, da, db);
        free(da);
        free(db);
        fflush(a->logf);
        fflush(b->logf);
        if (!streq(a->log, b->log))
                fail_msg("N=%lu, %s: the engines decided differently:\n--- failed reload\n%s--- no reload\n%s", n, when,
                         a->log, b->log);
}

/* The same requests to both: of the lanes of both configurations, so that the rules in force show. */
static void probe(Side *s, usec_t now) {
        static const char *const lanes[] = { "ci", "bulk", "legacy", "newbie", "b", "far" };
        for (size_t i = 0; i < sizeof lanes / sizeof lanes[0]; i++)
                acquire(s, lanes[i], 1, now);
        if (s->leases[1])
                release(s, 2, now); /* m1: gone from grid in the new configuration, held above its limit */
        engine_run(s->engine, now);
        take_events(s);
}

static void test_failed_reload_changes_nothing(void **state) {
        const usec_t at = S(8);
        unsigned long n, n_shrugged = 0;
        BrokerConfig *c_new = config_make(config_new, NULL);

        for (n = 1;; n++) {
                Side a, b;
                side_start(&a);
                side_start(&b);
                assert_same(&a, &b, at, "before", n);

                alloc_count = 0;
                alloc_fail_at = n;
                alloc_failed = false;
                alloc_armed = true;
                int r = engine_configure(a.engine, c_new, at);
                alloc_armed = false;
                fprintf(a.logf, "configure: %s\n", r < 0 ? "failed" : "applied");
                fprintf(b.logf, "configure: %s\n", r < 0 ? "failed" : "applied");
                take_events(&a);

                if (r == 0) {
                        /* Applied: as a reload does, all of it. A run with fewer than n allocations tried the
                         * whole of them; one that shrugged its failure off is counted: only the shared pool's
                         * call of its new rules may fail once the reload applies, and the pool's next run()
                         * sends it; anything else shrugged off must leave no trace. */
                        configure(&b, config_new, NULL, at);
                        if (alloc_failed && a.calls != b.calls) {
                                /* The one difference: the call B queued. */
                                assert_int_equal(a.calls + 1, b.calls);
                                a.calls++;
                                assert_same(&a, &b, at, "after the reload, but for the call", n);
                                a.calls--;
                                engine_run(a.engine, at);
                                engine_run(b.engine, at);
                                take_events(&a);
                                take_events(&b);
                        }
                        assert_same(&a, &b, at, "after the reload", n);
                        probe(&a, at + MS(3));
                        probe(&b, at + MS(3));
                        assert_same(&a, &b, at + MS(3), "requests after the reload", n);
                        side_done(&a);
                        side_done(&b);
                        if (!alloc_failed)
                                break;
                        n_shrugged++;
                        continue;
                }
                assert_int_equal(r, -ENOMEM);
                assert_true(alloc_failed);
                assert_same(&a, &b, at, "after the failed reload", n);
                /* The old rules still decide, alike. */
                probe(&a, at + MS(1));
                probe(&b, at + MS(1));
                assert_same(&a, &b, at + MS(1), "requests after the failed reload", n);
                /* And the reload, again, applies as it would have. */
                configure(&a, config_new, NULL, at + MS(2));
                configure(&b, config_new, NULL, at + MS(2));
                assert_same(&a, &b, at + MS(2), "after the reload applied", n);
                probe(&a, at + MS(3));
                probe(&b, at + MS(3));
                assert_same(&a, &b, at + MS(3), "requests after the reload applied", n);
                side_done(&a);
                side_done(&b);
        }
        conf_free(c_new);
        print_message("# the reload made %lu allocations; a failure of %lu of them was shrugged off\n",
                      n - 1, n_shrugged);
        assert_true(n > 20); /* the injection reached the engine */
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_failed_reload_changes_nothing),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
