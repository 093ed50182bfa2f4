/* SPDX-License-Identifier: MIT */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"
#include "redis-endpoint.h"
#include "strv.h"

#define SOCKET_PATH_MAX 107 /* sizeof(sockaddr_un.sun_path) − NUL */
#define QUOTE_MAX 96
#define ERROR_KEY_MAX 64

#define DEFAULT_HISTORY_RETENTION (30 * USEC_PER_DAY)
#define DEFAULT_RECLAIM_GRACE (30 * USEC_PER_SEC)
/* As slotctl's --kill-after default: the same grace, whichever side ends the work. */
#define DEFAULT_REVOKE_GRACE (5 * USEC_PER_SEC)
#define DEFAULT_MAX_CONNECTIONS 8192U
#define DEFAULT_MAX_CONNECTIONS_PER_UID 4096U
#define DEFAULT_MAX_WAITERS_PER_UID 4096U
/* fds waiting to be closed: a client's normally close at once; these only bound a user whose closes block
 * (well under RLIMIT_NOFILE, 65536 in the unit, with max-connections beside them). */
#define DEFAULT_MAX_CLOSING_FDS_PER_UID 256U
#define DEFAULT_MAX_CLOSING_FDS 4096U
/* Acquires on shared pools, per hour: 20/s per uid (a CI runner's jobs ask a few a second), a burst of 200
 * (a matrix of jobs starting at once), 200/s for the node; the node's burst is 5 s of its rate. */
#define DEFAULT_MAX_ACQUIRE_RATE_PER_UID (20U * 3600U)
#define DEFAULT_MAX_ACQUIRE_BURST_PER_UID 200U
#define DEFAULT_MAX_ACQUIRE_RATE (200U * 3600U)
#define ACQUIRE_RATE_MAX (100000ULL * 3600U)
#define DEFAULT_MAX_MESSAGE_SIZE ((size_t) 64 * 1024)
#define DEFAULT_MAX_OUTPUT_PER_CONNECTION ((size_t) 1024 * 1024)
#define DEFAULT_LANE_POLICY LANE_POLICY_WAIT

#define DURATION_HINT "a time span such as 500ms, 30s, 5min, 1h 30min"

#define new0(t) ((t *) calloc(1, sizeof(t)))

static const char *strempty(const char *s) {
        return s ?: "";
}

typedef enum SectionKind {
        SECTION_BROKER,
        SECTION_POOL,
        SECTION_LANE,
} SectionKind;

/* ---- strings and lists ---- */

/* Splits at runs of whitespace. Returns 0 (an empty value gives NULL and 0 words) or -ENOMEM. */
static int split_words(const char *value, char ***ret, size_t *ret_n) {
        char **l = NULL;
        size_t n = 0;

        for (const char *p = value;;) {
                while (isspace((unsigned char) *p))
                        p++;
                if (!*p)
                        break;
                const char *e = p;
                while (*e && !isspace((unsigned char) *e))
                        e++;
                char **nl = realloc(l, (n + 2) * sizeof(char *));
                if (!nl)
                        goto oom;
                l = nl;
                l[n] = strndup(p, (size_t) (e - p));
                if (!l[n])
                        goto oom;
                l[++n] = NULL;
                p = e;
        }
        *ret = l;
        *ret_n = n;
        return 0;
oom:
        if (l)
                l[n] = NULL;
        strv_free(l);
        return -ENOMEM;
}

/* The words joined by single spaces, for conf_dump(). */
static void fputs_words(char *const *l, FILE *f) {
        for (char *const *i = l; i && *i; i++)
                fprintf(f, "%s%s", i == l ? "" : " ", *i);
}

/* A value for an error message: quoted, control characters escaped, long ones cut. */
static const char *quote(char buf[static QUOTE_MAX], const char *s) {
        size_t j = 0;

        buf[j++] = '"';
        for (const unsigned char *p = (const unsigned char *) s; *p; p++) {
                if (j + 9 >= QUOTE_MAX) {
                        memcpy(buf + j, "...", 3);
                        j += 3;
                        break;
                }
                if (*p == '"' || *p == '\\') {
                        buf[j++] = '\\';
                        buf[j++] = (char) *p;
                } else if (*p < 0x20 || *p == 0x7f)
                        j += (size_t) snprintf(buf + j, QUOTE_MAX - j, "\\x%02x", *p);
                else
                        buf[j++] = (char) *p;
        }
        buf[j++] = '"';
        buf[j] = '\0';
        return buf;
}

bool conf_label_is_valid(const char *s) {
        size_t n = 0;

        if (!s)
                return false;
        for (; s[n]; n++)
                if (!((s[n] >= 'a' && s[n] <= 'z') || (s[n] >= '0' && s[n] <= '9') || s[n] == '.' || s[n] == '_' ||
                      s[n] == '-'))
                        return false;
        return n >= 1 && n <= CONF_NAME_MAX;
}

bool conf_name_is_valid(const char *s) {
        size_t n = 0;

        if (!s)
                return false;
        for (; s[n]; n++)
                if (!isascii((unsigned char) s[n]) ||
                    !(isalnum((unsigned char) s[n]) || s[n] == '.' || s[n] == '_' || s[n] == '-'))
                        return false;
        return n >= 1 && n <= CONF_NAME_MAX;
}

/* C1 (U+0080..U+009F) is two bytes in UTF-8, C2 80..C2 9F: journalctl shows a message that carries one as
 * "[blob data]", so a text with one would hide the entry's. U+2028/U+2029 (E2 80 A8/A9) break lines in what
 * renders Unicode. Bytes that are not UTF-8 at all are the protocol's business (JSON refuses them); a lead byte
 * last is none of these, and nothing past the NUL is read. */
size_t conf_text_control_len(const char *s) {
        const unsigned char *p = (const unsigned char *) s;
        if ((p[0] > 0 && p[0] < 0x20) || p[0] == 0x7f)
                return 1;
        if (p[0] == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f)
                return 2;
        if (p[0] == 0xe2 && p[1] == 0x80 && (p[2] == 0xa8 || p[2] == 0xa9))
                return 3;
        return 0;
}

bool conf_text_is_one_line(const char *s) {
        for (; s && *s; s++)
                if (conf_text_control_len(s) > 0)
                        return false;
        return true;
}

char *conf_text_sanitize(char *s) {
        char *w = s;
        for (const char *r = s; r && *r;) {
                size_t n = conf_text_control_len(r);
                if (n > 0) {
                        *w++ = '?';
                        r += n;
                } else
                        *w++ = *r++;
        }
        if (w)
                *w = '\0';
        return s;
}

bool conf_reason_is_valid(const char *s) {
        return s && *s && strlen(s) <= CONF_REASON_MAX && conf_text_is_one_line(s);
}

/* A user or group for allow-users=/allow-groups=: a numeric id, or a name as useradd and LDAP allow it.
 * Names are resolved by the daemon, not here: they may not exist yet when the config is checked. */
static bool id_is_valid(const char *s) {
        size_t n = strlen(s);

        if (n == 0 || n > 255)
                return false;
        if (strspn(s, "0123456789") == n) {
                uint64_t v = 0;
                for (const char *p = s; *p; p++) {
                        v = v * 10 + (uint64_t) (*p - '0');
                        if (v >= UINT32_MAX) /* (uid_t) -1 means "no id" */
                                return false;
                }
                return true;
        }
        if (s[0] == '-' || s[0] == '+' || streq(s, ".") || streq(s, ".."))
                return false;
        for (const unsigned char *p = (const unsigned char *) s; *p; p++)
                if (*p < 0x20 || *p == 0x7f || isspace(*p) || strchr(":/,;", *p))
                        return false;
        return true;
}

/* ---- sources and errors ---- */

const char *conf_source_where(const ConfSource *source, char *buf, size_t size) {
        if (!source || !source->file)
                return NULL;
        if (source->line > 0)
                snprintf(buf, size, "%s:%u", source->file, source->line);
        else
                snprintf(buf, size, "%s", source->file);
        return buf;
}

static void conf_source_done(ConfSource *s) {
        s->file = mfree(s->file);
        s->line = 0;
}

static int conf_source_copy(ConfSource *dst, const ConfSource *src) {
        char *file = NULL;

        if (src && src->file) {
                file = strdup(src->file);
                if (!file)
                        return -ENOMEM;
        }
        free(dst->file);
        dst->file = file;
        dst->line = src ? src->line : 0;
        return 0;
}

int conf_errors_add(ConfErrors *errors, const ConfSource *source, const char *key, const char *format, ...) {
        ConfError e = {};
        va_list ap;

        if (!errors)
                return -EINVAL;
        if (errors->n_errors >= CONF_ERRORS_MAX)
                goto drop;

        va_start(ap, format);
        int k = vasprintf(&e.message, format, ap);
        va_end(ap);
        if (k < 0) {
                e.message = NULL;
                goto drop;
        }
        if (source && source->file) {
                k = source->line > 0 ? asprintf(&e.where, "%s:%u", source->file, source->line)
                                     : asprintf(&e.where, "%s", source->file);
                if (k < 0) {
                        e.where = NULL;
                        goto drop;
                }
        }
        if (key) {
                size_t n = strlen(key);
                k = n > ERROR_KEY_MAX ? asprintf(&e.key, "%.*s...", ERROR_KEY_MAX, key) : asprintf(&e.key, "%s", key);
                if (k < 0) {
                        e.key = NULL;
                        goto drop;
                }
        }
        /* Errors end up on terminals and in the journal: no byte of a hostile file may act as a control code. */
        conf_text_sanitize(e.message);
        conf_text_sanitize(e.where);
        conf_text_sanitize(e.key);
        ConfError *n = realloc(errors->errors, (errors->n_errors + 1) * sizeof(ConfError));
        if (!n)
                goto drop;
        errors->errors = n;
        errors->errors[errors->n_errors++] = e;
        return -EINVAL;
drop:
        free(e.message);
        free(e.where);
        free(e.key);
        errors->n_dropped++;
        return -EINVAL;
}

void conf_errors_done(ConfErrors *errors) {
        if (!errors)
                return;
        for (size_t i = 0; i < errors->n_errors; i++) {
                free(errors->errors[i].where);
                free(errors->errors[i].key);
                free(errors->errors[i].message);
        }
        errors->errors = mfree(errors->errors);
        errors->n_errors = 0;
        errors->n_dropped = 0;
}

char *conf_error_to_string(const ConfError *e) {
        char *s;

        if (!e)
                return NULL;
        if (asprintf(&s, "%s%s%s%s%s", e->where ?: "", e->where ? ": " : "", e->key ?: "", e->key ? ": " : "",
                     e->message ?: "(out of memory while describing this error)") < 0)
                return NULL;
        return s;
}

void conf_errors_print(const ConfErrors *errors, FILE *f) {
        if (!errors)
                return;
        for (size_t i = 0; i < errors->n_errors; i++) {
                _cleanup_free_ char *s = conf_error_to_string(errors->errors + i);
                fprintf(f, "%s\n", s ?: "(out of memory while describing an error)");
        }
        if (errors->n_dropped > 0)
                fprintf(f, "(%zu more errors not shown)\n", errors->n_dropped);
}

static int oom(ConfErrors *errors, const ConfSource *source, const char *key) {
        (void) conf_errors_add(errors, source, key, "out of memory");
        return -ENOMEM;
}

/* ---- enums ---- */

static const char *const lane_policy_table[_LANE_POLICY_MAX] = {
        [LANE_POLICY_FAIL_FAST] = "fail-fast",
        [LANE_POLICY_WAIT] = "wait",
};

DEFINE_STRING_TABLE_LOOKUP(lane_policy, LanePolicy, _LANE_POLICY_MAX)

static const char *const audit_level_table[_AUDIT_LEVEL_MAX] = {
        [AUDIT_DECISIONS] = "decisions",
        [AUDIT_ALL] = "all",
};

DEFINE_STRING_TABLE_LOOKUP(audit_level, AuditLevel, _AUDIT_LEVEL_MAX)

