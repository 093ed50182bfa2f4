/* SPDX-License-Identifier: MIT */
/* pool.h — what lanes may ask of a pool's state, shaped as commands in and decisions out.
 *
 * A decision may come back during the command (the in-process pool) or later (a pool kept in Redis,
 * with round trips and its own clock); the engine never assumes either. Decisions reach the engine
 * through the emit callback given at creation (PoolEmitFn, engine.h); one emitted outside an engine call
 * waits in the engine until its next call. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conf.h"
#include "engine.h"
#include "selector.h"
#include "time-util.h"

typedef struct Pool Pool;
typedef struct PoolWaiter PoolWaiter; /* a request waiting in the pool's queue */
typedef struct PoolGrant PoolGrant;   /* the slots a lease holds in the pool */
typedef struct PoolStaged PoolStaged; /* a configuration prepared for the pool, not applied yet */

/* What a pool needs to know of each lane that uses it. */
typedef struct PoolLaneRule {
        const char *lane;
        int priority;
        int64_t max_in_use; /* -1: no cap */
        unsigned reserve;
        /* The lane's queue-timeout: requests carry it (PoolTry.lane_budget); here for the rules a shared
         * pool's nodes must agree on (SPEC §11). */
        bool budget_set;
        usec_t budget;            /* may be USEC_INFINITY */
        bool health;              /* granted quarantined members only (SPEC §3.6) */
        bool health_also;         /* health too: quarantined members first, else ordinary ones (health = also) */
        /* The lane's labels= terms (SPEC §3.5), NULL-terminated, or NULL: requests carry them in their selector;
         * here for the rules a shared pool's nodes must agree on. */
        char *const *labels;
} PoolLaneRule;

/* The drains a pool takes with a configuration in place of its own: the engine's records for a pool new to the
 * configuration (engine.c, pool_drains_from_records()). */
typedef struct PoolDrains {
        bool drained;               /* the whole pool */
        char *const *members;       /* NULL-terminated, or NULL: none */
} PoolDrains;

/* A waiter handed over by the previous daemon (engine.h, EngineResume): where it stood in this pool's
 * queue. The pool queues it behind the waiters resumed before it, with this state, idle and budget (its
 * deadline is PoolTry.arrival + budget, whenever that is), without the max-queue check; it is granted at
 * once only where a new try would be. One whose deadline is before `now` is refused (timeout/shed, at its
 * deadline) without looking at room, never granted (SPEC §3.3); a pool kept by a backend answers what its
 * backend did with the waiter meanwhile. */
typedef struct PoolResume {
        QueueState state;
        usec_t idle;
        usec_t budget;            /* USEC_INFINITY: unbounded */
        /* The backend's name for the waiter (a shared pool's rid: 16 lowercase hex), untrusted: a pool
         * that finds it malformed, or in use, queues the try under a name of its own. NULL: none. */
        const char *remote_id;
} PoolResume;

/* A command: take `slots` slots for a lane, now or (if may_wait) when they free up. */
typedef struct PoolTry {
        void *cookie;          /* the engine's request, handed back in every decision about it */
        const char *lane;
        unsigned slots;
        bool may_wait;
        bool lane_budget_set;  /* the lane's queue-timeout replaces the adaptive budget */
        usec_t lane_budget;    /* may be USEC_INFINITY */
        usec_t client_cap;     /* USEC_INFINITY: the client set no cap */
        usec_t arrival;        /* ≤ now; earlier than now only for a resumed waiter */
        const PoolResume *resume; /* NULL: a new request */
        /* Which members it may take (SPEC §3.5), in a member pool; NULL or empty: any. Only asked of a pool
         * whose members can satisfy it (pool_selector_capacity() ≥ slots). */
        const Selector *selector;
        /* One pool of an all-or-nothing set (SPEC §3.5, also=; only to a pool with PoolOps.ready): the pool
         * never grants it by itself. With room it is queued at once (and ready()); without, it is refused busy
         * or full, or queued, as any try. Queued, it holds back those behind it as a waiter short of slots
         * does (no barging; in a member pool it sets aside the free members it can use), also while it could
         * be granted here: the engine grants it with grant_waiter() once every pool of its set is ready. */
        bool gated;
} PoolTry;

