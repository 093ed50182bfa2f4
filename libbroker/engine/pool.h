/* SPDX-License-Identifier: MIT */
/* pool.h — what lanes may ask of a pool's state, shaped as commands in and decisions out.
 *
 * A decision may come back during the command (the in-process pool) or later (a pool kept in Redis,
 * with round trips and its own clock); the engine never assumes either. Decisions reach the engine
 * through the emit callback given at creation. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conf.h"
#include "engine.h"
#include "time-util.h"

typedef struct Pool Pool;
typedef struct PoolWaiter PoolWaiter; /* a request waiting in the pool's queue */
typedef struct PoolGrant PoolGrant;   /* the slots a lease holds in the pool */

/* What a pool needs to know of each lane that uses it. */
typedef struct PoolLaneRule {
        const char *lane;
        int priority;
        int64_t max_in_use; /* -1: no cap */
        unsigned reserve;
} PoolLaneRule;

/* A command: take `slots` slots for a lane, now or (if may_wait) when they free up. */
typedef struct PoolTry {
        void *cookie;          /* the engine's request, handed back in every decision about it */
        const char *lane;
        unsigned slots;
        bool may_wait;
        bool lane_budget_set;  /* the lane's queue-timeout replaces the adaptive budget */
        usec_t lane_budget;    /* may be USEC_INFINITY */
        usec_t client_cap;     /* USEC_INFINITY: the client set no cap */
        usec_t arrival;
} PoolTry;

typedef enum PoolVerdict {
        POOL_VERDICT_GRANTED,
        POOL_VERDICT_QUEUED,
        POOL_VERDICT_REFUSED,    /* busy (no room and may not wait), full, timeout, shed, unavailable */
        POOL_VERDICT_CONGESTION, /* the congested gauge changed */
        _POOL_VERDICT_MAX,
        _POOL_VERDICT_INVALID = -EINVAL,
} PoolVerdict;

typedef struct PoolDecision {
        PoolVerdict verdict;
        Pool *pool;
        void *cookie;
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
} PoolDecision;

typedef void (*PoolEmitFn)(const PoolDecision *d, void *userdata);

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
} PoolInfo;

typedef struct PoolOps {
        const char *kind;
        void (*free)(Pool *p);
        /* The first configuration and every reload. Returns 0 or negative errno (state unchanged). */
        int (*configure)(Pool *p, const PoolConfig *c, const PoolLaneRule *rules, size_t n_rules, usec_t now);
        /* Removed by reload: refuse every waiter (unavailable), let holders finish. Also a pool that is not
         * configured at all, made only to hold leases restored after a restart; configure() revives it. */
        void (*retire)(Pool *p, usec_t now);
        /* Decides now if there is room or the try may not wait; otherwise queues. Returns 0 or -ENOMEM. */
        int (*submit)(Pool *p, const PoolTry *t, usec_t now);
        /* The client went away: removed without an answer. */
        void (*withdraw)(Pool *p, PoolWaiter *w, usec_t now);
        void (*release)(Pool *p, PoolGrant *g, usec_t now);
        /* Re-occupies the given slots for a lease restored after a restart: members (NULL, or a name or NULL
         * per slot) identify them by name in a member pool; without a name a slot is its index. Returns 0,
         * -EEXIST (a slot is held already), -EINVAL, -ENOMEM. */
        int (*restore)(Pool *p, const char *lane, const unsigned *slots, const char *const *members,
                       unsigned n_slots, uint64_t token, PoolGrant **ret);
        /* Settles the instant `now`: grants freed slots to waiters in queue order, then refuses the waiters
         * whose budget ends at `now`, then updates the congested gauge. */
        void (*run)(Pool *p, usec_t now);
        /* The next instant at which run() has something to do on its own (a budget ends, the gauge flips). */
        usec_t (*next_wakeup)(const Pool *p);
        int (*drain)(Pool *p, const char *member, bool on, usec_t now);
        /* 0-based place of a waiter in the queue. */
        size_t (*position)(const Pool *p, const PoolWaiter *w, size_t *ret_queued);
        void (*info)(const Pool *p, usec_t now, PoolInfo *ret);
        /* Fencing tokens continue above this (restart: the persisted high-water mark). */
        void (*set_token_floor)(Pool *p, uint64_t next_token);
} PoolOps;

/* The part every implementation shares: identity, the config the engine routes on, the decision sink. */
struct Pool {
        const PoolOps *ops;
        const char *name;         /* not owned: the creator keeps it alive longer than the pool */
        unsigned limit;
        char **members;           /* NULL-terminated, or NULL */
        bool queue_timeout_set;
        usec_t queue_timeout;
        bool drained;
        bool retired;
        PoolEmitFn emit;
        void *emit_userdata;
};

/* The in-process pool. `name` must outlive it. */
int pool_local_new(const char *name, PoolEmitFn emit, void *emit_userdata, Pool **ret);

static inline void pool_emit(Pool *p, const PoolDecision *d) {
        p->emit(d, p->emit_userdata);
}
