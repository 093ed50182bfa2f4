/* SPDX-License-Identifier: MIT */
/* test-simulate.c — peak-queue accounting, and the virtual clock driving the real engine. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "simulate.h"

static void test_peak_is_the_largest_count_in_its_second(void **state) {
        PeakQueue p;
        peak_queue_init(&p);

        assert_int_equal(peak_queue_observe(&p, 0, 3), 0);
        assert_int_equal(peak_queue_observe(&p, 400, 9), 0);
        assert_int_equal(peak_queue_observe(&p, 999, 1), 0);
        assert_int_equal(peak_queue_observe(&p, 1000, 2), 0); /* 1000 ms opens second 2: [1, 2) */
        assert_int_equal(p.n, 2);
        assert_int_equal(p.seconds[0], 9);
        assert_int_equal(p.seconds[1], 2);
        assert_int_equal(peak_queue_max(&p), 9);
        peak_queue_done(&p);
}

static void test_peak_second_without_instants_carries_the_current_count(void **state) {
        PeakQueue p;
        peak_queue_init(&p);

        assert_int_equal(peak_queue_observe(&p, 500, 4), 0);
        assert_int_equal(peak_queue_observe(&p, 900, 7), 0);
        assert_int_equal(peak_queue_observe(&p, 950, 5), 0);
        /* Seconds 2..4 have no instant: they carry 5, what the last instant left, not the peak 7. */
        assert_int_equal(peak_queue_observe(&p, 4200, 0), 0);
        const uint32_t expect[] = { 7, 5, 5, 5, 0 };
        assert_int_equal(p.n, ELEMENTSOF(expect));
        for (size_t i = 0; i < ELEMENTSOF(expect); i++)
                assert_int_equal(p.seconds[i], expect[i]);
        peak_queue_done(&p);
}

static void test_peak_before_the_first_instant_is_zero(void **state) {
        PeakQueue p;
        peak_queue_init(&p);

        assert_int_equal(peak_queue_observe(&p, 10000, 1), 0);
        assert_int_equal(p.n, 11);
        for (size_t i = 0; i < 10; i++)
                assert_int_equal(p.seconds[i], 0);
        assert_int_equal(p.seconds[10], 1);
        peak_queue_done(&p);
}

static void test_peak_counts_a_repeated_instant_once_settled(void **state) {
        PeakQueue p;
        peak_queue_init(&p);

        /* A second pass of one instant (a zero hold, a revocation) is another end of an instant. */
        assert_int_equal(peak_queue_observe(&p, 2000, 3), 0);
        assert_int_equal(peak_queue_observe(&p, 2000, 1), 0);
        assert_int_equal(p.n, 3);
        assert_int_equal(p.seconds[2], 3);
        assert_int_equal(p.current, 1);
        peak_queue_done(&p);
}

static void test_format_tenths_floors(void **state) {
        char buf[32];
        assert_string_equal(sim_format_tenths(buf, sizeof buf, 3325), "3.3");
        assert_string_equal(sim_format_tenths(buf, sizeof buf, 3399), "3.3");
        assert_string_equal(sim_format_tenths(buf, sizeof buf, 99), "0.0");
        assert_string_equal(sim_format_tenths(buf, sizeof buf, 10000), "10.0");
        assert_string_equal(sim_format_tenths(buf, sizeof buf, 341000), "341.0");
}

static void test_splitmix64_is_seeded(void **state) {
        uint64_t a = 1, b = 1, c = 2;
        uint64_t x = sim_splitmix64(&a), y = sim_splitmix64(&b), z = sim_splitmix64(&c);
        assert_true(x == y);
        assert_true(x != z);
        assert_true(sim_splitmix64(&a) != x);
}

static SimResult *run(const char *json, bool per_request) {
        _cleanup_(scenario_freep) Scenario *s = NULL;
        _cleanup_(conf_freep) BrokerConfig *c = NULL;
        SimResult *result = NULL;
        char *error = NULL;

        if (scenario_load_string(json, "test.json", &error, &s) < 0 ||
            scenario_build_config(s, NULL, NULL, &error, &c) < 0)
                fail_msg("scenario: %s", error ?: "(no message)");
        SimOptions o = { .seed = 1, .per_request = per_request };
        assert_int_equal(sim_run(s, c, &o, &result), 0);
        return result;
}

/* As run(), the scenario kept: the records point into its names, which a report prints. */
static SimResult *run_kept(const char *json, bool per_request, Scenario **ret_scenario) {
        _cleanup_(conf_freep) BrokerConfig *c = NULL;
        SimResult *result = NULL;
        char *error = NULL;

        if (scenario_load_string(json, "test.json", &error, ret_scenario) < 0 ||
            scenario_build_config(*ret_scenario, NULL, NULL, &error, &c) < 0)
                fail_msg("scenario: %s", error ?: "(no message)");
        SimOptions o = { .seed = 1, .per_request = per_request };
        assert_int_equal(sim_run(*ret_scenario, c, &o, &result), 0);
        return result;
}

#define REFERENCE_POOL "\"pool\": {\"limit\": 6, \"max-queue\": 100}, \"deadline\": \"30s\""

static void test_reference_40_per_second(void **state) {
        _cleanup_(sim_result_freep) SimResult *r = run(
                "{" REFERENCE_POOL ", \"arrivals\": [{\"rate\": \"40/s\", \"for\": \"60s\", \"hold\": \"200ms\"}]}", false);

        assert_int_equal(r->requests, 2400);
        assert_int_equal(r->granted, 1900);
        assert_int_equal(r->refused[REFUSAL_FULL], 500);
        assert_int_equal(r->late, 0);
        assert_int_equal(r->peaks.seconds[4], 50);
        assert_int_equal(r->peaks.seconds[19], 100);
        assert_int_equal(r->peaks.seconds[39], 100);
        assert_int_equal(r->peaks.seconds[59], 100);
        assert_int_equal(r->first_refusal_ms / 100, 100);
        assert_int_equal(r->longest_wait_ms / 100, 33);
        assert_int_equal(r->drained_ms / 100, 35);
        assert_int_equal(r->n_records, 0); /* nothing kept per request unless asked */
}

