/* SPDX-License-Identifier: MIT */
/* bench-pairs — SPEC §12: acquire+release pairs per second through libbroker with 32 concurrent clients,
 * against the message rate redis-benchmark gets from a Lua semaphore script (bench-pairs.lua) on the same
 * machine. Target: pairs/s × 2 ≥ redis req/s.
 *
 * The clients are connections driven from one poll() loop, as redis-benchmark drives its own: each goes
 * broker_acquire_start() → granted → broker_release_start() → released → …, for SECONDS. With
 * $BENCH_PAIRS_THREADS=1 each is a thread that loops the blocking broker_acquire() → broker_release() → the
 * "released" event instead. Two pools: one of 64 slots (nobody waits) and one of 16 (half the
 * clients wait for the other half). The reference is one redis-server started here on a private Unix socket
 * without persistence, driven by redis-benchmark -c CLIENTS with the script's acquire, then its release
 * (each for about SECONDS); a 50/50 mix of the two runs at their harmonic mean, which is the reference
 * rate. The four runs of a round go A/B/A/B, in the opposite order the next round, so that the load
 * of a shared machine falls on both sides alike; the medians over ROUNDS are reported.
 *
 *   bench-pairs BROKERD [CLIENTS [SECONDS [ROUNDS]]]     (defaults 32, 5, 3)
 *
 * redis-server and redis-benchmark come from $PATH (or $REDIS_SERVER, $REDIS_BENCHMARK); the script from
 * $BENCH_PAIRS_LUA or next to this source (meson compiles its path in). Without them only the libbroker figures are printed and the
 * exit status is 77 (skipped). Exit 1 when brokerd or libbroker fails (a refusal counts as a failure: no
 * client here should ever be refused).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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
#include <sys/time.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench-util.h"
#include "broker.h"

#define MAX_ROUNDS 32

static char dir[] = "/tmp/bench-pairs.XXXXXX";
static char broker_sock[108], redis_sock[108]; /* sizeof sockaddr_un.sun_path */
static pid_t brokerd = 0, redis = 0;

static void stop_children(void) {
        if (brokerd > 0) {
                kill(brokerd, SIGTERM);
                waitpid(brokerd, NULL, 0);
                brokerd = 0;
        }
        if (redis > 0) {
                kill(redis, SIGTERM);
                waitpid(redis, NULL, 0);
                redis = 0;
        }
}

static void cleanup(void) {
        stop_children();
        bench_remove_dir(dir);
}

static _Noreturn void die(const char *what, int error) {
        fprintf(stderr, "bench-pairs: %s: %s\n", what, strerror(error));
        cleanup();
        exit(EXIT_FAILURE);
}

static uint64_t rusage_switches(const struct rusage *ru) {
        return (uint64_t) ru->ru_nvcsw + (uint64_t) ru->ru_nivcsw;
}

static uint64_t self_switches(void) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        return rusage_switches(&ru);
}

/* CPU spent per message (one acquire or one release, one redis request), in µs, of a run: the server's and
 * the clients'. On a machine that others load, the rates move with the load; these move much less. */
typedef struct Cost {
        double rate;       /* pairs/s, or requests/s */
        double server_us;  /* per message */
        double server_main_us; /* brokerd: its main thread's share (the rest is the history's threads) */
        double client_us;
        double server_switches, client_switches; /* context switches per message */
        double history_pending;   /* brokerd: decision rows not yet written when the last pair ended */
        double history_catchup_ms; /* and how long after it they all were (beyond the flush delay: in the rate) */
} Cost;

static pid_t spawn(const char *const *argv, int out_fd) {
        pid_t pid = fork();
        if (pid < 0)
                die("fork", errno);
        if (pid == 0) {
                int null = open("/dev/null", O_RDWR | O_CLOEXEC);
                dup2(null, STDIN_FILENO);
                dup2(out_fd >= 0 ? out_fd : null, STDOUT_FILENO);
                dup2(null, STDERR_FILENO);
                execv(argv[0], (char *const *) argv);
                _exit(127);
        }
        return pid;
}

