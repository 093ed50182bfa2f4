/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "audit.h"
#include "closer.h"
#include "connection.h"
#include "lease.h"
#include "log.h"
#include "persistence.h"
#include "process.h"
#include "selector.h"
#include "session.h"
#include "strv.h"

#define JOB_MAX 1024
/* maxHoldMs at most 3650 days: grant time plus the hold, in µs, then stays far inside expiresAt's int64
 * (INT64_MAX / 1000 let a hold overflow it into a negative expiresAt). Longer is no bound at all. */
#define MAX_HOLD_MS_MAX ((int64_t) 3650 * 24 * 3600 * 1000)

static void answer_grant(Session *s, Lease *l);
static void session_waiter_left(Session *s);

static int reply_invalid_parameter(Session *s, const char *parameter) {
        _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "parameter", parameter);
        return session_reply_error(s, VARLINK_ERROR_INVALID_PARAMETER, p);
}

/* Refuses an Acquire `unavailable` before the engine hears of it (storage, rate), audited under the pool it
 * would have waited on, as for any refusal: metrics count refusals per pool. */
static void refuse_unavailable(Session *s, const char *lane, const char *job, const LaneConfig *lc,
                               unsigned retry_sec, const char *reason, const char *audit_reason) {
        const char *pool = lc && lc->pools && lc->pools[0] ? lc->pools[lc->n_pools - 1] : NULL;
        AuditRecord r = AUDIT_RECORD_INIT;
        r.decision = "unavailable";
        r.pool = pool;
        r.lane = lane;
        r.job = job;
        r.uid = s->cred.uid;
        r.pid = s->cred.pid;
        r.retry_after_sec = retry_sec;
        r.reason = audit_reason;
        audit_decision(s->table->audit, &r);
        _cleanup_(json_decrefp) json_t *p =
                json_pack("{s:i, s:s?, s:s}", "retryAfterSec", (int) retry_sec, "pool", pool, "reason", reason);
        session_reply_error(s, "io.slotbroker.Unavailable", p);
}

/* Whether command may hold this session's lease: the peer as it was when brokerd took the connection, or
 * its child (process_check_attachable()). */
static bool session_may_attach(const Session *s, const ProcessInfo *command) {
        return process_check_attachable(command, s->cred.pid, s->cred.uid,
                                        connection_get_peer_since(s->connection)) >= 0;
}

/* SPEC §3.4: nothing is granted that could not be persisted, nor before what was persisted has been read.
 * Refused at once, rather than granted by the engine and withdrawn after a write that cannot succeed. */
static bool refuse_for_storage(Session *s, const char *lane, const char *job) {
        const char *why = persistence_refusal(s->table->persistence);
        if (!why)
                return false;
        refuse_unavailable(s, lane, job, conf_find_lane(s->table->config, lane), 5, "storage", why);
        persistence_note_refused(s->table->persistence, why);
        return true;
}

static void audit_denied(Session *s, const char *lane, const char *job) {
        AuditRecord r = AUDIT_RECORD_INIT;
        r.decision = "denied";
        r.lane = lane;
        r.job = job;
        r.uid = s->cred.uid;
        r.pid = s->cred.pid;
        audit_decision(s->table->audit, &r);
}

bool rate_bucket_take(RateBucket *b, uint64_t rate_per_hour, unsigned burst, usec_t now, usec_t *ret_retry) {
        if (rate_per_hour == 0)
                return true;
        double per_usec = (double) rate_per_hour / (double) USEC_PER_HOUR;
        if (b->at == 0 || now < b->at)
                b->tokens = burst;
        else
                b->tokens = MIN((double) burst, b->tokens + (double) (now - b->at) * per_usec);
        b->at = now;
        if (b->tokens >= 1.0) {
                b->tokens -= 1.0;
                return true;
        }
        if (ret_retry)
                *ret_retry = (usec_t) ((1.0 - b->tokens) / per_usec) + 1;
        return false;
}

/* Issue 19 i: every Acquire on a shared pool leaves a record in the fleet's Redis, even one refused at once.
 * A uid over max-acquire-rate-per-uid (not root), or the node over max-acquire-rate, is refused before Redis
 * hears of it: unavailable, reason "rate", with the time to the next token. The node's bucket is charged
 * only for requests the uid's let through, so that one uid's flood does not spend the others' share. A uid
 * out of memory for its bucket is held to the node's alone. */
static bool refuse_for_rate(Session *s, const char *lane, const char *job, const LaneConfig *lc) {
        SessionTable *m = s->table;
        const BrokerConfig *c = m->config;
        usec_t now = now_monotonic(), retry = 0;
        /* Root is held to the node's rate only: it can do worse on the host anyway, and CI fleets that run
         * jobs as root would otherwise share one uid's bucket among all their jobs. */
        UidUsage *u = s->cred.uid == 0 ? NULL : session_table_uid_usage(m, s->cred.uid, true);
        bool uid_ok = !u || rate_bucket_take(&u->acquire_rate, c->max_acquire_rate_per_uid,
                                             c->max_acquire_burst_per_uid, now, &retry);
        if (uid_ok) {
                /* The node's burst: 5 s of its rate. */
                uint64_t burst = c->max_acquire_rate * 5 / 3600;
                if (rate_bucket_take(&m->acquire_rate, c->max_acquire_rate, (unsigned) MIN(MAX(burst, 1u), UINT32_MAX),
                                     now, &retry))
                        return false;
                if (u) /* not the uid's fault: its token back */
                        u->acquire_rate.tokens += 1.0;
        }
        refuse_unavailable(s, lane, job, lc, (unsigned) MIN(DIV_ROUND_UP(retry, USEC_PER_SEC), 3600u), "rate",
                           uid_ok ? "rate (this node's max-acquire-rate)" : "rate (this user's max-acquire-rate-per-uid)");
        return true;
}

/* Whether a pool the lane may take slots from is shared (backend=). */
static bool lane_is_shared(const BrokerConfig *c, const LaneConfig *lc) {
        for (size_t i = 0; i < lc->n_pools; i++) {
                const PoolConfig *pc = conf_find_pool(c, lc->pools[i]);
                if (pc && pc->backend)
                        return true;
        }
        return false;
}

/* The client's labels (SPEC §3.5): as many again as a lane's labels= may hold (SELECTOR_TERMS_MAX in all). */
#define ACQUIRE_LABELS_MAX 32

/* a->selector from a->labels and a->member: NULL when neither. Returns 0, -ENOMEM. */
static int acquire_set_selector(AcquireCall *a) {
        const Selector sel = { .terms = a->labels, .member = a->member };
        if (selector_is_empty(&sel))
                return 0;
        return selector_canon(&sel, &a->selector);
}

/* Which parameter to name when no pool of the lane can ever grant the request: its selector if it has one
 * (SPEC §3.5: a selector no member matches), else its size. */
static const char *invalid_request_parameter(const AcquireCall *a) {
        return a->member ? "member" : a->labels ? "labels" : "slots";
}

