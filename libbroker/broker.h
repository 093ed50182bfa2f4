/* SPDX-License-Identifier: MIT */
/* broker.h — libbroker, the client library of slotbroker: ask brokerd for counted slots of shared
 * resources and hold them while a job runs.
 *
 * Conventions: functions return a negative errno on failure and 0 on success; expected outcomes of a
 * request (a refusal, an unknown lane) are documented positive codes, not errors. Out-parameters are
 * last and untouched on failure. The library never logs, never exits, installs no signal handler and
 * never raises SIGPIPE. A BrokerClient is not thread-safe; use one per thread.
 *
 *     BrokerClient *c;
 *     BrokerLease *l;
 *     BrokerAcquireOptions o = BROKER_ACQUIRE_OPTIONS_INIT;
 *     o.lane = "nightly";
 *     if (broker_client_connect(NULL, &c) < 0) …
 *     r = broker_acquire(c, &o, &l);         // 0: granted; > 0: refused (BROKER_REFUSED_BUSY, …)
 *     … the work …
 *     broker_lease_free(l);
 *     broker_client_free(c);                  // closing the connection releases the lease
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct BrokerClient BrokerClient;
typedef struct BrokerLease BrokerLease;

/* Outcomes of a request that are not failures: the broker answered, and the answer was no. Returned as
 * positive values by broker_acquire(), broker_release() and broker_call(), and as BrokerEvent.refusal. */
enum {
        BROKER_GRANTED = 0,
        BROKER_REFUSED_BUSY = 1,     /* io.slotbroker.Busy: no room, and the lane or the client does not wait */
        BROKER_REFUSED_FULL,         /* io.slotbroker.QueueFull: the pool's queue is at its max-queue */
        BROKER_REFUSED_TIMEOUT,      /* io.slotbroker.QueueTimeout: the wait's budget ran out */
        BROKER_REFUSED_SHED,         /* io.slotbroker.QueueShed: the saturated pool's short budget ran out */
        BROKER_REFUSED_UNAVAILABLE,  /* io.slotbroker.Unavailable: drained, removed, cancelled, recovering */
        BROKER_NO_SUCH_LANE,         /* io.slotbroker.NoSuchLane */
        BROKER_PERMISSION_DENIED,    /* io.slotbroker.PermissionDenied, org.varlink.service.PermissionDenied */
        BROKER_INVALID_PARAMETER,    /* io.slotbroker.InvalidParameter, org.varlink.service.InvalidParameter */
        BROKER_NO_SUCH_LEASE,        /* io.slotbroker.NoSuchLease */
        BROKER_NO_SUCH_POOL,         /* io.slotbroker.NoSuchPool */
        BROKER_RELOAD_FAILED,        /* io.slotbroker.ReloadFailed */
        BROKER_METHOD_NOT_FOUND,     /* org.varlink.service.MethodNotFound, MethodNotImplemented, InterfaceNotFound */
        BROKER_ERROR_OTHER,          /* any other Varlink error: see broker_client_error_name() */
        _BROKER_RESULT_MAX,
};

/* True for the refusals that a retry later may turn into a grant (busy, full, timeout, shed,
 * unavailable): those carry a retryAfterSec. */
#define BROKER_RESULT_IS_CONFLICT(r) ((r) >= BROKER_REFUSED_BUSY && (r) <= BROKER_REFUSED_UNAVAILABLE)

/* The client's wish about waiting. The lane's policy decides; the client can only ask for less. */
typedef enum BrokerWait {
        BROKER_WAIT_DEFAULT = 0, /* as the lane says */
        BROKER_WAIT_YES,         /* sent as wait: true, which is also the broker's default */
        BROKER_WAIT_NO,          /* wait: false: refuse at once (busy) rather than queue */
} BrokerWait;

/* Where a waiting request stands, from the broker's "queued" replies. */
typedef struct BrokerPosition {
        const char *pool;   /* the pool waited on; valid until the next call on the client */
        uint64_t position;  /* 1 for the next to be granted */
        uint64_t queued;    /* requests waiting in that pool */
        int64_t budget_ms;  /* the wait's budget, fixed when it joined the queue; -1: unbounded */
} BrokerPosition;

