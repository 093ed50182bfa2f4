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
static unsigned total;
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

static bool closer_queue_over(const CloserQueue *q) {
        return (limit_total > 0 && total >= limit_total) || (limit_per_uid > 0 && q && q->pending >= limit_per_uid);
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
                bool total_over = limit_total > 0 && total >= limit_total;
                bool uid_over = limit_per_uid > 0 && q->pending >= limit_per_uid;
                q->pending--;
                total--;
                /* Nothing is paused but at a limit: the loop is woken when one is crossed, not for every fd. */
                if (((total_over && total < limit_total) || (uid_over && q->pending < limit_per_uid)) &&
                    notify_fd >= 0)
                        (void) eventfd_write(notify_fd, 1);
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
        q->pending++;
        total++;
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

bool closer_close_socket(int fd, uid_t uid) {
        int queued_bytes;
        if (fd < 0)
                return false;
        /* Every message that can bring an fd brings a byte at least (a stream socket sends no empty one). */
        if (ioctl(fd, FIONREAD, &queued_bytes) == 0 && queued_bytes == 0) {
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
        pthread_mutex_unlock(&lock);
}

bool closer_over(uid_t uid) {
        pthread_mutex_lock(&lock);
        bool over = closer_queue_over(closer_find(uid));
        pthread_mutex_unlock(&lock);
        return over;
}

bool closer_total_over(void) {
        pthread_mutex_lock(&lock);
        bool over = closer_queue_over(NULL);
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

unsigned closer_pending_uid(uid_t uid) {
        pthread_mutex_lock(&lock);
        const CloserQueue *q = closer_find(uid);
        unsigned n = q ? q->pending : 0;
        pthread_mutex_unlock(&lock);
        return n;
}
