/* SPDX-License-Identifier: MIT */
/* test-json.c — the parameter dispatcher and the JSON builders. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <limits.h>

#include "json.h"

static json_t *parse(const char *text) {
        json_t *v = NULL;
        assert_int_equal(json_parse_object(text, strlen(text), &v), 0);
        return v;
}

/* Everything one table can hold, with defaults that show whether a field was written. */
typedef struct Params {
        const char *lane;
        bool wait;
        int64_t delta;
        uint64_t big;
        unsigned slots;
        json_t *extra;
        json_t *list;
        char **members;
} Params;

#define PARAMS_INIT { .lane = "unset", .wait = true, .delta = -7, .big = 7, .slots = 7 }

static int dispatch(json_t *o, Params *p, JsonDispatchFlags flags, const char **bad) {
        const JsonField table[] = {
                { "lane", JSON_FIELD_STRING, JSON_MANDATORY, &p->lane, .max_length = 16 },
                { "wait", JSON_FIELD_BOOL, 0, &p->wait },
                { "delta", JSON_FIELD_INT64, 0, &p->delta, .min = -100, .max = 100 },
                { "big", JSON_FIELD_UINT64, 0, &p->big },
                { "slots", JSON_FIELD_UNSIGNED, 0, &p->slots },
                { "extra", JSON_FIELD_OBJECT, 0, &p->extra },
                { "list", JSON_FIELD_ARRAY, 0, &p->list, .max_length = 3 },
                { "members", JSON_FIELD_STRV, 0, &p->members, .max_length = 3 },
                {}
        };
        return json_dispatch(o, table, flags, bad);
}

static void test_dispatch_stores_every_type(void **state) {
        _cleanup_(json_decrefp) json_t *o = parse(
                "{\"lane\":\"merge\",\"wait\":false,\"delta\":-100,\"big\":9223372036854775807,\"slots\":4294967295,"
                "\"extra\":{\"a\":1},\"list\":[1,\"x\",null],\"members\":[\"rig-a\",\"rig-b\"]}");
        Params p = PARAMS_INIT;
        const char *bad = NULL;

        assert_int_equal(dispatch(o, &p, 0, &bad), 0);
        assert_null(bad);
        assert_string_equal(p.lane, "merge");
        assert_false(p.wait);
        assert_int_equal(p.delta, -100);
        assert_true(p.big == (uint64_t) INT64_MAX);
        assert_int_equal(p.slots, UINT_MAX);
        assert_ptr_equal(p.extra, json_object_get(o, "extra"));
        assert_ptr_equal(p.list, json_object_get(o, "list"));
        assert_non_null(p.members);
        assert_string_equal(p.members[0], "rig-a");
        assert_string_equal(p.members[1], "rig-b");
        assert_null(p.members[2]);
        json_strv_free(p.members);
}

static void test_dispatch_leaves_absent_optional_fields_alone(void **state) {
        _cleanup_(json_decrefp) json_t *o = parse("{\"lane\":\"merge\"}");
        Params p = PARAMS_INIT;

        assert_int_equal(dispatch(o, &p, 0, NULL), 0);
        assert_string_equal(p.lane, "merge");
        assert_true(p.wait);
        assert_int_equal(p.delta, -7);
        assert_int_equal(p.big, 7);
        assert_int_equal(p.slots, 7);
        assert_null(p.extra);
        assert_null(p.members);
}

static void test_dispatch_treats_null_as_absent(void **state) {
        _cleanup_(json_decrefp) json_t *o = parse(
                "{\"lane\":\"merge\",\"wait\":null,\"delta\":null,\"extra\":null,\"members\":null}");
        Params p = PARAMS_INIT;

        assert_int_equal(dispatch(o, &p, 0, NULL), 0);
        assert_true(p.wait);
        assert_int_equal(p.delta, -7);
        assert_null(p.extra);
        assert_null(p.members);
}

static void assert_refused(const char *text, const char *expected_parameter) {
        _cleanup_(json_decrefp) json_t *o = parse(text);
        Params p = PARAMS_INIT;
        const char *bad = NULL;

        assert_int_equal(dispatch(o, &p, 0, &bad), -EINVAL);
        assert_non_null(bad);
        assert_string_equal(bad, expected_parameter);
        /* Nothing written on failure. */
        assert_string_equal(p.lane, "unset");
        assert_true(p.wait);
        assert_int_equal(p.delta, -7);
        assert_int_equal(p.big, 7);
        assert_int_equal(p.slots, 7);
        assert_null(p.extra);
        assert_null(p.list);
        assert_null(p.members);
}

static void test_dispatch_refuses_missing_mandatory_field(void **state) {
        assert_refused("{}", "lane");
        assert_refused("{\"wait\":true}", "lane");
}

static void test_dispatch_refuses_null_mandatory_field(void **state) {
        assert_refused("{\"lane\":null}", "lane");
}

