/* SPDX-License-Identifier: MIT */
/* test-redis-link.c — brokerd's Redis link (redis-link.h) against real redis-server processes that each
 * test starts (redis-server.h: a temporary directory, a private port and Unix socket, killed by pid):
 * setup, commands, scripts and NOSCRIPT, the library and "Function not found", timeouts, reconnects, the configuration errors, a server that is
 * not Redis.
 * Everything waits for a condition on the event loop, up to a deadline; nothing sleeps to synchronise.
 * Without redis-server the whole test is one TAP skip. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netdb.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>
#include <systemd/sd-event.h>

#include "redis-link.h"
#include "redis-server.h"

#define DEADLINE (10 * USEC_PER_SEC)
#define MAX_ATTEMPT_TIMES 8

typedef struct Reply {
        bool done;
        int error;
        int type;
        char text[256];
        long long integer;
} Reply;

typedef struct Fixture {
        char dir[64];                   /* the password file's */
        char password_path[128];
        sd_event *event;
        TestRedis redis;
        int port;                       /* where the link connects: the redis-server's, or another */
        RedisLink *link;
        RedisLinkOptions options;
        unsigned n_told;                /* state changes told */
        RedisLinkState state;
        char detail[512];
        usec_t attempt_times[MAX_ATTEMPT_TIMES];
        size_t n_attempts;
        bool free_in_callback;          /* the next reply callback frees the link */
        int not_redis_fd;               /* a listening socket that answers garbage, or stays silent */
        bool not_redis_silent;
        const char *not_redis_reply;    /* what it answers instead of garbage (a canned setup) */
        sd_event_source *not_redis_source;
        int accepted[4];
        size_t n_accepted;
} Fixture;

/* ---- redis-server processes ---- */

/* Starts redis-server on a new port and a Unix socket, with extra arguments (NULL ended). */
static void redis_start(Fixture *f, const char *const *extra) {
        assert_int_equal(test_redis_start_full(&f->redis, TEST_REDIS_ANY_PORT, extra), 0);
        f->port = f->redis.port;
}

/* ---- the link and the loop ---- */

static void on_state(RedisLink *link, RedisLinkState state, const char *detail, void *userdata) {
        Fixture *f = userdata;

        f->n_told++;
        f->state = state;
        snprintf(f->detail, sizeof f->detail, "%s", detail ?: "");
        if (f->free_in_callback) {
                f->free_in_callback = false;
                f->link = redis_link_free(f->link);
        }
}

static void on_log(RedisLink *link, int priority, const char *message, void *userdata) {
        Fixture *f = userdata;

        if (strncmp(message, "Connecting", strlen("Connecting")) == 0 && f->n_attempts < MAX_ATTEMPT_TIMES)
                f->attempt_times[f->n_attempts++] = now_monotonic();
}

static void on_reply(RedisLink *link, int error, const redisReply *reply, void *userdata) {
        Reply *r = userdata;

        r->done = true;
        r->error = error;
        if (reply) {
                r->type = reply->type;
                r->integer = reply->integer;
                if (reply->str)
                        snprintf(r->text, sizeof r->text, "%s", reply->str);
        }
}

static void on_reply_then_free(RedisLink *link, int error, const redisReply *reply, void *userdata) {
        Fixture *f = userdata;

        redis_link_free(f->link);
        f->link = NULL;
}

static void link_start_url(Fixture *f, const char *url) {
        RedisEndpoint e;

        assert_int_equal(redis_endpoint_parse(url, &e), 0);
        f->options.on_state = on_state;
        f->options.on_log = on_log;
        f->options.userdata = f;
        assert_int_equal(redis_link_new(f->event, &e, &f->options, &f->link), 0);
        redis_endpoint_done(&e);
}

static void link_start(Fixture *f) {
        char url[64];

        snprintf(url, sizeof url, "redis://127.0.0.1:%d", f->port);
        link_start_url(f, url);
}

/* Runs the loop until cond(f) holds or the deadline passes; returns cond(f). */
static bool run_until(Fixture *f, bool (*cond)(Fixture *f, const void *arg), const void *arg, usec_t timeout) {
        usec_t deadline = now_monotonic() + timeout;

        while (!cond(f, arg) && now_monotonic() < deadline)
                assert_true(sd_event_run(f->event, 10 * USEC_PER_MSEC) >= 0);
        return cond(f, arg);
}

static bool told(Fixture *f, const void *state) {
        return f->n_told > 0 && f->state == *(const RedisLinkState *) state;
}

static bool reply_done(Fixture *f, const void *reply) {
        return ((const Reply *) reply)->done;
}

static bool attempts_at_least(Fixture *f, const void *n) {
        return f->n_attempts >= *(const size_t *) n;
}

static void wait_state(Fixture *f, RedisLinkState state) {
        if (!run_until(f, told, &state, DEADLINE))
                fail_msg("link not %s (last told: %s, \"%s\")", redis_link_state_to_string(state),
                         f->n_told ? redis_link_state_to_string(f->state) : "nothing", f->detail);
}

static void wait_up(Fixture *f) {
        wait_state(f, REDIS_LINK_UP);
        assert_int_equal(redis_link_get_state(f->link), REDIS_LINK_UP);
}

/* Sends argv (NULL ended) and waits for its outcome. */
static Reply command(Fixture *f, const char *const *argv) {
        Reply r = {};
        int argc = 0;

        while (argv[argc])
                argc++;
        assert_int_equal(redis_link_command(f->link, on_reply, &r, argc, argv, NULL), 0);
        assert_true(run_until(f, reply_done, &r, DEADLINE));
        return r;
}

static Reply evalsha(Fixture *f, unsigned script, const char *arg) {
        Reply r = {};

        assert_int_equal(redis_link_evalsha(f->link, script, on_reply, &r, 0, 1, (const char *const[]) { arg }, NULL), 0);
        assert_true(run_until(f, reply_done, &r, DEADLINE));
        return r;
}

#define CMD(...) command(f, (const char *const[]) { __VA_ARGS__, NULL })

static void write_file(const char *path, const char *text) {
        FILE *file = fopen(path, "we");
        assert_non_null(file);
        fputs(text, file);
        assert_int_equal(fclose(file), 0);
}

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof *f);

        assert_non_null(f);
        snprintf(f->dir, sizeof f->dir, "/tmp/test-redis-link-XXXXXX");
        assert_non_null(mkdtemp(f->dir));
        snprintf(f->password_path, sizeof f->password_path, "%s/password", f->dir);
        f->not_redis_fd = -EBADF;
        assert_int_equal(sd_event_new(&f->event), 0);
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;

        redis_link_free(f->link);
        /* What a freed link leaves to hiredis ends in this loop iteration, or in the next. */
        (void) sd_event_run(f->event, 0);
        if (f->redis.pid > 0)
                (void) kill(f->redis.pid, SIGCONT);
        test_redis_stop(&f->redis);
        sd_event_source_disable_unref(f->not_redis_source);
        if (f->not_redis_fd >= 0)
                close(f->not_redis_fd);
        for (size_t i = 0; i < f->n_accepted; i++)
                close(f->accepted[i]);
        sd_event_unref(f->event);
        (void) unlink(f->password_path);
        (void) rmdir(f->dir);
        free(f);
        return 0;
}

