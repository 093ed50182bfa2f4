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
#include "handover.h"
#include "list.h"
#include "process.h"
#include "varlink.h"

typedef struct Audit Audit;
typedef struct Lease Lease;
typedef struct LeaseTable LeaseTable;
typedef struct HistoryCall HistoryCall;
typedef struct Persistence Persistence;
typedef struct BrokerConfig BrokerConfig;

/* A token bucket: Acquires on shared pools (issue 19 i: each costs the fleet's Redis a record). Full at
 * first; a request takes one token; it refills at the configured rate up to its burst. */
typedef struct RateBucket {
        double tokens;
        usec_t at;                      /* monotonic: when tokens was last brought up to date; 0: full */
} RateBucket;

/* Whether a request may go now, at rate_per_hour (0: unlimited) with burst; if not, *ret_retry says when
 * the next token comes (µs from now). Pure: now is passed in. */
bool rate_bucket_take(RateBucket *b, uint64_t rate_per_hour, unsigned burst, usec_t now, usec_t *ret_retry);

/* Connections and waiters per uid, for the limits of SPEC §10; its Acquire rate on shared pools. */
typedef struct UidUsage {
        uid_t uid;
        unsigned connections;
        unsigned waiters;
        RateBucket acquire_rate;
} UidUsage;

/* The sessions and what they need from outside, embedded in their owner (the Manager). */
typedef struct SessionTable {
        const BrokerConfig *config;     /* lanes, pools, max-waiters-per-uid; the owner's, updated at reload */
        Engine *engine;
        Audit *audit;
        LeaseTable *leases;
        Persistence *persistence;
        List sessions;                  /* Session.node */
        List closed;                    /* closed sessions, freed by session_table_collect() */
        unsigned n_sessions;
        UidUsage *uid_usage;
        size_t n_uid_usage;
        RateBucket acquire_rate;        /* the node's: every uid's Acquires on shared pools */
        List position_queue;            /* waiters by when their position was last looked at */
        List notice_queue;              /* waiters whose first "queued" reply is held back, by when it is due */
        List status_waiting;            /* Session.view_node: Status calls waiting for the drain (and fresh snapshots) */
        List metrics_waiting;           /* Session.view_node: Metrics calls waiting for the drain */
        sd_event_source *position_timer;
        sd_event_source *notice_timer;
        sd_event_source *test_renew_timer; /* SLOTBROKER_TEST_RENEW_MS, tests only */
        usec_t test_renew;
        bool changed;                   /* a waiter came or went: STATUS= is stale */
        /* The owner's answers and hooks (userdata: below). */
        bool (*lane_allows)(const char *lane, uid_t uid, const gid_t *groups, size_t n_groups, void *userdata);
        /* Whether the peer administers the pool (root, brokerd's user, admin-users=/admin-groups=). May be NULL:
         * nobody but what the caller checked itself. */
        bool (*pool_admin)(const char *pool, uid_t uid, const gid_t *groups, size_t n_groups, void *userdata);
        void (*fd_released)(void *userdata);
        void (*memory_freed)(size_t bytes, void *userdata);
        /* CLOCK_BOOTTIME instant until which a lease of `pool` is safe (a shared pool's self-fence deadline),
         * or USEC_INFINITY (a local pool, or nothing acknowledged yet). May be NULL. */
        usec_t (*fence_deadline)(const char *pool, void *userdata);
        void *userdata;
        void *call_userdata;            /* for the call handler bound to each connection (the methods) */
} SessionTable;

/* The position timer is added to event (IDLE priority). Returns 0 or negative errno. */
int session_table_init(SessionTable *t, sd_event *event);
/* Shutdown: sessions are closed (their leases left to end with the process) and freed. */
void session_table_done(SessionTable *t);
/* A clean stop: every session is closed but those holding a lease (or being granted one), which stay until
 * the process ends, their leases with them. Waiters are withdrawn as for a hang-up (audited "cancelled"),
 * and no connection that stays can queue a request any more: it holds a lease, so its calls wait. */
void session_table_close_all_but_holders(SessionTable *t);
UidUsage *session_table_uid_usage(SessionTable *t, uid_t uid, bool create);
/* Frees the closed sessions: from the drain, when no queued event can name them any more. */
void session_table_collect(SessionTable *t);

