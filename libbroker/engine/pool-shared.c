/* SPDX-License-Identifier: MIT */
/* pool-shared.c — a pool kept in Redis, the pure half (pool-shared.h): commands out as script calls,
 * replies and stream entries in as decisions, this node's mirror, the failure states of memo §4.7. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "list.h"
#include "macro.h"
#include "pool-shared.h"
#include "shared-reply.h"
#include "shared-rules.h"
#include "strv.h"

/* Untrusted input (SPEC §11): how many rids this node sent and forgot are remembered (a grant for one is
 * released; one for a rid never sent is dropped), and as many grants whose leases ended here (a late copy of
 * one is no bad input), how often a BAD_INPUT notice may be pushed, the largest token (Lua's numbers are
 * doubles), and the longest strings kept from a reply. */
#define RID_RING_SIZE 256
#define BAD_INPUT_NOTICE_EVERY (60 * USEC_PER_SEC)
#define TOKEN_MAX (UINT64_C(1) << 53) /* exact in Lua's doubles and RESP (lua/README, "Conventions") */
#define STREAM_ID_LEN_MAX 41
#define DIFFERING_KEYS_MAX 64
#define SUBMIT_ARG_FRESH 15    /* lua/submit.lua's ARGV[15] */

/* The outbox: every call stays here from queueing until its answer, in send order. */
typedef struct Call {
        ListNode node;
        uint64_t id;
        uint64_t order;        /* SharedPoolParams.call_order when queued */
        SharedScript script;
        bool sent;             /* taken and not answered */
        bool ever_sent;        /* may have run: a submit dropped afterwards needs a withdraw */
        bool resumed;          /* submit under a resumed waiter's old rid: a reconcile sent may have kept it */
        bool again;            /* submit of a waiter whose record Redis lost (waiter_resubmit()): Redis may hold it */
        bool run;              /* tick: the engine's run(), whose answer next_wakeup() waits for */
        bool reconcile;        /* tick carrying a reconcile page */
        bool keep_leases;      /* its page was made while the node could not account: "k" whenever it goes */
        bool wait;             /* WAIT (backend-min-replicas), not a script: argv is the command */
        bool held;             /* answered with an error or garbage: sent again after the next heartbeat */
        uint64_t *members;     /* a batch (SHARED_SCRIPT_BATCH): its calls' ids, in order; it is in p->batches */
        size_t n_members;
        uint32_t members_unsent; /* bit i: member i was never sent before this batch (ever_sent back if not run) */
        char rid[SHARED_RID_LEN + 1]; /* submit, release, withdraw, reclaim, set */
        unsigned n_keys;       /* KEYS: 1, or a set's pools (SHARED_SCRIPT_SET) */
        char **set_pools;      /* a set: its pools' names, KEYS' order, this pool first */
        usec_t sent_at;        /* monotonic: the round trip is measured from here */
        /* The arguments' bytes, each NUL-terminated, in one allocation (args); argv points into it, argoff
         * says where, so that argv is made again when args moves. A call's arguments take four allocations
         * whatever their number (and their growth), where one an argument (twice for a batched one: its own,
         * the batch's copy) was a twentieth of a shared brokerd's CPU (issue 21). An argument made anew at
         * sending (call_set_arg(): a changed run id, a flag) is appended; the old bytes stay until the call
         * is freed. */
        char **argv;
        size_t *argvlen, *argoff;
        size_t argc, allocated;
        char *args;
        size_t args_len, args_allocated;
        SharedCall view;
} Call;

/* A grant that Redis made and this node has not answered yet: backend-min-replicas holds it until the
 * WAIT of wait_id says that enough replicas have its lease. What the answer needs of the decision is kept. */
typedef struct Replicating {
        PoolGrant *grant;      /* NULL: not granted (yet) */
        uint64_t wait_id;
        usec_t at, idle, budget, wait;
        QueueState state;
} Replicating;

/* This node's request, from submit() until its final decision (or withdraw/cancel). */
struct PoolWaiter {
        ListNode node;
        char rid[SHARED_RID_LEN + 1];
        void *cookie;
        char *lane;            /* its grant's, for a reclaim */
        unsigned k;            /* slots asked for: a grant must have exactly these many */
        usec_t arrival;
        bool queued;           /* QUEUED was emitted: it counts in the fingerprint as "w" */
        bool gated;            /* a set's part (PoolTry.gated): its set's call grants it, never its pool alone */
        bool ready;            /* gated: said "ready" since the set's last grant found it not (ready()) */
        bool in_call;          /* gated: a call of its set is out or to be sent again: only its answer grants it */
        size_t position, n_queued;
        Replicating replicating; /* granted in Redis, held for the replicas: counts as "l" */
        /* What its submit said besides rid, lane, k and arrival: sent again as it was when Redis lost its
         * record (waiter_resubmit()). */
        bool may_wait, lane_budget_set;
        usec_t lane_budget, client_cap;
        char *selector;        /* ARGV[14], NULL: none */
        uint64_t generation;   /* SharedPool.generation when Redis last said it had it (or it was sent again) */
        unsigned resubmits;    /* sent again so far (SHARED_RESUBMITS_MAX) */
        /* A resumed waiter's deadline (local monotonic; USEC_INFINITY: not resumed, or no budget), and what
         * it had when it first joined the queue: Redis may have lost it (deadline_refuse()). */
        usec_t deadline;
        Refusal deadline_refusal; /* timeout or shed */
        QueueState resumed_state;
        usec_t resumed_idle, resumed_budget;
};

struct PoolGrant {
        ListNode node;
        char rid[SHARED_RID_LEN + 1];
        char *remote_id;       /* "NODE:RID" */
        void *cookie;
        char *lane;
        uint64_t token;
        usec_t granted_at;     /* pool clock */
        unsigned n_slots;
        unsigned *slots;
        char **members;        /* NULL, or n_slots names */
        bool provisional;      /* restored or to be reclaimed: the reclaim has not answered */
        bool lost;             /* LOST was emitted */
        bool freed_remotely;   /* Redis no longer has it: not in the fingerprint */
        int exit_status;       /* its command's, told before release() (report_exit(), SPEC §3.6); -1: none */
        char *exit_job;
        usec_t counted_at;     /* engine clock: its hold counts from here for its members (SPEC §3.6, usage) */
};

typedef struct Fingerprint {
        uint64_t n;
        uint32_t x, s;
} Fingerprint;

typedef struct NoticeNode {
        ListNode node;
        SharedNotice notice;
} NoticeNode;

/* The last RID_RING_SIZE request ids added (with a grant's token, or 0), oldest overwritten first. */
typedef struct RidRing {
        struct {
                char rid[SHARED_RID_LEN + 1];
                uint64_t token;
        } entries[RID_RING_SIZE];
        size_t n;
} RidRing;

/* The pool-wide figures of the last reply (README: the reply's [5]). */
typedef struct Cache {
        bool valid;
        uint64_t in_use, waiting;
        unsigned limit;        /* the stored rules' (0: not said), which a node whose rules differ does not have */
        bool congested;
        usec_t idle;
        int64_t next_wakeup;   /* pool clock, -1 none */
        int64_t gauge_at;      /* pool clock: when idle passes Q and the gauge turns on by itself, -1 none */
        int64_t rest_at;       /* pool clock: the end of the first rest listed, -1 none */
        uint64_t counter;
        char *epoch;
        int64_t recovery_until; /* pool clock, 0 none */
        char *stream_last;     /* the last entry a reply said it appended to this node's stream */
        usec_t at;             /* monotonic, when it came */
        /* Resting slots (cooldown=, SPEC §3.6), as the last reply listed them (cache [13]): every node's Status
         * shows the pool's; `until` in this node's monotonic clock, member names owned. */
        PoolRest *rests;
        size_t n_rests;
} Cache;

typedef struct SharedPool {
        Pool base;
        SharedPoolParams params;
        char *key;             /* "{sb:NAME}" */
        char *node_arg;        /* ARGV[2]: the node id, or "ID/INCARNATION/PREVIOUS,…" */
        bool identity_conflict; /* Redis refused this incarnation (status "identity"): only ticks go */
        char *stream_key;
        char *stream_resume;
        char *run_id;          /* the link's, as last seen */
        /* Counts the changes of what Redis's data comes from: the run id (a restart, a failover) and the
         * pool's epoch (made anew: FLUSHALL, keys lost). A waiter Redis knew in an earlier one and forgot
         * since was lost with the data, not dropped with this node (waiter_resubmit()). */
        uint64_t generation;
        char *seen_epoch;
        SharedState state;
        bool link_up;

        char **lanes;          /* the configured lanes, for submit()'s check */
        usec_t cooldown;       /* cooldown= (a rule: in the canon); 0 none */
        bool congestion_timeout_set; /* queue-congestion-timeout= (a rule): the saturated budget */
        usec_t congestion_timeout;
        char *canon;
        /* The node TTL the self-fence counts with: params.node_ttl once Redis agreed to the rules that carry
         * it, the shorter of the old and the new one while a reload's change waits for agreement (Redis
         * drops this node by the stored rules' TTL until then). */
        usec_t fence_ttl;

        List tries, grants, outbox, notices;
        List batches;          /* batches sent and not answered (Call, SHARED_SCRIPT_BATCH); members stay in outbox */
        List held;             /* manual mode: stream entries that came while a call was out (HeldEntry) */
        uint64_t next_call_id;
        Fingerprint fp;
        unsigned fp_mismatches;
        char *reconcile_from;  /* a paged reconcile in progress: the next page starts here */
        usec_t reconciled_at;  /* monotonic: the last whole reconcile done or fingerprint compared; 0 none */
        /* The node cannot account for its leases (its state not read, or damaged: SPEC §3.4): a reconcile
         * leaves the leases Redis holds for it and it does not list as they are (ARGV[13] "…k"). */
        bool records_unknown;
        bool reconcile_kept;   /* a page of the reconcile in progress kept what it missed ("k") */
        /* What Redis keeps for it meanwhile: the leases the last whole reconcile's pages kept, added to this
         * node's own fingerprint when it is compared with Redis's (lua/README, "Orphans"). */
        Fingerprint kept;
        Fingerprint kept_next; /* the same, summed over the pages of the reconcile in progress */

        Cache cache;
        bool congested;        /* as last emitted */
        /* Monotonic: when the pool last came into this node's configuration (made, or back after a reload removed
         * it). A flip Redis dates before it is the pool's history while it was not here, settled by the first
         * call after: an in-process pool then had no gauge (pool-local.c:congested_at()), nor has this node. */
        usec_t gauge_from;
        bool tick_pending;     /* a tick is in the outbox */
        bool send_first;       /* a refusal it emitted withdraws its try: pool_shared_take_send_first() */
        uint64_t send_through; /* the calls of order ≤ this go at once, one out or not (send_queued_now()) */
        unsigned settling;     /* "settling" answers in a row (settling_hold()) */
        usec_t settling_pause; /* until then a call answered "settling" is held, and no tick goes */
        bool run_pending;      /* a run() tick is in the outbox: next_wakeup() says USEC_INFINITY */
        bool reclaim_all;      /* the run id or the epoch changed: every lease is reclaimed */
        int64_t recovery_noticed; /* the end of the last recovery window journaled (pool clock) */
        usec_t last_tick;      /* monotonic, queued */
        usec_t fp_renewed_at;  /* monotonic: a renewal's fingerprint agreed (pool_shared_renewal_fingerprint()) */
        usec_t down_since;     /* monotonic, USEC_INFINITY: up (or never was) */
        usec_t acked_boot;     /* CLOCK_BOOTTIME send time of the last acknowledged tick or covering renewal */
        bool renew_ok;         /* its last tick was answered "ok"/"rules" since the link came up: renewable */
        usec_t renewed_at;     /* monotonic: the last renewal that covered it answered; 0 none since */
        usec_t renew_stale;    /* the covering renewal's period + SHARED_RENEW_STALE: no renewal since, not covered */
        bool tick_wanted;      /* a renewal asked for a tick (a dead node to reap, the idle period), or a reload
                                * could not queue its rules: at once */
        usec_t stale_ack;      /* vouch_base() when its vouch deadline passed and the waiters were refused */
        usec_t alive_boot;     /* a restarted daemon's last proof of life (set_last_ack()), USEC_INFINITY: none */
        /* Before this object first served (a brokerd just started, a pool just added: registered with agreed
         * rules and, behind Sentinels, on a primary a majority of them confirmed), requests that may wait and
         * waiters resumed after a restart wait for it (monotonic, since when; USEC_INFINITY: none, or served
         * since): an outage like a link down, so the waiter grace bounds it. */
        usec_t start_since;
        bool served;           /* it served once: a later outage is a link down, refused at once */
        /* Behind Sentinels (params.confirm_stale > 0): the start of the last round in which a majority of
         * them named a primary of this pool (CLOCK_BOOTTIME, 0: none yet; it only grows: the self-fence counts
         * from it), that of the primary in use (0: none, or one Sentinel's word that no round confirmed: the
         * pool is served on nothing else), and since when (monotonic) the latter is too old to grant on
         * (USEC_INFINITY: it is recent, or no confirmation is asked for). */
        usec_t confirmed_boot;
        usec_t primary_confirmed_boot;
        usec_t unconfirmed_since;
        bool unconfirmed_noticed; /* an UNCONFIRMED notice was pushed and not yet followed by CONFIRMED */
        /* The driver's rounds rest while this node holds nothing (pool_shared_set_confirm_resting()): the
         * confirmation is then taken as stale, quietly (confirm_quiet: no notice, Status says served, and any
         * request is held, fail-fast ones too, until the round the next request wakes ends). */
        bool confirm_resting;
        bool confirm_quiet;
        /* Above every token this node passed on (its grants, its restored leases, the persisted mark at
         * restart): sent with every tick, so that a Redis that lost the pool (and whose clock is behind)
         * never issues a token below it (SPEC §11, "Tokens never go back"). 0: none known yet. */
        uint64_t token_floor;
        int64_t offset;        /* pool clock − monotonic, from the last round trip */
        bool offset_known;
        usec_t rtt;
        unsigned n_nodes;
        char **differing_keys;
        const char *unavailable; /* static: the reason refusals carry */
        unsigned min_replicas;   /* backend-min-replicas: 0, grants are answered at once */
        usec_t min_replicas_timeout;
        int replicas_acked;      /* the last WAIT's answer; -1: none */
        char *refused_why;       /* REFUSED: what the link or Redis said ("eviction-policy", "manual-clock") */

        size_t positions_cursor; /* the refresh of waiters' places goes round, a page a heartbeat */
        bool served_at_run;      /* pool_serves() at the last run(): sets_say_ready_again() when it turns */

        /* SPEC §3.6: the members' quarantines as the last reply's cache said (every reply carries them, so
         * every node shows and obeys the same: brokerd/lua/README, "Members' lives"); life[i] is member i. */
        PoolMemberLife *life;
        size_t n_life;
        /* Members a reload dropped: this node's counts of them (grants, held, quarantines; member and these
         * only), for a reload that lists them again, as a local pool keeps them (SPEC §3.6). */
        PoolMemberLife *gone;
        size_t n_gone;
        /* SPEC §3.6: the drains Redis keeps with who, why, since and until (the cache's [15]; their strings
         * owned: member, who, reason), since and until monotonic. */
        EngineDrainInfo *drains;
        size_t n_drains;
        /* The strings of the MEMBER decisions emitted (job, reason): a decision's strings must outlive the
         * emit (the engine queues it by value and reads them when it processes it), so the last 64 are kept, in a ring; a notice is rare (a quarantine, a restore), the engine takes its decisions
         * after every reply. */
        char *emitted[64];
        size_t emitted_next;

        /* Input that failed validation: counted, told at most once a minute (SPEC §11). */
        uint64_t bad_input;
        uint64_t bad_input_untold;   /* dropped since the last notice */
        usec_t bad_input_told;       /* monotonic, the last notice; USEC_INFINITY: none yet */
        /* The rids this node sent and then forgot (withdrawn, cancelled, refused here). */
        RidRing forgotten;
        /* The grants whose leases ended here (released, lost): the stream's copy of one may be read after its
         * end (the reply applied it and its holder went at once). */
        RidRing ended;

        /* Status: the holders and waiters of every node, fetched every second while someone looks. */
        bool status_wanted;     /* snapshot() was asked since the last run() */
        bool status_pending;    /* a status call is in the outbox */
        usec_t status_until;    /* keep fetching until then */
        usec_t status_last;     /* monotonic, the last fetch queued */
        usec_t last_now;        /* the latest `now` seen, for the snapshot's age */
        bool snap_valid;
        usec_t snap_at;         /* when the call that fetched it was queued */
        usec_t snap_asked;      /* the pending status call's queueing */
        PoolSnapshotEntry *snap_holders, *snap_waiters;
        size_t n_snap_holders, n_snap_waiters, snap_waiting;
} SharedPool;

static const PoolOps shared_ops;

static SharedPool *SHARED(const Pool *p) {
        return (SharedPool *) p;
}

static const char *const shared_script_table[_SHARED_SCRIPT_MAX] = {
        [SHARED_SCRIPT_SUBMIT] = "submit",
        [SHARED_SCRIPT_RELEASE] = "release",
        [SHARED_SCRIPT_WITHDRAW] = "withdraw",
        [SHARED_SCRIPT_TICK] = "tick",
        [SHARED_SCRIPT_RECLAIM] = "reclaim",
        [SHARED_SCRIPT_DRAIN] = "drain",
        [SHARED_SCRIPT_POSITIONS] = "positions",
        [SHARED_SCRIPT_QUARANTINE] = "quarantine",
        [SHARED_SCRIPT_BATCH] = "batch",
        [SHARED_SCRIPT_SET] = "set",
};

DEFINE_STRING_TABLE_TO_STRING(, shared_script, SharedScript, _SHARED_SCRIPT_MAX)

static const char *const shared_state_table[_SHARED_STATE_MAX] = {
        [SHARED_STATE_CONNECTING] = "connecting",
        [SHARED_STATE_REGISTERING] = "registering",
        [SHARED_STATE_RECLAIMING] = "reclaiming",
        [SHARED_STATE_UP] = "up",
        [SHARED_STATE_MISMATCH] = "mismatch",
        [SHARED_STATE_DOWN] = "down",
        [SHARED_STATE_FENCED] = "fenced",
        [SHARED_STATE_REFUSED] = "refused",
};

DEFINE_STRING_TABLE_TO_STRING(, shared_state, SharedState, _SHARED_STATE_MAX)

void shared_notice_done(SharedNotice *n) {
        if (!n)
                return;
        n->node = mfree(n->node);
        n->detail = mfree(n->detail);
}

/* ---------------------------------------------------------------------------------------- fingerprint */

/* README "Fingerprint": FNV-1a 32 over RID then the kind letter. */
static uint32_t fnv1a32(const char *rid, char kind) {
        uint32_t h = 2166136261u;
        for (const char *c = rid; *c; c++)
                h = (h ^ (uint8_t) *c) * 16777619u;
        return (h ^ (uint8_t) kind) * 16777619u;
}

static void fp_add(SharedPool *p, const char *rid, char kind) {
        uint32_t h = fnv1a32(rid, kind);
        p->fp.n++;
        p->fp.x ^= h;
        p->fp.s += h;
}

/* The fingerprint of the records of a and of b together. */
static Fingerprint fp_sum(Fingerprint a, Fingerprint b) {
        return (Fingerprint) { .n = a.n + b.n, .x = a.x ^ b.x, .s = a.s + b.s };
}

/* Redis's triple for this node (untrusted: a negative value is no count) equals this node's own, with the
 * leases Redis keeps for it while it cannot account for them. */
static bool fp_equals(const SharedPool *p, int64_t n, int64_t x, int64_t s) {
        Fingerprint want = fp_sum(p->fp, p->kept);
        return n >= 0 && (uint64_t) n == want.n && x >= 0 && (uint32_t) x == want.x && s >= 0 &&
               (uint32_t) s == want.s;
}

/* A fingerprint triple from Redis (untrusted): a count and two 32-bit values. */
static bool fp_read(const RespValue *v, Fingerprint *ret) {
        int64_t n, x, s;
        if (!resp_int(resp_at(v, 0), &n) || !resp_int(resp_at(v, 1), &x) || !resp_int(resp_at(v, 2), &s) ||
            n < 0 || x < 0 || x > UINT32_MAX || s < 0 || s > UINT32_MAX)
                return false;
        *ret = (Fingerprint) { .n = (uint64_t) n, .x = (uint32_t) x, .s = (uint32_t) s };
        return true;
}

static void fp_remove(SharedPool *p, const char *rid, char kind) {
        uint32_t h = fnv1a32(rid, kind);
        p->fp.n--;
        p->fp.x ^= h;
        p->fp.s -= h;
}

/* ------------------------------------------------------------------------------------------- notices */

static void notice_push(SharedPool *p, SharedNoticeType type, const char *node, const char *detail,
                        uint64_t leases, uint64_t waiters) {
        NoticeNode *n = calloc(1, sizeof(NoticeNode));
        if (!n)
                return; /* a notice is for people; the pool's state does not depend on it */
        n->notice = (SharedNotice) {
                .type = type,
                .node = node ? strdup(node) : NULL,
                .detail = detail ? strdup(detail) : NULL,
                .freed_leases = leases,
                .freed_waiters = waiters,
        };
        list_append(&p->notices, &n->node);
}

bool pool_shared_pop_notice(Pool *base, SharedNotice *ret) {
        SharedPool *p = SHARED(base);
        ListNode *n = list_first(&p->notices);
        if (!n)
                return false;
        list_unlink(n);
        NoticeNode *nn = container_of(n, NoticeNode, node);
        *ret = nn->notice;
        free(nn);
        return true;
}

/* -------------------------------------------------------------------------------------------- outbox */

static Call *call_free(Call *c) {
        if (!c)
                return NULL;
        if (list_node_is_linked(&c->node))
                list_unlink(&c->node);
        free(c->args);
        free(c->argv);
        free(c->argvlen);
        free(c->argoff);
        free(c->members);
        strv_free(c->set_pools);
        return mfree(c);
}

/* A decimal number into buf (≥ 21 bytes), without printf's machinery; its length. */
static size_t u64_format(char *buf, uint64_t u, bool negative) {
        char tmp[20];
        size_t n = 0, len = 0;
        do
                tmp[n++] = (char) ('0' + u % 10);
        while ((u /= 10) > 0);
        if (negative)
                buf[len++] = '-';
        while (n > 0)
                buf[len++] = tmp[--n];
        buf[len] = '\0';
        return len;
}

/* "%016" PRIx64, without printf. */
static void rid_format(char rid[static SHARED_RID_LEN + 1], uint64_t x) {
        for (size_t i = SHARED_RID_LEN; i > 0; i--, x >>= 4)
                rid[i - 1] = "0123456789abcdef"[x & 0xf];
        rid[SHARED_RID_LEN] = '\0';
}

/* The formats that every call's arguments use, made without vasprintf() (a fifth of a shared pool's cost
 * per message in brokerd, issue 21: tests/bench/README.md): *ret points to the text (the argument itself, or
 * num). 1: made; 0: another format. */
static int arg_format_fast(const char *fmt, va_list ap, char num[static 24], const char **ret, size_t *ret_len) {
        const char *s = NULL;
        size_t len;
        if (!strchr(fmt, '%'))
                s = fmt;
        else if (streq(fmt, "%s"))
                s = va_arg(ap, const char *);
        if (s) {
                len = strlen(s);
        } else if (streq(fmt, "%d")) {
                int i = va_arg(ap, int);
                len = u64_format(num, i < 0 ? -(uint64_t) i : (uint64_t) i, i < 0);
        } else if (streq(fmt, "%u")) {
                len = u64_format(num, va_arg(ap, unsigned), false);
        } else if (streq(fmt, "%zu")) {
                len = u64_format(num, va_arg(ap, size_t), false);
        } else if (streq(fmt, "%" PRIu64)) {
                len = u64_format(num, va_arg(ap, uint64_t), false);
        } else if (streq(fmt, "%" PRId64)) {
                int64_t i = va_arg(ap, int64_t);
                len = u64_format(num, i < 0 ? -(uint64_t) i : (uint64_t) i, i < 0);
        } else
                return 0;
        *ret = s ?: num;
        *ret_len = len;
        return 1;
}

/* len bytes of s, and a NUL, after c's other arguments' bytes (argv made again if they moved); where. */
static int call_args_append(Call *c, const char *s, size_t len, size_t *ret_off) {
        if (len >= c->args_allocated - c->args_len) {
                size_t n = MAX(MAX(c->args_allocated * 2, (size_t) 256), c->args_len + len + 1);
                char *a = realloc(c->args, n);
                if (!a)
                        return -ENOMEM;
                c->args = a;
                c->args_allocated = n;
                for (size_t i = 0; i < c->argc; i++)
                        c->argv[i] = a + c->argoff[i];
        }
        memcpy(c->args + c->args_len, s, len);
        c->args[c->args_len + len] = '\0';
        *ret_off = c->args_len;
        c->args_len += len + 1;
        return 0;
}

static int call_add(Call *c, const char *fmt, ...) _printf_(2, 3);
static int call_add(Call *c, const char *fmt, ...) {
        if (c->argc == c->allocated) {
                size_t n = MAX(c->allocated * 2, (size_t) 24); /* a submit has 17 */
                char **a = realloc(c->argv, n * sizeof(char *));
                if (!a)
                        return -ENOMEM;
                c->argv = a;
                size_t *l = realloc(c->argvlen, n * sizeof(size_t));
                if (!l)
                        return -ENOMEM;
                c->argvlen = l;
                size_t *o = realloc(c->argoff, n * sizeof(size_t));
                if (!o)
                        return -ENOMEM;
                c->argoff = o;
                c->allocated = n;
        }
        va_list ap;
        va_start(ap, fmt);
        char num[24];
        const char *text = NULL;
        size_t len = 0;
        int r = arg_format_fast(fmt, ap, num, &text, &len);
        va_end(ap);
        _cleanup_free_ char *made = NULL;
        if (r == 0) {
                va_start(ap, fmt);
                r = vasprintf(&made, fmt, ap);
                va_end(ap);
                if (r < 0)
                        return -ENOMEM;
                text = made;
                len = (size_t) r;
        }
        size_t off;
        if ((r = call_args_append(c, text, len, &off)) < 0)
                return r;
        c->argoff[c->argc] = off;
        c->argv[c->argc] = c->args + off;
        c->argvlen[c->argc++] = len;
        return 0;
}

/* The pool clock for `now`: the engine's own in the manual mode, else mapped by the last round trip. */
static int64_t pool_clock_of(const SharedPool *p, usec_t now) {
        return p->params.manual_clock ? (int64_t) now : (int64_t) now + p->offset;
}

/* A pool-clock time on the local monotonic clock, clamped into [lo, hi]. */
static usec_t local_time_of(const SharedPool *p, int64_t t, usec_t lo, usec_t hi) {
        int64_t l = t;
        /* t is Redis's (untrusted): INT64_MIN or INT64_MAX must not overflow the mapping. */
        if (!p->params.manual_clock && p->offset_known && __builtin_sub_overflow(t, p->offset, &l))
                l = t < 0 ? INT64_MIN : INT64_MAX;
        usec_t u = l < 0 ? 0 : (usec_t) l;
        if (!p->params.manual_clock && !p->offset_known)
                u = hi;
        return MIN(MAX(u, lo), hi);
}