static void test_reference_burst_then_steady(void **state) {
        _cleanup_(sim_result_freep) SimResult *r = run(
                "{" REFERENCE_POOL ", \"arrivals\": [{\"rate\": \"200/s\", \"for\": \"1s\", \"hold\": \"200ms\"},"
                "                                   {\"rate\": \"20/s\", \"for\": \"59s\", \"hold\": \"200ms\"}]}", false);

        assert_int_equal(r->requests, 1380);
        assert_int_equal(r->refused[REFUSAL_FULL] + r->refused[REFUSAL_BUSY] + r->refused[REFUSAL_TIMEOUT] +
                                 r->refused[REFUSAL_SHED],
                         71);
        assert_int_equal(r->peaks.seconds[4], 69);
        assert_int_equal(r->peaks.seconds[19], 0);
        assert_int_equal(r->first_refusal_ms / 100, 5);
        assert_int_equal(r->longest_wait_ms / 100, 33);
}

static void test_simulation_covers_every_second_until_the_last_hold_ends(void **state) {
        _cleanup_(sim_result_freep) SimResult *r = run(
                "{" REFERENCE_POOL ", \"arrivals\": [{\"rate\": \"25/s\", \"for\": \"60s\", \"hold\": \"200ms\"}]}", false);

        /* The last arrival is at 59960 ms, its hold ends at 60160 ms: second 61. */
        assert_int_equal(r->end_ms, 60160);
        assert_int_equal(r->peaks.n, 61);
        assert_int_equal(peak_queue_max(&r->peaks), 0);
        assert_int_equal(r->drained_ms, 200);
        assert_true(r->first_refusal_ms == SIM_FOREVER);
}

/* SPEC §3.5 in a scenario: a two-rig arm64 request is not passed by a one-rig arm64 request behind it, while
 * a request for the rig it cannot use is granted at once. */
static void test_labels_and_member_in_a_scenario(void **state) {
        _cleanup_(sim_result_freep) SimResult *r = run(
                "{\"pool\": {\"members\": [\"a\", \"b\", \"c\"], \"label.arm64\": [\"a\", \"b\"]}, \"requests\": ["
                " {\"name\": \"hold-a\", \"at\": \"0s\", \"hold\": \"10s\", \"member\": \"a\"},"
                " {\"name\": \"two\", \"at\": \"1s\", \"hold\": \"5s\", \"slots\": 2, \"labels\": [\"arm64\"]},"
                " {\"name\": \"one\", \"at\": \"2s\", \"hold\": \"5s\", \"labels\": [\"arm64\"]},"
                " {\"name\": \"plain\", \"at\": \"3s\", \"hold\": \"5s\", \"labels\": [\"!arm64\"]}]}", true);

        assert_int_equal(r->n_records, 4);
        assert_int_equal(r->records[1].decided_ms, 10000); /* when a frees: a and b together */
        assert_int_equal(r->records[2].decided_ms, 15000); /* behind it, though b was free from the start */
        assert_int_equal(r->records[3].decided_ms, 3000);  /* c: of no use to the arm64 waiters */
        assert_int_equal(r->granted, 4);
}

/* SPEC §3.5, also=: the set waits for db holding nothing, and the one-pool request behind it in db does not
 * take db before it; a bad also= is the config parser's error. */
static void test_also_in_a_scenario(void **state) {
        _cleanup_(sim_result_freep) SimResult *r = run(
                "{\"pools\": {\"grid\": {\"limit\": 2}, \"db\": {\"limit\": 1}},"
                " \"lanes\": {\"e2e\": {\"pools\": [\"grid\"], \"also\": [\"db\"]}, \"db\": {\"pools\": [\"db\"]},"
                "            \"grid\": {\"pools\": [\"grid\"]}},"
                " \"requests\": ["
                " {\"name\": \"d\", \"at\": \"0s\", \"hold\": \"10s\", \"lane\": \"db\"},"
                " {\"name\": \"set\", \"at\": \"1s\", \"hold\": \"5s\", \"lane\": \"e2e\"},"
                " {\"name\": \"d2\", \"at\": \"2s\", \"hold\": \"5s\", \"lane\": \"db\"},"
                " {\"name\": \"g\", \"at\": \"3s\", \"hold\": \"1s\", \"lane\": \"grid\"}]}", true);

        assert_int_equal(r->n_records, 4);
        assert_int_equal(r->records[1].decided_ms, 10000); /* when db frees */
        assert_int_equal(r->records[2].decided_ms, 15000); /* behind the set, though it asked for db alone */
        assert_int_equal(r->records[3].decided_ms, 10000); /* behind the set in grid (no barging), then its other slot */
        assert_int_equal(r->granted, 4);

        _cleanup_(scenario_freep) Scenario *s = NULL;
        _cleanup_(conf_freep) BrokerConfig *c = NULL;
        _cleanup_free_ char *error = NULL;
        assert_int_equal(scenario_load_string("{\"pools\": {\"grid\": {\"limit\": 1}},"
                                              " \"lanes\": {\"e2e\": {\"pools\": [\"grid\"], \"also\": [\"grid\"]}},"
                                              " \"requests\": [{\"name\": \"x\", \"at\": \"0s\", \"hold\": \"1s\", \"lane\": \"e2e\"}]}",
                                              "test.json", &error, &s),
                         0);
        assert_true(scenario_build_config(s, NULL, NULL, &error, &c) < 0);
        assert_non_null(strstr(error, "its own pool grid"));
}

/* A set refused at its budget's end in one pool (p1's queue-timeout) gives back its part in p0, which held back
 * the one-pool waiter behind it there: that one is granted at the same instant, as behind any waiter refused so
 * (SPEC §3.3, step 4), not when something else next happens in p0 (the holder of p1 at 10 s). */
