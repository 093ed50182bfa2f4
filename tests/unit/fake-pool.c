/* SPDX-License-Identifier: MIT */
/* fake-pool.c — a pool that decides later (fake-pool.h). Fixed-size tables: a test uses a handful of tries. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake-pool.h"

#define FAKE_SLOTS_MAX 64
#define FAKE_TRIES_MAX 64
#define FAKE_GRANTS_MAX 64

/* A try, from submit() until it is answered with a final decision, withdrawn or cancelled. */
struct PoolWaiter {
        bool used;
        bool queued;              /* QUEUED was sent */
        void *cookie;
        unsigned slots;
        bool may_wait;
        bool gated;               /* one pool of an all-or-nothing set (PoolTry.gated): decided at once */
        bool granting;            /* gated, grant_waiter() asked with fake_pool_defer_sets(): granted on answer */
};

struct PoolGrant {
        bool used;
        void *cookie;             /* bind_grant()'s */
        uint64_t token;
        unsigned n_slots;
        unsigned slots[FAKE_SLOTS_MAX];
        char remote_id[64];
};

struct FakePool {
        Pool base;
        struct PoolWaiter tries[FAKE_TRIES_MAX]; /* in arrival order */
        size_t n_tries;
        struct PoolGrant grants[FAKE_GRANTS_MAX];
        bool taken[FAKE_SLOTS_MAX];
        uint64_t next_token;
        Refusal refusal;
        const char *reason;
        Refusal waiter_refusal;
        usec_t wait;
        usec_t wakeup;
        bool sticky;
        bool hold_answers;
        bool defer_sets;
        char prefix[32];
        char restored_remote_id[64];
        FakePoolStats stats;
};

static FakePool *fake(const Pool *p) {
        return (FakePool *) p;
}

static void fail(const char *what) {
        /* The tests are the only users: a table too small, or an engine that spins, ends the run loudly. */
        fprintf(stderr, "fake-pool: %s\n", what);
        abort();
}

static void emit(FakePool *p, PoolDecision d) {
        d.pool = &p->base;
        if (d.verdict == POOL_VERDICT_GRANTED || d.verdict == POOL_VERDICT_REFUSED) {
                d.has_wait = p->wait != USEC_INFINITY;
                d.wait = d.has_wait ? p->wait : 0;
        }
        pool_emit(&p->base, &d);
}

static void count(FakePool *p) {
        p->stats.pending = p->stats.waiting = 0;
        p->stats.in_use = 0;
        for (size_t i = 0; i < p->n_tries; i++)
                if (p->tries[i].used) {
                        if (p->tries[i].queued)
                                p->stats.waiting++;
                        else
                                p->stats.pending++;
                }
        for (size_t i = 0; i < FAKE_SLOTS_MAX; i++)
                p->stats.in_use += p->taken[i];
}

static bool has_room(const FakePool *p, unsigned slots) {
        unsigned free_slots = 0;
        for (unsigned i = 0; i < p->base.limit; i++)
                free_slots += !p->taken[i];
        return slots <= free_slots;
}

static struct PoolGrant *grant_new(FakePool *p) {
        for (size_t i = 0; i < FAKE_GRANTS_MAX; i++)
                if (!p->grants[i].used) {
                        p->grants[i] = (struct PoolGrant) { .used = true };
                        return &p->grants[i];
                }
        fail("too many grants");
        return NULL;
}

static void grant(FakePool *p, struct PoolWaiter *w, usec_t now) {
        struct PoolGrant *g = grant_new(p);
        g->token = p->next_token++;
        for (unsigned i = 0; i < p->base.limit && g->n_slots < w->slots; i++)
                if (!p->taken[i]) {
                        p->taken[i] = true;
                        g->slots[g->n_slots++] = i;
                }
        if (p->prefix[0])
                snprintf(g->remote_id, sizeof g->remote_id, "%s:%" PRIu64, p->prefix, g->token);
        w->used = false;
        emit(p, (PoolDecision) {
                .verdict = POOL_VERDICT_GRANTED,
                .cookie = w->cookie,
                .at = now,
                .budget = USEC_INFINITY,
                .grant = g,
                .slots = g->slots,
                .n_slots = g->n_slots,
                .token = g->token,
                .remote_id = g->remote_id[0] ? g->remote_id : NULL,
        });
}

static void refuse(FakePool *p, struct PoolWaiter *w, Refusal refusal, const char *reason, usec_t now) {
        w->used = false;
        emit(p, (PoolDecision) {
                .verdict = POOL_VERDICT_REFUSED,
                .cookie = w->cookie,
                .at = now,
                .refusal = refusal,
                .budget = USEC_INFINITY,
                .reason = refusal == REFUSAL_UNAVAILABLE ? reason : NULL,
        });
}

