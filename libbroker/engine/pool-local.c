/* SPDX-License-Identifier: MIT */
/* pool-local.c — the in-process pool: slots, one queue, controlled-delay budgets (SPEC §3, §3.1).
 *
 * The queue is kept three ways, each for one question, so that no operation walks the waiters:
 *   - per lane, one FIFO per distinct slot count k ("buckets"): who is next for a lane, given its limits;
 *   - a rank tree ordered by (priority, arrival): a waiter's position;
 *   - a deadline heap: whose budget ends next.
 * Dispatch looks at the head of each (lane, k) bucket only: O(lanes × distinct k) per grant, however
 * long the queue is. Lanes and distinct k are a handful in any real configuration.
 *
 * A request may name labels or a member (SPEC §3.5): its bucket is then per (k, selector), with the set of
 * members the selector admits, and while any such request waits, dispatch walks the buckets' heads in queue
 * order handing free members to the first that can use them (queue_walk()). A bucket's waiters all ask the
 * same, so only its head can be next: the heads are kept in a rank tree of their own in queue order, and a
 * grant walks them only until no free member is left that a head could use: O(heads walked × log buckets),
 * never the whole queue.
 *
 * A held slot is identified by its member's name in a member pool, by its index in a pool of anonymous
 * slots (SPEC §3.4). Its place in the occupancy bitmap follows that identity across reloads: a reordered
 * member stays held by its holder, and a member removed while held sits above the limit, counted as held,
 * until it is released — and is held again, not handed out, if a reload brings it back meanwhile.
 *
 * Cooldown (SPEC §3.6): a slot released in a pool with cooldown= rests until a time value: neither free nor
 * held (holders + resting ≤ limit), never granted meanwhile. It is one predicate, slot_is_resting(), over
 * rest_until[] (by position below the limit) and the list of rests with their one wake deadline: free_slots(),
 * slot_find_free() and free_members() leave resting slots out, so a waiter that lacks them holds back the
 * queue as for held ones (no barging), and run() at the wake hands them on in queue order. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "heap.h"
#include "list.h"
#include "macro.h"
#include "pool.h"
#include "rank-tree.h"
#include "strv.h"

typedef struct LocalPool LocalPool;
typedef struct LocalLane LocalLane;

typedef struct Bucket {
        unsigned slots;
        List fifo; /* PoolWaiter.fifo_node, in arrival order */
        /* A selector's bucket: what it asks (selector_canon(), its terms and member, kept to resolve it again
         * on reload) and the members it admits now. All NULL for requests that take any slot. */
        char *canon;
        char **terms;
        char *member;
        uint64_t *mask;       /* member_set_words(limit) words */
        RankNode head_node;   /* LocalPool.heads while the bucket has waiters, keyed as its head */
        bool head_linked;
} Bucket;

/* A lane's share of this pool: its limits, what it holds, who of it waits. */
struct LocalLane {
        char *name;
        int priority;
        int64_t max_in_use;
        unsigned reserve;
        bool health;       /* granted quarantined members only (SPEC §3.6) */
        bool health_also;  /* health = also: quarantined members first, else ordinary ones */
        bool configured;   /* false: removed by reload, kept while it holds slots */
        unsigned used;
        size_t n_waiting;
        Bucket **buckets;  /* sorted by slots, ascending; empty ones are kept: there are few */
        size_t n_buckets;
};

struct PoolWaiter {
        LocalPool *pool;
        LocalLane *lane;
        Bucket *bucket;
        void *cookie;
        unsigned slots;
        uint64_t seq;
        usec_t arrival;
        QueueState state;
        usec_t idle;
        usec_t budget;
        bool shed;         /* the saturated budget is the one that runs out */
        bool gated;        /* part of an all-or-nothing set: granted only by grant_waiter() */
        ListNode fifo_node;
        RankNode rank_node;
        HeapNode deadline_node;
        /* A health lane's waiter (SPEC §3.6): in LocalPool.health (fifo_node), not in the queue; what it asks,
         * kept to resolve it again on reload, and the members it admits (NULL: any). */
        bool health;
        char **terms;
        char *member;
        uint64_t *mask;
};

struct PoolGrant {
        LocalLane *lane;
        uint64_t token;
        ListNode node;        /* LocalPool.grants */
        unsigned n_slots;
        unsigned *pos;        /* [n_slots] where each slot sits in the bitmap now: moves with reloads */
        char **members;       /* [n_slots] each slot's member name, NULL for an anonymous one; or NULL */
        usec_t granted_at;    /* for the members' held time */
        bool health;          /* a health job's: its exit 0 restores its members (SPEC §3.6) */
        unsigned indices[];   /* [n_slots] as granted: what the holder was told; then pos[n_slots] */
};

typedef enum Verdict {
        VERDICT_GRANTABLE, /* k slots are free and the lane's limits allow it */
        VERDICT_HOLD,      /* too few free slots: holds back everyone behind it (no barging) */
        VERDICT_PASS,      /* held back by a lane limit: passed over until the limit allows it */
} Verdict;

struct LocalPool {
        Pool base;
        usec_t congestion_timeout;      /* USEC_INFINITY when unset */
        bool congestion_timeout_set;
        int64_t max_queue;

        uint64_t *occupied;             /* bitmap over capacity slot positions */
        unsigned capacity;              /* ≥ limit, and ≥ every held position + 1 */
        List grants;                    /* PoolGrant.node: every slot held, to lay them out again on reload */
        unsigned in_use;                /* occupied slots, wherever they are */
        bool *member_drained;           /* [limit], or NULL */
        char **drained_members;         /* names, survive reloads */
        unsigned drained_free;          /* drained members below limit that are not occupied */

        usec_t last_fast;
        /* The latest instant a command named: the gauge cannot turn on before it (a queue that forms at u
         * when idle passed Q long ago turns it on at u, not at last_fast + Q + 1 in the past). */
        usec_t latest;
        uint64_t next_token;
        uint64_t next_seq;

        LocalLane **lanes;
        size_t n_lanes;

        RankTree queue;
        size_t n_waiting;
        size_t n_selective;             /* waiters with a selector: dispatch walks per member (queue_walk()) */
        RankTree heads;                 /* Bucket.head_node of every bucket with waiters, in queue order */
        Heap deadlines;

        bool congested;

        /* SPEC §3.6: the members' lives, by name: life[0..n_life_configured) are the configured members in
         * their order (so life[i] is member i), then members removed by reload that are still quarantined. */
        PoolMemberLife *life;
        size_t n_life;
        size_t n_life_configured;
        size_t *life_by_name;           /* indices of life sorted by member name (life_find()); NULL: scan */
        uint64_t quarantine_codes[4];
        unsigned quarantine_after;
        List health;                    /* health lanes' waiters (PoolWaiter.fifo_node), in arrival order */
        size_t n_health;
        /* Cooldown (SPEC §3.6). rest_until[pos] (limit entries, or NULL): 0, or when the slot at pos wakes;
         * rests: the same as a list (member names point into base.members), for the wake and Status. */
        usec_t cooldown;
        usec_t *rest_until;
        PoolRest *rests;
        size_t n_rests;
        unsigned resting_free;          /* resting, below the limit, not occupied and not drained */
        usec_t next_wake;               /* the earliest rests[].until; USEC_INFINITY: none */
};

#define POOL(p) container_of(p, LocalPool, base)

/* ---- slots ---- */

static bool bit_test(const uint64_t *b, unsigned i) {
        return (b[i / 64] >> (i % 64)) & 1;
}

static void bit_set(uint64_t *b, unsigned i) {
        b[i / 64] |= UINT64_C(1) << (i % 64);
}

static bool slot_is_occupied(const LocalPool *p, unsigned i) {
        return i < p->capacity && bit_test(p->occupied, i);
}

static int ensure_capacity(LocalPool *p, unsigned n) {
        if (n <= p->capacity)
                return 0;
        unsigned words = DIV_ROUND_UP(n, 64), old_words = DIV_ROUND_UP(p->capacity, 64);
        uint64_t *b = reallocarray(p->occupied, MAX(words, 1u), sizeof(uint64_t));
        if (!b)
                return -ENOMEM;
        memset(b + old_words, 0, (words - old_words) * sizeof(uint64_t));
        p->occupied = b;
        p->capacity = words * 64;
        return 0;
}

static bool member_is_quarantined(const LocalPool *p, unsigned i) {
        return i < p->n_life_configured && i < p->base.limit && p->life[i].quarantined;
}

static bool member_is_admin_drained(const LocalPool *p, unsigned i) {
        return p->member_drained && i < p->base.limit && p->member_drained[i];
}

/* Out of ordinary use: drained, or quarantined (only a health lane takes it: health_avail()). */
static bool member_is_drained(const LocalPool *p, unsigned i) {
        return member_is_admin_drained(p, i) || member_is_quarantined(p, i);
}

static bool slot_is_resting(const LocalPool *p, unsigned i) {
        return p->rest_until && i < p->base.limit && p->rest_until[i] != 0;
}

/* Slots that may be granted now. Counted against every slot held, also those above a limit that a reload
 * shrank: the invariant is slots held ≤ the limit in force when each was granted (SPEC §3.4), so a new grant
 * must fit under the new limit with the old holders still counted. */
static unsigned free_slots(const LocalPool *p) {
        if (p->base.drained || p->in_use + p->drained_free + p->resting_free >= p->base.limit)
                return 0;
        return p->base.limit - p->in_use - p->drained_free - p->resting_free;
}

static void rest_end(LocalPool *p, unsigned i);

static void slot_take(LocalPool *p, unsigned i) {
        if (slot_is_resting(p, i))
                rest_end(p, i); /* only a restored lease takes a resting slot: it was held all along */
        if (member_is_drained(p, i))
                p->drained_free--; /* only a restored lease takes a drained member */
        bit_set(p->occupied, i);
        p->in_use++;
}

static void slot_put(LocalPool *p, unsigned i) {
        p->occupied[i / 64] &= ~(UINT64_C(1) << (i % 64));
        p->in_use--;
        if (member_is_drained(p, i))
                p->drained_free++;
}

/* Lowest free index below the limit that is not drained: the same request gets the same slot every time. */
static unsigned slot_find_free(const LocalPool *p) {
        for (unsigned w = 0; w < DIV_ROUND_UP(p->base.limit, 64); w++) {
                uint64_t bits = ~p->occupied[w];
                while (bits) {
                        unsigned i = w * 64 + (unsigned) __builtin_ctzll(bits);
                        if (i >= p->base.limit)
                                return UINT32_MAX;
                        if (!member_is_drained(p, i) && !slot_is_resting(p, i))
                                return i;
                        bits &= bits - 1;
                }
        }
        return UINT32_MAX;
}

/* The lowest member of a set (free, not drained: queue_walk() made it), taken out of it. */
static unsigned slot_take_from(uint64_t *set) {
        for (unsigned w = 0;; w++)
                if (set[w]) {
                        unsigned i = w * 64 + (unsigned) __builtin_ctzll(set[w]);
                        set[w] &= set[w] - 1;
                        return i;
                }
}

static void recount_drained(LocalPool *p) {
        p->drained_free = 0;
        p->resting_free = 0;
        for (unsigned i = 0; i < p->base.limit; i++)
                if (!slot_is_occupied(p, i) && member_is_drained(p, i))
                        p->drained_free++;
        for (size_t k = 0; k < p->n_rests; k++)
                if (!member_is_drained(p, p->rests[k].index))
                        p->resting_free++;
}

/* ---- cooldown (SPEC §3.6) ---- */

static void rests_update_wake(LocalPool *p) {
        p->next_wake = USEC_INFINITY;
        for (size_t k = 0; k < p->n_rests; k++)
                p->next_wake = MIN(p->next_wake, p->rests[k].until);
}

/* The slot at position i (below the limit, not occupied) rests until `until`. */
static int rest_begin(LocalPool *p, unsigned i, usec_t until) {
        if (!p->rest_until || i >= p->base.limit || until == 0)
                return 0;
        if (p->rest_until[i] != 0) {
                for (size_t k = 0; k < p->n_rests; k++)
                        if (p->rests[k].index == i)
                                p->rests[k].until = until;
        } else {
                PoolRest *a = reallocarray(p->rests, p->n_rests + 1, sizeof(PoolRest));
                if (!a)
                        return -ENOMEM;
                p->rests = a;
                a[p->n_rests++] = (PoolRest) {
                        .index = i,
                        .member = p->base.members ? p->base.members[i] : NULL,
                        .until = until,
                };
                if (!member_is_drained(p, i))
                        p->resting_free++;
                p->rest_until[i] = until;
                p->next_wake = MIN(p->next_wake, until); /* O(1) per release: only a wake scans the rests */
                return 0;
        }
        p->rest_until[i] = until;
        rests_update_wake(p);
        return 0;
}

