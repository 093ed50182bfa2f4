/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "audit.h"
#include "lease-log.h"
#include "lease.h"
#include "log.h"
#include "macro.h"
#include "strv.h"

static usec_t now_of(const LeaseTable *t, clockid_t clock) {
        return t->now ? t->now(clock) : clock == CLOCK_REALTIME ? now_realtime() : now_monotonic();
}

/* Monotonic µs → realtime µs, for timestamps clients see. */
static usec_t realtime_of(const LeaseTable *t, usec_t monotonic) {
        usec_t now_m = now_of(t, CLOCK_MONOTONIC), now_r = now_of(t, CLOCK_REALTIME);
        return monotonic <= now_m ? usec_sub_unsigned(now_r, now_m - monotonic) : now_r + (monotonic - now_m);
}

void lease_table_init(LeaseTable *t, sd_event *event, Engine *engine, Audit *audit) {
        *t = (LeaseTable) { .event = event, .engine = engine, .audit = audit, .events = RING_INIT(LeaseEvent) };
        list_init(&t->leases);
}

void lease_table_done(LeaseTable *t) {
        ListNode *n;
        while ((n = list_first(&t->leases)))
                lease_free(container_of(n, Lease, node));
        ring_done(&t->events);
        t->persisting = mfree(t->persisting);
        t->n_persisting = t->persisting_allocated = 0;
}

Lease *lease_table_find(LeaseTable *t, const char *id) {
        list_foreach(n, &t->leases) {
                Lease *l = container_of(n, Lease, node);
                if (streq(l->id, id))
                        return l;
        }
        return NULL;
}

static void lease_table_push_event(LeaseTable *t, const LeaseEvent *ev) {
        /* lease_new() made room for every event a lease can push: its grant's PERSISTED and one CUT (a
         * lease is revoked once). Reached only past that count: a lost PERSISTED's waiter is answered when
         * it goes. */
        if (ring_push(&t->events, ev) < 0)
                log_oom();
}

bool lease_table_pop_event(LeaseTable *t, LeaseEvent *ret) {
        while (ring_pop(&t->events, ret))
                if (ret->lease)
                        return true; /* else its lease was freed after it was queued */
        return false;
}

/* A freed lease's queued events stay in the ring, emptied: no event names freed memory. */
static void lease_table_drop_events(LeaseTable *t, const Lease *l) {
        for (size_t i = 0; i < t->events.n; i++) {
                LeaseEvent *e = ring_at(&t->events, i);
                if (e->lease == l)
                        e->lease = NULL;
        }
}

static const char *const lease_state_table[_LEASE_STATE_MAX] = {
        [LEASE_HELD] = "held",
        [LEASE_REVOKED] = "revoked",
        [LEASE_OVERDUE] = "overdue",
        [LEASE_RESTORED] = "restored",
};

DEFINE_STRING_TABLE_TO_STRING(, lease_state, LeaseState, _LEASE_STATE_MAX)

bool lease_command_running(const Lease *l) {
        return l->has_command && !l->command_gone;
}

AuditRecord lease_audit_record(const Lease *l, const char *decision) {
        AuditRecord r = AUDIT_RECORD_INIT;
        r.decision = decision;
        r.pool = engine_lease_pool(l->engine_lease);
        r.lane = engine_lease_lane(l->engine_lease);
        r.job = l->job;
        r.lease = l->id;
        r.token = engine_lease_token(l->engine_lease);
        r.uid = l->uid;
        r.pid = l->pid;
        return r;
}

const char *lease_also_text(const Lease *l, char *buf, size_t size) {
        size_t n = engine_lease_also_count(l->engine_lease), used = 0;
        if (n == 0 || size == 0)
                return NULL;
        buf[0] = 0;
        for (size_t i = 0; i < n; i++) {
                EngineLeaseAlso a;
                if (engine_lease_also(l->engine_lease, i, &a) < 0)
                        continue;
                int k = snprintf(buf + used, size - used, "%s%s:%" PRIu64, used > 0 ? " " : "", a.pool, a.token);
                if (k < 0 || (size_t) k >= size - used)
                        break; /* cut at a whole pool: the history rows have them all */
                used += (size_t) k;
        }
        buf[used] = 0;
        return buf;
}

/* "rig-a,rig-c": the named members of n slots; NULL when none is named. */
static const char *members_text(const char *const *members, unsigned n, char *buf, size_t size) {
        size_t used = 0;
        if (n == 0 || !members || size == 0)
                return NULL;
        buf[0] = 0;
        for (unsigned i = 0; i < n; i++) {
                if (!members[i])
                        continue;
                int k = snprintf(buf + used, size - used, "%s%s", used > 0 ? "," : "", members[i]);
                if (k < 0 || (size_t) k >= size - used)
                        break;
                used += (size_t) k;
        }
        buf[used] = 0;
        return used > 0 ? buf : NULL;
}

const char *lease_members_text(const Lease *l, char *buf, size_t size) {
        const unsigned *indices;
        const char *const *members;
        unsigned n = l->engine_lease ? engine_lease_slots(l->engine_lease, &indices, &members) : 0;
        return members_text(members, n, buf, size);
}

void lease_audit_shares(const Lease *l, const AuditRecord *r) {
        size_t n = engine_lease_also_count(l->engine_lease);
        for (size_t i = 0; i < n && l->table->audit; i++) {
                EngineLeaseAlso a;
                if (engine_lease_also(l->engine_lease, i, &a) < 0)
                        continue;
                AuditRecord s = *r;
                s.pool = a.pool;
                s.token = a.token;
                s.selector = NULL; /* labels and a member choose in the lease's own pool only */
                if (s.slots > 0)
                        s.slots = a.n_slots; /* a grant's row: what the set took of this pool */
                /* The members it holds there: the report's use per member counts them as a lease of that pool's
                 * alone (SPEC §3.6, usage per member). */
                char members[LEASE_ALSO_TEXT_MAX];
                s.member = members_text(a.members, a.n_slots, members, sizeof members);
                s.also = NULL;
                audit_decision_share(l->table->audit, &s);
        }
}

