/* SPDX-License-Identifier: MIT */
/* test-shared-diff.c — the differential test of shared pools (memo §5.1): every scenario runs through the
 * simulator twice, once with its pools in-process (pool-local.c) and once with them kept in a redis-server
 * the test starts, through brokerd's Backend with the pools in the manual clock mode (memo §3.10: the
 * engine's `now` is the pool clock). Issue 11's acceptance: the same decisions, in the same order.
 *
 * Compared: the per-request JSON reports, byte for byte, and the ordered engine events (verdict, time,
 * request, pool, lane, wait, queue state, idle, budget, refusal, reason, token, slots). REVOKE (max-hold)
 * is compared as a sequence of its own: the engine raises it itself at the instant the lease reaches its
 * max-hold, while a remote pool's decisions of that instant come with the answer to run(), after it —
 * two streams interleaved differently, neither reordered within itself (memo §5.1). DRAIN likewise, compared
 * per instant and pool (lines_by_pool()): the engine ends a local pool's drain at its until before any pool
 * runs that instant, a shared pool's drain ends in that pool's own call, after the pools before it. And
 * CONGESTION, per instant and pool too: a set's grant (also=) moves the gauges of its pools at one instant, in
 * the order its pools run locally and their answers come in shared.
 *
 * The scenarios: every tests/scenarios file (JSON), and seeded generated ones (pools with limits or members,
 * labels on the members (SPEC §3.5), queue timeouts, congestion timeouts, max-queue, cooldown; lanes with
 * priorities, max-in-use, reserve, max-hold, fail-fast and labels=; requests of 1–3 slots, no-wait, client
 * caps, labels and a named member), and issue 23's lives of members: quarantine-exit-codes= and
 * quarantine-after= on member pools, health lanes, requests whose commands tell an exit status, drains of
 * pools and members with a reason, some until a time, some undrained; reservations (lane @reserve) of any slot,
 * a member or labels, for a while; lanes with also= (issue 22 items 4/5: all or nothing over 2–3 pools, K slots
 * of each, contending with the one-pool lanes of the same pools; TEST_SHARED_DIFF_ALSO=0: none). And, from a stream
 * of their own (TEST_SHARED_DIFF_EXTRA=0: none): health = also, client-wait = ignore, a lane's queue-timeout =
 * infinity, reserve = 2, requests of up to the limit or naming a member and a label or two labels, phases that tell
 * an exit status, do not wait or cap their wait, and a second phase. Compared too: MEMBER and DRAIN events. Each from
 * a stream of its own too: requests whose client goes away after a while (a cancel while they wait;
 * TEST_SHARED_DIFF_CANCEL=0: none), members quarantined and restored by hand (TEST_SHARED_DIFF_QUARANTINE=0), and
 * reloads of a lane's priority and of a pool's limit, max-queue, timeouts, cooldown and members' labels
 * (TEST_SHARED_DIFF_RELOAD=0), reloads of a lane's reserve, max-in-use, policy, pools' order, max-hold and queue
 * timeout (TEST_SHARED_DIFF_RULES=0); half the cancels come when the request's answer is due (its budget's end, a
 * hold's end in its pools); and reloads that add a pool with a lane and requests of it, remove a pool with its lanes
 * or a lane alone (their waiters refused, holders finishing), and add the pool removed back
 * (TEST_SHARED_DIFF_TOPOLOGY=0: none). Without redis-server the whole test is one TAP skip.
 * TEST_SHARED_DIFF_PRINT=1 prints each generated scenario; TEST_SHARED_DIFF_DUMP=DIR writes both runs;
 * TEST_SHARED_DIFF_SEEDS=N runs N generated scenarios instead of GENERATED, TEST_SHARED_DIFF_FIRST=S from seed S
 * on (1: the default), to run one again. */
#include <glob.h>
#include <inttypes.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "conf.h"
#include "engine.h"
#include "redis-server.h"
#include "scenario.h"
#include "shared-rig.h"
#include "simulate.h"

#define GENERATED 40

static TestRedis server;
static redisContext *admin;
static char backend_url[sizeof server.socket_path + 16];

/* ---- what a run produced ---- */

typedef struct Trace {
        FILE *f;
        char *text;
        size_t size;
} Trace;

typedef struct Run {
        Trace report;    /* sim_print_json() with every request */
        Trace decisions; /* engine events but REVOKE, one line each */
        Trace revokes;
        Trace drains;    /* DRAIN events */
        Trace gauges;    /* CONGESTION events */
} Run;

static void trace_open(Trace *t) {
        *t = (Trace) {};
        t->f = open_memstream(&t->text, &t->size);
        assert_non_null(t->f);
}

static void trace_close(Trace *t) {
        if (t->f)
                assert_int_equal(fclose(t->f), 0);
        t->f = NULL;
}

static void run_done(Run *r) {
        trace_close(&r->report);
        trace_close(&r->decisions);
        trace_close(&r->revokes);
        trace_close(&r->drains);
        trace_close(&r->gauges);
        free(r->report.text);
        free(r->decisions.text);
        free(r->revokes.text);
        free(r->drains.text);
        free(r->gauges.text);
}

static const char *word(const char *s) {
        return s ?: "-";
}

static void record_event(const EngineEvent *ev, void *userdata) {
        Run *run = userdata;

        if (ev->type == ENGINE_EVENT_REVOKE) {
                fprintf(run->revokes.f, "revoke at=%" PRIu64 " token=%" PRIu64 " pool=%s lane=%s reason=%s\n", ev->at,
                        engine_lease_token(ev->lease), word(engine_lease_pool(ev->lease)),
                        word(engine_lease_lane(ev->lease)), word(ev->reason));
                return;
        }
        if (ev->type == ENGINE_EVENT_MEMBER) {
                fprintf(run->decisions.f, "member at=%" PRIu64 " pool=%s member=%s quarantined=%d job=%s exit=%d note=%s\n",
                        ev->at, word(ev->pool), word(ev->member), ev->quarantined, word(ev->job), ev->exit_status,
                        word(ev->note));
                return;
        }
        if (ev->type == ENGINE_EVENT_DRAIN) {
                fprintf(run->drains.f, "drain at=%" PRIu64 " pool=%s member=%s drained=%d who=%s note=%s until=%" PRIu64
                        " expired=%d\n",
                        ev->at, word(ev->pool), word(ev->member), ev->drained, word(ev->job), word(ev->note), ev->until,
                        ev->expired);
                return;
        }
        if (ev->type == ENGINE_EVENT_CONGESTION) {
                fprintf(run->gauges.f, "congestion at=%" PRIu64 " pool=%s congested=%d\n", ev->at, word(ev->pool),
                        ev->congested);
                return;
        }

        static const char *const verdicts[] = {
                [ENGINE_EVENT_QUEUED] = "queued",
                [ENGINE_EVENT_GRANTED] = "granted",
                [ENGINE_EVENT_REFUSED] = "refused",
        };
        fprintf(run->decisions.f,
                "%s at=%" PRIu64 " request=%" PRIuPTR " pool=%s lane=%s queued=%d state=%d idle=%" PRIu64
                " budget=%" PRIu64,
                verdicts[ev->type], ev->at, (uintptr_t) ev->userdata, word(ev->pool), word(ev->lane), ev->queued,
                ev->state, ev->idle, ev->budget);
        if (ev->type == ENGINE_EVENT_GRANTED) {
                const unsigned *slots;
                const char *const *members;
                unsigned n = engine_lease_slots(ev->lease, &slots, &members);
                fprintf(run->decisions.f, " wait=%" PRIu64 " token=%" PRIu64 " slots=", ev->wait,
                        engine_lease_token(ev->lease));
                for (unsigned i = 0; i < n; i++)
                        fprintf(run->decisions.f, "%s%u%s%s", i > 0 ? "," : "", slots[i], members ? ":" : "",
                                members ? word(members[i]) : "");
        }
        if (ev->type == ENGINE_EVENT_REFUSED)
                fprintf(run->decisions.f, " wait=%" PRIu64 " refusal=%s reason=%s", ev->wait,
                        word(refusal_to_string(ev->refusal)), word(ev->reason));
        fputc('\n', run->decisions.f);
}

/* SimOptions.quiesce */
static bool quiesce(void *userdata) {
        return shared_rig_quiesce(userdata);
}

/* ---- running a scenario both ways ---- */

