/* SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "report-data.h"

static const char *const report_reason_table[_REPORT_REASON_MAX] = {
        [REPORT_REASON_BUSY] = "busy",
        [REPORT_REASON_FULL] = "full",
        [REPORT_REASON_TIMEOUT] = "timeout",
        [REPORT_REASON_SHED] = "shed",
        [REPORT_REASON_UNAVAILABLE] = "unavailable",
};

DEFINE_STRING_TABLE_LOOKUP(report_reason, ReportReason, _REPORT_REASON_MAX)

/* 2^(i/8) for i in 0..7: the bins' edges within an octave (no libm: slotctl starts without it). */
static const double octave_steps[REPORT_WAIT_BINS_PER_OCTAVE] = {
        1.0, 1.0905077326652577, 1.189207115002721, 1.2968395546510096,
        1.4142135623730951, 1.5422108254079407, 1.681792830507429, 1.8340080864093424,
};

usec_t report_wait_bin_floor(size_t bin) {
        if (bin == 0)
                return 0;
        size_t i = bin - 1;
        double edge = octave_steps[i % REPORT_WAIT_BINS_PER_OCTAVE] * (double) USEC_PER_MSEC *
                      (double) (UINT64_C(1) << (i / REPORT_WAIT_BINS_PER_OCTAVE));
        usec_t u = (usec_t) edge;
        return (double) u < edge ? u + 1 : u;
}

size_t report_wait_bin(usec_t wait) {
        /* The last bin whose floor is ≤ wait, by bisection. */
        size_t lo = 0, hi = REPORT_WAIT_BINS - 1;
        while (lo < hi) {
                size_t mid = (lo + hi + 1) / 2;
                if (report_wait_bin_floor(mid) <= wait)
                        lo = mid;
                else
                        hi = mid - 1;
        }
        return lo;
}

void report_waits_add(ReportWaits *w, usec_t wait) {
        w->n++;
        w->max = MAX(w->max, wait);
        w->bins[report_wait_bin(wait)]++;
}

usec_t report_waits_quantile(const ReportWaits *w, double p) {
        if (w->n == 0)
                return 0;
        /* The rank of the p-quantile, 1-based: the lower one of a tie, as a median of an even count. */
        double x = p * (double) w->n;
        uint64_t rank = (uint64_t) x, seen = 0;
        if ((double) rank < x)
                rank++;
        rank = MAX(rank, (uint64_t) 1);
        for (size_t i = 0; i < REPORT_WAIT_BINS; i++) {
                seen += w->bins[i];
                if (seen >= rank)
                        /* Under 1 ms reads as 0: immediate grants are most, and ms is the precision shown. */
                        return i == 0 ? 0 : i + 1 < REPORT_WAIT_BINS ? MIN(report_wait_bin_floor(i + 1), w->max) : w->max;
        }
        return w->max;
}

/* Nice widths for the timeline's columns: the first that keeps a report within REPORT_BUCKETS_MAX. */
static usec_t bucket_width(usec_t range) {
        static const usec_t widths[] = {
                10 * USEC_PER_MSEC, 50 * USEC_PER_MSEC, 100 * USEC_PER_MSEC, 250 * USEC_PER_MSEC,
                500 * USEC_PER_MSEC, USEC_PER_SEC, 2 * USEC_PER_SEC, 5 * USEC_PER_SEC, 10 * USEC_PER_SEC,
                15 * USEC_PER_SEC, 30 * USEC_PER_SEC, USEC_PER_MINUTE, 2 * USEC_PER_MINUTE, 5 * USEC_PER_MINUTE,
                10 * USEC_PER_MINUTE, 15 * USEC_PER_MINUTE, 30 * USEC_PER_MINUTE, USEC_PER_HOUR,
                2 * USEC_PER_HOUR, 3 * USEC_PER_HOUR, 6 * USEC_PER_HOUR, 12 * USEC_PER_HOUR, USEC_PER_DAY,
        };
        for (size_t i = 0; i < ELEMENTSOF(widths); i++)
                if (DIV_ROUND_UP(range, widths[i]) <= REPORT_BUCKETS_MAX)
                        return widths[i];
        return DIV_ROUND_UP(DIV_ROUND_UP(range, REPORT_BUCKETS_MAX), USEC_PER_DAY) * USEC_PER_DAY;
}

