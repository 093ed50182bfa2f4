/* SPDX-License-Identifier: MIT */
/* test-report.c — slotctl report's aggregation (report-data) and drawing (report-html), fed events by hand:
 * what the timeline, the waits and the refusals hold, and what the page says and never contains. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "report-data.h"
#include "report-html.h"

#define S USEC_PER_SEC
#define MS USEC_PER_MSEC
#define T0 (1699999200 * S) /* a whole hour */

static void add(Report *r, ReportEventKind kind, usec_t at, const char *lane, usec_t wait, bool saturated,
                ReportReason reason) {
        ReportEvent e = {
                .kind = kind, .time = T0 + at, .pool = "grid", .lane = lane, .wait = wait, .saturated = saturated,
                .reason = reason,
        };
        assert_int_equal(report_add(r, &e), 0);
}

static const ReportBucket *bucket_at(const Report *r, const ReportPool *p, usec_t at) {
        return &p->buckets[(T0 + at - r->since) / r->bucket_us];
}

static void test_wait_bins_have_exact_edges_at_powers_of_two(void **state) {
        assert_int_equal(report_wait_bin(0), 0);
        assert_int_equal(report_wait_bin(999), 0);
        assert_int_equal(report_wait_bin(1000), 1);
        assert_int_equal(report_wait_bin_floor(1), 1000);
        assert_int_equal(report_wait_bin_floor(1 + REPORT_WAIT_BINS_PER_OCTAVE), 2000);
        assert_int_equal(report_wait_bin(1999), REPORT_WAIT_BINS_PER_OCTAVE);
        assert_int_equal(report_wait_bin(2000), 1 + REPORT_WAIT_BINS_PER_OCTAVE);
        assert_int_equal(report_wait_bin(USEC_INFINITY), REPORT_WAIT_BINS - 1);
        for (size_t i = 1; i < REPORT_WAIT_BINS; i++) {
                assert_true(report_wait_bin_floor(i) > report_wait_bin_floor(i - 1));
                assert_int_equal(report_wait_bin(report_wait_bin_floor(i)), i);
                assert_int_equal(report_wait_bin(report_wait_bin_floor(i) - 1), i - 1);
        }
}

static void test_quantiles_are_at_most_a_bin_high_and_the_max_is_exact(void **state) {
        ReportWaits w = {};
        assert_int_equal(report_waits_quantile(&w, 0.5), 0);
        for (usec_t i = 1; i <= 100; i++)
                report_waits_add(&w, i * 10 * MS); /* 10 ms … 1 s */
        usec_t p50 = report_waits_quantile(&w, 0.5), p95 = report_waits_quantile(&w, 0.95);
        assert_true(p50 >= 500 * MS && p50 <= 500 * MS * 109 / 100);
        assert_true(p95 >= 950 * MS && p95 <= 1000 * MS);
        assert_int_equal(report_waits_quantile(&w, 1), 1000 * MS);
        assert_int_equal(w.max, 1000 * MS);

        ReportWaits immediate = {};
        report_waits_add(&immediate, 0);
        report_waits_add(&immediate, 0);
        report_waits_add(&immediate, 3 * S);
        assert_int_equal(report_waits_quantile(&immediate, 0.5), 0);
        assert_int_equal(report_waits_quantile(&immediate, 0.95), 3 * S);
}

