/* SPDX-License-Identifier: MIT */
/* engine.c — lanes, routing and leases on top of pools (SPEC §3.2–§3.4). */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "heap.h"
#include "list.h"
#include "pool.h"
#include "ring.h"
#include "strv.h"

typedef struct EngineLane {
        const char *name;        /* interned */
        LanePolicy policy;
        int priority;
        bool queue_timeout_set;
        usec_t queue_timeout;
        bool client_wait_ignore;
        usec_t max_hold;
        char **labels;           /* its selector terms (SPEC §3.5), or NULL */
        Pool **pools;
        size_t n_pools;
        /* The most slots its limits (SPEC §3: the pool's, its max-in-use, what other lanes reserve) ever let it
         * hold at once in pools[i], also[i]; NULL (a reservation's lane): the pool's limit. */
        unsigned *most;
        Pool **also;             /* also= (SPEC §3.5): every grant takes also_slots[i] of also[i] too */
        unsigned *also_slots;
        unsigned *also_most;
        size_t n_also;
} EngineLane;

/* One pool of an all-or-nothing request (SPEC §3.5, also=): parts[0] is the pool the lane's policy chose, then
 * the lane's also= pools. Each part waits in its pool as a gated waiter (pool.h: PoolTry.gated), which the pool
 * never grants by itself and which holds back those behind it; the engine grants every part at once when every
 * pool says it is ready, so the request never holds part of its set while it waits. */
typedef enum PartState {
        PART_NONE,
        PART_QUEUED,
        PART_REFUSED,
        PART_GRANTED,
} PartState;

typedef struct RequestPart {
        Pool *pool;
        unsigned slots;
        PartState st;
        PoolWaiter *waiter;      /* QUEUED */
        QueueState state;        /* QUEUED: as the pool decided it */
        usec_t idle, budget;
        Refusal refusal;         /* REFUSED */
        const char *reason;
        usec_t retry_at;         /* REFUSED busy "cooldown": when the pool's rests make room (PoolDecision) */
        bool echo;               /* REFUSED because another pool refused the set (PoolDecision.echo) */
        bool room;               /* QUEUED with room (PoolDecision.room) */
        usec_t at, wait;
        PoolGrant *grant;        /* GRANTED; the indices and names live with the pool's grant */
        const unsigned *indices;
        const char *const *members;
        unsigned n_slots;
        uint64_t token;
        const char *remote_id;   /* GRANTED by a backend: its name for the share (the pool's, as indices) */
} RequestPart;

/* An also= pool's share of a lease. */
typedef struct LeasePart {
        Pool *pool;
        PoolGrant *grant;
        unsigned n_slots;
        unsigned *slots;
        char **members;          /* n_slots names, or NULL */
        uint64_t token;
        char *remote_id;         /* the backend's name of a shared pool's share; NULL: local */
} LeasePart;

typedef enum RequestPhase {
        REQUEST_ROUTING, /* trying the lane's pools in order (a pool that decides later: its answer awaited) */
        REQUEST_WAITING, /* queued on a pool */
        REQUEST_DONE,    /* granted, refused or withdrawn */
} RequestPhase;

struct EngineRequest {
        unsigned n_ref;
        Engine *engine;
        void *userdata;
        const char *lane;        /* interned */
        unsigned slots;
        bool may_wait;           /* the lane waits and the client (if heard) did not forbid it */
        bool lane_budget_set;
        usec_t lane_budget;
        usec_t client_cap;
        usec_t max_hold;
        usec_t arrival;
        char **terms;            /* the lane's selector terms, then the client's; NULL: none */
        size_t n_lane_terms;     /* how many of terms are the lane's labels= */
        char *member;            /* a named member, or NULL */
        Pool **route;            /* the lane's pools this request fits, in order */
        size_t n_route, next_route;
        Pool *pool;              /* the pool tried last: where it waits, or which decided */
        PoolWaiter *waiter;
        RequestPhase phase;
        QueueState state;
        usec_t idle, budget;
        bool queued;
        /* A waiter resumed after a restart, on its way back to its pool (request_try_next()); NULL once
         * submitted. Points into the caller's EngineResume: engine_acquire() only. */
        const PoolResume *resume;
        ListNode node;           /* Engine.requests, until the final decision */
        /* An all-or-nothing request (the lane has also=): its pools, the chosen one first; NULL otherwise. */
        RequestPart *parts;
        size_t n_parts;
        bool granting;           /* a set: every part asked to grant, some pool's answer awaited */
        ListNode set_node;       /* Engine.sets while it waits and some pool said it is ready there */
};

typedef struct EngineDrainRecord {
        const char *pool;        /* interned */
        char *member;            /* NULL: the whole pool */
        usec_t since, until;
        usec_t until_realtime;   /* EngineDrain's, for people */
        char *who, *reason;
} EngineDrainRecord;

struct EngineLease {
        Engine *engine;
        Pool *pool;
        PoolGrant *grant;
        const char *lane;        /* interned */
        unsigned n_slots;
        unsigned *slots;
        char **members;          /* n_slots names, or NULL */
        uint64_t token;
        char *remote_id;         /* the backend's name of a shared lease; NULL: local */
        usec_t granted_at, expires_at;
        bool revoked;
        bool lost;      /* its pool lost it: the slots may be another node's (told once, even after max-hold) */
        void *userdata;
        HeapNode expiry_node;
        ListNode node;           /* Engine.leases */
        LeasePart *also;         /* the also= pools' shares (SPEC §3.5), in the lane's order */
        size_t n_also;
        int exit_status;         /* engine_lease_set_exit_status(); -1: not told */
        char *exit_job;
};

typedef struct EngineTokenFloor {
        const char *pool;        /* interned */
        uint64_t next_token;
} EngineTokenFloor;

struct Engine {
        EngineRandomFn random;
        void *random_userdata;

        Pool **pools;            /* configured, in config order */
        size_t n_pools;
        Pool **retired;          /* removed by reload, or not configured but holding restored leases: alive
                                  * until their last lease ends, or revived by a reload that names them */
        size_t n_retired;
        /* Token floors of pools that are not here (yet, or any more): a pool made for the name starts there,
         * so fencing tokens never go back, whatever reloads and restarts remove and add (SPEC §3.4). */
        EngineTokenFloor *floors;
        size_t n_floors;
        EngineLane **lanes;
        size_t n_lanes;

        EnginePoolFactoryFn factory; /* pools with a backend; NULL: refused */
        void *factory_userdata;

        List leases;
        List requests;           /* routing or waiting: the engine holds a reference */
        List sets;               /* waiting all-or-nothing requests a pool said READY for: to look at */
        usec_t sets_at;          /* the latest READY's instant: engine_take_decisions() looks at them then */
        bool rerun;              /* some pool's Pool.rerun is set: rerun_pools() */
        usec_t rerun_at;
        Heap expiries;           /* leases with max-hold */

        /* Pool decisions are queued and handled after the pool call returns: a pool never sees the
         * engine re-enter it from inside its own emit. */
        Ring pending;            /* of PoolDecision */

        Ring events;             /* of EngineEvent */

        bool unsettled;          /* a command changed state at unsettled_at and engine_run() has not followed */
        usec_t unsettled_at;
        bool pools_ran;          /* settle() has run the pools at unsettled_at (set_refused_rerun()) */

        /* Pool and lane names, interned for the engine's lifetime: events, requests and leases point here,
         * so a name stays valid after a reload removed its pool or lane. Grows only with new names. */
        char **names;
        size_t n_names;

        char *popped[3];         /* the last popped MEMBER or DRAIN event's strings, freed at the next pop */

        EngineDrainRecord *drains; /* engine_drain_with()'s, in the order made */
        size_t n_drains;
};

static const char *engine_intern(Engine *e, const char *s) {
        for (size_t i = 0; i < e->n_names; i++)
                if (streq(e->names[i], s))
                        return e->names[i];
        char **a = reallocarray(e->names, e->n_names + 1, sizeof(char *));
        if (!a)
                return NULL;
        e->names = a;
        if (!(a[e->n_names] = strdup(s)))
                return NULL;
        return a[e->n_names++];
}

static const char *const refusal_table[_REFUSAL_MAX] = {
        [REFUSAL_BUSY] = "busy",
        [REFUSAL_FULL] = "full",
        [REFUSAL_TIMEOUT] = "timeout",
        [REFUSAL_SHED] = "shed",
        [REFUSAL_UNAVAILABLE] = "unavailable",
};

DEFINE_STRING_TABLE_LOOKUP(refusal, Refusal, _REFUSAL_MAX)

const char *queue_state_to_string(QueueState s) {
        switch (s) {
        case QUEUE_STATE_KEEPING_UP:
                return "keeping-up";
        case QUEUE_STATE_SATURATED:
                return "saturated";
        default:
                return NULL;
        }
}

unsigned engine_retry_after_sec(bool queue_timeout_set, usec_t queue_timeout, uint64_t random_value) {
        uint64_t span = 60;
        if (queue_timeout_set)
                span = queue_timeout == USEC_INFINITY ? 60 : MAX(DIV_ROUND_UP(queue_timeout, USEC_PER_SEC), 1u);
        span = MIN(span, (uint64_t) UINT32_MAX - 1);
        return (unsigned) (1 + random_value % span);
}

/* ---- events ---- */

static void event_push(Engine *e, const EngineEvent *ev) {
        if (ring_push(&e->events, ev) < 0)
                abort(); /* losing a decision would lose a client's answer; there is no way on */
}

static bool event_is_not_revoke_of(const void *item, void *lease) {
        const EngineEvent *ev = item;
        return !(ev->type == ENGINE_EVENT_REVOKE && ev->lease == lease);
}

/* A lease released is not revoked afterwards: a REVOKE still queued for it (its max-hold or its loss was
 * settled by the release call itself) would hand the caller a lease, and its userdata, already gone. */
static void events_forget_lease(Engine *e, const EngineLease *l) {
        ring_filter(&e->events, event_is_not_revoke_of, (void *) l);
}

static void popped_free(Engine *e) {
        for (size_t i = 0; i < ELEMENTSOF(e->popped); i++)
                e->popped[i] = mfree(e->popped[i]);
}

bool engine_pop_event(Engine *e, EngineEvent *ret) {
        if (!e)
                return false;
        popped_free(e);
        if (!ring_pop(&e->events, ret))
                return false;
        if (ret->type == ENGINE_EVENT_MEMBER || ret->type == ENGINE_EVENT_DRAIN) {
                /* The event's strings are the engine's until the next pop. */
                e->popped[0] = (char *) ret->member;
                e->popped[1] = (char *) ret->job;
                e->popped[2] = (char *) ret->note;
        }
        return true;
}

/* ---- requests ---- */

static void request_free(EngineRequest *r) {
        free(r->parts);
        strv_free(r->terms);
        free(r->member);
        free(r->route);
        free(r);
}

EngineRequest *engine_request_unref(EngineRequest *r) {
        if (!r)
                return NULL;
        assert(r->n_ref > 0);
        if (--r->n_ref == 0)
                request_free(r);
        return NULL;
}

void engine_request_set_userdata(EngineRequest *r, void *userdata) {
        if (r)
                r->userdata = userdata;
}

/* The engine's own reference ends with the request's final decision. */
static void request_finish(EngineRequest *r) {
        if (list_node_is_linked(&r->node))
                list_unlink(&r->node);
        if (list_node_is_linked(&r->set_node))
                list_unlink(&r->set_node);
        r->phase = REQUEST_DONE;
        r->waiter = NULL;
        engine_request_unref(r);
}

bool engine_request_is_waiting(const EngineRequest *r) {
        return r && r->phase == REQUEST_WAITING;
}

bool engine_request_is_in_flight(const EngineRequest *r) {
        return r && r->phase == REQUEST_ROUTING;
}

int engine_request_position(const EngineRequest *r, size_t *ret_position, size_t *ret_queued) {
        assert_return(r, -EINVAL);
        if (r->phase != REQUEST_WAITING)
                return -ESTALE;
        size_t queued = 0, pos = 0;
        if (r->parts)
                /* The furthest of its places (SPEC §3.5): it is granted when it is first in every queue. A set
                 * granting (a pool's answer awaited) is first in all: its parts are no pool's waiters now. */
                for (size_t i = 0; i < r->n_parts && !r->granting; i++) {
                        size_t q, p = r->parts[i].pool->ops->position(r->parts[i].pool, r->parts[i].waiter, &q);
                        if (i == 0 || p > pos) {
                                pos = p;
                                queued = q;
                        }
                }
        else
                pos = r->pool->ops->position(r->pool, r->waiter, &queued);
        if (ret_position)
                *ret_position = pos;
        if (ret_queued)
                *ret_queued = queued;
        return 0;
}

usec_t engine_request_arrival(const EngineRequest *r) {
        return r ? r->arrival : 0;
}

usec_t engine_request_budget(const EngineRequest *r) {
        return r && r->queued ? r->budget : USEC_INFINITY;
}

QueueState engine_request_state(const EngineRequest *r) {
        return r && r->queued ? r->state : QUEUE_STATE_NONE;
}

usec_t engine_request_idle(const EngineRequest *r) {
        return r && r->queued ? r->idle : 0;
}

const char *engine_request_remote_id(const EngineRequest *r) {
        if (!r || r->phase != REQUEST_WAITING || !r->pool->ops->remote_id)
                return NULL;
        /* A set waits as one part per pool (r->waiter is none of them), all under one name in the backend
         * (lua/README, "All-or-nothing sets"): its chosen pool's part says it. */
        return r->pool->ops->remote_id(r->pool, r->parts ? r->parts[0].waiter : r->waiter);
}

/* labels, and also= pools with their K, as one text: sorted, so that the order a lane lists them in does not count. */
static int lane_rules_text(char *const *labels, size_t n_labels, const char *const *also, const unsigned *k,
                           size_t n_also, char **ret) {
        _cleanup_(strv_freep) char **items = calloc(n_labels + n_also + 1, sizeof(char *));
        if (!items)
                return -ENOMEM;
        for (size_t i = 0; i < n_labels + n_also; i++)
                if ((i < n_labels ? asprintf(&items[i], "label %s", labels[i])
                                  : asprintf(&items[i], "also %s:%u", also[i - n_labels], k[i - n_labels])) < 0) {
                        items[i] = NULL;
                        return -ENOMEM;
                }
        return strv_join_sorted(items, ",", ret);
}

int engine_request_lane_rules(const EngineRequest *r, char **ret) {
        assert_return(r && ret, -EINVAL);
        size_t n_also = r->parts ? r->n_parts - 1 : 0;
        _cleanup_free_ const char **also = calloc(n_also + 1, sizeof(char *));
        _cleanup_free_ unsigned *k = calloc(n_also + 1, sizeof(unsigned));
        if (!also || !k)
                return -ENOMEM;
        for (size_t i = 0; i < n_also; i++) {
                also[i] = r->parts[i + 1].pool->name;
                k[i] = r->parts[i + 1].slots;
        }
        return lane_rules_text(r->terms, r->n_lane_terms, also, k, n_also, ret);
}

static int lane_rules_of(const EngineLane *l, char **ret) {
        _cleanup_free_ const char **also = calloc(l->n_also + 1, sizeof(char *));
        if (!also)
                return -ENOMEM;
        for (size_t i = 0; i < l->n_also; i++)
                also[i] = l->also[i]->name;
        return lane_rules_text(l->labels, strv_length(l->labels), also, l->also_slots, l->n_also, ret);
}

