/* SPDX-License-Identifier: MIT */
/* redis-server.c — a private redis-server for unit tests (redis-server.h). */
#include <errno.h>
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

int test_redis_start(TestRedis *r) {
        char log[192];

        *r = (TestRedis) {};
        snprintf(r->dir, sizeof r->dir, "/tmp/test-redis-XXXXXX");
        if (!mkdtemp(r->dir))
                return -errno;
        snprintf(r->socket_path, sizeof r->socket_path, "%s/redis.sock", r->dir);
        snprintf(log, sizeof log, "%s/redis.log", r->dir);
        const char *argv[] = {
                redis_server, "--port", "0", "--unixsocket", r->socket_path, "--unixsocketperm", "700",
                "--save", "", "--appendonly", "no", "--dir", r->dir, "--logfile", log, "--daemonize", "no",
                "--maxmemory-policy", "noeviction", NULL,
        };
        pid_t pid = fork();
        if (pid < 0)
                return -errno;
        if (pid == 0) {
                execv(redis_server, (char *const *) argv);
                _exit(127);
        }
        r->pid = pid;
        for (int i = 0; !socket_answers(r->socket_path); i++) {
                if (waitpid(pid, NULL, WNOHANG) == pid || i > 2000) {
                        r->pid = 0;
                        test_redis_stop(r);
                        return -EIO;
                }
                (void) nanosleep(&(struct timespec) { .tv_nsec = 5 * 1000 * 1000 }, NULL);
        }
        return 0;
}

void test_redis_stop(TestRedis *r) {
        char path[192];

        if (r->pid > 0) {
                (void) kill(r->pid, SIGKILL);
                (void) waitpid(r->pid, NULL, 0);
                r->pid = 0;
        }
        if (!r->dir[0])
                return;
        const char *files[] = { "redis.sock", "redis.log" };
        for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
                snprintf(path, sizeof path, "%s/%s", r->dir, files[i]);
                (void) unlink(path);
        }
        (void) rmdir(r->dir);
        r->dir[0] = '\0';
}
