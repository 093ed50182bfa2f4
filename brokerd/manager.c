/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <malloc.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>

#include "closer.h"
#include "config-files.h"
#include "config.h"
#include "connection.h"
#include "fs-util.h"
#include "history.h"
#include "lease-log.h"
#include "lease.h"
#include "log.h"
#include "manager.h"
#include "member-state.h"
#include "methods.h"
#include "persistence.h"
#include "session.h"
#include "state-damage.h"

#define TICK_USEC USEC_PER_SEC
/* node_exporter scrapes every 15-60 s: fresher files would only cost writes. */
#define METRICS_TEXTFILE_INTERVAL (15 * USEC_PER_SEC)
/* The longest an idle brokerd's tick sleeps (manager_next_tick()). */
#define IDLE_TICK_MAX_USEC (60 * USEC_PER_SEC)
/* Connections accepted per wakeup of the listening socket: a connect storm cannot hold the loop. */
#define ACCEPTS_PER_WAKEUP 64
/* Out of fds, accepting is tried again this often even if no connection closes (other fds free too). */
#define ACCEPT_RESUME_USEC (250 * USEC_PER_MSEC)
/* How often a state directory that could not be read is read again (as history reopens the database). */
#define STATE_RETRY_USEC (5 * USEC_PER_SEC)
/* How long a clean stop waits for Redis to answer the withdrawals of this node's waiters. One round trip
 * takes well under a millisecond on a LAN; a Redis that has not answered within a heartbeat period is down
 * or badly overloaded, and waiting for the link's command timeout (2 s) would only delay the stop: what is
 * not withdrawn then, Redis reaps with the node after backend-node-ttl, as before. */
#define STOP_GIVE_BACK_MAX (1 * USEC_PER_SEC)

/* Something for the tick to do within a second: a connection, a status to send, a reload's settings. */
static void manager_wake_tick(Manager *m) {
        uint64_t at;
        usec_t soon = now_monotonic() + TICK_USEC;
        if (m->tick_timer && sd_event_source_get_time(m->tick_timer, &at) >= 0 && at > soon)
                (void) sd_event_source_set_time(m->tick_timer, soon);
}

void manager_status_changed(Manager *m) {
        m->status_dirty = true;
        manager_wake_tick(m);
}

void manager_random_bytes(Manager *m, void *buf, size_t n) {
        uint8_t *p = buf;
        while (n > 0) {
                if (m->random_left == 0) {
                        if (getrandom(m->random_pool, sizeof m->random_pool, GRND_NONBLOCK) != sizeof m->random_pool) {
                                /* Only before the kernel's pool is seeded, which is before any daemon runs. */
                                uint64_t x = 0x9e3779b97f4a7c15ULL ^ now_monotonic() ^ now_realtime();
                                for (size_t i = 0; i < sizeof m->random_pool; i++) {
                                        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                                        m->random_pool[i] = (uint8_t) x;
                                }
                        }
                        m->random_left = sizeof m->random_pool;
                }
                size_t k = MIN(n, m->random_left);
                memcpy(p, m->random_pool + sizeof m->random_pool - m->random_left, k);
                m->random_left -= k;
                p += k;
                n -= k;
        }
}

static void lease_random_bytes(void *buf, size_t n, void *userdata) {
        manager_random_bytes(userdata, buf, n);
}

/* Reads from the connections that waited for the closer, and accepts again, as far as its limits allow now. */
static void manager_closer_below(Manager *m) {
        connection_resume_reading();
        if (m->accept_closer_paused && !closer_total_over()) {
                m->accept_closer_paused = false;
                if (!m->accept_paused && !m->stopping)
                        (void) sd_event_source_set_enabled(m->listen_source, SD_EVENT_ON);
        }
}

/* What the modules take from the configuration, at start and at each reload. */
static void manager_apply_settings(Manager *m) {
        audit_set_level(&m->audit, m->config->audit);
        closer_set_limits(m->config->max_closing_fds_per_uid, m->config->max_closing_fds);
        /* Raised limits free who waited under the old ones: the closer tells only of a limit crossed later,
         * by its own closes, and a close that blocks may never end. */
        manager_closer_below(m);
        m->leases.revoke_grace = m->config->revoke_grace;
        m->leases.reclaim_grace = m->config->reclaim_grace;
#if HAVE_REDIS
        /* The self-fence margin of every shared pool, as the revocations' SIGKILL: one value everywhere. */
        backend_table_set_revoke_grace(&m->backends, m->config->revoke_grace);
#endif
}

uint64_t manager_random(void *userdata) {
        uint64_t v;
        manager_random_bytes(userdata, &v, sizeof v);
        return v;
}

usec_t manager_realtime_of(usec_t monotonic) {
        usec_t now_m = now_monotonic(), now_r = now_realtime();
        return monotonic <= now_m ? usec_sub_unsigned(now_r, now_m - monotonic) : now_r + (monotonic - now_m);
}

/* A floor for every pool (after a database was started afresh): pools configured later get it too. */
static void manager_apply_token_floor_all(Manager *m) {
        if (m->token_floor_all == 0)
                return;
        for (size_t i = 0; i < m->config->n_pools; i++)
                (void) engine_set_token_floor(m->engine, m->config->pools[i]->name, m->token_floor_all);
}

/* ---- lane ACLs ---- */

static void acls_free(LaneAcl *acls, size_t n) {
        for (size_t i = 0; i < n; i++) {
                free(acls[i].uids);
                free(acls[i].gids);
        }
        free(acls);
}

static int parse_id(const char *s, uint32_t *ret) {
        char *end;
        errno = 0;
        unsigned long v = strtoul(s, &end, 10);
        if (errno || *end || end == s || v >= UINT32_MAX)
                return -EINVAL;
        *ret = (uint32_t) v;
        return 0;
}

static void log_conf_errors(const ConfErrors *errors) {
        for (size_t i = 0; i < errors->n_errors; i++) {
                _cleanup_free_ char *text = conf_error_to_string(&errors->errors[i]);
                log_error("%s", text ?: "(out of memory while describing an error)");
        }
}

_Static_assert(sizeof(uid_t) == sizeof(uint32_t) && sizeof(gid_t) == sizeof(uint32_t), "32-bit ids");

/* Names (or numeric ids) to ids, for allow-users= (users) or allow-groups= (!users). Unknown names are
 * errors; returns 0, -EINVAL (errors filled) or -ENOMEM. */
static int resolve_ids(const ConfSource *source, const char *key, char *const *names, bool users, uint32_t **ret,
                       size_t *ret_n, ConfErrors *errors) {
        _cleanup_free_ uint32_t *ids = NULL;
        size_t n = 0;
        bool failed = false;

        for (char *const *name = names; name && *name; name++) {
                uint32_t id;
                if (parse_id(*name, &id) < 0) {
                        struct passwd *pw = users ? getpwnam(*name) : NULL;
                        struct group *gr = users ? NULL : getgrnam(*name);
                        if (!pw && !gr) {
                                conf_errors_add(errors, source, key, "unknown %s \"%s\"", users ? "user" : "group",
                                                *name);
                                failed = true;
                                continue;
                        }
                        id = pw ? pw->pw_uid : gr->gr_gid;
                }
                uint32_t *a = reallocarray(ids, n + 1, sizeof(uint32_t));
                if (!a)
                        return -ENOMEM;
                ids = a;
                ids[n++] = id;
        }
        if (failed)
                return -EINVAL;
        *ret = TAKE_PTR(ids);
        *ret_n = n;
        return 0;
}

/* Names become ids once, at load: an NSS lookup per request could block the loop. */
static int acls_resolve(const BrokerConfig *c, LaneAcl **ret, size_t *ret_n, ConfErrors *errors) {
        /* The lanes' access lists, then the pools' administrators (LaneAcl.pool). */
        size_t n = c->n_lanes + c->n_pools;
        LaneAcl *acls = calloc(n ?: 1, sizeof(LaneAcl));
        int result = 0;
        if (!acls)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                const LaneConfig *lc = i < c->n_lanes ? c->lanes[i] : NULL;
                const PoolConfig *pc = lc ? NULL : c->pools[i - c->n_lanes];
                LaneAcl *acl = &acls[i];
                acl->lane = lc ? lc->name : pc->name;
                acl->pool = !lc;
                char *const *users = lc ? lc->allow_users : pc->admin_users;
                char *const *groups = lc ? lc->allow_groups : pc->admin_groups;
                const ConfSource *source = lc ? &lc->source : &pc->source;
                acl->restricted = users || groups;
                /* Every lane and pool is resolved, so that every unknown name is reported in one go. */
                int ru = resolve_ids(source, lc ? "allow-users" : "admin-users", users, true, &acl->uids, &acl->n_uids,
                                     errors);
                int rg = resolve_ids(source, lc ? "allow-groups" : "admin-groups", groups, false, &acl->gids,
                                     &acl->n_gids, errors);
                if (ru == -ENOMEM || rg == -ENOMEM)
                        result = -ENOMEM;
                else if (result == 0 && (ru < 0 || rg < 0))
                        result = -EINVAL;
        }
        if (result < 0) {
                acls_free(acls, n);
                return result;
        }
        *ret = acls;
        *ret_n = n;
        return 0;
}

int manager_check_names(const BrokerConfig *c, ConfErrors *errors) {
        LaneAcl *acls = NULL;
        size_t n_acls = 0;
        int r = acls_resolve(c, &acls, &n_acls, errors);
        if (r < 0)
                return r;
        acls_free(acls, n_acls);
        return 0;
}

static bool acl_allows(const LaneAcl *acl, uid_t uid, const gid_t *groups, size_t n_groups) {
        for (size_t k = 0; k < acl->n_uids; k++)
                if (acl->uids[k] == uid)
                        return true;
        for (size_t k = 0; k < acl->n_gids; k++)
                for (size_t g = 0; g < n_groups; g++)
                        if (acl->gids[k] == groups[g])
                                return true;
        return false;
}

/* May uid quarantine, restore and drain the pool's members (SPEC §3.6)? Root, brokerd's own user, and the
 * pool's admin-users=/admin-groups=. */
bool manager_pool_admin_allows(const Manager *m, const char *pool, uid_t uid, const gid_t *groups, size_t n_groups) {
        if (uid == 0 || uid == getuid())
                return true;
        for (size_t i = 0; i < m->n_acls; i++)
                if (m->acls[i].pool && streq(m->acls[i].lane, pool))
                        return acl_allows(&m->acls[i], uid, groups, n_groups);
        return false;
}

bool manager_lane_allows(const Manager *m, const char *lane, uid_t uid, const gid_t *groups, size_t n_groups) {
        if (uid == 0)
                return true;
        for (size_t i = 0; i < m->n_acls; i++) {
                const LaneAcl *acl = &m->acls[i];
                if (acl->pool || !streq(acl->lane, lane))
                        continue;
                if (!acl->restricted)
                        return true;
                return acl_allows(acl, uid, groups, n_groups);
        }
        return false;
}

static bool manager_backend_primary(const char *pool, BackendPrimary *ret, void *userdata) {
#if HAVE_REDIS
        Manager *m = userdata;
        return backend_table_primary(&m->backends, pool, ret);
#else
        return false;
#endif
}

static bool manager_settle_for_reply(Manager *m);
static void manager_check_damage(Manager *m);

void manager_metrics_gauges(Manager *m, MetricsGauges *ret) {
        /* The leases gauge is the lease table's, slots in use the engine's: settled first, they agree. Asked
         * inside a settle (a Metrics call resumed by one of its events), a grant being handed on may be
         * counted in the slots before its lease is. */
        (void) manager_settle_for_reply(m);
        *ret = (MetricsGauges) {
                .backend_primary = manager_backend_primary,
                .backend_primary_userdata = m,
                .engine = m->engine,
                .now = now_monotonic(),
                .connections = m->sessions.n_sessions,
                .connections_paused = connection_paused_count(),
                .closing_fds = closer_pending(),
                .leases = m->leases.n_leases,
                .journal_dropped = m->audit.journal_dropped_total,
                .history = m->history != NULL,
        };
        if (m->history) {
                HistoryStats hs;
                history_get_stats(m->history, &hs);
                ret->history_healthy = hs.healthy;
                ret->history_rows_dropped = hs.rows_dropped;
                ret->history_rows_pending = hs.rows_pending;
        }
}

/* ---- the engine's clock ---- */

/* The drain that follows every dispatch does the work; it re-arms the timer (a oneshot, off now). */
static int on_engine_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        Manager *m = userdata;
        m->engine_timer_at = 0;
        return 0;
}

/* glibc keeps what is freed in its arenas (the writer thread's too) and gives back only the top of a
 * heap: 500 clients that asked for History and never read left 700 MB behind after they were gone. */
#define TRIM_AFTER_FREED ((size_t) 4 * 1024 * 1024)

void manager_memory_freed(Manager *m, size_t bytes) {
        m->freed_untrimmed += bytes;
}

static void history_memory_freed(size_t bytes, void *userdata) {
        manager_memory_freed(userdata, bytes);
}

static bool session_lane_allows(const char *lane, uid_t uid, const gid_t *groups, size_t n_groups, void *userdata) {
        return manager_lane_allows(userdata, lane, uid, groups, n_groups);
}

static bool methods_pool_admin(const char *pool, uid_t uid, const gid_t *groups, size_t n_groups, void *userdata) {
        return manager_pool_admin_allows(userdata, pool, uid, groups, n_groups);
}

static void session_fd_released(void *userdata) {
        manager_fd_released(userdata);
}

static int methods_reload(ConfErrors *errors, void *userdata) {
        return manager_reload(userdata, errors);
}

static void methods_gauges(MetricsGauges *ret, void *userdata) {
        manager_metrics_gauges(userdata, ret);
}

