/* SPDX-License-Identifier: MIT */
/* scenario.h — what the simulator runs: pools and lanes (as the config's own key = value settings), arrival
 * phases and explicit requests, read from a scenario file or assembled from slotctl simulate's options. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conf.h"
#include "macro.h"
#include "time-util.h"

/* A hold that never ends, a deadline that never passes, an arrival that never comes (milliseconds). */
#define SIM_FOREVER UINT64_MAX

/* The most virtual time a run covers, and so the longest duration it takes: the report keeps the queue's
 * peak of every second (a year is 31,622,400 of them, 126 MB), so a longer run is refused rather than let
 * memory grow with it. */
#define SIM_SPAN_MAX_MS (UINT64_C(366) * 24 * 3600 * 1000)
#define SIM_SPAN_MAX_TEXT "366d"

/* Arrivals per second = num / den, kept exact so that floor(i × 1000 / rate) is exact too. */
typedef struct Rate {
        uint64_t num;
        uint64_t den; /* ≥ 1 */
} Rate;

/* One setting for conf_set(). `where` becomes its ConfSource (conf_validate() prints "where: key: message"),
 * origin names the value itself ("scenario.json: pools.grid.limit", "--limit"). */
typedef struct ScenarioSetting {
        char *section;
        char *key;
        char *value;
        char *where;
        char *origin;
        size_t reload;     /* 0: the first configuration's; k: from the scenario's k-th reload on */
} ScenarioSetting;

/* What each request of a phase, or one explicit request, asks for. */
typedef struct ScenarioTraffic {
        char *lane;
        unsigned slots;
        uint64_t hold_ms;  /* SIM_FOREVER: never ends */
        bool no_wait;      /* the client's wait: false */
        usec_t max_wait;   /* the client's queueWaitMs in µs; USEC_INFINITY: none */
        char **labels;     /* selector terms (SPEC §3.5): "L" or "!L"; NULL: none */
        char *member;      /* the member named; NULL: any */
        bool exits;        /* its command tells exit_status (0–255) at the end of its hold (SPEC §3.6) */
        int exit_status;
        char *origin;      /* "arrivals[0]", "requests[2]", "--arrivals" */
} ScenarioTraffic;

typedef struct ArrivalPhase {
        Rate rate;
        uint64_t duration_ms;
        uint64_t start_ms; /* phases run back to back */
        uint64_t count;    /* arrivals in the phase */
        uint64_t first;    /* index of its first arrival among all generated ones */
        ScenarioTraffic traffic;
} ArrivalPhase;

typedef struct ScenarioRequest {
        char *name;
        uint64_t at_ms;
        uint64_t cancel_ms; /* ≥ 1: its client goes away this long after `at` if still undecided (Ctrl-C, a CI
                             * job cancelled: engine_request_cancel()); SIM_FOREVER: never */
        ScenarioTraffic traffic;
} ScenarioRequest;

/* A drain or an undrain of a pool or member at an instant, as `slotctl drain POOL [MEMBER] --reason TEXT
 * [--until TIME]` and `slotctl undrain` (SPEC §3.6). In Scenario.quarantines: a member quarantined by hand, as
 * `slotctl quarantine POOL MEMBER --reason TEXT`, or restored (undrain), as `slotctl restore`; no until. */
typedef struct ScenarioDrain {
        uint64_t at_ms;
        char *pool;
        char *member;      /* NULL: the whole pool */
        bool undrain;
        uint64_t until_ms; /* > at_ms: undrained by itself then; SIM_FOREVER: never */
        char *reason;      /* NULL: none */
        char *origin;      /* "scenario.json: drains[0]", "scenario.json: quarantines[0]" */
} ScenarioDrain;

/* A reservation for a person at an instant, as `slotctl reserve POOL [--member M | --label L…] --for DUR
 * --reason TEXT` (SPEC §3.6): lane @reserve of its pool, ahead of every waiting job, a lease that ends after
 * `for` from its grant. */
typedef struct ScenarioReservation {
        uint64_t at_ms;
        char *pool;
        char *member;      /* NULL: any; never with labels */
        char **labels;     /* selector terms: "L" or "!L"; NULL: none */
        uint64_t for_ms;   /* ≥ 1 */
        char *reason;
        char *origin;      /* "scenario.json: reservations[0]" */
} ScenarioReservation;

