/* SPDX-License-Identifier: MIT */
/* held-command.c — the command of `slotctl run`, started before its grant (SPEC §3.4: its pid goes with
 * the Acquire call) and held on a pipe until then.
 *
 * It is a clone sharing slotctl's memory, as posix_spawn() makes one, rather than a fork: a fork copies the
 * page tables and then faults a page copy on either side for every page either writes while slotctl
 * connects and waits; that was a tenth of `slotctl run -- true`. The price is discipline in the child,
 * which shares slotctl's heap, stdio and errno (its thread-local storage) until it execs: it allocates
 * nothing, takes no lock, and makes no call that can fail before the word to go. After it, slotctl waits in
 * read() on the status pipe until the exec succeeded (the pipe closes on exec) or failed (the errno comes
 * through it), so nothing of slotctl's runs while the child's execvpe() looks along $PATH. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "held-command.h"

/* The child's stack until exec: execvpe() keeps the path it tries there (up to PATH_MAX), and for a script
 * without "#!" a copy of argv to run it with /bin/sh, so the stack grows with argv (as posix_spawn's does). */
#define HELD_STACK_BASE (64 * 1024)

/* What the child reads. Fixed before the clone, since slotctl runs on while the child starts; envp alone
 * is written later, before the word to go, and read after it. */
typedef struct HeldChild {
        pid_t parent;
        char *const *argv;
        char *const *envp;
        sigset_t exec_mask;
        int go_fd;          /* its end: 'G' means exec, EOF means exit without running */
        int status_fd;      /* its end: closed by the exec, or the failed exec's errno */
        int parent_fds[2];  /* slotctl's ends, closed in the child's copy of the fd table */
} HeldChild;

struct HeldCommand {
        HeldChild child;
        pid_t pid;
        int go_fd;          /* our ends, closed once used */
        int status_fd;
        void *stack;
        size_t stack_size;
};

/* Not instrumented by ASan, whose bookkeeping expects one stack per thread: the child runs on a stack of its
 * own with slotctl's thread state. */
__attribute__((no_sanitize("address"))) static _Noreturn int held_command_child(void *userdata) {
        const HeldChild *c = userdata;
        char word;

        /* Its own group: the broker watches the group, and signals reach the command's children too. */
        (void) setpgid(0, 0);
        /* Dying before the word must not leave a command behind that would start later. */
        (void) prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != c->parent)
                _exit(EXIT_FAILURE);
        /* slotctl's death must end the pipe, and the status pipe must end with our exec. */
        (void) close(c->parent_fds[0]);
        (void) close(c->parent_fds[1]);
        /* No handler is installed, so nothing interrupts this read: it ends with the word or with EOF. */
        if (read(c->go_fd, &word, 1) != 1 || word != 'G')
                _exit(EXIT_SUCCESS);

        /* Told to go: from here the command outlives slotctl (SPEC §3.4). */
        (void) prctl(PR_SET_PDEATHSIG, 0);
        (void) sigprocmask(SIG_SETMASK, &c->exec_mask, NULL);
        execvpe(c->argv[0], c->argv, c->envp);
        int error = errno;
        if (write(c->status_fd, &error, sizeof error) < 0) {
                /* slotctl is gone: nobody to tell but the exit status */
        }
        _exit(error == ENOENT ? 127 : 126); /* as shells and env(1) */
}

/* Waits until the child has left the memory it shares with us: the status pipe ends when it exec'd (the exec
 * drops our memory before it closes CLOEXEC fds) or exited (as does exit). Returns its exec's errno, 0 for
 * none, or a negative errno of our own. */
static int held_command_wait_gone(HeldCommand *c) {
        int error = 0;
        size_t got = 0;
        char buf[sizeof error + 1];

        for (;;) {
                ssize_t k = read(c->status_fd, buf + got, sizeof buf - got);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0) {
                        c->status_fd = safe_close(c->status_fd);
                        return -errno;
                }
                if (k == 0)
                        break;
                got = MIN(got + (size_t) k, sizeof error);
        }
        c->status_fd = safe_close(c->status_fd);
        if (got == sizeof error)
                memcpy(&error, buf, sizeof error);
        return error;
}

HeldCommand *held_command_free(HeldCommand *c) {
        if (!c)
                return NULL;
        if (c->pid > 0 && c->status_fd >= 0) {
                /* Never started: EOF on its pipe tells it to exit, and its stack is ours once it did. */
                c->go_fd = safe_close(c->go_fd);
                (void) held_command_wait_gone(c);
        }
        safe_close(c->go_fd);
        safe_close(c->status_fd);
        if (c->stack)
                (void) munmap(c->stack, c->stack_size);
        free(c);
        return NULL;
}

int held_command_new(char *const *argv, const sigset_t *exec_mask, HeldCommand **ret) {
        _cleanup_close_ int child_go_fd = -EBADF, child_status_fd = -EBADF;
        int fds[2];

        assert_return(argv && argv[0], -EINVAL);
        assert_return(exec_mask, -EINVAL);
        assert_return(ret, -EINVAL);

        _cleanup_(held_command_freep) HeldCommand *c = calloc(1, sizeof *c);
        if (!c)
                return -ENOMEM;
        c->go_fd = c->status_fd = -EBADF;
        if (pipe2(fds, O_CLOEXEC) < 0)
                return -errno;
        child_go_fd = fds[0];
        c->go_fd = fds[1];
        if (pipe2(fds, O_CLOEXEC) < 0)
                return -errno;
        c->status_fd = fds[0];
        child_status_fd = fds[1];
        size_t argc = 0, page = (size_t) sysconf(_SC_PAGESIZE);
        while (argv[argc])
                argc++;
        c->stack_size = (HELD_STACK_BASE + (argc + 2) * sizeof(char *) + page - 1) / page * page;
        c->stack = mmap(NULL, c->stack_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
        if (c->stack == MAP_FAILED) {
                c->stack = NULL;
                return -errno;
        }
        c->child = (HeldChild) {
                .parent = getpid(),
                .argv = argv,
                .exec_mask = *exec_mask,
                .go_fd = child_go_fd,
                .status_fd = child_status_fd,
                .parent_fds = { c->go_fd, c->status_fd },
        };

        pid_t pid = clone(held_command_child, (char *) c->stack + c->stack_size, CLONE_VM | SIGCHLD, &c->child);
        if (pid < 0)
                return -errno;
        c->pid = pid;
        /* Set on both sides: whichever runs first, the group exists before anybody signals it. */
        (void) setpgid(pid, pid);

        *ret = TAKE_PTR(c);
        return 0;
}

pid_t held_command_get_pid(const HeldCommand *c) {
        assert_return(c, -EINVAL);
        return c->pid;
}

int held_command_start(HeldCommand *c, char *const *envp) {
        ssize_t k;

        assert_return(c && envp, -EINVAL);
        assert_return(c->go_fd >= 0, -EALREADY);

        c->child.envp = envp;
        /* Stopped while it was held (kill -STOP of its group), it would take the word only when continued,
         * and we wait for its exec below: it goes now, as it was told to. */
        (void) kill(c->pid, SIGCONT);
        do
                k = write(c->go_fd, "G", 1);
        while (k < 0 && errno == EINTR);
        c->go_fd = safe_close(c->go_fd);
        if (k < 0)
                return -errno; /* EPIPE: it is gone already, as waiting for it will tell */

        int error = held_command_wait_gone(c);
        return error > 0 ? -error : error;
}
