/* SPDX-License-Identifier: MIT */
/* test-client.c — libbroker through libbroker.so's exported API: against the real brokerd (started here on
 * a private socket, $BROKERD names the binary) and against a scripted fake server for what a healthy
 * broker never sends. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/pidfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "broker.h"
#include "macro.h"
#include "test-fds.h"

DEFINE_TRIVIAL_CLEANUP_FUNC(BrokerClient *, broker_client_free);
DEFINE_TRIVIAL_CLEANUP_FUNC(BrokerLease *, broker_lease_free);

static char tmpdir[] = "/tmp/test-client-XXXXXX";
static char socket_path[256];
static pid_t broker_pid;

/* grid: one slot, Q = 5m. rigs: three named members. merge fails fast; nightly waits without a lane cap. */
static const char config[] = "[pool grid]\n"
                             "limit = 1\n"
                             "queue-timeout = 5m\n"
                             "[pool rigs]\n"
                             "members = rig-a rig-b rig-c\n"
                             "[lane merge]\n"
                             "pools = grid\n"
                             "policy = fail-fast\n"
                             "[lane nightly]\n"
                             "pools = grid\n"
                             "policy = wait\n"
                             "queue-timeout = infinity\n"
                             "[lane rig]\n"
                             "pools = rigs\n"
                             "policy = wait\n"
                             "[pool db]\n"
                             "limit = 1\n"
                             "[lane e2e]\n"
                             "pools = db\n"
                             "also = rigs:2\n"
                             "policy = wait\n";

/* ---- helpers ---- */

static void sleep_ms(int ms) {
        (void) poll(NULL, 0, ms);
}

static int broker_start(void **state) {
        char path[512];
        const char *brokerd = getenv("BROKERD");

        if (!brokerd || !*brokerd) {
                fprintf(stderr, "# $BROKERD is not set\n");
                return -1;
        }
        if (!mkdtemp(tmpdir))
                return -1;
        snprintf(socket_path, sizeof socket_path, "%s/sock", tmpdir);
        snprintf(path, sizeof path, "%s/brokerd.conf", tmpdir);
        FILE *f = fopen(path, "we");
        if (!f)
                return -1;
        fputs(config, f);
        fclose(f);

        broker_pid = fork();
        if (broker_pid < 0)
                return -1;
        if (broker_pid == 0) {
                char state_dir[512];
                snprintf(state_dir, sizeof state_dir, "%s/state", tmpdir);
                int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
                if (null >= 0 && !getenv("TEST_CLIENT_BROKER_LOG")) {
                        dup2(null, STDOUT_FILENO);
                        dup2(null, STDERR_FILENO);
                }
                execl(brokerd, brokerd, "--config", path, "--socket", socket_path, "--state-directory", state_dir,
                      (char *) NULL);
                _exit(127);
        }
        /* Ready when it accepts a connection: bounded, short waits on that condition. */
        for (int i = 0; i < 500; i++) {
                BrokerClient *c;
                if (broker_client_connect(socket_path, &c) >= 0) {
                        broker_client_free(c);
                        return 0;
                }
                if (waitpid(broker_pid, NULL, WNOHANG) == broker_pid) {
                        broker_pid = 0;
                        fprintf(stderr, "# brokerd exited at start\n");
                        return -1;
                }
                sleep_ms(10);
        }
        fprintf(stderr, "# brokerd did not accept connections within 5 s\n");
        return -1;
}

static int broker_stop(void **state) {
        if (broker_pid > 0) {
                kill(broker_pid, SIGTERM);
                waitpid(broker_pid, NULL, 0);
        }
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        return system(cmd) == 0 ? 0 : -1;
}

static BrokerClient *connect_or_fail(void) {
        BrokerClient *c = NULL;
        assert_int_equal(broker_client_connect(socket_path, &c), 0);
        assert_non_null(c);
        return c;
}

static json_t *status(void) {
        _cleanup_(broker_client_freep) BrokerClient *c = connect_or_fail();
        _cleanup_free_ char *text = NULL;
        assert_int_equal(broker_call(c, "Status", NULL, &text), 0);
        json_t *v = json_loads(text, 0, NULL);
        assert_non_null(v);
        return v;
}

/* Waits until brokerd has only the connection that asks: every other close has been processed. */
static void wait_connections_closed(void) {
        for (int i = 0; i < 500; i++) {
                _cleanup_(broker_client_freep) BrokerClient *c = connect_or_fail();
                _cleanup_free_ char *text = NULL;
                assert_int_equal(broker_call(c, "Metrics", NULL, &text), 0);
                if (strstr(text, "\\nslotbroker_connections 1\\n"))
                        return;
                sleep_ms(10);
        }
        fail_msg("brokerd still has other connections after 5 s");
}

static json_int_t pool_field(json_t *st, const char *pool, const char *field) {
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(st, "pools"), i, p)
                if (streq(json_string_value(json_object_get(p, "name")), pool))
                        return json_integer_value(json_object_get(p, field));
        fail_msg("no pool %s", pool);
        return -1;
}

/* The broker sees a closed connection a little after close(): wait until every slot is free and nobody
 * waits, so that each test starts from an idle broker. */
static int wait_idle(void **state) {
        for (int i = 0; i < 300; i++) {
                json_t *st = status();
                bool idle = json_array_size(json_object_get(st, "holders")) == 0 &&
                            json_array_size(json_object_get(st, "waiters")) == 0;
                json_decref(st);
                if (idle)
                        return 0;
                sleep_ms(10);
        }
        fprintf(stderr, "# the broker did not become idle\n");
        return -1;
}

static BrokerAcquireOptions options(const char *lane) {
        BrokerAcquireOptions o = BROKER_ACQUIRE_OPTIONS_INIT;
        o.lane = lane;
        return o;
}

/* Polls c until an event other than NONE arrives (at most ~5 s). Returns broker_client_process()'s result. */
static int next_event(BrokerClient *c, BrokerEvent *ev) {
        for (int i = 0; i < 500; i++) {
                *ev = BROKER_EVENT_INIT;
                int r = broker_client_process(c, ev);
                if (r != BROKER_EVENT_NONE)
                        return r;
                struct pollfd p = { .fd = broker_client_get_fd(c), .events = (short) broker_client_get_events(c) };
                (void) poll(&p, 1, 10);
        }
        fail_msg("no event within 5 s (client error %s)", broker_client_error_name(c) ?: "none");
        return -1;
}

/* ---- connections ---- */

static void test_connect_to_missing_socket_is_enoent(void **state) {
        char path[300];
        BrokerClient *c = (BrokerClient *) 0x1;
        snprintf(path, sizeof path, "%s/nothing-here", tmpdir);
        assert_int_equal(broker_client_connect(path, &c), -ENOENT);
        assert_ptr_equal(c, (BrokerClient *) 0x1); /* untouched on failure */
}

static void test_connect_to_stale_socket_is_econnrefused(void **state) {
        char path[100];
        BrokerClient *c = NULL;
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        snprintf(path, sizeof path, "%s/stale", tmpdir);
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(fd >= 0);
        assert_int_equal(bind(fd, (struct sockaddr *) &sa, sizeof sa), 0);
        close(fd); /* bound, never listened: nobody answers */
        assert_int_equal(broker_client_connect(path, &c), -ECONNREFUSED);
        unlink(path);
}

static void test_connect_checks_arguments(void **state) {
        BrokerClient *c = NULL;
        char long_path[200];
        memset(long_path, 'x', sizeof long_path - 1);
        long_path[sizeof long_path - 1] = '\0';
        assert_int_equal(broker_client_connect(socket_path, NULL), -EINVAL);
        assert_int_equal(broker_client_connect(long_path, &c), -ENAMETOOLONG);
        assert_null(broker_client_free(NULL));
        assert_int_equal(broker_client_get_fd(NULL), -EINVAL);
}