static void test_timeline_steps_with_grants_waits_and_congestion(void **state) {
        _cleanup_(report_freep) Report *r = NULL;
        assert_int_equal(report_new(T0, T0 + 10 * S, 0, &r), 0);
        assert_int_equal(r->bucket_us, 50 * MS); /* 200 columns: the first width within 600 */

        add(r, REPORT_GRANTED, 1 * S, "merge", 0, false, 0);
        add(r, REPORT_ARRIVED, 2 * S, NULL, 0, true, 0);             /* waits with the saturated budget… */
        add(r, REPORT_REFUSED, 3 * S, "merge", 0, false, REPORT_REASON_BUSY);
        add(r, REPORT_RELEASED, 4 * S, "merge", 0, false, 0);
        add(r, REPORT_GRANTED, 4 * S, "nightly", 2 * S, true, 0);    /* …until the slot frees at 4 s */
        add(r, REPORT_RELEASED, 6 * S, "nightly", 0, false, 0);
        report_finish(r);

        assert_int_equal(r->n_pools, 1);
        const ReportPool *p = &r->pools[0];
        assert_int_equal(bucket_at(r, p, 0)->in_use, 0);
        assert_int_equal(bucket_at(r, p, 1 * S)->in_use, 1);
        assert_int_equal(bucket_at(r, p, 1500 * MS)->in_use, 1); /* no event: the state carries on */
        assert_int_equal(bucket_at(r, p, 2500 * MS)->waiting, 1);
        assert_true(bucket_at(r, p, 2500 * MS)->congested);
        assert_false(bucket_at(r, p, 1500 * MS)->congested);
        assert_int_equal(bucket_at(r, p, 4500 * MS)->waiting, 0);
        assert_false(bucket_at(r, p, 4500 * MS)->congested);
        assert_int_equal(bucket_at(r, p, 4500 * MS)->in_use, 1);
        assert_int_equal(bucket_at(r, p, 7 * S)->in_use, 0);
        assert_int_equal(p->peak_in_use, 1);
        assert_int_equal(p->peak_waiting, 1);
        assert_int_equal(p->congested_us, 2 * S);
        assert_int_equal(p->granted, 2);
        assert_int_equal(p->refused[REPORT_REASON_BUSY], 1);
        assert_int_equal(p->waits.max, 2 * S);
        assert_false(p->clamped);
}

static void test_a_lease_granted_before_the_range_is_held_in_it(void **state) {
        _cleanup_(report_freep) Report *r = NULL;
        assert_int_equal(report_new(T0 + 10 * S, T0 + 20 * S, 0, &r), 0);
        add(r, REPORT_GRANTED, 1 * S, "merge", 0, false, 0);
        add(r, REPORT_RELEASED, 15 * S, "merge", 0, false, 0);
        report_finish(r);

        const ReportPool *p = &r->pools[0];
        assert_int_equal(p->buckets[0].in_use, 1);
        assert_int_equal(bucket_at(r, p, 16 * S)->in_use, 0);
        assert_int_equal(p->granted, 0); /* the grant is before the range: not counted in it */
        assert_int_equal(p->released, 1);
}

static void test_an_end_without_its_start_is_clamped_and_said(void **state) {
        _cleanup_(report_freep) Report *r = NULL;
        assert_int_equal(report_new(T0, T0 + 10 * S, 0, &r), 0);
        add(r, REPORT_RELEASED, 1 * S, "merge", 0, false, 0);
        add(r, REPORT_GRANTED, 2 * S, "merge", 0, false, 0);
        report_finish(r);
        const ReportPool *p = &r->pools[0];
        assert_true(p->clamped);
        assert_int_equal(bucket_at(r, p, 3 * S)->in_use, 1);
}

static void test_events_out_of_order_or_past_the_range_are_refused(void **state) {
        _cleanup_(report_freep) Report *r = NULL;
        assert_int_equal(report_new(T0, T0 + 10 * S, 0, &r), 0);
        add(r, REPORT_GRANTED, 5 * S, "merge", 0, false, 0);
        ReportEvent e = { .kind = REPORT_RELEASED, .time = T0 + 4 * S, .pool = "grid" };
        assert_int_equal(report_add(r, &e), -EINVAL);
        e.time = T0 + 10 * S;
        assert_int_equal(report_add(r, &e), -EINVAL);
        assert_int_equal(report_new(T0, T0, 0, &(Report *) { NULL }), -EINVAL);
}