/* A call with the ARGV head of every script (README, "The ARGV head"). */
/* A call whose KEYS are these pools' prefixes (a set's: this pool first), then the head. */
static int call_new_keys(SharedPool *p, SharedScript script, SharedPool *const *pools, size_t n_keys, bool settle,
                         usec_t now, Call **ret) {
        _cleanup_(freep) Call *c = calloc(1, sizeof(Call));
        if (!c)
                return -ENOMEM;
        c->script = script;
        c->n_keys = (unsigned) n_keys;
        p->last_now = MAX(p->last_now, now);
        int r = 0;
        for (size_t i = 0; r >= 0 && i < n_keys; i++)
                r = call_add(c, "%s", pools[i]->key);
        if (r < 0 ||
            (r = call_add(c, "1")) < 0 ||
            (r = call_add(c, "%s", p->node_arg)) < 0 ||
            (p->params.manual_clock ? (r = call_add(c, "%" PRIu64, now)) : (r = call_add(c, "-"))) < 0 ||
            (r = call_add(c, "%s", p->run_id ?: "")) < 0 ||
            (r = call_add(c, "%d", settle)) < 0) {
                Call *tmp = TAKE_PTR(c);
                call_free(tmp);
                return r;
        }
        *ret = TAKE_PTR(c);
        return 0;
}

static int call_new(SharedPool *p, SharedScript script, bool settle, usec_t now, Call **ret) {
        return call_new_keys(p, script, &p, 1, settle, now, ret);
}

/* Production calls are their own instant; in the manual mode the engine's run(now) completes it. */
static bool op_settles(const SharedPool *p) {
        return !p->params.manual_clock;
}

/* The next number of the link's count (SharedPoolParams.call_order), or `own` without one. */
static uint64_t call_order_next(SharedPool *p, uint64_t own) {
        return p->params.call_order ? ++*p->params.call_order : own;
}

static void call_queue(SharedPool *p, Call *c) {
        c->id = ++p->next_call_id;
        c->order = call_order_next(p, c->id);
        list_append(&p->outbox, &c->node);
        if (p->params.wake)
                p->params.wake(p->params.wake_userdata);
}

static Call *call_find(SharedPool *p, uint64_t id) {
        list_foreach(n, &p->outbox) {
                Call *c = container_of(n, Call, node);
                if (c->id == id)
                        return c;
        }
        return NULL;
}

static bool state_sends_operations(SharedState s) {
        return s == SHARED_STATE_UP || s == SHARED_STATE_RECLAIMING;
}

/* Whether this node serves the pool now: registered with agreed rules, and, behind Sentinels, on a primary
 * that a majority of them named recently. */
static bool pool_serves(const SharedPool *p) {
        return state_sends_operations(p->state) && p->unconfirmed_since == USEC_INFINITY;
}

/* It would serve but for a confirmation left stale while the Sentinels' rounds rested: a request is held for
 * the round it wakes. */
static bool pool_confirm_rests(const SharedPool *p) {
        return state_sends_operations(p->state) && p->unconfirmed_since != USEC_INFINITY && p->confirm_quiet;
}

/* Status reads such a pool as served when a round did confirm the primary in use before the rest; one that a
 * single Sentinel named meanwhile (its +switch-master) is unconfirmed there, as it is to a node that asks. */
static bool pool_confirm_rests_served(const SharedPool *p) {
        return pool_confirm_rests(p) && p->primary_confirmed_boot > 0;
}

/* Status's fetch of who holds and waits decides nothing: it goes while the pool serves, and while an idle
 * node's confirmation rests. */
static bool pool_fetches_status(const SharedPool *p) {
        return pool_serves(p) || pool_confirm_rests(p);
}

/* Whether this node gives back to Redis now what it holds or awaits there (its releases and withdrawals): while
 * it serves the pool, and also while its rules differ from the stored ones. Those refuse new requests only: the
 * node is registered and heartbeating, so Redis would never reap what it keeps of it, and a lease ended or a
 * waiter refused here would hold its slot (or be granted one) for as long as the rules differ, on every node
 * (release.lua and withdraw.lua ask nothing of the rules). Not a node that Redis reaped ("canon": no rules). */
static bool pool_gives_back(const SharedPool *p) {
        return pool_serves(p) ||
               (p->state == SHARED_STATE_MISMATCH && p->canon && p->unconfirmed_since == USEC_INFINITY);
}

/* Whether call c may go now: a tick whenever the link is up; a release or withdrawal while the node gives back;
 * the others while it serves the pool. */
static bool call_may_go(const SharedPool *p, const Call *c) {
        if (c->script == SHARED_SCRIPT_TICK || pool_serves(p))
                return true;
        if (c->script == SHARED_SCRIPT_POSITIONS && streq(c->argv[6], "status") && pool_fetches_status(p))
                return true;
        return (c->script == SHARED_SCRIPT_RELEASE || c->script == SHARED_SCRIPT_WITHDRAW) && pool_gives_back(p);
}

/* Why requests are refused (NULL: the pool is served): the state's word first, then "unconfirmed". */
static const char *unavailable_reason(const SharedPool *p) {
        if (p->unavailable)
                return p->unavailable;
        return p->unconfirmed_since != USEC_INFINITY ? "unconfirmed" : NULL;
}

/* Since when (monotonic) the pool has been refused for a cause its waiters should not outwait: the link
 * down, the primary unconfirmed, or the start. USEC_INFINITY: none. A primary never confirmed yet (a start
 * behind Sentinels: unconfirmed_since is 0) is the start's wait, counted from the first try held, not
 * "since ever". */
static usec_t outage_since(const SharedPool *p) {
        /* A confirmation left stale by a rest is no outage: the hold counts from the first request held. */
        usec_t unconfirmed = p->confirmed_boot == 0 || p->confirm_quiet ? USEC_INFINITY : p->unconfirmed_since;
        return MIN(MIN(p->down_since, unconfirmed), p->start_since);
}

/* The pool serves for the first time: the start's wait is over. */
static void served_check(SharedPool *p) {
        if (!pool_serves(p))
                return;
        p->start_since = USEC_INFINITY;
        p->served = true;
}

/* The driver's `now` (pool_shared_call_done(), link_up(), …) is the local monotonic clock. In the manual
 * mode the engine's is the only clock, and it stands at the last `now` the engine gave: a reply handled
 * later in real time must neither move the pool clock nor date a decision by it (memo §3.10). */
static usec_t driver_now(const SharedPool *p, usec_t now) {
        return p->params.manual_clock ? p->last_now : now;
}

static bool has_provisional(const SharedPool *p) {
        list_foreach(n, &p->grants)
                if (container_of(n, PoolGrant, node)->provisional)
                        return true;
        return false;
}

/* Redis has every lease this node holds: no reclaim pending, none to be queued, and none it cannot name
 * (pool_shared_set_records_unknown(): Redis may have lost one, whose command nobody could fence). A tick
 * says so to end a recovery window that waits for this node (brokerd/lua/README, "Recovery windows"). */
static bool reclaimed(const SharedPool *p) {
        return !p->reclaim_all && !has_provisional(p) && !p->records_unknown;
}

/* Argument i of a call, made as of its sending rather than its queueing. value is none of c's own arguments
 * (appending may move them). */
static int call_set_arg(Call *c, size_t i, const char *value) {
        if (streq(c->argv[i], value))
                return 0;
        size_t len = strlen(value), off;
        int r = call_args_append(c, value, len, &off);
        if (r < 0)
                return r;
        c->argoff[i] = off;
        c->argv[i] = c->args + off;
        c->argvlen[i] = len;
        return 0;
}

/* A tick's ARGV[13] (lua/README, tick): reclaimed "1" or "0", and "k" while the node cannot account for its
 * leases (pool_shared_set_records_unknown()). */
static const char *tick_reclaimed_arg(const SharedPool *p, bool keep_leases) {
        static const char *const values[2][2] = { { "0", "0k" }, { "1", "1k" } };
        return values[reclaimed(p)][p->records_unknown || keep_leases];
}

/* … made as of its sending: a tick queued before a Redis restart and sent again after it must not end the
 * window that the restart opens. */
static int call_set_reclaimed(Call *c, const SharedPool *p) {
        return c->script == SHARED_SCRIPT_TICK ? call_set_arg(c, 13, tick_reclaimed_arg(p, c->keep_leases)) : 0;
}

/* ARGV[4] is the run id of the link a call goes out on, not of the one it was queued under: a reclaim
 * queued at restore (no link yet), a release kept while the link was down across a Redis restart. Redis
 * takes any run id other than the one it stored as a restart and starts a recovery window. */
static int call_set_run_id(Call *c, const char *run_id) {
        return call_set_arg(c, c->n_keys + 3, run_id ?: "");
}

/* A submit's ARGV[15] (lua/submit.lua), made as of its sending: "1" while its rid was never sent (64 random
 * bits: Redis holds nothing under it, and skips a retry's two lookups), "0" once it may have run, and for a
 * rid Redis may know (a resumed waiter's, or one sent again after Redis said it lost it). */
static int call_set_fresh(Call *c) {
        if (c->script != SHARED_SCRIPT_SUBMIT)
                return 0;
        return call_set_arg(c, SUBMIT_ARG_FRESH, !c->ever_sent && !c->resumed && !c->again ? "1" : "0");
}

static bool wait_is_out(SharedPool *p) {
        list_foreach(n, &p->outbox) {
                const Call *c = container_of(n, Call, node);
                if (c->wait && c->sent)
                        return true;
        }
        return false;
}

static bool wait_is_awaited(SharedPool *p, uint64_t id) {
        list_foreach(n, &p->tries)
                if (container_of(n, PoolWaiter, node)->replicating.wait_id == id)
                        return true;
        return false;
}

/* Refused for good until an operator acts; a node id in use by another process is refused by Redis, and
 * its ticks go on: one is accepted once the other's registration lapses. */
static bool refused_quiet(const SharedPool *p) {
        return p->state == SHARED_STATE_REFUSED && !p->identity_conflict;
}

/* ------------------------------------------------------------------------------------------- batches */

/* The operations brokerd/lua/batch.lua runs: the ones a busy node makes many of. positions (up to 256
 * rids, milliseconds) and drain go alone. */
static bool call_batchable(const Call *c) {
        return !c->wait && (c->script == SHARED_SCRIPT_SUBMIT || c->script == SHARED_SCRIPT_RELEASE ||
                            c->script == SHARED_SCRIPT_WITHDRAW || c->script == SHARED_SCRIPT_TICK ||
                            c->script == SHARED_SCRIPT_RECLAIM);
}

/* What a call adds to a batch's arguments: its own after the head, its name and count. */
static size_t call_batch_bytes(const Call *c) {
        size_t bytes = 32;
        for (size_t i = 6; i < c->argc; i++)
                bytes += c->argvlen[i] + 16; /* RESP's framing of each */
        return bytes;
}

/* The head (ARGV[1..5]) is the batch's: only calls of the same head go together (the manual clock's
 * `now`, the settle flag). */
static bool call_same_head(const Call *a, const Call *b) {
        for (size_t i = 1; i <= 5; i++)
                if (a->argvlen[i] != b->argvlen[i] || memcmp(a->argv[i], b->argv[i], a->argvlen[i]) != 0)
                        return false;
        return true;
}

_Static_assert(SHARED_BATCH_OPS_MAX <= 32, "members_unsent is a 32-bit mask");

static bool call_passes_its_rid(const SharedPool *p, const Call *c, Call *const *taken, size_t n_taken);

/* The calls after `first` that take_call() would send next, as one batch with it (first is taken already):
 * in the outbox's order, passing those that take_call() passes (sent, held, waiting for the pool to serve,
 * or behind an earlier call of their rid that waits: call_passes_its_rid()), up to a WAIT (it must count the
 * writes before it, and go before the calls after it), a call that goes alone, another head, or the bounds.
 * NULL: first goes alone. */
static Call *batch_make(SharedPool *p, Call *first, usec_t now) {
        unsigned max = MIN(p->params.batch_max, SHARED_BATCH_OPS_MAX);
        if (max < 2 || !call_batchable(first))
                return NULL;
        Call *members[SHARED_BATCH_OPS_MAX] = { first };
        size_t n = 1, bytes = call_batch_bytes(first);
        /* Whether a call that waits to go stands before the one looked at: only then can that one pass a call
         * of its rid (call_passes_its_rid() walks the outbox; most batches have nothing waiting before them). */
        bool waiting_before = false;
        for (ListNode *i = p->outbox.next; i != &first->node && !waiting_before; i = i->next)
                waiting_before = !container_of(i, Call, node)->sent;
        for (ListNode *i = first->node.next; i != &p->outbox && n < max; i = i->next) {
                Call *c = container_of(i, Call, node);
                if (c->sent)
                        continue;
                if (c->held || (!c->wait && !call_may_go(p, c)) ||
                    (waiting_before && call_passes_its_rid(p, c, members, n))) {
                        waiting_before = true;
                        continue;
                }
                if (!call_batchable(c) || call_set_run_id(c, p->run_id) < 0 ||
                    call_set_reclaimed(c, p) < 0 || call_set_fresh(c) < 0 || !call_same_head(first, c))
                        break;
                size_t more = call_batch_bytes(c);
                if (bytes + more > SHARED_BATCH_BYTES_MAX)
                        break;
                members[n++] = c;
                bytes += more;
        }
        if (n < 2)
                return NULL;

        _cleanup_(freep) Call *b = calloc(1, sizeof(Call));
        if (!b)
                return NULL;
        b->script = SHARED_SCRIPT_BATCH;
        int r = 0;
        for (size_t i = 0; r >= 0 && i <= 5; i++)
                r = call_add(b, "%s", first->argv[i]);
        if (r >= 0)
                r = call_add(b, "%zu", n);
        for (size_t m = 0; r >= 0 && m < n; m++) {
                const Call *c = members[m];
                if ((r = call_add(b, "%s", shared_script_to_string(c->script))) < 0 ||
                    (r = call_add(b, "%zu", c->argc - 6)) < 0)
                        break;
                for (size_t i = 6; r >= 0 && i < c->argc; i++)
                        r = call_add(b, "%s", c->argv[i]);
        }
        if (r >= 0 && !(b->members = calloc(n, sizeof(uint64_t))))
                r = -ENOMEM;
        if (r < 0) {
                Call *tmp = TAKE_PTR(b);
                call_free(tmp);
                return NULL; /* out of memory: first goes alone */
        }
        for (size_t m = 0; m < n; m++) {
                if (!members[m]->ever_sent)
                        b->members_unsent |= UINT32_C(1) << m;
                members[m]->sent = members[m]->ever_sent = true;
                members[m]->sent_at = now;
                b->members[m] = members[m]->id;
        }
        b->n_members = n;
        b->sent = true;
        b->sent_at = now;
        b->id = ++p->next_call_id;
        b->view = (SharedCall) {
                .id = b->id,
                .script = SHARED_SCRIPT_BATCH,
                .n_keys = 1,
                .argc = b->argc,
                .argv = (const char *const *) b->argv,
                .argvlen = b->argvlen,
        };
        list_append(&p->batches, &b->node);
        return TAKE_PTR(b);
}

static void batches_forget(SharedPool *p) {
        ListNode *n;
        while ((n = list_first(&p->batches)))
                call_free(container_of(n, Call, node));
}

/* Pool i of a set call (0: this one), found by name on this backend: NULL when it is gone (a reload removed
 * it). Every pool of a set is on this pool's backend (conf: one backend a set). */
static SharedPool *set_pool(SharedPool *p, const Call *c, size_t i) {
        if (i == 0)
                return p;
        Pool *q = p->params.find_pool ? p->params.find_pool(c->set_pools[i], p->params.find_pool_userdata) : NULL;
        return q ? SHARED(q) : NULL;
}

/* A set's call goes when every pool of it serves (one that does not would answer it "unregistered" or
 * "rules": sent again and again for nothing); one gone refuses it when it is answered. */
static bool set_pools_serve(SharedPool *p, const Call *c) {
        for (size_t i = 1; i < c->n_keys; i++) {
                SharedPool *q = set_pool(p, c, i);
                if (q && !pool_serves(q))
                        return false;
        }
        return true;
}

/* Longer than a call can be out: a link closes on a command unanswered for 2 s (brokerd/redis-link.h), and
 * what was out goes again. One still marked out after this was answered and not let go (a bug): it holds no
 * call back (call_waits_for_company()), so that such a bug costs a pause, not the pool. */
#define CALL_OUT_MAX (5 * USEC_PER_SEC)

/* Whether a call of this pool is out (a WAIT aside: it decides nothing). A batch's calls are marked out too.
 * (calls_out() counts WAITs as well, and any age: what a manual clock's stream entries wait for.) */
static bool call_is_out(SharedPool *p, usec_t now) {
        list_foreach(n, &p->outbox) {
                const Call *c = container_of(n, Call, node);
                if (c->sent && !c->wait && now - MIN(now, c->sent_at) < CALL_OUT_MAX)
                        return true;
        }
        return false;
}

/* A group commit: while a call of the pool is out, the next one waits for its answer, unless a full batch
 * waits already or the call must go at once (send_through). What the engine queues meanwhile goes as one
 * batch: a call costs Redis a fixed part (the checks every call makes, about 600 k instructions, as much as
 * three operations: tests/bench/README.md, "Stop 66"), and a pool that sent every loop iteration's few
 * operations at once made Redis pay it per operation or two as soon as its load was moderate, queueing
 * everyone's calls behind those fixed parts. The cost: an operation that arrives while a call is out waits
 * for that call's answer (a round trip at most). */
static bool call_waits_for_company(SharedPool *p, const Call *first, usec_t now) {
        if (!p->params.one_call_out || first->wait || first->order <= p->send_through || !call_is_out(p, now))
                return false;
        unsigned max = MIN(p->params.batch_max, SHARED_BATCH_OPS_MAX), n = 0;
        if (max < 2 || !call_batchable(first))
                return true;
        /* Counted roughly: a call batch_make() would pass over (held, waiting for the rules) counts too, which
         * at worst lets a batch go early. */
        for (const ListNode *i = &first->node; i != &p->outbox && n < max; i = i->next) {
                const Call *c = container_of(i, Call, node);
                n += !c->sent && call_batchable(c);
        }
        return n < max;
}

/* The oldest call that may be sent now, or NULL. A WAIT nobody awaits any more is dropped on the way. */
static Call *outbox_next(SharedPool *p) {
        if (!p->link_up || refused_quiet(p))
                return NULL;
        /* A tick goes whenever the link is up; other calls wait for a registered node with agreed rules
         * and, behind Sentinels, a confirmed primary, but for releases and withdrawals, which go while the
         * rules differ too (call_may_go(); one parked keeps its place behind earlier ones; a submit held at
         * start goes once the pool first serves). */
        bool waiting_before = false; /* as in batch_make() */
        list_foreach_safe(n, &p->outbox) {
                Call *c = container_of(n, Call, node);
                if (c->sent)
                        continue;
                if (c->held || !call_may_go(p, c) || (c->script == SHARED_SCRIPT_SET && !set_pools_serve(p, c)) ||
                    (waiting_before && call_passes_its_rid(p, c, NULL, 0))) {
                        waiting_before = true;
                        continue;
                }
                if (c->wait) {
                        /* A WAIT whose grants were answered otherwise (withdrawn, refused) would block the link
                         * for nothing. One out at a time: the calls pipelined behind a WAIT wait for its
                         * answer, and two in a row could make them wait past the link's command timeout;
                         * calls after it may pass (a later WAIT covers more, not less). */
                        if (!wait_is_awaited(p, c->id)) {
                                call_free(c);
                                continue;
                        }
                        if (wait_is_out(p))
                                continue;
                }
                return c;
        }
        return NULL;
}

bool pool_shared_next_call(Pool *base, uint64_t *ret_order) {
        Call *c = outbox_next(SHARED(base));
        if (!c)
                return false;
        *ret_order = c->order;
        return true;
}

bool pool_shared_take_send_first(Pool *base) {
        SharedPool *p = SHARED(base);
        bool r = p->send_first;
        p->send_first = false;
        return r;
}

void pool_shared_send_queued_now(Pool *base) {
        SharedPool *p = SHARED(base);
        if (!list_is_empty(&p->outbox))
                p->send_through = MAX(p->send_through, container_of(p->outbox.prev, Call, node)->order);
}

bool pool_shared_take_call(Pool *base, usec_t now, const SharedCall **ret) {
        SharedPool *p = SHARED(base);
        Call *c = outbox_next(p);
        if (!c || call_waits_for_company(p, c, now))
                return false;
        if (!c->wait && (call_set_run_id(c, p->run_id) < 0 || call_set_reclaimed(c, p) < 0 || call_set_fresh(c) < 0))
                return false; /* out of memory: tried again at the next wake-up */
        c->sent = c->ever_sent = true;
        c->sent_at = now;
        Call *b = c->wait ? NULL : batch_make(p, c, now);
        if (b) {
                *ret = &b->view;
                return true;
        }
        c->view = (SharedCall) {
                .id = c->id,
                .wait = c->wait,
                .script = c->wait ? _SHARED_SCRIPT_INVALID : c->script,
                .n_keys = c->wait ? 0 : c->n_keys,
                .argc = c->argc,
                .argv = (const char *const *) c->argv,
                .argvlen = c->argvlen,
        };
        *ret = &c->view;
        return true;
}

/* ------------------------------------------------------------------------------------ calls by script */

static int rid_cmp(const void *a, const void *b) {
        return strcmp(*(const char *const *) a, *(const char *const *) b);
}

/* What a tick says this node wants of the rules (tick.lua's ARGV[7]): its canon while it configures the pool;
 * "*" (whatever is stored) while it does not — a pool a reload removed that still holds a lease, or one made
 * at a restart only to hold the leases restored into it: such a node holds no rule change of the others back
 * for as long as its lease lasts, and asks nothing of the rules itself (no submit). */
static const char *tick_wanted_rules(const SharedPool *p) {
        return p->base.retired || !p->canon ? "*" : p->canon;
}

static int queue_tick(SharedPool *p, bool run, usec_t now) {
        Call *c;
        int r = call_new(p, SHARED_SCRIPT_TICK, run || op_settles(p), now, &c);
        if (r < 0)
                return r;
        c->run = run;
        char floor[32] = "-";
        if (p->token_floor > 0)
                snprintf(floor, sizeof floor, "%" PRIu64, p->token_floor);
        char epoch[17];
        snprintf(epoch, sizeof epoch, "%016" PRIx64, p->params.random(p->params.random_userdata));
        if ((r = call_add(c, "%s", p->params.node_name)) < 0 ||
            (r = call_add(c, "%s", tick_wanted_rules(p))) < 0 ||
            (r = call_add(c, "%" PRIu64, p->fp.n)) < 0 ||
            (r = call_add(c, "%" PRIu32, p->fp.x)) < 0 ||
            (r = call_add(c, "%" PRIu32, p->fp.s)) < 0 ||
            (r = call_add(c, "%s", floor)) < 0 ||
            (r = call_add(c, "%s", epoch)) < 0 ||
            (r = call_add(c, "%s", tick_reclaimed_arg(p, false))) < 0)
                goto fail;
        if (p->reconcile_from) {
                /* One page of this node's rids from reconcile_from on: the script drops the records of the
                 * range that the page does not list (a record Redis has and this node forgot). */
                size_t n = 0;
                list_foreach(i, &p->tries)
                        n++;
                list_foreach(i, &p->grants)
                        n++;
                _cleanup_free_ const char **rids = calloc(MAX(n, (size_t) 1), sizeof(char *));
                if (!rids) {
                        r = -ENOMEM;
                        goto fail;
                }
                n = 0;
                list_foreach(i, &p->tries)
                        rids[n++] = container_of(i, PoolWaiter, node)->rid;
                list_foreach(i, &p->grants)
                        rids[n++] = container_of(i, PoolGrant, node)->rid;
                qsort(rids, n, sizeof(char *), rid_cmp);
                size_t first = 0;
                if (!streq(p->reconcile_from, "-"))
                        while (first < n && strcmp(rids[first], p->reconcile_from) < 0)
                                first++;
                size_t last = MIN(n, first + SHARED_RECONCILE_PAGE); /* exclusive */
                const char *hi = last == n ? "+" : rids[last - 1];
                if ((r = call_add(c, "%s", p->reconcile_from)) < 0 || (r = call_add(c, "%s", hi)) < 0)
                        goto fail;
                for (size_t i = first; i < last; i++)
                        if ((r = call_add(c, "%s", rids[i])) < 0)
                                goto fail;
                c->reconcile = true;
                /* The page lists what the node knows now: a lease restored before it goes is not in it. */
                c->keep_leases = p->records_unknown;
        } else if ((r = call_add(c, "%s", "")) < 0 || (r = call_add(c, "%s", "")) < 0)
                goto fail;
        p->tick_pending = true;
        p->run_pending = p->run_pending || run;
        p->tick_wanted = false;
        p->last_tick = now;
        call_queue(p, c);
        return 0;
fail:
        call_free(c);
        return r;
}

/* Whether a tick carrying a reconcile page went out: its page was made without a try queued after it. */
static bool reconcile_sent(SharedPool *p) {
        list_foreach(n, &p->outbox) {
                const Call *c = container_of(n, Call, node);
                if (c->reconcile && c->ever_sent)
                        return true;
        }
        /* None in the outbox: the first reconcile is answered once the cursor is gone. */
        return !p->reconcile_from;
}

/* The reconcile ticks not sent yet are made again, with the tries of now in their pages. */
static void requeue_reconcile(SharedPool *p, usec_t now) {
        bool run = false, any = false;
        list_foreach_safe(n, &p->outbox) {
                Call *c = container_of(n, Call, node);
                if (c->script != SHARED_SCRIPT_TICK || !c->reconcile || c->ever_sent)
                        continue;
                run = run || c->run;
                any = true;
                call_free(c);
        }
        if (any) {
                p->tick_pending = false;
                (void) queue_tick(p, run, now);
        }
}

/* exit_status (release only, ≥ 0): its command's, and its job, for the members' quarantine (release.lua). */
static int queue_release_call(SharedPool *p, SharedScript script, const char *rid, uint64_t token, int exit_status,
                              const char *job, usec_t now) {
        Call *c;
        int r = call_new(p, script, op_settles(p), now, &c);
        if (r < 0)
                return r;
        strcpy(c->rid, rid);
        if (script == SHARED_SCRIPT_RELEASE)
                r = call_add(c, "%" PRIu64, token);
        if (r >= 0)
                r = call_add(c, "%s", rid);
        if (r >= 0 && script == SHARED_SCRIPT_RELEASE && exit_status >= 0 && exit_status <= 255 &&
            (r = call_add(c, "%d", exit_status)) >= 0)
                r = call_add(c, "%s", job ?: "");
        if (r < 0) {
                call_free(c);
                return r;
        }
        call_queue(p, c);
        return 0;
}

static int queue_rid_call(SharedPool *p, SharedScript script, const char *rid, uint64_t token, usec_t now) {
        return queue_release_call(p, script, rid, token, -1, NULL, now);
}

static int queue_reclaim(SharedPool *p, const PoolGrant *g, usec_t now) {
        Call *c;
        int r = call_new(p, SHARED_SCRIPT_RECLAIM, op_settles(p), now, &c);
        if (r < 0)
                return r;
        strcpy(c->rid, g->rid);
        if ((r = call_add(c, "%s", g->rid)) < 0 ||
            (r = call_add(c, "%s", g->lane)) < 0 ||
            (r = call_add(c, "%u", g->n_slots)) < 0 ||
            (r = call_add(c, "%" PRIu64, g->token)) < 0 ||
            (r = call_add(c, "%" PRIu64, g->granted_at)) < 0)
                goto fail;
        for (unsigned i = 0; i < g->n_slots; i++)
                if ((r = call_add(c, "%u", g->slots[i])) < 0)
                        goto fail;
        for (unsigned i = 0; g->members && i < g->n_slots; i++)
                if ((r = call_add(c, "%s", g->members[i] ?: "")) < 0)
                        goto fail;
        call_queue(p, c);
        return 0;
fail:
        call_free(c);
        return r;
}

/* Where this node's queued requests stand now. all: every one of them, in pages (answers what a lost
 * stream entry would have said); else the next page of the round that refreshes their places. */