static void rest_end(LocalPool *p, unsigned i) {
        for (size_t k = 0; k < p->n_rests; k++)
                if (p->rests[k].index == i) {
                        p->rests[k] = p->rests[--p->n_rests];
                        break;
                }
        p->rest_until[i] = 0;
        if (!member_is_drained(p, i))
                p->resting_free--;
        rests_update_wake(p);
}

/* Rests that end at or before `now` end: their slots are free again (a command at `now` sees them so, and
 * run() hands them to the queue in order). */
static void rests_wake(LocalPool *p, usec_t now) {
        if (p->next_wake > now)
                return;
        size_t j = 0;
        for (size_t k = 0; k < p->n_rests; k++) {
                PoolRest r = p->rests[k];
                if (r.until > now) {
                        p->rests[j++] = r;
                        continue;
                }
                p->rest_until[r.index] = 0;
                if (!member_is_drained(p, r.index))
                        p->resting_free--;
        }
        p->n_rests = j;
        rests_update_wake(p);
}

static int usec_compare(const void *a, const void *b) {
        usec_t x = *(const usec_t *) a, y = *(const usec_t *) b;
        return x < y ? -1 : x > y;
}

/* When `need` more slots than are free now will have woken (resting, not drained, among `mask` unless it is
 * NULL); 0 if they never will. */
static usec_t rests_enough_at(const LocalPool *p, unsigned need, const uint64_t *mask) {
        if (need == 0 || need > p->resting_free)
                return 0;
        _cleanup_free_ usec_t *u = calloc(p->resting_free, sizeof(usec_t));
        if (!u)
                return p->next_wake; /* out of memory: the first wake is a fine hint too */
        size_t n = 0;
        for (size_t k = 0; k < p->n_rests; k++)
                if (!member_is_drained(p, p->rests[k].index) && (!mask || bit_test(mask, p->rests[k].index)))
                        u[n++] = p->rests[k].until;
        if (need > n)
                return 0;
        qsort(u, n, sizeof(usec_t), usec_compare);
        return u[need - 1];
}

/* A rest is of a slot nobody holds: one that a held slot now covers (its new place after a reload, a lease
 * restored over it) ends. */
static void rests_drop_held(LocalPool *p) {
        size_t kept = 0;
        for (size_t k = 0; k < p->n_rests; k++) {
                PoolRest rs = p->rests[k];
                if (slot_is_occupied(p, rs.index)) {
                        p->rest_until[rs.index] = 0;
                        continue;
                }
                p->rests[kept++] = rs;
        }
        p->n_rests = kept;
        recount_drained(p);
        rests_update_wake(p);
}

/* ---- grants and where their slots sit ---- */

static PoolGrant *grant_free(PoolGrant *g) {
        if (!g)
                return NULL;
        if (g->members)
                for (unsigned i = 0; i < g->n_slots; i++)
                        free(g->members[i]);
        free(g->members);
        return mfree(g);
}

/* named: the slots have member names (filled in by the caller). */
static PoolGrant *grant_new(LocalLane *l, uint64_t token, unsigned n_slots, bool named) {
        PoolGrant *g = calloc(1, sizeof(PoolGrant) + 2 * (size_t) n_slots * sizeof(unsigned));
        if (!g)
                return NULL;
        *g = (PoolGrant) { .lane = l, .token = token, .n_slots = n_slots };
        g->pos = g->indices + n_slots;
        if (named && !(g->members = calloc(n_slots, sizeof(char *))))
                return grant_free(g);
        return g;
}

static const char *grant_member(const PoolGrant *g, unsigned i) {
        return g->members ? g->members[i] : NULL;
}

/* A slot's place in a configuration, if it has one: its member's place among `members`, or its index
 * when the pool has anonymous slots. A member that is not configured, or a slot of the other kind, has
 * none. */
static bool slot_home(char *const *members, const char *member, unsigned index, unsigned *ret) {
        if (!members) {
                if (member)
                        return false;
                *ret = index;
                return true;
        }
        for (unsigned i = 0; member && members[i]; i++)
                if (streq(members[i], member)) {
                        *ret = i;
                        return true;
                }
        return false;
}

static bool slot_same(const PoolGrant *g, unsigned i, const char *member, unsigned index) {
        const char *m = grant_member(g, i);
        return m || member ? m && member && streq(m, member) : g->indices[i] == index;
}

/* Whether some grant holds the slot identified by (member, index). O(1) when its place is free; a scan of
 * the grants otherwise, which only restore needs. */
static bool slot_is_held(const LocalPool *p, const char *member, unsigned index) {
        unsigned home;
        if (slot_home(p->base.members, member, index, &home) && !slot_is_occupied(p, home))
                return false;
        list_foreach(n, &p->grants) {
                const PoolGrant *g = container_of(n, PoolGrant, node);
                for (unsigned i = 0; i < g->n_slots; i++)
                        if (slot_same(g, i, member, index))
                                return true;
        }
        return false;
}

/* Where every held slot sits under a configuration (members, limit): first each at its place (see
 * slot_home()), then the slots without one above the limit, where they count as held until released. */
typedef struct Layout {
        uint64_t *occupied;
        unsigned capacity;
        unsigned *pos;  /* every held slot's position, grant by grant in list order */
} Layout;

static void layout_done(Layout *l) {
        free(l->occupied);
        free(l->pos);
        *l = (Layout) {};
}

static int layout_plan(const LocalPool *p, char *const *members, unsigned limit, Layout *ret) {
        unsigned top = limit, k = 0;

        list_foreach(n, &p->grants) {
                const PoolGrant *g = container_of(n, PoolGrant, node);
                for (unsigned i = 0; i < g->n_slots; i++) {
                        unsigned home;
                        if (slot_home(members, grant_member(g, i), g->indices[i], &home))
                                top = MAX(top, home + 1);
                }
        }
        /* Indices are below 2^24 (restore checks) and members as many as the config has: no overflow. */
        Layout l = { .capacity = DIV_ROUND_UP(MAX(top + p->in_use, 1u), 64u) * 64 };
        l.occupied = calloc(l.capacity / 64, sizeof(uint64_t));
        l.pos = calloc(MAX(p->in_use, 1u), sizeof(unsigned));
        if (!l.occupied || !l.pos) {
                layout_done(&l);
                return -ENOMEM;
        }
        list_foreach(n, &p->grants) {
                const PoolGrant *g = container_of(n, PoolGrant, node);
                for (unsigned i = 0; i < g->n_slots; i++, k++) {
                        unsigned home;
                        l.pos[k] = UINT32_MAX;
                        /* Two grants never share an identity; were it so, the second goes above the limit. */
                        if (slot_home(members, grant_member(g, i), g->indices[i], &home) && !bit_test(l.occupied, home)) {
                                bit_set(l.occupied, home);
                                l.pos[k] = home;
                        }
                }
        }
        unsigned next = limit;
        k = 0;
        list_foreach(n, &p->grants) {
                const PoolGrant *g = container_of(n, PoolGrant, node);
                for (unsigned i = 0; i < g->n_slots; i++, k++) {
                        if (l.pos[k] != UINT32_MAX)
                                continue;
                        while (bit_test(l.occupied, next))
                                next++;
                        bit_set(l.occupied, next);
                        l.pos[k] = next;
                }
        }
        *ret = l;
        return 0;
}

/* Takes the layout over; member_drained must already be that of the same configuration. */
static void layout_apply(LocalPool *p, Layout *l) {
        unsigned k = 0;
        free(p->occupied);
        p->occupied = TAKE_PTR(l->occupied);
        p->capacity = l->capacity;
        list_foreach(n, &p->grants) {
                PoolGrant *g = container_of(n, PoolGrant, node);
                for (unsigned i = 0; i < g->n_slots; i++)
                        g->pos[i] = l->pos[k++];
        }
        layout_done(l);
        recount_drained(p);
}

/* ---- budgets (SPEC §3.1) ---- */

static usec_t fast_threshold(usec_t q) {
        return MAX(q / 20, MIN(USEC_PER_SEC, q));
}

static usec_t saturated_budget(const LocalPool *p) {
        return pool_saturated_budget(p->base.queue_timeout, p->congestion_timeout_set, p->congestion_timeout);
}

static usec_t idle_at(const LocalPool *p, usec_t now) {
        return usec_sub_unsigned(now, p->last_fast);
}

/* ---- lanes ---- */

static Bucket *bucket_free(Bucket *b);

static LocalLane *lane_free(LocalLane *l) {
        if (!l)
                return NULL;
        for (size_t i = 0; i < l->n_buckets; i++)
                bucket_free(l->buckets[i]);
        free(l->buckets);
        free(l->name);
        return mfree(l);
}

static LocalLane *lane_find(const LocalPool *p, const char *name) {
        for (size_t i = 0; i < p->n_lanes; i++)
                if (streq(p->lanes[i]->name, name))
                        return p->lanes[i];
        return NULL;
}

/* A lane for the rule, not in the pool yet. */
static LocalLane *lane_new(const PoolLaneRule *r) {
        LocalLane *l = calloc(1, sizeof(LocalLane));
        if (!l)
                return NULL;
        l->name = strdup(r->lane);
        if (!l->name)
                return mfree(l);
        l->priority = r->priority;
        l->max_in_use = r->max_in_use;
        l->reserve = r->reserve;
        l->health = r->health;
        l->health_also = r->health_also;
        return l;
}

static int lane_add(LocalPool *p, const PoolLaneRule *r, LocalLane **ret) {
        LocalLane **a = reallocarray(p->lanes, p->n_lanes + 1, sizeof(LocalLane *));
        if (!a)
                return -ENOMEM;
        p->lanes = a;
        LocalLane *l = lane_new(r);
        if (!l)
                return -ENOMEM;
        p->lanes[p->n_lanes++] = l;
        *ret = l;
        return 0;
}

static void lane_apply_rule(LocalLane *l, const PoolLaneRule *r) {
        l->priority = r->priority;
        l->max_in_use = r->max_in_use;
        l->reserve = r->reserve;
        l->health = r->health;
        l->health_also = r->health_also;
        l->configured = true;
}

/* Removes lanes that reload dropped once they hold and wait for nothing. */
static void lanes_gc(LocalPool *p) {
        size_t j = 0;
        for (size_t i = 0; i < p->n_lanes; i++) {
                LocalLane *l = p->lanes[i];
                if (!l->configured && l->used == 0 && l->n_waiting == 0)
                        lane_free(l);
                else
                        p->lanes[j++] = l;
        }
        p->n_lanes = j;
}

static Bucket *bucket_free(Bucket *b) {
        if (!b)
                return NULL;
        free(b->canon);
        strv_free(b->terms);
        free(b->member);
        free(b->mask);
        return mfree(b);
}

/* The bucket's place in LocalPool.heads follows its head waiter (or it leaves when it has none). */
static void bucket_head_update(LocalPool *p, LocalLane *l, Bucket *b) {
        if (b->head_linked)
                rank_tree_remove(&p->heads, &b->head_node);
        ListNode *n = list_first(&b->fifo);
        b->head_linked = n != NULL;
        if (n)
                rank_tree_insert(&p->heads, &b->head_node, -(int64_t) l->priority,
                                 container_of(n, PoolWaiter, fifo_node)->seq);
}

/* The members a selector bucket admits under the pool's members and labels now. */
static int bucket_resolve(const LocalPool *p, Bucket *b) {
        uint64_t *mask;
        int r = member_sets_resolve(p->base.member_sets, &(Selector) { .terms = b->terms, .member = b->member }, &mask);
        if (r < 0)
                return r;
        free(b->mask);
        b->mask = mask;
        return 0;
}

/* A selector bucket goes with its last waiter: there may be as many as there are waiters. Buckets without one
 * stay (a handful per lane). */
static void bucket_gc(LocalLane *l, Bucket *b) {
        if (!b->canon || !list_is_empty(&b->fifo))
                return;
        for (size_t i = 0; i < l->n_buckets; i++)
                if (l->buckets[i] == b) {
                        memmove(l->buckets + i, l->buckets + i + 1, (l->n_buckets - i - 1) * sizeof(Bucket *));
                        l->n_buckets--;
                        break;
                }
        bucket_free(b);
}

