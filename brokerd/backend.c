/* SPDX-License-Identifier: MIT */
#include "backend.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <time.h>

#include "log.h"
#include "macro.h"
#include "redis-endpoint.h"
#include "redis-link.h"
#include "sentinel.h"
#include "shared-scripts.h"

/* Entries per stream and read, fewer when many pools share a backend: a read of every stream stays well
 * under a reply's cap (REDIS_REPLY_VALUES_MAX; an entry is 31 values). */
#define XREAD_COUNT 256
#define XREAD_ENTRIES_MAX 4096
#define XREAD_BLOCK (5 * USEC_PER_SEC)
/* While a pool has nowhere to read from yet (its first tick is out), it can only join the next XREAD: the
 * read blocks briefly then, or the pool's stream would be unread for up to XREAD_BLOCK after its first
 * tick. A pool that never registers (refused, rules that differ) keeps the reads short: ten a second. */
#define XREAD_BLOCK_JOINING (100 * USEC_PER_MSEC)
/* While no pool of the backend has a request of this node out or waiting (pool_shared_stream_idle()), the
 * read blocks this long: an entry appended ends it at once all the same (the block bounds only how often an
 * idle node reads nothing: one round trip every 5 s was a third of its round trips, issue 21 item 3), and
 * the connection's TCP keepalive (redis-link.c: probes after 15 s idle) finds it dead meanwhile. */
#define XREAD_BLOCK_IDLE (60 * USEC_PER_SEC)
#define READ_RETRY (1 * USEC_PER_SEC)
#define WAITER_GRACE (5 * USEC_PER_SEC)
#define HEARTBEAT (1 * USEC_PER_SEC)

/* One pool on a Backend. serial tells a reply for a pool that was freed (and maybe replaced at the same
 * address) from one for the live pool. */
typedef struct BackendPool {
        Pool *pool;
        uint64_t serial;
        SharedPoolParams params;
        usec_t announced_fence;         /* the self-fence deadline on_fence_moved() last told */
        bool in_read;                   /* its stream is named by the XREAD in flight */
} BackendPool;

typedef struct InFlight InFlight;
typedef struct Renewal Renewal;

struct Backend {
        BackendTable *table;
        char *url, *user, *password_file; /* what makes two pools' backends the same one */
        char *sentinel_password_file;
        RedisLink *commands;
        RedisLink *reader;
        Sentinel *sentinel;             /* redis-sentinel://: where the links connect; NULL otherwise */
        const char *functions[_SHARED_SCRIPT_MAX]; /* FCALL's names in the library, by SharedScript */
        BackendPool **pools;
        size_t n_pools;
        uint64_t next_serial;
        uint64_t call_order;            /* SharedPoolParams.call_order of every pool here */
        sd_event_source *flush;         /* defer: send what the pools queued, after this dispatch */
        sd_event_source *fence_timer;   /* CLOCK_BOOTTIME: the earliest self-fence deadline */
        sd_event_source *read_retry;    /* after an error reply to XREAD, or a follow: not a busy loop */
        usec_t reader_followed;         /* when the reader last reconnected to follow the commands' server */
        bool reading;                   /* an XREAD is in flight */
        usec_t read_sent, read_block;   /* the XREAD in flight: when it went, and its BLOCK */
        bool read_cut;                  /* … cut short for a pool that joined since (backend_read_join()) */
        InFlight *in_flight;            /* script calls sent and not answered: ours to free */
        /* Liveness per node (brokerd/lua/README, "Liveness per node"): one renewal every renew_period for
         * the pools that registered this incarnation, at most one in flight (ours to free). */
        sd_event_source *renew_timer;   /* CLOCK_MONOTONIC, every renew_period; HEARTBEAT after a failure */
        usec_t renew_period;            /* the shortest pool_shared_renew_period() of the last renewal's pools */
        const char *renew_function;     /* FCALL's name of "renew" in the library */
        char *renew_key;                /* "sb:live:NODE" */
        char *node_arg;                 /* ARGV[2]: "NODE/INCARNATION/PREVIOUS,…" */
        Renewal *renewal;
        bool renew_refused;             /* the last renewal was refused "identity": told once */
        /* An idle node (every pool holds nothing: backend_is_idle()) renews at the idle period, and its
         * command link's watch rests: the INFO goes along with its next call instead, ahead of it. */
        bool renew_idle;                /* the last renewal went at the idle period */
        usec_t renew_sent;              /* monotonic: when the last renewal went */
        bool watch_resting;             /* redis_link_watch_rest() since the last call sent */
        /* Behind Sentinels, the confirmation rounds rest while every pool may let them
         * (backend_pace_confirmations()); woke_boot: CLOCK_BOOTTIME of the last wake, 0 none. */
        bool confirm_resting;
        usec_t confirm_woke_boot;
};

/* A renewal sent: the pools it named (by serial: one may be freed meanwhile), and when. */
struct Renewal {
        Backend *backend;
        usec_t sent_boot;
        usec_t period;
        size_t n;
        uint64_t serials[];
};

/* What a reply callback needs to find its pool again. The Backend owns it, not the link: a freed link
 * drops its calls without calling back. */
struct InFlight {
        Backend *backend;
        InFlight *prev, *next;
        uint64_t serial;
        uint64_t call_id;
        usec_t sent_boot;
        bool wait;                      /* a WAIT: it blocks by design, its time is not a round trip */
};

static InFlight *in_flight_new(Backend *b) {
        InFlight *f = calloc(1, sizeof(InFlight));
        if (!f)
                return NULL;
        *f = (InFlight) { .backend = b, .next = b->in_flight };
        if (b->in_flight)
                b->in_flight->prev = f;
        b->in_flight = f;
        return f;
}

static void in_flight_free(InFlight *f) {
        if (!f)
                return;
        if (f->prev)
                f->prev->next = f->next;
        else
                f->backend->in_flight = f->next;
        if (f->next)
                f->next->prev = f->prev;
        free(f);
}

static BackendPool *backend_find_serial(Backend *b, uint64_t serial) {
        for (size_t i = 0; i < b->n_pools; i++)
                if (b->pools[i]->serial == serial)
                        return b->pools[i];
        return NULL;
}

/* ---- hiredis replies to RespValues ---- */

static size_t reply_count(const redisReply *r) {
        size_t n = 1;
        if (r->type == REDIS_REPLY_ARRAY)
                for (size_t i = 0; i < r->elements; i++)
                        n += reply_count(r->element[i]);
        return n;
}

/* Fills *v from r, children from *next on (a flat array sized by reply_count()). Strings stay hiredis's. */
static void reply_convert(const redisReply *r, RespValue *v, RespValue **next) {
        *v = (RespValue) {};
        switch (r->type) {
        case REDIS_REPLY_STRING:
        case REDIS_REPLY_STATUS:
                v->type = RESP_STRING;
                v->str = r->str;
                v->len = r->len;
                break;
        case REDIS_REPLY_ERROR:
                v->type = RESP_ERROR;
                v->str = r->str;
                v->len = r->len;
                break;
        case REDIS_REPLY_INTEGER:
                v->type = RESP_INTEGER;
                v->integer = r->integer;
                break;
        case REDIS_REPLY_ARRAY: {
                RespValue *children = *next;
                *next += r->elements;
                v->type = RESP_ARRAY;
                v->elements = children;
                v->n = r->elements;
                for (size_t i = 0; i < r->elements; i++)
                        reply_convert(r->element[i], children + i, next);
                break;
        }
        default:
                v->type = RESP_NIL;
        }
}

