/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli-util.h"
#include "config.h"
#include "history-file.h"
#include "history-schema.h"
#include "report-data.h"
#include "report-html.h"
#include "report.h"
#include "report-sweep.h"

#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)

static const char *arg_history = NULL;
static const char *arg_output = NULL;
static const char *arg_pool = NULL;
static int64_t arg_since = -1, arg_until = -1;
static unsigned arg_sweep_from = 0, arg_sweep_to = 0; /* 0: no --replay-sweep */

/* Limits a curve may have: each is a whole replay of the pool's history. */
#define SWEEP_VALUES_MAX 64

static void help(void) {
        printf("slotctl report [OPTIONS…] -o FILE.html\n\n"
               "Draw the decisions of history.db as one self-contained HTML page (inline SVG, no script): per pool\n"
               "the slots in use and the requests waiting over time with the congested periods, the waits per lane\n"
               "and hour, the refusals by reason, per member its use, holds, failures and quarantines, the jobs refused\n"
               "most, the longest holds and the revocations.\n\n"
               "  -o --output=FILE     Where to write the page ('-': standard output)\n"
               "     --history=PATH    The database (default: $STATE_DIRECTORY/history.db, else\n"
               "                       /var/lib/brokerd/history.db)\n"
               "     --since=TIME      From TIME (-1h or \"1h ago\"; 2024-05-01 13:30; @EPOCH; default: the first row)\n"
               "     --until=TIME      Up to TIME, excluded (default: just after the last row)\n"
               "     --pool=NAME       Only this pool (shown even if it has no decision)\n"
               "     --replay-sweep=limit=A..B\n"
               "                       Add each pool's capacity curve: its recorded requests re-run by the\n"
               "                       simulator at every limit from A to B (slotctl simulate --replay)\n"
               "  -h --help            Show this help\n");
}

static int parse_argv(int argc, char *argv[]) {
        enum { ARG_HISTORY = 0x100, ARG_SINCE, ARG_UNTIL, ARG_POOL, ARG_REPLAY_SWEEP };
        static const struct option options[] = {
                { "help", no_argument, NULL, 'h' },
                { "output", required_argument, NULL, 'o' },
                { "history", required_argument, NULL, ARG_HISTORY },
                { "since", required_argument, NULL, ARG_SINCE },
                { "until", required_argument, NULL, ARG_UNTIL },
                { "pool", required_argument, NULL, ARG_POOL },
                { "replay-sweep", required_argument, NULL, ARG_REPLAY_SWEEP },
                {}
        };
        int c;

        opterr = 0;
        optind = 0;
        while ((c = getopt_long(argc, argv, ":ho:", options, NULL)) >= 0)
                switch (c) {
                case 'h':
                        help();
                        return 0;
                case 'o':
                        arg_output = optarg;
                        break;
                case ARG_HISTORY:
                        arg_history = optarg;
                        break;
                case ARG_SINCE:
                case ARG_UNTIL:
                        if (cli_parse_time(c == ARG_SINCE ? "--since" : "--until", optarg,
                                           c == ARG_SINCE ? &arg_since : &arg_until) < 0)
                                return -EINVAL;
                        break;
                case ARG_POOL:
                        arg_pool = optarg;
                        break;
                case ARG_REPLAY_SWEEP: {
                        unsigned from, to;
                        int n = -1;
                        if (sscanf(optarg, "limit=%u..%u%n", &from, &to, &n) != 2 || n < 0 || optarg[n] != '\0' ||
                            from < 1 || from > to || to - from >= SWEEP_VALUES_MAX)
                                return log_usage("report", "--replay-sweep: expected limit=A..B with 1 ≤ A ≤ B, at most %d values, "
                                                           "got \"%s\"",
                                                 SWEEP_VALUES_MAX, optarg);
                        arg_sweep_from = from;
                        arg_sweep_to = to;
                        break;
                }
                default:
                        return log_usage_option("report", c, argv);
                }
        if (optind < argc)
                return log_usage("report", "unexpected argument \"%s\"", argv[optind]);
        if (!arg_output)
                return log_usage("report", "-o FILE.html is needed ('-' for standard output)");
        if (arg_since >= 0 && arg_until >= 0 && arg_since >= arg_until)
                return log_usage("report", "--since must be before --until");
        if (arg_until == 0)
                return log_usage("report", "--until: the history has nothing before 1970-01-01 00:00:00 UTC");
        return 1;
}

