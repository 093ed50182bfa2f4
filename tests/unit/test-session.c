/* SPDX-License-Identifier: MIT */
/* test-session.c — a client's session in brokerd's core (session.h with methods, lease and the drain), over
 * a socketpair handed to manager_add_connection(): the Acquire's replies and its lease's life line, calls
 * pipelined behind an open Acquire, the queue's positions, and the one way a waiter is withdrawn (its
 * connection closes, or an administrator cancels it); with a pool that decides later (tests/unit/fake-pool.c),
 * the pool's reason for a refusal, and a client that goes before its pool answered. A real Manager on a
 * private state directory and socket, driven by its own sd-event loop until the reply waited for has come. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "engine.h"
#include "fake-pool.h"
#include "manager.h"

static const char config[] = "[pool p]\n"
                             "limit = 1\n"
                             "\n"
                             "[lane l]\n"
                             "pools = p\n"
                             "policy = wait\n";

typedef struct Client {
        int fd;
        char buf[65536];
        size_t n;
} Client;

typedef struct Fixture {
        char dir[64];
        char config_path[128];
        Manager *m;
        FakePoolSet pools;
} Fixture;

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
        return remove(path) < 0 ? -1 : 0;
}

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof(Fixture));
        char path[128], socket_path[128], state_dir[128];
        assert_non_null(f);
        strcpy(f->dir, "/tmp/test-session-XXXXXX");
        assert_non_null(mkdtemp(f->dir));
        snprintf(path, sizeof path, "%s/brokerd.conf", f->dir);
        snprintf(f->config_path, sizeof f->config_path, "%s", path);
        snprintf(socket_path, sizeof socket_path, "%s/sock", f->dir);
        snprintf(state_dir, sizeof state_dir, "%s/state", f->dir);
        FILE *c = fopen(path, "we");
        assert_non_null(c);
        fputs(config, c);
        fclose(c);
        unsetenv("NOTIFY_SOCKET");
        unsetenv("LISTEN_FDS");
        setenv("SLOTBROKER_JOURNAL_SOCKET", "/nonexistent", 1);
        assert_int_equal(manager_new(&(ManagerOptions) { .config_path = path, .socket_path = socket_path,
                                                         .state_directory = state_dir },
                                     &f->m),
                         0);
        assert_int_equal(manager_start(f->m), 0);
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;
        manager_free(f->m);
        (void) nftw(f->dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
        free(f);
        return 0;
}

static Client *client_new(Fixture *f) {
        int sv[2];
        Client *c = calloc(1, sizeof(Client));
        assert_non_null(c);
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
        assert_int_equal(manager_add_connection(f->m, sv[0]), 0);
        c->fd = sv[1];
        return c;
}

static void client_free(Client *c) {
        if (c->fd >= 0)
                close(c->fd);
        free(c);
}

static void client_send(Client *c, const char *method, const char *parameters, const char *flag) {
        char buf[1024];
        int n = snprintf(buf, sizeof buf, "{\"method\":\"%s\",\"parameters\":%s%s%s%s}", method, parameters,
                         flag ? ",\"" : "", flag ?: "", flag ? "\":true" : "");
        assert_int_equal(send(c->fd, buf, (size_t) n + 1, MSG_NOSIGNAL), n + 1);
}

/* The next complete message, if one has come (the caller owns it), else NULL. */
static json_t *client_take(Client *c) {
        for (;;) {
                ssize_t k = recv(c->fd, c->buf + c->n, sizeof c->buf - c->n, MSG_DONTWAIT);
                if (k <= 0)
                        break;
                c->n += (size_t) k;
        }
        char *end = memchr(c->buf, '\0', c->n);
        if (!end)
                return NULL;
        json_t *j = json_loads(c->buf, 0, NULL);
        assert_non_null(j);
        size_t used = (size_t) (end - c->buf) + 1;
        memmove(c->buf, c->buf + used, c->n - used);
        c->n -= used;
        return j;
}

static void pump(Fixture *f) {
        assert_true(sd_event_run(f->m->event, 10 * 1000) >= 0);
}

