/* SPDX-License-Identifier: MIT */
/* test-closer.c — which client sockets brokerd closes on its loop (closer.h): one shut down with nothing
 * queued, and not one with a message unread in it, which may carry an fd whose last close blocks. Over a
 * socketpair; the fd that rides is a pipe's end, whose close is seen by its other end. And the accounting of
 * what waits: per uid and in total, a uid whose close blocks holding up its own fds only, the loop told when
 * a count falls below its limit. The close that blocks is a TCP socket's on loopback with SO_LINGER and data
 * its peer does not read; closing the peer ends it. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "test-fds.h"

#include "closer.h"
#include "macro.h"

static void send_with_fd(int sock, int fd) {
        char byte = 'x';
        struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
        union {
                struct cmsghdr align;
                char buf[CMSG_SPACE(sizeof(int))];
        } control = {};
        struct msghdr m = {
                .msg_iov = &iov,
                .msg_iovlen = 1,
                .msg_control = control.buf,
                .msg_controllen = sizeof control.buf,
        };
        struct cmsghdr *h = CMSG_FIRSTHDR(&m);
        h->cmsg_level = SOL_SOCKET;
        h->cmsg_type = SCM_RIGHTS;
        h->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(h), &fd, sizeof fd);
        assert_int_equal(sendmsg(sock, &m, MSG_NOSIGNAL), 1);
}

/* Whether the pipe's write end is closed everywhere: its read end sees EOF (POLLHUP). */
static bool write_end_closed(int read_end, int timeout_ms) {
        struct pollfd p = { .fd = read_end, .events = POLLIN };
        return poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLHUP);
}

static void test_an_empty_socket_is_closed_here(void **state) {
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        assert_int_equal(shutdown(sv[0], SHUT_RDWR), 0);
        assert_true(closer_close_socket(sv[0], 1000));
        /* Closed: the peer's end is hung up at once, not when a thread gets to it. */
        struct pollfd p = { .fd = sv[1], .events = POLLIN };
        assert_int_equal(poll(&p, 1, 0), 1);
        assert_true(p.revents & POLLHUP);
        close(sv[1]);
}

