/* SPDX-License-Identifier: MIT */
#include "ring.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "macro.h"

#define RING_ALLOCATED_MIN 16

int ring_reserve(Ring *r, size_t n) {
        if (n <= r->allocated)
                return 0;
        n = MAX(n, MAX(r->allocated * 2, (size_t) RING_ALLOCATED_MIN));
        char *a = reallocarray(NULL, n, r->item_size);
        if (!a)
                return -ENOMEM;
        /* Unwrapped into the new array: the oldest item first. */
        for (size_t i = 0; i < r->n; i++)
                memcpy(a + i * r->item_size, ring_at(r, i), r->item_size);
        free(r->items);
        r->items = a;
        r->head = 0;
        r->allocated = n;
        return 0;
}

int ring_push(Ring *r, const void *item) {
        int k = ring_reserve(r, r->n + 1);
        if (k < 0)
                return k;
        memcpy(ring_at(r, r->n), item, r->item_size);
        r->n++;
        return 0;
}

bool ring_pop(Ring *r, void *ret) {
        if (r->n == 0)
                return false;
        memcpy(ret, ring_at(r, 0), r->item_size);
        r->head = (r->head + 1) % r->allocated;
        r->n--;
        return true;
}

void ring_filter(Ring *r, bool (*keep)(const void *item, void *userdata), void *userdata) {
        size_t kept = 0;
        for (size_t i = 0; i < r->n; i++) {
                void *item = ring_at(r, i);
                if (!keep(item, userdata))
                        continue;
                if (kept != i)
                        memcpy(ring_at(r, kept), item, r->item_size);
                kept++;
        }
        r->n = kept;
}

static void ring_swap(Ring *r, size_t i, size_t j) {
        char *a = ring_at(r, i), *b = ring_at(r, j);
        for (size_t k = 0; k < r->item_size; k++) {
                char t = a[k];
                a[k] = b[k];
                b[k] = t;
        }
}

static void ring_reverse(Ring *r, size_t from, size_t to) {
        while (from + 1 < to)
                ring_swap(r, from++, --to);
}

void ring_rotate(Ring *r, size_t from, size_t mid) {
        if (from > mid || mid > r->n)
                return; /* no such runs */
        /* Three reversals: no second array, so nothing to fail. */
        ring_reverse(r, from, mid);
        ring_reverse(r, mid, r->n);
        ring_reverse(r, from, r->n);
}

void ring_done(Ring *r) {
        r->items = mfree(r->items);
        r->head = r->n = r->allocated = 0;
}