typedef enum PoolVerdict {
        POOL_VERDICT_GRANTED,
        POOL_VERDICT_QUEUED,
        POOL_VERDICT_REFUSED,    /* busy (no room and may not wait), full, timeout, shed, unavailable */
        POOL_VERDICT_CONGESTION, /* the congested gauge changed */
        /* A grant the pool can no longer vouch for: its backend freed it (its node expired, a reclaim after a
         * restart conflicted or came too late) or will before long (the self-fence deadline). The engine
         * revokes the lease; its slots count as held here until engine_lease_release(). */
        POOL_VERDICT_LOST,
        /* A gated waiter (PoolTry.gated) could be granted here now (ready()): said by run() whenever it stops
         * at one, so that the engine looks only at the sets some pool is ready for. Not final. */
        POOL_VERDICT_READY,
        POOL_VERDICT_MEMBER,     /* a member was quarantined or restored (SPEC §3.6) */
        /* A drain that the pool's backend keeps (drain_with()) began, was replaced, or ended (by its until:
         * expired), by this node's call: the engine tells it as engine_drain_with()'s own (SPEC §3.6). */
        POOL_VERDICT_DRAIN,
        _POOL_VERDICT_MAX,
        _POOL_VERDICT_INVALID = -EINVAL,
} PoolVerdict;

typedef struct PoolDecision {
        PoolVerdict verdict;
        Pool *pool;
        void *cookie;             /* the try's (PoolTry.cookie); LOST: the grant's, from bind_grant() */
        usec_t at;
        Refusal refusal;          /* REFUSED */
        QueueState state;         /* QUEUED, and final decisions of requests that were queued */
        usec_t idle;
        usec_t budget;            /* USEC_INFINITY: unbounded */
        PoolWaiter *waiter;       /* QUEUED */
        PoolGrant *grant;         /* GRANTED */
        const unsigned *slots;    /* GRANTED: slot indices, n_slots of them */
        const char *const *members; /* GRANTED: their member names, or NULL in a pool of anonymous slots */
        unsigned n_slots;
        uint64_t token;           /* GRANTED: fencing token */
        bool congested;           /* CONGESTION */
        /* GRANTED, and REFUSED of a queued request: the wait as the pool measured it, on its own clock (a
         * remote pool). has_wait false: the engine takes at − arrival, as for the in-process pool. */
        bool has_wait;
        usec_t wait;
        /* REFUSED unavailable, LOST: a static word for clients and the journal ("drained", "backend",
         * "rules", "recovery", "node-expired", "reclaim-conflict", "fenced"); NULL: the engine's default. */
        const char *reason;
        /* GRANTED: the backend's name for the lease ("NODE:RID"), to persist for a reclaim after a restart;
         * NULL for an in-process pool. Valid during the emit only. */
        const char *remote_id;
        /* MEMBER: as EngineEvent's; the strings are the pool's, valid until its next command. */
        const char *member;
        bool quarantined;
        const char *job;
        int exit_status;
        const char *note;
        /* DRAIN: member (NULL: the pool), whether it is drained now, who (job) and why (note) as above, its until
         * (USEC_INFINITY: none) and whether it ended by it. */
        bool drained;
        usec_t until;
        bool expired;
        /* REFUSED busy for want of slots that rest (reason "cooldown"): the first of them wakes then; the
         * engine's retryAfterSec points there instead of at random. 0: none. */
        usec_t retry_at;
        /* REFUSED of a set's part (PoolTry.gated) only because another pool of the set refused the set, in the
         * same call over the set (submit_set()): the engine names that other pool. */
        bool echo;
        /* QUEUED of a set's part (PoolTry.gated): it had room (SPEC §3), and is queued only because the pool
         * never grants a part by itself. A part queued without room waits as any waiter (the set is queued,
         * then granted in step 3 of the instant), even if first in queue order already (a lane of higher
         * priority than those waiting). */
        bool room;
} PoolDecision;

typedef EngineMemberLife PoolMemberLife;