/* Waits until the server accepts connections: its socket file exists a moment before it listens. */
static void wait_for_socket(const char *path, pid_t pid, const char *what) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
        for (int i = 0; i < 500; i++) {
                int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
                if (fd < 0)
                        die("socket", errno);
                int r = connect(fd, (struct sockaddr *) &sa, sizeof sa);
                close(fd);
                if (r == 0)
                        return;
                if (waitpid(pid, NULL, WNOHANG) == pid)
                        break;
                usleep(10000); /* starting up: nothing to wait on but the socket */
        }
        fprintf(stderr, "bench-pairs: %s did not start\n", what);
        cleanup();
        exit(EXIT_FAILURE);
}

/* ---- libbroker ---- */

typedef struct Client {
        pthread_t thread;
        const char *lane;
        BrokerClient *c;
        uint64_t pairs;
        int error;    /* negative errno, or a positive BROKER_… refusal */
} Client;

static atomic_bool go, stop;

/* Reads the connection's events until the open Acquire ends with "released". */
static int wait_released(BrokerClient *c) {
        for (;;) {
                BrokerEvent ev = BROKER_EVENT_INIT;
                int r = broker_client_process(c, &ev);
                if (r < 0)
                        return r;
                if (ev.type == BROKER_EVENT_RELEASED)
                        return 0;
                if (ev.type != BROKER_EVENT_NONE)
                        return -EBADMSG;
                struct pollfd p = { .fd = broker_client_get_fd(c), .events = (short) broker_client_get_events(c) };
                if (poll(&p, 1, 5000) == 0)
                        return -ETIMEDOUT;
        }
}

static void *client_main(void *userdata) {
        Client *cl = userdata;
        BrokerAcquireOptions o = BROKER_ACQUIRE_OPTIONS_INIT;
        o.lane = cl->lane;

        while (!atomic_load_explicit(&go, memory_order_acquire))
                sched_yield();
        while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
                BrokerLease *l = NULL;
                int r = broker_acquire(cl->c, &o, &l);
                if (r != 0) {
                        cl->error = r;
                        break;
                }
                r = broker_release(cl->c, broker_lease_id(l));
                broker_lease_free(l);
                if (r == 0)
                        r = wait_released(cl->c);
                if (r != 0) {
                        cl->error = r;
                        break;
                }
                cl->pairs++;
        }
        return NULL;
}

/* What a run measured: pairs per second and the CPU per message. */
/* Context switches of brokerd and of this process when the run started (perf stat's context-switches). */
static uint64_t run_server_switches0, run_client_switches0;

static void switches_start(void) {
        run_server_switches0 = bench_process_switches(brokerd);
        run_client_switches0 = self_switches();
}

/* A counter or gauge of brokerd's Metrics text (in its JSON reply, where the lines' ends are "\\n"). */
static uint64_t broker_metric(const char *name) {
        BrokerClient *c = NULL;
        char *reply = NULL, needle[128];
        int r = broker_client_connect(broker_sock, &c);
        if (r < 0)
                die("broker_client_connect", -r);
        r = broker_call(c, "Metrics", NULL, &reply);
        if (r != 0)
                die("Metrics", r < 0 ? -r : EPROTO);
        broker_client_free(c);
        snprintf(needle, sizeof needle, "\\n%s ", name); /* the value's line, not "# HELP name …" */
        const char *at = strstr(reply, needle);
        if (!at)
                die(name, ENOENT);
        uint64_t v = strtoull(at + strlen(needle), NULL, 10);
        free(reply);
        return v;
}

/* brokerd's history_tuning.flush_delay (brokerd/history.c): a batch of rows waits at most this long for more. */
#define HISTORY_FLUSH_DELAY_NS (100ULL * 1000 * 1000)

/* The rate counts the decisions' history rows as written: a run is over when brokerd's writer has caught up
 * with its last pair, less the flush delay that the last rows wait by design (a constant latency, not a
 * rate): a writer that fell behind would otherwise make a burst's rate, not a sustained one. A row dropped
 * for a full backlog fails the benchmark. Waits until the writer has caught up; returns how long that took
 * after last_pair (ns), and the rows that were pending then in *ret_pending. */
