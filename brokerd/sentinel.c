/* SPDX-License-Identifier: MIT */
#include "sentinel.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>

#include "log.h"
#include "macro.h"
#include "redis-link.h"

#define SWITCH_CHANNEL "+switch-master"
/* Between the starts of two confirmation rounds. They are also the safety net under the subscription: a
 * watch link silently cut (no RST, keepalive not yet failing) would miss a +switch-master, which the next
 * round's majority then tells. */
#define CONFIRM_INTERVAL (1 * USEC_PER_SEC)
/* After every Sentinel of the list failed in a row, before starting over with the next. */
#define ROUND_BACKOFF (1 * USEC_PER_SEC)
#define COMMAND_TIMEOUT_DEFAULT (1 * USEC_PER_SEC)
/* "[HOST]:PORT", HOST a name (253 bytes at most, redis-endpoint.c) or an address. */
#define ADDRESS_MAX (253 + 2 + 1 + 5 + 1)

/* One Sentinel of the list: its own link, asked once a round; the current one's also carries the question
 * where the primary is (one connection to it less per brokerd: a fleet's thousands on the first Sentinel). */
typedef struct SentinelVoter {
        Sentinel *sentinel;
        RedisLink *link;
        char address[ADDRESS_MAX];      /* the Sentinel's */
        bool down;                      /* its link said it is down, and has not been up since */
        bool asked;                     /* the question where the primary is, out on its link */
        uint64_t round;                 /* the round its question belongs to; 0: none out */
        char host[253 + 1];             /* its answer this round ("": none, or nonsense); a name or an address */
        unsigned port;
        char answer[ADDRESS_MAX];       /* … as "HOST:PORT" */
} SentinelVoter;

struct Sentinel {
        sd_event *event;
        RedisEndpoint endpoint;         /* REDIS_ENDPOINT_SENTINEL */
        SentinelOptions options;        /* password_file owned */
        RedisLink *watch;               /* subscribed to +switch-master */
        size_t current;                 /* the Sentinel asked (on its voter's link) and watched */
        size_t failed_in_row;           /* Sentinels that failed since the last good answer */
        bool asking, ask_again;
        sd_event_source *rotate_timer;
        sd_event_source *round_timer;   /* CONFIRM_INTERVAL: the next confirmation round */
        SentinelVoter *voters;          /* one per Sentinel of the list */
        uint64_t round;                 /* the round under way or last done (from 1) */
        usec_t round_boot;              /* CLOCK_BOOTTIME, when it began */
        size_t round_pending;           /* questions of the round not answered yet */
        bool resting;                   /* no rounds (sentinel_set_resting()) */
        bool round_again;               /* woken during a round: another one right after it */
        usec_t confirmed;               /* CLOCK_BOOTTIME start of the last round that confirmed; 0: none */
        /* The primary that round confirmed: a primary one Sentinel named since (an answer, +switch-master)
         * is not confirmed by it, however fresh. */
        char confirmed_primary[ADDRESS_MAX];
        char current_address[ADDRESS_MAX];
        char primary[ADDRESS_MAX];      /* "" before the first answer */
        uint64_t failovers;
        usec_t last_failover;
};

static void format_address(char *buf, size_t size, const char *host, unsigned port) {
        bool v6 = strchr(host, ':');
        snprintf(buf, size, "%s%s%s:%u", v6 ? "[" : "", host, v6 ? "]" : "", port);
}

/* The primary is at host:port, confirmed by the round that began at confirmed (0: one Sentinel's word, which
 * confirms nothing). Tells the owner if that is news, with the confirmation already in place. */