static int queue_positions(SharedPool *p, bool all, usec_t now) {
        Call *c = NULL;
        unsigned n = 0;
        size_t index = 0, skip = all ? 0 : p->positions_cursor;
        int r;
        list_foreach(i, &p->tries) {
                PoolWaiter *w = container_of(i, PoolWaiter, node);
                if (!w->queued)
                        continue;
                if (index++ < skip)
                        continue;
                if (!all && n == SHARED_POSITIONS_MAX)
                        break;
                if (!c) {
                        if ((r = call_new(p, SHARED_SCRIPT_POSITIONS, false, now, &c)) < 0 ||
                            (r = call_add(c, "pos")) < 0)
                                goto fail;
                }
                if ((r = call_add(c, "%s", w->rid)) < 0)
                        goto fail;
                if (++n == SHARED_POSITIONS_MAX && all) {
                        call_queue(p, c);
                        c = NULL;
                        n = 0;
                }
        }
        if (!all)
                p->positions_cursor = index > skip + n ? skip + n : 0; /* the end reached: from the start */
        if (c)
                call_queue(p, c);
        return 0;
fail:
        call_free(c);
        return r;
}

/* A status snapshot, after a page of this node's own waiters' places: Status shows those beside the
 * snapshot's, and a place heartbeats old (the round robin's) can contradict it, a request queued since
 * ahead of them not counted. The page first, so that its answer is in when Status gets the snapshot. */
static int queue_status(SharedPool *p, usec_t now) {
        (void) queue_positions(p, false, now);
        Call *c;
        int r = call_new(p, SHARED_SCRIPT_POSITIONS, false, now, &c);
        if (r < 0)
                return r;
        if ((r = call_add(c, "status")) < 0) {
                call_free(c);
                return r;
        }
        p->status_pending = true;
        p->status_last = p->snap_asked = now;
        call_queue(p, c);
        return 0;
}

static void rid_forget(SharedPool *p, const char *rid);

/* A submit (or a set's call) that is not out is dropped, whether it was never sent or waits to go again (held
 * after errors or SHARED_SETTLING_MAX "settling" answers, a batch stopped before it, the link lost): sent after
 * the withdraw, it would queue a waiter for a rid this node forgot. One out is answered for nothing
 * (submit_done(); a "settling" answer drops it: call_again()). The rid is withdrawn (idempotent) unless the
 * only call of it was never sent: one that may have run, one out; and a resumed waiter's old rid once a
 * reconcile that listed it went out (held at a start behind Sentinels past the first tick): Redis kept its
 * waiter, maybe granted it; and a waiter's rid sent again after Redis said it lost it (waiter_resubmit()):
 * that "gone" was Redis's word, which may not be true. Returns whether a withdraw was queued. */
static bool forget_submit(SharedPool *p, const char *rid, usec_t now) {
        bool found = false, may_have_run = false;
        list_foreach_safe(n, &p->outbox) {
                Call *c = container_of(n, Call, node);
                if ((c->script != SHARED_SCRIPT_SUBMIT && c->script != SHARED_SCRIPT_SET) || !streq(c->rid, rid))
                        continue;
                found = true;
                if (c->sent) {
                        may_have_run = true;
                        continue;
                }
                may_have_run = may_have_run || c->ever_sent || (c->resumed && reconcile_sent(p)) || c->again;
                call_free(c);
        }
        if (found && !may_have_run)
                return false;
        rid_forget(p, rid);
        return queue_rid_call(p, SHARED_SCRIPT_WITHDRAW, rid, 0, now) >= 0;
}

/* ------------------------------------------------------------------------------------------ decisions */

static void emit(SharedPool *p, PoolDecision d) {
        d.pool = &p->base;
        pool_emit(&p->base, &d);
}

/* Whether a call of script for rid is in the outbox: sent and not answered, or to be sent; or, unsent_only,
 * never sent (it goes after every call sent so far). */
static bool outbox_has(const SharedPool *p, SharedScript script, const char *rid, bool unsent_only) {
        list_foreach(n, &p->outbox) {
                const Call *c = container_of(n, Call, node);
                if (c->script == script && streq(c->rid, rid) && !(unsent_only && c->ever_sent))
                        return true;
        }
        return false;
}

static PoolWaiter *try_find(SharedPool *p, const char *rid) {
        list_foreach(n, &p->tries) {
                PoolWaiter *w = container_of(n, PoolWaiter, node);
                if (streq(w->rid, rid))
                        return w;
        }
        return NULL;
}

static PoolGrant *grant_find(SharedPool *p, const char *rid) {
        list_foreach(n, &p->grants) {
                PoolGrant *g = container_of(n, PoolGrant, node);
                if (streq(g->rid, rid))
                        return g;
        }
        return NULL;
}

/* Calls of one rid reach Redis in the order they were queued: one whose earlier call of the same rid waits to
 * go again (held after errors or SHARED_SETTLING_MAX "settling" answers, waiting for its pools) waits with it.
 * (One out is no bar: the link keeps their order.) `taken`: the calls a batch took before c, which go ahead of
 * it in the batch. */
static bool call_passes_its_rid(const SharedPool *p, const Call *c, Call *const *taken, size_t n_taken) {
        if (c->wait || c->rid[0] == '\0')
                return false;
        for (const ListNode *i = p->outbox.next; i != &c->node; i = i->next) {
                const Call *e = container_of(i, Call, node);
                if (e->sent || e->wait || !streq(e->rid, c->rid))
                        continue;
                bool in_batch = false;
                for (size_t k = 0; k < n_taken && !in_batch; k++)
                        in_batch = taken[k] == e;
                if (!in_batch)
                        return true;
        }
        return false;
}

/* Whether c is of a request or lease given up since it was queued: a submit whose try is forgotten (withdrawn,
 * cancelled, refused or decided meanwhile), a set's call none of whose parts any of its pools still tries, a
 * reclaim of a lease released. Sent again, it would come after the withdraw or release that gave it up (which
 * went while c was held, or behind c on the link while c was out to be answered "settling"): a waiter queued
 * for a rid this node forgot, or slots occupied again in a recovery window under a lease nobody holds. */
static bool call_superseded(SharedPool *p, const Call *c) {
        if (c->wait)
                return false;
        switch (c->script) {
        case SHARED_SCRIPT_SUBMIT:
                return !try_find(p, c->rid);
        case SHARED_SCRIPT_RECLAIM:
                return !grant_find(p, c->rid);
        case SHARED_SCRIPT_SET:
                for (size_t i = 0; i < c->n_keys; i++) {
                        SharedPool *q = set_pool(p, c, i);
                        if (q && try_find(q, c->rid))
                                return false;
                }
                return true;
        default:
                return false;
        }
}

static void reclaiming_end(SharedPool *p, usec_t now);

/* c is not out any more and is to go again (unanswered, "settling", a batch stopped before it, parked):
 * dropped instead when it was given up meanwhile (call_superseded()): whoever gave it up queued the withdraw
 * or release that tells Redis. Returns false when dropped. */
static bool call_again(SharedPool *p, Call *c, usec_t now) {
        c->sent = false;
        if (!call_superseded(p, c))
                return true;
        bool reclaim = c->script == SHARED_SCRIPT_RECLAIM;
        call_free(c);
        if (reclaim)
                reclaiming_end(p, now);
        return false;
}

static void grant_free(PoolGrant *g);

static void try_free(PoolWaiter *w) {
        if (list_node_is_linked(&w->node))
                list_unlink(&w->node);
        if (w->replicating.grant)
                grant_free(w->replicating.grant);
        free(w->lane);
        free(w->selector);
        free(w);
}

/* What the fingerprint counts of a request of this node: its waiter, or the lease a WAIT holds back. */
static void try_fp_remove(SharedPool *p, PoolWaiter *w) {
        if (w->queued)
                fp_remove(p, w->rid, 'w');
        else if (w->replicating.grant)
                fp_remove(p, w->rid, 'l');
}

static void grant_free(PoolGrant *g) {
        if (list_node_is_linked(&g->node))
                list_unlink(&g->node);
        free(g->remote_id);
        free(g->lane);
        free(g->slots);
        strv_free(g->members);
        free(g->exit_job);
        free(g);
}

/* A refusal made by this node (backend unreachable, rules differ, pool retired): the try is answered now
 * and Redis is told to forget it. */
static void try_refuse_locally(SharedPool *p, PoolWaiter *w, const char *reason, usec_t now) {
        try_fp_remove(p, w);
        /* A lease held back for its replicas goes too: withdraw releases a lease under the rid. */
        if (forget_submit(p, w->rid, now))
                p->send_first = true;
        /* A decision of this node: the wait is the engine's own measure (has_wait false). */
        void *cookie = w->cookie;
        try_free(w);
        emit(p, (PoolDecision) {
                .verdict = POOL_VERDICT_REFUSED,
                .cookie = cookie,
                .at = now,
                .refusal = REFUSAL_UNAVAILABLE,
                .budget = USEC_INFINITY,
                .reason = reason,
        });
}

/* A resumed try's deadline, and which refusal its end is, as the scripts' BUDGET.fix() decides it
 * (pool_budget_is_shed()). None (USEC_INFINITY) for any other try. */
static void deadline_set(const SharedPool *p, PoolWaiter *w, const PoolTry *t, usec_t now) {
        w->deadline = USEC_INFINITY;
        if (!t->resume || t->resume->budget == USEC_INFINITY)
                return;
        usec_t adaptive = p->base.queue_timeout_set && t->resume->state == QUEUE_STATE_SATURATED ?
                                  pool_saturated_budget(p->base.queue_timeout, p->congestion_timeout_set,
                                                        p->congestion_timeout) :
                                  USEC_INFINITY;
        bool shed = pool_budget_is_shed(t, t->resume->state, adaptive);
        w->deadline = usec_add(MIN(t->arrival, now), t->resume->budget);
        w->deadline_refusal = shed ? REFUSAL_SHED : REFUSAL_TIMEOUT;
        w->resumed_state = t->resume->state;
        w->resumed_idle = t->resume->idle;
        w->resumed_budget = t->resume->budget;
}

/* Whether a decision about a resumed waiter comes after its budget ended (SPEC §3.3: never granted after it
 * ended). Redis refuses a waiter it kept at its deadline, before any later instant grants it; one it lost (its
 * node reaped while its brokerd was down longer than the node TTL, its data lost) it decides afresh, from the
 * submit: granted at once, or queued with a budget counted from now. A grant mapped from the pool clock
 * within the offset's error before the deadline may be taken for a late one: refused, never granted late. */
static bool decision_is_late(const PoolWaiter *w, const SharedDecision *d, usec_t at, usec_t now) {
        if (w->deadline == USEC_INFINITY)
                return false;
        if (streq(d->verdict, "queued"))
                return now > w->deadline;
        return streq(d->verdict, "granted") && at > w->deadline;
}

/* Such a waiter refused at its deadline, and Redis told to forget it (a withdraw releases a lease under its
 * rid). */
static void deadline_refuse(SharedPool *p, PoolWaiter *w, usec_t now) {
        try_fp_remove(p, w);
        if (forget_submit(p, w->rid, now))
                p->send_first = true;
        PoolDecision d = {
                .verdict = POOL_VERDICT_REFUSED,
                .cookie = w->cookie,
                .at = w->deadline,
                .refusal = w->deadline_refusal,
                .state = w->resumed_state,
                .idle = w->resumed_idle,
                .budget = w->resumed_budget,
        };
        try_free(w);
        emit(p, d);
}

static void refuse_all_tries(SharedPool *p, const char *reason, usec_t now) {
        /* Places asked for and not sent yet are of nobody now. */
        list_foreach_safe(i, &p->outbox) {
                Call *c = container_of(i, Call, node);
                if (c->script == SHARED_SCRIPT_POSITIONS && !c->ever_sent && streq(c->argv[6], "pos"))
                        call_free(c);
        }
        ListNode *n;
        while ((n = list_first(&p->tries)))
                try_refuse_locally(p, container_of(n, PoolWaiter, node), reason, now);
}

static void grant_lose(SharedPool *p, PoolGrant *g, const char *reason, bool freed_remotely, usec_t now) {
        if (freed_remotely && !g->freed_remotely) {
                fp_remove(p, g->rid, 'l');
                g->freed_remotely = true;
        }
        g->provisional = false;
        if (g->lost)
                return;
        g->lost = true;
        emit(p, (PoolDecision) {
                .verdict = POOL_VERDICT_LOST,
                .cookie = g->cookie,
                .at = now,
                .grant = g,
                .token = g->token,
                .budget = USEC_INFINITY,
                .reason = reason,
        });
}

/* A token this node holds or passes on: the floor it sends stays above it. A token at the top of the
 * range (untrusted input) is not followed: the floor would overflow the scripts' exact integers. */
static void token_floor_raise(SharedPool *p, uint64_t token) {
        if (token > 0 && token < TOKEN_MAX)
                p->token_floor = MAX(p->token_floor, token + 1);
}

static int unsigned_cmp(const void *a, const void *b) {
        unsigned x = *(const unsigned *) a, y = *(const unsigned *) b;
        return (x > y) - (x < y);
}

/* What a decision says, checked against this pool like a client's message (SPEC §11): a known verdict; a
 * grant of k slots (the waiter's k when it is known), each below the limit and none twice, a member per
 * slot (the configured one) or none, a token in (0, 2^53); a refusal a known word. Returns NULL, or what
 * is wrong, for the journal. */
static const char *decision_check(const SharedPool *p, const SharedDecision *d, const PoolWaiter *w) {
        if (streq(d->verdict, "queued"))
                return NULL;
        if (streq(d->verdict, "refused"))
                return d->has_refusal ? NULL : "a refusal without a known reason";
        if (!streq(d->verdict, "granted"))
                return "an unknown verdict";
        if (d->token == 0 || d->token >= TOKEN_MAX)
                return "a grant whose token is out of range";
        if (d->n_slots == 0 || d->n_slots > p->base.limit || (w && d->n_slots != w->k))
                return "a grant of another number of slots than asked for";
        size_t n_config = strv_length(p->base.members);
        if (d->n_members != 0 && d->n_members != d->n_slots)
                return "a grant whose members do not match its slots";
        if ((n_config > 0) != (d->n_members > 0))
                return "a grant whose members do not match the pool's";
        _cleanup_free_ unsigned *sorted = malloc(d->n_slots * sizeof(unsigned));
        if (!sorted)
                return NULL; /* out of memory: the checks above must do */
        memcpy(sorted, d->slots, d->n_slots * sizeof(unsigned));
        qsort(sorted, d->n_slots, sizeof(unsigned), unsigned_cmp);
        for (unsigned i = 0; i < d->n_slots; i++) {
                if (sorted[i] >= p->base.limit || (i > 0 && sorted[i] == sorted[i - 1]))
                        return "a grant of a slot out of range or twice";
                if (d->n_members > 0 && (d->slots[i] >= n_config || !streq(d->members[i], p->base.members[d->slots[i]])))
                        return "a grant of a member the pool does not have";
        }
        /* Nor a slot that a lease of this node holds (one Redis still vouches for: not lost, not being
         * reclaimed): that would be one slot granted twice. A member is known by its name (a reload may
         * have moved it to another index), an anonymous slot by its index. */
        list_foreach(n, &p->grants) {
                const PoolGrant *g = container_of(n, PoolGrant, node);
                if (g->lost || g->freed_remotely || g->provisional || streq(g->rid, d->rid))
                        continue;
                for (unsigned i = 0; i < g->n_slots; i++) {
                        if (g->members && d->n_members > 0) {
                                for (unsigned j = 0; j < d->n_members; j++)
                                        if (streq(g->members[i], d->members[j]))
                                                return "a grant of a member this node holds already";
                        } else if (bsearch(&g->slots[i], sorted, d->n_slots, sizeof(unsigned), unsigned_cmp))
                                return "a grant of a slot this node holds already";
                }
        }
        return NULL;
}

static void rid_ring_add(RidRing *r, const char *rid, uint64_t token) {
        size_t i = r->n++ % RID_RING_SIZE;
        snprintf(r->entries[i].rid, SHARED_RID_LEN + 1, "%s", rid);
        r->entries[i].token = token;
}

static bool rid_ring_has(const RidRing *r, const char *rid, uint64_t token) {
        for (size_t i = 0; i < MIN(r->n, (size_t) RID_RING_SIZE); i++)
                if (r->entries[i].token == token && streq(r->entries[i].rid, rid))
                        return true;
        return false;
}

static bool rid_was_forgotten(const SharedPool *p, const char *rid) {
        return rid_ring_has(&p->forgotten, rid, 0);
}

static void rid_forget(SharedPool *p, const char *rid) {
        rid_ring_add(&p->forgotten, rid, 0);
}

static bool grant_has_ended(const SharedPool *p, const char *rid, uint64_t token) {
        return rid_ring_has(&p->ended, rid, token);
}

static void grant_ended(SharedPool *p, const PoolGrant *g) {
        rid_ring_add(&p->ended, g->rid, g->token);
}

/* Input that failed validation: dropped by the caller; counted here, and told at most once a minute. */
static void bad_input(SharedPool *p, const char *what, usec_t now) {
        p->bad_input++;
        p->bad_input_untold++;
        if (p->bad_input_told != USEC_INFINITY && now - MIN(now, p->bad_input_told) < BAD_INPUT_NOTICE_EVERY)
                return;
        notice_push(p, SHARED_NOTICE_BAD_INPUT, NULL, what, p->bad_input_untold, 0);
        p->bad_input_told = now;
        p->bad_input_untold = 0;
}

/* The same, for a decision whose rid was read before what was wrong in it: a waiter of that rid is refused
 * (its rid withdrawn), as for a decision that says something wrong. */
static void bad_input_about(SharedPool *p, const char *rid, const char *what, usec_t now) {
        bad_input(p, what, now);
        PoolWaiter *w = rid[0] ? try_find(p, rid) : NULL;
        if (w && !w->replicating.grant)
                try_refuse_locally(p, w, "bad-reply", now);
}

void pool_shared_bad_input(Pool *base, const char *what, usec_t now) {
        SharedPool *p = SHARED(base);
        bad_input(p, what, driver_now(p, now));
}

static PoolGrant *grant_new(const char *node_id, const char *rid, const char *lane, const SharedDecision *d) {
        PoolGrant *g = calloc(1, sizeof(PoolGrant));
        if (!g)
                return NULL;
        strcpy(g->rid, rid);
        g->exit_status = -1;
        g->token = d->token;
        g->granted_at = d->at < 0 ? 0 : (usec_t) d->at;
        g->n_slots = d->n_slots;
        g->slots = calloc(MAX(d->n_slots, 1u), sizeof(unsigned));
        g->lane = lane ? strdup(lane) : NULL;
        if (asprintf(&g->remote_id, "%s:%s", node_id, rid) < 0)
                g->remote_id = NULL;
        if (!g->slots || !g->remote_id || (lane && !g->lane)) {
                grant_free(g);
                return NULL;
        }
        memcpy(g->slots, d->slots, d->n_slots * sizeof(unsigned));
        if (d->members) {
                g->members = strv_copy(d->members);
                if (!g->members) {
                        grant_free(g);
                        return NULL;
                }
        }
        return g;
}

/* A configured member's counts by name (NULL: none, or not configured now). */
static PoolMemberLife *life_find(SharedPool *p, const char *member) {
        for (size_t i = 0; member && i < p->n_life; i++)
                if (streq(p->life[i].member, member))
                        return p->life + i;
        return NULL;
}

/* The grant is this node's to answer: the lease joins the grants, the waiter goes. Its members count it
 * here, on this node only (SPEC §3.6, usage per member: each node counts the leases it was granted, and the
 * nodes' counters add up to the fleet's, as Prometheus sums them; README, "Members' lives"). */
static void grant_deliver(SharedPool *p, PoolWaiter *w, const Replicating *r) {
        PoolGrant *g = r->grant;
        list_append(&p->grants, &g->node);
        g->counted_at = r->at;
        for (unsigned i = 0; g->members && i < g->n_slots; i++) {
                PoolMemberLife *m = life_find(p, g->members[i]);
                if (m)
                        m->grants++;
        }
        void *cookie = w->cookie;
        if (w->replicating.grant == g)
                w->replicating.grant = NULL;
        try_free(w);
        emit(p, (PoolDecision) {
                .verdict = POOL_VERDICT_GRANTED,
                .cookie = cookie,
                .at = r->at,
                .state = r->state,
                .idle = r->idle,
                .budget = r->budget,
                .grant = g,
                .slots = g->slots,
                .members = (const char *const *) g->members,
                .n_slots = g->n_slots,
                .token = g->token,
                .has_wait = true,
                .wait = r->wait,
                .remote_id = g->remote_id,
        });
}

static bool tick_is_queued(SharedPool *p) {
        list_foreach(n, &p->outbox) {
                const Call *c = container_of(n, Call, node);
                if (c->script == SHARED_SCRIPT_TICK && !c->sent)
                        return true;
        }
        return false;
}

/* The WAIT not sent yet (made if there is none), moved to the end of the outbox: it covers only the writes
 * this connection sent before it. Returns its id, 0 when out of memory. */
static uint64_t queue_wait(SharedPool *p) {
        list_foreach(n, &p->outbox) {
                Call *c = container_of(n, Call, node);
                if (c->wait && !c->sent) {
                        list_unlink(&c->node);
                        list_append(&p->outbox, &c->node);
                        c->order = call_order_next(p, c->order);
                        return c->id;
                }
        }
        Call *c = calloc(1, sizeof(Call));
        if (!c)
                return 0;
        c->wait = true;
        c->script = _SHARED_SCRIPT_INVALID;
        if (call_add(c, "WAIT") < 0 || call_add(c, "%u", p->min_replicas) < 0 ||
            call_add(c, "%" PRIu64, MAX(p->min_replicas_timeout / USEC_PER_MSEC, (usec_t) 1)) < 0) {
                call_free(c);
                return 0;
        }
        call_queue(p, c);
        return c->id;
}

/* backend-min-replicas: Redis has written the lease, and the grant is answered only once WAIT says that
 * enough replicas hold it (a promoted replica then has it). WAIT counts the writes of the connection it is
 * sent on: a grant written by this node's call (its reply said so) is covered by a WAIT after it; one
 * another node's call wrote (read in the stream or in the places' answer) needs a write of this node after
 * it, and a heartbeat writes. Reclaims are not held: their commands are running already, a refusal would
 * not stop them, and a reclaim lost again in a failover is made again (every holder reclaims after one). */
static void grant_hold(SharedPool *p, PoolWaiter *w, const Replicating *r, bool written_here, usec_t now) {
        if (w->queued) {
                fp_remove(p, w->rid, 'w');
                w->queued = false; /* no more places to ask for */
        }
        fp_add(p, w->rid, 'l');
        w->replicating = *r;
        if (!written_here && !tick_is_queued(p))
                (void) queue_tick(p, false, now);
        w->replicating.wait_id = queue_wait(p);
        if (w->replicating.wait_id == 0)
                try_refuse_locally(p, w, "replicas", now);
}

static PoolWaiter *replicating_find(SharedPool *p, uint64_t wait_id) {
        list_foreach(n, &p->tries) {
                PoolWaiter *w = container_of(n, PoolWaiter, node);
                if (w->replicating.grant && (wait_id == 0 || w->replicating.wait_id == wait_id))
                        return w;
        }
        return NULL;
}

/* Every grant held back for wait_id (0: for any WAIT) is refused, its lease released: the replicas did
 * not say they hold it. */
static void replicating_refuse(SharedPool *p, uint64_t wait_id, usec_t now) {
        PoolWaiter *w;
        while ((w = replicating_find(p, wait_id)))
                try_refuse_locally(p, w, "replicas", now);
}

/* A decision about one of this node's requests, from a reply or the stream: the first copy wins.
 * written_here: the call whose reply carried it made it, on this node's connection (a WAIT covers it). */
static void decision_apply(SharedPool *p, const SharedDecision *d, bool written_here, usec_t now) {
        PoolWaiter *w = try_find(p, d->rid);
        if (w && w->replicating.grant)
                return; /* granted already: its WAIT decides */
        if (streq(d->verdict, "ready")) {
                /* A set's part could be granted here now (lua/README, "All-or-nothing sets"): the engine looks
                 * whether every pool of the set says so, and then grants the set in one call. Said of another
                 * request, or of a rid that is no set's part here: nothing to do. */
                if (w && w->gated) {
                        w->ready = true;
                        emit(p, (PoolDecision) { .verdict = POOL_VERDICT_READY, .cookie = w->cookie, .at = now });
                }
                return;
        }
        const char *wrong = decision_check(p, d, w);
        if (!wrong && w && w->gated && !w->in_call && streq(d->verdict, "granted"))
                /* Its pool alone never grants a set's part (lua/README): this pool's slots would be held while
                 * the set waits for its other pools. (While its set's grant call is out, the stream's copy of
                 * its grant may come before the call's reply: taken.) */
                wrong = "a grant of a set's part outside its set's call";
        if (wrong) {
                /* Dropped; a waiter it was about is refused, and Redis told to forget its rid (a withdraw
                 * releases a lease under it): nothing of it reaches a client. */
                bad_input(p, wrong, now);
                if (w)
                        try_refuse_locally(p, w, "bad-reply", now);
                return;
        }
        if (!w) {
                /* A grant for a rid this node sent and no longer waits for (withdrawn, cancelled, refused here
                 * during an outage) and does not hold: its client is gone, so the slots go back. One for a
                 * rid this node never sent is not its to answer; the stream's copy of a grant whose lease
                 * ended here already is neither (read late: no bad input, nothing to release again). */
                if (streq(d->verdict, "granted") && !grant_find(p, d->rid)) {
                        if (rid_was_forgotten(p, d->rid))
                                (void) queue_rid_call(p, SHARED_SCRIPT_RELEASE, d->rid, d->token, now);
                        else if (!grant_has_ended(p, d->rid, d->token)) /* a copy of one applied and ended */
                                bad_input(p, "a grant for a request this node did not send", now);
                }
                return;
        }
        if (streq(d->verdict, "granted") && p->unconfirmed_since != USEC_INFINITY &&
            outbox_has(p, SHARED_SCRIPT_SUBMIT, w->rid, true))
                /* A resumed waiter held until the primary is first confirmed, granted under its old rid by a
                 * tick of this unconfirmed one: nothing is handed out, and its submit, sent once confirmed,
                 * asks the confirmed primary where that rid stands (its grant, if it has it: lua/README). */
                return;
        if (streq(d->verdict, "granted") && p->unconfirmed_since != USEC_INFINITY) {
                /* Granted by a primary the Sentinels no longer vouch for (a tick run on it while this node is
                 * cut off with it): the waiter is refused and the slots go back, wherever the release lands
                 * (on the old primary, or "gone" on the new one). */
                try_refuse_locally(p, w, "unconfirmed", now);
                (void) queue_rid_call(p, SHARED_SCRIPT_RELEASE, d->rid, d->token, now);
                return;
        }
        usec_t at = local_time_of(p, d->at, w->arrival, now);
        if (decision_is_late(w, d, at, now)) {
                deadline_refuse(p, w, now);
                return;
        }

        if (streq(d->verdict, "queued")) {
                w->position = d->position;
                w->n_queued = d->queued;
                w->generation = p->generation; /* Redis has it now */
                if (w->queued)
                        return;
                w->queued = true;
                fp_add(p, w->rid, 'w');
                emit(p, (PoolDecision) {
                        .verdict = POOL_VERDICT_QUEUED,
                        .cookie = w->cookie,
                        .at = at,
                        .state = d->state,
                        .idle = d->idle,
                        .budget = d->budget,
                        .waiter = w,
                });
        } else if (streq(d->verdict, "granted")) {
                PoolGrant *g = grant_new(p->params.node_id, d->rid, w->lane, d);
                if (!g)
                        return; /* out of memory: the heartbeat's reconcile finds the lease again */
                token_floor_raise(p, g->token);
                const Replicating r = {
                        .grant = g,
                        .at = at,
                        .state = d->state,
                        .idle = d->idle,
                        .budget = d->budget,
                        .wait = d->wait < 0 ? 0 : (usec_t) d->wait,
                };
                if (p->min_replicas > 0) {
                        grant_hold(p, w, &r, written_here, now);
                        return;
                }
                if (w->queued)
                        fp_remove(p, w->rid, 'w');
                fp_add(p, g->rid, 'l');
                grant_deliver(p, w, &r);
        } else if (streq(d->verdict, "refused")) {
                if (w->queued)
                        fp_remove(p, w->rid, 'w');
                void *cookie = w->cookie;
                try_free(w);
                emit(p, (PoolDecision) {
                        .verdict = POOL_VERDICT_REFUSED,
                        .cookie = cookie,
                        .at = at,
                        .refusal = d->refusal,
                        .state = d->state,
                        .idle = d->idle,
                        .budget = d->budget,
                        .reason = shared_decision_reason(d),
                        .has_wait = true,
                        .wait = d->wait < 0 ? 0 : (usec_t) d->wait,
                        /* Within the cooldown from now: a pool clock gone wrong points nowhere odd. */
                        .retry_at = d->retry_at > 0 && d->reason && streq(d->reason, "cooldown") ?
                                local_time_of(p, d->retry_at, now, usec_add(now, p->cooldown)) : 0,
                });
        }
}