static void test_dispatch_refuses_unknown_field(void **state) {
        assert_refused("{\"lane\":\"merge\",\"slotz\":1}", "slotz");
}

static void test_dispatch_allows_unknown_field_when_asked(void **state) {
        _cleanup_(json_decrefp) json_t *o = parse("{\"lane\":\"merge\",\"newer\":1}");
        Params p = PARAMS_INIT;

        assert_int_equal(dispatch(o, &p, JSON_DISPATCH_ALLOW_UNKNOWN, NULL), 0);
        assert_string_equal(p.lane, "merge");
}

static void test_dispatch_refuses_wrong_type_of_every_field(void **state) {
        static const struct {
                const char *text, *parameter;
        } cases[] = {
                { "{\"lane\":1}", "lane" },
                { "{\"lane\":true}", "lane" },
                { "{\"lane\":[\"merge\"]}", "lane" },
                { "{\"lane\":{}}", "lane" },
                { "{\"lane\":\"m\",\"wait\":1}", "wait" },
                { "{\"lane\":\"m\",\"wait\":\"true\"}", "wait" },
                { "{\"lane\":\"m\",\"delta\":\"1\"}", "delta" },
                { "{\"lane\":\"m\",\"delta\":true}", "delta" },
                { "{\"lane\":\"m\",\"big\":[]}", "big" },
                { "{\"lane\":\"m\",\"slots\":{}}", "slots" },
                { "{\"lane\":\"m\",\"extra\":[]}", "extra" },
                { "{\"lane\":\"m\",\"extra\":\"{}\"}", "extra" },
                { "{\"lane\":\"m\",\"list\":{}}", "list" },
                { "{\"lane\":\"m\",\"list\":1}", "list" },
                { "{\"lane\":\"m\",\"members\":\"rig-a\"}", "members" },
                { "{\"lane\":\"m\",\"members\":[\"rig-a\",1]}", "members" },
                { "{\"lane\":\"m\",\"members\":[null]}", "members" },
        };
        for (size_t i = 0; i < ELEMENTSOF(cases); i++)
                assert_refused(cases[i].text, cases[i].parameter);
}

static void test_dispatch_refuses_real_where_integer_required(void **state) {
        assert_refused("{\"lane\":\"m\",\"delta\":1.0}", "delta");
        assert_refused("{\"lane\":\"m\",\"big\":1e3}", "big");
        assert_refused("{\"lane\":\"m\",\"slots\":0.5}", "slots");
}

static void test_dispatch_refuses_integer_out_of_range(void **state) {
        assert_refused("{\"lane\":\"m\",\"delta\":101}", "delta");
        assert_refused("{\"lane\":\"m\",\"delta\":-101}", "delta");
        assert_refused("{\"lane\":\"m\",\"big\":-1}", "big");
        assert_refused("{\"lane\":\"m\",\"slots\":-1}", "slots");
        assert_refused("{\"lane\":\"m\",\"slots\":4294967296}", "slots");
}

static void test_dispatch_accepts_range_bounds(void **state) {
        Params p = PARAMS_INIT;
        _cleanup_(json_decrefp) json_t *lo = parse("{\"lane\":\"m\",\"delta\":-100,\"big\":0,\"slots\":0}");
        _cleanup_(json_decrefp) json_t *hi = parse("{\"lane\":\"m\",\"delta\":100}");

        assert_int_equal(dispatch(lo, &p, 0, NULL), 0);
        assert_int_equal(p.delta, -100);
        assert_int_equal(p.big, 0);
        assert_int_equal(p.slots, 0);
        assert_int_equal(dispatch(hi, &p, 0, NULL), 0);
        assert_int_equal(p.delta, 100);
}

static void test_dispatch_int64_without_range_takes_whole_range(void **state) {
        int64_t v = 0;
        const JsonField table[] = {
                { "v", JSON_FIELD_INT64, JSON_MANDATORY, &v },
                {}
        };
        _cleanup_(json_decrefp) json_t *lo = parse("{\"v\":-9223372036854775808}");
        _cleanup_(json_decrefp) json_t *hi = parse("{\"v\":9223372036854775807}");

        assert_int_equal(json_dispatch(lo, table, 0, NULL), 0);
        assert_true(v == INT64_MIN);
        assert_int_equal(json_dispatch(hi, table, 0, NULL), 0);
        assert_true(v == INT64_MAX);
}

static void test_dispatch_refuses_string_with_embedded_nul(void **state) {
        assert_refused("{\"lane\":\"mer\\u0000ge\"}", "lane");
        assert_refused("{\"lane\":\"m\",\"members\":[\"a\\u0000\"]}", "members");
}

static void test_dispatch_refuses_string_over_cap(void **state) {
        Params p = PARAMS_INIT;
        _cleanup_(json_decrefp) json_t *at_cap = parse("{\"lane\":\"0123456789abcdef\"}");

        assert_int_equal(dispatch(at_cap, &p, 0, NULL), 0);
        assert_refused("{\"lane\":\"0123456789abcdefg\"}", "lane");
}

