/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "audit.h"
#include "config.h"
#include "connection.h"
#include "history-call.h"
#include "lease.h"
#include "log.h"
#include "metrics.h"
#include "methods.h"
#include "persistence.h"
#include "selector.h"
#include "session.h"

#define INTERFACE "io.slotbroker"

/* The context the owner bound with the sessions' call handler. */
static Methods *methods_of(const Session *s) {
        return s->table->call_userdata;
}

/* May uid administer the broker (reload, drain, cancel)? Root and the broker's own uid. */
static bool is_admin(uid_t uid) {
        return uid == 0 || uid == getuid();
}

static void reply_invalid_parameter(Session *s, const char *parameter) {
        _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "parameter", parameter);
        session_reply_error(s, VARLINK_ERROR_INVALID_PARAMETER, p);
}

/* Dispatches parameters; on failure answers InvalidParameter and returns false. */
static bool parameters_ok(Session *s, const VarlinkCall *call, const JsonField table[]) {
        const char *bad = NULL;
        if (json_dispatch(call->parameters, table, 0, &bad) >= 0)
                return true;
        reply_invalid_parameter(s, bad ?: "parameters");
        return false;
}

static bool require_admin(Session *s) {
        if (is_admin(s->cred.uid))
                return true;
        session_reply_error(s, "io.slotbroker.PermissionDenied", NULL);
        return false;
}

static void method_get_info(Session *s, const VarlinkCall *call) {
        if (!parameters_ok(s, call, (const JsonField[]) { {} }))
                return;
        _cleanup_(json_decrefp) json_t *p = json_pack("{s:s, s:s, s:s, s:s, s:[s, s]}", "vendor", "slotbroker", "product",
                                                      "brokerd", "version", PACKAGE_VERSION, "url",
                                                      "https://github.com/slotbroker/slotbroker", "interfaces",
                                                      VARLINK_SERVICE_INTERFACE, INTERFACE);
        session_reply(s, p, false);
}

static void method_get_interface_description(Session *s, const VarlinkCall *call) {
        const char *interface = NULL;
        if (!parameters_ok(s, call,
                           (const JsonField[]) { { "interface", JSON_FIELD_STRING, JSON_MANDATORY, &interface }, {} }))
                return;
        const char *text = streq(interface, INTERFACE)                     ? varlink_interface_io_slotbroker
                           : streq(interface, VARLINK_SERVICE_INTERFACE) ? varlink_interface_org_varlink_service
                                                                           : NULL;
        if (!text) {
                _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "interface", interface);
                session_reply_error(s, VARLINK_ERROR_INTERFACE_NOT_FOUND, p);
                return;
        }
        _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "description", text);
        session_reply(s, p, false);
}

/* A reservation (SPEC §3.6) is the pool's admins' to end, not only its maker's: a colleague takes over. */
static bool may_end_reservation(Session *s, const Lease *l) {
        Methods *m = methods_of(s);
        if (!l->engine_lease || !streq(engine_lease_lane(l->engine_lease), ENGINE_RESERVE_LANE) || !m->pool_admin)
                return false;
        const gid_t *groups;
        size_t n_groups = connection_get_groups(s->connection, &groups);
        return m->pool_admin(engine_lease_pool(l->engine_lease), s->cred.uid, groups, n_groups, m->userdata);
}

static void method_release(Session *s, const VarlinkCall *call) {
        const char *id = NULL;
        int64_t exit_status = -1;
        if (!parameters_ok(s, call,
                           (const JsonField[]) {
                                   { "lease", JSON_FIELD_STRING, JSON_MANDATORY, &id, .max_length = 64 },
                                   { "exitStatus", JSON_FIELD_INT64, 0, &exit_status, 0, 255 },
                                   {},
                           }))
                return;
        Lease *l = lease_table_find(methods_of(s)->leases, id);
        if (!l) {
                _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "lease", id);
                session_reply_error(s, "io.slotbroker.NoSuchLease", p);
                return;
        }
        if (s->cred.uid != 0 && s->cred.uid != l->uid && !may_end_reservation(s, l)) {
                /* The lease is another user's: its lane's access list has nothing to do with it. */
                _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "lease", id);
                session_reply_error(s, "io.slotbroker.PermissionDenied", p);
                return;
        }
        /* Who ended another's lease (SPEC §3.6: a reservation is audited, its end by a colleague too). */
        if (s->cred.uid != l->uid)
                snprintf(l->released_by, sizeof l->released_by, "by uid %u", (unsigned) s->cred.uid);
        /* SPEC §3.6: the command's status, applied when the lease ends (now, or once its command is gone). */
        if (exit_status >= 0 && l->engine_lease &&
            engine_lease_set_exit_status(l->engine_lease, (int) exit_status, l->job) < 0) {
                log_oom();
                session_close(s);
                return;
        }
        session_lease_release(s, l);
        session_reply(s, NULL, false);
}

