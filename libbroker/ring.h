/* SPDX-License-Identifier: MIT */
/* ring.h — a growable FIFO of fixed-size items (queued events and decisions): O(1) push and pop. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

typedef struct Ring {
        void *items;
        size_t item_size;
        size_t head, n, allocated;
} Ring;

#define RING_INIT(type) ((Ring) { .item_size = sizeof(type) })

/* Room for n items in all, so that pushes up to that count cannot fail: 0, or -ENOMEM (the ring as it was). */
int ring_reserve(Ring *r, size_t n);
/* Appends a copy of *item, the ring doubling when full: 0, or -ENOMEM (the ring as it was). */
int ring_push(Ring *r, const void *item);
/* Copies the oldest item to *ret and drops it; false when the ring is empty. */
bool ring_pop(Ring *r, void *ret);
/* Keeps the items keep() says yes to, in their order. */
void ring_filter(Ring *r, bool (*keep)(const void *item, void *userdata), void *userdata);
/* Moves the items from the mid-th oldest on ahead of those from the from-th (from ≤ mid ≤ r->n), each run in its
 * order: [from, mid) and [mid, n) change places. In place, O(n − from). */
void ring_rotate(Ring *r, size_t from, size_t mid);
/* Frees the items' array (not what they point to); the ring is empty and usable again. */
void ring_done(Ring *r);

/* The i-th oldest item, i < r->n: valid until the next push. */
static inline void *ring_at(const Ring *r, size_t i) {
        return (char *) r->items + (r->head + i) % r->allocated * r->item_size;
}