/* at: local monotonic. A retired pool refuses whatever comes (unavailable): never congested, as
 * pool-local.c:congested_at() has it, whatever Redis says of the pool while its holders finish. */
static void congestion_set(SharedPool *p, bool congested, usec_t at) {
        congested = congested && !p->base.retired;
        if (congested == p->congested)
                return;
        p->congested = congested;
        emit(p, (PoolDecision) {
                .verdict = POOL_VERDICT_CONGESTION,
                .at = at,
                .budget = USEC_INFINITY,
                .congested = congested,
        });
}

static void congestion_apply(SharedPool *p, bool congested, int64_t at, usec_t now) {
        congestion_set(p, congested, local_time_of(p, at, 0, now));
}

/* ---------------------------------------------------------------------------------------- the states */

static void state_set(SharedPool *p, SharedState s) {
        p->state = s;
        if (s != SHARED_STATE_UP && s != SHARED_STATE_RECLAIMING && s != SHARED_STATE_MISMATCH) {
                /* Not registered for sure any more: its own ticks first. */
                p->renew_ok = false;
                p->renewed_at = 0;
        }
        served_check(p);
        p->unavailable = s == SHARED_STATE_UP || s == SHARED_STATE_RECLAIMING ? NULL :
                         s == SHARED_STATE_MISMATCH                            ? "rules" :
                         s == SHARED_STATE_REFUSED && p->identity_conflict     ? "node-id-conflict" : "backend";
}

/* Every lease this node still vouches for is claimed again: Redis restarted, or lost the pool. */
static void reclaim_all(SharedPool *p, usec_t now) {
        list_foreach(n, &p->grants) {
                PoolGrant *g = container_of(n, PoolGrant, node);
                if (g->lost || g->provisional)
                        continue;
                g->provisional = true;
                (void) queue_reclaim(p, g, now);
        }
}

/* The calls in flight when the link went, or came back, are to go again: those given up meanwhile
 * (call_superseded()) are dropped, not sent after their withdraws (another pool's, for a set's call, goes when
 * that pool is back, maybe first). A reclaim dropped so ends no reclaiming here: the registering tick's answer
 * says whether the pool still reclaims. */
static void outbox_send_again(SharedPool *p) {
        list_foreach_safe(n, &p->outbox) {
                Call *c = container_of(n, Call, node);
                c->sent = false;
                if (call_superseded(p, c))
                        call_free(c);
        }
}

void pool_shared_link_up(Pool *base, const char *run_id, usec_t now) {
        SharedPool *p = SHARED(base);
        now = driver_now(p, now);
        if (p->run_id && run_id && !streq(p->run_id, run_id)) {
                p->reclaim_all = true;
                p->generation++;
        }
        if (run_id) {
                char *s = strdup(run_id);
                if (s) {
                        free(p->run_id);
                        p->run_id = s;
                }
        }
        p->link_up = true;
        if (p->down_since != USEC_INFINITY)
                notice_push(p, SHARED_NOTICE_BACKEND_REGAINED, NULL, NULL, 0, 0);
        p->down_since = USEC_INFINITY;
        p->refused_why = mfree(p->refused_why);
        state_set(p, SHARED_STATE_REGISTERING);
        /* Whatever was in flight is sent again, identical, after the registering tick. */
        outbox_send_again(p);
        batches_forget(p);
        p->tick_pending = p->run_pending = false;
        list_foreach_safe(n, &p->outbox) {
                Call *c = container_of(n, Call, node);
                if (c->script == SHARED_SCRIPT_TICK)
                        call_free(c); /* stale arguments; a new one is made below */
        }
        (void) queue_tick(p, false, now);
}

void pool_shared_link_down(Pool *base, usec_t now) {
        SharedPool *p = SHARED(base);
        now = driver_now(p, now);
        if (!p->link_up)
                return;
        p->link_up = false;
        outbox_send_again(p);
        batches_forget(p); /* lost with the link: its calls go again, each idempotent */
        /* A WAIT on the next connection would not cover the writes of this one, and the primary may be
         * another one by then (a failover): the grants held back for their replicas are refused. */
        list_foreach_safe(n, &p->outbox) {
                Call *c = container_of(n, Call, node);
                if (c->wait)
                        call_free(c);
        }
        replicating_refuse(p, 0, now);
        if (p->state != SHARED_STATE_FENCED && p->state != SHARED_STATE_REFUSED)
                state_set(p, SHARED_STATE_DOWN);
        p->down_since = now;
        notice_push(p, SHARED_NOTICE_BACKEND_LOST, NULL, NULL, 0, 0);
}

void pool_shared_link_failed(Pool *base, const char *why, usec_t now) {
        SharedPool *p = SHARED(base);
        now = driver_now(p, now);
        bool was_up = p->link_up;
        pool_shared_link_down(base, now);
        if (!was_up && p->down_since == USEC_INFINITY)
                p->down_since = now;
        char *s = strdup(why);
        if (s) {
                free(p->refused_why);
                p->refused_why = s;
        }
        if (p->state != SHARED_STATE_REFUSED)
                notice_push(p, SHARED_NOTICE_REFUSED, NULL, why, 0, 0);
        p->identity_conflict = false; /* the link's cause first; the next registering tick says the rest */
        state_set(p, SHARED_STATE_REFUSED);
}

void pool_shared_set_last_ack(Pool *base, usec_t boot) {
        SharedPool *p = SHARED(base);
        if (p->acked_boot == USEC_INFINITY || boot > p->acked_boot)
                p->acked_boot = boot;
        if (p->alive_boot == USEC_INFINITY || boot > p->alive_boot)
                p->alive_boot = boot;
}

/* What the vouch deadline counts from (USEC_INFINITY: nothing yet). The last acknowledged heartbeat; behind
 * Sentinels, no later than the last confirmation of the primary either. A brokerd cut off together with
 * the old primary gets its heartbeats acknowledged by it for ever, but the Sentinels' failover F came after
 * the last round in which a majority of them named it (they promote only once a majority sees it down),
 * and the new primary grants this node's slots no earlier than F + TTL (its recovery window, README): so a
 * deadline counted from the last confirmation stops this node's commands before then. Before the first
 * confirmation no lease of this node was granted (nothing is granted unconfirmed): only leases restored
 * at a start, which count from the daemon's last proof of life as they do before the first heartbeat. */
static usec_t vouch_base(const SharedPool *p) {
        if (p->params.confirm_stale == 0)
                return p->acked_boot;
        if (p->confirmed_boot == 0)
                return p->alive_boot;
        return MIN(p->acked_boot, p->confirmed_boot);
}

/* Until when this node can vouch for what Redis decided for it (USEC_INFINITY: no heartbeat acknowledged
 * yet). Redis drops this node, its leases and its waiters, no earlier than acked + TTL; its commands must
 * be gone before, with the revoke grace to let go and 2 s for a forward step of Redis's clock (memo §4.3). */
static usec_t vouch_deadline(const SharedPool *p) {
        usec_t base = vouch_base(p);
        if (base == USEC_INFINITY)
                return USEC_INFINITY;
        usec_t margin = p->params.revoke_grace + SHARED_FENCE_SLACK;
        usec_t end = usec_add(base, p->fence_ttl);
        return end > margin ? end - margin : 0;
}

/* Behind Sentinels: a confirmation older than confirm_stale makes the pool refused as if its backend could
 * not be reached (waiters kept for the grace, leases until the self-fence), and a fresh one serves it again. */
static void confirm_update(SharedPool *p, usec_t boot_now, usec_t now) {
        if (p->params.confirm_stale == 0)
                return;
        /* Resting, no round tells how old the confirmation gets: it counts as stale from the rest's start. */
        bool fresh = !p->confirm_resting && p->primary_confirmed_boot > 0 &&
                boot_now < usec_add(p->primary_confirmed_boot, p->params.confirm_stale);
        if (fresh == (p->unconfirmed_since == USEC_INFINITY))
                return;
        if (fresh) {
                p->unconfirmed_since = USEC_INFINITY;
                p->confirm_quiet = false;
                served_check(p);
                if (p->unconfirmed_noticed)
                        notice_push(p, SHARED_NOTICE_CONFIRMED, NULL, NULL, 0, 0);
                p->unconfirmed_noticed = false;
                return;
        }
        p->unconfirmed_since = now;
        if (p->confirm_resting) {
                p->confirm_quiet = true; /* nothing lost: nobody asked */
                return;
        }
        /* Not at start (never confirmed yet): a pool that was never served has lost nothing to tell of. */
        if (p->confirmed_boot > 0) {
                notice_push(p, SHARED_NOTICE_UNCONFIRMED, NULL, NULL, 0, 0);
                p->unconfirmed_noticed = true;
        }
}

void pool_shared_set_confirmed(Pool *base, usec_t confirmed_boot, usec_t boot_now, usec_t now) {
        SharedPool *p = SHARED(base);
        now = driver_now(p, now);
        /* The fence keeps the latest of them: a primary the Sentinels moved to by one's word is not proof
         * that the one before was still theirs any later. */
        if (confirmed_boot > p->confirmed_boot)
                p->confirmed_boot = confirmed_boot;
        p->primary_confirmed_boot = confirmed_boot;
        confirm_update(p, boot_now, now);
}

void pool_shared_set_confirm_resting(Pool *base, bool resting, usec_t boot_now, usec_t now) {
        SharedPool *p = SHARED(base);
        now = driver_now(p, now);
        p->confirm_resting = resting;
        confirm_update(p, boot_now, now);
}

void pool_shared_confirm_round_failed(Pool *base, usec_t now) {
        SharedPool *p = SHARED(base);
        now = driver_now(p, now);
        if (!p->confirm_quiet || p->unconfirmed_since == USEC_INFINITY || p->confirm_resting)
                return;
        /* The round a request woke did not confirm the primary: lost as if the rounds had gone on (a brokerd
         * cut off with an old primary is one that rested), as of the first request held. Those that may not
         * wait go now; the others have the waiter grace from the first one held. */
        p->confirm_quiet = false;
        p->unconfirmed_since = MIN(now, p->start_since);
        p->start_since = USEC_INFINITY;
        if (p->confirmed_boot > 0) {
                notice_push(p, SHARED_NOTICE_UNCONFIRMED, NULL, NULL, 0, 0);
                p->unconfirmed_noticed = true;
        }
        list_foreach_safe(n, &p->tries) {
                PoolWaiter *w = container_of(n, PoolWaiter, node);
                if (!w->may_wait)
                        try_refuse_locally(p, w, "unconfirmed", now);
        }
}

usec_t pool_shared_get_confirmed(const Pool *base) {
        return SHARED(base)->confirmed_boot;
}

usec_t pool_shared_fence_deadline(const Pool *base) {
        SharedPool *p = SHARED(base);
        bool any = false;
        list_foreach(n, &p->grants)
                if (!container_of(n, PoolGrant, node)->lost)
                        any = true;
        return any ? vouch_deadline(p) : USEC_INFINITY;
}

void pool_shared_fence_check(Pool *base, usec_t boot_now, usec_t now) {
        SharedPool *p = SHARED(base);
        now = driver_now(p, now);
        confirm_update(p, boot_now, now);
        usec_t v = vouch_deadline(p);
        if (v != USEC_INFINITY && boot_now >= v && p->stale_ack != vouch_base(p)) {
                /* Redis may have dropped this node (a brokerd stopped, or cut off, for a TTL): a grant it made
                 * for one of our waiters before that may still sit unread in the stream or in a reply, and
                 * its slots be another node's by now. The waiters go, so that such a grant finds none and
                 * is released; once per silence (requests made since are Redis's to decide again). */
                p->stale_ack = vouch_base(p);
                refuse_all_tries(p, "backend", now);
        }
        usec_t f = pool_shared_fence_deadline(base);
        if (f == USEC_INFINITY || boot_now < f)
                return;
        notice_push(p, SHARED_NOTICE_FENCED, NULL, NULL, 0, 0);
        if (p->state == SHARED_STATE_DOWN)
                state_set(p, SHARED_STATE_FENCED);
        list_foreach(n, &p->grants)
                grant_lose(p, container_of(n, PoolGrant, node), "fenced", false, now);
}

/* While the backend cannot be reached, waiters are kept for the grace (a short blip should not cost them
 * their place), then refused so that their clients can go elsewhere. */
static void check_waiter_grace(SharedPool *p, usec_t now) {
        usec_t since = outage_since(p);
        if (since == USEC_INFINITY || now < usec_add(since, p->params.waiter_grace))
                return;
        /* The cause that began first; at a start behind Sentinels (never confirmed), "unconfirmed" once Redis
         * registered the node, "backend" while it was not reached. */
        bool unconfirmed = p->confirmed_boot == 0 ?
                p->unconfirmed_since != USEC_INFINITY && state_sends_operations(p->state) :
                p->unconfirmed_since < MIN(p->down_since, p->start_since);
        refuse_all_tries(p, unconfirmed ? "unconfirmed" : "backend", now);
}

/* --------------------------------------------------------------------------------------------- replies */

/* Stream ids "MS-SEQ" in order (numbers compared as numbers). */
static int stream_id_cmp(const char *a, const char *b) {
        unsigned long long ams = 0, aseq = 0, bms = 0, bseq = 0;
        (void) sscanf(a, "%llu-%llu", &ams, &aseq);
        (void) sscanf(b, "%llu-%llu", &bms, &bseq);
        if (ams != bms)
                return ams < bms ? -1 : 1;
        return aseq < bseq ? -1 : aseq > bseq;
}

/* The place of the configured member a reply names, or -1 (none, or not a string). The pool's member sets are
 * kept with its members (pool_members_replace()): a binary search, where a scan per entry made a reply listing
 * thousands of members of a pool of thousands O(entries × members). */
static ssize_t member_index(const SharedPool *p, const RespValue *v) {
        if (!v || v->type != RESP_STRING)
                return -1;
        return member_sets_find(p->base.member_sets, v->str, v->len);
}

static void rests_clear(SharedPool *p) {
        for (size_t i = 0; i < p->cache.n_rests; i++)
                free((char *) p->cache.rests[i].member);
        p->cache.rests = mfree(p->cache.rests);
        p->cache.n_rests = 0;
}

#define SHARED_RESTS_MAX 256 /* prelude.lua, rests.PAGE: the most rests a cache lists */

/* The cache's rests ([13], README "Replies"): { identity, end, … } — a member of this pool's by name, or
 * "#INDEX" below the limit, and its end on the pool clock (a decimal). An identity this node does not know
 * is left out (a reload not agreed yet; garbage, which the scripts end and report themselves); a list of
 * another shape is bad input, dropped (Status shows none rather than something made up). None without the
 * element, or with nil (the scripts send an empty list so). */
static void rests_apply(SharedPool *p, const RespValue *v, int64_t pool_now, usec_t now) {
        rests_clear(p);
        p->cache.rest_at = -1;
        if (!v || v->type == RESP_NIL)
                return;
        size_t n = v->type == RESP_ARRAY ? v->n / 2 : 0;
        if (v->type != RESP_ARRAY || v->n % 2 != 0 || n > SHARED_RESTS_MAX) {
                bad_input(p, "a malformed list of rests", now);
                return;
        }
        _cleanup_free_ PoolRest *rests = calloc(MAX(n, (size_t) 1), sizeof(PoolRest));
        if (!rests)
                return;
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
                const RespValue *id = &v->elements[2 * i], *end = &v->elements[2 * i + 1];
                int64_t until = 0;
                unsigned idx;
                /* A score as Redis prints it: an integer below 2^53 is its digits ("inf", "1e+20": garbage). */
                if (id->type != RESP_STRING || id->len == 0 || id->len > SHARED_TEXT_LEN_MAX ||
                    end->type != RESP_STRING || end->len == 0 || end->len > 16)
                        goto bad;
                for (size_t j = 0; j < end->len; j++) {
                        if (end->str[j] < '0' || end->str[j] > '9')
                                goto bad;
                        until = until * 10 + (end->str[j] - '0');
                }
                if (p->cache.rest_at < 0 || until < p->cache.rest_at)
                        p->cache.rest_at = until;
                if (id->str[0] == '#') {
                        if (p->base.members || !shared_index_parse(id->str + 1, id->len - 1, p->base.limit, &idx))
                                continue;
                        rests[k].member = NULL;
                } else {
                        ssize_t j = member_index(p, id);
                        if (j < 0 || (size_t) j >= p->base.limit)
                                continue;
                        idx = (unsigned) j;
                        if (!(rests[k].member = strdup(p->base.members[j])))
                                goto fail;
                }
                rests[k].index = idx;
                /* Its end in this node's clock: never before now (a rest Redis has not woken yet). */
                rests[k].until = until <= pool_now ? now :
                        local_time_of(p, until, now, usec_add(now, (usec_t) (until - pool_now)));
                k++;
        }
        p->cache.rests = TAKE_PTR(rests);
        p->cache.n_rests = k;
        return;
bad:
        bad_input(p, "a malformed list of rests", now);
fail:
        for (size_t i = 0; i < k; i++)
                free((char *) rests[i].member);
}

/* ---- members' lives (SPEC §3.6): Redis keeps them, the node mirrors them ---- */

#define LIFE_TEXT_MAX 1024 /* a job or a reason, as brokerd takes them (methods.c, REASON_MAX) */

/* Takes s (NULL: none) for a decision about to be emitted, and returns it: freed 64 emits later. */
static const char *emitted_keep(SharedPool *p, char *s) {
        if (!s)
                return NULL;
        size_t i = p->emitted_next++ % ELEMENTSOF(p->emitted);
        free(p->emitted[i]);
        p->emitted[i] = s;
        return s;
}

static void life_clear(PoolMemberLife *m) {
        m->job = mfree(m->job);
        m->reason = mfree(m->reason);
        m->node = mfree(m->node);
        m->quarantined = false;
        m->since = 0;
        m->exit_status = -1;
}

static void life_free(PoolMemberLife *life, size_t n) {
        for (size_t i = 0; i < n; i++) {
                life_clear(life + i);
                free(life[i].member);
        }
        free(life);
}

/* One line of text from Redis (untrusted): at most LIFE_TEXT_MAX bytes, no C0 control character or DEL; NULL for
 * an empty one. *bad set when it is not one. A C1 character or U+2028/U+2029 is mapped to '?' as a node maps a
 * job label it writes (conf_text_sanitize()): a node of a version before that one wrote them there. */
static char *life_text(const RespValue *v, bool *bad) {
        if (!v || v->type != RESP_STRING || v->len > LIFE_TEXT_MAX) {
                *bad = true;
                return NULL;
        }
        for (size_t i = 0; i < v->len; i++)
                if ((unsigned char) v->str[i] < 0x20 || v->str[i] == 0x7f) {
                        *bad = true;
                        return NULL;
                }
        return v->len > 0 ? conf_text_sanitize(resp_strdup(v)) : NULL;
}

/* The lives of the members as configured, not the pool's yet (life_adopt()). Returns 0, -ENOMEM. */
static int life_prepare(char *const *members, PoolMemberLife **ret, size_t *ret_n) {
        size_t n = strv_length(members);
        PoolMemberLife *life = calloc(MAX(n, (size_t) 1), sizeof(PoolMemberLife));
        if (!life)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                life[i] = (PoolMemberLife) { .exit_status = -1, .member = strdup(members[i]) };
                if (!life[i].member) {
                        life_free(life, i);
                        return -ENOMEM;
                }
        }
        *ret = life;
        *ret_n = n;
        return 0;
}

/* Room for life_adopt()'s work on n configured members: made by configure_prepare(), as commit cannot fail. */
static size_t *life_adopt_room(const SharedPool *p, size_t n) {
        return calloc(2 * n + p->n_life + p->n_gone + 1, sizeof(size_t));
}

/* The indices of the lives that have a member (name), sorted by it, in `order`. Returns how many. */
static size_t life_order(const PoolMemberLife *lives, size_t n, size_t *order) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
                if (lives[i].member)
                        order[k++] = i;
        if (k > 0)
                strv_order_sort(order, k, &lives[0].member, sizeof(PoolMemberLife));
        return k;
}

/* The members as configured (life_prepare()'s, taken over), each keeping its quarantine by name (a reload's
 * next reply says it again), and this node's counts of it: from its life, or from when a reload dropped it.
 * The lives this drops keep their counts in `gone`, room for them all (p->n_life + p->n_gone), taken over;
 * `room` is life_adopt_room()'s, taken over.
 *
 * The k-th configured member of a name (in configuration order: one, as configurations have no name twice)
 * takes the k-th life of that name, or when there are fewer the next count kept of that name in `gone`: the
 * three sorted by name and walked together, O(n log n), where a scan of the lives and counts for each member
 * compared 10,000 × 10,000 names at a reload of 10,000 members. */
static void life_adopt(SharedPool *p, PoolMemberLife *life, size_t n, PoolMemberLife *gone, size_t *room) {
        size_t *by_new = room, *by_life = by_new + n, *by_gone = by_life + p->n_life, *match = by_gone + p->n_gone;
        size_t n_new = life_order(life, n, by_new), n_life = life_order(p->life, p->n_life, by_life),
               n_old_gone = life_order(p->gone, p->n_gone, by_gone);
        for (size_t a = 0, c = 0, e = 0; a < n_new;) {
                const char *name = life[by_new[a]].member;
                while (c < n_life && strcmp(p->life[by_life[c]].member, name) < 0)
                        c++;
                while (e < n_old_gone && strcmp(p->gone[by_gone[e]].member, name) < 0)
                        e++;
                size_t lives = 0, counts = 0;
                while (c + lives < n_life && streq(p->life[by_life[c + lives]].member, name))
                        lives++;
                while (e + counts < n_old_gone && streq(p->gone[by_gone[e + counts]].member, name))
                        counts++;
                for (size_t k = 0; a < n_new && streq(life[by_new[a]].member, name); k++, a++)
                        match[by_new[a]] = k < lives ? by_life[c + k]
                                         : k - lives < counts ? p->n_life + by_gone[e + k - lives]
                                                              : SIZE_MAX;
                c += lives;
                e += counts;
        }
        /* Names compared above are freed below: the matches first, then the moves. */
        for (size_t i = 0; i < n; i++) {
                size_t j = life[i].member ? match[i] : SIZE_MAX;
                if (j < p->n_life) {
                        char *member = life[i].member;
                        life[i] = p->life[j];
                        free(life[i].member);
                        life[i].member = member;
                        p->life[j] = (PoolMemberLife) {};
                } else if (j != SIZE_MAX) {
                        j -= p->n_life;
                        life[i].grants = p->gone[j].grants;
                        life[i].held = p->gone[j].held;
                        life[i].quarantines = p->gone[j].quarantines;
                        p->gone[j].member = mfree(p->gone[j].member);
                }
        }
        free(room);
        size_t n_gone = 0;
        for (size_t j = 0; j < p->n_gone; j++)
                if (p->gone[j].member)
                        gone[n_gone++] = p->gone[j];
        for (size_t j = 0; j < p->n_life; j++)
                if (p->life[j].member) {
                        gone[n_gone++] = (PoolMemberLife) { .member = TAKE_PTR(p->life[j].member), .exit_status = -1,
                                                            .grants = p->life[j].grants, .held = p->life[j].held,
                                                            .quarantines = p->life[j].quarantines };
                }
        life_free(p->life, p->n_life);
        free(p->gone);
        p->life = life;
        p->n_life = n;
        p->gone = gone;
        p->n_gone = n_gone;
}

/* The cache's [14]: { { member, since, job, exit status, node name, reason }… }, the quarantined members.
 * Absent (a reply of a brokerd's scripts from before): nothing changes; nil: none (the scripts send an empty
 * list so). An entry that is not one (garbage written by hand) is dropped and counted; a member not listed is
 * not quarantined. */
static void life_apply(SharedPool *p, const RespValue *list, usec_t now) {
        if (!list || !p->life)
                return;
        if (list->type == RESP_NIL) {
                for (size_t i = 0; i < p->n_life; i++)
                        life_clear(p->life + i);
                return;
        }
        if (list->type != RESP_ARRAY)
                return;
        bool *seen = calloc(MAX(p->n_life, (size_t) 1), sizeof(bool));
        if (!seen)
                return; /* the next reply says it again */
        bool bad = false;
        for (size_t k = 0; k < list->n; k++) {
                const RespValue *e = &list->elements[k];
                ssize_t i = e->type == RESP_ARRAY && e->n >= 6 ? member_index(p, resp_at(e, 0)) : -1;
                int64_t since = 0, status = -1;
                if (i < 0 || (size_t) i >= p->n_life || seen[i] || !resp_int(resp_at(e, 1), &since)) {
                        bad = true;
                        continue;
                }
                seen[i] = true;
                PoolMemberLife *m = p->life + i;
                bool was = m->quarantined;
                usec_t at = was ? m->since : local_time_of(p, since, 0, now);
                life_clear(m);
                m->quarantined = true;
                m->since = at;
                m->job = life_text(resp_at(e, 2), &bad);
                if (resp_int(resp_at(e, 3), &status) && status >= 0 && status <= 255)
                        m->exit_status = (int) status;
                m->node = life_text(resp_at(e, 4), &bad);
                m->reason = life_text(resp_at(e, 5), &bad);
        }
        for (size_t i = 0; i < p->n_life; i++)
                if (!seen[i])
                        life_clear(p->life + i);
        free(seen);
        if (bad)
                bad_input(p, "a malformed quarantine record in a reply", now);
}

/* A notice { "quarantined" | "restored", member, at, job, exit status, node name, reason }: this node's call
 * made the change, so this node (and no other: README, "Members' lives") tells the engine, which journals
 * it ([QUARANTINED]/[RESTORED]). */
static void life_notice(SharedPool *p, const RespValue *n, bool quarantined, usec_t now) {
        ssize_t i = member_index(p, resp_at(n, 1));
        if (i < 0) {
                bad_input(p, "a quarantine notice of no configured member", now);
                return;
        }
        bool bad = false;
        int64_t status = -1, at = 0;
        usec_t when = resp_int(resp_at(n, 2), &at) ? local_time_of(p, at, 0, now) : now;
        const char *job = emitted_keep(p, life_text(resp_at(n, 3), &bad)),
                   *reason = emitted_keep(p, life_text(resp_at(n, 6), &bad));
        if (!resp_int(resp_at(n, 4), &status) || status < 0 || status > 255)
                status = -1;
        /* Told to this node alone: the nodes' quarantine counters add up to the fleet's. */
        if (quarantined && (size_t) i < p->n_life)
                p->life[i].quarantines++;
        pool_emit(&p->base, &(PoolDecision) {
                .verdict = POOL_VERDICT_MEMBER,
                .pool = &p->base,
                .at = when,
                .member = p->base.members[i],
                .quarantined = quarantined,
                .job = job,
                .exit_status = (int) status, /* a restore's: 0 by a health job, -1 by hand */
                .note = reason,
        });
        if (bad)
                bad_input(p, "a malformed quarantine notice in a reply", now);
}

/* ---- drains with who, why and until (SPEC §3.6): Redis keeps them and ends them, the node mirrors them ---- */