static uint64_t history_catch_up(uint64_t last_pair, uint64_t *ret_pending) {
        uint64_t pending = broker_metric("slotbroker_history_rows_pending");
        *ret_pending = pending;
        while (pending > 0) {
                if (bench_now_ns() - last_pair > 30ULL * 1000 * 1000 * 1000)
                        die("history's writer", ETIMEDOUT);
                (void) nanosleep(&(struct timespec) { .tv_nsec = 1000 * 1000 }, NULL);
                pending = broker_metric("slotbroker_history_rows_pending");
        }
        uint64_t caught_up = bench_now_ns() - last_pair;
        if (broker_metric("slotbroker_history_rows_dropped_total") > 0) {
                fprintf(stderr, "bench-pairs: brokerd dropped history rows\n");
                cleanup();
                exit(EXIT_FAILURE);
        }
        return caught_up;
}

static Cost pairs_cost(uint64_t pairs, uint64_t t0, uint64_t server0, uint64_t main0, uint64_t client0) {
        uint64_t last_pair = bench_now_ns(), pending;
        uint64_t caught_up = history_catch_up(last_pair, &pending);
        uint64_t behind = caught_up > HISTORY_FLUSH_DELAY_NS ? caught_up - HISTORY_FLUSH_DELAY_NS : 0;
        double elapsed = (double) (last_pair - t0 + behind) / 1e9; /* until history caught up with the last pair */
        uint64_t server = bench_process_cpu_ns(brokerd, false) - server0, main = bench_process_cpu_ns(brokerd, true) - main0,
                 client = bench_self_cpu_ns() - client0;
        double messages = 2.0 * (double) (pairs > 0 ? pairs : 1);
        return (Cost) { .rate = (double) pairs / elapsed, .server_us = (double) server / 1e3 / messages,
                        .server_main_us = (double) main / 1e3 / messages, .client_us = (double) client / 1e3 / messages,
                        .server_switches = (double) (bench_process_switches(brokerd) - run_server_switches0) / messages,
                        .client_switches = (double) (self_switches() - run_client_switches0) / messages,
                        .history_pending = (double) pending, .history_catchup_ms = (double) caught_up / 1e6 };
}

static _Noreturn void die_refused(int result) {
        fprintf(stderr, "bench-pairs: a client was refused (%s); the benchmark's pools must never refuse\n",
                broker_result_to_string(result) ?: "?");
        cleanup();
        exit(EXIT_FAILURE);
}

/* CLIENTS threads loop acquire → release for `seconds`, each blocked on its own connection. */
static Cost run_pairs_threads(const char *lane, int n_clients, double seconds) {
        Client *cl = calloc((size_t) n_clients, sizeof(Client));
        if (!cl)
                die("calloc", ENOMEM);
        atomic_store(&go, false);
        atomic_store(&stop, false);
        for (int i = 0; i < n_clients; i++) {
                cl[i].lane = lane;
                int r = broker_client_connect(broker_sock, &cl[i].c);
                if (r < 0)
                        die("broker_client_connect", -r);
                r = pthread_create(&cl[i].thread, NULL, client_main, &cl[i]);
                if (r != 0)
                        die("pthread_create", r);
        }
        switches_start();
        uint64_t t0 = bench_now_ns(), server0 = bench_process_cpu_ns(brokerd, false), main0 = bench_process_cpu_ns(brokerd, true),
                 client0 = bench_self_cpu_ns();
        atomic_store_explicit(&go, true, memory_order_release);
        struct timespec ts = { .tv_sec = (time_t) seconds, .tv_nsec = (long) ((seconds - (double) (time_t) seconds) * 1e9) };
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
        atomic_store(&stop, true);
        uint64_t pairs = 0;
        int error = 0;
        for (int i = 0; i < n_clients; i++) {
                pthread_join(cl[i].thread, NULL);
                pairs += cl[i].pairs;
                if (cl[i].error && !error)
                        error = cl[i].error;
                broker_client_free(cl[i].c);
        }
        Cost cost = pairs_cost(pairs, t0, server0, main0, client0);
        free(cl);
        if (error < 0)
                die("acquire/release", -error);
        if (error > 0)
                die_refused(error);
        return cost;
}

