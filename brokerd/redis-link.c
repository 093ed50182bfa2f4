/* SPDX-License-Identifier: MIT */
#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/async.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <syslog.h>

#include "macro.h"
#include "redis-link.h"
#include "redis-sdevent.h"
#include "resolve.h"

#define MAX_ADDRESSES 8

/* Where an attempt is. UP is the only phase in which the owner's commands are sent. */
typedef enum LinkPhase {
        PHASE_IDLE,             /* no context: waiting for the retry timer */
        PHASE_RESOLVING,        /* a lookup in flight (resolve.h) */
        PHASE_CONNECTING,       /* context made, connect() in progress */
        PHASE_SETUP,            /* connected: AUTH, SELECT, INFO, FUNCTION LOAD, SCRIPT LOAD in flight */
        PHASE_UP,
        PHASE_CLOSING,          /* the context is ending (its pending replies come back empty) */
} LinkPhase;

typedef struct RedisScript {
        char *source;
        char *sha;              /* from SCRIPT LOAD; NULL until then (EVAL is sent instead) */
} RedisScript;

typedef struct RedisCall RedisCall;

/* One command in flight. hiredis holds it as its reply callback's privdata and calls that exactly once
 * (with a reply, or NULL when the context ends): that call frees it, or sends it again (NOSCRIPT). */
struct RedisCall {
        RedisLink *link;
        RedisCall *prev, *next;         /* link->calls, in the order replies come back */
        RedisReplyFn fn;
        void *userdata;
        usec_t sent;
        usec_t timeout;                 /* the command timeout, plus the block of a blocking command */
        bool blocking;
        bool timed_out;                 /* its deadline ended the connection */
        bool retried;                   /* NOSCRIPT or "Function not found" was answered once already */
        bool fcall;                     /* a call of the library's */
        int script;                     /* an evalsha's handle, or -1 */
        char *cmd;                      /* the formatted command, kept by an evalsha or fcall for a retry */
        size_t cmd_len;
};

struct RedisLink {
        unsigned n_ref;                 /* the owner's, the live context's, and a dispatch's in progress */
        bool closed;                    /* redis_link_free() was called: no callback any more */
        sd_event *event;
        RedisEndpoint endpoint;
        bool has_endpoint;              /* false until redis_link_set_endpoint() for a link made without */
        bool moved;                     /* the endpoint changed: the next attempt starts at once */
        bool resting;                   /* redis_link_rest(): no connection, no attempt, until redis_link_wake() */
        RedisLinkOptions options;       /* strings owned: user, password_file */

        LinkPhase phase;
        redisAsyncContext *ac;
        ResolveQuery *query;
        sd_event_source *retry_timer;
        sd_event_source *timeout_timer;
        usec_t attempt_deadline;        /* resolve + connect + setup */
        char addresses[MAX_ADDRESSES][INET6_ADDRSTRLEN];
        size_t n_addresses, address;    /* resolved, and the one being tried */
        char *password;                 /* read for this attempt */
        size_t setup_pending;           /* setup replies still expected */

        /* Why the context is being ended, set by link_end() before hiredis frees it (else hiredis ended it). */
        bool ending;
        RedisLinkState end_state;
        char *end_reason;
        const char *failure;            /* static: why the link is FAILED, in a word (redis_link_get_failure()) */
        bool in_connect_callback;       /* hiredis uses the context after it: no free from in there */

        RedisCall *calls, *calls_tail;
        usec_t head_since;              /* when the oldest call became the oldest */
        bool blocking_in_flight;

        RedisScript *scripts;
        size_t n_scripts;
        char *library;                  /* redis_link_set_library()'s source; NULL: none (any Redis will do) */

        char *channel;                  /* redis_link_subscribe()'s, subscribed at every setup */
        RedisMessageFn message_fn;
        void *message_userdata;

        usec_t backoff;
        uint64_t prng;
        RedisLinkState state;           /* as last told the owner */
        char *state_detail;
        bool state_told;
        char *run_id;                   /* INFO's run_id, then "/" and master_replid on a data node */
        RedisLinkStats stats;

        sd_event_source *watch_timer;   /* options.watch_interval: INFO again while up */
        bool watch_in_flight;
        bool watch_resting;             /* redis_link_watch_rest(): no INFO of the timer's until watch_along() */
        bool watch_all;                 /* INFO with several sections was refused (Redis < 7): plain INFO */
        usec_t watch_last;              /* monotonic: the last INFO sent (at setup, by the timer or along) */
};

static void link_attempt_failed(RedisLink *link, RedisLinkState state, const char *reason);
static void link_arm_timeout(RedisLink *link);

static const char *const redis_link_state_table[_REDIS_LINK_STATE_MAX] = {
        [REDIS_LINK_DOWN] = "down",
        [REDIS_LINK_UP] = "up",
        [REDIS_LINK_FAILED] = "failed",
};

DEFINE_STRING_TABLE_TO_STRING(, redis_link_state, RedisLinkState, _REDIS_LINK_STATE_MAX)

static RedisLink *link_ref(RedisLink *link) {
        link->n_ref++;
        return link;
}

static void link_destroy(RedisLink *link) {
        resolve_query_free(link->query);
        sd_event_source_disable_unref(link->retry_timer);
        sd_event_source_disable_unref(link->timeout_timer);
        sd_event_source_disable_unref(link->watch_timer);
        sd_event_unref(link->event);
        redis_endpoint_done(&link->endpoint);
        free((char *) link->options.user);
        free((char *) link->options.password_file);
        for (size_t i = 0; i < link->n_scripts; i++) {
                free(link->scripts[i].source);
                free(link->scripts[i].sha);
        }
        free(link->scripts);
        free(link->library);
        free(link->password);
        free(link->end_reason);
        free(link->state_detail);
        free(link->run_id);
        free(link->channel);
        free(link);
}

static void link_unref(RedisLink *link) {
        if (link && --link->n_ref == 0)
                link_destroy(link);
}

_printf_(3, 4) static void link_log(RedisLink *link, int priority, const char *format, ...) {
        char buf[512];
        va_list ap;

        if (link->closed || !link->options.on_log)
                return;
        va_start(ap, format);
        (void) vsnprintf(buf, sizeof buf, format, ap);
        va_end(ap);
        link->options.on_log(link, priority, buf, link->options.userdata);
}

/* Tells the owner, if anything changed. The owner may free the link: callers return right after. */
static void link_tell(RedisLink *link, RedisLinkState state, const char *detail) {
        char *copy = NULL;

        if (link->closed)
                return;
        if (link->state_told && link->state == state && streq_ptr(link->state_detail, detail))
                return;
        if (strdup_or_null(detail, &copy) < 0)
                return; /* told next time */
        free(link->state_detail);
        link->state_detail = copy;
        link->state = state;
        link->state_told = true;
        if (link->options.on_state)
                link->options.on_state(link, state, detail, link->options.userdata);
}

static uint64_t link_random(RedisLink *link) {
        if (link->options.random)
                return link->options.random(link->options.userdata);
        /* xorshift64*: jitter only needs to differ between brokerds, not to be secret. */
        link->prng ^= link->prng >> 12;
        link->prng ^= link->prng << 25;
        link->prng ^= link->prng >> 27;
        return link->prng * UINT64_C(2685821657736338717);
}

/* The delay before the next attempt: between half and all of the current step, so that brokerds that lost
 * Redis together do not come back together; the step doubles up to its maximum. A configuration error
 * waits the longest step at once: only an operator can fix it. */
static usec_t link_next_delay(RedisLink *link, RedisLinkState state) {
        usec_t step = state == REDIS_LINK_FAILED ? link->options.backoff_max : link->backoff;

        link->backoff = MIN(link->backoff * 2, link->options.backoff_max);
        return step / 2 + link_random(link) % (step / 2 + 1);
}

static void call_free(RedisCall *call) {
        if (!call)
                return;
        redisFreeCommand(call->cmd);
        free(call);
}

static void link_calls_append(RedisLink *link, RedisCall *call, usec_t now) {
        call->prev = link->calls_tail;
        call->next = NULL;
        if (link->calls_tail)
                link->calls_tail->next = call;
        else {
                link->calls = call;
                link->head_since = now;
        }
        link->calls_tail = call;
        if (call->blocking)
                link->blocking_in_flight = true;
}