/* An Acquire call in progress. */
typedef struct AcquireCall {
        bool active;
        bool more;                 /* replies continue; otherwise one final reply */
        bool detach;
        bool fence;                /* the client wants "held" renewals while it holds the lease */
        char *lane;
        char *job;
        unsigned slots;
        char **labels;             /* the client's selector terms (SPEC §3.5), or NULL */
        char *member;              /* the member it named, or NULL */
        char *selector;            /* both as one text (selector_canon()) for the audit, or NULL */
        usec_t max_hold;           /* the client's cap; USEC_INFINITY: none */
        usec_t max_wait;           /* the client's queueWaitMs; USEC_INFINITY: none */
        EngineRequest *request;    /* while waiting */
        size_t last_position;      /* 1-based, as last sent; 0: none yet */
        size_t last_queued;
        usec_t last_position_check; /* monotonic; updates go out at most once a second */
        ListNode position_node;     /* Manager.position_queue, while waiting with "more" */
        ListNode notice_node;       /* Manager.notice_queue, while its first "queued" reply may wait */
        usec_t notice_due;          /* monotonic: when that reply goes anyway */
        bool counted_waiter;       /* counted in its uid's waiters */
        int command_pidfd;         /* the attached command, verified at the call */
        ProcessInfo command;
        bool has_command;
        Lease *pending;            /* granted, its row being written: the answer waits for it */
} AcquireCall;

/* A reply's whole message, its NUL included, rendered once and sent to each session it answers. */
typedef struct SessionText {
        unsigned n_ref;
        size_t size;
        char *data;
} SessionText;

/* Takes data (malloc'ed, size bytes). Returns NULL when out of memory (data is freed then). */
SessionText *session_text_new(char *data, size_t size);
SessionText *session_text_ref(SessionText *t);
SessionText *session_text_unref(SessionText *t);
DEFINE_TRIVIAL_CLEANUP_FUNC(SessionText *, session_text_unref);

typedef struct Session {
        SessionTable *table;
        ListNode node;             /* SessionTable.sessions, or SessionTable.closed once closed */
        Connection *connection;
        struct ucred cred;         /* the peer's, as at accept */
        AcquireCall acquire;
        Lease *lease;              /* the lease this session holds (its life line), if any */
        bool history_pending;      /* a History reply is being produced: the calls behind it wait */
        HistoryCall *history_call;
        SessionText *reply_text;   /* a Status or Metrics reply going out as the client reads it */
        size_t reply_sent;         /* its bytes queued so far */
        ListNode view_node;        /* SessionTable.status_waiting or metrics_waiting: its reply waits (the calls behind it too) */
        usec_t view_since;         /* monotonic: that call's arrival */
        bool handed_over;          /* its connection and request went to the next brokerd (session_handed_over()) */
        bool closed;
} Session;

/* A session for an accepted connection (taken: closed on failure), counted in its uid's connections.
 * Binds the connection's call handler to call (methods_on_call()), and its input-ended and disconnect
 * handlers to the session's; disconnect runs before the session is torn down. */
int session_new(SessionTable *t, Connection *c, ConnectionCallFn call, ConnectionDisconnectFn disconnect,
                Session **ret);
/* The connection went (connection_close()): a waiting request is withdrawn (audited "cancelled"), a
 * pending grant is forgotten, a held lease loses its life line. Called from the disconnect handler. */
void session_on_disconnect(Session *s);

/* An open Acquire, or a held lease, answers first: later calls wait (SPEC §5); except a Release of the
 * lease it holds, which is what ends that wait. */
bool session_defers_call(const Session *s, const VarlinkCall *call);

/* Replies and closing, through the connection. */
int session_reply(Session *s, json_t *parameters, bool continues);
int session_reply_error(Session *s, const char *error, json_t *parameters);
/* A reply from its parameters' text (json_text_*()): the replies sent on every request. */
int session_reply_text(Session *s, const JsonText *parameters, bool continues);
/* A reply whose parameters are a constant object's text. */
int session_reply_literal(Session *s, const char *parameters, bool continues);
void session_close(Session *s);

bool session_is_waiting(const Session *s);
/* The Acquire on this session ended (refused, or its lease ended): the calls behind it run. */
void session_acquire_done(Session *s);

/* io.slotbroker.Acquire. Replies (or starts waiting); never fails the connection. */
void session_acquire(Session *s, const VarlinkCall *call);

