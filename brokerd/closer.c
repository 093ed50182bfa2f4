/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "closer.h"
#include "log.h"
#include "macro.h"

/* Threads that close: a uid whose close blocks holds one; the others serve the other uids. Few, since each
 * one stuck holds only its uid's fds, and those are bounded (closer_set_limits()). */
#define CLOSER_THREADS_MAX 4

/* One uid's fds, closed in order by one thread at a time. Allocated each on its own: a thread in close()
 * keeps its queue's address while others come and go. */
typedef struct CloserQueue {
        uid_t uid;
        int *fds;               /* fds[head..n) wait */
        size_t head, n, allocated;
        unsigned pending;       /* waiting, and the one in close() */
        bool busy;              /* a thread is in close() for it */
} CloserQueue;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t queued = PTHREAD_COND_INITIALIZER;
static CloserQueue **queues;    /* the uids with fds pending */
static size_t n_queues, allocated_queues, next_queue;
/* Every fd waiting, and of them each uid's up to its limit: the share the total (limit_total) bounds. A uid
 * is not read at its limit, so only sockets get past it: of connections refused at accept, or closed, with
 * fds in their unread messages, which can only be closed (a uid is known only once its connection is
 * accepted). Those have a budget of their own, limit_total again: filling it pauses accepting, never the
 * reading of another uid (closer_over()). */
static unsigned total, shared;
static unsigned limit_per_uid, limit_total; /* 0: none */
static unsigned n_threads, n_free;          /* threads, and those not in close() */
static bool failed;
static int notify_fd = -EBADF;
static uid_t owner = CLOSER_NOBODY; /* the loop's alone */

/* With the lock held, as every static function here. */
static CloserQueue *closer_find(uid_t uid) {
        for (size_t i = 0; i < n_queues; i++)
                if (queues[i]->uid == uid)
                        return queues[i];
        return NULL;
}

/* What of n fds of a uid is its share (the rest is past its limit). */
static unsigned closer_share(unsigned n) {
        return limit_per_uid > 0 ? MIN(n, limit_per_uid) : n;
}

static bool closer_shared_over(void) {
        return limit_total > 0 && shared >= limit_total;
}

static bool closer_past_limits_over(void) {
        return limit_total > 0 && total - shared >= limit_total;
}

static bool closer_uid_over(const CloserQueue *q) {
        return limit_per_uid > 0 && q && q->pending >= limit_per_uid;
}

/* One fd more, or less, of q's uid. */
static void closer_count(CloserQueue *q, bool more) {
        unsigned before = closer_share(q->pending);
        q->pending = more ? q->pending + 1 : q->pending - 1;
        total = more ? total + 1 : total - 1;
        shared = shared - before + closer_share(q->pending);
}

static void closer_drop_queue(CloserQueue *q) {
        for (size_t i = 0; i < n_queues; i++)
                if (queues[i] == q) {
                        queues[i] = queues[--n_queues];
                        break;
                }
        free(q->fds);
        free(q);
}

/* Round robin over the uids with an fd waiting and no thread in close() for them. */
static CloserQueue *closer_next(void) {
        for (size_t k = 0; k < n_queues; k++) {
                size_t i = (next_queue + k) % n_queues;
                CloserQueue *q = queues[i];
                if (!q->busy && q->head < q->n) {
                        next_queue = i + 1;
                        return q;
                }
        }
        return NULL;
}

/* Whether a uid's fd waits with no thread in close() for it. */
static bool closer_has_runnable(void) {
        for (size_t i = 0; i < n_queues; i++)
                if (!queues[i]->busy && queues[i]->head < queues[i]->n)
                        return true;
        return false;
}

static void closer_start(void);