/* The lane's bucket for k slots and a selector (canon "" or NULL: none). */
static Bucket *lane_bucket(const LocalPool *p, LocalLane *l, unsigned slots, const char *canon, const Selector *sel) {
        if (canon && !*canon)
                canon = NULL;
        size_t i = 0;
        while (i < l->n_buckets && l->buckets[i]->slots < slots)
                i++;
        for (size_t j = i; j < l->n_buckets && l->buckets[j]->slots == slots; j++)
                if (streq_ptr(l->buckets[j]->canon, canon))
                        return l->buckets[j];

        /* Buckets are allocated one by one: each FIFO's sentinel must not move. */
        Bucket **a = reallocarray(l->buckets, l->n_buckets + 1, sizeof(Bucket *));
        if (!a)
                return NULL;
        l->buckets = a;
        Bucket *b = calloc(1, sizeof(Bucket));
        if (!b)
                return NULL;
        b->slots = slots;
        list_init(&b->fifo);
        if (canon) {
                b->canon = strdup(canon);
                b->terms = sel->terms ? strv_copy(sel->terms) : NULL;
                b->member = sel->member ? strdup(sel->member) : NULL;
                if (!b->canon || (sel->terms && !b->terms) || (sel->member && !b->member) || bucket_resolve(p, b) < 0)
                        return bucket_free(b);
        }
        memmove(a + i + 1, a + i, (l->n_buckets - i) * sizeof(Bucket *));
        a[i] = b;
        l->n_buckets++;
        return b;
}

/* Slots reserved for other lanes and not yet used by them (SPEC §3: reserve). */
static unsigned reserved_for_others(const LocalPool *p, const LocalLane *l) {
        unsigned r = 0;
        for (size_t i = 0; i < p->n_lanes; i++) {
                const LocalLane *m = p->lanes[i];
                if (m != l && m->configured && m->reserve > m->used)
                        r += m->reserve - m->used;
        }
        return r;
}

static Verdict lane_verdict(const LocalPool *p, const LocalLane *l, unsigned slots, unsigned free) {
        if (l->max_in_use >= 0 && (int64_t) (l->used + slots) > l->max_in_use)
                return VERDICT_PASS;
        if (slots > free)
                return VERDICT_HOLD;
        if (free - slots < reserved_for_others(p, l))
                return VERDICT_PASS;
        return VERDICT_GRANTABLE;
}

/* The earliest waiter of a lane that is not passed over by its limits, or NULL. */
static PoolWaiter *lane_next(const LocalPool *p, const LocalLane *l, unsigned free, Verdict *ret_verdict) {
        PoolWaiter *best = NULL;
        Verdict best_verdict = VERDICT_PASS;
        for (size_t i = 0; i < l->n_buckets; i++) {
                ListNode *n = list_first(&l->buckets[i]->fifo);
                if (!n)
                        continue;
                Verdict v = lane_verdict(p, l, l->buckets[i]->slots, free);
                if (v == VERDICT_PASS)
                        continue;
                PoolWaiter *w = container_of(n, PoolWaiter, fifo_node);
                if (!best || w->seq < best->seq) {
                        best = w;
                        best_verdict = v;
                }
        }
        *ret_verdict = best_verdict;
        return best;
}

static bool waiter_before(const PoolWaiter *a, const PoolWaiter *b) {
        return a->lane->priority > b->lane->priority || (a->lane->priority == b->lane->priority && a->seq < b->seq);
}

/* The first waiter in queue order that is not passed over: the one every grant must go through. */
static PoolWaiter *queue_next(const LocalPool *p, int min_priority, Verdict *ret_verdict) {
        unsigned free = free_slots(p);
        PoolWaiter *best = NULL;
        Verdict best_verdict = VERDICT_PASS;
        for (size_t i = 0; i < p->n_lanes; i++) {
                const LocalLane *l = p->lanes[i];
                if (l->n_waiting == 0 || l->priority < min_priority)
                        continue;
                Verdict v;
                PoolWaiter *w = lane_next(p, l, free, &v);
                if (w && (!best || waiter_before(w, best))) {
                        best = w;
                        best_verdict = v;
                }
        }
        *ret_verdict = best_verdict;
        return best;
}

/* The free members: below the limit, not occupied, not drained. */
static void free_members(const LocalPool *p, uint64_t *avail, size_t words) {
        for (size_t w = 0; w < words; w++)
                avail[w] = ~p->occupied[w];
        if (p->base.limit % 64)
                avail[words - 1] &= (UINT64_C(1) << (p->base.limit % 64)) - 1;
        for (unsigned i = 0; (p->member_drained || p->n_life_configured) && i < p->base.limit; i++)
                if (member_is_drained(p, i))
                        avail[i / 64] &= ~(UINT64_C(1) << (i % 64));
        for (size_t k = 0; k < p->n_rests; k++)
                avail[p->rests[k].index / 64] &= ~(UINT64_C(1) << (p->rests[k].index % 64));
}

/* No barging per member (SPEC §3.5): a waiter that cannot be granted sets aside the free members it could use,
 * so nobody behind it takes them; members it cannot use flow on. What a lane limit passes over sets nothing
 * aside, as in queue_next(). How one request fares after the queue: usable gets the members it may take
 * from those left in avail (mask NULL: any); returns GRANTABLE, HOLD or PASS. */
static Verdict member_verdict(const LocalPool *p, const LocalLane *l, unsigned slots, const uint64_t *mask,
                              uint64_t *avail, uint64_t *usable, size_t words) {
        if (l->max_in_use >= 0 && (int64_t) (l->used + slots) > l->max_in_use)
                return VERDICT_PASS;
        for (size_t w = 0; w < words; w++)
                usable[w] = avail[w] & (mask ? mask[w] : UINT64_MAX);
        unsigned free = free_slots(p);
        if (member_set_count(usable, words) < slots || free < slots) {
                for (size_t w = 0; w < words; w++)
                        avail[w] &= ~usable[w];
                return VERDICT_HOLD;
        }
        if (free - slots < reserved_for_others(p, l))
                return VERDICT_PASS;
        return VERDICT_GRANTABLE;
}

/* The first waiter in queue order that can be granted, walking the buckets' heads with member_verdict(); its
 * members in `usable`. NULL when none: avail then holds what the queue left for a newcomer. A gated waiter
 * (an all-or-nothing set's) that could be granted is not: it sets aside the members it could use, as one
 * that cannot be granted yet does. With `target`, the walk answers for it alone: it, if it could be granted
 * (gated or not), else NULL. `skip`: a waiter the walk passes by as if it were not queued (a set's part granted
 * as it arrives, local_grant_waiter(): it is the newest of its bucket, so nobody stands behind it there). */
static void waiter_say_ready(const LocalPool *p, const PoolWaiter *w, usec_t now) {
        Pool *base = (Pool *) &p->base; /* an emit changes nothing in the pool */
        pool_emit(base, &(PoolDecision) { .verdict = POOL_VERDICT_READY, .pool = base, .cookie = w->cookie, .at = now });
}

/* ready_at: not USEC_INFINITY: each gated waiter it sets aside as one that could be granted is said READY. */
static PoolWaiter *queue_walk(const LocalPool *p, uint64_t *avail, uint64_t *usable, size_t words,
                              const PoolWaiter *target, const PoolWaiter *skip, usec_t ready_at) {
        RankNode *n;
        for (size_t i = 0; (n = rank_tree_nth(&p->heads, i)); i++) {
                bool any = false;
                for (size_t w = 0; w < words && !any; w++)
                        any = avail[w] != 0;
                if (!any)
                        break;
                Bucket *b = container_of(n, Bucket, head_node);
                PoolWaiter *head = container_of(list_first(&b->fifo), PoolWaiter, fifo_node);
                if (head == skip)
                        continue;
                bool grantable = member_verdict(p, head->lane, head->slots, b->mask, avail, usable, words) ==
                                 VERDICT_GRANTABLE;
                if (target && head == target)
                        return grantable ? head : NULL;
                if (grantable && !target && !head->gated)
                        return head;
                if (grantable) {
                        for (size_t w = 0; w < words; w++)
                                avail[w] &= ~usable[w];
                        if (ready_at != USEC_INFINITY)
                                waiter_say_ready(p, head, ready_at);
                }
        }
        return NULL;
}

/* ---- waiters ---- */

static PoolWaiter *waiter_free(PoolWaiter *w) {
        if (!w)
                return NULL;
        strv_free(w->terms);
        free(w->member);
        free(w->mask);
        return mfree(w);
}

static void waiter_unlink(LocalPool *p, PoolWaiter *w) {
        if (w->health) {
                list_unlink(&w->fifo_node);
                heap_remove(&p->deadlines, &w->deadline_node);
                w->lane->n_waiting--;
                p->n_health--;
                return;
        }
        bool head = list_first(&w->bucket->fifo) == &w->fifo_node;
        list_unlink(&w->fifo_node);
        if (head)
                bucket_head_update(p, w->lane, w->bucket);
        if (w->bucket->canon)
                p->n_selective--;
        bucket_gc(w->lane, w->bucket);
        w->bucket = NULL;
        rank_tree_remove(&p->queue, &w->rank_node);
        heap_remove(&p->deadlines, &w->deadline_node);
        w->lane->n_waiting--;
        p->n_waiting--;
}

static void waiter_refuse_because(LocalPool *p, PoolWaiter *w, Refusal refusal, const char *reason, usec_t at);

/* The scripts' order of a lane's buckets when they refuse them all (drain.lua): those without a selector by k,
 * then those with one by k and canon. (l->buckets keeps k's order only: within a k, newest first.) */
static bool bucket_before(const Bucket *a, const Bucket *b) {
        if (!a->canon != !b->canon)
                return !a->canon;
        if (a->slots != b->slots)
                return a->slots < b->slots;
        return a->canon && strcmp(a->canon, b->canon) < 0;
}

/* Every waiter of the lane's buckets refused unavailable, in the scripts' order: one at a time, as refusing may
 * free a selector's bucket (the array shifts under the loop). Buckets are few: O(buckets) a waiter. */
static void lane_refuse_queued(LocalPool *p, LocalLane *l, const char *reason, usec_t now) {
        for (;;) {
                Bucket *first = NULL;
                for (size_t b = 0; b < l->n_buckets; b++)
                        if (list_first(&l->buckets[b]->fifo) && (!first || bucket_before(l->buckets[b], first)))
                                first = l->buckets[b];
                if (!first)
                        return;
                waiter_refuse_because(p, container_of(list_first(&first->fifo), PoolWaiter, fifo_node),
                                      REFUSAL_UNAVAILABLE, reason, now);
        }
}

/* The health waiters of lane l (NULL: of every lane), in arrival order. */
static void health_refuse_waiters(LocalPool *p, const LocalLane *l, const char *reason, usec_t now) {
        list_foreach_safe(n, &p->health) {
                PoolWaiter *w = container_of(n, PoolWaiter, fifo_node);
                if (!l || w->lane == l)
                        waiter_refuse_because(p, w, REFUSAL_UNAVAILABLE, reason, now);
        }
}

/* Every waiter of the lane refused unavailable, "reload": its lane removed (as the scripts' adoption refuses them:
 * pool-shared.c tells their "" so, shared_decision_reason()). */
static void lane_refuse_waiters(LocalPool *p, LocalLane *l, usec_t now) {
        health_refuse_waiters(p, l, "reload", now);
        lane_refuse_queued(p, l, "reload", now);
}

/* reason: the pool's word for an unavailable refusal (static), NULL: none (drained, removed). */
static void waiter_refuse_because(LocalPool *p, PoolWaiter *w, Refusal refusal, const char *reason, usec_t at) {
        waiter_unlink(p, w);
        pool_emit(&p->base, &(PoolDecision) {
                .verdict = POOL_VERDICT_REFUSED,
                .pool = &p->base,
                .cookie = w->cookie,
                .at = at,
                .refusal = refusal,
                .reason = reason,
                .state = w->state,
                .idle = w->idle,
                .budget = w->budget,
        });
        waiter_free(w);
}

static void waiter_refuse(LocalPool *p, PoolWaiter *w, Refusal refusal, usec_t at) {
        waiter_refuse_because(p, w, refusal, NULL, at);
}