static const char *const lease_persistence_table[_LEASE_PERSISTENCE_MAX] = {
        [LEASE_PERSISTENCE_REQUIRED] = "required",
        [LEASE_PERSISTENCE_BEST_EFFORT] = "best-effort",
};

DEFINE_STRING_TABLE_LOOKUP(lease_persistence, LeasePersistence, _LEASE_PERSISTENCE_MAX)

/* ---- objects ---- */

static PoolConfig *pool_config_free(PoolConfig *p) {
        if (!p)
                return NULL;
        free(p->name);
        conf_source_done(&p->source);
        strv_free(p->members);
        for (size_t i = 0; i < p->n_labels; i++) {
                free(p->labels[i].name);
                strv_free(p->labels[i].members);
                conf_source_done(&p->labels[i].source);
        }
        free(p->labels);
        conf_source_done(&p->congestion_timeout_source);
        conf_source_done(&p->cooldown_source);
        free(p->backend);
        free(p->backend_user);
        free(p->backend_password_file);
        free(p->backend_sentinel_password_file);
        conf_source_done(&p->limit_source);
        conf_source_done(&p->members_source);
        conf_source_done(&p->quarantine_exit_codes_source);
        conf_source_done(&p->quarantine_after_source);
        strv_free(p->admin_users);
        strv_free(p->admin_groups);
        return mfree(p);
}

static void lane_also_free(LaneAlso *a, size_t n) {
        for (size_t i = 0; i < n; i++)
                free(a[i].pool);
        free(a);
}

static LaneConfig *lane_config_free(LaneConfig *l) {
        if (!l)
                return NULL;
        free(l->name);
        conf_source_done(&l->source);
        strv_free(l->pools);
        conf_source_done(&l->pools_source);
        strv_free(l->labels);
        conf_source_done(&l->labels_source);
        strv_free(l->allow_users);
        strv_free(l->allow_groups);
        conf_source_done(&l->max_in_use_source);
        conf_source_done(&l->reserve_source);
        lane_also_free(l->also, l->n_also);
        conf_source_done(&l->also_source);
        conf_source_done(&l->health_source);
        return mfree(l);
}

int conf_new(BrokerConfig **ret) {
        assert_return(ret, -EINVAL);

        BrokerConfig *c = new0(BrokerConfig);
        if (!c)
                return -ENOMEM;
        *c = (BrokerConfig) {
                .audit = AUDIT_DECISIONS,
                .history_retention = DEFAULT_HISTORY_RETENTION,
                .reclaim_grace = DEFAULT_RECLAIM_GRACE,
                .revoke_grace = DEFAULT_REVOKE_GRACE,
                .exit_idle_after = USEC_INFINITY,
                .max_connections = DEFAULT_MAX_CONNECTIONS,
                .max_connections_per_uid = DEFAULT_MAX_CONNECTIONS_PER_UID,
                .max_waiters_per_uid = DEFAULT_MAX_WAITERS_PER_UID,
                .max_closing_fds_per_uid = DEFAULT_MAX_CLOSING_FDS_PER_UID,
                .max_closing_fds = DEFAULT_MAX_CLOSING_FDS,
                .max_acquire_rate_per_uid = DEFAULT_MAX_ACQUIRE_RATE_PER_UID,
                .max_acquire_burst_per_uid = DEFAULT_MAX_ACQUIRE_BURST_PER_UID,
                .max_acquire_rate = DEFAULT_MAX_ACQUIRE_RATE,
                .max_message_size = DEFAULT_MAX_MESSAGE_SIZE,
                .max_output_per_connection = DEFAULT_MAX_OUTPUT_PER_CONNECTION,
        };
        *ret = c;
        return 0;
}

BrokerConfig *conf_free(BrokerConfig *c) {
        if (!c)
                return NULL;
        free(c->socket_path);
        free(c->state_directory);
        free(c->metrics_textfile);
        free(c->node_name);
        for (size_t i = 0; i < c->n_pools; i++)
                pool_config_free(c->pools[i]);
        free(c->pools);
        for (size_t i = 0; i < c->n_lanes; i++)
                lane_config_free(c->lanes[i]);
        free(c->lanes);
        return mfree(c);
}

/* The copy helpers below take a field of a shallow copy, which still points at the original's, and make it the
 * copy's own: a duplicate while `ok`, else NULL (the copy is freed then, and must free none of the original's).
 * They return whether the copy has all it had so far. */
static bool copy_str(char **field, bool ok) {
        const char *s = *field;
        *field = ok && s ? strdup(s) : NULL;
        return ok && (!s || *field);
}

static bool copy_strv(char ***field, bool ok) {
        char *const *l = *field;
        *field = ok && l ? strv_copy(l) : NULL;
        return ok && (!l || *field);
}

static bool copy_source(ConfSource *s, bool ok) {
        return copy_str(&s->file, ok);
}

static PoolConfig *pool_config_copy(const PoolConfig *p) {
        PoolConfig *n = new0(PoolConfig);
        if (!n)
                return NULL;
        *n = *p;
        bool ok = copy_str(&n->name, true);
        ok = copy_source(&n->source, ok);
        ok = copy_strv(&n->members, ok);
        ok = copy_source(&n->congestion_timeout_source, ok);
        ok = copy_source(&n->cooldown_source, ok);
        ok = copy_str(&n->backend, ok);
        ok = copy_str(&n->backend_user, ok);
        ok = copy_str(&n->backend_password_file, ok);
        ok = copy_str(&n->backend_sentinel_password_file, ok);
        ok = copy_source(&n->limit_source, ok);
        ok = copy_source(&n->members_source, ok);
        ok = copy_source(&n->quarantine_exit_codes_source, ok);
        ok = copy_source(&n->quarantine_after_source, ok);
        ok = copy_strv(&n->admin_users, ok);
        ok = copy_strv(&n->admin_groups, ok);
        n->labels = NULL;
        n->n_labels = 0;
        if (ok && p->n_labels > 0) {
                n->labels = calloc(p->n_labels, sizeof(PoolLabel));
                ok = n->labels;
                for (size_t i = 0; ok && i < p->n_labels; i++) {
                        n->labels[i] = p->labels[i];
                        ok = copy_str(&n->labels[i].name, ok);
                        ok = copy_strv(&n->labels[i].members, ok);
                        ok = copy_source(&n->labels[i].source, ok);
                        n->n_labels = i + 1;
                }
        }
        return ok ? n : pool_config_free(n);
}

static LaneConfig *lane_config_copy(const LaneConfig *l) {
        LaneConfig *n = new0(LaneConfig);
        if (!n)
                return NULL;
        *n = *l;
        bool ok = copy_str(&n->name, true);
        ok = copy_source(&n->source, ok);
        ok = copy_strv(&n->pools, ok);
        ok = copy_source(&n->pools_source, ok);
        ok = copy_strv(&n->labels, ok);
        ok = copy_source(&n->labels_source, ok);
        ok = copy_strv(&n->allow_users, ok);
        ok = copy_strv(&n->allow_groups, ok);
        ok = copy_source(&n->max_in_use_source, ok);
        ok = copy_source(&n->reserve_source, ok);
        ok = copy_source(&n->also_source, ok);
        ok = copy_source(&n->health_source, ok);
        n->also = NULL;
        n->n_also = 0;
        if (ok && l->n_also > 0) {
                n->also = calloc(l->n_also, sizeof(LaneAlso));
                ok = n->also;
                for (size_t i = 0; ok && i < l->n_also; i++) {
                        n->also[i] = l->also[i];
                        ok = copy_str(&n->also[i].pool, ok);
                        n->n_also = i + 1;
                }
        }
        return ok ? n : lane_config_free(n);
}

int conf_copy(const BrokerConfig *c, BrokerConfig **ret) {
        assert_return(c && ret, -EINVAL);

        _cleanup_(conf_freep) BrokerConfig *n = new0(BrokerConfig);
        if (!n)
                return -ENOMEM;
        *n = *c;
        bool ok = copy_str(&n->socket_path, true);
        ok = copy_str(&n->state_directory, ok);
        ok = copy_str(&n->metrics_textfile, ok);
        ok = copy_str(&n->node_name, ok);
        n->pools = NULL;
        n->n_pools = 0;
        n->lanes = NULL;
        n->n_lanes = 0;
        if (!ok)
                return -ENOMEM;
        if (c->n_pools > 0) {
                n->pools = calloc(c->n_pools, sizeof(PoolConfig *));
                if (!n->pools)
                        return -ENOMEM;
                for (; n->n_pools < c->n_pools; n->n_pools++)
                        if (!(n->pools[n->n_pools] = pool_config_copy(c->pools[n->n_pools])))
                                return -ENOMEM;
        }
        if (c->n_lanes > 0) {
                n->lanes = calloc(c->n_lanes, sizeof(LaneConfig *));
                if (!n->lanes)
                        return -ENOMEM;
                for (; n->n_lanes < c->n_lanes; n->n_lanes++)
                        if (!(n->lanes[n->n_lanes] = lane_config_copy(c->lanes[n->n_lanes])))
                                return -ENOMEM;
        }
        *ret = TAKE_PTR(n);
        return 0;
}

PoolConfig *conf_find_pool(const BrokerConfig *c, const char *name) {
        if (!c || !name)
                return NULL;
        for (size_t i = 0; i < c->n_pools; i++)
                if (streq(c->pools[i]->name, name))
                        return c->pools[i];
        return NULL;
}

unsigned conf_lane_most(const BrokerConfig *c, const LaneConfig *l, const char *pool) {
        const PoolConfig *p = conf_find_pool(c, pool);
        if (!p || !l)
                return 0;
        unsigned most = p->limit;
        if (l->max_in_use >= 0)
                most = (unsigned) MIN((int64_t) most, l->max_in_use);
        /* A health lane is granted quarantined members, which no reserve keeps (pool-local.c, health_fits()). */
        if (l->health)
                return most;
        uint64_t reserved = 0;
        for (size_t i = 0; i < c->n_lanes; i++)
                if (c->lanes[i] != l && strv_contains(c->lanes[i]->pools, pool))
                        reserved += c->lanes[i]->reserve;
        return reserved < p->limit ? (unsigned) MIN((uint64_t) most, p->limit - reserved) : 0;
}

LaneConfig *conf_find_lane(const BrokerConfig *c, const char *name) {
        if (!c || !name)
                return NULL;
        for (size_t i = 0; i < c->n_lanes; i++)
                if (streq(c->lanes[i]->name, name))
                        return c->lanes[i];
        return NULL;
}

static int pool_add(BrokerConfig *c, const char *name, const ConfSource *source, PoolConfig **ret) {
        PoolConfig **n = realloc(c->pools, (c->n_pools + 1) * sizeof(PoolConfig *));
        if (!n)
                return -ENOMEM;
        c->pools = n;

        PoolConfig *p = new0(PoolConfig);
        if (!p)
                return -ENOMEM;
        p->max_queue = -1;
        p->backend_node_ttl = CONF_NODE_TTL_DEFAULT;
        p->quarantine_after = 1;
        p->backend_min_replicas_timeout = CONF_MIN_REPLICAS_TIMEOUT_DEFAULT;
        p->name = strdup(name);
        if (!p->name || conf_source_copy(&p->source, source) < 0) {
                pool_config_free(p);
                return -ENOMEM;
        }
        c->pools[c->n_pools++] = p;
        *ret = p;
        return 0;
}

static int lane_add(BrokerConfig *c, const char *name, const ConfSource *source, LaneConfig **ret) {
        LaneConfig **n = realloc(c->lanes, (c->n_lanes + 1) * sizeof(LaneConfig *));
        if (!n)
                return -ENOMEM;
        c->lanes = n;

        LaneConfig *l = new0(LaneConfig);
        if (!l)
                return -ENOMEM;
        l->policy = DEFAULT_LANE_POLICY;
        l->max_in_use = -1;
        l->max_hold = USEC_INFINITY;
        l->name = strdup(name);
        if (!l->name || conf_source_copy(&l->source, source) < 0) {
                lane_config_free(l);
                return -ENOMEM;
        }
        c->lanes[c->n_lanes++] = l;
        *ret = l;
        return 0;
}