static json_t *pool_status(Methods *m, size_t i, usec_t now) {
        EnginePoolInfo info;
        if (engine_pool_info(m->engine, i, now, &info) < 0)
                return NULL;
        const PoolConfig *pc = conf_find_pool(m->config, info.name);
        json_t *o = json_pack("{s:s, s:I, s:I, s:I, s:b, s:b}", "name", info.name, "limit", (json_int_t) info.limit,
                              "inUse", (json_int_t) info.in_use, "waiting", (json_int_t) info.waiting, "congested",
                              info.congested, "drained", info.drained);
        if (!o)
                return NULL;
        if (pc && pc->max_queue >= 0)
                json_object_set_new(o, "maxQueue", json_integer(pc->max_queue));
        if (info.remote) {
                json_t *b = json_pack("{s:b, s:I, s:I, s:I, s:I}", "up", info.backend_up, "rttMs",
                                      (json_int_t) (info.rtt / USEC_PER_MSEC), "nodes", (json_int_t) info.n_nodes,
                                      "inUse", (json_int_t) info.all_in_use, "waiting", (json_int_t) info.all_waiting);
                if (b && info.agreed_limit > 0)
                        json_object_set_new(b, "limit", json_integer((json_int_t) info.agreed_limit));
                if (b && info.unavailable)
                        json_object_set_new(b, "unavailable", json_string(info.unavailable));
                /* The other nodes' holders and waiters are as of this: a Status that came while the pool
                 * served had a fetch asked for after it (methods_views_flush()). */
                PoolSnapshot snap;
                if (b && engine_pool_snapshot(m->engine, i, &snap) >= 0)
                        json_object_set_new(b, "snapshotAgeMs",
                                            json_integer((json_int_t) (usec_sub_unsigned(now, snap.at) / USEC_PER_MSEC)));
                json_t *keys;
                if (b && info.differing_keys && json_strv_new(info.differing_keys, &keys) >= 0)
                        json_object_set_new(b, "differingKeys", keys);
                if (b && info.min_replicas > 0) {
                        json_object_set_new(b, "minReplicas", json_integer((json_int_t) info.min_replicas));
                        if (info.replicas_acked >= 0)
                                json_object_set_new(b, "replicasAcked", json_integer((json_int_t) info.replicas_acked));
                }
                BackendPrimary bp;
                if (b && m->backend_primary && m->backend_primary(info.name, &bp, m->userdata)) {
                        if (bp.address)
                                json_object_set_new(b, "primary", json_string(bp.address));
                        json_object_set_new(b, "failovers", json_integer((json_int_t) bp.failovers));
                        if (bp.last_failover > 0)
                                json_object_set_new(b, "lastFailoverAt", json_integer((json_int_t) bp.last_failover));
                        if (bp.confirmed > 0) {
                                usec_t boot = now_boottime();
                                json_object_set_new(b, "confirmedAgoMs",
                                                    json_integer((json_int_t) ((boot - MIN(boot, bp.confirmed)) /
                                                                               USEC_PER_MSEC)));
                        }
                }
                if (b)
                        json_object_set_new(o, "backend", b);
        }
        if (info.members) {
                json_t *members;
                if (json_strv_new(info.members, &members) >= 0)
                        json_object_set_new(o, "members", members);
        }
        if (info.drained_members) {
                json_t *drained;
                if (json_strv_new(info.drained_members, &drained) >= 0)
                        json_object_set_new(o, "drainedMembers", drained);
        }
        /* SPEC §3.6: who drained it (or its members), why, since and until. */
        json_t *md = NULL;
        /* The engine's drains, then (a shared pool) those Redis keeps for every node. */
        size_t n_engine_drains = engine_drain_count(m->engine);
        for (size_t j = 0; j < n_engine_drains + info.n_drains; j++) {
                EngineDrainInfo d;
                if (j >= n_engine_drains)
                        d = info.drains[j - n_engine_drains];
                else if (engine_drain_info(m->engine, j, &d) < 0)
                        continue;
                if (!streq(d.pool, info.name))
                        continue;
                usec_t real = now_realtime();
                json_t *e = json_pack("{s:s*, s:I, s:s*, s:s*}", "member", d.member, "since",
                                      (json_int_t) usec_mono_to_real(d.since, now, real), "by", d.who, "reason",
                                      d.reason);
                if (e && d.until != USEC_INFINITY)
                        json_object_set_new(e, "until",
                                            json_integer((json_int_t) (d.until_realtime ?:
                                                                       usec_mono_to_real(d.until, now, real))));
                if (!e)
                        continue;
                if (!d.member)
                        json_object_set_new(o, "drain", e);
                else if (md || (md = json_array()))
                        json_array_append_new(md, e);
                else
                        json_decref(e);
        }
        if (md)
                json_object_set_new(o, "memberDrains", md);
        /* SPEC §3.6: since when (realtime: as recorded for one carried over a restart, which may be older than
         * this boot; else from the monotonic instant), which job, which status. */
        json_t *q = NULL;
        for (size_t j = 0; j < info.n_life; j++) {
                const EngineMemberLife *l = info.life + j;
                if (!l->quarantined)
                        continue;
                if (!q && !(q = json_array()))
                        break;
                usec_t real = now_realtime(), ago = usec_sub_unsigned(now, l->since);
                json_t *e = json_pack("{s:s, s:I, s:s*, s:s*}", "member", l->member, "since",
                                      (json_int_t) (l->since_real ?: usec_sub_unsigned(real, ago)), "job", l->job,
                                      "reason", l->reason);
                if (e && l->exit_status >= 0)
                        json_object_set_new(e, "exitStatus", json_integer(l->exit_status));
                /* A shared pool: which node's call quarantined it (Redis keeps it: every node shows the same). */
                if (e && l->node)
                        json_object_set_new(e, "node", json_string(l->node));
                if (e)
                        json_array_append_new(q, e);
        }
        if (q)
                json_object_set_new(o, "quarantined", q);
        if (info.queue_timeout_set) {
                json_object_set_new(o, "queueTimeoutMs", json_integer((json_int_t) (info.queue_timeout / USEC_PER_MSEC)));
                json_object_set_new(o, "idleMs", json_integer((json_int_t) (info.idle / USEC_PER_MSEC)));
        }
        if (info.cooldown > 0)
                json_object_set_new(o, "cooldownMs", json_integer((json_int_t) (info.cooldown / USEC_PER_MSEC)));
        if (info.n_resting > 0) {
                json_t *a = json_array();
                for (size_t k = 0; a && k < info.n_resting; k++) {
                        const PoolRest *rs = &info.resting[k];
                        /* Ended (a shared pool's list is its last reply's; the pool wakes it at its next
                         * instant): not shown as resting. */
                        if (rs->until <= now)
                                continue;
                        /* Rounded up: a slot that rests 1 µs more is not shown as free. */
                        json_t *e = json_pack("{s:I, s:I}", "slot", (json_int_t) rs->index, "leftMs",
                                              (json_int_t) DIV_ROUND_UP(usec_sub_unsigned(rs->until, now), USEC_PER_MSEC));
                        if (e && rs->member)
                                json_object_set_new(e, "member", json_string(rs->member));
                        if (e)
                                json_array_append_new(a, e);
                }
                if (a)
                        json_object_set_new(o, "resting", a);
        }
        return o;
}

