/* SPDX-License-Identifier: MIT */
/* test-ring.c — the FIFO ring against a plain array model, across wrap-arounds and growth. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "macro.h"
#include "ring.h"

typedef struct Item {
        uint64_t value;
        char pad[13]; /* an item size that is not a power of two */
} Item;

static bool is_odd(const void *item, void *userdata) {
        (void) userdata;
        return ((const Item *) item)->value % 2 == 1;
}

/* Pushes and pops at random against a model that never wraps: every pop is the oldest item, every
 * ring_at() the model's item at that place, whatever the head and the growth did. */
static void test_fifo_against_model(void **state) {
        enum { STEPS = 20000 };
        Ring r = RING_INIT(Item);
        uint64_t *model = calloc(STEPS, sizeof(uint64_t));
        size_t first = 0, last = 0; /* the model's live items: [first, last) */
        uint64_t s = 7, next = 0;
        assert_non_null(model);
        for (size_t step = 0; step < STEPS; step++) {
                s = s * 6364136223846793005ULL + 1442695040888963407ULL;
                /* Phases that grow, then drain: the head wraps at several sizes. */
                bool push = (s >> 33) % 100 < ((step / 2000) % 2 == 0 ? 70 : 35);
                if (push) {
                        Item it = { .value = next };
                        assert_int_equal(ring_push(&r, &it), 0);
                        model[last++] = next++;
                } else {
                        Item it;
                        bool got = ring_pop(&r, &it);
                        assert_int_equal(got, first < last);
                        if (got)
                                assert_int_equal(it.value, model[first++]);
                }
                assert_int_equal(r.n, last - first);
                if (r.n > 0) {
                        size_t i = (s >> 20) % r.n;
                        assert_int_equal(((Item *) ring_at(&r, i))->value, model[first + i]);
                }
        }
        ring_done(&r);
        assert_int_equal(r.n, 0);
        assert_false(ring_pop(&r, &(Item) {}));
        free(model);
}

/* What ring_reserve() promises is room: pushes up to that count do not move the items. */
static void test_reserve_then_push_does_not_grow(void **state) {
        Ring r = RING_INIT(Item);
        for (uint64_t i = 0; i < 5; i++) {
                assert_int_equal(ring_push(&r, &(Item) { .value = i }), 0);
                Item it;
                assert_true(ring_pop(&r, &it)); /* move the head off 0 */
        }
        assert_int_equal(ring_reserve(&r, 100), 0);
        void *items = r.items;
        size_t allocated = r.allocated;
        assert_true(allocated >= 100);
        for (uint64_t i = 0; i < 100; i++)
                assert_int_equal(ring_push(&r, &(Item) { .value = i }), 0);
        assert_ptr_equal(r.items, items);
        assert_int_equal(r.allocated, allocated);
        assert_int_equal(ring_reserve(&r, 10), 0); /* less than it has: nothing changes */
        assert_ptr_equal(r.items, items);
        for (uint64_t i = 0; i < 100; i++)
                assert_int_equal(((Item *) ring_at(&r, i))->value, i);
        ring_done(&r);
}

/* ring_filter() keeps its survivors in order across the wrap, and the ring goes on from there. */
static void test_filter_keeps_order_across_wrap(void **state) {
        Ring r = RING_INIT(Item);
        assert_int_equal(ring_reserve(&r, 16), 0);
        size_t allocated = r.allocated;
        for (uint64_t i = 0; i < allocated - 3; i++)
                assert_int_equal(ring_push(&r, &(Item) { .value = 1000 + i }), 0);
        for (size_t i = 0; i < allocated - 6; i++)
                assert_true(ring_pop(&r, &(Item) {}));
        for (uint64_t i = 0; i < 9; i++) /* wraps past the end of the array */
                assert_int_equal(ring_push(&r, &(Item) { .value = i }), 0);
        assert_int_equal(r.allocated, allocated);
        assert_true(r.head + r.n > r.allocated);
        /* Now: the last three of the first run (1000 + allocated − 6 …), then 0 … 8. */
        ring_filter(&r, is_odd, NULL);
        uint64_t expect[16];
        size_t n = 0;
        for (uint64_t v = 1000 + allocated - 6; v < 1000 + allocated - 3; v++)
                if (v % 2 == 1)
                        expect[n++] = v;
        for (uint64_t v = 1; v < 9; v += 2)
                expect[n++] = v;
        assert_int_equal(r.n, n);
        assert_int_equal(ring_push(&r, &(Item) { .value = 99 }), 0);
        expect[n++] = 99;
        for (size_t i = 0; i < n; i++) {
                Item it;
                assert_true(ring_pop(&r, &it));
                assert_int_equal(it.value, expect[i]);
        }
        assert_false(ring_pop(&r, &(Item) {}));
        ring_done(&r);
}

/* ring_rotate() swaps two adjacent runs, each kept in order, across the wrap; what is before them stays. */
static void test_rotate_swaps_two_runs_across_wrap(void **state) {
        Ring r = RING_INIT(Item);
        assert_int_equal(ring_reserve(&r, 8), 0);
        size_t allocated = r.allocated;
        for (uint64_t i = 0; i < allocated - 2; i++)
                assert_int_equal(ring_push(&r, &(Item) { .value = 100 }), 0);
        for (size_t i = 0; i < allocated - 3; i++)
                assert_true(ring_pop(&r, &(Item) {}));
        /* Now: one 100, then 0 … 6, wrapping past the end of the array. */
        for (uint64_t i = 0; i < 7; i++)
                assert_int_equal(ring_push(&r, &(Item) { .value = i }), 0);
        assert_int_equal(r.allocated, allocated);
        assert_true(r.head + r.n > r.allocated);
        ring_rotate(&r, 1, 4); /* [0 1 2] and [3 4 5 6] change places */
        static const uint64_t expect[] = { 100, 3, 4, 5, 6, 0, 1, 2 };
        for (size_t i = 0; i < ELEMENTSOF(expect); i++) {
                Item it;
                assert_true(ring_pop(&r, &it));
                assert_int_equal(it.value, expect[i]);
        }
        assert_false(ring_pop(&r, &(Item) {}));
        ring_rotate(&r, 0, 0); /* empty: nothing */
        ring_done(&r);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_fifo_against_model),
                cmocka_unit_test(test_reserve_then_push_does_not_grow),
                cmocka_unit_test(test_filter_keeps_order_across_wrap),
                cmocka_unit_test(test_rotate_swaps_two_runs_across_wrap),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
