/* SPDX-License-Identifier: MIT */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <syslog.h>
#include <time.h>

#include "audit.h"
#include "conf.h"
#include "history.h"
#include "log.h"
#include "metrics.h"

/* One MESSAGE_ID per decision, fixed forever: the journal catalog (units/slotbroker.catalog) explains each. */
static const struct {
        const char *decision;
        const char *message_id;
        const char *tag;
        int priority;
        bool routine; /* journaled only with audit = all, unless a reason says it is out of the ordinary */
} decisions[] = {
        { "granted", "4f244161cad643b4947fb481e7eb36ad", "LEASE_GRANTED", LOG_INFO, true },
        { "released", "07775bc3af6047d6ab0d9bd49d41b10b", "LEASE_RELEASED", LOG_INFO, true },
        { "cancelled", "7743832e4df5428a86b9c6a1c15c8b7c", "QUEUE_CANCELLED", LOG_INFO, true },
        { "busy", "a1a991c3c12e4d2cb5c56b054695c258", "QUEUE_BUSY", LOG_NOTICE, false },
        { "full", "cc15246e1da14187bfc22c683a0798e9", "QUEUE_FULL", LOG_WARNING, false },
        { "timeout", "e21062bdaea848b7a9abefd8bb4f899d", "QUEUE_TIMEOUT", LOG_WARNING, false },
        { "shed", "1f7f11e9eec84e6d9929be16c88a5ea5", "QUEUE_SHED", LOG_WARNING, false },
        { "unavailable", "c2a3df104ea5463a815a6ad35366dbf3", "QUEUE_UNAVAILABLE", LOG_WARNING, false },
        { "denied", "3ffb3355927943a2afe90967a212dcc1", "LANE_DENIED", LOG_WARNING, false },
        { "revoked", "31753500d52c47f7851ae09419896386", "LEASE_REVOKED", LOG_NOTICE, false },
        { "overdue", "75a490370b904c1cb50fe100bb7963ca", "LEASE_OVERDUE", LOG_WARNING, false },
        { "restored", "786c4bac1ab141be8e629ad2d654d1d7", "LEASE_RESTORED", LOG_NOTICE, false },
};
#define MESSAGE_ID_CONGESTED "bea33a9df3d140f5b7d01ea4bf9aca7e"
#define MESSAGE_ID_UNCONGESTED "bdc54e22d19e4e57a561169ac2768548"
#define MESSAGE_ID_RELOAD "19905e0f437b4ad0a532f312640d8ed4"
#define MESSAGE_ID_POOL_MOVED "8f7ad51379634787b3aa0027afe18a02"
/* Shared pools: one per SharedNoticeType. */
static const struct {
        const char *message_id;
        const char *tag;
        int priority;
} backend_notices[_SHARED_NOTICE_TYPE_MAX] = {
        [SHARED_NOTICE_BACKEND_LOST] = { "df893d6975254fed9706386c78f44932", "BACKEND_LOST", LOG_WARNING },
        [SHARED_NOTICE_BACKEND_REGAINED] = { "185ca0c44d094851aac57dcd16b4a003", "BACKEND_REGAINED", LOG_NOTICE },
        [SHARED_NOTICE_NODE_EXPIRED] = { "39d3339ff7be4724b909055d88c4a041", "NODE_EXPIRED", LOG_WARNING },
        [SHARED_NOTICE_RULES_MISMATCH] = { "cf754fdc103b4be08cdd4883666573ce", "RULES_MISMATCH", LOG_ERR },
        [SHARED_NOTICE_RULES_AGREED] = { "316dced49d0942a59689462290195443", "RULES_AGREED", LOG_NOTICE },
        [SHARED_NOTICE_RECOVERY] = { "cb105e38e9cd4f4baea8776cbb22af5f", "BACKEND_RECOVERY", LOG_WARNING },
        [SHARED_NOTICE_REFUSED] = { "397937a0387b403fa1ad6192cc5d3e21", "BACKEND_REFUSED", LOG_ERR },
        [SHARED_NOTICE_FENCED] = { "f046efe4f321444484acfa458fafc1f5", "BACKEND_FENCED", LOG_ERR },
        [SHARED_NOTICE_UNCONFIRMED] = { "b48f17ea6ab04443961b1c922bc0c388", "BACKEND_UNCONFIRMED", LOG_WARNING },
        [SHARED_NOTICE_CONFIRMED] = { "f622d19d64a0455cb5d6d9271c4ea1fb", "BACKEND_CONFIRMED", LOG_NOTICE },
        [SHARED_NOTICE_IDENTITY] = { "7d32ca6ff3ed443f9b14b440e1e6d7f9", "NODE_ID_CONFLICT", LOG_ERR },
        [SHARED_NOTICE_IDENTITY_CLEARED] = { "5229ae8fe7d84a67804a9dd2586e10bd", "NODE_ID_CLEARED", LOG_NOTICE },
        [SHARED_NOTICE_BAD_INPUT] = { "95f4f8c6b4eb4851b91f091a6bc7d501", "BACKEND_BAD_INPUT", LOG_WARNING },
};
#define MESSAGE_ID_SUPPRESSED "45e9e5b1aa044c65a4d63010ef89a05b"
#define MESSAGE_ID_FAILOVER "4d01c4d86fbd4354b88b48aa1309a629"
#define MESSAGE_ID_QUARANTINED "096728e987954e00b546875ad4d4702f"
#define MESSAGE_ID_RESTORED "1c4072a236bf4467b046510ca437cf58"
#define MESSAGE_ID_ADMIN_DENIED "ce066070d74145a5b694680bb79d417d"
#define MESSAGE_ID_DRAINED "840f5480322440e6ae1f59eca753a42b"
#define MESSAGE_ID_UNDRAINED "9745f6d228a9456e9c5188821c7db415"

