/* SPDX-License-Identifier: MIT */
/* shared-reply.h — what the scripts answer, read as untrusted input (SPEC §11): the words of their contract
 * (request ids, stream ids, indexes, spans) and a decision's fields, checked here for type and size; what a
 * decision means for a pool, pool-shared.c checks. brokerd/lua/README is the contract. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "resp.h"
#include "time-util.h"

/* A request id: 16 lowercase hex digits (README, "Conventions"). */
#define SHARED_RID_LEN 16
/* The longest text kept from a reply (a member, a node's name, a lane). */
#define SHARED_TEXT_LEN_MAX 255
/* A decision's fields (README, "Decision"): also the stream entries' field names. */
#define SHARED_DECISION_FIELDS 15

bool shared_rid_is_valid(const char *s, size_t len);
/* A stream entry id, "MS-SEQ" in decimal: it goes back to Redis as XREAD's argument. */
bool shared_stream_id_is_valid(const char *s, size_t len);
/* A decimal below max, strictly (no sign, no space, no garbage). */
bool shared_index_parse(const char *s, size_t len, unsigned max, unsigned *ret);
/* A span as the scripts' arguments and rules say it: µs, -1 for none (USEC_INFINITY). */
static inline int64_t shared_wire_usec(usec_t u) {
        return u == USEC_INFINITY ? -1 : (int64_t) u;
}

/* A decision (README, "Decision") read from a reply's array or a stream entry's fields. */
typedef struct SharedDecision {
        char verdict[16];
        char rid[SHARED_RID_LEN + 1];
        int64_t at, wait;
        Refusal refusal;
        bool has_refusal;      /* a known word, not "" */
        const char *reason;    /* one of the pool's words (static), or NULL */
        bool reason_empty;     /* the reason was "": the pool's default (shared_decision_reason()) */
        int64_t retry_at;      /* busy "cooldown": when enough rests end (pool clock; [15]); 0 none */
        QueueState state;
        usec_t idle, budget;
        size_t position, queued;
        uint64_t token;
        unsigned n_slots;
        unsigned *slots;       /* each below max_items */
        unsigned n_members;
        char **members;
        unsigned max_items;    /* the most slots or members a list may have (the pool's limit) */
} SharedDecision;

/* The reason a refusal is told with (engine.h, EngineEvent.reason): the pool's word; for an unavailable one
 * without a word, "reload", which is what the scripts refuse so (lua/README, Decision [6]: an adopted reload's
 * job refusing a removed lane's waiters, the selectors the new rules can never satisfy, a health lane's waiters
 * when it is no health lane any more), as pool-local.c's local_configure() does, which the session calls
 * "reload"; a drain's refusal has none (the session says "drained"). */
const char *shared_decision_reason(const SharedDecision *d);

/* An empty decision whose lists may hold max_items at most. */
SharedDecision shared_decision_init(unsigned max_items);
/* Frees its lists; the decision stays usable (empty lists). */
void shared_decision_done(SharedDecision *d);
/* One named field from its text (a stream entry) or its RESP value (a reply). A name not of the decision's is
 * ignored; a field given twice, the last wins. Returns 0, -EBADMSG (wrong type, too long, a slot out of
 * range), -ENOMEM. */
int shared_decision_set(SharedDecision *d, const char *name, const RespValue *v);
/* A decision from an array of its fields in README order (the 15th, retry_at, may be left out). On failure
 * (-EBADMSG, -ENOMEM) *ret holds nothing to free. */
int shared_decision_from_array(const RespValue *v, unsigned max_items, SharedDecision *ret);
