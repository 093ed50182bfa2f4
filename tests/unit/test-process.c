/* SPDX-License-Identifier: MIT */
/* test-process.c — a passed pidfd's facts (process.h): what process_open_pidfd() reads, by the kernel's
 * PIDFD_GET_INFO where there is one and by /proc otherwise, agrees with /proc's own files; what is no pidfd,
 * and a process gone, are refused; the peer's pid names the peer only if it ran when the connection was taken
 * (process_check_attachable()). Over real children of this test. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "process.h"

#define OTHER_UID 4242

static pid_t child;

static void stat_reference(pid_t pid, char *ret_state, long *ret_ppid, long *ret_pgid,
                           unsigned long long *ret_start);

/* Until pid sleeps in pause(): between its write to the pipe and there it runs, and the tests compare its
 * state as read twice. */
static void wait_sleeping(pid_t pid) {
        for (unsigned i = 0; i < 10000; i++) {
                char state;
                long ppid, pgid;
                unsigned long long start;
                stat_reference(pid, &state, &ppid, &pgid, &start);
                if (state == 'S')
                        return;
                (void) usleep(1000);
        }
        fail_msg("child %d never went to sleep", (int) pid);
}

/* A child that waits; as root, with another real uid than its effective one (where the kernel's facts and
 * /proc's would part if a field were read from the wrong place). Its name, when one is given, is what
 * /proc/PID/stat shows between parentheses. */
static int child_start_named(const char *name) {
        int ready[2];
        assert_int_equal(pipe2(ready, O_CLOEXEC), 0);
        child = fork();
        assert_true(child >= 0);
        if (child == 0) {
                if (name && prctl(PR_SET_NAME, name) < 0)
                        _exit(1);
                if (getuid() == 0 && setresuid(OTHER_UID, 0, 0) < 0)
                        _exit(1);
                if (write(ready[1], "x", 1) != 1)
                        _exit(1);
                for (;;)
                        pause();
        }
        char c;
        assert_int_equal(read(ready[0], &c, 1), 1);
        close(ready[0]);
        close(ready[1]);
        wait_sleeping(child);
        int pidfd = (int) syscall(SYS_pidfd_open, child, 0);
        if (pidfd < 0 && errno == ENOSYS)
                return -1; /* valgrind 3.19 has no pidfd_open() */
        assert_true(pidfd >= 0);
        return pidfd;
}

static int child_start(void) {
        return child_start_named(NULL);
}

/* The reference for process.c's reading of /proc/PID/stat: sscanf() over the fields after the last ')'. */
static void stat_reference(pid_t pid, char *ret_state, long *ret_ppid, long *ret_pgid,
                           unsigned long long *ret_start) {
        char path[64], buf[4096];
        snprintf(path, sizeof path, "/proc/%d/stat", (int) pid);
        FILE *f = fopen(path, "re");
        assert_non_null(f);
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = '\0';
        const char *p = strrchr(buf, ')');
        assert_non_null(p);
        assert_int_equal(sscanf(p + 1, " %c %ld %ld %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
                                ret_state, ret_ppid, ret_pgid, ret_start), 4);
}

static void check_stat_fields(const ProcessInfo *got) {
        char state;
        long ppid, pgid;
        unsigned long long start;
        stat_reference(got->pid, &state, &ppid, &pgid, &start);
        assert_true(got->state == state);
        assert_int_equal(got->ppid, ppid);
        assert_int_equal(got->pgid, pgid);
        assert_int_equal(got->pgid, getpgid(got->pid));
        assert_true(got->start_time == start);
        assert_true(got->start_time > 0);
}

static int teardown(void **state) {
        if (child > 0) {
                (void) kill(child, SIGKILL);
                (void) waitpid(child, NULL, 0);
                child = 0;
        }
        process_use_pidfd_info(true);
        return 0;
}

static void check_facts(bool by_kernel) {
        process_use_pidfd_info(by_kernel);
        int pidfd = child_start();
        if (pidfd < 0)
                skip();
        ProcessInfo got, want;
        assert_int_equal(process_open_pidfd(pidfd, &got), 0);
        assert_int_equal(process_get_info(child, &want), 0);
        assert_int_equal(got.pid, child);
        assert_int_equal(got.tgid, child);
        assert_int_equal(got.ppid, getpid());
        assert_int_equal(got.pgid, want.pgid);
        assert_int_equal(got.uid, getuid() == 0 ? (uid_t) OTHER_UID : getuid());
        assert_int_equal(got.uid, want.uid);
        assert_int_equal(got.start_time, want.start_time);
        assert_true(got.state == want.state);
        check_stat_fields(&got);
        close(pidfd);
}

