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
        sd_event *event;                /* for status_timer and views_wake */
        sd_event_source *status_timer;  /* the first waiting Status reply's deadline; made at the first wait */
        sd_event_source *views_wake;    /* a dispatch for the calls that wait for the next iteration's rendering */
        uint64_t status_rendered;       /* the loop iteration of the last rendering of each (methods_views_flush()) */
        uint64_t metrics_rendered;
        List *answering;                /* the list whose calls a rendering is being sent to, and that text */
        SessionText *answering_text;
        /* Quarantine, Restore: may uid (with these groups) administer the pool's members (SPEC §3.6)? */
        bool (*pool_admin)(const char *pool, uid_t uid, const gid_t *groups, size_t n_groups, void *userdata);
} Methods;

/* How long a Status reply waits for the shared pools' snapshots of other nodes to be fetched after the
 * call came (SPEC §11: the view it gives is fresh, and says how old it is); past it, the last ones do. */
#define METHODS_STATUS_FRESH_WAIT (1 * USEC_PER_SEC)

/* Answers (or starts answering) one call, or defers it behind the session's open Acquire. Unknown methods
 * get the standard Varlink errors. */
ConnectionCallResult methods_on_call(Connection *c, const VarlinkCall *call, void *userdata);
/* Answers the waiting Metrics calls, and the waiting Status calls whose shared pools have a snapshot asked for
 * after the call (or none coming) or whose wait is over: each kind rendered once for all of them, and at most
 * once per loop iteration (calls that come after the rendering wait for the next iteration's). The owner calls it
 * after each dispatch (its drain), once it has settled. Returns true when it answered one: the calls behind it
 * ran, and may have left the engine events to settle and lease rows to write. */
bool methods_views_flush(Methods *m, usec_t now);
/* The status timer and the wake source go. */
void methods_done(Methods *m);
/* The connection went: a History reply being produced stops, then the session ends. */
void methods_on_disconnect(Connection *c, void *userdata);