/* ---- tests ---- */

static void test_link_comes_up_with_the_run_id_and_answers_commands(void **state) {
        Fixture *f = *state;
        RedisLinkStats stats;

        redis_start(f, NULL);
        link_start(f);
        assert_int_equal(redis_link_get_state(f->link), REDIS_LINK_DOWN);
        wait_up(f);
        /* INFO's run_id (40 hex digits), "/", its master_replid (40 hex digits): the data set's identity. */
        assert_int_equal(strlen(f->detail), 81);
        assert_int_equal(f->detail[40], '/');
        assert_string_equal(redis_link_get_run_id(f->link), f->detail);

        Reply r = CMD("SET", "k", "v");
        assert_int_equal(r.error, 0);
        assert_int_equal(r.type, REDIS_REPLY_STATUS);
        assert_string_equal(r.text, "OK");
        r = CMD("GET", "k");
        assert_int_equal(r.type, REDIS_REPLY_STRING);
        assert_string_equal(r.text, "v");
        r = CMD("INCRBY", "n", "5");
        assert_int_equal(r.integer, 5);

        redis_link_get_stats(f->link, &stats);
        assert_int_equal(stats.ups, 1);
        assert_true(stats.rtt_last > 0);
        assert_true(stats.rtt_avg > 0);
        assert_int_equal(stats.timeouts, 0);
}

/* A corked link's commands leave at the uncork, in one write, without a loop iteration: Redis has them
 * before the loop runs again (another connection sees the SET), and their replies come as ever. */
static void test_corked_commands_leave_at_the_uncork(void **state) {
        Fixture *f = *state;
        Reply set = {}, get = {};

        redis_start(f, NULL);
        link_start(f);
        wait_up(f);
        redis_link_cork(f->link);
        assert_int_equal(redis_link_command(f->link, on_reply, &set, 3, (const char *const[]) { "SET", "corked", "1" },
                                            NULL), 0);
        assert_int_equal(redis_link_command(f->link, on_reply, &get, 2, (const char *const[]) { "GET", "corked" },
                                            NULL), 0);
        redis_link_uncork(f->link);

        redisContext *c = redisConnect("127.0.0.1", f->port);
        assert_true(c && !c->err);
        bool seen = false;
        for (usec_t deadline = now_monotonic() + DEADLINE; !seen && now_monotonic() < deadline;) {
                redisReply *r = redisCommand(c, "EXISTS corked");
                assert_non_null(r);
                seen = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
                freeReplyObject(r);
        }
        redisFree(c);
        assert_true(seen);
        assert_true(run_until(f, reply_done, &get, DEADLINE));
        assert_int_equal(set.error, 0);
        assert_string_equal(get.text, "1");
}

static void test_command_while_down_fails_at_once(void **state) {
        Fixture *f = *state;

        redis_start(f, NULL);
        link_start(f);
        /* Not connected before the loop ran: refused without waiting. */
        assert_int_equal(redis_link_command(f->link, on_reply, NULL, 1, (const char *const[]) { "PING" }, NULL),
                         -ENOTCONN);
        assert_int_equal(redis_link_evalsha(f->link, 0, on_reply, NULL, 0, 0, NULL, NULL), -ENOENT);
}

static void test_commands_that_change_the_connection_are_refused(void **state) {
        Fixture *f = *state;

        redis_start(f, NULL);
        link_start(f);
        wait_up(f);
        static const char *const reserved[] = { "SUBSCRIBE", "psubscribe", "MONITOR", "SELECT", "AUTH", "QUIT" };
        for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++)
                assert_int_equal(redis_link_command(f->link, on_reply, NULL, 2,
                                                    (const char *const[]) { reserved[i], "x" }, NULL), -EINVAL);
        assert_int_equal(redis_link_command(f->link, on_reply, NULL, 0, (const char *const[]) { NULL }, NULL), -EINVAL);
}

static void test_unix_socket_url_selects_its_db(void **state) {
        Fixture *f = *state;
        char url[192];

        redis_start(f, NULL);
        snprintf(url, sizeof url, "unix://%s?db=3", f->redis.socket_path);
        link_start_url(f, url);
        wait_up(f);
        Reply r = CMD("CLIENT", "INFO");
        assert_int_equal(r.error, 0);
        if (!strstr(r.text, " db=3 "))
                fail_msg("CLIENT INFO: %s", r.text);
}

static void test_hostname_is_resolved_off_the_loop(void **state) {
        Fixture *f = *state;
        char url[64];
        redis_start(f, NULL);
        /* localhost may give ::1 first, where this redis-server does not listen: the next address is tried. */
        snprintf(url, sizeof url, "redis://localhost:%d/2", f->port);
        link_start_url(f, url);
        wait_up(f);
        Reply r = CMD("CLIENT", "INFO");
        assert_non_null(strstr(r.text, " db=2 "));
}

static const char *const echo_script = "-- the first argument\nreturn ARGV[1]";

static void test_evalsha_runs_a_script_loaded_at_setup(void **state) {
        Fixture *f = *state;
        RedisLinkStats stats;
        unsigned h, h2;

        redis_start(f, NULL);
        link_start(f);
        assert_int_equal(redis_link_add_script(f->link, echo_script, &h), 0);
        wait_up(f);

        Reply r = evalsha(f, h, "hello");
        assert_int_equal(r.error, 0);
        assert_int_equal(r.type, REDIS_REPLY_STRING);
        assert_string_equal(r.text, "hello");
        redis_link_get_stats(f->link, &stats);
        assert_int_equal(stats.script_reloads, 0);

        /* A script added while up works at once too. */
        assert_int_equal(redis_link_add_script(f->link, "return tonumber(ARGV[1]) + 1", &h2), 0);
        r = evalsha(f, h2, "41");
        assert_int_equal(r.type, REDIS_REPLY_INTEGER);
        assert_int_equal(r.integer, 42);
        r = evalsha(f, h2, "1");
        assert_int_equal(r.integer, 2);
        redis_link_get_stats(f->link, &stats);
        assert_int_equal(stats.script_reloads, 0);
}

static void test_script_flush_then_evalsha_reloads_and_retries_once(void **state) {
        Fixture *f = *state;
        RedisLinkStats stats;
        unsigned h;

        redis_start(f, NULL);
        link_start(f);
        assert_int_equal(redis_link_add_script(f->link, echo_script, &h), 0);
        wait_up(f);
        Reply r = CMD("SCRIPT", "FLUSH");
        assert_string_equal(r.text, "OK");

        r = evalsha(f, h, "again");
        assert_int_equal(r.error, 0);
        assert_int_equal(r.type, REDIS_REPLY_STRING);
        assert_string_equal(r.text, "again");
        redis_link_get_stats(f->link, &stats);
        assert_int_equal(stats.script_reloads, 1);

        r = evalsha(f, h, "once more");
        assert_string_equal(r.text, "once more");
        redis_link_get_stats(f->link, &stats);
        assert_int_equal(stats.script_reloads, 1);
}

