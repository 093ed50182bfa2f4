/* SPDX-License-Identifier: MIT */
/* test-connection.c — brokerd's transport alone (connection.h): framing, its limits (message size, output
 * cap, passed fds), peer credentials, deferred calls and replies and the disconnect handler, over a
 * socketpair on a real sd-event loop, with a recording call handler and no method, lease or session. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "test-fds.h"
#include <jansson.h>
#include <systemd/sd-event.h>

#include "closer.h"
#include "connection.h"
#include "poller.h"

#define MAX_CALLS 16

typedef struct Fixture {
        sd_event *event;
        Poller *poller;
        Connection *c;
        int peer;                       /* the client's end */
        char *methods[MAX_CALLS];       /* the calls the handler saw, in order */
        size_t n_calls;
        bool defer;                     /* the handler defers every call */
        size_t reply_size;              /* > 0: the handler answers with a string of this many bytes */
        bool reply_deferred;            /* the handler answers with a deferred reply */
        int fd_taken;                   /* the fd the handler took from its call, or -EBADF */
        unsigned disconnects;
        char input[65536];              /* what the client received */
        size_t n_input;
} Fixture;

static ConnectionCallResult on_call(Connection *c, const VarlinkCall *call, void *userdata) {
        Fixture *f = userdata;
        if (f->defer)
                return CONNECTION_CALL_DEFER;
        assert_true(f->n_calls < MAX_CALLS);
        f->methods[f->n_calls++] = strdup(call->method);
        if (call->fds && call->fds->n > 0)
                f->fd_taken = varlink_fds_take(call->fds, 0);
        if (f->reply_deferred)
                assert_int_equal(connection_reply_text_deferred(c, "{}", 2, false), 0);
        else if (f->reply_size > 0) {
                char *s = malloc(f->reply_size + 1);
                assert_non_null(s);
                memset(s, 'x', f->reply_size);
                s[f->reply_size] = '\0';
                json_t *p = json_pack("{s:s}", "text", s);
                (void) connection_reply(c, p, false);
                json_decref(p);
                free(s);
        } else
                (void) connection_reply(c, NULL, false);
        return CONNECTION_CALL_DONE;
}

static void on_disconnect(Connection *c, void *userdata) {
        Fixture *f = userdata;
        f->disconnects++;
}

static int setup_with(void **state, size_t max_message, size_t max_output) {
        Fixture *f = calloc(1, sizeof(Fixture));
        int sv[2];
        assert_non_null(f);
        f->fd_taken = -EBADF;
        assert_int_equal(sd_event_new(&f->event), 0);
        assert_int_equal(poller_new(f->event, &f->poller), 0);
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
        f->peer = sv[1];
        const ConnectionLimits limits = { .max_message = max_message, .max_output = max_output };
        assert_int_equal(connection_new(f->poller, sv[0], NULL, &limits, &f->c), 0);
        connection_set_userdata(f->c, f);
        connection_bind_call(f->c, on_call);
        connection_bind_disconnect(f->c, on_disconnect);
        *state = f;
        return 0;
}

static int setup(void **state) {
        return setup_with(state, 256, 4096);
}

static int teardown(void **state) {
        Fixture *f = *state;
        closer_set_limits(0, 0);
        connection_close(f->c);
        connection_free(f->c);
        poller_free(f->poller);
        sd_event_unref(f->event);
        close(f->peer);
        if (f->fd_taken >= 0)
                close(f->fd_taken);
        for (size_t i = 0; i < f->n_calls; i++)
                free(f->methods[i]);
        free(f);
        return 0;
}

static void send_raw(Fixture *f, const void *data, size_t size) {
        assert_int_equal(send(f->peer, data, size, MSG_NOSIGNAL), (ssize_t) size);
}

/* A Varlink message: its JSON and the NUL that ends it. */
static void send_message(Fixture *f, const char *json) {
        send_raw(f, json, strlen(json) + 1);
}

static void send_call(Fixture *f, const char *method) {
        char buf[256];
        snprintf(buf, sizeof buf, "{\"method\":\"%s\",\"parameters\":{}}", method);
        send_message(f, buf);
}

static void read_peer(Fixture *f) {
        for (;;) {
                ssize_t n = recv(f->peer, f->input + f->n_input, sizeof f->input - 1 - f->n_input, MSG_DONTWAIT);
                if (n <= 0)
                        break;
                f->n_input += (size_t) n;
        }
        f->input[f->n_input] = '\0';
}

/* Runs the loop until cond holds (or ~10 s, then fails): no sleeps as synchronisation. */
#define PUMP_UNTIL(f, cond)                                                                                 \
        do {                                                                                               \
                for (int _i = 0; !(cond); _i++) {                                                          \
                        assert_true(_i < 1000);                                                            \
                        assert_true(sd_event_run((f)->event, 10 * 1000) >= 0);                             \
                        read_peer(f);                                                                      \
                }                                                                                          \
        } while (0)