static void drains_clear(SharedPool *p) {
        for (size_t i = 0; i < p->n_drains; i++) {
                free((char *) p->drains[i].member);
                free((char *) p->drains[i].who);
                free((char *) p->drains[i].reason);
        }
        p->drains = mfree(p->drains);
        p->n_drains = 0;
}

/* The cache's [15]: { { "" (the pool) | member, since, who, reason, until (-1: none), node name }… }. Absent
 * (scripts from before): nothing changes; nil: none (the scripts send an empty list so). An entry that is not
 * one, or names a drain listed before it (Redis lists each once), is dropped and counted. */
static void drains_apply(SharedPool *p, const RespValue *list, usec_t now) {
        if (list && list->type == RESP_NIL) {
                drains_clear(p);
                return;
        }
        if (!list || list->type != RESP_ARRAY)
                return;
        size_t cap = strv_length(p->base.members) + 1;
        EngineDrainInfo *d = calloc(MAX(MIN(list->n, cap), (size_t) 1), sizeof(EngineDrainInfo));
        /* Which members (by their first place: member_index()) and whether the pool were taken already: a scan
         * of those taken for each entry made a list of thousands O(entries²). */
        _cleanup_free_ bool *taken = calloc(cap, sizeof(bool));
        if (!d || !taken) {
                free(d);
                return; /* the next reply says it again */
        }
        size_t n = 0;
        bool bad = false, pool_taken = false;
        for (size_t k = 0; k < list->n; k++) {
                const RespValue *e = &list->elements[k];
                const RespValue *field = e->type == RESP_ARRAY && e->n >= 6 ? resp_at(e, 0) : NULL;
                int64_t since = 0, until = -1;
                ssize_t i = field && field->type == RESP_STRING && field->len > 0 ? member_index(p, field) : -1;
                bool pool = field && field->type == RESP_STRING && field->len == 0;
                bool twice = pool ? pool_taken : i >= 0 && taken[i];
                if ((!pool && i < 0) || twice || n >= cap || !resp_int(resp_at(e, 1), &since) ||
                    !resp_int(resp_at(e, 4), &until)) {
                        bad = true;
                        continue;
                }
                if (pool)
                        pool_taken = true;
                else
                        taken[i] = true;
                d[n] = (EngineDrainInfo) {
                        .pool = p->base.name,
                        .member = pool ? NULL : strdup(p->base.members[i]),
                        .since = local_time_of(p, since, 0, now),
                        .until = until < 0 ? USEC_INFINITY : local_time_of(p, until, 0, USEC_INFINITY - 1),
                        .who = life_text(resp_at(e, 2), &bad),
                        .reason = life_text(resp_at(e, 3), &bad),
                };
                n++;
        }
        drains_clear(p);
        p->drains = d;
        p->n_drains = n;
        if (bad)
                bad_input(p, "a malformed drain record in a reply", now);
}

/* A notice { "drained" | "undrained", "" | member, at, who, reason, until (-1), expired (0/1) }: this node's
 * call made it (an expiry: this node's call ran the instant of its until), told once fleet-wide. */
static void drain_notice(SharedPool *p, const RespValue *n, bool drained, usec_t now) {
        const RespValue *field = resp_at(n, 1);
        ssize_t i = field && field->type == RESP_STRING && field->len > 0 ? member_index(p, field) : -1;
        if (!field || field->type != RESP_STRING || (field->len > 0 && i < 0)) {
                bad_input(p, "a drain notice of no configured member", now);
                return;
        }
        bool bad = false;
        int64_t at = 0, until = -1, expired = 0;
        usec_t when = resp_int(resp_at(n, 2), &at) ? local_time_of(p, at, 0, now) : now;
        const char *who = emitted_keep(p, life_text(resp_at(n, 3), &bad)),
                   *reason = emitted_keep(p, life_text(resp_at(n, 4), &bad));
        (void) resp_int(resp_at(n, 5), &until);
        (void) resp_int(resp_at(n, 6), &expired);
        pool_emit(&p->base, &(PoolDecision) {
                .verdict = POOL_VERDICT_DRAIN,
                .pool = &p->base,
                .at = when,
                .member = i >= 0 ? p->base.members[i] : NULL,
                .drained = drained,
                .job = who,
                .note = reason,
                .until = until < 0 ? USEC_INFINITY : local_time_of(p, until, 0, USEC_INFINITY - 1),
                .expired = expired != 0,
                .exit_status = -1,
        });
        if (bad)
                bad_input(p, "a malformed drain notice in a reply", now);
}

/* The pool's epoch as a reply says it (tick body [2], cache [8]): another one than last seen is a pool made
 * anew, whatever Redis held before lost (README, "Integrity"). Only counted here: a tick's decides the
 * reclaims. */
static void generation_see_epoch(SharedPool *p, const RespValue *v) {
        if (!v || v->type != RESP_STRING || v->len == 0 || v->len > SHARED_TEXT_LEN_MAX)
                return;
        if (p->seen_epoch && resp_is(v, p->seen_epoch))
                return;
        char *e = resp_strdup(v);
        if (!e)
                return;
        if (p->seen_epoch)
                p->generation++;
        free(p->seen_epoch);
        p->seen_epoch = e;
}

/* The pool as a reply's cache shows it. None ({}): an early reply, or a batch's operation that left it to the
 * next one's reply (brokerd/lua/README, "Batches"), applied in order right after. */
static void cache_apply(SharedPool *p, const RespValue *cache, int64_t pool_now, usec_t now) {
        int64_t x;
        if (!cache || cache->type != RESP_ARRAY || cache->n < 11)
                return;
        generation_see_epoch(p, resp_at(cache, 7));
        p->cache.valid = true;
        p->cache.at = now;
        if (resp_int(resp_at(cache, 0), &x))
                p->cache.in_use = (uint64_t) MAX(x, (int64_t) 0);
        if (resp_int(resp_at(cache, 1), &x))
                p->cache.waiting = (uint64_t) MAX(x, (int64_t) 0);
        if (resp_int(resp_at(cache, 2), &x))
                p->cache.congested = x != 0;
        if (resp_int(resp_at(cache, 3), &x))
                p->cache.idle = (usec_t) MAX(x, (int64_t) 0);
        /* A drain is the pool's, whichever node asked: this node's Status says so, and its engine routes
         * past the pool as past a local drained one, until a reply says it is undrained. */
        if (resp_int(resp_at(cache, 4), &x))
                p->base.drained = x != 0;
        if (resp_int(resp_at(cache, 5), &x))
                p->cache.next_wakeup = x;
        p->cache.gauge_at = -1;
        if (!p->cache.congested && p->base.queue_timeout_set && p->base.queue_timeout < (usec_t) INT64_MAX / 2 &&
            p->cache.idle < (usec_t) INT64_MAX / 2)
                p->cache.gauge_at = pool_now - (int64_t) p->cache.idle + (int64_t) p->base.queue_timeout + 1;
        if (resp_int(resp_at(cache, 6), &x))
                p->cache.counter = (uint64_t) MAX(x, (int64_t) 0);
        /* Only shown (Status): a limit no configuration could have is not one. */
        if (resp_int(resp_at(cache, 10), &x))
                p->cache.limit = x >= 1 && x <= (int64_t) CONF_LIMIT_MAX ? (unsigned) x : 0;
        /* A window this node has not told of: the pool's first use, or a restart another node saw first. One
         * that a later call prolongs (the first script after a restart opens it, the run id check again) is
         * the same window. */
        if (resp_int(resp_at(cache, 8), &x)) {
                p->cache.recovery_until = x;
                if (x > pool_now) {
                        /* What opened it (README, "Recovery windows"): a word the journal entry explains;
                         * anything else (an older brokerd's scripts, garbage) says nothing. */
                        static const char *const causes[] = {
                                "new", "restart", "lost:rules", "lost:clock", "lost:leases", "lost:waiters",
                                "lost:slots", "lost:free slots", "lost:records", "lost:nodes", "lost:node records",
                                "lost:rests", "lost:meta",
                        };
                        const RespValue *why = resp_at(cache, 11);
                        const char *cause = NULL;
                        for (size_t i = 0; i < ELEMENTSOF(causes); i++)
                                if (resp_is(why, causes[i]))
                                        cause = causes[i];
                        if (p->recovery_noticed <= pool_now)
                                notice_push(p, SHARED_NOTICE_RECOVERY, NULL, cause, 0, 0);
                        p->recovery_noticed = MAX(p->recovery_noticed, x);
                }
        }
        const RespValue *last = resp_at(cache, 9);
        if (last && last->type == RESP_STRING && last->len > 0 && !shared_stream_id_is_valid(last->str, last->len))
                bad_input(p, "a malformed stream id in a reply", now);
        else if (last && last->type == RESP_STRING && last->len > 0) {
                char *l = resp_strdup(last);
                if (l && (!p->cache.stream_last || stream_id_cmp(l, p->cache.stream_last) > 0)) {
                        free(p->cache.stream_last);
                        p->cache.stream_last = TAKE_PTR(l);
                }
                free(l);
        }
        rests_apply(p, resp_at(cache, 12), pool_now, now);
        life_apply(p, resp_at(cache, 13), now);
        drains_apply(p, resp_at(cache, 14), now);
        /* Another node's call may have flipped the gauge: this node's own gauge follows the pool's. */
        congestion_apply(p, p->cache.congested, pool_now, now);
}

static void notices_apply(SharedPool *p, const RespValue *notices, usec_t now) {
        for (size_t i = 0; notices && notices->type == RESP_ARRAY && i < notices->n; i++) {
                const RespValue *n = &notices->elements[i];
                int64_t leases = 0, waiters = 0;
                /* A rest record in Redis that was garbage, ended by this call (prelude.lua, "cooldown"). */
                if (resp_is(resp_at(n, 0), "bad-rest")) {
                        bad_input(p, "a garbage rest in Redis (ended)", now);
                        continue;
                }
                /* Garbage that this call repaired in a key of the members' lives (README, "Members' lives"), a
                 * lane's counts or a node's fingerprint. */
                if (resp_is(resp_at(n, 0), "bad-key")) {
                        static const struct {
                                const char *key, *what;
                        } keys[] = {
                                { "qm", "garbage in Redis's quarantines (dropped)" },
                                { "qf", "garbage in Redis's failure counts (dropped)" },
                                { "dm", "a drained member's place lost its entry in Redis (given back)" },
                                { "hq", "garbage in Redis's health queue (repaired)" },
                                { "dr", "a garbage drain record in Redis (repaired)" },
                                { "du", "a garbage drain end in Redis (ended)" },
                                { "rekey", "garbage in Redis's rekey job (dropped)" },
                                { "meta", "wrong health waiter counts in Redis (healed)" },
                                { "lane", "garbage or wrong numbers in a lane's counts in Redis (counted again)" },
                                { "sel", "a wrong count of the waiters with a selector in Redis (counted again)" },
                                { "fp", "garbage in a node's fingerprint in Redis (counted again)" },
                                { "h", "a garbage lease record in Redis (dropped; the pool is made anew)" },
                                { "w", "a garbage waiter record in Redis (dropped; the pool is made anew)" },
                                { "rid", "a request's reference in Redis naming another's record (dropped)" },
                        };
                        const char *what = "garbage in Redis (repaired)";
                        for (size_t j = 0; j < ELEMENTSOF(keys); j++)
                                if (resp_is(resp_at(n, 1), keys[j].key))
                                        what = keys[j].what;
                        bad_input(p, what, now);
                        continue;
                }
                if (resp_is(resp_at(n, 0), "quarantined") || resp_is(resp_at(n, 0), "restored")) {
                        life_notice(p, n, resp_is(resp_at(n, 0), "quarantined"), now);
                        continue;
                }
                if (resp_is(resp_at(n, 0), "drained") || resp_is(resp_at(n, 0), "undrained")) {
                        drain_notice(p, n, resp_is(resp_at(n, 0), "drained"), now);
                        continue;
                }
                if (!resp_is(resp_at(n, 0), "node-expired"))
                        continue;
                _cleanup_free_ char *name = resp_strdup_max(resp_at(n, 2), SHARED_TEXT_LEN_MAX);
                (void) resp_int(resp_at(n, 3), &leases);
                (void) resp_int(resp_at(n, 4), &waiters);
                notice_push(p, SHARED_NOTICE_NODE_EXPIRED, name, NULL, (uint64_t) leases, (uint64_t) waiters);
        }
}

static void events_apply(SharedPool *p, const RespValue *events, usec_t now) {
        for (size_t i = 0; events && events->type == RESP_ARRAY && i < events->n; i++) {
                const RespValue *e = &events->elements[i];
                if (resp_is(resp_at(e, 0), "congestion")) {
                        int64_t at = 0, c = 0;
                        (void) resp_int(resp_at(e, 1), &at);
                        (void) resp_int(resp_at(e, 3), &c);
                        /* Of before the pool came (gauge_from): the reply's cache tells the state it came to. */
                        if (local_time_of(p, at, 0, now) >= p->gauge_from)
                                congestion_apply(p, c != 0, at, now);
                        continue;
                }
                SharedDecision d;
                if (shared_decision_from_array(e, p->base.limit, &d) < 0) {
                        bad_input_about(p, d.rid, "a malformed event in a reply", now);
                        continue;
                }
                decision_apply(p, &d, true, now);
                shared_decision_done(&d);
        }
}

/* A call that cannot be made now (the node is not registered, its rules differ): sent again once the
 * node is up. A submit is answered here instead: its client should not wait for an agreement. */
static void call_park(SharedPool *p, Call *c, bool ran, const char *reason, usec_t now) {
        if (c->script == SHARED_SCRIPT_SUBMIT) {
                PoolWaiter *w = try_find(p, c->rid);
                /* One that may have run is withdrawn; one that did not is dropped (by try_refuse_locally()).
                 * Answered, it is not out: left marked so, it stayed in the outbox with a needless withdraw
                 * after it, and held every later call of the pool back (call_waits_for_company()). */
                c->ever_sent = ran;
                c->sent = false;
                if (ran || !w)
                        call_free(c);
                if (w)
                        try_refuse_locally(p, w, reason, now);
                return;
        }
        if (c->script == SHARED_SCRIPT_POSITIONS || c->script == SHARED_SCRIPT_TICK) {
                call_free(c); /* made again from the state of the day */
                return;
        }
        /* A Redis out of memory, or something answering garbage at once: not again at once, or the loop
         * would spin on it. */
        if (call_again(p, c, now))
                c->held = ran;
}

static bool outbox_holds_only(SharedPool *p, const Call *c) {
        list_foreach(n, &p->outbox)
                if (container_of(n, Call, node) != c)
                        return false;
        return true;
}

/* A recovery window may be waiting for this node: it says at once that Redis has its leases back, rather
 * than at the next heartbeat (the pool's grants resume that much sooner). The tick it sends carries "1":
 * its answer does not come back here. */
static void tell_reclaimed(SharedPool *p, usec_t now) {
        if (p->cache.recovery_until != 0 && reclaimed(p))
                (void) queue_tick(p, false, now);
}

/* The last reclaim answered, or dropped with its lease (call_again(), shared_release()). */
static void reclaiming_end(SharedPool *p, usec_t now) {
        if (p->state == SHARED_STATE_RECLAIMING && !has_provisional(p)) {
                state_set(p, SHARED_STATE_UP);
                tell_reclaimed(p, now);
        }
}

static void tick_done(SharedPool *p, const RespValue *status, const RespValue *body, usec_t sent_boot,
                      Call *c, usec_t now) {
        bool rules_ok = resp_is(status, "ok");
        /* A heartbeat went through: the calls held after a failed answer may go again. */
        list_foreach(n, &p->outbox)
                container_of(n, Call, node)->held = false;
        /* The heartbeat counts either way: leases granted under agreed rules keep their node alive. */
        if (p->acked_boot == USEC_INFINITY || sent_boot > p->acked_boot)
                p->acked_boot = sent_boot;
        p->renew_ok = true;

        generation_see_epoch(p, resp_at(body, 1));
        _cleanup_free_ char *epoch = resp_strdup_max(resp_at(body, 1), SHARED_TEXT_LEN_MAX);
        if (epoch) {
                if (p->cache.epoch && !streq(p->cache.epoch, epoch))
                        p->reclaim_all = true;
                free(p->cache.epoch);
                p->cache.epoch = TAKE_PTR(epoch);
        }
        int64_t nodes;
        if (resp_int(resp_at(body, 7), &nodes))
                p->n_nodes = (unsigned) MAX(nodes, (int64_t) 0);
        const RespValue *last = resp_at(body, 6);
        if (!p->stream_resume) {
                /* It goes back to Redis as XREAD's argument. */
                if (last && last->type == RESP_STRING && shared_stream_id_is_valid(last->str, last->len))
                        p->stream_resume = resp_strdup(last);
                else
                        bad_input(p, "a malformed stream id in a heartbeat's answer", now);
        }

        /* Rules this node wanted before a reload that came since: the tick with what it wants now follows (each
         * change sends one: shared_configure_commit()) and says whether the rules differ; its waiters are not
         * refused for a configuration it no longer has. */
        if (!rules_ok && p->canon && !streq(c->argv[7], p->canon))
                return;
        if (!rules_ok) {
                const RespValue *keys = resp_at(body, 4);
                size_t n_keys = MIN(keys && keys->type == RESP_ARRAY ? keys->n : 0, (size_t) DIFFERING_KEYS_MAX);
                _cleanup_(strv_freep) char **diff = calloc(n_keys + 1, sizeof(char *));
                size_t len = 0, k = 0;
                for (size_t i = 0; diff && i < n_keys; i++)
                        if ((diff[k] = resp_strdup_max(&keys->elements[i], SHARED_TEXT_LEN_MAX)))
                                len += strlen(diff[k++]) + 1;
                if (p->state != SHARED_STATE_MISMATCH) {
                        _cleanup_free_ char *joined = calloc(len + 1, 1);
                        for (size_t i = 0; joined && diff && diff[i]; i++) {
                                if (i > 0)
                                        strcat(joined, ",");
                                strcat(joined, diff[i]);
                        }
                        notice_push(p, SHARED_NOTICE_RULES_MISMATCH, NULL, joined, 0, 0);
                }
                strv_free(p->differing_keys);
                p->differing_keys = TAKE_PTR(diff);
                state_set(p, SHARED_STATE_MISMATCH);
                refuse_all_tries(p, "rules", now);
                return;
        }

        if (p->state == SHARED_STATE_MISMATCH)
                notice_push(p, SHARED_NOTICE_RULES_AGREED, NULL, NULL, 0, 0);
        /* Redis holds this node to the rules it just agreed to, their TTL included. */
        if (p->canon && streq(c->argv[7], p->canon))
                p->fence_ttl = p->params.node_ttl;
        p->differing_keys = strv_free(p->differing_keys);
        if (p->reclaim_all) {
                p->reclaim_all = false;
                /* Unless the reply's cache showed the window already (cache_apply() told of it). */
                if (p->cache.recovery_until == 0 || p->cache.recovery_until > p->recovery_noticed)
                        notice_push(p, SHARED_NOTICE_RECOVERY, NULL, NULL, 0, 0);
                reclaim_all(p, now);
        }
        state_set(p, has_provisional(p) ? SHARED_STATE_RECLAIMING : SHARED_STATE_UP);
        if (c->argv[13][0] == '0')
                tell_reclaimed(p, now);

        /* Reconcile: a page answered moves the cursor on; "" means the page's whole range was done. */
        if (c->reconcile) {
                _cleanup_free_ char *to = resp_strdup_max(resp_at(body, 8), SHARED_RID_LEN);
                const char *hi = c->argv[15];
                if (to && *to && !shared_rid_is_valid(to, strlen(to))) {
                        /* It would go back as the next page's start: the reconcile starts over next time. */
                        bad_input(p, "a malformed reconcile cursor", now);
                        p->reconcile_from = mfree(p->reconcile_from);
                        return;
                }
                if (streq(c->argv[14], "-"))
                        p->kept_next = (Fingerprint) {};
                if (c->argv[13][0] && c->argv[13][1] == 'k') {
                        /* What this page kept ([10], none when absent) counts in Redis's fingerprint of this node
                         * from now on. */
                        const RespValue *kept = resp_at(body, 9);
                        Fingerprint k;
                        p->reconcile_kept = true;
                        if (kept && !fp_read(kept, &k))
                                bad_input(p, "a malformed fingerprint of kept leases", now);
                        else if (kept)
                                p->kept_next = fp_sum(p->kept_next, k);
                }
                if (to && *to) {
                        free(p->reconcile_from);
                        p->reconcile_from = TAKE_PTR(to);
                } else if (streq(hi, "+")) {
                        p->reconcile_from = mfree(p->reconcile_from);
                        p->reconciled_at = now;
                        /* Done, but partly by pages that kept what they missed, and the node accounts now:
                         * once more (pool_shared_set_records_unknown() found this one in progress). */
                        if (p->reconcile_kept && !p->records_unknown)
                                p->reconcile_from = strdup("-");
                        p->kept = p->records_unknown ? p->kept_next : (Fingerprint) {};
                        p->reconcile_kept = false;
                } else {
                        char *s = strdup(hi);
                        if (s) {
                                free(p->reconcile_from);
                                p->reconcile_from = s;
                        }
                }
                if (p->reconcile_from)
                        (void) queue_tick(p, false, now);
                return;
        }

        /* The fingerprint: compared only when nothing else is in flight (a call in the outbox changes Redis's
         * side before this node's), and acted on when two heartbeats in a row differ (a grant made by
         * another node's call reaches the stream after the reply that counted it). */
        const RespValue *fp = resp_at(body, 5);
        int64_t n, x, s;
        if (!outbox_holds_only(p, c)) {
                /* A busy node may never have a heartbeat alone in flight: what the fingerprint would find
                 * (a record Redis holds and this node forgot) is found by a whole reconcile at a bounded
                 * period instead. Its page is made as a registering tick's is, calls in flight or not. */
                if (p->reconciled_at > 0 && now >= usec_add(p->reconciled_at, SHARED_RECONCILE_PERIOD) &&
                    !p->reconcile_from && (p->reconcile_from = strdup("-"))) {
                        p->reconciled_at = now;
                        (void) queue_tick(p, false, now);
                }
                return;
        }
        if (!resp_int(resp_at(fp, 0), &n) || !resp_int(resp_at(fp, 1), &x) || !resp_int(resp_at(fp, 2), &s))
                return;
        if (fp_equals(p, n, x, s)) {
                p->fp_mismatches = 0;
                p->reconciled_at = now;
                return;
        }
        if (++p->fp_mismatches < 2)
                return;
        p->fp_mismatches = 0;
        (void) queue_positions(p, true, now);
        if (!p->reconcile_from && (p->reconcile_from = strdup("-")))
                (void) queue_tick(p, false, now);
}

static int submit_call_new(SharedPool *p, const PoolWaiter *w, usec_t now, Call **ret);

/* A waiter whose record Redis lost with its data (lua/README, submit: "a rid whose records are gone is
 * decided afresh"): sent again under its rid and arrival, it queues (through the recovery window the loss
 * opened) and its wait counts from when it came. The node is live (a node away long enough to be reaped had
 * its waiters refused at its vouch deadline: pool_shared_fence_check()), and its client waits. */
static void waiter_resubmit(SharedPool *p, PoolWaiter *w, usec_t now) {
        Call *c;
        if (submit_call_new(p, w, now, &c) < 0) {
                try_refuse_locally(p, w, "backend", now);
                return;
        }
        c->again = true;
        w->resubmits++;
        w->generation = p->generation;
        call_queue(p, c);
}

/* Redis has no record of w ("gone"). Lost with Redis's data since it last said it had w (another run id,
 * another epoch): sent again, once per such loss and SHARED_RESUBMITS_MAX times in all. Lost without one:
 * this node's registration lapsed while it was away (its waiters went with it), or someone deleted the
 * record; sent again already in this same data (or SHARED_RESUBMITS_MAX times), it was deleted again: garbage
 * written into the pool's keys, counted as bad input. */
static void waiter_gone(SharedPool *p, PoolWaiter *w, usec_t now) {
        /* Its submit (first or again) not answered yet: a places query sent before it found nothing yet. */
        if (outbox_has(p, SHARED_SCRIPT_SUBMIT, w->rid, false))
                return;
        /* A set's part is submitted by its set's call, not alone; one granted and held for its replicas has
         * its WAIT's answer to come: those are refused. */
        bool lost = w->generation != p->generation;
        if (lost && !w->gated && !w->replicating.grant && w->resubmits < SHARED_RESUBMITS_MAX) {
                waiter_resubmit(p, w, now);
                return;
        }
        if (w->resubmits > 0) {
                /* Refused "bad-reply" and withdrawn, as any request garbage in Redis was about. */
                bad_input_about(p, w->rid, "a waiter's record lost again in Redis", now);
                return;
        }
        /* Not this node's expiry when the data was lost: the backend's failing, as for a set's part that its
         * pool has no trace of (set_part_decide()). */
        try_refuse_locally(p, w, lost ? "backend" : "node-expired", now);
}

static void positions_done(SharedPool *p, const RespValue *body, Call *c, usec_t now) {
        /* One answer per rid asked, in order (argv[7…]). */
        for (size_t i = 0; body && body->type == RESP_ARRAY && i < body->n && 7 + i < c->argc; i++) {
                const RespValue *e = &body->elements[i];
                const char *rid = c->argv[7 + i];
                PoolWaiter *w = try_find(p, rid);
                if (resp_is(resp_at(e, 0), "queued")) {
                        int64_t pos, queued;
                        if (w && resp_int(resp_at(e, 1), &pos) && resp_int(resp_at(e, 2), &queued)) {
                                w->position = (size_t) MAX(pos, (int64_t) 0);
                                w->n_queued = (size_t) MAX(queued, (int64_t) 0);
                                w->generation = p->generation;
                        }
                } else if (resp_is(resp_at(e, 0), "gone")) {
                        if (w)
                                waiter_gone(p, w, now);
                } else {
                        /* The decision of the rid asked about, and of no other. */
                        SharedDecision d;
                        if (shared_decision_from_array(e, p->base.limit, &d) < 0 || !streq(d.rid, rid)) {
                                shared_decision_done(&d);
                                bad_input(p, "a malformed answer to a places query", now);
                                if (w)
                                        try_refuse_locally(p, w, "bad-reply", now);
                                continue;
                        }
                        decision_apply(p, &d, false, now);
                        shared_decision_done(&d);
                }
        }
}

static void snapshot_entries_free(PoolSnapshotEntry *e, size_t n) {
        for (size_t i = 0; i < n; i++) {
                free((char *) e[i].node);
                free((char *) e[i].lane);
                free((unsigned *) e[i].slots);
                strv_free((char **) e[i].members);
        }
        free(e);
}

static void snapshot_clear(SharedPool *p) {
        snapshot_entries_free(p->snap_holders, p->n_snap_holders);
        snapshot_entries_free(p->snap_waiters, p->n_snap_waiters);
        p->snap_holders = p->snap_waiters = NULL;
        p->n_snap_holders = p->n_snap_waiters = 0;
}

/* One holder { node id, node name, rid, lane, token, granted_at, { slots… }, { members… } } or waiter
 * { node id, node name, rid, lane, k, arrival, position } of the status body. */