static void test_a_script_redis_cannot_compile_fails_the_link(void **state) {
        Fixture *f = *state;
        unsigned h;

        redis_start(f, NULL);
        link_start(f);
        assert_int_equal(redis_link_add_script(f->link, "return (", &h), 0);
        wait_state(f, REDIS_LINK_FAILED);
        assert_non_null(strstr(f->detail, "SCRIPT LOAD of script 0 refused"));
}

static void not_redis_start(Fixture *f, bool silent);

static const char *const echo_library =
        "#!lua name=test_echo\n"
        "redis.register_function('test_echo', function(keys, argv) return argv[1] end)\n";

static Reply fcall(Fixture *f, const char *function, const char *arg) {
        Reply r = {};

        assert_int_equal(redis_link_fcall(f->link, function, on_reply, &r, 0, 1, (const char *const[]) { arg }, NULL), 0);
        assert_true(run_until(f, reply_done, &r, DEADLINE));
        return r;
}

static bool other_link_up(Fixture *f, const void *link) {
        return redis_link_get_state(link) == REDIS_LINK_UP;
}

static void test_fcall_runs_the_library_loaded_at_setup(void **state) {
        Fixture *f = *state;
        RedisLinkStats stats;
        RedisLink *second = NULL;
        RedisEndpoint e;
        char url[64];

        redis_start(f, NULL);
        link_start(f);
        assert_int_equal(redis_link_fcall(f->link, "test_echo", on_reply, NULL, 0, 0, NULL, NULL), -ENOENT);
        assert_int_equal(redis_link_set_library(f->link, "return 1"), -EINVAL); /* no "#!lua name=" */
        assert_int_equal(redis_link_set_library(f->link, echo_library), 0);
        assert_int_equal(redis_link_set_library(f->link, echo_library), -EBUSY);
        wait_up(f);

        Reply r = fcall(f, "test_echo", "hello");
        assert_int_equal(r.error, 0);
        assert_int_equal(r.type, REDIS_REPLY_STRING);
        assert_string_equal(r.text, "hello");
        redis_link_get_stats(f->link, &stats);
        assert_int_equal(stats.script_reloads, 0);

        /* Another link (another brokerd) finds the library there: "already exists" is loaded, not a failure. */
        snprintf(url, sizeof url, "redis://127.0.0.1:%d", f->port);
        assert_int_equal(redis_endpoint_parse(url, &e), 0);
        assert_int_equal(redis_link_new(f->event, &e, &f->options, &second), 0);
        redis_endpoint_done(&e);
        assert_int_equal(redis_link_set_library(second, echo_library), 0);
        assert_true(run_until(f, other_link_up, second, DEADLINE));
        r = (Reply) {};
        assert_int_equal(redis_link_fcall(second, "test_echo", on_reply, &r, 0, 1, (const char *const[]) { "two" }, NULL), 0);
        assert_true(run_until(f, reply_done, &r, DEADLINE));
        assert_string_equal(r.text, "two");
        redis_link_free(second);
}

static void test_function_flush_then_fcall_reloads_and_retries_once(void **state) {
        Fixture *f = *state;
        RedisLinkStats stats;

        redis_start(f, NULL);
        link_start(f);
        assert_int_equal(redis_link_set_library(f->link, echo_library), 0);
        wait_up(f);
        Reply r = CMD("FUNCTION", "FLUSH");
        assert_string_equal(r.text, "OK");

        r = fcall(f, "test_echo", "again");
        assert_int_equal(r.error, 0);
        assert_int_equal(r.type, REDIS_REPLY_STRING);
        assert_string_equal(r.text, "again");
        redis_link_get_stats(f->link, &stats);
        assert_int_equal(stats.script_reloads, 1);

        r = fcall(f, "test_echo", "once more");
        assert_string_equal(r.text, "once more");
        redis_link_get_stats(f->link, &stats);
        assert_int_equal(stats.script_reloads, 1);

        /* A function the library does not have is answered as Redis says, after one reload. */
        r = fcall(f, "test_missing", "x");
        assert_int_equal(r.type, REDIS_REPLY_ERROR);
        assert_non_null(strstr(r.text, "Function not found"));
}

static void test_a_library_redis_cannot_compile_fails_the_link(void **state) {
        Fixture *f = *state;

        redis_start(f, NULL);
        link_start(f);
        assert_int_equal(redis_link_set_library(f->link, "#!lua name=test_bad\nreturn (\n"), 0);
        wait_state(f, REDIS_LINK_FAILED);
        assert_non_null(strstr(f->detail, "FUNCTION LOAD of the library refused"));
        assert_string_equal(redis_link_get_failure(f->link), "script");
}

/* FUNCTION LOAD is a write: a Redis short of its min-replicas-to-write (or full) refuses it at setup. The
 * link is up all the same (not a configuration error), a call meets "Function not found" until the writes
 * are taken again, and then loads the library itself. */
static void test_a_library_refused_as_a_write_leaves_the_link_up(void **state) {
        Fixture *f = *state;

        redis_start(f, (const char *const[]) { "--min-replicas-to-write", "1", NULL });
        link_start(f);
        assert_int_equal(redis_link_set_library(f->link, echo_library), 0);
        wait_up(f);
        Reply r = fcall(f, "test_echo", "x");
        assert_int_equal(r.type, REDIS_REPLY_ERROR);
        assert_non_null(strstr(r.text, "Function not found"));

        r = CMD("CONFIG", "SET", "min-replicas-to-write", "0");
        assert_string_equal(r.text, "OK");
        r = fcall(f, "test_echo", "written");
        assert_int_equal(r.type, REDIS_REPLY_STRING);
        assert_string_equal(r.text, "written");
}

/* A Redis that answers the setup as Redis 6.2 does (SELECT, then an INFO that says its version). */
#define OLD_REDIS_INFO "# Server\r\nredis_version:6.2.14\r\nrun_id:0123456789abcdef0123456789abcdef01234567\r\n" \
        "# Memory\r\nmaxmemory_policy:noeviction\r\n# Replication\r\nrole:master\r\n"

static void test_a_redis_older_than_7_is_refused_with_a_library(void **state) {
        Fixture *f = *state;
        static char canned[512];

        snprintf(canned, sizeof canned, "+OK\r\n$%zu\r\n%s\r\n", strlen(OLD_REDIS_INFO), OLD_REDIS_INFO);
        f->not_redis_reply = canned;
        not_redis_start(f, false);
        link_start(f);
        assert_int_equal(redis_link_set_library(f->link, echo_library), 0);
        wait_state(f, REDIS_LINK_FAILED);
        if (!strstr(f->detail, "Redis 6.2.14 is too old: shared pools need Redis 7.0 or later"))
                fail_msg("told: %s", f->detail);
        assert_string_equal(redis_link_get_failure(f->link), "redis-version");
}

