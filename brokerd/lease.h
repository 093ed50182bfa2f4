/* SPDX-License-Identifier: MIT */
/* lease.h — a granted lease as the daemon keeps it: who holds it (a connection, a command, nobody),
 * how it ends (release, revocation, the holders going away), and what clients see of it. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <sys/types.h>
#include <systemd/sd-event.h>

#include "decision.h"
#include "engine.h"
#include "list.h"
#include "process.h"
#include "time-util.h"

typedef struct Manager Manager;
typedef struct Session Session;

#define LEASE_ID_LEN 32

typedef enum LeaseState {
        LEASE_HELD,
        LEASE_REVOKED,  /* the holder was told to stop; the slots free when the command is gone */
        LEASE_OVERDUE,  /* revoked, and nobody is left to stop the command: it frees when the command exits */
        LEASE_RESTORED, /* outlived a restart; waits for its owner to reclaim it */
        _LEASE_STATE_MAX,
        _LEASE_STATE_INVALID = -EINVAL,
} LeaseState;

/* How the request that became the lease fared, for the audit of its grant. */
typedef struct LeaseGrant {
        usec_t wait;
        usec_t budget;                  /* USEC_INFINITY: unbounded or not queued */
        usec_t idle;                    /* USEC_INFINITY: not queued on a pool with queue-timeout */
        QueueState state;
} LeaseGrant;

typedef struct Lease Lease;
typedef void (*LeasePersistedFn)(Lease *l, int result);

typedef struct Lease {
        Manager *manager;
        ListNode node;                  /* Manager.leases */
        char id[LEASE_ID_LEN + 1];
        EngineLease *engine_lease;
        Session *holder;             /* the life line; NULL when detached or gone */
        LeaseState state;
        char *job;
        uid_t uid;
        pid_t pid;
        bool detached;
        usec_t granted_mono;            /* monotonic, for durations */
        usec_t granted_real;            /* realtime, for clients and history */

        /* The attached command (SPEC §3.4): a pidfd on the leader, then its process group polled. */
        bool has_command;
        ProcessInfo command;
        int command_pidfd;
        sd_event_source *command_source;
        bool command_leader_exited;
        bool command_gone;

        sd_event_source *grace_timer;   /* a revoked lease without a command: cut its connection; or the
                                         * reclaim grace of a lease restored after a restart */

        LeaseGrant grant;
        Session *requester;          /* waits for the grant while the lease row is written */
        LeasePersistedFn persisted;     /* pending history commit, or NULL */
} Lease;

/* Creates the daemon's lease for a fresh grant. Takes command_pidfd (-EBADF: none). */
int lease_new(Manager *m, EngineLease *el, Session *holder, uid_t uid, pid_t pid, const char *job, bool detached,
              const ProcessInfo *command, int command_pidfd, Lease **ret);

/* A lease row found at start (SPEC §3.4): re-occupies its slots if it still has a holder — a running
 * command (same pid and start time; or, its leader gone, a member of its process group), a detached lease
 * before its expiry, or a connection that may reclaim it within the reclaim grace —, also when its pool is
 * no longer configured. alive_at (realtime µs, 0: unknown): the last instant the previous brokerd is known
 * to have run; no max-hold is restored longer than what was left of it then, whatever the wall clock says
 * now. Returns 0 with *ret NULL when the lease ended while brokerd was down, 0 with the lease, or negative
 * errno (-EEXIST: a slot is taken). */
typedef struct HistoryLeaseRow HistoryLeaseRow;
int lease_restore(Manager *m, const HistoryLeaseRow *row, usec_t alive_at, Lease **ret);
/* The owner came back (Acquire with reclaim): the connection becomes the lease's life line again.
 * Returns 0, or -EBUSY when someone holds it already. */
int lease_reclaim(Lease *l, Session *c);

/* Writes the lease row (SPEC §3.4: before the grant is answered); done is called on the loop with 0,
 * HISTORY_NOT_PERSISTED (history degraded) or a negative errno. done NULL: nobody waits for it. */
void lease_persist(Lease *l, LeasePersistedFn done);
/* A grant withdrawn before it was answered: the slots go back, no "released" decision is recorded. */
void lease_discard(Lease *l);

/* The connection went away: the lease ends unless its command still runs. */
void lease_holder_gone(Lease *l);
/* Release by the holder's uid or root from any connection (`by`, which may be the holder itself): ends it,
 * or revokes it if its command runs. The holder is told ("released" or "revoked"). */
void lease_release(Lease *l, Session *by);
/* max-hold or an administrator: the holder is told to stop; the slots free when it has. */
void lease_revoke(Lease *l, const char *reason);
/* Once a second: process groups whose leader has exited. */
void lease_poll_command(Lease *l);

/* A record of a decision about the lease: pool, lane, job, lease id, token, uid, pid. */
AuditRecord lease_audit_record(const Lease *l, const char *decision);

/* The lease as clients see it (Varlink Lease type). */
json_t *lease_to_json(const Lease *l);

const char *lease_state_to_string(LeaseState s);

/* Frees the daemon's record only, the engine keeps the slots: for shutdown, when leases end with the process. */
void lease_free(Lease *l);

/* The slots are given back to the engine and the lease is freed. */
void lease_end(Lease *l);
