/* SPDX-License-Identifier: MIT */
/* test-selector.c — a request's labels and member: their canonical text and the members they admit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "selector.h"
#include "strv.h"

static void assert_canon(const Selector *s, const char *want) {
        char *c = NULL;
        assert_int_equal(selector_canon(s, &c), 0);
        assert_string_equal(c, want);
        free(c);
}

static void test_canon_ignores_order_and_repetition(void **state) {
        assert_canon(NULL, "");
        assert_canon(&(Selector) {}, "");
        assert_canon(&(Selector) { .terms = (char *[]) { "usb3", "arm64", "usb3", NULL } }, "arm64 usb3");
        assert_canon(&(Selector) { .terms = (char *[]) { "!flaky", NULL }, .member = "rig-c" }, "!flaky @rig-c");
        assert_canon(&(Selector) { .member = "rig-c" }, "@rig-c");
}

static void test_terms_are_labels_or_their_negation(void **state) {
        assert_true(selector_term_is_valid("arm64"));
        assert_true(selector_term_is_valid("!usb_3.x-y"));
        assert_false(selector_term_is_valid(""));
        assert_false(selector_term_is_valid("!"));
        assert_false(selector_term_is_valid("!!a"));
        assert_false(selector_term_is_valid("Arm64"));
        assert_false(selector_term_is_valid("a b"));
        assert_false(selector_term_is_valid(NULL));
}

static void test_resolve(void **state) {
        char *members[] = { "a", "b", "c", "d", NULL };
        PoolLabel labels[] = {
                { .name = "arm64", .members = (char *[]) { "a", "b", NULL } },
                { .name = "usb3", .members = (char *[]) { "b", "c", NULL } },
                { .name = "none", .members = NULL },
        };
        const struct {
                Selector s;
                uint64_t want;
        } cases[] = {
                { {}, 0xf },
                { { .terms = (char *[]) { "arm64", NULL } }, 0x3 },
                { { .terms = (char *[]) { "arm64", "usb3", NULL } }, 0x2 },
                { { .terms = (char *[]) { "!arm64", NULL } }, 0xc },
                { { .terms = (char *[]) { "!none", NULL } }, 0xf },
                { { .terms = (char *[]) { "none", NULL } }, 0x0 },
                { { .terms = (char *[]) { "gpu", NULL } }, 0x0 },   /* a label no member carries */
                { { .terms = (char *[]) { "!gpu", NULL } }, 0xf },
                { { .member = "c" }, 0x4 },
                { { .member = "c", .terms = (char *[]) { "arm64", NULL } }, 0x0 },
                { { .member = "z" }, 0x0 },
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
                uint64_t *set = NULL;
                assert_int_equal(selector_resolve(&cases[i].s, members, labels, 3, &set), 0);
                assert_int_equal(set[0], cases[i].want);
                assert_int_equal(member_set_count(set, 1), __builtin_popcountll(cases[i].want));
                free(set);
        }
}

/* The members `s` admits as selector_resolve() found them before member sets: name by name, for each member
 * each term's label (the first of its name) searched for it. */
static bool reference_admits(const Selector *s, char *const *members, size_t i, const PoolLabel *labels,
                             size_t n_labels) {
        if (s && s->member && strcmp(s->member, members[i]) != 0)
                return false;
        for (size_t t = 0; s && s->terms && s->terms[t]; t++) {
                bool negate = s->terms[t][0] == '!', carries = false;
                for (size_t l = 0; l < n_labels; l++)
                        if (strcmp(labels[l].name, s->terms[t] + negate) == 0) {
                                carries = strv_contains(labels[l].members, members[i]);
                                break;
                        }
                if (carries == negate)
                        return false;
        }
        return true;
}

static uint64_t rng = 0x5eed;
static uint64_t rnd(void) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        return rng;
}