/* usable: the members to take from, lowest first (NULL: the lowest free slots). */
static int grant(LocalPool *p, LocalLane *l, void *cookie, unsigned slots, usec_t arrival, usec_t now,
                 const PoolWaiter *w, uint64_t *usable) {
        PoolGrant *g = grant_new(l, p->next_token, slots, p->base.members != NULL);
        if (!g)
                return -ENOMEM;
        for (unsigned i = 0; i < slots; i++) {
                unsigned pos = usable ? slot_take_from(usable) : slot_find_free(p);
                assert(pos != UINT32_MAX);
                slot_take(p, pos);
                g->indices[i] = g->pos[i] = pos;
                if (g->members && !(g->members[i] = strdup(p->base.members[pos]))) {
                        for (unsigned k = 0; k <= i; k++)
                                slot_put(p, g->pos[k]);
                        grant_free(g);
                        return -ENOMEM;
                }
        }
        p->next_token++;
        l->used += slots;
        list_append(&p->grants, &g->node);
        g->granted_at = now;
        /* health = also: a health job where it got quarantined members (the ordinary queue grants none). */
        g->health = l->health && (!l->health_also || member_is_quarantined(p, g->pos[0]));
        for (unsigned i = 0; i < slots; i++)
                if (g->pos[i] < p->n_life_configured)
                        p->life[g->pos[i]].grants++;

        /* A fast admission restarts the idle clock; a slow one does not (SPEC §3.1). */
        if (p->base.queue_timeout_set && now - arrival <= fast_threshold(p->base.queue_timeout))
                p->last_fast = now;

        pool_emit(&p->base, &(PoolDecision) {
                .verdict = POOL_VERDICT_GRANTED,
                .pool = &p->base,
                .cookie = cookie,
                .at = now,
                .state = w ? w->state : QUEUE_STATE_NONE,
                .idle = w ? w->idle : 0,
                .budget = w ? w->budget : USEC_INFINITY,
                .grant = g,
                .slots = g->indices,
                .members = (const char *const *) g->members,
                .n_slots = slots,
                .token = g->token,
        });
        return 0;
}

/* Grants an unlinked waiter (the caller frees it); out of memory mid-grant, it is refused rather than lost
 * silently. */
static int waiter_grant(LocalPool *p, PoolWaiter *w, usec_t now, uint64_t *usable) {
        int r = grant(p, w->lane, w->cookie, w->slots, w->arrival, now, w, usable);
        if (r < 0)
                pool_emit(&p->base, &(PoolDecision) {
                        .verdict = POOL_VERDICT_REFUSED,
                        .pool = &p->base,
                        .cookie = w->cookie,
                        .at = now,
                        .refusal = REFUSAL_UNAVAILABLE,
                });
        return r;
}

/* Step 3 of the instant: free slots go to waiters in queue order, until the first that cannot go. */
static void dispatch(LocalPool *p, usec_t now) {
        size_t words = member_set_words(p->base.limit);
        _cleanup_free_ uint64_t *avail = NULL, *usable = NULL;

        while (p->n_waiting > 0 && free_slots(p) > 0) {
                Verdict v = VERDICT_GRANTABLE;
                PoolWaiter *w;
                bool walked = p->n_selective > 0;
                if (walked) {
                        if (!avail && (!(avail = calloc(words, sizeof(uint64_t))) ||
                                       !(usable = calloc(words, sizeof(uint64_t)))))
                                return; /* out of memory: the next instant tries again */
                        free_members(p, avail, words);
                        w = queue_walk(p, avail, usable, words, NULL, NULL, now);
                } else
                        w = queue_next(p, INT32_MIN, &v);
                /* A gated waiter first in line holds back those behind it: the engine grants it, or not. */
                if (w && v == VERDICT_GRANTABLE && w->gated)
                        waiter_say_ready(p, w, now);
                if (!w || v != VERDICT_GRANTABLE || w->gated)
                        return;
                waiter_unlink(p, w);
                (void) waiter_grant(p, w, now, walked ? usable : NULL);
                waiter_free(w);
        }
}

/* ---- a member's life: quarantine and health lanes (SPEC §3.6) ---- */

static int life_name_compare(const void *a, const void *b, void *userdata) {
        const LocalPool *p = userdata;
        size_t x = *(const size_t *) a, y = *(const size_t *) b;
        int c = strcmp(p->life[x].member, p->life[y].member);
        return c != 0 ? c : (x > y) - (x < y);
}

/* life_by_name anew after life changed (configure), in `ix` (n_life entries at least, taken over): a grant's and a
 * release's look-ups of their members (the lease log's counts, an exit status) are then O(log members), not a
 * scan of 20,000 names. */
static void life_index(LocalPool *p, size_t *ix) {
        free(p->life_by_name);
        p->life_by_name = NULL;
        if (p->n_life == 0) {
                free(ix);
                return;
        }
        for (size_t i = 0; i < p->n_life; i++)
                ix[i] = i;
        qsort_r(ix, p->n_life, sizeof(size_t), life_name_compare, p);
        p->life_by_name = ix;
}

/* The member's life, the first of its name in life[] (the configured one before a removed one). */
static PoolMemberLife *life_find(LocalPool *p, const char *member) {
        if (!p->life_by_name) {
                for (size_t i = 0; i < p->n_life; i++)
                        if (streq(p->life[i].member, member))
                                return p->life + i;
                return NULL;
        }
        size_t lo = 0, hi = p->n_life; /* the first index whose name is ≥ member */
        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                if (strcmp(p->life[p->life_by_name[mid]].member, member) < 0)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return lo < p->n_life && streq(p->life[p->life_by_name[lo]].member, member) ? p->life + p->life_by_name[lo] : NULL;
}

static void life_done(PoolMemberLife *m) {
        free(m->member);
        free(m->job);
        free(m->reason);
        free(m->node);
        *m = (PoolMemberLife) { .exit_status = -1 };
}

static void life_emit(LocalPool *p, const PoolMemberLife *m, usec_t now) {
        pool_emit(&p->base, &(PoolDecision) {
                .verdict = POOL_VERDICT_MEMBER,
                .pool = &p->base,
                .at = now,
                .member = m->member,
                .quarantined = m->quarantined,
                .job = m->job,
                .exit_status = m->exit_status,
                .note = m->reason,
        });
}

/* Sets the member's state with its who and why (copied first: nothing changes on -ENOMEM), and says so. */
static int life_set(LocalPool *p, PoolMemberLife *m, bool quarantined, usec_t since, const char *job,
                    int exit_status, const char *reason, usec_t now) {
        char *j = NULL, *r = NULL;
        if ((job && !(j = strdup(job))) || (reason && !(r = strdup(reason)))) {
                free(j);
                return -ENOMEM;
        }
        free(m->job);
        free(m->reason);
        m->job = j;
        m->reason = r;
        m->exit_status = exit_status;
        m->since = since;
        m->since_real = 0;
        if (quarantined && !m->quarantined)
                m->quarantines++;
        m->quarantined = quarantined;
        m->failures = 0;
        recount_drained(p);
        life_emit(p, m, now);
        return 0;
}

/* The free members a health lane may take: quarantined (and not drained by hand), not occupied. */
static void health_avail(const LocalPool *p, uint64_t *avail, size_t words) {
        memset(avail, 0, words * sizeof(uint64_t));
        for (unsigned i = 0; i < p->base.limit; i++)
                if (member_is_quarantined(p, i) && !member_is_admin_drained(p, i) && !slot_is_occupied(p, i) &&
                    !slot_is_resting(p, i))
                        bit_set(avail, i);
}

/* How many members a health request with this mask could ever get now: the quarantined ones it admits, and not
 * drained by hand unless drained_too. */
static unsigned health_capacity_of(const LocalPool *p, const uint64_t *mask, bool drained_too) {
        unsigned n = 0;
        for (unsigned i = 0; i < p->base.limit; i++)
                if (member_is_quarantined(p, i) && (drained_too || !member_is_admin_drained(p, i)) &&
                    (!mask || bit_test(mask, i)))
                        n++;
        return n;
}

static unsigned health_capacity(const LocalPool *p, const uint64_t *mask) {
        return health_capacity_of(p, mask, false);
}

/* Why a health request that too few members can ever satisfy now is refused (unavailable): the quarantined
 * members it admits would do but a drain keeps them out (SPEC §3.6: a drain is a person's, over a quarantine
 * too), or they are not quarantined. As the scripts say it (prelude.lua, HEALTH.refusal()). */
static const char *health_refusal(const LocalPool *p, const uint64_t *mask, unsigned slots) {
        return health_capacity_of(p, mask, true) >= slots ? "member-drained" : "not-quarantined";
}

/* avail &= mask; whether it then holds k members and the lane's max-in-use allows them. */
static bool health_fits(const LocalLane *l, unsigned slots, const uint64_t *mask, uint64_t *avail, size_t words) {
        for (size_t w = 0; mask && w < words; w++)
                avail[w] &= mask[w];
        if (l->max_in_use >= 0 && (int64_t) (l->used + slots) > l->max_in_use)
                return false;
        return member_set_count(avail, words) >= slots;
}

/* What a waiting health request could use is set aside from avail for those behind it (no barging per
 * member, as in the ordinary queue); one held back by its lane's max-in-use sets nothing aside. */
static void health_set_aside(const PoolWaiter *w, uint64_t *avail, size_t words) {
        if (w->lane->max_in_use >= 0 && (int64_t) (w->lane->used + w->slots) > w->lane->max_in_use)
                return;
        for (size_t k = 0; k < words; k++)
                avail[k] &= ~(w->mask ? w->mask[k] : UINT64_MAX);
}

/* What a new health request may take now: the free quarantined members, less what the health requests waiting
 * keep set aside (they wait: it is too little for them). NULL: out of memory. */
static uint64_t *health_avail_for_new(const LocalPool *p, size_t words) {
        uint64_t *avail = calloc(words, sizeof(uint64_t));
        if (!avail)
                return NULL;
        health_avail(p, avail, words);
        list_foreach(n, &p->health)
                health_set_aside(container_of(n, PoolWaiter, fifo_node), avail, words);
        return avail;
}

/* Health lanes' waiters, in arrival order: each takes the quarantined members it can use as they free, and
 * one that cannot be granted yet keeps those it could use from the waiters behind it; one whose members are
 * no longer quarantined (restored meanwhile) has nothing to wait for: unavailable. The ordinary queue never
 * takes a quarantined member, so the two never compete. O(health waiters × limit). Returns whether it
 * granted anything (dispatch_settle()). */
static bool health_dispatch(LocalPool *p, usec_t now) {
        bool granted = false;
        if (p->n_health == 0)
                return false;
        size_t words = member_set_words(p->base.limit);
        _cleanup_free_ uint64_t *avail = calloc(words, sizeof(uint64_t)), *usable = calloc(words, sizeof(uint64_t));
        if (!avail || !usable)
                return false; /* the next instant tries again */
        health_avail(p, avail, words);
        list_foreach_safe(n, &p->health) {
                PoolWaiter *w = container_of(n, PoolWaiter, fifo_node);
                if (health_capacity(p, w->mask) < w->slots) {
                        /* As a health submit refused at once says it (and the scripts: HEALTH's dispatch). */
                        waiter_refuse_because(p, w, REFUSAL_UNAVAILABLE, health_refusal(p, w->mask, w->slots), now);
                        continue;
                }
                memcpy(usable, avail, words * sizeof(uint64_t));
                if (!health_fits(w->lane, w->slots, w->mask, usable, words)) {
                        health_set_aside(w, avail, words);
                        continue;
                }
                waiter_unlink(p, w);
                if (waiter_grant(p, w, now, usable) >= 0)
                        granted = true;
                /* What it took is taken for those behind it too. */
                for (unsigned i = 0; i < p->base.limit; i++)
                        if (slot_is_occupied(p, i))
                                avail[i / 64] &= ~(UINT64_C(1) << (i % 64));
                waiter_free(w);
        }
        return granted;
}

/* Step 3 of the instant (SPEC §3.3): the queue, then the health lanes' waiters beside it, again while a health
 * grant was made. A health lane's grant counts for its lane's reserve= (SPEC §3, lane limits), so a waiter of
 * the queue that those unused reserved slots passed over may have room after it, at this instant (its budget
 * may end at it: step 3 comes before 4); and the queue's grants move lanes' max-in-use, which decides what a
 * health waiter sets aside. Each round but the last grants: it ends. prelude.lua's dispatch_settle() is this. */
static void dispatch_settle(LocalPool *p, usec_t now) {
        do
                dispatch(p, now);
        while (health_dispatch(p, now));
}

/* ---- the congested gauge ---- */

/* A one-slot request with no lane or client cap has no room: someone waits or no slot is free. */
static bool pool_has_room_for_one(const LocalPool *p) {
        return p->n_waiting == 0 && free_slots(p) > 0;
}

static bool congested_at(const LocalPool *p, usec_t now) {
        if (!p->base.queue_timeout_set || p->base.drained || p->base.retired)
                return false;
        return !pool_has_room_for_one(p) && idle_at(p, now) > p->base.queue_timeout;
}