static int decision_index(const char *decision) {
        for (size_t i = 0; i < ELEMENTSOF(decisions); i++)
                if (streq(decisions[i].decision, decision))
                        return (int) i;
        return -1;
}

void audit_init(Audit *a, sd_event *event, Metrics *metrics, const char *journal_socket) {
        *a = (Audit) { .backlog_fd = -EBADF, .event = event, .metrics = metrics };
        journal_writer_init(&a->journal, journal_socket);
}

void audit_set_history(Audit *a, History *history) {
        a->history = history;
}

void audit_set_level(Audit *a, AuditLevel level) {
        a->level = level;
}

void audit_done(Audit *a) {
        a->backlog_source = sd_event_source_disable_unref(a->backlog_source);
        journal_writer_done(&a->journal);
}

static void audit_watch_backlog(Audit *a);

static int on_journal_writable(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        Audit *a = userdata;
        journal_writer_flush(&a->journal);
        audit_watch_backlog(a);
        return 0;
}

static void audit_watch_backlog(Audit *a) {
        int fd = a->journal.n_backlog > 0 ? a->journal.fd : -EBADF;

        if (fd != a->backlog_fd) {
                /* journald restarted: the writer reconnected on another fd. */
                a->backlog_source = sd_event_source_disable_unref(a->backlog_source);
                a->backlog_fd = -EBADF;
                if (fd >= 0 && sd_event_add_io(a->event, &a->backlog_source, fd, EPOLLOUT, on_journal_writable, a) >= 0)
                        a->backlog_fd = fd;
                return;
        }
        if (a->backlog_source)
                (void) sd_event_source_set_enabled(a->backlog_source, fd >= 0 ? SD_EVENT_ON : SD_EVENT_OFF);
}

/* Fields are formatted into one buffer; iovecs point into it. */
typedef struct Fields {
        char buf[4096];
        size_t used;
        struct iovec iov[32];
        size_t n;
} Fields;

