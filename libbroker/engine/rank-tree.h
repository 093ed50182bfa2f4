/* SPDX-License-Identifier: MIT */
/* rank-tree.h — an intrusive order-statistic treap: a waiter's place in its queue in O(log n),
 * so position updates never walk the queue. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* Ordered by (major, minor), both ascending; keys are unique. */
typedef struct RankNode {
        struct RankNode *left, *right;
        size_t size;      /* nodes in this subtree */
        uint64_t weight;  /* treap priority, derived from the key: deterministic shape */
        int64_t major;
        uint64_t minor;
} RankNode;

typedef struct RankTree {
        RankNode *root;
} RankTree;

void rank_tree_insert(RankTree *t, RankNode *n, int64_t major, uint64_t minor);
void rank_tree_remove(RankTree *t, RankNode *n);
/* How many nodes sort before n (0 for the first). */
size_t rank_tree_rank(const RankTree *t, const RankNode *n);
/* The node of rank i (0: the first), or NULL past the end: an in-order walk in O(log n) a step. */
RankNode *rank_tree_nth(const RankTree *t, size_t i);

static inline size_t rank_tree_size(const RankTree *t) {
        return t->root ? t->root->size : 0;
}
