/* SPDX-License-Identifier: MIT */
/* session.h — what a client connection has asked for: its Acquire (waiting or holding), its place in the
 * queue and the position updates, its waiter count, every Acquire reply. The engine's events come back
 * here as replies and leases. */
#pragma once

#include <stdbool.h>
#include <systemd/sd-event.h>

#include "engine.h"
#include "varlink.h"

typedef struct Connection Connection;
typedef struct Manager Manager;

/* io.slotbroker.Acquire. Replies (or starts waiting); never fails the connection. */
void session_acquire(Connection *c, const VarlinkCall *call);

/* An engine event: a request queued, granted or refused, a lease reaching max-hold, a pool's gauge. */
void session_on_engine_event(Manager *m, const EngineEvent *ev);

/* The position timer: waiters whose place changed hear of it, at most once a second each. */
int session_on_position_timer(sd_event_source *s, uint64_t usec, void *userdata);
typedef enum SessionWithdraw {
        SESSION_WITHDRAW_GONE,          /* its connection closed: audited "cancelled", nobody to answer */
        SESSION_WITHDRAW_CANCELLED,     /* an administrator's Cancel: audited and answered "unavailable" */
} SessionWithdraw;

/* Withdraws c's waiting request, if it has one: the one way a waiter leaves other than by the engine's
 * grant or refusal. Returns whether there was one. */
bool session_waiter_withdraw(Connection *c, SessionWithdraw why);