/* QUEUED for w: it waits in p; room: a set's part that could be granted now (PoolDecision.room). */
static void queue(FakePool *p, struct PoolWaiter *w, bool room, usec_t now) {
        w->queued = true;
        emit(p, (PoolDecision) {
                .verdict = POOL_VERDICT_QUEUED,
                .cookie = w->cookie,
                .at = now,
                .budget = USEC_INFINITY,
                .waiter = w,
                .room = room,
        });
}

static bool is_first(const FakePool *p, const struct PoolWaiter *w);

/* A set's part (PoolTry.gated) decided, at once or on the answer: queued when it could be granted now (first
 * with room, no waiter ahead of it `blocked`) or may wait, else refused busy. Never granted here. */
static void decide_part(FakePool *p, struct PoolWaiter *w, bool blocked, usec_t now) {
        bool room = !blocked && is_first(p, w) && has_room(p, w->slots);
        if (room || w->may_wait)
                queue(p, w, room, now);
        else
                refuse(p, w, REFUSAL_BUSY, NULL, now);
}

void fake_pool_answer(FakePool *p, usec_t now) {
        bool blocked = false; /* a waiter ahead could not be served: nobody behind it barges */
        for (size_t i = 0; i < p->n_tries; i++) {
                struct PoolWaiter *w = &p->tries[i];
                if (!w->used)
                        continue;
                if (!w->queued && p->refusal != _REFUSAL_INVALID)
                        refuse(p, w, p->refusal, p->reason, now);
                else if (w->granting) {
                        if (!blocked && has_room(p, w->slots))
                                grant(p, w, now);
                        else
                                refuse(p, w, REFUSAL_UNAVAILABLE, NULL, now);
                } else if (w->gated && !w->queued) {
                        /* A deferred set part: decided as submit() decides one at once. */
                        decide_part(p, w, blocked, now);
                        blocked = true;
                } else if (w->gated) {
                        /* Never granted here: said READY at the head with room, and holds back those behind. */
                        if (!blocked && has_room(p, w->slots))
                                emit(p, (PoolDecision) { .verdict = POOL_VERDICT_READY, .cookie = w->cookie, .at = now });
                        blocked = true;
                } else if (!blocked && has_room(p, w->slots))
                        grant(p, w, now);
                else if (w->queued && p->waiter_refusal != _REFUSAL_INVALID)
                        refuse(p, w, p->waiter_refusal, NULL, now);
                else if (w->queued)
                        blocked = true;
                else if (w->may_wait) {
                        queue(p, w, false, now);
                        blocked = true;
                } else
                        refuse(p, w, REFUSAL_BUSY, NULL, now);
        }
        count(p);
}

void fake_pool_defer_sets(FakePool *p, bool defer) {
        p->defer_sets = defer;
}

void fake_pool_refuse(FakePool *p, Refusal refusal, const char *reason) {
        p->refusal = refusal;
        p->reason = reason;
}

void fake_pool_refuse_waiters(FakePool *p, Refusal refusal) {
        p->waiter_refusal = refusal;
}

void fake_pool_measure_wait(FakePool *p, usec_t wait) {
        p->wait = wait;
}

void fake_pool_name_grants(FakePool *p, const char *prefix) {
        snprintf(p->prefix, sizeof p->prefix, "%s", prefix);
}

bool fake_pool_lose(FakePool *p, uint64_t token, const char *reason, usec_t at) {
        for (size_t i = 0; i < FAKE_GRANTS_MAX; i++) {
                struct PoolGrant *g = &p->grants[i];
                if (g->used && g->token == token && g->cookie) {
                        /* Its slots stay counted until the engine releases the lease. */
                        emit(p, (PoolDecision) {
                                .verdict = POOL_VERDICT_LOST,
                                .cookie = g->cookie,
                                .at = at,
                                .reason = reason,
                        });
                        return true;
                }
        }
        return false;
}

void fake_pool_hold_answers(FakePool *p, bool hold) {
        p->hold_answers = hold;
}

void fake_pool_set_wakeup(FakePool *p, usec_t t, bool sticky) {
        p->wakeup = t;
        p->sticky = sticky;
}

const FakePoolStats *fake_pool_stats(const FakePool *p) {
        return &p->stats;
}

/* ---- PoolOps ---- */

static void op_free(Pool *base) {
        free(fake(base));
}

/* What configure_prepare() checked, for configure_commit(). */
struct PoolStaged {
        const PoolConfig *c;
        bool drains_given, drained;
};

static int op_configure_prepare(Pool *base, const PoolConfig *c, const PoolLaneRule *rules, size_t n_rules,
                                const PoolDrains *drains, usec_t now, PoolStaged **ret) {
        if (c->limit > FAKE_SLOTS_MAX)
                return -EINVAL;
        PoolStaged *s = calloc(1, sizeof(PoolStaged));
        if (!s)
                return -ENOMEM;
        *s = (PoolStaged) { .c = c, .drains_given = !!drains, .drained = drains && drains->drained };
        *ret = s;
        return 0;
}