/* The same server is good enough for a link without a library (a Sentinel's, the stream reader's). */
static void test_a_redis_older_than_7_serves_a_link_without_a_library(void **state) {
        Fixture *f = *state;
        static char canned[512];

        snprintf(canned, sizeof canned, "+OK\r\n$%zu\r\n%s\r\n", strlen(OLD_REDIS_INFO), OLD_REDIS_INFO);
        f->not_redis_reply = canned;
        not_redis_start(f, false);
        link_start(f);
        wait_up(f);
}

static void test_command_timeout_ends_the_connection_then_it_comes_back(void **state) {
        Fixture *f = *state;
        RedisLinkStats stats;
        char run_id[128];

        redis_start(f, NULL);
        f->options.command_timeout = 300 * USEC_PER_MSEC;
        link_start(f);
        wait_up(f);
        snprintf(run_id, sizeof run_id, "%.120s", f->detail);

        /* A Redis that does not answer (stopped): hiredis 0.14 would wait for ever. */
        assert_int_equal(kill(f->redis.pid, SIGSTOP), 0);
        usec_t sent = now_monotonic();
        Reply r = {}, behind = {};
        assert_int_equal(redis_link_command(f->link, on_reply, &r, 1, (const char *const[]) { "PING" }, NULL), 0);
        assert_int_equal(redis_link_command(f->link, on_reply, &behind, 1, (const char *const[]) { "PING" }, NULL), 0);
        assert_true(run_until(f, reply_done, &behind, DEADLINE));
        assert_true(r.done);
        assert_int_equal(r.error, -ETIMEDOUT);
        assert_int_equal(behind.error, -ECONNRESET);
        assert_true(now_monotonic() - sent >= 300 * USEC_PER_MSEC);
        wait_state(f, REDIS_LINK_DOWN);
        assert_non_null(strstr(f->detail, "no reply"));
        assert_int_equal(redis_link_command(f->link, on_reply, NULL, 1, (const char *const[]) { "PING" }, NULL),
                         -ENOTCONN);

        assert_int_equal(kill(f->redis.pid, SIGCONT), 0);
        wait_up(f);
        assert_string_equal(f->detail, run_id); /* the same server: nothing was lost */
        redis_link_get_stats(f->link, &stats);
        assert_int_equal(stats.timeouts, 1);
        assert_true(stats.ups >= 2);
}

static void test_redis_restart_is_seen_as_a_new_run_id(void **state) {
        Fixture *f = *state;
        char run_id[128];

        redis_start(f, NULL);
        link_start(f);
        wait_up(f);
        snprintf(run_id, sizeof run_id, "%.120s", f->detail);

        test_redis_kill(&f->redis);
        wait_state(f, REDIS_LINK_DOWN);
        assert_int_equal(test_redis_restart(&f->redis, NULL), 0); /* the same port */
        wait_up(f);
        assert_string_not_equal(f->detail, run_id);
        Reply r = CMD("PING");
        assert_string_equal(r.text, "PONG");
}

static void test_unreachable_port_fails_fast_and_backs_off(void **state) {
        Fixture *f = *state;
        const size_t attempts = 4;

        f->port = test_redis_free_port(); /* nobody listens there */
        assert_true(f->port > 0);
        link_start(f);
        assert_true(run_until(f, attempts_at_least, &attempts, DEADLINE));
        assert_int_equal(f->n_told, 1); /* down, once, not at every attempt */
        assert_int_equal(f->state, REDIS_LINK_DOWN);
        assert_non_null(strstr(f->detail, "refused"));
        assert_int_equal(redis_link_command(f->link, on_reply, NULL, 1, (const char *const[]) { "PING" }, NULL),
                         -ENOTCONN);
        /* Jittered between half and all of 100 ms, 200 ms, 400 ms: never sooner than the half. */
        for (size_t i = 1; i < attempts; i++) {
                usec_t gap = f->attempt_times[i] - f->attempt_times[i - 1], floor = (50 * USEC_PER_MSEC) << (i - 1);
                if (gap < floor)
                        fail_msg("attempt %zu came %" PRIu64 " µs after the one before, before %" PRIu64 " µs", i,
                                 (uint64_t) gap, (uint64_t) floor);
        }
}

static void test_password_file_authenticates(void **state) {
        Fixture *f = *state;

        redis_start(f, (const char *const[]) { "--requirepass", "s3cret", NULL });
        write_file(f->password_path, "s3cret\n");
        f->options.password_file = f->password_path;
        f->options.user = "default";
        link_start(f);
        wait_up(f);
        Reply r = CMD("PING");
        assert_string_equal(r.text, "PONG");
}

static void test_wrong_password_is_a_configuration_error(void **state) {
        Fixture *f = *state;

        redis_start(f, (const char *const[]) { "--requirepass", "s3cret", NULL });
        write_file(f->password_path, "guess\n");
        f->options.password_file = f->password_path;
        link_start(f);
        wait_state(f, REDIS_LINK_FAILED);
        assert_non_null(strstr(f->detail, "AUTH refused"));
        assert_int_equal(redis_link_get_state(f->link), REDIS_LINK_FAILED);
}

static void test_missing_password_is_a_configuration_error(void **state) {
        Fixture *f = *state;

        redis_start(f, (const char *const[]) { "--requirepass", "s3cret", NULL });
        link_start(f);
        wait_state(f, REDIS_LINK_FAILED);
        assert_non_null(strstr(f->detail, "requires a password"));
}

static void test_wrong_db_is_a_configuration_error(void **state) {
        Fixture *f = *state;
        char url[64];

        redis_start(f, NULL);
        snprintf(url, sizeof url, "redis://127.0.0.1:%d/99", f->port);
        link_start_url(f, url);
        wait_state(f, REDIS_LINK_FAILED);
        assert_non_null(strstr(f->detail, "SELECT 99 refused"));
}

static void test_eviction_policy_other_than_noeviction_is_refused(void **state) {
        Fixture *f = *state;

        redis_start(f, (const char *const[]) { "--maxmemory-policy", "allkeys-lru", NULL });
        link_start(f);
        wait_state(f, REDIS_LINK_FAILED);
        assert_non_null(strstr(f->detail, "allkeys-lru"));
        assert_non_null(strstr(f->detail, "noeviction"));
        assert_int_equal(redis_link_command(f->link, on_reply, NULL, 1, (const char *const[]) { "PING" }, NULL),
                         -ENOTCONN);
}

