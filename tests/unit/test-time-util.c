/* SPDX-License-Identifier: MIT */
/* test-time-util.c — time spans in systemd's syntax: every unit, combinations, infinity, fractions, and
 * everything that must be refused. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "time-util.h"

static usec_t parse_ok(const char *s) {
        usec_t u = 42;
        int r = timespan_parse(s, USEC_PER_SEC, &u);
        if (r != 0)
                fail_msg("timespan_parse(\"%s\") = %d, expected success", s, r);
        return u;
}

static void assert_parse_fails(const char *s, int expected) {
        usec_t u = 42;
        int r = timespan_parse(s, USEC_PER_SEC, &u);
        if (r != expected)
                fail_msg("timespan_parse(\"%s\") = %d, expected %d", s, r, expected);
        assert_int_equal(u, 42); /* untouched on failure */
}

static void test_bare_number_counts_in_default_unit(void **state) {
        usec_t u;

        assert_int_equal(parse_ok("5"), 5 * USEC_PER_SEC);
        assert_int_equal(parse_ok("0"), 0);
        assert_int_equal(timespan_parse("5", USEC_PER_MSEC, &u), 0);
        assert_int_equal(u, 5 * USEC_PER_MSEC);
        assert_int_equal(timespan_parse("7", 1, &u), 0);
        assert_int_equal(u, 7);
}

static void test_every_unit_and_its_spellings(void **state) {
        static const struct {
                const char *s;
                usec_t usec;
        } cases[] = {
                { "3us", 3 }, { "3usec", 3 }, { "3µs", 3 },
                { "3ms", 3 * USEC_PER_MSEC }, { "3msec", 3 * USEC_PER_MSEC },
                { "3s", 3 * USEC_PER_SEC }, { "3sec", 3 * USEC_PER_SEC }, { "3second", 3 * USEC_PER_SEC },
                { "3seconds", 3 * USEC_PER_SEC },
                { "3m", 3 * USEC_PER_MINUTE }, { "3min", 3 * USEC_PER_MINUTE }, { "3minute", 3 * USEC_PER_MINUTE },
                { "3minutes", 3 * USEC_PER_MINUTE },
                { "3h", 3 * USEC_PER_HOUR }, { "3hr", 3 * USEC_PER_HOUR }, { "3hour", 3 * USEC_PER_HOUR },
                { "3hours", 3 * USEC_PER_HOUR },
                { "3d", 3 * USEC_PER_DAY }, { "3day", 3 * USEC_PER_DAY }, { "3days", 3 * USEC_PER_DAY },
                { "3w", 3 * USEC_PER_WEEK }, { "3week", 3 * USEC_PER_WEEK }, { "3weeks", 3 * USEC_PER_WEEK },
                { "1M", 2629800 * USEC_PER_SEC }, { "1month", 2629800 * USEC_PER_SEC },
                { "1months", 2629800 * USEC_PER_SEC },
                { "1y", 31557600 * USEC_PER_SEC }, { "1year", 31557600 * USEC_PER_SEC },
                { "1years", 31557600 * USEC_PER_SEC },
        };

        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
                usec_t u = parse_ok(cases[i].s);
                if (u != cases[i].usec)
                        fail_msg("\"%s\" parsed to %llu, expected %llu", cases[i].s, (unsigned long long) u,
                                 (unsigned long long) cases[i].usec);
        }
}

static void test_lowercase_m_is_minutes_and_uppercase_m_is_months(void **state) {
        assert_int_equal(parse_ok("5m"), 5 * USEC_PER_MINUTE);
        assert_int_equal(parse_ok("5M"), 5 * 2629800 * USEC_PER_SEC);
}

static void test_components_add_up_with_or_without_spaces(void **state) {
        assert_int_equal(parse_ok("1h 30min"), 90 * USEC_PER_MINUTE);
        assert_int_equal(parse_ok("1h30min"), 90 * USEC_PER_MINUTE);
        assert_int_equal(parse_ok("  1h   30min  "), 90 * USEC_PER_MINUTE);
        assert_int_equal(parse_ok("5 min"), 5 * USEC_PER_MINUTE);
        assert_int_equal(parse_ok("1d 1h 1min 1s 1ms 1us"),
                         USEC_PER_DAY + USEC_PER_HOUR + USEC_PER_MINUTE + USEC_PER_SEC + USEC_PER_MSEC + 1);
        assert_int_equal(parse_ok("1min 5"), 65 * USEC_PER_SEC); /* as systemd: a bare number adds seconds */
}