static void test_default_socket_path_follows_environment(void **state) {
        _cleanup_free_ char *p = NULL, *q = NULL;
        const char *saved = getenv("SLOTBROKER_SOCKET");
        _cleanup_free_ char *copy = saved ? strdup(saved) : NULL;

        setenv("SLOTBROKER_SOCKET", socket_path, 1);
        assert_int_equal(broker_client_default_socket_path(&p), 0);
        assert_string_equal(p, socket_path);

        /* NULL connects there too. */
        BrokerClient *c = NULL;
        assert_int_equal(broker_client_connect(NULL, &c), 0);
        assert_string_equal(broker_client_get_socket_path(c), socket_path);
        broker_client_free(c);

        unsetenv("SLOTBROKER_SOCKET");
        assert_int_equal(broker_client_default_socket_path(&q), 0);
        if (geteuid() == 0)
                assert_string_equal(q, "/run/brokerd/io.slotbroker");
        else
                assert_non_null(strstr(q, "/io.slotbroker"));
        if (copy)
                setenv("SLOTBROKER_SOCKET", copy, 1);
}

/* ---- acquire ---- */

static void test_acquire_grants_a_lease_with_its_fields(void **state) {
        _cleanup_(broker_client_freep) BrokerClient *c = connect_or_fail();
        _cleanup_(broker_lease_freep) BrokerLease *l = NULL;
        BrokerAcquireOptions o = options("merge");
        o.job = "https://ci.example/job/1";

        assert_int_equal(broker_acquire(c, &o, &l), BROKER_GRANTED);
        assert_int_equal(strlen(broker_lease_id(l)), 32);
        assert_string_equal(broker_lease_pool(l), "grid");
        assert_string_equal(broker_lease_lane(l), "merge");
        assert_string_equal(broker_lease_job(l), "https://ci.example/job/1");
        assert_true(broker_lease_token(l) > 0);
        assert_int_equal(broker_lease_n_slots(l), 1);
        assert_int_equal(broker_lease_slot(l, 0), 0);
        assert_int_equal(broker_lease_slot(l, 1), -ERANGE);
        assert_null(broker_lease_member(l, 0));
        assert_true(broker_lease_granted_at(l) > 0);
        assert_int_equal(broker_lease_expires_at(l), 0);
        assert_non_null(strstr(broker_lease_json(l), broker_lease_id(l)));
        /* One lease per connection. */
        assert_int_equal(broker_acquire_start(c, &o), -EBUSY);
}

static void test_tokens_increase_per_pool(void **state) {
        uint64_t last = 0;
        for (int i = 0; i < 3; i++) {
                _cleanup_(broker_client_freep) BrokerClient *c = connect_or_fail();
                _cleanup_(broker_lease_freep) BrokerLease *l = NULL;
                BrokerAcquireOptions o = options("nightly"); /* waits out the previous connection's close */
                assert_int_equal(broker_acquire(c, &o, &l), BROKER_GRANTED);
                assert_true(broker_lease_token(l) > last);
                last = broker_lease_token(l);
        }
}

static void test_busy_is_a_positive_result_with_retry_after(void **state) {
        _cleanup_(broker_client_freep) BrokerClient *holder = connect_or_fail(), *c = connect_or_fail();
        _cleanup_(broker_lease_freep) BrokerLease *l = NULL;
        BrokerLease *untouched = (BrokerLease *) 0x1;
        BrokerAcquireOptions o = options("merge");

        assert_int_equal(broker_acquire(holder, &o, &l), BROKER_GRANTED);
        assert_int_equal(broker_acquire(c, &o, &untouched), BROKER_REFUSED_BUSY);
        assert_ptr_equal(untouched, (BrokerLease *) 0x1);
        assert_true(BROKER_RESULT_IS_CONFLICT(BROKER_REFUSED_BUSY));
        assert_string_equal(broker_client_error_name(c), "io.slotbroker.Busy");
        /* Q = 5m: uniform in [1, 300]. */
        assert_in_range(broker_client_retry_after_sec(c), 1, 300);
        assert_non_null(strstr(broker_client_error_parameters(c), "\"pool\":\"grid\""));
        assert_string_equal(broker_result_to_string(BROKER_REFUSED_BUSY), "busy");
        /* After a refusal the connection is free for another request. */
        assert_int_equal(broker_acquire(c, &o, &untouched), BROKER_REFUSED_BUSY);
}

static void test_closing_the_connection_releases_the_lease(void **state) {
        BrokerClient *holder = connect_or_fail();
        _cleanup_(broker_client_freep) BrokerClient *c = connect_or_fail();
        _cleanup_(broker_lease_freep) BrokerLease *l = NULL, *l2 = NULL;
        BrokerAcquireOptions o = options("merge");

        assert_int_equal(broker_acquire(holder, &o, &l), BROKER_GRANTED);
        broker_client_free(holder);
        o = options("nightly");
        assert_int_equal(broker_acquire(c, &o, &l2), BROKER_GRANTED);
        assert_string_not_equal(broker_lease_id(l), broker_lease_id(l2));
}

static void test_wait_no_refuses_at_once(void **state) {
        _cleanup_(broker_client_freep) BrokerClient *holder = connect_or_fail(), *c = connect_or_fail();
        _cleanup_(broker_lease_freep) BrokerLease *l = NULL;
        BrokerAcquireOptions o = options("merge");
        assert_int_equal(broker_acquire(holder, &o, &l), BROKER_GRANTED);

        o = options("nightly");
        o.wait = BROKER_WAIT_NO;
        assert_int_equal(broker_acquire(c, &o, &l), BROKER_REFUSED_BUSY);
}

static void on_position(const BrokerPosition *p, void *userdata) {
        int *calls = userdata;
        assert_string_equal(p->pool, "grid");
        assert_int_equal(p->position, 1);
        assert_int_equal(p->queued, 1);
        (*calls)++;
}

static void test_queue_wait_ms_caps_the_wait_and_reports_positions(void **state) {
        _cleanup_(broker_client_freep) BrokerClient *holder = connect_or_fail(), *c = connect_or_fail();
        _cleanup_(broker_lease_freep) BrokerLease *l = NULL;
        BrokerAcquireOptions o = options("merge");
        int calls = 0;
        assert_int_equal(broker_acquire(holder, &o, &l), BROKER_GRANTED);

        o = options("nightly");
        o.queue_wait_ms = 200;
        o.on_position = on_position;
        o.userdata = &calls;
        assert_int_equal(broker_acquire(c, &o, &l), BROKER_REFUSED_TIMEOUT);
        assert_true(calls >= 1);
        assert_string_equal(broker_client_error_name(c), "io.slotbroker.QueueTimeout");
        assert_non_null(strstr(broker_client_error_parameters(c), "waitedMs"));
}

static void test_event_api_reports_queued_then_granted(void **state) {
        BrokerClient *holder = connect_or_fail();
        _cleanup_(broker_client_freep) BrokerClient *c = connect_or_fail();
        _cleanup_(broker_lease_freep) BrokerLease *l = NULL;
        BrokerAcquireOptions o = options("merge");
        BrokerEvent ev;
        assert_int_equal(broker_acquire(holder, &o, &l), BROKER_GRANTED);

        o = options("nightly");
        o.job = "waiter";
        assert_int_equal(broker_acquire_start(c, &o), 0);
        assert_int_equal(next_event(c, &ev), BROKER_EVENT_QUEUED);
        assert_int_equal(ev.type, BROKER_EVENT_QUEUED);
        assert_string_equal(ev.position.pool, "grid");
        assert_int_equal(ev.position.position, 1);
        assert_int_equal(ev.position.queued, 1);
        assert_int_equal(ev.position.budget_ms, -1); /* the nightly lane waits without a cap */

        broker_client_free(holder);
        assert_int_equal(next_event(c, &ev), BROKER_EVENT_GRANTED);
        assert_non_null(ev.lease);
        assert_string_equal(broker_lease_job(ev.lease), "waiter");
        broker_lease_free(ev.lease);
        ev = BROKER_EVENT_INIT;
        assert_int_equal(broker_client_process(c, &ev), BROKER_EVENT_NONE);
}