/* A command on a connection of its own (the link may be failed). */
static void side_command(Fixture *f, const char *const *argv) {
        int argc = 0;
        while (argv[argc])
                argc++;
        redisContext *c = redisConnect("127.0.0.1", f->redis.port);
        assert_true(c && !c->err);
        redisReply *r = redisCommandArgv(c, argc, (const char **) argv, NULL);
        assert_non_null(r);
        assert_int_not_equal(r->type, REDIS_REPLY_ERROR);
        freeReplyObject(r);
        redisFree(c);
}
#define SIDE(...) side_command(f, (const char *const[]) { __VA_ARGS__, NULL })

/* SPEC §11, "What is checked at connect is watched": the policy changed at run time fails the link within a
 * watch interval or two, as at connect; set back, the link comes up again. */
static void test_eviction_policy_set_at_run_time_fails_the_link(void **state) {
        Fixture *f = *state;

        redis_start(f, NULL);
        f->options.watch_interval = 200 * USEC_PER_MSEC;
        link_start(f);
        wait_up(f);
        usec_t set = now_monotonic();
        SIDE("CONFIG", "SET", "maxmemory-policy", "allkeys-lru");
        wait_state(f, REDIS_LINK_FAILED);
        assert_true(now_monotonic() - set < 2 * USEC_PER_SEC);
        assert_string_equal(redis_link_get_failure(f->link), "eviction-policy");
        assert_non_null(strstr(f->detail, "allkeys-lru"));

        SIDE("CONFIG", "SET", "maxmemory-policy", "noeviction");
        wait_up(f);
}

/* REPLICAOF by hand: a replica fails the link ("replica"); made a primary again, the link comes up with
 * another replication id (the owner opens a recovery window: it may hold another data set now). */
static void test_replicaof_by_hand_fails_the_link_and_changes_its_id(void **state) {
        Fixture *f = *state;
        char before[128];

        redis_start(f, NULL);
        f->options.watch_interval = 200 * USEC_PER_MSEC;
        link_start(f);
        wait_up(f);
        snprintf(before, sizeof before, "%.120s", f->detail);
        SIDE("REPLICAOF", "127.0.0.1", "1"); /* nobody there: it stays a replica that cannot sync */
        wait_state(f, REDIS_LINK_FAILED);
        assert_string_equal(redis_link_get_failure(f->link), "replica");

        SIDE("REPLICAOF", "NO", "ONE");
        wait_up(f);
        assert_int_equal(strncmp(f->detail, before, 40), 0);   /* the same run */
        assert_string_not_equal(f->detail, before);            /* another replication history */
}

/* The link's INFO commands so far (INFO commandstats, less the ones this asked before: each counts from the
 * next one). */
/* A number of INFO section's text, after `key` (0 when absent), asked on a connection of the test's own. */
static long long server_info(Fixture *f, const char *section, const char *key) {
        redisContext *c = redisConnect("127.0.0.1", f->redis.port);
        assert_true(c && !c->err);
        redisReply *r = redisCommand(c, "INFO %s", section);
        assert_true(r && r->type == REDIS_REPLY_STRING);
        const char *at = strstr(r->str, key);
        long long n = at ? strtoll(at + strlen(key), NULL, 10) : 0;
        freeReplyObject(r);
        redisFree(c);
        return n;
}

static long long link_info_calls(Fixture *f) {
        static unsigned asked = 0; /* one redis-server per test, one test at a time */
        static pid_t asked_of = 0;
        if (asked_of != f->redis.pid) {
                asked_of = f->redis.pid;
                asked = 0;
        }
        return server_info(f, "commandstats", "cmdstat_info:calls=") - asked++;
}

static bool time_passed(Fixture *f, const void *deadline) {
        return now_monotonic() >= *(const usec_t *) deadline;
}

/* Runs the loop for d: the time itself is what is tested (the watch's INFO must not come meanwhile). */
static void run_for(Fixture *f, usec_t d) {
        usec_t deadline = now_monotonic() + d;
        (void) run_until(f, time_passed, &deadline, d + USEC_PER_SEC);
}

static bool link_info_calls_above(Fixture *f, const void *n) {
        return link_info_calls(f) > *(const long long *) n;
}

/* The watch goes along with the owner's command when half an interval passed (one round trip, not two),
 * and the link's own timer then waits three intervals, a fallback: an owner that sends along every interval
 * leaves no INFO of its own round trip (issue 21 item 3: an idle node's renewal carries it). */
static void test_the_watch_goes_along_with_the_owners_command(void **state) {
        Fixture *f = *state;
        const usec_t interval = USEC_PER_SEC;

        redis_start(f, NULL);
        f->options.watch_interval = interval;
        link_start(f);
        wait_up(f);
        assert_int_equal(redis_link_watch_along(f->link), 0); /* the setup read INFO just now */
        run_for(f, interval / 2);
        long long before = link_info_calls(f);
        assert_int_equal(redis_link_watch_along(f->link), 1);
        assert_int_equal(redis_link_watch_along(f->link), 0); /* one in flight, or just sent */
        Reply r = CMD("PING");
        assert_int_equal(r.error, 0);
        assert_int_equal(link_info_calls(f), before + 1);
        /* None of the link's own for two intervals (it sent one every interval). */
        run_for(f, 2 * interval);
        assert_int_equal(link_info_calls(f), before + 1);
        /* The fallback: the owner sent none along for three intervals. */
        assert_true(run_until(f, link_info_calls_above, &(long long) { before + 1 }, DEADLINE));
        assert_int_equal(redis_link_get_state(f->link), REDIS_LINK_UP);
}

/* An owner that rests the watch (an idle node) gets no INFO of the timer's for many intervals; its next
 * watch_along() sends one and wakes the timer again (the fallback, three intervals later). */
static void test_a_resting_watch_reads_no_info_until_the_owner_sends_again(void **state) {
        Fixture *f = *state;
        const usec_t interval = USEC_PER_SEC / 2;

        redis_start(f, NULL);
        f->options.watch_interval = interval;
        link_start(f);
        wait_up(f);
        long long before = link_info_calls(f);
        assert_int_equal(redis_link_watch_rest(f->link), 0);
        run_for(f, 6 * interval);
        assert_int_equal(link_info_calls(f), before);
        assert_int_equal(redis_link_watch_along(f->link), 1);
        Reply r = CMD("PING");
        assert_int_equal(r.error, 0);
        assert_int_equal(link_info_calls(f), before + 1);
        /* Awake: the fallback comes back, three intervals after. */
        assert_true(run_until(f, link_info_calls_above, &(long long) { before + 1 }, DEADLINE));
        assert_int_equal(redis_link_get_state(f->link), REDIS_LINK_UP);
}

/* A blocking link up, with a backoff of 5 s, and a 60 s read blocked in Redis whose reply goes to r. */
static void blocked_read_start(Fixture *f, Reply *r) {
        const char *const xread[] = { "XREAD", "BLOCK", "60000", "STREAMS", "s", "$" };

        redis_start(f, NULL);
        f->options.blocking = true;
        f->options.backoff_min = f->options.backoff_max = 5 * USEC_PER_SEC;
        link_start(f);
        wait_up(f);
        assert_int_equal(redis_link_command_blocking(f->link, 60 * USEC_PER_SEC, on_reply, r, 6, xread, NULL), 0);
        run_for(f, 100 * USEC_PER_MSEC); /* the read is in Redis, blocked */
}