static void test_refusals_are_counted_per_lane_reason_and_hour(void **state) {
        _cleanup_(report_freep) Report *r = NULL;
        assert_int_equal(report_new(T0, T0 + 3 * USEC_PER_HOUR, 0, &r), 0);
        assert_int_equal(r->n_periods, 3);
        assert_int_equal(r->period_us, USEC_PER_HOUR);
        add(r, REPORT_REFUSED, 10 * S, "merge", 0, false, REPORT_REASON_BUSY);
        add(r, REPORT_REFUSED, USEC_PER_HOUR + 10 * S, "merge", 0, false, REPORT_REASON_BUSY);
        add(r, REPORT_ARRIVED, USEC_PER_HOUR + 20 * S, NULL, 0, false, 0);
        add(r, REPORT_REFUSED, 2 * USEC_PER_HOUR + 20 * S, "nightly", USEC_PER_HOUR, false, REPORT_REASON_TIMEOUT);
        report_finish(r);

        const ReportPool *p = &r->pools[0];
        assert_int_equal(p->n_lanes, 2);
        assert_string_equal(p->lanes[0].name, "merge");
        assert_int_equal(p->lanes[0].period_refused[0][REPORT_REASON_BUSY], 1);
        assert_int_equal(p->lanes[0].period_refused[1][REPORT_REASON_BUSY], 1);
        assert_int_equal(p->lanes[1].period_refused[2][REPORT_REASON_TIMEOUT], 1);
        assert_int_equal(p->refused_total, 3);
        assert_int_equal(p->peak_waiting, 1);
        assert_int_equal(p->waits.n, 0); /* refused waits are not grants' waits */
}

/* ---- the page ---- */

static char *render(const Report *r) {
        char *buf = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&buf, &size);
        assert_non_null(f);
        assert_int_equal(report_html_write(r, &(ReportHtmlOptions) { .source = "history.db" }, f), 0);
        fclose(f);
        return buf;
}

static size_t count(const char *haystack, const char *needle) {
        size_t n = 0;
        for (const char *p = haystack; (p = strstr(p, needle)); p += strlen(needle))
                n++;
        return n;
}

static void test_page_has_the_charts_bars_and_figures(void **state) {
        _cleanup_(report_freep) Report *r = NULL;
        assert_int_equal(report_new(T0, T0 + 2 * USEC_PER_HOUR, 0, &r), 0);
        add(r, REPORT_GRANTED, 1 * S, "merge", 0, false, 0);
        add(r, REPORT_REFUSED, 2 * S, "merge", 0, false, REPORT_REASON_BUSY);
        add(r, REPORT_REFUSED, 3 * S, "merge", 0, false, REPORT_REASON_FULL);
        add(r, REPORT_REFUSED, USEC_PER_HOUR + 3 * S, "merge", 0, false, REPORT_REASON_BUSY);
        add(r, REPORT_RELEASED, USEC_PER_HOUR + 4 * S, "merge", 0, false, 0);
        report_finish(r);
        _cleanup_free_ char *html = render(r);

        assert_int_equal(count(html, "<svg class=\"chart\""), 4); /* timeline, merge's waits, histogram, refusals */
        assert_int_equal(count(html, "data-chart=\"timeline\""), 1);
        assert_int_equal(count(html, "data-chart=\"waits\""), 1);
        assert_int_equal(count(html, "data-chart=\"wait-histogram\""), 1);
        assert_int_equal(count(html, "data-chart=\"refusals\""), 1);
        /* Hour 1: busy and full; hour 2: busy. */
        assert_int_equal(count(html, "class=\"bar\" data-reason="), 3);
        assert_int_equal(count(html, "data-reason=\"busy\""), 2);
        assert_non_null(strstr(html, "<span data-figure=\"refused\">3</span>"));
        assert_non_null(strstr(html, "<span data-figure=\"busy\">2</span>"));
        assert_non_null(strstr(html, "<span data-figure=\"granted\">1</span>"));
        /* Three markers (p50, p95, max) for the one hour with a grant. */
        assert_int_equal(count(html, "class=\"point\" data-series="), 3);
        /* One above each chart and the pool's; the jobs, holds and revocations. */
        assert_int_equal(count(html, "<p class=\"summary\""), 5 + 3);
}

