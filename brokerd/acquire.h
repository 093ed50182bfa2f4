/* SPDX-License-Identifier: MIT */
/* acquire.h — the Acquire call: parameters to an engine request, and the engine's events back to replies
 * and leases. */
#pragma once

#include <systemd/sd-event.h>

#include "engine.h"
#include "varlink.h"

typedef struct Connection Connection;
typedef struct Manager Manager;

/* io.slotbroker.Acquire. Replies (or starts waiting); never fails the connection. */
void acquire_start(Connection *c, const VarlinkCall *call);

/* An engine event: a request queued, granted or refused, a lease reaching max-hold, a pool's gauge. */
void acquire_handle_event(Manager *m, const EngineEvent *ev);

/* The position timer: waiters whose place changed hear of it, at most once a second each. */
int acquire_on_position_timer(sd_event_source *s, uint64_t usec, void *userdata);
/* The waiter leaves (closed, or cancelled by an administrator): no more position updates. */
void acquire_forget_waiter(Connection *c);