static void test_a_set_refused_lets_those_behind_it_go(void **state) {
        _cleanup_(sim_result_freep) SimResult *r = run(
                "{\"pools\": {\"p0\": {\"limit\": 1}, \"p1\": {\"limit\": 1, \"queue-timeout\": \"1s\"}},"
                " \"lanes\": {\"set\": {\"pools\": [\"p0\"], \"also\": [\"p1\"]}, \"one\": {\"pools\": [\"p0\"]},"
                "            \"hold\": {\"pools\": [\"p1\"]}},"
                " \"requests\": ["
                " {\"name\": \"holder\", \"at\": \"0ms\", \"hold\": \"10s\", \"lane\": \"hold\"},"
                " {\"name\": \"set\", \"at\": \"100ms\", \"hold\": \"1s\", \"lane\": \"set\"},"
                " {\"name\": \"behind\", \"at\": \"200ms\", \"hold\": \"1s\", \"lane\": \"one\"}]}", true);

        assert_int_equal(r->n_records, 3);
        assert_int_equal(r->records[1].outcome, SIM_OUTCOME_REFUSED);
        assert_int_equal(r->records[1].refusal, REFUSAL_TIMEOUT);
        assert_int_equal(r->records[1].decided_ms, 1100);
        assert_int_equal(r->records[2].outcome, SIM_OUTCOME_GRANTED);
        assert_int_equal(r->records[2].decided_ms, 1100);
}

/* A set refused at once by two of its pools, busy in its chosen pool and drained in its also= pool, names the
 * drained one: that pool could not take the set at all (the scripts decide so over a set). */
static void test_a_set_refusal_names_a_drained_pool_before_a_busy_one(void **state) {
        _cleanup_(scenario_freep) Scenario *s = NULL;
        _cleanup_(sim_result_freep) SimResult *r = run_kept(
                "{\"pools\": {\"p0\": {\"limit\": 1}, \"p1\": {\"limit\": 1}},"
                " \"lanes\": {\"set\": {\"pools\": [\"p0\"], \"also\": [\"p1\"], \"policy\": \"fail-fast\"},"
                "            \"one\": {\"pools\": [\"p0\"]}},"
                " \"requests\": ["
                " {\"name\": \"holder\", \"at\": \"0ms\", \"hold\": \"1s\", \"lane\": \"one\"},"
                " {\"name\": \"set\", \"at\": \"200ms\", \"hold\": \"1s\", \"lane\": \"set\"}],"
                " \"drains\": [{\"at\": \"100ms\", \"pool\": \"p1\", \"reason\": \"maintenance\"}]}", true, &s);

        assert_int_equal(r->n_records, 2);
        assert_int_equal(r->records[1].outcome, SIM_OUTCOME_REFUSED);
        assert_int_equal(r->records[1].refusal, REFUSAL_UNAVAILABLE);
        assert_string_equal(r->records[1].pool, "p1");
}

/* A set of a higher priority than a set waiting in its pools has no room there (SPEC §3: somebody waits), though
 * it is first in both queues at once: it is queued (with its budget), then granted in step 3 of the same instant,
 * as a one-pool request would be; not granted at once as if nobody waited. */
static void test_a_set_ahead_of_a_waiting_set_is_queued_first(void **state) {
        _cleanup_(sim_result_freep) SimResult *r = run(
                "{\"pools\": {\"p0\": {\"limit\": 2}, \"p1\": {\"limit\": 2, \"queue-timeout\": \"5s\"}},"
                " \"lanes\": {\"low\": {\"pools\": [\"p1\"], \"also\": [\"p0:2\"], \"priority\": 0},"
                "            \"high\": {\"pools\": [\"p1\"], \"also\": [\"p0\"], \"priority\": 5},"
                "            \"one\": {\"pools\": [\"p0\"]}},"
                " \"requests\": ["
                " {\"name\": \"holder\", \"at\": \"0ms\", \"hold\": \"1s\", \"lane\": \"one\"},"
                " {\"name\": \"low\", \"at\": \"100ms\", \"hold\": \"1s\", \"lane\": \"low\"},"
                " {\"name\": \"high\", \"at\": \"200ms\", \"hold\": \"1s\", \"lane\": \"high\"}]}", true);

        assert_int_equal(r->n_records, 3);
        assert_int_equal(r->records[2].outcome, SIM_OUTCOME_GRANTED);
        assert_int_equal(r->records[2].decided_ms, 200);
        assert_true(r->records[2].queued);
        assert_int_equal(r->records[2].state, QUEUE_STATE_KEEPING_UP);
        assert_int_equal(r->records[2].budget, 5 * USEC_PER_SEC);
        assert_int_equal(r->records[1].decided_ms, 1200); /* both of p0 once the holder and high are done */
}

/* SPEC §3.6 in a scenario: released slots rest for the pool's cooldown, the two-slot waiter at the head keeps its
 * place while they rest, and the queue is served in order when they wake — the engine's decisions. */
static void test_cooldown_in_a_scenario(void **state) {
        _cleanup_(sim_result_freep) SimResult *r = run(
                "{\"pool\": {\"limit\": 2, \"cooldown\": \"10s\"}, \"requests\": ["
                " {\"name\": \"A\", \"at\": \"0s\", \"hold\": \"5s\"},"
                " {\"name\": \"B\", \"at\": \"0s\", \"hold\": \"8s\"},"
                " {\"name\": \"two\", \"at\": \"1s\", \"hold\": \"5s\", \"slots\": 2},"
                " {\"name\": \"one\", \"at\": \"2s\", \"hold\": \"1s\"},"
                " {\"name\": \"nowait\", \"at\": \"16s\", \"hold\": \"1s\", \"wait\": false}]}", true);

        assert_int_equal(r->n_records, 5);
        assert_int_equal(r->records[2].decided_ms, 18000); /* B's slot wakes at 18 (A's at 15): both */
        assert_int_equal(r->records[3].decided_ms, 33000); /* behind it; then both rest 23 → 33 */
        assert_int_equal(r->records[4].outcome, SIM_OUTCOME_REFUSED);
        assert_int_equal(r->records[4].refusal, REFUSAL_BUSY);
        assert_int_equal(r->granted, 4);
}

/* A health grant counts for its lane's reserve= (SPEC §3): the waiter that the unused reserved slot passed over has
 * room once the health job takes its quarantined member when it wakes from its rest, and is granted at that
 * instant, before its budget that ends then is refused (SPEC §3.3: step 3 before 4); the one behind it waits
 * until its own budget ends. Was: granted at the pool's next event (none without a deadline), refused at its own
 * deadline. tests/scenarios/health-grant-reserve*.json are these for the differential test. */
