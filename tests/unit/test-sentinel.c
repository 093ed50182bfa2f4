/* SPDX-License-Identifier: MIT */
/* test-sentinel.c — what a confirmation round's answers decide (sentinel_round_verdict()): the rest of
 * sentinel.c talks to real Sentinels and is test-sentinel.py's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "macro.h"
#include "sentinel.h"

#define P "127.0.0.1:6379"
#define R "127.0.0.1:6380"

static SentinelVerdict verdict(const char *const *answers, size_t n, const char *primary, bool stale,
                               size_t *ret_index) {
        return sentinel_round_verdict(answers, n, primary, stale, ret_index);
}

static void test_a_majority_naming_the_primary_confirms_it(void **state) {
        const char *all[] = { P, P, P };
        assert_int_equal(verdict(all, 3, P, false, NULL), SENTINEL_VERDICT_CONFIRM);
        /* A Sentinel down, or one that lags behind: two of three are a majority. */
        const char *one_down[] = { NULL, P, P };
        assert_int_equal(verdict(one_down, 3, P, true, NULL), SENTINEL_VERDICT_CONFIRM);
        const char *one_other[] = { P, R, P };
        assert_int_equal(verdict(one_other, 3, P, false, NULL), SENTINEL_VERDICT_CONFIRM);
        const char *single[] = { P };
        assert_int_equal(verdict(single, 1, P, false, NULL), SENTINEL_VERDICT_CONFIRM);
}

static void test_a_majority_is_of_the_list_not_of_the_answers(void **state) {
        /* Cut off from two Sentinels of three: the third alone confirms nothing. */
        const char *alone[] = { P, NULL, NULL };
        assert_int_equal(verdict(alone, 3, P, true, NULL), SENTINEL_VERDICT_NONE);
        const char *none[] = { NULL, NULL, NULL };
        assert_int_equal(verdict(none, 3, P, true, NULL), SENTINEL_VERDICT_NONE);
        /* Two of four are not a majority. */
        const char *half[] = { P, P, NULL, NULL };
        assert_int_equal(verdict(half, 4, P, true, NULL), SENTINEL_VERDICT_NONE);
        const char *split[] = { P, R, NULL };
        assert_int_equal(verdict(split, 3, P, true, NULL), SENTINEL_VERDICT_NONE);
}

static void test_a_majority_for_another_node_moves_only_a_stale_primary(void **state) {
        const char *moved[] = { P, R, R };
        size_t i = SIZE_MAX;
        /* Right after a failover the Sentinels that have not heard of it name the old primary: a round must not
         * take brokerd back to it while the new one is fresh from +switch-master. */
        assert_int_equal(verdict(moved, 3, P, false, &i), SENTINEL_VERDICT_NONE);
        assert_int_equal(i, SIZE_MAX);
        assert_int_equal(verdict(moved, 3, P, true, &i), SENTINEL_VERDICT_MOVE);
        assert_string_equal(moved[i], R);
        /* The first answer: no primary yet. */
        const char *first[] = { R, NULL, R };
        assert_int_equal(verdict(first, 3, "", true, &i), SENTINEL_VERDICT_MOVE);
        assert_string_equal(first[i], R);
        assert_int_equal(verdict(first, 3, NULL, true, &i), SENTINEL_VERDICT_MOVE);
}

/* What lets sentinel.c confirm before a round's last answer: once a majority of the list names the primary,
 * no answer still out can change the verdict, whatever it is (none, the primary, another node) and however
 * stale the primary. Every way of completing such a round, for lists of 1 to 5. */
static void test_a_majority_confirms_whatever_the_answers_still_out(void **state) {
        const char *values[] = { NULL, P, R, "127.0.0.1:6381" };
        for (size_t n = 1; n <= 5; n++) {
                size_t majority = n / 2 + 1;
                for (size_t named = majority; named <= n; named++) {
                        /* The first `named` answered the primary; the others, still out, complete in every way
                         * (4^(n - named) rounds). */
                        size_t ways = 1;
                        for (size_t i = named; i < n; i++)
                                ways *= 4;
                        for (size_t w = 0; w < ways; w++) {
                                const char *answers[5];
                                size_t x = w;
                                for (size_t i = 0; i < n; i++) {
                                        answers[i] = i < named ? P : values[x % 4];
                                        if (i >= named)
                                                x /= 4;
                                }
                                assert_int_equal(verdict(answers, n, P, false, NULL), SENTINEL_VERDICT_CONFIRM);
                                assert_int_equal(verdict(answers, n, P, true, NULL), SENTINEL_VERDICT_CONFIRM);
                        }
                }
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_a_majority_naming_the_primary_confirms_it),
                cmocka_unit_test(test_a_majority_is_of_the_list_not_of_the_answers),
                cmocka_unit_test(test_a_majority_for_another_node_moves_only_a_stale_primary),
                cmocka_unit_test(test_a_majority_confirms_whatever_the_answers_still_out),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