const char *engine_request_pool(const EngineRequest *r) {
        return r && r->pool ? r->pool->name : NULL;
}

size_t engine_request_also_count(const EngineRequest *r) {
        return r && r->parts && r->phase == REQUEST_WAITING ? r->n_parts - 1 : 0;
}

const char *engine_request_also_pool(const EngineRequest *r, size_t i) {
        return i < engine_request_also_count(r) ? r->parts[i + 1].pool->name : NULL;
}

unsigned engine_request_also_slots(const EngineRequest *r, size_t i) {
        return i < engine_request_also_count(r) ? r->parts[i + 1].slots : 0;
}

static int request_try_next(Engine *e, EngineRequest *r, usec_t now) {
        Pool *p = r->route[r->next_route++];
        bool last = r->next_route == r->n_route;

        r->pool = p;
        return p->ops->submit(p,
                              &(PoolTry) {
                                      .cookie = r,
                                      .lane = r->lane,
                                      .slots = r->slots,
                                      .may_wait = last && r->may_wait,
                                      .lane_budget_set = r->lane_budget_set,
                                      .lane_budget = r->lane_budget,
                                      .client_cap = r->client_cap,
                                      .arrival = r->arrival,
                                      .resume = TAKE_PTR(r->resume),
                                      .selector = &(Selector) { .terms = r->terms, .member = r->member },
                              },
                              now);
}

/* ---- leases ---- */

static void lease_part_done(LeasePart *p) {
        if (p->members)
                for (unsigned i = 0; i < p->n_slots; i++)
                        free(p->members[i]);
        free(p->members);
        free(p->slots);
        free(p->remote_id);
}

static EngineLease *engine_lease_free(EngineLease *l) {
        if (!l)
                return NULL;
        for (size_t i = 0; i < l->n_also; i++)
                lease_part_done(l->also + i);
        free(l->also);
        if (l->members)
                for (unsigned i = 0; i < l->n_slots; i++)
                        free(l->members[i]);
        free(l->members);
        free(l->slots);
        free(l->remote_id);
        free(l->exit_job);
        return mfree(l);
}

static int engine_lease_new(Engine *e, Pool *p, PoolGrant *g, const char *lane, const unsigned *slots,
                            const char *const *members, unsigned n_slots, uint64_t token, const char *remote_id,
                            usec_t granted_at, usec_t expires_at, void *userdata, EngineLease **ret) {
        EngineLease *l = calloc(1, sizeof(EngineLease));
        if (!l)
                return -ENOMEM;
        *l = (EngineLease) {
                .engine = e,
                .pool = p,
                .grant = g,
                .n_slots = n_slots,
                .token = token,
                .granted_at = granted_at,
                .expires_at = expires_at,
                .userdata = userdata,
                .exit_status = -1,
        };
        heap_node_init(&l->expiry_node);
        l->lane = engine_intern(e, lane);
        l->slots = calloc(n_slots, sizeof(unsigned));
        if (!l->lane || !l->slots)
                goto oom;
        memcpy(l->slots, slots, n_slots * sizeof(unsigned));
        /* Member names are copied: a reload may rename the pool's members while the lease lives. */
        if (members) {
                l->members = calloc(n_slots, sizeof(char *));
                if (!l->members)
                        goto oom;
                for (unsigned i = 0; i < n_slots; i++)
                        if (members[i] && !(l->members[i] = strdup(members[i])))
                                goto oom;
        }
        if (remote_id && !(l->remote_id = strdup(remote_id)))
                goto oom;
        if (expires_at != USEC_INFINITY && heap_push(&e->expiries, &l->expiry_node, expires_at) < 0)
                goto oom;
        list_append(&e->leases, &l->node);
        *ret = l;
        return 0;
oom:
        engine_lease_free(l);
        return -ENOMEM;
}

void *engine_lease_get_userdata(const EngineLease *l) {
        return l ? l->userdata : NULL;
}

void engine_lease_set_userdata(EngineLease *l, void *userdata) {
        if (l)
                l->userdata = userdata;
}

const char *engine_lease_pool(const EngineLease *l) {
        return l ? l->pool->name : NULL;
}

const char *engine_lease_lane(const EngineLease *l) {
        return l ? l->lane : NULL;
}

uint64_t engine_lease_token(const EngineLease *l) {
        return l ? l->token : 0;
}

unsigned engine_lease_slots(const EngineLease *l, const unsigned **ret_indices, const char *const **ret_members) {
        if (!l)
                return 0;
        if (ret_indices)
                *ret_indices = l->slots;
        if (ret_members)
                *ret_members = (const char *const *) l->members;
        return l->n_slots;
}

usec_t engine_lease_granted_at(const EngineLease *l) {
        return l ? l->granted_at : 0;
}

usec_t engine_lease_expires_at(const EngineLease *l) {
        return l ? l->expires_at : USEC_INFINITY;
}

bool engine_lease_is_revoked(const EngineLease *l) {
        return l && l->revoked;
}

const char *engine_lease_remote_id(const EngineLease *l) {
        return l ? l->remote_id : NULL;
}

bool engine_lease_is_shared(const EngineLease *l) {
        return l && l->remote_id;
}

bool engine_lease_is_health(const EngineLease *l) {
        return l && l->pool && l->grant && l->pool->ops->grant_health && l->pool->ops->grant_health(l->pool, l->grant);
}

bool engine_lease_quarantine_rules(const EngineLease *l, EngineQuarantineRules *ret) {
        return l && l->pool && l->pool->ops->quarantine_rules && l->pool->ops->quarantine_rules(l->pool, ret);
}

size_t engine_lease_also_count(const EngineLease *l) {
        return l ? l->n_also : 0;
}

int engine_lease_also(const EngineLease *l, size_t i, EngineLeaseAlso *ret) {
        assert_return(l && ret, -EINVAL);
        if (i >= l->n_also)
                return -ENOENT;
        const LeasePart *p = l->also + i;
        *ret = (EngineLeaseAlso) {
                .pool = p->pool->name,
                .token = p->token,
                .n_slots = p->n_slots,
                .slots = p->slots,
                .members = (const char *const *) p->members,
                .remote_id = p->remote_id,
        };
        return 0;
}

/* Copies an also= pool's grant into the lease (its names: a reload may rename members meanwhile). */
static int lease_part_set(LeasePart *lp, Pool *p, PoolGrant *g, const unsigned *slots, const char *const *members,
                          unsigned n_slots, uint64_t token, const char *remote_id) {
        *lp = (LeasePart) { .pool = p, .grant = g, .n_slots = n_slots, .token = token };
        if (remote_id && !(lp->remote_id = strdup(remote_id)))
                return -ENOMEM;
        lp->slots = calloc(n_slots, sizeof(unsigned));
        if (!lp->slots)
                return -ENOMEM;
        memcpy(lp->slots, slots, n_slots * sizeof(unsigned));
        if (members) {
                lp->members = calloc(n_slots, sizeof(char *));
                if (!lp->members)
                        return -ENOMEM;
                for (unsigned i = 0; i < n_slots; i++)
                        if (members[i] && !(lp->members[i] = strdup(members[i])))
                                return -ENOMEM;
        }
        return 0;
}

/* The holder is told (once); the slots stay taken until the lease is released (SPEC §3.4). `by`: the pool that
 * lost it (a set's lease is lost whole when any of its pools loses its share, SPEC §3.5), NULL: the lease's. */
static void engine_lease_revoke(Engine *e, EngineLease *l, const Pool *by, usec_t at, const char *reason, bool lost) {
        heap_remove(&e->expiries, &l->expiry_node);
        /* A lease lost after its max-hold is told again, as lost: its holder may be letting go already, but
         * a command nobody stops (brokerd's to fence then) must be gone before its slots are another's. */
        if (l->revoked && (!lost || l->lost))
                return;
        l->revoked = true;
        l->lost = l->lost || lost;
        event_push(e, &(EngineEvent) {
                .type = ENGINE_EVENT_REVOKE,
                .at = at,
                .userdata = l->userdata,
                .lease = l,
                .pool = (by ?: l->pool)->name,
                .lane = l->lane,
                .reason = reason,
                .lost = lost,
        });
}

/* ---- pools ---- */

static Pool *pool_find(Pool **pools, size_t n, const char *name) {
        for (size_t i = 0; i < n; i++)
                if (streq(pools[i]->name, name))
                        return pools[i];
        return NULL;
}

/* Where a configured pool is kept: NULL without backend=, else what decides which Redis and as whom (the
 * backend's endpoint and credentials). backend-node-ttl= and the rules are not part of it: a pool applies
 * those itself. Returns 0 or -ENOMEM. */
static int pool_identity(const PoolConfig *pc, char **ret) {
        if (!pc || !pc->backend) {
                *ret = NULL;
                return 0;
        }
        return asprintf(ret, "%s\n%s\n%s\n%s", pc->backend, pc->backend_user ?: "",
                        pc->backend_password_file ?: "", pc->backend_sentinel_password_file ?: "") < 0
                               ? -ENOMEM
                               : 0;
}

/* The pool of this name kept where identity says (NULL: a pool without backend). */
static Pool *pool_find_kept(Pool **pools, size_t n, const char *name, const char *identity) {
        for (size_t i = 0; i < n; i++)
                if (streq(pools[i]->name, name) && streq_ptr(pools[i]->identity, identity))
                        return pools[i];
        return NULL;
}

/* The pool of this name that a lease belongs to: one kept by a backend for a shared lease (remote_id set),
 * one without for a local lease. */
static Pool *pool_find_kind(Pool **pools, size_t n, const char *name, const char *remote_id) {
        for (size_t i = 0; i < n; i++)
                if (streq(pools[i]->name, name) && !!pools[i]->identity == !!remote_id)
                        return pools[i];
        return NULL;
}

static bool pool_in(Pool *const *pools, size_t n, const Pool *p) {
        for (size_t i = 0; i < n; i++)
                if (pools[i] == p)
                        return true;
        return false;
}

static void pool_destroy(Pool *p) {
        free(p->identity);
        p->ops->free(p);
}

static EngineTokenFloor *token_floor_find(const Engine *e, const char *pool) {
        for (size_t i = 0; i < e->n_floors; i++)
                if (streq(e->floors[i].pool, pool))
                        return &e->floors[i];
        return NULL;
}

static int token_floor_raise(Engine *e, const char *pool, uint64_t next_token) {
        EngineTokenFloor *f = token_floor_find(e, pool);
        if (!f) {
                const char *name = engine_intern(e, pool);
                EngineTokenFloor *a = reallocarray(e->floors, e->n_floors + 1, sizeof(EngineTokenFloor));
                if (!name || !a)
                        return -ENOMEM;
                e->floors = a;
                f = &a[e->n_floors++];
                *f = (EngineTokenFloor) { .pool = name };
        }
        f->next_token = MAX(f->next_token, next_token);
        return 0;
}

/* A retired pool goes once nothing holds or waits on it; its next token stays as the name's floor. But an
 * in-process one stays while no pool of its name is configured: a reload that names it again revives it, with
 * what a pool kept in Redis keeps there, its keys (SPEC §3.6: its members' quarantines and failures in a row, and
 * their rests; §3.1: its idle clock), as one revived while a lease still held it does. Pools of names that the
 * configuration dropped, one each. */
static void retired_gc(Engine *e) {
        size_t j = 0;
        for (size_t i = 0; i < e->n_retired; i++) {
                Pool *p = e->retired[i];
                PoolInfo info;
                p->ops->info(p, 0, &info);
                bool kept = !p->ops->drain_with && !pool_find(e->pools, e->n_pools, p->name);
                if (!kept && info.in_use == 0 && info.waiting == 0 && !info.owes &&
                    token_floor_raise(e, p->name, info.next_token) >= 0)
                        pool_destroy(p);
                else
                        e->retired[j++] = p;
        }
        e->n_retired = j;
}

/* ---- decisions from pools ---- */

static void on_pool_decision(const PoolDecision *d, void *userdata) {
        Engine *e = userdata;
        if (ring_push(&e->pending, d) < 0)
                abort(); /* a decision not recorded is a slot lost or a client never answered */
}

void engine_set_pool_factory(Engine *e, EnginePoolFactoryFn factory, void *userdata) {
        if (!e)
                return;
        e->factory = factory;
        e->factory_userdata = userdata;
}

int engine_pool_factory_local(const PoolConfig *pc, const char *name, PoolEmitFn emit, void *emit_userdata,
                              void *userdata, Pool **ret) {
        return pool_local_new(name, emit, emit_userdata, ret);
}

/* pc NULL: an in-process pool (one made to hold restored leases). A pool of this name starts its fencing
 * tokens above any the name had before. */
static int pool_new_for(Engine *e, const PoolConfig *pc, const char *pool, Pool **ret) {
        const char *name = engine_intern(e, pool);
        if (!name)
                return -ENOMEM;
        _cleanup_free_ char *identity = NULL;
        int r = pool_identity(pc, &identity);
        if (r < 0)
                return r;
        /* A pool that moves (backend= added, removed or changed by reload) leaves the old object holding its
         * leases: the new one starts its tokens above the old one's. */
        uint64_t floor = 0;
        Pool *const *lists[] = { e->pools, e->retired };
        size_t sizes[] = { e->n_pools, e->n_retired };
        for (size_t k = 0; k < ELEMENTSOF(lists); k++)
                for (size_t i = 0; i < sizes[k]; i++)
                        if (lists[k][i]->name == name) {
                                PoolInfo info;
                                lists[k][i]->ops->info(lists[k][i], 0, &info);
                                floor = MAX(floor, info.next_token);
                        }
        if (floor > 0 && (r = token_floor_raise(e, name, floor)) < 0)
                return r;
        if (!pc || !pc->backend)
                r = pool_local_new(name, on_pool_decision, e, ret);
        else if (e->factory)
                r = e->factory(pc, name, on_pool_decision, e, e->factory_userdata, ret);
        else
                r = -EOPNOTSUPP;
        if (r < 0)
                return r;
        (*ret)->identity = TAKE_PTR(identity);
        const EngineTokenFloor *f = token_floor_find(e, name);
        if (f)
                (*ret)->ops->set_token_floor(*ret, f->next_token);
        return 0;
}

/* The wait of a request a pool decided on: the pool's own measure (a remote pool's clock), if it gave one. */
static usec_t decision_wait(const PoolDecision *d, const EngineRequest *r) {
        return d->has_wait ? d->wait : usec_sub_unsigned(d->at, r->arrival);
}

/* retry_at: when the pool expects room (a rest's end), for retryAfterSec; 0: none, a random one. */
static void refuse_request_at(Engine *e, EngineRequest *r, Pool *p, Refusal refusal, usec_t at, usec_t wait,
                              const char *reason, usec_t retry_at) {
        unsigned retry = engine_retry_after_sec(p && p->queue_timeout_set, p ? p->queue_timeout : 0,
                                                e->random(e->random_userdata));
        if (retry_at > at)
                retry = (unsigned) MIN(DIV_ROUND_UP(retry_at - at, USEC_PER_SEC), (usec_t) UINT32_MAX - 1);
        event_push(e, &(EngineEvent) {
                .type = ENGINE_EVENT_REFUSED,
                .at = at,
                .userdata = r->userdata,
                .request = r,
                .pool = p ? p->name : NULL,
                .lane = r->lane,
                .arrival = r->arrival,
                .wait = wait,
                .state = r->state,
                .idle = r->idle,
                .budget = r->queued ? r->budget : USEC_INFINITY,
                .queued = r->queued,
                .refusal = refusal,
                .retry_after_sec = retry,
                .reason = reason,
        });
        request_finish(r);
}

