/* SPDX-License-Identifier: MIT */
/* report-data.h — what `slotctl report` shows, aggregated from history rows as they stream by in time order:
 * its memory grows with the report's range (its buckets and periods), pools and lanes, never with the number
 * of rows. Pure: no I/O, no clock. report.c feeds it from history.db; report-html.c draws it. */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "macro.h"
#include "time-util.h"

/* The refusals of SPEC §3.3, in the order the report lists them. */
typedef enum ReportReason {
        REPORT_REASON_BUSY,
        REPORT_REASON_FULL,
        REPORT_REASON_TIMEOUT,
        REPORT_REASON_SHED,
        REPORT_REASON_UNAVAILABLE,
        _REPORT_REASON_MAX,
        _REPORT_REASON_INVALID = -EINVAL,
} ReportReason;

const char *report_reason_to_string(ReportReason r);
ReportReason report_reason_from_string(const char *s);

/* Waits in logarithmic bins: bin 0 holds waits under 1 ms, bin i ≥ 1 those in [2^((i-1)/8), 2^(i/8)) ms, the
 * last one everything longer. A percentile read from them is the upper edge of its bin, capped at the longest
 * wait seen (0 in bin 0): at most 9% above the exact value, in a fixed 1 KiB however many waits there are. */
#define REPORT_WAIT_BINS_PER_OCTAVE 8
#define REPORT_WAIT_BINS (1 + 36 * REPORT_WAIT_BINS_PER_OCTAVE) /* up to 2^36 ms, two years */

typedef struct ReportWaits {
        uint64_t n;
        usec_t max;
        uint32_t bins[REPORT_WAIT_BINS];
} ReportWaits;

size_t report_wait_bin(usec_t wait);
/* The lower edge of a bin (0 for bin 0). */
usec_t report_wait_bin_floor(size_t bin);
void report_waits_add(ReportWaits *w, usec_t wait);
/* The p-quantile (0 < p ≤ 1) as above; 0 when there is no wait. */
usec_t report_waits_quantile(const ReportWaits *w, double p);

/* One column of a pool's timeline. */
typedef struct ReportBucket {
        unsigned in_use;          /* the most leases held at any instant of it */
        unsigned waiting;         /* the most requests waiting at any instant of it */
        bool congested;           /* at some instant of it, a request waited with the saturated budget */
} ReportBucket;

typedef struct ReportLane {
        char *name;
        uint64_t granted;
        uint64_t refused[_REPORT_REASON_MAX];
        ReportWaits waits;        /* of its grants in the range */
        ReportWaits *period_waits;                /* n_periods */
        uint64_t (*period_refused)[_REPORT_REASON_MAX];  /* n_periods */
} ReportLane;

/* One point of a capacity curve (--replay-sweep): the pool's recorded requests re-run at this limit. */
typedef struct ReportSweepPoint {
        unsigned limit;
        uint64_t requests, granted, refused;
        usec_t p95_wait, longest_wait;          /* of the grants */
} ReportSweepPoint;

/* The requests of a pool that asked the same of its members (SPEC §3.5: labels, a member), as history.db's
 * events.selector spells it. */
typedef struct ReportSelector {
        char *selector;           /* "arm64 !flaky @rig-c"; NULL: nothing asked */
        uint64_t requests, granted, waited;       /* waited: granted after a wait */
        usec_t longest_wait;      /* of its grants */
        uint64_t refused[_REPORT_REASON_MAX];
} ReportSelector;

/* One member of a member pool (SPEC §3.6, usage per member), from history.db's events.member (schema 6). */
typedef struct ReportMember {
        char *name;
        uint64_t grants;          /* leases granted it in the range */
        uint64_t holds;           /* leases of it that ended in the range */
        usec_t held;              /* their time held, each clipped to the range */
        uint64_t failures;        /* leases of it whose exit status quarantined it */
        uint64_t quarantines;     /* times it was quarantined, by an exit status or by a person */
} ReportMember;

/* The member rows a report reads. */
typedef enum ReportMemberKind {
        REPORT_MEMBER_GRANTED,
        REPORT_MEMBER_RELEASED,
        REPORT_MEMBER_QUARANTINED,
        _REPORT_MEMBER_KIND_MAX,
        _REPORT_MEMBER_KIND_INVALID = -EINVAL,
} ReportMemberKind;

typedef struct ReportPool {
        char *name;
        ReportBucket *buckets;    /* n_buckets */
        size_t n_filled;          /* buckets given their starting state so far */
        ReportLane *lanes;
        size_t n_lanes;

        /* The state as rows stream by (also before the range: a lease granted before it is held in it). */
        unsigned in_use, waiting, saturated;
        usec_t last_time;

        /* Over the range. */
        uint64_t granted, refused[_REPORT_REASON_MAX], refused_total, cancelled, released, revoked;
        unsigned peak_in_use, peak_waiting;
        usec_t congested_us;      /* time with a request waiting with the saturated budget */
        ReportWaits waits;
        bool clamped;             /* an end without its start (cut by retention): a count stayed at 0 */

        ReportSweepPoint *sweep;  /* the capacity curve, by limit; NULL: none asked for, or sweep_error */
        size_t n_sweep;
        char *sweep_error;        /* why a curve asked for could not be drawn */

        ReportSelector *selectors;/* the label sets asked most, REPORT_TABLE_ROWS at most */
        size_t n_selectors;
        uint64_t selectors_total; /* label sets in all, nothing asked counting as one */
        bool any_selector;        /* some request asked for labels or a member: the table helps */

        ReportMember *members;    /* by name; as many as the pool's members that have a row */
        size_t n_members;
} ReportPool;