/* The RespValue tree of r in one allocation (NULL: out of memory), valid as long as r. */
static RespValue *reply_to_resp(const redisReply *r) {
        /* Not zeroed: reply_convert() writes every value. */
        RespValue *all = malloc(reply_count(r) * sizeof(RespValue));
        if (!all)
                return NULL;
        RespValue *next = all + 1;
        reply_convert(r, all, &next);
        return all;
}

/* ---- after every callback: notices, the fence timer, what to send ---- */

static void backend_wake(void *userdata) {
        Backend *b = userdata;
        (void) sd_event_source_set_enabled(b->flush, SD_EVENT_ONESHOT);
}

static void backend_start_read(Backend *b);
static void backend_wake_reader(Backend *b);
static void backend_pace_confirmations(Backend *b);

/* Renewals for the holders of the pool's leases: paced by the deadline's moves (a second or more later,
 * which each acknowledged heartbeat makes), never held back when it moves earlier. */
static void backend_announce_fence(Backend *b, BackendPool *bp, usec_t deadline) {
        usec_t last = bp->announced_fence;
        if (deadline == last || (deadline > last && last != USEC_INFINITY && deadline - last < USEC_PER_SEC))
                return;
        bp->announced_fence = deadline;
        if (deadline != USEC_INFINITY && b->table->on_fence_moved)
                b->table->on_fence_moved(bp->pool->name, deadline, b->table->userdata);
}

static void backend_after(Backend *b) {
        usec_t fence = USEC_INFINITY;
        for (size_t i = 0; i < b->n_pools; i++) {
                Pool *p = b->pools[i]->pool;
                SharedNotice n;
                while (pool_shared_pop_notice(p, &n)) {
                        if (b->table->on_notice)
                                b->table->on_notice(p->name, &n, b->table->userdata);
                        shared_notice_done(&n);
                }
                usec_t f = pool_shared_fence_deadline(p);
                if (f < fence)
                        fence = f;
                backend_announce_fence(b, b->pools[i], f);
        }
        if (fence == USEC_INFINITY)
                (void) sd_event_source_set_enabled(b->fence_timer, SD_EVENT_OFF);
        else {
                (void) sd_event_source_set_time(b->fence_timer, fence);
                (void) sd_event_source_set_enabled(b->fence_timer, SD_EVENT_ONESHOT);
        }
        backend_wake(b);
        backend_wake_reader(b);
        backend_pace_confirmations(b);
        backend_start_read(b);
}

/* The self-fence, and what this node can no longer vouch for, before anything a reply or the stream says:
 * a brokerd that was stopped (or a host that was suspended) reads what Redis decided while it was away
 * only once it knows whether Redis may have dropped it meanwhile (memo §4.3). */
static void backend_fence_check(Backend *b) {
        usec_t boot = now_boottime(), now = now_monotonic();
        for (size_t i = 0; i < b->n_pools; i++)
                pool_shared_fence_check(b->pools[i]->pool, boot, now);
}

/* ---- script calls ---- */

static void on_call_reply(RedisLink *link, int error, const redisReply *reply, void *userdata) {
        InFlight *f = userdata;
        Backend *b = f->backend;
        uint64_t call_id = f->call_id;
        usec_t sent_boot = f->sent_boot;
        bool was_wait = f->wait;
        BackendPool *bp = backend_find_serial(b, f->serial);

        in_flight_free(f);
        if (!bp)
                return; /* the pool went away meanwhile */
        backend_fence_check(b);

        _cleanup_free_ RespValue *v = NULL;
        if (error == 0 && !was_wait && b->table->on_rtt)
                b->table->on_rtt(bp->pool->name, now_boottime() - MIN(now_boottime(), sent_boot), b->table->userdata);
        if (error == 0) {
                v = reply_to_resp(reply);
                if (!v)
                        error = -ENOMEM; /* as a lost reply: the call is made again, identical */
        }
        pool_shared_call_done(bp->pool, call_id, error, v, sent_boot, now_monotonic());
        backend_after(b);
}

/* The pool whose next call the engine made first, or NULL when no pool has one to send. */
static BackendPool *backend_next_caller(Backend *b) {
        BackendPool *next = NULL;
        uint64_t first = UINT64_MAX, order;
        for (size_t i = 0; i < b->n_pools; i++)
                if (pool_shared_next_call(b->pools[i]->pool, &order) && order < first) {
                        first = order;
                        next = b->pools[i];
                }
        return next;
}

/* Every call the pools may send now, in the order the engine made them whatever the pool (a pool's batch
 * goes at its first call's place): Redis decides as the engine's in-process pools would (a set granted
 * in one pool after another pool ran at the same instant, test-shared-diff). The oldest call waiting for its
 * pool's call out to be answered stops it there: nothing made after it passes it. */
static void backend_send_calls(Backend *b) {
        const SharedCall *c;
        usec_t now = now_monotonic();
        BackendPool *bp;
        while ((bp = backend_next_caller(b)) && pool_shared_take_call(bp->pool, now, &c)) {
                /* The first call after an idle spell: what the watch checks (eviction policy, role, run id)
                 * is read again ahead of it on the connection, so its reply is judged before the call's. */
                if (b->watch_resting) {
                        b->watch_resting = false;
                        (void) redis_link_watch_along(b->commands);
                }
                InFlight *f = in_flight_new(b);
                int r = -ENOMEM;
                if (f) {
                        f->serial = bp->serial;
                        f->call_id = c->id;
                        f->sent_boot = now_boottime();
                        f->wait = c->wait;
                        /* WAIT (backend-min-replicas) on the same link, in the outbox's order: it counts the
                         * writes this connection sent before it. */
                        r = c->wait ? redis_link_command(b->commands, on_call_reply, f, (int) c->argc, c->argv,
                                                         c->argvlen)
                                    : redis_link_fcall(b->commands, b->functions[c->script], on_call_reply, f,
                                                       c->n_keys, (int) c->argc, c->argv, c->argvlen);
                }
                if (r < 0) {
                        in_flight_free(f);
                        /* Not sent: the pool sends it again once the link is (back) up. */
                        pool_shared_call_done(bp->pool, c->id, r == -ENOMEM ? -ENOMEM : -ENOTCONN, NULL,
                                              now_boottime(), now);
                        return;
                }
        }
}

/* ---- liveness per node: the renewal ---- */

