/* SPDX-License-Identifier: MIT */
/* pool-shared.h — a pool kept in Redis, the pure half: it never decides and does no I/O.
 *
 * Pool commands become script calls in an outbox (which script, KEYS, ARGV: brokerd/lua/README is the
 * contract), which the driver (brokerd's backend) sends in order on one connection; script replies and
 * entries of this node's stream become the pool's decisions. Besides it keeps this node's waiters and
 * grants, the pool-wide figures of the last reply (for info() and Status), the per-pool failure state
 * machine (memo §4.7) and the self-fence deadline (§4.3). Time is passed in: `now` is the engine's
 * monotonic µs, `boot` CLOCK_BOOTTIME µs (liveness must count while a host is suspended). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pool.h"
#include "resp.h"

typedef enum SharedScript {
        SHARED_SCRIPT_SUBMIT,
        SHARED_SCRIPT_RELEASE,
        SHARED_SCRIPT_WITHDRAW,
        SHARED_SCRIPT_TICK,
        SHARED_SCRIPT_RECLAIM,
        SHARED_SCRIPT_DRAIN,
        SHARED_SCRIPT_POSITIONS,
        SHARED_SCRIPT_QUARANTINE, /* a member quarantined or restored by hand (SPEC §3.6) */
        SHARED_SCRIPT_BATCH,     /* several of the above in one call (params.batch_max): library only */
        SHARED_SCRIPT_SET,       /* an all-or-nothing set over several pools of one backend: library only */
        _SHARED_SCRIPT_MAX,
        _SHARED_SCRIPT_INVALID = -EINVAL,
} SharedScript;

/* The name of a script as brokerd/lua names its file ("submit", …). */
const char *shared_script_to_string(SharedScript s);

/* One EVALSHA to make: script, then KEYS then ARGV (n_keys of them keys). Owned by the pool until
 * pool_shared_call_done() for its id. A batch (SHARED_SCRIPT_BATCH, brokerd/lua/batch.lua) carries several
 * calls of the outbox in one, and its answer is split back into theirs. wait: not a script but the command in argv ("WAIT" N MS, n_keys 0,
 * script _SHARED_SCRIPT_INVALID): backend-min-replicas asks how many replicas hold the writes this
 * connection sent before it, so it must go on the same connection, in the outbox's order. Its answer may
 * take up to MS, and the calls pipelined behind it wait as long; one is out at a time. */
typedef struct SharedCall {
        uint64_t id;
        bool wait;
        SharedScript script;
        unsigned n_keys;
        size_t argc;
        const char *const *argv;
        const size_t *argvlen;
} SharedCall;

typedef enum SharedState {
        SHARED_STATE_CONNECTING,  /* the link was never up */
        SHARED_STATE_REGISTERING, /* the first tick of this link is in flight */
        SHARED_STATE_RECLAIMING,  /* restored (or possibly lost) leases are being reclaimed */
        SHARED_STATE_UP,
        SHARED_STATE_MISMATCH,    /* this node's rules differ from the stored ones */
        SHARED_STATE_DOWN,        /* the link went down; waiters kept for the grace, leases until the fence */
        SHARED_STATE_FENCED,      /* down past the self-fence deadline: every lease was lost */
        SHARED_STATE_REFUSED,     /* the link failed for good, the keys were made by a test, another data model */
        _SHARED_STATE_MAX,
        _SHARED_STATE_INVALID = -EINVAL,
} SharedState;

const char *shared_state_to_string(SharedState s);

typedef enum SharedNoticeType {
        SHARED_NOTICE_BACKEND_LOST,
        SHARED_NOTICE_BACKEND_REGAINED,
        SHARED_NOTICE_NODE_EXPIRED,   /* node, freed_leases, freed_waiters */
        SHARED_NOTICE_RULES_MISMATCH, /* detail: the differing keys, joined by "," */
        SHARED_NOTICE_RULES_AGREED,
        SHARED_NOTICE_RECOVERY,       /* a recovery window began: Redis restarted or lost the pool */
        SHARED_NOTICE_REFUSED,        /* detail: why ("manual-clock", "version", the link's "eviction-policy", …) */
        SHARED_NOTICE_FENCED,         /* the self-fence deadline passed: every lease lost */
        SHARED_NOTICE_UNCONFIRMED,    /* behind Sentinels: no majority of them named the primary for a while */
        SHARED_NOTICE_CONFIRMED,      /* … and now one did again */
        SHARED_NOTICE_IDENTITY,       /* another live process heartbeats under this node id: refused */
        SHARED_NOTICE_IDENTITY_CLEARED, /* … its registration lapsed: this one registered */
        /* detail: what Redis (or whoever answers at its address) sent that failed validation; pushed once a
         * minute at most, freed_leases then counts the inputs dropped since the last one (SPEC §11). */
        SHARED_NOTICE_BAD_INPUT,
        _SHARED_NOTICE_TYPE_MAX,
        _SHARED_NOTICE_TYPE_INVALID = -EINVAL,
} SharedNoticeType;