static void sentinel_set_primary(Sentinel *s, const char *host, unsigned port, const char *source, usec_t confirmed) {
        char address[ADDRESS_MAX], previous[ADDRESS_MAX];
        RedisEndpoint primary;

        format_address(address, sizeof address, host, port);
        if (streq(s->primary, address))
                return;
        if (redis_endpoint_sentinel_primary(&s->endpoint, host, (uint16_t) port, &primary) < 0) {
                log_oom();
                return; /* asked again at the next round */
        }
        bool failover = s->primary[0] != '\0';
        snprintf(previous, sizeof previous, "%s", s->primary);
        snprintf(s->primary, sizeof s->primary, "%s", address);
        if (confirmed > 0) {
                s->confirmed = confirmed;
                snprintf(s->confirmed_primary, sizeof s->confirmed_primary, "%s", address);
        }
        if (failover) {
                s->failovers++;
                s->last_failover = now_realtime();
                log_notice("Sentinel %s: the primary of %s moved from %s to %s (%s)", s->current_address,
                           s->endpoint.master, previous, address, source);
        } else
                log_info("Sentinel %s: the primary of %s is %s", s->current_address, s->endpoint.master, address);
        if (s->options.on_primary)
                s->options.on_primary(s, &primary, failover ? previous : NULL, failover, s->options.userdata);
        redis_endpoint_done(&primary);
}

/* The current Sentinel failed (cannot be reached, does not know the primary): the next one, at once
 * unless the whole list failed in a row. */
static void sentinel_failed(Sentinel *s) {
        int enabled = SD_EVENT_OFF;

        s->failed_in_row++;
        if (s->endpoint.n_sentinels < 2)
                return; /* the link retries its one Sentinel by itself */
        (void) sd_event_source_get_enabled(s->rotate_timer, &enabled);
        if (enabled != SD_EVENT_OFF)
                return;
        (void) sd_event_source_set_time_relative(s->rotate_timer,
                                                 s->failed_in_row % s->endpoint.n_sentinels == 0 ? ROUND_BACKOFF : 0);
        (void) sd_event_source_set_enabled(s->rotate_timer, SD_EVENT_ONESHOT);
}

static void sentinel_ask(Sentinel *s);

static SentinelVoter *sentinel_current(Sentinel *s) {
        return &s->voters[s->current];
}

/* A port as a Sentinel writes it: 1 to 5 decimal digits, nothing else (strtoul() takes " +1"). */
static bool port_is_valid(const redisReply *r) {
        if (r->len == 0 || r->len > 5 || strlen(r->str) != r->len)
                return false;
        for (size_t i = 0; i < r->len; i++)
                if (r->str[i] < '0' || r->str[i] > '9')
                        return false;
        return true;
}

static void on_answer(RedisLink *link, int error, const redisReply *reply, void *userdata) {
        SentinelVoter *v = userdata;
        Sentinel *s = v->sentinel;

        if (!v->asked)
                return; /* a second answer of one Sentinel, asked again before the first came */
        v->asked = false;
        if (v != sentinel_current(s))
                return; /* asked before brokerd moved to another Sentinel: its word no longer counts */
        s->asking = false;
        if (error < 0)
                return; /* the link says why, and asks again once up */
        /* [host, port]: a host name's length at most, a port in decimal (SPEC §11: a Sentinel is input too). */
        if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 2 && reply->element[0]->type == REDIS_REPLY_STRING &&
            reply->element[1]->type == REDIS_REPLY_STRING && reply->element[0]->len <= 253 &&
            strlen(reply->element[0]->str) == reply->element[0]->len && port_is_valid(reply->element[1])) {
                char *end;
                unsigned long port = strtoul(reply->element[1]->str, &end, 10);
                if (*end == '\0' && port > 0 && port <= 65535 && reply->element[0]->len > 0) {
                        s->failed_in_row = 0;
                        sentinel_set_primary(s, reply->element[0]->str, (unsigned) port, "asked", 0);
                        goto next;
                }
        }
        if (reply->type == REDIS_REPLY_NIL)
                log_warning("Sentinel %s does not monitor a primary called %s; asking the next one",
                            s->current_address, s->endpoint.master);
        else
                log_warning("Sentinel %s answered SENTINEL get-master-addr-by-name %s with %s; asking the next one",
                            s->current_address, s->endpoint.master,
                            reply->type == REDIS_REPLY_ERROR ? reply->str : "an unexpected reply");
        sentinel_failed(s);
