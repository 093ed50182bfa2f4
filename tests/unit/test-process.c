/* SPDX-License-Identifier: MIT */
/* test-process.c — a passed pidfd's facts (process.h): what process_open_pidfd() reads, by the kernel's
 * PIDFD_GET_INFO where there is one and by /proc otherwise, agrees with /proc's own files; what is no pidfd,
 * and a process gone, are refused; the peer's pid names the peer only if it ran when the connection was taken
 * (process_check_attachable()); a process group runs while one of its members has not exited, zombies all
 * (exited, not reaped) run nothing (process_group_is_alive()). Over real children of this test. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
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

/* ---- a process group's life (process_group_is_alive()) ---- */

/* Until pid has exited, left a zombie (WNOWAIT: not reaped). */
static void wait_zombie(pid_t pid) {
        siginfo_t si = {};
        assert_int_equal(waitid(P_PID, (id_t) pid, &si, WEXITED | WNOWAIT), 0);
        assert_int_equal(si.si_pid, pid);
}

static pid_t group; /* the group of the case under way, killed by teardown_group() whatever failed */

/* A child leading a process group of its own, as slotctl runs a command: returns 0 in the child. */
static pid_t group_leader_start(void) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                (void) setpgid(0, 0);
                return 0;
        }
        (void) setpgid(pid, pid); /* both sides: the group exists whichever runs first */
        group = pid;
        return pid;
}

static int teardown_group(void **state) {
        if (group > 0) {
                (void) kill(-group, SIGKILL);
                while (waitpid(-group, NULL, 0) > 0)
                        ;
                group = 0;
        }
        (void) prctl(PR_SET_CHILD_SUBREAPER, 0);
        return 0;
}

/* Whether this test's /proc hides processes (hidepid=): then brokerd cannot tell a group of zombies from one
 * whose other members it cannot see, and keeps it alive. */
static bool proc_hides(void) {
        char buf[65536];
        FILE *f = fopen("/proc/self/mountinfo", "re");
        assert_non_null(f);
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = '\0';
        return proc_mountinfo_hides_processes(buf);
}

static void test_a_group_of_zombies_runs_nothing(void **state) {
        pid_t leader = group_leader_start();
        if (leader == 0)
                _exit(0);
        wait_zombie(leader);
        /* kill() still finds the group: its zombie keeps the id until its parent reaps it (a container's PID 1
         * may never). It runs nothing. */
        assert_int_equal(kill(-leader, 0), 0);
        pid_t member = 4242;
        assert_int_equal(process_group_is_alive(leader, &member), proc_hides());
        assert_int_equal(member, 0);
        assert_int_equal(waitpid(leader, NULL, 0), leader);
        group = 0;
        assert_false(process_group_is_alive(leader, NULL));
}