/* A lease-level decision (released, revoked, overdue, restored), with its hold so far: a row for each pool of
 * an all-or-nothing lease. */
static void lease_audit(const Lease *l, const char *decision, const char *reason) {
        AuditRecord r = lease_audit_record(l, decision);
        char also[LEASE_ALSO_TEXT_MAX];
        r.hold = usec_sub_unsigned(now_of(l->table, CLOCK_MONOTONIC), l->granted_mono);
        r.reason = reason;
        r.also = lease_also_text(l, also, sizeof also);
        char members[LEASE_ALSO_TEXT_MAX];
        r.member = lease_members_text(l, members, sizeof members);
        /* What the command's exit told at its Release (SPEC §3.6): the report's failures per member. */
        if (l->engine_lease)
                r.exit_status = engine_lease_get_exit_status(l->engine_lease);
        if (l->table->audit) {
                audit_decision(l->table->audit, &r);
                lease_audit_shares(l, &r);
        }
}

void lease_free(Lease *l) {
        if (!l)
                return;
        LeaseTable *t = l->table;
        if (l->persist_pending)
                for (size_t i = 0; i < t->n_persisting; i++)
                        if (t->persisting[i] == l)
                                t->persisting[i] = NULL;
        lease_table_drop_events(t, l);
        if (list_node_is_linked(&l->node)) {
                list_unlink(&l->node);
                t->n_leases--;
        }
        sd_event_source_disable_unref(l->command_source);
        sd_event_source_disable_unref(l->grace_timer);
        sd_event_source_disable_unref(l->fence_timer);
        safe_close(l->command_pidfd);
        free(l->job);
        free(l->grant.selector);
        free(l);
}

/* The slots of a lease just released that rest now (cooldown=, SPEC §3.6), written to the log: a restart keeps
 * them resting. A member is matched by name (a reload may have moved it), an anonymous slot by index. */
static void lease_log_rests(LeaseTable *t, const char *pool, const unsigned *slots, char **members, unsigned n) {
        for (size_t i = 0; i < engine_pool_count(t->engine); i++) {
                EnginePoolInfo info;
                if (engine_pool_info(t->engine, i, now_of(t, CLOCK_MONOTONIC), &info) < 0 || !streq(info.name, pool))
                        continue;
                for (size_t k = 0; k < info.n_resting; k++) {
                        const PoolRest *rs = &info.resting[k];
                        for (unsigned j = 0; j < n; j++)
                                if (members && members[j] ? streq_ptr(rs->member, members[j])
                                                          : !rs->member && rs->index == slots[j])
                                        (void) lease_log_rest(t->log, pool, rs->index, rs->member,
                                                              realtime_of(t, rs->until));
                }
                return;
        }
}

void lease_table_log_use(LeaseTable *t, const char *pool, const char *member) {
        EngineMemberUse u;
        if (!t->log || !pool || !member)
                return;
        /* By name: O(log members) in a local pool (a walk of every pool's info and its members took ~100 µs a
         * grant at 20,000 members). A shared pool's too, this node's own counts (Redis keeps the quarantines
         * and the failures in a row), by a walk of its members. */
        if (engine_member_get_use(t->engine, pool, member, &u) < 0)
                return;
        /* Lost to -ENOMEM: the next change of the member writes it whole. */
        (void) lease_log_use(t->log, &(LeaseLogUse) { .pool = (char *) pool, .member = (char *) member,
                                                      .grants = u.grants, .held = u.held,
                                                      .quarantines = u.quarantines, .failures = u.failures });
}

/* The members a lease holds, in every pool of it, as "pool", "member" pairs (copies: a pool removed by reload
 * goes with its last lease); NULL when it holds none (anonymous slots) or out of memory. */
static char **lease_member_refs(const Lease *l) {
        size_t n_also = engine_lease_also_count(l->engine_lease), n = 0, k = 0;
        const unsigned *idx;
        const char *const *names;
        unsigned own = engine_lease_slots(l->engine_lease, &idx, &names);
        n += names ? own : 0;
        for (size_t i = 0; i < n_also; i++) {
                EngineLeaseAlso a;
                if (engine_lease_also(l->engine_lease, i, &a) >= 0 && a.members)
                        n += a.n_slots;
        }
        if (n == 0)
                return NULL;
        char **refs = calloc(2 * n + 1, sizeof(char *));
        if (!refs)
                return NULL;
        bool oom = false;
        for (unsigned j = 0; names && j < own; j++)
                if (names[j]) {
                        oom = oom || !(refs[k++] = strdup(engine_lease_pool(l->engine_lease)));
                        oom = oom || !(refs[k++] = strdup(names[j]));
                }
        for (size_t i = 0; i < n_also; i++) {
                EngineLeaseAlso a;
                if (engine_lease_also(l->engine_lease, i, &a) < 0 || !a.members)
                        continue;
                for (unsigned j = 0; j < a.n_slots; j++)
                        if (a.members[j]) {
                                oom = oom || !(refs[k++] = strdup(a.pool));
                                oom = oom || !(refs[k++] = strdup(a.members[j]));
                        }
        }
        if (oom)
                return strv_free(refs);
        return refs;
}

static void lease_log_uses_of(LeaseTable *t, char **refs) {
        for (size_t i = 0; refs && refs[i] && refs[i + 1]; i += 2)
                lease_table_log_use(t, refs[i], refs[i + 1]);
}

/* One pool's slots of a lease being released, copied for the rests the release makes (the engine forgets the
 * lease, and a pool kept for it alone goes with it). */
typedef struct RestCopy {
        char *pool;
        unsigned *slots;
        char **members; /* an entry NULL on -ENOMEM: matched by index */
        unsigned n;
} RestCopy;