static void test_release_from_another_connection_ends_the_call(void **state) {
        _cleanup_(broker_client_freep) BrokerClient *holder = connect_or_fail(), *other = connect_or_fail();
        BrokerAcquireOptions o = options("merge");
        BrokerEvent ev;

        assert_int_equal(broker_acquire_start(holder, &o), 0);
        assert_int_equal(next_event(holder, &ev), BROKER_EVENT_GRANTED);
        _cleanup_(broker_lease_freep) BrokerLease *l = ev.lease;

        assert_int_equal(broker_release(other, broker_lease_id(l)), 0);
        assert_int_equal(next_event(holder, &ev), BROKER_EVENT_RELEASED);
        /* The call is over: the connection takes a new request. */
        assert_int_equal(broker_acquire_start(holder, &o), 0);
        assert_int_equal(next_event(holder, &ev), BROKER_EVENT_GRANTED);
        broker_lease_free(ev.lease);
}

static void test_fence_on_a_local_pool_is_accepted_and_sends_no_renewal(void **state) {
        _cleanup_(broker_client_freep) BrokerClient *holder = connect_or_fail(), *other = connect_or_fail();
        BrokerAcquireOptions o = options("merge");
        BrokerEvent ev;

        o.fence = true;
        assert_int_equal(broker_acquire_start(holder, &o), 0);
        assert_int_equal(next_event(holder, &ev), BROKER_EVENT_GRANTED);
        _cleanup_(broker_lease_freep) BrokerLease *l = ev.lease;
        /* The next message after the grant is the lease's end: no "held" came in between. */
        assert_int_equal(broker_release(other, broker_lease_id(l)), 0);
        assert_int_equal(next_event(holder, &ev), BROKER_EVENT_RELEASED);
}

static void test_release_start_ends_the_lease_without_blocking(void **state) {
        _cleanup_(broker_client_freep) BrokerClient *c = connect_or_fail();
        BrokerAcquireOptions o = options("merge");
        BrokerEvent ev;

        assert_int_equal(broker_release_start(c), -ESRCH); /* nothing held */
        assert_int_equal(broker_acquire_start(c, &o), 0);
        assert_int_equal(broker_release_start(c), -ESRCH); /* not granted yet */
        assert_int_equal(next_event(c, &ev), BROKER_EVENT_GRANTED);
        uint64_t token = broker_lease_token(ev.lease);
        broker_lease_free(ev.lease);

        assert_int_equal(broker_release_start(c), 0);
        assert_int_equal(broker_release_start(c), -EALREADY);
        assert_int_equal(next_event(c, &ev), BROKER_EVENT_RELEASED);
        /* The next request at once, behind the Release's reply, which the client takes unseen. The pool
         * has one slot: a grant proves the release freed it. */
        assert_int_equal(broker_acquire_start(c, &o), 0);
        assert_int_equal(next_event(c, &ev), BROKER_EVENT_GRANTED);
        assert_true(broker_lease_token(ev.lease) > token);
        broker_lease_free(ev.lease);

        /* A call right after the lease's end does not take the Release's reply for its own. */
        assert_int_equal(broker_release_start(c), 0);
        assert_int_equal(next_event(c, &ev), BROKER_EVENT_RELEASED);
        _cleanup_free_ char *reply = NULL;
        assert_int_equal(broker_call(c, "Status", NULL, &reply), 0);
        assert_non_null(strstr(reply, "\"pools\""));
        ev = BROKER_EVENT_INIT;
        assert_int_equal(broker_client_process(c, &ev), BROKER_EVENT_NONE);
        assert_null(broker_client_error_name(c));
}

static void test_release_of_unknown_lease_is_no_such_lease(void **state) {
        _cleanup_(broker_client_freep) BrokerClient *c = connect_or_fail();
        assert_int_equal(broker_release(c, "00000000000000000000000000000000"), BROKER_NO_SUCH_LEASE);
        assert_string_equal(broker_client_error_name(c), "io.slotbroker.NoSuchLease");
        assert_int_equal(broker_client_retry_after_sec(c), 0);
        assert_int_equal(broker_release(c, ""), -EINVAL);
}

static void test_unknown_lane_and_too_many_slots(void **state) {
        _cleanup_(broker_client_freep) BrokerClient *c = connect_or_fail();
        BrokerLease *l = NULL;
        BrokerAcquireOptions o = options("no-such-lane");
        assert_int_equal(broker_acquire(c, &o, &l), BROKER_NO_SUCH_LANE);
        assert_non_null(strstr(broker_client_error_parameters(c), "no-such-lane"));

        o = options("merge");
        o.slots = 2; /* grid has one */
        assert_int_equal(broker_acquire(c, &o, &l), BROKER_INVALID_PARAMETER);
        assert_null(l);
}

static void test_members_pool_names_the_members(void **state) {
        _cleanup_(broker_client_freep) BrokerClient *c = connect_or_fail();
        _cleanup_(broker_lease_freep) BrokerLease *l = NULL;
        BrokerAcquireOptions o = options("rig");
        o.slots = 2;
        assert_int_equal(broker_acquire(c, &o, &l), BROKER_GRANTED);
        assert_string_equal(broker_lease_pool(l), "rigs");
        assert_int_equal(broker_lease_n_slots(l), 2);
        for (size_t i = 0; i < 2; i++) {
                int slot = broker_lease_slot(l, i);
                assert_in_range(slot, 0, 2);
                const char *names[] = { "rig-a", "rig-b", "rig-c" };
                assert_string_equal(broker_lease_member(l, i), names[slot]);
        }
        assert_null(broker_lease_member(l, 2));
}

/* A lane with also= (SPEC §3.5): one lease, a lease object of each further pool's share. */
static void test_also_lease_carries_every_pool(void **state) {
        _cleanup_(broker_client_freep) BrokerClient *c = connect_or_fail();
        _cleanup_(broker_lease_freep) BrokerLease *l = NULL;
        BrokerAcquireOptions o = options("e2e");
        assert_int_equal(broker_acquire(c, &o, &l), BROKER_GRANTED);
        assert_string_equal(broker_lease_pool(l), "db");
        assert_int_equal(broker_lease_n_also(l), 1);
        const BrokerLease *a = broker_lease_also(l, 0);
        assert_non_null(a);
        assert_null(broker_lease_also(l, 1));
        assert_string_equal(broker_lease_pool(a), "rigs");
        assert_string_equal(broker_lease_id(a), broker_lease_id(l));
        assert_string_equal(broker_lease_lane(a), "e2e");
        assert_true(broker_lease_token(a) > 0);
        assert_int_equal(broker_lease_n_slots(a), 2);
        assert_non_null(broker_lease_member(a, 0));
        assert_non_null(broker_lease_member(a, 1));
        assert_int_equal(broker_lease_n_also(a), 0);
        assert_int_equal(broker_lease_n_also(NULL), 0);
}