/* ---- values ---- */

typedef struct ConfKey ConfKey;
typedef int (*ConfSetFn)(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                         ConfErrors *errors);

/* One key of a section: how to parse it and where it goes. */
struct ConfKey {
        const char *name;
        ConfSetFn set;
        size_t offset;          /* of the field in BrokerConfig, PoolConfig or LaneConfig */
        uint64_t min, max;      /* numbers and durations; a duration may be infinity iff max is USEC_INFINITY */
        uint64_t def;           /* what an empty value restores */
        bool infinity;          /* integers: "infinity" means no cap (stored as -1) */
};

#define FIELD(object, k, type) ((type *) ((char *) (object) + (k)->offset))

static int parse_u64(const char *s, uint64_t *ret) {
        uint64_t v = 0;

        if (!*s)
                return -EINVAL;
        for (const char *p = s; *p; p++) {
                if (*p < '0' || *p > '9')
                        return -EINVAL;
                unsigned d = (unsigned) (*p - '0');
                if (v > (UINT64_MAX - d) / 10)
                        return -ERANGE;
                v = v * 10 + d;
        }
        *ret = v;
        return 0;
}

/* An integer in [k->min, k->max]; with k->infinity, "infinity" gives UINT64_MAX. */
static int parse_number(const ConfKey *k, const char *value, const ConfSource *source, ConfErrors *errors,
                        uint64_t *ret) {
        char q[QUOTE_MAX];
        uint64_t v;

        if (k->infinity && streq(value, "infinity")) {
                *ret = UINT64_MAX;
                return 0;
        }
        int r = parse_u64(value, &v);
        if (r == -EINVAL)
                return conf_errors_add(errors, source, k->name,
                                       "invalid number %s (expected an integer from %" PRIu64 " to %" PRIu64 "%s)",
                                       quote(q, value), k->min, k->max, k->infinity ? ", or infinity" : "");
        if (r < 0 || v < k->min || v > k->max)
                return conf_errors_add(errors, source, k->name,
                                       "%s is out of range (expected an integer from %" PRIu64 " to %" PRIu64 "%s)",
                                       quote(q, value), k->min, k->max, k->infinity ? ", or infinity" : "");
        *ret = v;
        return 0;
}

static int parse_duration(const ConfKey *k, const char *value, const ConfSource *source, ConfErrors *errors,
                          usec_t *ret) {
        char q[QUOTE_MAX], lo[TIMESPAN_MAX];
        usec_t v;
        bool inf = k->max == USEC_INFINITY;

        int r = timespan_parse(value, USEC_PER_SEC, &v);
        if (r == -ERANGE)
                return conf_errors_add(errors, source, k->name, "duration %s is too long (expected %s%s)",
                                       quote(q, value), DURATION_HINT, inf ? ", or infinity" : "");
        if (r < 0)
                return conf_errors_add(errors, source, k->name, "invalid duration %s (expected %s%s)",
                                       quote(q, value), DURATION_HINT, inf ? ", or infinity" : "");
        if (v == USEC_INFINITY && !inf)
                return conf_errors_add(errors, source, k->name, "%s is not accepted here (expected a finite %s)",
                                       quote(q, value), DURATION_HINT);
        if (v < k->min && k->min == 1)
                return conf_errors_add(errors, source, k->name, "duration %s must be greater than 0%s",
                                       quote(q, value), inf ? " (infinity for none)" : "");
        if (v < k->min)
                return conf_errors_add(errors, source, k->name, "duration %s is too short (expected at least %s)",
                                       quote(q, value), timespan_format(lo, sizeof lo, k->min));
        if (v != USEC_INFINITY && v > k->max)
                return conf_errors_add(errors, source, k->name, "duration %s is too long (expected at most %s)",
                                       quote(q, value), timespan_format(lo, sizeof lo, k->max));
        *ret = v;
        return 0;
}

/* A byte count: a plain integer, or one with a K, M or G suffix (powers of 1024). */
static int parse_bytes(const ConfKey *k, const char *value, const ConfSource *source, ConfErrors *errors,
                       uint64_t *ret) {
        static const struct {
                const char *suffix;
                uint64_t factor;
        } suffixes[] = {
                { "", 1 },
                { "K", UINT64_C(1) << 10 }, { "KiB", UINT64_C(1) << 10 },
                { "M", UINT64_C(1) << 20 }, { "MiB", UINT64_C(1) << 20 },
                { "G", UINT64_C(1) << 30 }, { "GiB", UINT64_C(1) << 30 },
        };
        char q[QUOTE_MAX], digits[32];
        size_t n = strspn(value, "0123456789");
        uint64_t v;

        for (size_t i = 0; i < ELEMENTSOF(suffixes); i++) {
                if (!streq(value + n, suffixes[i].suffix))
                        continue;
                if (n == 0 || n >= sizeof digits)
                        break;
                memcpy(digits, value, n);
                digits[n] = '\0';
                if (parse_u64(digits, &v) < 0 || v > UINT64_MAX / suffixes[i].factor)
                        goto range;
                v *= suffixes[i].factor;
                if (v < k->min || v > k->max)
                        goto range;
                *ret = v;
                return 0;
        }
        return conf_errors_add(errors, source, k->name,
                               "invalid size %s (expected a number of bytes, optionally with K, M or G)",
                               quote(q, value));
range:
        return conf_errors_add(errors, source, k->name,
                               "size %s is out of range (expected %" PRIu64 " to %" PRIu64 " bytes)", quote(q, value),
                               k->min, k->max);
}

/* In *ret the first index of l[0..n) whose name some earlier one has, SIZE_MAX when none: found by sorting the
 * indices (a scan of all names before each took minutes for the 200,000 members a simulator scenario may list).
 * Returns 0, -ENOMEM. */
static int first_repeat(char *const *l, size_t n, size_t *ret) {
        size_t twice = SIZE_MAX;

        if (n > 1) {
                _cleanup_free_ size_t *order = reallocarray(NULL, n, sizeof(size_t));
                if (!order)
                        return -ENOMEM;
                for (size_t i = 0; i < n; i++)
                        order[i] = i;
                strv_order_sort(order, n, l, sizeof(char *));
                for (size_t i = 1; i < n; i++)
                        if (streq(l[order[i - 1]], l[order[i]]))
                                twice = MIN(twice, order[i]);
        }
        *ret = twice;
        return 0;
}

/* Checks a list of pool or member names: valid and no duplicates. The error is the first name, in list order, that
 * is invalid or listed before (first_repeat()). */
static int check_names(const ConfKey *k, char *const *l, const char *what, const ConfSource *source,
                       ConfErrors *errors) {
        char q[QUOTE_MAX];
        size_t n = 0, invalid = SIZE_MAX, twice;

        for (; l && l[n]; n++)
                if (invalid == SIZE_MAX && !conf_name_is_valid(l[n]))
                        invalid = n;
        if (first_repeat(l, n, &twice) < 0)
                return oom(errors, source, k->name);
        if (invalid != SIZE_MAX && invalid <= twice)
                return conf_errors_add(errors, source, k->name,
                                       "invalid %s name %s (expected 1 to %d characters from A-Z a-z 0-9 . _ -)", what,
                                       quote(q, l[invalid]), CONF_NAME_MAX);
        if (twice != SIZE_MAX)
                return conf_errors_add(errors, source, k->name, "%s %s is listed twice", what, quote(q, l[twice]));
        return 0;
}

static int set_path(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                    ConfErrors *errors) {
        char **field = FIELD(object, k, char *), q[QUOTE_MAX];
        char *v = NULL;

        if (*value) {
                if (value[0] != '/')
                        return conf_errors_add(errors, source, k->name,
                                               "%s is not an absolute path (expected a path starting with /)",
                                               quote(q, value));
                if (strlen(value) > k->max)
                        return conf_errors_add(errors, source, k->name, "path %s is too long (at most %" PRIu64 " bytes)",
                                               quote(q, value), k->max);
                /* conf_dump() must read back: in a file, " ;" starts a comment. */
                for (const char *i = value; (i = strchr(i + 1, ';'));)
                        if (isspace((unsigned char) i[-1]))
                                return conf_errors_add(errors, source, k->name,
                                                       "path %s contains \" ;\", which starts a comment", quote(q, value));
                v = strdup(value);
                if (!v)
                        return oom(errors, source, k->name);
        }
        free(*field);
        *field = v;
        return 0;
}

static int set_duration(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                        ConfErrors *errors) {
        usec_t v = k->def;

        if (*value && parse_duration(k, value, source, errors, &v) < 0)
                return -EINVAL;
        *FIELD(object, k, usec_t) = v;
        return 0;
}

static int set_unsigned(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                        ConfErrors *errors) {
        uint64_t v = k->def;

        if (*value && parse_number(k, value, source, errors, &v) < 0)
                return -EINVAL;
        *FIELD(object, k, unsigned) = (unsigned) v;
        return 0;
}

/* A rate: "N/s", "N/min", "N/h" (N an integer), or "infinity" (0: unlimited); stored per hour. */
static int set_rate(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                    ConfErrors *errors) {
        static const struct {
                const char *unit;
                uint64_t per_hour;
        } units[] = { { "/s", 3600 }, { "/min", 60 }, { "/h", 1 } };
        char q[QUOTE_MAX], digits[32];
        uint64_t v = k->def, n;

        if (*value && streq(value, "infinity"))
                v = 0;
        else if (*value) {
                const char *slash = strchr(value, '/');
                size_t i = 0, len = slash ? (size_t) (slash - value) : 0;
                for (; slash && i < ELEMENTSOF(units); i++)
                        if (streq(slash, units[i].unit))
                                break;
                if (!slash || i == ELEMENTSOF(units) || len == 0 || len >= sizeof digits)
                        return conf_errors_add(errors, source, k->name,
                                               "invalid rate %s (expected N/s, N/min or N/h, or infinity)", quote(q, value));
                memcpy(digits, value, len);
                digits[len] = 0;
                if (parse_u64(digits, &n) < 0 || n == 0 || n > k->max / units[i].per_hour)
                        return conf_errors_add(errors, source, k->name,
                                               "%s is out of range (expected from 1/h to %" PRIu64 "/s, or infinity)",
                                               quote(q, value), k->max / 3600);
                v = n * units[i].per_hour;
        }
        *FIELD(object, k, uint64_t) = v;
        return 0;
}

static void dump_rate(FILE *f, const char *key, uint64_t per_hour) {
        if (per_hour == 0)
                fprintf(f, "%s=infinity\n", key);
        else if (per_hour % 3600 == 0)
                fprintf(f, "%s=%" PRIu64 "/s\n", key, per_hour / 3600);
        else if (per_hour % 60 == 0)
                fprintf(f, "%s=%" PRIu64 "/min\n", key, per_hour / 60);
        else
                fprintf(f, "%s=%" PRIu64 "/h\n", key, per_hour);
}

static int set_bytes(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                     ConfErrors *errors) {
        uint64_t v = k->def;

        if (*value && parse_bytes(k, value, source, errors, &v) < 0)
                return -EINVAL;
        *FIELD(object, k, size_t) = (size_t) v;
        return 0;
}

/* A cap stored as int64_t, −1 for none (an empty value or infinity). */
static int set_cap(const ConfKey *k, void *object, const char *value, const ConfSource *source, ConfErrors *errors) {
        uint64_t v = UINT64_MAX;

        if (*value && parse_number(k, value, source, errors, &v) < 0)
                return -EINVAL;
        *FIELD(object, k, int64_t) = v == UINT64_MAX ? -1 : (int64_t) v;
        return 0;
}

static int set_audit(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                     ConfErrors *errors) {
        char q[QUOTE_MAX];
        AuditLevel a = AUDIT_DECISIONS;

        if (*value) {
                a = audit_level_from_string(value);
                if (a < 0)
                        return conf_errors_add(errors, source, k->name, "invalid audit level %s (expected decisions or all)",
                                               quote(q, value));
        }
        *FIELD(object, k, AuditLevel) = a;
        return 0;
}