static void link_calls_remove(RedisLink *link, RedisCall *call, usec_t now) {
        if (call == link->calls)
                link->head_since = now;
        if (call->prev)
                call->prev->next = call->next;
        else
                link->calls = call->next;
        if (call->next)
                call->next->prev = call->prev;
        else
                link->calls_tail = call->prev;
        call->prev = call->next = NULL;
        if (call->blocking)
                link->blocking_in_flight = false;
}

/* Replies come back in order: the oldest call is the one late. It was not late while an older one (a
 * blocking read) held the connection, so its time counts from when it became the oldest, too. */
static usec_t call_deadline(const RedisLink *link, const RedisCall *call) {
        return MAX(usec_add(call->sent, call->timeout), usec_add(link->head_since, call->timeout));
}

/* Ends the current context: pending calls come back with -ECONNRESET (-ETIMEDOUT for one marked so), then
 * on_context_end() reports state and reason. hiredis frees it at once, or after the reply callback it is
 * in. From its connect callback, which hiredis follows with a write, only the shutdown(): that write fails
 * (or the read after it sees the end) and hiredis frees the context itself. */
static void link_end(RedisLink *link, RedisLinkState state, const char *reason) {
        redisAsyncContext *ac = link->ac;

        if (!ac || link->ending)
                return;
        link->ending = true;
        link->end_state = state;
        free(link->end_reason);
        link->end_reason = reason ? strdup(reason) : NULL;
        if (link->phase == PHASE_UP)
                link->phase = PHASE_CLOSING;
        /* shutdown() first: the connection dies even if a copy of the socket lives on somewhere. */
        if (ac->c.fd >= 0)
                (void) shutdown(ac->c.fd, SHUT_RDWR);
        if (!link->in_connect_callback)
                redisAsyncFree(ac);
}

static bool reply_is_error(const redisReply *r) {
        return r && r->type == REDIS_REPLY_ERROR;
}

static const char *reply_text(const redisReply *r) {
        if (!r)
                return "no reply";
        if (r->type == REDIS_REPLY_ERROR || r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_STRING)
                return r->str;
        return "an unexpected reply";
}

/* The owner's view of a failed connection: transient (Redis loading, a failover under way) or a
 * configuration an operator must fix. */
static RedisLinkState classify_error_reply(const char *text) {
        static const char *const transient[] = { "LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN" };

        for (size_t i = 0; i < ELEMENTSOF(transient); i++)
                if (strncmp(text, transient[i], strlen(transient[i])) == 0)
                        return REDIS_LINK_DOWN;
        return REDIS_LINK_FAILED;
}

static void on_reply(redisAsyncContext *ac, void *r, void *privdata);

/* Hands call (its cmd formatted) to hiredis. Returns 0, or -ENOTCONN when the context takes no more
 * commands (it is ending); call is then still the caller's. */
static int link_send_call(RedisLink *link, RedisCall *call, const char *cmd, size_t len) {
        usec_t now = now_monotonic();

        if (!link->ac || link->ending)
                return -ENOTCONN;
        if (redisAsyncFormattedCommand(link->ac, on_reply, call, cmd, len) != REDIS_OK)
                return -ENOTCONN;
        call->sent = now;
        link_calls_append(link, call, now);
        link_arm_timeout(link);
        return 0;
}

typedef struct SendArgs {
        RedisReplyFn fn;
        void *userdata;
        usec_t block;           /* a blocking command's block; 0: none */
        bool blocking;
        bool fcall;             /* a call of the library's (kept for a retry) */
        int script;             /* -1: not an evalsha (nothing kept for a retry) */
} SendArgs;

static size_t decimal_length(size_t n) {
        size_t d = 1;
        while (n >= 10) {
                n /= 10;
                d++;
        }
        return d;
}

static char *decimal_put(char *p, char prefix, size_t n) {
        size_t d = decimal_length(n);
        *p++ = prefix;
        for (size_t i = d; i > 0; i--, n /= 10)
                p[i - 1] = (char) ('0' + n % 10);
        p += d;
        *p++ = '\r';
        *p++ = '\n';
        return p;
}

/* What redisFormatCommandArgv() makes (a RESP array of bulk strings, malloc()ed: redisFreeCommand() frees
 * it), without its sprintf() per argument: a third of a script call's formatting in brokerd (issue 21). */
static int command_format(char **ret, int argc, const char *const *argv, const size_t *argvlen) {
        size_t total = 1 + decimal_length((size_t) argc) + 2;
        for (int i = 0; i < argc; i++) {
                size_t l = argvlen ? argvlen[i] : strlen(argv[i]);
                total += 1 + decimal_length(l) + 2 + l + 2;
        }
        if (total > INT_MAX)
                return -ENOMEM;
        char *cmd = malloc(total + 1), *p = cmd;
        if (!cmd)
                return -ENOMEM;
        p = decimal_put(p, '*', (size_t) argc);
        for (int i = 0; i < argc; i++) {
                size_t l = argvlen ? argvlen[i] : strlen(argv[i]);
                p = decimal_put(p, '$', l);
                memcpy(p, argv[i], l);
                p += l;
                *p++ = '\r';
                *p++ = '\n';
        }
        *p = '\0';
        *ret = cmd;
        return (int) total;
}

static int link_send(RedisLink *link, const SendArgs *a, int argc, const char *const *argv, const size_t *argvlen) {
        RedisCall *call;
        char *cmd = NULL;
        int len, r;

        len = command_format(&cmd, argc, argv, argvlen);
        if (len < 0)
                return -ENOMEM;
        call = calloc(1, sizeof *call);
        if (!call) {
                redisFreeCommand(cmd);
                return -ENOMEM;
        }
        *call = (RedisCall) {
                .link = link,
                .fn = a->fn,
                .userdata = a->userdata,
                .timeout = usec_add(link->options.command_timeout, a->block),
                .blocking = a->blocking,
                .fcall = a->fcall,
                .script = a->script,
        };
        r = link_send_call(link, call, cmd, (size_t) len);
        if (r < 0 || (a->script < 0 && !a->fcall))
                redisFreeCommand(cmd);
        else {
                call->cmd = cmd;
                call->cmd_len = (size_t) len;
        }
        if (r < 0)
                call_free(call);
        return r;
}

/* The link's own commands (setup, reloads): their replies come to fn with the link as userdata's owner. */
static int link_send_internal(RedisLink *link, RedisReplyFn fn, uintptr_t tag, int argc, const char *const *argv) {
        const SendArgs a = { .fn = fn, .userdata = (void *) tag, .script = -1 };
        return link_send(link, &a, argc, argv, NULL);
}

/* SCRIPT LOAD's answer: 40 hex digits, which go back in every EVALSHA. */
static bool sha_is_valid(const redisReply *r) {
        if (r->len != 40 || strlen(r->str) != 40)
                return false;
        for (size_t i = 0; i < 40; i++)
                if (!strchr("0123456789abcdef", r->str[i]))
                        return false;
        return true;
}

static void on_script_loaded(RedisLink *link, int error, const redisReply *reply, void *userdata) {
        RedisScript *s = &link->scripts[(uintptr_t) userdata];
        char *sha;

        if (error < 0)
                return; /* the connection ended: loaded at the next setup */
        if (!reply || reply->type != REDIS_REPLY_STRING || !sha_is_valid(reply)) {
                /* The next call of this script meets NOSCRIPT, retries once and gets this error then. */
                link_log(link, LOG_WARNING, "Could not load script %u into Redis: %s", (unsigned) (uintptr_t) userdata,
                         reply_text(reply));
                return;
        }
        if (streq_ptr(s->sha, reply->str))
                return;
        sha = strdup(reply->str);
        if (sha) {
                free(s->sha);
                s->sha = sha;
        }
}

/* FUNCTION LOAD's answer: the library's name, or "already exists": a library's name is of its text
 * (shared-scripts.h), so the one there is this one. */