static void on_renew_reply(RedisLink *link, int error, const redisReply *reply, void *userdata) {
        Renewal *rn = userdata;
        Backend *b = rn->backend;
        b->renewal = NULL;
        backend_fence_check(b);
        /* { status, backend clock, { covered (1/0) per pool named }, { places of the pools to tick },
         * { place, fp_n, fp_x, fp_s, … of the pools read in full }, {} }: anything else covers none. */
        const redisReply *covered = NULL, *ticks = NULL, *fps = NULL;
        bool ok = false, refused = false;
        if (error == 0 && reply && reply->type == REDIS_REPLY_ARRAY && reply->elements == 6 &&
            reply->element[0]->type == REDIS_REPLY_STRING) {
                ok = streq(reply->element[0]->str, "ok");
                refused = streq(reply->element[0]->str, "identity");
                if (ok && reply->element[2]->type == REDIS_REPLY_ARRAY && reply->element[2]->elements == rn->n)
                        covered = reply->element[2];
                if (covered && reply->element[3]->type == REDIS_REPLY_ARRAY && reply->element[3]->elements <= rn->n)
                        ticks = reply->element[3];
                if (covered && reply->element[4]->type == REDIS_REPLY_ARRAY && reply->element[4]->elements % 4 == 0 &&
                    reply->element[4]->elements <= 4 * rn->n)
                        fps = reply->element[4];
        }
        if (refused != b->renew_refused) {
                b->renew_refused = refused;
                if (refused)
                        log_warning("Backend %s: another live process renews under this node id; this one's pools "
                                    "heartbeat on their own.", b->url);
        }
        usec_t now = now_monotonic();
        bool all = covered != NULL;
        for (size_t i = 0; i < rn->n; i++) {
                BackendPool *bp = backend_find_serial(b, rn->serials[i]);
                if (!bp)
                        continue; /* the pool went away meanwhile */
                bool yes = covered && covered->element[i]->type == REDIS_REPLY_INTEGER &&
                           covered->element[i]->integer == 1;
                /* A node registered there is dead: this node's tick reaps it. */
                bool tick = false;
                for (size_t j = 0; ticks && j < ticks->elements; j++) {
                        const redisReply *t = ticks->element[j];
                        if (t->type == REDIS_REPLY_INTEGER && t->integer == (long long) i + 1)
                                tick = true;
                }
                all = all && yes;
                for (size_t j = 0; yes && fps && j < fps->elements; j += 4) {
                        redisReply *const *f = fps->element + j;
                        if (f[0]->type == REDIS_REPLY_INTEGER && f[0]->integer == (long long) i + 1 &&
                            f[1]->type == REDIS_REPLY_INTEGER && f[2]->type == REDIS_REPLY_INTEGER &&
                            f[3]->type == REDIS_REPLY_INTEGER)
                                pool_shared_renewal_fingerprint(bp->pool, f[1]->integer, f[2]->integer,
                                                                f[3]->integer, now);
                }
                pool_shared_renewed(bp->pool, yes, tick, rn->sent_boot, rn->period, now);
        }
        /* A renewal that failed or left a pool uncovered is tried again at the heartbeat, not a period later:
         * the self-fence counts from the last one that went through. */
        if (!all) {
                (void) sd_event_source_set_time(b->renew_timer, now + HEARTBEAT);
                (void) sd_event_source_set_enabled(b->renew_timer, SD_EVENT_ONESHOT);
        }
        free(rn);
        backend_after(b);
}

/* Whether no pool holds anything of this node's: no lease to fence, no request out or waiting. */
static bool backend_is_idle(const Backend *b) {
        for (size_t i = 0; i < b->n_pools; i++)
                if (!pool_shared_holds_nothing(b->pools[i]->pool))
                        return false;
        return true;
}

/* An idle node's stream link rests (redis-link.h): nothing of this node's is to come in its streams, and an
 * idle connection is one of Redis's clients all the same (maxclients: 10,000 by default; its cron visits
 * each; tests/bench/README.md, "One connection an idle node"). It rests at the second idle renewal in a row (15 s or more without a lease or a
 * request: a node between two jobs keeps it), once every entry the pools know of is read, and wakes as soon
 * as a pool holds something again (backend_wake_reader()): the read goes on from the last entry read, so
 * nothing appended meanwhile is missed. A request granted at once is answered on the command link. */
static void backend_rest_reader(Backend *b) {
        for (size_t i = 0; i < b->n_pools; i++)
                if (!pool_shared_stream_is_read(b->pools[i]->pool))
                        return;
        if (redis_link_rest(b->reader) > 0)
                log_debug("Redis %s: this node holds nothing; its stream link rests.", b->url);
}

static void backend_wake_reader(Backend *b) {
        if (!backend_is_idle(b) && redis_link_wake(b->reader) > 0)
                log_debug("Redis %s: a pool holds something; its stream link connects again.", b->url);
}

/* Behind Sentinels, an idle node asks nothing of them: each round is a question to every Sentinel, one a
 * second from every runner of a fleet that would guard nothing (no lease to fence, no request to grant;
 * tests/bench/README.md, "Stop 64": a Sentinel's CPU per idle runner). The rounds rest once every pool may
 * let them (pool_shared_confirm_may_rest()), and go again, a round at once, when a request comes: the pools
 * hold it until that round ends (pool-shared.h). */
static void backend_pace_confirmations(Backend *b) {
        if (!b->sentinel)
                return;
        bool rest = b->n_pools > 0;
        for (size_t i = 0; rest && i < b->n_pools; i++)
                rest = pool_shared_confirm_may_rest(b->pools[i]->pool);
        if (rest == b->confirm_resting)
                return;
        usec_t boot = now_boottime(), now = now_monotonic();
        b->confirm_resting = rest;
        if (!rest)
                b->confirm_woke_boot = boot;
        sentinel_set_resting(b->sentinel, rest);
        for (size_t i = 0; i < b->n_pools; i++)
                pool_shared_set_confirm_resting(b->pools[i]->pool, rest, boot, now);
        log_debug("Sentinels of %s: %s.", b->url, rest ? "this node holds nothing; the rounds rest"
                                                          : "a pool holds something; a round now, then every second");
}

/* How often to renew: the shortest period of the pools a renewal names, at the idle or the busy pace. */
static usec_t backend_renew_period(const Backend *b, bool idle) {
        usec_t period = idle ? SHARED_IDLE_RENEW_PERIOD_MAX : SHARED_RENEW_PERIOD_MAX;
        for (size_t i = 0; i < b->n_pools; i++)
                if (pool_shared_renewable(b->pools[i]->pool))
                        period = MIN(period, idle ? pool_shared_idle_renew_period(b->pools[i]->pool)
                                                  : pool_shared_renew_period(b->pools[i]->pool));
        return period;
}

/* A node that renewed at the idle pace holds something now (a request came): the next renewal comes a busy
 * period after the last one, at once if that passed, so that a lease granted now is fenced as ever. */
