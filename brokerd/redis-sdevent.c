/* SPDX-License-Identifier: MIT */
#include <stdalign.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>

#include "macro.h"
#include "redis-sdevent.h"

typedef struct RedisSdevent {
        redisAsyncContext *ac;
        sd_event_source *io;
        uint32_t events;                /* EPOLLIN, EPOLLOUT: what hiredis asked for */
        uint32_t applied;               /* what the io source watches */
        bool corked;                    /* redis_sdevent_cork(): events are noted, not applied */
        bool dispatching;               /* inside on_io(): hiredis may free the context under us */
        bool freed;                     /* the cleanup hook ran while dispatching: on_io() frees this */
        RedisSdeventCleanupFn on_cleanup;
        void *userdata;
        /* The reply being read: what it cost so far, against the caps. */
        size_t reply_bytes, reply_values;
        const char *overflow;
        bool pubsub_root;               /* the reply being read is a pub/sub message (its elements checked) */
        char *channel;                  /* redis_sdevent_set_channel()'s: the only one a message may name */
        const char *unexpected;         /* why a reply was refused by reply_expected() */
} RedisSdevent;

static RedisSdevent *redis_sdevent_free(RedisSdevent *e) {
        if (!e)
                return NULL;
        sd_event_source_disable_unref(e->io);
        free(e->channel);
        return mfree(e);
}

/* sd-event reports EPOLLHUP and EPOLLERR whatever the mask, so a source without interest is disabled
 * rather than left to spin. A failing epoll_ctl() cannot be returned through hiredis's void hooks: the
 * context then hangs until its owner's command timeout frees it. */
static void apply_events(RedisSdevent *e) {
        if (e->corked || e->applied == e->events)
                return;
        e->applied = e->events;
        if (e->events != 0)
                (void) sd_event_source_set_io_events(e->io, e->events);
        (void) sd_event_source_set_enabled(e->io, e->events != 0 ? SD_EVENT_ON : SD_EVENT_OFF);
}

