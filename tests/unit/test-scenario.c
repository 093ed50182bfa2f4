/* SPDX-License-Identifier: MIT */
/* test-scenario.c — rates, durations, the arrival generator and scenario files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "scenario.h"
#include "strv.h"

static void test_rate_parsing(void **state) {
        Rate r;

        assert_int_equal(parse_rate("40/s", &r), 0);
        assert_true(r.num == 40 && r.den == 1);
        assert_int_equal(parse_rate("2.5/s", &r), 0);
        assert_true(r.num == 25 && r.den == 10);
        assert_int_equal(parse_rate("90/min", &r), 0);
        assert_true(r.num == 90 && r.den == 60);
        assert_int_equal(parse_rate("6/h", &r), 0);
        assert_true(r.num == 6 && r.den == 3600);
        assert_int_equal(parse_rate("0/s", &r), 0);
        assert_true(r.num == 0);

        const char *bad[] = { "-4/s", "+4/s", "4", "4/", "/s", "4/s ", " 4/s", "4/d", "1./s", ".5/s",
                              "1.1234567/s", "4s", "4/S", "1e3/s", "", "99999999999999/s" };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                r = (Rate) { 7, 7 };
                assert_int_equal(parse_rate(bad[i], &r), -EINVAL);
                assert_true(r.num == 7 && r.den == 7); /* untouched on failure */
        }
}

static void test_duration_parsing(void **state) {
        uint64_t ms;

        assert_int_equal(parse_duration_ms("200ms", false, &ms), 0);
        assert_int_equal(ms, 200);
        assert_int_equal(parse_duration_ms("60s", false, &ms), 0);
        assert_int_equal(ms, 60000);
        assert_int_equal(parse_duration_ms("5min 11s", false, &ms), 0);
        assert_int_equal(ms, 311000);
        assert_int_equal(parse_duration_ms("1.5s", false, &ms), 0);
        assert_int_equal(ms, 1500);
        assert_int_equal(parse_duration_ms("30", false, &ms), 0); /* a bare number counts seconds, as in config */
        assert_int_equal(ms, 30000);
        assert_int_equal(parse_duration_ms("0", false, &ms), 0);
        assert_int_equal(ms, 0);

        assert_int_equal(parse_duration_ms("forever", true, &ms), 0);
        assert_true(ms == SIM_FOREVER);
        assert_int_equal(parse_duration_ms("infinity", true, &ms), 0);
        assert_true(ms == SIM_FOREVER);

        ms = 42;
        assert_int_equal(parse_duration_ms("forever", false, &ms), -EINVAL);
        assert_int_equal(parse_duration_ms("infinity", false, &ms), -EINVAL);
        assert_int_equal(parse_duration_ms("1500us", false, &ms), -EDOM);
        assert_int_equal(parse_duration_ms("-1s", false, &ms), -EINVAL);
        assert_int_equal(parse_duration_ms("10x", false, &ms), -EINVAL);
        assert_int_equal(parse_duration_ms("", false, &ms), -EINVAL);
        /* Longer than a run may cover (the report keeps a peak per second). */
        assert_int_equal(parse_duration_ms("367d", true, &ms), -ERANGE);
        assert_int_equal(parse_duration_ms("100y", false, &ms), -ERANGE);
        assert_int_equal(ms, 42);
        assert_int_equal(parse_duration_ms("366d", false, &ms), 0);
        assert_true(ms == SIM_SPAN_MAX_MS);
}

static void test_floor_formula_at_odd_rates(void **state) {
        const Rate three = { 3, 1 }, seven = { 7, 1 };
        const uint64_t at3[] = { 0, 333, 666 };
        const uint64_t at7[] = { 0, 142, 285, 428, 571, 714, 857 };

        assert_int_equal(arrival_phase_count(three, 1000), 3);
        for (size_t i = 0; i < ELEMENTSOF(at3); i++)
                assert_int_equal(arrival_phase_offset_ms(three, i), at3[i]);
        assert_int_equal(arrival_phase_count(seven, 1000), 7);
        for (size_t i = 0; i < ELEMENTSOF(at7); i++)
                assert_int_equal(arrival_phase_offset_ms(seven, i), at7[i]);

        /* The i-th arrival counts while its time is < the duration: 3/s over 1001 ms has a 4th at 1000. */
        assert_int_equal(arrival_phase_count(three, 1001), 4);
        assert_int_equal(arrival_phase_count(three, 999), 3);
        assert_int_equal(arrival_phase_count(three, 667), 3);
        assert_int_equal(arrival_phase_count(three, 666), 2);
        assert_int_equal(arrival_phase_count(seven, 60000), 420);

        /* Fractional rates stay exact. */
        const Rate half = { 5, 10 };
        assert_int_equal(arrival_phase_count(half, 10000), 5);
        assert_int_equal(arrival_phase_offset_ms(half, 4), 8000);
        assert_int_equal(arrival_phase_count((Rate) { 0, 1 }, 10000), 0);

        /* Huge indices go through 128-bit arithmetic without wrapping. */
        const Rate slow = { 1, 3600 };
        assert_int_equal(arrival_phase_offset_ms(slow, 1000000000000ULL), 3600000000000000000ULL);
}

static Scenario *load(const char *json) {
        Scenario *s = NULL;
        char *error = NULL;
        int r = scenario_load_string(json, "test.json", &error, &s);
        if (r < 0)
                fail_msg("unexpected error %d: %s", r, error ?: "(none)");
        free(error);
        return s;
}