/* CLIENTS connections driven by one thread's poll() loop, as redis-benchmark drives its connections: each
 * goes acquire → granted → release → released → acquire … for `seconds`, with libbroker's event API. */
static Cost run_pairs_loop(const char *lane, int n_clients, double seconds) {
        BrokerClient **c = calloc((size_t) n_clients, sizeof(BrokerClient *));
        struct pollfd *p = calloc((size_t) n_clients, sizeof(struct pollfd));
        BrokerAcquireOptions o = BROKER_ACQUIRE_OPTIONS_INIT;
        uint64_t pairs = 0;
        int r, open = n_clients;

        if (!c || !p)
                die("calloc", ENOMEM);
        o.lane = lane;
        for (int i = 0; i < n_clients; i++) {
                r = broker_client_connect(broker_sock, &c[i]);
                if (r < 0)
                        die("broker_client_connect", -r);
        }
        switches_start();
        uint64_t t0 = bench_now_ns(), server0 = bench_process_cpu_ns(brokerd, false), main0 = bench_process_cpu_ns(brokerd, true),
                 client0 = bench_self_cpu_ns(), end = t0 + (uint64_t) (seconds * 1e9);
        for (int i = 0; i < n_clients; i++)
                if ((r = broker_acquire_start(c[i], &o)) < 0)
                        die("broker_acquire_start", -r);
        while (open > 0) {
                for (int i = 0; i < n_clients; i++)
                        p[i] = (struct pollfd) { .fd = c[i] ? broker_client_get_fd(c[i]) : -1,
                                                 .events = c[i] ? (short) broker_client_get_events(c[i]) : 0 };
                if (poll(p, (nfds_t) n_clients, 5000) == 0)
                        die("poll", ETIMEDOUT);
                bool stopping = bench_now_ns() >= end;
                for (int i = 0; i < n_clients; i++) {
                        if (!c[i] || !p[i].revents)
                                continue;
                        for (;;) {
                                BrokerEvent ev = BROKER_EVENT_INIT;
                                r = broker_client_process(c[i], &ev);
                                if (r < 0)
                                        die("broker_client_process", -r);
                                if (r == BROKER_EVENT_NONE)
                                        break;
                                if (r == BROKER_EVENT_GRANTED) {
                                        broker_lease_free(ev.lease);
                                        if ((r = broker_release_start(c[i])) < 0)
                                                die("broker_release_start", -r);
                                } else if (r == BROKER_EVENT_RELEASED) {
                                        pairs++;
                                        if (stopping) {
                                                c[i] = broker_client_free(c[i]);
                                                open--;
                                                break;
                                        }
                                        if ((r = broker_acquire_start(c[i], &o)) < 0)
                                                die("broker_acquire_start", -r);
                                } else if (r == BROKER_EVENT_REFUSED)
                                        die_refused(ev.refusal);
                                else if (r != BROKER_EVENT_QUEUED)
                                        die("unexpected event", EPROTO);
                        }
                }
        }
        Cost cost = pairs_cost(pairs, t0, server0, main0, client0);
        free(c);
        free(p);
        return cost;
}

static bool client_threads; /* $BENCH_PAIRS_THREADS: a thread per client instead of one event loop */

static Cost run_pairs(const char *lane, int n_clients, double seconds) {
        return client_threads ? run_pairs_threads(lane, n_clients, seconds) : run_pairs_loop(lane, n_clients, seconds);
}

/* ---- redis ---- */

/* One RESP command on a new connection to redis; the first line of the reply (and of a bulk string, its
 * content) in buf. Returns 0, or a negative errno. */