static void test_a_health_grant_uses_up_its_reserve_at_once(void **state) {
        _cleanup_(sim_result_freep) SimResult *r = run(
                "{\"pools\": {\"rigs\": {\"members\": [\"a\", \"b\", \"c\"], \"quarantine-exit-codes\": [3], \"cooldown\": \"1s\"}},"
                " \"lanes\": {\"ci\": {\"pools\": [\"rigs\"]},"
                "            \"health\": {\"pools\": [\"rigs\"], \"health\": \"yes\", \"reserve\": 1}},"
                " \"requests\": ["
                " {\"name\": \"breaks-a\", \"at\": \"0s\", \"hold\": \"500ms\", \"lane\": \"ci\", \"member\": \"a\", \"exit\": 3},"
                " {\"name\": \"check-a\", \"at\": \"600ms\", \"hold\": \"1s\", \"lane\": \"health\", \"member\": \"a\", \"exit\": 1},"
                " {\"name\": \"on-b\", \"at\": \"700ms\", \"hold\": \"5s\", \"lane\": \"ci\"},"
                " {\"name\": \"passed-over\", \"at\": \"800ms\", \"hold\": \"1s\", \"lane\": \"ci\", \"max-wait\": \"700ms\"},"
                " {\"name\": \"behind\", \"at\": \"900ms\", \"hold\": \"1s\", \"lane\": \"ci\", \"max-wait\": \"1s\"}]}",
                true);

        assert_int_equal(r->n_records, 5);
        assert_int_equal(r->records[1].outcome, SIM_OUTCOME_GRANTED); /* a wakes: the health job's */
        assert_int_equal(r->records[1].decided_ms, 1500);
        assert_int_equal(r->records[3].outcome, SIM_OUTCOME_GRANTED); /* c, at its deadline */
        assert_int_equal(r->records[3].decided_ms, 1500);
        assert_true(r->records[3].queued);
        assert_int_equal(r->records[4].outcome, SIM_OUTCOME_REFUSED); /* c is taken */
        assert_int_equal(r->records[4].refusal, REFUSAL_TIMEOUT);
        assert_int_equal(r->records[4].decided_ms, 1900);
}

/* Issue 23: exit statuses quarantine (after 2 in a row), a health job restores with exit 0 (its exit 1 does not),
 * a drain until a time ends by itself, a drained pool refuses, a max-hold kill tells no exit status. */
static void test_quarantine_health_and_drains_in_a_scenario(void **state) {
        _cleanup_(sim_result_freep) SimResult *r = run(
                "{\"pools\": {\"rigs\": {\"members\": [\"a\", \"b\"], \"quarantine-exit-codes\": \"3\", \"quarantine-after\": 2}},"
                " \"lanes\": {\"ci\": {\"pools\": [\"rigs\"]}, \"check\": {\"pools\": [\"rigs\"], \"health\": \"yes\"},"
                "            \"short\": {\"pools\": [\"rigs\"], \"max-hold\": \"1s\"}},"
                " \"requests\": ["
                " {\"name\": \"killed\", \"at\": \"0s\", \"hold\": \"5s\", \"lane\": \"short\", \"member\": \"a\", \"exit\": 3},"
                " {\"name\": \"f1\", \"at\": \"2s\", \"hold\": \"1s\", \"lane\": \"ci\", \"member\": \"a\", \"exit\": 3},"
                " {\"name\": \"f2\", \"at\": \"4s\", \"hold\": \"1s\", \"lane\": \"ci\", \"member\": \"a\", \"exit\": 3},"
                " {\"name\": \"w\", \"at\": \"6s\", \"hold\": \"1s\", \"lane\": \"ci\", \"member\": \"a\"},"
                " {\"name\": \"bad-check\", \"at\": \"7s\", \"hold\": \"1s\", \"lane\": \"check\", \"exit\": 1},"
                " {\"name\": \"good-check\", \"at\": \"9s\", \"hold\": \"1s\", \"lane\": \"check\", \"exit\": 0},"
                " {\"name\": \"on-b\", \"at\": \"20s\", \"hold\": \"1s\", \"lane\": \"ci\", \"member\": \"b\"},"
                " {\"name\": \"late\", \"at\": \"31s\", \"hold\": \"1s\", \"lane\": \"ci\"}],"
                " \"drains\": [{\"at\": \"19s\", \"pool\": \"rigs\", \"member\": \"b\", \"reason\": \"reflash\", \"until\": \"25s\"},"
                "            {\"at\": \"30s\", \"pool\": \"rigs\", \"reason\": \"window\"}]}", true);

        assert_int_equal(r->n_records, 8);
        /* killed's exit 3 was not told (max-hold), so f1 and f2 are the two in a row: w waits for the restore. */
        assert_int_equal(r->quarantined, 1);
        assert_int_equal(r->restored, 1);
        assert_int_equal(r->records[3].decided_ms, 10000); /* good-check's end, not bad-check's */
        assert_int_equal(r->records[6].decided_ms, 25000); /* b drained until 25 s */
        assert_int_equal(r->records[7].outcome, SIM_OUTCOME_REFUSED);
        assert_int_equal(r->records[7].refusal, REFUSAL_UNAVAILABLE);
}

/* Issue 23 item 4: a reservation is ahead of a k=2 waiter that came first (it takes b when b's rest ends, then a
 * second one takes a), its lease ends `for` after its grant (max-hold), the k=2 waiter gets both once they have
 * rested, and a request the pair does not want takes c meanwhile; a reservation of a drained pool is refused. The
 * reservations are counted apart from requests, and printed only where the scenario has some. */
