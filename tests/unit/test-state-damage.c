/* SPDX-License-Identifier: MIT */
/* test-state-damage.c — the record of what the state directory held and could not be read: appended to, never
 * replaced, with when and what, and the damaged bytes as they were; its existence is what is asked. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "state-damage.h"

static void read_record(const char *dir, char *text, size_t size) {
        char path[160];
        snprintf(path, sizeof path, "%s/" STATE_DAMAGE_FILE, dir);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        assert_true(fd >= 0);
        ssize_t n = read(fd, text, size - 1);
        close(fd);
        assert_true(n > 0);
        text[n] = 0;
}

static void test_record_is_appended_and_its_existence_asked(void **state) {
        char dir[] = "/tmp/test-state-damage.XXXXXX", path[160], text[4096];
        assert_non_null(mkdtemp(dir));
        snprintf(path, sizeof path, "%s/" STATE_DAMAGE_FILE, dir);

        assert_int_equal(state_damage_found(dir), 0);
        const char lines[] = "00000000 {\"end\":\"first\"}\n";
        assert_int_equal(state_damage_record(dir, "1 line(s) of leases.log did not check out.", lines,
                                             sizeof lines - 1, 1700000000000000),
                         0);
        assert_int_equal(state_damage_found(dir), 1);
        assert_int_equal(state_damage_record(dir, "members.state is damaged.", NULL, 0, 1700000060000000), 0);

        read_record(dir, text, sizeof text);
        const char *first = strstr(text, "# brokerd, 2023-11-14T22:13:20Z: 1 line(s) of leases.log did not check out.\n");
        assert_non_null(first);
        assert_non_null(strstr(first, "nothing new is granted while this file exists"));
        assert_non_null(strstr(first, lines));
        /* The second record follows the first one's bytes: nothing was replaced. */
        assert_non_null(strstr(strstr(first, lines), "# brokerd, 2023-11-14T22:14:20Z: members.state is damaged.\n"));

        assert_int_equal(unlink(path), 0);
        assert_int_equal(state_damage_found(dir), 0);
        assert_int_equal(rmdir(dir), 0);
}

static void test_a_directory_that_takes_no_file_is_an_error(void **state) {
        assert_true(state_damage_record("/nonexistent-test-state-damage", "x", NULL, 0, 1) < 0);
        assert_int_equal(state_damage_found("/nonexistent-test-state-damage"), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_record_is_appended_and_its_existence_asked),
                cmocka_unit_test(test_a_directory_that_takes_no_file_is_an_error),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
