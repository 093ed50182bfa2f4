/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "closer.h"
#include "log.h"
#include "macro.h"

/* The queue: a growing array under a mutex. A close that blocks holds up the ones behind it, not the loop;
 * the fds wait open meanwhile (they count against RLIMIT_NOFILE like any other). */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t queued = PTHREAD_COND_INITIALIZER;
static int *fds;
static size_t n_fds, allocated;
static unsigned in_close;       /* 1 while the thread is in close() */
static bool started, failed;

static void *closer_thread(void *arg) {
        (void) arg;
        pthread_mutex_lock(&lock);
        for (;;) {
                while (n_fds == 0)
                        pthread_cond_wait(&queued, &lock);
                int fd = fds[0];
                memmove(fds, fds + 1, --n_fds * sizeof(int));
                in_close = 1;
                pthread_mutex_unlock(&lock);
                (void) close(fd);
                pthread_mutex_lock(&lock);
                in_close = 0;
        }
        return NULL;
}

/* With the lock held. */
static bool closer_start(void) {
        if (started)
                return true;
        if (failed)
                return false;
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
                log_warning_errno(-r, "Could not start the thread that closes the fds clients pass, closing them on the loop: %m");
                return false;
        }
        started = true;
        return true;
}

void closer_close(int fd) {
        if (fd < 0)
                return;
        pthread_mutex_lock(&lock);
        if (closer_start() && n_fds == allocated) {
                size_t n = MAX(allocated * 2, (size_t) 16);
                int *a = realloc(fds, n * sizeof(int));
                if (a) {
                        fds = a;
                        allocated = n;
                }
        }
        if (started && n_fds < allocated) {
                fds[n_fds++] = fd;
                pthread_cond_signal(&queued);
                pthread_mutex_unlock(&lock);
                return;
        }
        pthread_mutex_unlock(&lock);
        (void) close(fd); /* no thread, or no memory: the old way, rather than a leak */
}

bool closer_close_socket(int fd) {
        int queued_bytes;
        if (fd < 0)
                return false;
        /* Every message that can bring an fd brings a byte at least (a stream socket sends no empty one). */
        if (ioctl(fd, FIONREAD, &queued_bytes) == 0 && queued_bytes == 0) {
                (void) close(fd);
                return true;
        }
        closer_close(fd);
        return false;
}

unsigned closer_pending(void) {
        pthread_mutex_lock(&lock);
        unsigned n = (unsigned) n_fds + in_close;
        pthread_mutex_unlock(&lock);
        return n;
}