void session_acquire(Session *s, const VarlinkCall *call) {
        SessionTable *m = s->table;
        AcquireCall *a = &s->acquire;
        const char *lane = NULL, *job = NULL, *reclaim = NULL, *member = NULL;
        _cleanup_(json_strv_freep) char **labels = NULL;
        unsigned slots = 1;
        bool wait = true, detach = false, fence = false;
        int64_t queue_wait_ms = 0, pid = 0, pidfd_index = -1, max_hold_ms = 0;
        const char *bad = NULL;

        if (call->flags & VARLINK_CALL_ONEWAY) {
                /* Nobody would hear the grant: SPEC §5 makes this an error, not a silent lease. */
                reply_invalid_parameter(s, "oneway");
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
                { "fence", JSON_FIELD_BOOL, 0, &fence },
                { "labels", JSON_FIELD_STRV, 0, &labels, .max_length = ACQUIRE_LABELS_MAX },
                { "member", JSON_FIELD_STRING, 0, &member, .max_length = 64 },
                {},
        };
        int r = json_dispatch(call->parameters, table, 0, &bad);
        if (r < 0) {
                reply_invalid_parameter(s, bad ?: "parameters");
                return;
        }
        for (size_t i = 0; labels && labels[i]; i++)
                if (!selector_term_is_valid(labels[i])) {
                        reply_invalid_parameter(s, "labels");
                        return;
                }
        if (member && !conf_name_is_valid(member)) {
                reply_invalid_parameter(s, "member");
                return;
        }
        if (pid > 0 && pidfd_index >= 0) {
                reply_invalid_parameter(s, "pidfd"); /* one command, named once */
                return;
        }
        if (detach && max_hold_ms == 0) {
                reply_invalid_parameter(s, "maxHoldMs"); /* a detached lease needs an end of its own */
                return;
        }
        const LaneConfig *lc = conf_find_lane(m->config, lane);
        if (!lc) {
                _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "lane", lane);
                session_reply_error(s, "io.slotbroker.NoSuchLane", p);
                return;
        }
        if (detach && lane_is_shared(m->config, lc)) {
                /* SPEC §11: a detached lease has no command for brokerd to stop and no connection to tell; its
                 * max-hold counts on this node's clock only, while Redis frees its slot a node TTL after a
                 * lost heartbeat. Nobody could fence it: not on a shared pool. */
                reply_invalid_parameter(s, "detach");
                return;
        }
        const gid_t *groups;
        size_t n_groups = connection_get_groups(s->connection, &groups);
        if (!m->lane_allows(lane, s->cred.uid, groups, n_groups, m->userdata)) {
                audit_denied(s, lane, job);
                _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "lane", lane);
                session_reply_error(s, "io.slotbroker.PermissionDenied", p);
                return;
        }
        if (reclaim) {
                /* After a restart: the owner takes back a lease it held; no new request is made. */
                Lease *l = lease_table_find(m->leases, reclaim);
                if (!l || (l->uid != s->cred.uid && s->cred.uid != 0) || !streq(engine_lease_lane(l->engine_lease), lane) ||
                    lease_reclaim(l, s) < 0) {
                        _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "lease", reclaim);
                        session_reply_error(s, "io.slotbroker.NoSuchLease", p);
                        return;
                }
                s->lease = l; /* the lease's side: lease_reclaim() */
                log_info("Lease %s reclaimed by pid %d.", l->id, (int) s->cred.pid);
                a->active = true;
                a->more = call->flags & VARLINK_CALL_MORE;
                a->detach = false;
                a->fence = fence;
                answer_grant(s, l);
                return;
        }

        if (refuse_for_storage(s, lane, job))
                return;
        if (lane_is_shared(m->config, lc) && refuse_for_rate(s, lane, job, lc))
                return;

        /* A client's fd, of any type until checked: its last close() may block (closer.h). */
        _cleanup_(closer_closep) int pidfd = -EBADF;
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
                if (r < 0 || !session_may_attach(s, &command)) {
                        log_debug("Acquire of pid %d: the command it names cannot hold a lease: %s", (int) s->cred.pid,
                                  r < 0 ? strerror(-r) : "neither the peer (as at accept) nor its child of the same uid");
                        reply_invalid_parameter(s, pid > 0 ? "pid" : "pidfd");
                        return;
                }
        }

        /* At its waiter limit a uid may still take a free slot, but not wait for one. */
        UidUsage *u = session_table_uid_usage(m, s->cred.uid, true);
        bool no_wait = !wait || (u && u->waiters >= m->config->max_waiters_per_uid);

        a->lane = strdup(lane);
        a->job = job ? strdup(job) : NULL;
        a->member = member ? strdup(member) : NULL;
        a->labels = labels && labels[0] ? TAKE_PTR(labels) : NULL;
        if (!a->lane || (job && !a->job) || (member && !a->member) || acquire_set_selector(a) < 0) {
                log_oom();
                session_close(s);
                return;
        }
        a->active = true;
        a->more = call->flags & VARLINK_CALL_MORE;
        a->detach = detach;
        a->fence = fence;
        a->slots = slots;
        a->max_hold = max_hold_ms > 0 ? (usec_t) max_hold_ms * USEC_PER_MSEC : USEC_INFINITY;
        a->max_wait = queue_wait_ms > 0 ? (usec_t) queue_wait_ms * USEC_PER_MSEC : USEC_INFINITY;
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
                                   .max_wait = a->max_wait,
                                   .max_hold = a->max_hold,
                                   .userdata = s,
                                   .labels = (const char *const *) a->labels,
                                   .member = a->member,
                           },
                           now_monotonic(), &a->request);
        if (r == -ENOENT || r == -EINVAL) {
                a->active = false;
                if (r == -ENOENT) {
                        _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "lane", lane);
                        session_reply_error(s, "io.slotbroker.NoSuchLane", p);
                } else
                        /* More slots than any pool of the lane has, or than its members that match. */
                        reply_invalid_parameter(s, invalid_request_parameter(a));
                session_acquire_done(s);
                return;
        }
        if (r < 0) {
                log_error_errno(r, "Failed to queue a request: %m");
                session_close(s);
        }
        /* The outcome arrives as engine events, at the owner's drain (session_on_engine_event()). */
}

/* ---- the table ---- */

/* A waiter's first "queued" reply waits this long for company: under contention most waits end sooner, and
 * the grant takes it along (one send and one wakeup of the client instead of two: a contended pool's pairs
 * +4-9 %, bench-pairs at limit 16). The client hears that it waits a millisecond or two later. */
#define QUEUED_NOTICE_GRACE (1 * USEC_PER_MSEC)
/* Held-back replies sent per run of the timer: a burst of waiters is not one long dispatch. */
#define NOTICE_BATCH 64

static int on_position_timer(sd_event_source *source, uint64_t usec, void *userdata);
static int on_notice_timer(sd_event_source *source, uint64_t usec, void *userdata);
static void session_free(Session *s);

/* Test-only: SLOTBROKER_TEST_RENEW_MS=N renews every fenced lease, of any pool, every N/4 ms with a fence of
 * N ms, as the shared pools' heartbeat will. It lets the integration tests stop brokerd (SIGSTOP) under a
 * fenced `slotctl run` without a Redis; production brokerd sends no renewal for a local pool. */
static int on_test_renew_timer(sd_event_source *source, uint64_t usec, void *userdata) {
        SessionTable *t = userdata;
        unsigned n_renewed = 0;
        list_foreach_safe(n, &t->sessions) /* a failed reply closes its session: it moves to t->closed */
                n_renewed += session_lease_renew(container_of(n, Session, node), t->test_renew);
        if (n_renewed > 0) /* after the replies: a test that reads this knows they were sent */
                log_debug("Test hook: renewed %u fenced leases.", n_renewed);
        return sd_event_source_set_time(source, usec_add(usec, t->test_renew / 4));
}

static int test_renew_setup(SessionTable *t, sd_event *event) {
        const char *e = getenv("SLOTBROKER_TEST_RENEW_MS");
        char *end;
        if (!e || !*e)
                return 0;
        errno = 0;
        unsigned long ms = strtoul(e, &end, 10);
        if (errno != 0 || *end || ms < 4 || ms > 3600 * 1000)
                return log_error_errno(-EINVAL, "Invalid SLOTBROKER_TEST_RENEW_MS='%s'.", e);
        t->test_renew = (usec_t) ms * USEC_PER_MSEC;
        log_warning("SLOTBROKER_TEST_RENEW_MS=%lu: renewing every fenced lease (a test hook).", ms);
        int r = sd_event_add_time(event, &t->test_renew_timer, CLOCK_MONOTONIC, usec_add(now_monotonic(), t->test_renew / 4),
                                  0, on_test_renew_timer, t);
        if (r < 0)
                return r;
        return sd_event_source_set_enabled(t->test_renew_timer, SD_EVENT_ON);
}

