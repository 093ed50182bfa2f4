/* SPDX-License-Identifier: MIT */
/* member-state.h — the state directory's members.state: the drains (who, why, since, until) and quarantines
 * (since, job, exit status, reason) that outlive a restart (SPEC §3.6), one JSON object rewritten whole
 * (a new file renamed over it) when one of them changes, and read once at start:
 *
 *   {"slotbroker":"members","version":1,"entries":[
 *     {"pool":"P","member":"M",                               member absent: the whole pool (a drain)
 *      "drain":{"since":µs,"until":µs,"by":"uid 0","reason":"…"},      until, by, reason optional
 *      "quarantine":{"since":µs,"job":"…","exitStatus":3,"reason":"…"}}]}  job, exitStatus, reason optional
 *
 * Times are realtime µs. What is read is input: a file that is not exactly this (a name that is no name,
 * a reason with a control character, a time out of range, another version) is refused whole (-EBADMSG),
 * never guessed at. Changes are rare (people and broken rigs), so a whole rewrite is cheap. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "time-util.h"

#define MEMBER_STATE_FILE "members.state"
#define MEMBER_STATE_REASON_MAX 1024
#define MEMBER_STATE_ENTRIES_MAX 100000

typedef struct MemberStateEntry {
        char *pool;
        char *member;                   /* NULL: the whole pool (a drain only) */
        bool drained;
        usec_t drain_since;
        usec_t drain_until;             /* USEC_INFINITY: none */
        char *drain_by;                 /* may be NULL */
        char *drain_reason;             /* may be NULL */
        bool quarantined;
        usec_t quarantine_since;
        char *quarantine_job;           /* may be NULL */
        int quarantine_exit_status;     /* -1: none */
        char *quarantine_reason;        /* may be NULL */
} MemberStateEntry;

/* Frees an entry's strings (not the entry). */
void member_state_entry_done(MemberStateEntry *e);
void member_state_entries_free(MemberStateEntry *e, size_t n);

/* One line of printable text, 1 to MEMBER_STATE_REASON_MAX bytes: what a reason or a job may be here. */
bool member_state_text_is_valid(const char *s);

/* Reads directory/members.state. No file: 0 and no entries. Returns 0, -EBADMSG (not a members.state of
 * this version, or damaged: nothing of it is used), -ENOMEM, or the error of reading it. */
int member_state_read(const char *directory, MemberStateEntry **ret, size_t *ret_n);

/* Writes them to directory/members.state.tmp, renamed over members.state. Returns 0 or negative errno
 * (the old file stays). */
int member_state_write(const char *directory, const MemberStateEntry *e, size_t n);

/* Renames a damaged directory/members.state to members.state.corrupt-<UTC time>. */
int member_state_move_aside(const char *directory, char **ret_moved);
