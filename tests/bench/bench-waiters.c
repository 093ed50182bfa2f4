/* SPDX-License-Identifier: MIT */
/* bench-waiters — SPEC §12: with N clients waiting on a pool of one slot, how long does the next waiter
 * wait for its grant after the holder lets go (p50/p99/max), and how much memory does brokerd use?
 * Run once with a small queue and once with a large one: if a release cost O(n), the large queue's
 * latency would grow with n; the ratio of the two is the figure to read.
 *
 *   bench-waiters BROKERD [WAITERS [GRANTS]]        (defaults 10000 and 2000)
 *
 * Issue 22 item 9 through brokerd: with `labels`, a pool of 64 labelled members, all held, and WAITERS
 * waiting with random label sets (those of bench-labels); GRANTS times the holder of the member held longest
 * that some waiter can use lets go, and the grant is timed until that waiter reads it. The same run with
 * waiters that ask for no label is the reference, in the same invocation.
 *
 *   bench-waiters BROKERD WAITERS GRANTS labels
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
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

/* ---- labels (issue 22 item 9) ---- */

#define MEMBERS 64
#define LABELS 8

static uint64_t rng = 12345;
static uint64_t rnd(void) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        return rng;
}

static uint64_t updates; /* replies other than grants read: "queued" and position updates */

static const char *const label_names[LABELS] = { "arm64", "usb3", "gpu", "big", "fast", "eu", "us", "flash" };

static void send_text(int fd, const char *text) {
        size_t n = strlen(text) + 1; /* with its NUL */
        if (send(fd, text, n, MSG_NOSIGNAL) != (ssize_t) n)
                die("send");
}

/* Reads what is there; returns 1 and the first member of a grant (*ret_member, -1 if it named none), 0 if no
 * grant arrived, -1 at EOF or an error reply. */
static int read_grant(int fd, int *ret_member) {
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
                        if (strstr(p, "\"error\"")) {
                                fprintf(stderr, "error reply: %s\n", p);
                                return -1;
                        }
                        if (!strstr(p, "\"granted\"")) {
                                updates++;
                                continue;
                        }
                        granted = 1;
                        const char *m = strstr(p, "\"members\":[\"m");
                        *ret_member = m ? atoi(m + strlen("\"members\":[\"m")) : -1;
                }
        }
}

static void wait_grant(int fd, int *ret_member) {
        uint64_t deadline = bench_now_ns() + 10000000000ULL;
        int r;
        while ((r = read_grant(fd, ret_member)) == 0) {
                if (bench_now_ns() > deadline)
                        die("no grant within 10 s");
                usleep(50);
        }
        if (r < 0)
                die("grant");
}

static pid_t start_brokerd(const char *exe, const char *config_text) {
        char conf[300];
        snprintf(sock_path, sizeof sock_path, "%s/sock", dir);
        snprintf(conf, sizeof conf, "%s/brokerd.conf", dir);
        FILE *f = fopen(conf, "we");
        if (!f)
                die("fopen");
        fputs(config_text, f);
        fclose(f);
        unlink(sock_path);
        static int runs = 0;
        runs++;
        pid_t pid = fork();
        if (pid < 0)
                die("fork");
        if (pid == 0) {
                /* A state directory per run: the leases of the run before are not restored into this one. */
                char state[300];
                snprintf(state, sizeof state, "%s/state%d", dir, runs);
                if (getenv("BENCH_STATE_DIR"))
                        snprintf(state, sizeof state, "%s", getenv("BENCH_STATE_DIR"));
                int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
                dup2(null, STDERR_FILENO);
                execl(exe, exe, "--config", conf, "--socket", sock_path, "--state-directory", state, (char *) NULL);
                _exit(127);
        }
        return pid;
}

/* One run: every member held, WAITERS waiting (with label sets, or none), then GRANTS times the member held
 * longest that some waiter can use is let go. The broker must hand it to the first waiter (in queue order)
 * whose labels it carries: computed here too, and a grant elsewhere is counted. */