next:
        if (s->ask_again) {
                s->ask_again = false;
                sentinel_ask(s);
        }
}

static void sentinel_ask(Sentinel *s) {
        SentinelVoter *v = sentinel_current(s);

        if (s->asking) {
                s->ask_again = true; /* the answer in flight may predate what made the owner ask */
                return;
        }
        if (redis_link_get_state(v->link) != REDIS_LINK_UP)
                return; /* asked when it is */
        if (redis_link_command(v->link, on_answer, v, 3,
                               (const char *const[]) { "SENTINEL", "get-master-addr-by-name", s->endpoint.master },
                               NULL) >= 0)
                s->asking = v->asked = true;
}

/* "+switch-master": "MASTER OLD-IP OLD-PORT NEW-IP NEW-PORT". */
static void on_message(RedisLink *link, const char *channel, const char *message, size_t len, void *userdata) {
        Sentinel *s = userdata;
        char name[256], old_ip[64], new_ip[64];
        unsigned old_port, new_port;

        if (!streq(channel, SWITCH_CHANNEL) || len >= 512)
                return;
        if (sscanf(message, "%255s %63s %u %63s %u", name, old_ip, &old_port, new_ip, &new_port) != 5 ||
            !streq(name, s->endpoint.master) || new_port == 0 || new_port > 65535)
                return; /* another primary the Sentinel monitors */
        sentinel_set_primary(s, new_ip, new_port, SWITCH_CHANNEL, 0);
}

static void on_link_log(RedisLink *link, int priority, const char *message, void *userdata) {
        Sentinel *s = userdata;
        log_full_errno(priority, 0, "Sentinel %s: %s", s->current_address, message);
}

/* Every voter's link: the current Sentinel's is also the one asked where the primary is. */
static void on_voter_state(RedisLink *link, RedisLinkState state, const char *detail, void *userdata) {
        SentinelVoter *v = userdata;
        Sentinel *s = v->sentinel;

        v->down = state != REDIS_LINK_UP;
        if (v != sentinel_current(s))
                return;
        if (state == REDIS_LINK_UP)
                sentinel_ask(s);
        else {
                s->asking = false;
                log_full_errno(s->failed_in_row == 0 ? LOG_WARNING : LOG_DEBUG, 0, "Sentinel %s: %s", v->address,
                               detail ?: "down");
                sentinel_failed(s);
        }
}

static void on_watch_state(RedisLink *link, RedisLinkState state, const char *detail, void *userdata) {
        /* Subscribed again: what was published meanwhile is lost, so ask. */
        if (state == REDIS_LINK_UP)
                sentinel_ask(userdata);
}

/* Asks Sentinel i (on its voter's link) and watches it. */
static int sentinel_point(Sentinel *s, size_t i) {
        const RedisSentinelAddress *a = &s->endpoint.sentinels[i];
        RedisEndpoint e = { .type = REDIS_ENDPOINT_TCP, .host = a->host, .port = a->port };
        int r;

        s->current = i;
        format_address(s->current_address, sizeof s->current_address, a->host, a->port);
        s->asking = false; /* an answer the one before still owes is not waited for (on_answer()) */
        r = redis_link_set_endpoint(s->watch, &e);
        if (r < 0)
                return r;
        /* Its link was there all along: up, asked at once; down since its last failure (which it would not
         * tell again), failed at once as a fresh connection would; still connecting, asked once up. */
        if (redis_link_get_state(sentinel_current(s)->link) == REDIS_LINK_UP)
                sentinel_ask(s);
        else if (sentinel_current(s)->down)
                sentinel_failed(s);
        return 0;
}