static void test_reservations_in_a_scenario(void **state) {
        static const char json[] =
                "{\"pools\": {\"rigs\": {\"members\": [\"a\", \"b\", \"c\"], \"label.fast\": [\"a\", \"b\"], \"cooldown\": \"200ms\"},"
                "           \"spare\": {\"limit\": 1}},"
                " \"lanes\": {\"ci\": {\"pools\": [\"rigs\"]}},"
                " \"requests\": ["
                " {\"name\": \"on-a\", \"at\": \"0s\", \"hold\": \"500ms\", \"lane\": \"ci\", \"member\": \"a\"},"
                " {\"name\": \"on-b\", \"at\": \"0s\", \"hold\": \"300ms\", \"lane\": \"ci\", \"member\": \"b\"},"
                " {\"name\": \"pair\", \"at\": \"100ms\", \"hold\": \"200ms\", \"lane\": \"ci\", \"slots\": 2, \"labels\": [\"fast\"]},"
                " {\"name\": \"on-c\", \"at\": \"600ms\", \"hold\": \"200ms\", \"lane\": \"ci\", \"labels\": [\"!fast\"]}],"
                " \"drains\": [{\"at\": \"0s\", \"pool\": \"spare\", \"reason\": \"off\"}],"
                " \"reservations\": ["
                " {\"at\": \"200ms\", \"pool\": \"rigs\", \"labels\": [\"fast\"], \"for\": \"1s\", \"reason\": \"flasher\"},"
                " {\"at\": \"600ms\", \"pool\": \"rigs\", \"member\": \"a\", \"for\": \"300ms\", \"reason\": \"a look\"},"
                " {\"at\": \"1s\", \"pool\": \"spare\", \"for\": \"1s\", \"reason\": \"drained\"}]}";
        _cleanup_(scenario_freep) Scenario *s = NULL;
        _cleanup_(sim_result_freep) SimResult *r = run_kept(json, true, &s);

        assert_int_equal(r->requests, 4);
        assert_int_equal(r->granted, 4);
        assert_int_equal(r->reservations, 3);
        assert_int_equal(r->reserved, 2);
        assert_int_equal(r->reservations_refused, 1);
        assert_int_equal(r->longest_reservation_wait_ms, 300); /* b rests from 300 to 500 ms */
        /* pair: a and b once the reservations have ended (1000 and 1500 ms) and rested (200 ms). */
        assert_int_equal(r->records[2].decided_ms, 1700);
        assert_int_equal(r->records[3].decided_ms, 600);
        assert_int_equal(r->longest_wait_ms, 1600);

        _cleanup_free_ char *text = NULL, *js = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&text, &size);
        assert_non_null(f);
        sim_print_text(s, r, f);
        assert_int_equal(fclose(f), 0);
        assert_non_null(strstr(text, "\nreservations       3  (granted 2, refused 1, longest wait 0.3 s)\n"));
        f = open_memstream(&js, &size);
        assert_non_null(f);
        sim_print_json(s, r, f);
        assert_int_equal(fclose(f), 0);
        assert_non_null(strstr(js, "\n  \"reservations\": {\"count\": 3, \"granted\": 2, \"refused\": 1, \"longestWaitMs\": 300},\n"));

        /* Without reservations, neither report names them. */
        static const char plain[] = "{\"pool\": {\"limit\": 1}, \"requests\": [{\"name\": \"x\", \"at\": \"0s\", \"hold\": \"1s\"}]}";
        _cleanup_(scenario_freep) Scenario *p = NULL;
        _cleanup_(sim_result_freep) SimResult *none = run_kept(plain, false, &p);
        free(text);
        text = NULL;
        f = open_memstream(&text, &size);
        assert_non_null(f);
        sim_print_text(p, none, f);
        sim_print_json(p, none, f);
        assert_int_equal(fclose(f), 0);
        assert_null(strstr(text, "reservations"));
}

/* A request's cancel: its client goes away while it waits, so the waiter behind it gets the slot first; a cancel
 * of a request granted before it changes nothing. A quarantine by hand keeps a member from ordinary lanes until
 * its restore. */
static void test_cancels_and_quarantines_in_a_scenario(void **state) {
        static const char json[] =
                "{\"pools\": {\"rigs\": {\"members\": [\"a\", \"b\"]}},"
                " \"lanes\": {\"ci\": {\"pools\": [\"rigs\"]}},"
                " \"requests\": ["
                " {\"name\": \"on-a\", \"at\": \"0s\", \"hold\": \"1s\", \"lane\": \"ci\", \"member\": \"a\"},"
                " {\"name\": \"gone\", \"at\": \"100ms\", \"hold\": \"1s\", \"lane\": \"ci\", \"member\": \"a\", \"cancel\": \"400ms\"},"
                " {\"name\": \"next\", \"at\": \"200ms\", \"hold\": \"1s\", \"lane\": \"ci\", \"member\": \"a\"},"
                " {\"name\": \"quick\", \"at\": \"0s\", \"hold\": \"100ms\", \"lane\": \"ci\", \"member\": \"b\", \"cancel\": \"1s\"},"
                " {\"name\": \"on-b\", \"at\": \"3s\", \"hold\": \"1s\", \"lane\": \"ci\", \"member\": \"b\"}],"
                " \"quarantines\": [{\"at\": \"2s\", \"pool\": \"rigs\", \"member\": \"b\", \"reason\": \"flaky\"},"
                "                   {\"at\": \"5s\", \"pool\": \"rigs\", \"member\": \"b\", \"restore\": true}]}";
        _cleanup_(scenario_freep) Scenario *s = NULL;
        _cleanup_(sim_result_freep) SimResult *r = run_kept(json, true, &s);

        assert_int_equal(r->requests, 5);
        assert_int_equal(r->granted, 4);
        assert_int_equal(r->cancelled, 1);
        /* In arrival order: on-a, quick, gone, next, on-b. */
        assert_int_equal(r->records[1].outcome, SIM_OUTCOME_GRANTED); /* quick: its cancel came too late */
        assert_int_equal(r->records[2].outcome, SIM_OUTCOME_CANCELLED);
        assert_int_equal(r->records[2].decided_ms, 500);
        assert_int_equal(r->records[3].outcome, SIM_OUTCOME_GRANTED);
        assert_int_equal(r->records[3].decided_ms, 1000); /* a, when on-a ends: gone is gone */
        assert_int_equal(r->records[4].decided_ms, 5000); /* b, once restored */

        _cleanup_free_ char *js = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&js, &size);
        assert_non_null(f);
        sim_print_json(s, r, f);
        assert_int_equal(fclose(f), 0);
        assert_non_null(strstr(js, "\n  \"cancelled\": 1,\n"));
        assert_non_null(strstr(js, "\"outcome\": \"cancelled\", \"decidedMs\": 500,"));

        /* A quarantine of a member the pool does not have is an error, as slotctl quarantine's. */
        _cleanup_(scenario_freep) Scenario *bad = NULL;
        _cleanup_(conf_freep) BrokerConfig *c = NULL;
        _cleanup_free_ char *error = NULL;
        assert_int_equal(scenario_load_string("{\"pool\": {\"members\": [\"a\"]}, \"quarantines\": [{\"at\": \"1s\", "
                                              "\"pool\": \"default\", \"member\": \"z\"}]}",
                                              "q.json", &error, &bad),
                         0);
        assert_int_equal(scenario_build_config(bad, NULL, NULL, &error, &c), -EINVAL);
        assert_string_equal(error, "q.json: quarantines[0].member: pool \"default\" has no member \"z\"");
}

