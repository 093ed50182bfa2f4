/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "history-file.h"
#include "history-schema.h"
#include "replay.h"
#include "selector.h"
#include "strv.h"

/* The decisions that are requests: each arrived, and was either granted or refused for want of room. */
#define REQUEST_DECISIONS "('granted', 'busy', 'full', 'timeout', 'shed')"
/* The decisions that say how long a lease was held. Every lease ends with one "released" row, its whole
 * hold; a "revoked" row (the hold when it was revoked) only stands in where no release was recorded. */
#define END_DECISIONS "('released', 'revoked')"

typedef struct ReplayRequest {
        int64_t id;
        uint64_t time_us;
        uint64_t arrival_us;
        size_t lane;
        bool granted;
        int64_t hold_us;   /* -1: unknown */
        unsigned slots;    /* events.slots (schema 7); 1 in rows written before it */
        char **labels;     /* what it asked of the members (events.selector): "L", "!L"; NULL: nothing */
        char *member;
        int exit_status;   /* what its command told with the release (events.exit_status, schema 6); -1: nothing */
        bool reserve;      /* a reservation (lane ENGINE_RESERVE_LANE): replayed as one, not as a request */
        char *reason;      /* a reservation's: its job column, what `slotctl reserve --reason` said */
} ReplayRequest;

typedef struct ReplayLane {
        char *name;
        bool queued;       /* some request of it waited, or had a budget */
        bool busy;         /* it was refused busy */
        uint64_t *holds;   /* of its grants whose lease ended */
        size_t n_holds;
} ReplayLane;

typedef struct Replay {
        sqlite3 *db;
        const char *path;
        char *pool;
        ReplayRequest *requests;
        size_t n_requests;
        ReplayLane *lanes;
        size_t n_lanes;
        uint64_t *keeping_up_budgets, *saturated_budgets;
        size_t n_keeping_up, n_saturated;
        uint64_t last_us;
        uint64_t n_selectors; /* requests that asked for labels or a member */
        size_t n_reservations; /* of requests, those that are reservations */
} Replay;

static void replay_done(Replay *r) {
        if (r->db)
                sqlite_api.close_v2(r->db);
        free(r->pool);
        for (size_t i = 0; i < r->n_requests; i++) {
                strv_free(r->requests[i].labels);
                free(r->requests[i].member);
                free(r->requests[i].reason);
        }
        free(r->requests);
        for (size_t i = 0; i < r->n_lanes; i++) {
                free(r->lanes[i].name);
                free(r->lanes[i].holds);
        }
        free(r->lanes);
        free(r->keeping_up_budgets);
        free(r->saturated_budgets);
}

void replay_info_done(ReplayInfo *info) {
        if (!info)
                return;
        free(info->pool);
        for (char **l = info->lanes; l && *l; l++)
                free(*l);
        free(info->lanes);
        *info = (ReplayInfo) {};
}

static int push_u64(uint64_t **a, size_t *n, uint64_t v) {
        uint64_t *b = reallocarray(*a, *n + 1, sizeof(uint64_t));
        if (!b)
                return -ENOMEM;
        b[(*n)++] = v;
        *a = b;
        return 0;
}

static int compare_u64(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
        return x < y ? -1 : x > y;
}

/* The value that occurs most often (the smallest of a tie); sorts the array. */
static uint64_t mode_u64(uint64_t *a, size_t n) {
        uint64_t best = a[0];
        size_t best_n = 0;

        qsort(a, n, sizeof(uint64_t), compare_u64);
        for (size_t i = 0; i < n;) {
                size_t j = i;
                while (j < n && a[j] == a[i])
                        j++;
                if (j - i > best_n) {
                        best = a[i];
                        best_n = j - i;
                }
                i = j;
        }
        return best;
}

/* The lower median; sorts the array. */
static uint64_t median_u64(uint64_t *a, size_t n) {
        qsort(a, n, sizeof(uint64_t), compare_u64);
        return a[(n - 1) / 2];
}

/* How much of an untrusted text an error may quote: its printable ASCII start, at most 80 bytes. An escape
 * sequence, a newline or a right-to-left override from history.db never reaches the terminal. */
static int quotable(const char *s) {
        size_t n = 0;
        while (n < 80 && s[n] >= 0x20 && s[n] < 0x7f)
                n++;
        return (int) n;
}

