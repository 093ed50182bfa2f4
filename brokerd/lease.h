/* SPDX-License-Identifier: MIT */
/* lease.h — a granted lease as the daemon keeps it: who holds it (a connection, a command, nobody),
 * how it ends (release, revocation, the holders going away), and what clients see of it. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <sys/types.h>
#include <systemd/sd-event.h>

#include "engine.h"
#include "list.h"
#include "process.h"
#include "time-util.h"

typedef struct Manager Manager;
typedef struct Connection Connection;

#define LEASE_ID_LEN 32

typedef enum LeaseState {
        LEASE_HELD,
        LEASE_REVOKED,  /* the holder was told to stop; the slots free when the command is gone */
        LEASE_OVERDUE,  /* revoked, and nobody is left to stop the command: it frees when the command exits */
        LEASE_RESTORED, /* outlived a restart; waits for its owner to reclaim it */
        _LEASE_STATE_MAX,
        _LEASE_STATE_INVALID = -EINVAL,
} LeaseState;

typedef struct Lease {
        Manager *manager;
        ListNode node;                  /* Manager.leases */
        char id[LEASE_ID_LEN + 1];
        EngineLease *engine_lease;
        Connection *holder;             /* the life line; NULL when detached or gone */
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

        sd_event_source *grace_timer;   /* a revoked lease without a command: cut its connection */
} Lease;

/* Creates the daemon's lease for a fresh grant. Takes command_pidfd (-EBADF: none). */
int lease_new(Manager *m, EngineLease *el, Connection *holder, uid_t uid, pid_t pid, const char *job, bool detached,
              const ProcessInfo *command, int command_pidfd, Lease **ret);

/* The connection went away: the lease ends unless its command still runs. */
void lease_holder_gone(Lease *l);
/* Release by the holder's uid or root from any connection: ends it, or revokes it if its command runs.
 * The holder is told ("released" or "revoked"). */
void lease_release(Lease *l);
/* max-hold or an administrator: the holder is told to stop; the slots free when it has. */
void lease_revoke(Lease *l, const char *reason);
/* Once a second: process groups whose leader has exited. */
void lease_poll_command(Lease *l);

/* The lease as clients see it (Varlink Lease type). */
json_t *lease_to_json(const Lease *l);

const char *lease_state_to_string(LeaseState s);

/* Frees the daemon's record only, the engine keeps the slots: for shutdown, when leases end with the process. */
void lease_free(Lease *l);

/* The slots are given back to the engine and the lease is freed. */
void lease_end(Lease *l, const char *decision);
