/* SPDX-License-Identifier: MIT */
/* test-heap.c — the deadline heap against a brute-force model. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "heap.h"
#include "macro.h"

typedef struct Item {
        HeapNode node;
        usec_t key;
        uint64_t order;
        bool queued;
} Item;

static void test_pops_in_key_then_insertion_order(void **state) {
        Heap h;
        Item items[6] = {};
        const usec_t keys[] = { 5, 3, 5, 1, 3, 5 };
        heap_init(&h);
        for (size_t i = 0; i < 6; i++) {
                heap_node_init(&items[i].node);
                assert_int_equal(heap_push(&h, &items[i].node, keys[i]), 0);
        }
        const size_t expect[] = { 3, 1, 4, 0, 2, 5 };
        for (size_t i = 0; i < 6; i++) {
                HeapNode *n = heap_pop(&h);
                assert_ptr_equal(n, &items[expect[i]].node);
                assert_false(heap_node_is_queued(n));
        }
        assert_null(heap_pop(&h));
        heap_done(&h);
}

static void test_remove_anywhere_keeps_order(void **state) {
        enum { N = 2000 };
        Heap h;
        Item *items = calloc(N, sizeof(Item));
        uint64_t s = 1;
        heap_init(&h);
        for (size_t i = 0; i < N; i++) {
                s = s * 6364136223846793005ULL + 1442695040888963407ULL;
                items[i].key = (s >> 33) % 500;
                heap_node_init(&items[i].node);
                assert_int_equal(heap_push(&h, &items[i].node, items[i].key), 0);
                items[i].queued = true;
        }
        for (size_t i = 0; i < N; i += 3) {
                heap_remove(&h, &items[i].node);
                items[i].queued = false;
                heap_remove(&h, &items[i].node); /* removing twice is harmless */
        }
        usec_t last = 0;
        size_t popped = 0;
        for (HeapNode *n; (n = heap_pop(&h)); popped++) {
                Item *it = (Item *) n;
                assert_true(it->queued);
                assert_true(it->key >= last);
                last = it->key;
        }
        assert_int_equal(popped, N - DIV_ROUND_UP(N, 3));
        heap_done(&h);
        free(items);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_pops_in_key_then_insertion_order),
                cmocka_unit_test(test_remove_anywhere_keeps_order),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
