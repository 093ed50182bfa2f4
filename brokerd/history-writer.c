/* SPDX-License-Identifier: MIT */
/* history-writer.c — owns the writer thread: batches of decision rows, the deletes of carried-over lease
 * rows, queries, retention, and what a failure means (retry, reopen, move aside, degrade). */
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>

#include "fs-util.h"
#include "history-internal.h"
#include "history-writer.h"
#include "log.h"

/* Lease deletes that wait for a database (degraded, or failing): a daemon has far fewer live leases. */
#define HISTORY_DEFERRED_DELETES_MAX 100000

static struct timespec usec_to_timespec(usec_t u) {
        return (struct timespec) {
                .tv_sec = (time_t) (u / USEC_PER_SEC),
                .tv_nsec = (long) ((u % USEC_PER_SEC) * NSEC_PER_USEC),
        };
}

/* ---- opening, and what a failure means ---- */

typedef enum OpenResult {
        OPEN_OK,
        OPEN_FAILED,      /* degraded: tried again later */
} OpenResult;

static void writer_apply_deferred(HistoryWriter *w);
static OpenResult writer_open_at(HistoryWriter *w, bool afresh, const char *salvage_from);

static OpenResult writer_open(HistoryWriter *w) {
        return writer_open_at(w, false, NULL);
}

static OpenResult writer_fail(HistoryWriter *w, const char *error) {
        if (!w->degraded_logged) {
                log_error("Cannot open history database '%s' for writing (%s): decisions are kept in memory (at most %d); "
                          "retrying every %" PRIu64 "s.",
                          w->db.path, error, HISTORY_BACKLOG_MAX, history_tuning.reopen_interval / USEC_PER_SEC);
                w->degraded_logged = true;
        }
        history_db_close(&w->db);
        w->reopen_at = now_monotonic() + history_tuning.reopen_interval;
        history_channel_set_health(w->channel, false);
        return OPEN_FAILED;
}

/* Moves the database aside and starts a fresh one, carrying over from a corrupt file (not a foreign
 * one) what it still gives. */
static OpenResult writer_start_afresh(HistoryWriter *w, const char *why, bool carry_over) {
        _cleanup_free_ char *moved = NULL;
        int r;

        history_db_close(&w->db);
        r = history_db_move_aside(&w->db, &moved);
        if (r < 0) {
                log_error_errno(r, "History database '%s' is %s, and could not be moved aside: %m", w->db.path, why);
                return writer_fail(w, strerror(-r));
        }
        log_error("History database '%s' is %s: moved aside as '%s'; starting a fresh one.", w->db.path, why, moved);
        return writer_open_at(w, true, carry_over ? moved : NULL);
}

/* Opens (creating, migrating) the database; a corrupt or foreign file is moved aside, once: afresh
 * says this is the fresh file already. Logs what it did, once per episode. */
static OpenResult writer_open_at(HistoryWriter *w, bool afresh, const char *salvage_from) {
        HistoryDbKind kind = HISTORY_DB_EMPTY;
        unsigned version = 0;
        int rc, r;

        history_db_close(&w->db);
        r = mkdir_parents(w->db.path, 0750); /* the state directory and the ones above */
        if (r < 0)
                return writer_fail(w, strerror(-r));

        rc = history_db_open(&w->db, history_checkpoint_wal_hook, &w->checkpoint, &kind, &version);
        if (!afresh && rc == SQLITE_OK && kind == HISTORY_DB_FOREIGN)
                return writer_start_afresh(w, "not a brokerd history database (or one of a newer brokerd)", false);
        if (!afresh && history_sqlite_is_corrupt(rc))
                return writer_start_afresh(w, "corrupt", true);
        if (rc == SQLITE_OK && kind == HISTORY_DB_FOREIGN)
                rc = SQLITE_CANTOPEN; /* replaced under our feet right after we moved one aside */
        if (rc == SQLITE_OK)
                rc = history_db_setup(&w->db, version, afresh, salvage_from);
        if (!afresh && history_sqlite_is_corrupt(rc))
                return writer_start_afresh(w, "corrupt", true); /* corruption past the header */
        if (rc != SQLITE_OK)
                /* The handle's message is of its last statement, which is not always the one that failed. */
                return writer_fail(w, w->db.db && sqlite3_errcode(w->db.db) != SQLITE_OK ? sqlite3_errmsg(w->db.db)
                                                                                    : sqlite3_errstr(rc));

        w->failing = false;
        w->backoff = 0;
        w->rows_retry_at = 0;
        if (w->degraded_logged) {
                log_info("History database '%s' is available again.", w->db.path);
                w->degraded_logged = false;
        }
        history_channel_set_health(w->channel, true);
        writer_apply_deferred(w);
        return OPEN_OK;
}