typedef struct PoolInfo {
        unsigned limit;
        unsigned in_use;          /* slots held, also those above a limit shrunk by reload */
        size_t waiting;
        bool congested;
        bool drained;
        bool queue_timeout_set;
        usec_t queue_timeout;
        usec_t idle;              /* now − the last fast admission */
        uint64_t next_token;
        char *const *drained_members; /* NULL-terminated, or NULL; valid until the next command */
        /* A pool kept by a backend (remote true; the fields below mean nothing otherwise). in_use and waiting
         * are then this node's own, exact; congested and idle come from the cache, cache_age old. */
        bool remote;
        bool backend_up;
        const char *unavailable;  /* NULL, or why submit() refuses at once: "backend", "rules", "recovery" */
        char *const *differing_keys; /* "rules": the keys whose values differ; valid until the next command */
        usec_t rtt;               /* the backend's last round trip */
        unsigned n_nodes;         /* live nodes seen in the last heartbeat reply */
        unsigned all_in_use;      /* slots held and requests waiting on every node, from the cache (this */
        size_t all_waiting;       /* node's own until the first reply) */
        unsigned agreed_limit;    /* the limit the backend enforces, the stored rules' (0: not known yet); not
                                   * limit on a node whose rules differ */
        usec_t cache_age;
        unsigned min_replicas;    /* backend-min-replicas (0: off) */
        int replicas_acked;       /* what the last WAIT answered; -1: none answered */
        /* A release or withdrawal is still to reach the backend (which can still take it): a retired pool is
         * not freed before, or the other nodes would wait a node TTL for the slots (SPEC §11). */
        bool owes;
        uint64_t bad_input;       /* replies and stream entries that failed validation, dropped (SPEC §11) */
        const PoolMemberLife *life; /* a member pool's members, in configuration order; NULL otherwise */
        size_t n_life;
        /* Resting slots (cooldown=), in no particular order; valid until the next command. */
        const PoolRest *resting;
        size_t n_resting;
        usec_t cooldown;          /* 0: none */
        /* The drains its backend keeps (drain_with()), since and until monotonic; valid until the next command. */
        const EngineDrainInfo *drains;
        size_t n_drains;
} PoolInfo;

/* Status of a pool kept by a backend: the holders and waiters of every node, as last fetched. */
typedef struct PoolSnapshotEntry {
        const char *node;         /* the node's name (its hostname) */
        bool own;                 /* this node's: the daemon has the details */
        const char *lane;
        unsigned n_slots;
        const unsigned *slots;    /* holders */
        const char *const *members; /* holders: NULL, or a name (or NULL) per slot */
        uint64_t token;           /* holders */
        usec_t since;             /* granted_at or arrival, the pool clock mapped to local monotonic */
        size_t position;          /* waiters, 0-based */
} PoolSnapshotEntry;

#define POOL_SNAPSHOT_WAITERS_MAX 100

typedef struct PoolSnapshot {
        const PoolSnapshotEntry *holders;
        size_t n_holders;
        const PoolSnapshotEntry *waiters; /* the first of the queue, at most POOL_SNAPSHOT_WAITERS_MAX */
        size_t n_waiters;
        size_t waiting;           /* all of them */
        usec_t age;               /* how old the snapshot is */
        usec_t at;                /* when it was asked for (the engine's clock): it shows Redis as of then or later */
} PoolSnapshot;                   /* valid until the next command to the pool */

/* A lease that outlived a restart of the daemon, as restore() takes it. */
typedef struct PoolRestore {
        const char *lane;
        const unsigned *slots;
        const char *const *members; /* NULL, or a name or NULL per slot */
        unsigned n_slots;
        uint64_t token;
        const char *remote_id;    /* the backend's name for it; NULL: an in-process lease */
        usec_t granted_at;
        /* A health job's grant (SPEC §3.6: its exit 0 restores, a quarantine status does not count), as the lease
         * log recorded it; !health_known (a log from before): the lane says, and health = also counts as
         * ordinary (which it was is not known). */
        bool health_known;
        bool health;
        /* The rules the lease was granted under, as recorded (NULL: not recorded). A pool that was never configured
         * (made for restored leases: its pool left the configuration) judges its exit statuses by them, for the
         * members it holds (SPEC §3.6); a configured pool by its own. */
        const EngineQuarantineRules *quarantine;
        /* A shared lease: the node TTL its self-fence counted with, as recorded (0: not recorded). Redis drops
         * the node by the TTL it enforces, which a restart with another backend-node-ttl= does not change
         * until Redis agreed to it: the pool fences with the shorter meanwhile. */
        usec_t node_ttl;
} PoolRestore;