typedef struct SharedNotice {
        SharedNoticeType type;
        char *node;                   /* NODE_EXPIRED: its name */
        char *detail;
        uint64_t freed_leases;
        uint64_t freed_waiters;
} SharedNotice;

void shared_notice_done(SharedNotice *n);

typedef struct SharedPoolParams {
        const char *node_id;          /* 32 hex, persistent */
        /* "INCARNATION/PREVIOUS,…" (brokerd/node.h): sent with the node id in every call (ARGV[2]); NULL:
         * none (tests of the rules alone). */
        const char *identity;
        const char *node_name;        /* hostname */
        usec_t node_ttl;              /* backend-node-ttl */
        usec_t revoke_grace;          /* part of the self-fence margin */
        usec_t waiter_grace;          /* how long waiters are kept while the backend is unreachable (5 s) */
        usec_t heartbeat;             /* 1 s */
        bool manual_clock;            /* tests only: the engine's `now` is the pool clock (memo §3.10) */
        /* Behind Sentinels: the primary must be confirmed (pool_shared_set_confirmed()); the pool is refused
         * ("unconfirmed") while the last confirmation is older than this. 0: no confirmation (redis://). */
        usec_t confirm_stale;
        /* Request ids and epochs: 64 random bits. */
        uint64_t (*random)(void *userdata);
        void *random_userdata;
        /* A call was queued: the driver sends it after this dispatch. May be NULL. */
        void (*wake)(void *userdata);
        void *wake_userdata;
        /* The engine is freeing the pool: the driver forgets it (first thing in its free). May be NULL. */
        void (*detach)(Pool *p, void *userdata);
        void *detach_userdata;
        /* At most this many operations go in one call (a batch: brokerd/lua/batch.lua), ≤ SHARED_BATCH_OPS_MAX;
         * 0 or 1: one call each (the EVALSHA form: tests, benchmarks). */
        unsigned batch_max;
        /* One call out at a time, a group commit (the daemon's): while a call is unanswered the next waits for
         * its answer, unless a full batch (batch_max) waits or the driver sends what is queued at once
         * (pool_shared_send_queued_now()). false: every call goes when the driver asks (tests of the calls). */
        bool one_call_out;
        /* The pool of this name on the same backend (the same link, the same node), not retired; NULL: none.
         * An all-or-nothing set (SPEC §3.5, also=) is one call over its pools: the chosen pool's object sends
         * it and gives each other pool its part of the answer. NULL: such sets are refused (-EOPNOTSUPP). */
        Pool *(*find_pool)(const char *name, void *userdata);
        void *find_pool_userdata;
        /* The counter of the calls queued by every pool of one link (the driver's): it numbers each call
         * (pool_shared_next_call()), so that the driver sends them in the order the engine made them, whatever
         * the pool. NULL: the pool's own count. */
        uint64_t *call_order;
} SharedPoolParams;

/* The most pools one set call names (brokerd/lua/set.lua): the chosen pool and its lane's also=. */
#define SHARED_SET_POOLS_MAX 17

/* The self-fence margin: the deadline comes this much before Redis may free this node's leases. */
#define SHARED_FENCE_SLACK (2 * USEC_PER_SEC)
#define SHARED_POSITIONS_MAX 256u
/* A waiter whose record Redis lost with its data (a restart or failover without it, FLUSHALL, keys lost) is
 * submitted again under its rid and arrival: once for each such loss, this many times at most in its life
 * (brokerd/lua/README, submit). Redis losing it again without one is someone deleting it: refused. */
