/* SPDX-License-Identifier: MIT */
/* fake-pool.h — a pool that decides later, for the engine's tests: submit() and restore() only record, and
 * the answers go out on run() or when the test says (as a remote pool's replies arrive between engine
 * calls). It grants while it has room, queues what may wait, refuses the rest busy, in arrival order; the
 * test can make it refuse, measure waits on its own clock, lose grants and keep a wakeup due. A part of an
 * all-or-nothing set (PoolTry.gated) is decided at once (or on the answer: fake_pool_defer_sets()): queued
 * (ready with room), or refused; then said READY at the head with room, granted by grant_waiter() only, and
 * it holds back those behind it. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "pool.h"

typedef struct FakePool FakePool;

#define FAKE_POOLS_MAX 8
#define FAKE_RUNS_MAX 64

/* What a factory made, by name: the test's handle on each pool. */
typedef struct FakePoolSet {
        FakePool *pools[FAKE_POOLS_MAX];
        size_t n_pools;
} FakePoolSet;

/* An EnginePoolFactoryFn; userdata is a FakePoolSet. */
int fake_pool_factory(const PoolConfig *pc, const char *name, PoolEmitFn emit, void *emit_userdata, void *userdata,
                      Pool **ret);
FakePool *fake_pool_set_find(const FakePoolSet *s, const char *name);

/* Sends every answer due: pending tries decided, waiters granted while there is room. run() does it too. */
void fake_pool_answer(FakePool *p, usec_t now);
/* From now on tries are refused (reason: the pool's word for unavailable, or NULL); _REFUSAL_INVALID: not. */
void fake_pool_refuse(FakePool *p, Refusal refusal, const char *reason);
/* Waiters that cannot be granted at the next answer are refused so. */
void fake_pool_refuse_waiters(FakePool *p, Refusal refusal);
/* Decisions carry this wait, as measured on the pool's own clock; USEC_INFINITY: none (has_wait false). */
void fake_pool_measure_wait(FakePool *p, usec_t wait);
/* GRANTED decisions carry the backend's name of the lease: PREFIX:TOKEN. */
void fake_pool_name_grants(FakePool *p, const char *prefix);
/* The grant with this token is lost: a LOST decision for the lease it was bound to. Returns false if no grant
 * with that token is bound. */
bool fake_pool_lose(FakePool *p, uint64_t token, const char *reason, usec_t at);
/* A set's parts (PoolTry.gated) are decided, and grant_waiter() grants, on the next answer, as a backend's
 * pool answers them later; not at once. */
void fake_pool_defer_sets(FakePool *p, bool defer);
/* run() sends no answers (the backend is slow): only fake_pool_answer() does. */
void fake_pool_hold_answers(FakePool *p, bool hold);
/* next_wakeup() reports t; sticky: even after run() (an answer that has not come yet). */
void fake_pool_set_wakeup(FakePool *p, usec_t t, bool sticky);

typedef struct FakePoolStats {
        size_t pending;           /* tries not answered */
        size_t waiting;
        unsigned in_use;
        size_t withdrawn, released, cancelled;
        void *last_cancelled;     /* the cookie of the last cancel_try() */
        usec_t runs[FAKE_RUNS_MAX]; /* the instants run() was called with, in order */
        size_t n_runs;
        const char *restored_remote_id; /* as the last restore() got it */
        size_t set_calls;         /* submit_set() and grant_set() calls with this pool first */
} FakePoolStats;

const FakePoolStats *fake_pool_stats(const FakePool *p);
