/* SPDX-License-Identifier: MIT */
/* history.h — the state directory's SQLite database (history.db): the decision history (SPEC §7), and,
 * read once to carry them over to the lease log, the leases, fencing-token marks and alive mark that an
 * older brokerd kept there (SPEC §3.4).
 *
 * The event loop never touches the disk: every statement runs on one writer thread with its own
 * connection, which also checkpoints the WAL when it has nothing else to do; results come back to the loop
 * through an eventfd watched by sd-event. Decision rows are batched (one transaction per batch); nothing
 * the loop does waits for the writer but a query or the read of the state at start. A failing disk delays
 * decision rows, and drops them past a bound. The database is locked for this process alone while it is
 * open (EXCLUSIVE locking: the WAL index lives in memory, no -shm is mapped). */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <systemd/sd-event.h>

#include "decision.h"
#include "macro.h"
#include "time-util.h"

typedef struct History History;

/* A lease as it is kept for a restart (in the lease log; in history.db by an older brokerd). */
/* Where a shared lease was granted (pool backend=, credentials, node TTL): a restart whose configuration no
 * longer keeps the pool there still heartbeats the lease there and releases it there (SPEC §11). */
typedef struct HistoryLeaseBackend {
        char *url;                /* NULL: a local lease, or one recorded by an older brokerd */
        char *user;
        char *password_file;
        char *sentinel_password_file;
        usec_t node_ttl;
} HistoryLeaseBackend;

typedef struct HistoryLeaseRow {
        char *id;
        char *pool;
        char *lane;
        unsigned *slots;
        unsigned n_slots;
        char **members;           /* n_slots member names (an entry may be NULL), or NULL: anonymous slots */
        uint64_t token;
        char *job;                /* may be NULL */
        uid_t uid;
        pid_t pid;
        pid_t command_pid;        /* 0: none */
        uint64_t command_start_time;
        bool detached;
        usec_t granted_at;        /* realtime µs */
        usec_t expires_at;        /* realtime µs; USEC_INFINITY: no max-hold */
        bool health_known;        /* the lease log said whether it is a health job's (lease log only) */
        bool health;              /* engine_lease_is_health() */
        char *remote_id;          /* a shared pool's name for the lease ("NODE:RID"), or NULL: local */
        HistoryLeaseBackend backend; /* a shared lease's: where it was granted (lease log only) */
        /* Its pool's quarantine rules (SPEC §3.6, engine_lease_quarantine_rules(); lease log only): bit n for exit
         * status n, and how many in a row; quarantine_after 0: none recorded. */
        uint64_t quarantine_exit_codes[4];
        unsigned quarantine_after;
        /* An all-or-nothing lease's further pools (SPEC §3.5, also=; lease log only), in the lane's order. */
        struct HistoryLeaseAlso *also;
        size_t n_also;
} HistoryLeaseRow;

/* One also= pool's share of a lease. */
typedef struct HistoryLeaseAlso {
        char *pool;
        unsigned *slots;
        unsigned n_slots;
        char **members;           /* n_slots names (an entry may be NULL), or NULL */
        uint64_t token;
        char *remote_id;          /* a shared pool's share: the backend's name of it (EngineLeaseAlso); or NULL */
} HistoryLeaseAlso;

void history_lease_row_done(HistoryLeaseRow *row);
/* Frees what history_load_leases() returned. */
void history_lease_rows_free(HistoryLeaseRow *rows, size_t n);

/* The pool name of a floor that applies to every pool: set when a database had to be started afresh and
 * its token marks may be lost (no pool name can contain '*'). */
#define HISTORY_TOKEN_FLOOR_ALL "*"

/* A pool's next unused fencing token as persisted. */
typedef struct HistoryTokenFloor {
        char *pool;
        uint64_t next_token;
} HistoryTokenFloor;

/* Frees what history_load_token_floors() returned. */
void history_token_floors_free(HistoryTokenFloor *floors, size_t n);

typedef struct HistoryQuery {
        usec_t since, until;      /* realtime µs, since ≤ time < until; either 0 or USEC_INFINITY: unbounded */
        const char *lane, *pool, *decision; /* NULL: any */
        unsigned limit;           /* capped at HISTORY_QUERY_LIMIT_MAX; 0: that cap */
        int64_t cursor;           /* 0: from the start; else continue after this event id */
} HistoryQuery;

#define HISTORY_QUERY_LIMIT_MAX 1000