static void test_infinity_is_one_exact_word(void **state) {
        assert_true(parse_ok("infinity") == USEC_INFINITY);
        assert_true(parse_ok("  infinity  ") == USEC_INFINITY);
        assert_parse_fails("Infinity", -EINVAL);
        assert_parse_fails("inf", -EINVAL);
        assert_parse_fails("infinity 5s", -EINVAL);
        assert_parse_fails("5s infinity", -EINVAL);
        assert_parse_fails("infinityx", -EINVAL);
}

static void test_milliseconds(void **state) {
        assert_int_equal(parse_ok("500ms"), 500 * USEC_PER_MSEC);
        assert_int_equal(parse_ok("500 ms"), 500 * USEC_PER_MSEC);
        assert_int_equal(parse_ok("1s 500ms"), 1500 * USEC_PER_MSEC);
}

static void test_fractions_are_exact_to_the_microsecond(void **state) {
        assert_int_equal(parse_ok("1.5s"), 1500 * USEC_PER_MSEC);
        assert_int_equal(parse_ok("0.5ms"), 500);
        assert_int_equal(parse_ok(".5s"), 500 * USEC_PER_MSEC);
        assert_int_equal(parse_ok("1.25h"), 75 * USEC_PER_MINUTE);
        assert_int_equal(parse_ok("0.1s"), 100 * USEC_PER_MSEC);
        assert_int_equal(parse_ok("1.123456789s"), 1123456); /* below a microsecond is cut */
        assert_int_equal(parse_ok("0.0000001s"), 0);
        assert_int_equal(parse_ok("2.5"), 2500 * USEC_PER_MSEC);
}

static void test_junk_is_rejected(void **state) {
        static const char *const junk[] = {
                "", " ", "s", "ms", "abc", "5x", "5 minutes please", "5mo", "1e3s", "0x10", "5s;", "5s,", "5,5s",
                "1.5.5s", ".", "..5s", "5 s s", "\t", "5\n5x",
        };

        for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++)
                assert_parse_fails(junk[i], -EINVAL);
}

static void test_negative_values_are_rejected(void **state) {
        assert_parse_fails("-5s", -EINVAL);
        assert_parse_fails(" -1", -EINVAL);
        assert_parse_fails("5s -1s", -EINVAL);
        assert_parse_fails("+5s", -EINVAL);
        assert_parse_fails("-infinity", -EINVAL);
}

static void test_overflow_is_erange(void **state) {
        assert_parse_fails("99999999999999999999", -ERANGE);
        assert_parse_fails("18446744073709551615us", -ERANGE);
        assert_parse_fails("600000y", -ERANGE);
        assert_parse_fails("10000000000000000000us 10000000000000000000us", -ERANGE);
}

static void test_largest_finite_span_is_not_infinity(void **state) {
        usec_t u = parse_ok("584542y");
        assert_true(u < USEC_INFINITY);
        assert_true(u == (usec_t) 584542 * 31557600 * USEC_PER_SEC);
}

static void test_null_arguments_are_einval(void **state) {
        usec_t u;
        assert_int_equal(timespan_parse(NULL, USEC_PER_SEC, &u), -EINVAL);
        assert_int_equal(timespan_parse("5s", USEC_PER_SEC, NULL), -EINVAL);
}

static void test_format_infinity_and_zero(void **state) {
        char buf[TIMESPAN_MAX];
        assert_string_equal(timespan_format(buf, sizeof buf, USEC_INFINITY), "infinity");
        assert_string_equal(timespan_format(buf, sizeof buf, 0), "0");
}

static void test_format_uses_largest_units_and_loses_nothing(void **state) {
        char buf[TIMESPAN_MAX];

        assert_string_equal(timespan_format(buf, sizeof buf, 90 * USEC_PER_MINUTE), "1h 30min");
        assert_string_equal(timespan_format(buf, sizeof buf, 1500 * USEC_PER_MSEC), "1s 500ms");
        assert_string_equal(timespan_format(buf, sizeof buf, 5 * USEC_PER_MINUTE), "5min");
        assert_string_equal(timespan_format(buf, sizeof buf, 30 * USEC_PER_DAY), "30d");
        assert_string_equal(timespan_format(buf, sizeof buf, 1), "1us");
        assert_string_equal(timespan_format(buf, sizeof buf, USEC_PER_DAY + USEC_PER_HOUR + USEC_PER_MINUTE +
                                                                     USEC_PER_SEC + USEC_PER_MSEC + 1),
                            "1d 1h 1min 1s 1ms 1us");
}

static void test_format_returns_its_buffer_and_respects_its_size(void **state) {
        char buf[8];

        memset(buf, 'x', sizeof buf);
        assert_ptr_equal(timespan_format(buf, sizeof buf, 90061001001), buf);
        assert_true(memchr(buf, '\0', sizeof buf) != NULL);
        assert_int_equal(strncmp(buf, "1d 1h", 5), 0);
}