/* Runs the loop until the client has a message: no sleeps as synchronisation. */
static json_t *client_wait(Fixture *f, Client *c) {
        for (int i = 0; i < 1000; i++) {
                json_t *j = client_take(c);
                if (j)
                        return j;
                pump(f);
        }
        fail_msg("no reply came");
        return NULL;
}

#define PUMP_UNTIL(f, cond)                                                                                 \
        do {                                                                                               \
                for (int _i = 0; !(cond); _i++) {                                                          \
                        assert_true(_i < 1000);                                                            \
                        pump(f);                                                                           \
                }                                                                                          \
        } while (0)

static const char *state_of(json_t *reply) {
        json_t *s = json_object_get(json_object_get(reply, "parameters"), "state");
        return json_is_string(s) ? json_string_value(s) : "";
}

static const char *error_of(json_t *reply) {
        json_t *e = json_object_get(reply, "error");
        return json_is_string(e) ? json_string_value(e) : "";
}

static bool continues(json_t *reply) {
        return json_is_true(json_object_get(reply, "continues"));
}

static unsigned uid_waiters(Fixture *f) {
        UidUsage *u = session_table_uid_usage(&f->m->sessions, getuid(), false);
        return u ? u->waiters : 0;
}

static size_t pool_waiting(Fixture *f) {
        EnginePoolInfo info;
        assert_int_equal(engine_pool_info(f->m->engine, 0, now_monotonic(), &info), 0);
        return info.waiting;
}

/* A granted Acquire with "more": the lease id (malloc'ed). */
static char *acquire_granted(Fixture *f, Client *c) {
        client_send(c, "io.slotbroker.Acquire", "{\"lane\":\"l\"}", "more");
        json_t *r = client_wait(f, c);
        assert_string_equal(state_of(r), "granted");
        assert_true(continues(r));
        char *id = strdup(json_string_value(json_object_get(json_object_get(json_object_get(r, "parameters"), "lease"), "id")));
        json_decref(r);
        return id;
}

static void test_grant_continues_and_closing_ends_the_lease(void **state) {
        Fixture *f = *state;
        Client *a = client_new(f);
        free(acquire_granted(f, a));
        assert_int_equal(f->m->leases.n_leases, 1);
        close(a->fd);
        a->fd = -EBADF;
        PUMP_UNTIL(f, f->m->leases.n_leases == 0); /* the connection was the lease's life line */
        assert_int_equal(f->m->sessions.n_sessions, 0);
        client_free(a);
}

static void test_calls_behind_an_open_acquire_are_answered_after_it_in_order(void **state) {
        Fixture *f = *state;
        Client *a = client_new(f);
        Client *b = client_new(f);
        char *id = acquire_granted(f, a);

        /* A call behind a waiting Acquire waits for its answer (SPEC §5). */
        client_send(b, "io.slotbroker.Acquire", "{\"lane\":\"l\"}", "more");
        json_decref(client_wait(f, b)); /* queued */
        client_send(b, "org.varlink.service.GetInfo", "{}", NULL);
        for (int i = 0; i < 5; i++)
                pump(f);
        assert_null(client_take(b));

        /* The holder's Release of its own lease overtakes the wait for it to end, which it causes: the
         * Acquire's last reply, the Release's, then the call pipelined behind. */
        char params[128];
        snprintf(params, sizeof params, "{\"lease\":\"%s\"}", id);
        client_send(a, "io.slotbroker.Release", params, NULL);
        client_send(a, "org.varlink.service.GetInfo", "{}", NULL);
        json_t *r1 = client_wait(f, a), *r2 = client_wait(f, a), *r3 = client_wait(f, a);
        assert_string_equal(state_of(r1), "released"); /* the Acquire's last reply first */
        assert_false(continues(r1));
        assert_string_equal(error_of(r2), "");
        assert_null(json_object_get(json_object_get(r2, "parameters"), "vendor")); /* the Release's reply */
        assert_non_null(json_object_get(json_object_get(r3, "parameters"), "vendor")); /* then GetInfo's */
        json_decref(r1);
        json_decref(r2);
        json_decref(r3);
        free(id);
        client_free(a);

        /* b was granted the freed slot; its GetInfo still waits behind the lease it now holds. */
        json_t *g = client_wait(f, b);
        assert_string_equal(state_of(g), "granted");
        json_decref(g);
        for (int i = 0; i < 5; i++)
                pump(f);
        assert_null(client_take(b));
        client_free(b);
}

