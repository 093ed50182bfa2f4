/* SPDX-License-Identifier: MIT */
/* bench-slow-clients — SPEC §10 ("slow or stuck clients never stall the loop"): one uid opens
 * CONNECTIONS connections (default 4,000: under the default max-connections-per-uid of 4096) and sends one
 * byte a second on each, never finishing a message, while a good client times fail-fast Acquires (a fresh
 * connection each, as `slotctl run` makes). Prints the good client's p50/p99/max, brokerd's CPU time per
 * byte it received (it must be bounded by the bytes, not by the connections) and the load average.
 *
 *   bench-slow-clients BROKERD [CONNECTIONS [SECONDS]]      (defaults 4000 and 20)
 *
 * Target: Acquire p99 < 5 ms. BENCH_HISTORY_CLIENTS=N adds N connections that each call History(limit=1000)
 * on a filled history and never read (issue 9 n): brokerd's RSS is printed before, while and after.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench-util.h"

#define TARGET_P99_US 5000.0

static char dir[] = "/tmp/bench-slow-clients.XXXXXX";
static char sock_path[100];
static pid_t brokerd = 0;

static int n_conns;
static int *drip_fds;
static atomic_bool stop;
static atomic_uint_fast64_t bytes_sent;
static atomic_int drip_broken; /* connections brokerd closed */

static void die(const char *what) {
        perror(what);
        if (brokerd > 0)
                kill(brokerd, SIGTERM);
        exit(EXIT_FAILURE);
}

static int cmp_u64(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
        return x < y ? -1 : x > y;
}

/* The start of a call that never ends: after it, 'x' after 'x' inside a string, and never a NUL. */
static const char drip_head[] = "{\"method\":\"io.slotbroker.Status\",\"parameters\":{},\"org.example.pad\":\"";

/* Once a second, one byte on every connection, all in one burst: the worst case for a loop that polls
 * every ready fd again per event it dispatches. */