static void test_dispatch_applies_default_string_cap(void **state) {
        const char *s = NULL;
        const JsonField table[] = {
                { "s", JSON_FIELD_STRING, 0, &s },
                {}
        };
        _cleanup_free_ char *big = malloc(JSON_STRING_MAX_DEFAULT + 2);
        assert_non_null(big);
        memset(big, 'x', JSON_STRING_MAX_DEFAULT + 1);
        big[JSON_STRING_MAX_DEFAULT + 1] = 0;

        _cleanup_(json_decrefp) json_t *over = json_pack("{s:s}", "s", big);
        const char *bad = NULL;
        assert_int_equal(json_dispatch(over, table, 0, &bad), -EINVAL);
        assert_string_equal(bad, "s");

        big[JSON_STRING_MAX_DEFAULT] = 0;
        _cleanup_(json_decrefp) json_t *at = json_pack("{s:s}", "s", big);
        assert_int_equal(json_dispatch(at, table, 0, NULL), 0);
        assert_int_equal(strlen(s), JSON_STRING_MAX_DEFAULT);
}

static void test_dispatch_refuses_arrays_over_cap(void **state) {
        assert_refused("{\"lane\":\"m\",\"list\":[1,2,3,4]}", "list");
        assert_refused("{\"lane\":\"m\",\"members\":[\"a\",\"b\",\"c\",\"d\"]}", "members");
}

static void test_dispatch_replaces_previous_strv(void **state) {
        _cleanup_(json_decrefp) json_t *o = parse("{\"lane\":\"m\",\"members\":[]}");
        Params p = PARAMS_INIT;

        p.members = calloc(2, sizeof(char *));
        assert_non_null(p.members);
        p.members[0] = strdup("old");
        assert_int_equal(dispatch(o, &p, 0, NULL), 0);
        assert_non_null(p.members);
        assert_null(p.members[0]);
        json_strv_free(p.members);
}

static void test_dispatch_takes_null_object_as_empty(void **state) {
        Params p = PARAMS_INIT;
        const char *bad = NULL;
        bool flag = false;
        const JsonField optional_only[] = {
                { "flag", JSON_FIELD_BOOL, 0, &flag },
                {}
        };

        assert_int_equal(dispatch(NULL, &p, 0, &bad), -EINVAL);
        assert_string_equal(bad, "lane");
        assert_int_equal(json_dispatch(NULL, optional_only, 0, NULL), 0);
        assert_false(flag);
}

/* Values are found by one walk over the object's keys, compared with their length as jansson's lookup
 * does: a key with a NUL inside is not the field of its first part; and a table too long for that walk is
 * read by lookups, with the same verdicts. */
static void test_dispatch_matches_keys_by_their_length(void **state) {
        _cleanup_(json_decrefp) json_t *o = json_object();
        int64_t slots = -1;
        assert_int_equal(json_object_setn_new(o, "slots\0x", 7, json_integer(3)), 0);
        assert_int_equal(json_dispatch(o, (const JsonField[]) { { "slots", JSON_FIELD_INT64, 0, &slots }, {} }, 0, NULL), 0);
        assert_int_equal(slots, -1);
        assert_int_equal(json_object_set_new(o, "slots", json_integer(2)), 0);
        assert_int_equal(json_dispatch(o, (const JsonField[]) { { "slots", JSON_FIELD_INT64, 0, &slots }, {} }, 0, NULL), 0);
        assert_int_equal(slots, 2);
}

static void test_dispatch_reads_a_long_table(void **state) {
        enum { N = 70 };
        JsonField table[N + 1] = {};
        char names[N][8];
        int64_t values[N];
        for (int i = 0; i < N; i++) {
                snprintf(names[i], sizeof names[i], "f%d", i);
                values[i] = -1;
                table[i] = (JsonField) { names[i], JSON_FIELD_INT64, i == 5 ? JSON_MANDATORY : 0, &values[i] };
        }
        _cleanup_(json_decrefp) json_t *o = json_pack("{s:i, s:i}", "f5", 5, "f69", 69);
        assert_non_null(o);
        assert_int_equal(json_dispatch(o, table, 0, NULL), 0);
        assert_int_equal(values[5], 5);
        assert_int_equal(values[69], 69);
        assert_int_equal(values[0], -1);
        const char *bad = NULL;
        assert_int_equal(json_object_set_new(o, "g", json_integer(1)), 0);
        assert_int_equal(json_dispatch(o, table, 0, &bad), -EINVAL);
        assert_string_equal(bad, "g");
        assert_int_equal(json_object_del(o, "f5"), 0);
        assert_int_equal(json_dispatch(o, table, 0, &bad), -EINVAL);
        assert_string_equal(bad, "f5"); /* a missing mandatory field is told before an unknown key, as before */
}

