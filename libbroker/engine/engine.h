/* SPDX-License-Identifier: MIT */
/* engine.h — the admission engine: lanes route requests to pools, pools grant, queue and refuse, and
 * every outcome comes back as an event. Pure: no I/O, no clock of its own (`now`, monotonic µs, is
 * passed in), randomness injected. The daemon and the simulator drive this same code.
 *
 * Same-instant order (SPEC §3.3): within one `now`, apply lease ends (engine_lease_release,
 * engine_request_cancel), then arrivals (engine_acquire: granted at once if there is room, else refused or
 * queued), then call engine_run(now), which grants freed slots in queue order and then refuses waiters
 * whose budget ends at `now`. Calling any entry point with a later `now` first settles every earlier
 * instant at its own time, so a late caller never turns an expired waiter into a grant. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conf.h"
#include "macro.h"
#include "time-util.h"

typedef struct Engine Engine;
typedef struct EngineRequest EngineRequest;
typedef struct EngineLease EngineLease;

/* pool.h: what the engine routes to, and what a pool factory makes. */
typedef struct Pool Pool;
typedef struct PoolDecision PoolDecision;
typedef struct PoolSnapshot PoolSnapshot;
typedef void (*PoolEmitFn)(const PoolDecision *d, void *userdata);

typedef enum Refusal {
        REFUSAL_BUSY,        /* no room, and the lane or client would not wait */
        REFUSAL_FULL,        /* the queue is at max-queue */
        REFUSAL_TIMEOUT,     /* a keeping-up, lane or client budget ran out */
        REFUSAL_SHED,        /* the saturated budget ran out */
        REFUSAL_UNAVAILABLE, /* the pool was drained or removed */
        _REFUSAL_MAX,
        _REFUSAL_INVALID = -EINVAL,
} Refusal;

typedef enum QueueState {
        QUEUE_STATE_NONE,        /* not queued, or queued on a pool without queue-timeout */
        QUEUE_STATE_KEEPING_UP,
        QUEUE_STATE_SATURATED,
        _QUEUE_STATE_MAX,
        _QUEUE_STATE_INVALID = -EINVAL,
} QueueState;

typedef enum EngineEventType {
        ENGINE_EVENT_QUEUED,     /* the request waits; not final */
        ENGINE_EVENT_GRANTED,    /* final: the request became a lease */
        ENGINE_EVENT_REFUSED,    /* final */
        ENGINE_EVENT_REVOKE,     /* a lease reached max-hold, or its pool lost it (a set's: any pool of it, named in
                                  * .pool, SPEC §3.5); it holds its slots until released */
        ENGINE_EVENT_CONGESTION, /* a pool's congested gauge changed */
        ENGINE_EVENT_MEMBER,     /* a member was quarantined or restored (SPEC §3.6) */
        ENGINE_EVENT_DRAIN,      /* a pool or member was drained with engine_drain_with(), or undrained (SPEC §3.6) */
        _ENGINE_EVENT_TYPE_MAX,
        _ENGINE_EVENT_TYPE_INVALID = -EINVAL,
} EngineEventType;