static int resp_command(const char *const *args, char *buf, size_t size) {
        int fd = bench_connect(redis_sock);
        if (fd < 0)
                return fd;
        size_t n = 0;
        while (args[n])
                n++;
        FILE *f = fdopen(dup(fd), "w");
        if (!f) {
                close(fd);
                return -ENOMEM;
        }
        fprintf(f, "*%zu\r\n", n);
        for (size_t i = 0; i < n; i++)
                fprintf(f, "$%zu\r\n%s\r\n", strlen(args[i]), args[i]);
        fclose(f);

        size_t got = 0;
        for (;;) { /* a reply of one or two short lines */
                ssize_t k = read(fd, buf + got, size - 1 - got);
                if (k <= 0)
                        break;
                got += (size_t) k;
                buf[got] = '\0';
                char *eol = strstr(buf, "\r\n");
                if (eol && (buf[0] != '$' || strstr(eol + 2, "\r\n")))
                        break;
        }
        close(fd);
        buf[got] = '\0';
        if (got == 0 || buf[0] == '-')
                return -EPROTO;
        if (buf[0] == '$') {
                char *body = strstr(buf, "\r\n");
                if (!body)
                        return -EPROTO;
                memmove(buf, body + 2, strlen(body + 2) + 1);
        } else
                memmove(buf, buf + 1, strlen(buf)); /* "+OK", ":42" */
        buf[strcspn(buf, "\r\n")] = '\0';
        return 0;
}

/* redis-benchmark -c CLIENTS -n N EVALSHA …; returns its requests per second and the CPU per request. */
static Cost run_redis_benchmark(const char *program, int n_clients, long n, const char *sha, bool acquire) {
        char buf[256], clients[16], count[32];
        const char *key = "bench-pairs";

        /* The counter where the op takes its common path: from 0 for acquires (the limit is never hit),
         * and high enough that no release goes below 0. */
        snprintf(count, sizeof count, "%ld", acquire ? 0L : n + 1000);
        if (resp_command((const char *const[]) { "SET", key, count, NULL }, buf, sizeof buf) < 0)
                die("redis SET", EPROTO);

        snprintf(clients, sizeof clients, "%d", n_clients);
        snprintf(count, sizeof count, "%ld", n);
        const char *argv[] = {
                program, "-s", redis_sock, "-c", clients, "-n", count, "--csv",
                "EVALSHA", sha, "1", key, acquire ? "acquire" : "release", acquire ? "1000000000000" : NULL, NULL,
        };
        int pipefd[2];
        if (pipe2(pipefd, O_CLOEXEC) < 0)
                die("pipe", errno);
        uint64_t server0 = bench_process_cpu_ns(redis, false), switches0 = bench_process_switches(redis);
        pid_t pid = spawn(argv, pipefd[1]);
        close(pipefd[1]);
        char out[4096];
        size_t got = 0;
        ssize_t k;
        while ((k = read(pipefd[0], out + got, sizeof out - 1 - got)) > 0)
                got += (size_t) k;
        close(pipefd[0]);
        out[got] = '\0';
        int status;
        struct rusage ru = {};
        wait4(pid, &status, 0, &ru);
        uint64_t server = bench_process_cpu_ns(redis, false) - server0;
        Cost cost = { .server_us = (double) server / 1e3 / (double) n, .client_us = (double) bench_rusage_ns(&ru) / 1e3 / (double) n,
                      .server_switches = (double) (bench_process_switches(redis) - switches0) / (double) n,
                      .client_switches = (double) rusage_switches(&ru) / (double) n };

        /* --csv: a header line, then "test","rps",… */
        char *line = strchr(out, '\n');
        double rps = 0;
        if (line && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
                char *field = strstr(line, "\",\"");
                if (field)
                        rps = strtod(field + 3, NULL);
        }
        if (rps <= 0) {
                fprintf(stderr, "bench-pairs: redis-benchmark failed: %s\n", out);
                return (Cost) {};
        }
        /* Did the script run, or answer errors? The counter tells. */
        if (resp_command((const char *const[]) { "GET", key, NULL }, buf, sizeof buf) < 0 ||
            strtol(buf, NULL, 10) != (acquire ? n : 1000)) {
                fprintf(stderr, "bench-pairs: after %ld %ss the counter is %s\n", n, acquire ? "acquire" : "release", buf);
                return (Cost) {};
        }
        cost.rate = rps;
        return cost;
}