static void test_a_socket_with_an_fd_queued_goes_to_the_thread(void **state) {
        int sv[2], pipe_fds[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        assert_int_equal(pipe2(pipe_fds, O_CLOEXEC), 0);
        send_with_fd(sv[1], pipe_fds[1]);
        close(pipe_fds[1]); /* the copy in flight is the last one */
        assert_int_equal(shutdown(sv[0], SHUT_RDWR), 0);
        /* Nothing can arrive after the shutdown: the sender is told so. */
        char byte = 'y';
        assert_int_equal(send(sv[1], &byte, 1, MSG_NOSIGNAL), -1);
        assert_int_equal(errno, EPIPE);
        assert_false(closer_close_socket(sv[0], 1000));
        /* The thread closes it, and with it the fd that was in flight. */
        assert_true(write_end_closed(pipe_fds[0], 10000));
        close(pipe_fds[0]);
        close(sv[1]);
}

/* Bytes queued unread, in messages of size bytes each, until total bytes. */
static void send_bytes(int sock, size_t size, size_t total) {
        char buf[65536];
        memset(buf, 'x', sizeof buf);
        assert_true(size <= sizeof buf);
        for (size_t sent = 0; sent < total; sent += size)
                assert_int_equal(send(sock, buf, size, MSG_NOSIGNAL), (ssize_t) size);
}

static void test_a_socket_with_bytes_queued_is_closed_here(void **state) {
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        /* More than one pass of the scratch buffer, in messages of several sizes: none brings an fd. */
        send_bytes(sv[1], 1, 3);
        send_bytes(sv[1], 40000, 80000);
        assert_int_equal(shutdown(sv[0], SHUT_RDWR), 0);
        assert_true(closer_close_socket(sv[0], 2000));
        struct pollfd p = { .fd = sv[1], .events = POLLIN };
        assert_int_equal(poll(&p, 1, 0), 1);
        assert_true(p.revents & POLLHUP);
        assert_int_equal(closer_pending_uid(2000), 0);
        close(sv[1]);
}

static void test_a_socket_with_an_fd_behind_bytes_goes_to_the_thread(void **state) {
        int sv[2], pipe_fds[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        assert_int_equal(pipe2(pipe_fds, O_CLOEXEC), 0);
        send_bytes(sv[1], 40000, 80000);
        send_with_fd(sv[1], pipe_fds[1]);
        send_bytes(sv[1], 1, 1);
        close(pipe_fds[1]);
        assert_int_equal(shutdown(sv[0], SHUT_RDWR), 0);
        /* The peek that saw the fd gave its copy back: the write end is still open, in the message. */
        assert_false(closer_close_socket(sv[0], 1000));
        assert_true(write_end_closed(pipe_fds[0], 10000));
        close(pipe_fds[0]);
        close(sv[1]);
}

static void wait_pending_uid(uid_t uid, unsigned n) {
        for (int i = 0; i < 10000 && closer_pending_uid(uid) != n; i++)
                (void) nanosleep(&(struct timespec) { .tv_nsec = 1000000 }, NULL);
        assert_int_equal(closer_pending_uid(uid), n);
}

static bool notified(int timeout_ms) {
        struct pollfd p = { .fd = closer_notify_fd(), .events = POLLIN };
        assert_true(p.fd >= 0);
        return poll(&p, 1, timeout_ms) == 1;
}

#define UID_A 1001
#define UID_B 1002
#define UID_C 1003

static void test_a_uid_at_its_limit_holds_up_only_its_own(void **state) {
        closer_set_limits(3, 0);
        closer_notify_clear();
        int peer, p1[2], p2[2], p3[2];
        int stuck = lingering_socket(&peer);
        assert_int_equal(pipe2(p1, O_CLOEXEC), 0);
        assert_int_equal(pipe2(p2, O_CLOEXEC), 0);
        assert_int_equal(pipe2(p3, O_CLOEXEC), 0);

        closer_close_as(stuck, UID_A);
        closer_close_as(p1[1], UID_A);
        assert_false(closer_over(UID_A));
        closer_close_as(p2[1], UID_A);
        /* Behind A's close that blocks, A's fds wait: A is at its limit, nobody else is. */
        assert_int_equal(closer_pending_uid(UID_A), 3);
        assert_true(closer_over(UID_A));
        assert_false(closer_over(UID_B));
        assert_false(closer_total_over());

        /* B's fd is closed meanwhile, by another thread. */
        closer_close_as(p3[1], UID_B);
        assert_true(write_end_closed(p3[0], 10000));
        wait_pending_uid(UID_B, 0);
        assert_false(write_end_closed(p1[0], 0));
        assert_int_equal(closer_pending(), 3);
        assert_false(notified(0));

        /* A's close ends: its fds close, and the loop is told. */
        close(peer);
        assert_true(notified(10000));
        assert_true(write_end_closed(p1[0], 10000));
        assert_true(write_end_closed(p2[0], 10000));
        wait_pending_uid(UID_A, 0);
        assert_false(closer_over(UID_A));
        assert_int_equal(closer_pending(), 0);
        closer_notify_clear();
        assert_false(notified(0));
        close(p1[0]);
        close(p2[0]);
        close(p3[0]);
}

static void test_the_total(void **state) {
        closer_set_limits(100, 2);
        closer_notify_clear();
        int peer_a, peer_b;
        closer_close_as(lingering_socket(&peer_a), UID_A);
        assert_false(closer_total_over());
        closer_close_as(lingering_socket(&peer_b), UID_B);
        /* Everyone is over once the total is: C too, which has nothing waiting. */
        assert_true(closer_total_over());
        assert_true(closer_over(UID_C));
        close(peer_b);
        assert_true(notified(10000));
        wait_pending_uid(UID_B, 0);
        assert_false(closer_total_over());
        assert_false(closer_over(UID_C));
        close(peer_a);
        wait_pending_uid(UID_A, 0);
        closer_notify_clear();
}

/* Past its limit (sockets of its refused connections, which the loop must take), a uid counts in a budget of
 * its own: full, it stops accepting, but the others are read, and the total (their shares) is not reached. */
static void test_past_its_limit_a_uid_does_not_fill_the_total(void **state) {
        closer_set_limits(2, 4);
        closer_notify_clear();
        int peer, p[6][2];
        closer_close_as(lingering_socket(&peer), UID_A);
        for (size_t i = 0; i < ELEMENTSOF(p); i++) {
                assert_int_equal(pipe2(p[i], O_CLOEXEC), 0);
                if (i < 4)
                        closer_close_as(p[i][1], UID_A);
        }
        /* A: 5 waiting, 2 of them its share and 3 past its limit. */
        assert_int_equal(closer_pending(), 5);
        assert_true(closer_over(UID_A));
        assert_false(closer_over(UID_B));
        assert_false(closer_total_over());
        closer_close_as(p[4][1], UID_A);
        /* 4 past its limit: the budget for them is full, and nothing is accepted; B is still read. */
        assert_true(closer_total_over());
        assert_false(closer_over(UID_B));
        /* B's fds count in the total, with A's share: 2 + 2. */
        closer_close_as(p[5][1], UID_B);
        assert_true(write_end_closed(p[5][0], 10000));
        wait_pending_uid(UID_B, 0);
        /* A raised limit makes A's fds its share again: the total (4) is reached, by A alone this time. */
        closer_set_limits(100, 4);
        assert_true(closer_over(UID_B));
        closer_set_limits(2, 4);
        assert_false(closer_over(UID_B));
        close(peer);
        assert_true(notified(10000));
        wait_pending_uid(UID_A, 0);
        assert_false(closer_total_over());
        for (size_t i = 0; i < ELEMENTSOF(p); i++) {
                if (i < 5)
                        assert_true(write_end_closed(p[i][0], 10000));
                close(p[i][0]);
        }
        closer_notify_clear();
}

static void test_the_owner(void **state) {
        closer_set_limits(100, 0);
        int peer, p[2];
        assert_int_equal(pipe2(p, O_CLOEXEC), 0);
        closer_close_as(lingering_socket(&peer), UID_A);
        /* What closer_close() is given counts for the client being served: here, behind A's close. */
        assert_int_equal(closer_set_owner(UID_A), CLOSER_NOBODY);
        closer_close(p[1]);
        assert_int_equal(closer_set_owner(CLOSER_NOBODY), UID_A);
        assert_int_equal(closer_pending_uid(UID_A), 2);
        assert_false(write_end_closed(p[0], 0));
        close(peer);
        assert_true(write_end_closed(p[0], 10000));
        wait_pending_uid(UID_A, 0);
        close(p[0]);
        closer_notify_clear();
}

static void test_nothing_to_close(void **state) {
        assert_false(closer_close_socket(-EBADF, 1000));
}

static int setup(void **state) {
        /* Made first: it tells of the closes that come after it. */
        assert_true(closer_notify_fd() >= 0);
        return 0;
}

int main(int argc, char *argv[]) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_an_empty_socket_is_closed_here),
                cmocka_unit_test(test_a_socket_with_an_fd_queued_goes_to_the_thread),
                cmocka_unit_test(test_a_socket_with_bytes_queued_is_closed_here),
                cmocka_unit_test(test_a_socket_with_an_fd_behind_bytes_goes_to_the_thread),
                cmocka_unit_test(test_nothing_to_close),
        };
        /* `--blocking`: the cases whose close() must block (test-fds.h, blocking_cases_can_run()). */
        const struct CMUnitTest blocking_tests[] = {
                cmocka_unit_test(test_a_uid_at_its_limit_holds_up_only_its_own),
                cmocka_unit_test(test_the_total),
                cmocka_unit_test(test_past_its_limit_a_uid_does_not_fill_the_total),
                cmocka_unit_test(test_the_owner),
        };
        if (argc > 1 && strcmp(argv[1], "--blocking") == 0)
                return blocking_cases_can_run() ? cmocka_run_group_tests_name("blocking_tests", blocking_tests, setup, NULL) : 0;
        return cmocka_run_group_tests(tests, setup, NULL);
}