#define SHARED_RESUBMITS_MAX 4u
/* "settling" answers in a row that a pool follows at once (settling_hold()): 256 calls settle 16,384 steps. */
#define SHARED_SETTLING_MAX 256
/* A batch's bounds (brokerd/lua/batch.lua checks the first): one call must not hold Redis for long. */
#define SHARED_BATCH_OPS_MAX 16u
#define SHARED_BATCH_BYTES_MAX (32u * 1024u)
#define SHARED_RECONCILE_PAGE 512u
/* A node whose heartbeats always find another call in flight never compares its fingerprint: it reconciles
 * in full at this period all the same (brokerd/lua/README, "Fingerprint"). */
#define SHARED_RECONCILE_PERIOD (5 * USEC_PER_MINUTE)
/* Liveness per node (brokerd/lua/README, "Liveness per node"): while the driver's renewal covers a pool,
 * the pool ticks when Redis says it has something to do (next_wakeup), when a fingerprint or a page of
 * reconcile needs it, when a renewal finds a node dead that was registered there, and with the first
 * renewal SHARED_IDLE_PERIOD after its last tick (so a node's idle ticks go together, pipelined, as often as
 * a busy node reconciles in full); and at the heartbeat again once no renewal covered it for its renewal
 * period + SHARED_RENEW_STALE. The driver renews every pool_shared_renew_period(): TTL/4, no longer than a
 * third of the self-fence's window (TTL − revoke grace − 2 s: a renewal lost leaves two periods before it, and is tried again after 1 s), between
 * 1 s and SHARED_RENEW_PERIOD_MAX (brokerd/lua/prelude.lua's BCLOCK_GAP is longer: the backend clock of a
 * fleet of one node must not stand still between its renewals). TTL/4 (7.5 s at the defaults, was TTL/6,
 * 5 s): an idle node's Redis time is its round trips (issue 21 item 3). */
#define SHARED_IDLE_PERIOD SHARED_RECONCILE_PERIOD
#define SHARED_RENEW_STALE (3 * USEC_PER_SEC)
#define SHARED_RENEW_PERIOD_MIN USEC_PER_SEC
#define SHARED_RENEW_PERIOD_MAX (10 * USEC_PER_SEC)
/* A node whose pools hold nothing (no lease, no request out or waiting) has no self-fence to feed: it renews
 * only to keep its registrations, every TTL/2 (a renewal lost leaves a second one, retried every second,
 * before they lapse), at most this often (prelude.lua's BCLOCK_GAP_MAX is this + 2 s). Half the round trips
 * of an idle node (issue 21 item 3), which is most of a fleet most of the time. Not longer: 20 s (10 s to
 * spare) took ~5 µs/s off an idle node on a cold Redis, but a Redis outage or failover of 5–10 s, plus the
 * reconnect's backoff, would then lapse the idle nodes whose renewal fell in it, and a fleet's worth of lapses
 * is a burst of ticks as Redis comes back (tests/bench/README.md, "Stop 62"). */
#define SHARED_IDLE_RENEW_PERIOD_MAX (15 * USEC_PER_SEC)
/* Status snapshots are fetched every second for this long after Status last asked. */
#define SHARED_STATUS_KEEP (30 * USEC_PER_SEC)

/* `name` and the strings of `params` must outlive the pool. Returns 0, -EINVAL, -ENOMEM. */
int pool_shared_new(const char *name, const SharedPoolParams *params, PoolEmitFn emit, void *emit_userdata,
                    Pool **ret);

/* The oldest call that may be sent now (monotonic: the round trip counts from it); false when none, or while
 * it waits for the answer to the one out (one_call_out). Calls are sent in this order on one connection. */
bool pool_shared_take_call(Pool *p, usec_t now, const SharedCall **ret);
/* The number (SharedPoolParams.call_order) of the call next in line, the one pool_shared_take_call() takes
 * unless it waits for the answer to the one out; false when none. A driver of several pools on one link takes
 * from the pool whose next call is oldest, and sends nothing more while that one waits: a decision of one pool
 * that the engine made after another pool's call (a set granted once another pool has run) then reaches
 * Redis after it, as an in-process pool would have made it. */
bool pool_shared_next_call(Pool *p, uint64_t *ret_order);
/* Whether a decision emitted since the last call made this node take a try out of Redis (a waiter refused
 * here: the rules differ, the link is down, its budget ended): its driver sends the calls before the decision
 * is told, or the refused client could queue on another node while Redis still counts it. Clears it. */
