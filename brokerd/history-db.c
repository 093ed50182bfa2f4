/* SPDX-License-Identifier: MIT */
/* history-db.c — owns the database file on the writer's connection: schema and migrations, opening and
 * moving aside, salvage, the leases and token marks of an older brokerd, the read-only fallback, and every
 * statement. */
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fs-util.h"
#include "history-db.h"
#include "history-internal.h"
#include "log.h"

int history_sqlite_to_errno(int rc) {
        switch (rc & 0xff) {
        case SQLITE_OK:
                return 0;
        case SQLITE_NOMEM:
                return -ENOMEM;
        case SQLITE_FULL:
                return -ENOSPC;
        case SQLITE_READONLY:
                return -EROFS;
        case SQLITE_PERM:
        case SQLITE_AUTH:
                return -EACCES;
        case SQLITE_CANTOPEN:
                return -ENOENT;
        case SQLITE_CORRUPT:
        case SQLITE_NOTADB:
                return -EBADMSG;
        case SQLITE_BUSY:
        case SQLITE_LOCKED:
                return -EBUSY;
        case SQLITE_TOOBIG:
                return -E2BIG;
        default:
                return -EIO;
        }
}

bool history_sqlite_is_corrupt(int rc) {
        return (rc & 0xff) == SQLITE_CORRUPT || (rc & 0xff) == SQLITE_NOTADB;
}

bool history_sqlite_is_full(int rc) {
        return (rc & 0xff) == SQLITE_FULL;
}

/* ---- the schema ---- */

/* Migration n brings the schema from version n-1 to n. A new one is a function and an entry below;
 * released ones never change. Each runs inside the transaction that also sets user_version. */
static int migration_1_initial(sqlite3 *db) {
        char id[64];
        int rc;

        snprintf(id, sizeof id, "PRAGMA application_id = %d", HISTORY_APPLICATION_ID);
        rc = sqlite3_exec(db, id, NULL, NULL, NULL);
        if (rc != SQLITE_OK)
                return rc;

        /* Indexes cost every insert (each about as much as the row itself), so events has only those that
         * the retention pass and the History method's time and decision filters need: lane and pool
         * filters scan by id, which pages of "newest first" reach quickly. No AUTOINCREMENT either (20%
         * of an insert): ids are reused only after retention has emptied the table. (Schema 9 narrows the
         * decision index: migration_9_unusual_decisions(); schema 10 drops the time index:
         * migration_10_spans().) */
        static const char sql[] =
                "CREATE TABLE events ("
                "  id INTEGER PRIMARY KEY,"
                "  time INTEGER NOT NULL,"                /* µs, CLOCK_REALTIME */
                "  decision TEXT NOT NULL,"
                "  pool TEXT, lane TEXT, job TEXT, lease TEXT, token INTEGER,"
                "  wait_us INTEGER, hold_us INTEGER, budget_us INTEGER, idle_us INTEGER,"
                "  state TEXT, uid INTEGER, pid INTEGER, retry_after_sec INTEGER);"
                "CREATE INDEX events_time ON events(time);"
                "CREATE INDEX events_decision_time ON events(decision, time);"
                "CREATE TABLE leases ("
                "  id TEXT PRIMARY KEY,"
                "  pool TEXT NOT NULL, lane TEXT NOT NULL,"
                "  slots TEXT NOT NULL,"                  /* \"0,2\" */
                "  token INTEGER NOT NULL, job TEXT,"
                "  uid INTEGER NOT NULL, pid INTEGER NOT NULL,"
                "  command_pid INTEGER, command_start_time INTEGER,"
                "  detached INTEGER NOT NULL,"
                "  granted_at INTEGER NOT NULL,"          /* µs, CLOCK_REALTIME */
                "  expires_at INTEGER);"                  /* NULL: no max-hold */
                "CREATE TABLE tokens ("                   /* every token below next_token may have been used */
                "  pool TEXT PRIMARY KEY,"
                "  next_token INTEGER NOT NULL);";
        return sqlite3_exec(db, sql, NULL, NULL, NULL);
}

/* The few words that say why ("drained", "storage", "max-hold"): rows before it have NULL. */
static int migration_2_reason(sqlite3 *db) {
        return sqlite3_exec(db, "ALTER TABLE events ADD COLUMN reason TEXT", NULL, NULL, NULL);
}

/* A member is identified by its name, not by its index, which a reload or a restart with a new config may
 * give to another member (SPEC §3.4): "rig-a,rig-c", beside slots "0,2"; NULL for anonymous slots. */
static int migration_3_lease_members(sqlite3 *db) {
        return sqlite3_exec(db, "ALTER TABLE leases ADD COLUMN members TEXT", NULL, NULL, NULL);
}

/* The last instant (realtime µs) brokerd is known to have run, written (before the lease log) with every
 * lease commit and every 10 s: a restart never lets a lease keep more of its max-hold than it had left then,
 * however far back the wall clock was stepped meanwhile. Now only read, to carry it over. */
static int migration_4_alive(sqlite3 *db) {
        return sqlite3_exec(db, "CREATE TABLE alive (id INTEGER PRIMARY KEY CHECK (id = 1), at INTEGER NOT NULL)",
                            NULL, NULL, NULL);
}

/* What a request asked of the members (SPEC §3.5, AuditRecord.selector): "arm64 !flaky @rig-c"; NULL when
 * nothing, and in rows from before. `slotctl simulate --replay` asks for the same again. */
static int migration_5_selector(sqlite3 *db) {
        return sqlite3_exec(db, "ALTER TABLE events ADD COLUMN selector TEXT", NULL, NULL, NULL);
}

/* Usage per member (SPEC §3.6): the members a grant or release row's lease holds ("rig-a,rig-c"), the member
 * a quarantine, restore or drain row names; and the exit status that quarantined a member. NULL in rows
 * from before, and for anonymous slots. */
static int migration_6_member(sqlite3 *db) {
        return sqlite3_exec(db, "ALTER TABLE events ADD COLUMN member TEXT; ALTER TABLE events ADD COLUMN exit_status INTEGER",
                            NULL, NULL, NULL);
}

/* The slots a request asked of the pool (AuditRecord.slots): `slotctl simulate --replay` asks as many; NULL in
 * other rows and in rows written before. */
static int migration_7_slots(sqlite3 *db) {
        return sqlite3_exec(db, "ALTER TABLE events ADD COLUMN slots INTEGER", NULL, NULL, NULL);
}

/* Schema 8: a drain's until (SPEC §3.6), its own column (it was folded into the reason's text). */
static int migration_8_until(sqlite3 *db) {
        return sqlite3_exec(db, "ALTER TABLE events ADD COLUMN until_us INTEGER", NULL, NULL, NULL);
}

/* Schema 9: the decision index holds the unusual decisions only (busy, revoked, timeout, …), not the grants and
 * releases that are nearly every row. A row's insert into (decision, time) cost about as much as the row
 * itself: it was 40 % of the writer's time a row (tests/bench/README.md, stop 45). A filter on granted or
 * released is served in id order: they are the rows a scan meets first. Keyed (decision, id), so that a
 * filter's pages come in the query's order without a sort. O(rows) once, at the first start of the
 * upgraded brokerd. */
