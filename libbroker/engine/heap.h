/* SPDX-License-Identifier: MIT */
/* heap.h — an intrusive binary min-heap of deadlines: O(log n) insert, remove-anywhere and pop. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "time-util.h"

/* Embedded in the object that has a deadline; ties pop in insertion order (seq), so that
 * same-instant expiries are applied in the order the waiters arrived. */
typedef struct HeapNode {
        usec_t key;
        uint64_t seq;
        size_t index; /* position in the heap, or HEAP_INDEX_NONE */
} HeapNode;

#define HEAP_INDEX_NONE ((size_t) -1)

typedef struct Heap {
        HeapNode **nodes;
        size_t n, allocated;
        uint64_t next_seq;
} Heap;

static inline void heap_node_init(HeapNode *n) {
        n->index = HEAP_INDEX_NONE;
}

static inline bool heap_node_is_queued(const HeapNode *n) {
        return n->index != HEAP_INDEX_NONE;
}

void heap_init(Heap *h);
/* Frees the heap's array; the nodes' owners are the caller's to free. */
void heap_done(Heap *h);
/* Returns 0 or -ENOMEM. */
int heap_push(Heap *h, HeapNode *n, usec_t key);
void heap_remove(Heap *h, HeapNode *n);
static inline HeapNode *heap_peek(const Heap *h) {
        return h->n > 0 ? h->nodes[0] : NULL;
}
HeapNode *heap_pop(Heap *h);
