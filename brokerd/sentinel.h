/* SPDX-License-Identifier: MIT */
/* sentinel.h — which node is a redis-sentinel:// backend's primary now (SPEC §11, high availability), and
 * whether a majority of the Sentinels still says so.
 *
 * One Sentinel of the list at a time is asked `SENTINEL get-master-addr-by-name MASTER` (on its link of the
 * rounds below), and watched for `+switch-master` (on a subscribed link): a Sentinel that cannot be reached,
 * does not know MASTER, or answers nonsense makes the next one of the list current, the round over the whole
 * list spaced by a backoff. The answer is asked again whenever the watch (re)subscribes (pub/sub loses what is
 * published while not subscribed), and when the owner says the named primary refused or cannot be reached
 * (sentinel_rediscover()).
 *
 * Besides, every second (unless the owner lets them rest: sentinel_set_resting()), a confirmation round asks
 * every Sentinel of the list (a link each): a majority of the list naming the primary confirms it as of the
 * round's start, a majority naming another address moves it there once the primary in use went unconfirmed
 * for a while (sentinel.c says what this promises).
 * A primary that one Sentinel named is unconfirmed until a round confirms it; when a round confirms the
 * primary in use and the Sentinel asked named another, the next one of the list that named it is asked
 * (and watched) instead.
 *
 * This module only says where the primary is; connecting to it, and checking that it is one (INFO's
 * role), is the owner's (backend.c, with redis-link.h). Both links resolve host names off the loop. */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <systemd/sd-event.h>

#include "redis-endpoint.h"
#include "time-util.h"

typedef struct Sentinel Sentinel;

/* The primary is (now) at primary (TCP, with the backend's DB), valid during the call only. failover: the
 * Sentinels moved it (+switch-master, or an answer other than the last one); false for the first answer.
 * previous: the address before, "HOST:PORT", NULL for the first answer. sentinel_get_confirmed() tells
 * already whether it is confirmed (a majority's move) or not (one Sentinel's word). */
typedef void (*SentinelPrimaryFn)(Sentinel *s, const RedisEndpoint *primary, const char *previous, bool failover,
                                  void *userdata);

/* A confirmation round that began at round_boot (CLOCK_BOOTTIME) ended, or confirmed the primary before its end
 * (a majority of the Sentinels named it: called again at the end then); confirmed: sentinel_get_confirmed(). */
typedef void (*SentinelRoundFn)(Sentinel *s, usec_t confirmed, usec_t round_boot, void *userdata);

/* How old a confirmation may be for the owner to grant on the primary: three rounds, so that one slow or
 * lost round costs nothing. */
#define SENTINEL_CONFIRM_STALE (3 * USEC_PER_SEC)

typedef struct SentinelOptions {
        const char *password_file;      /* the Sentinels' (backend-sentinel-password-file=); NULL: no AUTH */
        usec_t command_timeout;         /* 0: 1 s; also what a round waits at most for an answer */
        SentinelPrimaryFn on_primary;
        SentinelRoundFn on_round;       /* may be NULL */
        void *userdata;
} SentinelOptions;

/* Starts asking the Sentinels of endpoint (REDIS_ENDPOINT_SENTINEL), from the loop. Returns 0, -EINVAL,
 * -ENOMEM or sd-event's error. */
int sentinel_new(sd_event *event, const RedisEndpoint *endpoint, const SentinelOptions *options, Sentinel **ret);
Sentinel *sentinel_free(Sentinel *s);

/* The primary named last refused to be one (a replica) or cannot be reached: ask again now. */
void sentinel_rediscover(Sentinel *s);
/* The rounds rest (the owner holds nothing a confirmation would guard: each round is a question to every
 * Sentinel, which thousands of idle brokerds would ask every second for nothing), or go again: a round at
 * once (after the one under way, if any), then every second. The watch and the question where the primary
 * is go on either way. */
void sentinel_set_resting(Sentinel *s, bool resting);

/* "HOST:PORT" of the primary named last; NULL before the first answer. */
const char *sentinel_get_primary(const Sentinel *s);
/* "HOST:PORT" of the Sentinel asked now. */
const char *sentinel_get_current(const Sentinel *s);
/* Failovers seen (primary changes after the first answer), and the realtime of the last one (0: none). */
uint64_t sentinel_get_failovers(const Sentinel *s);
usec_t sentinel_get_last_failover(const Sentinel *s);
/* The CLOCK_BOOTTIME start of the last round in which a majority of the list named the primary in use; 0:
 * none ever did, or the primary in use is one Sentinel's word (an answer, +switch-master) that no round
 * has confirmed yet. When it changes with the primary, the owner learns it within on_primary. */
usec_t sentinel_get_confirmed(const Sentinel *s);

typedef enum SentinelVerdict {
        SENTINEL_VERDICT_NONE,          /* no majority, or one for another node while the primary is fresh */
        SENTINEL_VERDICT_CONFIRM,       /* a majority named the primary in use */
        SENTINEL_VERDICT_MOVE,          /* a majority named another node, and the primary in use is stale */
        _SENTINEL_VERDICT_MAX,
        _SENTINEL_VERDICT_INVALID = -EINVAL,
} SentinelVerdict;

/* What a round decides (pure: exposed for its unit test). answers: each Sentinel of the list's answer,
 * "HOST:PORT", or NULL (none, or nonsense), n of them; primary: the one in use ("" or NULL: none yet);
 * stale: it went unconfirmed for SENTINEL_CONFIRM_STALE (or never was). For MOVE, *ret_index is the index
 * of an answer naming the node (untouched otherwise). */
SentinelVerdict sentinel_round_verdict(const char *const *answers, size_t n, const char *primary, bool stale,
                                       size_t *ret_index);