int report_new(usec_t since, usec_t until, int64_t utc_offset, Report **ret) {
        if (since >= until || until == USEC_INFINITY)
                return -EINVAL;
        Report *r = calloc(1, sizeof(Report));
        if (!r)
                return -ENOMEM;
        r->since = since;
        r->until = until;
        r->bucket_us = bucket_width(until - since);
        r->n_buckets = DIV_ROUND_UP(until - since, r->bucket_us);
        /* Per hour, as people ask ("what happened at 3 am"); per day when hours would be too many to read; per
         * several days when days would be (a row of a clock that jumped centuries ahead makes the range that long). */
        usec_t range = until - since;
        r->period_us = range <= 31 * USEC_PER_DAY                      ? USEC_PER_HOUR :
                       range <= (REPORT_PERIODS_MAX - 1) * USEC_PER_DAY ? USEC_PER_DAY :
                                                                         ((range - 1) / ((REPORT_PERIODS_MAX - 1) * USEC_PER_DAY) + 1) * USEC_PER_DAY;
        /* Whole local hours and days: a day's bar is that day's, west of UTC too, and an hour at UTC+5:30 starts at
         * :00. A period's start before 1970 (a range from its first hours) is cut to 0. */
        int64_t p = (int64_t) r->period_us, into = ((int64_t) (since % r->period_us) + utc_offset % p + p) % p;
        r->period_start = (usec_t) into <= since ? since - (usec_t) into : 0;
        r->n_periods = DIV_ROUND_UP(until - r->period_start, r->period_us);
        *ret = r;
        return 0;
}

static void row_done(ReportRow *row) {
        free(row->pool);
        free(row->lane);
        free(row->job);
        free(row->lease);
        free(row->what);
}

Report *report_free(Report *r) {
        if (!r)
                return NULL;
        for (size_t i = 0; i < r->n_pools; i++) {
                ReportPool *p = &r->pools[i];
                for (size_t j = 0; j < p->n_lanes; j++) {
                        free(p->lanes[j].name);
                        free(p->lanes[j].period_waits);
                        free(p->lanes[j].period_refused);
                }
                free(p->lanes);
                free(p->buckets);
                free(p->sweep);
                free(p->sweep_error);
                for (size_t j = 0; j < p->n_selectors; j++)
                        free(p->selectors[j].selector);
                free(p->selectors);
                for (size_t j = 0; j < p->n_members; j++)
                        free(p->members[j].name);
                free(p->members);
                free(p->name);
        }
        free(r->pools);
        for (size_t i = 0; i < r->n_holds; i++)
                row_done(&r->holds[i]);
        for (size_t i = 0; i < r->n_revocations; i++)
                row_done(&r->revocations[i]);
        for (size_t i = 0; i < r->n_jobs; i++)
                row_done(&r->jobs[i]);
        free(r);
        return NULL;
}

ReportPool *report_pool(Report *r, const char *name) {
        for (size_t i = 0; i < r->n_pools; i++)
                if (streq(r->pools[i].name, name))
                        return &r->pools[i];
        ReportPool *a = reallocarray(r->pools, r->n_pools + 1, sizeof(ReportPool));
        if (!a)
                return NULL;
        r->pools = a;
        ReportPool *p = &r->pools[r->n_pools];
        *p = (ReportPool) {
                .name = strdup(name),
                .buckets = calloc(r->n_buckets, sizeof(ReportBucket)),
        };
        if (!p->name || !p->buckets) {
                free(p->name);
                free(p->buckets);
                return NULL;
        }
        r->n_pools++;
        return p;
}

int report_pool_add_selector(ReportPool *p, const ReportSelector *s) {
        p->selectors_total++;
        p->any_selector = p->any_selector || s->selector;
        if (p->n_selectors >= REPORT_TABLE_ROWS)
                return 0;
        ReportSelector *a = reallocarray(p->selectors, p->n_selectors + 1, sizeof(ReportSelector));
        if (!a)
                return -ENOMEM;
        p->selectors = a;
        a[p->n_selectors] = *s;
        if (s->selector && !(a[p->n_selectors].selector = strdup(s->selector)))
                return -ENOMEM;
        p->n_selectors++;
        return 0;
}