static void test_a_group_runs_while_a_member_runs_after_its_leader(void **state) {
        /* The member, orphaned by its leader, is ours to reap (as it is PID 1's in production). */
        assert_int_equal(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
        int p[2];
        assert_int_equal(pipe2(p, O_CLOEXEC), 0);
        pid_t leader = group_leader_start();
        if (leader == 0) {
                pid_t m = fork();
                if (m < 0)
                        _exit(1);
                if (m == 0)
                        for (;;)
                                pause();
                if (write(p[1], &m, sizeof m) != sizeof m)
                        _exit(1);
                _exit(0);
        }
        pid_t m = 0;
        assert_int_equal(read(p[0], &m, sizeof m), (ssize_t) sizeof m);
        close(p[0]);
        close(p[1]);
        wait_zombie(leader);
        pid_t member = 0;
        assert_true(process_group_is_alive(leader, &member));
        assert_int_equal(member, m);
        /* Found again where it was. */
        assert_true(process_group_is_alive(leader, &member));
        assert_int_equal(member, m);
        /* The member killed, and left a zombie too: the group runs nothing, whatever was found before. */
        assert_int_equal(kill(m, SIGKILL), 0);
        wait_zombie(m);
        assert_int_equal(kill(-leader, 0), 0);
        assert_int_equal(process_group_is_alive(leader, &member), proc_hides());
        assert_int_equal(member, 0);
        assert_int_equal(waitpid(m, NULL, 0), m);
        assert_int_equal(waitpid(leader, NULL, 0), leader);
        group = 0;
}

static void *thread_waits(void *userdata) {
        for (;;)
                pause();
        return NULL;
}

static void test_a_leader_whose_other_threads_run_is_alive(void **state) {
        pid_t leader = group_leader_start();
        if (leader == 0) {
                pthread_t t;
                if (pthread_create(&t, NULL, thread_waits, NULL) != 0)
                        _exit(1);
                pthread_exit(NULL); /* the main thread only: /proc shows the process a zombie, its thread runs */
        }
        char st = 0;
        long ppid, pgid;
        unsigned long long start;
        for (unsigned i = 0; i < 10000 && st != 'Z'; i++) {
                stat_reference(leader, &st, &ppid, &pgid, &start);
                if (st != 'Z')
                        (void) usleep(1000);
        }
        assert_true(st == 'Z');
        pid_t member = 0;
        assert_true(process_group_is_alive(leader, &member));
        assert_int_equal(member, leader);
        assert_int_equal(kill(leader, SIGKILL), 0);
        wait_zombie(leader);
        assert_int_equal(process_group_is_alive(leader, &member), proc_hides());
        assert_int_equal(waitpid(leader, NULL, 0), leader);
        group = 0;
}

static void test_proc_hidepid_is_read_from_mountinfo(void **state) {
        const char *plain = "21 26 0:20 / /proc rw,relatime - proc proc rw\n"
                            "22 21 0:21 / /proc/sys/fs/binfmt_misc rw - autofs systemd-1 rw,fd=30\n";
        assert_false(proc_mountinfo_hides_processes(plain));
        assert_true(proc_mountinfo_hides_processes("21 26 0:20 / /proc rw - proc proc rw,hidepid=2\n"));
        assert_true(proc_mountinfo_hides_processes("21 26 0:20 / /proc rw - proc proc rw,hidepid=invisible,subset=pid"));
        assert_true(proc_mountinfo_hides_processes("21 26 0:20 / /proc rw - proc proc rw,hidepid=1,gid=5\n"));
        assert_true(proc_mountinfo_hides_processes("21 26 0:20 / /proc rw - proc proc rw,hidepid=ptraceable\n"));
        assert_false(proc_mountinfo_hides_processes("21 26 0:20 / /proc rw - proc proc rw,hidepid=0\n"));
        assert_false(proc_mountinfo_hides_processes("21 26 0:20 / /proc rw - proc proc rw,hidepid=off,subset=pid\n"));
        /* The last mount on /proc is the one seen (a service's own, ProtectProc=, over the host's). */
        assert_true(proc_mountinfo_hides_processes("21 26 0:20 / /proc rw - proc proc rw\n"
                                                   "90 21 0:50 / /proc rw shared:5 - proc proc rw,hidepid=invisible\n"));
        assert_false(proc_mountinfo_hides_processes("21 26 0:20 / /proc rw - proc proc rw,hidepid=2\n"
                                                    "90 21 0:50 / /proc rw - proc proc rw\n"));
        /* No /proc of type proc: nothing known, so it may hide. */
        assert_true(proc_mountinfo_hides_processes(""));
        assert_true(proc_mountinfo_hides_processes("21 26 0:20 / /proc rw - tmpfs tmpfs rw\n"));
        assert_true(proc_mountinfo_hides_processes("21 26 0:20 / /proc/x rw - proc proc rw\n"));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_teardown(test_facts_by_the_kernel_agree_with_proc, teardown),
                cmocka_unit_test_teardown(test_facts_by_proc_alone, teardown),
                cmocka_unit_test_teardown(test_no_pidfd_is_refused, teardown),
                cmocka_unit_test_teardown(test_a_process_gone_is_refused, teardown),
                cmocka_unit_test_teardown(test_a_name_like_stat_fields, teardown),
                cmocka_unit_test_teardown(test_the_peers_pid_started_after_the_connection_is_another_process, teardown),
                cmocka_unit_test_teardown(test_a_group_of_zombies_runs_nothing, teardown_group),
                cmocka_unit_test_teardown(test_a_group_runs_while_a_member_runs_after_its_leader, teardown_group),
                cmocka_unit_test_teardown(test_a_leader_whose_other_threads_run_is_alive, teardown_group),
                cmocka_unit_test(test_proc_hidepid_is_read_from_mountinfo),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
