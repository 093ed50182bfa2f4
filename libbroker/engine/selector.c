/* SPDX-License-Identifier: MIT */
/* selector.c — a request's labels and named member, resolved to the members that satisfy them. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "macro.h"
#include "pool.h"
#include "selector.h"
#include "strv.h"

bool selector_is_empty(const Selector *s) {
        return !s || ((!s->terms || !s->terms[0]) && !s->member);
}

bool selector_term_is_valid(const char *term) {
        return term && conf_label_is_valid(term[0] == '!' ? term + 1 : term);
}

int selector_canon(const Selector *s, char **ret) {
        /* Terms are labels and "!" labels, members are names: neither has ' ' or '@'. */
        _cleanup_free_ char *terms = NULL;
        int r = strv_join_sorted(s ? s->terms : NULL, " ", &terms);
        if (r < 0)
                return r;
        if (!s || !s->member) {
                *ret = TAKE_PTR(terms);
                return 0;
        }
        char *c;
        if (asprintf(&c, "%s%s@%s", terms, terms[0] ? " " : "", s->member) < 0)
                return -ENOMEM;
        *ret = c;
        return 0;
}

unsigned member_set_count(const uint64_t *set, size_t n_words) {
        unsigned n = 0;
        for (size_t i = 0; i < n_words; i++)
                n += (unsigned) __builtin_popcountll(set[i]);
        return n;
}

static const PoolLabel *label_find(const PoolLabel *labels, size_t n_labels, const char *name) {
        for (size_t i = 0; i < n_labels; i++)
                if (streq(labels[i].name, name))
                        return labels + i;
        return NULL;
}

int selector_resolve(const Selector *s, char *const *members, const PoolLabel *labels, size_t n_labels,
                     uint64_t **ret) {
        size_t n = strv_length(members), words = MAX(member_set_words(n), (size_t) 1);
        uint64_t *set = calloc(words, sizeof(uint64_t));
        if (!set)
                return -ENOMEM;

        /* O(members × terms × label size): at submit and reload only, never per grant. */
        for (size_t i = 0; i < n; i++) {
                bool ok = !s || !s->member || streq(s->member, members[i]);
                for (size_t t = 0; ok && s && s->terms && s->terms[t]; t++) {
                        bool negate = s->terms[t][0] == '!';
                        const PoolLabel *l = label_find(labels, n_labels, s->terms[t] + negate);
                        bool carries = l && strv_contains(l->members, members[i]);
                        ok = carries != negate;
                }
                if (ok)
                        set[i / 64] |= UINT64_C(1) << (i % 64);
        }
        *ret = set;
        return 0;
}

int pool_selector_capacity(const Pool *p, const Selector *s) {
        if (selector_is_empty(s))
                return (int) p->limit;
        if (!p->members)
                return 0;
        _cleanup_free_ uint64_t *set = NULL;
        if (selector_resolve(s, p->members, p->labels, p->n_labels, &set) < 0)
                return -ENOMEM;
        return (int) member_set_count(set, member_set_words(strv_length(p->members)));
}

void pool_labels_free(PoolLabel *labels, size_t n_labels) {
        for (size_t i = 0; i < n_labels; i++) {
                free(labels[i].name);
                strv_free(labels[i].members);
        }
        free(labels);
}

int pool_labels_copy(const PoolLabel *labels, size_t n_labels, PoolLabel **ret) {
        PoolLabel *copy = NULL;

        if (n_labels > 0) {
                copy = calloc(n_labels, sizeof(PoolLabel));
                if (!copy)
                        return -ENOMEM;
                for (size_t i = 0; i < n_labels; i++) {
                        copy[i].name = strdup(labels[i].name);
                        copy[i].members = labels[i].members ? strv_copy(labels[i].members) : NULL;
                        if (!copy[i].name || (labels[i].members && !copy[i].members)) {
                                pool_labels_free(copy, n_labels);
                                return -ENOMEM;
                        }
                }
        }
        *ret = copy;
        return 0;
}

void pool_labels_replace(Pool *p, PoolLabel *labels, size_t n_labels) {
        pool_labels_free(p->labels, p->n_labels);
        p->labels = labels;
        p->n_labels = n_labels;
}