/* A reload (SPEC §4) changes what follows it: a larger limit grants a waiter at once, a lane's new priority puts its
 * waiter first; a later reload keeps what an earlier one changed. */
static void test_reloads_in_a_scenario(void **state) {
        static const char json[] =
                "{\"pools\": {\"grid\": {\"limit\": 1}},"
                " \"lanes\": {\"a\": {\"pools\": [\"grid\"]}, \"b\": {\"pools\": [\"grid\"]}},"
                " \"requests\": ["
                " {\"name\": \"first\", \"at\": \"0s\", \"hold\": \"5s\", \"lane\": \"a\"},"
                " {\"name\": \"second\", \"at\": \"0s\", \"hold\": \"5s\", \"lane\": \"a\"},"
                " {\"name\": \"early\", \"at\": \"2s\", \"hold\": \"1s\", \"lane\": \"a\"},"
                " {\"name\": \"urgent\", \"at\": \"3s\", \"hold\": \"1s\", \"lane\": \"b\"}],"
                " \"reloads\": [{\"at\": \"1s\", \"pools\": {\"grid\": {\"limit\": 2}}},"
                "               {\"at\": \"4s\", \"lanes\": {\"b\": {\"priority\": 5}}}]}";
        _cleanup_(sim_result_freep) SimResult *r = run(json, true);

        assert_int_equal(r->granted, 4);
        assert_int_equal(r->records[1].decided_ms, 1000); /* the limit of 2 */
        assert_int_equal(r->records[3].decided_ms, 5000); /* urgent, at first's end, ahead of early */
        assert_int_equal(r->records[2].decided_ms, 6000); /* early, at second's end */

}

/* A set (also=) whose pool and lane a reload removes is refused by the pool removed, ahead of what the pool that
 * stays refuses for the lane: the order a shared pool has (it retires at once, tells its removed lane through
 * Redis later). */
static void test_reload_refusal_of_a_set_names_the_pool_removed(void **state) {
        _cleanup_(scenario_freep) Scenario *s = NULL;
        _cleanup_(sim_result_freep) SimResult *r = run_kept(
                "{\"pools\": {\"p0\": {\"limit\": 1}, \"p1\": {\"limit\": 1}},"
                " \"lanes\": {\"a\": {\"pools\": [\"p0\"]}, \"b\": {\"pools\": [\"p1\"], \"also\": [\"p0\"]}},"
                " \"requests\": [{\"name\": \"holds\", \"at\": \"0s\", \"hold\": \"3s\", \"lane\": \"b\"},"
                "              {\"name\": \"set\", \"at\": \"1s\", \"hold\": \"1s\", \"lane\": \"b\"}],"
                " \"reloads\": [{\"at\": \"2s\", \"pools\": {\"p1\": null}, \"lanes\": {\"b\": null}}]}",
                true, &s);
        assert_int_equal(r->records[1].refusal, REFUSAL_UNAVAILABLE);
        assert_int_equal(r->records[1].decided_ms, 2000);
        assert_string_equal(r->records[1].pool, "p1");
}

/* The scenario's error, loaded and its configuration built. */
static char *scenario_error_of(const char *json) {
        _cleanup_(scenario_freep) Scenario *s = NULL;
        _cleanup_(conf_freep) BrokerConfig *c = NULL;
        char *error = NULL;
        int r = scenario_load_string(json, "r.json", &error, &s);
        if (r == 0)
                r = scenario_build_config(s, NULL, NULL, &error, &c);
        assert_int_equal(r, -EINVAL);
        assert_non_null(error);
        return error;
}

/* SPEC §4: a reload adds pools and lanes and removes them; a removed pool's holders finish and its waiters are
 * refused, as a removed lane's; one named again comes back, with its holders and its keys. */