static int migration_9_unusual_decisions(sqlite3 *db) {
        return sqlite3_exec(db,
                            "DROP INDEX IF EXISTS events_decision_time;"
                            "CREATE INDEX events_unusual_decision ON events(decision) WHERE " HISTORY_UNUSUAL_DECISION ";",
                            NULL, NULL, NULL);
}

/* Schema 10: events loses its time index, which cost the writer a sixth of a row (its capacity +16…+20 %
 * without it, acquire+release pairs +7 % at limit 64: tests/bench/README.md, stop 47). event_spans takes its
 * place for what needs time: a row per run of at most HISTORY_SPAN_ROWS consecutive ids, with the earliest and
 * latest time of the rows it covers, extended with each batch the writer commits (one row written a batch,
 * not one a row). A time filter reads it whole (a row per ~2,000 events) to bound the ids it scans, then
 * keeps the rows of its times exactly: a wall clock stepped back only widens the ids scanned. Retention
 * deletes by span. O(rows) once, at the first start of the upgraded brokerd. */
static int migration_10_spans(sqlite3 *db) {
        char sql[512];
        snprintf(sql, sizeof sql,
                 "DROP INDEX IF EXISTS events_time;"
                 "CREATE TABLE event_spans ("
                 "  first_id INTEGER PRIMARY KEY, last_id INTEGER NOT NULL,"
                 "  min_time INTEGER NOT NULL, max_time INTEGER NOT NULL);"
                 "INSERT INTO event_spans SELECT min(id), max(id), min(time), max(time) FROM events "
                 "GROUP BY (id - 1) / %d;",
                 HISTORY_SPAN_ROWS);
        return sqlite3_exec(db, sql, NULL, NULL, NULL);
}

static const struct {
        const char *what;
        int (*run)(sqlite3 *db);
} migrations[] = {
        { "initial schema", migration_1_initial },
        { "events.reason", migration_2_reason },
        { "leases.members", migration_3_lease_members },
        { "alive mark", migration_4_alive },
        { "events.selector", migration_5_selector },
        { "events.member, events.exit_status", migration_6_member },
        { "events.slots", migration_7_slots },
        { "events.until_us", migration_8_until },
        { "an index of the unusual decisions only", migration_9_unusual_decisions },
        { "event spans in place of the time index", migration_10_spans },
};
_Static_assert(ELEMENTSOF(migrations) == HISTORY_SCHEMA_VERSION, "HISTORY_SCHEMA_VERSION counts the migrations");

unsigned history_schema_version(void) {
        return ELEMENTSOF(migrations);
}

static int exec_int(sqlite3 *db, const char *sql, int64_t *ret) {
        sqlite3_stmt *st = NULL;
        int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
        if (rc != SQLITE_OK)
                return rc;
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
                *ret = sqlite3_column_int64(st, 0);
                rc = SQLITE_OK;
        } else if (rc == SQLITE_DONE)
                rc = SQLITE_NOTFOUND;
        sqlite3_finalize(st);
        return rc;
}

