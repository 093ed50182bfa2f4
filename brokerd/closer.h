/* SPDX-License-Identifier: MIT */
/* closer.h — closes the fds that clients passed, off the event loop (SPEC §11: brokerd never blocks on
 * closing what a client passed).
 *
 * The last close() of a file can block: a TCP socket with SO_LINGER on and data unsent waits up to the
 * linger time, a file on FUSE or NFS waits for the server's flush. A client passes such an fd and drops its
 * copy, and the event loop would wait with it: no client answered, no heartbeat. Every fd a client passed
 * and brokerd does not keep goes to one thread here, which closes them in order. Changing the fd first (an
 * SO_LINGER of 0) would change the client's socket too, if it kept a copy, and covers sockets only. */
#pragma once

#include <stdbool.h>

/* Hands fd (negative: nothing) to the closer thread, started at the first call. Never blocks on the fd; if
 * the thread cannot be made, closes it here (logged once). */
void closer_close(int fd);

/* For a client's socket shut down both ways (shutdown(SHUT_RDWR): nothing can arrive in it any more): closed
 * here when nothing is queued unread in it, since only an unread message can bring an fd whose last close
 * blocks; by the thread otherwise. Handing every connection's socket to the thread cost each one a wakeup of
 * the thread (two context switches, a futex call each side). */
bool closer_close_socket(int fd); /* true: closed here */

/* How many fds wait to be closed (tests, Status). */
unsigned closer_pending(void);

/* For _cleanup_(): an fd that came from a client, handed to the closer unless taken (TAKE_FD). */
static inline void closer_closep(int *fd) {
        closer_close(*fd);
}