static void test_phases_run_back_to_back(void **state) {
        _cleanup_(scenario_freep) Scenario *s = NULL;
        const uint64_t expect[] = { 0, 333, 666, 1000, 1142, 1285, 1428, 1571, 1714, 1857 };
        ArrivalCursor c;
        Arrival a;

        assert_int_equal(scenario_new("slotctl simulate", &s), 0);
        assert_int_equal(scenario_add_pool(s, "default", "--limit"), 0);
        assert_int_equal(scenario_add_lane(s, "default", "lane"), 0);
        char lane[] = "default", origin[] = "--arrivals";
        ScenarioTraffic t = { .lane = lane, .slots = 1, .hold_ms = 200, .max_wait = USEC_INFINITY, .origin = origin };
        char *error = NULL;
        assert_int_equal(scenario_add_phases(s, "3/s:1s,7/s:1s", &t, &error), 0);
        assert_int_equal(scenario_finish(s, &error), 0);
        assert_null(error);

        assert_int_equal(s->n_generated, 10);
        assert_int_equal(s->phases[1].start_ms, 1000);
        assert_int_equal(s->phases[1].first, 3);

        arrival_cursor_init(&c, s);
        for (size_t i = 0; i < ELEMENTSOF(expect); i++) {
                assert_int_equal(arrival_cursor_peek(&c), expect[i]);
                assert_true(arrival_cursor_next(&c, &a));
                assert_int_equal(a.at_ms, expect[i]);
                assert_int_equal(a.id, i);
                assert_ptr_equal(a.traffic, scenario_traffic(s, a.id));
        }
        assert_true(arrival_cursor_peek(&c) == SIM_FOREVER);
        assert_false(arrival_cursor_next(&c, &a));
}

static void test_quiet_phase_shifts_the_next(void **state) {
        _cleanup_(scenario_freep) Scenario *s = load(
                "{\"pool\": {\"limit\": 1}, \"arrivals\": ["
                " {\"rate\": \"2/s\", \"for\": \"1s\", \"hold\": \"1ms\"},"
                " {\"rate\": \"0/s\", \"for\": \"5s\", \"hold\": \"1ms\"},"
                " {\"rate\": \"1/s\", \"for\": \"2s\", \"hold\": \"7ms\"}]}");
        const uint64_t expect[] = { 0, 500, 6000, 7000 };
        ArrivalCursor c;
        Arrival a;

        assert_int_equal(s->n_generated, 4);
        arrival_cursor_init(&c, s);
        for (size_t i = 0; i < ELEMENTSOF(expect); i++) {
                assert_true(arrival_cursor_next(&c, &a));
                assert_int_equal(a.at_ms, expect[i]);
        }
        /* The phase without arrivals is skipped when looking up a request's traffic. */
        assert_int_equal(scenario_traffic(s, 2)->hold_ms, 7);
        assert_int_equal(scenario_traffic(s, 1)->hold_ms, 1);
}

static void test_generated_arrivals_come_before_explicit_ones(void **state) {
        _cleanup_(scenario_freep) Scenario *s = load(
                "{\"pool\": {\"limit\": 1},"
                " \"arrivals\": [{\"rate\": \"1/s\", \"for\": \"3s\", \"hold\": \"1s\"}],"
                " \"requests\": [{\"name\": \"late\", \"at\": \"2s\", \"hold\": \"1s\"},"
                "              {\"name\": \"first\", \"at\": \"1s\", \"hold\": \"1s\"},"
                "              {\"name\": \"second\", \"at\": \"1s\", \"hold\": \"forever\"}]}");
        /* (time, id): generated ids 0..2, explicit 3.. in file order. */
        const uint64_t expect[][2] = { { 0, 0 }, { 1000, 1 }, { 1000, 4 }, { 1000, 5 }, { 2000, 2 }, { 2000, 3 } };
        ArrivalCursor c;
        Arrival a;

        arrival_cursor_init(&c, s);
        for (size_t i = 0; i < ELEMENTSOF(expect); i++) {
                assert_true(arrival_cursor_next(&c, &a));
                assert_int_equal(a.at_ms, expect[i][0]);
                assert_int_equal(a.id, expect[i][1]);
        }
        assert_false(arrival_cursor_next(&c, &a));
        assert_string_equal(scenario_request_name(s, 4), "first");
        assert_null(scenario_request_name(s, 1));
        assert_true(scenario_traffic(s, 5)->hold_ms == SIM_FOREVER);
}

static void test_scenario_keys_become_config_settings(void **state) {
        _cleanup_(scenario_freep) Scenario *s = load(
                "{\"pools\": {\"grid\": {\"limit\": 2, \"queue-timeout\": \"5m\", \"max-queue\": 100},"
                "             \"rigs\": {\"members\": [\"rig-a\", \"rig-b\", \"rig-c\"]}},"
                " \"lanes\": {\"merge\": {\"pools\": [\"grid\", \"rigs\"], \"policy\": \"fail-fast\", \"priority\": 3},"
                "             \"nightly\": {\"pools\": [\"rigs\"], \"max-hold\": \"1h\"}},"
                " \"deadline\": \"30s\","
                " \"arrivals\": [{\"rate\": \"40/s\", \"for\": \"60s\", \"hold\": \"200ms\", \"lane\": \"merge\"}],"
                " \"requests\": [{\"name\": \"C\", \"at\": \"10s\", \"hold\": \"1m\", \"lane\": \"nightly\", \"slots\": 2,"
                "                 \"wait\": false, \"max-wait\": \"20s\"}]}");
        _cleanup_(conf_freep) BrokerConfig *c = NULL;
        char *error = NULL;

        assert_int_equal(s->deadline_ms, 30000);
        assert_int_equal(s->n_generated, 2400);
        assert_true(s->requests[0].traffic.no_wait);
        assert_int_equal(s->requests[0].traffic.max_wait, 20 * USEC_PER_SEC);
        assert_int_equal(s->requests[0].traffic.slots, 2);

        assert_int_equal(scenario_build_config(s, NULL, NULL, &error, &c), 0);
        const PoolConfig *grid = conf_find_pool(c, "grid"), *rigs = conf_find_pool(c, "rigs");
        assert_non_null(grid);
        assert_non_null(rigs);
        assert_int_equal(grid->limit, 2);
        assert_int_equal(grid->max_queue, 100);
        assert_int_equal(grid->queue_timeout, 5 * USEC_PER_MINUTE);
        assert_int_equal(rigs->limit, 3);
        const LaneConfig *merge = conf_find_lane(c, "merge");
        assert_non_null(merge);
        assert_int_equal(merge->policy, LANE_POLICY_FAIL_FAST);
        assert_int_equal(merge->priority, 3);
        assert_int_equal(merge->n_pools, 2);
        assert_int_equal(conf_find_lane(c, "nightly")->max_hold, USEC_PER_HOUR);

        /* A sweep sets the key on every pool. */
        conf_free(TAKE_PTR(c));
        assert_int_equal(scenario_build_config(s, "max-queue", "7", &error, &c), 0);
        assert_int_equal(conf_find_pool(c, "grid")->max_queue, 7);
        assert_int_equal(conf_find_pool(c, "rigs")->max_queue, 7);
        assert_null(error);
}

