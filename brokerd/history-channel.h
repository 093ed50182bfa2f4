/* SPDX-License-Identifier: MIT */
/* history-channel.h — what crosses between the loop and the writer thread: ops, decision rows in their
 * blocks, the lock-free stacks they travel on, the eventfds that wake either side, and the counters and
 * health both read. Private to the history module (history*.c).
 *
 * The loop thread never takes a lock that the writer holds: a writer thread descheduled inside a critical
 * section would stall the loop for a whole time slice. Work goes both ways through lock-free stacks (each
 * has one consumer, which takes the whole stack at once and reverses it, so there is no ABA), and each side
 * wakes the other through an eventfd. The mutex is for history_load_state() only, at start. */
#pragma once

#include <pthread.h>
#include <stdatomic.h>

#include "history.h"

typedef struct HistoryChannel HistoryChannel;

/* Decision rows live in blocks that the loop fills and the writer gives back once every row in them is
 * written. Rows malloc()ed one by one would be freed by the writer into the loop thread's malloc arena,
 * whose lock the loop then waits for whenever the writer is descheduled inside free(). Blocks are mapped
 * outside any arena, prefaulted, and recycled rather than unmapped: mmap() and page faults wait for the
 * address-space lock that an munmap() elsewhere holds. (Measured: tests/bench/README.md, bench-history.) */
typedef struct RowBlock RowBlock;

/* A decision row, copied out of its AuditRecord: the strings follow the struct. */
typedef struct EventRow {
        struct EventRow *next;
        RowBlock *block;      /* NULL: malloc()ed on its own (a row too large for a block) */
        usec_t time, wait, hold, budget, idle;
        uint64_t token;
        uid_t uid;
        pid_t pid;
        unsigned retry_after_sec;
        int exit_status;      /* -1: none */
        unsigned slots;       /* 0: none */
        usec_t until;         /* a drain's until, realtime µs; 0 or USEC_INFINITY: none */
        const char *decision, *pool, *lane, *job, *lease, *state, *reason, *selector, *member;
        char data[];
} EventRow;

typedef enum OpType {
        OP_LEASE_DELETE,
        OP_QUERY,
        OP_LOAD,
} OpType;

typedef struct Op {
        OpType type;
        struct Op *next;               /* in a channel's stack, or a writer's local list */

        /* Input, fixed once queued. */
        char *lease_id;                /* OP_LEASE_DELETE */
        HistoryQuery query;            /* OP_QUERY; its strings owned */

        /* Output, written by the writer before the op is handed back. */
        int result;
        json_t *events;
        int64_t next_cursor;
        HistoryState state;            /* OP_LOAD */
        bool finished;                 /* OP_LOAD without a callback: the caller waits for it */
        bool async;                    /* OP_LOAD with a callback: handed back to the loop */

        /* Loop thread only: outstanding ops with a callback, for history_cancel(). */
        struct Op *all_prev, *all_next;
        HistoryQueryFn query_done;
        HistoryLoadFn load_done;
        void *userdata;
} Op;

struct HistoryChannel {
        int wakeup_fd;                 /* writer → loop: ops are done, or health changed */
        int writer_fd;                 /* loop → writer: work arrived, or stop */
        pthread_mutex_t mutex;
        pthread_cond_t load_cond;      /* wakes a caller of history_load_state() */

        /* Loop → writer. */
        _Atomic(EventRow *) rows;      /* newest first */
        atomic_int_fast64_t n_rows;    /* about how many are in rows: may lag a push or a take */
        atomic_uint_fast64_t first_row_at; /* when rows last became non-empty */
        _Atomic(Op *) ops;             /* newest first */
        atomic_bool writer_woken;      /* writer_fd was written and the writer has not looked since */
        atomic_bool stopping;
        atomic_uint_fast64_t stop_deadline;

        /* Writer → loop. */
        _Atomic(Op *) done;            /* newest first */
        _Atomic(RowBlock *) spare_blocks; /* blocks whose rows are all written, for reuse */
        atomic_uint n_spare_blocks;

        /* Either side. */
        atomic_bool dropping;          /* a drop episode was logged and has not ended */
        atomic_bool healthy;
        atomic_uint epoch;             /* bumped on every change of health */
        atomic_uint_fast64_t rows_written, rows_dropped, commits, write_errors, longest_commit;
        atomic_uint_fast64_t backlog;  /* appended, neither written nor dropped: what HISTORY_BACKLOG_MAX bounds */

        /* Loop thread only. */
        RowBlock *block;               /* the block rows are appended to */
        RowBlock *spare;               /* taken from spare_blocks */
};

/* Pushes onto a lock-free stack; returns true when it was empty. */
#define STACK_PUSH(head, item)                                                                  \
        ({                                                                                      \
                __typeof__(item) _old = atomic_load(head);                                      \
                do                                                                              \
                        (item)->next = _old;                                                    \
                while (!atomic_compare_exchange_weak((head), &_old, (item)));                   \
                _old == NULL;                                                                   \
        })

/* Takes a whole stack and reverses it into arrival order. */
#define STACK_TAKE(head)                                                                        \
        ({                                                                                      \
                __typeof__(atomic_load(head)) _p = atomic_exchange((head), NULL), _fifo = NULL; \
                while (_p) {                                                                    \
                        __typeof__(_p) _next = _p->next;                                        \
                        _p->next = _fifo;                                                       \
                        _fifo = _p;                                                             \
                        _p = _next;                                                             \
                }                                                                               \
                _fifo;                                                                          \
        })

int history_channel_init(HistoryChannel *c);   /* negative errno */
void history_channel_done(HistoryChannel *c);  /* the writer is gone: frees what is still queued */

/* Writer → loop. */
void history_channel_kick(HistoryChannel *c);
void history_channel_hand_back(HistoryChannel *c, Op *list); /* in the order given */
void history_channel_set_health(HistoryChannel *c, bool healthy);
void history_channel_finish_load(HistoryChannel *c, Op *op); /* wakes history_channel_wait_load() */

/* Loop → writer. */
void history_channel_wake_writer(HistoryChannel *c);
void history_channel_queue_op(HistoryChannel *c, Op *op);
void history_channel_wait_load(HistoryChannel *c, Op *op);

Op *history_op_free(Op *op);
void history_ops_free(Op *list);
DEFINE_TRIVIAL_CLEANUP_FUNC(Op *, history_op_free);

/* Loop thread: room for a row of size bytes (the struct and its strings). NULL: out of memory. */
EventRow *history_row_alloc(HistoryChannel *c, size_t size);
/* Either thread: gives back the rows from list up to (not including) end. */
void history_rows_release(EventRow *list, EventRow *end);