static json_t *waiter_status(Session *s, usec_t now) {
        AcquireCall *a = &s->acquire;
        size_t pos, queued;
        if (engine_request_position(a->request, &pos, &queued) < 0)
                return NULL;
        json_t *o = json_pack("{s:I, s:s, s:s, s:I, s:I, s:I, s:I}", "position", (json_int_t) pos + 1, "pool",
                              engine_request_pool(a->request), "lane", a->lane, "slots", (json_int_t) a->slots, "uid",
                              (json_int_t) s->cred.uid, "pid", (json_int_t) s->cred.pid, "waitedMs",
                              (json_int_t) (usec_sub_unsigned(now, engine_request_arrival(a->request)) / USEC_PER_MSEC));
        if (!o)
                return NULL;
        if (a->job)
                json_object_set_new(o, "job", json_string(a->job));
        json_t *terms;
        if (a->labels && json_strv_new(a->labels, &terms) >= 0)
                json_object_set_new(o, "labels", terms);
        /* The lane's labels= narrow the request in its chosen pool too: half of why it may wait while a
         * member is free. The configuration's: a reload that changes them refuses the lane's waiters. */
        const LaneConfig *lc = conf_find_lane(s->table->config, a->lane);
        if (lc && lc->labels && json_strv_new(lc->labels, &terms) >= 0)
                json_object_set_new(o, "laneLabels", terms);
        if (a->member)
                json_object_set_new(o, "member", json_string(a->member));
        size_t n_also = engine_request_also_count(a->request);
        if (n_also > 0) {
                json_t *l = json_array(), *k = json_array();
                for (size_t i = 0; l && k && i < n_also; i++) {
                        json_array_append_new(l, json_string(engine_request_also_pool(a->request, i)));
                        json_array_append_new(k, json_integer(engine_request_also_slots(a->request, i)));
                }
                if (l && k) {
                        json_object_set_new(o, "also", l);
                        json_object_set_new(o, "alsoSlots", k);
                } else {
                        json_decref(l);
                        json_decref(k);
                }
        }
        usec_t budget = engine_request_budget(a->request);
        if (budget != USEC_INFINITY)
                json_object_set_new(o, "budgetMs", json_integer((json_int_t) (budget / USEC_PER_MSEC)));
        const char *state = queue_state_to_string(engine_request_state(a->request));
        if (state)
                json_object_set_new(o, "budgetState", json_string(state));
        return o;
}

static int waiter_compare(const void *a, const void *b) {
        json_t *x = *(json_t *const *) a, *y = *(json_t *const *) b;
        int r = strcmp(json_string_value(json_object_get(x, "pool")), json_string_value(json_object_get(y, "pool")));
        if (r != 0)
                return r;
        json_int_t px = json_integer_value(json_object_get(x, "position")),
                   py = json_integer_value(json_object_get(y, "position"));
        return px < py ? -1 : px > py;
}

/* The holders and waiters of other nodes in shared pools, from each pool's last snapshot (Status never
 * waits for Redis; asking keeps the snapshots coming). Another node's clients are not ours to show: their
 * node, lane, slots and times only. This node's own are in holders and waiters already. */
static void status_add_other_nodes(Methods *m, json_t *status, usec_t now) {
        _cleanup_(json_decrefp) json_t *holders = NULL, *waiters = NULL;
        for (size_t i = 0; i < engine_pool_count(m->engine); i++) {
                EnginePoolInfo info;
                PoolSnapshot snap;
                if (engine_pool_info(m->engine, i, now, &info) < 0 || engine_pool_snapshot(m->engine, i, &snap) < 0)
                        continue;
                if (!holders && !(holders = json_array()))
                        return;
                if (!waiters && !(waiters = json_array()))
                        return;
                for (size_t k = 0; k < snap.n_holders; k++) {
                        const PoolSnapshotEntry *e = &snap.holders[k];
                        if (e->own)
                                continue;
                        json_t *slots = json_array();
                        for (unsigned j = 0; slots && j < e->n_slots; j++)
                                json_array_append_new(slots, json_integer(e->slots[j]));
                        json_t *h = json_pack("{s:s, s:s, s:s, s:o, s:I, s:I}", "node", e->node ?: "", "pool", info.name,
                                              "lane", e->lane ?: "", "slots", slots ?: json_array(), "token",
                                              (json_int_t) e->token, "heldMs",
                                              (json_int_t) (usec_sub_unsigned(now, e->since) / USEC_PER_MSEC));
                        if (h && e->members) {
                                json_t *names = json_array();
                                for (unsigned j = 0; names && j < e->n_slots; j++)
                                        json_array_append_new(names, json_string(e->members[j] ?: ""));
                                if (names)
                                        json_object_set_new(h, "members", names);
                        }
                        if (h)
                                json_array_append_new(holders, h);
                }
                for (size_t k = 0; k < snap.n_waiters; k++) {
                        const PoolSnapshotEntry *e = &snap.waiters[k];
                        if (e->own)
                                continue;
                        json_t *w = json_pack("{s:s, s:s, s:s, s:I, s:I, s:I}", "node", e->node ?: "", "pool", info.name,
                                              "lane", e->lane ?: "", "slots", (json_int_t) e->n_slots, "position",
                                              (json_int_t) e->position + 1, "waitedMs",
                                              (json_int_t) (usec_sub_unsigned(now, e->since) / USEC_PER_MSEC));
                        if (w)
                                json_array_append_new(waiters, w);
                }
        }
        if (holders)
                json_object_set(status, "otherHolders", holders);
        if (waiters)
                json_object_set(status, "otherWaiters", waiters);
}