static ReportLane *pool_lane(const Report *r, ReportPool *p, const char *name) {
        for (size_t i = 0; i < p->n_lanes; i++)
                if (streq(p->lanes[i].name, name))
                        return &p->lanes[i];
        ReportLane *a = reallocarray(p->lanes, p->n_lanes + 1, sizeof(ReportLane));
        if (!a)
                return NULL;
        p->lanes = a;
        ReportLane *l = &p->lanes[p->n_lanes];
        *l = (ReportLane) {
                .name = strdup(name),
                .period_waits = calloc(r->n_periods, sizeof(ReportWaits)),
                .period_refused = calloc(r->n_periods, sizeof(*l->period_refused)),
        };
        if (!l->name || !l->period_waits || !l->period_refused) {
                free(l->name);
                free(l->period_waits);
                free(l->period_refused);
                return NULL;
        }
        p->n_lanes++;
        return l;
}

bool report_event_ends_wait(const ReportEvent *e) {
        return e->wait > 0 && (e->kind == REPORT_GRANTED || e->kind == REPORT_REFUSED || e->kind == REPORT_CANCELLED);
}

static bool in_range(const Report *r, usec_t t) {
        return t >= r->since && t < r->until;
}

/* The buckets up to and including the one of t start with the state the pool had before t. */
static void pool_fill_to(const Report *r, ReportPool *p, size_t bucket) {
        for (; p->n_filled <= bucket && p->n_filled < r->n_buckets; p->n_filled++)
                p->buckets[p->n_filled] = (ReportBucket) {
                        .in_use = p->in_use,
                        .waiting = p->waiting,
                        .congested = p->saturated > 0,
                };
}

/* Time with a saturated waiter, clipped to the range. */
static void pool_advance(const Report *r, ReportPool *p, usec_t t) {
        if (p->saturated > 0) {
                usec_t from = MAX(p->last_time, r->since), to = MIN(t, r->until);
                if (to > from)
                        p->congested_us += to - from;
        }
        p->last_time = t;
}

static void count_down(ReportPool *p, unsigned *n) {
        if (*n == 0)
                p->clamped = true;
        else
                (*n)--;
}

int report_add(Report *r, const ReportEvent *e) {
        if (!e->pool || e->kind < 0 || e->kind >= _REPORT_EVENT_MAX || e->time >= r->until)
                return -EINVAL;
        ReportPool *p = report_pool(r, e->pool);
        if (!p)
                return -ENOMEM;
        if (e->time < p->last_time)
                return -EINVAL;

        pool_advance(r, p, e->time);
        bool counted = in_range(r, e->time);
        size_t bucket = 0;
        if (counted) {
                bucket = (e->time - r->since) / r->bucket_us;
                pool_fill_to(r, p, bucket);
        }

        switch (e->kind) {
        case REPORT_ARRIVED:
                p->waiting++;
                if (e->saturated)
                        p->saturated++;
                break;
        case REPORT_GRANTED:
                p->in_use++;
                break;
        case REPORT_RELEASED:
                count_down(p, &p->in_use);
                break;
        default:
                break;
        }
        if (report_event_ends_wait(e)) {
                count_down(p, &p->waiting);
                if (e->saturated)
                        count_down(p, &p->saturated);
        }

        if (counted) {
                ReportBucket *b = &p->buckets[bucket];
                b->in_use = MAX(b->in_use, p->in_use);
                b->waiting = MAX(b->waiting, p->waiting);
                b->congested = b->congested || p->saturated > 0;
        }
        if (!counted || e->kind == REPORT_ARRIVED)
                return 0;

        size_t period = (e->time - r->period_start) / r->period_us;
        ReportLane *l = NULL;
        if (e->kind == REPORT_GRANTED || e->kind == REPORT_REFUSED) {
                l = pool_lane(r, p, e->lane ?: "-");
                if (!l)
                        return -ENOMEM;
        }
        switch (e->kind) {
        case REPORT_GRANTED:
                p->granted++;
                l->granted++;
                report_waits_add(&p->waits, e->wait);
                report_waits_add(&l->waits, e->wait);
                report_waits_add(&l->period_waits[period], e->wait);
                break;
        case REPORT_REFUSED:
                if (e->reason < 0 || e->reason >= _REPORT_REASON_MAX)
                        return -EINVAL;
                p->refused[e->reason]++;
                p->refused_total++;
                l->refused[e->reason]++;
                l->period_refused[period][e->reason]++;
                break;
        case REPORT_CANCELLED:
                p->cancelled++;
                break;
        case REPORT_RELEASED:
                p->released++;
                break;
        case REPORT_REVOKED:
                p->revoked++;
                break;
        default:
                break;
        }
        return 0;
}