static void test_detached_lease_needs_max_hold_and_frees_the_connection(void **state) {
        _cleanup_(broker_client_freep) BrokerClient *c = connect_or_fail();
        _cleanup_(broker_lease_freep) BrokerLease *l = NULL;
        _cleanup_free_ char *text = NULL;
        BrokerAcquireOptions o = options("merge");
        o.detach = true;
        assert_int_equal(broker_acquire_start(c, &o), -EINVAL);

        o.max_hold_ms = 60000;
        assert_int_equal(broker_acquire(c, &o, &l), BROKER_GRANTED);
        assert_true(broker_lease_expires_at(l) > broker_lease_granted_at(l));
        /* Detached: the connection is idle at once, and calls go over it. */
        assert_int_equal(broker_call(c, "io.slotbroker.Status", "{}", &text), 0);
        assert_non_null(strstr(text, broker_lease_id(l)));
        broker_client_free(TAKE_PTR(c));

        /* It outlives its connection until released. */
        json_t *st = status();
        assert_int_equal(pool_field(st, "grid", "inUse"), 1);
        json_decref(st);
        _cleanup_(broker_client_freep) BrokerClient *other = connect_or_fail();
        assert_int_equal(broker_release(other, broker_lease_id(l)), 0);
        st = status();
        assert_int_equal(pool_field(st, "grid", "inUse"), 0);
        json_decref(st);
}

static void test_options_are_checked(void **state) {
        _cleanup_(broker_client_freep) BrokerClient *c = connect_or_fail();
        struct {
                BrokerAcquireOptions o;
                uint64_t future;
        } larger = { .o = options("merge") };

        BrokerAcquireOptions o = options(NULL);
        assert_int_equal(broker_acquire_start(c, &o), -EINVAL);
        o = options("merge");
        o.size = offsetof(BrokerAcquireOptions, pidfd) - 1; /* smaller than the first layout */
        assert_int_equal(broker_acquire_start(c, &o), -EINVAL);
        o = options("merge");
        o.pid = getpid();
        o.pidfd = STDERR_FILENO;
        assert_int_equal(broker_acquire_start(c, &o), -EINVAL); /* one command, named once */
        o = options("merge");
        o.pidfd = 1000000;
        assert_int_equal(broker_acquire_start(c, &o), -EBADF);
        o = options("merge");
        o.queue_wait_ms = (uint64_t) INT32_MAX + 1;
        assert_int_equal(broker_acquire_start(c, &o), -EINVAL);
        o = options("merge");
        o.job = "\xff\xfe not UTF-8";
        assert_int_equal(broker_acquire_start(c, &o), -EINVAL);

        /* A caller built against a newer header: unknown fields must be zero. */
        larger.o.size = sizeof larger;
        larger.future = 1;
        assert_int_equal(broker_acquire_start(c, &larger.o), -E2BIG);
        larger.future = 0;
        assert_int_equal(broker_acquire_start(c, &larger.o), 0);

        BrokerEvent small = { .size = 4 };
        assert_int_equal(broker_client_process(c, &small), -EINVAL);
}

/* A child that waits for *ret_go to close, then exits 0. */
static pid_t held_child(int *ret_go) {
        int p[2];
        assert_int_equal(pipe2(p, O_CLOEXEC), 0);
        pid_t child = fork();
        assert_true(child >= 0);
        if (child == 0) {
                char b;
                close(p[1]);
                _exit(read(p[0], &b, 1) >= 0 ? 0 : 1);
        }
        close(p[0]);
        *ret_go = p[1];
        return child;
}

static void test_attached_pid_is_reported_and_holds_the_slot(void **state) {
        BrokerClient *c;
        _cleanup_(broker_lease_freep) BrokerLease *l = NULL;
        int go;
        pid_t child = held_child(&go);
        /* Connected after the fork: a copy of the connection in the child would hold the lease too. */
        c = connect_or_fail();

        BrokerAcquireOptions o = options("merge");
        o.pid = child;
        assert_int_equal(broker_acquire(c, &o, &l), BROKER_GRANTED);
        assert_non_null(strstr(broker_lease_json(l), "\"commandPid\""));

        /* The connection goes; the command still runs: the slot stays (SPEC §3.4). */
        broker_client_free(c);
        wait_connections_closed();
        json_t *st = status();
        assert_int_equal(pool_field(st, "grid", "inUse"), 1);
        json_decref(st);

        close(go); /* the command ends */
        assert_int_equal(waitpid(child, NULL, 0), child);
        assert_int_equal(wait_idle(NULL), 0);
}

static void test_pid_of_a_stranger_is_invalid(void **state) {
        _cleanup_(broker_client_freep) BrokerClient *c = connect_or_fail();
        BrokerLease *l = NULL;
        BrokerAcquireOptions o = options("merge");
        o.pid = 1; /* not us, not our child */
        assert_int_equal(broker_acquire(c, &o, &l), BROKER_INVALID_PARAMETER);
        assert_non_null(strstr(broker_client_error_parameters(c), "\"pid\""));
}

/* ---- the command as a pidfd (SCM_RIGHTS) ---- */

/* brokerd's pidfds: one per attached command it watches. */
static int broker_pidfds(void) {
        char dir[64], path[512], target[64];
        int n = 0;
        snprintf(dir, sizeof dir, "/proc/%d/fd", (int) broker_pid);
        DIR *d = opendir(dir);
        assert_non_null(d);
        for (struct dirent *e; (e = readdir(d));) {
                snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
                ssize_t k = readlink(path, target, sizeof target - 1);
                if (k > 0) {
                        target[k] = 0;
                        n += streq(target, "anon_inode:[pidfd]");
                }
        }
        closedir(d);
        return n;
}

static void wait_broker_pidfds(int n) {
        for (int i = 0; i < 500 && broker_pidfds() != n; i++)
                sleep_ms(10);
        assert_int_equal(broker_pidfds(), n);
}

static json_int_t lease_command_pid(const BrokerLease *l) {
        json_t *v = json_loads(broker_lease_json(l), 0, NULL);
        assert_non_null(v);
        json_int_t pid = json_integer_value(json_object_get(v, "commandPid"));
        json_decref(v);
        return pid;
}

static void test_attached_pidfd_holds_the_slot_and_is_let_go(void **state) {
        _cleanup_(broker_lease_freep) BrokerLease *l = NULL;
        int go;
        pid_t child = held_child(&go);
        _cleanup_close_ int pidfd = pidfd_open(child, 0);
        assert_true(pidfd >= 0);
        int before = broker_pidfds();
        BrokerClient *c = connect_or_fail();

        BrokerAcquireOptions o = options("merge");
        o.pidfd = pidfd;
        assert_int_equal(broker_acquire(c, &o, &l), BROKER_GRANTED);
        assert_int_equal(lease_command_pid(l), child);
        assert_int_equal(broker_pidfds(), before + 1); /* kept: the broker watches the command with it */

        broker_client_free(c);
        wait_connections_closed();
        json_t *st = status();
        assert_int_equal(pool_field(st, "grid", "inUse"), 1); /* the command still runs (SPEC §3.4) */
        json_decref(st);

        close(go);
        assert_int_equal(waitpid(child, NULL, 0), child);
        assert_int_equal(wait_idle(NULL), 0);
        wait_broker_pidfds(before);
        /* Ours stays ours. */
        assert_int_equal(fcntl(pidfd, F_GETFD) >= 0, true);
}