static bool library_load_ok(const redisReply *r) {
        return r && (r->type == REDIS_REPLY_STRING ||
                     (r->type == REDIS_REPLY_ERROR && strstr(r->str, "already exists")));
}

/* A write refused for the server's state (out of memory, too few replicas), not for what was written. */
static bool library_load_refused_as_a_write(const redisReply *r) {
        return r && r->type == REDIS_REPLY_ERROR &&
               (strncmp(r->str, "OOM", strlen("OOM")) == 0 || strncmp(r->str, "NOREPLICAS", strlen("NOREPLICAS")) == 0);
}

static void on_library_loaded(RedisLink *link, int error, const redisReply *reply, void *userdata) {
        if (error < 0 || library_load_ok(reply))
                return;
        /* The call sent after it meets "Function not found" again and gets that error: its owner decides. */
        link_log(link, LOG_WARNING, "Could not load the library into Redis: %s", reply_text(reply));
}

/* A NOSCRIPT reply to an evalsha, or "Function not found" to an fcall (SCRIPT or FUNCTION FLUSH, a restart
 * without the data, a failover since setup): the script or the library is loaded again and the call sent
 * once more, in that order on the one connection. Returns true if the call was sent again (hiredis has it
 * back), false if it should be answered with this reply. */
static bool link_retry_missing(RedisLink *link, RedisCall *call, const redisReply *reply) {
        const char *argv[] = { "SCRIPT", "LOAD", NULL };
        RedisReplyFn loaded = on_script_loaded;
        uintptr_t tag = (uintptr_t) call->script;

        if (call->retried || !call->cmd || !reply_is_error(reply))
                return false;
        if (call->script >= 0 && strncmp(reply->str, "NOSCRIPT", strlen("NOSCRIPT")) == 0)
                argv[2] = link->scripts[call->script].source;
        else if (call->fcall && link->library && strncmp(reply->str, "ERR Function not found",
                                                           strlen("ERR Function not found")) == 0) {
                argv[0] = "FUNCTION";
                argv[2] = link->library;
                loaded = on_library_loaded;
                tag = 0;
        } else
                return false;
        call->retried = true;
        if (link_send_internal(link, loaded, tag, 3, argv) < 0)
                return false;
        if (link_send_call(link, call, call->cmd, call->cmd_len) < 0)
                return false;
        link->stats.script_reloads++;
        if (call->fcall)
                link_log(link, LOG_INFO, "Redis did not have the library (a flush, or a server without it): loaded it again");
        else
                link_log(link, LOG_DEBUG, "Script %d was not in Redis's script cache (NOSCRIPT): loaded it again",
                         call->script);
        return true;
}

static void on_reply(redisAsyncContext *ac, void *r, void *privdata) {
        RedisCall *call = privdata;
        RedisLink *link = call->link;
        const redisReply *reply = r;
        usec_t now = now_monotonic(), since = link->head_since;
        RedisReplyFn fn;
        void *userdata;
        int error = 0;

        if (link->closed) {
                call_free(call);
                return;
        }
        link_calls_remove(link, call, now);

        if (!reply) {
                if (link->phase == PHASE_UP)
                        link->phase = PHASE_CLOSING;
                error = call->timed_out ? -ETIMEDOUT : -ECONNRESET;
        } else {
                if (!call->blocking) {
                        usec_t rtt = usec_sub_unsigned(now, MAX(call->sent, since));
                        link->stats.rtt_last = rtt;
                        link->stats.rtt_avg = link->stats.rtt_avg == 0 ? rtt
                                : link->stats.rtt_avg - link->stats.rtt_avg / 8 + rtt / 8;
                }
                if (link_retry_missing(link, call, reply))
                        return;
        }

        link_arm_timeout(link);
        fn = call->fn;
        userdata = call->userdata;
        call_free(call);
        /* Last: the owner may free the link (its memory stays until hiredis is done with the context). */
        fn(link, error, reply, userdata);
}

/* ---- setup: AUTH, SELECT, INFO, FUNCTION LOAD, SCRIPT LOAD, pipelined ---- */

enum {
        SETUP_AUTH,
        SETUP_SELECT,
        SETUP_INFO,
        SETUP_SUBSCRIBE,
        SETUP_LIBRARY,
        SETUP_SCRIPT,           /* + the script's handle */
};

/* The value of "key:" in INFO's text, copied into buf; NULL if absent. */
static const char *info_field(const char *info, const char *key, char *buf, size_t size) {
        size_t n = strlen(key);

        for (const char *p = info; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
                if (strncmp(p, key, n) == 0 && p[n] == ':') {
                        size_t len = strcspn(p + n + 1, "\r\n");
                        if (len >= size)
                                len = size - 1;
                        memcpy(buf, p + n + 1, len);
                        buf[len] = '\0';
                        return buf;
                }
        return NULL;
}

/* "MAJOR.MINOR.PATCH" (INFO's redis_version) of major at least min; false for NULL or anything else. */
static bool redis_version_is_at_least(const char *version, unsigned long min) {
        char *end;
        unsigned long major;

        if (!version || !version[0] || !strchr("0123456789", version[0]))
                return false;
        errno = 0;
        major = strtoul(version, &end, 10);
        return errno == 0 && (*end == '.' || *end == '\0') && major >= min;
}

/* INFO says whether this is a Redis server that can hold a pool. Returns 0 and its run id in *ret_run_id,
 * or ends the context, saying why, and returns -1. */
static int link_check_info(RedisLink *link, const redisReply *reply, char **ret_run_id) {
        char run_id[128], policy[64], role[32], loading[8], reason[256];

        if (!reply || reply->type != REDIS_REPLY_STRING || !info_field(reply->str, "run_id", run_id, 64)) {
                snprintf(reason, sizeof reason, "Not a Redis server: INFO answered %.80s", reply_text(reply));
                link->failure = "not-redis";
                link_end(link, REDIS_LINK_FAILED, reason);
                return -1;
        }
        if (link->options.sentinel) {
                char mode[32];
                if (!info_field(reply->str, "redis_mode", mode, sizeof mode) || !streq(mode, "sentinel")) {
                        link->failure = "not-sentinel";
                        link_end(link, REDIS_LINK_FAILED, "Not a Sentinel: INFO has no redis_mode:sentinel");
                        return -1;
                }
                goto done;
        }
        if (info_field(reply->str, "loading", loading, sizeof loading) && streq(loading, "1")) {
                link_end(link, REDIS_LINK_DOWN, "Redis is loading its data set");
                return -1;
        }
        if (info_field(reply->str, "role", role, sizeof role) && !streq(role, "master")) {
                snprintf(reason, sizeof reason, "Redis is a replica (role:%s): it refuses writes", role);
                link->failure = "replica";
                link_end(link, REDIS_LINK_FAILED, reason);
                return -1;
        }
        /* The library is FUNCTION LOADed and FCALLed: Redis 7.0 and later (Debian 12's). An older one would
         * answer "unknown command" to every call; refused here, once, saying which version it is. */
        char version[32];
        if (link->library && !redis_version_is_at_least(info_field(reply->str, "redis_version", version, sizeof version),
                                                         REDIS_LINK_LIBRARY_MIN_MAJOR)) {
                snprintf(reason, sizeof reason,
                         "Redis %s is too old: shared pools need Redis %d.0 or later (Redis Functions)",
                         info_field(reply->str, "redis_version", version, sizeof version) ? version : "of unknown version",
                         REDIS_LINK_LIBRARY_MIN_MAJOR);
                link->failure = "redis-version";
                link_end(link, REDIS_LINK_FAILED, reason);
                return -1;
        }
        /* Every key of a shared pool is state that must not vanish: with any other policy Redis may evict a
         * lease or a waiter under memory pressure, and two commands could hold one slot. */
        if (!info_field(reply->str, "maxmemory_policy", policy, sizeof policy) || !streq(policy, "noeviction")) {
                snprintf(reason, sizeof reason,
                         "Redis's maxmemory-policy is %s: it may evict a pool's keys; set it to noeviction",
                         info_field(reply->str, "maxmemory_policy", policy, sizeof policy) ? policy : "unknown");
                link->failure = "eviction-policy";
                link_end(link, REDIS_LINK_FAILED, reason);
                return -1;
        }
        /* The data set's identity is the server's run and its replication history: a replica promoted,
         * or this server made a replica of another and back (REPLICAOF by hand), keeps its run id but not
         * its replication id, and may hold another data set than the one the pool's grants went to. */
        char replid[64];
        if (info_field(reply->str, "master_replid", replid, sizeof replid)) {
                size_t n = strlen(run_id);
                snprintf(run_id + n, sizeof run_id - n, "/%.*s", (int) (sizeof run_id - n - 2), replid);
        }
done:
        *ret_run_id = strdup(run_id);
        if (!*ret_run_id) {
                link_end(link, REDIS_LINK_DOWN, "Out of memory");
                return -1;
        }
        return 0;
}

/* ---- what is checked at connect is watched (SPEC §11) ---- */

static void link_watch_arm(RedisLink *link) {
        if (!link->watch_timer)
                return;
        (void) sd_event_source_set_time_relative(link->watch_timer, link->options.watch_interval);
        (void) sd_event_source_set_enabled(link->watch_timer, SD_EVENT_ONESHOT);
}

static void on_watch_reply(RedisLink *link, int error, const redisReply *reply, void *userdata) {
        char reason[300];

        link->watch_in_flight = false;
        if (error < 0 || link->ending || link->phase != PHASE_UP || !reply)
                return;
        if (reply->type == REDIS_REPLY_ERROR && !link->watch_all) {
                link->watch_all = true; /* Redis < 7 takes one section: the whole INFO from now on */
                return;
        }
        _cleanup_free_ char *run_id = NULL;
        if (link_check_info(link, reply, &run_id) < 0)
                return; /* refused as at connect, or loading: the link ended, saying why */
        if (link->run_id && !streq(run_id, link->run_id)) {
                /* Another server or another data set behind the same connection: the next connect tells the
                 * owner, whose pools open a recovery window before anything is granted. */
                snprintf(reason, sizeof reason, "Redis's run or replication id changed (%.100s, was %.100s)", run_id,
                         link->run_id);
                link_end(link, REDIS_LINK_DOWN, reason);
        }
}

/* One INFO of the three sections it reads (server: run_id; memory: maxmemory_policy; replication: role,
 * master_replid), about 2.5 KiB, pipelined with the owner's commands every watch_interval while up. */
static int link_watch_send(RedisLink *link) {
        static const char *const sections[] = { "INFO", "server", "memory", "replication" };
        int r = link_send_internal(link, on_watch_reply, 0, link->watch_all ? 1 : 4, sections);
        link->watch_in_flight = r >= 0;
        if (r >= 0)
                link->watch_last = now_monotonic();
        return r;
}

static int on_watch_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        RedisLink *link = link_ref(userdata);

        if (link->phase == PHASE_UP && !link->ending && !link->watch_in_flight)
                (void) link_watch_send(link);
        if (link->phase == PHASE_UP)
                link_watch_arm(link);
        link_unref(link);
        return 0;
}