static void test_waiter_hears_position_then_grant_after_release(void **state) {
        Fixture *f = *state;
        Client *a = client_new(f), *b = client_new(f);
        free(acquire_granted(f, a));
        client_send(b, "io.slotbroker.Acquire", "{\"lane\":\"l\"}", "more");
        json_t *q = client_wait(f, b);
        assert_string_equal(state_of(q), "queued");
        assert_int_equal(json_integer_value(json_object_get(json_object_get(q, "parameters"), "position")), 1);
        json_decref(q);
        assert_int_equal(uid_waiters(f), 1);

        close(a->fd);
        a->fd = -EBADF;
        json_t *g = client_wait(f, b);
        assert_string_equal(state_of(g), "granted");
        json_decref(g);
        assert_int_equal(uid_waiters(f), 0);
        client_free(a);
        client_free(b);
}

static void test_waiter_that_closes_is_withdrawn_and_uncounted(void **state) {
        Fixture *f = *state;
        Client *a = client_new(f), *b = client_new(f);
        free(acquire_granted(f, a));
        client_send(b, "io.slotbroker.Acquire", "{\"lane\":\"l\"}", "more");
        json_decref(client_wait(f, b)); /* queued */
        assert_int_equal(pool_waiting(f), 1);
        assert_int_equal(uid_waiters(f), 1);

        close(b->fd);
        b->fd = -EBADF;
        PUMP_UNTIL(f, f->m->sessions.n_sessions == 1);
        assert_int_equal(pool_waiting(f), 0);
        assert_int_equal(uid_waiters(f), 0);
        assert_int_equal(f->m->leases.n_leases, 1); /* a's lease is untouched */
        client_free(a);
        client_free(b);
}

static void test_admin_cancel_refuses_unavailable_then_runs_pipelined_calls(void **state) {
        Fixture *f = *state;
        Client *a = client_new(f), *b = client_new(f), *admin = client_new(f);
        free(acquire_granted(f, a));
        client_send(b, "io.slotbroker.Acquire", "{\"lane\":\"l\",\"job\":\"J\"}", "more");
        json_decref(client_wait(f, b)); /* queued */
        client_send(b, "org.varlink.service.GetInfo", "{}", NULL);

        client_send(admin, "io.slotbroker.Cancel", "{\"job\":\"J\"}", NULL); /* we are our broker's uid: admin */
        json_t *c = client_wait(f, admin);
        assert_int_equal(json_integer_value(json_object_get(json_object_get(c, "parameters"), "cancelled")), 1);
        json_decref(c);

        json_t *r1 = client_wait(f, b), *r2 = client_wait(f, b);
        assert_string_equal(error_of(r1), "io.slotbroker.Unavailable");
        assert_string_equal(json_string_value(json_object_get(json_object_get(r1, "parameters"), "reason")), "cancelled");
        assert_non_null(json_object_get(json_object_get(r2, "parameters"), "vendor")); /* then what it pipelined */
        json_decref(r1);
        json_decref(r2);
        assert_int_equal(pool_waiting(f), 0);
        assert_int_equal(uid_waiters(f), 0);
        client_free(a);
        client_free(b);
        client_free(admin);
}

/* Pool "s" with a backend, made by the fake factory (the daemon has none yet), and lane "ls" waiting on it. */
static FakePool *add_shared_pool(Fixture *f) {
        FILE *c = fopen(f->config_path, "we");
        assert_non_null(c);
        fprintf(c, "%s\n[pool s]\nlimit = 1\nbackend = redis://127.0.0.1:1/0\n\n[lane ls]\npools = s\n", config);
        fclose(c);
        engine_set_pool_factory(f->m->engine, fake_pool_factory, &f->pools);
        ConfErrors errors = {};
        assert_int_equal(manager_reload(f->m, &errors), 0);
        conf_errors_done(&errors);
        FakePool *p = fake_pool_set_find(&f->pools, "s");
        assert_non_null(p);
        return p;
}

