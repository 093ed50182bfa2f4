/* SPDX-License-Identifier: MIT */
/* audit.h — every decision, recorded once: a structured journal entry (SPEC §7: SLOT_* fields, a fixed
 * MESSAGE_ID per decision, a tag opening MESSAGE) and a history row. Callers say what happened; this
 * module decides what is written where, and summarises storms rather than flooding the journal. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <systemd/sd-event.h>

#include "conf.h"
#include "decision.h"
#include "journal.h"
#include "pool-shared.h"
#include "time-util.h"

typedef struct History History;
typedef struct Metrics Metrics;

/* Entries of one decision kind allowed per window before the rest are only counted. */
#define AUDIT_BURST 100
#define AUDIT_WINDOW_USEC (10 * USEC_PER_SEC)

typedef struct AuditLimit {
        usec_t window_start;
        unsigned in_window;
        unsigned long suppressed;
} AuditLimit;

typedef struct Audit {
        JournalWriter journal;
        sd_event_source *backlog_source; /* EPOLLOUT on the journal socket while entries wait */
        int backlog_fd;
        AuditLimit limits[16];
        unsigned long journal_dropped_total;
        sd_event *event;                 /* where the backlog is watched */
        Metrics *metrics;                /* sinks: every decision is counted and written to history */
        History *history;                /* NULL: none (not opened yet, or a unit test) */
        AuditLevel level;                /* [broker] audit=: whether routine decisions are journaled */
} Audit;

/* The sinks: metrics (NULL: none) and, once it is open, history (audit_set_history()). */
void audit_init(Audit *a, sd_event *event, Metrics *metrics, const char *journal_socket);
void audit_done(Audit *a);
void audit_set_history(Audit *a, History *history);
void audit_set_level(Audit *a, AuditLevel level);
/* Once a second: summaries of suppressed entries, and the journal backlog. */
void audit_tick(Audit *a);
/* Whether audit_tick() has nothing to do: no summary owed, no entry waiting for journald. */
bool audit_is_idle(const Audit *a);

void audit_decision(Audit *a, const AuditRecord *r);
/* The same decision about a further pool of an all-or-nothing lease (SPEC §3.5, also=): its own history row
 * (linked by the lease id) and metrics, no journal entry of its own (the lease's says it once). */
void audit_decision_share(Audit *a, const AuditRecord *r);
/* The congested gauge of a pool changed. */
void audit_congestion(Audit *a, const char *pool, bool congested, usec_t idle);
/* A member quarantined or restored (SPEC §3.6): job is the job whose end did it, or who did it by hand (NULL:
 * unknown); exit_status -1 when none did; reason what was given by hand (NULL: none). */
void audit_member(Audit *a, const char *pool, const char *member, bool quarantined, const char *job, int exit_status,
                  const char *reason);
/* A pool or member drained or undrained (SPEC §3.6): who (NULL: unknown), why (NULL: none), until (realtime
 * µs; USEC_INFINITY: none), expired: undrained by its until. A journal entry and a history row. */
void audit_drain(Audit *a, const char *pool, const char *member, bool drained, const char *who, const char *reason,
                 usec_t until_realtime, bool expired);
/* An administrator's action on a pool or member (quarantine, restore) refused to uid (SPEC §3.6). */
void audit_admin_denied(Audit *a, const char *action, const char *pool, const char *member, uid_t uid, pid_t pid);
/* A reload applied (ok) or rejected (first error). */
/* A shared pool's notice (its backend lost or regained, another node expired, rules, recovery, fenced):
 * journaled with a MESSAGE_ID whose catalog entry says what to do. */
void audit_backend(Audit *a, const char *pool, const SharedNotice *n);
/* The Sentinels of backend url moved its primary from previous to primary ("HOST:PORT"): once per backend,
 * whatever the number of its pools (each of them journals its recovery window itself). */
void audit_backend_failover(Audit *a, const char *url, const char *previous, const char *primary);
void audit_reload(Audit *a, bool ok, const char *detail);
/* A reload changed where pool `pool` is kept (from, to: a backend= URL or "local"); in_use slots held on
 * this node stay in the old place until their leases end. */
void audit_pool_moved(Audit *a, const char *pool, const char *from, const char *to, unsigned in_use);
