/* SPDX-License-Identifier: MIT */
/* test-rank-tree.c — ranks in the order-statistic treap against a sorted array. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "rank-tree.h"

typedef struct Item {
        RankNode node;
        int64_t major;
        uint64_t minor;
        bool in;
} Item;

static size_t brute_rank(const Item *items, size_t n, const Item *x) {
        size_t r = 0;
        for (size_t i = 0; i < n; i++)
                if (items[i].in && (items[i].major < x->major || (items[i].major == x->major && items[i].minor < x->minor)))
                        r++;
        return r;
}

static void test_rank_matches_sorted_order_under_churn(void **state) {
        enum { N = 1500 };
        RankTree t = {};
        Item *items = calloc(N, sizeof(Item));
        uint64_t s = 3;
        for (size_t i = 0; i < N; i++) {
                s = s * 6364136223846793005ULL + 1442695040888963407ULL;
                items[i].major = -(int64_t) ((s >> 40) % 4); /* a few priorities */
                items[i].minor = i;
                rank_tree_insert(&t, &items[i].node, items[i].major, items[i].minor);
                items[i].in = true;
        }
        for (size_t i = 0; i < N; i += 2) {
                rank_tree_remove(&t, &items[i].node);
                items[i].in = false;
        }
        assert_int_equal(rank_tree_size(&t), N / 2);
        for (size_t i = 1; i < N; i += 7)
                assert_int_equal(rank_tree_rank(&t, &items[i].node), brute_rank(items, N, &items[i]));
        /* nth() is rank()'s inverse: an in-order walk visits every node once, in key order. */
        for (size_t i = 1; i < N; i += 2)
                assert_ptr_equal(rank_tree_nth(&t, brute_rank(items, N, &items[i])), &items[i].node);
        assert_null(rank_tree_nth(&t, N / 2));
        free(items);
}

static void test_first_node_has_rank_zero(void **state) {
        RankTree t = {};
        Item a = {}, b = {};
        rank_tree_insert(&t, &b.node, 0, 2);
        rank_tree_insert(&t, &a.node, -1, 9);
        assert_int_equal(rank_tree_rank(&t, &a.node), 0);
        assert_int_equal(rank_tree_rank(&t, &b.node), 1);
        rank_tree_remove(&t, &a.node);
        assert_int_equal(rank_tree_rank(&t, &b.node), 0);
        assert_ptr_equal(rank_tree_nth(&t, 0), &b.node);
        assert_null(rank_tree_nth(&t, 1));
        rank_tree_remove(&t, &b.node);
        assert_null(rank_tree_nth(&t, 0));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_rank_matches_sorted_order_under_churn),
                cmocka_unit_test(test_first_node_has_rank_zero),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
