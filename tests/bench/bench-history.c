/* SPDX-License-Identifier: MIT */
/* bench-history.c — SPEC §12: history takes ≥ 50,000 events/s sustained without the loop ever blocking
 * for more than 1 ms.
 *
 *     bench-history [--rate N] [--seconds S] [--dir DIR]
 *
 * An sd-event loop appends decision rows from a 1 ms timer at --rate rows/s (default 50000) for --seconds
 * (default 5), as brokerd's loop would, while timing every history_append() and every dispatch of the
 * loop (the timer's work, and history's own eventfd callbacks); a dispatch over 1 ms is classified by
 * the thread's context switches: voluntary (it waited: a lock, I/O — history's fault) or involuntary only
 * (the machine is busy: run it under `chrt -f 10` to see the loop's own latency). Then it waits for the
 * backlog to drain. (Leases are not in history any more but in the lease log: nothing here times them.)
 * A second phase finds the writer's capacity: the loop appends as fast as the backlog bound lets it.
 * Prints the figures; fails only when rows are lost or history cannot be opened. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "history-internal.h"
#include "log.h"

static uint64_t arg_rate = 50000;
static unsigned arg_seconds = 5;
static const char *arg_dir = NULL;

typedef struct Bench {
        History *h;
        uint64_t appended;
        double owed;            /* rows due but not yet appended (fractions carry over) */
        usec_t started, ends, last_tick;
        usec_t max_append;
        usec_t max_dispatch;
        usec_t max_lateness;    /* how late the 1 ms timer fired: what a stalled loop shows */
        uint64_t max_backlog;
        uint64_t slow_blocked;   /* dispatches over 1 ms during which the loop thread slept (a lock, I/O) */
        uint64_t slow_preempted; /* ... during which it only lost the CPU to other processes */
        bool saturate;          /* phase 2: as fast as the bound allows */
        bool done;
} Bench;

static void append_one(Bench *b, unsigned i) {
        static const char *const decisions[] = { "granted", "released", "busy", "timeout" };
        AuditRecord r = AUDIT_RECORD_INIT;
        r.decision = decisions[i % 4];
        r.pool = "grid";
        r.lane = i % 2 ? "merge" : "nightly";
        r.job = "https://ci.example.org/group/project/-/jobs/4815162342";
        r.lease = "0123456789abcdef0123456789abcdef";
        r.token = i;
        r.wait = i % 5000;
        r.budget = 5 * USEC_PER_MINUTE;
        r.state = "keeping-up";
        r.uid = 1000;
        r.pid = 4242;

        usec_t t0 = now_monotonic();
        history_append(b->h, &r, now_realtime());
        usec_t d = now_monotonic() - t0;
        b->max_append = MAX(b->max_append, d);
        b->appended++;
}

static int on_tick(sd_event_source *s, uint64_t usec, void *userdata) {
        Bench *b = userdata;
        usec_t now = now_monotonic();
        HistoryStats st;

        b->max_lateness = MAX(b->max_lateness, usec_sub_unsigned(now, usec));
        if (now >= b->ends) {
                b->done = true;
                return sd_event_source_set_enabled(s, SD_EVENT_OFF);
        }

        history_get_stats(b->h, &st);
        b->max_backlog = MAX(b->max_backlog, st.rows_pending);
        if (b->saturate) {
                /* Up to half the bound queued: the writer's pace, never a drop. */
                for (unsigned i = 0; i < 2000 && st.rows_pending + i < HISTORY_BACKLOG_MAX / 2; i++)
                        append_one(b, (unsigned) b->appended);
        } else {
                b->owed += (double) arg_rate * (double) (now - b->last_tick) / USEC_PER_SEC;
                for (; b->owed >= 1; b->owed -= 1)
                        append_one(b, (unsigned) b->appended);
        }
        b->last_tick = now;
        /* From now, not from when it was due: a late tick shows once, not in every later one. */
        int r = sd_event_source_set_time(s, now_monotonic() + USEC_PER_MSEC);
        if (r < 0)
                return r;
        return sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
}

static void on_query(History *h, int error, json_t *events, int64_t next_cursor, void *userdata) {
        *(bool *) userdata = true;
}

/* Runs the loop by hand, so that only the dispatch — the time the loop is busy — is timed. */
static int run_loop(sd_event *e, Bench *b, const bool *until) {
        while (!*until) {
                int r = sd_event_prepare(e);
                if (r == 0)
                        r = sd_event_wait(e, 100 * USEC_PER_MSEC);
                if (r < 0)
                        return r;
                if (r > 0) {
                        struct rusage ru0, ru1;
                        (void) getrusage(RUSAGE_THREAD, &ru0);
                        usec_t t0 = now_monotonic();
                        r = sd_event_dispatch(e);
                        if (r < 0)
                                return r;
                        usec_t d = now_monotonic() - t0;
                        b->max_dispatch = MAX(b->max_dispatch, d);
                        /* Over 1 ms: did the loop wait for something, or was it merely descheduled? */
                        if (d > USEC_PER_MSEC) {
                                (void) getrusage(RUSAGE_THREAD, &ru1);
                                if (ru1.ru_nvcsw > ru0.ru_nvcsw)
                                        b->slow_blocked++;
                                else
                                        b->slow_preempted++;
                        }
                }
        }
        return 0;
}

