/* SPDX-License-Identifier: MIT */
/* test-held-command.c — slotctl run's command: held in its own process group until told, then run with
 * exactly the environment and signal mask it was given; dismissed without running; killed when its
 * starter dies first; exec failures reported as errno and as exit statuses 127 and 126. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "held-command.h"

static char dir[] = "/tmp/test-held-command.XXXXXX";
static sigset_t no_signals;

static int setup(void **state) {
        (void) state;
        sigemptyset(&no_signals);
        return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
        char cmd[64];
        (void) state;
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        return system(cmd) == 0 ? 0 : -1;
}

static char *path_of(const char *name) {
        static char path[128];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        return path;
}

static char *slurp(const char *path) {
        static char buf[256];
        FILE *f = fopen(path, "re");
        if (!f)
                return NULL;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = '\0';
        return buf;
}

static int wait_status(pid_t pid) {
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        return status;
}

/* The process has not exec'd: it is still a copy of this test, named as it is. */
static void assert_not_started(pid_t pid) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/comm", (int) pid);
        char *comm = strdup(slurp(path) ?: "");
        assert_non_null(comm);
        assert_string_equal(comm, slurp("/proc/self/comm"));
        free(comm);
}

/* `sh -c COMMAND` held, run in the test's directory. One at a time: the command line is static. */
static HeldCommand *held_shell(const char *command, const sigset_t *exec_mask) {
        static char script[256];
        static char *argv[] = { "sh", "-c", script, NULL };
        HeldCommand *c = NULL;

        snprintf(script, sizeof script, "cd %s && %s", dir, command);
        assert_int_equal(held_command_new(argv, exec_mask, &c), 0);
        assert_true(held_command_get_pid(c) > 0);
        return c;
}

/* Frees c (starting it first with envp, unless NULL) and returns the exit status of its process. */
static int finish(HeldCommand *c, char **envp) {
        pid_t pid = held_command_get_pid(c);
        if (envp)
                assert_int_equal(held_command_start(c, envp), 0);
        held_command_free(c);
        int status = wait_status(pid);
        assert_true(WIFEXITED(status));
        return WEXITSTATUS(status);
}

static void test_runs_when_told_with_the_given_environment(void **state) {
        char *envp[] = { "GREETING=hello", NULL }; /* no HOME: only what it is given */
        (void) state;

        HeldCommand *c = held_shell("echo \"$GREETING/${HOME-unset}\" > out", &no_signals);
        pid_t pid = held_command_get_pid(c);
        assert_int_equal(getpgid(pid), pid); /* a group of its own */
        assert_not_started(pid);
        assert_null(slurp(path_of("out")));

        assert_int_equal(held_command_start(c, envp), 0);
        assert_int_equal(held_command_start(c, envp), -EALREADY);
        assert_int_equal(finish(c, NULL), 0);
        assert_string_equal(slurp(path_of("out")), "hello/unset\n");
}

static void test_gets_the_given_signal_mask(void **state) {
        char *envp[] = { NULL };
        sigset_t blocked, saved;
        (void) state;

        /* Blocked here, as slotctl blocks what its signalfd reads; the command gets the mask it is given. */
        sigemptyset(&blocked);
        sigaddset(&blocked, SIGTERM);
        assert_int_equal(sigprocmask(SIG_BLOCK, &blocked, &saved), 0);
        HeldCommand *c = held_shell("grep SigBlk /proc/self/status > mask", &no_signals);
        assert_int_equal(sigprocmask(SIG_SETMASK, &saved, NULL), 0);
        assert_int_equal(finish(c, envp), 0);
        assert_string_equal(slurp(path_of("mask")), "SigBlk:\t0000000000000000\n");
}

static void test_dismissed_command_exits_without_running(void **state) {
        (void) state;

        assert_int_equal(finish(held_shell("touch dismissed", &no_signals), NULL), 0);
        assert_null(slurp(path_of("dismissed")));
}

/* Starts argv[0] and returns the exit status of the failed exec, after checking its errno. */
static int failed_exec_status(char *name, int expected_errno) {
        char *argv[] = { name, NULL }, *envp[] = { "PATH=/usr/bin:/bin", NULL };
        HeldCommand *c = NULL;

        assert_int_equal(held_command_new(argv, &no_signals, &c), 0);
        pid_t pid = held_command_get_pid(c);
        assert_int_equal(held_command_start(c, envp), -expected_errno);
        held_command_free(c);
        int status = wait_status(pid);
        assert_true(WIFEXITED(status));
        return WEXITSTATUS(status);
}

