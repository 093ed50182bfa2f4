/* SPDX-License-Identifier: MIT */
/* test-session.c — a client's session in brokerd's core (session.h with methods, lease and the drain), over
 * a socketpair handed to manager_add_connection(): the Acquire's replies and its lease's life line, calls
 * pipelined behind an open Acquire, the queue's positions, and the one way a waiter is withdrawn (its
 * connection closes, or an administrator cancels it); with a pool that decides later (tests/unit/fake-pool.c),
 * the pool's reason for a refusal, and a client that goes before its pool answered or before its grant is
 * written. A real Manager on a private state directory and socket, driven by its own sd-event loop until the
 * reply waited for has come. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
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
        assert_int_equal(manager_add_connection(f->m, sv[0], NULL), 0);
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
        assert_true(manager_run_once(f->m, 10 * 1000) >= 0);
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

static size_t pool_in_use(Fixture *f) {
        EnginePoolInfo info;
        assert_int_equal(engine_pool_info(f->m->engine, 0, now_monotonic(), &info), 0);
        return info.in_use;
}

/* A restart's stop: a waiter handed to the next brokerd, granted while this one still runs (it waits for Redis
 * to take other waiters back). The grant is the next brokerd's, which asks for the request again: it is not
 * recorded here, nor given back to the pool for want of a holder. */
