/* SPDX-License-Identifier: MIT */
/* replay.h — `slotctl simulate --replay history.db`: the requests brokerd recorded for one pool, turned
 * into a scenario for the simulator, to be run against another pool configuration. */
#pragma once

#include <stdint.h>
#include <stdio.h>

#include "scenario.h"
#include "simulate.h"

typedef struct ReplayOptions {
        const char *path;          /* history.db */
        const char *pool;          /* NULL: the one pool the history has requests for */
        /* The pool settings of the run, as slotctl simulate's options give them; NULL: what the history
         * shows (see ReplayInfo). */
        const char *limit;
        const char *max_queue;
        const char *queue_timeout;
        const char *queue_congestion_timeout;
        const char *deadline;      /* --deadline; NULL: none */
        const char *sweep_key;     /* the pool setting --sweep varies ("limit", …): not inferred; NULL: none */
        /* --config: brokerd's configuration, for the pool's members and labels and its lanes' labels=,
         * which the recorded selectors (events.selector) are resolved against; NULL: none, and then a
         * history whose requests asked for labels or a member is refused. */
        const BrokerConfig *config;
        const char *config_path;
} ReplayOptions;

/* What the history gave, and what had to be assumed: said on stderr before the report. */
typedef struct ReplayInfo {
        char *pool;
        uint64_t requests;         /* granted and refused (busy, full, timeout, shed) rows of the pool */
        uint64_t reservations;     /* of those, grants of lane @reserve: replayed as reservations (SPEC §3.6) */
        uint64_t first_us, last_us;/* first arrival, last event of the history (µs, realtime) */
        uint64_t median_holds;     /* refused requests given their lane's median hold (their own is unknown) */
        uint64_t open_holds;       /* grants whose lease had not ended: held until the last event */
        uint64_t full_refusals;    /* recorded `full` refusals: the pool had a max-queue */
        unsigned inferred_limit;   /* 0: --limit given, or swept */
        usec_t inferred_queue_timeout;            /* USEC_INFINITY: given, or none recorded */
        usec_t inferred_congestion_timeout;       /* likewise */
        char **lanes;              /* "merge (fail-fast)", …; NULL-terminated */
        size_t members;            /* the pool's members, from --config; 0: none (anonymous slots) */
        uint64_t selectors;        /* requests that asked for labels or a member */
        usec_t cooldown;           /* the pool's cooldown= from --config; 0: none */
        bool quarantine;           /* quarantine-exit-codes= from --config: recorded exit statuses replayed */
} ReplayInfo;

void replay_info_done(ReplayInfo *info);

/* Reads the events of the pool from the database (opened read-only) and builds a finished scenario: the
 * pool with the given settings or the recorded ones, one lane per recorded lane (fail-fast when it never
 * queued anyone and was refused busy, else wait), and one request per granted or refused row: arriving at
 * time − wait, for 1 slot, holding its lease as long as the released/revoked row of the lease says (a
 * refused one: the median hold of its lane's grants), asking the labels and member it asked (events.selector;
 * the pool's members and labels, and its lanes' labels=, from o->config); a grant of lane ENGINE_RESERVE_LANE is
 * one of the scenario's reservations instead (SPEC §3.6: for as long as it was held, with its job as reason). The database's application_id and user_version are
 * checked before any table is read. Returns 0; -EINVAL with *error set (no such file, not a history by its
 * application_id, a newer brokerd's schema, no requests, several pools and no --pool, nothing to infer the
 * limit from when neither given nor swept, selectors but no members from o->config); -ENOMEM. */
int replay_load(const ReplayOptions *o, char **error, Scenario **ret, ReplayInfo *ret_info);

void replay_info_print(const ReplayInfo *info, FILE *f);

/* A replay's requests are explicit requests of the scenario, whose records the reports always print:
 * drops them unless --per-request asked for them. */
void replay_result_trim(SimResult *r);
