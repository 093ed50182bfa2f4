/* SPDX-License-Identifier: MIT */
/* redis-sdevent.h — a hiredis 0.14 asynchronous context on an sd-event loop (its event library hooks).
 *
 * hiredis asks for read and write interest through five hooks (addRead, delRead, addWrite, delWrite,
 * cleanup); here they drive one io source. hiredis ≥ 1.2 ships such an adapter (adapters/libsdevent.h);
 * Debian 12's 0.14.1 does not. Its cleanup hook is also the one moment hiredis tells about the end of a
 * context whether it ever connected or not (its disconnect callback runs only for connected ones, and
 * after the cleanup), so the owner may be told through on_cleanup. */
#pragma once

#include <hiredis/async.h>
#include <systemd/sd-event.h>

/* Called once, from hiredis's cleanup hook, while hiredis frees ac: every reply callback has run, ac->err
 * and ac->errstr say why it ended (0: freed on request). ac must not be used after it returns. */
typedef void (*RedisSdeventCleanupFn)(redisAsyncContext *ac, void *userdata);

/* What one reply may cost (SPEC §11: whatever answers at a backend's address is untrusted). hiredis 0.14
 * has no limit of its own: a bulk string announced as 2 GB is buffered until it is complete, an array of
 * 2^31 elements is allocated as announced. Past either cap the context is ended at once (its replies come
 * back empty) and redis_sdevent_get_overflow() says so. */
#define REDIS_REPLY_BYTES_MAX (4U * 1024 * 1024)   /* strings of one reply, and bytes buffered unparsed */
#define REDIS_REPLY_VALUES_MAX (256U * 1024)       /* strings, integers, nils and arrays of one reply */

/* Attaches ac (fresh from redisAsyncConnect*()) to event. The attachment lives as long as ac: nothing to
 * detach. Returns 0; -EBUSY if ac has an event library already; -EBADF if ac has no socket; or the negative
 * errno of sd-event (ac is then untouched). */
int redis_sdevent_attach(redisAsyncContext *ac, sd_event *event, RedisSdeventCleanupFn on_cleanup,
                         void *userdata);

/* Why ac is being ended for a reply over the caps (a sentence, static), or NULL. Valid until the cleanup
 * hook returns. */
const char *redis_sdevent_get_overflow(const redisAsyncContext *ac);

/* Why ac is being ended for a reply that no command asked for (a sentence, static), or NULL; valid as the
 * above. hiredis 0.14 aborts the process on such replies (redis-sdevent.c, reply_expected()): they are
 * refused before it sees them, and the context ends. */
const char *redis_sdevent_get_unexpected(const redisAsyncContext *ac);

/* The channel that ac subscribes to (brokerd's links subscribe to one at most): a pub/sub message of any
 * other is refused as unexpected. Returns 0, -EINVAL (ac not attached), or -ENOMEM. */
int redis_sdevent_set_channel(redisAsyncContext *ac, const char *channel);

/* While corked, hiredis's calls for write interest are noted but no epoll_ctl() is made; uncorking writes
 * what the commands queued since left in hiredis's buffer at once (connected contexts), then watches for
 * what remains. A batch of commands then leaves in one write() without waiting one loop iteration for
 * EPOLLOUT (and its two epoll_ctl()). The uncork may end ac (a failed write: its cleanup runs in it). */
void redis_sdevent_cork(redisAsyncContext *ac);
void redis_sdevent_uncork(redisAsyncContext *ac);