_printf_(2, 3) static void field(Fields *f, const char *fmt, ...) {
        if (f->n >= ELEMENTSOF(f->iov) || f->used >= sizeof f->buf)
                return;
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(f->buf + f->used, sizeof f->buf - f->used, fmt, ap);
        va_end(ap);
        if (k < 0)
                return;
        size_t len = MIN((size_t) k, sizeof f->buf - f->used - 1);
        f->iov[f->n++] = (struct iovec) { .iov_base = f->buf + f->used, .iov_len = len };
        f->used += len + 1;
}

static void journal_send(Audit *a, Fields *f) {
        field(f, "SYSLOG_IDENTIFIER=brokerd");
        int r = journal_writer_send(&a->journal, f->iov, f->n);
        if (r == 1)
                audit_watch_backlog(a); /* queued behind a full socket: sent when it drains */
        if (r != -ENOTCONN)
                return;
        /* Without journald (brokerd started by hand), the message goes to stderr: still seen, still once. */
        if (f->n > 0 && f->iov[0].iov_len > 8 && strncmp(f->iov[0].iov_base, "MESSAGE=", 8) == 0)
                log_info("%.*s", (int) f->iov[0].iov_len - 8, (const char *) f->iov[0].iov_base + 8);
}

static const char *usec_str(char *buf, size_t size, usec_t t) {
        return timespan_format(buf, size, t);
}

static void compose_message(const AuditRecord *r, const char *tag, char *buf, size_t size) {
        char w[TIMESPAN_MAX], b[TIMESPAN_MAX], i[TIMESPAN_MAX];
        const char *d = r->decision, *pool = r->pool ?: "?", *lane = r->lane ?: "?";

        if (streq(d, "busy"))
                snprintf(buf, size, "[%s] Request of lane %s refused: no room in pool %s (retry after %u s)", tag, lane,
                         pool, r->retry_after_sec);
        else if (streq(d, "full"))
                snprintf(buf, size, "[%s] Request of lane %s refused: the queue of pool %s is full (retry after %u s)",
                         tag, lane, pool, r->retry_after_sec);
        else if (streq(d, "timeout"))
                snprintf(buf, size, "[%s] Request of lane %s refused after waiting %s on pool %s: its budget of %s ran out%s%s",
                         tag, lane, usec_str(w, sizeof w, r->wait), pool, usec_str(b, sizeof b, r->budget),
                         r->state ? " while " : "", r->state ?: "");
        else if (streq(d, "shed"))
                snprintf(buf, size,
                         "[%s] Request of lane %s shed after %s on pool %s: saturated (no fast admission for %s), budget %s",
                         tag, lane, usec_str(w, sizeof w, r->wait), pool, usec_str(i, sizeof i, r->idle),
                         usec_str(b, sizeof b, r->budget));
        else if (streq(d, "unavailable"))
                snprintf(buf, size, "[%s] Request of lane %s refused on pool %s: %s", tag, lane, pool,
                         r->reason ?: "the pool is drained or was removed");
        else if (streq(d, "denied"))
                snprintf(buf, size, "[%s] uid %d may not use lane %s", tag, (int) r->uid, lane);
        else if (r->lease)
                snprintf(buf, size, "[%s] Lease %s of pool %s (lane %s%s%s) %s%s%s", tag, r->lease, pool, lane,
                         r->job ? ", job " : "", r->job ?: "", d, r->reason ? ": " : "", r->reason ?: "");
        else
                snprintf(buf, size, "[%s] Request of lane %s on pool %s %s%s%s", tag, lane, pool, d,
                         r->reason ? ": " : "", r->reason ?: "");
}