static int snapshot_entry_parse(const SharedPool *p, const RespValue *v, bool holder, usec_t now,
                                PoolSnapshotEntry *ret) {
        int64_t a, b;
        if (!v || v->type != RESP_ARRAY || v->n != (holder ? 8u : 7u) ||
            !resp_int(resp_at(v, 4), &a) || !resp_int(resp_at(v, 5), &b))
                return -EBADMSG;
        const RespValue *id = resp_at(v, 0);
        *ret = (PoolSnapshotEntry) {
                .node = resp_strdup_max(resp_at(v, 1), SHARED_TEXT_LEN_MAX),
                .own = resp_is(id, p->params.node_id),
                .lane = resp_strdup_max(resp_at(v, 3), SHARED_TEXT_LEN_MAX),
                .since = local_time_of(p, b, 0, now),
        };
        if (!ret->node || !ret->lane)
                return -EBADMSG;
        if (!holder) {
                int64_t pos = 0;
                (void) resp_int(resp_at(v, 6), &pos);
                if (a <= 0 || (uint64_t) a > p->base.limit)
                        return -EBADMSG;
                ret->n_slots = (unsigned) a;
                ret->position = (size_t) MAX(pos, (int64_t) 0);
                return 0;
        }
        ret->token = (uint64_t) a;
        SharedDecision d = shared_decision_init(p->base.limit);
        int r = shared_decision_set(&d, "slots", resp_at(v, 6));
        if (r >= 0)
                r = shared_decision_set(&d, "members", resp_at(v, 7));
        /* Status prints a member per slot: none, or as many as the slots. */
        if (r >= 0 && (d.n_slots == 0 || (d.n_members != 0 && d.n_members != d.n_slots)))
                r = -EBADMSG;
        if (r < 0) {
                shared_decision_done(&d);
                return r;
        }
        ret->n_slots = d.n_slots;
        ret->slots = TAKE_PTR(d.slots);
        ret->members = (const char *const *) TAKE_PTR(d.members);
        return 0;
}

static int snapshot_list_parse(const SharedPool *p, const RespValue *v, bool holder, usec_t now,
                               PoolSnapshotEntry **ret, size_t *ret_n) {
        if (v && v->type != RESP_ARRAY)
                return -EBADMSG;
        size_t n = v ? v->n : 0;
        /* Every holder holds a slot; the waiters past the first POOL_SNAPSHOT_WAITERS_MAX are not shown. */
        if (holder && n > p->base.limit)
                return -EBADMSG;
        if (!holder)
                n = MIN(n, (size_t) POOL_SNAPSHOT_WAITERS_MAX);
        PoolSnapshotEntry *e = calloc(MAX(n, (size_t) 1), sizeof(PoolSnapshotEntry));
        if (!e)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                int r = snapshot_entry_parse(p, &v->elements[i], holder, now, &e[i]);
                if (r < 0) {
                        snapshot_entries_free(e, i + 1);
                        return r;
                }
        }
        *ret = e;
        *ret_n = n;
        return 0;
}

static void status_done(SharedPool *p, const RespValue *body, usec_t now) {
        PoolSnapshotEntry *holders, *waiters;
        size_t n_holders, n_waiters;
        int64_t waiting = 0;
        int r = snapshot_list_parse(p, resp_at(body, 0), true, now, &holders, &n_holders);
        if (r < 0) {
                if (r == -EBADMSG)
                        bad_input(p, "a malformed status snapshot", now);
                return;
        }
        r = snapshot_list_parse(p, resp_at(body, 1), false, now, &waiters, &n_waiters);
        if (r < 0) {
                if (r == -EBADMSG)
                        bad_input(p, "a malformed status snapshot", now);
                snapshot_entries_free(holders, n_holders);
                return;
        }
        (void) resp_int(resp_at(body, 2), &waiting);
        snapshot_clear(p);
        p->snap_holders = holders;
        p->n_snap_holders = n_holders;
        p->snap_waiters = waiters;
        p->n_snap_waiters = n_waiters;
        p->snap_waiting = (size_t) MAX(waiting, (int64_t) 0);
        p->snap_at = p->snap_asked; /* Redis as of then or later: the age Status says is never less */
        p->snap_valid = true;
}

static void reclaim_done(SharedPool *p, const RespValue *body, Call *c, usec_t now) {
        PoolGrant *g = grant_find(p, c->rid); /* NULL: released meanwhile */
        const RespValue *verdict = resp_at(body, 0);
        if (!resp_is(verdict, "confirmed") && !resp_is(verdict, "conflict") && !resp_is(verdict, "lost"))
                bad_input(p, "an unknown verdict of a reclaim", now); /* as lost: the lease cannot be vouched for */
        if (g && resp_is(verdict, "confirmed"))
                g->provisional = false;
        else if (g)
                grant_lose(p, g, resp_is(verdict, "conflict") ? "reclaim-conflict" : "node-expired", true, now);
        reclaiming_end(p, now);
}

static void submit_done(SharedPool *p, const RespValue *status, const RespValue *body, Call *c, usec_t now) {
        PoolWaiter *w = try_find(p, c->rid);
        if (!w)
                return; /* cancelled meanwhile: its withdraw follows in the outbox */
        if (resp_is(status, "ok")) {
                /* The decision of the rid submitted, and of no other. */
                SharedDecision d;
                if (shared_decision_from_array(body, p->base.limit, &d) < 0 || !streq(d.rid, w->rid)) {
                        shared_decision_done(&d);
                        bad_input(p, "a malformed answer to a request", now);
                        try_refuse_locally(p, w, "bad-reply", now);
                        return;
                }
                decision_apply(p, &d, true, now);
                shared_decision_done(&d);
                return;
        }
        /* "invalid": this node's copy of the rules let it through, the stored ones do not. */
        try_refuse_locally(p, w, resp_is(status, "invalid") ? "rules" : "backend", now);
}

/* The manual clock mode decides in the order of the replies, as an in-process pool decides in the order
 * of the calls: a stream entry (read on the other connection, so possibly ahead of a reply that Redis
 * wrote before it) waits while a call is out. The caller's own decisions are in the replies anyway; an
 * entry then only repeats one (the first copy wins) or carries another node's, which comes no later than
 * the last reply. Production applies entries at once: a busy node always has a call out. */
typedef struct HeldEntry {
        ListNode node;
        SharedDecision decision;
} HeldEntry;

static bool calls_out(SharedPool *p) {
        list_foreach(n, &p->outbox)
                if (container_of(n, Call, node)->sent)
                        return true;
        return false;
}

static void held_entries_apply(SharedPool *p, usec_t now) {
        ListNode *n;
        while (!calls_out(p) && (n = list_first(&p->held))) {
                list_unlink(n);
                HeldEntry *h = container_of(n, HeldEntry, node);
                decision_apply(p, &h->decision, false, now);
                shared_decision_done(&h->decision);
                free(h);
        }
}

/* WAIT's answer: how many replicas acknowledged this connection's writes sent before it (acked < 0: no
 * answer, or an error reply). The grants it held back are answered now, or refused. */
static void wait_done(SharedPool *p, Call *c, int64_t acked, usec_t now) {
        uint64_t id = c->id;
        /* The number asked for, not today's setting: a reload may have changed it meanwhile. */
        int64_t wanted = strtoll(c->argv[1], NULL, 10);
        call_free(c);
        if (acked >= 0)
                p->replicas_acked = (int) MIN(acked, (int64_t) INT_MAX);
        if (acked < wanted) {
                replicating_refuse(p, id, now);
                return;
        }
        PoolWaiter *w;
        while ((w = replicating_find(p, id))) {
                const Replicating r = w->replicating;
                grant_deliver(p, w, &r);
        }
}

static void set_done(SharedPool *p, Call *c, int error, const RespValue *reply, usec_t now);

/* A call answered "settling" once more (README "Statuses": the same call again, at once). A real pool settles
 * its backlog SETTLE_MAX steps a call, so a long run of them is a server that keeps this node calling, a
 * round trip after another: past SHARED_SETTLING_MAX in a row the pool's calls answered so wait for a
 * heartbeat (held as after an error: sent again after the next tick's answer; counted as bad input). */
static bool settling_hold(SharedPool *p, usec_t now) {
        if (now < p->settling_pause)
                return true;
        if (++p->settling < SHARED_SETTLING_MAX)
                return false;
        p->settling = 0;
        p->settling_pause = usec_add(now, p->params.heartbeat);
        bad_input(p, "calls answered \"settling\" " STRINGIFY(SHARED_SETTLING_MAX) " times in a row", now);
        return true;
}

/* README "Reply": an array of 6, a status word, the pool clock; anything else is not the scripts' (counted,
 * false). Its pool clock and round trip are taken in: the pool clock at the midpoint (memo §4.6). */
static bool reply_take_clock(SharedPool *p, const Call *c, const RespValue *reply, int64_t *ret_pool_now, usec_t now) {
        const RespValue *status = resp_at(reply, 0);
        int64_t pool_now = 0;
        if (reply->type != RESP_ARRAY || reply->n != 6 || !status || status->type != RESP_STRING ||
            status->len == 0 || status->len > 32 || !resp_int(resp_at(reply, 1), &pool_now) || pool_now < 0 ||
            (uint64_t) pool_now >= TOKEN_MAX) {
                bad_input(p, "a reply of another shape than the scripts'", now);
                return false;
        }
        p->rtt = now - MIN(now, c->sent_at);
        if (!p->params.manual_clock && pool_now > 0) {
                p->offset = pool_now - (int64_t) (c->sent_at + p->rtt / 2);
                p->offset_known = true;
        }
        *ret_pool_now = pool_now;
        return true;
}

static void call_done(SharedPool *p, uint64_t id, int error, const RespValue *reply, usec_t sent_boot, usec_t now) {
        p->last_now = MAX(p->last_now, now);
        Call *c = call_find(p, id);
        if (!c || !c->sent)
                return;
        if (c->script == SHARED_SCRIPT_SET) {
                set_done(p, c, error, reply, now);
                return;
        }
        if (c->wait) {
                /* Not sent again on a failure: after a reconnect (maybe to a promoted replica) it would cover
                 * none of the writes it was for. */
                int64_t acked = -1;
                if (error < 0 || !reply || reply->type != RESP_INTEGER || !resp_int(reply, &acked))
                        acked = -1;
                wait_done(p, c, acked, now);
                return;
        }
        if (!reply || error < 0) {
                /* It may or may not have run: sent again, identical, once the link is back (idempotent by
                 * rid); link_down() follows from the driver. */
                (void) call_again(p, c, now);
                return;
        }
        if (c->script == SHARED_SCRIPT_TICK) {
                p->tick_pending = false;
                if (c->run)
                        p->run_pending = false;
        }
        if (c->script == SHARED_SCRIPT_POSITIONS && streq(c->argv[6], "status"))
                p->status_pending = false;

        const RespValue *status = resp_at(reply, 0);
        if (reply->type == RESP_ERROR) {
                /* A script error (out of memory under noeviction, NOSCRIPT between a restart and the load):
                 * a submit is answered here, anything else is tried again after the next tick. */
                call_park(p, c, true, "backend", now);
                return;
        }
        int64_t pool_now = 0;
        if (!reply_take_clock(p, c, reply, &pool_now, now)) {
                call_park(p, c, true, "bad-reply", now);
                return;
        }

        /* Notices first, whatever the status: a call's quarantines, restores, drains and undrains come before
         * its grants and refusals in the script (a release's exit status is counted before its slots are
         * handed on, an until ends a drain at the start of its instant), and pool-local.c emits them in that
         * order; and a repair the call made before it answered "unregistered" or "canon" (a lane's counts
         * counted again) is told all the same. */
        notices_apply(p, resp_at(reply, 5), now);
        if (resp_is(status, "settling")) {
                /* Earlier instants needed the whole budget: the same call again, at once. What it did is
                 * done: a dead node it reaped (a page a call: two lapsed at once take two) is told now, or
                 * never (README: exactly one call reports each expiry). */
                events_apply(p, resp_at(reply, 3), now);
                cache_apply(p, resp_at(reply, 4), pool_now, now);
                if (!call_again(p, c, now))
                        return; /* given up meanwhile: its withdraw (or release) may have run already */
                if (settling_hold(p, now)) {
                        if (c->script == SHARED_SCRIPT_TICK || c->script == SHARED_SCRIPT_POSITIONS)
                                call_free(c); /* made again from the state of the day, after the pause */
                        else
                                c->held = true;
                        return;
                }
                if (c->script == SHARED_SCRIPT_TICK && c->reconcile && !p->params.manual_clock) {
                        /* Its page was made before the calls sent behind it, which Redis may have run by now
                         * (a submit's new waiter would be dropped as one this node forgot): made again. (The
                         * manual clock's tests send one call at a time, and there a tick's place is its
                         * instant's.) */
                        bool run = c->run;
                        call_free(c);
                        (void) queue_tick(p, run, now);
                        return;
                }
                if (c->script == SHARED_SCRIPT_TICK) {
                        p->tick_pending = true;
                        p->run_pending = p->run_pending || c->run;
                }
                return;
        }
        p->settling = 0;
        if (resp_is(status, "unregistered")) {
                /* Reaped while away, or Redis lost the pool: register again first. A submit it refused wrote
                 * nothing: it goes again once the node serves (as a set's call does), its arrival on the clock
                 * of that day (waiter_resubmit(): at most SHARED_RESUBMITS_MAX times, a Redis that says so
                 * forever is not followed forever). */
                state_set(p, SHARED_STATE_REGISTERING);
                p->reclaim_all = true;
                PoolWaiter *w = c->script == SHARED_SCRIPT_SUBMIT ? try_find(p, c->rid) : NULL;
                if (w && !w->gated && w->resubmits < SHARED_RESUBMITS_MAX) {
                        call_free(c);
                        waiter_resubmit(p, w, now);
                } else
                        call_park(p, c, false, "backend", now);
                if (!p->tick_pending)
                        (void) queue_tick(p, false, now);
                return;
        }
        if (resp_is(status, "version") || resp_is(status, "manual-clock")) {
                _cleanup_free_ char *why = resp_strdup(status);
                if (p->state != SHARED_STATE_REFUSED)
                        notice_push(p, SHARED_NOTICE_REFUSED, NULL, why, 0, 0);
                free(p->refused_why);
                p->refused_why = TAKE_PTR(why);
                state_set(p, SHARED_STATE_REFUSED);
                call_park(p, c, false, "backend", now);
                refuse_all_tries(p, "backend", now);
                return;
        }

        if (resp_is(status, "identity")) {
                /* Another live process heartbeats under this node id (a cloned host): nothing of this one is
                 * looked at, reconciled or granted. Its ticks go on, refused, until that registration lapses. */
                if (!p->identity_conflict)
                        notice_push(p, SHARED_NOTICE_IDENTITY, NULL, "node-id-conflict", 0, 0);
                p->identity_conflict = true;
                char *why = strdup("node-id-conflict");
                if (why) {
                        free(p->refused_why);
                        p->refused_why = why;
                }
                state_set(p, SHARED_STATE_REFUSED);
                call_park(p, c, false, "node-id-conflict", now);
                refuse_all_tries(p, "node-id-conflict", now);
                return;
        }
        if (p->identity_conflict && c->script == SHARED_SCRIPT_TICK) {
                /* The other registration lapsed (its leases with it): this incarnation is the node now. */
                p->identity_conflict = false;
                p->refused_why = mfree(p->refused_why);
                p->reclaim_all = true;
                notice_push(p, SHARED_NOTICE_IDENTITY_CLEARED, NULL, NULL, 0, 0);
        }
        if (c->script == SHARED_SCRIPT_TICK && resp_is(status, "canon")) {
                /* A tick with "=" (or "*" and no stored rules) and Redis has no rules of this node: it was
                 * reaped, its leases with it.
                 * Nothing is sent (the restored leases fence from the daemon's last alive mark); what it
                 * owes is not owed any more. */
                state_set(p, SHARED_STATE_MISMATCH);
                call_free(c);
                return;
        }

        events_apply(p, resp_at(reply, 3), now);
        cache_apply(p, resp_at(reply, 4), pool_now, now);
        const RespValue *body = resp_at(reply, 2);

        if (c->script == SHARED_SCRIPT_TICK && (resp_is(status, "ok") || resp_is(status, "rules"))) {
                tick_done(p, status, body, sent_boot, c, now);
                call_free(c);
                return;
        }
        if (resp_is(status, "rules")) {
                state_set(p, SHARED_STATE_MISMATCH);
                call_park(p, c, false, "rules", now);
                return;
        }
        switch (c->script) {
        case SHARED_SCRIPT_SUBMIT:
                submit_done(p, status, body, c, now);
                break;
        case SHARED_SCRIPT_POSITIONS:
                if (streq(c->argv[6], "status"))
                        status_done(p, body, now);
                else
                        positions_done(p, body, c, now);
                break;
        case SHARED_SCRIPT_RECLAIM:
                reclaim_done(p, body, c, now);
                break;
        default:
                break; /* release, withdraw, drain: "gone" is success too */
        }
        call_free(c);
}

/* A call of a batch whose answer is missing or malformed: as call_done() takes a reply of another shape
 * (counted once for the batch by the caller). */
static void call_answer_malformed(SharedPool *p, Call *c, usec_t now) {
        if (c->script == SHARED_SCRIPT_TICK) {
                p->tick_pending = false;
                if (c->run)
                        p->run_pending = false;
        }
        call_park(p, c, true, "bad-reply", now);
}

/* The status words after which batch.lua runs the next operation; any other stops the batch there. */
static bool status_continues(const RespValue *reply) {
        const RespValue *status = reply && reply->type == RESP_ARRAY ? resp_at(reply, 0) : NULL;
        return resp_is(status, "ok") || resp_is(status, "invalid");
}

/* A batch's answer (brokerd/lua/batch.lua): one reply per operation run, in order, each handled as the
 * answer to its own call; the operations after one that stopped the batch go again. No reply, an error
 * reply: each call as if it had had that answer itself (sent again; parked). */
static void batch_done(SharedPool *p, Call *b, int error, const RespValue *reply, usec_t sent_boot, usec_t now) {
        _cleanup_free_ uint64_t *ids = TAKE_PTR(b->members);
        size_t n = b->n_members;
        uint32_t unsent = b->members_unsent;
        call_free(b);

        bool answered = reply && error >= 0 && reply->type != RESP_ERROR;
        /* Untrusted (SPEC §11): an array of 1…n replies, and fewer than n only after a status that stops. */
        bool shaped = answered && reply->type == RESP_ARRAY && reply->n >= 1 && reply->n <= n &&
                      (reply->n == n || !status_continues(&reply->elements[reply->n - 1]));
        if (answered && !shaped)
                bad_input(p, "a reply to a batch of another shape than the scripts'", now);
        for (size_t i = 0; i < n; i++) {
                Call *c = call_find(p, ids[i]);
                if (!c || !c->sent)
                        continue; /* freed or sent back by an earlier answer, or by the link going down */
                if (!answered)
                        call_done(p, ids[i], error, reply, sent_boot, now);
                else if (!shaped)
                        call_answer_malformed(p, c, now);
                else if (i < reply->n)
                        call_done(p, ids[i], 0, &reply->elements[i], sent_boot, now);
                else {
                        /* Not run: sent again, in its place; as never sent if it never was before. */
                        c->ever_sent = !(unsent & (UINT32_C(1) << i));
                        (void) call_again(p, c, now);
                }
        }
}

void pool_shared_call_done(Pool *base, uint64_t id, int error, const RespValue *reply, usec_t sent_boot, usec_t now) {
        SharedPool *p = SHARED(base);
        now = driver_now(p, now);
        p->last_now = MAX(p->last_now, now);
        Call *b = NULL;
        list_foreach(n, &p->batches)
                if (container_of(n, Call, node)->id == id)
                        b = container_of(n, Call, node);
        if (b)
                batch_done(p, b, error, reply, sent_boot, now);
        else
                call_done(p, id, error, reply, sent_boot, now);
        held_entries_apply(p, now);
}

/* ---------------------------------------------------------------------------------------------- stream */

void pool_shared_stream_entry(Pool *base, const char *entry_id, const RespValue *fields, usec_t now) {
        SharedPool *p = SHARED(base);
        now = driver_now(p, now);
        /* The id goes back to Redis as XREAD's argument: one that is not an id is not read past. */
        if (!entry_id || !shared_stream_id_is_valid(entry_id, strlen(entry_id))) {
                bad_input(p, "a malformed stream entry id", now);
                return;
        }
        char *id = strdup(entry_id);
        if (id) {
                free(p->stream_resume);
                p->stream_resume = id;
        }
        /* Field names and values in pairs, the decision's fields once each at most (README). */
        if (!fields || fields->type != RESP_ARRAY || fields->n % 2 != 0 ||
            fields->n > 4 * SHARED_DECISION_FIELDS) {
                bad_input(p, "a malformed stream entry", now);
                return;
        }
        SharedDecision d = shared_decision_init(p->base.limit);
        for (size_t i = 0; i + 1 < fields->n; i += 2) {
                _cleanup_free_ char *name = resp_strdup_max(&fields->elements[i], 32);
                if (!name || shared_decision_set(&d, name, &fields->elements[i + 1]) < 0) {
                        shared_decision_done(&d);
                        bad_input_about(p, d.rid, "a malformed stream entry", now);
                        return;
                }
        }
        if (!d.rid[0]) {
                shared_decision_done(&d);
                bad_input(p, "a stream entry without a request id", now);
                return;
        }
        if (p->params.manual_clock && calls_out(p)) {
                HeldEntry *h = calloc(1, sizeof(HeldEntry));
                if (h) {
                        h->decision = d; /* its slots and members with it */
                        list_append(&p->held, &h->node);
                        return;
                }
        }
        decision_apply(p, &d, false, now);
        shared_decision_done(&d);
}

const char *pool_shared_stream_key(const Pool *base) {
        return SHARED(base)->stream_key;
}

const char *pool_shared_stream_resume_id(const Pool *base) {
        return SHARED(base)->stream_resume;
}

bool pool_shared_stream_idle(const Pool *base) {
        return list_is_empty(&SHARED(base)->tries);
}

bool pool_shared_stream_is_read(const Pool *base) {
        const SharedPool *p = SHARED(base);
        return !p->cache.stream_last ||
               (p->stream_resume && stream_id_cmp(p->stream_resume, p->cache.stream_last) >= 0);
}

bool pool_shared_is_settled(const Pool *base) {
        const SharedPool *p = SHARED(base);
        if (p->state != SHARED_STATE_UP || !list_is_empty(&p->outbox) || !list_is_empty(&p->held))
                return false;
        return pool_shared_stream_is_read(base);
}

void pool_shared_set_revoke_grace(Pool *base, usec_t revoke_grace) {
        SHARED(base)->params.revoke_grace = revoke_grace;
}

void pool_shared_set_records_unknown(Pool *base, bool unknown) {
        SharedPool *p = SHARED(base);
        if (p->records_unknown == unknown)
                return;
        p->records_unknown = unknown;
        if (unknown)
                return;
        /* Accounting again: what Redis holds for this node and it does not list becomes an orphan now, by a
         * whole reconcile (one in progress goes on, its pages from now on without "k", and runs again once
         * done if a page kept anything), and no longer stands in the fingerprint. */
        p->kept = (Fingerprint) {};
        if (!p->reconcile_from)
                p->reconcile_from = strdup("-"); /* out of memory: the fingerprint finds it later */
}

usec_t pool_shared_fence_ttl(const Pool *base) {
        return SHARED(base)->fence_ttl;
}

SharedState pool_shared_state(const Pool *base) {
        return SHARED(base)->state;
}

/* A release or withdrawal waits in the outbox (queued or in flight). */
static bool outbox_gives_back(const SharedPool *p) {
        list_foreach(n, &p->outbox) {
                const Call *c = container_of(n, Call, node);
                if (c->script == SHARED_SCRIPT_WITHDRAW || c->script == SHARED_SCRIPT_RELEASE)
                        return true;
        }
        return false;
}

bool pool_shared_giving_back(const Pool *base) {
        SharedPool *p = SHARED(base);
        /* REGISTERING counts: its tick is on the way, and the operations follow it on the same link. */
        if (!p->link_up || !(pool_gives_back(p) || p->state == SHARED_STATE_REGISTERING) ||
            p->unconfirmed_since != USEC_INFINITY)
                return false;
        return outbox_gives_back(p);
}

/* ------------------------------------------------------------------------------------------ pool ops */

static void shared_free(Pool *base) {
        SharedPool *p = SHARED(base);
        ListNode *n;
        if (p->params.detach)
                p->params.detach(base, p->params.detach_userdata);
        while ((n = list_first(&p->outbox)))
                call_free(container_of(n, Call, node));
        batches_forget(p);
        while ((n = list_first(&p->tries)))
                try_free(container_of(n, PoolWaiter, node));
        while ((n = list_first(&p->grants)))
                grant_free(container_of(n, PoolGrant, node));
        while ((n = list_first(&p->held))) {
                list_unlink(n);
                HeldEntry *h = container_of(n, HeldEntry, node);
                shared_decision_done(&h->decision);
                free(h);
        }
        while ((n = list_first(&p->notices))) {
                list_unlink(n);
                NoticeNode *nn = container_of(n, NoticeNode, node);
                shared_notice_done(&nn->notice);
                free(nn);
        }
        snapshot_clear(p);
        life_free(p->life, p->n_life);
        life_free(p->gone, p->n_gone);
        for (size_t i = 0; i < ELEMENTSOF(p->emitted); i++)
                free(p->emitted[i]);
        drains_clear(p);
        pool_members_replace(&p->base, NULL, NULL, 0, NULL);
        strv_free(p->lanes);
        strv_free(p->differing_keys);
        free(p->canon);
        free(p->key);
        free(p->node_arg);
        free(p->stream_key);
        free(p->stream_resume);
        free(p->run_id);
        free(p->seen_epoch);
        free(p->reconcile_from);
        free(p->refused_why);
        free(p->cache.epoch);
        free(p->cache.stream_last);
        rests_clear(p);
        free(p);
}

/* A configuration prepared for the pool: its copies, made before anything changes. */
struct PoolStaged {
        const PoolConfig *c;
        usec_t ttl;
        char *canon;
        char **lanes;
        char **members;
        PoolLabel *labels;
        MemberSets *member_sets;
        PoolMemberLife *life;
        size_t n_life;
        PoolMemberLife *gone;   /* room for the lives the configuration drops (life_adopt()) */
        size_t *adopt_room;     /* life_adopt_room() */
};

static void shared_configure_abort(Pool *base, PoolStaged *s) {
        if (!s)
                return;
        free(s->canon);
        strv_free(s->lanes);
        member_sets_free(s->member_sets);
        strv_free(s->members);
        if (s->labels)
                pool_labels_free(s->labels, s->c->n_labels);
        if (s->life)
                life_free(s->life, s->n_life);
        free(s->gone);
        free(s->adopt_room);
        free(s);
}

/* Nothing goes to Redis here: the rules are sent by the commit. */
static int shared_configure_prepare(Pool *base, const PoolConfig *c, const PoolLaneRule *rules, size_t n_rules,
                                    const PoolDrains *drains, usec_t now, PoolStaged **ret) {
        SharedPool *p = SHARED(base);
        if (drains)
                return -EINVAL; /* its backend keeps its drains (drain_with()) */
        PoolStaged *s = calloc(1, sizeof(PoolStaged));
        if (!s)
                return -ENOMEM;
        /* 0: a PoolConfig made by hand (conf.c always sets one): the TTL the pool was made with. */
        *s = (PoolStaged) { .c = c, .ttl = c->backend_node_ttl ?: p->params.node_ttl };
        int r = shared_rules_canon(c, rules, n_rules, s->ttl, &s->canon);
        if (r < 0)
                goto fail;
        r = -ENOMEM;
        s->lanes = calloc(n_rules + 1, sizeof(char *));
        if (!s->lanes)
                goto fail;
        for (size_t i = 0; i < n_rules; i++)
                if (!(s->lanes[i] = strdup(rules[i].lane)))
                        goto fail;
        if (c->members && !(s->members = strv_copy(c->members)))
                goto fail;
        /* The engine resolves selectors against them (pool_selector_capacity()); Redis against the canon's. */
        r = pool_labels_copy(c->labels, c->n_labels, &s->labels);
        if (r < 0)
                goto fail;
        r = member_sets_new(s->members, s->labels, c->n_labels, &s->member_sets);
        if (r < 0)
                goto fail;
        r = life_prepare(s->members, &s->life, &s->n_life);
        if (r < 0)
                goto fail;
        s->gone = calloc(p->n_life + p->n_gone + 1, sizeof(PoolMemberLife));
        s->adopt_room = life_adopt_room(p, s->n_life);
        if (!s->gone || !s->adopt_room) {
                r = -ENOMEM;
                goto fail;
        }
        *ret = s;
        return 0;
fail:
        shared_configure_abort(base, s);
        return r;
}