static void backend_pace_renewals(Backend *b) {
        if (!b->renew_idle || backend_is_idle(b))
                return;
        b->renew_idle = false;
        usec_t at = MAX(now_monotonic(), usec_add(b->renew_sent, backend_renew_period(b, false)));
        (void) sd_event_source_set_time(b->renew_timer, at);
        (void) sd_event_source_set_enabled(b->renew_timer, SD_EVENT_ONESHOT);
}

/* One FCALL for every pool whose last tick Redis answered for this incarnation: the pools it covers tick
 * only when they have something to do (pool-shared.c, heartbeat_due()). None in the manual clock mode. */
static void backend_renew(Backend *b) {
        if (b->renewal || !b->renew_function || !b->renew_key || b->table->manual_clock ||
            redis_link_get_state(b->commands) != REDIS_LINK_UP)
                return;
        size_t n = 0;
        for (size_t i = 0; i < b->n_pools; i++)
                if (pool_shared_renewable(b->pools[i]->pool))
                        n++;
        if (n == 0)
                return;
        Renewal *rn = calloc(1, sizeof(Renewal) + n * sizeof(uint64_t));
        _cleanup_free_ const char **argv = calloc(n + 7, sizeof(char *));
        _cleanup_free_ size_t *argvlen = calloc(n + 7, sizeof(size_t));
        if (!rn || !argv || !argvlen) {
                free(rn);
                log_oom(); /* the pools heartbeat on their own meanwhile */
                return;
        }
        bool idle = backend_is_idle(b);
        if (idle && b->renew_idle)
                backend_rest_reader(b);
        usec_t ttl = 0, period = backend_renew_period(b, idle);
        char ttl_s[64];
        size_t argc = 0;
        argv[argc++] = b->renew_key;
        argv[argc++] = "1";
        argv[argc++] = b->node_arg;
        argv[argc++] = "-";
        argv[argc++] = redis_link_get_run_id(b->commands) ?: "";
        argv[argc++] = "1";
        argv[argc++] = ttl_s;
        for (size_t i = 0; i < b->n_pools; i++)
                if (pool_shared_renewable(b->pools[i]->pool)) {
                        rn->serials[rn->n++] = b->pools[i]->serial;
                        argv[argc++] = pool_shared_key(b->pools[i]->pool);
                        ttl = MAX(ttl, b->pools[i]->params.node_ttl);
                }
        (void) snprintf(ttl_s, sizeof ttl_s, "%" PRIu64 "/%" PRIu64, (uint64_t) ttl, (uint64_t) period);
        for (size_t i = 0; i < argc; i++)
                argvlen[i] = strlen(argv[i]);
        rn->backend = b;
        rn->sent_boot = now_boottime();
        rn->period = period;
        b->renew_period = period;
        b->renew_idle = idle;
        b->renew_sent = now_monotonic();
        /* INFO's watch of the link goes with it when due: one round trip, not two (redis-link.h). An idle
         * node has nothing a changed policy, role or server could harm: its watch rests until its next
         * call (backend_send_calls()), whose INFO goes ahead of it. */
        if (idle) {
                (void) redis_link_watch_rest(b->commands);
                b->watch_resting = true;
        } else
                (void) redis_link_watch_along(b->commands);
        /* The key is KEYS[1]; the head and the pools are ARGV. */
        int r = redis_link_fcall(b->commands, b->renew_function, on_renew_reply, rn, 1, (int) argc, argv, argvlen);
        if (r < 0) {
                free(rn);
                return;
        }
        b->renewal = rn;
}

static int on_renew_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        Backend *b = userdata;
        /* Not usec + …: no catching up. Until a renewal goes out (no pool registered yet, the link down):
         * the heartbeat. */
        b->renew_period = HEARTBEAT;
        backend_renew(b);
        (void) sd_event_source_set_time(s, now_monotonic() + b->renew_period);
        (void) sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
        return 0;
}

static int on_flush(sd_event_source *s, void *userdata) {
        Backend *b = userdata;
        (void) sd_event_source_set_enabled(b->flush, SD_EVENT_OFF); /* when called by backend_table_send_first() */
        backend_wake_reader(b);
        backend_pace_confirmations(b);
        redis_link_cork(b->commands);
        backend_send_calls(b);
        backend_pace_renewals(b);
        redis_link_uncork(b->commands);
        /* Sending decides nothing; a refused send may have queued notices. */
        for (size_t i = 0; i < b->n_pools; i++) {
                SharedNotice n;
                while (pool_shared_pop_notice(b->pools[i]->pool, &n)) {
                        if (b->table->on_notice)
                                b->table->on_notice(b->pools[i]->pool->name, &n, b->table->userdata);
                        shared_notice_done(&n);
                }
        }
        return 0;
}

static int on_fence_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        Backend *b = userdata;
        backend_fence_check(b);
        backend_after(b);
        return 0;
}

/* ---- the stream reader ---- */

static BackendPool *backend_find_stream(Backend *b, const char *key, size_t len) {
        for (size_t i = 0; i < b->n_pools; i++) {
                const char *k = pool_shared_stream_key(b->pools[i]->pool);
                if (k && strlen(k) == len && memcmp(k, key, len) == 0)
                        return b->pools[i];
        }
        return NULL;
}

/* Whether the reader is connected to another server than the one the commands link is up on: a restart or
 * a failover that the two connections met at different moments (the reader still blocked on the old
 * primary). That server's entries are not the decisions of the pools' Redis: a grant there is of data the
 * pools reclaimed from (their run id changed), and applying it would hold a slot the current Redis counts
 * for nobody, or for the same request again. Its waiters' places queries ask the current one instead. */
static bool backend_reader_elsewhere(const Backend *b) {
        const char *reader = redis_link_get_run_id(b->reader), *commands = redis_link_get_run_id(b->commands);
        return redis_link_get_state(b->commands) == REDIS_LINK_UP && reader && commands && !streq(reader, commands);
}

/* XREAD's reply: [[key, [[id, [field, value, …]], …]], …], or nil when the block ran out. */
/* Returns whether the reply was of any use: an entry handed to a pool, or a read of another server (which
 * backend_reader_follow() paces). */
static bool backend_read_entries(Backend *b, const redisReply *reply) {
        usec_t now = now_monotonic();
        bool used = false;
        if (backend_reader_elsewhere(b))
                return true; /* dropped unread: the ids go on from the last entry of the current server's stream */
        for (size_t i = 0; i < reply->elements; i++) {
                const redisReply *s = reply->element[i];
                if (s->type != REDIS_REPLY_ARRAY || s->elements != 2 || s->element[0]->type != REDIS_REPLY_STRING ||
                    s->element[1]->type != REDIS_REPLY_ARRAY)
                        continue;
                BackendPool *bp = backend_find_stream(b, s->element[0]->str, s->element[0]->len);
                if (!bp)
                        continue;
                const redisReply *entries = s->element[1];
                for (size_t j = 0; j < entries->elements; j++) {
                        const redisReply *e = entries->element[j];
                        /* [id, [field, value, …]]; the pool checks the id's form and the fields (SPEC §11). */
                        if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 || e->element[0]->type != REDIS_REPLY_STRING ||
                            strlen(e->element[0]->str) != e->element[0]->len || e->element[1]->type != REDIS_REPLY_ARRAY) {
                                pool_shared_bad_input(bp->pool, "a malformed entry in XREAD's reply", now);
                                continue;
                        }
                        _cleanup_free_ RespValue *fields = reply_to_resp(e->element[1]);
                        if (!fields)
                                return true; /* read again from the last entry handed in */
                        pool_shared_stream_entry(bp->pool, e->element[0]->str, fields, now);
                        used = true;
                }
        }
        return used;
}