typedef void (*BrokerPositionCallback)(const BrokerPosition *position, void *userdata);

/* Parameters of an Acquire call. Initialise with BROKER_ACQUIRE_OPTIONS_INIT: `size` lets later
 * versions append fields without breaking programs built against this header, and fields whose "not
 * given" is not zero (pidfd) get it there. */
typedef struct BrokerAcquireOptions {
        size_t size;                    /* sizeof(BrokerAcquireOptions) */
        const char *lane;               /* mandatory */
        unsigned slots;                 /* 0: one slot */
        BrokerWait wait;
        uint64_t queue_wait_ms;         /* cap on the wait, 1 .. 2^31-1; 0: no cap of the client's */
        const char *job;                /* a label for status and history (the CI job's URL); NULL: none */
        pid_t pid;                      /* the command that holds the lease with the connection: the caller
                                         * or a direct child of it with the same uid; 0: none */
        const char *reclaim;            /* id of a lease to take back after a restart of the broker; NULL */
        bool detach;                    /* held by no connection; ends on Release or max_hold_ms (mandatory) */
        uint64_t max_hold_ms;           /* the longest hold wanted; can only shorten the lane's; 0: lane's */
        BrokerPositionCallback on_position; /* broker_acquire() only: called on every "queued" reply */
        void *userdata;                 /* passed to on_position */
        int pidfd;                      /* the command as a pidfd (pidfd_open(2)), passed to the broker with the
                                         * call (SCM_RIGHTS): the same rules as pid, but it names the process
                                         * whatever PID namespace the caller lives in (a container); the caller
                                         * keeps it. Not together with pid. Negative: none (the INIT's -1) */
        bool fence;                     /* ask for "held" renewals (BROKER_EVENT_HELD) while the lease is held:
                                         * a lease of a shared pool is safe only while they keep coming. A
                                         * broker that does not know fencing is asked again without it, and
                                         * sends none */
        /* SPEC §3.5, for member pools with labels: every member granted carries each label "L" and none
         * of the labels "!L" (NULL-terminated, at most 32; on top of the lane's labels=); NULL: none.
         * A broker that does not know them refuses the call (BROKER_INVALID_PARAMETER). Added with
         * version node LIBBROKER_2 (broker_acquire, broker_acquire_start): fields only ever come at the
         * end, and size tells the library which ones the caller knows. */
        const char *const *labels;
        const char *member;             /* the one member wanted, by name; NULL: any */
        /* SPEC §3.6: a reservation for a person in this (local) pool: io.slotbroker.Reserve, ahead of every
         * waiting job, detached, held max_hold_ms (mandatory) from its grant, with reason (mandatory: one
         * printable line); lane, slots, wait, pid, pidfd, reclaim, fence and job are not sent. Root or the
         * pool's admin-users=/admin-groups= (BROKER_PERMISSION_DENIED otherwise). NULL: an Acquire. */
        const char *reserve_pool;
        const char *reason;
} BrokerAcquireOptions;

#define BROKER_ACQUIRE_OPTIONS_INIT ((BrokerAcquireOptions) { .size = sizeof(BrokerAcquireOptions), .pidfd = -1 })

typedef enum BrokerEventType {
        BROKER_EVENT_NONE = 0, /* nothing (more) has arrived: poll the fd */
        BROKER_EVENT_QUEUED,   /* the request waits: .position */
        BROKER_EVENT_GRANTED,  /* granted: .lease is the caller's, to free with broker_lease_free() */
        BROKER_EVENT_REFUSED,  /* refused: .refusal, .retry_after_sec, .pool, .waited_ms, .reason */
        BROKER_EVENT_RELEASED, /* the lease was released from another connection */
        BROKER_EVENT_REVOKED,  /* the lease was revoked (max-hold, an administrator): stop the work */
        BROKER_EVENT_HELD,     /* options.fence: the lease is renewed; stop the work if no renewal comes
                                * within .fence_in_ms of this event (the broker may be stopped or gone) */
        _BROKER_EVENT_MAX,
} BrokerEventType;