typedef struct PoolOps {
        const char *kind;
        bool selectors;           /* submit() honours PoolTry.selector; the engine sends none elsewhere */
        void (*free)(Pool *p);
        /* The first configuration and every reload, in two steps, so that a reload of many pools applies to
         * all of them or to none (SPEC §4): configure_prepare() checks the configuration and allocates all that
         * applying it takes, changing nothing (the pool decides, emits and answers as before); then exactly
         * one of configure_commit(), which applies it and cannot fail (a call to its backend that it cannot
         * make goes at its next run()), or configure_abort(), which frees it.
         * Nothing else is asked of the pool in between. c, rules and drains stay valid until then. drains:
         * NULL, the pool keeps its own; else they replace them (a pool that keeps its drains in its backend,
         * drain_with(), takes none: -EINVAL). Returns 0, -EINVAL, -ENOMEM. */
        int (*configure_prepare)(Pool *p, const PoolConfig *c, const PoolLaneRule *rules, size_t n_rules,
                                 const PoolDrains *drains, usec_t now, PoolStaged **ret);
        void (*configure_commit)(Pool *p, PoolStaged *s, usec_t now);
        void (*configure_abort)(Pool *p, PoolStaged *s);
        /* Removed by reload: refuse every waiter (unavailable), let holders finish. Also a pool that is not
         * configured at all, made only to hold leases restored after a restart; a configuration revives it. */
        void (*retire)(Pool *p, usec_t now);
        /* Decides now if there is room or the try may not wait; otherwise queues. A remote pool decides
         * later (one decision for the cookie, then nothing unless it was QUEUED); it still checks the lane
         * and size against its own copy of the config now. Returns 0 or -ENOMEM. */
        int (*submit)(Pool *p, const PoolTry *t, usec_t now);
        /* The client went away: removed without an answer. */
        void (*withdraw)(Pool *p, PoolWaiter *w, usec_t now);
        void (*release)(Pool *p, PoolGrant *g, usec_t now);
        /* Re-occupies a restored lease's slots at once: members identify them by name in a member pool;
         * without a name a slot is its index. The in-process pool holds them for good; a remote pool holds
         * them provisionally and asks its backend to reclaim them, and a reclaim that fails is a LOST
         * decision later. Returns 0, -EEXIST (a slot is held already), -EINVAL, -ENOMEM. */
        int (*restore)(Pool *p, const PoolRestore *r, PoolGrant **ret);
        /* Settles the instant `now`: grants freed slots to waiters in queue order, then refuses the waiters
         * whose budget ends at `now`, then updates the congested gauge. A remote pool asks its backend to,
         * and decides when the answer comes. */
        void (*run)(Pool *p, usec_t now);
        /* The next instant at which run() has something to do on its own (a budget ends, the gauge flips).
         * After run(t) it should be later than t, or USEC_INFINITY while the answer to run(t) is awaited:
         * the engine runs a due instant only once per call, but the daemon's timer would fire again and
         * again for one that stays due. */
        usec_t (*next_wakeup)(const Pool *p);
        int (*drain)(Pool *p, const char *member, bool on, usec_t now);
        /* 0-based place of a waiter in the queue (a remote pool: as last fetched). */
        size_t (*position)(const Pool *p, const PoolWaiter *w, size_t *ret_queued);
        /* Never a round trip: a remote pool answers from its cache. A retired pool is freed once info() says
         * nothing is held, waiting or owed: a remote pool counts its tries not answered yet as waiting, and
         * the releases and withdrawals its backend has not confirmed as owed. */
        void (*info)(const Pool *p, usec_t now, PoolInfo *ret);
        /* Fencing tokens continue above this (restart: the persisted high-water mark). */
        void (*set_token_floor)(Pool *p, uint64_t next_token);

        /* The operations below are for pools that decide later (NULL in the in-process pool). */

        /* The engine's lease for a grant (after GRANTED, or restore()): the cookie of the grant's LOST
         * decision. NULL: the pool never loses a grant. */
        void (*bind_grant)(Pool *p, PoolGrant *g, void *cookie);
        /* The engine forgets a try whose decision has not come yet (its client went away): the pool emits
         * nothing more for the cookie and undoes what the answer would have done (a queued waiter is
         * withdrawn, a grant released). NULL: submit() always decides before it returns. */
        void (*cancel_try)(Pool *p, void *cookie, usec_t now);
        /* The holders and waiters of every node, from a cache (never a round trip). Returns 0, or -ENODATA
         * before the first fetch. NULL: the daemon's own tables are the whole truth (in-process pool). */
        int (*snapshot)(const Pool *p, PoolSnapshot *ret);
        /* Status wants a snapshot asked for at or after `since`: fetches one unless it has it. Returns 1
         * while one is on its way, 0 when there is one or none will come (the pool does not serve: its
         * last one is all there is). NULL: as snapshot. */
        int (*refresh_snapshot)(Pool *p, usec_t since, usec_t now);
        /* A waiter's name in the backend (PoolResume.remote_id), valid until its next decision. NULL: the
         * pool has no such names (the in-process pool). */
        const char *(*remote_id)(const Pool *p, const PoolWaiter *w);

        /* The controlled-delay clock (SPEC §3.1), carried across a restart: the last fast admission
         * (monotonic µs). NULL: the backend keeps it (engine_pool_get_last_fast() says -EOPNOTSUPP). */
        usec_t (*get_last_fast)(const Pool *p);
        void (*set_last_fast)(Pool *p, usec_t last_fast, usec_t now);

        /* All-or-nothing sets (PoolTry.gated); NULL: the pool takes no part in one. */
        /* The gated waiter would be granted now if it were not gated: first in queue order among those it
         * must not pass, its slots (members) free, its lane's limits allow it. */
        bool (*ready)(const Pool *p, const PoolWaiter *w);
        /* Grants a ready() gated waiter now (a GRANTED decision for its cookie). at_once: the set is granted as
         * it arrives, its try just queued with room (PoolDecision.room) in every pool: the members are those
         * the queue leaves a newcomer, as for a one-pool try with room, not those its place in the queue would
         * get (ahead of waiters of lower priority, it would take what they set aside: SPEC §3.5). Returns 0,
         * -ESTALE (not ready: nothing changed), -ENOMEM (refused unavailable instead). */
        int (*grant_waiter)(Pool *p, PoolWaiter *w, bool at_once, usec_t now);
        /* A set over pools of these same ops (pools of one backend: conf refuses a set over two, SPEC §3.5)
         * decided by one call over every pool rather than one a pool (a shared pool: one script call, so that
         * no pool grants its part alone and crossing sets stand in one order everywhere). NULL: submit() and
         * grant_waiter() a pool. pools[0] is the pool whose ops are called; tries[i], waiters[i] are pools[i]'s.
         * Each pool answers its own part (later, or at once), as submit() and grant_waiter() do: grant_set()
         * grants all or none (-ESTALE when one is not ready: nothing changed). Return as they. */
        int (*submit_set)(Pool *const *pools, const PoolTry *tries, size_t n, usec_t now);
        int (*grant_set)(Pool *const *pools, PoolWaiter *const *waiters, size_t n, usec_t now);
        /* SPEC §3.6, the in-process member pool only (NULL elsewhere). A lease's end as its command told it
         * (exit status 0–255, its job), before release(). */
        void (*report_exit)(Pool *p, PoolGrant *g, int exit_status, const char *job, usec_t now);
        /* engine_member_quarantine(). */
        int (*quarantine)(Pool *p, const char *member, const EngineQuarantine *q, usec_t now);
        /* engine_member_set_use(). */
        int (*set_use)(Pool *p, const char *member, const EngineMemberUse *u);
        /* engine_lease_is_health(); NULL: never (a pool kept by a backend decides it there). */
        bool (*grant_health)(const Pool *p, const PoolGrant *g);
        /* engine_lease_quarantine_rules(); NULL: none. */
        bool (*quarantine_rules)(const Pool *p, EngineQuarantineRules *ret);
        /* engine_member_get_use(). */
        int (*get_use)(const Pool *p, const char *member, EngineMemberUse *ret);
        /* engine_drain_with() for a pool whose backend keeps who, why, since and until and ends the drain at its
         * until itself (a shared pool: every node shows and obeys it; SPEC §3.6): the engine keeps no record and
         * arms no timer, and the pool emits DRAIN decisions. NULL: the engine keeps them. Returns as drain(). */
        int (*drain_with)(Pool *p, const char *member, const EngineDrain *d, usec_t now);
        /* A rest carried across a restart (cooldown=, SPEC §3.6): the slot (member by name, else index) rests
         * until `until` unless it is held, gone, or the pool has no cooldown any more. Returns 0, -ENOENT (no
         * such slot here, or it is held: nothing to do). NULL: the pool keeps no rests. */
        int (*rest)(Pool *p, const char *member, unsigned index, usec_t until, usec_t now);
} PoolOps;

