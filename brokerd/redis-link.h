/* SPDX-License-Identifier: MIT */
/* redis-link.h — one logical connection to one Redis, on the event loop: connect, set up, time out,
 * reconnect, and the commands of its owner.
 *
 * A link keeps trying by itself. Each attempt resolves the host off the loop (resolve.h: never a blocking
 * getaddrinfo() on it; hiredis then gets a numeric address, which it does not look up), connects without
 * blocking (a new hiredis context each time, every address of the name in turn), then sets it up:
 * AUTH (when a password file is given), SELECT, INFO (the server's run_id, and maxmemory-policy, which must
 * be noeviction: a pool whose keys Redis may evict cannot keep its promises; with a library, redis_version
 * 7.0 or later), FUNCTION LOAD of the library (redis_link_set_library()), and SCRIPT LOAD of every
 * registered script, so that FCALL and EVALSHA find them. Only then is the link up, and its owner told
 * the run id (another one than last time: Redis restarted, and what it held may be gone).
 *
 * hiredis 0.14 has no command timeout: each command has a deadline here, and one that passes ends the
 * connection (shutdown() of the socket, the context freed, a new one later). Attempts are spaced by a
 * jittered backoff, 100 ms doubling to 5 s, back to 100 ms once up. A configuration error (refused
 * password, no such DB, an eviction policy, not a Redis server, a Redis too old for the library, a script
 * Redis does not compile) makes the
 * link FAILED rather than DOWN: it still retries, at the slowest pace, since only an operator can fix it.
 *
 * No logging here: what a person should read goes to the owner's log callback, what the owner must act on
 * comes as state changes and reply callbacks. Callbacks may free the link (nothing is called after that).
 * Every socket is close-on-exec. hiredis writes with write(): the process ignores SIGPIPE (brokerd does).
 *
 * For Sentinel (sentinel.h): a link may start without an endpoint and be pointed at one later, when the
 * Sentinels name the primary (redis_link_set_endpoint()); a link to a Sentinel itself (.sentinel) skips
 * what only a data node has, and a blocking link may hold one SUBSCRIBE (redis_link_subscribe()). */
#pragma once

#include <errno.h>
#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <systemd/sd-event.h>

#include "redis-endpoint.h"
#include "time-util.h"

typedef struct RedisLink RedisLink;

typedef enum RedisLinkState {
        REDIS_LINK_DOWN,        /* not connected (yet, or any more); retrying */
        REDIS_LINK_UP,          /* set up: commands are sent */
        REDIS_LINK_FAILED,      /* a configuration error; retrying slowly */
        _REDIS_LINK_STATE_MAX,
        _REDIS_LINK_STATE_INVALID = -EINVAL,
} RedisLinkState;

const char *redis_link_state_to_string(RedisLinkState s);

/* A command's outcome. error 0: reply is Redis's answer (an error reply too: REDIS_REPLY_ERROR is an
 * answer), valid during the call only. error < 0, reply NULL: -ETIMEDOUT (its deadline passed),
 * -ECONNRESET (the connection ended first); either way the command may or may not have run. */
typedef void (*RedisReplyFn)(RedisLink *link, int error, const redisReply *reply, void *userdata);

/* A state change, and a change of reason while DOWN or FAILED. detail: UP, the server's run_id; DOWN and
 * FAILED, why, a sentence for the journal. */
typedef void (*RedisLinkStateFn)(RedisLink *link, RedisLinkState state, const char *detail, void *userdata);

/* priority as syslog's (LOG_DEBUG: attempts, retries); message without a newline. */
typedef void (*RedisLinkLogFn)(RedisLink *link, int priority, const char *message, void *userdata);

typedef struct RedisLinkOptions {
        const char *user;               /* ACL user for AUTH; NULL: the default user */
        const char *password_file;      /* NULL: no AUTH; read at each attempt (a rotated password is
                                         * picked up without a reload); one trailing newline is dropped */
        usec_t command_timeout;         /* 0: REDIS_LINK_COMMAND_TIMEOUT_DEFAULT */
        usec_t connect_timeout;         /* resolve + connect + setup; 0: the command timeout */
        usec_t backoff_min, backoff_max; /* 0: 100 ms, 5 s */
        /* A link for blocking reads (XREAD BLOCK): redis_link_command_blocking() is accepted only here, so
         * that a blocked read never delays the commands of another link. */
        bool blocking;
        /* The server is a Sentinel: no SELECT, no scripts, and INFO must say redis_mode:sentinel (instead
         * of role:master and maxmemory-policy noeviction, which are a data node's). */
        bool sentinel;
        /* While up, INFO is read again this often (0: never): a maxmemory-policy other than noeviction or a
         * role other than master fails the link as at connect ("eviction-policy", "replica"), another run id
         * or replication id ends it (the next connect tells the owner the new one). Or with the owner's
         * commands, as often as it says (redis_link_watch_along()). */
        usec_t watch_interval;
        RedisLinkStateFn on_state;
        RedisLinkLogFn on_log;
        uint64_t (*random)(void *userdata); /* backoff jitter; NULL: getrandom() once, then a PRNG */
        void *userdata;                 /* of on_state, on_log and random */
} RedisLinkOptions;