static void assert_resolves_as_reference(const MemberSets *m, const Selector *s, char *const *members, size_t n,
                                         const PoolLabel *labels, size_t n_labels) {
        uint64_t *got = NULL, *once = NULL;
        size_t words = n > 0 ? member_set_words(n) : 1;
        assert_int_equal(member_sets_resolve(m, s, &got), 0);
        assert_int_equal(selector_resolve(s, members, labels, n_labels, &once), 0);
        unsigned want = 0;
        for (size_t i = 0; i < words * 64; i++) { /* and no bit past the last member */
                bool admits = i < n && reference_admits(s, members, i, labels, n_labels);
                want += admits;
                assert_int_equal(!!(got[i / 64] & (UINT64_C(1) << (i % 64))), admits);
                assert_int_equal(!!(once[i / 64] & (UINT64_C(1) << (i % 64))), admits);
        }
        assert_int_equal(member_set_count(got, member_set_words(n)), want);
        free(got);
        free(once);
}

/* n member names (NULL-terminated), "m" and a number (three digits if padded): out of their index's order, so
 * that sorting them matters; in a fifth of the rounds each name twice (no configuration has that: both are the
 * member). */
static char **members_new(size_t n, size_t round, bool padded) {
        char **members = calloc(n + 1, sizeof(char *));
        assert_non_null(members);
        for (size_t i = 0; i < n; i++) {
                unsigned v = (unsigned) (((round % 5 == 4 ? i / 2 : i) * 37 + round) % 1000);
                assert_true((padded ? asprintf(&members[i], "m%03u", v) : asprintf(&members[i], "m%u", v)) > 0);
        }
        return members;
}

/* Random pools (0 to 200 members, so counts below, at and past a word's 64), random labels (empty ones, two
 * of one name, names that are no member, the members in another order than the pool's) and random selectors (negated terms, labels no label names, a member
 * named that is one or is not): the sets made once per pool resolve every selector as the member by member
 * reference does, and so does selector_resolve(). A reload is another pool: its sets are made anew, of its own
 * members and labels (test-engine: test_selectors_follow_a_reload_of_members_and_labels). */
static void test_member_sets_resolve_as_the_reference(void **state) {
        static const char *const label_names[] = { "arm64", "usb3", "gpu", "big", "fast", "eu" };
        static const size_t sizes[] = { 0, 1, 2, 63, 64, 65, 127, 128, 129, 200 };
        for (size_t round = 0; round < 300; round++) {
                size_t n = round < ELEMENTSOF(sizes) ? sizes[round] : rnd() % 201;
                char **members = members_new(n, round, true);
                size_t n_labels = rnd() % 8;
                PoolLabel labels[8] = {};
                for (size_t l = 0; l < n_labels; l++) {
                        labels[l].name = (char *) label_names[rnd() % ELEMENTSOF(label_names)];
                        labels[l].members = calloc(n + 3, sizeof(char *));
                        assert_non_null(labels[l].members);
                        size_t k = 0, every = 1 + rnd() % 4;
                        for (size_t i = 0; i < n; i++)
                                if (rnd() % every == 0)
                                        labels[l].members[k++] = members[n - 1 - i];
                        if (rnd() % 4 == 0)
                                labels[l].members[k++] = (char *) "nobody";
                        if (rnd() % 8 == 0)
                                labels[l].members[0] = NULL; /* an empty label */
                }
                MemberSets *m = NULL;
                assert_int_equal(member_sets_new(members, labels, n_labels, &m), 0);
                assert_int_equal(member_sets_size(m), n);
                for (size_t k = 0; k < 40; k++) {
                        char terms[4][16] = {}, *term_list[5] = {};
                        size_t n_terms = rnd() % 5;
                        for (size_t t = 0; t < n_terms; t++) {
                                const char *name = rnd() % 8 == 0 ? "nolabel" : label_names[rnd() % ELEMENTSOF(label_names)];
                                snprintf(terms[t], sizeof terms[t], "%s%s", rnd() % 3 == 0 ? "!" : "", name);
                                term_list[t] = terms[t];
                        }
                        Selector s = { .terms = n_terms > 0 || rnd() % 2 ? term_list : NULL };
                        switch (rnd() % 4) {
                        case 0: s.member = n > 0 ? members[rnd() % n] : "m000"; break;
                        case 1: s.member = "nobody"; break;
                        default: break;
                        }
                        assert_resolves_as_reference(m, &s, members, n, labels, n_labels);
                }
                assert_resolves_as_reference(m, NULL, members, n, labels, n_labels);
                member_sets_free(m);
                for (size_t l = 0; l < n_labels; l++)
                        free(labels[l].members);
                strv_free(members);
        }
}