static void methods_status_changed(void *userdata) {
        manager_status_changed(userdata);
}

#if HAVE_REDIS
static void node_random_bytes(void *buf, size_t n, void *userdata) {
        manager_random_bytes(userdata, buf, n);
}

/* The engine's factory for pools with backend=: the node identity is read (or made) on first use, so that a
 * daemon without shared pools never writes one. */
static int manager_pool_factory(const PoolConfig *pc, const char *name, PoolEmitFn emit, void *emit_userdata,
                                void *userdata, Pool **ret) {
        Manager *m = userdata;
        if (!m->node_loaded) {
                int r = node_load(m->state_directory, m->config->node_name, node_random_bytes, m, &m->node);
                if (r < 0)
                        return log_error_errno(r, "Failed to read or make the node id in %s: %m", m->state_directory);
                m->node_loaded = true;
                log_info("Node %s (%s) in shared pools.", m->node.name, m->node.id);
        }
        m->backends.revoke_grace = m->config->revoke_grace;
        return backend_table_pool_new(pc, name, emit, emit_userdata, &m->backends, ret);
}

static bool lease_backend_of(const char *pool, HistoryLeaseBackend *ret, void *userdata) {
        Manager *m = userdata;
        BackendWhere w;
        if (!backend_table_where(&m->backends, pool, &w))
                return false;
        *ret = (HistoryLeaseBackend) {
                .url = (char *) w.url,
                .user = (char *) w.user,
                .password_file = (char *) w.password_file,
                .sentinel_password_file = (char *) w.sentinel_password_file,
                .node_ttl = w.node_ttl,
        };
        return true;
}

static void on_backend_rtt(const char *pool, usec_t rtt, void *userdata) {
        Manager *m = userdata;
        metrics_backend_rtt(&m->metrics, pool, rtt);
}

static void on_backend_fence_moved(const char *pool, usec_t deadline, void *userdata) {
        Manager *m = userdata;
        (void) session_table_renew_pool(&m->sessions, pool, deadline);
}

static usec_t session_fence_deadline(const char *pool, void *userdata) {
        Manager *m = userdata;
        return backend_table_fence_deadline(&m->backends, pool);
}

static void on_backend_failover(const char *url, const char *previous, const char *primary, void *userdata) {
        Manager *m = userdata;
        audit_backend_failover(&m->audit, url, previous, primary);
        manager_status_changed(m);
}

static void on_backend_notice(const char *pool, const SharedNotice *n, void *userdata) {
        Manager *m = userdata;
        audit_backend(&m->audit, pool, n);
        manager_status_changed(m);
}
#endif

static void manager_collect(Manager *m) {
        session_table_collect(&m->sessions);
        if (m->freed_untrimmed >= TRIM_AFTER_FREED) {
                m->freed_untrimmed = 0;
                (void) malloc_trim(0);
        }
}

static void member_pending_note_retired(Manager *m, const EngineEvent *ev);

/* The engine's next event. The withdrawals of the waiters a shared pool refused here go to Redis first
 * (backend_table_send_first()), before the refusals are handed on: here, not at the drain's start, for a
 * refusal comes from a settle after a connection's turn too (a Reload call that removes the pool), from
 * engine_run() (a waiter's grace over) and from the commands that handing on an event makes. */
static bool manager_pop_event(Manager *m, EngineEvent *ret) {
#if HAVE_REDIS
        backend_table_send_first(&m->backends);
#endif
        return engine_pop_event(m->engine, ret);
}

/* The engine's events of what the last handler did, to sessions and leases; the engine's timer re-armed.
 * Frees nothing: a poller batch may still name closed sessions' sockets. */
static void manager_settle(Manager *m) {
        if (m->settling)
                return; /* the settle on the stack hands on whatever comes meanwhile */
        m->settling = true;
        for (;;) {
                engine_run(m->engine, now_monotonic());
                EngineEvent ev;
                bool any = false;
                while (manager_pop_event(m, &ev)) {
                        if (ev.type == ENGINE_EVENT_MEMBER || ev.type == ENGINE_EVENT_DRAIN) {
                                m->member_state_dirty = true;
                                if (ev.type == ENGINE_EVENT_MEMBER) /* its quarantine count */
                                        lease_table_log_use(&m->leases, ev.pool, ev.member);
                                if (ev.type == ENGINE_EVENT_MEMBER && ev.retired)
                                        member_pending_note_retired(m, &ev);
                                if (m->member_events_replayed > 0) {
                                        m->member_events_replayed--;
                                        any = true;
                                        continue;
                                }
                        }
                        session_on_engine_event(&m->sessions, &ev);
                        any = true;
                }
                LeaseEvent lev;
                while (lease_table_pop_event(&m->leases, &lev)) {
                        session_on_lease_event(&m->sessions, &lev);
                        any = true;
                }
                if (!any)
                        break;
        }
        m->settling = false;
        usec_t next = engine_next_wakeup(m->engine);
        if (next == m->engine_timer_at)
                return; /* as armed: most iterations change nothing */
        m->engine_timer_at = next;
        if (next == USEC_INFINITY)
                (void) sd_event_source_set_enabled(m->engine_timer, SD_EVENT_OFF);
        else {
                (void) sd_event_source_set_time(m->engine_timer, next);
                (void) sd_event_source_set_enabled(m->engine_timer, SD_EVENT_ONESHOT);
        }
}

/* After each connection's turn in a poller batch: what it did is handed on before the next one's turn. */
static void on_connection_handled(void *userdata) {
        manager_settle(userdata);
}

/* Status and Metrics read the engine (slots in use) and the leases (holders) in one reply: the engine's
 * queued events go first, or a grant it made since (a timer's release lets the next engine call grant the
 * freed slot) would count in inUse and be missing from holders. The rows of the leases that makes are
 * written too, as the drain would, before the reply leaves: a Status answered before the drain's write
 * showed a lease and its token that a brokerd killed in between never restored, and its mark below that
 * token handed the token out again, to another lease (test-restart under load: tokens went back, SPEC §3.4).
 * Not from inside a settle: a call resumed by one of its events waits for the drain instead
 * (methods_views_flush()). */
static bool manager_settle_for_reply(Manager *m) {
        if (m->settling)
                return false;
        do
                manager_settle(m);
        while (lease_table_flush(&m->leases));
        return true;
}

static bool methods_settle(void *userdata) {
        return manager_settle_for_reply(userdata);
}

/* ---- drains and quarantines across restarts (SPEC §3.6, members.state) ---- */

/* A realtime instant of the past as a monotonic one: before this boot is its start (the engine's clock). */
static usec_t real_to_mono(usec_t real, usec_t now, usec_t now_real) {
        return usec_sub_unsigned(now, usec_sub_unsigned(now_real, real));
}

/* A copy, or NULL for NULL; *oom set when the copy failed. A function, so that several in one initializer are
 * sequenced. */
static char *dup_tracked(const char *s, bool *oom) {
        char *c = s ? strdup(s) : NULL;
        if (s && !c)
                *oom = true;
        return c;
}

/* The quarantined members of an in-process pool, as members.state records them, appended at e[*n]. */
static void member_state_add_quarantines(const EnginePoolInfo *info, MemberStateEntry *e, size_t *n, usec_t now,
                                         usec_t now_real, bool *oom) {
        for (size_t j = 0; j < info->n_life; j++) {
                const EngineMemberLife *l = info->life + j;
                if (!l->quarantined)
                        continue;
                e[(*n)++] = (MemberStateEntry) {
                        .pool = dup_tracked(info->name, oom), .member = dup_tracked(l->member, oom),
                        .drain_until = USEC_INFINITY, .quarantined = true,
                        .quarantine_since = l->since_real ?: usec_mono_to_real(l->since, now, now_real),
                        .quarantine_job = dup_tracked(l->job, oom), .quarantine_exit_status = l->exit_status,
                        .quarantine_reason = dup_tracked(l->reason, oom),
                };
        }
}

/* A drain of the engine's, as members.state records it, appended at e[*n]. */
static void member_state_add_drain(const EngineDrainInfo *d, MemberStateEntry *e, size_t *n, usec_t now,
                                   usec_t now_real, bool *oom) {
        e[(*n)++] = (MemberStateEntry) {
                .pool = dup_tracked(d->pool, oom), .member = dup_tracked(d->member, oom), .drained = true,
                .drain_since = usec_mono_to_real(d->since, now, now_real),
                .drain_until = d->until == USEC_INFINITY ? USEC_INFINITY :
                               d->until_realtime ?: usec_mono_to_real(d->until, now, now_real),
                .drain_by = dup_tracked(d->who, oom), .drain_reason = dup_tracked(d->reason, oom),
                .quarantine_exit_status = -1,
        };
}

/* Room for `extra` entries and every drain and member life of the engine's. */
static MemberStateEntry *member_state_new(Manager *m, size_t extra, usec_t now) {
        size_t cap = extra + engine_drain_count(m->engine);
        for (size_t i = 0; i < engine_pool_count(m->engine); i++) {
                EnginePoolInfo info;
                if (engine_pool_info(m->engine, i, now, &info) >= 0)
                        cap += info.n_life;
        }
        return calloc(cap ?: 1, sizeof(MemberStateEntry));
}

static int member_state_collect(Manager *m, MemberStateEntry **ret, size_t *ret_n) {
        usec_t now = now_monotonic(), now_real = now_realtime();
        size_t n = 0;
        MemberStateEntry *e = member_state_new(m, m->n_member_pending, now);
        if (!e)
                return -ENOMEM;
        bool oom = false;
#define DUP(s) dup_tracked(s, &oom)
        for (size_t i = 0; i < engine_pool_count(m->engine); i++) {
                EnginePoolInfo info;
                /* A shared pool's quarantines live in Redis (brokerd/lua/README, "Members' lives"): a restart
                 * reads them there, and a restore another node made meanwhile must not be undone from here. */
                if (engine_pool_info(m->engine, i, now, &info) < 0 || info.remote)
                        continue;
                member_state_add_quarantines(&info, e, &n, now, now_real, &oom);
        }
        for (size_t i = 0; i < engine_drain_count(m->engine); i++) {
                EngineDrainInfo d;
                if (engine_drain_info(m->engine, i, &d) >= 0)
                        member_state_add_drain(&d, e, &n, now, now_real, &oom);
        }
        for (size_t i = 0; i < m->n_member_pending; i++) {
                const MemberStateEntry *p = &m->member_pending[i];
                e[n] = *p;
                e[n].pool = DUP(p->pool);
                e[n].member = DUP(p->member);
                e[n].drain_by = DUP(p->drain_by);
                e[n].drain_reason = DUP(p->drain_reason);
                e[n].quarantine_job = DUP(p->quarantine_job);
                e[n].quarantine_reason = DUP(p->quarantine_reason);
                n++;
        }
#undef DUP
        if (oom) {
                member_state_entries_free(e, n);
                return -ENOMEM;
        }
        *ret = e;
        *ret_n = n;
        return 0;
}

/* The quarantines of the in-process pools that configuration c removes, or moves to a backend (and the drains of
 * the latter): such a pool goes with its last lease, and its members' lives with it, where a drain of a pool
 * removed stays the engine's record (engine_configure() applies it again to the pool made anew, or revived).
 * They wait in member_pending as a restart keeps those of a pool it does not find: written to members.state,
 * applied by the reload (or restart) that brings the pool back in-process (SPEC §3.6: quarantines survive
 * reloads). */
static int member_state_leaving(Manager *m, const BrokerConfig *c, MemberStateEntry **ret, size_t *ret_n) {
        usec_t now = now_monotonic(), now_real = now_realtime();
        size_t n = 0;
        MemberStateEntry *e = member_state_new(m, 0, now);
        if (!e)
                return -ENOMEM;
        bool oom = false;
        for (size_t i = 0; i < engine_pool_count(m->engine); i++) {
                EnginePoolInfo info;
                if (engine_pool_info(m->engine, i, now, &info) < 0 || info.remote)
                        continue;
                const PoolConfig *pc = conf_find_pool(c, info.name);
                if (pc && !pc->backend)
                        continue; /* it stays, and its members' lives with it */
                member_state_add_quarantines(&info, e, &n, now, now_real, &oom);
                /* Moved to a backend, it obeys the fleet's drains from now on and the engine forgets its own
                 * (engine_configure()): kept here for a move back, as its quarantines are. */
                for (size_t k = 0; pc && k < engine_drain_count(m->engine); k++) {
                        EngineDrainInfo d;
                        if (engine_drain_info(m->engine, k, &d) >= 0 && streq(d.pool, info.name))
                                member_state_add_drain(&d, e, &n, now, now_real, &oom);
                }
        }
        if (oom) {
                member_state_entries_free(e, n);
                return -ENOMEM;
        }
        if (n == 0)
                e = mfree(e);
        *ret = e;
        *ret_n = n;
        return 0;
}

/* Appends n entries to member_pending, taking their strings (not the array: the caller's); out of memory, frees
 * them. members.state is written again either way. */
static void member_pending_take(Manager *m, MemberStateEntry *e, size_t n) {
        MemberStateEntry *a = reallocarray(m->member_pending, m->n_member_pending + n, sizeof(MemberStateEntry));
        if (a) {
                memcpy(a + m->n_member_pending, e, n * sizeof(MemberStateEntry));
                m->member_pending = a;
                m->n_member_pending += n;
        } else {
                log_oom();
                for (size_t i = 0; i < n; i++)
                        member_state_entry_done(e + i);
        }
        m->member_state_dirty = true;
}

/* A quarantine or restore told by an in-process pool that left the configuration (EngineEvent.retired): its
 * last lease's exit status did it. Such a pool goes with that lease, and its members' lives with it, and
 * members.state lists only the configured pools' lives: the quarantine waits in member_pending, as those the
 * reload kept (member_state_leaving()), for the reload that brings the pool back in-process; a restore ends the
 * one waiting there. */