#define REDIS_LINK_COMMAND_TIMEOUT_DEFAULT (2 * USEC_PER_SEC)
#define REDIS_LINK_BACKOFF_MIN_DEFAULT (100 * USEC_PER_MSEC)
#define REDIS_LINK_BACKOFF_MAX_DEFAULT (5 * USEC_PER_SEC)
#define REDIS_LINK_WATCH_INTERVAL_DEFAULT (5 * USEC_PER_SEC) /* ~60 µs of Redis a round: ~12 µs/s */

/* A new link to endpoint; the first attempt starts from the loop, not in here (no callback runs before
 * this returns). endpoint NULL: no attempt until redis_link_set_endpoint(). The endpoint and options are
 * copied. Returns 0, -EINVAL, -ENOMEM or sd-event's error. */
int redis_link_new(sd_event *event, const RedisEndpoint *endpoint, const RedisLinkOptions *options,
                   RedisLink **ret);

/* Closes the connection; no callback is called any more, not even for the commands in flight. */
RedisLink *redis_link_free(RedisLink *link);

/* Points the link at endpoint (TCP or UNIX), e.g. where the Sentinels say the primary is now. The same
 * address as now changes nothing and returns 0. Another one ends the current connection (the owner is
 * told DOWN, its calls get -ECONNRESET) and the next attempt starts at once, with the backoff reset: a
 * move is news, not a failure. Returns 1 if the link moved, 0, -EINVAL, -ENOMEM. */
int redis_link_set_endpoint(RedisLink *link, const RedisEndpoint *endpoint);
/* The endpoint the link connects to; NULL before the first redis_link_set_endpoint() of a link made
 * without one. */
const RedisEndpoint *redis_link_get_endpoint(const RedisLink *link);
/* Ends the current connection and connects again at once (not a failure: the backoff stays), e.g. to end
 * a blocking read that another client could end only with CLIENT UNBLOCK (@admin, which brokerd's ACL user
 * need not have). The owner is told DOWN, its calls get -ECONNRESET, then UP. why: for the debug log.
 * Returns 1, or 0 when there is no connection to end (one is being made, or the link waits). */
int redis_link_reconnect(RedisLink *link, const char *why);

/* Ends the connection and makes no attempt until redis_link_wake(): for a link its owner needs only now and
 * then (a stream read while nothing waits on it), whose connection would otherwise cost the server its
 * upkeep for nothing. The owner is told DOWN ("Resting"), its calls get -ECONNRESET; commands are refused
 * (-ENOTCONN) meanwhile. A new endpoint is kept for the wake. Returns 1, or 0 when resting already. */
int redis_link_rest(RedisLink *link);
/* The next attempt starts now (the backoff reset: a wake is no failure). Returns 1, or 0 when not resting. */
int redis_link_wake(RedisLink *link);
RedisLinkState redis_link_get_state(const RedisLink *link);
/* Why the link is FAILED, in a word for clients and Status ("eviction-policy", "auth", "database",
 * "not-redis", "replica", "script", "redis-version", "password-file"; "not-sentinel" for a .sentinel
 * link); NULL while it is not FAILED. */
const char *redis_link_get_failure(const RedisLink *link);
/* The run id of the server as of the last time the link went up; NULL before. */
const char *redis_link_get_run_id(const RedisLink *link);

/* Registers a Lua script, loaded at every setup from now on (and at once if the link is up), in
 * *ret_handle for redis_link_evalsha(). Returns 0, -ENOMEM. */
int redis_link_add_script(RedisLink *link, const char *source, unsigned *ret_handle);

/* The oldest Redis a link with a library accepts (Redis Functions came with 7.0). */
#define REDIS_LINK_LIBRARY_MIN_MAJOR 7

/* Registers the Redis Functions library source (its first line "#!lua name=NAME"), loaded with FUNCTION
 * LOAD at every setup from now on; a link up already sets up again. The link then needs Redis ≥ 7.0 (INFO's
 * redis_version) and fails ("redis-version") with an older one. Without REPLACE: "already exists" counts
 * as loaded, so a library's name must say its text (shared-scripts.h: a digest in the name). One per link.
 * Returns 0, -EINVAL (no name line), -EBUSY (one already), -ENOMEM. */