static void on_read_reply(RedisLink *link, int error, const redisReply *reply, void *userdata) {
        Backend *b = userdata;
        b->reading = false;
        backend_fence_check(b);
        bool used = false;
        if (error == 0 && reply->type == REDIS_REPLY_ARRAY)
                used = backend_read_entries(b, reply);
        else if (error == 0 && reply->type == REDIS_REPLY_ERROR) {
                log_warning("Redis refused to read the streams of shared pools: %s", reply->str);
                (void) sd_event_source_set_time_relative(b->read_retry, READ_RETRY);
                (void) sd_event_source_set_enabled(b->read_retry, SD_EVENT_ONESHOT);
                backend_after(b);
                return;
        }
        /* Nothing, well before the BLOCK ran out: Redis answers so only when a client unblocks this one, but a
         * server that answers at once would be read again at once, a round trip after another. */
        if (error == 0 && !used && now_monotonic() - b->read_sent < b->read_block / 2) {
                (void) sd_event_source_set_time_relative(b->read_retry, READ_RETRY);
                (void) sd_event_source_set_enabled(b->read_retry, SD_EVENT_ONESHOT);
        }
        /* An error (< 0): the link reconnects and says so; the read starts again then. */
        backend_after(b);
}

/* Whether every pool's stream is idle: the read may block XREAD_BLOCK_IDLE. */
static bool backend_read_is_idle(const Backend *b) {
        for (size_t i = 0; i < b->n_pools; i++)
                if (!pool_shared_stream_idle(b->pools[i]->pool))
                        return false;
        return true;
}

/* A read names the streams that were readable when it went out: a pool that joined since (added by a reload,
 * or its first tick answered late) would be read only at that read's end, up to XREAD_BLOCK (or
 * XREAD_BLOCK_IDLE) later, and its waiters' grants and refusals come meanwhile only with its heartbeat's
 * places query. Such a read is cut short by a new connection, once: rare (a reload that adds a pool), and no
 * command ends another client's block for a user without @admin (CLIENT UNBLOCK). */
static void backend_read_join(Backend *b) {
        if (!b->reading || b->read_cut)
                return;
        for (size_t i = 0; i < b->n_pools; i++) {
                Pool *p = b->pools[i]->pool;
                if (!b->pools[i]->in_read && pool_shared_stream_resume_id(p) && pool_shared_stream_key(p)) {
                        b->read_cut = true;
                        (void) redis_link_reconnect(b->reader, "A pool joins the stream read");
                        return;
                }
        }
}

/* The reader follows the commands link to its server (backend_reader_elsewhere()) by a new connection, at
 * most once per READ_RETRY: an endpoint that answers from two servers by turns would otherwise loop. */
static void backend_reader_follow(Backend *b) {
        usec_t now = now_monotonic();
        if (b->reader_followed != 0 && now - b->reader_followed < READ_RETRY) {
                (void) sd_event_source_set_time(b->read_retry, b->reader_followed + READ_RETRY);
                (void) sd_event_source_set_enabled(b->read_retry, SD_EVENT_ONESHOT);
                return;
        }
        b->reader_followed = now;
        log_notice("Redis %s: the stream read follows the commands to their server (run id %.100s, was %.100s).",
                   b->url, redis_link_get_run_id(b->commands), redis_link_get_run_id(b->reader));
        (void) redis_link_reconnect(b->reader, "The commands' server is another one");
}

static void backend_start_read(Backend *b) {
        backend_read_join(b);
        if (b->reading || redis_link_get_state(b->reader) != REDIS_LINK_UP)
                return;
        int enabled = SD_EVENT_OFF;
        (void) sd_event_source_get_enabled(b->read_retry, &enabled);
        if (enabled != SD_EVENT_OFF)
                return;
        if (backend_reader_elsewhere(b)) {
                backend_reader_follow(b);
                return;
        }

        size_t n = 0;
        for (size_t i = 0; i < b->n_pools; i++)
                if (pool_shared_stream_resume_id(b->pools[i]->pool) && pool_shared_stream_key(b->pools[i]->pool))
                        n++;
        if (n == 0)
                return; /* nothing to read before a pool's first tick: it gives the id to read from */

        _cleanup_free_ const char **argv = calloc(6 + 2 * n, sizeof(const char *));
        if (!argv)
                return; /* tried again after the next reply */
        size_t k = 0;
        argv[k++] = "XREAD";
        char count[16];
        snprintf(count, sizeof count, "%zu", MAX((size_t) 8, MIN((size_t) XREAD_COUNT, XREAD_ENTRIES_MAX / n)));
        argv[k++] = "COUNT";
        argv[k++] = count;
        bool joining = n < b->n_pools, idle = !joining && backend_read_is_idle(b);
        usec_t block = joining ? XREAD_BLOCK_JOINING : idle ? XREAD_BLOCK_IDLE : XREAD_BLOCK;
        char block_ms[32];
        snprintf(block_ms, sizeof block_ms, "%" PRIu64, (uint64_t) (block / USEC_PER_MSEC));
        argv[k++] = "BLOCK";
        argv[k++] = block_ms;
        argv[k++] = "STREAMS";
        for (size_t i = 0; i < b->n_pools; i++)
                if (pool_shared_stream_resume_id(b->pools[i]->pool) && pool_shared_stream_key(b->pools[i]->pool))
                        argv[k++] = pool_shared_stream_key(b->pools[i]->pool);
        for (size_t i = 0; i < b->n_pools; i++)
                if (pool_shared_stream_resume_id(b->pools[i]->pool) && pool_shared_stream_key(b->pools[i]->pool))
                        argv[k++] = pool_shared_stream_resume_id(b->pools[i]->pool);
        if (redis_link_command_blocking(b->reader, block, on_read_reply, b, (int) k, argv, NULL) < 0)
                return;
        b->reading = true;
        b->read_cut = false;
        b->read_sent = now_monotonic();
        b->read_block = block;
        for (size_t i = 0; i < b->n_pools; i++)
                b->pools[i]->in_read = pool_shared_stream_resume_id(b->pools[i]->pool) &&
                                       pool_shared_stream_key(b->pools[i]->pool);
}

static int on_read_retry(sd_event_source *s, uint64_t usec, void *userdata) {
        backend_start_read(userdata);
        return 0;
}

/* ---- the links ---- */

static void on_link_log(RedisLink *link, int priority, const char *message, void *userdata) {
        Backend *b = userdata;
        log_full_errno(priority, 0, "Redis %s: %s", b->url, message);
}