static void refuse_request(Engine *e, EngineRequest *r, Pool *p, Refusal refusal, usec_t at, usec_t wait,
                           const char *reason) {
        refuse_request_at(e, r, p, refusal, at, wait, reason, 0);
}

static void handle_granted(Engine *e, const PoolDecision *d) {
        EngineRequest *r = d->cookie;
        EngineLease *l;
        usec_t expires = r->max_hold == USEC_INFINITY ? USEC_INFINITY : usec_add(d->at, r->max_hold);

        if (engine_lease_new(e, d->pool, d->grant, r->lane, d->slots, d->members, d->n_slots, d->token,
                             d->remote_id, d->at, expires, r->userdata, &l) < 0) {
                d->pool->ops->release(d->pool, d->grant, d->at);
                refuse_request(e, r, d->pool, REFUSAL_UNAVAILABLE, d->at, decision_wait(d, r), NULL);
                return;
        }
        if (d->pool->ops->bind_grant)
                d->pool->ops->bind_grant(d->pool, d->grant, l);
        event_push(e, &(EngineEvent) {
                .type = ENGINE_EVENT_GRANTED,
                .at = d->at,
                .userdata = r->userdata,
                .request = r,
                .lease = l,
                .pool = d->pool->name,
                .lane = l->lane,
                .arrival = r->arrival,
                .wait = decision_wait(d, r),
                .state = r->state,
                .idle = r->idle,
                .budget = r->queued ? r->budget : USEC_INFINITY,
                .queued = r->queued,
        });
        request_finish(r);
}

/* ---- all-or-nothing requests (SPEC §3.5, also=) ---- */

static void process_decisions(Engine *e);
static void drain_event(Engine *e, const char *pool, const char *member, bool drained, const EngineDrainRecord *d,
                        bool expired, usec_t at);

static RequestPart *set_part(EngineRequest *r, const Pool *p) {
        for (size_t i = 0; i < r->n_parts; i++)
                if (r->parts[i].pool == p)
                        return r->parts + i;
        return NULL;
}

static void set_part_record(EngineRequest *r, RequestPart *part, const PoolDecision *d) {
        switch (d->verdict) {
        case POOL_VERDICT_QUEUED:
                part->st = PART_QUEUED;
                part->waiter = d->waiter;
                part->state = d->state;
                part->idle = d->idle;
                part->budget = d->budget;
                part->room = d->room;
                break;
        case POOL_VERDICT_REFUSED:
                part->st = PART_REFUSED;
                part->waiter = NULL;
                part->refusal = d->refusal;
                part->reason = d->reason;
                part->retry_at = d->retry_at;
                part->echo = d->echo;
                part->at = d->at;
                part->wait = decision_wait(d, r);
                break;
        case POOL_VERDICT_GRANTED:
                part->st = PART_GRANTED;
                part->waiter = NULL;
                part->grant = d->grant;
                part->indices = d->slots;
                part->members = d->members;
                part->n_slots = d->n_slots;
                part->token = d->token;
                part->remote_id = d->remote_id;
                break;
        default:
                break;
        }
}

/* Decisions about the request that are queued and not handled yet are taken into its parts now (and dropped
 * from the queue), so that nothing is withdrawn or released twice. */
static void set_absorb_pending(Engine *e, EngineRequest *r) {
        for (size_t i = 0; i < e->pending.n; i++) {
                PoolDecision *d = ring_at(&e->pending, i);
                if (!d->pool || d->cookie != r || d->verdict == POOL_VERDICT_LOST ||
                    d->verdict == POOL_VERDICT_CONGESTION)
                        continue;
                if (d->verdict == POOL_VERDICT_READY) {
                        d->pool = NULL; /* the request is decided now, or about to be */
                        continue;
                }
                RequestPart *part = set_part(r, d->pool);
                if (part)
                        set_part_record(r, part, d);
                d->pool = NULL; /* handled: process_decisions() skips it */
        }
}

/* The set's grant is asked and some pool's answer awaited (on), or not any more: its pools count it
 * (Pool.sets_granting, sets_settle()). */
static void set_granting(EngineRequest *r, bool on) {
        if (r->granting == on)
                return;
        r->granting = on;
        for (size_t i = 0; i < r->n_parts; i++) {
                assert(on || r->parts[i].pool->sets_granting > 0);
                r->parts[i].pool->sets_granting += on ? 1 : -1;
        }
}

/* Gives back every part: leaves the queues it waits in, releases what was granted (never kept alone), and
 * cancels a try a pool that decides later has not answered yet. */
static void set_withdraw(Engine *e, EngineRequest *r, usec_t now) {
        set_absorb_pending(e, r);
        for (size_t i = 0; i < r->n_parts; i++) {
                RequestPart *part = r->parts + i;
                if (part->st == PART_QUEUED)
                        part->pool->ops->withdraw(part->pool, part->waiter, now);
                else if (part->st == PART_GRANTED)
                        part->pool->ops->release(part->pool, part->grant, now);
                else if (part->st == PART_NONE && part->pool && part->pool->ops->cancel_try &&
                         (r->phase == REQUEST_ROUTING || r->granting))
                        part->pool->ops->cancel_try(part->pool, r, now);
                part->st = PART_NONE;
                part->waiter = NULL;
                part->grant = NULL;
        }
        set_granting(r, false);
}

/* The pool can be part of an all-or-nothing set: it says when a part is ready, and grants it by itself or in
 * one call over the set. */
static bool pool_takes_sets(const Pool *p) {
        return p->ops->ready && (p->ops->grant_waiter || (p->ops->submit_set && p->ops->grant_set));
}

/* Every pool of the set has these ops, and the call is there: one call decides the set (SPEC §3.5). */
static bool set_has_one_call(const EngineRequest *r, const void *call) {
        if (!call)
                return false;
        for (size_t i = 1; i < r->n_parts; i++)
                if (r->parts[i].pool->ops != r->parts[0].pool->ops)
                        return false;
        return true;
}

/* Some pool of the set has not answered yet (a pool that decides later). */
static bool set_is_awaited(const EngineRequest *r) {
        for (size_t i = 0; i < r->n_parts; i++)
                if (r->parts[i].st == PART_NONE)
                        return true;
        return false;
}

/* Every part waits at the head of its pool with room for it. */
static bool set_is_ready(const EngineRequest *r) {
        for (size_t i = 0; i < r->n_parts; i++) {
                const RequestPart *part = r->parts + i;
                if (part->st != PART_QUEUED || !part->pool->ops->ready(part->pool, part->waiter))
                        return false;
        }
        return true;
}

/* The part whose refusal the set's is: the first refused, but one refused only because another pool refused
 * the set (one call over it) names that other pool, and a pool that could not take the set at all (drained,
 * full) is named before one that is only busy, wherever it stands in the set, as the scripts decide over a
 * set (brokerd/lua/README, "All-or-nothing sets"). NULL: none is refused. */
static const RequestPart *set_refused_part(const EngineRequest *r) {
        const RequestPart *busy = NULL, *echo = NULL;
        for (size_t i = 0; i < r->n_parts; i++) {
                const RequestPart *part = r->parts + i;
                if (part->st != PART_REFUSED)
                        continue;
                if (part->echo)
                        echo = echo ?: part;
                else if (part->refusal == REFUSAL_BUSY)
                        busy = busy ?: part;
                else
                        return part;
        }
        return busy ?: echo;
}

/* Every part was granted (one call over the set granted it at once). */
static bool set_is_granted(const EngineRequest *r) {
        for (size_t i = 0; i < r->n_parts; i++)
                if (r->parts[i].st != PART_GRANTED)
                        return false;
        return true;
}

static void set_refuse(Engine *e, EngineRequest *r, Pool *p, Refusal refusal, usec_t at, usec_t wait,
                       const char *reason, usec_t now) {
        set_withdraw(e, r, now);
        refuse_request(e, r, p, refusal, at, wait, reason);
}

/* A set refused in the name of a part its pool refused: that pool's refusal, reason and retry time. */
static void set_refuse_as(Engine *e, EngineRequest *r, const RequestPart *part, usec_t now) {
        set_withdraw(e, r, now);
        refuse_request_at(e, r, part->pool, part->refusal, part->at, part->wait, part->reason, part->retry_at);
}

/* Every part granted: one lease over the set. */
static void set_lease(Engine *e, EngineRequest *r, usec_t now) {
        const RequestPart *main = r->parts;
        usec_t expires = r->max_hold == USEC_INFINITY ? USEC_INFINITY : usec_add(now, r->max_hold);
        EngineLease *l;

        if (engine_lease_new(e, main->pool, main->grant, r->lane, main->indices, main->members, main->n_slots,
                             main->token, main->remote_id, now, expires, r->userdata, &l) < 0)
                goto oom;
        l->also = calloc(r->n_parts - 1, sizeof(LeasePart));
        if (!l->also)
                goto oom_lease;
        for (size_t i = 1; i < r->n_parts; i++) {
                const RequestPart *part = r->parts + i;
                l->n_also++;
                if (lease_part_set(l->also + i - 1, part->pool, part->grant, part->indices, part->members,
                                   part->n_slots, part->token, part->remote_id) < 0)
                        goto oom_lease;
        }
        /* A pool that can lose a grant (a backend's) loses the whole lease with its share: the set is never
         * held in part (SPEC §3.5), and LOST's cookie is the lease whichever pool sends it. */
        for (size_t i = 0; i < r->n_parts; i++)
                if (r->parts[i].pool->ops->bind_grant)
                        r->parts[i].pool->ops->bind_grant(r->parts[i].pool, r->parts[i].grant, l);
        event_push(e, &(EngineEvent) {
                .type = ENGINE_EVENT_GRANTED,
                .at = now,
                .userdata = r->userdata,
                .request = r,
                .lease = l,
                .pool = main->pool->name,
                .lane = l->lane,
                .arrival = r->arrival,
                .wait = usec_sub_unsigned(now, r->arrival),
                .state = r->state,
                .idle = r->idle,
                .budget = r->queued ? r->budget : USEC_INFINITY,
                .queued = r->queued,
        });
        request_finish(r);
        return;

oom_lease:
        heap_remove(&e->expiries, &l->expiry_node);
        list_unlink(&l->node);
        engine_lease_free(l);
oom:
        set_refuse(e, r, main->pool, REFUSAL_UNAVAILABLE, now, usec_sub_unsigned(now, r->arrival), NULL, now);
}

/* Every part asked to grant has answered: one lease over the set, or none of it. */
static void set_grant_done(Engine *e, EngineRequest *r, usec_t now) {
        set_granting(r, false);
        const RequestPart *refused = set_refused_part(r), *bad = NULL;
        if (refused) {
                /* One of its pools refused its part meanwhile (its budget, a drain): the set ends so. */
                set_refuse_as(e, r, refused, now);
                return;
        }
        size_t n_queued = 0;
        for (size_t i = 0; i < r->n_parts; i++) {
                if (r->parts[i].st == PART_QUEUED)
                        n_queued++;
                else if (r->parts[i].st != PART_GRANTED && !bad)
                        bad = r->parts + i;
        }
        if (n_queued == r->n_parts)
                /* One call over the set found it not ready in some pool after all (another node's request
                 * came first there): nothing changed, it waits on, until its pools say it is ready again. */
                return;
        if (bad || n_queued > 0)
                set_refuse(e, r, (bad ?: r->parts)->pool, REFUSAL_UNAVAILABLE, now, usec_sub_unsigned(now, r->arrival),
                           NULL, now);
        else
                set_lease(e, r, now);
}

/* set_grant()'s end, whichever way it asked: what the pools answered at once is taken in; the set is granting
 * while any answer is awaited, else done now. Drops set_grant()'s reference. */
static void set_grant_settle(Engine *e, EngineRequest *r, usec_t now) {
        set_absorb_pending(e, r);
        if (set_is_awaited(r))
                set_granting(r, true);
        else
                set_grant_done(e, r, now);
        engine_request_unref(r);
}

/* Grants every part at once (set_is_ready() said so). A pool that decides later answers later: the set is
 * granting until every pool has (nothing else is decided for it meanwhile), then leased or given back whole.
 * at_once: as it arrives, with room in every pool (set_route_decide()): each part takes what a newcomer would
 * (PoolOps.grant_waiter()), as one call over the set grants it (brokerd/lua/set.lua, room_for()). */
static void set_grant(Engine *e, EngineRequest *r, bool at_once, usec_t now) {
        r->n_ref++; /* a refusal below finishes it: keep it for the checks */
        Pool *first = r->parts[0].pool;
        if (set_has_one_call(r, first->ops->grant_set)) {
                /* One call grants every part or none (pools of one backend). */
                Pool *pools[1 + CONF_LANE_ALSO_MAX];
                PoolWaiter *waiters[1 + CONF_LANE_ALSO_MAX];
                for (size_t i = 0; i < r->n_parts; i++) {
                        pools[i] = r->parts[i].pool;
                        waiters[i] = r->parts[i].waiter;
                }
                if (first->ops->grant_set(pools, waiters, r->n_parts, now) >= 0)
                        for (size_t i = 0; i < r->n_parts; i++) {
                                r->parts[i].st = PART_NONE; /* its answer awaited: no pool's waiter now */
                                r->parts[i].waiter = NULL;
                        }
                /* else -ENOMEM or -ESTALE: they stay queued, and the set is refused with them given back. */
                set_grant_settle(e, r, now);
                return;
        }
        for (size_t i = 0; i < r->n_parts; i++) {
                RequestPart *part = r->parts + i;
                PoolWaiter *w = part->waiter;
                part->st = PART_NONE;
                part->waiter = NULL;
                if (part->pool->ops->grant_waiter(part->pool, w, at_once, now) < 0) {
                        /* -ENOMEM: the pool refused it unavailable; -ESTALE cannot be (all ready). Those
                         * after it stay queued: given back with the set. */
                        break;
                }
        }
        set_grant_settle(e, r, now);
}

static int set_route_submit(Engine *e, EngineRequest *r, usec_t now);
static bool set_route_decide(Engine *e, EngineRequest *r, usec_t now);
static EngineLane *lane_find(const Engine *e, const char *name);

/* The pools marked to run again (Pool.rerun) do so at `t` (rerun_pools()). */
static void rerun_schedule(Engine *e, usec_t t) {
        e->rerun = true;
        e->rerun_at = MAX(e->rerun_at, t);
}

/* The set's pools but `except` run again at `t`, once the decisions in hand are handled (process_decisions()):
 * another set decided at this instant may stand in the same pools, and a pool that decides later runs after
 * every call it was sent for the sets (a withdraw). */
static void set_rerun(Engine *e, const EngineRequest *r, const Pool *except, usec_t t) {
        for (size_t i = 0; i < r->n_parts; i++)
                if (r->parts[i].pool != except)
                        r->parts[i].pool->rerun = true;
        rerun_schedule(e, t);
}

/* A decision about one part of a request: while routing or granting, the set is decided when the last of
 * its pools has answered (a pool that decides later); while it waits, a refusal (its budget in that pool ran
 * out, the pool was drained or removed) ends the whole request, named after that pool; the smallest budget
 * is the one that runs out first. */