static int on_rotate(sd_event_source *es, uint64_t usec, void *userdata) {
        Sentinel *s = userdata;
        if (sentinel_point(s, (s->current + 1) % s->endpoint.n_sentinels) < 0)
                sentinel_failed(s);
        return 0;
}

/* ---- confirmation rounds ----
 *
 * Every CONFIRM_INTERVAL every Sentinel of the list is asked where the primary is, each on its own link.
 * A majority of the configured list (not of those that answered) naming the primary in use confirms it as of
 * the round's start, as soon as its answers are in (the others cannot undo a majority). When the last answer
 * (or timeout) is in, the round ends: a majority naming another node makes that
 * the primary (the first answer, or a failover the watch missed), but only once the primary in use has gone
 * unconfirmed for SENTINEL_CONFIRM_STALE: right after a failover the Sentinels that have not heard of it
 * yet still name the old primary, and a round must not take brokerd back to it (the watch's +switch-master
 * comes from a Sentinel that has switched; the others follow within seconds). That clock is the last
 * confirmation of any primary, so that a lone Sentinel cannot hold brokerd away from the majority's for long.
 *
 * A confirmation is of an address: a primary one Sentinel named (its answer, its +switch-master) is not
 * confirmed until a round's majority names it too, however fresh the confirmation of the one before. That
 * Sentinel may be the leader of a real failover, or a lone one (lagging, cut off, lying) naming a node the
 * majority does not: a pool that granted on it while the other brokerds grant on the majority's primary
 * would hold every slot twice.
 *
 * What it promises: Sentinel promotes a replica only with the votes of a majority of the Sentinels, and
 * the leader names the new primary from the failover F on, the others once its new configuration reaches
 * them (hello messages, every 2 s). So the last round that can confirm the old primary is one that began
 * before F, or before the others learnt of it when this brokerd cannot reach the leader (which the 2 s of
 * slack in the self-fence margin covers): a brokerd cut off with the old primary sees its confirmations
 * stop there, and its pools fence from them (pool-shared.c, vouch_base()) before the new primary's
 * recovery window (one node TTL after F) ends. The cost: with a majority of the Sentinels down or out of
 * reach, nothing is confirmed and every pool behind them is refused, then fenced, although the primary may
 * be fine; a brokerd cannot tell that case from being the one cut off. */

SentinelVerdict sentinel_round_verdict(const char *const *answers, size_t n, const char *primary, bool stale,
                                       size_t *ret_index) {
        /* A majority of the list, not of those that answered: two Sentinels of three that cannot be reached
         * leave the third alone, and it may be the one cut off with an old primary. */
        size_t majority = n / 2 + 1;

        for (size_t i = 0; i < n; i++) {
                size_t votes = 0;
                if (!answers[i])
                        continue;
                for (size_t j = 0; j < n; j++)
                        if (streq_ptr(answers[j], answers[i]))
                                votes++;
                if (votes < majority)
                        continue;
                if (primary && streq(answers[i], primary))
                        return SENTINEL_VERDICT_CONFIRM;
                if (!stale)
                        return SENTINEL_VERDICT_NONE;
                if (ret_index)
                        *ret_index = i;
                return SENTINEL_VERDICT_MOVE;
        }
        return SENTINEL_VERDICT_NONE;
}

/* The round confirmed the primary in use, and the Sentinel asked (and watched) named another: the links move
 * to the next one of the list that named the majority's. Else the lone one's word would take brokerd back to
 * its primary whenever the owner asks again (at every reconnection), by turns with the rounds, and the pools
 * would be refused most of the time while it lags or is cut off from the others. */