int session_table_init(SessionTable *t, sd_event *event) {
        *t = (SessionTable) {};
        list_init(&t->sessions);
        list_init(&t->closed);
        list_init(&t->position_queue);
        list_init(&t->notice_queue);
        list_init(&t->status_waiting);
        list_init(&t->metrics_waiting);
        int r = sd_event_add_time(event, &t->position_timer, CLOCK_MONOTONIC, USEC_INFINITY, 10 * USEC_PER_MSEC,
                                  on_position_timer, t);
        if (r < 0)
                return r;
        (void) sd_event_source_set_enabled(t->position_timer, SD_EVENT_OFF);
        /* Position updates are courtesy: a release or a new call waiting in the same iteration goes first. */
        (void) sd_event_source_set_priority(t->position_timer, SD_EVENT_PRIORITY_IDLE);
        r = sd_event_add_time(event, &t->notice_timer, CLOCK_MONOTONIC, USEC_INFINITY, QUEUED_NOTICE_GRACE,
                              on_notice_timer, t);
        if (r < 0)
                return r;
        (void) sd_event_source_set_enabled(t->notice_timer, SD_EVENT_OFF);
        return test_renew_setup(t, event);
}

void session_table_collect(SessionTable *t) {
        ListNode *n;
        while ((n = list_first(&t->closed))) {
                list_unlink(n);
                session_free(container_of(n, Session, node));
        }
}

void session_table_done(SessionTable *t) {
        ListNode *n;
        if (!t->sessions.next)
                return; /* never initialised */
        while ((n = list_first(&t->sessions))) {
                Session *s = container_of(n, Session, node);
                /* Shutting down is not releasing: leases end with the process (and may be freed already). */
                s->lease = NULL;
                s->acquire.pending = NULL;
                session_close(s);
        }
        session_table_collect(t);
        t->position_timer = sd_event_source_disable_unref(t->position_timer);
        t->notice_timer = sd_event_source_disable_unref(t->notice_timer);
        t->test_renew_timer = sd_event_source_disable_unref(t->test_renew_timer);
        t->uid_usage = mfree(t->uid_usage);
        t->n_uid_usage = 0;
}

void session_table_close_all_but_holders(SessionTable *t) {
        /* Closing a session moves it to the closed list only: the loop goes on from the next one. */
        list_foreach_safe(n, &t->sessions) {
                Session *s = container_of(n, Session, node);
                if (!s->lease && !s->acquire.pending)
                        session_close(s);
        }
}

UidUsage *session_table_uid_usage(SessionTable *t, uid_t uid, bool create) {
        for (size_t i = 0; i < t->n_uid_usage; i++)
                if (t->uid_usage[i].uid == uid)
                        return &t->uid_usage[i];
        if (!create)
                return NULL;
        UidUsage *a = reallocarray(t->uid_usage, t->n_uid_usage + 1, sizeof(UidUsage));
        if (!a)
                return NULL;
        t->uid_usage = a;
        a[t->n_uid_usage] = (UidUsage) { .uid = uid };
        return &a[t->n_uid_usage++];
}

/* ---- the session and its connection ---- */

static void session_on_input_ended(Connection *c, void *userdata) {
        Session *s = userdata;
        /* An open Acquire's connection is the lease's life line: a client that can send nothing more has
         * ended it, as a hang-up does (io.slotbroker(7)). */
        if (s->acquire.active || s->lease) {
                log_debug("Client pid %d shut its side of the connection with an Acquire open; closing.",
                          (int) s->cred.pid);
                session_close(s);
        }
}

int session_new(SessionTable *m, Connection *c, ConnectionCallFn call, ConnectionDisconnectFn disconnect,
                Session **ret) {
        Session *s = calloc(1, sizeof(Session));
        if (!s) {
                connection_close(c);
                connection_free(c);
                return -ENOMEM;
        }
        *s = (Session) {
                .table = m,
                .connection = c,
                .cred = *connection_get_peer(c),
                .acquire.command_pidfd = -EBADF,
        };
        connection_set_userdata(c, s);
        connection_bind_call(c, call);
        connection_bind_input_ended(c, session_on_input_ended);
        connection_bind_disconnect(c, disconnect);
        list_append(&m->sessions, &s->node);
        m->n_sessions++;
        UidUsage *u = session_table_uid_usage(m, s->cred.uid, true);
        if (u)
                u->connections++;
        *ret = s;
        return 0;
}

SessionText *session_text_new(char *data, size_t size) {
        SessionText *t = malloc(sizeof(SessionText));
        if (!t) {
                free(data);
                return NULL;
        }
        *t = (SessionText) { .n_ref = 1, .size = size, .data = data };
        return t;
}

SessionText *session_text_ref(SessionText *t) {
        if (t)
                t->n_ref++;
        return t;
}

SessionText *session_text_unref(SessionText *t) {
        if (!t || --t->n_ref > 0)
                return NULL;
        free(t->data);
        free(t);
        return NULL;
}

static void session_free(Session *s) {
        if (!s)
                return;
        assert(s->closed);
        connection_free(s->connection);
        session_text_unref(s->reply_text);
        free(s->acquire.lane);
        free(s->acquire.job);
        strv_free(s->acquire.labels);
        free(s->acquire.member);
        free(s->acquire.selector);
        free(s);
}

int session_reply(Session *s, json_t *parameters, bool continues) {
        return connection_reply(s->connection, parameters, continues);
}

int session_reply_text(Session *s, const JsonText *parameters, bool continues) {
        int r = json_text_result(parameters);
        if (r < 0)
                return r;
        return connection_reply_text(s->connection, parameters->data, parameters->size, continues);
}

int session_reply_literal(Session *s, const char *parameters, bool continues) {
        return connection_reply_text(s->connection, parameters, strlen(parameters), continues);
}

int session_reply_error(Session *s, const char *error, json_t *parameters) {
        return connection_reply_error(s->connection, error, parameters);
}

void session_close(Session *s) {
        connection_close(s->connection); /* its disconnect handler ends up in session_on_disconnect() */
}

bool session_is_waiting(const Session *s) {
        return s->acquire.active && s->acquire.request && engine_request_is_waiting(s->acquire.request);
}

/* The holder link, both sides: s->lease here, the lease's holder in lease.c (set by lease_new() and
 * lease_reclaim(), cleared here). Returns the lease s held. */
static Lease *session_unlink_lease(Session *s) {
        Lease *l = TAKE_PTR(s->lease);
        if (l)
                lease_clear_holder(l);
        return l;
}

/* The holder of l, revoked (outcome REVOKED), is told. */
static void session_lease_tell_revoked(Lease *l) {
        Session *h = lease_get_holder(l);
        if (h->acquire.active && h->acquire.more) {
                /* The last reply of the Acquire tells the holder to stop (SPEC §3.4). */
                _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "state", "revoked");
                (void) session_reply(h, p, false);
                h->acquire.active = false;
                if (h->closed || h->lease != l)
                        return; /* the reply found the peer gone: the close ended the lease (l may be freed)
                                 * or left it overdue, with no holder to give a grace to */
                lease_start_revoke_grace(l);
                return;
        }
        /* A plain Acquire's life line is the connection itself: the broker closes it (SPEC §5). That ends the
         * lease, or makes it overdue while its command runs; l may be gone after this. */
        session_close(h);
}

void session_lease_revoke(Lease *l, const char *reason) {
        if (lease_revoke(l, reason) != LEASE_OUTCOME_REVOKED)
                return; /* revoked already, or nobody holds it: overdue or ended */
        session_lease_tell_revoked(l);
}

/* Its pool lost it: as a revocation, and brokerd stops its command should its holder not (lease_lose()). */
static void session_lease_lose(Lease *l, const char *reason) {
        if (lease_lose(l, reason) != LEASE_OUTCOME_REVOKED)
                return;
        session_lease_tell_revoked(l);
}