static void run_labels(const char *exe, const char *config, const uint64_t *carriers, int n_waiters, int n_grants,
                       bool labelled) {
        int holder[MEMBERS];
        uint64_t *mask = calloc((size_t) n_waiters, sizeof(uint64_t));  /* the members each waiter can use */
        int *fds = calloc((size_t) n_waiters, sizeof(int));
        bool *granted = calloc((size_t) n_waiters, sizeof(bool));
        int head[MEMBERS] = {};                   /* the first waiter not granted that can use the member */
        uint64_t since[MEMBERS];                  /* when its holder got it, for "held longest" */
        uint64_t *lat = calloc((size_t) n_grants, sizeof(uint64_t));
        char call[512];
        int wrong = 0;

        brokerd = start_brokerd(exe, config);
        for (int m = 0; m < MEMBERS; m++) {
                holder[m] = m == 0 ? bench_connect_when_listening(sock_path) : bench_connect(sock_path);
                if (holder[m] < 0)
                        die("connect holder");
                snprintf(call, sizeof call,
                         "{\"method\":\"io.slotbroker.Acquire\",\"parameters\":{\"lane\":\"l\",\"member\":\"m%02d\"},"
                         "\"more\":true}", m);
                send_text(holder[m], call);
                int got;
                wait_grant(holder[m], &got);
                since[m] = bench_now_ns();
        }

        int ep = epoll_create1(EPOLL_CLOEXEC);
        for (int i = 0; i < n_waiters; i++) {
                char labels[128] = "";
                mask[i] = UINT64_MAX;
                if (labelled) {
                        /* One or two labels, a quarter of the pairs with a negated one; again if none can match
                         * (a contradiction, or a set no member carries: InvalidParameter). */
                        do {
                                int k = 1 + (int) (rnd() % 2), l0 = (int) (rnd() % LABELS), l1 = (int) (rnd() % LABELS);
                                bool neg = k == 2 && rnd() % 4 == 0;
                                if (neg)
                                        l1 = (int) (rnd() % 4);
                                mask[i] = carriers[l0];
                                if (k == 2)
                                        mask[i] &= neg ? ~carriers[l1] : carriers[l1];
                                if (k == 1)
                                        snprintf(labels, sizeof labels, ",\"labels\":[\"%s\"]", label_names[l0]);
                                else
                                        snprintf(labels, sizeof labels, ",\"labels\":[\"%s\",\"%s%s\"]",
                                                 label_names[l0], neg ? "!" : "", label_names[l1]);
                        } while (mask[i] == 0);
                }
                fds[i] = bench_connect(sock_path);
                if (fds[i] < 0)
                        die("connect waiter");
                snprintf(call, sizeof call,
                         "{\"method\":\"io.slotbroker.Acquire\",\"parameters\":{\"lane\":\"l\"%s},\"more\":true}", labels);
                send_text(fds[i], call);
                struct epoll_event ev = { .events = EPOLLIN, .data.u32 = (uint32_t) i };
                epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev);
        }
        /* Every waiter's first reply ("queued"); one that is not is an error. */
        struct epoll_event evs[1024];
        int seen = 0;
        uint64_t deadline = bench_now_ns() + 60000000000ULL;
        while (seen < n_waiters && bench_now_ns() < deadline) {
                int k = epoll_wait(ep, evs, 1024, 100);
                for (int i = 0; i < k; i++) {
                        int member = -1;
                        if (read_grant(fds[evs[i].data.u32], &member) != 0)
                                die("a waiter was granted or refused at once");
                        seen++;
                }
        }
        if (seen < n_waiters)
                die("not every waiter queued");
        long rss_before = bench_process_status_kib(brokerd, "VmRSS:");
        updates = 0;
        uint64_t start = bench_now_ns();

        int g;
        for (g = 0; g < n_grants; g++) {
                /* The member held longest that some waiter can use. */
                int m = -1;
                for (int c = 0; c < MEMBERS; c++) {
                        while (head[c] < n_waiters && (granted[head[c]] || !(mask[head[c]] >> c & 1)))
                                head[c]++;
                        if (head[c] < n_waiters && (m < 0 || since[c] < since[m]))
                                m = c;
                }
                if (m < 0)
                        break; /* nobody left wants any member */
                int want = head[m], got = -1, member = -1;
                uint64_t t0 = bench_now_ns();
                close(holder[m]); /* the release */
                while (got < 0) {
                        int k = epoll_wait(ep, evs, 1024, 5000);
                        if (k <= 0)
                                die("no grant within 5 s");
                        for (int i = 0; i < k; i++) {
                                int idx = (int) evs[i].data.u32, r = read_grant(fds[idx], &member);
                                if (r < 0)
                                        die("waiter");
                                if (r == 1 && got < 0) {
                                        lat[g] = bench_now_ns() - t0;
                                        got = idx;
                                }
                        }
                }
                wrong += got != want || member != m;
                granted[got] = true;
                epoll_ctl(ep, EPOLL_CTL_DEL, fds[got], NULL);
                if (member < 0 || member >= MEMBERS)
                        die("grant without a member");
                holder[member] = fds[got];
                since[member] = bench_now_ns();
        }
        long rss_after = bench_process_status_kib(brokerd, "VmRSS:"), hwm = bench_process_status_kib(brokerd, "VmHWM:");

        qsort(lat, (size_t) g, sizeof(uint64_t), cmp_u64);
        printf("%-10s waiters %d, grants %d: grant latency after a release p50 %.1f us, p99 %.1f us, max %.1f us; "
               "brokerd RSS %.1f MiB (before grants %.1f MiB, peak %.1f MiB)\n",
               labelled ? "labelled" : "unlabelled", n_waiters, g, g ? lat[g / 2] / 1e3 : 0, g ? lat[(g * 99) / 100] / 1e3 : 0,
               g ? lat[g - 1] / 1e3 : 0, rss_after / 1024.0, rss_before / 1024.0, hwm / 1024.0);
        printf("%-10s %.2f s for the grants, %" PRIu64 " position updates read meanwhile\n", "", (bench_now_ns() - start) / 1e9,
               updates);
        if (wrong)
                printf("no barging per member violated: %d grants went to another waiter or member than the first "
                       "that could use the freed one\n", wrong);

        kill(brokerd, SIGTERM);
        waitpid(brokerd, NULL, 0);
        brokerd = 0;
        for (int i = 0; i < n_waiters; i++)
                if (!granted[i])
                        close(fds[i]);
        for (int m = 0; m < MEMBERS; m++)
                close(holder[m]);
        close(ep);
        free(mask);
        free(fds);
        free(granted);
        free(lat);
}

