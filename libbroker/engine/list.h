/* SPDX-License-Identifier: MIT */
/* list.h — intrusive doubly linked lists: O(1) append and unlink from anywhere, no allocation. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

typedef struct ListNode {
        struct ListNode *prev, *next;
} ListNode;

/* A list is a sentinel node; an empty list points at itself. */
typedef ListNode List;

static inline void list_init(List *l) {
        l->prev = l->next = l;
}

static inline bool list_is_empty(const List *l) {
        return l->next == l;
}

static inline void list_append(List *l, ListNode *n) {
        n->prev = l->prev;
        n->next = l;
        l->prev->next = n;
        l->prev = n;
}

static inline void list_unlink(ListNode *n) {
        n->prev->next = n->next;
        n->next->prev = n->prev;
        n->prev = n->next = NULL;
}

static inline ListNode *list_first(const List *l) {
        return list_is_empty(l) ? NULL : l->next;
}

static inline bool list_node_is_linked(const ListNode *n) {
        return n->next != NULL;
}

#define list_foreach(n, l) for (ListNode *n = (l)->next; n != (l); n = n->next)
/* For loops that may unlink the node they are on (and only that one). */
#define list_foreach_safe(n, l) \
        for (ListNode *n = (l)->next, *n##_next = n->next; n != (l); n = n##_next, n##_next = n->next)