bool session_lease_renew(Session *s, usec_t fence_in) {
        AcquireCall *a = &s->acquire;
        /* Only the open stream of a held lease carries renewals, and only to a client that asked for them. */
        if (s->closed || !s->lease || a->pending || !a->active || !a->more || !a->fence)
                return false;
        /* killWithinMs: the fence leaves revoke-grace (+ 2 s) before the slots are another node's; a client
         * whose own kill delay is longer must not use it then. */
        _cleanup_(json_decrefp) json_t *p =
                json_pack("{s:s, s:I, s:I}", "state", "held", "fenceInMs", (json_int_t) (fence_in / USEC_PER_MSEC),
                          "killWithinMs", (json_int_t) (s->table->config->revoke_grace / USEC_PER_MSEC));
        if (!p) {
                log_oom();
                return false; /* the client fences itself a little early: safe */
        }
        return session_reply(s, p, true) >= 0;
}

unsigned session_table_renew_pool(SessionTable *t, const char *pool, usec_t deadline) {
        usec_t now = now_boottime();
        unsigned n = 0;
        if (deadline == USEC_INFINITY || deadline <= now)
                return 0; /* nothing to promise: the fence is due (or there is none) */
        list_foreach_safe(node, &t->sessions) { /* a failed reply closes its session: it moves to t->closed */
                Session *s = container_of(node, Session, node);
                /* Shared leases only: after a reload moved the pool off its backend, a local lease of the
                 * same name has no deadline (SPEC §11). */
                if (s->lease && streq(engine_lease_pool(s->lease->engine_lease), pool) &&
                    engine_lease_is_shared(s->lease->engine_lease))
                        n += session_lease_renew(s, deadline - now);
        }
        return n;
}

void session_lease_release(Session *by, Lease *l) {
        /* slotctl run reports its command's exit status with a Release right after the command's group is gone
         * (SPEC §3.6), often before brokerd has read the pidfd's wakeup: that is an end, not a revocation. */
        lease_command_refresh(l);
        if (lease_command_running(l)) {
                session_lease_revoke(l, "released while its command runs");
                return;
        }
        Session *h = lease_get_holder(l), *resume = NULL;
        if (h) {
                (void) session_unlink_lease(h);
                if (h->acquire.active && h->acquire.more) {
                        (void) session_reply_literal(h, "{\"state\":\"released\"}", false);
                        h->acquire.active = false;
                        if (h != by)
                                resume = h;
                } else if (h != by)
                        session_close(h); /* a plain Acquire's life line is the connection itself */
        }
        lease_end(l);
        /* Only now: the holder's calls behind its Acquire run when it resumes, and one of them may be an
         * Acquire reclaiming this very lease, which must find it ended, not take it back while it ends. */
        if (resume)
                session_acquire_done(resume);
}

/* Release of the lease this session holds may overtake the wait for that lease to end: it is what ends it,
 * and the Acquire's last reply still goes out before the Release's, in order. This lets one connection
 * take and give back lease after lease. */
static bool call_releases_own_lease(const Session *s, const VarlinkCall *call) {
        if (!s->lease || s->acquire.pending || s->history_pending || !streq(call->method, "io.slotbroker.Release"))
                return false;
        json_t *id = json_object_get(call->parameters, "lease");
        return json_is_string(id) && streq(json_string_value(id), s->lease->id);
}

bool session_defers_call(const Session *s, const VarlinkCall *call) {
        bool busy = s->acquire.active || s->lease || s->history_pending || s->reply_text ||
                    list_node_is_linked(&s->view_node);
        return busy && !call_releases_own_lease(s, call);
}

/* A reservation for people (SPEC §3.6): an Acquire of ENGINE_RESERVE_LANE in one pool, at the head of
 * its queue, held detached for r->hold from its grant; its reason is its job. The caller checked the
 * parameters and that the peer may administer the pool. */
void session_reserve(Session *s, const VarlinkCall *call, const SessionReserve *r) {
        SessionTable *m = s->table;
        AcquireCall *a = &s->acquire;

        if (call->flags & VARLINK_CALL_ONEWAY) {
                reply_invalid_parameter(s, "oneway");
                return;
        }
        if (refuse_for_storage(s, ENGINE_RESERVE_LANE, r->reason))
                return;
        /* At its waiter limit a uid may still take a free slot, but not wait for one: a reservation is a
         * request waiting as any other (SPEC §10). */
        UidUsage *u = session_table_uid_usage(m, s->cred.uid, true);
        bool no_wait = u && u->waiters >= m->config->max_waiters_per_uid;

        a->lane = strdup(ENGINE_RESERVE_LANE);
        a->job = strdup(r->reason);
        a->member = r->member ? strdup(r->member) : NULL;
        a->labels = r->labels && r->labels[0] ? strv_copy(r->labels) : NULL;
        if (!a->lane || !a->job || (r->member && !a->member) || (r->labels && r->labels[0] && !a->labels) ||
            acquire_set_selector(a) < 0) {
                log_oom();
                session_close(s);
                return;
        }
        a->active = true;
        a->more = call->flags & VARLINK_CALL_MORE;
        a->detach = true;
        a->fence = false;
        a->slots = 1;
        a->max_hold = r->hold;
        a->max_wait = USEC_INFINITY;
        a->last_position = a->last_queued = 0;
        a->counted_waiter = false;
        a->has_command = false;
        a->command_pidfd = -EBADF;

        int k = engine_acquire(m->engine,
                               &(EngineAcquire) {
                                       .reserve_pool = r->pool,
                                       .slots = 1,
                                       .no_wait = no_wait,
                                       .max_wait = USEC_INFINITY,
                                       .max_hold = a->max_hold,
                                       .userdata = s,
                                       .labels = (const char *const *) a->labels,
                                       .member = a->member,
                               },
                               now_monotonic(), &a->request);
        if (k == -ENOENT || k == -EINVAL || k == -EOPNOTSUPP) {
                a->active = false;
                if (k == -ENOENT) {
                        _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "pool", r->pool);
                        session_reply_error(s, "io.slotbroker.NoSuchPool", p);
                } else
                        /* A member or labels no member of the pool has, or either on a shared pool ("not yet"). */
                        reply_invalid_parameter(s, k == -EOPNOTSUPP ? "pool" : invalid_request_parameter(a));
                session_acquire_done(s);
                return;
        }
        if (k < 0) {
                log_error_errno(k, "Failed to queue a reservation: %m");
                session_close(s);
        }
}

void session_acquire_done(Session *s) {
        AcquireCall *a = &s->acquire;
        a->active = false;
        a->request = engine_request_unref(a->request);
        a->command_pidfd = safe_close(a->command_pidfd);
        a->has_command = false;
        a->lane = mfree(a->lane);
        a->job = mfree(a->job);
        a->labels = strv_free(a->labels);
        a->member = mfree(a->member);
        a->selector = mfree(a->selector);
        connection_resume(s->connection);
}

static void position_queue_leave(Session *s);
static void notice_queue_leave(Session *s);

void session_on_disconnect(Session *s) {
        SessionTable *m = s->table;
        AcquireCall *a = &s->acquire;

        s->closed = true;
        if (list_node_is_linked(&s->view_node))
                list_unlink(&s->view_node); /* its Status or Metrics reply has nobody to go to */
        if (s->handed_over) {
                /* The next brokerd has the request and the life line: nothing is withdrawn (a shared pool would
                 * tell Redis), audited or ended here. The engine keeps the request until it is freed with the
                 * process, and the loop may run on (up to STOP_GIVE_BACK_MAX, giving other waiters back to
                 * Redis): its events are nobody's from now on (session_on_engine_event()), this session being
                 * freed with this iteration. */
                engine_request_set_userdata(a->request, NULL);
                position_queue_leave(s);
                notice_queue_leave(s);
                if (s->lease)
                        lease_clear_holder(TAKE_PTR(s->lease));
        } else
                (void) session_waiter_withdraw(s, SESSION_WITHDRAW_GONE);
        a->request = engine_request_unref(a->request);
        a->command_pidfd = safe_close(a->command_pidfd);
        a->active = false; /* lane and job stay for the audit of decisions still on their way */
        Lease *pending = TAKE_PTR(a->pending);
        if (pending) {
                /* Its row still gets written, nobody hears the grant; it goes as its holder did once the grant
                 * is (on_lease_persisted()), unless the next brokerd has it. */
                lease_persist_forget(pending);
                pending->grant.holder_gone = !s->handed_over;
        }
        Lease *l = session_unlink_lease(s);
        if (l && l != pending)
                (void) lease_holder_gone(l);

        if (m->memory_freed)
                m->memory_freed(connection_get_buffered(s->connection), m->userdata);
        if (m->fd_released)
                m->fd_released(m->userdata);
        list_unlink(&s->node);
        m->n_sessions--;
        UidUsage *u = session_table_uid_usage(m, s->cred.uid, false);
        if (u && u->connections > 0)
                u->connections--;
        m->changed = true;
        /* Callers up the stack may still hold s: it is freed once this loop iteration is over. */
        list_append(&m->closed, &s->node);
}

