/* SPDX-License-Identifier: MIT */
/* history-writer.h — the writer thread: it takes what the loop queues on the channel and writes it, in
 * batches of decision rows, deletes carried-over lease rows, answers queries, prunes old rows, and decides
 * what a failure means (retry, reopen, move aside, degrade). Private to the history module (history*.c). */
#pragma once

#include "history-channel.h"
#include "history-checkpoint.h"
#include "history-db.h"

typedef struct HistoryWriter {
        HistoryChannel *channel;
        HistoryDb db;
        HistoryCheckpoint checkpoint;
        usec_t retention;
        pthread_t thread;
        bool started;

        EventRow *rows, *rows_tail;    /* taken from the channel, not yet written */
        size_t n_rows;
        Op *deferred, *deferred_tail;  /* lease deletes waiting for a working database */
        size_t n_deferred;
        usec_t rows_retry_at;          /* 0: rows may be written now */
        usec_t backoff;
        usec_t reopen_at;
        usec_t retention_at;
        bool retention_more;           /* the last pass stopped at its chunk size */
        bool failing;                  /* a write failed and none has succeeded since */
        bool full_logged, io_logged, degraded_logged;
} HistoryWriter;

/* Starts the thread on the database in directory. Negative errno. */
int history_writer_start(HistoryWriter *w, HistoryChannel *c, const char *directory, usec_t retention);
/* Writes what it can within history_tuning.stop_timeout, then stops the thread and frees its own. */
void history_writer_stop(HistoryWriter *w);
