/* SPDX-License-Identifier: MIT */
/* history-loop.c — owns the loop side: history.h's API on the event loop, the eventfd the writer wakes it
 * through, and the callbacks. The other rooms: history-channel.c (what crosses to the writer), history-writer.c
 * (the thread), history-db.c (the file), history-checkpoint.c (WAL checkpoints); below them all, history.c
 * (the helpers of history.h's types, the knobs). Each room is a .c of its own and none includes or calls a
 * room above it, so brokerd's include graph (tests/check-include-graph.py) stays acyclic:
 * loop → writer → {db, checkpoint} → channel → history. */
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>

#include "history-internal.h"
#include "history-writer.h"
#include "log.h"

struct History {
        sd_event *event;
        sd_event_source *wakeup_source;
        HistoryChannel channel;
        HistoryWriter writer;

        Op *all;                       /* outstanding ops with a callback, for history_cancel() */
        HistoryHealthFn health;
        void *health_userdata;
        unsigned epoch_seen;
};

static void all_link(History *h, Op *op) {
        op->all_prev = NULL;
        op->all_next = h->all;
        if (h->all)
                h->all->all_prev = op;
        h->all = op;
}

static void all_unlink(History *h, Op *op) {
        if (op->all_prev)
                op->all_prev->all_next = op->all_next;
        else if (h->all == op)
                h->all = op->all_next;
        if (op->all_next)
                op->all_next->all_prev = op->all_prev;
        op->all_prev = op->all_next = NULL;
}

static int on_wakeup(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        History *h = userdata;
        eventfd_t v;
        Op *done;

        (void) eventfd_read(fd, &v);
        done = STACK_TAKE(&h->channel.done);

        while (done) {
                Op *op = done;
                done = op->next;
                all_unlink(h, op);
                /* The callbacks may queue more work or cancel ops further down this list. */
                if (op->type == OP_QUERY && op->query_done)
                        op->query_done(h, op->result, op->events, op->next_cursor, op->userdata);
                else if (op->type == OP_LOAD && op->load_done)
                        op->load_done(h, op->result, &op->state, op->userdata);
                history_op_free(op);
        }

        unsigned epoch = atomic_load(&h->channel.epoch);
        if (h->health && epoch != h->epoch_seen) {
                h->epoch_seen = epoch;
                h->health(h, atomic_load(&h->channel.healthy), h->health_userdata);
        }
        return 0;
}

int history_new(sd_event *event, const char *directory, usec_t retention, History **ret) {
        int r;

        assert_return(event, -EINVAL);
        assert_return(directory, -EINVAL);
        assert_return(ret, -EINVAL);

        _cleanup_(history_freep) History *h = calloc(1, sizeof(History));
        if (!h)
                return -ENOMEM;
        h->event = sd_event_ref(event);
        r = history_channel_init(&h->channel);
        if (r < 0)
                return r;
        r = sd_event_add_io(event, &h->wakeup_source, h->channel.wakeup_fd, EPOLLIN, on_wakeup, h);
        if (r < 0)
                return r;
        (void) sd_event_source_set_description(h->wakeup_source, "history");

        r = history_writer_start(&h->writer, &h->channel, directory, retention);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(h);
        return 0;
}

History *history_free(History *h) {
        if (!h)
                return NULL;

        history_writer_stop(&h->writer);
        /* Callbacks are not called any more: whoever waits on them is going away too. */
        history_channel_done(&h->channel);
        sd_event_source_disable_unref(h->wakeup_source);
        sd_event_unref(h->event);
        return mfree(h);
}

int history_load_state(History *h, HistoryState *ret) {
        assert_return(h && ret, -EINVAL);

        _cleanup_(history_op_freep) Op *op = calloc(1, sizeof(Op));
        if (!op)
                return -ENOMEM;
        op->type = OP_LOAD;
        history_channel_queue_op(&h->channel, op);

        history_channel_wait_load(&h->channel, op);
        if (op->result < 0)
                return op->result;
        *ret = op->state;
        op->state = (HistoryState) {};
        return 0;
}

int history_load(History *h, HistoryLoadFn done, void *userdata) {
        assert_return(h && done, -EINVAL);

        Op *op = calloc(1, sizeof(Op));
        if (!op)
                return -ENOMEM;
        op->type = OP_LOAD;
        op->load_done = done;
        op->async = true;
        op->userdata = userdata;
        all_link(h, op);
        history_channel_queue_op(&h->channel, op);
        return 0;
}

int history_load_leases(History *h, HistoryLeaseRow **ret, size_t *ret_n) {
        HistoryState s;
        assert_return(h && ret && ret_n, -EINVAL);
        int r = history_load_state(h, &s);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(s.leases);
        *ret_n = s.n_leases;
        s.n_leases = 0;
        history_state_done(&s);
        return 0;
}

int history_load_token_floors(History *h, HistoryTokenFloor **ret, size_t *ret_n) {
        HistoryState s;
        assert_return(h && ret && ret_n, -EINVAL);
        int r = history_load_state(h, &s);
        if (r < 0)
                return r;
        *ret_n = s.n_floors;
        *ret = s.n_floors > 0 ? TAKE_PTR(s.floors) : NULL;
        s.n_floors = 0;
        history_state_done(&s);
        return 0;
}

static size_t strsize(const char *s) {
        return s ? strlen(s) + 1 : 0;
}