/* ---- a restart's handover ---- */

static void session_lease_renew_now(Session *s, const Lease *l);

int session_export(Session *s, HandoverAcquire *ret, bool *ret_has_acquire) {
        AcquireCall *a = &s->acquire;
        if (s->closed)
                return -ENOTCONN;
        if (a->pending || s->history_pending || s->reply_text || list_node_is_linked(&s->view_node))
                return -EBUSY;
        if (!a->active && !s->lease) {
                *ret_has_acquire = false;
                return 0;
        }
        /* A revoked lease's holder was told to stop, and its grace runs here: it reclaims after the restart. */
        if (s->lease && s->lease->state != LEASE_HELD)
                return -EBUSY;
        if (!s->lease && !session_is_waiting(s))
                return -EBUSY; /* routed to a pool that has not answered yet */

        _cleanup_(handover_acquire_done) HandoverAcquire h = {
                .slots = a->slots,
                .more = a->more,
                .fence = a->fence,
                .max_hold = a->max_hold,
                .max_wait = a->max_wait,
                .last_position = a->last_position,
                .last_queued = a->last_queued,
                .has_command = a->has_command && !s->lease,
                .command_pid = a->command.pid,
                .command_start = a->command.start_time,
                .budget = USEC_INFINITY,
        };
        if (s->lease) {
                /* Its lane and job are the lease's (a reclaimed lease's session never had them). */
                const EngineLease *el = s->lease->engine_lease;
                h.slots = engine_lease_slots(el, NULL, NULL);
                if (strdup_or_null(engine_lease_lane(el), &h.lane) < 0 || strdup_or_null(s->lease->job, &h.job) < 0 ||
                    strdup_or_null(s->lease->id, &h.lease) < 0)
                        return -ENOMEM;
                h.max_hold = h.max_wait = USEC_INFINITY;
        } else {
                EngineRequest *r = a->request;
                size_t pos = 0, queued = 0;
                (void) engine_request_position(r, &pos, &queued);
                h.arrival = engine_request_arrival(r);
                h.state = engine_request_state(r);
                h.idle = engine_request_idle(r);
                h.budget = engine_request_budget(r);
                h.position = pos;
                if (a->labels && !(h.labels = strv_copy(a->labels)))
                        return -ENOMEM;
                if (strdup_or_null(a->lane, &h.lane) < 0 || strdup_or_null(a->job, &h.job) < 0 ||
                    strdup_or_null(a->member, &h.member) < 0 || strdup_or_null(engine_request_pool(r), &h.pool) < 0 ||
                    strdup_or_null(engine_request_remote_id(r), &h.remote_id) < 0 ||
                    engine_request_lane_rules(r, &h.lane_rules) < 0)
                        return -ENOMEM;
        }
        *ret = h;
        h = (HandoverAcquire) {};
        *ret_has_acquire = true;
        return 0;
}

void session_handed_over(Session *s) {
        s->handed_over = true;
        connection_set_handed_over(s->connection);
        session_close(s);
}

static int session_resume_lease(Session *s, const HandoverAcquire *h) {
        SessionTable *m = s->table;
        AcquireCall *a = &s->acquire;
        Lease *l = lease_table_find(m->leases, h->lease);
        /* Only what the lease log restored is held: the state names a lease, it never makes one; and only by
         * the process that asked for it (the socket's peer, as the kernel says, not the state), so that a
         * damaged state cannot make another connection the life line of someone else's lease. */
        if (!l || l->uid != s->cred.uid || l->pid != s->cred.pid || !streq(engine_lease_lane(l->engine_lease), h->lane))
                return -EPERM;
        if (lease_reclaim(l, s) < 0)
                return -EBUSY;
        s->lease = l; /* the lease's side: lease_reclaim() */
        a->active = h->more;
        a->more = h->more;
        a->fence = h->fence;
        if (strdup_or_null(h->lane, &a->lane) < 0 || strdup_or_null(h->job, &a->job) < 0)
                return -ENOMEM;
        if (h->more)
                session_lease_renew_now(s, l); /* a fenced client hears its deadline again at once */
        return 0;
}

static int session_resume_waiter(Session *s, const HandoverAcquire *h) {
        SessionTable *m = s->table;
        AcquireCall *a = &s->acquire;
        const gid_t *groups;
        size_t n_groups = connection_get_groups(s->connection, &groups);

        _cleanup_(closer_closep) int pidfd = -EBADF;
        ProcessInfo command = {};
        if (h->has_command) {
                /* The command it named, if it is still that process and still the peer's to attach. */
                pidfd = process_open(h->command_pid, &command);
                if (pidfd < 0 || command.start_time != h->command_start ||
                    !session_may_attach(s, &command))
                        return -ENOENT;
        }
        if (strdup_or_null(h->lane, &a->lane) < 0 || strdup_or_null(h->job, &a->job) < 0 ||
            strdup_or_null(h->member, &a->member) < 0 || (h->labels && !(a->labels = strv_copy(h->labels))) ||
            acquire_set_selector(a) < 0)
                return -ENOMEM;
        a->active = true;
        a->more = h->more;
        a->fence = h->fence;
        a->slots = h->slots;
        a->max_hold = h->max_hold;
        a->max_wait = h->max_wait;
        a->last_position = h->last_position;
        a->last_queued = h->last_queued;
        a->has_command = pidfd >= 0;
        a->command = command;
        a->command_pidfd = TAKE_FD(pidfd);
        /* A reservation (SPEC §3.6) stays a detached one in its pool, if its maker still administers the pool
         * (admin-users= may have changed across the restart, as a lane's ACL may have). */
        bool reserve = streq(h->lane, ENGINE_RESERVE_LANE);
        a->detach = reserve;

        if (reserve && !(m->pool_admin && m->pool_admin(h->pool, s->cred.uid, groups, n_groups, m->userdata))) {
                audit_admin_denied(m->audit, "reserve", h->pool, h->member, s->cred.uid, s->cred.pid);
                _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "pool", h->pool);
                session_reply_error(s, "io.slotbroker.PermissionDenied", p);
                session_acquire_done(s);
                return 0;
        }
        if (!reserve && !m->lane_allows(h->lane, s->cred.uid, groups, n_groups, m->userdata)) {
                audit_denied(s, h->lane, h->job);
                _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "lane", h->lane);
                session_reply_error(s, "io.slotbroker.PermissionDenied", p);
                session_acquire_done(s);
                return 0;
        }
        EngineResume resume = {
                .pool = h->pool,
                .arrival = h->arrival,
                .state = h->state,
                .idle = h->idle,
                .budget = h->budget,
                .remote_id = h->remote_id,
                .lane_rules = h->lane_rules,
        };
        int r = engine_acquire(m->engine,
                               &(EngineAcquire) {
                                       .lane = h->lane,
                                       .reserve_pool = reserve ? h->pool : NULL,
                                       .slots = h->slots,
                                       .max_wait = a->max_wait,
                                       .max_hold = a->max_hold,
                                       .userdata = s,
                                       .resume = &resume,
                                       .labels = (const char *const *) a->labels,
                                       .member = a->member,
                               },
                               now_monotonic(), &a->request);
        if (r == -ENOENT || r == -EINVAL) {
                /* The lane, or every pool big enough (or with members to match), went with the new
                 * configuration. */
                if (r == -ENOENT) {
                        _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "lane", h->lane);
                        session_reply_error(s, "io.slotbroker.NoSuchLane", p);
                } else
                        reply_invalid_parameter(s, invalid_request_parameter(a));
                session_acquire_done(s);
                return 0;
        }
        return r;
}