static void member_pending_note_retired(Manager *m, const EngineEvent *ev) {
        for (size_t i = 0; i < m->n_member_pending; i++) {
                MemberStateEntry *p = &m->member_pending[i];
                if (!p->quarantined || !streq(p->pool, ev->pool) || !streq_ptr(p->member, ev->member))
                        continue;
                if (ev->quarantined)
                        return; /* the first quarantine's who and why stay, as the pool keeps them */
                if (p->drained) {
                        p->quarantined = false;
                        p->quarantine_job = mfree(p->quarantine_job);
                        p->quarantine_reason = mfree(p->quarantine_reason);
                        p->quarantine_exit_status = -1;
                } else {
                        member_state_entry_done(p);
                        memmove(p, p + 1, (m->n_member_pending - i - 1) * sizeof(MemberStateEntry));
                        m->n_member_pending--;
                }
                m->member_state_dirty = true;
                return;
        }
        if (!ev->quarantined)
                return;
        usec_t now = now_monotonic(), now_real = now_realtime();
        bool oom = false;
        MemberStateEntry q = {
                .pool = dup_tracked(ev->pool, &oom), .member = dup_tracked(ev->member, &oom),
                .drain_until = USEC_INFINITY, .quarantined = true,
                .quarantine_since = usec_mono_to_real(ev->at, now, now_real),
                .quarantine_job = dup_tracked(ev->job, &oom), .quarantine_exit_status = ev->exit_status,
                .quarantine_reason = dup_tracked(ev->note, &oom),
        };
        if (oom) {
                log_oom();
                member_state_entry_done(&q);
                return;
        }
        member_pending_take(m, &q, 1);
}

static void manager_write_member_state(Manager *m) {
        if (!m->member_state_loaded || !m->state_directory)
                return; /* never over a file that could not be read */
        MemberStateEntry *e = NULL;
        size_t n = 0;
        int r = member_state_collect(m, &e, &n);
        if (r >= 0)
                r = member_state_write(m->state_directory, e, n);
        member_state_entries_free(e, n);
        if (r < 0) {
                if (!m->member_state_failed)
                        log_warning_errno(r, "Failed to write %s/" MEMBER_STATE_FILE " (drains and quarantines would not "
                                          "survive a restart); retrying: %m", m->state_directory);
                m->member_state_failed = true;
                return;
        }
        if (m->member_state_failed)
                log_info("%s/" MEMBER_STATE_FILE " is written again.", m->state_directory);
        m->member_state_failed = false;
        m->member_state_dirty = false;
}

static bool member_is_quarantined(Manager *m, const char *pool, const char *member) {
        for (size_t i = 0; i < engine_pool_count(m->engine); i++) {
                EnginePoolInfo info;
                if (engine_pool_info(m->engine, i, now_monotonic(), &info) < 0 || !streq(info.name, pool))
                        continue;
                for (size_t j = 0; j < info.n_life; j++)
                        if (streq(info.life[j].member, member))
                                return info.life[j].quarantined;
        }
        return false;
}

/* Applies what members.state holds; what names a pool or member not configured now waits in member_pending
 * for a reload that brings it back (a member is identified by its name). */
static void manager_apply_member_state(Manager *m, MemberStateEntry *e, size_t n) {
        usec_t now = now_monotonic(), now_real = now_realtime();
        MemberStateEntry *pending = calloc(n ?: 1, sizeof(MemberStateEntry));
        size_t n_pending = 0;
        for (size_t i = 0; i < n; i++) {
                bool keep = false;
                if (e[i].quarantined) {
                        bool was = member_is_quarantined(m, e[i].pool, e[i].member);
                        /* A shared pool's quarantines are Redis's: a record of this node's file is not
                         * replayed there (it would undo a restore of another node), kept as a drain's is. */
                        const PoolConfig *qc = conf_find_pool(m->config, e[i].pool);
                        int r = qc && qc->backend ? -EOPNOTSUPP : engine_member_quarantine(
                                m->engine, e[i].pool, e[i].member,
                                &(EngineQuarantine) { .since = MIN(real_to_mono(e[i].quarantine_since, now, now_real), now),
                                                      .since_real = e[i].quarantine_since, /* also before this boot */
                                                      .job = e[i].quarantine_job,
                                                      .exit_status = e[i].quarantine_exit_status,
                                                      .reason = e[i].quarantine_reason },
                                now);
                        keep = keep || r == -ENOENT || r == -EOPNOTSUPP;
                        if (r >= 0 && !was)
                                m->member_events_replayed++; /* its state changed: one MEMBER event */
                        if (r < 0 && !keep)
                                log_warning_errno(r, "Could not quarantine %s of pool %s again: %m", e[i].member, e[i].pool);
                }
                if (e[i].drained) {
                        if (e[i].drain_until != USEC_INFINITY && e[i].drain_until <= now_real) {
                                /* Ended while brokerd was not running: told now as its --until would have told
                                 * it ([UNDRAINED], a history row), as a lease that ended meanwhile is. Not for a
                                 * pool shared now: its drains are Redis's, this record only a local one kept. */
                                const PoolConfig *pc = conf_find_pool(m->config, e[i].pool);
                                if (!pc || !pc->backend)
                                        audit_drain(&m->audit, e[i].pool, e[i].member, false, NULL, e[i].drain_reason,
                                                    e[i].drain_until, true);
                                e[i].drained = false;
                        } else {
                                const PoolConfig *pc = conf_find_pool(m->config, e[i].pool);
                                int r = pc && pc->backend ? -EOPNOTSUPP :
                                        engine_drain_with(m->engine, e[i].pool, e[i].member,
                                                          &(EngineDrain) {
                                                                  .since = MIN(real_to_mono(e[i].drain_since, now, now_real), now),
                                                                  .until = e[i].drain_until == USEC_INFINITY ? USEC_INFINITY :
                                                                           usec_add(now, e[i].drain_until - now_real),
                                                                  .until_realtime = e[i].drain_until == USEC_INFINITY ? 0 : e[i].drain_until,
                                                                  .who = e[i].drain_by, .reason = e[i].drain_reason },
                                                          now);
                                keep = keep || r == -ENOENT || r == -EOPNOTSUPP;
                                if (r >= 0)
                                        m->member_events_replayed++;
                                if (r < 0 && r != -ENOENT && r != -EOPNOTSUPP)
                                        log_warning_errno(r, "Could not drain %s of pool %s again: %m",
                                                          e[i].member ?: "all", e[i].pool);
                        }
                }
                if (keep && pending) {
                        pending[n_pending++] = e[i];
                        e[i] = (MemberStateEntry) {};
                }
        }
        member_state_entries_free(m->member_pending, m->n_member_pending);
        m->member_pending = pending;
        m->n_member_pending = n_pending;
        m->member_state_dirty = true;
}

static void manager_load_member_state(Manager *m) {
        MemberStateEntry *e = NULL;
        size_t n = 0;
        if (!m->state_directory)
                return;
        int r = member_state_read(m->state_directory, &e, &n);
        if (r == -EBADMSG) {
                _cleanup_free_ char *moved = NULL;
                /* Recorded first: a drained or quarantined member it held must not be granted meanwhile. */
                r = state_damage_record(m->state_directory,
                                        MEMBER_STATE_FILE " is damaged or of another version: it is moved aside beside "
                                        "this file as " MEMBER_STATE_FILE ".corrupt-*, and its drains and quarantines "
                                        "are not applied.",
                                        NULL, 0, now_realtime());
                if (r < 0) {
                        log_error_errno(r, "%s/" MEMBER_STATE_FILE " is damaged or of another version, and cannot be "
                                           "recorded in " STATE_DAMAGE_FILE ": %m. It is left as it is; nothing is granted.",
                                        m->state_directory);
                        m->member_state_unrecorded = true;
                        manager_check_damage(m);
                        return;
                }
                (void) member_state_move_aside(m->state_directory, &moved);
                log_error("%s/" MEMBER_STATE_FILE " is damaged or of another version: its drains and quarantines "
                          "are not applied (moved aside to %s).", m->state_directory, moved ?: "?");
                m->member_state_loaded = true;
                manager_check_damage(m);
                return;
        }
        if (r < 0) {
                log_error_errno(r, "Failed to read %s/" MEMBER_STATE_FILE ": drains and quarantines of before the restart "
                                "are not applied, and it is not written over: %m", m->state_directory);
                return;
        }
        m->member_state_loaded = true;
        manager_apply_member_state(m, e, n);
        member_state_entries_free(e, n);
}

void manager_drain(Manager *m) {
        do {
                /* The lease rows of all the grants settled since the last drain go in one write (group
                 * commit); their answers are events that may settle more. */
                do
                        manager_settle(m);
                while (lease_table_flush(&m->leases));
                if (m->member_state_dirty) /* a failed write is tried again at the next drain, said once */
                        manager_write_member_state(m);
                /* The Status and Metrics calls of this iteration (a Status whose snapshots came, or whose wait is
                 * over, too), each kind rendered once; the calls behind an answered one ran: round again (what
                 * they ask of Status or Metrics waits for the next iteration). */
        } while (methods_views_flush(&m->methods, now_monotonic()));
        /* Last: no event still queued can name a closed session any more. */
        manager_collect(m);
}

static bool manager_giving_back(Manager *m);
static bool manager_granting(Manager *m);
static void manager_hand_over(Manager *m);
static int manager_connection_new(Manager *m, int fd, const struct ucred *cred, Session **ret);

/* The drain follows each dispatch (a batch of connections, a timer, a history wakeup), once, and is never
 * re-entered: manager_run() calls it. */
static void manager_after_dispatch(Manager *m) {
        manager_drain(m);
        if (m->handing_over && !manager_granting(m))
                manager_hand_over(m);
        /* A stop ends the loop once nothing is owed to Redis: the reply that settled the last withdrawal was
         * a dispatch too. */
        if (m->stopping && !m->handing_over && !manager_giving_back(m))
                (void) sd_event_exit(m->event, 0);
}

/* ---- a clean stop ---- */

/* Whether a shared pool still owes Redis a withdrawal (or a release) that its link can deliver. */
static bool manager_giving_back(Manager *m) {
#if HAVE_REDIS
        return backend_table_giving_back(&m->backends);
#else
        return false;
#endif
}

static int on_stop_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        Manager *m = userdata;
        if (m->handing_over) {
                /* A grant's row could not be written in time: those sessions stay behind, the rest go. */
                manager_hand_over(m);
                return sd_event_exit(m->event, 0);
        }
        log_warning("Redis did not confirm within %s that this node's waiters left the shared pools; exiting. "
                    "It drops them with this node after backend-node-ttl=.",
                    timespan_format((char[TIMESPAN_MAX]) {}, TIMESPAN_MAX, STOP_GIVE_BACK_MAX));
        return sd_event_exit(m->event, 0);
}

/* SIGTERM, SIGINT, idle exit. Leases are not ended: their rows stay for the next start, which restores
 * them and, in a shared pool, reclaims them within backend-node-ttl= (SPEC §11). Waiters are: their
 * clients see the connection close as the process ends anyway, and in a shared pool a waiter left in
 * Redis's queue would take a freed slot for a client that is gone and keep it until the node expires
 * (SPEC §3.3: a gone client's waiter is removed, the slot untouched). So the sessions without a lease are
 * closed now, which withdraws their requests (calls to Redis, sent after this dispatch), and the loop runs
 * on until Redis has answered them (the drain after each dispatch) or STOP_GIVE_BACK_MAX passed. Nothing
 * here blocks: an unreachable Redis owes nothing deliverable, and the first drain ends the loop. */
/* The connections that did not go to the fd store (none, without one) are closed as for a plain stop. */
static void manager_stop_closing(Manager *m) {
        session_table_close_all_but_holders(&m->sessions);
        if (!manager_giving_back(m) || m->stop_timer)
                return; /* the drain that follows this dispatch ends the loop */
        log_info("Waiting up to %s for Redis to take this node's waiters out of the shared pools.",
                 timespan_format((char[TIMESPAN_MAX]) {}, TIMESPAN_MAX, STOP_GIVE_BACK_MAX));
        int r = sd_event_add_time_relative(m->event, &m->stop_timer, CLOCK_MONOTONIC, STOP_GIVE_BACK_MAX,
                                           10 * USEC_PER_MSEC, on_stop_timer, m);
        if (r < 0) {
                log_warning_errno(r, "Failed to bound the wait for Redis, exiting now: %m");
                (void) sd_event_exit(m->event, 0);
        }
}

/* Under systemd, the next start takes the connections back from the fd store (SPEC §3.4, "A restart loses
 * no waiter"): waiters keep their place and budget, holders their lease without a reclaim. Without a
 * notification socket there is no store to hand them to. */
static bool manager_can_hand_over(void) {
        const char *e = getenv("NOTIFY_SOCKET");
        return e && *e;
}

static void manager_stop(Manager *m) {
        m->stopping = true;
        /* The Status and Metrics calls waiting for their kind's rest are answered by the drain that follows: a
         * session waiting for its reply is not handed over, it is closed. */
        m->methods.stopping = true;
        (void) sd_notify(false, "STOPPING=1");
        /* New clients wait in the socket's backlog for the next start (systemd keeps the socket). */
        (void) sd_event_source_set_enabled(m->listen_source, SD_EVENT_OFF);
        (void) sd_event_source_set_enabled(m->accept_resume_timer, SD_EVENT_OFF);
        if (!manager_can_hand_over()) {
                manager_stop_closing(m);
                return;
        }
        /* The drain that follows hands over once no grant's row is being written (one write per loop
         * iteration: normally that very drain); bounded, as a Redis that does not answer would be. */
        m->handing_over = true;
        int r = sd_event_add_time_relative(m->event, &m->stop_timer, CLOCK_MONOTONIC, STOP_GIVE_BACK_MAX,
                                           10 * USEC_PER_MSEC, on_stop_timer, m);
        if (r < 0)
                log_warning_errno(r, "Failed to bound the wait for grants being written: %m");
}