static int main_labels(const char *exe, int n_waiters, int n_grants) {
        /* Each label on about half the members, as bench-labels has them. */
        uint64_t carriers[LABELS] = {};
        char *config = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&config, &size);
        if (!f)
                die("open_memstream");
        fprintf(f, "[broker]\nmax-connections=%d\nmax-connections-per-uid=%d\nmax-waiters-per-uid=%d\n"
                   "[pool p]\nmembers =",
                n_waiters + MEMBERS + 100, n_waiters + MEMBERS + 100, n_waiters + MEMBERS + 100);
        for (int m = 0; m < MEMBERS; m++)
                fprintf(f, " m%02d", m);
        for (int l = 0; l < LABELS; l++) {
                fprintf(f, "\nlabel.%s =", label_names[l]);
                for (int m = 0; m < MEMBERS; m++)
                        if (rnd() % 2) {
                                carriers[l] |= UINT64_C(1) << m;
                                fprintf(f, " m%02d", m);
                        }
        }
        fprintf(f, "\n[lane l]\npools=p\npolicy=wait\n");
        fclose(f);

        char load[128];
        printf("bench-waiters labels: load average %s\n", bench_loadavg(load, sizeof load));
        run_labels(exe, config, carriers, n_waiters, n_grants, false);
        run_labels(exe, config, carriers, n_waiters, n_grants, true);
        printf("bench-waiters labels: load average %s\n", bench_loadavg(load, sizeof load));
        free(config);
        bench_remove_dir(dir);
        return 0;
}

int main(int argc, char **argv) {
        if (argc < 2) {
                fprintf(stderr, "usage: bench-waiters BROKERD [WAITERS [GRANTS [labels]]]\n");
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
        if ((long) rl.rlim_cur < n_waiters + 128) {
                fprintf(stderr, "RLIMIT_NOFILE %ld is too low for %d waiters\n", (long) rl.rlim_cur, n_waiters);
                return 2;
        }

        if (!mkdtemp(dir))
                die("mkdtemp");
        if (argc > 4 && strcmp(argv[4], "labels") == 0)
                return main_labels(argv[1], n_waiters, n_grants);
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
