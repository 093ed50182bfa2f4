/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "connection.h"
#include "history-call.h"
#include "history.h"
#include "log.h"
#include "manager.h"

/* Events read per trip to the writer thread, and the unsent bytes below which the next trip starts.
 * 500 clients asking for 1000 events each and reading nothing held 400-765 MB when the reply was built
 * whole (issue 9 n); a page is at most 50 events of at most ~1.5 KiB each (the job label is 1 KiB). */
#define HISTORY_PAGE_EVENTS 50U
#define HISTORY_OUTPUT_LOW_MARK ((size_t) 16 * 1024)
/* Pages read at once, for all clients: the writer thread runs the queries of a batch before the lease
 * commits queued behind them, and hundreds of History clients would hold every grant behind their pages. */
#define HISTORY_PAGES_READING_MAX 4U

typedef struct HistoryCall {
        HistoryQuery query;     /* its strings are those below; .cursor moves on page by page, .limit is a page's */
        char *lane, *pool, *decision;
        unsigned remaining;     /* events the client may still get */
        bool started;           /* the reply's opening text is queued */
        bool any;               /* an event is queued: the next one needs a comma */
        int64_t last_id;        /* of the last event queued */
        Connection *connection;
        bool reading;           /* a page is being read (counted in Manager.history_pages_reading) */
        ListNode queue_node;    /* in Manager.history_page_queue while waiting for its turn */
} HistoryCall;

static HistoryCall *history_call_free(HistoryCall *h) {
        if (!h)
                return NULL;
        free(h->lane);
        free(h->pool);
        free(h->decision);
        return mfree(h);
}

static void reply_unavailable(Connection *c) {
        _cleanup_(json_decrefp) json_t *p = json_pack("{s:i, s:s}", "retryAfterSec", 5, "reason", "storage");
        connection_reply_error(c, "io.slotbroker.Unavailable", p);
}

/* The reply is complete (or cut short): the calls behind it get their turn. */
static void history_call_end(Connection *c) {
        c->history_call = history_call_free(c->history_call);
        c->history_pending = false;
        c->output_below = NULL;
        connection_dispatch(c);
        manager_sync(c->manager);
}

/* The closing text; cursor 0: no further page. */
static int history_call_close_reply(Connection *c, int64_t cursor) {
        char tail[64];
        int n = cursor > 0 ? snprintf(tail, sizeof tail, "],\"cursor\":%" PRId64 "}}", cursor)
                           : snprintf(tail, sizeof tail, "]}}");
        return connection_reply_part(c, tail, (size_t) n + 1); /* with the NUL that ends the message */
}

static void on_history_page(History *history, int error, json_t *events, int64_t next_cursor, void *userdata);

static void history_call_read_page(Connection *c) {
        HistoryCall *h = c->history_call;
        h->query.limit = MIN(h->remaining, HISTORY_PAGE_EVENTS);
        if (history_query(c->manager->history, &h->query, on_history_page, c) < 0) {
                log_oom();
                connection_close(c);
                return;
        }
        h->reading = true;
        c->manager->history_pages_reading++;
}

static void history_call_fetch(Connection *c) {
        Manager *m = c->manager;
        if (m->history_pages_reading >= HISTORY_PAGES_READING_MAX)
                list_append(&m->history_page_queue, &c->history_call->queue_node);
        else
                history_call_read_page(c);
}

/* A page was read (or its call went away): the next call waiting has its turn. */
static void history_page_done(Manager *m) {
        m->history_pages_reading--;
        ListNode *n = list_first(&m->history_page_queue);
        if (!n)
                return;
        list_unlink(n);
        history_call_read_page(container_of(n, HistoryCall, queue_node)->connection);
}