static void journal_decision(Audit *a, const AuditRecord *r, int k) {
        Fields f = { .n = 0 };
        char msg[1024];
        compose_message(r, decisions[k].tag, msg, sizeof msg);
        field(&f, "MESSAGE=%s", msg);
        field(&f, "MESSAGE_ID=%s", decisions[k].message_id);
        field(&f, "PRIORITY=%d", decisions[k].priority);
        field(&f, "SLOT_DECISION=%s", r->decision);
        if (r->pool)
                field(&f, "SLOT_POOL=%s", r->pool);
        if (r->lane)
                field(&f, "SLOT_LANE=%s", r->lane);
        if (r->job)
                field(&f, "SLOT_JOB=%s", r->job);
        if (r->lease)
                field(&f, "SLOT_LEASE=%s", r->lease);
        if (r->token)
                field(&f, "SLOT_TOKEN=%llu", (unsigned long long) r->token);
        if (r->wait != USEC_INFINITY)
                field(&f, "SLOT_WAIT_USEC=%llu", (unsigned long long) r->wait);
        if (r->hold != USEC_INFINITY)
                field(&f, "SLOT_HOLD_USEC=%llu", (unsigned long long) r->hold);
        if (r->budget != USEC_INFINITY)
                field(&f, "SLOT_BUDGET_USEC=%llu", (unsigned long long) r->budget);
        if (r->idle != USEC_INFINITY)
                field(&f, "SLOT_IDLE_USEC=%llu", (unsigned long long) r->idle);
        if (r->state)
                field(&f, "SLOT_STATE=%s", r->state);
        if (r->uid != (uid_t) -1)
                field(&f, "SLOT_CLIENT_UID=%u", (unsigned) r->uid);
        if (r->pid > 0)
                field(&f, "SLOT_CLIENT_PID=%d", (int) r->pid);
        if (r->retry_after_sec)
                field(&f, "SLOT_RETRY_AFTER_SEC=%u", r->retry_after_sec);
        if (r->reason)
                field(&f, "SLOT_REASON=%s", r->reason);
        if (r->selector)
                field(&f, "SLOT_SELECTOR=%s", r->selector);
        if (r->also)
                field(&f, "SLOT_ALSO=%s", r->also);
        if (r->exit_status >= 0)
                field(&f, "SLOT_EXIT_STATUS=%d", r->exit_status);
        journal_send(a, &f);
}

/* A storm of one kind is summarised: AUDIT_BURST entries per window, then a count. */
static bool audit_admit(Audit *a, int k, usec_t now) {
        AuditLimit *l = &a->limits[k];
        if (now - l->window_start >= AUDIT_WINDOW_USEC) {
                l->window_start = now;
                l->in_window = 0;
        }
        if (l->in_window < AUDIT_BURST) {
                l->in_window++;
                return true;
        }
        l->suppressed++;
        return false;
}

static void journal_suppressed(Audit *a, int k, unsigned long n) {
        Fields f = { .n = 0 };
        field(&f, "MESSAGE=[%s] %lu further %s decisions not journaled individually in the last %llus (see history)",
              decisions[k].tag, n, decisions[k].decision, (unsigned long long) (AUDIT_WINDOW_USEC / USEC_PER_SEC));
        field(&f, "MESSAGE_ID=%s", MESSAGE_ID_SUPPRESSED);
        field(&f, "PRIORITY=%d", LOG_NOTICE);
        field(&f, "SLOT_DECISION=%s", decisions[k].decision);
        field(&f, "SLOT_SUPPRESSED=%lu", n);
        journal_send(a, &f);
}

void audit_tick(Audit *a) {
        usec_t now = now_monotonic();
        for (size_t k = 0; k < ELEMENTSOF(decisions); k++) {
                AuditLimit *l = &a->limits[k];
                if (l->suppressed > 0 && now - l->window_start >= AUDIT_WINDOW_USEC) {
                        journal_suppressed(a, (int) k, l->suppressed);
                        l->suppressed = 0;
                }
        }
        journal_writer_flush(&a->journal);
        audit_watch_backlog(a);
        unsigned long dropped = journal_writer_take_dropped(&a->journal);
        if (dropped > 0) {
                /* Said on stderr, which journald reads through another path, and counted for metrics. */
                a->journal_dropped_total += dropped;
                log_warning("journald did not keep up: %lu audit entries could not be sent (history has them).",
                            dropped);
        }
}

bool audit_is_idle(const Audit *a) {
        for (size_t k = 0; k < ELEMENTSOF(decisions); k++)
                if (a->limits[k].suppressed > 0)
                        return false;
        return a->journal.n_backlog == 0;
}