typedef struct EngineEvent {
        EngineEventType type;
        usec_t at;                /* when it happened: a budget's end, not the later `now` that ran it */
        void *userdata;           /* the request's, or the lease's for REVOKE */
        EngineRequest *request;   /* QUEUED, GRANTED, REFUSED: compare only; see engine_request_unref() */
        EngineLease *lease;       /* GRANTED, REVOKE */
        const char *pool;         /* pool and lane names live as long as the engine */
        const char *lane;
        usec_t arrival;
        usec_t wait;              /* GRANTED, REFUSED: at − arrival */
        QueueState state;         /* as decided when the request joined the queue */
        usec_t idle;              /* likewise: now − last fast admission, on a pool with queue-timeout */
        usec_t budget;            /* likewise; USEC_INFINITY: unbounded */
        bool queued;              /* the request waited in a queue (state/idle/budget are meaningful) */
        Refusal refusal;          /* REFUSED */
        unsigned retry_after_sec; /* REFUSED */
        bool congested;           /* CONGESTION */
        bool lost;                /* REVOKE: its pool lost it (the slots may soon be another node's), not its
                                   * max-hold; may follow a max-hold REVOKE of the same lease */
        /* REFUSED unavailable: the pool's word for why ("backend", "rules", "recovery"), NULL when it gave
         * none (drained or removed); REVOKE: "max-hold", or the pool's ("node-expired", "reclaim-conflict",
         * "fenced", …). Static. */
        const char *reason;
        /* MEMBER: which member, now quarantined or not; the job whose lease's end did it, or who did it by
         * hand; the exit status that did it (-1: none, by hand or a restore by hand); the reason given by
         * hand (NULL: none). The strings stay valid until the next engine_pop_event() or engine_free(). */
        const char *member;
        bool quarantined;
        const char *job;
        int exit_status;
        const char *note;
        /* MEMBER: told by an in-process pool that a reload removed or moved to a backend and a lease still
         * holds (its end's exit status did it): the pool goes with that lease, and the member's life with it. */
        bool retired;
        /* DRAIN: pool, member (NULL: the whole pool), whether it is drained now, who (job) and why (note), its
         * deadline (USEC_INFINITY: none) and the realtime instant it was given as (0: none, see EngineDrain); an
         * undrain by its deadline has job NULL and `expired` set. */
        bool drained;
        usec_t until;
        usec_t until_realtime;
        bool expired;
} EngineEvent;

/* A uniformly distributed 64-bit value; the daemon uses getrandom(), the simulator a seeded generator. */
typedef uint64_t (*EngineRandomFn)(void *userdata);

int engine_new(EngineRandomFn random, void *random_userdata, Engine **ret);
/* Frees pools, requests and leases; handles the caller still holds become invalid. */
Engine *engine_free(Engine *e);
DEFINE_TRIVIAL_CLEANUP_FUNC(Engine *, engine_free);

/* Makes the pool object for a configured pool with a backend (pc->backend set), named `name` (valid as long
 * as the pool), sending its decisions to emit(d, emit_userdata). Returns 0 or negative errno, which
 * engine_configure() returns (-EOPNOTSUPP: built without Redis). */
typedef int (*EnginePoolFactoryFn)(const PoolConfig *pc, const char *name, PoolEmitFn emit, void *emit_userdata,
                                   void *userdata, Pool **ret);
/* Without a factory a pool with a backend is refused (-EOPNOTSUPP). */
void engine_set_pool_factory(Engine *e, EnginePoolFactoryFn factory, void *userdata);
/* A factory that simulates a pool with a backend in-process: its rules, not its sharing (slotctl simulate). */
int engine_pool_factory_local(const PoolConfig *pc, const char *name, PoolEmitFn emit, void *emit_userdata,
                              void *userdata, Pool **ret);

/* The first configuration and every reload (SPEC §4): pools are matched by name (and by where they are
 * kept: engine_check_moves()) and keep their holders,
 * waiters and idle time; a held member keeps its holder wherever the new list puts it, and one removed
 * while held stays held above the limit until released; a shrunk pool lets its holders finish; a removed
 * pool refuses its waiters (unavailable; in the order they came, whatever their lane) and lives on until its
 * last lease ends, or comes back with its holders if a later reload names it again; waiters of a removed lane
 * are refused likewise, after those of the removed pools (the order a shared pool, which learns of its removed
 * lanes through Redis, has too).
 * The config must have passed conf_validate(). It applies to every pool and lane or to none: everything that
 * can fail (out of memory included) is done before any pool takes the new configuration. Returns 0, or negative
 * errno with every pool, lane, drain, holder and waiter as it was and nothing told of the reload (the instants
 * before `now` are settled first, as by any call). */
int engine_configure(Engine *e, const BrokerConfig *c, usec_t now);

/* A pool kept by a backend whose backend=, backend-user=, backend-password-file= or
 * backend-sentinel-password-file= a reload changes moves to a new pool object only while this node holds,
 * awaits and owes nothing in the old one: the old and the new backend may be one Redis under two names,
 * and two objects of one pool there would act as one node twice. A move from or to a pool without
 * backend= is always applied: the old object keeps its holders (and, if shared, heartbeats them and
 * releases them in Redis) and new requests go to the new one; each side's holders stay within the limit
 * under which they were granted. */
