/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fs-util.h"
#include "macro.h"

int mkdir_parents(const char *path, mode_t mode) {
        assert_return(path, -EINVAL);

        _cleanup_free_ char *p = strdup(path);
        if (!p)
                return -ENOMEM;
        for (char *s = p + 1; (s = strchr(s, '/')); s++) {
                *s = '\0';
                if (mkdir(p, mode) < 0 && errno != EEXIST)
                        return negative_errno();
                *s = '/';
        }
        return 0;
}

int lock_file_take(const char *path, int *ret_fd, pid_t *ret_holder) {
        assert_return(path, -EINVAL);
        assert_return(ret_fd, -EINVAL);
        assert_return(ret_holder, -EINVAL);

        int r = mkdir_parents(path, 0750);
        if (r < 0)
                return r;
        bool writable = true;
        _cleanup_close_ int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0 && (errno == EROFS || errno == EACCES)) {
                r = negative_errno();
                writable = false; /* flock() needs no write access: a read-only file that exists is locked */
                fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
                if (fd < 0)
                        return r;
        } else if (fd < 0)
                return negative_errno();
        if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
                r = negative_errno();
                if (r != -EWOULDBLOCK)
                        return r;
                char buf[24] = {};
                ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
                long pid = n > 0 ? strtol(buf, NULL, 10) : 0;
                *ret_holder = pid > 0 && pid <= INT32_MAX ? (pid_t) pid : 0;
                return r;
        }
        char buf[24];
        int len = snprintf(buf, sizeof buf, "%d\n", (int) getpid());
        /* The pid is for people only: a file it could not be written in still holds the lock. */
        if (writable && ftruncate(fd, 0) >= 0)
                (void) fd_write_all(fd, buf, (size_t) len);
        *ret_fd = TAKE_FD(fd);
        return 0;
}

int rename_aside(const char *path, bool missing_ok, char **ret_moved) {
        char stamp[32];
        struct tm tm;
        time_t t = time(NULL);

        assert_return(path, -EINVAL);
        assert_return(ret_moved, -EINVAL);

        if (!gmtime_r(&t, &tm) || strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%S", &tm) == 0)
                return -EINVAL;
        for (unsigned attempt = 0; attempt < 100; attempt++) {
                _cleanup_free_ char *moved = NULL;
                if ((attempt == 0 ? asprintf(&moved, "%s.corrupt-%s", path, stamp)
                                  : asprintf(&moved, "%s.corrupt-%s.%u", path, stamp, attempt)) < 0)
                        return -ENOMEM;
                if (renameat2(AT_FDCWD, path, AT_FDCWD, moved, RENAME_NOREPLACE) < 0) {
                        if (errno == EEXIST)
                                continue;
                        if (errno != ENOENT || !missing_ok)
                                return negative_errno();
                }
                *ret_moved = TAKE_PTR(moved);
                return 0;
        }
        return -EEXIST;
}

int fd_write_all(int fd, const void *data, size_t size) {
        const char *p = data;
        while (size > 0) {
                ssize_t k = write(fd, p, size);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return -errno;
                if (k == 0)
                        return -EIO;
                p += k;
                size -= (size_t) k;
        }
        return 0;
}

int stdio_ensure_open(void) {
        for (int fd = STDIN_FILENO; fd <= STDERR_FILENO; fd++) {
                if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF)
                        continue;
                /* The lowest free number, which is fd: the ones below it are open by now. */
                int null = open("/dev/null", O_RDONLY | O_CLOEXEC | O_NOCTTY);
                if (null < 0)
                        return negative_errno();
                if (null != fd) {
                        (void) close(null);
                        return -EBADF;
                }
        }
        return 0;
}