/* A row of the report's tables: the longest holds, the revocations, the jobs refused most. */
typedef struct ReportRow {
        usec_t time;              /* realtime µs; 0: not applicable (jobs) */
        char *pool, *lane, *job, *lease, *what;   /* any may be NULL; what: revoked/overdue and why */
        usec_t duration;          /* the hold; USEC_INFINITY: not applicable */
        uint64_t count;           /* jobs: refusals */
        uint64_t refused[_REPORT_REASON_MAX];     /* jobs: by reason */
} ReportRow;

#define REPORT_TABLE_ROWS 10
#define REPORT_BUCKETS_MAX 600
/* Periods (of the waits and refusals) at most: the hours of 31 days, the days of two years; a longer range is
 * drawn per several days. Memory is this much per lane, whatever a row's time says. */
#define REPORT_PERIODS_MAX 744

typedef struct Report {
        usec_t since, until;      /* realtime µs: since ≤ time < until */
        usec_t bucket_us;
        size_t n_buckets;
        usec_t period_us;         /* an hour, a day for ranges beyond 31 days, whole days beyond two years */
        usec_t period_start;      /* since, floored to a whole period */
        size_t n_periods;
        ReportPool *pools;
        size_t n_pools;

        ReportRow holds[REPORT_TABLE_ROWS], revocations[REPORT_TABLE_ROWS], jobs[REPORT_TABLE_ROWS];
        size_t n_holds, n_revocations, n_jobs;
        uint64_t revocations_total; /* there may be more than the table shows */
        bool virtual_clock;       /* a simulation's times, from 0: shown as offsets, not dates */
} Report;

/* since < until; utc_offset: the local zone's at since (tm_gmtoff, in µs; 0 on a simulation's clock), to which the
 * periods are aligned: whole local hours and days. Returns 0, -EINVAL, -ENOMEM. */
int report_new(usec_t since, usec_t until, int64_t utc_offset, Report **ret);
Report *report_free(Report *r);
DEFINE_TRIVIAL_CLEANUP_FUNC(Report *, report_free);

/* Adds a pool that may have no event, so that the report says so; returns it or NULL (-ENOMEM). */
ReportPool *report_pool(Report *r, const char *name);

typedef enum ReportEventKind {
        REPORT_ARRIVED,           /* a request started waiting: fed for each row report_event_ends_wait() is true of,
                                   * at that row's time − wait */
        REPORT_GRANTED,
        REPORT_REFUSED,
        REPORT_CANCELLED,         /* the client went away while waiting */
        REPORT_RELEASED,          /* a lease ended (once per lease) */
        REPORT_REVOKED,           /* a lease was revoked or went overdue; it ends later with its release */
        _REPORT_EVENT_MAX,
        _REPORT_EVENT_INVALID = -EINVAL,
} ReportEventKind;

typedef struct ReportEvent {
        ReportEventKind kind;
        usec_t time;              /* realtime µs */
        const char *pool, *lane;  /* lane may be NULL (then "-") */
        usec_t wait;              /* 0 for none */
        bool saturated;           /* it waited with the saturated budget (state "saturated") */
        ReportReason reason;      /* REPORT_REFUSED */
} ReportEvent;

/* The rows that ended a wait (and whose arrivals must be fed as REPORT_ARRIVED): history.db's SQL and this
 * must agree, or the waiting counts drift. */
#define REPORT_WAIT_END_DECISIONS "('granted', 'busy', 'full', 'timeout', 'shed', 'unavailable', 'cancelled')"
bool report_event_ends_wait(const ReportEvent *e);

/* Events in time order (ties: as they come; an end fed before an arrival of the same instant frees first).
 * Events before the range move the state only; those at or after until must not be fed. Returns 0,
 * -EINVAL (an event before the previous one of its pool), -ENOMEM. */
int report_add(Report *r, const ReportEvent *e);

/* After the last event: the buckets after it keep the state it left, and the peaks are taken. */
void report_finish(Report *r);

/* Counts a label set of the pool (in the order to show them: most requests first), copying its text; those
 * beyond REPORT_TABLE_ROWS are only counted. Returns 0, -ENOMEM. */
int report_pool_add_selector(ReportPool *p, const ReportSelector *s);

/* A grant, release or quarantine row of the pool naming members ("rig-a,rig-c": each of them counts; an
 * empty name is skipped), at time (in the range: others must not be fed), with a release's hold and a
 * quarantine's exit status (-1: none, a person's). The members stay at most REPORT_MEMBERS_MAX a pool (the
 * rest are not counted). Returns 0, -EINVAL, -ENOMEM. */
#define REPORT_MEMBERS_MAX 1024
int report_member_add(Report *r, const char *pool, const char *members, ReportMemberKind kind, usec_t time, usec_t hold,
                      int exit_status);
/* The share of the range a member was held (0 … 1). */
double report_member_use(const Report *r, const ReportMember *m);

/* Appends a row to a table (copying its strings). Returns 0, -ENOSPC when the table is full, -ENOMEM. */
int report_table_add(ReportRow *table, size_t *n, const ReportRow *row);