static void run_scenario(const char *text, const char *origin, bool shared, Run *ret) {
        _cleanup_(scenario_freep) Scenario *s = NULL;
        _cleanup_(conf_freep) BrokerConfig *c = NULL;
        _cleanup_(sim_result_freep) SimResult *result = NULL;
        char *error = NULL;
        SharedRig rig = {};

        /* Every pool gets the backend, both ways: in-process the simulator keeps its rules (the local
         * factory), shared the Backend keeps it in Redis. */
        if (scenario_load_string(text, origin, &error, &s) < 0)
                fail_msg("%s: %s", origin, error ?: "(no message)");
        /* The rig's node TTL in both runs: it is part of the rules, which the two must share. */
        for (size_t i = 0; i < s->n_pools; i++) {
                char section[128];
                snprintf(section, sizeof section, "pool %s", s->pools[i]);
                assert_int_equal(scenario_add_setting(s, section, "backend-node-ttl", SHARED_RIG_NODE_TTL_TEXT, origin,
                                                      origin),
                                 0);
        }
        if (scenario_build_config(s, "backend", backend_url, &error, &c) < 0)
                fail_msg("%s: %s", origin, error ?: "(no message)");

        trace_open(&ret->report);
        trace_open(&ret->decisions);
        trace_open(&ret->revokes);
        trace_open(&ret->drains);
        trace_open(&ret->gauges);
        SimOptions o = {
                .seed = 1,
                .per_request = true,
                .on_event = record_event,
                .on_event_userdata = ret,
                .config_key = "backend", /* the scenario's reloads keep it */
                .config_value = backend_url,
        };
        if (shared) {
                redisReply *r = redisCommand(admin, "FLUSHALL");
                assert_non_null(r);
                freeReplyObject(r);
                shared_rig_init(&rig);
                o.factory = backend_table_pool_new;
                o.factory_userdata = &rig.table;
                o.quiesce = quiesce;
                o.quiesce_userdata = &rig;
        }
        int r = sim_run(s, c, &o, &result);
        if (shared)
                shared_rig_done(&rig);
        if (r < 0)
                fail_msg("%s: %s run failed: %s", origin, shared ? "shared" : "local", strerror(-r));
        sim_print_json(s, result, ret->report.f);
        trace_close(&ret->report);
        trace_close(&ret->decisions);
        trace_close(&ret->revokes);
        trace_close(&ret->drains);
        trace_close(&ret->gauges);
}

/* Fails naming the first line where the two texts differ, with both versions of it. */
static void assert_same_text(const char *origin, const char *what, const char *local, const char *shared) {
        if (strcmp(local, shared) == 0)
                return;
        size_t line = 1;
        const char *a = local, *b = shared;
        while (*a && *a == *b) {
                if (*a == '\n') {
                        line++;
                        local = a + 1;
                        shared = b + 1;
                }
                a++;
                b++;
        }
        int la = (int) strcspn(local, "\n"), lb = (int) strcspn(shared, "\n");
        fail_msg("%s: %s differ at line %zu:\n  local:  %.*s\n  shared: %.*s", origin, what, line, la, local, lb,
                 shared);
}

/* ---- the drains' and the gauges' streams: in each pool's order, the pools of an instant in any order ---- */

typedef struct Line {
        const char *text;
        size_t len, pool_len; /* pool_len: up to the field after the pool, which names the instant and the pool */
        size_t index;
} Line;

static int line_compare(const void *a, const void *b) {
        const Line *x = a, *y = b;
        int c = strncmp(x->text, y->text, MIN(x->pool_len, y->pool_len));
        if (c == 0 && x->pool_len != y->pool_len)
                c = x->pool_len < y->pool_len ? -1 : 1;
        if (c == 0)
                c = x->index < y->index ? -1 : x->index > y->index;
        return c;
}

/* The text's lines, each with its index (pool_len: its length up to `after_pool`, or all of it; NULL: none). */
static Line *lines_split(const char *text, const char *after_pool, size_t *ret_n) {
        size_t n = 0, cap = 0;
        Line *lines = NULL;
        for (const char *p = text; *p;) {
                const char *e = strchrnul(p, '\n');
                const char *m = after_pool ? strstr(p, after_pool) : NULL;
                if (n == cap) {
                        cap = MAX(cap * 2, (size_t) 16);
                        lines = reallocarray(lines, cap, sizeof(Line));
                        assert_non_null(lines);
                }
                lines[n] = (Line) { .text = p, .len = (size_t) (e - p), .pool_len = m && m < e ? (size_t) (m - p) : (size_t) (e - p), .index = n };
                n++;
                p = *e ? e + 1 : e;
        }
        *ret_n = n;
        return lines;
}

/* The lines joined again, each ending in a newline, as a text of `size` bytes; frees them. */
static char *lines_join(Line *lines, size_t n, size_t size) {
        char *out = malloc(size + 1), *o = out;
        assert_non_null(out);
        for (size_t i = 0; i < n; i++) {
                memcpy(o, lines[i].text, lines[i].len);
                o += lines[i].len;
                *o++ = '\n';
        }
        *o = '\0';
        free(lines);
        return out;
}

/* The trace's lines stably sorted by instant and pool (the text up to `after_pool`, the field after the pool):
 * the engine ends a local pool's drain at its until before any pool runs, a shared pool's in that pool's call,
 * after the pools before it (record_event()). */
static char *lines_by_pool(const char *text, const char *after_pool) {
        size_t n;
        Line *lines = lines_split(text, after_pool, &n);
        if (n > 1) /* qsort() of NULL, 0 is undefined */
                qsort(lines, n, sizeof(Line), line_compare);
        return lines_join(lines, n, strlen(text));
}

/* A decision line's pool: its text after " pool=", up to the next space. */
static const char *line_pool(const Line *l, size_t *ret_len) {
        const char *p = memmem(l->text, l->len, " pool=", 6);
        if (!p) {
                *ret_len = 0;
                return "";
        }
        p += 6;
        const char *e = memchr(p, ' ', (size_t) (l->text + l->len - p));
        *ret_len = (size_t) ((e ?: l->text + l->len) - p);
        return p;
}

static int line_compare_pool(const void *a, const void *b) {
        const Line *x = a, *y = b;
        size_t xn, yn;
        const char *xp = line_pool(x, &xn), *yp = line_pool(y, &yn);
        int c = strncmp(xp, yp, MIN(xn, yn));
        if (c == 0 && xn != yn)
                c = xn < yn ? -1 : 1;
        if (c == 0)
                c = x->index < y->index ? -1 : x->index > y->index;
        return c;
}

/* Whether the line is a refusal `unavailable`, and its instant's text ("refused at=T "). */
static bool line_unavailable(const Line *l, size_t *ret_at_len) {
        if (l->len < 11 || memcmp(l->text, "refused at=", 11) != 0 ||
            !memmem(l->text, l->len, " refusal=unavailable ", 21))
                return false;
        const char *e = memchr(l->text + 11, ' ', l->len - 11);
        *ret_at_len = e ? (size_t) (e - l->text) : l->len;
        return true;
}

/* The decisions with each run of refusals `unavailable` of one instant stably sorted by pool: a reload that removes
 * a lane with more waiters in a shared pool than a call's budget (SETTLE_MAX) has them refused by that pool's calls
 * in turn, its later calls after the other pools' (brokerd/lua/README, "Adoption"), where pool-local refuses each
 * pool's all at once. Within a pool, and against every other decision, the order is kept. */
static char *unavailable_by_pool(const char *text) {
        size_t n;
        Line *lines = lines_split(text, NULL, &n);
        for (size_t i = 0; i < n;) {
                size_t at_len, j = i + 1, other;
                if (!line_unavailable(&lines[i], &at_len)) {
                        i++;
                        continue;
                }
                while (j < n && line_unavailable(&lines[j], &other) && other == at_len &&
                       memcmp(lines[j].text, lines[i].text, at_len) == 0)
                        j++;
                qsort(lines + i, j - i, sizeof(Line), line_compare_pool);
                i = j;
        }
        return lines_join(lines, n, strlen(text));
}

/* TEST_SHARED_DIFF_DUMP=DIR: both runs' traces as files, to read a difference whole. */
static void dump(const char *origin, const char *side, const Run *r) {
        const char *dir = getenv("TEST_SHARED_DIFF_DUMP");
        if (!dir)
                return;
        char path[512];
        snprintf(path, sizeof path, "%s/%s.%s", dir, origin, side);
        for (char *c = path + strlen(dir) + 1; *c; c++)
                if (*c == '/' || *c == ' ')
                        *c = '_';
        FILE *f = fopen(path, "we");
        if (!f)
                return;
        fprintf(f, "%s\n%s\n%s\n%s\n%s", r->decisions.text, r->revokes.text, r->drains.text, r->gauges.text,
                r->report.text);
        fclose(f);
}

static void check_scenario(const char *text, const char *origin) {
        Run local = {}, shared = {};

        run_scenario(text, origin, false, &local);
        run_scenario(text, origin, true, &shared);
        dump(origin, "local", &local);
        dump(origin, "shared", &shared);
        /* A scenario that decides nothing compares nothing. */
        assert_true(local.decisions.size > 0);
        _cleanup_free_ char *local_decisions = unavailable_by_pool(local.decisions.text),
                            *shared_decisions = unavailable_by_pool(shared.decisions.text);
        assert_same_text(origin, "decisions", local_decisions, shared_decisions);
        assert_same_text(origin, "max-hold revocations", local.revokes.text, shared.revokes.text);
        _cleanup_free_ char *local_drains = lines_by_pool(local.drains.text, " member="),
                            *shared_drains = lines_by_pool(shared.drains.text, " member=");
        assert_same_text(origin, "drains", local_drains, shared_drains);
        _cleanup_free_ char *local_gauges = lines_by_pool(local.gauges.text, " congested="),
                            *shared_gauges = lines_by_pool(shared.gauges.text, " congested=");
        assert_same_text(origin, "congestion gauges", local_gauges, shared_gauges);
        assert_same_text(origin, "reports", local.report.text, shared.report.text);
        run_done(&local);
        run_done(&shared);
}