static void *dripper(void *arg) {
        /* The attack is measured on brokerd, not on this process's scheduling: on a small machine the
         * burst's sends would otherwise take the good client's CPU. */
        (void) setpriority(PRIO_PROCESS, (id_t) gettid(), 19);
        uint64_t next = bench_now_ns();
        for (unsigned second = 0; !atomic_load(&stop); second++) {
                char byte = second < sizeof drip_head - 1 ? drip_head[second] : 'x';
                for (int i = 0; i < n_conns; i++) {
                        if (drip_fds[i] < 0)
                                continue;
                        if (send(drip_fds[i], &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1)
                                atomic_fetch_add(&bytes_sent, 1);
                        else if (errno != EAGAIN) {
                                close(drip_fds[i]);
                                drip_fds[i] = -1;
                                atomic_fetch_add(&drip_broken, 1);
                        }
                }
                next += 1000000000ULL;
                uint64_t now = bench_now_ns();
                if (next > now) {
                        struct timespec ts = { (time_t) ((next - now) / 1000000000ULL), (long) ((next - now) % 1000000000ULL) };
                        nanosleep(&ts, NULL);
                }
        }
        return arg;
}

/* Reads one whole reply (up to its NUL) within timeout_ms; returns its length, or -1. */
static ssize_t read_reply(int fd, char *buf, size_t size, int timeout_ms) {
        size_t len = 0;
        uint64_t deadline = bench_now_ns() + (uint64_t) timeout_ms * 1000000ULL;
        for (;;) {
                uint64_t now = bench_now_ns();
                if (now >= deadline)
                        return -1;
                struct pollfd p = { .fd = fd, .events = POLLIN };
                if (poll(&p, 1, (int) ((deadline - now) / 1000000ULL) + 1) <= 0)
                        continue;
                ssize_t k = recv(fd, buf + len, size - 1 - len, MSG_DONTWAIT);
                if (k < 0 && errno == EAGAIN)
                        continue;
                if (k <= 0)
                        return -1;
                len += (size_t) k;
                if (memchr(buf + len - (size_t) k, 0, (size_t) k))
                        return (ssize_t) len;
                if (len >= size - 1)
                        return -1;
        }
}

/* One fail-fast Acquire on a fresh connection: connect, ask, read the grant, close (the release).
 * Returns the round trip in ns, or 0 when it failed. */
static uint64_t timed_acquire(void) {
        static const char call[] = "{\"method\":\"io.slotbroker.Acquire\",\"parameters\":{\"lane\":\"ff\"}}";
        char buf[4096];
        uint64_t t0 = bench_now_ns();
        int fd = bench_connect(sock_path);
        if (fd < 0)
                return 0;
        uint64_t r = 0;
        if (send(fd, call, sizeof call, MSG_NOSIGNAL) == (ssize_t) sizeof call && read_reply(fd, buf, sizeof buf, 30000) > 0 &&
            strstr(buf, "\"granted\""))
                r = bench_now_ns() - t0;
        else
                fprintf(stderr, "Acquire failed: %s\n", buf);
        close(fd);
        return r;
}

/* History clients: each asks for 1000 events and never reads. */
static int *history_fds;
static int n_history;

static void fill_history(int acquires) {
        for (int i = 0; i < acquires; i++)
                if (timed_acquire() == 0)
                        die("Acquire while filling the history");
}

static void open_history_clients(void) {
        static const char call[] = "{\"method\":\"io.slotbroker.History\",\"parameters\":{\"limit\":1000}}";
        history_fds = calloc((size_t) n_history, sizeof(int));
        for (int i = 0; i < n_history; i++) {
                history_fds[i] = bench_connect(sock_path);
                if (history_fds[i] < 0)
                        die("connect history client");
                /* Small receive buffers, as a client that reads nothing keeps its side of the socket. */
                int sz = 4096;
                (void) setsockopt(history_fds[i], SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
                if (send(history_fds[i], call, sizeof call, MSG_NOSIGNAL) != (ssize_t) sizeof call)
                        die("send History");
        }
}

int main(int argc, char **argv) {
        if (argc < 2) {
                fprintf(stderr, "usage: bench-slow-clients BROKERD [CONNECTIONS [SECONDS]]\n");
                return 2;
        }
        n_conns = argc > 2 ? atoi(argv[2]) : 4000;
        int seconds = argc > 3 ? atoi(argv[3]) : 20;
        n_history = getenv("BENCH_HISTORY_CLIENTS") ? atoi(getenv("BENCH_HISTORY_CLIENTS")) : 0;
        if (n_conns < 1 || seconds < 3) {
                fprintf(stderr, "CONNECTIONS must be at least 1 and SECONDS at least 3\n");
                return 2;
        }

        struct rlimit rl;
        getrlimit(RLIMIT_NOFILE, &rl);
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        if ((long) rl.rlim_cur < n_conns + n_history + 64) {
                fprintf(stderr, "RLIMIT_NOFILE %ld is too low for %d connections: skipped\n", (long) rl.rlim_cur,
                        n_conns + n_history);
                return 77; /* meson's SKIP: the machine cannot run it, nothing failed */
        }

        if (!mkdtemp(dir))
                die("mkdtemp");
        char conf[300], log[300];
        snprintf(sock_path, sizeof sock_path, "%s/sock", dir);
        snprintf(conf, sizeof conf, "%s/brokerd.conf", dir);
        snprintf(log, sizeof log, "%s/brokerd.log", dir);
        FILE *f = fopen(conf, "we");
        if (!f)
                die("fopen");
        /* The broker's connection limits stay at their defaults: the attack fits under them. History clients
         * are another uid's in life; here they need room of their own. */
        if (n_conns + n_history + 16 > 4096)
                fprintf(f, "[broker]\nmax-connections-per-uid=%d\n", n_conns + n_history + 16);
        fprintf(f, "[pool ff]\nlimit=64\n[lane ff]\npools=ff\npolicy=fail-fast\n");
        fclose(f);

        brokerd = fork();
        if (brokerd < 0)
                die("fork");
        if (brokerd == 0) {
                char state[300];
                snprintf(state, sizeof state, "%s/state", dir);
                int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
                dup2(fd, STDERR_FILENO);
                execl(argv[1], argv[1], "--config", conf, "--socket", sock_path, "--state-directory", state, (char *) NULL);
                _exit(127);
        }
        int probe = bench_connect_when_listening(sock_path);
        if (probe < 0)
                die("connect");
        close(probe);

        char load_before[128], load_after[128];
        bench_loadavg(load_before, sizeof load_before);
        long rss_start = bench_process_status_kib(brokerd, "VmRSS:");

        if (n_history > 0)
                fill_history(2000); /* two events a lease (granted and released): 4000 rows */

        drip_fds = calloc((size_t) n_conns, sizeof(int));
        for (int i = 0; i < n_conns; i++) {
                drip_fds[i] = bench_connect(sock_path);
                if (drip_fds[i] < 0)
                        die("connect dripper");
        }

        /* Idle: the good client alone, for reference. */
        enum { IDLE_ACQUIRES = 200 };
        uint64_t idle[IDLE_ACQUIRES];
        for (int i = 0; i < IDLE_ACQUIRES; i++)
                if (!(idle[i] = timed_acquire()))
                        die("Acquire before the drip");
        qsort(idle, IDLE_ACQUIRES, sizeof(uint64_t), cmp_u64);

        pthread_t t;
        if (pthread_create(&t, NULL, dripper, NULL) != 0)
                die("pthread_create");
        sleep(2); /* the first bursts: brokerd has every connection's first bytes by now */
        if (n_history > 0)
                open_history_clients();

        /* The drip alone first: brokerd's CPU per byte without the good client's Acquires (their lease
         * commits are most of the CPU of the next phase). */
        uint64_t dcpu0 = bench_process_cpu_ns(brokerd, false), dmain0 = bench_process_cpu_ns(brokerd, true);
        uint64_t dbytes0 = atomic_load(&bytes_sent), dt0 = bench_now_ns();
        sleep((unsigned) (seconds / 4 < 3 ? 3 : seconds / 4));
        uint64_t dwall = bench_now_ns() - dt0, dbytes = atomic_load(&bytes_sent) - dbytes0;
        uint64_t dcpu = bench_process_cpu_ns(brokerd, false) - dcpu0, dmain = bench_process_cpu_ns(brokerd, true) - dmain0;

        uint64_t cpu0 = bench_process_cpu_ns(brokerd, false), main0 = bench_process_cpu_ns(brokerd, true);
        uint64_t t0 = bench_now_ns();
        size_t n_lat = 0, cap = 1024, failed = 0;
        uint64_t *lat = malloc(cap * sizeof(uint64_t));
        long rss_peak = 0;
        while (bench_now_ns() - t0 < (uint64_t) (seconds - 2) * 1000000000ULL) {
                uint64_t l = timed_acquire();
                if (!l) {
                        failed++;
                        continue;
                }
                if (n_lat == cap)
                        lat = realloc(lat, (cap *= 2) * sizeof(uint64_t));
                lat[n_lat++] = l;
                long rss = bench_process_status_kib(brokerd, "VmRSS:");
                rss_peak = rss > rss_peak ? rss : rss_peak;
                usleep(5000);
        }
        uint64_t wall = bench_now_ns() - t0;
        uint64_t cpu = bench_process_cpu_ns(brokerd, false) - cpu0, main_cpu = bench_process_cpu_ns(brokerd, true) - main0;
        long rss_loaded = bench_process_status_kib(brokerd, "VmRSS:");
        atomic_store(&stop, true);
        pthread_join(t, NULL);
        for (int i = 0; i < n_conns; i++)
                if (drip_fds[i] >= 0)
                        close(drip_fds[i]);
        for (int i = 0; i < n_history; i++)
                close(history_fds[i]);
        sleep(2); /* brokerd closes them, frees and trims */
        long rss_end = bench_process_status_kib(brokerd, "VmRSS:");
        bench_loadavg(load_after, sizeof load_after);
        bool alive = waitpid(brokerd, NULL, WNOHANG) == 0;

        qsort(lat, n_lat, sizeof(uint64_t), cmp_u64);
        printf("dripping connections %d (closed by brokerd: %d)\n", n_conns, atomic_load(&drip_broken));
        printf("drip alone: brokerd CPU %.2f s of %.1f s (main thread %.2f s) for %" PRIu64 " bytes: %.2f us per byte "
               "received\n",
               dcpu / 1e9, dwall / 1e9, dmain / 1e9, dbytes, dbytes ? dcpu / 1e3 / (double) dbytes : 0.0);
        printf("drip and good client: brokerd CPU %.2f s of %.1f s (main thread %.2f s)\n", cpu / 1e9, wall / 1e9,
               main_cpu / 1e9);
        printf("good client, idle: fail-fast Acquire p50 %.2f ms, p99 %.2f ms\n", idle[IDLE_ACQUIRES / 2] / 1e6,
               idle[IDLE_ACQUIRES * 99 / 100] / 1e6);
        if (n_lat > 0)
                printf("good client, under the drip: %zu Acquires (%zu failed): p50 %.2f ms, p99 %.2f ms, max %.2f ms "
                       "(target p99 < %.0f ms: %s)\n",
                       n_lat, failed, lat[n_lat / 2] / 1e6, lat[n_lat * 99 / 100] / 1e6, lat[n_lat - 1] / 1e6,
                       TARGET_P99_US / 1e3, lat[n_lat * 99 / 100] / 1e3 < TARGET_P99_US ? "met" : "missed");
        printf("brokerd RSS: %.1f MiB at start, %.1f MiB loaded (peak seen %.1f MiB), %.1f MiB after the clients left%s\n",
               rss_start / 1024.0, rss_loaded / 1024.0, rss_peak / 1024.0, rss_end / 1024.0,
               n_history ? " (with History clients)" : "");
        printf("load average before: %s; after: %s\n", load_before, load_after);

        kill(brokerd, SIGTERM);
        waitpid(brokerd, NULL, 0);
        if (!getenv("BENCH_KEEP"))
                bench_remove_dir(dir);
        if (!alive || failed > 0 || n_lat == 0) {
                fprintf(stderr, "brokerd %s; %zu Acquires failed\n", alive ? "ran on" : "died", failed);
                return EXIT_FAILURE;
        }
        return 0;
}
