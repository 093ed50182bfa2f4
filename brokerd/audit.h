/* SPDX-License-Identifier: MIT */
/* audit.h — every decision, recorded once: a structured journal entry (SPEC §7: SLOT_* fields, a fixed
 * MESSAGE_ID per decision, a tag opening MESSAGE) and a history row. Callers say what happened; this
 * module decides what is written where, and summarises storms rather than flooding the journal. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <systemd/sd-event.h>

#include "decision.h"
#include "journal.h"
#include "time-util.h"

typedef struct Manager Manager;
typedef struct Lease Lease;

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
} Audit;

void audit_init(Audit *a, const char *journal_socket);
void audit_done(Audit *a);
/* The journal's backlog is sent as soon as journald's socket takes it, not only at the next tick. */
void audit_watch_backlog(Manager *m);
/* Once a second: summaries of suppressed entries, and the journal backlog. */
void audit_tick(Manager *m);

void audit_decision(Manager *m, const AuditRecord *r);
/* A record filled from the lease: pool, lane, job, lease id, token, uid, pid. */
AuditRecord audit_record_of_lease(const Lease *l, const char *decision);
/* A lease-level decision (released, revoked, overdue, restored), with its hold so far. */
void audit_lease(const Lease *l, const char *decision, const char *reason);
/* The congested gauge of a pool changed. */
void audit_congestion(Manager *m, const char *pool, bool congested, usec_t idle);
/* A reload applied (ok) or rejected (first error). */
void audit_reload(Manager *m, bool ok, const char *detail);