/* The Status reply's parameters, or NULL when out of memory. */
static json_t *status_build(Methods *m) {
        usec_t now = now_monotonic();

        _cleanup_(json_decrefp) json_t *pools = json_array(), *holders = json_array(), *waiters = json_array();
        if (!pools || !holders || !waiters)
                return NULL;
        for (size_t i = 0; i < engine_pool_count(m->engine); i++)
                if (json_array_append_new(pools, pool_status(m, i, now)) < 0)
                        return NULL;
        list_foreach(n, &m->leases->leases) {
                Lease *l = container_of(n, Lease, node);
                json_t *h = json_pack("{s:o, s:s, s:I}", "lease", lease_to_json(l), "state", lease_state_to_string(l->state),
                                      "heldMs", (json_int_t) (usec_sub_unsigned(now, l->granted_mono) / USEC_PER_MSEC));
                if (json_array_append_new(holders, h) < 0)
                        return NULL;
        }

        /* Waiters by pool, then place: collect, then sort. O(n log n) per Status call, never per grant. */
        size_t n_waiters = 0;
        list_foreach(n, &m->sessions->sessions)
                n_waiters += session_is_waiting(container_of(n, Session, node));
        _cleanup_free_ json_t **w = calloc(n_waiters ?: 1, sizeof(json_t *));
        if (!w)
                return NULL;
        size_t k = 0;
        list_foreach(n, &m->sessions->sessions) {
                Session *x = container_of(n, Session, node);
                if (session_is_waiting(x) && k < n_waiters && (w[k] = waiter_status(x, now)))
                        k++;
        }
        qsort(w, k, sizeof(json_t *), waiter_compare);
        for (size_t i = 0; i < k; i++)
                if (json_array_append_new(waiters, w[i]) < 0)
                        return NULL; /* the rest of w leaks only if jansson itself ran out */

        json_t *status = json_pack("{s:O, s:O, s:O}", "pools", pools, "holders", holders, "waiters", waiters);
        if (status)
                status_add_other_nodes(m, status, now);
        const char *unavailable = persistence_refusal(m->persistence);
        if (status && unavailable)
                json_object_set_new(status, "unavailable", json_string(unavailable));
        return status;
}

/* The engine's queued events handed on (see Methods.settle): true when the engine and the leases agree now. */
static bool status_settle(Methods *m) {
        return !m->settle || m->settle(m->userdata);
}

/* Whether a shared pool's snapshot asked for at or after `since` is still on its way (each such pool is
 * asked to fetch one). */
static bool status_wants_fresh(Methods *m, usec_t since, usec_t now) {
        bool wait = false;
        for (size_t i = 0; i < engine_pool_count(m->engine); i++)
                wait = engine_pool_refresh_snapshot(m->engine, i, since, now) > 0 || wait;
        return wait;
}

static int on_status_timer(sd_event_source *source, uint64_t usec, void *userdata) {
        return 0; /* the drain after this dispatch answers the calls whose wait is over (methods_views_flush()) */
}

/* The timer at the first waiting reply's deadline (they wait in arrival order), off when none waits. */
static void status_timer_arm(Methods *m) {
        ListNode *first = list_first(&m->sessions->status_waiting);
        if (!first) {
                if (m->status_timer)
                        (void) sd_event_source_set_enabled(m->status_timer, SD_EVENT_OFF);
                return;
        }
        usec_t at = usec_add(container_of(first, Session, view_node)->view_since, METHODS_STATUS_FRESH_WAIT);
        if (!m->status_timer) {
                if (sd_event_add_time(m->event, &m->status_timer, CLOCK_MONOTONIC, at, 10 * USEC_PER_MSEC,
                                      on_status_timer, m) < 0) {
                        m->status_timer = NULL;
                        return; /* the next dispatch's flush answers it, or its own snapshot's arrival */
                }
        } else
                (void) sd_event_source_set_time(m->status_timer, at);
        (void) sd_event_source_set_enabled(m->status_timer, SD_EVENT_ONESHOT);
}

/* ---- Status and Metrics: the whole state, rendered once for every call that waits for it ---- */

/* The whole reply message for parameters p (taken), or NULL when out of memory. */
static SessionText *view_text(json_t *p) {
        if (!p)
                return NULL;
        /* "o" takes p, also when the packing fails (jansson ≥ 2.8). */
        _cleanup_(json_decrefp) json_t *msg = json_pack("{s:o}", "parameters", p);
        char *data;
        size_t size;
        if (!msg || json_format(msg, &data, &size) < 0)
                return NULL;
        return session_text_new(data, size + 1); /* with the NUL that ends it */
}

/* Rendered right after status_settle(), with nothing between: a grant the engine made is a lease by then, in
 * holders as in inUse, and a waiter it granted or refused has left both the queue and the waiters. The same
 * for every caller: Status shows nothing that depends on who asks. */
static SessionText *status_render(Methods *m) {
        return view_text(status_build(m));
}

static SessionText *metrics_render_text(Methods *m) {
        _cleanup_free_ char *text = NULL;
        MetricsGauges g;
        m->gauges(&g, m->userdata);
        if (metrics_render(m->metrics, &g, &text) < 0)
                return NULL;
        return view_text(json_pack("{s:s}", "text", text));
}

/* Status waits for the shared pools' snapshots of other nodes asked for after the call came, at most
 * METHODS_STATUS_FRESH_WAIT. */
static bool status_due(Methods *m, const Session *s, usec_t now) {
        return now >= usec_add(s->view_since, METHODS_STATUS_FRESH_WAIT) || !status_wants_fresh(m, s->view_since, now);
}

typedef struct View {
        List *waiting;                  /* Session.view_node */
        ViewPace *pace;
        SessionText *(*render)(Methods *m);
        bool (*due)(Methods *m, const Session *s, usec_t now); /* NULL: every call waiting is */
} View;

static Session *view_first_due(Methods *m, const View *v, usec_t now) {
        list_foreach(n, v->waiting) {
                Session *s = container_of(n, Session, view_node);
                if (!v->due || v->due(m, s, now))
                        return s;
        }
        return NULL;
}

/* This loop iteration, counted from 1. */
static uint64_t views_iteration(Methods *m) {
        uint64_t it;
        return sd_event_get_iteration(m->event, &it) >= 0 ? it + 1 : 0;
}

static int on_views_wake(sd_event_source *source, void *userdata) {
        return 0; /* the drain after this dispatch answers them (methods_views_flush()) */
}

