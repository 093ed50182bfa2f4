/* SPDX-License-Identifier: MIT */
/* redis-server.c — a private redis-server for the tests and the benches (redis-server.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "redis-server.h"

/* How long a start may take on a loaded machine before it counts as failed. */
#define START_TIMEOUT_SEC 30

static char redis_server[4096];

bool test_redis_find(void) {
        const char *env = getenv("REDIS_SERVER"), *path = getenv("PATH");

        if (env)
                snprintf(redis_server, sizeof redis_server, "%s", env);
        else
                for (const char *p = path ?: "/usr/bin:/bin"; *p && !redis_server[0]; p += strcspn(p, ":"), p += *p == ':') {
                        char candidate[4096];
                        snprintf(candidate, sizeof candidate, "%.*s/redis-server", (int) strcspn(p, ":"), p);
                        if (access(candidate, X_OK) == 0)
                                snprintf(redis_server, sizeof redis_server, "%s", candidate);
                }
        return redis_server[0] && access(redis_server, X_OK) == 0;
}

int test_redis_free_port(void) {
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        socklen_t len = sizeof sa;
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), r = 0;

        if (fd < 0)
                return -errno;
        if (bind(fd, (struct sockaddr *) &sa, sizeof sa) < 0 || getsockname(fd, (struct sockaddr *) &sa, &len) < 0)
                r = -errno;
        close(fd);
        return r < 0 ? r : ntohs(sa.sin_port);
}

static bool socket_answers(const char *path) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        bool ok;

        snprintf(sa.sun_path, sizeof sa.sun_path, "%.100s", path);
        ok = fd >= 0 && connect(fd, (struct sockaddr *) &sa, sizeof sa) == 0;
        if (fd >= 0)
                close(fd);
        return ok;
}

static void log_path(const TestRedis *r, char *buf, size_t size) {
        snprintf(buf, size, "%s/redis.log", r->dir);
}

/* What redis-server said before it failed: the only account of a bad argument or a port taken. */
static void print_log(const TestRedis *r) {
        char path[sizeof r->dir + 16], line[512];
        log_path(r, path, sizeof path);
        FILE *f = fopen(path, "re");

        fprintf(stderr, "# redis-server did not start; %s:\n", path);
        while (f && fgets(line, sizeof line, f))
                fprintf(stderr, "#   %s", line);
        if (f)
                fclose(f);
}

static void child_exec(const char *const *argv) {
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);

        /* Nothing on stdout: it is a test's TAP stream. */
        if (null >= 0) {
                (void) dup2(null, STDIN_FILENO);
                (void) dup2(null, STDOUT_FILENO);
        }
        execv(redis_server, (char *const *) argv);
        _exit(127);
}

/* Starts redis-server in r->dir on r->socket_path and r->port, and waits until the socket accepts. */
static int spawn_and_wait(TestRedis *r, const char *const *extra) {
        char port[16], log[sizeof r->dir + 16];
        const char *argv[64];
        size_t n = 0;

        if (!redis_server[0])
                return -ENOENT;
        snprintf(port, sizeof port, "%d", r->port);
        log_path(r, log, sizeof log);
        const char *const base[] = {
                redis_server, "--port", port, "--bind", "127.0.0.1", "--unixsocket", r->socket_path,
                "--unixsocketperm", "700", "--save", "", "--appendonly", "no", "--dir", r->dir, "--logfile", log,
                "--daemonize", "no", "--maxmemory-policy", "noeviction",
        };
        for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
                argv[n++] = base[i];
        for (; extra && *extra; extra++) {
                if (n == sizeof argv / sizeof argv[0] - 1)
                        return -E2BIG;
                argv[n++] = *extra;
        }
        argv[n] = NULL;

        (void) unlink(r->socket_path); /* a killed server's: what answers must be the new one */
        pid_t pid = fork();
        if (pid < 0)
                return -errno;
        if (pid == 0)
                child_exec(argv);
        r->pid = pid;

        struct timespec start, now;
        clock_gettime(CLOCK_MONOTONIC, &start);
        while (!socket_answers(r->socket_path)) {
                bool exited = waitpid(pid, NULL, WNOHANG) == pid;
                clock_gettime(CLOCK_MONOTONIC, &now);
                if (exited || now.tv_sec - start.tv_sec > START_TIMEOUT_SEC) {
                        if (exited)
                                r->pid = 0;
                        test_redis_kill(r);
                        print_log(r);
                        return -EIO;
                }
                /* Starting up: nothing to wait on but the socket. */
                (void) nanosleep(&(struct timespec) { .tv_nsec = 5 * 1000 * 1000 }, NULL);
        }
        return 0;
}

int test_redis_start_full(TestRedis *r, int port, const char *const *extra) {
        int k;

        *r = (TestRedis) {};
        if (port == TEST_REDIS_ANY_PORT) {
                port = test_redis_free_port();
                if (port < 0)
                        return port;
        }
        r->port = port;
        snprintf(r->dir, sizeof r->dir, "/tmp/test-redis-XXXXXX");
        if (!mkdtemp(r->dir)) {
                r->dir[0] = '\0';
                return -errno;
        }
        snprintf(r->socket_path, sizeof r->socket_path, "%s/redis.sock", r->dir);
        k = spawn_and_wait(r, extra);
        if (k < 0)
                test_redis_stop(r);
        return k;
}

int test_redis_start(TestRedis *r) {
        return test_redis_start_full(r, 0, NULL);
}

void test_redis_kill(TestRedis *r) {
        if (r->pid <= 0)
                return;
        (void) kill(r->pid, SIGKILL);
        (void) waitpid(r->pid, NULL, 0);
        r->pid = 0;
}

int test_redis_restart(TestRedis *r, const char *const *extra) {
        test_redis_kill(r);
        return spawn_and_wait(r, extra);
}

void test_redis_stop(TestRedis *r) {
        char path[sizeof r->dir + 256 + 2];

        test_redis_kill(r);
        if (!r->dir[0])
                return;
        /* Its socket and log, and whatever an extra argument had it write. */
        DIR *d = opendir(r->dir);
        for (struct dirent *e; d && (e = readdir(d));)
                if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
                        snprintf(path, sizeof path, "%s/%s", r->dir, e->d_name);
                        (void) unlink(path);
                }
        if (d)
                closedir(d);
        (void) rmdir(r->dir);
        r->dir[0] = '\0';
}