static bool pool_cools(LeaseTable *t, const char *pool) {
        for (size_t i = 0; i < engine_pool_count(t->engine); i++) {
                EnginePoolInfo info;
                /* A shared pool's rests are Redis's (every node's, across restarts): nothing to log here. */
                if (engine_pool_info(t->engine, i, now_of(t, CLOCK_MONOTONIC), &info) >= 0 && streq(info.name, pool))
                        return info.cooldown > 0 && !info.remote;
        }
        return false;
}

static void rest_copy(LeaseTable *t, RestCopy *c, const char *pool, const unsigned *slots, const char *const *names,
                      unsigned n) {
        if (n == 0 || !pool_cools(t, pool) || !(c->pool = strdup(pool)) || !(c->slots = calloc(n, sizeof(unsigned))))
                return;
        memcpy(c->slots, slots, n * sizeof(unsigned));
        if (names && (c->members = calloc(n, sizeof(char *))))
                for (unsigned j = 0; j < n; j++)
                        c->members[j] = names[j] ? strdup(names[j]) : NULL;
        c->n = n;
}

static void rest_copy_log_done(LeaseTable *t, RestCopy *c) {
        if (c->n > 0)
                lease_log_rests(t, c->pool, c->slots, c->members, c->n);
        for (unsigned j = 0; c->members && j < c->n; j++)
                free(c->members[j]);
        free(c->members);
        free(c->slots);
        free(c->pool);
}

void lease_discard(Lease *l) {
        LeaseTable *t = l->table;
        assert(!l->holder); /* its session unlinked it first */
        if (t->log)
                (void) lease_log_end(t->log, l->id); /* lost to -ENOMEM: the lease ends again after a restart */
        /* What the release will rest in each of its pools with cooldown=: copied first. */
        size_t n_also = engine_lease_also_count(l->engine_lease);
        _cleanup_free_ RestCopy *rests = t->log ? calloc(n_also + 1, sizeof(RestCopy)) : NULL;
        if (rests) {
                const unsigned *idx;
                const char *const *names;
                unsigned n = engine_lease_slots(l->engine_lease, &idx, &names);
                rest_copy(t, &rests[0], engine_lease_pool(l->engine_lease), idx, names, n);
                for (size_t i = 0; i < n_also; i++) {
                        EngineLeaseAlso a;
                        if (engine_lease_also(l->engine_lease, i, &a) >= 0)
                                rest_copy(t, &rests[i + 1], a.pool, a.slots, a.members, a.n_slots);
                }
        }
        /* Its members' counts change with the release (held, and an exit status's failures or quarantine). */
        char **refs = t->log ? lease_member_refs(l) : NULL;
        engine_lease_release(l->engine_lease, now_of(t, CLOCK_MONOTONIC));
        lease_log_uses_of(t, refs);
        strv_free(refs);
        for (size_t i = 0; rests && i <= n_also; i++)
                rest_copy_log_done(t, &rests[i]);
        t->changed = true;
        lease_free(l);
}

void lease_end(Lease *l) {
        /* A revocation was recorded when it happened; the end is the slots' release, recorded once, with
         * the whole hold (the hold histogram counts each lease once). */
        const char *reason = l->state != LEASE_HELD ? "after its revocation" : l->released_by[0] ? l->released_by : NULL;
        lease_audit(l, "released", reason);
        lease_discard(l);
}

static void lease_persisted(Lease *l, int result) {
        void *waiter = TAKE_PTR(l->persist_waiter);
        lease_table_push_event(l->table, &(LeaseEvent) {
                .type = LEASE_EVENT_PERSISTED,
                .lease = l,
                .waiter = waiter,
                .result = result,
        });
}

void lease_persist_forget(Lease *l) {
        l->persist_waiter = NULL;
}

/* Realtime µs of the lease's expiry (USEC_INFINITY: none), through the offset fixed when the lease was made
 * rather than a fresh reading of both clocks: for a grant, expiresAt − grantedAt is then exactly the hold. */
static usec_t lease_expires_realtime(const Lease *l) {
        usec_t exp = engine_lease_expires_at(l->engine_lease);
        if (exp == USEC_INFINITY)
                return USEC_INFINITY;
        return (usec_t) ((int64_t) exp + l->realtime_offset);
}

/* The lease's row, borrowing its strings and arrays. */
static HistoryLeaseBackend lease_backend(const Lease *l) {
        HistoryLeaseBackend b = {};
        const LeaseTable *t = l->table;
        if (engine_lease_is_shared(l->engine_lease) && t->backend_of &&
            !t->backend_of(engine_lease_pool(l->engine_lease), &b, t->backend_userdata))
                b = (HistoryLeaseBackend) {};
        return b;
}

/* The lease as the lease log keeps it; an all-or-nothing lease's further pools go into also (room for
 * engine_lease_also_count() of them). Borrows every string and array. */
static HistoryLeaseRow lease_row(const Lease *l, HistoryLeaseAlso *also) {
        EngineQuarantineRules q = {};
        (void) engine_lease_quarantine_rules(l->engine_lease, &q);
        const unsigned *idx;
        const char *const *members;
        unsigned n = engine_lease_slots(l->engine_lease, &idx, &members);
        size_t n_also = engine_lease_also_count(l->engine_lease);
        for (size_t i = 0; i < n_also; i++) {
                EngineLeaseAlso a = {};
                (void) engine_lease_also(l->engine_lease, i, &a);
                also[i] = (HistoryLeaseAlso) {
                        .pool = (char *) a.pool,
                        .slots = (unsigned *) a.slots,
                        .n_slots = a.n_slots,
                        .members = (char **) a.members,
                        .token = a.token,
                        .remote_id = (char *) a.remote_id,
                };
        }

        return (HistoryLeaseRow) {
                .id = (char *) l->id,
                .pool = (char *) engine_lease_pool(l->engine_lease),
                .lane = (char *) engine_lease_lane(l->engine_lease),
                .slots = (unsigned *) idx,
                .members = (char **) members,
                .n_slots = n,
                .token = engine_lease_token(l->engine_lease),
                .job = l->job,
                .uid = l->uid,
                .pid = l->pid,
                .command_pid = l->has_command ? l->command.pid : 0,
                .command_start_time = l->has_command ? l->command.start_time : 0,
                .detached = l->detached,
                .granted_at = l->granted_real,
                .expires_at = lease_expires_realtime(l),
                .health_known = true,
                .health = engine_lease_is_health(l->engine_lease),
                .quarantine_exit_codes = { q.exit_codes[0], q.exit_codes[1], q.exit_codes[2], q.exit_codes[3] },
                .quarantine_after = q.after,
                .remote_id = (char *) engine_lease_remote_id(l->engine_lease),
                .backend = lease_backend(l),
                .also = n_also > 0 ? also : NULL,
                .n_also = n_also,
        };
}