int redis_link_watch_along(RedisLink *link) {
        assert_return(link, -EINVAL);
        if (link->watch_resting && link->watch_timer && link->phase == PHASE_UP) {
                link->watch_resting = false;
                (void) sd_event_source_set_time_relative(link->watch_timer, 3 * link->options.watch_interval);
                (void) sd_event_source_set_enabled(link->watch_timer, SD_EVENT_ONESHOT);
        }
        if (!link->watch_timer || link->phase != PHASE_UP || link->ending || link->watch_in_flight ||
            now_monotonic() < usec_add(link->watch_last, link->options.watch_interval / 2))
                return 0;
        int r = link_watch_send(link);
        if (r < 0)
                return r;
        /* The timer is the fallback now: the owner sends it along more often than this. */
        (void) sd_event_source_set_time_relative(link->watch_timer, 3 * link->options.watch_interval);
        (void) sd_event_source_set_enabled(link->watch_timer, SD_EVENT_ONESHOT);
        return 1;
}

int redis_link_watch_rest(RedisLink *link) {
        assert_return(link, -EINVAL);
        if (!link->watch_timer || link->phase != PHASE_UP)
                return 0;
        link->watch_resting = true;
        return sd_event_source_set_enabled(link->watch_timer, SD_EVENT_OFF);
}

void redis_link_cork(RedisLink *link) {
        if (link && link->ac && !link->ending)
                redis_sdevent_cork(link->ac);
}

void redis_link_uncork(RedisLink *link) {
        if (link && link->ac)
                redis_sdevent_uncork(link->ac);
}

int redis_link_reconnect(RedisLink *link, const char *why) {
        assert_return(link, -EINVAL);
        if (!link->ac || link->ending)
                return 0;
        link_log(link, LOG_DEBUG, "%s", why ?: "Reconnecting");
        /* Not a failure: as a move (on_context_end()), the owner hears DOWN and the next attempt is now. */
        link->moved = true;
        link_end(link, REDIS_LINK_DOWN, why);
        return 1;
}

int redis_link_rest(RedisLink *link) {
        assert_return(link, -EINVAL);
        if (link->resting)
                return 0;
        link->resting = true;
        link_log(link, LOG_DEBUG, "Resting");
        if (link->ac) {
                /* on_context_end() sees `resting`: the owner hears DOWN, no attempt follows. */
                link_end(link, REDIS_LINK_DOWN, "Resting");
                return 1;
        }
        /* Resolving, or waiting for the next attempt: neither goes on. */
        link_attempt_failed(link, REDIS_LINK_DOWN, "Resting");
        return 1;
}

int redis_link_wake(RedisLink *link) {
        assert_return(link, -EINVAL);
        if (!link->resting)
                return 0;
        link->resting = false;
        link->backoff = link->options.backoff_min;
        link_log(link, LOG_DEBUG, "Woken");
        if (!link->ac && link->has_endpoint) {
                (void) sd_event_source_set_time_relative(link->retry_timer, 0);
                (void) sd_event_source_set_enabled(link->retry_timer, SD_EVENT_ONESHOT);
        }
        return 1;
}

static void link_went_up(RedisLink *link) {
        link->phase = PHASE_UP;
        link->watch_in_flight = false;
        link->watch_resting = false;
        link->watch_last = now_monotonic(); /* the setup read INFO */
        link_watch_arm(link);
        link->backoff = link->options.backoff_min;
        link->attempt_deadline = USEC_INFINITY;
        link->stats.ups++;
        link_arm_timeout(link);
        link_log(link, LOG_DEBUG, "Up, Redis run id %s", link->run_id);
        link_tell(link, REDIS_LINK_UP, link->run_id);
}

static void on_setup_reply(RedisLink *link, int error, const redisReply *reply, void *userdata) {
        uintptr_t step = (uintptr_t) userdata;
        char reason[256];

        if (error < 0 || link->ending)
                return; /* the context is ending: on_context_end() says why */

        if (step == SETUP_INFO) {
                char *run_id = NULL;
                if (link_check_info(link, reply, &run_id) < 0)
                        return;
                free(link->run_id);
                link->run_id = run_id;
        } else if (step == SETUP_LIBRARY && library_load_ok(reply)) {
                /* loaded, or there already */
        } else if (step == SETUP_LIBRARY && library_load_refused_as_a_write(reply)) {
                /* FUNCTION LOAD is a write: a full Redis (noeviction) or one short of its min-replicas-to-write
                 * refuses it, as it refuses the calls' writes. Not a configuration error, and the library may
                 * be there already: up, and a call that finds it missing loads it again. */
                link_log(link, LOG_WARNING, "FUNCTION LOAD of the library refused for now: %.200s", reply_text(reply));
        } else if (step == SETUP_LIBRARY) {
                snprintf(reason, sizeof reason, "FUNCTION LOAD of the library refused: %.200s", reply_text(reply));
                link->failure = "script";
                link_end(link, classify_error_reply(reply_text(reply)), reason);
                return;
        } else if (step >= SETUP_SCRIPT && reply && reply->type == REDIS_REPLY_STRING && sha_is_valid(reply)) {
                RedisScript *s = &link->scripts[step - SETUP_SCRIPT];
                char *sha = strdup(reply->str);
                if (!sha) {
                        link_end(link, REDIS_LINK_DOWN, "Out of memory");
                        return;
                }
                free(s->sha);
                s->sha = sha;
        } else if (reply->type == REDIS_REPLY_ERROR || step >= SETUP_SCRIPT ||
                   (step < SETUP_SCRIPT && reply->type != REDIS_REPLY_STATUS)) {
                const char *text = reply_text(reply);
                const char *what = step == SETUP_AUTH ? "AUTH" : step == SETUP_SELECT ? "SELECT" : "SCRIPT LOAD";
                RedisLinkState state = classify_error_reply(text);

                if (strncmp(text, "NOAUTH", strlen("NOAUTH")) == 0)
                        snprintf(reason, sizeof reason, "Redis requires a password (backend-password-file=): %s", text);
                else if (step == SETUP_SELECT)
                        snprintf(reason, sizeof reason, "SELECT %u refused: %s", link->endpoint.db, text);
                else if (step >= SETUP_SCRIPT)
                        snprintf(reason, sizeof reason, "SCRIPT LOAD of script %u refused: %s",
                                 (unsigned) (step - SETUP_SCRIPT), text);
                else
                        snprintf(reason, sizeof reason, "%s refused: %s", what, text);
                link->failure = step == SETUP_SELECT ? "database" : step >= SETUP_SCRIPT ? "script" : "auth";
                link_end(link, state, reason);
                return;
        }

        if (--link->setup_pending == 0)
                link_went_up(link);
}

