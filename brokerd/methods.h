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
        void *userdata;
} Methods;

/* Answers (or starts answering) one call, or defers it behind the session's open Acquire. Unknown methods
 * get the standard Varlink errors. */
ConnectionCallResult methods_on_call(Connection *c, const VarlinkCall *call, void *userdata);
/* The connection went: a History reply being produced stops, then the session ends. */
void methods_on_disconnect(Connection *c, void *userdata);