static int lease_table_reserve_persisting(LeaseTable *t) {
        if (t->n_persisting < t->persisting_allocated)
                return 0;
        size_t n = MAX(t->persisting_allocated * 2, (size_t) 16);
        Lease **a = reallocarray(t->persisting, n, sizeof(Lease *));
        if (!a)
                return -ENOMEM;
        t->persisting = a;
        t->persisting_allocated = n;
        return 0;
}

void lease_persist(Lease *l, void *waiter) {
        LeaseTable *t = l->table;

        l->persist_waiter = waiter;
        if (!t->log) {
                lease_persisted(l, LEASE_NOT_PERSISTED);
                return;
        }
        /* Once a lease: lease_new() reserved room for one PERSISTED (and one CUT) in the ring, no more. */
        assert(!l->persist_pending);
        HistoryLeaseAlso also[CONF_LANE_ALSO_MAX];
        HistoryLeaseRow row = lease_row(l, also);
        if (lease_table_reserve_persisting(t) < 0 || lease_log_add(t->log, &row) < 0) {
                lease_persisted(l, -ENOMEM);
                return;
        }
        t->persisting[t->n_persisting++] = l;
        l->persist_pending = true;
        /* Its members' grants, in the same write as its row. */
        char **refs = lease_member_refs(l);
        lease_log_uses_of(t, refs);
        strv_free(refs);
}

int lease_table_write_snapshot(LeaseTable *t) {
        _cleanup_free_ HistoryLeaseRow *rows = calloc(MAX(t->n_leases, 1u), sizeof(HistoryLeaseRow));
        _cleanup_free_ HistoryLeaseAlso *also = NULL;
        size_t n = 0, n_also = 0, used = 0;

        if (!t->log)
                return -EBADF;
        if (!rows)
                return -ENOMEM;
        list_foreach(node, &t->leases)
                n_also += engine_lease_also_count(container_of(node, Lease, node)->engine_lease);
        if (n_also > 0 && !(also = calloc(n_also, sizeof(HistoryLeaseAlso))))
                return -ENOMEM;
        list_foreach(node, &t->leases) {
                Lease *l = container_of(node, Lease, node);
                size_t k = engine_lease_also_count(l->engine_lease);
                if (!l->persist_refused)
                        rows[n++] = lease_row(l, also ? also + used : NULL); /* no also= lease: no array */
                used += k;
        }
        return lease_log_rewrite(t->log, rows, n, now_of(t, CLOCK_REALTIME));
}

bool lease_table_flush(LeaseTable *t) {
        if (!t->log || (t->n_persisting == 0 && !lease_log_has_pending(t->log)))
                return false;
        int r = lease_log_flush(t->log);
        size_t n = t->n_persisting;
        t->n_persisting = 0;
        for (size_t i = 0; i < n; i++) {
                Lease *l = t->persisting[i];
                if (!l)
                        continue; /* freed meanwhile */
                l->persist_pending = false;
                l->persist_refused = r < 0;
                lease_persisted(l, r);
        }
        if (r == 0 && lease_log_wants_rewrite(t->log, t->n_leases))
                (void) lease_table_write_snapshot(t); /* a failure leaves the log as it was, longer */
        return n > 0;
}

/* Ends the lease once nobody holds it any more: no connection, no running command. */
static bool lease_maybe_end(Lease *l) {
        if (l->holder || lease_command_running(l) || l->detached)
                return false;
        lease_end(l);
        return true;
}

static void lease_command_check_group(Lease *l) {
        /* slotctl puts the command in a group of its own; then the whole group must be gone (SPEC §3.4): no
         * member of it running (zombies left unreaped by a parent that never reaps, a container's PID 1, run
         * nothing). A command that shares its parent's group is watched by its leader alone. */
        if (l->command.pgid == l->command.pid && process_group_is_alive(l->command.pgid, &l->command_member))
                return;
        l->command_gone = true;
}

static int on_command_exit(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        Lease *l = userdata;

        l->command_leader_exited = true;
        l->command_source = sd_event_source_disable_unref(l->command_source);
        l->command_pidfd = safe_close(l->command_pidfd);
        lease_command_check_group(l);
        if (l->command_gone)
                lease_maybe_end(l);
        return 0;
}

/* A command's end matters once nobody holds its lease (lease_maybe_end()); while a holder does, its pidfd is
 * read when asked (lease_command_refresh(): a release, a revocation, the holder gone). So the pidfd is watched
 * from when the holder goes, not from the grant: the watch cost every `slotctl run` a wakeup of brokerd at
 * its command's exit, just before slotctl's own Release, and two epoll_ctl() calls. */
static void lease_watch_command(Lease *l) {
        if (l->command_source || l->command_pidfd < 0 || l->command_leader_exited)
                return;
        int r = sd_event_add_io(l->table->event, &l->command_source, l->command_pidfd, EPOLLIN, on_command_exit, l);
        if (r < 0)
                log_warning_errno(r, "Lease %s: cannot watch its command (pid %d), polled each second instead: %m",
                                  l->id, (int) l->command.pid);
}