static void shared_configure_commit(Pool *base, PoolStaged *s, usec_t now) {
        SharedPool *p = SHARED(base);
        const PoolConfig *c = s->c;
        /* The manual clock: a restore() that follows (it has no `now`) dates its reclaim by this. */
        p->last_now = MAX(p->last_now, now);
        pool_members_replace(&p->base, TAKE_PTR(s->members), TAKE_PTR(s->labels), c->n_labels,
                             TAKE_PTR(s->member_sets));
        life_adopt(p, TAKE_PTR(s->life), s->n_life, TAKE_PTR(s->gone), TAKE_PTR(s->adopt_room));
        strv_free(p->lanes);
        p->lanes = TAKE_PTR(s->lanes);
        p->base.limit = c->limit;
        p->min_replicas = c->backend_min_replicas;
        p->min_replicas_timeout = c->backend_min_replicas_timeout;
        p->cooldown = c->cooldown;
        p->base.queue_timeout_set = c->queue_timeout_set;
        p->base.queue_timeout = c->queue_timeout;
        p->congestion_timeout_set = c->congestion_timeout_set;
        p->congestion_timeout = c->congestion_timeout;
        /* A pool taken back wants its rules again at once ("*" before): submits behind the tick find them. */
        bool taken_back = p->base.retired || !p->canon;
        if (taken_back)
                p->gauge_from = now;
        p->base.retired = false;
        /* backend-node-ttl= by reload: a rule (in the canon), and the self-fence's arithmetic at once for the
         * shorter of the two TTLs, until Redis agreed to the new rules (tick_done()). */
        if (s->ttl != p->params.node_ttl) {
                p->fence_ttl = MIN(p->fence_ttl, s->ttl);
                p->params.node_ttl = s->ttl;
        }
        bool changed = taken_back || !streq(p->canon, s->canon);
        free(p->canon);
        p->canon = TAKE_PTR(s->canon);
        shared_configure_abort(base, s);
        /* The rules go to Redis with the next tick; agreement is Redis's answer (memo §4.8). */
        if (changed && p->link_up) {
                /* Out of memory for the call (the reload applied all the same): the next run() sends them. */
                if (queue_tick(p, false, now) < 0)
                        p->tick_wanted = true;
                /* New priorities move waiters: in the manual mode places are read after every change (as
                 * after every run()), so that a test reads them exact, as from an in-process pool. */
                if (p->params.manual_clock && state_sends_operations(p->state))
                        (void) queue_positions(p, false, now);
        }
}

static void shared_retire(Pool *base, usec_t now) {
        SharedPool *p = SHARED(base);
        p->base.retired = true;
        /* NULL reason: the engine says "removed", as for an in-process pool. */
        refuse_all_tries(p, NULL, now);
        congestion_set(p, false, now);
        /* Its leases stay until they end; a tick says at once that it wants "*" now, so that the rule changes
         * the other nodes agree on meanwhile are not held back by a pool this node no longer configures. */
        if (p->link_up && queue_tick(p, false, now) < 0)
                p->tick_wanted = true;
}

static bool lane_is_configured(const SharedPool *p, const char *lane) {
        return strv_contains(p->lanes, lane);
}

/* Before this object first served (a brokerd just started, a pool just added: its link is not up yet, or,
 * behind Sentinels, no round has confirmed the primary yet, through no fault of Redis's), a request that may
 * wait, and a waiter resumed at a restart, wait for it, as a waiter waits out a link that went down: for the
 * waiter grace at most, counted from the first one held. One that may not wait is refused at once; so is
 * every request once a confirmation was lost (today's rule: the primary may be one cut off). A confirmation
 * left stale by a rest of the rounds is not lost: every request waits for the round it wakes, fail-fast ones
 * too (pool_shared_confirm_round_failed() refuses those if that round does not confirm). */
static bool submit_is_held(const SharedPool *p, const PoolTry *t, usec_t now) {
        bool within_grace = p->start_since == USEC_INFINITY || now < usec_add(p->start_since, p->params.waiter_grace);
        if (pool_confirm_rests(p))
                return within_grace;
        return (t->may_wait || t->resume) && !p->served &&
               (p->unconfirmed_since == USEC_INFINITY || p->confirmed_boot == 0) &&
               (p->state == SHARED_STATE_CONNECTING || p->state == SHARED_STATE_REGISTERING ||
                state_sends_operations(p->state)) &&
               within_grace;
}

/* The arrival on the pool clock, as ARGV: the wait and the fast-admission test count from it ("-": now). */
static void arrival_format(const SharedPool *p, usec_t arrival, usec_t now, char buf[static 32]) {
        strcpy(buf, "-");
        if (p->params.manual_clock || p->offset_known) {
                int64_t a = pool_clock_of(p, now) - (int64_t) (now - MIN(now, arrival));
                u64_format(buf, a < 0 ? -(uint64_t) a : (uint64_t) a, a < 0);
        }
}

/* w's submit (lua/README, submit), from what it asked: its arrival on today's pool clock, which a Redis that
 * lost the pool counts anew (so its wait still counts from when it came). */
static int submit_call_new(SharedPool *p, const PoolWaiter *w, usec_t now, Call **ret) {
        Call *c;
        int r = call_new(p, SHARED_SCRIPT_SUBMIT, op_settles(p), now, &c);
        if (r < 0)
                return r;
        strcpy(c->rid, w->rid);
        char arrival[32];
        arrival_format(p, w->arrival, now, arrival);
        if ((r = call_add(c, "%s", w->rid)) < 0 ||
            (r = call_add(c, "%s", w->lane)) < 0 ||
            (r = call_add(c, "%u", w->k)) < 0 ||
            (r = call_add(c, "%d", w->may_wait)) < 0 ||
            (r = call_add(c, "%d", w->lane_budget_set)) < 0 ||
            (r = call_add(c, "%" PRId64, shared_wire_usec(w->lane_budget))) < 0 ||
            (r = call_add(c, "%" PRId64, shared_wire_usec(w->client_cap))) < 0 ||
            (r = call_add(c, "%s", arrival)) < 0 ||
            (r = call_add(c, "%s", w->selector ?: "")) < 0 ||
            (r = call_add(c, "1")) < 0 || /* fresh: call_set_fresh() */
            (r = call_add(c, "%" PRIu32, fnv1a32(w->rid, 'l'))) < 0) {
                call_free(c);
                return r;
        }
        *ret = c;
        return 0;
}

static int shared_submit(Pool *base, const PoolTry *t, usec_t now) {
        SharedPool *p = SHARED(base);

        if (p->base.retired) {
                emit(p, (PoolDecision) { .verdict = POOL_VERDICT_REFUSED, .cookie = t->cookie, .at = now,
                                         .refusal = REFUSAL_UNAVAILABLE, .budget = USEC_INFINITY });
                return 0;
        }
        if (!lane_is_configured(p, t->lane) || t->slots == 0 || t->slots > p->base.limit)
                return -EINVAL;
        check_waiter_grace(p, now);
        bool held = submit_is_held(p, t, now);
        /* A resumed waiter asks again under its old rid only while the first tick's reconcile, which drops
         * every rid of this node it does not list, can still list it. */
        bool resumed_early = held && t->resume && !reconcile_sent(p);
        if (!pool_serves(p) && !held) {
                /* Unreachable, rules that differ, refused, or a primary the Sentinels do not confirm: at once,
                 * so that the lane tries its next pool. */
                emit(p, (PoolDecision) { .verdict = POOL_VERDICT_REFUSED, .cookie = t->cookie, .at = now,
                                         .refusal = REFUSAL_UNAVAILABLE, .budget = USEC_INFINITY,
                                         .reason = unavailable_reason(p) });
                return 0;
        }

        PoolWaiter *w = calloc(1, sizeof(PoolWaiter));
        if (!w)
                return -ENOMEM;
        /* A resumed waiter asks again under its old rid (the node id is the same): Redis answers where it
         * stands (its place, its grant, its outcome) and changes nothing (lua/README, submit). The rid comes
         * from a file: one malformed, or one this node already uses, is not reused. */
        const char *old_rid = t->resume && (resumed_early || pool_serves(p)) ? t->resume->remote_id : NULL;
        if (old_rid && shared_rid_is_valid(old_rid, strnlen(old_rid, SHARED_RID_LEN + 1)) && !try_find(p, old_rid) &&
            !grant_find(p, old_rid))
                strcpy(w->rid, old_rid);
        else
                rid_format(w->rid, p->params.random(p->params.random_userdata));
        w->cookie = t->cookie;
        w->k = t->slots;
        w->arrival = t->arrival;
        w->lane = strdup(t->lane);
        if (!w->lane) {
                free(w);
                return -ENOMEM;
        }
        w->may_wait = t->may_wait;
        w->lane_budget_set = t->lane_budget_set;
        w->lane_budget = t->lane_budget;
        w->client_cap = t->client_cap;
        w->generation = p->generation;
        deadline_set(p, w, t, now);
        /* Its labels and member (SPEC §3.5) as the scripts take them: the canon, as ARGV[14]; none for any slot
         * (the submit of a brokerd from before selectors). */
        if (!selector_is_empty(t->selector) && selector_canon(t->selector, &w->selector) < 0) {
                try_free(w);
                return -ENOMEM;
        }

        Call *c;
        int r = submit_call_new(p, w, now, &c);
        if (r < 0) {
                try_free(w);
                return r;
        }
        c->resumed = old_rid && streq(w->rid, old_rid);
        list_append(&p->tries, &w->node);
        call_queue(p, c);
        if (held && p->start_since == USEC_INFINITY)
                p->start_since = now;
        /* A registering tick queued before it lists its page as of then: made again with this rid. */
        if (resumed_early)
                requeue_reconcile(p, now);
        return 0;
}

static void try_forget(SharedPool *p, PoolWaiter *w, usec_t now) {
        try_fp_remove(p, w);
        forget_submit(p, w->rid, now);
        try_free(w);
}

static void shared_withdraw(Pool *base, PoolWaiter *w, usec_t now) {
        try_forget(SHARED(base), w, now);
}

static void shared_cancel_try(Pool *base, void *cookie, usec_t now) {
        SharedPool *p = SHARED(base);
        list_foreach(n, &p->tries) {
                PoolWaiter *w = container_of(n, PoolWaiter, node);
                if (w->cookie == cookie) {
                        try_forget(p, w, now);
                        return;
                }
        }
}

/* ------------------------------------------------------------------------- all-or-nothing sets */

/* A set (SPEC §3.5, also=) over pools of one backend is decided by one call (brokerd/lua/set.lua), sent by
 * the chosen pool's object (pools[0]): each pool keeps its part as a try of its own under the set's one rid
 * (its fingerprint, its reconcile, its positions, its withdraw), and gets its part of the answer. */

/* pools[] are this backend's shared pools, each once, and the call can be made. */
static int set_check(Pool *const *pools, size_t n) {
        SharedPool *p = SHARED(pools[0]);
        if (n < 2 || n > SHARED_SET_POOLS_MAX || !p->params.find_pool)
                return -EOPNOTSUPP;
        for (size_t i = 0; i < n; i++) {
                if (pools[i]->ops != &shared_ops ||
                    (i > 0 && p->params.find_pool(pools[i]->name, p->params.find_pool_userdata) != pools[i]))
                        return -EINVAL; /* another backend's, or retired: conf refuses such a set */
                for (size_t j = 0; j < i; j++)
                        if (pools[j] == pools[i])
                                return -EINVAL;
        }
        return 0;
}

/* The set refused by pool `by` before anything was sent: its refusal, and the others' echo of it. */
static void set_refuse_now(Pool *const *pools, const PoolTry *tries, size_t n, size_t by, const char *reason,
                           usec_t now) {
        for (size_t i = 0; i < n; i++)
                emit(SHARED(pools[i]), (PoolDecision) {
                        .verdict = POOL_VERDICT_REFUSED,
                        .cookie = tries[i].cookie,
                        .at = now,
                        .refusal = REFUSAL_UNAVAILABLE,
                        .budget = USEC_INFINITY,
                        .reason = reason,
                        .echo = i != by,
                });
}

/* The set's call: KEYS its pools' prefixes, then the head, mode and rid. */
static int set_call_new(Pool *const *pools, size_t n, const char *mode, const char *rid, usec_t now, Call **ret) {
        SharedPool *p = SHARED(pools[0]);
        SharedPool *shared[SHARED_SET_POOLS_MAX] = {};
        for (size_t i = 0; i < n; i++)
                shared[i] = SHARED(pools[i]);
        Call *c;
        int r = call_new_keys(p, SHARED_SCRIPT_SET, shared, n, op_settles(p), now, &c);
        if (r < 0)
                return r;
        c->set_pools = calloc(n + 1, sizeof(char *));
        for (size_t i = 0; c->set_pools && i < n; i++)
                if (!(c->set_pools[i] = strdup(pools[i]->name))) {
                        call_free(c);
                        return -ENOMEM;
                }
        strcpy(c->rid, rid);
        if (!c->set_pools || (r = call_add(c, "%s", mode)) < 0 || (r = call_add(c, "%s", rid)) < 0) {
                call_free(c);
                return r < 0 ? r : -ENOMEM;
        }
        *ret = c;
        return 0;
}

static bool rid_in_use(Pool *const *pools, size_t n, const char *rid) {
        for (size_t i = 0; i < n; i++)
                if (try_find(SHARED(pools[i]), rid) || grant_find(SHARED(pools[i]), rid))
                        return true;
        return false;
}

static int shared_submit_set(Pool *const *pools, const PoolTry *tries, size_t n, usec_t now) {
        SharedPool *p = SHARED(pools[0]);
        int r = set_check(pools, n);
        if (r < 0)
                return r;
        for (size_t i = 0; i < n; i++) {
                SharedPool *q = SHARED(pools[i]);
                if (!lane_is_configured(q, tries[i].lane) || tries[i].slots == 0 || tries[i].slots > q->base.limit)
                        return -EINVAL;
        }
        /* Each pool as a lone submit judges it (shared_submit()): retired, or not serving and not held for
         * its start, it refuses the set at once, naming itself. */
        for (size_t i = 0; i < n; i++) {
                SharedPool *q = SHARED(pools[i]);
                check_waiter_grace(q, now);
                if (q->base.retired) {
                        set_refuse_now(pools, tries, n, i, NULL, now);
                        return 0;
                }
                if (!pool_serves(q) && !submit_is_held(q, tries + i, now)) {
                        set_refuse_now(pools, tries, n, i, unavailable_reason(q), now);
                        return 0;
                }
        }

        /* A resumed set asks again under its old rid (the same in every pool): Redis answers where it stands,
         * each pool's part ("known"). As a lone resumed waiter (shared_submit()), only while each pool serves
         * or its first reconcile, which drops the rids of this node it does not list, can still list it. */
        char rid[SHARED_RID_LEN + 1];
        const char *old_rid = tries[0].resume ? tries[0].resume->remote_id : NULL;
        bool early[SHARED_SET_POOLS_MAX] = {}, resumable = old_rid && shared_rid_is_valid(old_rid, strnlen(old_rid, SHARED_RID_LEN + 1)) &&
                                                           !rid_in_use(pools, n, old_rid);
        for (size_t i = 0; resumable && i < n; i++) {
                SharedPool *q = SHARED(pools[i]);
                early[i] = !pool_serves(q) && !reconcile_sent(q);
                resumable = pool_serves(q) || early[i];
        }
        if (resumable)
                strcpy(rid, old_rid);
        else
                do
                        rid_format(rid, p->params.random(p->params.random_userdata));
                while (rid_in_use(pools, n, rid));

        /* Labels and a member choose in the chosen pool only (the engine gives the others none). */
        _cleanup_free_ char *selector = NULL;
        if (!selector_is_empty(tries[0].selector) && selector_canon(tries[0].selector, &selector) < 0)
                return -ENOMEM;
        Call *c;
        if ((r = set_call_new(pools, n, "submit", rid, now, &c)) < 0)
                return r;
        if ((r = call_add(c, "%s", tries[0].lane)) < 0 || (r = call_add(c, "%d", tries[0].may_wait)) < 0 ||
            (r = call_add(c, "%zu", n)) < 0)
                goto fail;
        for (size_t i = 0; i < n; i++) {
                const PoolTry *t = tries + i;
                char arrival[32];
                arrival_format(SHARED(pools[i]), t->arrival, now, arrival);
                if ((r = call_add(c, "%u", t->slots)) < 0 ||
                    (r = call_add(c, "%d", t->lane_budget_set)) < 0 ||
                    (r = call_add(c, "%" PRId64, shared_wire_usec(t->lane_budget))) < 0 ||
                    (r = call_add(c, "%" PRId64, shared_wire_usec(t->client_cap))) < 0 ||
                    (r = call_add(c, "%s", arrival)) < 0 ||
                    (r = call_add(c, "%s", i == 0 && selector ? selector : "")) < 0)
                        goto fail;
        }

        PoolWaiter *ws[SHARED_SET_POOLS_MAX] = {};
        for (size_t i = 0; i < n; i++) {
                ws[i] = calloc(1, sizeof(PoolWaiter));
                if (!ws[i] || !(ws[i]->lane = strdup(tries[i].lane))) {
                        for (size_t j = 0; j <= i; j++)
                                if (ws[j])
                                        try_free(ws[j]);
                        r = -ENOMEM;
                        goto fail;
                }
                strcpy(ws[i]->rid, rid);
                ws[i]->cookie = tries[i].cookie;
                ws[i]->k = tries[i].slots;
                ws[i]->arrival = tries[i].arrival;
                ws[i]->gated = ws[i]->in_call = true;
                ws[i]->generation = SHARED(pools[i])->generation; /* its own pool's (waiter_gone()) */
                deadline_set(SHARED(pools[i]), ws[i], tries + i, now);
        }
        for (size_t i = 0; i < n; i++) {
                SharedPool *q = SHARED(pools[i]);
                list_append(&q->tries, &ws[i]->node);
                if (!q->served && q->start_since == USEC_INFINITY)
                        q->start_since = now;
        }
        c->resumed = resumable;
        call_queue(p, c);
        /* A registering tick queued before it lists its page as of then: made again with this rid. */
        for (size_t i = 0; resumable && i < n; i++)
                if (early[i])
                        requeue_reconcile(SHARED(pools[i]), now);
        return 0;
fail:
        call_free(c);
        return r;
}

/* ready(): said ready by its pool, and this node may grant on it. */
static bool shared_ready(const Pool *base, const PoolWaiter *w) {
        return w->gated && w->queued && w->ready && pool_serves(SHARED(base));
}

static int shared_grant_set(Pool *const *pools, PoolWaiter *const *waiters, size_t n, usec_t now) {
        int r = set_check(pools, n);
        if (r < 0)
                return r;
        for (size_t i = 0; i < n; i++)
                if (!waiters[i] || !streq(waiters[i]->rid, waiters[0]->rid) || !shared_ready(pools[i], waiters[i]))
                        return -ESTALE;
        Call *c;
        if ((r = set_call_new(pools, n, "grant", waiters[0]->rid, now, &c)) < 0)
                return r;
        if ((r = call_add(c, "%zu", n)) < 0) {
                call_free(c);
                return r;
        }
        for (size_t i = 0; i < n; i++)
                waiters[i]->in_call = true;
        call_queue(SHARED(pools[0]), c);
        return 0;
}

/* Every part of the set that its pools still have, refused here (reason), its rid withdrawn in each. */
static void set_refuse_locally(SharedPool *p, const Call *c, const char *reason, usec_t now) {
        for (size_t i = 0; i < c->n_keys; i++) {
                SharedPool *q = set_pool(p, c, i);
                PoolWaiter *w = q ? try_find(q, c->rid) : NULL;
                if (w && !w->replicating.grant)
                        try_refuse_locally(q, w, reason, now);
        }
}

/* One pool's reply inside a set's: the checks and the bookkeeping of a call's own reply (call_done()).
 * Returns its status, NULL when it is not the scripts' shape (counted). */
static const RespValue *set_part_reply(SharedPool *q, const Call *c, const RespValue *reply, usec_t now) {
        const RespValue *status = resp_at(reply, 0);
        int64_t pool_now = 0;
        if (!reply_take_clock(q, c, reply, &pool_now, now))
                return NULL;
        if (resp_is(status, "ok") || resp_is(status, "settling")) {
                notices_apply(q, resp_at(reply, 5), now);
                events_apply(q, resp_at(reply, 3), now);
                cache_apply(q, resp_at(reply, 4), pool_now, now);
        }
        return status;
}

/* A part the set's answer left waiting after all ("not-ready", "gone": nothing granted): QUEUED again, so
 * that the engine, which awaits every part's answer, goes on waiting. The pool named is said ready again
 * when it is (set.lua unreadies what it found not ready); the others stay as they were said: one that Redis
 * unreadied too is found so by the next grant, which names it. */
static void set_part_requeue(SharedPool *q, const char *rid, bool named) {
        PoolWaiter *w = try_find(q, rid);
        if (!w || !w->queued)
                return;
        if (named)
                w->ready = false;
        emit(q, (PoolDecision) { .verdict = POOL_VERDICT_QUEUED, .cookie = w->cookie, .at = q->last_now,
                                 .budget = USEC_INFINITY, .waiter = w });
}

/* A part that this answer has queued in pool q for a set given up here meanwhile (cancelled, or refused here:
 * its try forgotten). Each pool withdrew its rid with a call of its own, which need not follow the set's call
 * (another pool's goes when that pool serves); a set's call given up is not sent again for that reason
 * (forget_submit(), call_again(), outbox_send_again()), so this is a guard: had a withdraw gone first, it
 * found nothing, and this part would wait for nobody, gated, holding back that pool's queue on every node until
 * a reconcile drops it (a minute or more on a pool this node is idle on). Withdrawn again, after this call. A
 * part granted so is released by decision_apply(), as any grant of a forgotten rid. */
static void set_part_forgotten(SharedPool *q, const char *rid, const RespValue *body, usec_t now) {
        if (try_find(q, rid) || !rid_was_forgotten(q, rid) || outbox_has(q, SHARED_SCRIPT_WITHDRAW, rid, true))
                return;
        SharedDecision d;
        if (shared_decision_from_array(body, q->base.limit, &d) >= 0 && streq(d.rid, rid) && streq(d.verdict, "queued"))
                (void) queue_rid_call(q, SHARED_SCRIPT_WITHDRAW, rid, 0, now);
        shared_decision_done(&d);
}

/* A decision of pool q's part (granted, queued, refused; "known": whatever the pool has). Returns false when
 * the body is not one of this rid's. */
static bool set_part_decide(SharedPool *q, const char *rid, const RespValue *body, usec_t now) {
        if (body && body->type == RESP_ARRAY && body->n == 1 && resp_is(resp_at(body, 0), "gone")) {
                /* "known": this pool has no trace of its part (withdrawn, reaped, its outcome expired). */
                PoolWaiter *w = try_find(q, rid);
                if (w)
                        try_refuse_locally(q, w, "backend", now);
                return true;
        }
        SharedDecision d;
        if (shared_decision_from_array(body, q->base.limit, &d) < 0 || !streq(d.rid, rid) || streq(d.verdict, "ready")) {
                shared_decision_done(&d);
                return false;
        }
        decision_apply(q, &d, true, now);
        shared_decision_done(&d);
        return true;
}

/* Whether pool q's body in an answer of this verdict may be applied: a decision of this rid that the verdict
 * says ("granted", "queued"; "known": any but "ready", or "gone") and that decision_check() lets through.
 * Every part is checked before any is applied: a part granted and another dropped would be a set held in
 * part. */
static bool set_part_check(SharedPool *q, const char *rid, const RespValue *verdict, const RespValue *body) {
        bool known = resp_is(verdict, "known");
        if (known && body && body->type == RESP_ARRAY && body->n == 1 && resp_is(resp_at(body, 0), "gone"))
                return true;
        SharedDecision d;
        bool ok = shared_decision_from_array(body, q->base.limit, &d) >= 0 && streq(d.rid, rid) &&
                  (known ? !streq(d.verdict, "ready") : resp_is(verdict, d.verdict)) &&
                  !decision_check(q, &d, try_find(q, rid));
        shared_decision_done(&d);
        return ok;
}

/* The answer to a set's call (brokerd/lua/set.lua): { status, pool, verdict, { reply… } }, one reply per pool
 * begun, each its pool's own (its notices, events and cache applied to that pool); then the verdict given to
 * every part. Untrusted (SPEC §11): anything else is bad input, and the set is refused. */
static void set_done(SharedPool *p, Call *c, int error, const RespValue *reply, usec_t now) {
        size_t n = c->n_keys;
        if (!reply || error < 0) {
                (void) call_again(p, c, now); /* sent again once the link is back: idempotent by rid ("known") */
                return;
        }
        const RespValue *status = resp_at(reply, 0), *verdict = resp_at(reply, 2), *replies = resp_at(reply, 3);
        int64_t by = -1;
        if (reply->type == RESP_ERROR) {
                /* A script error (out of memory under noeviction; a bug): the set is refused, not sent again. */
                set_refuse_locally(p, c, "backend", now);
                call_free(c);
                return;
        }
        if (reply->type != RESP_ARRAY || reply->n != 4 || !status || status->type != RESP_STRING ||
            !resp_int(resp_at(reply, 1), &by) || by < 0 || (uint64_t) by > n || !verdict ||
            verdict->type != RESP_STRING || !replies || replies->type != RESP_ARRAY || replies->n > n ||
            (by > 0 && replies->n < (size_t) by)) {
                bad_input(p, "a reply to a set of another shape than the scripts'", now);
                set_refuse_locally(p, c, "bad-reply", now);
                call_free(c);
                return;
        }
        const RespValue *bodies[SHARED_SET_POOLS_MAX] = {};
        for (size_t i = 0; i < replies->n; i++) {
                SharedPool *q = set_pool(p, c, i);
                if (q && set_part_reply(q, c, &replies->elements[i], now))
                        bodies[i] = resp_at(&replies->elements[i], 2);
        }
        SharedPool *named = by > 0 ? set_pool(p, c, (size_t) by - 1) : NULL;

        if (resp_is(status, "settling")) {
                /* Nothing of the set done: the same call again, unless the set was given up meanwhile. */
                if (call_again(p, c, now))
                        c->held = settling_hold(p, now);
                return;
        }
        p->settling = 0;
        if (resp_is(status, "unregistered") && named) {
                /* That pool registers again first (its tick); the set goes once it serves again. */
                state_set(named, SHARED_STATE_REGISTERING);
                named->reclaim_all = true;
                if (!named->tick_pending)
                        (void) queue_tick(named, false, now);
                (void) call_again(p, c, now);
                return;
        }
        if (!resp_is(status, "ok")) {
                /* "rules": that pool's rules differ (its own tick says so and shows the keys); "invalid":
                 * the stored rules refuse what this node's let through; "version", "identity", …: that
                 * pool's own calls find out and say so. */
                if (resp_is(status, "rules") && named)
                        state_set(named, SHARED_STATE_MISMATCH);
                set_refuse_locally(p, c, resp_is(status, "rules") || resp_is(status, "invalid") ? "rules" : "backend",
                                   now);
                call_free(c);
                return;
        }

        /* set.lua's verdicts of each mode only: one of the other mode would leave a part unanswered (a submit's
         * parts "not-ready" are no waiters yet; a grant's "queued" are waiters already), and the engine awaits
         * every part's answer. */
        bool grant = streq(c->argv[c->n_keys + 5], "grant");
        bool all = resp_is(verdict, "granted") || (!grant && resp_is(verdict, "queued")) || resp_is(verdict, "known");
        bool ok = true;
        if (all) {
                for (size_t i = 0; i < n && ok; i++) {
                        SharedPool *q = set_pool(p, c, i);
                        if (q)
                                ok = i < replies->n && set_part_check(q, c->rid, verdict, bodies[i]);
                }
                for (size_t i = 0; i < n && ok; i++) {
                        SharedPool *q = set_pool(p, c, i);
                        if (q)
                                set_part_forgotten(q, c->rid, bodies[i], now);
                        if (q && set_part_decide(q, c->rid, bodies[i], now) && grant)
                                set_part_requeue(q, c->rid, true); /* "known" still waiting there: answered so */
                }
        } else if (!grant && resp_is(verdict, "refused") && named) {
                /* Nothing of the set was written: the pool named refuses, the others echo it. */
                PoolWaiter *w = try_find(named, c->rid);
                SharedDecision d;
                ok = shared_decision_from_array(bodies[by - 1], named->base.limit, &d) >= 0 && streq(d.rid, c->rid) &&
                     streq(d.verdict, "refused") && d.has_refusal;
                if (ok) {
                        usec_t at = w ? local_time_of(named, d.at, w->arrival, now) : now;
                        for (size_t i = 0; i < n; i++) {
                                SharedPool *q = set_pool(p, c, i);
                                PoolWaiter *x = q && q != named ? try_find(q, c->rid) : NULL;
                                if (!x)
                                        continue;
                                void *cookie = x->cookie;
                                try_fp_remove(q, x);
                                rid_forget(q, c->rid);
                                try_free(x);
                                emit(q, (PoolDecision) { .verdict = POOL_VERDICT_REFUSED, .cookie = cookie,
                                                         .at = at, .refusal = d.refusal,
                                                         .reason = shared_decision_reason(&d),
                                                         .budget = USEC_INFINITY, .echo = true });
                        }
                        decision_apply(named, &d, true, now);
                }
                shared_decision_done(&d);
        } else if (grant && (resp_is(verdict, "not-ready") || resp_is(verdict, "gone")) && named) {
                for (size_t i = 0; i < n; i++) {
                        SharedPool *q = set_pool(p, c, i);
                        if (q)
                                set_part_requeue(q, c->rid, q == named);
                }
        } else
                ok = false;
        if (!ok) {
                bad_input(p, "a malformed answer to a set", now);
                set_refuse_locally(p, c, "bad-reply", now);
        }
        for (size_t i = 0; i < n; i++) {
                SharedPool *q = set_pool(p, c, i);
                PoolWaiter *w = q ? try_find(q, c->rid) : NULL;
                if (w)
                        w->in_call = false; /* answered: waiting, to be said ready */
        }
        call_free(c);
}

