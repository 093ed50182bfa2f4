/* SPDX-License-Identifier: MIT */
/* lease.h — the lease state machine: a granted lease (held, revoked, overdue, restored, ended), its
 * command's pidfd and process group, its graces, its row. It never touches a session or a connection: the
 * holder is an opaque pointer its owner links (session.c), what a caller asks is answered with a
 * LeaseOutcome, and what happens on its own (a row written, a revoke grace over) is queued as a LeaseEvent
 * the owner drains (lease_table_pop_event(), as engine_pop_event()). */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <sys/types.h>
#include <systemd/sd-event.h>

#include "decision.h"
#include "engine.h"
#include "json.h"
#include "list.h"
#include "process.h"
#include "ring.h"
#include "time-util.h"

typedef struct HistoryLeaseBackend HistoryLeaseBackend; /* history.h */

typedef struct Audit Audit;
typedef struct LeaseLog LeaseLog;

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
        char *selector;                 /* what the request asked of the members (AuditRecord.selector), or NULL */
        bool holder_gone;               /* the holder went before the grant was written: it goes once it is */
} LeaseGrant;

typedef struct Lease Lease;

typedef enum LeaseEventType {
        LEASE_EVENT_PERSISTED,  /* the grant's row was written (result 0), not (LEASE_NOT_PERSISTED: no lease
                                 * log) or failed (< 0); waiter: as given to lease_persist() */
        LEASE_EVENT_CUT,        /* the revoke grace is over and the holder still holds: its session must go */
        _LEASE_EVENT_TYPE_MAX,
        _LEASE_EVENT_TYPE_INVALID = -EINVAL,
} LeaseEventType;

typedef struct LeaseEvent {
        LeaseEventType type;
        Lease *lease;
        void *waiter;           /* PERSISTED: who waits for the grant, or NULL (gone, or nobody) */
        int result;             /* PERSISTED */
} LeaseEvent;

#define LEASE_EVENTS_MAX 64

/* PERSISTED's result when there is no lease log to write to. */
#define LEASE_NOT_PERSISTED 1

/* The leases and what they need from outside, embedded in their owner (the Manager). */
typedef struct LeaseTable {
        sd_event *event;                /* pidfd watches and grace timers */
        Engine *engine;
        Audit *audit;
        LeaseLog *log;                  /* NULL: rows are not written (PERSISTED says LEASE_NOT_PERSISTED) */
        usec_t revoke_grace;            /* a holder without a command may ignore a revocation this long */
        usec_t reclaim_grace;           /* a restored lease waits this long for its owner */
        /* The previous brokerd handed its connections to the fd store (a restart, SPEC §3.4): a lease whose
         * command ended meanwhile is held by its connection, which may carry the command's exit status in its
         * Release, until lease_table_end_not_taken_back(). */
        bool holders_handed_over;
        usec_t (*now)(clockid_t clock); /* the clock: now_monotonic()/now_realtime() unless a test's */
        void (*random_bytes)(void *buf, size_t n, void *userdata); /* lease ids */
        void *random_userdata;
        /* Where the shared pool `pool` keeps its leases (borrowed strings, valid during the call): recorded
         * with each shared lease, so that a restart whose configuration no longer keeps the pool there still
         * heartbeats and releases the lease there. False, or NULL: not recorded. */
        bool (*backend_of)(const char *pool, HistoryLeaseBackend *ret, void *userdata);
        void *backend_userdata;
        List leases;                    /* Lease.node */
        unsigned n_leases;
        bool changed;                   /* a lease came, went or changed state: STATUS= is stale */
        Ring events;                    /* of LeaseEvent, drained by the owner */
        struct Lease **persisting;      /* rows in the log's buffer, answered by lease_table_flush() */
        size_t n_persisting, persisting_allocated;
} LeaseTable;

void lease_table_init(LeaseTable *t, sd_event *event, Engine *engine, Audit *audit);
/* Shutdown: the records are freed; rows and engine slots stay (leases end with the process). */
void lease_table_done(LeaseTable *t);
Lease *lease_table_find(LeaseTable *t, const char *id);
/* Once a second: process groups whose leader has exited. */
void lease_table_poll_commands(LeaseTable *t);
bool lease_table_pop_event(LeaseTable *t, LeaseEvent *ret);
/* Writes the rows and ends of this loop iteration in one write() (group commit), then queues a PERSISTED
 * event for each row; rewrites the log when it has grown well past what is live. Returns true when it
 * queued events. */
bool lease_table_flush(LeaseTable *t);
/* Writes every live lease into the log afresh: to mend a log that could not be written. Returns 0 or
 * negative errno. */
