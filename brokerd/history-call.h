/* SPDX-License-Identifier: MIT */
/* history-call.h — the History method: its reply is produced page by page as the client reads it. */
#pragma once

#include "varlink.h"

typedef struct Session Session;

/* Runs io.slotbroker.History on c: reads the events from the history writer a page at a time and sends
 * them as one reply, fetching the next page only once the client has read most of the last one, so that
 * a client that does not read holds a page's worth of memory, not the whole reply. The connection is
 * busy (its later calls wait) until the reply's last part is queued. */
void history_call_start(Session *s, const VarlinkCall *call);
/* The connection is closing: stop producing, forget the page being read. */
void history_call_abandon(Session *s);
