/* SPDX-License-Identifier: MIT */
/* redis-server.h — a private redis-server for the tests and the benches: found in $REDIS_SERVER or $PATH,
 * started in a temporary directory on a Unix socket (and on a TCP port of 127.0.0.1 when asked), without
 * persistence, killed by its pid, and started again on the same socket and port when a test restarts it. */
#pragma once

#include <stdbool.h>
#include <sys/types.h>

/* For test_redis_start_full(): a TCP port the kernel picks. */
#define TEST_REDIS_ANY_PORT (-1)

typedef struct TestRedis {
        char dir[64];           /* mkdtemp, removed by test_redis_stop(); its log is dir/redis.log */
        char socket_path[128];
        int port;               /* on 127.0.0.1; 0: none */
        pid_t pid;              /* 0: not running */
} TestRedis;

/* Whether a redis-server binary is there; the caller reports a whole-test skip (exit 77 / TAP 1..0 # SKIP)
 * when it is not. */
bool test_redis_find(void);

/* A TCP port on 127.0.0.1 that nobody listens on now (the kernel's pick: another program could take it
 * before it is used). Returns it, or negative errno. */
int test_redis_free_port(void);

/* Starts it in a new temporary directory, on its Unix socket, and on 127.0.0.1:port unless port is 0
 * (TEST_REDIS_ANY_PORT: a free one), with extra arguments (NULL ended; NULL: none). Waits until its socket
 * accepts (a condition, not a time). When it does not, its log goes to stderr and nothing of it is left.
 * Returns 0, or negative errno (-ENOENT: no test_redis_find() first, -EIO: it did not start). */
int test_redis_start_full(TestRedis *r, int port, const char *const *extra);
/* The same on the Unix socket only, without extra arguments. */
int test_redis_start(TestRedis *r);

/* Kills it by pid (SIGKILL: nothing of it is kept) and reaps it. Its directory, socket path and port stay,
 * for test_redis_restart(). */
void test_redis_kill(TestRedis *r);
/* Starts it again, empty, after test_redis_kill(): in the same directory, on the same socket and port, with
 * these extra arguments. Returns 0 or negative errno (its directory stays). */
int test_redis_restart(TestRedis *r, const char *const *extra);

/* Kills it and removes its directory. */
void test_redis_stop(TestRedis *r);
