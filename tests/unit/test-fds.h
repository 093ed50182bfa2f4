/* SPDX-License-Identifier: MIT */
/* test-fds.h — fds passed by hand (SCM_RIGHTS), as a client that does not use our stream would pass them:
 * shared by test-varlink.c (the stream) and test-client.c (brokerd); and an fd whose last close() blocks, shared
 * by test-closer.c and test-connection.c. Include after cmocka.h. */
#pragma once

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

/* Sends one message (text and its NUL) with n copies of fd (n ≤ 16) in one sendmsg(). */
static inline void send_with_fds(int sock, const char *text, int fd, size_t n) {
        union {
                struct cmsghdr h;
                uint8_t buf[CMSG_SPACE(sizeof(int) * 16)];
        } control = {};
        int fds[16];
        assert_true(n <= 16);
        for (size_t i = 0; i < n; i++)
                fds[i] = fd;
        struct iovec iov = { (void *) text, strlen(text) + 1 };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = &control,
                             .msg_controllen = CMSG_SPACE(sizeof(int) * n) };
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * n);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * n);
        assert_int_equal(sendmsg(sock, &mh, MSG_NOSIGNAL), (ssize_t) iov.iov_len);
}

/* Valgrind's preload is mapped: under valgrind a close() of a socket lingering on unsent data returns at once,
 * in another thread too, so the cases that need a close that blocks run apart (`--blocking`, meson's
 * TEST-blocking) and that run is one TAP skip there: cmocka 1.1 prints a case's skip() as "not ok N # SKIP",
 * which meson counts as a failure. */
static inline bool under_valgrind(void) {
        FILE *maps = fopen("/proc/self/maps", "re");
        bool valgrind = false;
        char line[512];
        while (maps && !valgrind && fgets(line, sizeof line, maps))
                valgrind = strstr(line, "vgpreload") != NULL;
        if (maps)
                fclose(maps);
        return valgrind;
}

/* main()'s part for `--blocking`: true when the blocking cases are to run; false after the TAP skip. */
static inline bool blocking_cases_can_run(void) {
        if (!under_valgrind())
                return true;
        printf("1..0 # SKIP valgrind runs a lingering socket's close() without the wait these cases need\n");
        return false;
}

/* A loopback TCP socket whose last close() blocks (up to 30 s) until *ret_peer is closed: SO_LINGER on, data
 * unsent (the peer reads nothing). */
static inline int lingering_socket(int *ret_peer) {
        int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(listener >= 0);
        int small = 4096;
        assert_int_equal(setsockopt(listener, SOL_SOCKET, SO_RCVBUF, &small, sizeof small), 0);
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        socklen_t len = sizeof a;
        assert_int_equal(bind(listener, (struct sockaddr *) &a, sizeof a), 0);
        assert_int_equal(listen(listener, 1), 0);
        assert_int_equal(getsockname(listener, (struct sockaddr *) &a, &len), 0);
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(fd >= 0);
        assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof small), 0);
        assert_int_equal(connect(fd, (struct sockaddr *) &a, sizeof a), 0);
        *ret_peer = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        assert_true(*ret_peer >= 0);
        close(listener);
        static char data[65536];
        size_t sent = 0;
        for (;;) {
                ssize_t n = send(fd, data, sizeof data, MSG_DONTWAIT | MSG_NOSIGNAL);
                if (n < 0)
                        break;
                sent += (size_t) n;
        }
        assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
        assert_true(sent > 0);
        struct linger l = { .l_onoff = 1, .l_linger = 30 };
        assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l), 0);
        return fd;
}