/* A request's job label is any text its client sent: the journal and the history keep it as one line, each control
 * character (C1 included) and U+2028/U+2029 as '?' (conf_text_sanitize(), as a quarantine keeps it), so that no
 * label forges a line, retitles a terminal or makes journalctl show the entry as "[blob data]". A copy (*ret_job,
 * the caller's to free) only for a label that needs it; out of memory the record goes without its job. */
static const AuditRecord *record_one_line(const AuditRecord *r, AuditRecord *copy, char **ret_job) {
        *ret_job = NULL;
        if (conf_text_is_one_line(r->job))
                return r;
        *copy = *r;
        copy->job = *ret_job = conf_text_sanitize(strdup(r->job));
        return copy;
}

void audit_decision(Audit *a, const AuditRecord *record) {
        int k = decision_index(record->decision);
        if (k < 0)
                return;
        AuditRecord copy;
        _cleanup_free_ char *job = NULL;
        const AuditRecord *r = record_one_line(record, &copy, &job);
        if (a->metrics)
                metrics_record(a->metrics, r);
        if (a->history)
                history_append(a->history, r, now_realtime());
        /* A release at the end of a restart's recovery, or after a revocation, is not routine: its reason says why.
         * Nor is a reservation's grant or end: a person's, ahead of every waiting job, audited as a drain is
         * (SPEC §3.6). */
        bool reservation = r->lane && streq(r->lane, ENGINE_RESERVE_LANE);
        if (decisions[k].routine && !r->reason && !reservation && a->level != AUDIT_ALL)
                return;
        if (audit_admit(a, k, now_monotonic()))
                journal_decision(a, r, k);
}

void audit_decision_share(Audit *a, const AuditRecord *record) {
        if (decision_index(record->decision) < 0)
                return;
        AuditRecord copy;
        _cleanup_free_ char *job = NULL;
        const AuditRecord *r = record_one_line(record, &copy, &job);
        if (a->metrics)
                metrics_record(a->metrics, r);
        if (a->history)
                history_append(a->history, r, now_realtime());
}

void audit_congestion(Audit *a, const char *pool, bool congested, usec_t idle) {
        Fields f = { .n = 0 };
        char i[TIMESPAN_MAX];
        timespan_format(i, sizeof i, idle);
        if (congested)
                field(&f, "MESSAGE=[POOL_CONGESTED] Pool %s is congested: no room, and no fast admission for %s", pool, i);
        else
                field(&f, "MESSAGE=[POOL_UNCONGESTED] Pool %s is no longer congested", pool);
        field(&f, "MESSAGE_ID=%s", congested ? MESSAGE_ID_CONGESTED : MESSAGE_ID_UNCONGESTED);
        field(&f, "PRIORITY=%d", congested ? LOG_WARNING : LOG_NOTICE);
        field(&f, "SLOT_POOL=%s", pool);
        field(&f, "SLOT_CONGESTED=%d", congested);
        field(&f, "SLOT_IDLE_USEC=%llu", (unsigned long long) idle);
        journal_send(a, &f);
}

/* A member's event (a quarantine, a drain) as a history row: the member named as a request's selector names
 * it (@NAME), so that History shows it so. */
static void history_append_member(Audit *a, AuditRecord *r, const char *member) {
        char selector[1 + CONF_NAME_MAX + 1];
        snprintf(selector, sizeof selector, "@%s", member ?: "");
        r->member = member;
        r->selector = member ? selector : NULL;
        if (a->history)
                history_append(a->history, r, now_realtime());
}

