/* SPDX-License-Identifier: MIT */
/* manager.h — the composition root: configuration, the engine and its clock, sessions, leases, the
 * timers, and the drain that hands the engine's events on. Everything here runs on one sd-event loop.
 * The map of brokerd's modules and their layers is brokerd/README.md: read it first. */
#pragma once

#include <stdbool.h>
#include <sys/socket.h>
#include <systemd/sd-event.h>

#include "audit.h"
#include "config.h"
#include "conf.h"
#include "engine.h"
#include "handover.h"
#include "history-call.h"
#include "lease.h"
#include "list.h"
#include "methods.h"
#include "metrics.h"
#include "persistence.h"
#include "poller.h"
#include "session.h"
#include "time-util.h"
#if HAVE_REDIS
#include "backend.h"
#include "node.h"
#endif

typedef struct History History;

/* A lane's access list, resolved to ids when the configuration is loaded. */
typedef struct LaneAcl {
        const char *lane;               /* borrowed from the config */
        bool restricted;                /* false: anyone who may open the socket */
        uint32_t *uids;                 /* uid_t and gid_t are 32 bits on Linux */
        size_t n_uids;
        uint32_t *gids;
        size_t n_gids;
        /* A pool's admin-users=/admin-groups= (SPEC §3.6): `lane` is then the pool's name. */
        bool pool;
} LaneAcl;

typedef struct Manager {
        sd_event *event;
        char *config_path;              /* --config, or NULL for /etc/brokerd/brokerd.conf */
        BrokerConfig *config;
        LaneAcl *acls;
        size_t n_acls;
        char *socket_path;              /* where we listen (self-bound), or NULL under socket activation */
        bool socket_bound_here;
        char *state_directory;

        Audit audit;
        Metrics metrics;
        History *history;               /* NULL until opened */
        LeaseLog *lease_log;            /* NULL until what was persisted has been read */
        int lease_log_error;            /* why the last write of a snapshot failed (negative errno), or 0 */
        usec_t lease_log_retry_at;      /* monotonic: when to try a snapshot again */
        usec_t lease_log_alive_at;      /* monotonic: when to write the next alive mark */

        Engine *engine;
        /* getrandom() drawn in blocks: lease ids and the engine's jitter cost a syscall per block. */
        uint8_t random_pool[256];
        size_t random_left;
        sd_event_source *engine_timer;  /* the engine's next deadline: the drain runs after it */
        usec_t engine_timer_at;         /* as armed; USEC_INFINITY: off */

        int listen_fd;
        sd_event_source *listen_source;
        /* Out of fds, accept() fails and the socket stays readable: the listener is switched off until a
         * connection closes or this timer fires. */
        sd_event_source *accept_resume_timer;
        bool accept_paused;
        bool accept_starved;            /* in an episode of accept() failing for want of fds (logged once) */
        /* max-closing-fds reached: the listener is off until the closer is below it (closer_notify_fd()). */
        bool accept_closer_paused;
        usec_t accept_closer_logged;    /* monotonic: the last line about it (one a second at most) */
        sd_event_source *closer_source; /* the closer's eventfd: counts fell below their limits */
        Poller *poller;                 /* the connections' sockets */
        SessionTable sessions;          /* one per client connection */
        bool settling;                  /* in manager_settle(): its events' handlers may resume calls */

        LeaseTable leases;

        sd_event_source *tick_timer;    /* once a second: process groups, audit summaries, STATUS= */
        sd_event_source *watchdog_timer;
        usec_t watchdog_usec;
        bool status_dirty;
        usec_t idle_since;              /* monotonic: since when nothing was connected or held */
        /* A clean stop (SIGTERM, SIGINT, idle exit) in progress: the loop runs on, bounded, until Redis has
         * taken this node's waiters out of the shared pools. */
        bool stopping;
        sd_event_source *stop_timer;
        /* A stop with systemd's fd store at hand (SPEC §3.4): the connections go to the store, with their
         * state, once no grant is being written (handover.h). */
        bool handing_over;
        HandoverFds handover_fds;       /* what systemd passed at start besides the listening socket */
        uint64_t token_floor_all;       /* fencing tokens of every pool continue above it; 0: none */

        /* SPEC §3.4: nothing is granted before what was persisted has been read (persistence.h). */
        Persistence persistence;
        bool state_loading;             /* an asynchronous read is on its way */
        usec_t state_retry_at;          /* monotonic: when to read it again */
        int state_error;                /* why the last read failed (negative errno) */
        int state_lock_fd;              /* STATE_LOCK_FILE's flock: one brokerd a state directory */
        unsigned refused_unlogged;      /* connections refused at a limit since the last line about it */
        size_t freed_untrimmed;         /* bytes of big buffers freed since the last malloc_trim() */
        HistoryCalls history_calls;     /* History replies being produced, page by page */
        Methods methods;                /* what the Varlink methods read and call */
#if HAVE_REDIS
        /* Shared pools: this daemon's identity there (read when the first one is made) and their Redis. */
        Node node;
        bool node_loaded;
        BackendTable backends;
#endif
        /* SPEC §3.6: drains and quarantines kept in the state directory's members.state (member-state.h). */
        bool member_state_loaded;       /* read (or found damaged and moved aside): it may be written */
        bool member_state_unrecorded;   /* found damaged, and state.damaged could not say so: nothing is granted */
        bool member_state_dirty;        /* a MEMBER or DRAIN event since the last write */
        bool member_state_failed;       /* the last write failed (said once) */
        struct MemberStateEntry *member_pending; /* read, for pools or members not configured now */
        size_t n_member_pending;
        /* The MEMBER and DRAIN events of what members.state put back: state carried over, not news for the
         * journal and the history (the first such events after the apply, which emits one per change). */
        size_t member_events_replayed;
} Manager;

