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

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_a_majority_naming_the_primary_confirms_it),
                cmocka_unit_test(test_a_majority_is_of_the_list_not_of_the_answers),
                cmocka_unit_test(test_a_majority_for_another_node_moves_only_a_stale_primary),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
