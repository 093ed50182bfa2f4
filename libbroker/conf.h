/* SPDX-License-Identifier: MIT */
/* conf.h — the configuration model (broker, pools, lanes) and the key=value rules shared by
 * brokerd's INI files and the simulator's scenario files. Pure: parsing values, no file I/O. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "macro.h"
#include "time-util.h"

typedef enum LanePolicy {
        LANE_POLICY_FAIL_FAST,
        LANE_POLICY_WAIT,
        _LANE_POLICY_MAX,
        _LANE_POLICY_INVALID = -EINVAL,
} LanePolicy;

typedef enum AuditLevel {
        AUDIT_DECISIONS, /* refusals, revocations, congestion, reload, restore */
        AUDIT_ALL,       /* and every grant and release */
        _AUDIT_LEVEL_MAX,
        _AUDIT_LEVEL_INVALID = -EINVAL,
} AuditLevel;

/* [broker] lease-persistence= (SPEC §3.4): whether a lease that could not be written may be granted. */
typedef enum LeasePersistence {
        LEASE_PERSISTENCE_REQUIRED,    /* never: refused (unavailable) while leases cannot be written or read */
        LEASE_PERSISTENCE_BEST_EFFORT, /* memory-only while the state directory fails; a restart may lose leases */
        _LEASE_PERSISTENCE_MAX,
        _LEASE_PERSISTENCE_INVALID = -EINVAL,
} LeasePersistence;

/* Where a setting came from, for error messages: "file:line". */
typedef struct ConfSource {
        char *file;
        unsigned line;
} ConfSource;

/* label.NAME = MEMBER… of a member pool (SPEC §3.5). */
typedef struct PoolLabel {
        char *name;
        char **members;               /* NULL-terminated; may be empty */
        ConfSource source;
} PoolLabel;

#define CONF_LABELS_MAX 256
#define CONF_LANE_LABELS_MAX 32
#define CONF_LANE_ALSO_MAX 16         /* also= pools per lane */

/* One pool of a lane's also= (SPEC §3.5): every grant of the lane takes `slots` slots of it too. */
typedef struct LaneAlso {
        char *pool;
        unsigned slots;               /* ≥ 1 */
} LaneAlso;
#define CONF_QUARANTINE_AFTER_MAX 1000

typedef struct PoolConfig {
        char *name;
        ConfSource source;            /* the [pool NAME] section header */
        unsigned limit;               /* slots; the member count when members are given */
        char **members;               /* NULL-terminated, or NULL for anonymous slots */
        size_t n_members;
        PoolLabel *labels;            /* in the order first set */
        size_t n_labels;
        bool queue_timeout_set;       /* Q: enables controlled-delay budgets */
        usec_t queue_timeout;
        bool congestion_timeout_set;  /* explicit saturated budget, used as given */
        usec_t congestion_timeout;
        ConfSource congestion_timeout_source;
        int64_t max_queue;            /* -1: no cap; 0: nobody may wait */
        char *backend;                /* NULL: local; a redis://, unix:// or redis-sentinel:// URL (redis-endpoint.h) */
        char *backend_user;           /* ACL user for AUTH; NULL: Redis's default user */
        char *backend_password_file;  /* NULL: no AUTH */
        char *backend_sentinel_password_file; /* the Sentinels' password; NULL: no AUTH to them */
        usec_t backend_node_ttl;      /* how long Redis keeps a silent node's leases (CONF_NODE_TTL_DEFAULT) */
        /* This node's, not a pool rule: a grant is answered only once WAIT says this many replicas hold its
         * lease (0: off), waiting at most the timeout (CONF_MIN_REPLICAS_TIMEOUT_DEFAULT). */
        unsigned backend_min_replicas;
        usec_t backend_min_replicas_timeout;
        /* Kept for conf_validate() and conf_dump(); the engine needs only `limit`. */
        unsigned limit_given;         /* limit= as written; 0: not given */
        ConfSource limit_source;
        ConfSource members_source;
        /* SPEC §3.6: the exit statuses (1–255) that mean "the member is broken, not the test", one bit each;
         * a member whose last quarantine_after leases all ended with one of them is quarantined. */
        uint64_t quarantine_exit_codes[4];
        bool quarantine_exit_codes_set;
        ConfSource quarantine_exit_codes_source;
        unsigned quarantine_after;    /* ≥ 1 (default 1) */
        ConfSource quarantine_after_source; /* line 0: not given */
        /* Who may quarantine, restore and drain this pool's members besides root (SPEC §3.6). NULL: none. */
        char **admin_users;
        char **admin_groups;
        /* cooldown=: a released slot rests this long before its next grant (SPEC §3.6); 0: none. */
        usec_t cooldown;
        ConfSource cooldown_source;
} PoolConfig;

static inline bool pool_config_quarantines(const PoolConfig *p, int exit_status) {
        return exit_status >= 1 && exit_status <= 255 &&
               (p->quarantine_exit_codes[exit_status / 64] >> (exit_status % 64)) & 1;
}