/* A dispatch in a later loop iteration, even if nothing else comes; at idle priority: the sources pending
 * (a batch of connections, the timers) go first. Returns false when it cannot be had. */
static bool views_wake(Methods *m) {
        if (!m->views_wake) {
                if (sd_event_add_defer(m->event, &m->views_wake, on_views_wake, m) < 0) {
                        m->views_wake = NULL;
                        return false;
                }
                (void) sd_event_source_set_priority(m->views_wake, SD_EVENT_PRIORITY_IDLE);
        }
        return sd_event_source_set_enabled(m->views_wake, SD_EVENT_ONESHOT) >= 0;
}

static int on_views_timer(sd_event_source *source, uint64_t usec, void *userdata) {
        return 0; /* the drain after this dispatch answers them (methods_views_flush()) */
}

/* A dispatch at `at` (monotonic), or at the earlier time it is armed for already (the other kind's rest). */
static bool views_timer_arm(Methods *m, usec_t at) {
        if (!m->views_timer) {
                if (sd_event_add_time(m->event, &m->views_timer, CLOCK_MONOTONIC, at, 1, on_views_timer, m) < 0) {
                        m->views_timer = NULL;
                        return false;
                }
                return true;
        }
        int enabled;
        uint64_t armed;
        if (sd_event_source_get_enabled(m->views_timer, &enabled) >= 0 && enabled != SD_EVENT_OFF &&
            sd_event_source_get_time(m->views_timer, &armed) >= 0 && armed <= at)
                return true;
        return sd_event_source_set_time(m->views_timer, at) >= 0 &&
               sd_event_source_set_enabled(m->views_timer, SD_EVENT_ONESHOT) >= 0;
}

static bool view_reply(Session *s, SessionText *t);

/* One rendering answers every call of the kind that is due: each came before it, so each sees the state of an
 * instant between its call and its reply, never older; and N clients asking at once cost one rendering, not N,
 * on the loop that everybody's Acquire waits for. A Status or Metrics pipelined behind an answered call was in
 * our input before the rendering too: it takes the same text (view_wait()), at no cost but its bytes, up to
 * the output cap. Once per loop iteration at most: a call that comes in a later round of the owner's drain
 * waits for the next iteration's rendering, after the other connections' turn. */
static bool view_flush(Methods *m, const View *v, usec_t now) {
        if (!view_first_due(m, v, now))
                return false;
        uint64_t it = views_iteration(m);
        if (it > 0 && v->pace->rendered == it && views_wake(m))
                return false;
        if (!m->stopping && now < v->pace->next && views_timer_arm(m, v->pace->next))
                return false;
        if (!status_settle(m))
                return false; /* the owner's next drain answers them */
        /* Those that the settle's events closed left the list; those it resumed joined it. */
        List due;
        list_init(&due);
        list_foreach_safe(n, v->waiting)
                if (!v->due || v->due(m, container_of(n, Session, view_node), now)) {
                        list_unlink(n);
                        list_append(&due, n);
                }
        if (list_is_empty(&due))
                return false;
        usec_t start = now_monotonic();
        _cleanup_(session_text_unrefp) SessionText *t = v->render(m);
        v->pace->rendered = it;
        m->answering = v->waiting;
        m->answering_text = t;
        /* One at a time: the calls resumed behind a reply may close other sessions (which unlinks them). */
        for (ListNode *n; (n = list_first(&due));) {
                Session *s = container_of(n, Session, view_node);
                list_unlink(n);
                if (!t) {
                        log_oom();
                        session_close(s);
                } else if (view_reply(s, t))
                        connection_set_held(s->connection, false); /* sends it; the calls behind it run */
        }
        m->answering = NULL;
        m->answering_text = NULL;
        /* Its cost: the rendering, and the replies queued and sent (with the calls resumed behind them, which
         * the bound keeps from resting the views long: a Reload pipelined behind a Status). */
        usec_t end = now_monotonic();
        v->pace->next = usec_add(end, MIN(METHODS_VIEW_REST_FACTOR * usec_sub_unsigned(end, start),
                                          METHODS_VIEW_REST_MAX));
        return true;
}

bool methods_views_flush(Methods *m, usec_t now) {
        bool answered = view_flush(m,
                                   &(View) { &m->sessions->status_waiting, &m->status_pace, status_render, status_due },
                                   now);
        answered = view_flush(m, &(View) { &m->sessions->metrics_waiting, &m->metrics_pace, metrics_render_text }, now) ||
                   answered;
        status_timer_arm(m);
        return answered;
}

void methods_done(Methods *m) {
        m->status_timer = sd_event_source_disable_unref(m->status_timer);
        m->views_wake = sd_event_source_disable_unref(m->views_wake);
        m->views_timer = sd_event_source_disable_unref(m->views_timer);
}

/* The call waits for the drain at the end of this loop iteration, and the calls behind it with it; a call that
 * is due and runs while that drain sends a text of its kind (it was pipelined behind one) takes that text. */
static void view_wait(Session *s, List *waiting, usec_t now, bool due) {
        Methods *m = methods_of(s);
        if (due && m->answering == waiting) {
                (void) view_reply(s, m->answering_text); /* whole: the calls behind it run on; else they wait */
                return;
        }
        s->view_since = now;
        list_append(waiting, &s->view_node);
        /* A reply still to come: a client that shut its sending side after the call is not done yet. */
        connection_set_held(s->connection, true);
}

static void view_text_release(void *userdata) {
        session_text_unref(userdata);
}

/* Below this a part is copied into the output queue: small replies share its chunks. */
#define VIEW_SHARED_MIN ((size_t) 4096)

/* Queues n bytes of t from offset: by reference where they are many (a text sent to N connections is neither
 * copied N times nor held N times while they read it), copied where they are few. */
static int view_queue(Session *s, SessionText *t, size_t offset, size_t n) {
        if (n < VIEW_SHARED_MIN)
                return connection_reply_part(s->connection, t->data + offset, n);
        int r = connection_reply_part_shared(s->connection, t->data + offset, n, view_text_release, session_text_ref(t));
        if (r < 0)
                session_text_unref(t);
        return r;
}

