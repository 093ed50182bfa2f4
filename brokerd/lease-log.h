/* SPDX-License-Identifier: MIT */
/* lease-log.h — the state directory's lease log (leases.log): the leases granted and not yet ended, each
 * pool's fencing-token high-water mark and the last instant brokerd was known to run (SPEC §3.4).
 *
 * The event loop appends to it itself: a grant waits for one write() into the page cache — which survives
 * a crash of brokerd as a WAL commit without fsync does — instead of a hand-off to the history thread and
 * a SQLite transaction (0.35 ms of a `slotctl run`). All lines written in one loop iteration go in one
 * write() (group commit). The file is text, one record per line, each line its CRC-32 (8 hex digits, as
 * zlib's crc32()) and a JSON object:
 *
 *   {"slotbroker":"leases","version":1}         the first line
 *   {"lease":{…}}                                a lease granted (or restored), as HistoryLeaseRow; "remote"
 *                                                (a shared pool's id of it) only when it has one, and then
 *                                                "backend" ({"url","user","passwordFile",
 *                                                "sentinelPasswordFile","nodeTtl"}): where it was granted;
 *                                                "also" ([{"pool","token","slots","members"}]) for an
 *                                                all-or-nothing lease's further pools (SPEC §3.5), restored
 *                                                with it or not at all; "health":true for a health job's
 *                                                lease (engine_lease_is_health(): a health = also lane's
 *                                                can be either), absent otherwise; "quarantine"
 *                                                ({"exitCodes":[N…],"after":N}) its pool's rules (SPEC
 *                                                §3.6), when it has quarantine-exit-codes=: a restart whose
 *                                                configuration lacks the pool judges the exit by them
 *   {"end":"ID"}                                 a lease ended
 *   {"token":{"pool":"P","next":N}}              a pool's next unused token ("*": every pool)
 *   {"alive":µs}                                 brokerd ran at this realtime instant (written while it holds
 *                                                a lease; a lease line's grantedAt is read as one too)
 *   {"rest":{"pool":"P","slot":N,"member":"M",  a released slot rests until this realtime instant (cooldown=,
 *            "until":µs}}                        SPEC §3.6); "member" only in a member pool, which names the
 *                                                slot by it; a later line of the same slot replaces it
 *   {"use":{"pool":"P","member":"M","grants":N,  a member's counts (SPEC §3.6, usage per member): leases granted
 *           "heldUs":N,"quarantines":N,          it, µs held by those that ended, times quarantined, leases in
 *           "failures":N}}                       a row that ended with a quarantine exit status; written when
 *                                                they change, a later line of the member replacing it; kept
 *                                                for every member ever written (a reload may bring it back)
 *   {"reset":true}                               what came before is replaced by the lines after it
 *
 * A lease line also raises its pool's token mark. The log is rewritten (a snapshot of the live leases into
 * a new file, renamed over it) when it has grown past a few times what is live, and appended to with a
 * "reset" snapshot when it could not be written for a while (it then misses lines: ends, or grants that
 * were refused). 1 MiB past its end is reserved with fallocate(), so that a disk filled by something else
 * still takes lease lines. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "history.h"
#include "time-util.h"

#define LEASE_LOG_FILE "leases.log"
/* How much of the damaged lines a read keeps, for state.damaged (state-damage.h). */
#define LEASE_LOG_DAMAGE_KEEP (64u * 1024u)

typedef struct LeaseLog LeaseLog;

/* A slot resting after its release (cooldown=): a member pool's by its member, else by its index. */
typedef struct LeaseLogRest {
        char *pool;
        unsigned slot;
        char *member;           /* NULL: an anonymous slot */
        usec_t until;           /* realtime µs */
} LeaseLogRest;

/* A member's counts (the "use" record): its metrics and its failures in a row survive a restart. */
typedef struct LeaseLogUse {
        char *pool;
        char *member;
        uint64_t grants;
        usec_t held;            /* µs */
        uint64_t quarantines;
        unsigned failures;
} LeaseLogUse;

/* What a read of the log found, beside its leases, token marks and alive mark (a HistoryState). */
typedef struct LeaseLogRead {
        bool exists;            /* false: there was no leases.log (a new state directory, or an older brokerd's) */
        unsigned damaged;       /* lines skipped because they did not check out, since the last "reset" line (a
                                 * torn last line is not counted) */
        char *damage;           /* those lines as read, each with its newline, up to LEASE_LOG_DAMAGE_KEEP; owned */
        size_t damage_size;
        LeaseLogRest *rests;    /* the rests last recorded, whether or not they have ended since; owned */
        size_t n_rests;
        LeaseLogUse *uses;      /* every member's last counts; owned */
        size_t n_uses;
} LeaseLogRead;
void lease_log_read_done(LeaseLogRead *info);