void audit_member(Audit *a, const char *pool, const char *member, bool quarantined, const char *job, int exit_status,
                  const char *reason) {
        Fields f = { .n = 0 };
        char st[32] = "";
        if (exit_status >= 0)
                snprintf(st, sizeof st, " (exit status %d)", exit_status);
        if (quarantined)
                field(&f, "MESSAGE=[QUARANTINED] Member %s of pool %s is quarantined%s%s%s%s%s: only health lanes get it until it is restored",
                      member, pool, job ? (exit_status >= 0 ? " after job " : " by ") : "", job ?: "", st,
                      reason ? ": " : "", reason ?: "");
        else
                field(&f, "MESSAGE=[RESTORED] Member %s of pool %s is restored%s%s%s: granted to every lane again", member,
                      pool, job ? (exit_status >= 0 ? " by health job " : " by ") : "", job ?: "", st);
        field(&f, "MESSAGE_ID=%s", quarantined ? MESSAGE_ID_QUARANTINED : MESSAGE_ID_RESTORED);
        field(&f, "PRIORITY=%d", quarantined ? LOG_WARNING : LOG_NOTICE);
        field(&f, "SLOT_POOL=%s", pool);
        field(&f, "SLOT_MEMBER=%s", member);
        field(&f, "SLOT_MEMBER_STATE=%s", quarantined ? "quarantined" : "restored");
        if (job)
                field(&f, "SLOT_JOB=%s", job);
        if (exit_status >= 0)
                field(&f, "SLOT_EXIT_STATUS=%d", exit_status);
        if (reason)
                field(&f, "SLOT_REASON=%s", reason);
        journal_send(a, &f);

        /* The history row (SPEC §3.6, usage per member): the report counts quarantines per member. */
        AuditRecord r = AUDIT_RECORD_INIT;
        r.decision = quarantined ? "quarantined" : "unquarantined";
        r.pool = pool;
        r.job = job;
        r.reason = reason;
        r.exit_status = exit_status;
        history_append_member(a, &r, member);
}

void audit_drain(Audit *a, const char *pool, const char *member, bool drained, const char *who, const char *reason,
                 usec_t until_realtime, bool expired) {
        Fields f = { .n = 0 };
        char until[64] = "";
        if (until_realtime != USEC_INFINITY) {
                time_t t = (time_t) (until_realtime / USEC_PER_SEC);
                struct tm tm;
                if (gmtime_r(&t, &tm))
                        (void) strftime(until, sizeof until, "%Y-%m-%dT%H:%M:%SZ", &tm);
        }
        const char *what = member ? "Member " : "Pool ";
        if (drained)
                field(&f, "MESSAGE=[DRAINED] %s%s%s%s drained%s%s%s%s%s%s: nothing new is granted there", what,
                      member ?: pool, member ? " of pool " : "", member ? pool : "", who ? " by " : "", who ?: "",
                      reason ? ": " : "", reason ?: "", *until ? ", until " : "", until);
        else
                field(&f, "MESSAGE=[UNDRAINED] %s%s%s%s undrained%s%s%s: it grants again", what, member ?: pool,
                      member ? " of pool " : "", member ? pool : "", expired ? " (its --until came)" : "",
                      who ? " by " : "", who ?: "");
        field(&f, "MESSAGE_ID=%s", drained ? MESSAGE_ID_DRAINED : MESSAGE_ID_UNDRAINED);
        field(&f, "PRIORITY=%d", LOG_NOTICE);
        field(&f, "SLOT_DECISION=%s", drained ? "drained" : "undrained");
        field(&f, "SLOT_POOL=%s", pool);
        if (member)
                field(&f, "SLOT_MEMBER=%s", member);
        if (who)
                field(&f, "SLOT_JOB=%s", who);
        if (reason)
                field(&f, "SLOT_REASON=%s", reason);
        if (until_realtime != USEC_INFINITY)
                field(&f, "SLOT_UNTIL_USEC=%llu", (unsigned long long) until_realtime);
        journal_send(a, &f);

        /* The history row: time is since, job who, reason why, until its own column (schema 8; an undrain by
         * its until: that until, and no reason). */
        AuditRecord r = AUDIT_RECORD_INIT;
        r.decision = drained ? "drained" : "undrained";
        r.pool = pool;
        r.job = who;
        r.reason = reason;
        r.until = until_realtime;
        history_append_member(a, &r, member);
}

