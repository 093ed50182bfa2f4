/* SPDX-License-Identifier: MIT */
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

#include "fs-util.h"
#include "history-internal.h"
#include "log.h"

HistoryTuning history_tuning = {
        .flush_delay = 100 * USEC_PER_MSEC,
        .reopen_interval = 5 * USEC_PER_SEC,
        .retention_interval = USEC_PER_MINUTE,
        .retry_min = 100 * USEC_PER_MSEC,
        .retry_max = 5 * USEC_PER_SEC,
        .stop_timeout = 3 * USEC_PER_SEC,
        .ballast_size = 1024 * 1024,
};

/* Lease deletes that wait for a database (degraded, or failing): a daemon has far fewer live leases. */
#define HISTORY_DEFERRED_DELETES_MAX 100000

/* ---- what crosses between the loop and the writer ---- */

/* Decision rows live in blocks that the loop fills and the writer gives back once every row in them is
 * written. Rows malloc()ed one by one would be freed by the writer into the loop thread's malloc arena,
 * whose lock the loop then waits for whenever the writer is descheduled inside free(). Blocks are mapped
 * outside any arena, prefaulted, and recycled rather than unmapped: mmap() and page faults wait for the
 * address-space lock that an munmap() elsewhere holds. */
#define ROW_BLOCK_SIZE ((size_t) 256 * 1024)
/* Blocks kept for reuse (8 MiB); more are unmapped, after a burst. */
#define ROW_BLOCKS_SPARE_MAX 32

typedef struct RowBlock {
        struct RowBlock *next; /* in History.spare_blocks, or the loop's own list */
        atomic_size_t refs;    /* rows not yet written, plus one while the loop still fills the block */
        size_t used;           /* loop thread only */
        History *history;
        _Alignas(16) char data[];
} RowBlock;

#define ROW_BLOCK_DATA (ROW_BLOCK_SIZE - offsetof(RowBlock, data))

/* A decision row, copied out of its AuditRecord: the strings follow the struct. */
typedef struct EventRow {
        struct EventRow *next;
        RowBlock *block;      /* NULL: malloc()ed on its own (a row too large for a block) */
        usec_t time, wait, hold, budget, idle;
        uint64_t token;
        uid_t uid;
        pid_t pid;
        unsigned retry_after_sec;
        const char *decision, *pool, *lane, *job, *lease, *state, *reason;
        char data[];
} EventRow;

typedef enum OpType {
        OP_LEASE_COMMIT,
        OP_LEASE_DELETE,
        OP_QUERY,
        OP_LOAD,
} OpType;

typedef struct Op {
        OpType type;
        struct Op *next;               /* in History.ops, History.done, or a writer's local list */

        /* Input, fixed once queued. */
        HistoryLeaseRow row;           /* OP_LEASE_COMMIT */
        char *lease_id;                /* OP_LEASE_DELETE */
        HistoryQuery query;            /* OP_QUERY; its strings owned */

        /* Output, written by the writer before the op is handed back. */
        int result;
        json_t *events;
        int64_t next_cursor;
        HistoryState state;            /* OP_LOAD */
        bool finished;                 /* OP_LOAD without a callback: the caller waits for it */
        bool async;                    /* OP_LOAD with a callback: handed back to the loop */

        /* Loop thread only: outstanding ops with a callback, for history_cancel(). */
        struct Op *all_prev, *all_next;
        HistoryDoneFn done;
        HistoryQueryFn query_done;
        HistoryLoadFn load_done;
        void *userdata;
} Op;

/* A pool's reserved token high-water, as committed and as the open transaction raises it. */
typedef struct TokenMark {
        char *pool;
        uint64_t committed, pending;
} TokenMark;

/* Everything only the writer thread touches. */
typedef struct Writer {
        sqlite3 *db;
        sqlite3_stmt *insert_event, *upsert_lease, *delete_lease, *upsert_token, *prune, *upsert_alive;
        EventRow *rows, *rows_tail;    /* taken from the queue, not yet written */
        size_t n_rows;
        Op *deferred, *deferred_tail;  /* lease deletes waiting for a working database */
        size_t n_deferred;
        TokenMark *marks;
        size_t n_marks;
        usec_t rows_retry_at;          /* 0: rows may be written now */
        usec_t backoff;
        usec_t reopen_at;
        usec_t retention_at;
        usec_t alive_at;               /* when the next "alive at" mark is written */
        bool retention_more;           /* the last pass stopped at its chunk size */
        bool ballast;                  /* history.db.ballast exists */
        bool failing;                  /* a write failed and none has succeeded since */
        int wal_frames;                /* the WAL's length after the last commit */
        int checkpoint_at;             /* the length at which the next checkpoint is due */
        bool checkpoint_due;           /* run one when nothing else waits */
        usec_t quiet_checkpoint_at;    /* monotonic: a checkpoint after a quiet spell; 0: none pending */
        bool full_logged, io_logged, degraded_logged;
} Writer;

/* The loop thread never takes a lock that the writer holds: a writer thread descheduled inside a critical
 * section would stall the loop for a whole time slice. Work goes both ways through lock-free stacks (each
 * has one consumer, which takes the whole stack at once and reverses it, so there is no ABA), and each side
 * wakes the other through an eventfd. The mutex is for history_load_*() only, at start. */
struct History {
        sd_event *event;
        sd_event_source *wakeup_source;
        int wakeup_fd;                 /* writer → loop: ops are done, or health changed */
        int writer_fd;                 /* loop → writer: work arrived, or stop */
        char *directory, *path, *ballast_path;
        usec_t retention;

        pthread_t thread;
        bool thread_started;
        pthread_mutex_t mutex;
        pthread_cond_t load_cond;      /* wakes a caller of history_load_*() */

        /* Loop → writer. */
        _Atomic(EventRow *) rows;      /* newest first */
        atomic_int_fast64_t n_rows;    /* about how many are in rows: may lag a push or a take */
        atomic_uint_fast64_t first_row_at; /* when rows last became non-empty */
        _Atomic(Op *) ops;             /* newest first */
        atomic_bool writer_woken;      /* writer_fd was written and the writer has not looked since */
        atomic_bool stopping;
        atomic_uint_fast64_t stop_deadline;

        /* Writer → loop. */
        _Atomic(Op *) done;            /* newest first */

        /* Either side. */
        atomic_bool dropping;          /* a drop episode was logged and has not ended */
        atomic_bool healthy;
        atomic_bool degraded;          /* no database: lease commits are answered at once */
        atomic_int checkpoint_state;   /* CheckpointState: a lease commit interrupts a running checkpoint */
        atomic_uint epoch;             /* bumped on every change of health */
        atomic_uint_fast64_t rows_written, rows_dropped, commits, write_errors, longest_commit;
        atomic_uint_fast64_t backlog;  /* appended, neither written nor dropped: what HISTORY_BACKLOG_MAX bounds */

        /* Writer → loop: blocks whose rows are all written, for reuse. */
        _Atomic(RowBlock *) spare_blocks;
        atomic_uint n_spare_blocks;

        /* Loop thread only. */
        RowBlock *block;               /* the block rows are appended to */
        RowBlock *spare;               /* taken from spare_blocks */
        Op *all;
        HistoryHealthFn health;
        void *health_userdata;
        unsigned epoch_seen;

        Writer w;
};

/* ---- small helpers ---- */

static struct timespec usec_to_timespec(usec_t u) {
        return (struct timespec) {
                .tv_sec = (time_t) (u / USEC_PER_SEC),
                .tv_nsec = (long) ((u % USEC_PER_SEC) * NSEC_PER_USEC),
        };
}

