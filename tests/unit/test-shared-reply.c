/* SPDX-License-Identifier: MIT */
/* test-shared-reply.c — a Redis reply's checked accessors (resp.h) and the scripts' words and decisions read
 * from it (shared-reply.h): what a hostile or broken Redis may answer is refused, not trusted. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "macro.h"
#include "shared-reply.h"

#define STR(s) ((RespValue) { .type = RESP_STRING, .str = (s), .len = sizeof(s) - 1 })
#define INT(x) ((RespValue) { .type = RESP_INTEGER, .integer = (x) })
#define NIL ((RespValue) { .type = RESP_NIL })
#define ARR(a) ((RespValue) { .type = RESP_ARRAY, .elements = (a), .n = ELEMENTSOF(a) })

static void test_resp_accessors_check_type_and_size(void **state) {
        int64_t x = 7;
        assert_true(resp_int(&INT(-3), &x));
        assert_int_equal(x, -3);
        assert_true(resp_int(&STR("9007199254740992"), &x));
        assert_int_equal(x, INT64_C(9007199254740992));
        /* Garbage, an overflow, an empty string, another type: refused, *ret untouched. */
        x = 7;
        assert_false(resp_int(&STR("12x"), &x));
        assert_false(resp_int(&STR("99999999999999999999"), &x));
        assert_false(resp_int(&STR(""), &x));
        assert_false(resp_int(&NIL, &x));
        assert_false(resp_int(NULL, &x));
        assert_int_equal(x, 7);

        assert_true(resp_is(&STR("ok"), "ok"));
        assert_false(resp_is(&STR("ok!"), "ok"));
        assert_false(resp_is(&(RespValue) { .type = RESP_ERROR, .str = "ok", .len = 2 }, "ok"));
        assert_false(resp_is(NULL, "ok"));

        RespValue two[] = { STR("a"), INT(1) };
        RespValue arr = ARR(two);
        assert_ptr_equal(resp_at(&arr, 1), &two[1]);
        assert_null(resp_at(&arr, 2));
        assert_null(resp_at(&two[0], 0));

        /* A copy, NUL-terminated; longer than max, or not a string: none. */
        char *s = resp_strdup(&STR("node-a"));
        assert_string_equal(s, "node-a");
        free(s);
        assert_null(resp_strdup_max(&STR("node-a"), 5));
        assert_null(resp_strdup(&INT(1)));
}

static void test_contract_words(void **state) {
        assert_true(shared_rid_is_valid("0123456789abcdef", 16));
        assert_false(shared_rid_is_valid("0123456789ABCDEF", 16));
        assert_false(shared_rid_is_valid("0123456789abcde", 15));
        assert_false(shared_rid_is_valid("0123456789abcdef0", 17));

        assert_true(shared_stream_id_is_valid("1700000000000-0", 15));
        assert_false(shared_stream_id_is_valid("1700000000000", 13));
        assert_false(shared_stream_id_is_valid("-0", 2));
        assert_false(shared_stream_id_is_valid("1-", 2));
        assert_false(shared_stream_id_is_valid("1-0 ", 4));
        assert_false(shared_stream_id_is_valid("123456789012345678901-0", 23)); /* 21 digits: no uint64 */

        unsigned i = 99;
        assert_true(shared_index_parse("3", 1, 4, &i));
        assert_int_equal(i, 3);
        i = 99;
        assert_false(shared_index_parse("4", 1, 4, &i));
        assert_false(shared_index_parse("+1", 2, 4, &i));
        assert_false(shared_index_parse("", 0, 4, &i));
        assert_false(shared_index_parse("99999999999", 11, UINT32_MAX, &i));
        assert_int_equal(i, 99);
}

/* A decision's 14 fields in README order, slots and members as given. */
static int decision(RespValue slots, RespValue members, SharedDecision *ret) {
        RespValue f[] = {
                STR("granted"), STR("00000000000000a1"), INT(1000), INT(20), STR(""), STR("cooldown"),
                STR("saturated"), INT(-5), INT(-1), INT(2), INT(3), STR("77"), slots, members,
        };
        RespValue v = ARR(f);
        return shared_decision_from_array(&v, 4, ret);
}

static void test_a_decision_from_its_array(void **state) {
        RespValue slots[] = { INT(3), STR("1") };
        RespValue members[] = { STR("rig-a"), STR("rig-b") };
        SharedDecision d;
        assert_int_equal(decision(ARR(slots), ARR(members), &d), 0);
        assert_string_equal(d.verdict, "granted");
        assert_string_equal(d.rid, "00000000000000a1");
        assert_int_equal(d.at, 1000);
        assert_false(d.has_refusal);
        assert_string_equal(d.reason, "cooldown");
        assert_int_equal(d.state, QUEUE_STATE_SATURATED);
        assert_int_equal(d.idle, 0);                /* a negative idle is none */
        assert_true(d.budget == USEC_INFINITY);     /* a negative budget is unbounded */
        assert_int_equal(d.token, 77);
        assert_int_equal(d.n_slots, 2);
        assert_int_equal(d.slots[0], 3);
        assert_int_equal(d.slots[1], 1);
        assert_int_equal(d.n_members, 2);
        assert_string_equal(d.members[1], "rig-b");
        shared_decision_done(&d);
        assert_null(d.slots);
        assert_null(d.members);

        /* A stream entry's list: "a,b". */
        assert_int_equal(decision(STR("0,2"), STR("rig-a,rig-c"), &d), 0);
        assert_int_equal(d.n_slots, 2);
        assert_int_equal(d.slots[1], 2);
        assert_string_equal(d.members[1], "rig-c");
        shared_decision_done(&d);
}

