/* SPDX-License-Identifier: MIT */
/* history-checkpoint.c — owns the WAL checkpoints: when the writer runs one, and a lease commit's interrupt. */
#include <sched.h>

#include "history-checkpoint.h"

/* Checkpoints copy the WAL into history.db and fsync both: tens of milliseconds on a busy disk, which
 * SQLite's automatic checkpoint would charge to whichever commit crosses its threshold — a lease commit
 * that a grant waits for, as likely as not. So the automatic checkpoint is off, and the writer checkpoints
 * when nothing waits for it (writer_main_loop() in history-writer.c); a lease commit that arrives meanwhile
 * interrupts it. (A thread with a connection of its own would let them run side by side, but that needs the
 * shared-memory WAL index that EXCLUSIVE locking avoids: see db_open_file() in history-db.c.) */
#define CHECKPOINT_FRAMES 1000
/* Under sustained overload the writer is never idle; past this many frames (64 MiB of 4 KiB pages) it
 * checkpoints at the next commit, holding commits back until the log can start over. */
#define CHECKPOINT_FRAMES_MAX 16384
/* After this long without a commit, what the WAL holds goes into history.db: readers of the file while
 * brokerd runs (which read it as immutable, see db_open_file() in history-db.c) then see all but the last
 * moments. */
#define CHECKPOINT_QUIET USEC_PER_SEC

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
void history_checkpoint_run(HistoryCheckpoint *cp, sqlite3 *db, HistoryChannel *c) {
        int expected = CHECKPOINT_RUNNING;

        cp->due = false;
        cp->quiet_at = 0;
        cp->db = db;
        atomic_store(&cp->state, CHECKPOINT_RUNNING);
        if (!atomic_load(&c->ops)) /* a commit queued just now would not interrupt it */
                (void) sqlite3_wal_checkpoint_v2(db, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
        if (!atomic_compare_exchange_strong(&cp->state, &expected, CHECKPOINT_IDLE)) {
                while (atomic_load(&cp->state) != CHECKPOINT_INTERRUPTED)
                        sched_yield();
                atomic_store(&cp->state, CHECKPOINT_IDLE);
        }
}

/* The flag it sets is cleared by the next statement the writer starts. */
void history_checkpoint_interrupt(HistoryCheckpoint *cp) {
        int expected = CHECKPOINT_RUNNING;

        if (!atomic_compare_exchange_strong(&cp->state, &expected, CHECKPOINT_INTERRUPTING))
                return;
        sqlite3_interrupt(cp->db);
        atomic_store(&cp->state, CHECKPOINT_INTERRUPTED);
}
