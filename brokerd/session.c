/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "session.h"
#include "audit.h"
#include "connection.h"
#include "lease.h"
#include "log.h"
#include "manager.h"
#include "persistence.h"
#include "process.h"

#define JOB_MAX 1024
/* maxHoldMs at most 3650 days: grant time plus the hold, in µs, then stays far inside expiresAt's int64
 * (INT64_MAX / 1000 let a hold overflow it into a negative expiresAt). Longer is no bound at all. */
#define MAX_HOLD_MS_MAX ((int64_t) 3650 * 24 * 3600 * 1000)

static void answer_grant(Connection *c, Lease *l);
static void session_waiter_left(Connection *c);

static int reply_invalid_parameter(Connection *c, const char *parameter) {
        _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "parameter", parameter);
        return connection_reply_error(c, VARLINK_ERROR_INVALID_PARAMETER, p);
}

/* SPEC §3.4: nothing is granted that could not be persisted, nor before what was persisted has been read.
 * Refused at once, rather than granted by the engine and withdrawn after a write that cannot succeed. */
static bool refuse_for_storage(Connection *c, const char *lane, const char *job) {
        const char *why = persistence_refusal(c->manager);
        if (!why)
                return false;
        /* The pool it would have waited on, as for any refusal: metrics count refusals per pool. */
        const LaneConfig *lc = conf_find_lane(c->manager->config, lane);
        const char *pool = lc && lc->pools && lc->pools[0] ? lc->pools[lc->n_pools - 1] : NULL;
        AuditRecord r = AUDIT_RECORD_INIT;
        r.decision = "unavailable";
        r.pool = pool;
        r.lane = lane;
        r.job = job;
        r.uid = c->cred.uid;
        r.pid = c->cred.pid;
        r.retry_after_sec = 5;
        r.reason = why;
        audit_decision(&c->manager->audit, &r);
        persistence_note_refused(c->manager, why);
        _cleanup_(json_decrefp) json_t *p =
                json_pack("{s:i, s:s?, s:s}", "retryAfterSec", 5, "pool", pool, "reason", "storage");
        connection_reply_error(c, "io.slotbroker.Unavailable", p);
        return true;
}

static void audit_denied(Connection *c, const char *lane, const char *job) {
        AuditRecord r = AUDIT_RECORD_INIT;
        r.decision = "denied";
        r.lane = lane;
        r.job = job;
        r.uid = c->cred.uid;
        r.pid = c->cred.pid;
        audit_decision(&c->manager->audit, &r);
}