static void test_dispatch_refuses_non_object(void **state) {
        _cleanup_(json_decrefp) json_t *a = json_array();
        Params p = PARAMS_INIT;

        assert_int_equal(dispatch(a, &p, 0, NULL), -EINVAL);
}

static void test_parse_object_refuses_malformed_json(void **state) {
        static const char *const bad[] = {
                "", " ", "{", "{\"a\":}", "{\"a\" 1}", "{a:1}", "{\"a\":1,}", "{\"a\":1}x", "{\"a\":tru}",
                "{\"a\":\"\\x\"}", "{\"a\":\"\xff\"}", "{\"a\":NaN}", "{\"a\":99999999999999999999}",
                "{\"a\":1e999}", "{\"a\\u0000b\":1}",
        };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                json_t *v = (json_t *) 0x1;
                assert_int_equal(json_parse_object(bad[i], strlen(bad[i]), &v), -EBADMSG);
                assert_ptr_equal(v, (json_t *) 0x1);
        }
}

static void test_parse_object_refuses_non_object(void **state) {
        static const char *const bad[] = { "[]", "1", "\"x\"", "null", "true", "[{}]" };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                json_t *v = NULL;
                assert_int_equal(json_parse_object(bad[i], strlen(bad[i]), &v), -EBADMSG);
                assert_null(v);
        }
}

static void test_parse_object_refuses_duplicate_keys(void **state) {
        static const char *const bad[] = {
                "{\"lane\":\"a\",\"lane\":\"b\"}",
                "{\"lane\":\"a\",\"la\\u006ee\":\"a\"}",                /* the same key once decoded */
                "{\"p\":{\"x\":1,\"y\":[{\"z\":1,\"z\":{}}]}}",               /* deep inside */
                "{\"a\":1,\"b\":2,\"c\":3,\"d\":4,\"e\":5,\"f\":6,\"g\":7,\"h\":8,\"i\":9,\"a\":null}", /* past a rehash */
        };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                json_t *v = NULL;
                assert_int_equal(json_parse_object(bad[i], strlen(bad[i]), &v), -EBADMSG);
                assert_null(v);
        }
        /* Keys that differ only past a NUL-free prefix, or by case, are not duplicates. */
        const char *good = "{\"lane\":1,\"lanes\":2,\"Lane\":3,\"\":4}";
        _cleanup_(json_decrefp) json_t *o = NULL;
        assert_int_equal(json_parse_object(good, strlen(good), &o), 0);
        assert_int_equal(json_object_size(o), 4);
}

static void test_parse_object_refuses_deep_nesting(void **state) {
        size_t depth = 5000;
        _cleanup_free_ char *t = malloc(2 * depth + 8);
        assert_non_null(t);
        char *p = stpcpy(t, "{\"a\":");
        for (size_t i = 0; i < depth; i++)
                *p++ = '[';
        for (size_t i = 0; i < depth; i++)
                *p++ = ']';
        *p++ = '}';
        json_t *v = NULL;
        assert_int_equal(json_parse_object(t, p - t, &v), -EBADMSG);
}

static void test_parse_object_reads_exactly_the_bytes_given(void **state) {
        const char t[] = "{\"a\":1} trailing garbage";
        _cleanup_(json_decrefp) json_t *v = NULL;
        assert_int_equal(json_parse_object(t, 7, &v), 0);
        assert_int_equal(json_integer_value(json_object_get(v, "a")), 1);
}

static void test_build_packs_values(void **state) {
        _cleanup_(json_decrefp) json_t *v = NULL;
        _cleanup_free_ char *s = NULL;

        assert_int_equal(json_build(&v, "{s:s, s:I, s:b, s:s?}", "pool", "grid", "n", (json_int_t) 3, "on", 1, "job", NULL), 0);
        assert_int_equal(json_format(v, &s, NULL), 0);
        assert_string_equal(s, "{\"pool\":\"grid\",\"n\":3,\"on\":true,\"job\":null}");
}

static void test_build_refuses_null_for_mandatory_string(void **state) {
        json_t *v = (json_t *) 0x1;
        assert_int_equal(json_build(&v, "{s:s}", "pool", (const char *) NULL), -EINVAL);
        assert_ptr_equal(v, (json_t *) 0x1);
}

static void test_strv_new_builds_array(void **state) {
        char *l[] = { (char *) "rig-a", (char *) "rig-b", NULL };
        _cleanup_(json_decrefp) json_t *a = NULL, *empty = NULL;
        _cleanup_free_ char *s = NULL;

        assert_int_equal(json_strv_new(l, &a), 0);
        assert_int_equal(json_format(a, &s, NULL), 0);
        assert_string_equal(s, "[\"rig-a\",\"rig-b\"]");
        assert_int_equal(json_strv_new(NULL, &empty), 0);
        assert_int_equal(json_array_size(empty), 0);
}

