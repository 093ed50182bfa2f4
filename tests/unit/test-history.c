/* SPDX-License-Identifier: MIT */
/* test-history.c — history.db: schema and migrations, decision rows and their queries, the leases, token
 * marks and alive mark an older brokerd kept there (read once, to carry them over to the lease log; the
 * tests write them with SQL, as nothing here writes them any more), retention, and the failures of SPEC §10
 * (corrupt and foreign files, a read-only directory, a full disk). Each test gets a fresh directory and drives a real sd-event loop
 * until the callback it waits for has run. The mount tests need CAP_SYS_ADMIN and run on their own
 * (`--mounts`): the test process puts itself in a private mount namespace, where read-only bind mounts
 * and a tiny tmpfs vanish with it. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <sched.h>
#include <setjmp.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "history-db.h"
#include "history-internal.h"
#include "log.h"

typedef struct Fixture {
        char dir[64];
        char state[128];      /* the state directory under test: dir/state */
        char mounted[128];    /* a mount point to detach at teardown, or "" */
        sd_event *event;
        History *h;
        unsigned health_calls;
        bool healthy;
} Fixture;

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
        return remove(path) < 0 ? -1 : 0;
}

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof(Fixture));
        assert_non_null(f);
        strcpy(f->dir, "/tmp/test-history-XXXXXX");
        assert_non_null(mkdtemp(f->dir));
        snprintf(f->state, sizeof f->state, "%s/state", f->dir);
        assert_int_equal(sd_event_new(&f->event), 0);

        history_tuning = (HistoryTuning) {
                .flush_delay = 100 * USEC_PER_MSEC,
                .reopen_interval = 300 * USEC_PER_MSEC,
                .retention_interval = USEC_PER_MINUTE,
                .retry_min = 20 * USEC_PER_MSEC,
                .retry_max = 200 * USEC_PER_MSEC,
                .stop_timeout = USEC_PER_SEC,
        };
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;

        f->h = history_free(f->h);
        sd_event_unref(f->event);
        if (f->mounted[0])
                (void) umount2(f->mounted, MNT_DETACH);
        (void) nftw(f->dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
        free(f);
        return 0;
}

/* Runs the loop until *flag is set; false after timeout. */
static bool run_until(Fixture *f, const bool *flag, usec_t timeout) {
        usec_t end = now_monotonic() + timeout;
        while (!*flag) {
                if (now_monotonic() > end)
                        return false;
                assert_true(sd_event_run(f->event, 50 * USEC_PER_MSEC) >= 0);
        }
        return true;
}

/* Runs the loop for a while: for the tests that check something does not happen. */
static void run_for(Fixture *f, usec_t duration) {
        usec_t end = now_monotonic() + duration;
        while (now_monotonic() < end)
                assert_true(sd_event_run(f->event, 20 * USEC_PER_MSEC) >= 0);
}

static void on_health(History *h, bool healthy, void *userdata) {
        Fixture *f = userdata;
        f->health_calls++;
        f->healthy = healthy;
}

/* Opens history in f->state and waits for the writer's first attempt to open the database. */
static void open_history(Fixture *f, usec_t retention) {
        HistoryLeaseRow *rows = NULL;
        size_t n = 0;

        assert_int_equal(history_new(f->event, f->state, retention, &f->h), 0);
        assert_int_equal(history_load_leases(f->h, &rows, &n), 0);
        history_lease_rows_free(rows, n);
        history_set_health_callback(f->h, on_health, f);
        f->healthy = history_is_healthy(f->h);
}

/* brokerd holds history.db exclusively while it runs (no shared-memory WAL index): other connections
 * read it after it is closed. */
static void close_history(Fixture *f) {
        f->h = history_free(f->h);
}

static void reopen_history(Fixture *f) {
        f->h = history_free(f->h);
        open_history(f, 0);
}

typedef struct QueryResult {
        bool called;
        int error;
        json_t *events;
        int64_t next;
} QueryResult;

static void on_query(History *h, int error, json_t *events, int64_t next, void *userdata) {
        QueryResult *q = userdata;
        q->called = true;
        q->error = error;
        q->events = json_incref(events);
        q->next = next;
}

static void query_sync(Fixture *f, const HistoryQuery *q, QueryResult *ret) {
        *ret = (QueryResult) {};
        assert_int_equal(history_query(f->h, q, on_query, ret), 0);
        assert_true(run_until(f, &ret->called, 30 * USEC_PER_SEC));
}

/* Every event matching q, following the cursor. */
static size_t query_count(Fixture *f, HistoryQuery q) {
        size_t n = 0;
        for (;;) {
                QueryResult r;
                query_sync(f, &q, &r);
                assert_int_equal(r.error, 0);
                n += json_array_size(r.events);
                json_decref(r.events);
                if (r.next == 0)
                        return n;
                q.cursor = r.next;
        }
}

/* Runs the loop until q matches at most n rows (retention's passes), for up to 10 s: how many it matches. */
static size_t wait_for_rows(Fixture *f, HistoryQuery q, size_t n) {
        usec_t end = now_monotonic() + 10 * USEC_PER_SEC;
        size_t left;
        while ((left = query_count(f, q)) > n && now_monotonic() < end)
                run_for(f, 100 * USEC_PER_MSEC);
        return left;
}

static AuditRecord record(const char *decision, const char *pool, const char *lane) {
        AuditRecord r = AUDIT_RECORD_INIT;
        r.decision = decision;
        r.pool = pool;
        r.lane = lane;
        return r;
}

static int64_t db_int(const char *path, const char *sql) {
        sqlite3 *db = NULL;
        sqlite3_stmt *st = NULL;
        int64_t v = -1;

        assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
        assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
        if (sqlite3_step(st) == SQLITE_ROW)
                v = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
        sqlite3_close(db);
        return v;
}

static void db_exec(const char *path, const char *sql) {
        sqlite3 *db = NULL;
        assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL), SQLITE_OK);
        assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
        sqlite3_close(db);
}

/* Schema 10: every row lies in a span of event_spans, within its ids and its times (what the time filters and
 * retention rely on). */
static void assert_spans_cover_rows(const char *path) {
        assert_int_equal(db_int(path, "SELECT count(*) FROM events e WHERE NOT EXISTS (SELECT 1 FROM event_spans s "
                                      "WHERE e.id BETWEEN s.first_id AND s.last_id AND e.time BETWEEN s.min_time AND s.max_time)"),
                         0);
}

static char *db_path(Fixture *f) {
        static char path[160];
        snprintf(path, sizeof path, "%s/history.db", f->state);
        return path;
}

/* The name history.db was moved to, or NULL. */
static char *find_moved_aside(Fixture *f) {
        static char path[256];
        char cmd[256];
        snprintf(cmd, sizeof cmd, "ls %s | grep -E '^history\\.db\\.corrupt-[0-9]{8}T[0-9]{6}$'", f->state);
        FILE *p = popen(cmd, "re");
        assert_non_null(p);
        char name[128];
        bool found = fgets(name, sizeof name, p) != NULL;
        pclose(p);
        if (!found)
                return NULL;
        name[strcspn(name, "\n")] = '\0';
        snprintf(path, sizeof path, "%s/%s", f->state, name);
        return path;
}

/* A lease row as an older brokerd wrote it into history.db, which must not be open in a History then (it
 * is held exclusively). slots and members as the columns hold them ("0,2"; "rig-a," or NULL); detached:
 * no job and no command; expires_at USEC_INFINITY: no max-hold. */
