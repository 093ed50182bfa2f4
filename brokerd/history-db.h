/* SPDX-License-Identifier: MIT */
/* history-db.h — the database file, on the writer thread's connection: opening, schema and migrations, moving
 * a bad file aside and salvaging it, the leases and token marks of an older brokerd, the read-only fallback,
 * and every statement.
 * Private to the history module (history*.c). The functions return SQLite result codes unless said
 * otherwise; they keep no policy (retries, health, logging of episodes): that is the writer's. */
#pragma once

#include <sqlite3.h>

#include "history-channel.h"

/* A pool's token high-water mark, as a database gave it (or HISTORY_TOKEN_FLOOR_ALL's, after a fresh start). */
typedef struct TokenMark {
        char *pool;
        uint64_t next;
} TokenMark;

typedef struct HistoryDb {
        char *path;
        sqlite3 *db; /* NULL: not open (degraded) */
        sqlite3_stmt *insert_event, *upsert_lease, *delete_lease, *upsert_token;
        sqlite3_stmt *insert_events; /* HISTORY_DB_INSERT_ROWS rows in one statement */
        sqlite3_stmt *span_last, *span_extend, *span_insert;
        sqlite3_stmt *prune_spans, *prune_span, *drop_span, *narrow_span;
        /* The rows inserted since the transaction began: their span (history_db_rows_done()). */
        int64_t rows_first, rows_last;
        usec_t rows_min_time, rows_max_time;
        size_t n_rows;
        TokenMark *marks; /* kept across reopenings and fresh starts, for the carry-over: tokens never go back */
        size_t n_marks;
} HistoryDb;

typedef enum HistoryDbKind {
        HISTORY_DB_OURS,
        HISTORY_DB_EMPTY,
        HISTORY_DB_FOREIGN, /* another program's SQLite file, or ours from a newer brokerd */
} HistoryDbKind;

int history_sqlite_to_errno(int rc);
bool history_sqlite_is_corrupt(int rc);
bool history_sqlite_is_full(int rc);

int history_db_init(HistoryDb *d, const char *directory); /* negative errno */
void history_db_done(HistoryDb *d);

/* Opens the file (closing what was open) and says what it holds. The hook is the connection's WAL hook
 * (history_checkpoint_wal_hook()): it replaces SQLite's automatic checkpoint. d->db may be set on failure too. */
int history_db_open(HistoryDb *d, int (*wal_hook)(void *, sqlite3 *, const char *, int), void *userdata,
                    HistoryDbKind *ret_kind, unsigned *ret_version);
/* Makes the open file ready to write: migrates it from version, prepares the statements, carries over what
 * salvage_from (a file moved aside) still gives, and writes the token marks back. afresh: the file was just
 * made, in place of one moved aside whose marks may be lost: every pool continues above the clock. */
int history_db_setup(HistoryDb *d, unsigned version, bool afresh, const char *salvage_from);
void history_db_close(HistoryDb *d);

/* Renames history.db and its -wal and -shm to history.db.corrupt-<UTC time>[-wal|-shm]. Negative errno. */
int history_db_move_aside(HistoryDb *d, char **ret_moved);

/* Removes the history.db.ballast an older brokerd left (best effort). */
void history_db_remove_ballast(HistoryDb *d);

int history_db_begin(HistoryDb *d);
int history_db_commit(HistoryDb *d);
void history_db_rollback(HistoryDb *d);

/* Inside a transaction. */
int history_db_insert_event(HistoryDb *d, const EventRow *e);
/* The ids a span of event_spans covers at most (schema 10): what a retention step deletes at most, and about a
 * two-thousandth of the rows that a time filter reads of event_spans. */
#define HISTORY_SPAN_ROWS 2048
/* Before the commit of the rows inserted: event_spans covers them (their ids and their times). */
int history_db_rows_done(HistoryDb *d);
/* The rows from *e on, as many as fit in one statement (HISTORY_DB_INSERT_ROWS) and at most max: one
 * statement's fixed cost (its cursors on the table and its index opened and closed) for them all.
 * Sets *e to the next row and returns an SQLite code; *ret_n: how many were inserted. */
#define HISTORY_DB_INSERT_ROWS 8
int history_db_insert_events(HistoryDb *d, const EventRow **e, size_t max, size_t *ret_n);
int history_db_lease_delete(HistoryDb *d, const char *id);

/* Deletes the events older than before (realtime µs) of the oldest span that has any, in one transaction;
 * *ret_more: another span may have some. */
int history_db_prune(HistoryDb *d, usec_t before, bool *ret_more);

/* The persisted leases, token marks and alive mark: from the open connection, or else from a read-only
 * one (a read-only or full file system, files made immutable). log_failure: say so when neither works. */
int history_db_read_state(HistoryDb *d, bool log_failure, HistoryState *ret);

/* One page of events, as the History method returns them. */
int history_db_query(HistoryDb *d, const HistoryQuery *q, json_t **ret_events, int64_t *ret_next_cursor);
/* The statement history_db_query() runs for q, with its parameters to bind (for its tests: its plan). */
#define HISTORY_DB_QUERY_SQL_MAX 1024
void history_db_query_sql(const HistoryQuery *q, char *buf, size_t size);
/* That statement on db, prepared and bound for q and at most rows rows: history_db_query()'s, and its tests'
 * (what it reads). The caller finalizes *ret. */
int history_db_query_prepare(sqlite3 *db, const HistoryQuery *q, int64_t rows, sqlite3_stmt **ret);