static void update_congestion(LocalPool *p, usec_t now) {
        bool c = congested_at(p, now);
        if (c == p->congested)
                return;
        p->congested = c;
        pool_emit(&p->base, &(PoolDecision) {
                .verdict = POOL_VERDICT_CONGESTION,
                .pool = &p->base,
                .at = now,
                .idle = idle_at(p, now),
                .congested = c,
        });
}

/* ---- PoolOps ---- */

static void local_free(Pool *base) {
        LocalPool *p = POOL(base);
        /* Waiters still queued belong to requests the engine is freeing too. */
        for (size_t i = 0; i < p->n_lanes; i++) {
                LocalLane *l = p->lanes[i];
                for (size_t b = 0; b < l->n_buckets; b++) {
                        ListNode *n;
                        while ((n = list_first(&l->buckets[b]->fifo))) {
                                PoolWaiter *w = container_of(n, PoolWaiter, fifo_node);
                                list_unlink(n);
                                waiter_free(w);
                        }
                }
                lane_free(l);
        }
        ListNode *hn;
        while ((hn = list_first(&p->health))) {
                list_unlink(hn);
                waiter_free(container_of(hn, PoolWaiter, fifo_node));
        }
        for (size_t i = 0; i < p->n_life; i++)
                life_done(p->life + i);
        free(p->life);
        free(p->life_by_name);
        free(p->lanes);
        heap_done(&p->deadlines);
        free(p->occupied);
        free(p->member_drained);
        strv_free(p->drained_members);
        free(p->rest_until);
        free(p->rests);
        pool_members_replace(&p->base, NULL, NULL, 0, NULL);
        free(p);
}

/* A configuration prepared for the pool: all that applying it allocates, against the pool as it is. */
struct PoolStaged {
        const PoolConfig *c;
        const PoolLaneRule *rules;
        size_t n_rules;
        char **members;
        bool *member_drained;            /* [limit], or NULL */
        bool drains_given;               /* PoolDrains given: they replace the pool's own */
        bool drained;
        char **drained_members;
        usec_t *rest_until;              /* NULL: no cooldown */
        PoolRest *rests;
        size_t n_rests;
        /* The members' lives: the configured ones first (n_new_conf), room for every old one after them. */
        PoolMemberLife *life;
        size_t n_new_conf;
        size_t *life_by_name;            /* room for as many */
        uint64_t **hmasks;               /* per health waiter, in order: its selector resolved, or NULL */
        size_t n_hw;
        uint64_t **masks;                /* per selector bucket, in lane and bucket order */
        size_t n_masks;
        Layout layout;
        LocalLane **lanes;               /* the pool's lanes, then those the rules add */
        size_t n_lanes;
        PoolLabel *labels;
        size_t n_labels;
        MemberSets *member_sets;         /* of members and labels: the bucket masks above are resolved with them */
};

/* The staging's own: the lanes it added are freed by configure_abort(), or became the pool's. */
static void staged_free(PoolStaged *s) {
        strv_free(s->members);
        free(s->member_drained);
        strv_free(s->drained_members);
        free(s->rest_until);
        free(s->rests);
        for (size_t i = 0; s->life && i < s->n_new_conf; i++)
                free(s->life[i].member);
        free(s->life);
        free(s->life_by_name);
        for (size_t i = 0; s->hmasks && i < s->n_hw; i++)
                free(s->hmasks[i]);
        free(s->hmasks);
        for (size_t i = 0; s->masks && i < s->n_masks; i++)
                free(s->masks[i]);
        free(s->masks);
        layout_done(&s->layout);
        free(s->lanes);
        member_sets_free(s->member_sets);
        if (s->labels)
                pool_labels_free(s->labels, s->n_labels);
        free(s);
}

static void local_configure_abort(Pool *base, PoolStaged *s);
static void drain_whole(LocalPool *p, bool on, usec_t now);

static int local_configure_prepare(Pool *base, const PoolConfig *c, const PoolLaneRule *rules, size_t n_rules,
                                   const PoolDrains *drains, usec_t now, PoolStaged **ret) {
        LocalPool *p = POOL(base);
        int r;

        if (c->limit == 0)
                return -EINVAL;
        PoolStaged *s = calloc(1, sizeof(PoolStaged));
        if (!s)
                return -ENOMEM;
        *s = (PoolStaged) { .c = c, .rules = rules, .n_rules = n_rules, .drains_given = !!drains };

        /* Rests follow their member (or index) to the new configuration; a pool without cooldown= any more
         * ends them now. A changed cooldown= applies from the next release. */
        if (c->cooldown > 0) {
                s->rest_until = calloc(c->limit, sizeof(usec_t));
                s->rests = calloc(MAX(p->n_rests, (size_t) 1), sizeof(PoolRest));
                if (!s->rest_until || !s->rests)
                        goto oom;
                for (size_t k = 0; k < p->n_rests; k++) {
                        unsigned home;
                        if (!slot_home(c->members, p->rests[k].member, p->rests[k].index, &home) ||
                            home >= c->limit || s->rest_until[home] != 0)
                                continue;
                        s->rests[s->n_rests++] = (PoolRest) { .index = home, .until = p->rests[k].until };
                        s->rest_until[home] = p->rests[k].until;
                }
        }
        if (drains) {
                s->drained = drains->drained;
                if (drains->members && !(s->drained_members = strv_copy(drains->members)))
                        goto oom;
        }
        if (c->members) {
                s->members = strv_copy(c->members);
                s->member_drained = calloc(c->limit, sizeof(bool));
                if (!s->members || !s->member_drained)
                        goto oom;
                char *const *drained = drains ? s->drained_members : p->drained_members;
                for (unsigned i = 0; i < c->limit && s->members[i]; i++)
                        s->member_drained[i] = strv_contains(drained, s->members[i]);
        }
        r = pool_labels_copy(c->labels, c->n_labels, &s->labels);
        if (r < 0)
                goto fail;
        s->n_labels = c->n_labels;
        /* Of the copies the pool keeps on commit, equal to c's: what the masks below are resolved against. */
        r = member_sets_new(s->members, s->labels, s->n_labels, &s->member_sets);
        if (r < 0)
                goto fail;
        /* The members' lives follow them by name (SPEC §3.6): the configured ones in order, then those removed
         * while quarantined (a reload that brings one back finds it quarantined still). */
        if (c->members || p->n_life) {
                size_t n_conf = c->members ? c->limit : 0;
                s->life = calloc(n_conf + p->n_life + 1, sizeof(PoolMemberLife));
                s->life_by_name = calloc(n_conf + p->n_life + 1, sizeof(size_t));
                if (!s->life || !s->life_by_name)
                        goto oom;
                for (; s->n_new_conf < n_conf; s->n_new_conf++) {
                        s->life[s->n_new_conf] = (PoolMemberLife) { .exit_status = -1,
                                                                    .member = strdup(c->members[s->n_new_conf]) };
                        if (!s->life[s->n_new_conf].member)
                                goto oom;
                }
        }
        /* Health waiters' selectors against the new members: NULL where it fails (they are refused on commit). */
        list_foreach(hn, &p->health)
                s->n_hw++;
        s->hmasks = calloc(MAX(s->n_hw, (size_t) 1), sizeof(uint64_t *));
        if (!s->hmasks)
                goto oom;
        size_t k = 0;
        list_foreach(hn, &p->health) {
                PoolWaiter *w = container_of(hn, PoolWaiter, fifo_node);
                if (c->members && (w->terms || w->member)) {
                        r = member_sets_resolve(s->member_sets, &(Selector) { .terms = w->terms, .member = w->member },
                                                &s->hmasks[k]);
                        if (r == -ENOMEM)
                                goto oom;
                }
                k++;
        }

        /* Selectors resolved against the new members and labels: the members each waiting bucket admits. */
        for (size_t i = 0; i < p->n_lanes; i++)
                for (size_t b = 0; b < p->lanes[i]->n_buckets; b++)
                        s->n_masks += p->lanes[i]->buckets[b]->canon != NULL;
        s->masks = calloc(MAX(s->n_masks, (size_t) 1), sizeof(uint64_t *));
        if (!s->masks)
                goto oom;
        k = 0;
        for (size_t i = 0; i < p->n_lanes; i++)
                for (size_t b = 0; b < p->lanes[i]->n_buckets; b++) {
                        const Bucket *bk = p->lanes[i]->buckets[b];
                        if (!bk->canon)
                                continue;
                        if (!c->members) {
                                /* Anonymous slots now: the selector admits none (refused on commit). */
                                s->masks[k] = calloc(MAX(member_set_words(c->limit), (size_t) 1), sizeof(uint64_t));
                                r = s->masks[k++] ? 0 : -ENOMEM;
                        } else
                                r = member_sets_resolve(s->member_sets,
                                                        &(Selector) { .terms = bk->terms, .member = bk->member },
                                                        &s->masks[k++]);
                        if (r < 0)
                                goto fail;
                }
        /* Held slots follow their member (or index) to its place in the new configuration. */
        r = layout_plan(p, s->members, c->limit, &s->layout);
        if (r < 0)
                goto fail;
        /* The lanes the rules add, after the pool's own. */
        s->lanes = calloc(p->n_lanes + n_rules + 1, sizeof(LocalLane *));
        if (!s->lanes)
                goto oom;
        if (p->n_lanes > 0) /* p->lanes is NULL before the first configuration */
                memcpy(s->lanes, p->lanes, p->n_lanes * sizeof(LocalLane *));
        s->n_lanes = p->n_lanes;
        for (size_t i = 0; i < n_rules; i++)
                if (!lane_find(p, rules[i].lane)) {
                        s->lanes[s->n_lanes] = lane_new(&rules[i]);
                        if (!s->lanes[s->n_lanes])
                                goto oom;
                        s->n_lanes++;
                }
        *ret = s;
        return 0;

oom:
        r = -ENOMEM;
fail:
        local_configure_abort(base, s);
        return r;
}