static void set_handle_decision(Engine *e, EngineRequest *r, const PoolDecision *d) {
        RequestPart *part = set_part(r, d->pool);
        if (!part)
                return;
        set_part_record(r, part, d);
        if (r->phase == REQUEST_ROUTING) {
                if (set_is_awaited(r) || !set_route_decide(e, r, d->at))
                        return;
                if (set_route_submit(e, r, d->at) < 0)
                        refuse_request(e, r, d->pool, REFUSAL_UNAVAILABLE, d->at,
                                       usec_sub_unsigned(d->at, r->arrival), NULL);
                return;
        }
        if (r->phase != REQUEST_WAITING)
                return;
        if (r->granting) {
                if (!set_is_awaited(r)) {
                        /* Its pools go on now that the answer is in, and not before (sets_settle()): another
                         * pool's call may have overtaken the set's (sent by its chosen pool's object), finding the
                         * set still waiting ahead of those behind it. */
                        set_rerun(e, r, NULL, d->at);
                        set_grant_done(e, r, d->at);
                }
                return;
        }
        if (part->st != PART_REFUSED)
                return;
        /* Its parts in the other pools held back those behind them (pool.h: PoolTry.gated). Where those pools
         * have run this instant already, given back, they go on, as a pool grants again after refusing a
         * waiter at its budget's end (SPEC §3.3, step 4), and as they go on after a set's grant
         * (sets_settle()); else a waiter behind the set waits for the pool's next instant. But a set refused
         * by a command (a drain, a reload that removed its pool) comes before the instant's arrivals, and
         * its settle() runs the pools after them: run now, they would refuse the budgets that end at this
         * instant ahead of its arrivals (step 4 before 2), as a shared pool, whose tick comes after the
         * arrivals' calls, does not. */
        if (!(e->unsettled && e->unsettled_at == d->at && !e->pools_ran))
                set_rerun(e, r, part->pool, d->at);
        if (part->refusal == REFUSAL_UNAVAILABLE && part != r->parts && pool_in(e->pools, e->n_pools, part->pool) &&
            !lane_find(e, r->lane)) {
                /* Its lane removed by reload, every pool of the set refuses it: it is named after the pool it
                 * waits on (the lane's), whichever refusal came first. A shared pool refuses a removed lane's
                 * waiters as far as a call's budget goes, its next call the rest, after the other pools' (brokerd/
                 * lua/README, "Adoption"), where in-process pools refuse them all pool after pool. A pool removed
                 * names it still (refusals of its retirement come first either way: engine_configure()). */
                RequestPart named = *part;
                named.pool = r->parts[0].pool;
                set_refuse_as(e, r, &named, d->at);
                return;
        }
        set_refuse_as(e, r, part, d->at);
}

/* Every pool of the set on the route's next pool has answered: granted at once when all have room, else
 * refused or queued in all of them (SPEC §3.5). Returns true when the route's next pool is to be tried. */
static bool set_route_decide(Engine *e, EngineRequest *r, usec_t now) {
        bool last = r->next_route == r->n_route, may_wait = last && r->may_wait;
        Pool *p = r->pool;

        const RequestPart *refused = set_refused_part(r);
        if (refused) {
                Refusal why = refused->refusal;
                Pool *by = refused->pool;
                const char *reason = refused->reason;
                usec_t retry_at = refused->retry_at;
                /* A budget's end (a resumed set whose budget ended while no daemon ran) is at its deadline. */
                bool ended = why == REFUSAL_TIMEOUT || why == REFUSAL_SHED;
                usec_t at = ended ? refused->at : now, wait = ended ? refused->wait : usec_sub_unsigned(now, r->arrival);
                set_withdraw(e, r, now);
                /* Fail fast while an alternative remains (SPEC §3.2). */
                if (!last && (why == REFUSAL_BUSY || why == REFUSAL_UNAVAILABLE))
                        return true;
                refuse_request_at(e, r, by, why, at, wait, reason, retry_at);
                return false;
        }
        if (set_is_granted(r)) {
                set_lease(e, r, now);
                return false;
        }
        for (size_t i = 0; i < r->n_parts; i++)
                if (r->parts[i].st == PART_GRANTED) {
                        /* Granted in some pools and not in others: no pool decides so (one call grants all
                         * or none); an answer that says so is not followed: all given back, refused. */
                        set_withdraw(e, r, now);
                        refuse_request(e, r, p, REFUSAL_UNAVAILABLE, now, usec_sub_unsigned(now, r->arrival), NULL);
                        return false;
                }
        /* Granted at once only with room in every pool (SPEC §3.3, step 2); a part queued without room waits for
         * step 3 like any waiter, even if first in its queue already (set_is_ready()): the set is queued, and
         * sets_settle() grants it when its pools run. */
        bool room = true;
        for (size_t i = 0; i < r->n_parts; i++)
                room = room && r->parts[i].room;
        if (room && set_is_ready(r)) {
                r->phase = REQUEST_WAITING; /* granting: a pool's answer may come later */
                set_grant(e, r, true, now);
                return false;
        }
        if (!may_wait) {
                Pool *by = NULL;
                for (size_t i = 0; i < r->n_parts && !by; i++)
                        if (!r->parts[i].room || !r->parts[i].pool->ops->ready(r->parts[i].pool, r->parts[i].waiter))
                                by = r->parts[i].pool;
                set_withdraw(e, r, now);
                if (!last)
                        return true;
                refuse_request(e, r, by, REFUSAL_BUSY, now, usec_sub_unsigned(now, r->arrival), NULL);
                return false;
        }

        /* It waits in every pool of the set; its budget is the smallest of theirs (the first to end refuses
         * it, in that pool's name). */
        const RequestPart *least = r->parts;
        for (size_t i = 1; i < r->n_parts; i++)
                if (r->parts[i].budget < least->budget)
                        least = r->parts + i;
        r->phase = REQUEST_WAITING;
        r->queued = true;
        r->state = least->state;
        r->idle = least->idle;
        r->budget = least->budget;
        event_push(e, &(EngineEvent) {
                .type = ENGINE_EVENT_QUEUED,
                .at = now,
                .userdata = r->userdata,
                .request = r,
                .pool = p->name,
                .lane = r->lane,
                .arrival = r->arrival,
                .state = r->state,
                .idle = r->idle,
                .budget = r->budget,
                .queued = true,
        });
        return false;
}

/* Submits n parts of a set: in one submit_set() over them where their pools take the set whole (nothing was
 * tried if it fails), else the one part in its pool. */
static int set_submit_parts(Pool *const *pools, const PoolTry *tries, size_t n, bool whole, usec_t now) {
        if (whole)
                return pools[0]->ops->submit_set(pools, tries, n, now);
        assert(n == 1);
        return pools[0]->ops->submit(pools[0], tries, now);
}

/* Submits the set on the route's next pools in turn until one decides it; a pool that decides later is
 * awaited (set_handle_decision() goes on). */
static int set_route_submit(Engine *e, EngineRequest *r, usec_t now) {
        for (;;) {
                Pool *p = r->route[r->next_route++];
                bool last = r->next_route == r->n_route, may_wait = last && r->may_wait;
                r->pool = p;
                r->parts[0] = (RequestPart) { .pool = p, .slots = r->slots };
                for (size_t i = 1; i < r->n_parts; i++)
                        r->parts[i] = (RequestPart) { .pool = r->parts[i].pool, .slots = r->parts[i].slots };

                PoolTry tries[1 + CONF_LANE_ALSO_MAX];
                Pool *pools[1 + CONF_LANE_ALSO_MAX];
                /* Outside the loop: the tries are used after it. */
                Selector selector = { .terms = r->terms, .member = r->member };
                for (size_t i = 0; i < r->n_parts; i++) {
                        RequestPart *part = r->parts + i;
                        pools[i] = part->pool;
                        tries[i] = (PoolTry) {
                                        .cookie = r,
                                        .lane = r->lane,
                                        .slots = part->slots,
                                        .may_wait = may_wait,
                                        .lane_budget_set = r->lane_budget_set,
                                        .lane_budget = r->lane_budget,
                                        .client_cap = r->client_cap,
                                        .arrival = r->arrival,
                                        /* Labels and a member choose in the lane's own pool only. */
                                        .selector = i == 0 ? &selector : NULL,
                                        /* A handed-over waiter goes back behind those resumed before it in
                                         * every pool of its set: its place in each, as all are resumed in
                                         * their old queue order; each with the budget it had (the set's). */
                                        .resume = r->resume,
                                        .gated = true,
                        };
                }
                /* One call over the whole set (pools of one backend), else one a pool. */
                bool whole = set_has_one_call(r, p->ops->submit_set);
                size_t step = whole ? r->n_parts : 1;
                for (size_t i = 0; i < r->n_parts; i += step) {
                        int k = set_submit_parts(pools + i, tries + i, step, whole, now);
                        if (k < 0) {
                                /* Those from this one on made no try: nothing of theirs to cancel. */
                                for (size_t j = i; j < r->n_parts; j++)
                                        r->parts[j].st = PART_REFUSED;
                                set_withdraw(e, r, now);
                                return k;
                        }
                        set_absorb_pending(e, r);
                }
                if (set_is_awaited(r))
                        return 0;
                if (!set_route_decide(e, r, now))
                        return 0;
        }
}

/* Tries the lane's pools in order with every also= pool (SPEC §3.5). */
static int set_route(Engine *e, EngineRequest *r, const EngineLane *lane, usec_t now) {
        for (size_t i = 1; i < r->n_parts; i++)
                r->parts[i] = (RequestPart) { .pool = lane->also[i - 1], .slots = lane->also_slots[i - 1] };
        return set_route_submit(e, r, now);
}

/* Some pool of the set has a set's grant asked and not answered yet (Pool.sets_granting). */
static bool set_waits_for_a_grant(const EngineRequest *r) {
        for (size_t i = 0; i < r->n_parts; i++)
                if (r->parts[i].pool->sets_granting > 0)
                        return true;
        return false;
}

/* Grants the waiting sets that every pool of theirs is ready for, and lets each pool hand on what is left
 * (SPEC §3.3, step 3). Only sets a pool said READY for are looked at: a pool says so for each gated waiter it
 * stops at whenever it runs, so a set ready everywhere is said ready by all its pools in the same instant. A
 * set granted lets its pools go on, which may say READY for another: again until none is left. A set
 * with a pool where another set's grant is asked and not answered yet (pools that decide later) is looked at
 * again once it is: a pool's sets are asked in the order the engine finds them ready, as its in-process pools
 * grant them, and not in the order their calls reach the backend (each call goes in its chosen pool's outbox,
 * and a pool's batch carries its later calls ahead of other pools' earlier ones), which would give the pool's
 * token to the set behind first. */
static void sets_settle(Engine *e, usec_t t) {
        List later;
        ListNode *n;
        list_init(&later);
        while ((n = list_first(&e->sets))) {
                EngineRequest *r = container_of(n, EngineRequest, set_node);
                list_unlink(n);
                if (r->phase != REQUEST_WAITING || r->granting)
                        continue;
                if (set_waits_for_a_grant(r)) {
                        list_append(&later, n);
                        continue;
                }
                if (!set_is_ready(r))
                        continue;
                size_t n_parts = r->n_parts;
                Pool *pools[1 + CONF_LANE_ALSO_MAX];
                for (size_t i = 0; i < n_parts; i++)
                        pools[i] = r->parts[i].pool;
                set_grant(e, r, false, t);
                /* Its pools go on in the engine's order of pools (rerun_pools()), however the set was granted:
                 * a set whose grant is awaited (no other set was granting in its pools) has them run when the
                 * answer is in (set_handle_decision()), not now too, where a pool whose tick of this instant
                 * was still out would skip its run and come after the others. Run here in the set's order,
                 * in-process pools granted those behind it in another order of pools than shared ones did
                 * (tests/scenarios/set-grant-pools-in-order*.json). */
                bool awaited = false;
                for (size_t i = 0; i < n_parts; i++)
                        awaited = awaited || pools[i]->sets_granting > 0;
                if (!awaited) {
                        for (size_t i = 0; i < n_parts; i++)
                                pools[i]->rerun = true;
                        rerun_schedule(e, t);
                }
                process_decisions(e);
        }
        while ((n = list_first(&later))) {
                list_unlink(n);
                list_append(&e->sets, n);
        }
}

static void handle_decision(Engine *e, const PoolDecision *d) {
        /* A request's decisions carry the request; LOST carries the lease (handle_lost()): the verdict first,
         * then the cookie's fields. */
        bool of_request = d->verdict == POOL_VERDICT_GRANTED || d->verdict == POOL_VERDICT_QUEUED ||
                          d->verdict == POOL_VERDICT_REFUSED || d->verdict == POOL_VERDICT_READY;
        EngineRequest *r = of_request ? d->cookie : NULL;

        if (r && r->parts && d->verdict != POOL_VERDICT_READY) {
                set_handle_decision(e, r, d);
                return;
        }
        if (d->verdict == POOL_VERDICT_READY) {
                /* sets_settle() looks at it (once however many of its pools said so). */
                if (r && r->parts && r->phase == REQUEST_WAITING && !list_node_is_linked(&r->set_node))
                        list_append(&e->sets, &r->set_node);
                e->sets_at = MAX(e->sets_at, d->at);
                return;
        }

        switch (d->verdict) {
        case POOL_VERDICT_GRANTED:
                handle_granted(e, d);
                break;

        case POOL_VERDICT_QUEUED:
                r->phase = REQUEST_WAITING;
                r->waiter = d->waiter;
                r->pool = d->pool;
                r->queued = true;
                r->state = d->state;
                r->idle = d->idle;
                r->budget = d->budget;
                event_push(e, &(EngineEvent) {
                        .type = ENGINE_EVENT_QUEUED,
                        .at = d->at,
                        .userdata = r->userdata,
                        .request = r,
                        .pool = d->pool->name,
                        .lane = r->lane,
                        .arrival = r->arrival,
                        .state = d->state,
                        .idle = d->idle,
                        .budget = d->budget,
                        .queued = true,
                });
                break;

        case POOL_VERDICT_REFUSED:
                /* Fail fast while an alternative remains (SPEC §3.2). */
                if (r->phase == REQUEST_ROUTING && r->next_route < r->n_route &&
                    (d->refusal == REFUSAL_BUSY || d->refusal == REFUSAL_UNAVAILABLE)) {
                        if (request_try_next(e, r, d->at) < 0)
                                refuse_request(e, r, d->pool, REFUSAL_UNAVAILABLE, d->at,
                                               usec_sub_unsigned(d->at, r->arrival), NULL);
                        break;
                }
                refuse_request_at(e, r, d->pool, d->refusal, d->at, decision_wait(d, r), d->reason, d->retry_at);
                break;

        case POOL_VERDICT_LOST:
                /* The cookie is the lease bound with bind_grant(). */
                engine_lease_revoke(e, d->cookie, d->pool, d->at, d->reason ? d->reason : "lost", true);
                break;

        case POOL_VERDICT_MEMBER: {
                /* The pool's strings change with its next command: the event carries copies. */
                char *member = strdup(d->member), *job = d->job ? strdup(d->job) : NULL,
                     *note = d->note ? strdup(d->note) : NULL;
                if (!member || (d->job && !job) || (d->note && !note))
                        abort(); /* as event_push(): a lost event is a quarantine nobody hears of */
                event_push(e, &(EngineEvent) {
                        .type = ENGINE_EVENT_MEMBER,
                        .at = d->at,
                        .pool = d->pool->name,
                        .member = member,
                        .quarantined = d->quarantined,
                        .job = job,
                        .exit_status = d->exit_status,
                        .note = note,
                        .retired = d->pool->retired && !d->pool->ops->drain_with,
                });
                break;
        }

        case POOL_VERDICT_DRAIN:
                /* A drain the backend keeps: told as engine_drain_with() tells its own. */
                drain_event(e, d->pool->name, d->member, d->drained,
                            &(EngineDrainRecord) { .who = (char *) d->job, .reason = (char *) d->note,
                                                   .until = d->until },
                            d->expired, d->at);
                break;

        case POOL_VERDICT_CONGESTION:
                event_push(e, &(EngineEvent) {
                        .type = ENGINE_EVENT_CONGESTION,
                        .at = d->at,
                        .pool = d->pool->name,
                        .idle = d->idle,
                        .congested = d->congested,
                });
                break;

        default:
                assert(!"unknown pool verdict");
        }
}

