/* SPDX-License-Identifier: MIT */
/* history-internal.h — the history module's knobs, helpers and schema entry points, for its rooms
 * (history-*.c), its tests and benchmark only: the rest of the daemon includes history.h. */
#pragma once

#include "history-schema.h"
#include "history.h"

/* The timings the writer thread works with. Tests shorten them (before history_new()) so that a
 * recovery or a retention pass shows within a second instead of minutes. */
typedef struct HistoryTuning {
        usec_t flush_delay;        /* a batch of decision rows waits at most this long for more rows */
        usec_t reopen_interval;    /* a database that cannot be opened is tried again this often */
        usec_t retention_interval; /* old events are pruned this often */
        usec_t retry_min;          /* failed writes are retried after this, doubling ... */
        usec_t retry_max;          /* ... up to this */
        usec_t stop_timeout;       /* history_free() waits this long for a failing disk */
} HistoryTuning;

extern HistoryTuning history_tuning;

/* Frees n member names (any may be NULL) and the array; members may be NULL. */
void history_members_free(char **members, unsigned n);

/* Rows per decision-row transaction. */
#define HISTORY_BATCH_MAX 2000

/* The schema version this build writes: the number of migrations. */
unsigned history_schema_version(void);

/* Creates path as a database of the given (possibly older) schema version, as an older brokerd left
 * it. Returns 0, -EEXIST, -EINVAL for a version this build does not know, or an error mapped from
 * SQLite's. */
int history_schema_create(const char *path, unsigned version);