/* A pool's admin-users= and admin-groups= (SPEC §3.6) are brokerd.conf keys too: a configuration copied into a
 * scenario keeps them rather than failing on "unknown key". */
static void test_pool_admin_keys(void **state) {
        _cleanup_(scenario_freep) Scenario *s = load(
                "{\"pool\": {\"members\": [\"a\"], \"admin-users\": [\"root\", \"1000\"], \"admin-groups\": [\"0\"]}}");
        _cleanup_(conf_freep) BrokerConfig *c = NULL;
        char *error = NULL;

        assert_int_equal(scenario_build_config(s, NULL, NULL, &error, &c), 0);
        const PoolConfig *p = conf_find_pool(c, "default");
        assert_int_equal(strv_length(p->admin_users), 2);
        assert_string_equal(p->admin_groups[0], "0");
}

/* An integer key takes what brokerd.conf takes for it, spelled as a string too: max-queue = infinity. */
static void test_integer_keys_take_the_config_spellings(void **state) {
        _cleanup_(scenario_freep) Scenario *s = load(
                "{\"pools\": {\"a\": {\"limit\": \"2\", \"max-queue\": \"infinity\"}, \"b\": {\"limit\": 1, \"max-queue\": 5}},"
                " \"lanes\": {\"m\": {\"pools\": [\"a\", \"b\"], \"max-in-use\": \"infinity\"}}}");
        _cleanup_(conf_freep) BrokerConfig *c = NULL;
        char *error = NULL;

        assert_int_equal(scenario_build_config(s, NULL, NULL, &error, &c), 0);
        assert_null(error);
        assert_int_equal(conf_find_pool(c, "a")->limit, 2);
        assert_int_equal(conf_find_pool(c, "a")->max_queue, -1); /* no cap, as max-queue=infinity in the config */
        assert_int_equal(conf_find_pool(c, "b")->max_queue, 5);
}

/* Issue 23 in a scenario: exit statuses, quarantine keys, a health lane and drains (by time, file order within an
 * instant); a drain of a member the pool does not have is refused with the configuration. */
static void test_exit_statuses_and_drains(void **state) {
        _cleanup_(scenario_freep) Scenario *s = load(
                "{\"pools\": {\"rigs\": {\"members\": [\"a\", \"b\"], \"quarantine-exit-codes\": [3, 4],"
                "                          \"quarantine-after\": 2}},"
                " \"lanes\": {\"ci\": {\"pools\": [\"rigs\"]}, \"check\": {\"pools\": [\"rigs\"], \"health\": \"yes\"}},"
                " \"requests\": [{\"name\": \"A\", \"at\": \"1s\", \"hold\": \"1s\", \"lane\": \"ci\", \"exit\": 3},"
                "              {\"name\": \"B\", \"at\": \"1s\", \"hold\": \"1s\", \"lane\": \"ci\"}],"
                " \"drains\": [{\"at\": \"3s\", \"pool\": \"rigs\", \"undrain\": true},"
                "            {\"at\": \"2s\", \"pool\": \"rigs\", \"member\": \"b\", \"reason\": \"reflash\", \"until\": \"5s\"},"
                "            {\"at\": \"2s\", \"pool\": \"rigs\", \"reason\": \"window\"}]}");
        _cleanup_(conf_freep) BrokerConfig *c = NULL;
        char *error = NULL;

        assert_true(s->requests[0].traffic.exits);
        assert_int_equal(s->requests[0].traffic.exit_status, 3);
        assert_false(s->requests[1].traffic.exits);
        assert_int_equal(s->n_drains, 3);
        assert_int_equal(s->drains[0].at_ms, 2000);
        assert_string_equal(s->drains[0].member, "b");
        assert_string_equal(s->drains[0].reason, "reflash");
        assert_int_equal(s->drains[0].until_ms, 5000);
        assert_null(s->drains[1].member);
        assert_int_equal(s->drains[1].until_ms, SIM_FOREVER);
        assert_true(s->drains[2].undrain);
        assert_int_equal(scenario_build_config(s, NULL, NULL, &error, &c), 0);
        const PoolConfig *p = conf_find_pool(c, "rigs");
        assert_true(pool_config_quarantines(p, 3) && pool_config_quarantines(p, 4) && !pool_config_quarantines(p, 5));
        assert_int_equal(p->quarantine_after, 2);
        assert_true(conf_find_lane(c, "check")->health);

        _cleanup_(scenario_freep) Scenario *bad = load(
                "{\"pools\": {\"rigs\": {\"members\": [\"a\"]}}, \"drains\": [{\"at\": \"1s\", \"pool\": \"rigs\", \"member\": \"z\"}]}");
        conf_free(TAKE_PTR(c));
        assert_int_equal(scenario_build_config(bad, NULL, NULL, &error, &c), -EINVAL);
        assert_string_equal(error, "test.json: drains[0].member: pool \"rigs\" has no member \"z\"");
        free(error);
}

/* Issue 23 item 4 in a scenario: reservations by time (file order within an instant); a member the pool does not
 * have, labels no member matches, or either on a pool of anonymous slots are refused with the configuration. */
