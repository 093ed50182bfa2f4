/* SPDX-License-Identifier: MIT */
/* history.h — the state directory's SQLite database (history.db): the decision history, the active leases
 * and the fencing-token high-water marks (SPEC §3.4, §7).
 *
 * The event loop never touches the disk: every statement runs on one writer thread with its own
 * connection; results come back to the loop through an eventfd watched by sd-event. Decision rows are
 * batched (one transaction per batch); lease rows are committed before their grant is answered (small WAL
 * commits, grouped when several are pending). A failing disk degrades history, not admission. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <systemd/sd-event.h>

#include "audit.h"
#include "macro.h"
#include "time-util.h"

typedef struct History History;

/* Fencing tokens are reserved this many at a time: one high-water write per block, not per grant. */
#define HISTORY_TOKEN_BLOCK 1024

/* A lease as it is kept for a restart. */
typedef struct HistoryLeaseRow {
        char *id;
        char *pool;
        char *lane;
        unsigned *slots;
        unsigned n_slots;
        uint64_t token;
        char *job;                /* may be NULL */
        uid_t uid;
        pid_t pid;
        pid_t command_pid;        /* 0: none */
        uint64_t command_start_time;
        bool detached;
        usec_t granted_at;        /* realtime µs */
        usec_t expires_at;        /* realtime µs; USEC_INFINITY: no max-hold */
} HistoryLeaseRow;

void history_lease_row_done(HistoryLeaseRow *row);

/* A pool's next unused fencing token as persisted. */
typedef struct HistoryTokenFloor {
        char *pool;
        uint64_t next_token;
} HistoryTokenFloor;

typedef struct HistoryQuery {
        usec_t since, until;      /* realtime µs; 0 and USEC_INFINITY: unbounded */
        const char *lane, *pool, *decision;
        unsigned limit;           /* capped at HISTORY_QUERY_LIMIT_MAX */
        int64_t cursor;           /* 0: from the start; else continue after this event id */
} HistoryQuery;

#define HISTORY_QUERY_LIMIT_MAX 1000

/* Called on the loop thread. result: 0 durable; HISTORY_NOT_PERSISTED when history is degraded (nothing
 * can be written: the lease lives in memory only); a negative errno when the write failed. */
#define HISTORY_NOT_PERSISTED 1
typedef void (*HistoryDoneFn)(History *h, int result, void *userdata);
/* events: a JSON array of HistoryEvent objects as io.slotbroker.varlink defines them (borrowed);
 * next_cursor: 0 when there is no further page. */
typedef void (*HistoryQueryFn)(History *h, int error, json_t *events, int64_t next_cursor, void *userdata);

/* Opens (creating, migrating) directory/history.db on the writer thread. Never fails for disk reasons: a
 * database that cannot be opened puts history in the degraded state (logged once, retried every few
 * seconds); a corrupt or foreign file is moved aside as history.db.corrupt-<timestamp> and a fresh one
 * made. retention: rows older than this are pruned, a little at a time. Returns 0, -ENOMEM, or errors
 * creating the thread. */
int history_new(sd_event *event, const char *directory, usec_t retention, History **ret);
/* Writes what is queued (waiting at most a few seconds for the disk), stops the thread, frees. */
History *history_free(History *h);
DEFINE_TRIVIAL_CLEANUP_FUNC(History *, history_free);

/* At start, before the first request (blocking is fine then): the persisted leases and token floors.
 * Both return 0 with nothing when the database is degraded. */
int history_load_leases(History *h, HistoryLeaseRow **ret, size_t *ret_n);
int history_load_token_floors(History *h, HistoryTokenFloor **ret, size_t *ret_n);

/* Queues a decision row; never blocks. Past a bound (HISTORY_BACKLOG_MAX) rows are dropped and counted,
 * and the count is logged once per episode. */
#define HISTORY_BACKLOG_MAX 100000
void history_append(History *h, const AuditRecord *r, usec_t realtime);

/* Commits a lease row — and, when its token reaches the pool's reserved high-water mark, the next
 * HISTORY_TOKEN_BLOCK tokens — then calls done on the loop thread: 0 when durable (as WAL with
 * synchronous=NORMAL makes it), a negative errno when it could not be written (the grant must then be
 * refused: SPEC §3.4), HISTORY_NOT_PERSISTED when history is degraded. Several pending commits are
 * grouped into one transaction. Returns 0 or -ENOMEM. */
int history_lease_commit(History *h, const HistoryLeaseRow *row, HistoryDoneFn done, void *userdata);
/* Forgets a lease row (ordered after its commit). Never blocks. */
void history_lease_delete(History *h, const char *id);

/* Runs a History query on the writer thread. Returns 0 or -ENOMEM. */
int history_query(History *h, const HistoryQuery *q, HistoryQueryFn done, void *userdata);
/* A pending done/query callback's userdata is going away: it will not be called. */
void history_cancel(History *h, void *userdata);

/* True while the database works; false in the degraded state. */
bool history_is_healthy(const History *h);

/* For metrics: rows written, rows dropped, the longest batch commit (µs). */
typedef struct HistoryStats {
        uint64_t rows_written;
        uint64_t rows_dropped;
        uint64_t commits;
        usec_t longest_commit;
        bool healthy;
} HistoryStats;
void history_get_stats(const History *h, HistoryStats *ret);