static void test_strv_new_refuses_invalid_utf8(void **state) {
        char *l[] = { (char *) "ok", (char *) "\xc3\x28", NULL };
        json_t *a = NULL;
        assert_int_equal(json_strv_new(l, &a), -EINVAL);
        assert_null(a);
}

static void test_format_is_compact_and_escapes_control_characters(void **state) {
        _cleanup_(json_decrefp) json_t *v = json_pack("{s:s#, s:[i,i]}", "s", "a\0b\n\x01\"", (int) 6, "l", 1, 2);
        _cleanup_free_ char *s = NULL;
        size_t n = 0;

        assert_non_null(v);
        assert_int_equal(json_format(v, &s, &n), 0);
        assert_string_equal(s, "{\"s\":\"a\\u0000b\\n\\u0001\\\"\",\"l\":[1,2]}");
        assert_int_equal(n, strlen(s));
}

static int collect(const char *data, size_t size, void *userdata) {
        size_t *calls = userdata;
        assert_true(size > 0);
        (void) data;
        (*calls)++;
        return 0;
}

static int refuse(const char *data, size_t size, void *userdata) {
        (void) data;
        (void) size;
        (void) userdata;
        return -ENOBUFS;
}

/* json_serialize() replaces jansson's dump on the wire: it must write the same bytes. */
static void assert_serializes_as_jansson(json_t *v) {
        _cleanup_free_ char *ours = NULL, *theirs = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        size_t n = 0;

        assert_non_null(theirs);
        assert_int_equal(json_format(v, &ours, &n), 0);
        assert_string_equal(ours, theirs);
        assert_int_equal(n, strlen(theirs));
}

static void test_serialize_writes_what_jansson_writes(void **state) {
        const char *texts[] = {
                "{}", "[]", "{\"a\":[]}", "[{},[[]],{\"\":{}}]",
                "{\"lease\":\"b7c0\\u00e9\\u2603\\ud83d\\ude00é/x\",\"n\":null,\"t\":true,\"f\":false}",
                "{\"min\":-9223372036854775808,\"max\":9223372036854775807,\"zero\":0,\"neg\":-1,\"ten\":10}",
                "{\"r\":[0.5,1.0,-2.25e-300,1e300,3.0,0.1]}",
                "{\"esc\":\"\\u0000\\u001f\\u007f\\b\\f\\n\\r\\t\\\"\\\\\\/\"}",
                "{\"z\":1,\"a\":2,\"m\":{\"y\":[1,\"2\",[3]],\"b\":{}}}",
        };

        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
                json_error_t error;
                _cleanup_(json_decrefp) json_t *v = json_loads(texts[i], JSON_ALLOW_NUL | JSON_DECODE_ANY, &error);
                assert_non_null(v);
                assert_serializes_as_jansson(v);
        }

        _cleanup_(json_decrefp) json_t *s = json_stringn("a\0b", 3), *i = json_integer(-42),
                                        *k = json_object();
        assert_serializes_as_jansson(s);
        assert_serializes_as_jansson(i);
        assert_serializes_as_jansson(json_true());
        assert_int_equal(json_object_setn_new(k, "k\0\"ey", 5, json_string("v")), 0);
        assert_serializes_as_jansson(k);
}

static void test_serialize_batches_long_text_and_stops_on_sink_error(void **state) {
        _cleanup_(json_decrefp) json_t *a = json_array();
        size_t calls = 0;

        for (int i = 0; i < 5000; i++)
                assert_int_equal(json_array_append_new(a, json_string("0123456789abcdef")), 0);
        assert_serializes_as_jansson(a);
        assert_int_equal(json_serialize(a, collect, &calls), 0);
        /* About 95 KB of text in 4 KiB pieces, not a call per token. */
        assert_in_range(calls, 20, 30);
        assert_int_equal(json_serialize(a, refuse, NULL), -ENOBUFS);
}

static void test_serialize_refuses_a_cycle(void **state) {
        json_t *a = json_array(), *b = json_array();

        assert_int_equal(json_array_append(a, b), 0);
        assert_int_equal(json_array_append(b, a), 0);
        size_t calls = 0;
        assert_int_equal(json_serialize(a, collect, &calls), -ELOOP);
        json_array_clear(b);
        json_decref(b);
        json_decref(a);
}

/* json_parse_object() replaces json_loadb() on the wire: it must accept and refuse the same texts and build
 * the same values. */