static void test_facts_by_the_kernel_agree_with_proc(void **state) {
        check_facts(true);
}

static void test_facts_by_proc_alone(void **state) {
        check_facts(false);
}

static void test_no_pidfd_is_refused(void **state) {
        int sv[2], p[2];
        ProcessInfo info;
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        assert_int_equal(pipe2(p, O_CLOEXEC), 0);
        for (int by_kernel = 0; by_kernel <= 1; by_kernel++) {
                process_use_pidfd_info(by_kernel);
                assert_int_equal(process_open_pidfd(sv[0], &info), -EBADF);
                assert_int_equal(process_open_pidfd(p[1], &info), -EBADF);
        }
        close(sv[0]);
        close(sv[1]);
        close(p[0]);
        close(p[1]);
}

static void test_a_process_gone_is_refused(void **state) {
        for (int by_kernel = 0; by_kernel <= 1; by_kernel++) {
                process_use_pidfd_info(by_kernel);
                int pidfd = child_start();
                if (pidfd < 0)
                        skip();
                assert_int_equal(kill(child, SIGKILL), 0);
                assert_int_equal(waitpid(child, NULL, 0), child);
                child = 0;
                ProcessInfo info;
                assert_int_equal(process_open_pidfd(pidfd, &info), -ESRCH);
                close(pidfd);
        }
}

/* A name that looks like the fields after it: the fields are read after the last ')', whatever the name holds. */
static void test_a_name_like_stat_fields(void **state) {
        static const char *const names[] = { ") S 1 1 1 (", "a b) 9 9", ")", "((((" };
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
                int pidfd = child_start_named(names[i]);
                if (pidfd < 0)
                        skip();
                ProcessInfo info;
                assert_int_equal(process_get_info(child, &info), 0);
                assert_int_equal(info.pid, child);
                assert_int_equal(info.ppid, getpid());
                check_stat_fields(&info);
                close(pidfd);
                teardown(NULL);
        }
}

/* process_check_attachable(): the peer by its pid only while that pid names a process that ran when the
 * connection was taken; one that started later took the pid once the peer was gone (maybe another user's,
 * which a revocation would signal). The peer's child is checked by its parent and uid, started when it may. */
static void test_the_peers_pid_started_after_the_connection_is_another_process(void **state) {
        int pidfd = child_start();
        if (pidfd < 0)
                skip();
        ProcessInfo info;
        assert_int_equal(process_get_info(child, &info), 0);
        usec_t tick = USEC_PER_SEC / (usec_t) sysconf(_SC_CLK_TCK);
        usec_t started = (usec_t) info.start_time * tick; /* the start of its tick on CLOCK_BOOTTIME */
        /* As the peer: a connection taken at its start tick or later, yes; one taken before it, no. */
        assert_int_equal(process_check_attachable(&info, child, getuid(), started), 0);
        assert_int_equal(process_check_attachable(&info, child, getuid(), now_boottime()), 0);
        assert_int_equal(process_check_attachable(&info, child, getuid(), started - 1), -EPERM);
        /* As the peer's child, of its uid (the child's real uid: another one when root): whenever it started. */
        assert_int_equal(process_check_attachable(&info, getpid(), info.uid, started - 1), 0);
        assert_int_equal(process_check_attachable(&info, getpid(), info.uid + 1, now_boottime()), -EPERM);
        close(pidfd);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_teardown(test_facts_by_the_kernel_agree_with_proc, teardown),
                cmocka_unit_test_teardown(test_facts_by_proc_alone, teardown),
                cmocka_unit_test_teardown(test_no_pidfd_is_refused, teardown),
                cmocka_unit_test_teardown(test_a_process_gone_is_refused, teardown),
                cmocka_unit_test_teardown(test_a_name_like_stat_fields, teardown),
                cmocka_unit_test_teardown(test_the_peers_pid_started_after_the_connection_is_another_process, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