/* The pools set_rerun() named run again at that instant. */
static void rerun_pools(Engine *e) {
        Pool *const *lists[] = { e->pools, e->retired };
        size_t sizes[] = { e->n_pools, e->n_retired };
        usec_t t = e->rerun_at;
        e->rerun = false;
        e->rerun_at = 0;
        for (size_t k = 0; k < ELEMENTSOF(lists); k++)
                for (size_t i = 0; i < sizes[k]; i++)
                        if (lists[k][i]->rerun) {
                                lists[k][i]->rerun = false;
                                lists[k][i]->ops->run(lists[k][i], t);
                        }
}

static void process_decisions(Engine *e) {
        do {
                if (e->rerun)
                        rerun_pools(e);
                PoolDecision d;
                while (ring_pop(&e->pending, &d))
                        if (d.pool) /* NULL: taken by set_absorb_pending() */
                                handle_decision(e, &d);
        } while (e->rerun);
}

/* ---- time ---- */

static void drains_expire(Engine *e, usec_t t);

static void settle(Engine *e, usec_t t) {
        drains_expire(e, t); /* before the pools run: what it frees is granted at this instant */
        /* Sets that a command of this instant made ready everywhere (a drain or a release gave back what held
         * them) are granted after its arrivals and before the pools refuse the budgets that end now (SPEC
         * §3.3: step 3 between 2 and 4), whether an in-process pool said READY or a pool that decides later
         * did in its answer to the command (engine_take_decisions() leaves those for here). */
        process_decisions(e);
        if (!list_is_empty(&e->sets))
                sets_settle(e, t);
        e->pools_ran = true;
        for (size_t i = 0; i < e->n_pools; i++)
                e->pools[i]->ops->run(e->pools[i], t);
        for (size_t i = 0; i < e->n_retired; i++)
                e->retired[i]->ops->run(e->retired[i], t);
        process_decisions(e);
        sets_settle(e, t);

        HeapNode *n;
        while ((n = heap_peek(&e->expiries)) && n->key <= t)
                engine_lease_revoke(e, container_of(n, EngineLease, expiry_node), NULL, n->key, "max-hold", false);
        e->unsettled = false;
        e->pools_ran = false;
}

/* The earliest wakeup later than `after` (USEC_INFINITY: none). */
static usec_t next_wakeup_after(const Engine *e, usec_t after, bool any) {
        usec_t t = USEC_INFINITY;
        Pool *const *lists[] = { e->pools, e->retired };
        size_t sizes[] = { e->n_pools, e->n_retired };
        if (e->unsettled && (!any || e->unsettled_at > after))
                t = e->unsettled_at;
        for (size_t k = 0; k < ELEMENTSOF(lists); k++)
                for (size_t i = 0; i < sizes[k]; i++) {
                        usec_t w = lists[k][i]->ops->next_wakeup(lists[k][i]);
                        if (!any || w > after)
                                t = MIN(t, w);
                }
        HeapNode *n = heap_peek(&e->expiries);
        if (n && (!any || n->key > after))
                t = MIN(t, n->key);
        for (size_t i = 0; i < e->n_drains; i++)
                if (!any || e->drains[i].until > after)
                        t = MIN(t, e->drains[i].until);
        return t;
}

/* Applies what pools decided since the last call, then everything due before `now`, each at its own
 * instant, so that a command at `now` sees the state the clock says it should: an expired waiter is
 * refused at its deadline, never granted late. Each instant is settled once, in increasing order: a pool
 * whose wakeup is still due after running it (a remote pool awaiting its backend's answer) is not run
 * again and again. */
static void engine_advance(Engine *e, usec_t now) {
        process_decisions(e);
        bool any = false;
        usec_t done = 0;
        for (;;) {
                usec_t t = next_wakeup_after(e, done, any);
                if (t >= now)
                        break;
                settle(e, t);
                done = t;
                any = true;
        }
}

void engine_take_decisions(Engine *e) {
        if (!e)
                return;
        process_decisions(e);
        /* A pool that decides later says READY in its answers: a set every pool of which is ready now is
         * granted at that instant, as engine_run() would (the grant is one more call over the set). But not
         * while a command opened that instant and engine_run() has not settled it: more commands of it may
         * follow, and its arrivals come before freed slots go to waiters (SPEC §3.3, step 2 before 3), as an
         * in-process pool's set waits for settle(). engine_next_wakeup() names the instant meanwhile. */
        if (!list_is_empty(&e->sets) && !(e->unsettled && e->sets_at >= e->unsettled_at))
                sets_settle(e, e->sets_at);
}

usec_t engine_next_wakeup(const Engine *e) {
        return e ? next_wakeup_after(e, 0, false) : USEC_INFINITY;
}

static void mark_unsettled(Engine *e, usec_t now) {
        e->unsettled = true;
        e->unsettled_at = now;
}

void engine_run(Engine *e, usec_t now) {
        if (!e)
                return;
        engine_advance(e, now);
        settle(e, now);
        /* A retired shared pool goes once its backend took its last release: an answer, not a command. */
        retired_gc(e);
}

/* ---- commands ---- */

static EngineLane *lane_find(const Engine *e, const char *name) {
        for (size_t i = 0; i < e->n_lanes; i++)
                if (streq(e->lanes[i]->name, name))
                        return e->lanes[i];
        return NULL;
}

static Pool *pool_by_name(const Engine *e, const char *pool);

/* The most slots lane l can ever hold at once in pool p (conf_lane_most()): the pool's limit for a lane without
 * limits of its own (a reservation's). UINT_MAX: the lane takes no slots of p (a reload took p away: p refuses). */
static unsigned engine_lane_most(const EngineLane *l, const Pool *p) {
        for (size_t i = 0; i < l->n_pools; i++)
                if (l->pools[i] == p)
                        return l->most ? l->most[i] : p->limit;
        for (size_t i = 0; i < l->n_also; i++)
                if (l->also[i] == p)
                        return l->also_most[i];
        return UINT_MAX;
}

int engine_acquire(Engine *e, const EngineAcquire *a, usec_t now, EngineRequest **ret) {
        assert_return(e, -EINVAL);
        assert_return(a && (a->lane || a->reserve_pool), -EINVAL);
        assert_return(a->slots >= 1, -EINVAL);
        assert_return(ret, -EINVAL);

        /* A resumed waiter's times come from the state file of the previous daemon: the same boot's clock. */
        assert_return(!a->resume || (a->resume->pool && a->resume->arrival <= now &&
                                     a->resume->state >= 0 && a->resume->state < _QUEUE_STATE_MAX),
                      -EINVAL);

        engine_advance(e, now);

        /* A reservation (SPEC §3.6): its pool alone, at the head of its queue, for as long as it takes. */
        Pool *reserve_in[1];
        EngineLane reserve_lane;
        EngineLane *lane;
        if (a->reserve_pool) {
                Pool *p = pool_by_name(e, a->reserve_pool);
                if (!p)
                        return -ENOENT;
                /* A shared pool takes one too, with a member or labels as any request (its lane is implicit in
                 * the scripts: brokerd/lua/README, "Reservations"). */
                const char *name = engine_intern(e, ENGINE_RESERVE_LANE);
                if (!name)
                        return -ENOMEM;
                reserve_in[0] = p;
                reserve_lane = (EngineLane) {
                        .name = name,
                        .policy = LANE_POLICY_WAIT,
                        .priority = INT_MAX,
                        .queue_timeout_set = true,
                        .queue_timeout = USEC_INFINITY,
                        .max_hold = USEC_INFINITY,
                        .pools = reserve_in,
                        .n_pools = 1,
                };
                lane = &reserve_lane;
        } else if (!(lane = lane_find(e, a->lane)))
                return -ENOENT;

        EngineRequest *r = calloc(1, sizeof(EngineRequest));
        if (!r)
                return -ENOMEM;
        r->route = calloc(lane->n_pools, sizeof(Pool *));
        r->lane = lane->name;
        if (!r->route) {
                request_free(r);
                return -ENOMEM;
        }

        /* Its selector: the lane's terms, narrowed by the client's (SPEC §3.5). */
        size_t n_lane_terms = strv_length(lane->labels), n_terms = strv_length((char *const *) a->labels);
        if (n_lane_terms + n_terms > SELECTOR_TERMS_MAX || (a->member && !conf_name_is_valid(a->member))) {
                request_free(r);
                return -EINVAL;
        }
        for (size_t i = 0; i < n_terms; i++)
                if (!selector_term_is_valid(a->labels[i])) {
                        request_free(r);
                        return -EINVAL;
                }
        if (n_lane_terms + n_terms > 0) {
                r->terms = calloc(n_lane_terms + n_terms + 1, sizeof(char *));
                if (!r->terms) {
                        request_free(r);
                        return -ENOMEM;
                }
                for (size_t i = 0; i < n_lane_terms + n_terms; i++)
                        if (!(r->terms[i] = strdup(i < n_lane_terms ? lane->labels[i] : a->labels[i - n_lane_terms]))) {
                                request_free(r);
                                return -ENOMEM;
                        }
        }
        r->n_lane_terms = n_lane_terms;
        if (a->member && !(r->member = strdup(a->member))) {
                request_free(r);
                return -ENOMEM;
        }
        const Selector sel = { .terms = r->terms, .member = r->member };
        bool selective = !selector_is_empty(&sel);

        /* A request that is bigger than a pool skips it, as does one that its lane's limits there never admit, or
         * whose selector the pool's members cannot satisfy (or a pool that takes no selectors); drained pools are
         * skipped too. */
        Pool *fits = NULL, *back = NULL;
        for (size_t i = 0; i < lane->n_pools; i++) {
                Pool *p = lane->pools[i];
                int cap = selective && !p->ops->selectors ? 0 : pool_selector_capacity(p, &sel);
                if (cap < 0) {
                        request_free(r);
                        return cap;
                }
                if (a->slots > MIN((unsigned) cap, lane->most ? lane->most[i] : p->limit))
                        continue;
                fits = p;
                if (!p->drained) {
                        r->route[r->n_route++] = p;
                        if (a->resume && streq(p->name, a->resume->pool))
                                back = p;
                }
        }
        /* An all-or-nothing lane (SPEC §3.5): each also= pool must be able to give its share at all. */
        bool never = !fits;
        for (size_t i = 0; i < lane->n_also; i++)
                never = never || lane->also_slots[i] > MIN(lane->also[i]->limit, lane->also_most[i]);
        /* A waiter handed over that the new configuration can never grant (its member gone, a pool shrunk) was
         * valid when it queued: refused as a reload refuses it (refuse_changed_lanes()), not as bad input. */
        Pool *resumed_in = never && a->resume && lane->n_pools > 0 ? pool_by_name(e, a->resume->pool) : NULL;
        if (never && a->resume && lane->n_pools > 0)
                fits = resumed_in ?: lane->pools[0];
        else if (never) {
                request_free(r);
                return -EINVAL;
        }
        if (lane->n_also > 0) {
                r->n_parts = 1 + lane->n_also;
                r->parts = calloc(r->n_parts, sizeof(RequestPart));
                if (!r->parts) {
                        request_free(r);
                        return -ENOMEM;
                }
        }
        /* A resumed waiter goes back to its pool alone, where it stands in the queue; its pool gone from the
         * lane (or drained, or now too small) it is routed as a new request, arriving when it arrived. */
        PoolResume resume;
        if (back) {
                r->route[0] = back;
                r->n_route = 1;
                resume = (PoolResume) {
                        .state = a->resume->state,
                        .idle = a->resume->idle,
                        .budget = a->resume->budget,
                        .remote_id = a->resume->remote_id,
                };
                r->resume = &resume;
        }

        bool hear_client = !lane->client_wait_ignore;
        r->n_ref = 2; /* the caller's and the engine's until the final decision */
        r->engine = e;
        r->userdata = a->userdata;
        r->slots = a->slots;
        r->may_wait = lane->policy == LANE_POLICY_WAIT && !(hear_client && a->no_wait);
        r->lane_budget_set = lane->queue_timeout_set;
        r->lane_budget = lane->queue_timeout;
        r->client_cap = hear_client ? a->max_wait : USEC_INFINITY;
        r->max_hold = MIN(lane->max_hold, a->max_hold > 0 ? a->max_hold : USEC_INFINITY);
        r->arrival = a->resume ? a->resume->arrival : now;
        r->phase = REQUEST_ROUTING;
        r->state = QUEUE_STATE_NONE;
        r->budget = USEC_INFINITY;
        if (back) {
                /* What it got when it joined the queue: its events say so even if it is granted at once now. */
                r->queued = true;
                r->state = resume.state;
                r->idle = resume.idle;
                r->budget = resume.budget;
        }

        /* A waiter handed over from a brokerd whose lane had other labels= or also= (a new configuration at the
         * restart) is refused as a reload refuses it (refuse_changed_lanes()), not granted what it did not ask for. */
        bool lane_changed = never;
        if (!never && a->resume && a->resume->lane_rules) {
                _cleanup_free_ char *rules = NULL;
                if (lane_rules_of(lane, &rules) < 0) {
                        request_free(r);
                        return -ENOMEM;
                }
                lane_changed = !streq(rules, a->resume->lane_rules);
        }

        mark_unsettled(e, now);
        list_append(&e->requests, &r->node);
        if (lane_changed) {
                r->resume = NULL; /* `resume` goes out of scope */
                refuse_request(e, r, back ?: fits, REFUSAL_UNAVAILABLE, now, usec_sub_unsigned(now, r->arrival), "reload");
        } else if (r->n_route == 0) {
                refuse_request(e, r, fits, REFUSAL_UNAVAILABLE, now, usec_sub_unsigned(now, r->arrival), NULL);
        } else if (r->parts) {
                r->n_ref++; /* set_route() may finish it */
                int k = set_route(e, r, lane, now);
                r->resume = NULL; /* `resume` goes out of scope */
                if (k < 0) {
                        list_unlink(&r->node);
                        request_free(r);
                        return k;
                }
                r->n_ref--;
        } else {
                int k = request_try_next(e, r, now);
                r->resume = NULL; /* `resume` goes out of scope */
                if (k < 0) {
                        /* Nothing was queued; the decision queue holds nothing of this request. */
                        list_unlink(&r->node);
                        request_free(r);
                        return k;
                }
        }
        process_decisions(e);
        *ret = r;
        return 0;
}

static Pool *pool_by_name(const Engine *e, const char *pool) {
        return pool ? pool_find(e->pools, e->n_pools, pool) : NULL;
}