static const char *stash(char **p, const char *s, size_t size) {
        if (!s)
                return NULL;
        char *d = memcpy(*p, s, size);
        *p += size;
        return d;
}

void history_append(History *h, const AuditRecord *r, usec_t realtime) {
        size_t sd, sp, sl, sj, se, ss, sr, sx, sm;

        if (!h || !r || !r->decision)
                return;

        /* One producer (this thread): the bound cannot be overshot between the check and the add. */
        if (atomic_load(&h->channel.backlog) >= HISTORY_BACKLOG_MAX) {
                atomic_fetch_add(&h->channel.rows_dropped, 1);
                if (!atomic_exchange(&h->channel.dropping, true))
                        log_warning("History cannot keep up: %d decision rows wait to be written; further rows are "
                                    "dropped (counted in the metrics) until it catches up.",
                                    HISTORY_BACKLOG_MAX);
                return;
        }

        sd = strsize(r->decision), sp = strsize(r->pool), sl = strsize(r->lane), sj = strsize(r->job),
        se = strsize(r->lease), ss = strsize(r->state), sr = strsize(r->reason), sx = strsize(r->selector),
        sm = strsize(r->member);
        EventRow *e = history_row_alloc(&h->channel, sizeof(EventRow) + sd + sp + sl + sj + se + ss + sr + sx + sm);
        if (!e) {
                atomic_fetch_add(&h->channel.rows_dropped, 1);
                return;
        }
        char *p = e->data;
        *e = (EventRow) {
                .block = e->block,
                .time = realtime,
                .wait = r->wait,
                .hold = r->hold,
                .budget = r->budget,
                .idle = r->idle,
                .token = r->token,
                .uid = r->uid,
                .pid = r->pid,
                .retry_after_sec = r->retry_after_sec,
                .exit_status = r->exit_status,
                .slots = r->slots,
                .until = r->until,
        };
        e->decision = stash(&p, r->decision, sd);
        e->pool = stash(&p, r->pool, sp);
        e->lane = stash(&p, r->lane, sl);
        e->job = stash(&p, r->job, sj);
        e->lease = stash(&p, r->lease, se);
        e->state = stash(&p, r->state, ss);
        e->reason = stash(&p, r->reason, sr);
        e->selector = stash(&p, r->selector, sx);
        e->member = stash(&p, r->member, sm);

        atomic_fetch_add(&h->channel.backlog, 1);
        /* The writer wakes for the first row of a batch (to time it) and for a full batch; not per row. */
        bool first = STACK_PUSH(&h->channel.rows, e);
        int_fast64_t n = atomic_fetch_add(&h->channel.n_rows, 1) + 1;
        if (first)
                atomic_store(&h->channel.first_row_at, now_monotonic());
        if (first || n == HISTORY_BATCH_MAX)
                history_channel_wake_writer(&h->channel);
}

void history_lease_delete(History *h, const char *id) {
        if (!h || !id)
                return;

        Op *op = calloc(1, sizeof(Op));
        if (!op || !(op->lease_id = strdup(id))) {
                free(op);
                return; /* the row stays: with a lease log beside it, history.db's leases are not read again */
        }
        op->type = OP_LEASE_DELETE;
        history_channel_queue_op(&h->channel, op);
}

int history_query(History *h, const HistoryQuery *q, HistoryQueryFn done, void *userdata) {
        assert_return(h && q, -EINVAL);

        _cleanup_(history_op_freep) Op *op = calloc(1, sizeof(Op));
        if (!op)
                return -ENOMEM;
        op->type = OP_QUERY;
        op->query = *q;
        op->query.lane = op->query.pool = op->query.decision = NULL;
        if (strdup_or_null(q->lane, (char **) &op->query.lane) < 0 ||
            strdup_or_null(q->pool, (char **) &op->query.pool) < 0 ||
            strdup_or_null(q->decision, (char **) &op->query.decision) < 0)
                return -ENOMEM;
        op->query_done = done;
        op->userdata = userdata;
        all_link(h, op);
        history_channel_queue_op(&h->channel, TAKE_PTR(op));
        return 0;
}

void history_cancel(History *h, void *userdata) {
        if (!h)
                return;
        for (Op *op = h->all; op; op = op->all_next)
                if (op->userdata == userdata) {
                        op->query_done = NULL;
                        op->load_done = NULL;
                }
}

void history_set_health_callback(History *h, HistoryHealthFn fn, void *userdata) {
        if (!h)
                return;
        h->health = fn;
        h->health_userdata = userdata;
        h->epoch_seen = atomic_load(&h->channel.epoch);
}

bool history_is_healthy(const History *h) {
        return h && atomic_load(&((History *) h)->channel.healthy);
}

void history_get_stats(const History *h, HistoryStats *ret) {
        History *m = (History *) h; /* atomics only: nothing is changed */

        if (!h || !ret)
                return;
        *ret = (HistoryStats) {
                .rows_written = atomic_load(&m->channel.rows_written),
                .rows_dropped = atomic_load(&m->channel.rows_dropped),
                .rows_pending = atomic_load(&m->channel.backlog),
                .commits = atomic_load(&m->channel.commits),
                .write_errors = atomic_load(&m->channel.write_errors),
                .longest_commit = atomic_load(&m->channel.longest_commit),
                .healthy = atomic_load(&m->channel.healthy),
        };
}