/* ---- the handover to the next brokerd (handover.h) ---- */

static bool manager_granting(Manager *m) {
        list_foreach(n, &m->sessions.sessions)
                if (container_of(n, Session, node)->acquire.pending)
                        return true;
        return false;
}

/* One session into h, or nothing (it stays: closed as for a plain stop). */
static int manager_export_session(Session *s, Handover *h) {
        HandoverConnection *c;
        ConnectionState cs;
        int r = handover_add_connection(h, &c);
        if (r < 0)
                return r;
        r = session_export(s, &c->acquire, &c->has_acquire);
        if (r >= 0)
                r = connection_export(s->connection, &cs);
        struct stat st;
        if (r >= 0 && fstat(cs.fd, &st) < 0) {
                r = negative_errno();
                free(cs.input);
                free(cs.output);
        }
        if (r < 0) {
                if (r != -EBUSY)
                        log_debug_errno(r, "Connection of pid %d cannot be handed over: %m", (int) s->cred.pid);
                handover_acquire_done(&c->acquire);
                h->n_connections--;
                return r;
        }
        c->ino = st.st_ino;
        c->dev = st.st_dev;
        c->peer_since = connection_get_peer_since(s->connection);
        c->input = cs.input;
        c->n_input = cs.n_input;
        c->output = cs.output;
        c->n_output = cs.n_output;
        c->fd = cs.fd; /* borrowed: the connection's until session_handed_over() */
        return 0;
}

static void manager_hand_over(Manager *m) {
        _cleanup_(handover_done) Handover h = {};
        _cleanup_free_ Session **handed = calloc(MAX(m->sessions.n_sessions, 1u), sizeof(Session *));
        size_t n_waiting = 0, n_holding = 0;
        int r = handed ? 0 : -ENOMEM;

        m->handing_over = false;
        m->stop_timer = sd_event_source_disable_unref(m->stop_timer);
        usec_t now = now_monotonic();
        for (size_t i = 0; r >= 0 && i < engine_pool_count(m->engine); i++) {
                EnginePoolInfo info;
                usec_t last_fast;
                if (engine_pool_info(m->engine, i, now, &info) >= 0 &&
                    engine_pool_get_last_fast(m->engine, info.name, &last_fast) >= 0)
                        r = handover_add_pool(&h, info.name, last_fast);
        }
        list_foreach(n, &m->sessions.sessions) {
                if (r < 0)
                        break;
                Session *s = container_of(n, Session, node);
                int k = manager_export_session(s, &h);
                if (k == -ENOMEM)
                        r = k;
                else if (k >= 0)
                        handed[h.n_connections - 1] = s;
        }
        if (r >= 0)
                r = handover_send(&h, now);
        for (size_t i = 0; i < h.n_connections; i++)
                h.connections[i].fd = -EBADF; /* the sessions' */
        if (r < 0) {
                log_warning_errno(r, "Could not hand the connections to systemd's fd store, closing them: %m. "
                                     "Waiting `slotctl run` jobs queue again (--reclaim-for).");
                manager_stop_closing(m);
                return;
        }
        for (size_t i = 0; i < h.n_connections; i++) {
                if (h.connections[i].has_acquire)
                        *(h.connections[i].acquire.lease ? &n_holding : &n_waiting) += 1;
                session_handed_over(handed[i]);
        }
        log_full_errno(h.n_connections > 0 ? LOG_INFO : LOG_DEBUG, 0,
                       "Handed %zu connection(s) to systemd's fd store: %zu waiting, %zu holding a lease.",
                       h.n_connections, n_waiting, n_holding);
        manager_stop_closing(m);
}

/* Holders first (their leases are back before anyone is granted), then the rest, then the waiters in their
 * old queue order. */
static int connection_resume_order(const void *a, const void *b) {
        const HandoverConnection *x = a, *y = b;
        int rx = !x->has_acquire ? 1 : x->acquire.lease ? 0 : 2, ry = !y->has_acquire ? 1 : y->acquire.lease ? 0 : 2;
        if (rx != ry)
                return rx < ry ? -1 : 1;
        if (rx != 2)
                return 0;
        if (x->acquire.position != y->acquire.position)
                return x->acquire.position < y->acquire.position ? -1 : 1;
        return x->acquire.arrival < y->acquire.arrival ? -1 : x->acquire.arrival > y->acquire.arrival;
}

static const char *handover_error_reason(int error) {
        switch (error) {
        case -ENODATA:
                return "no state came with them";
        case -EBADMSG:
                return "the state is damaged or cut short";
        case -EPROTONOSUPPORT:
                return "the state is in a format this brokerd does not know";
        case -ESTALE:
                return "the state is from another boot";
        default:
                return "the state cannot be read";
        }
}

/* Before anyone is served, after the leases were restored: what the previous brokerd handed over. */
static void manager_take_back(Manager *m) {
        _cleanup_(handover_done) Handover h = {};
        HandoverLoad load;
        if (m->handover_fds.n_states + m->handover_fds.n_connections == 0) {
                lease_table_end_not_taken_back(&m->leases);
                return;
        }
        int r = handover_load(&m->handover_fds, now_monotonic(), &h, &load);
        if (r < 0) {
                log_error_errno(r, "Failed to take back the connections of the fd store: %m");
                handover_fds_done(&m->handover_fds);
                lease_table_end_not_taken_back(&m->leases);
                return;
        }
        if (load.error < 0)
                log_warning_errno(load.error, "The previous brokerd's connections cannot be resumed: %s (%m). "
                                              "%zu closed; their `slotctl run` jobs queue again.",
                                  handover_error_reason(load.error), load.closed);
        for (size_t i = 0; i < h.n_pools; i++)
                (void) engine_pool_set_last_fast(m->engine, h.pools[i].name, h.pools[i].last_fast, now_monotonic());

        if (h.n_connections > 0)
                qsort(h.connections, h.n_connections, sizeof(HandoverConnection), connection_resume_order);
        size_t n_waiting = 0, n_holding = 0, n_closed = load.closed;
        for (size_t i = 0; i < h.n_connections; i++) {
                HandoverConnection *c = &h.connections[i];
                Session *s = NULL;
                r = manager_connection_new(m, TAKE_FD(c->fd), NULL, &s);
                if (r >= 0 && c->peer_since > 0) /* the peer ran by then: a pid reused since is not it */
                        connection_set_peer_since(s->connection, c->peer_since);
                if (r >= 0)
                        r = connection_restore(s->connection, c->input, c->n_input, c->output, c->n_output);
                if (r >= 0 && c->has_acquire)
                        r = session_resume(s, &c->acquire);
                /* A lease whose command ended while brokerd was down is restored for its connection
                 * (lease_restore()): only a lease the log does not have is not its own here. */
                if (r < 0)
                        log_warning_errno(r, "The connection of pid %d handed over cannot be resumed (%s); closing it, "
                                             "its client queues again or reclaims.",
                                          s ? (int) s->cred.pid : 0,
                                          r == -EPERM   ? "the lease it names is not its own in the lease log"
                                          : r == -EBUSY ? "its lease was taken back by another connection"
                                          : r == -ENOENT ? "its command is gone"
                                                         : strerror(-r));
                if (r < 0) {
                        n_closed++;
                        if (s)
                                session_close(s);
                        handover_connection_done(c);
                        continue;
                }
                if (c->has_acquire)
                        *(c->acquire.lease ? &n_holding : &n_waiting) += 1;
                connection_resume(s->connection);
                /* Its memory goes back before the next session is made, which can reuse it: the heap does not
                 * grow by the state on top of the sessions. */
                handover_connection_done(c);
                /* The engine's events (a QUEUED per waiter) are handed on as they come, as when the waiters
                 * arrived one by one: 10,000 at once would grow its event queue for good. */
                if (i % 64 == 63)
                        manager_drain(m);
        }
        log_info("Took back %zu connection(s) from systemd's fd store: %zu waiting, %zu holding a lease; %zu closed.",
                 h.n_connections + load.closed - n_closed, n_waiting, n_holding, n_closed);
        /* A lease restored for its connection alone (its command ended) that did not come back ends now. */
        lease_table_end_not_taken_back(&m->leases);
        /* The state's text and its parse were the size of every connection's state at once: give it back, or
         * the heap stays twice what the connections need (bench-handover, 10,000 waiters: 15 → 31 MiB; with
         * the trim, the entries freed one by one and the engine's events drained as they come, +1-2 %). */
        (void) malloc_trim(0);
}

/* ---- STATUS=, watchdog, tick ---- */

static void manager_load_state_async(Manager *m);
static void manager_load_state(Manager *m, bool at_start);
static void manager_write_lease_snapshot(Manager *m);
static void manager_apply_uses(Manager *m);

static void manager_update_status(Manager *m) {
        char buf[1024];
        size_t len = 0;
        usec_t now = now_monotonic();

        m->status_dirty = false;
        m->leases.changed = false;
        m->sessions.changed = false;
        for (size_t i = 0; i < engine_pool_count(m->engine) && len < sizeof buf - 64; i++) {
                EnginePoolInfo info;
                if (engine_pool_info(m->engine, i, now, &info) < 0)
                        continue;
                /* A shared pool's in use and waiting are this node's; its backend's state is what an operator
                 * looking at systemctl status needs first. */
                int k = snprintf(buf + len, sizeof buf - len, "%s%s %u/%u in use, %zu waiting%s%s%s%s", i ? "; " : "",
                                 info.name, info.in_use, info.limit, info.waiting, info.congested ? ", congested" : "",
                                 info.drained ? ", drained" : "",
                                 info.remote && !info.backend_up ? ", backend " : "",
                                 info.remote && !info.backend_up ? info.unavailable ?: "down" : "");
                if (k < 0 || (size_t) k >= sizeof buf - len)
                        break;
                len += (size_t) k;
        }
        (void) sd_notifyf(false, "STATUS=%s", len ? buf : "no pools");
}

/* How often the lease log gets an alive mark. */
static usec_t manager_alive_interval(const Manager *m) {
#if HAVE_REDIS
        if (m->backends.n_backends > 0)
                return TICK_USEC;
#endif
        return LEASE_LOG_ALIVE_INTERVAL;
}

/* Whether the tick has nothing to do but keep time: no connection, no lease, nothing to report or retry. Asked
 * at the tick's end, after STATUS= went (a later change wakes the tick: manager_status_changed()). */
static bool manager_is_idle(const Manager *m) {
        return m->sessions.n_sessions == 0 && m->leases.n_leases == 0 && m->refused_unlogged == 0 &&
               m->persistence.state_loaded && !m->persistence.damaged &&
               !(m->lease_log && lease_log_is_broken(m->lease_log)) && audit_is_idle(&m->audit);
}

/* An idle brokerd sleeps until what it must do next (the metrics textfile, exit-idle-after=), a minute at most:
 * a fleet of idle runners otherwise woke once a second each for nothing, and wrote an alive mark to disk
 * each time (tests/bench/README.md, "Stop 63"). What makes it busy again wakes the tick (manager_wake_tick()). */
static usec_t manager_next_tick(const Manager *m, usec_t now) {
        if (!manager_is_idle(m))
                return now + TICK_USEC;
        usec_t next = now + IDLE_TICK_MAX_USEC;
        if (m->config->metrics_textfile)
                next = MIN(next, m->metrics.last_textfile + METRICS_TEXTFILE_INTERVAL);
        if (!m->socket_bound_here && m->config->exit_idle_after != USEC_INFINITY)
                next = MIN(next, usec_add(m->idle_since, m->config->exit_idle_after));
        return MAX(next, now + TICK_USEC);
}

static int on_tick(sd_event_source *s, uint64_t usec, void *userdata) {
        Manager *m = userdata;

        audit_tick(&m->audit);
        if (m->refused_unlogged > 1)
                log_warning("Connection limit reached: %u more connections refused.", m->refused_unlogged - 1);
        m->refused_unlogged = 0;
        if (m->config->metrics_textfile && now_monotonic() - m->metrics.last_textfile >= METRICS_TEXTFILE_INTERVAL) {
                m->metrics.last_textfile = now_monotonic();
                MetricsGauges g;
                manager_metrics_gauges(m, &g);
                metrics_write_textfile(&m->metrics, &g, m->config->metrics_textfile);
        }
        lease_table_poll_commands(&m->leases);
        if (m->persistence.state_loaded && m->persistence.damaged)
                manager_check_damage(m);
        if (!m->persistence.state_loaded && now_monotonic() >= m->state_retry_at)
                manager_load_state(m, false);
        else if (m->lease_log && lease_log_is_broken(m->lease_log) && now_monotonic() >= m->lease_log_retry_at)
                manager_write_lease_snapshot(m);
        else if (m->lease_log && m->leases.n_leases > 0 && now_monotonic() >= m->lease_log_alive_at) {
                /* A restart bounds a restored max-hold by this mark, whatever the wall clock says then. Leases
                 * restored into shared pools fence from it until a heartbeat is acknowledged: with marks 10 s
                 * apart a restart within a short backend-node-ttl would find the deadline passed and revoke
                 * them at once, so a mark every tick while there are shared pools. Only while a lease is
                 * held: nothing else reads it, and a lease's own line is a mark (its grantedAt, read as one
                 * by lease_log_read()) until the next tick's. */
                m->lease_log_alive_at = now_monotonic() + manager_alive_interval(m);
                (void) lease_log_alive(m->lease_log, now_realtime());
        }
        if (m->status_dirty || m->leases.changed || m->sessions.changed)
                manager_update_status(m);

        /* exit-idle-after= (SPEC §8): only under socket activation, where the next client starts us again,
         * and only with no connection and no lease (waiters have connections). */
        usec_t now = now_monotonic();
        if (m->sessions.n_sessions > 0 || m->leases.n_leases > 0 || m->socket_bound_here)
                m->idle_since = now;
        else if (!m->stopping && m->config->exit_idle_after != USEC_INFINITY &&
                 now - m->idle_since >= m->config->exit_idle_after) {
                log_info("Idle for %s: exiting; the socket stays with systemd.",
                         timespan_format((char[TIMESPAN_MAX]) {}, TIMESPAN_MAX, m->config->exit_idle_after));
                manager_stop(m);
        }
        (void) sd_event_source_set_time(s, manager_next_tick(m, now));
        return 0;
}