int engine_pool_get_last_fast(const Engine *e, const char *pool, usec_t *ret) {
        assert_return(e && ret, -EINVAL);
        Pool *p = pool_by_name(e, pool);
        if (!p)
                return -ENOENT;
        if (!p->ops->get_last_fast)
                return -EOPNOTSUPP;
        *ret = p->ops->get_last_fast(p);
        return 0;
}

int engine_pool_set_last_fast(Engine *e, const char *pool, usec_t last_fast, usec_t now) {
        assert_return(e, -EINVAL);
        /* From the previous daemon's state: an instant of this boot that has passed. */
        if (last_fast > now)
                return -EINVAL;
        Pool *p = pool_by_name(e, pool);
        if (!p)
                return -ENOENT;
        if (!p->ops->set_last_fast)
                return -EOPNOTSUPP;
        engine_advance(e, now);
        p->ops->set_last_fast(p, last_fast, now);
        mark_unsettled(e, now);
        process_decisions(e);
        return 0;
}

/* Takes a request that is not decided out of every pool it waits in or was submitted to. Returns false when
 * there is nothing to take it out of (decided, or its pool's answer cannot be cancelled). */
static bool request_withdraw(Engine *e, EngineRequest *r, usec_t now) {
        if (r->parts && (r->phase == REQUEST_WAITING || r->phase == REQUEST_ROUTING))
                set_withdraw(e, r, now); /* also the tries of pools that have not answered yet */
        else if (r->phase == REQUEST_WAITING)
                r->pool->ops->withdraw(r->pool, r->waiter, now);
        else if (r->phase == REQUEST_ROUTING && r->pool->ops->cancel_try)
                /* Its pool has not answered yet (the in-process pool always has): nothing will come now. */
                r->pool->ops->cancel_try(r->pool, r, now);
        else
                return false;
        return true;
}

void engine_request_cancel(EngineRequest *r, usec_t now) {
        if (!r || !r->engine)
                return;
        Engine *e = r->engine;
        /* Settle first: a budget that ended before `now` has already refused it, and a decision that came
         * in is the answer (its event follows). */
        engine_advance(e, now);
        if (!request_withdraw(e, r, now))
                return;
        mark_unsettled(e, now);
        request_finish(r);
        retired_gc(e);
}

/* Whether lane l's labels= or also= (pools and K) differ from those request r was made with. Neither lists a
 * name twice (conf_validate()). */
static bool request_lane_changed(const EngineRequest *r, const EngineLane *l) {
        size_t n = strv_length(l->labels);
        if (n != r->n_lane_terms)
                return true;
        for (size_t i = 0; i < n; i++) {
                bool found = false;
                for (size_t j = 0; j < n && !found; j++)
                        found = streq(l->labels[i], r->terms[j]);
                if (!found)
                        return true;
        }
        if ((r->parts ? r->n_parts - 1 : 0) != l->n_also)
                return true;
        for (size_t i = 0; i < l->n_also; i++) {
                bool found = false;
                for (size_t k = 1; k < r->n_parts && !found; k++)
                        found = streq(r->parts[k].pool->name, l->also[i]->name) && r->parts[k].slots == l->also_slots[i];
                if (!found)
                        return true;
        }
        return false;
}

/* Whether a reload left request r more slots to ask of a pool than its lane may ever hold there (a limit shrunk, a
 * max-in-use lowered, a reserve= of another lane raised: SPEC §3): as one that asks for more arriving now
 * (engine_acquire()), it can never be granted, and a waiter short of slots would hold back everyone behind it
 * meanwhile. Only where it waits: a pool it may still move on from answers for itself. */
static bool request_exceeds_lane(const EngineRequest *r, const EngineLane *l) {
        for (size_t k = 0; k < r->n_parts; k++)
                if (r->parts[k].slots > MIN(r->parts[k].pool->limit, engine_lane_most(l, r->parts[k].pool)))
                        return true;
        if (r->parts || !r->pool || r->next_route != r->n_route)
                return false;
        return r->slots > MIN(r->pool->limit, engine_lane_most(l, r->pool));
}

/* A lane's labels= and also= are part of each of its requests, taken when it arrives: after a reload that changed
 * them, its requests not yet decided are refused (unavailable, "reload") rather than granted what the lane now
 * excludes, or without the pools (or with the K) it now takes; and so are those it left asking for more than its
 * limits allow (request_exceeds_lane()). Requests of removed lanes their pools refuse. */
static void refuse_changed_lanes(Engine *e, usec_t now) {
        bool any = false;
        list_foreach_safe(n, &e->requests) {
                EngineRequest *r = container_of(n, EngineRequest, node);
                const EngineLane *l = lane_find(e, r->lane);
                if (!l || !(request_lane_changed(r, l) || request_exceeds_lane(r, l)) || !request_withdraw(e, r, now))
                        continue;
                refuse_request(e, r, r->pool, REFUSAL_UNAVAILABLE, now, usec_sub_unsigned(now, r->arrival), "reload");
                any = true;
        }
        if (any)
                mark_unsettled(e, now);
}

void engine_lease_release(EngineLease *l, usec_t now) {
        if (!l)
                return;
        Engine *e = l->engine;
        engine_advance(e, now);
        events_forget_lease(e, l);
        heap_remove(&e->expiries, &l->expiry_node);
        /* SPEC §3.6 with §3.5: one lease covers the whole set, so its status counts in every pool of it, each by
         * its own quarantine-exit-codes=. */
        if (l->exit_status >= 0 && l->pool->ops->report_exit)
                l->pool->ops->report_exit(l->pool, l->grant, l->exit_status, l->exit_job, now);
        for (size_t i = 0; i < l->n_also; i++)
                if (l->exit_status >= 0 && l->also[i].pool->ops->report_exit)
                        l->also[i].pool->ops->report_exit(l->also[i].pool, l->also[i].grant, l->exit_status,
                                                          l->exit_job, now);
        l->pool->ops->release(l->pool, l->grant, now);
        for (size_t i = 0; i < l->n_also; i++)
                l->also[i].pool->ops->release(l->also[i].pool, l->also[i].grant, now);
        list_unlink(&l->node);
        engine_lease_free(l);
        mark_unsettled(e, now);
        process_decisions(e);
        retired_gc(e);
}

/* The pool object a restored lease goes back to (made, retired, when none is there). */
static int restore_pool(Engine *e, const EngineLeaseRestore *rs, Pool **ret) {

        /* A shared lease goes to the pool object of that name kept where it was granted (or, not recorded, by
         * any backend), a local one to the local one: after a move both may be there. */
        _cleanup_free_ char *identity = NULL;
        if (rs->remote_id && rs->granted_in && pool_identity(rs->granted_in, &identity) < 0)
                return -ENOMEM;
        Pool *p = identity ? pool_find_kept(e->pools, e->n_pools, rs->pool, identity) : NULL;
        if (!p && identity)
                p = pool_find_kept(e->retired, e->n_retired, rs->pool, identity);
        /* Another backend= of the same name: the lease is reclaimed there (one object per shared pool: two
         * on one Redis under two URLs would reconcile each other's records away). */
        if (!p)
                p = pool_find_kind(e->pools, e->n_pools, rs->pool, rs->remote_id);
        if (!p)
                p = pool_find_kind(e->retired, e->n_retired, rs->pool, rs->remote_id);
        if (!p && identity) {
                /* Not shared any more (removed, or local): a pool where it was granted holds it, retired,
                 * until it ends; a reload that shares the pool there again revives it. */
                Pool **a = reallocarray(e->retired, e->n_retired + 1, sizeof(Pool *));
                if (!a)
                        return -ENOMEM;
                e->retired = a;
                int r = pool_new_for(e, rs->granted_in, rs->pool, &p);
                if (r < 0)
                        return r;
                p->ops->retire(p, rs->granted_at);
                e->retired[e->n_retired++] = p;
        }
        if (!p)
                p = pool_find(e->retired, e->n_retired, rs->pool);
        if (!p) {
                /* Its pool left the configuration: the lease still ends only when its holder is gone. A retired
                 * pool holds it, as one removed by reload would, and a reload that names the pool revives it. */
                Pool **a = reallocarray(e->retired, e->n_retired + 1, sizeof(Pool *));
                if (!a)
                        return -ENOMEM;
                e->retired = a;
                int r = pool_new_for(e, NULL, rs->pool, &p);
                if (r < 0)
                        return r;
                p->ops->retire(p, rs->granted_at);
                e->retired[e->n_retired++] = p;
        }
        *ret = p;
        return 0;
}

/* The members a restored share holds: those recorded, or, for a lease recorded without member names (by an
 * older brokerd), those at its indices (*ret_owned, the caller's to free). */
static int restore_members(const Pool *p, const EngineLeaseRestore *rs, const char ***ret_owned,
                           const char *const **ret_members) {
        const char **by_index = NULL;
        if (!rs->members && p->members) {
                by_index = calloc(rs->n_slots, sizeof(char *));
                if (!by_index)
                        return -ENOMEM;
                for (unsigned i = 0; i < rs->n_slots; i++)
                        by_index[i] = rs->slots[i] < p->limit ? p->members[rs->slots[i]] : NULL;
        }
        *ret_owned = by_index;
        *ret_members = by_index ? by_index : rs->members;
        return 0;
}

/* One share of a restored lease (its own pool's, or an also= pool's) taken again in its pool under `lane`: the
 * pool (made for it if need be), the members it holds (*ret_owned, the caller's to free) and the pool's grant.
 * On failure nothing is held, and a pool made for it alone goes again. */
static int restore_share(Engine *e, const EngineLeaseRestore *rs, const char *lane, usec_t granted_at,
                         Pool **ret_pool, PoolGrant **ret_grant, const char ***ret_owned,
                         const char *const **ret_members) {
        Pool *p;
        int r = restore_pool(e, rs, &p);
        if (r < 0)
                return r;
        const char **owned;
        const char *const *members;
        if (restore_members(p, rs, &owned, &members) < 0) {
                retired_gc(e);
                return -ENOMEM;
        }
        PoolGrant *g;
        r = p->ops->restore(p,
                            &(PoolRestore) {
                                    .lane = lane,
                                    .slots = rs->slots,
                                    .members = members,
                                    .n_slots = rs->n_slots,
                                    .token = rs->token,
                                    .remote_id = rs->remote_id,
                                    .granted_at = granted_at,
                                    .health_known = rs->health_known,
                                    .health = rs->health,
                                    .quarantine = rs->quarantine,
                                    .node_ttl = rs->granted_in ? rs->granted_in->backend_node_ttl : 0,
                            },
                            &g);
        if (r < 0) {
                free(owned);
                retired_gc(e);
                return r;
        }
        *ret_pool = p;
        *ret_grant = g;
        *ret_owned = owned;
        *ret_members = members;
        return 0;
}

int engine_lease_restore(Engine *e, const EngineLeaseRestore *rs, EngineLease **ret) {
        assert_return(e, -EINVAL);
        assert_return(rs && rs->pool && rs->lane && rs->slots && rs->n_slots > 0, -EINVAL);
        assert_return(ret, -EINVAL);

        Pool *p;
        PoolGrant *g;
        _cleanup_free_ const char **by_index = NULL;
        const char *const *members;
        int r = restore_share(e, rs, rs->lane, rs->granted_at, &p, &g, &by_index, &members);
        if (r < 0)
                return r;
        EngineLease *l;
        r = engine_lease_new(e, p, g, rs->lane, rs->slots, members, rs->n_slots, rs->token, rs->remote_id,
                             rs->granted_at, rs->expires_at, rs->userdata, &l);
        if (r < 0) {
                p->ops->release(p, g, rs->granted_at);
                retired_gc(e); /* a pool made for this lease alone goes again */
                return r;
        }
        if (p->ops->bind_grant)
                p->ops->bind_grant(p, g, l);
        *ret = l;
        return 0;
}

int engine_lease_restore_also(EngineLease *l, const EngineLeaseRestore *rs) {
        assert_return(l, -EINVAL);
        assert_return(rs && rs->pool && rs->slots && rs->n_slots > 0, -EINVAL);
        Engine *e = l->engine;
        /* A set is of local pools or of shared pools of one backend (SPEC §3.5), never mixed. */
        if (!!l->remote_id != !!rs->remote_id || l->n_also >= CONF_LANE_ALSO_MAX)
                return -EINVAL;
        for (size_t i = 0; i < l->n_also; i++)
                if (streq(l->also[i].pool->name, rs->pool))
                        return -EINVAL;
        if (streq(l->pool->name, rs->pool))
                return -EINVAL;
        LeasePart *a = reallocarray(l->also, l->n_also + 1, sizeof(LeasePart));
        if (!a)
                return -ENOMEM;
        l->also = a;
        Pool *p;
        PoolGrant *g;
        _cleanup_free_ const char **by_index = NULL;
        const char *const *members;
        int r = restore_share(e, rs, l->lane, l->granted_at, &p, &g, &by_index, &members);
        if (r < 0)
                return r;
        r = lease_part_set(l->also + l->n_also, p, g, rs->slots, members, rs->n_slots, rs->token, rs->remote_id);
        if (r < 0) {
                lease_part_done(l->also + l->n_also);
                p->ops->release(p, g, l->granted_at);
                retired_gc(e);
                return r;
        }
        l->n_also++;
        /* Its loss (a reclaim refused, a node fenced from that pool) revokes the whole lease, as set_lease()
         * binds a share granted now. */
        if (p->ops->bind_grant)
                p->ops->bind_grant(p, g, l);
        return 0;
}

int engine_set_token_floor(Engine *e, const char *pool, uint64_t next_token) {
        assert_return(e && pool, -EINVAL);
        /* Every object of the name (a moved pool has two), and the name's floor for those made later. */
        Pool *const *lists[] = { e->pools, e->retired };
        size_t sizes[] = { e->n_pools, e->n_retired };
        for (size_t k = 0; k < ELEMENTSOF(lists); k++)
                for (size_t i = 0; i < sizes[k]; i++)
                        if (streq(lists[k][i]->name, pool))
                                lists[k][i]->ops->set_token_floor(lists[k][i], next_token);
        return token_floor_raise(e, pool, next_token);
}

int engine_lease_set_exit_status(EngineLease *l, int exit_status, const char *job) {
        assert_return(l, -EINVAL);
        if (exit_status < 0 || exit_status > 255)
                return -EINVAL;
        char *j = NULL;
        if (job && *job && !(j = strdup(job)))
                return -ENOMEM;
        /* The job label is any text the client gave; the quarantine it may make is shown and journaled as one
         * line of text (an empty one is none), kept in members.state, which reads anything else as damage, and
         * on a shared pool in Redis, whose record with a control character every node reads as malformed. C1
         * and the line separators too, as a reason may carry none of them (conf_reason_is_valid()). */
        conf_text_sanitize(j);
        free(l->exit_job);
        l->exit_job = j;
        l->exit_status = exit_status;
        return 0;
}

int engine_lease_get_exit_status(const EngineLease *l) {
        assert_return(l, -1);
        return l->exit_status;
}

int engine_member_quarantine(Engine *e, const char *pool, const char *member, const EngineQuarantine *q, usec_t now) {
        assert_return(e && pool && member, -EINVAL);
        assert_return(!q || q->restore || q->since <= now, -EINVAL);
        engine_advance(e, now);
        Pool *p = pool_find(e->pools, e->n_pools, pool);
        if (!p)
                return -ENOENT;
        if (!p->ops->quarantine)
                return -EOPNOTSUPP;
        int r = p->ops->quarantine(p, member, q, now);
        if (r < 0)
                return r;
        mark_unsettled(e, now);
        process_decisions(e);
        return 0;
}