/* Reads directory/leases.log. No file: 0 with an empty state and ret_info->exists false. Returns 0, or
 * -EBADMSG when the file is not a lease log (its first line is not the header: then nothing in it can be
 * trusted, and it must be moved aside), -ENOMEM, or the error of opening or reading it (-EACCES, -EIO…).
 * Damaged lines are skipped and counted: a caller that finds any cannot know what they said, and must
 * move every pool's token mark above anything they could have held, and record them (state_damage_record())
 * before the log is rewritten without them. */
int lease_log_read(const char *directory, HistoryState *ret_state, LeaseLogRead *ret_info);

/* Renames directory/leases.log to leases.log.corrupt-<UTC time>. Returns 0, or negative errno. */
int lease_log_move_aside(const char *directory, char **ret_moved);

/* The log of directory/leases.log, knowing these token marks (marks' floors, and its leases' tokens;
 * floor_all > 0: a mark for every pool). No I/O: it is broken (takes no lines) until lease_log_rewrite()
 * has written a snapshot. Returns 0 or -ENOMEM. */
int lease_log_new(const char *directory, const HistoryState *marks, uint64_t floor_all, LeaseLog **ret);
LeaseLog *lease_log_free(LeaseLog *log);
DEFINE_TRIVIAL_CLEANUP_FUNC(LeaseLog *, lease_log_free);

/* Buffered until lease_log_flush(). add raises the pool's token mark. Return 0 or -ENOMEM. */
int lease_log_add(LeaseLog *log, const HistoryLeaseRow *row);
int lease_log_end(LeaseLog *log, const char *id);
int lease_log_alive(LeaseLog *log, usec_t realtime);
/* A released slot rests until `until` (realtime µs). Kept by the log for its snapshots until it ends. */
int lease_log_rest(LeaseLog *log, const char *pool, unsigned slot, const char *member, usec_t until);
/* A member's counts now (pool and member borrowed). Kept by the log for its snapshots. Returns 0 or -ENOMEM. */
int lease_log_use(LeaseLog *log, const LeaseLogUse *u);
/* Takes the counts a read found (one per member, as lease_log_read() gives them; owned, freed on failure) as
 * those the log knows, without a line each: at start. Returns 0 or -ENOMEM. */
int lease_log_adopt_uses(LeaseLog *log, LeaseLogUse *uses, size_t n);
/* The last counts the log knows of every member it was told of (for a reload that brings one back). */
const LeaseLogUse *lease_log_uses(const LeaseLog *log, size_t *ret_n);
/* The rests the log knows that end after `now` (realtime µs) but that still_resting() denies (a reload
 * removed cooldown=, or the member) end at `now`: a line each, so that a restart does not bring them back.
 * Returns 0 or -ENOMEM. */
typedef bool (*LeaseLogRestFn)(const char *pool, unsigned slot, const char *member, void *userdata);
int lease_log_rests_end(LeaseLog *log, LeaseLogRestFn still_resting, void *userdata, usec_t now);
/* How often the loop writes an alive mark (besides every snapshot). */
#define LEASE_LOG_ALIVE_INTERVAL (10 * USEC_PER_SEC)
bool lease_log_has_pending(const LeaseLog *log);

/* Writes what is buffered in one write(). Returns 0, or negative errno: then nothing buffered counts (a
 * partial line is cut off again), the buffer is emptied, and the log is broken until lease_log_rewrite()
 * succeeds — it may now lack an "end", or hold a grant that was refused. */
int lease_log_flush(LeaseLog *log);
bool lease_log_is_broken(const LeaseLog *log);

/* True when the log holds many more lines than the n_live leases need: time for lease_log_rewrite(). */
bool lease_log_wants_rewrite(const LeaseLog *log, size_t n_live);

/* Writes a snapshot of these live leases, the token marks the log knows, the rests it knows that end after
 * alive (all of them when it is 0), the members' counts it knows, and alive (realtime µs, 0: none):
 * into a fresh file renamed over the log where the directory allows it, else appended after a "reset"
 * line. Mends a broken log. Returns 0, or negative errno (-EACCES, -EPERM, -EROFS, -ENOSPC…: still broken). */
int lease_log_rewrite(LeaseLog *log, const HistoryLeaseRow *leases, size_t n, usec_t alive);

/* The token marks the log knows: every pool's next unused token (for tests and Status). */
uint64_t lease_log_token_mark(const LeaseLog *log, const char *pool);