static int on_watchdog(sd_event_source *s, uint64_t usec, void *userdata) {
        Manager *m = userdata;
        (void) sd_notify(false, "WATCHDOG=1");
        (void) sd_event_source_set_time_relative(s, m->watchdog_usec / 2);
        return 0;
}

/* ---- reload ---- */

/* Whether two configurations of a pool keep it in the same place: the engine's pool identity (no backend,
 * or the same backend and credentials). */
static bool pool_kept_alike(const PoolConfig *a, const PoolConfig *b) {
        return streq_ptr(a->backend, b->backend) && streq_ptr(a->backend_user, b->backend_user) &&
               streq_ptr(a->backend_password_file, b->backend_password_file) &&
               streq_ptr(a->backend_sentinel_password_file, b->backend_sentinel_password_file);
}

static const PoolConfig *config_pool(const BrokerConfig *c, const char *name) {
        for (size_t i = 0; i < c->n_pools; i++)
                if (streq(c->pools[i]->name, name))
                        return c->pools[i];
        return NULL;
}

/* A move that the engine cannot make now, as a configuration error: the reload is refused whole. */
static int reload_refuse_move(Manager *m, const BrokerConfig *c, ConfErrors *errors) {
        EngineMoveRefusal mr;
        int r = engine_check_moves(m->engine, c, &mr);
        if (r != -EBUSY)
                return r;
        return conf_errors_add(errors, &mr.pool->source, "backend",
                               "pool %s cannot move to another backend or other credentials while this node "
                               "holds %u slots and %zu waiters in it%s (they would be heartbeated twice on one "
                               "Redis); drain it here (slotctl drain %s), let its leases end, and reload again",
                               mr.pool->name, mr.in_use, mr.waiting,
                               mr.owes ? ", or owes Redis a release" : "", mr.pool->name);
}

/* A revoke-grace= that a shared pool's self-fence has no room for, as a configuration error: the reload is
 * refused whole. conf.c checks it against each pool's backend-node-ttl=, but until Redis agreed to a changed
 * one the fence counts with the shorter of the two (Redis drops a silent node by its stored TTL), and a pool
 * the reload removes keeps its own: applied, the reload would revoke their leases at once. */
static int reload_refuse_grace(Manager *m, const BrokerConfig *c, ConfErrors *errors) {
#if HAVE_REDIS
        BackendGraceRefusal gr;
        if (!backend_table_grace_refused(&m->backends, c, &gr))
                return 0;
        char ttl[TIMESPAN_MAX], grace[TIMESPAN_MAX], least[TIMESPAN_MAX];
        return conf_errors_add(errors, NULL, "revoke-grace",
                               "revoke-grace=%s leaves pool %s no time to fence its leases: the backend-node-ttl= "
                               "this node counts with there is %s until Redis agrees to another one, and must be "
                               "at least revoke-grace + 5s (%s); raise backend-node-ttl= on every node first, and "
                               "revoke-grace= once the pool serves again",
                               timespan_format(grace, sizeof grace, c->revoke_grace), gr.pool,
                               timespan_format(ttl, sizeof ttl, gr.fence_ttl),
                               timespan_format(least, sizeof least,
                                               usec_add(usec_add(c->revoke_grace, SHARED_FENCE_SLACK),
                                                        CONF_NODE_TTL_WINDOW_MIN)));
#else
        return 0;
#endif
}

/* Pools whose backend= (or credentials) this reload changes: the journal tells where each holder stays. */
static void reload_log_moves(Manager *m, const BrokerConfig *old, const BrokerConfig *c,
                             const unsigned *old_in_use) {
        for (size_t i = 0; i < old->n_pools; i++) {
                const PoolConfig *was = old->pools[i], *now = config_pool(c, was->name);
                if (!now || pool_kept_alike(was, now))
                        continue;
                audit_pool_moved(&m->audit, was->name, was->backend ?: "local", now->backend ?: "local",
                                 old_in_use[i]);
        }
}

/* Pools this reload removes while this node holds slots in them: the holders finish there, counted by no pool of
 * the new configuration and shown in Status's holders only. A rename is such a removal. */
static void reload_log_removed(const BrokerConfig *old, const BrokerConfig *c, const unsigned *old_in_use) {
        for (size_t i = 0; i < old->n_pools; i++)
                if (old_in_use[i] > 0 && !config_pool(c, old->pools[i]->name))
                        log_notice("Pool %s was removed with %u slot(s) held: they stay held until their leases end, "
                                   "and no pool of the new configuration counts them.",
                                   old->pools[i]->name, old_in_use[i]);
}

static bool engine_still_rests(const char *pool, unsigned slot, const char *member, void *userdata) {
        Manager *m = userdata;
        for (size_t i = 0; i < engine_pool_count(m->engine); i++) {
                EnginePoolInfo info;
                if (engine_pool_info(m->engine, i, now_monotonic(), &info) < 0 || !streq(info.name, pool))
                        continue;
                for (size_t k = 0; k < info.n_resting; k++)
                        if (member ? streq_ptr(info.resting[k].member, member)
                                   : !info.resting[k].member && info.resting[k].index == slot)
                                return true;
                return false;
        }
        return false;
}

int manager_reload(Manager *m, ConfErrors *errors) {
        _cleanup_(conf_freep) BrokerConfig *c = NULL;
        LaneAcl *acls = NULL;
        size_t n_acls = 0;

        if (m->stopping) {
                /* What is being handed over or given back to Redis stays as the stop found it, and systemd hears
                 * no RELOADING=1/READY=1 after STOPPING=1: the next start reads the file anyway. */
                audit_reload(&m->audit, false, "brokerd is stopping");
                return conf_errors_add(errors, NULL, NULL,
                                       "brokerd is stopping; its next start reads the configuration");
        }

        /* MONOTONIC_USEC= is what Type=notify-reload (systemd 253) matches to the SIGHUP it sent; older managers
         * ignore it. */
        (void) sd_notifyf(false, "RELOADING=1\nMONOTONIC_USEC=%" PRIu64 "\nSTATUS=Reloading configuration…",
                          (uint64_t) now_monotonic());
        _cleanup_free_ unsigned *old_in_use = calloc(MAX(m->config->n_pools, (size_t) 1), sizeof(unsigned));
        int r = old_in_use ? config_load(m->config_path, &c, errors) : -ENOMEM;
        if (r >= 0 && c->embedded_default && !m->config->embedded_default)
                /* A start without any file runs the embedded default; a reload that finds none is more likely a
                 * file moved or being rewritten than a wish to remove every pool and refuse every waiter. */
                r = conf_errors_add(errors, NULL, NULL,
                                    "no configuration file found (%s, nor any *.conf in %s.d/); the running "
                                    "configuration stays (a restart would run the embedded default)",
                                    m->config_path ?: CONFIG_MAIN_PATH, m->config_path ?: CONFIG_MAIN_PATH);
        if (r >= 0)
                r = reload_refuse_move(m, c, errors);
        if (r >= 0)
                r = reload_refuse_grace(m, c, errors);
        if (r >= 0)
                r = acls_resolve(c, &acls, &n_acls, errors);
        MemberStateEntry *leaving = NULL;
        size_t n_leaving = 0;
        if (r >= 0) {
                for (size_t i = 0; i < m->config->n_pools; i++) {
                        EnginePoolInfo info;
                        if (engine_pool_info(m->engine, i, now_monotonic(), &info) >= 0)
                                old_in_use[i] = info.in_use;
                }
                r = member_state_leaving(m, c, &leaving, &n_leaving);
                if (r >= 0)
                        r = engine_configure(m->engine, c, now_monotonic());
                if (r < 0) {
                        member_state_entries_free(leaving, n_leaving);
                        acls_free(acls, n_acls);
                }
        }
        if (r < 0) {
                (void) sd_notify(false, "READY=1");
                log_error_errno(r, "Reloading the configuration failed; the old one stays: %m");
                _cleanup_free_ char *detail = errors->n_errors > 0 ? conf_error_to_string(&errors->errors[0]) : NULL;
                audit_reload(&m->audit, false, detail ?: strerror(-r));
                manager_status_changed(m);
                return r;
        }
        if (!streq_ptr(c->socket_path, m->config->socket_path))
                log_notice("socket= changed; it takes effect when brokerd restarts.");
        if (c->lease_persistence != m->persistence.mode)
                log_notice("lease-persistence= changed; it takes effect when brokerd restarts.");
        /* Both belong to the history's writer thread and the state directory's files, set up once. */
        if (!streq_ptr(c->state_directory, m->config->state_directory))
                log_notice("state-directory= changed; it takes effect when brokerd restarts.");
        if (c->history_retention != m->config->history_retention)
                log_notice("history-retention= changed; it takes effect when brokerd restarts.");
#if HAVE_REDIS
        if (m->node_loaded && !streq_ptr(c->node_name, m->config->node_name))
                log_notice("node-name= changed; shared pools show the new name when brokerd restarts.");
#endif
        reload_log_moves(m, m->config, c, old_in_use);
        reload_log_removed(m->config, c, old_in_use);
        /* Rests a reload ended (cooldown= removed, a member gone) are not brought back by a restart. */
        if (m->lease_log && lease_log_rests_end(m->lease_log, engine_still_rests, m, now_realtime()) < 0)
                log_oom();
        acls_free(m->acls, m->n_acls);
        m->acls = acls;
        m->n_acls = n_acls;
        conf_free(m->config);
        m->config = TAKE_PTR(c);
        m->sessions.config = m->config;
        m->methods.config = m->config;
        manager_apply_settings(m);
        manager_apply_token_floor_all(m);
        if (n_leaving > 0)
                member_pending_take(m, leaving, n_leaving);
        free(leaving);
        if (m->n_member_pending > 0) {
                /* Drains and quarantines of pools or members this configuration may bring back. */
                MemberStateEntry *pending = TAKE_PTR(m->member_pending);
                size_t n_pending = m->n_member_pending;
                m->n_member_pending = 0;
                manager_apply_member_state(m, pending, n_pending);
                member_state_entries_free(pending, n_pending);
        }
        manager_apply_uses(m); /* the counts of members this configuration brings back */
        /* A user taken off a lane's allow-users= (or a pool's admin-users=) is not granted later what it queued for
         * before. */
        unsigned denied = session_table_withdraw_denied(&m->sessions);
        if (denied > 0)
                log_notice("Refused %u waiting request(s) whose user the new access lists leave out.", denied);
        char detail[128];
        snprintf(detail, sizeof detail, "%zu pools, %zu lanes", m->config->n_pools, m->config->n_lanes);
        log_info("Configuration reloaded: %s.", detail);
        audit_reload(&m->audit, true, detail);
        (void) sd_notify(false, "READY=1");
        manager_update_status(m);
        manager_wake_tick(m); /* metrics-textfile= or exit-idle-after= may be due sooner */
        return 0;
}

static int on_sighup(sd_event_source *s, const struct signalfd_siginfo *si, void *userdata) {
        Manager *m = userdata;
        ConfErrors errors = {};
        if (manager_reload(m, &errors) < 0)
                log_conf_errors(&errors);
        conf_errors_done(&errors);
        return 0;
}

static int on_exit_signal(sd_event_source *s, const struct signalfd_siginfo *si, void *userdata) {
        Manager *m = userdata;
        if (m->stopping) {
                log_info("Received SIG%s again, exiting now.", sigabbrev_np((int) si->ssi_signo) ?: "?");
                return sd_event_exit(m->event, 0);
        }
        log_info("Received SIG%s, exiting.", sigabbrev_np((int) si->ssi_signo) ?: "?");
        manager_stop(m);
        return 0;
}

/* ---- the listening socket ---- */

/* accept() failed for want of fds (or memory): the connection stays in the backlog and the socket
 * readable, so a level-triggered loop would spin on it (issue 9 h). The listener rests until a connection
 * closes or the timer fires, as systemd and nginx do; the episode is logged and counted once. */
static void manager_pause_accepting(Manager *m, int error) {
        if (!m->accept_starved) {
                m->accept_starved = true;
                m->metrics.accept_fd_exhausted++;
                log_warning_errno(error, "accept() failed: %m; accepting no connections until one closes.");
        }
        m->accept_paused = true;
        (void) sd_event_source_set_enabled(m->listen_source, SD_EVENT_OFF);
        (void) sd_event_source_set_time_relative(m->accept_resume_timer, ACCEPT_RESUME_USEC);
        (void) sd_event_source_set_enabled(m->accept_resume_timer, SD_EVENT_ONESHOT);
}

static void manager_resume_accepting(Manager *m) {
        if (!m->accept_paused || m->stopping)
                return;
        m->accept_paused = false;
        (void) sd_event_source_set_enabled(m->accept_resume_timer, SD_EVENT_OFF);
        (void) sd_event_source_set_enabled(m->listen_source, SD_EVENT_ON);
}

