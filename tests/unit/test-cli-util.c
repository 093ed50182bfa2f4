/* SPDX-License-Identifier: MIT */
/* test-cli-util.c — what slotctl prints of other users' strings: nothing a terminal would act on, every
 * escape unambiguous, UTF-8 text kept, and a buffer never overrun. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "cli-util.h"

static void assert_printable(const char *s, const char *expected) {
        char buf[256];
        const char *out = cli_printable(buf, sizeof buf, s);
        assert_ptr_equal(out, buf);
        assert_string_equal(buf, expected);
}

static void test_plain_text_and_utf8_pass_unchanged(void **state) {
        assert_printable("", "");
        assert_printable("https://ci.example/g/p/-/jobs/42 build", "https://ci.example/g/p/-/jobs/42 build");
        assert_printable("Jörg’s nightly ✓ 🚀", "Jörg’s nightly ✓ 🚀");
        assert_printable("\xc2\xa0", "\xc2\xa0"); /* U+00A0, just past C1 */
}

static void test_c0_controls_and_del_are_escaped(void **state) {
        assert_printable("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07");
        assert_printable("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H");
        assert_printable("ok\rFAKE", "ok\\rFAKE");
        assert_printable("a\tb\nc", "a\\tb\\nc");
        assert_printable("\x01\x1f\x7f", "\\x01\\x1f\\x7f");
}

static void test_c1_controls_and_bidi_overrides_are_escaped(void **state) {
        assert_printable("\xc2\x9b" "2J", "\\u009b2J"); /* C1 CSI */
        assert_printable("\xc2\x80\xc2\x9f", "\\u0080\\u009f");
        assert_printable("abc\xe2\x80\xae" "fdp.exe", "abc\\u202efdp.exe"); /* RIGHT-TO-LEFT OVERRIDE */
        assert_printable("\xe2\x81\xa6x\xe2\x81\xa9", "\\u2066x\\u2069");
}

static void test_a_backslash_cannot_forge_an_escape(void **state) {
        assert_printable("\\x1b", "\\\\x1b");
        assert_printable("C:\\ci", "C:\\\\ci");
}

static void test_invalid_utf8_is_escaped_byte_by_byte(void **state) {
        assert_printable("\xff", "\\xff");
        assert_printable("a\xc3(b", "a\\xc3(b");                     /* a lead byte without its continuation */
        assert_printable("\xc0\xaf", "\\xc0\\xaf");                   /* overlong '/' */
        assert_printable("\xe0\x80\xaf", "\\xe0\\x80\\xaf");          /* overlong, 3 bytes */
        assert_printable("\xed\xa0\x80", "\\xed\\xa0\\x80");          /* a UTF-16 surrogate */
        assert_printable("\xf4\x90\x80\x80", "\\xf4\\x90\\x80\\x80"); /* past U+10FFFF */
        assert_printable("\x80x", "\\x80x");                          /* a lone continuation byte */
        assert_printable("\xe2\x82", "\\xe2\\x82");                   /* cut at the end of the string */
}

static void test_output_is_cut_before_what_does_not_fit(void **state) {
        char buf[6];
        assert_string_equal(cli_printable(buf, sizeof buf, "abcdefgh"), "abcde");
        assert_string_equal(cli_printable(buf, sizeof buf, "ab\x1b"), "ab"); /* not "ab\x1" */
        assert_string_equal(cli_printable(buf, sizeof buf, "abcd\xc3\xa9"), "abcd"); /* not half of é */

        /* The documented size is always enough. */
        const char *worst = "\xff\xff\xff\xc2\x9b\xe2\x80\xae";
        char big[CLI_PRINTABLE_SIZE(8)];
        assert_string_equal(cli_printable(big, sizeof big, worst), "\\xff\\xff\\xff\\u009b\\u202e");
}

static void test_json_strings_are_escaped_at_any_depth_keys_kept(void **state) {
        json_t *v = json_pack("{s:[{s:s, s:i}], s:s}", "holders", "job", "x\x1b[2Jy", "pid", 7, "pool\x1b", "ok");
        assert_non_null(v);
        assert_int_equal(cli_json_make_printable(v), 0);
        json_t *h = json_array_get(json_object_get(v, "holders"), 0);
        assert_string_equal(json_string_value(json_object_get(h, "job")), "x\\x1b[2Jy");
        assert_int_equal(json_integer_value(json_object_get(h, "pid")), 7);
        assert_string_equal(json_string_value(json_object_get(v, "pool\x1b")), "ok");
        assert_int_equal(cli_json_make_printable(NULL), 0);
        json_decref(v);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_plain_text_and_utf8_pass_unchanged),
                cmocka_unit_test(test_c0_controls_and_del_are_escaped),
                cmocka_unit_test(test_c1_controls_and_bidi_overrides_are_escaped),
                cmocka_unit_test(test_a_backslash_cannot_forge_an_escape),
                cmocka_unit_test(test_invalid_utf8_is_escaped_byte_by_byte),
                cmocka_unit_test(test_output_is_cut_before_what_does_not_fit),
                cmocka_unit_test(test_json_strings_are_escaped_at_any_depth_keys_kept),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