/* A blocking read ended by a new connection (brokerd's long idle XREAD, when a pool joins the read): the
 * read's owner hears -ECONNRESET at once, the link DOWN then UP again without a backoff, no timeout. */
static void test_reconnect_ends_a_blocking_read_and_comes_back_at_once(void **state) {
        Fixture *f = *state;
        RedisLinkStats stats;
        Reply r = {};

        blocked_read_start(f, &r);
        usec_t cut = now_monotonic();
        unsigned told_before = f->n_told;
        assert_int_equal(redis_link_reconnect(f->link, "test"), 1);
        assert_true(run_until(f, reply_done, &r, DEADLINE));
        assert_int_equal(r.error, -ECONNRESET);
        wait_up(f);
        assert_true(f->n_told >= told_before + 2); /* DOWN, then UP */
        assert_true(now_monotonic() - cut < 2 * USEC_PER_SEC); /* not after the 5 s backoff */
        redis_link_get_stats(f->link, &stats);
        assert_int_equal(stats.ups, 2);
        assert_int_equal(stats.timeouts, 0);
        /* Up again: a new read is taken. */
        Reply again = {};
        const char *const xread_short[] = { "XREAD", "BLOCK", "100", "STREAMS", "s", "$" };
        assert_int_equal(redis_link_command_blocking(f->link, 100 * USEC_PER_MSEC, on_reply, &again, 6, xread_short,
                                                     NULL), 0);
        assert_true(run_until(f, reply_done, &again, DEADLINE));
        assert_int_equal(again.error, 0);
        assert_int_equal(again.type, REDIS_REPLY_NIL);
}

/* The clients the redis-server counts, the one asking left out. */
static long long server_clients(Fixture *f) {
        long long n = server_info(f, "clients", "connected_clients:");
        assert_true(n >= 1); /* the one asking, at least: the field is there */
        return n - 1;
}

/* A link its owner needs only now and then (brokerd's stream link while its node holds nothing) rests: its
 * connection ends (a blocking read in flight hears -ECONNRESET), the owner hears DOWN, commands are refused,
 * and no attempt is made however long it rests; woken, it connects at once, not after the backoff. */
static void test_a_resting_link_closes_and_connects_again_when_woken(void **state) {
        Fixture *f = *state;
        const char *const ping[] = { "PING" };
        RedisLinkStats before, after;
        Reply r = {};

        blocked_read_start(f, &r);
        assert_int_equal(server_clients(f), 1);

        assert_int_equal(redis_link_rest(f->link), 1);
        assert_int_equal(redis_link_rest(f->link), 0);
        assert_true(run_until(f, reply_done, &r, DEADLINE));
        assert_int_equal(r.error, -ECONNRESET);
        wait_state(f, REDIS_LINK_DOWN);
        redis_link_get_stats(f->link, &before);
        run_for(f, USEC_PER_SEC);
        assert_int_equal(server_clients(f), 0);
        redis_link_get_stats(f->link, &after);
        assert_int_equal(after.attempts, before.attempts);
        assert_int_equal(redis_link_get_state(f->link), REDIS_LINK_DOWN);
        Reply refused = {};
        assert_int_equal(redis_link_command(f->link, on_reply, &refused, 1, ping, NULL), -ENOTCONN);

        usec_t woken = now_monotonic();
        assert_int_equal(redis_link_wake(f->link), 1);
        assert_int_equal(redis_link_wake(f->link), 0);
        wait_up(f);
        assert_true(now_monotonic() - woken < 2 * USEC_PER_SEC); /* not after the 5 s backoff */
        assert_int_equal(server_clients(f), 1);
        Reply pong = {};
        assert_int_equal(redis_link_command(f->link, on_reply, &pong, 1, ping, NULL), 0);
        assert_true(run_until(f, reply_done, &pong, DEADLINE));
        assert_int_equal(pong.error, 0);
}

/* A listening socket that is not Redis: it answers garbage to whatever comes, or stays silent. */
static int on_not_redis(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        Fixture *f = userdata;
        static const char garbage[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
        int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);

        if (c < 0)
                return 0;
        if (f->not_redis_reply)
                assert_int_equal(write(c, f->not_redis_reply, strlen(f->not_redis_reply)),
                                 (ssize_t) strlen(f->not_redis_reply));
        else if (!f->not_redis_silent)
                assert_int_equal(write(c, garbage, sizeof garbage - 1), (ssize_t) sizeof garbage - 1);
        if (f->n_accepted < sizeof f->accepted / sizeof f->accepted[0])
                f->accepted[f->n_accepted++] = c;
        else
                close(c);
        return 0;
}

static void not_redis_start(Fixture *f, bool silent) {
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        socklen_t len = sizeof sa;

        f->not_redis_silent = silent;
        f->not_redis_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        assert_true(f->not_redis_fd >= 0);
        assert_int_equal(bind(f->not_redis_fd, (struct sockaddr *) &sa, sizeof sa), 0);
        assert_int_equal(listen(f->not_redis_fd, 16), 0);
        assert_int_equal(getsockname(f->not_redis_fd, (struct sockaddr *) &sa, &len), 0);
        f->port = ntohs(sa.sin_port);
        assert_int_equal(sd_event_add_io(f->event, &f->not_redis_source, f->not_redis_fd, EPOLLIN, on_not_redis, f), 0);
}

static void test_a_server_that_is_not_redis_fails_the_link(void **state) {
        Fixture *f = *state;

        not_redis_start(f, false);
        link_start(f);
        wait_state(f, REDIS_LINK_FAILED);
        assert_non_null(strstr(f->detail, "Not a Redis server"));
}

static void test_a_silent_server_times_out_the_setup(void **state) {
        Fixture *f = *state;

        not_redis_start(f, true);
        f->options.command_timeout = 200 * USEC_PER_MSEC;
        link_start(f);
        wait_state(f, REDIS_LINK_DOWN);
        if (!strstr(f->detail, "Timed out setting the connection up"))
                fail_msg("told: %s", f->detail);
}