/* An in-process pool kept for leases restored after the name left the configuration, or moved to a backend while
 * brokerd was down (which of its members count: the pool's set_use()). */
static Pool *pool_restored_of(const Engine *e, const char *pool) {
        for (size_t i = 0; i < e->n_retired; i++)
                if (streq(e->retired[i]->name, pool) && !e->retired[i]->ops->drain_with)
                        return e->retired[i];
        return NULL;
}

/* Where a member's counts are: the configured pool of the name, and the in-process one kept for leases restored
 * from before (pool_restored_of()). With both (the name moved to a backend), the lease log's counts are of the
 * in-process days: that pool takes them too, and answers first for the members it counts, so that the failures
 * in a row of its restored leases go on there and what their ends add is written back. */
int engine_member_set_use(Engine *e, const char *pool, const char *member, const EngineMemberUse *u) {
        assert_return(e && pool && member && u, -EINVAL);
        Pool *p = pool_find(e->pools, e->n_pools, pool), *rp = pool_restored_of(e, pool);
        int r = rp && rp->ops->set_use ? rp->ops->set_use(rp, member, u) : -ENOENT;
        if (!p)
                return r;
        int k = p->ops->set_use ? p->ops->set_use(p, member, u) : -EOPNOTSUPP;
        return r >= 0 ? r : k;
}

int engine_member_get_use(const Engine *e, const char *pool, const char *member, EngineMemberUse *ret) {
        assert_return(e && pool && member && ret, -EINVAL);
        Pool *p = pool_find(e->pools, e->n_pools, pool), *rp = pool_restored_of(e, pool);
        int r = rp && rp->ops->get_use ? rp->ops->get_use(rp, member, ret) : -ENOENT;
        if (r >= 0 || !p)
                return r;
        return p->ops->get_use ? p->ops->get_use(p, member, ret) : -EOPNOTSUPP;
}

/* ---- drains with who, why and until ---- */

static char *dup_or_null(const char *s, bool *oom) {
        char *c = s ? strdup(s) : NULL;
        if (s && !c)
                *oom = true;
        return c;
}

static void drain_event(Engine *e, const char *pool, const char *member, bool drained, const EngineDrainRecord *d,
                        bool expired, usec_t at) {
        bool oom = false;
        char *m = dup_or_null(member, &oom), *who = dup_or_null(d ? d->who : NULL, &oom),
             *reason = dup_or_null(d ? d->reason : NULL, &oom);
        if (oom)
                abort(); /* as event_push() */
        event_push(e, &(EngineEvent) {
                .type = ENGINE_EVENT_DRAIN,
                .at = at,
                .pool = pool,
                .member = m,
                .job = expired ? NULL : who,
                .note = reason,
                .drained = drained,
                .until = d ? d->until : USEC_INFINITY,
                .until_realtime = d ? d->until_realtime : 0,
                .expired = expired,
                .exit_status = -1,
        });
        if (expired)
                free(who);
}

static ssize_t drain_find(const Engine *e, const char *pool, const char *member) {
        for (size_t i = 0; i < e->n_drains; i++)
                if (streq(e->drains[i].pool, pool) && streq_ptr(e->drains[i].member, member))
                        return (ssize_t) i;
        return -1;
}

static void drain_record_remove(Engine *e, size_t i) {
        free(e->drains[i].member);
        free(e->drains[i].who);
        free(e->drains[i].reason);
        memmove(e->drains + i, e->drains + i + 1, (e->n_drains - i - 1) * sizeof(EngineDrainRecord));
        e->n_drains--;
}

/* Whether drain a ends before b: the earlier until; at one instant by pool, then the pool's own drain before
 * its members' by name — the order a pool kept in Redis ends them in (its until index is a sorted set, which
 * ranks equal scores by field, the pool's being ""), so both say the same (test-shared-diff seed 11683). */
static bool drain_ends_before(const EngineDrainRecord *a, const EngineDrainRecord *b) {
        if (a->until != b->until)
                return a->until < b->until;
        int c = strcmp(a->pool, b->pool);
        if (c != 0)
                return c < 0;
        return strcmp(a->member ?: "", b->member ?: "") < 0;
}

/* Drains whose until has come are undrained at their until, earliest first (drain_ends_before()). */
static void drains_expire(Engine *e, usec_t t) {
        for (;;) {
                ssize_t k = -1;
                for (size_t i = 0; i < e->n_drains; i++)
                        if (e->drains[i].until <= t && (k < 0 || drain_ends_before(&e->drains[i], &e->drains[k])))
                                k = (ssize_t) i;
                if (k < 0)
                        return;
                EngineDrainRecord d = e->drains[k];
                Pool *p = pool_find(e->pools, e->n_pools, d.pool);
                if (p)
                        (void) p->ops->drain(p, d.member, false, d.until);
                drain_event(e, d.pool, d.member, false, &d, true, d.until);
                drain_record_remove(e, (size_t) k);
        }
}

int engine_drain_with(Engine *e, const char *pool, const char *member, const EngineDrain *d, usec_t now) {
        assert_return(e && pool, -EINVAL);
        assert_return(!d || d->since <= now, -EINVAL);
        if (d && d->until <= now)
                return -EINVAL;
        engine_advance(e, now);
        Pool *p = pool_find(e->pools, e->n_pools, pool);
        if (!p)
                return -ENOENT;
        ssize_t k = drain_find(e, pool, member);
        if (p->ops->drain_with) {
                /* The backend keeps it and ends it at its until (a wakeup of the pool, not a timer of this node);
                 * its DRAIN decision tells it. */
                int r = p->ops->drain_with(p, member, d, now);
                if (r < 0)
                        return r;
                if (k >= 0)
                        drain_record_remove(e, (size_t) k);
                mark_unsettled(e, now);
                process_decisions(e);
                return 0;
        }
        EngineDrainRecord rec = {};
        if (d) {
                bool oom = false;
                rec = (EngineDrainRecord) {
                        .pool = p->name,
                        .member = dup_or_null(member, &oom),
                        .since = d->since,
                        .until = d->until,
                        .until_realtime = d->until == USEC_INFINITY ? 0 : d->until_realtime,
                        .who = dup_or_null(d->who, &oom),
                        .reason = dup_or_null(d->reason, &oom),
                };
                EngineDrainRecord *a = oom ? NULL : reallocarray(e->drains, e->n_drains + 1, sizeof(EngineDrainRecord));
                if (!a) {
                        free(rec.member);
                        free(rec.who);
                        free(rec.reason);
                        return -ENOMEM;
                }
                e->drains = a;
        }
        int r = p->ops->drain(p, member, d != NULL, now);
        if (r < 0) {
                free(rec.member);
                free(rec.who);
                free(rec.reason);
                return r;
        }
        if (k >= 0)
                drain_record_remove(e, (size_t) k);
        if (d)
                e->drains[e->n_drains++] = rec;
        drain_event(e, p->name, member, d != NULL, d ? &rec : NULL, false, now);
        mark_unsettled(e, now);
        process_decisions(e);
        return 0;
}

size_t engine_drain_count(const Engine *e) {
        return e ? e->n_drains : 0;
}

int engine_drain_info(const Engine *e, size_t i, EngineDrainInfo *ret) {
        assert_return(e && ret, -EINVAL);
        if (i >= e->n_drains)
                return -ENOENT;
        const EngineDrainRecord *d = &e->drains[i];
        *ret = (EngineDrainInfo) {
                .pool = d->pool,
                .member = d->member,
                .since = d->since,
                .until = d->until,
                .until_realtime = d->until_realtime,
                .who = d->who,
                .reason = d->reason,
        };
        return 0;
}

int engine_drain(Engine *e, const char *pool, const char *member, bool on, usec_t now) {
        assert_return(e && pool, -EINVAL);
        engine_advance(e, now);
        Pool *p = pool_find(e->pools, e->n_pools, pool);
        if (!p)
                return -ENOENT;
        int r = p->ops->drain(p, member, on, now);
        if (r < 0)
                return r;
        /* A plain drain or undrain replaces what engine_drain_with() recorded: no reason, no until. */
        ssize_t k = drain_find(e, pool, member);
        if (k >= 0)
                drain_record_remove(e, (size_t) k);
        mark_unsettled(e, now);
        process_decisions(e);
        return 0;
}

int engine_pool_rest(Engine *e, const char *pool, const char *member, unsigned index, usec_t until, usec_t now) {
        assert_return(e && pool, -EINVAL);
        engine_advance(e, now);
        Pool *p = pool_find(e->pools, e->n_pools, pool);
        if (!p || !p->ops->rest)
                return -ENOENT;
        int r = p->ops->rest(p, member, index, until, now);
        if (r < 0)
                return r;
        mark_unsettled(e, now);
        process_decisions(e);
        return 0;
}

size_t engine_pool_count(const Engine *e) {
        return e ? e->n_pools : 0;
}

bool engine_pool_is_drained(const Engine *e, const char *pool) {
        const Pool *p = e ? pool_by_name(e, pool) : NULL;
        return p && p->drained;
}

int engine_pool_info(const Engine *e, size_t i, usec_t now, EnginePoolInfo *ret) {
        assert_return(e && ret, -EINVAL);
        if (i >= e->n_pools)
                return -ENOENT;
        const Pool *p = e->pools[i];
        PoolInfo info;
        p->ops->info(p, now, &info);
        *ret = (EnginePoolInfo) {
                .name = p->name,
                .limit = info.limit,
                .in_use = info.in_use,
                .waiting = info.waiting,
                .congested = info.congested,
                .drained = info.drained,
                .queue_timeout_set = info.queue_timeout_set,
                .queue_timeout = info.queue_timeout,
                .idle = info.idle,
                .next_token = info.next_token,
                .members = p->members,
                .drained_members = info.drained_members,
                .remote = info.remote,
                .backend_up = info.backend_up,
                .unavailable = info.unavailable,
                .differing_keys = info.differing_keys,
                .rtt = info.rtt,
                .n_nodes = info.n_nodes,
                .all_in_use = info.all_in_use,
                .all_waiting = info.all_waiting,
                .agreed_limit = info.remote ? info.agreed_limit : 0,
                .min_replicas = info.min_replicas,
                .replicas_acked = info.remote ? info.replicas_acked : -1,
                .life = info.life,
                .n_life = info.n_life,
                .bad_input = info.remote ? info.bad_input : 0,
                .resting = info.resting,
                .n_resting = info.n_resting,
                .cooldown = info.cooldown,
                .drains = info.drains,
                .n_drains = info.n_drains,
        };
        return 0;
}

int engine_pool_snapshot(const Engine *e, size_t i, PoolSnapshot *ret) {
        assert_return(e && ret, -EINVAL);
        if (i >= e->n_pools)
                return -ENOENT;
        const Pool *p = e->pools[i];
        if (!p->ops->snapshot)
                return -EOPNOTSUPP;
        return p->ops->snapshot(p, ret);
}

int engine_pool_refresh_snapshot(Engine *e, size_t i, usec_t since, usec_t now) {
        assert_return(e, -EINVAL);
        if (i >= e->n_pools)
                return -ENOENT;
        Pool *p = e->pools[i];
        return p->ops->refresh_snapshot ? p->ops->refresh_snapshot(p, since, now) : 0;
}

/* ---- configuration ---- */

static EngineLane *engine_lane_free(EngineLane *l) {
        if (!l)
                return NULL;
        free(l->pools);
        free(l->most);
        free(l->also);
        free(l->also_slots);
        free(l->also_most);
        strv_free(l->labels);
        return mfree(l);
}

static void lanes_free(EngineLane **lanes, size_t n) {
        for (size_t i = 0; i < n; i++)
                engine_lane_free(lanes[i]);
        free(lanes);
}

static int lanes_build(Engine *e, const BrokerConfig *c, Pool **pools, size_t n_pools, EngineLane ***ret) {
        EngineLane **lanes = calloc(MAX(c->n_lanes, 1u), sizeof(EngineLane *));
        if (!lanes)
                return -ENOMEM;
        for (size_t i = 0; i < c->n_lanes; i++) {
                const LaneConfig *lc = c->lanes[i];
                EngineLane *l = calloc(1, sizeof(EngineLane));
                if (!l)
                        goto oom;
                lanes[i] = l;
                *l = (EngineLane) {
                        .policy = lc->policy,
                        .priority = lc->priority,
                        .queue_timeout_set = lc->queue_timeout_set,
                        .queue_timeout = lc->queue_timeout,
                        .client_wait_ignore = lc->client_wait_ignore,
                        .max_hold = lc->max_hold,
                };
                l->name = engine_intern(e, lc->name);
                l->pools = calloc(MAX(lc->n_pools, 1u), sizeof(Pool *));
                l->most = calloc(MAX(lc->n_pools, 1u), sizeof(unsigned));
                if (!l->name || !l->pools || !l->most)
                        goto oom;
                if (lc->labels && !(l->labels = strv_copy(lc->labels)))
                        goto oom;
                for (size_t k = 0; k < lc->n_pools; k++) {
                        Pool *p = pool_find(pools, n_pools, lc->pools[k]);
                        if (!p) {
                                lanes_free(lanes, c->n_lanes);
                                return -EINVAL; /* conf_validate() lets no such config through */
                        }
                        l->most[l->n_pools] = conf_lane_most(c, lc, lc->pools[k]);
                        l->pools[l->n_pools++] = p;
                }
                if (lc->n_also > CONF_LANE_ALSO_MAX) {
                        lanes_free(lanes, c->n_lanes);
                        return -EINVAL; /* conf_set() lets no more through; sets_settle() counts on it */
                }
                if (lc->n_also > 0) {
                        l->also = calloc(lc->n_also, sizeof(Pool *));
                        l->also_slots = calloc(lc->n_also, sizeof(unsigned));
                        l->also_most = calloc(lc->n_also, sizeof(unsigned));
                        if (!l->also || !l->also_slots || !l->also_most)
                                goto oom;
                }
                for (size_t k = 0; k < lc->n_also; k++) {
                        Pool *p = pool_find(pools, n_pools, lc->also[k].pool);
                        /* conf_validate() lets none through that is missing, or mixes kinds of pool */
                        if (!p || !pool_takes_sets(p)) {
                                lanes_free(lanes, c->n_lanes);
                                return -EINVAL;
                        }
                        l->also[l->n_also] = p;
                        l->also_most[l->n_also] = conf_lane_most(c, lc, lc->also[k].pool);
                        l->also_slots[l->n_also++] = lc->also[k].slots;
                }
                for (size_t k = 0; k < l->n_pools && l->n_also > 0; k++)
                        if (!pool_takes_sets(l->pools[k])) {
                                lanes_free(lanes, c->n_lanes);
                                return -EINVAL;
                        }
        }
        *ret = lanes;
        return 0;
oom:
        lanes_free(lanes, c->n_lanes);
        return -ENOMEM;
}

/* The rules of every lane that routes to pool `name`, or takes slots of it with every grant (also=: its
 * reserve= is for the pools it routes to). */