bool pool_shared_take_send_first(Pool *p);
/* Every call queued so far goes when the driver next asks, whether a call is out or not (one_call_out):
 * what a send_first's driver does to every pool of its link before it sends. */
void pool_shared_send_queued_now(Pool *p);
/* The answer to a taken call. reply NULL: error < 0 (-ETIMEDOUT, -ECONNRESET, -ENOTCONN: it may or may not
 * have run; it is sent again, identical, when the link is back). sent_boot: CLOCK_BOOTTIME when it was
 * sent; now: monotonic. */
void pool_shared_call_done(Pool *p, uint64_t id, int error, const RespValue *reply, usec_t sent_boot, usec_t now);

/* Input from Redis that the driver could not hand in (a reply over the link's size cap, an entry it could
 * not convert): counted with the pool's own (PoolInfo.bad_input) and told as a BAD_INPUT notice. what: for
 * people, copied. */
void pool_shared_bad_input(Pool *p, const char *what, usec_t now);

/* The command link went up (run_id: INFO server's) or down. */
void pool_shared_link_up(Pool *p, const char *run_id, usec_t now);
void pool_shared_link_down(Pool *p, usec_t now);
/* The link gave up on a cause that a retry will not cure (a password, a database, not Redis, an eviction
 * policy other than noeviction): the pool is refused, loudly, until the link comes up. why: for people. */
void pool_shared_link_failed(Pool *p, const char *why, usec_t now);

/* A restarted daemon's last proof of life (history's alive mark, on CLOCK_BOOTTIME): until a heartbeat is
 * acknowledged, restored leases fence from it. */
void pool_shared_set_last_ack(Pool *p, usec_t boot);
/* CLOCK_BOOTTIME deadline at which every lease must be given up (USEC_INFINITY: no lease, or no ack yet
 * and nothing restored); the driver arms a timer and calls pool_shared_fence_check() then. */
usec_t pool_shared_fence_deadline(const Pool *p);
/* Behind Sentinels (params.confirm_stale): a majority of them named the primary in use in a round that
 * began at confirmed_boot (CLOCK_BOOTTIME); 0: the primary in use is not confirmed (one Sentinel named it,
 * and no round yet), which stops the pool at once. The pool is served while the confirmation is fresh; the
 * self-fence counts from the latest one handed in (or from the last acknowledged heartbeat, when earlier),
 * which neither 0 nor an older one lowers. The driver calls it after every round, confirmed or not, and
 * whenever the primary moves: boot_now and now (monotonic) date the check. */
void pool_shared_set_confirmed(Pool *p, usec_t confirmed_boot, usec_t boot_now, usec_t now);
/* The driver's rounds rest (resting true: no pool of its backend holds anything of this node's, and none is
 * asked until one does) or go again. While they rest the confirmation counts as stale, quietly: no notice,
 * Status reads the pool as served (while its primary is the one the last round confirmed), and every request
 * is held (fail-fast ones too, the waiter grace at most) until a confirmation handed in after the rest is
 * fresh. A rest that ends within confirm_stale of the last confirmation serves again at once. */
void pool_shared_set_confirm_resting(Pool *p, bool resting, usec_t boot_now, usec_t now);
/* A round that began after the rest ended did not confirm the primary: the confirmation is lost as if the
 * rounds had gone on (notice, held requests that may not wait refused "unconfirmed", the others kept for the
 * waiter grace from the first one held). Nothing when the confirmation is fresh, or was not stale by a rest. */
void pool_shared_confirm_round_failed(Pool *p, usec_t now);
/* The latest confirmation handed in (0: none). */
usec_t pool_shared_get_confirmed(const Pool *p);
void pool_shared_fence_check(Pool *p, usec_t boot_now, usec_t now);

/* One entry of this node's stream (XREAD), in id order: fields as "name value …" strings. */
void pool_shared_stream_entry(Pool *p, const char *entry_id, const RespValue *fields, usec_t now);
const char *pool_shared_stream_key(const Pool *p);
/* Where XREAD continues: the last entry handed in, or the stream's last id at the first tick. NULL: do not
 * read yet (no tick answered). */