/* A pool or lane that a reload adds or removes (SPEC §4: a reload's configuration may name new ones and leave
 * out old ones): from the reload-th configuration on it is there (present) or not. One the first configuration
 * has is there until a removal; one a reload adds, from then on. */
typedef struct ScenarioPresence {
        char *section;     /* "pool NAME", "lane NAME" */
        size_t reload;     /* ≥ 1 */
        bool present;
} ScenarioPresence;

typedef struct Scenario {
        char *origin;                /* the file name, or "slotctl simulate" */
        ScenarioSetting *settings;
        size_t n_settings;
        char **pools;                /* pool names in definition order (those reloads add too); records point
                                      * into these */
        char **pool_wheres;          /* where each was defined, for conf_section_add() */
        size_t n_pools;
        char **lanes;
        char **lane_wheres;
        size_t n_lanes;
        ArrivalPhase *phases;
        size_t n_phases;
        ScenarioRequest *requests;   /* in file order */
        size_t n_requests;
        size_t *request_order;       /* indices of requests by time, stable: file order within an instant */
        ScenarioDrain *drains;       /* by time, stable: file order within an instant */
        size_t n_drains;
        ScenarioReservation *reservations; /* by time, stable: file order within an instant */
        size_t n_reservations;
        ScenarioDrain *quarantines;  /* by time, stable: file order within an instant */
        size_t n_quarantines;
        size_t *cancel_order;        /* the explicit requests with a cancel, by when it comes (at + cancel),
                                      * stable: in request_order within an instant */
        size_t n_cancels;
        uint64_t *reloads;           /* when each reload comes, in time order (SPEC §4: a SIGHUP) */
        size_t n_reloads;
        ScenarioPresence *presences; /* the pools and lanes reloads add and remove, in reload order */
        size_t n_presences;
        uint64_t n_generated;        /* arrivals over all phases */
        uint64_t deadline_ms;        /* SIM_FOREVER: none */
        bool finished;
        bool reloads_in_order;       /* settings and presences in reload order (scenario_finish()) */
} Scenario;

/* Request ids: generated arrivals are 0 … n_generated−1 in arrival order (named "1", "2", …), explicit
 * requests follow in file order, then reservations in time order (scenario_reservation_id()). */