typedef struct EngineMoveRefusal {
        const PoolConfig *pool;   /* the new configuration's */
        unsigned in_use;          /* slots this node holds in the old object */
        size_t waiting;
        bool owes;                /* releases or withdrawals Redis has not confirmed yet */
} EngineMoveRefusal;
/* Returns 0, or -EBUSY with *ret (may be NULL) naming the first pool that cannot move now, which
 * engine_configure() refuses likewise; -ENOMEM. */
int engine_check_moves(Engine *e, const BrokerConfig *c, EngineMoveRefusal *ret);

/* A waiter handed over by the previous brokerd through systemd's fd store (SPEC §3.4, "A restart loses no
 * waiter"). It goes back to the pool it waited in, behind the waiters resumed before it (resume them in
 * their old queue order: priority, then arrival), with its arrival and the budget it got when it first
 * joined that queue: its deadline stays arrival + budget, so a restart moves it by nothing. A resumed waiter
 * is granted at once only if a fresh request would be (room, and nobody ahead); max-queue does not refuse it
 * (it was admitted before). A budget that ended before `now` refuses it at once (timeout/shed, at its
 * deadline), room or not: never granted after it ended (SPEC §3.3), also when the slot it waited for was
 * freed while no daemon ran; a pool kept by a backend goes by what the backend did with it meanwhile
 * (granted before its deadline, or refused at it). When its pool is gone from the lane, or drained, the
 * request is routed as a fresh one (its arrival kept). A waiter of an all-or-nothing set (also=) goes back
 * into every pool of its set, behind those resumed before it in each, each part with the set's budget (the
 * smallest, which the request had): its deadline is kept, and a refusal at it names the chosen pool. Times
 * are monotonic µs of the same boot. */
typedef struct EngineResume {
        const char *pool;         /* where it waited: engine_request_pool() */
        usec_t arrival;           /* engine_request_arrival() */
        QueueState state;         /* engine_request_state() */
        usec_t idle;              /* engine_request_idle() */
        usec_t budget;            /* engine_request_budget(); USEC_INFINITY: unbounded */
        /* A pool kept by a backend: its name for the waiter (engine_request_remote_id()), so that the pool
         * finds the waiter it kept in Redis at its place; NULL: none (the pool queues it afresh). Untrusted:
         * one malformed or already in use is not sent (the waiter queues afresh, at the end). A shared pool
         * must get its resumed waiters before it first reaches Redis (resume before the event loop runs):
         * its first tick's reconcile drops the waiters of this node it does not list. Until it is served it
         * keeps them for the waiter grace at most (5 s; then refused unavailable "backend"). */
        const char *remote_id;
        /* engine_request_lane_rules() of the request as it waited: a lane whose labels= or also= changed across
         * the restart refuses it (unavailable, "reload"), as a reload does. NULL: not known (taken as the same). */
        const char *lane_rules;
} EngineResume;

typedef struct EngineAcquire {
        const char *lane;
        unsigned slots;           /* ≥ 1 */
        bool no_wait;             /* the client's wait:false */
        usec_t max_wait;          /* the client's queueWaitMs; USEC_INFINITY: none */
        usec_t max_hold;          /* the client's cap on the hold, below the lane's max-hold; 0 or USEC_INFINITY: none */
        void *userdata;
        const EngineResume *resume; /* NULL: a new request, arriving now */
        /* Narrows the lane's labels (SPEC §3.5): "L" or "!L" each, NULL-terminated, or NULL; and a named
         * member, or NULL. A pool whose members cannot satisfy them is skipped like one too small. */
        const char *const *labels;
        const char *member;
        /* A reservation for people (SPEC §3.6): taken in this pool (not kept by a backend) under the lane
         * ENGINE_RESERVE_LANE, ahead of every waiting job (priority INT_MAX), waiting as long as it takes;
         * `lane` is then ignored. NULL: an ordinary request of `lane`. */
        const char *reserve_pool;
} EngineAcquire;

/* The lane a reservation's request and lease are of: no configured lane can be named so. */
#define ENGINE_RESERVE_LANE "@reserve"