static void *closer_thread(void *arg) {
        (void) arg;
        pthread_mutex_lock(&lock);
        for (;;) {
                CloserQueue *q;
                while (!(q = closer_next()))
                        pthread_cond_wait(&queued, &lock);
                int fd = q->fds[q->head++];
                if (q->head == q->n)
                        q->head = q->n = 0;
                q->busy = true;
                n_free--;
                /* This close may block: another uid's fd behind it goes to a free thread, or a new one. A
                 * thread counted free when that fd came may be this one, on its way to a close that blocks. */
                if (closer_has_runnable()) {
                        if (n_free > 0)
                                pthread_cond_signal(&queued);
                        else
                                closer_start();
                }
                pthread_mutex_unlock(&lock);
                (void) close(fd);
                pthread_mutex_lock(&lock);
                n_free++;
                q->busy = false;
                bool was_over[] = { closer_shared_over(), closer_past_limits_over(), closer_uid_over(q) };
                closer_count(q, false);
                bool is_over[] = { closer_shared_over(), closer_past_limits_over(), closer_uid_over(q) };
                /* Nothing is paused but at a limit: the loop is woken when one is crossed, not for every fd. */
                for (size_t i = 0; i < ELEMENTSOF(is_over); i++)
                        if (was_over[i] && !is_over[i] && notify_fd >= 0) {
                                (void) eventfd_write(notify_fd, 1);
                                break;
                        }
                if (q->pending == 0)
                        closer_drop_queue(q);
        }
        return NULL;
}

/* A thread more, unless one is free to take the fd (or there are enough). */
static void closer_start(void) {
        if (n_free > 0 || n_threads >= CLOSER_THREADS_MAX || failed)
                return;
        /* No signal for this thread: the loop takes them (signalfd). */
        sigset_t all, old;
        sigfillset(&all);
        pthread_t t;
        pthread_attr_t attr;
        int r = pthread_attr_init(&attr);
        if (r == 0) {
                (void) pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
                (void) pthread_attr_setstacksize(&attr, 64 * 1024);
                pthread_sigmask(SIG_BLOCK, &all, &old);
                r = pthread_create(&t, &attr, closer_thread, NULL);
                pthread_sigmask(SIG_SETMASK, &old, NULL);
                pthread_attr_destroy(&attr);
        }
        if (r != 0) {
                failed = true;
                log_warning_errno(-r, n_threads == 0 ?
                                  "Could not start the thread that closes the fds clients pass, closing them on the loop: %m" :
                                  "Could not start another thread that closes the fds clients pass: %m");
                return;
        }
        n_threads++;
        n_free++;
}

static bool closer_push(uid_t uid, int fd) {
        CloserQueue *q = closer_find(uid);
        if (!q) {
                if (n_queues == allocated_queues) {
                        size_t n = MAX(allocated_queues * 2, (size_t) 8);
                        CloserQueue **a = reallocarray(queues, n, sizeof(CloserQueue *));
                        if (!a)
                                return false;
                        queues = a;
                        allocated_queues = n;
                }
                q = calloc(1, sizeof(CloserQueue));
                if (!q)
                        return false;
                q->uid = uid;
                queues[n_queues++] = q;
        }
        if (q->n == q->allocated && q->head > 0) {
                memmove(q->fds, q->fds + q->head, (q->n - q->head) * sizeof(int));
                q->n -= q->head;
                q->head = 0;
        }
        if (q->n == q->allocated) {
                size_t n = MAX(q->allocated * 2, (size_t) 16);
                int *a = reallocarray(q->fds, n, sizeof(int));
                if (!a) {
                        if (q->pending == 0)
                                closer_drop_queue(q);
                        return false;
                }
                q->fds = a;
                q->allocated = n;
        }
        q->fds[q->n++] = fd;
        closer_count(q, true);
        return true;
}

void closer_close_as(int fd, uid_t uid) {
        if (fd < 0)
                return;
        pthread_mutex_lock(&lock);
        closer_start();
        if (n_threads > 0 && closer_push(uid, fd)) {
                pthread_cond_signal(&queued);
                pthread_mutex_unlock(&lock);
                return;
        }
        pthread_mutex_unlock(&lock);
        (void) close(fd); /* no thread, or no memory: the old way, rather than a leak */
}

void closer_close(int fd) {
        closer_close_as(fd, owner);
}