/* What a failed statement means for the database. Returns true when the database is usable again
 * (reopened, or made afresh after corruption) and the work may be retried at once. */
static bool writer_recover(HistoryWriter *w, int rc) {
        if (history_sqlite_is_corrupt(rc)) {
                /* Health going down and up again tells the daemon that a read of the state that failed on
                 * the corrupt file may now succeed on the fresh one (what the old file gave, carried over). */
                history_channel_set_health(w->channel, false);
                return writer_start_afresh(w, "corrupt", true) == OPEN_OK;
        }
        if (history_sqlite_is_full(rc) || (rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED ||
            (rc & 0xff) == SQLITE_NOMEM)
                return false;

        /* I/O errors, a file made read-only or removed under us: a new connection finds out which. */
        if (!w->io_logged) {
                log_error("Failed to write history database '%s': %s; reopening it.", w->db.path, sqlite3_errstr(rc));
                w->io_logged = true;
        }
        return writer_open(w) == OPEN_OK;
}

static void writer_note_failure(HistoryWriter *w, int rc) {
        atomic_fetch_add(&w->channel->write_errors, 1);
        w->failing = true;
        history_channel_set_health(w->channel, false);
        if (history_sqlite_is_full(rc) && !w->full_logged) {
                log_error("History database '%s': disk full. Decision rows stay queued (at most %d) and are retried.",
                          w->db.path, HISTORY_BACKLOG_MAX);
                w->full_logged = true;
        } else if (!history_sqlite_is_full(rc) && !w->io_logged) {
                log_error("Failed to write history database '%s': %s; retrying.", w->db.path, sqlite3_errstr(rc));
                w->io_logged = true;
        }
}

/* A write went through. The episode is over only when no row waits for a retry: a small delete that
 * fitted does not mean the disk has room for a batch. */
static void writer_note_success(HistoryWriter *w) {
        if (!w->failing || w->rows)
                return;
        w->failing = false;
        if (w->full_logged || w->io_logged)
                log_info("History database '%s' is writable again.", w->db.path);
        w->full_logged = w->io_logged = false;
        history_channel_set_health(w->channel, true);
}

static void writer_backoff(HistoryWriter *w) {
        w->backoff = w->backoff == 0 ? history_tuning.retry_min : MIN(w->backoff * 2, history_tuning.retry_max);
        w->rows_retry_at = now_monotonic() + w->backoff;
}

/* ---- decision rows ---- */

static void note_commit_time(HistoryWriter *w, usec_t start) {
        usec_t d = now_monotonic() - start;
        uint_fast64_t old = atomic_load(&w->channel->longest_commit);
        while (d > old && !atomic_compare_exchange_weak(&w->channel->longest_commit, &old, d))
                ;
        atomic_fetch_add(&w->channel->commits, 1);
}

/* Writes up to HISTORY_BATCH_MAX of the writer's rows in one transaction. Returns the SQLite code. */
static int writer_write_batch(HistoryWriter *w) {
        EventRow *e = w->rows;
        size_t n = 0;
        usec_t start = now_monotonic();
        int rc;

        rc = history_db_begin(&w->db);
        while (rc == SQLITE_OK && e && n < HISTORY_BATCH_MAX) {
                const EventRow *next = e;
                size_t k = 0;
                rc = history_db_insert_events(&w->db, &next, HISTORY_BATCH_MAX - n, &k);
                e = (EventRow *) next;
                n += k;
        }
        if (rc == SQLITE_OK)
                rc = history_db_rows_done(&w->db);
        if (rc == SQLITE_OK)
                rc = history_db_commit(&w->db);
        if (rc != SQLITE_OK) {
                history_db_rollback(&w->db);
                return rc;
        }
        note_commit_time(w, start);

        /* Written: forget them. */
        EventRow *written = w->rows;
        w->rows = e;
        if (!e)
                w->rows_tail = NULL;
        w->n_rows -= n;
        history_rows_release(written, e);
        atomic_fetch_add(&w->channel->rows_written, n);
        if (atomic_fetch_sub(&w->channel->backlog, n) - n < HISTORY_BACKLOG_MAX / 2)
                atomic_store(&w->channel->dropping, false); /* the episode is over: the next drop is logged again */
        return SQLITE_OK;
}

/* Writes one batch, or notes why it could not be written; the rows stay for a retry either way. */
static void writer_rows_step(HistoryWriter *w) {
        int rc;

        rc = writer_write_batch(w);
        if (rc != SQLITE_OK && writer_recover(w, rc) && w->db.db)
                rc = writer_write_batch(w); /* a fresh or reopened database: at once, not after a backoff */
        if (rc == SQLITE_OK) {
                w->backoff = 0;
                w->rows_retry_at = 0;
                writer_note_success(w);
                return;
        }
        if (w->db.db)
                writer_note_failure(w, rc);
        writer_backoff(w);
}

/* ---- lease deletes ---- */

/* One transaction: the deferred deletes, then these. */
static int writer_delete_transaction(HistoryWriter *w, Op *ops) {
        usec_t start = now_monotonic();
        int rc;

        rc = history_db_begin(&w->db);
        for (Op *op = w->deferred; rc == SQLITE_OK && op; op = op->next)
                rc = history_db_lease_delete(&w->db, op->lease_id);
        for (Op *op = ops; rc == SQLITE_OK && op; op = op->next)
                rc = history_db_lease_delete(&w->db, op->lease_id);
        if (rc == SQLITE_OK)
                rc = history_db_commit(&w->db);
        if (rc != SQLITE_OK) {
                history_db_rollback(&w->db);
                return rc;
        }
        note_commit_time(w, start);
        history_channel_hand_back(w->channel, w->deferred); /* freed by the loop, which allocated them */
        w->deferred = w->deferred_tail = NULL;
        w->n_deferred = 0;
        return SQLITE_OK;
}

static void writer_defer_delete(HistoryWriter *w, Op *op) {
        if (w->n_deferred >= HISTORY_DEFERRED_DELETES_MAX) {
                op->next = NULL;
                history_channel_hand_back(w->channel, op);
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

static void writer_apply_deferred(HistoryWriter *w) {
        if (!w->deferred || !w->db.db)
                return;
        (void) writer_delete_transaction(w, NULL);
}

/* Deletes that cannot be applied now are kept for when the database works. */
static void writer_deletes(HistoryWriter *w, Op *ops) {
        int rc = SQLITE_CANTOPEN;

        if (w->db.db) {
                rc = writer_delete_transaction(w, ops);
                if (rc != SQLITE_OK && writer_recover(w, rc) && w->db.db)
                        rc = writer_delete_transaction(w, ops);
                if (rc == SQLITE_OK)
                        writer_note_success(w);
                else if (w->db.db)
                        writer_note_failure(w, rc);
        }
        if (rc == SQLITE_OK) {
                history_channel_hand_back(w->channel, ops);
                return;
        }
        while (ops) {
                Op *op = ops;
                ops = op->next;
                writer_defer_delete(w, op);
        }
}

/* ---- reads ---- */

/* op->result: 0, or negative errno when what was persisted cannot be read. */
static void writer_load(HistoryWriter *w, Op *op) {
        int rc = history_db_read_state(&w->db, !w->io_logged, &op->state);
        op->result = history_sqlite_to_errno(rc);
        if (rc != SQLITE_OK && w->db.db)
                (void) writer_recover(w, rc);
}

static int writer_query(HistoryWriter *w, Op *op) {
        int rc;

        if (!w->db.db)
                return -EIO;
        rc = history_db_query(&w->db, &op->query, &op->events, &op->next_cursor);
        if (rc == SQLITE_OK)
                return 0;
        (void) writer_recover(w, rc);
        return history_sqlite_to_errno(rc);
}

/* ---- retention ---- */

static void writer_retention_step(HistoryWriter *w) {
        usec_t now = now_realtime();
        int rc;

        w->retention_more = false;
        w->retention_at = now_monotonic() + history_tuning.retention_interval;
        if (!w->db.db || w->retention == 0 || w->retention == USEC_INFINITY || now <= w->retention)
                return;

        /* A span per transaction (at most HISTORY_SPAN_ROWS rows): a month of rows never goes in one, and
         * decision rows and queries get their turn between them. */
        rc = history_db_prune(&w->db, now - w->retention, &w->retention_more);
        if (rc != SQLITE_OK && !history_sqlite_is_full(rc))
                (void) writer_recover(w, rc);
}

/* ---- the thread ---- */

/* Moves what the loop appended to the writer's own list. */
static void writer_take_rows(HistoryWriter *w) {
        size_t n = 1;

        EventRow *rows = STACK_TAKE(&w->channel->rows);
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
        atomic_fetch_sub(&w->channel->n_rows, (int_fast64_t) n);
}

static void writer_flush_rows(HistoryWriter *w) {
        writer_take_rows(w);
        while (w->rows && w->db.db && w->rows_retry_at == 0)
                writer_rows_step(w);
}

static void writer_ops(HistoryWriter *w, Op *ops) {
        Op *deletes = NULL, **deletes_tail = &deletes, *queries = NULL, **queries_tail = &queries;

        while (ops) {
                Op *op = ops;
                ops = op->next;
                op->next = NULL;
                switch (op->type) {
                case OP_LOAD:
                        writer_load(w, op);
                        if (op->async) {
                                history_channel_hand_back(w->channel, op);
                                break;
                        }
                        history_channel_finish_load(w->channel, op);
                        break;
                case OP_LEASE_DELETE:
                        *deletes_tail = op;
                        deletes_tail = &op->next;
                        break;
                case OP_QUERY:
                        *queries_tail = op;
                        queries_tail = &op->next;
                        break;
                }
        }

        if (deletes)
                writer_deletes(w, deletes);

        if (queries) {
                /* A query sees every row appended before it. */
                writer_flush_rows(w);
                for (Op *op = queries; op; op = op->next)
                        op->result = writer_query(w, op);
                history_channel_hand_back(w->channel, queries);
        }
}

/* Sleeps until woken through writer_fd or until `wake` (monotonic µs; USEC_INFINITY: no timeout). */
static void writer_sleep(HistoryWriter *w, usec_t wake) {
        struct pollfd p = { .fd = w->channel->writer_fd, .events = POLLIN };
        struct timespec ts, *timeout = NULL;

        if (wake != USEC_INFINITY) {
                ts = usec_to_timespec(usec_sub_unsigned(wake, now_monotonic()));
                timeout = &ts;
        }
        /* Read here too: a wake can land between the flag's clearing and the read that goes with it. */
        if (ppoll(&p, 1, timeout, NULL) > 0) {
                eventfd_t v;
                (void) eventfd_read(w->channel->writer_fd, &v);
        }
}

static void writer_main_loop(HistoryWriter *w) {
        for (;;) {
                eventfd_t v;
                Op *ops;

                /* Cleared before looking: a push after this point wakes us again. */
                if (atomic_exchange(&w->channel->writer_woken, false))
                        (void) eventfd_read(w->channel->writer_fd, &v);

                ops = STACK_TAKE(&w->channel->ops);
                if (ops) {
                        writer_ops(w, ops);
                        continue;
                }

                usec_t now = now_monotonic(), wake = USEC_INFINITY;
                bool stopping = atomic_load(&w->channel->stopping);
                usec_t deadline = stopping ? atomic_load(&w->channel->stop_deadline) : USEC_INFINITY;

                if (!w->db.db) {
                        if (stopping)
                                break;
                        if (now >= w->reopen_at) {
                                (void) writer_open(w);
                                continue;
                        }
                        wake = w->reopen_at;
                } else {
                        if (w->rows || atomic_load(&w->channel->rows)) {
                                usec_t due;
                                if (w->rows_retry_at > 0)
                                        due = w->rows_retry_at;
                                else if (w->rows || stopping || atomic_load(&w->channel->n_rows) >= HISTORY_BATCH_MAX)
                                        due = now;
                                else
                                        due = atomic_load(&w->channel->first_row_at) + history_tuning.flush_delay;
                                if (now >= deadline)
                                        break;
                                if (now >= due) {
                                        writer_take_rows(w);
                                        writer_rows_step(w);
                                        continue;
                                }
                                wake = MIN(wake, due);
                        } else if (stopping)
                                break;

                        if (!stopping && (w->retention_more || now >= w->retention_at)) {
                                writer_retention_step(w);
                                continue;
                        }
                        if (!stopping && history_checkpoint_is_due(&w->checkpoint, now)) {
                                history_checkpoint_run(&w->checkpoint, w->db.db);
                                continue;
                        }
                        if (!stopping)
                                wake = MIN(wake, MIN(w->retention_at, history_checkpoint_next(&w->checkpoint)));
                }
                writer_sleep(w, MIN(wake, deadline));
        }
}

static void *writer_thread(void *userdata) {
        HistoryWriter *w = userdata;

        history_db_remove_ballast(&w->db);
        (void) writer_open(w);
        w->retention_at = now_monotonic(); /* a first pass soon after start */

        writer_main_loop(w);

        /* Whatever could not be written in time is lost, and counted. */
        writer_take_rows(w);
        size_t lost = w->n_rows;
        if (lost > 0) {
                atomic_fetch_add(&w->channel->rows_dropped, lost);
                log_warning("History: %zu decision rows could not be written before exiting.", lost);
        }
        history_db_close(&w->db);
        return NULL;
}

int history_writer_start(HistoryWriter *w, HistoryChannel *c, const char *directory, usec_t retention) {
        sigset_t all, old;
        int r;

        *w = (HistoryWriter) { .channel = c, .retention = retention };
        r = history_db_init(&w->db, directory);
        if (r < 0)
                return r;

        /* The thread takes no signal: the loop's signal sources rely on every thread blocking them. */
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        r = -pthread_create(&w->thread, NULL, writer_thread, w);
        w->started = r == 0;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        return r;
}

void history_writer_stop(HistoryWriter *w) {
        if (w->started) {
                atomic_store(&w->channel->stop_deadline, now_monotonic() + history_tuning.stop_timeout);
                atomic_store(&w->channel->stopping, true);
                history_channel_wake_writer(w->channel);
                pthread_join(w->thread, NULL);
                w->started = false;
        }
        history_ops_free(w->deferred);
        w->deferred = w->deferred_tail = NULL;
        history_rows_release(w->rows, NULL);
        w->rows = w->rows_tail = NULL;
        history_db_done(&w->db);
}