static int sqlite_to_errno(int rc) {
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

static bool sqlite_is_corrupt(int rc) {
        return (rc & 0xff) == SQLITE_CORRUPT || (rc & 0xff) == SQLITE_NOTADB;
}

static bool sqlite_is_full(int rc) {
        return (rc & 0xff) == SQLITE_FULL;
}

static void kick(History *h) {
        /* Cannot fail short of the counter overflowing, which would still leave the fd readable. */
        (void) eventfd_write(h->wakeup_fd, 1);
}

/* One eventfd write per wakeup, not per push: while a wake is posted and the writer has not taken it,
 * whatever is pushed meanwhile goes with it (the writer takes the stacks after clearing the flag). */
static void wake_writer(History *h) {
        if (!atomic_exchange(&h->writer_woken, true))
                (void) eventfd_write(h->writer_fd, 1);
}

/* Pushes onto a lock-free stack; returns true when it was empty. */
#define STACK_PUSH(head, item)                                                                  \
        ({                                                                                      \
                __typeof__(item) _old = atomic_load(head);                                      \
                do                                                                              \
                        (item)->next = _old;                                                    \
                while (!atomic_compare_exchange_weak((head), &_old, (item)));                   \
                _old == NULL;                                                                   \
        })

/* Takes a whole stack and reverses it into arrival order. */
#define STACK_TAKE(head)                                                                        \
        ({                                                                                      \
                __typeof__(atomic_load(head)) _p = atomic_exchange((head), NULL), _fifo = NULL; \
                while (_p) {                                                                    \
                        __typeof__(_p) _next = _p->next;                                        \
                        _p->next = _fifo;                                                       \
                        _fifo = _p;                                                             \
                        _p = _next;                                                             \
                }                                                                               \
                _fifo;                                                                          \
        })

static void members_free(char **members, unsigned n) {
        for (unsigned i = 0; members && i < n; i++)
                free(members[i]);
        free(members);
}

void history_lease_row_done(HistoryLeaseRow *row) {
        if (!row)
                return;
        free(row->id);
        free(row->pool);
        free(row->lane);
        free(row->slots);
        members_free(row->members, row->n_slots);
        free(row->job);
        *row = (HistoryLeaseRow) {};
}

void history_lease_rows_free(HistoryLeaseRow *rows, size_t n) {
        for (size_t i = 0; i < n; i++)
                history_lease_row_done(&rows[i]);
        free(rows);
}

void history_token_floors_free(HistoryTokenFloor *floors, size_t n) {
        for (size_t i = 0; i < n; i++)
                free(floors[i].pool);
        free(floors);
}

void history_state_done(HistoryState *s) {
        if (!s)
                return;
        history_lease_rows_free(s->leases, s->n_leases);
        history_token_floors_free(s->floors, s->n_floors);
        *s = (HistoryState) {};
}

static int lease_row_copy(const HistoryLeaseRow *from, HistoryLeaseRow *to) {
        _cleanup_(history_lease_row_done) HistoryLeaseRow r = *from;

        r.id = r.pool = r.lane = r.job = NULL;
        r.slots = NULL;
        r.members = NULL;
        if (strdup_or_null(from->id, &r.id) < 0 || strdup_or_null(from->pool, &r.pool) < 0 ||
            strdup_or_null(from->lane, &r.lane) < 0 || strdup_or_null(from->job, &r.job) < 0)
                return -ENOMEM;
        if (from->n_slots > 0) {
                r.slots = reallocarray(NULL, from->n_slots, sizeof(unsigned));
                if (!r.slots)
                        return -ENOMEM;
                memcpy(r.slots, from->slots, from->n_slots * sizeof(unsigned));
        }
        if (from->members) {
                r.members = calloc(from->n_slots, sizeof(char *));
                if (!r.members)
                        return -ENOMEM;
                for (unsigned i = 0; i < from->n_slots; i++)
                        if (strdup_or_null(from->members[i], &r.members[i]) < 0)
                                return -ENOMEM;
        }
        *to = r;
        r = (HistoryLeaseRow) {};
        return 0;
}

static Op *op_free(Op *op) {
        if (!op)
                return NULL;
        history_lease_row_done(&op->row);
        free(op->lease_id);
        free((char *) op->query.lane);
        free((char *) op->query.pool);
        free((char *) op->query.decision);
        json_decref(op->events);
        history_state_done(&op->state);
        return mfree(op);
}
DEFINE_TRIVIAL_CLEANUP_FUNC(Op *, op_free);

static void op_list_free(Op *list) {
        while (list) {
                Op *next = list->next;
                op_free(list);
                list = next;
        }
}

static void row_blocks_unmap(RowBlock *list) {
        while (list) {
                RowBlock *next = list->next;
                (void) munmap(list, ROW_BLOCK_SIZE);
                list = next;
        }
}

static void row_block_unref(RowBlock *b, size_t n) {
        History *h = b->history;

        if (atomic_fetch_sub(&b->refs, n) != n)
                return;
        if (atomic_fetch_add(&h->n_spare_blocks, 1) >= ROW_BLOCKS_SPARE_MAX) {
                atomic_fetch_sub(&h->n_spare_blocks, 1);
                (void) munmap(b, ROW_BLOCK_SIZE);
                return;
        }
        (void) STACK_PUSH(&h->spare_blocks, b);
}

/* Gives back the rows from list up to (not including) end: one atomic operation per run of rows of the
 * same block. */
static void event_rows_release(EventRow *list, EventRow *end) {
        while (list != end) {
                EventRow *next = list->next;
                if (!list->block)
                        free(list);
                else {
                        RowBlock *b = list->block;
                        size_t n = 1;
                        for (; next != end && next->block == b; next = next->next)
                                n++;
                        row_block_unref(b, n);
                }
                list = next;
        }
}

static void event_rows_free(EventRow *list) {
        event_rows_release(list, NULL);
}

static void hand_back(History *h, Op *list);

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
         * of an insert): ids are reused only after retention has emptied the table. */
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

/* The last instant (realtime µs) brokerd is known to have run, written with every lease commit and every
 * HISTORY_ALIVE_INTERVAL: a restart never lets a lease keep more of its max-hold than it had left then,
 * however far back the wall clock was stepped meanwhile. */
static int migration_4_alive(sqlite3 *db) {
        return sqlite3_exec(db, "CREATE TABLE alive (id INTEGER PRIMARY KEY CHECK (id = 1), at INTEGER NOT NULL)",
                            NULL, NULL, NULL);
}

static const struct {
        const char *what;
        int (*run)(sqlite3 *db);
} migrations[] = {
        { "initial schema", migration_1_initial },
        { "events.reason", migration_2_reason },
        { "leases.members", migration_3_lease_members },
        { "alive mark", migration_4_alive },
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

static void rollback(sqlite3 *db) {
        if (!sqlite3_get_autocommit(db))
                (void) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
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

typedef enum DbKind {
        DB_OURS,
        DB_EMPTY,
        DB_FOREIGN,   /* another program's SQLite file, or ours from a newer brokerd */
} DbKind;

static int db_identify(sqlite3 *db, DbKind *ret_kind, unsigned *ret_version) {
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
                *ret_kind = DB_OURS;
                *ret_version = (unsigned) version;
        } else if (app == 0 && version == 0 && objects == 0) {
                *ret_kind = DB_EMPTY;
                *ret_version = 0;
        } else
                *ret_kind = DB_FOREIGN;
        return SQLITE_OK;
}

/* Opens path with the connection settings every user of the file shares. Returns an SQLite code;
 * *ret is set (possibly to a handle that needs closing) either way. */
static int db_open_file(const char *path, sqlite3 **ret) {
        sqlite3 *db = NULL;
        int rc;

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
         * or after brokerd stops; and checkpoints run on this connection (on_wal_commit()). */
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
        DbKind kind;
        unsigned v;
        int rc;

        assert_return(path, -EINVAL);
        assert_return(version >= 1 && version <= ELEMENTSOF(migrations), -EINVAL);

        rc = db_open_file(path, &db);
        if (rc == SQLITE_OK)
                rc = db_identify(db, &kind, &v);
        if (rc == SQLITE_OK && kind != DB_EMPTY) {
                sqlite3_close_v2(db);
                return -EEXIST;
        }
        if (rc == SQLITE_OK)
                rc = migrate(db, 0, version);
        sqlite3_close_v2(db);
        return sqlite_to_errno(rc);
}

/* ---- the writer: opening, moving aside, the ballast ---- */

static void writer_set_health(History *h, bool healthy) {
        if (atomic_load(&h->healthy) == healthy)
                return;
        atomic_store(&h->healthy, healthy);
        atomic_fetch_add(&h->epoch, 1);
        kick(h);
}

static void writer_close(History *h) {
        Writer *w = &h->w;

        sqlite3_finalize(w->insert_event);
        sqlite3_finalize(w->upsert_lease);
        sqlite3_finalize(w->delete_lease);
        sqlite3_finalize(w->upsert_token);
        sqlite3_finalize(w->prune);
        sqlite3_finalize(w->upsert_alive);
        w->insert_event = w->upsert_lease = w->delete_lease = w->upsert_token = w->prune = w->upsert_alive = NULL;
        sqlite3_close_v2(w->db);
        w->db = NULL;
}

/* A disk that fills up must not stop lease commits, since a failed one refuses a grant. SQLite's own
 * free pages cannot serve as the reserve: in WAL mode even deleting a "ballast" table has to append
 * frames to the log, which on a full disk cannot grow, and the pages it frees sit inside history.db
 * where only a checkpoint could reuse them. So the reserve is a plain file beside the database: on
 * SQLITE_FULL during a lease commit it is unlinked, which returns its blocks to the file system at once,
 * and the commit is retried. Decision rows are not written again until the file could be re-created:
 * the space it gave back stays for leases. The content is not zeros, which a compressing file system
 * would not store. */
static int ballast_create(History *h) {
        _cleanup_free_ char *tmp = NULL;
        _cleanup_close_ int fd = -EBADF;
        char buf[64 * 1024];
        uint64_t x = 0x9e3779b97f4a7c15ULL;
        int r = 0;

        if (asprintf(&tmp, "%s.tmp", h->ballast_path) < 0)
                return -ENOMEM;
        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0)
                return -errno;
        for (uint64_t left = history_tuning.ballast_size; left > 0;) {
                size_t n = MIN(left, sizeof buf);
                for (size_t i = 0; i + 8 <= n; i += 8) {
                        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                        memcpy(buf + i, &x, 8);
                }
                ssize_t k = write(fd, buf, n);
                if (k < 0) {
                        r = -errno;
                        break;
                }
                left -= (uint64_t) k;
        }
        if (r == 0 && fsync(fd) < 0)
                r = -errno;
        if (r == 0 && rename(tmp, h->ballast_path) < 0)
                r = -errno;
        if (r < 0)
                (void) unlink(tmp);
        return r;
}

static bool writer_ensure_ballast(History *h) {
        Writer *w = &h->w;
        struct stat st;

        if (w->ballast)
                return true;
        if (stat(h->ballast_path, &st) >= 0 && (uint64_t) st.st_size >= history_tuning.ballast_size)
                w->ballast = true;
        else
                w->ballast = ballast_create(h) >= 0;
        return w->ballast;
}

static bool writer_drop_ballast(History *h) {
        Writer *w = &h->w;

        if (!w->ballast)
                return false;
        w->ballast = false;
        return unlink(h->ballast_path) >= 0;
}

