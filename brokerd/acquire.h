/* SPDX-License-Identifier: MIT */
/* acquire.h — the Acquire call: parameters to an engine request, and the engine's events back to replies
 * and leases. */
#pragma once

#include "engine.h"
#include "varlink.h"

typedef struct Connection Connection;
typedef struct Manager Manager;

/* io.slotbroker.Acquire. Replies (or starts waiting); never fails the connection. */
void acquire_start(Connection *c, const VarlinkCall *call);

/* An engine event: a request queued, granted or refused, a lease reaching max-hold, a pool's gauge. */
void acquire_handle_event(Manager *m, const EngineEvent *ev);

/* Once a second: waiters whose place changed hear of it (at most one reply a second each). */
void acquire_send_positions(Manager *m);
