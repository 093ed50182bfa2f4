/* SPDX-License-Identifier: MIT */
/* backend.h — the Redis side of shared pools (memo §1.6): one Backend per distinct endpoint and
 * credentials, made by the engine's pool factory when a pool names it and freed with its last pool.
 *
 * A Backend has two RedisLinks: one for the pools' script calls (FCALL of the library's functions, in the
 * order each pool's outbox gives them) and one blocked in XREAD on this node's stream of every pool on it,
 * resumed from the last entry handed in. It turns hiredis replies into RespValues for pool-shared.c (which
 * decides nothing either: Redis does), tells the pools when the link goes up or down, arms the
 * CLOCK_BOOTTIME self-fence timer, and hands their notices to its owner. The decisions the pools emit
 * reach the engine; the manager's drain, which follows every dispatch, processes them. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <systemd/sd-event.h>

#include "conf.h"
#include "engine.h"
#include "metrics.h"
#include "node.h"
#include "pool-shared.h"
#include "time-util.h"

typedef struct Backend Backend;

typedef struct BackendTable {
        sd_event *event;
        const Node *node;               /* the owner's; outlives the table */
        usec_t revoke_grace;            /* [broker] revoke-grace: part of the self-fence margin */
        bool records_unknown;           /* the node cannot account for its leases: pool_shared_set_records_unknown() */
        uint64_t (*random)(void *userdata);
        /* A notice of pool `pool` (backend lost/regained, node expired, rules, recovery, fenced). */
        void (*on_notice)(const char *pool, const SharedNotice *n, void *userdata);
        /* A call of pool `pool` answered after rtt (metrics). May be NULL. */
        void (*on_rtt)(const char *pool, usec_t rtt, void *userdata);
        /* The self-fence deadline of pool `pool` (CLOCK_BOOTTIME) moved: an acknowledged heartbeat put it a
         * second or more later (or something put it earlier). Its leases' holders are told (memo §4.4), so
         * that their commands stop in time should brokerd stop renewing. May be NULL. */
        void (*on_fence_moved)(const char *pool, usec_t deadline, void *userdata);
        /* The Sentinels of backend url moved its primary from `previous` to `primary` ("HOST:PORT"). Every
         * pool on it sees the new primary's run id, as after a restart. May be NULL. */
        void (*on_failover)(const char *url, const char *previous, const char *primary, void *userdata);
        void *userdata;                 /* of random, on_notice, on_rtt, on_fence_moved and on_failover */

        /* Tests only (test-shared-diff): the pools are made in the manual clock mode, on the engine's `now`
         * (memo §3.10), so that their decisions can be compared with an in-process pool's. The daemon never
         * sets it, and the scripts refuse a production node on a pool whose keys were made so. */
        bool manual_clock;
        /* Operations a pool sends in one call (brokerd/lua/batch.lua): 0, SHARED_BATCH_OPS_MAX (the daemon);
         * 1, one call each (tests comparing the two). */
        unsigned batch_max;
        Backend **backends;
        size_t n_backends;
} BackendTable;

void backend_table_init(BackendTable *t, sd_event *event, const Node *node);
/* Frees the backends that are left (their pools are the engine's: free the engine first). */
void backend_table_done(BackendTable *t);

/* An EnginePoolFactoryFn, userdata the BackendTable: a pool-shared on the Backend of pc's endpoint and
 * credentials (made on first use). Returns 0, -EINVAL (a backend= that does not parse), -ENOMEM, or
 * sd-event's error. */
int backend_table_pool_new(const PoolConfig *pc, const char *name, PoolEmitFn emit, void *emit_userdata,
                           void *userdata, Pool **ret);

/* For pool `pool` behind Sentinels (redis-sentinel://), where its primary is and its failovers, in *ret
 * (the address valid until the next dispatch). Returns true, or false for any other pool. */
bool backend_table_primary(const BackendTable *t, const char *pool, BackendPrimary *ret);

/* A restarted daemon's last proof of life (the lease log's alive mark, realtime µs; 0: none): until a
 * heartbeat is acknowledged, the leases restored into shared pools fence from it (memo §4.7, CONNECTING),
 * so that a restart while Redis is unreachable still revokes them in time. */
void backend_table_set_last_alive(BackendTable *t, usec_t realtime);

/* The self-fence deadline (CLOCK_BOOTTIME) of the shared pool `pool`: its leases are safe until then (the
 * earliest of its objects, while a reload moves it). USEC_INFINITY: no such pool, no lease, or nothing
 * acknowledged yet. */
usec_t backend_table_fence_deadline(const BackendTable *t, const char *pool);

/* Where the shared pool `pool` is kept: its Backend's URL and credentials (valid until the pool's backend
 * goes), and its node TTL. With two objects of the name (a move under way), the one holding leases. Returns
 * false for a pool without backend. */
typedef struct BackendWhere {
        const char *url, *user, *password_file, *sentinel_password_file;
        usec_t node_ttl;
} BackendWhere;
bool backend_table_where(const BackendTable *t, const char *pool, BackendWhere *ret);

/* A shared pool whose self-fence a reload to c would leave without its window: the node TTL it counts with
 * after the reload (the shorter of the one it counts with now, which is Redis's until Redis agreed to a change,
 * and the pool's backend-node-ttl= in c where c keeps it on this backend; a pool c removes or moves keeps its
 * own) below c's revoke-grace + 2 s + CONF_NODE_TTL_WINDOW_MIN, the bound conf.c checks c's pools against.
 * Applied, it would revoke that pool's leases at once ("fenced"). Returns true and *ret, or false. */
typedef struct BackendGraceRefusal {
        const char *pool;      /* valid until the pool goes */
        usec_t fence_ttl;
} BackendGraceRefusal;
bool backend_table_grace_refused(const BackendTable *t, const BrokerConfig *c, BackendGraceRefusal *ret);

/* [broker] revoke-grace= at start and at each reload: every shared pool's self-fence margin, the retired
 * ones' too. */
void backend_table_set_revoke_grace(BackendTable *t, usec_t revoke_grace);
/* Whether this node can account for the leases Redis holds for it (SPEC §3.4: its state directory read, and
 * no state.damaged): every pool, and the pools made later, follow (pool_shared_set_records_unknown()). */
void backend_table_set_records_unknown(BackendTable *t, bool unknown);

/* Whether a pool on one of the backends still owes Redis a withdraw or release it can deliver
 * (pool_shared_giving_back()): a clean stop keeps the loop running, bounded, until this is false. */
bool backend_table_giving_back(const BackendTable *t);

/* The calls of a backend one of whose pools refused a waiter here since (pool_shared_take_send_first()) go
 * now rather than at the next loop iteration. The manager calls it before it hands on each engine event: the
 * withdrawal is on its way to Redis before the refused client can queue on another node, and it is never
 * counted there behind itself. Other calls wait for the loop's next iteration, where more join them in one
 * batch. */
void backend_table_send_first(BackendTable *t);

/* Whether every pool on every backend has its calls answered and its stream read up to what the last reply
 * appended: nothing more can come without a new command. For tests that run the loop until then. */
bool backend_table_is_settled(const BackendTable *t);
