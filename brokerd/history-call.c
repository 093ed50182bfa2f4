/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "connection.h"
#include "history-call.h"
#include "history.h"
#include "log.h"
#include "session.h"

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
        Session *session;
        HistoryCalls *calls;
        bool reading;           /* a page is being read (counted in HistoryCalls.pages_reading) */
        ListNode queue_node;    /* in HistoryCalls.page_queue while waiting for its turn */
} HistoryCall;

static HistoryCall *history_call_free(HistoryCall *h) {
        if (!h)
                return NULL;
        free(h->lane);
        free(h->pool);
        free(h->decision);
        return mfree(h);
}

static void reply_unavailable(Session *s) {
        _cleanup_(json_decrefp) json_t *p = json_pack("{s:i, s:s}", "retryAfterSec", 5, "reason", "storage");
        session_reply_error(s, "io.slotbroker.Unavailable", p);
}

/* The reply is complete (or cut short): the calls behind it get their turn. */
static void history_call_end(Session *s) {
        s->history_call = history_call_free(s->history_call);
        s->history_pending = false;
        connection_when_output_below(s->connection, 0, NULL);
        connection_set_held(s->connection, false);
}

/* The closing text; cursor 0: no further page. */
static int history_call_close_reply(Session *s, int64_t cursor) {
        char tail[64];
        int n = cursor > 0 ? snprintf(tail, sizeof tail, "],\"cursor\":%" PRId64 "}}", cursor)
                           : snprintf(tail, sizeof tail, "]}}");
        return connection_reply_part(s->connection, tail, (size_t) n + 1); /* with the NUL that ends the message */
}

static void on_history_page(History *history, int error, json_t *events, int64_t next_cursor, void *userdata);

static void history_call_read_page(Session *s) {
        HistoryCall *h = s->history_call;
        h->query.limit = MIN(h->remaining, HISTORY_PAGE_EVENTS);
        if (history_query(h->calls->history, &h->query, on_history_page, s) < 0) {
                log_oom();
                session_close(s);
                return;
        }
        h->reading = true;
        h->calls->pages_reading++;
}

static void history_call_fetch(Session *s) {
        HistoryCalls *hc = s->history_call->calls;
        if (hc->pages_reading >= HISTORY_PAGES_READING_MAX)
                list_append(&hc->page_queue, &s->history_call->queue_node);
        else
                history_call_read_page(s);
}

static void on_output_below(Connection *c) {
        history_call_fetch(connection_get_userdata(c));
}

/* A page was read (or its call went away): the next call waiting has its turn. */
static void history_page_done(HistoryCalls *hc) {
        hc->pages_reading--;
        ListNode *n = list_first(&hc->page_queue);
        if (!n)
                return;
        list_unlink(n);
        history_call_read_page(container_of(n, HistoryCall, queue_node)->session);
}

static void on_history_page(History *history, int error, json_t *events, int64_t next_cursor, void *userdata) {
        Session *s = userdata;
        HistoryCall *h = s->history_call;
        int r = 0;

        h->reading = false;
        history_page_done(h->calls);

        if (error < 0) {
                if (!h->started)
                        reply_unavailable(s);
                else
                        /* Part of the reply is out: end it where it got to; the client's next page (from
                         * this cursor) gets the error. */
                        r = history_call_close_reply(s, h->last_id);
                history_call_end(s);
                return;
        }
        if (!h->started) {
                static const char head[] = "{\"parameters\":{\"events\":[";
                r = connection_reply_part(s->connection, head, sizeof head - 1);
                h->started = true;
        }
        size_t i, before = connection_get_pending_output(s->connection);
        json_t *e;
        json_array_foreach(events, i, e) {
                if (r < 0)
                        break;
                if (h->any)
                        r = connection_reply_part(s->connection, ",", 1);
                if (r >= 0)
                        r = connection_reply_part_json(s->connection, e);
                h->any = true;
                h->last_id = json_integer_value(json_object_get(e, "id"));
        }
        if (r < 0) {
                /* Past the output cap the connection is closed already (and h freed with the call). */
                if (!s->closed) {
                        log_oom();
                        session_close(s);
                }
                return;
        }
        /* The page's events were built on the writer thread and are freed after this callback: about
         * this much more than their text, in the writer's malloc arena. */
        if (h->calls->memory_freed)
                h->calls->memory_freed(connection_get_pending_output(s->connection) - before, h->calls->userdata);
        h->remaining -= MIN(h->remaining, (unsigned) json_array_size(events));
        if (next_cursor <= 0 || h->remaining == 0) {
                r = history_call_close_reply(s, next_cursor > 0 ? next_cursor : 0);
                if (r < 0)
                        return;
                history_call_end(s);
                return;
        }
        h->query.cursor = next_cursor;
        connection_resume(s->connection); /* sends what was queued; the calls behind still wait */
        if (!s->closed)
                connection_when_output_below(s->connection, HISTORY_OUTPUT_LOW_MARK, on_output_below);
}

void history_calls_init(HistoryCalls *hc) {
        *hc = (HistoryCalls) {};
        list_init(&hc->page_queue);
}

void history_call_start(HistoryCalls *hc, Session *s, const VarlinkCall *call) {
        int64_t since = 0, until = -1, limit = 100, cursor = 0; /* until -1: not given */
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
                session_reply_error(s, VARLINK_ERROR_INVALID_PARAMETER, p);
                return;
        }
        if (connection_get_oneway(s->connection))
                return; /* nobody wants the answer, and reading changes nothing */
        if (until == 0) {
                /* Nothing is before 1970; HistoryQuery takes an until of 0 for none, which would be every event. */
                _cleanup_(json_decrefp) json_t *p = json_pack("{s:[]}", "events");
                session_reply(s, p, false);
                return;
        }
        if (!hc->history) {
                reply_unavailable(s);
                return;
        }

        HistoryCall *h = calloc(1, sizeof(HistoryCall));
        if (!h || strdup_or_null(lane, &h->lane) < 0 || strdup_or_null(pool, &h->pool) < 0 ||
            strdup_or_null(decision, &h->decision) < 0) {
                history_call_free(h);
                log_oom();
                session_close(s);
                return;
        }
        h->query.lane = h->lane;
        h->query.pool = h->pool;
        h->query.decision = h->decision;
        h->query.since = (usec_t) since;
        h->query.until = until >= 0 ? (usec_t) until : USEC_INFINITY;
        h->query.cursor = cursor;
        h->remaining = (unsigned) limit;
        h->session = s;
        h->calls = hc;
        s->history_call = h;
        /* Answered from the writer thread's pages; calls behind it wait, to keep replies in order. */
        s->history_pending = true;
        connection_set_held(s->connection, true);
        history_call_fetch(s);
}

void history_call_abandon(Session *s) {
        HistoryCall *h = s->history_call;
        if (!h)
                return;
        if (list_node_is_linked(&h->queue_node))
                list_unlink(&h->queue_node);
        s->history_call = NULL; /* before another call's turn comes: it may close connections */
        if (h->reading) {
                history_cancel(h->calls->history, s);
                history_page_done(h->calls);
        }
        history_call_free(h);
        s->history_pending = false;
}