static void on_history_page(History *history, int error, json_t *events, int64_t next_cursor, void *userdata) {
        Connection *c = userdata;
        HistoryCall *h = c->history_call;
        int r = 0;

        h->reading = false;
        history_page_done(c->manager);

        if (error < 0) {
                if (!h->started)
                        reply_unavailable(c);
                else
                        /* Part of the reply is out: end it where it got to; the client's next page (from
                         * this cursor) gets the error. */
                        r = history_call_close_reply(c, h->last_id);
                history_call_end(c);
                return;
        }
        if (!h->started) {
                static const char head[] = "{\"parameters\":{\"events\":[";
                r = connection_reply_part(c, head, sizeof head - 1);
                h->started = true;
        }
        size_t i, before = varlink_stream_pending_output(&c->stream);
        json_t *e;
        json_array_foreach(events, i, e) {
                if (r < 0)
                        break;
                if (h->any)
                        r = connection_reply_part(c, ",", 1);
                if (r >= 0)
                        r = connection_reply_part_json(c, e);
                h->any = true;
                h->last_id = json_integer_value(json_object_get(e, "id"));
        }
        if (r < 0) {
                /* Past the output cap the connection is closed already (and h freed with the call). */
                if (!c->closed) {
                        log_oom();
                        connection_close(c);
                }
                return;
        }
        /* The page's events were built on the writer thread and are freed after this callback: about
         * this much more than their text, in the writer's malloc arena. */
        manager_memory_freed(c->manager, varlink_stream_pending_output(&c->stream) - before);
        h->remaining -= MIN(h->remaining, (unsigned) json_array_size(events));
        if (next_cursor <= 0 || h->remaining == 0) {
                r = history_call_close_reply(c, next_cursor > 0 ? next_cursor : 0);
                if (r < 0)
                        return;
                history_call_end(c);
                return;
        }
        h->query.cursor = next_cursor;
        connection_dispatch(c); /* sends what was queued */
        if (!c->closed)
                connection_when_output_below(c, HISTORY_OUTPUT_LOW_MARK, history_call_fetch);
}

void history_call_start(Connection *c, const VarlinkCall *call) {
        Manager *m = c->manager;
        int64_t since = 0, until = 0, limit = 100, cursor = 0;
        const char *lane = NULL, *pool = NULL, *decision = NULL, *bad = NULL;

        const JsonField table[] = {
                { "since", JSON_FIELD_INT64, 0, &since, 0, INT64_MAX },
                { "until", JSON_FIELD_INT64, 0, &until, 0, INT64_MAX },
                { "lane", JSON_FIELD_STRING, 0, &lane, .max_length = 64 },
                { "pool", JSON_FIELD_STRING, 0, &pool, .max_length = 64 },
                { "decision", JSON_FIELD_STRING, 0, &decision, .max_length = 32 },
                { "limit", JSON_FIELD_INT64, 0, &limit, 1, HISTORY_QUERY_LIMIT_MAX },
                { "cursor", JSON_FIELD_INT64, 0, &cursor, 0, INT64_MAX },
                {},
        };
        if (json_dispatch(call->parameters, table, 0, &bad) < 0) {
                _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "parameter", bad ?: "parameters");
                connection_reply_error(c, VARLINK_ERROR_INVALID_PARAMETER, p);
                return;
        }
        if (c->oneway)
                return; /* nobody wants the answer, and reading changes nothing */
        if (!m->history) {
                reply_unavailable(c);
                return;
        }

        HistoryCall *h = calloc(1, sizeof(HistoryCall));
        if (!h || strdup_or_null(lane, &h->lane) < 0 || strdup_or_null(pool, &h->pool) < 0 ||
            strdup_or_null(decision, &h->decision) < 0) {
                history_call_free(h);
                log_oom();
                connection_close(c);
                return;
        }
        h->query.lane = h->lane;
        h->query.pool = h->pool;
        h->query.decision = h->decision;
        h->query.since = (usec_t) since;
        h->query.until = until > 0 ? (usec_t) until : USEC_INFINITY;
        h->query.cursor = cursor;
        h->remaining = (unsigned) limit;
        h->connection = c;
        c->history_call = h;
        /* Answered from the writer thread's pages; calls behind it wait, to keep replies in order. */
        c->history_pending = true;
        history_call_fetch(c);
}

void history_call_abandon(Connection *c) {
        HistoryCall *h = c->history_call;
        if (!h)
                return;
        if (list_node_is_linked(&h->queue_node))
                list_unlink(&h->queue_node);
        c->history_call = NULL; /* before another call's turn comes: it may close connections */
        if (h->reading) {
                history_cancel(c->manager->history, c);
                history_page_done(c->manager);
        }
        history_call_free(h);
        c->history_pending = false;
        c->output_below = NULL;
}