static void shared_release(Pool *base, PoolGrant *g, usec_t now) {
        SharedPool *p = SHARED(base);
        grant_ended(p, g);
        /* Also a lost lease: if Redis still has it (fenced before Redis freed it), it goes now; if not, the
         * release is "gone", harmlessly (its token is nobody else's). Its exit status goes with it: Redis
         * counts it for the members' quarantine (SPEC §3.6). */
        if (!g->freed_remotely) {
                fp_remove(p, g->rid, 'l');
                (void) queue_release_call(p, SHARED_SCRIPT_RELEASE, g->rid, g->token, g->exit_status, g->exit_job, now);
        }
        for (unsigned i = 0; g->members && i < g->n_slots; i++) {
                PoolMemberLife *m = life_find(p, g->members[i]);
                if (m)
                        m->held += usec_sub_unsigned(now, g->counted_at);
        }
        /* Its reclaim, if it is not out (never sent, or held after an error): dropped, as a withdrawn request's
         * submit is (forget_submit()). Sent after the release, in a recovery window, it would occupy the slots
         * again under a lease nobody holds. One out is answered for nothing (reclaim_done()). */
        bool dropped = false;
        list_foreach_safe(n, &p->outbox) {
                Call *c = container_of(n, Call, node);
                if (c->script == SHARED_SCRIPT_RECLAIM && !c->wait && !c->sent && streq(c->rid, g->rid)) {
                        call_free(c);
                        dropped = true;
                }
        }
        grant_free(g);
        if (dropped)
                reclaiming_end(p, now);
}

/* engine_member_get_use(): this node's counts, for its lease log (the failures in a row are Redis's: 0). */
static int shared_get_use(const Pool *base, const char *member, EngineMemberUse *ret) {
        SharedPool *p = SHARED((Pool *) base);
        if (!p->base.members)
                return -EOPNOTSUPP;
        const PoolMemberLife *m = life_find(p, member);
        if (!m)
                return -ENOENT;
        *ret = (EngineMemberUse) { .grants = m->grants, .held = m->held, .quarantines = m->quarantines };
        return 0;
}

/* engine_member_set_use(): this node's counts as its lease log had them (the failures in a row are Redis's). */
static int shared_set_use(Pool *base, const char *member, const EngineMemberUse *u) {
        SharedPool *p = SHARED(base);
        if (!p->base.members)
                return -EOPNOTSUPP;
        PoolMemberLife *m = life_find(p, member);
        if (!m)
                return -ENOENT;
        m->grants = u->grants;
        m->held = u->held;
        m->quarantines = u->quarantines;
        return 0;
}

/* SPEC §3.6: the exit status is kept on the grant and sent with its release (release.lua counts it in Redis,
 * where every node sees the same count). Out of memory: the job is left out, the status goes. */
static void shared_report_exit(Pool *base, PoolGrant *g, int exit_status, const char *job, usec_t now) {
        (void) base;
        (void) now;
        g->exit_status = exit_status;
        free(g->exit_job);
        g->exit_job = job ? strdup(job) : NULL;
}

/* SPEC §3.6: a quarantine or a restore by hand, through the scripts (quarantine.lua): Redis decides, every
 * node's next reply shows it (the cache's quarantined members), and this node journals it from its reply's
 * notice (notices_apply()). Redis dates it on the pool clock. */
static int shared_quarantine(Pool *base, const char *member, const EngineQuarantine *q, usec_t now) {
        SharedPool *p = SHARED(base);
        if (!p->base.members)
                return -EOPNOTSUPP;
        if (!strv_contains(p->base.members, member))
                return -ENOENT;
        Call *c;
        int r = call_new(p, SHARED_SCRIPT_QUARANTINE, op_settles(p), now, &c);
        if (r < 0)
                return r;
        if ((r = call_add(c, "%s", member)) < 0 || (r = call_add(c, "%d", q && !q->restore)) < 0 ||
            (r = call_add(c, "%s", q && q->job ? q->job : "")) < 0 ||
            (r = call_add(c, "%s", q && !q->restore && q->reason ? q->reason : "")) < 0) {
                call_free(c);
                return r;
        }
        call_queue(p, c);
        return 0;
}

static int shared_restore(Pool *base, const PoolRestore *r, PoolGrant **ret) {
        SharedPool *p = SHARED(base);
        if (!r->remote_id || r->n_slots == 0)
                return -EINVAL;
        const char *colon = strrchr(r->remote_id, ':');
        if (!colon || strlen(colon + 1) != SHARED_RID_LEN)
                return -EINVAL;
        list_foreach(n, &p->grants) {
                PoolGrant *g = container_of(n, PoolGrant, node);
                for (unsigned i = 0; i < g->n_slots; i++)
                        for (unsigned j = 0; j < r->n_slots; j++)
                                if (g->slots[i] == r->slots[j])
                                        return -EEXIST;
        }
        _cleanup_(strv_freep) char **members = NULL;
        if (r->members) {
                members = calloc(r->n_slots + 1, sizeof(char *));
                if (!members)
                        return -ENOMEM;
                for (unsigned i = 0; i < r->n_slots; i++)
                        if (!(members[i] = strdup(r->members[i] ?: "")))
                                return -ENOMEM;
        }
        SharedDecision d = {
                .token = r->token,
                .at = (int64_t) r->granted_at,
                .n_slots = r->n_slots,
                .slots = (unsigned *) r->slots,
                .members = members,
        };
        PoolGrant *g = grant_new(p->params.node_id, colon + 1, r->lane, &d);
        if (!g)
                return -ENOMEM;
        token_floor_raise(p, g->token);
        /* Redis may enforce the TTL it was granted under, not the one configured now (a restart with a longer
         * backend-node-ttl=, or one whose change Redis had not agreed to): the shorter until Redis agrees
         * (tick_done()), as after a reload. */
        if (r->node_ttl > 0)
                p->fence_ttl = MIN(p->fence_ttl, r->node_ttl);
        g->provisional = true;
        g->counted_at = r->granted_at; /* the engine's clock, as pool-local.c's: its hold counts from its grant */
        int k = queue_reclaim(p, g, p->last_now); /* restore() has no `now`: the manual clock must not step back */
        if (k < 0) {
                grant_free(g);
                return k;
        }
        fp_add(p, g->rid, 'l');
        list_append(&p->grants, &g->node);
        if (p->state == SHARED_STATE_UP)
                state_set(p, SHARED_STATE_RECLAIMING);
        *ret = g;
        return 0;
}

static const char *shared_remote_id(const Pool *base, const PoolWaiter *w) {
        (void) base;
        return w ? w->rid : NULL;
}

static void shared_bind_grant(Pool *base, PoolGrant *g, void *cookie) {
        (void) base;
        g->cookie = cookie;
}

/* Liveness per node: the renewal covered the pool within SHARED_RENEW_STALE, and nothing of this node's
 * wants a tick sooner than the pool's own instants (waiters' places, a fingerprint to compare again, a
 * page of reconcile, a recovery window, rules that differ, leases to reclaim). */
static bool renew_covers(const SharedPool *p, usec_t now) {
        return p->renewed_at > 0 && now < usec_add(p->renewed_at, p->renew_stale) && p->renew_ok &&
               p->state == SHARED_STATE_UP && p->fp_mismatches == 0 && !p->reconcile_from &&
               p->cache.recovery_until == 0 && list_is_empty(&p->tries) && !p->identity_conflict;
}

/* When the next heartbeat is due: a second after the last tick, or while the renewal covers the pool when
 * a renewal asks for it (pool_shared_renewed()), and at once when the coverage goes stale. */
static usec_t heartbeat_due(const SharedPool *p, usec_t now) {
        if (p->tick_wanted)
                return now;
        if (!renew_covers(p, now))
                return usec_add(p->last_tick, p->params.heartbeat);
        return usec_add(p->renewed_at, p->renew_stale);
}

bool pool_shared_renewable(const Pool *base) {
        const SharedPool *p = SHARED(base);
        return !p->params.manual_clock && p->params.identity && p->link_up && p->renew_ok &&
               !p->identity_conflict;
}

const char *pool_shared_key(const Pool *base) {
        return SHARED(base)->key;
}

usec_t pool_shared_renew_period(const Pool *base) {
        const SharedPool *p = SHARED(base);
        usec_t margin = p->params.revoke_grace + SHARED_FENCE_SLACK;
        usec_t window = p->fence_ttl > margin ? p->fence_ttl - margin : 0;
        usec_t period = MIN(p->fence_ttl / 4, window / 3);
        return MIN(MAX(period, SHARED_RENEW_PERIOD_MIN), SHARED_RENEW_PERIOD_MAX);
}

usec_t pool_shared_idle_renew_period(const Pool *base) {
        const SharedPool *p = SHARED(base);
        usec_t period = MIN(p->fence_ttl / 2, SHARED_IDLE_RENEW_PERIOD_MAX);
        return MAX(period, pool_shared_renew_period(base));
}

bool pool_shared_holds_nothing(const Pool *base) {
        return list_is_empty(&SHARED(base)->tries) && pool_shared_fence_deadline(base) == USEC_INFINITY;
}

bool pool_shared_confirm_may_rest(const Pool *base) {
        const SharedPool *p = SHARED(base);
        /* Not before the first confirmation (the start's wait is for it), nor once one was lost (requests are
         * refused then, and would never wake the rounds that can bring it back), nor while a release or
         * withdrawal waits to go: those go only on a confirmed primary. */
        return p->params.confirm_stale > 0 && p->confirmed_boot > 0 &&
               (p->unconfirmed_since == USEC_INFINITY || p->confirm_quiet) && pool_shared_holds_nothing(base) &&
               !outbox_gives_back(p);
}

void pool_shared_renewed(Pool *base, bool covered, bool tick, usec_t sent_boot, usec_t period, usec_t now) {
        SharedPool *p = SHARED(base);
        now = driver_now(p, now);
        p->last_now = MAX(p->last_now, now);
        /* A dead node's registration lapsed here: this pool's tick reaps it (uncovered, it ticks anyway). */
        if (tick)
                p->tick_wanted = true;
        if (!covered || !p->renew_ok) {
                p->renewed_at = 0;
                return;
        }
        /* Redis keeps the registration at least a TTL after the renewal ran, which is after it was sent. */
        if (p->acked_boot == USEC_INFINITY || sent_boot > p->acked_boot)
                p->acked_boot = sent_boot;
        p->renewed_at = now;
        p->renew_stale = usec_add(period, SHARED_RENEW_STALE);
        /* The idle tick (a fingerprint compared, waiters' places) goes with a renewal: every pool of this
         * node due then ticks in the same dispatch, their calls sent together. A renewal's full read compares
         * the fingerprint too (pool_shared_renewal_fingerprint()): agreeing, it stands for the tick. */
        if (now >= usec_add(MAX(p->last_tick, p->fp_renewed_at), SHARED_IDLE_PERIOD))
                p->tick_wanted = true;
}

void pool_shared_renewal_fingerprint(Pool *base, int64_t n, int64_t x, int64_t s, usec_t now) {
        SharedPool *p = SHARED(base);
        now = driver_now(p, now);
        /* As a tick's: only with nothing of this pool's in flight, whose answer would move one side first. */
        if (!list_is_empty(&p->outbox) || !list_is_empty(&p->tries))
                return;
        if (fp_equals(p, n, x, s)) {
                p->fp_renewed_at = now;
                p->reconciled_at = now;
                return;
        }
        /* The tick compares again, and a second difference in a row reconciles (a stream entry racing the
         * renewal, a LOST read after it, differs once). */
        p->tick_wanted = true;
}

/* The sets' parts said ready while this pool did not serve (ready() said no): said again now that it
 * serves, or a set whose last READY came then would wait for a word that was said already. */
static void sets_say_ready_again(SharedPool *p, usec_t now) {
        list_foreach(n, &p->tries) {
                PoolWaiter *w = container_of(n, PoolWaiter, node);
                if (w->gated && w->queued && w->ready)
                        emit(p, (PoolDecision) { .verdict = POOL_VERDICT_READY, .cookie = w->cookie, .at = now });
        }
}

static void shared_run(Pool *base, usec_t now) {
        SharedPool *p = SHARED(base);
        p->last_now = MAX(p->last_now, now);
        check_waiter_grace(p, now);
        if (p->status_wanted) {
                p->status_wanted = false;
                p->status_until = usec_add(now, SHARED_STATUS_KEEP);
        }
        if (!p->link_up || refused_quiet(p))
                return;
        bool operations = pool_serves(p);
        if (operations && !p->served_at_run)
                sets_say_ready_again(p, now);
        p->served_at_run = operations;
        bool paged = false; /* a page of this node's waiters' places is queued already */
        if (pool_fetches_status(p) && now < p->status_until && !p->status_pending &&
            (p->status_last == 0 || now >= usec_add(p->status_last, USEC_PER_SEC)))
                paged = queue_status(p, now) >= 0;
        /* A tick of an earlier instant may still be out (the engine settles the instants before `now` one
         * by one, and this pool says it has no wakeup until that answer): the manual clock's instant `now`
         * needs its own tick all the same, or it would be completed only at the engine's next instant. */
        if (p->tick_pending && !(p->params.manual_clock && now > p->last_tick))
                return;
        if (now < p->settling_pause)
                return; /* settling_hold(): shared_next_wakeup() says when */
        /* The manual clock: every run() is the engine's instant, completed by Redis (memo §3.10). In
         * production: the heartbeat (slower while the renewal covers the pool), or the pool's own next
         * instant (a budget ending, a gauge flip, another node's registration lapsing). */
        bool due = p->params.manual_clock ||
                   now >= heartbeat_due(p, now) ||
                   (p->cache.valid && p->cache.next_wakeup >= 0 &&
                    local_time_of(p, p->cache.next_wakeup, 0, USEC_INFINITY - 1) <= now);
        if (!due)
                return;
        (void) queue_tick(p, true, now);
        if (!operations)
                return;
        /* Waiters' places: a page a heartbeat, round robin, unless the status fetch above took one (every run()
         * in the manual mode, after its tick, so that a test reads exact places). */
        if (!paged || p->params.manual_clock)
                (void) queue_positions(p, false, now);
}

static usec_t shared_next_wakeup(const Pool *base) {
        SharedPool *p = SHARED(base);
        usec_t w = USEC_INFINITY;
        if (outage_since(p) != USEC_INFINITY && !list_is_empty(&p->tries))
                w = usec_add(outage_since(p), p->params.waiter_grace);
        /* While a tick is awaited its answer decides the next instant: a wakeup reported now would stay in
         * the past until then. */
        if (!p->link_up || refused_quiet(p) || p->tick_pending || p->run_pending)
                return w;
        /* In the manual mode every run() is a heartbeat, and the engine's instants are the only ones: an
         * instant of the pool's own would be one the in-process pool does not have (memo §3.10). */
        usec_t due = USEC_INFINITY;
        if (!p->params.manual_clock)
                due = heartbeat_due(p, p->last_now);
        /* But a retired pool has no gauge (congestion_set()), nor a queue for a rested slot, nor an instant for
         * them, as pool-local.c's has none (local_next_wakeup()): its next instant in Redis, when that is its idle
         * passing Q or a rest's end, is no one's here. */
        if (p->cache.valid && p->cache.next_wakeup >= 0 &&
            !(p->base.retired &&
              (p->cache.next_wakeup == p->cache.gauge_at || p->cache.next_wakeup == p->cache.rest_at)))
                /* Nor is an instant it passed so, once it is back, in the past: it is the reload's (pool-local.c's
                 * gauge turns on at MAX(idle passing Q, the latest instant), its rests end then), not one the
                 * engine would settle after it. */
                due = MIN(due, MAX(local_time_of(p, p->cache.next_wakeup, 0, USEC_INFINITY - 1), p->last_now));
        /* No tick before the end of a pause of settling_hold(). */
        if (due != USEC_INFINITY)
                due = MAX(due, p->settling_pause);
        return MIN(w, due);
}

/* drain.lua's call: the member ("" the pool) and on; with `with` (a drain that keeps who, why and until in Redis,
 * SPEC §3.6), those three too. */
static int drain_queue(SharedPool *p, const char *member, bool on, bool with, const char *who, const char *reason,
                       const char *until, usec_t now) {
        if (member && !strv_contains(p->base.members, member))
                return -ENOENT;
        Call *c;
        int r = call_new(p, SHARED_SCRIPT_DRAIN, op_settles(p), now, &c);
        if (r < 0)
                return r;
        if ((r = call_add(c, "%s", member ?: "")) < 0 || (r = call_add(c, "%d", on)) < 0 ||
            (with && ((r = call_add(c, "%s", who ?: "")) < 0 || (r = call_add(c, "%s", reason ?: "")) < 0 ||
                      (r = call_add(c, "%s", until)) < 0))) {
                call_free(c);
                return r;
        }
        if (!member)
                p->base.drained = on;
        call_queue(p, c);
        return 0;
}

static int shared_drain(Pool *base, const char *member, bool on, usec_t now) {
        return drain_queue(SHARED(base), member, on, false, NULL, NULL, NULL, now);
}

/* SPEC §3.6: who, why and until go to Redis with the drain (drain.lua), which keeps them for every node and
 * undrains at until by itself: the pool's own instant, whichever node's call runs it. until on the pool clock. */
static int shared_drain_with(Pool *base, const char *member, const EngineDrain *d, usec_t now) {
        SharedPool *p = SHARED(base);
        char until[32] = "";
        if (d && d->until != USEC_INFINITY)
                snprintf(until, sizeof until, "%" PRId64, pool_clock_of(p, d->until));
        return drain_queue(p, member, d != NULL, true, d ? d->who : NULL, d ? d->reason : NULL, until, now);
}

static size_t shared_position(const Pool *base, const PoolWaiter *w, size_t *ret_queued) {
        (void) base;
        if (ret_queued)
                *ret_queued = w->n_queued;
        return w->position;
}

/* A release or withdrawal is queued or in flight, and Redis may still take it: the pool is not refused, its
 * rules agree, and this node was not fenced (then Redis freed, or frees, all it had). While the link is down
 * the debt stays: it is paid when Redis is back. */
static bool pool_shared_owes(const SharedPool *p) {
        /* Refused, fenced, or reaped ("canon"): Redis reaps, or reaped, this node's records after the node TTL.
         * Rules that differ do not stop the releases (call_may_go()): they are owed. */
        if (p->state == SHARED_STATE_REFUSED || p->state == SHARED_STATE_FENCED ||
            (p->state == SHARED_STATE_MISMATCH && !pool_gives_back(p)))
                return false;
        return outbox_gives_back(p);
}

static void shared_info(const Pool *base, usec_t now, PoolInfo *ret) {
        SharedPool *p = SHARED(base);
        unsigned in_use = 0;
        size_t waiting = 0;
        list_foreach(n, &p->grants)
                in_use += container_of(n, PoolGrant, node)->n_slots;
        /* Tries not answered yet count as waiting: a retired pool must not be freed under them. */
        list_foreach(n, &p->tries)
                waiting++;
        *ret = (PoolInfo) {
                .limit = p->base.limit,
                .in_use = in_use,
                .waiting = waiting,
                .congested = p->congested,
                .drained = p->base.drained,
                .queue_timeout_set = p->base.queue_timeout_set,
                .queue_timeout = p->base.queue_timeout,
                .idle = p->cache.valid ? usec_add(p->cache.idle, now - MIN(now, p->cache.at)) : 0,
                .next_token = p->cache.counter + 1,
                .remote = true,
                .backend_up = pool_serves(p) || pool_confirm_rests_served(p),
                .unavailable = p->state == SHARED_STATE_REFUSED && p->refused_why ? p->refused_why
                               : pool_confirm_rests_served(p)                     ? NULL
                                                                                  : unavailable_reason(p),
                .differing_keys = p->differing_keys,
                .rtt = p->rtt,
                .n_nodes = p->n_nodes,
                .all_in_use = p->cache.valid ? (unsigned) MIN(p->cache.in_use, (uint64_t) UINT_MAX) : in_use,
                .all_waiting = p->cache.valid ? (size_t) p->cache.waiting : waiting,
                .agreed_limit = p->cache.valid ? p->cache.limit : 0,
                .cache_age = p->cache.valid ? now - MIN(now, p->cache.at) : USEC_INFINITY,
                .min_replicas = p->min_replicas,
                .replicas_acked = p->replicas_acked,
                .owes = pool_shared_owes(p),
                .bad_input = p->bad_input,
                .resting = p->cache.n_rests > 0 ? p->cache.rests : NULL,
                .n_resting = p->cache.n_rests,
                .cooldown = p->cooldown,
                .life = p->n_life > 0 ? p->life : NULL,
                .n_life = p->n_life,
                .drains = p->drains,
                .n_drains = p->n_drains,
        };
}

static void shared_set_token_floor(Pool *base, uint64_t next_token) {
        if (next_token > 0)
                token_floor_raise(SHARED(base), next_token - 1);
}

static int shared_snapshot(const Pool *base, PoolSnapshot *ret) {
        /* Status never waits for Redis: it gets the last snapshot, and asking keeps the fetches going (the
         * next run() starts them; a cache's bookkeeping, hence the cast). */
        SharedPool *p = SHARED(base);
        p->status_wanted = true;
        if (!p->snap_valid)
                return -ENODATA;
        *ret = (PoolSnapshot) {
                .holders = p->snap_holders,
                .n_holders = p->n_snap_holders,
                .waiters = p->snap_waiters,
                .n_waiters = p->n_snap_waiters,
                .waiting = p->snap_waiting,
                .age = p->last_now - MIN(p->last_now, p->snap_at),
                .at = p->snap_at,
        };
        return 0;
}

static int shared_refresh_snapshot(Pool *base, usec_t since, usec_t now) {
        SharedPool *p = SHARED(base);
        p->last_now = MAX(p->last_now, now);
        /* Someone looks: the periodic fetches go on as snapshot() makes them. */
        p->status_until = usec_add(now, SHARED_STATUS_KEEP);
        if (p->snap_valid && p->snap_at >= since)
                return 0;
        if (!p->link_up || p->state == SHARED_STATE_REFUSED || !pool_fetches_status(p))
                return 0; /* no fetch would be answered: the last snapshot is all there is */
        if (p->status_pending)
                return 1; /* asked before `since`, maybe: the next call after its answer asks again */
        return queue_status(p, now) < 0 ? 0 : 1;
}

static const PoolOps shared_ops = {
        .kind = "shared",
        .selectors = true,
        .free = shared_free,
        .configure_prepare = shared_configure_prepare,
        .configure_commit = shared_configure_commit,
        .configure_abort = shared_configure_abort,
        .retire = shared_retire,
        .submit = shared_submit,
        .withdraw = shared_withdraw,
        .release = shared_release,
        .restore = shared_restore,
        .run = shared_run,
        .next_wakeup = shared_next_wakeup,
        .drain = shared_drain,
        .report_exit = shared_report_exit,
        .quarantine = shared_quarantine,
        .set_use = shared_set_use,
        .get_use = shared_get_use,
        .drain_with = shared_drain_with,
        .position = shared_position,
        .info = shared_info,
        .set_token_floor = shared_set_token_floor,
        .bind_grant = shared_bind_grant,
        .cancel_try = shared_cancel_try,
        .snapshot = shared_snapshot,
        .ready = shared_ready,
        .submit_set = shared_submit_set,
        .grant_set = shared_grant_set,
        .refresh_snapshot = shared_refresh_snapshot,
        .remote_id = shared_remote_id,
};

int pool_shared_new(const char *name, const SharedPoolParams *params, PoolEmitFn emit_fn, void *emit_userdata,
                    Pool **ret) {
        if (!name || !params || !params->node_id || !params->node_name || !params->random || !emit_fn)
                return -EINVAL;
        SharedPool *p = calloc(1, sizeof(SharedPool));
        if (!p)
                return -ENOMEM;
        p->base = (Pool) {
                .ops = &shared_ops,
                .name = name,
                .emit = emit_fn,
                .emit_userdata = emit_userdata,
        };
        p->params = *params;
        p->fence_ttl = params->node_ttl;
        list_init(&p->tries);
        list_init(&p->grants);
        list_init(&p->outbox);
        list_init(&p->batches);
        list_init(&p->notices);
        list_init(&p->held);
        p->down_since = USEC_INFINITY;
        p->acked_boot = USEC_INFINITY;
        p->stale_ack = USEC_INFINITY;
        p->replicas_acked = -1;
        p->alive_boot = USEC_INFINITY;
        p->start_since = USEC_INFINITY;
        p->bad_input_told = USEC_INFINITY;
        /* Behind Sentinels the pool starts unconfirmed: nothing is granted before a majority names the primary. */
        p->unconfirmed_since = params->confirm_stale > 0 ? 0 : USEC_INFINITY;
        /* The first heartbeat carries a whole reconcile: Redis may hold records of this node id that no
         * process knows any more (a brokerd killed and started again: the leases that ended while it was
         * down, the waiters it had, a grant it never recorded). The fingerprint would find them, but only
         * on a heartbeat with nothing else in flight, which a busy node may not send for a long time. */
        p->reconcile_from = strdup("-");
        state_set(p, SHARED_STATE_CONNECTING);
        if (asprintf(&p->key, "{sb:%s}", name) < 0)
                p->key = NULL;
        if (asprintf(&p->stream_key, "{sb:%s}:s:%s", name, params->node_id) < 0)
                p->stream_key = NULL;
        if ((params->identity ? asprintf(&p->node_arg, "%s/%s", params->node_id, params->identity)
                              : asprintf(&p->node_arg, "%s", params->node_id)) < 0)
                p->node_arg = NULL;
        if (!p->key || !p->stream_key || !p->node_arg) {
                shared_free(&p->base);
                return -ENOMEM;
        }
        *ret = &p->base;
        return 0;
}