static int prepare_statements(History *h) {
        Writer *w = &h->w;
        int rc;

        rc = sqlite3_prepare_v3(w->db,
                                "INSERT INTO events (time, decision, pool, lane, job, lease, token, wait_us, hold_us, "
                                "budget_us, idle_us, state, uid, pid, retry_after_sec, reason) "
                                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                                -1, SQLITE_PREPARE_PERSISTENT, &w->insert_event, NULL);
        if (rc == SQLITE_OK)
                rc = sqlite3_prepare_v3(w->db,
                                        "INSERT OR REPLACE INTO leases (id, pool, lane, slots, token, job, uid, pid, "
                                        "command_pid, command_start_time, detached, granted_at, expires_at, members) "
                                        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                                        -1, SQLITE_PREPARE_PERSISTENT, &w->upsert_lease, NULL);
        if (rc == SQLITE_OK)
                rc = sqlite3_prepare_v3(w->db, "DELETE FROM leases WHERE id = ?", -1, SQLITE_PREPARE_PERSISTENT,
                                        &w->delete_lease, NULL);
        if (rc == SQLITE_OK)
                /* MAX(): a high-water mark never goes back, whatever order commits come in. */
                rc = sqlite3_prepare_v3(w->db,
                                        "INSERT INTO tokens (pool, next_token) VALUES (?, ?) ON CONFLICT (pool) "
                                        "DO UPDATE SET next_token = MAX(next_token, excluded.next_token)",
                                        -1, SQLITE_PREPARE_PERSISTENT, &w->upsert_token, NULL);
        if (rc == SQLITE_OK)
                rc = sqlite3_prepare_v3(w->db,
                                        "DELETE FROM events WHERE id IN "
                                        "(SELECT id FROM events WHERE time < ? ORDER BY id LIMIT ?)",
                                        -1, SQLITE_PREPARE_PERSISTENT, &w->prune, NULL);
        if (rc == SQLITE_OK)
                /* MAX(): a clock stepped back does not move the mark back. */
                rc = sqlite3_prepare_v3(w->db,
                                        "INSERT INTO alive (id, at) VALUES (1, ?) ON CONFLICT (id) "
                                        "DO UPDATE SET at = MAX(at, excluded.at)",
                                        -1, SQLITE_PREPARE_PERSISTENT, &w->upsert_alive, NULL);
        return rc;
}