/* The first member of a name, found as a scan finds it: the reference. */
static ssize_t find_by_scan(char *const *members, size_t n, const char *name, size_t len) {
        for (size_t i = 0; i < n; i++)
                if (strlen(members[i]) == len && memcmp(members[i], name, len) == 0)
                        return (ssize_t) i;
        return -1;
}

/* member_sets_find() (a Redis reply's names, pool-shared.c) finds what a scan of the members finds: the first of
 * two members of one name, nothing for a prefix, an extension, a name with a NUL byte or bytes above 0x7f, and
 * names given as bytes not NUL-terminated. */
static void test_member_sets_find_as_a_scan(void **state) {
        static const size_t sizes[] = { 0, 1, 2, 3, 64, 65, 200 };
        for (size_t round = 0; round < 100; round++) {
                size_t n = round < ELEMENTSOF(sizes) ? sizes[round] : rnd() % 301;
                char **members = members_new(n, round, false);
                MemberSets *m = NULL;
                assert_int_equal(member_sets_new(members, NULL, 0, &m), 0);
                for (size_t k = 0; k < 200; k++) {
                        /* Each name followed by bytes that are not part of it, as in a reply's buffer. */
                        char buf[32];
                        size_t len;
                        switch (rnd() % 6) {
                        case 0: len = (size_t) snprintf(buf, sizeof buf, "m%u", (unsigned) (rnd() % 1000)); break;
                        case 1: len = (size_t) snprintf(buf, sizeof buf, "m%u5", (unsigned) (rnd() % 100)); break;
                        case 2: len = (size_t) snprintf(buf, sizeof buf, "m%u", (unsigned) (rnd() % 1000)) - 1; break;
                        case 3:
                                len = (size_t) snprintf(buf, sizeof buf, "m%u", (unsigned) (rnd() % 1000));
                                buf[rnd() % len] = rnd() % 2 ? '\0' : '\xe9';
                                break;
                        case 4: len = 0; buf[0] = 'm'; break;
                        default:
                                if (n == 0) {
                                        len = 1;
                                        buf[0] = 'm';
                                        break;
                                }
                                len = (size_t) snprintf(buf, sizeof buf, "%s", members[rnd() % n]);
                                break;
                        }
                        memcpy(buf + len, "9x", 3);
                        assert_int_equal(member_sets_find(m, buf, len), find_by_scan(members, n, buf, len));
                }
                member_sets_free(m);
                strv_free(members);
        }
        assert_int_equal(member_sets_find(NULL, "m1", 2), -1);
}

/* A pool without members: every selector admits none, in one word. */
static void test_member_sets_of_no_members(void **state) {
        uint64_t *set = NULL;
        assert_int_equal(member_sets_resolve(NULL, &(Selector) { .terms = (char *[]) { "!gpu", NULL } }, &set), 0);
        assert_int_equal(set[0], 0);
        free(set);
        assert_int_equal(member_sets_size(NULL), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_canon_ignores_order_and_repetition),
                cmocka_unit_test(test_terms_are_labels_or_their_negation),
                cmocka_unit_test(test_resolve),
                cmocka_unit_test(test_member_sets_resolve_as_the_reference),
                cmocka_unit_test(test_member_sets_of_no_members),
                cmocka_unit_test(test_member_sets_find_as_a_scan),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