static int set_lease_persistence(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                                 ConfErrors *errors) {
        char q[QUOTE_MAX];
        LeasePersistence p = LEASE_PERSISTENCE_REQUIRED;

        if (*value) {
                p = lease_persistence_from_string(value);
                if (p < 0)
                        return conf_errors_add(errors, source, k->name,
                                               "invalid value %s (expected required or best-effort)", quote(q, value));
        }
        *FIELD(object, k, LeasePersistence) = p;
        return 0;
}

static int set_pool_limit(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                          ConfErrors *errors) {
        PoolConfig *p = object;
        uint64_t v = 0;

        if (*value && parse_number(k, value, source, errors, &v) < 0)
                return -EINVAL;
        if (conf_source_copy(&p->limit_source, v > 0 ? source : NULL) < 0)
                return oom(errors, source, k->name);
        p->limit_given = (unsigned) v;
        p->limit = p->n_members > 0 ? (unsigned) p->n_members : p->limit_given;
        return 0;
}

static int set_pool_members(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                            ConfErrors *errors) {
        PoolConfig *p = object;
        char **l = NULL;
        size_t n = 0;

        if (split_words(value, &l, &n) < 0)
                return oom(errors, source, k->name);
        if (check_names(k, l, "member", source, errors) < 0)
                goto fail;
        if (n > CONF_LIMIT_MAX) {
                conf_errors_add(errors, source, k->name, "%zu members are too many (at most %u)", n, CONF_LIMIT_MAX);
                goto fail;
        }
        if (conf_source_copy(&p->members_source, n > 0 ? source : NULL) < 0) {
                strv_free(l);
                return oom(errors, source, k->name);
        }
        strv_free(p->members);
        p->members = l;
        p->n_members = n;
        p->limit = n > 0 ? (unsigned) n : p->limit_given;
        return 0;
fail:
        strv_free(l);
        return -EINVAL;
}

/* label.NAME = MEMBER…: not a ConfKey of its own, its name is part of the key (conf_set()). Members are
 * checked against members= by validate_pool(), which may come later in the file. */
static int set_pool_label(PoolConfig *p, const char *key, const char *value, const ConfSource *source,
                          ConfErrors *errors) {
        const char *name = key + strlen("label.");
        const ConfKey k = { .name = key };
        char q[QUOTE_MAX];
        _cleanup_(strv_freep) char **l = NULL;
        size_t n = 0, i;

        if (!conf_label_is_valid(name))
                return conf_errors_add(errors, source, key,
                                       "invalid label name %s (expected 1 to %d characters from a-z 0-9 . _ -)",
                                       quote(q, name), CONF_NAME_MAX);
        if (split_words(value, &l, &n) < 0)
                return oom(errors, source, key);
        if (check_names(&k, l, "member", source, errors) < 0)
                return -EINVAL;
        for (i = 0; i < p->n_labels; i++)
                if (streq(p->labels[i].name, name))
                        break;
        if (i == p->n_labels) {
                if (p->n_labels >= CONF_LABELS_MAX)
                        return conf_errors_add(errors, source, key, "pool %s has too many labels (at most %d)", p->name,
                                               CONF_LABELS_MAX);
                PoolLabel *a = reallocarray(p->labels, p->n_labels + 1, sizeof(PoolLabel));
                if (!a)
                        return oom(errors, source, key);
                p->labels = a;
                a[i] = (PoolLabel) { .name = strdup(name) };
                if (!a[i].name)
                        return oom(errors, source, key);
                p->n_labels++;
        }
        if (conf_source_copy(&p->labels[i].source, source) < 0)
                return oom(errors, source, key);
        strv_free(p->labels[i].members);
        p->labels[i].members = TAKE_PTR(l);
        return 0;
}

/* labels = TERM…: "L" (every member granted carries L) or "!L" (none does). */
static int set_lane_labels(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                           ConfErrors *errors) {
        LaneConfig *lane = object;
        char q[QUOTE_MAX];
        _cleanup_(strv_freep) char **l = NULL;
        size_t n = 0;

        if (split_words(value, &l, &n) < 0)
                return oom(errors, source, k->name);
        /* The first term, in list order, that is invalid or listed before; its length is checked after. */
        size_t invalid = SIZE_MAX, twice;
        for (size_t i = 0; i < n && invalid == SIZE_MAX; i++)
                if (!conf_label_is_valid(l[i][0] == '!' ? l[i] + 1 : l[i]))
                        invalid = i;
        if (first_repeat(l, n, &twice) < 0)
                return oom(errors, source, k->name);
        if (invalid != SIZE_MAX && invalid <= twice)
                return conf_errors_add(errors, source, k->name,
                                       "invalid label %s (expected LABEL or !LABEL, LABEL 1 to %d characters from a-z 0-9 . _ -)",
                                       quote(q, l[invalid]), CONF_NAME_MAX);
        if (twice != SIZE_MAX)
                return conf_errors_add(errors, source, k->name, "label %s is listed twice", quote(q, l[twice]));
        if (n > CONF_LANE_LABELS_MAX)
                return conf_errors_add(errors, source, k->name, "%zu labels are too many (at most %d)", n,
                                       CONF_LANE_LABELS_MAX);
        if (conf_source_copy(&lane->labels_source, n > 0 ? source : NULL) < 0)
                return oom(errors, source, k->name);
        strv_free(lane->labels);
        lane->labels = n > 0 ? TAKE_PTR(l) : NULL;
        return 0;
}

/* also = POOL[:K]…: further pools every grant takes K slots of (default 1), all or nothing (SPEC §3.5). Whether
 * the pools exist, are not the lane's own and are all kept alike is conf_validate()'s. */
static int set_lane_also(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                         ConfErrors *errors) {
        LaneConfig *lane = object;
        char q[QUOTE_MAX];
        _cleanup_(strv_freep) char **l = NULL;
        size_t n = 0;

        if (split_words(value, &l, &n) < 0)
                return oom(errors, source, k->name);
        if (n > CONF_LANE_ALSO_MAX)
                return conf_errors_add(errors, source, k->name, "%zu pools are too many (at most %d)", n,
                                       CONF_LANE_ALSO_MAX);
        LaneAlso *a = calloc(MAX(n, 1u), sizeof(LaneAlso));
        if (!a)
                return oom(errors, source, k->name);
        for (size_t i = 0; i < n; i++) {
                char *colon = strchr(l[i], ':');
                unsigned slots = 1;
                if (colon) {
                        *colon = '\0';
                        const char *digits = colon + 1;
                        char *end;
                        errno = 0;
                        unsigned long v = *digits >= '0' && *digits <= '9' ? strtoul(digits, &end, 10) : 0;
                        if (errno != 0 || v == 0 || v > CONF_LIMIT_MAX || *digits < '0' || *digits > '9' || *end) {
                                *colon = ':';
                                lane_also_free(a, i);
                                return conf_errors_add(errors, source, k->name,
                                                       "invalid slot count in %s (expected POOL or POOL:K, K from 1 to %u)",
                                                       quote(q, l[i]), CONF_LIMIT_MAX);
                        }
                        slots = (unsigned) v;
                }
                if (!conf_name_is_valid(l[i])) {
                        lane_also_free(a, i);
                        return conf_errors_add(errors, source, k->name,
                                               "invalid pool name %s (expected 1 to %d characters from A-Z a-z 0-9 . _ -)",
                                               quote(q, l[i]), CONF_NAME_MAX);
                }
                for (size_t j = 0; j < i; j++)
                        if (streq(a[j].pool, l[i])) {
                                lane_also_free(a, i);
                                return conf_errors_add(errors, source, k->name, "pool %s is listed twice",
                                                       quote(q, l[i]));
                        }
                if (!(a[i].pool = strdup(l[i]))) {
                        lane_also_free(a, i);
                        return oom(errors, source, k->name);
                }
                a[i].slots = slots;
        }
        if (conf_source_copy(&lane->also_source, n > 0 ? source : NULL) < 0) {
                lane_also_free(a, n);
                return oom(errors, source, k->name);
        }
        lane_also_free(lane->also, lane->n_also);
        lane->also = n > 0 ? a : mfree(a);
        lane->n_also = n;
        return 0;
}

/* quarantine-exit-codes = N… (SPEC §3.6): exit statuses 1–255; 0 is success and above 255 no exit status. */
static int set_pool_quarantine_exit_codes(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                                          ConfErrors *errors) {
        PoolConfig *p = object;
        char q[QUOTE_MAX];
        _cleanup_(strv_freep) char **l = NULL;
        uint64_t bits[4] = {};
        size_t n = 0;

        if (split_words(value, &l, &n) < 0)
                return oom(errors, source, k->name);
        for (size_t i = 0; i < n; i++) {
                uint64_t v;
                if (parse_u64(l[i], &v) < 0 || v < 1 || v > 255)
                        return conf_errors_add(errors, source, k->name,
                                               "invalid exit status %s (expected integers from 1 to 255: 0 is success)",
                                               quote(q, l[i]));
                if ((bits[v / 64] >> (v % 64)) & 1)
                        return conf_errors_add(errors, source, k->name, "exit status %s is listed twice",
                                               quote(q, l[i]));
                bits[v / 64] |= UINT64_C(1) << (v % 64);
        }
        if (conf_source_copy(&p->quarantine_exit_codes_source, n > 0 ? source : NULL) < 0)
                return oom(errors, source, k->name);
        memcpy(p->quarantine_exit_codes, bits, sizeof bits);
        p->quarantine_exit_codes_set = n > 0;
        return 0;
}

static int set_pool_quarantine_after(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                                     ConfErrors *errors) {
        PoolConfig *p = object;
        uint64_t v = 1;

        if (*value && parse_number(k, value, source, errors, &v) < 0)
                return -EINVAL;
        if (conf_source_copy(&p->quarantine_after_source, *value ? source : NULL) < 0)
                return oom(errors, source, k->name);
        p->quarantine_after = (unsigned) v;
        return 0;
}

static int set_lane_health(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                           ConfErrors *errors) {
        LaneConfig *l = object;
        char q[QUOTE_MAX];
        bool on, also = false;

        if (!*value || streq(value, "no") || streq(value, "false") || streq(value, "0"))
                on = false;
        else if (streq(value, "yes") || streq(value, "true") || streq(value, "1"))
                on = true;
        else if (streq(value, "also"))
                on = also = true;
        else
                return conf_errors_add(errors, source, k->name, "invalid value %s (expected yes, also or no)",
                                       quote(q, value));
        if (conf_source_copy(&l->health_source, on ? source : NULL) < 0)
                return oom(errors, source, k->name);
        l->health = on;
        l->health_also = also;
        return 0;
}

/* Infinity, like an empty value, leaves the pool without Q: no budgets. */
static int set_pool_queue_timeout(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                                  ConfErrors *errors) {
        PoolConfig *p = object;
        usec_t v = USEC_INFINITY;

        if (*value && parse_duration(k, value, source, errors, &v) < 0)
                return -EINVAL;
        p->queue_timeout_set = v != USEC_INFINITY;
        p->queue_timeout = p->queue_timeout_set ? v : 0;
        return 0;
}

static int set_pool_congestion_timeout(const ConfKey *k, void *object, const char *value,
                                       const ConfSource *source, ConfErrors *errors) {
        PoolConfig *p = object;
        usec_t v = 0;

        if (*value && parse_duration(k, value, source, errors, &v) < 0)
                return -EINVAL;
        if (conf_source_copy(&p->congestion_timeout_source, *value ? source : NULL) < 0)
                return oom(errors, source, k->name);
        p->congestion_timeout_set = *value;
        p->congestion_timeout = v;
        return 0;
}

/* cooldown = DUR (SPEC §3.6); empty: none. The source is kept: a shared pool refuses it in validation. */
static int set_pool_cooldown(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                             ConfErrors *errors) {
        PoolConfig *p = object;
        char q[QUOTE_MAX];
        usec_t v = 0;

        if (*value == '-')
                return conf_errors_add(errors, source, k->name, "duration %s is negative (expected %s, 0 for none)",
                                       quote(q, value), DURATION_HINT);
        if (*value && parse_duration(k, value, source, errors, &v) < 0)
                return -EINVAL;
        if (conf_source_copy(&p->cooldown_source, v > 0 ? source : NULL) < 0)
                return oom(errors, source, k->name);
        p->cooldown = v;
        return 0;
}

