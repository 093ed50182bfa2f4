/* SPDX-License-Identifier: MIT */
/* history-channel.c — owns what crosses between the loop and the writer: the lock-free stacks, the eventfds,
 * the ops, and the blocks decision rows are written into. */
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/mman.h>

#include "history-channel.h"

#define ROW_BLOCK_SIZE ((size_t) 256 * 1024)
/* Blocks kept for reuse (8 MiB); more are unmapped, after a burst. */
#define ROW_BLOCKS_SPARE_MAX 32

struct RowBlock {
        struct RowBlock *next; /* in HistoryChannel.spare_blocks, or the loop's own list */
        atomic_size_t refs;    /* rows not yet written, plus one while the loop still fills the block */
        size_t used;           /* loop thread only */
        HistoryChannel *channel;
        _Alignas(16) char data[];
};

#define ROW_BLOCK_DATA (ROW_BLOCK_SIZE - offsetof(RowBlock, data))

int history_channel_init(HistoryChannel *c) {
        pthread_condattr_t attr;

        *c = (HistoryChannel) { .wakeup_fd = -EBADF, .writer_fd = -EBADF };
        pthread_mutex_init(&c->mutex, NULL);
        pthread_condattr_init(&attr);
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        pthread_cond_init(&c->load_cond, &attr);
        pthread_condattr_destroy(&attr);

        c->wakeup_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (c->wakeup_fd < 0)
                return -errno;
        c->writer_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (c->writer_fd < 0)
                return -errno;
        return 0;
}

static void row_blocks_unmap(RowBlock *list) {
        while (list) {
                RowBlock *next = list->next;
                (void) munmap(list, ROW_BLOCK_SIZE);
                list = next;
        }
}

static void row_block_unref(RowBlock *b, size_t n) {
        HistoryChannel *c = b->channel;

        if (atomic_fetch_sub(&b->refs, n) != n)
                return;
        if (atomic_fetch_add(&c->n_spare_blocks, 1) >= ROW_BLOCKS_SPARE_MAX) {
                atomic_fetch_sub(&c->n_spare_blocks, 1);
                (void) munmap(b, ROW_BLOCK_SIZE);
                return;
        }
        (void) STACK_PUSH(&c->spare_blocks, b);
}

void history_channel_done(HistoryChannel *c) {
        /* Callbacks are not called any more: whoever waits on them is going away too. */
        history_ops_free(atomic_exchange(&c->ops, NULL));
        history_ops_free(atomic_exchange(&c->done, NULL));
        history_rows_release(atomic_exchange(&c->rows, NULL), NULL);
        if (c->block)
                row_block_unref(c->block, 1);
        row_blocks_unmap(c->spare);
        row_blocks_unmap(atomic_exchange(&c->spare_blocks, NULL));
        c->block = c->spare = NULL;
        c->wakeup_fd = safe_close(c->wakeup_fd);
        c->writer_fd = safe_close(c->writer_fd);
        pthread_cond_destroy(&c->load_cond);
        pthread_mutex_destroy(&c->mutex);
}

void history_channel_kick(HistoryChannel *c) {
        /* Cannot fail short of the counter overflowing, which would still leave the fd readable. */
        (void) eventfd_write(c->wakeup_fd, 1);
}

void history_channel_hand_back(HistoryChannel *c, Op *list) {
        Op *reversed = NULL;

        if (!list)
                return;
        /* Pushed newest first, so that the loop's take restores this order. */
        while (list) {
                Op *next = list->next;
                list->next = reversed;
                reversed = list;
                list = next;
        }
        while (reversed) {
                Op *next = reversed->next;
                (void) STACK_PUSH(&c->done, reversed);
                reversed = next;
        }
        history_channel_kick(c);
}

void history_channel_set_health(HistoryChannel *c, bool healthy) {
        if (atomic_load(&c->healthy) == healthy)
                return;
        atomic_store(&c->healthy, healthy);
        atomic_fetch_add(&c->epoch, 1);
        history_channel_kick(c);
}

void history_channel_finish_load(HistoryChannel *c, Op *op) {
        pthread_mutex_lock(&c->mutex);
        op->finished = true;
        pthread_cond_broadcast(&c->load_cond);
        pthread_mutex_unlock(&c->mutex);
}

/* One eventfd write per wakeup, not per push: while a wake is posted and the writer has not taken it,
 * whatever is pushed meanwhile goes with it (the writer takes the stacks after clearing the flag). Saves
 * the loop a write per grant while the writer is busy (measured: tests/bench/README.md, bench-pairs). */
void history_channel_wake_writer(HistoryChannel *c) {
        if (!atomic_exchange(&c->writer_woken, true))
                (void) eventfd_write(c->writer_fd, 1);
}

void history_channel_queue_op(HistoryChannel *c, Op *op) {
        (void) STACK_PUSH(&c->ops, op);
        history_channel_wake_writer(c);
}

void history_channel_wait_load(HistoryChannel *c, Op *op) {
        /* Blocking is fine at start: nothing else is served yet. */
        pthread_mutex_lock(&c->mutex);
        while (!op->finished)
                pthread_cond_wait(&c->load_cond, &c->mutex);
        pthread_mutex_unlock(&c->mutex);
}

Op *history_op_free(Op *op) {
        if (!op)
                return NULL;
        free(op->lease_id);
        free((char *) op->query.lane);
        free((char *) op->query.pool);
        free((char *) op->query.decision);
        json_decref(op->events);
        history_state_done(&op->state);
        return mfree(op);
}

void history_ops_free(Op *list) {
        while (list) {
                Op *next = list->next;
                history_op_free(list);
                list = next;
        }
}

EventRow *history_row_alloc(HistoryChannel *c, size_t size) {
        RowBlock *b = c->block;
        EventRow *e;

        size = (size + 15) & ~(size_t) 15;
        if (size > ROW_BLOCK_DATA / 16) {
                e = malloc(size);
                if (e)
                        e->block = NULL;
                return e;
        }
        if (!b || b->used + size > ROW_BLOCK_DATA) {
                if (b)
                        row_block_unref(b, 1); /* full: the last written row gives it back */
                b = c->block = NULL;
                if (!c->spare) {
                        c->spare = atomic_exchange(&c->spare_blocks, NULL);
                        for (RowBlock *k = c->spare; k; k = k->next)
                                atomic_fetch_sub(&c->n_spare_blocks, 1);
                }
                if (c->spare) {
                        b = c->spare;
                        c->spare = b->next;
                } else {
                        void *m = mmap(NULL, ROW_BLOCK_SIZE, PROT_READ | PROT_WRITE,
                                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
                        if (m == MAP_FAILED)
                                return NULL;
                        b = m;
                        b->channel = c;
                }
                atomic_init(&b->refs, 1);
                b->used = 0;
                c->block = b;
        }
        e = (EventRow *) (b->data + b->used);
        b->used += size;
        atomic_fetch_add(&b->refs, 1);
        e->block = b;
        return e;
}

/* One atomic operation per run of rows of the same block. */
void history_rows_release(EventRow *list, EventRow *end) {
        while (list != end) {
                EventRow *next = list->next;
                if (!list->block)
                        free(list);
                else {
                        RowBlock *b = list->block;
                        size_t n = 1;
                        for (; next != end && next->block == b; next = next->next)
                                n++;
                        row_block_unref(b, n);
                }
                list = next;
        }
}