static void insert_lease(Fixture *f, const char *id, const char *pool, const char *slots, const char *members,
                         uint64_t token, bool detached, usec_t expires_at) {
        sqlite3 *db = NULL;
        sqlite3_stmt *st = NULL;

        assert_int_equal(sqlite3_open_v2(db_path(f), &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
        assert_int_equal(sqlite3_prepare_v2(db,
                                            "INSERT INTO leases (id, pool, lane, slots, token, job, uid, pid, command_pid, "
                                            "command_start_time, detached, granted_at, expires_at, members) "
                                            "VALUES (?, ?, 'merge', ?, ?, ?, 1000, 4242, ?, ?, ?, 1700000000000000, ?, ?)",
                                            -1, &st, NULL),
                         SQLITE_OK);
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, pool, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, slots, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 4, (int64_t) token);
        if (!detached) {
                sqlite3_bind_text(st, 5, "https://ci.example/job/7", -1, SQLITE_STATIC);
                sqlite3_bind_int64(st, 6, 4243);
                sqlite3_bind_int64(st, 7, 123456);
        }
        sqlite3_bind_int(st, 8, detached);
        if (expires_at != USEC_INFINITY)
                sqlite3_bind_int64(st, 9, (int64_t) expires_at);
        if (members)
                sqlite3_bind_text(st, 10, members, -1, SQLITE_STATIC);
        assert_int_equal(sqlite3_step(st), SQLITE_DONE);
        sqlite3_finalize(st);
        sqlite3_close(db);
}

static uint64_t token_floor(Fixture *f, const char *pool) {
        HistoryTokenFloor *floors = NULL;
        size_t n = 0;
        uint64_t v = 0;

        assert_int_equal(history_load_token_floors(f->h, &floors, &n), 0);
        for (size_t i = 0; i < n; i++)
                if (streq(floors[i].pool, pool))
                        v = floors[i].next_token;
        history_token_floors_free(floors, n);
        return v;
}

/* ---- schema ---- */

static void test_new_database_gets_current_schema(void **state) {
        Fixture *f = *state;
        struct stat st;

        snprintf(f->state, sizeof f->state, "%s/var/lib/brokerd", f->dir); /* missing: created */
        mode_t mask = umask(022); /* brokerd run by hand: the file has other users' job labels all the same */
        open_history(f, 0);
        umask(mask);
        assert_true(history_is_healthy(f->h));
        assert_int_equal(stat(f->state, &st), 0);
        assert_int_equal(st.st_mode & 07777, 0750);
        assert_int_equal(stat(db_path(f), &st), 0);
        assert_int_equal(st.st_mode & 07777, 0600); /* as the lease log */

        char wal[200], shm[200];
        snprintf(wal, sizeof wal, "%s-wal", db_path(f));
        assert_int_equal(access(wal, F_OK), 0); /* WAL mode */
        assert_int_equal(stat(wal, &st), 0);
        assert_int_equal(st.st_mode & 07777, 0600);
        /* ...with the WAL index in memory: no history.db-shm to map, which could raise SIGBUS. */
        snprintf(shm, sizeof shm, "%s-shm", db_path(f));
        assert_int_equal(access(shm, F_OK), -1);
        assert_int_equal(errno, ENOENT);

        close_history(f);
        assert_int_equal(db_int(db_path(f), "PRAGMA user_version"), (int64_t) history_schema_version());
        assert_int_equal(db_int(db_path(f), "PRAGMA application_id"), HISTORY_APPLICATION_ID);
        assert_int_equal(db_int(db_path(f), "SELECT count(*) FROM sqlite_master WHERE name IN "
                                            "('events','leases','tokens','event_spans','events_unusual_decision')"),
                         5);
        assert_int_equal(db_int(db_path(f), "SELECT count(*) FROM sqlite_master WHERE name IN "
                                            "('events_decision_time','events_time')"),
                         0);
}

/* What EXPLAIN QUERY PLAN says of the statement history_db_query() runs for q: its lines, joined. */
static void query_plan(const char *path, const HistoryQuery *q, char *buf, size_t size) {
        char sql[HISTORY_DB_QUERY_SQL_MAX], explain[HISTORY_DB_QUERY_SQL_MAX + 32];
        sqlite3 *db = NULL;
        sqlite3_stmt *st = NULL;
        size_t n = 0;

        history_db_query_sql(q, sql, sizeof sql);
        snprintf(explain, sizeof explain, "EXPLAIN QUERY PLAN %s", sql);
        assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
        assert_int_equal(sqlite3_prepare_v2(db, explain, -1, &st, NULL), SQLITE_OK);
        buf[0] = '\0';
        while (sqlite3_step(st) == SQLITE_ROW)
                n += (size_t) snprintf(buf + n, size - n, "%s; ", (const char *) sqlite3_column_text(st, 3));
        assert_true(n < size);
        sqlite3_finalize(st);
        sqlite3_close(db);
}

/* Schema 9: an unusual decision is found through its index, in id order; grants and releases (nearly every
 * row) by id, never sorted; schema 10: a time filter by a range of ids. */
static void test_decision_filters_are_planned_without_a_sort(void **state) {
        Fixture *f = *state;
        char plan[1024];

        assert_int_equal(mkdir(f->state, 0750), 0);
        open_history(f, 0);
        close_history(f);

        const HistoryQuery unusual[] = {
                { .decision = "busy" },
                { .decision = "revoked", .lane = "merge", .pool = "grid" },
                { .decision = "timeout", .since = 1, .until = 2 },
        };
        for (size_t i = 0; i < ELEMENTSOF(unusual); i++) {
                query_plan(db_path(f), &unusual[i], plan, sizeof plan);
                assert_non_null(strstr(plan, "events_unusual_decision"));
                assert_null(strstr(plan, "TEMP B-TREE"));
        }
        const HistoryQuery usual[] = {
                { .decision = "granted" },
                { .decision = "released", .since = 1 },
                { .lane = "merge" },
        };
        for (size_t i = 0; i < ELEMENTSOF(usual); i++) {
                query_plan(db_path(f), &usual[i], plan, sizeof plan);
                assert_null(strstr(plan, "events_unusual_decision"));
                assert_null(strstr(plan, "TEMP B-TREE"));
        }
        /* Schema 10: a time filter reads events in the range of ids event_spans bounds it to. */
        const HistoryQuery timed[] = {
                { .since = 1 },
                { .until = 2, .lane = "merge" },
                { .since = 1, .until = 2, .decision = "granted" },
        };
        for (size_t i = 0; i < ELEMENTSOF(timed); i++) {
                query_plan(db_path(f), &timed[i], plan, sizeof plan);
                assert_non_null(strstr(plan, "SEARCH events USING INTEGER PRIMARY KEY (rowid>"));
                assert_non_null(strstr(plan, "SEARCH event_spans"));
                assert_null(strstr(plan, "TEMP B-TREE"));
        }
}

static void test_old_schema_is_migrated_and_keeps_its_rows(void **state) {
        Fixture *f = *state;
        QueryResult r;

        assert_int_equal(mkdir(f->state, 0750), 0);
        assert_int_equal(history_schema_create(db_path(f), 1), 0);
        db_exec(db_path(f), "INSERT INTO events (time, decision, pool, lane, wait_us) VALUES (5000000, 'granted', 'grid', 'merge', 1500)");
        assert_int_equal(db_int(db_path(f), "PRAGMA user_version"), 1);
        assert_int_equal(db_int(db_path(f), "SELECT count(*) FROM pragma_table_info('events') WHERE name = 'reason'"), 0);

        open_history(f, 0);
        assert_true(history_is_healthy(f->h));
        close_history(f);
        assert_int_equal(db_int(db_path(f), "PRAGMA user_version"), (int64_t) history_schema_version());
        assert_int_equal(db_int(db_path(f), "SELECT count(*) FROM pragma_table_info('events') WHERE name = 'reason'"), 1);
        assert_int_equal(db_int(db_path(f), "SELECT count(*) FROM events WHERE reason IS NULL"), 1);
        /* schema 6: a lease's members and a quarantine's exit status, NULL in the rows from before */
        assert_int_equal(db_int(db_path(f), "SELECT count(*) FROM pragma_table_info('events') WHERE name IN ('member', 'exit_status')"), 2);
        assert_int_equal(db_int(db_path(f), "SELECT count(*) FROM events WHERE member IS NULL AND exit_status IS NULL"), 1);
        /* schema 8: a drain's until, NULL in the rows from before */
        assert_int_equal(db_int(db_path(f), "SELECT count(*) FROM events WHERE until_us IS NULL"), 1);
        /* schema 9: the decision index holds the unusual decisions only */
        assert_int_equal(db_int(db_path(f), "SELECT count(*) FROM sqlite_master WHERE name = 'events_decision_time'"), 0);
        assert_int_equal(db_int(db_path(f), "SELECT count(*) FROM sqlite_master WHERE name = 'events_unusual_decision'"), 1);
        /* schema 10: the rows from before are in spans */
        assert_int_equal(db_int(db_path(f), "SELECT count(*) FROM event_spans"), 1);
        assert_spans_cover_rows(db_path(f));
        assert_null(find_moved_aside(f));
        open_history(f, 0);

        query_sync(f, &(HistoryQuery) { .lane = "merge" }, &r);
        assert_int_equal(r.error, 0);
        assert_int_equal(json_array_size(r.events), 1);
        assert_int_equal(json_integer_value(json_object_get(json_array_get(r.events, 0), "waitedMs")), 1);
        json_decref(r.events);
}

/* Schema 6 → 7 (and on): events.slots, a request's slot count (`slotctl simulate --replay` asks as many), NULL in
 * the rows from before; rows written after have it, and rows that are no request's do not. */
static void test_schema_6_is_migrated_to_slots(void **state) {
        Fixture *f = *state;

        assert_int_equal(mkdir(f->state, 0750), 0);
        assert_int_equal(history_schema_create(db_path(f), 6), 0);
        db_exec(db_path(f), "INSERT INTO events (time, decision, pool, lane, member, exit_status) "
                            "VALUES (5000000, 'released', 'rigs', 'merge', 'rig-a', 3)");
        assert_int_equal(db_int(db_path(f), "SELECT count(*) FROM pragma_table_info('events') WHERE name = 'slots'"), 0);

        open_history(f, 0);
        assert_true(history_is_healthy(f->h));
        AuditRecord r = record("granted", "grid", "merge");
        r.slots = 3;
        history_append(f->h, &r, now_realtime());
        AuditRecord d = record("drained", "grid", NULL);
        history_append(f->h, &d, now_realtime());
        assert_int_equal(query_count(f, (HistoryQuery) {}), 3);
        close_history(f);
        assert_null(find_moved_aside(f));
        assert_int_equal(db_int(db_path(f), "PRAGMA user_version"), (int64_t) history_schema_version());
        assert_int_equal(db_int(db_path(f), "SELECT count(*) FROM events WHERE slots IS NULL AND member = 'rig-a' "
                                            "AND exit_status = 3"), 1);
        assert_int_equal(db_int(db_path(f), "SELECT slots FROM events WHERE decision = 'granted'"), 3);
        assert_int_equal(db_int(db_path(f), "SELECT count(*) FROM events WHERE decision = 'drained' AND slots IS NULL"), 1);
}

static void test_newer_schema_is_moved_aside(void **state) {
        Fixture *f = *state;

        assert_int_equal(mkdir(f->state, 0750), 0);
        db_exec(db_path(f), "PRAGMA application_id = 1397510996; PRAGMA user_version = 99; CREATE TABLE future (x);");
        open_history(f, 0);
        assert_true(history_is_healthy(f->h));
        const char *moved = find_moved_aside(f);
        assert_non_null(moved);
        assert_int_equal(db_int(moved, "PRAGMA user_version"), 99);
        close_history(f);
        assert_int_equal(db_int(db_path(f), "PRAGMA user_version"), (int64_t) history_schema_version());
}

static void test_older_brokerds_ballast_is_removed(void **state) {
        Fixture *f = *state;
        char ballast[160], tmp[170];
        static char buf[64 * 1024];

        /* An older brokerd reserved 1 MiB beside history.db for its lease commits (and may have died
         * while making it: the .tmp). Nothing needs it now: an upgraded state directory does not keep it. */
        assert_int_equal(mkdir(f->state, 0750), 0);
        snprintf(ballast, sizeof ballast, "%s/history.db.ballast", f->state);
        snprintf(tmp, sizeof tmp, "%s.tmp", ballast);
        const char *paths[] = { ballast, tmp };
        for (size_t i = 0; i < ELEMENTSOF(paths); i++) {
                int fd = open(paths[i], O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
                assert_true(fd >= 0);
                for (unsigned k = 0; k < 16; k++)
                        assert_int_equal(write(fd, buf, sizeof buf), sizeof buf);
                close(fd);
        }

        open_history(f, 0);
        assert_true(history_is_healthy(f->h));
        for (size_t i = 0; i < ELEMENTSOF(paths); i++) {
                assert_int_equal(access(paths[i], F_OK), -1);
                assert_int_equal(errno, ENOENT);
        }
}

/* ---- decision rows ---- */

static void append_sample(Fixture *f) {
        /* 12 rows: 3 pools × 2 lanes × (granted at t, released at t+1s), times 10 s apart. */
        static const char *const pools[] = { "grid", "rig", "db" }, *const lanes[] = { "merge", "nightly" };
        usec_t t = 1700000000 * USEC_PER_SEC;
        unsigned k = 0;

        for (size_t p = 0; p < ELEMENTSOF(pools); p++)
                for (size_t l = 0; l < ELEMENTSOF(lanes); l++, k++) {
                        char lease[32];
                        snprintf(lease, sizeof lease, "lease-%u", k);
                        AuditRecord g = record("granted", pools[p], lanes[l]);
                        g.lease = lease;
                        g.token = k + 1;
                        g.wait = 2500 * USEC_PER_MSEC;
                        g.budget = 5 * USEC_PER_MINUTE;
                        g.idle = USEC_PER_SEC;
                        g.state = "keeping-up";
                        g.uid = 1000;
                        g.pid = 100 + k;
                        g.job = "job";
                        history_append(f->h, &g, t + k * 10 * USEC_PER_SEC);
                        AuditRecord e = record("released", pools[p], lanes[l]);
                        e.lease = lease;
                        e.hold = 42 * USEC_PER_SEC;
                        history_append(f->h, &e, t + k * 10 * USEC_PER_SEC + USEC_PER_SEC);
                }
}

static void test_rows_are_queryable_with_every_filter(void **state) {
        Fixture *f = *state;
        usec_t t = 1700000000 * USEC_PER_SEC;
        QueryResult r;

        open_history(f, 0);
        append_sample(f);

        assert_int_equal(query_count(f, (HistoryQuery) {}), 12);
        assert_int_equal(query_count(f, (HistoryQuery) { .until = USEC_INFINITY }), 12);
        assert_int_equal(query_count(f, (HistoryQuery) { .lane = "merge" }), 6);
        assert_int_equal(query_count(f, (HistoryQuery) { .pool = "rig" }), 4);
        assert_int_equal(query_count(f, (HistoryQuery) { .decision = "released" }), 6);
        assert_int_equal(query_count(f, (HistoryQuery) { .pool = "rig", .lane = "nightly", .decision = "granted" }), 1);
        assert_int_equal(query_count(f, (HistoryQuery) { .pool = "nonesuch" }), 0);
        /* since ≤ time < until: rows k = 2, 3 (granted at t+20s and t+30s, released a second later). */
        assert_int_equal(query_count(f, (HistoryQuery) { .since = t + 20 * USEC_PER_SEC, .until = t + 40 * USEC_PER_SEC }), 4);
        assert_int_equal(query_count(f, (HistoryQuery) { .since = t + 20 * USEC_PER_SEC, .until = t + 21 * USEC_PER_SEC }), 1);
        assert_int_equal(query_count(f, (HistoryQuery) { .since = t + 51 * USEC_PER_SEC }), 1);

        /* The HistoryEvent of io.slotbroker.varlink, and nothing that does not apply. */
        query_sync(f, &(HistoryQuery) { .pool = "grid", .lane = "merge" }, &r);
        assert_int_equal(r.error, 0);
        assert_int_equal(r.next, 0);
        assert_int_equal(json_array_size(r.events), 2);
        json_t *g = json_array_get(r.events, 0), *e = json_array_get(r.events, 1);
        assert_true(json_integer_value(json_object_get(g, "id")) > 0);
        assert_true(json_integer_value(json_object_get(e, "id")) > json_integer_value(json_object_get(g, "id")));
        assert_int_equal(json_integer_value(json_object_get(g, "time")), (json_int_t) t);
        assert_string_equal(json_string_value(json_object_get(g, "decision")), "granted");
        assert_string_equal(json_string_value(json_object_get(g, "pool")), "grid");
        assert_string_equal(json_string_value(json_object_get(g, "lane")), "merge");
        assert_string_equal(json_string_value(json_object_get(g, "job")), "job");
        assert_string_equal(json_string_value(json_object_get(g, "lease")), "lease-0");
        assert_string_equal(json_string_value(json_object_get(g, "state")), "keeping-up");
        assert_int_equal(json_integer_value(json_object_get(g, "uid")), 1000);
        assert_int_equal(json_integer_value(json_object_get(g, "pid")), 100);
        assert_int_equal(json_integer_value(json_object_get(g, "token")), 1);
        assert_int_equal(json_integer_value(json_object_get(g, "waitedMs")), 2500);
        assert_int_equal(json_integer_value(json_object_get(g, "budgetMs")), 300000);
        assert_null(json_object_get(g, "heldMs"));
        assert_int_equal(json_integer_value(json_object_get(e, "heldMs")), 42000);
        assert_string_equal(json_string_value(json_object_get(e, "decision")), "released");
        assert_null(json_object_get(e, "waitedMs"));
        assert_null(json_object_get(e, "uid"));
        assert_null(json_object_get(e, "pid"));
        assert_null(json_object_get(e, "token"));
        assert_null(json_object_get(e, "state"));
        assert_null(json_object_get(e, "job"));
        json_decref(r.events);
}

/* Schema 10: since and until find their rows through event_spans, over spans of many batches and after a wall
 * clock stepped back (rows dated before rows written earlier). */
static void test_time_filters_find_rows_across_spans_and_a_stepped_clock(void **state) {
        Fixture *f = *state;
        const usec_t t = 1700000000 * USEC_PER_SEC;
        const unsigned n = 3 * HISTORY_SPAN_ROWS + 77, n_back = 50;

        open_history(f, 0);
        for (unsigned i = 0; i < n; i++) {
                AuditRecord r = record(i % 2 ? "released" : "granted", "grid", "merge");
                history_append(f->h, &r, t + i);
        }
        assert_int_equal(query_count(f, (HistoryQuery) {}), n); /* written: the next rows are another batch */
        for (unsigned i = 0; i < n_back; i++) {
                AuditRecord r = record("busy", "grid", "merge");
                history_append(f->h, &r, t - 1000 + i);
        }

        assert_int_equal(query_count(f, (HistoryQuery) { .since = t }), n);
        assert_int_equal(query_count(f, (HistoryQuery) { .until = t }), n_back);
        assert_int_equal(query_count(f, (HistoryQuery) { .since = t - 1000 + 10, .until = t + 5 }), n_back - 10 + 5);
        assert_int_equal(query_count(f, (HistoryQuery) { .since = t + 2 * HISTORY_SPAN_ROWS + 7 }),
                         n - 2 * HISTORY_SPAN_ROWS - 7);
        assert_int_equal(query_count(f, (HistoryQuery) { .until = t + 100 }), 100 + n_back);
        assert_int_equal(query_count(f, (HistoryQuery) { .since = t + 100, .until = t + 100 + HISTORY_SPAN_ROWS }),
                         HISTORY_SPAN_ROWS);
        assert_int_equal(query_count(f, (HistoryQuery) { .since = t + n }), 0);
        assert_int_equal(query_count(f, (HistoryQuery) { .until = t - 1000 }), 0);
        assert_int_equal(query_count(f, (HistoryQuery) { .decision = "busy", .since = t - 1000 + 40 }), n_back - 40);
        assert_int_equal(query_count(f, (HistoryQuery) { .decision = "granted", .until = t + 10 }), 5);

        close_history(f);
        assert_spans_cover_rows(db_path(f));
        assert_in_range(db_int(db_path(f), "SELECT count(*) FROM event_spans"), 3, n / 8);
        char sql[128];
        snprintf(sql, sizeof sql, "SELECT count(*) FROM event_spans WHERE last_id - first_id >= %d", HISTORY_SPAN_ROWS);
        assert_int_equal(db_int(db_path(f), sql), 0);
}

/* Steps the statement history_db_query() runs for q over the closed file at path to its end, with a page as
 * large as the file: how many virtual machine steps SQLite took (what it read, not how long). */
static int query_steps(const char *path, const HistoryQuery *q) {
        sqlite3 *db = NULL;
        sqlite3_stmt *st = NULL;

        assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
        assert_int_equal(history_db_query_prepare(db, q, INT32_MAX, &st), SQLITE_OK);
        while (sqlite3_step(st) == SQLITE_ROW)
                ;
        int steps = sqlite3_stmt_status(st, SQLITE_STMTSTATUS_VM_STEP, 0);
        sqlite3_finalize(st);
        sqlite3_close(db);
        return steps;
}

/* Schema 10: a time filter reads the ids of the spans it needs, not the table from its start or to its end:
 * a few rows asked of five spans' worth read at most one or two spans of them. */
static void test_time_filters_read_only_their_spans(void **state) {
        Fixture *f = *state;
        const usec_t t = 1700000000 * USEC_PER_SEC;
        const unsigned n = 5 * HISTORY_SPAN_ROWS;

        assert_int_equal(mkdir(f->state, 0750), 0);
        open_history(f, 0);
        for (unsigned i = 0; i < n; i++) {
                AuditRecord r = record("granted", "grid", "merge");
                history_append(f->h, &r, t + i);
        }
        assert_int_equal(query_count(f, (HistoryQuery) {}), n);
        close_history(f);

        /* A lane no row has: every row read is looked at, none is returned, so the steps count the rows read;
         * each against the same filters over every row. */
        const HistoryQuery few[] = {
                { .lane = "none", .since = t + n - 10 },
                { .lane = "none", .until = t + 10 },
                { .lane = "none", .since = t + n / 2, .until = t + n / 2 + 10 },
        }, every[] = {
                { .lane = "none", .since = t },
                { .lane = "none", .until = t + n },
                { .lane = "none", .since = t, .until = t + n },
        };
        for (size_t i = 0; i < ELEMENTSOF(few); i++)
                assert_true(query_steps(db_path(f), &few[i]) * 2 < query_steps(db_path(f), &every[i]));
}

static void test_pages_follow_the_cursor(void **state) {
        Fixture *f = *state;
        HistoryQuery q = { .limit = 1000 };
        size_t sizes[8], n_pages = 0;
        int64_t last = 0;

        open_history(f, 0);
        for (unsigned i = 0; i < 2500; i++) {
                AuditRecord r = record(i % 2 ? "busy" : "granted", "grid", "merge");
                history_append(f->h, &r, (1700000000 + i) * USEC_PER_SEC);
        }

        for (;;) {
                QueryResult r;
                query_sync(f, &q, &r);
                assert_int_equal(r.error, 0);
                size_t i;
                json_t *e;
                json_array_foreach(r.events, i, e) {
                        int64_t id = json_integer_value(json_object_get(e, "id"));
                        assert_true(id > last); /* ordered by id, no repeats across pages */
                        last = id;
                }
                assert_true(n_pages < ELEMENTSOF(sizes));
                sizes[n_pages++] = json_array_size(r.events);
                json_decref(r.events);
                if (r.next == 0)
                        break;
                assert_int_equal(r.next, last);
                q.cursor = r.next;
        }
        assert_int_equal(n_pages, 3);
        assert_int_equal(sizes[0], 1000);
        assert_int_equal(sizes[1], 1000);
        assert_int_equal(sizes[2], 500);

        /* limit 0 and limits above the cap both mean the cap. */
        QueryResult r;
        query_sync(f, &(HistoryQuery) { .limit = 0 }, &r);
        assert_int_equal(json_array_size(r.events), HISTORY_QUERY_LIMIT_MAX);
        assert_true(r.next > 0);
        json_decref(r.events);
        query_sync(f, &(HistoryQuery) { .limit = 100000 }, &r);
        assert_int_equal(json_array_size(r.events), HISTORY_QUERY_LIMIT_MAX);
        json_decref(r.events);
        /* Filtered paging: 1250 busy rows. */
        assert_int_equal(query_count(f, (HistoryQuery) { .decision = "busy", .limit = 300 }), 1250);
}

static void test_cancelled_query_is_not_called_back(void **state) {
        Fixture *f = *state;
        QueryResult cancelled = {}, other;

        open_history(f, 0);
        assert_int_equal(history_query(f->h, &(HistoryQuery) {}, on_query, &cancelled), 0);
        history_cancel(f->h, &cancelled);
        query_sync(f, &(HistoryQuery) {}, &other); /* answered after the first */
        json_decref(other.events);
        assert_false(cancelled.called);
}

static void test_free_writes_what_is_queued(void **state) {
        Fixture *f = *state;

        open_history(f, 0);
        for (unsigned i = 0; i < 10; i++) {
                AuditRecord r = record("granted", "grid", "merge");
                history_append(f->h, &r, now_realtime());
        }
        /* Freed before the batch's 100 ms are up. */
        reopen_history(f);
        assert_int_equal(query_count(f, (HistoryQuery) {}), 10);
}

static void test_200k_rows_all_land(void **state) {
        Fixture *f = *state;
        HistoryStats st;
        const unsigned n = 200000;

        open_history(f, 0);
        usec_t start = now_monotonic();
        for (unsigned i = 0; i < n; i++) {
                AuditRecord r = record(i % 3 ? "granted" : "released", "grid", i % 2 ? "merge" : "nightly");
                r.wait = i;
                r.lease = "0123456789abcdef0123456789abcdef";
                r.job = "https://ci.example.org/project/pipelines/123456/jobs/7890";
                history_append(f->h, &r, now_realtime());
                /* Stay under the backlog bound: the loop would, at 200,000 decisions a second. */
                if (i % 1000 == 999)
                        for (;;) {
                                history_get_stats(f->h, &st);
                                if (st.rows_pending < HISTORY_BACKLOG_MAX / 2)
                                        break;
                                assert_true(sd_event_run(f->event, USEC_PER_MSEC) >= 0);
                        }
        }
        /* A query is answered once every row queued before it is written. */
        QueryResult q;
        query_sync(f, &(HistoryQuery) { .limit = 1 }, &q);
        json_decref(q.events);
        usec_t elapsed = now_monotonic() - start;
        history_get_stats(f->h, &st);
        assert_int_equal(st.rows_written, n);
        assert_int_equal(st.rows_dropped, 0);
        assert_int_equal(st.rows_pending, 0);
        printf("# 200000 rows in %" PRIu64 " ms: %" PRIu64 " rows/s, %" PRIu64 " commits, longest %" PRIu64 " µs\n",
               elapsed / USEC_PER_MSEC, (uint64_t) n * USEC_PER_SEC / elapsed, st.commits, st.longest_commit);
        /* i % 3 != 0 are granted, i odd are merge: the odd i not divisible by 3. */
        assert_int_equal(query_count(f, (HistoryQuery) { .since = 1, .decision = "granted", .lane = "merge" }),
                         n / 2 - (n / 3 + 1) / 2);
}

/* ---- what an older brokerd kept: leases, token marks, the alive mark ---- */

/* An older brokerd's history.db, closed: schema version 4, two leases, two token marks, an alive mark. */
static void make_older_brokerds_database(Fixture *f) {
        assert_int_equal(mkdir(f->state, 0750), 0);
        assert_int_equal(history_schema_create(db_path(f), 4), 0);
        insert_lease(f, "L1", "grid", "0,2", NULL, 7, false, USEC_INFINITY);
        insert_lease(f, "L2", "rig", "0", NULL, 1, true, 1700000600000000);
        db_exec(db_path(f), "INSERT INTO tokens (pool, next_token) VALUES ('grid', 1031), ('rig', 1025);"
                            "INSERT INTO alive (id, at) VALUES (1, 1700000300000000);");
}

static const HistoryTokenFloor *floor_of(const HistoryState *s, const char *pool) {
        for (size_t i = 0; i < s->n_floors; i++)
                if (streq(s->floors[i].pool, pool))
                        return &s->floors[i];
        return NULL;
}

static void test_older_brokerds_leases_marks_and_alive_mark_are_read(void **state) {
        Fixture *f = *state;
        _cleanup_(history_state_done) HistoryState s = {};

        make_older_brokerds_database(f);
        open_history(f, 0);
        assert_true(history_is_healthy(f->h));
        assert_int_equal(history_load_state(f->h, &s), 0);

        assert_int_equal(s.n_leases, 2);
        const HistoryLeaseRow *l1 = &s.leases[0], *l2 = &s.leases[1];
        assert_string_equal(l1->id, "L1");
        assert_string_equal(l1->pool, "grid");
        assert_string_equal(l1->lane, "merge");
        assert_int_equal(l1->n_slots, 2);
        assert_int_equal(l1->slots[0], 0);
        assert_int_equal(l1->slots[1], 2);
        assert_null(l1->members);
        assert_int_equal(l1->token, 7);
        assert_string_equal(l1->job, "https://ci.example/job/7");
        assert_int_equal(l1->uid, 1000);
        assert_int_equal(l1->pid, 4242);
        assert_int_equal(l1->command_pid, 4243);
        assert_int_equal(l1->command_start_time, 123456);
        assert_false(l1->detached);
        assert_int_equal(l1->granted_at, 1700000000000000);
        assert_true(l1->expires_at == USEC_INFINITY);
        assert_string_equal(l2->id, "L2");
        assert_true(l2->detached);
        assert_null(l2->job);
        assert_int_equal(l2->command_pid, 0);
        assert_int_equal(l2->n_slots, 1);
        assert_int_equal(l2->expires_at, 1700000600000000);

        assert_int_equal(s.n_floors, 2);
        assert_int_equal(floor_of(&s, "grid")->next_token, 1031);
        assert_int_equal(floor_of(&s, "rig")->next_token, 1025);
        assert_int_equal(s.alive_at, 1700000300000000);

        /* Reading writes nothing: the marks and the alive mark stay as the older brokerd left them. */
        close_history(f);
        assert_int_equal(db_int(db_path(f), "SELECT next_token FROM tokens WHERE pool = 'grid'"), 1031);
        assert_int_equal(db_int(db_path(f), "SELECT at FROM alive"), 1700000300000000);
}

static void test_delete_forgets_a_carried_over_lease(void **state) {
        Fixture *f = *state;
        HistoryLeaseRow *rows = NULL;
        size_t n = 0;

        make_older_brokerds_database(f);
        open_history(f, 0);
        history_lease_delete(f->h, "L1");
        history_lease_delete(f->h, "no-such-lease");

        reopen_history(f); /* history_free() writes what is queued */
        assert_int_equal(history_load_leases(f->h, &rows, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(rows[0].id, "L2");
        history_lease_rows_free(rows, n);
}

static void test_lease_member_names_are_read_and_old_rows_have_none(void **state) {
        Fixture *f = *state;
        HistoryLeaseRow *rows = NULL;
        size_t n = 0;

        /* A row written before leases.members existed; one after, whose second slot has no name. */
        assert_int_equal(mkdir(f->state, 0750), 0);
        assert_int_equal(history_schema_create(db_path(f), 2), 0);
        db_exec(db_path(f), "INSERT INTO leases (id, pool, lane, slots, token, uid, pid, detached, granted_at) "
                            "VALUES ('L0', 'rig', 'merge', '1', 2, 1000, 4242, 0, 1690000000000000)");
        open_history(f, 0); /* migrated */
        close_history(f);
        insert_lease(f, "L1", "rig", "0,2", "rig-a,", 3, false, USEC_INFINITY);

        open_history(f, 0);
        assert_int_equal(history_load_leases(f->h, &rows, &n), 0);
        assert_int_equal(n, 2);
        assert_string_equal(rows[0].id, "L0");
        assert_null(rows[0].members);
        assert_string_equal(rows[1].id, "L1");
        assert_non_null(rows[1].members);
        assert_string_equal(rows[1].members[0], "rig-a");
        assert_null(rows[1].members[1]);
        history_lease_rows_free(rows, n);
}

/* ---- retention ---- */

static void test_retention_prunes_old_rows_a_span_at_a_time(void **state) {
        Fixture *f = *state;
        const unsigned n_old = 2 * HISTORY_SPAN_ROWS + 123;
        usec_t now = now_realtime();

        history_tuning.retention_interval = 200 * USEC_PER_MSEC;
        assert_int_equal(history_new(f->event, f->state, USEC_PER_HOUR, &f->h), 0);
        for (unsigned i = 0; i < n_old; i++) {
                AuditRecord r = record("granted", "grid", "merge");
                history_append(f->h, &r, now - 2 * USEC_PER_HOUR + i);
        }
        for (unsigned i = 0; i < 10; i++) {
                AuditRecord r = record("busy", "grid", "merge");
                history_append(f->h, &r, now - 30 * USEC_PER_MINUTE + i);
        }
        assert_in_range(query_count(f, (HistoryQuery) {}), 10, n_old + 10);

        /* The next passes delete a span at a time until only the recent rows are left. */
        assert_int_equal(wait_for_rows(f, (HistoryQuery) {}, 10), 10);
        assert_int_equal(query_count(f, (HistoryQuery) { .decision = "busy" }), 10);
}

/* Rows dated before the cutoff in a span of recent ones (a wall clock stepped back) go; the recent ones of the
 * span stay, and it still covers them. */
static void test_retention_prunes_old_rows_among_recent_ones(void **state) {
        Fixture *f = *state;
        usec_t now = now_realtime();

        history_tuning.retention_interval = 100 * USEC_PER_MSEC;
        assert_int_equal(history_new(f->event, f->state, USEC_PER_HOUR, &f->h), 0);
        for (unsigned i = 0; i < 30; i++) {
                AuditRecord r = record(i % 3 == 1 ? "timeout" : "granted", "grid", "merge");
                history_append(f->h, &r, i % 3 == 1 ? now - 2 * USEC_PER_HOUR + i : now - 30 * USEC_PER_MINUTE + i);
        }
        assert_int_equal(query_count(f, (HistoryQuery) {}), 30);

        assert_int_equal(wait_for_rows(f, (HistoryQuery) {}, 20), 20);
        assert_int_equal(query_count(f, (HistoryQuery) { .decision = "timeout" }), 0);
        assert_int_equal(query_count(f, (HistoryQuery) { .since = now - 31 * USEC_PER_MINUTE }), 20);

        close_history(f);
        assert_spans_cover_rows(db_path(f));
        char sql[128];
        snprintf(sql, sizeof sql, "SELECT min(min_time) >= %" PRId64 " FROM event_spans",
                 (int64_t) (now - 30 * USEC_PER_MINUTE));
        assert_int_equal(db_int(db_path(f), sql), 1);
}

/* A span over ids that newer rows took again (events emptied by hand, then written anew: their spans overlap
 * it): its retention deletes what is old, by time, not the newer rows of its ids. */
static void test_retention_keeps_new_rows_under_a_stale_span(void **state) {
        Fixture *f = *state;
        usec_t now = now_realtime();
        int64_t old = (int64_t) (now - 2 * USEC_PER_HOUR);
        char sql[320];

        assert_int_equal(mkdir(f->state, 0750), 0);
        open_history(f, 0);
        for (unsigned i = 0; i < 40; i++) {
                AuditRecord r = record("granted", "grid", "merge");
                history_append(f->h, &r, now - USEC_PER_MINUTE + i);
        }
        assert_int_equal(query_count(f, (HistoryQuery) {}), 40);
        close_history(f);
        /* The stale span (5–30), and two old rows in a span after it: retention takes spans in id order, so
         * once those two are gone the stale span has had its pass. */
        snprintf(sql, sizeof sql,
                 "INSERT INTO event_spans VALUES (5, 30, %1$" PRId64 ", %1$" PRId64 ");"
                 "INSERT INTO events (id, time, decision) VALUES (100, %1$" PRId64 ", 'busy'), (101, %1$" PRId64 ", 'busy');"
                 "INSERT INTO event_spans VALUES (100, 101, %1$" PRId64 ", %1$" PRId64 ");",
                 old);
        db_exec(db_path(f), sql);

        history_tuning.retention_interval = 100 * USEC_PER_MSEC;
        assert_int_equal(history_new(f->event, f->state, USEC_PER_HOUR, &f->h), 0);
        assert_int_equal(wait_for_rows(f, (HistoryQuery) { .decision = "busy" }, 0), 0);
        assert_int_equal(query_count(f, (HistoryQuery) {}), 40);
        close_history(f);
        assert_int_equal(db_int(db_path(f), "SELECT count(*) FROM event_spans WHERE first_id IN (5, 100)"), 0);
        assert_spans_cover_rows(db_path(f));
}

/* ---- corrupt and foreign files ---- */

static void test_corrupt_file_is_moved_aside(void **state) {
        Fixture *f = *state;
        char junk[64 * 1024];
        struct stat st;

        assert_int_equal(mkdir(f->state, 0750), 0);
        srand(42);
        for (size_t i = 0; i < sizeof junk; i++)
                junk[i] = (char) rand();
        int fd = open(db_path(f), O_WRONLY | O_CREAT | O_CLOEXEC, 0640);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, junk, sizeof junk), sizeof junk);
        close(fd);

        open_history(f, 0);
        assert_true(history_is_healthy(f->h));
        const char *moved = find_moved_aside(f);
        assert_non_null(moved);
        assert_int_equal(stat(moved, &st), 0);
        assert_int_equal(st.st_size, sizeof junk); /* kept as it was, for a post-mortem */

        /* The fresh database works. */
        AuditRecord r = record("granted", "grid", "merge");
        history_append(f->h, &r, now_realtime());
        assert_int_equal(query_count(f, (HistoryQuery) {}), 1);
}

static void test_foreign_database_is_moved_aside(void **state) {
        Fixture *f = *state;

        assert_int_equal(mkdir(f->state, 0750), 0);
        db_exec(db_path(f), "CREATE TABLE recipes (name TEXT); INSERT INTO recipes VALUES ('bread');");

        open_history(f, 0);
        assert_true(history_is_healthy(f->h));
        const char *moved = find_moved_aside(f);
        assert_non_null(moved);
        assert_int_equal(db_int(moved, "SELECT count(*) FROM recipes"), 1);
        close_history(f);
        assert_int_equal(db_int(db_path(f), "PRAGMA application_id"), HISTORY_APPLICATION_ID);
        open_history(f, 0);
        AuditRecord r = record("granted", "grid", "merge");
        history_append(f->h, &r, now_realtime());
        assert_int_equal(query_count(f, (HistoryQuery) {}), 1);
}

static void test_corrupt_file_gives_up_its_leases_and_tokens(void **state) {
        Fixture *f = *state;
        HistoryLeaseRow *rows = NULL;
        size_t n = 0;

        open_history(f, 0);
        close_history(f);
        insert_lease(f, "L1", "grid", "0,2", "rig-a,", 3000, false, USEC_INFINITY);
        db_exec(db_path(f), "INSERT INTO tokens (pool, next_token) VALUES ('grid', 4024)");
        open_history(f, 0);
        for (unsigned i = 0; i < 5000; i++) {
                AuditRecord r = record("granted", "grid", "merge");
                r.job = "a job label long enough to fill a few pages of the events table";
                history_append(f->h, &r, now_realtime());
        }
        assert_int_equal(query_count(f, (HistoryQuery) { .limit = 1 }) > 0, 1);
        f->h = history_free(f->h);

        /* Garbage over the end of the file, where the events' pages are; the leases and tokens tables
         * were created first and sit near its start. */
        int fd = open(db_path(f), O_WRONLY | O_CLOEXEC);
        assert_true(fd >= 0);
        off_t size = lseek(fd, 0, SEEK_END);
        assert_true(size > 64 * 1024);
        char junk[4096];
        memset(junk, 0x5a, sizeof junk);
        for (off_t o = size / 2; o + (off_t) sizeof junk <= size; o += 2 * (off_t) sizeof junk)
                assert_int_equal(pwrite(fd, junk, sizeof junk, o), sizeof junk);
        close(fd);

        /* Reading everything finds the damage: the file goes aside, its leases and marks come along. */
        open_history(f, 0);
        QueryResult r;
        HistoryQuery q = {};
        for (unsigned i = 0; i < 100; i++) {
                query_sync(f, &q, &r);
                json_decref(r.events);
                if (r.error != 0 || r.next == 0)
                        break;
                q.cursor = r.next;
        }
        assert_int_equal(r.error, -EBADMSG);
        assert_non_null(find_moved_aside(f));
        assert_true(history_is_healthy(f->h));
        /* Told that a read of the state may now succeed. */
        assert_true(run_until(f, &f->healthy, USEC_PER_SEC));
        assert_true(f->health_calls >= 1);
        assert_int_equal(token_floor(f, "grid"), 4024);
        /* What the moved file held of the tokens may be lost with it: every pool continues above the clock. */
        usec_t fresh_at = now_realtime();
        assert_true(token_floor(f, HISTORY_TOKEN_FLOOR_ALL) > fresh_at - 60 * USEC_PER_SEC);
        /* All of it was written into the fresh file, for a restart before the lease log has it. */
        f->h = history_free(f->h);
        open_history(f, 0);
        assert_int_equal(token_floor(f, "grid"), 4024);
        assert_true(token_floor(f, HISTORY_TOKEN_FLOOR_ALL) > fresh_at - 60 * USEC_PER_SEC);
        assert_int_equal(history_load_leases(f->h, &rows, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(rows[0].id, "L1");
        assert_int_equal(rows[0].token, 3000);
        assert_non_null(rows[0].members);
        assert_string_equal(rows[0].members[0], "rig-a");
        assert_null(rows[0].members[1]);
        history_lease_rows_free(rows, n);
}

/* ---- a read-only directory ---- */

static size_t count_in_file(const char *path, const char *needle) {
        char line[4096];
        size_t n = 0;
        FILE *fp = fopen(path, "re");
        if (!fp)
                return 0;
        while (fgets(line, sizeof line, fp))
                if (strstr(line, needle))
                        n++;
        fclose(fp);
        return n;
}

static void test_read_only_directory_degrades_then_recovers(void **state) {
        Fixture *f = *state;
        HistoryLeaseRow *rows = NULL;
        size_t n = 0;
        char log_path[128];

        make_older_brokerds_database(f);
        assert_int_equal(mount(f->state, f->state, "none", MS_BIND, NULL), 0);
        strcpy(f->mounted, f->state);
        assert_int_equal(mount("none", f->state, "none", MS_REMOUNT | MS_BIND | MS_RDONLY, NULL), 0);

        /* Capture stderr: the failure must be logged once, not once per attempt or per row. */
        snprintf(log_path, sizeof log_path, "%s/stderr", f->dir);
        int saved = dup(STDERR_FILENO);
        int logfd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        assert_true(saved >= 0 && logfd >= 0);
        fflush(stderr);
        dup2(logfd, STDERR_FILENO);

        open_history(f, 0);
        assert_false(history_is_healthy(f->h));
        /* What the older brokerd left is read all the same, read-only. */
        assert_int_equal(token_floor(f, "grid"), 1031);
        assert_int_equal(history_load_leases(f->h, &rows, &n), 0);
        assert_int_equal(n, 2);
        history_lease_rows_free(rows, n);
        for (unsigned i = 0; i < 100; i++) {
                AuditRecord r = record("busy", "grid", "merge");
                history_append(f->h, &r, now_realtime());
        }
        history_lease_delete(f->h, "L1"); /* kept until it can be applied */
        QueryResult q;
        query_sync(f, &(HistoryQuery) {}, &q);
        assert_int_equal(q.error, -EIO);
        assert_null(q.events);
        run_for(f, 4 * history_tuning.reopen_interval); /* several attempts */
        assert_false(history_is_healthy(f->h));

        /* Writable again: within the retry period history opens, health says so, and the rows kept
         * meanwhile are written. */
        assert_int_equal(mount("none", f->state, "none", MS_REMOUNT | MS_BIND, NULL), 0);
        usec_t t0 = now_monotonic();
        assert_true(run_until(f, &f->healthy, history_tuning.reopen_interval + 10 * USEC_PER_SEC));
        /* Within one retry period, allowing for a loaded machine under valgrind (seconds late): the
         * default interval (5 s) or a growing back-off would still show. */
        assert_true(now_monotonic() - t0 <= history_tuning.reopen_interval + 3 * USEC_PER_SEC);
        assert_int_equal(f->health_calls, 1);
        assert_true(history_is_healthy(f->h));
        assert_int_equal(query_count(f, (HistoryQuery) { .decision = "busy" }), 100);
        assert_int_equal(history_load_leases(f->h, &rows, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(rows[0].id, "L2");
        history_lease_rows_free(rows, n);

        fflush(stderr);
        dup2(saved, STDERR_FILENO);
        close(saved);
        close(logfd);
        assert_int_equal(count_in_file(log_path, "Cannot open history database"), 1);
        assert_int_equal(count_in_file(log_path, "is available again"), 1);
}

/* ---- a full disk ---- */

static int fill(const char *path) {
        static char buf[64 * 1024];
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        memset(buf, 'x', sizeof buf);
        for (size_t chunk = sizeof buf; chunk >= 512;) {
                if (write(fd, buf, chunk) < 0) {
                        assert_int_equal(errno, ENOSPC);
                        chunk /= 2;
                }
        }
        return fd;
}

static void test_full_disk_keeps_rows_until_there_is_room(void **state) {
        Fixture *f = *state;
        char filler[160];
        HistoryStats st;
        const unsigned n = 10000;

        assert_int_equal(mkdir(f->state, 0750), 0);
        assert_int_equal(mount("tmpfs", f->state, "tmpfs", 0, "size=8m,mode=0750"), 0);
        strcpy(f->mounted, f->state);
        snprintf(filler, sizeof filler, "%s/filler", f->state);

        open_history(f, 0);
        assert_true(history_is_healthy(f->h));

        close(fill(filler));
        for (unsigned i = 0; i < n; i++) {
                AuditRecord r = record("granted", "grid", "merge");
                r.job = "https://ci.example.org/project/pipelines/123456/jobs/7890";
                history_append(f->h, &r, now_realtime());
        }
        /* No room for them: the batches fail and stay queued. */
        usec_t end = now_monotonic() + 10 * USEC_PER_SEC;
        while (f->healthy && now_monotonic() < end)
                run_for(f, 50 * USEC_PER_MSEC);
        assert_false(history_is_healthy(f->h));
        history_get_stats(f->h, &st);
        assert_true(st.rows_written < n);
        assert_true(st.rows_pending > 0);
        assert_int_equal(st.rows_dropped, 0);
        assert_true(st.write_errors > 0);

        /* Rows are retried, not lost. */
        run_for(f, 300 * USEC_PER_MSEC);
        history_get_stats(f->h, &st);
        assert_true(st.rows_written < n);
        assert_int_equal(st.rows_dropped, 0);

        /* Space again: everything lands, health is back. */
        assert_int_equal(unlink(filler), 0);
        end = now_monotonic() + 10 * USEC_PER_SEC;
        for (;;) {
                history_get_stats(f->h, &st);
                if (st.rows_written == n || now_monotonic() > end)
                        break;
                run_for(f, 50 * USEC_PER_MSEC);
        }
        assert_int_equal(st.rows_written, n);
        assert_int_equal(st.rows_dropped, 0);
        assert_true(run_until(f, &f->healthy, USEC_PER_SEC));
        assert_int_equal(query_count(f, (HistoryQuery) {}), n);
}

/* The mount tests' private mount namespace, entered before any thread exists (unshare() refuses
 * CLONE_NEWNS in a threaded process): their mounts vanish with the process and never reach the machine.
 * Propagation becomes private at "/", or, in a chroot (whose "/" is no mount point: EINVAL), at the
 * /tmp that holds the tests' directories. NULL once inside, else why it cannot be entered. */
static const char *enter_private_mount_namespace(void) {
        static char why[160];

        if (unshare(CLONE_NEWNS) < 0) {
                snprintf(why, sizeof why, "no private mount namespace: unshare(CLONE_NEWNS): %s (needs CAP_SYS_ADMIN)",
                         strerror(errno));
                return why;
        }
        if (mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL) < 0 &&
            mount("none", "/tmp", "none", MS_REC | MS_PRIVATE, NULL) < 0) {
                snprintf(why, sizeof why, "cannot make \"/\" or /tmp private in the new mount namespace: %s",
                         strerror(errno));
                return why;
        }
        return NULL;
}

int main(int argc, char *argv[]) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_new_database_gets_current_schema, setup, teardown),
                cmocka_unit_test_setup_teardown(test_old_schema_is_migrated_and_keeps_its_rows, setup, teardown),
                cmocka_unit_test_setup_teardown(test_decision_filters_are_planned_without_a_sort, setup, teardown),
                cmocka_unit_test_setup_teardown(test_schema_6_is_migrated_to_slots, setup, teardown),
                cmocka_unit_test_setup_teardown(test_newer_schema_is_moved_aside, setup, teardown),
                cmocka_unit_test_setup_teardown(test_older_brokerds_ballast_is_removed, setup, teardown),
                cmocka_unit_test_setup_teardown(test_rows_are_queryable_with_every_filter, setup, teardown),
                cmocka_unit_test_setup_teardown(test_time_filters_find_rows_across_spans_and_a_stepped_clock, setup, teardown),
                cmocka_unit_test_setup_teardown(test_time_filters_read_only_their_spans, setup, teardown),
                cmocka_unit_test_setup_teardown(test_pages_follow_the_cursor, setup, teardown),
                cmocka_unit_test_setup_teardown(test_cancelled_query_is_not_called_back, setup, teardown),
                cmocka_unit_test_setup_teardown(test_free_writes_what_is_queued, setup, teardown),
                cmocka_unit_test_setup_teardown(test_200k_rows_all_land, setup, teardown),
                cmocka_unit_test_setup_teardown(test_older_brokerds_leases_marks_and_alive_mark_are_read, setup, teardown),
                cmocka_unit_test_setup_teardown(test_delete_forgets_a_carried_over_lease, setup, teardown),
                cmocka_unit_test_setup_teardown(test_lease_member_names_are_read_and_old_rows_have_none, setup, teardown),
                cmocka_unit_test_setup_teardown(test_retention_prunes_old_rows_a_span_at_a_time, setup, teardown),
                cmocka_unit_test_setup_teardown(test_retention_prunes_old_rows_among_recent_ones, setup, teardown),
                cmocka_unit_test_setup_teardown(test_retention_keeps_new_rows_under_a_stale_span, setup, teardown),
                cmocka_unit_test_setup_teardown(test_corrupt_file_is_moved_aside, setup, teardown),
                cmocka_unit_test_setup_teardown(test_foreign_database_is_moved_aside, setup, teardown),
                cmocka_unit_test_setup_teardown(test_corrupt_file_gives_up_its_leases_and_tokens, setup, teardown),
        };
        /* `--mounts`: the tests that mount (meson's test-history-mounts). They run on their own so that
         * where no mount namespace can be had the whole run is one honest TAP skip: cmocka 1.1 prints a
         * case's skip() as "not ok N # SKIP", which TAP and meson count as a failure. */
        const struct CMUnitTest mount_tests[] = {
                cmocka_unit_test_setup_teardown(test_read_only_directory_degrades_then_recovers, setup, teardown),
                cmocka_unit_test_setup_teardown(test_full_disk_keeps_rows_until_there_is_room, setup, teardown),
        };

        if (argc > 1 && strcmp(argv[1], "--mounts") == 0) {
                const char *why = enter_private_mount_namespace();
                if (why) {
                        printf("1..0 # SKIP %s\n", why);
                        return 0;
                }
                return cmocka_run_group_tests_name("mount_tests", mount_tests, NULL, NULL);
        }
        return cmocka_run_group_tests(tests, NULL, NULL);
}
