/* SPDX-License-Identifier: MIT */
/* test-shared-rules.c — a shared pool's rules canon (brokerd/lua/README, "Rules canon"): the text two nodes
 * must have byte for byte to agree on a pool, so that what is not a rule never makes them differ. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "engine.h"
#include "macro.h"
#include "shared-rules.h"

static void assert_canon(const PoolConfig *c, const PoolLaneRule *rules, size_t n_rules, usec_t ttl,
                         const char *want) {
        char *canon = NULL;
        assert_int_equal(shared_rules_canon(c, rules, n_rules, ttl, &canon), 0);
        assert_string_equal(canon, want);
        free(canon);
}

static void test_the_rules_sorted_by_key_and_only_those_set(void **state) {
        PoolConfig c = { .name = "grid", .limit = 4, .max_queue = -1 };
        PoolLaneRule rules[] = {
                { .lane = "merge", .priority = 10, .max_in_use = -1, .budget_set = true, .budget = USEC_INFINITY },
                { .lane = "ci", .priority = 0, .max_in_use = 2, .reserve = 1 },
        };
        assert_canon(&c, rules, ELEMENTSOF(rules), 30 * USEC_PER_SEC,
                     "backend-node-ttl=30000000\n"
                     "lane.ci.max-in-use=2\n"
                     "lane.ci.priority=0\n"
                     "lane.ci.reserve=1\n"
                     "lane.merge.max-in-use=-1\n"
                     "lane.merge.priority=10\n"
                     "lane.merge.queue-timeout=-1\n"
                     "lane.merge.reserve=0\n"
                     "limit=4\n");

        /* Each optional rule appears once set; the same rules in another order of lanes: the same canon. */
        c.queue_timeout_set = true;
        c.queue_timeout = 5 * USEC_PER_SEC;
        c.max_queue = 0;
        c.cooldown = USEC_PER_SEC;
        PoolLaneRule reversed[] = { rules[1], rules[0] };
        assert_canon(&c, reversed, ELEMENTSOF(reversed), 30 * USEC_PER_SEC,
                     "backend-node-ttl=30000000\n"
                     "cooldown=1000000\n"
                     "lane.ci.max-in-use=2\n"
                     "lane.ci.priority=0\n"
                     "lane.ci.reserve=1\n"
                     "lane.merge.max-in-use=-1\n"
                     "lane.merge.priority=10\n"
                     "lane.merge.queue-timeout=-1\n"
                     "lane.merge.reserve=0\n"
                     "limit=4\n"
                     "max-queue=0\n"
                     "queue-timeout=5000000\n");
}

/* A key that begins a longer one sorts first (keys are compared up to their '='): label.x before label.x-y,
 * where the lines compared whole would go the other way ('-' is below '='). */
static void test_a_key_sorts_before_the_longer_keys_it_begins(void **state) {
        char *members[] = { "m", NULL };
        PoolLabel labels[] = { { .name = "x-y", .members = members }, { .name = "x", .members = members } };
        PoolConfig c = {
                .name = "p", .limit = 1, .members = members, .n_members = 1, .labels = labels,
                .n_labels = ELEMENTSOF(labels), .max_queue = -1,
        };
        assert_canon(&c, NULL, 0, USEC_PER_SEC,
                     "backend-node-ttl=1000000\n"
                     "label.x=m\n"
                     "label.x-y=m\n"
                     "limit=1\n"
                     "members=m\n");
}

/* Members in their order (a slot's index is its place), labels' members and a lane's terms sorted without
 * repetition, a label of no member left out, the reservations' lane never a rule, quarantine codes listed
 * in order with quarantine-after at least 1, a health lane marked. */
static void test_members_labels_reservations_and_lives(void **state) {
        char *members[] = { "rig-b", "rig-a", "rig-c", NULL };
        char *fast[] = { "rig-c", "rig-a", "rig-c", NULL };
        char *none[] = { NULL };
        PoolLabel labels[] = { { .name = "fast", .members = fast }, { .name = "gone", .members = none } };
        PoolConfig c = {
                .name = "rigs", .limit = 3, .members = members, .n_members = 3, .labels = labels,
                .n_labels = ELEMENTSOF(labels), .max_queue = -1, .quarantine_exit_codes_set = true,
        };
        c.quarantine_exit_codes[0] = (UINT64_C(1) << 3) | (UINT64_C(1) << 4);
        c.quarantine_exit_codes[3] = UINT64_C(1) << (255 - 192);
        char *terms[] = { "usb3", "!flaky", "usb3", NULL };
        PoolLaneRule rules[] = {
                { .lane = ENGINE_RESERVE_LANE, .priority = 100, .max_in_use = -1 },
                { .lane = "hw", .priority = 1, .max_in_use = -1, .labels = terms },
                { .lane = "heal", .max_in_use = -1, .health = true, .health_also = true },
        };
        assert_canon(&c, rules, ELEMENTSOF(rules), 30 * USEC_PER_SEC,
                     "backend-node-ttl=30000000\n"
                     "label.fast=rig-a,rig-c\n"
                     "lane.heal.health=also\n"
                     "lane.heal.max-in-use=-1\n"
                     "lane.heal.priority=0\n"
                     "lane.heal.reserve=0\n"
                     "lane.hw.labels=!flaky,usb3\n"
                     "lane.hw.max-in-use=-1\n"
                     "lane.hw.priority=1\n"
                     "lane.hw.reserve=0\n"
                     "limit=3\n"
                     "members=rig-b,rig-a,rig-c\n"
                     "quarantine-after=1\n"
                     "quarantine-exit-codes=3,4,255\n");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_the_rules_sorted_by_key_and_only_those_set),
                cmocka_unit_test(test_a_key_sorts_before_the_longer_keys_it_begins),
                cmocka_unit_test(test_members_labels_reservations_and_lives),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