void report_finish(Report *r) {
        for (size_t i = 0; i < r->n_pools; i++) {
                ReportPool *p = &r->pools[i];
                pool_advance(r, p, r->until);
                pool_fill_to(r, p, r->n_buckets - 1);
                for (size_t b = 0; b < r->n_buckets; b++) {
                        p->peak_in_use = MAX(p->peak_in_use, p->buckets[b].in_use);
                        p->peak_waiting = MAX(p->peak_waiting, p->buckets[b].waiting);
                }
        }
}

int report_table_add(ReportRow *table, size_t *n, const ReportRow *row) {
        if (*n >= REPORT_TABLE_ROWS)
                return -ENOSPC;
        ReportRow c = *row;
        c.pool = c.lane = c.job = c.lease = c.what = NULL;
        if (strdup_or_null(row->pool, &c.pool) < 0 || strdup_or_null(row->lane, &c.lane) < 0 ||
            strdup_or_null(row->job, &c.job) < 0 || strdup_or_null(row->lease, &c.lease) < 0 ||
            strdup_or_null(row->what, &c.what) < 0) {
                row_done(&c);
                return -ENOMEM;
        }
        table[(*n)++] = c;
        return 0;
}

static ReportMember *pool_member(ReportPool *p, const char *name, size_t len) {
        /* Kept sorted by name: the table lists them so, and a lookup bisects. */
        size_t lo = 0, hi = p->n_members;
        while (lo < hi) {
                size_t mid = (lo + hi) / 2;
                int c = strncmp(p->members[mid].name, name, len);
                if (c == 0)
                        c = p->members[mid].name[len] != '\0'; /* a longer name sorts after */
                if (c == 0)
                        return &p->members[mid];
                if (c < 0)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        if (p->n_members >= REPORT_MEMBERS_MAX)
                return NULL;
        ReportMember *a = reallocarray(p->members, p->n_members + 1, sizeof(ReportMember));
        if (!a)
                return NULL;
        p->members = a;
        char *n = strndup(name, len);
        if (!n)
                return NULL;
        memmove(&a[lo + 1], &a[lo], (p->n_members - lo) * sizeof(ReportMember));
        a[lo] = (ReportMember) { .name = n };
        p->n_members++;
        return &a[lo];
}

int report_member_add(Report *r, const char *pool, const char *members, ReportMemberKind kind, usec_t time, usec_t hold,
                      int exit_status) {
        if (!pool || !members || kind < 0 || kind >= _REPORT_MEMBER_KIND_MAX || !in_range(r, time))
                return -EINVAL;
        ReportPool *p = report_pool(r, pool);
        if (!p)
                return -ENOMEM;
        for (const char *s = members; *s;) {
                size_t len = strcspn(s, ",");
                if (len > 0) {
                        ReportMember *m = pool_member(p, s, len);
                        if (!m && p->n_members < REPORT_MEMBERS_MAX)
                                return -ENOMEM;
                        if (m)
                                switch (kind) {
                                case REPORT_MEMBER_GRANTED:
                                        m->grants++;
                                        break;
                                case REPORT_MEMBER_RELEASED:
                                        /* a lease granted before the range counts its time in it only */
                                        m->holds++;
                                        m->held = usec_add(m->held, MIN(hold, time - r->since));
                                        /* its command failed, as slotctl run told at the release */
                                        if (exit_status > 0)
                                                m->failures++;
                                        break;
                                case REPORT_MEMBER_QUARANTINED:
                                        m->quarantines++;
                                        break;
                                default:
                                        break;
                                }
                }
                s += len;
                if (*s == ',')
                        s++;
        }
        return 0;
}

double report_member_use(const Report *r, const ReportMember *m) {
        double u = (double) m->held / (double) (r->until - r->since);
        return u > 1 ? 1 : u;
}