/* Routes a request: the first of the lane's pools with room grants it; otherwise a fail-fast lane
 * refuses, a waiting lane queues on its last pool. A lane with also= (SPEC §3.5) does the same with the
 * lane's pool and every also= pool together: granted when all have room at once (one lease, a token per pool:
 * engine_lease_also()), else refused naming a pool that had none, or queued in all of them (holding none)
 * until each is ready for it; a refusal while it waits (a budget, a drain, a removal) names its pool. The outcome arrives as events (perhaps already
 * queued when this returns). Returns 0 and a reference to the request, -ENOENT for an unknown lane,
 * -EINVAL when no pool of the lane has `slots` slots its labels and member allow (or they are not valid),
 * -ENOMEM. */
int engine_acquire(Engine *e, const EngineAcquire *a, usec_t now, EngineRequest **ret);
/* A reservation (EngineAcquire.reserve_pool) returns -ENOENT for an unknown pool and -EOPNOTSUPP for a pool
 * kept by a backend. */

/* The client went away while waiting, or before a pool that decides later has decided: the request leaves
 * its queue (or is forgotten) without an answer. A decision that came in before is handled first: its event
 * follows as usual. */
void engine_request_cancel(EngineRequest *r, usec_t now);
/* Requests are shared between the caller and the engine; drop the caller's reference when done. */
EngineRequest *engine_request_unref(EngineRequest *r);
/* What the request's events carry as userdata from now on (NULL: nobody's; engine_acquire() set it). */
void engine_request_set_userdata(EngineRequest *r, void *userdata);
DEFINE_TRIVIAL_CLEANUP_FUNC(EngineRequest *, engine_request_unref);
bool engine_request_is_waiting(const EngineRequest *r);
/* Submitted to a pool that decides later, which has not answered yet: engine_request_cancel() forgets it. */
bool engine_request_is_in_flight(const EngineRequest *r);
/* The request's 0-based place in its queue and the queue's length. Returns 0, or -ESTALE if it is not waiting. */
int engine_request_position(const EngineRequest *r, size_t *ret_position, size_t *ret_queued);
usec_t engine_request_arrival(const EngineRequest *r);
/* The budget the request got when it joined its queue; USEC_INFINITY when unbounded or not queued. */
usec_t engine_request_budget(const EngineRequest *r);
/* How its pool fared when it joined the queue (QUEUE_STATE_NONE: not queued, or a pool without queue-timeout). */
QueueState engine_request_state(const EngineRequest *r);
/* The pool's idle time when it joined the queue (0 when not queued). */
usec_t engine_request_idle(const EngineRequest *r);
const char *engine_request_pool(const EngineRequest *r);
/* An all-or-nothing request (a lane with also=, SPEC §3.5): the further pools it waits in beside
 * engine_request_pool() (0 for others, or once it is decided), and the i-th's name (NULL out of range). Its
 * position (engine_request_position()) is the furthest of its places, its budget the smallest. */
size_t engine_request_also_count(const EngineRequest *r);
const char *engine_request_also_pool(const EngineRequest *r, size_t i);
/* The slots it waits for in the i-th further pool (its also= K; 0 out of range). */
unsigned engine_request_also_slots(const EngineRequest *r, size_t i);
/* A waiting request's name in the backend of its pool (a shared pool's rid; a set's, the one its parts wait
 * under in every pool), or NULL (an in-process pool, or not waiting). Valid until the request's next event. */
const char *engine_request_remote_id(const EngineRequest *r);
/* Its lane's labels= and also= (pools and K) as it took them when it arrived, as one text (the order the lane
 * lists them in does not matter); for a handover (EngineResume.lane_rules). Returns 0, -ENOMEM. */
int engine_request_lane_rules(const EngineRequest *r, char **ret);

/* A pool's controlled-delay clock (SPEC §3.1): the last instant it admitted fast (monotonic µs), carried
 * across a restart with the waiters so that their budgets and the congested gauge go on as before (set it
 * after engine_configure(), which starts a new pool's clock at `now`). The gauge follows at once; its
 * CONGESTION event is the new engine's first. Return 0, -ENOENT (no such configured pool), -EINVAL
 * (last_fast after now), or -EOPNOTSUPP (a pool kept by a backend: Redis keeps its clock). */
