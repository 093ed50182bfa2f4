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

struct MemberSets {
        char *const *members;     /* borrowed */
        size_t n_members, n_words;
        size_t *member_order;     /* indices of members by name (then index) */
        const PoolLabel *labels;  /* borrowed */
        size_t n_labels;          /* in label_order: the labels that name a member, the first of each name */
        size_t *label_order;      /* indices of labels by name */
        uint64_t *sets;           /* label_order[i]'s members: n_words words at sets + i × n_words */
};

/* Sets the bits of the members named `name` (usually one, or none). */
static void member_bits(const MemberSets *m, const char *name, uint64_t *set) {
        for (size_t k = strv_order_lower_bound(m->member_order, m->n_members, m->members, sizeof(char *), name);
             k < m->n_members && streq(m->members[m->member_order[k]], name); k++)
                set[m->member_order[k] / 64] |= UINT64_C(1) << (m->member_order[k] % 64);
}

/* The members carrying the label, or NULL: no label of that name names a member. */
static const uint64_t *label_set(const MemberSets *m, const char *name) {
        size_t k = m->n_labels > 0 ? strv_order_lower_bound(m->label_order, m->n_labels, &m->labels[0].name,
                                                            sizeof(PoolLabel), name)
                                   : 0;
        return k < m->n_labels && streq(m->labels[m->label_order[k]].name, name) ? m->sets + k * m->n_words : NULL;
}

MemberSets *member_sets_free(MemberSets *m) {
        if (!m)
                return NULL;
        free(m->member_order);
        free(m->label_order);
        free(m->sets);
        return mfree(m);
}

int member_sets_new(char *const *members, const PoolLabel *labels, size_t n_labels, MemberSets **ret) {
        _cleanup_(member_sets_freep) MemberSets *m = calloc(1, sizeof(MemberSets));
        if (!m)
                return -ENOMEM;
        m->members = members;
        m->n_members = strv_length(members);
        m->n_words = member_set_words(m->n_members);
        m->labels = labels;
        m->member_order = calloc(MAX(m->n_members, (size_t) 1), sizeof(size_t));
        m->label_order = calloc(MAX(n_labels, (size_t) 1), sizeof(size_t));
        if (!m->member_order || !m->label_order)
                return -ENOMEM;
        for (size_t i = 0; i < m->n_members; i++)
                m->member_order[i] = i;
        strv_order_sort(m->member_order, m->n_members, members, sizeof(char *));

        for (size_t i = 0; i < n_labels; i++)
                m->label_order[i] = i;
        if (n_labels > 0)
                strv_order_sort(m->label_order, n_labels, &labels[0].name, sizeof(PoolLabel));
        size_t n_named = 0;
        for (size_t k = 0; k < n_labels; k++)
                n_named += labels[k].members && labels[k].members[0];
        m->sets = calloc(MAX(n_named * m->n_words, (size_t) 1), sizeof(uint64_t));
        if (!m->sets)
                return -ENOMEM;
        /* Of two labels of one name the first counts (it sorts first). One that lists no member is carried by
         * none, as one that does not exist: it needs no set. */
        const char *previous = NULL;
        for (size_t k = 0; k < n_labels; k++) {
                const PoolLabel *l = labels + m->label_order[k];
                bool again = previous && streq(previous, l->name);
                previous = l->name;
                if (again || !l->members || !l->members[0])
                        continue;
                m->label_order[m->n_labels] = m->label_order[k];
                uint64_t *set = m->sets + m->n_labels++ * m->n_words;
                for (size_t j = 0; l->members[j]; j++)
                        member_bits(m, l->members[j], set);
        }
        *ret = TAKE_PTR(m);
        return 0;
}

ssize_t member_sets_find(const MemberSets *m, const char *name, size_t len) {
        if (!m || m->n_members == 0 || !name)
                return -1;
        size_t k = strv_order_lower_bound_n(m->member_order, m->n_members, m->members, sizeof(char *), name, len);
        if (k == m->n_members || strv_compare_n(m->members[m->member_order[k]], name, len) != 0)
                return -1;
        return (ssize_t) m->member_order[k]; /* the first of that name: the order is by name, then index */
}

size_t member_sets_size(const MemberSets *m) {
        return m ? m->n_members : 0;
}

int member_sets_resolve(const MemberSets *m, const Selector *s, uint64_t **ret) {
        size_t n = m ? m->n_members : 0, words = MAX(member_set_words(n), (size_t) 1);
        uint64_t *set = calloc(words, sizeof(uint64_t));
        if (!set)
                return -ENOMEM;
        if (n == 0) {
                *ret = set;
                return 0;
        }

        if (s && s->member)
                member_bits(m, s->member, set);
        else {
                memset(set, 0xff, n / 64 * sizeof(uint64_t));
                if (n % 64 != 0)
                        set[n / 64] = (UINT64_C(1) << (n % 64)) - 1;
        }
        for (size_t t = 0; s && s->terms && s->terms[t]; t++) {
                bool negate = s->terms[t][0] == '!';
                const uint64_t *l = label_set(m, s->terms[t] + negate);
                if (!l && negate)
                        continue; /* carried by none: every member lacks it */
                if (!l) {
                        memset(set, 0, words * sizeof(uint64_t));
                        break;
                }
                for (size_t w = 0; w < m->n_words; w++)
                        set[w] &= negate ? ~l[w] : l[w];
        }
        *ret = set;
        return 0;
}

int selector_resolve(const Selector *s, char *const *members, const PoolLabel *labels, size_t n_labels,
                     uint64_t **ret) {
        _cleanup_(member_sets_freep) MemberSets *m = NULL;
        int r = member_sets_new(members, labels, n_labels, &m);
        if (r < 0)
                return r;
        return member_sets_resolve(m, s, ret);
}

int pool_selector_capacity(const Pool *p, const Selector *s) {
        if (selector_is_empty(s))
                return (int) p->limit;
        if (!p->members)
                return 0;
        _cleanup_free_ uint64_t *set = NULL;
        if (member_sets_resolve(p->member_sets, s, &set) < 0)
                return -ENOMEM;
        return (int) member_set_count(set, member_set_words(member_sets_size(p->member_sets)));
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

void pool_members_replace(Pool *p, char **members, PoolLabel *labels, size_t n_labels, MemberSets *sets) {
        /* The sets first: they borrow the names. */
        member_sets_free(p->member_sets);
        p->member_sets = sets;
        pool_labels_free(p->labels, p->n_labels);
        p->labels = labels;
        p->n_labels = n_labels;
        strv_free(p->members);
        p->members = members;
}