static void on_view_output_below(Connection *c);

/* Queues the rest of a Status or Metrics reply, half the output cap at a time while the unsent output is below
 * half the cap; once all of it is queued, the calls behind it run. */
static void view_reply_continue(Session *s) {
        SessionText *t = s->reply_text;
        size_t half = connection_get_output_max(s->connection) / 2;
        for (;;) {
                while (s->reply_sent < t->size && connection_get_pending_output(s->connection) < half) {
                        size_t n = MIN(half, t->size - s->reply_sent);
                        /* Below half the cap, plus at most half: never past it. */
                        if (view_queue(s, t, s->reply_sent, n) < 0) {
                                if (!s->closed) {
                                        log_oom();
                                        session_close(s);
                                }
                                return;
                        }
                        s->reply_sent += n;
                }
                if (s->reply_sent == t->size) {
                        s->reply_text = session_text_unref(s->reply_text);
                        connection_set_held(s->connection, false); /* sends it; the calls behind it run */
                        return;
                }
                connection_resume(s->connection); /* sends what the socket takes now */
                if (s->closed)
                        return;
                if (connection_get_pending_output(s->connection) >= half) {
                        connection_when_output_below(s->connection, half, on_view_output_below);
                        return;
                }
        }
}

static void on_view_output_below(Connection *c) {
        view_reply_continue(connection_get_userdata(c));
}

/* Queues t as s's reply. Whole where it fits now, below half the output cap: returns true, and the caller runs
 * the calls behind it. Else false: the text grows with the configuration (a member pool's Metrics families have
 * a line per member, its Status a name per member), and past max-output-per-connection= it goes as the client
 * reads it, as a History page does, not as the reply of a client that does not read; the connection holds the
 * text meanwhile, and the calls behind it wait. */
static bool view_reply(Session *s, SessionText *t) {
        size_t half = connection_get_output_max(s->connection) / 2;
        if (t->size <= half && connection_get_pending_output(s->connection) < half) {
                if (view_queue(s, t, 0, t->size) >= 0)
                        return true;
                if (!s->closed) {
                        log_oom();
                        session_close(s);
                }
                return false;
        }
        s->reply_text = session_text_ref(t);
        s->reply_sent = 0;
        connection_set_held(s->connection, true);
        view_reply_continue(s);
        return false;
}

/* Status of a shared pool shows the other nodes from a snapshot asked for after the call came: the reply
 * waits for it (at most METHODS_STATUS_FRESH_WAIT), and the calls behind it wait too. */
static void method_status(Session *s, const VarlinkCall *call) {
        if (!parameters_ok(s, call, (const JsonField[]) { {} }))
                return;
        if (connection_get_oneway(s->connection))
                return; /* nobody wants the answer, and reading changes nothing */
        Methods *m = methods_of(s);
        usec_t now = now_monotonic();
        view_wait(s, &m->sessions->status_waiting, now, !status_wants_fresh(m, now, now));
        status_timer_arm(m);
}

static void method_reload(Session *s, const VarlinkCall *call) {
        if (!parameters_ok(s, call, (const JsonField[]) { {} }) || !require_admin(s))
                return;
        ConfErrors errors = {};
        int r = methods_of(s)->reload(&errors, methods_of(s)->userdata);
        if (r >= 0) {
                session_reply(s, NULL, false);
                return;
        }
        _cleanup_(json_decrefp) json_t *list = json_array();
        for (size_t i = 0; list && i < errors.n_errors; i++) {
                _cleanup_free_ char *text = conf_error_to_string(&errors.errors[i]);
                if (text)
                        json_array_append_new(list, json_string(text));
        }
        if (list && errors.n_errors == 0)
                json_array_append_new(list, json_string(strerror(-r)));
        conf_errors_done(&errors);
        _cleanup_(json_decrefp) json_t *p = json_pack("{s:O}", "errors", list);
        session_reply_error(s, "io.slotbroker.ReloadFailed", p);
}

/* How far ahead a drain's until may be: as long as a reservation may last (RESERVE_FOR_MS_MAX). */
#define DRAIN_UNTIL_AHEAD_MAX ((usec_t) 3650 * 24 * 3600 * USEC_PER_SEC)

static bool names_are_valid(Session *s, const char *pool, const char *member);
static bool require_pool_admin(Session *s, const char *action, const char *pool, const char *member);

static void method_drain(Session *s, const VarlinkCall *call) {
        const char *pool = NULL, *member = NULL, *reason = NULL;
        bool on = true;
        int64_t until = -1;
        if (!parameters_ok(s, call,
                           (const JsonField[]) {
                                   { "pool", JSON_FIELD_STRING, JSON_MANDATORY, &pool, .max_length = 64 },
                                   { "member", JSON_FIELD_STRING, 0, &member, .max_length = 64 },
                                   { "on", JSON_FIELD_BOOL, JSON_MANDATORY, &on },
                                   { "reason", JSON_FIELD_STRING, 0, &reason, .max_length = CONF_REASON_MAX },
                                   { "until", JSON_FIELD_INT64, 0, &until, 0, INT64_MAX },
                                   {},
                           }))
                return;
        if (!names_are_valid(s, pool, member))
                return;
        if ((reason || until >= 0) && !on) {
                reply_invalid_parameter(s, reason ? "reason" : "until");
                return;
        }
        if (reason && !conf_reason_is_valid(reason)) {
                reply_invalid_parameter(s, "reason");
                return;
        }
        /* SPEC §3.6: --until is a realtime instant, the engine's deadline a monotonic one. */
        usec_t now = now_monotonic(), now_real = now_realtime(), until_mono = USEC_INFINITY;
        if (until >= 0) {
                /* In the past it would undrain at once; too far ahead it would not fit members.state (a
                 * realtime µs below INT64_MAX), whose next read would refuse the whole file. */
                if ((usec_t) until <= now_real || (usec_t) until - now_real > DRAIN_UNTIL_AHEAD_MAX) {
                        reply_invalid_parameter(s, "until");
                        return;
                }
                until_mono = usec_add(now, (usec_t) until - now_real);
        }
        if (!require_pool_admin(s, on ? "drain" : "undrain", pool, member))
                return;
        /* A shared pool keeps who, why and until in Redis (every node shows them; the pool undrains itself at
         * until): engine_drain_with() hands them to it. */
        char who[32];
        snprintf(who, sizeof who, "uid %u", (unsigned) s->cred.uid);
        int r = engine_drain_with(methods_of(s)->engine, pool, member,
                                  on ? &(EngineDrain) { .since = now, .until = until_mono,
                                                        .until_realtime = until >= 0 ? (usec_t) until : 0,
                                                        .who = who, .reason = reason }
                                     : NULL,
                                  now);
        if (r == -ENOENT) {
                _cleanup_(json_decrefp) json_t *p = json_pack("{s:s, s:s?}", "pool", pool, "member", member);
                session_reply_error(s, "io.slotbroker.NoSuchPool", p);
                return;
        }
        if (r < 0) {
                log_oom();
                session_close(s);
                return;
        }
        /* A shared pool's [DRAINED]/[UNDRAINED] come with Redis's answer (the pool's DRAIN decision). */
        methods_of(s)->status_changed(methods_of(s)->userdata);
        session_reply(s, NULL, false);
}