static void assert_parses_as_jansson(const char *text, size_t size) {
        json_error_t error;
        json_t *theirs = json_loadb(text, size, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &error), *ours = NULL;
        int r = json_parse_object(text, size, &ours);

        if (theirs && !json_is_object(theirs)) {
                json_decref(theirs);
                theirs = NULL;
        }
        if (!!theirs != (r == 0))
                fail_msg("jansson %s, json_parse_object() %d: '%.*s'", theirs ? "accepts" : error.text, r,
                         (int) size, text);
        if (theirs) {
                assert_true(json_equal(ours, theirs));
                _cleanup_free_ char *a = json_dumps(ours, JSON_COMPACT), *b = json_dumps(theirs, JSON_COMPACT);
                assert_string_equal(a, b);
        } else
                assert_int_equal(r, -EBADMSG);
        json_decref(theirs);
        json_decref(ours);
}

static void test_parse_accepts_and_refuses_what_jansson_does(void **state) {
        const char *texts[] = {
                "{}", " {} ", "\t{\n}\r\n", "[]", "", " ", "{", "}", "{}x", "{} {}", "\"s\"", "1", "null",
                "{\"a\":1}", "{\"a\":1,}", "{,}", "{\"a\"}", "{\"a\":}", "{a:1}", "{\"a\":1 \"b\":2}",
                "{\"a\":1,\"a\":2}", "{\"a\":{\"a\":1},\"b\":[1,[2,[3,{}]]]}", "{\"\":0}",
                "{\"a\":[1,]}", "{\"a\":[,1]}", "{\"a\":[1 2]}",
                "{\"t\":true,\"f\":false,\"n\":null}", "{\"t\":tru}", "{\"t\":truex}", "{\"t\":True}",
                "{\"t\":nul}", "{\"t\":true1}",
                "{\"n\":0}", "{\"n\":-0}", "{\"n\":01}", "{\"n\":-01}", "{\"n\":-}", "{\"n\":+1}",
                "{\"n\":1.}", "{\"n\":.5}", "{\"n\":1.5}", "{\"n\":-0.0}", "{\"n\":1e5}", "{\"n\":1E+5}",
                "{\"n\":1e-5}", "{\"n\":1e}", "{\"n\":1e+}", "{\"n\":0x10}", "{\"n\":1.5e308}",
                "{\"n\":1e309}", "{\"n\":-1e309}", "{\"n\":1e-400}", "{\"n\":123456789012345678}",
                "{\"n\":1234567890123456789}", "{\"n\":9223372036854775807}", "{\"n\":9223372036854775808}",
                "{\"n\":-9223372036854775808}", "{\"n\":-9223372036854775809}",
                "{\"n\":00000000000000000000000000000000000000000000000000000000000000000001}",
                "{\"n\":10000000000000000000000000000000000000000000000000000000000000000000}",
                "{\"n\":1.0000000000000000000000000000000000000000000000000000000000000000001}",
                "{\"n\":NaN}", "{\"n\":Infinity}",
                "{\"s\":\"\\u0000\"}", "{\"s\\u0000\":1}", "{\"s\":\"\\ud83d\\ude00\"}",
                "{\"s\":\"\\ud83d\"}", "{\"s\":\"\\ude00\"}", "{\"s\":\"\\ud83d\\u0041\"}",
                "{\"s\":\"\\ud83dx\"}", "{\"s\":\"\\u12\"}", "{\"s\":\"\\u12g4\"}", "{\"s\":\"\\uABcd\"}",
                "{\"s\":\"\\x\"}", "{\"s\":\"\\/\\b\\f\\n\\r\\t\\\"\\\\\"}", "{\"s\":\"a\\\"}",
                "{\"s\":\"\t\"}", "{\"s\":\"\x7f\"}", "{\"s\":\"\xc3\xa9\"}", "{\"s\":\"\xc3\"}",
                "{\"s\":\"\xc0\x80\"}", "{\"s\":\"\xe0\x80\x80\"}", "{\"s\":\"\xed\xa0\x80\"}",
                "{\"s\":\"\xf4\x90\x80\x80\"}", "{\"s\":\"\xf0\x9f\x98\x80\"}", "{\"s\":\"\xff\"}",
                "{\"\xc3\xa9\\n\":1}", "\xef\xbb\xbf{}", "{\"s\":\"", "{\"s\":\"\\", "{\"s\":",
        };

        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
                assert_parses_as_jansson(texts[i], strlen(texts[i]));

        /* A NUL byte after the object, and inside a string. */
        assert_parses_as_jansson("{}\0", 3);
        assert_parses_as_jansson("{\"a\":\"\0\"}", 9);

        /* jansson's depth limit, to the level. */
        for (size_t depth = 2045; depth <= 2052; depth++) {
                _cleanup_free_ char *t = malloc(2 * depth + 8);
                assert_non_null(t);
                size_t n = 0;
                t[n++] = '{';
                memcpy(t + n, "\"a\":", 4);
                n += 4;
                for (size_t k = 1; k < depth; k++)
                        t[n++] = '[';
                for (size_t k = 1; k < depth; k++)
                        t[n++] = ']';
                t[n++] = '}';
                assert_parses_as_jansson(t, n);
        }
}