static void lease_poll_command(Lease *l) {
        if (l->command_gone)
                return;
        /* A leader not watched (lease_watch_command() failed) is polled with its group. */
        if (!l->command_leader_exited && (l->command_source || l->holder))
                return;
        lease_command_refresh(l);
        if (l->command_gone)
                lease_maybe_end(l);
}

void lease_table_poll_commands(LeaseTable *t) {
        list_foreach_safe(n, &t->leases)
                lease_poll_command(container_of(n, Lease, node));
}

static void lease_make_id(LeaseTable *t, char id[static LEASE_ID_LEN + 1]) {
        uint8_t bytes[LEASE_ID_LEN / 2];
        t->random_bytes(bytes, sizeof bytes, t->random_userdata);
        /* Not snprintf() per byte: that was 5% of the main thread in bench-pairs. */
        for (size_t i = 0; i < sizeof bytes; i++) {
                id[2 * i] = "0123456789abcdef"[bytes[i] >> 4];
                id[2 * i + 1] = "0123456789abcdef"[bytes[i] & 15];
        }
        id[LEASE_ID_LEN] = 0;
}

int lease_new(LeaseTable *t, EngineLease *el, void *holder, uid_t uid, pid_t pid, const char *job, bool detached,
              const ProcessInfo *command, int command_pidfd, Lease **ret) {
        _cleanup_close_ int pidfd = command_pidfd;

        Lease *l = calloc(1, sizeof(Lease));
        if (!l)
                return -ENOMEM;
        *l = (Lease) {
                .table = t,
                .engine_lease = el,
                .state = LEASE_HELD,
                .uid = uid,
                .pid = pid,
                .detached = detached,
                .command_pidfd = -EBADF,
                .granted_mono = engine_lease_granted_at(el),
        };
        l->granted_real = realtime_of(t, l->granted_mono);
        l->realtime_offset = (int64_t) l->granted_real - (int64_t) l->granted_mono;
        lease_make_id(t, l->id);
        if (job && !(l->job = strdup(job))) {
                free(l);
                return -ENOMEM;
        }
        if (command && pidfd >= 0) {
                l->has_command = true;
                l->command = *command;
                l->command_pidfd = TAKE_FD(pidfd);
        }
        /* Its events cannot be lost to a full memory later (a lost PERSISTED would keep the lease of a
         * holder that went held until max-hold): room for two per lease, freed ones' queued events counted. */
        int r = ring_reserve(&t->events, t->events.n + 2 * ((size_t) t->n_leases + 1));
        if (r < 0) {
                lease_free(l);
                return r;
        }
        if (!detached)
                l->holder = holder;
        if (!l->holder)
                lease_watch_command(l);
        engine_lease_set_userdata(el, l);
        list_append(&t->leases, &l->node);
        t->n_leases++;
        t->changed = true;
        *ret = l;
        return 0;
}

static int on_reclaim_timeout(sd_event_source *s, uint64_t usec, void *userdata) {
        Lease *l = userdata;
        l->grace_timer = sd_event_source_disable_unref(l->grace_timer);
        if (l->state == LEASE_RESTORED && !l->holder) {
                lease_audit(l, "released", "not reclaimed within the reclaim grace");
                lease_discard(l);
        }
        return 0;
}

/* What is left of a lease's max-hold (USEC_INFINITY: none). The wall clock may have been stepped back
 * while brokerd was down: then now_r is before the instants persisted, and expires_at − now_r could be a
 * year. What was left at the last instant brokerd is known to have run is the most that can be left now. */
usec_t lease_row_ended_at(const HistoryLeaseRow *row, usec_t alive_at, usec_t now_r) {
        usec_t end = MAX(alive_at, row->granted_at);
        /* A detached lease ends at its expiry and nothing else while brokerd is down: exact. */
        if (row->expires_at != USEC_INFINITY && (row->detached || row->expires_at < end))
                end = row->expires_at;
        return MIN(MAX(end, row->granted_at), MAX(now_r, row->granted_at));
}

static usec_t restored_hold_left(const HistoryLeaseRow *row, usec_t alive_at, usec_t now_r) {
        if (row->expires_at == USEC_INFINITY)
                return USEC_INFINITY;
        usec_t left = usec_sub_unsigned(row->expires_at, now_r);
        usec_t last_known = MAX(row->granted_at, alive_at);
        return MIN(left, usec_sub_unsigned(row->expires_at, last_known));
}

/* The command of a row: its leader (same pid, same start time, not a zombie), else its process group. The
 * live daemon keeps a lease while the group of a command that leads its own group has a member
 * (lease_command_check_group()), so a restart must too. The group is looked for only when the pid is
 * free or the leader's zombie: the kernel does not reuse a pid while a group of that number exists. */
typedef enum RestoredCommand {
        RESTORED_COMMAND_GONE,
        RESTORED_COMMAND_LEADER,
        RESTORED_COMMAND_GROUP,
} RestoredCommand;

/* ret_member: for a group that runs without its leader, the member found running (the lease's polls try it
 * first, lease_command_check_group()). */
static RestoredCommand restored_command(const HistoryLeaseRow *row, int *ret_pidfd, ProcessInfo *ret_info,
                                        pid_t *ret_member) {
        ProcessInfo info = {};
        _cleanup_close_ int pidfd = process_open(row->command_pid, &info);

        *ret_pidfd = -EBADF;
        bool same = pidfd >= 0 && info.start_time == row->command_start_time;
        if (same && info.state != 'Z') {
                *ret_info = info;
                *ret_pidfd = TAKE_FD(pidfd);
                return RESTORED_COMMAND_LEADER;
        }
        if ((pidfd == -ESRCH || same) && process_group_is_alive(row->command_pid, ret_member)) {
                *ret_info = (ProcessInfo) {
                        .pid = row->command_pid,
                        .pgid = row->command_pid,
                        .uid = row->uid,
                        .start_time = row->command_start_time,
                };
                return RESTORED_COMMAND_GROUP;
        }
        return RESTORED_COMMAND_GONE;
}