static void local_configure_commit(Pool *base, PoolStaged *s, usec_t now) {
        LocalPool *p = POOL(base);
        const PoolConfig *c = s->c;
        p->latest = MAX(p->latest, now);
        bool restored_only = p->base.limit == 0; /* made for restored leases: restore_lives() */

        free(p->lanes);
        p->lanes = TAKE_PTR(s->lanes);
        p->n_lanes = s->n_lanes;
        pool_members_replace(&p->base, TAKE_PTR(s->members), TAKE_PTR(s->labels), s->n_labels,
                             TAKE_PTR(s->member_sets));
        size_t k = 0;
        for (size_t i = 0; i < p->n_lanes; i++)
                for (size_t b = 0; b < p->lanes[i]->n_buckets; b++) {
                        Bucket *bk = p->lanes[i]->buckets[b];
                        if (bk->canon) {
                                free(bk->mask);
                                bk->mask = TAKE_PTR(s->masks[k]);
                                k++;
                        }
                }

        bool had_q = p->base.queue_timeout_set;
        free(p->member_drained);
        p->member_drained = TAKE_PTR(s->member_drained);
        if (s->drains_given) {
                strv_free(p->drained_members);
                p->drained_members = TAKE_PTR(s->drained_members);
        }
        p->base.limit = c->limit;
        p->base.queue_timeout_set = c->queue_timeout_set;
        p->base.queue_timeout = c->queue_timeout;
        p->congestion_timeout_set = c->congestion_timeout_set;
        p->congestion_timeout = c->congestion_timeout;
        p->max_queue = c->max_queue;
        /* A pool that starts measuring idle time starts from now (SPEC §3.1). */
        if (!had_q && c->queue_timeout_set)
                p->last_fast = now;
        size_t n_new_life = s->n_new_conf;
        /* Each old life finds its configured member by binary search (life_index() makes the room its own after):
         * a scan of the configured members for each compared 10,000 × 10,000 names at a reload of 10,000. */
        size_t *by_name = s->life_by_name;
        for (size_t i = 0; p->n_life > 0 && i < s->n_new_conf; i++)
                by_name[i] = i;
        if (p->n_life > 0 && s->n_new_conf > 0)
                strv_order_sort(by_name, s->n_new_conf, &s->life[0].member, sizeof(PoolMemberLife));
        for (size_t i = 0; i < p->n_life; i++) {
                PoolMemberLife *old = p->life + i;
                if (restored_only) {
                        /* Lives known only from restored leases (a health job's member taken as quarantined, without
                         * who or why): brokerd applies what members.state and the lease log keep of them instead. */
                        life_done(old);
                        continue;
                }
                /* Its name's first (configurations name no member twice); a life taken keeps the name's text. */
                size_t at = s->n_new_conf > 0 ? strv_order_lower_bound(by_name, s->n_new_conf, &s->life[0].member,
                                                                       sizeof(PoolMemberLife), old->member)
                                              : 0;
                size_t j = at < s->n_new_conf && streq(s->life[by_name[at]].member, old->member) ? by_name[at]
                                                                                                   : s->n_new_conf;
                if (j < s->n_new_conf) {
                        free(s->life[j].member);
                        s->life[j] = *old;
                } else if (old->quarantined)
                        s->life[n_new_life++] = *old;
                else
                        life_done(old);
        }
        free(p->life);
        p->life = TAKE_PTR(s->life);
        p->n_life = n_new_life;
        p->n_life_configured = s->n_new_conf;
        life_index(p, TAKE_PTR(s->life_by_name));
        memcpy(p->quarantine_codes, c->quarantine_exit_codes, sizeof p->quarantine_codes);
        p->quarantine_after = MAX(c->quarantine_after, 1u);
        k = 0;
        list_foreach(hn, &p->health) {
                PoolWaiter *w = container_of(hn, PoolWaiter, fifo_node);
                if (w->terms || w->member) {
                        free(w->mask);
                        w->mask = TAKE_PTR(s->hmasks[k]);
                }
                w->slots = w->mask || c->members ? w->slots : 0; /* anonymous slots now: refused below */
                k++;
        }
        p->cooldown = c->cooldown;
        free(p->rest_until);
        p->rest_until = TAKE_PTR(s->rest_until);
        free(p->rests);
        p->rests = TAKE_PTR(s->rests);
        p->n_rests = s->n_rests;
        for (size_t ri = 0; ri < p->n_rests; ri++)
                p->rests[ri].member = p->base.members ? p->base.members[p->rests[ri].index] : NULL;
        layout_apply(p, &s->layout);
        rests_drop_held(p);

        for (size_t i = 0; i < p->n_lanes; i++) {
                LocalLane *l = p->lanes[i];
                const PoolLaneRule *rule = NULL;
                for (size_t ri = 0; ri < s->n_rules && !rule; ri++)
                        if (streq(s->rules[ri].lane, l->name))
                                rule = &s->rules[ri];
                if (!rule) {
                        /* Dropped by reload: its waiters have nowhere to go; its holders finish. */
                        l->configured = false;
                        l->reserve = 0;
                        l->max_in_use = -1;
                        lane_refuse_waiters(p, l, now);
                        continue;
                }
                int old_priority = l->priority;
                lane_apply_rule(l, rule);
                if (old_priority != l->priority)
                        /* The queue is ordered by priority: re-key this lane's waiters. O(n log n), reload only. */
                        for (size_t b = 0; b < l->n_buckets; b++) {
                                bucket_head_update(p, l, l->buckets[b]);
                                list_foreach(n, &l->buckets[b]->fifo) {
                                        PoolWaiter *w = container_of(n, PoolWaiter, fifo_node);
                                        rank_tree_remove(&p->queue, &w->rank_node);
                                        rank_tree_insert(&p->queue, &w->rank_node, -(int64_t) l->priority, w->seq);
                                }
                        }
        }
        /* A waiter whose selector the new members and labels can never satisfy would wait out its budget for
         * nothing: refused, as a removed lane's waiters are. Refusing a bucket's last waiter frees the bucket:
         * the array shifts under the loop. */
        for (size_t i = 0; i < p->n_lanes; i++) {
                LocalLane *l = p->lanes[i];
                for (size_t b = 0; b < l->n_buckets;) {
                        Bucket *bk = l->buckets[b];
                        if (!bk->canon || member_set_count(bk->mask, member_set_words(p->base.limit)) >= bk->slots) {
                                b++;
                                continue;
                        }
                        waiter_refuse_because(p, container_of(list_first(&bk->fifo), PoolWaiter, fifo_node),
                                              REFUSAL_UNAVAILABLE, "reload", now);
                }
        }
        /* Health waiters that lost what they asked for (a member gone, the pool anonymous, no health lane). */
        list_foreach_safe(hn, &p->health) {
                PoolWaiter *w = container_of(hn, PoolWaiter, fifo_node);
                if (w->slots == 0 || ((w->terms || w->member) && !w->mask) || !w->lane->health)
                        waiter_refuse_because(p, w, REFUSAL_UNAVAILABLE, "reload", now);
        }
        lanes_gc(p);
        /* The drains given with the configuration: the members' above, the whole pool's here, its waiters
         * refused as by drain(). */
        if (s->drains_given)
                drain_whole(p, s->drained, now);
        staged_free(s);
}

static void local_configure_abort(Pool *base, PoolStaged *s) {
        if (!s)
                return;
        /* The lanes it made are its own; the pool's are not. */
        for (size_t i = POOL(base)->n_lanes; s->lanes && i < s->n_lanes; i++)
                lane_free(s->lanes[i]);
        staged_free(s);
}

/* Every waiter refused unavailable in the order they came (seq), whatever their lane: as a shared pool refuses
 * its tries when it retires (pool-shared.c, refuse_all_tries()). The health list and each bucket are in that
 * order already: the first of their heads each time, O(buckets) a waiter. */
static void refuse_all_by_arrival(LocalPool *p, usec_t now) {
        for (;;) {
                ListNode *h = list_first(&p->health);
                PoolWaiter *first = h ? container_of(h, PoolWaiter, fifo_node) : NULL;
                for (size_t i = 0; i < p->n_lanes; i++)
                        for (size_t b = 0; b < p->lanes[i]->n_buckets; b++) {
                                ListNode *n = list_first(&p->lanes[i]->buckets[b]->fifo);
                                PoolWaiter *w = n ? container_of(n, PoolWaiter, fifo_node) : NULL;
                                if (w && (!first || w->seq < first->seq))
                                        first = w;
                        }
                if (!first)
                        return;
                waiter_refuse(p, first, REFUSAL_UNAVAILABLE, now);
        }
}

static void local_retire(Pool *base, usec_t now) {
        LocalPool *p = POOL(base);
        p->base.retired = true;
        for (size_t i = 0; i < p->n_lanes; i++)
                p->lanes[i]->configured = false;
        refuse_all_by_arrival(p, now);
        update_congestion(p, now);
}

/* The adaptive budget a resumed waiter of this state had, as far as it can be a shed's (SPEC §3.1). */
static usec_t resumed_adaptive(const LocalPool *p, QueueState state) {
        return p->base.queue_timeout_set && state == QUEUE_STATE_SATURATED ? saturated_budget(p) : USEC_INFINITY;
}

static void refuse_try(LocalPool *p, const PoolTry *t, Refusal refusal, usec_t now) {
        pool_emit(&p->base, &(PoolDecision) {
                .verdict = POOL_VERDICT_REFUSED,
                .pool = &p->base,
                .cookie = t->cookie,
                .at = now,
                .refusal = refusal,
                .budget = USEC_INFINITY,
        });
}

static int local_submit(Pool *base, const PoolTry *t, usec_t now) {
        LocalPool *p = POOL(base);
        p->latest = MAX(p->latest, now);
        rests_wake(p, now);

        if (p->base.drained || p->base.retired) {
                refuse_try(p, t, REFUSAL_UNAVAILABLE, now);
                return 0;
        }
        LocalLane *l = lane_find(p, t->lane);
        if (!l || !l->configured || t->slots == 0 || t->slots > p->base.limit)
                return -EINVAL;

        _cleanup_free_ char *canon = NULL;
        _cleanup_free_ uint64_t *mask = NULL, *avail = NULL, *usable = NULL;
        size_t words = member_set_words(p->base.limit);
        int r;
        if (!selector_is_empty(t->selector)) {
                if (!p->base.members)
                        return -EINVAL;
                r = selector_canon(t->selector, &canon);
                if (r < 0)
                        return r;
                r = member_sets_resolve(p->base.member_sets, t->selector, &mask);
                if (r < 0)
                        return r;
                if (member_set_count(mask, words) < t->slots)
                        return -EINVAL;
        }

        /* A resumed waiter whose budget ended while no daemon ran is refused at its deadline, before room is
         * looked at (SPEC §3.3: never granted after its budget ended; a slot freed meanwhile is no reason),
         * and without queueing it first: run() grants freed slots before it refuses the budgets that ended. */
        if (t->resume && t->resume->budget != USEC_INFINITY) {
                usec_t deadline = usec_add(MIN(t->arrival, now), t->resume->budget);
                if (deadline < now) {
                        bool shed = pool_budget_is_shed(t, t->resume->state, resumed_adaptive(p, t->resume->state));
                        pool_emit(&p->base, &(PoolDecision) {
                                .verdict = POOL_VERDICT_REFUSED,
                                .pool = &p->base,
                                .cookie = t->cookie,
                                .at = deadline,
                                .refusal = shed ? REFUSAL_SHED : REFUSAL_TIMEOUT,
                                .state = t->resume->state,
                                .idle = t->resume->idle,
                                .budget = t->resume->budget,
                        });
                        return 0;
                }
        }

        /* Room (SPEC §3): nobody waiting, k slots free, and the lane's limits allow it. A waiter that a lane
         * limit passes over does not count as waiting here, as it does not hold back the queue either:
         * otherwise a nightly waiter kept out of merge's reserved slot would keep merge out of it too. With
         * selectors (SPEC §3.5) it is per member: the free members the waiters leave it. */
        /* health = also (SPEC §3.6, "unless the lane also lists ordinary use"): quarantined members first, when
         * enough that it may use are free now (the health requests waiting keep theirs); else an ordinary
         * request in every way, which waits for ordinary members in the queue. */
        if (l->health && l->health_also && p->base.members && !t->gated && health_capacity(p, mask) >= t->slots) {
                avail = health_avail_for_new(p, words);
                if (!avail)
                        return -ENOMEM;
                if (health_fits(l, t->slots, mask, avail, words))
                        return grant(p, l, t->cookie, t->slots, t->arrival, now, NULL, avail);
                avail = mfree(avail);
        }
        bool health = l->health && !l->health_also;

        bool room;
        if (health) {
                /* SPEC §3.6: quarantined members only, beside the queue (health_dispatch()). A request that no
                 * quarantined member can satisfy has nothing to wait for. */
                if (!p->base.members)
                        return -EINVAL;
                if (health_capacity(p, mask) < t->slots) {
                        pool_emit(&p->base, &(PoolDecision) {
                                .verdict = POOL_VERDICT_REFUSED,
                                .pool = &p->base,
                                .cookie = t->cookie,
                                .at = now,
                                .refusal = REFUSAL_UNAVAILABLE,
                                .budget = USEC_INFINITY,
                                .reason = health_refusal(p, mask, t->slots),
                        });
                        return 0;
                }
                avail = health_avail_for_new(p, words);
                if (!avail)
                        return -ENOMEM;
                /* A health lane takes no also= pools (conf_validate()): never gated. */
                room = health_fits(l, t->slots, mask, avail, words);
                if (room && !t->gated)
                        return grant(p, l, t->cookie, t->slots, t->arrival, now, NULL, avail);
        } else if (p->n_selective > 0 || mask) {
                avail = calloc(words, sizeof(uint64_t));
                usable = calloc(words, sizeof(uint64_t));
                if (!avail || !usable)
                        return -ENOMEM;
                free_members(p, avail, words);
                room = !queue_walk(p, avail, usable, words, NULL, NULL, USEC_INFINITY) &&
                       member_verdict(p, l, t->slots, mask, avail, usable, words) == VERDICT_GRANTABLE;
                if (room && !t->gated)
                        return grant(p, l, t->cookie, t->slots, t->arrival, now, NULL, usable);
        } else {
                Verdict ahead_verdict, v = lane_verdict(p, l, t->slots, free_slots(p));
                room = v == VERDICT_GRANTABLE && !queue_next(p, INT32_MIN, &ahead_verdict);
                if (room && !t->gated)
                        return grant(p, l, t->cookie, t->slots, t->arrival, now, NULL, NULL);
        }
        /* A gated try with room is queued (ready) whatever its patience: the engine grants it with the rest of
         * its set at once, or withdraws it. */

        if (!room && !t->may_wait) {
                /* Busy for want of slots that rest: says so, and when enough of them wake. A health lane's try
                 * has no `usable` of the ordinary queue's: the free members its selector admits, as the scripts
                 * count them (submit.lua). */
                if (mask && !usable) {
                        usable = calloc(words, sizeof(uint64_t));
                        if (!usable)
                                return -ENOMEM;
                        free_members(p, usable, words);
                        for (size_t w = 0; w < words; w++)
                                usable[w] &= mask[w];
                }
                unsigned free = free_slots(p), have = mask ? MIN(free, (unsigned) member_set_count(usable, words)) : free;
                usec_t at = 0;
                if (p->n_waiting == 0 && have < t->slots &&
                    lane_verdict(p, l, t->slots, free + p->resting_free) == VERDICT_GRANTABLE)
                        at = rests_enough_at(p, t->slots - have, mask);
                pool_emit(&p->base, &(PoolDecision) {
                        .verdict = POOL_VERDICT_REFUSED,
                        .pool = &p->base,
                        .cookie = t->cookie,
                        .at = now,
                        .refusal = REFUSAL_BUSY,
                        .budget = USEC_INFINITY,
                        .reason = at > 0 ? "cooldown" : NULL,
                        .retry_at = at,
                });
                return 0;
        }
        /* A resumed waiter was admitted before the restart: max-queue counted it then. A reservation (SPEC §3.6)
         * is a person's, one at a time, ahead of the queue that max-queue keeps short: never refused full. */
        if (!room && !t->resume && p->max_queue >= 0 && (int64_t) p->n_waiting >= p->max_queue &&
            !streq(l->name, ENGINE_RESERVE_LANE)) {
                refuse_try(p, t, REFUSAL_FULL, now);
                return 0;
        }

        Bucket *b = health ? NULL : lane_bucket(p, l, t->slots, canon, t->selector);
        if (!b && !health)
                return -ENOMEM;
        PoolWaiter *w = calloc(1, sizeof(PoolWaiter));
        if (!w)
                return -ENOMEM;
        *w = (PoolWaiter) {
                .pool = p,
                .lane = l,
                .bucket = b,
                .cookie = t->cookie,
                .slots = t->slots,
                .seq = p->next_seq++,
                .arrival = t->arrival,
                .state = QUEUE_STATE_NONE,
                .budget = USEC_INFINITY,
                .gated = t->gated,
        };
        heap_node_init(&w->deadline_node);
        if (health) {
                w->health = true;
                w->mask = TAKE_PTR(mask);
                if ((t->selector && t->selector->terms && !(w->terms = strv_copy(t->selector->terms))) ||
                    (t->selector && t->selector->member && !(w->member = strdup(t->selector->member)))) {
                        waiter_free(w);
                        return -ENOMEM;
                }
        }

        /* The budget is fixed now, from the idle time now (SPEC §3.1); a resumed waiter keeps the one it got
         * when it first joined the queue, and its deadline with it (a restart moves it by nothing). */
        usec_t adaptive = USEC_INFINITY, start = now;
        if (t->resume) {
                w->state = t->resume->state;
                w->idle = t->resume->idle;
                w->budget = t->resume->budget;
                adaptive = resumed_adaptive(p, w->state);
                start = MIN(t->arrival, now);
        } else {
                if (p->base.queue_timeout_set) {
                        w->idle = idle_at(p, now);
                        w->state = w->idle > p->base.queue_timeout ? QUEUE_STATE_SATURATED : QUEUE_STATE_KEEPING_UP;
                        adaptive = w->state == QUEUE_STATE_SATURATED ? saturated_budget(p) : p->base.queue_timeout;
                }
                usec_t base_budget = t->lane_budget_set ? t->lane_budget : adaptive;
                w->budget = MIN(base_budget, t->client_cap);
        }
        w->shed = pool_budget_is_shed(t, w->state, adaptive);

        if (w->budget != USEC_INFINITY) {
                r = heap_push(&p->deadlines, &w->deadline_node, usec_add(start, w->budget));
                if (r < 0) {
                        waiter_free(w);
                        if (b)
                                bucket_gc(l, b);
                        return r;
                }
        }
        if (w->health) {
                list_append(&p->health, &w->fifo_node);
                l->n_waiting++;
                p->n_health++;
                goto queued;
        }
        list_append(&b->fifo, &w->fifo_node);
        if (!b->head_linked)
                bucket_head_update(p, l, b);
        if (b->canon)
                p->n_selective++;
        rank_tree_insert(&p->queue, &w->rank_node, -(int64_t) l->priority, w->seq);
        l->n_waiting++;
        p->n_waiting++;

queued:
        pool_emit(&p->base, &(PoolDecision) {
                .verdict = POOL_VERDICT_QUEUED,
                .pool = &p->base,
                .cookie = t->cookie,
                .at = now,
                .state = w->state,
                .idle = w->idle,
                .budget = w->budget,
                .waiter = w,
                .room = room, /* a gated try's: any other with room was granted above */
        });
        return 0;
}