static void test_blocking_read_has_its_own_timeout(void **state) {
        Fixture *f = *state;
        RedisLinkStats stats;

        redis_start(f, NULL);
        f->options.blocking = true;
        f->options.command_timeout = 400 * USEC_PER_MSEC;
        link_start(f);
        wait_up(f);

        /* Blocks 1 s on the server, more than twice the command timeout: not a timeout. */
        const char *const xread[] = { "XREAD", "BLOCK", "1000", "STREAMS", "s", "$" };
        Reply r = {};
        usec_t sent = now_monotonic();
        assert_int_equal(redis_link_command_blocking(f->link, USEC_PER_SEC, on_reply, &r, 6, xread, NULL), 0);
        assert_int_equal(redis_link_command_blocking(f->link, USEC_PER_SEC, on_reply, NULL, 6, xread, NULL), -EBUSY);
        assert_true(run_until(f, reply_done, &r, DEADLINE));
        assert_int_equal(r.error, 0);
        assert_int_equal(r.type, REDIS_REPLY_NIL);
        assert_true(now_monotonic() - sent >= USEC_PER_SEC);
        redis_link_get_stats(f->link, &stats);
        assert_int_equal(stats.timeouts, 0);
        assert_int_equal(stats.ups, 1);
}

static void test_blocking_read_times_out_after_its_block_and_the_timeout(void **state) {
        Fixture *f = *state;
        const char *const xread[] = { "XREAD", "BLOCK", "200", "STREAMS", "s", "$" };
        Reply r = {};

        redis_start(f, NULL);
        f->options.blocking = true;
        f->options.command_timeout = 200 * USEC_PER_MSEC;
        link_start(f);
        wait_up(f);
        assert_int_equal(kill(f->redis.pid, SIGSTOP), 0);
        usec_t sent = now_monotonic();
        assert_int_equal(redis_link_command_blocking(f->link, 200 * USEC_PER_MSEC, on_reply, &r, 6, xread, NULL), 0);
        assert_true(run_until(f, reply_done, &r, DEADLINE));
        assert_int_equal(r.error, -ETIMEDOUT);
        assert_true(now_monotonic() - sent >= 400 * USEC_PER_MSEC);
}

static void test_blocking_command_needs_a_blocking_link(void **state) {
        Fixture *f = *state;

        redis_start(f, NULL);
        link_start(f);
        wait_up(f);
        assert_int_equal(redis_link_command_blocking(f->link, USEC_PER_SEC, on_reply, NULL, 1,
                                                     (const char *const[]) { "PING" }, NULL), -EINVAL);
}

static void test_sockets_are_close_on_exec(void **state) {
        Fixture *f = *state;
        DIR *d;
        struct dirent *de;
        unsigned sockets = 0;

        redis_start(f, NULL);
        link_start(f);
        wait_up(f);
        d = opendir("/proc/self/fd");
        assert_non_null(d);
        while ((de = readdir(d))) {
                int fd = atoi(de->d_name);
                struct stat st;
                if (de->d_name[0] == '.' || fd == dirfd(d) || fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode))
                        continue;
                sockets++;
                if (!(fcntl(fd, F_GETFD) & FD_CLOEXEC))
                        fail_msg("socket fd %d is not close-on-exec", fd);
        }
        closedir(d);
        assert_true(sockets >= 1);
}

static void test_link_may_be_freed_from_its_callbacks(void **state) {
        Fixture *f = *state;
        Reply behind = {};

        redis_start(f, NULL);
        link_start(f);
        wait_up(f);
        /* From a reply, with another command in flight behind it: that one is never called back. */
        assert_int_equal(redis_link_command(f->link, on_reply_then_free, f, 1, (const char *const[]) { "PING" }, NULL), 0);
        assert_int_equal(redis_link_command(f->link, on_reply, &behind, 1, (const char *const[]) { "PING" }, NULL), 0);
        for (int i = 0; f->link && i < 1000; i++)
                assert_true(sd_event_run(f->event, 10 * USEC_PER_MSEC) >= 0);
        assert_null(f->link);
        for (int i = 0; i < 5; i++)
                assert_true(sd_event_run(f->event, 10 * USEC_PER_MSEC) >= 0);
        assert_false(behind.done);

        /* From a state callback: the link that saw Redis go away is freed there. */
        f->n_told = 0;
        link_start(f);
        wait_up(f);
        f->free_in_callback = true;
        test_redis_kill(&f->redis);
        for (int i = 0; f->link && i < 1000; i++)
                assert_true(sd_event_run(f->event, 10 * USEC_PER_MSEC) >= 0);
        assert_null(f->link);
}

static bool stays_idle(Fixture *f, const void *until) {
        return now_monotonic() >= *(const usec_t *) until || f->n_attempts > 0;
}

static void test_link_without_endpoint_waits_then_moves_at_once(void **state) {
        Fixture *f = *state;
        RedisEndpoint tcp = { .type = REDIS_ENDPOINT_TCP, .host = (char *) "127.0.0.1" };
        RedisEndpoint unix_socket = { .type = REDIS_ENDPOINT_UNIX, .path = f->redis.socket_path };
        usec_t until = now_monotonic() + 300 * USEC_PER_MSEC;
        unsigned told;

        redis_start(f, NULL);
        tcp.port = (uint16_t) f->redis.port;
        f->options = (RedisLinkOptions) { .on_state = on_state, .on_log = on_log, .userdata = f,
                                          .backoff_min = 2 * USEC_PER_SEC, .backoff_max = 4 * USEC_PER_SEC };
        assert_int_equal(redis_link_new(f->event, NULL, &f->options, &f->link), 0);
        assert_null(redis_link_get_endpoint(f->link));
        run_until(f, stays_idle, &until, USEC_PER_SEC);
        assert_int_equal(f->n_attempts, 0); /* nowhere to go yet */
        assert_int_equal(redis_link_get_state(f->link), REDIS_LINK_DOWN);

        assert_int_equal(redis_link_set_endpoint(f->link, &tcp), 1);
        wait_up(f);
        assert_int_equal(redis_link_get_endpoint(f->link)->port, f->redis.port);
        assert_int_equal(redis_link_set_endpoint(f->link, &tcp), 0); /* the same: nothing happens */
        assert_int_equal(redis_link_get_state(f->link), REDIS_LINK_UP);

        /* A move ends the connection (the owner hears DOWN) and tries the new address at once: within the
         * deadline although the backoff's first step is 2 s. */
        told = f->n_told;
        usec_t moved = now_monotonic();
        assert_int_equal(redis_link_set_endpoint(f->link, &unix_socket), 1);
        wait_state(f, REDIS_LINK_DOWN);
        assert_true(strstr(f->detail, "Moved to") != NULL);
        wait_up(f);
        assert_true(now_monotonic() - moved < 2 * USEC_PER_SEC);
        assert_true(f->n_told >= told + 2);
        assert_string_equal(redis_link_get_endpoint(f->link)->path, f->redis.socket_path);
        Reply r = CMD("PING");
        assert_string_equal(r.text, "PONG");
}

typedef struct Messages {
        unsigned n;
        char last[64];
} Messages;

static void on_message(RedisLink *link, const char *channel, const char *message, size_t len, void *userdata) {
        Messages *m = userdata;
        if (strcmp(channel, "news") != 0)
                return;
        m->n++;
        snprintf(m->last, sizeof m->last, "%.*s", (int) len, message);
}

static bool got_messages(Fixture *f, const void *m) {
        return ((const Messages *) m)->n > 0;
}