static void test_exec_failures_are_reported(void **state) {
        (void) state;

        assert_int_equal(failed_exec_status("/nonexistent/command", ENOENT), 127);
        assert_int_equal(failed_exec_status("no-such-command-along-the-path", ENOENT), 127);
        int fd = open(path_of("not-executable"), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
        assert_true(fd >= 0);
        close(fd);
        assert_int_equal(failed_exec_status(path_of("not-executable"), EACCES), 126);
}

/* A script without "#!" runs through /bin/sh, which execvpe() arranges with a copy of argv on the child's
 * stack: a long command line must fit there too. */
static void test_script_without_interpreter_line_gets_a_long_argv(void **state) {
        enum { N_ARGS = 20000 };
        char script[256], *envp[] = { "PATH=/usr/bin:/bin", NULL };
        (void) state;

        snprintf(script, sizeof script, "%s/no-interpreter-line", dir);
        FILE *f = fopen(script, "we");
        assert_non_null(f);
        fprintf(f, "echo $# > %s/argc\n", dir);
        assert_int_equal(fclose(f), 0);
        assert_int_equal(chmod(script, 0755), 0);

        char **argv = calloc(N_ARGS + 2, sizeof(char *));
        assert_non_null(argv);
        argv[0] = script;
        for (size_t i = 1; i <= N_ARGS; i++)
                argv[i] = "x";
        HeldCommand *c = NULL;
        assert_int_equal(held_command_new(argv, &no_signals, &c), 0);
        assert_int_equal(finish(c, envp), 0);
        free(argv);
        assert_string_equal(slurp(path_of("argc")), "20000\n");
}

/* A starter that dies before the word takes its held command with it: nothing starts later. */
static void test_dies_with_its_starter(void **state) {
        int fds[2];
        (void) state;

        /* The held command is reparented to us when its starter dies, so that we can reap it. */
        assert_int_equal(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
        assert_int_equal(pipe2(fds, O_CLOEXEC), 0);
        pid_t starter = fork();
        assert_true(starter >= 0);
        if (starter == 0) {
                HeldCommand *c = held_shell("touch orphan", &no_signals);
                pid_t pid = held_command_get_pid(c);
                _exit(write(fds[1], &pid, sizeof pid) == sizeof pid ? 0 : 1); /* without a word, and without freeing c */
        }
        close(fds[1]);
        pid_t held;
        assert_int_equal(read(fds[0], &held, sizeof held), sizeof held);
        close(fds[0]);
        assert_int_equal(WEXITSTATUS(wait_status(starter)), 0);
        /* Killed by its death signal; or it saw its pipe end first (exit 0, as if dismissed), or its
         * starter die before the signal was armed (exit 1). Never run. */
        int status = wait_status(held);
        if (WIFSIGNALED(status))
                assert_int_equal(WTERMSIG(status), SIGKILL);
        else
                assert_in_range(WEXITSTATUS(status), 0, 1);
        assert_null(slurp(path_of("orphan")));
        assert_int_equal(prctl(PR_SET_CHILD_SUBREAPER, 0), 0);
}

static void test_invalid_arguments(void **state) {
        char *empty[] = { NULL }, *argv[] = { "true", NULL };
        HeldCommand *c = (HeldCommand *) 0x1;
        (void) state;

        assert_int_equal(held_command_new(empty, &no_signals, &c), -EINVAL);
        assert_int_equal(held_command_new(argv, NULL, &c), -EINVAL);
        assert_ptr_equal(c, (HeldCommand *) 0x1); /* untouched on failure */
        assert_null(held_command_free(NULL));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_runs_when_told_with_the_given_environment),
                cmocka_unit_test(test_gets_the_given_signal_mask),
                cmocka_unit_test(test_dismissed_command_exits_without_running),
                cmocka_unit_test(test_exec_failures_are_reported),
                cmocka_unit_test(test_script_without_interpreter_line_gets_a_long_argv),
                cmocka_unit_test(test_dies_with_its_starter),
                cmocka_unit_test(test_invalid_arguments),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