int engine_pool_get_last_fast(const Engine *e, const char *pool, usec_t *ret);
int engine_pool_set_last_fast(Engine *e, const char *pool, usec_t last_fast, usec_t now);

/* Settles the instant `now` (grants, then expiries, then gauges, then max-hold revocations). */
void engine_run(Engine *e, usec_t now);
/* When engine_run() next has work of its own; USEC_INFINITY if never. */
usec_t engine_next_wakeup(const Engine *e);
/* Handles the decisions pools sent outside an engine call (a remote pool's answers): their events follow.
 * Every entry point above does this first; a driver that waited for answers and wants their events without
 * settling an instant calls this. An all-or-nothing set that every pool of it now says is ready is granted
 * (asked of its pools) at the instant the last said so, unless a command opened that instant and engine_run()
 * has not settled it yet: then engine_run() grants it, after the instant's arrivals (SPEC §3.3). */
void engine_take_decisions(Engine *e);
/* Takes the oldest pending event. Returns true if there was one. */
bool engine_pop_event(Engine *e, EngineEvent *ret);

/* Leases: owned by the engine from the grant until engine_lease_release(); no event names a lease after it
 * (a REVOKE that the release call itself settled is dropped). */
void engine_lease_release(EngineLease *l, usec_t now);
void *engine_lease_get_userdata(const EngineLease *l);
void engine_lease_set_userdata(EngineLease *l, void *userdata);
const char *engine_lease_pool(const EngineLease *l);
const char *engine_lease_lane(const EngineLease *l);
uint64_t engine_lease_token(const EngineLease *l);
/* The slot indices as granted, and their member names (NULL for a pool of anonymous slots). In a member
 * pool the name is what identifies the slot: a reload may move the member to another index. */
unsigned engine_lease_slots(const EngineLease *l, const unsigned **ret_indices, const char *const **ret_members);
usec_t engine_lease_granted_at(const EngineLease *l);
/* USEC_INFINITY without max-hold. */
usec_t engine_lease_expires_at(const EngineLease *l);
bool engine_lease_is_revoked(const EngineLease *l);
/* The backend's name of a shared lease ("NODE:RID"), to persist with it; NULL for a local lease. */
const char *engine_lease_remote_id(const EngineLease *l);
bool engine_lease_is_shared(const EngineLease *l);
/* A health job's lease (SPEC §3.6): granted quarantined members as a health lane's, so its exit 0 restores them
 * (a health = also lane's lease of ordinary members is not one). For the lease log: a restart keeps it so. */
bool engine_lease_is_health(const EngineLease *l);

/* A local member pool's quarantine rules (SPEC §3.6): bit n of exit_codes for exit status n
 * (quarantine-exit-codes=), and how many in a row quarantine (quarantine-after=). */
typedef struct EngineQuarantineRules {
        uint64_t exit_codes[4];
        unsigned after;
} EngineQuarantineRules;

/* The rules of the pool the lease holds, for the lease log: a restart whose configuration no longer has the pool
 * judges the lease's exit status by them still. false: none (no quarantine-exit-codes=, or a pool kept by a
 * backend, which keeps its own). */
bool engine_lease_quarantine_rules(const EngineLease *l, EngineQuarantineRules *ret);

/* An all-or-nothing lease (SPEC §3.5, a lane with also=): one lease over the chosen pool (the functions above)
 * and each also= pool, in the lane's order, with a fencing token of each pool. */
typedef struct EngineLeaseAlso {
        const char *pool;
        uint64_t token;
        unsigned n_slots;
        const unsigned *slots;
        const char *const *members; /* NULL for a pool of anonymous slots */
        const char *remote_id;      /* a shared pool's share: the backend's name of it; NULL: local */
} EngineLeaseAlso;
/* 0 for a lease of one pool. */
size_t engine_lease_also_count(const EngineLease *l);
/* The i-th also= pool's share; valid while the lease lives. Returns 0, -ENOENT. */
int engine_lease_also(const EngineLease *l, size_t i, EngineLeaseAlso *ret);