/* The index-th message the client received (NUL-separated), or NULL. */
static const char *received(Fixture *f, size_t index) {
        size_t at = 0;
        for (size_t i = 0; i < index; i++) {
                size_t len = strnlen(f->input + at, f->n_input - at);
                if (at + len >= f->n_input)
                        return NULL;
                at += len + 1;
        }
        return at < f->n_input ? f->input + at : NULL;
}

static void test_calls_run_in_order_and_are_answered(void **state) {
        Fixture *f = *state;
        send_call(f, "io.test.A");
        send_call(f, "io.test.B");
        PUMP_UNTIL(f, f->n_calls == 2 && received(f, 1));
        assert_string_equal(f->methods[0], "io.test.A");
        assert_string_equal(f->methods[1], "io.test.B");
        assert_string_equal(received(f, 0), "{\"parameters\":{}}");
        assert_int_equal(f->disconnects, 0);
}

static void test_message_over_max_is_protocol_error_then_close(void **state) {
        Fixture *f = *state;
        char big[400];
        memset(big, ' ', sizeof big); /* whitespace: valid JSON so far, never ending within the limit */
        big[0] = '{';
        send_raw(f, big, sizeof big);
        PUMP_UNTIL(f, f->disconnects == 1);
        assert_true(connection_is_closed(f->c));
        assert_int_equal(f->n_calls, 0);
        read_peer(f);
        assert_non_null(strstr(f->input, "io.slotbroker.ProtocolError"));
        assert_non_null(strstr(f->input, "too-long"));
}

static void test_malformed_message_is_protocol_error_then_close(void **state) {
        Fixture *f = *state;
        send_message(f, "{not json");
        PUMP_UNTIL(f, f->disconnects == 1);
        read_peer(f);
        assert_non_null(strstr(f->input, "malformed"));
        assert_int_equal(f->n_calls, 0);
}

static void test_not_a_call_is_protocol_error_then_close(void **state) {
        Fixture *f = *state;
        send_message(f, "{\"parameters\":{}}");
        PUMP_UNTIL(f, f->disconnects == 1);
        read_peer(f);
        assert_non_null(strstr(f->input, "not-a-call"));
}

static void test_unread_output_past_cap_closes(void **state) {
        Fixture *f = *state;
        int size = 1; /* the kernel's minimum: the client reads nothing, so the output stays with us */
        (void) setsockopt(f->peer, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
        f->reply_size = 1024; /* under the 4096 cap each, past it together */
        for (int i = 0; i < 12; i++)
                send_call(f, "io.test.Big");
        for (int i = 0; f->disconnects == 0; i++) {
                assert_true(i < 1000);
                assert_true(sd_event_run(f->event, 10 * 1000) >= 0); /* no read_peer(): it does not read */
        }
        assert_int_equal(f->disconnects, 1);
        assert_true(f->n_calls < 12);
}

static void test_fd_passed_with_a_call_reaches_the_handler(void **state) {
        Fixture *f = *state;
        int pipefd[2];
        assert_int_equal(pipe2(pipefd, O_CLOEXEC), 0);
        const char *msg = "{\"method\":\"io.test.Fd\",\"parameters\":{}}";
        char control[CMSG_SPACE(sizeof(int))] = {};
        struct iovec iov = { .iov_base = (void *) msg, .iov_len = strlen(msg) + 1 };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control };
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &pipefd[1], sizeof(int));
        assert_int_equal(sendmsg(f->peer, &mh, MSG_NOSIGNAL), (ssize_t) iov.iov_len);
        close(pipefd[1]);
        PUMP_UNTIL(f, f->n_calls == 1);
        assert_true(f->fd_taken >= 0);
        /* It is the pipe's write end: what goes in comes out of the read end. */
        assert_int_equal(write(f->fd_taken, "!", 1), 1);
        char c;
        assert_int_equal(read(pipefd[0], &c, 1), 1);
        close(pipefd[0]);
}

static void test_too_many_fds_close(void **state) {
        Fixture *f = *state;
        int fds[VARLINK_FDS_MAX + 1];
        for (size_t i = 0; i < ELEMENTSOF(fds); i++)
                fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
        const char *msg = "{\"method\":\"io.test.Fd\",\"parameters\":{}}";
        char control[CMSG_SPACE(sizeof fds)] = {};
        struct iovec iov = { .iov_base = (void *) msg, .iov_len = strlen(msg) + 1 };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control };
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof fds);
        memcpy(CMSG_DATA(cm), fds, sizeof fds);
        assert_int_equal(sendmsg(f->peer, &mh, MSG_NOSIGNAL), (ssize_t) iov.iov_len);
        for (size_t i = 0; i < ELEMENTSOF(fds); i++)
                close(fds[i]);
        PUMP_UNTIL(f, f->disconnects == 1);
        assert_int_equal(f->n_calls, 0);
}