/* What broker_client_process() found. Strings are borrowed from the client and stay valid until the
 * next call on it. Initialise with BROKER_EVENT_INIT (`size`, as for the options). */
typedef struct BrokerEvent {
        size_t size;                /* sizeof(BrokerEvent) */
        BrokerEventType type;
        BrokerPosition position;    /* QUEUED */
        BrokerLease *lease;         /* GRANTED */
        int refusal;                /* REFUSED: a BROKER_REFUSED_…, BROKER_NO_SUCH_LANE, … code */
        unsigned retry_after_sec;   /* REFUSED: for busy, full, timeout, shed, unavailable; else 0 */
        const char *pool;           /* REFUSED: the pool that refused, when the broker named one */
        uint64_t waited_ms;         /* REFUSED: timeout and shed: how long the request waited */
        const char *reason;         /* REFUSED: unavailable: "drained", "cancelled", …; busy: "cooldown" or NULL; NULL otherwise */
        uint64_t fence_in_ms;       /* HELD: how long the lease is safe from the moment it was received */
        uint64_t kill_within_ms;    /* HELD: once fenced, how long the work may take to stop (SIGKILL by then);
                                     * UINT64_MAX: the broker did not say */
} BrokerEvent;

#define BROKER_EVENT_INIT ((BrokerEvent) { .size = sizeof(BrokerEvent) })

/* ---- connections ---- */

/* The socket a client connects to when given none, in a new string: $SLOTBROKER_SOCKET if set; for root
 * /run/brokerd/io.slotbroker; for other users $XDG_RUNTIME_DIR/brokerd/io.slotbroker (or
 * /run/user/UID/…) when that socket exists, else the system socket (whose group admits CI users).
 * Returns 0, or -ENOMEM. */
int broker_client_default_socket_path(char **ret);

/* Connects to brokerd on socket_path (NULL: broker_client_default_socket_path()). The socket is
 * O_CLOEXEC. Returns 0; -ENOENT or -ECONNREFUSED when no broker listens there; -EACCES when the socket
 * may not be opened; -ENAMETOOLONG; -ENOMEM; another negative errno from socket() or connect(). */
int broker_client_connect(const char *socket_path, BrokerClient **ret);

/* Closes the connection, which withdraws a waiting request and releases a lease the connection holds
 * (unless a command attached to it still runs), and frees the client. Accepts NULL. Returns NULL. */
BrokerClient *broker_client_free(BrokerClient *c);

/* The connection's socket, for poll(): wait for POLLIN (and POLLOUT when broker_client_get_events()
 * says so), then call broker_client_process(). Returns the fd, or -EINVAL, -ENOTCONN after the broker
 * went away. */
int broker_client_get_fd(const BrokerClient *c);

/* The poll() events to wait for on broker_client_get_fd(): POLLIN, and POLLOUT while a call is not fully
 * sent. Returns them, or -EINVAL. */
int broker_client_get_events(const BrokerClient *c);

/* The socket path the client connected to; owned by the client. Returns it, or NULL for c == NULL. */
const char *broker_client_get_socket_path(const BrokerClient *c);

/* ---- acquiring ---- */

/* Sends an Acquire call (with "more") and returns at once; the replies come through
 * broker_client_process(). One request or lease per client at a time. Returns 0; -EINVAL for missing or
 * invalid options (no lane, detach without max_hold_ms, queue_wait_ms out of range, both pid and pidfd);
 * -EBADF for a pidfd that is not open; -E2BIG when
 * options->size is larger than this library knows and the unknown fields are not zero; -EBUSY while a
 * request or a lease is open on this client; -ENOTCONN after the broker went away; -ENOMEM; another
 * negative errno when the call cannot be sent. */
int broker_acquire_start(BrokerClient *c, const BrokerAcquireOptions *options);