int lease_restore(LeaseTable *t, const HistoryLeaseRow *row, usec_t alive_at, Lease **ret) {
        usec_t now_m = now_of(t, CLOCK_MONOTONIC), now_r = now_of(t, CLOCK_REALTIME);
        _cleanup_close_ int pidfd = -EBADF;
        ProcessInfo command = {};
        pid_t member = 0;
        RestoredCommand rc = RESTORED_COMMAND_GONE;
        int r;

        assert_return(strlen(row->id) == LEASE_ID_LEN, -EINVAL);

        /* A command that still runs keeps holding its lease. */
        if (row->command_pid > 0)
                rc = restored_command(row, &pidfd, &command, &member);
        bool command_alive = rc != RESTORED_COMMAND_GONE;
        /* Its command ended during a restart through the fd store: its connection, still open there, may carry
         * the command's exit status in a Release (SPEC §3.6). Held by it until it is taken back, as a live
         * brokerd holds a lease whose command ended until its connection releases or closes. */
        bool awaiting = row->command_pid > 0 && !command_alive && !row->detached && t->holders_handed_over;
        usec_t left = restored_hold_left(row, alive_at, now_r);
        bool expired = left == 0;
        bool ended = (row->command_pid > 0 && !command_alive && !awaiting) || (row->detached && expired);
        if (ended && !row->remote_id) {
                *ret = NULL;
                return 0; /* ended while brokerd was down */
        }

        usec_t granted_mono = row->granted_at <= now_r ? usec_sub_unsigned(now_m, now_r - row->granted_at) : now_m;
        usec_t expires_mono = left == USEC_INFINITY ? USEC_INFINITY : now_m + left;
        /* Where it was granted, if the lease log says (a shared lease): its pool there, made if the new
         * configuration keeps the pool elsewhere or not at all. */
        const HistoryLeaseBackend *bk = &row->backend;
        PoolConfig granted_in = {
                .name = row->pool,
                .limit = 1,
                .max_queue = -1,
                .backend = bk->url,
                .backend_user = bk->user,
                .backend_password_file = bk->password_file,
                .backend_sentinel_password_file = bk->sentinel_password_file,
                .backend_node_ttl = bk->node_ttl,
        };
        EngineQuarantineRules quarantine = { .after = row->quarantine_after };
        memcpy(quarantine.exit_codes, row->quarantine_exit_codes, sizeof quarantine.exit_codes);
        EngineLease *el;
        r = engine_lease_restore(t->engine,
                                 &(EngineLeaseRestore) {
                                         .pool = row->pool,
                                         .lane = row->lane,
                                         .slots = row->slots,
                                         .members = (const char *const *) row->members,
                                         .n_slots = row->n_slots,
                                         .token = row->token,
                                         .granted_at = granted_mono,
                                         .expires_at = expires_mono,
                                         .remote_id = row->remote_id,
                                         .granted_in = row->remote_id && bk->url ? &granted_in : NULL,
                                         .health_known = row->health_known,
                                         .health = row->health,
                                         .quarantine = row->quarantine_after > 0 ? &quarantine : NULL,
                                 },
                                 &el);
        /* An all-or-nothing lease's further pools (SPEC §3.5): held again with it, or the lease is not. */
        for (size_t i = 0; r >= 0 && i < row->n_also; i++) {
                const HistoryLeaseAlso *a = row->also + i;
                r = engine_lease_restore_also(el,
                                              &(EngineLeaseRestore) {
                                                      .pool = a->pool,
                                                      .lane = row->lane,
                                                      .slots = a->slots,
                                                      .members = (const char *const *) a->members,
                                                      .n_slots = a->n_slots,
                                                      .token = a->token,
                                                      .granted_at = granted_mono,
                                                      .expires_at = expires_mono,
                                                      .remote_id = a->remote_id,
                                              });
                if (r < 0)
                        engine_lease_release(el, now_m);
        }
        if (ended) {
                /* A shared lease that ended while brokerd was down: Redis still holds it for this node, and
                 * this node knows it ended. Given back at once (its pool sends the release when it reaches
                 * Redis), not left to the reconcile, which keeps what a node does not list for a node TTL. */
                if (r >= 0)
                        engine_lease_release(el, now_m);
                *ret = NULL;
                return 0;
        }
        if (r < 0)
                return r;

        Lease *l;
        r = lease_new(t, el, NULL, row->uid, row->pid, row->job, row->detached,
                      rc == RESTORED_COMMAND_LEADER ? &command : NULL, TAKE_FD(pidfd), &l);
        if (r < 0) {
                engine_lease_release(el, now_m);
                return r;
        }
        if (rc == RESTORED_COMMAND_GROUP) {
                /* The leader is gone: the tick polls its group, as for a leader that exited under us. */
                l->has_command = true;
                l->command = command;
                l->command_leader_exited = true;
                l->command_member = member;
        }
        memcpy(l->id, row->id, LEASE_ID_LEN + 1);
        l->granted_real = row->granted_at;
        /* Today's offset, not the row's: the wall clock may have been stepped while brokerd was down. */
        l->realtime_offset = (int64_t) now_r - (int64_t) now_m;
        if (!command_alive && !row->detached) {
                /* Held only by a connection that died with the old brokerd: its owner may come back for it. */
                l->state = LEASE_RESTORED;
                l->awaiting_handover = awaiting;
                r = sd_event_add_time_relative(t->event, &l->grace_timer, CLOCK_MONOTONIC, t->reclaim_grace, 0,
                                               on_reclaim_timeout, l);
                if (r < 0) {
                        lease_discard(l);
                        return r;
                }
        }
        lease_audit(l, "restored",
                    rc == RESTORED_COMMAND_LEADER  ? "its command still runs"
                    : rc == RESTORED_COMMAND_GROUP ? "its command's process group still runs"
                    : row->detached                ? "detached"
                    : awaiting                     ? "its command ended; awaiting its connection's release"
                                                   : "awaiting reclaim");
        *ret = l;
        return 0;
}

