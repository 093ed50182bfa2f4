/* SPDX-License-Identifier: MIT */
#include <stdbool.h>

#include "rank-tree.h"

static size_t size_of(const RankNode *n) {
        return n ? n->size : 0;
}

static void update(RankNode *n) {
        n->size = 1 + size_of(n->left) + size_of(n->right);
}

static bool key_less(int64_t major, uint64_t minor, const RankNode *n) {
        return major < n->major || (major == n->major && minor < n->minor);
}

/* splitmix64 of the key: a good spread, and the same queue always has the same shape. */
static uint64_t weight_of(int64_t major, uint64_t minor) {
        uint64_t z = (uint64_t) major * 0x9e3779b97f4a7c15ULL + minor + 0x9e3779b97f4a7c15ULL;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
}

/* Splits t into nodes before (major, minor) and nodes at or after it. */
static void split(RankNode *t, int64_t major, uint64_t minor, RankNode **ret_left, RankNode **ret_right) {
        if (!t) {
                *ret_left = *ret_right = NULL;
                return;
        }
        if (key_less(t->major, t->minor, &(RankNode) { .major = major, .minor = minor })) {
                split(t->right, major, minor, &t->right, ret_right);
                *ret_left = t;
        } else {
                split(t->left, major, minor, ret_left, &t->left);
                *ret_right = t;
        }
        update(t);
}

static RankNode *merge(RankNode *a, RankNode *b) {
        if (!a)
                return b;
        if (!b)
                return a;
        if (a->weight > b->weight) {
                a->right = merge(a->right, b);
                update(a);
                return a;
        }
        b->left = merge(a, b->left);
        update(b);
        return b;
}

static RankNode *insert(RankNode *t, RankNode *n) {
        if (!t)
                return n;
        if (n->weight > t->weight) {
                split(t, n->major, n->minor, &n->left, &n->right);
                update(n);
                return n;
        }
        if (key_less(n->major, n->minor, t))
                t->left = insert(t->left, n);
        else
                t->right = insert(t->right, n);
        update(t);
        return t;
}

void rank_tree_insert(RankTree *t, RankNode *n, int64_t major, uint64_t minor) {
        *n = (RankNode) { .size = 1, .weight = weight_of(major, minor), .major = major, .minor = minor };
        t->root = insert(t->root, n);
}

static RankNode *remove_node(RankNode *t, const RankNode *n) {
        if (t == n)
                return merge(t->left, t->right);
        if (key_less(n->major, n->minor, t))
                t->left = remove_node(t->left, n);
        else
                t->right = remove_node(t->right, n);
        update(t);
        return t;
}

void rank_tree_remove(RankTree *t, RankNode *n) {
        t->root = remove_node(t->root, n);
        n->left = n->right = NULL;
        n->size = 0;
}

size_t rank_tree_rank(const RankTree *t, const RankNode *n) {
        size_t rank = 0;
        for (const RankNode *p = t->root; p;) {
                if (p == n)
                        return rank + size_of(p->left);
                if (key_less(n->major, n->minor, p))
                        p = p->left;
                else {
                        rank += size_of(p->left) + 1;
                        p = p->right;
                }
        }
        return rank;
}

RankNode *rank_tree_nth(const RankTree *t, size_t i) {
        for (RankNode *p = t->root; p;) {
                size_t left = size_of(p->left);
                if (i == left)
                        return p;
                if (i < left)
                        p = p->left;
                else {
                        i -= left + 1;
                        p = p->right;
                }
        }
        return NULL;
}