/* The part every implementation shares: identity, the config the engine routes on, the decision sink. */
struct Pool {
        const PoolOps *ops;
        const char *name;         /* not owned: the creator keeps it alive longer than the pool */
        unsigned limit;
        char **members;           /* NULL-terminated, or NULL */
        PoolLabel *labels;        /* names and members only (no source); set by configure_commit() */
        size_t n_labels;
        MemberSets *member_sets;  /* of members and labels, what selectors resolve against; set with them */
        bool queue_timeout_set;
        usec_t queue_timeout;
        bool drained;
        bool retired;
        /* The engine's: where the pool is kept, NULL for a pool without backend=, else its backend= and
         * credentials (pool_identity() in engine.c). A reload that changes it makes another pool object. */
        char *identity;
        /* The engine's: a set it has a part of was granted or given back at this instant, and it runs again
         * once the engine has handled the decisions in hand (engine.c, set_rerun()). */
        bool rerun;
        /* The engine's: sets with a part here whose grant is asked and not answered yet (a pool that decides
         * later): another set of this pool is not asked meanwhile (engine.c, sets_settle()). */
        unsigned sets_granting;
        PoolEmitFn emit;
        void *emit_userdata;
};

/* The in-process pool. `name` must outlive it. */
int pool_local_new(const char *name, PoolEmitFn emit, void *emit_userdata, Pool **ret);