static void test_a_grant_after_the_handover_is_left_to_the_next_brokerd(void **state) {
        Fixture *f = *state;
        Client *a = client_new(f), *b = client_new(f);
        free(acquire_granted(f, a));
        client_send(b, "io.slotbroker.Acquire", "{\"lane\":\"l\"}", "more");
        json_decref(client_wait(f, b)); /* queued */
        Session *waiter = NULL;
        list_foreach(n, &f->m->sessions.sessions) {
                Session *s = container_of(n, Session, node);
                if (s->acquire.request && !s->lease)
                        waiter = s;
        }
        assert_non_null(waiter);
        session_handed_over(waiter);
        PUMP_UNTIL(f, f->m->sessions.n_sessions == 1);
        assert_int_equal(pool_waiting(f), 1); /* not withdrawn: the next brokerd has it */

        close(a->fd);
        a->fd = -EBADF;
        PUMP_UNTIL(f, f->m->sessions.n_sessions == 0);
        for (int i = 0; i < 10; i++)
                pump(f);
        assert_int_equal(pool_waiting(f), 0);
        assert_int_equal(pool_in_use(f), 1);          /* granted, and held for the next brokerd */
        assert_int_equal(f->m->leases.n_leases, 0);   /* no lease of this brokerd's: none in its lease log */
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

/* Pool p of 2 and lane l, read again (the fixture's pool has 1 slot). */
static void reload_two_slots(Fixture *f) {
        FILE *c = fopen(f->config_path, "we");
        assert_non_null(c);
        fputs("[pool p]\nlimit = 2\n\n[lane l]\npools = p\npolicy = wait\n", c);
        fclose(c);
        ConfErrors errors = {};
        assert_int_equal(manager_reload(f->m, &errors), 0);
        conf_errors_done(&errors);
}

/* A detached lease (its Acquire ends with the grant): the daemon's record of it. */
static Lease *acquire_detached(Fixture *f, Client *c) {
        client_send(c, "io.slotbroker.Acquire", "{\"lane\":\"l\",\"detach\":true,\"maxHoldMs\":600000}", NULL);
        json_t *r = client_wait(f, c);
        assert_string_equal(state_of(r), "granted");
        Lease *l = lease_table_find(&f->m->leases, json_string_value(json_object_get(
                                                           json_object_get(json_object_get(r, "parameters"), "lease"), "id")));
        assert_non_null(l);
        json_decref(r);
        return l;
}

/* The window of the Status that disagreed with itself (test-restart under load): two leases end in dispatches
 * of their own (reclaim-grace timers, a command's exit), and the drain that hands the engine's events on has not
 * run yet when a Status call is read. The first release freed a slot; the second's engine call granted it to
 * the waiter before releasing its own: the engine counts the grant, the lease table has no lease for it yet.
 * Returns the waiter's client. */
static Client *grant_in_flight(Fixture *f) {
        reload_two_slots(f);
        Client *a = client_new(f), *b = client_new(f);
        Lease *l1 = acquire_detached(f, a), *l2 = acquire_detached(f, a);
        client_send(b, "io.slotbroker.Acquire", "{\"lane\":\"l\"}", "more");
        json_t *q = client_wait(f, b);
        assert_string_equal(state_of(q), "queued");
        json_decref(q);
        client_free(a);
        /* Idle: no dispatch left, so no drain pending either. */
        while (manager_run_once(f->m, 0) > 0)
                ;
        usec_t t = now_monotonic();
        lease_end(l1); /* as on_reclaim_timeout() or on_command_exit() do */
        while (now_monotonic() == t)
                ; /* the next release at a later instant: its engine call settles this one's first */
        lease_end(l2);
        /* The window itself: what Status read of the engine and of the leases before the fix. */
        assert_int_equal(pool_in_use(f), 1);
        assert_int_equal(f->m->leases.n_leases, 0);
        return b;
}

/* method's reply ({} asked) read in grant_in_flight()'s window; *ret_waiter is the waiter whose grant is in
 * flight, *ret_reader the connection that asked (both for the caller to finish: grant_in_flight_done()). */
static json_t *read_during_a_grant(Fixture *f, const char *method, Client **ret_waiter, Client **ret_reader) {
        *ret_waiter = grant_in_flight(f);
        *ret_reader = client_new(f);
        client_send(*ret_reader, method, "{}", NULL);
        return client_wait(f, *ret_reader);
}

/* The waiter is told its grant after the read. */
static void grant_in_flight_done(Fixture *f, Client *waiter, Client *reader) {
        json_t *g = client_wait(f, waiter);
        assert_string_equal(state_of(g), "granted");
        json_decref(g);
        client_free(waiter);
        client_free(reader);
}

static void test_status_counts_a_grant_once_when_it_is_read_before_the_drain(void **state) {
        Fixture *f = *state;
        Client *b, *c;
        json_t *r = read_during_a_grant(f, "io.slotbroker.Status", &b, &c);
        json_t *p = json_object_get(r, "parameters");
        json_t *pool = json_array_get(json_object_get(p, "pools"), 0);
        json_t *holders = json_object_get(p, "holders");
        /* inUse is what the holders hold: the waiter's grant is its lease already, in both or in neither. */
        assert_int_equal(json_integer_value(json_object_get(pool, "inUse")), 1);
        assert_int_equal(json_array_size(holders), 1);
        json_t *slots = json_object_get(json_object_get(json_array_get(holders, 0), "lease"), "slots");
        assert_int_equal(json_array_size(slots), 1);
        /* It left the queue for the lease: waiting and the waiters agree too. */
        assert_int_equal(json_integer_value(json_object_get(pool, "waiting")), 0);
        assert_int_equal(json_array_size(json_object_get(p, "waiters")), 0);
        json_decref(r);
        grant_in_flight_done(f, b, c);
}

/* Whether the lease log has the lease's row yet: as a brokerd started now would read it. */
static bool lease_log_has(Fixture *f, const char *id) {
        char path[192], needle[64];
        snprintf(path, sizeof path, "%s/state/leases.log", f->dir);
        snprintf(needle, sizeof needle, "{\"lease\":{\"id\":\"%s\"", id);
        FILE *file = fopen(path, "re");
        assert_non_null(file);
        static char data[1 << 20];
        size_t n = fread(data, 1, sizeof data, file);
        fclose(file);
        return memmem(data, n, needle, strlen(needle)) != NULL; /* the reserve past the end is zeros: no strstr */
}

/* Status settles the engine's grants into leases before it answers (above): each lease it shows, and so its
 * token, is in the lease log before the reply leaves. A brokerd killed right after the reply (test-restart
 * under load) would otherwise start from the mark below it and hand out the token again, to another lease,
 * later: a Status reader saw tokens go back (SPEC §3.4). */
static void test_status_shows_no_lease_before_its_row_is_written(void **state) {
        Fixture *f = *state;
        Client *b, *c;
        json_t *r = read_during_a_grant(f, "io.slotbroker.Status", &b, &c);
        json_t *holders = json_object_get(json_object_get(r, "parameters"), "holders");
        assert_int_equal(json_array_size(holders), 1);
        const char *id = json_string_value(json_object_get(json_object_get(json_array_get(holders, 0), "lease"), "id"));
        assert_non_null(id);
        assert_true(lease_log_has(f, id)); /* no loop iteration since the reply: what a SIGKILL now would leave */
        json_decref(r);
        grant_in_flight_done(f, b, c);
}

/* The session of the one connection whose Acquire is open. */
static Session *acquiring_session(Fixture *f) {
        list_foreach(n, &f->m->sessions.sessions) {
                Session *s = container_of(n, Session, node);
                if (s->acquire.active)
                        return s;
        }
        fail_msg("no Acquire is open");
        return NULL;
}

/* Whether the daemon's Metrics count `granted` grants in pool p, lane l. */
static bool metrics_count_granted(Fixture *f, unsigned granted) {
        Client *c = client_new(f);
        client_send(c, "io.slotbroker.Metrics", "{}", NULL);
        json_t *r = client_wait(f, c);
        const char *text = json_string_value(json_object_get(json_object_get(r, "parameters"), "text"));
        assert_non_null(text);
        char line[96];
        snprintf(line, sizeof line, "\nslotbroker_granted_total{pool=\"p\",lane=\"l\"} %u\n", granted);
        bool found = strstr(text, line) != NULL;
        json_decref(r);
        client_free(c);
        return found;
}

/* A client gone after its grant was decided, before the drain handed it on: granted all the same, audited once
 * its row is written, and then the lease ends as its holder went. */
static void test_a_grant_whose_client_went_is_written_then_ended(void **state) {
        Fixture *f = *state;
        Client *b = grant_in_flight(f);
        session_close(acquiring_session(f));
        manager_drain(f->m);
        assert_int_equal(f->m->leases.n_leases, 0);
        assert_int_equal(pool_in_use(f), 0);
        assert_true(metrics_count_granted(f, 3)); /* grant_in_flight()'s two, then b's */
        client_free(b);
}

/* The lease log may not grow (RLIMIT_FSIZE at its size; SIGXFSZ ignored: write() fails with EFBIG) until
 * lease_log_full_end(). */
typedef struct LogFull {
        struct rlimit old;
        void (*xfsz)(int);
} LogFull;

static LogFull lease_log_full_begin(Fixture *f) {
        char path[192];
        struct stat st;
        LogFull full;
        snprintf(path, sizeof path, "%s/state/leases.log", f->dir);
        assert_int_equal(stat(path, &st), 0);
        assert_int_equal(getrlimit(RLIMIT_FSIZE, &full.old), 0);
        struct rlimit limit = full.old;
        limit.rlim_cur = (rlim_t) st.st_size;
        full.xfsz = signal(SIGXFSZ, SIG_IGN);
        assert_int_equal(setrlimit(RLIMIT_FSIZE, &limit), 0);
        return full;
}

static void lease_log_full_end(LogFull *full) {
        assert_int_equal(setrlimit(RLIMIT_FSIZE, &full->old), 0);
        signal(SIGXFSZ, full->xfsz);
}

/* The same when the row cannot be written (the lease log may not grow: RLIMIT_FSIZE): refused as a connected
 * client's grant would be (SPEC §3.4), never counted nor audited granted — it was, before its row, a token that
 * a crash then could give out again — and the slot goes back. */
static void test_a_grant_whose_client_went_is_not_audited_before_its_row(void **state) {
        Fixture *f = *state;
        Client *b = grant_in_flight(f);
        session_close(acquiring_session(f));
        LogFull full = lease_log_full_begin(f);
        manager_drain(f->m);
        lease_log_full_end(&full);
        assert_int_equal(f->m->leases.n_leases, 0);
        assert_int_equal(pool_in_use(f), 0);
        assert_true(metrics_count_granted(f, 2));
        client_free(b);
}

/* lease-persistence=best-effort grants a lease whose row could not be written; the snapshot that mends the log
 * afterwards (manager_write_lease_snapshot()) takes it as any live lease, so that a restart from then on knows
 * it. It used to be left out of every later snapshot, as a grant being withdrawn is. */
static void test_a_best_effort_grant_whose_row_failed_is_in_the_next_snapshot(void **state) {
        Fixture *f = *state;
        Client *a = client_new(f);
        f->m->persistence.mode = LEASE_PERSISTENCE_BEST_EFFORT; /* as lease-persistence=best-effort at start */
        LogFull full = lease_log_full_begin(f);
        Lease *l = acquire_detached(f, a);
        lease_log_full_end(&full);
        assert_false(lease_log_has(f, l->id));
        assert_int_equal(lease_table_write_snapshot(&f->m->leases), 0);
        assert_true(lease_log_has(f, l->id));
        client_free(a);
}

/* The gauge of leases (the lease table) and of slots in use (the engine) in one Metrics reply. */
static void test_metrics_count_a_grant_once_when_read_before_the_drain(void **state) {
        Fixture *f = *state;
        Client *b, *c;
        json_t *r = read_during_a_grant(f, "io.slotbroker.Metrics", &b, &c);
        const char *text = json_string_value(json_object_get(json_object_get(r, "parameters"), "text"));
        assert_non_null(text);
        assert_non_null(strstr(text, "\nslotbroker_slots_in_use{pool=\"p\"} 1\n"));
        assert_non_null(strstr(text, "\nslotbroker_leases 1\n"));
        json_decref(r);
        client_free(b);
        client_free(c);
}

/* A Status pipelined behind an Acquire runs when the Acquire ends; when that is a refusal the drain hands on, it
 * runs inside the drain's handing on of the engine's events, with more of them queued behind the refusal (here
 * the grant of the slot a lease's end freed). It waits for the end of that, then comes, agreeing with itself. */
static void test_status_behind_a_refused_acquire_waits_for_the_events_behind_the_refusal(void **state) {
        Fixture *f = *state;
        Client *a = client_new(f), *b = client_new(f), *c = client_new(f);
        Lease *l = acquire_detached(f, a);
        client_send(c, "io.slotbroker.Acquire", "{\"lane\":\"l\",\"job\":\"C\"}", "more");
        json_decref(client_wait(f, c)); /* queued */
        client_send(b, "io.slotbroker.Acquire", "{\"lane\":\"l\",\"queueWaitMs\":200}", "more");
        client_send(b, "io.slotbroker.Status", "{}", NULL);
        json_t *q = client_wait(f, b);
        usec_t queued = now_monotonic();
        assert_string_equal(state_of(q), "queued");
        json_decref(q);
        while (manager_run_once(f->m, 0) > 0)
                ;
        while (now_monotonic() <= queued + 201 * USEC_PER_MSEC)
                ; /* past b's deadline, with no dispatch meanwhile: its refusal comes with the next engine call */
        lease_end(l); /* a dispatch of its own (a command's exit): b is refused at its deadline, then the slot frees */
        json_t *e = client_wait(f, b), *r = client_wait(f, b);
        assert_string_equal(error_of(e), "io.slotbroker.QueueTimeout");
        json_t *p = json_object_get(r, "parameters");
        json_t *pool = json_array_get(json_object_get(p, "pools"), 0);
        json_t *holders = json_object_get(p, "holders");
        assert_int_equal(json_integer_value(json_object_get(pool, "inUse")), 1);
        assert_int_equal(json_array_size(holders), 1); /* c's, granted in the same drain */
        assert_string_equal(json_string_value(json_object_get(json_object_get(json_array_get(holders, 0), "lease"), "job")),
                            "C");
        assert_int_equal(json_integer_value(json_object_get(pool, "waiting")), 0);
        assert_int_equal(json_array_size(json_object_get(p, "waiters")), 0);
        json_decref(e);
        json_decref(r);
        json_t *g = client_wait(f, c);
        assert_string_equal(state_of(g), "granted");
        json_decref(g);
        client_free(a);
        client_free(b);
        client_free(c);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_grant_continues_and_closing_ends_the_lease, setup, teardown),
                cmocka_unit_test_setup_teardown(test_calls_behind_an_open_acquire_are_answered_after_it_in_order, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_waiter_hears_position_then_grant_after_release, setup, teardown),
                cmocka_unit_test_setup_teardown(test_waiter_that_closes_is_withdrawn_and_uncounted, setup, teardown),
                cmocka_unit_test_setup_teardown(test_a_grant_after_the_handover_is_left_to_the_next_brokerd, setup, teardown),
                cmocka_unit_test_setup_teardown(test_admin_cancel_refuses_unavailable_then_runs_pipelined_calls, setup,
                                                teardown),
                cmocka_unit_test(test_rate_bucket),
                cmocka_unit_test_setup_teardown(test_oneway_acquire_is_invalid_parameter, setup, teardown),
                cmocka_unit_test_setup_teardown(test_unavailable_says_the_pool_reason, setup, teardown),
                cmocka_unit_test_setup_teardown(test_client_gone_before_the_pool_answered_is_forgotten_there, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_status_counts_a_grant_once_when_it_is_read_before_the_drain, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_metrics_count_a_grant_once_when_read_before_the_drain, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_status_shows_no_lease_before_its_row_is_written, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_a_grant_whose_client_went_is_written_then_ended, setup, teardown),
                cmocka_unit_test_setup_teardown(test_a_best_effort_grant_whose_row_failed_is_in_the_next_snapshot, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_a_grant_whose_client_went_is_not_audited_before_its_row, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_status_behind_a_refused_acquire_waits_for_the_events_behind_the_refusal,
                                                setup,
                                                teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