/* ---- the scenario files ---- */

static void test_scenario_file(void **state) {
        const char *path = *state;
        _cleanup_free_ char *text = NULL;
        size_t size = 0;
        FILE *f = fopen(path, "re");

        assert_non_null(f);
        assert_true(getdelim(&text, &size, '\0', f) > 0);
        fclose(f);
        check_scenario(text, path);
}

/* ---- generated scenarios ---- */

typedef struct Gen {
        uint64_t state;
        FILE *f;
} Gen;

static unsigned gen_below(Gen *g, unsigned n) {
        return (unsigned) (sim_splitmix64(&g->state) % n);
}

static bool gen_chance(Gen *g, unsigned percent) {
        return gen_below(g, 100) < percent;
}

#define POOLS_MAX 3
#define LANES_MAX 3

/* The labels of a generated member pool: x and y, each a set of members (bit m: member "m<m>"). */
typedef struct GenPool {
        unsigned limit;
        bool members;
        unsigned x, y;
} GenPool;

/* A generated lane's rules, as a reload changes them: its pools in order, policy, max-in-use (0: none), reserve
 * and also= pools (bit p). */
typedef struct GenLane {
        unsigned order[POOLS_MAX], n;
        bool fail_fast;
        unsigned max_in_use, reserve, also;
        unsigned also_k;        /* the largest K of its also= pools (conf.c: none above its max-in-use) */
        bool health;
        unsigned most;          /* the most slots its requests may ask for (conf_lane_most() in each of its pools) */
        unsigned need;          /* the most slots a request of it asks for: a reload's max-in-use leaves it that */
} GenLane;

/* When a generated request's hold would end were it granted on arrival (ms; 0: never), and its pools (bit p). */
typedef struct GenEnd {
        unsigned at, pools;
} GenEnd;

/* A selector of the generator: terms over x and y, and maybe a member. */
typedef struct GenSel {
        int x, y;        /* 1: must carry, -1: must not, 0: either */
        int member;      /* -1: none */
} GenSel;

static unsigned gen_capacity(const GenPool *p, const GenSel *a, const GenSel *b) {
        unsigned n = 0;
        for (unsigned m = 0; p->members && m < p->limit; m++) {
                bool ok = true;
                for (const GenSel *s = a; s; s = s == a ? b : NULL) {
                        if (s->x != 0 && (((p->x >> m) & 1) != 0) != (s->x > 0))
                                ok = false;
                        if (s->y != 0 && (((p->y >> m) & 1) != 0) != (s->y > 0))
                                ok = false;
                        if (s->member >= 0 && (unsigned) s->member != m)
                                ok = false;
                }
                n += ok;
        }
        return n;
}

static void gen_print_terms(FILE *f, const GenSel *s) {
        const char *sep = "";
        if (s->x != 0) {
                fprintf(f, "%s\"%sx\"", sep, s->x < 0 ? "!" : "");
                sep = ", ";
        }
        if (s->y != 0)
                fprintf(f, "%s\"%sy\"", sep, s->y < 0 ? "!" : "");
}

static void gen_print_set(FILE *f, unsigned set, unsigned limit) {
        const char *sep = "";
        fputc('[', f);
        for (unsigned m = 0; m < limit; m++)
                if ((set >> m) & 1) {
                        fprintf(f, "%s\"m%u\"", sep, m);
                        sep = ", ";
                }
        fputc(']', f);
}

/* A request's own labels or member (60% of the requests of a lane whose pools all have members), when some
 * pool of the lane has members for it (with the lane's labels); *k is lowered to what the best such pool can
 * give (a request no pool can ever serve is refused InvalidParameter: the simulator takes none). */
static void gen_request_selector(Gen *g, Gen *xg, const GenPool *pools, unsigned n_pools, unsigned lane_pools,
                                 const GenSel *lane_sel, unsigned *k, unsigned *named) {
        bool all_members = true;
        for (unsigned p = 0; p < n_pools; p++)
                if ((lane_pools >> p) & 1)
                        all_members = all_members && pools[p].members;
        GenSel s = { .member = -1 };
        if (all_members && gen_chance(g, 60))
                switch (gen_below(g, 5)) {
                case 0: s.x = 1; break;
                case 1: s.x = -1; break;
                case 2: s.y = 1; break;
                case 3: s.x = 1; s.y = -1; break;
                default: s.member = (int) gen_below(g, 6); break;
                }
        /* (xg: TEST_SHARED_DIFF_EXTRA) a label beside the member, or both labels, either way round. */
        if (xg && s.member >= 0 && gen_chance(xg, 30))
                s.x = gen_chance(xg, 50) ? 1 : -1;
        if (xg && s.y == 0 && s.member < 0 && s.x != 0 && gen_chance(xg, 30))
                s.y = gen_chance(xg, 50) ? 1 : -1;
        unsigned cap = 0, lane_cap = 0;
        for (unsigned p = 0; p < n_pools; p++)
                if ((lane_pools >> p) & 1) {
                        cap = MAX(cap, gen_capacity(&pools[p], lane_sel, &s));
                        lane_cap = MAX(lane_cap, gen_capacity(&pools[p], lane_sel, NULL));
                }
        if (!all_members)
                return;
        if (cap == 0) {
                s = (GenSel) { .member = -1 }; /* nothing could match: none */
                cap = lane_cap;
        }
        if (lane_sel->x != 0 || lane_sel->y != 0 || s.x != 0 || s.y != 0 || s.member >= 0)
                *k = MAX(1u, MIN(*k, cap));
        if (s.x != 0 || s.y != 0) {
                fputs(", \"labels\": [", g->f);
                gen_print_terms(g->f, &s);
                fputc(']', g->f);
        }
        if (s.member >= 0) {
                fprintf(g->f, ", \"member\": \"m%d\"", s.member);
                *named |= lane_pools; /* its pools' labels must stay on their members (a reload's relabelling) */
        }
}

/* Whether the part of the generator that `variable` names is on (anything but "0"). Each such part draws from
 * a stream of its own, so that the rest of a seed's scenario stays without it, to tell which part a difference
 * needs:
 * - TEST_SHARED_DIFF_ALSO: the also= lanes;
 * - TEST_SHARED_DIFF_EXTRA: health = also, client-wait = ignore, a lane's queue-timeout = infinity, reserve = 2,
 *   requests of up to the limit or naming a member and a label or two labels, phases that tell an exit status,
 *   do not wait or cap their wait, a second phase;
 * - TEST_SHARED_DIFF_CANCEL: requests whose client goes away after a while (a cancel, if still undecided);
 * - TEST_SHARED_DIFF_QUARANTINE: members quarantined and restored by hand;
 * - TEST_SHARED_DIFF_RELOAD: reloads of a lane's priority, a pool's limit, max-queue, queue and congestion
 *   timeouts, cooldown and its members' labels;
 * - TEST_SHARED_DIFF_RULES: reloads of a lane's reserve, max-in-use, policy, pools' order, max-hold and queue
 *   timeout (a reload more, where the others made none);
 * - TEST_SHARED_DIFF_TOPOLOGY: reloads that add and remove pools and lanes and add a removed pool back. */
static bool generator_part_enabled(const char *variable) {
        const char *v = getenv(variable);
        return !v || !streq(v, "0");
}

/* need[p] of each pool p of lane_pools (bit p) is at least k. */
static void gen_need(unsigned *need, unsigned lane_pools, unsigned k) {
        for (unsigned p = 0; p < POOLS_MAX; p++)
                if ((lane_pools >> p) & 1)
                        need[p] = MAX(need[p], k);
}

/* An all-or-nothing set (SPEC §3.5) on 60% of the lanes that leave some pool out: one or two of the pools the
 * lane does not route to (conf.c: never its own), each for 1 to 3 of its slots (at most its limit), the count
 * written as "p1:1" at times (the default spelled out). Returns the set's pools (bit p: pool p). */
static unsigned gen_also(Gen *g, FILE *f, const unsigned *limits, const unsigned *reserved, unsigned n_pools,
                         unsigned lane_pools, unsigned *need, GenLane *lane) {
        unsigned others[POOLS_MAX], n_others = 0, mask = 0;
        for (unsigned p = 0; p < n_pools; p++)
                if (!((lane_pools >> p) & 1))
                        others[n_others++] = p;
        if (n_others == 0 || !gen_chance(g, 60))
                return 0;
        unsigned n = 1 + gen_below(g, MIN(n_others, 2u)), first = gen_below(g, n_others);
        fputs(", \"also\": [", f);
        for (unsigned i = 0; i < n; i++) {
                unsigned p = others[(first + i) % n_others];
                unsigned k = gen_chance(g, 60) ? 1 : 1 + gen_below(g, MIN(limits[p], 3u));
                if (lane->max_in_use > 0)
                        k = MIN(k, lane->max_in_use); /* conf.c: a K above it could never be granted */
                k = MIN(k, limits[p] - reserved[p]); /* nor above what the lanes there reserve leave (engine.c) */
                lane->also_k = MAX(lane->also_k, k);
                need[p] = MAX(need[p], k);
                mask |= 1u << p;
                fprintf(f, "%s\"p%u", i > 0 ? ", " : "", p);
                if (k > 1 || gen_chance(g, 20))
                        fprintf(f, ":%u", k);
                fputc('"', f);
        }
        fputc(']', f);
        return mask;
}