static int set_pool_backend(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                            ConfErrors *errors) {
        PoolConfig *p = object;
        char q[QUOTE_MAX];
        char *v = NULL;

        if (*value) {
                /* Only checked here: the connection is the daemon's business. */
                RedisEndpoint e;
                int r = redis_endpoint_parse(value, &e);
                if (r == -ENOMEM)
                        return oom(errors, source, k->name);
                if (r == -EPROTONOSUPPORT)
                        return conf_errors_add(errors, source, k->name,
                                               "invalid backend %s (no TLS: use a unix:// socket, a private network or a tunnel)",
                                               quote(q, value));
                if (r < 0)
                        return conf_errors_add(errors, source, k->name,
                                               "invalid backend %s (expected redis://HOST[:PORT][/DB], unix:///PATH[?db=DB], redis-sentinel://HOST[:PORT],…/MASTER[?db=DB], or nothing for a local pool)",
                                               quote(q, value));
                redis_endpoint_done(&e);
                v = strdup(value);
                if (!v)
                        return oom(errors, source, k->name);
        }
        free(p->backend);
        p->backend = v;
        return 0;
}

/* A word for a protocol field (node-name=, backend-user=): printable, no space, at most k->max bytes. */
static int set_word(const ConfKey *k, void *object, const char *value, const ConfSource *source, ConfErrors *errors) {
        char **field = FIELD(object, k, char *), q[QUOTE_MAX];
        char *v = NULL;

        if (*value) {
                if (strlen(value) > k->max)
                        return conf_errors_add(errors, source, k->name, "%s is too long (at most %" PRIu64 " bytes)",
                                               quote(q, value), k->max);
                for (const char *i = value; *i; i++)
                        if (!isgraph((unsigned char) *i))
                                return conf_errors_add(errors, source, k->name,
                                                       "%s contains a space or a control character", quote(q, value));
                v = strdup(value);
                if (!v)
                        return oom(errors, source, k->name);
        }
        free(*field);
        *field = v;
        return 0;
}

static int set_lane_pools(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                          ConfErrors *errors) {
        LaneConfig *l = object;
        char **v = NULL;
        size_t n = 0;

        if (split_words(value, &v, &n) < 0)
                return oom(errors, source, k->name);
        if (check_names(k, v, "pool", source, errors) < 0) {
                strv_free(v);
                return -EINVAL;
        }
        if (conf_source_copy(&l->pools_source, source) < 0) {
                strv_free(v);
                return oom(errors, source, k->name);
        }
        strv_free(l->pools);
        l->pools = v;
        l->n_pools = n;
        return 0;
}

static int set_lane_policy(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                           ConfErrors *errors) {
        LaneConfig *l = object;
        char q[QUOTE_MAX];
        LanePolicy p = DEFAULT_LANE_POLICY;

        if (*value) {
                p = lane_policy_from_string(value);
                if (p < 0)
                        return conf_errors_add(errors, source, k->name, "invalid policy %s (expected fail-fast or wait)",
                                               quote(q, value));
        }
        l->policy = p;
        return 0;
}

static int set_lane_priority(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                             ConfErrors *errors) {
        LaneConfig *l = object;
        char q[QUOTE_MAX];
        uint64_t v = 0;
        bool negative = value[0] == '-';

        if (*value) {
                int r = parse_u64(value + negative, &v);
                if (r == -EINVAL)
                        return conf_errors_add(errors, source, k->name,
                                               "invalid number %s (expected an integer from %d to %d)", quote(q, value),
                                               INT_MIN, INT_MAX);
                if (r < 0 || v > (uint64_t) INT_MAX + negative)
                        return conf_errors_add(errors, source, k->name,
                                               "%s is out of range (expected an integer from %d to %d)", quote(q, value),
                                               INT_MIN, INT_MAX);
        }
        l->priority = negative ? (int) (-(int64_t) v) : (int) v;
        return 0;
}

static int set_lane_max_in_use(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                               ConfErrors *errors) {
        LaneConfig *l = object;
        ConfSource s = {};

        /* Copied first: once set_cap() succeeded nothing may fail. */
        if (conf_source_copy(&s, *value ? source : NULL) < 0)
                return oom(errors, source, k->name);
        if (set_cap(k, object, value, source, errors) < 0) {
                conf_source_done(&s);
                return -EINVAL;
        }
        conf_source_done(&l->max_in_use_source);
        l->max_in_use_source = s;
        return 0;
}

static int set_lane_reserve(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                            ConfErrors *errors) {
        LaneConfig *l = object;
        ConfSource s = {};

        if (conf_source_copy(&s, *value ? source : NULL) < 0)
                return oom(errors, source, k->name);
        if (set_unsigned(k, object, value, source, errors) < 0) {
                conf_source_done(&s);
                return -EINVAL;
        }
        conf_source_done(&l->reserve_source);
        l->reserve_source = s;
        return 0;
}

/* Unlike the pool's, a lane's infinity is a value: its waiters wait without a budget. */
static int set_lane_queue_timeout(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                                  ConfErrors *errors) {
        LaneConfig *l = object;
        usec_t v = 0;

        if (*value && parse_duration(k, value, source, errors, &v) < 0)
                return -EINVAL;
        l->queue_timeout_set = *value;
        l->queue_timeout = v;
        return 0;
}

static int set_lane_client_wait(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                                ConfErrors *errors) {
        LaneConfig *l = object;
        char q[QUOTE_MAX];

        if (*value && !streq(value, "honor") && !streq(value, "ignore"))
                return conf_errors_add(errors, source, k->name, "invalid value %s (expected honor or ignore)",
                                       quote(q, value));
        l->client_wait_ignore = streq(value, "ignore");
        return 0;
}

static int set_id_list(const ConfKey *k, void *object, const char *value, const ConfSource *source,
                       ConfErrors *errors) {
        char ***field = FIELD(object, k, char **), q[QUOTE_MAX];
        char **l = NULL;
        size_t n = 0;

        if (split_words(value, &l, &n) < 0)
                return oom(errors, source, k->name);
        for (size_t i = 0; i < n; i++)
                if (!id_is_valid(l[i])) {
                        conf_errors_add(errors, source, k->name,
                                        "invalid %s %s (expected names or numeric ids, separated by spaces)",
                                        strstr(k->name, "-users") ? "user" : "group", quote(q, l[i]));
                        strv_free(l);
                        return -EINVAL;
                }
        strv_free(*field);
        *field = l;
        return 0;
}

static const ConfKey broker_keys[] = {
        { "socket", set_path, offsetof(BrokerConfig, socket_path), .max = SOCKET_PATH_MAX },
        { "state-directory", set_path, offsetof(BrokerConfig, state_directory), .max = PATH_MAX - 1 },
        { "audit", set_audit, offsetof(BrokerConfig, audit) },
        { "lease-persistence", set_lease_persistence, offsetof(BrokerConfig, lease_persistence) },
        { "history-retention", set_duration, offsetof(BrokerConfig, history_retention), .min = USEC_PER_SEC,
          .max = USEC_INFINITY, .def = DEFAULT_HISTORY_RETENTION },
        { "metrics-textfile", set_path, offsetof(BrokerConfig, metrics_textfile), .max = PATH_MAX - 1 },
        { "reclaim-grace", set_duration, offsetof(BrokerConfig, reclaim_grace), .min = 0, .max = USEC_INFINITY - 1,
          .def = DEFAULT_RECLAIM_GRACE },
        { "revoke-grace", set_duration, offsetof(BrokerConfig, revoke_grace), .min = 0, .max = USEC_INFINITY - 1,
          .def = DEFAULT_REVOKE_GRACE },
        { "exit-idle-after", set_duration, offsetof(BrokerConfig, exit_idle_after), .min = USEC_PER_MSEC,
          .max = USEC_INFINITY, .def = USEC_INFINITY },
        { "node-name", set_word, offsetof(BrokerConfig, node_name), .max = 255 },
        { "max-connections", set_unsigned, offsetof(BrokerConfig, max_connections), .min = 1,
          .max = CONF_CONNECTIONS_MAX, .def = DEFAULT_MAX_CONNECTIONS },
        { "max-connections-per-uid", set_unsigned, offsetof(BrokerConfig, max_connections_per_uid), .min = 1,
          .max = CONF_CONNECTIONS_MAX, .def = DEFAULT_MAX_CONNECTIONS_PER_UID },
        { "max-waiters-per-uid", set_unsigned, offsetof(BrokerConfig, max_waiters_per_uid), .min = 0,
          .max = CONF_CONNECTIONS_MAX, .def = DEFAULT_MAX_WAITERS_PER_UID },
        { "max-closing-fds-per-uid", set_unsigned, offsetof(BrokerConfig, max_closing_fds_per_uid), .min = 1,
          .max = CONF_CONNECTIONS_MAX, .def = DEFAULT_MAX_CLOSING_FDS_PER_UID },
        { "max-closing-fds", set_unsigned, offsetof(BrokerConfig, max_closing_fds), .min = 1,
          .max = CONF_CONNECTIONS_MAX, .def = DEFAULT_MAX_CLOSING_FDS },
        { "max-acquire-rate-per-uid", set_rate, offsetof(BrokerConfig, max_acquire_rate_per_uid),
          .max = ACQUIRE_RATE_MAX, .def = DEFAULT_MAX_ACQUIRE_RATE_PER_UID },
        { "max-acquire-burst-per-uid", set_unsigned, offsetof(BrokerConfig, max_acquire_burst_per_uid), .min = 1,
          .max = CONF_CONNECTIONS_MAX, .def = DEFAULT_MAX_ACQUIRE_BURST_PER_UID },
        { "max-acquire-rate", set_rate, offsetof(BrokerConfig, max_acquire_rate), .max = ACQUIRE_RATE_MAX,
          .def = DEFAULT_MAX_ACQUIRE_RATE },
        { "max-message-size", set_bytes, offsetof(BrokerConfig, max_message_size), .min = 1024,
          .max = 16 * 1024 * 1024, .def = DEFAULT_MAX_MESSAGE_SIZE },
        { "max-output-per-connection", set_bytes, offsetof(BrokerConfig, max_output_per_connection), .min = 4096,
          .max = 1024 * 1024 * 1024, .def = DEFAULT_MAX_OUTPUT_PER_CONNECTION },
};

static const ConfKey pool_keys[] = {
        { "limit", set_pool_limit, 0, .min = 1, .max = CONF_LIMIT_MAX },
        { "members", set_pool_members },
        { "queue-timeout", set_pool_queue_timeout, .min = 1, .max = USEC_INFINITY },
        { "queue-congestion-timeout", set_pool_congestion_timeout, .min = 0, .max = USEC_INFINITY - 1 },
        { "max-queue", set_cap, offsetof(PoolConfig, max_queue), .min = 0, .max = INT64_MAX, .infinity = true },
        { "cooldown", set_pool_cooldown, .min = 0, .max = CONF_COOLDOWN_MAX },
        { "backend", set_pool_backend },
        { "backend-user", set_word, offsetof(PoolConfig, backend_user), .max = 255 },
        { "backend-password-file", set_path, offsetof(PoolConfig, backend_password_file), .max = PATH_MAX - 1 },
        { "backend-sentinel-password-file", set_path, offsetof(PoolConfig, backend_sentinel_password_file),
          .max = PATH_MAX - 1 },
        { "backend-node-ttl", set_duration, offsetof(PoolConfig, backend_node_ttl), .min = USEC_PER_SEC,
          .max = 24 * USEC_PER_HOUR, .def = CONF_NODE_TTL_DEFAULT },
        { "backend-min-replicas", set_unsigned, offsetof(PoolConfig, backend_min_replicas), .min = 0,
          .max = CONF_MIN_REPLICAS_MAX, .def = 0 },
        { "backend-min-replicas-timeout", set_duration, offsetof(PoolConfig, backend_min_replicas_timeout),
          .min = CONF_MIN_REPLICAS_TIMEOUT_MIN, .max = CONF_MIN_REPLICAS_TIMEOUT_MAX,
          .def = CONF_MIN_REPLICAS_TIMEOUT_DEFAULT },
        { "quarantine-exit-codes", set_pool_quarantine_exit_codes },
        { "quarantine-after", set_pool_quarantine_after, .min = 1, .max = CONF_QUARANTINE_AFTER_MAX },
        { "admin-users", set_id_list, offsetof(PoolConfig, admin_users) },
        { "admin-groups", set_id_list, offsetof(PoolConfig, admin_groups) },
};