/* Called on the loop thread. events: a JSON array of HistoryEvent objects as io.slotbroker.varlink defines them (borrowed; fields
 * that do not apply are absent), oldest first; next_cursor: 0 when there is no further page. error: 0, or
 * negative errno (-EIO while the database cannot be opened) with events NULL. */
typedef void (*HistoryQueryFn)(History *h, int error, json_t *events, int64_t next_cursor, void *userdata);

/* Opens (creating, migrating) directory/history.db on the writer thread. Never fails for disk reasons: a
 * database that cannot be opened puts history in the degraded state (logged once, retried every 5 s); a
 * corrupt or foreign file (or one of a newer schema) is moved aside as history.db.corrupt-<UTC timestamp>
 * (with its -wal and -shm) and a fresh one made, carrying over the leases and token marks the old one still
 * gives. A history.db.ballast that an older brokerd reserved beside it is removed. retention: rows older
 * than this are pruned, a little at a time (0 or USEC_INFINITY: never). Returns 0, -ENOMEM, or errors
 * creating the eventfd, its event source or the thread. */
int history_new(sd_event *event, const char *directory, usec_t retention, History **ret);
/* Writes what is queued (waiting at most a few seconds for the disk), stops the thread, frees. Pending
 * callbacks are not called. Not from inside a history callback. */
History *history_free(History *h);
DEFINE_TRIVIAL_CLEANUP_FUNC(History *, history_free);

/* What was persisted, as a restart needs it. */
typedef struct HistoryState {
        HistoryLeaseRow *leases;
        size_t n_leases;
        HistoryTokenFloor *floors;
        size_t n_floors;
        usec_t alive_at;          /* realtime µs: brokerd was known to run then; 0: unknown */
} HistoryState;
void history_state_done(HistoryState *s);

/* Reads what was persisted: through the writer's connection, or, when the database cannot be opened for
 * writing, through a read-only one (reading is all a restore needs). No database file at all is an empty
 * state. history_load_state() waits for the answer (at start, before the first request: blocking is fine
 * then); history_load() calls done on the loop thread. Returns (or passes) 0, -ENOMEM, or the error that
 * kept the database from being read (-EACCES, -EIO, -EBADMSG…): then nothing may be granted that the
 * database could say is taken (SPEC §3.4). */
int history_load_state(History *h, HistoryState *ret);
typedef void (*HistoryLoadFn)(History *h, int error, HistoryState *state, void *userdata);
int history_load(History *h, HistoryLoadFn done, void *userdata);
/* The parts of history_load_state(), for tests. */
int history_load_leases(History *h, HistoryLeaseRow **ret, size_t *ret_n);
int history_load_token_floors(History *h, HistoryTokenFloor **ret, size_t *ret_n);

/* Queues a decision row; never blocks. Past a bound (HISTORY_BACKLOG_MAX) rows are dropped and counted,
 * and the count is logged once per episode. */
#define HISTORY_BACKLOG_MAX 100000
void history_append(History *h, const AuditRecord *r, usec_t realtime);

/* Forgets a lease row that history_load_state() gave (once the lease log has it). Never blocks. While the
 * database cannot be written the delete is kept and applied once it can. */
void history_lease_delete(History *h, const char *id);

/* Runs a History query on the writer thread. Returns 0 or -ENOMEM. */
int history_query(History *h, const HistoryQuery *q, HistoryQueryFn done, void *userdata);
/* A pending query or load callback's userdata is going away: it will not be called. */
void history_cancel(History *h, void *userdata);

/* True while the database works; false in the degraded state (it cannot be opened for writing) and while
 * writes fail (disk full, I/O errors). */
bool history_is_healthy(const History *h);

/* Called on the loop thread after history's health changed (changes in between may be coalesced into
 * one call). healthy true after a false means history recovered — possibly into a fresh database after
 * corruption, into which what the old file still gave was carried over: a read of the state that failed
 * may succeed now. */
typedef void (*HistoryHealthFn)(History *h, bool healthy, void *userdata);
void history_set_health_callback(History *h, HistoryHealthFn fn, void *userdata);

/* For metrics: rows written, rows dropped, the longest batch commit (µs). */
typedef struct HistoryStats {
        uint64_t rows_written;
        uint64_t rows_dropped;
        uint64_t rows_pending;    /* queued or being retried */
        uint64_t commits;         /* transactions: row batches and lease deletes */
        uint64_t write_errors;    /* failed transactions, each retried or answered */
        usec_t longest_commit;
        bool healthy;
} HistoryStats;
void history_get_stats(const History *h, HistoryStats *ret);