static void test_pidfd_of_a_stranger_or_of_the_dead_is_invalid(void **state) {
        _cleanup_(broker_client_freep) BrokerClient *c = connect_or_fail();
        BrokerLease *l = NULL;
        int before = broker_pidfds();

        _cleanup_close_ int init = pidfd_open(1, 0); /* not us, not our child */
        assert_true(init >= 0);
        BrokerAcquireOptions o = options("merge");
        o.pidfd = init;
        assert_int_equal(broker_acquire(c, &o, &l), BROKER_INVALID_PARAMETER);
        assert_non_null(strstr(broker_client_error_parameters(c), "\"pidfd\""));

        pid_t child = fork();
        assert_true(child >= 0);
        if (child == 0)
                _exit(0);
        _cleanup_close_ int dead = pidfd_open(child, 0);
        assert_true(dead >= 0);
        assert_int_equal(waitpid(child, NULL, 0), child); /* reaped: its fdinfo says Pid: -1 */
        o.pidfd = dead;
        assert_int_equal(broker_acquire(c, &o, &l), BROKER_INVALID_PARAMETER);
        assert_non_null(strstr(broker_client_error_parameters(c), "\"pidfd\""));

        /* Not a pidfd at all. */
        o.pidfd = STDERR_FILENO;
        assert_int_equal(broker_acquire(c, &o, &l), BROKER_INVALID_PARAMETER);
        /* The refused pidfds are closed on brokerd's closer thread, after the replies (closer.h). */
        wait_broker_pidfds(before);
}

static void test_first_layout_of_the_options_passes_no_fd(void **state) {
        _cleanup_(broker_client_freep) BrokerClient *c = connect_or_fail();
        _cleanup_(broker_lease_freep) BrokerLease *l = NULL;
        /* A caller built before pidfd existed: what lies after its struct is not a pidfd, even when it is 0. */
        BrokerAcquireOptions o = options("merge");
        o.size = offsetof(BrokerAcquireOptions, pidfd);
        o.pidfd = 0;
        assert_int_equal(broker_acquire(c, &o, &l), BROKER_GRANTED);
        assert_null(strstr(broker_lease_json(l), "\"commandPid\""));
}

/* A raw connection to brokerd, and calls sent on it with fds, as any Varlink client may send them. */
static int raw_connect(void) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        assert_true(strlen(socket_path) < sizeof sa.sun_path);
        memcpy(sa.sun_path, socket_path, strlen(socket_path));
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(fd >= 0);
        assert_int_equal(connect(fd, (struct sockaddr *) &sa, sizeof sa), 0);
        return fd;
}

/* The next message's text (up to its NUL) in buf, or "" at EOF. */
static void raw_recv(int sock, char *buf, size_t size) {
        size_t n = 0;
        while (n < size - 1) {
                struct pollfd p = { .fd = sock, .events = POLLIN };
                assert_int_equal(poll(&p, 1, 5000), 1);
                ssize_t k = recv(sock, buf + n, 1, 0);
                assert_true(k >= 0);
                if (k == 0 || buf[n] == 0)
                        break;
                n++;
        }
        buf[n] = 0;
}

/* Whether a copy of the pipe's write end is still open anywhere (its read end is O_NONBLOCK). */
/* Whether the pipe's write end is still open somewhere 5 s on: brokerd closes what clients passed on a
 * thread of its own (a close may block), so the last close comes a moment after the reply. */
static bool pipe_writer_open(int read_fd) {
        struct pollfd pfd = { .fd = read_fd, .events = POLLIN };
        if (poll(&pfd, 1, 5000) <= 0)
                return true;
        char b;
        return read(read_fd, &b, 1) < 0 && errno == EAGAIN;
}