static void test_deferred_call_is_kept_and_runs_on_resume_in_order(void **state) {
        Fixture *f = *state;
        f->defer = true;
        send_call(f, "io.test.A");
        send_call(f, "io.test.B");
        /* Both arrive; the first is deferred and the second waits behind it. */
        for (int i = 0; i < 5; i++)
                assert_true(sd_event_run(f->event, 10 * 1000) >= 0);
        assert_int_equal(f->n_calls, 0);
        f->defer = false;
        connection_resume(f->c);
        PUMP_UNTIL(f, f->n_calls == 2);
        assert_string_equal(f->methods[0], "io.test.A");
        assert_string_equal(f->methods[1], "io.test.B");
}

static void test_held_connection_takes_no_call_until_unheld(void **state) {
        Fixture *f = *state;
        connection_set_held(f->c, true);
        send_call(f, "io.test.A");
        for (int i = 0; i < 5; i++)
                assert_true(sd_event_run(f->event, 10 * 1000) >= 0);
        assert_int_equal(f->n_calls, 0);
        connection_set_held(f->c, false);
        PUMP_UNTIL(f, f->n_calls == 1);
}


static void test_not_read_while_its_uid_is_at_the_closer_limit(void **state) {
        Fixture *f = *state;
        int peer;
        int notify = closer_notify_fd(); /* made before anything is closed: it tells what comes after */
        assert_true(notify >= 0);
        closer_set_limits(1, 0);
        closer_close_as(lingering_socket(&peer), getuid());
        assert_true(closer_over(getuid()));
        send_call(f, "io.test.A");
        for (int i = 0; i < 5; i++)
                assert_true(sd_event_run(f->event, 10 * 1000) >= 0);
        assert_int_equal(f->n_calls, 0);
        assert_int_equal(connection_paused_count(), 1);
        /* Its client's end does not close it either: its socket would go to the closer too. */
        assert_int_equal(shutdown(f->peer, SHUT_WR), 0);
        for (int i = 0; i < 5; i++)
                assert_true(sd_event_run(f->event, 10 * 1000) >= 0);
        assert_int_equal(f->disconnects, 0);
        assert_false(connection_is_closed(f->c));
        /* Still over: nothing resumes. */
        connection_resume_reading();
        assert_int_equal(connection_paused_count(), 1);
        /* The close ends, the closer says so, and the call is answered, the end seen. */
        close(peer);
        struct pollfd p = { .fd = notify, .events = POLLIN };
        assert_int_equal(poll(&p, 1, 10000), 1);
        closer_notify_clear();
        connection_resume_reading();
        assert_int_equal(connection_paused_count(), 0);
        PUMP_UNTIL(f, f->n_calls == 1 && f->disconnects == 1);
        assert_non_null(received(f, 0));
}

static void test_eof_calls_disconnect_once(void **state) {
        Fixture *f = *state;
        send_call(f, "io.test.A");
        assert_int_equal(shutdown(f->peer, SHUT_WR), 0);
        PUMP_UNTIL(f, f->disconnects == 1);
        assert_int_equal(f->n_calls, 1); /* what it sent before the end was answered */
        assert_non_null(received(f, 0));
        connection_close(f->c); /* idempotent */
        assert_int_equal(f->disconnects, 1);
}

static void test_close_by_owner_calls_disconnect_once_and_replies_fail(void **state) {
        Fixture *f = *state;
        connection_close(f->c);
        connection_close(f->c);
        assert_int_equal(f->disconnects, 1);
        assert_int_equal(connection_reply(f->c, NULL, false), -ENOTCONN);
        char c;
        assert_int_equal(recv(f->peer, &c, 1, 0), 0); /* the client sees EOF */
}

static void test_oneway_call_sends_nothing(void **state) {
        Fixture *f = *state;
        connection_set_oneway(f->c, true);
        assert_int_equal(connection_reply(f->c, NULL, false), 0);
        connection_set_oneway(f->c, false);
        read_peer(f);
        assert_int_equal(f->n_input, 0);
}

