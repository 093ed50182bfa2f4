/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <sys/epoll.h>

#include "log.h"
#include "macro.h"
#include "poller.h"

/* Ready sockets handled per dispatch: enough that a burst of thousands costs few loop iterations, few
 * enough that a timer or a new connection waits at most one batch. */
#define POLLER_BATCH 128

struct Poller {
        int epoll_fd;
        sd_event_source *source;
        void (*after_each)(void *userdata);
        void *after_each_userdata;
};

void poller_set_after_each(Poller *p, void (*fn)(void *userdata), void *userdata) {
        p->after_each = fn;
        p->after_each_userdata = userdata;
}

static int poller_dispatch(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        poller_run(userdata);
        return 0; /* an error return would disable the source: every connection would go deaf */
}

void poller_run(Poller *p) {
        struct epoll_event ev[POLLER_BATCH];

        /* Level-triggered: a socket left with unread bytes (a handler reads a bounded amount) is reported
         * again in a later batch, behind the others. */
        int n = epoll_wait(p->epoll_fd, ev, POLLER_BATCH, 0);
        if (n < 0) {
                if (errno != EINTR)
                        log_warning_errno(errno, "epoll_wait() on the connections failed: %m");
                return;
        }
        for (int i = 0; i < n; i++) {
                PollerWatch *w = ev[i].data.ptr;
                if (w->fd < 0)
                        continue; /* removed by a handler earlier in this batch */
                w->handler(w, ev[i].events);
                if (p->after_each)
                        p->after_each(p->after_each_userdata);
        }
}

int poller_new(sd_event *event, Poller **ret) {
        Poller *p = calloc(1, sizeof(Poller));
        if (!p)
                return -ENOMEM;
        p->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
        if (p->epoll_fd < 0) {
                int r = negative_errno();
                free(p);
                return r;
        }
        int r = sd_event_add_io(event, &p->source, p->epoll_fd, EPOLLIN, poller_dispatch, p);
        if (r < 0) {
                safe_close(p->epoll_fd);
                free(p);
                return r;
        }
        *ret = p;
        return 0;
}

Poller *poller_free(Poller *p) {
        if (!p)
                return NULL;
        sd_event_source_disable_unref(p->source);
        safe_close(p->epoll_fd);
        return mfree(p);
}

int poller_add(Poller *p, PollerWatch *w, int fd, uint32_t events, PollerHandler handler) {
        struct epoll_event ev = { .events = events, .data.ptr = w };
        if (epoll_ctl(p->epoll_fd, EPOLL_CTL_ADD, fd, &ev) < 0)
                return negative_errno();
        *w = (PollerWatch) { .fd = fd, .events = events, .handler = handler };
        return 0;
}

int poller_set_events(Poller *p, PollerWatch *w, uint32_t events) {
        if (w->fd < 0)
                return -EBADF;
        if (w->events == events)
                return 0;
        struct epoll_event ev = { .events = events, .data.ptr = w };
        if (epoll_ctl(p->epoll_fd, EPOLL_CTL_MOD, w->fd, &ev) < 0)
                return negative_errno();
        w->events = events;
        return 0;
}

void poller_remove(Poller *p, PollerWatch *w) {
        if (w->fd < 0)
                return;
        (void) epoll_ctl(p->epoll_fd, EPOLL_CTL_DEL, w->fd, NULL);
        w->fd = -EBADF;
}