static const ConfKey lane_keys[] = {
        { "pools", set_lane_pools },
        { "policy", set_lane_policy },
        { "priority", set_lane_priority },
        { "max-in-use", set_lane_max_in_use, offsetof(LaneConfig, max_in_use), .min = 1, .max = CONF_LIMIT_MAX,
          .infinity = true },
        { "reserve", set_lane_reserve, offsetof(LaneConfig, reserve), .min = 0, .max = CONF_LIMIT_MAX },
        { "queue-timeout", set_lane_queue_timeout, .min = 1, .max = USEC_INFINITY },
        { "client-wait", set_lane_client_wait },
        { "max-hold", set_duration, offsetof(LaneConfig, max_hold), .min = USEC_PER_MSEC, .max = USEC_INFINITY,
          .def = USEC_INFINITY },
        { "labels", set_lane_labels },
        { "also", set_lane_also },
        { "allow-users", set_id_list, offsetof(LaneConfig, allow_users) },
        { "allow-groups", set_id_list, offsetof(LaneConfig, allow_groups) },
        { "health", set_lane_health },
};

static const ConfKey *find_key(const ConfKey *keys, size_t n, const char *name) {
        for (size_t i = 0; i < n; i++)
                if (streq(keys[i].name, name))
                        return keys + i;
        return NULL;
}

static int unknown_key(const ConfKey *keys, size_t n, const char *section, const char *key,
                       const ConfSource *source, ConfErrors *errors) {
        char known[512] = "";
        size_t len = 0;

        for (size_t i = 0; i < n; i++) {
                int k = snprintf(known + len, sizeof known - len, "%s%s", i > 0 ? ", " : "", keys[i].name);
                if (k < 0 || (size_t) k >= sizeof known - len)
                        break;
                len += (size_t) k;
        }
        return conf_errors_add(errors, source, key, "unknown key in [%s] (known keys: %s)", section, known);
}

/* "broker", "pool NAME", "lane NAME"; the name is copied to name_buf. */
static int section_parse(const char *section, const char *key, const ConfSource *source, ConfErrors *errors,
                         SectionKind *ret_kind, char name_buf[static CONF_NAME_MAX + 1]) {
        char q[QUOTE_MAX];
        const char *p = section;
        size_t n = strcspn(p, " \t");
        SectionKind kind;

        if (n == 6 && strncmp(p, "broker", 6) == 0)
                kind = SECTION_BROKER;
        else if (n == 4 && strncmp(p, "pool", 4) == 0)
                kind = SECTION_POOL;
        else if (n == 4 && strncmp(p, "lane", 4) == 0)
                kind = SECTION_LANE;
        else if (*p == '\0' && key)
                return conf_errors_add(errors, source, key,
                                       "setting outside of any section (expected it under [broker], [pool NAME] or [lane NAME])");
        else
                return conf_errors_add(errors, source, key,
                                       "unknown section [%.*s] (expected [broker], [pool NAME] or [lane NAME])",
                                       (int) MIN(strlen(section), (size_t) 64), section);

        p += n;
        p += strspn(p, " \t");
        if (kind == SECTION_BROKER) {
                if (*p)
                        return conf_errors_add(errors, source, key, "[broker] takes no name, got %s", quote(q, p));
                name_buf[0] = '\0';
        } else {
                const char *what = kind == SECTION_POOL ? "pool" : "lane";
                size_t m = strcspn(p, " \t");

                if (m == 0)
                        return conf_errors_add(errors, source, key, "[%s] needs a name: [%s NAME]", what, what);
                if (p[m + strspn(p + m, " \t")] != '\0')
                        return conf_errors_add(errors, source, key,
                                               "[%s] takes one name, got %s (names cannot contain spaces)", what,
                                               quote(q, p));
                memcpy(name_buf, p, MIN(m, (size_t) CONF_NAME_MAX));
                name_buf[MIN(m, (size_t) CONF_NAME_MAX)] = '\0';
                if (m > CONF_NAME_MAX || !conf_name_is_valid(name_buf))
                        return conf_errors_add(errors, source, key,
                                               "invalid %s name %s%s (expected 1 to %d characters from A-Z a-z 0-9 . _ -)",
                                               what, quote(q, name_buf), m > CONF_NAME_MAX ? "..." : "", CONF_NAME_MAX);
        }
        *ret_kind = kind;
        return 0;
}

/* Finds or creates the section's pool or lane; *ret_created tells whether it is new. */
static int section_object(BrokerConfig *c, SectionKind kind, const char *name, const char *key,
                          const ConfSource *source, ConfErrors *errors, void **ret, bool *ret_created) {
        int r;

        *ret_created = false;
        if (kind == SECTION_BROKER) {
                *ret = c;
                return 0;
        }
        if (kind == SECTION_POOL) {
                PoolConfig *p = conf_find_pool(c, name);
                if (!p) {
                        if (c->n_pools >= CONF_SECTIONS_MAX)
                                return conf_errors_add(errors, source, key, "too many pools (at most %d)",
                                                       CONF_SECTIONS_MAX);
                        r = pool_add(c, name, source, &p);
                        if (r < 0)
                                return oom(errors, source, key);
                        *ret_created = true;
                }
                *ret = p;
                return 0;
        }
        LaneConfig *l = conf_find_lane(c, name);
        if (!l) {
                if (c->n_lanes >= CONF_SECTIONS_MAX)
                        return conf_errors_add(errors, source, key, "too many lanes (at most %d)", CONF_SECTIONS_MAX);
                r = lane_add(c, name, source, &l);
                if (r < 0)
                        return oom(errors, source, key);
                *ret_created = true;
        }
        *ret = l;
        return 0;
}

int conf_section_add(BrokerConfig *c, const char *section, const ConfSource *source, ConfErrors *errors) {
        char name[CONF_NAME_MAX + 1];
        SectionKind kind;
        void *object;
        bool created;

        assert_return(c, -EINVAL);
        assert_return(section, -EINVAL);

        if (section_parse(section, NULL, source, errors, &kind, name) < 0)
                return -EINVAL;
        return section_object(c, kind, name, NULL, source, errors, &object, &created);
}

int conf_set(BrokerConfig *c, const char *section, const char *key, const char *value, const ConfSource *source,
             ConfErrors *errors) {
        char name[CONF_NAME_MAX + 1];
        const ConfKey *keys, *k;
        SectionKind kind;
        size_t n_keys;
        void *object;
        bool created;
        int r;

        assert_return(c, -EINVAL);
        assert_return(section, -EINVAL);
        assert_return(key, -EINVAL);
        assert_return(value, -EINVAL);

        if (section_parse(section, key, source, errors, &kind, name) < 0)
                return -EINVAL;
        keys = kind == SECTION_BROKER ? broker_keys : kind == SECTION_POOL ? pool_keys : lane_keys;
        n_keys = kind == SECTION_BROKER ? ELEMENTSOF(broker_keys)
                 : kind == SECTION_POOL ? ELEMENTSOF(pool_keys)
                                        : ELEMENTSOF(lane_keys);
        if (!*key)
                return conf_errors_add(errors, source, NULL, "missing key name before = (expected KEY=VALUE)");
        k = find_key(keys, n_keys, key);
        bool label = kind == SECTION_POOL && strncmp(key, "label.", strlen("label.")) == 0;
        if (!k && !label)
                return unknown_key(keys, n_keys, kind == SECTION_BROKER ? "broker" : section, key, source, errors);

        /* Values are compared exactly below, so surrounding whitespace goes (as the INI reader strips it). */
        while (isspace((unsigned char) *value))
                value++;
        size_t len = strlen(value);
        while (len > 0 && isspace((unsigned char) value[len - 1]))
                len--;
        _cleanup_free_ char *v = strndup(value, len);
        if (!v)
                return oom(errors, source, key);
        for (const unsigned char *p = (const unsigned char *) v; *p; p++)
                if ((*p < 0x20 && *p != '\t') || *p == 0x7f) {
                        char q[QUOTE_MAX];
                        return conf_errors_add(errors, source, key, "value %s contains a control character",
                                               quote(q, v));
                }

        r = section_object(c, kind, name, key, source, errors, &object, &created);
        if (r < 0)
                return r;
        r = label ? set_pool_label(object, key, v, source, errors) : k->set(k, object, v, source, errors);
        if (r < 0 && created) {
                /* The section came with this key: a failed key leaves no trace. */
                if (kind == SECTION_POOL)
                        pool_config_free(c->pools[--c->n_pools]);
                else
                        lane_config_free(c->lanes[--c->n_lanes]);
        }
        return r;
}

/* ---- the embedded default ---- */

int conf_new_default(unsigned n_cpus, BrokerConfig **ret) {
        static const struct {
                const char *section, *key, *value;
        } settings[] = {
                { "pool default", "queue-timeout", "5min" },
                { "lane merge", "pools", "default" },
                { "lane merge", "policy", "fail-fast" },
                { "lane nightly", "pools", "default" },
                { "lane nightly", "policy", "wait" },
                { "lane nightly", "queue-timeout", "infinity" },
        };
        const ConfSource source = { .file = (char *) "(embedded default)" };
        _cleanup_(conf_freep) BrokerConfig *c = NULL;
        char limit[16];
        int r;

        assert_return(ret, -EINVAL);

        r = conf_new(&c);
        if (r < 0)
                return r;
        snprintf(limit, sizeof limit, "%u", MIN(MAX(n_cpus, 1U), CONF_LIMIT_MAX));
        r = conf_set(c, "pool default", "limit", limit, &source, NULL);
        if (r < 0)
                return r;
        for (size_t i = 0; i < ELEMENTSOF(settings); i++) {
                r = conf_set(c, settings[i].section, settings[i].key, settings[i].value, &source, NULL);
                if (r < 0)
                        return r;
        }
        c->embedded_default = true;
        *ret = TAKE_PTR(c);
        return 0;
}

/* ---- cross-checks ---- */

static bool lane_uses_pool(const LaneConfig *l, const char *pool) {
        return strv_contains(l->pools, pool);
}

/* The indices of members[0..n) sorted by name, in *ret. Returns 0, -ENOMEM. */
static int members_order(char *const *members, size_t n, size_t **ret) {
        size_t *order = reallocarray(NULL, MAX(n, (size_t) 1), sizeof(size_t));
        if (!order)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++)
                order[i] = i;
        strv_order_sort(order, n, members, sizeof(char *));
        *ret = order;
        return 0;
}

/* Whether `name` is one of members[0..n) (`order` from members_order()); the position in `order` of the first
 * such in *ret_k (if not NULL). */
static bool members_order_find(char *const *members, const size_t *order, size_t n, const char *name,
                               size_t *ret_k) {
        size_t k = strv_order_lower_bound(order, n, members, sizeof(char *), name);
        if (ret_k)
                *ret_k = k;
        return k < n && streq(members[order[k]], name);
}