static void sentinel_follow_majority(Sentinel *s, size_t n) {
        if (n < 2 || s->current >= n)
                return;
        const SentinelVoter *asked = &s->voters[s->current];
        if (!asked->host[0] || streq(asked->answer, s->primary))
                return;
        for (size_t k = 1; k < n; k++) {
                size_t i = (s->current + k) % n;
                if (!s->voters[i].host[0] || !streq(s->voters[i].answer, s->primary))
                        continue;
                log_notice("Sentinel %s names %s as the primary of %s, a majority of them %s: asking %s instead",
                           s->current_address, asked->answer, s->endpoint.master, s->primary, s->voters[i].address);
                if (sentinel_point(s, i) < 0)
                        sentinel_failed(s);
                return;
        }
}

/* The round's answers so far, NULL for a Sentinel that gave none (yet); returns their number. */
static size_t sentinel_round_answers(const Sentinel *s, const char **answers) {
        size_t n = MIN(s->endpoint.n_sentinels, (size_t) REDIS_ENDPOINT_SENTINELS_MAX);
        for (size_t i = 0; i < n; i++)
                answers[i] = s->voters[i].host[0] ? s->voters[i].answer : NULL;
        return n;
}

static void sentinel_confirm(Sentinel *s) {
        s->confirmed = s->round_boot;
        snprintf(s->confirmed_primary, sizeof s->confirmed_primary, "%s", s->primary);
}

/* A majority of the list naming the primary in use decides the round whatever the others answer: the
 * confirmation (as of the round's start, as ever) goes to the owner now, not once the slowest Sentinel answered
 * or its question timed out. A request that woke the resting rounds waited for that: a second behind one
 * Sentinel that hangs with its connection up (bench-sentinel-wake.py), a fail-fast one too. The round still ends
 * at its last answer (sentinel_round_end()), which decides the rest: a move, the Sentinel to ask, the next round. */
static void sentinel_round_confirm_early(Sentinel *s) {
        const char *answers[REDIS_ENDPOINT_SENTINELS_MAX];

        if (sentinel_get_confirmed(s) == s->round_boot)
                return; /* by an answer before this one */
        size_t n = sentinel_round_answers(s, answers);
        if (sentinel_round_verdict(answers, n, s->primary, false, NULL) != SENTINEL_VERDICT_CONFIRM)
                return;
        sentinel_confirm(s);
        if (s->options.on_round)
                s->options.on_round(s, sentinel_get_confirmed(s), s->round_boot, s->options.userdata);
}

static void sentinel_round_end(Sentinel *s) {
        const char *answers[REDIS_ENDPOINT_SENTINELS_MAX];
        size_t n = sentinel_round_answers(s, answers), moved_to = 0;

        bool stale = s->confirmed == 0 || s->round_boot >= usec_add(s->confirmed, SENTINEL_CONFIRM_STALE);
        switch (sentinel_round_verdict(answers, n, s->primary, stale, &moved_to)) {
        case SENTINEL_VERDICT_MOVE: {
                const SentinelVoter *v = &s->voters[moved_to];
                sentinel_set_primary(s, v->host, v->port, "a majority of the Sentinels", s->round_boot);
                break;
        }
        case SENTINEL_VERDICT_CONFIRM:
                sentinel_confirm(s);
                break;
        default:
                break;
        }
        if (sentinel_get_confirmed(s) == s->round_boot)
                sentinel_follow_majority(s, n);
        if (s->round_again) {
                s->round_again = false;
                (void) sd_event_source_set_time_relative(s->round_timer, 0);
        }
        if (s->options.on_round)
                s->options.on_round(s, sentinel_get_confirmed(s), s->round_boot, s->options.userdata);
}