static void test_page_is_self_contained_and_escapes_other_users_words(void **state) {
        _cleanup_(report_freep) Report *r = NULL;
        assert_int_equal(report_new(T0, T0 + 10 * S, 0, &r), 0);
        ReportEvent e = {
                .kind = REPORT_GRANTED, .time = T0 + S, .pool = "<script>alert(1)</script>", .lane = "\"><svg onload=alert(1)>",
        };
        assert_int_equal(report_add(r, &e), 0);
        assert_int_equal(report_table_add(r->jobs, &r->n_jobs,
                                          &(ReportRow) { .job = "job & <b>\x1b[2J</b>", .count = 1, .duration = USEC_INFINITY }),
                         0);
        report_finish(r);
        _cleanup_free_ char *html = render(r);

        assert_null(strstr(html, "<script"));
        assert_null(strstr(html, "<svg onload"));
        assert_non_null(strstr(html, "&quot;&gt;&lt;svg onload=alert(1)&gt;"));
        assert_null(strstr(html, "\x1b"));
        assert_non_null(strstr(html, "&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert_non_null(strstr(html, "job &amp; &lt;b&gt;\\x1b[2J&lt;/b&gt;"));
        /* Nothing fetched from anywhere: no source, link or import. */
        assert_null(strstr(html, "src="));
        assert_null(strstr(html, "href="));
        assert_null(strstr(html, "@import"));
        assert_null(strstr(html, "url(http"));
}

/* A clock that once jumped centuries ahead (an RTC reset, --since @0 by mistake) makes the default range as long:
 * the periods and the time axis's ticks stay few, and so do the memory and the page. */
static void test_a_range_of_centuries_stays_small(void **state) {
        _cleanup_(report_freep) Report *r = NULL;
        usec_t span = 1000 * 366 * USEC_PER_DAY;
        assert_int_equal(report_new(T0, T0 + span, 0, &r), 0);
        assert_true(r->n_periods <= REPORT_PERIODS_MAX);
        assert_int_equal(r->period_us % USEC_PER_DAY, 0);
        add(r, REPORT_GRANTED, S, "merge", 0, false, 0);
        add(r, REPORT_REFUSED, 2 * S, "merge", 0, false, REPORT_REASON_BUSY);
        add(r, REPORT_REFUSED, span - S, "merge", 0, false, REPORT_REASON_BUSY);
        report_finish(r);
        assert_int_equal(r->pools[0].lanes[0].period_refused[0][REPORT_REASON_BUSY], 1);
        assert_int_equal(r->pools[0].lanes[0].period_refused[r->n_periods - 1][REPORT_REASON_BUSY], 1);
        _cleanup_free_ char *html = render(r);
        assert_true(strlen(html) < 256 * 1024);
        /* Three time axes (timeline, merge's waits, refusals) of a few ticks each, and twelve period labels. */
        assert_true(count(html, "class=\"tick\" x=") < 3 * 12 + 12 + 40);
        assert_non_null(strstr(html, "Refusals per "));
        assert_null(strstr(html, "Refusals per day"));

        /* Two months are still drawn per day, a week per hour. */
        _cleanup_(report_freep) Report *months = NULL, *week = NULL;
        assert_int_equal(report_new(T0, T0 + 60 * USEC_PER_DAY, 0, &months), 0);
        assert_int_equal(months->period_us, USEC_PER_DAY);
        assert_int_equal(report_new(T0, T0 + 7 * USEC_PER_DAY, 0, &week), 0);
        assert_int_equal(week->period_us, USEC_PER_HOUR);
}

/* Days and hours are the local zone's (the page says times are local): west of UTC a day's bar began at 19:00 the
 * day before and carried that date, so most of a day's refusals were drawn on the day before; at UTC+5:30 an hour
 * began at :30 and read ":00". */
static void test_periods_are_whole_local_days_and_hours(void **state) {
        static const struct {
                const char *tz;
                int64_t offset; /* s */
                usec_t range;
        } zones[] = {
                { "EST5", -5 * 3600, 60 * USEC_PER_DAY },
                { "IST-5:30", 5 * 3600 + 1800, 4 * USEC_PER_DAY },
                { "UTC", 0, 60 * USEC_PER_DAY },
        };
        for (size_t z = 0; z < ELEMENTSOF(zones); z++) {
                _cleanup_(report_freep) Report *r = NULL;
                int64_t offset = zones[z].offset * (int64_t) S;
                assert_int_equal(report_new(T0, T0 + zones[z].range, offset, &r), 0);
                assert_int_equal(((int64_t) r->period_start + offset) % (int64_t) r->period_us, 0);
                assert_true(r->period_start <= T0 && T0 - r->period_start < r->period_us);

                /* 10:00 local, two days in: on the bar of that local day (or hour). */
                usec_t at = T0 - (T0 + offset) % USEC_PER_DAY + 2 * USEC_PER_DAY + 10 * USEC_PER_HOUR - T0;
                add(r, REPORT_REFUSED, at, "merge", 0, false, REPORT_REASON_BUSY);
                report_finish(r);
                size_t i = (T0 + at - r->period_start) / r->period_us;
                assert_int_equal(r->pools[0].lanes[0].period_refused[i][REPORT_REASON_BUSY], 1);
                usec_t start = r->period_start + i * r->period_us;
                assert_int_equal(((int64_t) start + offset) / (int64_t) r->period_us * (int64_t) r->period_us,
                                 (int64_t) (T0 + at) + offset - ((int64_t) (T0 + at) + offset) % (int64_t) r->period_us);

                setenv("TZ", zones[z].tz, 1);
                tzset();
                _cleanup_free_ char *html = render(r);
                setenv("TZ", "UTC", 1);
                tzset();
                char t[64];
                time_t local = (time_t) ((T0 + at) / S) + (time_t) zones[z].offset;
                struct tm tm;
                assert_non_null(gmtime_r(&local, &tm));
                strftime(t, sizeof t, r->period_us == USEC_PER_DAY ? "<title>%Y-%m-%d: 1 busy</title>" :
                                                                     "<title>%Y-%m-%d %H:00: 1 busy</title>", &tm);
                assert_non_null(strstr(html, t));
        }
}

static void test_page_says_when_there_is_nothing(void **state) {
        _cleanup_(report_freep) Report *r = NULL;
        assert_int_equal(report_new(T0, T0 + 10 * S, 0, &r), 0);
        report_finish(r);
        _cleanup_free_ char *empty = render(r);
        assert_non_null(strstr(empty, "holds no decision in this range"));
        assert_null(strstr(empty, "<svg class=\"chart\""));

        assert_non_null(report_pool(r, "quiet"));
        report_finish(r);
        _cleanup_free_ char *quiet = render(r);
        assert_non_null(strstr(quiet, "data-pool=\"quiet\""));
        assert_non_null(strstr(quiet, "Nothing was recorded for this pool"));
        assert_null(strstr(quiet, "<svg class=\"chart\""));
}

static void test_page_draws_the_capacity_curve_or_says_why_not(void **state) {
        _cleanup_(report_freep) Report *r = NULL;
        assert_int_equal(report_new(T0, T0 + 10 * S, 0, &r), 0);
        add(r, REPORT_GRANTED, 1 * S, "merge", 0, false, 0);
        ReportPool *p = &r->pools[0];
        p->sweep = calloc(3, sizeof(ReportSweepPoint));
        assert_non_null(p->sweep);
        for (unsigned i = 0; i < 3; i++)
                p->sweep[p->n_sweep++] = (ReportSweepPoint) {
                        .limit = 4 + i, .requests = 10, .granted = 8 + i, .refused = 2 - i, .p95_wait = (3 - i) * S,
                };
        report_finish(r);
        _cleanup_free_ char *html = render(r);
        assert_int_equal(count(html, "data-chart=\"capacity\""), 1);
        assert_int_equal(count(html, "data-limit="), 3);
        assert_non_null(strstr(html, "data-limit=\"4\" data-count=\"2\" data-p95-ms=\"3000\""));
        assert_non_null(strstr(html, "at 4 slots 2 would be refused"));

        p->sweep = mfree(p->sweep);
        p->n_sweep = 0;
        p->sweep_error = strdup("no lease of pool 'grid' ended");
        _cleanup_free_ char *why = render(r);
        assert_int_equal(count(why, "data-chart=\"capacity\""), 0);
        assert_non_null(strstr(why, "could not be replayed: no lease of pool &#39;grid&#39; ended"));
}

static void test_label_sets_are_a_table_only_when_some_request_asked(void **state) {
        _cleanup_(report_freep) Report *r = NULL;
        assert_int_equal(report_new(T0, T0 + 10 * S, 0, &r), 0);
        add(r, REPORT_GRANTED, 1 * S, "merge", 0, false, 0);
        ReportPool *p = &r->pools[0];

        /* Nothing asked of the members: no table. */
        assert_int_equal(report_pool_add_selector(p, &(ReportSelector) { .requests = 5, .granted = 5 }), 0);
        report_finish(r);
        _cleanup_free_ char *plain = render(r);
        assert_null(strstr(plain, "class=\"selectors\""));

        /* Label sets, the most asked first: ten rows, the rest counted; other users' words escaped. */
        for (unsigned i = 0; i < 12; i++) {
                char name[32];
                snprintf(name, sizeof name, i == 0 ? "arm64 <b>" : "l%u", i);
                ReportSelector x = { .selector = name, .requests = 20 - i, .granted = 10, .waited = 3,
                                     .longest_wait = 1500 * MS };
                x.refused[REPORT_REASON_BUSY] = 10 - i;
                assert_int_equal(report_pool_add_selector(p, &x), 0);
        }
        assert_int_equal(p->n_selectors, REPORT_TABLE_ROWS);
        assert_int_equal(p->selectors_total, 13);
        _cleanup_free_ char *html = render(r);
        assert_int_equal(count(html, "class=\"selectors\""), 1);
        assert_int_equal(count(html, "<tr data-selector="), REPORT_TABLE_ROWS);
        assert_non_null(strstr(html, "<tr data-selector=\"\" data-requests=\"5\""));
        assert_non_null(strstr(html, "data-selector=\"arm64 &lt;b&gt;\" data-requests=\"20\" data-granted=\"10\" "
                                     "data-waited=\"3\" data-longest-ms=\"1500\" data-busy=\"10\""));
        assert_null(strstr(html, "arm64 <b>"));
        assert_non_null(strstr(html, "10 of 13 label sets"));
}

static void test_members_count_use_holds_failures_and_quarantines(void **state) {
        _cleanup_(report_freep) Report *r = NULL;
        assert_int_equal(report_new(T0, T0 + 100 * S, 0, &r), 0);
        add(r, REPORT_GRANTED, 1 * S, "merge", 0, false, 0);

        /* rig-b: one lease of 40 s; rig-a: a two-member lease with rig-b, and one granted before the range whose
         * 30 s hold counts 10 s in it and whose command failed (exit 3: a failure; exit 0 and none are not); rig-a
         * is quarantined by an exit status and then by a person. */
        assert_int_equal(report_member_add(r, "grid", "rig-b", REPORT_MEMBER_GRANTED, T0 + 1 * S, 0, -1), 0);
        assert_int_equal(report_member_add(r, "grid", "rig-a", REPORT_MEMBER_RELEASED, T0 + 10 * S, 30 * S, 3), 0);
        assert_int_equal(report_member_add(r, "grid", "rig-b", REPORT_MEMBER_RELEASED, T0 + 41 * S, 40 * S, 0), 0);
        assert_int_equal(report_member_add(r, "grid", "rig-a,rig-b", REPORT_MEMBER_GRANTED, T0 + 50 * S, 0, -1), 0);
        assert_int_equal(report_member_add(r, "grid", "rig-a,,rig-b", REPORT_MEMBER_RELEASED, T0 + 60 * S, 10 * S, -1), 0);
        assert_int_equal(report_member_add(r, "grid", "rig-a", REPORT_MEMBER_QUARANTINED, T0 + 60 * S, 0, 3), 0);
        assert_int_equal(report_member_add(r, "grid", "rig-a", REPORT_MEMBER_QUARANTINED, T0 + 70 * S, 0, -1), 0);
        /* Outside the range, or not a member row: refused, nothing counted. */
        assert_int_equal(report_member_add(r, "grid", "rig-c", REPORT_MEMBER_GRANTED, T0 + 100 * S, 0, -1), -EINVAL);
        assert_int_equal(report_member_add(r, "grid", "rig-c", _REPORT_MEMBER_KIND_MAX, T0 + 1 * S, 0, -1), -EINVAL);
        report_finish(r);

        ReportPool *p = &r->pools[0];
        assert_int_equal(p->n_members, 2);
        const ReportMember *a = &p->members[0], *b = &p->members[1];
        assert_string_equal(a->name, "rig-a");
        assert_string_equal(b->name, "rig-b");
        assert_int_equal(a->grants, 1);
        assert_int_equal(a->holds, 2);
        assert_int_equal(a->held, 20 * S);
        assert_int_equal(a->failures, 1);
        assert_int_equal(a->quarantines, 2);
        assert_int_equal(b->grants, 2);
        assert_int_equal(b->holds, 2);
        assert_int_equal(b->held, 50 * S);
        assert_int_equal(b->failures, 0);
        assert_int_equal(b->quarantines, 0);
        assert_true(report_member_use(r, b) > 0.499 && report_member_use(r, b) < 0.501);

        _cleanup_free_ char *html = render(r);
        assert_int_equal(count(html, "class=\"members\""), 1);
        assert_non_null(strstr(html, "<tr data-member=\"rig-a\" data-use=\"0.2000\" data-grants=\"1\" data-holds=\"2\" "
                                     "data-held-ms=\"20000\" data-failures=\"1\" data-quarantines=\"2\">"));
        assert_non_null(strstr(html, "<tr data-member=\"rig-b\" data-use=\"0.5000\""));
        assert_int_equal(count(html, "data-chart=\"members\""), 1);
        /* The chart: the most used first. */
        const char *bar_b = strstr(html, "<rect class=\"bar\" data-member=\"rig-b\" data-use=\"0.5000\"");
        const char *bar_a = strstr(html, "<rect class=\"bar\" data-member=\"rig-a\" data-use=\"0.2000\"");
        assert_non_null(bar_b);
        assert_non_null(bar_a);
        assert_true(bar_b < bar_a);
        assert_non_null(strstr(html, "2 members; 1 failures, 2 quarantines"));
}

static void test_members_are_escaped_and_absent_without_rows(void **state) {
        _cleanup_(report_freep) Report *r = NULL;
        assert_int_equal(report_new(T0, T0 + 10 * S, 0, &r), 0);
        add(r, REPORT_GRANTED, 1 * S, "merge", 0, false, 0);
        report_finish(r);
        _cleanup_free_ char *plain = render(r);
        assert_null(strstr(plain, "class=\"members\""));
        assert_null(strstr(plain, "data-chart=\"members\""));

        assert_int_equal(report_member_add(r, "grid", "<b>rig\"", REPORT_MEMBER_GRANTED, T0 + 2 * S, 0, -1), 0);
        /* A long name is cut under its bar at a whole character, and whole in the table. */
        assert_int_equal(report_member_add(r, "grid", "rig-ééééééééé-long", REPORT_MEMBER_GRANTED, T0 + 2 * S, 0, -1), 0);
        _cleanup_free_ char *html = render(r);
        assert_null(strstr(html, "<b>rig"));
        assert_non_null(strstr(html, "data-member=\"&lt;b&gt;rig&quot;\""));
        assert_non_null(strstr(html, ">rig-éééééé…</text>"));
        assert_non_null(strstr(html, "<td>rig-ééééééééé-long</td>"));
}

int main(void) {
        static const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_wait_bins_have_exact_edges_at_powers_of_two),
                cmocka_unit_test(test_quantiles_are_at_most_a_bin_high_and_the_max_is_exact),
                cmocka_unit_test(test_timeline_steps_with_grants_waits_and_congestion),
                cmocka_unit_test(test_a_lease_granted_before_the_range_is_held_in_it),
                cmocka_unit_test(test_an_end_without_its_start_is_clamped_and_said),
                cmocka_unit_test(test_events_out_of_order_or_past_the_range_are_refused),
                cmocka_unit_test(test_refusals_are_counted_per_lane_reason_and_hour),
                cmocka_unit_test(test_page_has_the_charts_bars_and_figures),
                cmocka_unit_test(test_page_is_self_contained_and_escapes_other_users_words),
                cmocka_unit_test(test_a_range_of_centuries_stays_small),
                cmocka_unit_test(test_periods_are_whole_local_days_and_hours),
                cmocka_unit_test(test_page_says_when_there_is_nothing),
                cmocka_unit_test(test_page_draws_the_capacity_curve_or_says_why_not),
                cmocka_unit_test(test_label_sets_are_a_table_only_when_some_request_asked),
                cmocka_unit_test(test_members_count_use_holds_failures_and_quarantines),
                cmocka_unit_test(test_members_are_escaped_and_absent_without_rows),
        };
        setenv("TZ", "UTC", 1);
        return cmocka_run_group_tests(tests, NULL, NULL);
}