/* An unavailable refusal without a word is an adopted reload's ("reload"); a drain's "drained" is none (the
 * session says "drained"), and so is "" in any other refusal. */
static void test_a_refusal_s_reason(void **state) {
        static const struct {
                const char *refusal, *reason, *told;
        } cases[] = {
                { "unavailable", "", "reload" },
                { "unavailable", "drained", NULL },
                { "unavailable", "recovery", "recovery" },
                { "unavailable", "what", NULL },
                { "timeout", "", NULL },
                { "busy", "cooldown", "cooldown" },
                { "", "", NULL },
        };
        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                SharedDecision d = shared_decision_init(4);
                RespValue refusal = { .type = RESP_STRING, .str = cases[i].refusal, .len = strlen(cases[i].refusal) };
                RespValue reason = { .type = RESP_STRING, .str = cases[i].reason, .len = strlen(cases[i].reason) };
                assert_int_equal(shared_decision_set(&d, "refusal", &refusal), 0);
                assert_int_equal(shared_decision_set(&d, "reason", &reason), 0);
                if (cases[i].told)
                        assert_string_equal(shared_decision_reason(&d), cases[i].told);
                else
                        assert_null(shared_decision_reason(&d));
                shared_decision_done(&d);
        }
}

static void test_a_bad_decision_is_refused(void **state) {
        SharedDecision d;
        RespValue one_too_many[] = { INT(0), INT(1), INT(2), INT(3), INT(0) };
        RespValue out_of_range[] = { INT(4) };
        RespValue negative[] = { INT(-1) };
        RespValue nested[] = { ARR(negative) };
        RespValue empty_member[] = { STR("") };
        /* Slots or members beyond the pool's limit (4), an index out of range, a wrong type: -EBADMSG. */
        assert_int_equal(decision(ARR(one_too_many), NIL, &d), -EBADMSG);
        assert_int_equal(decision(ARR(out_of_range), NIL, &d), -EBADMSG);
        assert_int_equal(decision(ARR(negative), NIL, &d), -EBADMSG);
        assert_int_equal(decision(ARR(nested), NIL, &d), -EBADMSG);
        assert_int_equal(decision(STR("0,x"), NIL, &d), -EBADMSG);
        assert_int_equal(decision(STR("0,1,2,3,0"), NIL, &d), -EBADMSG);
        assert_int_equal(decision(NIL, ARR(empty_member), &d), -EBADMSG);
        assert_int_equal(decision(NIL, STR("a,,b"), &d), -EBADMSG);
        assert_int_equal(decision(INT(1), NIL, &d), -EBADMSG);

        /* The array: 14 or 15 fields, nothing else. */
        RespValue thirteen[13] = {};
        RespValue v = ARR(thirteen);
        assert_int_equal(shared_decision_from_array(&v, 4, &d), -EBADMSG);
        assert_int_equal(shared_decision_from_array(&STR("granted"), 4, &d), -EBADMSG);
        assert_int_equal(shared_decision_from_array(NULL, 4, &d), -EBADMSG);

        /* A field: a rid not of the contract's form, a verdict too long, a token below 0. */
        SharedDecision e = shared_decision_init(4);
        assert_int_equal(shared_decision_set(&e, "rid", &STR("00000000000000A1")), -EBADMSG);
        assert_int_equal(shared_decision_set(&e, "verdict", &STR("granted-and-then-some")), -EBADMSG);
        assert_int_equal(shared_decision_set(&e, "token", &INT(-1)), -EBADMSG);
        assert_int_equal(shared_decision_set(&e, "at", &STR("soon")), -EBADMSG);
        /* A name not of the decision's is ignored, whatever its value (a field someone added to a stream entry). */
        assert_int_equal(shared_decision_set(&e, "colour", &STR("blue")), 0);
        assert_int_equal(shared_decision_set(&e, "colour", &INT(3)), 0);
        assert_int_equal(shared_decision_set(&e, "Rid", &STR("x")), 0);
        /* A reason not of the pool's words is none; a refusal not of the known ones is not one. */
        assert_int_equal(shared_decision_set(&e, "reason", &STR("because")), 0);
        assert_null(e.reason);
        assert_int_equal(shared_decision_set(&e, "refusal", &STR("nope")), 0);
        assert_false(e.has_refusal);
        assert_int_equal(shared_decision_set(&e, "refusal", &STR("full")), 0);
        assert_true(e.has_refusal);
        assert_int_equal(e.refusal, REFUSAL_FULL);
        shared_decision_done(&e);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_resp_accessors_check_type_and_size),
                cmocka_unit_test(test_contract_words),
                cmocka_unit_test(test_a_decision_from_its_array),
                cmocka_unit_test(test_a_refusal_s_reason),
                cmocka_unit_test(test_a_bad_decision_is_refused),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