void audit_admin_denied(Audit *a, const char *action, const char *pool, const char *member, uid_t uid, pid_t pid) {
        Fields f = { .n = 0 };
        field(&f, "MESSAGE=[ADMIN_DENIED] uid %u may not %s %s%s%s: neither root nor in the pool's admin-users=/admin-groups=",
              (unsigned) uid, action, member ?: "pool ", member ? " of pool " : "", pool);
        field(&f, "MESSAGE_ID=%s", MESSAGE_ID_ADMIN_DENIED);
        field(&f, "PRIORITY=%d", LOG_WARNING);
        field(&f, "SLOT_DECISION=denied");
        field(&f, "SLOT_ACTION=%s", action);
        field(&f, "SLOT_POOL=%s", pool);
        if (member)
                field(&f, "SLOT_MEMBER=%s", member);
        field(&f, "SLOT_CLIENT_UID=%u", (unsigned) uid);
        field(&f, "SLOT_CLIENT_PID=%d", (int) pid);
        journal_send(a, &f);
}

void audit_backend_failover(Audit *a, const char *url, const char *previous, const char *primary) {
        Fields f = { .n = 0 };
        field(&f, "MESSAGE=[BACKEND_FAILOVER] The Sentinels of %s moved its primary from %s to %s", url,
              previous ?: "?", primary ?: "?");
        field(&f, "MESSAGE_ID=%s", MESSAGE_ID_FAILOVER);
        field(&f, "PRIORITY=%d", LOG_WARNING);
        field(&f, "SLOT_BACKEND=%s", url);
        field(&f, "SLOT_PRIMARY=%s", primary ?: "");
        field(&f, "SLOT_PREVIOUS=%s", previous ?: "");
        journal_send(a, &f);
}

void audit_reload(Audit *a, bool ok, const char *detail) {
        Fields f = { .n = 0 };
        if (ok)
                field(&f, "MESSAGE=[CONFIG_RELOADED] Configuration reloaded: %s", detail ?: "");
        else
                field(&f, "MESSAGE=[CONFIG_REJECTED] Configuration rejected, the previous one stays: %s", detail ?: "");
        field(&f, "MESSAGE_ID=%s", MESSAGE_ID_RELOAD);
        field(&f, "PRIORITY=%d", ok ? LOG_NOTICE : LOG_ERR);
        field(&f, "SLOT_RELOAD=%s", ok ? "applied" : "rejected");
        journal_send(a, &f);
}

void audit_pool_moved(Audit *a, const char *pool, const char *from, const char *to, unsigned in_use) {
        Fields f = { .n = 0 };
        field(&f, "MESSAGE=[POOL_MOVED] Pool %s moved by reload from %s to %s: new requests go to %s; the %u slots "
              "held here stay where they were granted until their leases end, outside the new side's limit",
              pool, from, to, to, in_use);
        field(&f, "MESSAGE_ID=%s", MESSAGE_ID_POOL_MOVED);
        field(&f, "PRIORITY=%d", LOG_NOTICE);
        field(&f, "SLOT_POOL=%s", pool);
        field(&f, "SLOT_BACKEND_FROM=%s", from);
        field(&f, "SLOT_BACKEND_TO=%s", to);
        field(&f, "SLOT_IN_USE=%u", in_use);
        journal_send(a, &f);
}

