/* SPDX-License-Identifier: MIT */
/* fs-util.h — file-system helpers the daemon's modules share. */
#pragma once

#include <stdbool.h>
#include <sys/types.h>

/* Creates the directories leading to path, not path itself ("/run/a/b/sock": /run, /run/a, /run/a/b),
 * each with mode where it is created; existing ones are left as they are. Returns 0 or negative errno. */
int mkdir_parents(const char *path, mode_t mode);

/* Renames path to path.corrupt-<UTC time> (".N" appended while that name is taken; never over a file) and
 * returns the new name: a damaged file kept for an operator, out of the way. missing_ok: a path that does
 * not exist is no error, and the name it would have had is returned (for the files that go with it).
 * Returns 0, -ENOMEM, -EEXIST (100 names taken), or rename's error. */
int rename_aside(const char *path, bool missing_ok, char **ret_moved);

/* Takes an exclusive flock() on path (created 0600 where missing, its directories 0750), held for as long as the
 * returned fd is open: one process of a kind per directory. The holder's pid is written in it, for the message
 * of the one refused; an existing file that cannot be opened for writing (a read-only file system) is locked
 * all the same. Returns 0 with *ret_fd; -EWOULDBLOCK with *ret_holder (0 if unknown) when another open file
 * holds it; else negative errno (-EROFS: a read-only file system where it does not exist). */
int lock_file_take(const char *path, int *ret_fd, pid_t *ret_holder);

/* write() until all of data is written (EINTR retried). Returns 0, -EIO (nothing written), or write's error. */
int fd_write_all(int fd, const void *data, size_t size);

/* Holds each of stdin, stdout and stderr that is closed (a program started with `2>&-`) with /dev/null, so
 * that no file or socket opened later takes that number and gets what was meant for it (log lines in a lease
 * log, output in a Varlink socket). Read-only and close-on-exec: a write there still fails (EBADF) as on the
 * closed descriptor, and a command exec'd gets it closed, as it was. Call it before anything opens a file
 * descriptor. Returns 0 or negative errno. */
int stdio_ensure_open(void);