void session_acquire(Connection *c, const VarlinkCall *call) {
        Manager *m = c->manager;
        AcquireCall *a = &c->acquire;
        const char *lane = NULL, *job = NULL, *reclaim = NULL;
        unsigned slots = 1;
        bool wait = true, detach = false;
        int64_t queue_wait_ms = 0, pid = 0, pidfd_index = -1, max_hold_ms = 0;
        const char *bad = NULL;

        if (call->flags & VARLINK_CALL_ONEWAY) {
                /* Nobody would hear the grant: SPEC §5 makes this an error, not a silent lease. */
                reply_invalid_parameter(c, "oneway");
                return;
        }
        const JsonField table[] = {
                { "lane", JSON_FIELD_STRING, JSON_MANDATORY, &lane, .max_length = 64 },
                { "slots", JSON_FIELD_UNSIGNED, 0, &slots, 1, 1 << 20 },
                { "wait", JSON_FIELD_BOOL, 0, &wait },
                { "queueWaitMs", JSON_FIELD_INT64, 0, &queue_wait_ms, 1, INT32_MAX },
                { "job", JSON_FIELD_STRING, 0, &job, .max_length = JOB_MAX },
                { "pid", JSON_FIELD_INT64, 0, &pid, 1, INT32_MAX },
                { "pidfd", JSON_FIELD_INT64, 0, &pidfd_index, 0, VARLINK_FDS_MAX - 1 },
                { "reclaim", JSON_FIELD_STRING, 0, &reclaim, .max_length = 64 },
                { "detach", JSON_FIELD_BOOL, 0, &detach },
                { "maxHoldMs", JSON_FIELD_INT64, 0, &max_hold_ms, 1, MAX_HOLD_MS_MAX },
                {},
        };
        int r = json_dispatch(call->parameters, table, 0, &bad);
        if (r < 0) {
                reply_invalid_parameter(c, bad ?: "parameters");
                return;
        }
        if (pid > 0 && pidfd_index >= 0) {
                reply_invalid_parameter(c, "pidfd"); /* one command, named once */
                return;
        }
        if (detach && max_hold_ms == 0) {
                reply_invalid_parameter(c, "maxHoldMs"); /* a detached lease needs an end of its own */
                return;
        }
        if (!conf_find_lane(m->config, lane)) {
                _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "lane", lane);
                connection_reply_error(c, "io.slotbroker.NoSuchLane", p);
                return;
        }
        if (!manager_lane_allows(m, lane, c->cred.uid, c->groups, c->n_groups)) {
                audit_denied(c, lane, job);
                _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "lane", lane);
                connection_reply_error(c, "io.slotbroker.PermissionDenied", p);
                return;
        }
        if (reclaim) {
                /* After a restart: the owner takes back a lease it held; no new request is made. */
                Lease *l = manager_find_lease(m, reclaim);
                if (!l || (l->uid != c->cred.uid && c->cred.uid != 0) || !streq(engine_lease_lane(l->engine_lease), lane) ||
                    lease_reclaim(l, c) < 0) {
                        _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "lease", reclaim);
                        connection_reply_error(c, "io.slotbroker.NoSuchLease", p);
                        return;
                }
                log_info("Lease %s reclaimed by pid %d.", l->id, (int) c->cred.pid);
                a->active = true;
                a->more = call->flags & VARLINK_CALL_MORE;
                a->detach = false;
                answer_grant(c, l);
                return;
        }

        if (refuse_for_storage(c, lane, job))
                return;

        _cleanup_close_ int pidfd = -EBADF;
        ProcessInfo command = {};
        if (pid > 0 || pidfd_index >= 0) {
                /* A pidfd names the process whatever PID namespace the client numbers it in; its pid in ours
                 * is what the checks, the watch and a restart's restore use. Both ways the peer's pid and
                 * uid (SO_PEERCRED) are in our namespaces already. */
                if (pid > 0)
                        r = pidfd = process_open((pid_t) pid, &command);
                else {
                        pidfd = varlink_fds_take(call->fds, (size_t) pidfd_index);
                        r = pidfd < 0 ? pidfd : process_open_pidfd(pidfd, &command);
                }
                if (r < 0 || process_check_attachable(&command, c->cred.pid, c->cred.uid) < 0) {
                        log_debug("Acquire of pid %d: the command it names cannot hold a lease: %s", (int) c->cred.pid,
                                  r < 0 ? strerror(-r) : "neither the peer nor its child of the same uid");
                        reply_invalid_parameter(c, pid > 0 ? "pid" : "pidfd");
                        return;
                }
        }

        /* At its waiter limit a uid may still take a free slot, but not wait for one. */
        UidUsage *u = manager_uid_usage(m, c->cred.uid, true);
        bool no_wait = !wait || (u && u->waiters >= m->config->max_waiters_per_uid);

        a->lane = strdup(lane);
        a->job = job ? strdup(job) : NULL;
        if (!a->lane || (job && !a->job)) {
                log_oom();
                connection_close(c);
                return;
        }
        a->active = true;
        a->more = call->flags & VARLINK_CALL_MORE;
        a->detach = detach;
        a->slots = slots;
        a->max_hold = max_hold_ms > 0 ? (usec_t) max_hold_ms * USEC_PER_MSEC : USEC_INFINITY;
        a->last_position = a->last_queued = 0;
        a->counted_waiter = false;
        a->has_command = pidfd >= 0;
        a->command = command;
        a->command_pidfd = TAKE_FD(pidfd);

        r = engine_acquire(m->engine,
                           &(EngineAcquire) {
                                   .lane = lane,
                                   .slots = slots,
                                   .no_wait = no_wait,
                                   .max_wait = queue_wait_ms > 0 ? (usec_t) queue_wait_ms * USEC_PER_MSEC
                                                                 : USEC_INFINITY,
                                   .max_hold = a->max_hold,
                                   .userdata = c,
                           },
                           now_monotonic(), &a->request);
        if (r == -ENOENT || r == -EINVAL) {
                a->active = false;
                if (r == -ENOENT) {
                        _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "lane", lane);
                        connection_reply_error(c, "io.slotbroker.NoSuchLane", p);
                } else
                        reply_invalid_parameter(c, "slots"); /* more slots than any pool of the lane has */
                connection_acquire_done(c);
                return;
        }
        if (r < 0) {
                log_error_errno(r, "Failed to queue a request: %m");
                connection_close(c);
        }
        /* The outcome arrives as engine events at manager_sync(). */
}