static int choose_pool(Replay *r, const char *wanted, char **error) {
        sqlite3_stmt *st = NULL;
        _cleanup_free_ char *list = NULL;
        size_t n = 0, list_len = 0;
        bool found = false;
        int rc;

        rc = sqlite_api.prepare_v2(r->db,
                                "SELECT pool, count(*) FROM events WHERE decision IN " REQUEST_DECISIONS
                                " AND pool IS NOT NULL GROUP BY pool ORDER BY pool",
                                -1, &st, NULL);
        if (rc != SQLITE_OK)
                return scenario_error(error, "--replay: '%s' is not a brokerd history database (%s)", r->path,
                                      sqlite_api.errmsg(r->db));
        while ((rc = sqlite_api.step(st)) == SQLITE_ROW) {
                const char *pool = (const char *) sqlite_api.column_text(st, 0);
                char *l;
                if (!conf_name_is_valid(pool))
                        continue; /* not from brokerd: a pool is named in brokerd.conf */
                n++;
                if (wanted && streq(pool, wanted))
                        found = true;
                if (!r->pool && !(r->pool = strdup(pool)))
                        rc = SQLITE_NOMEM;
                if (asprintf(&l, "%s%s%s (%lld)", list ?: "", list ? ", " : "", pool,
                             (long long) sqlite_api.column_int64(st, 1)) < 0) {
                        rc = SQLITE_NOMEM;
                        break;
                }
                free(list);
                list = l;
                list_len++;
        }
        sqlite_api.finalize(st);
        if (rc == SQLITE_NOMEM)
                return -ENOMEM;
        if (rc != SQLITE_DONE)
                return scenario_error(error, "--replay: reading '%s': %s", r->path, sqlite_api.errmsg(r->db));

        if (n == 0)
                return scenario_error(error, "--replay: '%s' holds no requests (no granted or refused decisions)",
                                      r->path);
        if (wanted) {
                if (!found)
                        return scenario_error(error, "--pool: '%s' has no requests for pool '%s'; it has: %s", r->path, wanted,
                                              list);
                free(r->pool);
                r->pool = strdup(wanted);
                return r->pool ? 0 : -ENOMEM;
        }
        if (n > 1)
                return scenario_error(error,
                                      "--replay: '%s' has requests for several pools; choose one with --pool: %s",
                                      r->path, list);
        return 0;
}

static int lane_index(Replay *r, const char *name, size_t *ret) {
        for (size_t i = 0; i < r->n_lanes; i++)
                if (streq(r->lanes[i].name, name)) {
                        *ret = i;
                        return 0;
                }
        ReplayLane *a = reallocarray(r->lanes, r->n_lanes + 1, sizeof(ReplayLane));
        if (!a)
                return -ENOMEM;
        r->lanes = a;
        r->lanes[r->n_lanes] = (ReplayLane) { .name = strdup(name) };
        if (!r->lanes[r->n_lanes].name)
                return -ENOMEM;
        *ret = r->n_lanes++;
        return 0;
}

/* events.selector (schema 5): what a request asked of the members, as selector_canon() wrote it ("arm64
 * !flaky @rig-c"), back into terms and a member. The file is untrusted: a text that no brokerd writes is
 * an error naming the event. */