/* How many members of the pool `s` admits, drained ones included (the most a request with it can ever get);
 * the limit for an empty selector; 0 for a selector in a pool without members. Returns ≥ 0, -ENOMEM. */
int pool_selector_capacity(const Pool *p, const Selector *s);
/* A copy of `labels` (names and members; NULL when there are none). Returns 0, -ENOMEM. */
int pool_labels_copy(const PoolLabel *labels, size_t n_labels, PoolLabel **ret);
/* The pool's members, labels and their sets (made of these members and labels) replaced by these, taken
 * over; all NULL: none. */
void pool_members_replace(Pool *p, char **members, PoolLabel *labels, size_t n_labels, MemberSets *sets);
void pool_labels_free(PoolLabel *labels, size_t n_labels);

/* Prepares and commits a configuration at once, the pool keeping its drains: for a pool alone (tests). */
static inline int pool_configure(Pool *p, const PoolConfig *c, const PoolLaneRule *rules, size_t n_rules, usec_t now) {
        PoolStaged *s;
        int r = p->ops->configure_prepare(p, c, rules, n_rules, NULL, now, &s);
        if (r < 0)
                return r;
        p->ops->configure_commit(p, s, now);
        return 0;
}

static inline void pool_emit(Pool *p, const PoolDecision *d) {
        p->emit(d, p->emit_userdata);
}

/* The saturated budget (SPEC §3.1): queue-congestion-timeout= where it is set, else Q/10, and at least the
 * smaller of 1 s and Q. brokerd/lua/prelude.lua has it too (saturated_budget()). */
static inline usec_t pool_saturated_budget(usec_t queue_timeout, bool congestion_timeout_set, usec_t congestion_timeout) {
        if (congestion_timeout_set)
                return congestion_timeout;
        usec_t by_q = queue_timeout / 10, floor = queue_timeout < USEC_PER_SEC ? queue_timeout : USEC_PER_SEC;
        return by_q > floor ? by_q : floor;
}

/* Which refusal the end of a try's budget is: the saturated budget's own (shed), or a keeping-up, lane or
 * client one (timeout). adaptive: the saturated budget where the pool has Q and the try's state is saturated,
 * else USEC_INFINITY. */
static inline bool pool_budget_is_shed(const PoolTry *t, QueueState state, usec_t adaptive) {
        return !t->lane_budget_set && state == QUEUE_STATE_SATURATED && adaptive != USEC_INFINITY &&
               adaptive <= t->client_cap;
}