static void test_parse_agrees_with_jansson_on_mutated_messages(void **state) {
        const char *seeds[] = {
                "{\"method\":\"io.slotbroker.Acquire\",\"parameters\":{\"lane\":\"ci\",\"job\":\"b\\u00e9\",\"wait\":true,\"timeoutMs\":-1500},\"more\":true}",
                "{\"parameters\":{\"lease\":{\"id\":\"28a3\",\"slots\":[0,1],\"members\":[\"a\",\"b\\n\"],\"x\":1.5e3,\"n\":null}},\"continues\":false}",
        };
        /* No raw NUL: the one place where the two differ, which no Varlink message can hold (see json.c). */
        const char alphabet[] = "{}[]\":,\\ 0123456789-+.eEtrufalsn\x1f\x7f\xc3\xa9\xed\xf0";
        uint64_t x = 0x9E3779B97F4A7C15ULL;

        for (size_t i = 0; i < 20000; i++) {
                const char *seed = seeds[i % 2];
                char t[256];
                size_t n = strlen(seed);
                memcpy(t, seed, n);
                /* One to three random edits: replace, insert, delete or cut. */
                for (int e = 0; e < 1 + (int) (i % 3); e++) {
                        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                        size_t at = (size_t) (x >> 8) % (n + 1);
                        char c = alphabet[(x >> 40) % (sizeof alphabet - 1)];
                        switch ((x >> 32) % 4) {
                        case 0:
                                if (at < n)
                                        t[at] = c;
                                break;
                        case 1:
                                if (n + 1 < sizeof t) {
                                        memmove(t + at + 1, t + at, n - at);
                                        t[at] = c;
                                        n++;
                                }
                                break;
                        case 2:
                                if (at < n) {
                                        memmove(t + at, t + at + 1, n - at - 1);
                                        n--;
                                }
                                break;
                        default:
                                n = at;
                        }
                }
                assert_parses_as_jansson(t, n);
        }
}

/* The tree v written again through json_text_*(): strings, integers, booleans and containers. */
static void text_write_tree(JsonText *t, json_t *v) {
        switch (json_typeof(v)) {
        case JSON_OBJECT: {
                json_text_open(t, '{');
                for (void *i = json_object_iter(v); i; i = json_object_iter_next(v, i)) {
                        json_text_key(t, json_object_iter_key(i));
                        text_write_tree(t, json_object_iter_value(i));
                }
                json_text_close(t, '}');
                break;
        }
        case JSON_ARRAY:
                json_text_open(t, '[');
                for (size_t i = 0; i < json_array_size(v); i++)
                        text_write_tree(t, json_array_get(v, i));
                json_text_close(t, ']');
                break;
        case JSON_STRING:
                json_text_string(t, json_string_value(v));
                break;
        case JSON_INTEGER:
                json_text_integer(t, json_integer_value(v));
                break;
        case JSON_TRUE:
        case JSON_FALSE:
                json_text_bool(t, json_is_true(v));
                break;
        default:
                fail_msg("no such value in these texts");
        }
}

/* The grant and the position replies are written straight as text: the bytes of the tree's serialization. */
static void test_text_writes_what_serialize_writes(void **state) {
        const char *texts[] = {
                "{}", "[]", "{\"a\":[]}", "[{},[[]],{\"\":{}}]",
                "{\"state\":\"granted\",\"lease\":{\"id\":\"0123456789abcdef0123456789abcdef\",\"token\":7,"
                "\"pool\":\"p\",\"slots\":[0,3],\"lane\":\"L\",\"uid\":1000,\"pid\":42,\"grantedAt\":1796170482098492,"
                "\"detached\":false,\"members\":[\"a\",\"\"],\"job\":\"j\\n\\\"x\\u0001\",\"commandPid\":43}}",
                "{\"lease\":\"b7c0\\u00e9\\u2603\\ud83d\\ude00é/x\",\"t\":true,\"f\":false}",
                "{\"min\":-9223372036854775808,\"max\":9223372036854775807,\"zero\":0,\"neg\":-1,\"ten\":10}",
                "{\"esc\":\"\\u001f\\u007f\\b\\f\\n\\r\\t\\\"\\\\\\/\"}",
                "{\"z\":1,\"a\":2,\"m\":{\"y\":[1,\"2\",[3]],\"b\":{}}}",
        };

        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
                json_error_t error;
                _cleanup_(json_decrefp) json_t *v = json_loads(texts[i], JSON_DECODE_ANY, &error);
                assert_non_null(v);
                _cleanup_free_ char *expected = NULL;
                size_t n;
                assert_int_equal(json_format(v, &expected, &n), 0);

                _cleanup_(json_text_done) JsonText t;
                json_text_init(&t);
                text_write_tree(&t, v);
                assert_int_equal(json_text_result(&t), 0);
                assert_int_equal(t.size, n);
                assert_memory_equal(t.data, expected, n);
        }

        /* Past the inline buffer: the text moves to the heap and stays whole. */
        _cleanup_(json_decrefp) json_t *a = json_array();
        for (int i = 0; i < 500; i++)
                assert_int_equal(json_array_append_new(a, json_string("0123456789\"abcdef")), 0);
        _cleanup_free_ char *expected = NULL;
        size_t n;
        assert_int_equal(json_format(a, &expected, &n), 0);
        _cleanup_(json_text_done) JsonText t;
        json_text_init(&t);
        text_write_tree(&t, a);
        assert_int_equal(json_text_result(&t), 0);
        assert_int_equal(t.size, n);
        assert_memory_equal(t.data, expected, n);
}