/* Inside a transaction. */
static int alive_mark_step(History *h) {
        sqlite3_stmt *st = h->w.upsert_alive;
        sqlite3_bind_int64(st, 1, (int64_t) MIN(now_realtime(), (usec_t) INT64_MAX));
        int rc = sqlite3_step(st);
        sqlite3_reset(st);
        h->w.alive_at = now_monotonic() + HISTORY_ALIVE_INTERVAL;
        return rc == SQLITE_DONE ? SQLITE_OK : rc;
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

static TokenMark *token_mark_find(Writer *w, const char *pool) {
        for (size_t i = 0; i < w->n_marks; i++)
                if (streq(w->marks[i].pool, pool))
                        return &w->marks[i];
        return NULL;
}

static TokenMark *token_mark_get(Writer *w, const char *pool) {
        TokenMark *m = token_mark_find(w, pool);
        if (m)
                return m;

        char *p = strdup(pool);
        if (!p)
                return NULL;
        TokenMark *a = reallocarray(w->marks, w->n_marks + 1, sizeof(TokenMark));
        if (!a) {
                free(p);
                return NULL;
        }
        w->marks = a;
        w->marks[w->n_marks] = (TokenMark) { .pool = p };
        return &w->marks[w->n_marks++];
}

/* Reads the tokens table into the marks, keeping the larger value. Returns an SQLite code. */
static int token_marks_load(History *h, sqlite3 *db) {
        Writer *w = &h->w;
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
                TokenMark *m = token_mark_get(w, pool);
                if (!m) {
                        rc = SQLITE_NOMEM;
                        break;
                }
                m->committed = m->pending = MAX(m->committed, (uint64_t) next);
                rc = SQLITE_OK;
        }
        sqlite3_finalize(st);
        return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* Writes every known mark: a database made afresh must not let tokens go back. */
static int token_marks_store(History *h) {
        Writer *w = &h->w;
        int rc = SQLITE_OK;

        for (size_t i = 0; i < w->n_marks && rc == SQLITE_OK; i++) {
                sqlite3_bind_text(w->upsert_token, 1, w->marks[i].pool, -1, SQLITE_STATIC);
                sqlite3_bind_int64(w->upsert_token, 2, (int64_t) w->marks[i].committed);
                rc = sqlite3_step(w->upsert_token);
                rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
                sqlite3_reset(w->upsert_token);
        }
        return rc;
}

static int leases_read(sqlite3 *db, HistoryLeaseRow **ret, size_t *ret_n);
static int lease_row_bind_step(History *h, const HistoryLeaseRow *row);

/* A corrupt file still often holds a readable leases and tokens table: what it gives is carried into
 * the fresh database, so that running commands keep their slots and tokens do not go back. */
static void salvage(History *h, const char *moved, size_t *ret_leases) {
        HistoryLeaseRow *rows = NULL;
        size_t n = 0, kept = 0;
        sqlite3 *old = NULL;

        *ret_leases = 0;
        if (sqlite3_open_v2(moved, &old, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
                sqlite3_close_v2(old);
                return;
        }
        (void) token_marks_load(h, old);
        (void) leases_read(old, &rows, &n);
        sqlite3_close_v2(old);

        if (sqlite3_exec(h->w.db, "BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK) {
                int rc = token_marks_store(h);
                for (size_t i = 0; i < n && rc == SQLITE_OK; i++, kept++)
                        rc = lease_row_bind_step(h, &rows[i]);
                if (rc == SQLITE_OK)
                        rc = sqlite3_exec(h->w.db, "COMMIT", NULL, NULL, NULL);
                if (rc != SQLITE_OK) {
                        rollback(h->w.db);
                        kept = 0;
                }
        }
        history_lease_rows_free(rows, n);
        *ret_leases = kept;
}

/* Renames history.db and its -wal and -shm to history.db.corrupt-<UTC time>[-wal|-shm], with ".N" added
 * should that name be taken. Returns 0 and the new name of the database, or negative errno. */
static int move_aside(History *h, char **ret_moved) {
        static const char *const sidecars[] = { "-wal", "-shm" };
        char stamp[32];
        struct tm tm;
        time_t t = time(NULL);
        int r;

        if (!gmtime_r(&t, &tm) || strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%S", &tm) == 0)
                return -EINVAL;

        for (unsigned attempt = 0; attempt < 100; attempt++) {
                _cleanup_free_ char *moved = NULL;
                if ((attempt == 0 ? asprintf(&moved, "%s.corrupt-%s", h->path, stamp)
                                  : asprintf(&moved, "%s.corrupt-%s.%u", h->path, stamp, attempt)) < 0)
                        return -ENOMEM;
                if (renameat2(AT_FDCWD, h->path, AT_FDCWD, moved, RENAME_NOREPLACE) < 0) {
                        if (errno == EEXIST)
                                continue;
                        r = -errno;
                        if (r != -ENOENT)
                                return r;
                }
                for (size_t i = 0; i < ELEMENTSOF(sidecars); i++) {
                        _cleanup_free_ char *from = NULL, *to = NULL;
                        if (asprintf(&from, "%s%s", h->path, sidecars[i]) < 0 ||
                            asprintf(&to, "%s%s", moved, sidecars[i]) < 0)
                                return -ENOMEM;
                        if (rename(from, to) < 0 && errno != ENOENT)
                                return -errno;
                }
                *ret_moved = TAKE_PTR(moved);
                return 0;
        }
        return -EEXIST;
}

typedef enum OpenResult {
        OPEN_OK,
        OPEN_FAILED,      /* degraded: tried again later */
} OpenResult;

static void writer_apply_deferred(History *h);
static OpenResult writer_open_at(History *h, bool afresh, const char *salvage_from);
static int on_wal_commit(void *userdata, sqlite3 *db, const char *name, int frames);
static void writer_checkpoint_step(History *h);

static OpenResult writer_open(History *h) {
        return writer_open_at(h, false, NULL);
}

static OpenResult writer_fail(History *h, const char *error) {
        Writer *w = &h->w;

        if (!w->degraded_logged) {
                log_error("Cannot open history database '%s' for writing (%s): decisions are kept in memory (at most %d) "
                          "and leases cannot be written; retrying every %" PRIu64 "s.",
                          h->path, error, HISTORY_BACKLOG_MAX, history_tuning.reopen_interval / USEC_PER_SEC);
                w->degraded_logged = true;
        }
        writer_close(h);
        w->reopen_at = now_monotonic() + history_tuning.reopen_interval;
        atomic_store(&h->degraded, true);
        writer_set_health(h, false);
        return OPEN_FAILED;
}

/* Moves the database aside and starts a fresh one, carrying over from a corrupt file (not a foreign
 * one) what it still gives. */
static OpenResult writer_start_afresh(History *h, const char *why, bool carry_over) {
        _cleanup_free_ char *moved = NULL;
        int r;

        writer_close(h);
        r = move_aside(h, &moved);
        if (r < 0) {
                log_error_errno(r, "History database '%s' is %s, and could not be moved aside: %m", h->path, why);
                return writer_fail(h, strerror(-r));
        }
        log_error("History database '%s' is %s: moved aside as '%s'; starting a fresh one.", h->path, why, moved);
        return writer_open_at(h, true, carry_over ? moved : NULL);
}

/* Opens (creating, migrating) the database; a corrupt or foreign file is moved aside, once: afresh
 * says this is the fresh file already. Logs what it did, once per episode. */
static OpenResult writer_open_at(History *h, bool afresh, const char *salvage_from) {
        Writer *w = &h->w;
        DbKind kind = DB_EMPTY;
        unsigned version = 0;
        int rc, r;

        writer_close(h);
        r = mkdir_parents(h->path, 0750); /* h->directory and the ones above */
        if (r < 0)
                return writer_fail(h, strerror(-r));

        rc = db_open_file(h->path, &w->db);
        if (rc == SQLITE_OK) {
                sqlite3_wal_hook(w->db, on_wal_commit, h); /* replaces the automatic checkpoint */
                rc = db_identify(w->db, &kind, &version);
        }
        if (!afresh && rc == SQLITE_OK && kind == DB_FOREIGN)
                return writer_start_afresh(h, "not a brokerd history database (or one of a newer brokerd)", false);
        if (!afresh && sqlite_is_corrupt(rc))
                return writer_start_afresh(h, "corrupt", true);
        if (rc == SQLITE_OK && kind == DB_FOREIGN)
                rc = SQLITE_CANTOPEN; /* replaced under our feet right after we moved one aside */
        if (rc == SQLITE_OK && sqlite3_db_readonly(w->db, "main") == 1)
                rc = SQLITE_READONLY; /* SQLite opens a file it may not write read-only, without a word */
        if (rc == SQLITE_OK)
                rc = migrate(w->db, version, ELEMENTSOF(migrations));
        if (rc == SQLITE_OK)
                rc = prepare_statements(h);
        if (rc == SQLITE_OK && salvage_from) {
                size_t n = 0;
                salvage(h, salvage_from, &n);
                if (n > 0)
                        log_info("History: carried %zu active leases over from '%s'.", n, salvage_from);
        }
        if (rc == SQLITE_OK)
                rc = token_marks_load(h, w->db);
        if (rc == SQLITE_OK && afresh) {
                /* What the moved file held of the tokens may be lost with it. The clock in µs is above any
                 * token handed out so far (a token per µs would be a million grants a second, for years):
                 * every pool continues above it, under the name no pool can have (HISTORY_TOKEN_FLOOR_ALL). */
                TokenMark *all = token_mark_get(w, HISTORY_TOKEN_FLOOR_ALL);
                if (!all)
                        rc = SQLITE_NOMEM;
                else
                        all->committed = all->pending = MAX(all->committed, (uint64_t) now_realtime());
        }
        if (rc == SQLITE_OK && w->n_marks > 0) {
                /* After a fresh start the marks we knew go back in: tokens never go back. */
                rc = sqlite3_exec(w->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
                if (rc == SQLITE_OK)
                        rc = token_marks_store(h);
                if (rc == SQLITE_OK)
                        rc = sqlite3_exec(w->db, "COMMIT", NULL, NULL, NULL);
                if (rc != SQLITE_OK)
                        rollback(w->db);
        }
        if (!afresh && sqlite_is_corrupt(rc))
                return writer_start_afresh(h, "corrupt", true); /* corruption past the header */
        if (rc != SQLITE_OK)
                /* The handle's message is of its last statement, which is not always the one that failed. */
                return writer_fail(h, w->db && sqlite3_errcode(w->db) != SQLITE_OK ? sqlite3_errmsg(w->db)
                                                                                    : sqlite3_errstr(rc));

        (void) writer_ensure_ballast(h);
        w->failing = false;
        w->backoff = 0;
        w->rows_retry_at = 0;
        if (w->degraded_logged) {
                log_info("History database '%s' is available again.", h->path);
                w->degraded_logged = false;
        }
        atomic_store(&h->degraded, false);
        writer_set_health(h, true);
        writer_apply_deferred(h);
        return OPEN_OK;
}

/* What a failed statement means for the database. Returns true when the database is usable again
 * (reopened, or made afresh after corruption) and the work may be retried at once. */
static bool writer_recover(History *h, int rc) {
        Writer *w = &h->w;

        if (sqlite_is_corrupt(rc)) {
                /* The fresh file may lack live leases: health going down and up again tells the daemon to
                 * commit them anew. */
                writer_set_health(h, false);
                return writer_start_afresh(h, "corrupt", true) == OPEN_OK;
        }
        if (sqlite_is_full(rc) || (rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED ||
            (rc & 0xff) == SQLITE_NOMEM)
                return false;

        /* I/O errors, a file made read-only or removed under us: a new connection finds out which. */
        if (!w->io_logged) {
                log_error("Failed to write history database '%s': %s; reopening it.", h->path, sqlite3_errstr(rc));
                w->io_logged = true;
        }
        return writer_open(h) == OPEN_OK;
}

static void writer_note_failure(History *h, int rc) {
        Writer *w = &h->w;

        atomic_fetch_add(&h->write_errors, 1);
        w->failing = true;
        writer_set_health(h, false);
        if (sqlite_is_full(rc) && !w->full_logged) {
                log_error("History database '%s': disk full. Decision rows stay queued (at most %d) and are retried; "
                          "lease commits use the reserve.",
                          h->path, HISTORY_BACKLOG_MAX);
                w->full_logged = true;
        } else if (!sqlite_is_full(rc) && !w->io_logged) {
                log_error("Failed to write history database '%s': %s; retrying.", h->path, sqlite3_errstr(rc));
                w->io_logged = true;
        }
}

/* A write went through. The episode is over only when nothing waits for a retry and the reserve is
 * back: a lease commit that succeeded thanks to the reserve does not mean the disk has room. */
static void writer_note_success(History *h) {
        Writer *w = &h->w;

        if (!w->failing)
                return;
        if (w->rows || !w->ballast)
                return;
        w->failing = false;
        if (w->full_logged || w->io_logged)
                log_info("History database '%s' is writable again.", h->path);
        w->full_logged = w->io_logged = false;
        writer_set_health(h, true);
}

static void writer_backoff(History *h) {
        Writer *w = &h->w;

        w->backoff = w->backoff == 0 ? history_tuning.retry_min : MIN(w->backoff * 2, history_tuning.retry_max);
        w->rows_retry_at = now_monotonic() + w->backoff;
}

/* ---- the writer: decision rows ---- */

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

static int event_row_insert(sqlite3_stmt *st, const EventRow *e) {
        sqlite3_bind_int64(st, 1, (int64_t) MIN(e->time, (usec_t) INT64_MAX));
        bind_text(st, 2, e->decision);
        bind_text(st, 3, e->pool);
        bind_text(st, 4, e->lane);
        bind_text(st, 5, e->job);
        bind_text(st, 6, e->lease);
        bind_nonzero(st, 7, (int64_t) MIN(e->token, (uint64_t) INT64_MAX));
        bind_usec(st, 8, e->wait);
        bind_usec(st, 9, e->hold);
        bind_usec(st, 10, e->budget);
        bind_usec(st, 11, e->idle);
        bind_text(st, 12, e->state);
        if (e->uid == (uid_t) -1)
                sqlite3_bind_null(st, 13);
        else
                sqlite3_bind_int64(st, 13, e->uid);
        bind_nonzero(st, 14, e->pid);
        bind_nonzero(st, 15, e->retry_after_sec);
        bind_text(st, 16, e->reason);
        int rc = sqlite3_step(st);
        sqlite3_reset(st);
        return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static void note_commit_time(History *h, usec_t start) {
        usec_t d = now_monotonic() - start;
        uint_fast64_t old = atomic_load(&h->longest_commit);
        while (d > old && !atomic_compare_exchange_weak(&h->longest_commit, &old, d))
                ;
        atomic_fetch_add(&h->commits, 1);
}

/* Writes up to HISTORY_BATCH_MAX of the writer's rows in one transaction. Returns the SQLite code. */
static int writer_write_batch(History *h) {
        Writer *w = &h->w;
        EventRow *e = w->rows;
        size_t n = 0;
        usec_t start = now_monotonic();
        int rc;

        rc = sqlite3_exec(w->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
        for (; rc == SQLITE_OK && e && n < HISTORY_BATCH_MAX; e = e->next, n++) {
                /* A lease commit (a grant waits for it) cuts the batch short rather than wait for all of it. */
                if (n % 64 == 0 && n > 0 && atomic_load_explicit(&h->ops, memory_order_relaxed))
                        break;
                rc = event_row_insert(w->insert_event, e);
        }
        if (rc == SQLITE_OK)
                rc = sqlite3_exec(w->db, "COMMIT", NULL, NULL, NULL);
        if (rc != SQLITE_OK) {
                rollback(w->db);
                return rc;
        }
        note_commit_time(h, start);

        /* Written: forget them. */
        EventRow *written = w->rows;
        w->rows = e;
        if (!e)
                w->rows_tail = NULL;
        w->n_rows -= n;
        event_rows_release(written, e);
        atomic_fetch_add(&h->rows_written, n);
        if (atomic_fetch_sub(&h->backlog, n) - n < HISTORY_BACKLOG_MAX / 2)
                atomic_store(&h->dropping, false); /* the episode is over: the next drop is logged again */
        return SQLITE_OK;
}

/* Writes one batch, or notes why it could not be written; the rows stay for a retry either way. */
static void writer_rows_step(History *h) {
        Writer *w = &h->w;
        int rc;

        /* After the reserve went to lease commits, rows wait until it is back: its space is theirs. */
        if (!w->ballast && !writer_ensure_ballast(h)) {
                writer_note_failure(h, SQLITE_FULL);
                writer_backoff(h);
                return;
        }
        rc = writer_write_batch(h);
        if (rc != SQLITE_OK && writer_recover(h, rc) && w->db)
                rc = writer_write_batch(h); /* a fresh or reopened database: at once, not after a backoff */
        if (rc == SQLITE_OK) {
                w->backoff = 0;
                w->rows_retry_at = 0;
                writer_note_success(h);
                return;
        }
        if (w->db)
                writer_note_failure(h, rc);
        writer_backoff(h);
}

/* ---- the writer: leases ---- */

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
                        members_free(a, n);
                        return r;
                }
                s += len + (s[len] == ',');
        }
        *ret = a;
        return 0;
}

static int lease_row_bind_step(History *h, const HistoryLeaseRow *row) {
        sqlite3_stmt *st = h->w.upsert_lease;
        _cleanup_free_ char *slots = NULL, *members = NULL;
        int rc;

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
        rc = sqlite3_step(st);
        sqlite3_reset(st);
        return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static int lease_delete_step(History *h, const char *id) {
        sqlite3_stmt *st = h->w.delete_lease;
        bind_text(st, 1, id);
        int rc = sqlite3_step(st);
        sqlite3_reset(st);
        return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* The row, and the pool's high-water mark when the token reaches it: all tokens below the mark may
 * have been handed out, so a restart continues from it and never reuses one. */
static int lease_commit_step(History *h, const HistoryLeaseRow *row) {
        Writer *w = &h->w;
        int rc;

        rc = lease_row_bind_step(h, row);
        if (rc != SQLITE_OK)
                return rc;

        TokenMark *m = token_mark_get(w, row->pool);
        if (!m)
                return SQLITE_NOMEM;
        if (row->token < m->pending)
                return SQLITE_OK;
        m->pending = row->token + HISTORY_TOKEN_BLOCK;
        sqlite3_bind_text(w->upsert_token, 1, row->pool, -1, SQLITE_STATIC);
        sqlite3_bind_int64(w->upsert_token, 2, (int64_t) MIN(m->pending, (uint64_t) INT64_MAX));
        rc = sqlite3_step(w->upsert_token);
        sqlite3_reset(w->upsert_token);
        return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* One transaction: the deferred deletes, then the ops in the order they were queued. */
static int writer_lease_transaction(History *h, Op *ops) {
        Writer *w = &h->w;
        usec_t start = now_monotonic();
        int rc;

        rc = sqlite3_exec(w->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
        for (Op *op = w->deferred; rc == SQLITE_OK && op; op = op->next)
                rc = lease_delete_step(h, op->lease_id);
        for (Op *op = ops; rc == SQLITE_OK && op; op = op->next) {
                if (op->type == OP_LEASE_COMMIT)
                        rc = lease_commit_step(h, &op->row);
                else if (op->type == OP_LEASE_DELETE)
                        rc = lease_delete_step(h, op->lease_id);
        }
        if (rc == SQLITE_OK)
                rc = alive_mark_step(h);
        if (rc == SQLITE_OK)
                rc = sqlite3_exec(w->db, "COMMIT", NULL, NULL, NULL);

        for (size_t i = 0; i < w->n_marks; i++) {
                if (rc == SQLITE_OK)
                        w->marks[i].committed = w->marks[i].pending;
                else
                        w->marks[i].pending = w->marks[i].committed;
        }
        if (rc != SQLITE_OK) {
                rollback(w->db);
                return rc;
        }
        note_commit_time(h, start);
        hand_back(h, w->deferred); /* freed by the loop, which allocated them */
        w->deferred = w->deferred_tail = NULL;
        w->n_deferred = 0;
        return SQLITE_OK;
}

static void writer_defer_delete(History *h, Op *op) {
        Writer *w = &h->w;

        if (w->n_deferred >= HISTORY_DEFERRED_DELETES_MAX) {
                op->next = NULL;
                hand_back(h, op);
                return;
        }
        op->next = NULL;
        if (w->deferred_tail)
                w->deferred_tail->next = op;
        else
                w->deferred = op;
        w->deferred_tail = op;
        w->n_deferred++;
}

static void writer_apply_deferred(History *h) {
        if (!h->w.deferred || !h->w.db)
                return;
        (void) writer_lease_transaction(h, NULL);
}

/* Commits and deletes, grouped. Each commit op gets its result; delete ops that could not be applied
 * are kept for later. Returns the ops to hand back (the loop frees what it allocated). */
static Op *writer_leases(History *h, Op *ops) {
        Writer *w = &h->w;
        int rc = SQLITE_CANTOPEN, result;

        if (w->db) {
                rc = writer_lease_transaction(h, ops);
                if (rc != SQLITE_OK && sqlite_is_full(rc) && writer_drop_ballast(h)) {
                        log_warning("History database '%s': disk full; released the reserve for lease commits.", h->path);
                        rc = writer_lease_transaction(h, ops);
                } else if (rc != SQLITE_OK && writer_recover(h, rc) && w->db)
                        rc = writer_lease_transaction(h, ops);
        }

        if (rc == SQLITE_OK) {
                result = 0;
                writer_note_success(h);
        } else if (!w->db)
                result = HISTORY_NOT_PERSISTED;
        else {
                result = sqlite_to_errno(rc);
                writer_note_failure(h, rc);
        }

        Op *commits = NULL, **tail = &commits;
        while (ops) {
                Op *op = ops;
                ops = op->next;
                op->next = NULL;
                if (op->type == OP_LEASE_DELETE && rc != SQLITE_OK) {
                        writer_defer_delete(h, op);
                        continue;
                }
                op->result = result;
                *tail = op;
                tail = &op->next;
        }
        return commits;
}

/* ---- the writer: reads ---- */

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

static bool wal_is_absent(History *h) {
        _cleanup_free_ char *wal = NULL;
        struct stat st;
        if (asprintf(&wal, "%s-wal", h->path) < 0)
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
static int reader_open(History *h, sqlite3 **ret) {
        sqlite3 *db = NULL;
        DbKind kind;
        unsigned version;
        struct stat st;
        int rc;

        *ret = NULL;
        if (stat(h->path, &st) < 0)
                return errno == ENOENT ? SQLITE_OK : SQLITE_CANTOPEN;
        rc = sqlite3_open_v2(h->path, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE |
                                                   SQLITE_OPEN_NOFOLLOW,
                             NULL);
        if (rc == SQLITE_OK) {
                sqlite3_busy_timeout(db, 50);
                rc = db_identify(db, &kind, &version);
        }
        if ((rc & 0xff) == SQLITE_CANTOPEN && wal_is_absent(h)) {
                /* SQLite reads a WAL database only where it can make the -wal and -shm (a read-only file
                 * system cannot). Without a -wal, everything is in the file itself: read it as immutable. */
                _cleanup_free_ char *uri = NULL;
                sqlite3_close_v2(db);
                db = NULL;
                rc = uri_immutable(h->path, &uri) < 0 ? SQLITE_NOMEM
                                                        : sqlite3_open_v2(uri, &db,
                                                                          SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX |
                                                                                  SQLITE_OPEN_EXRESCODE | SQLITE_OPEN_URI,
                                                                          NULL);
                if (rc == SQLITE_OK)
                        rc = db_identify(db, &kind, &version);
        }
        if (rc == SQLITE_OK && kind == DB_FOREIGN)
                rc = SQLITE_NOTADB;
        if (rc == SQLITE_OK && kind == DB_EMPTY) {
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

/* The persisted leases, token marks and alive mark: from the writer's connection, or else from a read-only
 * one. op->result: 0, or negative errno when what was persisted cannot be read. */
static void writer_load(History *h, Op *op) {
        Writer *w = &h->w;
        HistoryState *s = &op->state;
        sqlite3 *ro = NULL, *db = w->db;
        int rc = SQLITE_OK;

        if (!db) {
                rc = reader_open(h, &ro);
                db = ro;
        }
        if (rc == SQLITE_OK && ro)
                rc = token_marks_load(h, ro); /* the writer's own were read when it opened */
        if (rc == SQLITE_OK && db)
                rc = leases_read(db, &s->leases, &s->n_leases);
        if (rc == SQLITE_OK && db)
                rc = alive_mark_read(db, &s->alive_at);
        if (ro) {
                if (rc != SQLITE_OK && !w->io_logged)
                        log_error("Cannot read history database '%s' either: %s.", h->path, sqlite3_errmsg(ro));
                sqlite3_close_v2(ro);
        }
        if (rc != SQLITE_OK) {
                history_state_done(s);
                op->result = sqlite_to_errno(rc);
                if (w->db)
                        (void) writer_recover(h, rc);
                return;
        }

        /* The marks are what the database holds, plus what a fresh start carried over. */
        s->floors = calloc(MAX(w->n_marks, 1u), sizeof(HistoryTokenFloor));
        if (!s->floors) {
                history_state_done(s);
                op->result = -ENOMEM;
                return;
        }
        for (size_t i = 0; i < w->n_marks; i++) {
                s->floors[i].pool = strdup(w->marks[i].pool);
                if (!s->floors[i].pool) {
                        s->n_floors = i;
                        history_state_done(s);
                        op->result = -ENOMEM;
                        return;
                }
                s->floors[i].next_token = w->marks[i].committed;
        }
        s->n_floors = w->n_marks;
        op->result = 0;
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

static int writer_query(History *h, Op *op) {
        const HistoryQuery *q = &op->query;
        char sql[512];
        sqlite3_stmt *st = NULL;
        unsigned limit = q->limit == 0 ? HISTORY_QUERY_LIMIT_MAX : MIN(q->limit, HISTORY_QUERY_LIMIT_MAX);
        bool since = q->since > 0 && q->since != USEC_INFINITY, until = q->until > 0 && q->until != USEC_INFINITY;
        int rc, k = 1;

        if (!h->w.db)
                return -EIO;

        /* Only the filters given, so that the planner can use their indexes. */
        snprintf(sql, sizeof sql,
                 "SELECT id, time, decision, pool, lane, job, uid, pid, lease, token, wait_us, hold_us, budget_us, state "
                 "FROM events WHERE id > ?%s%s%s%s%s ORDER BY id LIMIT ?",
                 since ? " AND time >= ?" : "", until ? " AND time < ?" : "", q->lane ? " AND lane = ?" : "",
                 q->pool ? " AND pool = ?" : "", q->decision ? " AND decision = ?" : "");
        rc = sqlite3_prepare_v2(h->w.db, sql, -1, &st, NULL);
        if (rc != SQLITE_OK)
                goto fail;
        sqlite3_bind_int64(st, k++, MAX(q->cursor, 0));
        if (since)
                sqlite3_bind_int64(st, k++, (int64_t) MIN(q->since, (usec_t) INT64_MAX));
        if (until)
                sqlite3_bind_int64(st, k++, (int64_t) MIN(q->until, (usec_t) INT64_MAX));
        if (q->lane)
                bind_text(st, k++, q->lane);
        if (q->pool)
                bind_text(st, k++, q->pool);
        if (q->decision)
                bind_text(st, k++, q->decision);
        sqlite3_bind_int64(st, k, (int64_t) limit + 1); /* one more tells whether another page exists */

        op->events = json_array();
        if (!op->events) {
                sqlite3_finalize(st);
                return -ENOMEM;
        }
        unsigned n = 0;
        int64_t last = 0;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                if (n == limit) {
                        op->next_cursor = last;
                        break;
                }
                json_t *e = json_object();
                if (!e || json_array_append_new(op->events, e) < 0) {
                        sqlite3_finalize(st);
                        return -ENOMEM;
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
                n++;
        }
        sqlite3_finalize(st);
        if (rc == SQLITE_ROW || rc == SQLITE_DONE)
                return 0;
fail:
        json_decref(op->events);
        op->events = NULL;
        op->next_cursor = 0;
        (void) writer_recover(h, rc);
        return sqlite_to_errno(rc);
}

/* ---- the writer: retention ---- */

static void writer_retention_step(History *h) {
        Writer *w = &h->w;
        usec_t now = now_realtime();
        int rc;

        w->retention_more = false;
        w->retention_at = now_monotonic() + history_tuning.retention_interval;
        if (!w->db || h->retention == 0 || h->retention == USEC_INFINITY || now <= h->retention)
                return;

        /* A small chunk per statement: a month of rows never goes in one transaction, and lease commits
         * and decision rows get their turn between chunks. */
        sqlite3_bind_int64(w->prune, 1, (int64_t) MIN(now - h->retention, (usec_t) INT64_MAX));
        sqlite3_bind_int(w->prune, 2, HISTORY_RETENTION_CHUNK);
        rc = sqlite3_step(w->prune);
        sqlite3_reset(w->prune);
        if (rc != SQLITE_DONE) {
                if (!sqlite_is_full(rc))
                        (void) writer_recover(h, rc);
                return;
        }
        w->retention_more = sqlite3_changes(w->db) >= HISTORY_RETENTION_CHUNK;
}

/* ---- the writer: the alive mark ---- */

static void writer_alive_step(History *h) {
        Writer *w = &h->w;
        int rc;

        w->alive_at = now_monotonic() + HISTORY_ALIVE_INTERVAL; /* also when it fails: retried then */
        rc = sqlite3_exec(w->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
        if (rc == SQLITE_OK)
                rc = alive_mark_step(h);
        if (rc == SQLITE_OK)
                rc = sqlite3_exec(w->db, "COMMIT", NULL, NULL, NULL);
        if (rc != SQLITE_OK) {
                rollback(w->db);
                if (!sqlite_is_full(rc))
                        (void) writer_recover(h, rc);
        }
}

/* ---- the writer thread ---- */

/* Hands ops back to the loop, in the order given. */
static void hand_back(History *h, Op *list) {
        Op *reversed = NULL;

        if (!list)
                return;
        /* Pushed newest first, so that the loop's take restores this order. */
        while (list) {
                Op *next = list->next;
                list->next = reversed;
                reversed = list;
                list = next;
        }
        while (reversed) {
                Op *next = reversed->next;
                (void) STACK_PUSH(&h->done, reversed);
                reversed = next;
        }
        kick(h);
}

/* Moves what the loop appended to the writer's own list. */
static void writer_take_rows(History *h) {
        Writer *w = &h->w;
        size_t n = 1;

        EventRow *rows = STACK_TAKE(&h->rows);
        if (!rows)
                return;
        if (w->rows_tail)
                w->rows_tail->next = rows;
        else
                w->rows = rows;
        for (; rows->next; rows = rows->next)
                n++;
        w->rows_tail = rows;
        w->n_rows += n;
        atomic_fetch_sub(&h->n_rows, (int_fast64_t) n);
}

static void writer_flush_rows(History *h) {
        Writer *w = &h->w;

        writer_take_rows(h);
        while (w->rows && w->db && w->rows_retry_at == 0)
                writer_rows_step(h);
}

static void writer_ops(History *h, Op *ops) {
        Op *leases = NULL, **leases_tail = &leases, *queries = NULL, **queries_tail = &queries;

        while (ops) {
                Op *op = ops;
                ops = op->next;
                op->next = NULL;
                switch (op->type) {
                case OP_LOAD:
                        writer_load(h, op);
                        if (op->async) {
                                hand_back(h, op);
                                break;
                        }
                        pthread_mutex_lock(&h->mutex);
                        op->finished = true;
                        pthread_cond_broadcast(&h->load_cond);
                        pthread_mutex_unlock(&h->mutex);
                        break;
                case OP_LEASE_COMMIT:
                case OP_LEASE_DELETE:
                        *leases_tail = op;
                        leases_tail = &op->next;
                        break;
                case OP_QUERY:
                        *queries_tail = op;
                        queries_tail = &op->next;
                        break;
                }
        }

        /* Lease commits first: a grant waits for them. */
        if (leases)
                hand_back(h, writer_leases(h, leases));

        if (queries) {
                /* A query sees every row appended before it. */
                writer_flush_rows(h);
                for (Op *op = queries; op; op = op->next)
                        op->result = writer_query(h, op);
                hand_back(h, queries);
        }
}

/* Sleeps until woken through writer_fd or until `wake` (monotonic µs; USEC_INFINITY: no timeout). */
static void writer_sleep(History *h, usec_t wake) {
        struct pollfd p = { .fd = h->writer_fd, .events = POLLIN };
        struct timespec ts, *timeout = NULL;

        if (wake != USEC_INFINITY) {
                ts = usec_to_timespec(usec_sub_unsigned(wake, now_monotonic()));
                timeout = &ts;
        }
        /* Read here too: a wake can land between the flag's clearing and the read that goes with it. */
        if (ppoll(&p, 1, timeout, NULL) > 0) {
                eventfd_t v;
                (void) eventfd_read(h->writer_fd, &v);
        }
}

static void writer_main_loop(History *h) {
        Writer *w = &h->w;

        for (;;) {
                eventfd_t v;
                Op *ops;

                /* Cleared before looking: a push after this point wakes us again. */
                if (atomic_exchange(&h->writer_woken, false))
                        (void) eventfd_read(h->writer_fd, &v);

                ops = STACK_TAKE(&h->ops);
                if (ops) {
                        writer_ops(h, ops);
                        continue;
                }

                usec_t now = now_monotonic(), wake = USEC_INFINITY;
                bool stopping = atomic_load(&h->stopping);
                usec_t deadline = stopping ? atomic_load(&h->stop_deadline) : USEC_INFINITY;

                if (!w->db) {
                        if (stopping)
                                break;
                        if (now >= w->reopen_at) {
                                (void) writer_open(h);
                                continue;
                        }
                        wake = w->reopen_at;
                } else {
                        if (w->rows || atomic_load(&h->rows)) {
                                usec_t due;
                                if (w->rows_retry_at > 0)
                                        due = w->rows_retry_at;
                                else if (w->rows || stopping || atomic_load(&h->n_rows) >= HISTORY_BATCH_MAX)
                                        due = now;
                                else
                                        due = atomic_load(&h->first_row_at) + history_tuning.flush_delay;
                                if (now >= deadline)
                                        break;
                                if (now >= due) {
                                        writer_take_rows(h);
                                        writer_rows_step(h);
                                        continue;
                                }
                                wake = MIN(wake, due);
                        } else if (stopping)
                                break;

                        if (!stopping && (w->retention_more || now >= w->retention_at)) {
                                writer_retention_step(h);
                                continue;
                        }
                        if (!stopping && (w->checkpoint_due ||
                                          (w->quiet_checkpoint_at > 0 && now >= w->quiet_checkpoint_at))) {
                                writer_checkpoint_step(h);
                                continue;
                        }
                        if (!stopping && now >= w->alive_at) {
                                writer_alive_step(h);
                                continue;
                        }
                        if (!stopping)
                                wake = MIN(wake, MIN(w->retention_at, w->alive_at));
                        if (!stopping && w->quiet_checkpoint_at > 0)
                                wake = MIN(wake, w->quiet_checkpoint_at);
                }
                writer_sleep(h, MIN(wake, deadline));
        }
}

static void *writer_thread(void *userdata) {
        History *h = userdata;
        Writer *w = &h->w;

        (void) writer_open(h);
        w->retention_at = now_monotonic(); /* a first pass soon after start */

        writer_main_loop(h);

        /* Whatever could not be written in time is lost, and counted. */
        writer_take_rows(h);
        size_t lost = w->n_rows;
        if (lost > 0) {
                atomic_fetch_add(&h->rows_dropped, lost);
                log_warning("History: %zu decision rows could not be written before exiting.", lost);
        }
        writer_close(h);
        return NULL;
}

/* ---- the loop side ---- */

static void all_link(History *h, Op *op) {
        op->all_prev = NULL;
        op->all_next = h->all;
        if (h->all)
                h->all->all_prev = op;
        h->all = op;
}

static void all_unlink(History *h, Op *op) {
        if (op->all_prev)
                op->all_prev->all_next = op->all_next;
        else if (h->all == op)
                h->all = op->all_next;
        if (op->all_next)
                op->all_next->all_prev = op->all_prev;
        op->all_prev = op->all_next = NULL;
}

static int on_wakeup(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        History *h = userdata;
        eventfd_t v;
        Op *done;

        (void) eventfd_read(fd, &v);
        done = STACK_TAKE(&h->done);

        while (done) {
                Op *op = done;
                done = op->next;
                all_unlink(h, op);
                /* The callbacks may queue more work or cancel ops further down this list. */
                if (op->type == OP_QUERY && op->query_done)
                        op->query_done(h, op->result, op->events, op->next_cursor, op->userdata);
                else if (op->type == OP_LEASE_COMMIT && op->done)
                        op->done(h, op->result, op->userdata);
                else if (op->type == OP_LOAD && op->load_done)
                        op->load_done(h, op->result, &op->state, op->userdata);
                op_free(op);
        }

        unsigned epoch = atomic_load(&h->epoch);
        if (h->health && epoch != h->epoch_seen) {
                h->epoch_seen = epoch;
                h->health(h, atomic_load(&h->healthy), h->health_userdata);
        }
        return 0;
}

/* Checkpoints copy the WAL into history.db and fsync both: tens of milliseconds on a busy disk, which
 * SQLite's automatic checkpoint would charge to whichever commit crosses its threshold — a lease commit
 * that a grant waits for, as likely as not. So the automatic checkpoint is off, and the writer checkpoints
 * when nothing waits for it (writer_main_loop()): a lease commit that arrives meanwhile waits for one
 * checkpoint at most. (A thread with a connection of its own would let them run side by side, but that
 * needs the shared-memory WAL index that EXCLUSIVE locking avoids: see db_open_file().) */
#define CHECKPOINT_FRAMES 1000
/* Under sustained overload the writer is never idle; past this many frames (64 MiB of 4 KiB pages) it
 * checkpoints at the next commit, holding commits back until the log can start over. */
#define CHECKPOINT_FRAMES_MAX 16384
/* After this long without a commit, what the WAL holds goes into history.db: readers of the file while
 * brokerd runs (which read it as immutable, see db_open_file()) then see all but the last moments. */
#define CHECKPOINT_QUIET USEC_PER_SEC

static int on_wal_commit(void *userdata, sqlite3 *db, const char *name, int frames) {
        History *h = userdata;
        Writer *w = &h->w;

        /* Due once per CHECKPOINT_FRAMES of growth, not after every commit past the threshold. */
        if (frames < w->wal_frames || w->checkpoint_at == 0)
                w->checkpoint_at = CHECKPOINT_FRAMES; /* the log started over */
        w->wal_frames = frames;
        w->quiet_checkpoint_at = now_monotonic() + CHECKPOINT_QUIET;
        if (frames >= CHECKPOINT_FRAMES_MAX)
                (void) sqlite3_wal_checkpoint_v2(db, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
        else if (frames >= w->checkpoint_at) {
                w->checkpoint_at = frames + CHECKPOINT_FRAMES;
                w->checkpoint_due = true;
        }
        return SQLITE_OK;
}

/* A lease commit that arrives while a checkpoint runs interrupts it (sqlite3_interrupt(), from the loop
 * thread): the checkpoint stops between pages, as after a crash, and runs again later; the commit waits
 * for no copy of pages. The states make the loop's call safe without a lock: it may call
 * sqlite3_interrupt() only after moving RUNNING to INTERRUPTING, and the writer, which alone closes the
 * connection, waits after its checkpoint until the loop's call is over (a store of a flag: an instant). */
typedef enum CheckpointState {
        CHECKPOINT_IDLE,
        CHECKPOINT_RUNNING,
        CHECKPOINT_INTERRUPTING,
        CHECKPOINT_INTERRUPTED,
} CheckpointState;

/* Failures (a full disk) leave the WAL to grow: the writer's commits then say so. */
static void writer_checkpoint_step(History *h) {
        Writer *w = &h->w;
        int expected = CHECKPOINT_RUNNING;

        w->checkpoint_due = false;
        w->quiet_checkpoint_at = 0;
        atomic_store(&h->checkpoint_state, CHECKPOINT_RUNNING);
        if (!atomic_load(&h->ops)) /* a commit queued just now would not interrupt it */
                (void) sqlite3_wal_checkpoint_v2(w->db, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
        if (!atomic_compare_exchange_strong(&h->checkpoint_state, &expected, CHECKPOINT_IDLE)) {
                while (atomic_load(&h->checkpoint_state) != CHECKPOINT_INTERRUPTED)
                        sched_yield();
                atomic_store(&h->checkpoint_state, CHECKPOINT_IDLE);
        }
}

/* On the loop thread. The flag it sets is cleared by the next statement the writer starts. */
static void interrupt_checkpoint(History *h) {
        int expected = CHECKPOINT_RUNNING;

        if (!atomic_compare_exchange_strong(&h->checkpoint_state, &expected, CHECKPOINT_INTERRUPTING))
                return;
        sqlite3_interrupt(h->w.db);
        atomic_store(&h->checkpoint_state, CHECKPOINT_INTERRUPTED);
}

int history_new(sd_event *event, const char *directory, usec_t retention, History **ret) {
        pthread_condattr_t attr;
        sigset_t all, old;
        int r;

        assert_return(event, -EINVAL);
        assert_return(directory, -EINVAL);
        assert_return(ret, -EINVAL);

        _cleanup_(history_freep) History *h = calloc(1, sizeof(History));
        if (!h)
                return -ENOMEM;
        h->wakeup_fd = h->writer_fd = -EBADF;
        h->retention = retention;
        h->event = sd_event_ref(event);
        pthread_mutex_init(&h->mutex, NULL);
        pthread_condattr_init(&attr);
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        pthread_cond_init(&h->load_cond, &attr);
        pthread_condattr_destroy(&attr);

        h->directory = strdup(directory);
        if (!h->directory || asprintf(&h->path, "%s/history.db", directory) < 0 ||
            asprintf(&h->ballast_path, "%s/history.db.ballast", directory) < 0)
                return -ENOMEM;

        h->wakeup_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (h->wakeup_fd < 0)
                return -errno;
        h->writer_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (h->writer_fd < 0)
                return -errno;
        r = sd_event_add_io(event, &h->wakeup_source, h->wakeup_fd, EPOLLIN, on_wakeup, h);
        if (r < 0)
                return r;
        (void) sd_event_source_set_description(h->wakeup_source, "history");

        /* The threads take no signal: the loop's signal sources rely on every thread blocking them. */
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        r = -pthread_create(&h->thread, NULL, writer_thread, h);
        h->thread_started = r == 0;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(h);
        return 0;
}

History *history_free(History *h) {
        if (!h)
                return NULL;

        if (h->thread_started) {
                atomic_store(&h->stop_deadline, now_monotonic() + history_tuning.stop_timeout);
                atomic_store(&h->stopping, true);
                wake_writer(h);
                pthread_join(h->thread, NULL);
        }

        /* Callbacks are not called any more: whoever waits on them is going away too. */
        op_list_free(atomic_exchange(&h->ops, NULL));
        op_list_free(atomic_exchange(&h->done, NULL));
        op_list_free(h->w.deferred);
        event_rows_free(atomic_exchange(&h->rows, NULL));
        event_rows_free(h->w.rows);
        if (h->block)
                row_block_unref(h->block, 1);
        row_blocks_unmap(h->spare);
        row_blocks_unmap(atomic_exchange(&h->spare_blocks, NULL));
        for (size_t i = 0; i < h->w.n_marks; i++)
                free(h->w.marks[i].pool);
        free(h->w.marks);

        sd_event_source_disable_unref(h->wakeup_source);
        safe_close(h->wakeup_fd);
        safe_close(h->writer_fd);
        sd_event_unref(h->event);
        pthread_cond_destroy(&h->load_cond);
        pthread_mutex_destroy(&h->mutex);
        free(h->directory);
        free(h->path);
        free(h->ballast_path);
        return mfree(h);
}

static void queue_op(History *h, Op *op) {
        (void) STACK_PUSH(&h->ops, op);
        wake_writer(h);
}

int history_load_state(History *h, HistoryState *ret) {
        assert_return(h && ret, -EINVAL);

        _cleanup_(op_freep) Op *op = calloc(1, sizeof(Op));
        if (!op)
                return -ENOMEM;
        op->type = OP_LOAD;
        queue_op(h, op);

        /* Blocking is fine at start: nothing else is served yet. */
        pthread_mutex_lock(&h->mutex);
        while (!op->finished)
                pthread_cond_wait(&h->load_cond, &h->mutex);
        pthread_mutex_unlock(&h->mutex);
        if (op->result < 0)
                return op->result;
        *ret = op->state;
        op->state = (HistoryState) {};
        return 0;
}

int history_load(History *h, HistoryLoadFn done, void *userdata) {
        assert_return(h && done, -EINVAL);

        Op *op = calloc(1, sizeof(Op));
        if (!op)
                return -ENOMEM;
        op->type = OP_LOAD;
        op->load_done = done;
        op->async = true;
        op->userdata = userdata;
        all_link(h, op);
        queue_op(h, op);
        return 0;
}

int history_load_leases(History *h, HistoryLeaseRow **ret, size_t *ret_n) {
        HistoryState s;
        assert_return(h && ret && ret_n, -EINVAL);
        int r = history_load_state(h, &s);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(s.leases);
        *ret_n = s.n_leases;
        s.n_leases = 0;
        history_state_done(&s);
        return 0;
}

int history_load_token_floors(History *h, HistoryTokenFloor **ret, size_t *ret_n) {
        HistoryState s;
        assert_return(h && ret && ret_n, -EINVAL);
        int r = history_load_state(h, &s);
        if (r < 0)
                return r;
        *ret_n = s.n_floors;
        *ret = s.n_floors > 0 ? TAKE_PTR(s.floors) : NULL;
        s.n_floors = 0;
        history_state_done(&s);
        return 0;
}

static size_t strsize(const char *s) {
        return s ? strlen(s) + 1 : 0;
}

static const char *stash(char **p, const char *s, size_t size) {
        if (!s)
                return NULL;
        char *d = memcpy(*p, s, size);
        *p += size;
        return d;
}

static EventRow *row_alloc(History *h, size_t size) {
        RowBlock *b = h->block;
        EventRow *e;

        size = (size + 15) & ~(size_t) 15;
        if (size > ROW_BLOCK_DATA / 16) {
                e = malloc(size);
                if (e)
                        e->block = NULL;
                return e;
        }
        if (!b || b->used + size > ROW_BLOCK_DATA) {
                if (b)
                        row_block_unref(b, 1); /* full: the last written row gives it back */
                b = h->block = NULL;
                if (!h->spare) {
                        h->spare = atomic_exchange(&h->spare_blocks, NULL);
                        for (RowBlock *k = h->spare; k; k = k->next)
                                atomic_fetch_sub(&h->n_spare_blocks, 1);
                }
                if (h->spare) {
                        b = h->spare;
                        h->spare = b->next;
                } else {
                        void *m = mmap(NULL, ROW_BLOCK_SIZE, PROT_READ | PROT_WRITE,
                                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
                        if (m == MAP_FAILED)
                                return NULL;
                        b = m;
                        b->history = h;
                }
                atomic_init(&b->refs, 1);
                b->used = 0;
                h->block = b;
        }
        e = (EventRow *) (b->data + b->used);
        b->used += size;
        atomic_fetch_add(&b->refs, 1);
        e->block = b;
        return e;
}

void history_append(History *h, const AuditRecord *r, usec_t realtime) {
        size_t sd, sp, sl, sj, se, ss, sr;

        if (!h || !r || !r->decision)
                return;

        /* One producer (this thread): the bound cannot be overshot between the check and the add. */
        if (atomic_load(&h->backlog) >= HISTORY_BACKLOG_MAX) {
                atomic_fetch_add(&h->rows_dropped, 1);
                if (!atomic_exchange(&h->dropping, true))
                        log_warning("History cannot keep up: %d decision rows wait to be written; further rows are "
                                    "dropped (counted in the metrics) until it catches up.",
                                    HISTORY_BACKLOG_MAX);
                return;
        }

        sd = strsize(r->decision), sp = strsize(r->pool), sl = strsize(r->lane), sj = strsize(r->job),
        se = strsize(r->lease), ss = strsize(r->state), sr = strsize(r->reason);
        EventRow *e = row_alloc(h, sizeof(EventRow) + sd + sp + sl + sj + se + ss + sr);
        if (!e) {
                atomic_fetch_add(&h->rows_dropped, 1);
                return;
        }
        char *p = e->data;
        *e = (EventRow) {
                .block = e->block,
                .time = realtime,
                .wait = r->wait,
                .hold = r->hold,
                .budget = r->budget,
                .idle = r->idle,
                .token = r->token,
                .uid = r->uid,
                .pid = r->pid,
                .retry_after_sec = r->retry_after_sec,
        };
        e->decision = stash(&p, r->decision, sd);
        e->pool = stash(&p, r->pool, sp);
        e->lane = stash(&p, r->lane, sl);
        e->job = stash(&p, r->job, sj);
        e->lease = stash(&p, r->lease, se);
        e->state = stash(&p, r->state, ss);
        e->reason = stash(&p, r->reason, sr);

        atomic_fetch_add(&h->backlog, 1);
        /* The writer wakes for the first row of a batch (to time it) and for a full batch; not per row. */
        bool first = STACK_PUSH(&h->rows, e);
        int_fast64_t n = atomic_fetch_add(&h->n_rows, 1) + 1;
        if (first)
                atomic_store(&h->first_row_at, now_monotonic());
        if (first || n == HISTORY_BATCH_MAX)
                wake_writer(h);
}

int history_lease_commit(History *h, const HistoryLeaseRow *row, HistoryDoneFn done, void *userdata) {
        int r;

        assert_return(h && row && row->id && row->pool, -EINVAL);

        _cleanup_(op_freep) Op *op = calloc(1, sizeof(Op));
        if (!op)
                return -ENOMEM;
        op->type = OP_LEASE_COMMIT;
        r = lease_row_copy(row, &op->row);
        if (r < 0)
                return r;
        op->done = done;
        op->userdata = userdata;
        all_link(h, op);

        if (atomic_load(&h->degraded)) {
                /* No database: answered at once (through the eventfd, never from inside this call). */
                op->result = HISTORY_NOT_PERSISTED;
                hand_back(h, TAKE_PTR(op));
                return 0;
        }
        queue_op(h, TAKE_PTR(op));
        interrupt_checkpoint(h); /* after the push: a checkpoint that starts later sees the op and does not run */
        return 0;
}

void history_lease_delete(History *h, const char *id) {
        if (!h || !id)
                return;

        Op *op = calloc(1, sizeof(Op));
        if (!op || !(op->lease_id = strdup(id))) {
                free(op);
                return; /* the row stays; a restart ends the lease anyway, as its holder is gone */
        }
        op->type = OP_LEASE_DELETE;
        /* Nobody waits for a delete: it goes with the next lease commit's transaction, or with the next
         * batch of decision rows (there is one on its way whenever rows are queued, flush-delay at most).
         * A transaction of its own per release was half of the writer's commits. */
        (void) STACK_PUSH(&h->ops, op);
        if (atomic_load(&h->n_rows) == 0)
                wake_writer(h);
}

int history_query(History *h, const HistoryQuery *q, HistoryQueryFn done, void *userdata) {
        assert_return(h && q, -EINVAL);

        _cleanup_(op_freep) Op *op = calloc(1, sizeof(Op));
        if (!op)
                return -ENOMEM;
        op->type = OP_QUERY;
        op->query = *q;
        op->query.lane = op->query.pool = op->query.decision = NULL;
        if (strdup_or_null(q->lane, (char **) &op->query.lane) < 0 ||
            strdup_or_null(q->pool, (char **) &op->query.pool) < 0 ||
            strdup_or_null(q->decision, (char **) &op->query.decision) < 0)
                return -ENOMEM;
        op->query_done = done;
        op->userdata = userdata;
        all_link(h, op);
        queue_op(h, TAKE_PTR(op));
        return 0;
}

void history_cancel(History *h, void *userdata) {
        if (!h)
                return;
        for (Op *op = h->all; op; op = op->all_next)
                if (op->userdata == userdata) {
                        op->done = NULL;
                        op->query_done = NULL;
                        op->load_done = NULL;
                }
}

void history_set_health_callback(History *h, HistoryHealthFn fn, void *userdata) {
        if (!h)
                return;
        h->health = fn;
        h->health_userdata = userdata;
        h->epoch_seen = atomic_load(&h->epoch);
}

bool history_is_writable(const History *h) {
        return h && !atomic_load(&((History *) h)->degraded);
}

bool history_is_healthy(const History *h) {
        return h && atomic_load(&((History *) h)->healthy);
}

void history_get_stats(const History *h, HistoryStats *ret) {
        History *m = (History *) h; /* atomics only: nothing is changed */

        if (!h || !ret)
                return;
        *ret = (HistoryStats) {
                .rows_written = atomic_load(&m->rows_written),
                .rows_dropped = atomic_load(&m->rows_dropped),
                .rows_pending = atomic_load(&m->backlog),
                .commits = atomic_load(&m->commits),
                .write_errors = atomic_load(&m->write_errors),
                .longest_commit = atomic_load(&m->longest_commit),
                .healthy = atomic_load(&m->healthy),
        };
}