static int phase(sd_event *e, Bench *b, bool saturate, const char *name) {
        sd_event_source *timer = NULL;
        HistoryStats before, after;
        bool drained = false;
        int r;

        history_get_stats(b->h, &before);
        b->saturate = saturate;
        b->appended = 0;
        b->owed = 0;
        b->max_append = b->max_dispatch = b->max_lateness = 0;
        b->max_backlog = 0;
        b->slow_blocked = b->slow_preempted = 0;
        b->done = false;
        b->started = b->last_tick = now_monotonic();
        b->ends = b->started + arg_seconds * USEC_PER_SEC;

        r = sd_event_add_time(e, &timer, CLOCK_MONOTONIC, b->started + USEC_PER_MSEC, 1, on_tick, b);
        if (r < 0)
                return r;
        r = run_loop(e, b, &b->done);
        sd_event_source_disable_unref(timer);
        if (r < 0)
                return r;
        usec_t appending = now_monotonic() - b->started;

        /* A query is answered after every row queued before it is written. */
        r = history_query(b->h, &(HistoryQuery) { .limit = 1 }, on_query, &drained);
        if (r < 0)
                return r;
        r = run_loop(e, b, &drained);
        if (r < 0)
                return r;
        usec_t total = now_monotonic() - b->started;
        history_get_stats(b->h, &after);

        uint64_t written = after.rows_written - before.rows_written;
        printf("%s: appended %" PRIu64 " rows in %.2f s (%.0f rows/s); written %" PRIu64 " (%.0f rows/s, drained "
               "%.2f s after the last append), dropped %" PRIu64 "\n",
               name, b->appended, (double) appending / USEC_PER_SEC, (double) b->appended * USEC_PER_SEC / (double) appending,
               written, (double) written * USEC_PER_SEC / (double) total, (double) (total - appending) / USEC_PER_SEC,
               after.rows_dropped - before.rows_dropped);
        printf("%s: longest history_append() %" PRIu64 " µs, longest loop dispatch %" PRIu64 " µs, timer late by at "
               "most %" PRIu64 " µs, largest backlog %" PRIu64 " rows, longest commit %" PRIu64 " µs (%" PRIu64
               " commits so far)\n",
               name, b->max_append, b->max_dispatch, b->max_lateness, b->max_backlog, after.longest_commit, after.commits);
        printf("%s: dispatches over 1 ms: %" PRIu64 " while the loop slept (waiting on something), %" PRIu64
               " while it was only descheduled (other processes had the CPU)\n",
               name, b->slow_blocked, b->slow_preempted);
        if (written != b->appended || after.rows_dropped != before.rows_dropped) {
                fprintf(stderr, "bench-history: rows were lost\n");
                return -EIO;
        }
        return 0;
}

int main(int argc, char *argv[]) {
        static const struct option options[] = {
                { "rate", required_argument, NULL, 'r' },
                { "seconds", required_argument, NULL, 's' },
                { "dir", required_argument, NULL, 'd' },
                {}
        };
        char tmp[] = "/var/tmp/bench-history-XXXXXX";
        _cleanup_free_ char *cleanup = NULL;
        sd_event *e = NULL;
        Bench b = {};
        int c, r;

        while ((c = getopt_long(argc, argv, "", options, NULL)) >= 0)
                switch (c) {
                case 'r':
                        arg_rate = strtoull(optarg, NULL, 10);
                        break;
                case 's':
                        arg_seconds = (unsigned) strtoul(optarg, NULL, 10);
                        break;
                case 'd':
                        arg_dir = optarg;
                        break;
                default:
                        return EXIT_FAILURE;
                }
        if (arg_rate == 0 || arg_seconds == 0) {
                fprintf(stderr, "bench-history: --rate and --seconds must be positive\n");
                return EXIT_FAILURE;
        }
        if (!arg_dir) {
                if (!mkdtemp(tmp)) {
                        perror("mkdtemp");
                        return EXIT_FAILURE;
                }
                arg_dir = tmp;
                if (asprintf(&cleanup, "rm -rf '%s'", tmp) < 0)
                        return EXIT_FAILURE;
        }

        r = sd_event_new(&e);
        if (r >= 0)
                r = history_new(e, arg_dir, 0, &b.h);
        if (r < 0) {
                fprintf(stderr, "bench-history: %s\n", strerror(-r));
                return EXIT_FAILURE;
        }
        HistoryLeaseRow *rows = NULL;
        size_t n = 0;
        (void) history_load_leases(b.h, &rows, &n); /* waits until the database is open */
        history_lease_rows_free(rows, n);
        if (!history_is_healthy(b.h)) {
                fprintf(stderr, "bench-history: cannot open the history database in %s\n", arg_dir);
                return EXIT_FAILURE;
        }

        setvbuf(stdout, NULL, _IOLBF, 0);
        printf("history in %s; target: %" PRIu64 " rows/s for %u s, loop never blocked > 1000 µs\n", arg_dir, arg_rate,
               arg_seconds);
        r = phase(e, &b, false, "sustained");
        if (r >= 0)
                r = phase(e, &b, true, "capacity");

        history_free(b.h);
        sd_event_unref(e);
        if (cleanup && system(cleanup) != 0)
                fprintf(stderr, "bench-history: could not remove its directory\n");
        return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