/* hiredis's callback of the subscribed channel: the confirmation (["subscribe", channel, n]), then every
 * message (["message", channel, payload]); NULL when the context ends, which on_context_end() reports. */
static void on_message(redisAsyncContext *ac, void *r, void *privdata) {
        RedisLink *link = privdata;
        const redisReply *reply = r;

        if (!reply || link->closed || link->ending)
                return;
        if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 3 || reply->element[0]->type != REDIS_REPLY_STRING ||
            reply->element[1]->type != REDIS_REPLY_STRING)
                return;
        if (streq(reply->element[0]->str, "subscribe")) {
                if (link->phase == PHASE_SETUP && --link->setup_pending == 0)
                        link_went_up(link);
                return;
        }
        if (streq(reply->element[0]->str, "message") && reply->element[2]->type == REDIS_REPLY_STRING &&
            link->phase == PHASE_UP && link->message_fn)
                link->message_fn(link, reply->element[1]->str, reply->element[2]->str, reply->element[2]->len,
                                 link->message_userdata);
}

/* From hiredis's connect callback: sends the setup, pipelined (one round trip; the first failure wins,
 * the replies after it come back empty). A failure here only shuts the socket down (see link_end()). */
static void link_send_setup(RedisLink *link) {
        char db[16];
        int r = 0;

        link->phase = PHASE_SETUP;
        link->setup_pending = 0;
        if (link->options.password_file) {
                /* AUTH [USER] PASSWORD: without a user, Redis's default one. */
                const char *argv[3] = { "AUTH" }, **p = argv + 1;
                if (link->options.user)
                        *p++ = link->options.user;
                *p++ = link->password;
                r = link_send_internal(link, on_setup_reply, SETUP_AUTH, (int) (p - argv), argv);
                link->setup_pending += r >= 0;
        }
        snprintf(db, sizeof db, "%u", link->endpoint.db);
        if (r >= 0 && !link->options.sentinel) {
                r = link_send_internal(link, on_setup_reply, SETUP_SELECT, 2, (const char *const[]) { "SELECT", db });
                link->setup_pending += r >= 0;
        }
        if (r >= 0) {
                r = link_send_internal(link, on_setup_reply, SETUP_INFO, 1, (const char *const[]) { "INFO" });
                link->setup_pending += r >= 0;
        }
        /* Last: hiredis answers the calls before it from its queue, then hands this channel's replies to
         * on_message(); the link is up once the subscription is confirmed. */
        if (r >= 0 && link->channel) {
                /* The reader refuses messages of any other channel (hiredis would run a stale callback). */
                r = redis_sdevent_set_channel(link->ac, link->channel);
                if (r >= 0)
                        r = redisAsyncCommand(link->ac, on_message, link, "SUBSCRIBE %s", link->channel) == REDIS_OK ? 0 : -ENOTCONN;
                link->setup_pending += r >= 0;
        }
        if (r >= 0 && link->library && !link->options.sentinel) {
                r = link_send_internal(link, on_setup_reply, SETUP_LIBRARY, 3,
                                       (const char *const[]) { "FUNCTION", "LOAD", link->library });
                link->setup_pending += r >= 0;
        }
        for (size_t i = 0; r >= 0 && !link->options.sentinel && i < link->n_scripts; i++) {
                r = link_send_internal(link, on_setup_reply, SETUP_SCRIPT + i, 3,
                                       (const char *const[]) { "SCRIPT", "LOAD", link->scripts[i].source });
                link->setup_pending += r >= 0;
        }
        if (r < 0)
                link_end(link, REDIS_LINK_DOWN, "Could not send the setup commands");
}

/* ---- attempts: resolve, connect, and the end of a context ---- */

static void on_connected(const redisAsyncContext *ac, int status) {
        RedisLink *link = ac->data;

        if (status != REDIS_OK)
                return; /* hiredis frees the context now: on_context_end() */
        link->in_connect_callback = true;
        link_send_setup(link);
        link->in_connect_callback = false;
        /* hiredis has its copy in the output buffer: ours is not kept longer than needed. */
        if (link->password)
                explicit_bzero(link->password, strlen(link->password));
        link->password = mfree(link->password);
}

/* hiredis is freeing the context: every reply callback has run. The next attempt is scheduled, and the
 * owner told. */
static void on_context_end(redisAsyncContext *ac, void *userdata) {
        RedisLink *link = userdata;
        bool was_up = link->phase == PHASE_UP || link->phase == PHASE_CLOSING;
        RedisLinkState state = REDIS_LINK_DOWN;
        char reason[300];

        link->ac = NULL;
        link->phase = PHASE_IDLE;
        link->setup_pending = 0;
        link->blocking_in_flight = false;

        const char *overflow = redis_sdevent_get_overflow(ac), *unexpected = redis_sdevent_get_unexpected(ac);
        if (link->ending) {
                state = link->end_state;
                snprintf(reason, sizeof reason, "%s", link->end_reason ?: "Disconnected");
        } else if (overflow) {
                /* No Redis answers brokerd's commands with that much: a server that is not the pool's Redis,
                 * or keys that someone else wrote. Retried after the longest backoff. */
                state = REDIS_LINK_FAILED;
                link->failure = "reply-too-large";
                snprintf(reason, sizeof reason, "%s: not the pool's Redis, or keys someone else wrote (see brokerd.conf(5))",
                         overflow);
        } else if (unexpected) {
                /* A reply no command asked for (hiredis would abort on it): not a Redis server, or not one
                 * that keeps the protocol. */
                state = REDIS_LINK_FAILED;
                link->failure = "not-redis";
                snprintf(reason, sizeof reason, "Not a Redis server: %s", unexpected);
        } else if (ac->err == REDIS_ERR_PROTOCOL) {
                /* A Redis server never breaks the protocol: this is something else at that address. */
                state = REDIS_LINK_FAILED;
                link->failure = "not-redis";
                snprintf(reason, sizeof reason, "Not a Redis server: %s", ac->errstr);
        } else if (ac->err != 0)
                snprintf(reason, sizeof reason, "%s", ac->errstr);
        else
                snprintf(reason, sizeof reason, "Disconnected");
        link->ending = false;
        link->end_reason = mfree(link->end_reason);

        if (!link->closed) {
                /* A connection that was up is lost: the owner hears it now, not after the other addresses. */
                if (was_up) {
                        link->n_addresses = link->address = 0;
                        link_log(link, LOG_DEBUG, "Connection lost: %s", reason);
                }
                link_attempt_failed(link, state, reason);
        }
        link_unref(link); /* the context's */
}