int redis_link_set_library(RedisLink *link, const char *source);

/* Sends a command. Returns 0 (fn is then called exactly once, unless the link is freed first),
 * -ENOTCONN at once while the link is not UP, -EINVAL (no argument, or a command that changes the
 * connection's protocol: SUBSCRIBE, MONITOR…), -ENOMEM. */
int redis_link_command(RedisLink *link, RedisReplyFn fn, void *userdata, int argc, const char *const *argv,
                       const size_t *argvlen);

/* The owner is about to send a command: the watch's INFO (options.watch_interval) goes now, ahead of it
 * on the connection, so that the two make one round trip, when half a watch interval has passed since the
 * last one; the link's own timer then waits three intervals (a fallback for an owner that stops sending).
 * An owner that calls this at least every interval has no INFO of its own round trip. Returns 1 (sent), 0
 * (not due, one in flight, not up, or no watch), or a negative errno. */
int redis_link_watch_along(RedisLink *link);
/* The owner will send nothing for a while, and nothing it has could suffer from what the watch checks (an
 * idle node): no INFO of the timer's until the next redis_link_watch_along(), which the owner calls ahead
 * of its next command (a reconnect's setup reads INFO, and wakes the timer). Returns 0, or a negative
 * errno. */
int redis_link_watch_rest(RedisLink *link);

/* The owner is about to send several commands (a flush of its queue): they leave together, in one write
 * at redis_link_uncork(), rather than one loop iteration later when the socket is found writable. The
 * uncork may end the connection (a write that fails): the owner hears it through on_state, as from the
 * loop. Pairs; no-ops while the link has no connection. */
void redis_link_cork(RedisLink *link);
void redis_link_uncork(RedisLink *link);

/* EVALSHA of a registered script with nkeys keys then the other arguments (argc in all, lengths in
 * argvlen; argvlen NULL: strings). A NOSCRIPT reply (SCRIPT FLUSH, a failover) makes the link load the
 * script again and send the call once more (after the commands sent meanwhile); its owner sees the second
 * reply only. Returns as redis_link_command(), and -ENOENT for an unknown handle. */
int redis_link_evalsha(RedisLink *link, unsigned script, RedisReplyFn fn, void *userdata, unsigned nkeys,
                       int argc, const char *const *argv, const size_t *argvlen);

/* FCALL of function (of the library) with nkeys keys then the other arguments, as redis_link_evalsha().
 * "Function not found" (FUNCTION FLUSH, a Redis restarted or failed over without the library) makes the
 * link load the library again and send the call once more; its owner sees the second reply only. Returns
 * as redis_link_command(), and -ENOENT without a library. */
int redis_link_fcall(RedisLink *link, const char *function, RedisReplyFn fn, void *userdata, unsigned nkeys,
                     int argc, const char *const *argv, const size_t *argvlen);

/* A command that may block on the server for up to block (XREAD BLOCK ms): its deadline is block plus the
 * command timeout. Only on a link made with .blocking (else -EINVAL), one at a time (-EBUSY). Returns as
 * redis_link_command(). */
int redis_link_command_blocking(RedisLink *link, usec_t block, RedisReplyFn fn, void *userdata, int argc,
                                const char *const *argv, const size_t *argvlen);

/* A message on a subscribed channel: the channel and the payload, valid during the call only. */
typedef void (*RedisMessageFn)(RedisLink *link, const char *channel, const char *message, size_t len,
                               void *userdata);

/* SUBSCRIBE channel on a .blocking link, now and again after every reconnect (before the owner hears UP,
 * so that a message sent after UP is not missed; one sent while the link was down is, as pub/sub has it:
 * the owner asks again when told UP). The link takes no other command afterwards. Returns 0, -EINVAL (not
 * a blocking link, or a subscription already), -ENOMEM. */
int redis_link_subscribe(RedisLink *link, const char *channel, RedisMessageFn fn, void *userdata);

typedef struct RedisLinkStats {
        usec_t rtt_last;                /* the last command's round trip (blocking ones are not counted) */
        usec_t rtt_avg;                 /* its moving average (1/8 weight to each new sample) */
        uint64_t attempts;              /* connection attempts started */
        uint64_t ups;                   /* how often the link went up */
        uint64_t timeouts;              /* commands that timed out */
        uint64_t script_reloads;        /* NOSCRIPT and "Function not found" replies answered by a reload */
} RedisLinkStats;

void redis_link_get_stats(const RedisLink *link, RedisLinkStats *ret);