int session_resume(Session *s, const HandoverAcquire *h) {
        if (h->lease)
                return session_resume_lease(s, h);
        return session_resume_waiter(s, h);
}

static void queued_reply(Session *s, size_t position, size_t queued, JsonText *t) {
        EngineRequest *req = s->acquire.request;
        usec_t budget = engine_request_budget(req);
        json_text_open(t, '{');
        json_text_key(t, "state");
        json_text_string(t, "queued");
        json_text_key(t, "pool");
        json_text_string(t, engine_request_pool(req));
        json_text_key(t, "position");
        json_text_integer(t, (int64_t) position);
        json_text_key(t, "queued");
        json_text_integer(t, (int64_t) queued);
        if (budget != USEC_INFINITY) {
                json_text_key(t, "budgetMs");
                json_text_integer(t, (int64_t) (budget / USEC_PER_MSEC));
        }
        json_text_close(t, '}');
}

/* deferred: the reply may wait for company (connection_reply_text_deferred()). */
static void send_position(Session *s, usec_t now, bool deferred) {
        AcquireCall *a = &s->acquire;
        size_t pos, queued;
        if (engine_request_position(a->request, &pos, &queued) < 0)
                return;
        pos++; /* clients count from 1 */
        if (pos == a->last_position && queued == a->last_queued)
                return;
        _cleanup_(json_text_done) JsonText p;
        json_text_init(&p);
        queued_reply(s, pos, queued, &p);
        if (json_text_result(&p) < 0)
                return;
        int r = deferred ? connection_reply_text_deferred(s->connection, p.data, p.size, true)
                         : connection_reply_text(s->connection, p.data, p.size, true);
        if (r < 0)
                return;
        a->last_position = pos;
        a->last_queued = queued;
}

/* Position updates go round a queue kept in the order waiters were last looked at: the head is always the
 * one whose second is up first. Each run takes at most POSITION_BATCH of them, so ten thousand waiters
 * cost ten thousand small replies a second, spread out,, and never a stall of the loop. */
#define POSITION_BATCH 32

static void position_queue_leave(Session *s) {
        if (list_node_is_linked(&s->acquire.position_node))
                list_unlink(&s->acquire.position_node);
}

