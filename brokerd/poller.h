/* SPDX-License-Identifier: MIT */
/* poller.h — many sockets behind one sd-event source, dispatched in batches.
 *
 * sd-event dispatches one source per loop iteration and calls epoll_wait() before each: N sockets that
 * become readable together, each with a source of its own, cost N epoll_waits that each report (and make
 * the kernel poll) every one of them still ready, O(N²) per burst — 4,000 clients dripping a byte a second
 * kept brokerd busy all the time. Here the sockets share an epoll set of their own, and its one source
 * handles up to a batch of ready sockets per dispatch: O(N) per burst, and other sources (the listening
 * socket, the timers) still get their turn between batches. */
#pragma once

#include <stdint.h>
#include <systemd/sd-event.h>

typedef struct Poller Poller;
typedef struct PollerWatch PollerWatch;

/* Called with the epoll events (EPOLLIN, EPOLLOUT, EPOLLHUP, EPOLLERR) the socket has. */
typedef void (*PollerHandler)(PollerWatch *w, uint32_t revents);

/* Embedded in its owner (container_of() gets back to it). Once removed, a watch's memory must stay valid
 * until the current loop iteration is over: a batch being dispatched may still name it (it is skipped). */
struct PollerWatch {
        int fd;                 /* -EBADF: not watched */
        uint32_t events;        /* as last given to epoll */
        PollerHandler handler;
};

#define POLLER_WATCH_INIT { .fd = -EBADF }

int poller_new(sd_event *event, Poller **ret);
/* The watches must have been removed. */
Poller *poller_free(Poller *p);

/* fn runs after each handler of a batch, so that what one socket's handler started is settled before the
 * next socket's turn (as with a source per socket); it must not free watches. NULL: nothing. */
void poller_set_after_each(Poller *p, void (*fn)(void *userdata), void *userdata);

/* Handles a batch of the sockets ready now, as the source does when the loop dispatches it: for an owner
 * that must see them before it decides (not from a watch's handler). */
void poller_run(Poller *p);

/* Watches fd (level-triggered, as sd-event's io sources). Returns 0 or negative errno. */
int poller_add(Poller *p, PollerWatch *w, int fd, uint32_t events, PollerHandler handler);
/* Changes the events; no syscall when they are the ones set already. Returns 0 or negative errno. */
int poller_set_events(Poller *p, PollerWatch *w, uint32_t events);
/* Stops watching, before the fd is closed. No-op for a watch not added. */
void poller_remove(Poller *p, PollerWatch *w);