/* A lease that outlived a restart of the daemon, re-occupying exactly its old slots. */
typedef struct EngineLeaseRestore {
        const char *pool;
        const char *lane;
        const unsigned *slots;
        const char *const *members; /* the slots' member names as recorded (NULL: those now at the indices) */
        unsigned n_slots;
        uint64_t token;
        usec_t granted_at;
        usec_t expires_at;        /* USEC_INFINITY: none */
        const char *remote_id;    /* as engine_lease_remote_id() said; NULL: a local lease */
        /* A shared lease: where it was granted (backend= and credentials, backend-node-ttl=), or NULL (not
         * recorded). When no pool of the name is kept there, one is made there (the factory) and retired:
         * it heartbeats the lease, reclaims it, and releases it in Redis when it ends (SPEC §11). */
        const PoolConfig *granted_in;
        void *userdata;
        /* What engine_lease_is_health() said of it, as recorded; !health_known (not recorded): the lane says,
         * health = also counting as ordinary. */
        bool health_known;
        bool health;
        /* engine_lease_quarantine_rules() as recorded, or NULL: a pool not configured holds the lease by them. */
        const EngineQuarantineRules *quarantine;
} EngineLeaseRestore;

/* Slots are found by member name in a member pool, by index otherwise. A shared pool holds them until its
 * backend confirms them, and revokes the lease (REVOKE, with the reason) if it cannot. A pool that is not configured gets
 * the lease all the same (a lease ends when its holder is gone, never because its pool left the
 * configuration: SPEC §3.4): it is kept as a removed pool, its slots held until released, and a reload
 * that configures it again revives it with them. Returns 0, -EEXIST (a slot is taken), -EINVAL, -ENOMEM. */
int engine_lease_restore(Engine *e, const EngineLeaseRestore *r, EngineLease **ret);
/* An also= pool's share of a restored all-or-nothing lease (SPEC §3.5), given as engine_lease_restore() takes
 * a lease (lane, times and userdata unused: the lease's own), after the lease's own pool. remote_id: the
 * share's name at the backend (EngineLeaseAlso.remote_id), given exactly when the lease is shared too (a set
 * is never mixed); a shared share is bound to the lease: its loss revokes the whole lease. Its pool is found,
 * or kept as a removed one, as there. Returns 0, -EEXIST (a slot is taken), -EINVAL (a pool of the lease
 * already, a local share of a shared lease or the reverse), -ENOMEM; the lease is unchanged on failure. */
int engine_lease_restore_also(EngineLease *l, const EngineLeaseRestore *rs);
/* Fencing tokens of the pool continue at or above next_token, also for a pool configured later. Returns 0
 * or -ENOMEM. */
int engine_set_token_floor(Engine *e, const char *pool, uint64_t next_token);

/* What a lease's command told at its end (SPEC §3.6): its exit status (0–255) and its job (NULL: none), applied
 * when the lease is released: in a pool with quarantine-exit-codes= a member whose last quarantine-after
 * leases ended with one of them is quarantined; a health lane's exit 0 restores its members. A lease whose
 * end is never told changes nothing. Returns 0, -EINVAL (status out of range), -ENOMEM. */
int engine_lease_set_exit_status(EngineLease *l, int exit_status, const char *job);
/* The exit status engine_lease_set_exit_status() told (0–255); -1: none was. */
int engine_lease_get_exit_status(const EngineLease *l);

/* A quarantine, by hand or restored from the state directory. */
typedef struct EngineQuarantine {
        bool restore;             /* a restore (job: who did it); the other fields are not read */
        usec_t since;             /* monotonic µs; ≤ now */
        usec_t since_real;        /* the same instant in realtime µs, if known (one from before this boot, which
                                   * the monotonic since cannot tell); 0: none */
        const char *job;          /* who or which job; NULL: none */
        int exit_status;          /* -1: none (by hand) */
        const char *reason;       /* NULL: none */
} EngineQuarantine;

/* Quarantines (q set) or restores (q NULL, or q->restore with who in q->job) a member of a local member pool: a quarantined member is granted to
 * health lanes only; one held stays with its holder. A MEMBER event follows when its state changed. Returns 0,
 * -ENOENT (no such pool or member), -EOPNOTSUPP (a pool kept by a backend, or of anonymous slots), -ENOMEM. */
