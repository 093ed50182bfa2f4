/* SPDX-License-Identifier: MIT */
/* shared-reply.c — the scripts' words and decisions, checked for type and size (shared-reply.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "macro.h"
#include "shared-reply.h"
#include "strv.h"

SharedDecision shared_decision_init(unsigned max_items) {
        return (SharedDecision) { .budget = USEC_INFINITY, .max_items = max_items };
}

void shared_decision_done(SharedDecision *d) {
        d->slots = mfree(d->slots);
        d->members = strv_free(d->members);
        d->n_slots = d->n_members = 0;
}

/* The pool's own words for a refusal's reason (engine.h, EngineEvent.reason) as static strings; anything
 * else is none. */
static const char *static_reason(const char *s, size_t len) {
        static const char *const known[] = { "drained", "recovery", "backend", "rules", "node-expired", "cooldown",
                                             "not-quarantined", "member-drained" };
        for (size_t i = 0; i < ELEMENTSOF(known); i++)
                if (strlen(known[i]) == len && memcmp(known[i], s, len) == 0)
                        return known[i];
        return NULL;
}

bool shared_rid_is_valid(const char *s, size_t len) {
        if (len != SHARED_RID_LEN)
                return false;
        for (size_t i = 0; i < len; i++)
                if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
                        return false;
        return true;
}

bool shared_stream_id_is_valid(const char *s, size_t len) {
        size_t ms = 0, seq = 0, i = 0;
        for (; i < len && s[i] >= '0' && s[i] <= '9'; i++)
                ms++;
        if (ms == 0 || ms > 20 || i == len || s[i++] != '-')
                return false;
        for (; i < len && s[i] >= '0' && s[i] <= '9'; i++)
                seq++;
        return seq > 0 && seq <= 20 && i == len;
}

bool shared_index_parse(const char *s, size_t len, unsigned max, unsigned *ret) {
        if (len == 0 || len > 10)
                return false;
        uint64_t x = 0;
        for (size_t i = 0; i < len; i++) {
                if (s[i] < '0' || s[i] > '9')
                        return false;
                x = x * 10 + (uint64_t) (s[i] - '0');
        }
        if (x >= max)
                return false;
        *ret = (unsigned) x;
        return true;
}

/* A list of slots or members: an array in a reply, "a,b,c" in a stream entry. Each item is handed to
 * add(); no more than d->max_items of them (-EBADMSG), counted before anything is allocated. */
typedef int (*ItemFn)(SharedDecision *d, size_t i, const char *s, size_t len, int64_t integer, bool is_integer);

static int list_parse(SharedDecision *d, const RespValue *v, size_t *ret_n, ItemFn begin_fn, ItemFn add) {
        size_t n = 0;
        if (v && v->type == RESP_ARRAY)
                n = v->n;
        else if (v && v->type == RESP_STRING && v->len > 0) {
                n = 1;
                for (size_t i = 0; i < v->len && n <= d->max_items; i++)
                        n += v->str[i] == ',';
        } else if (v && !(v->type == RESP_STRING || v->type == RESP_NIL))
                return -EBADMSG;
        if (n > d->max_items)
                return -EBADMSG;
        int r = begin_fn(d, n, NULL, 0, 0, false);
        if (r < 0)
                return r;
        if (v && v->type == RESP_ARRAY) {
                for (size_t i = 0; i < n; i++) {
                        const RespValue *e = &v->elements[i];
                        if (e->type == RESP_INTEGER)
                                r = add(d, i, NULL, 0, e->integer, true);
                        else if (e->type == RESP_STRING)
                                r = add(d, i, e->str, e->len, 0, false);
                        else
                                r = -EBADMSG;
                        if (r < 0)
                                return r;
                }
        } else if (n > 0) {
                const char *s = v->str, *end = v->str + v->len;
                for (size_t i = 0; i < n; i++) {
                        const char *comma = memchr(s, ',', (size_t) (end - s));
                        const char *stop = comma ?: end;
                        if ((r = add(d, i, s, (size_t) (stop - s), 0, false)) < 0)
                                return r;
                        s = stop + 1;
                }
        }
        *ret_n = n;
        return 0;
}

static int slots_begin(SharedDecision *d, size_t n, const char *s, size_t len, int64_t integer, bool is_integer) {
        free(d->slots); /* a field given twice: the last wins */
        d->n_slots = 0;
        d->slots = calloc(MAX(n, (size_t) 1), sizeof(unsigned));
        return d->slots ? 0 : -ENOMEM;
}

static int slots_add(SharedDecision *d, size_t i, const char *s, size_t len, int64_t integer, bool is_integer) {
        /* An index must be below the pool's limit: the lease table and the status index by it. */
        if (is_integer) {
                if (integer < 0 || (uint64_t) integer >= d->max_items)
                        return -EBADMSG;
                d->slots[i] = (unsigned) integer;
        } else if (!shared_index_parse(s, len, d->max_items, &d->slots[i]))
                return -EBADMSG;
        d->n_slots = (unsigned) i + 1;
        return 0;
}

static int members_begin(SharedDecision *d, size_t n, const char *s, size_t len, int64_t integer, bool is_integer) {
        strv_free(d->members);
        d->n_members = 0;
        d->members = n > 0 ? calloc(n + 1, sizeof(char *)) : NULL;
        return n == 0 || d->members ? 0 : -ENOMEM;
}