static void test_text_refuses_what_the_tree_refused(void **state) {
        _cleanup_(json_text_done) JsonText t;

        /* Not UTF-8: json_string() refused it, so the grant's tree could not be made. */
        json_text_init(&t);
        json_text_open(&t, '{');
        json_text_key(&t, "job");
        json_text_string(&t, "\xff\xfe");
        json_text_close(&t, '}');
        assert_int_equal(json_text_result(&t), -EINVAL);
        json_text_done(&t);

        json_text_init(&t);
        json_text_open(&t, '{');
        json_text_key(&t, "job");
        json_text_string(&t, NULL);
        json_text_close(&t, '}');
        assert_int_equal(json_text_result(&t), -EINVAL);
        json_text_done(&t);

        /* Unfinished. */
        json_text_init(&t);
        json_text_open(&t, '{');
        json_text_key(&t, "a");
        assert_int_equal(json_text_result(&t), -EINVAL);
        json_text_done(&t);

        /* Too deep; a close too many. */
        json_text_init(&t);
        for (int i = 0; i < 65; i++)
                json_text_open(&t, '[');
        assert_int_equal(json_text_result(&t), -ELOOP);
        json_text_done(&t);
        json_text_init(&t);
        json_text_close(&t, '}');
        assert_int_equal(json_text_result(&t), -EINVAL);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_dispatch_stores_every_type),
                cmocka_unit_test(test_dispatch_leaves_absent_optional_fields_alone),
                cmocka_unit_test(test_dispatch_treats_null_as_absent),
                cmocka_unit_test(test_dispatch_refuses_missing_mandatory_field),
                cmocka_unit_test(test_dispatch_refuses_null_mandatory_field),
                cmocka_unit_test(test_dispatch_refuses_unknown_field),
                cmocka_unit_test(test_dispatch_allows_unknown_field_when_asked),
                cmocka_unit_test(test_dispatch_refuses_wrong_type_of_every_field),
                cmocka_unit_test(test_dispatch_refuses_real_where_integer_required),
                cmocka_unit_test(test_dispatch_refuses_integer_out_of_range),
                cmocka_unit_test(test_dispatch_accepts_range_bounds),
                cmocka_unit_test(test_dispatch_int64_without_range_takes_whole_range),
                cmocka_unit_test(test_dispatch_refuses_string_with_embedded_nul),
                cmocka_unit_test(test_dispatch_refuses_string_over_cap),
                cmocka_unit_test(test_dispatch_applies_default_string_cap),
                cmocka_unit_test(test_dispatch_refuses_arrays_over_cap),
                cmocka_unit_test(test_dispatch_replaces_previous_strv),
                cmocka_unit_test(test_dispatch_takes_null_object_as_empty),
                cmocka_unit_test(test_dispatch_refuses_non_object),
                cmocka_unit_test(test_dispatch_matches_keys_by_their_length),
                cmocka_unit_test(test_dispatch_reads_a_long_table),
                cmocka_unit_test(test_parse_object_refuses_malformed_json),
                cmocka_unit_test(test_parse_object_refuses_non_object),
                cmocka_unit_test(test_parse_object_refuses_duplicate_keys),
                cmocka_unit_test(test_parse_object_refuses_deep_nesting),
                cmocka_unit_test(test_parse_object_reads_exactly_the_bytes_given),
                cmocka_unit_test(test_build_packs_values),
                cmocka_unit_test(test_build_refuses_null_for_mandatory_string),
                cmocka_unit_test(test_strv_new_builds_array),
                cmocka_unit_test(test_strv_new_refuses_invalid_utf8),
                cmocka_unit_test(test_format_is_compact_and_escapes_control_characters),
                cmocka_unit_test(test_serialize_writes_what_jansson_writes),
                cmocka_unit_test(test_serialize_batches_long_text_and_stops_on_sink_error),
                cmocka_unit_test(test_serialize_refuses_a_cycle),
                cmocka_unit_test(test_text_writes_what_serialize_writes),
                cmocka_unit_test(test_text_refuses_what_the_tree_refused),
                cmocka_unit_test(test_parse_accepts_and_refuses_what_jansson_does),
                cmocka_unit_test(test_parse_agrees_with_jansson_on_mutated_messages),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