static int read_password(const char *path, char **ret) {
        _cleanup_free_ char *buf = NULL;
        size_t size = 0;
        FILE *f;

        f = fopen(path, "re");
        if (!f)
                return negative_errno();
        ssize_t n = getline(&buf, &size, f);
        int r = n < 0 && ferror(f) ? negative_errno() : 0;
        fclose(f);
        if (r < 0)
                return r;
        if (n < 0)
                n = 0, buf = mfree(buf);
        if (n > 0 && buf[n - 1] == '\n')
                buf[--n] = '\0';
        if (!buf && !(buf = strdup("")))
                return -ENOMEM;
        *ret = TAKE_PTR(buf);
        return 0;
}

/* Makes a context for the current address. Returns 0, or fills reason and returns negative errno. */
static int link_connect(RedisLink *link, char *reason, size_t size) {
        redisAsyncContext *ac;
        int r;

        if (link->endpoint.type == REDIS_ENDPOINT_UNIX)
                ac = redisAsyncConnectUnix(link->endpoint.path);
        else
                ac = redisAsyncConnect(link->addresses[link->address], link->endpoint.port);
        if (!ac) {
                snprintf(reason, size, "Out of memory");
                return -ENOMEM;
        }
        if (ac->err) {
                snprintf(reason, size, "%s", ac->errstr);
                redisAsyncFree(ac);
                return -ECONNREFUSED;
        }
        /* hiredis 0.14 makes its sockets without SOCK_CLOEXEC: brokerd's children must not inherit them. */
        if (fcntl(ac->c.fd, F_SETFD, FD_CLOEXEC) < 0) {
                r = negative_errno();
                snprintf(reason, size, "Could not make the socket close-on-exec: %s", strerror(-r));
                redisAsyncFree(ac);
                return r;
        }
        if (link->endpoint.type == REDIS_ENDPOINT_TCP)
                (void) redisEnableKeepAlive(&ac->c);
        r = redis_sdevent_attach(ac, link->event, on_context_end, link);
        if (r < 0) {
                snprintf(reason, size, "Could not watch the socket: %s", strerror(-r));
                redisAsyncFree(ac);
                return r;
        }
        ac->data = link;
        link->ac = ac;
        link_ref(link); /* the context's, until on_context_end() */
        link->phase = PHASE_CONNECTING;
        (void) redisAsyncSetConnectCallback(ac, on_connected);
        return 0;
}

static void link_connect_current(RedisLink *link) {
        char reason[300];

        if (link_connect(link, reason, sizeof reason) < 0)
                link_attempt_failed(link, REDIS_LINK_DOWN, reason);
        else
                link_arm_timeout(link);
}

static void on_resolved(ResolveQuery *q, int error, const struct addrinfo *ai, void *userdata) {
        RedisLink *link = link_ref(userdata);
        char reason[300];

        link->n_addresses = link->address = 0;
        for (; ai && link->n_addresses < MAX_ADDRESSES; ai = ai->ai_next) {
                const void *a = ai->ai_family == AF_INET ? (const void *) &((const struct sockaddr_in *) ai->ai_addr)->sin_addr
                              : ai->ai_family == AF_INET6 ? (const void *) &((const struct sockaddr_in6 *) ai->ai_addr)->sin6_addr
                              : NULL;
                if (a && inet_ntop(ai->ai_family, a, link->addresses[link->n_addresses], INET6_ADDRSTRLEN))
                        link->n_addresses++;
        }
        link->query = resolve_query_free(link->query); /* ai with it */

        if (link->n_addresses == 0) {
                snprintf(reason, sizeof reason, "Could not resolve %s: %s", link->endpoint.host,
                         error > 0 ? gai_strerror(error) : error < 0 ? strerror(-error) : "no IPv4 or IPv6 address");
                link_attempt_failed(link, REDIS_LINK_DOWN, reason);
        } else {
                link->phase = PHASE_IDLE;
                link_connect_current(link);
        }
        link_unref(link);
}

static bool host_is_address(const char *host) {
        unsigned char buf[sizeof(struct in6_addr)];
        return inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1;
}

static void link_attempt(RedisLink *link) {
        char reason[300];
        int r;

        if (!link->has_endpoint || link->resting)
                return;
        link->stats.attempts++;
        link->attempt_deadline = usec_add(now_monotonic(), link->options.connect_timeout);
        link_log(link, LOG_DEBUG, "Connecting (attempt %" PRIu64 ")", link->stats.attempts);

        link->password = mfree(link->password);
        if (link->options.password_file) {
                r = read_password(link->options.password_file, &link->password);
                if (r < 0) {
                        snprintf(reason, sizeof reason, "Could not read the password file %s: %s",
                                 link->options.password_file, strerror(-r));
                        link->failure = "password-file";
                        link_attempt_failed(link, REDIS_LINK_FAILED, reason);
                        return;
                }
        }

        if (link->endpoint.type == REDIS_ENDPOINT_UNIX || link->address + 1 < link->n_addresses) {
                /* The next address of the last resolution (or a socket path): no lookup. */
                if (link->endpoint.type == REDIS_ENDPOINT_TCP)
                        link->address++;
                link_connect_current(link);
                return;
        }
        if (host_is_address(link->endpoint.host)) {
                snprintf(link->addresses[0], INET6_ADDRSTRLEN, "%s", link->endpoint.host);
                link->n_addresses = 1;
                link->address = 0;
                link_connect_current(link);
                return;
        }
        /* Every round of addresses starts with a new lookup: a failover may have moved the name. */
        const struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
        r = resolve_getaddrinfo(link->event, link->endpoint.host, &hints, on_resolved, link, &link->query);
        if (r < 0) {
                snprintf(reason, sizeof reason, "Could not resolve %s: %s", link->endpoint.host, strerror(-r));
                link_attempt_failed(link, REDIS_LINK_DOWN, reason);
                return;
        }
        link->phase = PHASE_RESOLVING;
        link_arm_timeout(link);
}

/* An attempt (or a connection) is over. Another address of the same lookup is tried at once; else the
 * next attempt waits its backoff, and the owner is told. */
static void link_attempt_failed(RedisLink *link, RedisLinkState state, const char *reason) {
        usec_t delay;
        char d[32];

        link->phase = PHASE_IDLE;
        link->attempt_deadline = USEC_INFINITY;
        link->query = resolve_query_free(link->query);
        link_arm_timeout(link);
        if (link->resting) {
                /* Ended on purpose: no next attempt until woken, and no failure (the backoff stays). */
                link->moved = false;
                link->n_addresses = link->address = 0;
                (void) sd_event_source_set_enabled(link->retry_timer, SD_EVENT_OFF);
                link_tell(link, REDIS_LINK_DOWN, reason);
                return;
        }
        if (link->moved) {
                /* Not a failure: the owner moved the link. It hears DOWN, and the new address is tried now. */
                link->moved = false;
                link->n_addresses = link->address = 0;
                link->backoff = link->options.backoff_min;
                (void) sd_event_source_set_time_relative(link->retry_timer, 0);
                (void) sd_event_source_set_enabled(link->retry_timer, SD_EVENT_ONESHOT);
                link_tell(link, REDIS_LINK_DOWN, reason);
                return;
        }
        if (state == REDIS_LINK_DOWN && link->address + 1 < link->n_addresses) {
                link_log(link, LOG_DEBUG, "%s: %s; trying its next address", link->addresses[link->address], reason);
                delay = 0;
        } else {
                link->n_addresses = link->address = 0;
                delay = link_next_delay(link, state);
                link_log(link, LOG_DEBUG, "%s; next attempt in %s", reason, timespan_format(d, sizeof d, delay));
        }
        (void) sd_event_source_set_time_relative(link->retry_timer, delay);
        (void) sd_event_source_set_enabled(link->retry_timer, SD_EVENT_ONESHOT);
        if (delay > 0)
                link_tell(link, state, reason);
}

static int on_retry_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        RedisLink *link = link_ref(userdata);

        link_attempt(link);
        link_unref(link);
        return 0;
}