static void op_configure_commit(Pool *base, PoolStaged *s, usec_t now) {
        base->limit = s->c->limit;
        base->queue_timeout_set = s->c->queue_timeout_set;
        base->queue_timeout = s->c->queue_timeout;
        if (s->drains_given)
                base->drained = s->drained; /* members it has none (op_drain()) */
        free(s);
}

static void op_configure_abort(Pool *base, PoolStaged *s) {
        free(s);
}

static void op_retire(Pool *base, usec_t now) {
        FakePool *p = fake(base);
        base->retired = true;
        for (size_t i = 0; i < p->n_tries; i++)
                if (p->tries[i].used)
                        refuse(p, &p->tries[i], REFUSAL_UNAVAILABLE, NULL, now);
        count(p);
}

/* No queued try before w. */
static bool is_first(const FakePool *p, const struct PoolWaiter *w) {
        for (const struct PoolWaiter *i = p->tries; i < w; i++)
                if (i->used && i->queued)
                        return false;
        return true;
}

static int op_submit(Pool *base, const PoolTry *t, usec_t now) {
        FakePool *p = fake(base);
        if (p->n_tries == FAKE_TRIES_MAX)
                fail("too many tries");
        struct PoolWaiter *w = &p->tries[p->n_tries++];
        *w = (struct PoolWaiter) {
                .used = true,
                .cookie = t->cookie,
                .slots = t->slots,
                .may_wait = t->may_wait,
                .gated = t->gated,
        };
        /* A set's part is decided at once (in-process answers), or on the answer with fake_pool_defer_sets(). */
        if (t->gated && !p->defer_sets) {
                if (p->refusal != _REFUSAL_INVALID)
                        refuse(p, w, p->refusal, p->reason, now);
                else
                        decide_part(p, w, false, now);
        }
        count(p);
        return 0;
}

static void op_withdraw(Pool *base, PoolWaiter *w, usec_t now) {
        FakePool *p = fake(base);
        w->used = false;
        p->stats.withdrawn++;
        count(p);
}

static void op_release(Pool *base, PoolGrant *g, usec_t now) {
        FakePool *p = fake(base);
        for (unsigned i = 0; i < g->n_slots; i++)
                p->taken[g->slots[i]] = false;
        g->used = false;
        p->stats.released++;
        count(p);
}

static int op_restore(Pool *base, const PoolRestore *rs, PoolGrant **ret) {
        FakePool *p = fake(base);
        for (unsigned i = 0; i < rs->n_slots; i++)
                if (rs->slots[i] >= FAKE_SLOTS_MAX || p->taken[rs->slots[i]])
                        return -EEXIST;
        struct PoolGrant *g = grant_new(p);
        g->token = rs->token;
        for (unsigned i = 0; i < rs->n_slots; i++) {
                p->taken[rs->slots[i]] = true;
                g->slots[g->n_slots++] = rs->slots[i];
        }
        if (rs->remote_id)
                snprintf(g->remote_id, sizeof g->remote_id, "%s", rs->remote_id);
        snprintf(p->restored_remote_id, sizeof p->restored_remote_id, "%s", rs->remote_id ?: "");
        p->stats.restored_remote_id = rs->remote_id ? p->restored_remote_id : NULL;
        p->next_token = rs->token >= p->next_token ? rs->token + 1 : p->next_token;
        count(p);
        *ret = g;
        return 0;
}

static void op_run(Pool *base, usec_t now) {
        FakePool *p = fake(base);
        if (p->stats.n_runs == FAKE_RUNS_MAX)
                fail("run() called too often: does the engine spin on a wakeup that stays due?");
        p->stats.runs[p->stats.n_runs++] = now;
        if (!p->sticky)
                p->wakeup = USEC_INFINITY;
        if (!p->hold_answers)
                fake_pool_answer(p, now);
}

static usec_t op_next_wakeup(const Pool *base) {
        return fake(base)->wakeup;
}

static int op_drain(Pool *base, const char *member, bool on, usec_t now) {
        if (member)
                return -ENOENT;
        base->drained = on;
        return 0;
}

static size_t op_position(const Pool *base, const PoolWaiter *w, size_t *ret_queued) {
        const FakePool *p = fake(base);
        size_t pos = 0, queued = 0;
        for (size_t i = 0; i < p->n_tries; i++)
                if (p->tries[i].used && p->tries[i].queued) {
                        if (&p->tries[i] == w)
                                pos = queued;
                        queued++;
                }
        if (ret_queued)
                *ret_queued = queued;
        return pos;
}