static void test_unavailable_says_the_pool_reason(void **state) {
        Fixture *f = *state;
        FakePool *p = add_shared_pool(f);
        fake_pool_refuse(p, REFUSAL_UNAVAILABLE, "backend");
        Client *a = client_new(f);
        client_send(a, "io.slotbroker.Acquire", "{\"lane\":\"ls\"}", "more");
        json_t *r = client_wait(f, a);
        assert_string_equal(error_of(r), "io.slotbroker.Unavailable");
        assert_string_equal(json_string_value(json_object_get(json_object_get(r, "parameters"), "reason")), "backend");
        json_decref(r);
        client_free(a);
}

static void test_client_gone_before_the_pool_answered_is_forgotten_there(void **state) {
        Fixture *f = *state;
        FakePool *p = add_shared_pool(f);
        fake_pool_hold_answers(p, true);
        Client *a = client_new(f);
        client_send(a, "io.slotbroker.Acquire", "{\"lane\":\"ls\"}", "more");
        PUMP_UNTIL(f, fake_pool_stats(p)->pending == 1);
        close(a->fd);
        a->fd = -EBADF;
        PUMP_UNTIL(f, f->m->sessions.n_sessions == 0);
        assert_int_equal(fake_pool_stats(p)->cancelled, 1);
        assert_int_equal(fake_pool_stats(p)->pending, 0);
        /* Nothing comes of it: no lease, no waiter. */
        fake_pool_answer(p, now_monotonic());
        manager_drain(f->m);
        assert_int_equal(f->m->leases.n_leases, 0);
        assert_int_equal(fake_pool_stats(p)->in_use, 0);
        assert_int_equal(uid_waiters(f), 0);
        client_free(a);
}

static void test_rate_bucket(void **state) {
        RateBucket b = {};
        usec_t retry = 0, t = 1000 * USEC_PER_SEC;
        /* 2/s, a burst of 3: full at first. */
        for (int i = 0; i < 3; i++)
                assert_true(rate_bucket_take(&b, 2 * 3600, 3, t, &retry));
        assert_false(rate_bucket_take(&b, 2 * 3600, 3, t, &retry));
        assert_true(retry > 0 && retry <= USEC_PER_SEC / 2 + 1);
        /* Half a second later one token came back, not two. */
        t += USEC_PER_SEC / 2;
        assert_true(rate_bucket_take(&b, 2 * 3600, 3, t, &retry));
        assert_false(rate_bucket_take(&b, 2 * 3600, 3, t, &retry));
        /* An hour idle refills it to the burst, no more. */
        t += USEC_PER_HOUR;
        for (int i = 0; i < 3; i++)
                assert_true(rate_bucket_take(&b, 2 * 3600, 3, t, &retry));
        assert_false(rate_bucket_take(&b, 2 * 3600, 3, t, &retry));
        /* 0: unlimited. */
        for (int i = 0; i < 1000; i++)
                assert_true(rate_bucket_take(&b, 0, 3, t, NULL));
}

static void test_oneway_acquire_is_invalid_parameter(void **state) {
        Fixture *f = *state;
        Client *a = client_new(f);
        client_send(a, "io.slotbroker.Acquire", "{\"lane\":\"l\"}", "oneway");
        json_t *r = client_wait(f, a);
        assert_string_equal(error_of(r), "org.varlink.service.InvalidParameter");
        json_decref(r);
        assert_int_equal(f->m->leases.n_leases, 0);
        client_free(a);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_grant_continues_and_closing_ends_the_lease, setup, teardown),
                cmocka_unit_test_setup_teardown(test_calls_behind_an_open_acquire_are_answered_after_it_in_order, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_waiter_hears_position_then_grant_after_release, setup, teardown),
                cmocka_unit_test_setup_teardown(test_waiter_that_closes_is_withdrawn_and_uncounted, setup, teardown),
                cmocka_unit_test_setup_teardown(test_admin_cancel_refuses_unavailable_then_runs_pipelined_calls, setup,
                                                teardown),
                cmocka_unit_test(test_rate_bucket),
                cmocka_unit_test_setup_teardown(test_oneway_acquire_is_invalid_parameter, setup, teardown),
                cmocka_unit_test_setup_teardown(test_unavailable_says_the_pool_reason, setup, teardown),
                cmocka_unit_test_setup_teardown(test_client_gone_before_the_pool_answered_is_forgotten_there, setup,
                                                teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