static json_t *queued_reply(Connection *c, size_t position, size_t queued) {
        EngineRequest *req = c->acquire.request;
        usec_t budget = engine_request_budget(req);
        json_t *p = json_pack("{s:s, s:s, s:I, s:I}", "state", "queued", "pool", engine_request_pool(req),
                              "position", (json_int_t) position, "queued", (json_int_t) queued);
        if (p && budget != USEC_INFINITY)
                json_object_set_new(p, "budgetMs", json_integer((json_int_t) (budget / USEC_PER_MSEC)));
        return p;
}

static void send_position(Connection *c, usec_t now) {
        AcquireCall *a = &c->acquire;
        size_t pos, queued;
        if (engine_request_position(a->request, &pos, &queued) < 0)
                return;
        pos++; /* clients count from 1 */
        if (pos == a->last_position && queued == a->last_queued)
                return;
        _cleanup_(json_decrefp) json_t *p = queued_reply(c, pos, queued);
        if (!p || connection_reply(c, p, true) < 0)
                return;
        a->last_position = pos;
        a->last_queued = queued;
}

/* Position updates go round a queue kept in the order waiters were last looked at: the head is always the
 * one whose second is up first. Each run takes at most POSITION_BATCH of them, so ten thousand waiters
 * cost ten thousand small replies a second, spread out,, and never a stall of the loop. */
#define POSITION_BATCH 32

static void position_queue_leave(Connection *c) {
        if (list_node_is_linked(&c->acquire.position_node))
                list_unlink(&c->acquire.position_node);
}

static void position_queue_arm(Manager *m, usec_t now, bool more_due) {
        ListNode *head = list_first(&m->position_queue);
        if (!head) {
                (void) sd_event_source_set_enabled(m->position_timer, SD_EVENT_OFF);
                return;
        }
        AcquireCall *a = container_of(head, AcquireCall, position_node);
        usec_t t = more_due ? now : usec_add(a->last_position_check, USEC_PER_SEC);
        (void) sd_event_source_set_time(m->position_timer, t);
        (void) sd_event_source_set_enabled(m->position_timer, SD_EVENT_ONESHOT);
}

static void position_queue_join(Connection *c, usec_t now) {
        Manager *m = c->manager;
        bool was_empty = list_is_empty(&m->position_queue);
        c->acquire.last_position_check = now;
        list_append(&m->position_queue, &c->acquire.position_node);
        if (was_empty)
                position_queue_arm(m, now, false);
}

int session_on_position_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        Manager *m = userdata;
        usec_t now = now_monotonic();
        unsigned n = 0;
        ListNode *head;

        while ((head = list_first(&m->position_queue)) && n < POSITION_BATCH) {
                AcquireCall *a = container_of(head, AcquireCall, position_node);
                if (usec_add(a->last_position_check, USEC_PER_SEC) > now)
                        break;
                Connection *c = container_of(a, Connection, acquire);
                list_unlink(head);
                a->last_position_check = now;
                list_append(&m->position_queue, head);
                /* A client that has not read its last update gets no new one: its output stays bounded. */
                if (varlink_stream_pending_output(&c->stream) == 0)
                        send_position(c, now); /* may close c: then it left the queue */
                n++;
        }
        head = list_first(&m->position_queue);
        bool more_due = head && n == POSITION_BATCH &&
                        usec_add(container_of(head, AcquireCall, position_node)->last_position_check, USEC_PER_SEC) <= now;
        position_queue_arm(m, now, more_due);
        return 0;
}

static void waiter_count(Connection *c, bool on) {
        AcquireCall *a = &c->acquire;
        if (a->counted_waiter == on)
                return;
        UidUsage *u = manager_uid_usage(c->manager, c->cred.uid, on);
        if (u) {
                if (on)
                        u->waiters++;
                else if (u->waiters > 0)
                        u->waiters--;
        }
        a->counted_waiter = on;
}

static void on_queued(Manager *m, Connection *c, const EngineEvent *ev) {
        if (c->closed)
                return;
        waiter_count(c, true);
        manager_status_changed(m);
        if (c->acquire.more) {
                usec_t now = now_monotonic();
                send_position(c, now);
                if (!c->closed)
                        position_queue_join(c, now);
        }
}