/* A pool's and a member's name as the configuration allows them; otherwise InvalidParameter. Checked before
 * require_pool_admin(), which journals what it denies: a "name" of anybody's making (a newline, a line of log
 * of their own) never gets that far. */
static bool names_are_valid(Session *s, const char *pool, const char *member) {
        if (!conf_name_is_valid(pool)) {
                reply_invalid_parameter(s, "pool");
                return false;
        }
        if (member && !conf_name_is_valid(member)) {
                reply_invalid_parameter(s, "member");
                return false;
        }
        return true;
}

/* Root, brokerd's user, or the pool's admin-users=/admin-groups=; otherwise PermissionDenied, audited. */
static bool require_pool_admin(Session *s, const char *action, const char *pool, const char *member) {
        Methods *m = methods_of(s);
        const gid_t *groups;
        size_t n_groups = connection_get_groups(s->connection, &groups);
        if (m->pool_admin && m->pool_admin(pool, s->cred.uid, groups, n_groups, m->userdata))
                return true;
        audit_admin_denied(s->table->audit, action, pool, member, s->cred.uid, s->cred.pid);
        _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "pool", pool);
        session_reply_error(s, "io.slotbroker.PermissionDenied", p);
        return false;
}

/* Quarantine(pool, member, reason) and Restore(pool, member) (SPEC §3.6). */
static void member_quarantine(Session *s, const VarlinkCall *call, bool on) {
        const char *pool = NULL, *member = NULL, *reason = NULL;
        if (!parameters_ok(s, call,
                           (const JsonField[]) {
                                   { "pool", JSON_FIELD_STRING, JSON_MANDATORY, &pool, .max_length = 64 },
                                   { "member", JSON_FIELD_STRING, JSON_MANDATORY, &member, .max_length = 64 },
                                   { "reason", JSON_FIELD_STRING, on ? JSON_MANDATORY : 0, &reason,
                                     .max_length = CONF_REASON_MAX },
                                   {},
                           }))
                return;
        if (!names_are_valid(s, pool, member))
                return;
        if (on && !conf_reason_is_valid(reason)) {
                reply_invalid_parameter(s, "reason");
                return;
        }
        if (!require_pool_admin(s, on ? "quarantine" : "restore", pool, member))
                return;
        char who[32];
        snprintf(who, sizeof who, "uid %u", (unsigned) s->cred.uid);
        usec_t now = now_monotonic();
        int r = engine_member_quarantine(methods_of(s)->engine, pool, member,
                                         on ? &(EngineQuarantine) { .since = now, .job = who, .exit_status = -1,
                                                                    .reason = reason }
                                            : &(EngineQuarantine) { .restore = true, .job = who },
                                         now);
        if (r == -ENOENT) {
                _cleanup_(json_decrefp) json_t *p = json_pack("{s:s, s:s}", "pool", pool, "member", member);
                session_reply_error(s, "io.slotbroker.NoSuchPool", p);
                return;
        }
        if (r == -EOPNOTSUPP) {
                /* Quarantine is for member pools: not a pool of anonymous slots. */
                reply_invalid_parameter(s, "pool");
                return;
        }
        if (r < 0) {
                log_oom();
                session_close(s);
                return;
        }
        methods_of(s)->status_changed(methods_of(s)->userdata);
        session_reply(s, NULL, false);
}

static void method_quarantine(Session *s, const VarlinkCall *call) {
        member_quarantine(s, call, true);
}

static void method_restore(Session *s, const VarlinkCall *call) {
        member_quarantine(s, call, false);
}

/* Reserve(pool, member?, labels?, forMs, reason) (SPEC §3.6): a detached lease ahead of every waiting job. */
#define RESERVE_FOR_MS_MAX ((int64_t) 3650 * 24 * 3600 * 1000) /* as Acquire's maxHoldMs */

static void method_reserve(Session *s, const VarlinkCall *call) {
        const char *pool = NULL, *member = NULL, *reason = NULL;
        _cleanup_(json_strv_freep) char **labels = NULL;
        int64_t for_ms = 0;
        if (!parameters_ok(s, call,
                           (const JsonField[]) {
                                   { "pool", JSON_FIELD_STRING, JSON_MANDATORY, &pool, .max_length = 64 },
                                   { "member", JSON_FIELD_STRING, 0, &member, .max_length = 64 },
                                   { "labels", JSON_FIELD_STRV, 0, &labels, .max_length = 32 },
                                   { "forMs", JSON_FIELD_INT64, JSON_MANDATORY, &for_ms, 1, RESERVE_FOR_MS_MAX },
                                   { "reason", JSON_FIELD_STRING, JSON_MANDATORY, &reason, .max_length = CONF_REASON_MAX },
                                   {},
                           }))
                return;
        if (!names_are_valid(s, pool, member))
                return;
        if (member && labels && labels[0]) {
                reply_invalid_parameter(s, "labels"); /* one member, or labels: not both */
                return;
        }
        for (size_t i = 0; labels && labels[i]; i++)
                if (!selector_term_is_valid(labels[i])) {
                        reply_invalid_parameter(s, "labels");
                        return;
                }
        if (!conf_reason_is_valid(reason)) {
                reply_invalid_parameter(s, "reason");
                return;
        }
        if (!require_pool_admin(s, "reserve", pool, member))
                return;
        session_reserve(s, call,
                        &(SessionReserve) {
                                .pool = pool,
                                .member = member,
                                .labels = labels,
                                .hold = (usec_t) for_ms * USEC_PER_MSEC,
                                .reason = reason,
                        });
}

