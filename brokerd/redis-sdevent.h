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

/* Attaches ac (fresh from redisAsyncConnect*()) to event. The attachment lives as long as ac: nothing to
 * detach. Returns 0; -EBUSY if ac has an event library already; -EBADF if ac has no socket; or the negative
 * errno of sd-event (ac is then untouched). */
int redis_sdevent_attach(redisAsyncContext *ac, sd_event *event, RedisSdeventCleanupFn on_cleanup,
                         void *userdata);