int engine_member_quarantine(Engine *e, const char *pool, const char *member, const EngineQuarantine *q, usec_t now);

/* A member's counts carried over a restart (SPEC §3.6, "Everything persists"; EngineMemberLife's). */
typedef struct EngineMemberUse {
        uint64_t grants;
        usec_t held;
        uint64_t quarantines;
        unsigned failures;        /* leases in a row that ended with a quarantine exit status */
} EngineMemberUse;

/* Sets a member's counts as they were before a restart, replacing what this start counted again (the grants of
 * the leases it restored, a quarantine it read again). A shared pool takes grants, held and quarantines (this
 * node's own; Redis keeps the failures in a row). An in-process pool kept for leases restored from before the name
 * left the configuration or moved to a backend takes them too, for the members its leases hold (and
 * engine_member_get_use() answers from it first). Returns 0, -ENOENT (no such pool or member), -EOPNOTSUPP (a
 * pool of anonymous slots). */
int engine_member_set_use(Engine *e, const char *pool, const char *member, const EngineMemberUse *u);
/* A member's counts now (the lease log's "use" record), without the pool's whole info: O(log members). Returns 0,
 * -ENOENT (no such pool or member), -EOPNOTSUPP (a pool kept by a backend, or of anonymous slots). */
int engine_member_get_use(const Engine *e, const char *pool, const char *member, EngineMemberUse *ret);

/* A drain with who, why, since and until (SPEC §3.6, "Drain with a reason and a schedule"). */
typedef struct EngineDrain {
        usec_t since;             /* monotonic µs; ≤ now */
        usec_t until;             /* monotonic µs, > now: undrained by itself then; USEC_INFINITY: never */
        /* The realtime µs that until was given as (0: none): kept and told as it was given, where one taken
         * back from the monotonic deadline would be a microsecond or two off (09:59:59 for 10:00:00), or
         * further after the realtime clock was slewed. The engine never reads it. */
        usec_t until_realtime;
        const char *who;          /* NULL: unknown */
        const char *reason;       /* NULL: none */
} EngineDrain;

/* Drains (d set) or undrains (d NULL) a pool or member as engine_drain(), remembering who, why, since and until;
 * at `until` the engine undrains it itself (engine_run(), engine_next_wakeup()). A DRAIN event follows each
 * change. Draining what is drained replaces the record. Returns 0, -ENOENT (unknown pool or member),
 * -EINVAL (until not after now), -ENOMEM. */
int engine_drain_with(Engine *e, const char *pool, const char *member, const EngineDrain *d, usec_t now);

/* The drains that engine_drain_with() recorded, for Status and the state directory. */
typedef struct EngineDrainInfo {
        const char *pool;
        const char *member;       /* NULL: the whole pool */
        usec_t since, until;
        usec_t until_realtime;    /* as EngineDrain's */
        const char *who, *reason;
} EngineDrainInfo;
size_t engine_drain_count(const Engine *e);
/* Valid until the next engine call. Returns 0, -ENOENT past the end. */
int engine_drain_info(const Engine *e, size_t i, EngineDrainInfo *ret);

/* Drains a pool (member NULL: its waiters are refused, new requests are unavailable) or one member
 * (no longer handed out). Returns 0, -ENOENT for an unknown pool or member. */
int engine_drain(Engine *e, const char *pool, const char *member, bool on, usec_t now);

/* One member's life in a member pool (SPEC §3.6), kept by name across reloads. A shared pool's quarantine is the
 * fleet's (Redis), its counts this node's own (grants, held, quarantines its calls made; failures 0). */