static void test_broker_closes_the_fds_no_call_uses(void **state) {
        char reply[4096];
        int p[2];
        assert_int_equal(pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
        _cleanup_close_ int sock = raw_connect();

        /* A call that takes no fd: they are closed once it is answered. */
        send_with_fds(sock, "{\"method\":\"io.slotbroker.Status\"}", p[1], 2);
        raw_recv(sock, reply, sizeof reply);
        assert_non_null(strstr(reply, "\"pools\""));
        /* An Acquire naming an fd it was not given: refused, and the one it was given is closed. */
        send_with_fds(sock, "{\"method\":\"io.slotbroker.Acquire\",\"parameters\":{\"lane\":\"merge\",\"pidfd\":1}}", p[1], 1);
        raw_recv(sock, reply, sizeof reply);
        assert_non_null(strstr(reply, "InvalidParameter"));
        assert_non_null(strstr(reply, "\"pidfd\""));
        /* More fds than any call may carry: the connection goes, and they with it. */
        send_with_fds(sock, "{\"method\":\"io.slotbroker.Status\"}", p[1], 9);
        raw_recv(sock, reply, sizeof reply);
        assert_string_equal(reply, "");

        close(p[1]);
        assert_false(pipe_writer_open(p[0]));
        close(p[0]);
}

/* ---- other calls ---- */

static void test_call_returns_the_reply_parameters(void **state) {
        _cleanup_(broker_client_freep) BrokerClient *c = connect_or_fail();
        _cleanup_free_ char *text = NULL, *info = NULL;
        assert_int_equal(broker_call(c, "Status", NULL, &text), 0);
        json_t *v = json_loads(text, 0, NULL);
        assert_non_null(v);
        assert_true(json_is_array(json_object_get(v, "pools")));
        json_decref(v);
        assert_int_equal(broker_call(c, "org.varlink.service.GetInfo", "{}", &info), 0);
        assert_non_null(strstr(info, "io.slotbroker"));
        assert_int_equal(broker_call(c, "Status", NULL, NULL), 0);
}

static void test_call_reports_errors_as_positive_codes(void **state) {
        _cleanup_(broker_client_freep) BrokerClient *c = connect_or_fail();
        char *text = (char *) 0x1;
        assert_int_equal(broker_call(c, "NoSuchMethod", NULL, &text), BROKER_METHOD_NOT_FOUND);
        assert_ptr_equal(text, (char *) 0x1);
        assert_string_equal(broker_client_error_name(c), "org.varlink.service.MethodNotFound");
        assert_int_equal(broker_call(c, "Drain", "{\"pool\":\"nope\",\"on\":true}", NULL), BROKER_NO_SUCH_POOL);
        assert_string_equal(broker_client_error_name(c), "io.slotbroker.NoSuchPool");
        assert_int_equal(broker_call(c, "Drain", "{\"pool\":7}", NULL), BROKER_INVALID_PARAMETER);
        assert_int_equal(broker_call(c, "Status", "[1]", NULL), -EINVAL);
        assert_int_equal(broker_call(c, "bad name!", NULL, NULL), -EINVAL);
        /* Errors do not spoil the connection. */
        assert_int_equal(broker_call(c, "Status", NULL, NULL), 0);
}

static void test_call_while_holding_uses_a_new_connection(void **state) {
        _cleanup_(broker_client_freep) BrokerClient *c = connect_or_fail();
        _cleanup_(broker_lease_freep) BrokerLease *l = NULL;
        _cleanup_free_ char *text = NULL;
        BrokerAcquireOptions o = options("merge");
        assert_int_equal(broker_acquire(c, &o, &l), BROKER_GRANTED);
        /* On the held connection the call would wait for the lease to end. */
        assert_int_equal(broker_call(c, "Status", NULL, &text), 0);
        assert_non_null(strstr(text, broker_lease_id(l)));
        assert_int_equal(broker_release(c, broker_lease_id(l)), 0);
        BrokerEvent ev;
        assert_int_equal(next_event(c, &ev), BROKER_EVENT_RELEASED);
}

static void test_drain_refuses_waiters_as_unavailable(void **state) {
        _cleanup_(broker_client_freep) BrokerClient *holder = connect_or_fail(), *c = connect_or_fail(),
                                                    *admin = connect_or_fail();
        _cleanup_(broker_lease_freep) BrokerLease *l = NULL;
        BrokerAcquireOptions o = options("merge");
        BrokerEvent ev;
        assert_int_equal(broker_acquire(holder, &o, &l), BROKER_GRANTED);
        o = options("nightly");
        assert_int_equal(broker_acquire_start(c, &o), 0);
        assert_int_equal(next_event(c, &ev), BROKER_EVENT_QUEUED);

        assert_int_equal(broker_call(admin, "Drain", "{\"pool\":\"grid\",\"on\":true}", NULL), 0);
        assert_int_equal(next_event(c, &ev), BROKER_EVENT_REFUSED);
        assert_int_equal(ev.refusal, BROKER_REFUSED_UNAVAILABLE);
        assert_string_equal(ev.pool, "grid");
        assert_non_null(ev.reason);
        assert_true(ev.retry_after_sec >= 1);
        assert_int_equal(broker_call(admin, "Drain", "{\"pool\":\"grid\",\"on\":false}", NULL), 0);
}

/* ---- a scripted server: what a healthy broker never sends ---- */

typedef struct Fake {
        int listen_fd;
        int fd;
        char path[100];
} Fake;

static void fake_start(Fake *f, BrokerClient **ret) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        snprintf(f->path, sizeof f->path, "%s/fake", tmpdir);
        unlink(f->path);
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s", f->path);
        f->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(f->listen_fd >= 0);
        assert_int_equal(bind(f->listen_fd, (struct sockaddr *) &sa, sizeof sa), 0);
        assert_int_equal(listen(f->listen_fd, 4), 0);
        assert_int_equal(broker_client_connect(f->path, ret), 0);
        f->fd = accept4(f->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        assert_true(f->fd >= 0);
}

static void fake_send(Fake *f, const char *msg) {
        size_t n = strlen(msg) + 1; /* with the NUL */
        assert_int_equal(send(f->fd, msg, n, MSG_NOSIGNAL), (ssize_t) n);
}

static void fake_done(Fake *f) {
        safe_close(f->fd);
        safe_close(f->listen_fd);
        unlink(f->path);
}

static void test_broker_going_away_is_econnreset(void **state) {
        Fake f;
        _cleanup_(broker_client_freep) BrokerClient *c = NULL;
        BrokerAcquireOptions o = options("merge");
        BrokerEvent ev;
        fake_start(&f, &c);
        assert_int_equal(broker_acquire_start(c, &o), 0);
        fake_send(&f, "{\"parameters\":{\"state\":\"queued\",\"pool\":\"p\",\"position\":2,\"queued\":3,\"budgetMs\":5000},"
                      "\"continues\":true}");
        f.fd = safe_close(f.fd);
        assert_int_equal(next_event(c, &ev), BROKER_EVENT_QUEUED);
        assert_int_equal(ev.position.budget_ms, 5000);
        assert_int_equal(next_event(c, &ev), -ECONNRESET);
        assert_int_equal(broker_client_process(c, &ev), -ENOTCONN);
        assert_int_equal(broker_client_get_fd(c), -ENOTCONN);
        fake_done(&f);
}

static void test_protocol_violations_are_ebadmsg(void **state) {
        static const char *const bad[] = {
                "not json",
                "[1,2]",
                "{\"parameters\":{\"state\":\"granted\",\"lease\":{\"id\":\"x\"}},\"continues\":true}", /* a lease without slots */
                "{\"parameters\":{\"state\":\"released\"}}",                                             /* nothing granted */
                "{\"parameters\":{\"state\":\"queued\"}}",                                               /* queued, yet final */
                "{\"parameters\":{\"state\":\"dancing\"},\"continues\":true}",
                "{\"error\":\"io.slotbroker.Busy\",\"continues\":true}",
                /* an all-or-nothing lease's shares that do not say what they hold */
                "{\"parameters\":{\"state\":\"granted\",\"lease\":{\"id\":\"x\",\"token\":1,\"pool\":\"p\",\"slots\":[0],"
                "\"lane\":\"l\",\"also\":{}}},\"continues\":true}",
                "{\"parameters\":{\"state\":\"granted\",\"lease\":{\"id\":\"x\",\"token\":1,\"pool\":\"p\",\"slots\":[0],"
                "\"lane\":\"l\",\"also\":[{\"pool\":\"q\",\"token\":2}]}},\"continues\":true}",
                "{\"parameters\":{\"state\":\"granted\",\"lease\":{\"id\":\"x\",\"token\":1,\"pool\":\"p\",\"slots\":[0],"
                "\"lane\":\"l\",\"also\":[{\"pool\":\"q\",\"token\":2,\"slots\":[0],\"members\":[\"a\",\"b\"]}]}},\"continues\":true}",
                "{\"parameters\":{\"state\":\"granted\",\"lease\":{\"id\":\"x\",\"token\":1,\"pool\":\"p\",\"slots\":[0],"
                "\"lane\":\"l\",\"also\":[7]}},\"continues\":true}",
        };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                Fake f;
                _cleanup_(broker_client_freep) BrokerClient *c = NULL;
                BrokerAcquireOptions o = options("merge");
                BrokerEvent ev;
                fake_start(&f, &c);
                assert_int_equal(broker_acquire_start(c, &o), 0);
                fake_send(&f, bad[i]);
                int r = next_event(c, &ev);
                if (r != -EBADMSG)
                        fail_msg("message %zu: %d, not -EBADMSG", i, r);
                fake_done(&f);
        }
}

/* Processes c until the fake has something to read, asserting that no event came meanwhile. */
static void process_until_fake_readable(BrokerClient *c, Fake *f) {
        for (int i = 0; i < 500; i++) {
                BrokerEvent ev = BROKER_EVENT_INIT;
                assert_int_equal(broker_client_process(c, &ev), BROKER_EVENT_NONE);
                struct pollfd p = { .fd = f->fd, .events = POLLIN };
                if (poll(&p, 1, 10) > 0)
                        return;
        }
        fail_msg("the client sent nothing within 5 s");
}

static void test_broker_without_fence_is_asked_again_without_it(void **state) {
        Fake f;
        _cleanup_(broker_client_freep) BrokerClient *c = NULL;
        BrokerAcquireOptions o = options("merge");
        BrokerEvent ev;
        char buf[4096];

        fake_start(&f, &c);
        o.fence = true;
        assert_int_equal(broker_acquire_start(c, &o), 0);
        raw_recv(f.fd, buf, sizeof buf);
        assert_non_null(strstr(buf, "\"fence\":true"));
        /* What an older brokerd's json_dispatch() answers for a key it does not know. */
        fake_send(&f, "{\"error\":\"org.varlink.service.InvalidParameter\",\"parameters\":{\"parameter\":\"fence\"}}");
        process_until_fake_readable(c, &f);
        raw_recv(f.fd, buf, sizeof buf);
        assert_non_null(strstr(buf, "io.slotbroker.Acquire"));
        assert_null(strstr(buf, "fence"));
        assert_non_null(strstr(buf, "\"lane\":\"merge\""));
        fake_send(&f, "{\"parameters\":{\"state\":\"granted\",\"lease\":{\"id\":\"L1\",\"pool\":\"grid\","
                      "\"lane\":\"merge\",\"token\":1,\"slots\":[0],\"grantedAt\":1}},\"continues\":true}");
        assert_int_equal(next_event(c, &ev), BROKER_EVENT_GRANTED);
        broker_lease_free(ev.lease);
        assert_null(broker_client_error_name(c));
        fake_done(&f);
}

/* The parameters of the call the fake read, as a tree. */
static json_t *fake_recv_call(Fake *f, const char *method) {
        char buf[4096];
        raw_recv(f->fd, buf, sizeof buf);
        json_t *m = json_loads(buf, JSON_REJECT_DUPLICATES, NULL);
        assert_non_null(m);
        assert_string_equal(json_string_value(json_object_get(m, "method")), method);
        json_t *p = json_incref(json_object_get(m, "parameters"));
        json_decref(m);
        assert_non_null(p);
        return p;
}