static void test_reservations(void **state) {
        _cleanup_(scenario_freep) Scenario *s = load(
                "{\"pools\": {\"rigs\": {\"members\": [\"a\", \"b\"], \"label.fast\": [\"a\"]}, \"plain\": {\"limit\": 2}},"
                " \"lanes\": {\"ci\": {\"pools\": [\"rigs\", \"plain\"]}},"
                " \"reservations\": [{\"at\": \"3s\", \"pool\": \"plain\", \"for\": \"1h\", \"reason\": \"third\"},"
                "            {\"at\": \"2s\", \"pool\": \"rigs\", \"member\": \"b\", \"for\": \"10s\", \"reason\": \"first\"},"
                "            {\"at\": \"2s\", \"pool\": \"rigs\", \"labels\": [\"fast\", \"!slow\"], \"for\": \"1ms\", \"reason\": \"second\"}]}");
        _cleanup_(conf_freep) BrokerConfig *c = NULL;
        char *error = NULL;

        assert_int_equal(s->n_reservations, 3);
        assert_string_equal(s->reservations[0].reason, "first");
        assert_int_equal(s->reservations[0].at_ms, 2000);
        assert_string_equal(s->reservations[0].member, "b");
        assert_null(s->reservations[0].labels);
        assert_int_equal(s->reservations[0].for_ms, 10000);
        assert_string_equal(s->reservations[1].reason, "second");
        assert_null(s->reservations[1].member);
        assert_string_equal(s->reservations[1].labels[0], "fast");
        assert_string_equal(s->reservations[1].labels[1], "!slow");
        assert_null(s->reservations[1].labels[2]);
        assert_int_equal(s->reservations[1].for_ms, 1);
        assert_string_equal(s->reservations[2].pool, "plain");
        assert_int_equal(s->reservations[2].for_ms, 3600000);
        assert_int_equal(scenario_reservation_id(s, 2), 2); /* no request: past none */
        assert_int_equal(scenario_build_config(s, NULL, NULL, &error, &c), 0);

        static const struct {
                const char *reservation;
                const char *error;
        } refused[] = {
                { "{\"at\": \"1s\", \"pool\": \"rigs\", \"member\": \"z\", \"for\": \"1s\", \"reason\": \"x\"}",
                  "test.json: reservations[0].member: pool \"rigs\" has no member \"z\"" },
                { "{\"at\": \"1s\", \"pool\": \"rigs\", \"labels\": [\"slow\"], \"for\": \"1s\", \"reason\": \"x\"}",
                  "test.json: reservations[0].labels: no member of pool \"rigs\" matches them" },
                { "{\"at\": \"1s\", \"pool\": \"plain\", \"member\": \"a\", \"for\": \"1s\", \"reason\": \"x\"}",
                  "test.json: reservations[0].member: pool \"plain\" has no members" },
        };
        for (size_t i = 0; i < ELEMENTSOF(refused); i++) {
                _cleanup_free_ char *json = NULL;
                assert_true(asprintf(&json,
                                     "{\"pools\": {\"rigs\": {\"members\": [\"a\"], \"label.fast\": [\"a\"]}, \"plain\": {\"limit\": 1}},"
                                     " \"lanes\": {\"ci\": {\"pools\": [\"rigs\"]}}, \"reservations\": [%s]}",
                                     refused[i].reservation) > 0);
                _cleanup_(scenario_freep) Scenario *bad = load(json);
                conf_free(TAKE_PTR(c));
                assert_int_equal(scenario_build_config(bad, NULL, NULL, &error, &c), -EINVAL);
                assert_string_equal(error, refused[i].error);
                free(error);
                error = NULL;
        }
}

