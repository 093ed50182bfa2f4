/* SPDX-License-Identifier: MIT */
/* test-fds.h — fds passed by hand (SCM_RIGHTS), as a client that does not use our stream would pass them:
 * shared by test-varlink.c (the stream) and test-client.c (brokerd). Include after cmocka.h. */
#pragma once

#include <stdint.h>
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