/* What a phase's requests may carry beside their lane and slots (TEST_SHARED_DIFF_EXTRA): an exit status their
 * commands tell, wait: false or a cap on the wait. */
static void gen_phase_extras(Gen *g, FILE *f) {
        static const int statuses[] = { 0, 0, 1, 3 };
        if (gen_chance(g, 30))
                fprintf(f, ", \"exit\": %d", statuses[gen_below(g, ELEMENTSOF(statuses))]);
        if (gen_chance(g, 15))
                fputs(", \"wait\": false", f);
        else if (gen_chance(g, 25))
                fprintf(f, ", \"max-wait\": \"%ums\"", 100 * (1 + gen_below(g, 30)));
}

/* (ng: TEST_SHARED_DIFF_RULES) What a reload changes of a lane's rules, written after *k (the separator before
 * the next key, ", " once one is written): its reserve (its pools' reserves staying below their limits as this
 * reload leaves them, `limits`), max-in-use (none, or at least its reserve and its also= K: conf.c), policy, the order of its
 * pools, max-hold and queue timeout. */
static void gen_reload_lane_rules(Gen *g, FILE *f, const char **k, GenLane *lane, unsigned lane_pools,
                                  unsigned *reserved, const unsigned *limits, const unsigned *need) {
        if (gen_chance(g, 25)) {
                unsigned r = gen_below(g, 3);
                for (unsigned p = 0; p < POOLS_MAX; p++)
                        if (((lane_pools >> p) & 1) && (reserved[p] - lane->reserve + r >= limits[p] ||
                                                        reserved[p] - lane->reserve + r + need[p] > limits[p]))
                                r = 0;
                if (lane->max_in_use > 0)
                        r = MIN(r, lane->max_in_use);
                for (unsigned p = 0; p < POOLS_MAX; p++)
                        if ((lane_pools >> p) & 1)
                                reserved[p] = reserved[p] - lane->reserve + r;
                lane->reserve = r;
                fprintf(f, "%s\"reserve\": %u", *k, r);
                *k = ", ";
        }
        if (gen_chance(g, 25)) {
                lane->max_in_use = gen_chance(g, 25) ? 0 : MAX(MAX(lane->reserve, 1u) + gen_below(g, 4), lane->also_k);
                if (lane->max_in_use > 0) /* (MAX() evaluates its arguments twice: not with the draw in it) */
                        lane->max_in_use = MAX(lane->max_in_use, lane->need);
                if (lane->max_in_use == 0)
                        fprintf(f, "%s\"max-in-use\": \"infinity\"", *k);
                else
                        fprintf(f, "%s\"max-in-use\": %u", *k, lane->max_in_use);
                *k = ", ";
        }
        if (gen_chance(g, 15)) {
                lane->fail_fast = !lane->fail_fast;
                fprintf(f, "%s\"policy\": \"%s\"", *k, lane->fail_fast ? "fail-fast" : "wait");
                *k = ", ";
        }
        if (lane->n > 1 && gen_chance(g, 20)) {
                /* The same pools in another order: every request still fits. */
                unsigned turn = 1 + gen_below(g, lane->n - 1), order[POOLS_MAX];
                for (unsigned i = 0; i < lane->n; i++)
                        order[i] = lane->order[(i + turn) % lane->n];
                memcpy(lane->order, order, sizeof order);
                fprintf(f, "%s\"pools\": [", *k);
                for (unsigned i = 0; i < lane->n; i++)
                        fprintf(f, "%s\"p%u\"", i > 0 ? ", " : "", lane->order[i]);
                fputc(']', f);
                *k = ", ";
        }
        if (gen_chance(g, 15)) {
                if (gen_chance(g, 20))
                        fprintf(f, "%s\"max-hold\": \"infinity\"", *k);
                else
                        fprintf(f, "%s\"max-hold\": \"%ums\"", *k, 100 + 100 * gen_below(g, 30));
                *k = ", ";
        }
        if (gen_chance(g, 15)) {
                if (gen_chance(g, 20))
                        fprintf(f, "%s\"queue-timeout\": \"infinity\"", *k);
                else
                        fprintf(f, "%s\"queue-timeout\": \"%ums\"", *k, 100 + 100 * gen_below(g, 30));
                *k = ", ";
        }
}

/* (tg: TEST_SHARED_DIFF_TOPOLOGY) What reloads do to the pools and lanes themselves, each at most once a
 * scenario: add a pool of anonymous slots with a lane of its own (alone, or after a pool there) and requests of
 * that lane; remove a pool with every lane that routes to it or takes it also=; remove a lane; add back the
 * pool removed, with its lanes and a few more requests of them. A removal waits for the last arrival of its
 * lanes and the last drain (and its until), quarantine and reservation of its pool (neither may come when they
 * are gone): it moves the reload later. */
typedef struct GenTopology {
        unsigned n_pools, n_lanes;             /* the first configuration's; a pool or lane added is the next */
        bool pool_there[POOLS_MAX + 1], lane_there[LANES_MAX + 1];
        unsigned lane_pools[LANES_MAX + 1];    /* its pools and also= pools (bit p) */
        unsigned lane_busy[LANES_MAX + 1];     /* when it may go: after its last arrival, ms */
        unsigned pool_busy[POOLS_MAX + 1];     /* when it may go: after its last drain, quarantine, reservation */
        bool added, removed_pool, removed_lane, revived;
        unsigned removed, removed_lanes;       /* the pool removed, and the lanes with it (bit l) */
        unsigned touched_pools, touched_lanes; /* by the reload being written: its other changes leave them be */
        FILE *more;                            /* requests of the lanes added, for the requests array */
        unsigned n_more;
} GenTopology;

/* Requests of lane l in the topology's `more`, from `at` on for up to 3 s, of k ≤ max_k slots. */
static void gen_more_requests(Gen *g, GenTopology *t, unsigned l, unsigned at, unsigned n, unsigned max_k) {
        for (unsigned i = 0; i < n; i++) {
                unsigned when = at + 100 * gen_below(g, 30);
                fprintf(t->more, ", {\"name\": \"t%u\", \"at\": \"%ums\", \"lane\": \"%c\", \"hold\": \"%ums\", \"slots\": %u",
                        t->n_more++, when, 'a' + l, 100 * (1 + gen_below(g, 40)), 1 + gen_below(g, max_k));
                if (gen_chance(g, 15))
                        fputs(", \"wait\": false", t->more);
                else if (gen_chance(g, 25))
                        fprintf(t->more, ", \"max-wait\": \"%ums\"", 100 * (1 + gen_below(g, 30)));
                if (gen_chance(g, 15))
                        fprintf(t->more, ", \"cancel\": \"%ums\"", 100 * (1 + gen_below(g, 20)));
                fputc('}', t->more);
                t->lane_busy[l] = MAX(t->lane_busy[l], when + 100);
        }
}

/* The lanes there that route to pool p or take it also= (bit l). */
static unsigned gen_lanes_of(const GenTopology *t, unsigned p) {
        unsigned lanes = 0;
        for (unsigned l = 0; l < t->n_lanes + t->added; l++)
                if (t->lane_there[l] && ((t->lane_pools[l] >> p) & 1))
                        lanes |= 1u << l;
        return lanes;
}

static unsigned gen_count(unsigned bits) {
        return (unsigned) __builtin_popcount(bits);
}

/* One reload's changes of the topology, at *at (moved later for a removal): its pools' entries written to pf,
 * its lanes' to lf, each after ", " but the first. */