static void test_bad_scenarios_name_the_culprit(void **state) {
        static const struct {
                const char *json;
                const char *error;
        } cases[] = {
                { "{\"pool\": {\"limit\": 2}, \"arrivals\": [{\"rate\": \"-4/s\", \"for\": \"1s\", \"hold\": \"1s\"}]}",
                  "test.json: arrivals[0].rate: invalid rate \"-4/s\"" },
                { "{\"pool\": {\"limit\": 2}, \"arrivals\": [{\"rate\": \"4/s\", \"for\": \"1x\", \"hold\": \"1s\"}]}",
                  "test.json: arrivals[0].for: invalid duration \"1x\"" },
                { "{\"pool\": {\"limit\": 2}, \"arrivals\": [{\"rate\": \"4/s\", \"for\": \"1s\"}]}",
                  "test.json: arrivals[0].hold: missing" },
                { "{\"pool\": {\"limit\": 2}, \"arrivals\": [{\"rate\": 4, \"for\": \"1s\", \"hold\": \"1s\"}]}",
                  "test.json: arrivals[0].rate: expected a string, got an integer" },
                { "{\"pool\": {\"limit\": 2}, \"arrivals\": [{\"rate\": \"4/s\", \"for\": \"1s\", \"hold\": \"1s\", \"x\": 1}]}",
                  "test.json: arrivals[0].x: unknown key" },
                { "{\"pool\": {\"limit\": 2}, \"requests\": [{\"name\": \"A\", \"at\": \"1s\", \"hold\": \"1s\", \"lane\": \"m\"}]}",
                  "test.json: requests[0].lane: unknown lane \"m\"" },
                { "{\"pool\": {\"limit\": 2}, \"requests\": [{\"at\": \"1s\", \"hold\": \"1s\"}]}",
                  "test.json: requests[0].name: missing" },
                { "{\"pool\": {\"limit\": 2}, \"requests\": [{\"name\": \"7\", \"at\": \"1s\", \"hold\": \"1s\"}]}",
                  "test.json: requests[0].name: \"7\" is a number" },
                { "{\"pool\": {\"limit\": 2}, \"requests\": [{\"name\": \"A\", \"at\": \"1s\", \"hold\": \"1s\", \"wait\": 0}]}",
                  "test.json: requests[0].wait: expected a boolean, got an integer" },
                { "{\"pool\": {\"limit\": 2}, \"requests\": [{\"name\": \"A\", \"at\": \"1s\", \"hold\": \"1s\", \"max-wait\": \"0\"}]}",
                  "test.json: requests[0].max-wait: out of range" },
                { "{\"pool\": {\"limit\": true}}", "test.json: pool.limit: expected an integer, got a boolean" },
                { "{\"pool\": {\"limit\": 2.5}}", "test.json: pool.limit: expected an integer, got a number with a fraction" },
                { "{\"pool\": {\"limit\": 2, \"queue-timeout\": 300}}",
                  "test.json: pool.queue-timeout: expected a string, got an integer" },
                { "{\"pool\": {\"limit\": 2}, \"pools\": {}}", "test.json: pool: cannot be combined with \"pools\"" },
                { "{\"lanes\": {}}", "test.json: pools: missing" },
                { "{\"pools\": {\"a\": {\"limit\": 1}}, \"lanes\": {\"m\": {\"pools\": [\"b\"]}}}",
                  "test.json: lanes.m.pools[0]: unknown pool \"b\"" },
                { "{\"pools\": {\"a\": {\"limit\": 1}}, \"lanes\": {\"m\": {\"pools\": [\"a\"], \"colour\": \"red\"}}}",
                  "test.json: lanes.m.colour: unknown key" },
                { "{\"pools\": {\"a b\": {\"limit\": 1}}}", "test.json: pools: invalid pool name \"a b\"" },
                { "{\"pool\": {\"limit\": 2}, \"deadline\": \"soon\"}", "test.json: deadline: invalid duration \"soon\"" },
                { "{\"pool\": {\"limit\": 2}, \"extra\": true}", "test.json: extra: unknown key" },
                { "[1, 2]", "test.json: expected an object at the top, got an array" },
                { "{\"pool\": {\"limit\": 2}, \"requests\": [{\"name\": \"A\", \"at\": \"1s\", \"hold\": \"1s\", \"exit\": 256}]}",
                  "test.json: requests[0].exit: expected an exit status, an integer from 0 to 255" },
                { "{\"pool\": {\"limit\": 2}, \"requests\": [{\"name\": \"A\", \"at\": \"1s\", \"hold\": \"1s\", \"exit\": \"3\"}]}",
                  "test.json: requests[0].exit: expected an exit status" },
                { "{\"pool\": {\"limit\": 2}, \"drains\": {}}", "test.json: drains: expected an array, got an object" },
                { "{\"pool\": {\"limit\": 2}, \"drains\": [{\"pool\": \"default\"}]}", "test.json: drains[0].at: missing" },
                { "{\"pool\": {\"limit\": 2}, \"drains\": [{\"at\": \"1s\"}]}", "test.json: drains[0].pool: missing" },
                { "{\"pool\": {\"limit\": 2}, \"drains\": [{\"at\": \"1s\", \"pool\": \"x\"}]}",
                  "test.json: drains[0].pool: unknown pool \"x\"" },
                { "{\"pool\": {\"limit\": 2}, \"drains\": [{\"at\": \"2s\", \"pool\": \"default\", \"until\": \"1s\"}]}",
                  "test.json: drains[0].until: not after its at" },
                { "{\"pool\": {\"limit\": 2}, \"drains\": [{\"at\": \"2s\", \"pool\": \"default\", \"reason\": \"a\\nb\"}]}",
                  "test.json: drains[0].reason: contains a control character" },
                { "{\"pool\": {\"limit\": 2}, \"drains\": [{\"at\": \"2s\", \"pool\": \"default\", \"undrain\": true, \"reason\": \"x\"}]}",
                  "test.json: drains[0]: an undrain takes no reason or until" },
                { "{\"pool\": {\"limit\": 2}, \"drains\": [{\"at\": \"2s\", \"pool\": \"default\", \"colour\": 1}]}",
                  "test.json: drains[0].colour: unknown key" },
                { "{\"pool\": {\"limit\": 2}, \"reservations\": {}}", "test.json: reservations: expected an array, got an object" },
                { "{\"pool\": {\"limit\": 2}, \"reservations\": [{\"pool\": \"default\", \"for\": \"1s\", \"reason\": \"x\"}]}", "test.json: reservations[0].at: missing" },
                { "{\"pool\": {\"limit\": 2}, \"reservations\": [{\"at\": \"1s\", \"for\": \"1s\", \"reason\": \"x\"}]}", "test.json: reservations[0].pool: missing" },
                { "{\"pool\": {\"limit\": 2}, \"reservations\": [{\"at\": \"1s\", \"pool\": \"x\", \"for\": \"1s\", \"reason\": \"x\"}]}", "test.json: reservations[0].pool: unknown pool \"x\"" },
                { "{\"pool\": {\"limit\": 2}, \"reservations\": [{\"at\": \"1s\", \"pool\": \"default\", \"reason\": \"x\"}]}", "test.json: reservations[0].for: missing" },
                { "{\"pool\": {\"limit\": 2}, \"reservations\": [{\"at\": \"1s\", \"pool\": \"default\", \"for\": \"0\", \"reason\": \"x\"}]}", "test.json: reservations[0].for: out of range" },
                { "{\"pool\": {\"limit\": 2}, \"reservations\": [{\"at\": \"1s\", \"pool\": \"default\", \"for\": \"forever\", \"reason\": \"x\"}]}", "test.json: reservations[0].for: " },
                { "{\"pool\": {\"limit\": 2}, \"reservations\": [{\"at\": \"1s\", \"pool\": \"default\", \"for\": \"400d\", \"reason\": \"x\"}]}", "test.json: reservations[0].for: " },
                { "{\"pool\": {\"limit\": 2}, \"reservations\": [{\"at\": \"1s\", \"pool\": \"default\", \"for\": \"1s\"}]}", "test.json: reservations[0].reason: missing" },
                { "{\"pool\": {\"limit\": 2}, \"reservations\": [{\"at\": \"1s\", \"pool\": \"default\", \"for\": \"1s\", \"reason\": \"\"}]}", "test.json: reservations[0].reason: empty" },
                { "{\"pool\": {\"limit\": 2}, \"reservations\": [{\"at\": \"1s\", \"pool\": \"default\", \"for\": \"1s\", \"reason\": \"a\\u007fb\"}]}", "test.json: reservations[0].reason: contains a control character" },
                { "{\"pool\": {\"limit\": 2}, \"reservations\": [{\"at\": \"1s\", \"pool\": \"default\", \"for\": \"1s\", \"reason\": \"x\", \"member\": \"a\", \"labels\": [\"l\"]}]}", "test.json: reservations[0]: a member or labels, not both" },
                { "{\"pool\": {\"limit\": 2}, \"reservations\": [{\"at\": \"1s\", \"pool\": \"default\", \"for\": \"1s\", \"reason\": \"x\", \"labels\": []}]}", "test.json: reservations[0].labels: expected an array of labels, got an empty one" },
                { "{\"pool\": {\"limit\": 2}, \"reservations\": [{\"at\": \"1s\", \"pool\": \"default\", \"for\": \"1s\", \"reason\": \"x\", \"labels\": [\"Big\"]}]}", "test.json: reservations[0].labels[0]: expected a label" },
                { "{\"pool\": {\"limit\": 2}, \"reservations\": [{\"at\": \"1s\", \"pool\": \"default\", \"for\": \"1s\", \"reason\": \"x\", \"member\": \"a b\"}]}", "test.json: reservations[0].member: invalid member name" },
                { "{\"pool\": {\"limit\": 2}, \"reservations\": [{\"at\": \"1s\", \"pool\": \"default\", \"for\": \"1s\", \"reason\": \"x\", \"slots\": 2}]}", "test.json: reservations[0].slots: unknown key" },
                { "{\"pool\": {\"limit\": 2}, \"reservations\": [1]}", "test.json: reservations[0]: expected an object, got an integer" },
                { "{\"pool\": {\"limit\": 2, \"quarantine-exit-codes\": [3, \"x\"]}}",
                  "test.json: pool.quarantine-exit-codes[1]: expected an integer, got a string" },
                { "{\"pool\": {\"limit\": 2},", "test.json:1:" },
                { "{\"pool\": {\"limit\": 2}, \"pool\": {\"limit\": 3}}", "test.json:1:" },
        };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                Scenario *s = NULL;
                char *error = NULL;

                assert_int_equal(scenario_load_string(cases[i].json, "test.json", &error, &s), -EINVAL);
                assert_null(s);
                assert_non_null(error);
                if (strncmp(error, cases[i].error, strlen(cases[i].error)) != 0)
                        fail_msg("case %zu: got \"%s\", expected it to start with \"%s\"", i, error, cases[i].error);
                free(error);
        }
}