/* ---- reading ---- */

/* One prepared statement and its current row. */
typedef struct Cursor {
        sqlite3_stmt *st;
        bool has_row;
        usec_t time;
} Cursor;

static int cursor_step(sqlite3 *db, Cursor *c) {
        for (;;) {
                int rc = sqlite_api.step(c->st);
                if (rc == SQLITE_DONE) {
                        c->has_row = false;
                        return 0;
                }
                if (rc != SQLITE_ROW) {
                        log_error("Failed to read history: %s", sqlite_api.errmsg(db));
                        return -EIO;
                }
                int64_t t = sqlite_api.column_int64(c->st, 0);
                if (t < 0 || sqlite_api.column_type(c->st, 1) == SQLITE_NULL)
                        continue; /* not from brokerd: every decision has a time and a pool */
                c->time = (usec_t) t;
                c->has_row = true;
                return 0;
        }
}

static const char *column_text(sqlite3_stmt *st, int i) {
        return (const char *) sqlite_api.column_text(st, i);
}

static uint64_t column_u64(sqlite3_stmt *st, int i) {
        int64_t v = sqlite_api.column_int64(st, i);
        return v > 0 ? (uint64_t) v : 0;
}

static int prepare_bound(sqlite3 *db, const char *where, const char *tail, const Report *r, sqlite3_stmt **ret) {
        _cleanup_free_ char *sql = NULL;
        sqlite3_stmt *st = NULL;
        if (asprintf(&sql, "%s%s%s", where, arg_pool ? " AND pool = ?3" : "", tail) < 0)
                return log_error_errno(-ENOMEM, "Failed to read history: %m");
        if (sqlite_api.prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
                log_error("Failed to read history: %s", sqlite_api.errmsg(db));
                return -EIO;
        }
        sqlite_api.bind_int64(st, 1, (int64_t) r->since);
        sqlite_api.bind_int64(st, 2, (int64_t) r->until);
        if (arg_pool)
                sqlite_api.bind_text(st, 3, arg_pool, -1, SQLITE_STATIC);
        *ret = st;
        return 0;
}

static ReportEventKind event_kind(const char *decision) {
        static const struct {
                const char *decision;
                ReportEventKind kind;
        } table[] = {
                { "granted", REPORT_GRANTED },     { "busy", REPORT_REFUSED },      { "full", REPORT_REFUSED },
                { "timeout", REPORT_REFUSED },     { "shed", REPORT_REFUSED },      { "unavailable", REPORT_REFUSED },
                { "cancelled", REPORT_CANCELLED }, { "released", REPORT_RELEASED }, { "revoked", REPORT_REVOKED },
        };
        for (size_t i = 0; decision && i < ELEMENTSOF(table); i++)
                if (streq(table[i].decision, decision))
                        return table[i].kind;
        return _REPORT_EVENT_INVALID; /* restored, overdue, denied: no change of what is held or waiting */
}

