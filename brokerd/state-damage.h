/* SPDX-License-Identifier: MIT */
/* state-damage.h — the state directory's record of what brokerd could not read (SPEC §3.4): a lease-log line
 * that does not check out, a lease log or a members.state that is not one. What such a file held (a lease, a
 * drain, a quarantine) cannot be named, and must not be handed to someone else: while the record exists
 * nothing new is granted. Its removal is the operator's word that nothing it could have held is at stake. */
#pragma once

#include <stddef.h>

#include "time-util.h"

#define STATE_DAMAGE_FILE "state.damaged"

/* Appends to directory/STATE_DAMAGE_FILE what was found at realtime (one line, without its newline) and the
 * damaged bytes (size 0: none), made durable, directory included, before the damage is moved or written over.
 * Returns 0 or negative errno. */
int state_damage_record(const char *directory, const char *what, const char *damage, size_t size, usec_t realtime);

/* Whether directory/STATE_DAMAGE_FILE exists: 1, 0, or negative errno (it cannot be told). */
int state_damage_found(const char *directory);