/* n explicit requests r0 … r{n-1}, 1 ms apart; the last one named as duplicate_of, if that is not NULL. */
static char *many_requests(size_t n, const char *duplicate_of) {
        char *text = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&text, &size);
        assert_non_null(f);
        fputs("{\"pool\": {\"limit\": 1}, \"requests\": [", f);
        for (size_t i = 0; i < n; i++) {
                if (duplicate_of && i == n - 1)
                        fprintf(f, ",{\"name\": \"%s\", \"at\": \"%zums\", \"hold\": \"1ms\"}", duplicate_of, i);
                else
                        fprintf(f, "%s{\"name\": \"r%zu\", \"at\": \"%zums\", \"hold\": \"1ms\"}", i ? "," : "", i, i);
        }
        fputs("]}", f);
        assert_int_equal(fclose(f), 0);
        return text;
}

/* 20,000 names, each checked against those before it: a hash set (a scan per name took 29 s for 80,000). */
static void test_many_explicit_requests_and_their_duplicate(void **state) {
        const size_t n = 20000;
        _cleanup_free_ char *unique = many_requests(n, NULL), *duplicate = many_requests(n, "r17");
        _cleanup_(scenario_freep) Scenario *s = load(unique);
        Scenario *bad = NULL;
        char *error = NULL;

        assert_int_equal(s->n_requests, n);
        assert_string_equal(s->requests[0].name, "r0");
        assert_string_equal(s->requests[n - 1].name, "r19999");
        assert_int_equal(s->requests[n - 1].at_ms, n - 1);

        assert_int_equal(scenario_load_string(duplicate, "test.json", &error, &bad), -EINVAL);
        assert_null(bad);
        assert_string_equal(error, "test.json: requests[19999].name: duplicate name \"r17\"");
        free(error);
}

/* n drains, quarantines, reservations and requests with a cancel, one of each a millisecond, each list given in
 * time order or backwards. */
static char *many_actions(size_t n, bool backwards) {
        char *text = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&text, &size);
        assert_non_null(f);
        fputs("{\"pool\": {\"members\": [\"a\", \"b\"]}, \"requests\": [", f);
        for (size_t i = 0; i < n; i++)
                fprintf(f, "%s{\"name\": \"r%zu\", \"at\": \"%zums\", \"hold\": \"1ms\", \"cancel\": \"%zums\"}",
                        i ? "," : "", i, i, backwards ? 2 * (n - i) : 1);
        const char *lists[] = { "drains", "quarantines", "reservations" };
        for (size_t k = 0; k < ELEMENTSOF(lists); k++) {
                fprintf(f, "], \"%s\": [", lists[k]);
                for (size_t i = 0; i < n; i++)
                        fprintf(f, "%s{\"at\": \"%zums\", \"pool\": \"default\", \"member\": \"a\", \"reason\": \"r\"%s}",
                                i ? "," : "", backwards ? n - i : i, k == 2 ? ", \"for\": \"1ms\"" : "");
        }
        fputs("]}", f);
        assert_int_equal(fclose(f), 0);
        return text;
}

/* Drains, quarantines, reservations and cancels are put in time order whatever the file's order (an O(n log n)
 * sort: an insertion sort took minutes on 100,000 cancels given backwards; its cost is not timed here, as no
 * pass/fail test times anything). */