typedef struct ManagerOptions {
        const char *config_path;
        const char *socket_path;        /* overrides config and default */
        const char *state_directory;    /* overrides config and default */
} ManagerOptions;

int manager_new(const ManagerOptions *o, Manager **ret);
Manager *manager_free(Manager *m);
DEFINE_TRIVIAL_CLEANUP_FUNC(Manager *, manager_free);

/* Opens (or takes from systemd) the socket and starts serving. Returns 0 or negative errno. */
int manager_start(Manager *m);
/* Runs the loop until it exits; returns its exit code or a negative errno. */
int manager_run(Manager *m);
/* One turn of it: one dispatch (waiting up to timeout µs for something to dispatch), then the drain. Returns
 * as sd_event_run(). */
int manager_run_once(Manager *m, uint64_t timeout);

/* The drain: settles the engine at the current time, hands its events to sessions and leases, re-arms the
 * engine timer, frees closed sessions. manager_run() calls it after every dispatch of the loop, so handlers
 * never call it; public for tests that run no loop. */
void manager_drain(Manager *m);

/* Serves an accepted socket (taken; closed on failure): its session, its methods. cred: its peer's, or NULL
 * to read them. Returns 0 or negative errno. */
int manager_add_connection(Manager *m, int fd, const struct ucred *cred);

/* Reloads configuration files. Returns 0, or -EINVAL with errors filled (the old config stays). */
int manager_reload(Manager *m, ConfErrors *errors);
/* Whether the users and groups that c names (allow-users=, admin-groups=, …) exist on this host, as a start
 * and a reload require. For --check-config. Returns 0, -EINVAL with each unknown name in errors, -ENOMEM. */
int manager_check_names(const BrokerConfig *c, ConfErrors *errors);

/* May uid (with its groups) use the lane? Root always may. */
bool manager_pool_admin_allows(const Manager *m, const char *pool, uid_t uid, const gid_t *groups, size_t n_groups);
bool manager_lane_allows(const Manager *m, const char *lane, uid_t uid, const gid_t *groups, size_t n_groups);

/* A connection's fd was closed: accepting resumes if it was paused for want of fds. */
void manager_fd_released(Manager *m);

/* Buffers of this size were freed (a connection's output, a History reply's events): past a few MiB,
 * malloc_trim() runs at the end of the loop iteration. Returns nothing; never fails. */
void manager_memory_freed(Manager *m, size_t bytes);

/* Marks STATUS= for an update at the next tick, within a second (an idle brokerd's tick is woken). */
void manager_status_changed(Manager *m);

/* The random source of the engine (userdata: the Manager) and of lease ids. */
uint64_t manager_random(void *userdata);
void manager_random_bytes(Manager *m, void *buf, size_t n);

/* The gauges of the Metrics method and of metrics-textfile=, as of now: the engine settled first, so that its
 * slots in use and the lease table's leases agree. */
void manager_metrics_gauges(Manager *m, MetricsGauges *ret);

/* Monotonic µs → realtime µs, for timestamps clients see. */
usec_t manager_realtime_of(usec_t monotonic);
