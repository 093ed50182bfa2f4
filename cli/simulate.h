/* SPDX-License-Identifier: MIT */
/* simulate.h — the simulator behind `slotctl simulate` (simulate-verb.c): the real engine on a virtual
 * millisecond clock, and its reports. A library: it returns negative errno and prints only reports. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine.h"
#include "scenario.h"

/* The largest number waiting per second of virtual time: element s−1 covers [s−1, s) and holds the largest
 * count at the end of any instant in it; a second without instants carries the count of the last instant. */
typedef struct PeakQueue {
        uint32_t *seconds;
        size_t n, allocated;
        uint32_t current;  /* the count after the last instant */
} PeakQueue;

void peak_queue_init(PeakQueue *p);
void peak_queue_done(PeakQueue *p);
/* Counts `waiting` at the end of the instant t_ms; instants come in time order. Returns 0, -ENOMEM, or
 * -E2BIG past SIM_SPAN_MAX_MS (its memory grows with the seconds covered). */
int peak_queue_observe(PeakQueue *p, uint64_t t_ms, uint32_t waiting);
uint32_t peak_queue_max(const PeakQueue *p);

typedef enum SimOutcome {
        SIM_OUTCOME_PENDING,  /* still waiting when nothing more could happen */
        SIM_OUTCOME_GRANTED,
        SIM_OUTCOME_REFUSED,
        SIM_OUTCOME_CANCELLED, /* its client went away while it waited (a request's cancel) */
        _SIM_OUTCOME_MAX,
        _SIM_OUTCOME_INVALID = -EINVAL,
} SimOutcome;

/* One request's story, kept only when it will be printed. */
typedef struct SimRecord {
        uint64_t id;
        uint64_t arrived_ms;
        uint64_t decided_ms;
        uint64_t waited_ms;
        const char *pool;     /* the scenario's copy; NULL before a pool decided anything */
        bool queued;
        QueueState state;
        usec_t idle;
        usec_t budget;        /* USEC_INFINITY: unbounded */
        SimOutcome outcome;
        Refusal refusal;
} SimRecord;

typedef struct SimResult {
        uint64_t requests;
        uint64_t granted;
        uint64_t refused[_REFUSAL_MAX];
        uint64_t late;
        uint64_t cancelled;         /* requests whose client went away while they waited */
        PeakQueue peaks;
        uint64_t first_refusal_ms;  /* SIM_FOREVER: none */
        uint64_t longest_wait_ms;
        uint64_t drained_ms;        /* SIM_FOREVER: null (a hold never ends, or nothing arrived) */
        uint64_t end_ms;            /* the last instant */
        uint64_t quarantined;       /* members quarantined by an exit status or by hand (SPEC §3.6) */
        uint64_t restored;          /* … and restored by a health lane's exit 0 or by hand */
        /* The scenario's reservations (SPEC §3.6), counted apart from requests: submitted, granted, refused
         * (a drained pool), the longest wait of those granted. Waiting ones count in the peak queue. */
        uint64_t reservations;
        uint64_t reserved;
        uint64_t reservations_refused;
        uint64_t longest_reservation_wait_ms;
        SimRecord *records;         /* in arrival order */
        size_t n_records;
} SimResult;

SimResult *sim_result_free(SimResult *r);
DEFINE_TRIVIAL_CLEANUP_FUNC(SimResult *, sim_result_free);

typedef struct SimOptions {
        uint64_t seed;
        bool per_request;     /* records for generated requests too */
        /* Makes the pools that have a backend; NULL: engine_pool_factory_local (their rules, in-process). */
        EnginePoolFactoryFn factory;
        void *factory_userdata;
        /* Called after every engine call until the pools that decide later have answered; NULL: none do.
         * The simulator knows nothing of what they talk to. Returns whether anything was answered: the
         * engine then takes the decisions, which may make calls of their own (a refusal routes the request
         * to its lane's next pool), and it is called again. */
        bool (*quiesce)(void *userdata);
        void *quiesce_userdata;
        /* Sees every engine event, in the order the run handles them (a test compares two runs). NULL: none. */
        void (*on_event)(const EngineEvent *ev, void *userdata);
        void *on_event_userdata;
        /* The key = value on every pool that scenario_build_config() was given for the run's config (NULL: none):
         * the scenario's reloads build theirs with it too. */
        const char *config_key, *config_value;
} SimOptions;

/* The most requests waiting at once in a run: no brokerd keeps more (max-connections= and the per-uid limits
 * stop at CONF_CONNECTIONS_MAX), and each costs memory. */
#define SIM_WAITING_MAX ((uint64_t) CONF_CONNECTIONS_MAX)

/* Runs a finished scenario against a validated config. Returns 0 or negative errno (-ENOMEM, -E2BIG when
 * the run goes on past SIM_SPAN_MAX_MS of virtual time, -ENOBUFS when more than SIM_WAITING_MAX wait at once,
 * or what the engine returned). */
int sim_run(const Scenario *s, const BrokerConfig *c, const SimOptions *o, SimResult **ret);

/* What a bound that sim_run() met (-E2BIG, -ENOBUFS) means to the person who gave the scenario, allocated;
 * NULL for any other error, or out of memory. */
char *sim_bound_text(int r);

/* The seeded random source handed to the engine. */
uint64_t sim_splitmix64(void *state);

void sim_print_text(const Scenario *s, const SimResult *r, FILE *f);
void sim_print_json(const Scenario *s, const SimResult *r, FILE *f);

/* Formats milliseconds as seconds floored to a tenth ("3.3"); returns buf. */
const char *sim_format_tenths(char *buf, size_t size, uint64_t ms);

/* One row of --sweep: the totals of the run for one value of the swept key. */
typedef struct SimSweepRow {
        uint64_t value;
        uint64_t requests, granted, late, longest_wait_ms;
        uint64_t refused[_REFUSAL_MAX];
        uint32_t peak;
} SimSweepRow;

void sim_sweep_row_init(SimSweepRow *row, uint64_t value, const SimResult *r);
/* A table with a row per value, headed by the key (text), or an array of objects (JSON). */
void sim_sweep_print_text(const char *key, const SimSweepRow *rows, size_t n, FILE *f);
void sim_sweep_print_json(const SimSweepRow *rows, size_t n, FILE *f);