/* Sends the grant to the client that asked (SPEC §5: continues while the connection is the life line). */
static void answer_grant(Connection *c, Lease *l) {
        AcquireCall *a = &c->acquire;
        _cleanup_(json_decrefp) json_t *lease = lease_to_json(l);
        _cleanup_(json_decrefp) json_t *p = lease ? json_pack("{s:s, s:O}", "state", "granted", "lease", lease) : NULL;
        bool continues = a->more && !a->detach;
        if (!p) {
                log_oom();
                connection_close(c);
                return;
        }
        connection_reply(c, p, continues);
        a->request = engine_request_unref(a->request);
        if (!continues) {
                /* A plain Acquire ends with the grant; a detached lease leaves the connection free. */
                a->active = false;
                if (a->detach)
                        connection_acquire_done(c);
        }
}

static void audit_grant(Manager *m, const Lease *l, const LeaseGrant *g) {
        AuditRecord rec = lease_audit_record(l, "granted");
        rec.wait = g->wait;
        rec.budget = g->budget;
        rec.idle = g->idle;
        rec.state = queue_state_to_string(g->state);
        audit_decision(&m->audit, &rec);
}

/* The lease row is durable (or could not be written, which lease-persistence=best-effort accepts): now the
 * grant may be answered (SPEC §3.4). */
static void on_lease_persisted(Lease *l, int result) {
        Manager *m = l->manager;
        Connection *c = l->requester;

        l->requester = NULL;
        if (c)
                c->acquire.pending = NULL;
        if (!persistence_commit_allows_grant(m, l, result)) {
                /* Never granted unpersisted: give the slots back and refuse. */
                AuditRecord rec = lease_audit_record(l, "unavailable");
                rec.lease = NULL; /* never answered: no lease came of it */
                rec.token = 0;
                rec.reason = "the lease could not be written to the state directory";
                audit_decision(&m->audit, &rec);
                persistence_note_refused(m, rec.reason);
                if (c && !c->closed) {
                        _cleanup_(json_decrefp) json_t *p =
                                json_pack("{s:i, s:s, s:s}", "retryAfterSec", 5, "pool", rec.pool, "reason", "storage");
                        c->lease = NULL;
                        l->holder = NULL;
                        connection_reply_error(c, "io.slotbroker.Unavailable", p);
                        connection_acquire_done(c);
                }
                lease_discard(l);
                return;
        }
        audit_grant(m, l, &l->grant);
        if (c && !c->closed)
                answer_grant(c, l);
}

static void on_granted(Manager *m, Connection *c, const EngineEvent *ev) {
        AcquireCall *a = &c->acquire;
        Lease *l;

        session_waiter_left(c);
        int r = lease_new(m, ev->lease, c->closed ? NULL : c, c->cred.uid, c->cred.pid, a->job, a->detach,
                          a->has_command ? &a->command : NULL, TAKE_FD(a->command_pidfd), &l);
        if (r < 0) {
                log_error_errno(r, "Failed to record a lease: %m");
                engine_lease_release(ev->lease, now_monotonic());
                if (!c->closed) {
                        _cleanup_(json_decrefp) json_t *p =
                                json_pack("{s:i, s:s, s:s}", "retryAfterSec", 1, "pool", ev->pool, "reason", "internal");
                        connection_reply_error(c, "io.slotbroker.Unavailable", p);
                        connection_acquire_done(c);
                }
                return;
        }
        a->has_command = false;
        l->grant = (LeaseGrant) {
                .wait = ev->wait,
                .budget = ev->queued ? ev->budget : USEC_INFINITY,
                .idle = ev->queued ? ev->idle : USEC_INFINITY,
                .state = ev->queued ? ev->state : QUEUE_STATE_NONE,
        };

        if (c->closed) {
                /* Gone between the decision and now: the lease lives on only if its command does. */
                audit_grant(m, l, &l->grant);
                lease_persist(l, NULL);
                lease_holder_gone(l);
                return;
        }
        a->pending = l;
        l->requester = c;
        lease_persist(l, on_lease_persisted);
}

static const char *refusal_error(Refusal r) {
        switch (r) {
        case REFUSAL_BUSY:
                return "io.slotbroker.Busy";
        case REFUSAL_FULL:
                return "io.slotbroker.QueueFull";
        case REFUSAL_TIMEOUT:
                return "io.slotbroker.QueueTimeout";
        case REFUSAL_SHED:
                return "io.slotbroker.QueueShed";
        default:
                return "io.slotbroker.Unavailable";
        }
}