static void local_withdraw(Pool *base, PoolWaiter *w, usec_t now) {
        LocalPool *p = POOL(base);
        p->latest = MAX(p->latest, now);
        waiter_unlink(p, w);
        waiter_free(w);
        lanes_gc(p);
}

static void local_release(Pool *base, PoolGrant *g, usec_t now) {
        LocalPool *p = POOL(base);
        p->latest = MAX(p->latest, now);
        rests_wake(p, now);
        for (unsigned i = 0; i < g->n_slots; i++) {
                PoolMemberLife *m = g->pos[i] < p->n_life_configured ? p->life + g->pos[i]
                                    : p->base.limit == 0 && grant_member(g, i) ? life_find(p, grant_member(g, i))
                                                                               : NULL;
                if (m)
                        m->held += usec_sub_unsigned(now, g->granted_at);
                slot_put(p, g->pos[i]);
                /* Out of memory: the slot is free at once rather than lost. */
                if (p->cooldown > 0)
                        (void) rest_begin(p, g->pos[i], usec_add(now, p->cooldown));
        }
        g->lane->used -= g->n_slots;
        list_unlink(&g->node);
        grant_free(g);
        lanes_gc(p);
}

/* A pool made for restored leases (theirs left the configuration: never configured, its limit 0) takes the
 * rules they were granted under (the union, if several were recorded) and lives for the members they hold: their
 * exit statuses then quarantine and restore as the configuration they were granted by said (SPEC §3.6), and the
 * engine tells these as a retired pool's, kept until the pool is back. A health job's member was quarantined when
 * it was granted. Out of memory: a member without a life here, whose lease's exit status then decides nothing. */
static void restore_lives(LocalPool *p, const PoolGrant *g, const EngineQuarantineRules *q) {
        if (p->base.limit > 0)
                return; /* configured: its own rules and members */
        if (q) {
                for (size_t k = 0; k < ELEMENTSOF(p->quarantine_codes); k++)
                        p->quarantine_codes[k] |= q->exit_codes[k];
                p->quarantine_after = MAX(q->after, 1u);
        }
        p->life_by_name = mfree(p->life_by_name); /* life_find() scans while lives are added */
        for (unsigned i = 0; i < g->n_slots; i++) {
                const char *name = grant_member(g, i);
                if (!name || life_find(p, name))
                        continue;
                PoolMemberLife *a = reallocarray(p->life, p->n_life + 1, sizeof(PoolMemberLife));
                if (!a)
                        break;
                p->life = a;
                a[p->n_life] = (PoolMemberLife) {
                        .member = strdup(name),
                        .exit_status = -1,
                        .quarantined = g->health,
                        .since = g->granted_at,
                };
                if (!a[p->n_life].member)
                        break;
                p->n_life++;
        }
        size_t *ix = reallocarray(NULL, MAX(p->n_life, (size_t) 1), sizeof(size_t));
        if (ix) /* out of memory: life_find() scans */
                life_index(p, ix);
}

static int local_restore(Pool *base, const PoolRestore *rs, PoolGrant **ret) {
        LocalPool *p = POOL(base);
        const char *lane = rs->lane;
        const unsigned *slots = rs->slots;
        const char *const *members = rs->members;
        unsigned n_slots = rs->n_slots;
        LocalLane *l = lane_find(p, lane);
        bool in_place = true, lane_gone = !l;
        int r;

        if (n_slots == 0)
                return -EINVAL;
        PoolGrant *g = grant_new(NULL, rs->token, n_slots, members != NULL);
        if (!g)
                return -ENOMEM;
        for (unsigned i = 0; i < n_slots; i++) {
                if (slots[i] >= 1u << 24) {
                        grant_free(g);
                        return -EINVAL;
                }
                g->indices[i] = slots[i];
                if (members && members[i] && !(g->members[i] = strdup(members[i]))) {
                        grant_free(g);
                        return -ENOMEM;
                }
                bool twice = slot_is_held(p, grant_member(g, i), slots[i]);
                for (unsigned k = 0; k < i && !twice; k++)
                        twice = slot_same(g, k, grant_member(g, i), slots[i]);
                if (twice) {
                        grant_free(g);
                        return -EEXIST;
                }
                unsigned home;
                if (!slot_home(p->base.members, grant_member(g, i), slots[i], &home) || slot_is_occupied(p, home))
                        in_place = false;
                else if ((r = ensure_capacity(p, home + 1)) < 0) {
                        grant_free(g);
                        return r;
                }
        }
        if (!l) {
                /* The lane is gone from the config: the slots are held under a lane that exists only for them. */
                r = lane_add(p, &(PoolLaneRule) { .lane = lane, .max_in_use = -1 }, &l);
                if (r < 0) {
                        grant_free(g);
                        return r;
                }
        }
        g->lane = l;
        g->granted_at = rs->granted_at;
        /* A health = yes lane's lease is a health job's; a health = also lane's may be either, and a lane no longer
         * configured's too: as recorded (not recorded, by a brokerd from before: ordinary). */
        g->health = lane_gone ? rs->health_known && rs->health
                              : l->health && (!l->health_also || (rs->health_known && rs->health));
        list_append(&p->grants, &g->node);
        if (in_place)
                for (unsigned i = 0; i < n_slots; i++) {
                        (void) slot_home(p->base.members, grant_member(g, i), slots[i], &g->pos[i]); /* checked above */
                        slot_take(p, g->pos[i]);
                }
        else {
                /* A slot without a place here (a member not configured), or whose place a slot above the limit
                 * sits on: everything is laid out again. Restore only. */
                Layout layout;
                p->in_use += n_slots;
                r = layout_plan(p, p->base.members, p->base.limit, &layout);
                if (r < 0) {
                        p->in_use -= n_slots;
                        list_unlink(&g->node);
                        grant_free(g);
                        return r;
                }
                layout_apply(p, &layout);
                rests_drop_held(p);
        }
        l->used += n_slots;
        if (rs->token >= p->next_token)
                p->next_token = rs->token + 1;
        restore_lives(p, g, rs->quarantine);
        *ret = g;
        return 0;
}

static void local_run(Pool *base, usec_t now) {
        LocalPool *p = POOL(base);
        p->latest = MAX(p->latest, now);
        rests_wake(p, now);
        dispatch_settle(p, now);
        /* Step 4: budgets that end at `now` (or were due earlier and are only now looked at), each refused at
         * its own deadline. A refused waiter may have held others back, so grant again after. */
        bool expired = false;
        HeapNode *n;
        while ((n = heap_peek(&p->deadlines)) && n->key <= now) {
                PoolWaiter *w = container_of(n, PoolWaiter, deadline_node);
                waiter_refuse(p, w, w->shed ? REFUSAL_SHED : REFUSAL_TIMEOUT, n->key);
                expired = true;
        }
        if (expired) {
                dispatch_settle(p, now);
                lanes_gc(p);
        }
        update_congestion(p, now);
}

/* A gated waiter's place (SPEC §3.5): its members, when it could be granted now, in `usable` (walk mode), or
 * false. at_once: the set is granted as it arrives (local_submit() found room for this part): it takes what
 * the queue leaves a newcomer, as a one-pool try with room does (and the scripts' set call, room_for()), not
 * what its own place would give it: a lane of higher priority than the waiters would take members that
 * those short of members set aside (SPEC §3.5, no barging per member). */
static bool waiter_ready(const LocalPool *p, const PoolWaiter *w, bool at_once, uint64_t *avail, uint64_t *usable,
                         size_t words, bool *ret_walked) {
        *ret_walked = p->n_selective > 0;
        if (p->base.drained || p->base.retired)
                return false;
        if (*ret_walked) {
                free_members(p, avail, words);
                if (at_once)
                        return !queue_walk(p, avail, usable, words, NULL, w, USEC_INFINITY) &&
                               member_verdict(p, w->lane, w->slots, w->bucket->mask, avail, usable, words) ==
                                       VERDICT_GRANTABLE;
                return queue_walk(p, avail, usable, words, w, NULL, USEC_INFINITY) == w;
        }
        Verdict v;
        return queue_next(p, INT32_MIN, &v) == w && v == VERDICT_GRANTABLE;
}