static void test_reloads_add_and_remove_pools_and_lanes(void **state) {
        static const char json[] =
                "{\"pools\": {\"grid\": {\"limit\": 1, \"queue-timeout\": \"20s\"}},"
                " \"lanes\": {\"a\": {\"pools\": [\"grid\"]}, \"b\": {\"pools\": [\"grid\"]}},"
                " \"requests\": ["
                " {\"name\": \"holder\", \"at\": \"0s\", \"hold\": \"5s\", \"lane\": \"a\"},"
                " {\"name\": \"waiter\", \"at\": \"0s\", \"hold\": \"1s\", \"lane\": \"a\"},"
                " {\"name\": \"lane-gone\", \"at\": \"0s\", \"hold\": \"1s\", \"lane\": \"b\"},"
                " {\"name\": \"new-lane\", \"at\": \"1500ms\", \"hold\": \"1s\", \"lane\": \"c\"},"
                " {\"name\": \"moved\", \"at\": \"2500ms\", \"hold\": \"4s\", \"lane\": \"a\"},"
                " {\"name\": \"back\", \"at\": \"3s\", \"hold\": \"1s\", \"lane\": \"a\", \"wait\": false}],"
                " \"reloads\": [{\"at\": \"1s\", \"pools\": {\"spare\": {\"limit\": 1}},"
                "                \"lanes\": {\"b\": null, \"c\": {\"pools\": [\"spare\"]}}},"
                "               {\"at\": \"2s\", \"pools\": {\"grid\": null}, \"lanes\": {\"a\": {\"pools\": [\"spare\"]}}},"
                "               {\"at\": \"3s\", \"pools\": {\"grid\": {}}, \"lanes\": {\"a\": {\"pools\": [\"grid\", \"spare\"]}}}]}";
        _cleanup_(scenario_freep) Scenario *s = NULL;
        _cleanup_(sim_result_freep) SimResult *r = run_kept(json, true, &s);

        assert_int_equal(r->n_records, 6);
        assert_int_equal(r->records[0].outcome, SIM_OUTCOME_GRANTED);
        assert_int_equal(r->records[1].refusal, REFUSAL_UNAVAILABLE); /* its pool removed */
        assert_int_equal(r->records[1].decided_ms, 2000);
        assert_int_equal(r->records[2].refusal, REFUSAL_UNAVAILABLE); /* its lane removed */
        assert_int_equal(r->records[2].decided_ms, 1000);
        assert_string_equal(r->records[3].pool, "spare");
        assert_int_equal(r->records[3].decided_ms, 1500);
        assert_string_equal(r->records[4].pool, "spare");
        /* grid is back with its limit of 1 and its holder, until 5s: no room in either pool. */
        assert_int_equal(r->records[5].refusal, REFUSAL_BUSY);
        assert_int_equal(r->records[5].decided_ms, 3000);

        _cleanup_free_ char *e1 = scenario_error_of("{\"pool\": {\"limit\": 1}, \"reloads\": [{\"at\": \"1s\", "
                                                    "\"lanes\": {\"nope\": null}}]}");
        assert_string_equal(e1, "r.json: reloads[0].lanes.nope: no lane \"nope\" to remove");
        /* A lane added without pools: the configuration's own error. */
        _cleanup_free_ char *e2 = scenario_error_of("{\"pool\": {\"limit\": 1}, \"reloads\": [{\"at\": \"1s\", "
                                                    "\"lanes\": {\"new\": {\"priority\": 1}}}]}");
        assert_non_null(strstr(e2, "new"));
        /* A lane that still names a removed pool. */
        _cleanup_free_ char *e3 = scenario_error_of("{\"pool\": {\"limit\": 1}, \"reloads\": [{\"at\": \"1s\", "
                                                    "\"pools\": {\"default\": null}}]}");
        assert_non_null(strstr(e3, "default"));
        /* A request in a lane removed before it arrives, a drain of a pool added after it. */
        _cleanup_free_ char *e4 = scenario_error_of(
                "{\"pools\": {\"p\": {\"limit\": 1}}, \"lanes\": {\"a\": {\"pools\": [\"p\"]}, \"b\": {\"pools\": [\"p\"]}},"
                " \"requests\": [{\"name\": \"x\", \"at\": \"1s\", \"hold\": \"1s\", \"lane\": \"b\"}],"
                " \"reloads\": [{\"at\": \"1s\", \"lanes\": {\"b\": null}}]}");
        assert_string_equal(e4, "r.json: requests[0].lane: no lane \"b\" when it arrives (a reload removed it, or adds it later)");
        _cleanup_free_ char *e5 = scenario_error_of(
                "{\"pool\": {\"limit\": 1}, \"drains\": [{\"at\": \"1s\", \"pool\": \"q\", \"reason\": \"x\"}],"
                " \"reloads\": [{\"at\": \"1s\", \"pools\": {\"q\": {\"limit\": 1}}}]}");
        assert_string_equal(e5, "r.json: drains[0].pool: no pool \"q\" then (a reload removed it, or adds it later)");
}

static void test_scenario_labels_that_nobody_matches_are_an_error(void **state) {
        _cleanup_(scenario_freep) Scenario *s = NULL;
        _cleanup_(conf_freep) BrokerConfig *c = NULL;
        _cleanup_free_ char *error = NULL;
        assert_int_equal(scenario_load_string("{\"pool\": {\"members\": [\"a\", \"b\"], \"label.arm64\": [\"a\"]}, \"requests\": ["
                                              " {\"name\": \"x\", \"at\": \"0s\", \"hold\": \"1s\", \"slots\": 2, \"labels\": [\"arm64\"]}]}",
                                              "test.json", &error, &s),
                         0);
        assert_true(scenario_build_config(s, NULL, NULL, &error, &c) < 0);
        assert_non_null(strstr(error, "members match its labels"));
        s = scenario_free(s);
        free(error);
        error = NULL;
        assert_true(scenario_load_string("{\"pool\": {\"members\": [\"a\"]}, \"requests\": ["
                                         " {\"name\": \"x\", \"at\": \"0s\", \"hold\": \"1s\", \"labels\": [\"Arm64\"]}]}",
                                         "test.json", &error, &s) < 0);
        assert_non_null(strstr(error, "labels[0]"));
}

static void test_jammed_worked_example(void **state) {
        _cleanup_(sim_result_freep) SimResult *r = run(
                "{\"pool\": {\"limit\": 2, \"queue-timeout\": \"5m\"}, \"requests\": ["
                " {\"name\": \"A\", \"at\": \"0s\", \"hold\": \"forever\"},"
                " {\"name\": \"B\", \"at\": \"0s\", \"hold\": \"forever\"},"
                " {\"name\": \"C\", \"at\": \"10s\", \"hold\": \"1m\"},"
                " {\"name\": \"D\", \"at\": \"5min 11s\", \"hold\": \"1m\"}]}", false);

        assert_int_equal(r->n_records, 4);
        const SimRecord *c = &r->records[2], *d = &r->records[3];
        assert_int_equal(c->outcome, SIM_OUTCOME_REFUSED);
        assert_int_equal(c->refusal, REFUSAL_TIMEOUT);
        assert_int_equal(c->state, QUEUE_STATE_KEEPING_UP);
        assert_int_equal(c->budget, 300 * USEC_PER_SEC);
        assert_int_equal(c->decided_ms, 310000);
        assert_int_equal(d->arrived_ms, 311000);
        assert_int_equal(d->state, QUEUE_STATE_SATURATED);
        assert_int_equal(d->idle, 311 * USEC_PER_SEC);
        assert_int_equal(d->budget, 30 * USEC_PER_SEC);
        assert_int_equal(d->refusal, REFUSAL_SHED);
        assert_int_equal(d->decided_ms, 341000);
        assert_true(r->drained_ms == SIM_FOREVER); /* A and B hold forever */
}