void lease_table_end_not_taken_back(LeaseTable *t) {
        t->holders_handed_over = false;
        list_foreach_safe(n, &t->leases) {
                Lease *l = container_of(n, Lease, node);
                if (!l->awaiting_handover)
                        continue;
                l->awaiting_handover = false;
                if (l->state == LEASE_RESTORED && !l->holder) {
                        lease_audit(l, "released", "it ended while brokerd was down");
                        lease_discard(l);
                }
        }
}

int lease_reclaim(Lease *l, void *holder) {
        if (l->holder || l->detached || (l->state != LEASE_RESTORED && l->state != LEASE_HELD))
                return -EBUSY;
        l->grace_timer = sd_event_source_disable_unref(l->grace_timer);
        l->state = LEASE_HELD;
        l->holder = holder;
        l->table->changed = true;
        return 0;
}

void *lease_get_holder(const Lease *l) {
        return l->holder;
}

void lease_clear_holder(Lease *l) {
        l->holder = NULL;
        lease_watch_command(l);
}

/* The command's state as of now, not as of the last event: slotctl closes its connection right after its
 * command's group is gone, often before brokerd has read the pidfd's wakeup or polled the group. */
void lease_command_refresh(Lease *l) {
        if (!l->has_command || l->command_gone)
                return;
        if (!l->command_leader_exited) {
                if (l->command_pidfd < 0 || !pidfd_has_exited(l->command_pidfd))
                        return;
                l->command_leader_exited = true;
                l->command_source = sd_event_source_disable_unref(l->command_source);
                l->command_pidfd = safe_close(l->command_pidfd);
        }
        lease_command_check_group(l);
}

/* ---- brokerd's own fence of a lost lease's command (SPEC §11) ---- */

static void lease_fence_signal(Lease *l, int sig) {
        int r = process_command_signal(l->command_pidfd, &l->command, sig);
        if (r == -ESRCH)
                return; /* gone already: its pidfd or the group poll ends the lease */
        /* SIGKILL goes again each second while something runs: said once (SIGTERM, then SIGKILL). */
        if (++l->fence_signals > 2 || (sig == SIGKILL && l->fence_signals > 1 && !l->fence_termed))
                return;
        if (r < 0)
                log_error_errno(r, "Lease %s of pool %s was lost: could not send %s to its command (pid %d)%s: %m",
                                l->id, engine_lease_pool(l->engine_lease), sig == SIGKILL ? "SIGKILL" : "SIGTERM",
                                (int) l->command.pid,
                                r == -EPERM ? " — brokerd needs CAP_KILL for other users' commands (brokerd(8))" : "");
        else
                log_warning("Lease %s of pool %s was lost and nobody else stops its command: sent %s to pid %d%s.",
                            l->id, engine_lease_pool(l->engine_lease), sig == SIGKILL ? "SIGKILL" : "SIGTERM",
                            (int) l->command.pid, l->command.pgid == l->command.pid ? " and its process group" : "");
}

static int on_fence_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        Lease *l = userdata;
        lease_command_refresh(l);
        if (!lease_command_running(l)) {
                l->fence_timer = sd_event_source_disable_unref(l->fence_timer);
                (void) lease_maybe_end(l); /* unless a holder still holds it by its connection */
                return 0;
        }
        lease_fence_signal(l, SIGKILL);
        /* Again each second while something of it runs: a child forked as the signal went. */
        (void) sd_event_source_set_time(s, usec_add(usec, USEC_PER_SEC));
        return 0;
}

/* SIGTERM now (term) and SIGKILL after revoke-grace, unless armed already. */
static void lease_fence_command(Lease *l, bool term) {
        if (term && !l->fence_termed) {
                l->fence_termed = true;
                lease_fence_signal(l, SIGTERM);
        }
        if (l->fence_timer)
                return;
        int r = sd_event_add_time_relative(l->table->event, &l->fence_timer, CLOCK_MONOTONIC, l->table->revoke_grace,
                                           0, on_fence_timer, l);
        if (r < 0) {
                log_error_errno(r, "Lease %s: no timer to stop its command after revoke-grace, sending SIGKILL now: %m",
                                l->id);
                lease_fence_signal(l, SIGKILL);
                return;
        }
        (void) sd_event_source_set_enabled(l->fence_timer, SD_EVENT_ON);
}

/* Revoked, and nobody is left to tell: the command's end is what frees the slots, or they free now. A lost
 * lease's command is brokerd's to stop; another stays overdue until it exits (SPEC §3.4). */
static LeaseOutcome lease_revoked_unheld(Lease *l) {
        if (lease_command_running(l) && l->lost) {
                lease_fence_command(l, true);
                return LEASE_OUTCOME_OVERDUE;
        }
        if (lease_command_running(l)) {
                if (l->state != LEASE_OVERDUE) {
                        l->state = LEASE_OVERDUE;
                        lease_audit(l, "overdue", "revoked, and nobody is left to stop the command");
                        l->table->changed = true;
                }
                return LEASE_OUTCOME_OVERDUE;
        }
        lease_end(l);
        return LEASE_OUTCOME_ENDED;
}

LeaseOutcome lease_holder_gone(Lease *l) {
        assert(!l->holder); /* its session unlinked it first */
        lease_command_refresh(l);
        l->grace_timer = sd_event_source_disable_unref(l->grace_timer);
        if (l->state == LEASE_REVOKED && lease_command_running(l))
                return lease_revoked_unheld(l);
        return lease_maybe_end(l) ? LEASE_OUTCOME_ENDED : LEASE_OUTCOME_HELD;
}

static int on_revoke_grace(sd_event_source *s, uint64_t usec, void *userdata) {
        Lease *l = userdata;
        l->grace_timer = sd_event_source_disable_unref(l->grace_timer);
        if (l->holder)
                lease_table_push_event(l->table, &(LeaseEvent) { .type = LEASE_EVENT_CUT, .lease = l });
        return 0;
}

