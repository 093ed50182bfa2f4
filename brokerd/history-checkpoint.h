/* SPDX-License-Identifier: MIT */
/* history-checkpoint.h — when the writer copies the WAL into history.db. Private to the history module
 * (history*.c). */
#pragma once

#include <sqlite3.h>
#include <stdbool.h>

#include "time-util.h"

typedef struct HistoryCheckpoint {
        int wal_frames;      /* the WAL's length after the last commit */
        int checkpoint_at;   /* the length at which the next checkpoint is due */
        bool due;            /* run one when nothing else waits */
        usec_t quiet_at;     /* monotonic: a checkpoint after a quiet spell; 0: none pending */
} HistoryCheckpoint;

/* The writer connection's WAL hook (userdata: the HistoryCheckpoint): notes what is due. */
int history_checkpoint_wal_hook(void *userdata, sqlite3 *db, const char *name, int frames);

/* Writer: whether one is due now; else when the next one is (USEC_INFINITY: none). */
bool history_checkpoint_is_due(const HistoryCheckpoint *cp, usec_t now);
usec_t history_checkpoint_next(const HistoryCheckpoint *cp);
/* Writer: runs the checkpoint due. */
void history_checkpoint_run(HistoryCheckpoint *cp, sqlite3 *db);