static void position_queue_arm(SessionTable *m, usec_t now, bool more_due) {
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

static void position_queue_join(Session *s, usec_t now) {
        SessionTable *m = s->table;
        bool was_empty = list_is_empty(&m->position_queue);
        s->acquire.last_position_check = now;
        list_append(&m->position_queue, &s->acquire.position_node);
        if (was_empty)
                position_queue_arm(m, now, false);
}

static int on_position_timer(sd_event_source *source, uint64_t usec, void *userdata) {
        SessionTable *m = userdata;
        usec_t now = now_monotonic();
        unsigned n = 0;
        ListNode *head;

        while ((head = list_first(&m->position_queue)) && n < POSITION_BATCH) {
                AcquireCall *a = container_of(head, AcquireCall, position_node);
                if (usec_add(a->last_position_check, USEC_PER_SEC) > now)
                        break;
                Session *s = container_of(a, Session, acquire);
                list_unlink(head);
                a->last_position_check = now;
                list_append(&m->position_queue, head);
                /* A client that has not read its last update gets no new one: its output stays bounded. */
                if (connection_get_pending_output(s->connection) == 0)
                        send_position(s, now, false); /* may close s: then it left the queue */
                n++;
        }
        head = list_first(&m->position_queue);
        bool more_due = head && n == POSITION_BATCH &&
                        usec_add(container_of(head, AcquireCall, position_node)->last_position_check, USEC_PER_SEC) <= now;
        position_queue_arm(m, now, more_due);
        return 0;
}

static void notice_queue_arm(SessionTable *m) {
        ListNode *head = list_first(&m->notice_queue);
        if (!head) {
                (void) sd_event_source_set_enabled(m->notice_timer, SD_EVENT_OFF);
                return;
        }
        (void) sd_event_source_set_time(m->notice_timer, container_of(head, AcquireCall, notice_node)->notice_due);
        (void) sd_event_source_set_enabled(m->notice_timer, SD_EVENT_ONESHOT);
}

/* The queue is in due order: every waiter waits the same grace. */
static void notice_queue_join(Session *s, usec_t now) {
        SessionTable *m = s->table;
        AcquireCall *a = &s->acquire;
        if (list_node_is_linked(&a->notice_node))
                return;
        bool was_empty = list_is_empty(&m->notice_queue);
        a->notice_due = usec_add(now, QUEUED_NOTICE_GRACE);
        list_append(&m->notice_queue, &a->notice_node);
        if (was_empty)
                notice_queue_arm(m);
}

static void notice_queue_leave(Session *s) {
        if (!list_node_is_linked(&s->acquire.notice_node))
                return;
        list_unlink(&s->acquire.notice_node);
        if (list_is_empty(&s->table->notice_queue))
                (void) sd_event_source_set_enabled(s->table->notice_timer, SD_EVENT_OFF);
}

static int on_notice_timer(sd_event_source *source, uint64_t usec, void *userdata) {
        SessionTable *m = userdata;
        usec_t now = now_monotonic();
        ListNode *head;

        for (unsigned n = 0; n < NOTICE_BATCH && (head = list_first(&m->notice_queue)); n++) {
                AcquireCall *a = container_of(head, AcquireCall, notice_node);
                if (a->notice_due > now)
                        break;
                list_unlink(head);
                connection_send_deferred(container_of(a, Session, acquire)->connection); /* may close it */
        }
        notice_queue_arm(m); /* a head already due (the batch ran out) runs at the next iteration */
        return 0;
}

static void waiter_count(Session *s, bool on) {
        AcquireCall *a = &s->acquire;
        if (a->counted_waiter == on)
                return;
        UidUsage *u = session_table_uid_usage(s->table, s->cred.uid, on);
        if (u) {
                if (on)
                        u->waiters++;
                else if (u->waiters > 0)
                        u->waiters--;
        }
        a->counted_waiter = on;
}

static void on_queued(SessionTable *m, Session *s, const EngineEvent *ev) {
        if (s->closed)
                return;
        waiter_count(s, true);
        m->changed = true;
        if (s->acquire.more) {
                usec_t now = now_monotonic();
                send_position(s, now, true);
                if (!s->closed) {
                        position_queue_join(s, now);
                        notice_queue_join(s, now);
                }
        }
}

/* The lease's fence deadline, if its pool has one, sent at once ("held"). */
static void session_lease_renew_now(Session *s, const Lease *l) {
        SessionTable *t = s->table;
        if (!t->fence_deadline || !s->acquire.fence || !engine_lease_is_shared(l->engine_lease))
                return;
        usec_t deadline = t->fence_deadline(engine_lease_pool(l->engine_lease), t->userdata);
        usec_t now = now_boottime();
        if (deadline != USEC_INFINITY && deadline > now)
                (void) session_lease_renew(s, deadline - now);
}

/* Sends the grant to the client that asked (SPEC §5: continues while the connection is the life line). */
static void answer_grant(Session *s, Lease *l) {
        AcquireCall *a = &s->acquire;
        _cleanup_(json_text_done) JsonText p;
        bool continues = a->more && !a->detach;
        json_text_init(&p);
        json_text_open(&p, '{');
        json_text_key(&p, "state");
        json_text_string(&p, "granted");
        json_text_key(&p, "lease");
        lease_write_json(l, &p);
        json_text_close(&p, '}');
        if (json_text_result(&p) < 0) {
                log_oom();
                session_close(s);
                return;
        }
        session_reply_text(s, &p, continues);
        a->request = engine_request_unref(a->request);
        if (continues)
                /* A fenced client must not wait for the next heartbeat to learn its deadline: a broker stopped
                 * in between would leave its command running unfenced past the slot's release in Redis. */
                session_lease_renew_now(s, l);
        if (!continues) {
                /* A plain Acquire ends with the grant; a detached lease leaves the connection free. */
                a->active = false;
                if (a->detach)
                        session_acquire_done(s);
        }
}

/* The slots the request asks of pool: its own count, or an also= pool's (SPEC §3.5) for a refusal that names
 * that pool. */
static unsigned request_slots_in(const SessionTable *m, const AcquireCall *a, const char *pool) {
        const LaneConfig *lc = m->config && a->lane ? conf_find_lane(m->config, a->lane) : NULL;
        for (size_t i = 0; lc && pool && i < lc->n_also; i++)
                if (streq(lc->also[i].pool, pool))
                        return lc->also[i].slots;
        return a->slots;
}

static void audit_grant(SessionTable *m, const Lease *l, const LeaseGrant *g) {
        AuditRecord rec = lease_audit_record(l, "granted");
        rec.slots = engine_lease_slots(l->engine_lease, NULL, NULL); /* each also= pool's row: its own (shares) */
        rec.wait = g->wait;
        rec.budget = g->budget;
        rec.idle = g->idle;
        rec.state = queue_state_to_string(g->state);
        rec.selector = g->selector;
        char also[LEASE_ALSO_TEXT_MAX];
        rec.also = lease_also_text(l, also, sizeof also);
        char members[LEASE_ALSO_TEXT_MAX];
        rec.member = lease_members_text(l, members, sizeof members);
        audit_decision(m->audit, &rec);
        lease_audit_shares(l, &rec);
}

/* The lease row is durable (or could not be written, which lease-persistence=best-effort accepts): now the
 * grant may be answered (SPEC §3.4). */
static void on_lease_persisted(SessionTable *m, Lease *l, Session *s, int result) {
        if (s)
                s->acquire.pending = NULL;
        if (!persistence_commit_allows_grant(m->persistence, l->id, result)) {
                /* Never granted unpersisted: give the slots back and refuse. */
                AuditRecord rec = lease_audit_record(l, "unavailable");
                rec.slots = engine_lease_slots(l->engine_lease, NULL, NULL);
                rec.lease = NULL; /* never answered: no lease came of it */
                rec.token = 0;
                rec.reason = "the lease could not be written to the state directory";
                audit_decision(m->audit, &rec);
                persistence_note_refused(m->persistence, rec.reason);
                if (s && !s->closed) {
                        _cleanup_(json_decrefp) json_t *p =
                                json_pack("{s:i, s:s, s:s}", "retryAfterSec", 5, "pool", rec.pool, "reason", "storage");
                        session_reply_error(s, "io.slotbroker.Unavailable", p);
                }
                if (s && s->lease == l)
                        (void) session_unlink_lease(s);
                if (s && !s->closed)
                        session_acquire_done(s);
                lease_discard(l);
                return;
        }
        l->persist_refused = false; /* granted without its row (best-effort): the snapshot that mends the log takes it */
        audit_grant(m, l, &l->grant);
        if (s && !s->closed)
                answer_grant(s, l);
        else if (l->grant.holder_gone)
                (void) lease_holder_gone(l);
}

static void on_granted(SessionTable *m, Session *s, const EngineEvent *ev) {
        AcquireCall *a = &s->acquire;
        Lease *l;

        session_waiter_left(s);
        int r = lease_new(m->leases, ev->lease, s->closed ? NULL : s, s->cred.uid, s->cred.pid, a->job, a->detach,
                          a->has_command ? &a->command : NULL, TAKE_FD(a->command_pidfd), &l);
        if (r < 0) {
                log_error_errno(r, "Failed to record a lease: %m");
                engine_lease_release(ev->lease, now_monotonic());
                if (!s->closed) {
                        _cleanup_(json_decrefp) json_t *p =
                                json_pack("{s:i, s:s, s:s}", "retryAfterSec", 1, "pool", ev->pool, "reason", "internal");
                        session_reply_error(s, "io.slotbroker.Unavailable", p);
                        session_acquire_done(s);
                }
                return;
        }
        a->has_command = false;
        l->grant = (LeaseGrant) {
                .wait = ev->wait,
                .budget = ev->queued ? ev->budget : USEC_INFINITY,
                .idle = ev->queued ? ev->idle : USEC_INFINITY,
                .state = ev->queued ? ev->state : QUEUE_STATE_NONE,
                .selector = a->selector ? strdup(a->selector) : NULL, /* lost to -ENOMEM: the audit goes without */
        };

        if (s->closed) {
                /* Gone between the decision and now: granted all the same once its row is written (a token
                 * audited before it could be given out again after a crash), then living on only if its
                 * command does (on_lease_persisted()). */
                l->grant.holder_gone = true;
                lease_persist(l, NULL);
                return;
        }
        if (!a->detach)
                s->lease = l; /* the lease's side: lease_new() */
        a->pending = l;
        lease_persist(l, s);
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

/* Why a pool is unavailable, for the client: the pool's word, else drained, removed by a reload, or left with
 * nothing for the request by one (the engine says "reload" itself for a lane whose labels= or also= changed,
 * and a shared pool for what an adopted reload refuses: shared_decision_reason()). An in-process pool gives no
 * word for the last two and a drain: one that is not drained as it refuses refused for a reload (its lane
 * gone, or every member its selector could take). A shared pool's drained flag follows Redis's replies, perhaps
 * after its refusals: a refusal without a word is a drain's there. */
static const char *unavailable_reason(const SessionTable *m, const EngineEvent *ev) {
        if (ev->reason)
                return ev->reason;
        const PoolConfig *pc = conf_find_pool(m->config, ev->pool);
        if (!pc)
                return "removed";
        if (!pc->backend && !engine_pool_is_drained(m->engine, ev->pool))
                return "reload";
        return "drained";
}

/* The same, for the journal. */
static const char *unavailable_reason_text(const char *reason) {
        static const struct {
                const char *reason, *text;
        } table[] = {
                { "drained", "the pool is drained" },
                { "removed", "the pool was removed by a reload" },
                { "not-quarantined", "a health job asked for members that are not quarantined" },
                { "member-drained", "a health job asked for quarantined members that are drained" },
                { "reload", "a reload left the pool nothing this request can use (its lane, or the members it asked for, "
                            "are gone; its lane's labels= or also= changed; or it asks for more slots than the pool's "
                            "limit= or its lane's max-in-use= and the other lanes' reserve= now allow)" },
                { "backend", "the pool's backend cannot be reached" },
                { "rules", "the pool's rules differ from those its backend enforces" },
                { "recovery", "the pool's backend is recovering" },
                { "replicas", "too few Redis replicas acknowledged the grant (backend-min-replicas)" },
                { "unconfirmed", "the Sentinels cannot confirm the pool's primary" },
                { "bad-reply", "the pool's backend answered what its scripts never write" },
        };
        for (size_t i = 0; i < ELEMENTSOF(table); i++)
                if (streq(table[i].reason, reason))
                        return table[i].text;
        return reason;
}

static void on_refused(SessionTable *m, Session *s, const EngineEvent *ev) {
        AcquireCall *a = &s->acquire;

        session_waiter_left(s);
        m->changed = true;

        AuditRecord rec = AUDIT_RECORD_INIT;
        rec.decision = refusal_to_string(ev->refusal);
        rec.pool = ev->pool;
        rec.lane = ev->lane;
        rec.job = a->job;
        rec.selector = a->selector;
        rec.slots = request_slots_in(m, a, ev->pool);
        rec.wait = ev->wait;
        rec.budget = ev->queued ? ev->budget : USEC_INFINITY;
        rec.idle = ev->queued ? ev->idle : USEC_INFINITY;
        rec.state = ev->queued ? queue_state_to_string(ev->state) : NULL;
        rec.uid = s->cred.uid;
        rec.pid = s->cred.pid;
        rec.retry_after_sec = ev->retry_after_sec;
        if (ev->refusal == REFUSAL_UNAVAILABLE)
                rec.reason = unavailable_reason_text(unavailable_reason(m, ev));
        else if (ev->refusal == REFUSAL_BUSY && streq_ptr(ev->reason, "cooldown"))
                rec.reason = "the slots it needs are resting (cooldown=)";
        audit_decision(m->audit, &rec);

        if (s->closed)
                return;
        _cleanup_(json_decrefp) json_t *p =
                json_pack("{s:I, s:s?}", "retryAfterSec", (json_int_t) ev->retry_after_sec, "pool", ev->pool);
        if (p && (ev->refusal == REFUSAL_TIMEOUT || ev->refusal == REFUSAL_SHED))
                json_object_set_new(p, "waitedMs", json_integer((json_int_t) (ev->wait / USEC_PER_MSEC)));
        if (p && ev->refusal == REFUSAL_UNAVAILABLE)
                json_object_set_new(p, "reason", json_string(unavailable_reason(m, ev)));
        if (p && ev->refusal == REFUSAL_BUSY && ev->reason)
                json_object_set_new(p, "reason", json_string(ev->reason));
        session_reply_error(s, refusal_error(ev->refusal), p);
        session_acquire_done(s);
}

/* The waiter leaves the queue (granted, refused or withdrawn): no more position updates, and its uid has one
 * waiter less. The only place that does either for a waiter that ends. */
static void session_waiter_left(Session *s) {
        waiter_count(s, false);
        position_queue_leave(s);
        notice_queue_leave(s);
}

bool session_waiter_withdraw(Session *s, SessionWithdraw why) {
        AcquireCall *a = &s->acquire;
        if (!session_is_waiting(s)) {
                if (why == SESSION_WITHDRAW_GONE && engine_request_is_in_flight(a->request))
                        /* A pool that decides later has not answered: it is told to forget the request. */
                        engine_request_cancel(a->request, now_monotonic());
                session_waiter_left(s); /* a no-op unless the engine's answer is still on its way */
                return false;
        }
        usec_t now = now_monotonic();
        AuditRecord rec = AUDIT_RECORD_INIT;
        rec.pool = engine_request_pool(a->request);
        rec.lane = a->lane;
        rec.job = a->job;
        rec.selector = a->selector;
        rec.slots = a->slots;
        rec.wait = usec_sub_unsigned(now, engine_request_arrival(a->request));
        rec.budget = engine_request_budget(a->request);
        rec.uid = s->cred.uid;
        rec.pid = s->cred.pid;
        bool reserve = streq(a->lane, ENGINE_RESERVE_LANE);
        if (why == SESSION_WITHDRAW_GONE)
                rec.decision = "cancelled";
        else if (why == SESSION_WITHDRAW_DENIED)
                rec.decision = "denied";
        else {
                /* The client is refused (Unavailable): recorded as that refusal, with the reason. */
                rec.decision = "unavailable";
                rec.retry_after_sec = 1;
                rec.reason = "cancelled by an administrator";
        }
        if (why == SESSION_WITHDRAW_DENIED && reserve)
                /* As session_resume() records a reservation whose maker no longer administers the pool. */
                audit_admin_denied(s->table->audit, "reserve", rec.pool, a->member, s->cred.uid, s->cred.pid);
        else
                audit_decision(s->table->audit, &rec);
        engine_request_cancel(a->request, now);
        session_waiter_left(s);
        if (why == SESSION_WITHDRAW_CANCELLED) {
                _cleanup_(json_decrefp) json_t *p = json_pack("{s:i, s:s, s:s}", "retryAfterSec", 1, "pool",
                                                              rec.pool, "reason", "cancelled");
                session_reply_error(s, "io.slotbroker.Unavailable", p);
                session_acquire_done(s);
        } else if (why == SESSION_WITHDRAW_DENIED) {
                _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", reserve ? "pool" : "lane",
                                                              reserve ? rec.pool : a->lane);
                session_reply_error(s, "io.slotbroker.PermissionDenied", p);
                session_acquire_done(s);
        }
        return true;
}

static bool session_waits_denied(const Session *s) {
        const AcquireCall *a = &s->acquire;
        SessionTable *t = s->table;
        if (s->closed || !session_is_waiting(s))
                return false;
        const gid_t *groups;
        size_t n_groups = connection_get_groups(s->connection, &groups);
        if (streq(a->lane, ENGINE_RESERVE_LANE)) {
                /* A reservation is its pool's administrators' (the pool is configured: it waits there). */
                const char *pool = engine_request_pool(a->request);
                return t->pool_admin && !t->pool_admin(pool, s->cred.uid, groups, n_groups, t->userdata);
        }
        if (!conf_find_lane(t->config, a->lane))
                return false; /* a removed lane's waiters its pools refused already (engine_configure()) */
        return !t->lane_allows(a->lane, s->cred.uid, groups, n_groups, t->userdata);
}

unsigned session_table_withdraw_denied(SessionTable *t) {
        /* Collect first: answering a waiter runs the calls it pipelined, which may close other connections. */
        size_t n = 0;
        list_foreach(node, &t->sessions)
                n += session_waits_denied(container_of(node, Session, node));
        if (n == 0)
                return 0;
        _cleanup_free_ Session **denied = calloc(n, sizeof(Session *));
        if (!denied) {
                log_oom();
                return 0;
        }
        size_t k = 0;
        list_foreach(node, &t->sessions) {
                Session *s = container_of(node, Session, node);
                if (k < n && session_waits_denied(s))
                        denied[k++] = s;
        }
        unsigned withdrawn = 0;
        for (size_t i = 0; i < k; i++)
                if (!denied[i]->closed && session_waiter_withdraw(denied[i], SESSION_WITHDRAW_DENIED))
                        withdrawn++;
        return withdrawn;
}

void session_on_lease_event(SessionTable *m, const LeaseEvent *ev) {
        switch (ev->type) {
        case LEASE_EVENT_PERSISTED:
                on_lease_persisted(m, ev->lease, ev->waiter, ev->result);
                break;
        case LEASE_EVENT_CUT: {
                /* The revoke grace is over and the holder has not let go: its connection goes, and the lease
                 * with it (or it becomes overdue while its command runs). */
                Session *h = lease_get_holder(ev->lease);
                if (h)
                        session_close(h);
                break;
        }
        default:
                break;
        }
}

void session_on_engine_event(SessionTable *m, const EngineEvent *ev) {
        switch (ev->type) {
        case ENGINE_EVENT_QUEUED:
                if (ev->userdata)
                        on_queued(m, ev->userdata, ev);
                break;
        case ENGINE_EVENT_GRANTED:
                /* A request handed to the next brokerd (session_on_disconnect()), granted while this one stops:
                 * the next one asks for it again, in a shared pool under its rid, which Redis answers with this
                 * very grant. It is not recorded here, nor ended for want of a holder: that would free it in
                 * Redis while the answer kept for the rid still says granted. */
                if (ev->userdata)
                        on_granted(m, ev->userdata, ev);
                break;
        case ENGINE_EVENT_REFUSED:
                if (ev->userdata)
                        on_refused(m, ev->userdata, ev);
                break;
        case ENGINE_EVENT_REVOKE:
                if (ev->userdata && ev->lost)
                        session_lease_lose(ev->userdata, ev->reason ? ev->reason : "lost");
                else if (ev->userdata)
                        session_lease_revoke(ev->userdata, ev->reason ? ev->reason : "max-hold");
                break;
        case ENGINE_EVENT_CONGESTION:
                audit_congestion(m->audit, ev->pool, ev->congested, ev->idle);
                m->changed = true;
                break;
        case ENGINE_EVENT_DRAIN: {
                usec_t until = ev->until;
                if (until != USEC_INFINITY) /* as it was given, else monotonic to realtime, for people */
                        until = ev->until_realtime ?: usec_mono_to_real(until, now_monotonic(), now_realtime());
                audit_drain(m->audit, ev->pool, ev->member, ev->drained, ev->job, ev->note, until, ev->expired);
                m->changed = true;
                break;
        }
        case ENGINE_EVENT_MEMBER:
                audit_member(m->audit, ev->pool, ev->member, ev->quarantined, ev->job, ev->exit_status, ev->note);
                m->changed = true;
                break;
        default:
                break;
        }
}