typedef struct LaneConfig {
        char *name;
        ConfSource source;            /* the [lane NAME] section header */
        char **pools;                 /* names, in order of preference; NULL-terminated */
        size_t n_pools;
        ConfSource pools_source;
        LanePolicy policy;
        int priority;                 /* higher is served first */
        int64_t max_in_use;           /* per pool; -1: no cap */
        unsigned reserve;             /* slots of each of its pools kept for this lane */
        bool queue_timeout_set;       /* replaces the pool's adaptive budget; may be USEC_INFINITY */
        usec_t queue_timeout;
        bool client_wait_ignore;      /* client-wait = ignore: wait/queueWaitMs hints are ignored */
        usec_t max_hold;              /* USEC_INFINITY: leases may be held forever */
        /* The lane's selector terms, "L" or "!L" (SPEC §3.5): every request of the lane carries them, and a
         * client may only add to them. NULL: none. */
        char **labels;
        ConfSource labels_source;
        char **allow_users;           /* NULL: anyone may use the lane (subject to the socket's mode) */
        char **allow_groups;
        ConfSource max_in_use_source; /* for conf_validate()'s messages */
        ConfSource reserve_source;
        /* also = POOL[:K]… (SPEC §3.5): pools every grant takes slots of too, all or nothing, with the pool the
         * lane's policy chose. NULL: none. */
        LaneAlso *also;
        size_t n_also;
        ConfSource also_source;
        /* health = yes (SPEC §3.6): the lane is granted quarantined members only; its exit 0 restores them. */
        bool health;
        /* health = also: quarantined members first, when enough are free at once; else ordinary ones, as any
         * lane (health set too). */
        bool health_also;
        ConfSource health_source;
} LaneConfig;

typedef struct BrokerConfig {
        char *socket_path;            /* NULL: the default for the mode (system/user) */
        char *state_directory;        /* NULL: /var/lib/brokerd or $STATE_DIRECTORY */
        AuditLevel audit;
        LeasePersistence lease_persistence;
        usec_t history_retention;
        char *metrics_textfile;
        usec_t reclaim_grace;         /* how long a restored connection-held lease waits for its owner */
        usec_t revoke_grace;          /* how long a revoked holder without a command has to let go */
        usec_t exit_idle_after;       /* USEC_INFINITY: never exit when idle */
        char *node_name;              /* this daemon's name in shared pools; NULL: the hostname */
        /* per-client limits (SPEC §10) */
        unsigned max_connections;
        unsigned max_connections_per_uid;
        unsigned max_waiters_per_uid;
        /* fds that clients passed waiting to be closed (brokerd's closer), per uid and in total */
        unsigned max_closing_fds_per_uid;
        unsigned max_closing_fds;
        /* Acquires on lanes with a shared pool, a token bucket each (issue 19 i): per uid and for the node,
         * in requests per hour (0: unlimited), the uid's burst in requests. */
        uint64_t max_acquire_rate_per_uid;
        unsigned max_acquire_burst_per_uid;
        uint64_t max_acquire_rate;
        size_t max_message_size;
        size_t max_output_per_connection;

        PoolConfig **pools;
        size_t n_pools;
        LaneConfig **lanes;
        size_t n_lanes;

        bool embedded_default;        /* conf_new_default()'s: no configuration file was there */
} BrokerConfig;

/* One configuration error: where, which key, and what is wrong. */
typedef struct ConfError {
        char *where;                  /* "file:line", or NULL */
        char *key;                    /* NULL for section-level errors */
        char *message;
} ConfError;

typedef struct ConfErrors {
        ConfError *errors;
        size_t n_errors;
        size_t n_dropped;             /* beyond CONF_ERRORS_MAX, or lost to a failed allocation */
} ConfErrors;

#define CONF_ERRORS_MAX 1000
#define CONF_NAME_MAX 64              /* pool, lane and member names: [A-Za-z0-9._-]{1,64} */
#define CONF_LIMIT_MAX 1000000U       /* slots per pool */
#define CONF_CONNECTIONS_MAX 1048576U /* max-connections= and the per-uid limits: no brokerd keeps more waiters */
#define CONF_SECTIONS_MAX 4096        /* pools, and lanes, per configuration */
#define CONF_NODE_TTL_DEFAULT (30 * USEC_PER_SEC)
#define CONF_COOLDOWN_MAX (24 * USEC_PER_HOUR) /* cooldown=: a rest longer than a day is a typo */
/* backend-node-ttl must leave this much of a heartbeat window once the self-fence margin (revoke-grace + 2 s)
 * is taken off: below it a node would fence itself at the first missed heartbeat. */
#define CONF_NODE_TTL_WINDOW_MIN (3 * USEC_PER_SEC)
/* backend-min-replicas-timeout: WAIT blocks the pool's command link for up to this long, and every call
 * pipelined behind it waits too; the link ends a call after 2 s (REDIS_LINK_COMMAND_TIMEOUT_DEFAULT), so
 * 1 s is also the most. */
