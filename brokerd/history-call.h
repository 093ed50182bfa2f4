/* SPDX-License-Identifier: MIT */
/* history-call.h — the History method: its reply is produced page by page as the client reads it. */
#pragma once

#include <stddef.h>

#include "list.h"
#include "varlink.h"

typedef struct History History;
typedef struct Session Session;

/* The History calls of all connections, embedded in their owner (the Manager). */
typedef struct HistoryCalls {
        History *history;               /* NULL: History answers Unavailable */
        unsigned pages_reading;         /* pages the writer thread is reading for clients */
        List page_queue;                /* HistoryCall.queue_node: History calls waiting for their turn */
        void (*memory_freed)(size_t bytes, void *userdata); /* big buffers freed (malloc_trim accounting) */
        void *userdata;
} HistoryCalls;

void history_calls_init(HistoryCalls *hc);

/* Runs io.slotbroker.History on c: reads the events from the history writer a page at a time and sends
 * them as one reply, fetching the next page only once the client has read most of the last one, so that
 * a client that does not read holds a page's worth of memory, not the whole reply. The connection is
 * busy (its later calls wait) until the reply's last part is queued. */
void history_call_start(HistoryCalls *hc, Session *s, const VarlinkCall *call);
/* The connection is closing: stop producing, forget the page being read. */
void history_call_abandon(Session *s);
