/* SPDX-License-Identifier: MIT */
/* test-member-state.c — members.state (SPEC §3.6): what is written reads back the same; what does not check
 * out is refused whole (-EBADMSG), never guessed at. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "macro.h"
#include "member-state.h"

static char dir[] = "/tmp/test-member-state-XXXXXX";

static int setup(void **state) {
        strcpy(dir, "/tmp/test-member-state-XXXXXX");
        assert_non_null(mkdtemp(dir));
        return 0;
}

static int teardown(void **state) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        assert_int_equal(system(cmd), 0);
        return 0;
}

static void write_file(const char *text) {
        char path[128];
        snprintf(path, sizeof path, "%s/" MEMBER_STATE_FILE, dir);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(text, f);
        fclose(f);
}

static void test_no_file_is_no_entries(void **state) {
        MemberStateEntry *e = NULL;
        size_t n = 99;
        assert_int_equal(member_state_read(dir, &e, &n), 0);
        assert_int_equal(n, 0);
        member_state_entries_free(e, n);
}

static void test_round_trip(void **state) {
        MemberStateEntry w[] = {
                { .pool = (char *) "rigs", .member = (char *) "a", .drain_until = USEC_INFINITY, .quarantined = true,
                  .quarantine_since = 1700000000000000, .quarantine_job = (char *) "nightly-812",
                  .quarantine_exit_status = 3 },
                { .pool = (char *) "rigs", .member = (char *) "b", .drained = true, .drain_since = 1700000000000001,
                  .drain_until = 1800000000000000, .drain_by = (char *) "uid 0", .drain_reason = (char *) "reflash",
                  .quarantined = true, .quarantine_since = 5, .quarantine_exit_status = -1,
                  .quarantine_reason = (char *) "flash worn" },
                { .pool = (char *) "anon", .drained = true, .drain_since = 7, .drain_until = USEC_INFINITY,
                  .quarantine_exit_status = -1 },
        };
        assert_int_equal(member_state_write(dir, w, ELEMENTSOF(w)), 0);
        MemberStateEntry *e = NULL;
        size_t n = 0;
        assert_int_equal(member_state_read(dir, &e, &n), 0);
        assert_int_equal(n, 3);
        assert_string_equal(e[0].member, "a");
        assert_true(e[0].quarantined);
        assert_false(e[0].drained);
        assert_int_equal(e[0].quarantine_exit_status, 3);
        assert_string_equal(e[0].quarantine_job, "nightly-812");
        assert_null(e[0].quarantine_reason);
        assert_true(e[1].drained && e[1].quarantined);
        assert_int_equal(e[1].drain_until, 1800000000000000);
        assert_string_equal(e[1].drain_reason, "reflash");
        assert_string_equal(e[1].quarantine_reason, "flash worn");
        assert_int_equal(e[1].quarantine_exit_status, -1);
        assert_null(e[2].member);
        assert_int_equal(e[2].drain_until, USEC_INFINITY);
        member_state_entries_free(e, n);
}

static void test_damage_is_refused_whole(void **state) {
        static const char *const bad[] = {
                "",
                "{",
                "[]",
                "{\"slotbroker\":\"leases\",\"version\":1,\"entries\":[]}",
                "{\"slotbroker\":\"members\",\"version\":2,\"entries\":[]}",
                "{\"slotbroker\":\"members\",\"version\":1,\"entries\":[],\"x\":1}",
                "{\"slotbroker\":\"members\",\"version\":1,\"entries\":[{\"pool\":\"../p\",\"drain\":{\"since\":1}}]}",
                "{\"slotbroker\":\"members\",\"version\":1,\"entries\":[{\"pool\":\"p\"}]}",
                "{\"slotbroker\":\"members\",\"version\":1,\"entries\":[{\"pool\":\"p\",\"quarantine\":{\"since\":1}}]}",
                "{\"slotbroker\":\"members\",\"version\":1,\"entries\":[{\"pool\":\"p\",\"drain\":{\"since\":-1}}]}",
                "{\"slotbroker\":\"members\",\"version\":1,\"entries\":[{\"pool\":\"p\",\"drain\":{\"since\":1,\"reason\":\"a\\nb\"}}]}",
                "{\"slotbroker\":\"members\",\"version\":1,\"entries\":[{\"pool\":\"p\",\"member\":\"m\",\"quarantine\":{\"since\":1,\"exitStatus\":256}}]}",
                "{\"slotbroker\":\"members\",\"version\":1,\"entries\":[{\"pool\":\"p\",\"drain\":{\"since\":1,\"extra\":1}}]}",
                "{\"slotbroker\":\"members\",\"version\":1,\"version\":1,\"entries\":[]}",
        };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                write_file(bad[i]);
                MemberStateEntry *e = NULL;
                size_t n = 0;
                int r = member_state_read(dir, &e, &n);
                if (r != -EBADMSG)
                        fail_msg("%s: %d, expected -EBADMSG", bad[i], r);
        }
        char *moved = NULL;
        assert_int_equal(member_state_move_aside(dir, &moved), 0);
        assert_non_null(strstr(moved, MEMBER_STATE_FILE ".corrupt-"));
        assert_int_equal(access(moved, F_OK), 0);
        free(moved);
}

/* What a brokerd before the job label's mapping wrote (a C1 character, U+2028/U+2029 in a quarantine's job, in a
 * reason of one before reasons refused them) is no damage: it reads, mapped to one line as such a brokerd maps
 * it now (conf_text_sanitize()). */
static void test_c1_and_line_separators_read_as_one_line(void **state) {
        write_file("{\"slotbroker\":\"members\",\"version\":1,\"entries\":[{\"pool\":\"p\",\"member\":\"m\","
                   "\"drain\":{\"since\":1,\"by\":\"uid\\u00850\",\"reason\":\"a\\u2028b\"},"
                   "\"quarantine\":{\"since\":1,\"job\":\"nel\\u0085csi\\u009b[1m\\u2029\\u00a0\",\"exitStatus\":3,"
                   "\"reason\":\"r\\u009f\"}}]}");
        MemberStateEntry *e = NULL;
        size_t n = 0;
        assert_int_equal(member_state_read(dir, &e, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(e[0].drain_by, "uid?0");
        assert_string_equal(e[0].drain_reason, "a?b");
        assert_string_equal(e[0].quarantine_job, "nel?csi?[1m?\xc2\xa0"); /* a no-break space is text */
        assert_string_equal(e[0].quarantine_reason, "r?");
        member_state_entries_free(e, n);
}

static void test_text_rules(void **state) {
        assert_true(member_state_text_is_valid("flash worn: 93%"));
        assert_false(member_state_text_is_valid(""));
        assert_false(member_state_text_is_valid("a\tb"));
        assert_false(member_state_text_is_valid("a\x7f"));
        char big[MEMBER_STATE_REASON_MAX + 2];
        memset(big, 'x', sizeof big - 1);
        big[sizeof big - 1] = '\0';
        assert_false(member_state_text_is_valid(big));
        big[MEMBER_STATE_REASON_MAX] = '\0';
        assert_true(member_state_text_is_valid(big));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_no_file_is_no_entries, setup, teardown),
                cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
                cmocka_unit_test_setup_teardown(test_damage_is_refused_whole, setup, teardown),
                cmocka_unit_test_setup_teardown(test_c1_and_line_separators_read_as_one_line, setup, teardown),
                cmocka_unit_test_setup_teardown(test_text_rules, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
