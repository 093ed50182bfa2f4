/* SPDX-License-Identifier: MIT */
/* metrics.h — counters and histograms of decisions, and their Prometheus text (SPEC §7), also written
 * atomically to metrics-textfile= for node_exporter's textfile collector. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "decision.h"
#include "engine.h"
#include "time-util.h"

#define METRICS_WAIT_BUCKETS 12
#define METRICS_HOLD_BUCKETS 11
#define METRICS_RTT_BUCKETS 12

typedef struct MetricsHistogram {
        uint64_t counts[METRICS_HOLD_BUCKETS > METRICS_WAIT_BUCKETS ? METRICS_HOLD_BUCKETS : METRICS_WAIT_BUCKETS];
        uint64_t total;
        double sum; /* seconds */
} MetricsHistogram;

/* One labelled series: pool, lane and (for refusals) reason; names are the engine's interned strings or
 * the audit table's constants, so they outlive the series. */
typedef struct MetricsSeries {
        char *pool;
        char *lane;
        char *reason;      /* NULL: granted */
        uint64_t count;
} MetricsSeries;

typedef struct MetricsPool {
        char *pool;
        MetricsHistogram wait;
        MetricsHistogram hold;
        MetricsHistogram rtt;           /* a shared pool's script calls */
} MetricsPool;

typedef struct Metrics {
        MetricsSeries *series;
        size_t n_series;
        MetricsPool *pools;
        size_t n_pools;
        uint64_t denied;
        uint64_t connections_refused;  /* closed at accept: a connection limit was reached */
        uint64_t accept_fd_exhausted;  /* episodes of accept() failing for want of file descriptors */
        usec_t last_textfile;
} Metrics;

void metrics_done(Metrics *m);
/* Counts one decision (called by the audit sink, for every decision). */
void metrics_record(Metrics *m, const AuditRecord *r);
/* One round trip of a shared pool's call to its backend. */
void metrics_backend_rtt(Metrics *m, const char *pool, usec_t rtt);
/* The gauges: values of the moment that the owner reads from the modules that keep them. */
/* Where a shared pool's backend is behind Sentinels (backend=redis-sentinel://): the primary they named
 * last ("HOST:PORT"; NULL before), the failovers seen, the realtime of the last one (0: none), and the
 * CLOCK_BOOTTIME start of the last round in which a majority of them named it (0: none). */
typedef struct BackendPrimary {
        const char *address;
        uint64_t failovers;
        usec_t last_failover;
        usec_t confirmed;
} BackendPrimary;
/* Fills *ret for a pool behind Sentinels and returns true; false for any other pool. */
typedef bool (*BackendPrimaryFn)(const char *pool, BackendPrimary *ret, void *userdata);

typedef struct MetricsGauges {
        const Engine *engine;           /* pools: limit, in use, waiting, congested */
        usec_t now;                     /* monotonic, for the engine's pool gauges */
        unsigned connections;
        unsigned connections_paused;    /* not read: their uid's fds wait in the closer */
        unsigned closing_fds;           /* passed by clients, waiting for the closer's threads */
        unsigned leases;
        unsigned long journal_dropped;
        bool history;                   /* false: no history gauges */
        bool history_healthy;
        uint64_t history_rows_dropped;
        uint64_t history_rows_pending;
        BackendPrimaryFn backend_primary; /* NULL: no pool behind Sentinels */
        void *backend_primary_userdata;
} MetricsGauges;

/* The exposition text. Returns 0 or -ENOMEM; *ret is malloc'ed. */
int metrics_render(const Metrics *m, const MetricsGauges *g, char **ret);
/* Writes the text to path through a short-lived thread: temp file, fsync, rename. Nothing while the last
 * write is still under way (a disk that stalls). */
void metrics_write_textfile(const Metrics *m, const MetricsGauges *g, const char *path);