int lease_table_write_snapshot(LeaseTable *t);
/* Writes a member's counts (SPEC §3.6, usage per member: grants, held, quarantines, failures in a row) to the
 * log as the engine has them now, so that a restart goes on from them. Grants and releases of a member pool
 * write their members' themselves; the manager calls it for a quarantine or restore. */
void lease_table_log_use(LeaseTable *t, const char *pool, const char *member);

typedef enum LeaseOutcome {
        LEASE_OUTCOME_HELD,     /* nothing changed for the holder */
        LEASE_OUTCOME_REVOKED,  /* revoked: the holder must be told (or, holding by its connection, cut) */
        LEASE_OUTCOME_OVERDUE,  /* revoked with nobody to tell: it ends when its command does */
        LEASE_OUTCOME_ENDED,    /* the slots are back; the lease is freed */
        _LEASE_OUTCOME_MAX,
        _LEASE_OUTCOME_INVALID = -EINVAL,
} LeaseOutcome;

typedef struct Lease {
        LeaseTable *table;
        ListNode node;                  /* LeaseTable.leases */
        char id[LEASE_ID_LEN + 1];
        EngineLease *engine_lease;
        void *holder;                   /* the life line (a session); NULL when detached or gone */
        LeaseState state;
        char *job;
        uid_t uid;
        pid_t pid;
        bool detached;
        usec_t granted_mono;            /* monotonic, for durations */
        usec_t granted_real;            /* realtime, for clients and history */
        int64_t realtime_offset;        /* realtime − monotonic for the lease's other instants (its expiry) */

        /* The attached command (SPEC §3.4): a pidfd on the leader, then its process group polled. */
        bool has_command;
        ProcessInfo command;
        int command_pidfd;
        sd_event_source *command_source;
        bool command_leader_exited;
        pid_t command_member;           /* a member of its group seen running after the leader (0: none) */
        bool command_gone;

        sd_event_source *grace_timer;   /* a revoked lease without a command: cut its connection; or the
                                         * reclaim grace of a lease restored after a restart */
        bool awaiting_handover;         /* restored for its handed-over connection alone (its command ended) */

        /* Its pool lost it (SPEC §11, "Fencing does not depend on slotctl alone"): the slots may soon be
         * another node's, so brokerd stops the command itself when nobody else does — SIGTERM when nobody
         * holds the lease, SIGKILL after revoke-grace (or when a holder that was told let that pass). */
        bool lost;
        bool fence_termed;              /* brokerd sent the command SIGTERM */
        unsigned fence_signals;         /* signals tried: only the first SIGTERM and SIGKILL are logged */
        sd_event_source *fence_timer;   /* SIGKILL then (and again each second while it runs) */

        LeaseGrant grant;
        void *persist_waiter;           /* waits for the grant while the lease row is written */
        bool persist_pending;           /* its row is in the log's buffer: in persisting[] */
        bool persist_refused;           /* its row could not be written for its grant: withdrawn, unless
                                         * best-effort grants it (then cleared: snapshots take it) */
        char released_by[32];           /* "by uid N": a Release by another than its owner (root, or another of
                                         * the pool's admins for a reservation), the reason of its end; "": none */
} Lease;

/* Creates the daemon's lease for a fresh grant, held by holder (NULL: none; the caller links its side).
 * Takes command_pidfd (-EBADF: none). */
int lease_new(LeaseTable *t, EngineLease *el, void *holder, uid_t uid, pid_t pid, const char *job, bool detached,
              const ProcessInfo *command, int command_pidfd, Lease **ret);

/* A lease row found at start (SPEC §3.4): re-occupies its slots if it still has a holder — a running
 * command (same pid and start time; or, its leader gone, a member of its process group), a detached lease
 * before its expiry, or a connection that may reclaim it within the reclaim grace —, also when its pool is
 * no longer configured. alive_at (realtime µs, 0: unknown): the last instant the previous brokerd is known
 * to have run; no max-hold is restored longer than what was left of it then, whatever the wall clock says
 * now. Returns 0 with *ret NULL when the lease ended while brokerd was down, 0 with the lease, or negative
 * errno (-EEXIST: a slot is taken). */
typedef struct HistoryLeaseRow HistoryLeaseRow;
int lease_restore(LeaseTable *t, const HistoryLeaseRow *row, usec_t alive_at, Lease **ret);
/* When a lease that lease_restore() found ended while brokerd was down ended, as best known (realtime µs): a
 * detached lease's expiry (--for, max-hold: exact); else the last instant brokerd was known to run (alive_at:
 * the alive mark of its stop, or its last one, at most LEASE_LOG_ALIVE_INTERVAL before a crash; its command may
 * have run on unseen after it, which is not counted), or its expiry if that came first; never before its
 * grant nor after now_r. alive_at 0 (unknown): its grant, so no time. For its members' held time. */