/* PUBLISH on a link of its own; returns the number of subscribers Redis delivered to. */
static long long publish(Fixture *f, const char *text) {
        char url[64];
        RedisEndpoint e;
        RedisLink *pub = NULL;
        Reply r = {};

        snprintf(url, sizeof url, "redis://127.0.0.1:%d", f->redis.port);
        assert_int_equal(redis_endpoint_parse(url, &e), 0);
        assert_int_equal(redis_link_new(f->event, &e, NULL, &pub), 0);
        redis_endpoint_done(&e);
        for (usec_t deadline = now_monotonic() + DEADLINE;
             redis_link_get_state(pub) != REDIS_LINK_UP && now_monotonic() < deadline;)
                assert_true(sd_event_run(f->event, 10 * USEC_PER_MSEC) >= 0);
        assert_int_equal(redis_link_command(pub, on_reply, &r, 3, (const char *const[]) { "PUBLISH", "news", text },
                                            NULL), 0);
        assert_true(run_until(f, reply_done, &r, DEADLINE));
        redis_link_free(pub);
        return r.integer;
}

static void test_subscription_is_up_before_up_and_renewed_after_a_restart(void **state) {
        Fixture *f = *state;
        Messages m = {};

        redis_start(f, NULL);
        f->options.blocking = true;
        link_start(f);
        assert_int_equal(redis_link_subscribe(f->link, "news", on_message, &m), 0);
        assert_int_equal(redis_link_subscribe(f->link, "more", on_message, &m), -EINVAL); /* one only */
        wait_up(f);
        /* Up means subscribed: a message published now is delivered. */
        assert_int_equal(publish(f, "first"), 1);
        assert_true(run_until(f, got_messages, &m, DEADLINE));
        assert_string_equal(m.last, "first");
        /* A subscribed connection answers nothing else. */
        Reply r = {};
        assert_int_equal(redis_link_command(f->link, on_reply, &r, 1, (const char *const[]) { "PING" }, NULL), -EINVAL);

        test_redis_kill(&f->redis);
        wait_state(f, REDIS_LINK_DOWN);
        assert_int_equal(test_redis_restart(&f->redis, NULL), 0); /* the same port */
        wait_up(f);
        m = (Messages) {};
        assert_int_equal(publish(f, "second"), 1);
        assert_true(run_until(f, got_messages, &m, DEADLINE));
        assert_string_equal(m.last, "second");
}

static void test_subscription_needs_a_blocking_link(void **state) {
        Fixture *f = *state;
        Messages m = {};

        redis_start(f, NULL);
        link_start(f);
        assert_int_equal(redis_link_subscribe(f->link, "news", on_message, &m), -EINVAL);
}

static void test_sentinel_link_to_a_data_node_fails(void **state) {
        Fixture *f = *state;

        redis_start(f, NULL);
        f->options.sentinel = true;
        link_start(f);
        wait_state(f, REDIS_LINK_FAILED);
        assert_string_equal(redis_link_get_failure(f->link), "not-sentinel");
}

int main(int argc, char *argv[]) {
        const struct CMUnitTest tests[] = {
#define T(t) cmocka_unit_test_setup_teardown(t, setup, teardown)
                T(test_link_comes_up_with_the_run_id_and_answers_commands),
                T(test_corked_commands_leave_at_the_uncork),
                T(test_command_while_down_fails_at_once),
                T(test_commands_that_change_the_connection_are_refused),
                T(test_unix_socket_url_selects_its_db),
                T(test_evalsha_runs_a_script_loaded_at_setup),
                T(test_script_flush_then_evalsha_reloads_and_retries_once),
                T(test_a_script_redis_cannot_compile_fails_the_link),
                T(test_fcall_runs_the_library_loaded_at_setup),
                T(test_function_flush_then_fcall_reloads_and_retries_once),
                T(test_a_library_redis_cannot_compile_fails_the_link),
                T(test_a_library_refused_as_a_write_leaves_the_link_up),
                T(test_a_redis_older_than_7_is_refused_with_a_library),
                T(test_a_redis_older_than_7_serves_a_link_without_a_library),
                T(test_command_timeout_ends_the_connection_then_it_comes_back),
                T(test_redis_restart_is_seen_as_a_new_run_id),
                T(test_unreachable_port_fails_fast_and_backs_off),
                T(test_password_file_authenticates),
                T(test_wrong_password_is_a_configuration_error),
                T(test_missing_password_is_a_configuration_error),
                T(test_wrong_db_is_a_configuration_error),
                T(test_eviction_policy_other_than_noeviction_is_refused),
                T(test_eviction_policy_set_at_run_time_fails_the_link),
                T(test_replicaof_by_hand_fails_the_link_and_changes_its_id),
                T(test_the_watch_goes_along_with_the_owners_command),
                T(test_a_resting_watch_reads_no_info_until_the_owner_sends_again),
                T(test_reconnect_ends_a_blocking_read_and_comes_back_at_once),
                T(test_a_resting_link_closes_and_connects_again_when_woken),
                T(test_a_server_that_is_not_redis_fails_the_link),
                T(test_a_silent_server_times_out_the_setup),
                T(test_blocking_read_has_its_own_timeout),
                T(test_blocking_read_times_out_after_its_block_and_the_timeout),
                T(test_blocking_command_needs_a_blocking_link),
                T(test_sockets_are_close_on_exec),
                T(test_link_may_be_freed_from_its_callbacks),
                T(test_link_without_endpoint_waits_then_moves_at_once),
                T(test_subscription_is_up_before_up_and_renewed_after_a_restart),
                T(test_subscription_needs_a_blocking_link),
                T(test_sentinel_link_to_a_data_node_fails),
        };
        /* A bare Debian root (debootstrap, no /etc/hosts) cannot resolve "localhost" at all: the case runs as a
         * test of its own (cmocka's skip() prints "not ok N # SKIP", a failure to meson). */
        const struct CMUnitTest hostname_tests[] = {
                T(test_hostname_is_resolved_off_the_loop),
#undef T
        };
        bool hostname = argc > 1 && strcmp(argv[1], "hostname") == 0;

        if (!test_redis_find()) {
                printf("1..0 # SKIP redis-server not found (install redis-server, or set REDIS_SERVER)\n");
                return 0;
        }
        /* A killed redis-server must not take the test with it through a write to its socket. */
        signal(SIGPIPE, SIG_IGN);
        if (hostname) {
                struct addrinfo *ai = NULL;
                int k = getaddrinfo("localhost", NULL, &(struct addrinfo) { .ai_socktype = SOCK_STREAM }, &ai);
                freeaddrinfo(ai);
                if (k != 0) {
                        printf("1..0 # SKIP localhost does not resolve here (no /etc/hosts)\n");
                        return 0;
                }
                return cmocka_run_group_tests(hostname_tests, NULL, NULL);
        }
        return cmocka_run_group_tests(tests, NULL, NULL);
}