static void on_refused(Manager *m, Connection *c, const EngineEvent *ev) {
        AcquireCall *a = &c->acquire;

        session_waiter_left(c);
        manager_status_changed(m);

        AuditRecord rec = AUDIT_RECORD_INIT;
        rec.decision = refusal_to_string(ev->refusal);
        rec.pool = ev->pool;
        rec.lane = ev->lane;
        rec.job = a->job;
        rec.wait = ev->wait;
        rec.budget = ev->queued ? ev->budget : USEC_INFINITY;
        rec.idle = ev->queued ? ev->idle : USEC_INFINITY;
        rec.state = ev->queued ? queue_state_to_string(ev->state) : NULL;
        rec.uid = c->cred.uid;
        rec.pid = c->cred.pid;
        rec.retry_after_sec = ev->retry_after_sec;
        if (ev->refusal == REFUSAL_UNAVAILABLE)
                rec.reason = conf_find_pool(m->config, ev->pool) ? "the pool is drained" : "the pool was removed by a reload";
        audit_decision(&m->audit, &rec);

        if (c->closed)
                return;
        _cleanup_(json_decrefp) json_t *p =
                json_pack("{s:I, s:s?}", "retryAfterSec", (json_int_t) ev->retry_after_sec, "pool", ev->pool);
        if (p && (ev->refusal == REFUSAL_TIMEOUT || ev->refusal == REFUSAL_SHED))
                json_object_set_new(p, "waitedMs", json_integer((json_int_t) (ev->wait / USEC_PER_MSEC)));
        if (p && ev->refusal == REFUSAL_UNAVAILABLE)
                json_object_set_new(p, "reason", json_string(conf_find_pool(m->config, ev->pool) ? "drained" : "removed"));
        connection_reply_error(c, refusal_error(ev->refusal), p);
        connection_acquire_done(c);
}

/* The waiter leaves the queue (granted, refused or withdrawn): no more position updates, and its uid has one
 * waiter less. The only place that does either for a waiter that ends. */
static void session_waiter_left(Connection *c) {
        waiter_count(c, false);
        position_queue_leave(c);
}

bool session_waiter_withdraw(Connection *c, SessionWithdraw why) {
        AcquireCall *a = &c->acquire;
        if (!connection_is_waiting(c)) {
                session_waiter_left(c); /* a no-op unless the engine's answer is still on its way */
                return false;
        }
        usec_t now = now_monotonic();
        AuditRecord rec = AUDIT_RECORD_INIT;
        rec.pool = engine_request_pool(a->request);
        rec.lane = a->lane;
        rec.job = a->job;
        rec.wait = usec_sub_unsigned(now, engine_request_arrival(a->request));
        rec.budget = engine_request_budget(a->request);
        rec.uid = c->cred.uid;
        rec.pid = c->cred.pid;
        if (why == SESSION_WITHDRAW_GONE)
                rec.decision = "cancelled";
        else {
                /* The client is refused (Unavailable): recorded as that refusal, with the reason. */
                rec.decision = "unavailable";
                rec.retry_after_sec = 1;
                rec.reason = "cancelled by an administrator";
        }
        audit_decision(&c->manager->audit, &rec);
        engine_request_cancel(a->request, now);
        session_waiter_left(c);
        if (why == SESSION_WITHDRAW_CANCELLED) {
                _cleanup_(json_decrefp) json_t *p = json_pack("{s:i, s:s, s:s}", "retryAfterSec", 1, "pool",
                                                              rec.pool, "reason", "cancelled");
                connection_reply_error(c, "io.slotbroker.Unavailable", p);
                connection_acquire_done(c);
        }
        return true;
}

void session_on_engine_event(Manager *m, const EngineEvent *ev) {
        switch (ev->type) {
        case ENGINE_EVENT_QUEUED:
                on_queued(m, ev->userdata, ev);
                break;
        case ENGINE_EVENT_GRANTED:
                on_granted(m, ev->userdata, ev);
                break;
        case ENGINE_EVENT_REFUSED:
                on_refused(m, ev->userdata, ev);
                break;
        case ENGINE_EVENT_REVOKE:
                if (ev->userdata)
                        lease_revoke(ev->userdata, "max-hold");
                break;
        case ENGINE_EVENT_CONGESTION:
                audit_congestion(&m->audit, ev->pool, ev->congested, ev->idle);
                manager_status_changed(m);
                break;
        default:
                break;
        }
}