usec_t lease_row_ended_at(const HistoryLeaseRow *row, usec_t alive_at, usec_t now_r);
/* The owner came back (Acquire with reclaim): holder becomes the lease's life line again (the caller
 * links its side). Returns 0, or -EBUSY when someone holds it already. */
int lease_reclaim(Lease *l, void *holder);
/* The connections of the fd store were taken back: a lease restored for its handed-over connection alone
 * (its command ended while brokerd was down) that none took back ended while brokerd was down. */
void lease_table_end_not_taken_back(LeaseTable *t);
void *lease_get_holder(const Lease *l);
/* The holder lets go of its side (the caller clears its own): for session.c, which keeps both. */
void lease_clear_holder(Lease *l);

/* Writes the row of the lease's grant at the next lease_table_flush(): the grant is audited, answered or
 * refused only then (SPEC §3.4), when LEASE_EVENT_PERSISTED follows, with waiter (NULL: nobody waits).
 * Called once a lease, after lease_new(). */
void lease_persist(Lease *l, void *waiter);
/* The waiter went: PERSISTED comes without it. */
void lease_persist_forget(Lease *l);
/* A grant withdrawn before it was answered: the slots go back, no "released" decision is recorded. */
void lease_discard(Lease *l);

/* The holder went away (unlinked already): the lease ends unless its command still runs or it is
 * detached; revoked, it becomes overdue while its command runs. */
LeaseOutcome lease_holder_gone(Lease *l);
/* max-hold, an administrator, or a release while its command runs. Held by someone: REVOKED, and the
 * holder must be told (then lease_start_revoke_grace()); nobody holding: OVERDUE (its command runs) or
 * ENDED. HELD: it was revoked already. */
LeaseOutcome lease_revoke(Lease *l, const char *reason);
/* Its pool lost it (a shared pool's self-fence, its node expired, …): revoked as lease_revoke() does, and,
 * while its command runs, brokerd stops the command unless a holder does so in time: SIGTERM at once when
 * nobody holds the lease, SIGKILL after revoke-grace either way. Also for a lease revoked before (max-hold,
 * a release), then audited "revoked" again when brokerd takes the command on. Returns as lease_revoke(). */
LeaseOutcome lease_lose(Lease *l, const char *reason);
/* The holder was told to stop and holds on by its connection alone: LEASE_EVENT_CUT after the revoke
 * grace, unless its command runs (then the command's end is what counts; for a lost lease, brokerd sends
 * the command SIGKILL if it still runs then). */
void lease_start_revoke_grace(Lease *l);
bool lease_command_running(const Lease *l);
/* The command's state as of now, not as of the last event (its pidfd, its group): a Release that comes right
 * after the command's end frees the lease instead of revoking it. */
void lease_command_refresh(Lease *l);

/* A record of a decision about the lease: pool, lane, job, lease id, token, uid, pid. */
AuditRecord lease_audit_record(const Lease *l, const char *decision);
/* The decision r (lease_audit_record()'s, filled in) for each further pool of an all-or-nothing lease: a
 * history row and metrics each, with that pool's token (audit_decision_share()). */
void lease_audit_shares(const Lease *l, const AuditRecord *r);
/* AuditRecord.also of the lease: "POOL:TOKEN …" of its also= pools, in buf; NULL for a lease of one pool. */
#define LEASE_ALSO_TEXT_MAX 1024
/* The members the lease holds in its own pool, comma-separated ("rig-a,rig-c"), into buf; NULL for anonymous
 * slots. A list that does not fit is cut at a whole member. */
const char *lease_members_text(const Lease *l, char *buf, size_t size);
const char *lease_also_text(const Lease *l, char *buf, size_t size);

/* The lease as clients see it (Varlink Lease type). */
json_t *lease_to_json(const Lease *l);
/* The same object as text, written into t (the grant's reply: no tree built). lease_to_json() parses it. */
void lease_write_json(const Lease *l, JsonText *t);

const char *lease_state_to_string(LeaseState s);

/* Frees the daemon's record only, the engine keeps the slots: for shutdown, when leases end with the process. */
void lease_free(Lease *l);

/* Released ("released" recorded, after a revocation with its reason): the slots go back to the engine and
 * the lease is freed. The holder must be unlinked. */
void lease_end(Lease *l);