/* Takes what the broker sent without blocking, and reports one event in *ret: call it until it returns
 * BROKER_EVENT_NONE before polling again. After GRANTED the connection stays open as the lease's life
 * line and may still report RELEASED or REVOKED, and HELD renewals when options->fence asked for them. Returns the event type (>= 0); -ECONNRESET when the
 * broker closed the connection (a waiting request is then lost; a lease held by a command survives in
 * the broker); -EBADMSG for a reply that breaks the protocol; -EMSGSIZE for one larger than
 * VARLINK_REPLY_MAX_DEFAULT (16 MiB); -ENOTCONN after either; -EINVAL; -ENOMEM. *ret is written for
 * every non-negative return. */
int broker_client_process(BrokerClient *c, BrokerEvent *ret);

/* broker_acquire_start(), then waits (poll, retried on EINTR) until the request is granted or refused,
 * calling options->on_position on every "queued" reply. Returns 0 and the lease in *ret; a positive
 * BROKER_REFUSED_… / BROKER_NO_SUCH_LANE / BROKER_PERMISSION_DENIED / BROKER_INVALID_PARAMETER /
 * BROKER_NO_SUCH_LEASE code for a refusal (see broker_client_retry_after_sec()); or a negative errno
 * as broker_acquire_start() and broker_client_process() return them.
 *
 * A restart of brokerd that does not keep the connection (brokerd started by hand, a crash, a stop and
 * a start) ends a waiting call with -ECONNRESET, and the request is gone from the broker's queue. The
 * library does not queue it again by itself: whether a second wait is wanted, and for how long, is the
 * caller's to decide. A caller that wants it does what `slotctl run` does: frees the client, connects
 * again (broker_client_connect() fails with -ENOENT or -ECONNREFUSED until the broker listens again:
 * retry with a backoff, bounded in time) and sends the same options again, with queue_wait_ms lowered
 * by the time already waited so that its own cap is not extended. The request then joins the queue at
 * its end. A -EBADMSG or -EMSGSIZE is a broker that broke the protocol: not worth retrying. */
int broker_acquire(BrokerClient *c, const BrokerAcquireOptions *options, BrokerLease **ret);

/* Details of the last refusal or Varlink error seen on this client, for messages: the retryAfterSec
 * the broker suggested (0 when none), the qualified error name ("io.slotbroker.Busy") and its
 * parameters as JSON text. The strings are owned by the client and valid until its next call. Return
 * them; 0 or NULL when there was none. */
unsigned broker_client_retry_after_sec(const BrokerClient *c);
const char *broker_client_error_name(const BrokerClient *c);
const char *broker_client_error_parameters(const BrokerClient *c);

/* ---- other calls ---- */

/* Releases a lease by id, as its owner's uid or root; a lease whose command still runs is revoked
 * rather than freed. The call goes over the client's connection when it is idle, else over a new one
 * to the same socket (a call behind an open Acquire would wait for the lease to end). Returns 0;
 * BROKER_NO_SUCH_LEASE; BROKER_PERMISSION_DENIED; BROKER_INVALID_PARAMETER; another positive code for
 * other Varlink errors; a negative errno as broker_call(). */
int broker_release(BrokerClient *c, const char *lease_id);

/* As broker_release(), also telling the broker the exit status (0 to 255) of the command that held the
 * lease: a pool with quarantine-exit-codes= may quarantine its members, a health lane's 0 restores them
 * (SPEC §3.6). A broker older than this refuses the parameter (BROKER_INVALID_PARAMETER); closing the
 * connection still releases the lease. Returns as broker_release(); -EINVAL for a status out of range. */
int broker_release_exit(BrokerClient *c, const char *lease_id, int exit_status);

/* Releases the lease this client holds, over its own connection, and returns at once: the lease's end
 * comes through broker_client_process() as RELEASED (REVOKED while its command still runs), which takes
 * the Release's reply too; an error in that reply is kept for broker_client_error_name(). For event loops
 * that drive many clients; broker_acquire_start() may follow the RELEASED event at once. Returns 0;
 * -ESRCH when no lease is held on this connection; -EALREADY when a release is already on its way;
 * -ENOTCONN after the broker went away; -ENOMEM; another negative errno when the call cannot be sent. */
int broker_release_start(BrokerClient *c);