/* A link ended for a reply over the caps (redis-sdevent.h) is bad input of every pool on it. */
static void backend_count_overflow(Backend *b, RedisLink *link, RedisLinkState state, const char *what) {
        if (state != REDIS_LINK_FAILED || !streq_ptr(redis_link_get_failure(link), "reply-too-large"))
                return;
        for (size_t i = 0; i < b->n_pools; i++)
                pool_shared_bad_input(b->pools[i]->pool, what, now_monotonic());
}

static void on_commands_state(RedisLink *link, RedisLinkState state, const char *detail, void *userdata) {
        Backend *b = userdata;
        backend_fence_check(b);
        usec_t now = now_monotonic();
        backend_count_overflow(b, link, state, "a reply over the size cap");
        /* The node the Sentinels named cannot be reached, or is not a primary (INFO's role; a failover
         * under way, or an old primary back as a replica): they may know better by now. */
        if (state != REDIS_LINK_UP)
                sentinel_rediscover(b->sentinel);
        for (size_t i = 0; i < b->n_pools; i++) {
                Pool *p = b->pools[i]->pool;
                if (state == REDIS_LINK_UP)
                        pool_shared_link_up(p, detail ?: "", now);
                else if (state == REDIS_LINK_FAILED)
                        /* The word is what Status and the journal show; the link logged the sentence. */
                        pool_shared_link_failed(p, redis_link_get_failure(link) ?: "backend", now);
                else
                        pool_shared_link_down(p, now);
        }
        backend_after(b);
}

static void on_reader_state(RedisLink *link, RedisLinkState state, const char *detail, void *userdata) {
        Backend *b = userdata;
        if (state != REDIS_LINK_UP)
                b->reading = false;
        backend_count_overflow(b, link, state, "a stream read over the size cap");
        backend_after(b);
}

/* Where the Sentinels say the primary is: both links go there (at once, each is told DOWN first). A
 * failover needs nothing more here: the new primary's run id is another one, and pool-shared treats that as
 * a Redis restart (recovery window, reclaims), as SPEC §11 asks. */
static void on_sentinel_primary(Sentinel *s, const RedisEndpoint *primary, const char *previous, bool failover,
                                void *userdata) {
        Backend *b = userdata;
        if (redis_link_set_endpoint(b->commands, primary) < 0 || redis_link_set_endpoint(b->reader, primary) < 0)
                log_oom(); /* the Sentinels are asked again within seconds */
        /* Now, not at the next round, before the links can be up again: a primary one Sentinel named is not
         * vouched for by the confirmation of the one before, and is refused from its first reply on. */
        usec_t boot = now_boottime(), now = now_monotonic();
        for (size_t i = 0; i < b->n_pools; i++)
                pool_shared_set_confirmed(b->pools[i]->pool, sentinel_get_confirmed(s), boot, now);
        if (failover && b->table->on_failover)
                b->table->on_failover(b->url, previous, sentinel_get_primary(s), b->table->userdata);
        backend_after(b);
}

/* A confirmation round ended: every pool learns how fresh its primary's confirmation is (it refuses when
 * stale, and fences from it). One begun after a wake that did not confirm the primary ends the requests'
 * wait for it. */
static void on_sentinel_round(Sentinel *s, usec_t confirmed, usec_t round_boot, void *userdata) {
        Backend *b = userdata;
        usec_t boot = now_boottime(), now = now_monotonic();
        bool failed = !b->confirm_resting && b->confirm_woke_boot > 0 && round_boot >= b->confirm_woke_boot &&
                      confirmed != round_boot;
        for (size_t i = 0; i < b->n_pools; i++) {
                pool_shared_set_confirmed(b->pools[i]->pool, confirmed, boot, now);
                if (failed)
                        pool_shared_confirm_round_failed(b->pools[i]->pool, now);
        }
        backend_after(b);
}

static Backend *backend_free(Backend *b) {
        if (!b)
                return NULL;
        sentinel_free(b->sentinel);
        redis_link_free(b->commands);
        redis_link_free(b->reader);
        while (b->in_flight)
                in_flight_free(b->in_flight);
        free(b->renewal); /* the link that held it is freed: no callback */
        sd_event_source_disable_unref(b->renew_timer);
        free(b->renew_key);
        free(b->node_arg);
        sd_event_source_disable_unref(b->flush);
        sd_event_source_disable_unref(b->fence_timer);
        sd_event_source_disable_unref(b->read_retry);
        for (size_t i = 0; i < b->n_pools; i++)
                free(b->pools[i]);
        free(b->pools);
        free(b->url);
        free(b->user);
        free(b->password_file);
        free(b->sentinel_password_file);
        return mfree(b);
}

static int backend_new(BackendTable *t, const PoolConfig *pc, Backend **ret) {
        RedisEndpoint endpoint;
        int r = redis_endpoint_parse(pc->backend, &endpoint);
        if (r < 0)
                return r;

        Backend *b = calloc(1, sizeof(Backend));
        if (!b) {
                redis_endpoint_done(&endpoint);
                return -ENOMEM;
        }
        b->table = t;
        b->url = strdup(pc->backend);
        if (!b->url || strdup_or_null(pc->backend_user, &b->user) < 0 ||
            strdup_or_null(pc->backend_password_file, &b->password_file) < 0 ||
            strdup_or_null(pc->backend_sentinel_password_file, &b->sentinel_password_file) < 0)
                r = -ENOMEM;
        if (r >= 0)
                r = sd_event_add_defer(t->event, &b->flush, on_flush, b);
        if (r >= 0)
                r = sd_event_add_time(t->event, &b->fence_timer, CLOCK_BOOTTIME, USEC_INFINITY, 1, on_fence_timer, b);
        if (r >= 0)
                r = sd_event_add_time(t->event, &b->read_retry, CLOCK_MONOTONIC, USEC_INFINITY, 1, on_read_retry, b);
        if (r >= 0)
                r = sd_event_add_time_relative(t->event, &b->renew_timer, CLOCK_MONOTONIC, HEARTBEAT, 1, on_renew_timer, b);
        if (r >= 0 && t->node->identity) {
                if (asprintf(&b->renew_key, "sb:live:%s", t->node->id) < 0) {
                        b->renew_key = NULL;
                        r = -ENOMEM;
                } else if (asprintf(&b->node_arg, "%s/%s", t->node->id, t->node->identity) < 0) {
                        b->node_arg = NULL;
                        r = -ENOMEM;
                }
        }
        if (r >= 0) {
                (void) sd_event_source_set_enabled(b->flush, SD_EVENT_OFF);
                (void) sd_event_source_set_enabled(b->fence_timer, SD_EVENT_OFF);
                (void) sd_event_source_set_enabled(b->read_retry, SD_EVENT_OFF);
        }
        RedisLinkOptions o = {
                .user = pc->backend_user,
                .password_file = pc->backend_password_file,
                .on_state = on_commands_state,
                .on_log = on_link_log,
                .userdata = b,
                /* The command link re-reads INFO (policy, role, run and replication id) while up. */
                .watch_interval = REDIS_LINK_WATCH_INTERVAL_DEFAULT,
        };
        /* Behind Sentinels, the links wait for them to name the primary. */
        bool sentinel = endpoint.type == REDIS_ENDPOINT_SENTINEL;
        if (r >= 0)
                r = redis_link_new(t->event, sentinel ? NULL : &endpoint, &o, &b->commands);
        if (r >= 0) {
                o.blocking = true;
                o.watch_interval = 0;
                o.on_state = on_reader_state;
                r = redis_link_new(t->event, sentinel ? NULL : &endpoint, &o, &b->reader);
        }
        if (r >= 0 && sentinel) {
                const SentinelOptions so = {
                        .password_file = pc->backend_sentinel_password_file,
                        .on_primary = on_sentinel_primary,
                        .on_round = on_sentinel_round,
                        .userdata = b,
                };
                r = sentinel_new(t->event, &endpoint, &so, &b->sentinel);
        }
        redis_endpoint_done(&endpoint);
        /* The library, and its functions by the engine's names: the embedded table's order is the build's,
         * not SharedScript's. */
        if (r >= 0)
                r = redis_link_set_library(b->commands, shared_library);
        for (int s = 0; r >= 0 && s < _SHARED_SCRIPT_MAX; s++) {
                const char *name = shared_script_to_string(s);
                if (s == SHARED_SCRIPT_BATCH || s == SHARED_SCRIPT_SET) {
                        /* The library's only */
                        b->functions[s] = s == SHARED_SCRIPT_BATCH ? shared_function_batch : shared_function_set;
                        continue;
                }
                const SharedScriptText *text = NULL;
                for (size_t i = 0; i < shared_scripts_n; i++)
                        if (streq(shared_scripts[i].name, name))
                                text = shared_scripts + i;
                b->functions[s] = text ? text->function : NULL;
                r = text ? 0 : -ENOENT;
        }
        for (size_t i = 0; r >= 0 && i < shared_scripts_n; i++)
                if (streq(shared_scripts[i].name, "renew"))
                        b->renew_function = shared_scripts[i].function;
        if (r < 0) {
                backend_free(b);
                return r;
        }
        *ret = b;
        return 0;
}