void manager_fd_released(Manager *m) {
        manager_resume_accepting(m);
}

static int on_accept_resume(sd_event_source *s, uint64_t usec, void *userdata) {
        manager_resume_accepting(userdata);
        return 0;
}

/* The closer's fds reached max-closing-fds: every connection accepted now would be one more fd, and a
 * refused one with fds in its unread messages goes to the closer too (past its user's limit: closer.h). */
static void manager_pause_accepting_for_closer(Manager *m) {
        usec_t now = now_monotonic();
        if (!m->accept_closer_paused && now >= usec_add(m->accept_closer_logged, USEC_PER_SEC)) {
                m->accept_closer_logged = now;
                /* Past the users' own limits only sockets of their refused or closed connections count: the
                 * user named is whose closes block, most likely, connecting over and over. */
                uid_t uid;
                unsigned n = closer_pending_most(&uid);
                log_warning("%u fds wait to be closed, %u of them uid %d's (max-closing-fds); accepting no connections until fewer do.",
                            closer_pending(), n, (int) uid);
        }
        m->accept_closer_paused = true;
        (void) sd_event_source_set_enabled(m->listen_source, SD_EVENT_OFF);
}

/* The closer's threads closed what was at a limit: read from those who waited, accept again. */
static int on_closer_below(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        closer_notify_clear();
        manager_closer_below(userdata);
        return 0;
}

static int manager_connection_new(Manager *m, int fd, const struct ucred *cred, Session **ret) {
        const ConnectionLimits limits = {
                .max_message = m->config->max_message_size,
                .max_output = m->config->max_output_per_connection,
        };
        Connection *c;
        int r = connection_new(m->poller, fd, cred, &limits, &c);
        if (r < 0)
                return r;
        manager_wake_tick(m);
        return session_new(&m->sessions, c, methods_on_call, methods_on_disconnect, ret);
}

int manager_add_connection(Manager *m, int fd, const struct ucred *cred) {
        Session *s;
        return manager_connection_new(m, fd, cred, &s);
}

static bool errno_is_fd_shortage(int e) {
        return e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM;
}

static bool manager_at_connection_limit(Manager *m, const UidUsage *u) {
        return m->sessions.n_sessions >= m->config->max_connections ||
               (u && u->connections >= m->config->max_connections_per_uid);
}

static int on_accept(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        Manager *m = userdata;
        bool added = false;

        for (int i = 0; i < ACCEPTS_PER_WAKEUP; i++) {
                if (closer_total_over()) {
                        manager_pause_accepting_for_closer(m);
                        break;
                }
                int cfd = accept4(fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
                if (cfd < 0) {
                        if (errno_is_fd_shortage(errno))
                                manager_pause_accepting(m, errno);
                        else if (errno == EAGAIN && m->accept_starved) {
                                /* The backlog is drained: the episode is over. */
                                m->accept_starved = false;
                                log_info("Accepting connections again: every waiting one was taken.");
                        } else if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
                                log_warning_errno(errno, "accept() failed: %m");
                        break;
                }
                struct ucred cred;
                socklen_t len = sizeof cred;
                /* A refused socket goes to the closer: messages queued unread in it may carry fds. */
                if (getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
                        closer_close(cfd);
                        continue;
                }
                UidUsage *u = session_table_uid_usage(&m->sessions, cred.uid, false);
                if (manager_at_connection_limit(m, u)) {
                        /* Before refusing: connections whose clients hung up, ready in the same wakeup, are
                         * closed first (a client that closes one connection and opens another is not over). */
                        poller_run(m->poller);
                        u = session_table_uid_usage(&m->sessions, cred.uid, false);
                }
                if (manager_at_connection_limit(m, u)) {
                        /* Refused before any call, so there is nobody to answer: the client sees EOF. A storm
                         * gets its first line now and a count once a second (on_tick), not a line each. */
                        if (m->refused_unlogged++ == 0) {
                                log_warning("Connection limit reached (uid %d); refusing a connection.",
                                            (int) cred.uid);
                                manager_wake_tick(m);
                        }
                        m->metrics.connections_refused++;
                        (void) shutdown(cfd, SHUT_RDWR); /* EOF now */
                        closer_close_socket(cfd, cred.uid);
                        continue;
                }
                int r = manager_add_connection(m, cfd, &cred);
                if (r < 0)
                        log_warning_errno(r, "Failed to set up a connection: %m");
                else
                        added = true;
        }
        /* A client sends its first call as soon as it is connected (slotctl's Acquire is usually queued by
         * now): read it in this wakeup rather than in the loop's next iteration, which costs an epoll_wait
         * and sd-event's bookkeeping on the grant's path. The poller takes every ready connection in the
         * order they became ready, so older ones (a Release sent before this client connected) go first. */
        if (added)
                poller_run(m->poller);
        manager_status_changed(m);
        return 0;
}

/* The listening socket, and into handover what the previous brokerd left in the fd store. */
static int socket_take_from_systemd(HandoverFds *handover) {
        char **names = NULL;
        int n = sd_listen_fds_with_names(true, &names);
        if (n <= 0) {
                free(names);
                return n < 0 ? n : -ENOENT;
        }
        /* What the previous brokerd stored is recognised by its names first: without a socket unit, a start
         * after an idle stop gets the state alone, which is no socket to listen on. */
        int n_other = 0;
        for (int i = 0; i < n; i++)
                if (handover_fds_take(handover, names[i], SD_LISTEN_FDS_START + i))
                        names[i] = mfree(names[i]);
                else
                        n_other++;
        int fd = -ENOENT;
        for (int i = 0; i < n; i++) {
                if (!names[i])
                        continue;
                if (fd < 0 && (streq(names[i], "varlink") || n_other == 1))
                        fd = SD_LISTEN_FDS_START + i;
                else
                        safe_close(SD_LISTEN_FDS_START + i); /* not ours to serve */
                free(names[i]);
        }
        free(names);
        /* systemd passes the socket as the unit says (blocking by default): accept() must never wait. */
        if (fd >= 0) {
                int flags = fcntl(fd, F_GETFL);
                if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
                        return log_error_errno(errno, "Failed to make the passed socket non-blocking: %m");
        }
        return fd;
}

static int socket_bind_path(const char *path) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        if (strlen(path) >= sizeof sa.sun_path)
                return -ENAMETOOLONG;
        strcpy(sa.sun_path, path);

        int r = mkdir_parents(path, 0755);
        if (r < 0)
                return r;
        _cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return negative_errno();
        if (bind(fd, (struct sockaddr *) &sa, sizeof sa) < 0) {
                if (errno != EADDRINUSE)
                        return negative_errno();
                /* A socket file is there: if somebody answers on it, another broker runs; else it is stale. */
                _cleanup_close_ int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
                if (probe >= 0 && connect(probe, (struct sockaddr *) &sa, sizeof sa) == 0)
                        return -EADDRINUSE;
                if (unlink(path) < 0 && errno != ENOENT)
                        return negative_errno();
                if (bind(fd, (struct sockaddr *) &sa, sizeof sa) < 0)
                        return negative_errno();
        }
        /* As systemd's SocketMode= default: who may connect is the lanes' ACLs' business. */
        if (chmod(path, 0666) < 0)
                return negative_errno();
        if (listen(fd, SOMAXCONN) < 0)
                return negative_errno();
        return TAKE_FD(fd);
}

static char *default_socket_path(void) {
        const char *e = getenv("RUNTIME_DIRECTORY");
        char *p = NULL;
        if (e && *e) {
                /* systemd may list several directories, separated by colons: ours is the first. */
                size_t len = strcspn(e, ":");
                return asprintf(&p, "%.*s/io.slotbroker", (int) len, e) < 0 ? NULL : p;
        }
        if (getuid() == 0)
                return strdup("/run/brokerd/io.slotbroker");
        e = getenv("XDG_RUNTIME_DIR");
        int r = e && *e ? asprintf(&p, "%s/brokerd/io.slotbroker", e)
                        : asprintf(&p, "/run/user/%d/brokerd/io.slotbroker", (int) getuid());
        return r < 0 ? NULL : p;
}

static void audit_ended_while_down(Manager *m, const HistoryLeaseRow *row, const char *reason) {
        AuditRecord rec = AUDIT_RECORD_INIT;
        rec.decision = "released";
        rec.pool = row->pool;
        rec.lane = row->lane;
        rec.job = row->job;
        rec.lease = row->id;
        rec.token = row->token;
        rec.uid = row->uid;
        rec.pid = row->pid;
        rec.reason = reason;
        /* its members, as a release while up names them (usage per member, SPEC §3.6) */
        char members[LEASE_ALSO_TEXT_MAX];
        size_t used = 0;
        members[0] = 0;
        for (unsigned i = 0; row->members && i < row->n_slots; i++) {
                if (!row->members[i])
                        continue;
                int k = snprintf(members + used, sizeof members - used, "%s%s", used > 0 ? "," : "", row->members[i]);
                if (k < 0 || (size_t) k >= sizeof members - used)
                        break;
                used += (size_t) k;
        }
        members[used] = 0;
        rec.member = used > 0 ? members : NULL;
        audit_decision(&m->audit, &rec);
        rec.member = NULL; /* the further pools' members are theirs */
        for (size_t i = 0; i < row->n_also; i++) {
                /* an all-or-nothing lease: a row for each further pool, linked by the lease id */
                rec.pool = row->also[i].pool;
                rec.token = row->also[i].token;
                audit_decision_share(&m->audit, &rec);
        }
}

/* History came back (or failed): a read of history.db that an older brokerd's leases wait for may now work. */
static void on_history_health(History *h, bool healthy, void *userdata) {
        Manager *m = userdata;
        if (!m->persistence.state_loaded)
                manager_load_state(m, false); /* it may be readable now: no need to wait for the next retry */
}

/* The lease log takes every live lease afresh (at start, and to mend it after writes failed). */
static void manager_write_lease_snapshot(Manager *m) {
        int r = lease_table_write_snapshot(&m->leases);
        if (r < 0) {
                if (r != m->lease_log_error)
                        log_error_errno(r, "Cannot write the leases to %s/" LEASE_LOG_FILE ": %m. Retrying every %us.",
                                        m->state_directory, (unsigned) (STATE_RETRY_USEC / USEC_PER_SEC));
                m->lease_log_error = r;
                m->lease_log_retry_at = now_monotonic() + STATE_RETRY_USEC;
                return;
        }
        if (m->lease_log_error < 0)
                log_info("The leases are written to %s/" LEASE_LOG_FILE " again (%u live).", m->state_directory,
                         m->leases.n_leases);
        m->lease_log_error = 0;
        persistence_recovered(&m->persistence);
}

/* Fencing tokens continue above their high-water marks, and leases that still have a holder take their
 * old slots again. Nothing has been granted before this (persistence_refusal()), so nothing conflicts.
 * from_history: the state came from history.db, where brokerd kept leases before the lease log: once the
 * log has them, they go from there. */
/* Slots that rested when the last brokerd stopped (cooldown=, SPEC §3.6) rest on for what is left of their rest,
 * at most the pool's cooldown now (engine_pool_rest()); the log keeps those that still do for its snapshots. */
static void manager_apply_rests(Manager *m, const LeaseLogRest *rests, size_t n) {
        usec_t now_m = now_monotonic(), now_r = now_realtime();
        unsigned kept = 0;
        for (size_t i = 0; i < n; i++) {
                const LeaseLogRest *rs = &rests[i];
                if (rs->until <= now_r)
                        continue;
                if (engine_pool_rest(m->engine, rs->pool, rs->member, rs->slot, now_m + (rs->until - now_r), now_m) < 0)
                        continue;
                if (m->lease_log)
                        (void) lease_log_rest(m->lease_log, rs->pool, rs->slot, rs->member, rs->until);
                kept++;
        }
        if (kept > 0)
                log_info("%u slot(s) rest on after the restart (cooldown=).", kept);
}

/* Members' counts (SPEC §3.6, usage per member; lease log "use" records) as the lease log last had them: the
 * metrics and the failures in a row go on across a restart. Absolute, so applied again after what counts anew
 * at start (restored leases' grants, quarantines read again from members.state) and after a reload that
 * brings a member back; a member not configured now keeps its counts in the log. */
static void manager_apply_uses(Manager *m) {
        size_t n;
        const LeaseLogUse *u = m->lease_log ? lease_log_uses(m->lease_log, &n) : NULL;
        for (size_t i = 0; u && i < n; i++)
                (void) engine_member_set_use(m->engine, u[i].pool, u[i].member,
                                             &(EngineMemberUse) { .grants = u[i].grants, .held = u[i].held,
                                                                  .quarantines = u[i].quarantines,
                                                                  .failures = u[i].failures });
}

/* A member's held time of a lease that ended while brokerd was down (lease_row_ended_at()), added to the counts
 * the lease log read, which manager_apply_uses() then applies (absolute): its grant was counted when it was
 * granted, its release never came. Out of memory: not counted. */
static void uses_add_held(LeaseLogUse **uses, size_t *n, const char *pool, const char *member, usec_t held) {
        if (!member)
                return;
        for (size_t i = 0; i < *n; i++)
                if (streq((*uses)[i].pool, pool) && streq((*uses)[i].member, member)) {
                        (*uses)[i].held = usec_add((*uses)[i].held, held);
                        return;
                }
        /* No record (a lost line): this lease's grant and its time. */
        LeaseLogUse *a = reallocarray(*uses, *n + 1, sizeof(LeaseLogUse));
        if (!a)
                return;
        *uses = a;
        a[*n] = (LeaseLogUse) { .pool = strdup(pool), .member = strdup(member), .grants = 1, .held = held };
        if (!a[*n].pool || !a[*n].member) {
                free(a[*n].pool);
                free(a[*n].member);
                return;
        }
        (*n)++;
}

