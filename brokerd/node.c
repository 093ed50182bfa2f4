/* SPDX-License-Identifier: MIT */
#include "node.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fs-util.h"

static bool id_is_valid(const char *s, size_t n) {
        if (n != NODE_ID_HEX)
                return false;
        for (size_t i = 0; i < n; i++)
                if (!strchr("0123456789abcdef", s[i]))
                        return false;
        return true;
}

/* 0 with ret filled; -ENOENT: no file; -EBADMSG: not an id (moved aside by the caller). */
static int id_read(int dir_fd, char ret[static NODE_ID_HEX + 1]) {
        _cleanup_close_ int fd = openat(dir_fd, NODE_ID_FILE, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return -errno;
        char buf[NODE_ID_HEX + 2];
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0)
                return -errno;
        if (n > 0 && buf[n - 1] == '\n')
                n--;
        if (!id_is_valid(buf, (size_t) n))
                return -EBADMSG;
        memcpy(ret, buf, NODE_ID_HEX);
        ret[NODE_ID_HEX] = 0;
        return 0;
}

/* Written to a temporary name and linked into place: a crash leaves no half-written id, and of two daemons
 * racing, the second's link() fails with EEXIST and it reads the first one's. */
static int id_create(int dir_fd, const char *id) {
        char tmp[] = NODE_ID_FILE ".XXXXXX";
        _cleanup_close_ int fd = -EBADF;
        for (unsigned attempt = 0;; attempt++) {
                snprintf(tmp + sizeof NODE_ID_FILE, 7, "%06u", (unsigned) (getpid() + attempt) % 1000000u);
                fd = openat(dir_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
                if (fd >= 0)
                        break;
                if (errno != EEXIST || attempt > 100)
                        return -errno;
        }
        char line[NODE_ID_HEX + 1];
        memcpy(line, id, NODE_ID_HEX);
        line[NODE_ID_HEX] = '\n';
        int r = 0;
        if (write(fd, line, sizeof line) != (ssize_t) sizeof line || fsync(fd) < 0)
                r = errno > 0 ? -errno : -EIO;
        else if (linkat(dir_fd, tmp, dir_fd, NODE_ID_FILE, 0) < 0)
                r = -errno;
        (void) unlinkat(dir_fd, tmp, 0);
        return r;
}

int node_load(const char *state_directory, const char *name,
              void (*random_bytes)(void *buf, size_t n, void *userdata), void *userdata, Node *ret) {
        if (!ret || !state_directory || !random_bytes)
                return -EINVAL;

        Node n = {};
        if (name)
                n.name = strdup(name);
        else {
                char host[256] = {};
                if (gethostname(host, sizeof host - 1) < 0 || !*host)
                        strcpy(host, "localhost");
                n.name = strdup(host);
        }
        if (!n.name)
                return -ENOMEM;

        int r = mkdir_parents(state_directory, 0755);
        if (r >= 0 && mkdir(state_directory, 0755) < 0 && errno != EEXIST)
                r = -errno;
        _cleanup_close_ int dir_fd = r < 0 ? -EBADF : open(state_directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir_fd < 0) {
                node_done(&n);
                return r < 0 ? r : -errno;
        }

        for (unsigned attempt = 0; attempt < 3; attempt++) {
                r = id_read(dir_fd, n.id);
                if (r == 0)
                        break;
                if (r == -EBADMSG) {
                        _cleanup_free_ char *path = NULL, *moved = NULL;
                        if (asprintf(&path, "%s/" NODE_ID_FILE, state_directory) < 0) {
                                r = -ENOMEM;
                                break;
                        }
                        r = rename_aside(path, true, &moved);
                        if (r < 0)
                                break;
                } else if (r != -ENOENT)
                        break;

                uint8_t raw[NODE_ID_HEX / 2];
                random_bytes(raw, sizeof raw, userdata);
                char id[NODE_ID_HEX + 1];
                for (size_t i = 0; i < sizeof raw; i++)
                        snprintf(id + 2 * i, 3, "%02x", raw[i]);
                r = id_create(dir_fd, id);
                if (r < 0 && r != -EEXIST)
                        break;
                /* Read back what is in place now: ours, or a racing daemon's. */
                r = id_read(dir_fd, n.id);
                if (r != -EBADMSG && r != -ENOENT)
                        break;
        }
        if (r < 0) {
                node_done(&n);
                return r;
        }
        *ret = n;
        return 0;
}

void node_done(Node *n) {
        if (!n)
                return;
        n->name = mfree(n->name);
}
