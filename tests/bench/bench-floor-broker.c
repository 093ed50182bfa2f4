/* SPDX-License-Identifier: MIT */
/* bench-floor-broker — the floor under `slotctl run -- true` on this machine: a Unix socket server that
 * answers what slotctl run sends, and nothing else. The first call of a connection gets a grant (a fixed
 * lease), every later one "released" and its own empty reply; no engine, no lease log, no history, no /proc,
 * one connection at a time, blocking I/O. bench-run-vs-flock.sh times slotctl against it beside brokerd:
 * what brokerd adds is the difference; what is left above flock is slotctl's protocol (a connection, two
 * round trips, the command held until the grant) on this machine's wakeups and system calls.
 *
 *   bench-floor-broker SOCKET        (serves until killed)
 *
 * A benchmark's reference, not a broker: it grants everyone, and checks nothing it is sent.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static const char grant[] =
        "{\"parameters\":{\"state\":\"granted\",\"lease\":{\"id\":\"0123456789abcdef0123456789abcdef\",\"token\":1,"
        "\"pool\":\"p\",\"slots\":[0],\"lane\":\"L\",\"uid\":0,\"pid\":1,\"grantedAt\":1,\"detached\":false}},"
        "\"continues\":true}";
static const char released[] = "{\"parameters\":{\"state\":\"released\"}}\0{\"parameters\":{}}";

/* Reads what the peer sent (closing the fds it passed); returns the count of calls (NUL-terminated
 * messages) in it, 0 at EOF, -1 on error. */
static int read_calls(int c) {
        char buf[16384];
        union {
                struct cmsghdr align;
                char buf[CMSG_SPACE(16 * sizeof(int))];
        } control;
        struct iovec iov = { .iov_base = buf, .iov_len = sizeof buf };
        struct msghdr m = {
                .msg_iov = &iov,
                .msg_iovlen = 1,
                .msg_control = control.buf,
                .msg_controllen = sizeof control.buf,
        };
        ssize_t k = recvmsg(c, &m, MSG_CMSG_CLOEXEC);
        if (k <= 0)
                return (int) k;
        for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h))
                if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS)
                        for (size_t i = 0; i < (h->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
                                int fd;
                                memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof fd);
                                close(fd);
                        }
        int calls = 0;
        for (ssize_t i = 0; i < k; i++)
                calls += buf[i] == '\0';
        return calls;
}

int main(int argc, char *argv[]) {
        if (argc != 2 || strlen(argv[1]) >= sizeof(((struct sockaddr_un) {}).sun_path)) {
                fprintf(stderr, "usage: bench-floor-broker SOCKET\n");
                return 2;
        }
        int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un a = { .sun_family = AF_UNIX };
        strcpy(a.sun_path, argv[1]);
        (void) unlink(argv[1]);
        if (l < 0 || bind(l, (struct sockaddr *) &a, sizeof a) < 0 || listen(l, 64) < 0) {
                perror("bench-floor-broker");
                return 1;
        }
        for (;;) {
                int c = accept4(l, NULL, NULL, SOCK_CLOEXEC);
                if (c < 0) {
                        if (errno == EINTR || errno == ECONNABORTED)
                                continue;
                        perror("bench-floor-broker: accept");
                        return 1;
                }
                int n;
                for (int answered = 0; (n = read_calls(c)) > 0;)
                        for (; n > 0; n--, answered++)
                                if (answered == 0 ? send(c, grant, sizeof grant, MSG_NOSIGNAL) < 0
                                                  : send(c, released, sizeof released, MSG_NOSIGNAL) < 0)
                                        break;
                close(c);
        }
}