int scenario_new(const char *origin, Scenario **ret);
Scenario *scenario_free(Scenario *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(Scenario *, scenario_free);

/* Reads a scenario file (SPEC §9). On -EINVAL, *error names the culprit ("file: arrivals[0].rate: …");
 * -ENOMEM otherwise. Returns 0 and a finished scenario. */
int scenario_load_file(const char *path, char **error, Scenario **ret);
/* The same from a string; origin stands for the file name in messages. */
int scenario_load_string(const char *text, const char *origin, char **error, Scenario **ret);

/* Building a scenario from options: a setting, a lane/pool name, arrival phases "RATE/s:DURATION,…".
 * Each returns 0, -ENOMEM, or -EINVAL with *error set. */
int scenario_add_setting(Scenario *s, const char *section, const char *key, const char *value, const char *where,
                         const char *origin);
int scenario_add_pool(Scenario *s, const char *name, const char *where);
int scenario_add_lane(Scenario *s, const char *name, const char *where);
int scenario_add_phases(Scenario *s, const char *spec, const ScenarioTraffic *traffic, char **error);
/* Checks lanes, computes phase starts and counts, orders the explicit requests. */
int scenario_finish(Scenario *s, char **error);

/* The configuration to run: every setting through conf_set(), then `key = value` on every pool (a sweep;
 * key NULL for none), then conf_validate() and a check that every request fits some pool of its lane.
 * Returns 0, -ENOMEM, or -EINVAL with *error naming the setting. */
int scenario_build_config(const Scenario *s, const char *key, const char *value, char **error, BrokerConfig **ret);
/* The same as the scenario's reload-th reload makes it (0: the first), its settings over those before it, with
 * the pools and lanes it has then; each checks the requests, drains, quarantines and reservations that come
 * while it is in force, and the first checks every reload's too. `previous` (or NULL): the (reload − 1)-th as
 * this built it with the same key and value, which the reload-th is built on where that makes the same
 * configuration, in the time of its own settings rather than of all before it. */
int scenario_build_config_reload(const Scenario *s, const char *key, const char *value, size_t reload,
                                 const BrokerConfig *previous, char **error, BrokerConfig **ret);

/* The request id of reservation k (an index into s->reservations), past every request's: the engine's
 * userdata of its request, which scenario_traffic() knows nothing of. */
static inline uint64_t scenario_reservation_id(const Scenario *s, size_t k) {
        return s->n_generated + s->n_requests + k;
}

/* Which configuration is in force at `ms`: 0 for the first, k after the k-th reload (a reload at `ms` is
 * applied before the arrivals of that instant). */
size_t scenario_reload_at(const Scenario *s, uint64_t ms);

/* When request q's cancel comes (at + cancel; SIM_FOREVER: never). */
static inline uint64_t scenario_request_cancel_at(const ScenarioRequest *q) {
        return q->cancel_ms > SIM_FOREVER - q->at_ms ? SIM_FOREVER : q->at_ms + q->cancel_ms;
}

/* What request `id` asks for. */
const ScenarioTraffic *scenario_traffic(const Scenario *s, uint64_t id);
/* "C" for an explicit request; generated ones have no stored name (their number is id + 1). */
const char *scenario_request_name(const Scenario *s, uint64_t id);
/* The scenario's own copy of a pool name, to outlive the engine's. NULL if unknown. */
const char *scenario_pool_name(const Scenario *s, const char *name);

/* "40/s", "2.5/s", "90/min", "6/h"; 0 is allowed (a quiet phase). Returns 0 or -EINVAL. */
int parse_rate(const char *s, Rate *ret);
/* A time span in whole milliseconds (systemd syntax, a bare number counts seconds as in config files);
 * with allow_forever, "forever" and "infinity" give SIM_FOREVER. Returns 0, -EINVAL (syntax, or forever
 * where it is not allowed), -EDOM (a part below a millisecond: the virtual clock has none), -ERANGE (finite
 * but longer than SIM_SPAN_MAX_MS). */
int parse_duration_ms(const char *s, bool allow_forever, uint64_t *ret);
/* The messages of the simulator's loaders: replaces *error with the formatted text, which names the culprit
 * ("file: arrivals[0].rate: …", "--replay: …"). Returns -EINVAL, for `return scenario_error(error, …);`,
 * or -ENOMEM. */
int scenario_error(char **error, const char *format, ...) _printf_(2, 3);
/* Sets *error to what is wrong with duration s, the value of origin ("--hold", "x.json: requests[0].at"),
 * after parse_duration_ms() returned r < 0. Returns -EINVAL, or -ENOMEM. */
int scenario_duration_error(char **error, const char *origin, const char *s, int r);

/* How many arrivals a phase has: the i with floor(i × 1000 / rate) < duration. */
uint64_t arrival_phase_count(Rate rate, uint64_t duration_ms);
/* When the i-th arrival of a phase comes, from the phase's start: floor(i × 1000 / rate) ms. */
uint64_t arrival_phase_offset_ms(Rate rate, uint64_t i);

typedef struct Arrival {
        uint64_t at_ms;
        uint64_t id;
        const ScenarioTraffic *traffic;
} Arrival;

/* Walks the arrivals of a finished scenario in same-instant order: generated ones first, then explicit
 * requests in file order. O(1) per arrival, no allocation. */
typedef struct ArrivalCursor {
        const Scenario *scenario;
        size_t phase;
        uint64_t i;            /* next arrival within the phase */
        uint64_t next_gen_ms;  /* cached: when it comes; SIM_FOREVER when no phase has one left */
        size_t request;        /* next explicit request, in time order */
} ArrivalCursor;

void arrival_cursor_init(ArrivalCursor *c, const Scenario *s);
/* When the next arrival comes; SIM_FOREVER when none is left. */
uint64_t arrival_cursor_peek(const ArrivalCursor *c);
/* Takes the next arrival. Returns false when none is left. */
bool arrival_cursor_next(ArrivalCursor *c, Arrival *ret);