static bool backend_matches(const Backend *b, const PoolConfig *pc) {
        return streq(b->url, pc->backend) && streq_ptr(b->user, pc->backend_user) &&
               streq_ptr(b->password_file, pc->backend_password_file) &&
               streq_ptr(b->sentinel_password_file, pc->backend_sentinel_password_file);
}

/* ---- the table ---- */

void backend_table_init(BackendTable *t, sd_event *event, const Node *node) {
        *t = (BackendTable) { .event = event, .node = node };
}

void backend_table_done(BackendTable *t) {
        for (size_t i = 0; i < t->n_backends; i++)
                backend_free(t->backends[i]);
        t->backends = mfree(t->backends);
        t->n_backends = 0;
}

static void backend_table_remove(BackendTable *t, Backend *b) {
        for (size_t i = 0; i < t->n_backends; i++)
                if (t->backends[i] == b) {
                        memmove(t->backends + i, t->backends + i + 1, (t->n_backends - i - 1) * sizeof(Backend *));
                        t->n_backends--;
                        return;
                }
}

/* A set's pools by name (SharedPoolParams.find_pool): this backend's, not retired (a reload's new object of
 * that name, not the old one it replaces). */
static Pool *backend_find_pool(const char *name, void *userdata) {
        Backend *b = userdata;
        for (size_t j = 0; j < b->n_pools; j++) {
                Pool *p = b->pools[j]->pool;
                if (p && !p->retired && streq(p->name, name))
                        return p;
        }
        return NULL;
}

/* The engine is freeing a shared pool: off its Backend, and the Backend goes with its last pool. */
static void backend_detach_pool(Pool *p, void *userdata) {
        Backend *b = userdata;
        for (size_t j = 0; j < b->n_pools; j++) {
                if (b->pools[j]->pool != p)
                        continue;
                free(b->pools[j]);
                memmove(b->pools + j, b->pools + j + 1, (b->n_pools - j - 1) * sizeof(BackendPool *));
                if (--b->n_pools == 0) {
                        backend_table_remove(b->table, b);
                        backend_free(b);
                }
                return;
        }
}

int backend_table_pool_new(const PoolConfig *pc, const char *name, PoolEmitFn emit, void *emit_userdata,
                           void *userdata, Pool **ret) {
        BackendTable *t = userdata;
        int r;

        if (!pc || !pc->backend || !t || !t->node)
                return -EINVAL;

        Backend *b = NULL;
        for (size_t i = 0; i < t->n_backends && !b; i++)
                if (backend_matches(t->backends[i], pc))
                        b = t->backends[i];
        bool made = false;
        if (!b) {
                Backend **n = realloc(t->backends, (t->n_backends + 1) * sizeof(Backend *));
                if (!n)
                        return -ENOMEM;
                t->backends = n;
                r = backend_new(t, pc, &b);
                if (r < 0)
                        return r;
                t->backends[t->n_backends++] = b;
                made = true;
        }

        BackendPool **n = realloc(b->pools, (b->n_pools + 1) * sizeof(BackendPool *));
        BackendPool *bp = n ? calloc(1, sizeof(BackendPool)) : NULL;
        if (n)
                b->pools = n;
        r = bp ? 0 : -ENOMEM;
        if (bp) {
                bp->serial = ++b->next_serial;
                bp->announced_fence = USEC_INFINITY;
                bp->params = (SharedPoolParams) {
                        .node_id = t->node->id,
                        .identity = t->node->identity,
                        .node_name = t->node->name,
                        .node_ttl = pc->backend_node_ttl,
                        .revoke_grace = t->revoke_grace,
                        .waiter_grace = WAITER_GRACE,
                        .heartbeat = HEARTBEAT,
                        .manual_clock = t->manual_clock,
                        .confirm_stale = b->sentinel ? SENTINEL_CONFIRM_STALE : 0,
                        .random = t->random,
                        .random_userdata = t->userdata,
                        .wake = backend_wake,
                        .wake_userdata = b,
                        .detach = backend_detach_pool,
                        .detach_userdata = b,
                        .find_pool = backend_find_pool,
                        .find_pool_userdata = b,
                        /* One FCALL carries what a pool's outbox holds (batch.lua), one out at a time. */
                        .batch_max = t->batch_max ?: SHARED_BATCH_OPS_MAX,
                        .one_call_out = true,
                        .call_order = &b->call_order,
                };
                r = pool_shared_new(name, &bp->params, emit, emit_userdata, &bp->pool);
                if (r >= 0)
                        pool_shared_set_records_unknown(bp->pool, t->records_unknown);
        }
        if (r < 0) {
                free(bp);
                if (made) {
                        backend_free(b);
                        t->n_backends--;
                }
                return r;
        }
        b->pools[b->n_pools++] = bp;

        /* A link already up, the last confirmation and the rounds' rest tell only the pools they knew: this
         * one learns here. */
        if (b->sentinel) {
                usec_t boot = now_boottime(), now = now_monotonic();
                pool_shared_set_confirm_resting(bp->pool, b->confirm_resting, boot, now);
                pool_shared_set_confirmed(bp->pool, sentinel_get_confirmed(b->sentinel), boot, now);
        }
        if (redis_link_get_state(b->commands) == REDIS_LINK_UP)
                pool_shared_link_up(bp->pool, redis_link_get_run_id(b->commands) ?: "", now_monotonic());
        backend_wake(b);
        *ret = bp->pool;
        return 0;
}