static size_t rules_for_pool(const BrokerConfig *c, const PoolConfig *pc, PoolLaneRule *rules) {
        const char *name = pc->name;
        size_t n = 0;
        for (size_t i = 0; i < c->n_lanes; i++) {
                const LaneConfig *lc = c->lanes[i];
                bool routed = false;
                for (size_t k = 0; k < lc->n_pools; k++)
                        if (streq(lc->pools[k], name)) {
                                routed = true;
                                rules[n++] = (PoolLaneRule) {
                                        .lane = lc->name,
                                        .priority = lc->priority,
                                        .max_in_use = lc->max_in_use,
                                        .reserve = lc->reserve,
                                        .budget_set = lc->queue_timeout_set,
                                        .budget = lc->queue_timeout,
                                        .health = lc->health,
                                        .health_also = lc->health_also,
                                        .labels = lc->labels,
                                };
                                break;
                        }
                for (size_t k = 0; k < lc->n_also && !routed; k++)
                        if (streq(lc->also[k].pool, name)) {
                                rules[n++] = (PoolLaneRule) {
                                        .lane = lc->name,
                                        .priority = lc->priority,
                                        .max_in_use = lc->max_in_use,
                                        .budget_set = lc->queue_timeout_set,
                                        .budget = lc->queue_timeout,
                                };
                                break;
                        }
        }
        /* Reservations (SPEC §3.6): first in the queue, no limit, no budget. A shared pool's canon leaves this
         * lane out (every node's scripts have it: canon_build()). */
        rules[n++] = (PoolLaneRule) {
                .lane = ENGINE_RESERVE_LANE,
                .priority = INT_MAX,
                .max_in_use = -1,
                .budget_set = true,
                .budget = USEC_INFINITY,
        };
        return n;
}

/* Two objects of one shared pool on one node would act as one node twice on the same keys (each heartbeat
 * reconciling away the other's records) if the old and the new backend= were the same Redis under two
 * names: a pool kept by a backend moves to another backend or credentials only while this node holds,
 * awaits and owes nothing in it. A move to or from a pool without backend= is always applied. */
int engine_check_moves(Engine *e, const BrokerConfig *c, EngineMoveRefusal *ret) {
        assert_return(e && c, -EINVAL);
        Pool *const *lists[] = { e->pools, e->retired };
        size_t sizes[] = { e->n_pools, e->n_retired };
        for (size_t i = 0; i < c->n_pools; i++) {
                const PoolConfig *pc = c->pools[i];
                _cleanup_free_ char *identity = NULL;
                int r = pool_identity(pc, &identity);
                if (r < 0)
                        return r;
                if (!identity)
                        continue;
                for (size_t k = 0; k < ELEMENTSOF(lists); k++)
                        for (size_t j = 0; j < sizes[k]; j++) {
                                Pool *p = lists[k][j];
                                if (!p->identity || !streq(p->name, pc->name) || streq(p->identity, identity))
                                        continue;
                                PoolInfo info;
                                p->ops->info(p, 0, &info);
                                if (info.in_use == 0 && info.waiting == 0 && !info.owes)
                                        continue;
                                if (ret)
                                        *ret = (EngineMoveRefusal) {
                                                .pool = pc,
                                                .in_use = info.in_use,
                                                .waiting = info.waiting,
                                                .owes = info.owes,
                                        };
                                return -EBUSY;
                        }
        }
        return 0;
}

/* An in-process pool's drains made what the engine records for its name. A pool revived from the retired list
 * keeps those it had when it went, and a record may have gone meanwhile: its until came while the pool was
 * away ([UNDRAINED] was told, drains_expire() found no pool to undrain), or brokerd took it to members.state
 * when the pool moved to a backend, to apply it again only if it still holds. One of a member the pool does not
 * have now stays a record only, as engine_drain_with() refuses such a member; a member the pool had drained and
 * does not have now stays as it was (a pool's drained members outlive reloads). *ret_members is the caller's
 * to free. Returns 0, -ENOMEM. */
static int pool_drains_from_records(Engine *e, const Pool *p, const PoolConfig *pc, usec_t now,
                                    bool *ret_drained, char ***ret_members) {
        PoolInfo info;
        p->ops->info(p, now, &info);
        size_t n = strv_length(info.drained_members);
        for (size_t k = 0; k < e->n_drains; k++)
                n += streq(e->drains[k].pool, p->name) && e->drains[k].member;
        _cleanup_(strv_freep) char **members = calloc(n + 1, sizeof(char *));
        if (!members)
                return -ENOMEM;
        size_t j = 0;
        for (char *const *m = info.drained_members; m && *m; m++)
                if (drain_find(e, p->name, *m) >= 0 || !strv_contains(pc->members, *m))
                        if (!(members[j++] = strdup(*m)))
                                return -ENOMEM;
        for (size_t k = 0; k < e->n_drains; k++) {
                const char *m = e->drains[k].member;
                if (!streq(e->drains[k].pool, p->name) || !m || !strv_contains(pc->members, m) ||
                    strv_contains(members, m))
                        continue;
                if (!(members[j++] = strdup(m)))
                        return -ENOMEM;
        }
        *ret_drained = drain_find(e, p->name, NULL) >= 0;
        *ret_members = TAKE_PTR(members);
        return 0;
}

/* What one pool of a reload has prepared (PoolOps.configure_prepare()), and the drains it takes. */
typedef struct ReloadPool {
        PoolStaged *staged;
        PoolLaneRule *rules;
        PoolDrains drains;
        char **drained_members;
        bool arrives;            /* new to the configuration: made anew, or revived from the retired list */
} ReloadPool;

static void reload_pools_free(ReloadPool *rp, Pool **pools, size_t n) {
        if (!rp)
                return;
        for (size_t i = 0; i < n; i++) {
                if (rp[i].staged)
                        pools[i]->ops->configure_abort(pools[i], rp[i].staged);
                free(rp[i].rules);
                strv_free(rp[i].drained_members);
        }
        free(rp);
}

/* Room in the engine's queues for what applying a reload tells: every waiter of the pools it touches refused
 * once, each pool's gauge changing, and the events they make. Pushes up to that count cannot fail (ring.h), so
 * that after the first commit nothing fails. Returns 0, -ENOMEM (the queues grew, nothing else changed). */
static int reload_reserve(Engine *e, Pool *const *pools, size_t n) {
        size_t room = 0;
        Pool *const *lists[] = { e->pools, pools };
        size_t sizes[] = { e->n_pools, n };
        for (size_t k = 0; k < ELEMENTSOF(lists); k++)
                for (size_t i = 0; i < sizes[k]; i++) {
                        PoolInfo info;
                        lists[k][i]->ops->info(lists[k][i], 0, &info);
                        room += info.waiting + 2;
                }
        int r = ring_reserve(&e->pending, e->pending.n + room);
        if (r < 0)
                return r;
        return ring_reserve(&e->events, e->events.n + 2 * room);
}

int engine_configure(Engine *e, const BrokerConfig *c, usec_t now) {
        assert_return(e && c, -EINVAL);
        engine_advance(e, now);

        _cleanup_free_ Pool **pools = calloc(MAX(c->n_pools, 1u), sizeof(Pool *));
        _cleanup_free_ bool *created = calloc(MAX(c->n_pools, 1u), sizeof(bool));
        ReloadPool *rp = calloc(MAX(c->n_pools, 1u), sizeof(ReloadPool));
        EngineLane **lanes = NULL;
        int r;

        if (!pools || !created || !rp) {
                free(rp);
                return -ENOMEM;
        }

        r = engine_check_moves(e, c, NULL);
        if (r < 0)
                goto fail;

        /* A reload applies to every pool or to none (SPEC §4): first what can fail — find or make every pool,
         * build the lanes, prepare each pool's configuration —, and only then apply it all. A pool is found by
         * its name where it is kept: one whose backend= (or credentials) changed is another object, and the old
         * one is retired below, its holders accounted where they were granted (SPEC §11). */
        for (size_t i = 0; i < c->n_pools; i++) {
                const PoolConfig *pc = c->pools[i];
                if (pc->limit == 0)
                        goto invalid;
                _cleanup_free_ char *identity = NULL;
                r = pool_identity(pc, &identity);
                if (r < 0)
                        goto fail;
                pools[i] = pool_find_kept(e->pools, e->n_pools, pc->name, identity);
                if (!pools[i])
                        /* A pool removed earlier and still draining comes back as itself: its holders count. */
                        pools[i] = pool_find_kept(e->retired, e->n_retired, pc->name, identity);
                if (!pools[i]) {
                        r = pool_new_for(e, pc, pc->name, &pools[i]);
                        if (r < 0)
                                goto fail;
                        created[i] = true;
                }
        }
        r = lanes_build(e, c, pools, c->n_pools, &lanes);
        if (r < 0)
                goto fail;

        Pool **retired = reallocarray(e->retired, e->n_retired + e->n_pools + 1, sizeof(Pool *));
        if (!retired) {
                r = -ENOMEM;
                goto fail;
        }
        e->retired = retired;

        r = reload_reserve(e, pools, c->n_pools);
        if (r < 0)
                goto fail;

        /* The drains recorded for the name of a pool new to the configuration: made anew, or revived from the
         * retired list (a lease held it while it was away, removed or on the other side of a move):
         * - an in-process one (removed by an earlier reload, or back from a backend) obeys them: they are what
         *   Status shows and what members.state keeps, and they survive reloads (SPEC §3.6). A revived one's own
         *   drains are of before it went, and are replaced (pool_drains_from_records());
         * - one on a backend obeys the drains its backend keeps (drain_with()), the fleet's: the records of its
         *   in-process days, or of the in-process pool that stood for its name while it was retired, are not its
         *   own, and one ending at its until would undrain in Redis what another node drained there. They go
         *   (brokerd keeps them for a move back: manager.c, member_state_leaving()), once the reload applies. */
        for (size_t i = 0; i < c->n_pools; i++) {
                rp[i].rules = calloc(c->n_lanes + 1, sizeof(PoolLaneRule)); /* + reservations */
                if (!rp[i].rules) {
                        r = -ENOMEM;
                        goto fail;
                }
                size_t n_rules = rules_for_pool(c, c->pools[i], rp[i].rules);
                rp[i].arrives = created[i] || !pool_in(e->pools, e->n_pools, pools[i]);
                if (rp[i].arrives && !pools[i]->ops->drain_with) {
                        r = pool_drains_from_records(e, pools[i], c->pools[i], now, &rp[i].drains.drained,
                                                     &rp[i].drained_members);
                        if (r < 0)
                                goto fail;
                        rp[i].drains.members = rp[i].drained_members;
                }
                r = pools[i]->ops->configure_prepare(pools[i], c->pools[i], rp[i].rules, n_rules,
                                                     rp[i].drained_members ? &rp[i].drains : NULL, now,
                                                     &rp[i].staged);
                if (r < 0)
                        goto fail;
        }

        /* From here on nothing fails. */
        size_t configure_from = e->pending.n;
        for (size_t i = 0; i < c->n_pools; i++) {
                pools[i]->ops->configure_commit(pools[i], TAKE_PTR(rp[i].staged), now);
                pools[i]->retired = false;
                if (!rp[i].arrives || !pools[i]->ops->drain_with)
                        continue;
                for (size_t k = 0; k < e->n_drains;)
                        if (streq(e->drains[k].pool, pools[i]->name))
                                drain_record_remove(e, k);
                        else
                                k++;
        }
        reload_pools_free(rp, pools, c->n_pools);

        /* Pools that are gone, or moved: waiters refused, holders finish (a shared pool keeps heartbeating
         * them, and releases them in Redis). Their refusals go ahead of what the pools that stay decided in
         * configure_commit() (a removed lane's waiters refused): a shared pool retires at once and tells its
         * commit's through Redis, later; so an in-process one's are in the same order, and a set (also=)
         * refused by both names the pool removed either way. */
        size_t retire_from = e->pending.n;
        for (size_t i = 0; i < e->n_pools; i++)
                if (!pool_in(pools, c->n_pools, e->pools[i])) {
                        e->pools[i]->ops->retire(e->pools[i], now);
                        e->retired[e->n_retired++] = e->pools[i];
                }
        ring_rotate(&e->pending, configure_from, retire_from);
        /* Pools revived from the retired list leave it. */
        size_t j = 0;
        for (size_t i = 0; i < e->n_retired; i++)
                if (!pool_in(pools, c->n_pools, e->retired[i]))
                        e->retired[j++] = e->retired[i];
        e->n_retired = j;

        free(e->pools);
        e->pools = TAKE_PTR(pools);
        e->n_pools = c->n_pools;
        lanes_free(e->lanes, e->n_lanes);
        e->lanes = lanes;
        e->n_lanes = c->n_lanes;

        mark_unsettled(e, now);
        process_decisions(e);
        refuse_changed_lanes(e, now);
        retired_gc(e);
        return 0;

invalid:
        r = -EINVAL;
fail:
        /* Staged configurations go before the pools made for them. */
        reload_pools_free(rp, pools, c->n_pools);
        for (size_t i = 0; i < c->n_pools; i++)
                if (created[i] && pools[i])
                        pool_destroy(pools[i]);
        if (lanes)
                lanes_free(lanes, c->n_lanes);
        return r;
}

/* ---- lifecycle ---- */

int engine_new(EngineRandomFn random, void *random_userdata, Engine **ret) {
        assert_return(random, -EINVAL);
        assert_return(ret, -EINVAL);

        Engine *e = calloc(1, sizeof(Engine));
        if (!e)
                return -ENOMEM;
        e->random = random;
        e->random_userdata = random_userdata;
        list_init(&e->leases);
        list_init(&e->requests);
        list_init(&e->sets);
        heap_init(&e->expiries);
        e->pending = RING_INIT(PoolDecision);
        e->events = RING_INIT(EngineEvent);
        *ret = e;
        return 0;
}

Engine *engine_free(Engine *e) {
        if (!e)
                return NULL;
        /* Requests not decided lose the engine's reference; the caller's stays valid for unref. */
        ListNode *n;
        while ((n = list_first(&e->requests))) {
                EngineRequest *r = container_of(n, EngineRequest, node);
                r->engine = NULL;
                request_finish(r);
        }
        while ((n = list_first(&e->leases))) {
                EngineLease *l = container_of(n, EngineLease, node);
                l->pool->ops->release(l->pool, l->grant, 0);
                for (size_t i = 0; i < l->n_also; i++)
                        l->also[i].pool->ops->release(l->also[i].pool, l->also[i].grant, 0);
                list_unlink(n);
                engine_lease_free(l);
        }
        for (size_t i = 0; i < e->n_pools; i++)
                pool_destroy(e->pools[i]);
        for (size_t i = 0; i < e->n_retired; i++)
                pool_destroy(e->retired[i]);
        free(e->pools);
        free(e->retired);
        free(e->floors);
        lanes_free(e->lanes, e->n_lanes);
        heap_done(&e->expiries);
        ring_done(&e->pending);
        for (size_t i = 0; i < e->events.n; i++) {
                EngineEvent *ev = ring_at(&e->events, i);
                if (ev->type == ENGINE_EVENT_MEMBER || ev->type == ENGINE_EVENT_DRAIN) {
                        free((char *) ev->member);
                        free((char *) ev->job);
                        free((char *) ev->note);
                }
        }
        popped_free(e);
        for (size_t i = 0; i < e->n_drains; i++) {
                free(e->drains[i].member);
                free(e->drains[i].who);
                free(e->drains[i].reason);
        }
        free(e->drains);
        ring_done(&e->events);
        for (size_t i = 0; i < e->n_names; i++)
                free(e->names[i]);
        free(e->names);
        return mfree(e);
}