static int members_add(SharedDecision *d, size_t i, const char *s, size_t len, int64_t integer, bool is_integer) {
        if (is_integer || len == 0 || len > SHARED_TEXT_LEN_MAX || memchr(s, 0, len))
                return -EBADMSG;
        if (!(d->members[i] = strndup(s, len)))
                return -ENOMEM;
        d->n_members = (unsigned) i + 1;
        return 0;
}

/* One named field of a decision, from its text (a stream entry) or its RESP value (a reply). Types and
 * sizes are checked here; what the values mean for this pool, by decision_check(). */
/* The SharedDecision's fields in README order (also the stream's field names). */
typedef enum DecisionField {
        FIELD_VERDICT, FIELD_RID, FIELD_AT, FIELD_WAIT, FIELD_REFUSAL, FIELD_REASON, FIELD_STATE, FIELD_IDLE,
        FIELD_BUDGET, FIELD_POSITION, FIELD_QUEUED, FIELD_TOKEN, FIELD_SLOTS, FIELD_MEMBERS, FIELD_RETRY_AT,
        _FIELD_MAX,
} DecisionField;

static const char *const decision_fields[_FIELD_MAX] = {
        "verdict", "rid", "at", "wait", "refusal", "reason", "state", "idle", "budget", "position", "queued",
        "token", "slots", "members", "retry_at",
};

_Static_assert(_FIELD_MAX == SHARED_DECISION_FIELDS, "the README's fields");

/* Field f from its RESP value. By position, not by name: a reply's decisions are arrays, and the chain of
 * names compared for each of their fields was ~2 % of a shared brokerd's CPU (issue 21). */
static int decision_set_field(SharedDecision *d, DecisionField f, const RespValue *v) {
        int64_t x = 0;
        switch (f) {
        case FIELD_VERDICT:
        case FIELD_RID: {
                if (!v || v->type != RESP_STRING)
                        return -EBADMSG;
                bool rid = f == FIELD_RID;
                if (rid ? !shared_rid_is_valid(v->str, v->len) : v->len > sizeof d->verdict - 1 || memchr(v->str, 0, v->len))
                        return -EBADMSG;
                char *dst = rid ? d->rid : d->verdict;
                memcpy(dst, v->str, v->len);
                dst[v->len] = 0;
                return 0;
        }
        case FIELD_REFUSAL:
                d->refusal = REFUSAL_BUSY;
                d->has_refusal = false;
                for (int i = 0; i < _REFUSAL_MAX; i++)
                        if (resp_is(v, refusal_to_string(i))) {
                                d->refusal = i;
                                d->has_refusal = true;
                        }
                return 0;
        case FIELD_REASON:
                d->reason = v && v->type == RESP_STRING ? static_reason(v->str, v->len) : NULL;
                d->reason_empty = v && v->type == RESP_STRING && v->len == 0;
                /* A drain's refusal has no word of the pool's (engine.h, EngineEvent.reason), as pool-local.c's
                 * has none: the session says "drained" of both. */
                if (d->reason && streq(d->reason, "drained"))
                        d->reason = NULL;
                return 0;
        case FIELD_STATE:
                d->state = resp_is(v, "saturated") ? QUEUE_STATE_SATURATED :
                           resp_is(v, "keeping-up") ? QUEUE_STATE_KEEPING_UP : QUEUE_STATE_NONE;
                return 0;
        case FIELD_SLOTS: {
                size_t n;
                return list_parse(d, v, &n, slots_begin, slots_add);
        }
        case FIELD_MEMBERS: {
                size_t n;
                return list_parse(d, v, &n, members_begin, members_add);
        }
        default:
                break;
        }
        if (!resp_int(v, &x))
                return -EBADMSG;
        switch (f) {
        case FIELD_AT:
                d->at = x;
                break;
        case FIELD_WAIT:
                d->wait = x;
                break;
        case FIELD_IDLE:
                d->idle = x < 0 ? 0 : (usec_t) x;
                break;
        case FIELD_BUDGET:
                d->budget = x < 0 ? USEC_INFINITY : (usec_t) x;
                break;
        case FIELD_POSITION:
                d->position = (size_t) MAX(x, (int64_t) 0);
                break;
        case FIELD_QUEUED:
                d->queued = (size_t) MAX(x, (int64_t) 0);
                break;
        case FIELD_TOKEN:
                if (x < 0)
                        return -EBADMSG;
                d->token = (uint64_t) x;
                break;
        case FIELD_RETRY_AT:
                d->retry_at = x < 0 ? 0 : x;
                break;
        default:
                break;
        }
        return 0;
}

int shared_decision_set(SharedDecision *d, const char *name, const RespValue *v) {
        for (size_t f = 0; f < _FIELD_MAX; f++)
                if (streq(name, decision_fields[f]))
                        return decision_set_field(d, f, v);
        return 0;
}

const char *shared_decision_reason(const SharedDecision *d) {
        if (d->reason)
                return d->reason;
        return d->has_refusal && d->refusal == REFUSAL_UNAVAILABLE && d->reason_empty ? "reload" : NULL;
}

int shared_decision_from_array(const RespValue *v, unsigned max_items, SharedDecision *ret) {
        *ret = shared_decision_init(max_items);
        /* 14 fields; a busy "cooldown" refusal has the 15th (submit's reply and outcome record only). */
        if (!v || v->type != RESP_ARRAY || (v->n != ELEMENTSOF(decision_fields) && v->n != ELEMENTSOF(decision_fields) - 1))
                return -EBADMSG;
        for (size_t i = 0; i < v->n; i++) {
                int r = decision_set_field(ret, i, &v->elements[i]);
                if (r < 0) {
                        shared_decision_done(ret);
                        return r;
                }
        }
        return 0;
}