/* The first and last times that sql (two columns) gives: 1, 0 when it gives none, or -EIO. */
static int range_query(sqlite3 *db, const char *sql, int64_t *ret_first, int64_t *ret_last) {
        sqlite3_stmt *st = NULL;
        int k = 0;

        if (sqlite_api.prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        if (sqlite_api.step(st) == SQLITE_ROW && sqlite_api.column_type(st, 0) != SQLITE_NULL) {
                *ret_first = sqlite_api.column_int64(st, 0);
                *ret_last = sqlite_api.column_int64(st, 1);
                k = 1;
        }
        sqlite_api.finalize(st);
        return k;
}

/* The range when --since or --until is not given: the history's first and last rows. Since schema 10 events has
 * no time index, and its spans hold every row's time (brokerd/history-db.c): one row a span read, not the table
 * (3.5 s over 10 million rows). Without spans, or with a time before 1970 in them (written by hand: the range
 * counts rows from 1970 on), the rows themselves. */
static int find_range(sqlite3 *db, usec_t *ret_since, usec_t *ret_until) {
        int64_t first = -1, last = -1;

        int k = range_query(db, "SELECT min(min_time), max(max_time) FROM event_spans", &first, &last);
        if (k <= 0 || first < 0) {
                first = last = -1;
                if (range_query(db, "SELECT min(time), max(time) FROM events WHERE time >= 0", &first, &last) < 0) {
                        log_error("Failed to read history: %s", sqlite_api.errmsg(db));
                        return -EIO;
                }
        }

        usec_t until = arg_until >= 0 ? (usec_t) arg_until : last >= 0 ? (usec_t) last + 1 : now_realtime();
        usec_t since = arg_since >= 0 ? (usec_t) arg_since : first >= 0 ? (usec_t) first : usec_sub_unsigned(until, USEC_PER_DAY);
        if (since >= until) {
                /* Only one bound given, and no row on its side: a day's range, to say that nothing happened. */
                if (arg_since >= 0)
                        until = usec_add(since, USEC_PER_DAY);
                else
                        since = usec_sub_unsigned(until, USEC_PER_DAY);
        }
        *ret_since = since;
        *ret_until = until;
        return 0;
}

/* Every decision before until, in time order, merged with the arrivals of the requests that waited (their
 * row's time − wait, sorted by SQLite, which spills to temporary files rather than memory): the state of
 * each pool at every instant without holding the rows. Rows before the range move the state only. */
static int read_events(sqlite3 *db, Report *r) {
        Cursor rows = {}, arrivals = {};
        int k = 0;

        _cleanup_free_ char *a = NULL, *b = NULL;
        const char *pool = arg_pool ? " AND pool = ?2" : "";
        if (asprintf(&a, "SELECT time, pool, decision, lane, wait_us, state FROM events WHERE time < ?1%s ORDER BY time, id",
                     pool) < 0 ||
            asprintf(&b, "SELECT max(time - wait_us, 0) AS arrival, pool, state FROM events WHERE wait_us > 0 AND decision IN "
                         REPORT_WAIT_END_DECISIONS " AND time - wait_us < ?1%s ORDER BY arrival, id",
                     pool) < 0)
                return log_error_errno(-ENOMEM, "Failed to read history: %m");
        if (sqlite_api.prepare_v2(db, a, -1, &rows.st, NULL) != SQLITE_OK ||
            sqlite_api.prepare_v2(db, b, -1, &arrivals.st, NULL) != SQLITE_OK) {
                log_error("Failed to read history: %s", sqlite_api.errmsg(db));
                k = -EIO;
                goto finish;
        }
        for (Cursor *c = &rows; c; c = c == &rows ? &arrivals : NULL) {
                sqlite_api.bind_int64(c->st, 1, (int64_t) r->until);
                if (arg_pool)
                        sqlite_api.bind_text(c->st, 2, arg_pool, -1, SQLITE_STATIC);
        }

        k = cursor_step(db, &rows);
        if (k >= 0)
                k = cursor_step(db, &arrivals);
        while (k >= 0 && (rows.has_row || arrivals.has_row)) {
                ReportEvent e;
                Cursor *c;
                /* At one instant, ends before arrivals: a slot freed, then asked for again. */
                if (rows.has_row && (!arrivals.has_row || rows.time <= arrivals.time)) {
                        c = &rows;
                        e = (ReportEvent) {
                                .kind = event_kind(column_text(c->st, 2)),
                                .time = c->time,
                                .pool = column_text(c->st, 1),
                                .lane = column_text(c->st, 3),
                                .wait = column_u64(c->st, 4),
                                .reason = report_reason_from_string(column_text(c->st, 2)),
                        };
                        const char *state = column_text(c->st, 5);
                        e.saturated = state && streq(state, "saturated");
                } else {
                        c = &arrivals;
                        const char *state = column_text(c->st, 2);
                        e = (ReportEvent) {
                                .kind = REPORT_ARRIVED,
                                .time = c->time,
                                .pool = column_text(c->st, 1),
                                .saturated = state && streq(state, "saturated"),
                        };
                }
                if (e.kind >= 0) {
                        k = report_add(r, &e);
                        if (k < 0) {
                                log_error_errno(k, "Failed to add a decision of pool %s at %" PRIu64 ": %m", e.pool, e.time);
                                break;
                        }
                }
                k = cursor_step(db, c);
        }
finish:
        sqlite_api.finalize(rows.st);
        sqlite_api.finalize(arrivals.st);
        return k;
}

static int read_holds(sqlite3 *db, Report *r) {
        sqlite3_stmt *st = NULL;
        int k = prepare_bound(db,
                              "SELECT time, pool, lane, job, lease, hold_us FROM events "
                              "WHERE decision = 'released' AND hold_us IS NOT NULL AND time >= ?1 AND time < ?2",
                              " ORDER BY hold_us DESC, id LIMIT " STRINGIFY(REPORT_TABLE_ROWS), r, &st);
        while (k >= 0 && sqlite_api.step(st) == SQLITE_ROW)
                k = report_table_add(r->holds, &r->n_holds,
                                     &(ReportRow) {
                                             .time = column_u64(st, 0),
                                             .pool = (char *) column_text(st, 1),
                                             .lane = (char *) column_text(st, 2),
                                             .job = (char *) column_text(st, 3),
                                             .lease = (char *) column_text(st, 4),
                                             .duration = column_u64(st, 5),
                                     });
        sqlite_api.finalize(st);
        return k;
}

/* The revocations' rows of the report's window (with the decision index's condition: history-schema.h). */
#define REVOCATION_ROWS "WHERE decision IN ('revoked', 'overdue') AND " HISTORY_UNUSUAL_DECISION " AND time >= ?1 AND time < ?2"

static int read_revocations(sqlite3 *db, Report *r, bool has_reason) {
        sqlite3_stmt *st = NULL;
        int k = prepare_bound(db, "SELECT count(*) FROM events " REVOCATION_ROWS, "", r, &st);
        if (k >= 0 && sqlite_api.step(st) == SQLITE_ROW)
                r->revocations_total = (uint64_t) sqlite_api.column_int64(st, 0);
        sqlite_api.finalize(st);
        st = NULL;
        if (k < 0)
                return k;

        k = prepare_bound(db,
                          has_reason ? "SELECT time, pool, lane, job, lease, hold_us, decision, reason FROM events " REVOCATION_ROWS :
                                       "SELECT time, pool, lane, job, lease, hold_us, decision, NULL FROM events " REVOCATION_ROWS,
                          " ORDER BY time, id LIMIT " STRINGIFY(REPORT_TABLE_ROWS), r, &st);
        while (k >= 0 && sqlite_api.step(st) == SQLITE_ROW) {
                _cleanup_free_ char *what = NULL;
                const char *reason = column_text(st, 7);
                if (asprintf(&what, "%s%s%s", column_text(st, 6), reason ? ": " : "", reason ?: "") < 0)
                        return log_error_errno(-ENOMEM, "Failed to read history: %m");
                k = report_table_add(r->revocations, &r->n_revocations,
                                     &(ReportRow) {
                                             .time = column_u64(st, 0),
                                             .pool = (char *) column_text(st, 1),
                                             .lane = (char *) column_text(st, 2),
                                             .job = (char *) column_text(st, 3),
                                             .lease = (char *) column_text(st, 4),
                                             .duration = sqlite_api.column_type(st, 5) == SQLITE_NULL ? USEC_INFINITY :
                                                                                                        column_u64(st, 5),
                                             .what = what,
                                     });
        }
        sqlite_api.finalize(st);
        return k;
}

/* The jobs refused most: grouped by SQLite (which spills to temporary files), as job labels are as many as
 * jobs. */
static int read_jobs(sqlite3 *db, Report *r) {
        sqlite3_stmt *st = NULL;
        int k = prepare_bound(db,
                              "SELECT job, count(*), sum(decision = 'busy'), sum(decision = 'full'), sum(decision = 'timeout'), "
                              "sum(decision = 'shed'), sum(decision = 'unavailable') FROM events "
                              "WHERE decision IN ('busy', 'full', 'timeout', 'shed', 'unavailable') AND " HISTORY_UNUSUAL_DECISION
                              " AND time >= ?1 AND time < ?2",
                              " GROUP BY job ORDER BY 2 DESC, job LIMIT " STRINGIFY(REPORT_TABLE_ROWS), r, &st);
        while (k >= 0 && sqlite_api.step(st) == SQLITE_ROW) {
                ReportRow row = {
                        .job = (char *) (column_text(st, 0) ?: "(no --job label)"),
                        .count = column_u64(st, 1),
                        .duration = USEC_INFINITY,
                };
                for (ReportReason i = 0; i < _REPORT_REASON_MAX; i++)
                        row.refused[i] = column_u64(st, 2 + i);
                k = report_table_add(r->jobs, &r->n_jobs, &row);
        }
        sqlite_api.finalize(st);
        return k;
}

/* Waits and refusals per label set (events.selector, schema 5), grouped by SQLite: label sets are as many
 * as the combinations clients ask for. */
static int read_selectors(sqlite3 *db, Report *r) {
        sqlite3_stmt *st = NULL;
        int k = prepare_bound(db,
                              "SELECT pool, selector, count(*), sum(decision = 'granted'), "
                              "sum(decision = 'granted' AND wait_us > 0), max(CASE WHEN decision = 'granted' THEN wait_us END), "
                              "sum(decision = 'busy'), sum(decision = 'full'), sum(decision = 'timeout'), "
                              "sum(decision = 'shed'), sum(decision = 'unavailable') FROM events "
                              "WHERE decision IN ('granted', 'busy', 'full', 'timeout', 'shed', 'unavailable') "
                              "AND pool IS NOT NULL AND time >= ?1 AND time < ?2",
                              " GROUP BY pool, selector ORDER BY pool, 3 DESC, selector", r, &st);
        while (k >= 0 && sqlite_api.step(st) == SQLITE_ROW) {
                ReportPool *p = report_pool(r, column_text(st, 0));
                if (!p) {
                        k = log_error_errno(-ENOMEM, "Failed to read history: %m");
                        break;
                }
                ReportSelector row = {
                        .selector = (char *) column_text(st, 1),
                        .requests = column_u64(st, 2),
                        .granted = column_u64(st, 3),
                        .waited = column_u64(st, 4),
                        .longest_wait = column_u64(st, 5),
                };
                for (ReportReason i = 0; i < _REPORT_REASON_MAX; i++)
                        row.refused[i] = column_u64(st, 6 + i);
                if (report_pool_add_selector(p, &row) < 0)
                        k = log_error_errno(-ENOMEM, "Failed to read history: %m");
        }
        sqlite_api.finalize(st);
        return k;
}

/* Usage per member (events.member, schema 6): grants, releases with their holds, quarantines. */
static int read_members(sqlite3 *db, Report *r) {
        sqlite3_stmt *st = NULL;
        int k = prepare_bound(db,
                              "SELECT time, pool, member, decision, hold_us, exit_status FROM events "
                              "WHERE decision IN ('granted', 'released', 'quarantined') AND member IS NOT NULL "
                              "AND pool IS NOT NULL AND time >= ?1 AND time < ?2",
                              " ORDER BY time, id", r, &st);
        while (k >= 0 && sqlite_api.step(st) == SQLITE_ROW) {
                const char *decision = column_text(st, 3) ?: "";
                ReportMemberKind kind = streq(decision, "granted")  ? REPORT_MEMBER_GRANTED :
                                        streq(decision, "released") ? REPORT_MEMBER_RELEASED :
                                                                      REPORT_MEMBER_QUARANTINED;
                int64_t status = sqlite_api.column_type(st, 5) == SQLITE_NULL ? -1 : sqlite_api.column_int64(st, 5);
                k = report_member_add(r, column_text(st, 1), column_text(st, 2), kind, column_u64(st, 0),
                                      column_u64(st, 4), status >= 0 && status <= 255 ? (int) status : -1);
                if (k == -ENOMEM)
                        k = log_error_errno(k, "Failed to read history: %m");
                else
                        k = 0; /* a row not from brokerd: skipped */
        }
        sqlite_api.finalize(st);
        return k;
}

static bool has_member_column(sqlite3 *db) {
        sqlite3_stmt *st = NULL;
        bool has = sqlite_api.prepare_v2(db, "SELECT member, exit_status FROM events LIMIT 0", -1, &st, NULL) == SQLITE_OK;
        sqlite_api.finalize(st);
        return has;
}

static bool has_selector_column(sqlite3 *db) {
        sqlite3_stmt *st = NULL;
        bool has = sqlite_api.prepare_v2(db, "SELECT selector FROM events LIMIT 0", -1, &st, NULL) == SQLITE_OK;
        sqlite_api.finalize(st);
        return has;
}

static bool has_reason_column(sqlite3 *db) {
        sqlite3_stmt *st = NULL;
        bool has = sqlite_api.prepare_v2(db, "SELECT reason FROM events LIMIT 0", -1, &st, NULL) == SQLITE_OK;
        sqlite_api.finalize(st);
        return has;
}

/* ---- writing ---- */

/* The page into fd, which is closed. */
static int write_fd(const Report *r, const ReportHtmlOptions *o, int fd) {
        if (fd < 0)
                return -errno; /* the caller's open() */
        FILE *f = fdopen(fd, "w");
        if (!f) {
                int e = -errno;
                close(fd);
                return e;
        }
        int k = report_html_write(r, o, f);
        if (fclose(f) != 0 && k >= 0)
                k = -errno;
        return k;
}

/* path names what standard output is (/dev/stdout, /proc/self/fd/1: a file the shell opened, perhaps to append). */
static bool is_stdout(const char *path) {
        struct stat a, b;
        return stat(path, &a) >= 0 && fstat(STDOUT_FILENO, &b) >= 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

int report_write_file(const Report *r, const ReportHtmlOptions *o, const char *path) {
        if (streq(path, "-") || is_stdout(path)) {
                if (report_html_write(r, o, stdout) < 0)
                        return log_error_errno(-EIO, "Failed to write the report to standard output: %m");
                return 0;
        }
        /* What is not a regular file (a FIFO, /dev/null) is written into: renaming over it would
         * put a file in its place (as root, in /dev). A symlink is followed, and the file it names replaced. */
        _cleanup_free_ char *resolved = NULL;
        struct stat st;
        /* The page holds other users' job labels: a new file as the umask says, a replaced one keeps its mode. */
        mode_t mask = umask(0);
        umask(mask);
        mode_t mode = 0666 & ~mask;
        if (stat(path, &st) < 0) {
                if (errno != ENOENT)
                        return log_error_errno(-errno, "Failed to write '%s': %m", path);
                if (lstat(path, &st) >= 0) {
                        /* a link to a file yet to be: made where the link says */
                        int k = write_fd(r, o, open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOCTTY, 0666));
                        return k < 0 ? log_error_errno(k, "Failed to write '%s': %m", path) : 0;
                }
        } else if (!S_ISREG(st.st_mode)) {
                int k = write_fd(r, o, open(path, O_WRONLY | O_CLOEXEC | O_NOCTTY));
                return k < 0 ? log_error_errno(k, "Failed to write '%s': %m", path) : 0;
        } else {
                resolved = realpath(path, NULL);
                if (!resolved)
                        return log_error_errno(-errno, "Failed to write '%s': %m", path);
                mode = st.st_mode & 0777; /* its permissions, not a set-id bit on a page */
        }
        const char *target = resolved ?: path;

        /* The page appears whole or not at all: written beside its name, then renamed over it. */
        _cleanup_free_ char *tmp = NULL;
        if (asprintf(&tmp, "%s.XXXXXX", target) < 0)
                return log_error_errno(-ENOMEM, "Failed to write '%s': %m", path);
        int fd = mkostemp(tmp, O_CLOEXEC);
        if (fd < 0)
                return log_error_errno(-errno, "Failed to write '%s': %m", path);
        (void) fchmod(fd, mode); /* mkostemp() made it 0600 */
        int k = write_fd(r, o, fd);
        if (k >= 0 && rename(tmp, target) < 0)
                k = -errno;
        if (k < 0) {
                unlink(tmp);
                return log_error_errno(k, "Failed to write '%s': %m", path);
        }
        return 0;
}

/* The local zone's offset from UTC at t, in µs: the report's hours and days are local. */
static int64_t local_offset(usec_t t) {
        time_t s = (time_t) (t / USEC_PER_SEC);
        struct tm tm;
        return localtime_r(&s, &tm) ? (int64_t) tm.tm_gmtoff * (int64_t) USEC_PER_SEC : 0;
}

static char *default_history(void) {
        const char *e = getenv("STATE_DIRECTORY");
        char *p = NULL;
        if (e && *e)
                return asprintf(&p, "%.*s/history.db", (int) strcspn(e, ":"), e) < 0 ? NULL : p;
        return strdup("/var/lib/brokerd/history.db");
}

int verb_report(int argc, char *argv[]) {
        _cleanup_free_ char *error = NULL, *path = NULL;
        _cleanup_(report_freep) Report *r = NULL;
        sqlite3 *db = NULL;
        usec_t since, until;
        int k;

        k = parse_argv(argc, argv);
        if (k <= 0)
                return k < 0 ? EXIT_USAGE : EXIT_SUCCESS;
        path = arg_history ? strdup(arg_history) : default_history();
        if (!path)
                return log_error_errno(-ENOMEM, "Failed to read history: %m"), EXIT_FAILURE;

        k = history_file_open(path, "report", &error, &db);
        if (k == -EINVAL) {
                log_error("%s", error);
                return EXIT_USAGE;
        }
        if (k < 0) {
                log_error_errno(k, "Failed to read '%s': %m", path);
                return EXIT_FAILURE;
        }
        /* Sorting and grouping spill to temporary files, not to memory: the rows are as many as decisions. */
        (void) sqlite_api.exec(db, "PRAGMA temp_store = FILE", NULL, NULL, NULL);

        k = find_range(db, &since, &until);
        if (k >= 0) {
                k = report_new(since, until, local_offset(since), &r);
                if (k < 0)
                        log_error_errno(k, "Failed to make the report: %m");
        }
        if (k >= 0 && arg_pool && !report_pool(r, arg_pool))
                k = log_error_errno(-ENOMEM, "Failed to make the report: %m");
        if (k >= 0)
                k = read_events(db, r);
        if (k >= 0)
                k = read_holds(db, r);
        if (k >= 0)
                k = read_revocations(db, r, has_reason_column(db));
        if (k >= 0)
                k = read_jobs(db, r);
        if (k >= 0 && has_selector_column(db))
                k = read_selectors(db, r);
        if (k >= 0 && has_member_column(db))
                k = read_members(db, r);
        sqlite_api.close_v2(db);
        if (k < 0)
                return EXIT_FAILURE;
        report_finish(r);
        for (size_t i = 0; arg_sweep_from > 0 && i < r->n_pools; i++) {
                k = report_sweep_pool(path, &r->pools[i], arg_sweep_from, arg_sweep_to);
                if (k < 0)
                        return log_error_errno(k, "Failed to replay pool %s: %m", r->pools[i].name), EXIT_FAILURE;
        }

        k = report_write_file(r, &(ReportHtmlOptions) { .source = path, .generator = "slotctl " PACKAGE_VERSION },
                              arg_output);
        return k < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