static void assert_json_is(json_t *got, const char *expected) {
        _cleanup_(json_decrefp) json_t *e = json_loads(expected, 0, NULL);
        assert_non_null(e);
        if (!json_equal(got, e)) {
                _cleanup_free_ char *text = json_dumps(got, JSON_SORT_KEYS);
                fail_msg("sent %s, not %s", text, expected);
        }
}

/* Every option goes as the broker's Acquire and Reserve take it (SPEC §5), and a string that is not UTF-8
 * is the caller's error, with nothing sent. */
static void test_acquire_sends_every_option(void **state) {
        Fake f;
        _cleanup_(broker_client_freep) BrokerClient *c = NULL;
        const char *const labels[] = { "gpu", "arch=x86", NULL };
        BrokerAcquireOptions o = options("merge");

        fake_start(&f, &c);
        o.slots = 3, o.wait = BROKER_WAIT_NO, o.queue_wait_ms = 2500, o.job = "https://ci/job/\"1\"\n";
        o.pid = 4242, o.reclaim = "L0", o.detach = true, o.max_hold_ms = 60000, o.labels = labels;
        o.member = "rig-\xc3\xa9";
        assert_int_equal(broker_acquire_start(c, &o), 0);
        _cleanup_(json_decrefp) json_t *p = fake_recv_call(&f, "io.slotbroker.Acquire");
        assert_json_is(p, "{\"lane\":\"merge\",\"slots\":3,\"wait\":false,\"queueWaitMs\":2500,"
                          "\"job\":\"https://ci/job/\\\"1\\\"\\n\",\"pid\":4242,\"reclaim\":\"L0\",\"detach\":true,"
                          "\"maxHoldMs\":60000,\"labels\":[\"gpu\",\"arch=x86\"],\"member\":\"rig-\xc3\xa9\"}");
        fake_done(&f);
        c = broker_client_free(c);

        /* The defaults: the lane alone; wait=true said as such. */
        fake_start(&f, &c);
        o = options("nightly");
        o.wait = BROKER_WAIT_YES;
        assert_int_equal(broker_acquire_start(c, &o), 0);
        json_decref(p);
        p = fake_recv_call(&f, "io.slotbroker.Acquire");
        assert_json_is(p, "{\"lane\":\"nightly\",\"wait\":true}");
        fake_done(&f);
        c = broker_client_free(c);

        fake_start(&f, &c);
        o = options("merge");
        o.reserve_pool = "grid", o.reason = "firmware", o.max_hold_ms = 90000, o.member = "rig-1", o.labels = labels;
        assert_int_equal(broker_acquire_start(c, &o), 0);
        json_decref(p);
        p = fake_recv_call(&f, "io.slotbroker.Reserve");
        assert_json_is(p, "{\"pool\":\"grid\",\"forMs\":90000,\"reason\":\"firmware\","
                          "\"labels\":[\"gpu\",\"arch=x86\"],\"member\":\"rig-1\"}");
        fake_done(&f);
        c = broker_client_free(c);

        /* Not UTF-8, in each string an Acquire sends: -EINVAL, and the connection is still idle. */
        fake_start(&f, &c);
        static const char bad[] = "x\xff";
        const char *const bad_labels[] = { "gpu", bad, NULL };
        for (int i = 0; i < 6; i++) {
                BrokerAcquireOptions b = options(i == 0 ? bad : "merge");
                if (i == 1)
                        b.job = bad;
                if (i == 2)
                        b.reclaim = bad;
                if (i == 3)
                        b.member = bad;
                if (i == 4)
                        b.labels = bad_labels;
                if (i == 5)
                        b.reserve_pool = "grid", b.reason = bad, b.max_hold_ms = 1;
                assert_int_equal(broker_acquire_start(c, &b), -EINVAL);
        }
        o = options("merge");
        assert_int_equal(broker_acquire_start(c, &o), 0);
        json_decref(p);
        p = fake_recv_call(&f, "io.slotbroker.Acquire");
        assert_json_is(p, "{\"lane\":\"merge\"}");
        fake_done(&f);
}

static void test_other_invalid_parameter_is_a_refusal_even_with_fence(void **state) {
        Fake f;
        _cleanup_(broker_client_freep) BrokerClient *c = NULL;
        BrokerAcquireOptions o = options("merge");
        BrokerEvent ev;

        fake_start(&f, &c);
        o.fence = true;
        assert_int_equal(broker_acquire_start(c, &o), 0);
        fake_send(&f, "{\"error\":\"org.varlink.service.InvalidParameter\",\"parameters\":{\"parameter\":\"slots\"}}");
        assert_int_equal(next_event(c, &ev), BROKER_EVENT_REFUSED);
        assert_int_equal(ev.refusal, BROKER_INVALID_PARAMETER);
        fake_done(&f);
}

static void test_held_renewal_is_an_event_with_its_fence(void **state) {
        Fake f;
        _cleanup_(broker_client_freep) BrokerClient *c = NULL;
        BrokerAcquireOptions o = options("merge");
        BrokerEvent ev;

        fake_start(&f, &c);
        o.fence = true;
        assert_int_equal(broker_acquire_start(c, &o), 0);
        fake_send(&f, "{\"parameters\":{\"state\":\"granted\",\"lease\":{\"id\":\"L1\",\"pool\":\"grid\","
                      "\"lane\":\"merge\",\"token\":1,\"slots\":[0],\"grantedAt\":1}},\"continues\":true}");
        assert_int_equal(next_event(c, &ev), BROKER_EVENT_GRANTED);
        broker_lease_free(ev.lease);
        fake_send(&f, "{\"parameters\":{\"state\":\"held\",\"fenceInMs\":1500},\"continues\":true}");
        assert_int_equal(next_event(c, &ev), BROKER_EVENT_HELD);
        assert_int_equal(ev.fence_in_ms, 1500);
        assert_true(ev.kill_within_ms == UINT64_MAX); /* not said */
        assert_string_equal(broker_event_type_to_string(ev.type), "held");
        fake_send(&f, "{\"parameters\":{\"state\":\"held\",\"fenceInMs\":1400,\"killWithinMs\":1000},"
                      "\"continues\":true}");
        assert_int_equal(next_event(c, &ev), BROKER_EVENT_HELD);
        assert_int_equal(ev.fence_in_ms, 1400);
        assert_int_equal(ev.kill_within_ms, 1000);
        /* A renewal is no end: the lease's end still comes. */
        fake_send(&f, "{\"parameters\":{\"state\":\"revoked\"}}");
        assert_int_equal(next_event(c, &ev), BROKER_EVENT_REVOKED);
        fake_done(&f);
}

/* The status goes with the Release at once, and the call returns before any answer: slotctl run must not
 * wait on a broker that does not answer once its command has exited. */
