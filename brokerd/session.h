/* SPDX-License-Identifier: MIT */
/* session.h — what one client connection has asked for: its Acquire (waiting or holding), its place in the
 * queue and the position updates, its waiter and connection counts, every Acquire reply, and the link to
 * the lease it holds (written on both sides only here and in lease.c's holder functions). The engine's
 * events come back here as replies and leases. The transport under it is connection.h's. */
#pragma once

#include <stdbool.h>
#include <sys/socket.h>
#include <systemd/sd-event.h>

#include "connection.h"
#include "engine.h"
#include "list.h"
#include "process.h"
#include "varlink.h"

typedef struct Manager Manager;
typedef struct Lease Lease;
typedef struct HistoryCall HistoryCall;

/* An Acquire call in progress. */
typedef struct AcquireCall {
        bool active;
        bool more;                 /* replies continue; otherwise one final reply */
        bool detach;
        char *lane;
        char *job;
        unsigned slots;
        usec_t max_hold;           /* the client's cap; USEC_INFINITY: none */
        EngineRequest *request;    /* while waiting */
        size_t last_position;      /* 1-based, as last sent; 0: none yet */
        size_t last_queued;
        usec_t last_position_check; /* monotonic; updates go out at most once a second */
        ListNode position_node;     /* Manager.position_queue, while waiting with "more" */
        bool counted_waiter;       /* counted in its uid's waiters */
        int command_pidfd;         /* the attached command, verified at the call */
        ProcessInfo command;
        bool has_command;
        Lease *pending;            /* granted, its row being written: the answer waits for it */
} AcquireCall;

typedef struct Session {
        Manager *manager;
        ListNode node;             /* Manager.sessions, or Manager.closed_sessions once closed */
        Connection *connection;
        struct ucred cred;         /* the peer's, as at accept */
        AcquireCall acquire;
        Lease *lease;              /* the lease this session holds (its life line), if any */
        bool history_pending;      /* a History reply is being produced: the calls behind it wait */
        HistoryCall *history_call;
        bool closed;
} Session;

/* A session for an accepted connection (taken: closed on failure), counted in its uid's connections.
 * Binds the connection's call handler to call (methods_on_call()), and its input-ended and disconnect
 * handlers to the session's; disconnect runs before the session is torn down. */
int session_new(Manager *m, Connection *c, ConnectionCallFn call, ConnectionDisconnectFn disconnect, Session **ret);
/* Only once closed (Manager's collection, at the end of a loop iteration). */
void session_free(Session *s);
/* The connection went (connection_close()): a waiting request is withdrawn (audited "cancelled"), a
 * pending grant is forgotten, a held lease loses its life line. Called from the disconnect handler. */
void session_on_disconnect(Session *s);

/* An open Acquire, or a held lease, answers first: later calls wait (SPEC §5); except a Release of the
 * lease it holds, which is what ends that wait. */
bool session_defers_call(const Session *s, const VarlinkCall *call);

/* Replies and closing, through the connection. */
int session_reply(Session *s, json_t *parameters, bool continues);
int session_reply_error(Session *s, const char *error, json_t *parameters);
void session_close(Session *s);

bool session_is_waiting(const Session *s);
/* The Acquire on this session ended (refused, or its lease ended): the calls behind it run. */
void session_acquire_done(Session *s);

/* io.slotbroker.Acquire. Replies (or starts waiting); never fails the connection. */
void session_acquire(Session *s, const VarlinkCall *call);

/* A lease event (lease_table_pop_event()): a grant's row written, a revoked holder's grace over. */
typedef struct LeaseEvent LeaseEvent;
void session_on_lease_event(Manager *m, const LeaseEvent *ev);
/* Revokes l (max-hold, an administrator): its holder is told to stop, or cut when it holds by its
 * connection alone. */
void session_lease_revoke(Lease *l, const char *reason);
/* Release of l from session by (its holder, or another connection of its uid or root): the holder hears
 * "released" (or "revoked" while l's command runs) before by's reply. */
void session_lease_release(Session *by, Lease *l);

/* An engine event: a request queued, granted or refused, a lease reaching max-hold, a pool's gauge. */
void session_on_engine_event(Manager *m, const EngineEvent *ev);

/* The position timer: waiters whose place changed hear of it, at most once a second each. */
int session_on_position_timer(sd_event_source *source, uint64_t usec, void *userdata);

typedef enum SessionWithdraw {
        SESSION_WITHDRAW_GONE,          /* its connection closed: audited "cancelled", nobody to answer */
        SESSION_WITHDRAW_CANCELLED,     /* an administrator's Cancel: audited and answered "unavailable" */
} SessionWithdraw;

/* Withdraws s's waiting request, if it has one: the one way a waiter leaves other than by the engine's
 * grant or refusal. Returns whether there was one. */
bool session_waiter_withdraw(Session *s, SessionWithdraw why);
