/* SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <sys/epoll.h>

#include "macro.h"
#include "redis-sdevent.h"

typedef struct RedisSdevent {
        redisAsyncContext *ac;
        sd_event_source *io;
        uint32_t events;                /* EPOLLIN, EPOLLOUT: what hiredis asked for */
        bool dispatching;               /* inside on_io(): hiredis may free the context under us */
        bool freed;                     /* the cleanup hook ran while dispatching: on_io() frees this */
        RedisSdeventCleanupFn on_cleanup;
        void *userdata;
} RedisSdevent;

static RedisSdevent *redis_sdevent_free(RedisSdevent *e) {
        if (!e)
                return NULL;
        sd_event_source_disable_unref(e->io);
        return mfree(e);
}

/* sd-event reports EPOLLHUP and EPOLLERR whatever the mask, so a source without interest is disabled
 * rather than left to spin. A failing epoll_ctl() cannot be returned through hiredis's void hooks: the
 * context then hangs until its owner's command timeout frees it. */
static void update_events(RedisSdevent *e, uint32_t events) {
        if (e->events == events)
                return;
        e->events = events;
        if (events != 0)
                (void) sd_event_source_set_io_events(e->io, events);
        (void) sd_event_source_set_enabled(e->io, events != 0 ? SD_EVENT_ON : SD_EVENT_OFF);
}

static void add_read(void *privdata) {
        RedisSdevent *e = privdata;
        update_events(e, e->events | EPOLLIN);
}

static void del_read(void *privdata) {
        RedisSdevent *e = privdata;
        update_events(e, e->events & ~(uint32_t) EPOLLIN);
}

static void add_write(void *privdata) {
        RedisSdevent *e = privdata;
        update_events(e, e->events | EPOLLOUT);
}

static void del_write(void *privdata) {
        RedisSdevent *e = privdata;
        update_events(e, e->events & ~(uint32_t) EPOLLOUT);
}

static void cleanup(void *privdata) {
        RedisSdevent *e = privdata;

        /* The socket is closed right after this hook: out of the epoll set first. */
        update_events(e, 0);
        if (e->on_cleanup)
                e->on_cleanup(e->ac, e->userdata);
        e->ac = NULL;
        if (e->dispatching)
                e->freed = true;
        else
                redis_sdevent_free(e);
}

static int on_io(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        RedisSdevent *e = userdata;

        /* An error or a hang-up is news for whichever direction hiredis waits on: a refused connect shows
         * as EPOLLERR while it waits to write. Either call may free the context (and call cleanup()). */
        e->dispatching = true;
        if ((e->events & EPOLLIN) && (revents & (EPOLLIN | EPOLLHUP | EPOLLERR)))
                redisAsyncHandleRead(e->ac);
        if (!e->freed && (e->events & EPOLLOUT) && (revents & (EPOLLOUT | EPOLLHUP | EPOLLERR)))
                redisAsyncHandleWrite(e->ac);
        e->dispatching = false;
        if (e->freed)
                redis_sdevent_free(e);
        return 0;
}

int redis_sdevent_attach(redisAsyncContext *ac, sd_event *event, RedisSdeventCleanupFn on_cleanup,
                         void *userdata) {
        RedisSdevent *e;
        int r;

        assert_return(ac, -EINVAL);
        assert_return(event, -EINVAL);
        if (ac->ev.data)
                return -EBUSY;
        if (ac->c.fd < 0)
                return -EBADF;

        e = calloc(1, sizeof *e);
        if (!e)
                return -ENOMEM;
        *e = (RedisSdevent) { .ac = ac, .on_cleanup = on_cleanup, .userdata = userdata };

        r = sd_event_add_io(event, &e->io, ac->c.fd, EPOLLIN, on_io, e);
        if (r >= 0)
                r = sd_event_source_set_enabled(e->io, SD_EVENT_OFF);
        if (r < 0) {
                redis_sdevent_free(e);
                return r;
        }
        (void) sd_event_source_set_description(e->io, "redis");

        ac->ev.data = e;
        ac->ev.addRead = add_read;
        ac->ev.delRead = del_read;
        ac->ev.addWrite = add_write;
        ac->ev.delWrite = del_write;
        ac->ev.cleanup = cleanup;
        return 0;
}