static int validate_pool(const BrokerConfig *c, const PoolConfig *p, ConfErrors *errors) {
        char a[TIMESPAN_MAX], b[TIMESPAN_MAX];
        int r = 0;

        /* memo §4.3: the node fences at TTL − (revoke-grace + 2 s) after its last acknowledged heartbeat. */
        if (p->backend &&
            p->backend_node_ttl < usec_add(usec_add(c->revoke_grace, 2 * USEC_PER_SEC), CONF_NODE_TTL_WINDOW_MIN))
                r = conf_errors_add(errors, &p->source, "backend-node-ttl",
                                    "pool %s: backend-node-ttl=%s must be at least revoke-grace + 5s (%s), or its leases would be revoked at the first missed heartbeat",
                                    p->name, timespan_format(a, sizeof a, p->backend_node_ttl),
                                    timespan_format(b, sizeof b,
                                                    usec_add(usec_add(c->revoke_grace, 2 * USEC_PER_SEC),
                                                             CONF_NODE_TTL_WINDOW_MIN)));
        if (!p->backend && p->backend_min_replicas > 0)
                r = conf_errors_add(errors, &p->source, "backend-min-replicas",
                                    "pool %s: backend-min-replicas=%u needs a Redis backend= (a local pool has no replicas)",
                                    p->name, p->backend_min_replicas);
        if (p->n_members == 0 && p->limit_given == 0)
                r = conf_errors_add(errors, &p->source, "limit", "pool %s has no slots: set limit= or members=",
                                    p->name);
        else if (p->n_members > 0 && p->limit_given > 0 && p->limit_given != p->n_members)
                r = conf_errors_add(errors, &p->limit_source, "limit",
                                    "pool %s has limit=%u but %zu members (limit= may be left out: it is the member count)",
                                    p->name, p->limit_given, p->n_members);
        if (p->limit > CONF_LIMIT_MAX)
                r = conf_errors_add(errors, &p->source, "limit", "pool %s has %u slots, more than %u", p->name,
                                    p->limit, CONF_LIMIT_MAX);
        /* Also on shared pools (SPEC §3.6): the scripts keep the quarantines in Redis (brokerd/lua/README). */
        if (p->n_members == 0 && p->quarantine_exit_codes_set)
                r = conf_errors_add(errors, &p->quarantine_exit_codes_source, "quarantine-exit-codes",
                                    "pool %s has no members= (quarantine takes members of a member pool out of use)",
                                    p->name);
        /* Label members are looked up in the members sorted by name: a scan of members= for each was 2.5e7
         * strcmp at every load for 10,000 members and a label on 5,000. */
        _cleanup_free_ size_t *order = NULL;
        size_t n_members = strv_length(p->members);
        if (p->n_labels > 0 && n_members > 0 && members_order(p->members, n_members, &order) < 0)
                return oom(errors, &p->members_source, "members");
        for (size_t i = 0; i < p->n_labels; i++) {
                const PoolLabel *l = p->labels + i;
                char key[CONF_NAME_MAX + sizeof "label."];
                snprintf(key, sizeof key, "label.%s", l->name);
                if (p->n_members == 0) {
                        r = conf_errors_add(errors, &l->source, key,
                                            "pool %s has no members= to label (labels name members of a member pool)",
                                            p->name);
                        continue;
                }
                for (size_t j = 0; l->members && l->members[j]; j++)
                        if (!members_order_find(p->members, order, n_members, l->members[j], NULL))
                                r = conf_errors_add(errors, &l->source, key,
                                                    "label %s names %s, which is not a member of pool %s (members=)",
                                                    l->name, l->members[j], p->name);
        }

        if (p->congestion_timeout_set) {
                if (!p->queue_timeout_set)
                        r = conf_errors_add(errors, &p->congestion_timeout_source, "queue-congestion-timeout",
                                            "pool %s has no queue-timeout=: the saturated budget needs one", p->name);
                else if (p->congestion_timeout > p->queue_timeout)
                        r = conf_errors_add(errors, &p->congestion_timeout_source, "queue-congestion-timeout",
                                            "%s exceeds queue-timeout=%s of pool %s (the saturated budget may not be longer)",
                                            timespan_format(a, sizeof a, p->congestion_timeout),
                                            timespan_format(b, sizeof b, p->queue_timeout), p->name);
        }

        /* Reservations: all of them must fit, and every lane must be left at least one slot. */
        uint64_t reserved = 0;
        const LaneConfig *last = NULL;
        for (size_t i = 0; i < c->n_lanes; i++)
                if (c->lanes[i]->reserve > 0 && lane_uses_pool(c->lanes[i], p->name)) {
                        reserved += c->lanes[i]->reserve;
                        last = c->lanes[i];
                }
        if (p->limit == 0 || !last)
                return r;
        if (reserved > p->limit)
                return conf_errors_add(errors, &last->reserve_source, "reserve",
                                       "lanes reserve %" PRIu64 " slots of pool %s, which has %u", reserved, p->name,
                                       p->limit);
        for (size_t i = 0; i < c->n_lanes; i++) {
                const LaneConfig *l = c->lanes[i];
                if (!lane_uses_pool(l, p->name) || reserved - l->reserve < p->limit)
                        continue;
                r = conf_errors_add(errors, &l->pools_source, "pools",
                                    "lane %s could never get a slot of pool %s: other lanes reserve all %u of them",
                                    l->name, p->name, p->limit);
        }
        return r;
}

/* A pool's name as slotctl run spells it in SLOT_<POOL>_*: upper-cased, other characters '_'. */
static char env_name_char(char c) {
        return isalnum((unsigned char) c) ? (char) toupper((unsigned char) c) : '_';
}

static bool env_name_equal(const char *a, const char *b) {
        for (; *a && *b; a++, b++)
                if (env_name_char(*a) != env_name_char(*b))
                        return false;
        return !*a && !*b;
}

/* The key by which two shared pools' backends differ, or NULL: the same backend, which brokerd reaches through
 * one command link (brokerd/backend.c: a Backend per URL, user and password files), so that one script call
 * can take keys of both. URLs compare as text: two spellings of one Redis are two backends here. */
static const char *backend_difference(const PoolConfig *a, const PoolConfig *b) {
        if (!streq(a->backend, b->backend))
                return "backend";
        if (!streq_ptr(a->backend_user, b->backend_user))
                return "backend-user";
        if (!streq_ptr(a->backend_password_file, b->backend_password_file))
                return "backend-password-file";
        if (!streq_ptr(a->backend_sentinel_password_file, b->backend_sentinel_password_file))
                return "backend-sentinel-password-file";
        return NULL;
}

/* The pools of a lane with also= (its pools= and its also=, every set it can make): all local, or all shared
 * through one backend (SPEC §3.5: one script call decides over the set). The first pair that breaks it is
 * named. Returns 0 or conf_errors_add()'s. */
static int validate_lane_set_backends(const BrokerConfig *c, const LaneConfig *l, ConfErrors *errors) {
        const PoolConfig *local = NULL, *shared = NULL;

        for (size_t i = 0; i < l->n_pools + l->n_also; i++) {
                const char *name = i < l->n_pools ? l->pools[i] : l->also[i - l->n_pools].pool;
                const PoolConfig *p = conf_find_pool(c, name);
                if (!p)
                        continue; /* said elsewhere */
                if (!p->backend) {
                        local = local ?: p;
                        continue;
                }
                if (!shared) {
                        shared = p;
                        continue;
                }
                const char *key = backend_difference(shared, p);
                if (key)
                        return conf_errors_add(errors, &l->also_source, "also",
                                               "lane %s takes pools %s and %s, whose %s= differ: an all-or-nothing set is all local or all on one backend (the same backend=, backend-user= and password files)",
                                               l->name, shared->name, p->name, key);
        }
        if (shared && local)
                return conf_errors_add(errors, &l->also_source, "also",
                                       "lane %s mixes shared (backend=) and local pools in one all-or-nothing set (%s is shared, %s local): a set is all local or all on one backend",
                                       l->name, shared->name, local->name);
        return 0;
}

/* An all-or-nothing set (SPEC §3.5): each also= pool defined, none of the lane's own pools= (a grant takes its
 * slots of the chosen pool once), big enough for K, and the set all local or all on one backend
 * (validate_lane_set_backends()). */
static int validate_lane_also(const BrokerConfig *c, const LaneConfig *l, ConfErrors *errors) {
        int r = 0;

        for (size_t i = 0; i < l->n_also; i++) {
                const LaneAlso *a = l->also + i;
                const PoolConfig *p = conf_find_pool(c, a->pool);
                if (!p) {
                        r = conf_errors_add(errors, &l->also_source, "also",
                                            "lane %s names pool %s, which is not defined (no [pool %s] section)",
                                            l->name, a->pool, a->pool);
                        continue;
                }
                if (lane_uses_pool(l, a->pool)) {
                        r = conf_errors_add(errors, &l->also_source, "also",
                                            "lane %s names its own pool %s in also= (pools= already takes its slots)",
                                            l->name, a->pool);
                        continue;
                }
                if (p->limit > 0 && a->slots > p->limit)
                        r = conf_errors_add(errors, &l->also_source, "also",
                                            "lane %s takes %u slots of pool %s, which has %u", l->name, a->slots,
                                            a->pool, p->limit);
                /* Its max-in-use= holds in each pool of the set: such a set is never granted, and holds back the
                 * queues of the other pools of its set while it waits (brokerd.conf(5), also=). */
                if (l->max_in_use > 0 && a->slots > l->max_in_use)
                        r = conf_errors_add(errors, &l->also_source, "also",
                                            "lane %s takes %u slots of pool %s with every grant, more than its max-in-use=%" PRId64 ": it could never be granted",
                                            l->name, a->slots, a->pool, l->max_in_use);
                /* slotctl run names its variables SLOT_<POOL>_…, upper-cased, other characters '_'. */
                for (size_t j = 0; j < i; j++)
                        if (env_name_equal(l->also[j].pool, a->pool)) {
                                char env[CONF_NAME_MAX + 1];
                                size_t k = 0;
                                for (; a->pool[k] && k < CONF_NAME_MAX; k++)
                                        env[k] = env_name_char(a->pool[k]);
                                env[k] = '\0';
                                r = conf_errors_add(errors, &l->also_source, "also",
                                                    "lane %s names pools %s and %s, whose variables would both be SLOT_%s_*",
                                                    l->name, l->also[j].pool, a->pool, env);
                        }
        }
        int k = validate_lane_set_backends(c, l, errors);
        return k < 0 ? k : r;
}

static const PoolLabel *pool_label(const PoolConfig *p, const char *name) {
        for (size_t i = 0; i < p->n_labels; i++)
                if (streq(p->labels[i].name, name))
                        return p->labels + i;
        return NULL;
}

/* Whether some member of p satisfies every term ("L": carries L, "!L": does not). Term by term over all members
 * at once, each label's members looked up in the members sorted by name: a scan of the label's list for each
 * member was O(members × label size). Returns 1, 0, -ENOMEM. */
static int pool_labels_satisfiable(const PoolConfig *p, char *const *terms) {
        size_t n = strv_length(p->members);
        if (n == 0)
                return 0;
        _cleanup_free_ size_t *order = NULL;
        _cleanup_free_ bool *ok = calloc(n, sizeof(bool)), *carried = calloc(n, sizeof(bool));
        if (!ok || !carried || members_order(p->members, n, &order) < 0)
                return -ENOMEM;
        memset(ok, true, n * sizeof(bool));
        for (size_t t = 0; terms[t]; t++) {
                bool negate = terms[t][0] == '!';
                /* A label the pool does not define is carried by none of its members. */
                const PoolLabel *label = pool_label(p, terms[t] + negate);
                memset(carried, false, n * sizeof(bool));
                for (size_t j = 0; label && label->members && label->members[j]; j++) {
                        size_t k;
                        if (!members_order_find(p->members, order, n, label->members[j], &k))
                                continue; /* not a member: validate_pool() says so */
                        for (; k < n && streq(p->members[order[k]], label->members[j]); k++)
                                carried[order[k]] = true;
                }
                for (size_t m = 0; m < n; m++)
                        ok[m] = ok[m] && carried[m] != negate;
        }
        for (size_t m = 0; m < n; m++)
                if (ok[m])
                        return 1;
        return 0;
}

/* Whether some member of the lane's pools satisfies every term of its labels=. None would make each request of
 * the lane a selector no member can ever match: InvalidParameter (SPEC §3.5). Returns 1, 0, -ENOMEM. */
