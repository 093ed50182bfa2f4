/* SPDX-License-Identifier: MIT */
/* test-selector.c — a request's labels and member: their canonical text and the members they admit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "selector.h"

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

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_canon_ignores_order_and_repetition),
                cmocka_unit_test(test_terms_are_labels_or_their_negation),
                cmocka_unit_test(test_resolve),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