static void test_many_actions_in_any_order(void **state) {
        const size_t n = 5000;
        _cleanup_free_ char *backwards = many_actions(n, true);
        _cleanup_(scenario_freep) Scenario *b = load(backwards);

        assert_int_equal(b->n_cancels, n);
        assert_int_equal(b->n_drains, n);
        for (size_t i = 1; i < n; i++) {
                assert_true(scenario_request_cancel_at(&b->requests[b->cancel_order[i - 1]]) <
                            scenario_request_cancel_at(&b->requests[b->cancel_order[i]]));
                assert_true(b->drains[i - 1].at_ms < b->drains[i].at_ms);
                assert_true(b->quarantines[i - 1].at_ms < b->quarantines[i].at_ms);
                assert_true(b->reservations[i - 1].at_ms < b->reservations[i].at_ms);
        }
}

static void test_config_errors_name_the_scenario_key(void **state) {
        static const struct {
                const char *json;
                const char *error;
        } cases[] = {
                { "{\"pool\": {\"limit\": 0}}", "test.json: pool.limit: " },
                { "{\"pools\": {\"a\": {\"limit\": 1}}, \"lanes\": {\"m\": {\"pools\": [\"a\"], \"policy\": \"maybe\"}}}",
                  "test.json: lanes.m.policy: " },
                { "{\"pool\": {\"limit\": 2, \"queue-timeout\": \"5m\", \"queue-congestion-timeout\": \"10m\"}}",
                  "test.json: pool: queue-congestion-timeout: " },
                { "{\"pool\": {\"limit\": 2}, \"requests\": [{\"name\": \"A\", \"at\": \"0\", \"hold\": \"1s\", \"slots\": 3}]}",
                  "test.json: requests[0].slots: 3 slots, but no pool of lane \"default\" has more than 2" },
                /* More than its lane's max-in-use, or than other lanes' reserve= leave it (SPEC §3): never granted. */
                { "{\"pools\": {\"a\": {\"limit\": 4}}, \"lanes\": {\"m\": {\"pools\": [\"a\"], \"max-in-use\": 2}}, "
                  "\"requests\": [{\"name\": \"A\", \"at\": \"0\", \"hold\": \"1s\", \"lane\": \"m\", \"slots\": 3}]}",
                  "test.json: requests[0].slots: 3 slots, but no pool of lane \"m\" has more than 2" },
                { "{\"pools\": {\"a\": {\"limit\": 4}}, \"lanes\": {\"m\": {\"pools\": [\"a\"]}, "
                  "\"r\": {\"pools\": [\"a\"], \"reserve\": 2}}, "
                  "\"requests\": [{\"name\": \"A\", \"at\": \"0\", \"hold\": \"1s\", \"lane\": \"m\", \"slots\": 3}]}",
                  "test.json: requests[0].slots: 3 slots, but no pool of lane \"m\" has more than 2" },
        };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                _cleanup_(scenario_freep) Scenario *s = load(cases[i].json);
                BrokerConfig *c = NULL;
                char *error = NULL;

                assert_int_equal(scenario_build_config(s, NULL, NULL, &error, &c), -EINVAL);
                assert_null(c);
                assert_non_null(error);
                if (strncmp(error, cases[i].error, strlen(cases[i].error)) != 0)
                        fail_msg("case %zu: got \"%s\", expected it to start with \"%s\"", i, error, cases[i].error);
                free(error);
        }
}

static char *dump_config(const BrokerConfig *c) {
        char *text = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&text, &size);
        assert_non_null(f);
        conf_dump(c, f);
        assert_int_equal(fclose(f), 0);
        return text;
}

/* A reload's configuration built on the one before (scenario_build_config_reload() with `previous`: only the
 * reload's settings, then the sweep) is the one built anew from every setting up to it; where the reload adds or
 * removes a pool or lane it is built anew, in the configuration's order of sections. Through reloads that change
 * keys, members and labels, remove and add back pools and lanes, two at one instant, with and without a sweep. */
static void test_reloads_built_on_the_one_before_are_built_anew(void **state) {
        static const char json[] =
                "{\"pools\": {\"a\": {\"limit\": 3, \"members\": [\"m0\", \"m1\", \"m2\"], \"label.x\": [\"m0\"]},"
                "            \"b\": {\"limit\": 2}},"
                " \"lanes\": {\"one\": {\"pools\": [\"a\"]}, \"two\": {\"pools\": [\"b\", \"a\"]}},"
                " \"requests\": [{\"name\": \"r\", \"at\": \"0\", \"hold\": \"1s\", \"lane\": \"one\"}],"
                " \"reloads\": ["
                "  {\"at\": \"1s\", \"pools\": {\"a\": {\"members\": [\"m2\", \"m3\"], \"limit\": 2, \"label.y\": [\"m3\"],"
                "                                   \"label.x\": [\"m2\"]}}},"
                "  {\"at\": \"2s\", \"pools\": {\"b\": null}, \"lanes\": {\"two\": null}},"
                "  {\"at\": \"3s\", \"pools\": {\"a\": {\"queue-timeout\": \"2s\", \"label.x\": [\"m3\"]}}},"
                "  {\"at\": \"3s\", \"pools\": {\"b\": {\"max-queue\": 4}}, \"lanes\": {\"two\": {}}},"
                "  {\"at\": \"4s\", \"pools\": {\"c\": {\"limit\": 3}}, \"lanes\": {\"one\": {\"priority\": 2}}},"
                "  {\"at\": \"5s\", \"pools\": {\"b\": {\"limit\": 5}}},"
                "  {\"at\": \"5s\", \"lanes\": {\"two\": {\"pools\": [\"c\"]}}}]}";
        _cleanup_(scenario_freep) Scenario *s = load(json);
        assert_int_equal(s->n_reloads, 7);
        static const char *const sweeps[][2] = { { NULL, NULL }, { "max-queue", "9" }, { "queue-timeout", "7s" } };
        for (size_t w = 0; w < ELEMENTSOF(sweeps); w++) {
                BrokerConfig *previous = NULL;
                char *error = NULL;
                assert_int_equal(scenario_build_config(s, sweeps[w][0], sweeps[w][1], &error, &previous), 0);
                for (size_t k = 1; k <= s->n_reloads; k++) {
                        BrokerConfig *anew = NULL, *on = NULL;
                        assert_int_equal(scenario_build_config_reload(s, sweeps[w][0], sweeps[w][1], k, NULL, &error,
                                                                      &anew),
                                         0);
                        assert_int_equal(scenario_build_config_reload(s, sweeps[w][0], sweeps[w][1], k, previous,
                                                                      &error, &on),
                                         0);
                        char *want = dump_config(anew), *got = dump_config(on);
                        if (!streq(want, got))
                                fail_msg("reload %zu (sweep %s): built on the one before\n%s\nbuilt anew\n%s", k,
                                         sweeps[w][0] ?: "none", got, want);
                        free(want);
                        free(got);
                        conf_free(anew);
                        conf_free(previous);
                        previous = on;
                }
                conf_free(previous);
        }
}