typedef enum CostPart { COST_SERVER, COST_SERVER_MAIN, COST_CLIENT, COST_SERVER_SWITCHES, COST_CLIENT_SWITCHES } CostPart;

static double median_cost(const Cost *c, int n, CostPart part) {
        double v[MAX_ROUNDS];
        for (int i = 0; i < n; i++)
                v[i] = part == COST_SERVER ? c[i].server_us : part == COST_SERVER_MAIN ? c[i].server_main_us :
                       part == COST_CLIENT ? c[i].client_us : part == COST_SERVER_SWITCHES ? c[i].server_switches :
                       c[i].client_switches;
        return bench_median(v, n);
}

int main(int argc, char **argv) {
        if (argc < 2) {
                fprintf(stderr, "usage: bench-pairs BROKERD [CLIENTS [SECONDS [ROUNDS]]]\n");
                return 2;
        }
        int n_clients = argc > 2 ? atoi(argv[2]) : 32;
        double seconds = argc > 3 ? atof(argv[3]) : 5;
        int rounds = argc > 4 ? atoi(argv[4]) : 3;
        if (n_clients < 1 || n_clients > 4096 || seconds <= 0 || rounds < 1 || rounds > MAX_ROUNDS) {
                fprintf(stderr, "bench-pairs: CLIENTS 1..4096, SECONDS > 0, ROUNDS 1..%d\n", MAX_ROUNDS);
                return 2;
        }
        const char *threads = getenv("BENCH_PAIRS_THREADS");
        client_threads = threads && *threads && strcmp(threads, "0") != 0;
        signal(SIGPIPE, SIG_IGN);
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
                rl.rlim_cur = rl.rlim_max;
                (void) setrlimit(RLIMIT_NOFILE, &rl);
        }

        char redis_server_buf[PATH_MAX], redis_benchmark_buf[PATH_MAX];
        const char *redis_server = bench_find_program("REDIS_SERVER", "redis-server", redis_server_buf, sizeof redis_server_buf);
        const char *redis_benchmark =
                bench_find_program("REDIS_BENCHMARK", "redis-benchmark", redis_benchmark_buf, sizeof redis_benchmark_buf);
        const char *lua = getenv("BENCH_PAIRS_LUA");
        if (!lua || !*lua) {
#ifdef BENCH_PAIRS_LUA
                lua = BENCH_PAIRS_LUA; /* meson passes where the source is */
#else
                static char lua_buf[PATH_MAX];
                snprintf(lua_buf, sizeof lua_buf, "%s", __FILE__);
                char *dot = strrchr(lua_buf, '.');
                if (dot)
                        snprintf(dot, sizeof lua_buf - (size_t) (dot - lua_buf), ".lua");
                lua = lua_buf;
#endif
        }
        char *script = NULL;
        FILE *sf = fopen(lua, "re");
        if (sf) {
                size_t len = 0;
                if (getdelim(&script, &len, '\0', sf) < 0) {
                        free(script);
                        script = NULL;
                }
                fclose(sf);
        }
        bool with_redis = redis_server && redis_benchmark && script;
        if (!with_redis)
                fprintf(stderr, "bench-pairs: no redis-server, redis-benchmark or %s: libbroker figures only\n", lua);

        if (!mkdtemp(dir))
                die("mkdtemp", errno);
        snprintf(broker_sock, sizeof broker_sock, "%s/broker.sock", dir);
        snprintf(redis_sock, sizeof redis_sock, "%s/redis.sock", dir);

        /* Pool "roomy": nobody waits. Pool "half": half of the clients wait for the other half. */
        char conf[200], state[200];
        snprintf(conf, sizeof conf, "%s/brokerd.conf", dir);
        snprintf(state, sizeof state, "%s/state", dir);
        FILE *f = fopen(conf, "we");
        if (!f)
                die("fopen", errno);
        int roomy = n_clients * 2, half = n_clients / 2 > 0 ? n_clients / 2 : 1;
        fprintf(f, "[broker]\nmax-connections=%d\nmax-connections-per-uid=%d\nmax-waiters-per-uid=%d\n"
                   "[pool roomy]\nlimit=%d\n[lane roomy]\npools=roomy\npolicy=wait\n"
                   "[pool half]\nlimit=%d\n[lane half]\npools=half\npolicy=wait\n",
                4 * n_clients + 64, 4 * n_clients + 64, 2 * n_clients + 64, roomy, half);
        fclose(f);
        brokerd = spawn((const char *const[]) { argv[1], "--config", conf, "--socket", broker_sock,
                                                "--state-directory", state, NULL },
                        -1);
        wait_for_socket(broker_sock, brokerd, "brokerd");

        char sha[64] = "";
        if (with_redis) {
                redis = spawn((const char *const[]) { redis_server, "--port", "0", "--unixsocket", redis_sock, "--save", "",
                                                      "--appendonly", "no", "--dir", dir, NULL },
                              -1);
                wait_for_socket(redis_sock, redis, "redis-server");
                if (resp_command((const char *const[]) { "SCRIPT", "LOAD", script, NULL }, sha, sizeof sha) < 0 ||
                    strlen(sha) != 40)
                        die("redis SCRIPT LOAD", EPROTO);
        }
        free(script);

        char la[128];
        printf("bench-pairs: %d clients (%s), %.1f s per run, %d rounds; load average at start: %s\n", n_clients,
               client_threads ? "a thread each, blocking calls" : "one event loop, as redis-benchmark", seconds, rounds,
               bench_loadavg(la, sizeof la));

        /* How many requests make `seconds` of redis-benchmark: a short run tells the rate. */
        long n_redis = 0;
        if (with_redis) {
                double rps = run_redis_benchmark(redis_benchmark, n_clients, 20000, sha, true).rate;
                if (rps <= 0)
                        with_redis = false;
                n_redis = (long) (rps * seconds);
                if (n_redis < 20000)
                        n_redis = 20000;
        }
        /* A warm-up of each pool: the history database and brokerd's allocations find their size. */
        (void) run_pairs("roomy", n_clients, 0.5);
        (void) run_pairs("half", n_clients, 0.5);

        Cost roomy_c[MAX_ROUNDS], half_c[MAX_ROUNDS], acq_c[MAX_ROUNDS], rel_c[MAX_ROUNDS];
        double p_roomy[MAX_ROUNDS], p_half[MAX_ROUNDS], r_acq[MAX_ROUNDS], r_rel[MAX_ROUNDS], r_mix[MAX_ROUNDS];
        for (int i = 0; i < rounds; i++) {
                /* A/B/A/B, then B/A/B/A. */
                bool broker_first = i % 2 == 0;
                acq_c[i] = rel_c[i] = (Cost) {};
                for (int step = 0; step < 4; step++) {
                        int which = broker_first ? step : step ^ 1; /* 0, 2: brokerd; 1, 3: redis */
                        if (which == 0)
                                roomy_c[i] = run_pairs("roomy", n_clients, seconds);
                        else if (which == 2)
                                half_c[i] = run_pairs("half", n_clients, seconds);
                        else if (with_redis && which == 1)
                                acq_c[i] = run_redis_benchmark(redis_benchmark, n_clients, n_redis, sha, true);
                        else if (with_redis)
                                rel_c[i] = run_redis_benchmark(redis_benchmark, n_clients, n_redis, sha, false);
                }
                p_roomy[i] = roomy_c[i].rate;
                p_half[i] = half_c[i].rate;
                r_acq[i] = acq_c[i].rate;
                r_rel[i] = rel_c[i].rate;
                r_mix[i] = r_acq[i] > 0 && r_rel[i] > 0 ? 2 / (1 / r_acq[i] + 1 / r_rel[i]) : 0;
                printf("round %d: libbroker limit %d: %.0f pairs/s (CPU per message: brokerd %.1f us, of which main thread "
                       "%.1f us; clients %.1f us; history %.0f rows behind at the end, written %.0f ms later); "
                       "limit %d: %.0f pairs/s (%.1f us, %.1f us; %.1f us; %.0f rows, %.0f ms)",
                       i + 1, roomy, p_roomy[i], roomy_c[i].server_us, roomy_c[i].server_main_us, roomy_c[i].client_us,
                       roomy_c[i].history_pending, roomy_c[i].history_catchup_ms, half, p_half[i], half_c[i].server_us,
                       half_c[i].server_main_us, half_c[i].client_us, half_c[i].history_pending, half_c[i].history_catchup_ms);
                if (with_redis)
                        printf("; redis acquire %.0f req/s (CPU per request: redis-server %.1f us, redis-benchmark %.1f us), "
                               "release %.0f req/s (%.1f us, %.1f us), mix %.0f req/s; ratio %.3f / %.3f",
                               r_acq[i], acq_c[i].server_us, acq_c[i].client_us, r_rel[i], rel_c[i].server_us,
                               rel_c[i].client_us, r_mix[i], r_mix[i] > 0 ? 2 * p_roomy[i] / r_mix[i] : 0,
                               r_mix[i] > 0 ? 2 * p_half[i] / r_mix[i] : 0);
                printf("\n");
                fflush(stdout);
        }

        double m_roomy = bench_median(p_roomy, rounds), m_half = bench_median(p_half, rounds);
        printf("libbroker, %d clients: limit %d (nobody waits): %.0f pairs/s (%.0f msg/s); limit %d (half wait): "
               "%.0f pairs/s (%.0f msg/s)\n",
               n_clients, roomy, m_roomy, 2 * m_roomy, half, m_half, 2 * m_half);
        printf("  CPU per message (an acquire or a release): brokerd %.1f us (main thread %.1f us), clients %.1f us (limit %d); "
               "brokerd %.1f us (%.1f us), clients %.1f us (limit %d)\n",
               median_cost(roomy_c, rounds, COST_SERVER), median_cost(roomy_c, rounds, COST_SERVER_MAIN),
               median_cost(roomy_c, rounds, COST_CLIENT), roomy, median_cost(half_c, rounds, COST_SERVER),
               median_cost(half_c, rounds, COST_SERVER_MAIN), median_cost(half_c, rounds, COST_CLIENT), half);
        printf("  context switches per message: brokerd %.2f, clients %.2f (limit %d); brokerd %.2f, clients %.2f (limit %d)\n",
               median_cost(roomy_c, rounds, COST_SERVER_SWITCHES), median_cost(roomy_c, rounds, COST_CLIENT_SWITCHES), roomy,
               median_cost(half_c, rounds, COST_SERVER_SWITCHES), median_cost(half_c, rounds, COST_CLIENT_SWITCHES), half);
        int status = EXIT_SUCCESS;
        if (with_redis) {
                double m_acq = bench_median(r_acq, rounds), m_rel = bench_median(r_rel, rounds), m_mix = bench_median(r_mix, rounds);
                printf("redis-benchmark -c %d, Lua semaphore: acquire %.0f req/s, release %.0f req/s, 50/50 mix %.0f req/s\n",
                       n_clients, m_acq, m_rel, m_mix);
                printf("  CPU per request: redis-server %.1f us, redis-benchmark %.1f us (acquire); %.1f us, %.1f us (release)\n",
                       median_cost(acq_c, rounds, COST_SERVER), median_cost(acq_c, rounds, COST_CLIENT), median_cost(rel_c, rounds, COST_SERVER),
                       median_cost(rel_c, rounds, COST_CLIENT));
                printf("  context switches per request: redis-server %.2f, redis-benchmark %.2f (acquire); %.2f, %.2f (release)\n",
                       median_cost(acq_c, rounds, COST_SERVER_SWITCHES), median_cost(acq_c, rounds, COST_CLIENT_SWITCHES),
                       median_cost(rel_c, rounds, COST_SERVER_SWITCHES), median_cost(rel_c, rounds, COST_CLIENT_SWITCHES));
                printf("ratio pairs/s x 2 / redis req/s (target >= 1.0): limit %d: %.3f; limit %d: %.3f\n", roomy,
                       m_mix > 0 ? 2 * m_roomy / m_mix : 0, half, m_mix > 0 ? 2 * m_half / m_mix : 0);
        } else
                status = 77;
        printf("load average at end: %s\n", bench_loadavg(la, sizeof la));
        cleanup();
        return status;
}