static bool local_ready(const Pool *base, const PoolWaiter *w) {
        const LocalPool *p = POOL(base);
        if (p->n_selective == 0 && !p->base.drained && !p->base.retired) {
                Verdict v; /* no member sets to walk: nothing to allocate */
                return queue_next(p, INT32_MIN, &v) == w && v == VERDICT_GRANTABLE;
        }
        size_t words = member_set_words(p->base.limit);
        _cleanup_free_ uint64_t *avail = calloc(words, sizeof(uint64_t)), *usable = calloc(words, sizeof(uint64_t));
        bool walked;
        if (!avail || !usable)
                return false; /* out of memory: not now; the next instant asks again */
        return waiter_ready(p, w, false, avail, usable, words, &walked);
}

static int local_grant_waiter(Pool *base, PoolWaiter *w, bool at_once, usec_t now) {
        LocalPool *p = POOL(base);
        p->latest = MAX(p->latest, now);
        size_t words = member_set_words(p->base.limit);
        _cleanup_free_ uint64_t *avail = calloc(words, sizeof(uint64_t)), *usable = calloc(words, sizeof(uint64_t));
        bool walked;
        if (!avail || !usable)
                return -ENOMEM;
        if (!waiter_ready(p, w, at_once, avail, usable, words, &walked))
                return -ESTALE;
        waiter_unlink(p, w);
        int r = waiter_grant(p, w, now, walked ? usable : NULL);
        free(w);
        lanes_gc(p);
        return r;
}

static usec_t local_next_wakeup(const Pool *base) {
        const LocalPool *p = POOL(base);
        usec_t t = USEC_INFINITY;
        HeapNode *n = heap_peek(&p->deadlines);
        if (n)
                t = n->key;
        /* A rest ends: its slot goes to the queue (and the gauge may turn off). Not a retired pool's: it has
         * neither (it refused its waiters); rests that ended while it was away end when a reload brings it back,
         * at the reload's instant (latest), not at one in the past, which the engine would settle after it. */
        if (!p->base.retired)
                t = MIN(t, MAX(p->next_wake, p->latest));
        /* The gauge turns on by itself when idle passes Q while there is no room. */
        if (!p->congested && p->base.queue_timeout_set && !p->base.drained && !p->base.retired &&
            !pool_has_room_for_one(p))
                t = MIN(t, MAX(usec_add(usec_add(p->last_fast, p->base.queue_timeout), 1), p->latest));
        return t;
}

static void drain_whole(LocalPool *p, bool on, usec_t now) {
        p->base.drained = on;
        /* In the scripts' order (drain.lua): the reservations first, as they are first in the queue (SPEC §3.6:
         * ahead of every waiting job), then each lane's queue, then the health lanes' waiters. */
        if (!on)
                return;
        for (int pass = 0; pass < 2; pass++)
                for (size_t i = 0; i < p->n_lanes; i++)
                        if (streq(p->lanes[i]->name, ENGINE_RESERVE_LANE) == (pass == 0))
                                lane_refuse_queued(p, p->lanes[i], NULL, now);
        health_refuse_waiters(p, NULL, NULL, now);
}

static int local_drain(Pool *base, const char *member, bool on, usec_t now) {
        LocalPool *p = POOL(base);
        p->latest = MAX(p->latest, now);

        if (!member) {
                drain_whole(p, on, now);
                return 0;
        }

        if (!strv_contains(p->base.members, member))
                return -ENOENT;
        bool was = strv_contains(p->drained_members, member);
        if (was == on)
                return 0;
        if (on) {
                size_t n = 0;
                while (p->drained_members && p->drained_members[n])
                        n++;
                char **l = reallocarray(p->drained_members, n + 2, sizeof(char *));
                if (!l)
                        return -ENOMEM;
                p->drained_members = l;
                if (!(l[n] = strdup(member)))
                        return -ENOMEM;
                l[n + 1] = NULL;
        } else {
                char **w = p->drained_members;
                for (char **i = p->drained_members; *i; i++)
                        if (streq(*i, member))
                                free(*i);
                        else
                                *w++ = *i;
                *w = NULL;
        }
        for (unsigned i = 0; i < p->base.limit; i++)
                if (streq(p->base.members[i], member))
                        p->member_drained[i] = on;
        recount_drained(p);
        return 0;
}

static size_t local_position(const Pool *base, const PoolWaiter *w, size_t *ret_queued) {
        const LocalPool *p = POOL(base);
        if (w->health) {
                size_t i = 0;
                if (ret_queued)
                        *ret_queued = p->n_health;
                list_foreach(n, &p->health) {
                        if (n == &w->fifo_node)
                                break;
                        i++;
                }
                return i;
        }
        if (ret_queued)
                *ret_queued = p->n_waiting;
        return rank_tree_rank(&p->queue, &w->rank_node);
}

static void local_info(const Pool *base, usec_t now, PoolInfo *ret) {
        const LocalPool *p = POOL(base);
        *ret = (PoolInfo) {
                .limit = p->base.limit,
                .in_use = p->in_use,
                .waiting = p->n_waiting + p->n_health,
                .congested = p->congested,
                .drained = p->base.drained,
                .queue_timeout_set = p->base.queue_timeout_set,
                .queue_timeout = p->base.queue_timeout,
                .idle = idle_at(p, now),
                .next_token = p->next_token,
                .drained_members = p->drained_members && p->drained_members[0] ? p->drained_members : NULL,
                .life = p->n_life_configured > 0 ? p->life : NULL,
                .n_life = p->n_life_configured,
                .resting = p->n_rests > 0 ? p->rests : NULL,
                .n_resting = p->n_rests,
                .cooldown = p->cooldown,
        };
}

static void local_report_exit(Pool *base, PoolGrant *g, int exit_status, const char *job, usec_t now) {
        LocalPool *p = POOL(base);
        p->latest = MAX(p->latest, now);
        for (unsigned i = 0; i < g->n_slots; i++) {
                const char *name = grant_member(g, i);
                PoolMemberLife *m = name ? life_find(p, name) : NULL;
                if (!m)
                        continue;
                /* health = also: the grant says which it is, not the member now (quarantined by hand meanwhile, it
                 * is not restored by an ordinary job's exit 0). */
                if (g->health) {
                        /* A health job's exit 0 restores; anything else leaves the member as it is. */
                        if (exit_status == 0 && m->quarantined)
                                (void) life_set(p, m, false, now, job, 0, NULL, now);
                        continue;
                }
                if (exit_status < 1 || exit_status > 255 ||
                    !((p->quarantine_codes[exit_status / 64] >> (exit_status % 64)) & 1)) {
                        m->failures = 0;
                        continue;
                }
                if (m->failures < UINT_MAX)
                        m->failures++;
                /* Out of memory: not quarantined now, the next failure tries again. */
                if (!m->quarantined && m->failures >= p->quarantine_after)
                        (void) life_set(p, m, true, now, job, exit_status, NULL, now);
        }
}

static int local_quarantine(Pool *base, const char *member, const EngineQuarantine *q, usec_t now) {
        LocalPool *p = POOL(base);
        p->latest = MAX(p->latest, now);
        if (!p->base.members)
                return -EOPNOTSUPP;
        PoolMemberLife *m = life_find(p, member);
        if (!m || (size_t) (m - p->life) >= p->n_life_configured)
                return -ENOENT;
        if (!q || q->restore)
                return m->quarantined ? life_set(p, m, false, now, q ? q->job : NULL, -1, NULL, now) : 0;
        if (m->quarantined)
                return 0; /* the first quarantine's who and why stay */
        int r = life_set(p, m, true, MIN(q->since, now), q->job, q->exit_status, q->reason, now);
        if (r >= 0)
                m->since_real = q->since_real;
        return r;
}

/* The member's life whose counts are kept (usage per member, its failures in a row): a configured member's, or
 * in a pool made for restored leases (never configured: restore_lives()) a member's they hold, so that the counts
 * the lease log has go on there and what their ends add is written back. NULL: none (-ENOENT). */
static PoolMemberLife *life_counted(LocalPool *p, const char *member) {
        PoolMemberLife *m = life_find(p, member);
        if (!m || p->base.limit == 0)
                return m;
        return (size_t) (m - p->life) < p->n_life_configured && !p->base.retired ? m : NULL;
}

static int local_set_use(Pool *base, const char *member, const EngineMemberUse *u) {
        LocalPool *p = POOL(base);
        if (!p->base.members && p->base.limit > 0)
                return -EOPNOTSUPP;
        PoolMemberLife *m = life_counted(p, member);
        if (!m)
                return -ENOENT;
        m->grants = u->grants;
        m->held = u->held;
        m->quarantines = u->quarantines;
        m->failures = u->failures;
        return 0;
}

static int local_get_use(const Pool *base, const char *member, EngineMemberUse *ret) {
        LocalPool *p = POOL((Pool *) base);
        if (!p->base.members && p->base.limit > 0)
                return -EOPNOTSUPP;
        const PoolMemberLife *m = life_counted(p, member);
        if (!m)
                return -ENOENT;
        *ret = (EngineMemberUse) {
                .grants = m->grants,
                .held = m->held,
                .quarantines = m->quarantines,
                .failures = m->failures,
        };
        return 0;
}

static bool local_grant_health(const Pool *base, const PoolGrant *g) {
        (void) base;
        return g->health;
}

static bool local_quarantine_rules(const Pool *base, EngineQuarantineRules *ret) {
        const LocalPool *p = POOL((Pool *) base);
        uint64_t any = 0;
        for (size_t k = 0; k < ELEMENTSOF(p->quarantine_codes); k++)
                any |= p->quarantine_codes[k];
        if (any == 0)
                return false;
        memcpy(ret->exit_codes, p->quarantine_codes, sizeof ret->exit_codes);
        ret->after = p->quarantine_after;
        return true;
}

static void local_set_token_floor(Pool *base, uint64_t next_token) {
        LocalPool *p = POOL(base);
        p->next_token = MAX(p->next_token, next_token);
}

static usec_t local_get_last_fast(const Pool *base) {
        return POOL(base)->last_fast;
}

/* The clock of the previous daemon: budgets given from now on, and the gauge, go on from it. */
static void local_set_last_fast(Pool *base, usec_t last_fast, usec_t now) {
        LocalPool *p = POOL(base);
        p->latest = MAX(p->latest, now);
        p->last_fast = MIN(last_fast, now);
        update_congestion(p, now);
}

static int local_rest(Pool *base, const char *member, unsigned index, usec_t until, usec_t now) {
        LocalPool *p = POOL(base);
        unsigned home;
        p->latest = MAX(p->latest, now);
        if (p->cooldown == 0 || until <= now || !slot_home(p->base.members, member, index, &home) ||
            home >= p->base.limit || slot_is_occupied(p, home))
                return -ENOENT;
        /* Never longer than the pool's cooldown from now: a clock gone wrong must not park a slot for good. */
        return rest_begin(p, home, MIN(until, usec_add(now, p->cooldown)));
}

static const PoolOps local_ops = {
        .kind = "local",
        .selectors = true,
        .free = local_free,
        .configure_prepare = local_configure_prepare,
        .configure_commit = local_configure_commit,
        .configure_abort = local_configure_abort,
        .retire = local_retire,
        .submit = local_submit,
        .withdraw = local_withdraw,
        .release = local_release,
        .restore = local_restore,
        .run = local_run,
        .next_wakeup = local_next_wakeup,
        .drain = local_drain,
        .position = local_position,
        .info = local_info,
        .set_token_floor = local_set_token_floor,
        .get_last_fast = local_get_last_fast,
        .set_last_fast = local_set_last_fast,
        .ready = local_ready,
        .grant_waiter = local_grant_waiter,
        .report_exit = local_report_exit,
        .quarantine = local_quarantine,
        .set_use = local_set_use,
        .get_use = local_get_use,
        .grant_health = local_grant_health,
        .quarantine_rules = local_quarantine_rules,
        .rest = local_rest,
};

int pool_local_new(const char *name, PoolEmitFn emit, void *emit_userdata, Pool **ret) {
        LocalPool *p = calloc(1, sizeof(LocalPool));
        if (!p)
                return -ENOMEM;
        p->base = (Pool) { .ops = &local_ops, .emit = emit, .emit_userdata = emit_userdata };
        p->base.name = name;
        list_init(&p->grants);
        list_init(&p->health);
        p->quarantine_after = 1;
        p->next_token = 1;
        p->max_queue = -1;
        heap_init(&p->deadlines);
        p->next_wake = USEC_INFINITY; /* no rest: nothing to wake for, even before the first configuration */
        *ret = &p->base;
        return 0;
}