static void gen_reload_topology(Gen *g, GenTopology *t, unsigned *at, FILE *pf, FILE *lf) {
        const char *ps = "", *ls = "";
        unsigned lanes_there = 0, pools_there = 0;
        for (unsigned l = 0; l < t->n_lanes + t->added; l++)
                lanes_there |= (unsigned) t->lane_there[l] << l;
        for (unsigned p = 0; p < t->n_pools + t->added; p++)
                pools_there |= (unsigned) t->pool_there[p] << p;
        t->touched_pools = t->touched_lanes = 0;

        /* Removals first: they move the reload, before which nothing it adds may come. */
        if (!t->removed_pool && gen_chance(g, 35)) {
                /* Any pool there but one this reload adds, with its lanes, if a lane is left. */
                unsigned p = gen_below(g, t->n_pools + t->added), lanes = gen_lanes_of(t, p);
                if (t->pool_there[p] && !((t->touched_pools >> p) & 1) && gen_count(pools_there) > 1 &&
                    !(lanes & t->touched_lanes) && gen_count(lanes_there & ~lanes) > 0) {
                        t->removed_pool = true;
                        t->removed = p;
                        t->removed_lanes = lanes;
                        t->pool_there[p] = false;
                        t->touched_pools |= 1u << p;
                        *at = MAX(*at, t->pool_busy[p]);
                        fprintf(pf, "%s\"p%u\": null", ps, p);
                        ps = ", ";
                        for (unsigned l = 0; l < t->n_lanes + t->added; l++)
                                if ((lanes >> l) & 1) {
                                        t->lane_there[l] = false;
                                        t->touched_lanes |= 1u << l;
                                        *at = MAX(*at, t->lane_busy[l]);
                                        fprintf(lf, "%s\"%c\": null", ls, 'a' + l);
                                        ls = ", ";
                                }
                        lanes_there &= ~lanes;
                }
        }
        if (!t->removed_lane && gen_chance(g, 30)) {
                unsigned l = gen_below(g, t->n_lanes + t->added);
                if (t->lane_there[l] && !((t->touched_lanes >> l) & 1) && gen_count(lanes_there) > 1) {
                        t->removed_lane = true;
                        t->lane_there[l] = false;
                        t->touched_lanes |= 1u << l;
                        *at = MAX(*at, t->lane_busy[l]);
                        fprintf(lf, "%s\"%c\": null", ls, 'a' + l);
                        ls = ", ";
                }
        }
        if (t->removed_pool && !t->revived && !((t->touched_pools >> t->removed) & 1) && gen_chance(g, 50)) {
                /* Back, with its holders and its keys, and its lanes with theirs. */
                t->revived = true;
                t->pool_there[t->removed] = true;
                t->touched_pools |= 1u << t->removed;
                fprintf(pf, "%s\"p%u\": {}", ps, t->removed);
                ps = ", ";
                for (unsigned l = 0; l < t->n_lanes + t->added; l++)
                        if ((t->removed_lanes >> l) & 1) {
                                t->lane_there[l] = true;
                                t->touched_lanes |= 1u << l;
                                fprintf(lf, "%s\"%c\": {}", ls, 'a' + l);
                                ls = ", ";
                                gen_more_requests(g, t, l, *at, 1 + gen_below(g, 4), 1);
                        }
        } else if (!t->added && gen_chance(g, 40)) {
                unsigned p = t->n_pools, l = t->n_lanes, limit = 1 + gen_below(g, 4);
                t->added = true;
                t->pool_there[p] = t->lane_there[l] = true;
                t->touched_pools |= 1u << p;
                t->touched_lanes |= 1u << l;
                fprintf(pf, "%s\"p%u\": {\"limit\": %u", ps, p, limit);
                ps = ", ";
                if (gen_chance(g, 60))
                        fprintf(pf, ", \"queue-timeout\": \"%ums\"", 200 + 100 * gen_below(g, 30));
                if (gen_chance(g, 30))
                        fprintf(pf, ", \"max-queue\": %u", gen_below(g, 6));
                fputc('}', pf);
                fprintf(lf, "%s\"%c\": {\"pools\": [", ls, 'a' + l);
                ls = ", ";
                t->lane_pools[l] = 1u << p;
                if (gen_chance(g, 50)) {
                        /* After a pool there, first choice. */
                        unsigned q = gen_below(g, t->n_pools);
                        if (t->pool_there[q]) {
                                t->lane_pools[l] |= 1u << q;
                                fprintf(lf, "\"p%u\", ", q);
                        }
                }
                fprintf(lf, "\"p%u\"], \"policy\": \"%s\", \"priority\": %u", p,
                        gen_chance(g, 20) ? "fail-fast" : "wait", gen_below(g, 3));
                unsigned max_k = MIN(limit, 3u);
                if (gen_chance(g, 30)) {
                        unsigned max_in_use = 1 + gen_below(g, 3);
                        fprintf(lf, ", \"max-in-use\": %u", max_in_use);
                        max_k = MIN(max_k, max_in_use); /* more could never be granted (engine.c) */
                }
                fputc('}', lf);
                gen_more_requests(g, t, l, *at, 2 + gen_below(g, 7), max_k);
        }
}

/* A scenario of a few pools and lanes, 20–80 requests over ~8 s, many of them at the same instants
 * (arrivals, releases and budgets colliding is where order matters), and maybe a phase of generated
 * arrivals. A waiter of a pool without a queue timeout may wait for good: the run ends when nothing could
 * serve it any more, the same both ways (a shared pool has no instants of its own in the manual mode). */
