/* SPDX-License-Identifier: MIT */
/* decision.h — one decision as every sink records it (the journal, history, metrics): what was decided,
 * about which request or lease. A header of its own so that the sinks need not know the audit module
 * that feeds them. */
#pragma once

#include <stdint.h>
#include <sys/types.h>

#include "time-util.h"

typedef struct AuditRecord {
        const char *decision;     /* granted, busy, full, timeout, shed, unavailable, cancelled, released,
                                   * revoked, overdue, restored, denied */
        const char *pool;
        const char *lane;
        const char *job;
        const char *lease;
        uint64_t token;           /* 0: none */
        usec_t wait;              /* USEC_INFINITY: not applicable */
        usec_t hold;
        usec_t budget;
        usec_t idle;
        const char *state;        /* keeping-up, saturated, or NULL */
        uid_t uid;                /* (uid_t) -1: unknown */
        pid_t pid;                /* 0: unknown */
        unsigned retry_after_sec; /* 0: none */
        const char *reason;       /* a few words for the message, or NULL */
        /* What the request asked of the members (SPEC §3.5), as selector_canon() writes it: its labels, then
         * "@MEMBER" ("arm64 !flaky @rig-c"); NULL: nothing. */
        const char *selector;
        /* An all-or-nothing lease's further pools with their tokens (SPEC §3.5, also=): "db:12 lic:99";
         * NULL: none. The journal's SLOT_ALSO= (each pool has its own history row). */
        const char *also;
        /* The members a lease holds ("rig-a,rig-c"), or the one a member row names; NULL: anonymous slots.
         * history.db's events.member (schema 6): usage per member (SPEC §3.6). */
        const char *member;
        int exit_status;          /* a quarantine's, or a released lease's command's, exit status; -1: none */
        /* The slots a request asked of this pool (a grant's, a refusal's, a withdrawal's); 0: not a request's
         * row. history.db's events.slots (schema 7): `slotctl simulate --replay` asks as many. */
        unsigned slots;
        /* A drain's until (realtime µs; 0 or USEC_INFINITY: none): history.db's events.until_us (schema 8). */
        usec_t until;
} AuditRecord;

#define AUDIT_RECORD_INIT                                                                                   \
        (AuditRecord) {                                                                                    \
                .wait = USEC_INFINITY, .hold = USEC_INFINITY, .budget = USEC_INFINITY, .idle = USEC_INFINITY, \
                .uid = (uid_t) -1, .exit_status = -1,                                                      \
        }