/* The first reload whose configuration is invalid is named as when each was built anew: its setting, or every
 * problem conf_validate() finds with where each came from (the sources copied with the configuration). */
static void test_reload_errors_are_those_of_the_configuration_built_anew(void **state) {
        static const struct {
                const char *reloads;
                const char *error;
        } cases[] = {
                { "[{\"at\": \"1s\", \"pools\": {\"a\": {\"limit\": 4}}},"
                  " {\"at\": \"2s\", \"pools\": {\"a\": {\"max-queue\": \"x\"}}}]",
                  "test.json: reloads[1].pools.a.max-queue: " },
                { "[{\"at\": \"1s\", \"pools\": {\"a\": {\"limit\": 4}}},"
                  " {\"at\": \"2s\", \"lanes\": {\"one\": {\"reserve\": 3}, \"two\": {\"reserve\": 3}}}]",
                  "test.json: reloads[1]" },
                { "[{\"at\": \"1s\", \"pools\": {\"a\": {\"queue-congestion-timeout\": \"5s\"}}}]",
                  "test.json: reloads[0]" },
        };
        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                char json[1024];
                snprintf(json, sizeof json,
                         "{\"pools\": {\"a\": {\"limit\": 3, \"queue-timeout\": \"1s\"}},"
                         " \"lanes\": {\"one\": {\"pools\": [\"a\"]}, \"two\": {\"pools\": [\"a\"]}},"
                         " \"reloads\": %s}",
                         cases[i].reloads);
                _cleanup_(scenario_freep) Scenario *s = load(json);
                BrokerConfig *c = NULL;
                char *error = NULL, *anew = NULL;
                assert_int_equal(scenario_build_config(s, NULL, NULL, &error, &c), -EINVAL);
                assert_null(c);
                assert_non_null(error);
                /* The first failing reload, built anew from every setting. */
                int r = 0;
                for (size_t k = 1; r == 0 && k <= s->n_reloads; k++) {
                        r = scenario_build_config_reload(s, NULL, NULL, k, NULL, &anew, &c);
                        c = conf_free(c);
                }
                assert_int_equal(r, -EINVAL);
                assert_string_equal(error, anew);
                if (strncmp(error, cases[i].error, strlen(cases[i].error)) != 0)
                        fail_msg("case %zu: got \"%s\", expected it to start with \"%s\"", i, error, cases[i].error);
                free(error);
                free(anew);
        }
}

static void test_bad_phase_lists(void **state) {
        static const struct {
                const char *spec;
                const char *error;
        } cases[] = {
                { "40/s", "--arrivals: invalid phase \"40/s\"" },
                { "40:60s", "--arrivals: invalid rate \"40\"" },
                { "40/s:0s", "--arrivals: invalid duration \"0s\"" },
                { "40/s:forever", "--arrivals: invalid duration \"forever\"" },
                { "40/s:1s,", "--arrivals: empty phase" },
                { "", "--arrivals: no phase given" },
        };
        char lane[] = "default", origin[] = "--arrivals";
        ScenarioTraffic t = { .lane = lane, .slots = 1, .hold_ms = 200, .max_wait = USEC_INFINITY, .origin = origin };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                _cleanup_(scenario_freep) Scenario *s = NULL;
                char *error = NULL;

                assert_int_equal(scenario_new("slotctl simulate", &s), 0);
                assert_int_equal(scenario_add_phases(s, cases[i].spec, &t, &error), -EINVAL);
                assert_non_null(error);
                if (strncmp(error, cases[i].error, strlen(cases[i].error)) != 0)
                        fail_msg("case %zu: got \"%s\", expected it to start with \"%s\"", i, error, cases[i].error);
                free(error);
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_rate_parsing),
                cmocka_unit_test(test_duration_parsing),
                cmocka_unit_test(test_floor_formula_at_odd_rates),
                cmocka_unit_test(test_phases_run_back_to_back),
                cmocka_unit_test(test_quiet_phase_shifts_the_next),
                cmocka_unit_test(test_generated_arrivals_come_before_explicit_ones),
                cmocka_unit_test(test_scenario_keys_become_config_settings),
                cmocka_unit_test(test_pool_admin_keys),
                cmocka_unit_test(test_integer_keys_take_the_config_spellings),
                cmocka_unit_test(test_exit_statuses_and_drains),
                cmocka_unit_test(test_reservations),
                cmocka_unit_test(test_bad_scenarios_name_the_culprit),
                cmocka_unit_test(test_many_explicit_requests_and_their_duplicate),
                cmocka_unit_test(test_many_actions_in_any_order),
                cmocka_unit_test(test_config_errors_name_the_scenario_key),
                cmocka_unit_test(test_reloads_built_on_the_one_before_are_built_anew),
                cmocka_unit_test(test_reload_errors_are_those_of_the_configuration_built_anew),
                cmocka_unit_test(test_bad_phase_lists),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