void lease_start_revoke_grace(Lease *l) {
        if (lease_command_running(l)) {
                if (l->lost)
                        lease_fence_command(l, false); /* the holder's grace to stop it, then SIGKILL */
                return;
        }
        (void) sd_event_add_time_relative(l->table->event, &l->grace_timer, CLOCK_MONOTONIC, l->table->revoke_grace, 0,
                                          on_revoke_grace, l);
}

/* The audit's reason for a lost lease whose command brokerd stops itself. */
static const char *lease_fence_reason(Lease *l, const char *reason, char *buf, size_t size) {
        if (!l->lost || l->holder || !lease_command_running(l))
                return reason;
        (void) snprintf(buf, size, "%s; nobody holds it: brokerd stops its command", reason ? reason : "lost");
        return buf;
}

LeaseOutcome lease_revoke(Lease *l, const char *reason) {
        char buf[128];
        if (l->state != LEASE_HELD && l->state != LEASE_RESTORED)
                return LEASE_OUTCOME_HELD;
        l->state = LEASE_REVOKED;
        lease_command_refresh(l);
        lease_audit(l, "revoked", lease_fence_reason(l, reason, buf, sizeof buf));
        l->table->changed = true;
        if (l->holder)
                return LEASE_OUTCOME_REVOKED;
        return lease_revoked_unheld(l);
}

LeaseOutcome lease_lose(Lease *l, const char *reason) {
        char buf[128];
        l->lost = true;
        if (l->state == LEASE_HELD || l->state == LEASE_RESTORED)
                return lease_revoke(l, reason);
        /* Revoked before (max-hold, a release): the holder was told already, or nobody was left to. */
        lease_command_refresh(l);
        if (!lease_command_running(l))
                return lease_maybe_end(l) ? LEASE_OUTCOME_ENDED : LEASE_OUTCOME_HELD;
        if (l->holder) {
                lease_fence_command(l, false);
                return LEASE_OUTCOME_HELD;
        }
        l->state = LEASE_REVOKED; /* overdue no longer: brokerd stops it */
        l->table->changed = true;
        lease_audit(l, "revoked", lease_fence_reason(l, reason, buf, sizeof buf));
        return lease_revoked_unheld(l);
}

/* The order of the keys is the wire's (a client may print it): id, token, pool, slots, lane, uid, pid,
 * grantedAt, detached, then members, job, commandPid, expiresAt, also where they apply. */
void lease_write_json(const Lease *l, JsonText *t) {
        const EngineLease *el = l->engine_lease;
        const unsigned *idx;
        const char *const *members;
        unsigned n = engine_lease_slots(el, &idx, &members);

        json_text_open(t, '{');
        json_text_key(t, "id");
        json_text_string(t, l->id);
        json_text_key(t, "token");
        json_text_integer(t, (int64_t) engine_lease_token(el));
        json_text_key(t, "pool");
        json_text_string(t, engine_lease_pool(el));
        json_text_key(t, "slots");
        json_text_open(t, '[');
        for (unsigned i = 0; i < n; i++)
                json_text_integer(t, idx[i]);
        json_text_close(t, ']');
        json_text_key(t, "lane");
        json_text_string(t, engine_lease_lane(el));
        json_text_key(t, "uid");
        json_text_integer(t, (int64_t) l->uid);
        json_text_key(t, "pid");
        json_text_integer(t, (int64_t) l->pid);
        json_text_key(t, "grantedAt");
        json_text_integer(t, (int64_t) l->granted_real);
        json_text_key(t, "detached");
        json_text_bool(t, l->detached);
        if (members) {
                json_text_key(t, "members");
                json_text_open(t, '[');
                for (unsigned i = 0; i < n; i++)
                        json_text_string(t, members[i] ? members[i] : "");
                json_text_close(t, ']');
        }
        if (l->job) {
                json_text_key(t, "job");
                json_text_string(t, l->job);
        }
        if (l->has_command) {
                json_text_key(t, "commandPid");
                json_text_integer(t, (int64_t) l->command.pid);
        }
        usec_t exp = lease_expires_realtime(l);
        if (exp != USEC_INFINITY) {
                json_text_key(t, "expiresAt");
                json_text_integer(t, (int64_t) exp);
        }
        size_t n_also = engine_lease_also_count(el);
        if (n_also > 0) {
                /* An all-or-nothing lease (SPEC §3.5): each also= pool's slots and token. */
                json_text_key(t, "also");
                json_text_open(t, '[');
                for (size_t i = 0; i < n_also; i++) {
                        EngineLeaseAlso a;
                        if (engine_lease_also(el, i, &a) < 0)
                                continue;
                        json_text_open(t, '{');
                        json_text_key(t, "pool");
                        json_text_string(t, a.pool);
                        json_text_key(t, "token");
                        json_text_integer(t, (int64_t) a.token);
                        json_text_key(t, "slots");
                        json_text_open(t, '[');
                        for (unsigned k = 0; k < a.n_slots; k++)
                                json_text_integer(t, a.slots[k]);
                        json_text_close(t, ']');
                        if (a.members) {
                                json_text_key(t, "members");
                                json_text_open(t, '[');
                                for (unsigned k = 0; k < a.n_slots; k++)
                                        json_text_string(t, a.members[k] ? a.members[k] : "");
                                json_text_close(t, ']');
                        }
                        json_text_close(t, '}');
                }
                json_text_close(t, ']');
        }
        json_text_close(t, '}');
}

json_t *lease_to_json(const Lease *l) {
        _cleanup_(json_text_done) JsonText t;
        json_t *o = NULL;

        json_text_init(&t);
        lease_write_json(l, &t);
        if (json_text_result(&t) < 0 || json_parse_object(t.data, t.size, &o) < 0)
                return NULL;
        return o;
}
