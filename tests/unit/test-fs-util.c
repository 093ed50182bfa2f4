/* SPDX-License-Identifier: MIT */
/* test-fs-util.c — mkdir_parents(): the directories leading to a path, never the path itself; rename_aside():
 * a damaged file out of the way, never over another; lock_file_take(): one holder at a time, named to the
 * one refused. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fs-util.h"
#include "macro.h"

static char root[] = "/tmp/test-fs-util-XXXXXX";

static int setup(void **state) {
        return mkdtemp(root) ? 0 : -1;
}

static int teardown(void **state) {
        char cmd[sizeof root + 16];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
        return system(cmd) == 0 ? 0 : -1;
}

static bool is_dir(const char *path, mode_t *ret_mode) {
        struct stat st;
        if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode))
                return false;
        if (ret_mode)
                *ret_mode = st.st_mode & 07777;
        return true;
}

static void test_creates_every_parent_but_not_the_path(void **state) {
        char path[256], dir[256];
        mode_t mode = 0;

        snprintf(path, sizeof path, "%s/a/b/c/sock", root);
        assert_int_equal(mkdir_parents(path, 0750), 0);
        snprintf(dir, sizeof dir, "%s/a/b/c", root);
        assert_true(is_dir(dir, &mode));
        assert_int_equal(mode & ~(mode_t) 0022, 0750 & ~(mode_t) 0022); /* the umask may take bits away */
        assert_false(is_dir(path, NULL));
        assert_int_equal(access(path, F_OK), -1);
}

static void test_existing_directories_are_fine(void **state) {
        char path[256];

        snprintf(path, sizeof path, "%s/x/y/history.db", root);
        assert_int_equal(mkdir_parents(path, 0755), 0);
        assert_int_equal(mkdir_parents(path, 0755), 0);
        snprintf(path, sizeof path, "%s/x/y", root);
        assert_true(is_dir(path, NULL));
}

static void test_a_file_in_the_way_is_an_error(void **state) {
        char file[256], path[256];

        snprintf(file, sizeof file, "%s/file", root);
        int fd = open(file, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
        assert_true(fd >= 0);
        close(fd);
        snprintf(path, sizeof path, "%s/file/d/sock", root);
        assert_int_equal(mkdir_parents(path, 0755), -ENOTDIR);
}

static void test_a_bare_name_has_no_parents(void **state) {
        assert_int_equal(mkdir_parents("name-without-slash", 0755), 0);
        assert_false(is_dir("name-without-slash", NULL));
        assert_int_equal(mkdir_parents(NULL, 0755), -EINVAL);
}

static void touch(const char *path, const char *text) {
        FILE *f = fopen(path, "we");
        assert_non_null(f);
        fputs(text, f);
        fclose(f);
}

static void test_rename_aside_never_over_another(void **state) {
        char path[256], *first = NULL, *second = NULL;

        snprintf(path, sizeof path, "%s/leases.log", root);
        touch(path, "one");
        assert_int_equal(rename_aside(path, false, &first), 0);
        assert_non_null(strstr(first, "/leases.log.corrupt-"));
        assert_int_equal(access(path, F_OK), -1);
        assert_int_equal(access(first, F_OK), 0);
        /* Within the same second: the name is taken, ".1" is added. */
        touch(path, "two");
        assert_int_equal(rename_aside(path, false, &second), 0);
        assert_string_not_equal(first, second);
        assert_int_equal(access(first, F_OK), 0);
        assert_int_equal(access(second, F_OK), 0);
        free(first);
        free(second);
}

static void test_rename_aside_of_a_missing_file(void **state) {
        char path[256], *moved = NULL;

        snprintf(path, sizeof path, "%s/missing", root);
        assert_int_equal(rename_aside(path, false, &moved), -ENOENT);
        assert_null(moved);
        assert_int_equal(rename_aside(path, true, &moved), 0);
        assert_non_null(strstr(moved, "/missing.corrupt-"));
        free(moved);
}

/* A closed stderr is held by /dev/null, read-only (a write fails as on the closed one) and close-on-exec; an
 * open one is left as it is. */
static void test_lock_file_has_one_holder_at_a_time(void **state) {
        char path[sizeof root + 32];
        snprintf(path, sizeof path, "%s/state/brokerd.lock", root);
        int fd = -1, again = -1;
        pid_t holder = -1;

        assert_int_equal(lock_file_take(path, &fd, &holder), 0);
        assert_true(fd >= 0);
        assert_int_equal(holder, -1); /* untouched on success */
        assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
        /* A second open file description is refused, and told who holds it; its fd is not touched. */
        assert_int_equal(lock_file_take(path, &again, &holder), -EWOULDBLOCK);
        assert_int_equal(again, -1);
        assert_int_equal(holder, getpid());
        /* The lock goes with the holder's fd. */
        safe_close(fd);
        assert_int_equal(lock_file_take(path, &again, &holder), 0);
        safe_close(again);
}

static void test_stdio_ensure_open_fills_a_closed_one(void **state) {
        int saved = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
        struct stat before, st, null;
        assert_true(saved >= 0);
        assert_int_equal(fstat(STDIN_FILENO, &before), 0);
        assert_int_equal(close(STDERR_FILENO), 0);
        int r = stdio_ensure_open();
        bool got = fstat(STDERR_FILENO, &st) == 0;
        int flags = fcntl(STDERR_FILENO, F_GETFL), fd_flags = fcntl(STDERR_FILENO, F_GETFD);
        assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO); /* before any assertion can fail */
        close(saved);
        assert_int_equal(r, 0);
        assert_true(got);
        assert_int_equal(stat("/dev/null", &null), 0);
        assert_true(S_ISCHR(st.st_mode) && st.st_rdev == null.st_rdev);
        assert_int_equal(flags & O_ACCMODE, O_RDONLY);
        assert_true(fd_flags >= 0 && (fd_flags & FD_CLOEXEC));

        assert_int_equal(stdio_ensure_open(), 0); /* all open: nothing changes */
        assert_int_equal(fstat(STDIN_FILENO, &st), 0);
        assert_true(st.st_dev == before.st_dev && st.st_ino == before.st_ino);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_creates_every_parent_but_not_the_path),
                cmocka_unit_test(test_stdio_ensure_open_fills_a_closed_one),
                cmocka_unit_test(test_existing_directories_are_fine),
                cmocka_unit_test(test_a_file_in_the_way_is_an_error),
                cmocka_unit_test(test_a_bare_name_has_no_parents),
                cmocka_unit_test(test_rename_aside_never_over_another),
                cmocka_unit_test(test_rename_aside_of_a_missing_file),
                cmocka_unit_test(test_lock_file_has_one_holder_at_a_time),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