void audit_backend(Audit *a, const char *pool, const SharedNotice *n) {
        if (n->type < 0 || n->type >= _SHARED_NOTICE_TYPE_MAX)
                return;
        Fields f = { .n = 0 };
        const char *tag = backend_notices[n->type].tag;
        switch (n->type) {
        case SHARED_NOTICE_BACKEND_LOST:
                field(&f, "MESSAGE=[%s] Pool %s lost its backend: refused until it is back%s%s", tag, pool,
                      n->detail ? ": " : "", n->detail ?: "");
                break;
        case SHARED_NOTICE_BACKEND_REGAINED:
                field(&f, "MESSAGE=[%s] Pool %s reached its backend again", tag, pool);
                break;
        case SHARED_NOTICE_NODE_EXPIRED:
                field(&f, "MESSAGE=[%s] Pool %s: node %s expired; its %" PRIu64 " leases and %" PRIu64 " waiters were freed",
                      tag, pool, n->node ?: "", n->freed_leases, n->freed_waiters);
                break;
        case SHARED_NOTICE_RULES_MISMATCH:
                field(&f, "MESSAGE=[%s] Pool %s is refused: its rules differ from those its backend enforces (%s)", tag,
                      pool, n->detail ?: "");
                break;
        case SHARED_NOTICE_RULES_AGREED:
                field(&f, "MESSAGE=[%s] Pool %s: its rules agree with its backend's", tag, pool);
                break;
        case SHARED_NOTICE_RECOVERY:
                /* The cause, when the scripts said it (lua/README, "Recovery windows"): a window found open
                 * by a brokerd just started is the pool's, not a sign that anything happened at the start. */
                if (streq_ptr(n->detail, "new"))
                        field(&f, "MESSAGE=[%s] Pool %s: recovery window of a pool made anew in Redis (its first use, or Redis lost all of its keys: no node can tell which); no grant until it ends, one backend-node-ttl after the pool was made",
                              tag, pool);
                else if (streq_ptr(n->detail, "restart"))
                        field(&f, "MESSAGE=[%s] Pool %s: its backend restarted or failed over (a new run or replication id); no grant until the live nodes reclaimed their leases",
                              tag, pool);
                else if (n->detail && strncmp(n->detail, "lost:", 5) == 0)
                        field(&f, "MESSAGE=[%s] Pool %s: its backend lost part of the pool (%s); no grant until the live nodes reclaimed their leases",
                              tag, pool, n->detail + 5);
                else
                        field(&f, "MESSAGE=[%s] Pool %s: its backend restarted or lost the pool; no grant until the live nodes reclaimed their leases",
                              tag, pool);
                break;
        case SHARED_NOTICE_REFUSED:
                field(&f, "MESSAGE=[%s] Pool %s is refused by its backend: %s", tag, pool, n->detail ?: "");
                break;
        case SHARED_NOTICE_FENCED:
                field(&f, "MESSAGE=[%s] Pool %s: its backend was unreachable too long; every lease of this node was revoked",
                      tag, pool);
                break;
        case SHARED_NOTICE_UNCONFIRMED:
                field(&f, "MESSAGE=[%s] Pool %s: the Sentinels cannot confirm its primary; refused until a majority of them names it",
                      tag, pool);
                break;
        case SHARED_NOTICE_CONFIRMED:
                field(&f, "MESSAGE=[%s] Pool %s: a majority of the Sentinels confirms its primary again", tag, pool);
                break;
        case SHARED_NOTICE_IDENTITY:
                field(&f, "MESSAGE=[%s] Pool %s is refused: another live brokerd heartbeats under this node id (a host cloned with its state directory?)",
                      tag, pool);
                break;
        case SHARED_NOTICE_IDENTITY_CLEARED:
                field(&f, "MESSAGE=[%s] Pool %s: the other registration under this node id lapsed; this brokerd is the node now",
                      tag, pool);
                break;
        case SHARED_NOTICE_BAD_INPUT:
                /* Once a minute at most: the count says how many more were dropped since the last one. */
                field(&f, "MESSAGE=[%s] Pool %s: dropped %s from its backend (%" PRIu64 " more since the last such entry)",
                      tag, pool, n->detail ?: "input", n->freed_leases);
                field(&f, "SLOT_BAD_INPUT_DROPPED=%" PRIu64, n->freed_leases);
                break;
        default:
                return;
        }
        field(&f, "MESSAGE_ID=%s", backend_notices[n->type].message_id);
        field(&f, "PRIORITY=%d", backend_notices[n->type].priority);
        field(&f, "SLOT_POOL=%s", pool);
        if (n->node)
                field(&f, "SLOT_NODE=%s", n->node);
        if (n->detail)
                field(&f, "SLOT_DETAIL=%s", n->detail);
        journal_send(a, &f);
}
