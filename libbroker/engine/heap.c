/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>

#include "heap.h"

static bool node_less(const HeapNode *a, const HeapNode *b) {
        return a->key < b->key || (a->key == b->key && a->seq < b->seq);
}

static void heap_set(Heap *h, size_t i, HeapNode *n) {
        h->nodes[i] = n;
        n->index = i;
}

static void sift_up(Heap *h, size_t i) {
        HeapNode *n = h->nodes[i];
        while (i > 0) {
                size_t parent = (i - 1) / 2;
                if (!node_less(n, h->nodes[parent]))
                        break;
                heap_set(h, i, h->nodes[parent]);
                i = parent;
        }
        heap_set(h, i, n);
}

static void sift_down(Heap *h, size_t i) {
        HeapNode *n = h->nodes[i];
        for (;;) {
                size_t child = 2 * i + 1;
                if (child >= h->n)
                        break;
                if (child + 1 < h->n && node_less(h->nodes[child + 1], h->nodes[child]))
                        child++;
                if (!node_less(h->nodes[child], n))
                        break;
                heap_set(h, i, h->nodes[child]);
                i = child;
        }
        heap_set(h, i, n);
}

void heap_init(Heap *h) {
        *h = (Heap) {};
}

void heap_done(Heap *h) {
        /* The nodes are not touched: their owners may be freed already. */
        free(h->nodes);
        *h = (Heap) {};
}

int heap_push(Heap *h, HeapNode *n, usec_t key) {
        if (h->n == h->allocated) {
                size_t allocated = h->allocated ? h->allocated * 2 : 16;
                HeapNode **nodes = reallocarray(h->nodes, allocated, sizeof(HeapNode *));
                if (!nodes)
                        return -ENOMEM;
                h->nodes = nodes;
                h->allocated = allocated;
        }
        n->key = key;
        n->seq = h->next_seq++;
        h->nodes[h->n] = n;
        n->index = h->n++;
        sift_up(h, n->index);
        return 0;
}

void heap_remove(Heap *h, HeapNode *n) {
        size_t i = n->index;
        if (i == HEAP_INDEX_NONE)
                return;
        n->index = HEAP_INDEX_NONE;
        h->n--;
        if (i == h->n)
                return;
        /* The last node fills the hole and moves whichever way restores the order. */
        heap_set(h, i, h->nodes[h->n]);
        if (i > 0 && node_less(h->nodes[i], h->nodes[(i - 1) / 2]))
                sift_up(h, i);
        else
                sift_down(h, i);
}

HeapNode *heap_pop(Heap *h) {
        HeapNode *n = heap_peek(h);
        if (n)
                heap_remove(h, n);
        return n;
}