uid_t closer_set_owner(uid_t uid) {
        uid_t old = owner;
        owner = uid;
        return old;
}

/* Whether a message queued unread in fd (shut down: nothing more arrives) may carry an fd. Every such
 * message brings a byte at least (a stream socket sends no empty one). The rest are peeked at, not read: a
 * peek lends us copies of the fds a message carries, and with no room for them (no control buffer) hands
 * them back at once, flagged MSG_CTRUNC; the message keeps its own, so that is never their last close. A
 * peek stops after the first message with fds. The bytes land in one scratch buffer, over and over. */
static bool closer_socket_carries_fds(int fd) {
        static char scratch[16384];
        struct iovec iov[64];
        int unread;
        if (ioctl(fd, FIONREAD, &unread) < 0)
                return true;
        if (unread == 0)
                return false;
        if ((size_t) unread > sizeof scratch * ELEMENTSOF(iov))
                return true; /* more than any client's socket buffer holds: not worth the copy */
        for (size_t i = 0; i < ELEMENTSOF(iov); i++)
                iov[i] = (struct iovec) { scratch, sizeof scratch };
        struct msghdr mh = {
                .msg_iov = iov,
                .msg_iovlen = ((size_t) unread + sizeof scratch - 1) / sizeof scratch,
        };
        ssize_t n = recvmsg(fd, &mh, MSG_PEEK | MSG_DONTWAIT);
        /* Less than unread without a flag: a peek that stopped for another reason (credentials that differ,
         * with SO_PASSCRED); such a socket goes to a thread, as any doubt. */
        return n != unread || (mh.msg_flags & MSG_CTRUNC);
}

bool closer_close_socket(int fd, uid_t uid) {
        if (fd < 0)
                return false;
        if (!closer_socket_carries_fds(fd)) {
                (void) close(fd);
                return true;
        }
        closer_close_as(fd, uid);
        return false;
}

void closer_set_limits(unsigned per_uid, unsigned total_max) {
        pthread_mutex_lock(&lock);
        limit_per_uid = per_uid;
        limit_total = total_max;
        shared = 0;
        for (size_t i = 0; i < n_queues; i++)
                shared += closer_share(queues[i]->pending);
        pthread_mutex_unlock(&lock);
}

bool closer_over(uid_t uid) {
        pthread_mutex_lock(&lock);
        bool over = closer_shared_over() || closer_uid_over(closer_find(uid));
        pthread_mutex_unlock(&lock);
        return over;
}

bool closer_total_over(void) {
        pthread_mutex_lock(&lock);
        bool over = closer_shared_over() || closer_past_limits_over();
        pthread_mutex_unlock(&lock);
        return over;
}

int closer_notify_fd(void) {
        pthread_mutex_lock(&lock);
        if (notify_fd < 0)
                notify_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        int fd = notify_fd >= 0 ? notify_fd : negative_errno();
        pthread_mutex_unlock(&lock);
        return fd;
}

void closer_notify_clear(void) {
        eventfd_t v;
        pthread_mutex_lock(&lock);
        int fd = notify_fd;
        pthread_mutex_unlock(&lock);
        if (fd >= 0)
                (void) eventfd_read(fd, &v);
}

unsigned closer_pending(void) {
        pthread_mutex_lock(&lock);
        unsigned n = total;
        pthread_mutex_unlock(&lock);
        return n;
}

unsigned closer_pending_most(uid_t *ret_uid) {
        uid_t uid = CLOSER_NOBODY;
        unsigned n = 0;
        pthread_mutex_lock(&lock);
        for (size_t i = 0; i < n_queues; i++)
                if (queues[i]->pending > n) {
                        n = queues[i]->pending;
                        uid = queues[i]->uid;
                }
        pthread_mutex_unlock(&lock);
        *ret_uid = uid;
        return n;
}

unsigned closer_pending_uid(uid_t uid) {
        pthread_mutex_lock(&lock);
        const CloserQueue *q = closer_find(uid);
        unsigned n = q ? q->pending : 0;
        pthread_mutex_unlock(&lock);
        return n;
}