static void method_cancel(Session *s, const VarlinkCall *call) {
        Methods *m = methods_of(s);
        const char *pool = NULL, *lane = NULL, *job = NULL;
        int64_t uid = -1;
        if (!parameters_ok(s, call,
                           (const JsonField[]) {
                                   { "pool", JSON_FIELD_STRING, 0, &pool, .max_length = 64 },
                                   { "lane", JSON_FIELD_STRING, 0, &lane, .max_length = 64 },
                                   { "job", JSON_FIELD_STRING, 0, &job, .max_length = 1024 },
                                   { "uid", JSON_FIELD_INT64, 0, &uid, 0, UINT32_MAX - 1 },
                                   {},
                           }) ||
            !require_admin(s))
                return;

        /* Collect first: answering a waiter runs the calls it pipelined, which may close other connections. */
        size_t n_match = 0;
        list_foreach(node, &m->sessions->sessions)
                n_match += session_is_waiting(container_of(node, Session, node));
        _cleanup_free_ Session **match = calloc(n_match ?: 1, sizeof(Session *));
        if (!match) {
                log_oom();
                session_close(s);
                return;
        }
        size_t k = 0;
        list_foreach(node, &m->sessions->sessions) {
                Session *x = container_of(node, Session, node);
                AcquireCall *a = &x->acquire;
                if (!session_is_waiting(x) || k >= n_match)
                        continue;
                if ((pool && !streq(pool, engine_request_pool(a->request))) || (lane && !streq(lane, a->lane)) ||
                    (job && !streq_ptr(job, a->job)) || (uid >= 0 && (uid_t) uid != x->cred.uid))
                        continue;
                match[k++] = x;
        }

        unsigned n = 0;
        for (size_t i = 0; i < k; i++) {
                Session *x = match[i];
                if (x->closed)
                        continue; /* closed by a call another waiter pipelined */
                if (session_waiter_withdraw(x, SESSION_WITHDRAW_CANCELLED))
                        n++;
        }
        _cleanup_(json_decrefp) json_t *p = json_pack("{s:I}", "cancelled", (json_int_t) n);
        session_reply(s, p, false);
}

static void method_history(Session *s, const VarlinkCall *call) {
        history_call_start(methods_of(s)->history_calls, s, call);
}

static void method_metrics(Session *s, const VarlinkCall *call) {
        if (!parameters_ok(s, call, (const JsonField[]) { {} }))
                return;
        if (connection_get_oneway(s->connection))
                return; /* nobody wants the answer, and reading changes nothing */
        view_wait(s, &methods_of(s)->sessions->metrics_waiting, now_monotonic(), true);
}

static const struct {
        const char *name;
        void (*handler)(Session *s, const VarlinkCall *call);
} method_table[] = {
        { "org.varlink.service.GetInfo", method_get_info },
        { "org.varlink.service.GetInterfaceDescription", method_get_interface_description },
        { "io.slotbroker.Acquire", session_acquire },
        { "io.slotbroker.Release", method_release },
        { "io.slotbroker.Status", method_status },
        { "io.slotbroker.History", method_history },
        { "io.slotbroker.Metrics", method_metrics },
        { "io.slotbroker.Reload", method_reload },
        { "io.slotbroker.Drain", method_drain },
        { "io.slotbroker.Cancel", method_cancel },
        { "io.slotbroker.Quarantine", method_quarantine },
        { "io.slotbroker.Restore", method_restore },
        { "io.slotbroker.Reserve", method_reserve },
};

static void methods_dispatch(Session *s, const VarlinkCall *call) {
        /* A oneway call is run but not answered (Acquire refuses oneway calls itself: SPEC §5). */
        connection_set_oneway(s->connection,
                              (call->flags & VARLINK_CALL_ONEWAY) && !streq(call->method, "io.slotbroker.Acquire"));
        for (size_t i = 0; i < ELEMENTSOF(method_table); i++)
                if (streq(method_table[i].name, call->method)) {
                        method_table[i].handler(s, call);
                        connection_set_oneway(s->connection, false);
                        return;
                }
        if (varlink_method_in_interface(call->method, INTERFACE) ||
            varlink_method_in_interface(call->method, VARLINK_SERVICE_INTERFACE)) {
                _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "method", call->method);
                session_reply_error(s, VARLINK_ERROR_METHOD_NOT_FOUND, p);
                connection_set_oneway(s->connection, false);
                return;
        }
        size_t len = 0;
        (void) varlink_method_split(call->method, &len, NULL);
        _cleanup_(json_decrefp) json_t *p = json_pack("{s:s%}", "interface", call->method, len);
        session_reply_error(s, VARLINK_ERROR_INTERFACE_NOT_FOUND, p);
        connection_set_oneway(s->connection, false);
}

ConnectionCallResult methods_on_call(Connection *c, const VarlinkCall *call, void *userdata) {
        Session *s = userdata;
        if (session_defers_call(s, call))
                return CONNECTION_CALL_DEFER; /* answered, in order, once the open Acquire ends */
        methods_dispatch(s, call);
        return CONNECTION_CALL_DONE;
}

void methods_on_disconnect(Connection *c, void *userdata) {
        Session *s = userdata;
        history_call_abandon(s);
        session_on_disconnect(s);
}