/* Steps st (bound by the caller) to its end and resets it. */
static int step_done(sqlite3_stmt *st) {
        int rc = sqlite3_step(st);
        sqlite3_reset(st);
        return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static void rollback(sqlite3 *db) {
        if (db && !sqlite3_get_autocommit(db))
                (void) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
}

int history_db_begin(HistoryDb *d) {
        d->n_rows = 0;
        return sqlite3_exec(d->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
}

int history_db_commit(HistoryDb *d) {
        return sqlite3_exec(d->db, "COMMIT", NULL, NULL, NULL);
}

void history_db_rollback(HistoryDb *d) {
        rollback(d->db);
}

/* Brings the schema from `from` to `to`, one transaction per step, so that a failure leaves a
 * consistent older version that the next start migrates again. Returns an SQLite code. */
static int migrate(sqlite3 *db, unsigned from, unsigned to) {
        for (unsigned v = from; v < to; v++) {
                char sql[64];
                int rc = sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
                if (rc == SQLITE_OK)
                        rc = migrations[v].run(db);
                snprintf(sql, sizeof sql, "PRAGMA user_version = %u", v + 1);
                if (rc == SQLITE_OK)
                        rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
                if (rc == SQLITE_OK)
                        rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
                if (rc != SQLITE_OK) {
                        rollback(db);
                        return rc;
                }
                if (from > 0) /* not for a database being created */
                        log_info("History database migrated to schema version %u (%s).", v + 1, migrations[v].what);
        }
        return SQLITE_OK;
}

static int db_identify(sqlite3 *db, HistoryDbKind *ret_kind, unsigned *ret_version) {
        int64_t app = 0, version = 0, objects = 0; /* -O3 cannot see exec_int() sets them on SQLITE_OK */
        int rc;

        rc = exec_int(db, "PRAGMA application_id", &app);
        if (rc == SQLITE_OK)
                rc = exec_int(db, "PRAGMA user_version", &version);
        if (rc == SQLITE_OK)
                rc = exec_int(db, "SELECT count(*) FROM sqlite_master", &objects);
        if (rc != SQLITE_OK)
                return rc;

        if (app == HISTORY_APPLICATION_ID && version >= 1 && version <= (int64_t) ELEMENTSOF(migrations)) {
                *ret_kind = HISTORY_DB_OURS;
                *ret_version = (unsigned) version;
        } else if (app == 0 && version == 0 && objects == 0) {
                *ret_kind = HISTORY_DB_EMPTY;
                *ret_version = 0;
        } else
                *ret_kind = HISTORY_DB_FOREIGN;
        return SQLITE_OK;
}

/* Opens path with the connection settings every user of the file shares. Returns an SQLite code;
 * *ret is set (possibly to a handle that needs closing) either way. */
static int db_open_file(const char *path, sqlite3 **ret) {
        sqlite3 *db = NULL;
        int rc;

        /* A new file is made 0600 here, as the lease log is, whatever the umask of a brokerd run by hand: it holds
         * other users' job labels. SQLite takes an empty file for a new database, and gives its -wal the
         * database's mode. An existing file keeps the mode it has (a group an operator let read it). */
        int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW, 0600);
        if (fd >= 0)
                close(fd);

        /* One thread uses the connection: SQLite's own mutexes would only cost. */
        rc = sqlite3_open_v2(path, &db,
                             SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE |
                                     SQLITE_OPEN_NOFOLLOW,
                             NULL);
        *ret = db;
        if (rc != SQLITE_OK)
                return rc;
        sqlite3_busy_timeout(db, 50);

        /* Before anything reads the file: in EXCLUSIVE locking mode SQLite keeps the WAL index in heap memory
         * and never maps history.db-shm. A mapped -shm whose pages the file system refuses to write back (made
         * immutable, a file system gone read-only or full) kills the process with SIGBUS at the next write to
         * it; a write to the heap cannot fail. The price: the database is ours alone while we run. Readers
         * (slotctl simulate --replay, sqlite3) read it as immutable, without the rows not yet checkpointed,
         * or after brokerd stops; and checkpoints run on this connection (history-checkpoint.c). */
        rc = sqlite3_exec(db, "PRAGMA locking_mode = EXCLUSIVE", NULL, NULL, NULL);
        if (rc != SQLITE_OK)
                return rc;

        /* WAL: a commit is one append to the log; NORMAL: no fsync per commit, durable across a crash of
         * brokerd (not of the machine), which SPEC §3.4 accepts. The journal_mode statement is also the
         * first to read the file, so a corrupt or foreign header shows here. */
        sqlite3_stmt *st = NULL;
        rc = sqlite3_prepare_v2(db, "PRAGMA journal_mode = WAL", -1, &st, NULL);
        if (rc == SQLITE_OK) {
                rc = sqlite3_step(st);
                rc = rc == SQLITE_ROW ? SQLITE_OK : rc;
        }
        sqlite3_finalize(st);
        if (rc != SQLITE_OK)
                return rc;
        /* 16 MiB of page cache keeps the index pages that inserts touch in memory; a WAL that a burst made
         * large shrinks back to 64 MiB once it starts over. */
        return sqlite3_exec(db,
                            "PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; PRAGMA temp_store = MEMORY; "
                            "PRAGMA cache_size = -16384; PRAGMA journal_size_limit = 67108864;",
                            NULL, NULL, NULL);
}

int history_schema_create(const char *path, unsigned version) {
        sqlite3 *db = NULL;
        HistoryDbKind kind;
        unsigned v;
        int rc;

        assert_return(path, -EINVAL);
        assert_return(version >= 1 && version <= ELEMENTSOF(migrations), -EINVAL);

        rc = db_open_file(path, &db);
        if (rc == SQLITE_OK)
                rc = db_identify(db, &kind, &v);
        if (rc == SQLITE_OK && kind != HISTORY_DB_EMPTY) {
                sqlite3_close_v2(db);
                return -EEXIST;
        }
        if (rc == SQLITE_OK)
                rc = migrate(db, 0, version);
        sqlite3_close_v2(db);
        return history_sqlite_to_errno(rc);
}

/* The statements whose text is fixed, each beside the field it is prepared into. */
typedef struct FixedStatement {
        sqlite3_stmt **st;
        const char *sql;
} FixedStatement;

#define FIXED_STATEMENTS 10

static void fixed_statements(HistoryDb *d, FixedStatement ret[static FIXED_STATEMENTS]) {
        const FixedStatement all[] = {
                { &d->upsert_lease,
                  "INSERT OR REPLACE INTO leases (id, pool, lane, slots, token, job, uid, pid, "
                  "command_pid, command_start_time, detached, granted_at, expires_at, members) "
                  "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)" },
                { &d->delete_lease, "DELETE FROM leases WHERE id = ?" },
                /* MAX(): a high-water mark never goes back, whatever order commits come in. */
                { &d->upsert_token,
                  "INSERT INTO tokens (pool, next_token) VALUES (?, ?) ON CONFLICT (pool) "
                  "DO UPDATE SET next_token = MAX(next_token, excluded.next_token)" },
                { &d->span_last, "SELECT first_id, last_id FROM event_spans ORDER BY first_id DESC LIMIT 1" },
                { &d->span_extend,
                  "UPDATE event_spans SET last_id = max(last_id, ?2), min_time = min(min_time, ?3), "
                  "max_time = max(max_time, ?4) WHERE first_id = ?1" },
                /* OR REPLACE: ids that start again below the last span (events emptied by hand) replace a span
                 * of the same first id, which no row is left of. */
                { &d->span_insert, "INSERT OR REPLACE INTO event_spans VALUES (?1, ?2, ?3, ?4)" },
                /* Read whole when nothing is old: a row per HISTORY_SPAN_ROWS events. */
                { &d->prune_spans,
                  "SELECT first_id, last_id, max_time FROM event_spans WHERE min_time < ?1 ORDER BY first_id LIMIT 1" },
                { &d->prune_span, "DELETE FROM events WHERE id BETWEEN ?1 AND ?2 AND time < ?3" },
                { &d->drop_span, "DELETE FROM event_spans WHERE first_id = ?1" },
                /* The rows left of a span are all at or after the cutoff (or there are none: then its latest
                 * time, and the next pass after it drops the span). */
                { &d->narrow_span,
                  "UPDATE event_spans SET min_time = coalesce((SELECT min(time) FROM events WHERE id BETWEEN ?1 AND ?2), "
                  "max_time) WHERE first_id = ?1" },
        };
        _Static_assert(ELEMENTSOF(all) == FIXED_STATEMENTS, "FIXED_STATEMENTS counts them");
        memcpy(ret, all, sizeof all);
}

void history_db_close(HistoryDb *d) {
        FixedStatement fixed[FIXED_STATEMENTS];
        fixed_statements(d, fixed);
        for (size_t i = 0; i < FIXED_STATEMENTS; i++) {
                sqlite3_finalize(*fixed[i].st);
                *fixed[i].st = NULL;
        }
        sqlite3_finalize(d->insert_event);
        sqlite3_finalize(d->insert_events);
        d->insert_event = d->insert_events = NULL;
        sqlite3_close_v2(d->db);
        d->db = NULL;
}

/* The columns of a decision row, in bind_event()'s order. */
#define EVENT_COLUMNS                                                                                       \
        "time, decision, pool, lane, job, lease, token, wait_us, hold_us, budget_us, idle_us, state, uid, pid, " \
        "retry_after_sec, reason, selector, member, exit_status, slots, until_us"
#define EVENT_N_COLUMNS 21

static int prepare_statements(HistoryDb *d) {
        int rc;

        /* One statement for a row, one for HISTORY_DB_INSERT_ROWS of them: the same columns. A row's text is
         * ",(" then "?" and a comma for each column but the last, then ")": 2 × columns + 2 bytes. */
        char sql[32 + sizeof EVENT_COLUMNS + HISTORY_DB_INSERT_ROWS * (2 * EVENT_N_COLUMNS + 2)] =
                "INSERT INTO events (" EVENT_COLUMNS ") VALUES ";
        for (int i = 0; i < HISTORY_DB_INSERT_ROWS; i++) {
                strcat(sql, i ? ",(" : "(");
                for (int c = 0; c < EVENT_N_COLUMNS; c++)
                        strcat(sql, c ? ",?" : "?");
                strcat(sql, ")");
                if (i == 0) {
                        rc = sqlite3_prepare_v3(d->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &d->insert_event, NULL);
                        if (rc != SQLITE_OK)
                                return rc;
                }
        }
        rc = sqlite3_prepare_v3(d->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &d->insert_events, NULL);

        FixedStatement fixed[FIXED_STATEMENTS];
        fixed_statements(d, fixed);
        for (size_t i = 0; rc == SQLITE_OK && i < FIXED_STATEMENTS; i++)
                rc = sqlite3_prepare_v3(d->db, fixed[i].sql, -1, SQLITE_PREPARE_PERSISTENT, fixed[i].st, NULL);
        return rc;
}

/* The mark, or 0 when there is none (a database of an older schema, or never written). */
static int alive_mark_read(sqlite3 *db, usec_t *ret) {
        int64_t v = 0;
        int rc = exec_int(db, "SELECT at FROM alive WHERE id = 1", &v);
        if (rc == SQLITE_NOTFOUND || rc == SQLITE_ERROR) {
                /* no row; or no table, in a file of an older schema that could not be migrated (read-only) */
                *ret = 0;
                return SQLITE_OK;
        }
        if (rc == SQLITE_OK)
                *ret = (usec_t) MAX(v, 0);
        return rc;
}

static TokenMark *token_mark_find(HistoryDb *d, const char *pool) {
        for (size_t i = 0; i < d->n_marks; i++)
                if (streq(d->marks[i].pool, pool))
                        return &d->marks[i];
        return NULL;
}

static TokenMark *token_mark_get(HistoryDb *d, const char *pool) {
        TokenMark *m = token_mark_find(d, pool);
        if (m)
                return m;

        char *p = strdup(pool);
        if (!p)
                return NULL;
        TokenMark *a = reallocarray(d->marks, d->n_marks + 1, sizeof(TokenMark));
        if (!a) {
                free(p);
                return NULL;
        }
        d->marks = a;
        d->marks[d->n_marks] = (TokenMark) { .pool = p };
        return &d->marks[d->n_marks++];
}

/* Reads the tokens table into the marks, keeping the larger value. Returns an SQLite code. */
static int token_marks_load(HistoryDb *d, sqlite3 *db) {
        sqlite3_stmt *st = NULL;
        int rc;

        rc = sqlite3_prepare_v2(db, "SELECT pool, next_token FROM tokens", -1, &st, NULL);
        while (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
                const char *pool = (const char *) sqlite3_column_text(st, 0);
                int64_t next = sqlite3_column_int64(st, 1);
                if (!pool || next < 0) {
                        rc = SQLITE_OK;
                        continue;
                }
                TokenMark *m = token_mark_get(d, pool);
                if (!m) {
                        rc = SQLITE_NOMEM;
                        break;
                }
                m->next = MAX(m->next, (uint64_t) next);
                rc = SQLITE_OK;
        }
        sqlite3_finalize(st);
        return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* Writes every known mark: a database made afresh must not let tokens go back. */
static int token_marks_store(HistoryDb *d) {
        int rc = SQLITE_OK;

        for (size_t i = 0; i < d->n_marks && rc == SQLITE_OK; i++) {
                sqlite3_bind_text(d->upsert_token, 1, d->marks[i].pool, -1, SQLITE_STATIC);
                sqlite3_bind_int64(d->upsert_token, 2, (int64_t) d->marks[i].next);
                rc = step_done(d->upsert_token);
        }
        return rc;
}

static int leases_read(sqlite3 *db, HistoryLeaseRow **ret, size_t *ret_n);
static int lease_row_bind_step(HistoryDb *d, const HistoryLeaseRow *row);

/* A corrupt file still often holds a readable leases and tokens table: what it gives is carried into
 * the fresh database, so that running commands keep their slots and tokens do not go back. */
static void salvage(HistoryDb *d, const char *moved, size_t *ret_leases) {
        HistoryLeaseRow *rows = NULL;
        size_t n = 0, kept = 0;
        sqlite3 *old = NULL;

        *ret_leases = 0;
        if (sqlite3_open_v2(moved, &old, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
                sqlite3_close_v2(old);
                return;
        }
        (void) token_marks_load(d, old);
        (void) leases_read(old, &rows, &n);
        sqlite3_close_v2(old);

        if (sqlite3_exec(d->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK) {
                int rc = token_marks_store(d);
                for (size_t i = 0; i < n && rc == SQLITE_OK; i++, kept++)
                        rc = lease_row_bind_step(d, &rows[i]);
                if (rc == SQLITE_OK)
                        rc = sqlite3_exec(d->db, "COMMIT", NULL, NULL, NULL);
                if (rc != SQLITE_OK) {
                        rollback(d->db);
                        kept = 0;
                }
        }
        history_lease_rows_free(rows, n);
        *ret_leases = kept;
}

/* Renames history.db and its -wal and -shm to history.db.corrupt-<UTC time>[-wal|-shm], with ".N" added
 * should that name be taken. Returns 0 and the new name of the database, or negative errno. */
int history_db_move_aside(HistoryDb *d, char **ret_moved) {
        static const char *const sidecars[] = { "-wal", "-shm" };
        _cleanup_free_ char *moved = NULL;

        int r = rename_aside(d->path, /* missing_ok= */ true, &moved);
        if (r < 0)
                return r;
        for (size_t i = 0; i < ELEMENTSOF(sidecars); i++) {
                _cleanup_free_ char *from = NULL, *to = NULL;
                if (asprintf(&from, "%s%s", d->path, sidecars[i]) < 0 || asprintf(&to, "%s%s", moved, sidecars[i]) < 0)
                        return -ENOMEM;
                if (rename(from, to) < 0 && errno != ENOENT)
                        return -errno;
        }
        *ret_moved = TAKE_PTR(moved);
        return 0;
}

int history_db_init(HistoryDb *d, const char *directory) {
        /* Before SQLite's first use in the process (the writer thread's open): its memory statistics, which
         * nothing here reads, take a process-wide mutex on every allocation, several a row written (the
         * writer's capacity +3-4 %). Refused once SQLite is initialised (a second History, in tests): the
         * statistics then stay on, which only costs. */
        (void) sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);

        *d = (HistoryDb) {};
        if (asprintf(&d->path, "%s/history.db", directory) < 0)
                return -ENOMEM;
        return 0;
}

/* An older brokerd kept 1 MiB in history.db.ballast (made through a .tmp) for lease commits on a full
 * disk. Its lease commits went to the lease log: the reserve went with them. */
void history_db_remove_ballast(HistoryDb *d) {
        static const char *const suffixes[] = { ".ballast", ".ballast.tmp" };

        for (size_t i = 0; i < ELEMENTSOF(suffixes); i++) {
                _cleanup_free_ char *p = NULL;
                if (asprintf(&p, "%s%s", d->path, suffixes[i]) >= 0)
                        (void) unlink(p);
        }
}

void history_db_done(HistoryDb *d) {
        history_db_close(d);
        for (size_t i = 0; i < d->n_marks; i++)
                free(d->marks[i].pool);
        free(d->marks);
        free(d->path);
        *d = (HistoryDb) {};
}

int history_db_open(HistoryDb *d, int (*wal_hook)(void *, sqlite3 *, const char *, int), void *userdata,
                    HistoryDbKind *ret_kind, unsigned *ret_version) {
        int rc;

        history_db_close(d);
        rc = db_open_file(d->path, &d->db);
        if (rc != SQLITE_OK)
                return rc;
        sqlite3_wal_hook(d->db, wal_hook, userdata);
        return db_identify(d->db, ret_kind, ret_version);
}

int history_db_setup(HistoryDb *d, unsigned version, bool afresh, const char *salvage_from) {
        int rc = SQLITE_OK;

        if (sqlite3_db_readonly(d->db, "main") == 1)
                rc = SQLITE_READONLY; /* SQLite opens a file it may not write read-only, without a word */
        if (rc == SQLITE_OK)
                rc = migrate(d->db, version, ELEMENTSOF(migrations));
        if (rc == SQLITE_OK)
                rc = prepare_statements(d);
        if (rc == SQLITE_OK && salvage_from) {
                size_t n = 0;
                salvage(d, salvage_from, &n);
                if (n > 0)
                        log_info("History: carried %zu active leases over from '%s'.", n, salvage_from);
        }
        if (rc == SQLITE_OK)
                rc = token_marks_load(d, d->db);
        if (rc == SQLITE_OK && afresh) {
                /* What the moved file held of the tokens may be lost with it. The clock in µs is above any
                 * token handed out so far (a token per µs would be a million grants a second, for years):
                 * every pool continues above it, under the name no pool can have (HISTORY_TOKEN_FLOOR_ALL). */
                TokenMark *all = token_mark_get(d, HISTORY_TOKEN_FLOOR_ALL);
                if (!all)
                        rc = SQLITE_NOMEM;
                else
                        all->next = MAX(all->next, (uint64_t) now_realtime());
        }
        if (rc == SQLITE_OK && d->n_marks > 0) {
                /* After a fresh start the marks we knew go back in: tokens never go back. */
                rc = history_db_begin(d);
                if (rc == SQLITE_OK)
                        rc = token_marks_store(d);
                if (rc == SQLITE_OK)
                        rc = history_db_commit(d);
                if (rc != SQLITE_OK)
                        rollback(d->db);
        }
        return rc;
}

int history_db_prune(HistoryDb *d, usec_t before, bool *ret_more) {
        int64_t cutoff = (int64_t) MIN(before, (usec_t) INT64_MAX), first, last, max_time;
        int rc;

        *ret_more = false;
        sqlite3_bind_int64(d->prune_spans, 1, cutoff);
        rc = sqlite3_step(d->prune_spans);
        if (rc != SQLITE_ROW) {
                sqlite3_reset(d->prune_spans);
                return rc == SQLITE_DONE ? SQLITE_OK : rc; /* nothing old */
        }
        first = sqlite3_column_int64(d->prune_spans, 0);
        last = sqlite3_column_int64(d->prune_spans, 1);
        max_time = sqlite3_column_int64(d->prune_spans, 2);
        sqlite3_reset(d->prune_spans);

        /* Its old rows (by time too: spans overlap where ids started again after events was emptied by
         * hand); then the span goes, when it had nothing newer, or its earliest time moves up to what is
         * left. */
        bool whole = max_time < cutoff;
        sqlite3_stmt *del = d->prune_span, *after = whole ? d->drop_span : d->narrow_span;
        sqlite3_bind_int64(del, 1, first);
        sqlite3_bind_int64(del, 2, last);
        sqlite3_bind_int64(del, 3, cutoff);
        sqlite3_bind_int64(after, 1, first);
        if (!whole)
                sqlite3_bind_int64(after, 2, last);
        rc = history_db_begin(d);
        if (rc == SQLITE_OK)
                rc = step_done(del);
        if (rc == SQLITE_OK)
                rc = step_done(after);
        if (rc == SQLITE_OK)
                rc = history_db_commit(d);
        if (rc != SQLITE_OK) {
                rollback(d->db);
                return rc;
        }
        *ret_more = true; /* the next pass says whether another span has old rows */
        return SQLITE_OK;
}

static void bind_usec(sqlite3_stmt *st, int i, usec_t v) {
        if (v == USEC_INFINITY)
                sqlite3_bind_null(st, i);
        else
                sqlite3_bind_int64(st, i, (int64_t) MIN(v, (usec_t) INT64_MAX));
}

static void bind_text(sqlite3_stmt *st, int i, const char *s) {
        if (s)
                sqlite3_bind_text(st, i, s, -1, SQLITE_STATIC);
        else
                sqlite3_bind_null(st, i);
}

static void bind_nonzero(sqlite3_stmt *st, int i, int64_t v) {
        if (v == 0)
                sqlite3_bind_null(st, i);
        else
                sqlite3_bind_int64(st, i, v);
}

/* The row's EVENT_N_COLUMNS values from parameter base + 1 on. */
static void bind_event(sqlite3_stmt *st, int base, const EventRow *e) {
        sqlite3_bind_int64(st, base + 1, (int64_t) MIN(e->time, (usec_t) INT64_MAX));
        bind_text(st, base + 2, e->decision);
        bind_text(st, base + 3, e->pool);
        bind_text(st, base + 4, e->lane);
        bind_text(st, base + 5, e->job);
        bind_text(st, base + 6, e->lease);
        bind_nonzero(st, base + 7, (int64_t) MIN(e->token, (uint64_t) INT64_MAX));
        bind_usec(st, base + 8, e->wait);
        bind_usec(st, base + 9, e->hold);
        bind_usec(st, base + 10, e->budget);
        bind_usec(st, base + 11, e->idle);
        bind_text(st, base + 12, e->state);
        if (e->uid == (uid_t) -1)
                sqlite3_bind_null(st, base + 13);
        else
                sqlite3_bind_int64(st, base + 13, e->uid);
        bind_nonzero(st, base + 14, e->pid);
        bind_nonzero(st, base + 15, e->retry_after_sec);
        bind_text(st, base + 16, e->reason);
        bind_text(st, base + 17, e->selector);
        bind_text(st, base + 18, e->member);
        if (e->exit_status < 0)
                sqlite3_bind_null(st, base + 19);
        else
                sqlite3_bind_int64(st, base + 19, e->exit_status);
        bind_nonzero(st, base + 20, e->slots);
        if (e->until == 0 || e->until == USEC_INFINITY)
                sqlite3_bind_null(st, base + 21);
        else
                sqlite3_bind_int64(st, base + 21, (int64_t) MIN(e->until, (usec_t) INT64_MAX));
}

/* n rows inserted by the last statement, from e on: the span of the transaction's rows takes them in. Ids
 * are given max(id) + 1 each, so the statement's are the n up to the last. */
static void rows_note(HistoryDb *d, const EventRow *e, size_t n) {
        int64_t last = sqlite3_last_insert_rowid(d->db);
        if (d->n_rows == 0) {
                d->rows_first = last - (int64_t) n + 1;
                d->rows_min_time = d->rows_max_time = e->time;
        }
        d->rows_last = last;
        for (size_t i = 0; i < n; i++, e = e->next) {
                d->rows_min_time = MIN(d->rows_min_time, e->time);
                d->rows_max_time = MAX(d->rows_max_time, e->time);
        }
        d->n_rows += n;
}

int history_db_insert_event(HistoryDb *d, const EventRow *e) {
        sqlite3_stmt *st = d->insert_event;

        bind_event(st, 0, e);
        int rc = step_done(st);
        if (rc == SQLITE_OK)
                rows_note(d, e, 1);
        return rc;
}

int history_db_rows_done(HistoryDb *d) {
        int64_t first = 0, last = 0;
        int rc;

        if (d->n_rows == 0)
                return SQLITE_OK;
        rc = sqlite3_step(d->span_last);
        if (rc == SQLITE_ROW) {
                first = sqlite3_column_int64(d->span_last, 0);
                last = sqlite3_column_int64(d->span_last, 1);
                rc = SQLITE_OK;
        } else if (rc == SQLITE_DONE)
                rc = SQLITE_OK;
        sqlite3_reset(d->span_last);
        if (rc != SQLITE_OK)
                return rc;

        /* The last span takes the rows while it stays within HISTORY_SPAN_ROWS ids, and they come after its
         * start; else they begin a span. */
        bool extend = last > 0 && first <= d->rows_first && d->rows_last - first < HISTORY_SPAN_ROWS;
        sqlite3_stmt *st = extend ? d->span_extend : d->span_insert;
        sqlite3_bind_int64(st, 1, extend ? first : d->rows_first);
        sqlite3_bind_int64(st, 2, d->rows_last);
        sqlite3_bind_int64(st, 3, (int64_t) MIN(d->rows_min_time, (usec_t) INT64_MAX));
        sqlite3_bind_int64(st, 4, (int64_t) MIN(d->rows_max_time, (usec_t) INT64_MAX));
        rc = step_done(st);
        if (rc == SQLITE_OK)
                d->n_rows = 0;
        return rc;
}

int history_db_insert_events(HistoryDb *d, const EventRow **e, size_t max, size_t *ret_n) {
        const EventRow *r = *e;
        size_t n = 0;
        while (r && n < HISTORY_DB_INSERT_ROWS && n < max) {
                r = r->next;
                n++;
        }
        if (n < HISTORY_DB_INSERT_ROWS) {
                /* Fewer than a statement's worth: one at a time. */
                size_t k = 0;
                int rc = SQLITE_OK;
                for (r = *e; rc == SQLITE_OK && k < n; r = r->next, k++)
                        rc = history_db_insert_event(d, r);
                if (rc != SQLITE_OK)
                        return rc;
                *e = r;
                *ret_n = n;
                return SQLITE_OK;
        }
        sqlite3_stmt *st = d->insert_events;
        r = *e;
        for (int i = 0; i < HISTORY_DB_INSERT_ROWS; i++, r = r->next)
                bind_event(st, i * EVENT_N_COLUMNS, r);
        int rc = step_done(st);
        if (rc != SQLITE_OK)
                return rc;
        rows_note(d, *e, n);
        *e = r;
        *ret_n = n;
        return SQLITE_OK;
}

static int slots_format(const HistoryLeaseRow *row, char **ret) {
        size_t size = (size_t) row->n_slots * 11 + 1;
        char *s = malloc(size), *p = s;
        if (!s)
                return -ENOMEM;
        *p = '\0';
        for (unsigned i = 0; i < row->n_slots; i++)
                p += snprintf(p, size - (size_t) (p - s), "%s%u", i > 0 ? "," : "", row->slots[i]);
        *ret = s;
        return 0;
}

static int slots_parse(const char *s, unsigned **ret, unsigned *ret_n) {
        unsigned *a = NULL, n = 0;

        while (s && *s) {
                char *end;
                errno = 0;
                unsigned long v = strtoul(s, &end, 10);
                if (errno != 0 || end == s || v > UINT_MAX || (*end != ',' && *end != '\0')) {
                        free(a);
                        return -EINVAL;
                }
                unsigned *b = reallocarray(a, n + 1, sizeof(unsigned));
                if (!b) {
                        free(a);
                        return -ENOMEM;
                }
                a = b;
                a[n++] = (unsigned) v;
                s = *end ? end + 1 : end;
        }
        *ret = a;
        *ret_n = n;
        return 0;
}

/* Names, comma-separated (a name has no comma: conf_name_is_valid()); an entry without a name is empty.
 * NULL when no slot has a name. */
static int members_format(const HistoryLeaseRow *row, char **ret) {
        size_t size = 1;
        bool any = false;

        *ret = NULL;
        for (unsigned i = 0; row->members && i < row->n_slots; i++) {
                size += (row->members[i] ? strlen(row->members[i]) : 0) + 1;
                any = any || row->members[i];
        }
        if (!any)
                return 0;
        char *s = malloc(size), *p = s;
        if (!s)
                return -ENOMEM;
        *p = '\0';
        for (unsigned i = 0; i < row->n_slots; i++)
                p = stpcpy(stpcpy(p, i > 0 ? "," : ""), row->members[i] ?: "");
        *ret = s;
        return 0;
}

/* The inverse of members_format() for a row of n slots; a list of another length is no list (-EINVAL). */
static int members_parse(const char *s, unsigned n, char ***ret) {
        *ret = NULL;
        if (!s)
                return 0;
        char **a = calloc(MAX(n, 1u), sizeof(char *));
        if (!a)
                return -ENOMEM;
        for (unsigned i = 0; i < n; i++) {
                size_t len = strcspn(s, ",");
                int r = (s[len] == ',') != (i + 1 < n) ? -EINVAL : 0;
                if (r == 0 && len > 0 && !(a[i] = strndup(s, len)))
                        r = -ENOMEM;
                if (r < 0) {
                        history_members_free(a, n);
                        return r;
                }
                s += len + (s[len] == ',');
        }
        *ret = a;
        return 0;
}

static int lease_row_bind_step(HistoryDb *d, const HistoryLeaseRow *row) {
        sqlite3_stmt *st = d->upsert_lease;
        _cleanup_free_ char *slots = NULL, *members = NULL;

        if (slots_format(row, &slots) < 0 || members_format(row, &members) < 0)
                return SQLITE_NOMEM;
        bind_text(st, 1, row->id);
        bind_text(st, 2, row->pool);
        bind_text(st, 3, row->lane ?: "");
        bind_text(st, 4, slots);
        sqlite3_bind_int64(st, 5, (int64_t) MIN(row->token, (uint64_t) INT64_MAX));
        bind_text(st, 6, row->job);
        sqlite3_bind_int64(st, 7, row->uid);
        sqlite3_bind_int64(st, 8, row->pid);
        bind_nonzero(st, 9, row->command_pid);
        bind_nonzero(st, 10, (int64_t) MIN(row->command_start_time, (uint64_t) INT64_MAX));
        sqlite3_bind_int(st, 11, row->detached);
        bind_usec(st, 12, row->granted_at);
        bind_usec(st, 13, row->expires_at);
        bind_text(st, 14, members);
        return step_done(st);
}

int history_db_lease_delete(HistoryDb *d, const char *id) {
        sqlite3_stmt *st = d->delete_lease;
        bind_text(st, 1, id);
        return step_done(st);
}

static int leases_read(sqlite3 *db, HistoryLeaseRow **ret, size_t *ret_n) {
        HistoryLeaseRow *rows = NULL;
        sqlite3_stmt *st = NULL;
        size_t n = 0;
        int rc;

        rc = sqlite3_prepare_v2(db,
                                "SELECT id, pool, lane, slots, token, job, uid, pid, command_pid, command_start_time, "
                                "detached, granted_at, expires_at, members FROM leases ORDER BY granted_at, id",
                                -1, &st, NULL);
        if (rc == SQLITE_ERROR)
                /* A file from before leases.members, that salvage reads as it is. */
                rc = sqlite3_prepare_v2(db,
                                        "SELECT id, pool, lane, slots, token, job, uid, pid, command_pid, "
                                        "command_start_time, detached, granted_at, expires_at, NULL FROM leases "
                                        "ORDER BY granted_at, id",
                                        -1, &st, NULL);
        while (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
                HistoryLeaseRow row = {
                        .token = (uint64_t) MAX(sqlite3_column_int64(st, 4), 0),
                        .uid = (uid_t) sqlite3_column_int64(st, 6),
                        .pid = (pid_t) sqlite3_column_int64(st, 7),
                        .command_pid = (pid_t) sqlite3_column_int64(st, 8),
                        .command_start_time = (uint64_t) MAX(sqlite3_column_int64(st, 9), 0),
                        .detached = sqlite3_column_int(st, 10) != 0,
                        .granted_at = (usec_t) MAX(sqlite3_column_int64(st, 11), 0),
                        .expires_at = sqlite3_column_type(st, 12) == SQLITE_NULL
                                              ? USEC_INFINITY
                                              : (usec_t) MAX(sqlite3_column_int64(st, 12), 0),
                };
                rc = SQLITE_NOMEM;
                if (strdup_or_null((const char *) sqlite3_column_text(st, 0), &row.id) < 0 ||
                    strdup_or_null((const char *) sqlite3_column_text(st, 1), &row.pool) < 0 ||
                    strdup_or_null((const char *) sqlite3_column_text(st, 2), &row.lane) < 0 ||
                    strdup_or_null((const char *) sqlite3_column_text(st, 5), &row.job) < 0) {
                        history_lease_row_done(&row);
                        break;
                }
                int r = slots_parse((const char *) sqlite3_column_text(st, 3), &row.slots, &row.n_slots);
                if (r >= 0)
                        r = members_parse((const char *) sqlite3_column_text(st, 13), row.n_slots, &row.members);
                if (r < 0 || !row.id || !row.pool || !row.lane) {
                        /* A row we cannot read back is skipped, not fatal: its lease is lost either way. */
                        history_lease_row_done(&row);
                        rc = r == -ENOMEM ? SQLITE_NOMEM : SQLITE_OK;
                        if (rc != SQLITE_OK)
                                break;
                        continue;
                }
                HistoryLeaseRow *a = reallocarray(rows, n + 1, sizeof(HistoryLeaseRow));
                if (!a) {
                        history_lease_row_done(&row);
                        break;
                }
                rows = a;
                rows[n++] = row;
                rc = SQLITE_OK;
        }
        sqlite3_finalize(st);
        if (rc == SQLITE_DONE)
                rc = SQLITE_OK;
        *ret = rows; /* what could be read, also on failure: salvage takes it */
        *ret_n = n;
        return rc;
}

static bool wal_is_absent(HistoryDb *d) {
        _cleanup_free_ char *wal = NULL;
        struct stat st;
        if (asprintf(&wal, "%s-wal", d->path) < 0)
                return false;
        return stat(wal, &st) < 0 && errno == ENOENT;
}

/* "file:PATH?mode=ro&immutable=1", with the characters that would end or escape the path escaped. */
static int uri_immutable(const char *path, char **ret) {
        char *u = malloc(strlen(path) * 3 + 32), *p = u;
        if (!u)
                return -ENOMEM;
        p = stpcpy(p, "file:");
        for (const char *c = path; *c; c++)
                if (*c == '?' || *c == '#' || *c == '%')
                        p += sprintf(p, "%%%02X", (unsigned char) *c);
                else
                        *p++ = *c;
        strcpy(p, "?mode=ro&immutable=1");
        *ret = u;
        return 0;
}

/* A database the writer cannot open read-write (a read-only or full file system, files made immutable,
 * wrong ownership) is still read: what it holds is what was persisted. Returns an SQLite code; *ret NULL
 * with SQLITE_OK when there is no database at all (nothing was ever persisted there). */
static int reader_open(HistoryDb *d, sqlite3 **ret) {
        sqlite3 *db = NULL;
        HistoryDbKind kind;
        unsigned version;
        struct stat st;
        int rc;

        *ret = NULL;
        if (stat(d->path, &st) < 0)
                return errno == ENOENT ? SQLITE_OK : SQLITE_CANTOPEN;
        rc = sqlite3_open_v2(d->path, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE |
                                                   SQLITE_OPEN_NOFOLLOW,
                             NULL);
        if (rc == SQLITE_OK) {
                sqlite3_busy_timeout(db, 50);
                rc = db_identify(db, &kind, &version);
        }
        if ((rc & 0xff) == SQLITE_CANTOPEN && wal_is_absent(d)) {
                /* SQLite reads a WAL database only where it can make the -wal and -shm (a read-only file
                 * system cannot). Without a -wal, everything is in the file itself: read it as immutable. */
                _cleanup_free_ char *uri = NULL;
                sqlite3_close_v2(db);
                db = NULL;
                rc = uri_immutable(d->path, &uri) < 0 ? SQLITE_NOMEM
                                                        : sqlite3_open_v2(uri, &db,
                                                                          SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX |
                                                                                  SQLITE_OPEN_EXRESCODE | SQLITE_OPEN_URI,
                                                                          NULL);
                if (rc == SQLITE_OK)
                        rc = db_identify(db, &kind, &version);
        }
        if (rc == SQLITE_OK && kind == HISTORY_DB_FOREIGN)
                rc = SQLITE_NOTADB;
        if (rc == SQLITE_OK && kind == HISTORY_DB_EMPTY) {
                sqlite3_close_v2(db);
                return SQLITE_OK;
        }
        if (rc != SQLITE_OK) {
                sqlite3_close_v2(db);
                return rc;
        }
        *ret = db;
        return SQLITE_OK;
}

int history_db_read_state(HistoryDb *d, bool log_failure, HistoryState *ret) {
        _cleanup_(history_state_done) HistoryState s = {};
        sqlite3 *ro = NULL, *db = d->db;
        int rc = SQLITE_OK;

        if (!db) {
                rc = reader_open(d, &ro);
                db = ro;
        }
        if (rc == SQLITE_OK && ro)
                rc = token_marks_load(d, ro); /* the writer's own were read when it opened */
        if (rc == SQLITE_OK && db)
                rc = leases_read(db, &s.leases, &s.n_leases);
        if (rc == SQLITE_OK && db)
                rc = alive_mark_read(db, &s.alive_at);
        if (ro) {
                if (rc != SQLITE_OK && log_failure)
                        log_error("Cannot read history database '%s' either: %s.", d->path, sqlite3_errmsg(ro));
                sqlite3_close_v2(ro);
        }
        if (rc != SQLITE_OK)
                return rc;

        /* The marks are what the database holds, plus what a fresh start carried over. */
        s.floors = calloc(MAX(d->n_marks, 1u), sizeof(HistoryTokenFloor));
        if (!s.floors)
                return SQLITE_NOMEM;
        for (size_t i = 0; i < d->n_marks; i++) {
                s.floors[i].pool = strdup(d->marks[i].pool);
                if (!s.floors[i].pool) {
                        s.n_floors = i;
                        return SQLITE_NOMEM;
                }
                s.floors[i].next_token = d->marks[i].next;
        }
        s.n_floors = d->n_marks;
        *ret = s;
        s = (HistoryState) {};
        return SQLITE_OK;
}

static void json_set_int(json_t *o, const char *key, sqlite3_stmt *st, int col, int64_t divisor) {
        if (sqlite3_column_type(st, col) == SQLITE_NULL)
                return;
        json_object_set_new(o, key, json_integer(sqlite3_column_int64(st, col) / divisor));
}

static void json_set_text(json_t *o, const char *key, sqlite3_stmt *st, int col) {
        const char *s = (const char *) sqlite3_column_text(st, col);
        if (s)
                json_object_set_new(o, key, json_string(s));
}

/* The decision filter, with the index's own condition when it holds: SQLite uses a partial index only for a
 * query whose WHERE says what the index's does, and a bound value says nothing at planning time. */
static const char *decision_filter(const char *decision) {
        if (history_decision_is_usual(decision))
                return " AND decision = ?";
        return " AND decision = ? AND " HISTORY_UNUSUAL_DECISION;
}

static bool query_since(const HistoryQuery *q) {
        return q->since > 0 && q->since != USEC_INFINITY;
}

static bool query_until(const HistoryQuery *q) {
        return q->until > 0 && q->until != USEC_INFINITY;
}

/* A time filter bounds the ids by event_spans (schema 10), then says the times exactly: the spans of rows
 * from since on start at the first id, those of rows before until end at the last. The cursor and since
 * make one lower bound: SQLite searches the ids from one of two, and filters by the other. */
#define CURSOR_FILTER "id > ?"
#define CURSOR_SINCE_FILTER                                                                                \
        "id >= max(? + 1, (SELECT coalesce(min(first_id), 9223372036854775807) FROM event_spans "       \
        "WHERE max_time >= ?)) AND time >= ?"
#define UNTIL_FILTER                                                                                       \
        " AND id <= (SELECT coalesce(max(last_id), 0) FROM event_spans WHERE min_time < ?) AND time < ?"

void history_db_query_sql(const HistoryQuery *q, char *buf, size_t size) {
        /* Only the filters given, so that the planner can use their indexes. */
        snprintf(buf, size,
                 "SELECT id, time, decision, pool, lane, job, uid, pid, lease, token, wait_us, hold_us, budget_us, state, selector, reason, "
                 "member, exit_status, until_us FROM events WHERE %s%s%s%s%s ORDER BY id LIMIT ?",
                 query_since(q) ? CURSOR_SINCE_FILTER : CURSOR_FILTER, query_until(q) ? UNTIL_FILTER : "",
                 q->lane ? " AND lane = ?" : "",
                 q->pool ? " AND pool = ?" : "", q->decision ? decision_filter(q->decision) : "");
}

int history_db_query_prepare(sqlite3 *db, const HistoryQuery *q, int64_t rows, sqlite3_stmt **ret) {
        char sql[HISTORY_DB_QUERY_SQL_MAX];
        sqlite3_stmt *st = NULL;
        bool since = query_since(q), until = query_until(q);
        int rc, k = 1;

        history_db_query_sql(q, sql, sizeof sql);
        rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
        if (rc != SQLITE_OK)
                return rc;
        sqlite3_bind_int64(st, k++, MAX(q->cursor, 0));
        for (int i = 0; since && i < 2; i++) /* the span's bound, then the row's */
                sqlite3_bind_int64(st, k++, (int64_t) MIN(q->since, (usec_t) INT64_MAX));
        for (int i = 0; until && i < 2; i++)
                sqlite3_bind_int64(st, k++, (int64_t) MIN(q->until, (usec_t) INT64_MAX));
        if (q->lane)
                bind_text(st, k++, q->lane);
        if (q->pool)
                bind_text(st, k++, q->pool);
        if (q->decision)
                bind_text(st, k++, q->decision);
        sqlite3_bind_int64(st, k, rows);
        *ret = st;
        return SQLITE_OK;
}

int history_db_query(HistoryDb *d, const HistoryQuery *q, json_t **ret_events, int64_t *ret_next_cursor) {
        _cleanup_(json_decrefp) json_t *events = NULL;
        int64_t next_cursor = 0;
        sqlite3_stmt *st = NULL;
        unsigned limit = q->limit == 0 ? HISTORY_QUERY_LIMIT_MAX : MIN(q->limit, HISTORY_QUERY_LIMIT_MAX);
        int rc;

        /* One more row than a page tells whether another page exists. */
        rc = history_db_query_prepare(d->db, q, (int64_t) limit + 1, &st);
        if (rc != SQLITE_OK)
                return rc;

        events = json_array();
        if (!events) {
                sqlite3_finalize(st);
                return SQLITE_NOMEM;
        }
        unsigned n = 0;
        int64_t last = 0;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                if (n == limit) {
                        next_cursor = last;
                        break;
                }
                json_t *e = json_object();
                if (!e || json_array_append_new(events, e) < 0) {
                        sqlite3_finalize(st);
                        return SQLITE_NOMEM;
                }
                last = sqlite3_column_int64(st, 0);
                json_object_set_new(e, "id", json_integer(last));
                json_set_int(e, "time", st, 1, 1);
                json_set_text(e, "decision", st, 2);
                json_set_text(e, "pool", st, 3);
                json_set_text(e, "lane", st, 4);
                json_set_text(e, "job", st, 5);
                json_set_int(e, "uid", st, 6, 1);
                json_set_int(e, "pid", st, 7, 1);
                json_set_text(e, "lease", st, 8);
                json_set_int(e, "token", st, 9, 1);
                json_set_int(e, "waitedMs", st, 10, 1000);
                json_set_int(e, "heldMs", st, 11, 1000);
                json_set_int(e, "budgetMs", st, 12, 1000);
                json_set_text(e, "state", st, 13);
                json_set_text(e, "selector", st, 14);
                json_set_text(e, "reason", st, 15);
                json_set_text(e, "member", st, 16);
                json_set_int(e, "exitStatus", st, 17, 1);
                json_set_int(e, "until", st, 18, 1);
                n++;
        }
        sqlite3_finalize(st);
        if (rc != SQLITE_ROW && rc != SQLITE_DONE)
                return rc;
        *ret_events = TAKE_PTR(events);
        *ret_next_cursor = next_cursor;
        return SQLITE_OK;
}