static void test_deferred_reply_waits_for_the_next_or_the_owner(void **state) {
        Fixture *f = *state;
        static const char notice[] = "{\"state\":\"queued\"}";
        static const char grant[] = "{\"state\":\"granted\"}";

        /* Alone, it waits, even as the answer of a call (whose replies go at the end of its dispatch): the
         * loop runs, nothing is sent, and EPOLLOUT is not asked for. */
        f->reply_deferred = true;
        send_call(f, "io.test.A");
        PUMP_UNTIL(f, f->n_calls == 1);
        assert_int_equal(connection_reply_text_deferred(f->c, notice, strlen(notice), true), 0);
        int idle = -1; /* the loop goes idle: nothing to dispatch (a socket asked for EPOLLOUT would be, always) */
        for (int i = 0; i < 10 && idle != 0; i++)
                assert_true((idle = sd_event_run(f->event, 0)) >= 0);
        assert_int_equal(idle, 0);
        read_peer(f);
        assert_int_equal(f->n_input, 0);
        assert_true(connection_get_pending_output(f->c) > 0);
        connection_send_deferred(f->c);
        read_peer(f);
        assert_string_equal(received(f, 0), "{\"parameters\":{}}");
        assert_string_equal(received(f, 1), "{\"parameters\":{\"state\":\"queued\"},\"continues\":true}");
        f->n_input = 0;

        assert_int_equal(connection_reply_text_deferred(f->c, notice, strlen(notice), true), 0);

        /* The next reply takes it along, first, in one send. */
        assert_int_equal(connection_reply_text(f->c, grant, strlen(grant), true), 0);
        read_peer(f);
        assert_string_equal(received(f, 0), "{\"parameters\":{\"state\":\"queued\"},\"continues\":true}");
        assert_string_equal(received(f, 1), "{\"parameters\":{\"state\":\"granted\"},\"continues\":true}");
        assert_int_equal(connection_get_pending_output(f->c), 0);
        connection_send_deferred(f->c); /* gone already: nothing */
        read_peer(f);
        assert_null(received(f, 2));

        /* Or its owner sends it. */
        assert_int_equal(connection_reply_text_deferred(f->c, notice, strlen(notice), true), 0);
        read_peer(f);
        assert_null(received(f, 2));
        connection_send_deferred(f->c);
        read_peer(f);
        assert_string_equal(received(f, 2), "{\"parameters\":{\"state\":\"queued\"},\"continues\":true}");
        assert_int_equal(f->disconnects, 0);
}

static void test_peer_credentials_and_primary_group(void **state) {
        Fixture *f = *state;
        const struct ucred *cred = connection_get_peer(f->c);
        assert_int_equal(cred->pid, getpid());
        assert_int_equal(cred->uid, getuid());
        const gid_t *groups;
        size_t n = connection_get_groups(f->c, &groups);
        assert_true(n >= 1);
        assert_int_equal(groups[n - 1], getgid()); /* the primary group counts for allow-groups= too */
}

int main(int argc, char *argv[]) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_calls_run_in_order_and_are_answered, setup, teardown),
                cmocka_unit_test_setup_teardown(test_message_over_max_is_protocol_error_then_close, setup, teardown),
                cmocka_unit_test_setup_teardown(test_malformed_message_is_protocol_error_then_close, setup, teardown),
                cmocka_unit_test_setup_teardown(test_not_a_call_is_protocol_error_then_close, setup, teardown),
                cmocka_unit_test_setup_teardown(test_unread_output_past_cap_closes, setup, teardown),
                cmocka_unit_test_setup_teardown(test_fd_passed_with_a_call_reaches_the_handler, setup, teardown),
                cmocka_unit_test_setup_teardown(test_too_many_fds_close, setup, teardown),
                cmocka_unit_test_setup_teardown(test_deferred_call_is_kept_and_runs_on_resume_in_order, setup, teardown),
                cmocka_unit_test_setup_teardown(test_held_connection_takes_no_call_until_unheld, setup, teardown),
                cmocka_unit_test_setup_teardown(test_eof_calls_disconnect_once, setup, teardown),
                cmocka_unit_test_setup_teardown(test_close_by_owner_calls_disconnect_once_and_replies_fail, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_oneway_call_sends_nothing, setup, teardown),
                cmocka_unit_test_setup_teardown(test_deferred_reply_waits_for_the_next_or_the_owner, setup, teardown),
                cmocka_unit_test_setup_teardown(test_peer_credentials_and_primary_group, setup, teardown),
        };
        /* `--blocking`: the case whose close() must block (test-fds.h, blocking_cases_can_run()). */
        const struct CMUnitTest blocking_tests[] = {
                cmocka_unit_test_setup_teardown(test_not_read_while_its_uid_is_at_the_closer_limit, setup, teardown),
        };
        if (argc > 1 && strcmp(argv[1], "--blocking") == 0)
                return blocking_cases_can_run() ? cmocka_run_group_tests_name("blocking_tests", blocking_tests, NULL, NULL) : 0;
        return cmocka_run_group_tests(tests, NULL, NULL);
}