/* As broker_release_start(), also telling the broker the exit status (0 to 255) of the command that held
 * the lease, as broker_release_exit() does: for a caller that must not block on a broker that does not
 * answer (slotctl run, whose command has exited). A broker older than this refuses the parameter: the
 * reply's error is kept for broker_client_error_name() and no RELEASED comes (closing the connection, or
 * broker_release_start(), still releases the lease). Returns as broker_release_start(); -EINVAL for a
 * status out of range. */
int broker_release_exit_start(BrokerClient *c, int exit_status);

/* A call with one reply: method is "io.slotbroker.Status" or just "Status" (io.slotbroker is implied);
 * parameters_json is a JSON object's text, or NULL for {}. Runs on the client's connection when it is
 * idle, else on a new one (as broker_release()), and blocks until the reply. Returns 0 and the reply's
 * parameters as JSON text in *ret_reply_json (NULL: dropped; free() it); a positive BROKER_… code when
 * the broker answered with an error (its name and parameters: broker_client_error_name(),
 * broker_client_error_parameters()); -EINVAL for an invalid method name or parameters that are not a
 * JSON object; -ECONNRESET when the broker closed the connection; -EBADMSG, -EMSGSIZE; -ENOMEM; the
 * errors of broker_client_connect() for a new connection. */
int broker_call(BrokerClient *c, const char *method, const char *parameters_json, char **ret_reply_json);

/* ---- leases ---- */

/* Frees a lease object (it does not release the lease: closing its connection or broker_release()
 * does). Accepts NULL. Returns NULL. */
BrokerLease *broker_lease_free(BrokerLease *l);

/* The lease's fields, as the broker granted them. Strings are owned by the lease. broker_lease_id(),
 * _pool() and _lane() return a string (NULL only for l == NULL); broker_lease_job() NULL when the
 * lease has no job label. */
const char *broker_lease_id(const BrokerLease *l);
const char *broker_lease_pool(const BrokerLease *l);
const char *broker_lease_lane(const BrokerLease *l);
const char *broker_lease_job(const BrokerLease *l);
/* The fencing token: per pool, strictly increasing. Returns it, or 0 for l == NULL. */
uint64_t broker_lease_token(const BrokerLease *l);
/* Number of slots held. Returns it, or 0 for l == NULL. */
size_t broker_lease_n_slots(const BrokerLease *l);
/* The i-th slot's index in its pool, 0 .. limit-1. Returns it, or -EINVAL / -ERANGE. */
int broker_lease_slot(const BrokerLease *l, size_t i);
/* The i-th slot's member name, for a pool of named members. Returns it; NULL for a pool without members
 * or i out of range. */
const char *broker_lease_member(const BrokerLease *l, size_t i);
/* When the lease was granted, and when max-hold ends it, in µs since the epoch (CLOCK_REALTIME).
 * Return them; broker_lease_expires_at() returns 0 for a lease without max-hold. */
uint64_t broker_lease_granted_at(const BrokerLease *l);
uint64_t broker_lease_expires_at(const BrokerLease *l);
/* The lease object as the broker sent it (JSON text, io.slotbroker.Lease). Returns it, or NULL. */
const char *broker_lease_json(const BrokerLease *l);
/* An all-or-nothing lease (a lane with also=) holds slots of further pools too, in the lane's order: their
 * number (0 for a lease of one pool, or l == NULL), and the i-th as a lease object owned by l (valid while l
 * is), whose _pool(), _token(), _n_slots(), _slot() and _member() are that pool's and whose id, lane, job
 * and times are l's; NULL for i out of range. Not to be freed or released on its own. */
size_t broker_lease_n_also(const BrokerLease *l);
const BrokerLease *broker_lease_also(const BrokerLease *l, size_t i);

/* Short names of results and events for messages: "busy", "full", "timeout", "shed", "unavailable",
 * "no-such-lane", …; "granted" for 0. Return a static string, or NULL for an unknown value. */
const char *broker_result_to_string(int result);
const char *broker_event_type_to_string(BrokerEventType t);

#ifdef __cplusplus
}
#endif