static void uses_add_ended(LeaseLogUse **uses, size_t *n, const HistoryLeaseRow *row, usec_t alive_at) {
        if (!uses || row->remote_id) /* a shared pool keeps no counts per member */
                return;
        usec_t held = usec_sub_unsigned(lease_row_ended_at(row, alive_at, now_realtime()), row->granted_at);
        for (unsigned i = 0; row->members && i < row->n_slots; i++)
                uses_add_held(uses, n, row->pool, row->members[i], held);
        for (size_t k = 0; k < row->n_also; k++)
                for (unsigned i = 0; row->also[k].members && i < row->also[k].n_slots; i++)
                        uses_add_held(uses, n, row->also[k].pool, row->also[k].members[i], held);
}

/* The slots of one pool of a lease that ended while brokerd was down rest (cooldown=, SPEC §3.6) from its end: a
 * detached lease's expiry (exact), else now, since when its command ended is not known and a licence server
 * keeps a seat that long after its client is gone. Recorded as any rest. A shared pool's rests are Redis's. */
static void manager_rest_ended(Manager *m, const char *pool, const unsigned *slots, char *const *members, unsigned n,
                               usec_t ended_at) {
        const PoolConfig *pc = conf_find_pool(m->config, pool);
        usec_t now_m = now_monotonic(), now_r = now_realtime();
        if (!pc || pc->backend || pc->cooldown == 0 || usec_add(ended_at, pc->cooldown) <= now_r)
                return;
        usec_t until = usec_add(ended_at, pc->cooldown);
        for (unsigned i = 0; i < n; i++) {
                const char *member = members ? members[i] : NULL;
                if (engine_pool_rest(m->engine, pool, member, slots[i], now_m + (until - now_r), now_m) >= 0 &&
                    m->lease_log)
                        (void) lease_log_rest(m->lease_log, pool, slots[i], member, until);
        }
}

static void manager_rest_ended_rows(Manager *m, const HistoryState *s, const bool *ended) {
        usec_t now_r = now_realtime();
        for (size_t i = 0; ended && i < s->n_leases; i++) {
                const HistoryLeaseRow *row = &s->leases[i];
                if (!ended[i] || row->remote_id)
                        continue;
                usec_t at = row->detached ? lease_row_ended_at(row, s->alive_at, now_r) : now_r;
                manager_rest_ended(m, row->pool, row->slots, row->members, row->n_slots, at);
                for (size_t k = 0; k < row->n_also; k++)
                        if (!row->also[k].remote_id)
                                manager_rest_ended(m, row->also[k].pool, row->also[k].slots, row->also[k].members,
                                                   row->also[k].n_slots, at);
        }
}

static void manager_apply_state(Manager *m, const HistoryState *s, bool from_history, const LeaseLogRest *rests,
                                size_t n_rests, LeaseLogUse **uses, size_t *n_uses) {
        for (size_t i = 0; i < s->n_floors; i++)
                if (streq(s->floors[i].pool, HISTORY_TOKEN_FLOOR_ALL))
                        m->token_floor_all = MAX(m->token_floor_all, s->floors[i].next_token);
                else
                        (void) engine_set_token_floor(m->engine, s->floors[i].pool, s->floors[i].next_token);
        if (m->persistence.mode == LEASE_PERSISTENCE_BEST_EFFORT)
                /* The last run may have handed out tokens it never wrote: the clock in µs is above them. */
                m->token_floor_all = MAX(m->token_floor_all, (uint64_t) now_realtime());
        manager_apply_token_floor_all(m);

        unsigned restored = 0, ended = 0;
        /* Which rows ended while brokerd was down, for their rests once the log is there (NULL on -ENOMEM: none). */
        _cleanup_free_ bool *ended_rows = s->n_leases > 0 ? calloc(s->n_leases, sizeof(bool)) : NULL;
#if HAVE_REDIS
        /* A copy of a running daemon's state directory (a host cloned from a live image, a directory copied
         * beside it): its lease log is that daemon's, whose commands this one must neither hold nor fence. */
        bool foreign = m->node_loaded && m->node.predecessor_alive;
        if (foreign && s->n_leases > 0)
                log_error("The state directory %s was last used by a brokerd that still runs (pid in %s/" NODE_INCARNATION_FILE
                          "): its %zu lease(s) are that daemon's and are not restored. Give this host its own state "
                          "directory (brokerd(8), \"Cloned hosts\").",
                          m->state_directory, m->state_directory, s->n_leases);
#else
        bool foreign = false;
#endif
        for (size_t i = 0; i < s->n_leases; i++) {
                const HistoryLeaseRow *row = &s->leases[i];
                Lease *l = NULL;
                if (foreign) {
                        ended++;
                        continue;
                }
                int r = lease_restore(&m->leases, row, s->alive_at, &l);
                if (r >= 0 && !l) { /* ended while brokerd was down: its members' held time up to its end */
                        uses_add_ended(uses, n_uses, row, s->alive_at);
                        if (ended_rows)
                                ended_rows[i] = true;
                }
                if (r < 0 || !l) {
                        audit_ended_while_down(m, row,
                                               r == -EEXIST   ? "its slot is taken by another restored lease"
                                               : r < 0        ? "could not be restored"
                                                              : "it ended while brokerd was down");
                        ended++;
                } else
                        restored++;
        }
        if (restored + ended > 0)
                log_info("Restored %u lease(s); %u ended while brokerd was down.", restored, ended);
#if HAVE_REDIS
        backend_table_set_last_alive(&m->backends, s->alive_at);
#endif

        /* The log knows every token mark read, including those of pools no lease names any more. */
        int r = lease_log_new(m->state_directory, s, m->token_floor_all, &m->lease_log);
        if (r < 0) {
                log_oom();
                return; /* nothing is granted: tried again at the next retry */
        }
        m->leases.log = m->lease_log;
        m->persistence.log = m->lease_log;
        m->persistence.state_loaded = true;
        m->state_error = 0;
        manager_apply_rests(m, rests, n_rests);
        manager_rest_ended_rows(m, s, ended_rows);
        if (uses && lease_log_adopt_uses(m->lease_log, TAKE_PTR(*uses), *n_uses) < 0) /* kept for its snapshots */
                log_oom();
        if (uses)
                *n_uses = 0;
        manager_apply_uses(m);
        manager_write_lease_snapshot(m);
        if (from_history && m->lease_log_error == 0)
                for (size_t i = 0; i < s->n_leases; i++)
                        history_lease_delete(m->history, s->leases[i].id);
        manager_check_damage(m); /* and the episodes of refusals end, unless it holds them */
}

/* SPEC §3.4: what the state directory held and could not be read is not handed to someone else. While the file
 * that records it exists nothing new is granted (held leases go on); its removal is the operator's word that
 * nothing it held is at stake. Checked at every read of the state, and every tick while it is there. */
static void manager_check_damage(Manager *m) {
        int r = state_damage_found(m->state_directory);
        bool damaged = r != 0 || m->member_state_unrecorded;

        if (r < 0)
                log_debug_errno(r, "Cannot tell whether %s/" STATE_DAMAGE_FILE " exists: %m", m->state_directory);
        if (damaged && !m->persistence.damaged)
                log_error("%s/" STATE_DAMAGE_FILE " is there: the state directory held what could not be read (leases, "
                          "drains or quarantines), and what it was is not known. Nothing new is granted until that "
                          "file is removed, once no job holds a slot or member that slotctl status does not show.",
                          m->state_directory);
        else if (!damaged && m->persistence.damaged)
                log_info("%s/" STATE_DAMAGE_FILE " was removed: granting again.", m->state_directory);
        if (damaged != m->persistence.damaged)
                manager_status_changed(m);
        m->persistence.damaged = damaged;
#if HAVE_REDIS
        /* Nor does Redis hand on what this node held and cannot name (manager_start() set it while unread). */
        backend_table_set_records_unknown(&m->backends, !m->persistence.state_loaded || damaged);
#endif
        persistence_recovered(&m->persistence);
}

/* Two brokerds on one state directory (one started by hand beside the service) would each rewrite the lease
 * log the other appends to, and grant the same slots and tokens again after the next restart: nothing of it
 * is read or written without this lock. It goes with the process (exit, crash), so a restart through the fd
 * store, which starts the next brokerd once this one is gone, takes it again. -EWOULDBLOCK: another brokerd
 * holds it (logged); other errors are the caller's, as a state directory that cannot be read. */
static int manager_lock_state(Manager *m) {
        _cleanup_free_ char *path = NULL;
        pid_t holder = 0;

        if (m->state_lock_fd >= 0)
                return 0;
        if (asprintf(&path, "%s/" STATE_LOCK_FILE, m->state_directory) < 0)
                return -ENOMEM;
        int r = lock_file_take(path, &m->state_lock_fd, &holder);
        if (r == -EROFS) {
                /* Nothing can be written there, by this brokerd or another on the same mount: it is read
                 * unlocked, and grants wait for a lease log they can be written in (or go best-effort). */
                log_debug("The state directory %s is read-only: not locked.", m->state_directory);
                return 0;
        }
        if (r == -EWOULDBLOCK && holder > 0)
                log_error("The state directory %s is in use by another brokerd (pid %d).", m->state_directory,
                          (int) holder);
        else if (r == -EWOULDBLOCK)
                log_error("The state directory %s is in use by another brokerd.", m->state_directory);
        return r;
}

static void manager_state_unreadable(Manager *m, int error) {
        if (m->state_error != error)
                log_error_errno(error, "Cannot read the leases and fencing tokens in %s: %m. Nothing is granted "
                                       "until they can be read; retrying every %us.",
                                m->state_directory, (unsigned) (STATE_RETRY_USEC / USEC_PER_SEC));
        m->state_error = error;
        m->state_retry_at = now_monotonic() + STATE_RETRY_USEC;
}

static void on_state_loaded(History *h, int error, HistoryState *s, void *userdata) {
        Manager *m = userdata;
        m->state_loading = false;
        if (m->persistence.state_loaded)
                return;
        if (error < 0)
                manager_state_unreadable(m, error);
        else {
                log_info("The state directory %s can be read again.", m->state_directory);
                manager_apply_state(m, s, true, NULL, 0, NULL, 0);
        }
}

/* Reads what was persisted: the lease log; where there is none yet, what an older brokerd kept in
 * history.db (read on the history thread: at start blocking, before the first request, later not). A
 * lease log that is not one, or has damaged lines, cannot say which tokens it held: every pool's tokens
 * then continue above the clock in µs. */
static void manager_load_state(Manager *m, bool at_start) {
        _cleanup_(history_state_done) HistoryState s = {};
        _cleanup_(lease_log_read_done) LeaseLogRead info = {};

        int r = manager_lock_state(m);
        if (r < 0) {
                manager_state_unreadable(m, r);
                return;
        }
        r = lease_log_read(m->state_directory, &s, &info);
        if (r == -EBADMSG) {
                _cleanup_free_ char *moved = NULL;
                /* Kept first: whenever the log is gone, the file that holds grants back is there. */
                r = state_damage_record(m->state_directory,
                                        LEASE_LOG_FILE " is not a lease log (its first line is not the header): it is "
                                        "moved aside beside this file as " LEASE_LOG_FILE ".corrupt-*.",
                                        NULL, 0, now_realtime());
                r = r ?: lease_log_move_aside(m->state_directory, &moved);
                if (r < 0) {
                        manager_state_unreadable(m, -EBADMSG);
                        return;
                }
                log_error("%s/" LEASE_LOG_FILE " is not a lease log: moved aside as %s. Fencing tokens continue above "
                          "the clock; leases it may have held are not known.",
                          m->state_directory, moved);
                m->token_floor_all = MAX(m->token_floor_all, (uint64_t) now_realtime());
                info = (LeaseLogRead) { .exists = true };
        }
        if (r < 0) {
                if (r == -ENOMEM)
                        log_oom();
                manager_state_unreadable(m, r);
                return;
        }
        if (info.damaged > 0) {
                /* Kept before the log is rewritten without them (manager_apply_state()). */
                _cleanup_free_ char *what = NULL;
                r = asprintf(&what, "%u line(s) of " LEASE_LOG_FILE " did not check out; below as they were read "
                                    "(64 KiB at most).", info.damaged) < 0 ? -ENOMEM : 0;
                r = r ?: state_damage_record(m->state_directory, what, info.damage, info.damage_size, now_realtime());
                if (r < 0) {
                        log_error_errno(r, "Cannot record the damaged lines of %s/" LEASE_LOG_FILE " in " STATE_DAMAGE_FILE
                                           ": %m.", m->state_directory);
                        manager_state_unreadable(m, r);
                        return;
                }
                log_error("%s/" LEASE_LOG_FILE ": %u damaged line(s) skipped, kept in " STATE_DAMAGE_FILE ". Fencing "
                          "tokens continue above the clock; a lease such a line held is not known.",
                          m->state_directory, info.damaged);
                m->token_floor_all = MAX(m->token_floor_all, (uint64_t) now_realtime());
        }
        if (info.exists || !m->history) {
                if (m->state_error < 0)
                        log_info("The state directory %s can be read again.", m->state_directory);
                manager_apply_state(m, &s, false, info.rests, info.n_rests, &info.uses, &info.n_uses);
                return;
        }
        if (!at_start) {
                manager_load_state_async(m);
                return;
        }
        history_state_done(&s);
        r = history_load_state(m->history, &s);
        if (r == -ENOMEM)
                log_oom();
        if (r < 0)
                manager_state_unreadable(m, r);
        else
                manager_apply_state(m, &s, true, NULL, 0, NULL, 0);
}

static void manager_load_state_async(Manager *m) {
        if (m->persistence.state_loaded || m->state_loading || !m->history)
                return;
        if (history_load(m->history, on_state_loaded, m) >= 0)
                m->state_loading = true;
}