static void test_format_then_parse_round_trips(void **state) {
        static const usec_t values[] = {
                0, 1, 999, USEC_PER_MSEC, 1500 * USEC_PER_MSEC, USEC_PER_MINUTE, 90 * USEC_PER_MINUTE,
                30 * USEC_PER_DAY, 123456789012345, USEC_INFINITY - 1, USEC_INFINITY,
        };
        char buf[TIMESPAN_MAX];

        for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
                usec_t u = parse_ok(timespan_format(buf, sizeof buf, values[i]));
                if (u != values[i])
                        fail_msg("%llu formatted as \"%s\" parsed back as %llu", (unsigned long long) values[i], buf,
                                 (unsigned long long) u);
        }
        /* and a pseudo-random sweep over all magnitudes */
        uint64_t x = 0x9e3779b97f4a7c15ULL;
        for (int i = 0; i < 10000; i++) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                usec_t v = x >> (i % 64);
                if (v == USEC_INFINITY)
                        continue;
                assert_true(parse_ok(timespan_format(buf, sizeof buf, v)) == v);
        }
}

static void test_parse_then_format_is_canonical(void **state) {
        char buf[TIMESPAN_MAX];
        assert_string_equal(timespan_format(buf, sizeof buf, parse_ok("90min")), "1h 30min");
        assert_string_equal(timespan_format(buf, sizeof buf, parse_ok("1.5s")), "1s 500ms");
        assert_string_equal(timespan_format(buf, sizeof buf, parse_ok("1w")), "7d");
}

static void test_usec_add_saturates_at_infinity(void **state) {
        assert_true(usec_add(1, 2) == 3);
        assert_true(usec_add(USEC_INFINITY, 1) == USEC_INFINITY);
        assert_true(usec_add(USEC_INFINITY - 1, 5) == USEC_INFINITY);
        assert_true(usec_sub_unsigned(5, 7) == 0);
        assert_true(usec_sub_unsigned(7, 5) == 2);
}

static void test_mono_to_real_keeps_the_past_as_it_was(void **state) {
        (void) state;
        const usec_t mono = 50 * USEC_PER_SEC, real = 1700000000 * USEC_PER_SEC;
        assert_int_equal(usec_mono_to_real(mono, mono, real), real);
        assert_int_equal(usec_mono_to_real(mono + 7, mono, real), real + 7);
        /* An instant already past is not "now": a drain's until audited after its expiry says when it was. */
        assert_int_equal(usec_mono_to_real(mono - 3 * USEC_PER_SEC, mono, real), real - 3 * USEC_PER_SEC);
        assert_int_equal(usec_mono_to_real(0, mono, 10), 0);
        assert_int_equal(usec_mono_to_real(USEC_INFINITY - 1, mono, real), USEC_INFINITY);
}

static void test_clocks_do_not_go_backwards(void **state) {
        usec_t a = now_monotonic(), b = now_monotonic();
        assert_true(b >= a);
        assert_true(now_realtime() > (usec_t) 1600000000 * USEC_PER_SEC);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_bare_number_counts_in_default_unit),
                cmocka_unit_test(test_mono_to_real_keeps_the_past_as_it_was),
                cmocka_unit_test(test_every_unit_and_its_spellings),
                cmocka_unit_test(test_lowercase_m_is_minutes_and_uppercase_m_is_months),
                cmocka_unit_test(test_components_add_up_with_or_without_spaces),
                cmocka_unit_test(test_infinity_is_one_exact_word),
                cmocka_unit_test(test_milliseconds),
                cmocka_unit_test(test_fractions_are_exact_to_the_microsecond),
                cmocka_unit_test(test_junk_is_rejected),
                cmocka_unit_test(test_negative_values_are_rejected),
                cmocka_unit_test(test_overflow_is_erange),
                cmocka_unit_test(test_largest_finite_span_is_not_infinity),
                cmocka_unit_test(test_null_arguments_are_einval),
                cmocka_unit_test(test_format_infinity_and_zero),
                cmocka_unit_test(test_format_uses_largest_units_and_loses_nothing),
                cmocka_unit_test(test_format_returns_its_buffer_and_respects_its_size),
                cmocka_unit_test(test_format_then_parse_round_trips),
                cmocka_unit_test(test_parse_then_format_is_canonical),
                cmocka_unit_test(test_usec_add_saturates_at_infinity),
                cmocka_unit_test(test_clocks_do_not_go_backwards),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
