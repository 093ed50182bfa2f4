/* SPDX-License-Identifier: MIT */
/* methods.h — the Varlink interfaces brokerd serves: org.varlink.service and io.slotbroker, bound to each
 * client connection as its call and disconnect handlers (userdata: its Session). */
#pragma once

#include "conf.h"
#include "connection.h"
#include "engine.h"
#include "history-call.h"
#include "lease.h"
#include "metrics.h"
#include "persistence.h"
#include "session.h"
#include "varlink.h"

/* When a kind of view (Status, Metrics) was last rendered, and when it may be again (methods_views_flush()). */
typedef struct ViewPace {
        uint64_t rendered;              /* the loop iteration of its last rendering */
        usec_t next;                    /* monotonic: not before, while callers keep asking */
} ViewPace;

/* What the methods read and call, embedded in their owner (the Manager), which keeps it current and
 * hands it to the sessions as their call handler's userdata (SessionTable.call_userdata). */
typedef struct Methods {
        const BrokerConfig *config;     /* the owner's, updated at reload */
        Engine *engine;
        SessionTable *sessions;
        LeaseTable *leases;
        Persistence *persistence;
        HistoryCalls *history_calls;
        const Metrics *metrics;
        int (*reload)(ConfErrors *errors, void *userdata);        /* Reload: 0, or -EINVAL with errors */
        void (*gauges)(MetricsGauges *ret, void *userdata);       /* Metrics: the gauges as of now */
        void (*status_changed)(void *userdata);                   /* Drain: STATUS= is stale */
        BackendPrimaryFn backend_primary;                         /* Status: a pool's primary; may be NULL */
        /* Status: the engine's queued events handed on first (a grant becomes its lease), so that one reply
         * counts each grant once, in inUse and in holders alike. False when that cannot be done now (the
         * owner is handing them on already, and a call resumed by one of them asks): the reply then waits
         * for methods_views_flush(). NULL: the engine is taken as it is (tests). */
        bool (*settle)(void *userdata);
        void *userdata;
        sd_event *event;                /* for status_timer, views_wake and views_timer */
        sd_event_source *status_timer;  /* the first waiting Status reply's deadline; made at the first wait */
        sd_event_source *views_wake;    /* a dispatch for the calls that wait for the next iteration's rendering */
        sd_event_source *views_timer;   /* the end of a kind's rest (ViewPace.next) while its calls wait */
        ViewPace status_pace, metrics_pace;
        bool stopping;                  /* the owner stops: no rest (a call waiting for one is not handed over) */
        List *answering;                /* the list whose calls a rendering is being sent to, and that text */
        SessionText *answering_text;
        /* Quarantine, Restore: may uid (with these groups) administer the pool's members (SPEC §3.6)? */
        bool (*pool_admin)(const char *pool, uid_t uid, const gid_t *groups, size_t n_groups, void *userdata);
} Methods;

/* Status and Metrics callers that keep asking (dozens of `watch slotctl status`, a scraper gone wild) get
 * at most a tenth of the loop that every Acquire waits for: a kind of view is rendered again only after a rest
 * of this many times what its last rendering and replies took (a rest of ~2 µs after a small pool's Status,
 * ~30 ms after 1,500 members' Metrics). A lone call is answered at once as before. */
#define METHODS_VIEW_REST_FACTOR 9
#define METHODS_VIEW_REST_MAX (1 * USEC_PER_SEC)

/* How long a Status reply waits for the shared pools' snapshots of other nodes to be fetched after the
 * call came (SPEC §11: the view it gives is fresh, and says how old it is); past it, the last ones do. */
#define METHODS_STATUS_FRESH_WAIT (1 * USEC_PER_SEC)

/* Answers (or starts answering) one call, or defers it behind the session's open Acquire. Unknown methods
 * get the standard Varlink errors. */
ConnectionCallResult methods_on_call(Connection *c, const VarlinkCall *call, void *userdata);
/* Answers the waiting Metrics calls, and the waiting Status calls whose shared pools have a snapshot asked for
 * after the call (or none coming) or whose wait is over: each kind rendered once for all of them, at most once
 * per loop iteration (calls that come after the rendering wait for the next iteration's), and after a rest of
 * METHODS_VIEW_REST_FACTOR times what the last rendering and its replies took (METHODS_VIEW_REST_MAX at most).
 * The owner calls it after each dispatch (its drain), once it has settled. Returns true when it answered one:
 * the calls behind it ran, and may have left the engine events to settle and lease rows to write. */
bool methods_views_flush(Methods *m, usec_t now);
/* The status timer and the wake source go. */
void methods_done(Methods *m);
/* The connection went: a History reply being produced stops, then the session ends. */
void methods_on_disconnect(Connection *c, void *userdata);