static void op_info(const Pool *base, usec_t now, PoolInfo *ret) {
        const FakePool *p = fake(base);
        *ret = (PoolInfo) {
                .limit = base->limit,
                .in_use = p->stats.in_use,
                .waiting = p->stats.waiting + p->stats.pending, /* a retired pool stays while they are answered */
                .drained = base->drained,
                .next_token = p->next_token,
                .remote = true,
                .backend_up = true,
        };
}

static void op_set_token_floor(Pool *base, uint64_t next_token) {
        FakePool *p = fake(base);
        if (next_token > p->next_token)
                p->next_token = next_token;
}

static void op_bind_grant(Pool *base, PoolGrant *g, void *cookie) {
        g->cookie = cookie;
}

static void op_cancel_try(Pool *base, void *cookie, usec_t now) {
        FakePool *p = fake(base);
        for (size_t i = 0; i < p->n_tries; i++)
                if (p->tries[i].used && p->tries[i].cookie == cookie)
                        p->tries[i].used = false;
        p->stats.cancelled++;
        p->stats.last_cancelled = cookie;
        count(p);
}

static bool op_ready(const Pool *base, const PoolWaiter *w) {
        const FakePool *p = fake(base);
        return w->used && w->gated && w->queued && !w->granting && is_first(p, w) && has_room(p, w->slots);
}

/* One call over the set (pools of one backend): counted in pools[0]'s set_calls; each pool answers its own
 * part as submit() would. */
static int op_submit_set(Pool *const *pools, const PoolTry *tries, size_t n, usec_t now) {
        fake(pools[0])->stats.set_calls++;
        for (size_t i = 0; i < n; i++) {
                int r = op_submit(pools[i], tries + i, now);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int op_grant_waiter(Pool *base, PoolWaiter *w, bool at_once, usec_t now);

/* All or none: every part ready, else -ESTALE and nothing changed. */
static int op_grant_set(Pool *const *pools, PoolWaiter *const *waiters, size_t n, usec_t now) {
        fake(pools[0])->stats.set_calls++;
        for (size_t i = 0; i < n; i++)
                if (!op_ready(pools[i], waiters[i]))
                        return -ESTALE;
        for (size_t i = 0; i < n; i++)
                (void) op_grant_waiter(pools[i], waiters[i], false, now);
        return 0;
}

static int op_grant_waiter(Pool *base, PoolWaiter *w, bool at_once, usec_t now) {
        FakePool *p = fake(base);
        (void) at_once; /* slots without members: the same whichever way */
        if (!op_ready(base, w))
                return -ESTALE;
        if (p->defer_sets) {
                w->granting = true; /* granted on the answer */
                return 0;
        }
        grant(p, w, now);
        count(p);
        return 0;
}

static int op_snapshot(const Pool *base, PoolSnapshot *ret) {
        const FakePool *p = fake(base);
        *ret = (PoolSnapshot) { .waiting = p->stats.waiting };
        return 0;
}

static const PoolOps fake_ops = {
        .kind = "fake",
        .free = op_free,
        .configure_prepare = op_configure_prepare,
        .configure_commit = op_configure_commit,
        .configure_abort = op_configure_abort,
        .retire = op_retire,
        .submit = op_submit,
        .withdraw = op_withdraw,
        .release = op_release,
        .restore = op_restore,
        .run = op_run,
        .next_wakeup = op_next_wakeup,
        .drain = op_drain,
        .position = op_position,
        .info = op_info,
        .set_token_floor = op_set_token_floor,
        .bind_grant = op_bind_grant,
        .cancel_try = op_cancel_try,
        .snapshot = op_snapshot,
        .ready = op_ready,
        .grant_waiter = op_grant_waiter,
        .submit_set = op_submit_set,
        .grant_set = op_grant_set,
};

int fake_pool_factory(const PoolConfig *pc, const char *name, PoolEmitFn emit_fn, void *emit_userdata, void *userdata,
                      Pool **ret) {
        FakePoolSet *s = userdata;
        if (s->n_pools == FAKE_POOLS_MAX)
                return -ENOMEM;
        FakePool *p = calloc(1, sizeof(FakePool));
        if (!p)
                return -ENOMEM;
        p->base = (Pool) { .ops = &fake_ops, .name = name, .emit = emit_fn, .emit_userdata = emit_userdata };
        p->next_token = 1;
        p->refusal = _REFUSAL_INVALID;
        p->waiter_refusal = _REFUSAL_INVALID;
        p->wait = USEC_INFINITY;
        p->wakeup = USEC_INFINITY;
        s->pools[s->n_pools++] = p;
        *ret = &p->base;
        return 0;
}

FakePool *fake_pool_set_find(const FakePoolSet *s, const char *name) {
        for (size_t i = 0; i < s->n_pools; i++)
                if (streq(s->pools[i]->base.name, name))
                        return s->pools[i];
        return NULL;
}
