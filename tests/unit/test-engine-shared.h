/* SPDX-License-Identifier: MIT */
/* test-engine-shared.h — test-engine.c's hooks for test-engine-shared (memo §5.1): every pool is kept in
 * a redis-server the test starts, through brokerd's Backend in the manual clock mode (shared-rig.h), and
 * each test starts from an empty server. Included by test-engine.c only. */
#pragma once

#include <errno.h>
#include <hiredis/hiredis.h>
#include <signal.h>

#include "redis-server.h"
#include "shared-rig.h"

static TestRedis shared_server;
static redisContext *shared_admin;
static char shared_url[sizeof shared_server.socket_path + 16];
static SharedRig shared_rig;

static int shared_start(const char **ret_skip, void *userdata) {
        if (!test_redis_find()) {
                *ret_skip = "redis-server not found (install redis-server, or set REDIS_SERVER)";
                return 0;
        }
        signal(SIGPIPE, SIG_IGN);
        int r = test_redis_start(&shared_server);
        if (r < 0)
                return r;
        snprintf(shared_url, sizeof shared_url, "unix://%s", shared_server.socket_path);
        shared_admin = redisConnectUnix(shared_server.socket_path);
        if (!shared_admin || shared_admin->err) {
                test_redis_stop(&shared_server);
                return -ECONNREFUSED;
        }
        return 0;
}

static void shared_stop(void *userdata) {
        redisFree(shared_admin);
        test_redis_stop(&shared_server);
}

static void shared_configure(Engine *e, BrokerConfig *c, void *userdata) {
        if (!shared_rig.event)
                shared_rig_init(&shared_rig);
        engine_set_pool_factory(e, backend_table_pool_new, &shared_rig.table);
        /* The config is the test's; the URL is static, as its own strings are not freed by anyone here. */
        for (size_t i = 0; i < c->n_pools; i++) {
                c->pools[i]->backend = shared_url;
                c->pools[i]->backend_node_ttl = SHARED_RIG_NODE_TTL;
        }
}

static bool shared_quiesce(void *userdata) {
        return shared_rig.event && shared_rig_quiesce(&shared_rig);
}

static void shared_teardown(void *userdata) {
        shared_rig_done(&shared_rig);
        redisReply *r = redisCommand(shared_admin, "FLUSHALL");
        assert_non_null(r);
        freeReplyObject(r);
}

static const TestPoolHooks shared_hooks = {
        .start = shared_start,
        .stop = shared_stop,
        .configure = shared_configure,
        .quiesce = shared_quiesce,
        .teardown = shared_teardown,
};

static const TestPoolHooks *const test_pool_hooks = &shared_hooks;