static int selector_parse(const char *text, char ***ret_labels, char **ret_member) {
        _cleanup_free_ char *copy = strdup(text);
        char **labels = NULL, *member = NULL, *save = NULL;
        size_t n = 0;

        if (!copy)
                return -ENOMEM;
        for (char *w = strtok_r(copy, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
                if (w[0] == '@') {
                        if (member || !conf_name_is_valid(w + 1))
                                goto invalid;
                        member = strdup(w + 1);
                        if (!member)
                                goto oom;
                        continue;
                }
                if (!selector_term_is_valid(w) || n >= SELECTOR_TERMS_MAX)
                        goto invalid;
                char **a = reallocarray(labels, n + 2, sizeof(char *));
                if (!a)
                        goto oom;
                labels = a;
                labels[n] = strdup(w);
                labels[n + 1] = NULL;
                if (!labels[n++])
                        goto oom;
        }
        *ret_labels = labels;
        *ret_member = member;
        return 0;
invalid:
        strv_free(labels);
        free(member);
        return -EINVAL;
oom:
        strv_free(labels);
        free(member);
        return -ENOMEM;
}

static int read_requests(Replay *r, char **error) {
        sqlite3_stmt *st = NULL;
        int rc;

        /* events.exit_status came with schema 6: what a release's command told (SPEC §3.6), replayed. */
        bool has_exit = sqlite_api.prepare_v2(r->db, "SELECT exit_status FROM events LIMIT 0", -1, &st, NULL) == SQLITE_OK;
        sqlite_api.finalize(st);
        st = NULL;
        /* Each lease's first end says how long it was held (and its release, what its command told); the
         * temporary table (in memory, allowed on a read-only connection) makes the join one lookup per request. */
        rc = sqlite_api.exec(r->db, "CREATE TEMP TABLE replay_ends (lease TEXT PRIMARY KEY, hold_us INTEGER NOT NULL, "
                                    "exit_status INTEGER)",
                          NULL, NULL, NULL);
        char ends_sql[512];
        snprintf(ends_sql, sizeof ends_sql,
                 "INSERT OR IGNORE INTO replay_ends SELECT lease, hold_us, %s FROM events "
                 "WHERE pool = ? AND decision IN " END_DECISIONS
                 " AND lease IS NOT NULL AND hold_us IS NOT NULL ORDER BY decision = 'released' DESC, id",
                 has_exit ? "CASE WHEN decision = 'released' THEN exit_status END" : "NULL");
        if (rc == SQLITE_OK)
                rc = sqlite_api.prepare_v2(r->db, ends_sql, -1, &st, NULL);
        if (rc == SQLITE_OK) {
                sqlite_api.bind_text(st, 1, r->pool, -1, SQLITE_STATIC);
                rc = sqlite_api.step(st);
                rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
        }
        sqlite_api.finalize(st);
        st = NULL;
        if (rc == SQLITE_OK)
                rc = sqlite_api.prepare_v2(r->db, "SELECT max(time) FROM events", -1, &st, NULL);
        if (rc == SQLITE_OK && sqlite_api.step(st) == SQLITE_ROW)
                r->last_us = (uint64_t) MAX(sqlite_api.column_int64(st, 0), 0);
        sqlite_api.finalize(st);
        st = NULL;
        /* events.selector came with schema 5: an older file's requests asked nothing of the members; events.slots
         * with schema 7: before it, every request is replayed as one slot. */
        bool has_selector = false, has_slots = false;
        if (rc == SQLITE_OK && sqlite_api.prepare_v2(r->db, "SELECT selector FROM events LIMIT 0", -1, &st, NULL) == SQLITE_OK)
                has_selector = true;
        sqlite_api.finalize(st);
        st = NULL;
        if (rc == SQLITE_OK && sqlite_api.prepare_v2(r->db, "SELECT slots FROM events LIMIT 0", -1, &st, NULL) == SQLITE_OK)
                has_slots = true;
        sqlite_api.finalize(st);
        st = NULL;
        char sql[512];
        snprintf(sql, sizeof sql,
                 "SELECT e.id, e.time, e.decision, e.lane, e.wait_us, e.budget_us, e.state, n.hold_us, %s, %s, "
                 "n.exit_status, e.job FROM events e LEFT JOIN replay_ends n ON n.lease = e.lease "
                 "WHERE e.pool = ? AND e.decision IN " REQUEST_DECISIONS " ORDER BY e.id",
                 has_selector ? "e.selector" : "NULL", has_slots ? "e.slots" : "NULL");
        if (rc == SQLITE_OK)
                rc = sqlite_api.prepare_v2(r->db, sql, -1, &st, NULL);
        if (rc != SQLITE_OK)
                return scenario_error(error, "--replay: '%s' is not a brokerd history database (%s)", r->path,
                                      sqlite_api.errmsg(r->db));

        sqlite_api.bind_text(st, 1, r->pool, -1, SQLITE_STATIC);
        while ((rc = sqlite_api.step(st)) == SQLITE_ROW) {
                const char *decision = (const char *) sqlite_api.column_text(st, 2);
                const char *lane = (const char *) sqlite_api.column_text(st, 3);
                const char *state = (const char *) sqlite_api.column_text(st, 6);
                int64_t time_us = sqlite_api.column_int64(st, 1), wait_us = sqlite_api.column_int64(st, 4);
                bool granted = streq(decision, "granted");
                size_t k = SIZE_MAX;

                if (!lane || time_us < 0)
                        continue; /* not from brokerd: every request names its lane */
                if (!streq(lane, ENGINE_RESERVE_LANE) && !conf_name_is_valid(lane)) {
                        rc = scenario_error(error, "--replay: %s: event %lld: invalid lane name \"%.*s\"", r->path,
                                            (long long) sqlite_api.column_int64(st, 0), quotable(lane), lane);
                        sqlite_api.finalize(st);
                        return rc;
                }
                /* A reservation (SPEC §3.6; brokerd's session_reserve()): lane @reserve, which no configuration
                 * has. It waits as long as it takes and is never refused for want of room: a refusal row of it
                 * is not brokerd's. Its grant is replayed as a reservation, not as a lane's request. */
                bool reserve = streq(lane, ENGINE_RESERVE_LANE);
                if (reserve && !granted)
                        continue;
                ReplayLane scratch = {};
                if (!reserve && lane_index(r, lane, &k) < 0)
                        goto oom;
                ReplayLane *l = reserve ? &scratch : &r->lanes[k];
                if (wait_us > 0 || sqlite_api.column_type(st, 5) != SQLITE_NULL)
                        l->queued = true;
                if (streq(decision, "busy"))
                        l->busy = true;
                if (sqlite_api.column_type(st, 5) != SQLITE_NULL && state) {
                        uint64_t budget = (uint64_t) MAX(sqlite_api.column_int64(st, 5), 0);
                        if (streq(state, "keeping-up") && push_u64(&r->keeping_up_budgets, &r->n_keeping_up, budget) < 0)
                                goto oom;
                        if (streq(state, "saturated") && push_u64(&r->saturated_budgets, &r->n_saturated, budget) < 0)
                                goto oom;
                }

                int64_t hold = -1;
                if (granted && sqlite_api.column_type(st, 7) != SQLITE_NULL) {
                        hold = MAX(sqlite_api.column_int64(st, 7), 0);
                        if (!reserve && push_u64(&l->holds, &l->n_holds, (uint64_t) hold) < 0)
                                goto oom;
                }

                /* Untrusted as the rest of the file: a count a pool could have, or the row is not brokerd's. */
                int64_t slots = sqlite_api.column_type(st, 9) == SQLITE_NULL ? 1 : sqlite_api.column_int64(st, 9);
                if (slots < 1 || slots > CONF_LIMIT_MAX) {
                        rc = scenario_error(error, "--replay: %s: event %lld: invalid slot count %lld", r->path,
                                            (long long) sqlite_api.column_int64(st, 0), (long long) slots);
                        sqlite_api.finalize(st);
                        return rc;
                }

                char **labels = NULL, *member = NULL;
                const char *selector = (const char *) sqlite_api.column_text(st, 8);
                if (selector) {
                        int q = selector_parse(selector, &labels, &member);
                        if (q == -ENOMEM)
                                goto oom;
                        if (q < 0) {
                                q = scenario_error(error, "--replay: %s: event %lld: invalid selector \"%.*s\"",
                                                   r->path, (long long) sqlite_api.column_int64(st, 0), quotable(selector),
                                                   selector);
                                sqlite_api.finalize(st);
                                return q;
                        }
                        if (labels || member)
                                r->n_selectors++;
                }

                /* A reservation's reason as the scenario takes one: no control character, at most 1024 bytes. */
                const char *job = (const char *) sqlite_api.column_text(st, 11);
                char *reason = NULL;
                if (reserve) {
                        bool ok = job && strlen(job) <= 1024;
                        for (const unsigned char *c = (const unsigned char *) job; ok && *c; c++)
                                ok = *c >= 0x20 && *c != 0x7f;
                        reason = strdup(ok ? job : "replayed");
                }
                ReplayRequest *a = reserve && !reason ? NULL : reallocarray(r->requests, r->n_requests + 1, sizeof(ReplayRequest));
                if (!a) {
                        strv_free(labels);
                        free(member);
                        free(reason);
                        goto oom;
                }
                r->requests = a;
                r->n_reservations += reserve;
                r->requests[r->n_requests++] = (ReplayRequest) {
                        .reserve = reserve,
                        .reason = reason,
                        .labels = labels,
                        .member = member,
                        .id = sqlite_api.column_int64(st, 0),
                        .time_us = (uint64_t) time_us,
                        .arrival_us = (uint64_t) time_us - (uint64_t) MIN(MAX(wait_us, 0), time_us),
                        .lane = k,
                        .granted = granted,
                        .hold_us = hold,
                        .slots = (unsigned) slots,
                        /* Untrusted: a status a command could have, else none. */
                        .exit_status = granted && sqlite_api.column_type(st, 10) == SQLITE_INTEGER &&
                                                       sqlite_api.column_int64(st, 10) >= 0 &&
                                                       sqlite_api.column_int64(st, 10) <= 255
                                               ? (int) sqlite_api.column_int64(st, 10)
                                               : -1,
                };
        }
        sqlite_api.finalize(st);
        if (rc != SQLITE_DONE)
                return scenario_error(error, "--replay: reading '%s': %s", r->path, sqlite_api.errmsg(r->db));
        if (r->n_requests == 0)
                return scenario_error(error, "--replay: '%s' holds no requests for pool '%s'", r->path, r->pool);
        return 0;
oom:
        sqlite_api.finalize(st);
        return -ENOMEM;
}

typedef struct Edge {
        uint64_t t;
        int delta;
} Edge;

static int compare_edges(const void *a, const void *b) {
        const Edge *x = a, *y = b;
        if (x->t != y->t)
                return x->t < y->t ? -1 : 1;
        return x->delta - y->delta; /* ends before starts at one instant: a slot freed is taken again */
}

/* The most leases held at once: a lower bound of the limit, and the limit itself once the pool refused
 * anyone for want of room. */
static int peak_held(const Replay *r, unsigned *ret) {
        _cleanup_free_ Edge *edges = calloc(MAX(r->n_requests, 1u) * 2, sizeof(Edge));
        size_t n = 0;
        int held = 0, peak = 0;

        if (!edges)
                return -ENOMEM;
        for (size_t i = 0; i < r->n_requests; i++) {
                const ReplayRequest *q = &r->requests[i];
                if (!q->granted)
                        continue;
                uint64_t end = q->hold_us >= 0 ? q->time_us + (uint64_t) q->hold_us : MAX(r->last_us, q->time_us);
                edges[n++] = (Edge) { q->time_us, (int) q->slots };
                edges[n++] = (Edge) { end, -(int) q->slots };
        }
        qsort(edges, n, sizeof(Edge), compare_edges);
        for (size_t i = 0; i < n; i++) {
                held += edges[i].delta;
                peak = MAX(peak, held);
        }
        *ret = (unsigned) peak;
        return 0;
}

static void format_usec(char *buf, size_t size, usec_t u) {
        if (u % USEC_PER_MSEC == 0)
                snprintf(buf, size, "%" PRIu64 "ms", u / USEC_PER_MSEC);
        else
                snprintf(buf, size, "%" PRIu64 "us", u);
}

static int add_pool_setting(Scenario *s, const char *section, const char *key, const char *given, const char *option,
                            const char *inferred, const char *path) {
        if (given)
                return scenario_add_setting(s, section, key, given, option, option);
        if (inferred)
                return scenario_add_setting(s, section, key, inferred, path, path);
        return 0;
}

/* The recorded reservations as the scenario's (SPEC §3.6; simulate.c, sim_reserve()): arriving at time − wait,
 * in the replayed pool, asking its member or labels again, for as long as it was held (its --for when it ran
 * out, less when released by hand; until the history ends while still held), with its reason. */
static int build_reservations(const Replay *r, uint64_t t0, Scenario *s) {
        /* Each entry is the scenario's as soon as it is counted: scenario_free() frees what a failure leaves. */
        s->reservations = calloc(MAX(r->n_reservations, 1u), sizeof(ScenarioReservation));
        if (!s->reservations)
                return -ENOMEM;
        for (size_t i = 0; i < r->n_requests; i++) {
                const ReplayRequest *q = &r->requests[i];
                if (!q->reserve)
                        continue;
                uint64_t hold = q->hold_us >= 0 ? (uint64_t) q->hold_us : usec_sub_unsigned(r->last_us, q->time_us);
                ScenarioReservation *o = &s->reservations[s->n_reservations++];
                o->at_ms = (q->arrival_us - t0) / USEC_PER_MSEC;
                o->for_ms = MAX(hold / USEC_PER_MSEC, UINT64_C(1));
                if (asprintf(&o->origin, "%s: event %" PRId64, r->path, q->id) < 0) {
                        o->origin = NULL;
                        return -ENOMEM;
                }
                if (!(o->pool = strdup(r->pool)) || !(o->reason = strdup(q->reason)) ||
                    (q->member && !(o->member = strdup(q->member))) || (q->labels && !(o->labels = strv_copy(q->labels))))
                        return -ENOMEM;
        }
        return 0;
}

static int build_requests(const Replay *r, uint64_t t0, ReplayInfo *info, char **error, ScenarioRequest **ret) {
        ScenarioRequest *reqs = calloc(MAX(r->n_requests - r->n_reservations, 1u), sizeof(ScenarioRequest));
        size_t n = 0;
        uint64_t *medians = calloc(MAX(r->n_lanes, 1u), sizeof(uint64_t)), all_median = 0;
        _cleanup_free_ uint64_t *all = NULL;
        size_t n_all = 0;
        int k = -ENOMEM;

        if (!reqs || !medians)
                goto fail;

        /* Refused requests never held anything: they get the median hold of their lane's grants (of all
         * grants when the lane has none), a middle guess rather than an extreme one. */
        for (size_t i = 0; i < r->n_lanes; i++)
                for (size_t j = 0; j < r->lanes[i].n_holds; j++)
                        if (push_u64(&all, &n_all, r->lanes[i].holds[j]) < 0)
                                goto fail;
        if (n_all > 0)
                all_median = median_u64(all, n_all);
        for (size_t i = 0; i < r->n_lanes; i++)
                medians[i] = r->lanes[i].n_holds > 0 ? median_u64(r->lanes[i].holds, r->lanes[i].n_holds) : all_median;

        for (size_t i = 0; i < r->n_requests; i++) {
                const ReplayRequest *q = &r->requests[i];
                uint64_t hold;

                if (q->reserve)
                        continue;
                if (q->hold_us >= 0)
                        hold = (uint64_t) q->hold_us;
                else if (q->granted) {
                        hold = usec_sub_unsigned(r->last_us, q->time_us); /* still held when the history ends */
                        info->open_holds++;
                } else {
                        if (n_all == 0) {
                                k = scenario_error(error,
                                                   "--replay: no lease of pool '%s' ended in '%s': the refused requests "
                                                   "have no hold to borrow",
                                                   r->pool, r->path);
                                goto fail;
                        }
                        hold = medians[q->lane];
                        info->median_holds++;
                }

                ScenarioRequest *o = &reqs[n++];
                if (asprintf(&o->name, "e%" PRId64, q->id) < 0 ||
                    asprintf(&o->traffic.origin, "%s: event %" PRId64, r->path, q->id) < 0 ||
                    !(o->traffic.lane = strdup(r->lanes[q->lane].name)))
                        goto fail;
                o->at_ms = (q->arrival_us - t0) / USEC_PER_MSEC;
                o->cancel_ms = SIM_FOREVER; /* its client stayed: 0 would withdraw it at its arrival */
                o->traffic.slots = q->slots;
                o->traffic.hold_ms = hold / USEC_PER_MSEC;
                o->traffic.max_wait = USEC_INFINITY;
                o->traffic.exits = q->exit_status >= 0;
                o->traffic.exit_status = MAX(q->exit_status, 0);
                if ((q->member && !(o->traffic.member = strdup(q->member))) ||
                    (q->labels && !(o->traffic.labels = strv_copy(q->labels))))
                        goto fail;
        }
        free(medians);
        *ret = reqs;
        return 0;

fail:
        for (size_t i = 0; reqs && i < n; i++) {
                free(reqs[i].name);
                free(reqs[i].traffic.origin);
                free(reqs[i].traffic.lane);
                free(reqs[i].traffic.member);
                strv_free(reqs[i].traffic.labels);
        }
        free(reqs);
        free(medians);
        return k;
}

static char *words_join(char *const *l) {
        size_t len = 1;
        for (char *const *w = l; w && *w; w++)
                len += strlen(*w) + 1;
        char *j = malloc(len), *p = j;
        if (!j)
                return NULL;
        *p = '\0';
        for (char *const *w = l; w && *w; w++)
                p = stpcpy(stpcpy(p, w == l ? "" : " "), *w);
        return j;
}

/* The members and labels of the pool, and the labels= of its lanes, as --config has them: what the
 * recorded selectors were resolved against. */
static int add_config_settings(Scenario *s, const Replay *r, const ReplayOptions *o, const PoolConfig *p,
                               const char *section) {
        _cleanup_free_ char *members = words_join(p->members);
        int k;

        if (!members)
                return -ENOMEM;
        k = scenario_add_setting(s, section, "members", members, o->config_path, o->config_path);
        for (size_t i = 0; k >= 0 && i < p->n_labels; i++) {
                _cleanup_free_ char *key = NULL, *value = words_join(p->labels[i].members);
                if (!value || asprintf(&key, "label.%s", p->labels[i].name) < 0)
                        return -ENOMEM;
                k = scenario_add_setting(s, section, key, value, o->config_path, o->config_path);
        }
        for (size_t i = 0; k >= 0 && i < r->n_lanes; i++) {
                const LaneConfig *l = conf_find_lane(o->config, r->lanes[i].name);
                _cleanup_free_ char *lane_section = NULL, *value = NULL;
                if (!l || !l->labels)
                        continue;
                if (!(value = words_join(l->labels)) || asprintf(&lane_section, "lane %s", l->name) < 0)
                        return -ENOMEM;
                k = scenario_add_setting(s, lane_section, "labels", value, o->config_path, o->config_path);
        }
        return k;
}

static int build_scenario(Replay *r, const ReplayOptions *o, ReplayInfo *info, char **error, Scenario **ret) {
        _cleanup_(scenario_freep) Scenario *s = NULL;
        _cleanup_free_ char *section = NULL;
        char limit[32] = "", qt[32] = "", ct[32] = "";
        uint64_t t0 = UINT64_MAX;
        int k;

        for (size_t i = 0; i < r->n_requests; i++)
                t0 = MIN(t0, r->requests[i].arrival_us);
        info->first_us = t0;
        info->last_us = r->last_us;
        info->requests = r->n_requests - r->n_reservations;
        info->reservations = r->n_reservations;
        info->inferred_queue_timeout = info->inferred_congestion_timeout = USEC_INFINITY;

        /* A setting the sweep varies is given, value by value: inferring it would only mislead. */
        bool limit_swept = streq_ptr(o->sweep_key, "limit"), qt_swept = streq_ptr(o->sweep_key, "queue-timeout");

        /* What the recorded selectors ask is only meaningful against the pool's members and labels, which
         * the history does not keep: --config gives them. A member pool's limit is its member count. */
        const PoolConfig *members = NULL;
        if (o->config) {
                members = conf_find_pool(o->config, r->pool);
                if (!members)
                        return scenario_error(error, "--config: '%s' has no pool '%s'", o->config_path, r->pool);
                if (members->n_members == 0)
                        members = NULL;
                else
                        info->members = members->n_members;
        }
        if (r->n_selectors > 0 && !members)
                return scenario_error(error,
                                      "--replay: %" PRIu64 " requests of pool '%s' in '%s' asked for labels or a member, "
                                      "which only the pool's members= and label.NAME= can replay (the history does not "
                                      "keep them): slotctl simulate --replay takes them from brokerd.conf with --config",
                                      r->n_selectors, r->pool, r->path);
        info->selectors = r->n_selectors;

        if (!o->limit && !limit_swept && !members) {
                k = peak_held(r, &info->inferred_limit);
                if (k < 0)
                        return k;
                if (info->inferred_limit == 0)
                        return scenario_error(error, "--replay: '%s' shows no grant in pool '%s' to infer its limit from; "
                                                     "give --limit", r->path, r->pool);
                snprintf(limit, sizeof limit, "%u", info->inferred_limit);
        }
        /* While keeping up, a waiter's budget is Q; while saturated, the congestion timeout: the most
         * frequent recorded budget of each (lane or client caps make a few differ). */
        if (!o->queue_timeout && !qt_swept && r->n_keeping_up > 0) {
                info->inferred_queue_timeout = mode_u64(r->keeping_up_budgets, r->n_keeping_up);
                format_usec(qt, sizeof qt, info->inferred_queue_timeout);
        }
        if (!o->queue_congestion_timeout && r->n_saturated > 0 && (o->queue_timeout || qt[0])) {
                usec_t c = mode_u64(r->saturated_budgets, r->n_saturated);
                if (o->queue_timeout || c <= info->inferred_queue_timeout) {
                        info->inferred_congestion_timeout = c;
                        format_usec(ct, sizeof ct, c);
                }
        }

        k = scenario_new(r->path, &s);
        if (k < 0)
                return k;
        if (asprintf(&section, "pool %s", r->pool) < 0)
                return -ENOMEM;
        k = scenario_add_pool(s, r->pool, r->path);
        if (k >= 0)
                k = add_pool_setting(s, section, "limit", o->limit, "--limit", limit[0] ? limit : NULL, r->path);
        if (k >= 0)
                k = add_pool_setting(s, section, "max-queue", o->max_queue, "--max-queue", NULL, r->path);
        if (k >= 0)
                k = add_pool_setting(s, section, "queue-timeout", o->queue_timeout, "--queue-timeout", qt[0] ? qt : NULL,
                                     r->path);
        if (k >= 0)
                k = add_pool_setting(s, section, "queue-congestion-timeout", o->queue_congestion_timeout,
                                     "--queue-congestion-timeout", ct[0] ? ct : NULL, r->path);
        if (k < 0)
                return k;

        info->lanes = calloc(r->n_lanes + 1, sizeof(char *));
        if (!info->lanes)
                return -ENOMEM;
        for (size_t i = 0; i < r->n_lanes; i++) {
                const ReplayLane *l = &r->lanes[i];
                /* A lane that only ever granted at once or refused busy failed fast (or its clients asked not
                 * to wait, which comes to the same). */
                const char *policy = l->busy && !l->queued ? "fail-fast" : "wait";
                _cleanup_free_ char *lane_section = NULL;

                if (asprintf(&lane_section, "lane %s", l->name) < 0 ||
                    asprintf(&info->lanes[i], "%s (%s)", l->name, policy) < 0)
                        return -ENOMEM;
                k = scenario_add_lane(s, l->name, r->path);
                if (k >= 0)
                        k = scenario_add_setting(s, lane_section, "pools", r->pool, r->path, r->path);
                if (k >= 0)
                        k = scenario_add_setting(s, lane_section, "policy", policy, r->path, r->path);
                if (k < 0)
                        return k;
        }

        if (members) {
                k = add_config_settings(s, r, o, members, section);
                if (k < 0)
                        return k;
        }
        /* Released slots rested as --config says (SPEC §3.6): the history does not keep cooldown= either. */
        const PoolConfig *pc = o->config ? conf_find_pool(o->config, r->pool) : NULL;
        if (pc && pc->cooldown > 0) {
                char v[TIMESPAN_MAX];
                k = scenario_add_setting(s, section, "cooldown", timespan_format(v, sizeof v, pc->cooldown),
                                         o->config_path, o->config_path);
                if (k < 0)
                        return k;
                info->cooldown = pc->cooldown;
        }
        /* Quarantine by exit status and health lanes as --config says (SPEC §3.6): the recorded exit statuses
         * then quarantine and restore as brokerd would have. */
        if (members && pc->quarantine_exit_codes_set) {
                _cleanup_free_ char *codes = NULL;
                size_t size = 0;
                const char *sep = "";
                FILE *f = open_memstream(&codes, &size);
                if (!f)
                        return -ENOMEM;
                for (int c = 1; c <= 255; c++)
                        if (pool_config_quarantines(pc, c)) {
                                fprintf(f, "%s%d", sep, c);
                                sep = " ";
                        }
                if (fclose(f) != 0 || !codes)
                        return -ENOMEM;
                char after[16];
                snprintf(after, sizeof after, "%u", MAX(pc->quarantine_after, 1u));
                k = scenario_add_setting(s, section, "quarantine-exit-codes", codes, o->config_path, o->config_path);
                if (k >= 0)
                        k = scenario_add_setting(s, section, "quarantine-after", after, o->config_path, o->config_path);
                if (k < 0)
                        return k;
                info->quarantine = true;
        }
        for (size_t i = 0; members && i < r->n_lanes; i++) {
                const LaneConfig *l = conf_find_lane(o->config, r->lanes[i].name);
                _cleanup_free_ char *lane_section = NULL;
                if (!l || !l->health)
                        continue;
                if (asprintf(&lane_section, "lane %s", l->name) < 0)
                        return -ENOMEM;
                k = scenario_add_setting(s, lane_section, "health", l->health_also ? "also" : "yes", o->config_path,
                                         o->config_path);
                if (k < 0)
                        return k;
        }

        k = build_requests(r, t0, info, error, &s->requests);
        if (k < 0)
                return k;
        s->n_requests = r->n_requests - r->n_reservations;
        if (r->n_reservations > 0) {
                k = build_reservations(r, t0, s);
                if (k < 0)
                        return k;
        }

        if (o->deadline) {
                k = parse_duration_ms(o->deadline, true, &s->deadline_ms);
                if (k < 0)
                        return scenario_duration_error(error, "--deadline", o->deadline, k);
        }
        k = scenario_finish(s, error);
        if (k < 0)
                return k;
        *ret = TAKE_PTR(s);
        return 0;
}

int replay_load(const ReplayOptions *o, char **error, Scenario **ret, ReplayInfo *ret_info) {
        _cleanup_(replay_info_done) ReplayInfo info = {};
        _cleanup_(scenario_freep) Scenario *s = NULL;
        Replay r = { .path = o->path };
        int k;

        assert_return(o && o->path && error && ret && ret_info, -EINVAL);

        k = history_file_open(r.path, "--replay", error, &r.db);
        /* The temporary table of lease ends lives in memory (and is allowed on a read-only connection). */
        if (k >= 0 && sqlite_api.exec(r.db, "PRAGMA temp_store = MEMORY", NULL, NULL, NULL) != SQLITE_OK)
                k = -ENOMEM;
        if (k >= 0)
                k = choose_pool(&r, o->pool, error);
        if (k >= 0)
                k = read_requests(&r, error);
        if (k >= 0)
                k = build_scenario(&r, o, &info, error, &s);
        if (k >= 0) {
                sqlite3_stmt *st = NULL;

                info.pool = TAKE_PTR(r.pool);
                /* A refusal the replay cannot model without --max-queue: worth a word. */
                if (sqlite_api.prepare_v2(r.db, "SELECT count(*) FROM events WHERE pool = ? AND decision = 'full' AND " HISTORY_UNUSUAL_DECISION, -1, &st,
                                       NULL) == SQLITE_OK) {
                        sqlite_api.bind_text(st, 1, info.pool, -1, SQLITE_STATIC);
                        if (sqlite_api.step(st) == SQLITE_ROW)
                                info.full_refusals = (uint64_t) sqlite_api.column_int64(st, 0);
                }
                sqlite_api.finalize(st);
        }
        replay_done(&r);
        if (k < 0)
                return k;

        *ret = TAKE_PTR(s);
        *ret_info = info;
        info = (ReplayInfo) {};
        return 0;
}

static void format_time(char *buf, size_t size, uint64_t us) {
        time_t t = (time_t) (us / USEC_PER_SEC);
        struct tm tm;
        if (!localtime_r(&t, &tm) || strftime(buf, size, "%Y-%m-%d %H:%M:%S", &tm) == 0)
                snprintf(buf, size, "@%" PRIu64, us / USEC_PER_SEC);
}

void replay_info_print(const ReplayInfo *info, FILE *f) {
        char first[64], last[64], span[TIMESPAN_MAX];

        format_time(first, sizeof first, info->first_us);
        format_time(last, sizeof last, info->last_us);
        fprintf(f, "slotctl simulate: replaying %" PRIu64 " requests of pool '%s' recorded from %s to %s\n",
                info->requests, info->pool, first, last);
        if (info->inferred_limit > 0)
                fprintf(f, "  limit %u: the most slots held at once in the history (--limit sets another)\n",
                        info->inferred_limit);
        if (info->inferred_queue_timeout != USEC_INFINITY)
                fprintf(f, "  queue-timeout %s: the usual budget of waiters while the pool kept up\n",
                        timespan_format(span, sizeof span, info->inferred_queue_timeout));
        if (info->inferred_congestion_timeout != USEC_INFINITY)
                fprintf(f, "  queue-congestion-timeout %s: the usual budget of waiters while it was saturated\n",
                        timespan_format(span, sizeof span, info->inferred_congestion_timeout));
        if (info->members > 0)
                fprintf(f, "  %zu members with their labels, and the lanes' labels=, from --config; %" PRIu64
                           " requests asked for labels or a member\n",
                        info->members, info->selectors);
        if (info->quarantine)
                fputs("  quarantine-exit-codes= and health lanes from --config: the recorded exit statuses "
                      "quarantine and restore members\n", f);
        if (info->cooldown > 0)
                fprintf(f, "  cooldown %s from --config: a released slot rests that long before its next grant\n",
                        timespan_format(span, sizeof span, info->cooldown));
        fputs("  lanes:", f);
        for (char **l = info->lanes; l && *l; l++)
                fprintf(f, "%s %s", l == info->lanes ? "" : ",", *l);
        fputc('\n', f);
        if (info->reservations > 0)
                fprintf(f, "  %" PRIu64 " reservation%s (slotctl reserve) replayed ahead of every waiting job, each held "
                           "as long as it was\n",
                        info->reservations, info->reservations == 1 ? "" : "s");
        if (info->median_holds > 0)
                fprintf(f, "  %" PRIu64 " refused requests hold their lane's median hold (their own is unknown)\n",
                        info->median_holds);
        if (info->open_holds > 0)
                fprintf(f, "  %" PRIu64 " grants had not ended by the last event: they hold until then\n",
                        info->open_holds);
        if (info->full_refusals > 0)
                fprintf(f, "  the history has %" PRIu64 " 'full' refusals: the pool had a max-queue (--max-queue sets it)\n",
                        info->full_refusals);
}

void replay_result_trim(SimResult *r) {
        if (!r)
                return;
        r->records = mfree(r->records);
        r->n_records = 0;
}