/* The one deadline that matters now: the attempt's while connecting, the oldest call's. */
static void link_arm_timeout(RedisLink *link) {
        usec_t deadline = USEC_INFINITY;

        if (link->phase != PHASE_IDLE && link->phase != PHASE_UP && link->phase != PHASE_CLOSING)
                deadline = link->attempt_deadline;
        if (link->calls && !link->ending)
                deadline = MIN(deadline, call_deadline(link, link->calls));
        if (deadline == USEC_INFINITY) {
                (void) sd_event_source_set_enabled(link->timeout_timer, SD_EVENT_OFF);
                return;
        }
        (void) sd_event_source_set_time(link->timeout_timer, deadline);
        (void) sd_event_source_set_enabled(link->timeout_timer, SD_EVENT_ONESHOT);
}

static int on_timeout_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        RedisLink *link = link_ref(userdata);
        usec_t now = now_monotonic();
        char reason[128], d[32];

        if (link->phase == PHASE_RESOLVING && now >= link->attempt_deadline) {
                snprintf(reason, sizeof reason, "Timed out resolving %s after %s", link->endpoint.host,
                         timespan_format(d, sizeof d, link->options.connect_timeout));
                link_attempt_failed(link, REDIS_LINK_DOWN, reason);
        } else if ((link->phase == PHASE_CONNECTING || link->phase == PHASE_SETUP) && now >= link->attempt_deadline) {
                /* Before the calls: a setup command late with its attempt is the attempt's failure. */
                snprintf(reason, sizeof reason, "Timed out %s after %s",
                         link->phase == PHASE_CONNECTING ? "connecting" : "setting the connection up",
                         timespan_format(d, sizeof d, link->options.connect_timeout));
                link_end(link, REDIS_LINK_DOWN, reason);
        } else if (link->calls && now >= call_deadline(link, link->calls)) {
                link->calls->timed_out = true;
                link->stats.timeouts++;
                snprintf(reason, sizeof reason, "A command got no reply within %s",
                         timespan_format(d, sizeof d, link->calls->timeout));
                link_end(link, REDIS_LINK_DOWN, reason);
        } else
                link_arm_timeout(link);
        link_unref(link);
        return 0;
}

/* ---- the API ---- */

static bool endpoint_is_valid(const RedisEndpoint *e) {
        return e->type == REDIS_ENDPOINT_TCP ? !!e->host : e->type == REDIS_ENDPOINT_UNIX && e->path;
}

static bool endpoint_equal(const RedisEndpoint *a, const RedisEndpoint *b) {
        return a->type == b->type && streq_ptr(a->host, b->host) && a->port == b->port && streq_ptr(a->path, b->path) &&
               a->db == b->db;
}

int redis_link_new(sd_event *event, const RedisEndpoint *endpoint, const RedisLinkOptions *options,
                   RedisLink **ret) {
        RedisLink *link;
        int r;

        assert_return(event, -EINVAL);
        assert_return(!endpoint || endpoint_is_valid(endpoint), -EINVAL);
        assert_return(ret, -EINVAL);

        link = calloc(1, sizeof *link);
        if (!link)
                return -ENOMEM;
        link->n_ref = 1;
        link->event = sd_event_ref(event);
        link->options = options ? *options : (RedisLinkOptions) {};
        link->options.user = link->options.password_file = NULL;
        link->attempt_deadline = USEC_INFINITY;
        link->state = _REDIS_LINK_STATE_INVALID;
        if (link->options.command_timeout == 0)
                link->options.command_timeout = REDIS_LINK_COMMAND_TIMEOUT_DEFAULT;
        if (link->options.connect_timeout == 0)
                link->options.connect_timeout = link->options.command_timeout;
        if (link->options.backoff_min == 0)
                link->options.backoff_min = REDIS_LINK_BACKOFF_MIN_DEFAULT;
        if (link->options.backoff_max == 0)
                link->options.backoff_max = REDIS_LINK_BACKOFF_MAX_DEFAULT;
        link->options.backoff_max = MAX(link->options.backoff_max, link->options.backoff_min);
        link->backoff = link->options.backoff_min;

        r = endpoint ? redis_endpoint_copy(endpoint, &link->endpoint) : 0;
        if (r < 0) {
                link->endpoint = (RedisEndpoint) {};
                goto fail;
        }
        link->has_endpoint = endpoint;
        if (options && (strdup_or_null(options->user, (char **) &link->options.user) < 0 ||
                        strdup_or_null(options->password_file, (char **) &link->options.password_file) < 0)) {
                r = -ENOMEM;
                goto fail;
        }
        if (!link->options.random && getrandom(&link->prng, sizeof link->prng, GRND_NONBLOCK) != sizeof link->prng)
                link->prng = now_monotonic() ^ (uintptr_t) link;
        link->prng |= 1; /* xorshift's one forbidden state is 0 */

        /* The first attempt from the loop: nothing is called back before this returns. */
        r = sd_event_add_time_relative(event, &link->retry_timer, CLOCK_MONOTONIC, 0, USEC_PER_MSEC, on_retry_timer, link);
        if (r < 0)
                goto fail;
        r = sd_event_add_time(event, &link->timeout_timer, CLOCK_MONOTONIC, USEC_INFINITY, USEC_PER_MSEC,
                              on_timeout_timer, link);
        if (r < 0)
                goto fail;
        (void) sd_event_source_set_enabled(link->timeout_timer, SD_EVENT_OFF);
        if (!link->has_endpoint)
                (void) sd_event_source_set_enabled(link->retry_timer, SD_EVENT_OFF);
        if (link->options.watch_interval > 0 && !link->options.sentinel && !link->options.blocking) {
                r = sd_event_add_time(event, &link->watch_timer, CLOCK_MONOTONIC, USEC_INFINITY,
                                      100 * USEC_PER_MSEC, on_watch_timer, link);
                if (r < 0)
                        goto fail;
                (void) sd_event_source_set_enabled(link->watch_timer, SD_EVENT_OFF);
                (void) sd_event_source_set_description(link->watch_timer, "redis-link-watch");
        }
        (void) sd_event_source_set_description(link->retry_timer, "redis-link-retry");
        (void) sd_event_source_set_description(link->timeout_timer, "redis-link-timeout");

        *ret = link;
        return 0;
fail:
        link_destroy(link);
        return r;
}

RedisLink *redis_link_free(RedisLink *link) {
        if (!link)
                return NULL;
        link->closed = true;
        link->query = resolve_query_free(link->query);
        (void) sd_event_source_set_enabled(link->retry_timer, SD_EVENT_OFF);
        (void) sd_event_source_set_enabled(link->timeout_timer, SD_EVENT_OFF);
        /* The context keeps its reference until hiredis is done with it (now, or after the reply callback
         * this may be called from; if it is ending already, hiredis frees it anyway). */
        link_end(link, REDIS_LINK_DOWN, NULL);
        link_unref(link);
        return NULL;
}

int redis_link_set_endpoint(RedisLink *link, const RedisEndpoint *endpoint) {
        RedisEndpoint copy;
        char reason[300];
        int r;

        assert_return(link, -EINVAL);
        assert_return(endpoint && endpoint_is_valid(endpoint), -EINVAL);

        if (link->has_endpoint && endpoint_equal(&link->endpoint, endpoint))
                return 0;
        r = redis_endpoint_copy(endpoint, &copy);
        if (r < 0)
                return r;
        redis_endpoint_done(&link->endpoint);
        link->endpoint = copy;
        link->has_endpoint = true;
        link->moved = true;
        link->n_addresses = link->address = 0;
        if (endpoint->type == REDIS_ENDPOINT_TCP)
                snprintf(reason, sizeof reason, "Moved to %s%s%s:%u", strchr(endpoint->host, ':') ? "[" : "",
                         endpoint->host, strchr(endpoint->host, ':') ? "]" : "", endpoint->port);
        else
                snprintf(reason, sizeof reason, "Moved to %s", endpoint->path);
        link_log(link, LOG_DEBUG, "%s", reason);
        if (link->ac)
                /* on_context_end() sees `moved`: the owner hears DOWN, the next attempt is now. */
                link_end(link, REDIS_LINK_DOWN, reason);
        else
                link_attempt_failed(link, REDIS_LINK_DOWN, reason);
        return 1;
}

const RedisEndpoint *redis_link_get_endpoint(const RedisLink *link) {
        assert_return(link, NULL);
        return link->has_endpoint ? &link->endpoint : NULL;
}