static void test_release_exit_start_tells_the_status_without_blocking(void **state) {
        static const char granted[] = "{\"parameters\":{\"state\":\"granted\",\"lease\":{\"id\":\"L1\",\"pool\":\"grid\","
                                      "\"lane\":\"merge\",\"token\":1,\"slots\":[0],\"grantedAt\":1}},\"continues\":true}";
        for (int older = 0; older <= 1; older++) {
                Fake f;
                _cleanup_(broker_client_freep) BrokerClient *c = NULL;
                BrokerAcquireOptions o = options("merge");
                BrokerEvent ev;

                fake_start(&f, &c);
                assert_int_equal(broker_release_exit_start(c, 3), -ESRCH); /* nothing held */
                assert_int_equal(broker_acquire_start(c, &o), 0);
                json_decref(fake_recv_call(&f, "io.slotbroker.Acquire"));
                fake_send(&f, granted);
                assert_int_equal(next_event(c, &ev), BROKER_EVENT_GRANTED);
                broker_lease_free(ev.lease);
                assert_int_equal(broker_release_exit_start(c, 256), -EINVAL);
                assert_int_equal(broker_release_exit_start(c, -1), -EINVAL);

                assert_int_equal(broker_release_exit_start(c, 3), 0); /* nothing answered yet */
                assert_int_equal(broker_release_exit_start(c, 3), -EALREADY);
                _cleanup_(json_decrefp) json_t *sent = fake_recv_call(&f, "io.slotbroker.Release");
                assert_json_is(sent, "{\"lease\":\"L1\",\"exitStatus\":3}");
                ev = BROKER_EVENT_INIT;
                assert_int_equal(broker_client_process(c, &ev), BROKER_EVENT_NONE);
                if (!older) {
                        fake_send(&f, "{\"parameters\":{\"state\":\"released\"}}");
                        fake_send(&f, "{\"parameters\":{}}");
                        assert_int_equal(next_event(c, &ev), BROKER_EVENT_RELEASED);
                        assert_null(broker_client_error_name(c));
                } else {
                        /* What an older brokerd answers for a key it does not know: the lease is still held. */
                        fake_send(&f, "{\"error\":\"org.varlink.service.InvalidParameter\","
                                      "\"parameters\":{\"parameter\":\"exitStatus\"}}");
                        for (int i = 0; i < 500 && !broker_client_error_name(c); i++) {
                                ev = BROKER_EVENT_INIT;
                                assert_int_equal(broker_client_process(c, &ev), BROKER_EVENT_NONE);
                                struct pollfd p = { .fd = broker_client_get_fd(c), .events = POLLIN };
                                (void) poll(&p, 1, 10);
                        }
                        assert_string_equal(broker_client_error_name(c), "org.varlink.service.InvalidParameter");
                        assert_int_equal(broker_release_start(c), 0); /* the lease can still be let go */
                }
                fake_done(&f);
        }
}

static void test_held_without_its_fence_is_ebadmsg(void **state) {
        Fake f;
        _cleanup_(broker_client_freep) BrokerClient *c = NULL;
        BrokerAcquireOptions o = options("merge");
        BrokerEvent ev;

        fake_start(&f, &c);
        o.fence = true;
        assert_int_equal(broker_acquire_start(c, &o), 0);
        fake_send(&f, "{\"parameters\":{\"state\":\"granted\",\"lease\":{\"id\":\"L1\",\"pool\":\"grid\","
                      "\"lane\":\"merge\",\"token\":1,\"slots\":[0],\"grantedAt\":1}},\"continues\":true}");
        assert_int_equal(next_event(c, &ev), BROKER_EVENT_GRANTED);
        broker_lease_free(ev.lease);
        fake_send(&f, "{\"parameters\":{\"state\":\"held\"},\"continues\":true}");
        assert_int_equal(next_event(c, &ev), -EBADMSG);
        fake_done(&f);
}

static void test_unsolicited_reply_is_ebadmsg(void **state) {
        Fake f;
        _cleanup_(broker_client_freep) BrokerClient *c = NULL;
        BrokerEvent ev = BROKER_EVENT_INIT;
        fake_start(&f, &c);
        fake_send(&f, "{\"parameters\":{}}");
        assert_int_equal(next_event(c, &ev), -EBADMSG);
        fake_done(&f);
}

static void test_refusal_from_unknown_error_is_error_other(void **state) {
        Fake f;
        _cleanup_(broker_client_freep) BrokerClient *c = NULL;
        BrokerAcquireOptions o = options("merge");
        BrokerEvent ev;
        fake_start(&f, &c);
        assert_int_equal(broker_acquire_start(c, &o), 0);
        fake_send(&f, "{\"error\":\"org.example.Strange\",\"parameters\":{\"retryAfterSec\":7}}");
        assert_int_equal(next_event(c, &ev), BROKER_EVENT_REFUSED);
        assert_int_equal(ev.refusal, BROKER_ERROR_OTHER);
        assert_int_equal(ev.retry_after_sec, 7);
        assert_string_equal(broker_client_error_name(c), "org.example.Strange");
        fake_done(&f);
}

int main(int argc, char *argv[]) {
        /* Tests that hold slots start from an idle broker (wait_idle). */
#define T(name) cmocka_unit_test_setup(name, wait_idle)
        /* "test-client pidfd": the tests that open pidfds, a test of their own since valgrind (3.19) has no
         * pidfd_open(); where the kernel has none either, all of them are skipped. */
        const struct CMUnitTest pidfd_tests[] = {
                T(test_attached_pidfd_holds_the_slot_and_is_let_go),
                T(test_pidfd_of_a_stranger_or_of_the_dead_is_invalid),
        };
        if (argc > 1 && streq(argv[1], "pidfd")) {
                int fd = pidfd_open(getpid(), 0);
                if (fd < 0 && errno == ENOSYS) {
                        printf("1..0 # SKIP no pidfd_open() here\n");
                        return 0;
                }
                safe_close(fd);
                return cmocka_run_group_tests(pidfd_tests, broker_start, broker_stop);
        }
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_connect_to_missing_socket_is_enoent),
                cmocka_unit_test(test_connect_to_stale_socket_is_econnrefused),
                cmocka_unit_test(test_connect_checks_arguments),
                cmocka_unit_test(test_default_socket_path_follows_environment),
                T(test_acquire_grants_a_lease_with_its_fields),
                T(test_tokens_increase_per_pool),
                T(test_busy_is_a_positive_result_with_retry_after),
                T(test_closing_the_connection_releases_the_lease),
                T(test_wait_no_refuses_at_once),
                T(test_queue_wait_ms_caps_the_wait_and_reports_positions),
                T(test_event_api_reports_queued_then_granted),
                T(test_release_from_another_connection_ends_the_call),
                T(test_fence_on_a_local_pool_is_accepted_and_sends_no_renewal),
                T(test_release_start_ends_the_lease_without_blocking),
                T(test_release_of_unknown_lease_is_no_such_lease),
                T(test_unknown_lane_and_too_many_slots),
                T(test_members_pool_names_the_members),
                T(test_also_lease_carries_every_pool),
                T(test_detached_lease_needs_max_hold_and_frees_the_connection),
                T(test_options_are_checked),
                T(test_attached_pid_is_reported_and_holds_the_slot),
                T(test_pid_of_a_stranger_is_invalid),
                T(test_first_layout_of_the_options_passes_no_fd),
                T(test_broker_closes_the_fds_no_call_uses),
                T(test_call_returns_the_reply_parameters),
                T(test_call_reports_errors_as_positive_codes),
                T(test_call_while_holding_uses_a_new_connection),
                T(test_drain_refuses_waiters_as_unavailable),
                cmocka_unit_test(test_broker_going_away_is_econnreset),
                cmocka_unit_test(test_protocol_violations_are_ebadmsg),
                cmocka_unit_test(test_broker_without_fence_is_asked_again_without_it),
                cmocka_unit_test(test_acquire_sends_every_option),
                cmocka_unit_test(test_other_invalid_parameter_is_a_refusal_even_with_fence),
                cmocka_unit_test(test_held_renewal_is_an_event_with_its_fence),
                cmocka_unit_test(test_release_exit_start_tells_the_status_without_blocking),
                cmocka_unit_test(test_held_without_its_fence_is_ebadmsg),
                cmocka_unit_test(test_unsolicited_reply_is_ebadmsg),
                cmocka_unit_test(test_refusal_from_unknown_error_is_error_other),
        };
        return cmocka_run_group_tests(tests, broker_start, broker_stop);
}
