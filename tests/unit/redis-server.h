/* SPDX-License-Identifier: MIT */
/* redis-server.h — a private redis-server for unit tests: found in $REDIS_SERVER or $PATH, started in a
 * temporary directory on a Unix socket only (no TCP port), without persistence, stopped by its pid. */
#pragma once

#include <stdbool.h>
#include <sys/types.h>

typedef struct TestRedis {
        char dir[64];           /* mkdtemp, removed by test_redis_stop() */
        char socket_path[128];
        pid_t pid;
} TestRedis;

/* Whether a redis-server binary is there; the caller reports a whole-test skip (exit 77 / TAP 1..0 # SKIP)
 * when it is not. */
bool test_redis_find(void);
/* Starts it and waits until its socket accepts (a condition, not a time). Returns 0 or negative errno. */
int test_redis_start(TestRedis *r);
/* Kills it by pid (SIGKILL: nothing of it is kept), reaps it, removes its directory. */
void test_redis_stop(TestRedis *r);