static void on_vote(RedisLink *link, int error, const redisReply *reply, void *userdata) {
        SentinelVoter *v = userdata;
        Sentinel *s = v->sentinel;

        if (v->round != s->round)
                return;
        v->round = 0;
        if (error == 0 && reply->type == REDIS_REPLY_ARRAY && reply->elements == 2 &&
            reply->element[0]->type == REDIS_REPLY_STRING && reply->element[1]->type == REDIS_REPLY_STRING &&
            reply->element[0]->len > 0 && reply->element[0]->len < sizeof v->host &&
            strlen(reply->element[0]->str) == reply->element[0]->len && port_is_valid(reply->element[1])) {
                char *end;
                unsigned long port = strtoul(reply->element[1]->str, &end, 10);
                if (*end == '\0' && port > 0 && port <= 65535) {
                        snprintf(v->host, sizeof v->host, "%s", reply->element[0]->str);
                        v->port = (unsigned) port;
                        format_address(v->answer, sizeof v->answer, v->host, v->port);
                }
        }
        if (--s->round_pending == 0)
                sentinel_round_end(s);
        else
                sentinel_round_confirm_early(s);
}

static int on_round(sd_event_source *es, uint64_t usec, void *userdata) {
        Sentinel *s = userdata;

        (void) sd_event_source_set_time_relative(es, CONFIRM_INTERVAL);
        if (s->round_pending > 0)
                return 0; /* the last one waits for its timeouts: it ends first */
        s->round++;
        s->round_boot = now_boottime();
        for (size_t i = 0; i < s->endpoint.n_sentinels; i++) {
                SentinelVoter *v = &s->voters[i];
                v->host[0] = '\0';
                v->round = 0;
                if (redis_link_get_state(v->link) != REDIS_LINK_UP)
                        continue; /* no vote: it counts against a majority */
                if (redis_link_command(v->link, on_vote, v, 3,
                                       (const char *const[]) { "SENTINEL", "get-master-addr-by-name",
                                                               s->endpoint.master },
                                       NULL) < 0)
                        continue;
                v->round = s->round;
                s->round_pending++;
        }
        if (s->round_pending == 0)
                sentinel_round_end(s);
        return 0;
}

static void on_voter_log(RedisLink *link, int priority, const char *message, void *userdata) {
        SentinelVoter *v = userdata;
        /* The Sentinel asked where the primary is, as the watch's; the others' only for debugging (a Sentinel
         * down says so once a second, and the rounds count it). */
        log_full_errno(v == sentinel_current(v->sentinel) ? priority : LOG_DEBUG, 0, "Sentinel %s: %s", v->address,
                       message);
}

/* What every link to a Sentinel shares: the watch's and the voters'. */
static RedisLinkOptions sentinel_link_options(const Sentinel *s, void *userdata) {
        return (RedisLinkOptions) {
                .password_file = s->options.password_file,
                .command_timeout = s->options.command_timeout,
                .backoff_max = ROUND_BACKOFF,
                .sentinel = true,
                .userdata = userdata,
        };
}

static int sentinel_voters_new(Sentinel *s) {
        size_t n = s->endpoint.n_sentinels;
        s->voters = calloc(n, sizeof(SentinelVoter));
        if (!s->voters)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                SentinelVoter *v = &s->voters[i];
                const RedisSentinelAddress *a = &s->endpoint.sentinels[i];
                RedisEndpoint e = { .type = REDIS_ENDPOINT_TCP, .host = a->host, .port = a->port };
                v->sentinel = s;
                format_address(v->address, sizeof v->address, a->host, a->port);
                RedisLinkOptions o = sentinel_link_options(s, v);
                o.on_state = on_voter_state;
                o.on_log = on_voter_log;
                int r = redis_link_new(s->event, &e, &o, &v->link);
                if (r < 0)
                        return r;
        }
        return 0;
}