int redis_link_subscribe(RedisLink *link, const char *channel, RedisMessageFn fn, void *userdata) {
        assert_return(link, -EINVAL);
        assert_return(channel && fn, -EINVAL);
        if (!link->options.blocking || link->channel)
                return -EINVAL;
        link->channel = strdup(channel);
        if (!link->channel)
                return -ENOMEM;
        link->message_fn = fn;
        link->message_userdata = userdata;
        /* A connection made before this has no subscription: the next one will. */
        if (link->ac)
                link_end(link, REDIS_LINK_DOWN, "Subscribing");
        return 0;
}

RedisLinkState redis_link_get_state(const RedisLink *link) {
        assert_return(link, _REDIS_LINK_STATE_INVALID);
        return link->phase == PHASE_UP ? REDIS_LINK_UP : link->state == REDIS_LINK_FAILED ? REDIS_LINK_FAILED : REDIS_LINK_DOWN;
}

const char *redis_link_get_failure(const RedisLink *link) {
        return link && redis_link_get_state(link) == REDIS_LINK_FAILED ? link->failure : NULL;
}

const char *redis_link_get_run_id(const RedisLink *link) {
        assert_return(link, NULL);
        return link->run_id;
}

void redis_link_get_stats(const RedisLink *link, RedisLinkStats *ret) {
        if (link && ret)
                *ret = link->stats;
}

int redis_link_add_script(RedisLink *link, const char *source, unsigned *ret_handle) {
        RedisScript *scripts;
        char *copy;

        assert_return(link, -EINVAL);
        assert_return(source, -EINVAL);
        assert_return(ret_handle, -EINVAL);

        copy = strdup(source);
        if (!copy)
                return -ENOMEM;
        scripts = realloc(link->scripts, (link->n_scripts + 1) * sizeof *scripts);
        if (!scripts) {
                free(copy);
                return -ENOMEM;
        }
        link->scripts = scripts;
        link->scripts[link->n_scripts] = (RedisScript) { .source = copy };
        *ret_handle = (unsigned) link->n_scripts++;
        if (link->phase == PHASE_UP)
                (void) link_send_internal(link, on_script_loaded, *ret_handle, 3,
                                          (const char *const[]) { "SCRIPT", "LOAD", copy });
        return 0;
}

int redis_link_set_library(RedisLink *link, const char *source) {
        char *copy;

        assert_return(link, -EINVAL);
        assert_return(source && strncmp(source, "#!lua name=", strlen("#!lua name=")) == 0, -EINVAL);
        if (link->library)
                return -EBUSY;
        copy = strdup(source);
        if (!copy)
                return -ENOMEM;
        link->library = copy;
        /* Its version check is part of the setup: a link up already sets up again. */
        if (link->ac)
                link_end(link, REDIS_LINK_DOWN, "Loading the library");
        return 0;
}

/* The link owns the connection's state (database, credentials, protocol mode): a command that changes it
 * would break what the link set up, or hiredis's reply order (hiredis 0.14 asserts on a pub/sub reply it
 * did not expect). */
static bool command_is_reserved(const char *name, size_t len) {
        static const char *const reserved[] = {
                "SUBSCRIBE", "PSUBSCRIBE", "SSUBSCRIBE", "UNSUBSCRIBE", "PUNSUBSCRIBE", "SUNSUBSCRIBE",
                "MONITOR", "SELECT", "AUTH", "HELLO", "RESET", "QUIT", "SWAPDB",
        };

        for (size_t i = 0; i < ELEMENTSOF(reserved); i++)
                if (len == strlen(reserved[i]) && strncasecmp(name, reserved[i], len) == 0)
                        return true;
        return false;
}

static int link_check_command(const RedisLink *link, int argc, const char *const *argv, const size_t *argvlen) {
        if (argc < 1 || !argv || !argv[0])
                return -EINVAL;
        if (command_is_reserved(argv[0], argvlen ? argvlen[0] : strlen(argv[0])))
                return -EINVAL;
        if (link->channel)
                return -EINVAL; /* a subscribed connection answers nothing else */
        if (link->phase != PHASE_UP || link->ending)
                return -ENOTCONN;
        return 0;
}

int redis_link_command(RedisLink *link, RedisReplyFn fn, void *userdata, int argc, const char *const *argv,
                       const size_t *argvlen) {
        const SendArgs a = { .fn = fn, .userdata = userdata, .script = -1 };
        int r;

        assert_return(link, -EINVAL);
        assert_return(fn, -EINVAL);
        r = link_check_command(link, argc, argv, argvlen);
        if (r < 0)
                return r;
        return link_send(link, &a, argc, argv, argvlen);
}

int redis_link_command_blocking(RedisLink *link, usec_t block, RedisReplyFn fn, void *userdata, int argc,
                                const char *const *argv, const size_t *argvlen) {
        const SendArgs a = { .fn = fn, .userdata = userdata, .block = block, .blocking = true, .script = -1 };
        int r;

        assert_return(link, -EINVAL);
        assert_return(fn, -EINVAL);
        if (!link->options.blocking)
                return -EINVAL;
        r = link_check_command(link, argc, argv, argvlen);
        if (r < 0)
                return r;
        if (link->blocking_in_flight)
                return -EBUSY;
        return link_send(link, &a, argc, argv, argvlen);
}

/* VERB TARGET NKEYS ARGV…: EVALSHA, EVAL and FCALL take their arguments alike. */
static int link_send_script(RedisLink *link, const SendArgs *a, const char *verb, const char *target, unsigned nkeys,
                            int argc, const char *const *argv, const size_t *argvlen) {
        _cleanup_free_ const char **args = calloc((size_t) argc + 3, sizeof *args);
        _cleanup_free_ size_t *lens = calloc((size_t) argc + 3, sizeof *lens);
        char n[16];
        if (!args || !lens)
                return -ENOMEM;
        snprintf(n, sizeof n, "%u", nkeys);
        args[0] = verb;
        args[1] = target;
        args[2] = n;
        for (int i = 0; i < argc; i++) {
                args[i + 3] = argv[i];
                lens[i + 3] = argvlen ? argvlen[i] : strlen(argv[i]);
        }
        for (int i = 0; i < 3; i++)
                lens[i] = strlen(args[i]);
        return link_send(link, a, argc + 3, args, lens);
}

int redis_link_evalsha(RedisLink *link, unsigned script, RedisReplyFn fn, void *userdata, unsigned nkeys,
                       int argc, const char *const *argv, const size_t *argvlen) {
        const SendArgs a = { .fn = fn, .userdata = userdata, .script = (int) script };

        assert_return(link, -EINVAL);
        assert_return(fn, -EINVAL);
        assert_return(argc >= 0 && (argc == 0 || argv), -EINVAL);
        assert_return(nkeys <= (unsigned) argc, -EINVAL);
        if (script >= link->n_scripts)
                return -ENOENT;
        if (link->phase != PHASE_UP || link->ending)
                return -ENOTCONN;
        /* Before its first SCRIPT LOAD reply (a script added while up), EVAL does the same. */
        if (link->scripts[script].sha)
                return link_send_script(link, &a, "EVALSHA", link->scripts[script].sha, nkeys, argc, argv, argvlen);
        return link_send_script(link, &a, "EVAL", link->scripts[script].source, nkeys, argc, argv, argvlen);
}

int redis_link_fcall(RedisLink *link, const char *function, RedisReplyFn fn, void *userdata, unsigned nkeys,
                     int argc, const char *const *argv, const size_t *argvlen) {
        const SendArgs a = { .fn = fn, .userdata = userdata, .fcall = true, .script = -1 };

        assert_return(link, -EINVAL);
        assert_return(function, -EINVAL);
        assert_return(fn, -EINVAL);
        assert_return(argc >= 0 && (argc == 0 || argv), -EINVAL);
        assert_return(nkeys <= (unsigned) argc, -EINVAL);
        if (!link->library)
                return -ENOENT;
        if (link->phase != PHASE_UP || link->ending)
                return -ENOTCONN;
        return link_send_script(link, &a, "FCALL", function, nkeys, argc, argv, argvlen);
}
