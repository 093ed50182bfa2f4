/* SPDX-License-Identifier: MIT */
/* history-checkpoint.c — owns the WAL checkpoints: when the writer runs one. */
#include "history-checkpoint.h"

/* Checkpoints copy the WAL into history.db and fsync both: tens of milliseconds on a busy disk, which
 * SQLite's automatic checkpoint would charge to whichever commit crosses its threshold, and so to a History
 * query waiting behind that commit, or to the rows queued behind it. So the automatic checkpoint is off, and the writer checkpoints when it has nothing else to do
 * (writer_main_loop() in history-writer.c). (A thread with a connection of its own would let them run side
 * by side, but that needs the shared-memory WAL index that EXCLUSIVE locking avoids: see db_open_file() in
 * history-db.c.) */
#define CHECKPOINT_FRAMES 1000
/* Under sustained overload the writer is never idle; past this many frames (64 MiB of 4 KiB pages) it
 * checkpoints at the next commit, holding commits back until the log can start over. */
#define CHECKPOINT_FRAMES_MAX 16384
/* After this long without a commit, what the WAL holds goes into history.db: readers of the file while
 * brokerd runs (which read it as immutable, see db_open_file() in history-db.c) then see all but the last
 * moments. */
#define CHECKPOINT_QUIET USEC_PER_SEC

int history_checkpoint_wal_hook(void *userdata, sqlite3 *db, const char *name, int frames) {
        HistoryCheckpoint *cp = userdata;

        /* Due once per CHECKPOINT_FRAMES of growth, not after every commit past the threshold. */
        if (frames < cp->wal_frames || cp->checkpoint_at == 0)
                cp->checkpoint_at = CHECKPOINT_FRAMES; /* the log started over */
        cp->wal_frames = frames;
        cp->quiet_at = now_monotonic() + CHECKPOINT_QUIET;
        if (frames >= CHECKPOINT_FRAMES_MAX)
                (void) sqlite3_wal_checkpoint_v2(db, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
        else if (frames >= cp->checkpoint_at) {
                cp->checkpoint_at = frames + CHECKPOINT_FRAMES;
                cp->due = true;
        }
        return SQLITE_OK;
}

bool history_checkpoint_is_due(const HistoryCheckpoint *cp, usec_t now) {
        return cp->due || (cp->quiet_at > 0 && now >= cp->quiet_at);
}

usec_t history_checkpoint_next(const HistoryCheckpoint *cp) {
        return cp->quiet_at > 0 ? cp->quiet_at : USEC_INFINITY;
}

/* Failures (a full disk) leave the WAL to grow: the writer's commits then say so. */
void history_checkpoint_run(HistoryCheckpoint *cp, sqlite3 *db) {
        cp->due = false;
        cp->quiet_at = 0;
        (void) sqlite3_wal_checkpoint_v2(db, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
}
