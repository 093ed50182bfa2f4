/* SPDX-License-Identifier: MIT */
/* test-closer.c — which client sockets brokerd closes on its loop (closer.h): one shut down with nothing
 * queued, and not one with a message unread in it, which may carry an fd whose last close blocks. Over a
 * socketpair; the fd that rides is a pipe's end, whose close is seen by its other end. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "closer.h"

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
        assert_true(closer_close_socket(sv[0]));
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
        assert_false(closer_close_socket(sv[0]));
        /* The thread closes it, and with it the fd that was in flight. */
        assert_true(write_end_closed(pipe_fds[0], 10000));
        close(pipe_fds[0]);
        close(sv[1]);
}

static void test_nothing_to_close(void **state) {
        assert_false(closer_close_socket(-EBADF));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_an_empty_socket_is_closed_here),
                cmocka_unit_test(test_a_socket_with_an_fd_queued_goes_to_the_thread),
                cmocka_unit_test(test_nothing_to_close),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