/* Reserve (SPEC §3.6): what methods.c checked. */
typedef struct SessionReserve {
        const char *pool;
        const char *member;        /* or NULL */
        char *const *labels;       /* or NULL */
        usec_t hold;               /* > 0, finite */
        const char *reason;        /* valid (one printable line) */
} SessionReserve;
void session_reserve(Session *s, const VarlinkCall *call, const SessionReserve *r);

/* A lease event (lease_table_pop_event()): a grant's row written, a revoked holder's grace over. */
typedef struct LeaseEvent LeaseEvent;
void session_on_lease_event(SessionTable *t, const LeaseEvent *ev);
/* Revokes l (max-hold, an administrator): its holder is told to stop, or cut when it holds by its
 * connection alone. */
void session_lease_revoke(Lease *l, const char *reason);
/* The lease s holds is safe for fence_in from now (the shared pool's heartbeat was acknowledged): s hears
 * {state: "held", fenceInMs} when its Acquire asked for fence, and stops its command should no renewal
 * follow in time (io.slotbroker(7)). Nothing is sent otherwise. The caller paces them (design memo 4.4: when
 * the deadline moved by a second or more, at most once a second). Returns whether a renewal went out. */
bool session_lease_renew(Session *s, usec_t fence_in);
/* session_lease_renew() of every session holding a lease of `pool`, safe until `deadline` (CLOCK_BOOTTIME):
 * the shared pool's heartbeat moved its self-fence deadline. Returns how many renewals went out. */
unsigned session_table_renew_pool(SessionTable *t, const char *pool, usec_t deadline);
/* Release of l from session by (its holder, or another connection of its uid or root): the holder hears
 * "released" (or "revoked" while l's command runs) before by's reply. */
void session_lease_release(Session *by, Lease *l);

/* An engine event: a request queued, granted or refused, a lease reaching max-hold, a pool's gauge. */
void session_on_engine_event(SessionTable *t, const EngineEvent *ev);

/* A restart's handover (handover.h, SPEC §3.4): what s asked for goes into *ret (has_acquire false for a
 * session without an Acquire). Returns 0; -EBUSY when s cannot go as it is (a grant being written, a request
 * a shared pool has not answered yet, a History or Status reply on its way); -ENOMEM. */
int session_export(Session *s, HandoverAcquire *ret, bool *ret_has_acquire);
/* The handover went: s's request and lease are the next brokerd's now. Its connection is closed without a
 * shutdown, its request forgotten without a withdrawal, its lease kept (the lease log has it). */
void session_handed_over(Session *s);
/* A session taken back at start (its connection restored): its Acquire goes on where it was. A holder takes
 * its lease back (restored from the lease log: nothing here grants), a waiter goes back to its place with
 * its budget (EngineResume), re-checked against the lane's access list and its command's identity. Returns
 * 0 (the session may have been answered: a lane gone, a permission withdrawn); -EPERM when the lease log
 * has no such lease for this peer (uid and pid as the kernel says); -EBUSY when another connection took it
 * back already; -ENOENT when its command is gone; -ENOMEM. The caller closes the connection then (its client
 * re-queues or reclaims). */
int session_resume(Session *s, const HandoverAcquire *a);

typedef enum SessionWithdraw {
        SESSION_WITHDRAW_GONE,          /* its connection closed: audited "cancelled", nobody to answer */
        SESSION_WITHDRAW_CANCELLED,     /* an administrator's Cancel: audited and answered "unavailable" */
        SESSION_WITHDRAW_DENIED,        /* its lane's access list (a reservation: its pool's administrators) no
                                         * longer lets its user in: audited and answered "PermissionDenied",
                                         * as a new request would be */
} SessionWithdraw;

/* Withdraws s's waiting request, if it has one: the one way a waiter leaves other than by the engine's
 * grant or refusal. Returns whether there was one. */
bool session_waiter_withdraw(Session *s, SessionWithdraw why);

/* After a reload: the waiters whose lane (still configured) no longer lets their user in (lane_allows()), and
 * the reservations whose maker no longer administers their pool (pool_admin()), are withdrawn
 * (SESSION_WITHDRAW_DENIED), so that a permission taken away is not granted later from the queue. Holders keep
 * their leases. Returns how many were withdrawn. */
unsigned session_table_withdraw_denied(SessionTable *t);