int sentinel_new(sd_event *event, const RedisEndpoint *endpoint, const SentinelOptions *options, Sentinel **ret) {
        int r;

        assert_return(event, -EINVAL);
        assert_return(endpoint && endpoint->type == REDIS_ENDPOINT_SENTINEL && endpoint->n_sentinels > 0, -EINVAL);
        assert_return(ret, -EINVAL);

        Sentinel *s = calloc(1, sizeof(Sentinel));
        if (!s)
                return -ENOMEM;
        s->event = sd_event_ref(event);
        s->options = options ? *options : (SentinelOptions) {};
        s->options.password_file = NULL;
        if (s->options.command_timeout == 0)
                s->options.command_timeout = COMMAND_TIMEOUT_DEFAULT;
        r = redis_endpoint_copy(endpoint, &s->endpoint);
        if (r < 0) {
                s->endpoint = (RedisEndpoint) {};
                goto fail;
        }
        if (options && strdup_or_null(options->password_file, (char **) &s->options.password_file) < 0) {
                r = -ENOMEM;
                goto fail;
        }

        RedisLinkOptions o = sentinel_link_options(s, s);
        o.on_log = on_link_log;
        o.blocking = true;
        o.on_state = on_watch_state;
        r = redis_link_new(event, NULL, &o, &s->watch);
        if (r < 0)
                goto fail;
        r = redis_link_subscribe(s->watch, SWITCH_CHANNEL, on_message, s);
        if (r < 0)
                goto fail;
        r = sd_event_add_time(event, &s->rotate_timer, CLOCK_MONOTONIC, USEC_INFINITY, USEC_PER_MSEC, on_rotate, s);
        if (r < 0)
                goto fail;
        (void) sd_event_source_set_enabled(s->rotate_timer, SD_EVENT_OFF);
        r = sentinel_voters_new(s);
        if (r < 0)
                goto fail;
        /* The first round once the links had a moment to connect; then every CONFIRM_INTERVAL. */
        r = sd_event_add_time_relative(event, &s->round_timer, CLOCK_MONOTONIC, CONFIRM_INTERVAL / 4,
                                       USEC_PER_MSEC * 10, on_round, s);
        if (r < 0)
                goto fail;
        (void) sd_event_source_set_enabled(s->round_timer, SD_EVENT_ON);
        r = sentinel_point(s, 0);
        if (r < 0)
                goto fail;

        *ret = s;
        return 0;
fail:
        sentinel_free(s);
        return r;
}

Sentinel *sentinel_free(Sentinel *s) {
        if (!s)
                return NULL;
        redis_link_free(s->watch);
        for (size_t i = 0; s->voters && i < s->endpoint.n_sentinels; i++)
                redis_link_free(s->voters[i].link);
        free(s->voters);
        sd_event_source_disable_unref(s->rotate_timer);
        sd_event_source_disable_unref(s->round_timer);
        redis_endpoint_done(&s->endpoint);
        free((char *) s->options.password_file);
        sd_event_unref(s->event);
        return mfree(s);
}

void sentinel_rediscover(Sentinel *s) {
        if (s)
                sentinel_ask(s);
}

void sentinel_set_resting(Sentinel *s, bool resting) {
        if (!s || s->resting == resting)
                return;
        s->resting = resting;
        if (resting) {
                /* A round under way ends as any: its answers are in flight already. */
                s->round_again = false;
                (void) sd_event_source_set_enabled(s->round_timer, SD_EVENT_OFF);
                return;
        }
        /* One that began before the wake is no answer to it: the owner waits for one that begins after. */
        if (s->round_pending > 0)
                s->round_again = true;
        else
                (void) sd_event_source_set_time_relative(s->round_timer, 0);
        (void) sd_event_source_set_enabled(s->round_timer, SD_EVENT_ON);
}

const char *sentinel_get_primary(const Sentinel *s) {
        return s && s->primary[0] ? s->primary : NULL;
}

const char *sentinel_get_current(const Sentinel *s) {
        return s ? s->current_address : NULL;
}

uint64_t sentinel_get_failovers(const Sentinel *s) {
        return s ? s->failovers : 0;
}

usec_t sentinel_get_last_failover(const Sentinel *s) {
        return s ? s->last_failover : 0;
}

usec_t sentinel_get_confirmed(const Sentinel *s) {
        return s && s->primary[0] && streq(s->confirmed_primary, s->primary) ? s->confirmed : 0;
}