static int lane_labels_satisfiable(const BrokerConfig *c, const LaneConfig *l) {
        for (size_t i = 0; i < l->n_pools; i++) {
                const PoolConfig *p = conf_find_pool(c, l->pools[i]);
                int k = p ? pool_labels_satisfiable(p, l->labels) : 0;
                if (k != 0)
                        return k;
        }
        return 0;
}

static int validate_lane(const BrokerConfig *c, const LaneConfig *l, ConfErrors *errors) {
        int r = 0, k;

        if (l->n_pools == 0)
                r = conf_errors_add(errors, l->pools_source.file ? &l->pools_source : &l->source, "pools",
                                    "lane %s names no pool (expected pools=NAME…, in order of preference)", l->name);
        for (size_t i = 0; i < l->n_pools; i++)
                if (!conf_find_pool(c, l->pools[i]))
                        r = conf_errors_add(errors, &l->pools_source, "pools",
                                            "lane %s names pool %s, which is not defined (no [pool %s] section)",
                                            l->name, l->pools[i], l->pools[i]);
        if (l->max_in_use == 0 || l->max_in_use < -1)
                r = conf_errors_add(errors, &l->max_in_use_source, "max-in-use",
                                    "lane %s has max-in-use=%" PRId64 " (expected at least 1, or infinity)", l->name,
                                    l->max_in_use);
        else if (l->max_in_use > 0 && l->reserve > l->max_in_use)
                r = conf_errors_add(errors, &l->reserve_source, "reserve",
                                    "lane %s reserves %u slots but may use only %" PRId64 " (max-in-use=)", l->name,
                                    l->reserve, l->max_in_use);
        if (l->labels) {
                bool any = false;
                for (size_t i = 0; i < l->n_pools; i++) {
                        const PoolConfig *p = conf_find_pool(c, l->pools[i]);
                        any = any || (p && p->n_members > 0);
                }
                if (!any)
                        r = conf_errors_add(errors, &l->labels_source, "labels",
                                            "lane %s has labels= but none of its pools has members=",
                                            l->name);
                else if ((k = lane_labels_satisfiable(c, l)) < 0)
                        r = oom(errors, &l->labels_source, "labels");
                else if (k == 0) {
                        char text[CONF_LANE_LABELS_MAX * (CONF_NAME_MAX + 2) + 1];
                        size_t n = 0;
                        text[0] = '\0';
                        for (size_t i = 0; l->labels[i] && n < sizeof text; i++)
                                n += (size_t) snprintf(text + n, sizeof text - n, "%s%s", i > 0 ? " " : "",
                                                       l->labels[i]);
                        r = conf_errors_add(errors, &l->labels_source, "labels",
                                            "lane %s has labels=%s, which no member of its pools satisfies: every request of the lane would be refused",
                                            l->name, text);
                }
        }
        if (l->n_also > 0 && validate_lane_also(c, l, errors) < 0)
                r = -EINVAL;
        if (l->health && l->n_also > 0)
                r = conf_errors_add(errors, &l->health_source, "health",
                                    "lane %s: a health lane takes no also= pools (it is granted quarantined members of its own pools)",
                                    l->name);
        for (size_t i = 0; l->health && i < l->n_pools; i++) {
                const PoolConfig *p = conf_find_pool(c, l->pools[i]);
                /* Also on shared pools: the scripts grant a health lane quarantined members (brokerd/lua/README). */
                if (p && p->n_members == 0)
                        r = conf_errors_add(errors, &l->health_source, "health",
                                            "lane %s: pool %s has no members= (a health lane is granted quarantined members)",
                                            l->name, p->name);
        }
        if (l->policy < 0 || l->policy >= _LANE_POLICY_MAX)
                r = conf_errors_add(errors, &l->source, "policy", "lane %s has no valid policy", l->name);
        return r;
}

int conf_validate(const BrokerConfig *c, ConfErrors *errors) {
        int r = 0;

        assert_return(c, -EINVAL);

        if (c->n_lanes == 0)
                r = conf_errors_add(errors, NULL, NULL,
                                    "no lane is configured: clients could acquire nothing (add a [lane NAME] section with pools=)");
        for (size_t i = 0; i < c->n_pools; i++)
                if (validate_pool(c, c->pools[i], errors) < 0)
                        r = -EINVAL;
        for (size_t i = 0; i < c->n_lanes; i++)
                if (validate_lane(c, c->lanes[i], errors) < 0)
                        r = -EINVAL;
        return r;
}

/* ---- dump ---- */

static void dump_path(FILE *f, const char *key, const char *value, const char *unset) {
        if (value)
                fprintf(f, "%s=%s\n", key, value);
        else
                fprintf(f, "#%s= (unset: %s)\n", key, unset);
}

static void dump_bytes(FILE *f, const char *key, size_t v) {
        if (v > 0 && v % (1024 * 1024) == 0)
                fprintf(f, "%s=%zuM\n", key, v / (1024 * 1024));
        else if (v > 0 && v % 1024 == 0)
                fprintf(f, "%s=%zuK\n", key, v / 1024);
        else
                fprintf(f, "%s=%zu\n", key, v);
}

static void dump_cap(FILE *f, const char *key, int64_t v) {
        if (v < 0)
                fprintf(f, "%s=infinity\n", key);
        else
                fprintf(f, "%s=%" PRId64 "\n", key, v);
}

void conf_dump(const BrokerConfig *c, FILE *f) {
        char t[TIMESPAN_MAX];

        if (!c || !f)
                return;

        fputs("[broker]\n", f);
        dump_path(f, "socket", c->socket_path, "the mode's default");
        dump_path(f, "state-directory", c->state_directory, "$STATE_DIRECTORY or /var/lib/brokerd");
        fprintf(f, "audit=%s\n", strempty(audit_level_to_string(c->audit)));
        fprintf(f, "lease-persistence=%s\n", strempty(lease_persistence_to_string(c->lease_persistence)));
        fprintf(f, "history-retention=%s\n", timespan_format(t, sizeof t, c->history_retention));
        dump_path(f, "metrics-textfile", c->metrics_textfile, "no textfile");
        fprintf(f, "reclaim-grace=%s\n", timespan_format(t, sizeof t, c->reclaim_grace));
        fprintf(f, "revoke-grace=%s\n", timespan_format(t, sizeof t, c->revoke_grace));
        fprintf(f, "exit-idle-after=%s\n", timespan_format(t, sizeof t, c->exit_idle_after));
        if (c->node_name)
                fprintf(f, "node-name=%s\n", c->node_name);
        else
                fputs("#node-name= (unset: the hostname)\n", f);
        fprintf(f, "max-connections=%u\n", c->max_connections);
        fprintf(f, "max-connections-per-uid=%u\n", c->max_connections_per_uid);
        fprintf(f, "max-waiters-per-uid=%u\n", c->max_waiters_per_uid);
        fprintf(f, "max-closing-fds-per-uid=%u\n", c->max_closing_fds_per_uid);
        fprintf(f, "max-closing-fds=%u\n", c->max_closing_fds);
        dump_rate(f, "max-acquire-rate-per-uid", c->max_acquire_rate_per_uid);
        fprintf(f, "max-acquire-burst-per-uid=%u\n", c->max_acquire_burst_per_uid);
        dump_rate(f, "max-acquire-rate", c->max_acquire_rate);
        dump_bytes(f, "max-message-size", c->max_message_size);
        dump_bytes(f, "max-output-per-connection", c->max_output_per_connection);

        for (size_t i = 0; i < c->n_pools; i++) {
                const PoolConfig *p = c->pools[i];

                fprintf(f, "\n[pool %s]\n", p->name);
                if (p->limit_given > 0)
                        fprintf(f, "limit=%u\n", p->limit_given);
                if (p->n_members > 0) {
                        fputs("members=", f);
                        fputs_words(p->members, f);
                        fputc('\n', f);
                }
                for (size_t j = 0; j < p->n_labels; j++) {
                        fprintf(f, "label.%s=", p->labels[j].name);
                        fputs_words(p->labels[j].members, f);
                        fputc('\n', f);
                }
                fprintf(f, "queue-timeout=%s\n",
                        p->queue_timeout_set ? timespan_format(t, sizeof t, p->queue_timeout) : "infinity");
                if (p->congestion_timeout_set)
                        fprintf(f, "queue-congestion-timeout=%s\n", timespan_format(t, sizeof t, p->congestion_timeout));
                else
                        fputs("#queue-congestion-timeout= (unset: queue-timeout/10, at least min(1s, queue-timeout))\n", f);
                dump_cap(f, "max-queue", p->max_queue);
                if (p->cooldown > 0)
                        fprintf(f, "cooldown=%s\n", timespan_format(t, sizeof t, p->cooldown));
                dump_path(f, "backend", p->backend, "local");
                if (p->backend) {
                        if (p->backend_user)
                                fprintf(f, "backend-user=%s\n", p->backend_user);
                        dump_path(f, "backend-password-file", p->backend_password_file, "no AUTH");
                        if (strncmp(p->backend, "redis-sentinel://", strlen("redis-sentinel://")) == 0)
                                dump_path(f, "backend-sentinel-password-file", p->backend_sentinel_password_file,
                                          "no AUTH");
                        fprintf(f, "backend-node-ttl=%s\n", timespan_format(t, sizeof t, p->backend_node_ttl));
                        fprintf(f, "backend-min-replicas=%u\n", p->backend_min_replicas);
                        fprintf(f, "backend-min-replicas-timeout=%s\n",
                                timespan_format(t, sizeof t, p->backend_min_replicas_timeout));
                }
                if (p->quarantine_exit_codes_set) {
                        fputs("quarantine-exit-codes=", f);
                        for (int v = 1, first = 1; v <= 255; v++)
                                if (pool_config_quarantines(p, v)) {
                                        fprintf(f, "%s%d", first ? "" : " ", v);
                                        first = 0;
                                }
                        fputc('\n', f);
                        fprintf(f, "quarantine-after=%u\n", p->quarantine_after);
                }
                if (p->admin_users) {
                        fputs("admin-users=", f);
                        fputs_words(p->admin_users, f);
                        fputc('\n', f);
                }
                if (p->admin_groups) {
                        fputs("admin-groups=", f);
                        fputs_words(p->admin_groups, f);
                        fputc('\n', f);
                }
        }

        for (size_t i = 0; i < c->n_lanes; i++) {
                const LaneConfig *l = c->lanes[i];

                fprintf(f, "\n[lane %s]\n", l->name);
                fputs("pools=", f);
                fputs_words(l->pools, f);
                fputc('\n', f);
                fprintf(f, "policy=%s\n", strempty(lane_policy_to_string(l->policy)));
                fprintf(f, "priority=%d\n", l->priority);
                dump_cap(f, "max-in-use", l->max_in_use);
                fprintf(f, "reserve=%u\n", l->reserve);
                if (l->queue_timeout_set)
                        fprintf(f, "queue-timeout=%s\n", timespan_format(t, sizeof t, l->queue_timeout));
                else
                        fputs("#queue-timeout= (unset: the pool's budget)\n", f);
                fprintf(f, "client-wait=%s\n", l->client_wait_ignore ? "ignore" : "honor");
                fprintf(f, "max-hold=%s\n", timespan_format(t, sizeof t, l->max_hold));
                if (l->labels) {
                        fputs("labels=", f);
                        fputs_words(l->labels, f);
                        fputc('\n', f);
                }
                if (l->also) {
                        fputs("also=", f);
                        for (size_t j = 0; j < l->n_also; j++)
                                fprintf(f, "%s%s:%u", j > 0 ? " " : "", l->also[j].pool, l->also[j].slots);
                        fputc('\n', f);
                }
                if (l->allow_users) {
                        fputs("allow-users=", f);
                        fputs_words(l->allow_users, f);
                        fputc('\n', f);
                } else
                        fputs("#allow-users= (unset: anyone who can reach the socket)\n", f);
                if (l->allow_groups) {
                        fputs("allow-groups=", f);
                        fputs_words(l->allow_groups, f);
                        fputc('\n', f);
                } else
                        fputs("#allow-groups= (unset: no group grants access)\n", f);
                if (l->health)
                        fputs(l->health_also ? "health=also\n" : "health=yes\n", f);
        }
}