static void update_events(RedisSdevent *e, uint32_t events) {
        e->events = events;
        apply_events(e);
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

/* ---- replies that no command asked for ---- */

/* hiredis 0.14 asserts (an abort, whatever the build) on replies that a server sends unasked: one that is no
 * error while no callback waits on a context that is not subscribed (redisProcessCallbacks()), and, while
 * subscribed, a message shorter than 2 elements or whose elements 0 and 1 are not bulk strings, or an
 * unsubscribe of fewer than 3 (__redisGetSubscribeCallback()); an unsubscribe that leaves subscribed mode
 * makes the next message one of the first kind. A message whose channel it does not know, or a reply that
 * is no array while no command waits (a nil array too), runs the callback of the reply before it again (its
 * cb is not reset).
 * Such a reply is refused here, before hiredis sees it: the read fails and the context ends (its replies
 * come back empty), and redis_sdevent_get_unexpected() says why. Error replies are left to hiredis: it
 * ends the context with their text (Redis's "max number of clients reached"). */
static bool reply_expected(RedisSdevent *e, const redisReadTask *task, int type, const char *s, size_t len) {
        const redisAsyncContext *ac = e->ac;
        if (!task->parent) {
                e->pubsub_root = false;
                if (type == REDIS_REPLY_ERROR || ac->replies.head)
                        return true; /* a regular command's, first in line (even while subscribed) */
                if (!(ac->c.flags & REDIS_SUBSCRIBED)) {
                        e->unexpected = "A reply to no command";
                        return false;
                }
                if (type != REDIS_REPLY_ARRAY) {
                        if (ac->sub.invalid.head)
                                return true; /* a command's sent while subscribed */
                        e->unexpected = "A pub/sub message that is no array";
                        return false;
                }
                /* The array's element count is checked by create_array(), the only caller with a root array. */
                e->pubsub_root = true;
                return true;
        }
        if (!e->pubsub_root || task->parent->parent || task->idx > 1)
                return true;
        /* Element 0, the kind, and 1, the channel: brokerd subscribes to one channel and never unsubscribes. */
        if (type != REDIS_REPLY_STRING) {
                e->unexpected = "A pub/sub message whose kind or channel is no string";
                return false;
        }
        if (task->idx == 0 && !(len == 9 && strncasecmp(s, "subscribe", len) == 0) &&
            !(len == 7 && strncasecmp(s, "message", len) == 0)) {
                e->unexpected = "A pub/sub message of another kind than subscribe or message";
                return false;
        }
        if (task->idx == 1 && (!e->channel || strlen(e->channel) != len || memcmp(s, e->channel, len) != 0)) {
                e->unexpected = "A pub/sub message of a channel not subscribed";
                return false;
        }
        return true;
}

/* ---- the caps on a reply (REDIS_REPLY_*_MAX) ---- */

/* The reader's object functions (below). The table is static: hiredis still uses it after the cleanup
 * hook (the reader frees its partial reply last, with no RedisSdevent left). */
static redisReplyObjectFunctions counting_fn;

/* Counts an object of the reply being read (the first of a reply starts it: its task has no parent).
 * Returns false, and marks the context, past a cap: hiredis then fails the read as out of memory and ends
 * the context, before the object is made (an array's element table is allocated as announced). */
static bool reply_count(RedisSdevent *e, const redisReadTask *task, size_t bytes, size_t values) {
        if (!task->parent)
                e->reply_bytes = e->reply_values = 0;
        e->reply_bytes += bytes;
        e->reply_values += values;
        if (e->reply_bytes <= REDIS_REPLY_BYTES_MAX && e->reply_values <= REDIS_REPLY_VALUES_MAX)
                return true;
        e->overflow = e->reply_bytes > REDIS_REPLY_BYTES_MAX ? "A reply larger than 4 MiB" :
                                                               "A reply of more than 262144 values";
        return false;
}

/* A reply's objects, as hiredis's own (redisReply: the callbacks see no difference), but carved from
 * blocks that the reply owns and freed with it at once: hiredis's calloc() and free() per value were a
 * fifth of a shared pool's cost per message in brokerd (issue 21: tests/bench/README.md). */
#define REPLY_BLOCK_FIRST 2048U
#define REPLY_BLOCK_MAX (64U * 1024)

typedef struct ReplyBlock {
        struct ReplyBlock *prev;
        size_t used, size;
        _Alignas(max_align_t) unsigned char data[];
} ReplyBlock;

typedef struct ReplyObject {
        struct ReplyObject *root; /* the reply's first object, which holds the blocks */
        ReplyBlock *blocks;       /* root only: the newest block */
        redisReply reply;
} ReplyObject;

static void *reply_alloc(ReplyObject *root, size_t size) {
        size = (size + alignof(max_align_t) - 1) & ~(alignof(max_align_t) - 1);
        ReplyBlock *b = root->blocks;
        if (b->size - b->used < size) {
                size_t n = MAX(MIN(b->size * 2, (size_t) REPLY_BLOCK_MAX), size);
                ReplyBlock *nb = malloc(sizeof(ReplyBlock) + n);
                if (!nb)
                        return NULL;
                *nb = (ReplyBlock) { .prev = b, .size = n };
                root->blocks = b = nb;
        }
        void *p = b->data + b->used;
        b->used += size;
        return p;
}

/* An object of the reply being read, linked into its parent array as hiredis's are. */
static redisReply *reply_object_new(const redisReadTask *task, int type, size_t extra, void **ret_extra) {
        ReplyObject *o;
        if (!task->parent) {
                ReplyBlock *b = malloc(sizeof(ReplyBlock) + REPLY_BLOCK_FIRST);
                if (!b)
                        return NULL;
                *b = (ReplyBlock) { .size = REPLY_BLOCK_FIRST };
                o = (ReplyObject *) b->data;
                b->used = (sizeof *o + alignof(max_align_t) - 1) & ~(alignof(max_align_t) - 1);
                *o = (ReplyObject) { .root = o, .blocks = b };
        } else {
                redisReply *parent = task->parent->obj;
                ReplyObject *root = container_of(parent, ReplyObject, reply)->root;
                o = reply_alloc(root, sizeof *o);
                if (!o)
                        return NULL;
                *o = (ReplyObject) { .root = root };
        }
        if (extra > 0 && !(*ret_extra = reply_alloc(o->root, extra))) {
                if (!task->parent)
                        free(o->blocks);
                return NULL;
        }
        o->reply.type = type;
        if (task->parent) {
                redisReply *parent = task->parent->obj;
                if (parent->type == REDIS_REPLY_ARRAY && (size_t) task->idx < parent->elements)
                        parent->element[task->idx] = &o->reply;
        }
        return &o->reply;
}

static void reply_object_free(void *obj) {
        if (!obj)
                return;
        ReplyObject *o = container_of(obj, ReplyObject, reply);
        if (o->root != o)
                return; /* a part of a reply: freed with it */
        for (ReplyBlock *b = o->blocks, *prev; b; b = prev) {
                prev = b->prev;
                free(b);
        }
}

static void *create_string(const redisReadTask *task, char *s, size_t len) {
        RedisSdevent *e = task->privdata;
        if (!reply_expected(e, task, task->type, s, len) || !reply_count(e, task, len, 1))
                return NULL;
        void *extra = NULL;
        redisReply *r = reply_object_new(task, task->type, len + 1, &extra);
        if (!r)
                return NULL;
        char *str = extra;
        memcpy(str, s, len);
        str[len] = '\0';
        r->str = str;
        r->len = len;
        return r;
}

static void *create_array(const redisReadTask *task, int elements) {
        RedisSdevent *e = task->privdata;
        if (!reply_expected(e, task, REDIS_REPLY_ARRAY, NULL, 0))
                return NULL;
        if (!task->parent && e->pubsub_root && elements != 3) {
                e->unexpected = "A pub/sub message of another length than 3";
                return NULL;
        }
        /* The elements are counted as announced: their table is allocated now. */
        if (!reply_count(e, task, 0, 1 + (size_t) MAX(elements, 0)))
                return NULL;
        size_t n = (size_t) MAX(elements, 0);
        void *extra = NULL;
        redisReply *r = reply_object_new(task, REDIS_REPLY_ARRAY, n * sizeof(redisReply *), &extra);
        if (!r)
                return NULL;
        if (n > 0)
                memset(extra, 0, n * sizeof(redisReply *));
        r->element = extra;
        r->elements = n;
        return r;
}

static void *create_integer(const redisReadTask *task, long long value) {
        RedisSdevent *e = task->privdata;
        if (!reply_expected(e, task, REDIS_REPLY_INTEGER, NULL, 0) || !reply_count(e, task, 0, 1))
                return NULL;
        redisReply *r = reply_object_new(task, REDIS_REPLY_INTEGER, 0, NULL);
        if (r)
                r->integer = value;
        return r;
}

static void *create_nil(const redisReadTask *task) {
        RedisSdevent *e = task->privdata;
        return reply_expected(e, task, REDIS_REPLY_NIL, NULL, 0) && reply_count(e, task, 0, 1) ?
                       reply_object_new(task, REDIS_REPLY_NIL, 0, NULL) : NULL;
}

/* After a read: what waits in the buffer for the rest of a reply counts too (a bulk string is kept whole
 * until its last byte came). hiredis reads 16 KiB at a time, so this is checked often enough. */
static bool buffer_over_cap(RedisSdevent *e) {
        const redisReader *r = e->ac->c.reader;
        if (!r || r->len - MIN(r->pos, r->len) <= REDIS_REPLY_BYTES_MAX)
                return false;
        e->overflow = "A reply larger than 4 MiB";
        return true;
}

const char *redis_sdevent_get_overflow(const redisAsyncContext *ac) {
        const RedisSdevent *e = ac ? ac->ev.data : NULL;
        return e ? e->overflow : NULL;
}

const char *redis_sdevent_get_unexpected(const redisAsyncContext *ac) {
        const RedisSdevent *e = ac ? ac->ev.data : NULL;
        return e ? e->unexpected : NULL;
}

int redis_sdevent_set_channel(redisAsyncContext *ac, const char *channel) {
        RedisSdevent *e = ac ? ac->ev.data : NULL;
        assert_return(e && channel, -EINVAL);
        char *c = strdup(channel);
        if (!c)
                return -ENOMEM;
        free(e->channel);
        e->channel = c;
        return 0;
}

static void cleanup(void *privdata) {
        RedisSdevent *e = privdata;

        /* The socket is closed right after this hook: out of the epoll set first. */
        e->corked = false;
        update_events(e, 0);
        if (e->on_cleanup)
                e->on_cleanup(e->ac, e->userdata);
        /* Nothing more is read: no object function may reach e after this. */
        if (e->ac->c.reader)
                e->ac->c.reader->privdata = NULL;
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
        if ((e->events & EPOLLIN) && (revents & (EPOLLIN | EPOLLHUP | EPOLLERR))) {
                redisAsyncHandleRead(e->ac);
                /* Not in a callback here: the context may be freed (its replies come back empty). */
                if (!e->freed && buffer_over_cap(e))
                        redisAsyncFree(e->ac);
        }
        if (!e->freed && (e->events & EPOLLOUT) && (revents & (EPOLLOUT | EPOLLHUP | EPOLLERR)))
                redisAsyncHandleWrite(e->ac);
        e->dispatching = false;
        if (e->freed)
                redis_sdevent_free(e);
        return 0;
}

void redis_sdevent_cork(redisAsyncContext *ac) {
        RedisSdevent *e = ac ? ac->ev.data : NULL;
        if (e)
                e->corked = true;
}

void redis_sdevent_uncork(redisAsyncContext *ac) {
        RedisSdevent *e = ac ? ac->ev.data : NULL;
        if (!e || !e->corked)
                return;
        e->corked = false;
        /* Connected, with commands to send: they go now; hiredis then asks for what remains (EPOLLOUT after a
         * partial write, EPOLLIN for the replies). A write that fails ends the context, as in on_io(). */
        if (!e->dispatching && (ac->c.flags & REDIS_CONNECTED) && (e->events & EPOLLOUT)) {
                e->dispatching = true;
                redisAsyncHandleWrite(ac);
                e->dispatching = false;
                if (e->freed) {
                        redis_sdevent_free(e);
                        return;
                }
        }
        apply_events(e);
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

        /* The reader counts each reply against the caps (its privdata reaches the object functions). */
        if (!counting_fn.freeObject) {
                counting_fn = (redisReplyObjectFunctions) {
                        .createString = create_string,
                        .createArray = create_array,
                        .createInteger = create_integer,
                        .createNil = create_nil,
                        .freeObject = reply_object_free,
                };
        }
        ac->c.reader->fn = &counting_fn;
        ac->c.reader->privdata = e;

        ac->ev.data = e;
        ac->ev.addRead = add_read;
        ac->ev.delRead = del_read;
        ac->ev.addWrite = add_write;
        ac->ev.delWrite = del_write;
        ac->ev.cleanup = cleanup;
        return 0;
}