#define CONF_MIN_REPLICAS_TIMEOUT_DEFAULT (1 * USEC_PER_SEC)
#define CONF_MIN_REPLICAS_TIMEOUT_MIN (10 * USEC_PER_MSEC)
#define CONF_MIN_REPLICAS_TIMEOUT_MAX (1 * USEC_PER_SEC)
#define CONF_MIN_REPLICAS_MAX 64

int conf_new(BrokerConfig **ret);
BrokerConfig *conf_free(BrokerConfig *c);
DEFINE_TRIVIAL_CLEANUP_FUNC(BrokerConfig *, conf_free);
/* A deep copy of c, sources and all: what conf_set() would go on from as on c. Returns 0, -ENOMEM. */
int conf_copy(const BrokerConfig *c, BrokerConfig **ret);

/* The embedded default: pool "default" (limit n_cpus, queue-timeout 5m), lane "merge" (fail-fast),
 * lane "nightly" (wait, queue-timeout infinity). */
int conf_new_default(unsigned n_cpus, BrokerConfig **ret);

/* Applies one key. section is "broker", "pool NAME" or "lane NAME"; source names the line.
 * Returns 0, or -EINVAL/-ENOMEM with an error appended to errors (the config is unchanged then). */
int conf_set(BrokerConfig *c, const char *section, const char *key, const char *value, const ConfSource *source,
             ConfErrors *errors);

/* Declares a section at its header line, so that a section without keys exists too and its source
 * names the header. conf_set() creates missing sections itself. Returns 0, or -EINVAL/-ENOMEM with an
 * error appended (unknown section, invalid name, too many sections). */
int conf_section_add(BrokerConfig *c, const char *section, const ConfSource *source, ConfErrors *errors);

/* Cross-checks (lanes naming missing pools, congestion timeout above Q, reserves above limits, …).
 * Returns 0 or -EINVAL with every problem appended to errors. */
int conf_validate(const BrokerConfig *c, ConfErrors *errors);

PoolConfig *conf_find_pool(const BrokerConfig *c, const char *name);
LaneConfig *conf_find_lane(const BrokerConfig *c, const char *name);
/* The most slots lane l can ever hold at once in pool `pool` (routed there by pools=, or taking slots of it with
 * every grant by also=), by the rules the pool gets: its limit, the lane's max-in-use and, but for a health lane,
 * the limit less what the other lanes routed there reserve (SPEC §3, lane limits: another lane's request has room
 * only while the free slots cover those reservations). A request for more can never be granted there, as one for
 * more than the limit. 0 for a pool that is not there. */
unsigned conf_lane_most(const BrokerConfig *c, const LaneConfig *l, const char *pool);

/* Prints the effective configuration as INI that conf_set() reads back unchanged. */
void conf_dump(const BrokerConfig *c, FILE *f);

/* Appends one error; errors may be NULL. Returns -EINVAL, for `return conf_errors_add(…);`. */
int conf_errors_add(ConfErrors *errors, const ConfSource *source, const char *key, const char *format, ...)
        _printf_(4, 5);
void conf_errors_done(ConfErrors *errors);
/* One error as "file:line: key: message" (the parts it has), the form every report of errors uses. Returns
 * a new string, or NULL when out of memory. */
char *conf_error_to_string(const ConfError *e);
/* conf_error_to_string() of each error, one per line. */
void conf_errors_print(const ConfErrors *errors, FILE *f);

/* "file:line", or "file" for line 0, into buf; NULL when there is no file. */
const char *conf_source_where(const ConfSource *source, char *buf, size_t size);

/* [a-z0-9_.-]{1,64}: the names of labels. */
bool conf_label_is_valid(const char *s);
/* [A-Za-z0-9._-]{1,64}: the names of pools, lanes and members. */
bool conf_name_is_valid(const char *s);
/* A person's reason (a drain's, a quarantine's, a reservation's): 1 to CONF_REASON_MAX bytes of one line
 * without a control character, C1 included, nor a line or paragraph separator (U+2028, U+2029). */
#define CONF_REASON_MAX 1024
bool conf_reason_is_valid(const char *s);
/* The length in bytes of the control character s starts with (C0 but NUL, DEL, C1 as UTF-8, U+2028, U+2029): what
 * a reason may not carry, and what one line of text shown or journaled must not; 0 if it starts with none. */
size_t conf_text_control_len(const char *s);
/* Whether s (NULL: none) has no control character (conf_text_control_len()): conf_text_sanitize() leaves it be. */
bool conf_text_is_one_line(const char *s);
/* Each control character of s (conf_text_control_len()) replaced by one '?', in place (s gets no longer). NULL
 * stays NULL. Returns s. */
char *conf_text_sanitize(char *s);

const char *lane_policy_to_string(LanePolicy p);
LanePolicy lane_policy_from_string(const char *s);
const char *audit_level_to_string(AuditLevel a);
AuditLevel audit_level_from_string(const char *s);
const char *lease_persistence_to_string(LeasePersistence p);
LeasePersistence lease_persistence_from_string(const char *s);
