/* SPDX-License-Identifier: MIT */
/* bench-waiters — SPEC §12: with N clients waiting on a pool of one slot, how long does the next waiter
 * wait for its grant after the holder lets go (p50/p99/max), and how much memory does brokerd use?
 * Run once with a small queue and once with a large one: if a release cost O(n), the large queue's
 * latency would grow with n; the ratio of the two is the figure to read.
 *
 *   bench-waiters BROKERD [WAITERS [GRANTS]]        (defaults 10000 and 2000)
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench-util.h"

static char dir[] = "/tmp/bench-waiters.XXXXXX";
static char sock_path[100];
static pid_t brokerd = 0;

static void die(const char *what) {
        perror(what);
        if (brokerd > 0)
                kill(brokerd, SIGTERM);
        exit(EXIT_FAILURE);
}

static void send_acquire(int fd) {
        static const char call[] = "{\"method\":\"io.slotbroker.Acquire\",\"parameters\":{\"lane\":\"l\"},\"more\":true}";
        if (send(fd, call, sizeof call, MSG_NOSIGNAL) != (ssize_t) sizeof call) /* sizeof counts the NUL */
                die("send");
}

/* Reads what is there; returns 1 if a grant arrived in it, 0 if not, -1 at EOF. The first "queued" reply
 * gives the waiter's place (*ret_position, if still 0). Replies are small and the daemon sends whole
 * messages, so one never spans reads at these sizes. */
static int read_replies(int fd, int *ret_position) {
        char buf[8192];
        int granted = 0;
        for (;;) {
                ssize_t n = recv(fd, buf, sizeof buf - 1, MSG_DONTWAIT);
                if (n == 0)
                        return -1;
                if (n < 0)
                        return errno == EAGAIN ? granted : -1;
                buf[n] = '\0';
                for (char *p = buf; p < buf + n; p += strlen(p) + 1) {
                        if (strstr(p, "\"granted\""))
                                granted = 1;
                        const char *pos = strstr(p, "\"position\":");
                        if (pos && ret_position && *ret_position == 0)
                                *ret_position = atoi(pos + 11);
                }
        }
}

static int cmp_u64(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
        return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
        if (argc < 2) {
                fprintf(stderr, "usage: bench-waiters BROKERD [WAITERS [GRANTS]]\n");
                return 2;
        }
        int n_waiters = argc > 2 ? atoi(argv[2]) : 10000;
        int n_grants = argc > 3 ? atoi(argv[3]) : 2000;
        if (n_grants > n_waiters)
                n_grants = n_waiters;

        struct rlimit rl;
        getrlimit(RLIMIT_NOFILE, &rl);
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        if ((long) rl.rlim_cur < n_waiters + 64) {
                fprintf(stderr, "RLIMIT_NOFILE %ld is too low for %d waiters\n", (long) rl.rlim_cur, n_waiters);
                return 2;
        }

        if (!mkdtemp(dir))
                die("mkdtemp");
        char conf[300];
        snprintf(sock_path, sizeof sock_path, "%s/sock", dir);
        snprintf(conf, sizeof conf, "%s/brokerd.conf", dir);
        FILE *f = fopen(conf, "we");
        if (!f)
                die("fopen");
        fprintf(f, "[broker]\nmax-connections=%d\nmax-connections-per-uid=%d\nmax-waiters-per-uid=%d\n"
                   "[pool p]\nlimit=1\n[lane l]\npools=p\npolicy=wait\n",
                n_waiters + 100, n_waiters + 100, n_waiters + 100);
        fclose(f);

        brokerd = fork();
        if (brokerd < 0)
                die("fork");
        if (brokerd == 0) {
                /* BENCH_STATE_DIR: somewhere unwritable (/proc) measures without the lease commit to history.db. */
                char state[300];
                snprintf(state, sizeof state, "%s/state", dir);
                if (getenv("BENCH_STATE_DIR"))
                        snprintf(state, sizeof state, "%s", getenv("BENCH_STATE_DIR"));
                int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
                dup2(null, STDERR_FILENO);
                execl(argv[1], argv[1], "--config", conf, "--socket", sock_path, "--state-directory", state, (char *) NULL);
                _exit(127);
        }
        int holder = bench_connect_when_listening(sock_path);
        if (holder < 0)
                die("connect");
        send_acquire(holder);
        while (read_replies(holder, NULL) == 0)
                usleep(100);

        int ep = epoll_create1(EPOLL_CLOEXEC);
        int *fds = calloc((size_t) n_waiters, sizeof(int));
        int *position = calloc((size_t) n_waiters, sizeof(int)); /* as the broker numbered them, from 1 */
        for (int i = 0; i < n_waiters; i++) {
                fds[i] = bench_connect(sock_path);
                if (fds[i] < 0)
                        die("connect waiter");
                send_acquire(fds[i]);
                struct epoll_event ev = { .events = EPOLLIN, .data.u32 = (uint32_t) i };
                epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev);
        }
        /* Let every waiter's first reply ("queued") arrive. */
        struct epoll_event evs[1024];
        int seen = 0;
        uint64_t deadline = bench_now_ns() + 30000000000ULL;
        while (seen < n_waiters && bench_now_ns() < deadline) {
                int k = epoll_wait(ep, evs, 1024, 100);
                for (int i = 0; i < k; i++)
                        if (read_replies(fds[evs[i].data.u32], &position[evs[i].data.u32]) >= 0)
                                seen++;
        }
        long rss_before = bench_process_status_kib(brokerd, "VmRSS:");

        uint64_t *lat = calloc((size_t) n_grants, sizeof(uint64_t));
        int out_of_order = 0;
        for (int g = 0; g < n_grants; g++) {
                uint64_t t0 = bench_now_ns();
                close(holder); /* the release */
                int got = -1;
                while (got < 0) {
                        int k = epoll_wait(ep, evs, 1024, 5000);
                        if (k <= 0)
                                die("no grant within 5 s");
                        for (int i = 0; i < k; i++) {
                                int idx = (int) evs[i].data.u32;
                                int r = read_replies(fds[idx], NULL);
                                if (r == 1 && got < 0) {
                                        lat[g] = bench_now_ns() - t0;
                                        got = idx;
                                }
                        }
                }
                /* FIFO: the g-th grant goes to the waiter the broker told was at place g + 1. */
                out_of_order += position[got] != g + 1;
                epoll_ctl(ep, EPOLL_CTL_DEL, fds[got], NULL);
                holder = fds[got];
        }
        long rss_after = bench_process_status_kib(brokerd, "VmRSS:"), hwm = bench_process_status_kib(brokerd, "VmHWM:");

        qsort(lat, (size_t) n_grants, sizeof(uint64_t), cmp_u64);
        printf("waiters %d, grants %d: grant latency after a release p50 %.1f us, p99 %.1f us, max %.1f us; "
               "brokerd RSS %.1f MiB (before grants %.1f MiB, peak %.1f MiB)\n",
               n_waiters, n_grants, lat[n_grants / 2] / 1e3, lat[(n_grants * 99) / 100] / 1e3, lat[n_grants - 1] / 1e3,
               rss_after / 1024.0, rss_before / 1024.0, hwm / 1024.0);
        if (out_of_order)
                printf("FIFO violated: %d grants went to a waiter other than the one at the head\n", out_of_order);

        kill(brokerd, SIGTERM);
        waitpid(brokerd, NULL, 0);
        bench_remove_dir(dir);
        return 0;
}