static char *generate(uint64_t seed) {
        Gen g = { .state = seed * 1000003 }, cg = { .state = seed * 7919 + 17 }, qg = { .state = seed * 104729 + 31 },
            rg = { .state = seed * 15485863 + 47 }, ag = { .state = seed * 32452843 + 59 },
            xg = { .state = seed * 49979687 + 71 }, kg = { .state = seed * 67867967 + 83 },
            hg = { .state = seed * 86028121 + 97 }, lg = { .state = seed * 104395301 + 101 },
            ng = { .state = seed * 122949823 + 103 }, dg = { .state = seed * 141650939 + 107 },
            tg = { .state = seed * 160481183 + 109 };
        bool also = generator_part_enabled("TEST_SHARED_DIFF_ALSO"),
             extra = generator_part_enabled("TEST_SHARED_DIFF_EXTRA"),
             cancels = generator_part_enabled("TEST_SHARED_DIFF_CANCEL"),
             quarantines = generator_part_enabled("TEST_SHARED_DIFF_QUARANTINE"),
             reloads = generator_part_enabled("TEST_SHARED_DIFF_RELOAD"),
             rules = generator_part_enabled("TEST_SHARED_DIFF_RULES"),
             topology = generator_part_enabled("TEST_SHARED_DIFF_TOPOLOGY");
        char *text = NULL;
        size_t size = 0;
        unsigned limits[POOLS_MAX], n_pools = 1 + gen_below(&g, POOLS_MAX);
        unsigned qts[POOLS_MAX] = {}, qcts[POOLS_MAX] = {}; /* queue timeouts and congestion timeouts, ms */
        unsigned n_lanes = 1 + gen_below(&g, LANES_MAX);
        unsigned lane_max_k[LANES_MAX], lane_max_limit[LANES_MAX], reserved[POOLS_MAX] = {};
        GenPool pools[POOLS_MAX] = {};
        unsigned lane_pools[LANES_MAX] = {};   /* bit p: pool p */
        GenSel lane_sel[LANES_MAX] = {};
        unsigned need[POOLS_MAX] = {};         /* the most slots a request of a lane with the pool asks of it */
        unsigned named = 0;                    /* bit p: a request names a member of pool p */
        GenLane gl[LANES_MAX] = {};            /* what a reload of a lane's rules starts from */
        unsigned lane_qt[LANES_MAX] = {};      /* a lane's queue timeout, ms; 0: none */
        GenTopology topo = {};
        _cleanup_free_ char *more = NULL;
        size_t more_size = 0;

        g.f = open_memstream(&text, &size);
        assert_non_null(g.f);
        topo.more = open_memstream(&more, &more_size);
        assert_non_null(topo.more);
        topo.n_pools = n_pools;
        topo.n_lanes = n_lanes;
        fputs("{\"pools\": {", g.f);
        for (unsigned i = 0; i < n_pools; i++) {
                unsigned qt = gen_chance(&g, 20) ? 0 : 200 + 100 * gen_below(&g, 40);
                limits[i] = 1 + gen_below(&g, 6);
                qts[i] = qt;
                fprintf(g.f, "%s\"p%u\": {\"limit\": %u", i > 0 ? ", " : "", i, limits[i]);
                if (qt > 0)
                        fprintf(g.f, ", \"queue-timeout\": \"%ums\"", qt);
                if (gen_chance(&g, 50)) {
                        /* Named slots: grants carry members, laid out as pool-local lays them out. */
                        fputs(", \"members\": [", g.f);
                        for (unsigned m = 0; m < limits[i]; m++)
                                fprintf(g.f, "%s\"m%u\"", m > 0 ? ", " : "", m);
                        fputc(']', g.f);
                        /* Labels (SPEC §3.5): x on at least one member, y on any (none: left out). */
                        pools[i] = (GenPool) { .limit = limits[i], .members = true,
                                               .x = 1u + gen_below(&g, (1u << limits[i]) - 1),
                                               .y = gen_below(&g, 1u << limits[i]) };
                        fputs(", \"label.x\": ", g.f);
                        gen_print_set(g.f, pools[i].x, limits[i]);
                        if (pools[i].y != 0) {
                                fputs(", \"label.y\": ", g.f);
                                gen_print_set(g.f, pools[i].y, limits[i]);
                        }
                }
                if (gen_chance(&g, 40) && qt > 0) { /* at most the queue timeout (conf.c) */
                        qcts[i] = 100 * gen_below(&g, 1 + qt / 100);
                        fprintf(g.f, ", \"queue-congestion-timeout\": \"%ums\"", qcts[i]);
                }
                if (gen_chance(&g, 40))
                        fprintf(g.f, ", \"max-queue\": %u", gen_below(&g, 8));
                /* Cooldown (issue 23): drawn from a generator of its own, so that the seeds' other draws
                 * stay what they were. */
                if (gen_chance(&cg, 40))
                        fprintf(g.f, ", \"cooldown\": \"%ums\"", 100 + 100 * gen_below(&cg, 15));
                /* Quarantine by exit status (issue 23), from a generator of its own too: 3 always, 4 maybe,
                 * after 1 or 2 in a row. */
                if (pools[i].members && gen_chance(&qg, 60))
                        fprintf(g.f, ", \"quarantine-exit-codes\": [3%s], \"quarantine-after\": %u",
                                gen_chance(&qg, 50) ? ", 4" : "", 1 + gen_below(&qg, 2));
                fputc('}', g.f);
        }
        fputs("}, \"lanes\": {", g.f);
        for (unsigned l = 0; l < n_lanes; l++) {
                /* Lanes in name order: the scripts walk them so (brokerd/lua/README), pool-local in the
                 * configuration's order, which only the order of refusals in one drain could tell apart. */
                fprintf(g.f, "%s\"%c\": {\"pools\": [", l > 0 ? ", " : "", 'a' + l);
                unsigned first = gen_below(&g, n_pools), n = 1 + gen_below(&g, n_pools);
                lane_max_k[l] = lane_max_limit[l] = 0;
                for (unsigned k = 0; k < n; k++) {
                        unsigned p = (first + k) % n_pools;
                        lane_pools[l] |= 1u << p;
                        gl[l].order[k] = p;
                        fprintf(g.f, "%s\"p%u\"", k > 0 ? ", " : "", p);
                        lane_max_k[l] = MAX(lane_max_k[l], MIN(limits[p], 3u));
                        lane_max_limit[l] = MAX(lane_max_limit[l], limits[p]);
                }
                gl[l].n = n;
                gl[l].fail_fast = gen_chance(&g, 20);
                fprintf(g.f, "], \"policy\": \"%s\", \"priority\": %u", gl[l].fail_fast ? "fail-fast" : "wait",
                        gen_below(&g, 3));
                unsigned max_in_use = 0;
                if (gen_chance(&g, 30)) {
                        max_in_use = 1 + gen_below(&g, 4);
                        fprintf(g.f, ", \"max-in-use\": %u", max_in_use);
                }
                gl[l].max_in_use = max_in_use;
                if (gen_chance(&g, 30)) {
                        /* conf.c: every lane must be able to get a slot, so the reserves of a pool stay
                         * below its limit; and a lane reserves no more than its max-in-use. */
                        unsigned r = gen_below(&g, 2);
                        if (extra && r == 1 && gen_chance(&xg, 30) && (max_in_use == 0 || max_in_use >= 2))
                                r = 2;
                        /* Nor below the also= K of the lanes before (engine.c: a request for more is invalid). */
                        for (unsigned k = 0; k < n; k++)
                                if (reserved[(first + k) % n_pools] + r >= limits[(first + k) % n_pools] ||
                                    reserved[(first + k) % n_pools] + r + need[(first + k) % n_pools] > limits[(first + k) % n_pools])
                                        r = 0;
                        for (unsigned k = 0; k < n; k++)
                                reserved[(first + k) % n_pools] += r;
                        gl[l].reserve = r;
                        fprintf(g.f, ", \"reserve\": %u", r);
                }
                if (gen_chance(&g, 20)) {
                        lane_qt[l] = 100 + 100 * gen_below(&g, 30);
                        fprintf(g.f, ", \"queue-timeout\": \"%ums\"", lane_qt[l]);
                } else if (extra && gen_chance(&xg, 10))
                        fputs(", \"queue-timeout\": \"infinity\"", g.f); /* no budget, whatever the pool's */
                if (extra && gen_chance(&xg, 20))
                        fputs(", \"client-wait\": \"ignore\"", g.f);
                if (gen_chance(&g, 20))
                        fprintf(g.f, ", \"max-hold\": \"%ums\"", 100 + 100 * gen_below(&g, 30));
                /* labels= on a lane whose pools all have members, when one of them has a member for it. */
                lane_sel[l] = (GenSel) { .member = -1 };
                bool all_members = true;
                for (unsigned p = 0; p < n_pools; p++)
                        if ((lane_pools[l] >> p) & 1)
                                all_members = all_members && pools[p].members;
                /* A health lane (issue 23): granted quarantined members only, its exit 0 restores them. */
                bool health = all_members && gen_chance(&qg, 25);
                gl[l].health = health;
                if (health)
                        /* health = also: quarantined members first when enough are free, else ordinary ones. */
                        fprintf(g.f, ", \"health\": \"%s\"", extra && gen_chance(&xg, 40) ? "also" : "yes");
                /* also= (issue 22 item 4), from a generator of its own: a health lane takes none (conf.c). */
                if (also && !health)
                        gl[l].also = gen_also(&ag, g.f, limits, reserved, n_pools, lane_pools[l], need, &gl[l]);
                if (all_members && gen_chance(&g, 15)) {
                        GenSel t = { .member = -1 };
                        if (gen_chance(&g, 50))
                                t.x = 1;
                        else
                                t.y = -1;
                        unsigned cap = 0;
                        for (unsigned p = 0; p < n_pools; p++)
                                if ((lane_pools[l] >> p) & 1)
                                        cap = MAX(cap, gen_capacity(&pools[p], &t, NULL));
                        if (cap > 0) {
                                lane_sel[l] = t;
                                fputs(", \"labels\": [", g.f);
                                gen_print_terms(g.f, &t);
                                fputc(']', g.f);
                        }
                }
                fputc('}', g.f);
        }
        /* What each lane's requests may ask for: conf_lane_most() in every one of its pools, so that a request fits
         * any pool its selector fits (engine.c: one that no pool can ever grant is InvalidParameter). */
        for (unsigned l = 0; l < n_lanes; l++) {
                gl[l].most = UINT_MAX;
                for (unsigned p = 0; p < n_pools; p++) {
                        if (!((lane_pools[l] >> p) & 1))
                                continue;
                        unsigned most = limits[p];
                        if (gl[l].max_in_use > 0)
                                most = MIN(most, gl[l].max_in_use);
                        if (!gl[l].health)
                                most = MIN(most, limits[p] - (reserved[p] - gl[l].reserve));
                        gl[l].most = MIN(gl[l].most, most);
                }
        }
        fputs("}, \"requests\": [", g.f);
        unsigned n_requests = 20 + gen_below(&g, 61);
        GenEnd ends[80]; /* when each request's hold would end if granted at once (0: never), in which pools */
        for (unsigned i = 0; i < n_requests; i++) {
                unsigned l = gen_below(&g, n_lanes);
                /* Instants on a 100 ms grid, so that many coincide. */
                unsigned at = 100 * gen_below(&g, 80), k = 1 + gen_below(&g, lane_max_k[l]);
                if (extra && gen_chance(&xg, 10)) /* more than 3: up to the largest limit of its pools */
                        k = 1 + gen_below(&xg, lane_max_limit[l]);
                fprintf(g.f, "%s{\"name\": \"r%u\", \"at\": \"%ums\", \"lane\": \"%c\", \"hold\": ", i > 0 ? ", " : "",
                        i, at, 'a' + l);
                unsigned hold = 0, max_wait = 0; /* ms; 0: forever, none */
                if (gen_chance(&g, 10))
                        fputs("\"forever\"", g.f);
                else {
                        hold = 100 * (1 + gen_below(&g, 40));
                        fprintf(g.f, "\"%ums\"", hold);
                }
                if (gen_chance(&g, 15))
                        fputs(", \"wait\": false", g.f);
                if (gen_chance(&g, 25)) {
                        max_wait = 100 * (1 + gen_below(&g, 30));
                        fprintf(g.f, ", \"max-wait\": \"%ums\"", max_wait);
                }
                gen_request_selector(&g, extra ? &xg : NULL, pools, n_pools, lane_pools[l], &lane_sel[l], &k, &named);
                k = MIN(k, gl[l].most);
                gl[l].need = MAX(gl[l].need, k);
                /* What its command tells at the end: success, a test's failure, a quarantine status. */
                if (gen_chance(&qg, 50)) {
                        static const int statuses[] = { 0, 0, 1, 3, 3, 4 };
                        fprintf(g.f, ", \"exit\": %d", statuses[gen_below(&qg, ELEMENTSOF(statuses))]);
                }
                /* (kg: TEST_SHARED_DIFF_CANCEL) its client goes away while it may still wait. */
                if (cancels && gen_chance(&kg, 20)) {
                        unsigned cancel = 100 * (1 + gen_below(&kg, 30));
                        /* (dg) Half of them at an instant where its answer is due: when its budget ends, or
                         * when a hold in a pool of its lane ends (a slot freed for it). */
                        unsigned due[2 + POOLS_MAX + ELEMENTSOF(ends)], n_due = 0;
                        if (max_wait > 0)
                                due[n_due++] = max_wait;
                        if (lane_qt[l] > 0)
                                due[n_due++] = lane_qt[l];
                        for (unsigned p = 0; p < n_pools; p++)
                                if (((lane_pools[l] >> p) & 1) && qts[p] > 0)
                                        due[n_due++] = qts[p];
                        for (unsigned j = 0; j < i; j++)
                                if ((ends[j].pools & lane_pools[l]) && ends[j].at > at)
                                        due[n_due++] = ends[j].at - at;
                        if (n_due > 0 && gen_chance(&dg, 50))
                                cancel = due[gen_below(&dg, n_due)];
                        fprintf(g.f, ", \"cancel\": \"%ums\"", cancel);
                }
                fprintf(g.f, ", \"slots\": %u}", k);
                gen_need(need, lane_pools[l], k);
                ends[i] = (GenEnd) { .at = hold > 0 ? at + hold : 0, .pools = lane_pools[l] | gl[l].also };
                topo.lane_busy[l] = MAX(topo.lane_busy[l], at + 100);
        }
        long requests_end = ftell(g.f); /* where the topology's requests go */
        assert_true(requests_end > 0);
        fputc(']', g.f);
        /* Drains with a reason, some until a time, some undrained by hand (issue 23), on the same grid. */
        unsigned n_drains = gen_below(&qg, 4);
        if (n_drains > 0) {
                fputs(", \"drains\": [", g.f);
                for (unsigned i = 0; i < n_drains; i++) {
                        unsigned p = gen_below(&qg, n_pools), at = 100 * gen_below(&qg, 80);
                        topo.pool_busy[p] = MAX(topo.pool_busy[p], at + 100);
                        fprintf(g.f, "%s{\"at\": \"%ums\", \"pool\": \"p%u\"", i > 0 ? ", " : "", at, p);
                        if (pools[p].members && gen_chance(&qg, 70))
                                fprintf(g.f, ", \"member\": \"m%u\"", gen_below(&qg, pools[p].limit));
                        if (gen_chance(&qg, 25))
                                fputs(", \"undrain\": true", g.f);
                        else {
                                fprintf(g.f, ", \"reason\": \"d%u\"", i);
                                if (gen_chance(&qg, 60)) {
                                        unsigned until = at + 100 * (1 + gen_below(&qg, 30));
                                        /* A removal waits for its end too: a shared pool's drain ends in Redis,
                                         * told by the next node that calls the pool (slotctl(1), drain), and a node
                                         * that no longer names the pool does not; an in-process pool's is this
                                         * node's record, ended at its until whether the pool is there or not. */
                                        topo.pool_busy[p] = MAX(topo.pool_busy[p], until + 100);
                                        fprintf(g.f, ", \"until\": \"%ums\"", until);
                                }
                        }
                        fputc('}', g.f);
                }
                fputc(']', g.f);
        }
        /* Reservations for people (issue 23 item 4), from a generator of their own, on the same grid: any slot, a
         * member, or labels some member carries; for 100 ms to 3 s; behind waiters, among releases and rests. */
        unsigned n_reservations = gen_chance(&rg, 60) ? 1 + gen_below(&rg, 3) : 0;
        if (n_reservations > 0) {
                fputs(", \"reservations\": [", g.f);
                for (unsigned i = 0; i < n_reservations; i++) {
                        unsigned p = gen_below(&rg, n_pools), at = 100 * gen_below(&rg, 80);
                        topo.pool_busy[p] = MAX(topo.pool_busy[p], at + 100);
                        fprintf(g.f, "%s{\"at\": \"%ums\", \"pool\": \"p%u\", \"for\": \"%ums\", \"reason\": \"v%u\"",
                                i > 0 ? ", " : "", at, p, 100 * (1 + gen_below(&rg, 30)), i);
                        unsigned how = pools[p].members ? gen_below(&rg, 3) : 0;
                        if (how == 1)
                                fprintf(g.f, ", \"member\": \"m%u\"", gen_below(&rg, pools[p].limit));
                        else if (how == 2) {
                                static const GenSel choices[] = {
                                        { .x = 1, .member = -1 },
                                        { .x = -1, .member = -1 },
                                        { .y = -1, .member = -1 },
                                        { .x = 1, .y = -1, .member = -1 },
                                };
                                const GenSel *t = &choices[gen_below(&rg, ELEMENTSOF(choices))];
                                if (gen_capacity(&pools[p], t, NULL) == 0)
                                        t = &choices[0]; /* x is on some member of every member pool */
                                fputs(", \"labels\": [", g.f);
                                gen_print_terms(g.f, t);
                                fputc(']', g.f);
                        }
                        fputc('}', g.f);
                }
                fputc(']', g.f);
        }
        /* (hg: TEST_SHARED_DIFF_QUARANTINE) Quarantines and restores by hand of members, on the same grid. */
        unsigned member_pools[POOLS_MAX], n_member_pools = 0;
        for (unsigned p = 0; p < n_pools; p++)
                if (pools[p].members)
                        member_pools[n_member_pools++] = p;
        unsigned n_quarantines = quarantines && n_member_pools > 0 ? gen_below(&hg, 5) : 0;
        if (n_quarantines > 0) {
                fputs(", \"quarantines\": [", g.f);
                for (unsigned i = 0; i < n_quarantines; i++) {
                        unsigned p = member_pools[gen_below(&hg, n_member_pools)], at = 100 * gen_below(&hg, 80);
                        topo.pool_busy[p] = MAX(topo.pool_busy[p], at + 100);
                        fprintf(g.f, "%s{\"at\": \"%ums\", \"pool\": \"p%u\", \"member\": \"m%u\"", i > 0 ? ", " : "",
                                at, p, gen_below(&hg, pools[p].limit));
                        if (gen_chance(&hg, 35))
                                fputs(", \"restore\": true", g.f);
                        else if (gen_chance(&hg, 70))
                                fprintf(g.f, ", \"reason\": \"q%u\"", i);
                        fputc('}', g.f);
                }
                fputc(']', g.f);
        }
        if (gen_chance(&g, 50)) {
                /* A phase of generated arrivals on top: a steady stream colliding with the explicit ones. */
                unsigned l = gen_below(&g, n_lanes);
                unsigned max_k = lane_max_k[l];
                if (lane_sel[l].x != 0 || lane_sel[l].y != 0) {
                        /* What the lane's labels leave of its pools. */
                        max_k = 0;
                        for (unsigned p = 0; p < n_pools; p++)
                                if ((lane_pools[l] >> p) & 1)
                                        max_k = MAX(max_k, MIN(gen_capacity(&pools[p], &lane_sel[l], NULL), 3u));
                }
                max_k = MIN(max_k, gl[l].most);
                gl[l].need = MAX(gl[l].need, max_k);
                gen_need(need, lane_pools[l], max_k);
                unsigned rate = 1 + gen_below(&g, 40), span = 1 + gen_below(&g, 8);
                fprintf(g.f, ", \"arrivals\": [{\"rate\": \"%u/s\", \"for\": \"%us\", \"hold\": \"%ums\", \"lane\": \"%c\", "
                        "\"slots\": %u",
                        rate, span, 50 * (1 + gen_below(&g, 20)), 'a' + l, 1 + gen_below(&g, max_k));
                topo.lane_busy[l] = MAX(topo.lane_busy[l], 1000 * span);
                if (extra) {
                        gen_phase_extras(&xg, g.f);
                        if (gen_chance(&xg, 30)) {
                                /* A second phase, back to back, of any lane, at most 3 slots its pools all have. */
                                unsigned l2 = gen_below(&xg, n_lanes), k2 = 3;
                                for (unsigned p = 0; p < n_pools; p++)
                                        if ((lane_pools[l2] >> p) & 1)
                                                k2 = MIN(k2, limits[p]);
                                if (lane_sel[l2].x != 0 || lane_sel[l2].y != 0)
                                        k2 = 1; /* the lane's labels leave a member in one of its pools at least */
                                k2 = MIN(k2, gl[l2].most);
                                gl[l2].need = MAX(gl[l2].need, k2);
                                gen_need(need, lane_pools[l2], k2);
                                unsigned rate2 = 1 + gen_below(&xg, 40), span2 = 1 + gen_below(&xg, 4);
                                fprintf(g.f, "}, {\"rate\": \"%u/s\", \"for\": \"%us\", \"hold\": \"%ums\", "
                                        "\"lane\": \"%c\", \"slots\": %u",
                                        rate2, span2, 50 * (1 + gen_below(&xg, 20)), 'a' + l2, 1 + gen_below(&xg, k2));
                                topo.lane_busy[l2] = MAX(topo.lane_busy[l2], 1000 * (span + span2));
                                gen_phase_extras(&xg, g.f);
                        }
                }
                fputs("}]", g.f);
        }
        /* (lg: TEST_SHARED_DIFF_RELOAD) Reloads, in time order on the same grid, each changing a few keys: a
         * lane's priority, a pool's max-queue, the limit of a pool of anonymous slots (larger, or smaller down to
         * what its requests need and its reserves leave: `need`), a pool's queue timeout (the CoDel target: never
         * below its congestion timeout, never none for a pool that had one) and congestion timeout, a pool's
         * cooldown, the labels of a pool's members (shuffled among them). */
        unsigned n_reloads = reloads && gen_chance(&lg, 50) ? 1 + gen_below(&lg, 2) : 0;
        if (n_reloads == 0 && rules && gen_chance(&ng, 50))
                n_reloads = 1 + gen_below(&ng, 2);
        if (n_reloads < 3 && topology && gen_chance(&tg, 50))
                n_reloads++; /* a removal and an addback need two */
        for (unsigned p = 0; p < n_pools; p++)
                topo.pool_there[p] = true;
        for (unsigned l = 0; l < n_lanes; l++) {
                topo.lane_there[l] = true;
                topo.lane_pools[l] = lane_pools[l] | gl[l].also;
        }
        if (n_reloads > 0) {
                unsigned at = 0, grown[POOLS_MAX];
                GenPool relabelled[POOLS_MAX];
                memcpy(grown, limits, sizeof grown);
                memcpy(relabelled, pools, sizeof relabelled);
                fputs(", \"reloads\": [", g.f);
                for (unsigned i = 0; i < n_reloads; i++) {
                        at += 100 * (1 + gen_below(&lg, 40));
                        _cleanup_free_ char *tp = NULL, *tl = NULL;
                        size_t tp_size = 0, tl_size = 0;
                        FILE *pf = open_memstream(&tp, &tp_size), *lf = open_memstream(&tl, &tl_size);
                        assert_true(pf && lf);
                        if (topology)
                                gen_reload_topology(&tg, &topo, &at, pf, lf);
                        assert_int_equal(fclose(pf), 0);
                        assert_int_equal(fclose(lf), 0);
                        fprintf(g.f, "%s{\"at\": \"%ums\", \"pools\": {%s", i > 0 ? ", " : "", at, tp);
                        const char *sep = *tp ? ", " : "";
                        for (unsigned p = 0; p < n_pools; p++) {
                                if (!topo.pool_there[p] || ((topo.touched_pools >> p) & 1))
                                        continue; /* gone, or this reload's topology has its entry */
                                bool limit = !pools[p].members && gen_chance(&lg, 30),
                                     queue = gen_chance(&lg, 20), timeout = qts[p] > 0 && gen_chance(&lg, 30),
                                     cooldown = gen_chance(&lg, 15),
                                     relabel = pools[p].members && !((named >> p) & 1) && gen_chance(&lg, 50);
                                if (!limit && !queue && !timeout && !cooldown && !relabel)
                                        continue;
                                fprintf(g.f, "%s\"p%u\": {", sep, p);
                                sep = ", ";
                                const char *k = "";
                                if (limit) {
                                        unsigned lo = MAX(need[p] + reserved[p], reserved[p] + 1);
                                        if (lo < grown[p] && gen_chance(&lg, 50))
                                                grown[p] = lo + gen_below(&lg, grown[p] - lo);
                                        else
                                                grown[p] += 1 + gen_below(&lg, 2);
                                        fprintf(g.f, "\"limit\": %u", grown[p]);
                                        k = ", ";
                                }
                                if (queue) {
                                        fprintf(g.f, "%s\"max-queue\": %u", k, gen_below(&lg, 8));
                                        k = ", ";
                                }
                                if (timeout) {
                                        qts[p] = MAX(qcts[p], 100u) + 100 * gen_below(&lg, 40);
                                        fprintf(g.f, "%s\"queue-timeout\": \"%ums\"", k, qts[p]);
                                        k = ", ";
                                        if (gen_chance(&lg, 30)) { /* and its congestion timeout, at most it */
                                                qcts[p] = 100 * gen_below(&lg, 1 + qts[p] / 100);
                                                fprintf(g.f, ", \"queue-congestion-timeout\": \"%ums\"", qcts[p]);
                                        }
                                }
                                if (cooldown) {
                                        fprintf(g.f, "%s\"cooldown\": \"%ums\"", k, 100 + 100 * gen_below(&lg, 15));
                                        k = ", ";
                                }
                                if (relabel) {
                                        /* The members' label sets shuffled among them: every label selector
                                         * matches as many members as before (so every request still fits), not
                                         * the same ones; not where a request names a member. */
                                        GenPool *q = &relabelled[p];
                                        unsigned perm[8], x = 0, y = 0;
                                        for (unsigned m = 0; m < q->limit; m++)
                                                perm[m] = m;
                                        for (unsigned m = q->limit; m > 1; m--) {
                                                unsigned j = gen_below(&lg, m), t = perm[m - 1];
                                                perm[m - 1] = perm[j];
                                                perm[j] = t;
                                        }
                                        for (unsigned m = 0; m < q->limit; m++) {
                                                x |= ((q->x >> m) & 1) << perm[m];
                                                y |= ((q->y >> m) & 1) << perm[m];
                                        }
                                        q->x = x;
                                        q->y = y;
                                        fprintf(g.f, "%s\"label.x\": ", k);
                                        gen_print_set(g.f, x, q->limit);
                                        if (pools[p].y != 0) {
                                                fputs(", \"label.y\": ", g.f);
                                                gen_print_set(g.f, y, q->limit);
                                        }
                                }
                                fputc('}', g.f);
                        }
                        fprintf(g.f, "}, \"lanes\": {%s", tl);
                        sep = *tl ? ", " : "";
                        for (unsigned l = 0; l < n_lanes; l++) {
                                if (!topo.lane_there[l] || ((topo.touched_lanes >> l) & 1))
                                        continue;
                                _cleanup_free_ char *keys = NULL;
                                size_t keys_size = 0;
                                FILE *kf = open_memstream(&keys, &keys_size);
                                assert_non_null(kf);
                                const char *k = "";
                                if (gen_chance(&lg, 40)) {
                                        fprintf(kf, "\"priority\": %u", gen_below(&lg, 3));
                                        k = ", ";
                                }
                                if (rules)
                                        gen_reload_lane_rules(&ng, kf, &k, &gl[l], lane_pools[l], reserved, grown, need);
                                assert_int_equal(fclose(kf), 0);
                                if (*k) {
                                        fprintf(g.f, "%s\"%c\": {%s}", sep, 'a' + l, keys);
                                        sep = ", ";
                                }
                        }
                        fputs("}}", g.f);
                }
                fputc(']', g.f);
        }
        fputc('}', g.f);
        assert_int_equal(fclose(g.f), 0);
        assert_int_equal(fclose(topo.more), 0);
        if (more_size == 0)
                return text;
        /* The topology's requests at the end of the requests array. */
        char *all = NULL;
        assert_true(asprintf(&all, "%.*s%s%s", (int) requests_end, text, more, text + requests_end) > 0);
        free(text);
        return all;
}