bool backend_table_primary(const BackendTable *t, const char *pool, BackendPrimary *ret) {
        for (size_t i = 0; i < t->n_backends; i++) {
                const Backend *b = t->backends[i];
                if (!b->sentinel)
                        continue;
                for (size_t j = 0; j < b->n_pools; j++)
                        if (streq(b->pools[j]->pool->name, pool)) {
                                *ret = (BackendPrimary) {
                                        .address = sentinel_get_primary(b->sentinel),
                                        .failovers = sentinel_get_failovers(b->sentinel),
                                        .last_failover = sentinel_get_last_failover(b->sentinel),
                                        .confirmed = sentinel_get_confirmed(b->sentinel),
                                };
                                return true;
                        }
        }
        return false;
}

void backend_table_set_last_alive(BackendTable *t, usec_t realtime) {
        if (realtime == 0)
                return;
        /* Realtime to CLOCK_BOOTTIME by the distance from now: a wall clock step meanwhile moves it, which
         * only an alive mark in the future could make late, and that is clamped to now. */
        usec_t now_real = now_realtime(), boot = now_boottime();
        usec_t ago = now_real > realtime ? now_real - realtime : 0;
        usec_t at = boot > ago ? boot - ago : 0;
        for (size_t i = 0; i < t->n_backends; i++) {
                Backend *b = t->backends[i];
                for (size_t j = 0; j < b->n_pools; j++)
                        pool_shared_set_last_ack(b->pools[j]->pool, at);
                backend_after(b);
        }
}

usec_t backend_table_fence_deadline(const BackendTable *t, const char *pool) {
        /* The earliest: a pool being moved to another backend may have two objects for a moment. */
        usec_t deadline = USEC_INFINITY;
        for (size_t i = 0; i < t->n_backends; i++) {
                Backend *b = t->backends[i];
                for (size_t j = 0; j < b->n_pools; j++)
                        if (streq(b->pools[j]->pool->name, pool))
                                deadline = MIN(deadline, pool_shared_fence_deadline(b->pools[j]->pool));
        }
        return deadline;
}

bool backend_table_where(const BackendTable *t, const char *pool, BackendWhere *ret) {
        bool found = false;
        for (size_t i = 0; i < t->n_backends; i++) {
                const Backend *b = t->backends[i];
                for (size_t j = 0; j < b->n_pools; j++) {
                        const BackendPool *bp = b->pools[j];
                        if (!streq(bp->pool->name, pool))
                                continue;
                        PoolInfo info;
                        bp->pool->ops->info(bp->pool, 0, &info);
                        if (found && info.in_use == 0)
                                continue;
                        *ret = (BackendWhere) {
                                .url = b->url,
                                .user = b->user,
                                .password_file = b->password_file,
                                .sentinel_password_file = b->sentinel_password_file,
                                .node_ttl = pool_shared_fence_ttl(bp->pool),
                        };
                        found = true;
                }
        }
        return found;
}

void backend_table_set_records_unknown(BackendTable *t, bool unknown) {
        if (t->records_unknown == unknown)
                return;
        t->records_unknown = unknown;
        for (size_t i = 0; i < t->n_backends; i++) {
                Backend *b = t->backends[i];
                for (size_t j = 0; j < b->n_pools; j++)
                        pool_shared_set_records_unknown(b->pools[j]->pool, unknown);
                backend_after(b); /* a reconcile to send */
        }
}

bool backend_table_grace_refused(const BackendTable *t, const BrokerConfig *c, BackendGraceRefusal *ret) {
        usec_t least = usec_add(usec_add(c->revoke_grace, SHARED_FENCE_SLACK), CONF_NODE_TTL_WINDOW_MIN);
        for (size_t i = 0; i < t->n_backends; i++) {
                const Backend *b = t->backends[i];
                for (size_t j = 0; j < b->n_pools; j++) {
                        const Pool *pool = b->pools[j]->pool;
                        usec_t ttl = pool_shared_fence_ttl(pool);
                        for (size_t k = 0; k < c->n_pools; k++) {
                                const PoolConfig *pc = c->pools[k];
                                if (streq(pc->name, pool->name) && pc->backend && pc->backend_node_ttl > 0 &&
                                    backend_matches(b, pc))
                                        ttl = MIN(ttl, pc->backend_node_ttl);
                        }
                        if (ttl < least) {
                                *ret = (BackendGraceRefusal) { .pool = pool->name, .fence_ttl = ttl };
                                return true;
                        }
                }
        }
        return false;
}

void backend_table_set_revoke_grace(BackendTable *t, usec_t revoke_grace) {
        t->revoke_grace = revoke_grace;
        for (size_t i = 0; i < t->n_backends; i++) {
                Backend *b = t->backends[i];
                for (size_t j = 0; j < b->n_pools; j++) {
                        b->pools[j]->params.revoke_grace = revoke_grace;
                        pool_shared_set_revoke_grace(b->pools[j]->pool, revoke_grace);
                }
                backend_after(b); /* the fence timer, and the holders' deadlines, move */
        }
}

bool backend_table_giving_back(const BackendTable *t) {
        for (size_t i = 0; i < t->n_backends; i++)
                for (size_t j = 0; j < t->backends[i]->n_pools; j++)
                        if (pool_shared_giving_back(t->backends[i]->pools[j]->pool))
                                return true;
        return false;
}

void backend_table_send_first(BackendTable *t) {
        for (size_t i = 0; i < t->n_backends; i++) {
                Backend *b = t->backends[i];
                bool first = false;
                /* Every pool's flag is taken: one left set would send a later dispatch's calls early. */
                for (size_t j = 0; j < b->n_pools; j++)
                        first = pool_shared_take_send_first(b->pools[j]->pool) || first;
                if (!first)
                        continue;
                /* The withdraw and every call before it, of any pool (they go in the engine's order). */
                for (size_t j = 0; j < b->n_pools; j++)
                        pool_shared_send_queued_now(b->pools[j]->pool);
                (void) on_flush(b->flush, b);
        }
}

bool backend_table_is_settled(const BackendTable *t) {
        for (size_t i = 0; i < t->n_backends; i++) {
                const Backend *b = t->backends[i];
                if (b->in_flight)
                        return false;
                for (size_t j = 0; j < b->n_pools; j++)
                        if (!pool_shared_is_settled(b->pools[j]->pool))
                                return false;
        }
        return true;
}