static void test_max_hold_revocation_ends_the_lease_at_once(void **state) {
        _cleanup_(sim_result_freep) SimResult *r = run(
                "{\"pools\": {\"p\": {\"limit\": 1}}, \"lanes\": {\"l\": {\"pools\": [\"p\"], \"max-hold\": \"3s\"}},"
                " \"deadline\": \"4s\", \"requests\": ["
                " {\"name\": \"A\", \"at\": \"0s\", \"hold\": \"forever\"},"
                " {\"name\": \"B\", \"at\": \"1s\", \"hold\": \"10s\"}]}", false);

        assert_int_equal(r->records[1].decided_ms, 3000);  /* A revoked at 3 s frees the slot for B */
        assert_int_equal(r->records[1].waited_ms, 2000);
        assert_int_equal(r->end_ms, 6000);                 /* B revoked at 3 s + 3 s */
        assert_int_equal(r->drained_ms, 5000);
        assert_int_equal(r->late, 1);                      /* B: 2 s wait + 3 s held > 4 s */
}

static void test_per_request_records_follow_arrival_order(void **state) {
        _cleanup_(sim_result_freep) SimResult *r = run(
                "{\"pool\": {\"limit\": 1}, \"arrivals\": [{\"rate\": \"1/s\", \"for\": \"3s\", \"hold\": \"100ms\"}],"
                " \"requests\": [{\"name\": \"X\", \"at\": \"1s\", \"hold\": \"1s\"}]}", true);

        assert_int_equal(r->n_records, 4);
        const uint64_t ids[] = { 0, 1, 3, 2 };
        for (size_t i = 0; i < ELEMENTSOF(ids); i++)
                assert_int_equal(r->records[i].id, ids[i]);
        /* X arrived right after "2" at 1 s and waits for it: 100 ms. */
        assert_int_equal(r->records[2].waited_ms, 100);
}

/* A pool with a backend is simulated in-process, by the same rules: the same decisions as without. */
static void test_backend_pool_is_simulated_in_process(void **state) {
#define JAMMED(extra)                                                                                       \
        "{\"pool\": {\"limit\": 2, \"queue-timeout\": \"5m\"" extra "}, \"requests\": ["                   \
        " {\"name\": \"A\", \"at\": \"0s\", \"hold\": \"forever\"},"                                      \
        " {\"name\": \"B\", \"at\": \"0s\", \"hold\": \"1m\"},"                                           \
        " {\"name\": \"C\", \"at\": \"10s\", \"hold\": \"1m\"},"                                          \
        " {\"name\": \"D\", \"at\": \"5min 11s\", \"hold\": \"1m\"}]}"
        _cleanup_(sim_result_freep) SimResult *local = run(JAMMED(""), false);
        _cleanup_(sim_result_freep) SimResult *shared = run(JAMMED(", \"backend\": \"redis://127.0.0.1:1/0\""), false);
#undef JAMMED
        assert_int_equal(shared->n_records, local->n_records);
        assert_int_equal(shared->granted, 4);
        for (size_t i = 0; i < local->n_records; i++) {
                const SimRecord *x = &local->records[i], *y = &shared->records[i];
                assert_int_equal(y->decided_ms, x->decided_ms);
                assert_int_equal(y->waited_ms, x->waited_ms);
                assert_int_equal(y->outcome, x->outcome);
                assert_int_equal(y->refusal, x->refusal);
                assert_int_equal(y->state, x->state);
                assert_int_equal(y->budget, x->budget);
                assert_int_equal(y->idle, x->idle);
        }
        assert_int_equal(shared->end_ms, local->end_ms);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_peak_is_the_largest_count_in_its_second),
                cmocka_unit_test(test_peak_second_without_instants_carries_the_current_count),
                cmocka_unit_test(test_peak_before_the_first_instant_is_zero),
                cmocka_unit_test(test_peak_counts_a_repeated_instant_once_settled),
                cmocka_unit_test(test_format_tenths_floors),
                cmocka_unit_test(test_splitmix64_is_seeded),
                cmocka_unit_test(test_reference_40_per_second),
                cmocka_unit_test(test_reference_burst_then_steady),
                cmocka_unit_test(test_simulation_covers_every_second_until_the_last_hold_ends),
                cmocka_unit_test(test_jammed_worked_example),
                cmocka_unit_test(test_labels_and_member_in_a_scenario),
                cmocka_unit_test(test_cooldown_in_a_scenario),
                cmocka_unit_test(test_quarantine_health_and_drains_in_a_scenario),
                cmocka_unit_test(test_cancels_and_quarantines_in_a_scenario),
                cmocka_unit_test(test_reloads_in_a_scenario),
                cmocka_unit_test(test_reloads_add_and_remove_pools_and_lanes),
                cmocka_unit_test(test_reload_refusal_of_a_set_names_the_pool_removed),
                cmocka_unit_test(test_reservations_in_a_scenario),
                cmocka_unit_test(test_scenario_labels_that_nobody_matches_are_an_error),
                cmocka_unit_test(test_also_in_a_scenario),
                cmocka_unit_test(test_a_health_grant_uses_up_its_reserve_at_once),
                cmocka_unit_test(test_a_set_refused_lets_those_behind_it_go),
                cmocka_unit_test(test_a_set_refusal_names_a_drained_pool_before_a_busy_one),
                cmocka_unit_test(test_a_set_ahead_of_a_waiting_set_is_queued_first),
                cmocka_unit_test(test_max_hold_revocation_ends_the_lease_at_once),
                cmocka_unit_test(test_per_request_records_follow_arrival_order),
                cmocka_unit_test(test_backend_pool_is_simulated_in_process),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