const char *pool_shared_stream_resume_id(const Pool *p);
/* Nothing of this node's is to come in its stream: no request of its own is out or waits (the stream carries
 * the decisions about this node's waiters only). The driver's read then blocks longer: an entry appended
 * all the same (a grant racing a withdraw) ends the block at once, as ever. */
bool pool_shared_stream_idle(const Pool *p);
/* The stream is read up to the last entry a reply said it appended (or none was). */
bool pool_shared_stream_is_read(const Pool *p);

/* [broker] revoke-grace= changed by reload: the self-fence margin follows at once (a longer grace moves the
 * deadline earlier), as the revocations' SIGKILL does. */
void pool_shared_set_revoke_grace(Pool *p, usec_t revoke_grace);

/* Whether this node can account for its leases (SPEC §3.4): while it cannot (its state directory not read
 * yet, or recording damage), a reconcile keeps the leases Redis holds for it that it does not list, held
 * while the node lives, instead of making them orphans that lapse a TTL later while their holders may run.
 * Back to false, a whole reconcile follows. New pools start accounting (false). */
void pool_shared_set_records_unknown(Pool *p, bool unknown);

/* Liveness per node: whether the driver's renewal may name this pool (production clock, its last tick
 * answered "ok" or "rules" for this incarnation since the link came up); its key ("{sb:NAME}"); how often
 * the driver must renew it (the shortest over the pools a renewal names); and the renewal's answer for it,
 * sent at sent_boot (CLOCK_BOOTTIME) by a driver that renews every `period`: covered, the self-fence
 * counts from sent_boot as from an acknowledged heartbeat, and the pool ticks only when it has something
 * to do (SHARED_IDLE_PERIOD); not covered (or no answer: the driver says so too), it ticks at the
 * heartbeat again at once. tick: a node registered there was found dead: tick now (its tick reaps it). */
bool pool_shared_renewable(const Pool *p);
const char *pool_shared_key(const Pool *p);
usec_t pool_shared_renew_period(const Pool *p);
/* Nothing of this node's here for the self-fence to guard or to wait: no lease (but lost ones), no request
 * out or waiting. A driver whose pools all hold nothing renews every pool_shared_idle_renew_period() (TTL/2,
 * at least pool_shared_renew_period(), at most SHARED_IDLE_RENEW_PERIOD_MAX) instead, and at the busy period
 * again once one holds something. */
bool pool_shared_holds_nothing(const Pool *p);
/* Behind Sentinels: the driver's confirmation rounds may rest (pool_shared_set_confirm_resting()): this pool
 * was confirmed once and has not lost that confirmation since (but by a rest), holds nothing and has no
 * release or withdrawal to send. */
bool pool_shared_confirm_may_rest(const Pool *p);
usec_t pool_shared_idle_renew_period(const Pool *p);
void pool_shared_renewed(Pool *p, bool covered, bool tick, usec_t sent_boot, usec_t period, usec_t now);
/* The node hash's fingerprint (n, x, s; -1: not a number) that a covering renewal read in full (every
 * minute or so: brokerd/lua/renew.lua), before pool_shared_renewed(). Equal to this node's, and nothing of
 * the pool's in flight: it stands for the idle tick's compare (SHARED_IDLE_PERIOD from then); different:
 * the pool ticks now, whose fingerprint decides as ever. */
void pool_shared_renewal_fingerprint(Pool *p, int64_t n, int64_t x, int64_t s, usec_t now);

/* The node TTL the self-fence counts with now (backend-node-ttl=, the shorter one while a change by reload
 * waits for agreement). */
usec_t pool_shared_fence_ttl(const Pool *p);

SharedState pool_shared_state(const Pool *p);
/* Whether this node still owes Redis a give-back it can deliver: a withdraw or release is queued or in
 * flight while the link is up and the node is registered or registering. A clean stop of the daemon waits
 * for this to turn false (bounded), so that no waiter of a gone client stays queued; false at once when
 * the backend is unreachable or refuses the pool (Redis reaps the node after its TTL). */
bool pool_shared_giving_back(const Pool *p);

/* Up, every call answered, and the stream read up to the last entry a reply said it appended: nothing
 * more comes without a new command (tests run their loop until then). */
bool pool_shared_is_settled(const Pool *p);
/* Things a person should read, oldest first; the driver journals them. Returns false when none. */
bool pool_shared_pop_notice(Pool *p, SharedNotice *ret);