static void test_generated(void **state) {
        uint64_t seed = (uintptr_t) *state;
        _cleanup_free_ char *text = generate(seed);
        char origin[64];

        snprintf(origin, sizeof origin, "generated scenario %" PRIu64, seed);
        if (getenv("TEST_SHARED_DIFF_PRINT"))
                fprintf(stderr, "# %s: %s\n", origin, text);
        check_scenario(text, origin);
}

int main(void) {
        _cleanup_free_ struct CMUnitTest *tests = NULL;
        _cleanup_free_ char *names = NULL;
        size_t n = 0, generated = GENERATED, first = 1;
        glob_t files = {};
        int r;

        if (!test_redis_find()) {
                /* The TAP plan says skip; meson (1.0) counts exit status 77 of a TAP test as an error. */
                printf("1..0 # SKIP redis-server not found (install redis-server, or set REDIS_SERVER)\n");
                return 0;
        }
        /* TEST_SHARED_DIFF_SEEDS=N: more generated scenarios, to look for differences (seeds 1…N). */
        const char *seeds = getenv("TEST_SHARED_DIFF_SEEDS");
        if (seeds)
                generated = MIN(strtoul(seeds, NULL, 10), 100000ul);
        const char *from = getenv("TEST_SHARED_DIFF_FIRST");
        if (from)
                first = MAX(MIN(strtoul(from, NULL, 10), 1000000ul), 1ul);
        /* Run from tests/ (meson's workdir). */
        r = glob("scenarios/*.json", 0, NULL, &files);
        if (r != 0 || files.gl_pathc == 0) {
                printf("Bail out! no scenarios/*.json here\n");
                return 1;
        }
        tests = calloc(files.gl_pathc + generated, sizeof(struct CMUnitTest));
        names = calloc(generated, 32);
        assert(tests && names);
        for (size_t i = 0; i < files.gl_pathc; i++)
                tests[n++] = (struct CMUnitTest) {
                        .name = files.gl_pathv[i],
                        .test_func = test_scenario_file,
                        .initial_state = files.gl_pathv[i],
                };
        for (size_t i = 0; i < generated; i++) {
                snprintf(names + 32 * i, 32, "generated seed %u", (unsigned) (first + i));
                tests[n++] = (struct CMUnitTest) {
                        .name = names + 32 * i,
                        .test_func = test_generated,
                        .initial_state = (void *) (uintptr_t) (first + i),
                };
        }

        signal(SIGPIPE, SIG_IGN);
        r = test_redis_start(&server);
        if (r < 0) {
                printf("Bail out! redis-server did not start: %s\n", strerror(-r));
                return 1;
        }
        snprintf(backend_url, sizeof backend_url, "unix://%s", server.socket_path);
        admin = redisConnectUnix(server.socket_path);
        if (!admin || admin->err) {
                printf("Bail out! cannot connect to %s\n", server.socket_path);
                test_redis_stop(&server);
                return 1;
        }
        r = _cmocka_run_group_tests("test-shared-diff", tests, n, NULL, NULL);
        redisFree(admin);
        test_redis_stop(&server);
        globfree(&files);
        return r;
}
