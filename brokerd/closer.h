/* SPDX-License-Identifier: MIT */
/* closer.h — closes the fds that clients passed, off the event loop (SPEC §11: brokerd never blocks on
 * closing what a client passed).
 *
 * The last close() of a file can block: a TCP socket with SO_LINGER on and data unsent waits up to the
 * linger time, a file on FUSE or NFS waits for the server's flush. A client passes such an fd and drops its
 * copy, and the event loop would wait with it: no client answered, no heartbeat. Every fd a client passed
 * and brokerd does not keep goes to the threads here. Changing the fd first (an SO_LINGER of 0) would change
 * the client's socket too, if it kept a copy, and covers sockets only.
 *
 * The fds wait open meanwhile, counted against RLIMIT_NOFILE: they are counted here per uid (the client's
 * that passed them, or whose socket it is) and in total, so that one user whose closes block cannot make
 * brokerd run out of fds. Each uid's fds are closed in order, by one thread at a time, so a close that
 * blocks holds up that uid's only; a few threads serve the uids. The loop reads nothing more from a uid at
 * its limit: closer_over(). The total bounds each uid's fds up to its limit only, so that one uid cannot
 * fill it for the others: a uid gets past its limit only with sockets (of connections refused, or closed,
 * with fds in their unread messages), which the loop cannot refuse before it knows their uid, nor close
 * itself. Those have a budget of their own, as large as the total: full, it pauses accepting
 * (closer_total_over()), not reading. */
#pragma once

#include <stdbool.h>
#include <sys/types.h>

/* The owner of fds nobody is serving: counted in the total only. */
#define CLOSER_NOBODY ((uid_t) -1)

/* Hands fd (negative: nothing) to the closer threads, as uid's (the client that passed it, or whose socket
 * it is). Never blocks on the fd; if no thread can be made, or no memory, closes it here (logged once). */
void closer_close_as(int fd, uid_t uid);
/* As closer_close_as(), for the owner set now (closer_set_owner()). */
void closer_close(int fd);

/* Whose fds closer_close() counts from now on: the client being served (the fds a stream closes have no
 * owner of their own). Returns the one before, for the caller to set back. */
uid_t closer_set_owner(uid_t uid);

/* For a client's socket shut down both ways (shutdown(SHUT_RDWR): nothing can arrive in it any more): closed
 * here unless a message queued unread in it carries an fd, since only such an fd's last close may block; by
 * a thread otherwise, as uid's. Handing every connection's socket to a thread cost each one a wakeup of the
 * thread (two context switches, a futex call each side), and let a user whose close blocks fill the count
 * with connections that send a byte and are refused. The loop's alone (a scratch buffer). */
bool closer_close_socket(int fd, uid_t uid); /* true: closed here */

/* The fds that may wait per uid and in total (0: no limit). */
void closer_set_limits(unsigned per_uid, unsigned total);
/* Whether uid has its limit of fds waiting, or every uid together the total (each counted up to its limit):
 * nothing more is read from it. */
bool closer_over(uid_t uid);
/* Whether the total is reached, or the uids' fds past their limits reach as many: no connection is accepted. */
bool closer_total_over(void);

/* An eventfd, made at the first call (negative errno if it cannot be): readable once a count that was at its
 * limit fell below it. closer_notify_clear() empties it. */
int closer_notify_fd(void);
void closer_notify_clear(void);

/* How many fds wait to be closed: in total, and uid's (tests, metrics). */
unsigned closer_pending(void);
unsigned closer_pending_uid(uid_t uid);
/* The uid with the most fds waiting (CLOSER_NOBODY: none), and how many: whom the log names when accepting
 * pauses. */
unsigned closer_pending_most(uid_t *ret_uid);

/* For _cleanup_(): an fd that came from a client, handed to the closer unless taken (TAKE_FD). */
static inline void closer_closep(int *fd) {
        closer_close(*fd);
}

/* For _cleanup_(): sets the owner back (closer_set_owner()). */
static inline void closer_owner_restore(uid_t *uid) {
        (void) closer_set_owner(*uid);
}
