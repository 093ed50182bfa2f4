/* SPDX-License-Identifier: MIT */
/* selector.h — which members of a member pool a request may take: labels it needs, labels it refuses, a
 * named member (SPEC §3.5); resolved against a pool's members and labels to a set of member indices. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "conf.h"
#include "macro.h"

/* What a request asks of the members it gets. Every term must hold for each member granted: "L" the member
 * carries label L, "!L" it does not. */
typedef struct Selector {
        char *const *terms;      /* NULL-terminated, or NULL */
        const char *member;      /* NULL: any member */
} Selector;

/* Terms a request may name (the lane's and the client's together). */
#define SELECTOR_TERMS_MAX 64

bool selector_is_empty(const Selector *s);
/* "L" or "!L" with L a conf_label_is_valid() name. */
bool selector_term_is_valid(const char *term);
/* A text equal for two selectors exactly when they name the same terms and member, whatever their order and
 * repetitions: the key that groups waiters asking the same thing. "" for the empty selector. Returns 0,
 * -ENOMEM. */
int selector_canon(const Selector *s, char **ret);

/* A set of member indices: one bit per member, ⌈n/64⌉ words. */
static inline size_t member_set_words(size_t n_members) {
        return (n_members + 63) / 64;
}
unsigned member_set_count(const uint64_t *set, size_t n_words);

/* The members of `members` (NULL-terminated) that `s` admits: a label no label of the pool names is carried
 * by none. Returns 0, -ENOMEM; *ret has member_set_words(strv_length(members)) words (at least one). Makes the
 * sets of member_sets_new() for this one call: what resolves selector after selector keeps those instead. */
int selector_resolve(const Selector *s, char *const *members, const PoolLabel *labels, size_t n_labels,
                     uint64_t **ret);

/* A pool's members and labels made into sets once per configuration, so that resolving a selector (at each
 * arrival) costs O(terms × members/64) and a binary search per term and for the named member, not a string
 * comparison per member and label member (10,000 members and a label of 5,000: 0.28 s an arrival). It
 * borrows `members` and `labels` (the names): they must outlive it, unchanged. Size: ⌈members/64⌉ words per
 * label that names a member. */
typedef struct MemberSets MemberSets;

/* Sets of `members` (NULL-terminated, or NULL: none) and `labels`. Names are compared as selector_resolve()
 * does: of two labels of one name the first counts, a member name listed twice is both members. Returns 0,
 * -ENOMEM. */
int member_sets_new(char *const *members, const PoolLabel *labels, size_t n_labels, MemberSets **ret);
MemberSets *member_sets_free(MemberSets *m);
DEFINE_TRIVIAL_CLEANUP_FUNC(MemberSets *, member_sets_free);
/* How many members `m` was made of (NULL: none). */
size_t member_sets_size(const MemberSets *m);
/* The index of the first member named by the len bytes at `name` (not NUL-terminated necessarily: a Redis reply's),
 * or -1: none (or `m` NULL). A binary search, where a scan of the members compares every name. */
ssize_t member_sets_find(const MemberSets *m, const char *name, size_t len);
/* selector_resolve() against the members and labels `m` was made of (NULL: no members). */
int member_sets_resolve(const MemberSets *m, const Selector *s, uint64_t **ret);