/* Before the first request (SPEC §3.4). Refusals during recovery are fine; over-admission is not, so this
 * runs before the socket is watched. State that cannot be read is no reason not to start: Status is
 * served, and nothing is granted until a later read succeeds. */
static int manager_open_state(Manager *m) {
        int r = manager_lock_state(m);
        if (r == -EWOULDBLOCK)
                return log_error_errno(r, "Not starting: another brokerd keeps its leases in %s.", m->state_directory);
        r = history_new(m->event, m->state_directory, m->config->history_retention, &m->history);
        if (r < 0)
                return log_error_errno(r, "Failed to set up history in %s: %m", m->state_directory);
        history_set_health_callback(m->history, on_history_health, m);
        audit_set_history(&m->audit, m->history);
        m->history_calls.history = m->history;

        manager_load_state(m, true);
        return 0;
}

int manager_start(Manager *m) {
        /* What the fd store holds first: a lease whose command ended during a handover is then restored for its
         * connection (lease_restore()), whose Release may tell the command's exit status. */
        int fd = socket_take_from_systemd(&m->handover_fds);
        m->leases.holders_handed_over = m->handover_fds.n_connections > 0;
        int r = manager_open_state(m);
        if (r < 0) {
                safe_close(fd);
                return r;
        }

        if (fd >= 0) {
                log_debug("Listening on the socket systemd passed.");
        } else {
                fd = socket_bind_path(m->socket_path);
                if (fd < 0)
                        return log_error_errno(fd, "Failed to listen on %s: %m", m->socket_path);
                m->socket_bound_here = true;
                log_info("Listening on %s.", m->socket_path);
        }
        m->listen_fd = fd;
        manager_load_member_state(m);
        manager_apply_uses(m); /* over the quarantines that members.state counted again */
        manager_take_back(m);
        r = sd_event_add_io(m->event, &m->listen_source, fd, EPOLLIN, on_accept, m);
        if (r < 0)
                return log_error_errno(r, "Failed to watch the listening socket: %m");
        m->idle_since = now_monotonic();
        manager_update_status(m);
        (void) sd_notify(false, "READY=1");
        return 0;
}

/* The drain after each dispatch, unless the loop is to exit (as sd-event's post sources). As a post source
 * the drain took a loop iteration of its own each time (sd_event_prepare()'s gettid() and an epoll_wait()
 * that finds nothing): a fifth of brokerd's system calls for a `slotctl run`, and one more step between a
 * call and its answer. */
int manager_run_once(Manager *m, uint64_t timeout) {
        int code;
        int r = sd_event_run(m->event, timeout);
        if (r > 0 && sd_event_get_exit_code(m->event, &code) == -ENODATA)
                manager_after_dispatch(m);
        return r;
}

int manager_run(Manager *m) {
        int code;
        while (sd_event_get_state(m->event) != SD_EVENT_FINISHED) {
                int r = manager_run_once(m, UINT64_MAX);
                if (r < 0)
                        return r;
        }
        int r = sd_event_get_exit_code(m->event, &code);
        return r < 0 ? r : code;
}

/* ---- lifecycle ---- */

static void raise_nofile_limit(void) {
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= rl.rlim_max)
                return;
        /* Connections are fds: the soft limit (often 1024) would cap clients long before max-connections. */
        rl.rlim_cur = rl.rlim_max;
        (void) setrlimit(RLIMIT_NOFILE, &rl);
}

int manager_new(const ManagerOptions *o, Manager **ret) {
        _cleanup_(manager_freep) Manager *m = NULL;
        ConfErrors errors = {};
        int r;

        m = calloc(1, sizeof(Manager));
        if (!m)
                return log_oom();
        m->listen_fd = -EBADF;
        m->state_lock_fd = -EBADF;
        r = sd_event_default(&m->event);
        audit_init(&m->audit, m->event, &m->metrics, getenv("SLOTBROKER_JOURNAL_SOCKET"));
        lease_table_init(&m->leases, m->event, NULL, &m->audit);
        m->leases.random_bytes = lease_random_bytes;
        m->leases.random_userdata = m;
#if HAVE_REDIS
        m->leases.backend_of = lease_backend_of;
        m->leases.backend_userdata = m;
#endif
        if (r < 0)
                return log_error_errno(r, "Failed to allocate the event loop: %m");
        history_calls_init(&m->history_calls);
        m->history_calls.memory_freed = history_memory_freed;
        m->history_calls.userdata = m;

        if (o->config_path && !(m->config_path = strdup(o->config_path)))
                return log_oom();
        r = config_load(m->config_path, &m->config, &errors);
        if (r >= 0)
                r = acls_resolve(m->config, &m->acls, &m->n_acls, &errors);
        if (r < 0) {
                log_conf_errors(&errors);
                conf_errors_done(&errors);
                return log_error_errno(r, "Failed to load the configuration: %m");
        }

        m->persistence.mode = m->config->lease_persistence;
        manager_apply_settings(m);

        const char *env_socket = getenv("SLOTBROKER_SOCKET");
        if (o->socket_path)
                m->socket_path = strdup(o->socket_path);
        else if (env_socket && *env_socket)
                m->socket_path = strdup(env_socket);
        else if (m->config->socket_path)
                m->socket_path = strdup(m->config->socket_path);
        else
                m->socket_path = default_socket_path();
        if (!m->socket_path)
                return log_oom();

        const char *env_state = getenv("STATE_DIRECTORY");
        m->state_directory = strdup(o->state_directory                      ? o->state_directory
                                    : env_state && *env_state                ? env_state
                                    : m->config->state_directory             ? m->config->state_directory
                                                                             : "/var/lib/brokerd");
        if (!m->state_directory)
                return log_oom();

        r = engine_new(manager_random, m, &m->engine);
        if (r < 0)
                return log_error_errno(r, "Failed to create the engine: %m");
        m->leases.engine = m->engine;
#if HAVE_REDIS
        backend_table_init(&m->backends, m->event, &m->node);
        /* Until the lease log is read (manager_check_damage()), a reconcile keeps what Redis holds for this
         * node: a restart whose state cannot be read must not have Redis hand its leases on a TTL later. */
        backend_table_set_records_unknown(&m->backends, true);
        m->backends.random = manager_random;
        m->backends.on_notice = on_backend_notice;
        m->backends.on_rtt = on_backend_rtt;
        m->backends.on_fence_moved = on_backend_fence_moved;
        m->backends.on_failover = on_backend_failover;
        m->backends.userdata = m;
        engine_set_pool_factory(m->engine, manager_pool_factory, m);
#endif
        r = engine_configure(m->engine, m->config, now_monotonic());
        if (r < 0)
                return log_error_errno(r, "Failed to apply the configuration: %m");

        sigset_t mask;
        sigemptyset(&mask);
        sigaddset(&mask, SIGHUP);
        sigaddset(&mask, SIGTERM);
        sigaddset(&mask, SIGINT);
        if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0)
                return log_error_errno(errno, "Failed to block signals: %m");
        /* A client that hangs up mid-reply must not kill us; sends also use MSG_NOSIGNAL. */
        signal(SIGPIPE, SIG_IGN);
        /* Nor a file-size limit (LimitFSIZE=, an inherited RLIMIT_FSIZE) reached by the lease log or history:
         * the write fails with EFBIG instead, which is handled as a full disk is (lease-persistence=). */
        signal(SIGXFSZ, SIG_IGN);
        raise_nofile_limit();

        if ((r = sd_event_add_signal(m->event, NULL, SIGHUP, on_sighup, m)) < 0 ||
            (r = sd_event_add_signal(m->event, NULL, SIGTERM, on_exit_signal, m)) < 0 ||
            (r = sd_event_add_signal(m->event, NULL, SIGINT, on_exit_signal, m)) < 0)
                return log_error_errno(r, "Failed to watch signals: %m");

        /* Engine deadlines are exact: no coalescing (accuracy 1 µs), or a budget would end late. */
        r = sd_event_add_time(m->event, &m->engine_timer, CLOCK_MONOTONIC, USEC_INFINITY, 1, on_engine_timer, m);
        if (r < 0)
                return log_error_errno(r, "Failed to add the engine timer: %m");
        (void) sd_event_source_set_enabled(m->engine_timer, SD_EVENT_OFF);
        m->engine_timer_at = USEC_INFINITY;

        r = sd_event_add_time_relative(m->event, &m->tick_timer, CLOCK_MONOTONIC, TICK_USEC, 10 * USEC_PER_MSEC, on_tick,
                                       m);
        if (r < 0)
                return log_error_errno(r, "Failed to add the tick timer: %m");
        (void) sd_event_source_set_enabled(m->tick_timer, SD_EVENT_ON);

        r = session_table_init(&m->sessions, m->event);
        if (r < 0)
                return log_error_errno(r, "Failed to add the position timer: %m");
        m->sessions.config = m->config;
        m->methods.config = m->config;
        m->sessions.engine = m->engine;
        m->sessions.audit = &m->audit;
        m->sessions.leases = &m->leases;
        m->sessions.persistence = &m->persistence;
        m->sessions.lane_allows = session_lane_allows;
        m->sessions.pool_admin = methods_pool_admin;
        m->sessions.fd_released = session_fd_released;
        m->sessions.memory_freed = history_memory_freed;
#if HAVE_REDIS
        m->sessions.fence_deadline = session_fence_deadline;
#endif
        m->sessions.userdata = m;
        m->sessions.call_userdata = &m->methods;
        m->methods = (Methods) {
                .config = m->config,
                .engine = m->engine,
                .sessions = &m->sessions,
                .leases = &m->leases,
                .persistence = &m->persistence,
                .history_calls = &m->history_calls,
                .metrics = &m->metrics,
                .reload = methods_reload,
                .gauges = methods_gauges,
                .status_changed = methods_status_changed,
                .backend_primary = manager_backend_primary,
                .pool_admin = methods_pool_admin,
                .settle = methods_settle,
                .userdata = m,
                .event = m->event,
        };

        r = sd_event_add_time(m->event, &m->accept_resume_timer, CLOCK_MONOTONIC, USEC_INFINITY, 10 * USEC_PER_MSEC,
                              on_accept_resume, m);
        if (r < 0)
                return log_error_errno(r, "Failed to add the accept timer: %m");
        (void) sd_event_source_set_enabled(m->accept_resume_timer, SD_EVENT_OFF);

        r = poller_new(m->event, &m->poller);
        if (r < 0)
                return log_error_errno(r, "Failed to set up polling of connections: %m");
        poller_set_after_each(m->poller, on_connection_handled, m);

        r = closer_notify_fd();
        if (r >= 0)
                r = sd_event_add_io(m->event, &m->closer_source, r, EPOLLIN, on_closer_below, m);
        if (r < 0)
                return log_error_errno(r, "Failed to watch the closer: %m");

        if (sd_watchdog_enabled(false, &m->watchdog_usec) > 0) {
                r = sd_event_add_time_relative(m->event, &m->watchdog_timer, CLOCK_MONOTONIC, m->watchdog_usec / 2, 0,
                                               on_watchdog, m);
                if (r < 0)
                        return log_error_errno(r, "Failed to add the watchdog timer: %m");
                (void) sd_event_source_set_enabled(m->watchdog_timer, SD_EVENT_ON);
        }

        *ret = TAKE_PTR(m);
        return 0;
}

Manager *manager_free(Manager *m) {
        if (!m)
                return NULL;
        /* Shutting down is not releasing: leases simply end with the process. What ended before is written:
         * a SIGTERM may be dispatched before the drain that follows the close of a lease's connection. */
        (void) lease_table_flush(&m->leases);
        if (m->member_state_dirty)
                manager_write_member_state(m);
        member_state_entries_free(m->member_pending, m->n_member_pending);
        lease_table_done(&m->leases);
        session_table_done(&m->sessions);
        manager_collect(m);
        m->poller = poller_free(m->poller);
        sd_event_source_disable_unref(m->listen_source);
        safe_close(m->listen_fd);
        safe_close(m->state_lock_fd);
        if (m->socket_bound_here && m->socket_path)
                (void) unlink(m->socket_path);
        sd_event_source_disable_unref(m->accept_resume_timer);
        sd_event_source_disable_unref(m->closer_source);
        sd_event_source_disable_unref(m->engine_timer);
        sd_event_source_disable_unref(m->tick_timer);
        methods_done(&m->methods);
        sd_event_source_disable_unref(m->watchdog_timer);
        sd_event_source_disable_unref(m->stop_timer);
        handover_fds_done(&m->handover_fds);
        /* Leases are not ended: their rows stay for the next start to restore. The stop's instant is the last
         * one brokerd was known to run: a lease found ended at the next start counts its held time up to it
         * (lease_row_ended_at()), not to the alive mark of up to LEASE_LOG_ALIVE_INTERVAL before. */
        if (m->lease_log && !lease_log_is_broken(m->lease_log) && lease_log_alive(m->lease_log, now_realtime()) >= 0)
                (void) lease_log_flush(m->lease_log);
        audit_set_history(&m->audit, NULL);
        m->leases.log = NULL;
        m->persistence.log = NULL;
        m->lease_log = lease_log_free(m->lease_log);
        m->history_calls.history = NULL;
        m->history = history_free(m->history);
        engine_free(m->engine);
#if HAVE_REDIS
        /* After the engine: freeing its shared pools takes them off their backends. */
        backend_table_done(&m->backends);
        node_done(&m->node);
#endif
        audit_done(&m->audit);
        metrics_done(&m->metrics);
        acls_free(m->acls, m->n_acls);
        conf_free(m->config);
        free(m->config_path);
        free(m->socket_path);
        free(m->state_directory);
        sd_event_unref(m->event);
        return mfree(m);
}