typedef struct EngineMemberLife {
        char *member;
        bool quarantined;
        usec_t since;             /* quarantined: since when (monotonic µs) */
        usec_t since_real;        /* quarantined: EngineQuarantine.since_real as given; 0: none (since is the whole truth) */
        char *job;                /* quarantined: the job whose end did it, or who did it by hand; may be NULL */
        int exit_status;          /* quarantined by this exit status; -1: by hand */
        char *reason;             /* quarantined by hand: why; NULL otherwise */
        char *node;               /* a shared pool: the node whose call quarantined it (its name); NULL otherwise */
        unsigned failures;        /* leases in a row that ended with a quarantine exit status */
        uint64_t quarantines;     /* times quarantined */
        uint64_t grants;          /* leases granted it */
        usec_t held;              /* µs held by leases that ended */
} EngineMemberLife;
/* A slot or member resting after its release (cooldown=, SPEC §3.6): neither free nor held until `until`. */
typedef struct PoolRest {
        unsigned index;           /* the slot's index (a member's place in members=) */
        const char *member;       /* its member's name, or NULL in a pool of anonymous slots */
        usec_t until;             /* monotonic: the first instant it may be granted again */
} PoolRest;

/* A rest carried across a restart (cooldown=, SPEC §3.6): the slot (member by name, else index) of a configured
 * local pool rests until `until` (monotonic), at most the pool's cooldown from now, unless it is held or the
 * pool has no cooldown. Returns 0, -ENOENT (nothing to rest), -ENOMEM. */
int engine_pool_rest(Engine *e, const char *pool, const char *member, unsigned index, usec_t until, usec_t now);

typedef struct EnginePoolInfo {
        const char *name;
        unsigned limit;
        unsigned in_use;
        size_t waiting;
        bool congested;
        bool drained;
        bool queue_timeout_set;
        usec_t queue_timeout;
        usec_t idle;
        uint64_t next_token;
        char *const *members;     /* NULL-terminated, or NULL */
        char *const *drained_members; /* NULL-terminated, or NULL */
        /* A pool kept by a backend (remote true; the fields below mean nothing otherwise): PoolInfo's. */
        bool remote;
        bool backend_up;
        const char *unavailable;
        char *const *differing_keys;
        usec_t rtt;
        unsigned n_nodes;
        unsigned all_in_use;
        size_t all_waiting;
        unsigned agreed_limit;    /* 0: not known yet */
        unsigned min_replicas;
        int replicas_acked;       /* -1: no WAIT answered */
        uint64_t bad_input;       /* replies and stream entries dropped by validation */
        /* The members' lives (SPEC §3.6), a member pool's; NULL/0 otherwise. */
        const EngineMemberLife *life;
        size_t n_life;
        /* Resting slots (cooldown=, SPEC §3.6): PoolInfo's, valid until the next call into the engine. */
        const PoolRest *resting;
        size_t n_resting;
        usec_t cooldown;          /* 0: none */
        /* A pool kept by a backend: the drains the backend keeps (engine_drain_info() lists the engine's own);
         * valid until the next call into the engine. */
        const EngineDrainInfo *drains;
        size_t n_drains;
} EnginePoolInfo;

/* The configured pools, in configuration order. */
size_t engine_pool_count(const Engine *e);
/* Whether the configured pool of that name is drained as a whole now (false: not, or no such pool). A pool
 * kept by a backend says what its last reply from there said. */
bool engine_pool_is_drained(const Engine *e, const char *pool);
int engine_pool_info(const Engine *e, size_t i, usec_t now, EnginePoolInfo *ret);
/* The holders and waiters of every node of the i-th configured pool, from its cache (pool.h). Returns 0,
 * -ENOENT, -EOPNOTSUPP for a pool without a backend (the daemon's tables are the whole truth), or -ENODATA
 * before the pool has fetched any. */
int engine_pool_snapshot(const Engine *e, size_t i, PoolSnapshot *ret);
/* The i-th pool's refresh_snapshot() (pool.h): 1 while a snapshot asked for at or after `since` is on its
 * way, 0 when there is one or none will come (or the pool has no backend). */
int engine_pool_refresh_snapshot(Engine *e, size_t i, usec_t since, usec_t now);

const char *refusal_to_string(Refusal r);
Refusal refusal_from_string(const char *s);
const char *queue_state_to_string(QueueState s);
/* Uniform in [1, max(1, ⌈Q⌉ s)] for a pool with queue-timeout Q, else [1, 60] (SPEC §3.2). */
unsigned engine_retry_after_sec(bool queue_timeout_set, usec_t queue_timeout, uint64_t random_value);
